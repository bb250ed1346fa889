//! T6 — 4 KiB small files: create+write (open O_CREAT|O_EXCL, one 4 KiB
//! write, close), read hot (open, one 4 KiB read, close; best of
//! `--reps`), read cold (each repetition after making the target cold),
//! delete (unlink). All figures are µs per file.

use std::path::Path;
use std::time::Instant;

use super::ops::{self, na};
use super::record::{Measurement, Unit};
use super::target::Target;
use super::{Ctx, Fail, PhaseSpec, Test, Timed, prepared, skipped};

const SIZE: usize = 4096;

pub fn run(
    ctx: &Ctx<'_>,
    t: &Target,
    dir: &Path,
    out: &mut Vec<Measurement>,
) -> anyhow::Result<()> {
    let reps = ctx.cfg.reps;
    let n = ctx.sizes.t6_files;
    let m = |case: &str| Measurement::new(Test::T6, &t.label, case, None, Unit::UsPerOp);
    let (mut write, mut hot, mut cold, mut delete) = (
        m("create+write"),
        m("read hot"),
        m("read cold"),
        m("delete"),
    );
    let paths = ops::names(dir, "s", n);
    let ready = prepared(
        ops::mkdirs(dir),
        &mut [&mut write, &mut hot, &mut cold, &mut delete],
    )?;
    if ready.is_some() {
        let data: Vec<u8> = (0..SIZE).map(|i| (i * 31 + 7) as u8).collect();
        let l = format!("T6 {}: create+write {n}", t.label);
        let wrote = ctx.phase(
            t,
            &mut write,
            PhaseSpec::new(&l, n as u64, 1, false),
            |ctx| {
                let start = Instant::now();
                for (i, p) in paths.iter().enumerate() {
                    ctx.tick(i)?;
                    let fd = ops::create(p).map_err(|e| na(e, "create", i, n))?;
                    let w = rustix::io::write(&fd, &data).map_err(|e| na(e, "write", i, n))?;
                    if w != SIZE {
                        return Err(Fail::Na(format!("short write ({w} bytes) at {}", i + 1)));
                    }
                }
                Ok(Timed::of(start.elapsed()))
            },
        )?;
        if wrote {
            let mut buf = vec![0u8; SIZE];
            let mut read = |ctx: &Ctx<'_>| -> Result<Timed, Fail> {
                let start = Instant::now();
                for (i, p) in paths.iter().enumerate() {
                    ctx.tick(i)?;
                    let fd = ops::open_read(p).map_err(|e| na(e, "open", i, n))?;
                    let r = rustix::io::read(&fd, &mut buf[..]).map_err(|e| na(e, "read", i, n))?;
                    if r != SIZE {
                        return Err(Fail::Na(format!("short read ({r} bytes) at {}", i + 1)));
                    }
                }
                Ok(Timed::of(start.elapsed()))
            };
            let l = format!("T6 {}: read hot {n}", t.label);
            ctx.phase(
                t,
                &mut hot,
                PhaseSpec::new(&l, n as u64, reps, false),
                &mut read,
            )?;
            let l = format!("T6 {}: read cold {n}", t.label);
            ctx.phase(
                t,
                &mut cold,
                PhaseSpec::new(&l, n as u64, reps, true),
                &mut read,
            )?;
            let l = format!("T6 {}: delete {n}", t.label);
            ctx.phase(
                t,
                &mut delete,
                PhaseSpec::new(&l, n as u64, 1, false),
                |ctx| ops::unlink_all(ctx, &paths),
            )?;
        } else {
            for m in [&mut hot, &mut cold, &mut delete] {
                skipped(m, &write);
            }
        }
    }
    out.extend([write, hot, cold, delete]);
    Ok(())
}
