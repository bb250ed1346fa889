//! T6 — 4 KiB small files: create+write (open O_CREAT|O_EXCL, one 4 KiB
//! write, close), read hot (open, one 4 KiB read, close; best of
//! `--reps`), read cold (each repetition after making the target cold),
//! delete (unlink). All figures are µs per file.

use super::ops::{self, na};
use super::record::Unit;
use super::{Ctx, Fail, PhaseSpec, Step, Timed, prepared, skipped, timed_each};

const SIZE: usize = 4096;

pub fn run(s: &mut Step<'_>) -> anyhow::Result<()> {
    let (ctx, t) = (s.ctx, s.t);
    let reps = ctx.cfg.reps;
    let n = ctx.sizes.t6_files;
    let [mut write, mut hot, mut cold, mut delete] =
        ["create+write", "read hot", "read cold", "delete"].map(|c| s.row(c, None, Unit::UsPerOp));
    let paths = ops::names(s.dir, "s", n);
    let ready = prepared(
        ops::mkdirs(s.dir),
        &mut [&mut write, &mut hot, &mut cold, &mut delete],
    )?;
    if ready.is_some() {
        let data: Vec<u8> = (0..SIZE).map(|i| (i * 31 + 7) as u8).collect();
        let spec = |l, reps, cold| PhaseSpec::new(l, n as u64, reps, cold);
        let l = s.label(&format!("create+write {n}"));
        let wrote = ctx.phase(t, &mut write, spec(&l, 1, false), |ctx| {
            timed_each(ctx, &paths, |i, p| {
                let fd = ops::create(p).map_err(|e| na(e, "create", i, n))?;
                let w = rustix::io::write(&fd, &data).map_err(|e| na(e, "write", i, n))?;
                if w != SIZE {
                    return Err(Fail::Na(format!("short write ({w} bytes) at {}", i + 1)));
                }
                Ok(())
            })
        })?;
        if wrote {
            let mut buf = ops::PageBuf::new(SIZE);
            let mut read = |ctx: &Ctx<'_>| -> Result<Timed, Fail> {
                timed_each(ctx, &paths, |i, p| {
                    let fd = ops::open_read(p).map_err(|e| na(e, "open", i, n))?;
                    let r = rustix::io::read(&fd, &mut buf[..]).map_err(|e| na(e, "read", i, n))?;
                    if r != SIZE {
                        return Err(Fail::Na(format!("short read ({r} bytes) at {}", i + 1)));
                    }
                    Ok(())
                })
            };
            let l = s.label(&format!("read hot {n}"));
            ctx.phase(t, &mut hot, spec(&l, reps, false), &mut read)?;
            let l = s.label(&format!("read cold {n}"));
            ctx.phase(t, &mut cold, spec(&l, reps, true), &mut read)?;
            let l = s.label(&format!("delete {n}"));
            ctx.phase(t, &mut delete, spec(&l, 1, false), |ctx| {
                ops::unlink_all(ctx, &paths)
            })?;
        } else {
            for m in [&mut hot, &mut cold, &mut delete] {
                skipped(m, &write);
            }
        }
    }
    s.done([write, hot, cold, delete]);
    Ok(())
}
