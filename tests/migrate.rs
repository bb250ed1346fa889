//! `safs migrate`: a volume's metadata moved between LMDB and PostgreSQL
//! in place, on real volumes and a real cluster — every file, link and
//! xattr the same after each move (and back), encrypted volumes without
//! their passphrase, runs killed at random points leaving the volume the
//! old one or the new one (and a second run finishing), and refusals.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use safs::meta::postgres::cluster::TempCluster;

/// Processes of safs whose arguments name `vol` (a migration's fsck,
/// between its fork and its end).
fn safs_processes_on(vol: &Path) -> usize {
    let vol = vol.as_os_str().as_encoded_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .filter(|cmd| {
            let mut args = cmd.split(|b| *b == 0);
            args.next().is_some_and(|a0| a0.ends_with(b"safs")) && args.any(|a| a == vol)
        })
        .count()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Files, directories, links and xattrs of every size class.
fn populate(root: &Path, files: usize) {
    for d in 0..4 {
        std::fs::create_dir(root.join(format!("d{d}"))).unwrap();
    }
    for i in 0..files {
        let p = root.join(format!("d{}/f{i}", i % 4));
        std::fs::write(&p, vec![i as u8; i % 5000]).unwrap();
        if i % 10 == 0 {
            setxattr(&p, "user.small", b"v", 0).unwrap();
        }
    }
    let big = root.join("big");
    std::fs::write(&big, vec![7u8; 3 << 20]).unwrap();
    setxattr(&big, "user.spill", &[1u8; 10_000], 0).unwrap();
    setxattr(&big, "user.huge", &[2u8; 60_000], 0).unwrap();
    std::fs::hard_link(&big, root.join("d0/big-link")).unwrap();
    std::os::unix::fs::symlink("d1/f1", root.join("sym")).unwrap();
}

#[track_caller]
fn migrate(v: &TestVolume, meta: &str) -> CmdOutput {
    let out = safs(["migrate", s(v.vol()), "--meta", meta]);
    out.assert_success(&format!("safs migrate --meta {meta}"));
    out
}

#[test]
fn a_volume_moves_to_postgresql_and_back_with_everything_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = TempCluster::start(dir.path()).unwrap();
    cluster.create_database("vol").unwrap();
    let conninfo = cluster.conninfo("vol");
    let mut v = TestVolume::new();
    populate(v.mnt(), 300);
    let before = tree_of(v.mnt());
    v.unmount();

    let out = migrate(&v, &conninfo);
    assert!(
        out.stdout
            .contains("metadata moved from LMDB to PostgreSQL"),
        "{}",
        out.stdout
    );
    let meta = v.vol().join("meta");
    assert!(meta.join("postgres.conf").exists());
    assert!(!meta.join("data.mdb").exists());
    assert!(meta.join("lmdb-before-migration/data.mdb").exists());
    let info = safs(["info", s(v.vol())]);
    assert!(info.stdout.contains("PostgreSQL"), "{}", info.stdout);
    v.mount();
    assert_eq!(tree_of(v.mnt()), before);
    // A change on the new engine, then back to LMDB.
    std::fs::write(v.path("after"), b"on postgres").unwrap();
    let mut before = tree_of(v.mnt());
    v.unmount();
    let out = migrate(&v, "lmdb");
    assert!(
        out.stdout
            .contains("metadata moved from PostgreSQL to LMDB"),
        "{}",
        out.stdout
    );
    assert!(meta.join("data.mdb").exists());
    assert!(!meta.join("postgres.conf").exists());
    v.mount();
    assert_eq!(tree_of(v.mnt()), before);
    std::fs::remove_file(v.path("after")).unwrap();
    before.remove("after");
    assert_eq!(tree_of(v.mnt()), before);
    v.unmount();
    safs(["fsck", s(v.vol())]).assert_success("fsck after two migrations");

    // Refusals: the same engine, a database holding another volume, a
    // mounted volume, a connection string that is none.
    safs(["migrate", s(v.vol()), "--meta", "lmdb"])
        .assert_failure_with_message("migrate to the engine it is on");
    cluster.create_database("other").unwrap();
    let other = TestVolume::formatted(&["--meta", &cluster.conninfo("other")]);
    let out = safs(["migrate", s(v.vol()), "--meta", &cluster.conninfo("other")]);
    out.assert_failure_with_message("migrate into a database holding a volume");
    assert!(out.stderr.contains("another volume"), "{}", out.stderr);
    drop(other);
    v.mount();
    cluster.create_database("vol2").unwrap();
    safs(["migrate", s(v.vol()), "--meta", &cluster.conninfo("vol2")])
        .assert_failure_with_message("migrate a mounted volume");
    safs([
        "migrate",
        s(v.vol()),
        "--meta",
        "host=/nonexistent dbname=x",
    ])
    .assert_failure_with_message("migrate to a server that is not there");
    assert_eq!(
        tree_of(v.mnt()),
        before,
        "a refused migration changed the volume"
    );
}

#[test]
fn an_encrypted_volume_moves_sealed_without_its_passphrase() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = TempCluster::start(dir.path()).unwrap();
    cluster.create_database("vol").unwrap();
    let pass = dir.path().join("pass");
    std::fs::write(&pass, "correct horse").unwrap();
    let mut v =
        TestVolume::formatted(&["--encrypt", "--passphrase-file", s(&pass), "--kdf-testing"]);
    v.set_options(&[&format!("passphrase_file={}", pass.display())]);
    v.mount();
    populate(v.mnt(), 100);
    let before = tree_of(v.mnt());
    v.unmount();
    // No passphrase anywhere in the migration's environment.
    let out = run_cmd(
        Command::new(SAFS)
            .args(["migrate", s(v.vol()), "--meta", &cluster.conninfo("vol")])
            .env_remove("SAFS_PASSPHRASE_FILE"),
    );
    out.assert_success("migrate an encrypted volume");
    v.mount();
    assert_eq!(tree_of(v.mnt()), before);
    v.unmount();
}

#[test]
fn a_migration_killed_at_any_point_leaves_the_old_or_the_new_volume() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = TempCluster::start(dir.path()).unwrap();
    cluster.create_database("vol").unwrap();
    let conninfo = cluster.conninfo("vol");
    let mut v = TestVolume::new();
    populate(v.mnt(), 3000);
    let before = tree_of(v.mnt());
    v.unmount();
    let on_pg = |v: &TestVolume| {
        v.vol().join("meta/postgres.conf").exists() && !v.vol().join("meta/data.mdb").exists()
    };
    // Each round moves it the other way (to the same database each time:
    // one that holds this volume's older copy is brought up to date).
    for (round, after_ms) in [10u64, 20, 40, 80, 160, 320, 640].into_iter().enumerate() {
        let target = if on_pg(&v) {
            "lmdb".to_string()
        } else {
            conninfo.clone()
        };
        let mut child = Command::new(SAFS)
            .args(["migrate", s(v.vol()), "--meta", &target])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(after_ms));
        let _ = child.kill();
        let _ = child.wait();
        // A run killed during its closing fsck leaves that check running
        // (forked, perhaps not yet holding the volume's lock): wait for it
        // to end, then for the lock.
        assert!(wait_until(Duration::from_secs(60), || {
            safs_processes_on(v.vol()) == 0
        }));
        assert!(v.wait_lock_released(Duration::from_secs(60)));
        // Whichever it is now, it mounts with everything in it.
        eprintln!(
            "round {round}: killed after {after_ms} ms, on PostgreSQL: {}",
            on_pg(&v)
        );
        v.mount();
        assert_eq!(tree_of(v.mnt()), before, "round {round}");
        v.unmount();
    }
    let target = if on_pg(&v) {
        "lmdb".to_string()
    } else {
        conninfo.clone()
    };
    // Run to the end: the volume is then wholly on the target.
    migrate(&v, &target);
    v.mount();
    assert_eq!(tree_of(v.mnt()), before);
    v.unmount();
    safs(["fsck", s(v.vol())]).assert_success("fsck after the killed migrations");
}
