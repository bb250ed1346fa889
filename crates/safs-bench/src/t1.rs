//! T1 — ZFS "Implement SA based xattrs": one xattr `user.test` of N bytes
//! on each of F files, then read back from each.
//!
//! Per value size, in a fresh directory of F new empty files:
//! 1. `set cold` — the first `setxattr` of every file after the target was
//!    made cold (the ZFS table's note: "all setattr/getattr's were done
//!    after dropping the cache");
//! 2. `set hot` — the same value set again on warm caches (an in-place
//!    replace, as dbench and Samba do), once: it writes;
//! 3. `get hot` — `getxattr` of every file, best of `--reps`;
//! 4. `get cold` — the same, each repetition after making the target cold.
//!
//! A size the filesystem refuses (ext4 from 4 KiB: ENOSPC) is n/a for all
//! four; the directory is removed before the next size.

use rustix::fs::XattrFlags;

use super::ops::{self, na};
use super::record::Unit;
use super::{Ctx, Fail, PhaseSpec, Step, Timed, prepared, skipped, timed_each};

const NAME: &std::ffi::CStr = c"user.test";

pub fn run(s: &mut Step<'_>) -> anyhow::Result<()> {
    let (ctx, t) = (s.ctx, s.t);
    let f = ctx.sizes.t1_files;
    let reps = ctx.cfg.reps;
    for &n in &ctx.sizes.t1_sizes {
        let [mut set_cold, mut set_hot, mut get_hot, mut get_cold] =
            ["set cold", "set hot", "get hot", "get cold"]
                .map(|c| s.row(c, Some(n as u64), Unit::UsPerOp));
        let d = s.dir.join(format!("n{n}"));
        let paths = ops::names(&d, "f", f);
        let ready = prepared(
            ops::mkdirs(&d).and_then(|()| {
                ops::create_all(ctx, &paths, &s.label(&format!("create {f} files")))
            }),
            &mut [&mut set_cold, &mut set_hot, &mut get_hot, &mut get_cold],
        )?;
        if ready.is_some() {
            // A recognisable pattern, not zeros (nothing may compress it).
            let value: Vec<u8> = (0..n).map(|i| (i * 7 + 13) as u8).collect();
            let set = |ctx: &Ctx<'_>| -> Result<Timed, Fail> {
                timed_each(ctx, &paths, |i, p| {
                    rustix::fs::setxattr(p.as_c_str(), NAME, &value, XattrFlags::empty())
                        .map_err(|e| na(e, "setxattr", i, f))
                })
            };
            let mut buf = vec![0u8; 65_536];
            let mut get = |ctx: &Ctx<'_>| -> Result<Timed, Fail> {
                timed_each(ctx, &paths, |i, p| {
                    let len = rustix::fs::getxattr(p.as_c_str(), NAME, &mut buf[..])
                        .map_err(|e| na(e, "getxattr", i, f))?;
                    if len != n {
                        return Err(Fail::Na(format!("getxattr returned {len} bytes, not {n}")));
                    }
                    Ok(())
                })
            };
            let label = |what: &str| s.label(&format!("{what} {n} B ×{f}"));
            let spec = |l, reps, cold| PhaseSpec::new(l, f as u64, reps, cold);
            let l = label("set cold");
            if ctx.phase(t, &mut set_cold, spec(&l, 1, true), &set)? {
                let l = label("set hot");
                ctx.phase(t, &mut set_hot, spec(&l, 1, false), &set)?;
                let l = label("get hot");
                if ctx.phase(t, &mut get_hot, spec(&l, reps, false), &mut get)? {
                    let l = label("get cold");
                    ctx.phase(t, &mut get_cold, spec(&l, reps, true), &mut get)?;
                } else {
                    skipped(&mut get_cold, &get_hot);
                }
            } else {
                for m in [&mut set_hot, &mut get_hot, &mut get_cold] {
                    skipped(m, &set_cold);
                }
            }
        }
        s.done([set_cold, set_hot, get_hot, get_cold]);
        s.next_size(&d)?;
    }
    Ok(())
}
