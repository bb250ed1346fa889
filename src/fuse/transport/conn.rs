//! The kernel side of a mount: the session's `/dev/fuse` file, its clones,
//! passthrough backing files, and cache notifications.
//!
//! The three `FUSE_DEV_IOC_*` ioctls are the only unsafe code of the
//! transport; each sits in its own small function.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Arc, Weak};

/// The FUSE character device.
pub(super) const DEV_FUSE: &str = "/dev/fuse";

/// `FUSE_DEV_IOC_MAGIC`.
const IOC_MAGIC: u32 = 229;

/// `struct fuse_backing_map`.
#[repr(C)]
struct BackingMap {
    fd: i32,
    flags: u32,
    padding: u64,
}

/// `FUSE_DEV_IOC_CLONE`: `_IOR(229, 0, uint32_t)`.
const IOC_CLONE: libc::Ioctl = libc::_IOR::<u32>(IOC_MAGIC, 0);
/// `FUSE_DEV_IOC_BACKING_OPEN`: `_IOW(229, 1, struct fuse_backing_map)`.
const IOC_BACKING_OPEN: libc::Ioctl = libc::_IOW::<BackingMap>(IOC_MAGIC, 1);
/// `FUSE_DEV_IOC_BACKING_CLOSE`: `_IOW(229, 2, uint32_t)`.
const IOC_BACKING_CLOSE: libc::Ioctl = libc::_IOW::<u32>(IOC_MAGIC, 2);

/// `FUSE_NOTIFY_INVAL_INODE`, `FUSE_NOTIFY_INVAL_ENTRY`.
const NOTIFY_INVAL_INODE: i32 = 2;
const NOTIFY_INVAL_ENTRY: i32 = 3;

/// Size of `struct fuse_out_header`.
pub(super) const OUT_HEADER_LEN: usize = 16;

/// The kernel side of a mount: the `/dev/fuse` file of this session.
/// Cloning shares the same file.
#[derive(Clone, Debug)]
pub struct Conn {
    file: Arc<File>,
}

impl Conn {
    pub(super) fn new(file: File) -> Conn {
        Conn {
            file: Arc::new(file),
        }
    }

    /// The session's file (INIT, notifications, ioctls).
    pub(super) fn file(&self) -> &Arc<File> {
        &self.file
    }

    /// A new `/dev/fuse` file attached to this session
    /// (`FUSE_DEV_IOC_CLONE`): it reads requests from the same queue, and
    /// the replies to what it read must be written to it.
    pub(super) fn clone_dev(&self) -> io::Result<File> {
        let new = open_dev_fuse()?;
        ioc_clone(new.as_fd(), self.file.as_fd())?;
        Ok(new)
    }

    /// Registers `fd` as a passthrough backing file
    /// (`FUSE_DEV_IOC_BACKING_OPEN`). Needs `CAP_SYS_ADMIN` and a session
    /// whose INIT enabled `FUSE_PASSTHROUGH`.
    pub fn open_backing(&self, fd: BorrowedFd<'_>) -> io::Result<BackingId> {
        let id = ioc_backing_open(self.file.as_fd(), fd)?;
        Ok(BackingId {
            id,
            conn: Arc::downgrade(&self.file),
        })
    }

    /// Sends cache invalidations to the kernel.
    pub fn notifier(&self) -> Notifier {
        Notifier {
            conn: Arc::downgrade(&self.file),
        }
    }
}

impl AsFd for Conn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// Opens `/dev/fuse` (read-write, close-on-exec).
pub(super) fn open_dev_fuse() -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(DEV_FUSE)
        .map_err(|e| {
            let hint = match e.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::ENODEV) => " (is the fuse module loaded?)",
                _ => "",
            };
            io::Error::new(e.kind(), format!("opening {DEV_FUSE}: {e}{hint}"))
        })
}

/// A registered passthrough backing file; dropping it closes the id
/// (`FUSE_DEV_IOC_BACKING_CLOSE`). The kernel keeps the backing file for as
/// long as files opened with it stay open, so it may be dropped as soon as
/// the OPEN reply carrying it has been sent.
#[derive(Debug)]
pub struct BackingId {
    id: i32,
    /// The session, if it still exists (its end frees every id).
    conn: Weak<File>,
}

impl BackingId {
    /// The id to put in `fuse_open_out.backing_id`.
    pub fn id(&self) -> i32 {
        self.id
    }
}

impl Drop for BackingId {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.upgrade()
            && let Err(e) = ioc_backing_close(conn.as_fd(), self.id)
            && e.raw_os_error() != Some(libc::ENODEV)
        {
            tracing::warn!(id = self.id, error = %e, "closing a passthrough backing id");
        }
    }
}

/// Cache invalidations sent to the kernel (`unique` 0, the notify code as
/// the error), always on `/dev/fuse`. Errors are the kernel's: `ENOENT`
/// when it has nothing cached under that inode or parent (also once the
/// mount is gone); `ENOTCONN` once the session's file is closed.
#[derive(Clone, Debug)]
pub struct Notifier {
    conn: Weak<File>,
}

impl Notifier {
    /// Drops the kernel's cached attributes of `ino`, and its cached data
    /// from `offset` for `len` bytes (`len` 0: to the end; `offset`
    /// negative: attributes only) (`FUSE_NOTIFY_INVAL_INODE`).
    pub fn inval_inode(&self, ino: u64, offset: i64, len: i64) -> io::Result<()> {
        let mut out = [0u8; 24];
        out[0..8].copy_from_slice(&ino.to_ne_bytes());
        out[8..16].copy_from_slice(&offset.to_ne_bytes());
        out[16..24].copy_from_slice(&len.to_ne_bytes());
        self.notify(NOTIFY_INVAL_INODE, &[&out])
    }

    /// Drops the kernel's cached entry `name` in directory `parent`
    /// (`FUSE_NOTIFY_INVAL_ENTRY`).
    pub fn inval_entry(&self, parent: u64, name: &[u8]) -> io::Result<()> {
        let namelen = u32::try_from(name.len())
            .map_err(|_| io::Error::from_raw_os_error(libc::ENAMETOOLONG))?;
        let mut out = [0u8; 16];
        out[0..8].copy_from_slice(&parent.to_ne_bytes());
        out[8..12].copy_from_slice(&namelen.to_ne_bytes());
        // flags (FUSE_EXPIRE_ONLY) stay 0: drop the entry.
        self.notify(NOTIFY_INVAL_ENTRY, &[&out, name, b"\0"])
    }

    fn notify(&self, code: i32, body: &[&[u8]]) -> io::Result<()> {
        let conn = self
            .conn
            .upgrade()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOTCONN))?;
        write_message(&conn, 0, code, body)
    }
}

/// Writes one message (`fuse_out_header` + `body`) with one `writev`.
/// `/dev/fuse` takes a message whole or not at all.
pub(super) fn write_message(
    file: &File,
    unique: u64,
    error: i32,
    body: &[&[u8]],
) -> io::Result<()> {
    let body_len: usize = body.iter().map(|b| b.len()).sum();
    let len = OUT_HEADER_LEN + body_len;
    let len32 = u32::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?;
    let mut header = [0u8; OUT_HEADER_LEN];
    header[0..4].copy_from_slice(&len32.to_ne_bytes());
    header[4..8].copy_from_slice(&error.to_ne_bytes());
    header[8..16].copy_from_slice(&unique.to_ne_bytes());

    // Most replies have at most a few parts: no allocation for them.
    const INLINE: usize = 8;
    let mut inline = [IoSlice::new(&[]); INLINE];
    let mut heap;
    let iov: &[IoSlice<'_>] = if body.len() < INLINE {
        inline[0] = IoSlice::new(&header);
        for (slot, part) in inline[1..].iter_mut().zip(body) {
            *slot = IoSlice::new(part);
        }
        &inline[..=body.len()]
    } else {
        heap = Vec::with_capacity(body.len() + 1);
        heap.push(IoSlice::new(&header));
        heap.extend(body.iter().map(|b| IoSlice::new(b)));
        &heap
    };
    let written = (&*file).write_vectored(iov)?;
    if written != len {
        return Err(io::Error::other(format!(
            "short write to {DEV_FUSE}: {written} of {len} bytes"
        )));
    }
    Ok(())
}

/// `ioctl(new, FUSE_DEV_IOC_CLONE, &session_fd)`.
#[allow(unsafe_code)]
fn ioc_clone(new: BorrowedFd<'_>, session: BorrowedFd<'_>) -> io::Result<()> {
    let session_fd: u32 = session.as_raw_fd() as u32;
    // SAFETY: `new` is an open file for the call's duration; the kernel
    // reads one u32 (the request code says so) from `&session_fd`, which
    // lives across the call.
    let r = unsafe { libc::ioctl(new.as_raw_fd(), IOC_CLONE, &session_fd as *const u32) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `ioctl(session, FUSE_DEV_IOC_BACKING_OPEN, &map)`: the new id.
#[allow(unsafe_code)]
fn ioc_backing_open(session: BorrowedFd<'_>, backing: BorrowedFd<'_>) -> io::Result<i32> {
    let map = BackingMap {
        fd: backing.as_raw_fd(),
        flags: 0,
        padding: 0,
    };
    // SAFETY: `session` is an open file for the call's duration; the kernel
    // reads one `struct fuse_backing_map` (`BackingMap` is its `repr(C)`
    // twin, and the request code carries its size) from `&map`, which lives
    // across the call.
    let r = unsafe {
        libc::ioctl(
            session.as_raw_fd(),
            IOC_BACKING_OPEN,
            &map as *const BackingMap,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// `ioctl(session, FUSE_DEV_IOC_BACKING_CLOSE, &id)`.
#[allow(unsafe_code)]
fn ioc_backing_close(session: BorrowedFd<'_>, id: i32) -> io::Result<()> {
    let id: u32 = id as u32;
    // SAFETY: `session` is an open file for the call's duration; the kernel
    // reads one u32 from `&id`, which lives across the call.
    let r = unsafe { libc::ioctl(session.as_raw_fd(), IOC_BACKING_CLOSE, &id as *const u32) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
