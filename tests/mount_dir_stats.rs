//! Directory statistics through a real FUSE mount: `safs.dir.*` read with
//! `getxattr` against a walk of the tree after every kind of change made
//! with real system calls, across a remount; never listed, never set.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;

use common::*;

/// (files here, subdirectories here, files below, directories below,
/// bytes below, bytes allocated to files below) by a walk, as `du
/// --apparent-size -l` (and `du -l` without directories) would count them.
fn walk(dir: &Path) -> [u64; 6] {
    let mut s = [0u64; 6];
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = fs::symlink_metadata(e.path()).unwrap();
        if m.is_dir() {
            let below = walk(&e.path());
            s[1] += 1;
            s[2] += below[2];
            s[3] += below[3] + 1;
            s[4] += below[4];
            s[5] += below[5];
        } else {
            s[0] += 1;
            s[2] += 1;
            s[4] += m.size();
            s[5] += m.blocks() * 512;
        }
    }
    s
}

fn stat(dir: &Path, name: &str) -> u64 {
    let v = getxattr(dir, &format!("safs.dir.{name}"))
        .unwrap_or_else(|e| panic!("safs.dir.{name} of {}: {e}", dir.display()));
    String::from_utf8(v).unwrap().parse().unwrap()
}

/// Every directory under `dir` (and `dir`) against its walk. A written
/// file's size is recorded at its writer's RELEASE, which the kernel
/// sends just after `close(2)` has returned (files are opened without
/// FLUSH): a GETXATTR right after the close can come first (CI saw it
/// over `/dev/fuse`), so the counts get up to 5 s to agree.
#[track_caller]
fn assert_stats_match_walks(dir: &Path) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match stats_match_walks(dir) {
            Ok(()) => return,
            Err(e) if std::time::Instant::now() >= until => panic!("{e}"),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
        }
    }
}

fn stats_match_walks(dir: &Path) -> Result<(), String> {
    let w = walk(dir);
    let names = [
        "files",
        "subdirs",
        "rfiles",
        "rsubdirs",
        "rbytes",
        "rallocated",
    ];
    let mut checks: Vec<(String, u64, u64)> = names
        .iter()
        .zip(w)
        .map(|(n, want)| (n.to_string(), stat(dir, n), want))
        .collect();
    checks.push(("entries".into(), stat(dir, "entries"), w[0] + w[1]));
    checks.push(("rentries".into(), stat(dir, "rentries"), w[2] + w[3]));
    for (n, got, want) in checks {
        if got != want {
            return Err(format!(
                "safs.dir.{n} of {}: {got}, the walk says {want}",
                dir.display()
            ));
        }
    }
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            stats_match_walks(&e.path())?;
        }
    }
    Ok(())
}

#[test]
fn directory_statistics_match_a_walk_after_every_kind_of_change() {
    let mut v = TestVolume::new();
    let top = v.path("share");
    fs::create_dir_all(top.join("a/b/c")).unwrap();
    fs::create_dir_all(top.join("x")).unwrap();
    write_file(&top.join("a/one"), &[1u8; 1000]);
    write_file(&top.join("a/b/two"), &[2u8; 70_000]);
    write_file(&top.join("a/b/c/three"), b"3");
    symlink("../one", top.join("a/b/link")).unwrap();
    fs::hard_link(top.join("a/b/two"), top.join("x/two-again")).unwrap();
    assert_stats_match_walks(&top);
    assert_eq!(stat(&top, "rbytes"), 1000 + 2 * 70_000 + 1 + 6);
    // Appends, truncates, renames across directories, removals.
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(top.join("a/b/two"))
        .unwrap();
    std::io::Write::write_all(&mut f, &[9u8; 5000]).unwrap();
    drop(f);
    fs::OpenOptions::new()
        .write(true)
        .open(top.join("a/one"))
        .unwrap()
        .set_len(10)
        .unwrap();
    fs::rename(top.join("a/b"), top.join("x/b")).unwrap();
    fs::rename(top.join("x/two-again"), top.join("a/moved")).unwrap();
    assert_stats_match_walks(&top);
    fs::remove_file(top.join("x/b/two")).unwrap();
    fs::remove_file(top.join("x/b/c/three")).unwrap();
    fs::remove_dir(top.join("x/b/c")).unwrap();
    assert_stats_match_walks(&top);
    v.remount();
    assert_stats_match_walks(&top);
    assert_stats_match_walks(&v.path(""));
    // Read-only, not listed, absent on files.
    assert!(
        !listxattr(&top)
            .unwrap()
            .iter()
            .any(|n| n.starts_with("safs."))
    );
    assert_eq!(
        setxattr(&top, "safs.dir.rbytes", b"0", 0).unwrap_err(),
        Errno::EOPNOTSUPP
    );
    assert_eq!(
        removexattr(&top, "safs.dir.rbytes").unwrap_err(),
        Errno::EOPNOTSUPP
    );
    assert_eq!(
        getxattr(&top.join("a/moved"), "safs.dir.rbytes").unwrap_err(),
        Errno::ENODATA
    );
    assert_eq!(
        getxattr(&top, "safs.dir.nonesuch").unwrap_err(),
        Errno::ENODATA
    );
    // The newest change below, to the second: a chmod deep down moves
    // every directory above it, and none beside.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let deep = top.join("a/one");
    fs::set_permissions(&deep, fs::Permissions::from_mode(0o600)).unwrap();
    let ctime = fs::metadata(&deep).unwrap().ctime() as u64;
    for dir in [v.path(""), top.clone(), top.join("a")] {
        assert_eq!(stat(&dir, "rctime"), ctime, "{}", dir.display());
    }
    assert!(stat(&top.join("x"), "rctime") < ctime);
    v.remount();
    assert_eq!(stat(&v.path(""), "rctime"), ctime);
}

/// An `fsync` records the size it made durable: a file still open for
/// writing shows in its directory's statistics as of its last `fsync`
/// (at once: the `fsync` returns after the commit), not only after the
/// close.
#[test]
fn an_fsync_records_the_size_in_the_statistics() {
    let v = TestVolume::new();
    let dir = v.path("logs");
    fs::create_dir(&dir).unwrap();
    let mut f = fs::File::create(dir.join("log")).unwrap();
    for (i, data) in [&[1u8; 3000][..], &[2u8; 70_000], b"x"].iter().enumerate() {
        std::io::Write::write_all(&mut f, data).unwrap();
        let before = stat(&dir, "rbytes");
        if i == 0 {
            assert_eq!(before, 0, "nothing recorded before the first fsync");
        }
        f.sync_all().unwrap();
        let size = f.metadata().unwrap().len();
        assert_eq!(stat(&dir, "rbytes"), size, "after fsync {i}");
        assert_eq!(stat(&v.path(""), "rbytes"), size, "the root, fsync {i}");
    }
    // fdatasync too: the size is what finds the data.
    std::io::Write::write_all(&mut f, &[3u8; 10]).unwrap();
    f.sync_data().unwrap();
    assert_eq!(stat(&dir, "rbytes"), 73_011);
    drop(f);
    assert_stats_match_walks(&dir);
}

#[test]
fn quotas_hold_through_a_mount_to_the_byte_and_show_in_statfs() {
    let mut v = TestVolume::new();
    let q = v.path("q");
    fs::create_dir(&q).unwrap();
    setxattr(&q, "safs.quota.max_bytes", b"1048576", 0).unwrap();
    setxattr(&q, "safs.quota.max_files", b"10", 0).unwrap();
    assert_eq!(getxattr(&q, "safs.quota.max_bytes").unwrap(), b"1048576");
    // Writes in 64 KiB pieces, not page-aligned at the end, until refused:
    // the file ends exactly at the limit (passthrough would not see it).
    let fill = |path: &Path| -> (u64, std::io::Error) {
        let mut f = fs::File::create(path).unwrap();
        let piece = vec![5u8; 65_000];
        let mut written = 0;
        loop {
            match std::io::Write::write(&mut f, &piece) {
                Ok(n) => written += n as u64,
                Err(e) => return (written, e),
            }
        }
    };
    let (written, e) = fill(&q.join("big"));
    assert_eq!(e.raw_os_error(), Some(libc::EDQUOT), "{e}");
    assert_eq!(
        written,
        1_048_576,
        "bytes past the limit: {}",
        written as i64 - 1_048_576
    );
    assert_eq!(fs::metadata(q.join("big")).unwrap().len(), 1_048_576);
    assert_eq!(stat(&q, "rbytes"), 1_048_576);
    let s = nix::sys::statvfs::statvfs(&q).unwrap();
    assert_eq!(s.blocks() * s.fragment_size(), 1_048_576);
    assert_eq!(s.blocks_available(), 0);
    assert_eq!(s.files(), 10);
    assert_eq!(s.files_free(), 9);
    // Entries: nine more fit, then none, until room is made.
    for i in 0..9 {
        write_file(&q.join(format!("f{i}")), b"");
    }
    let e = fs::File::create(q.join("one-too-many")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EDQUOT), "{e}");
    assert_eq!(
        fs::create_dir(q.join("d")).unwrap_err().raw_os_error(),
        Some(libc::EDQUOT)
    );
    fs::remove_file(q.join("f0")).unwrap();
    fs::create_dir(q.join("d")).unwrap();
    // Kept across a remount, and still enforced there.
    v.remount();
    assert_eq!(getxattr(&q, "safs.quota.max_files").unwrap(), b"10");
    let e = fs::File::create(q.join("f0")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EDQUOT));
    let big = fs::OpenOptions::new()
        .append(true)
        .open(q.join("big"))
        .unwrap();
    let e = std::io::Write::write(&mut &big, b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EDQUOT));
    drop(big);
    removexattr(&q, "safs.quota.max_bytes").unwrap();
    removexattr(&q, "safs.quota.max_files").unwrap();
    write_file(&q.join("f0"), b"now it fits");
    assert!(
        !listxattr(&q)
            .unwrap()
            .iter()
            .any(|n| n.starts_with("safs."))
    );
    assert_stats_match_walks(&v.path(""));
}

#[test]
fn safs_quota_sets_shows_lists_and_removes_limits() {
    let v = TestVolume::new();
    let (q, inner) = (v.path("q"), v.path("q/inner"));
    fs::create_dir_all(&inner).unwrap();
    write_file(&inner.join("f"), &[1u8; 3 << 19]);
    let q_str = q.to_str().unwrap();
    let out = safs([
        "quota",
        "set",
        q_str,
        "--max-bytes",
        "2M",
        "--max-files",
        "10",
    ]);
    out.assert_success("safs quota set");
    assert!(
        out.stdout.contains("bytes 1.5 MiB of 2.0 MiB (75.0%)")
            && out.stdout.contains("entries 2 of 10 (20.0%)"),
        "{}",
        out.stdout
    );
    assert_eq!(getxattr(&q, "safs.quota.max_bytes").unwrap(), b"2097152");
    safs(["quota", "set", inner.to_str().unwrap(), "--max-files", "5"])
        .assert_success("safs quota set");
    let out = safs(["quota", "list", v.path("").to_str().unwrap()]);
    out.assert_success("safs quota list");
    assert_eq!(out.stdout.lines().count(), 2, "{}", out.stdout);
    assert!(
        out.stdout
            .contains("inner: bytes 1.5 MiB (no limit); entries 1 of 5"),
        "{}",
        out.stdout
    );
    safs(["quota", "remove", q_str, "--files"]).assert_success("safs quota remove");
    let out = safs(["quota", "get", q_str]);
    assert!(
        out.stdout.contains("entries 2 (no limit)"),
        "{}",
        out.stdout
    );
    safs(["quota", "set", q_str, "--max-bytes", "lots"]).assert_failure_with_message("a bad size");
    safs(["quota", "set", q_str]).assert_failure_with_message("nothing to set");
    let out = safs(["quota", "get", "/tmp"]);
    out.assert_failure_with_message("quota of a directory not on safs");
    assert!(
        out.stderr.contains("safs volume that keeps statistics"),
        "{}",
        out.stderr
    );
}
