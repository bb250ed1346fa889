//! Backing files as contents: the size each gives its file — converted
//! from sealed blocks on encrypted volumes, where a torn length is a
//! finding — and, with the volume's keys, every sealed block opened.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;

use super::*;
/// Sealed blocks read at a time.
const BATCH: u64 = 64;

impl Checker<'_> {
    /// Inode `ino`'s backing file.
    pub(super) fn backing_path(&self, ino: u64) -> PathBuf {
        self.layout
            .data()
            .join(format!("{:02x}/{ino:016x}", ino & 0xff))
    }

    /// The size file `ino` has by its backing file of `len` bytes. On an
    /// encrypted volume a length that no file of blocks has is an extension
    /// torn by a crash: the file keeps its whole blocks (as the core reads
    /// it), and repair cuts the torn tail, too short to hold any data.
    pub(super) fn backing_size(&mut self, ino: u64, len: u64) -> Result<u64> {
        let Some(keys) = &self.keys else {
            return Ok(len);
        };
        let layout = keys.blocks().layout();
        if let Some(size) = layout.plain_len(len) {
            return Ok(size);
        }
        let whole = len / layout.unit();
        self.leftover_or_find(format!(
            "file {ino}: backing file length {len} is no whole number of sealed blocks \
             (an extension torn by a crash); it keeps its {whole} whole blocks"
        ));
        if self.repair {
            OpenOptions::new()
                .write(true)
                .open(self.backing_path(ino))?
                .set_len(whole * layout.unit())?;
        }
        Ok(whole * layout.block())
    }

    /// On a volume whose contents are in an object store: file `ino`'s
    /// block records readable, and its size theirs — unless
    /// its backing file holds changes not uploaded yet (a daemon stopped
    /// before it could: the next mount uploads them).
    pub(super) fn check_block_map(
        &mut self,
        ino: u64,
        i: &mut crate::format::inode::Inode,
        changed: &mut bool,
    ) -> Result<()> {
        use crate::format::blocks::{BLOCK, BlockRef};
        let (start, end) = keys::ino_range(keys::P_BLOCK, ino);
        let mut len = 0u64;
        for (k, v) in self.store.scan(&start, &end, usize::MAX)? {
            let Some(idx) = keys::key_block(&k) else {
                self.find(
                    format!("file {ino}: a block record with a short key"),
                    false,
                );
                return Ok(());
            };
            match BlockRef::decode(&k, &v) {
                // Records come in block order: the last says where it ends.
                Ok(b) => len = u64::from(idx) * BLOCK + u64::from(b.len),
                Err(e) => {
                    self.find(
                        format!("file {ino}: block record {idx} unreadable: {e}"),
                        false,
                    );
                    return Ok(());
                }
            }
        }
        match crate::core::remote::dirty_mark(&self.backing_path(ino))? {
            crate::core::remote::Dirty::Clean => {}
            crate::core::remote::Dirty::Here => {
                self.leftover(format!(
                    "file {ino}: its backing file holds changes not in the object store yet; \
                     the next mount uploads them"
                ));
                return Ok(());
            }
            crate::core::remote::Dirty::Lost => {
                self.leftover(format!(
                    "file {ino}: its backing file holds changes not synced before the machine \
                     stopped; the next mount drops them (the file stays as last uploaded)"
                ));
                return Ok(());
            }
        }
        let size = match &self.keys {
            Some(k) => k.blocks().layout().plain_size(len),
            None => len,
        };
        if size != i.size {
            self.leftover_or_find(format!(
                "file {ino}: size {} but its blocks in the object store hold {size}",
                i.size
            ));
            i.size = size;
            *changed = true;
        }
        Ok(())
    }

    /// Opens every sealed block of file `ino` (encrypted volumes only). A
    /// block that does not open reads as EIO: its data is lost, which no
    /// repair can undo (zeros in its place would be served as data).
    pub(super) fn open_blocks(&mut self, ino: u64) {
        let Some(keys) = self.keys.clone() else {
            return;
        };
        let path = self.backing_path(ino);
        let file = match File::open(&path) {
            Ok(f) => f,
            // Missing: reported with the sizes (or an empty file).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                self.find(format!("file {ino}: backing file unreadable: {e}"), false);
                return;
            }
        };
        // A truncate killed inside a block with blocks after it: its journal
        // after the last block says the size it was cutting to. Until it is
        // finished the blocks past that size are not the file's: repair
        // finishes it, then the blocks are checked.
        match crate::core::DataStore::journalled_cut(keys.blocks(), &file, ino) {
            Ok(None) => {}
            Ok(Some(new)) => {
                self.leftover_or_find(format!(
                    "file {ino}: a truncate the daemon did not finish left its journal; \
                     the file is cut to {new} bytes"
                ));
                if !self.repair {
                    return;
                }
                let finish = || -> std::io::Result<bool> {
                    let w = OpenOptions::new().read(true).write(true).open(&path)?;
                    crate::core::DataStore::finish_journalled_cut(keys.blocks(), &w, ino)
                };
                if let Err(e) = finish() {
                    self.find(
                        format!("file {ino}: cannot finish the truncate: {e}"),
                        false,
                    );
                    return;
                }
            }
            Err(e) => {
                self.find(format!("file {ino}: backing file unreadable: {e}"), false);
                return;
            }
        }
        let layout = keys.blocks().layout();
        let unit = layout.unit();
        // Blocks that do not open, and a last block a killed truncate
        // shortened in place (its on-disk length).
        let read = || -> std::io::Result<(u64, Vec<u64>, Option<u64>)> {
            let len = file.metadata()?.len();
            // Past the whole blocks of a torn length there is nothing to open.
            let end = layout.sealed_len(layout.plain_size(len));
            let blocks = end.div_ceil(unit);
            let (mut bad, mut cut) = (Vec::new(), None);
            let mut buf = vec![0u8; (BATCH * unit) as usize];
            let mut at = 0;
            while at < end {
                let n = (end - at).min(BATCH * unit) as usize;
                file.read_exact_at(&mut buf[..n], at)?;
                for (j, slot) in buf[..n].chunks(unit as usize).enumerate() {
                    let index = at / unit + j as u64;
                    if keys.blocks().open(ino, index, slot).is_ok() {
                        continue;
                    }
                    match keys.blocks().open_cut(ino, index, slot) {
                        Some((l, _)) if index + 1 == blocks => cut = Some(index * unit + l as u64),
                        _ => bad.push(index),
                    }
                }
                at += n as u64;
            }
            Ok((blocks, bad, cut))
        };
        match read() {
            Ok((_, bad, Some(cut))) if bad.is_empty() => {
                self.leftover_or_find(format!(
                    "file {ino}: its last content block was shortened by a truncate the \
                     daemon did not finish; the backing file is cut to {cut} bytes"
                ));
                if self.repair {
                    let cut_file = || OpenOptions::new().write(true).open(&path)?.set_len(cut);
                    if let Err(e) = cut_file() {
                        self.find(
                            format!("file {ino}: cannot cut the backing file: {e}"),
                            false,
                        );
                    }
                }
            }
            Ok((_, bad, None)) if bad.is_empty() => {}
            Ok((blocks, bad, _)) => self.find(
                format!(
                    "file {ino}: {} of its {blocks} content blocks do not open (changed, moved \
                     or torn; the first is block {}, at byte {}): reading them fails with EIO",
                    bad.len(),
                    bad[0],
                    bad[0] * layout.block()
                ),
                false,
            ),
            Err(e) => self.find(format!("file {ino}: backing file unreadable: {e}"), false),
        }
    }
}
