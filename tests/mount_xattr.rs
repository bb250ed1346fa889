//! Extended attributes through a real FUSE mount: every size from 0 to 65,536
//! bytes bit-exact across remounts, the tier boundaries (inline, spill,
//! overflow) and moves between them, Linux's exact limits and errnos, many
//! large values on one file, namespaces and who may use them, and xattrs on
//! directories and symlinks.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::Path;

use common::*;

/// Sizes around every boundary a tiered layout can have: empty, tiny, the
/// inline budget of older volumes (~300-320 bytes), pages, the default
/// budget (1,536 bytes: one `user.v` value of 1,521 bytes fills it), the
/// spill limit, the max.
const SIZES: &[usize] = &[
    0, 1, 2, 100, 255, 256, 257, 300, 319, 320, 321, 511, 512, 1000, 1024, 1521, 1522, 1536, 2048,
    4095, 4096, 4097, 8192, 16383, 16384, 16385, 32768, 65535, 65536,
];

fn value(seed: usize, len: usize) -> Vec<u8> {
    pattern(seed as u64 * 7919 + len as u64, len)
}

#[track_caller]
fn assert_xattr(path: &Path, name: &str, expected: &[u8]) {
    let size = getxattr_size(path, name)
        .unwrap_or_else(|e| panic!("getxattr size {name} on {}: {e}", path.display()));
    assert_eq!(size, expected.len(), "size of {name}");
    let got = getxattr(path, name).unwrap_or_else(|e| panic!("getxattr {name}: {e}"));
    assert_bytes_eq(&got, expected, name);
}

fn names_set(path: &Path) -> BTreeSet<String> {
    listxattr(path).unwrap().into_iter().collect()
}

#[test]
fn xattr_values_of_every_size_read_back_bit_exact_after_remount() {
    let mut v = TestVolume::new();
    let all = v.path("all_sizes_on_one_file");
    write_file(&all, b"");
    for (i, &len) in SIZES.iter().enumerate() {
        let single = v.path(format!("size_{len}"));
        write_file(&single, b"");
        setxattr(&single, "user.v", &value(i, len), 0).unwrap();
        setxattr(&all, &format!("user.s{len}"), &value(i + 1000, len), 0).unwrap();
    }
    for round in ["before remount", "after remount", "after second remount"] {
        for (i, &len) in SIZES.iter().enumerate() {
            let single = v.path(format!("size_{len}"));
            assert_xattr(&single, "user.v", &value(i, len));
            assert_xattr(&all, &format!("user.s{len}"), &value(i + 1000, len));
        }
        let expected: BTreeSet<String> = SIZES.iter().map(|l| format!("user.s{l}")).collect();
        assert_eq!(names_set(&all), expected, "{round}");
        if round != "after second remount" {
            v.remount();
        }
    }
}

#[test]
fn xattr_round_trip_with_inline_budgets_0_320_512_and_16384() {
    for budget in ["0", "320", "512", "16384"] {
        let mut v = TestVolume::with_format_args(&["--inline-xattr-bytes", budget], &[]);
        let f = v.path("f");
        write_file(&f, b"data");
        let sizes = [0, 1, 100, 511, 512, 513, 4000, 16383, 16384, 16385, 65536];
        for (i, &len) in sizes.iter().enumerate() {
            setxattr(&f, &format!("user.b{i}"), &value(i, len), 0).unwrap();
        }
        v.remount();
        for (i, &len) in sizes.iter().enumerate() {
            assert_xattr(&f, &format!("user.b{i}"), &value(i, len));
        }
        assert_eq!(listxattr(&f).unwrap().len(), sizes.len(), "budget {budget}");
        assert_eq!(read_file(&f), b"data");
    }
}

#[test]
fn values_over_64_kib_are_e2big_and_create_nothing() {
    let mut v = TestVolume::new();
    let f = v.path("f");
    write_file(&f, b"");
    for len in [65_537, 100_000, 1 << 20] {
        assert_eq!(
            setxattr(&f, "user.big", &vec![7u8; len], 0).unwrap_err(),
            Errno::E2BIG,
            "{len} bytes"
        );
    }
    assert_eq!(getxattr(&f, "user.big").unwrap_err(), Errno::ENODATA);
    // Exactly the maximum is fine, and replacing it by an oversized value
    // leaves the old value in place.
    setxattr(&f, "user.big", &value(1, XATTR_SIZE_MAX), 0).unwrap();
    assert_eq!(
        setxattr(
            &f,
            "user.big",
            &vec![1u8; XATTR_SIZE_MAX + 1],
            XATTR_REPLACE
        )
        .unwrap_err(),
        Errno::E2BIG
    );
    v.remount();
    assert_xattr(&f, "user.big", &value(1, XATTR_SIZE_MAX));
}

#[test]
fn xattr_name_limits() {
    let mut v = TestVolume::new();
    let f = v.path("f");
    write_file(&f, b"");
    let longest = format!("user.{}", "n".repeat(250));
    assert_eq!(longest.len(), 255);
    let too_long = format!("user.{}", "n".repeat(251));
    setxattr(&f, &longest, b"longest name", 0).unwrap();
    assert_eq!(setxattr(&f, &too_long, b"x", 0).unwrap_err(), Errno::ERANGE);
    assert_eq!(getxattr_size(&f, &too_long).unwrap_err(), Errno::ERANGE);
    assert_eq!(removexattr(&f, &too_long).unwrap_err(), Errno::ERANGE);
    assert_eq!(
        setxattr(&f, "", b"x", 0).unwrap_err(),
        Errno::ERANGE,
        "empty name"
    );
    // Names that differ only in their last byte are distinct.
    let sibling = format!("user.{}m", "n".repeat(249));
    setxattr(&f, &sibling, b"sibling", 0).unwrap();
    v.remount();
    assert_xattr(&f, &longest, b"longest name");
    assert_xattr(&f, &sibling, b"sibling");
    assert_eq!(names_set(&f), BTreeSet::from([longest.clone(), sibling]));
    removexattr(&f, &longest).unwrap();
    assert_eq!(getxattr(&f, &longest).unwrap_err(), Errno::ENODATA);
}

/// A bare namespace is EINVAL for every xattr call, as the VFS answers on
/// ext4, xfs and tmpfs; an unknown namespace stays EOPNOTSUPP.
#[test]
fn bare_namespaces_are_einval_and_unknown_ones_eopnotsupp() {
    let v = TestVolume::new();
    let f = v.path("f");
    write_file(&f, b"");
    for bare in ["user.", "trusted.", "security."] {
        assert_eq!(
            setxattr(&f, bare, b"x", 0).unwrap_err(),
            Errno::EINVAL,
            "set {bare}"
        );
        assert_eq!(getxattr(&f, bare).unwrap_err(), Errno::EINVAL, "get {bare}");
        assert_eq!(
            removexattr(&f, bare).unwrap_err(),
            Errno::EINVAL,
            "remove {bare}"
        );
    }
    for unknown in ["foo.bar", "user", "system.other"] {
        assert_eq!(
            setxattr(&f, unknown, b"x", 0).unwrap_err(),
            Errno::EOPNOTSUPP,
            "set {unknown}"
        );
    }
    // The shortest real names work, and nothing above left a name behind.
    setxattr(&f, "user.a", b"1", 0).unwrap();
    assert_eq!(names_set(&f), BTreeSet::from(["user.a".to_string()]));
}

#[test]
fn missing_xattrs_are_enodata() {
    let v = TestVolume::new();
    let f = v.path("f");
    write_file(&f, b"");
    assert_eq!(getxattr(&f, "user.none").unwrap_err(), Errno::ENODATA);
    assert_eq!(getxattr_size(&f, "user.none").unwrap_err(), Errno::ENODATA);
    assert_eq!(removexattr(&f, "user.none").unwrap_err(), Errno::ENODATA);
    assert_eq!(getxattr(&f, "trusted.none").unwrap_err(), Errno::ENODATA);
    assert_eq!(getxattr(&f, "security.none").unwrap_err(), Errno::ENODATA);
    // With other xattrs in every tier present, a missing one is still missing.
    setxattr(&f, "user.a", b"a", 0).unwrap();
    setxattr(&f, "user.b", &value(1, 5000), 0).unwrap();
    setxattr(&f, "user.c", &value(2, 65536), 0).unwrap();
    assert_eq!(getxattr(&f, "user.none").unwrap_err(), Errno::ENODATA);
    assert_eq!(
        getxattr(&f, "user.a2").unwrap_err(),
        Errno::ENODATA,
        "prefix of nothing"
    );
    // Removed ones are gone.
    removexattr(&f, "user.b").unwrap();
    assert_eq!(getxattr(&f, "user.b").unwrap_err(), Errno::ENODATA);
    assert_eq!(removexattr(&f, "user.b").unwrap_err(), Errno::ENODATA);
    assert_eq!(
        names_set(&f),
        BTreeSet::from(["user.a".into(), "user.c".into()])
    );
    // Missing files.
    assert_eq!(
        getxattr(&v.path("nope"), "user.a").unwrap_err(),
        Errno::ENOENT
    );
}

#[test]
fn small_buffers_give_erange() {
    let v = TestVolume::new();
    let f = v.path("f");
    write_file(&f, b"");
    for (i, len) in [1usize, 300, 4096, 65536].into_iter().enumerate() {
        let name = format!("user.r{len}");
        let val = value(i, len);
        setxattr(&f, &name, &val, 0).unwrap();
        assert_eq!(
            getxattr_with_buf(&f, &name, len - 1).map(|_| ()),
            if len == 1 {
                // A zero-length buffer is a size query, not a short buffer.
                Ok(())
            } else {
                Err(Errno::ERANGE)
            }
        );
        assert_eq!(getxattr_with_buf(&f, &name, len).unwrap(), val);
        assert_eq!(getxattr_with_buf(&f, &name, len + 100).unwrap(), val);
    }
    // An empty value fits any buffer.
    setxattr(&f, "user.empty", b"", 0).unwrap();
    assert_eq!(getxattr_with_buf(&f, "user.empty", 1).unwrap(), b"");

    // listxattr: exact size works, one byte less is ERANGE.
    let size = listxattr_size(&f).unwrap();
    let expected: usize = [
        "user.r1",
        "user.r300",
        "user.r4096",
        "user.r65536",
        "user.empty",
    ]
    .iter()
    .map(|n| n.len() + 1)
    .sum();
    assert_eq!(
        size, expected,
        "listxattr size is the sum of names plus NULs"
    );
    assert_eq!(listxattr_with_buf(&f, size).unwrap().len(), size);
    assert_eq!(listxattr_with_buf(&f, size - 1).unwrap_err(), Errno::ERANGE);
    assert_eq!(listxattr_with_buf(&f, 1).unwrap_err(), Errno::ERANGE);
}

#[test]
fn xattr_create_and_replace_flags() {
    let mut v = TestVolume::new();
    let f = v.path("f");
    write_file(&f, b"");
    for (i, len) in [10usize, 1000, 20_000, 65_536].into_iter().enumerate() {
        let name = format!("user.flag{len}");
        let first = value(i, len);
        let second = value(i + 50, len / 2 + 3);
        assert_eq!(
            setxattr(&f, &name, &first, XATTR_REPLACE).unwrap_err(),
            Errno::ENODATA,
            "REPLACE of a missing xattr"
        );
        assert_eq!(
            getxattr(&f, &name).unwrap_err(),
            Errno::ENODATA,
            "REPLACE created it"
        );
        setxattr(&f, &name, &first, XATTR_CREATE).unwrap();
        assert_eq!(
            setxattr(&f, &name, &second, XATTR_CREATE).unwrap_err(),
            Errno::EEXIST,
            "CREATE of an existing xattr"
        );
        assert_xattr(&f, &name, &first);
        setxattr(&f, &name, &second, XATTR_REPLACE).unwrap();
        assert_xattr(&f, &name, &second);
        // Flags 0: create or replace.
        setxattr(&f, &name, &first, 0).unwrap();
        assert_xattr(&f, &name, &first);
    }
    v.remount();
    for (i, len) in [10usize, 1000, 20_000, 65_536].into_iter().enumerate() {
        assert_xattr(&f, &format!("user.flag{len}"), &value(i, len));
    }
}

#[test]
fn values_moving_between_tiers_leave_their_neighbours_intact() {
    let mut v = TestVolume::new();
    let f = v.path("f");
    write_file(&f, b"");
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (name, len) in [
        ("user.small", 20),
        ("user.mid", 2000),
        ("user.big", 65536),
        ("user.tiny", 0),
    ] {
        let val = value(name.len(), len);
        setxattr(&f, name, &val, 0).unwrap();
        model.insert(name.to_string(), val);
    }
    let steps = [10usize, 200, 400, 3000, 65536, 0, 70, 65535, 300, 40_000, 5];
    for (step, &len) in steps.iter().enumerate() {
        let val = value(step + 100, len);
        setxattr(&f, "user.moving", &val, 0).unwrap();
        model.insert("user.moving".into(), val);
        // Grow a neighbour too, every other step.
        if step % 2 == 1 {
            let val = value(step + 200, (step * 997) % 9000);
            setxattr(&f, "user.small", &val, 0).unwrap();
            model.insert("user.small".into(), val);
        }
        for (name, val) in &model {
            assert_xattr(&f, name, val);
        }
        if step % 4 == 3 {
            v.remount();
        }
    }
    assert_eq!(
        names_set(&f),
        model.keys().cloned().collect::<BTreeSet<_>>()
    );
    v.remount();
    for (name, val) in &model {
        assert_xattr(&f, name, val);
    }
}

#[test]
fn twenty_64_kib_values_on_one_file_survive_remounts() {
    let mut v = TestVolume::new();
    let f = v.path("f");
    write_file(&f, b"file data");
    const N: usize = 20;
    for i in 0..N {
        setxattr(
            &f,
            &format!("user.big{i:02}"),
            &value(i, XATTR_SIZE_MAX),
            XATTR_CREATE,
        )
        .unwrap();
    }
    let all: BTreeSet<String> = (0..N).map(|i| format!("user.big{i:02}")).collect();
    assert_eq!(names_set(&f), all);
    v.remount();
    assert_eq!(names_set(&f), all);
    for i in 0..N {
        assert_xattr(&f, &format!("user.big{i:02}"), &value(i, XATTR_SIZE_MAX));
    }
    // Data writes and attribute changes leave them alone.
    OpenOptions::new()
        .append(true)
        .open(&f)
        .unwrap()
        .write_all(b"+")
        .unwrap();
    chmod(&f, 0o600);
    for i in (0..N).step_by(2) {
        removexattr(&f, &format!("user.big{i:02}")).unwrap();
    }
    v.remount();
    for i in 0..N {
        let name = format!("user.big{i:02}");
        if i % 2 == 0 {
            assert_eq!(getxattr(&f, &name).unwrap_err(), Errno::ENODATA);
        } else {
            assert_xattr(&f, &name, &value(i, XATTR_SIZE_MAX));
        }
    }
    assert_eq!(names_set(&f).len(), N / 2);
    assert_eq!(read_file(&f), b"file data+");
}

#[test]
fn listxattr_lists_exactly_the_names_set() {
    let mut v = TestVolume::new();
    let f = v.path("f");
    write_file(&f, b"");
    assert_eq!(listxattr_size(&f).unwrap(), 0, "a new file has no xattrs");
    assert!(listxattr(&f).unwrap().is_empty());
    let mut expected = BTreeSet::new();
    for i in 0..60 {
        let name = format!("user.{}{i}", "k".repeat(i * 3));
        setxattr(&f, &name, &value(i, i * 50), 0).unwrap();
        expected.insert(name);
    }
    for name in ["trusted.t1", "security.s1", "trusted.big"] {
        let len = if name == "trusted.big" { 65536 } else { 12 };
        setxattr(&f, name, &value(3, len), 0).unwrap();
        expected.insert(name.to_string());
    }
    let listed = listxattr(&f).unwrap();
    assert_eq!(listed.len(), expected.len(), "no duplicates in listxattr");
    assert_eq!(listed.into_iter().collect::<BTreeSet<_>>(), expected);
    v.remount();
    assert_eq!(names_set(&f), expected);
    for name in expected.clone() {
        removexattr(&f, &name).unwrap();
    }
    assert_eq!(listxattr_size(&f).unwrap(), 0);
    v.remount();
    assert!(listxattr(&f).unwrap().is_empty());
}

#[test]
fn listxattr_of_more_than_64_kib_of_names_is_e2big() {
    let v = TestVolume::new();
    let f = v.path("f");
    write_file(&f, b"");
    // 300 names of 255 bytes: 76,800 bytes of list, over XATTR_LIST_MAX.
    let name = |i: usize| format!("user.{i:03}{}", "x".repeat(247));
    for i in 0..300 {
        assert_eq!(name(i).len(), 255);
        setxattr(&f, &name(i), &value(i, 8), 0).unwrap();
    }
    assert_eq!(listxattr_with_buf(&f, 1000).unwrap_err(), Errno::ERANGE);
    assert_eq!(
        listxattr_with_buf(&f, XATTR_SIZE_MAX).unwrap_err(),
        Errno::E2BIG,
        "a list that cannot fit XATTR_LIST_MAX is E2BIG"
    );
    // Every value is still reachable by name.
    for i in (0..300).step_by(37) {
        assert_xattr(&f, &name(i), &value(i, 8));
    }
    // Back under the limit, listing works again.
    for i in 200..300 {
        removexattr(&f, &name(i)).unwrap();
    }
    let listed = listxattr(&f).unwrap();
    assert_eq!(listed.len(), 200);
    assert_eq!(
        listed.into_iter().collect::<BTreeSet<_>>(),
        (0..200).map(name).collect::<BTreeSet<_>>()
    );
}

#[test]
fn xattrs_on_directories() {
    let mut v = TestVolume::new();
    let d = v.path("d");
    fs::create_dir(&d).unwrap();
    write_file(&d.join("child"), b"c");
    for (i, len) in [0usize, 10, 5000, 65536].into_iter().enumerate() {
        setxattr(&d, &format!("user.d{len}"), &value(i, len), 0).unwrap();
    }
    setxattr(&d, "trusted.dir", b"trusted on a dir", 0).unwrap();
    v.remount();
    for (i, len) in [0usize, 10, 5000, 65536].into_iter().enumerate() {
        assert_xattr(&d, &format!("user.d{len}"), &value(i, len));
    }
    assert_xattr(&d, "trusted.dir", b"trusted on a dir");
    assert_eq!(names_set(&d).len(), 5);
    assert!(
        listxattr(&d.join("child")).unwrap().is_empty(),
        "children do not inherit xattrs"
    );
    // Renaming the directory keeps them.
    fs::rename(&d, v.path("d2")).unwrap();
    assert_xattr(&v.path("d2"), "user.d65536", &value(3, 65536));
}

#[test]
fn xattrs_on_symlinks_through_the_l_calls() {
    let mut v = TestVolume::new();
    write_file(&v.path("target"), b"t");
    setxattr(&v.path("target"), "trusted.on_target", b"target's", 0).unwrap();
    let l = v.path("link");
    symlink("target", &l).unwrap();
    lsetxattr(&l, "trusted.a", &value(1, 100), 0).unwrap();
    lsetxattr(&l, "security.b", &value(2, 4000), 0).unwrap();
    lsetxattr(&l, "trusted.big", &value(3, XATTR_SIZE_MAX), 0).unwrap();
    // user.* is not allowed on symlinks (Linux rule).
    assert_eq!(lsetxattr(&l, "user.x", b"x", 0).unwrap_err(), Errno::EPERM);

    let check = |v: &TestVolume| {
        let l = v.path("link");
        assert_eq!(lgetxattr(&l, "trusted.a").unwrap(), value(1, 100));
        assert_eq!(lgetxattr(&l, "security.b").unwrap(), value(2, 4000));
        assert_bytes_eq(
            &lgetxattr(&l, "trusted.big").unwrap(),
            &value(3, XATTR_SIZE_MAX),
            "big",
        );
        let names: BTreeSet<String> = llistxattr(&l).unwrap().into_iter().collect();
        assert_eq!(
            names,
            BTreeSet::from([
                "trusted.a".into(),
                "trusted.big".into(),
                "security.b".into()
            ])
        );
        // The following calls see the target's xattrs, not the link's.
        assert_eq!(getxattr(&l, "trusted.a").unwrap_err(), Errno::ENODATA);
        assert_eq!(getxattr(&l, "trusted.on_target").unwrap(), b"target's");
        assert_eq!(
            lgetxattr(&l, "trusted.on_target").unwrap_err(),
            Errno::ENODATA
        );
    };
    check(&v);
    v.remount();
    check(&v);
    lremovexattr(&l, "trusted.a").unwrap();
    assert_eq!(lgetxattr(&l, "trusted.a").unwrap_err(), Errno::ENODATA);
    assert_eq!(llistxattr(&l).unwrap().len(), 2);

    // Special files: trusted.* works, user.* is refused.
    mknod(&v.path("fifo"), libc::S_IFIFO | 0o644, 0).unwrap();
    lsetxattr(&v.path("fifo"), "trusted.f", b"fifo", 0).unwrap();
    assert_eq!(lgetxattr(&v.path("fifo"), "trusted.f").unwrap(), b"fifo");
    assert_eq!(
        lsetxattr(&v.path("fifo"), "user.f", b"fifo", 0).unwrap_err(),
        Errno::EPERM
    );
}

#[test]
fn trusted_xattrs_are_for_root_only() {
    let v = TestVolume::with_options(&["allow_other"]);
    let u = users();
    let f = v.path("f");
    write_file(&f, b"");
    chown(&f, u.u1.uid, u.u1.gid);
    chmod(&f, 0o666);
    setxattr(&f, "trusted.secret", b"root only", 0).unwrap();
    setxattr(&f, "user.public", b"everyone", 0).unwrap();

    // The owner may not set or read trusted.*, and does not see it listed.
    assert_eq!(
        as_user(&u.u1, || setxattr(&f, "trusted.mine", b"x", 0)).unwrap_err(),
        Errno::EPERM
    );
    assert_eq!(
        as_user(&u.u1, || getxattr(&f, "trusted.secret")).unwrap_err(),
        Errno::ENODATA
    );
    assert_eq!(
        as_user(&u.u1, || removexattr(&f, "trusted.secret")).unwrap_err(),
        Errno::EPERM
    );
    let listed_by_u1 = as_user(&u.u1, || listxattr(&f)).unwrap();
    assert_eq!(
        listed_by_u1,
        vec!["user.public".to_string()],
        "trusted.* hidden from non-root"
    );
    assert_eq!(
        names_set(&f),
        BTreeSet::from(["trusted.secret".into(), "user.public".into()]),
        "root sees both"
    );
    assert_eq!(getxattr(&f, "trusted.secret").unwrap(), b"root only");
    assert_eq!(getxattr(&f, "trusted.mine").unwrap_err(), Errno::ENODATA);

    // user.* follows the file's permission bits.
    as_user(&u.u1, || setxattr(&f, "user.by_u1", b"1", 0)).unwrap();
    chmod(&f, 0o644);
    assert_eq!(
        as_user(&u.u2, || setxattr(&f, "user.by_u2", b"2", 0)).unwrap_err(),
        Errno::EACCES
    );
    assert_eq!(as_user(&u.u2, || getxattr(&f, "user.by_u1")).unwrap(), b"1");
    chmod(&f, 0o600);
    assert_eq!(
        as_user(&u.u2, || getxattr(&f, "user.by_u1")).unwrap_err(),
        Errno::EACCES
    );
}

#[test]
fn security_xattrs_round_trip() {
    let mut v = TestVolume::new();
    let f = v.path("f");
    write_file(&f, b"");
    setxattr(&f, "security.test", &value(9, 77), 0).unwrap();
    setxattr(&f, "security.large", &value(10, 30_000), 0).unwrap();
    v.remount();
    assert_xattr(&f, "security.test", &value(9, 77));
    assert_xattr(&f, "security.large", &value(10, 30_000));
}

#[test]
fn xattrs_die_with_their_inode_and_never_leak_to_new_files() {
    let mut v = TestVolume::new();
    for i in 0..30 {
        let p = v.path(format!("f{i}"));
        write_file(&p, b"");
        setxattr(&p, "user.small", b"s", 0).unwrap();
        setxattr(&p, "user.spill", &value(i, 3000), 0).unwrap();
        setxattr(&p, "user.huge", &value(i, 65536), 0).unwrap();
    }
    // A hard link keeps them alive through the other name.
    fs::hard_link(v.path("f0"), v.path("keep")).unwrap();
    for i in 0..30 {
        fs::remove_file(v.path(format!("f{i}"))).unwrap();
    }
    assert_xattr(&v.path("keep"), "user.huge", &value(0, 65536));
    v.remount();
    assert_xattr(&v.path("keep"), "user.spill", &value(0, 3000));
    for i in 0..30 {
        let p = v.path(format!("f{i}"));
        File::create(&p).unwrap();
        assert_eq!(
            listxattr_size(&p).unwrap(),
            0,
            "new {} has no xattrs",
            p.display()
        );
        assert_eq!(getxattr(&p, "user.huge").unwrap_err(), Errno::ENODATA);
    }
    v.remount();
    for i in 0..30 {
        assert!(listxattr(&v.path(format!("f{i}"))).unwrap().is_empty());
    }
}

#[test]
fn concurrent_setxattr_on_one_file_loses_nothing() {
    let mut v = TestVolume::new();
    let f = v.path("f");
    write_file(&f, b"");
    std::thread::scope(|s| {
        for t in 0..4 {
            let f = &f;
            s.spawn(move || {
                for i in 0..40 {
                    let len = [5usize, 400, 3000, 65536][(t + i) % 4];
                    setxattr(f, &format!("user.t{t}.{i}"), &value(t * 100 + i, len), 0).unwrap();
                }
            });
        }
    });
    assert_eq!(listxattr(&f).unwrap().len(), 160);
    v.remount();
    for t in 0..4 {
        for i in 0..40 {
            let len = [5usize, 400, 3000, 65536][(t + i) % 4];
            assert_xattr(&f, &format!("user.t{t}.{i}"), &value(t * 100 + i, len));
        }
    }
}
