//! Durable names of backing files.
//!
//! POSIX makes a new name durable only by an fsync of its directory: an
//! fsync of the file makes its contents durable, not the entry that leads
//! to it. ext4, xfs and btrfs happen to log a new name with the file's own
//! fsync; other filesystems need not, and after a power cut an fsync'd
//! file's contents would be unreachable. So an fsync of a file also fsyncs
//! its backing directory — only when a name was made there since that
//! directory's last fsync: one directory fsync covers every create before
//! it, and a file fsync'd again costs nothing more.
//!
//! Removed names need no such care: inode numbers are never reused, and a
//! backing file a crash brings back belongs to no inode (the next mount's
//! recovery removes it).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// Backing directories: `data/00` to `data/ff`, by the inode's low byte.
const DIRS: usize = 256;

pub(super) struct Names {
    root: PathBuf,
    /// Names made in each directory so far (creates, files taken ready).
    made: Box<[AtomicU64]>,
    /// `made` as it stood when each directory was last fsync'd. The lock
    /// also keeps a second fsync of the directory from answering before
    /// the one that covers it has finished.
    synced: Box<[Mutex<u64>]>,
}

impl Names {
    pub(super) fn new(root: &Path) -> Self {
        Names {
            root: root.to_path_buf(),
            made: (0..DIRS).map(|_| AtomicU64::new(0)).collect(),
            synced: (0..DIRS).map(|_| Mutex::new(0)).collect(),
        }
    }

    /// A name was made for `ino`'s backing file (after the making).
    pub(super) fn made(&self, ino: u64) {
        self.made[slot(ino)].fetch_add(1, Ordering::Release);
    }

    /// Makes every name made so far in `ino`'s directory durable.
    pub(super) fn sync(&self, ino: u64) -> io::Result<()> {
        let i = slot(ino);
        let mut synced = self.synced[i].lock();
        // Read under the lock: names made after this are not promised.
        let made = self.made[i].load(Ordering::Acquire);
        if *synced >= made {
            return Ok(());
        }
        File::open(self.root.join(format!("{i:02x}")))?.sync_all()?;
        *synced = made;
        Ok(())
    }

    /// Whether names made in `ino`'s directory wait for its fsync.
    pub(super) fn pending(&self, ino: u64) -> bool {
        *self.synced[slot(ino)].lock() < self.made[slot(ino)].load(Ordering::Acquire)
    }
}

fn slot(ino: u64) -> usize {
    (ino & 0xff) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_synced_once_per_spell_of_names() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..DIRS {
            std::fs::create_dir(dir.path().join(format!("{i:02x}"))).unwrap();
        }
        let n = Names::new(dir.path());
        assert!(!n.pending(0x105));
        n.made(0x105);
        n.made(0x205);
        assert!(n.pending(0x005), "same directory");
        assert!(!n.pending(0x006), "another directory");
        n.sync(0x305).unwrap();
        assert!(!n.pending(0x105));
        n.made(0x405);
        assert!(n.pending(0x105));
        n.sync(0x405).unwrap();
        assert!(!n.pending(0x405));
    }

    #[test]
    fn a_missing_directory_is_an_error_and_stays_pending() {
        let dir = tempfile::tempdir().unwrap();
        let n = Names::new(dir.path());
        n.made(7);
        assert!(n.sync(7).is_err());
        assert!(n.pending(7));
    }
}
