//! T7 — `getxattr` of an absent name, which ACL-aware tools and Samba ask
//! constantly: the answer must be ENODATA, fast. One file, the same path,
//! `getxattr(path, "user.absent")` in a loop; best of `--reps`.

use std::path::Path;
use std::time::Instant;

use rustix::io::Errno;

use super::ops::{self, cpath, errno_name, na};
use super::record::{Measurement, Unit};
use super::target::Target;
use super::{Ctx, Fail, PhaseSpec, Test, Timed, prepared};

pub fn run(
    ctx: &Ctx<'_>,
    t: &Target,
    dir: &Path,
    out: &mut Vec<Measurement>,
) -> anyhow::Result<()> {
    let calls = ctx.sizes.t7_calls;
    let mut m = Measurement::new(Test::T7, &t.label, "getxattr absent", None, Unit::UsPerOp);
    let file = cpath(&dir.join("file"));
    let ready = prepared(
        ops::mkdirs(dir).and_then(|()| {
            ops::create(&file)
                .map(drop)
                .map_err(|e| na(e, "create", 0, 1))
        }),
        &mut [&mut m],
    )?;
    if ready.is_some() {
        let mut buf = [0u8; 256];
        let l = format!("T7 {}: getxattr absent ×{calls}", t.label);
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
    out.push(m);
    Ok(())
}
