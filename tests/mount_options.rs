//! Mount options: every option mount(8) passes reaches the daemon or is
//! refused with a message (xfstests generic/184, 306, 434 need `dev` and
//! `suid` through `mount -t fuse.safs`), the kernel's per-mount flags are
//! the ones asked for, and access times follow `relatime`, `noatime`,
//! `strictatime`, `nodiratime` and `ro` as the kernel defines them
//! (generic/003), on both data paths.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

/// `mount -t fuse.safs <vol> <mnt> -o <opts>`.
fn mount_t(v: &TestVolume, opts: &str) -> CmdOutput {
    run_cmd(
        Command::new("mount")
            .args(["-t", "fuse.safs"])
            .arg(v.vol())
            .arg(v.mnt())
            .args(["-o", opts]),
    )
}

/// The per-mount options of the mount at `mnt`, from /proc/self/mountinfo.
fn mount_flags(mnt: &Path) -> Vec<String> {
    let mnt = std::fs::canonicalize(mnt).unwrap();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some(mnt.to_str().unwrap()))
        .unwrap_or_else(|| panic!("{} is not mounted", mnt.display()));
    line.split(' ')
        .nth(5)
        .unwrap()
        .split(',')
        .map(str::to_string)
        .collect()
}

fn unmount_t(v: &mut TestVolume) {
    v.unmount();
}

#[test]
fn mount_t_fuse_safs_passes_every_option_to_the_daemon() {
    let _h = MountHelper::install();
    let mut v = TestVolume::formatted(&[]);

    // What mount(8) leaves out (dev, suid, exec: mount(2)'s defaults) is
    // honoured, as every FUSE helper does; the rest arrives as given.
    mount_t(&v, "allow_other,dev,suid,noexec,nodiratime,strictatime")
        .assert_success("mount -t fuse.safs with options");
    v.adopt_mount();
    let flags = mount_flags(v.mnt());
    for absent in ["nodev", "nosuid", "relatime", "noatime"] {
        assert!(
            !flags.contains(&absent.to_string()),
            "{absent} in {flags:?}"
        );
    }
    for present in ["noexec", "nodiratime"] {
        assert!(
            flags.contains(&present.to_string()),
            "{present} missing: {flags:?}"
        );
    }
    // A device node works (it would be EACCES on a nodev mount).
    mknod(&v.path("null"), libc::S_IFCHR | 0o666, libc::makedev(1, 3)).unwrap();
    std::fs::write(v.path("null"), b"into the void").unwrap();
    unmount_t(&mut v);

    // Nothing said: dev and suid through mount(8), relatime.
    mount_t(&v, "allow_other").assert_success("mount -t fuse.safs");
    v.adopt_mount();
    let flags = mount_flags(v.mnt());
    assert!(flags.contains(&"relatime".to_string()), "{flags:?}");
    assert!(!flags.contains(&"nodev".to_string()), "{flags:?}");
    // Remounting changes the kernel's flags, and keeps the others.
    run_cmd(
        Command::new("mount")
            .args(["-o", "remount,noatime"])
            .arg(v.mnt()),
    )
    .assert_success("mount -o remount,noatime");
    let flags = mount_flags(v.mnt());
    assert!(flags.contains(&"noatime".to_string()), "{flags:?}");
    assert!(
        !flags.contains(&"nodev".to_string()),
        "remount lost dev: {flags:?}"
    );
    unmount_t(&mut v);

    // `safs mount` itself keeps the FUSE default: nodev, nosuid.
    v.set_options(&["noatime"]);
    v.mount();
    let flags = mount_flags(v.mnt());
    for present in ["nodev", "nosuid", "noatime"] {
        assert!(
            flags.contains(&present.to_string()),
            "{present} missing: {flags:?}"
        );
    }
    v.unmount();

    // Options safs cannot honour are refused, saying why; nothing mounted.
    // (SELinux `context=` options never reach a helper: mount(8) keeps them.)
    for (opt, why) in [
        ("mand", "mandatory locks"),
        ("iversion", "version"),
        ("bogus_option", "unknown mount option 'bogus_option'"),
    ] {
        let out = mount_t(&v, &format!("allow_other,{opt}"));
        assert!(!out.status.success(), "-o {opt} was accepted");
        assert!(out.stderr.contains(why), "-o {opt}: {}", out.stderr);
        assert!(!is_fuse_mounted(v.mnt()), "-o {opt} left a mount");
    }
}

fn atime_of(p: &Path) -> (i64, i64) {
    let m = std::fs::metadata(p).unwrap();
    (m.atime(), m.atime_nsec())
}

fn read(p: &Path) {
    let _ = std::fs::read(p).unwrap();
}

/// Longer than the coarse clock of the filesystem under the volume.
fn tick() {
    std::thread::sleep(Duration::from_millis(30));
}

/// generic/003's sequence on one mount option set, both data paths.
fn check_atime_rules(data_path: &str) {
    // relatime (the default): the first read after a change moves atime,
    // the next does not; a change re-arms it; listing a directory moves
    // its atime the same way.
    let mut v = TestVolume::with_options(&[data_path]);
    let f = v.path("f");
    let d = v.path("d");
    std::fs::write(&f, b"aaa").unwrap();
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("x"), b"").unwrap();
    let a0 = atime_of(&f);
    tick();
    read(&f);
    let a1 = atime_of(&f);
    assert!(
        a1 > a0,
        "relatime: the first read after a write moves atime"
    );
    tick();
    read(&f);
    assert_eq!(atime_of(&f), a1, "relatime: a second read does not");
    tick();
    std::fs::write(&f, b"bbb").unwrap();
    tick();
    read(&f);
    assert!(atime_of(&f) > a1, "relatime: a read after a change does");
    let d0 = atime_of(&d);
    tick();
    let _ = std::fs::read_dir(&d).unwrap().count();
    assert!(atime_of(&d) > d0, "relatime: listing a changed directory");
    // It lasts: the atime is in the volume, not only in the kernel.
    let kept = atime_of(&f);
    v.remount();
    assert_eq!(atime_of(&f), kept, "atime survives a remount");

    // noatime: reads never move it.
    v.unmount();
    v.set_options(&[data_path, "noatime"]);
    v.mount();
    std::fs::write(v.path("g"), b"ccc").unwrap();
    let g0 = atime_of(&v.path("g"));
    tick();
    read(&v.path("g"));
    assert_eq!(atime_of(&v.path("g")), g0, "noatime");

    // strictatime: every read does; nodiratime keeps directories out.
    v.unmount();
    v.set_options(&[data_path, "strictatime", "nodiratime"]);
    v.mount();
    let g1 = atime_of(&v.path("g"));
    tick();
    read(&v.path("g"));
    let g2 = atime_of(&v.path("g"));
    assert!(g2 > g1, "strictatime: first read");
    tick();
    read(&v.path("g"));
    assert!(atime_of(&v.path("g")) > g2, "strictatime: every read");
    std::fs::write(d.join("y"), b"").unwrap();
    let d1 = atime_of(&d);
    tick();
    let _ = std::fs::read_dir(&d).unwrap().count();
    assert_eq!(atime_of(&d), d1, "nodiratime");

    // ro: nothing moves.
    v.unmount();
    v.set_options(&[data_path, "ro", "strictatime"]);
    v.mount();
    let g3 = atime_of(&v.path("g"));
    tick();
    read(&v.path("g"));
    assert_eq!(atime_of(&v.path("g")), g3, "a read-only mount");
}

#[test]
fn access_times_follow_the_mount_options_under_passthrough() {
    check_atime_rules("passthrough");
}

#[test]
fn access_times_follow_the_mount_options_on_the_daemon_data_path() {
    check_atime_rules("nopassthrough");
}

/// `mount -o remount,noatime` reaches the daemon, not only the kernel.
#[test]
fn remount_changes_the_daemons_atime_rules() {
    let _h = MountHelper::install();
    let mut v = TestVolume::formatted(&[]);
    mount_t(&v, "allow_other,strictatime").assert_success("mount -t fuse.safs");
    v.adopt_mount();
    let f = v.path("f");
    std::fs::write(&f, b"x").unwrap();
    tick();
    read(&f);
    let a = atime_of(&f);
    run_cmd(
        Command::new("mount")
            .args(["-o", "remount,noatime"])
            .arg(v.mnt()),
    )
    .assert_success("mount -o remount,noatime");
    tick();
    read(&f);
    assert_eq!(atime_of(&f), a, "noatime after remount");
    unmount_t(&mut v);
}

/// The mount's read-ahead, from its backing-dev-info in sysfs.
fn read_ahead_kb(mnt: &Path) -> u32 {
    let dev = std::fs::metadata(mnt).unwrap().dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    std::fs::read_to_string(format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// A sequential read the daemon serves comes in READs of `max_pages`
/// (1 MiB), not the kernel's default 128 KiB read-ahead: the mount sets
/// its read-ahead once INIT is answered; `read_ahead_kb=` sets another.
#[test]
fn sequential_reads_the_daemon_serves_come_a_mebibyte_at_a_time() {
    use std::io::Read;
    let mut v = TestVolume::with_options(&["nopassthrough"]);
    assert_eq!(read_ahead_kb(v.mnt()), 4096, "the default read-ahead");
    let size = 16 << 20;
    let bytes: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4096) as u8).collect();
    std::fs::write(v.path("big"), &bytes).unwrap();
    v.remount(); // nothing of the file in the page cache

    let before = served(&v, "read");
    let mut f = std::fs::File::open(v.path("big")).unwrap();
    let mut back = Vec::new();
    let mut buf = vec![0u8; 64 << 10]; // reads smaller than a READ
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        back.extend_from_slice(&buf[..n]);
    }
    assert!(back == bytes, "the file read back differs");
    let reads = served(&v, "read") - before;
    // 16 at 1 MiB (a READ of the end finding nothing may add one); the
    // kernel's own read-ahead would take 128.
    assert!((16..=20).contains(&reads), "{reads} READs for 16 MiB");

    drop(f);
    v.unmount();
    v.set_options(&["nopassthrough", "read_ahead_kb=512"]);
    v.mount();
    assert_eq!(read_ahead_kb(v.mnt()), 512, "read_ahead_kb=512");
    v.unmount();

    for bad in ["read_ahead_kb", "read_ahead_kb=x", "read_ahead_kb=2000000"] {
        let out = safs([
            "mount".as_ref(),
            v.vol().as_os_str(),
            v.mnt().as_os_str(),
            "-o".as_ref(),
            bad.as_ref(),
        ]);
        out.assert_failure_with_message(bad);
        assert!(
            out.stderr.contains("read_ahead_kb"),
            "{bad}: {}",
            out.stderr
        );
        assert!(!v.is_mounted(), "{bad} mounted");
    }
}
