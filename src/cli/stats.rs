//! `safs stats <mountpoint>`: a live view of a running daemon, refreshed
//! every interval — requests per second and their mean handler time per
//! operation, engine reads and commits per second, commit health, caches
//! and memory (like `juicefs stats`). On a terminal each frame replaces
//! the last; otherwise frames follow one another. It ends on Ctrl-C, after
//! `--count` frames, or when the mount goes away (saying so, exit 0).

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use safs_control::StatsReply;

#[derive(Args, Debug)]
pub struct StatsArgs {
    /// The mountpoint (or volume directory) of a mounted safs.
    pub path: PathBuf,
    /// Seconds between frames.
    #[arg(long, default_value_t = 1.0, value_parser = interval)]
    pub interval: f64,
    /// Stop after this many frames (default: until Ctrl-C or the mount goes).
    #[arg(long)]
    pub count: Option<u64>,
}

fn interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.05..=3600.0).contains(&v) => Ok(v),
        _ => Err("the interval is a number of seconds from 0.05 to 3600".into()),
    }
}

pub fn run(a: StatsArgs) -> anyhow::Result<()> {
    let (vol, mountpoint) = super::info::resolve(&a.path)?;
    let sock = super::info::daemon_socket(&vol, mountpoint.as_deref())?;
    let name = mountpoint.unwrap_or(vol).display().to_string();
    let mut last = safs::control::request_at(&sock, "stats")
        .with_context(|| format!("{name} is not mounted (no daemon to ask)"))?
        .unwrap_or_default();
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    let tty = std::io::stdout().is_terminal();
    let mut at = Instant::now();
    let mut frames = 0u64;
    let pause = Duration::from_secs_f64(a.interval);
    while a.count.is_none_or(|c| frames < c) {
        // Sleep in slices so that Ctrl-C ends the view at once.
        let until = Instant::now() + pause;
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep((until - Instant::now()).min(Duration::from_millis(50)));
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let now = match safs::control::request_at(&sock, "stats") {
            Ok(s) => s.unwrap_or_default(),
            Err(_) => {
                println!("{name}: the mount went away");
                return Ok(());
            }
        };
        let secs = at.elapsed().as_secs_f64();
        at = Instant::now();
        let text = frame(&name, &last, &now, secs);
        let mut out = std::io::stdout().lock();
        if tty {
            // Home and clear: the frame replaces the last one.
            write!(out, "\x1b[H\x1b[2J{text}")?;
        } else {
            writeln!(out, "{text}")?;
        }
        out.flush()?;
        last = now;
        frames += 1;
    }
    Ok(())
}

/// One frame: what changed from `old` to `new` over `secs` seconds.
fn frame(name: &str, old: &StatsReply, new: &StatsReply, secs: f64) -> String {
    let before: HashMap<&str, (u64, u64)> = old
        .ops
        .iter()
        .map(|o| (o.op.as_str(), (o.count, o.total_ns)))
        .collect();
    let mut rows: Vec<(&str, f64, f64)> = new
        .ops
        .iter()
        .filter_map(|o| {
            let (c0, t0) = before.get(o.op.as_str()).copied().unwrap_or((0, 0));
            let n = o.count.saturating_sub(c0);
            (n > 0).then(|| {
                let mean_us = o.total_ns.saturating_sub(t0) as f64 / n as f64 / 1e3;
                (o.op.as_str(), n as f64 / secs, mean_us)
            })
        })
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    let per_s = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
    let mut t = format!(
        "safs stats: {name} (daemon {}), every {secs:.1} s\n\n{:<14}{:>12}{:>14}\n",
        new.pid, "operation", "requests/s", "mean µs"
    );
    if rows.is_empty() {
        t.push_str("(no requests)\n");
    }
    for (op, rate, mean) in rows {
        t.push_str(&format!("{op:<14}{rate:>12.1}{mean:>14.1}\n"));
    }
    t.push_str(&format!(
        "\nengine: {:.1} point reads/s, {:.1} scans/s, {:.1} commits/s\n",
        per_s(old.engine.gets, new.engine.gets),
        per_s(old.engine.scans, new.engine.scans),
        per_s(old.engine.commits, new.engine.commits),
    ));
    if let Some(h) = &new.commits {
        t.push_str(&format!(
            "commits: {}, {} records waiting, {} MiB held\n",
            h.failure
                .as_deref()
                .map_or("healthy".to_string(), |f| format!(
                    "FAILING for {} s ({f})",
                    h.failing_for_s
                )),
            h.waiting_records,
            h.held_bytes >> 20
        ));
    }
    let ratio = |h0: u64, h1: u64, m0: u64, m1: u64| {
        super::info::ratio(h1.saturating_sub(h0), m1.saturating_sub(m0))
    };
    t.push_str(&format!(
        "inode cache: {} inodes, {} of {} MiB, {} of loads answered; \
         directory cache: {} directories, {} MiB, {} of lookups answered\n\
         memory: {} MiB anonymous, {} MiB peak resident\n",
        new.cached_inodes,
        new.cache_bytes >> 20,
        new.cache_budget_bytes >> 20,
        ratio(
            old.inode_cache_hits,
            new.inode_cache_hits,
            old.inode_cache_misses,
            new.inode_cache_misses
        ),
        new.dircache_dirs,
        new.dircache_bytes >> 20,
        ratio(
            old.dircache_hits,
            new.dircache_hits,
            old.dircache_misses,
            new.dircache_misses
        ),
        new.rss_anon_kib / 1024,
        new.peak_rss_kib / 1024
    ));
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use safs_control::OpReport;

    fn op(name: &str, count: u64, total_ns: u64) -> OpReport {
        OpReport {
            op: name.into(),
            count,
            total_ns,
            hist: Vec::new(),
        }
    }

    #[test]
    fn a_frame_shows_rates_and_means_of_the_interval_busiest_first() {
        let old = StatsReply {
            ops: vec![op("lookup", 100, 1_000_000), op("getxattr", 10, 50_000)],
            ..StatsReply::default()
        };
        let new = StatsReply {
            ops: vec![
                op("lookup", 120, 1_400_000),
                op("getxattr", 210, 450_000),
                op("mkdir", 0, 0),
            ],
            ..StatsReply::default()
        };
        let f = frame("/mnt", &old, &new, 2.0);
        let lines: Vec<&str> = f.lines().collect();
        let getxattr = lines
            .iter()
            .position(|l| l.starts_with("getxattr"))
            .unwrap();
        let lookup = lines.iter().position(|l| l.starts_with("lookup")).unwrap();
        assert!(getxattr < lookup, "{f}");
        // 200 requests in 2 s, 400 µs over 200: 2 µs each.
        assert!(
            lines[getxattr].contains("100.0") && lines[getxattr].contains("2.0"),
            "{f}"
        );
        assert!(
            lines[lookup].contains("10.0") && lines[lookup].contains("20.0"),
            "{f}"
        );
        assert!(!f.contains("mkdir"), "{f}");
    }
}
