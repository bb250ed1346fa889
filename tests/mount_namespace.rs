//! The POSIX namespace through a real FUSE mount: every file type, links,
//! rename (plain, over existing names, `RENAME_NOREPLACE`, `RENAME_EXCHANGE`),
//! name limits, errnos, directory link counts, readdir under concurrent change
//! and unlink of open files.

mod common;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirEntryExt, FileTypeExt, MetadataExt, symlink};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use common::*;

fn nlink(p: &Path) -> u64 {
    lmeta(p).nlink()
}

fn ino(p: &Path) -> u64 {
    lmeta(p).ino()
}

/// `d_ino` of `..` as listed by readdir of `dir` (served by the daemon).
fn dotdot_ino_from_readdir(dir: &Path) -> u64 {
    let mut d = nix::dir::Dir::open(
        dir,
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY,
        nix::sys::stat::Mode::empty(),
    )
    .unwrap();
    for e in d.iter() {
        let e = e.unwrap();
        if e.file_name().to_bytes() == b".." {
            return e.ino();
        }
    }
    panic!("readdir of {} has no `..` entry", dir.display());
}

#[test]
fn create_file_dir_and_symlink_survive_remount() {
    let mut v = TestVolume::new();
    let f = v.path("file.txt");
    let d = v.path("dir");
    let l = v.path("link");
    write_file(&f, b"hello safs");
    fs::create_dir(&d).unwrap();
    symlink("file.txt", &l).unwrap();

    let check = |v: &TestVolume| {
        let m = lmeta(&v.path("file.txt"));
        assert!(m.file_type().is_file());
        assert_eq!(m.len(), 10);
        assert_eq!(m.nlink(), 1);
        assert_eq!((m.uid(), m.gid()), (0, 0), "created by root");
        assert!(lmeta(&v.path("dir")).is_dir());
        assert!(lmeta(&v.path("link")).file_type().is_symlink());
        assert_eq!(
            read_file(&v.path("link")),
            b"hello safs",
            "read through the symlink"
        );
        assert_eq!(list_dir(v.mnt()), ["dir", "file.txt", "link"]);
    };
    check(&v);
    let inos = (ino(&f), ino(&d), ino(&l));
    v.remount();
    check(&v);
    assert_eq!(
        (ino(&f), ino(&d), ino(&l)),
        inos,
        "inode numbers are stable across remount"
    );
    assert_ne!(inos.0, inos.1);
    assert_ne!(inos.1, inos.2);
}

#[test]
fn directory_link_counts_follow_subdirectories() {
    let mut v = TestVolume::new();
    let root = v.mnt().to_path_buf();
    assert_eq!(nlink(&root), 2, "empty root: . and its entry");
    let a = root.join("a");
    let b = root.join("b");
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    assert_eq!(nlink(&a), 2);
    assert_eq!(nlink(&root), 4, "two subdirectories add two `..`");
    fs::create_dir(a.join("x")).unwrap();
    fs::create_dir(a.join("y")).unwrap();
    write_file(&a.join("file"), b"f");
    assert_eq!(nlink(&a), 4, "files do not count, subdirectories do");

    // Moving a subdirectory moves its `..` link from one parent to the other.
    fs::rename(a.join("x"), b.join("x")).unwrap();
    assert_eq!(nlink(&a), 3);
    assert_eq!(nlink(&b), 3);
    assert_eq!(nlink(&root), 4);
    assert_eq!(dotdot_ino_from_readdir(&b.join("x")), ino(&b));

    fs::remove_dir(a.join("y")).unwrap();
    assert_eq!(nlink(&a), 2);

    v.remount();
    assert_eq!(nlink(v.mnt()), 4);
    assert_eq!(nlink(&a), 2);
    assert_eq!(nlink(&b), 3);
    assert_eq!(nlink(&b.join("x")), 2);
    assert_eq!(dotdot_ino_from_readdir(&b.join("x")), ino(&b));
    assert_eq!(dotdot_ino_from_readdir(&a), ino(v.mnt()));
}

#[test]
fn symlink_targets_read_back_exactly() {
    let mut v = TestVolume::new();
    let targets: Vec<(String, String)> = vec![
        ("rel".into(), "some/relative/target".into()),
        ("abs".into(), "/etc/hostname".into()),
        ("dangling".into(), "does-not-exist".into()),
        ("dots".into(), "../../..".into()),
        ("long".into(), "x".repeat(1000)),
        (
            "max".into(),
            format!("{}/{}", "d".repeat(2047), "e".repeat(2047)),
        ),
    ];
    assert_eq!(targets[5].1.len(), 4095, "PATH_MAX - 1");
    for (name, target) in &targets {
        symlink(target, v.path(name)).unwrap();
    }
    for round in 0..2 {
        for (name, target) in &targets {
            let p = v.path(name);
            assert_eq!(
                fs::read_link(&p).unwrap().as_os_str(),
                target.as_str(),
                "readlink {name} (round {round})"
            );
            let m = lmeta(&p);
            assert!(m.file_type().is_symlink());
            assert_eq!(
                m.len(),
                target.len() as u64,
                "symlink st_size is the target length"
            );
        }
        v.remount();
    }
    assert_eq!(
        fs::metadata(v.path("dangling"))
            .map_err(errno_of)
            .unwrap_err(),
        Errno::ENOENT
    );
    // A target longer than PATH_MAX - 1 is refused by the kernel.
    assert_eq!(
        symlink("y".repeat(4096), v.path("toolong"))
            .errno()
            .unwrap_err(),
        Errno::ENAMETOOLONG
    );
}

#[test]
fn hard_links_share_inode_data_and_count() {
    let mut v = TestVolume::new();
    let a = v.path("a");
    fs::create_dir(v.path("sub")).unwrap();
    let b = v.path("sub/b");
    write_file(&a, b"shared data");
    fs::hard_link(&a, &b).unwrap();
    assert_eq!(ino(&a), ino(&b));
    assert_eq!(nlink(&a), 2);
    assert_eq!(nlink(&b), 2);

    // Writes through one name are visible through the other.
    OpenOptions::new()
        .append(true)
        .open(&b)
        .unwrap()
        .write_all(b"+more")
        .unwrap();
    assert_eq!(read_file(&a), b"shared data+more");

    fs::hard_link(&a, v.path("c")).unwrap();
    assert_eq!(nlink(&b), 3);
    v.remount();
    assert_eq!(nlink(&a), 3);
    assert_eq!(ino(&a), ino(&b));
    fs::remove_file(&a).unwrap();
    assert_eq!(nlink(&b), 2);
    fs::remove_file(v.path("c")).unwrap();
    assert_eq!(nlink(&b), 1);
    assert_eq!(read_file(&b), b"shared data+more");

    // Errors: existing target, directory source, missing source.
    write_file(&a, b"x");
    assert_eq!(fs::hard_link(&a, &b).errno().unwrap_err(), Errno::EEXIST);
    assert_eq!(
        fs::hard_link(v.path("sub"), v.path("sublink"))
            .errno()
            .unwrap_err(),
        Errno::EPERM
    );
    assert_eq!(
        fs::hard_link(v.path("missing"), v.path("m2"))
            .errno()
            .unwrap_err(),
        Errno::ENOENT
    );
    v.remount();
    assert_eq!(nlink(&b), 1);
    assert_eq!(read_file(&b), b"shared data+more");
}

#[test]
fn hard_link_to_symlink_links_the_symlink() {
    let v = TestVolume::new();
    symlink("target", v.path("sym")).unwrap();
    // link(2) does not follow symlinks on Linux.
    fs::hard_link(v.path("sym"), v.path("sym2")).unwrap();
    assert!(lmeta(&v.path("sym2")).file_type().is_symlink());
    assert_eq!(ino(&v.path("sym")), ino(&v.path("sym2")));
    assert_eq!(nlink(&v.path("sym")), 2);
    assert_eq!(fs::read_link(v.path("sym2")).unwrap().as_os_str(), "target");
}

#[test]
fn mknod_fifo_socket_and_device_nodes() {
    let mut v = TestVolume::new();
    let fifo = v.path("fifo");
    let sock = v.path("sock");
    let chr = v.path("chr");
    let blk = v.path("blk");
    let um = current_umask();
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o640)).unwrap();
    mknod(&sock, libc::S_IFSOCK | 0o600, 0).unwrap();
    mknod(&chr, libc::S_IFCHR | 0o620, libc::makedev(1, 3)).unwrap();
    mknod(&blk, libc::S_IFBLK | 0o660, libc::makedev(7, 42)).unwrap();
    // mknod of an existing name.
    assert_eq!(
        mknod(&chr, libc::S_IFCHR | 0o600, 0).unwrap_err(),
        Errno::EEXIST
    );

    let check = |v: &TestVolume| {
        let m = lmeta(&v.path("fifo"));
        assert!(m.file_type().is_fifo());
        assert_eq!(m.mode() & 0o7777, 0o640 & !um);
        let m = lmeta(&v.path("sock"));
        assert!(m.file_type().is_socket());
        assert_eq!(m.mode() & 0o7777, 0o600 & !um);
        let m = lmeta(&v.path("chr"));
        assert!(m.file_type().is_char_device());
        assert_eq!(m.rdev(), libc::makedev(1, 3));
        assert_eq!(m.mode() & 0o7777, 0o620 & !um);
        let m = lmeta(&v.path("blk"));
        assert!(m.file_type().is_block_device());
        assert_eq!(m.rdev(), libc::makedev(7, 42));
        assert_eq!(m.len(), 0);
    };
    check(&v);
    v.remount();
    check(&v);

    // A FIFO on safs carries data between two openers.
    let reader = std::thread::spawn({
        let fifo = fifo.clone();
        move || {
            let mut s = String::new();
            File::open(&fifo).unwrap().read_to_string(&mut s).unwrap();
            s
        }
    });
    OpenOptions::new()
        .write(true)
        .open(&fifo)
        .unwrap()
        .write_all(b"through the fifo")
        .unwrap();
    assert_eq!(reader.join().unwrap(), "through the fifo");
}

#[test]
fn unix_socket_bound_on_the_mount_accepts_connections() {
    let v = TestVolume::new();
    let path = v.path("listener.sock");
    let listener = UnixListener::bind(&path).unwrap();
    assert!(lmeta(&path).file_type().is_socket());
    let client = std::thread::spawn({
        let path = path.clone();
        move || {
            let mut s = UnixStream::connect(&path).unwrap();
            s.write_all(b"ping").unwrap();
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).unwrap();
            buf
        }
    });
    let (mut conn, _) = listener.accept().unwrap();
    let mut buf = [0u8; 4];
    conn.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
    conn.write_all(b"pong").unwrap();
    assert_eq!(&client.join().unwrap(), b"pong");
    drop(conn);
    drop(listener);
    fs::remove_file(&path).unwrap();
    assert!(!path.exists());
}

#[test]
fn rename_file_over_existing_file_replaces_it() {
    let mut v = TestVolume::new();
    let a = v.path("a");
    let b = v.path("b");
    write_file(&a, b"new contents");
    write_file(&b, b"old contents");
    let a_ino = ino(&a);
    // Keep the replaced file open: its data must stay readable.
    let mut old = File::open(&b).unwrap();
    fs::rename(&a, &b).unwrap();
    assert!(!a.exists());
    assert_eq!(ino(&b), a_ino);
    assert_eq!(read_file(&b), b"new contents");
    let mut s = Vec::new();
    old.read_to_end(&mut s).unwrap();
    assert_eq!(
        s, b"old contents",
        "replaced file stays readable while open"
    );
    drop(old);

    // Rename across directories, and onto itself (a no-op).
    fs::create_dir(v.path("d")).unwrap();
    fs::rename(&b, v.path("d/b2")).unwrap();
    fs::rename(v.path("d/b2"), v.path("d/b2")).unwrap();
    v.remount();
    assert_eq!(list_dir(v.mnt()), ["d"]);
    assert_eq!(list_dir(&v.path("d")), ["b2"]);
    assert_eq!(read_file(&v.path("d/b2")), b"new contents");
    assert_eq!(ino(&v.path("d/b2")), a_ino);
    assert_eq!(nlink(&v.path("d/b2")), 1);
}

#[test]
fn rename_of_hard_link_onto_its_sibling_is_a_noop() {
    let v = TestVolume::new();
    write_file(&v.path("a"), b"x");
    fs::hard_link(v.path("a"), v.path("b")).unwrap();
    // POSIX: if old and new are links to the same file, rename does nothing.
    fs::rename(v.path("a"), v.path("b")).unwrap();
    assert!(v.path("a").exists());
    assert!(v.path("b").exists());
    assert_eq!(nlink(&v.path("a")), 2);
}

#[test]
fn rename_directories_over_empty_and_non_empty_dirs() {
    let mut v = TestVolume::new();
    for d in ["src", "empty", "full", "full/child"] {
        fs::create_dir(v.path(d)).unwrap();
    }
    write_file(&v.path("src/inner"), b"inside");
    write_file(&v.path("file"), b"f");

    // Directory over a non-empty directory.
    let e = fs::rename(v.path("src"), v.path("full"))
        .errno()
        .unwrap_err();
    assert!(
        e == Errno::ENOTEMPTY || e == Errno::EEXIST,
        "rename dir over non-empty dir: {e}"
    );
    // Directory over a file, file over a directory.
    assert_eq!(
        fs::rename(v.path("src"), v.path("file"))
            .errno()
            .unwrap_err(),
        Errno::ENOTDIR
    );
    assert_eq!(
        fs::rename(v.path("file"), v.path("empty"))
            .errno()
            .unwrap_err(),
        Errno::EISDIR
    );
    // Directory into its own subtree.
    assert_eq!(
        fs::rename(v.path("full"), v.path("full/child/x"))
            .errno()
            .unwrap_err(),
        Errno::EINVAL
    );
    // Missing source.
    assert_eq!(
        fs::rename(v.path("nope"), v.path("x")).errno().unwrap_err(),
        Errno::ENOENT
    );
    assert_eq!(nlink(v.mnt()), 5, "root: src, empty, full");

    // Directory over an empty directory replaces it.
    let src_ino = ino(&v.path("src"));
    fs::rename(v.path("src"), v.path("empty")).unwrap();
    assert_eq!(ino(&v.path("empty")), src_ino);
    assert_eq!(read_file(&v.path("empty/inner")), b"inside");
    assert_eq!(nlink(v.mnt()), 4, "one directory fewer in root");
    v.remount();
    assert_eq!(list_dir(v.mnt()), ["empty", "file", "full"]);
    assert_eq!(read_file(&v.path("empty/inner")), b"inside");
    assert_eq!(nlink(v.mnt()), 4);
    assert_eq!(list_dir(&v.path("full")), ["child"]);
}

#[test]
fn rename_noreplace_refuses_existing_target() {
    let mut v = TestVolume::new();
    write_file(&v.path("a"), b"aaa");
    write_file(&v.path("b"), b"bbb");
    fs::create_dir(v.path("d")).unwrap();
    assert_eq!(
        renameat2(&v.path("a"), &v.path("b"), libc::RENAME_NOREPLACE).unwrap_err(),
        Errno::EEXIST
    );
    assert_eq!(
        renameat2(&v.path("a"), &v.path("d"), libc::RENAME_NOREPLACE).unwrap_err(),
        Errno::EEXIST
    );
    assert_eq!(read_file(&v.path("a")), b"aaa");
    assert_eq!(read_file(&v.path("b")), b"bbb");
    renameat2(&v.path("a"), &v.path("d/c"), libc::RENAME_NOREPLACE).unwrap();
    assert!(!v.path("a").exists());
    v.remount();
    assert_eq!(read_file(&v.path("d/c")), b"aaa");
    assert_eq!(list_dir(v.mnt()), ["b", "d"]);
}

#[test]
fn rename_exchange_swaps_file_and_directory_across_parents() {
    let mut v = TestVolume::new();
    fs::create_dir(v.path("A")).unwrap();
    fs::create_dir(v.path("B")).unwrap();
    write_file(&v.path("A/f"), b"file in A");
    fs::create_dir(v.path("B/d")).unwrap();
    write_file(&v.path("B/d/inside"), b"inside d");
    let (f_ino, d_ino) = (ino(&v.path("A/f")), ino(&v.path("B/d")));
    let (a_ino, b_ino) = (ino(&v.path("A")), ino(&v.path("B")));
    assert_eq!((nlink(&v.path("A")), nlink(&v.path("B"))), (2, 3));

    renameat2(&v.path("A/f"), &v.path("B/d"), libc::RENAME_EXCHANGE).unwrap();

    let check = |v: &TestVolume| {
        assert_eq!(ino(&v.path("A/f")), d_ino, "A/f is now the directory");
        assert_eq!(ino(&v.path("B/d")), f_ino, "B/d is now the file");
        assert!(lmeta(&v.path("A/f")).is_dir());
        assert_eq!(read_file(&v.path("A/f/inside")), b"inside d");
        assert_eq!(read_file(&v.path("B/d")), b"file in A");
        assert_eq!(nlink(&v.path("A")), 3, "A gained a subdirectory");
        assert_eq!(nlink(&v.path("B")), 2, "B lost its subdirectory");
        assert_eq!(ino(&v.path("A/f/..")), a_ino);
        assert_eq!(dotdot_ino_from_readdir(&v.path("A/f")), a_ino);
        assert_eq!(ino(&v.path("B")), b_ino);
    };
    check(&v);
    v.remount();
    check(&v);

    // Exchange needs both names to exist.
    assert_eq!(
        renameat2(&v.path("B/d"), &v.path("B/missing"), libc::RENAME_EXCHANGE).unwrap_err(),
        Errno::ENOENT
    );
    // Exchange of two files in one directory.
    write_file(&v.path("B/e"), b"eee");
    renameat2(&v.path("B/d"), &v.path("B/e"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(read_file(&v.path("B/d")), b"eee");
    assert_eq!(read_file(&v.path("B/e")), b"file in A");
}

#[test]
fn rmdir_and_unlink_errnos() {
    let mut v = TestVolume::new();
    fs::create_dir_all(v.path("d/sub")).unwrap();
    write_file(&v.path("d/file"), b"x");
    assert_eq!(
        fs::remove_dir(v.path("d")).errno().unwrap_err(),
        Errno::ENOTEMPTY
    );
    assert_eq!(
        fs::remove_dir(v.path("d/file")).errno().unwrap_err(),
        Errno::ENOTDIR
    );
    assert_eq!(
        fs::remove_file(v.path("d")).errno().unwrap_err(),
        Errno::EISDIR
    );
    assert_eq!(
        fs::remove_file(v.path("d/missing")).errno().unwrap_err(),
        Errno::ENOENT
    );
    assert_eq!(
        fs::remove_dir(v.path("d/missing")).errno().unwrap_err(),
        Errno::ENOENT
    );
    // A directory that only held a file that is now gone is empty again.
    fs::remove_file(v.path("d/file")).unwrap();
    assert_eq!(
        fs::remove_dir(v.path("d")).errno().unwrap_err(),
        Errno::ENOTEMPTY
    );
    fs::remove_dir(v.path("d/sub")).unwrap();
    fs::remove_dir(v.path("d")).unwrap();
    assert!(list_dir(v.mnt()).is_empty());
    assert_eq!(nlink(v.mnt()), 2);
    v.remount();
    assert!(list_dir(v.mnt()).is_empty());
    assert_eq!(nlink(v.mnt()), 2);
}

#[test]
fn names_of_255_bytes_work_and_256_bytes_are_enametoolong() {
    let mut v = TestVolume::new();
    let ok = "n".repeat(255);
    let ok2 = "m".repeat(255);
    let long = "l".repeat(256);
    // Multi-byte UTF-8: 85 three-byte characters are 255 bytes.
    let utf8 = "\u{20ac}".repeat(85);
    assert_eq!(utf8.len(), 255);

    write_file(&v.path(&ok), b"255");
    fs::create_dir(v.path(&ok2)).unwrap();
    write_file(&v.path(&utf8), b"utf8");
    symlink(format!("../{ok}"), v.path(format!("{ok2}/{ok}"))).unwrap();
    fs::hard_link(v.path(&ok), v.path(format!("{ok2}/{}", "h".repeat(255)))).unwrap();

    let too_long = v.path(&long);
    assert_eq!(
        File::create(&too_long).errno().unwrap_err(),
        Errno::ENAMETOOLONG
    );
    assert_eq!(
        fs::create_dir(&too_long).errno().unwrap_err(),
        Errno::ENAMETOOLONG
    );
    assert_eq!(
        symlink("t", &too_long).errno().unwrap_err(),
        Errno::ENAMETOOLONG
    );
    assert_eq!(
        fs::hard_link(v.path(&ok), &too_long).errno().unwrap_err(),
        Errno::ENAMETOOLONG
    );
    assert_eq!(
        fs::rename(v.path(&ok), &too_long).errno().unwrap_err(),
        Errno::ENAMETOOLONG
    );
    assert_eq!(
        mknod(&too_long, libc::S_IFIFO | 0o644, 0).unwrap_err(),
        Errno::ENAMETOOLONG
    );
    assert_eq!(
        fs::metadata(&too_long).errno().unwrap_err(),
        Errno::ENAMETOOLONG
    );
    assert_eq!(
        setxattr(&too_long, "user.x", b"v", 0).unwrap_err(),
        Errno::ENAMETOOLONG
    );
    // Nothing was created by the failed calls.
    v.remount();
    let mut expected = vec![ok.clone(), ok2.clone(), utf8.clone()];
    expected.sort();
    assert_eq!(list_dir(v.mnt()), expected);
    assert_eq!(read_file(&v.path(&ok)), b"255");
    assert_eq!(read_file(&v.path(&utf8)), b"utf8");
    assert_eq!(read_file(&v.path(format!("{ok2}/{ok}"))), b"255");
    assert_eq!(nlink(&v.path(&ok)), 2);
}

#[test]
fn symlink_loops_give_eloop() {
    let v = TestVolume::new();
    symlink("b", v.path("a")).unwrap();
    symlink("a", v.path("b")).unwrap();
    symlink("self", v.path("self")).unwrap();
    assert_eq!(fs::metadata(v.path("a")).errno().unwrap_err(), Errno::ELOOP);
    assert_eq!(
        File::open(v.path("self")).errno().unwrap_err(),
        Errno::ELOOP
    );
    assert_eq!(
        fs::metadata(v.path("self/x")).errno().unwrap_err(),
        Errno::ELOOP
    );
    // A chain longer than the kernel's 40 follows.
    write_file(&v.path("end"), b"end");
    symlink("end", v.path("c0")).unwrap();
    for i in 1..=40 {
        symlink(format!("c{}", i - 1), v.path(format!("c{i}"))).unwrap();
    }
    assert_eq!(read_file(&v.path("c39")), b"end", "39 hops are fine");
    assert_eq!(File::open(v.path("c40")).errno().unwrap_err(), Errno::ELOOP);
    // O_NOFOLLOW on a symlink.
    assert_eq!(
        open_raw(&v.path("c0"), libc::O_RDONLY | libc::O_NOFOLLOW, 0).unwrap_err(),
        Errno::ELOOP
    );
    // lstat of a looping link works.
    assert!(lmeta(&v.path("a")).file_type().is_symlink());
}

#[test]
fn directories_refuse_writes_with_eisdir() {
    let v = TestVolume::new();
    fs::create_dir(v.path("d")).unwrap();
    write_file(&v.path("f"), b"x");
    assert_eq!(
        open_raw(&v.path("d"), libc::O_WRONLY, 0).unwrap_err(),
        Errno::EISDIR
    );
    assert_eq!(
        open_raw(&v.path("d"), libc::O_RDWR, 0).unwrap_err(),
        Errno::EISDIR
    );
    assert_eq!(
        open_raw(&v.path("d"), libc::O_RDONLY | libc::O_CREAT, 0o644).unwrap_err(),
        Errno::EISDIR
    );
    let dir = File::open(v.path("d")).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!((&dir).read(&mut buf).errno().unwrap_err(), Errno::EISDIR);
    assert_eq!(
        open_raw(&v.path("f/x"), libc::O_RDONLY, 0).unwrap_err(),
        Errno::ENOTDIR
    );
    assert_eq!(
        open_raw(&v.path("f"), libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap_err(),
        Errno::ENOTDIR
    );
}

/// Reads a directory with raw readdir, returning (name, d_ino) without `.`/`..`.
fn readdir_entries(dir: &Path) -> Vec<(String, u64)> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), e.ino())
        })
        .collect()
}

#[test]
fn readdir_lists_thousands_of_entries_exactly_once() {
    let mut v = TestVolume::new();
    let d = v.path("big");
    fs::create_dir(&d).unwrap();
    const N: usize = 4000;
    let mut expected = BTreeSet::new();
    for i in 0..N {
        // Varying name lengths so entries straddle getdents buffer borders.
        let name = format!("entry-{i:05}-{}", "x".repeat(i % 60));
        if i % 10 == 0 {
            fs::create_dir(d.join(&name)).unwrap();
        } else {
            File::create(d.join(&name)).unwrap();
        }
        expected.insert(name);
    }
    for round in 0..2 {
        let entries = readdir_entries(&d);
        assert_eq!(entries.len(), N, "round {round}: entry count");
        let names: BTreeSet<String> = entries.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(names.len(), N, "round {round}: duplicate names in readdir");
        assert_eq!(names, expected, "round {round}");
        // d_ino matches lstat and file types are right.
        for (name, dino) in entries.iter().step_by(97) {
            let m = lmeta(&d.join(name));
            assert_eq!(*dino, m.ino(), "d_ino of {name}");
        }
        for e in fs::read_dir(&d).unwrap().step_by(89) {
            let e = e.unwrap();
            let i: usize = e.file_name().to_string_lossy()[6..11].parse().unwrap();
            assert_eq!(e.file_type().unwrap().is_dir(), i % 10 == 0);
        }
        assert_eq!(nlink(&d), 2 + (N / 10) as u64);
        v.remount();
    }
}

#[test]
fn readdir_while_deleting_and_creating_never_duplicates_or_skips() {
    let v = TestVolume::new();
    let d = v.path("churn");
    fs::create_dir(&d).unwrap();
    const N: usize = 3000;
    let names: Vec<String> = (0..N)
        .map(|i| format!("f{i:05}-{}", "p".repeat(i % 40)))
        .collect();
    for n in &names {
        File::create(d.join(n)).unwrap();
    }
    let mut deleted: HashSet<String> = HashSet::new();
    let mut created: HashSet<String> = HashSet::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut victim = 0usize;
    let mut count = 0usize;
    for e in fs::read_dir(&d).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        *seen.entry(name).or_default() += 1;
        count += 1;
        if count % 50 == 0 {
            // Delete entries spread over the whole directory (some already
            // returned, some not yet) and create new ones.
            for _ in 0..10 {
                victim = (victim + 337) % N;
                if deleted.insert(names[victim].clone()) {
                    fs::remove_file(d.join(&names[victim])).unwrap();
                }
            }
            let new = format!("new-{count}");
            File::create(d.join(&new)).unwrap();
            created.insert(new);
        }
    }
    assert!(deleted.len() > 400, "the test deleted during iteration");
    let dups: Vec<_> = seen.iter().filter(|(_, c)| **c > 1).collect();
    assert!(dups.is_empty(), "entries returned twice: {dups:?}");
    for n in &names {
        if !deleted.contains(n) {
            assert!(seen.contains_key(n), "unchanged entry {n} was skipped");
        }
    }
    for n in seen.keys() {
        assert!(
            names.contains(n) || created.contains(n),
            "readdir returned a name that never existed: {n}"
        );
    }
    // A fresh listing is exactly the current state.
    let now: BTreeSet<String> = readdir_entries(&d).into_iter().map(|(n, _)| n).collect();
    let want: BTreeSet<String> = names
        .iter()
        .filter(|n| !deleted.contains(*n))
        .chain(created.iter())
        .cloned()
        .collect();
    assert_eq!(now, want);
}

/// xfstests generic/736: every entry is renamed away and back while the
/// directory is being listed. A rename within one directory keeps the
/// entry's place, so the listing ends, and returns each entry exactly once.
#[test]
fn listing_ends_while_each_entry_is_renamed_away_and_back() {
    let v = TestVolume::new();
    let d = v.path("d");
    fs::create_dir(&d).unwrap();
    const N: usize = 3000;
    for i in 1..=N {
        File::create(d.join(i.to_string())).unwrap();
    }
    let mut seen = BTreeSet::new();
    let mut count = 0;
    for e in fs::read_dir(&d).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        count += 1;
        assert!(
            count <= N,
            "the listing did not end: {count} entries so far"
        );
        assert!(seen.insert(name.clone()), "{name} listed twice");
        fs::rename(d.join(&name), d.join("TEMPFILE")).unwrap();
        fs::rename(d.join("TEMPFILE"), d.join(&name)).unwrap();
    }
    assert_eq!(count, N, "every entry once");
    // A rename over an existing name and an exchange keep places too.
    fs::rename(d.join("1"), d.join("2")).unwrap();
    renameat2(&d.join("3"), &d.join("4"), libc::RENAME_EXCHANGE).unwrap();
    let listed = readdir_entries(&d);
    assert_eq!(listed.len(), N - 1);
    let names: BTreeSet<_> = listed.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(names.len(), N - 1, "no duplicates after renames over names");
    assert!(!names.contains("1") && names.contains("2"));
}

#[test]
fn seekdir_to_a_telldir_cookie_resumes_after_deletions() {
    let v = TestVolume::new();
    let d = v.path("cookies");
    fs::create_dir(&d).unwrap();
    const N: usize = 600;
    for i in 0..N {
        File::create(d.join(format!("e{i:04}"))).unwrap();
    }
    let raw = RawDirStream::open(&d);
    // Read the first 200 entries, remember the position.
    let mut first = Vec::new();
    for _ in 0..200 {
        first.push(raw.next_name().expect("entry"));
    }
    let cookie = raw.tell();
    let mut rest_before = Vec::new();
    while let Some(n) = raw.next_name() {
        rest_before.push(n);
    }
    // Delete entries that were already returned, then resume from the cookie.
    for n in first.iter().filter(|n| n.starts_with('e')).take(100) {
        fs::remove_file(d.join(n)).unwrap();
    }
    raw.seek(cookie);
    let mut rest_after = Vec::new();
    while let Some(n) = raw.next_name() {
        rest_after.push(n);
    }
    assert_eq!(
        rest_after, rest_before,
        "entries after the cookie are unchanged by deletions before it"
    );
}

/// Minimal libc `DIR*` wrapper, for telldir/seekdir.
struct RawDirStream(*mut libc::DIR);

impl RawDirStream {
    fn open(path: &Path) -> Self {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid NUL-terminated path.
        let p = unsafe { libc::opendir(c.as_ptr()) };
        assert!(!p.is_null(), "opendir {}", path.display());
        RawDirStream(p)
    }

    fn next_name(&self) -> Option<String> {
        loop {
            // SAFETY: self.0 is a valid DIR* until drop.
            let e = unsafe { libc::readdir(self.0) };
            if e.is_null() {
                return None;
            }
            // SAFETY: readdir returned a valid dirent with a NUL-terminated name.
            let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) }
                .to_string_lossy()
                .into_owned();
            if name != "." && name != ".." {
                return Some(name);
            }
        }
    }
    fn tell(&self) -> libc::c_long {
        // SAFETY: valid DIR*.
        unsafe { libc::telldir(self.0) }
    }
    fn seek(&self, pos: libc::c_long) {
        // SAFETY: valid DIR* and a position from telldir on it.
        unsafe { libc::seekdir(self.0, pos) }
    }
}

impl Drop for RawDirStream {
    fn drop(&mut self) {
        // SAFETY: valid DIR*, closed once.
        unsafe { libc::closedir(self.0) };
    }
}

/// Total bytes allocated to all files under `dir` (st_blocks * 512).
fn allocated_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        for e in fs::read_dir(&p).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else {
                total += m.blocks() * 512;
            }
        }
    }
    total
}

#[test]
fn unlinked_open_file_stays_readable_until_close() {
    let mut v = TestVolume::new();
    let p = v.path("doomed");
    let data = pattern(7, 3 * 1024 * 1024 + 17);
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    f.write_all(&data).unwrap();
    let mut second = File::open(&p).unwrap();
    fs::remove_file(&p).unwrap();

    assert_eq!(fs::metadata(&p).errno().unwrap_err(), Errno::ENOENT);
    assert!(list_dir(v.mnt()).is_empty());
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    assert_eq!(f.metadata().unwrap().len(), data.len() as u64);

    let mut back = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut back).unwrap();
    assert_bytes_eq(&back, &data, "unlinked file through its fd");

    // Still writable, and visible to the other descriptor.
    f.write_all(b"tail").unwrap();
    drop(f);
    let mut back = Vec::new();
    second.read_to_end(&mut back).unwrap();
    assert_eq!(back.len(), data.len() + 4);
    assert_eq!(&back[data.len()..], b"tail");
    drop(second);

    // A new file may take the name meanwhile.
    write_file(&p, b"new file");
    v.remount();
    assert_eq!(read_file(&p), b"new file");
    assert_eq!(list_dir(v.mnt()), ["doomed"]);
}

#[test]
fn space_of_unlinked_open_file_is_reclaimed_after_close() {
    let mut v = TestVolume::new();
    let p = v.path("big");
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&p)
        .unwrap();
    let chunk = pattern(3, 1024 * 1024);
    for _ in 0..32 {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
    let used_full = allocated_bytes(v.vol());
    assert!(
        used_full >= 32 * 1024 * 1024,
        "32 MiB written, the volume directory holds only {used_full} bytes"
    );
    fs::remove_file(&p).unwrap();
    // Open-unlinked: the data must still be there.
    let mut head = [0u8; 16];
    (&f).seek(SeekFrom::Start(0)).unwrap();
    f.read_exact(&mut head).unwrap();
    assert_eq!(&head, &chunk[..16]);
    drop(f);
    v.unmount();
    let used_after = allocated_bytes(v.vol());
    assert!(
        used_after + 24 * 1024 * 1024 <= used_full,
        "after the last close and unmount the 32 MiB are still allocated \
         ({used_full} bytes before, {used_after} after)"
    );
    v.mount();
    assert!(list_dir(v.mnt()).is_empty());
}

/// `struct file_handle` with room for any handle FUSE makes.
#[repr(C)]
struct RawHandle {
    bytes: u32,
    kind: i32,
    f: [u8; 128],
}

/// `name_to_handle_at` → handle bytes (type, then f_handle).
fn file_handle(p: &Path) -> (i32, Vec<u8>) {
    let mut h = RawHandle {
        bytes: 128,
        kind: 0,
        f: [0; 128],
    };
    let mut mount_id = 0i32;
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid path and a handle buffer of the size it declares.
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            libc::AT_FDCWD,
            c.as_ptr(),
            std::ptr::addr_of_mut!(h),
            std::ptr::addr_of_mut!(mount_id),
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "name_to_handle_at {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    (h.kind, h.f[..h.bytes as usize].to_vec())
}

/// `open_by_handle_at` on the mount at `mnt`.
fn open_by_handle(mnt: &Path, handle: &(i32, Vec<u8>)) -> Result<File, Errno> {
    let mut h = RawHandle {
        bytes: handle.1.len() as u32,
        kind: handle.0,
        f: [0; 128],
    };
    h.f[..handle.1.len()].copy_from_slice(&handle.1);
    let dir = File::open(mnt).unwrap();
    // SAFETY: a valid directory descriptor and handle buffer.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            dir.as_raw_fd(),
            std::ptr::addr_of_mut!(h),
            libc::O_RDONLY,
        )
    };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: a descriptor the kernel just returned to us.
    Ok(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) })
}

/// xfstests generic/426, 467, 477: NFS file handles of files and
/// directories open after the kernel forgot their inodes (here: a whole
/// remount), and go stale once the file is gone.
#[test]
fn file_handles_open_after_the_kernel_forgot_the_inode() {
    let mut v = TestVolume::new();
    fs::create_dir(v.path("d")).unwrap();
    write_file(&v.path("d/f"), b"by handle");
    let hf = file_handle(&v.path("d/f"));
    let hd = file_handle(&v.path("d"));
    write_file(&v.path("gone"), b"x");
    let hg = file_handle(&v.path("gone"));
    fs::remove_file(v.path("gone")).unwrap();
    v.remount();
    let mut s = String::new();
    open_by_handle(v.mnt(), &hf)
        .expect("a file's handle after remount")
        .read_to_string(&mut s)
        .unwrap();
    assert_eq!(s, "by handle");
    let d = open_by_handle(v.mnt(), &hd).expect("a directory's handle after remount");
    assert!(d.metadata().unwrap().is_dir());
    assert_eq!(open_by_handle(v.mnt(), &hg).unwrap_err(), Errno::ESTALE);
}

/// `RENAME_WHITEOUT` (overlayfs's rename in an upper layer): the source
/// name becomes a 0/0 character device in the same step (xfstests 023-025
/// probe for it).
#[test]
fn rename_whiteout_leaves_a_whiteout_where_the_source_was() {
    let mut v = TestVolume::new();
    write_file(&v.path("a"), b"moved");
    renameat2(&v.path("a"), &v.path("b"), libc::RENAME_WHITEOUT).unwrap();
    assert_eq!(read_file(&v.path("b")), b"moved");
    let w = lmeta(&v.path("a"));
    assert!(
        w.file_type().is_char_device(),
        "a whiteout is a character device"
    );
    assert_eq!((w.rdev(), w.mode() & 0o7777), (0, 0));
    // Not with RENAME_EXCHANGE.
    assert_eq!(
        renameat2(
            &v.path("b"),
            &v.path("a"),
            libc::RENAME_WHITEOUT | libc::RENAME_EXCHANGE
        ),
        Err(Errno::EINVAL)
    );
    v.remount();
    assert!(lmeta(&v.path("a")).file_type().is_char_device());
    assert_eq!(read_file(&v.path("b")), b"moved");
}

/// An ioctl safs has no use for gets ENOTTY, as from a local filesystem
/// (`lsattr` then says the operation is not supported).
#[test]
fn unknown_ioctls_get_enotty() {
    let v = TestVolume::new();
    write_file(&v.path("f"), b"");
    let f = File::open(v.path("f")).unwrap();
    let mut flags: libc::c_long = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one long to the pointer given.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), 0x8008_6601, &mut flags) };
    assert_eq!(r, -1);
    assert_eq!(Errno::last(), Errno::ENOTTY);
}

/// A directory's size grows with the directory (4 KiB per 128 entries it
/// has held), as on ext4, instead of staying 0.
#[test]
fn directory_size_grows_with_its_entries() {
    let v = TestVolume::new();
    let d = v.path("d");
    fs::create_dir(&d).unwrap();
    let empty = lmeta(&d);
    assert_eq!(empty.len(), 4096);
    assert_eq!(empty.blocks(), 8);
    for i in 0..300 {
        File::create(d.join(format!("f{i}"))).unwrap();
    }
    assert_eq!(lmeta(&d).len(), 4096 * 3, "300 entries");
}

/// Absent names are cached negative by the kernel (a repeated probe asks
/// the daemon nothing), and every way of making a name through the mount
/// replaces the negative entry at once; removed names read as absent.
#[test]
fn absent_names_are_cached_negative_and_every_new_name_replaces_them() {
    let mut v = TestVolume::new();
    let absent = |p: &std::path::Path| {
        assert_eq!(
            fs::symlink_metadata(p).unwrap_err().raw_os_error(),
            Some(libc::ENOENT),
            "{} should be absent",
            p.display()
        );
    };
    // What a `safs info` call itself costs in lookups, to subtract.
    let a = served(&v, "lookup");
    let b = served(&v, "lookup");
    let own = b - a;
    absent(&v.path("probe"));
    let before = served(&v, "lookup");
    for _ in 0..100 {
        absent(&v.path("probe"));
    }
    // Without the negative entry each probe would send one; a `safs info`
    // call itself sends 0 or 1 (`own` was measured once, so it may be off
    // by one either way).
    let sent = served(&v, "lookup") - before;
    assert!(
        sent <= own + 1,
        "100 probes of a known-absent name sent no LOOKUP: {sent} counted, a `safs info` call costs {own}"
    );

    fs::write(v.path("src"), b"source").unwrap();
    let names = ["file", "dir", "sym", "hard", "moved", "excl"];
    for n in names {
        absent(&v.path(n));
    }
    fs::write(v.path("file"), b"made").unwrap();
    fs::create_dir(v.path("dir")).unwrap();
    std::os::unix::fs::symlink("file", v.path("sym")).unwrap();
    fs::hard_link(v.path("src"), v.path("hard")).unwrap();
    fs::write(v.path("to-move"), b"moved").unwrap();
    fs::rename(v.path("to-move"), v.path("moved")).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(v.path("excl"))
        .unwrap();
    assert_eq!(fs::read(v.path("file")).unwrap(), b"made");
    assert!(fs::metadata(v.path("dir")).unwrap().is_dir());
    assert_eq!(
        fs::read_link(v.path("sym")).unwrap(),
        std::path::Path::new("file")
    );
    assert_eq!(fs::read(v.path("hard")).unwrap(), b"source");
    assert_eq!(fs::read(v.path("moved")).unwrap(), b"moved");
    assert!(fs::metadata(v.path("excl")).unwrap().is_file());
    absent(&v.path("to-move"));

    // Removed names are absent again, and stay so across a remount.
    fs::remove_file(v.path("file")).unwrap();
    fs::remove_dir(v.path("dir")).unwrap();
    fs::rename(v.path("moved"), v.path("file")).unwrap();
    absent(&v.path("dir"));
    absent(&v.path("moved"));
    assert_eq!(fs::read(v.path("file")).unwrap(), b"moved");
    v.remount();
    absent(&v.path("dir"));
    absent(&v.path("moved"));
    absent(&v.path("probe"));
    assert_eq!(fs::read(v.path("file")).unwrap(), b"moved");
    assert_eq!(fs::read(v.path("hard")).unwrap(), b"source");
}

/// A READDIRPLUS page's entries are counted as kernel references when
/// their attributes are read, and those that do not fit in the reply are
/// given back: files listed with attributes (long names, so every reply
/// leaves some of its page out) and then removed are all freed, which an
/// entry counted but never sent would prevent until unmount.
#[test]
fn files_listed_with_attributes_then_removed_are_freed() {
    let v = TestVolume::new();
    let used = || {
        let s = nix::sys::statvfs::statvfs(v.mnt()).unwrap();
        s.files() - s.files_free()
    };
    let dir = v.path("d");
    fs::create_dir(&dir).unwrap();
    let before = used();
    let names: Vec<String> = (0..300)
        .map(|i| {
            format!(
                "{}-{i:04}",
                "a-name-long-enough-that-few-fit-in-one-reply".repeat(2)
            )
        })
        .collect();
    for n in &names {
        File::create(dir.join(n)).unwrap();
    }
    assert_eq!(used(), before + 300);
    // A listing with attributes (readdirplus), as `ls -l` makes one.
    let mut seen = 0;
    for e in fs::read_dir(&dir).unwrap() {
        assert!(e.unwrap().metadata().unwrap().is_file());
        seen += 1;
    }
    assert_eq!(seen, 300);
    assert!(
        served(&v, "readdirplus") >= 2,
        "the listing took several replies"
    );
    for n in &names {
        fs::remove_file(dir.join(n)).unwrap();
    }
    assert!(
        wait_until(std::time::Duration::from_secs(10), || used() == before),
        "{} inodes still in use after the removal",
        used() - before
    );
}
