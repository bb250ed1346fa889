//! T10 — two mounts of one volume: how long a change made through one
//! mount takes to show through the other (volumes several daemons serve:
//! safs on PostgreSQL; every other target is n/a).
//!
//! A second daemon mounts the target's volume on a mountpoint of its own
//! for the test. Then, `t10_changes` times each: a file is created through
//! the target's mount and `stat` polls for it through the second; an xattr
//! is set through the target's mount and `getxattr` polls for its new value
//! through the second. Each change is timed from the call that makes it to
//! the first poll that sees it; the rows are the median and the 99th
//! percentile, µs. The polls go through the second mount's kernel, so the
//! figure includes the invalidations its daemon sends it.
//!
//! Then writers at once, each in a directory its mount made: `4 ×
//! t10_changes` creates by one thread through the target's mount, by two
//! threads through it, and by one thread on each of the two mounts; then
//! as many setxattrs on those files, and as many renames within their
//! directories, the same three ways. µs per operation (wall time /
//! operations). Writers of one volume take turns (its write lease), so
//! the two-mount rows show what a second mount costs writers, not a gain.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::ops::cpath;
use super::record::Unit;
use super::{Fail, PhaseSpec, Step, Timed};

pub const CREATE_P50: &str = "create → visible p50";
pub const CREATE_P99: &str = "create → visible p99";
pub const XATTR_P50: &str = "setxattr → visible p50";
pub const XATTR_P99: &str = "setxattr → visible p99";
/// The writer rows: each operation, by each set of writers.
pub const WRITERS: [[&str; 3]; 3] = [
    [
        "create, 1 writer on one mount",
        "create, 2 writers on one mount",
        "create, 1 writer on each of 2 mounts",
    ],
    [
        "setxattr, 1 writer on one mount",
        "setxattr, 2 writers on one mount",
        "setxattr, 1 writer on each of 2 mounts",
    ],
    [
        "rename in a directory, 1 writer on one mount",
        "rename in a directory, 2 writers on one mount",
        "rename in a directory, 1 writer on each of 2 mounts",
    ],
];

/// Longest a change may take to show before the row is an error.
const GIVE_UP: Duration = Duration::from_secs(10);

/// Percentile `p` (0–100) of sorted `xs`, nearest rank.
fn percentile(xs: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * xs.len() as f64).ceil() as usize;
    xs[rank.clamp(1, xs.len()) - 1]
}

/// Polls `seen` until true; the time since `start`.
fn until(start: Instant, mut seen: impl FnMut() -> bool) -> Result<f64, Fail> {
    loop {
        if seen() {
            return Ok(start.elapsed().as_secs_f64() * 1e6);
        }
        if start.elapsed() > GIVE_UP {
            return Err(Fail::Na(format!(
                "a change did not show within {GIVE_UP:?}"
            )));
        }
        // Not a busy loop: on a small machine it would starve the daemons.
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// The second mount, unmounted (and its mountpoint removed) on drop.
struct Second {
    mnt: std::path::PathBuf,
}

impl Drop for Second {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.mnt).status();
        let _ = std::fs::remove_dir(&self.mnt);
    }
}

pub fn run(s: &mut Step<'_>) -> anyhow::Result<()> {
    let (ctx, t) = (s.ctx, s.t);
    let n = ctx.sizes.t10_changes;
    let mut rows: Vec<_> = [CREATE_P50, CREATE_P99, XATTR_P50, XATTR_P99]
        .iter()
        .chain(WRITERS.iter().flatten())
        .map(|c| s.row(c, None, Unit::UsPerOp))
        .collect();
    let shared = t
        .safs
        .as_ref()
        .filter(|m| safs_control::is_shared(&m.volume));
    let Some(m) = shared else {
        for r in &mut rows {
            r.error = Some("n/a: one daemon per volume on this target".into());
        }
        s.done(rows);
        return Ok(());
    };
    std::fs::create_dir_all(s.dir)?;
    let second = Second {
        mnt: std::env::temp_dir().join(format!("safs-bench-t10-{}", std::process::id())),
    };
    std::fs::create_dir_all(&second.mnt)?;
    crate::target::mount_safs(
        ctx.safs_exe(),
        &crate::target::SafsMount {
            volume: m.volume.clone(),
            mountpoint: second.mnt.clone(),
            options: m.options.clone(),
            env: m.env.clone(),
            store: m.store,
        },
    )?;
    let rel = s.dir.strip_prefix(&t.dir).unwrap_or(Path::new(""));
    let there = second.mnt.join(rel);
    let (mut creates, mut xattrs) = (Vec::new(), Vec::new());
    let label = s.label(&format!("a change on one mount, seen on the other ×{n}"));
    let [c50, c99, x50, x99, writer_rows @ ..] = &mut rows[..] else {
        unreachable!("four rows and the writers'")
    };
    let ok = ctx.phase(t, c50, PhaseSpec::new(&label, n as u64, 1, false), |ctx| {
        let start = Instant::now();
        for i in 0..n {
            ctx.tick(i)?;
            let (here, far) = (s.dir.join(format!("f{i}")), there.join(format!("f{i}")));
            let at = Instant::now();
            std::fs::File::create(&here).map_err(|e| Fail::Na(format!("create: {e}")))?;
            creates.push(until(at, || far.exists())?);
            let value = format!("v{i}");
            let (h, f) = (cpath(&here), cpath(&far));
            let at = Instant::now();
            rustix::fs::setxattr(
                &h,
                "user.t10",
                value.as_bytes(),
                rustix::fs::XattrFlags::empty(),
            )
            .map_err(|e| Fail::Na(format!("setxattr: {e}")))?;
            let mut buf = [0u8; 32];
            xattrs.push(until(at, || {
                rustix::fs::getxattr(&f, "user.t10", &mut buf)
                    .is_ok_and(|len| &buf[..len] == value.as_bytes())
            })?);
        }
        creates.sort_by(f64::total_cmp);
        xattrs.sort_by(f64::total_cmp);
        Ok(Timed {
            value: Some(percentile(&creates, 50.0)),
            ..Timed::of(start.elapsed())
        })
    })?;
    if ok {
        for (row, xs, p) in [
            (&mut *c99, &creates, 99.0),
            (&mut *x50, &xattrs, 50.0),
            (&mut *x99, &xattrs, 99.0),
        ] {
            row.ops = n as u64;
            let mut rep = c50.reps[0].clone();
            rep.value = percentile(xs, p);
            rep.requests = None;
            rep.daemon_ns = None;
            rep.engine = None;
            row.reps.push(rep);
        }
    } else {
        let why = c50.error.clone();
        for r in [c99, x50, x99] {
            r.error = why.clone();
        }
    }
    // Each set of writers in directories of its own, made through the
    // mount that writes there.
    let files = ctx.sizes.t10_changes * 4;
    let sets: [Vec<PathBuf>; 3] = [
        vec![s.dir.join("w1")],
        vec![s.dir.join("w2a"), s.dir.join("w2b")],
        vec![s.dir.join("m2a"), there.join("m2b")],
    ];
    for set in &sets {
        for d in set {
            std::fs::create_dir_all(d)?;
        }
    }
    for (op, names) in WRITERS.iter().enumerate() {
        for (w, name) in names.iter().enumerate() {
            let row = &mut writer_rows[op * 3 + w];
            let dirs = &sets[w];
            let label = s.label(&format!("{name} ×{files}"));
            ctx.phase(
                t,
                row,
                PhaseSpec::new(&label, files as u64, 1, false),
                |_| {
                    let start = Instant::now();
                    let each = files / dirs.len();
                    let results: Vec<std::io::Result<()>> = std::thread::scope(|sc| {
                        let hs: Vec<_> = dirs
                            .iter()
                            .map(|d| sc.spawn(move || writer(op, d, each)))
                            .collect();
                        hs.into_iter()
                            .map(|h| h.join().expect("writer thread"))
                            .collect()
                    });
                    for r in results {
                        r.map_err(|e| Fail::Na(format!("{name}: {e}")))?;
                    }
                    Ok(Timed::of(start.elapsed()))
                },
            )?;
        }
    }
    drop(second);
    s.done(rows);
    Ok(())
}

/// One writer's part: `n` creates of `f<i>` in `d` (op 0), setxattrs on
/// them (1), or renames of `f<i>` to `g<i>` (2).
fn writer(op: usize, d: &Path, n: usize) -> std::io::Result<()> {
    for i in 0..n {
        let f = d.join(format!("f{i}"));
        match op {
            0 => drop(std::fs::File::create(&f)?),
            1 => rustix::fs::setxattr(
                cpath(&f),
                "user.t10",
                b"writer",
                rustix::fs::XattrFlags::empty(),
            )?,
            _ => std::fs::rename(&f, d.join(format!("g{i}")))?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn percentiles_are_nearest_ranks() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&xs, 50.0), 50.0);
        assert_eq!(percentile(&xs, 99.0), 99.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
    }
}
