//! T11 — a `setxattr` on a file that already holds K xattrs (Samba's
//! streams, Swift's metadata chunks, stress-ng's xattr stressor): replacing
//! one 32 B value must cost the same whatever else the file holds.
//!
//! For each K of the table: one file with K − 1 xattrs `user.s.NNNNN` of
//! 40 B beside `user.t11` (32 B), made untimed; then `set` replaces
//! `user.t11` with a new 32 B value `t11_calls` times (one file, hot), and
//! `get` reads it back as often (best of `--reps`). A K the filesystem
//! refuses (ext4 keeps all xattrs of a file in one 4 KiB block: ENOSPC) is
//! n/a.

use rustix::fs::XattrFlags;

use super::ops::{self, cpath, na};
use super::record::Unit;
use super::{Fail, PhaseSpec, Step, Timed, prepared};

pub const SET: &str = "set 32 B";
pub const GET: &str = "get 32 B";
const NAME: &std::ffi::CStr = c"user.t11";

pub fn run(s: &mut Step<'_>) -> anyhow::Result<()> {
    let (ctx, t) = (s.ctx, s.t);
    let calls = ctx.sizes.t11_calls;
    for &k in &ctx.sizes.t11_counts {
        let [mut set, mut get] = [SET, GET].map(|c| s.row(c, Some(k as u64), Unit::UsPerOp));
        let d = s.dir.join(format!("k{k}"));
        let file = cpath(&d.join("file"));
        let ready = prepared(
            ops::mkdirs(&d).and_then(|()| {
                ctx.progress
                    .phase(&s.label(&format!("{k} xattrs on one file")), k as u64);
                drop(ops::create(&file).map_err(|e| na(e, "create", 0, 1))?);
                let other = [b'v'; 40];
                for i in 1..k {
                    ctx.tick(i)?;
                    let name = format!("user.s.{i:05}");
                    rustix::fs::setxattr(
                        file.as_c_str(),
                        name.as_str(),
                        &other,
                        XattrFlags::empty(),
                    )
                    .map_err(|e| na(e, "setxattr", i, k))?;
                }
                rustix::fs::setxattr(file.as_c_str(), NAME, &[0u8; 32], XattrFlags::empty())
                    .map_err(|e| na(e, "setxattr", k - 1, k))
            }),
            &mut [&mut set, &mut get],
        )?;
        if ready.is_some() {
            let l = s.label(&format!("{SET} on a file with {k} ×{calls}"));
            let spec = |l, reps| PhaseSpec::new(l, calls as u64, reps, false);
            let done = ctx.phase(t, &mut set, spec(&l, 1), |ctx| {
                let mut value = [0u8; 32];
                let start = std::time::Instant::now();
                for i in 0..calls {
                    ctx.tick(i)?;
                    value[..8].copy_from_slice(&(i as u64 + 1).to_le_bytes());
                    rustix::fs::setxattr(file.as_c_str(), NAME, &value, XattrFlags::empty())
                        .map_err(|e| na(e, "setxattr", i, calls))?;
                }
                Ok(Timed::of(start.elapsed()))
            })?;
            if done {
                let l = s.label(&format!("{GET} on a file with {k} ×{calls}"));
                let mut buf = [0u8; 64];
                ctx.phase(t, &mut get, spec(&l, ctx.cfg.reps), |ctx| {
                    let start = std::time::Instant::now();
                    for i in 0..calls {
                        ctx.tick(i)?;
                        let len = rustix::fs::getxattr(file.as_c_str(), NAME, &mut buf[..])
                            .map_err(|e| na(e, "getxattr", i, calls))?;
                        if len != 32 {
                            return Err(Fail::Na(format!("getxattr returned {len} bytes, not 32")));
                        }
                    }
                    Ok(Timed::of(start.elapsed()))
                })?;
            } else {
                super::skipped(&mut get, &set);
            }
        }
        s.done([set, get]);
        s.next_size(&d)?;
    }
    Ok(())
}
