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

use std::path::Path;
use std::time::Instant;

use rustix::fs::XattrFlags;

use super::ops::{self, na};
use super::record::{Measurement, Unit};
use super::target::Target;
use super::{Ctx, Fail, PhaseSpec, Test, Timed, prepared, skipped};

const NAME: &std::ffi::CStr = c"user.test";

pub fn run(
    ctx: &Ctx<'_>,
    t: &Target,
    dir: &Path,
    out: &mut Vec<Measurement>,
) -> anyhow::Result<()> {
    let f = ctx.sizes.t1_files;
    let reps = ctx.cfg.reps;
    for &n in &ctx.sizes.t1_sizes {
        let m =
            |case: &str| Measurement::new(Test::T1, &t.label, case, Some(n as u64), Unit::UsPerOp);
        let (mut set_cold, mut set_hot, mut get_hot, mut get_cold) =
            (m("set cold"), m("set hot"), m("get hot"), m("get cold"));
        let d = dir.join(format!("n{n}"));
        let paths = ops::names(&d, "f", f);
        let ready = prepared(
            ops::mkdirs(&d).and_then(|()| {
                ops::create_all(ctx, &paths, &format!("T1 {}: create {f} files", t.label))
            }),
            &mut [&mut set_cold, &mut set_hot, &mut get_hot, &mut get_cold],
        )?;
        if ready.is_some() {
            // A recognisable pattern, not zeros (nothing may compress it).
            let value: Vec<u8> = (0..n).map(|i| (i * 7 + 13) as u8).collect();
            let set = |ctx: &Ctx<'_>| -> Result<Timed, Fail> {
                let start = Instant::now();
                for (i, p) in paths.iter().enumerate() {
                    ctx.tick(i)?;
                    rustix::fs::setxattr(p.as_c_str(), NAME, &value, XattrFlags::empty())
                        .map_err(|e| na(e, "setxattr", i, f))?;
                }
                Ok(Timed::of(start.elapsed()))
            };
            let mut buf = vec![0u8; 65_536];
            let mut get = |ctx: &Ctx<'_>| -> Result<Timed, Fail> {
                let start = Instant::now();
                for (i, p) in paths.iter().enumerate() {
                    ctx.tick(i)?;
                    let len = rustix::fs::getxattr(p.as_c_str(), NAME, &mut buf[..])
                        .map_err(|e| na(e, "getxattr", i, f))?;
                    if len != n {
                        return Err(Fail::Na(format!("getxattr returned {len} bytes, not {n}")));
                    }
                }
                Ok(Timed::of(start.elapsed()))
            };
            let label = |what: &str| format!("T1 {}: {what} {n} B ×{f}", t.label);
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
        out.extend([set_cold, set_hot, get_hot, get_cold]);
        ops::remove_tree(ctx, &d);
        ctx.check_stop()
            .map_err(|_| anyhow::anyhow!("interrupted"))?;
    }
    Ok(())
}
