//! T12 — metadata operations from several threads at once (mdtest-style).
//!
//! For each thread count T of the table, and in two layouts — every thread
//! in a directory of its own (`private`), all threads in one directory
//! (`shared`) — the threads together create `t12_files` empty files (each
//! its own share, started at once behind a barrier), then `stat` them and
//! `getxattr` a 32 B `user.t12` of each (set untimed between), both after
//! making the target cold so that every inode is read from the filesystem's
//! store, then remove them. The figure is the operations per second of all
//! threads together: from 1 to 2 threads it should grow as much as the
//! kernel filesystems' (cold reads must not queue on one lock).

use std::ffi::{CStr, CString};
use std::sync::Barrier;
use std::time::Instant;

use rustix::fs::{AtFlags, XattrFlags};

use super::ops::{self, na};
use super::record::Unit;
use super::{Fail, PhaseSpec, Step, Timed, prepared, skipped};

pub const CREATE: &str = "create";
pub const STAT: &str = "stat cold";
pub const GETXATTR: &str = "getxattr cold";
pub const REMOVE: &str = "remove";
/// The layouts, as the first word of every row's case.
pub const LAYOUTS: [&str; 2] = ["private", "shared"];

const NAME: &CStr = c"user.t12";

/// `layout: case`, the row's case.
pub fn case(layout: &str, what: &str) -> String {
    format!("{layout}: {what}")
}

/// Runs `op` over every thread's paths, one thread per list, all started
/// together; operations per second of them all.
fn parallel(
    paths: &[Vec<CString>],
    op: impl Fn(usize, &CStr) -> Result<(), Fail> + Sync,
) -> Result<Timed, Fail> {
    let total: usize = paths.iter().map(Vec::len).sum();
    let barrier = Barrier::new(paths.len() + 1);
    let (op, barrier) = (&op, &barrier);
    std::thread::scope(|sc| {
        let hs: Vec<_> = paths
            .iter()
            .map(|ps| {
                sc.spawn(move || -> Result<(), Fail> {
                    barrier.wait();
                    ps.iter().enumerate().try_for_each(|(i, p)| op(i, p))
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let results: Vec<_> = hs
            .into_iter()
            .map(|h| h.join().expect("a bench thread panicked"))
            .collect();
        let elapsed = start.elapsed();
        results.into_iter().collect::<Result<(), Fail>>()?;
        Ok(Timed {
            value: Some(total as f64 / elapsed.as_secs_f64().max(1e-9)),
            ..Timed::of(elapsed)
        })
    })
}

pub fn run(s: &mut Step<'_>) -> anyhow::Result<()> {
    let (ctx, t) = (s.ctx, s.t);
    for layout in LAYOUTS {
        for &threads in &ctx.sizes.t12_threads {
            let [mut create, mut stat, mut getx, mut remove] = [CREATE, STAT, GETXATTR, REMOVE]
                .map(|w| s.row(&case(layout, w), Some(threads as u64), Unit::Iops));
            let d = s.dir.join(format!("{layout}-{threads}"));
            let per = ctx.sizes.t12_files / threads;
            let total = per * threads;
            let paths: Vec<Vec<CString>> = (0..threads)
                .map(|j| match layout {
                    "private" => ops::names(&d.join(format!("t{j}")), "f", per),
                    _ => ops::names(&d, &format!("t{j}-f"), per),
                })
                .collect();
            let ready = prepared(
                (0..threads).try_for_each(|j| match layout {
                    "private" => ops::mkdirs(&d.join(format!("t{j}"))),
                    _ => ops::mkdirs(&d),
                }),
                &mut [&mut create, &mut stat, &mut getx, &mut remove],
            )?;
            if ready.is_some() {
                let label = |w: &str| s.label(&format!("{layout} {w}, {threads} threads ×{total}"));
                let reps = ctx.cfg.reps;
                let l = label(CREATE);
                let made = ctx.phase(
                    t,
                    &mut create,
                    PhaseSpec::new(&l, total as u64, 1, false),
                    |_| {
                        parallel(&paths, |i, p| {
                            drop(ops::create(p).map_err(|e| na(e, "create", i, per))?);
                            Ok(())
                        })
                    },
                )?;
                let tagged = made
                    && prepared(
                        paths.iter().flatten().enumerate().try_for_each(|(i, p)| {
                            ctx.tick(i)?;
                            rustix::fs::setxattr(
                                p.as_c_str(),
                                NAME,
                                &[7u8; 32],
                                XattrFlags::empty(),
                            )
                            .map_err(|e| na(e, "setxattr", i, total))
                        }),
                        &mut [&mut stat, &mut getx],
                    )?
                    .is_some();
                if tagged {
                    let l = label(STAT);
                    ctx.phase(
                        t,
                        &mut stat,
                        PhaseSpec::new(&l, total as u64, reps, true),
                        |_| {
                            parallel(&paths, |i, p| {
                                rustix::fs::stat(p)
                                    .map(drop)
                                    .map_err(|e| na(e, "stat", i, per))
                            })
                        },
                    )?;
                    let l = label(GETXATTR);
                    ctx.phase(
                        t,
                        &mut getx,
                        PhaseSpec::new(&l, total as u64, reps, true),
                        |_| {
                            parallel(&paths, |i, p| {
                                let mut buf = [0u8; 64];
                                match rustix::fs::getxattr(p, NAME, &mut buf[..]) {
                                    Ok(32) => Ok(()),
                                    Ok(n) => Err(Fail::Na(format!(
                                        "getxattr returned {n} bytes, not 32"
                                    ))),
                                    Err(e) => Err(na(e, "getxattr", i, per)),
                                }
                            })
                        },
                    )?;
                } else if !made {
                    skipped(&mut stat, &create);
                    skipped(&mut getx, &create);
                }
                if made {
                    let l = label(REMOVE);
                    ctx.phase(
                        t,
                        &mut remove,
                        PhaseSpec::new(&l, total as u64, 1, false),
                        |_| {
                            parallel(&paths, |i, p| {
                                rustix::fs::unlinkat(rustix::fs::CWD, p, AtFlags::empty())
                                    .map_err(|e| na(e, "unlink", i, per))
                            })
                        },
                    )?;
                } else {
                    skipped(&mut remove, &create);
                }
            }
            s.done([create, stat, getx, remove]);
            s.next_size(&d)?;
        }
    }
    Ok(())
}
