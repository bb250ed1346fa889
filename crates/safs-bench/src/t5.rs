//! T5 — the pefs dircache post: in one directory, create N empty files,
//! `ls -Al` (read all names, lstat each), remove them all; the per-file
//! cost must stay flat as N grows.
//!
//! Per N, in a fresh directory: `create` (open O_CREAT|O_EXCL + close, as
//! `touch` does), `ls -Al` (best of `--reps`; the first repetition follows
//! the creates, later ones list an unchanged directory — their requests
//! show whether a repeated listing costs a round trip per entry), the same
//! listing with the kernel's caches dropped before each repetition (on a
//! FUSE target every name and attribute comes from the daemon then, whose
//! own caches stay — the listing a daemon's directory cache serves), and
//! `remove` (unlink each). All figures are µs per file. T8 runs the same
//! phases at the pefs post's own sizes, with coreutils' `ls -Al` beside.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use super::ops::{self, cpath, na};
use super::record::Unit;
use super::{Ctx, Fail, PhaseSpec, Step, Timed, prepared, skipped, timed_each};

pub fn run(s: &mut Step<'_>) -> anyhow::Result<()> {
    let ctx = s.ctx;
    dir_sizes(s, &ctx.sizes.t5_counts, false)
}

/// The row of the listing after the kernel's caches were dropped.
pub const LS_KERNEL_COLD: &str = "ls -Al (kernel caches cold)";
/// The row of coreutils' `ls -Al` (T8).
pub const LS_PROGRAM: &str = "ls -Al (coreutils)";

/// create / `ls -Al` / remove for every N of `counts`; with `coreutils`,
/// also coreutils' own `ls -Al` after the loop's.
pub fn dir_sizes(s: &mut Step<'_>, counts: &[usize], coreutils: bool) -> anyhow::Result<()> {
    let (ctx, t) = (s.ctx, s.t);
    let reps = ctx.cfg.reps;
    for &n in counts {
        let [mut create, mut ls, mut ls_cold, mut ls_prog, mut remove] =
            ["create", "ls -Al", LS_KERNEL_COLD, LS_PROGRAM, "remove"]
                .map(|c| s.row(c, Some(n as u64), Unit::UsPerOp));
        let d = s.dir.join(format!("n{n}"));
        let paths = ops::names(&d, "test-", n);
        let ready = prepared(
            ops::mkdirs(&d),
            &mut [
                &mut create,
                &mut ls,
                &mut ls_cold,
                &mut ls_prog,
                &mut remove,
            ],
        )?;
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
                let mut list = |ctx: &Ctx<'_>| -> Result<Timed, Fail> {
                    ctx.check_stop()?;
                    let start = Instant::now();
                    let seen = ops::ls_al(&cd, &mut buf).map_err(|e| na(e, "ls -Al", 0, 1))?;
                    let elapsed = start.elapsed();
                    if seen != n {
                        return Err(Fail::Na(format!("ls saw {seen} entries, not {n}")));
                    }
                    Ok(Timed::of(elapsed))
                };
                let l = s.label(&format!("ls -Al {n}"));
                ctx.phase(t, &mut ls, spec(&l, reps), &mut list)?;
                let l = s.label(&format!("{LS_KERNEL_COLD} {n}"));
                let cold = PhaseSpec::new(&l, n as u64, reps, false).kernel_cold();
                ctx.phase(t, &mut ls_cold, cold, &mut list)?;
                if coreutils {
                    let l = s.label(&format!("{LS_PROGRAM} {n}"));
                    let spec = PhaseSpec::new(&l, n as u64, reps, false);
                    ctx.phase(t, &mut ls_prog, spec, |ctx| {
                        ctx.check_stop()?;
                        ls_program(&d, n)
                    })?;
                }
                let l = s.label(&format!("remove {n}"));
                ctx.phase(t, &mut remove, spec(&l, 1), |ctx| {
                    ops::unlink_all(ctx, &paths)
                })?;
            } else {
                skipped(&mut ls, &create);
                skipped(&mut ls_cold, &create);
                skipped(&mut ls_prog, &create);
                skipped(&mut remove, &create);
            }
        }
        let mut rows = vec![create, ls, ls_cold];
        if coreutils {
            rows.push(ls_prog);
        }
        rows.push(remove);
        s.done(rows);
        s.next_size(&d)?;
    }
    Ok(())
}

/// Runs `ls -Al DIR` (C locale, output read and counted, not shown) and
/// times it whole: process start, its statx and its two xattr probes per
/// entry (SELinux label, ACL), sorting and formatting.
fn ls_program(dir: &Path, n: usize) -> Result<Timed, Fail> {
    let start = Instant::now();
    let out = Command::new("ls")
        .arg("-Al")
        .arg(dir)
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Fail::Na(format!("cannot run ls: {e}")))?;
    let elapsed = start.elapsed();
    if !out.status.success() {
        return Err(Fail::Na(format!(
            "ls -Al failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    // One line per entry after the "total" line.
    let lines = out.stdout.iter().filter(|b| **b == b'\n').count();
    if lines != n + 1 {
        return Err(Fail::Na(format!(
            "ls -Al printed {} entries, not {n}",
            lines.saturating_sub(1)
        )));
    }
    Ok(Timed::of(elapsed))
}
