//! The targets of docs/benchmarks.md, decided for each safs target of a
//! run: met, missed, or shown for information.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Met,
    Missed,
    /// Shown for information; nothing to compare it with.
    Info,
}

impl Verdict {
    pub(super) fn text(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::Missed => "**missed**",
            Verdict::Info => "—",
        }
    }

    pub(super) fn of(ok: bool) -> Verdict {
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
                    flat(&tb, test, l, &mut add);
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
                Test::T8 => flat(&tb, test, l, &mut add),
                Test::T10 => {
                    // Only where a second daemon could mount the volume.
                    for case in [crate::t10::CREATE_P99, crate::t10::XATTR_P99] {
                        if let Some(v) = tb.best(case, None, l) {
                            add(
                                &format!("T10: {case} ≤ 10 ms"),
                                format!("{v:.0} µs"),
                                Verdict::of(v <= 10_000.0),
                            );
                        }
                    }
                }
                Test::T11 => {
                    // A set costs the same whatever else the file holds.
                    let ps = tb.params(crate::t11::SET);
                    if let (Some(lo), Some(hi)) = (ps.first(), ps.last())
                        && lo != hi
                    {
                        let g = ratio(
                            tb.best(crate::t11::SET, *hi, l),
                            tb.best(crate::t11::SET, *lo, l),
                        );
                        add(
                            &format!(
                                "T11: a 32 B set on a file with {} xattrs ≤ 2× one with {}",
                                hi.unwrap_or(0),
                                lo.unwrap_or(0)
                            ),
                            g.map_or("n/a".into(), |g| format!("{g:.2}×")),
                            Verdict::of(g.is_some_and(|g| g <= 2.0)),
                        );
                    }
                }
                Test::T12 => {
                    // Throughput from 1 to 2 threads grows at least as much
                    // as the baseline's.
                    if !has_base {
                        continue;
                    }
                    for layout in crate::t12::LAYOUTS {
                        for what in [
                            crate::t12::CREATE,
                            crate::t12::STAT,
                            crate::t12::GETXATTR,
                            crate::t12::REMOVE,
                        ] {
                            let case = crate::t12::case(layout, what);
                            let gain = |who: &str| {
                                ratio(tb.best(&case, Some(2), who), tb.best(&case, Some(1), who))
                            };
                            let (Some(mine), Some(theirs)) = (gain(l), gain(base)) else {
                                continue;
                            };
                            add(
                                &format!("T12: {case}, 1 → 2 threads grows ≥ {base}'s"),
                                format!("{mine:.2}× ({base} {theirs:.2}×)"),
                                Verdict::of(mine >= theirs),
                            );
                        }
                    }
                }
                Test::T9 => {
                    if let Some((_, txt)) = max_trips(&tb, crate::t9::RANDOM) {
                        add("T9: requests per random 4 KiB read", txt, Verdict::Info);
                    }
                    if let Some((_, txt)) = max_trips(&tb, crate::t9::SMALL) {
                        add("T9: requests per 4 KiB write", txt, Verdict::Info);
                    }
                }
                Test::T6 | Test::T7 | Test::T13 => {
                    let case = match test {
                        Test::T6 => "read hot",
                        Test::T7 => "getxattr absent",
                        _ => "status cold",
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
    out.extend(super::encrypted::checks(r));
    out.extend(beside_juicefs(r));
    // Each target's checks together, in the targets' order (stable).
    out.sort_by_key(|c| r.targets.iter().position(|t| t.label == c.target));
    out
}

/// The per-file cost of each directory phase stays flat (≤ 1.3×) from the
/// smallest N of the table to its largest.
fn flat(tb: &Table<'_>, test: Test, l: &str, add: &mut dyn FnMut(&str, String, Verdict)) {
    for case in ["create", "ls -Al", "remove"] {
        let ps = tb.params(case);
        if let (Some(lo), Some(hi)) = (ps.first(), ps.last())
            && lo != hi
        {
            let g = ratio(tb.best(case, *hi, l), tb.best(case, *lo, l));
            add(
                &format!(
                    "{test}: {case} per-file cost flat (≤ 1.3×) from N={} to N={}",
                    lo.unwrap_or(0),
                    hi.unwrap_or(0)
                ),
                g.map_or("n/a".into(), |g| format!("{g:.2}×")),
                Verdict::of(g.is_some_and(|g| g <= 1.3)),
            );
        }
    }
}

/// `safs-s3` beside `juicefs` (same PostgreSQL cluster, same radosgw), as
/// docs/object-store.md sets the targets: T9's sequential write and cold
/// read at least JuiceFS's and its hot read ≥ 0.8× the baseline's; T6's
/// small files (create+write, read cold) ≥ 2× JuiceFS's rate; every row of
/// T1, T5 and T13 (the `git clone` with ACLs) ≥ 5× (the worst row is shown).
fn beside_juicefs(r: &Results) -> Vec<Check> {
    const S3: &str = "safs-s3";
    const J: &str = "juicefs";
    let mut out = Vec::new();
    let has = |l: &str| r.targets.iter().any(|t| t.label == l);
    if !has(S3) || !has(J) {
        return out;
    }
    let mut add = |what: String, measured: String, verdict: Verdict| {
        out.push(Check {
            target: S3.into(),
            what,
            measured,
            verdict,
        });
    };
    // MB/s: higher is better.
    let t9 = table(r, Test::T9);
    for (case, what) in [
        (crate::t9::WRITE, "T9: sequential write + fsync ≥ juicefs's"),
        (crate::t9::READ, "T9: sequential read cold ≥ juicefs's"),
    ] {
        match ratio(t9.best(case, None, S3), t9.best(case, None, J)) {
            Some(q) => add(what.into(), format!("{q:.2}× {J}"), Verdict::of(q >= 1.0)),
            None => add(what.into(), "n/a".into(), Verdict::Missed),
        }
    }
    let base = r.baseline.as_str();
    if has(base) {
        let what = format!("T9: sequential read hot ≥ 0.8× {base}'s");
        match ratio(
            t9.best(crate::t9::READ_HOT, None, S3),
            t9.best(crate::t9::READ_HOT, None, base),
        ) {
            Some(q) => add(what, format!("{q:.2}× {base}"), Verdict::of(q >= 0.8)),
            None => add(what, "n/a".into(), Verdict::Missed),
        }
    }
    // µs per operation: JuiceFS's over safs-s3's is how many times faster.
    let t6 = table(r, Test::T6);
    for case in ["create+write", "read cold"] {
        let what = format!("T6: 4 KiB files, {case} ≥ 2× juicefs's rate");
        match ratio(t6.best(case, None, J), t6.best(case, None, S3)) {
            Some(q) => add(what, format!("{q:.1}×"), Verdict::of(q >= 2.0)),
            None => add(what, "n/a".into(), Verdict::Missed),
        }
    }
    for test in [Test::T1, Test::T5, Test::T13] {
        let tb = table(r, test);
        let worst = tb
            .rows
            .iter()
            .filter_map(|(case, p)| {
                let q = ratio(tb.best(case, *p, J), tb.best(case, *p, S3))?;
                let at = p.map(|n| format!(" {n}")).unwrap_or_default();
                Some((q, format!("{case}{at}")))
            })
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let what = format!("{test}: every row ≥ 5× juicefs's rate");
        match worst {
            Some((q, row)) => add(
                what,
                format!("worst {q:.1}× ({row})"),
                Verdict::of(q >= 5.0),
            ),
            None => add(what, "n/a".into(), Verdict::Missed),
        }
    }
    out
}
