//! Encrypted volumes checked without their passphrase: what can be told
//! without the keys. Opening already checked the engine's pages, the
//! superblock and the key record; here every key must have a shape the
//! schema gives, every record keyed by an inode must have that inode's
//! record beside it, every sealed value must be long enough to be one, and
//! every backing file must be named for an inode and hold a layout of
//! sealed blocks. Records, names in keys and contents stay unread, and
//! nothing is repaired.

use std::collections::BTreeSet;

use super::*;
use crate::core::crypto::{BlockLayout, NAME_OVERHEAD, SEAL_OVERHEAD};
use crate::format::{NAME_MAX, XATTR_NAME_MAX};

/// What a key's shape says it is.
enum Shape {
    /// The superblock and the key record: in the clear, read on the way in.
    Clear,
    /// A record of the whole volume (counters, sessions' counters, mount
    /// state).
    Volume,
    /// Inode `ino`'s own record.
    Inode(u64),
    /// A record that belongs to inode (or directory) `ino`.
    Of(u64),
    Malformed,
}

fn shape(key: &[u8]) -> Shape {
    let named = |max: usize| (9 + NAME_OVERHEAD + 1..=9 + NAME_OVERHEAD + max).contains(&key.len());
    let ino = keys::key_ino(key).unwrap_or(0);
    match key.first().copied() {
        _ if key == keys::SUPERBLOCK || key == keys::KEY_RECORD || key == keys::DATA_STORE => {
            Shape::Clear
        }
        _ if key == keys::COUNTERS || key == keys::MOUNT_STATE => Shape::Volume,
        Some(keys::P_INODE) if key.len() == 9 => Shape::Inode(ino),
        Some(keys::P_SYMLINK | keys::P_ORPHAN | keys::P_WRITING) if key.len() == 9 => {
            Shape::Of(ino)
        }
        Some(keys::P_SPILL) if keys::spill_page_of(key).is_some() => Shape::Of(ino),
        Some(keys::P_DIRINDEX) if key.len() == 17 => Shape::Of(ino),
        Some(keys::P_BLOCK) if key.len() == 13 => Shape::Of(ino),
        Some(keys::P_DOOMED) if key.len() == 21 => Shape::Volume,
        Some(keys::P_SESSION) if key.len() == 9 => Shape::Volume,
        Some(keys::P_SHARE) if key.len() == 17 => Shape::Of(ino),
        Some(keys::P_DIRENT) if named(NAME_MAX) => Shape::Of(ino),
        Some(keys::P_OVERFLOW) if named(XATTR_NAME_MAX) => Shape::Of(ino),
        _ => Shape::Malformed,
    }
}

/// A key as findings show it, its encrypted name (if any) unread.
fn shown(key: &[u8]) -> String {
    match key.first().copied() {
        Some(keys::P_DIRENT | keys::P_OVERFLOW) if key.len() > 9 => encrypted_name(key),
        _ => describe_key(key),
    }
}

struct Structure {
    report: Report,
}

impl Structure {
    fn find(&mut self, what: String) {
        tracing::warn!("{what}");
        self.report.findings.push(Finding {
            what,
            repaired: false,
            leftover: false,
        });
    }
}

/// Checks the structure of the encrypted volume in `layout` (see above).
pub(super) fn check(
    store: &dyn MetaStore,
    layout: &Layout,
    blocks: BlockLayout,
    progress: Progress<'_>,
) -> Result<Report> {
    let mut s = Structure {
        report: Report {
            structure_only: true,
            ..Report::default()
        },
    };
    let mut inodes = BTreeSet::new();
    each(store, &[keys::P_INODE], &[keys::P_INODE + 1], |k, _| {
        if let Shape::Inode(ino) = shape(&k) {
            inodes.insert(ino);
        }
    })?;
    s.report.inodes = inodes.len() as u64;
    // Freed files whose block records wait for the object deleter.
    let mut freed = BTreeSet::new();
    each(store, &[keys::P_DOOMED], &[keys::P_DOOMED + 1], |k, _| {
        if keys::is_doomed_file(&k)
            && let Some(ino) = keys::key_ino(&k)
        {
            freed.insert(ino);
        }
    })?;
    progress("structure", 0, 2);
    let (mut counters, mut done) = (false, 0u64);
    // Every key: LMDB keys are 1 to 511 bytes long.
    each(store, &[0], &[u8::MAX; 511], |k, v| {
        done += 1;
        match shape(&k) {
            Shape::Clear => return,
            Shape::Malformed => {
                s.find(format!("malformed key {}", describe_key(&k)));
                return;
            }
            Shape::Volume => counters |= k == keys::COUNTERS,
            Shape::Inode(_) => {}
            Shape::Of(ino) => {
                match k[0] {
                    keys::P_DIRENT => s.report.entries += 1,
                    keys::P_SPILL | keys::P_OVERFLOW => s.report.xattr_records += 1,
                    _ => {}
                }
                let queued = k[0] == keys::P_BLOCK && freed.contains(&ino);
                if !inodes.contains(&ino) && !queued {
                    s.find(format!("record {} belongs to no inode", shown(&k)));
                }
            }
        }
        if v.len() <= SEAL_OVERHEAD {
            s.find(format!(
                "record {}: {} bytes, too short to be sealed",
                shown(&k),
                v.len()
            ));
        }
    })?;
    if !inodes.contains(&ROOT_INO) {
        s.find("root directory's inode record missing".into());
    }
    if !counters {
        s.find("counters record missing".into());
    }
    progress("structure", 1, 2);
    backing_files(&mut s, layout, blocks, &inodes);
    progress("structure", 2, 2);
    Ok(s.report)
}

/// Every pair with `start <= key < end`, in pages.
fn each(
    store: &dyn MetaStore,
    start: &[u8],
    end: &[u8],
    mut f: impl FnMut(Vec<u8>, Vec<u8>),
) -> Result<()> {
    let mut start = start.to_vec();
    loop {
        let page = store.scan(&start, end, PAGE)?;
        let n = page.len();
        for (k, v) in page {
            start.clone_from(&k);
            f(k, v);
        }
        if n < PAGE {
            return Ok(());
        }
        start.push(0);
    }
}

/// Backing files: named `xx/<ino as 16 hex digits>` (`xx` its low byte)
/// for an inode that has a record, a length some file of blocks has.
fn backing_files(s: &mut Structure, layout: &Layout, blocks: BlockLayout, inodes: &BTreeSet<u64>) {
    for (i, dir) in layout.backing_dirs() {
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) => {
                s.find(format!("backing directory {}: {e}", dir.display()));
                continue;
            }
        };
        for e in rd.flatten() {
            let path = e.path();
            let Some(ino) = crate::core::volume::backing_ino(&e.file_name(), i) else {
                s.find(format!(
                    "backing file {} is not named for an inode of its directory",
                    path.display()
                ));
                continue;
            };
            if !inodes.contains(&ino) {
                // Without the mount state (sealed) a leftover of an
                // unclean stop cannot be told from damage: both are said.
                s.find(format!(
                    "backing file {} belongs to no inode (damage, or a file whose creation \
                     an unclean stop cut short)",
                    path.display()
                ));
            }
            match e.metadata() {
                Ok(m) if !m.is_file() => {
                    s.find(format!("backing file {} is not a file", path.display()));
                }
                Ok(m) if blocks.plain_len(m.size()).is_none() => s.find(format!(
                    "backing file {}: length {} is no whole number of sealed blocks \
                     (damage, or an extension torn by a crash)",
                    path.display(),
                    m.size()
                )),
                Ok(_) => {}
                Err(e) => s.find(format!("backing file {}: {e}", path.display())),
            }
        }
    }
}
