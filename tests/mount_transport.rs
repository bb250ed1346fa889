//! How requests reach the daemon: `-o transport=dev` serves over
//! `/dev/fuse`, `uring` over FUSE over io_uring when the kernel offers it
//! (and fails the mount with the reason when it does not), `auto` takes
//! io_uring when it can; `safs info --stats` says which, with the requests
//! each io_uring queue carried.

mod common;

use std::fs;

use common::*;

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
