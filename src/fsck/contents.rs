//! Backing files as contents: the size each gives its file — converted
//! from sealed blocks on encrypted volumes, where a torn length is a
//! finding — and, with the volume's keys, every sealed block opened.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;

use super::*;
use crate::core::crypto::{BLOCK, BLOCK_OVERHEAD, plain_len, sealed_len};

/// On-disk bytes of one full sealed block.
const UNIT: u64 = (BLOCK + BLOCK_OVERHEAD) as u64;
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
        if self.keys.is_none() {
            return Ok(len);
        }
        if let Some(size) = plain_len(len) {
            return Ok(size);
        }
        let whole = len / UNIT;
        self.find(
            format!(
                "file {ino}: backing file length {len} is no whole number of sealed blocks \
                 (an extension torn by a crash); it keeps its {whole} whole blocks"
            ),
            true,
        );
        if self.repair {
            OpenOptions::new()
                .write(true)
                .open(self.backing_path(ino))?
                .set_len(whole * UNIT)?;
        }
        Ok(whole * BLOCK as u64)
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
        let read = || -> std::io::Result<(u64, Vec<u64>)> {
            let len = file.metadata()?.len();
            // Past the whole blocks of a torn length there is nothing to open.
            let end = sealed_len(plain_len(len).unwrap_or(len / UNIT * BLOCK as u64));
            let mut bad = Vec::new();
            let mut buf = vec![0u8; (BATCH * UNIT) as usize];
            let mut at = 0;
            while at < end {
                let n = (end - at).min(BATCH * UNIT) as usize;
                file.read_exact_at(&mut buf[..n], at)?;
                for (j, slot) in buf[..n].chunks(UNIT as usize).enumerate() {
                    let index = at / UNIT + j as u64;
                    if keys.blocks().open(ino, index, slot).is_err() {
                        bad.push(index);
                    }
                }
                at += n as u64;
            }
            Ok((end.div_ceil(UNIT), bad))
        };
        match read() {
            Ok((_, bad)) if bad.is_empty() => {}
            Ok((blocks, bad)) => self.find(
                format!(
                    "file {ino}: {} of its {blocks} content blocks do not open (changed, moved \
                     or torn; the first is block {}, at byte {}): reading them fails with EIO",
                    bad.len(),
                    bad[0],
                    bad[0] * BLOCK as u64
                ),
                false,
            ),
            Err(e) => self.find(format!("file {ino}: backing file unreadable: {e}"), false),
        }
    }
}
