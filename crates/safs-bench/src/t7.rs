//! T7 — `getxattr` of an absent name, which ACL-aware tools and Samba ask
//! constantly: the answer must be ENODATA, fast. One file, the same path,
//! `getxattr(path, "user.absent")` in a loop; best of `--reps`.

use std::time::Instant;

use rustix::io::Errno;

use super::ops::{self, cpath, errno_name, na};
use super::record::Unit;
use super::{Fail, PhaseSpec, Step, Timed, prepared};

pub fn run(s: &mut Step<'_>) -> anyhow::Result<()> {
    let (ctx, t) = (s.ctx, s.t);
    let calls = ctx.sizes.t7_calls;
    let mut m = s.row("getxattr absent", None, Unit::UsPerOp);
    let file = cpath(&s.dir.join("file"));
    let ready = prepared(
        ops::mkdirs(s.dir).and_then(|()| {
            ops::create(&file)
                .map(drop)
                .map_err(|e| na(e, "create", 0, 1))
        }),
        &mut [&mut m],
    )?;
    if ready.is_some() {
        let mut buf = [0u8; 256];
        let l = s.label(&format!("getxattr absent ×{calls}"));
        ctx.phase(
            t,
            &mut m,
            PhaseSpec::new(&l, calls, ctx.cfg.reps, false),
            |ctx| {
                let start = Instant::now();
                for i in 0..calls as usize {
                    ctx.tick(i)?;
                    match rustix::fs::getxattr(file.as_c_str(), c"user.absent", &mut buf[..]) {
                        Err(Errno::NODATA) => {}
                        Err(e) => return Err(na(e, "getxattr", i, calls as usize)),
                        Ok(_) => {
                            return Err(Fail::Na(format!(
                                "user.absent exists (expected {})",
                                errno_name(Errno::NODATA)
                            )));
                        }
                    }
                }
                Ok(Timed::of(start.elapsed()))
            },
        )?;
    }
    s.done([m]);
    Ok(())
}
