//! The report from hand-made results: tables, notes, verdicts, charts.

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
        mount_options: "rw".into(),
        about: None,
        safs_volume: safs.then(|| "/vol".into()),
        inline_bytes: safs.then_some(320),
        dircache_budget_bytes: safs.then_some(0),
        transport: None,
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
        skipped: vec![],
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
    // No idle policy known: no line for it.
    assert!(!md.contains("- idle CPUs:"), "{md}");
}

#[test]
fn the_header_says_how_idle_cpus_wait() {
    let mut r = results();
    r.machine.cpu_idle = "haltpoll/haltpoll, polls 0 ns before halting".into();
    let md = markdown(&r);
    assert!(
        md.contains("\n- idle CPUs: haltpoll/haltpoll, polls 0 ns before halting\n"),
        "{md}"
    );
}

#[test]
fn the_targets_table_shows_each_mounts_options() {
    // Whether a FUSE peer has the kernel check permissions decides how many
    // round trips its changes cost: the table must say it.
    let mut r = results();
    r.targets[0].mount_options = "rw,user_id=0,group_id=0,default_permissions,allow_other".into();
    let md = markdown(&r);
    let row = md
        .lines()
        .find(|l| l.starts_with("| safs | `/mnt/safs` |"))
        .unwrap_or_else(|| panic!("no row for safs: {md}"));
    assert!(
        row.contains("| `rw,user_id=0,group_id=0,default_permissions,allow_other` |"),
        "{row}"
    );
    assert!(
        md.contains("| filesystem | mount options | cold phases |"),
        "{md}"
    );
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

/// A row of `unit` with one repetition of value `v` (n/a with ENOSPC when
/// `None`).
fn row(
    test: Test,
    target: &str,
    case: &str,
    param: Option<u64>,
    unit: Unit,
    v: Option<f64>,
) -> Measurement {
    let mut m = meas(test, target, case, param, v, None);
    m.unit = unit;
    m
}

/// safs, safs-enc (dircache), its dircache=0 twin and gocryptfs on the
/// pefs table's rows: `enc` scales safs-enc's costs against safs', `goc`
/// gocryptfs' against safs-enc's.
fn pefs_results(enc: f64, goc: f64) -> Results {
    let mut r = results();
    r.targets = ["safs", "safs-enc", "safs-enc-nodircache", "gocryptfs"]
        .map(|l| target(l, l != "gocryptfs"))
        .into();
    r.targets[3].fstype = "fuse.gocryptfs".into();
    r.tests = vec![Test::T1, Test::T4, Test::T5, Test::T8, Test::T9];
    let mut ms = Vec::new();
    let mut put = |test, case: &str, param, unit, safs: f64| {
        // Costs scale times up and throughputs down.
        let cost = |k: f64| {
            if unit == Unit::UsPerOp {
                safs * k
            } else {
                safs / k
            }
        };
        ms.push(row(test, "safs", case, param, unit, Some(safs)));
        ms.push(row(test, "safs-enc", case, param, unit, Some(cost(enc))));
        ms.push(row(
            test,
            "safs-enc-nodircache",
            case,
            param,
            unit,
            Some(cost(enc * 1.5)),
        ));
        ms.push(row(
            test,
            "gocryptfs",
            case,
            param,
            unit,
            Some(cost(enc * goc)),
        ));
    };
    for n in [32, 4096] {
        for case in ["set cold", "set hot", "get hot", "get cold"] {
            put(Test::T1, case, Some(n), Unit::UsPerOp, 20.0);
        }
    }
    put(Test::T4, "no xattr", None, Unit::MbPerSec, 168.0);
    put(Test::T4, "xattr (-x)", None, Unit::MbPerSec, 135.0);
    for (test, ns) in [
        (Test::T5, &[1000, 10_000][..]),
        (Test::T8, &[1000, 2000, 3000][..]),
    ] {
        for &n in ns {
            for case in ["create", "ls -Al", crate::t5::LS_KERNEL_COLD, "remove"] {
                put(test, case, Some(n), Unit::UsPerOp, 100.0);
            }
        }
    }
    put(Test::T9, crate::t9::WRITE, None, Unit::MbPerSec, 400.0);
    put(Test::T9, crate::t9::READ, None, Unit::MbPerSec, 900.0);
    put(Test::T9, crate::t9::RANDOM, None, Unit::Iops, 5000.0);
    // gocryptfs refuses 4 KiB xattrs (ext4 underneath).
    for m in ms
        .iter_mut()
        .filter(|m| m.target == "gocryptfs" && m.param == Some(4096) && m.test == Test::T1)
    {
        m.reps.clear();
        m.error = Some("ENOSPC: setxattr failed at 1 of 100".into());
    }
    r.measurements = ms;
    r
}

fn verdict(r: &Results, target: &str, what: &str) -> Check {
    checks(r)
        .into_iter()
        .find(|c| c.target == target && c.what.starts_with(what))
        .unwrap_or_else(|| panic!("no check {what} for {target}"))
}

#[test]
fn encrypted_targets_are_held_to_safs_and_gocryptfs() {
    // 1.1× safs' cost, 6.5× ahead of gocryptfs everywhere.
    let r = pefs_results(1.1, 6.5);
    for w in ["T1: ≤ 1.2×", "T5: ≤ 1.2×", "T8: ≤ 1.2×"] {
        let c = verdict(&r, "safs-enc", w);
        assert_eq!(c.verdict, Verdict::Met, "{c:?}");
        assert!(c.measured.starts_with("1.10× ("), "{c:?}");
    }
    for w in [
        "creates ≥ 4×",
        "listings (ls -Al) ≥ 6×",
        "T4: dbench ≥ 3×",
        "T9: sequential",
    ] {
        assert_eq!(verdict(&r, "safs-enc", w).verdict, Verdict::Met, "{w}");
    }
    let every = verdict(&r, "safs-enc", "ahead of gocryptfs on every row");
    assert_eq!(every.verdict, Verdict::Met);
    // 4 T1 cases × 2 sizes (4 KiB refused by gocryptfs counts as ahead),
    // 2 dbench, 4 × 5 directory sizes, 3 T9 rows.
    assert_eq!(every.measured, "ahead on all 33 rows");
    // dircache=0 costs 1.5× as much: the cache gains a third.
    let dc = verdict(&r, "safs-enc", "dircache: ls -Al (kernel caches cold)");
    assert_eq!(dc.verdict, Verdict::Met);
    assert_eq!(
        dc.measured,
        "0.67× (T5 ls -Al (kernel caches cold) N=10000)"
    );
    assert_eq!(
        verdict(&r, "safs-enc", "dircache: remove").verdict,
        Verdict::Met
    );
    // The twin is not held to the encrypted targets, only to safs' own.
    assert!(
        !checks(&r)
            .iter()
            .any(|c| c.target == "safs-enc-nodircache" && c.what.contains("gocryptfs"))
    );
    assert_eq!(
        verdict(&r, "safs-enc-nodircache", "T8: create per-file").verdict,
        Verdict::Met
    );

    // 1.3× safs and only 3.5× ahead: the ceilings and floors bite.
    let r = pefs_results(1.3, 3.5);
    assert_eq!(
        verdict(&r, "safs-enc", "T5: ≤ 1.2×").verdict,
        Verdict::Missed
    );
    assert_eq!(
        verdict(&r, "safs-enc", "creates ≥ 4×").verdict,
        Verdict::Missed
    );
    assert_eq!(
        verdict(&r, "safs-enc", "listings (ls -Al) ≥ 6×").measured,
        "3.50× ahead (T5 ls -Al N=1000)"
    );
    assert_eq!(
        verdict(&r, "safs-enc", "T4: dbench ≥ 3×").verdict,
        Verdict::Met
    );

    // Behind gocryptfs on one row: named in the verdict.
    let mut r = pefs_results(1.1, 6.5);
    let m = r
        .measurements
        .iter_mut()
        .find(|m| m.target == "gocryptfs" && m.case == crate::t9::RANDOM)
        .unwrap();
    m.reps[0].value = 1e6;
    let every = verdict(&r, "safs-enc", "ahead of gocryptfs on every row");
    assert_eq!(every.verdict, Verdict::Missed);
    assert!(
        every
            .measured
            .starts_with("ahead on 32 of 33 rows; behind: T9 random 4 KiB read cold 0.0"),
        "{every:?}"
    );
}

#[test]
fn the_pefs_section_compares_costs() {
    let md = markdown(&pefs_results(1.1, 6.5));
    assert!(md.contains("## safs-enc: the pefs table"), "{md}");
    assert!(md.contains(
        "| table | case | N | unit | safs-enc | safs | safs-enc ÷ safs | gocryptfs | gocryptfs ÷ safs-enc (× ahead) | safs-enc-nodircache | safs-enc ÷ safs-enc-nodircache |"
    ), "{md}");
    // A throughput row: costs are inverted, so the ratios read the same way.
    assert!(
        md.contains("| T4 | no xattr |  | MB/s | 153 | 168 | 1.10× | 23.5 | 6.50× | 102 | 0.67× |"),
        "{md}"
    );
    assert!(
        md.contains("| T1 | set cold | 4096 | µs/op | 22.0 | 20.0 | 1.10× | n/a (ENOSPC) | — |"),
        "{md}"
    );
    // T8's growth row.
    assert!(
        md.contains("| create: growth | 1000→3000 | × | 1.00 | 1.00 | 1.00 | 1.00 |"),
        "{md}"
    );
    // The target table says what each was made as and what the daemon
    // reports of its directory cache and its transport.
    let mut r = pefs_results(1.1, 6.5);
    r.targets[1].about = Some("encrypted volume".into());
    r.targets[1].dircache_budget_bytes = Some(128 << 20);
    r.targets[1].transport = Some("io_uring, 2 queues".into());
    let md = markdown(&r);
    assert!(
        md.contains(
            "| fuse.safs (encrypted volume; directory cache ≤ 128 MiB; io_uring, 2 queues) |"
        ),
        "{md}"
    );
    assert!(
        md.contains("| `/mnt/safs-enc-nodircache` | fuse.safs (directory cache off) |"),
        "{md}"
    );
    // No encrypted target, no section.
    assert!(!markdown(&results()).contains("the pefs table"));
}

#[test]
fn skipped_targets_are_reported_with_their_reason() {
    let mut r = results();
    r.skipped.push(crate::record::Skipped {
        label: "gocryptfs".into(),
        reason: "missing gocryptfs: install with `apt-get install gocryptfs`; apt-get failed: E: Unable\nto locate | package".into(),
    });
    let md = markdown(&r);
    assert!(md.contains(
        "| gocryptfs | — | **skipped**: missing gocryptfs: install with `apt-get install gocryptfs`; apt-get failed: E: Unable to locate \\| package | | | |"
    ), "{md}");
}

#[test]
fn iops_and_throughput_are_better_higher() {
    assert!(Unit::Iops.higher_is_better());
    assert_eq!(Unit::Iops.label(), "IOPS");
    assert_eq!(
        encrypted::cost_ratio(Unit::Iops, Some(100.0), Some(400.0)),
        Some(4.0)
    );
    assert_eq!(
        encrypted::cost_ratio(Unit::UsPerOp, Some(100.0), Some(400.0)),
        Some(0.25)
    );
    assert_eq!(
        encrypted::cost_ratio(Unit::Ratio, Some(1.0), Some(2.0)),
        None
    );
}

#[test]
fn safs_s3_is_held_to_juicefs() {
    let mut r = results();
    r.targets = ["safs-s3", "juicefs", "ext4"]
        .map(|l| target(l, l == "safs-s3"))
        .into();
    r.tests = vec![Test::T1, Test::T5, Test::T6, Test::T9];
    let mut ms = Vec::new();
    let mut put = |test, case: &str, param, unit, s3: f64, jfs: f64| {
        ms.push(row(test, "safs-s3", case, param, unit, Some(s3)));
        ms.push(row(test, "juicefs", case, param, unit, Some(jfs)));
        ms.push(row(test, "ext4", case, param, unit, Some(s3)));
    };
    put(
        Test::T9,
        crate::t9::WRITE,
        None,
        Unit::MbPerSec,
        290.0,
        280.0,
    );
    put(
        Test::T9,
        crate::t9::READ,
        None,
        Unit::MbPerSec,
        300.0,
        450.0,
    );
    put(
        Test::T9,
        crate::t9::READ_HOT,
        None,
        Unit::MbPerSec,
        20_000.0,
        5_000.0,
    );
    put(Test::T6, "create+write", None, Unit::UsPerOp, 400.0, 5000.0);
    put(Test::T6, "read cold", None, Unit::UsPerOp, 600.0, 1000.0);
    put(Test::T1, "get hot", Some(32), Unit::UsPerOp, 30.0, 300.0);
    put(Test::T1, "get cold", Some(32), Unit::UsPerOp, 90.0, 500.0);
    put(Test::T5, "create", Some(1000), Unit::UsPerOp, 200.0, 1200.0);
    r.measurements = ms;
    let v = |w| verdict(&r, "safs-s3", w);
    assert_eq!(v("T9: sequential write").verdict, Verdict::Met);
    assert_eq!(v("T9: sequential write").measured, "1.04× juicefs");
    assert_eq!(v("T9: sequential read cold").verdict, Verdict::Missed);
    assert_eq!(v("T9: sequential read hot").verdict, Verdict::Met);
    assert_eq!(v("T6: 4 KiB files, create+write").verdict, Verdict::Met);
    assert_eq!(v("T6: 4 KiB files, read cold").verdict, Verdict::Missed);
    let t1 = v("T1: every row");
    assert_eq!(
        (t1.verdict, t1.measured.as_str()),
        (Verdict::Met, "worst 5.6× (get cold 32)")
    );
    assert_eq!(v("T5: every row").verdict, Verdict::Met);
    // Without JuiceFS in the run, nothing is said.
    r.targets.retain(|t| t.label != "juicefs");
    assert!(checks(&r).iter().all(|c| !c.what.contains("juicefs")));
}
