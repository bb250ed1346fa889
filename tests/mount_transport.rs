//! How requests reach the daemon: `-o transport=dev` serves over
//! `/dev/fuse`, `uring` over FUSE over io_uring when the kernel offers it
//! (and fails the mount with the reason when it does not), `auto` takes
//! io_uring when it can; `safs info --stats` says which, with the requests
//! each io_uring queue carried.

mod common;

use std::fs;

use common::*;
use safs_control::trace_clock_ns as now_ns;

/// The kernel's switch for FUSE over io_uring (`None`: no such support).
fn uring_enabled() -> Option<bool> {
    fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .ok()
        .map(|v| matches!(v.trim(), "Y" | "1"))
}

fn stats(v: &TestVolume) -> String {
    let out = safs(["info".as_ref(), "--stats".as_ref(), v.mnt().as_os_str()]);
    out.assert_success("safs info --stats");
    out.stdout.clone()
}

/// The per-queue counts `safs info --stats` prints for an io_uring session.
fn queue_counts(stats: &str) -> Option<Vec<u64>> {
    let line = stats
        .lines()
        .find(|l| l.starts_with("transport:      FUSE over io_uring"))?;
    let counts = line.split("requests per queue: ").nth(1)?;
    Some(counts.split(' ').map(|c| c.parse().unwrap()).collect())
}

/// A little of everything, so that every kind of request crosses the
/// transport: create, write, read, xattrs, listing, rename, unlink.
fn workload(v: &TestVolume) {
    fs::create_dir(v.path("d")).unwrap();
    for i in 0..50 {
        let p = v.path(format!("d/f{i}"));
        fs::write(&p, format!("contents {i}").repeat(100)).unwrap();
        setxattr(&p, "user.k", &[i as u8; 300], 0).unwrap();
    }
    assert_eq!(fs::read_dir(v.path("d")).unwrap().count(), 50);
    for i in 0..50 {
        let p = v.path(format!("d/f{i}"));
        assert_eq!(getxattr(&p, "user.k").unwrap(), vec![i as u8; 300]);
        assert_eq!(
            fs::read(&p).unwrap(),
            format!("contents {i}").repeat(100).into_bytes()
        );
        fs::rename(&p, v.path(format!("d/g{i}"))).unwrap();
        fs::remove_file(v.path(format!("d/g{i}"))).unwrap();
    }
    fs::remove_dir(v.path("d")).unwrap();
}

/// `safs mount` of a formatted, unmounted `v` with `-o option`.
fn mount_with(v: &TestVolume, option: &str) -> CmdOutput {
    safs([
        "mount".as_ref(),
        v.vol().as_os_str(),
        v.mnt().as_os_str(),
        "-o".as_ref(),
        option.as_ref(),
    ])
}

#[test]
fn transport_dev_serves_over_dev_fuse() {
    let v = TestVolume::with_options(&["transport=dev"]);
    workload(&v);
    let s = stats(&v);
    assert!(s.contains("transport:      /dev/fuse"), "{s}");
    assert_eq!(queue_counts(&s), None);
}

#[test]
fn transport_uring_and_auto_use_io_uring_when_the_kernel_offers_it() {
    match uring_enabled() {
        Some(true) => {
            for option in ["transport=uring", "transport=auto"] {
                let v = TestVolume::with_options(&[option]);
                let before: u64 = queue_counts(&stats(&v))
                    .unwrap_or_else(|| panic!("{option}: not served over io_uring"))
                    .iter()
                    .sum();
                workload(&v);
                let s = stats(&v);
                let counts = queue_counts(&s).unwrap();
                let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
                // One queue per possible CPU (at least the online ones).
                assert!(counts.len() >= cpus, "one queue per CPU: {s}");
                let after: u64 = counts.iter().sum();
                // 50 files: at least a create, a write, a setxattr, a
                // getxattr, a read, a rename and an unlink each.
                assert!(after - before >= 350, "{option}: {before} → {after}: {s}");
                assert!(v.daemon_log().contains("uring=true"), "{}", v.daemon_log());
            }
        }
        Some(false) => {
            // The kernel has the transport but it is switched off: `uring`
            // fails the mount and says why, `auto` falls back to /dev/fuse.
            let v = TestVolume::formatted(&[]);
            let out = mount_with(&v, "transport=uring");
            out.assert_failure_with_message("transport=uring with enable_uring=N");
            assert!(
                out.stderr.contains("does not offer FUSE over io_uring"),
                "{}",
                out.stderr
            );
            assert!(!is_fuse_mounted(v.mnt()));
            let v = TestVolume::with_options(&["transport=auto"]);
            workload(&v);
            assert!(stats(&v).contains("transport:      /dev/fuse"));
        }
        None => {
            // No FUSE over io_uring in this kernel at all: the same refusal.
            let v = TestVolume::formatted(&[]);
            let out = mount_with(&v, "transport=uring");
            out.assert_failure_with_message("transport=uring on a kernel without it");
            assert!(!is_fuse_mounted(v.mnt()));
        }
    }
}

#[test]
fn a_bad_transport_is_refused_clearly() {
    let v = TestVolume::formatted(&[]);
    let out = mount_with(&v, "transport=smoke-signals");
    out.assert_failure_with_message("transport=smoke-signals");
    assert!(
        out.stderr
            .contains("option transport takes auto, uring or dev"),
        "{}",
        out.stderr
    );
    assert!(!is_fuse_mounted(v.mnt()));
}

/// Pins the calling thread to `cpu`.
#[allow(unsafe_code)]
fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is the empty set; `cpu` is below its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

/// The requests `safs info --stats` says came from a caller that had moved.
fn caller_moves(stats: &str) -> u64 {
    let line = stats
        .lines()
        .find(|l| l.contains("came from a caller the scheduler had moved"))
        .unwrap_or_else(|| panic!("no caller-move line: {stats}"));
    line.split_whitespace().next().unwrap().parse().unwrap()
}

/// The scheduling policy of each io_uring queue thread of the daemon
/// serving `v` (field 41 of `/proc/PID/task/TID/stat`).
fn queue_policies(v: &TestVolume) -> Vec<u32> {
    let pid = daemon_pid(v.vol());
    let mut policies = Vec::new();
    for t in fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = t.unwrap().path();
        let comm = fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.starts_with("safs-uring-") {
            continue;
        }
        let stat = fs::read_to_string(dir.join("stat")).unwrap();
        // Fields after the command name, which ends with the last ')'.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let policy = rest.split(' ').nth(41 - 3).unwrap().parse().unwrap();
        policies.push(policy);
    }
    policies
}

#[test]
fn io_uring_queue_threads_let_their_callers_keep_their_cpu() {
    if uring_enabled() != Some(true) || std::thread::available_parallelism().unwrap().get() < 2 {
        // Nothing to yield over /dev/fuse; nowhere to move on one CPU.
        return;
    }
    const SCHED_OTHER: u32 = 0;
    const SCHED_IDLE: u32 = 5;
    for (option, waiting) in [
        ("uring_yield=1", SCHED_IDLE),
        ("uring_yield=0", SCHED_OTHER),
    ] {
        let v = TestVolume::with_options(&["transport=uring", option]);
        let f = v.path("f");
        fs::write(&f, b"x").unwrap();
        setxattr(&f, "user.k", b"v", 0).unwrap();
        let f2 = f.clone();
        let (moved_pinned, moved_hopping) = std::thread::spawn(move || {
            pin(0);
            getxattr(&f2, "user.k").unwrap();
            let before = caller_moves(&stats(&v));
            for _ in 0..300 {
                getxattr(&f2, "user.k").unwrap();
            }
            let pinned = caller_moves(&stats(&v)) - before;
            // A caller moved between CPUs at every request.
            let before = caller_moves(&stats(&v));
            for i in 0..300 {
                pin(i % 2);
                getxattr(&f2, "user.k").unwrap();
            }
            let hopping = caller_moves(&stats(&v)) - before;
            let policies = queue_policies(&v);
            assert!(!policies.is_empty(), "no queue thread found");
            // Between requests every queue thread waits.
            assert!(
                policies.iter().all(|p| *p == waiting),
                "{option}: waiting queue threads' policies {policies:?}"
            );
            (pinned, hopping)
        })
        .join()
        .unwrap();
        assert_eq!(moved_pinned, 0, "{option}: a pinned caller never moved");
        assert!(
            (299..=300).contains(&moved_hopping),
            "{option}: {moved_hopping} of 300 requests counted as moved"
        );
    }
}

/// The daemon's request trace (what the bench splits round trips with):
/// armed over the control socket, each request's arrival and reply fall
/// inside the system call that made it, on both transports; taken, the
/// trace is off.
#[test]
fn a_trace_places_each_request_inside_its_call() {
    const GETXATTR: u32 = 22;
    for transport in ["transport=dev", "transport=auto"] {
        let v = TestVolume::with_options(&[transport]);
        let f = v.path("f");
        fs::write(&f, b"x").unwrap();
        assert_eq!(getxattr(&f, "user.absent"), Err(nix::errno::Errno::ENODATA));

        safs_control::trace_start(v.vol(), 1000).unwrap();
        let calls: Vec<(u64, u64)> = (0..20)
            .map(|_| {
                let began = now_ns();
                assert_eq!(getxattr(&f, "user.absent"), Err(nix::errno::Errno::ENODATA));
                (began, now_ns())
            })
            .collect();
        let trace = safs_control::trace_take(v.vol()).unwrap();
        let gets: Vec<_> = trace.iter().filter(|r| r.opcode == GETXATTR).collect();
        assert_eq!(gets.len(), 20, "{transport}: {trace:?}");
        for (r, (began, ended)) in gets.iter().zip(&calls) {
            assert!(
                *began <= r.arrived_ns && r.arrived_ns <= r.answered_ns && r.answered_ns <= *ended,
                "{transport}: {r:?} outside its call {began}..{ended}"
            );
        }

        assert_eq!(getxattr(&f, "user.absent"), Err(nix::errno::Errno::ENODATA));
        assert!(
            safs_control::trace_take(v.vol()).unwrap().is_empty(),
            "{transport}: still tracing"
        );
        let e = safs_control::trace_start(v.vol(), usize::MAX)
            .map(|()| safs_control::trace_take(v.vol()).unwrap().len());
        assert!(
            matches!(e, Ok(0)),
            "{transport}: a huge trace is bounded, not refused: {e:?}"
        );
        let bad = safs_control::request(v.vol(), "trace many")
            .unwrap_err()
            .to_string();
        assert!(bad.contains("trace needs a number"), "{bad}");
    }
}

/// Over io_uring the one `/dev/fuse` reader gathers FORGETs: files
/// removed one after the other are forgotten in batches (a BATCH_FORGET
/// for many), and every one of them is freed all the same.
#[test]
fn forgets_beside_io_uring_come_in_batches_and_free_every_file() {
    const FORGET: u32 = 2;
    const BATCH_FORGET: u32 = 42;
    const FILES: usize = 300;
    let v = TestVolume::with_options(&["transport=auto"]);
    let used = || {
        let s = nix::sys::statvfs::statvfs(v.mnt()).unwrap();
        s.files() - s.files_free()
    };
    let before = used();
    fs::create_dir(v.path("d")).unwrap();
    for i in 0..FILES {
        fs::write(v.path(format!("d/f{i}")), b"x").unwrap();
    }
    safs_control::trace_start(v.vol(), 10_000).unwrap();
    for i in 0..FILES {
        fs::remove_file(v.path(format!("d/f{i}"))).unwrap();
    }
    fs::remove_dir(v.path("d")).unwrap();
    assert!(
        wait_until(std::time::Duration::from_secs(10), || used() == before),
        "inodes in use {} after the removes, {before} before",
        used()
    );
    let trace = safs_control::trace_take(v.vol()).unwrap();
    let count = |op| trace.iter().filter(|r| r.opcode == op).count();
    let (single, batches) = (count(FORGET), count(BATCH_FORGET));
    if queue_counts(&stats(&v)).is_some() {
        assert!(batches >= 1, "no BATCH_FORGET: {single} FORGETs");
        assert!(
            single + batches < FILES / 2,
            "{single} FORGETs and {batches} BATCH_FORGETs for {FILES} files"
        );
    }
}
