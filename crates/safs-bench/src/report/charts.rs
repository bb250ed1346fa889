//! The per-file cost charts (t1.svg, t5.svg): one line per target and
//! case, marked where it stops and why.

use super::*;

/// `64 Ki`, `1k`: short labels for the swept parameter.
pub(super) fn param_label(test: Test, p: u64) -> String {
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
