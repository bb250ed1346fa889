//! T5 — the pefs dircache post: in one directory, create N empty files,
//! `ls -Al` (read all names, lstat each), remove them all; the per-file
//! cost must stay flat as N grows.
//!
//! Per N, in a fresh directory: `create` (open O_CREAT|O_EXCL + close, as
//! `touch` does), `ls -Al` (best of `--reps`; the first repetition follows
//! the creates, later ones list an unchanged directory — their requests
//! show whether a repeated listing costs a round trip per entry), `remove`
//! (unlink each). All figures are µs per file.

use std::path::Path;
use std::time::Instant;

use super::ops::{self, cpath, na};
use super::record::{Measurement, Unit};
use super::target::Target;
use super::{Ctx, Fail, PhaseSpec, Test, Timed, prepared, skipped};

pub fn run(
    ctx: &Ctx<'_>,
    t: &Target,
    dir: &Path,
    out: &mut Vec<Measurement>,
) -> anyhow::Result<()> {
    let reps = ctx.cfg.reps;
    for &n in &ctx.sizes.t5_counts {
        let m =
            |case: &str| Measurement::new(Test::T5, &t.label, case, Some(n as u64), Unit::UsPerOp);
        let (mut create, mut ls, mut remove) = (m("create"), m("ls -Al"), m("remove"));
        let d = dir.join(format!("n{n}"));
        let paths = ops::names(&d, "test-", n);
        let ready = prepared(ops::mkdirs(&d), &mut [&mut create, &mut ls, &mut remove])?;
        if ready.is_some() {
            let l = format!("T5 {}: create {n}", t.label);
            let created = ctx.phase(
                t,
                &mut create,
                PhaseSpec::new(&l, n as u64, 1, false),
                |ctx| {
                    let start = Instant::now();
                    for (i, p) in paths.iter().enumerate() {
                        ctx.tick(i)?;
                        drop(ops::create(p).map_err(|e| na(e, "create", i, n))?);
                    }
                    Ok(Timed::of(start.elapsed()))
                },
            )?;
            if created {
                let cd = cpath(&d);
                let mut buf = Vec::with_capacity(64 * 1024);
                let l = format!("T5 {}: ls -Al {n}", t.label);
                ctx.phase(
                    t,
                    &mut ls,
                    PhaseSpec::new(&l, n as u64, reps, false),
                    |ctx| {
                        ctx.check_stop()?;
                        let start = Instant::now();
                        let seen = ops::ls_al(&cd, &mut buf).map_err(|e| na(e, "ls -Al", 0, 1))?;
                        let elapsed = start.elapsed();
                        if seen != n {
                            return Err(Fail::Na(format!("ls saw {seen} entries, not {n}")));
                        }
                        Ok(Timed::of(elapsed))
                    },
                )?;
                let l = format!("T5 {}: remove {n}", t.label);
                ctx.phase(
                    t,
                    &mut remove,
                    PhaseSpec::new(&l, n as u64, 1, false),
                    |ctx| ops::unlink_all(ctx, &paths),
                )?;
            } else {
                skipped(&mut ls, &create);
                skipped(&mut remove, &create);
            }
        }
        out.extend([create, ls, remove]);
        ops::remove_tree(ctx, &d);
        ctx.check_stop()
            .map_err(|_| anyhow::anyhow!("interrupted"))?;
    }
    Ok(())
}
