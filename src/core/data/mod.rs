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
//!
//! On encrypted volumes backing files hold sealed blocks (see `sealed`):
//! every read and write goes through the daemon, and sizes are converted.

mod names;
mod pool;
mod sealed;

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;

use super::crypto::VolumeKeys;
use sealed::Sealed;

/// Stripes of per-inode locks for sealed contents (a partial block is
/// read, changed and sealed again under its inode's lock).
const STRIPES: usize = 64;

pub struct DataStore {
    root: PathBuf,
    keys: Option<Arc<VolumeKeys>>,
    stripes: Box<[RwLock<()>]>,
    /// Backing files made ahead of time (see `pool`); none on read-only
    /// and shared volumes.
    pool: std::sync::OnceLock<pool::Pool>,
    /// Which backing directories hold names not yet made durable.
    names: names::Names,
}

impl DataStore {
    pub fn new(root: &Path, keys: Option<Arc<VolumeKeys>>) -> Self {
        DataStore {
            root: root.to_path_buf(),
            stripes: (0..if keys.is_some() { STRIPES } else { 0 })
                .map(|_| RwLock::new(()))
                .collect(),
            keys,
            pool: std::sync::OnceLock::new(),
            names: names::Names::new(root),
        }
    }

    /// Starts making backing files ahead of time for the inode numbers
    /// from `next` on. A pool that cannot start is only a slower create.
    pub fn start_pool(&self, block: std::ops::Range<u64>) {
        let root = self.root.clone();
        let path: pool::PathOf = Arc::new(move |ino| backing_path(&root, ino));
        let p = Arc::clone(&path);
        match pool::Pool::start(block, move |ino| make_backing(&p(ino)), path) {
            Ok(pool) => {
                let _ = self.pool.set(pool);
            }
            Err(e) => tracing::warn!(error = %e, "cannot start the backing-file pool"),
        }
    }

    /// Inode number `ino` is being taken: the backing file made for it
    /// ahead of time, if it is a regular file and one is ready.
    pub fn take_ready(&self, ino: u64, regular: bool) -> Option<File> {
        let file = self.pool.get()?.take(ino, regular)?;
        // Made or renamed there by the pool: a name to make durable.
        self.names.made(ino);
        Some(file)
    }

    /// Makes the name of `ino`'s backing file durable, if it may not be
    /// yet: part of an `fsync` of the file.
    pub fn sync_name(&self, ino: u64) -> io::Result<()> {
        self.names.sync(ino)
    }

    /// Whether [`DataStore::sync_name`] has a directory to fsync for `ino`.
    pub fn name_pending(&self, ino: u64) -> bool {
        self.names.pending(ino)
    }

    /// Removes the backing files made for numbers never taken (before a
    /// clean unmount is recorded).
    /// The session reserved `block` of inode numbers (shared volumes).
    pub fn pool_block(&self, block: std::ops::Range<u64>) {
        if let Some(p) = self.pool.get() {
            p.set_block(block);
        }
    }

    pub fn stop_pool(&self) {
        if let Some(p) = self.pool.get() {
            p.stop();
        }
    }

    /// Whether contents are sealed (and so cannot be passed through).
    pub fn is_sealed(&self) -> bool {
        self.keys.is_some()
    }

    fn sealed<'a>(&'a self, file: &'a File, ino: u64) -> Option<(Sealed<'a>, &'a RwLock<()>)> {
        let keys = self.keys.as_ref()?;
        let lock = &self.stripes[(ino as usize) % STRIPES];
        Some((
            Sealed {
                cipher: keys.blocks(),
                file,
                ino,
            },
            lock,
        ))
    }

    /// The size of a file whose backing file is `len` bytes long.
    pub fn plain_size(&self, len: u64) -> u64 {
        if let Some(keys) = &self.keys {
            keys.blocks().layout().plain_size(len)
        } else {
            len
        }
    }

    /// The bytes of the backing file that hold `[offset, offset + len)`
    /// of the contents (whole sealed blocks on encrypted volumes).
    pub fn backing_span(&self, offset: u64, len: u64) -> (u64, u64) {
        let Some(keys) = &self.keys else {
            return (offset, offset.saturating_add(len));
        };
        let layout = keys.blocks().layout();
        let end = offset.saturating_add(len).div_ceil(layout.block());
        (offset / layout.block() * layout.unit(), end * layout.unit())
    }

    /// Up to `len` bytes of `ino`'s contents at `offset` (short at the end).
    pub fn read(&self, file: &File, ino: u64, offset: u64, len: u32) -> io::Result<Vec<u8>> {
        if let Some((s, lock)) = self.sealed(file, ino) {
            let _g = lock.read();
            return s.read(offset, u64::from(len));
        }
        read_new(file, len as usize, offset)
    }

    /// [`DataStore::read`] into `buf` (as many bytes as it holds): the
    /// bytes read.
    pub fn read_into(
        &self,
        file: &File,
        ino: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<usize> {
        if let Some((s, lock)) = self.sealed(file, ino) {
            let _g = lock.read();
            return s.read_into(offset, buf);
        }
        read_up_to(file, buf, offset)
    }

    /// Writes `data` into `ino`'s contents at `offset`.
    pub fn write(&self, file: &File, ino: u64, offset: u64, data: &[u8]) -> io::Result<()> {
        if let Some((s, lock)) = self.sealed(file, ino) {
            let _g = lock.write();
            return s.write(offset, data);
        }
        file.write_all_at(data, offset)
    }

    /// Sets `ino`'s size.
    pub fn set_len(&self, file: &File, ino: u64, size: u64) -> io::Result<()> {
        if let Some((s, lock)) = self.sealed(file, ino) {
            let _g = lock.write();
            return s.set_len(size);
        }
        file.set_len(size)
    }

    /// The size a truncate of sealed contents was cutting `file` (inode
    /// `ino`'s backing file) to when the daemon was killed, as the cut
    /// journal after its last block records (fsck reports it, then
    /// [`DataStore::finish_journalled_cut`] finishes it).
    pub(crate) fn journalled_cut(
        cipher: &crate::core::crypto::BlockCipher,
        file: &File,
        ino: u64,
    ) -> io::Result<Option<u64>> {
        Sealed { cipher, file, ino }.cut_journal()
    }

    /// Finishes the truncate [`DataStore::journalled_cut`] found (`file`
    /// open for writing). True if there was one.
    pub(crate) fn finish_journalled_cut(
        cipher: &crate::core::crypto::BlockCipher,
        file: &File,
        ino: u64,
    ) -> io::Result<bool> {
        Sealed { cipher, file, ino }.finish_cut()
    }

    /// Recovery after an unclean stop: finishes a truncate of sealed
    /// contents the daemon was killed inside ([`sealed::Sealed::finish_cut`]).
    /// True if it did; always false on unencrypted volumes.
    pub fn finish_cut(&self, ino: u64) -> io::Result<bool> {
        if self.keys.is_none() {
            return Ok(false);
        }
        let file = match self.open_with(ino, false) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        let (s, lock) = self.sealed(&file, ino).expect("sealed volume");
        let _g = lock.write();
        s.finish_cut()
    }

    /// `fallocate` of `ino`'s contents. Sealed contents take mode 0 and
    /// keep-size (space reserved in the sealed layout), punch-hole and
    /// zero-range; the rest would move blocks and is not supported.
    pub fn fallocate(
        &self,
        file: &File,
        ino: u64,
        offset: u64,
        len: u64,
        mode: i32,
    ) -> io::Result<()> {
        let Some((s, lock)) = self.sealed(file, ino) else {
            let flags = nix::fcntl::FallocateFlags::from_bits(mode)
                .ok_or_else(|| io::Error::from_raw_os_error(libc::EOPNOTSUPP))?;
            return nix::fcntl::fallocate(file, flags, offset as i64, len as i64)
                .map_err(io::Error::from);
        };
        let _g = lock.write();
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let end = offset.saturating_add(len);
        match mode & !libc::FALLOC_FL_KEEP_SIZE {
            0 => s.reserve(offset, len)?,
            libc::FALLOC_FL_PUNCH_HOLE if keep => s.zero(offset, len)?,
            libc::FALLOC_FL_ZERO_RANGE => s.zero(offset, len)?,
            _ => return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP)),
        }
        if !keep && end > s.len()? {
            s.set_len(end)?;
        }
        Ok(())
    }

    /// `lseek`'s `SEEK_DATA`/`SEEK_HOLE` (and plain seeks). Sealed
    /// contents report holes block by block (see [`Sealed::seek`]).
    pub fn lseek(&self, file: &File, ino: u64, offset: i64, whence: i32) -> io::Result<i64> {
        let w = match whence {
            libc::SEEK_DATA => nix::unistd::Whence::SeekData,
            libc::SEEK_HOLE => nix::unistd::Whence::SeekHole,
            libc::SEEK_SET => nix::unistd::Whence::SeekSet,
            libc::SEEK_END => nix::unistd::Whence::SeekEnd,
            _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
        };
        let Some((s, lock)) = self.sealed(file, ino) else {
            return nix::unistd::lseek(file, offset, w).map_err(io::Error::from);
        };
        let _g = lock.read();
        let size = s.len()? as i64;
        let at = if whence == libc::SEEK_END {
            size + offset
        } else {
            offset
        };
        match whence {
            // As the kernel's generic llseek: an offset taken unsigned, so
            // a negative one is past the end too.
            libc::SEEK_DATA | libc::SEEK_HOLE if at < 0 || at >= size => {
                Err(io::Error::from_raw_os_error(libc::ENXIO))
            }
            _ if at < 0 => Err(io::Error::from_raw_os_error(libc::EINVAL)),
            libc::SEEK_DATA | libc::SEEK_HOLE => {
                let found = s.seek(at as u64, size as u64, whence == libc::SEEK_DATA)?;
                Ok(found as i64)
            }
            _ => Ok(at),
        }
    }

    pub fn path(&self, ino: u64) -> PathBuf {
        backing_path(&self.root, ino)
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

    /// Opens the backing file of `ino` read-write; `NotFound` if missing.
    pub fn open_existing(&self, ino: u64) -> io::Result<File> {
        self.open_with(ino, false)
    }

    /// Creates the backing file of a new inode `ino` (it must not exist),
    /// its atime at the sentinel.
    pub fn create(&self, ino: u64) -> io::Result<File> {
        let file = make_backing(&self.path(ino))?;
        self.names.made(ino);
        Ok(file)
    }

    fn open_with(&self, ino: u64, create: bool) -> io::Result<File> {
        open_backing(&self.path(ino), create)
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

pub(crate) fn backing_path(root: &Path, ino: u64) -> PathBuf {
    root.join(format!("{:02x}", ino & 0xff))
        .join(format!("{ino:016x}"))
}

fn open_backing(path: &Path, create: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(create)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
}

/// A new backing file (it must not exist), atime armed.
fn make_backing(path: &Path) -> io::Result<File> {
    let f = open_backing(path, true)?;
    arm_atime(&f)?;
    Ok(f)
}

/// Sets a backing file's atime to the sentinel 0 (mtime untouched): the
/// next read moves it (see the module comment).
pub fn arm_atime(f: &File) -> io::Result<()> {
    let zero = nix::sys::time::TimeSpec::new(0, 0);
    nix::sys::stat::futimens(f, &zero, &nix::sys::time::TimeSpec::UTIME_OMIT)
        .map_err(io::Error::from)
}

/// Up to `len` bytes of `file` from `offset` (fewer at its end) in a new
/// buffer that is never zeroed first: a large READ's zeroing (or the page
/// faults of fresh zero pages) cost as much as the read itself.
pub(crate) fn read_new(file: &File, len: usize, offset: u64) -> io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(len);
    while buf.len() < len {
        let at = offset + buf.len() as u64;
        match rustix::io::pread(file, rustix::buffer::spare_capacity(&mut buf), at) {
            Ok(0) => break,
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(buf)
}

/// Reads into `buf` from `offset` until it is full or the file ends; the
/// bytes read.
pub(crate) fn read_up_to(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
