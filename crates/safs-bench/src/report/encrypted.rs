//! The encrypted volumes against unencrypted safs, against the same kind of
//! volume without its directory cache, and against gocryptfs: the ratios
//! the encrypted-volume work is held to (docs/benchmarks.md), as a table
//! and as verdicts.
//!
//! The targets are known by the labels `--setup` gives them: `safs` (the
//! unencrypted reference), `gocryptfs`, and every safs target labelled
//! `safs-enc…` is an encrypted one; `L-nodircache` is `L` mounted with
//! `dircache=0`. Every ratio is of costs — time, or the inverse of a
//! throughput — so above 1 means the first named is slower, whatever the
//! row's unit.

use super::*;
use crate::t5::LS_KERNEL_COLD;
use crate::t9;

const PLAIN: &str = "safs";
const GOCRYPTFS: &str = "gocryptfs";
const NO_DIRCACHE: &str = "-nodircache";

/// T1's value sizes in the comparison (the pefs table's rows).
const T1_SIZES: [u64; 2] = [32, 4096];
const T1_CASES: [&str; 4] = ["set cold", "set hot", "get hot", "get cold"];

/// `cost(a) ÷ cost(b)`: a time's ratio, or a throughput's inverted.
pub(super) fn cost_ratio(unit: Unit, a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match unit {
        Unit::Ratio => None,
        u if u.higher_is_better() => ratio(b, a),
        _ => ratio(a, b),
    }
}

/// The encrypted targets compared: safs targets labelled `safs-enc…`,
/// without the `…-nodircache` partners (they are compared through them).
fn encrypted(r: &Results) -> Vec<&str> {
    r.targets
        .iter()
        .filter(|t| t.safs_volume.is_some())
        .map(|t| t.label.as_str())
        .filter(|l| l.starts_with("safs-enc") && !l.ends_with(NO_DIRCACHE))
        .collect()
}

fn has(r: &Results, label: &str) -> bool {
    r.targets.iter().any(|t| t.label == label)
}

/// One row of the comparison: a (case, param) of a test.
#[derive(Clone)]
struct Row<'r> {
    test: Test,
    tb: std::rc::Rc<Table<'r>>,
    case: String,
    param: Option<u64>,
}

impl Row<'_> {
    fn unit(&self) -> Option<Unit> {
        self.tb
            .cells
            .iter()
            .find(|((c, p, _), _)| *c == self.case && *p == self.param)
            .map(|(_, m)| m.unit)
    }

    fn best(&self, target: &str) -> Option<f64> {
        self.tb.best(&self.case, self.param, target)
    }

    fn get(&self, target: &str) -> Option<&Measurement> {
        self.tb.get(&self.case, self.param, target)
    }

    /// `cost(a) ÷ cost(b)` on this row.
    fn cost(&self, a: &str, b: &str) -> Option<f64> {
        cost_ratio(self.unit()?, self.best(a), self.best(b))
    }

    fn name(&self) -> String {
        match self.param {
            Some(p) if self.test == Test::T1 => format!("{} {} {p} B", self.test, self.case),
            Some(p) => format!("{} {} N={p}", self.test, self.case),
            None => format!("{} {}", self.test, self.case),
        }
    }
}

/// Every row of the tests run, in table order (`keep` chooses).
fn rows<'r>(r: &'r Results, keep: impl Fn(Test, &str, Option<u64>) -> bool) -> Vec<Row<'r>> {
    let mut out = Vec::new();
    for &test in &r.tests {
        let tb = std::rc::Rc::new(table(r, test));
        for (case, param) in &tb.rows {
            if keep(test, case, *param) {
                out.push(Row {
                    test,
                    tb: tb.clone(),
                    case: case.clone(),
                    param: *param,
                });
            }
        }
    }
    out
}

/// The rows of the pefs table: T1 at 32 B and 4 KiB, dbench, T5, T8, T9.
fn pefs_row(test: Test, case: &str, param: Option<u64>) -> bool {
    match test {
        Test::T1 => param.is_some_and(|p| T1_SIZES.contains(&p)),
        Test::T4 => case != "xattr / no xattr",
        Test::T5 | Test::T8 | Test::T9 => true,
        _ => false,
    }
}

pub(super) fn fmt_ratio(q: Option<f64>) -> String {
    q.map_or("—".into(), |q| format!("{q:.2}×"))
}

/// The table after the tests: for each encrypted target, its figure, its
/// cost against safs, how far ahead of gocryptfs it is, and its cost
/// against its own `dircache=0` twin.
pub(super) fn section(r: &Results) -> String {
    let mut s = String::new();
    for e in encrypted(r) {
        let nodc = format!("{e}{NO_DIRCACHE}");
        let others: Vec<(&str, String)> = [
            (PLAIN, format!("{e} ÷ {PLAIN}")),
            (GOCRYPTFS, format!("{GOCRYPTFS} ÷ {e} (× ahead)")),
            (nodc.as_str(), format!("{e} ÷ {nodc}")),
        ]
        .into_iter()
        .filter(|(l, _)| has(r, l))
        .collect();
        let rows = rows(r, pefs_row);
        if others.is_empty() || rows.is_empty() {
            continue;
        }
        let _ = writeln!(s, "\n## {e}: the pefs table\n");
        let _ = writeln!(
            s,
            "Costs compared row by row (time, or the inverse of a throughput): \
             `{e} ÷ {PLAIN}` above 1 is slower than unencrypted safs; \
             `{GOCRYPTFS} ÷ {e}` is how many times {e} is ahead of gocryptfs; \
             `{e} ÷ {nodc}` below 1 is what the directory cache gains.\n"
        );
        let mut head = vec!["table", "case", "N", "unit", e];
        for (l, h) in &others {
            head.push(l);
            head.push(h);
        }
        let _ = writeln!(s, "| {} |", head.join(" | "));
        let _ = writeln!(s, "|{}", "---|".repeat(head.len()));
        for row in &rows {
            let Some(unit) = row.unit() else { continue };
            let value = |l: &str| cell(row.get(l), None, true);
            let mut line = vec![
                row.test.to_string(),
                row.case.clone(),
                row.param.map(|p| p.to_string()).unwrap_or_default(),
                unit.label().to_string(),
                value(e),
            ];
            for (l, _) in &others {
                line.push(value(l));
                line.push(fmt_ratio(if *l == GOCRYPTFS {
                    row.cost(l, e)
                } else {
                    row.cost(e, l)
                }));
            }
            let _ = writeln!(s, "| {} |", line.join(" | "));
        }
    }
    s
}

/// Which end of a row's figures is the worst.
#[derive(Clone, Copy)]
enum Worst {
    /// A cost ratio held to a ceiling.
    Largest,
    /// A lead held to a floor.
    Smallest,
}

/// `f` of the worst row held to `ok`: the figure with the row's name and
/// the verdict; n/a (missed) when rows ran but none had both figures;
/// nothing when no row ran.
fn limit(
    rows: &[Row<'_>],
    worst: Worst,
    f: impl Fn(&Row<'_>) -> Option<f64>,
    ok: impl Fn(f64) -> bool,
    show: impl Fn(f64) -> String,
) -> Option<(String, Verdict)> {
    if rows.is_empty() {
        return None;
    }
    let figures = rows.iter().filter_map(|row| Some((f(row)?, row.name())));
    let w = match worst {
        Worst::Largest => figures.max_by(|a, b| a.0.total_cmp(&b.0)),
        Worst::Smallest => figures.min_by(|a, b| a.0.total_cmp(&b.0)),
    };
    Some(match w {
        Some((q, name)) => (format!("{} ({name})", show(q)), Verdict::of(ok(q))),
        None => ("n/a".into(), Verdict::Missed),
    })
}

/// The verdicts of the encrypted targets (docs/benchmarks.md).
pub(super) fn checks(r: &Results) -> Vec<Check> {
    let mut out = Vec::new();
    for e in encrypted(r) {
        let mut add = |what: String, found: Option<(String, Verdict)>| {
            if let Some((measured, verdict)) = found {
                out.push(Check {
                    target: e.to_string(),
                    what,
                    measured,
                    verdict,
                });
            }
        };
        let times = |q: f64| format!("{q:.2}×");
        if has(r, PLAIN) {
            for test in [Test::T1, Test::T5, Test::T8] {
                let rows = rows(r, |t, c, p| {
                    t == test && (t != Test::T1 || T1_CASES.contains(&c) && pefs_row(t, c, p))
                });
                let cost = |row: &Row<'_>| row.cost(e, PLAIN);
                add(
                    format!("{test}: ≤ 1.2× unencrypted {PLAIN} (worst row)"),
                    limit(&rows, Worst::Largest, cost, |q| q <= 1.2, times),
                );
            }
        }
        if has(r, GOCRYPTFS) {
            // How many times gocryptfs' cost ours is; the worst row is the
            // smallest lead.
            let lead = |row: &Row<'_>| row.cost(GOCRYPTFS, e);
            let ahead = |q: f64| format!("{q:.2}× ahead");
            for (case, what, min) in [
                ("create", "creates", 4.0),
                ("ls -Al", "listings (ls -Al)", 6.0),
            ] {
                let rows = rows(r, |t, c, _| matches!(t, Test::T5 | Test::T8) && c == case);
                add(
                    format!("{what} ≥ {min}× ahead of {GOCRYPTFS} (T5, T8; worst N)"),
                    limit(&rows, Worst::Smallest, lead, |q| q >= min, ahead),
                );
            }
            let dbench = rows(r, |t, c, _| t == Test::T4 && c != "xattr / no xattr");
            add(
                format!("T4: dbench ≥ 3× {GOCRYPTFS}'s throughput (worst of plain, -x)"),
                limit(&dbench, Worst::Smallest, lead, |q| q >= 3.0, ahead),
            );
            let seq = rows(r, |t, c, _| {
                t == Test::T9 && (c == t9::WRITE || c == t9::READ)
            });
            add(
                format!("T9: sequential write and read at least {GOCRYPTFS}'s (worst)"),
                limit(&seq, Worst::Smallest, lead, |q| q >= 1.0, ahead),
            );
            add(
                format!("ahead of {GOCRYPTFS} on every row of every table"),
                every_row(r, e),
            );
        }
        let nodc = format!("{e}{NO_DIRCACHE}");
        if has(r, &nodc) {
            // The biggest directory both listed: T5's last N, else T8's.
            // The listing that reaches the daemons is the one after the
            // kernel's caches were dropped; every unlink reaches them.
            for case in [LS_KERNEL_COLD, "remove"] {
                let all = rows(r, |t, c, _| matches!(t, Test::T5 | Test::T8) && c == case);
                let biggest = all
                    .iter()
                    .filter(|row| row.best(e).is_some() && row.best(&nodc).is_some())
                    .max_by_key(|row| (row.param, row.test == Test::T5))
                    .cloned();
                let big = biggest.map_or(all, |row| vec![row]);
                let cost = |row: &Row<'_>| row.cost(e, &nodc);
                add(
                    format!("dircache: {case} of the biggest directory ≥ 10 % faster than {nodc}"),
                    limit(&big, Worst::Largest, cost, |q| q <= 0.9, times),
                );
            }
        }
    }
    out
}

/// "Ahead of gocryptfs on every row": every row of every table where either
/// has a figure. A row gocryptfs refuses (n/a) and `e` does not counts as
/// ahead; the reverse as behind.
fn every_row(r: &Results, e: &str) -> Option<(String, Verdict)> {
    let mut ahead = 0;
    let mut behind = Vec::new();
    for row in rows(r, |_, _, _| true) {
        if row.unit().is_none_or(|u| u == Unit::Ratio) {
            continue;
        }
        let refused = |l: &str| row.get(l).is_some_and(|m| m.error.is_some());
        match (row.best(e), row.best(GOCRYPTFS)) {
            (Some(_), Some(_)) => match row.cost(GOCRYPTFS, e) {
                Some(q) if q > 1.0 => ahead += 1,
                q => behind.push(format!("{} {}", row.name(), fmt_ratio(q))),
            },
            (Some(_), None) if refused(GOCRYPTFS) => ahead += 1,
            (None, Some(_)) if refused(e) => behind.push(format!("{} (n/a)", row.name())),
            _ => {}
        }
    }
    if ahead + behind.len() == 0 {
        return None;
    }
    let measured = if behind.is_empty() {
        format!("ahead on all {ahead} rows")
    } else {
        format!(
            "ahead on {ahead} of {} rows; behind: {}",
            ahead + behind.len(),
            behind.join(", ")
        )
    };
    Some((measured, Verdict::of(behind.is_empty())))
}
