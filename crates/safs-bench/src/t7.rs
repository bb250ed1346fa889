//! T7 — `getxattr` of an absent name, which ACL-aware tools and Samba ask
//! constantly: the answer must be ENODATA, fast. One file, the same path,
//! `getxattr(path, "user.absent")` in a loop; best of `--reps`.
//!
//! On safs targets the same call is then split in three (the `round trip`
//! rows): the daemon traces when each GETXATTR reached it and when its
//! reply was handed back, the loop notes when each call began and
//! returned, all on `CLOCK_MONOTONIC`; the means of the way there, the
//! daemon's part and the way back (which add up to the call) show where a
//! slow round trip is lost, the medians (in the notes) what is typical.

use std::ffi::CStr;
use std::time::Instant;

use rustix::io::Errno;
use safs_control::trace_clock_ns as now_ns;

use super::ops::{self, cpath, errno_name, na};
use super::record::{Rep, Unit};
use super::target::Target;
use super::{Ctx, Fail, PhaseSpec, Step, Timed, prepared, skipped};

/// Calls traced for the round-trip rows.
const TRACED: usize = 2_000;
/// `FUSE_GETXATTR`.
const OP_GETXATTR: u32 = 22;

pub fn run(s: &mut Step<'_>) -> anyhow::Result<()> {
    let (ctx, t) = (s.ctx, s.t);
    let calls = ctx.sizes.t7_calls;
    let mut m = s.row("getxattr absent", None, Unit::UsPerOp);
    let mut parts = ["to the daemon", "in the daemon", "back to the caller"]
        .map(|c| s.row(&format!("round trip: {c}"), None, Unit::UsPerOp));
    let file = cpath(&s.dir.join("file"));
    let ready = prepared(
        ops::mkdirs(s.dir).and_then(|()| {
            ops::create(&file)
                .map(drop)
                .map_err(|e| na(e, "create", 0, 1))
        }),
        &mut [&mut m],
    )?;
    if ready.is_none() {
        for p in &mut parts {
            skipped(p, &m);
        }
    }
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
        let l = s.label(&format!("getxattr absent ×{TRACED}, traced"));
        ctx.progress.phase(&l, TRACED as u64);
        match round_trips(ctx, t, &file) {
            Ok(split) => {
                for (p, (mean, median, n)) in parts.iter_mut().zip(split) {
                    p.ops = n;
                    p.note = Some(format!("mean of {n} traced calls; median {median:.3} µs"));
                    p.reps.push(Rep {
                        secs: 0.0,
                        value: mean,
                        sd: None,
                        requests: None,
                        daemon_ns: None,
                        engine: None,
                        daemon_mem: None,
                    });
                }
            }
            Err(Fail::Na(e)) => {
                for p in &mut parts {
                    p.error = Some(e.clone());
                }
            }
            Err(Fail::Abort(e)) => return Err(e),
        }
    }
    let [a, b, c] = parts;
    s.done([m, a, b, c]);
    Ok(())
}

/// [`TRACED`] absent-name `getxattr`s of `file` with the daemon's trace
/// on; the mean and median (µs) of the way there, the daemon's part and
/// the way back, each with the number of calls matched to a traced
/// request.
fn round_trips(ctx: &Ctx<'_>, t: &Target, file: &CStr) -> Result<[(f64, f64, u64); 3], Fail> {
    let Some(s) = &t.safs else {
        return Err(Fail::Na(
            "not run: no daemon to trace (not a safs mount)".into(),
        ));
    };
    let mut buf = [0u8; 256];
    // Room for stray requests of other processes beside the loop's.
    safs_control::trace_start(&s.volume, TRACED * 4)?;
    let mut calls = Vec::with_capacity(TRACED);
    let looped = (|| {
        for i in 0..TRACED {
            ctx.tick(i)?;
            let began = now_ns();
            let r = rustix::fs::getxattr(file, c"user.absent", &mut buf[..]);
            calls.push((began, now_ns()));
            match r {
                Err(Errno::NODATA) => {}
                Err(e) => return Err(na(e, "getxattr", i, TRACED)),
                Ok(_) => return Err(Fail::Na("user.absent exists".into())),
            }
        }
        Ok(())
    })();
    let trace = safs_control::trace_take(&s.volume)?;
    looped?;
    let mut gets: Vec<_> = trace.iter().filter(|r| r.opcode == OP_GETXATTR).collect();
    gets.sort_by_key(|r| r.arrived_ns);
    // One caller, one request per call: each call's request is the one
    // that arrived and was answered between its start and its return.
    let (mut there, mut inside, mut back) = (Vec::new(), Vec::new(), Vec::new());
    let mut j = 0;
    for (began, ended) in calls {
        while j < gets.len() && gets[j].arrived_ns < began {
            j += 1;
        }
        if let Some(r) = gets.get(j).filter(|r| r.answered_ns <= ended) {
            there.push((r.arrived_ns - began) as f64 / 1e3);
            inside.push((r.answered_ns - r.arrived_ns) as f64 / 1e3);
            back.push((ended - r.answered_ns) as f64 / 1e3);
            j += 1;
        }
    }
    if there.len() < TRACED / 2 {
        return Err(Fail::Na(format!(
            "only {} of {TRACED} calls matched a traced request",
            there.len()
        )));
    }
    let n = there.len() as u64;
    Ok([there, inside, back].map(|mut v| {
        v.sort_by(f64::total_cmp);
        (v.iter().sum::<f64>() / n as f64, v[v.len() / 2], n)
    }))
}
