//! Backing files: the contents of regular files, one file per inode under
//! `<volume>/data/xx/`, opened for kernel passthrough or daemon-side I/O.
//!
//! A regular file's backing file is created lazily on first open, so an
//! empty file made by `mknod` or a rename target costs no data-store work;
//! a missing backing file means "empty". The backing file is authoritative
//! for size and blocks while a writer has the file open (writes may bypass
//! the daemon entirely under passthrough); the inode record is brought up to
//! date when the last writer closes, and after a crash from the `W` markers.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

pub struct DataStore {
    root: PathBuf,
}

impl DataStore {
    pub fn new(root: &Path) -> Self {
        DataStore {
            root: root.to_path_buf(),
        }
    }

    pub fn path(&self, ino: u64) -> PathBuf {
        self.root
            .join(format!("{:02x}", ino & 0xff))
            .join(format!("{ino:016x}"))
    }

    /// Opens (creating if missing) the backing file of `ino` read-write.
    pub fn open(&self, ino: u64) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOATIME)
            .open(self.path(ino))
    }

    /// Size and 512-byte blocks of the backing file; a missing one is empty.
    pub fn stat(&self, ino: u64) -> io::Result<Option<std::fs::Metadata>> {
        match std::fs::metadata(self.path(ino)) {
            Ok(m) => Ok(Some(m)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}
