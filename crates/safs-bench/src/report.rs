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
        Test::T5 => Some("N (files)"),
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
        "\n| target | directory | filesystem | cold phases | made cold | wall time per test |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for t in &r.targets {
        let per_test: Vec<String> = r
            .steps
            .iter()
            .filter(|st| st.target == t.label)
            .map(|st| format!("{} {:.0} s", st.test, st.secs))
            .collect();
        let _ = writeln!(
            s,
            "| {} | `{}` | {} | {} | {} times, {:.0} s | {} |",
            t.label,
            t.dir,
            t.fstype,
            t.cold,
            t.cold_count,
            t.cold_secs,
            per_test.join(", ")
        );
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
        if test == Test::T5 {
            for case in ["create", "ls -Al", "remove"] {
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Met,
    Missed,
    /// Shown for information; nothing to compare it with.
    Info,
}

impl Verdict {
    fn text(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::Missed => "**missed**",
            Verdict::Info => "—",
        }
    }

    fn of(ok: bool) -> Verdict {
        if ok { Verdict::Met } else { Verdict::Missed }
    }
}

#[derive(Clone, Debug)]
pub struct Check {
    pub target: String,
    pub what: String,
    pub measured: String,
    pub verdict: Verdict,
}

/// The targets of docs/benchmarks.md that this run can decide, for each safs
/// target. Comparisons are against the baseline (ext4 by default).
pub fn checks(r: &Results) -> Vec<Check> {
    let mut out = Vec::new();
    let base = r.baseline.as_str();
    let has_base = r.targets.iter().any(|t| t.label == base);
    for t in r.targets.iter().filter(|t| t.safs_volume.is_some()) {
        let l = t.label.as_str();
        let mut add = |what: &str, measured: String, verdict: Verdict| {
            out.push(Check {
                target: l.to_string(),
                what: what.to_string(),
                measured,
                verdict,
            });
        };
        let vs_base = |tb: &Table<'_>,
                       case: &str,
                       limit: f64,
                       what: &str,
                       add: &mut dyn FnMut(&str, String, Verdict)| {
            if !has_base {
                return;
            }
            if let Some(q) = ratio(tb.best(case, None, l), tb.best(case, None, base)) {
                add(what, format!("{q:.2}× {base}"), Verdict::of(q <= limit));
            } else {
                add(what, "n/a".into(), Verdict::Missed);
            }
        };
        let max_req = |tb: &Table<'_>, case: &str| -> Option<(f64, String)> {
            tb.params(case)
                .into_iter()
                .filter_map(|p| {
                    let q = tb.get(case, p, l)?.requests_per_op()?;
                    Some((total(&q), fmt_requests(&q)))
                })
                .max_by(|a, b| a.0.total_cmp(&b.0))
        };
        let max_trips = |tb: &Table<'_>, case: &str| -> Option<(f64, String)> {
            tb.params(case)
                .into_iter()
                .filter_map(|p| round_trips(&tb.get(case, p, l)?.requests_per_op()?).into())
                .max_by(|a, b| a.0.total_cmp(&b.0))
        };
        for &test in &r.tests {
            let tb = table(r, test);
            match test {
                Test::T1 => {
                    let failed: Vec<String> = tb
                        .params("set cold")
                        .into_iter()
                        .filter(|p| tb.get("set cold", *p, l).is_none_or(|m| m.error.is_some()))
                        .map(|p| p.unwrap_or(0).to_string())
                        .collect();
                    add(
                        "T1: every size 1 B – 64 KiB works",
                        if failed.is_empty() {
                            "all sizes".into()
                        } else {
                            format!("failed: {}", failed.join(", "))
                        },
                        Verdict::of(failed.is_empty()),
                    );
                    if let Some((n, txt)) = max_trips(&tb, "get hot") {
                        add(
                            "T1: hot getxattr = one round trip (worst size)",
                            txt,
                            Verdict::of(n <= 1.05),
                        );
                    }
                    if let Some((n, txt)) = max_trips(&tb, "set hot") {
                        add(
                            "T1: hot setxattr = one round trip (worst size)",
                            txt,
                            Verdict::of(n <= 1.05),
                        );
                    }
                    if let Some((_, txt)) = max_req(&tb, "get cold") {
                        add(
                            "T1: cold getxattr requests (worst size)",
                            txt,
                            Verdict::Info,
                        );
                    }
                    // A cold get is LOOKUP (the entry, then the inode) and
                    // GETXATTR; for a value within the inline budget the
                    // GETXATTR itself reads nothing more.
                    let inline = r
                        .targets
                        .iter()
                        .find(|t| t.label == *l)
                        .and_then(|t| t.inline_bytes)
                        .unwrap_or(0);
                    let cold_reads = tb
                        .params("get cold")
                        .into_iter()
                        .filter(|p| p.is_some_and(|n| n <= inline))
                        .filter_map(|p| tb.get("get cold", p, l)?.engine_per_op())
                        .max_by(|a, b| total(a).total_cmp(&total(b)));
                    if let Some(e) = cold_reads {
                        let reads = e.get("get").copied().unwrap_or(0.0)
                            + e.get("scan").copied().unwrap_or(0.0);
                        add(
                            &format!(
                                "T1: cold get ≤ {inline} B: engine reads (LOOKUP: entry + inode; GETXATTR: none)"
                            ),
                            format!(
                                "{} (point reads {}, scans {})",
                                fmt_count(reads),
                                fmt_count(e.get("get").copied().unwrap_or(0.0)),
                                fmt_count(e.get("scan").copied().unwrap_or(0.0))
                            ),
                            Verdict::of(reads <= 2.05),
                        );
                    }
                }
                Test::T2 => {
                    vs_base(
                        &tb,
                        "fstat",
                        1.1,
                        "T2: fstat loop ≤ 1.1× baseline",
                        &mut add,
                    );
                    vs_base(&tb, "du hot", 1.5, "T2: du hot ≤ 1.5× baseline", &mut add);
                    vs_base(&tb, "du cold", 1.0, "T2: du cold ≤ 1.0× baseline", &mut add);
                }
                Test::T3 => {
                    let failed: Vec<String> = tb
                        .params("write")
                        .into_iter()
                        .filter(|p| tb.get("write", *p, l).is_none_or(|m| m.error.is_some()))
                        .map(|p| p.unwrap_or(0).to_string())
                        .collect();
                    add(
                        "T3: every chunk size works",
                        if failed.is_empty() {
                            "all sizes".into()
                        } else {
                            format!("failed: {}", failed.join(", "))
                        },
                        Verdict::of(failed.is_empty()),
                    );
                    let one_chunk = tb
                        .params("read hot")
                        .into_iter()
                        .filter(|p| p.unwrap_or(0) as usize >= r.sizes.t3_metadata_bytes)
                        .filter_map(|p| tb.get("read hot", p, l)?.requests_per_op())
                        .map(|q| round_trips(&q))
                        .max_by(|a, b| a.0.total_cmp(&b.0));
                    if let Some((n, txt)) = one_chunk {
                        add(
                            "T3: one-chunk read in ≤ 2 round trips (open + fgetxattr)",
                            txt,
                            Verdict::of(n <= 2.05),
                        );
                    }
                }
                Test::T4 => {
                    if let Some(q) = tb.best("xattr / no xattr", None, l) {
                        add(
                            "T4: dbench -x keeps ≥ 95 % of its throughput",
                            format!("{:.0} %", q * 100.0),
                            Verdict::of(q >= 0.95),
                        );
                    }
                    if has_base
                        && let Some(q) = ratio(
                            tb.best("no xattr", None, l),
                            tb.best("no xattr", None, base),
                        )
                    {
                        add(
                            "T4: throughput vs baseline (no xattr)",
                            format!("{q:.2}× {base}"),
                            Verdict::Info,
                        );
                    }
                }
                Test::T5 => {
                    for case in ["create", "ls -Al", "remove"] {
                        let ps = tb.params(case);
                        if let (Some(lo), Some(hi)) = (ps.first(), ps.last())
                            && lo != hi
                        {
                            let g = ratio(tb.best(case, *hi, l), tb.best(case, *lo, l));
                            add(
                                &format!(
                                    "T5: {case} per-file cost flat (≤ 1.3×) from N={} to N={}",
                                    lo.unwrap_or(0),
                                    hi.unwrap_or(0)
                                ),
                                g.map_or("n/a".into(), |g| format!("{g:.2}×")),
                                Verdict::of(g.is_some_and(|g| g <= 1.3)),
                            );
                        }
                    }
                    if let Some((n, txt)) = max_trips(&tb, "create") {
                        add(
                            "T5: one round trip per created file (worst N)",
                            txt,
                            Verdict::of(n <= 1.05),
                        );
                    }
                    // The last repetition lists a directory that did not
                    // change since the one before.
                    let repeat = tb
                        .params("ls -Al")
                        .into_iter()
                        .filter_map(|p| {
                            let m = tb.get("ls -Al", p, l)?;
                            if m.reps.len() < 2 || m.error.is_some() {
                                return None;
                            }
                            let req = m.reps.last()?.requests.as_ref()?;
                            let n: u64 = req.values().sum();
                            Some((n as f64 / m.ops.max(1) as f64, p.unwrap_or(0), n))
                        })
                        .max_by(|a, b| a.0.total_cmp(&b.0));
                    if let Some((per, n_files, n)) = repeat {
                        add(
                            "T5: repeated ls -Al: no round trip per entry (worst N)",
                            format!("{n} requests for {n_files} entries ({per:.3}/entry)"),
                            Verdict::of(per <= 0.05),
                        );
                    }
                }
                Test::T6 | Test::T7 => {
                    let case = if test == Test::T6 {
                        "read hot"
                    } else {
                        "getxattr absent"
                    };
                    if let Some((_, txt)) = max_req(&tb, case) {
                        add(&format!("{test}: {case} requests"), txt, Verdict::Info);
                    }
                }
            }
            // Scale without memory growth matters where the tests are
            // largest: the inode cache must stay within its configured bound.
            if matches!(test, Test::T1 | Test::T5)
                && let Some(m) = daemon_mem(r, test, l)
            {
                add(
                    &format!("{test}: inode cache within its bound (daemon memory beside it)"),
                    mem_line(&m),
                    Verdict::of(m.cache_bytes <= m.cache_budget_bytes),
                );
            }
        }
    }
    out
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
        Test::T5 => "N files per directory, as in each row.".into(),
        Test::T6 => format!("{} files of 4 KiB.", z.t6_files),
        Test::T7 => format!("{} calls per repetition.", z.t7_calls),
    }
}

/// `64 Ki`, `1k`: short labels for the swept parameter.
fn param_label(test: Test, p: u64) -> String {
    match test {
        Test::T1 if p >= 1024 && p % 1024 == 0 => format!("{} Ki", p / 1024),
        _ if p >= 1_000_000 && p % 1_000_000 == 0 => format!("{}M", p / 1_000_000),
        _ if p >= 1_000 && p % 1_000 == 0 => format!("{}k", p / 1_000),
        _ => p.to_string(),
    }
}

fn chart(r: &Results, test: Test, cases: &[&str], title: &str, x_label: &str) -> Chart {
    let tb = table(r, test);
    let mut x_ticks: Vec<(f64, String)> = Vec::new();
    for p in cases.iter().flat_map(|c| tb.params(c)).flatten() {
        if !x_ticks.iter().any(|(x, _)| *x == p as f64) {
            x_ticks.push((p as f64, param_label(test, p)));
        }
    }
    let mut series = Vec::new();
    for (ti, t) in r.targets.iter().enumerate() {
        for (ci, case) in cases.iter().enumerate() {
            let params: Vec<u64> = tb.params(case).into_iter().flatten().collect();
            let points: Vec<(f64, Option<f64>)> = params
                .iter()
                .map(|&p| (p as f64, tb.best(case, Some(p), &t.label)))
                .collect();
            if points.iter().all(|p| p.1.is_none()) {
                continue;
            }
            // A line that ends before the last size: mark why (ENOSPC).
            let stop = points
                .iter()
                .rposition(|p| p.1.is_some())
                .filter(|&last| last + 1 < points.len())
                .and_then(|last| {
                    let (x, y) = (points[last].0, points[last].1?);
                    let m = tb.get(case, Some(params[last + 1]), &t.label)?;
                    let why = short_error(m.error.as_deref()?);
                    let why = why.trim_start_matches("n/a (").trim_end_matches(')');
                    Some((x, y, why.to_string()))
                });
            series.push(Series {
                name: format!("{} {case}", t.label),
                color: PALETTE[ti % PALETTE.len()].into(),
                dash: DASHES[ci % DASHES.len()].into(),
                points,
                stop,
            });
        }
    }
    Chart {
        title: title.into(),
        x_label: x_label.into(),
        y_label: "µs per file (log)".into(),
        x_log: true,
        y_log: true,
        x_ticks,
        series,
    }
}

/// t1.svg: per-file µs against the value size, set and get, hot and cold.
pub fn t1_chart(r: &Results) -> Chart {
    chart(
        r,
        Test::T1,
        &["set cold", "set hot", "get hot", "get cold"],
        &format!(
            "T1: one xattr of N bytes on each of {} files",
            r.sizes.t1_files
        ),
        "value size N (bytes, log)",
    )
}

/// t5.svg: per-file µs against the number of files in the directory.
pub fn t5_chart(r: &Results) -> Chart {
    chart(
        r,
        Test::T5,
        &["create", "ls -Al", "remove"],
        "T5: N files in one directory — per-file cost must stay flat",
        "files in the directory N (log)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Scale, Sizes};
    use crate::record::{Machine, Rep, TargetInfo};

    fn target(label: &str, safs: bool) -> TargetInfo {
        TargetInfo {
            label: label.into(),
            dir: format!("/mnt/{label}"),
            fstype: if safs {
                "fuse.safs".into()
            } else {
                label.into()
            },
            mount_source: String::new(),
            safs_volume: safs.then(|| "/vol".into()),
            inline_bytes: safs.then_some(320),
            cold: "sync, drop_caches".into(),
            cold_count: 0,
            cold_secs: 0.0,
        }
    }

    fn meas(
        test: Test,
        target: &str,
        case: &str,
        param: Option<u64>,
        v: Option<f64>,
        req: Option<&[(&str, u64)]>,
    ) -> Measurement {
        let mut m = Measurement::new(test, target, case, param, Unit::UsPerOp);
        m.ops = 100;
        match v {
            Some(v) => m.reps.push(Rep {
                secs: v,
                value: v,
                sd: None,
                requests: req.map(|r| r.iter().map(|(k, n)| ((*k).to_string(), *n)).collect()),
                daemon_ns: None,
                engine: None,
                daemon_mem: None,
            }),
            None => m.error = Some("ENOSPC: setxattr failed at 1 of 100".into()),
        }
        m
    }

    fn results() -> Results {
        let get = [("getxattr", 100)];
        let set = [("setxattr", 100), ("lookup", 3)];
        let ms = vec![
            meas(
                Test::T1,
                "safs",
                "set cold",
                Some(1),
                Some(20.0),
                Some(&set),
            ),
            meas(Test::T1, "ext4", "set cold", Some(1), Some(4.0), None),
            meas(Test::T1, "safs", "set hot", Some(1), Some(10.0), Some(&set)),
            meas(Test::T1, "ext4", "set hot", Some(1), Some(2.0), None),
            meas(Test::T1, "safs", "get hot", Some(1), Some(8.0), Some(&get)),
            meas(Test::T1, "ext4", "get hot", Some(1), Some(2.0), None),
            meas(
                Test::T1,
                "safs",
                "set cold",
                Some(4096),
                Some(30.0),
                Some(&set),
            ),
            meas(Test::T1, "ext4", "set cold", Some(4096), None, None),
            meas(
                Test::T5,
                "safs",
                "create",
                Some(1000),
                Some(10.0),
                Some(&[("create", 100)]),
            ),
            meas(
                Test::T5,
                "safs",
                "create",
                Some(10000),
                Some(14.0),
                Some(&[("create", 100)]),
            ),
            meas(Test::T5, "ext4", "create", Some(1000), Some(5.0), None),
            meas(Test::T5, "ext4", "create", Some(10000), Some(5.5), None),
        ];
        Results {
            safs_version: "0.1.0".into(),
            command: vec!["safs".into(), "bench".into()],
            scale: Scale::Small,
            sizes: Sizes::of(Scale::Small),
            baseline: "ext4".into(),
            reps: 3,
            started_unix: 0,
            wall_secs: 1.0,
            machine: Machine::default(),
            targets: vec![target("safs", true), target("ext4", false)],
            tests: vec![Test::T1, Test::T5],
            steps: vec![],
            measurements: ms,
            warnings: vec!["something odd".into()],
        }
    }

    #[test]
    fn ratios_and_formatting() {
        assert_eq!(ratio(Some(3.0), Some(1.5)), Some(2.0));
        assert_eq!(ratio(Some(3.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(1.0)), None);
        assert_eq!(fmt_value(1234.5), "1234");
        assert_eq!(fmt_value(12.345), "12.3");
        assert_eq!(fmt_value(1.2345), "1.23");
        assert_eq!(fmt_value(0.12345), "0.123");
        let q: BTreeMap<String, f64> = [
            ("create".into(), 1.0),
            ("flush".into(), 1.0),
            ("lookup".into(), 0.5),
        ]
        .into();
        assert_eq!(fmt_requests(&q), "2.50 (create 1, flush 1, lookup 0.50)");
        assert_eq!(
            short_error("E2BIG: setxattr failed at 1 of 10"),
            "n/a (E2BIG)"
        );
        assert_eq!(short_error("walk saw 3 entries"), "n/a");
        let many: BTreeMap<String, f64> = (0..10).map(|i| (format!("op{i}"), 1.0)).collect();
        assert!(fmt_requests(&many).starts_with("10 (op0 1,"));
        assert!(fmt_requests(&many).ends_with(", +2 more)"));
    }

    #[test]
    fn round_trips_leave_out_background_requests() {
        let q: BTreeMap<String, f64> = [
            ("open".into(), 1.0),
            ("getxattr".into(), 1.0),
            ("release".into(), 1.0),
        ]
        .into();
        let (n, text) = round_trips(&q);
        assert_eq!(n, 2.0);
        assert_eq!(
            text,
            "2 (getxattr 1, open 1) round trips; background: release 1"
        );
        let only: BTreeMap<String, f64> = [("getxattr".into(), 1.0)].into();
        assert_eq!(
            round_trips(&only),
            (1.0, "1 (getxattr 1) round trips".into())
        );
    }

    #[test]
    fn tables_have_ratios_na_and_requests() {
        let md = markdown(&results());
        assert!(
            md.contains("| case | N (bytes) | unit | safs | ext4 | safs req/op |"),
            "{md}"
        );
        // safs 20 µs vs ext4 4 µs → 5×; requests 103 per 100 sets.
        assert!(
            md.contains(
                "| set cold | 1 | µs/op | 20.0 (5.00×) | 4.00 | 1.03 (setxattr 1, lookup 0.03) |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| set cold | 4096 | µs/op | 30.0 | n/a (ENOSPC) |"),
            "{md}"
        );
        assert!(md.contains("ext4, set cold 4096: ENOSPC"), "{md}");
        // T5 growth row: 14/10 = 1.40 for safs, 1.10 for ext4.
        assert!(
            md.contains("| create: growth | 1000→10000 | × | 1.40 | 1.10 |"),
            "{md}"
        );
        assert!(md.contains("something odd"));
    }

    #[test]
    fn checks_decide_targets() {
        let c = checks(&results());
        let find = |w: &str| c.iter().find(|c| c.what.starts_with(w)).unwrap();
        assert_eq!(find("T1: every size").verdict, Verdict::Met);
        assert_eq!(find("T1: hot getxattr").verdict, Verdict::Met);
        assert_eq!(find("T1: hot setxattr").verdict, Verdict::Met);
        assert_eq!(find("T5: create per-file").verdict, Verdict::Missed);
        assert_eq!(find("T5: one round trip").verdict, Verdict::Met);
    }

    #[test]
    fn daemon_memory_is_reported_against_the_cache_bound() {
        let mut r = results();
        let mem = |anon_mib: u64, cache_mib: u64| DaemonMem {
            peak_rss_kib: (anon_mib + 100) << 10,
            rss_anon_kib: anon_mib << 10,
            cache_bytes: cache_mib << 20,
            cache_budget_bytes: 256 << 20,
        };
        // The largest figure of all repetitions of a test is the one shown.
        let t5: Vec<usize> = (0..r.measurements.len())
            .filter(|&i| r.measurements[i].test == Test::T5 && r.measurements[i].target == "safs")
            .collect();
        assert_eq!(t5.len(), 2);
        r.measurements[t5[0]].reps[0].daemon_mem = Some(mem(300, 250));
        r.measurements[t5[1]].reps[0].daemon_mem = Some(mem(120, 40));
        let md = markdown(&r);
        assert!(
            md.contains(
                "safs daemon memory: 300 MiB anonymous at most (heap and caches), peak resident 400 MiB"
            ),
            "{md}"
        );
        assert!(
            md.contains("inode cache at most 250 of its 256 MiB bound"),
            "{md}"
        );
        let verdict = |r: &Results| {
            checks(r)
                .into_iter()
                .find(|c| c.what.starts_with("T5: inode cache"))
                .map(|c| c.verdict)
        };
        assert_eq!(verdict(&r), Some(Verdict::Met));
        // T1 reported no memory figures: no check for it.
        assert!(
            !checks(&r)
                .iter()
                .any(|c| c.what.starts_with("T1: inode cache"))
        );
        r.measurements[t5[1]].reps[0].daemon_mem = Some(mem(120, 300));
        assert_eq!(verdict(&r), Some(Verdict::Missed));
    }

    #[test]
    fn charts_have_a_series_per_target_and_case() {
        let r = results();
        let c = t1_chart(&r);
        // safs: set cold, set hot, get hot; ext4: set cold (one point n/a), set hot, get hot.
        assert_eq!(c.series.len(), 6);
        let ext4 = c.series.iter().find(|s| s.name == "ext4 set cold").unwrap();
        assert_eq!(ext4.points, vec![(1.0, Some(4.0)), (4096.0, None)]);
        // The line stops at 4 KiB, marked with the errno.
        assert_eq!(ext4.stop, Some((1.0, 4.0, "ENOSPC".to_string())));
        assert!(c.render().contains("✕ ENOSPC"));
        assert_eq!(t5_chart(&r).series.len(), 2);
        let ticks: Vec<String> = c.x_ticks.iter().map(|t| t.1.clone()).collect();
        assert_eq!(ticks, ["1", "4 Ki"]);
        assert_eq!(param_label(Test::T5, 1_000_000), "1M");
    }
}
