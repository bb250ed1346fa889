//! Backing files: the contents of regular files, one file per inode under
//! `<volume>/data/xx/`, opened for kernel passthrough or daemon-side I/O.
//!
//! A regular file's backing file is created lazily on first open, so an
//! empty file made by `mknod` or a rename target costs no data-store work;
//! a missing backing file means "empty". The backing file is authoritative
//! for size and blocks while a writer has the file open (writes may bypass
//! the daemon entirely under passthrough); the inode record is brought up to
//! date when the last writer closes, and after a crash from the `W` markers.
//!
//! Access times: the filesystem under the volume keeps each backing file's
//! atime at the sentinel 0 until a read (by the kernel under passthrough, or
//! by the daemon) moves it to the time of that read; the core turns that
//! into the inode's atime under the mount's rules and sets the sentinel back
//! (see `Fs::observe_reads`). Backing files are therefore opened without
//! `O_NOATIME`, and the filesystem under the volume must not be mounted
//! `noatime` for reads through passthrough to update access times.

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
        match self.open_with(ino, false) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => match self.create(ino) {
                // Created meanwhile by another open of the same inode.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => self.open_with(ino, false),
                other => other,
            },
            other => other,
        }
    }

    /// Creates the backing file of a new inode `ino` (it must not exist),
    /// its atime at the sentinel.
    pub fn create(&self, ino: u64) -> io::Result<File> {
        let f = self.open_with(ino, true)?;
        arm_atime(&f)?;
        Ok(f)
    }

    fn open_with(&self, ino: u64, create: bool) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(create)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
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

/// Sets a backing file's atime to the sentinel 0 (mtime untouched): the
/// next read moves it (see the module comment).
pub fn arm_atime(f: &File) -> io::Result<()> {
    let zero = nix::sys::time::TimeSpec::new(0, 0);
    nix::sys::stat::futimens(f, &zero, &nix::sys::time::TimeSpec::UTIME_OMIT)
        .map_err(io::Error::from)
}
