//! The embedded default engine: LMDB through `heed`.
//!
//! Why LMDB (measured, see DESIGN.md): the fastest cold and hot point reads
//! and scans of the candidates, reopen after `kill -9` in well under a
//! millisecond, and copy-on-write pages that make every commit atomic. Its
//! weak spot, a durable commit costing a few hundred µs, is what the core's
//! group commit amortises.
//!
//! Mind:
//! - the map size is fixed at open: we reserve a large address range (the
//!   file only grows as pages are used) and still map `MDB_MAP_FULL` to
//!   [`MetaError::NoSpace`];
//! - read transactions are short-lived (one per call) so they never pin old
//!   pages for long;
//! - a commit is durable on return (`fsync` of the data file);
//! - LMDB has no page checksums and trusts its page structure: a damaged
//!   page header, node or page number makes it read outside the page or the
//!   map, a crash. So every open first checks the whole structure in safe
//!   code ([`verify`]) and refuses a damaged file. Inside a record, damage is
//!   caught by the record's own checksum (EIO). As a second line, for damage
//!   that appears while the file is open, the data file is extended
//!   (sparsely: no disk space) to the whole map, where stray reads find
//!   zeros rather than SIGBUS, and values longer than any record safs writes
//!   are refused before they are touched.
//!
//! Space held ahead (see [`MetaStore::hold`]): LMDB copies every page it
//! changes, and new copies that find no free page extend the file. On a disk
//! that another writer fills, such a write fails — or is cut short, which
//! LMDB reports as EIO — and a batch the core already acknowledged cannot
//! commit. So the range after LMDB's last page is allocated ahead with
//! `fallocate`, like a journal: pages LMDB writes there need no new blocks.
//! The worst case a batch can add, which the core sums up: per write, a
//! copy of its leaf (two for a delete, which may merge with a sibling) and,
//! for a put, a new leaf from a split and a share of the branch splits that
//! leaf splits cause (branch pages hold at least six keys of up to 511
//! bytes, so branch splits stay under half of the leaf splits); per batch,
//! a copy of every branch page, twice the levels (a new root, a split at
//! every level), and the free-page database's own pages. Values larger
//! than a node add their overflow pages. Real growth is far less (copies
//! reuse free pages); the bound only has to be safe, and a property test
//! checks it against LMDB itself. Copy-on-write filesystems (btrfs) can
//! still refuse a write into
//! allocated blocks; on them the hold is best effort.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use heed::types::Bytes;
use heed::{CommitOrAbort, Database, Env, EnvOpenOptions, MdbError};

use super::{EngineCounters, EngineTally, MetaError, MetaRead, MetaStore, WriteRef};

pub mod verify;

/// Address space reserved for the map: 1 TiB on 64-bit hosts (virtual only).
const MAP_SIZE: usize = 1 << 40;

/// No record safs writes is longer (the largest is a 64 KiB xattr value in
/// its envelope); a longer value can only come from a corrupt node.
const MAX_VALUE: usize = 1 << 20;

fn corrupt_value(len: usize) -> MetaError {
    MetaError::Engine(format!("corrupt engine node: value of {len} bytes"))
}

pub struct LmdbStore {
    env: Env,
    db: Database<'static, Bytes, Bytes>,
    /// The data file, for `fallocate` of the space held ahead.
    file: File,
    page_size: u64,
    /// Depth and branch pages of the tree after the last commit (for
    /// [`LmdbStore::batch_bound`]).
    depth: AtomicU32,
    branch_pages: AtomicU64,
    /// End of the range of the data file known to be allocated: at least
    /// the pages LMDB uses, plus what [`MetaStore::hold`] allocated after
    /// them. Invariant: never above what was allocated (a failed or partial
    /// `fallocate` leaves it where it was).
    allocated_end: Mutex<u64>,
    tally: EngineTally,
}

/// Checks the structure of the data file at `data` (see [`verify`]).
fn check_structure(data: &Path) -> Result<(), MetaError> {
    let start = std::time::Instant::now();
    let summary = verify::check(data).map_err(|e| match e {
        verify::CheckError::Damaged(what) => MetaError::Damaged {
            path: data.to_path_buf(),
            what,
        },
        verify::CheckError::Io(e) => MetaError::Io(e),
    })?;
    tracing::info!(
        txn = summary.txnid,
        pages = summary.pages_read,
        entries = summary.entries,
        ms = start.elapsed().as_millis() as u64,
        "metadata structure checked"
    );
    Ok(())
}

/// A read-only view of an existing store that writes nothing at all, not
/// even LMDB's reader table in `lock.mdb` (`MDB_RDONLY | MDB_NOLOCK`): what
/// the command that unlocks an encrypted volume reads, so that a wrong
/// passphrase leaves every byte of the volume as it was. Without the lock
/// file LMDB cannot see other processes' transactions, so this is only for
/// reads made before the volume is served (a concurrent writer could reuse
/// the pages read; the records' own checksums would catch that).
pub struct LmdbSnapshot {
    env: Env,
    db: Database<'static, Bytes, Bytes>,
}

impl LmdbSnapshot {
    /// Opens the store in `dir` read-only, after the same structure check
    /// as [`LmdbStore::open`]. A missing store is an error, never created.
    pub fn open(dir: &Path) -> Result<Self, MetaError> {
        let data = dir.join("data.mdb");
        if !data.exists() {
            return Err(MetaError::Missing(dir.to_path_buf()));
        }
        check_structure(&data)?;
        let mut opts = EnvOpenOptions::new();
        opts.map_size(MAP_SIZE).max_dbs(1);
        // SAFETY: as in `LmdbStore::open` (mapped file only safs writes;
        // one environment per path in this process, dropped before the
        // daemon opens its own). The flags only drop writes: READ_ONLY
        // opens the data file read-only, NO_LOCK skips the lock file.
        #[allow(unsafe_code)]
        let env = unsafe {
            opts.flags(heed::EnvFlags::READ_ONLY | heed::EnvFlags::NO_LOCK);
            opts.open(dir)
        }
        .map_err(engine_err)?;
        let db = open_main_db(&env)?;
        Ok(Self { env, db })
    }
}

/// The main database of an environment opened read-only (never created).
fn open_main_db(env: &Env) -> Result<Database<'static, Bytes, Bytes>, MetaError> {
    let rtxn = env.read_txn().map_err(engine_err)?;
    env.open_databases_and_commit(rtxn, |opener, rtxn| {
        opener
            .open_database::<Bytes, Bytes>(rtxn, None)
            .map(CommitOrAbort::<_, ()>::Commit)
    })
    .map_err(engine_err)?
    .unwrap_commit()
    .ok_or_else(|| MetaError::Engine("the metadata file has no main database".into()))
}

/// Hands every pair of the store in `dir` to `f` in key order, from one
/// read transaction: a consistent snapshot even while a daemon writes the
/// store (opened read-only but with LMDB's reader table in `lock.mdb`,
/// which keeps the snapshot's pages from reuse until it ends). The page
/// check of [`LmdbStore::open`] is not made: a writer's pages change
/// under it.
pub fn snapshot_each(dir: &Path, f: &mut super::EachPair) -> Result<(), MetaError> {
    if !dir.join("data.mdb").exists() {
        return Err(MetaError::Missing(dir.to_path_buf()));
    }
    let mut opts = EnvOpenOptions::new();
    opts.map_size(MAP_SIZE).max_dbs(1).max_readers(1024);
    // SAFETY: as in `LmdbStore::open`; this process opens the environment
    // once, read-only (the daemon writing it is another process, which
    // LMDB's lock file coordinates with).
    #[allow(unsafe_code)]
    let env = unsafe {
        opts.flags(heed::EnvFlags::READ_ONLY);
        opts.open(dir)
    }
    .map_err(engine_err)?;
    let db = open_main_db(&env)?;
    // One transaction for the whole walk: the snapshot.
    let rtxn = env.read_txn().map_err(engine_err)?;
    for item in db.iter(&rtxn).map_err(engine_err)? {
        let (k, v) = item.map_err(engine_err)?;
        if v.len() > MAX_VALUE {
            return Err(corrupt_value(v.len()));
        }
        f(k, v)?;
    }
    Ok(())
}

impl MetaRead for LmdbSnapshot {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, MetaError> {
        read_get(&self.env, self.db, key)
    }

    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<super::Pairs, MetaError> {
        read_scan(&self.env, self.db, start, end, limit)
    }
}

/// One point read in its own short read transaction, refusing values no
/// record can have.
fn read_get(
    env: &Env,
    db: Database<'static, Bytes, Bytes>,
    key: &[u8],
) -> Result<Option<Vec<u8>>, MetaError> {
    let rtxn = env.read_txn().map_err(engine_err)?;
    txn_get(&rtxn, db, key)
}

/// A point read in an open read transaction, refusing values no record
/// can have.
fn txn_get(
    rtxn: &heed::RoTxn,
    db: Database<'static, Bytes, Bytes>,
    key: &[u8],
) -> Result<Option<Vec<u8>>, MetaError> {
    match db.get(rtxn, key).map_err(engine_err)? {
        Some(v) if v.len() > MAX_VALUE => Err(corrupt_value(v.len())),
        Some(v) => Ok(Some(v.to_vec())),
        None => Ok(None),
    }
}

/// Up to `limit` pairs with `start <= key < end`, likewise.
fn read_scan(
    env: &Env,
    db: Database<'static, Bytes, Bytes>,
    start: &[u8],
    end: &[u8],
    limit: usize,
) -> Result<super::Pairs, MetaError> {
    let rtxn = env.read_txn().map_err(engine_err)?;
    let range = (
        std::ops::Bound::Included(start),
        std::ops::Bound::Excluded(end),
    );
    let mut out = Vec::new();
    for item in db.range(&rtxn, &range).map_err(engine_err)? {
        if out.len() >= limit {
            break;
        }
        let (k, v) = item.map_err(engine_err)?;
        if v.len() > MAX_VALUE {
            return Err(corrupt_value(v.len()));
        }
        out.push((k.to_vec(), v.to_vec()));
    }
    Ok(out)
}

/// Bytes of an LMDB page header.
const PAGE_HEADER: u64 = 16;
/// Bytes of an LMDB node header (before its key and value).
const NODE_HEADER: u64 = 8;

/// The largest node that stays in its page; larger values go to overflow
/// pages (LMDB's `me_nodemax`).
const fn node_max(page_size: u64) -> u64 {
    (((page_size - PAGE_HEADER) / 2) & !1) - 2
}

/// Whether a record stays in a leaf page of `page_size` bytes (else its
/// value takes overflow pages of its own: a page or more per record).
pub fn stays_in_leaf(page_size: u64, key_len: usize, value_len: usize) -> bool {
    NODE_HEADER + (key_len + value_len) as u64 <= node_max(page_size)
}

fn engine_err(e: heed::Error) -> MetaError {
    match e {
        heed::Error::Mdb(MdbError::MapFull) => MetaError::NoSpace,
        heed::Error::Io(io) if io.raw_os_error() == Some(libc::ENOSPC) => MetaError::NoSpace,
        heed::Error::Io(io) => MetaError::Io(io),
        other => MetaError::Engine(other.to_string()),
    }
}

impl LmdbStore {
    /// Opens (creating if missing) the store in directory `dir`, after
    /// checking an existing file's structure (see [`verify`]).
    pub fn open(dir: &Path) -> Result<Self, MetaError> {
        std::fs::create_dir_all(dir)?;
        let data = dir.join("data.mdb");
        if data.exists() {
            check_structure(&data)?;
        }
        let mut opts = EnvOpenOptions::new();
        opts.map_size(MAP_SIZE).max_dbs(1).max_readers(1024);
        // SAFETY: heed's `open` is unsafe because LMDB memory-maps the file:
        // (1) the same environment must not be opened twice in one process —
        //     the volume lock (one daemon per volume) and opening once per
        //     `Volume` guarantee that; (2) the file must not be truncated or
        //     modified by others while mapped — it lives in the volume
        //     directory that only safs writes, created 0700.
        #[allow(unsafe_code)]
        let env = unsafe { opts.open(dir) }.map_err(engine_err)?;
        let wtxn = env.write_txn().map_err(engine_err)?;
        let db = env
            .create_databases_and_commit(wtxn, |opener, wtxn| {
                opener
                    .create_database::<Bytes, Bytes>(wtxn, None)
                    .map(CommitOrAbort::<_, ()>::Commit)
            })
            .map_err(engine_err)?
            .unwrap_commit();
        // Sparse extension to the map size (see the module comment).
        // Not fatal where the filesystem caps file sizes lower.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join("data.mdb"))?;
        if file.metadata()?.len() < MAP_SIZE as u64 {
            if let Err(e) = file.set_len(MAP_SIZE as u64) {
                tracing::warn!(error = %e, "cannot extend the metadata file to the map size; corrupt page pointers may crash the engine");
            }
        }
        let stat = env.unnamed_database_stat();
        let store = Self {
            env,
            db,
            file,
            page_size: u64::from(stat.page_size.max(512)),
            depth: AtomicU32::new(stat.depth),
            branch_pages: AtomicU64::new(stat.branch_pages as u64),
            allocated_end: Mutex::new(0),
            tally: EngineTally::default(),
        };
        *store.allocated_end.lock() = store.used_end();
        Ok(store)
    }

    /// End of the pages LMDB uses (its last page, committed).
    fn used_end(&self) -> u64 {
        (self.env.info().last_page_number as u64 + 1) * self.page_size
    }

    /// Allocates `[from, to)` of the data file.
    fn allocate(&self, from: u64, to: u64) -> std::io::Result<()> {
        let len = (to - from) as i64;
        match nix::fcntl::fallocate(
            &self.file,
            nix::fcntl::FallocateFlags::empty(),
            from as i64,
            len,
        ) {
            Ok(()) => Ok(()),
            // No fallocate here (some network filesystems): writing zeros
            // allocates as well. LMDB overwrites them as it takes the pages.
            Err(nix::errno::Errno::EOPNOTSUPP) => {
                let zeros = vec![0u8; 1 << 20];
                let mut at = from;
                while at < to {
                    let n = (to - at).min(zeros.len() as u64) as usize;
                    self.file.write_all_at(&zeros[..n], at)?;
                    at += n as u64;
                }
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl MetaRead for LmdbStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, MetaError> {
        self.tally.get();
        read_get(&self.env, self.db, key)
    }

    fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, MetaError> {
        // Still one point read per key in the counters: one transaction
        // saves its setup, not the descents.
        let rtxn = self.env.read_txn().map_err(engine_err)?;
        keys.iter()
            .map(|k| {
                self.tally.get();
                txn_get(&rtxn, self.db, k)
            })
            .collect()
    }

    fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, MetaError> {
        self.tally.scan();
        read_scan(&self.env, self.db, start, end, limit)
    }
}

impl MetaStore for LmdbStore {
    fn counters(&self) -> EngineCounters {
        self.tally.counters()
    }

    fn commit_iter<'a>(
        &self,
        batch: &mut dyn Iterator<Item = WriteRef<'a>>,
    ) -> Result<(), MetaError> {
        self.tally.commit();
        let mut wtxn = self.env.write_txn().map_err(engine_err)?;
        for (k, v) in batch {
            match v {
                Some(v) => self.db.put(&mut wtxn, k, v).map_err(engine_err)?,
                None => {
                    self.db.delete(&mut wtxn, k).map_err(engine_err)?;
                }
            }
        }
        wtxn.commit().map_err(engine_err)?;
        let stat = self.env.unnamed_database_stat();
        self.depth.store(stat.depth, Relaxed);
        self.branch_pages.store(stat.branch_pages as u64, Relaxed);
        Ok(())
    }

    fn write_bound(&self, key_len: usize, value_len: Option<usize>) -> u64 {
        // See the module comment.
        let pages = match value_len {
            None => 2,
            Some(v) => {
                let overflow = if !stays_in_leaf(self.page_size, key_len, v) {
                    (PAGE_HEADER + v as u64).div_ceil(self.page_size)
                } else {
                    0
                };
                3 + overflow
            }
        };
        pages * self.page_size
    }

    fn batch_bound(&self) -> u64 {
        // Every branch page copied once and its splits' remainder, a new
        // root and a split per level, and the free-page database (its path
        // and the record of the pages this batch frees: the core adds a
        // 512th of the writes' bound for the latter).
        let levels = u64::from(self.depth.load(Relaxed)) + 1;
        let branches = self.branch_pages.load(Relaxed);
        (2 * branches + 2 * levels + 64) * self.page_size
    }

    fn hold(&self, bytes: u64) -> Result<u64, MetaError> {
        let mut end = self.allocated_end.lock();
        let used = self.used_end();
        *end = (*end).max(used);
        if *end - used >= bytes {
            return Ok(*end - used);
        }
        // In whole MiB, so that holding a little more is one call, not many.
        let target = (used + bytes).next_multiple_of(1 << 20);
        match self.allocate(*end, target) {
            Ok(()) => {
                *end = target;
                Ok(target - used)
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => Err(MetaError::NoSpace),
            Err(e) => Err(MetaError::Io(e)),
        }
    }

    fn held(&self) -> u64 {
        let end = *self.allocated_end.lock();
        end.saturating_sub(self.used_end())
    }

    fn disk_bytes(&self) -> u64 {
        // Allocated bytes: the file's length is the (sparse) map size.
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(self.env.path().join("data.mdb")).map_or(0, |m| m.blocks() * 512)
    }
}

#[cfg(test)]
mod tests {
    use crate::meta::{MetaRead, MetaStore, Write};
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn get_many_reads_each_key_in_one_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let store = super::LmdbStore::open(dir.path()).unwrap();
        store
            .commit(&[
                (b"a".to_vec(), Some(b"1".to_vec())),
                (b"c".to_vec(), Some(b"3".to_vec())),
            ])
            .unwrap();
        let before = store.counters().gets;
        let keys = [b"c".to_vec(), b"b".to_vec(), b"a".to_vec(), b"c".to_vec()];
        let got = store.get_many(&keys).unwrap();
        assert_eq!(
            got,
            vec![
                Some(b"3".to_vec()),
                None,
                Some(b"1".to_vec()),
                Some(b"3".to_vec())
            ]
        );
        // Counted as the point reads they are.
        assert_eq!(store.counters().gets - before, 4);
        assert!(store.get_many(&[]).unwrap().is_empty());
    }

    #[test]
    fn hold_allocates_ahead_and_commits_draw_on_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = super::LmdbStore::open(dir.path()).unwrap();
        let blocks = || {
            std::fs::metadata(dir.path().join("data.mdb"))
                .unwrap()
                .blocks()
                * 512
        };
        let before = blocks();
        let held = store.hold(8 << 20).unwrap();
        assert!(held >= 8 << 20, "held {held}");
        assert_eq!(store.held(), held);
        assert!(blocks() >= before + (8 << 20), "fallocate did not allocate");
        // Asking for what is held already allocates nothing more.
        assert_eq!(store.hold(1 << 20).unwrap(), held);
        let batch: Vec<Write> = (0..2000u32)
            .map(|i| (i.to_be_bytes().to_vec(), Some(vec![7u8; 300])))
            .collect();
        store.commit(&batch).unwrap();
        let after = store.held();
        assert!(after < held, "a growing commit uses the held space");
        assert!(
            blocks() <= before + held + (1 << 20),
            "LMDB wrote outside the hold"
        );
    }

    /// Whatever a batch holds, the file grows by no more than the bounds
    /// the core adds up for it.
    #[test]
    fn growth_stays_within_the_bound() {
        use proptest::prelude::*;
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(48));
        // Keys from a small space (so puts overwrite and deletes hit) of
        // three lengths; values from tiny to overflow-sized.
        let key =
            (0u16..3000, prop_oneof![Just(0usize), Just(40), Just(300)]).prop_map(|(k, suffix)| {
                let mut key = k.to_be_bytes().to_vec();
                key.resize(2 + suffix, 7);
                key
            });
        let value = prop_oneof![
            3 => proptest::option::of(0usize..400),
            1 => proptest::option::of(0usize..70_000),
        ];
        let write = (key, value);
        runner
            .run(
                &proptest::collection::vec(proptest::collection::vec(write, 1..1500), 1..8),
                |batches| {
                    let dir = tempfile::tempdir().unwrap();
                    let store = super::LmdbStore::open(dir.path()).unwrap();
                    for batch in batches {
                        let writes: Vec<Write> = batch
                            .into_iter()
                            .map(|(k, v)| (k, v.map(|n| vec![3u8; n])))
                            .collect();
                        let bound: u64 = writes
                            .iter()
                            .map(|(k, v)| store.write_bound(k.len(), v.as_ref().map(Vec::len)))
                            .sum();
                        let bound = bound + bound / 512 + store.batch_bound();
                        let used = store.used_end();
                        store.commit(&writes).unwrap();
                        let grown = store.used_end() - used;
                        prop_assert!(grown <= bound, "grew {grown} > bound {bound}");
                    }
                    Ok(())
                },
            )
            .unwrap();
    }

    #[test]
    fn conformance() {
        let dir = tempfile::tempdir().unwrap();
        let store = super::LmdbStore::open(dir.path()).unwrap();
        super::super::conformance::run(&store);
        drop(store);
        let store = super::LmdbStore::open(dir.path()).unwrap();
        assert_eq!(store.get(b"b").unwrap().as_deref(), Some(&b"x"[..]));
    }
}
