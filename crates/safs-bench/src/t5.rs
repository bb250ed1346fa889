//! T5 — the pefs dircache post: in one directory, create N empty files,
//! `ls -Al` (read all names, lstat each), remove them all; the per-file
//! cost must stay flat as N grows.
//!
//! Per N, in a fresh directory: `create` (open O_CREAT|O_EXCL + close, as
//! `touch` does), `ls -Al` (best of `--reps`; the first repetition follows
//! the creates, later ones list an unchanged directory — their requests
//! show whether a repeated listing costs a round trip per entry), `remove`
//! (unlink each). All figures are µs per file.

use std::time::Instant;

use super::ops::{self, cpath, na};
use super::record::Unit;
use super::{Fail, PhaseSpec, Step, Timed, prepared, skipped, timed_each};

pub fn run(s: &mut Step<'_>) -> anyhow::Result<()> {
    let (ctx, t) = (s.ctx, s.t);
    let reps = ctx.cfg.reps;
    for &n in &ctx.sizes.t5_counts {
        let [mut create, mut ls, mut remove] =
            ["create", "ls -Al", "remove"].map(|c| s.row(c, Some(n as u64), Unit::UsPerOp));
        let d = s.dir.join(format!("n{n}"));
        let paths = ops::names(&d, "test-", n);
        let ready = prepared(ops::mkdirs(&d), &mut [&mut create, &mut ls, &mut remove])?;
        if ready.is_some() {
            let spec = |l, reps| PhaseSpec::new(l, n as u64, reps, false);
            let l = s.label(&format!("create {n}"));
            let created = ctx.phase(t, &mut create, spec(&l, 1), |ctx| {
                timed_each(ctx, &paths, |i, p| {
                    drop(ops::create(p).map_err(|e| na(e, "create", i, n))?);
                    Ok(())
                })
            })?;
            if created {
                let cd = cpath(&d);
                let mut buf = Vec::with_capacity(64 * 1024);
                let l = s.label(&format!("ls -Al {n}"));
                ctx.phase(t, &mut ls, spec(&l, reps), |ctx| {
                    ctx.check_stop()?;
                    let start = Instant::now();
                    let seen = ops::ls_al(&cd, &mut buf).map_err(|e| na(e, "ls -Al", 0, 1))?;
                    let elapsed = start.elapsed();
                    if seen != n {
                        return Err(Fail::Na(format!("ls saw {seen} entries, not {n}")));
                    }
                    Ok(Timed::of(elapsed))
                })?;
                let l = s.label(&format!("remove {n}"));
                ctx.phase(t, &mut remove, spec(&l, 1), |ctx| {
                    ops::unlink_all(ctx, &paths)
                })?;
            } else {
                skipped(&mut ls, &create);
                skipped(&mut remove, &create);
            }
        }
        s.done([create, ls, remove]);
        s.next_size(&d)?;
    }
    Ok(())
}
