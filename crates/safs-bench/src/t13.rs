//! T13 — a `git clone` into a directory with POSIX ACLs (a project share:
//! Samba's `inherit acls`, a team directory with a default ACL): every
//! directory and file made below it inherits the ACL, so each create
//! carries the parent's default ACL and leaves `system.posix_acl_access`
//! (and, on directories, `…_default`) on the new inode.
//!
//! The tree is T2's `/usr`-shaped one (see `tree`): ~85 % files of a few
//! bytes to 16 KiB written (larger ones are cut there), 11 % directories,
//! 4 % symlinks. Rows, µs per entry (per file for `read cold`):
//!
//! - `checkout`: what `git checkout` does for each entry in order — make
//!   it (mkdir; create, write, close; symlink), then `lstat` it for the
//!   index;
//! - `status cold`: `git status` after making the target cold — `lstat`
//!   of every path;
//! - `read cold`: every file opened, read to its end and closed after
//!   making the target cold (`git diff`, a build).
//!
//! The caller owns everything it made, so the kernel's permission checks
//! use the owner's bits: what the ACLs cost here is their inheritance at
//! every create and the xattrs they leave, as on a share whose users write
//! their own trees.

use std::ffi::CString;
use std::path::Path;

use rustix::fs::{Mode, OFlags, XattrFlags};

use super::ops::{self, cpath, errno_name};
use super::record::Unit;
use super::tree::{self, Kind, WRITTEN_MAX};
use super::{Fail, PhaseSpec, Step, prepared, skipped, timed_each};

/// Seed of the tree: every target and run clones the same one.
const SEED: u64 = 0x5AF5_0013;

const ACCESS: &std::ffi::CStr = c"system.posix_acl_access";
const DEFAULT: &std::ffi::CStr = c"system.posix_acl_default";

/// The root's access and default ACL, in Linux's xattr layout: owner rwx,
/// user 1000 rwx, group r-x, group 1000 r-x, mask rwx, other r-x.
fn acl() -> Vec<u8> {
    const UNDEFINED: u32 = u32::MAX;
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 7u16, UNDEFINED),
        (0x02, 7, 1000),
        (0x04, 5, UNDEFINED),
        (0x08, 5, 1000),
        (0x10, 7, UNDEFINED),
        (0x20, 5, UNDEFINED),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// The repository's root, with its ACL set: n/a where the target keeps no
/// POSIX ACLs.
fn prepare(root: &Path) -> Result<(), Fail> {
    ops::mkdirs(root)?;
    let c = cpath(root);
    let acl = acl();
    for name in [ACCESS, DEFAULT] {
        rustix::fs::setxattr(c.as_c_str(), name, &acl, XattrFlags::empty()).map_err(|e| {
            Fail::Na(format!(
                "{}: cannot set {name:?} (no POSIX ACLs)",
                errno_name(e)
            ))
        })?;
    }
    Ok(())
}

/// Whether `p` inherited an ACL: the checkout is measured as it claims.
fn inherited(p: &CString) -> Result<(), Fail> {
    let mut buf = [0u8; 256];
    rustix::fs::getxattr(p.as_c_str(), ACCESS, &mut buf[..])
        .map(drop)
        .map_err(|e| {
            Fail::Na(format!(
                "{}: {p:?} inherited no ACL from its directory",
                errno_name(e)
            ))
        })
}

pub fn run(s: &mut Step<'_>) -> anyhow::Result<()> {
    let (ctx, t) = (s.ctx, s.t);
    let reps = ctx.cfg.reps;
    let [mut checkout, mut status, mut read] =
        ["checkout", "status cold", "read cold"].map(|c| s.row(c, None, Unit::UsPerOp));
    let root = s.dir.join("repo");
    let plan = tree::plan(ctx.sizes.t13_entries, SEED);
    let paths: Vec<CString> = plan.iter().map(|e| cpath(&root.join(&e.path))).collect();
    let files: Vec<(CString, usize)> = plan
        .iter()
        .zip(&paths)
        .filter_map(|(e, p)| match e.kind {
            Kind::File { size } => Some((p.clone(), size.min(WRITTEN_MAX) as usize)),
            _ => None,
        })
        .collect();
    let n = plan.len();
    let ready = prepared(prepare(&root), &mut [&mut checkout, &mut status, &mut read])?;
    if ready.is_some() {
        let data = vec![0x5Au8; WRITTEN_MAX as usize];
        let l = s.label(&format!("checkout {n}"));
        let spec = |l, ops, reps, cold| PhaseSpec::new(l, ops as u64, reps, cold);
        let cloned = ctx.phase(t, &mut checkout, spec(&l, n, 1, false), |ctx| {
            let na = |e, what, i| ops::na(e, what, i, n);
            let timed = timed_each(ctx, &plan, |i, e| {
                let p = paths[i].as_c_str();
                match &e.kind {
                    Kind::Dir => rustix::fs::mkdir(p, Mode::from_raw_mode(0o755))
                        .map_err(|x| na(x, "mkdir", i))?,
                    Kind::Symlink { target } => {
                        rustix::fs::symlink(target.as_str(), p).map_err(|x| na(x, "symlink", i))?
                    }
                    Kind::File { size } => {
                        let fd = ops::create(p).map_err(|x| na(x, "create", i))?;
                        let w = (*size).min(WRITTEN_MAX) as usize;
                        if w > 0
                            && rustix::io::write(&fd, &data[..w]).map_err(|x| na(x, "write", i))?
                                != w
                        {
                            return Err(Fail::Na(format!("short write at {}", i + 1)));
                        }
                    }
                }
                rustix::fs::lstat(p).map_err(|x| na(x, "lstat", i))?;
                Ok(())
            })?;
            // Untimed: the first directory and file took the root's ACL.
            for kind in [0, 1] {
                let first = plan.iter().zip(&paths).find(|(e, _)| match kind {
                    0 => e.kind == Kind::Dir,
                    _ => matches!(e.kind, Kind::File { .. }),
                });
                if let Some((_, p)) = first {
                    inherited(p)?;
                }
            }
            Ok(timed)
        })?;
        if cloned {
            let l = s.label(&format!("status cold {n}"));
            ctx.phase(t, &mut status, spec(&l, n, reps, true), |ctx| {
                timed_each(ctx, &paths, |i, p| {
                    rustix::fs::lstat(p.as_c_str())
                        .map(drop)
                        .map_err(|e| ops::na(e, "lstat", i, n))
                })
            })?;
            let mut buf = ops::PageBuf::new(WRITTEN_MAX as usize);
            let l = s.label(&format!("read cold {}", files.len()));
            ctx.phase(t, &mut read, spec(&l, files.len(), reps, true), |ctx| {
                let m = files.len();
                timed_each(ctx, &files, |i, (p, len)| {
                    let fd = rustix::fs::open(
                        p.as_c_str(),
                        OFlags::RDONLY | OFlags::CLOEXEC,
                        Mode::empty(),
                    )
                    .map_err(|e| ops::na(e, "open", i, m))?;
                    let mut got = 0;
                    loop {
                        let r = rustix::io::read(&fd, &mut buf[..])
                            .map_err(|e| ops::na(e, "read", i, m))?;
                        if r == 0 {
                            break;
                        }
                        got += r;
                    }
                    if got != *len {
                        return Err(Fail::Na(format!("read {got} bytes of {len} at {}", i + 1)));
                    }
                    Ok(())
                })
            })?;
        } else {
            for m in [&mut status, &mut read] {
                skipped(m, &checkout);
            }
        }
    }
    s.done([checkout, status, read]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_acl_is_in_linux_xattr_layout() {
        let a = acl();
        // Version 2, then six entries of 8 bytes, tags in ascending order.
        assert_eq!(a.len(), 4 + 6 * 8);
        assert_eq!(&a[..4], &2u32.to_le_bytes());
        let tags: Vec<u16> = a[4..]
            .chunks(8)
            .map(|e| u16::from_le_bytes([e[0], e[1]]))
            .collect();
        assert_eq!(tags, [0x01, 0x02, 0x04, 0x08, 0x10, 0x20]);
    }
}
