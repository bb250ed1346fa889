//! `-o metrics=ADDRESS:PORT`: a real mount serves Prometheus's text format
//! at /metrics; `promtool check metrics` accepts it, a real Prometheus
//! server (Debian's) scrapes it and answers a query with the daemon's
//! figures, and a bad address or a port already taken fails the mount
//! with a message, leaving nothing mounted.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` from 127.0.0.1:`port`: (status line, body).
fn http_get(port: u16, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    )
}

/// The value of the sample line `name` (exactly, labels included).
fn value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn metrics_are_served_checked_by_promtool_and_scraped_by_prometheus() {
    let port = free_port();
    let v = TestVolume::with_options(&[&format!("metrics=127.0.0.1:{port}")]);
    for i in 0..40 {
        let f = v.path(format!("f{i}"));
        write_file(&f, b"x");
        setxattr(&f, "user.a", b"1", 0).unwrap();
        getxattr(&f, "user.a").unwrap();
    }
    let (status, text) = http_get(port, "/metrics");
    assert!(status.contains("200"), "{status}");
    assert!(
        value(&text, "safs_requests_total{op=\"setxattr\"}").unwrap() >= 40.0,
        "{text}"
    );
    // Each histogram's +Inf bucket is its count.
    for l in text
        .lines()
        .filter(|l| l.starts_with("safs_request_duration_seconds_count{"))
    {
        let op = &l["safs_request_duration_seconds_count{".len()..l.find('}').unwrap()];
        let count: f64 = l.rsplit(' ').next().unwrap().parse().unwrap();
        let inf = value(
            &text,
            &format!("safs_request_duration_seconds_bucket{{{op},le=\"+Inf\"}}"),
        );
        assert_eq!(inf, Some(count), "{op}");
    }
    assert!(value(&text, "safs_engine_commits_total").unwrap() > 0.0);
    // The getxattrs' inodes were in the cache.
    assert!(
        value(&text, "safs_inode_cache_loads_total{result=\"hit\"}").unwrap() >= 40.0,
        "{text}"
    );
    assert!(value(&text, "safs_dircache_lookups_total{result=\"miss\"}").is_some());
    assert_eq!(value(&text, "safs_commits_failing"), Some(0.0));
    assert!(http_get(port, "/").0.contains("404"));

    // promtool's linter accepts the exposition.
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (apt-get install prometheus)");
    check
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // A real Prometheus scrapes it every second.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: safs\n    \
             static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        ),
    )
    .unwrap();
    let web = free_port();
    let server = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{web}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
        .spawn()
        .expect("prometheus (apt-get install prometheus)");
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _server = Stop(server);
    let query = "/api/v1/query?query=safs_requests_total%7Bop%3D%22setxattr%22%7D";
    let scraped = wait_until(Duration::from_secs(60), || {
        TcpStream::connect(("127.0.0.1", web)).is_ok() && {
            let (_, body) = http_get(web, query);
            body.contains("\"job\":\"safs\"") && body.contains("\"op\":\"setxattr\"")
        }
    });
    assert!(
        scraped,
        "Prometheus never had the sample: {}\nlog: {}",
        http_get(web, query).1,
        std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default()
    );
    let (_, body) = http_get(web, query);
    // "value":[<time>,"<n>"]: the count the daemon served.
    let n: f64 = body
        .rsplit_once(",\"")
        .and_then(|(_, v)| v.split('"').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{body}"));
    assert!(n >= 40.0, "{body}");

    // Every query of the Grafana dashboard in docs/ is one Prometheus
    // takes, and it answers it with data from this mount.
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/grafana/safs-dashboard.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let exprs: Vec<String> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().replace("$instance", ".*"))
        .collect();
    assert!(exprs.len() >= 9);
    for e in &exprs {
        let (_, body) = http_get(web, &format!("/api/v1/query?query={}", encode(e)));
        assert!(body.contains("\"status\":\"success\""), "{e}: {body}");
    }
    // A rate needs two scrapes of the series.
    let rates = format!("/api/v1/query?query={}", encode(&exprs[0]));
    let has = || http_get(web, &rates).1.contains("\"op\":\"getxattr\"");
    assert!(
        wait_until(Duration::from_secs(30), has),
        "{}: {}",
        exprs[0],
        http_get(web, &rates).1
    );
}

/// `s` percent-encoded for a URL's query.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn a_bad_metrics_address_or_a_taken_port_fails_the_mount_clearly() {
    let v = TestVolume::formatted(&[]);
    let mount = |opt: &str| {
        safs([
            "mount",
            v.vol().to_str().unwrap(),
            v.mnt().to_str().unwrap(),
            "-o",
            opt,
        ])
    };
    for bad in [
        "metrics",
        "metrics=",
        "metrics=localhost",
        "metrics=127.0.0.1:99999",
    ] {
        let out = mount(bad);
        out.assert_failure_with_message(bad);
        assert!(out.stderr.contains("ADDRESS:PORT"), "{bad}: {}", out.stderr);
        assert!(!is_fuse_mounted(v.mnt()), "{bad}");
    }
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let out = mount(&format!("metrics=127.0.0.1:{port}"));
    out.assert_failure_with_message("a taken port");
    assert!(
        out.stderr
            .contains(&format!("cannot serve metrics on 127.0.0.1:{port}")),
        "{}",
        out.stderr
    );
    assert!(!is_fuse_mounted(v.mnt()));
    assert!(wait_until(Duration::from_secs(10), || {
        !v.vol().join("control.sock").exists()
    }));
}

/// `safs stats`: frames with the interval's requests per operation; it
/// ends after `--count` frames, on Ctrl-C, and when the mount goes away
/// (saying so), each with exit 0; an unmounted volume is an error.
#[test]
fn safs_stats_shows_live_rates_and_ends_cleanly() {
    let mut v = TestVolume::new();
    let f = v.path("f");
    write_file(&f, b"x");
    setxattr(&f, "user.a", b"1", 0).unwrap();
    let busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let load = {
        let (busy, f) = (std::sync::Arc::clone(&busy), f.clone());
        std::thread::spawn(move || {
            while busy.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = getxattr(&f, "user.a");
            }
        })
    };
    let mnt = v.mnt().to_str().unwrap().to_string();
    let out = safs(["stats", &mnt, "--interval", "0.3", "--count", "2"]);
    busy.store(false, std::sync::atomic::Ordering::Relaxed);
    load.join().unwrap();
    out.assert_success("safs stats --count 2");
    assert_eq!(
        out.stdout.matches("safs stats: ").count(),
        2,
        "{}",
        out.stdout
    );
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("getxattr"))
        .unwrap_or_else(|| panic!("{}", out.stdout));
    let rate: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(rate > 10.0, "{line}");

    // Ctrl-C ends it at once.
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_safs"))
            .args(["stats", &mnt, "--interval", "0.2"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut child = spawn();
    // Its first line: it is running (and has its signal handlers).
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut first,
    )
    .unwrap();
    assert!(first.starts_with("safs stats: "), "{first}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "after Ctrl-C: {:?}", out.status);

    // The mount goes away under it.
    let child = spawn();
    std::thread::sleep(Duration::from_millis(500));
    v.unmount();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("the mount went away"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let out = safs(["stats", v.vol().to_str().unwrap()]);
    out.assert_failure_with_message("safs stats of an unmounted volume");
    assert!(out.stderr.contains("not mounted"), "{}", out.stderr);
}

/// On a volume two daemons serve (PostgreSQL), the metrics say how often
/// the write lease was taken and how long operations waited for it.
#[test]
fn a_shared_volume_exports_its_write_lease() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = safs::meta::postgres::cluster::TempCluster::start(dir.path()).unwrap();
    cluster.create_database("vol").unwrap();
    let port = free_port();
    let mut v = TestVolume::formatted(&["--meta", &cluster.conninfo("vol")]);
    v.set_options(&[&format!("metrics=127.0.0.1:{port}")]);
    v.mount();
    let other = v.root().join("mnt2");
    std::fs::create_dir(&other).unwrap();
    safs(["mount", v.vol().to_str().unwrap(), other.to_str().unwrap()])
        .assert_success("second mount");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = umount_once_released(&self.0);
        }
    }
    let _other = Unmount(other.clone());
    // Writers on both mounts take turns with the lease.
    for i in 0..20 {
        write_file(&v.path(format!("a{i}")), b"a");
        write_file(&other.join(format!("b{i}")), b"b");
    }
    let (_, text) = http_get(port, "/metrics");
    let takes = value(&text, "safs_lease_takes_total").unwrap_or_else(|| panic!("{text}"));
    assert!(takes >= 2.0, "{text}");
    assert!(
        value(&text, "safs_lease_wait_seconds_total").unwrap() > 0.0,
        "{text}"
    );
}
