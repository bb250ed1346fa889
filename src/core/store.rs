//! Group commit: an in-memory overlay in front of the metadata engine.
//!
//! Handlers apply each operation's writes to the *pending* map in one step
//! and reply at once; a committer thread swaps the pending map out (it
//! becomes *committing*) every `interval`, or sooner when a caller waits for
//! durability or the batch grows large, and writes it to the engine as one
//! atomic, durable transaction. Hence:
//!
//! - one operation's writes are never split across batches (they enter the
//!   pending map under one lock, and the committer takes the whole map);
//! - after a crash the volume is exactly the state after some batch;
//! - `fsync`/`fsyncdir`/unmount wait for the batch holding their changes.
//!
//! Reads consult pending, then committing, then the engine, and always in
//! that order (overlay before engine): a commit that finishes between the two
//! steps only moves a value from the overlay into the engine, never out of
//! sight.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::error::{CoreError, Result};
use super::reserve::Reserve;
use crate::meta::{MetaError, MetaStore, Write};

type Map = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// A batch larger than this is committed without waiting for the interval.
const EAGER_BYTES: usize = 8 << 20;
/// Writers block while this much is waiting to be committed (backpressure).
/// The overlay then holds at most about twice this (a full pending batch
/// and the one being committed), and LMDB a dirty copy of the latter:
/// enough to keep a commit always under way, little enough that writing
/// 64 KiB xattrs at full speed does not grow the daemon (256 MiB here let
/// it reach 1.5 GiB in bench T1).
const MAX_PENDING_BYTES: usize = 4 * EAGER_BYTES;

struct Overlay {
    pending: Map,
    /// Files to delete once `pending` is durable (backing files of freed
    /// inodes): deleting them earlier would lose data if a crash brought
    /// their inodes back.
    pending_unlinks: Vec<PathBuf>,
    pending_bytes: usize,
    /// When the oldest pending write arrived.
    pending_since: Option<Instant>,
    /// Sequence number of the last operation applied to `pending`.
    applied_seq: u64,
    /// Being written by the committer; empty when idle.
    committing: Arc<Map>,
    /// Every operation with a sequence number ≤ this is durable.
    durable_seq: u64,
    /// Someone is waiting for durability: commit now.
    urgent: bool,
    /// The last commit failed; cleared by the next success.
    failure: Option<Failure>,
    shutdown: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    NoSpace,
    Io,
}

pub struct Store {
    engine: Arc<dyn MetaStore>,
    overlay: Mutex<Overlay>,
    /// Signalled when work arrives for the committer.
    work: Condvar,
    /// Signalled when `durable_seq` advances or a commit fails.
    done: Condvar,
    interval: Duration,
    committer: Mutex<Option<JoinHandle<()>>>,
    reserve: Option<Arc<Reserve>>,
}

impl Store {
    pub fn new(
        engine: Arc<dyn MetaStore>,
        interval: Duration,
        reserve: Option<Arc<Reserve>>,
    ) -> Arc<Self> {
        let store = Arc::new(Store {
            engine,
            overlay: Mutex::new(Overlay {
                pending: Map::new(),
                pending_unlinks: Vec::new(),
                pending_bytes: 0,
                pending_since: None,
                applied_seq: 0,
                committing: Arc::new(Map::new()),
                durable_seq: 0,
                urgent: false,
                failure: None,
                shutdown: false,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
            interval,
            committer: Mutex::new(None),
            reserve,
        });
        let s = Arc::clone(&store);
        let handle = std::thread::Builder::new()
            .name("safs-commit".into())
            .spawn(move || s.commit_loop())
            .expect("spawn committer thread");
        *store.committer.lock() = Some(handle);
        store
    }

    pub fn engine_counters(&self) -> crate::meta::EngineCounters {
        self.engine.counters()
    }

    /// Point read through the overlay.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        {
            let ov = self.overlay.lock();
            if let Some(v) = ov.pending.get(key) {
                return Ok(v.clone());
            }
            if let Some(v) = ov.committing.get(key) {
                return Ok(v.clone());
            }
        }
        Ok(self.engine.get(key)?)
    }

    /// Up to `limit` live pairs in `[start, end)`, merged across overlay and
    /// engine. Cost is O(limit · log n) however large the range.
    pub fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        let mut cursor = start.to_vec();
        let probe = limit.max(1).saturating_add(1);
        while out.len() < limit {
            // Overlay first, engine second (see the module comment).
            let (pend, comm) = {
                let ov = self.overlay.lock();
                let range = (
                    Bound::Included(cursor.clone()),
                    Bound::Excluded(end.to_vec()),
                );
                let take = |m: &Map| -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
                    m.range(range.clone())
                        .take(probe)
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                };
                (take(&ov.pending), take(&ov.committing))
            };
            let eng = self.engine.scan(&cursor, end, probe)?;
            // Keys below `horizon` are complete in all three sources.
            let mut horizon: Option<Vec<u8>> = None;
            let mut clip = |len: usize, last: Option<&Vec<u8>>| {
                if len >= probe {
                    let k = last.expect("non-empty").clone();
                    if horizon.as_ref().is_none_or(|h| k < *h) {
                        horizon = Some(k);
                    }
                }
            };
            clip(pend.len(), pend.last().map(|p| &p.0));
            clip(comm.len(), comm.last().map(|p| &p.0));
            clip(eng.len(), eng.last().map(|p| &p.0));
            let below = |k: &Vec<u8>| horizon.as_ref().is_none_or(|h| k < h);
            let mut merged: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
            for (k, v) in eng.into_iter().filter(|(k, _)| below(k)) {
                merged.insert(k, Some(v));
            }
            for (k, v) in comm.into_iter().filter(|(k, _)| below(k)) {
                merged.insert(k, v);
            }
            for (k, v) in pend.into_iter().filter(|(k, _)| below(k)) {
                merged.insert(k, v);
            }
            for (k, v) in merged {
                if let Some(v) = v {
                    if out.len() == limit {
                        return Ok(out);
                    }
                    out.push((k, v));
                }
            }
            match horizon {
                Some(h) => cursor = h,
                None => break,
            }
        }
        Ok(out)
    }

    /// Applies one operation's writes atomically to the pending batch and
    /// returns its sequence number (for [`Store::wait_durable`]).
    pub fn apply(&self, writes: Vec<Write>) -> u64 {
        let mut ov = self.overlay.lock();
        if writes.is_empty() {
            // Nothing to make durable: the newest sequence number covers it.
            return ov.applied_seq;
        }
        while ov.pending_bytes > MAX_PENDING_BYTES && !ov.shutdown {
            ov.urgent = true;
            self.work.notify_one();
            self.done.wait_for(&mut ov, Duration::from_millis(50));
        }
        for (k, v) in writes {
            ov.pending_bytes += k.len() + v.as_ref().map_or(0, Vec::len);
            ov.pending.insert(k, v);
        }
        ov.applied_seq += 1;
        if ov.pending_since.is_none() {
            ov.pending_since = Some(Instant::now());
            self.work.notify_one();
        } else if ov.pending_bytes > EAGER_BYTES {
            self.work.notify_one();
        }
        ov.applied_seq
    }

    /// [`Store::apply`], then deletes `unlink` once those writes are durable.
    pub fn apply_then_unlink(&self, writes: Vec<Write>, unlink: Option<PathBuf>) -> u64 {
        let seq = self.apply(writes);
        if let Some(path) = unlink {
            // Same batch as the writes: nothing can commit in between
            // because the committer takes the whole pending state at once,
            // and a later batch is always safe.
            self.overlay.lock().pending_unlinks.push(path);
        }
        seq
    }

    /// The sequence number of the newest applied operation.
    pub fn applied_seq(&self) -> u64 {
        self.overlay.lock().applied_seq
    }

    /// Blocks until every operation up to `seq` is durable.
    pub fn wait_durable(&self, seq: u64) -> Result<()> {
        let mut ov = self.overlay.lock();
        while ov.durable_seq < seq {
            if let Some(f) = ov.failure {
                return Err(match f {
                    Failure::NoSpace => CoreError::NoSpace,
                    Failure::Io => CoreError::Io(std::io::Error::from_raw_os_error(libc::EIO)),
                });
            }
            ov.urgent = true;
            self.work.notify_one();
            self.done.wait_for(&mut ov, Duration::from_millis(100));
        }
        Ok(())
    }

    /// Makes everything applied so far durable.
    pub fn sync(&self) -> Result<()> {
        let seq = self.applied_seq();
        self.wait_durable(seq)
    }

    /// The failure of the last commit, if it failed.
    pub fn failure(&self) -> Option<Failure> {
        self.overlay.lock().failure
    }

    /// Writes what is pending and stops the committer.
    pub fn close(&self) -> Result<()> {
        let res = self.sync();
        self.overlay.lock().shutdown = true;
        self.work.notify_all();
        if let Some(h) = self.committer.lock().take() {
            let _ = h.join();
        }
        res
    }

    fn commit_loop(&self) {
        let mut ov = self.overlay.lock();
        loop {
            // Wait for a batch that is due.
            loop {
                if ov.pending.is_empty() {
                    if ov.durable_seq < ov.applied_seq && ov.committing.is_empty() {
                        // Everything applied is already in the engine.
                        ov.durable_seq = ov.applied_seq;
                        self.done.notify_all();
                    }
                    if ov.shutdown {
                        return;
                    }
                    self.work.wait(&mut ov);
                    continue;
                }
                let age = ov.pending_since.map_or(Duration::ZERO, |t| t.elapsed());
                let backoff = if ov.failure.is_some() {
                    Duration::from_millis(200)
                } else {
                    Duration::ZERO
                };
                if (ov.urgent
                    || ov.shutdown
                    || ov.pending_bytes > EAGER_BYTES
                    || age >= self.interval)
                    && age >= backoff
                {
                    break;
                }
                let wait = self.interval.max(backoff).saturating_sub(age);
                self.work.wait_for(&mut ov, wait);
            }
            let batch = Arc::new(std::mem::take(&mut ov.pending));
            let unlinks = std::mem::take(&mut ov.pending_unlinks);
            ov.committing = Arc::clone(&batch);
            ov.pending_bytes = 0;
            ov.pending_since = None;
            ov.urgent = false;
            let seq = ov.applied_seq;
            drop(ov);

            // Borrowed: the batch stays visible to readers as `committing`
            // meanwhile, and a copy would double the memory a commit holds.
            let res = self
                .engine
                .commit_iter(&mut batch.iter().map(|(k, v)| (k.as_slice(), v.as_deref())));

            ov = self.overlay.lock();
            match res {
                Ok(()) => {
                    if let Some(r) = self.reserve.as_ref().filter(|r| r.is_released()) {
                        r.refill();
                    }
                    ov.durable_seq = seq;
                    ov.failure = None;
                    ov.committing = Arc::new(Map::new());
                    for path in &unlinks {
                        match std::fs::remove_file(path) {
                            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                                tracing::error!(path = %path.display(), error = %e, "cannot remove a freed backing file");
                            }
                            _ => {}
                        }
                    }
                }
                Err(e) => {
                    // Out of space: give the engine the reserve and retry at once.
                    let retry_now = matches!(e, MetaError::NoSpace)
                        && self.reserve.as_ref().is_some_and(|r| r.release());
                    if !retry_now {
                        tracing::error!(error = %e, writes = batch.len(), "metadata commit failed; will retry");
                    }
                    ov.failure = Some(match e {
                        MetaError::NoSpace => Failure::NoSpace,
                        _ => Failure::Io,
                    });
                    // Put the batch back under anything newer.
                    let mut newer = std::mem::take(&mut ov.pending);
                    let mut restored = (*batch).clone();
                    restored.append(&mut newer);
                    ov.pending_bytes = restored
                        .iter()
                        .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
                        .sum();
                    ov.pending = restored;
                    let mut newer_unlinks = std::mem::take(&mut ov.pending_unlinks);
                    ov.pending_unlinks = unlinks;
                    ov.pending_unlinks.append(&mut newer_unlinks);
                    ov.pending_since = Some(Instant::now());
                    ov.committing = Arc::new(Map::new());
                    if retry_now {
                        ov.failure = None;
                        ov.urgent = true;
                    }
                    if ov.shutdown {
                        self.done.notify_all();
                        return;
                    }
                }
            }
            self.done.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::{MemStore, MetaRead};
    use proptest::prelude::*;

    #[test]
    fn reads_see_pending_and_commit_lands() {
        let engine = Arc::new(MemStore::new());
        let store = Store::new(engine.clone(), Duration::from_millis(5), None);
        let seq = store.apply(vec![(b"a".to_vec(), Some(b"1".to_vec()))]);
        assert_eq!(store.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
        store.wait_durable(seq).unwrap();
        assert_eq!(engine.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
        store.apply(vec![(b"a".to_vec(), None)]);
        assert_eq!(store.get(b"a").unwrap(), None);
        store.close().unwrap();
        assert_eq!(engine.get(b"a").unwrap(), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// A merged scan equals a scan of the model, whatever mix of keys is
        /// committed and pending, for any page size.
        #[test]
        fn merged_scan_matches_model(
            committed in proptest::collection::btree_map(0u16..200, any::<u8>(), 0..80),
            pending in proptest::collection::btree_map(0u16..200, proptest::option::of(any::<u8>()), 0..80),
            limit in 1usize..20,
        ) {
            let engine = Arc::new(MemStore::new());
            let key = |k: u16| k.to_be_bytes().to_vec();
            let batch: Vec<Write> = committed.iter().map(|(k, v)| (key(*k), Some(vec![*v]))).collect();
            engine.commit(&batch).unwrap();
            // A long interval keeps the pending batch in memory.
            let store = Store::new(engine, Duration::from_secs(3600), None);
            store.apply(pending.iter().map(|(k, v)| (key(*k), v.map(|v| vec![v]))).collect());
            let mut model: BTreeMap<Vec<u8>, Vec<u8>> = committed.iter().map(|(k, v)| (key(*k), vec![*v])).collect();
            for (k, v) in &pending {
                match v { Some(v) => { model.insert(key(*k), vec![*v]); } None => { model.remove(&key(*k)); } }
            }
            // Page through everything.
            let mut got = Vec::new();
            let mut cursor = vec![0u8, 0];
            loop {
                let page = store.scan(&cursor, &[0xff, 0xff, 0xff], limit).unwrap();
                prop_assert!(page.len() <= limit);
                let done = page.len() < limit;
                if let Some((k, _)) = page.last() { cursor = k.clone(); cursor.push(0); }
                got.extend(page);
                if done { break; }
            }
            let want: Vec<_> = model.into_iter().collect();
            prop_assert_eq!(got, want);
            store.close().unwrap();
        }
    }
}
