//! Core tests on the in-memory engine: semantics that do not need a kernel,
//! and which records each operation writes.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::*;
use crate::meta::{MemStore, MetaError, MetaRead, MetaStore, WriteRef};

/// A key, and what to run once right after it is read.
type Hook = (Vec<u8>, Box<dyn FnOnce() + Send>);

/// An engine that remembers every key it was asked to write.
#[derive(Default)]
struct Recording {
    inner: MemStore,
    written: Mutex<Vec<Vec<u8>>>,
    /// Every point read takes a while, as a cold one from disk does.
    slow_reads: std::sync::atomic::AtomicBool,
    /// Run once, right after the read of this key (its value already read).
    after_get: Mutex<Option<Hook>>,
    /// Answer as an engine whose every read is a round trip (PostgreSQL).
    round_trips: std::sync::atomic::AtomicBool,
    /// Point reads and scans of directory entries.
    dirent_gets: std::sync::atomic::AtomicU64,
    dirent_scans: std::sync::atomic::AtomicU64,
    /// Point reads and scans of spill pages.
    spill_reads: std::sync::atomic::AtomicU64,
    /// Point reads of overflow values.
    overflow_reads: std::sync::atomic::AtomicU64,
}

impl Recording {
    /// Counts a read at `key` of an entry (in `dirents`) or of spill pages.
    fn count(&self, key: &[u8], dirents: &std::sync::atomic::AtomicU64) {
        let which = match key.first() {
            Some(&keys::P_DIRENT) => dirents,
            Some(&keys::P_SPILL) => &self.spill_reads,
            Some(&keys::P_OVERFLOW) => &self.overflow_reads,
            _ => return,
        };
        which.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl MetaRead for Recording {
    fn get(&self, key: &[u8]) -> std::result::Result<Option<Vec<u8>>, MetaError> {
        if self.slow_reads.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(Duration::from_micros(50));
        }
        self.count(key, &self.dirent_gets);
        let value = self.inner.get(key);
        let hook = {
            let mut h = self.after_get.lock();
            match h.as_ref() {
                Some((k, _)) if k == key => h.take(),
                _ => None,
            }
        };
        if let Some((_, run)) = hook {
            run();
        }
        value
    }
    fn scan(
        &self,
        s: &[u8],
        e: &[u8],
        l: usize,
    ) -> std::result::Result<Vec<(Vec<u8>, Vec<u8>)>, MetaError> {
        self.count(s, &self.dirent_scans);
        self.inner.scan(s, e, l)
    }
    fn follows_in_one_read(&self) -> bool {
        self.round_trips.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// One read, as PostgreSQL answers it.
    fn scan_tree_and_follow(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        at: usize,
        prefix: u8,
        descend: crate::meta::Descend,
    ) -> std::result::Result<Vec<crate::meta::ScannedFollowed>, MetaError> {
        self.count(start, &self.dirent_scans);
        descend.walk(start, end, limit, at, |lo, hi, n| {
            let pairs = self.inner.scan(lo, hi, n)?;
            crate::meta::with_pointees(pairs, at, prefix, |keys| self.inner.get_many(keys))
        })
    }
}

impl MetaStore for Recording {
    fn commit_iter<'a>(
        &self,
        batch: &mut dyn Iterator<Item = WriteRef<'a>>,
    ) -> std::result::Result<(), MetaError> {
        let batch: Vec<WriteRef<'a>> = batch.collect();
        self.written
            .lock()
            .extend(batch.iter().map(|(k, _)| k.to_vec()));
        self.inner.commit_iter(&mut batch.into_iter())
    }
    fn disk_bytes(&self) -> u64 {
        0
    }
}

struct T {
    _dir: tempfile::TempDir,
    engine: Arc<Recording>,
    fs: Fs,
}

fn setup(budget: u32) -> T {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("data")).unwrap();
    for i in 0..256 {
        std::fs::create_dir_all(dir.path().join("data").join(format!("{i:02x}"))).unwrap();
    }
    let engine = Arc::new(Recording::default());
    let (sb, recs) = volume::initial_records(&volume::FormatOptions {
        inline_bytes: budget,
        force: false,
        uid: 0,
        gid: 0,
        encryption: None,
        engine: crate::meta::NewEngine::Lmdb,
        data: None,
    });
    engine.commit(&recs).unwrap();
    let fs = remount(dir.path(), &engine, sb);
    T {
        _dir: dir,
        engine,
        fs,
    }
}

fn remount(dir: &std::path::Path, engine: &Arc<Recording>, sb: Superblock) -> Fs {
    let opts = Options {
        commit_interval: Duration::from_millis(1),
        async_commit: false,
        ..Options::default()
    };
    Fs::mount(dir, engine.clone() as Arc<dyn MetaStore>, sb, opts).unwrap()
}

/// Mounts `t`'s volume again with the directory cache on or off.
fn remount_with_dircache(t: &mut T, on: bool) {
    remount_with(
        t,
        Options {
            commit_interval: Duration::from_millis(1),
            async_commit: false,
            dircache: Some(on),
            ..Options::default()
        },
    );
}

/// Mounts `t`'s volume again with `opts`.
fn remount_with(t: &mut T, opts: Options) {
    let sb = t.fs.sb.clone();
    t.fs.close().unwrap();
    t.fs = Fs::mount(t._dir.path(), t.engine.clone(), sb, opts).unwrap();
}

/// Makes directory or file `name` in `parent` as root.
fn node(fs: &Fs, parent: Ino, name: &str, dir: bool) -> Result<Ino> {
    let mode = if dir {
        libc::S_IFDIR | 0o755
    } else {
        libc::S_IFREG | 0o644
    };
    fs.make_node(&Ctx::root(), parent, name.as_bytes(), mode, 0, 0, None)
        .map(|a| a.ino)
}

fn file(t: &T, name: &str) -> Ino {
    t.fs.make_node(
        &Ctx::root(),
        Ino::ROOT,
        name.as_bytes(),
        libc::S_IFREG | 0o644,
        0o022,
        0,
        None,
    )
    .unwrap()
    .ino
}

#[test]
fn mtime_change_does_not_rewrite_spill() {
    let t = setup(64);
    let ino = file(&t, "f");
    t.fs.setxattr(&Ctx::root(), ino, b"user.big", &[7u8; 2000], 0)
        .unwrap();
    t.fs.sync().unwrap();
    let spill = keys::spill(ino.0).to_vec();
    assert!(
        t.engine.written.lock().contains(&spill),
        "the value spilled"
    );
    t.engine.written.lock().clear();
    let set = SetAttr {
        mtime: Some(TimeSet::At(Timestamp { sec: 12, nsec: 34 })),
        ..SetAttr::default()
    };
    t.fs.setattr(&Ctx::root(), ino, &set).unwrap();
    t.fs.setxattr(&Ctx::root(), ino, b"user.small", b"x", 0)
        .unwrap();
    t.fs.sync().unwrap();
    let written = t.engine.written.lock().clone();
    assert!(written.contains(&keys::inode(ino.0).to_vec()));
    assert!(
        !written.contains(&spill),
        "spill rewritten by an unrelated change"
    );
    assert_eq!(t.fs.getxattr(ino, b"user.big").unwrap(), vec![7u8; 2000]);
}

#[test]
fn tiers_survive_remount_and_absent_names_need_no_read() {
    let t = setup(320);
    let ino = file(&t, "f");
    let sizes = [0usize, 1, 200, 1000, 30_000, 65_536, 65_536, 65_536];
    for (i, s) in sizes.iter().enumerate() {
        t.fs.setxattr(
            &Ctx::root(),
            ino,
            format!("user.v{i}").as_bytes(),
            &vec![i as u8; *s],
            0,
        )
        .unwrap();
    }
    t.fs.close().unwrap();
    let sb = t.fs.superblock().clone();
    let fs = remount(t._dir.path(), &t.engine, sb);
    for (i, s) in sizes.iter().enumerate() {
        assert_eq!(
            fs.getxattr(ino, format!("user.v{i}").as_bytes()).unwrap(),
            vec![i as u8; *s]
        );
    }
    let names = fs.listxattr(&Ctx::root(), ino).unwrap();
    assert_eq!(names.iter().filter(|&&b| b == 0).count(), sizes.len());
    assert!(matches!(
        fs.getxattr(ino, b"user.none"),
        Err(CoreError::NoData)
    ));
    // Removing everything leaves no spill or overflow records behind.
    for i in 0..sizes.len() {
        fs.removexattr(&Ctx::root(), ino, format!("user.v{i}").as_bytes())
            .unwrap();
    }
    fs.sync().unwrap();
    for prefix in [keys::P_OVERFLOW, keys::P_SPILL] {
        let (s, e) = keys::ino_range(prefix, ino.0);
        assert!(t.engine.scan(&s, &e, 10).unwrap().is_empty());
    }
    let i = fs.getattr(ino).unwrap();
    assert_eq!(i.ino, ino);
}

/// The spill keys of `ino` that hold records.
fn spill_keys(t: &T, ino: Ino) -> Vec<Vec<u8>> {
    let (s, e) = keys::ino_range(keys::P_SPILL, ino.0);
    t.engine
        .scan(&s, &e, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

fn stream(i: usize) -> Vec<u8> {
    format!("user.stream.{i:05}").into_bytes()
}

#[test]
fn a_set_on_a_file_with_many_xattrs_rewrites_one_spill_page() {
    let t = setup(320);
    let ino = file(&t, "many");
    for i in 0..1500 {
        t.fs.setxattr(&Ctx::root(), ino, &stream(i), &[i as u8; 40], 0)
            .unwrap();
    }
    t.fs.sync().unwrap();
    let pages = spill_keys(&t, ino);
    assert!(pages.len() > 30, "the spill tier is paged: {}", pages.len());
    for i in [100, 700, 1499] {
        t.engine.written.lock().clear();
        t.fs.setxattr(&Ctx::root(), ino, &stream(i), &[0xee; 40], 0)
            .unwrap();
        t.fs.sync().unwrap();
        let written = t.engine.written.lock().clone();
        let spilled: Vec<_> = written.iter().filter(|k| k[0] == keys::P_SPILL).collect();
        assert!(spilled.len() <= 1, "one page at most: {spilled:?}");
        for k in spilled {
            let len = t.engine.get(k).unwrap().map_or(0, |v| v.len());
            assert!(len <= crate::format::spill::PAGE_BYTES + 64, "{len} bytes");
        }
        assert!(written.len() <= 3, "inode, one page, counters: {written:?}");
    }
    t.fs.removexattr(&Ctx::root(), ino, &stream(3)).unwrap();
    t.fs.close().unwrap();
    let sb = t.fs.superblock().clone();
    let fs = remount(t._dir.path(), &t.engine, sb);
    for i in 0..1500 {
        let want = if [100, 700, 1499].contains(&i) {
            vec![0xee; 40]
        } else {
            vec![i as u8; 40]
        };
        match fs.getxattr(ino, &stream(i)) {
            Ok(v) => assert_eq!(v, want, "{i}"),
            Err(CoreError::NoData) => assert_eq!(i, 3),
            Err(e) => panic!("{i}: {e}"),
        }
    }
    let names = fs.listxattr(&Ctx::root(), ino).unwrap();
    assert_eq!(names.iter().filter(|&&b| b == 0).count(), 1499);
}

/// A volume made before spill pages: one spill record (over a page's
/// size) at page 0's key and no SPILL_PAGES feature. It mounts, reads,
/// changes, gets the feature, and a change elsewhere leaves the old record
/// alone.
#[test]
fn a_whole_spill_record_of_an_older_volume_keeps_working() {
    use crate::format::envelope::{Kind, open, seal};
    use crate::format::xattrs::XattrSet;
    let t = setup(320);
    let ino = file(&t, "old");
    for i in 0..300 {
        t.fs.setxattr(&Ctx::root(), ino, &stream(i), &[i as u8; 40], 0)
            .unwrap();
    }
    t.fs.close().unwrap();
    // Rewrite the pages as one record, as older builds stored it.
    let mut whole = XattrSet::new();
    let mut w: Vec<Write> = Vec::new();
    for k in spill_keys(&t, ino) {
        let rec = t.engine.get(&k).unwrap().unwrap();
        let set = XattrSet::decode(open(&k, Kind::Spill, &rec).unwrap()).unwrap();
        for (n, v) in set.iter() {
            whole.insert(n.to_vec(), v.to_vec());
        }
        w.push((k, None));
    }
    assert!(whole.packed_len() > crate::format::spill::PAGE_BYTES);
    let k0 = keys::spill(ino.0);
    w.push((k0.to_vec(), Some(seal(&k0, Kind::Spill, &whole.encode()))));
    let ik = keys::inode(ino.0);
    let mut inode = Inode::decode(&ik, &t.engine.get(&ik).unwrap().unwrap()).unwrap();
    inode.spill_len = whole.packed_len() as u32;
    w.push((ik.to_vec(), Some(inode.encode(&ik))));
    let mut sb = t.fs.superblock().clone();
    sb.features &= !crate::format::superblock::FEATURE_SPILL_PAGES;
    w.push((keys::SUPERBLOCK.to_vec(), Some(sb.encode())));
    t.engine.commit(&w).unwrap();

    let fs = remount(t._dir.path(), &t.engine, sb);
    assert!(fs.superblock().has_spill_pages());
    let on_disk = crate::core::volume::read_superblock(t.engine.as_ref()).unwrap();
    assert!(on_disk.has_spill_pages(), "the upgrade is recorded");
    for i in 0..300 {
        assert_eq!(fs.getxattr(ino, &stream(i)).unwrap(), vec![i as u8; 40]);
    }
    // New names go to new pages; the whole record is not rewritten.
    t.engine.written.lock().clear();
    fs.setxattr(&Ctx::root(), ino, b"user.new", &[1; 40], 0)
        .unwrap();
    fs.sync().unwrap();
    assert!(!t.engine.written.lock().contains(&k0.to_vec()));
    // A change inside it rewrites it, smaller.
    fs.removexattr(&Ctx::root(), ino, &stream(5)).unwrap();
    fs.close().unwrap();
    let fs = remount(t._dir.path(), &t.engine, fs.superblock().clone());
    assert_eq!(fs.getxattr(ino, b"user.new").unwrap(), vec![1; 40]);
    assert!(matches!(
        fs.getxattr(ino, &stream(5)),
        Err(CoreError::NoData)
    ));
    assert_eq!(fs.getxattr(ino, &stream(299)).unwrap(), vec![43u8; 40]);
}

/// A spill page that goes missing (or an inode whose spill size disagrees
/// with its pages) is reported as corruption, never served as a shorter
/// set.
#[test]
fn a_missing_spill_page_is_corruption() {
    let t = setup(320);
    let ino = file(&t, "f");
    for i in 0..200 {
        t.fs.setxattr(&Ctx::root(), ino, &stream(i), &[i as u8; 40], 0)
            .unwrap();
    }
    t.fs.close().unwrap();
    let pages = spill_keys(&t, ino);
    assert!(pages.len() > 2);
    t.engine.commit(&[(pages[1].clone(), None)]).unwrap();
    let fs = remount(t._dir.path(), &t.engine, t.fs.superblock().clone());
    assert!(matches!(
        fs.getxattr(ino, &stream(199)),
        Err(CoreError::Corrupt { .. })
    ));
}

/// Lookups, getattrs and getxattrs read cold inodes and entries with the
/// state lock released (`cold`) while another thread changes the same
/// names and a third drops the caches: afterwards every cached inode, spill
/// tier and directory-cache entry still equals what the store holds.
#[test]
fn cold_reads_without_the_lock_never_cache_stale_state() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut t = setup(64);
    remount_with_dircache(&mut t, true);
    let fs = &t.fs;
    let ctx = Ctx::root();
    let names: Vec<Vec<u8>> = (0..12).map(|i| format!("f{i}").into_bytes()).collect();
    for n in &names {
        fs.make_node(&ctx, Ino::ROOT, n, libc::S_IFREG | 0o644, 0, 0, None)
            .unwrap();
    }
    t.engine.slow_reads.store(true, Ordering::Relaxed);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..2 {
            let (names, stop) = (&names, &stop);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for n in names {
                        if let Ok(a) = fs.lookup(Ino::ROOT, n) {
                            let _ = fs.getattr(a.ino);
                            let _ = fs.getxattr(a.ino, b"user.big");
                        }
                    }
                }
            });
        }
        for round in 0..800usize {
            let n = &names[round % names.len()];
            let other = &names[(round * 7 + 3) % names.len()];
            // Cold reads all through; none for the last rounds, so what
            // they left cached is still there to check.
            if round % 8 == 0 && round < 700 {
                fs.drop_caches();
            }
            match round % 5 {
                0 => {
                    if let Ok(a) = fs.lookup(Ino::ROOT, n) {
                        // Past the inline budget: a spill page.
                        let _ = fs.setxattr(&ctx, a.ino, b"user.big", &[round as u8; 200], 0);
                    }
                }
                1 => {
                    if let Ok(a) = fs.lookup(Ino::ROOT, n) {
                        let set = SetAttr {
                            mode: Some(0o600 | (round as u32 & 0o77)),
                            ..SetAttr::default()
                        };
                        let _ = fs.setattr(&ctx, a.ino, &set);
                    }
                }
                2 => {
                    let _ = fs.unlink(Ino::ROOT, n);
                }
                3 => {
                    let _ = fs.rename(&ctx, Ino::ROOT, n, Ino::ROOT, other, RenameFlags::default());
                }
                _ => {
                    let _ = fs.make_node(&ctx, Ino::ROOT, other, libc::S_IFREG | 0o644, 0, 0, None);
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    t.engine.slow_reads.store(false, Ordering::Relaxed);
    let mut st = fs.state.lock();
    let mut checked = 0;
    for ino in st.cached_inos() {
        let key = keys::inode(ino);
        let stored = fs
            .store
            .get(&key)
            .unwrap()
            .map(|r| Inode::decode(&key, &r).unwrap());
        let c = st.cached(ino).unwrap();
        assert_eq!(Some(&c.inode), stored.as_ref(), "inode {ino}");
        if let Some(spill) = c.spill.clone() {
            let read = fs.read_spill_of(ino, &c.inode).unwrap();
            assert_eq!(
                spill.iter().collect::<Vec<_>>(),
                read.iter().collect::<Vec<_>>(),
                "spill of {ino}"
            );
        }
        checked += 1;
    }
    for n in &names {
        let key = fs.keyspace.dirent(Ino::ROOT.0, n);
        let stored = fs
            .store
            .get(&key)
            .unwrap()
            .map(|r| crate::format::dirent::Dirent::decode(&key, &r).unwrap());
        match st.dirs().lookup(Ino::ROOT.0, n) {
            dircache::Found::Entry(d) => assert_eq!(Some(d), stored, "{n:?}"),
            dircache::Found::Absent => assert_eq!(stored, None, "{n:?}"),
            dircache::Found::Unknown => {}
        }
    }
    assert!(checked > 0);
}

/// A lookup reads a cold entry with the state lock released; a name
/// unlinked meanwhile (by another request thread, which can run because the
/// lock is free) must not be served or cached from that read.
#[test]
fn a_name_unlinked_during_a_cold_lookup_is_not_cached() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    for (dircache, on_inode) in [(true, false), (true, true), (false, false), (false, true)] {
        let mut t = setup(64);
        remount_with_dircache(&mut t, dircache);
        let fs = &t.fs;
        let victim = fs
            .make_node(
                &Ctx::root(),
                Ino::ROOT,
                b"victim",
                libc::S_IFREG | 0o644,
                0,
                0,
                None,
            )
            .unwrap()
            .ino;
        fs.forget(victim, 1);
        fs.sync().unwrap();
        fs.drop_caches();
        let (start_tx, start_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let unlinked_meanwhile = std::sync::Arc::new(AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&unlinked_meanwhile);
        // The unlink lands right after the read of the entry, or of the
        // inode it names.
        let hooked = match on_inode {
            false => fs.keyspace.dirent(Ino::ROOT.0, b"victim"),
            true => keys::inode(victim.0).to_vec(),
        };
        *t.engine.after_get.lock() = Some((
            hooked,
            Box::new(move || {
                start_tx.send(()).unwrap();
                if done_rx.recv_timeout(Duration::from_secs(5)).is_ok() {
                    flag.store(true, Ordering::SeqCst);
                }
            }),
        ));
        let found = std::thread::scope(|s| {
            s.spawn(move || {
                start_rx.recv().unwrap();
                fs.unlink(Ino::ROOT, b"victim").unwrap();
                done_tx.send(()).unwrap();
            });
            fs.lookup(Ino::ROOT, b"victim")
        });
        assert!(
            unlinked_meanwhile.load(Ordering::SeqCst),
            "dircache={dircache}: the unlink waited for the lookup's read (the lock was held)"
        );
        assert!(
            matches!(found, Err(CoreError::NotFound)),
            "dircache={dircache}: served from a read older than the unlink: {found:?}"
        );
        assert!(
            matches!(fs.lookup(Ino::ROOT, b"victim"), Err(CoreError::NotFound)),
            "dircache={dircache}: the unlinked name stayed cached"
        );
        let mut st = fs.state.lock();
        assert!(
            !st.is_cached(victim.0),
            "dircache={dircache}: a freed inode cached"
        );
        assert!(
            !matches!(
                st.dirs().lookup(Ino::ROOT.0, b"victim"),
                dircache::Found::Entry(_)
            ),
            "an unlinked name in the directory cache"
        );
    }
}

#[test]
fn xattr_flags_and_limits() {
    let t = setup(320);
    let ino = file(&t, "f");
    assert!(matches!(
        t.fs.setxattr(&Ctx::root(), ino, b"user.a", b"1", xattr::XATTR_REPLACE),
        Err(CoreError::NoData)
    ));
    t.fs.setxattr(&Ctx::root(), ino, b"user.a", b"1", xattr::XATTR_CREATE)
        .unwrap();
    assert!(matches!(
        t.fs.setxattr(&Ctx::root(), ino, b"user.a", b"2", xattr::XATTR_CREATE),
        Err(CoreError::Exists)
    ));
    t.fs.setxattr(&Ctx::root(), ino, b"user.a", b"2", xattr::XATTR_REPLACE)
        .unwrap();
    assert!(matches!(
        t.fs.setxattr(&Ctx::root(), ino, b"user.b", &vec![0; 65_537], 0),
        Err(CoreError::TooBig)
    ));
    assert!(matches!(
        t.fs.setxattr(&Ctx::root(), ino, &[b'u'; 256], b"", 0),
        Err(CoreError::Range)
    ));
    assert!(matches!(
        t.fs.setxattr(&Ctx::root(), ino, b"other.x", b"", 0),
        Err(CoreError::NotSupported)
    ));
    assert!(matches!(
        t.fs.removexattr(&Ctx::root(), ino, b"user.zz"),
        Err(CoreError::NoData)
    ));
}

/// `ino` opened for writing (not truncated).
fn open_for_writing(fs: &Fs, ino: Ino) -> Arc<Handle> {
    fs.open(
        ino,
        OpenMode {
            write: true,
            truncate: false,
        },
    )
    .unwrap()
}

/// File `name` in the root, opened for writing, written, unlinked while
/// open (and synced): its inode number and handle.
fn open_unlinked(t: &T, name: &str) -> (Ino, Arc<Handle>) {
    let ino = file(t, name);
    let h = open_for_writing(&t.fs, ino);
    t.fs.write(h.fh, 0, b"hello").unwrap();
    t.fs.unlink(Ino::ROOT, name.as_bytes()).unwrap();
    // Still readable through the handle.
    assert_eq!(t.fs.read(h.fh, 0, 5).unwrap(), b"hello");
    t.fs.sync().unwrap();
    assert!(t.engine.get(&keys::orphan(ino.0)).unwrap().is_some());
    (ino, h)
}

fn backing_path(t: &T, ino: Ino) -> std::path::PathBuf {
    t._dir
        .path()
        .join("data")
        .join(format!("{:02x}", ino.0 & 0xff))
        .join(format!("{:016x}", ino.0))
}

/// The end of the session frees a file unlinked while open even if its
/// handle was never released (an unmount drops a RELEASE or FORGET still
/// queued): its records and backing file are gone once `close` returns.
#[test]
fn unlinked_open_file_is_freed_when_the_session_ends() {
    let t = setup(320);
    let (ino, _h) = open_unlinked(&t, "f");
    let backing = backing_path(&t, ino);
    assert!(backing.exists());
    t.fs.close().unwrap();
    assert!(t.engine.get(&keys::orphan(ino.0)).unwrap().is_none());
    assert!(t.engine.get(&keys::inode(ino.0)).unwrap().is_none());
    assert!(!backing.exists(), "{} left behind", backing.display());
}

#[test]
fn unlinked_open_file_is_reclaimed_at_next_mount() {
    let t = setup(320);
    let (ino, _h) = open_unlinked(&t, "f");
    // "Crash": mount again without releasing.
    let sb = t.fs.superblock().clone();
    let fs = remount(t._dir.path(), &t.engine, sb);
    fs.sync().unwrap();
    assert!(t.engine.get(&keys::orphan(ino.0)).unwrap().is_none());
    assert!(t.engine.get(&keys::inode(ino.0)).unwrap().is_none());
    assert!(!backing_path(&t, ino).exists());
}

#[test]
fn size_of_file_open_for_writing_is_reconciled_at_next_mount() {
    let t = setup(320);
    let ino = file(&t, "f");
    let h = open_for_writing(&t.fs, ino);
    t.fs.write(h.fh, 0, &[1u8; 10_000]).unwrap();
    assert_eq!(t.fs.getattr(ino).unwrap().size, 10_000);
    t.fs.sync().unwrap();
    let sb = t.fs.superblock().clone();
    let fs = remount(t._dir.path(), &t.engine, sb);
    assert_eq!(fs.getattr(ino).unwrap().size, 10_000);
    // A clean unmount records "clean"; a crash leaves "mounted".
    fs.close().unwrap();
    let m = t.engine.get(keys::MOUNT_STATE).unwrap().unwrap();
    assert!(
        crate::format::superblock::MountState::decode(&m)
            .unwrap()
            .clean
    );
}

#[test]
fn rename_rules() {
    let t = setup(320);
    let ctx = Ctx::root();
    let a = file(&t, "a");
    let b = file(&t, "b");
    let d =
        t.fs.make_node(&ctx, Ino::ROOT, b"d", libc::S_IFDIR | 0o755, 0, 0, None)
            .unwrap()
            .ino;
    let noreplace = RenameFlags {
        noreplace: true,
        ..RenameFlags::default()
    };
    assert!(matches!(
        t.fs.rename(&ctx, Ino::ROOT, b"a", Ino::ROOT, b"b", noreplace),
        Err(CoreError::Exists)
    ));
    assert!(matches!(
        t.fs.rename(
            &ctx,
            Ino::ROOT,
            b"a",
            Ino::ROOT,
            b"d",
            RenameFlags::default()
        ),
        Err(CoreError::IsDir)
    ));
    assert!(matches!(
        t.fs.rename(
            &ctx,
            Ino::ROOT,
            b"d",
            Ino::ROOT,
            b"a",
            RenameFlags::default()
        ),
        Err(CoreError::NotDir)
    ));
    let exchange = RenameFlags {
        exchange: true,
        ..RenameFlags::default()
    };
    t.fs.rename(&ctx, Ino::ROOT, b"a", Ino::ROOT, b"d", exchange)
        .unwrap();
    assert_eq!(t.fs.lookup(Ino::ROOT, b"a").unwrap().ino, d);
    assert_eq!(t.fs.lookup(Ino::ROOT, b"d").unwrap().ino, a);
    t.fs.rename(
        &ctx,
        Ino::ROOT,
        b"d",
        Ino::ROOT,
        b"b",
        RenameFlags::default(),
    )
    .unwrap();
    assert_eq!(t.fs.lookup(Ino::ROOT, b"b").unwrap().ino, a);
    assert!(matches!(
        t.fs.lookup(Ino::ROOT, b"d"),
        Err(CoreError::NotFound)
    ));
    // The replaced file is an orphan until the kernel forgets it.
    assert_eq!(t.fs.getattr(b).unwrap().nlink, 0);
    t.fs.forget(b, 1);
    assert!(matches!(t.fs.getattr(b), Err(CoreError::NotFound)));
    // Moving a directory keeps link counts.
    let e =
        t.fs.make_node(&ctx, Ino::ROOT, b"e", libc::S_IFDIR | 0o755, 0, 0, None)
            .unwrap()
            .ino;
    let root_links = t.fs.getattr(Ino::ROOT).unwrap().nlink;
    t.fs.rename(&ctx, Ino::ROOT, b"a", e, b"moved", RenameFlags::default())
        .unwrap();
    assert_eq!(t.fs.getattr(Ino::ROOT).unwrap().nlink, root_links - 1);
    assert_eq!(t.fs.getattr(e).unwrap().nlink, 3);
    let entries = t.fs.readdir(d, Cookie(0), 10).unwrap();
    assert_eq!(entries[1].name, b"..");
    assert_eq!(entries[1].ino, e);
}

#[test]
fn readdir_cookies_survive_changes() {
    let t = setup(320);
    for i in 0..300 {
        file(&t, &format!("f{i:03}"));
    }
    let first = t.fs.readdir(Ino::ROOT, Cookie(0), 102).unwrap();
    let resume = first.last().unwrap().cookie;
    // Remove some seen and some unseen entries, add new ones.
    for i in (0..300).step_by(7) {
        t.fs.unlink(Ino::ROOT, format!("f{i:03}").as_bytes())
            .unwrap();
    }
    for i in 0..10 {
        file(&t, &format!("new{i}"));
    }
    let mut seen: Vec<Vec<u8>> = first.iter().map(|e| e.name.clone()).collect();
    let mut off = resume;
    loop {
        let page = t.fs.readdir(Ino::ROOT, off, 50).unwrap();
        if page.is_empty() {
            break;
        }
        off = page.last().unwrap().cookie;
        seen.extend(page.into_iter().map(|e| e.name));
    }
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), seen.len(), "an entry was returned twice");
    for i in 0..300 {
        let n = format!("f{i:03}").into_bytes();
        if i % 7 != 0 {
            assert!(seen.contains(&n), "unchanged entry {i} skipped");
        }
    }
}

#[test]
fn default_acl_is_inherited() {
    let t = setup(320);
    let ctx = Ctx::root();
    let d =
        t.fs.make_node(&ctx, Ino::ROOT, b"d", libc::S_IFDIR | 0o777, 0o022, 0, None)
            .unwrap()
            .ino;
    // u::rwx u:1000:rwx g::r-x m::rwx o::---
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (1u16, 7u16, 0u32),
        (2, 7, 1000),
        (4, 5, 0),
        (0x10, 7, 0),
        (0x20, 0, 0),
    ] {
        acl.extend_from_slice(&tag.to_le_bytes());
        acl.extend_from_slice(&perm.to_le_bytes());
        acl.extend_from_slice(&id.to_le_bytes());
    }
    t.fs.setxattr(&Ctx::root(), d, b"system.posix_acl_default", &acl, 0)
        .unwrap();
    let f =
        t.fs.make_node(&ctx, d, b"f", libc::S_IFREG | 0o666, 0o022, 0, None)
            .unwrap();
    assert_eq!(
        f.mode & 0o777,
        0o660,
        "mode masked by the default ACL, not the umask"
    );
    assert!(t.fs.getxattr(f.ino, b"system.posix_acl_access").is_ok());
    let sub =
        t.fs.make_node(&ctx, d, b"s", libc::S_IFDIR | 0o777, 0o022, 0, None)
            .unwrap();
    assert_eq!(
        t.fs.getxattr(sub.ino, b"system.posix_acl_default").unwrap(),
        acl
    );
    // chmod rewrites the mask entry of the access ACL.
    t.fs.setattr(
        &ctx,
        f.ino,
        &SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let a = t.fs.getxattr(f.ino, b"system.posix_acl_access").unwrap();
    let mask = a[4..]
        .chunks(8)
        .find(|c| u16::from_le_bytes([c[0], c[1]]) == 0x10)
        .unwrap();
    assert_eq!(u16::from_le_bytes([mask[2], mask[3]]), 0);
}

#[test]
fn corrupt_inode_is_eio_not_data() {
    let t = setup(320);
    let ino = file(&t, "f");
    t.fs.close().unwrap();
    let key = keys::inode(ino.0);
    let mut rec = t.engine.get(&key).unwrap().unwrap();
    rec[10] ^= 0x40;
    t.engine.commit(&[(key.to_vec(), Some(rec))]).unwrap();
    let sb = t.fs.superblock().clone();
    let fs = remount(t._dir.path(), &t.engine, sb);
    let err = fs.getattr(ino).unwrap_err();
    assert_eq!(err.errno(), libc::EIO);
    assert!(matches!(
        fs.lookup(Ino::ROOT, b"f"),
        Err(CoreError::Corrupt { .. })
    ));
}

#[test]
fn inode_cache_stays_within_its_byte_budget() {
    let t = setup(64);
    let opts = Options {
        commit_interval: Duration::from_millis(1),
        async_commit: false,
        cache_bytes: 64 << 10,
        ..Options::default()
    };
    let sb = t.fs.superblock().clone();
    t.fs.close().unwrap();
    let fs = Fs::mount(
        t._dir.path(),
        t.engine.clone() as Arc<dyn MetaStore>,
        sb,
        opts,
    )
    .unwrap();
    let mut inos = Vec::new();
    for i in 0..200 {
        let name = format!("f{i}");
        let ino = fs
            .make_node(
                &Ctx::root(),
                Ino::ROOT,
                name.as_bytes(),
                libc::S_IFREG | 0o644,
                0,
                0,
                None,
            )
            .unwrap()
            .ino;
        fs.setxattr(&Ctx::root(), ino, b"user.v", &[i as u8; 3000], 0)
            .unwrap();
        inos.push(ino);
        let (bytes, sum) = fs.state.lock().cache_accounting();
        assert!(bytes <= 64 << 10, "cache holds {bytes} bytes");
        assert_eq!(sum, bytes, "byte accounting drifted");
    }
    // Evicted entries come back from the store intact.
    for (i, ino) in inos.iter().enumerate() {
        assert_eq!(fs.getxattr(*ino, b"user.v").unwrap(), vec![i as u8; 3000]);
    }
}

/// A count that would go below zero (here: the kernel forgetting more
/// references than it was given) is a bug somewhere: loud, never absorbed.
#[test]
fn an_impossible_count_is_loud() {
    let t = setup(320);
    let a =
        t.fs.make_node(
            &Ctx::root(),
            Ino::ROOT,
            b"f",
            libc::S_IFREG | 0o644,
            0,
            0,
            None,
        )
        .unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.fs.forget(a.ino, 2)));
    if cfg!(debug_assertions) {
        assert!(r.is_err(), "debug builds stop at an impossible count");
    } else {
        r.unwrap();
    }
    assert_eq!(t.fs.broken_counts(), 1, "counted for safs info --stats");
}

/// An encrypted volume on the real engine: every name, xattr and symlink
/// target reads back through the keys, none of them is in the metadata
/// file in the clear, and the volume refuses to mount without its keys or
/// with another volume's.
#[test]
fn encrypted_volume_keeps_names_and_values_sealed() {
    use crate::core::crypto::KdfParams;
    use crate::core::volume::{self, Encryption};
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    let pass = b"correct horse".to_vec();
    volume::format(
        &vol,
        &volume::FormatOptions {
            inline_bytes: 256,
            force: false,
            uid: 0,
            gid: 0,
            encryption: Some(Encryption {
                passphrase: zeroize::Zeroizing::new(pass.clone()),
                kdf: KdfParams::TESTING,
            }),
            engine: crate::meta::NewEngine::Lmdb,
            data: None,
        },
    )
    .unwrap();
    let open = |with_keys: bool| {
        let (store, sb) = volume::open_store(&vol).unwrap();
        let keys = with_keys.then(|| {
            let master = volume::unlock(store.as_ref(), &sb, &pass).unwrap();
            volume::keys_for(&master, &sb)
        });
        let opts = Options {
            commit_interval: Duration::from_millis(1),
            async_commit: false,
            keys,
            ..Options::default()
        };
        Fs::mount(&vol, store, sb, opts)
    };
    {
        let fs = open(true).unwrap();
        let ctx = Ctx::root();
        let d = fs
            .make_node(
                &ctx,
                Ino::ROOT,
                b"SecretDir",
                libc::S_IFDIR | 0o755,
                0,
                0,
                None,
            )
            .unwrap();
        let f = fs
            .make_node(
                &ctx,
                d.ino,
                b"SecretFile",
                libc::S_IFREG | 0o644,
                0,
                0,
                None,
            )
            .unwrap();
        fs.make_node(
            &ctx,
            d.ino,
            b"SecretLink",
            libc::S_IFLNK | 0o777,
            0,
            0,
            Some(b"SecretTarget"),
        )
        .unwrap();
        fs.setxattr(&ctx, f.ino, b"user.SecretSmall", b"SecretValue1", 0)
            .unwrap();
        fs.setxattr(&ctx, f.ino, b"user.SecretBig", &[b'Q'; 65_536], 0)
            .unwrap();
        fs.close().unwrap();
    }
    let mut raw = Vec::new();
    for f in std::fs::read_dir(vol.join("meta")).unwrap() {
        raw.extend(written_bytes(&f.unwrap().path()));
    }
    for needle in [&b"Secret"[..], b"correct horse", &[b'Q'; 64][..], b"user."] {
        assert!(
            !raw.windows(needle.len()).any(|w| w == needle),
            "{:?} is in the metadata file in the clear",
            String::from_utf8_lossy(needle)
        );
    }
    assert!(matches!(open(false), Err(CoreError::Keys(_))));
    let fs = open(true).unwrap();
    let ctx = Ctx::root();
    let d = fs.lookup(Ino::ROOT, b"SecretDir").unwrap();
    let f = fs.lookup(d.ino, b"SecretFile").unwrap();
    let l = fs.lookup(d.ino, b"SecretLink").unwrap();
    assert_eq!(fs.readlink(l.ino).unwrap(), b"SecretTarget");
    assert_eq!(
        fs.getxattr(f.ino, b"user.SecretSmall").unwrap(),
        b"SecretValue1"
    );
    assert_eq!(fs.getxattr(f.ino, b"user.SecretBig").unwrap().len(), 65_536);
    let mut names: Vec<Vec<u8>> = fs
        .readdir(d.ino, Cookie(0), 100)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort();
    assert_eq!(
        names,
        [&b"."[..], b"..", b"SecretFile", b"SecretLink"].map(|n| n.to_vec())
    );
    let mut list = fs.listxattr(&ctx, f.ino).unwrap();
    list.sort();
    let mut want = b"user.SecretBig\0user.SecretSmall\0".to_vec();
    want.sort();
    assert_eq!(list, want);
    assert!(matches!(
        fs.lookup(d.ino, b"Missing"),
        Err(CoreError::NotFound)
    ));
    fs.close().unwrap();
}

/// The bytes of a (sparse) file's data extents: the metadata file is
/// extended sparsely to the engine's map size.
fn written_bytes(path: &std::path::Path) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as i64;
    let mut out = Vec::new();
    let mut pos = 0i64;
    while pos < len {
        let Ok(data) = nix::unistd::lseek(&f, pos, nix::unistd::Whence::SeekData) else {
            break;
        };
        let hole = nix::unistd::lseek(&f, data, nix::unistd::Whence::SeekHole).unwrap();
        f.seek(SeekFrom::Start(data as u64)).unwrap();
        let mut buf = vec![0; (hole - data) as usize];
        f.read_exact(&mut buf).unwrap();
        out.extend(buf);
        pos = hole;
    }
    out
}

/// The directory cache changes no answer: random namespace operations on
/// two volumes, one with the cache and one without, listed in small pages
/// (partial fills) and looked up by name (absent ones too), agree.
#[test]
fn dircache_agrees_with_the_engine() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    #[derive(Clone, Debug)]
    enum Op {
        Create(u8, u8),
        Mkdir(u8, u8),
        Unlink(u8, u8),
        Rmdir(u8, u8),
        Rename(u8, u8, u8, u8, bool),
        Lookup(u8, u8),
        List(u8, u8),
    }
    let op = prop_oneof![
        (0u8..3, 0u8..12).prop_map(|(d, n)| Op::Create(d, n)),
        (0u8..3, 0u8..12).prop_map(|(d, n)| Op::Mkdir(d, n)),
        (0u8..3, 0u8..12).prop_map(|(d, n)| Op::Unlink(d, n)),
        (0u8..3, 0u8..12).prop_map(|(d, n)| Op::Rmdir(d, n)),
        (0u8..3, 0u8..12, 0u8..3, 0u8..12, any::<bool>())
            .prop_map(|(a, b, c, d, x)| Op::Rename(a, b, c, d, x)),
        (0u8..3, 0u8..12).prop_map(|(d, n)| Op::Lookup(d, n)),
        (0u8..3, 1u8..6).prop_map(|(d, p)| Op::List(d, p)),
    ];
    let mut runner = TestRunner::new(Config {
        cases: 48,
        ..Config::default()
    });
    runner
        .run(&prop::collection::vec(op, 1..120), |ops| {
            let vols: Vec<T> = [true, false]
                .into_iter()
                .map(|on| {
                    let mut t = setup(64);
                    let opts = Options {
                        commit_interval: Duration::from_millis(1),
                        async_commit: false,
                        dircache: Some(on),
                        ..Options::default()
                    };
                    let sb = t.fs.sb.clone();
                    t.fs.close().unwrap();
                    t.fs = Fs::mount(t._dir.path(), t.engine.clone(), sb, opts).unwrap();
                    t
                })
                .collect();
            let ctx = Ctx::root();
            // Three directories: the root and two made first.
            let mut dirs = Vec::new();
            for t in &vols {
                let a =
                    t.fs.make_node(&ctx, Ino::ROOT, b"A", libc::S_IFDIR | 0o755, 0, 0, None)
                        .unwrap()
                        .ino;
                let b =
                    t.fs.make_node(&ctx, Ino::ROOT, b"B", libc::S_IFDIR | 0o755, 0, 0, None)
                        .unwrap()
                        .ino;
                dirs.push([Ino::ROOT, a, b]);
            }
            let name = |n: u8| format!("n{n}").into_bytes();
            for op in ops {
                let mut seen: Vec<String> = Vec::new();
                for (t, d) in vols.iter().zip(&dirs) {
                    let fs = &t.fs;
                    let r = match &op {
                        Op::Create(p, n) => fs
                            .make_node(
                                &ctx,
                                d[*p as usize],
                                &name(*n),
                                libc::S_IFREG | 0o644,
                                0,
                                0,
                                None,
                            )
                            .map(|_| String::new()),
                        Op::Mkdir(p, n) => fs
                            .make_node(
                                &ctx,
                                d[*p as usize],
                                &name(*n),
                                libc::S_IFDIR | 0o755,
                                0,
                                0,
                                None,
                            )
                            .map(|_| String::new()),
                        Op::Unlink(p, n) => {
                            fs.unlink(d[*p as usize], &name(*n)).map(|_| String::new())
                        }
                        Op::Rmdir(p, n) => {
                            fs.rmdir(d[*p as usize], &name(*n)).map(|_| String::new())
                        }
                        Op::Rename(a, b, c, e, x) => fs
                            .rename(
                                &ctx,
                                d[*a as usize],
                                &name(*b),
                                d[*c as usize],
                                &name(*e),
                                RenameFlags {
                                    exchange: *x,
                                    ..RenameFlags::default()
                                },
                            )
                            .map(|_| String::new()),
                        Op::Lookup(p, n) => fs
                            .lookup(d[*p as usize], &name(*n))
                            .map(|a| format!("{:o}", a.mode)),
                        Op::List(p, page) => {
                            let mut all = Vec::new();
                            let mut at = Cookie(0);
                            loop {
                                let got = fs.readdir(d[*p as usize], at, *page as usize).unwrap();
                                let Some(last) = got.last() else { break };
                                at = last.cookie;
                                all.extend(got.into_iter().map(|e| {
                                    format!("{}:{}", e.cookie.0, String::from_utf8_lossy(&e.name))
                                }));
                            }
                            Ok(all.join(","))
                        }
                    };
                    seen.push(match r {
                        Ok(s) => s,
                        Err(e) => format!("errno {}", e.errno()),
                    });
                }
                prop_assert_eq!(&seen[0], &seen[1], "{:?}", op);
            }
            prop_assert!(vols[0].fs.cache_figures().dirs > 0, "the cache was used");
            prop_assert_eq!(vols[1].fs.cache_figures().dir_budget, 0);
            Ok(())
        })
        .unwrap();
}

/// Where every read is a round trip, the second cold lookup that misses in
/// a directory reads a window of its entries and their inodes: a walk
/// through 300 names costs a few reads, every answer as a single read's,
/// and a path walk (one lookup per directory) reads no window.
#[test]
fn cold_lookups_through_one_directory_read_windows_where_reads_are_round_trips() {
    use std::sync::atomic::Ordering::Relaxed;
    let mut t = setup(64);
    t.engine.round_trips.store(true, Relaxed);
    remount_with_dircache(&mut t, true);
    let fs = &t.fs;
    let mut path = vec![Ino::ROOT];
    for name in ["p1", "p2", "p3"] {
        let parent = *path.last().unwrap();
        let d = fs
            .make_node(
                &Ctx::root(),
                parent,
                name.as_bytes(),
                libc::S_IFDIR | 0o755,
                0,
                0,
                None,
            )
            .unwrap();
        fs.forget(d.ino, 1);
        path.push(d.ino);
    }
    let mut made = Vec::new();
    for i in 0..300 {
        let name = format!("f{i:03}");
        let ino = file(&t, &name);
        fs.forget(ino, 1);
        // Over the inline budget: a spill page each.
        let big = vec![i as u8; 200];
        fs.setxattr(&Ctx::root(), ino, b"user.big", &big, 0)
            .unwrap();
        made.push((name, ino));
    }
    fs.sync().unwrap();
    fs.drop_caches();
    t.engine.dirent_gets.store(0, Relaxed);
    t.engine.dirent_scans.store(0, Relaxed);
    // A path walk: one cold lookup per directory.
    let mut at = Ino::ROOT;
    for (name, want) in ["p1", "p2", "p3"].iter().zip(&path[1..]) {
        let a = fs.lookup(at, name.as_bytes()).unwrap();
        assert_eq!(a.ino, *want);
        at = a.ino;
    }
    assert_eq!(t.engine.dirent_scans.load(Relaxed), 0);
    assert_eq!(t.engine.dirent_gets.load(Relaxed), 3);
    // Creates' lookups of new names in a cold directory: no window.
    for i in 0..10 {
        let name = format!("new{i}");
        assert!(matches!(
            fs.lookup(path[3], name.as_bytes()),
            Err(CoreError::NotFound)
        ));
    }
    assert_eq!(t.engine.dirent_scans.load(Relaxed), 0);
    t.engine.dirent_gets.store(0, Relaxed);
    // A walk through the root, whose last cold lookup (of p1) found its
    // name: windows from the first name on.
    t.engine.spill_reads.store(0, Relaxed);
    for (i, (name, want)) in made.iter().enumerate() {
        let a = fs.lookup(Ino::ROOT, name.as_bytes()).unwrap();
        assert_eq!(a.ino, *want, "{name}");
        assert_eq!(a.mode, libc::S_IFREG | 0o644, "{name}");
        // The spill pages came with the window.
        assert_eq!(
            fs.getxattr(*want, b"user.big").unwrap(),
            vec![i as u8; 200],
            "{name}"
        );
    }
    let spill_reads = t.engine.spill_reads.load(Relaxed);
    assert!((2..=4).contains(&spill_reads), "{spill_reads} spill reads");
    let (gets, scans) = (
        t.engine.dirent_gets.load(Relaxed),
        t.engine.dirent_scans.load(Relaxed),
    );
    assert!(gets <= 1, "{gets} point reads of entries");
    assert!((2..=4).contains(&scans), "{scans} windows for 300 names");
    // Absent names: in a window or past the last, never an answer of it.
    for name in ["f1000", "f299x", "zzz"] {
        assert!(matches!(
            fs.lookup(Ino::ROOT, name.as_bytes()),
            Err(CoreError::NotFound)
        ));
    }
}

/// A walk through a tree (`git status`), in no particular order within a
/// directory: a window goes down into the subdirectories it brings, as far
/// as it holds; the first cold miss in one it could not hold whole reads a
/// window, from the directory's first entry when it holds no more than a
/// window: a read per window's worth of entries, not per directory.
#[test]
fn a_walk_through_a_tree_reads_its_small_directories_a_window_at_a_time() {
    use std::sync::atomic::Ordering::Relaxed;
    let mut t = setup(64);
    t.engine.round_trips.store(true, Relaxed);
    remount_with_dircache(&mut t, true);
    let fs = &t.fs;
    let mut dirs = Vec::new();
    for d in 0..5 {
        let name = format!("d{d}");
        let dir = fs
            .make_node(
                &Ctx::root(),
                Ino::ROOT,
                name.as_bytes(),
                libc::S_IFDIR | 0o755,
                0,
                0,
                None,
            )
            .unwrap();
        fs.forget(dir.ino, 1);
        let mut files = Vec::new();
        for i in 0..40 {
            let fname = format!("f{i:02}");
            let f = fs
                .make_node(
                    &Ctx::root(),
                    dir.ino,
                    fname.as_bytes(),
                    libc::S_IFREG | 0o644,
                    0,
                    0,
                    None,
                )
                .unwrap();
            fs.forget(f.ino, 1);
            files.push((fname, f.ino));
        }
        dirs.push((name, dir.ino, files));
    }
    fs.sync().unwrap();
    fs.drop_caches();
    t.engine.dirent_gets.store(0, Relaxed);
    t.engine.dirent_scans.store(0, Relaxed);
    for (name, ino, files) in &dirs {
        assert_eq!(fs.lookup(Ino::ROOT, name.as_bytes()).unwrap().ino, *ino);
        // Last name first: a window from the looked-up name would bring
        // nothing after it.
        for (fname, want) in files.iter().rev() {
            assert_eq!(
                fs.lookup(*ino, fname.as_bytes()).unwrap().ino,
                *want,
                "{fname}"
            );
        }
    }
    let (gets, scans) = (
        t.engine.dirent_gets.load(Relaxed),
        t.engine.dirent_scans.load(Relaxed),
    );
    // d0 (the root's first miss) and d0's first file alone, then windows:
    // d0's; the root's (at d1), which goes down into d0, d1, d2 and the
    // first 3 entries of d3 (5 + 3 * 40 + 3 = 128); d3's and d4's.
    assert_eq!((gets, scans), (2, 4), "point reads, windows");
}

/// A record that does not decode in a subdirectory a window goes down
/// into fails only the lookups that need it: the window still answers the
/// lookups of its own directory and brings the subdirectories' other
/// entries, and the damaged one is reported as corruption by its own.
#[test]
fn a_damaged_record_below_a_window_fails_only_its_own_lookup() {
    use std::sync::atomic::Ordering::Relaxed;
    let mut t = setup(64);
    t.engine.round_trips.store(true, Relaxed);
    remount_with_dircache(&mut t, true);
    let mut tree = Vec::new();
    for d in ["d0", "d1"] {
        let dir = node(&t.fs, Ino::ROOT, d, true).unwrap();
        let files: Vec<(String, Ino)> = (0..3)
            .map(|i| {
                let f = format!("f{i}");
                let ino = node(&t.fs, dir, &f, false).unwrap();
                (f, ino)
            })
            .collect();
        tree.push((d, dir, files));
    }
    let damaged = tree[0].2[1].1;
    t.fs.sync().unwrap();
    let key = keys::inode(damaged.0);
    let mut rec = t.engine.get(&key).unwrap().unwrap();
    rec[10] ^= 0x40;
    t.engine.commit(&[(key.to_vec(), Some(rec))]).unwrap();
    remount_with_dircache(&mut t, true);
    let fs = &t.fs;
    t.engine.dirent_gets.store(0, Relaxed);
    t.engine.dirent_scans.store(0, Relaxed);
    for (d, dir, _) in &tree {
        assert_eq!(fs.lookup(Ino::ROOT, d.as_bytes()).unwrap().ino, *dir);
    }
    for (d, dir, files) in &tree {
        for (f, ino) in files {
            let got = fs.lookup(*dir, f.as_bytes());
            if *ino == damaged {
                assert!(matches!(got, Err(CoreError::Corrupt { .. })), "{got:?}");
            } else {
                assert_eq!(got.unwrap().ino, *ino, "{d}/{f}");
            }
        }
    }
    // d0 alone (the root's first miss), then the root's window, which
    // brings d0's and d1's entries but the damaged one; that one's lookup
    // reads d0's window, which fails, and then the name alone.
    let (gets, scans) = (
        t.engine.dirent_gets.load(Relaxed),
        t.engine.dirent_scans.load(Relaxed),
    );
    assert_eq!((gets, scans), (2, 2), "point reads, windows");
}

#[test]
fn getxattrs_through_a_directory_in_turn_read_the_next_spills_in_one_scan_where_reads_are_round_trips()
 {
    use std::sync::atomic::Ordering::Relaxed;
    let mut t = setup(64);
    t.engine.round_trips.store(true, Relaxed);
    remount_with_dircache(&mut t, true);
    let fs = &t.fs;
    let mut made = Vec::new();
    for i in 0..100 {
        let name = format!("f{i:03}");
        let ino = file(&t, &name);
        fs.forget(ino, 1);
        // 16 KiB each: a window's 128 are past what it reads of spills.
        let big = vec![i as u8; 16 << 10];
        fs.setxattr(&Ctx::root(), ino, b"user.big", &big, 0)
            .unwrap();
        made.push((name, ino));
    }
    fs.sync().unwrap();
    let read_all = |from: usize| {
        fs.drop_caches();
        t.engine.spill_reads.store(0, Relaxed);
        for (i, (name, want)) in made.iter().enumerate().skip(from) {
            let a = fs.lookup(Ino::ROOT, name.as_bytes()).unwrap();
            assert_eq!(a.ino, *want, "{name}");
            assert_eq!(
                fs.getxattr(*want, b"user.big").unwrap(),
                vec![i as u8; 16 << 10],
                "{name}"
            );
        }
        t.engine.spill_reads.load(Relaxed)
    };
    // The first two alone, then runs of 512 KiB: 31 files' pages a scan.
    let reads = read_all(0);
    assert!(
        (4..=7).contains(&reads),
        "{reads} spill reads for 100 files"
    );
    // One getxattr of a file among cached ones reads its own pages only.
    fs.drop_caches();
    fs.lookup(Ino::ROOT, b"f000").unwrap();
    fs.lookup(Ino::ROOT, b"f001").unwrap();
    t.engine.spill_reads.store(0, Relaxed);
    let (_, ino) = &made[50];
    assert_eq!(
        fs.getxattr(*ino, b"user.big").unwrap(),
        vec![50u8; 16 << 10]
    );
    assert_eq!(t.engine.spill_reads.load(Relaxed), 1);
    let (_, next) = &made[52];
    assert_eq!(
        fs.getxattr(*next, b"user.big").unwrap(),
        vec![52u8; 16 << 10]
    );
    let (_, after) = &made[60];
    assert_eq!(
        fs.getxattr(*after, b"user.big").unwrap(),
        vec![60u8; 16 << 10]
    );
    // 52 followed 50 (a run: its next ones came along, 60 among them).
    assert_eq!(t.engine.spill_reads.load(Relaxed), 2);
    // Where reads are not round trips, each file reads its own.
    t.engine.round_trips.store(false, Relaxed);
    assert_eq!(read_all(0), 100);
}

#[test]
fn replacing_an_overflow_value_reads_its_record_once() {
    use std::sync::atomic::Ordering::Relaxed;
    let t = setup(64);
    let fs = &t.fs;
    let ino = file(&t, "f");
    // 64 KiB: past the spill tier, an overflow record each.
    let big = |b: u8| vec![b; 64 << 10];
    fs.setxattr(&Ctx::root(), ino, b"user.a", &big(1), 0)
        .unwrap();
    fs.setxattr(&Ctx::root(), ino, b"user.b", &big(2), 0)
        .unwrap();
    let reads = || t.engine.overflow_reads.swap(0, Relaxed);
    // The flags' check reads the record (committed: not answered from the
    // store's pending writes); the store reuses what it found.
    for (v, flags) in [(3, xattr::XATTR_REPLACE), (4, 0)] {
        fs.sync().unwrap();
        reads();
        fs.setxattr(&Ctx::root(), ino, b"user.a", &big(v), flags)
            .unwrap();
        assert_eq!(reads(), 1);
    }
    assert!(matches!(
        fs.setxattr(&Ctx::root(), ino, b"user.a", &big(5), xattr::XATTR_CREATE),
        Err(CoreError::Exists)
    ));
    reads();
    // Into a packed tier and back: the record goes, then comes again.
    fs.setxattr(&Ctx::root(), ino, b"user.a", b"small", 0)
        .unwrap();
    assert_eq!(fs.getxattr(ino, b"user.a").unwrap(), b"small");
    fs.setxattr(&Ctx::root(), ino, b"user.a", &big(6), 0)
        .unwrap();
    fs.sync().unwrap();
    fs.drop_caches();
    assert_eq!(fs.getxattr(ino, b"user.a").unwrap(), big(6));
    assert_eq!(fs.getxattr(ino, b"user.b").unwrap(), big(2));
    fs.removexattr(&Ctx::root(), ino, b"user.a").unwrap();
    assert!(matches!(
        fs.getxattr(ino, b"user.a"),
        Err(CoreError::NoData)
    ));
    assert_eq!(fs.getxattr(ino, b"user.b").unwrap(), big(2));
}

/// Each directory's `safs.dir.*` statistics against a walk of its tree;
/// returns the tree's (files, subdirectories) below `dir`.
fn stats_match_a_walk(fs: &Fs, dir: Ino) -> (u64, u64) {
    stats_and_bytes_match_a_walk(fs, dir).0
}

/// [`stats_match_a_walk`], and the bytes below `dir`.
fn stats_and_bytes_match_a_walk(fs: &Fs, dir: Ino) -> ((u64, u64), u64) {
    stats_match_a_walk_in_full(fs, dir).0
}

/// [`stats_and_bytes_match_a_walk`], and the newest ctime at or below
/// `dir`, which its `safs.dir.rctime` is never behind.
fn stats_match_a_walk_in_full(fs: &Fs, dir: Ino) -> (((u64, u64), u64), i64) {
    let (mut files, mut subdirs, mut rfiles, mut rsubdirs, mut rbytes) = (0, 0, 0, 0, 0);
    let mut rblocks = 0;
    let mut newest = fs.getattr(dir).unwrap().ctime.sec;
    let mut after = Cookie::START;
    loop {
        let page = fs.readdir(dir, after, 100).unwrap();
        let Some(last) = page.last() else { break };
        after = last.cookie;
        for e in page.iter().filter(|e| e.name != b"." && e.name != b"..") {
            if u32::from(e.kind) << 12 == libc::S_IFDIR {
                let (((f, d), b), t) = stats_match_a_walk_in_full(fs, e.ino);
                rblocks += fs.getxattr(e.ino, b"safs.dir.rallocated").map_or(0, |v| {
                    String::from_utf8(v).unwrap().parse::<u64>().unwrap() / 512
                });
                subdirs += 1;
                rfiles += f;
                rsubdirs += d + 1;
                rbytes += b;
                newest = newest.max(t);
            } else {
                files += 1;
                rfiles += 1;
                let a = fs.getattr(e.ino).unwrap();
                rbytes += a.size;
                rblocks += a.blocks;
                newest = newest.max(a.ctime.sec);
            }
        }
    }
    let stat = |n: &str| -> u64 {
        let v = fs
            .getxattr(dir, format!("safs.dir.{n}").as_bytes())
            .unwrap();
        String::from_utf8(v).unwrap().parse().unwrap()
    };
    let want = [
        ("files", files),
        ("subdirs", subdirs),
        ("entries", files + subdirs),
        ("rfiles", rfiles),
        ("rsubdirs", rsubdirs),
        ("rentries", rfiles + rsubdirs),
        ("rbytes", rbytes),
        ("rallocated", rblocks * 512),
    ];
    for (n, v) in want {
        assert_eq!(stat(n), v, "safs.dir.{n} of directory {dir}");
    }
    let rctime = stat("rctime") as i64;
    assert!(
        rctime >= newest,
        "safs.dir.rctime of directory {dir}: {rctime}, newest ctime below {newest}"
    );
    (((rfiles, rsubdirs), rbytes), rctime)
}

#[test]
fn directory_statistics_follow_every_change_of_an_entry() {
    let mut t = setup(320);
    let ctx = Ctx::root();
    let mk = |t: &T, parent: Ino, name: &str, dir: bool| node(&t.fs, parent, name, dir).unwrap();
    let a = mk(&t, Ino::ROOT, "a", true);
    let b = mk(&t, a, "b", true);
    let c = mk(&t, b, "c", true);
    let f = mk(&t, c, "f", false);
    mk(&t, b, "g", false);
    mk(&t, Ino::ROOT, "h", false);
    t.fs.make_node(&ctx, c, b"s", libc::S_IFLNK | 0o777, 0, 0, Some(b"f"))
        .unwrap();
    assert_eq!(stats_match_a_walk(&t.fs, Ino::ROOT), (4, 3));
    // A hard link counts in each directory that names it.
    t.fs.link(f, Ino::ROOT, b"f2").unwrap();
    let x = mk(&t, Ino::ROOT, "x", true);
    // A directory moves what it holds; within one directory nothing moves.
    let plain = RenameFlags::default();
    t.fs.rename(&ctx, a, b"b", x, b"b", plain).unwrap();
    t.fs.rename(&ctx, x, b"b", x, b"b2", plain).unwrap();
    stats_match_a_walk(&t.fs, Ino::ROOT);
    // An exchange of a directory and a file across directories.
    let exchange = RenameFlags {
        exchange: true,
        ..plain
    };
    t.fs.rename(&ctx, x, b"b2", Ino::ROOT, b"h", exchange)
        .unwrap();
    stats_match_a_walk(&t.fs, Ino::ROOT);
    // Over an existing file, and leaving a whiteout.
    t.fs.rename(&ctx, Ino::ROOT, b"f2", x, b"b2", plain)
        .unwrap();
    let whiteout = RenameFlags {
        whiteout: true,
        ..plain
    };
    t.fs.rename(&ctx, c, b"s", a, b"s", whiteout).unwrap();
    stats_match_a_walk(&t.fs, Ino::ROOT);
    t.fs.unlink(c, b"f").unwrap();
    t.fs.unlink(c, b"s").unwrap();
    t.fs.rmdir(b, b"c").unwrap();
    // Left: a/s, x/b2 (f), h/g (h is b now); a, x, h.
    assert_eq!(stats_match_a_walk(&t.fs, Ino::ROOT), (3, 3));
    // Not listed, not settable, absent on files.
    let names = t.fs.listxattr(&ctx, a).unwrap();
    assert!(!names.windows(5).any(|w| w == b"safs."), "{names:?}");
    assert!(matches!(
        t.fs.setxattr(&ctx, a, b"safs.dir.rfiles", b"0", 0),
        Err(CoreError::NotSupported)
    ));
    assert!(matches!(
        t.fs.removexattr(&Ctx::root(), a, b"safs.dir.rfiles"),
        Err(CoreError::NotSupported)
    ));
    let file_ino = t.fs.lookup(x, b"b2").unwrap().ino;
    for name in [&b"safs.dir.rfiles"[..], b"safs.dir.nonesuch"] {
        assert!(matches!(
            t.fs.getxattr(file_ino, name),
            Err(CoreError::NoData)
        ));
    }
    assert!(matches!(
        t.fs.getxattr(a, b"safs.dir.nonesuch"),
        Err(CoreError::NoData)
    ));
    // Sizes: a write and close, a truncate, a file with two names, one
    // removed while open.
    let write = |ino: Ino, at: u64, n: usize| {
        let h = open_for_writing(&t.fs, ino);
        t.fs.write(h.fh, at, &vec![7u8; n]).unwrap();
        t.fs.release(h.fh).unwrap();
    };
    let g = t.fs.lookup(b, b"g").unwrap().ino;
    write(g, 0, 5000);
    t.fs.link(g, a, b"g2").unwrap();
    t.fs.link(g, a, b"g3").unwrap();
    write(g, 10_000, 100);
    assert_eq!(
        stats_and_bytes_match_a_walk(&t.fs, Ino::ROOT).1,
        3 * 10_100 + 1
    );
    let cut = SetAttr {
        size: Some(300),
        ..SetAttr::default()
    };
    t.fs.setattr(&ctx, g, &cut).unwrap();
    t.fs.unlink(b, b"g").unwrap();
    stats_match_a_walk(&t.fs, Ino::ROOT);
    let h = open_for_writing(&t.fs, g);
    t.fs.unlink(a, b"g2").unwrap();
    t.fs.unlink(a, b"g3").unwrap();
    t.fs.write(h.fh, 0, &[1u8; 9000]).unwrap();
    t.fs.release(h.fh).unwrap();
    assert_eq!(stats_and_bytes_match_a_walk(&t.fs, Ino::ROOT).1, 1);
    let sized = mk(&t, x, "sized", false);
    write(sized, 0, 1234);
    // Many changes in a few directories, in an order no one chose; then
    // the same from the records alone.
    let dirs = [Ino::ROOT, a, x, b];
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for _ in 0..3_000 {
        let d = dirs[next(4) as usize];
        let name = format!("n{}", next(12));
        let _ = match next(7) {
            0 => {
                t.fs.make_node(&ctx, d, name.as_bytes(), libc::S_IFREG | 0o644, 0, 0, None)
                    .map(drop)
            }
            1 => {
                t.fs.make_node(&ctx, d, name.as_bytes(), libc::S_IFDIR | 0o755, 0, 0, None)
                    .map(drop)
            }
            2 => t.fs.unlink(d, name.as_bytes()),
            3 => t.fs.rmdir(d, name.as_bytes()),
            4 => {
                let to = dirs[next(4) as usize];
                let flags = RenameFlags {
                    exchange: next(3) == 0,
                    ..plain
                };
                let new = format!("n{}", next(12));
                t.fs.rename(&ctx, d, name.as_bytes(), to, new.as_bytes(), flags)
            }
            5 => match t.fs.lookup(d, name.as_bytes()) {
                Ok(attr) if attr.mode & libc::S_IFMT != libc::S_IFDIR => {
                    let h = t.fs.open(
                        attr.ino,
                        OpenMode {
                            write: true,
                            truncate: next(2) == 0,
                        },
                    );
                    h.and_then(|h| {
                        t.fs.write(h.fh, next(5000), &[3u8; 700])?;
                        t.fs.release(h.fh)
                    })
                }
                Ok(_) => Ok(()),
                Err(e) => Err(e),
            },
            _ => match t.fs.lookup(d, name.as_bytes()) {
                Ok(attr) => {
                    t.fs.link(
                        attr.ino,
                        dirs[next(4) as usize],
                        format!("l{}", next(12)).as_bytes(),
                    )
                    .map(drop)
                }
                Err(e) => Err(e),
            },
        };
    }
    let ((files, subdirs), bytes) = stats_and_bytes_match_a_walk(&t.fs, Ino::ROOT);
    assert!(
        files > 20 && subdirs > 10 && bytes > 10_000,
        "{files} files, {subdirs} directories, {bytes} bytes"
    );
    t.fs.sync().unwrap();
    remount_with_dircache(&mut t, false);
    assert_eq!(
        stats_and_bytes_match_a_walk(&t.fs, Ino::ROOT),
        ((files, subdirs), bytes)
    );
}

/// Ancestors' counts are written once per batch, not per operation
/// (`State::defer`): whatever the cache evicts or drops meanwhile, every
/// sync leaves each directory's record equal to a walk of its tree.
#[test]
fn deferred_statistics_reach_the_records_at_every_sync() {
    let mut t = setup(320);
    let opts = Options {
        // Batches only when synced: what ancestors are owed piles up
        // across hundreds of changes, renames of directories among them.
        commit_interval: Duration::from_secs(3600),
        // About two dozen entries: ancestors are evicted while deferred.
        cache_bytes: 8 << 10,
        ..Options::default()
    };
    remount_with(&mut t, opts);
    let ctx = Ctx::root();
    let mut chain = vec![Ino::ROOT];
    for depth in 0..30 {
        let at = *chain.last().unwrap();
        let d = t.fs.make_node(
            &ctx,
            at,
            format!("d{depth}").as_bytes(),
            libc::S_IFDIR | 0o755,
            0,
            0,
            None,
        );
        chain.push(d.unwrap().ino);
    }
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let records_match = |t: &T, chain: &[Ino]| {
        t.fs.sync().unwrap();
        for &dir in chain {
            let ((files, subdirs), bytes) = stats_and_bytes_match_a_walk(&t.fs, dir);
            let key = keys::inode(dir.0);
            let rec = t.engine.get(&key).unwrap().unwrap();
            let s = Inode::decode(&key, &rec).unwrap().stats.unwrap();
            let rctime = stats_match_a_walk_in_full(&t.fs, dir).1;
            assert_eq!(
                (s.rfiles, s.rsubdirs, s.rbytes, s.rctime),
                (files, subdirs, bytes, rctime),
                "record of directory {dir}"
            );
        }
    };
    let base = Timestamp::now().sec + 100_000;
    let mut newest = 0;
    for round in 1..=2_000 {
        let d = chain[next(chain.len() as u64) as usize];
        let name = format!("f{}", next(6));
        let sub = t.fs.lookup(d, b"sub").map(|a| a.ino);
        let _ = match next(8) {
            0 | 1 => {
                t.fs.make_node(&ctx, d, name.as_bytes(), libc::S_IFREG | 0o644, 0, 0, None)
                    .map(drop)
            }
            2 => t.fs.unlink(d, name.as_bytes()),
            3 => t.fs.lookup(d, name.as_bytes()).and_then(|a| {
                let h = open_for_writing(&t.fs, a.ino);
                t.fs.write(h.fh, next(3000), &[5u8; 900])?;
                t.fs.release(h.fh)?;
                // A change time ahead of every other: each directory above
                // must show it, and no other.
                newest = base + round;
                let set = SetAttr {
                    ctime: Some(Timestamp {
                        sec: newest,
                        nsec: 0,
                    }),
                    ..SetAttr::default()
                };
                t.fs.setattr(&ctx, a.ino, &set).map(drop)
            }),
            4 => {
                t.fs.make_node(&ctx, d, b"sub", libc::S_IFDIR | 0o755, 0, 0, None)
                    .map(drop)
                    .or_else(|_| t.fs.rmdir(d, b"sub"))
            }
            5 => sub.and_then(|s| {
                t.fs.make_node(&ctx, s, name.as_bytes(), libc::S_IFREG | 0o644, 0, 0, None)
                    .map(drop)
            }),
            6 => sub.and_then(|s| t.fs.unlink(s, name.as_bytes())),
            _ => {
                // A directory and what it holds moves up or down the chain,
                // over an empty one there, if any.
                let to = chain[next(chain.len() as u64) as usize];
                t.fs.rename(&ctx, d, b"sub", to, b"sub", RenameFlags::default())
            }
        };
        if round % 300 == 0 {
            t.fs.drop_caches();
        }
        if round % 500 == 0 {
            records_match(&t, &chain);
        }
    }
    remount_with_dircache(&mut t, false);
    records_match(&t, &chain);
    let root = t.fs.getxattr(Ino::ROOT, b"safs.dir.rctime").unwrap();
    assert_eq!(String::from_utf8(root).unwrap(), newest.to_string());
}

/// A batch the committer takes by itself (no sync, nobody reading) holds
/// what ancestors are owed for the operations in it: a crash after it
/// must not leave them behind (the crash loop once found the root so).
#[test]
fn a_batch_taken_unasked_holds_what_ancestors_are_owed() {
    let t = setup(320);
    let a = node(&t.fs, Ino::ROOT, "a", true).unwrap();
    for i in 0..20 {
        node(&t.fs, a, &format!("f{i}"), false).unwrap();
    }
    let key = keys::inode(Ino::ROOT.0);
    let started = std::time::Instant::now();
    loop {
        let rec = t.engine.get(&key).unwrap().unwrap();
        let s = Inode::decode(&key, &rec).unwrap().stats.unwrap();
        if (s.rfiles, s.rsubdirs) == (20, 1) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the root's record says {s:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What ancestors are owed from before a limit was first seen is paid by
/// the chain they had: a directory the same operation moves pays its old
/// ancestors, not its new ones.
#[test]
fn owed_counts_are_paid_where_they_were_when_limits_appear() {
    let mut t = setup(320);
    let opts = Options {
        commit_interval: Duration::from_secs(3600),
        ..Options::default()
    };
    remount_with(&mut t, opts);
    let ctx = Ctx::root();
    let mk = |parent: Ino, name: &str, dir: bool| node(&t.fs, parent, name, dir).unwrap();
    let a = mk(Ino::ROOT, "a", true);
    let b = mk(a, "b", true);
    let c = mk(b, "c", true);
    let x = mk(Ino::ROOT, "x", true);
    let q = mk(Ino::ROOT, "q", true);
    for i in 0..5 {
        mk(c, &format!("f{i}"), false);
    }
    // Limits from now on: counts must be exact before each change.
    t.fs.setxattr(&ctx, q, b"safs.quota.max_files", b"100", 0)
        .unwrap();
    t.fs.rename(&ctx, a, b"b", x, b"b", RenameFlags::default())
        .unwrap();
    assert_eq!(stats_match_a_walk(&t.fs, Ino::ROOT), (5, 5));
    t.fs.sync().unwrap();
    remount_with_dircache(&mut t, false);
    assert_eq!(stats_match_a_walk(&t.fs, Ino::ROOT), (5, 5));
}

#[test]
fn quotas_refuse_what_would_pass_them_and_nothing_else() {
    let t = setup(320);
    let (ctx, fs) = (Ctx::root(), &t.fs);
    let mk = |parent: Ino, name: &str, dir: bool| node(fs, parent, name, dir);
    let q = mk(Ino::ROOT, "q", true).unwrap();
    let out = mk(Ino::ROOT, "out", true).unwrap();
    let user = Ctx::unseen(1000, 1000);
    // Who may set them, where, and what.
    assert!(matches!(
        fs.setxattr(&user, q, b"safs.quota.max_files", b"3", 0),
        Err(CoreError::Perm)
    ));
    let f = mk(out, "f", false).unwrap();
    assert!(matches!(
        fs.setxattr(&ctx, f, b"safs.quota.max_files", b"3", 0),
        Err(CoreError::NotSupported)
    ));
    for bad in [&b"-1"[..], b"lots", b""] {
        assert!(matches!(
            fs.setxattr(&ctx, q, b"safs.quota.max_files", bad, 0),
            Err(CoreError::Invalid)
        ));
    }
    assert!(matches!(
        fs.getxattr(q, b"safs.quota.max_files"),
        Err(CoreError::NoData)
    ));
    fs.setxattr(&ctx, q, b"safs.quota.max_files", b"3", 0)
        .unwrap();
    assert_eq!(fs.getxattr(q, b"safs.quota.max_files").unwrap(), b"3");
    // Entries: three fit, a fourth of any kind does not.
    let sub = mk(q, "sub", true).unwrap();
    mk(q, "a", false).unwrap();
    mk(sub, "b", false).unwrap();
    assert!(matches!(mk(q, "c", false), Err(CoreError::Quota)));
    assert!(matches!(mk(sub, "d", true), Err(CoreError::Quota)));
    assert!(matches!(fs.link(f, q, b"l"), Err(CoreError::Quota)));
    let plain = RenameFlags::default();
    assert!(matches!(
        fs.rename(&ctx, out, b"f", q, b"f", plain),
        Err(CoreError::Quota)
    ));
    // Within the tree nothing is added; out of it, room is made.
    fs.rename(&ctx, q, b"a", sub, b"a", plain).unwrap();
    fs.rename(&ctx, sub, b"a", out, b"a", plain).unwrap();
    mk(q, "c", false).unwrap();
    stats_match_a_walk(fs, Ino::ROOT);
    // Nested: the inner limit holds where the outer one leaves room.
    fs.removexattr(&ctx, q, b"safs.quota.max_files").unwrap();
    assert!(matches!(
        fs.removexattr(&ctx, q, b"safs.quota.max_files"),
        Err(CoreError::NoData)
    ));
    fs.setxattr(&ctx, q, b"safs.quota.max_files", b"100", 0)
        .unwrap();
    fs.setxattr(&ctx, sub, b"safs.quota.max_files", b"1", 0)
        .unwrap();
    assert!(matches!(mk(sub, "e", false), Err(CoreError::Quota)));
    mk(q, "e", false).unwrap();
    // Bytes: a truncate up, a write through a bounded handle, a link of a
    // file with bytes, and statfs inside.
    fs.setxattr(&ctx, q, b"safs.quota.max_bytes", b"10000", 0)
        .unwrap();
    let e = fs.lookup(q, b"e").unwrap().ino;
    let grow = |size| SetAttr {
        size: Some(size),
        ..SetAttr::default()
    };
    fs.setattr(&ctx, e, &grow(9000)).unwrap();
    assert!(matches!(
        fs.setattr(&ctx, e, &grow(10_001)),
        Err(CoreError::Quota)
    ));
    let h = open_for_writing(fs, e);
    assert!(h.bounded, "a byte limit lies above it");
    fs.write(h.fh, 9000, &[1u8; 1000]).unwrap();
    // Short where the limit falls inside it, refused where it falls at
    // its start.
    assert_eq!(fs.write(h.fh, 9999, &[1u8; 2]).unwrap(), 1);
    assert!(matches!(
        fs.write(h.fh, 10_000, &[1u8; 2]),
        Err(CoreError::Quota)
    ));
    assert!(matches!(
        fs.fallocate(&ctx, h.fh, 0, 10_001, 0),
        Err(CoreError::Quota)
    ));
    fs.release(h.fh).unwrap();
    assert_eq!(fs.getattr(e).unwrap().size, 10_000);
    let outside = open_for_writing(fs, f);
    assert!(!outside.bounded);
    fs.write(outside.fh, 0, &[2u8; 50]).unwrap();
    fs.release(outside.fh).unwrap();
    fs.setattr(&ctx, e, &grow(9951)).unwrap();
    assert!(matches!(fs.link(f, q, b"f2"), Err(CoreError::Quota)));
    fs.setattr(&ctx, e, &grow(9950)).unwrap();
    fs.setxattr(&ctx, q, b"safs.quota.max_files", b"0", 0)
        .unwrap();
    fs.link(f, q, b"f2").unwrap();
    let s = fs.statfs(e).unwrap();
    assert_eq!(s.blocks, 10_000_u64.div_ceil(u64::from(s.bsize)));
    assert_eq!(s.bavail, 0);
    // A limit below what the tree holds: it can only shrink.
    fs.setxattr(&ctx, q, b"safs.quota.max_bytes", b"10", 0)
        .unwrap();
    assert!(matches!(
        fs.setattr(&ctx, e, &grow(9951)),
        Err(CoreError::Quota)
    ));
    fs.setattr(&ctx, e, &grow(0)).unwrap();
    fs.unlink(q, b"f2").unwrap();
    stats_match_a_walk(fs, Ino::ROOT);
}
