//! `safs fsck` on volumes built through the core (no FUSE needed) and then
//! damaged record by record: each damage is found (exit 4), repaired
//! (exit 1), and the volume is clean afterwards (exit 0).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use safs::core::volume;
use safs::core::{Ctx, Fs, Ino, OpenMode, Options};
use safs::format::keys;
use safs::meta::{LmdbStore, MetaRead, MetaStore};

fn safs(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_safs"))
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// A volume with files, a directory, a symlink, a hard link and xattrs in
/// every tier. Returns (tempdir, volume path, inode of "dir/f").
fn populated() -> (tempfile::TempDir, std::path::PathBuf, u64) {
    let tmp = tempfile::tempdir().unwrap();
    let vol = tmp.path().join("vol");
    let (code, out) = safs(&[
        "format",
        vol.to_str().unwrap(),
        "--inline-xattr-bytes",
        "64",
    ]);
    assert_eq!(code, 0, "{out}");
    let (store, sb) = volume::open_store(&vol).unwrap();
    let fs = Fs::mount(&vol, store, sb, Options::default()).unwrap();
    let ctx = Ctx::root();
    let d = fs
        .make_node(&ctx, Ino::ROOT, b"dir", libc::S_IFDIR | 0o755, 0, 0, None)
        .unwrap()
        .ino;
    let f = fs
        .make_node(&ctx, d, b"f", libc::S_IFREG | 0o644, 0, 0, None)
        .unwrap()
        .ino;
    let h = fs
        .open(
            f,
            OpenMode {
                write: true,
                truncate: false,
            },
        )
        .unwrap();
    fs.write(h.fh, 0, b"some data").unwrap();
    fs.release(h.fh).unwrap();
    fs.link(f, Ino::ROOT, b"hard").unwrap();
    fs.make_node(
        &ctx,
        Ino::ROOT,
        b"sym",
        libc::S_IFLNK | 0o777,
        0,
        0,
        Some(b"dir/f"),
    )
    .unwrap();
    fs.setxattr(&Ctx::root(), f, b"user.small", b"1", 0)
        .unwrap();
    fs.setxattr(&Ctx::root(), f, b"user.spilled", &[2u8; 500], 0)
        .unwrap();
    fs.setxattr(&Ctx::root(), f, b"user.big1", &[3u8; 65_000], 0)
        .unwrap();
    fs.setxattr(&Ctx::root(), f, b"user.big2", &[4u8; 65_000], 0)
        .unwrap();
    fs.close().unwrap();
    (tmp, vol, f.0)
}

fn fsck(vol: &Path, repair: bool) -> (i32, String) {
    let mut args = vec!["fsck", vol.to_str().unwrap()];
    if repair {
        args.push("--repair");
    }
    safs(&args)
}

fn damage(vol: &Path, f: impl FnOnce(&LmdbStore)) {
    let store = LmdbStore::open(&vol.join("meta")).unwrap();
    f(&store);
}

fn assert_found_repaired_clean(vol: &Path, expect: &str) {
    let (code, out) = fsck(vol, false);
    assert_eq!(code, 4, "damage not found: {out}");
    assert!(out.contains(expect), "expected '{expect}' in: {out}");
    let (code, out) = fsck(vol, true);
    assert_eq!(code, 1, "not repaired: {out}");
    let (code, out) = fsck(vol, false);
    assert_eq!(code, 0, "not clean after repair: {out}");
}

#[test]
fn a_fresh_and_a_populated_volume_are_clean() {
    let (_t, vol, _) = populated();
    let (code, out) = fsck(&vol, false);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("clean"));
}

#[test]
fn wrong_link_count() {
    let (_t, vol, f) = populated();
    damage(&vol, |s| {
        let k = keys::inode(f);
        let mut i = safs::format::inode::Inode::decode(&k, &s.get(&k).unwrap().unwrap()).unwrap();
        i.nlink = 7;
        s.commit(&[(k.to_vec(), Some(i.encode(&k)))]).unwrap();
    });
    assert_found_repaired_clean(&vol, "link count 7 should be 2");
}

#[test]
fn wrong_or_missing_directory_statistics() {
    let (_t, vol, f) = populated();
    let restat = |ino: u64, stats: Option<safs::format::inode::DirStats>| {
        damage(&vol, |s| {
            let k = keys::inode(ino);
            let mut i =
                safs::format::inode::Inode::decode(&k, &s.get(&k).unwrap().unwrap()).unwrap();
            let kept = i.stats.expect("a new volume keeps statistics");
            i.stats = stats.map(|_| safs::format::inode::DirStats {
                rfiles: kept.rfiles + 5,
                ..kept
            });
            s.commit(&[(k.to_vec(), Some(i.encode(&k)))]).unwrap();
        })
    };
    // The root holds "hard" and "sym" and dir/f below: 3 files, 1 directory.
    restat(volume::ROOT_INO, Some(Default::default()));
    assert_found_repaired_clean(
        &vol,
        "directory 1: statistics say 2 files here, 8 files, 1 directories and 23 bytes \
         below; a walk finds 2, 3, 1 and 23",
    );
    restat(volume::ROOT_INO, None);
    assert_found_repaired_clean(&vol, "directory 1: statistics missing");
    // A change time behind what lies below: never left so by a change.
    damage(&vol, |s| {
        let k = keys::inode(volume::ROOT_INO);
        let mut i = safs::format::inode::Inode::decode(&k, &s.get(&k).unwrap().unwrap()).unwrap();
        i.stats.as_mut().unwrap().rctime = 1;
        s.commit(&[(k.to_vec(), Some(i.encode(&k)))]).unwrap();
    });
    assert_found_repaired_clean(&vol, "a walk finds 2, 3, 1 and 23; newest change 1 s, but");
    // "dir/f" and "hard": the file's record names the root and "dir".
    damage(&vol, |s| {
        let k = keys::inode(f);
        let mut i = safs::format::inode::Inode::decode(&k, &s.get(&k).unwrap().unwrap()).unwrap();
        assert_eq!(i.links.len(), 1);
        i.links.clear();
        s.commit(&[(k.to_vec(), Some(i.encode(&k)))]).unwrap();
    });
    assert_found_repaired_clean(&vol, &format!("inode {f}: named in directories"));
}

#[test]
fn missing_index_record() {
    let (_t, vol, _) = populated();
    damage(&vol, |s| {
        let (a, b) = keys::prefix_range(keys::P_DIRINDEX);
        let first = s.scan(&a, &b, 1).unwrap().remove(0).0;
        s.commit(&[(first, None)]).unwrap();
    });
    assert_found_repaired_clean(&vol, "index record missing");
}

#[test]
fn flipped_bit_in_a_spill_record() {
    let (_t, vol, f) = populated();
    damage(&vol, |s| {
        let k = keys::spill(f);
        let mut rec = s.get(&k).unwrap().expect("the 500-byte value spilled");
        rec[20] ^= 1;
        s.commit(&[(k.to_vec(), Some(rec))]).unwrap();
    });
    assert_found_repaired_clean(&vol, "spill record unreadable");
}

#[test]
fn stray_records_and_backing_files() {
    let (_t, vol, _) = populated();
    damage(&vol, |s| {
        let k = keys::overflow(999_999, b"user.x");
        let rec = safs::format::envelope::seal(&k, safs::format::envelope::Kind::Overflow, b"v");
        s.commit(&[(k, Some(rec))]).unwrap();
    });
    std::fs::write(vol.join("data/3f/000000000000123f"), b"junk").unwrap();
    let (code, out) = fsck(&vol, false);
    assert_eq!(code, 4, "{out}");
    assert!(
        out.contains("missing inode") && out.contains("belongs to no file"),
        "{out}"
    );
    assert_eq!(fsck(&vol, true).0, 1);
    assert_eq!(fsck(&vol, false).0, 0);
    assert!(!vol.join("data/3f/000000000000123f").exists());
}

#[test]
fn nameless_inode_goes_to_lost_and_found() {
    let (_t, vol, f) = populated();
    damage(&vol, |s| {
        // Drop every name of the file (its D and C records).
        let mut w = Vec::new();
        for p in [keys::P_DIRENT, keys::P_DIRINDEX] {
            let (a, b) = keys::prefix_range(p);
            for (k, v) in s.scan(&a, &b, 1000).unwrap() {
                let names_f = if p == keys::P_DIRENT {
                    safs::format::dirent::Dirent::decode(&k, &v).unwrap().ino == f
                } else {
                    safs::format::dirent::IndexEntry::decode(&k, &v)
                        .unwrap()
                        .ino
                        == f
                };
                if names_f {
                    w.push((k, None));
                }
            }
        }
        assert_eq!(w.len(), 4);
        s.commit(&w).unwrap();
    });
    assert_found_repaired_clean(&vol, &format!("inode {f} has no name"));
    let (store, sb) = volume::open_store(&vol).unwrap();
    let fs = Fs::mount(&vol, store as Arc<dyn MetaStore>, sb, Options::default()).unwrap();
    let lf = fs.lookup(Ino::ROOT, b"lost+found").unwrap().ino;
    let a = fs.lookup(lf, format!("#{f}").as_bytes()).unwrap();
    assert_eq!(a.ino, Ino(f));
    assert_eq!(
        fs.getxattr(Ino(f), b"user.big2").unwrap(),
        vec![4u8; 65_000]
    );
    fs.close().unwrap();
}

#[test]
fn mounted_volume_and_missing_volume_are_operational_errors() {
    let (_t, vol, _) = populated();
    let _lock = volume::VolumeLock::acquire(&volume::Layout::new(&vol)).unwrap();
    let (code, out) = fsck(&vol, false);
    assert_eq!(code, 8, "{out}");
    assert!(
        out.contains(&format!("is in use by process {}", std::process::id())),
        "{out}"
    );
    assert!(out.contains("unmounted volumes only"), "{out}");
    let (code, out) = fsck(Path::new("/nonexistent/safs-volume"), false);
    assert_eq!(code, 8, "{out}");
    assert!(out.contains("is not a safs volume"), "{out}");
    assert!(
        !out.contains("unmount"),
        "a missing volume is not a mounted one: {out}"
    );
}

#[test]
fn statistics_are_added_to_a_volume_formatted_before_them() {
    let (_t, vol, f) = populated();
    // What an older build left: no feature bit, no counts, files naming
    // no directory.
    damage(&vol, |s| {
        let mut sb = safs::format::superblock::Superblock::decode(
            &s.get(keys::SUPERBLOCK).unwrap().unwrap(),
        )
        .unwrap();
        sb.features &= !(safs::format::superblock::FEATURE_DIR_STATS
            | safs::format::superblock::FEATURE_DIR_STATS_FULL);
        let mut w = vec![(keys::SUPERBLOCK.to_vec(), Some(sb.encode()))];
        let (a, b) = keys::prefix_range(keys::P_INODE);
        for (k, v) in s.scan(&a, &b, 1000).unwrap() {
            let mut i = safs::format::inode::Inode::decode(&k, &v).unwrap();
            i.stats = None;
            i.links.clear();
            if !i.is_dir() {
                i.parent = 0;
            }
            w.push((k.clone(), Some(i.encode(&k))));
        }
        s.commit(&w).unwrap();
    });
    let (code, out) = fsck(&vol, false);
    assert_eq!(code, 0, "an older volume is clean as it is: {out}");
    let (code, out) = safs(&["fsck", vol.to_str().unwrap(), "--dir-stats"]);
    assert_ne!(code, 0, "--dir-stats needs --repair: {out}");
    let (code, out) = safs(&["fsck", vol.to_str().unwrap(), "--repair", "--dir-stats"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("directory statistics counted for 2 directories"),
        "{out}"
    );
    let (code, out) = fsck(&vol, false);
    assert_eq!(code, 0, "{out}");
    let (store, sb) = volume::open_store(&vol).unwrap();
    assert!(sb.has_dir_stats() && sb.has_full_dir_stats());
    let fs = Fs::mount(&vol, store as Arc<dyn MetaStore>, sb, Options::default()).unwrap();
    let stat = |ino: Ino, n: &str| {
        String::from_utf8(
            fs.getxattr(ino, format!("safs.dir.{n}").as_bytes())
                .unwrap(),
        )
        .unwrap()
    };
    // "hard" and "sym" (5 bytes) in the root, dir/f (9 bytes) below.
    assert_eq!(stat(Ino::ROOT, "rfiles"), "3");
    assert_eq!(stat(Ino::ROOT, "rbytes"), "23");
    let newest = fs.getattr(Ino(f)).unwrap().ctime.sec;
    assert!(stat(Ino::ROOT, "rctime").parse::<i64>().unwrap() >= newest);
    // Kept from now on: a size change moves both names' directories.
    let h = fs
        .open(
            Ino(f),
            OpenMode {
                write: true,
                truncate: false,
            },
        )
        .unwrap();
    fs.write(h.fh, 9, b"more").unwrap();
    fs.release(h.fh).unwrap();
    assert_eq!(stat(Ino::ROOT, "rbytes"), "31");
    fs.close().unwrap();
    assert_eq!(fsck(&vol, false).0, 0);
}

/// Sessions' counters records (`R`): a share that does not add up, one
/// that does not read, and a block beyond the next inode number are each
/// found and repaired; a share that adds up (a crashed session's, not yet
/// folded) is not damage.
#[test]
fn sessions_counters_records() {
    use safs::format::superblock::{Counters, SessionCounters};
    let counters =
        |s: &LmdbStore| Counters::decode(&s.get(keys::COUNTERS).unwrap().unwrap()).unwrap();
    let (_t, vol, _) = populated();
    // Moved from `N` into session 7's share: the same count.
    damage(&vol, |s| {
        let mut n = counters(s);
        n.inodes -= 2;
        let share = SessionCounters {
            start: n.next_ino - 1,
            end: n.next_ino,
            inodes: 2,
        };
        s.commit(&[
            (keys::COUNTERS.to_vec(), Some(n.encode())),
            (keys::session(7).to_vec(), Some(share.encode(7))),
        ])
        .unwrap();
    });
    let (code, out) = fsck(&vol, false);
    assert_eq!(code, 0, "{out}");
    // A share one too many.
    damage(&vol, |s| {
        let k = keys::session(7);
        let mut share = SessionCounters::decode(&k, &s.get(&k).unwrap().unwrap()).unwrap();
        share.inodes += 1;
        s.commit(&[(k.to_vec(), Some(share.encode(7)))]).unwrap();
    });
    assert_found_repaired_clean(&vol, "inode count");
    damage(&vol, |s| {
        assert!(
            s.get(&keys::session(7)).unwrap().is_none(),
            "repair folds the shares into N"
        );
    });
    // A record that does not read.
    damage(&vol, |s| {
        let mut rec = SessionCounters::default().encode(3);
        rec[4] ^= 1;
        s.commit(&[(keys::session(3).to_vec(), Some(rec))]).unwrap();
    });
    assert_found_repaired_clean(&vol, "session counters record");
    // A block past the next inode number: numbers in it could be handed
    // out again.
    let next = std::cell::Cell::new(0);
    damage(&vol, |s| {
        next.set(counters(s).next_ino);
        let next = next.get();
        let share = SessionCounters {
            start: next,
            end: next + 1024,
            inodes: 0,
        };
        s.commit(&[(keys::session(4).to_vec(), Some(share.encode(4)))])
            .unwrap();
    });
    assert_found_repaired_clean(&vol, "inside a session's block");
    damage(&vol, |s| {
        let n = counters(s);
        assert_eq!(n.next_ino, next.get() + 1024, "past the block");
    });
}

/// A volume from before inode numbers were reserved in blocks (no
/// feature bit, `N` alone): clean as it is; the first writable mount sets
/// the bit, counts from `N`, takes the next numbers from where `N` says,
/// and a clean close leaves `N` whole again (no session record) with the
/// block's rest given back.
#[test]
fn a_volume_from_before_session_counters_is_converted_at_mount() {
    use safs::format::superblock::{Counters, FEATURE_SESSION_SHARES, Superblock};
    let (_t, vol, _) = populated();
    let counters =
        |s: &LmdbStore| Counters::decode(&s.get(keys::COUNTERS).unwrap().unwrap()).unwrap();
    let before = std::cell::Cell::new(Counters {
        next_ino: 0,
        inodes: 0,
    });
    damage(&vol, |s| {
        let mut sb = Superblock::decode(&s.get(keys::SUPERBLOCK).unwrap().unwrap()).unwrap();
        sb.features &= !FEATURE_SESSION_SHARES;
        s.commit(&[(keys::SUPERBLOCK.to_vec(), Some(sb.encode()))])
            .unwrap();
        let (a, b) = keys::prefix_range(keys::P_SESSION);
        assert!(
            s.scan(&a, &b, 10).unwrap().is_empty(),
            "a clean close folds its share"
        );
        before.set(counters(s));
    });
    let before = before.get();
    assert_eq!(before.inodes, 4, "root, dir, dir/f, sym");
    let (code, out) = fsck(&vol, false);
    assert_eq!(code, 0, "{out}");
    let (store, sb) = volume::open_store(&vol).unwrap();
    assert!(!sb.has_session_shares());
    let fs = Fs::mount(&vol, store as Arc<dyn MetaStore>, sb, Options::default()).unwrap();
    let s = fs.statfs(Ino::ROOT).unwrap();
    assert_eq!(s.files - s.ffree, 4);
    let made = fs
        .make_node(
            &Ctx::root(),
            Ino::ROOT,
            b"new",
            libc::S_IFREG | 0o644,
            0,
            0,
            None,
        )
        .unwrap()
        .ino;
    assert_eq!(made.0, before.next_ino);
    let s = fs.statfs(Ino::ROOT).unwrap();
    assert_eq!(s.files - s.ffree, 5);
    fs.close().unwrap();
    drop(fs);
    let (store, sb) = volume::open_store(&vol).unwrap();
    assert!(
        sb.has_session_shares(),
        "the bit is set at the first writable mount"
    );
    let n = volume::read_counters(store.as_ref()).unwrap();
    assert_eq!(n.inodes, 5);
    assert_eq!(
        n.next_ino,
        before.next_ino + 1,
        "the block's rest given back"
    );
    assert!(volume::read_sessions(store.as_ref()).unwrap().is_empty());
    drop(store);
    let (code, out) = fsck(&vol, false);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("clean"), "{out}");
}
