//! The system calls the timing loops make, through `rustix` (direct
//! syscalls, no libc buffering, no allocation per call: paths are built as
//! `CString`s before a loop starts), and the untimed helpers that prepare
//! and clean up a phase.

use std::ffi::{CStr, CString};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, Mode, OFlags, RawDir};
use rustix::io::Errno;

use super::{Ctx, Fail};

/// `ENOSPC`, `E2BIG`, … — the symbolic name of an errno.
pub fn errno_name(e: Errno) -> String {
    format!("{:?}", nix::errno::Errno::from_raw(e.raw_os_error()))
}

/// A phase that the filesystem refused: recorded as "n/a" with the errno.
pub fn na(e: Errno, what: &str, i: usize, n: usize) -> Fail {
    Fail::Na(format!(
        "{}: {what} failed at {} of {n}",
        errno_name(e),
        i + 1
    ))
}

pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("paths have no NUL")
}

/// `dir/{prefix}{i}` for i in 0..n, as absolute C paths.
pub fn names(dir: &Path, prefix: &str, n: usize) -> Vec<CString> {
    (0..n)
        .map(|i| cpath(&dir.join(format!("{prefix}{i}"))))
        .collect()
}

pub fn mkdirs(dir: &Path) -> Result<(), Fail> {
    std::fs::create_dir_all(dir).map_err(|e| {
        let errno = Errno::from_raw_os_error(e.raw_os_error().unwrap_or(libc::EIO));
        Fail::Na(format!(
            "{}: cannot create {}",
            errno_name(errno),
            dir.display()
        ))
    })
}

const CREATE: OFlags = OFlags::CREATE
    .union(OFlags::EXCL)
    .union(OFlags::WRONLY)
    .union(OFlags::CLOEXEC);

/// Creates an empty file (`touch` of a new name).
#[inline]
pub fn create(path: &CStr) -> rustix::io::Result<OwnedFd> {
    rustix::fs::open(path, CREATE, Mode::from_raw_mode(0o644))
}

#[inline]
pub fn open_read(path: &CStr) -> rustix::io::Result<OwnedFd> {
    rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
}

/// Creates every file in `paths`, untimed (the preparation of a phase).
pub fn create_all(ctx: &Ctx<'_>, paths: &[CString], what: &str) -> Result<(), Fail> {
    ctx.progress.phase(what, paths.len() as u64);
    for (i, p) in paths.iter().enumerate() {
        ctx.tick(i)?;
        drop(create(p).map_err(|e| na(e, "create", i, paths.len()))?);
    }
    Ok(())
}

/// Unlinks every path in order, timed (the remove/delete phases of T5, T6).
pub fn unlink_all(ctx: &Ctx<'_>, paths: &[CString]) -> Result<super::Timed, Fail> {
    super::timed_each(ctx, paths, |i, p| {
        rustix::fs::unlinkat(rustix::fs::CWD, p.as_c_str(), AtFlags::empty())
            .map_err(|e| na(e, "unlink", i, paths.len()))
    })
}

/// Removes a directory tree, untimed; failures are only reported.
pub fn remove_tree(ctx: &Ctx<'_>, dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        ctx.warn(format!("cannot remove {}: {e}", dir.display()));
    }
}

/// Reads all names of a directory (without `.` and `..`) as `ls` does
/// before it stats them.
pub fn read_names(dir: impl AsFd, buf: &mut Vec<u8>) -> rustix::io::Result<Vec<CString>> {
    let mut out = Vec::new();
    let spare: &mut [MaybeUninit<u8>] = buf.spare_capacity_mut();
    let mut it = RawDir::new(dir, spare);
    while let Some(ent) = it.next() {
        let ent = ent?;
        let name = ent.file_name();
        let b = name.to_bytes();
        if b == b"." || b == b".." {
            continue;
        }
        out.push(name.to_owned());
    }
    Ok(out)
}

/// `ls -Al` of one directory: read all names, `lstat` each. Returns the
/// number of entries.
pub fn ls_al(dir: &CStr, buf: &mut Vec<u8>) -> rustix::io::Result<usize> {
    let fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let names = read_names(&fd, buf)?;
    for n in &names {
        std::hint::black_box(rustix::fs::statat(
            &fd,
            n.as_c_str(),
            AtFlags::SYMLINK_NOFOLLOW,
        )?);
    }
    Ok(names.len())
}

/// What a `du` walk saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Walk {
    pub entries: u64,
    pub blocks: u64,
}

/// `du`: depth-first, per directory read all names then `fstatat` each
/// (as fts does), descending into directories.
pub fn du(dir: &CStr, ctx: &Ctx<'_>) -> Result<Walk, Fail> {
    let fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Fail::Na(format!("{}: open of the tree root", errno_name(e))))?;
    let mut w = Walk::default();
    let mut buf = Vec::with_capacity(64 * 1024);
    du_at(&fd, ctx, &mut w, &mut buf, 0)?;
    Ok(w)
}

fn du_at(
    dir: &OwnedFd,
    ctx: &Ctx<'_>,
    w: &mut Walk,
    buf: &mut Vec<u8>,
    depth: usize,
) -> Result<(), Fail> {
    let err = |e: Errno, what: &str| Fail::Na(format!("{}: {what} during the walk", errno_name(e)));
    let names = read_names(dir, buf).map_err(|e| err(e, "getdents"))?;
    let mut subdirs = Vec::new();
    for n in names {
        let st = rustix::fs::statat(dir, n.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| err(e, "lstat"))?;
        w.entries += 1;
        w.blocks += st.st_blocks as u64;
        ctx.tick(w.entries as usize)?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory {
            subdirs.push(n);
        }
    }
    if depth > 64 {
        return Err(Fail::Na("tree deeper than 64 levels".into()));
    }
    for n in subdirs {
        let sub = rustix::fs::openat(
            dir,
            n.as_c_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| err(e, "open of a directory"))?;
        du_at(&sub, ctx, w, buf, depth + 1)?;
    }
    Ok(())
}

/// A zeroed buffer that starts on a page boundary, as dd's does. Where in
/// a page a read's destination starts changes what copying into it costs
/// on some CPUs — on this project's 2-vCPU EPYC VM a destination 16 bytes
/// into a page (where glibc puts a fresh 1 MiB allocation) is filled from
/// the page cache at 8.5 GB/s, at any other offset tried at 19–22 — and
/// that cost is the buffer's, not the filesystem's: a row must not depend
/// on which target happened to get a fresh allocation.
pub struct PageBuf {
    bytes: Vec<u8>,
    at: usize,
    len: usize,
}

impl PageBuf {
    const PAGE: usize = 4096;

    pub fn new(len: usize) -> PageBuf {
        let bytes = vec![0u8; len + Self::PAGE];
        let at = bytes.as_ptr().align_offset(Self::PAGE);
        PageBuf { bytes, at, len }
    }
}

impl std::ops::Deref for PageBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[self.at..self.at + self.len]
    }
}

impl std::ops::DerefMut for PageBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[self.at..self.at + self.len]
    }
}
