//! Volumes whose metadata lives in PostgreSQL, on a real, private cluster
//! (Debian's server binaries; started in a temporary directory, stopped
//! and removed in teardown, also on failure): the namespace, xattrs of
//! every tier and contents through a real mount and across remounts, a
//! killed daemon, a server restarted under a mounted volume, and clear
//! errors for what cannot work.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::*;
use safs::meta::postgres::cluster::TempCluster;

/// A mounted volume on its own cluster; dropped volume first (unmounted),
/// then the cluster.
struct PgVolume {
    v: TestVolume,
    cluster: TempCluster,
    _dir: tempfile::TempDir,
}

fn pg_volume() -> PgVolume {
    let dir = tempfile::tempdir().unwrap();
    let cluster = TempCluster::start(dir.path()).unwrap();
    cluster.create_database("vol").unwrap();
    let mut v = TestVolume::formatted(&["--meta", &cluster.conninfo("vol")]);
    v.mount();
    PgVolume {
        v,
        cluster,
        _dir: dir,
    }
}

/// The engine's point reads and scans so far (`safs info --stats`).
fn engine_reads(v: &TestVolume) -> (u64, u64) {
    let out = safs(["info".as_ref(), "--stats".as_ref(), v.mnt().as_os_str()]);
    out.assert_success("safs info --stats");
    let line = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("engine:"))
        .unwrap_or_else(|| panic!("no engine line: {}", out.stdout));
    let n: Vec<u64> = line
        .split(',')
        .map(|part| part.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    (n[0], n[1])
}

/// The command failed and said `why`.
#[track_caller]
fn fails_with(out: &CmdOutput, why: &str) {
    out.assert_failure_with_message(why);
    assert!(
        out.stderr.contains(why),
        "expected '{why}' in: {}",
        out.stderr
    );
}

fn fsck_clean(vol: &Path) {
    let out = safs(["fsck", vol.to_str().unwrap()]);
    out.assert_success("safs fsck of a PostgreSQL volume");
    assert!(out.stdout.contains("clean"), "{}", out.stdout);
}

#[test]
fn a_volume_on_postgresql_serves_the_namespace_xattrs_and_contents_across_remounts() {
    let mut p = pg_volume();
    let v = &mut p.v;
    std::fs::create_dir(v.path("d")).unwrap();
    for i in 0..300 {
        std::fs::write(v.path(format!("d/f{i}")), format!("file {i}")).unwrap();
    }
    let big = pattern(3, 1 << 20);
    write_file(&v.path("big"), &big);
    setxattr(&v.path("big"), "user.small", b"1", 0).unwrap();
    setxattr(&v.path("big"), "user.spilled", &[2u8; 3000], 0).unwrap();
    setxattr(&v.path("big"), "user.huge", &[4u8; 65536], 0).unwrap();
    std::fs::create_dir(v.path("s")).unwrap();
    for i in 0..20 {
        std::fs::write(v.path(format!("s/f{i}")), b"").unwrap();
        // Beyond the default inline budget: the window reads spill pages.
        setxattr(&v.path(format!("s/f{i}")), "user.acl", &[i as u8; 2000], 0).unwrap();
    }
    std::os::unix::fs::symlink("big", v.path("link")).unwrap();
    std::fs::hard_link(v.path("big"), v.path("hard")).unwrap();
    std::fs::rename(v.path("d/f0"), v.path("moved")).unwrap();
    std::fs::remove_file(v.path("d/f1")).unwrap();
    v.unmount();
    v.mount();
    // `s` is found by a window of the root's entries (the root's last cold
    // lookup, of `d`, found its name), so the first cold lookup in it reads
    // a window too, and from its first entry, as it holds fewer than a
    // window: the entries and the inodes they name (one scan that follows
    // each, one round trip) and, most of them having values beside them,
    // their spill pages (a scan). Every lookup and getxattr after that
    // costs no read. (A path walk's lookups, one per directory, read a
    // name alone: the unit tests in core count both.)
    let reads = |v: &TestVolume, i: usize| {
        let before = engine_reads(v);
        let name = v.path(format!("s/f{i}"));
        assert_eq!(getxattr(&name, "user.acl").unwrap(), vec![i as u8; 2000]);
        let after = engine_reads(v);
        (after.0 - before.0, after.1 - before.1)
    };
    std::fs::metadata(v.path("d")).unwrap();
    std::fs::metadata(v.path("s")).unwrap();
    assert_eq!(reads(v, 7), (0, 2), "(point reads, scans), the window");
    for i in (0..20).filter(|&i| i != 7) {
        assert_eq!(reads(v, i), (0, 0), "(point reads, scans), lookup {i}");
    }
    assert_eq!(std::fs::read_dir(v.path("d")).unwrap().count(), 298);
    assert_eq!(std::fs::read(v.path("d/f299")).unwrap(), b"file 299");
    assert_eq!(std::fs::read(v.path("moved")).unwrap(), b"file 0");
    assert_eq!(read_file(&v.path("big")), big);
    assert_eq!(getxattr(&v.path("big"), "user.small").unwrap(), b"1");
    assert_eq!(
        getxattr(&v.path("big"), "user.spilled").unwrap(),
        vec![2u8; 3000]
    );
    assert_eq!(
        getxattr(&v.path("big"), "user.huge").unwrap(),
        vec![4u8; 65536]
    );
    assert_eq!(
        std::fs::read_link(v.path("link")).unwrap(),
        Path::new("big")
    );
    assert_eq!(meta(&v.path("hard")).nlink(), 2);
    assert_eq!(
        errno_of(std::fs::metadata(v.path("d/f1")).unwrap_err()),
        nix::errno::Errno::ENOENT
    );
    v.unmount();
    fsck_clean(v.vol());
    let info = safs(["info", v.vol().to_str().unwrap()]);
    info.assert_success("safs info");
    assert!(
        info.stdout.contains("metadata:       PostgreSQL, host=")
            && info.stdout.contains("dbname=vol user=postgres"),
        "{}",
        info.stdout
    );
}

#[test]
fn a_killed_daemon_and_a_restarted_server_lose_nothing_synced() {
    let mut p = pg_volume();
    write_file(&p.v.path("before"), b"synced");
    std::fs::File::open(p.v.path("before"))
        .unwrap()
        .sync_all()
        .unwrap();
    let pid = daemon_pid(p.v.vol());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    p.v.unmount_after_crash();
    p.v.mount();
    assert_eq!(std::fs::read(p.v.path("before")).unwrap(), b"synced");

    // The server stops as in a crash and comes back: the daemon
    // reconnects by itself; what was synced is there, new changes work.
    p.cluster.restart().unwrap();
    write_file(&p.v.path("after"), b"restart");
    setxattr(&p.v.path("after"), "user.k", b"v", 0).unwrap();
    std::fs::File::open(p.v.path("after"))
        .unwrap()
        .sync_all()
        .unwrap();
    p.v.unmount();
    p.v.mount();
    assert_eq!(std::fs::read(p.v.path("after")).unwrap(), b"restart");
    assert_eq!(getxattr(&p.v.path("after"), "user.k").unwrap(), b"v");
    assert_eq!(std::fs::read(p.v.path("before")).unwrap(), b"synced");
    p.v.unmount();
    fsck_clean(p.v.vol());
}

#[test]
fn an_encrypted_volume_on_postgresql_keeps_nothing_readable_in_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = TempCluster::start(dir.path()).unwrap();
    let pass = dir.path().join("pass");
    std::fs::write(&pass, b"pg passphrase\n").unwrap();
    let p = pass.to_str().unwrap();
    let mut v = TestVolume::formatted(&[
        "--encrypt",
        "--kdf-testing",
        "--passphrase-file",
        p,
        "--meta",
        &cluster.conninfo("postgres"),
    ]);
    v.set_options(&[&format!("passphrase_file={p}")]);
    v.mount();
    std::fs::create_dir(v.path("secretdir")).unwrap();
    write_file(&v.path("secretdir/secretfile"), b"secretcontents");
    setxattr(
        &v.path("secretdir/secretfile"),
        "user.secretname",
        b"secretvalue",
        0,
    )
    .unwrap();
    v.unmount();
    v.mount();
    assert_eq!(
        std::fs::read(v.path("secretdir/secretfile")).unwrap(),
        b"secretcontents"
    );
    assert_eq!(
        getxattr(&v.path("secretdir/secretfile"), "user.secretname").unwrap(),
        b"secretvalue"
    );
    v.unmount();
    let mut c = postgres::Client::connect(&cluster.conninfo("postgres"), postgres::NoTls).unwrap();
    let rows = c.query("SELECT k, v FROM safs_kv", &[]).unwrap();
    assert!(rows.len() > 3);
    for r in rows {
        let (k, val): (Vec<u8>, Vec<u8>) = (r.get(0), r.get(1));
        for bytes in [&k, &val] {
            assert!(
                !bytes.windows(6).any(|w| w == b"secret"),
                "a name or value in the clear: {:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }
    let out = safs(["fsck", v.vol().to_str().unwrap(), "--passphrase-file", p]);
    out.assert_success("fsck of an encrypted PostgreSQL volume");
    assert!(out.stdout.contains("clean"), "{}", out.stdout);
}

#[test]
fn meta_timeout_is_checked() {
    let p = pg_volume();
    let mnt2 = p._dir.path().join("m2");
    std::fs::create_dir(&mnt2).unwrap();
    let out = safs([
        "mount",
        p.v.vol().to_str().unwrap(),
        mnt2.to_str().unwrap(),
        "-o",
        "meta_timeout=0",
    ]);
    fails_with(&out, "meta_timeout must be 1..=3600");
}

#[test]
fn what_cannot_work_is_a_clear_error_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = TempCluster::start(dir.path()).unwrap();
    let vols = tempfile::tempdir().unwrap();
    let vol = vols.path().join("v");
    let vol_s = vol.to_str().unwrap();

    // A password in the string would be stored in the volume.
    let out = safs([
        "format",
        vol_s,
        "--meta",
        "postgresql://postgres:secret@localhost/postgres",
    ]);
    fails_with(&out, "holds a password");
    assert!(!vol.exists(), "nothing left behind");
    // No server there.
    let out = safs([
        "format",
        vol_s,
        "--meta",
        &format!("host={} user=postgres dbname=x", vols.path().display()),
    ]);
    fails_with(&out, "cannot connect to PostgreSQL");
    assert!(!vol.exists(), "nothing left behind");
    // A database that already holds a volume.
    safs(["format", vol_s, "--meta", &cluster.conninfo("postgres")]).assert_success("format");
    let other = vols.path().join("other");
    let out = safs([
        "format",
        other.to_str().unwrap(),
        "--meta",
        &cluster.conninfo("postgres"),
    ]);
    fails_with(&out, "already holds a safs volume");
    assert!(!other.exists(), "nothing left behind");
    // The volume's tables dropped behind its back: mount says so.
    let mut c = postgres::Client::connect(&cluster.conninfo("postgres"), postgres::NoTls).unwrap();
    c.batch_execute("DROP TABLE safs_kv, safs_volume").unwrap();
    let mnt = vols.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let out = safs(["mount", vol_s, mnt.to_str().unwrap()]);
    fails_with(&out, "holds no safs volume");
    assert!(!is_fuse_mounted(&mnt));
}

/// Mount, `mount -o remount,ro` and back, unmount and mount again at once,
/// on one mountpoint, many times in a row (xfstests generic/294, 366,
/// 452): several daemons may serve a PostgreSQL volume, so a new mount
/// does not wait for the old daemon to finish closing — and that daemon
/// must not remove the control socket its successor has made.
#[test]
fn mount_remount_and_umount_in_a_row_on_one_mountpoint() {
    let _h = MountHelper::install();
    let mut p = pg_volume();
    let mnt = p.v.mnt().to_path_buf();
    let remount = |how: &str| {
        run_cmd(
            std::process::Command::new("mount")
                .args(["-o", &format!("remount,{how}")])
                .arg(&mnt),
        )
        .assert_success(&format!("mount -o remount,{how}"));
    };
    for i in 0..15 {
        write_file(&p.v.path(format!("f{i}")), b"x");
        remount("ro");
        assert_eq!(
            std::fs::write(p.v.path("refused"), b"y").map_err(errno_of),
            Err(nix::errno::Errno::EROFS),
            "round {i}"
        );
        remount("rw");
        umount_once_released(&mnt).assert_success("umount");
        p.v.forget_mounted();
        p.v.mount();
        safs(["sync", mnt.to_str().unwrap()]).assert_success(&format!("safs sync, round {i}"));
    }
    for i in 0..15 {
        assert_eq!(read_file(&p.v.path(format!("f{i}"))), b"x");
    }
}
