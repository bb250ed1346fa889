//! The core's mutable state, behind its one lock (`Fs::state`): the inode
//! cache, the volume counters, the kernel's references and the open files.
//! Its fields are private; the methods keep their invariants, and a count
//! that would go below zero — an impossible state, a bug somewhere — is
//! loud: an error in the log, a panic in debug builds, and a tally that
//! `safs info --stats` shows ([`State::broken_counts`]).
//!
//! Lock order: this lock before `Fs::handles`; the store's own lock is
//! innermost. Nothing blocks on I/O of its own under it but engine reads of
//! uncached inodes.

use std::collections::HashMap;
use std::fs::File;
use std::num::NonZeroUsize;
use std::sync::Arc;

use lru::LruCache;

use super::dircache::DirCache;
use crate::format::inode::Inode;
use crate::format::shares::DirShare;
use crate::format::spill::Spill;
use crate::format::superblock::{Counters, SessionCounters};

/// A decoded inode and, once read, its spill tier.
pub(super) struct Cached {
    pub inode: Inode,
    /// `None` until first needed; then the spill pages (empty if none).
    pub spill: Option<Spill>,
}

/// What a cache entry is charged against the byte budget.
fn cached_cost(c: &Cached) -> usize {
    256 + c.inode.inline.packed_len() + c.spill.as_ref().map_or(0, Spill::packed_len)
}

/// Open state of one inode.
#[derive(Default)]
struct OpenInode {
    /// Invariant: ≥ 1 while the entry exists; `writers` ≤ `handles`.
    handles: u32,
    writers: u32,
    /// A descriptor of the backing file while a writer has it open: the
    /// source of size and mtime until the last writer closes.
    backing: Option<Arc<File>>,
    /// A descriptor of the backing file while any handle is open: where
    /// reads show (see `Fs::observe_reads`).
    any: Option<Arc<File>>,
    /// A byte quota lay above it at its first open: every handle until the
    /// last close is served by the daemon, which checks each write.
    bounded: bool,
}

/// What closing one handle left.
pub(super) struct Closed {
    /// The last writer closed: the backing descriptor writers shared.
    pub last_writer: Option<Arc<File>>,
    /// The last handle closed.
    pub last: bool,
}

/// Inode numbers a session reserves at a time (one write of `N` each):
/// after a crash the rest of a block is skipped, so at most this many
/// numbers are lost per unclean stop — of 2^64.
pub const INO_BLOCK: u64 = 1024;

/// This daemon's share of the counters: its counters record and the
/// next number of its block, which is in memory only.
#[derive(Default)]
struct Session {
    id: u64,
    own: SessionCounters,
    /// The next number to take, in `[own.start, own.end)` (or `own.end`:
    /// none left).
    next: u64,
    /// A block was reserved since the last write: `N` is due.
    reserved: bool,
    /// `own` changed since the last write.
    dirty: bool,
}

pub(super) struct State {
    /// Invariant: an entry is never older than the store's view of its key.
    /// Bounded by entries (its capacity) and by `cache_budget` bytes; every
    /// change goes through the `cache_*` methods, which keep `cache_bytes`
    /// equal to the sum of [`cached_cost`] over the entries.
    cache: LruCache<u64, Cached>,
    cache_bytes: usize,
    cache_budget: usize,
    /// `N` as the store holds it. Invariant: `next_ino` is above every
    /// inode number ever handed out, and every session's block (inode
    /// numbers are never reused, which is why every inode's generation can
    /// stay 1); `inodes` plus every session's share counts the live ones.
    counters: Counters,
    /// This daemon's share of the counters (see [`Session`]).
    session: Session,
    /// Shared volumes: this session's shares of directories' statistics
    /// (see `format::shares`), every one it moved since it began; and the
    /// other sessions' shares of the directories whose figures were read
    /// (all of a directory's, or none).
    own_shares: rustc_hash::FxHashMap<u64, DirShare>,
    other_shares: rustc_hash::FxHashMap<u64, std::collections::BTreeMap<u64, DirShare>>,
    /// Other sessions' counters records, as last read (shared volumes):
    /// their shares of the count, and the blocks their pools work in.
    others: std::collections::BTreeMap<u64, SessionCounters>,
    /// `others` is behind the store (another session wrote its record):
    /// read again before it is used.
    others_stale: bool,
    /// The kernel's lookup count per inode (FUSE nlookup); no zero entries.
    lookups: HashMap<u64, u64>,
    open: HashMap<u64, OpenInode>,
    /// Impossible counts met so far (see the module comment).
    broken: u64,
    /// Directory views (see `dircache`), changed with the entries under
    /// this same lock.
    dirs: DirCache,
    /// Shared volumes: access times due, waiting for the write lease.
    atimes_due: Vec<(u64, crate::format::inode::Timestamp)>,
    /// Moves whenever cached state is dropped (see `cold`): a read made
    /// without the lock is kept only if this did not move meanwhile.
    epoch: u64,
    /// Inode loads the cache answered, and those that went to the engine.
    inode_hits: u64,
    inode_misses: u64,
    /// A directory with a quota has been cached since the mount: until
    /// then no create looks for limits above it before it takes anything
    /// (the check on the counts it leaves still runs: see `stats`).
    quotas_seen: bool,
    /// Inodes whose cached entry is newer than any record applied to the
    /// store: directories whose statistics operations moved in place (see
    /// `stats`), written once per batch by [`State::take_deferred`].
    /// Invariant: each is in `cache` or `pinned`.
    deferred: rustc_hash::FxHashSet<u64>,
    /// Deferred entries the cache evicted: kept (and found) here until
    /// their records are written, for the store holds older ones.
    pinned: rustc_hash::FxHashMap<u64, Cached>,
    /// What each directory's ancestors have yet to add to their recursive
    /// counts (see `stats`): paid before the batch is taken and before
    /// anyone reads them.
    owed: rustc_hash::FxHashMap<u64, super::stats::Weight>,
}

impl State {
    pub fn new(
        capacity: usize,
        cache_budget: usize,
        counters: Counters,
        dircache_budget: usize,
    ) -> Self {
        State {
            cache: LruCache::new(NonZeroUsize::new(capacity.max(16)).expect("non-zero")),
            cache_bytes: 0,
            cache_budget,
            counters,
            session: Session::default(),
            others: Default::default(),
            others_stale: false,
            own_shares: Default::default(),
            other_shares: Default::default(),
            lookups: HashMap::new(),
            open: HashMap::new(),
            broken: 0,
            dirs: DirCache::new(dircache_budget),
            atimes_due: Vec::new(),
            epoch: 0,
            inode_hits: 0,
            inode_misses: 0,
            quotas_seen: false,
            deferred: Default::default(),
            pinned: Default::default(),
            owed: Default::default(),
        }
    }

    /// See the field.
    pub fn quotas_seen(&self) -> bool {
        self.quotas_seen
    }

    /// An inode load: answered by the cache (`hit`) or not.
    pub fn note_inode_load(&mut self, hit: bool) {
        if hit {
            self.inode_hits += 1;
        } else {
            self.inode_misses += 1;
        }
    }

    /// (inode loads the cache answered, those it did not; directory-cache
    /// lookups it answered, those it did not).
    pub fn cache_lookups(&self) -> (u64, u64, u64, u64) {
        let (dh, dm) = self.dirs.lookups();
        (self.inode_hits, self.inode_misses, dh, dm)
    }

    /// See the field.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Something cached may now be older than the store (another daemon's
    /// change): reads made without the lock meanwhile are dropped.
    pub fn bump_epoch(&mut self) {
        self.epoch += 1;
    }

    /// The directory cache.
    pub fn dirs(&mut self) -> &mut DirCache {
        &mut self.dirs
    }

    /// (directories, bytes, budget) of the directory cache.
    pub fn dir_figures(&self) -> (usize, usize, usize) {
        self.dirs.figures()
    }

    /// `have - take`, or 0 and a loud report if `take` is more than there
    /// is (see the module comment).
    fn sub(&mut self, what: &str, ino: u64, have: u64, take: u64) -> u64 {
        if take > have {
            self.broken += 1;
            tracing::error!(
                what,
                ino,
                have,
                take,
                "INTERNAL ERROR: a count would go below zero; kept at zero"
            );
            debug_assert!(take <= have, "{what} of inode {ino}: {have} - {take}");
        }
        have.saturating_sub(take)
    }

    /// A link count less one, loudly kept at zero (see [`State::sub`]).
    pub fn drop_link(&mut self, ino: u64, nlink: u32) -> u32 {
        self.sub("link count", ino, u64::from(nlink), 1) as u32
    }

    /// An inode's count of overflow xattr records less one, likewise.
    pub fn drop_overflow(&mut self, ino: u64, overflow: u32) -> u32 {
        self.sub("overflow xattrs", ino, u64::from(overflow), 1) as u32
    }

    /// How many impossible counts were met since the mount.
    pub fn broken_counts(&self) -> u64 {
        self.broken
    }

    // ---- the inode cache --------------------------------------------------

    pub fn is_cached(&self, ino: u64) -> bool {
        self.cache.contains(&ino) || self.pinned.contains_key(&ino)
    }

    pub fn cached(&mut self, ino: u64) -> Option<&mut Cached> {
        match self.cache.get_mut(&ino) {
            Some(c) => Some(c),
            None => self.pinned.get_mut(&ino),
        }
    }

    pub fn cache_put(&mut self, ino: u64, c: Cached) {
        self.quotas_seen |= !c.inode.quota.is_none();
        if let Some(old) = self.pinned.get_mut(&ino) {
            *old = c;
            return;
        }
        self.cache_bytes += cached_cost(&c);
        // `push` hands back the entry it replaced or the one it evicted.
        if let Some((k, old)) = self.cache.push(ino, c) {
            self.cache_bytes -= cached_cost(&old);
            self.keep_if_deferred(k, ino, old);
        }
        self.cache_trim();
    }

    /// Changes a cached entry in place; false if it is not cached.
    pub fn cache_update(&mut self, ino: u64, f: impl FnOnce(&mut Cached)) -> bool {
        let Some(c) = self.cache.get_mut(&ino) else {
            return match self.pinned.get_mut(&ino) {
                Some(c) => {
                    f(c);
                    self.quotas_seen |= !c.inode.quota.is_none();
                    true
                }
                None => false,
            };
        };
        let before = cached_cost(c);
        f(c);
        self.quotas_seen |= !c.inode.quota.is_none();
        let after = cached_cost(c);
        self.cache_bytes = self.cache_bytes + after - before;
        self.cache_trim();
        true
    }

    pub fn cache_pop(&mut self, ino: u64) {
        self.epoch += 1;
        self.deferred.remove(&ino);
        self.pinned.remove(&ino);
        if let Some(old) = self.cache.pop(&ino) {
            self.cache_bytes -= cached_cost(&old);
        }
    }

    /// Evicts least recently used entries beyond the byte budget, keeping
    /// the most recent one whatever its size.
    fn cache_trim(&mut self) {
        while self.cache_bytes > self.cache_budget && self.cache.len() > 1 {
            match self.cache.pop_lru() {
                Some((k, old)) => {
                    self.cache_bytes -= cached_cost(&old);
                    self.keep_if_deferred(k, 0, old);
                }
                None => break,
            }
        }
    }

    /// An entry leaving the cache (`k`, not the one `put` replaces): kept
    /// in `pinned` while its record waits to be written.
    fn keep_if_deferred(&mut self, k: u64, put: u64, old: Cached) {
        if k != put && self.deferred.contains(&k) {
            self.pinned.insert(k, old);
        }
    }

    // ---- deferred records -------------------------------------------------

    /// `dir`'s ancestors owe `w` more to their recursive counts.
    pub fn owe(&mut self, dir: u64, w: super::stats::Weight) {
        self.owed.entry(dir).or_default().add(w);
    }

    pub fn has_owed(&self) -> bool {
        !self.owed.is_empty()
    }

    /// Everything owed, by directory; none after.
    pub fn take_owed(&mut self) -> Vec<(u64, super::stats::Weight)> {
        self.owed.drain().collect()
    }

    /// What `dir`'s ancestors owe for it, if anything; none after.
    pub fn take_owed_of(&mut self, dir: u64) -> Option<super::stats::Weight> {
        if self.owed.is_empty() {
            return None;
        }
        self.owed.remove(&dir)
    }

    /// The cached entry of `ino` (which must be cached) was changed in
    /// place: its record is written by the next [`State::take_deferred`].
    pub fn defer(&mut self, ino: u64) {
        debug_assert!(self.is_cached(ino), "deferred inode {ino} not cached");
        self.deferred.insert(ino);
    }

    /// A record of `ino` as cached now was handed to the store.
    pub fn written(&mut self, ino: u64) {
        if !self.deferred.is_empty() {
            self.deferred.remove(&ino);
        }
    }

    /// The records of every deferred inode, as cached now; none is
    /// deferred after.
    pub fn take_deferred(&mut self) -> Vec<crate::meta::Write> {
        let mut w = Vec::with_capacity(self.deferred.len());
        for ino in std::mem::take(&mut self.deferred) {
            let c = match self.cache.peek(&ino) {
                Some(c) => c,
                None => match self.pinned.get(&ino) {
                    Some(c) => c,
                    None => continue,
                },
            };
            let key = crate::format::keys::inode(ino);
            w.push((key.to_vec(), Some(c.inode.encode(&key))));
        }
        if !self.pinned.is_empty() {
            // Their records are in the store now; a read of an older one
            // made without the lock meanwhile must not come back in.
            self.epoch += 1;
            self.pinned.clear();
        }
        w
    }

    pub fn set_spill(&mut self, ino: u64, set: Spill) {
        self.cache_update(ino, |c| c.spill = Some(set));
    }

    /// The inode numbers cached now.
    #[cfg(test)]
    pub fn cached_inos(&self) -> Vec<u64> {
        self.cache.iter().map(|(&ino, _)| ino).collect()
    }

    /// (bytes charged, sum of the entries' costs): equal, by the invariant.
    #[cfg(test)]
    pub fn cache_accounting(&self) -> (usize, usize) {
        let sum = self.cache.iter().map(|(_, c)| cached_cost(c)).sum();
        (self.cache_bytes, sum)
    }

    pub fn cache_clear(&mut self) {
        self.epoch += 1;
        for &ino in &self.deferred {
            if let Some(c) = self.cache.pop(&ino) {
                self.pinned.insert(ino, c);
            }
        }
        self.cache.clear();
        self.cache_bytes = 0;
        self.dirs.clear();
        self.other_shares.clear();
    }

    /// (inodes, capacity, bytes, byte budget).
    pub fn cache_figures(&self) -> (usize, usize, usize, usize) {
        (
            self.cache.len(),
            self.cache.cap().get(),
            self.cache_bytes,
            self.cache_budget,
        )
    }

    // ---- counters -----------------------------------------------------------

    /// The counters as the store holds them (another daemon changed them).
    pub fn set_counters(&mut self, c: Counters) {
        self.counters = c;
    }

    /// Access times due on a shared volume, to write under the lease.
    pub fn atimes_due(&mut self) -> &mut Vec<(u64, crate::format::inode::Timestamp)> {
        &mut self.atimes_due
    }

    /// The inode number the next new inode gets (not yet taken): the next
    /// of this session's block, or the first of the block it will reserve.
    pub fn next_ino(&self) -> u64 {
        let s = &self.session;
        if s.next < s.own.end {
            s.next
        } else {
            self.counters.next_ino
        }
    }

    /// Takes [`State::next_ino`] for a new inode, reserving a new block
    /// first when this session's is used up.
    pub fn take_ino(&mut self) -> u64 {
        if self.session.next >= self.session.own.end {
            let start = self.counters.next_ino;
            let end = start.saturating_add(INO_BLOCK);
            self.counters.next_ino = end;
            self.session.own.start = start;
            self.session.own.end = end;
            self.session.next = start;
            self.session.reserved = true;
        }
        let ino = self.session.next;
        self.session.next += 1;
        self.session.own.inodes += 1;
        self.session.dirty = true;
        ino
    }

    /// One live inode fewer.
    pub fn inode_freed(&mut self, _ino: u64) {
        self.session.own.inodes -= 1;
        self.session.dirty = true;
    }

    /// The inodes in use: `N`'s count and every session's share.
    pub fn inodes_in_use(&self) -> u64 {
        let shares: i64 =
            self.session.own.inodes + self.others.values().map(|o| o.inodes).sum::<i64>();
        self.counters.inodes.saturating_add_signed(shares)
    }

    /// Starts this daemon's session `id` from its counters record, if one
    /// is left (a crash, or an id used again): its share of the count
    /// goes on; its block does not (numbers in it may be taken).
    pub fn begin_session(&mut self, id: u64, left: Option<SessionCounters>) {
        self.session = Session {
            id,
            own: SessionCounters {
                inodes: left.map_or(0, |l| l.inodes),
                ..Default::default()
            },
            next: 0,
            reserved: false,
            dirty: left.is_some(),
        };
    }

    pub fn session_id(&self) -> u64 {
        self.session.id
    }

    /// This session's block of inode numbers, `[next, end)` still to take.
    pub fn own_block(&self) -> std::ops::Range<u64> {
        self.session.next..self.session.own.end
    }

    /// The records a change that took or freed inode numbers writes:
    /// this session's counters record and, after a new block was
    /// reserved, `N` (which then says the block it begins at).
    pub fn counters_due(
        &mut self,
    ) -> (
        Option<SessionCounters>,
        Option<Counters>,
        Option<std::ops::Range<u64>>,
    ) {
        let s = &mut self.session;
        let own = std::mem::take(&mut s.dirty).then_some(s.own);
        let reserved = std::mem::take(&mut s.reserved);
        let n = reserved.then_some(self.counters);
        let block = reserved.then_some(s.own.start..s.own.end);
        (own, n, block)
    }

    /// Folds a session's share into `N` (its clean end, or a recovery
    /// after it): the record goes, `N` is written. For this session, it
    /// also gives back what is left of its block when no block was
    /// reserved after it.
    pub fn fold_session(&mut self, id: u64) -> Option<Counters> {
        if id == self.session.id {
            let s = &mut self.session;
            let folded = s.own.inodes;
            if s.next < s.own.end && self.counters.next_ino == s.own.end {
                self.counters.next_ino = s.next;
            }
            s.own = SessionCounters::default();
            s.next = 0;
            s.dirty = false;
            s.reserved = false;
            self.counters.inodes = self.counters.inodes.saturating_add_signed(folded);
            return Some(self.counters);
        }
        let other = self.others.remove(&id)?;
        self.counters.inodes = self.counters.inodes.saturating_add_signed(other.inodes);
        Some(self.counters)
    }

    /// Other sessions' counters records changed since they were read.
    pub fn mark_others_stale(&mut self) {
        self.others_stale = true;
    }

    pub fn others_stale(&self) -> bool {
        self.others_stale
    }

    /// Every other session's counters record, as just read.
    pub fn set_others(&mut self, others: std::collections::BTreeMap<u64, SessionCounters>) {
        self.others = others;
        self.others.remove(&self.session.id);
        self.others_stale = false;
    }

    // ---- shares of directory statistics (shared volumes) -----------------

    /// Adds `d` to this session's share of `dir`; the share now.
    pub fn add_own_share(&mut self, dir: u64, d: &DirShare) -> DirShare {
        let s = self.own_shares.entry(dir).or_default();
        s.add(d);
        *s
    }

    pub fn own_share(&self, dir: u64) -> Option<&DirShare> {
        self.own_shares.get(&dir)
    }

    /// The directories this session holds a share of.
    pub fn own_share_dirs(&self) -> Vec<u64> {
        self.own_shares.keys().copied().collect()
    }

    /// The other sessions' shares of `dir`, summed; `None`: not read yet.
    pub fn other_shares_of(&self, dir: u64) -> Option<DirShare> {
        self.other_shares.get(&dir).map(|m| {
            let mut sum = DirShare::default();
            for s in m.values() {
                sum.add(s);
            }
            sum
        })
    }

    /// The other sessions' shares of `dir`, as read from the store.
    pub fn set_other_shares(
        &mut self,
        dir: u64,
        shares: std::collections::BTreeMap<u64, DirShare>,
    ) {
        self.other_shares.insert(dir, shares);
    }

    /// Session `session`'s share of `dir` as the store holds it now (a
    /// change another daemon made); `None`: gone. This session's own
    /// share goes only when another removed the directory.
    pub fn set_share(&mut self, dir: u64, session: u64, share: Option<DirShare>) {
        if session == self.session.id {
            if share.is_none() {
                self.own_shares.remove(&dir);
            }
            return;
        }
        if let Some(m) = self.other_shares.get_mut(&dir) {
            match share {
                Some(s) => {
                    m.insert(session, s);
                }
                None => {
                    m.remove(&session);
                }
            }
        }
    }

    /// The other sessions' shares of `dir` are read again when wanted.
    pub fn forget_other_shares(&mut self, dir: u64) {
        self.other_shares.remove(&dir);
    }

    /// Directory `dir` is gone, and every share of it.
    pub fn drop_shares(&mut self, dir: u64) {
        self.own_shares.remove(&dir);
        self.other_shares.remove(&dir);
    }

    /// Other sessions' counters records, as last read.
    pub fn other_sessions(&self) -> &std::collections::BTreeMap<u64, SessionCounters> {
        &self.others
    }

    // ---- the kernel's references ------------------------------------------

    /// The kernel now holds one more reference to `ino`.
    pub fn add_lookup(&mut self, ino: u64) {
        *self.lookups.entry(ino).or_insert(0) += 1;
    }

    /// The kernel dropped `n` references to `ino`; true if none is left.
    /// An inode with no recorded reference is left alone (the root, which
    /// the kernel holds without a lookup).
    pub fn forget(&mut self, ino: u64, n: u64) -> bool {
        let Some(&have) = self.lookups.get(&ino) else {
            return false;
        };
        let left = self.sub("kernel references", ino, have, n);
        if left == 0 {
            self.lookups.remove(&ino);
            true
        } else {
            self.lookups.insert(ino, left);
            false
        }
    }

    /// Whether the kernel may cache `ino` (it looked it up, or it is the
    /// root, which it holds without a lookup).
    pub fn is_known(&self, ino: u64) -> bool {
        ino == crate::core::volume::ROOT_INO || self.lookups.contains_key(&ino)
    }

    /// Every inode the kernel may cache.
    pub fn referenced_inodes(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.lookups.keys().copied().collect();
        v.push(crate::core::volume::ROOT_INO);
        v
    }

    /// Whether the kernel or an open handle still refers to `ino`.
    pub fn referenced(&self, ino: u64) -> bool {
        self.lookups.contains_key(&ino) || self.open.contains_key(&ino)
    }

    /// `ino` is gone: no references are tracked for it any more.
    pub fn drop_references(&mut self, ino: u64) {
        self.lookups.remove(&ino);
    }

    // ---- open files -----------------------------------------------------------

    /// Registers a handle of `ino` opened on `file`; true if it is the first.
    /// Whether the handles of open inode `ino` are bounded by a quota
    /// (see the field).
    pub fn is_bounded(&self, ino: u64) -> bool {
        self.open.get(&ino).is_some_and(|o| o.bounded)
    }

    /// Decided at the first open of `ino`.
    pub fn set_bounded(&mut self, ino: u64, bounded: bool) {
        if let Some(o) = self.open.get_mut(&ino) {
            o.bounded = bounded;
        }
    }

    pub fn open_handle(&mut self, ino: u64, file: &Arc<File>, write: bool) -> bool {
        let o = self.open.entry(ino).or_default();
        o.handles += 1;
        let first = o.any.is_none();
        o.any.get_or_insert_with(|| Arc::clone(file));
        if write {
            if o.writers == 0 {
                o.backing = Some(Arc::clone(file));
            }
            o.writers += 1;
        }
        first
    }

    /// Unregisters a handle of `ino`.
    pub fn close_handle(&mut self, ino: u64, write: bool) -> Closed {
        let Some(o) = self.open.get(&ino) else {
            self.sub("open handles", ino, 0, 1);
            return Closed {
                last_writer: None,
                last: false,
            };
        };
        let (handles, writers) = (u64::from(o.handles), u64::from(o.writers));
        let handles = self.sub("open handles", ino, handles, 1) as u32;
        let writers = if write {
            self.sub("open writers", ino, writers, 1) as u32
        } else {
            writers as u32
        };
        let o = self.open.get_mut(&ino).expect("checked above");
        o.handles = handles;
        o.writers = writers;
        let last_writer = if write && writers == 0 {
            o.backing.take()
        } else {
            None
        };
        let last = handles == 0;
        if last {
            self.open.remove(&ino);
        }
        Closed { last_writer, last }
    }

    /// The backing descriptor writers share, while a writer has `ino` open.
    pub fn writer_backing(&self, ino: u64) -> Option<Arc<File>> {
        self.open.get(&ino).and_then(|o| o.backing.clone())
    }

    /// How many handles have `ino` open for writing.
    pub fn writers(&self, ino: u64) -> u32 {
        self.open.get(&ino).map_or(0, |o| o.writers)
    }

    /// A backing descriptor of `ino` while any handle has it open.
    pub fn any_backing(&self, ino: u64) -> Option<Arc<File>> {
        self.open.get(&ino).and_then(|o| o.any.clone())
    }
}
