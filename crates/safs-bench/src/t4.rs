//! T4 — LWN "Which filesystem for Samba4?": Debian's dbench 4 (a Samba
//! file server's system calls replayed from `client.txt`), without and
//! with xattrs (`-x`: DOS attributes in `user.DosAttrib`), and the ratio.
//!
//! `dbench -D <dir> -t <secs> -c <loadfile> [-x] <clients>`, its stdout
//! captured and parsed for the final `Throughput … MB/sec` line and the
//! operation table (whose total is the divisor of requests per operation).
//! Ctrl-C kills it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::ops;
use super::record::{Rep, Unit};
use super::setup::find_program;
use super::{Ctx, Fail, PhaseSpec, Step, Timed};

/// Where Debian (and a source install) keep the client loadfile.
const LOADFILES: [&str; 3] = [
    "/usr/share/dbench/client.txt",
    "/usr/local/share/dbench/client.txt",
    "/usr/local/share/client.txt",
];

/// What one dbench run reported.
#[derive(Clone, Debug, PartialEq)]
pub struct DbenchSummary {
    pub mb_per_sec: f64,
    pub clients: u32,
    pub max_latency_ms: Option<f64>,
    /// The operation table: (name, count).
    pub ops: Vec<(String, u64)>,
}

impl DbenchSummary {
    pub fn total_ops(&self) -> u64 {
        self.ops.iter().map(|(_, n)| n).sum()
    }
}

/// Parses dbench 4's output: the last `Throughput X MB/sec N clients …`
/// line and the `Operation Count AvgLat MaxLat` table before it.
pub fn parse_dbench(out: &str) -> Option<DbenchSummary> {
    let line = out
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with("Throughput "))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let mb_per_sec: f64 = words.get(1)?.parse().ok()?;
    if words.get(2) != Some(&"MB/sec") {
        return None;
    }
    let clients = words
        .windows(2)
        .find(|w| w[1] == "clients")
        .and_then(|w| w[0].parse().ok())
        .unwrap_or(0);
    let max_latency_ms = words
        .iter()
        .find_map(|w| w.strip_prefix("max_latency="))
        .and_then(|v| v.parse().ok());
    let mut ops = Vec::new();
    let mut in_table = false;
    for l in out.lines() {
        let l = l.trim();
        if l.starts_with("Operation") && l.contains("Count") {
            in_table = true;
            ops.clear();
            continue;
        }
        if !in_table || l.starts_with("---") {
            continue;
        }
        let f: Vec<&str> = l.split_whitespace().collect();
        match (
            f.len(),
            f.first(),
            f.get(1).and_then(|c| c.parse::<u64>().ok()),
        ) {
            (4, Some(name), Some(count)) => ops.push(((*name).to_string(), count)),
            _ if l.is_empty() => {}
            _ => in_table = false,
        }
    }
    Some(DbenchSummary {
        mb_per_sec,
        clients,
        max_latency_ms,
        ops,
    })
}

fn loadfile() -> Option<PathBuf> {
    LOADFILES.iter().map(PathBuf::from).find(|p| p.is_file())
}

/// One dbench run; `Na` if it fails or prints no throughput.
fn dbench(ctx: &Ctx<'_>, dir: &Path, xattr: bool) -> Result<(Timed, DbenchSummary), Fail> {
    let exe = find_program("dbench").ok_or_else(|| Fail::Na("dbench is not installed".into()))?;
    let load = loadfile().ok_or_else(|| {
        Fail::Na(format!(
            "no dbench loadfile (looked for {})",
            LOADFILES.join(", ")
        ))
    })?;
    ops::mkdirs(dir)?;
    let s = ctx.sizes;
    let mut cmd = Command::new(exe);
    cmd.arg("-D")
        .arg(dir)
        .arg("-t")
        .arg(s.t4_seconds.to_string())
        .arg("-c")
        .arg(&load);
    if xattr {
        cmd.arg("-x");
    }
    cmd.arg(s.t4_clients.to_string());
    // dbench writes its log in its working directory's clients/ tree via -D;
    // run it from the target so nothing lands elsewhere.
    cmd.current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| Fail::Abort(anyhow::anyhow!("cannot start dbench: {e}")))?;
    // Drain the pipes on threads so dbench never blocks on a full pipe.
    let mut so = child.stdout.take().expect("piped");
    let mut se = child.stderr.take().expect("piped");
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut so, &mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut se, &mut s);
        s
    });
    let total = u64::from(s.t4_seconds) + 1;
    let status = loop {
        if let Ok(Some(st)) = child.try_wait() {
            break st;
        }
        if ctx.stopped() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Fail::Abort(anyhow::anyhow!("interrupted")));
        }
        ctx.progress.set(start.elapsed().as_secs().min(total));
        std::thread::sleep(Duration::from_millis(100));
    };
    let elapsed = start.elapsed();
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    let summary = parse_dbench(&stdout);
    match summary {
        Some(sum) if status.success() => Ok((
            Timed {
                elapsed,
                sd_us: None,
                value: Some(sum.mb_per_sec),
            },
            sum,
        )),
        _ => {
            let tail: Vec<&str> = stdout.lines().chain(stderr.lines()).rev().take(3).collect();
            Err(Fail::Na(format!(
                "dbench {} ({status}): {}",
                if xattr { "-x failed" } else { "failed" },
                tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
            )))
        }
    }
}

pub fn run(s: &mut Step<'_>) -> anyhow::Result<()> {
    let (ctx, t) = (s.ctx, s.t);
    let mut figures = Vec::new();
    for (case, xattr) in [("no xattr", false), ("xattr (-x)", true)] {
        let mut m = s.row(case, None, Unit::MbPerSec);
        let mut ops_total = 0;
        let l = s.label(&format!(
            "dbench {} clients {} s{}",
            ctx.sizes.t4_clients,
            ctx.sizes.t4_seconds,
            if xattr { " -x" } else { "" }
        ));
        let run_dir = s.dir.join(if xattr { "x" } else { "plain" });
        let secs = u64::from(ctx.sizes.t4_seconds) + 1;
        ctx.phase(t, &mut m, PhaseSpec::new(&l, secs, 1, false), |ctx| {
            let (timed, sum) = dbench(ctx, &run_dir, xattr)?;
            ops_total = sum.total_ops();
            Ok(timed)
        })?;
        // Requests per dbench operation, not per second.
        m.ops = ops_total.max(1);
        m.note = Some(format!("ops = dbench operations ({ops_total})"));
        figures.push(m.best());
        s.done([m]);
        ops::remove_tree(ctx, &run_dir);
    }
    let mut ratio = s.row("xattr / no xattr", None, Unit::Ratio);
    match (figures[0], figures[1]) {
        (Some(a), Some(b)) if a > 0.0 => {
            ratio.ops = 1;
            ratio.reps.push(Rep {
                secs: 0.0,
                value: b / a,
                sd: None,
                requests: None,
                daemon_ns: None,
                engine: None,
                daemon_mem: None,
            });
        }
        _ => ratio.error = Some("a dbench run failed".into()),
    }
    s.done([ratio]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "\
dbench version 4.00 - Copyright Andrew Tridgell 1999-2004

Running for 3 seconds with load '/usr/share/dbench/client.txt' and minimum warmup 0 secs
failed to create barrier semaphore 
2 of 2 processes prepared for launch   0 sec
releasing clients
   2     62018   702.51 MB/sec  execute   1 sec  latency 7.570 ms
   2    132708   731.90 MB/sec  execute   2 sec  latency 4.368 ms
   0  cleanup   3 sec

 Operation      Count    AvgLat    MaxLat
 ----------------------------------------
 NTCreateX      70089     0.019     2.717
 Close          51502     0.001     0.585
 Flush           4911     0.395     7.559

Throughput 731.901 MB/sec  2 clients  2 procs  max_latency=7.570 ms
";

    #[test]
    fn parses_throughput_and_ops() {
        let s = parse_dbench(OUT).unwrap();
        assert!((s.mb_per_sec - 731.901).abs() < 1e-9);
        assert_eq!(s.clients, 2);
        assert_eq!(s.max_latency_ms, Some(7.570));
        assert_eq!(s.ops.len(), 3);
        assert_eq!(s.total_ops(), 70089 + 51502 + 4911);
    }

    #[test]
    fn no_throughput_line_is_none() {
        assert!(parse_dbench("dbench version 4.00\nERROR: child failed\n").is_none());
        assert!(parse_dbench("Throughput abc MB/sec").is_none());
    }
}
