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
//! On engines whose commits can be visible before they are durable
//! (PostgreSQL: [`MetaStore::commit_iter_visible`]) a batch nobody waits
//! on to be durable is committed visible only: `landed_seq` moves, and
//! `durable_seq` follows when someone waits for it ([`Store::wait_durable`]),
//! a batch frees files, or [`DURABLE_LAG`] has passed — by a durable commit
//! of the next batch when someone waits for it, else by the syncer thread's
//! [`MetaStore::make_durable`] beside the committer. A close waits only for
//! visibility ([`Store::wait_landed`]), never behind a flush of the
//! engine's log (made on the committer's way, it held every close queued
//! behind it for the server's fsync: several milliseconds on a busy disk).
//!
//! - records an operation changed in the core's cache without writing them
//!   (directory statistics: see `stats`) are *deferred*, and a batch is
//!   never taken without the deferred records of the operations in it: the
//!   committer asks for them ([`Store::flush_wanted`]) and the operation
//!   running then hands them over as it ends ([`Store::apply_deferred`]);
//!   if none runs, the committer takes them itself under the core's lock
//!   ([`Store::set_flusher`]). Whoever waits for the committer while
//!   holding that lock hands them over first.
//!
//! Reads consult pending, then committing, then the engine, and always in
//! that order (overlay before engine): a commit that finishes between the two
//! steps only moves a value from the overlay into the engine, never out of
//! sight.
//!
//! Space: a change is acknowledged only while the engine holds the disk
//! space its commit may need ([`MetaStore::hold`]), so that a disk filled by
//! anyone else cannot make an acknowledged batch uncommittable. Each
//! operation that changes metadata is first admitted ([`Store::admit`]),
//! which promises it the most one operation can need; what is pending and
//! committing is counted at its worst case ([`MetaStore::write_bound`]).
//! When the promise does not fit what is held, admission asks the engine to
//! hold more; if the disk cannot give it, it waits for the batches under way
//! to commit (the bound is a worst case: commits usually need far less) and
//! then refuses the change with ENOSPC. Removals may use the last
//! [`REMOVAL_OPS`] operations' worth, which changes may not, so that space
//! can always be freed. The committer tops the hold up after each commit,
//! off the request path.
//!
//! Volumes several daemons serve (`meta::Shared`): an operation that
//! changes metadata first takes the volume's write lease ([`Store::lease`];
//! admission does), which brings this daemon's caches up to date with
//! every other daemon's commits ([`Store::on_changes`]) before it reads
//! anything it decides on. The lease stays while operations run under it
//! or their writes wait to be committed — so group commit works as on one
//! machine — and goes back once they are committed and nothing else runs,
//! or after [`LEASE_TURN`] of holding it if another daemon waits for it,
//! so that daemons take turns. A
//! commit under a lease that was lost meanwhile (its connection cut, and
//! another daemon committed) is refused by the engine: the batch is
//! dropped as a crash would drop it, what waited for it fails with EIO,
//! and every cache is dropped.
//!
//! Failure contract: if a commit fails anyway (an I/O error, a filesystem
//! that does not honour preallocation), the batch stays pending and is
//! retried until it commits; meanwhile every new change is refused (ENOSPC
//! or EIO), `fsync` fails, the log says so at error level and
//! [`Store::health`] reports how many changes wait. [`Store::close`] does
//! not return while changes wait, unless told to give up ([`Store::abandon`]).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::error::{CoreError, Result};
use crate::meta::{Changes, Followed, FollowedWith, MetaError, MetaStore, Write};

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
/// How long the committer waits for the operation under way to hand over
/// deferred records before it takes them under the core's lock itself.
const FLUSH_WAIT: Duration = Duration::from_millis(1);
/// Removals may use the space of this many operations that changes may not.
pub const REMOVAL_OPS: u64 = 2;
/// The longest an admission waits for batches under way to free its way.
const ADMIT_WAIT: Duration = Duration::from_secs(2);
/// Longest key safs writes (a prefix, an inode number and a 255-byte name).
const KEY_MAX: usize = 512;
/// How long metadata may be visible to every node and not yet durable (on
/// engines where commits can be: PostgreSQL), before the committer makes
/// it durable unasked: what a crash of the engine's server can lose of
/// changes nobody synced — as an embedded volume's commit interval.
const DURABLE_LAG: Duration = Duration::from_millis(50);
/// How long a daemon keeps the write lease of a shared volume while it
/// stays busy, before it lets the next daemon have a turn.
pub const LEASE_TURN: Duration = Duration::from_millis(100);
/// How long a daemon keeps the lease once idle, for its own next change:
/// a sequential writer (`cp -r`, a checkout) pauses between its changes
/// while its close waits for a commit, and giving the lease back in each
/// pause costs its next change the round trips of taking it again (T13
/// checkout on an object-store volume with `-o async_commit`: 1,202 →
/// 1,092 µs per entry). Another daemon's change waits this much longer at
/// most.
const LEASE_LINGER: Duration = Duration::from_millis(10);

/// The write lease of a shared volume, as this daemon holds it.
#[derive(Default)]
struct Lease {
    held: bool,
    /// Being taken or given back: others wait.
    moving: bool,
    /// Held for its turn: no new operation starts under it, and it goes
    /// back once what ran under it is committed.
    draining: bool,
    since: Option<Instant>,
    /// Operations running under it (their guards are alive).
    running: u32,
    /// The newest epoch this daemon's caches reflect.
    seen: u64,
    /// A batch was dropped (its lease lost): the caches hold changes that
    /// never landed, and must all go before anything is served from them
    /// again (at the next lease, or the next doorbell, whichever first).
    reset: bool,
}

/// What a caller holds while an operation runs under the write lease.
#[must_use]
pub struct LeaseGuard<'a> {
    store: Option<&'a Store>,
}

impl Drop for LeaseGuard<'_> {
    fn drop(&mut self) {
        if let Some(store) = self.store {
            store.lease.lock().running -= 1;
            store.maybe_release();
        }
    }
}

/// What the core does with other daemons' changes: drops what it caches of
/// the keys (all of it when `keys` is `None`), then tells the kernel.
pub type OnChanges = Box<dyn Fn(&Changes) + Send + Sync>;

/// How much space the store keeps held ahead of its commits.
#[derive(Clone, Copy, Debug)]
pub struct HoldPolicy {
    /// Held after each commit when the disk allows (the committer tops up
    /// to it); admission asks for more when it needs more.
    pub target: u64,
    /// The volume's inline xattr budget: an inode record's largest size.
    pub inline_budget: usize,
}

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
    /// `committing` is in the engine; the committer is deleting the files
    /// it freed before it counts as durable.
    landed: bool,
    /// Every operation with a sequence number ≤ this is in the engine:
    /// every reader, here or on another node, sees it.
    landed_seq: u64,
    /// Every operation with a sequence number ≤ this is durable (on
    /// engines whose commits may be visible first, at most `landed_seq`).
    durable_seq: u64,
    /// The newest operation someone waits to be durable.
    durable_wanted: u64,
    /// The committer has stopped: so does the syncer.
    committer_done: bool,
    /// Since when `landed_seq` has been ahead of `durable_seq`.
    ahead_since: Option<Instant>,
    /// The last try to make what landed durable failed (cleared by the
    /// next success): it is tried again.
    durable_failed: bool,
    /// Tries that failed so far: a waiter fails if one made after it
    /// began waiting did.
    durable_fails: u64,
    /// Someone is waiting for durability: commit now.
    urgent: bool,
    /// The last commit failed; cleared by the next success.
    failure: Option<Failure>,
    /// When commits started failing, and what the last error said.
    failing_since: Option<Instant>,
    failure_logged: Option<Instant>,
    last_error: String,
    shutdown: bool,
    /// Worst-case bytes committing `pending` may allocate: the sum of
    /// [`MetaStore::write_bound`] over its writes.
    pending_need: u64,
    /// The same for `committing`.
    committing_need: u64,
    /// Bytes promised to admitted operations not yet applied.
    promised: u64,
    /// What the engine held when last asked, under this lock (so that a
    /// commit finishing meanwhile is never counted twice in its favour).
    held: u64,
    /// Operations (sequence numbers, inclusive) dropped with a batch whose
    /// write lease was lost: waiting for them fails.
    lost: Option<(u64, u64)>,
    /// An operation in `pending` deferred records not yet handed over:
    /// the batch may not be taken without them.
    unflushed: bool,
}

impl Overlay {
    /// Operations `from..=to` were lost: waiting for them fails. Joined to
    /// the range already lost where they meet (the committer and the
    /// syncer may each find a loss of the same crash).
    fn mark_lost(&mut self, from: u64, to: u64) {
        self.lost = Some(match self.lost {
            Some((a, b)) if from <= b.saturating_add(1) && a <= to.saturating_add(1) => {
                (a.min(from), b.max(to))
            }
            _ => (from, to),
        });
    }

    /// Worst-case bytes everything accepted so far may still allocate.
    fn need(&self, batch_bound: u64) -> u64 {
        let writes = self.pending_need + self.committing_need;
        writes + writes / 512 + 2 * batch_bound + self.promised
    }

    /// The pending batch is large enough to commit without waiting.
    fn due_by_size(&self) -> bool {
        self.pending_bytes > EAGER_BYTES || self.pending_need > self.held / 4
    }
}

/// What [`Store::admit`] is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// A change that may take space (create, set, rename, write...).
    Change,
    /// A removal: it frees space, and may use what changes may not.
    Removal,
}

/// An admitted operation's promise of space; released on drop, by which
/// time the operation has applied its writes (or given up).
#[must_use]
pub struct Ticket<'a> {
    store: &'a Store,
    bytes: u64,
    _lease: LeaseGuard<'a>,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let mut ov = self.store.overlay.lock();
        debug_assert!(ov.promised >= self.bytes, "space promised twice");
        ov.promised -= self.bytes.min(ov.promised);
    }
}

/// A durable commit asked for by [`Store::start_sync`], to wait for.
#[derive(Clone, Copy, Debug)]
pub struct Started {
    seq: u64,
    /// Durable flushes failed before it was asked for (a later failure
    /// fails the wait).
    fails: u64,
}

/// What the store is doing, for `safs info`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Health {
    /// Set while commits fail: `"no space"` or `"I/O error"`, and the error.
    pub failure: Option<String>,
    /// Seconds since commits started failing.
    pub failing_for_s: u64,
    /// Changes (records) accepted and not yet durable.
    pub waiting_records: u64,
    /// Disk space the engine holds ahead of its commits, bytes.
    pub held_bytes: u64,
    /// Worst case of what is accepted and not yet committed, bytes.
    pub need_bytes: u64,
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
    /// Signalled when work arrives for the syncer.
    syncing: Condvar,
    interval: Duration,
    committer: Mutex<Option<JoinHandle<()>>>,
    /// Makes visible commits durable (engines whose commits can be
    /// visible first).
    syncer: Mutex<Option<JoinHandle<()>>>,
    /// `None` on read-only mounts (nothing to hold).
    hold: Option<HoldPolicy>,
    /// [`Store::close`] gives up on changes it cannot commit.
    abandon: AtomicBool,
    /// Shared volumes: the write lease (lock order: before `overlay`).
    lease: Mutex<Lease>,
    lease_moved: Condvar,
    /// Times the lease was taken, and time operations waited for it (ns).
    lease_takes: std::sync::atomic::AtomicU64,
    lease_wait_ns: std::sync::atomic::AtomicU64,
    /// When the lease was last found idle (ns since `born`, 0: not
    /// lingering): the committer gives it back [`LEASE_LINGER`] later.
    linger_since: std::sync::atomic::AtomicU64,
    born: Instant,
    on_changes: std::sync::OnceLock<OnChanges>,
    /// The operation under way deferred records (see the module comment):
    /// its `apply` moves this into `Overlay::unflushed`. Set and cleared
    /// only under the core's state lock.
    deferred: AtomicBool,
    /// The committer waits for deferred records: operations hand them
    /// over as they end.
    flush_wanted: AtomicBool,
    /// Batches nobody waits on to be durable are committed visible only,
    /// on engines that can (see [`Store::set_async_commit`]).
    async_commit: AtomicBool,
    /// Takes the deferred records under the core's lock and runs the
    /// given step (taking the batch) before letting go; false if the lock
    /// was not had in time.
    flusher: std::sync::OnceLock<Flusher>,
}

/// See [`Store::set_flusher`].
pub type Flusher = Box<dyn Fn(&mut dyn FnMut(Vec<Write>)) -> bool + Send + Sync>;

/// How a shared volume's write lease has gone since the mount.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseFigures {
    /// Times this daemon took the lease (each catches up with the others).
    pub takes: u64,
    /// Time operations waited for it, summed: while another daemon held
    /// it, or while this one took it.
    pub wait_ns: u64,
}

impl From<Failure> for CoreError {
    fn from(f: Failure) -> CoreError {
        match f {
            Failure::NoSpace => CoreError::NoSpace,
            Failure::Io => CoreError::Io(std::io::Error::from_raw_os_error(libc::EIO)),
        }
    }
}

impl Store {
    pub fn new(
        engine: Arc<dyn MetaStore>,
        interval: Duration,
        hold: Option<HoldPolicy>,
    ) -> Arc<Self> {
        if let Some(h) = hold {
            if let Err(e) = engine.hold(h.target) {
                tracing::warn!(error = %e, bytes = h.target, "cannot hold space for metadata commits ahead (disk full?); changes will be refused until space is freed");
            }
        }
        let held = engine.held();
        let store = Arc::new(Store {
            engine,
            overlay: Mutex::new(Overlay {
                pending: Map::new(),
                pending_unlinks: Vec::new(),
                pending_bytes: 0,
                pending_since: None,
                applied_seq: 0,
                committing: Arc::new(Map::new()),
                landed: false,
                landed_seq: 0,
                durable_seq: 0,
                durable_wanted: 0,
                committer_done: false,
                ahead_since: None,
                durable_failed: false,
                durable_fails: 0,
                urgent: false,
                failure: None,
                failing_since: None,
                failure_logged: None,
                last_error: String::new(),
                shutdown: false,
                pending_need: 0,
                committing_need: 0,
                promised: 0,
                held,
                lost: None,
                unflushed: false,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
            syncing: Condvar::new(),
            interval,
            committer: Mutex::new(None),
            syncer: Mutex::new(None),
            hold,
            abandon: AtomicBool::new(false),
            lease: Mutex::new(Lease::default()),
            lease_moved: Condvar::new(),
            lease_takes: std::sync::atomic::AtomicU64::new(0),
            lease_wait_ns: std::sync::atomic::AtomicU64::new(0),
            linger_since: std::sync::atomic::AtomicU64::new(0),
            async_commit: AtomicBool::new(false),
            born: Instant::now(),
            on_changes: std::sync::OnceLock::new(),
            deferred: AtomicBool::new(false),
            flush_wanted: AtomicBool::new(false),
            flusher: std::sync::OnceLock::new(),
        });
        let s = Arc::clone(&store);
        let handle = std::thread::Builder::new()
            .name("safs-commit".into())
            .spawn(move || s.commit_loop())
            .expect("spawn committer thread");
        *store.committer.lock() = Some(handle);
        if store.engine.visible_before_durable() {
            let s = Arc::clone(&store);
            let handle = std::thread::Builder::new()
                .name("safs-sync".into())
                .spawn(move || s.sync_loop())
                .expect("spawn syncer thread");
            *store.syncer.lock() = Some(handle);
        }
        store
    }

    pub fn engine_counters(&self) -> crate::meta::EngineCounters {
        self.engine.counters()
    }

    /// The write lease's figures; `None` on volumes one daemon serves.
    pub fn lease_figures(&self) -> Option<LeaseFigures> {
        use std::sync::atomic::Ordering::Relaxed;
        self.engine.shared()?;
        Some(LeaseFigures {
            takes: self.lease_takes.load(Relaxed),
            wait_ns: self.lease_wait_ns.load(Relaxed),
        })
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

    /// Point reads of `keys` through the overlay, the engine's in one call
    /// (one read transaction, or one round trip).
    pub fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        let mut out: Vec<Option<Option<Vec<u8>>>> = Vec::with_capacity(keys.len());
        let mut ask = Vec::new();
        {
            let ov = self.overlay.lock();
            for k in keys {
                let v = ov.pending.get(k).or_else(|| ov.committing.get(k));
                if v.is_none() {
                    ask.push(k.clone());
                }
                out.push(v.cloned());
            }
        }
        let mut read = if ask.is_empty() {
            Vec::new()
        } else {
            self.engine.get_many(&ask)?
        }
        .into_iter();
        Ok(out
            .into_iter()
            .map(|v| match v {
                Some(v) => v,
                None => read.next().flatten(),
            })
            .collect())
    }

    /// Whether every engine read is a round trip (PostgreSQL): then a
    /// read of many records in one call is worth what it costs.
    pub fn reads_are_round_trips(&self) -> bool {
        self.engine.follows_in_one_read()
    }

    /// [`MetaRead::get_and_follow`] through the overlay: one engine call
    /// (one round trip on PostgreSQL) when neither record is waiting in it.
    /// On engines where following costs a second read (LMDB) only `key` is
    /// read: the pointee comes back `None`, for the caller to read if it
    /// needs it.
    pub fn get_and_follow(&self, key: &[u8], at: usize, prefix: u8) -> Result<Followed> {
        if !self.engine.follows_in_one_read() {
            return Ok(self.get(key)?.map(|v| (v, None)));
        }
        let Some(since) = self.durable_unless_waiting(key) else {
            // The entry is waiting to be committed: read each in turn.
            let Some(value) = self.get(key)? else {
                return Ok(None);
            };
            let pointee = match crate::meta::pointer_key(&value, at, prefix) {
                Some(k) => self.get(&k)?,
                None => None,
            };
            return Ok(Some((value, pointee)));
        };
        let Some((value, pointee)) = self.engine.get_and_follow(key, at, prefix)? else {
            return Ok(None);
        };
        let (pointee, _) = self.settle_followed(&value, pointee, since, at, prefix, None)?;
        Ok(Some((value, pointee)))
    }

    /// [`Store::get_and_follow`] and, in the same engine call, the
    /// pointee's companion records (see [`MetaRead::get_follow_and_range`]).
    /// The range comes back only if the engine read it and nothing in the
    /// overlay touches it or landed meanwhile: `None` means the caller
    /// reads it itself, if it needs it.
    pub fn get_follow_and_range(
        &self,
        key: &[u8],
        at: usize,
        prefix: u8,
        companion: u8,
    ) -> Result<FollowedWith> {
        if !self.engine.follows_in_one_read() {
            return Ok(self.get(key)?.map(|v| (v, None, None)));
        }
        let Some(since) = self.durable_unless_waiting(key) else {
            return Ok(self
                .get_and_follow(key, at, prefix)?
                .map(|(v, p)| (v, p, None)));
        };
        let Some((value, pointee, range)) = self
            .engine
            .get_follow_and_range(key, at, prefix, companion)?
        else {
            return Ok(None);
        };
        let (pointee, range_holds) =
            self.settle_followed(&value, pointee, since, at, prefix, Some(companion))?;
        Ok(Some((value, pointee, range.filter(|_| range_holds))))
    }

    /// [`MetaRead::scan_and_follow`] through the overlay: one engine call
    /// (one round trip on PostgreSQL) when nothing in the range waits in
    /// the overlay; otherwise a merged [`Store::scan`] and the pointees in
    /// one [`Store::get_many`].
    ///
    /// With `descend`, [`MetaRead::scan_tree_and_follow`]: one engine call
    /// when nothing in any range it may go down to waits in the overlay
    /// either; otherwise the first range alone, as above.
    pub fn scan_tree_and_follow(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        at: usize,
        prefix: u8,
        descend: Option<crate::meta::Descend>,
    ) -> Result<Vec<crate::meta::ScannedFollowed>> {
        let since = {
            let ov = self.overlay.lock();
            let waits = |lo: &[u8], hi: &[u8]| {
                let range = (Bound::Included(lo.to_vec()), Bound::Excluded(hi.to_vec()));
                ov.pending.range(range.clone()).next().is_some()
                    || ov.committing.range(range).next().is_some()
            };
            let waiting =
                waits(start, end) || descend.is_some_and(|d| waits(&[d.prefix], &[d.prefix + 1]));
            (!waiting && self.engine.follows_in_one_read()).then_some(ov.landed_seq)
        };
        let Some(since) = since else {
            let pairs = self.scan(start, end, limit)?;
            return crate::meta::with_pointees(pairs, at, prefix, |keys| self.get_many(keys));
        };
        let mut rows = match descend {
            Some(d) => self
                .engine
                .scan_tree_and_follow(start, end, limit, at, prefix, d)?,
            None => self.engine.scan_and_follow(start, end, limit, at, prefix)?,
        };
        // Square the pointees with the overlay, as `settle_followed` does
        // for one: a waiting one wins; if a commit landed meanwhile, what
        // the engine said of the others may be older: read again.
        let mut again = Vec::new();
        {
            let ov = self.overlay.lock();
            let moved = ov.landed_seq != since;
            for (i, (_, v, p)) in rows.iter_mut().enumerate() {
                let Some(k) = crate::meta::pointer_key(v, at, prefix) else {
                    *p = None;
                    continue;
                };
                if let Some(w) = ov.pending.get(&k[..]).or_else(|| ov.committing.get(&k[..])) {
                    *p = w.clone();
                } else if moved {
                    again.push((i, k.to_vec()));
                }
            }
        }
        if !again.is_empty() {
            let keys: Vec<Vec<u8>> = again.iter().map(|(_, k)| k.clone()).collect();
            for ((i, _), p) in again.iter().zip(self.get_many(&keys)?) {
                rows[*i].2 = p;
            }
        }
        Ok(rows)
    }

    /// The landed sequence number now, unless `key` waits in the overlay
    /// (then the engine's value of it is not the current one).
    fn durable_unless_waiting(&self, key: &[u8]) -> Option<u64> {
        let ov = self.overlay.lock();
        let waiting = ov.pending.contains_key(key) || ov.committing.contains_key(key);
        (!waiting).then_some(ov.landed_seq)
    }

    /// Squares what the engine said of `value`'s pointee (read when
    /// `since` was the landed sequence number) with the overlay: a newer
    /// pointee waiting wins, and a commit landed meanwhile means what the
    /// engine said may be older than it: asked again. With `companion`,
    /// also whether the engine's read of the pointee's companion range
    /// still holds (nothing of it waits, nothing landed since).
    fn settle_followed(
        &self,
        value: &[u8],
        pointee: Option<Vec<u8>>,
        since: u64,
        at: usize,
        prefix: u8,
        companion: Option<u8>,
    ) -> Result<(Option<Vec<u8>>, bool)> {
        let Some(k) = crate::meta::pointer_key(value, at, prefix) else {
            return Ok((None, false));
        };
        let ov = self.overlay.lock();
        let moved = ov.landed_seq != since;
        let range_holds = companion.is_some_and(|c| {
            let (lo, hi) = crate::meta::companion_range(&k, c);
            !moved
                && ov.pending.range(lo.clone()..hi.clone()).next().is_none()
                && ov.committing.range(lo..hi).next().is_none()
        });
        if let Some(v) = ov.pending.get(&k[..]).or_else(|| ov.committing.get(&k[..])) {
            return Ok((v.clone(), range_holds));
        }
        drop(ov);
        let pointee = if moved { self.get(&k)? } else { pointee };
        Ok((pointee, range_holds))
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
        self.apply_with(writes, None)
    }

    /// [`Store::apply`], then deletes `unlink` once those writes are durable.
    pub fn apply_then_unlink(&self, writes: Vec<Write>, unlink: Option<PathBuf>) -> u64 {
        self.apply_with(writes, unlink)
    }

    /// The path goes into the pending state under the same hold of the
    /// overlay lock as the writes: the committer takes both at once, so the
    /// file goes with the batch that frees it. (Pushed after letting go, it
    /// could miss that batch and wait for a next one that a full disk never
    /// brings: CI saw a freed file keep its space.)
    fn apply_with(&self, writes: Vec<Write>, unlink: Option<PathBuf>) -> u64 {
        if self.engine.shared().is_some() && !writes.is_empty() && !self.lease.lock().held {
            // A path that changes metadata without taking the lease: a bug.
            // Its batch will be refused (`MetaError::LeaseLost`), not applied.
            tracing::error!("INTERNAL ERROR: a change applied without the write lease");
            debug_assert!(false, "a change applied without the write lease");
        }
        let mut ov = self.overlay.lock();
        if self.deferred.swap(false, Ordering::SeqCst) {
            ov.unflushed = true;
        }
        if writes.is_empty() {
            if let Some(path) = unlink {
                // No writes of its own: it waits for what is applied
                // already, which the committer makes durable first.
                ov.pending_unlinks.push(path);
                self.work.notify_one();
            }
            // Nothing to make durable: the newest sequence number covers it.
            return ov.applied_seq;
        }
        // Not while records are deferred: the committer cannot take them
        // while the caller holds the core's lock, as callers of `apply` do.
        while ov.pending_bytes > MAX_PENDING_BYTES && !ov.shutdown && !ov.unflushed {
            ov.urgent = true;
            self.work.notify_one();
            self.done.wait_for(&mut ov, Duration::from_millis(50));
        }
        self.insert(&mut ov, writes);
        ov.pending_unlinks.extend(unlink);
        ov.applied_seq += 1;
        if ov.pending_since.is_none() {
            ov.pending_since = Some(Instant::now());
            self.work.notify_one();
        } else if ov.due_by_size() {
            self.work.notify_one();
        }
        ov.applied_seq
    }

    /// Puts `writes` into the pending batch, replacing older writes of
    /// their keys.
    fn insert(&self, ov: &mut Overlay, writes: Vec<Write>) {
        for (k, v) in writes {
            ov.pending_bytes += k.len() + v.as_ref().map_or(0, Vec::len);
            let bound = self.engine.write_bound(k.len(), v.as_ref().map(Vec::len));
            let key_len = k.len();
            if let Some(old) = ov.pending.insert(k, v) {
                let old = self.engine.write_bound(key_len, old.as_ref().map(Vec::len));
                ov.pending_need -= old.min(ov.pending_need);
            }
            ov.pending_need += bound;
        }
    }

    /// Sets how the committer takes deferred records (once, before
    /// serving): `f` runs its argument with the records, under the core's
    /// lock, or returns false if that lock was not had in time.
    pub fn set_flusher(&self, f: Flusher) {
        let _ = self.flusher.set(f);
    }

    /// An operation left deferred records in the core's cache (call under
    /// the core's lock, before applying its writes).
    pub fn note_deferred(&self) {
        self.deferred.store(true, Ordering::SeqCst);
    }

    /// Hands over every deferred record (call under the core's lock, with
    /// all of them): they belong to operations applied already, so they
    /// take no sequence number of their own.
    pub fn apply_deferred(&self, writes: Vec<Write>) {
        let mut ov = self.overlay.lock();
        if !writes.is_empty() {
            self.insert(&mut ov, writes);
            ov.pending_since.get_or_insert_with(Instant::now);
        }
        self.deferred.store(false, Ordering::SeqCst);
        if std::mem::take(&mut ov.unflushed) || self.flush_wanted.load(Ordering::Relaxed) {
            self.work.notify_one();
        }
    }

    /// The committer waits for deferred records: an operation ending now
    /// hands them over ([`Store::apply_deferred`]).
    pub fn flush_wanted(&self) -> bool {
        self.flush_wanted.load(Ordering::Relaxed)
    }

    /// The most one operation's writes can need (see [`Admit`]): a dozen
    /// records of an inode's size and two 64 KiB xattr values.
    fn op_bound(&self, h: &HoldPolicy) -> u64 {
        12 * self
            .engine
            .write_bound(KEY_MAX, Some(h.inline_budget + 1024))
            + 2 * self.engine.write_bound(KEY_MAX, Some(65_536 + 256))
    }

    /// Admits one operation that will change metadata: refused while
    /// commits fail, and unless the space its commit may need is held (see
    /// the module comment). Hold the ticket until the operation's writes
    /// are applied.
    pub fn admit(&self, kind: Admit) -> Result<Ticket<'_>> {
        let lease = self.lease()?;
        let Some(h) = self.hold else {
            return Ok(Ticket {
                store: self,
                bytes: 0,
                _lease: lease,
            });
        };
        let op = self.op_bound(&h);
        let floor = match kind {
            Admit::Change => REMOVAL_OPS * op,
            Admit::Removal => 0,
        };
        let batch = self.engine.batch_bound();
        let deadline = Instant::now() + ADMIT_WAIT;
        let mut ov = self.overlay.lock();
        loop {
            if let Some(f) = ov.failure {
                return Err(f.into());
            }
            let want = ov.need(batch) + op + floor;
            if want <= ov.held {
                ov.promised += op;
                return Ok(Ticket {
                    store: self,
                    bytes: op,
                    _lease: lease,
                });
            }
            // Ask for more, without the overlay lock (fallocate takes time);
            // what is held is read again under it.
            drop(ov);
            let grown = self.engine.hold(want.max(h.target));
            ov = self.overlay.lock();
            ov.held = self.engine.held();
            if grown.is_ok() {
                continue;
            }
            // The disk has no more to give. Batches under way are counted at
            // their worst case; once committed they usually free most of it.
            let under_way = !ov.pending.is_empty() || !ov.committing.is_empty();
            if under_way && Instant::now() < deadline {
                ov.urgent = true;
                self.work.notify_one();
                self.done.wait_for(&mut ov, Duration::from_millis(50));
                continue;
            }
            if ov.need(batch) + op + floor > ov.held {
                tracing::debug!(
                    held = ov.held,
                    need = ov.need(batch),
                    "change refused: not enough space held for its commit"
                );
                return Err(CoreError::NoSpace);
            }
        }
    }

    /// The engine under the overlay.
    pub fn engine(&self) -> &dyn MetaStore {
        self.engine.as_ref()
    }

    /// Whether the volume is shared with other daemons.
    pub fn is_shared(&self) -> bool {
        self.engine.shared().is_some()
    }

    /// Sets what to do with other daemons' changes (once, before serving).
    pub fn on_changes(&self, f: OnChanges) {
        let _ = self.on_changes.set(f);
    }

    fn changed(&self, ch: &Changes) {
        if let Some(f) = self.on_changes.get() {
            f(ch);
        }
    }

    /// Runs the caller's operation under the write lease of a shared
    /// volume, taking it (and catching up with other daemons' commits)
    /// first if this daemon does not hold it; on other volumes, nothing.
    /// Call it before reading anything the change depends on, and without
    /// the core's state lock (catching up takes it).
    pub fn lease(&self) -> Result<LeaseGuard<'_>> {
        let Some(shared) = self.engine.shared() else {
            return Ok(LeaseGuard { store: None });
        };
        let mut l = self.lease.lock();
        // Set once this call had to wait for the lease or take it.
        let mut waited: Option<Instant> = None;
        loop {
            if l.held && !l.draining {
                if l.since.is_some_and(|t| t.elapsed() >= LEASE_TURN) && !shared.lease_wanted() {
                    // Nobody waits for it: another turn, with no drain (a
                    // daemon alone on its volume pays no hand-over).
                    l.since = Some(Instant::now());
                }
                if l.since.is_some_and(|t| t.elapsed() >= LEASE_TURN) {
                    // Its turn is over: commit what ran, then give it back.
                    l.draining = true;
                    let mut ov = self.overlay.lock();
                    ov.urgent = true;
                    self.work.notify_one();
                    drop(ov);
                    drop(l);
                    self.maybe_release();
                    l = self.lease.lock();
                    continue;
                }
                l.running += 1;
                // Busy again: the linger starts afresh when it is idle.
                self.linger_since.store(0, Ordering::Relaxed);
                if let Some(t) = waited {
                    let ns = t.elapsed().as_nanos() as u64;
                    self.lease_wait_ns
                        .fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
                }
                return Ok(LeaseGuard { store: Some(self) });
            }
            waited.get_or_insert_with(Instant::now);
            if l.held || l.moving {
                self.lease_moved.wait(&mut l);
                continue;
            }
            l.moving = true;
            let (seen, reset) = (l.seen, std::mem::take(&mut l.reset));
            drop(l);
            let res = shared.lease(seen).map(|ch| {
                if reset {
                    self.changed(&Changes {
                        epoch: ch.epoch,
                        keys: None,
                    });
                } else {
                    self.changed(&ch);
                }
                ch.epoch
            });
            l = self.lease.lock();
            l.moving = false;
            self.lease_moved.notify_all();
            let epoch = match res {
                Ok(e) => e,
                Err(e) => {
                    // Still owed to the next taker.
                    l.reset |= reset;
                    return Err(e.into());
                }
            };
            l.held = true;
            l.since = Some(Instant::now());
            l.seen = l.seen.max(epoch);
            self.lease_takes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The doorbell rang: another daemon committed up to `epoch`. Catches
    /// up unless this daemon's caches already reflect it.
    pub fn rang(&self, epoch: u64) {
        let Some(shared) = self.engine.shared() else {
            return;
        };
        let seen = {
            let mut l = self.lease.lock();
            if l.reset && !l.moving {
                l.reset = false;
                drop(l);
                self.changed(&Changes { epoch, keys: None });
                l = self.lease.lock();
            }
            // Under the lease nobody else commits; the lease caught up.
            if l.seen >= epoch || l.held {
                return;
            }
            l.seen
        };
        match shared.changes(seen) {
            Ok(ch) => {
                self.changed(&ch);
                let mut l = self.lease.lock();
                l.seen = l.seen.max(ch.epoch);
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read other mounts' changes; retrying at the next doorbell")
            }
        }
    }

    /// Gives the lease back if nothing runs under it and everything that
    /// ran is committed, and it is draining or there is nothing left to do.
    fn maybe_release(&self) {
        self.release_if_idle(false);
    }

    /// Gives the lease back if nothing runs under it and nothing waits to
    /// be committed: at once when its turn is over (`draining`) or when
    /// `now`, else once it has stayed idle [`LEASE_LINGER`] (the committer
    /// calls again then).
    fn release_if_idle(&self, now: bool) {
        let Some(shared) = self.engine.shared() else {
            return;
        };
        let mut l = self.lease.lock();
        if !l.held {
            self.linger_since.store(0, Ordering::Relaxed);
            return;
        }
        if l.running > 0 {
            return;
        }
        {
            let ov = self.overlay.lock();
            if !ov.pending.is_empty() || !(ov.committing.is_empty() || ov.landed) {
                return;
            }
        }
        if !l.draining && !now {
            let at = self.linger_since.load(Ordering::Relaxed);
            let elapsed = self.born.elapsed().as_nanos() as u64;
            if at == 0 {
                self.linger_since.store(elapsed.max(1), Ordering::Relaxed);
                drop(l);
                self.work.notify_one();
                return;
            }
            if elapsed.saturating_sub(at) < LEASE_LINGER.as_nanos() as u64 {
                return;
            }
        }
        self.linger_since.store(0, Ordering::Relaxed);
        l.held = false;
        l.draining = false;
        l.moving = true;
        drop(l);
        let reached = shared.release();
        let mut l = self.lease.lock();
        l.seen = l.seen.max(reached);
        l.moving = false;
        self.lease_moved.notify_all();
    }

    /// Refuses new changes while commits fail (for paths that change data,
    /// not metadata).
    pub fn healthy(&self) -> Result<()> {
        match self.overlay.lock().failure {
            Some(f) => Err(f.into()),
            None => Ok(()),
        }
    }

    /// Commits waiting, failures, and the space held, for `safs info`.
    pub fn health(&self) -> Health {
        let ov = self.overlay.lock();
        Health {
            failure: ov.failure.map(|f| {
                let what = match f {
                    Failure::NoSpace => "no space",
                    Failure::Io => "I/O error",
                };
                format!("{what}: {}", ov.last_error)
            }),
            failing_for_s: ov.failing_since.map_or(0, |t| t.elapsed().as_secs()),
            waiting_records: (ov.pending.len() + ov.committing.len()) as u64,
            held_bytes: ov.held,
            need_bytes: ov.need(self.engine.batch_bound()),
        }
    }

    /// Makes [`Store::close`] give up on changes it cannot commit.
    pub fn abandon(&self) {
        self.abandon.store(true, Ordering::SeqCst);
        self.done.notify_all();
    }

    /// The sequence number of the newest applied operation.
    pub fn applied_seq(&self) -> u64 {
        self.overlay.lock().applied_seq
    }

    /// Blocks until every operation up to `seq` is durable.
    pub fn wait_durable(&self, seq: u64) -> Result<()> {
        self.wait_for(seq, true)
    }

    /// Blocks until every operation up to `seq` is in the engine, where
    /// every reader (on any node) sees it — not necessarily durable yet
    /// (see [`MetaStore::commit_iter_visible`]): what a close must wait
    /// for on a shared volume, not `fsync`.
    pub fn wait_landed(&self, seq: u64) -> Result<()> {
        self.wait_for(seq, false)
    }

    /// Asks for every operation applied so far to be made durable, and
    /// returns at once: the caller does other work (an fsync of the file
    /// beside it) while the committer commits, then waits with
    /// [`Store::wait_started`].
    pub fn start_sync(&self) -> Started {
        let mut ov = self.overlay.lock();
        let seq = ov.applied_seq;
        ov.durable_wanted = ov.durable_wanted.max(seq);
        let fails = ov.durable_fails;
        if ov.durable_seq < seq {
            ov.urgent = true;
            drop(ov);
            self.work.notify_one();
            self.syncing.notify_one();
        }
        Started { seq, fails }
    }

    /// Waits until what [`Store::start_sync`] asked for is durable.
    pub fn wait_started(&self, started: Started) -> Result<()> {
        let ov = self.overlay.lock();
        self.wait_in(ov, started.seq, true, started.fails)
    }

    fn wait_for(&self, seq: u64, durable: bool) -> Result<()> {
        let mut ov = self.overlay.lock();
        if durable {
            ov.durable_wanted = ov.durable_wanted.max(seq);
        }
        let fails = ov.durable_fails;
        self.wait_in(ov, seq, durable, fails)
    }

    /// [`Store::wait_for`] from the moment `fails` durable flushes had
    /// failed.
    fn wait_in(
        &self,
        mut ov: parking_lot::MutexGuard<'_, Overlay>,
        seq: u64,
        durable: bool,
        fails: u64,
    ) -> Result<()> {
        loop {
            if ov.lost.is_some_and(|(from, to)| (from..=to).contains(&seq)) {
                return Err(CoreError::Io(std::io::Error::from_raw_os_error(libc::EIO)));
            }
            let reached = if durable {
                ov.durable_seq
            } else {
                ov.landed_seq
            };
            if reached >= seq {
                break;
            }
            if let Some(f) = ov.failure {
                return Err(f.into());
            }
            if durable && ov.durable_fails > fails && ov.landed_seq >= seq {
                return Err(CoreError::Io(std::io::Error::from_raw_os_error(libc::EIO)));
            }
            ov.urgent = true;
            self.work.notify_one();
            if durable {
                self.syncing.notify_one();
            }
            self.done.wait_for(&mut ov, Duration::from_millis(100));
        }
        Ok(())
    }

    /// Commits nobody waits on to be durable are made visible only, and
    /// durable within [`DURABLE_LAG`] (`-o async_commit`; engines that can:
    /// PostgreSQL). Off by default: a crash of the engine's server then
    /// loses nothing acknowledged — the daemon keeps what it has not
    /// committed and commits it once the server is back — where with it on
    /// the server may lose up to that lag of changes nobody synced.
    pub fn set_async_commit(&self, on: bool) {
        self.async_commit.store(on, Ordering::Relaxed);
    }

    /// The sequence number every operation up to which is durable.
    pub fn durable_seq(&self) -> u64 {
        self.overlay.lock().durable_seq
    }

    /// The sequence number every operation up to which is in the engine.
    pub fn landed_seq(&self) -> u64 {
        self.overlay.lock().landed_seq
    }

    /// Makes everything applied so far durable.
    pub fn sync(&self) -> Result<()> {
        self.wait_started(self.start_sync())
    }

    /// Writes what is pending and stops the committer. While commits fail
    /// it keeps retrying, saying so in the log, until they succeed or
    /// [`Store::abandon`] is called; then the error is returned.
    pub fn close(&self) -> Result<()> {
        let mut said = None::<Instant>;
        let res = loop {
            match self.sync() {
                Ok(()) => break Ok(()),
                Err(e) => {
                    let waiting = self.health().waiting_records;
                    if self.abandon.load(Ordering::SeqCst) {
                        tracing::error!(error = %e, records = waiting, "final commit failed and was abandoned: these acknowledged changes are lost");
                        break Err(e);
                    }
                    if said.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                        tracing::error!(error = %e, records = waiting, "final commit failed; retrying until it succeeds (free space under the volume; signal the daemon again to give up and lose these changes)");
                        said = Some(Instant::now());
                    }
                    let mut ov = self.overlay.lock();
                    self.done.wait_for(&mut ov, Duration::from_millis(200));
                }
            }
        };
        self.overlay.lock().shutdown = true;
        self.work.notify_all();
        self.syncing.notify_all();
        if let Some(h) = self.committer.lock().take() {
            let _ = h.join();
        }
        self.overlay.lock().committer_done = true;
        self.syncing.notify_all();
        if let Some(h) = self.syncer.lock().take() {
            let _ = h.join();
        }
        res
    }

    /// Whether the next batch must be durable when its commit returns:
    /// always on engines whose commits are durable anyway; else when
    /// someone waits for durability, when it frees files (deleting them
    /// before their inodes' end is durable could lose data) and at
    /// unmount. What landed visible only is the syncer's ([`Store::sync_due`]).
    fn durable_due(&self, ov: &Overlay, unlinks: bool) -> bool {
        !(self.async_commit.load(Ordering::Relaxed) && self.engine.visible_before_durable())
            || unlinks
            || ov.shutdown
            || ov.durable_wanted > ov.durable_seq
    }

    /// Whether the syncer makes what landed durable now: someone waits
    /// for it (and the committer has nothing of theirs to commit), files
    /// freed with no writes of their own wait for it, at unmount, after a
    /// failed try, and once it has waited [`DURABLE_LAG`].
    fn sync_due(&self, ov: &Overlay) -> bool {
        ov.durable_seq < ov.landed_seq
            && ((ov.durable_wanted > ov.durable_seq && ov.durable_wanted <= ov.landed_seq)
                || (!ov.pending_unlinks.is_empty() && ov.pending.is_empty())
                || ov.shutdown
                || ov.durable_failed
                || ov.ahead_since.is_some_and(|t| t.elapsed() >= DURABLE_LAG))
    }

    /// The syncer: makes visible commits durable beside the committer,
    /// which goes on committing meanwhile. (A flush covers what landed
    /// before it began: the engine's log is flushed up to a commit made
    /// after those.)
    fn sync_loop(&self) {
        let mut ov = self.overlay.lock();
        loop {
            if ov.committer_done {
                return;
            }
            if self.sync_due(&ov) {
                ov = self.make_durable(ov);
                // The committer may wait for it (freed files, unmount).
                self.work.notify_one();
                continue;
            }
            match ov.ahead_since {
                Some(t) if ov.durable_seq < ov.landed_seq => {
                    let wait = DURABLE_LAG.saturating_sub(t.elapsed());
                    self.syncing.wait_for(&mut ov, wait);
                }
                _ => self.syncing.wait(&mut ov),
            }
        }
    }

    /// Takes the pending batch for committing: (writes, files to delete
    /// once durable, the sequence number it makes durable).
    fn take(&self, ov: &mut Overlay) -> (Arc<Map>, Vec<PathBuf>, u64) {
        let batch = Arc::new(std::mem::take(&mut ov.pending));
        let unlinks = std::mem::take(&mut ov.pending_unlinks);
        ov.committing = Arc::clone(&batch);
        ov.landed = false;
        ov.committing_need = std::mem::take(&mut ov.pending_need);
        ov.pending_bytes = 0;
        ov.pending_since = None;
        ov.urgent = false;
        (batch, unlinks, ov.applied_seq)
    }

    fn commit_loop(&self) {
        let mut ov = self.overlay.lock();
        let mut ready = None;
        loop {
            // Wait for a batch that is due.
            loop {
                if ov.pending.is_empty() {
                    if ov.landed_seq < ov.applied_seq && ov.committing.is_empty() {
                        // Everything applied is already in the engine (the
                        // newest operations wrote nothing): as durable as
                        // what came before them.
                        if ov.durable_seq == ov.landed_seq {
                            ov.durable_seq = ov.applied_seq;
                        }
                        ov.landed_seq = ov.applied_seq;
                        self.done.notify_all();
                    }
                    // What landed visible only the syncer makes durable:
                    // freed files and the unmount wait for it.
                    let ahead = ov.durable_seq < ov.landed_seq && ov.committing.is_empty();
                    if ahead && (!ov.pending_unlinks.is_empty() || ov.shutdown) {
                        self.syncing.notify_one();
                    }
                    if !ov.pending_unlinks.is_empty() && ov.failure.is_none() && !ahead {
                        // Files freed with no writes of their own: what they
                        // waited for is durable now.
                        let unlinks = std::mem::take(&mut ov.pending_unlinks);
                        drop(ov);
                        remove_freed(&unlinks);
                        ov = self.overlay.lock();
                        continue;
                    }
                    if ov.shutdown && !ahead {
                        drop(ov);
                        self.release_if_idle(true);
                        return;
                    }
                    let linger = match self.linger_since.load(Ordering::Relaxed) {
                        0 => None,
                        at => {
                            let since = Duration::from_nanos(at);
                            Some((since + LEASE_LINGER).saturating_sub(self.born.elapsed()))
                        }
                    };
                    if linger.is_some_and(|d| d.is_zero()) {
                        drop(ov);
                        self.maybe_release();
                        ov = self.overlay.lock();
                        continue;
                    }
                    match linger {
                        Some(wait) => {
                            self.work.wait_for(&mut ov, wait);
                        }
                        None => self.work.wait(&mut ov),
                    }
                    continue;
                }
                let age = ov.pending_since.map_or(Duration::ZERO, |t| t.elapsed());
                let backoff = if ov.failure.is_some() {
                    Duration::from_millis(200)
                } else {
                    Duration::ZERO
                };
                if (ov.urgent || ov.shutdown || ov.due_by_size() || age >= self.interval)
                    && age >= backoff
                {
                    break;
                }
                let wait = self.interval.max(backoff).saturating_sub(age);
                self.work.wait_for(&mut ov, wait);
            }
            if ov.unflushed
                && let Some(flush) = self.flusher.get()
            {
                // The batch goes with the records its operations deferred:
                // the operation under way hands them over as it ends.
                self.flush_wanted.store(true, Ordering::Relaxed);
                self.work.wait_for(&mut ov, FLUSH_WAIT);
                if ov.unflushed {
                    // None ended meanwhile: take them under the core's
                    // lock, so that none is half in.
                    drop(ov);
                    let mut taken = None;
                    let had = flush(&mut |writes| {
                        let mut ov = self.overlay.lock();
                        self.insert(&mut ov, writes);
                        ov.unflushed = false;
                        self.deferred.store(false, Ordering::SeqCst);
                        taken = Some(self.take(&mut ov));
                    });
                    ov = self.overlay.lock();
                    match taken {
                        Some(t) if had => ready = Some(t),
                        // Busy: its holder hands them over as it ends, or
                        // before it waits for us.
                        _ => continue,
                    }
                }
            }
            let (batch, mut unlinks, seq) = match ready.take() {
                Some(t) => t,
                None => self.take(&mut ov),
            };
            let durable = self.durable_due(&ov, !unlinks.is_empty());
            self.flush_wanted.store(false, Ordering::Relaxed);
            drop(ov);

            // Borrowed: the batch stays visible to readers as `committing`
            // meanwhile, and a copy would double the memory a commit holds.
            let mut writes = batch.iter().map(|(k, v)| (k.as_slice(), v.as_deref()));
            let res = if durable {
                self.engine.commit_iter(&mut writes)
            } else {
                self.engine.commit_iter_visible(&mut writes)
            };
            // This daemon's own commit: its caches already show it, so its
            // doorbell must not be taken for another daemon's change. Noted
            // while the lease is still held (the doorbell may ring first:
            // it is ignored while the lease is held).
            if let (Ok(()), Some(e)) = (&res, self.engine.shared().and_then(|s| s.reached())) {
                let mut l = self.lease.lock();
                l.seen = l.seen.max(e);
            }
            if res.is_ok() {
                // In the engine: the lease may go round now (its next
                // holder reads this batch there), not after the unlinks
                // below — a batch may free thousands of files, and taking
                // them in the lease's turn held every writer (T5's removes
                // of 10,000 files on an object-store volume: 25 µs each
                // at 3,000, 500-900 at 10,000).
                self.overlay.lock().landed = true;
                self.maybe_release();
                // The files of inodes this batch freed: not under the
                // overlay lock (every operation needs it, and a batch may
                // free hundreds), and before the batch counts as durable
                // (a clean unmount waits for that, then the process ends).
                // Their paths are freed here too, not under the lock.
                remove_freed(&std::mem::take(&mut unlinks));
            }

            ov = self.overlay.lock();
            match res {
                Ok(()) => {
                    if ov.failure.take().is_some() {
                        tracing::info!(
                            failed_for_s = ov.failing_since.map_or(0, |t| t.elapsed().as_secs()),
                            "metadata commits succeed again"
                        );
                    }
                    ov.failing_since = None;
                    ov.failure_logged = None;
                    ov.last_error.clear();
                    ov.landed_seq = seq;
                    if durable {
                        // A durable commit makes every earlier one durable.
                        ov.durable_seq = seq;
                        ov.ahead_since = None;
                        ov.durable_failed = false;
                    } else if ov.ahead_since.is_none() || ov.durable_wanted > ov.durable_seq {
                        // The syncer's clock starts, or a waiter's batch
                        // landed visible.
                        ov.ahead_since.get_or_insert_with(Instant::now);
                        self.syncing.notify_one();
                    }
                    ov.committing = Arc::new(Map::new());
                    ov.committing_need = 0;
                    ov.held = self.engine.held();
                }
                Err(MetaError::LeaseLost(why)) => {
                    // Computed on a view another daemon has changed since:
                    // committing it later could corrupt the volume. Dropped,
                    // as a crash would drop it (nothing fsync acknowledged).
                    // Under the lease lock (taken first: its order) so that
                    // the lease cannot go back, and be taken again, between
                    // the batch being dropped and the caches being owed
                    // their reset: a taker in that gap would serve from
                    // them, and its fresh lease would be left draining
                    // (seen under load, in the unit test below).
                    drop(ov);
                    let mut l = self.lease.lock();
                    ov = self.overlay.lock();
                    let records = batch.len() + ov.pending.len();
                    tracing::error!(
                        records,
                        "the write lease was lost ({why}): dropping the changes not yet committed, as a crash would; reloading everything from the database"
                    );
                    // What landed but was not durable may be lost too
                    // (an engine's server that crashed lost it, which is
                    // one way a lease is lost): its waiters fail.
                    let first = ov.durable_seq + 1;
                    let last = ov.applied_seq;
                    ov.mark_lost(first, last);
                    ov.durable_seq = ov.applied_seq;
                    ov.landed_seq = ov.applied_seq;
                    ov.ahead_since = None;
                    ov.pending = Map::new();
                    ov.pending_unlinks.clear();
                    ov.pending_bytes = 0;
                    ov.pending_need = 0;
                    ov.pending_since = None;
                    ov.committing = Arc::new(Map::new());
                    ov.committing_need = 0;
                    drop(unlinks);
                    // The caches are reset by the next taker of the lease,
                    // not here: a handler may hold the state lock while it
                    // waits for this committer (see `Lease::reset`). No new
                    // operation starts under the lost lease.
                    l.reset = true;
                    l.draining = l.held;
                    drop(l);
                }
                Err(e) => {
                    let failure = match e {
                        MetaError::NoSpace => Failure::NoSpace,
                        _ => Failure::Io,
                    };
                    let message = e.to_string();
                    ov.failing_since.get_or_insert_with(Instant::now);
                    // When it starts, when the error changes, then once a
                    // minute: the batch is retried every 200 ms.
                    if message != ov.last_error
                        || ov
                            .failure_logged
                            .is_none_or(|t| t.elapsed() >= Duration::from_secs(60))
                    {
                        tracing::error!(error = %e, records = batch.len() + ov.pending.len(), "metadata commit failed: new changes are refused, the batch is retried until it commits");
                        ov.failure_logged = Some(Instant::now());
                    }
                    ov.last_error = message;
                    ov.failure = Some(failure);
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
                    ov.pending_need += std::mem::take(&mut ov.committing_need);
                    ov.held = self.engine.held();
                    if ov.shutdown {
                        self.done.notify_all();
                        return;
                    }
                }
            }
            self.done.notify_all();
            drop(ov);
            // The batch's last reference, most often: freeing its records
            // (50-130 µs for 100-160 of them, measured during T5's removes:
            // the queue threads allocated them) is not for under the
            // overlay lock, which every operation takes.
            drop(batch);
            self.maybe_release();
            ov = self.overlay.lock();
            // Top the hold up for the next batches, off the request path
            // (after a failure too: space may have come back).
            if let Some(h) = self.hold {
                if ov.held < h.target / 2 {
                    drop(ov);
                    let _ = self.engine.hold(h.target);
                    ov = self.overlay.lock();
                    ov.held = self.engine.held();
                }
            }
        }
    }
}

impl Store {
    /// Makes what has landed durable (the syncer): waiters of it
    /// are told either way.
    fn make_durable<'a>(
        &'a self,
        ov: parking_lot::MutexGuard<'a, Overlay>,
    ) -> parking_lot::MutexGuard<'a, Overlay> {
        let seq = ov.landed_seq;
        let failed_before = ov.durable_failed;
        drop(ov);
        let started = Instant::now();
        let res = self.engine.make_durable();
        let mut ov = self.overlay.lock();
        match res {
            Ok(()) => {
                ov.durable_seq = ov.durable_seq.max(seq);
                ov.durable_failed = false;
                // What landed meanwhile (commits go on beside the flush)
                // landed after it began: its lag counts from then, not
                // from the first commit this flush covered — which sent
                // the syncer into one flush after another, a WAL fsync
                // each, as long as commits kept landing.
                ov.ahead_since = (ov.durable_seq < ov.landed_seq).then_some(started);
            }
            Err(MetaError::LeaseLost(why)) => {
                // What landed and was not durable is gone (a server that
                // restarted lost it and it could not be committed again):
                // its waiters fail; the engine refuses the next commit
                // (computed on it) and the caches are reset with the lease.
                drop(ov);
                let mut l = self.lease.lock();
                ov = self.overlay.lock();
                tracing::error!(
                    "changes committed but not yet durable were lost ({why}); reloading everything from the database"
                );
                let first = ov.durable_seq + 1;
                let last = ov.landed_seq;
                ov.mark_lost(first, last);
                ov.durable_seq = ov.landed_seq;
                ov.ahead_since = None;
                l.reset = true;
                l.draining = l.held;
            }
            Err(e) => {
                if !failed_before {
                    tracing::error!(error = %e, "cannot make committed metadata durable: fsync fails until it can; retried");
                }
                ov.durable_failed = true;
                ov.durable_fails += 1;
                self.done.notify_all();
                // Not at once again: the engine is away.
                self.syncing.wait_for(&mut ov, Duration::from_millis(200));
                return ov;
            }
        }
        self.done.notify_all();
        ov
    }
}

/// Deletes the backing files of freed inodes.
fn remove_freed(paths: &[PathBuf]) {
    for path in paths {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::error!(path = %path.display(), error = %e, "cannot remove a freed backing file");
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::{MemStore, MetaRead};
    use proptest::prelude::*;

    /// `MetaRead` for a test engine: its `inner` store's reads.
    macro_rules! reads_from_inner {
        ($t:ty) => {
            impl MetaRead for $t {
                fn get(&self, key: &[u8]) -> std::result::Result<Option<Vec<u8>>, MetaError> {
                    self.inner.get(key)
                }
                fn scan(
                    &self,
                    s: &[u8],
                    e: &[u8],
                    l: usize,
                ) -> std::result::Result<crate::meta::Pairs, MetaError> {
                    self.inner.scan(s, e, l)
                }
            }
        };
    }

    /// An engine whose commits fail while `failing` is set, and which
    /// holds a fixed amount of space.
    struct Faulty {
        inner: MemStore,
        failing: std::sync::atomic::AtomicBool,
        held: u64,
    }

    reads_from_inner!(Faulty);

    impl MetaStore for Faulty {
        fn commit_iter<'a>(
            &self,
            batch: &mut dyn Iterator<Item = crate::meta::WriteRef<'a>>,
        ) -> std::result::Result<(), MetaError> {
            if self.failing.load(Ordering::SeqCst) {
                return Err(MetaError::Io(std::io::Error::from_raw_os_error(libc::EIO)));
            }
            self.inner.commit_iter(batch)
        }
        fn disk_bytes(&self) -> u64 {
            0
        }
        fn write_bound(&self, _key_len: usize, value_len: Option<usize>) -> u64 {
            4096 + value_len.unwrap_or(0) as u64
        }
        fn hold(&self, _bytes: u64) -> std::result::Result<u64, MetaError> {
            Err(MetaError::NoSpace)
        }
        fn held(&self) -> u64 {
            self.held
        }
    }

    fn faulty(held: u64) -> (Arc<Faulty>, Arc<Store>) {
        let engine = Arc::new(Faulty {
            inner: MemStore::new(),
            failing: std::sync::atomic::AtomicBool::new(false),
            held,
        });
        let hold = HoldPolicy {
            target: held,
            inline_budget: 320,
        };
        let store = Store::new(engine.clone(), Duration::from_millis(2), Some(hold));
        (engine, store)
    }

    /// The failure contract: while commits fail, nothing new is admitted,
    /// durability waits fail, the waiting records are reported, and close
    /// keeps retrying until the engine recovers — nothing is dropped.
    #[test]
    fn failed_commits_refuse_new_changes_and_lose_nothing() {
        let (engine, store) = faulty(64 << 20);
        let t = store.admit(Admit::Change).unwrap();
        store.apply(vec![(b"a".to_vec(), Some(b"1".to_vec()))]);
        drop(t);
        store.sync().unwrap();
        engine.failing.store(true, Ordering::SeqCst);
        let t = store.admit(Admit::Change).unwrap();
        let seq = store.apply(vec![(b"b".to_vec(), Some(b"2".to_vec()))]);
        drop(t);
        assert!(
            store.wait_durable(seq).is_err(),
            "fsync reports the failure"
        );
        let h = store.health();
        assert!(
            h.failure.as_deref().unwrap().starts_with("I/O error"),
            "{h:?}"
        );
        assert_eq!(h.waiting_records, 1);
        assert!(matches!(store.admit(Admit::Change), Err(CoreError::Io(_))));
        assert!(matches!(store.admit(Admit::Removal), Err(CoreError::Io(_))));
        assert!(store.healthy().is_err());
        // The pending record is still what reads see.
        assert_eq!(store.get(b"b").unwrap().as_deref(), Some(&b"2"[..]));
        // Close keeps retrying; the engine recovers meanwhile.
        let recover = {
            let engine = Arc::clone(&engine);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(500));
                engine.failing.store(false, Ordering::SeqCst);
            })
        };
        store.close().unwrap();
        recover.join().unwrap();
        assert_eq!(engine.inner.get(b"b").unwrap().as_deref(), Some(&b"2"[..]));
    }

    /// A sync started ahead (an fsync's commit beside its file's fsync) is
    /// waited for like `sync`: its records are in the engine when the wait
    /// returns, and a failed commit fails the wait.
    #[test]
    fn a_started_sync_is_waited_for_like_sync() {
        let (engine, store) = faulty(64 << 20);
        let t = store.admit(Admit::Change).unwrap();
        store.apply(vec![(b"a".to_vec(), Some(b"1".to_vec()))]);
        drop(t);
        let started = store.start_sync();
        store.wait_started(started).unwrap();
        assert_eq!(engine.inner.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
        engine.failing.store(true, Ordering::SeqCst);
        let t = store.admit(Admit::Change).unwrap();
        store.apply(vec![(b"b".to_vec(), Some(b"2".to_vec()))]);
        drop(t);
        let started = store.start_sync();
        assert!(store.wait_started(started).is_err(), "the failure reported");
        engine.failing.store(false, Ordering::SeqCst);
        store.close().unwrap();
        assert_eq!(engine.inner.get(b"b").unwrap().as_deref(), Some(&b"2"[..]));
    }

    /// An engine whose commits may be visible before durable (as
    /// PostgreSQL's with `synchronous_commit` off): it counts each kind.
    #[derive(Default)]
    struct Lazy {
        inner: MemStore,
        durable_commits: std::sync::atomic::AtomicU64,
        visible_commits: std::sync::atomic::AtomicU64,
        flushes: std::sync::atomic::AtomicU64,
        flush_fails: AtomicBool,
        /// While set, a flush waits (a server's slow fsync): `flushing`
        /// counts those waiting.
        flush_held: AtomicBool,
        flushing: std::sync::atomic::AtomicU64,
        /// How long each flush takes (ms).
        flush_ms: std::sync::atomic::AtomicU64,
    }

    reads_from_inner!(Lazy);

    impl MetaStore for Lazy {
        fn commit_iter<'a>(
            &self,
            batch: &mut dyn Iterator<Item = crate::meta::WriteRef<'a>>,
        ) -> std::result::Result<(), MetaError> {
            self.durable_commits.fetch_add(1, Ordering::SeqCst);
            self.inner.commit_iter(batch)
        }
        fn commit_iter_visible<'a>(
            &self,
            batch: &mut dyn Iterator<Item = crate::meta::WriteRef<'a>>,
        ) -> std::result::Result<(), MetaError> {
            self.visible_commits.fetch_add(1, Ordering::SeqCst);
            self.inner.commit_iter(batch)
        }
        fn visible_before_durable(&self) -> bool {
            true
        }
        fn make_durable(&self) -> std::result::Result<(), MetaError> {
            self.flushing.fetch_add(1, Ordering::SeqCst);
            while self.flush_held.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            self.flushing.fetch_sub(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(self.flush_ms.load(Ordering::SeqCst)));
            if self.flush_fails.load(Ordering::SeqCst) {
                return Err(MetaError::Io(std::io::Error::from_raw_os_error(libc::EIO)));
            }
            self.flushes.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn disk_bytes(&self) -> u64 {
            0
        }
    }

    /// On such an engine a batch nobody waits on is committed visible
    /// only; it becomes durable when someone waits for that, or unasked
    /// after `DURABLE_LAG`; a batch freeing files is committed durable
    /// (the files go only after); a flush that fails fails `fsync`, not
    /// the close's wait, until it succeeds; and a slow flush holds no
    /// commit.
    #[test]
    fn visible_commits_become_durable_when_asked_or_after_a_lag() {
        let engine = Arc::new(Lazy::default());
        let store = Store::new(engine.clone(), Duration::from_millis(2), None);
        store.set_async_commit(true);
        let count = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::SeqCst);

        let seq = store.apply(vec![(b"a".to_vec(), Some(b"1".to_vec()))]);
        store.wait_landed(seq).unwrap();
        assert_eq!(engine.inner.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(count(&engine.visible_commits), 1);
        assert_eq!(count(&engine.durable_commits), 0);
        assert!(store.durable_seq() < seq, "not durable before asked");
        store.wait_durable(seq).unwrap();
        assert!(store.durable_seq() >= seq);
        assert_eq!(count(&engine.flushes), 1, "one flush, no second commit");

        // Nobody asks: durable all the same, once the lag has passed.
        let seq = store.apply(vec![(b"b".to_vec(), Some(b"2".to_vec()))]);
        store.wait_landed(seq).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while store.durable_seq() < seq {
            assert!(Instant::now() < deadline, "never made durable unasked");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(count(&engine.flushes), 2);

        // Freed files go only with a durable commit.
        let dir = tempfile::tempdir().unwrap();
        let freed = dir.path().join("freed");
        std::fs::write(&freed, b"x").unwrap();
        let durable_before = count(&engine.durable_commits);
        let seq = store.apply_then_unlink(
            vec![(b"c".to_vec(), Some(b"3".to_vec()))],
            Some(freed.clone()),
        );
        store.wait_durable(seq).unwrap();
        assert_eq!(count(&engine.durable_commits), durable_before + 1);
        assert!(!freed.exists());

        // A flush that fails: the close's wait holds, fsync's fails, and
        // both hold again once the engine flushes.
        engine.flush_fails.store(true, Ordering::SeqCst);
        let seq = store.apply(vec![(b"d".to_vec(), Some(b"4".to_vec()))]);
        store.wait_landed(seq).unwrap();
        assert!(matches!(store.wait_durable(seq), Err(CoreError::Io(_))));
        engine.flush_fails.store(false, Ordering::SeqCst);
        store.wait_durable(seq).unwrap();

        // A flush under way (the server's fsync is slow) holds no close:
        // commits go on beside it, visible, and are durable once it and
        // the next are done.
        engine.flush_held.store(true, Ordering::SeqCst);
        let seq = store.apply(vec![(b"e".to_vec(), Some(b"5".to_vec()))]);
        store.wait_landed(seq).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while count(&engine.flushing) == 0 {
            assert!(Instant::now() < deadline, "no flush began");
            std::thread::sleep(Duration::from_millis(1));
        }
        let landed_before = count(&engine.visible_commits);
        for (i, k) in [b"f", b"g", b"h"].into_iter().enumerate() {
            let seq = store.apply(vec![(k.to_vec(), Some(vec![b'0' + i as u8]))]);
            store.wait_landed(seq).unwrap();
        }
        assert_eq!(count(&engine.visible_commits), landed_before + 3);
        assert_eq!(count(&engine.flushing), 1, "still flushing meanwhile");
        assert!(store.durable_seq() < seq);
        engine.flush_held.store(false, Ordering::SeqCst);
        store.sync().unwrap();
        assert_eq!(engine.inner.get(b"h").unwrap().as_deref(), Some(&b"2"[..]));

        // Commits landing one after another, also during each flush: a
        // flush per lag, not one flush after another.
        engine.flush_ms.store(5, Ordering::SeqCst);
        let flushes = count(&engine.flushes);
        let start = Instant::now();
        let mut i = 0u32;
        while start.elapsed() < Duration::from_millis(400) {
            let seq = store.apply(vec![(b"i".to_vec(), Some(i.to_be_bytes().to_vec()))]);
            store.wait_landed(seq).unwrap();
            i += 1;
        }
        let made = count(&engine.flushes) - flushes;
        assert!(
            (1..=12).contains(&made),
            "{made} flushes for {i} commits in 400 ms"
        );
        store.close().unwrap();
    }

    /// `abandon` lets close give up (a second signal to the daemon).
    #[test]
    fn close_gives_up_only_when_told() {
        let (engine, store) = faulty(64 << 20);
        engine.failing.store(true, Ordering::SeqCst);
        let t = store.admit(Admit::Change).unwrap();
        store.apply(vec![(b"x".to_vec(), Some(b"1".to_vec()))]);
        drop(t);
        let giver = {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                store.abandon();
            })
        };
        assert!(store.close().is_err());
        giver.join().unwrap();
    }

    /// Admission: a change is refused with ENOSPC when what is held does
    /// not cover it plus the removals' share; a removal still gets in.
    #[test]
    fn changes_are_refused_before_the_held_space_runs_out() {
        let (_engine, store) = faulty(0);
        assert!(matches!(
            store.admit(Admit::Change),
            Err(CoreError::NoSpace)
        ));
        assert!(matches!(
            store.admit(Admit::Removal),
            Err(CoreError::NoSpace)
        ));
        let op = store.op_bound(&store.hold.unwrap());
        // Room for a removal, not for a change and the removals' share.
        let (_engine, store) = faulty(2 * op);
        assert!(matches!(
            store.admit(Admit::Change),
            Err(CoreError::NoSpace)
        ));
        let t1 = store.admit(Admit::Removal).unwrap();
        let t2 = store.admit(Admit::Removal).unwrap();
        // Each promise counts until it is dropped.
        assert!(matches!(
            store.admit(Admit::Removal),
            Err(CoreError::NoSpace)
        ));
        drop(t1);
        assert!(store.admit(Admit::Removal).is_ok());
        drop(t2);
        let (_engine, store) = faulty((REMOVAL_OPS + 1) * op);
        assert!(store.admit(Admit::Change).is_ok());
    }

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

    /// Waits up to 5 s for `path` to be gone.
    fn removed_soon(path: &std::path::Path) -> bool {
        let start = Instant::now();
        while path.exists() {
            if start.elapsed() > Duration::from_secs(5) {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        true
    }

    /// Each file freed with its batch is deleted once that batch commits,
    /// with no later write to carry it (a full disk brings none), wherever
    /// the committer's swap falls.
    #[test]
    fn freed_files_go_with_their_batch_not_a_later_one() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Arc::new(MemStore::new());
        let store = Store::new(engine, Duration::from_micros(1), None);
        for i in 0..2000u32 {
            let path = dir.path().join(i.to_string());
            std::fs::write(&path, b"x").unwrap();
            store.apply_then_unlink(vec![(i.to_be_bytes().to_vec(), None)], Some(path.clone()));
            assert!(
                removed_soon(&path),
                "free {i}: kept after its batch committed"
            );
        }
        store.close().unwrap();
    }

    /// A file freed with no writes of its own waits for what was applied
    /// before it to be durable, then goes without another write.
    #[test]
    fn a_freed_file_with_no_writes_waits_for_earlier_ones_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("backing");
        std::fs::write(&path, b"x").unwrap();
        let (engine, store) = faulty(64 << 20);
        engine.failing.store(true, Ordering::SeqCst);
        store.apply(vec![(b"a".to_vec(), None)]);
        store.apply_then_unlink(Vec::new(), Some(path.clone()));
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            path.exists(),
            "deleted before the earlier writes were durable"
        );
        engine.failing.store(false, Ordering::SeqCst);
        assert!(
            removed_soon(&path),
            "kept once everything before it was durable"
        );
        store.close().unwrap();
    }

    fn key(k: u16) -> Vec<u8> {
        k.to_be_bytes().to_vec()
    }

    /// A store over an engine holding `committed`, with `pending` applied
    /// and kept in memory (a long commit interval).
    fn overlaid(committed: &BTreeMap<u16, u8>, pending: &BTreeMap<u16, Option<u8>>) -> Arc<Store> {
        let engine = Arc::new(MemStore::new());
        let batch: Vec<Write> = committed
            .iter()
            .map(|(k, v)| (key(*k), Some(vec![*v])))
            .collect();
        engine.commit(&batch).unwrap();
        let store = Store::new(engine, Duration::from_secs(3600), None);
        store.apply(
            pending
                .iter()
                .map(|(k, v)| (key(*k), v.map(|v| vec![v])))
                .collect(),
        );
        store
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
            let store = overlaid(&committed, &pending);
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

        /// Reads of many keys at once (a readdirplus page's inodes) equal
        /// the model key by key, in the order asked, repeats and keys
        /// deleted while pending included.
        #[test]
        fn get_many_matches_model(
            committed in proptest::collection::btree_map(0u16..100, any::<u8>(), 0..50),
            pending in proptest::collection::btree_map(0u16..100, proptest::option::of(any::<u8>()), 0..50),
            asked in proptest::collection::vec(0u16..100, 0..40),
        ) {
            let store = overlaid(&committed, &pending);
            let keys: Vec<Vec<u8>> = asked.iter().map(|k| key(*k)).collect();
            let got = store.get_many(&keys).unwrap();
            let want: Vec<Option<Vec<u8>>> = asked
                .iter()
                .map(|k| match pending.get(k) {
                    Some(v) => v.map(|v| vec![v]),
                    None => committed.get(k).map(|v| vec![*v]),
                })
                .collect();
            prop_assert_eq!(got, want);
            store.close().unwrap();
        }
    }

    /// An engine in memory that follows pointers in one read, as
    /// PostgreSQL does (a range read with it).
    struct Following(MemStore);

    impl MetaRead for Following {
        fn get(&self, key: &[u8]) -> std::result::Result<Option<Vec<u8>>, MetaError> {
            self.0.get(key)
        }
        fn scan(
            &self,
            start: &[u8],
            end: &[u8],
            limit: usize,
        ) -> std::result::Result<crate::meta::Pairs, MetaError> {
            self.0.scan(start, end, limit)
        }
        fn follows_in_one_read(&self) -> bool {
            true
        }
        fn get_follow_and_range(
            &self,
            key: &[u8],
            at: usize,
            prefix: u8,
            companion: u8,
        ) -> std::result::Result<FollowedWith, MetaError> {
            let Some((v, p)) = self.get_and_follow(key, at, prefix)? else {
                return Ok(None);
            };
            let range = match (&p, crate::meta::pointer_key(&v, at, prefix)) {
                (Some(_), Some(k)) => {
                    let (lo, hi) = crate::meta::companion_range(&k, companion);
                    Some(self.0.scan(&lo, &hi, usize::MAX)?)
                }
                _ => None,
            };
            Ok(Some((v, p, range)))
        }
    }

    impl MetaStore for Following {
        fn commit_iter<'a>(
            &self,
            batch: &mut dyn Iterator<Item = crate::meta::WriteRef<'a>>,
        ) -> std::result::Result<(), MetaError> {
            self.0.commit_iter(batch)
        }
        fn disk_bytes(&self) -> u64 {
            0
        }
    }

    /// A lookup's companion records come back only while nothing waiting
    /// to be committed touches them: a pending spill page (or its
    /// deletion) makes the caller read the range itself.
    #[test]
    fn a_companion_range_with_pending_changes_is_not_served() {
        let engine = Arc::new(Following(MemStore::new()));
        engine
            .commit(&[
                (b"Dname".to_vec(), Some(b"x\0\0\0\0\0\0\0\x07".to_vec())),
                (b"I\0\0\0\0\0\0\0\x07".to_vec(), Some(b"inode".to_vec())),
                (b"S\0\0\0\0\0\0\0\x07".to_vec(), Some(b"spill".to_vec())),
            ])
            .unwrap();
        let store = Store::new(engine, Duration::from_secs(3600), None);
        let follow = || {
            let (_, p, range) = store
                .get_follow_and_range(b"Dname", 1, b'I', b'S')
                .unwrap()
                .unwrap();
            (p, range)
        };
        let (p, range) = follow();
        assert_eq!(p, Some(b"inode".to_vec()));
        assert_eq!(
            range,
            Some(vec![(b"S\0\0\0\0\0\0\0\x07".to_vec(), b"spill".to_vec())])
        );
        // A second page waiting: the range is the caller's to read.
        store.apply(vec![(
            b"S\0\0\0\0\0\0\0\x07\x01".to_vec(),
            Some(b"p1".to_vec()),
        )]);
        assert_eq!(follow(), (Some(b"inode".to_vec()), None));
        // A newer inode waiting wins over the engine's.
        store.apply(vec![(
            b"I\0\0\0\0\0\0\0\x07".to_vec(),
            Some(b"newer".to_vec()),
        )]);
        assert_eq!(follow().0, Some(b"newer".to_vec()));
        store.close().unwrap();
    }

    /// A window's scan follows each entry to its inode in one engine call;
    /// a pointee waiting in the overlay wins over the engine's, and an entry
    /// waiting in the range makes it a merged scan, whose pointees are read
    /// through the overlay too.
    #[test]
    fn a_scan_that_follows_squares_entries_and_pointees_with_the_overlay() {
        let engine = Arc::new(Following(MemStore::new()));
        engine
            .commit(&[
                (b"Da".to_vec(), Some(b"x\0\0\0\0\0\0\0\x07".to_vec())),
                (b"Db".to_vec(), Some(b"x\0\0\0\0\0\0\0\x08".to_vec())),
                (b"I\0\0\0\0\0\0\0\x07".to_vec(), Some(b"seven".to_vec())),
                (b"I\0\0\0\0\0\0\0\x08".to_vec(), Some(b"eight".to_vec())),
            ])
            .unwrap();
        let store = Store::new(engine, Duration::from_secs(3600), None);
        let scan = || -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
            store
                .scan_tree_and_follow(b"D", b"E", 10, 1, b'I', None)
                .unwrap()
                .into_iter()
                .map(|(k, _, p)| (k, p))
                .collect()
        };
        let some = |v: &[u8]| Some(v.to_vec());
        assert_eq!(
            scan(),
            vec![
                (b"Da".to_vec(), some(b"seven")),
                (b"Db".to_vec(), some(b"eight"))
            ]
        );
        // A newer inode waiting wins.
        store.apply(vec![(
            b"I\0\0\0\0\0\0\0\x08".to_vec(),
            Some(b"new 8".to_vec()),
        )]);
        assert_eq!(
            scan(),
            vec![
                (b"Da".to_vec(), some(b"seven")),
                (b"Db".to_vec(), some(b"new 8"))
            ]
        );
        // An entry waiting: removed, and one added pointing at a new inode.
        store.apply(vec![
            (b"Da".to_vec(), None),
            (b"Dc".to_vec(), Some(b"x\0\0\0\0\0\0\0\x09".to_vec())),
            (b"I\0\0\0\0\0\0\0\x09".to_vec(), Some(b"nine".to_vec())),
        ]);
        assert_eq!(
            scan(),
            vec![
                (b"Db".to_vec(), some(b"new 8")),
                (b"Dc".to_vec(), some(b"nine"))
            ]
        );
        store.close().unwrap();
    }

    /// A tree read goes down into the ranges its entries point to in one
    /// engine call; an entry waiting in the overlay anywhere it may go down
    /// to makes it the first range alone, read through the overlay.
    #[test]
    fn a_tree_read_goes_down_unless_an_entry_waits_where_it_may_go() {
        let engine = Arc::new(Following(MemStore::new()));
        let dir = |ino: u8| {
            let mut v = b"x\0\0\0\0\0\0\0".to_vec();
            v.extend([ino, 4]);
            v
        };
        engine
            .commit(&[
                (b"D\0\0\0\0\0\0\0\x01a".to_vec(), Some(dir(2))),
                (b"D\0\0\0\0\0\0\0\x02x".to_vec(), Some(dir(3))),
                (b"I\0\0\0\0\0\0\0\x02".to_vec(), Some(b"two".to_vec())),
            ])
            .unwrap();
        let store = Store::new(engine, Duration::from_secs(3600), None);
        let descend = crate::meta::Descend {
            prefix: b'D',
            kind_at: 9,
            kind: 4,
        };
        let tree = || -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
            let mut rows: Vec<_> = store
                .scan_tree_and_follow(
                    b"D\0\0\0\0\0\0\0\x01",
                    b"D\0\0\0\0\0\0\0\x02",
                    10,
                    1,
                    b'I',
                    Some(descend),
                )
                .unwrap()
                .into_iter()
                .map(|(k, _, p)| (k, p))
                .collect();
            rows.sort();
            rows
        };
        assert_eq!(
            tree(),
            vec![
                (b"D\0\0\0\0\0\0\0\x01a".to_vec(), Some(b"two".to_vec())),
                (b"D\0\0\0\0\0\0\0\x02x".to_vec(), None),
            ]
        );
        store.apply(vec![(b"D\0\0\0\0\0\0\0\x02y".to_vec(), Some(dir(4)))]);
        assert_eq!(
            tree(),
            vec![(b"D\0\0\0\0\0\0\0\x01a".to_vec(), Some(b"two".to_vec()))]
        );
        store.close().unwrap();
    }

    /// A shared engine in memory: an epoch, a change log, a lease that can
    /// be lost, and "another daemon" that commits beside the store.
    struct Shared2 {
        inner: MemStore,
        epoch: std::sync::atomic::AtomicU64,
        /// The epoch the lease's commits must find; -1: no lease.
        mine: std::sync::atomic::AtomicI64,
        log: parking_lot::Mutex<Vec<(u64, Vec<Vec<u8>>)>>,
        lose: AtomicBool,
    }

    impl Shared2 {
        fn new() -> Self {
            Shared2 {
                inner: MemStore::default(),
                epoch: 0.into(),
                mine: (-1).into(),
                log: parking_lot::Mutex::new(Vec::new()),
                lose: AtomicBool::new(false),
            }
        }

        fn log_since(&self, seen: u64) -> Changes {
            let epoch = self.epoch.load(Ordering::SeqCst);
            let keys = self
                .log
                .lock()
                .iter()
                .filter(|(e, _)| *e > seen)
                .flat_map(|(_, k)| k.clone())
                .collect();
            Changes {
                epoch,
                keys: Some(keys),
            }
        }

        /// Another daemon commits `key` (it holds the lease meanwhile).
        fn other_commits(&self, key: &[u8]) {
            self.inner
                .commit(&[(key.to_vec(), Some(b"other".to_vec()))])
                .unwrap();
            let e = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
            self.log.lock().push((e, vec![key.to_vec()]));
        }
    }

    reads_from_inner!(Shared2);

    impl MetaStore for Shared2 {
        fn commit_iter<'a>(
            &self,
            batch: &mut dyn Iterator<Item = crate::meta::WriteRef<'a>>,
        ) -> std::result::Result<(), MetaError> {
            let mine = self.mine.load(Ordering::SeqCst);
            if self.lose.load(Ordering::SeqCst)
                || mine < 0
                || mine as u64 != self.epoch.load(Ordering::SeqCst)
            {
                return Err(MetaError::LeaseLost("test".into()));
            }
            let batch: Vec<crate::meta::Write> = batch
                .map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
                .collect();
            let keys = batch.iter().map(|(k, _)| k.clone()).collect();
            self.inner.commit(&batch)?;
            let e = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
            self.log.lock().push((e, keys));
            self.mine.store(e as i64, Ordering::SeqCst);
            Ok(())
        }
        fn disk_bytes(&self) -> u64 {
            0
        }
        fn shared(&self) -> Option<&dyn crate::meta::Shared> {
            Some(self)
        }
    }

    impl crate::meta::Shared for Shared2 {
        fn lease(&self, seen: u64) -> std::result::Result<Changes, MetaError> {
            let ch = self.log_since(seen);
            self.mine.store(ch.epoch as i64, Ordering::SeqCst);
            Ok(ch)
        }
        fn release(&self) -> u64 {
            self.mine.swap(-1, Ordering::SeqCst).max(0) as u64
        }
        fn reached(&self) -> Option<u64> {
            let m = self.mine.load(Ordering::SeqCst);
            (m >= 0).then_some(m as u64)
        }
        fn leave(&self) {}
        fn changes(&self, seen: u64) -> std::result::Result<Changes, MetaError> {
            Ok(self.log_since(seen))
        }
        fn watch(
            &self,
            _ring: Box<dyn Fn(u64) + Send + Sync>,
        ) -> std::result::Result<(), MetaError> {
            Ok(())
        }
        fn session_id(&self) -> u64 {
            1
        }
        fn dead_sessions(&self) -> std::result::Result<Vec<(u64, i64)>, MetaError> {
            Ok(Vec::new())
        }
        fn live_sessions(&self) -> std::result::Result<Vec<u64>, MetaError> {
            Ok(vec![1])
        }
        fn bury(&self, _id: u64) -> std::result::Result<bool, MetaError> {
            Ok(false)
        }
        fn alone(&self) -> std::result::Result<bool, MetaError> {
            Ok(true)
        }
        // Locks are not what this engine is here to test.
        fn lock_set(
            &self,
            _: &crate::meta::LockReq,
            _: bool,
        ) -> std::result::Result<Option<crate::meta::LockHolder>, crate::meta::LockError> {
            Err(MetaError::Engine("no locks here".into()).into())
        }
        fn lock_test(
            &self,
            _: &crate::meta::LockReq,
        ) -> std::result::Result<Option<crate::meta::LockHolder>, MetaError> {
            Err(MetaError::Engine("no locks here".into()))
        }
        fn lock_drop(
            &self,
            _: u64,
            _: crate::meta::LockDrop,
        ) -> std::result::Result<(), MetaError> {
            Ok(())
        }
        fn on_locks_changed(&self, _: Box<dyn Fn() + Send + Sync>) {}
    }

    /// A sequential writer's next change finds the lease still held (it
    /// lingers once idle), and an idle lease still goes back.
    #[test]
    fn an_idle_lease_lingers_for_the_next_change_then_goes_back() {
        let eng = Arc::new(Shared2::new());
        let store = Store::new(eng.clone(), Duration::from_millis(2), None);
        const CHANGES: u8 = 5;
        for i in 0..CHANGES {
            let seq = {
                let _g = store.lease().unwrap();
                store.apply(vec![(vec![i], Some(b"1".to_vec()))])
            };
            // As a close does: its commit, then the next change.
            store.wait_landed(seq).unwrap();
        }
        let takes = store.lease_figures().unwrap().takes;
        // Without the linger, every change took it again (CI's load may
        // stretch a pause past the linger now and then).
        assert!(takes < u64::from(CHANGES), "taken {takes} times");
        let start = Instant::now();
        while eng.mine.load(Ordering::SeqCst) >= 0 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "lease kept while idle"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        store.close().unwrap();
    }

    #[test]
    fn a_shared_store_catches_up_under_its_lease_and_drops_a_batch_whose_lease_was_lost() {
        let eng = Arc::new(Shared2::new());
        let store = Store::new(eng.clone(), Duration::from_millis(2), None);
        let told: Arc<parking_lot::Mutex<Vec<Changes>>> = Arc::default();
        let t = Arc::clone(&told);
        store.on_changes(Box::new(move |c| t.lock().push(c.clone())));
        let idle = |eng: &Shared2| {
            let start = Instant::now();
            while eng.mine.load(Ordering::SeqCst) >= 0 {
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "lease kept while idle"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        };

        // Another daemon committed: the lease brings it before anything runs.
        eng.other_commits(b"k1");
        {
            let _g = store.lease().unwrap();
            assert_eq!(told.lock().last().unwrap().keys, Some(vec![b"k1".to_vec()]));
            store.apply(vec![(b"a".to_vec(), Some(b"1".to_vec()))]);
        }
        store.sync().unwrap();
        assert_eq!(eng.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
        // Idle: the lease goes back; its own commit is not news to it.
        idle(&eng);
        let n = told.lock().len();
        store.rang(eng.epoch.load(Ordering::SeqCst));
        assert_eq!(told.lock().len(), n, "its own commit taken for another's");

        // The lease is lost under a batch: dropped, not committed; fsync
        // fails; the next lease drops every cache.
        let seq = {
            let _g = store.lease().unwrap();
            eng.lose.store(true, Ordering::SeqCst);
            store.apply(vec![(b"b".to_vec(), Some(b"2".to_vec()))])
        };
        assert!(matches!(store.wait_durable(seq), Err(CoreError::Io(_))));
        assert_eq!(eng.get(b"b").unwrap(), None);
        assert_eq!(
            store.get(b"b").unwrap(),
            None,
            "the dropped batch is out of sight"
        );
        idle(&eng);
        eng.lose.store(false, Ordering::SeqCst);
        {
            let _g = store.lease().unwrap();
            assert_eq!(told.lock().last().unwrap().keys, None, "caches not reset");
            store.apply(vec![(b"c".to_vec(), Some(b"3".to_vec()))]);
        }
        store.sync().unwrap();
        assert_eq!(eng.get(b"c").unwrap().as_deref(), Some(&b"3"[..]));
        store.close().unwrap();
    }
}
