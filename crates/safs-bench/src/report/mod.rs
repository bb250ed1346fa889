//! results.md and the charts, computed from [`Results`] alone (pure).
//!
//! Each table row is one (case, parameter) of a test; each target a column
//! with its best figure and, when a baseline is set, the ratio to the
//! baseline's figure in the same row (`value ÷ baseline`: above 1 is slower
//! for µs and s, faster for MB/s). Every safs target adds a column of FUSE
//! requests per operation. After the tables, the targets of docs/benchmarks.md
//! are checked one by one for every safs target.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::config::Test;
use super::record::{DaemonMem, Measurement, Results, Unit};
use super::svg::{Chart, DASHES, PALETTE, Series};

mod charts;
mod encrypted;
mod verdicts;

#[cfg(test)]
use charts::param_label;
pub use charts::{t1_chart, t5_chart};
pub use verdicts::{Check, Verdict, checks};
/// `value ÷ base`, when both exist and the base is positive.
pub fn ratio(value: Option<f64>, base: Option<f64>) -> Option<f64> {
    match (value, base) {
        (Some(v), Some(b)) if b > 0.0 && v.is_finite() => Some(v / b),
        _ => None,
    }
}

/// Three significant digits, no exponent.
pub fn fmt_value(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 0.01 {
        format!("{v:.3}")
    } else if a == 0.0 {
        "0".into()
    } else {
        format!("{v:.2e}")
    }
}

fn fmt_count(n: f64) -> String {
    if (n - n.round()).abs() < 0.005 {
        format!("{}", n.round() as i64)
    } else {
        format!("{n:.2}")
    }
}

/// Opcodes listed in a req/op cell; results.json has them all.
const MAX_OPCODES: usize = 8;

/// `3 (create 1, flush 1, release 1)`: the total, then each opcode, most
/// frequent first.
pub fn fmt_requests(per_op: &BTreeMap<String, f64>) -> String {
    let total: f64 = per_op.values().sum();
    let mut parts: Vec<(&String, &f64)> = per_op.iter().filter(|(_, n)| **n >= 0.005).collect();
    if parts.is_empty() {
        return fmt_count(total);
    }
    parts.sort_by(|a, b| b.1.total_cmp(a.1).then(a.0.cmp(b.0)));
    let mut list: Vec<String> = parts
        .iter()
        .take(MAX_OPCODES)
        .map(|(op, n)| format!("{op} {}", fmt_count(**n)))
        .collect();
    if parts.len() > MAX_OPCODES {
        list.push(format!("+{} more", parts.len() - MAX_OPCODES));
    }
    format!("{} ({})", fmt_count(total), list.join(", "))
}

fn total(per_op: &BTreeMap<String, f64>) -> f64 {
    per_op.values().sum()
}

/// Requests the kernel sends without waiting for the answer: RELEASE and
/// RELEASEDIR of a `fuse` (not `fuseblk`) mount are queued in the
/// background after close(2) returns, and FORGET has no answer at all. They
/// cost the daemon work but the application no round trip.
const BACKGROUND: &[&str] = &["release", "releasedir", "forget"];

/// Round trips the application waits for, per operation, and how the
/// requests split: `2 round trips (getxattr 1, open 1); background: release 1`.
fn round_trips(per_op: &BTreeMap<String, f64>) -> (f64, String) {
    let (bg, fg): (BTreeMap<String, f64>, BTreeMap<String, f64>) = per_op
        .iter()
        .map(|(k, v)| (k.clone(), *v))
        .partition(|(k, _)| BACKGROUND.contains(&k.as_str()));
    let n = total(&fg);
    let mut text = format!("{} round trips", fmt_requests(&fg));
    if total(&bg) >= 0.005 {
        let list: Vec<String> = bg
            .iter()
            .filter(|(_, v)| **v >= 0.005)
            .map(|(k, v)| format!("{k} {}", fmt_count(*v)))
            .collect();
        let _ = write!(text, "; background: {}", list.join(", "));
    }
    (n, text)
}

/// "ENOSPC" out of "ENOSPC: setxattr failed at 1 of 10000", else "n/a".
fn short_error(e: &str) -> String {
    let head = e.split(':').next().unwrap_or("");
    if head.len() > 1
        && head.starts_with('E')
        && head
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
    {
        format!("n/a ({head})")
    } else {
        "n/a".into()
    }
}

fn param_header(test: Test) -> Option<&'static str> {
    match test {
        Test::T1 => Some("N (bytes)"),
        Test::T3 => Some("C (bytes)"),
        Test::T5 | Test::T8 => Some("N (files)"),
        Test::T11 => Some("K (xattrs)"),
        Test::T12 => Some("threads"),
        _ => None,
    }
}

/// The measurements of one test, indexed by (case, param) and target.
struct Table<'r> {
    rows: Vec<(String, Option<u64>)>,
    cells: BTreeMap<(String, Option<u64>, String), &'r Measurement>,
}

fn table(r: &Results, test: Test) -> Table<'_> {
    let mut rows = Vec::new();
    let mut cells = BTreeMap::new();
    for m in r.measurements.iter().filter(|m| m.test == test) {
        let key = (m.case.clone(), m.param);
        if !rows.contains(&key) {
            rows.push(key);
        }
        cells.insert((m.case.clone(), m.param, m.target.clone()), m);
    }
    Table { rows, cells }
}

impl<'r> Table<'r> {
    fn get(&self, case: &str, param: Option<u64>, target: &str) -> Option<&'r Measurement> {
        self.cells
            .get(&(case.to_string(), param, target.to_string()))
            .copied()
    }

    fn best(&self, case: &str, param: Option<u64>, target: &str) -> Option<f64> {
        self.get(case, param, target).and_then(Measurement::best)
    }

    /// Params of `case`, in row order.
    fn params(&self, case: &str) -> Vec<Option<u64>> {
        self.rows
            .iter()
            .filter(|(c, _)| c == case)
            .map(|(_, p)| *p)
            .collect()
    }
}

fn cell(m: Option<&Measurement>, base: Option<f64>, is_base: bool) -> String {
    let Some(m) = m else { return "—".into() };
    if let Some(e) = &m.error {
        return short_error(e);
    }
    let Some(rep) = m.best_rep() else {
        return "—".into();
    };
    let mut s = fmt_value(rep.value);
    if let Some(sd) = rep.sd {
        let _ = write!(s, " ±{}", fmt_value(sd));
    }
    if !is_base
        && m.unit != Unit::Ratio
        && let Some(q) = ratio(Some(rep.value), base)
    {
        let _ = write!(s, " ({q:.2}×)");
    }
    s
}

/// The whole results.md.
pub fn markdown(r: &Results) -> String {
    let mut s = String::new();
    let labels: Vec<&str> = r.targets.iter().map(|t| t.label.as_str()).collect();
    let safs: Vec<&str> = r
        .targets
        .iter()
        .filter(|t| t.safs_volume.is_some())
        .map(|t| t.label.as_str())
        .collect();
    let has_base = labels.contains(&r.baseline.as_str());
    // Targets held in RAM: nothing makes them cold.
    let in_ram: Vec<&str> = r
        .targets
        .iter()
        .filter(|t| t.fstype == "tmpfs" || t.fstype == "ramfs")
        .map(|t| t.label.as_str())
        .collect();
    let _ = writeln!(s, "# safs bench — scale {}\n", r.scale);
    let _ = writeln!(
        s,
        "- started: {} (UTC); wall time {:.0} s",
        super::config::timestamp_name(r.started_unix),
        r.wall_secs
    );
    let _ = writeln!(s, "- command: `{}`", r.command.join(" "));
    let m = &r.machine;
    let _ = writeln!(
        s,
        "- safs {}; kernel {}; {} × {}; {:.1} GiB RAM; host {}",
        r.safs_version,
        m.kernel,
        m.cpus,
        m.cpu_model,
        m.mem_total_kib as f64 / (1 << 20) as f64,
        m.hostname
    );
    if !m.cpu_idle.is_empty() {
        let _ = writeln!(s, "- idle CPUs: {}", m.cpu_idle);
    }
    let _ = writeln!(
        s,
        "- load average (1/5/15 min): before {:.2} {:.2} {:.2}, after {:.2} {:.2} {:.2}",
        m.load_before[0],
        m.load_before[1],
        m.load_before[2],
        m.load_after[0],
        m.load_after[1],
        m.load_after[2]
    );
    if has_base {
        let _ = writeln!(
            s,
            "- ratios: value ÷ **{}**'s value in the same row (µs, s: lower is better; MB/s: higher is better)",
            r.baseline
        );
    } else {
        let _ = writeln!(s, "- no ratios: baseline '{}' is not a target", r.baseline);
    }
    let _ = writeln!(
        s,
        "- read-only phases: best of {} repetitions (all of them in results.json); \
         n/a = the filesystem refused, with its errno",
        r.reps
    );
    if !safs.is_empty() {
        let _ = writeln!(
            s,
            "- `req/op`: FUSE requests the safs daemon served per operation, total (by opcode); \
             then `daemon`: wall time inside the daemon's handlers per operation, summed over all \
             its requests — the background RELEASE and FORGET and any wait inside a handler \
             included, and requests served in parallel by several threads each counted, so it \
             can exceed the operation's own time; then the metadata engine reads (point reads \
             and scans) per operation. Targets count round trips: requests the application waits \
             for, not the RELEASE and FORGET the kernel sends in the background"
        );
    }
    let _ = writeln!(
        s,
        "\n| target | directory | filesystem | mount options | cold phases | made cold | wall time per test |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for t in &r.targets {
        let dircache = t.dircache_budget_bytes.map(|b| match b {
            0 => "directory cache off".to_string(),
            b => format!(
                "directory cache ≤ {} MiB",
                fmt_value(b as f64 / f64::from(1 << 20))
            ),
        });
        let about: Vec<&str> = t
            .about
            .iter()
            .chain(&dircache)
            .chain(&t.transport)
            .map(String::as_str)
            .collect();
        let fs = if about.is_empty() {
            t.fstype.clone()
        } else {
            format!("{} ({})", t.fstype, about.join("; "))
        };
        let per_test: Vec<String> = r
            .steps
            .iter()
            .filter(|st| st.target == t.label)
            .map(|st| match st.settle_secs {
                w if w >= 0.5 => format!(
                    "{} {:.0} s (after {w:.0} s for queued object deletions)",
                    st.test, st.secs
                ),
                _ => format!("{} {:.0} s", st.test, st.secs),
            })
            .collect();
        let _ = writeln!(
            s,
            "| {} | `{}` | {} | `{}` | {} | {} times, {:.0} s | {} |",
            t.label,
            t.dir,
            fs,
            t.mount_options,
            t.cold,
            t.cold_count,
            t.cold_secs,
            per_test.join(", ")
        );
    }
    for k in &r.skipped {
        // apt-get's and gocryptfs' messages span lines.
        let reason = k.reason.replace('\n', " ").replace('|', "\\|");
        let _ = writeln!(s, "| {} | — | **skipped**: {reason} | | | |", k.label);
    }

    for &test in &r.tests {
        let tb = table(r, test);
        let _ = writeln!(s, "\n## {test} — {}\n", test.title());
        let _ = writeln!(s, "{}\n", sizes_line(test, &r.sizes));
        let ph = param_header(test);
        let mut head = vec!["case".to_string()];
        if let Some(p) = ph {
            head.push(p.into());
        }
        head.push("unit".into());
        head.extend(labels.iter().map(|l| (*l).to_string()));
        head.extend(safs.iter().map(|l| format!("{l} req/op")));
        let _ = writeln!(s, "| {} |", head.join(" | "));
        let _ = writeln!(s, "|{}", "---|".repeat(head.len()));
        let mut notes: Vec<String> = Vec::new();
        let mut ram_note = false;
        for (case, param) in &tb.rows {
            let base = tb.best(case, *param, &r.baseline);
            let unit = labels
                .iter()
                .find_map(|l| tb.get(case, *param, l))
                .map_or("", |m| m.unit.label());
            let mut row = vec![case.clone()];
            if ph.is_some() {
                row.push(param.map(|p| p.to_string()).unwrap_or_default());
            }
            row.push(unit.into());
            for l in &labels {
                let m = tb.get(case, *param, l);
                let mut c = cell(m, base, *l == r.baseline);
                if case.contains("cold")
                    && in_ram.contains(l)
                    && m.is_some_and(|m| m.error.is_none())
                {
                    c.push_str(" †");
                    ram_note = true;
                }
                row.push(c);
                // Phases skipped because an earlier one failed say so in
                // their cell ("n/a"); only the cause gets a note.
                if let Some(e) = m
                    .and_then(|m| m.error.as_ref())
                    .filter(|e| !e.starts_with("not run:"))
                {
                    notes.push(format!(
                        "{l}, {case}{}: {e}",
                        param.map(|p| format!(" {p}")).unwrap_or_default()
                    ));
                }
            }
            for l in &safs {
                let m = tb.get(case, *param, l);
                let mut c = m
                    .and_then(Measurement::requests_per_op)
                    .map(|q| fmt_requests(&q))
                    .unwrap_or_default();
                if let Some(us) = m.and_then(Measurement::daemon_us_per_op) {
                    let _ = write!(c, "; daemon {} µs", fmt_value(us));
                }
                if let Some(reads) = m.and_then(Measurement::engine_reads_per_op) {
                    let _ = write!(c, "; engine reads {}", fmt_count(reads));
                }
                row.push(c);
            }
            let _ = writeln!(s, "| {} |", row.join(" | "));
        }
        if matches!(test, Test::T5 | Test::T8) {
            for case in [
                "create",
                "ls -Al",
                crate::t5::LS_KERNEL_COLD,
                crate::t5::LS_PROGRAM,
                "remove",
            ] {
                let ps = tb.params(case);
                let (Some(Some(lo)), Some(Some(hi))) = (ps.first(), ps.last()) else {
                    continue;
                };
                let mut row = vec![format!("{case}: growth")];
                row.push(format!("{lo}→{hi}"));
                row.push("×".into());
                for l in &labels {
                    let g = ratio(tb.best(case, Some(*hi), l), tb.best(case, Some(*lo), l));
                    row.push(g.map_or("—".into(), |g| format!("{g:.2}")));
                }
                row.extend(safs.iter().map(|_| String::new()));
                let _ = writeln!(s, "| {} |", row.join(" | "));
            }
        }
        for l in &safs {
            if let Some(m) = daemon_mem(r, test, l) {
                let _ = writeln!(s, "\n{l} daemon memory: {}.", mem_line(&m));
            }
        }
        if ram_note {
            let _ = writeln!(
                s,
                "\n† in RAM (tmpfs): dropping caches cannot make it cold; its cold figure is a warm one."
            );
        }
        if !notes.is_empty() {
            let _ = writeln!(s, "\nn/a:");
            for n in notes {
                let _ = writeln!(s, "- {n}");
            }
        }
    }

    s.push_str(&encrypted::section(r));
    let checks = checks(r);
    if !checks.is_empty() {
        let _ = writeln!(s, "\n## Targets (docs/benchmarks.md)\n");
        let _ = writeln!(
            s,
            "Verdicts: met — the target holds in this run; **missed** — it does not; \
             — (a dash) — a figure shown for information, with nothing to hold it to.\n"
        );
        let _ = writeln!(s, "| target | what | measured | verdict |");
        let _ = writeln!(s, "|---|---|---|---|");
        for c in &checks {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} |",
                c.target,
                c.what,
                c.measured,
                c.verdict.text()
            );
        }
    }
    if !r.warnings.is_empty() {
        let _ = writeln!(s, "\n## Warnings\n");
        for w in &r.warnings {
            let _ = writeln!(s, "- {w}");
        }
    }
    s
}

/// The largest memory figures the daemon of safs target `label` reported
/// after any repetition of `test`.
fn daemon_mem(r: &Results, test: Test, label: &str) -> Option<DaemonMem> {
    r.measurements
        .iter()
        .filter(|m| m.test == test && m.target == label)
        .flat_map(|m| m.reps.iter().filter_map(|rep| rep.daemon_mem))
        .reduce(DaemonMem::max)
}

fn mib(kib: u64) -> String {
    fmt_value(kib as f64 / 1024.0)
}

/// One line on the daemon's memory during a test.
fn mem_line(m: &DaemonMem) -> String {
    format!(
        "{} MiB anonymous at most (heap and caches), peak resident {} MiB \
         (with the engine's memory-mapped pages); inode cache at most {} of its {} MiB bound",
        mib(m.rss_anon_kib),
        mib(m.peak_rss_kib),
        mib(m.cache_bytes / 1024),
        mib(m.cache_budget_bytes / 1024)
    )
}

/// The sizes a table ran at, under its heading.
fn sizes_line(test: Test, z: &crate::config::Sizes) -> String {
    match test {
        Test::T1 => format!("F = {} files per value size N.", z.t1_files),
        Test::T2 => format!(
            "{} fstat calls per repetition; a tree of {} entries.",
            z.t2_fstat_calls, z.t2_entries
        ),
        Test::T3 => format!(
            "{} objects with {} bytes of metadata each; {} hot reads per repetition, one read per object cold.",
            z.t3_files, z.t3_metadata_bytes, z.t3_reads
        ),
        Test::T4 => format!("{} clients, {} s per run.", z.t4_clients, z.t4_seconds),
        Test::T5 => "N files per directory, as in each row. `ls -Al (kernel caches cold)` is \
                     the same listing after sync and drop_caches — no remount: a FUSE daemon \
                     keeps its own caches, which then answer every name and attribute."
            .into(),
        Test::T6 => format!("{} files of 4 KiB.", z.t6_files),
        Test::T7 => format!("{} calls per repetition.", z.t7_calls),
        Test::T8 => "N files per directory, as in each row. `ls -Al` is the loop of T5 \
                     (readdir, then lstat of each entry), also with the kernel's caches dropped \
                     (not the daemon's); `ls -Al (coreutils)` is the program itself, per entry, \
                     with its process start and two xattr probes per entry."
            .into(),
        Test::T9 => format!(
            "One file of {} MiB: written in 1 MiB writes then fsync'd (timed together); read \
             back in 1 MiB reads after making the target cold; then {} reads of 4 KiB, each of \
             a different block in a fixed shuffled order, after making the target cold, with \
             the file's readahead off (POSIX_FADV_RANDOM): buffered reads that miss the page \
             cache, not O_DIRECT; what the filesystem does underneath (a FUSE daemon's reads \
             of its backing file, safs' passthrough) is part of the figure. Last, 20,000 \
             writes of 4 KiB appended to a new file (page cache, no fsync), µs per write. \
             MB/s are 10^6 bytes/s; req/op is per MiB for the sequential rows, per read or \
             write for the others.",
            z.t9_file_bytes >> 20,
            z.t9_random_reads
        ),
        Test::T10 => format!(
            "{} creates and {} xattr changes through the target's mount, each polled for \
             through a second mount of the same volume (a second daemon); µs from the call \
             to the first poll that sees it. Then {} creates, as many setxattrs and as many \
             renames within a directory, each by one writer on the target's mount, by two \
             writers on it, and by one writer on each of the two mounts, every writer in a \
             directory its mount made (µs per operation). Only volumes several daemons serve \
             (safs on PostgreSQL); n/a elsewhere.",
            z.t10_changes,
            z.t10_changes,
            z.t10_changes * 4
        ),
        Test::T11 => format!(
            "One file with K − 1 xattrs of 40 B beside the one timed; {} replacements of its \
             32 B value (hot), then as many reads of it.",
            z.t11_calls
        ),
        Test::T12 => format!(
            "{} files per thread count, shared among the threads (private: a directory per \
             thread; shared: one directory); stat and getxattr after making the target cold. \
             Operations per second of all threads together.",
            z.t12_files
        ),
        Test::T13 => format!(
            "T2's tree at {} entries (files cut at 16 KiB), made below a directory with an \
             access and a default ACL, which every entry inherits: `checkout` makes each \
             entry (mkdir; create, write, close; symlink) and lstats it, µs per entry; \
             `status cold` lstats every path after making the target cold, µs per entry; \
             `read cold` opens, reads and closes every file after making the target cold, µs \
             per file. n/a where the target keeps no POSIX ACLs.",
            z.t13_entries
        ),
    }
}

#[cfg(test)]
mod tests;
