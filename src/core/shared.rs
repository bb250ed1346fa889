//! What the core does on a volume several daemons serve at once
//! (`meta::Shared`, `docs/multi-mount.md`): drop what it caches of other
//! daemons' changes and tell the kernel, take the write lease on the paths
//! that change metadata without being admitted (closing, forgetting, access
//! times), and reclaim what daemons that died held.
//!
//! Kernel notifications go through a queue to a thread of the FUSE
//! adapter's: the kernel takes a directory's lock to drop one of its
//! entries, and a request holding that lock may be waiting for this
//! daemon, so no thread that serves requests or holds the state lock may
//! wait for the kernel.

use std::sync::{Arc, Weak};

use super::error::{CoreError, Result};
use super::state::State;
use super::{Fs, keys};
use crate::format::superblock::Counters;
use crate::meta::Changes;

/// How often a daemon looks for daemons of its volume that died.
const REAP_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// A kernel cache entry to drop.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Inval {
    /// An inode's attributes and cached pages.
    Inode(u64),
    /// Name `name` in directory `parent`.
    Entry(u64, Vec<u8>),
}

/// Where the core sends kernel invalidations (the FUSE adapter's queue).
pub type KernelInval = Box<dyn Fn(Vec<Inval>) + Send + Sync>;

impl Fs {
    /// Whether other daemons may serve this volume at the same time.
    pub fn is_shared(&self) -> bool {
        self.store.is_shared()
    }

    /// Starts following other daemons' changes (a shared volume's
    /// doorbell); call once, when the mount serves. Caches filled before
    /// (by mount-time recovery) are dropped: changes made meanwhile could
    /// have been missed.
    pub fn follow_others(self: &Arc<Self>, kernel: KernelInval) -> Result<()> {
        let Some(shared) = self.store.engine().shared() else {
            return Ok(());
        };
        let _ = self.kernel.set(kernel);
        let weak: Weak<Fs> = Arc::downgrade(self);
        self.store.on_changes(Box::new(move |ch| {
            if let Some(fs) = weak.upgrade() {
                fs.apply_changes(ch);
            }
        }));
        {
            let mut st = self.state.lock();
            st.cache_clear();
            self.reload_counters(&mut st);
            st.mark_others_stale();
        }
        let weak: Weak<Fs> = Arc::downgrade(self);
        shared.watch(Box::new(move |epoch| {
            if let Some(fs) = weak.upgrade() {
                fs.store.rang(epoch);
            }
        }))?;
        let weak: Weak<Fs> = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("safs-reaper".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(REAP_EVERY);
                    let Some(fs) = weak.upgrade() else { return };
                    if fs.closed.load(std::sync::atomic::Ordering::SeqCst) {
                        return;
                    }
                    if let Err(e) = fs.reap() {
                        tracing::warn!(error = %e, "cannot reclaim what a daemon that died held; retrying");
                    }
                }
            })
            .map_err(CoreError::Io)?;
        Ok(())
    }

    /// Drops what this daemon caches of `ch`'s keys (everything, if the
    /// change log did not reach back far enough), then queues the kernel's.
    fn apply_changes(&self, ch: &Changes) {
        let mut st = self.state.lock();
        st.bump_epoch();
        let mut kernel = Vec::new();
        match &ch.keys {
            None => {
                kernel.extend(st.referenced_inodes().into_iter().map(Inval::Inode));
                st.cache_clear();
                self.forget_contents(None);
                self.reload_counters(&mut st);
                st.mark_others_stale();
            }
            Some(changed) => {
                for k in changed {
                    self.drop_cached(&mut st, k, &mut kernel);
                }
            }
        }
        drop(st);
        if kernel.is_empty() {
            return;
        }
        let mut once = std::collections::HashSet::new();
        kernel.retain(|i| once.insert(i.clone()));
        if let Some(send) = self.kernel.get() {
            send(kernel);
        }
    }

    fn drop_cached(&self, st: &mut State, key: &[u8], kernel: &mut Vec<Inval>) {
        let Some(&prefix) = key.first() else { return };
        let Some(ino) = keys::key_ino(key) else {
            if key == keys::COUNTERS {
                self.reload_counters(st);
            }
            return;
        };
        match prefix {
            // Another node changed the contents: fetched again at the next
            // open (close-to-open), and the kernel's pages go.
            keys::P_BLOCK => {
                self.forget_contents(Some(ino));
                if st.is_known(ino) {
                    kernel.push(Inval::Inode(ino));
                }
            }
            keys::P_INODE | keys::P_SPILL | keys::P_OVERFLOW | keys::P_SYMLINK => {
                st.cache_pop(ino);
                if st.is_known(ino) {
                    kernel.push(Inval::Inode(ino));
                }
            }
            keys::P_DIRENT => {
                st.dirs().forget(ino);
                if st.is_known(ino) {
                    match self.keyspace.entry_name(key) {
                        Ok(name) => kernel.push(Inval::Entry(ino, name)),
                        Err(_) => kernel.push(Inval::Inode(ino)),
                    }
                }
            }
            keys::P_DIRINDEX => st.dirs().forget(ino),
            // Another session's counters (`ino` is its id): read again
            // when the count or the blocks are wanted, not on this thread
            // (a round trip under the state lock per batch of another's).
            keys::P_SESSION if ino != st.session_id() => st.mark_others_stale(),
            // A session's share of directory `ino`'s statistics; the
            // others' are read again when wanted.
            keys::P_SHARE => match keys::share_session(key) {
                // Another's fold, or a removal of the directory, deleted
                // this session's share: it starts again from nothing. Its
                // own commits can come back here too (the record is
                // there then, and the share stays).
                Some(s) if s == st.session_id() => match self.store.get(key) {
                    Ok(None) => st.set_share(ino, s, None),
                    Ok(Some(_)) => {}
                    Err(e) => {
                        tracing::error!(dir = ino, error = %e, "cannot tell whether this mount's share of a directory's statistics was folded");
                    }
                },
                _ => st.forget_other_shares(ino),
            },
            _ => {}
        }
    }

    /// The counters as the store holds them now (another daemon may have
    /// taken inode numbers).
    fn reload_counters(&self, st: &mut State) {
        let fresh = self
            .store
            .get(keys::COUNTERS)
            .ok()
            .flatten()
            .and_then(|rec| Counters::decode(&rec).ok());
        match fresh {
            Some(c) => st.set_counters(c),
            None => {
                tracing::error!("cannot reload the volume's counters after another mount's change")
            }
        }
    }

    /// Frees `ino` if nothing refers to it any more, taking the write lease
    /// first on a shared volume when it would.
    pub(super) fn free_if_unused(&self, ino: u64) -> Result<()> {
        if self.is_shared() {
            let mut st = self.state.lock();
            if st.referenced(ino) {
                return Ok(());
            }
            let unlinked = match self.load_opt(&mut st, ino)? {
                Some(c) => c.inode.nlink == 0,
                None => {
                    // Freed by another node while this one held it.
                    drop(st);
                    self.drop_freed_copy(ino);
                    return Ok(());
                }
            };
            if !unlinked {
                return Ok(());
            }
            drop(st);
            let _lease = self.store.lease()?;
            let mut st = self.state.lock();
            return self.maybe_free(&mut st, ino);
        }
        let mut st = self.state.lock();
        self.maybe_free(&mut st, ino)
    }

    /// On a shared volume, access times found due while the write lease was
    /// not held are kept here and written under it (see `touch_atime`).
    pub(super) fn flush_atimes(&self) {
        if !self.is_shared() {
            return;
        }
        if self.state.lock().atimes_due().is_empty() {
            return;
        }
        let lease = match self.store.lease() {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot update access times");
                return;
            }
        };
        let mut st = self.state.lock();
        for (ino, at) in std::mem::take(st.atimes_due()) {
            if let Err(e) = self.touch_atime_now(&mut st, ino, at) {
                if !matches!(e, CoreError::NotFound) {
                    tracing::warn!(ino, error = %e, "cannot update an access time");
                }
            }
        }
        drop(st);
        drop(lease);
    }

    /// Mount-time work on a shared volume, under the write lease: whether
    /// the volume needs the unclean-stop recovery (a daemon died, or this
    /// is the only one and the last did not stop cleanly) and from when,
    /// and which orphan markers to reclaim: those of dead sessions, and
    /// untagged ones when this daemon is alone.
    pub(super) fn shared_recovery_plan(&self, unclean_alone: Option<i64>) -> Result<SharedPlan> {
        let shared = self.store.engine().shared().ok_or(CoreError::Invalid)?;
        let dead = shared.dead_sessions()?;
        let live = shared.live_sessions()?;
        let alone = live.len() <= 1;
        let since = dead
            .iter()
            .map(|&(_, since)| since)
            .chain(unclean_alone.filter(|_| alone))
            .min();
        Ok(SharedPlan {
            dead: dead.into_iter().map(|(id, _)| id).collect(),
            live,
            alone,
            unclean_since: since,
        })
    }

    /// What a daemon that died left (see `reclaim`), when one did: the
    /// survivors' part. Runs every [`REAP_EVERY`] from `follow_others`.
    fn reap(&self) -> Result<()> {
        let Some(shared) = self.store.engine().shared() else {
            return Ok(());
        };
        if shared.dead_sessions()?.is_empty() {
            return Ok(());
        }
        let _lease = self.store.lease()?;
        self.reclaim(None)
    }

    /// Forgets dead sessions once what they held is reclaimed.
    pub(super) fn bury(&self, plan: &SharedPlan) -> Result<()> {
        let Some(shared) = self.store.engine().shared() else {
            return Ok(());
        };
        for &id in &plan.dead {
            if shared.bury(id)? {
                tracing::info!(session = id, "reclaimed what a daemon that died held");
            }
        }
        Ok(())
    }

    /// Whether this daemon is the only one serving the volume (always, on
    /// volumes one daemon serves).
    pub(super) fn alone(&self) -> bool {
        match self.store.engine().shared() {
            Some(s) => s.alone().unwrap_or(false),
            None => true,
        }
    }

    /// The session orphan markers are tagged with (0: none).
    pub(super) fn session_id(&self) -> u64 {
        self.store.engine().shared().map_or(0, |s| s.session_id())
    }
}

/// See [`Fs::shared_recovery_plan`].
pub(super) struct SharedPlan {
    pub dead: Vec<u64>,
    /// Sessions alive now, this one among them.
    pub live: Vec<u64>,
    pub alone: bool,
    pub unclean_since: Option<i64>,
}

impl SharedPlan {
    /// Whether the orphan marker tagged `tag` is this mount's to reclaim.
    pub fn reclaims(&self, tag: Option<u64>) -> bool {
        match tag {
            // A session that is not alive: dead, or already forgotten.
            Some(id) => !self.live.contains(&id),
            None => self.alone,
        }
    }
}
