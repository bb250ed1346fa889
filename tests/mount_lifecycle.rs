//! The command line and the life of a mount: `safs format` refusals and
//! `--force`, `safs mount` (background and `-f`), the single-daemon lock,
//! every way to unmount (umount, fusermount3 -u, SIGTERM, SIGINT) keeping the
//! data, `ro`, `sync`, `allow_other`, `safs info`, and bad arguments.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use nix::sys::signal::{Signal, kill};

const WAIT: Duration = Duration::from_secs(10);

/// Creates a recognisable tree: files, a directory, a symlink, modes and
/// xattrs in every tier.
fn populate(v: &TestVolume) {
    fs::create_dir(v.path("dir")).unwrap();
    write_file(&v.path("dir/a"), &pattern(1, 10_000));
    write_file(&v.path("small"), b"small file");
    symlink("dir/a", v.path("link")).unwrap();
    chmod(&v.path("small"), 0o640);
    setxattr(&v.path("small"), "user.inline", b"tiny", 0).unwrap();
    setxattr(&v.path("small"), "user.spill", &pattern(2, 3000), 0).unwrap();
    setxattr(&v.path("dir/a"), "user.overflow", &pattern(3, 65536), 0).unwrap();
}

#[track_caller]
fn verify_populated(v: &TestVolume) {
    let names = list_dir(v.mnt());
    for n in ["dir", "link", "small"] {
        assert!(
            names.iter().any(|x| x == n),
            "{n} missing from the root: {names:?}"
        );
    }
    assert_eq!(list_dir(&v.path("dir")), ["a"]);
    assert_eq!(read_file(&v.path("dir/a")), pattern(1, 10_000));
    assert_eq!(read_file(&v.path("small")), b"small file");
    assert_eq!(fs::read_link(v.path("link")).unwrap().as_os_str(), "dir/a");
    assert_eq!(mode_of(&v.path("small")) & 0o7777, 0o640);
    assert_eq!(getxattr(&v.path("small"), "user.inline").unwrap(), b"tiny");
    assert_eq!(
        getxattr(&v.path("small"), "user.spill").unwrap(),
        pattern(2, 3000)
    );
    assert_eq!(
        getxattr(&v.path("dir/a"), "user.overflow").unwrap(),
        pattern(3, 65536)
    );
}

/// Detaches a mount that a buggy command should not have made.
fn cleanup_stray_mount(p: &Path) {
    if is_fuse_mounted(p) {
        let _ = run_cmd(Command::new("umount").arg("-l").arg(p));
    }
}

/// The first token shaped like a UUID (8-4-4-4-12 hex digits).
fn find_uuid(text: &str) -> Option<String> {
    text.split(|c: char| !(c.is_ascii_hexdigit() || c == '-'))
        .find(|tok| {
            let parts: Vec<&str> = tok.split('-').collect();
            parts.len() == 5
                && parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12])
                && parts
                    .iter()
                    .all(|p| p.chars().all(|c| c.is_ascii_hexdigit()))
        })
        .map(str::to_lowercase)
}

#[test]
fn mount_returns_only_once_live_and_a_daemon_keeps_serving() {
    // TestVolume::new() already asserts the mount is in the mount table
    // when `safs mount` returns; here: usable at once, and served by a
    // daemon that outlives the command.
    let v = TestVolume::new();
    let st = statfs(v.mnt());
    assert_eq!(st.f_type, FUSE_SUPER_MAGIC);
    write_file(&v.path("immediately"), b"usable");
    assert_eq!(read_file(&v.path("immediately")), b"usable");
    let pid = daemon_pid(v.vol());
    assert!(
        process_alive(pid),
        "the pid in the lock file ({pid}) is a live process"
    );
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("safs"),
        "pid {pid} in the lock file is not a safs process: {:?}",
        String::from_utf8_lossy(&cmdline)
    );
    assert_eq!(
        lock_state(v.vol()),
        LockState::Held,
        "the daemon holds the lock"
    );
}

#[test]
fn a_second_mount_of_the_same_volume_fails_clearly() {
    let v = TestVolume::new();
    populate(&v);
    let mnt2 = v.root().join("mnt2");
    fs::create_dir(&mnt2).unwrap();
    let out = safs(["mount".as_ref(), v.vol().as_os_str(), mnt2.as_os_str()]);
    let stray = is_fuse_mounted(&mnt2);
    cleanup_stray_mount(&mnt2);
    out.assert_failure_with_message("second `safs mount` of a mounted volume");
    assert!(!stray, "the second mount must not mount anything");
    // The first mount is unaffected.
    verify_populated(&v);
    write_file(&v.path("after"), b"still served");
    assert_eq!(read_file(&v.path("after")), b"still served");
    assert_eq!(lock_state(v.vol()), LockState::Held);
}

#[test]
fn unmount_releases_the_lock_and_keeps_everything() {
    let mut v = TestVolume::new();
    populate(&v);
    let pid = daemon_pid(v.vol());
    v.unmount();
    assert!(!is_fuse_mounted(v.mnt()));
    assert_ne!(lock_state(v.vol()), LockState::Held);
    assert!(
        wait_until(WAIT, || !process_alive(pid)),
        "daemon {pid} still running after unmount"
    );
    v.mount();
    verify_populated(&v);
}

/// `umount` returns before the daemon has committed its last batch and
/// released the volume: a `safs mount` or `safs fsck` issued at once waits for
/// it instead of failing with "already mounted".
#[test]
fn mount_and_fsck_right_after_umount_wait_for_the_old_daemon() {
    let mut v = TestVolume::new();
    for round in 0..6 {
        write_file(&v.path(format!("f{round}")), b"kept");
        umount_once_released(v.mnt()).assert_success("umount");
        v.forget_mounted();
        if round % 2 == 1 {
            safs(["fsck".as_ref(), v.vol().as_os_str()]).assert_success("fsck right after umount");
        }
        // No waiting for the lock: that is the point. And quietly
        // (xfstests compares what mount prints).
        let out = safs(v.mount_args());
        out.assert_success("safs mount right after umount");
        assert_eq!(
            (out.stdout.as_str(), out.stderr.as_str()),
            ("", ""),
            "a mount right after umount says nothing"
        );
        v.adopt_mount();
    }
    for round in 0..6 {
        assert_eq!(read_file(&v.path(format!("f{round}"))), b"kept");
    }
}

#[test]
fn sigterm_unmounts_cleanly_and_keeps_data() {
    signal_unmounts_cleanly(Signal::SIGTERM);
}

#[test]
fn sigint_unmounts_cleanly_and_keeps_data() {
    signal_unmounts_cleanly(Signal::SIGINT);
}

fn signal_unmounts_cleanly(sig: Signal) {
    let mut v = TestVolume::new();
    populate(&v);
    // Unsynced changes right before the signal must be flushed too.
    write_file(&v.path("last_second"), b"written just before the signal");
    setxattr(&v.path("last_second"), "user.late", b"late", 0).unwrap();
    let pid = daemon_pid(v.vol());
    kill(pid, sig).unwrap();
    assert!(
        wait_until(WAIT, || !is_fuse_mounted(v.mnt())),
        "{sig} did not unmount {}",
        v.mnt().display()
    );
    assert!(
        wait_until(WAIT, || !process_alive(pid)),
        "daemon did not exit on {sig}"
    );
    assert!(v.wait_lock_released(WAIT), "lock not released after {sig}");
    v.forget_mounted();
    v.mount();
    verify_populated(&v);
    assert_eq!(
        read_file(&v.path("last_second")),
        b"written just before the signal"
    );
    assert_eq!(
        getxattr(&v.path("last_second"), "user.late").unwrap(),
        b"late"
    );
}

#[test]
fn fusermount3_u_unmounts_cleanly_and_keeps_data() {
    let mut v = TestVolume::new();
    populate(&v);
    let pid = daemon_pid(v.vol());
    run_cmd(Command::new("fusermount3").arg("-u").arg(v.mnt())).assert_success("fusermount3 -u");
    assert!(!is_fuse_mounted(v.mnt()));
    assert!(
        wait_until(WAIT, || !process_alive(pid)),
        "daemon did not exit"
    );
    assert!(v.wait_lock_released(WAIT));
    v.forget_mounted();
    v.mount();
    verify_populated(&v);
}

#[test]
fn foreground_mount_serves_until_unmounted() {
    let mut v = TestVolume::formatted(&[]);
    let log = File::create(v.root().join("foreground.log")).unwrap();
    let mut child = Command::new(SAFS)
        .arg("mount")
        .arg(v.vol())
        .arg(v.mnt())
        .arg("-f")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let up = wait_until(WAIT, || is_fuse_mounted(v.mnt()));
    if !up {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "`safs mount -f` did not mount within {WAIT:?}: {}",
            fs::read_to_string(v.root().join("foreground.log")).unwrap_or_default()
        );
    }
    v.adopt_mount();
    assert!(
        child.try_wait().unwrap().is_none(),
        "`safs mount -f` must stay in the foreground while mounted"
    );
    assert_eq!(
        daemon_pid(v.vol()).as_raw(),
        child.id() as i32,
        "in the foreground, the serving process is the one we started"
    );
    populate(&v);
    verify_populated(&v);
    v.unmount();
    let status = wait_child_timeout(&mut child, WAIT).expect("`safs mount -f` exits after umount");
    assert!(
        status.success(),
        "`safs mount -f` exit status after umount: {status}"
    );
    v.mount();
    verify_populated(&v);
}

#[test]
fn format_refuses_a_non_empty_directory() {
    let tmp = tempfile::tempdir_in("/tmp").unwrap();
    let dir = tmp.path().join("occupied");
    fs::create_dir(&dir).unwrap();
    write_file(&dir.join("precious.txt"), b"do not touch");
    let out = safs(["format".as_ref(), dir.as_os_str()]);
    out.assert_failure_with_message("safs format of a non-empty directory");
    assert_eq!(list_dir(&dir), ["precious.txt"], "nothing half-created");
    assert_eq!(read_file(&dir.join("precious.txt")), b"do not touch");
}

#[test]
fn format_refuses_an_existing_volume_unless_forced() {
    let mut v = TestVolume::new();
    populate(&v);
    let uuid_before = find_uuid(&safs(["info".as_ref(), v.vol().as_os_str()]).stdout)
        .expect("safs info prints a uuid");
    v.unmount();
    let out = safs(["format".as_ref(), v.vol().as_os_str()]);
    out.assert_failure_with_message("safs format of an existing volume without --force");
    v.mount();
    verify_populated(&v);
    v.unmount();

    safs(["format".as_ref(), v.vol().as_os_str(), "--force".as_ref()])
        .assert_success("safs format --force of an existing volume");
    let uuid_after = find_uuid(&safs(["info".as_ref(), v.vol().as_os_str()]).stdout)
        .expect("safs info prints a uuid");
    assert_ne!(
        uuid_before, uuid_after,
        "a re-formatted volume is a new volume"
    );
    v.mount();
    assert!(
        list_dir(v.mnt()).is_empty(),
        "the re-formatted volume is empty"
    );
}

#[test]
fn format_checks_the_inline_budget_range() {
    let tmp = tempfile::tempdir_in("/tmp").unwrap();
    for bad in ["16385", "100000", "-1", "abc", ""] {
        let dir = tmp.path().join(format!("bad{}", bad.len()));
        let out = safs([
            "format".as_ref(),
            dir.as_os_str(),
            "--inline-xattr-bytes".as_ref(),
            bad.as_ref(),
        ]);
        out.assert_failure_with_message(&format!("--inline-xattr-bytes {bad:?}"));
        assert!(
            !dir.exists() || list_dir(&dir).is_empty(),
            "a refused format left files in {}",
            dir.display()
        );
    }
    for good in ["0", "16384", "512"] {
        let dir = tmp.path().join(format!("good{good}"));
        safs([
            "format".as_ref(),
            dir.as_os_str(),
            "--inline-xattr-bytes".as_ref(),
            good.as_ref(),
        ])
        .assert_success(&format!("--inline-xattr-bytes {good}"));
        let info = safs(["info".as_ref(), dir.as_os_str()]);
        info.assert_success("safs info");
        assert!(
            info.stdout
                .split(|c: char| !c.is_ascii_digit())
                .any(|t| t == good),
            "safs info does not show the budget {good}: {}",
            info.stdout
        );
    }
}

#[test]
fn info_prints_uuid_format_version_and_budget() {
    let v = TestVolume::with_format_args(&["--inline-xattr-bytes", "777"], &[]);
    let by_vol = safs(["info".as_ref(), v.vol().as_os_str()]);
    by_vol.assert_success("safs info <volume>");
    let uuid = find_uuid(&by_vol.stdout).expect("safs info prints the volume uuid");
    assert!(
        by_vol
            .stdout
            .split(|c: char| !c.is_ascii_digit())
            .any(|t| t == "777"),
        "safs info shows the inline budget: {}",
        by_vol.stdout
    );
    assert!(
        by_vol.stdout.to_lowercase().contains("version"),
        "safs info shows the format version: {}",
        by_vol.stdout
    );
    let by_mnt = safs(["info".as_ref(), v.mnt().as_os_str()]);
    by_mnt.assert_success("safs info <mountpoint>");
    assert_eq!(
        find_uuid(&by_mnt.stdout),
        Some(uuid.clone()),
        "same volume, same uuid"
    );

    let other = TestVolume::new();
    let other_uuid = find_uuid(&safs(["info".as_ref(), other.vol().as_os_str()]).stdout);
    assert_ne!(other_uuid, Some(uuid), "each volume has its own uuid");

    let tmp = tempfile::tempdir_in("/tmp").unwrap();
    safs(["info".as_ref(), tmp.path().as_os_str()])
        .assert_failure_with_message("safs info of a directory that is no volume");
}

#[test]
fn info_into_a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let v = TestVolume::new();
    // A pipe whose reader is already gone: the first write gets EPIPE, as
    // with `safs info --stats | head -1` once head has exited.
    let (reader, writer) = nix::unistd::pipe().unwrap();
    drop(reader);
    let out = Command::new(SAFS)
        .args(["info".as_ref(), "--stats".as_ref(), v.mnt().as_os_str()])
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked"),
        "no panic on a closed stdout: {stderr}"
    );
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "ends by SIGPIPE like any Unix tool: {:?} {stderr}",
        out.status
    );
    // The daemon lives on (its control socket ignores hung-up clients).
    safs(["info".as_ref(), "--stats".as_ref(), v.mnt().as_os_str()])
        .assert_success("safs info --stats after a closed pipe");
}

#[test]
fn bad_commands_flags_and_options_exit_non_zero_with_a_message() {
    let v = TestVolume::formatted(&[]);
    let mnt = v.mnt().to_str().unwrap().to_string();
    let vol = v.vol().to_str().unwrap().to_string();
    let not_a_volume = v.root().join("not-a-volume");
    fs::create_dir(&not_a_volume).unwrap();
    let nav = not_a_volume.to_str().unwrap().to_string();
    let missing = v.root().join("missing").to_str().unwrap().to_string();
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("no arguments", vec![]),
        ("unknown command", vec!["frobnicate"]),
        ("format without a directory", vec!["format"]),
        ("mount without arguments", vec!["mount"]),
        ("mount without a mountpoint", vec!["mount", &vol]),
        ("unknown flag", vec!["mount", &vol, &mnt, "--no-such-flag"]),
        (
            "unknown mount option",
            vec!["mount", &vol, &mnt, "-o", "no_such_option"],
        ),
        (
            "mount of a directory that is no volume",
            vec!["mount", &nav, &mnt],
        ),
        ("mount of a missing volume", vec!["mount", &missing, &mnt]),
        (
            "mount on a missing mountpoint",
            vec!["mount", &vol, &missing],
        ),
        ("info without a path", vec!["info"]),
        ("info of a missing path", vec!["info", &missing]),
    ];
    let mut problems = Vec::new();
    for (what, args) in &cases {
        let out = safs(args);
        let stray = is_fuse_mounted(v.mnt());
        cleanup_stray_mount(v.mnt());
        if stray {
            problems.push(format!("{what}: mounted anyway"));
        }
        if out.success() {
            problems.push(format!("{what}: exit 0 (stdout {:?})", out.stdout));
        } else if out.stderr.trim().is_empty() {
            problems.push(format!("{what}: failed ({}) without a message", out.status));
        } else if out.status.code().is_none() {
            problems.push(format!("{what}: killed by a signal ({})", out.status));
        }
    }
    assert!(
        problems.is_empty(),
        "bad invocations:\n{}",
        problems.join("\n")
    );
    // --help works for every command.
    for cmd in [
        vec!["--help"],
        vec!["format", "--help"],
        vec!["mount", "--help"],
        vec!["info", "--help"],
    ] {
        let out = safs(&cmd);
        out.assert_success(&format!("safs {cmd:?}"));
        assert!(
            !out.stdout.trim().is_empty(),
            "safs {cmd:?} printed nothing"
        );
    }
}

#[test]
fn read_only_mount_refuses_every_change() {
    let mut v = TestVolume::new();
    populate(&v);
    v.unmount();
    v.set_options(&["ro"]);
    v.mount();
    verify_populated(&v);
    let small = v.path("small");
    let erofs = |what: &str, r: Result<(), Errno>| {
        assert_eq!(r, Err(Errno::EROFS), "{what} on a read-only mount");
    };
    erofs("create", File::create(v.path("new")).errno().map(drop));
    erofs(
        "open for write",
        OpenOptions::new()
            .write(true)
            .open(&small)
            .errno()
            .map(drop),
    );
    erofs("mkdir", fs::create_dir(v.path("newdir")).errno());
    erofs("symlink", symlink("x", v.path("newlink")).errno());
    erofs("unlink", fs::remove_file(&small).errno());
    erofs("rmdir", fs::remove_dir(v.path("dir")).errno());
    erofs("rename", fs::rename(&small, v.path("renamed")).errno());
    erofs("link", fs::hard_link(&small, v.path("hard")).errno());
    erofs("truncate", nix::unistd::truncate(&small, 0));
    erofs(
        "chmod",
        fs::set_permissions(&small, std::os::unix::fs::PermissionsExt::from_mode(0o777)).errno(),
    );
    erofs("utimensat", utimensat(&small, (1, 0), (1, 0), 0));
    erofs("setxattr", setxattr(&small, "user.new", b"x", 0));
    erofs("removexattr", removexattr(&small, "user.inline"));
    v.unmount();
    v.set_options(&[]);
    v.mount();
    verify_populated(&v);
}

/// The changes a crash test makes and later checks.
fn metadata_workload(v: &TestVolume) {
    fs::create_dir_all(v.path("a/b")).unwrap();
    for i in 0..20 {
        write_file(&v.path(format!("a/f{i}")), format!("file {i}").as_bytes());
    }
    fs::rename(v.path("a/f0"), v.path("a/b/moved")).unwrap();
    fs::rename(v.path("a/f1"), v.path("a/f2")).unwrap();
    fs::hard_link(v.path("a/f3"), v.path("a/b/f3link")).unwrap();
    fs::remove_file(v.path("a/f4")).unwrap();
    chmod(&v.path("a/f5"), 0o604);
    setxattr(&v.path("a/f6"), "user.inline", b"i", 0).unwrap();
    setxattr(&v.path("a/f6"), "user.spill", &pattern(6, 5000), 0).unwrap();
    setxattr(&v.path("a/f6"), "user.overflow", &pattern(7, 65536), 0).unwrap();
    symlink("f7", v.path("a/sym")).unwrap();
}

#[track_caller]
fn verify_metadata_workload(v: &TestVolume) {
    let mut expected: Vec<String> = (0..20)
        .filter(|i| ![0, 1, 4].contains(i))
        .map(|i| format!("f{i}"))
        .collect();
    expected.extend(["b".to_string(), "sym".to_string()]);
    expected.sort();
    assert_eq!(list_dir(&v.path("a")), expected);
    assert_eq!(list_dir(&v.path("a/b")), ["f3link", "moved"]);
    assert_eq!(read_file(&v.path("a/b/moved")), b"file 0");
    assert_eq!(
        read_file(&v.path("a/f2")),
        b"file 1",
        "rename over an existing name"
    );
    assert_eq!(lmeta(&v.path("a/f3")).nlink(), 2);
    assert_eq!(mode_of(&v.path("a/f5")) & 0o7777, 0o604);
    assert_eq!(getxattr(&v.path("a/f6"), "user.inline").unwrap(), b"i");
    assert_eq!(
        getxattr(&v.path("a/f6"), "user.spill").unwrap(),
        pattern(6, 5000)
    );
    assert_eq!(
        getxattr(&v.path("a/f6"), "user.overflow").unwrap(),
        pattern(7, 65536)
    );
    assert_eq!(fs::read_link(v.path("a/sym")).unwrap().as_os_str(), "f7");
}

fn kill_daemon_hard(v: &mut TestVolume) {
    let pid = daemon_pid(v.vol());
    kill(pid, Signal::SIGKILL).unwrap();
    assert!(
        wait_until(WAIT, || !process_alive(pid)),
        "daemon survived SIGKILL"
    );
    v.unmount_after_crash();
}

#[test]
fn sync_mount_keeps_every_acknowledged_metadata_change_after_sigkill() {
    let mut v = TestVolume::with_options(&["sync"]);
    metadata_workload(&v);
    kill_daemon_hard(&mut v);
    v.mount();
    verify_metadata_workload(&v);
}

#[test]
fn fsynced_changes_survive_sigkill_of_the_daemon() {
    let mut v = TestVolume::new();
    metadata_workload(&v);
    let p = v.path("durable");
    let mut f = File::create(&p).unwrap();
    let data = pattern(11, 2 * 1024 * 1024);
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    File::open(v.mnt()).unwrap().sync_all().unwrap();
    // syncfs covers everything before it.
    nix::unistd::syncfs(&f).unwrap();
    drop(f);
    kill_daemon_hard(&mut v);
    v.mount();
    verify_metadata_workload(&v);
    assert_bytes_eq(&read_file(&p), &data, "fsynced file after SIGKILL");
}

/// `safs fsck` right after a `kill -9` (what a boot's fsck pass meets):
/// the leftovers a mount recovers by design are listed and exit 0;
/// `--repair` recovers them (exit 1); damage beside them still exits 4.
#[test]
fn fsck_after_a_kill_lists_leftovers_and_exits_0() {
    let mut v = TestVolume::new();
    let vol = v.vol().to_str().unwrap().to_string();
    fs::write(v.path("kept"), b"kept").unwrap();
    let mut open = OpenOptions::new()
        .create(true)
        .read(true)
        .write(true)
        .truncate(true)
        .open(v.path("f"))
        .unwrap();
    open.write_all(&[b'x'; 100]).unwrap();
    fs::remove_file(v.path("f")).unwrap();
    File::open(v.mnt()).unwrap().sync_all().unwrap();
    kill_daemon_hard(&mut v);
    drop(open);

    let out = safs(["fsck", &vol]);
    out.assert_success("fsck after kill -9");
    assert!(
        out.stdout.contains("leftover: inode") && out.stdout.contains("unlinked while open"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("ERROR"), "{}", out.stdout);
    // A copy keeps the leftovers for the damage case below.
    let copy = v.root().join("copy");
    run_cmd(Command::new("cp").arg("-a").arg(v.vol()).arg(&copy)).assert_success("cp -a");

    let out = safs(["fsck", "--repair", &vol]);
    assert_eq!(out.status.code(), Some(1), "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("recovered: inode") && out.stdout.contains("recovered from"),
        "{}",
        out.stdout
    );
    let out = safs(["fsck", &vol]);
    out.assert_success("fsck after the repair");
    assert!(
        out.stdout.contains(": clean") && !out.stdout.contains("leftover"),
        "{}",
        out.stdout
    );
    v.mount();
    assert_eq!(fs::read(v.path("kept")).unwrap(), b"kept");
    assert!(!v.path("f").exists());

    // Real damage beside the leftovers is still an error: a wrong count.
    {
        let store = safs::meta::LmdbStore::open(&copy.join("meta")).unwrap();
        let k = safs::format::keys::COUNTERS;
        let mut c = safs::format::superblock::Counters::decode(
            &safs::meta::MetaRead::get(&store, k).unwrap().unwrap(),
        )
        .unwrap();
        c.inodes += 5;
        safs::meta::MetaStore::commit(&store, &[(k.to_vec(), Some(c.encode()))]).unwrap();
    }
    let out = safs(["fsck", copy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(4), "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("ERROR: inode count"), "{}", out.stdout);
    assert!(out.stdout.contains("leftover: inode"), "{}", out.stdout);
}

/// A file whose contents were never made durable, and whose backing
/// file's name the filesystem under the volume lost in the stop (as one
/// that drops what was not fsync'd does: nothing fsync'd the name), is
/// empty after recovery — a leftover for fsck, not damage — while a
/// backing file missing after a clean unmount is still an error.
#[test]
fn contents_a_crash_lost_leave_an_empty_file() {
    let mut v = TestVolume::new();
    let vol = v.vol().to_str().unwrap().to_string();
    fs::write(v.path("unsynced"), pattern(3, 5000)).unwrap();
    fs::write(v.path("kept"), b"kept").unwrap();
    let ino = fs::metadata(v.path("unsynced")).unwrap().ino();
    // The metadata (its size) is durable; its backing file's name is lost.
    safs(["sync", v.mnt().to_str().unwrap()]).assert_success("safs sync");
    kill_daemon_hard(&mut v);
    fs::remove_file(v.vol().join(format!("data/{:02x}/{ino:016x}", ino & 0xff))).unwrap();
    let copy = v.root().join("copy");
    run_cmd(Command::new("cp").arg("-a").arg(v.vol()).arg(&copy)).assert_success("cp -a");

    let out = safs(["fsck", &vol]);
    out.assert_success("fsck after the stop");
    assert!(
        out.stdout.contains(&format!(
            "leftover: file {ino}: its 5000 bytes were never made durable"
        )),
        "{}",
        out.stdout
    );
    let out = safs(["fsck", "--repair", copy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stdout);
    safs(["fsck", copy.to_str().unwrap()]).assert_success("fsck after --repair");

    v.mount();
    assert_eq!(fs::metadata(v.path("unsynced")).unwrap().len(), 0);
    assert_eq!(fs::read(v.path("unsynced")).unwrap(), b"");
    assert_eq!(fs::read(v.path("kept")).unwrap(), b"kept");
    v.unmount();
    let out = safs(["fsck", &vol]);
    out.assert_success("fsck after recovery");
    assert!(!out.stdout.contains("leftover"), "{}", out.stdout);

    // After a clean unmount the same loss is damage.
    v.mount();
    fs::write(v.path("later"), b"later").unwrap();
    let later = fs::metadata(v.path("later")).unwrap().ino();
    v.unmount();
    fs::remove_file(
        v.vol()
            .join(format!("data/{:02x}/{later:016x}", later & 0xff)),
    )
    .unwrap();
    let out = safs(["fsck", &vol]);
    assert_eq!(out.status.code(), Some(4), "{}", out.stdout);
    assert!(
        out.stdout.contains("backing file missing (5 bytes lost)"),
        "{}",
        out.stdout
    );
}

#[test]
fn allow_other_is_off_unless_asked_for() {
    let u = users();
    let private = TestVolume::new();
    chmod(private.mnt(), 0o777);
    let mnt = private.mnt().to_path_buf();
    assert_eq!(
        as_user(&u.u1, || fs::metadata(&mnt).errno().map(drop)).unwrap_err(),
        Errno::EACCES,
        "without allow_other other users cannot enter the mount"
    );
    let shared = TestVolume::with_options(&["allow_other"]);
    chmod(shared.mnt(), 0o777);
    let mnt: PathBuf = shared.path("by_u1");
    as_user(&u.u1, || fs::write(&mnt, b"hello").errno()).unwrap();
    assert_eq!(read_file(&mnt), b"hello");
}

/// After `kill -9`, `safs mount` on the same mountpoint replaces the dead
/// mount of its own volume (and says so); a dead mount of another volume is
/// left alone, with an error saying how to remove it.
#[test]
fn mounting_again_after_a_crash_replaces_the_dead_mount() {
    let mut v = TestVolume::new();
    fs::write(v.path("kept"), b"before the crash").unwrap();
    File::open(v.mnt()).unwrap().sync_all().unwrap();
    let pid = daemon_pid(v.vol());
    kill(pid, Signal::SIGKILL).unwrap();
    assert!(
        wait_until(WAIT, || !process_alive(pid)),
        "daemon survived SIGKILL"
    );
    let dead = fs::metadata(v.mnt()).unwrap_err().raw_os_error();
    assert!(
        // ECANCELED: for a moment, while the kernel cancels the dead
        // daemon's io_uring queues.
        matches!(
            dead,
            Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED)
        ),
        "a dead mount answered {dead:?}"
    );

    // Another volume cannot take over this dead mount.
    let other = TestVolume::formatted(&[]);
    let out = safs([
        "mount".as_ref(),
        other.vol().as_os_str(),
        v.mnt().as_os_str(),
    ]);
    out.assert_failure_with_message("dead mount of another volume");
    assert!(
        out.stderr.contains("dead fuse.safs mount"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("umount"), "{}", out.stderr);
    assert!(is_fuse_mounted(v.mnt()), "the dead mount was touched");

    // Its own volume can.
    let out = safs(v.mount_args());
    out.assert_success("mount over the volume's own dead mount");
    assert!(
        out.stderr.contains("was a dead mount of this volume"),
        "{}",
        out.stderr
    );
    v.adopt_mount();
    assert_eq!(read_file(&v.path("kept")), b"before the crash");
}

/// Backing files under the volume's `data/`, by inode number.
fn backing_files(vol: &Path) -> Vec<u64> {
    let mut v = Vec::new();
    for d in fs::read_dir(vol.join("data")).unwrap().flatten() {
        for f in fs::read_dir(d.path()).unwrap().flatten() {
            v.push(u64::from_str_radix(&f.file_name().to_string_lossy(), 16).unwrap());
        }
    }
    v.sort_unstable();
    v
}

/// Backing files are made ahead of time for the next inode numbers: a
/// clean unmount leaves only those of regular files (fsck finds nothing),
/// and the ones a `kill -9` leaves behind are gone after the next mount.
#[test]
fn backing_files_made_ahead_leave_nothing_behind() {
    let mut v = TestVolume::new();
    let mut files = Vec::new();
    for i in 0..40 {
        let p = v.path(format!("f{i}"));
        match i % 4 {
            0 => fs::create_dir(&p).unwrap(),
            1 => symlink("target", &p).unwrap(),
            2 => nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap(),
            _ => {
                File::create(&p).unwrap();
                files.push(fs::metadata(&p).unwrap().ino());
            }
        }
    }
    // A regular file made by mknod keeps the file made for it (empty).
    let node = v.path("node");
    nix::sys::stat::mknod(
        &node,
        nix::sys::stat::SFlag::S_IFREG,
        nix::sys::stat::Mode::from_bits_truncate(0o644),
        0,
    )
    .unwrap();
    let node_ino = fs::metadata(&node).unwrap().ino();
    write_file(&node, b"written later");
    files.push(node_ino);
    files.sort_unstable();
    v.unmount();
    assert_eq!(backing_files(v.vol()), files, "after a clean unmount");
    safs(["fsck".as_ref(), v.vol().as_os_str()]).assert_success("fsck after a clean unmount");

    v.mount();
    assert_eq!(read_file(&node), b"written later");
    File::create(v.path("after")).unwrap();
    File::open(v.mnt()).unwrap().sync_all().unwrap();
    assert!(
        backing_files(v.vol()).len() > files.len() + 1,
        "files are made ahead while mounted"
    );
    kill_daemon_hard(&mut v);
    v.mount();
    let after = fs::metadata(v.path("after")).unwrap().ino();
    v.unmount();
    let mut want = files.clone();
    want.push(after);
    want.sort_unstable();
    assert_eq!(backing_files(v.vol()), want, "after a kill -9 and a mount");
    safs(["fsck".as_ref(), v.vol().as_os_str()]).assert_success("fsck after recovery");
}

/// Inode numbers are reserved in blocks (one write of the counters per
/// block, per daemon): after a clean unmount they go on where they
/// stopped, the block's rest given back; after a `kill -9` the rest of
/// the block is skipped, never reused. `df -i` counts right throughout,
/// and fsck exits 0 after the kill (the files made ahead in the block are
/// leftovers).
#[test]
fn inode_numbers_go_on_after_a_clean_stop_and_are_never_reused_after_a_kill() {
    let mut v = TestVolume::new();
    let vol = v.vol().to_str().unwrap().to_string();
    let used = |v: &TestVolume| {
        let s = nix::sys::statvfs::statvfs(v.mnt()).unwrap();
        s.files() - s.files_free()
    };
    let ino = |p: PathBuf| fs::symlink_metadata(p).unwrap().ino();
    assert_eq!(used(&v), 1, "the root");
    fs::write(v.path("a"), b"a").unwrap();
    fs::create_dir(v.path("d")).unwrap();
    let (a, d) = (ino(v.path("a")), ino(v.path("d")));
    assert_eq!(d, a + 1);
    v.remount();
    fs::write(v.path("b"), b"b").unwrap();
    assert_eq!(ino(v.path("b")), d + 1, "the block's rest was given back");
    assert_eq!(used(&v), 4);

    File::open(v.mnt()).unwrap().sync_all().unwrap();
    kill_daemon_hard(&mut v);
    let out = safs(["fsck", &vol]);
    out.assert_success("fsck after kill -9");
    assert!(!out.stdout.contains("ERROR"), "{}", out.stdout);
    assert!(
        out.stdout.contains("made ahead for inodes not yet created"),
        "{}",
        out.stdout
    );
    v.mount();
    assert_eq!(used(&v), 4, "the killed session's count");
    fs::write(v.path("c"), b"c").unwrap();
    let c = ino(v.path("c"));
    assert!(
        c > d + 1,
        "inode {c} would reuse a number of the killed block"
    );
    assert_eq!(used(&v), 5);
    fs::remove_file(v.path("a")).unwrap();
    fs::remove_dir(v.path("d")).unwrap();
    // Freed when the kernel forgets them, just after.
    assert!(
        wait_until(WAIT, || used(&v) == 3),
        "{} inodes in use",
        used(&v)
    );
    v.unmount();
    let out = safs(["fsck", &vol]);
    out.assert_success("fsck after the remount");
    assert!(
        out.stdout.contains(": clean") && !out.stdout.contains("leftover"),
        "{}",
        out.stdout
    );
    let out = safs(["info", &vol]);
    assert!(out.stdout.contains("inodes:         3 "), "{}", out.stdout);
}
