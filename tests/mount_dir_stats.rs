//! Directory statistics through a real FUSE mount: `safs.dir.*` read with
//! `getxattr` against a walk of the tree after every kind of change made
//! with real system calls, across a remount; never listed, never set.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::Path;

use common::*;

/// (files here, subdirectories here, files below, directories below,
/// bytes below) by a walk, as `du --apparent-size -l` would count them.
fn walk(dir: &Path) -> [u64; 5] {
    let mut s = [0u64; 5];
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = fs::symlink_metadata(e.path()).unwrap();
        if m.is_dir() {
            let below = walk(&e.path());
            s[1] += 1;
            s[2] += below[2];
            s[3] += below[3] + 1;
            s[4] += below[4];
        } else {
            s[0] += 1;
            s[2] += 1;
            s[4] += m.size();
        }
    }
    s
}

fn stat(dir: &Path, name: &str) -> u64 {
    let v = getxattr(dir, &format!("safs.dir.{name}"))
        .unwrap_or_else(|e| panic!("safs.dir.{name} of {}: {e}", dir.display()));
    String::from_utf8(v).unwrap().parse().unwrap()
}

/// Every directory under `dir` (and `dir`) against its walk.
#[track_caller]
fn assert_stats_match_walks(dir: &Path) {
    let w = walk(dir);
    let names = ["files", "subdirs", "rfiles", "rsubdirs", "rbytes"];
    for (n, want) in names.iter().zip(w) {
        assert_eq!(stat(dir, n), want, "safs.dir.{n} of {}", dir.display());
    }
    assert_eq!(stat(dir, "entries"), w[0] + w[1]);
    assert_eq!(stat(dir, "rentries"), w[2] + w[3]);
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            assert_stats_match_walks(&e.path());
        }
    }
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
}
