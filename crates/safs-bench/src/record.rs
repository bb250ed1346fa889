//! What a run records: every repetition of every phase, with the FUSE
//! requests it cost on safs targets, and the machine it ran on. Serialized
//! whole into `results.json`; `report` and `svg` read only this.

use std::collections::BTreeMap;

use serde::Serialize;

use super::config::{Scale, Sizes, Test};

/// The unit a measurement's values are in; says which way is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Unit {
    /// Microseconds per operation (per file, per call, per read).
    #[serde(rename = "us/op")]
    UsPerOp,
    /// Seconds for the whole phase.
    #[serde(rename = "s")]
    Seconds,
    /// Throughput (10^6 bytes per second).
    #[serde(rename = "MB/s")]
    MbPerSec,
    /// Operations per second.
    #[serde(rename = "IOPS")]
    Iops,
    /// A ratio of two figures of the same target.
    #[serde(rename = "ratio")]
    Ratio,
}

impl Unit {
    pub fn higher_is_better(self) -> bool {
        matches!(self, Unit::MbPerSec | Unit::Iops | Unit::Ratio)
    }

    pub fn label(self) -> &'static str {
        match self {
            Unit::UsPerOp => "µs/op",
            Unit::Seconds => "s",
            Unit::MbPerSec => "MB/s",
            Unit::Iops => "IOPS",
            Unit::Ratio => "ratio",
        }
    }
}

/// FUSE requests by opcode name (a difference of two daemon snapshots).
pub type Requests = BTreeMap<String, u64>;

/// One repetition of a phase.
#[derive(Clone, Debug, Serialize)]
pub struct Rep {
    /// Wall time of the timed loop.
    pub secs: f64,
    /// The figure in the measurement's unit.
    pub value: f64,
    /// Standard deviation of the per-operation times, where each was timed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sd: Option<f64>,
    /// FUSE requests the daemon served during the loop (safs targets).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<Requests>,
    /// Nanoseconds the daemon spent serving those requests, by opcode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daemon_ns: Option<Requests>,
    /// Metadata engine operations during the loop: `get` (point reads),
    /// `scan`, `commit`. Reads are what a cold phase pays beyond the round
    /// trips; a hot phase should show none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<Requests>,
    /// The safs daemon's memory at the end of the loop.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daemon_mem: Option<DaemonMem>,
}

/// The safs daemon's memory as its control socket reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DaemonMem {
    /// Peak resident set (VmHWM) of the daemon serving the loop, KiB. Cold
    /// phases restart the daemon, so this is per daemon, not per run. It
    /// includes the engine's memory-mapped pages (reclaimable page cache).
    pub peak_rss_kib: u64,
    /// Anonymous resident memory (RssAnon), KiB: heap and caches.
    pub rss_anon_kib: u64,
    /// Bytes held by the inode cache, and its configured bound.
    pub cache_bytes: u64,
    pub cache_budget_bytes: u64,
}

impl DaemonMem {
    /// The larger of each figure.
    pub fn max(self, o: DaemonMem) -> DaemonMem {
        DaemonMem {
            peak_rss_kib: self.peak_rss_kib.max(o.peak_rss_kib),
            rss_anon_kib: self.rss_anon_kib.max(o.rss_anon_kib),
            cache_bytes: self.cache_bytes.max(o.cache_bytes),
            cache_budget_bytes: self.cache_budget_bytes.max(o.cache_budget_bytes),
        }
    }
}

/// One phase of one test on one target: a table cell.
#[derive(Clone, Debug, Serialize)]
pub struct Measurement {
    pub test: Test,
    pub target: String,
    /// What was done: "set", "get hot", "du cold", …
    pub case: String,
    /// The swept parameter (value size, N, chunk size), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub param: Option<u64>,
    pub unit: Unit,
    /// Operations per repetition (files, calls, reads, entries).
    pub ops: u64,
    pub reps: Vec<Rep>,
    /// Set when the phase could not run to the end: the figure is "n/a".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The kept figure and its requests per operation, filled in by
    /// [`Measurement::summarize`] for readers of results.json.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_requests_per_op: Option<BTreeMap<String, f64>>,
    /// Mean µs the daemon spent per request, by opcode, in the kept
    /// repetition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_daemon_us_per_request: Option<BTreeMap<String, f64>>,
    /// Engine operations per operation in the kept repetition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_engine_per_op: Option<BTreeMap<String, f64>>,
}

impl Measurement {
    pub fn new(test: Test, target: &str, case: &str, param: Option<u64>, unit: Unit) -> Self {
        Measurement {
            test,
            target: target.to_string(),
            case: case.to_string(),
            param,
            unit,
            ops: 0,
            reps: Vec::new(),
            error: None,
            note: None,
            best: None,
            best_requests_per_op: None,
            best_daemon_us_per_request: None,
            best_engine_per_op: None,
        }
    }

    /// Fills in `best` and `best_requests_per_op` from the repetitions.
    pub fn summarize(&mut self) {
        self.best = self.best();
        self.best_requests_per_op = self.requests_per_op();
        self.best_daemon_us_per_request = self.daemon_us_per_request();
        self.best_engine_per_op = self.engine_per_op();
    }

    /// Engine reads (point reads and scans) per operation, kept repetition.
    pub fn engine_reads_per_op(&self) -> Option<f64> {
        let e = self.engine_per_op()?;
        Some(e.get("get").copied().unwrap_or(0.0) + e.get("scan").copied().unwrap_or(0.0))
    }

    /// Engine operations per operation in the kept repetition.
    pub fn engine_per_op(&self) -> Option<BTreeMap<String, f64>> {
        let e = self.best_rep()?.engine.as_ref()?;
        let ops = self.ops.max(1) as f64;
        Some(
            e.iter()
                .map(|(k, n)| (k.clone(), *n as f64 / ops))
                .collect(),
        )
    }

    /// The daemon's µs per operation (all opcodes), in the kept repetition.
    pub fn daemon_us_per_op(&self) -> Option<f64> {
        let ns: u64 = self.best_rep()?.daemon_ns.as_ref()?.values().sum();
        Some(ns as f64 / self.ops.max(1) as f64 / 1000.0)
    }

    /// Mean daemon time per request, by opcode, in the kept repetition.
    pub fn daemon_us_per_request(&self) -> Option<BTreeMap<String, f64>> {
        let rep = self.best_rep()?;
        let (req, ns) = (rep.requests.as_ref()?, rep.daemon_ns.as_ref()?);
        Some(
            req.iter()
                .filter(|(_, n)| **n > 0)
                .map(|(k, n)| {
                    let total = ns.get(k).copied().unwrap_or(0);
                    (k.clone(), total as f64 / *n as f64 / 1000.0)
                })
                .collect(),
        )
    }

    /// The repetition kept: the fastest (or highest throughput).
    pub fn best_rep(&self) -> Option<&Rep> {
        if self.error.is_some() {
            return None;
        }
        let better = |a: &Rep, b: &Rep| {
            if self.unit.higher_is_better() {
                a.value > b.value
            } else {
                a.value < b.value
            }
        };
        self.reps
            .iter()
            .fold(None, |best: Option<&Rep>, r| match best {
                Some(b) if !better(r, b) => Some(b),
                _ => Some(r),
            })
    }

    pub fn best(&self) -> Option<f64> {
        // Not the `best` field: that is only a copy for results.json.
        self.best_rep().map(|r| r.value)
    }

    /// FUSE requests per operation in the kept repetition.
    pub fn requests_per_op(&self) -> Option<BTreeMap<String, f64>> {
        let rep = self.best_rep()?;
        let req = rep.requests.as_ref()?;
        let ops = self.ops.max(1) as f64;
        Some(
            req.iter()
                .filter(|(_, n)| **n > 0)
                .map(|(k, n)| (k.clone(), *n as f64 / ops))
                .collect(),
        )
    }
}

/// `after - before` per opcode, dropping opcodes that did not move.
pub fn request_delta(before: &Requests, after: &Requests) -> Requests {
    after
        .iter()
        .filter_map(|(op, n)| {
            let d = n.saturating_sub(before.get(op).copied().unwrap_or(0));
            (d > 0).then(|| (op.clone(), d))
        })
        .collect()
}

/// Mean and (population) standard deviation.
pub fn mean_sd(xs: &[f64]) -> (f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// How one target was measured.
#[derive(Clone, Debug, Serialize)]
pub struct TargetInfo {
    pub label: String,
    pub dir: String,
    pub fstype: String,
    pub mount_source: String,
    /// The filesystem's options as the kernel shows them (super options in
    /// `/proc/self/mountinfo`): for a FUSE target, whether the kernel
    /// checks permissions (`default_permissions`) — a FUSE peer that does
    /// is asked for its parent's attributes after every change, as safs is.
    pub mount_options: String,
    /// What `--setup` made it as ("encrypted volume, dircache=0").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub about: Option<String>,
    /// safs targets: the volume directory whose daemon was asked for stats.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub safs_volume: Option<String>,
    /// safs targets: the volume's inline xattr budget, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inline_bytes: Option<u64>,
    /// safs targets: the directory cache's bound as the daemon reports it
    /// at the end of the run (0: off) — what `dircache=` really did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dircache_budget_bytes: Option<u64>,
    /// safs targets: the FUSE transport the daemon serves at the end of the
    /// run ("io_uring, 2 queues" or "/dev/fuse").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
    /// How cold phases were made cold on this target.
    pub cold: String,
    /// Cold phases prepared on this target, and the seconds that took.
    pub cold_count: u32,
    pub cold_secs: f64,
}

/// A target the run was to measure but could not make (gocryptfs not
/// installable): reported, not silently dropped.
#[derive(Clone, Debug, Serialize)]
pub struct Skipped {
    pub label: String,
    pub reason: String,
}

/// Wall time of one test on one target, preparation and cold phases included.
#[derive(Clone, Debug, Serialize)]
pub struct StepTime {
    pub test: Test,
    pub target: String,
    pub secs: f64,
    /// Waited before the test for the target's queued object deletions
    /// (see `Target::settle_deletions`); not in `secs`.
    pub settle_secs: f64,
}

/// The machine and the moment.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Machine {
    pub hostname: String,
    pub kernel: String,
    pub cpu_model: String,
    pub cpus: usize,
    pub mem_total_kib: u64,
    /// How idle CPUs wait (the cpuidle driver and governor, and for
    /// `haltpoll` how long they poll before halting): on a VM it decides
    /// what waking an idle CPU costs, which every FUSE round trip that
    /// moves between CPUs pays.
    pub cpu_idle: String,
    /// `/proc/loadavg`'s 1, 5 and 15 minute figures.
    pub load_before: [f64; 3],
    pub load_after: [f64; 3],
}

#[derive(Clone, Debug, Serialize)]
pub struct Results {
    pub safs_version: String,
    pub command: Vec<String>,
    pub scale: Scale,
    pub sizes: Sizes,
    pub baseline: String,
    pub reps: usize,
    /// Seconds since the epoch when the run started.
    pub started_unix: u64,
    pub wall_secs: f64,
    pub machine: Machine,
    pub targets: Vec<TargetInfo>,
    /// Targets of `--setup` that could not be made, and why.
    pub skipped: Vec<Skipped>,
    pub tests: Vec<Test>,
    pub steps: Vec<StepTime>,
    pub measurements: Vec<Measurement>,
    /// Things that did not go as planned but did not stop the run.
    pub warnings: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rep(value: f64) -> Rep {
        Rep {
            secs: value,
            value,
            sd: None,
            requests: None,
            daemon_ns: None,
            engine: None,
            daemon_mem: None,
        }
    }

    #[test]
    fn best_is_min_or_max_by_unit() {
        let mut m = Measurement::new(Test::T1, "x", "get hot", Some(1), Unit::UsPerOp);
        m.reps = vec![rep(3.0), rep(1.5), rep(2.0)];
        assert_eq!(m.best(), Some(1.5));
        m.unit = Unit::MbPerSec;
        assert_eq!(m.best(), Some(3.0));
        m.error = Some("E2BIG".into());
        assert_eq!(m.best(), None);
    }

    #[test]
    fn requests_are_per_op_of_the_kept_rep() {
        let mut m = Measurement::new(Test::T1, "safs", "get hot", Some(1), Unit::UsPerOp);
        m.ops = 100;
        let mut slow = rep(5.0);
        slow.daemon_ns = Some([("getxattr".to_string(), 999)].into());
        slow.requests = Some([("getxattr".to_string(), 300)].into());
        let mut fast = rep(1.0);
        fast.requests = Some([("getxattr".to_string(), 100), ("lookup".to_string(), 0)].into());
        fast.daemon_ns = Some([("getxattr".to_string(), 250_000)].into());
        m.reps = vec![slow, fast];
        let r = m.requests_per_op().unwrap();
        assert_eq!(r.len(), 1);
        assert!((r["getxattr"] - 1.0).abs() < 1e-9);
        // 250 µs over 100 requests: 2.5 µs each.
        let d = m.daemon_us_per_request().unwrap();
        assert!((d["getxattr"] - 2.5).abs() < 1e-9);
    }

    #[test]
    fn delta_and_stats() {
        let before: Requests = [("getattr".into(), 5), ("lookup".into(), 2)].into();
        let after: Requests = [
            ("getattr".into(), 5),
            ("lookup".into(), 7),
            ("create".into(), 3),
        ]
        .into();
        let d = request_delta(&before, &after);
        assert_eq!(d, [("create".into(), 3), ("lookup".into(), 5)].into());
        let (m, sd) = mean_sd(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert!((m - 5.0).abs() < 1e-9 && (sd - 2.0).abs() < 1e-9);
    }
}
