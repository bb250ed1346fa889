//! `safs fsck` on encrypted volumes, built and mounted through the core
//! (no FUSE needed): with the passphrase every record, name and content
//! block is checked and repairs stay sealed; without it the structure
//! alone is checked, and the report says so; a wrong passphrase changes
//! nothing.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::SystemTime;

use safs::core::crypto::{BlockLayout, KdfParams, Keyspace, SealedStore, VolumeKeys};
use safs::core::volume::{self, Encryption, FormatOptions};
use safs::core::{CoreError, Ctx, Fs, Ino, OpenMode, Options};
use safs::format::dirent::{Dirent, IndexEntry};
use safs::format::inode::Inode;
use safs::format::keys;
use safs::meta::{MetaRead, MetaStore};

const PASS: &[u8] = b"correct horse battery staple";
const STRUCTURE_ONLY: &str = "encrypted volume checked without its passphrase: structure only; \
                              records, names and contents not verified";
/// Bytes of "dir/f": two whole blocks and a short one.
const F_LEN: usize = 2 * BLOCK + 1808;
/// Too large for what the spill record has left: an overflow record each.
const BIG: usize = 65_200;
/// On-disk bytes of one full sealed block.
const UNIT: u64 = BlockLayout::PAGE.unit();
const BLOCK: usize = BlockLayout::PAGE.block() as usize;

fn contents() -> Vec<u8> {
    (0..F_LEN).map(|i| (i * 7 % 251) as u8).collect()
}

struct Vol {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    pass: PathBuf,
    /// "dir/f": contents, a hard link, xattrs inline, spilled and in
    /// overflow records.
    f: u64,
    /// "empty": a file never written.
    empty: u64,
}

/// An encrypted volume with a directory, files, a hard link, a symlink and
/// xattrs in every tier (inline budget 64 bytes: "user.small" inline, the
/// 500-byte value spilled, the two BIG values in overflow records).
fn encrypted() -> Vol {
    encrypted_in(BlockLayout::PAGE)
}

/// [`encrypted`], its contents sealed in `blocks`.
fn encrypted_in(blocks: BlockLayout) -> Vol {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("vol");
    volume::format(
        &dir,
        &FormatOptions {
            inline_bytes: 64,
            force: false,
            uid: 0,
            gid: 0,
            encryption: Some(Encryption {
                passphrase: zeroize::Zeroizing::new(PASS.to_vec()),
                kdf: KdfParams::TESTING,
            }),
            engine: safs::meta::NewEngine::Lmdb,
            data: None,
        },
    )
    .unwrap();
    if blocks == BlockLayout::SPREAD {
        // What the first encrypted volumes were: no page-blocks feature.
        let (store, mut sb) = volume::open_store(&dir).unwrap();
        sb.features &= !safs::format::superblock::FEATURE_PAGE_BLOCKS;
        store
            .commit(&[(keys::SUPERBLOCK.to_vec(), Some(sb.encode()))])
            .unwrap();
    }
    let pass = tmp.path().join("pass");
    std::fs::write(&pass, [PASS, b"\n"].concat()).unwrap();
    let fs = mount(&dir);
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
    fs.write(h.fh, 0, &contents()).unwrap();
    fs.release(h.fh).unwrap();
    fs.link(f, Ino::ROOT, b"hard").unwrap();
    let empty = fs
        .make_node(&ctx, Ino::ROOT, b"empty", libc::S_IFREG | 0o600, 0, 0, None)
        .unwrap()
        .ino;
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
    fs.setxattr(&ctx, f, b"user.small", b"1", 0).unwrap();
    fs.setxattr(&ctx, f, b"user.spilled", &[2u8; 500], 0)
        .unwrap();
    fs.setxattr(&ctx, f, b"user.big1", &[3u8; BIG], 0).unwrap();
    fs.setxattr(&ctx, f, b"user.big2", &[4u8; BIG], 0).unwrap();
    fs.setxattr(&ctx, d, b"user.dir", b"on a directory", 0)
        .unwrap();
    fs.close().unwrap();
    Vol {
        _tmp: tmp,
        dir,
        pass,
        f: f.0,
        empty: empty.0,
    }
}

/// The volume's engine and its keys.
fn unlocked(vol: &Path) -> (Arc<dyn MetaStore>, Arc<VolumeKeys>) {
    let (store, sb) = volume::open_store(vol).unwrap();
    let master = volume::unlock(store.as_ref(), &sb, PASS).unwrap();
    let keys = volume::keys_for(&master, &sb);
    (store, keys)
}

fn mount(vol: &Path) -> Fs {
    let (store, sb) = volume::open_store(vol).unwrap();
    let master = volume::unlock(store.as_ref(), &sb, PASS).unwrap();
    let opts = Options {
        keys: Some(volume::keys_for(&master, &sb)),
        ..Options::default()
    };
    Fs::mount(vol, store, sb, opts).unwrap()
}

/// Runs `safs` with no passphrase in its environment (and none to be
/// typed: no standard input).
fn safs(args: &[&str]) -> (i32, String) {
    run(Command::new(env!("CARGO_BIN_EXE_safs"))
        .args(args)
        .env_remove("SAFS_PASSPHRASE_FILE"))
}

fn run(cmd: &mut Command) -> (i32, String) {
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// `safs fsck` with the passphrase file.
fn fsck(v: &Vol, repair: bool) -> (i32, String) {
    let mut args = vec![
        "fsck",
        v.dir.to_str().unwrap(),
        "--passphrase-file",
        v.pass.to_str().unwrap(),
    ];
    if repair {
        args.push("--repair");
    }
    safs(&args)
}

fn structure_only(v: &Vol) -> (i32, String) {
    safs(&["fsck", v.dir.to_str().unwrap(), "--structure-only"])
}

fn assert_found_repaired_clean(v: &Vol, expect: &str) {
    let (code, out) = fsck(v, false);
    assert_eq!(code, 4, "damage not found: {out}");
    assert!(out.contains(expect), "expected '{expect}' in: {out}");
    let (code, out) = fsck(v, true);
    assert_eq!(code, 1, "not repaired: {out}");
    let (code, out) = fsck(v, false);
    assert_eq!(code, 0, "not clean after repair: {out}");
    let (code, out) = structure_only(v);
    assert_eq!(code, 0, "structure not clean after repair: {out}");
}

/// What the volume holds: every record and every backing file, and when
/// the engine's file last changed.
#[derive(PartialEq)]
struct Snapshot {
    records: Vec<(Vec<u8>, Vec<u8>)>,
    files: BTreeMap<PathBuf, Vec<u8>>,
    changed: SystemTime,
}

fn snapshot(vol: &Path) -> Snapshot {
    let (store, _) = volume::open_store(vol).unwrap();
    let records = store.scan(&[0], &[u8::MAX; 511], usize::MAX).unwrap();
    drop(store);
    let files = walk(&vol.join("data"))
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    let changed = std::fs::metadata(vol.join("meta/data.mdb"))
        .unwrap()
        .modified()
        .unwrap();
    Snapshot {
        records,
        files,
        changed,
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn backing(v: &Vol, ino: u64) -> PathBuf {
    v.dir.join(format!("data/{:02x}/{ino:016x}", ino & 0xff))
}

#[test]
fn a_populated_volume_is_clean_with_its_passphrase_or_by_its_structure() {
    let v = encrypted();
    let (code, out) = fsck(&v, false);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(": clean"), "{out}");
    assert!(!out.contains("structure only"), "{out}");
    // Names, inline/spilled/overflow xattrs: all read through the keys.
    assert!(out.contains("5 inodes, 5 entries"), "{out}");
    assert!(out.contains("3 xattr records"), "{out}");
    // The passphrase file may come from the environment instead.
    let (code, out) = run(Command::new(env!("CARGO_BIN_EXE_safs"))
        .args(["fsck", v.dir.to_str().unwrap()])
        .env("SAFS_PASSPHRASE_FILE", &v.pass));
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("structure only"), "{out}");
    assert_eq!(
        fsck(&v, true).0,
        0,
        "repairing a clean volume changes nothing"
    );

    let (code, out) = structure_only(&v);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(STRUCTURE_ONLY), "{out}");
    assert!(out.contains(": clean"), "{out}");
}

#[test]
fn without_a_passphrase_or_a_terminal_the_structure_alone_is_checked_never_repaired() {
    let v = encrypted();
    // setsid: no controlling terminal to ask on.
    let no_tty = |extra: &[&str]| {
        run(Command::new("setsid")
            .arg("-w")
            .arg(env!("CARGO_BIN_EXE_safs"))
            .args(["fsck", v.dir.to_str().unwrap()])
            .args(extra)
            .env_remove("SAFS_PASSPHRASE_FILE"))
    };
    let (code, out) = no_tty(&[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(STRUCTURE_ONLY), "{out}");
    let (code, out) = no_tty(&["--repair"]);
    assert_eq!(code, 8, "{out}");
    assert!(
        out.contains(&format!(
            "volume {} is encrypted: repairing it needs its passphrase",
            v.dir.display()
        )),
        "{out}"
    );
    let (code, out) = safs(&[
        "fsck",
        v.dir.to_str().unwrap(),
        "--structure-only",
        "--repair",
    ]);
    assert_eq!(code, 2, "a usage error: {out}");
    assert!(out.contains("cannot be used with"), "{out}");
}

#[test]
fn a_wrong_passphrase_is_refused_and_nothing_is_written() {
    let v = encrypted();
    // Damage a repair would fix: a wrong link count.
    let (store, keys) = unlocked(&v.dir);
    let sealed = SealedStore::new(store, keys);
    let k = keys::inode(v.f);
    let mut i = Inode::decode(&k, &sealed.get(&k).unwrap().unwrap()).unwrap();
    i.nlink = 9;
    sealed.commit(&[(k.to_vec(), Some(i.encode(&k)))]).unwrap();
    drop(sealed);
    let before = snapshot(&v.dir);
    let wrong = v.dir.parent().unwrap().join("wrong");
    std::fs::write(&wrong, b"incorrect horse\n").unwrap();
    for repair in [false, true] {
        let mut args = vec![
            "fsck",
            v.dir.to_str().unwrap(),
            "--passphrase-file",
            wrong.to_str().unwrap(),
        ];
        if repair {
            args.push("--repair");
        }
        let (code, out) = safs(&args);
        assert_eq!(code, 8, "{out}");
        assert!(
            out.contains(&format!("wrong passphrase for volume {}", v.dir.display())),
            "{out}"
        );
        assert!(snapshot(&v.dir) == before, "the volume changed");
    }
    assert_found_repaired_clean(&v, "link count 9 should be 2");
}

#[test]
fn records_sealed_under_other_keys_are_found_never_read() {
    let v = encrypted();
    let (store, sb) = volume::open_store(&v.dir).unwrap();
    let master = volume::unlock(store.as_ref(), &sb, PASS).unwrap();
    let right = SealedStore::new(Arc::clone(&store), volume::keys_for(&master, &sb));
    let other = Arc::new(VolumeKeys::derive(&[0x55; 32], &sb.uuid));
    let wrong = SealedStore::new(Arc::clone(&store), other);
    // The spill set of "dir/f" and the inode of "empty", resealed under
    // another volume's keys.
    let mut w = Vec::new();
    for k in [keys::spill(v.f), keys::inode(v.empty)] {
        w.push((k.to_vec(), right.get(&k).unwrap()));
    }
    wrong.commit(&w).unwrap();
    drop((right, wrong, store));

    let (code, out) = fsck(&v, false);
    assert_eq!(code, 4, "{out}");
    assert!(
        out.contains(&format!(
            "inode {}: spill record unreadable (it does not open under the volume's keys",
            v.f
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "inode {}: unreadable record (it does not open under the volume's keys",
            v.empty
        )),
        "{out}"
    );
    // Unreadable inodes are reported and left alone; the spill set goes.
    let (code, out) = fsck(&v, true);
    assert_eq!(code, 4, "{out}");
    assert!(
        out.contains(&format!("repaired: inode {}: spill record", v.f)),
        "{out}"
    );
    let (code, out) = fsck(&v, false);
    assert_eq!(code, 4, "{out}");
    assert!(!out.contains("spill record"), "{out}");
    // Without the keys nothing of this shows.
    assert_eq!(structure_only(&v).0, 0);

    // The repair dropped the names of the unreadable inode (they named no
    // inode it could read); without its record the volume is clean.
    let (store, _) = unlocked(&v.dir);
    store
        .commit(&[(keys::inode(v.empty).to_vec(), None)])
        .unwrap();
    drop(store);
    let (code, out) = fsck(&v, false);
    assert_eq!(code, 0, "{out}");
    // The spilled xattr is gone; the others are served as they were.
    let fs = mount(&v.dir);
    assert!(matches!(
        fs.getxattr(Ino(v.f), b"user.spilled"),
        Err(CoreError::NoData)
    ));
    assert_eq!(fs.getxattr(Ino(v.f), b"user.small").unwrap(), b"1");
    assert_eq!(fs.getxattr(Ino(v.f), b"user.big1").unwrap(), vec![3u8; BIG]);
    fs.close().unwrap();
}

#[test]
fn volume_records_that_do_not_open_are_rewritten() {
    let v = encrypted();
    let (store, sb) = volume::open_store(&v.dir).unwrap();
    let master = volume::unlock(store.as_ref(), &sb, PASS).unwrap();
    let right = SealedStore::new(Arc::clone(&store), volume::keys_for(&master, &sb));
    let other = SealedStore::new(
        Arc::clone(&store),
        Arc::new(VolumeKeys::derive(&[0x66; 32], &sb.uuid)),
    );
    let w: Vec<_> = [keys::COUNTERS, keys::MOUNT_STATE]
        .iter()
        .map(|k| (k.to_vec(), right.get(k).unwrap()))
        .collect();
    other.commit(&w).unwrap();
    drop((right, other, store));
    let (code, out) = fsck(&v, false);
    assert_eq!(code, 4, "{out}");
    assert!(
        out.contains("mount state record unreadable (it does not open under the volume's keys"),
        "{out}"
    );
    assert_found_repaired_clean(
        &v,
        "counters record unreadable (it does not open under the volume's keys",
    );
}

#[test]
fn a_flipped_byte_in_an_overflow_value_is_found_by_its_decrypted_name() {
    let v = encrypted();
    let (store, keys) = unlocked(&v.dir);
    let k = Keyspace::encrypted(keys).overflow(v.f, b"user.big1");
    let mut rec = store.get(&k).unwrap().expect("an overflow record");
    rec[40] ^= 1;
    store.commit(&[(k, Some(rec))]).unwrap();
    drop(store);
    assert_found_repaired_clean(
        &v,
        &format!(
            "overflow xattr X{}/user.big1: unreadable (it does not open under the volume's keys",
            v.f
        ),
    );
    let fs = mount(&v.dir);
    assert!(matches!(
        fs.getxattr(Ino(v.f), b"user.big1"),
        Err(CoreError::NoData)
    ));
    assert_eq!(fs.getxattr(Ino(v.f), b"user.big2").unwrap(), vec![4u8; BIG]);
    fs.close().unwrap();
}

#[test]
fn entry_names_that_do_not_decrypt_are_found_and_lost_names_rewritten_encrypted() {
    let v = encrypted();
    let (store, keys) = unlocked(&v.dir);
    let names = Keyspace::encrypted(Arc::clone(&keys));
    let sealed = SealedStore::new(Arc::clone(&store), keys);
    // A well-sealed entry whose encrypted name was changed...
    let dk = names.dirent(1, b"dir");
    let d = Dirent::decode(&dk, &sealed.get(&dk).unwrap().unwrap()).unwrap();
    let mut garbled = dk.clone();
    *garbled.last_mut().unwrap() ^= 1;
    // ...and the name record of "hard" lost (its index record stays).
    let hk = names.dirent(1, b"hard");
    sealed
        .commit(&[
            (garbled.clone(), Some(d.encode(&garbled))),
            (hk.clone(), None),
        ])
        .unwrap();
    drop(sealed);
    let (code, out) = fsck(&v, false);
    assert_eq!(code, 4, "{out}");
    assert!(
        out.contains("entry D1/(a 19-byte encrypted name): unreadable (its name does not decrypt"),
        "{out}"
    );
    assert!(out.contains("entry 1/hard: name record missing"), "{out}");
    assert_found_repaired_clean(&v, "name record missing");
    // The lost name is back under its encrypted key; the garbled one gone.
    assert!(store.get(&hk).unwrap().is_some());
    assert!(store.get(&garbled).unwrap().is_none());
    drop(store);
    let fs = mount(&v.dir);
    assert_eq!(fs.lookup(Ino::ROOT, b"hard").unwrap().ino, Ino(v.f));
    assert!(fs.lookup(Ino::ROOT, b"dir").is_ok());
    fs.close().unwrap();
}

#[test]
fn a_nameless_inode_goes_to_lost_and_found_under_encrypted_names() {
    let v = encrypted();
    let (store, keys) = unlocked(&v.dir);
    let sealed = SealedStore::new(Arc::clone(&store), Arc::clone(&keys));
    let mut w = Vec::new();
    for p in [keys::P_DIRENT, keys::P_DIRINDEX] {
        let (a, b) = keys::prefix_range(p);
        for (k, val) in sealed.scan(&a, &b, 1000).unwrap() {
            let ino = if p == keys::P_DIRENT {
                Dirent::decode(&k, &val).unwrap().ino
            } else {
                IndexEntry::decode(&k, &val).unwrap().ino
            };
            if ino == v.f {
                w.push((k, None));
            }
        }
    }
    assert_eq!(w.len(), 4, "dir/f and hard, each a D and a C record");
    sealed.commit(&w).unwrap();
    drop(sealed);
    assert_found_repaired_clean(&v, &format!("inode {} has no name", v.f));
    // No name reached the engine in the clear.
    let (a, b) = keys::prefix_range(keys::P_DIRENT);
    for (k, _) in store.scan(&a, &b, 1000).unwrap() {
        assert!(!k.windows(4).any(|w| w == b"lost"), "{k:?}");
    }
    drop(store);
    let fs = mount(&v.dir);
    let lf = fs.lookup(Ino::ROOT, b"lost+found").unwrap().ino;
    let a = fs.lookup(lf, format!("#{}", v.f).as_bytes()).unwrap();
    assert_eq!(a.ino, Ino(v.f));
    let h = fs
        .open(
            Ino(v.f),
            OpenMode {
                write: false,
                truncate: false,
            },
        )
        .unwrap();
    assert_eq!(fs.read(h.fh, 0, F_LEN as u32 + 10).unwrap(), contents());
    fs.release(h.fh).unwrap();
    assert_eq!(fs.getxattr(Ino(v.f), b"user.big2").unwrap(), vec![4u8; BIG]);
    fs.close().unwrap();
}

#[test]
fn sizes_come_from_sealed_backing_files_and_torn_lengths_are_cut() {
    let v = encrypted();
    // A size the backing file does not give.
    let (store, keys) = unlocked(&v.dir);
    let sealed = SealedStore::new(store, keys);
    let k = keys::inode(v.f);
    let mut i = Inode::decode(&k, &sealed.get(&k).unwrap().unwrap()).unwrap();
    i.size = 5;
    sealed.commit(&[(k.to_vec(), Some(i.encode(&k)))]).unwrap();
    drop(sealed);
    assert_found_repaired_clean(
        &v,
        &format!("file {}: size 5 but its backing file holds {F_LEN}", v.f),
    );

    // A length no file of blocks has: the last block torn to 10 bytes.
    let path = backing(&v, v.f);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(2 * UNIT + 10).unwrap();
    drop(f);
    let (code, out) = structure_only(&v);
    assert_eq!(code, 4, "{out}");
    assert!(
        out.contains(&format!(
            "length {} is no whole number of sealed blocks",
            2 * UNIT + 10
        )),
        "{out}"
    );
    assert!(out.contains(STRUCTURE_ONLY), "{out}");
    let (code, out) = fsck(&v, false);
    assert_eq!(code, 4, "{out}");
    assert!(
        out.contains(&format!(
            "file {}: size {F_LEN} but its backing file holds {}",
            v.f,
            2 * BLOCK
        )),
        "{out}"
    );
    assert_found_repaired_clean(&v, "it keeps its 2 whole blocks");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * UNIT);
    let fs = mount(&v.dir);
    assert_eq!(fs.getattr(Ino(v.f)).unwrap().size, 2 * BLOCK as u64);
    let h = fs
        .open(
            Ino(v.f),
            OpenMode {
                write: false,
                truncate: false,
            },
        )
        .unwrap();
    assert_eq!(
        fs.read(h.fh, 0, F_LEN as u32).unwrap(),
        contents()[..2 * BLOCK]
    );
    fs.release(h.fh).unwrap();
    fs.close().unwrap();
}

#[test]
fn volumes_of_the_first_content_layout_keep_working() {
    let v = encrypted_in(BlockLayout::SPREAD);
    let path = backing(&v, v.f);
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        BlockLayout::SPREAD.sealed_len(F_LEN as u64)
    );
    let (code, out) = fsck(&v, false);
    assert_eq!(code, 0, "{out}");
    assert_eq!(structure_only(&v).0, 0);
    let (code, out) = safs(&["info", v.dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("4 KiB blocks straddling pages (first layout"),
        "{out}"
    );
    let fs = mount(&v.dir);
    let h = fs
        .open(
            Ino(v.f),
            OpenMode {
                write: true,
                truncate: false,
            },
        )
        .unwrap();
    assert_eq!(fs.read(h.fh, 0, F_LEN as u32).unwrap(), contents());
    fs.write(h.fh, F_LEN as u64, b"more").unwrap();
    fs.release(h.fh).unwrap();
    fs.close().unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        BlockLayout::SPREAD.sealed_len(F_LEN as u64 + 4)
    );
    assert_eq!(fsck(&v, false).0, 0);
}

/// What a truncate of "dir/f" to 2 blocks + 500 bytes leaves when the
/// daemon dies before its last step: the shortened block written over the
/// start of the old one, the backing file not yet cut. Returns the length
/// the cut gives.
fn truncate_killed_before_its_last_cut(v: &Vol) -> u64 {
    let (_, keys) = unlocked(&v.dir);
    let short = keys
        .blocks()
        .seal(v.f, 2, &contents()[2 * BLOCK..2 * BLOCK + 500])
        .unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(backing(v, v.f))
        .unwrap();
    f.write_all_at(&short, 2 * UNIT).unwrap();
    2 * UNIT + short.len() as u64
}

/// What a killed daemon leaves: the volume marked mounted (so the next
/// mount recovers).
fn mark_mounted_by_a_killed_daemon(v: &Vol) {
    let (store, keys) = unlocked(&v.dir);
    let sealed = SealedStore::new(store, keys);
    let m = safs::format::superblock::MountState {
        clean: false,
        pid: 1,
        since_ns: 0,
    };
    sealed
        .commit(&[(keys::MOUNT_STATE.to_vec(), Some(m.encode()))])
        .unwrap();
    drop(sealed);
}

#[test]
fn a_truncate_killed_before_its_last_cut_is_finished_by_recovery() {
    let v = encrypted();
    let cut = truncate_killed_before_its_last_cut(&v);
    mark_mounted_by_a_killed_daemon(&v);
    let fs = mount(&v.dir);
    assert_eq!(fs.getattr(Ino(v.f)).unwrap().size, 2 * BLOCK as u64 + 500);
    fs.close().unwrap();
    assert_eq!(std::fs::metadata(backing(&v, v.f)).unwrap().len(), cut);
    let (code, out) = fsck(&v, false);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn a_truncate_killed_before_its_last_cut_is_finished_by_fsck() {
    let v = encrypted();
    let cut = truncate_killed_before_its_last_cut(&v);
    let path = backing(&v, v.f);
    assert_found_repaired_clean(
        &v,
        &format!(
            "file {}: its last content block was shortened by a truncate the daemon did not \
             finish; the backing file is cut to {cut} bytes",
            v.f
        ),
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), cut);
    let fs = mount(&v.dir);
    assert_eq!(fs.getattr(Ino(v.f)).unwrap().size, 2 * BLOCK as u64 + 500);
    fs.close().unwrap();
}

/// What a truncate of "dir/f" to 1 block + 500 bytes (a block follows)
/// leaves when the daemon dies after its first step: the journal of the
/// new size after the last block. Returns that size.
fn truncate_killed_after_its_journal(v: &Vol) -> u64 {
    let (_, keys) = unlocked(&v.dir);
    let new = BLOCK as u64 + 500;
    let blocks = (F_LEN as u64).div_ceil(BLOCK as u64);
    // Bound to its slot with the top bit set (sealed.rs's JOURNAL).
    let journal = keys
        .blocks()
        .seal(v.f, (1 << 63) | blocks, &new.to_le_bytes())
        .unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(backing(v, v.f))
        .unwrap();
    f.write_all_at(&journal, blocks * UNIT).unwrap();
    new
}

#[test]
fn a_truncate_killed_after_its_journal_is_finished_by_recovery() {
    let v = encrypted();
    let new = truncate_killed_after_its_journal(&v);
    mark_mounted_by_a_killed_daemon(&v);
    let fs = mount(&v.dir);
    assert_eq!(fs.getattr(Ino(v.f)).unwrap().size, new);
    let h = fs
        .open(Ino(v.f), safs::core::OpenMode::from_flags(libc::O_RDONLY))
        .unwrap();
    assert_eq!(
        fs.read(h.fh, 0, F_LEN as u32).unwrap(),
        contents()[..new as usize]
    );
    fs.release(h.fh).unwrap();
    fs.close().unwrap();
    let (code, out) = fsck(&v, false);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn a_truncate_killed_after_its_journal_is_finished_by_fsck() {
    let v = encrypted();
    let new = truncate_killed_after_its_journal(&v);
    assert_found_repaired_clean(
        &v,
        &format!(
            "file {}: a truncate the daemon did not finish left its journal; the file is cut \
             to {new} bytes",
            v.f
        ),
    );
    assert_eq!(
        std::fs::metadata(backing(&v, v.f)).unwrap().len(),
        BlockLayout::PAGE.sealed_len(new)
    );
    let fs = mount(&v.dir);
    assert_eq!(fs.getattr(Ino(v.f)).unwrap().size, new);
    fs.close().unwrap();
}

#[test]
fn a_changed_content_block_is_found_and_left_to_fail_reads() {
    let v = encrypted();
    let path = backing(&v, v.f);
    let mut data = std::fs::read(&path).unwrap();
    data[UNIT as usize + 100] ^= 0x80;
    std::fs::write(&path, &data).unwrap();
    let expect = format!(
        "file {}: 1 of its 3 content blocks do not open (changed, moved or torn; \
         the first is block 1, at byte {BLOCK})",
        v.f
    );
    for repair in [false, true] {
        let (code, out) = fsck(&v, repair);
        assert_eq!(code, 4, "{out}");
        assert!(out.contains(&format!("ERROR: {expect}")), "{out}");
    }
    assert_eq!(std::fs::read(&path).unwrap(), data, "never rewritten");
    // Its length is a layout of blocks: the structure is sound.
    assert_eq!(structure_only(&v).0, 0);
}

#[test]
fn the_structure_alone_shows_stray_and_malformed_keys_and_backing_files() {
    let v = encrypted();
    let (store, _) = unlocked(&v.dir);
    store
        .commit(&[
            (keys::spill(999_999).to_vec(), Some(vec![7u8; 60])),
            (b"I\x01".to_vec(), Some(vec![7u8; 60])),
        ])
        .unwrap();
    drop(store);
    std::fs::write(v.dir.join("data/3f/000000000000123f"), vec![0u8; 100]).unwrap();
    std::fs::write(v.dir.join("data/3f/junk"), b"junk").unwrap();

    let (code, out) = structure_only(&v);
    assert_eq!(code, 4, "{out}");
    for expect in [
        "ERROR: record S999999 belongs to no inode",
        "ERROR: malformed key I\u{1}",
        "000000000000123f belongs to no inode",
        "junk is not named for an inode of its directory",
        STRUCTURE_ONLY,
        "errors found (check with the passphrase",
    ] {
        assert!(out.contains(expect), "expected '{expect}' in: {out}");
    }
    // With the passphrase the same damage is found whole and repaired.
    assert_found_repaired_clean(&v, "spill record of missing inode 999999");
    assert!(!v.dir.join("data/3f/junk").exists());
}
