//! T2 — ZFS "Improve fstat(2) performance": `fstat` on one open file in a
//! tight loop, and a `du`-style walk (readdir + lstat of every entry) of a
//! `/usr`-shaped tree (see `tree`), cold and hot; then the same totals
//! (entries and bytes below the tree's root) by two `getxattr`s of the
//! root's recursive statistics where the target keeps them (safs's
//! `safs.dir.rentries` and `safs.dir.rbytes`), cold and hot.
//!
//! Order: build the tree (untimed), `fstat` (best of `--reps`), `du cold`
//! (each repetition after making the target cold), `du hot` (best of
//! `--reps`, the caches warmed by the cold walks). The walk figures are
//! seconds for the whole tree, as in the ZFS table; requests per operation
//! are per entry.

use std::path::Path;
use std::time::Instant;

use rustix::fs::{Mode, OFlags};

use super::ops::{self, cpath, errno_name, na};
use super::record::Unit;
use super::tree::{self, Kind, WRITTEN_MAX};
use super::{Ctx, Fail, PhaseSpec, Step, Timed, prepared, skipped};

/// Seed of the tree: fixed, so every target and every run walks the same one.
const SEED: u64 = 0x5AF5_0002;

fn build(ctx: &Ctx<'_>, root: &Path, entries: usize) -> Result<u64, Fail> {
    let plan = tree::plan(entries, SEED);
    ops::mkdirs(root)?;
    ctx.progress.phase(
        &format!("T2: building a /usr-shaped tree of {entries} entries"),
        entries as u64,
    );
    let data = vec![0x5Au8; WRITTEN_MAX as usize];
    let err = |e: rustix::io::Errno, what: &str, p: &str| {
        Fail::Na(format!(
            "{}: {what} {p} while building the tree",
            errno_name(e)
        ))
    };
    for (i, e) in plan.iter().enumerate() {
        ctx.tick(i)?;
        let p = cpath(&root.join(&e.path));
        match &e.kind {
            Kind::Dir => rustix::fs::mkdir(p.as_c_str(), Mode::from_raw_mode(0o755))
                .map_err(|x| err(x, "mkdir", &e.path))?,
            Kind::Symlink { target } => rustix::fs::symlink(target.as_str(), p.as_c_str())
                .map_err(|x| err(x, "symlink", &e.path))?,
            Kind::File { size } => {
                let fd = ops::create(&p).map_err(|x| err(x, "create", &e.path))?;
                let w = (*size).min(WRITTEN_MAX) as usize;
                if w > 0 {
                    let n =
                        rustix::io::write(&fd, &data[..w]).map_err(|x| err(x, "write", &e.path))?;
                    if n != w {
                        return Err(Fail::Na(format!("short write to {}", e.path)));
                    }
                }
                if *size > WRITTEN_MAX {
                    rustix::fs::ftruncate(&fd, *size).map_err(|x| err(x, "ftruncate", &e.path))?;
                }
            }
        }
    }
    Ok(plan.len() as u64)
}

pub fn run(s: &mut Step<'_>) -> anyhow::Result<()> {
    let (ctx, t, dir) = (s.ctx, s.t, s.dir);
    let reps = ctx.cfg.reps;
    let calls = ctx.sizes.t2_fstat_calls;
    let mut fstat = s.row("fstat", None, Unit::UsPerOp);
    let [mut du_cold, mut du_hot] = ["du cold", "du hot"].map(|c| s.row(c, None, Unit::Seconds));
    let [mut rstats_cold, mut rstats_hot] =
        ["rstats cold", "rstats hot"].map(|c| s.row(c, None, Unit::Seconds));

    // fstat on one open file.
    let file = dir.join("stat-me");
    let fd = prepared(
        ops::mkdirs(dir).and_then(|()| {
            let p = cpath(&file);
            drop(ops::create(&p).map_err(|e| na(e, "create", 0, 1))?);
            rustix::fs::open(
                p.as_c_str(),
                OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| na(e, "open", 0, 1))
        }),
        &mut [&mut fstat],
    )?;
    if let Some(fd) = fd {
        let l = s.label(&format!("fstat ×{calls}"));
        ctx.phase(
            t,
            &mut fstat,
            PhaseSpec::new(&l, calls, reps, false),
            |ctx| {
                let start = Instant::now();
                for i in 0..calls {
                    ctx.tick(i as usize)?;
                    std::hint::black_box(
                        rustix::fs::fstat(&fd)
                            .map_err(|e| na(e, "fstat", i as usize, calls as usize))?,
                    );
                }
                Ok(Timed::of(start.elapsed()))
            },
        )?;
        // Closed here: an open file would keep a safs target from remounting.
    }

    // du of the tree.
    let root = dir.join("usr");
    let built = prepared(
        build(ctx, &root, ctx.sizes.t2_entries),
        &mut [&mut du_cold, &mut du_hot, &mut rstats_cold, &mut rstats_hot],
    )?;
    if let Some(entries) = built {
        let croot = cpath(&root);
        let walk = |ctx: &Ctx<'_>| -> Result<Timed, Fail> {
            let start = Instant::now();
            let w = ops::du(&croot, ctx)?;
            let elapsed = start.elapsed();
            if w.entries != entries {
                return Err(Fail::Na(format!(
                    "walk saw {} entries, not {entries}",
                    w.entries
                )));
            }
            Ok(Timed::of(elapsed))
        };
        let l = s.label("du cold");
        let ok = ctx.phase(
            t,
            &mut du_cold,
            PhaseSpec::new(&l, entries, reps, true),
            walk,
        )?;
        let l = s.label("du hot");
        if ok
            || du_cold
                .error
                .as_deref()
                .is_some_and(|e| e.contains("need root"))
        {
            ctx.phase(
                t,
                &mut du_hot,
                PhaseSpec::new(&l, entries, reps, false),
                walk,
            )?;
        } else {
            skipped(&mut du_hot, &du_cold);
        }
        // The same totals from the root's statistics: what one request
        // costs against what the walk did.
        let totals = |ctx: &Ctx<'_>| -> Result<Timed, Fail> {
            let start = Instant::now();
            let n = rstat(&croot, c"safs.dir.rentries")?;
            let bytes = rstat(&croot, c"safs.dir.rbytes")?;
            let elapsed = start.elapsed();
            ctx.tick(1)?;
            if n != entries {
                return Err(Fail::Na(format!(
                    "statistics count {n} entries, not {entries}"
                )));
            }
            std::hint::black_box(bytes);
            Ok(Timed::of(elapsed))
        };
        let l = s.label("rstats cold");
        let ok = ctx.phase(
            t,
            &mut rstats_cold,
            PhaseSpec::new(&l, 1, reps, true),
            totals,
        )?;
        if ok {
            let l = s.label("rstats hot");
            ctx.phase(
                t,
                &mut rstats_hot,
                PhaseSpec::new(&l, 1, reps, false),
                totals,
            )?;
        } else {
            skipped(&mut rstats_hot, &rstats_cold);
        }
    }
    s.done([fstat, du_cold, du_hot, rstats_cold, rstats_hot]);
    Ok(())
}

/// A recursive statistic of directory `dir`, as decimal text in an xattr;
/// n/a where the target keeps none.
fn rstat(dir: &std::ffi::CStr, name: &std::ffi::CStr) -> Result<u64, Fail> {
    let mut buf = [0u8; 32];
    let n = rustix::fs::getxattr(dir, name, &mut buf[..])
        .map_err(|e| Fail::Na(format!("{}: no directory statistics", errno_name(e))))?;
    std::str::from_utf8(&buf[..n])
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| Fail::Na(format!("statistic {name:?} is not a number")))
}
