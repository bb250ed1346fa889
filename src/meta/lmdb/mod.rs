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

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use heed::types::Bytes;
use heed::{CommitOrAbort, Database, Env, EnvOpenOptions, MdbError};

use super::{EngineCounters, MetaError, MetaRead, MetaStore, WriteRef};

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
    gets: AtomicU64,
    scans: AtomicU64,
    commits: AtomicU64,
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
            let start = std::time::Instant::now();
            let summary = verify::check(&data).map_err(|e| match e {
                verify::CheckError::Damaged(what) => MetaError::Damaged {
                    path: data.clone(),
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
            .write(true)
            .open(dir.join("data.mdb"))?;
        if file.metadata()?.len() < MAP_SIZE as u64 {
            if let Err(e) = file.set_len(MAP_SIZE as u64) {
                tracing::warn!(error = %e, "cannot extend the metadata file to the map size; corrupt page pointers may crash the engine");
            }
        }
        Ok(Self {
            env,
            db,
            gets: AtomicU64::new(0),
            scans: AtomicU64::new(0),
            commits: AtomicU64::new(0),
        })
    }
}

impl MetaRead for LmdbStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, MetaError> {
        self.gets.fetch_add(1, Relaxed);
        let rtxn = self.env.read_txn().map_err(engine_err)?;
        match self.db.get(&rtxn, key).map_err(engine_err)? {
            Some(v) if v.len() > MAX_VALUE => Err(corrupt_value(v.len())),
            Some(v) => Ok(Some(v.to_vec())),
            None => Ok(None),
        }
    }

    fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, MetaError> {
        self.scans.fetch_add(1, Relaxed);
        let rtxn = self.env.read_txn().map_err(engine_err)?;
        let mut out = Vec::new();
        let range = (
            std::ops::Bound::Included(start),
            std::ops::Bound::Excluded(end),
        );
        for item in self.db.range(&rtxn, &range).map_err(engine_err)? {
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
}

impl MetaStore for LmdbStore {
    fn counters(&self) -> EngineCounters {
        EngineCounters {
            gets: self.gets.load(Relaxed),
            scans: self.scans.load(Relaxed),
            commits: self.commits.load(Relaxed),
        }
    }

    fn commit_iter<'a>(
        &self,
        batch: &mut dyn Iterator<Item = WriteRef<'a>>,
    ) -> Result<(), MetaError> {
        self.commits.fetch_add(1, Relaxed);
        let mut wtxn = self.env.write_txn().map_err(engine_err)?;
        for (k, v) in batch {
            match v {
                Some(v) => self.db.put(&mut wtxn, k, v).map_err(engine_err)?,
                None => {
                    self.db.delete(&mut wtxn, k).map_err(engine_err)?;
                }
            }
        }
        wtxn.commit().map_err(engine_err)
    }

    fn disk_bytes(&self) -> u64 {
        // Allocated bytes: the file's length is the (sparse) map size.
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(self.env.path().join("data.mdb")).map_or(0, |m| m.blocks() * 512)
    }
}

#[cfg(test)]
mod tests {
    use crate::meta::MetaRead;

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
