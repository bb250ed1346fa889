//! The filesystem core: POSIX namespace semantics, SA xattr tiers, the
//! always-current inode cache and group commit, independent of FUSE and of
//! the engine.
//!
//! Every operation runs under the one `state` lock: it reads what it needs
//! (inode cache first, then the store overlay, then the engine), builds its
//! writes, updates the cache and hands the writes to the store as one unit,
//! then returns. Durability is the store's business (group commit); only
//! `fsync`-like calls and `sync` mounts wait for it.
//!
//! Lock order: `state` before `handles`; the store's own lock is innermost
//! and is never held across a call back into the core.

mod acl;
mod cold;
pub mod creds;
pub mod crypto;
mod data;
mod dircache;
pub mod error;
mod files;
pub mod ids;
mod locks;
mod namespace;
mod quota;
pub(crate) mod remote;
mod shared;
mod state;
mod stats;
mod store;
pub mod tiers;
pub mod volume;
mod xattr;

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use parking_lot::Mutex;

/// The times core's attributes carry (the record format's own type: the
/// adapter above names it through core, not through `format`).
pub use crate::format::inode::Timestamp;
pub use creds::Ctx;
/// For fsck: a truncate of sealed contents a killed daemon left half done.
pub(crate) use data::DataStore;
pub use error::{CoreError, Result};
pub use files::{Handle, OpenMode};
pub use ids::{Cookie, Fh, Generation, Ino};
pub use namespace::{DirEntry, RenameFlags, SetAttr, Statfs, TimeSet};
pub use shared::{Inval, KernelInval};
pub use store::{Health, LeaseFigures, Started};

use crate::format::inode::Inode;
use crate::format::keys;
use crate::format::shares::DirShare;
use crate::format::superblock::{MountState, SessionCounters, Superblock};
use crate::meta::{MetaStore, Write};
use crypto::{Keyspace, SealedStore};
use state::{Cached, State};
use store::{Admit, HoldPolicy, Store, Ticket};
use volume::Layout;

/// Readdir cookies 1 and 2 are "." and ".."; real entries start here.
pub const FIRST_COOKIE: u64 = 3;

/// Attributes as served to the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub size: u64,
    pub blocks: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub crtime: Timestamp,
    pub generation: Generation,
    /// A writer has the file open: its size and times can change where the
    /// daemon does not see it (writes through a shared mapping under
    /// passthrough), so the kernel should not keep these for long.
    pub open_for_write: bool,
}

impl Attr {
    fn of(ino: u64, i: &Inode) -> Self {
        Attr {
            ino: Ino(ino),
            mode: i.mode,
            nlink: i.nlink,
            uid: i.uid,
            gid: i.gid,
            rdev: i.rdev,
            size: if i.is_dir() {
                dir_size(i.next_cookie)
            } else {
                i.size
            },
            blocks: if i.is_dir() {
                dir_size(i.next_cookie) / 512
            } else {
                i.blocks
            },
            atime: i.atime,
            mtime: i.mtime,
            ctime: i.ctime,
            crtime: i.crtime,
            generation: Generation(i.generation),
            open_for_write: false,
        }
    }
}

pub struct Options {
    /// Longest a metadata change waits before its batch is committed.
    pub commit_interval: Duration,
    /// Commit every operation before replying.
    pub sync: bool,
    /// Commit every change to a directory (create, link, unlink, rename)
    /// before replying.
    pub dirsync: bool,
    /// Shared volumes: commits nobody waits to be durable are only made
    /// visible, and durable soon after (see `store`).
    pub async_commit: bool,
    /// When reads update access times.
    pub atime: Atime,
    /// Inodes kept decoded in memory, at most...
    pub inode_cache: usize,
    /// ...and at most this many bytes of them (attributes, inline and spill
    /// xattr sets), so memory stays bounded whatever the xattr sizes.
    pub cache_bytes: usize,
    pub read_only: bool,
    /// The keys of an encrypted volume (see `crypto`); `None` for a plain one.
    pub keys: Option<Arc<crypto::VolumeKeys>>,
    /// The directory cache (see `dircache`): `None` turns it on for
    /// encrypted volumes only.
    pub dircache: Option<bool>,
    /// How long a call to the object store may take (volumes with one).
    pub data_timeout: Duration,
    /// The most bytes closed files' cached contents may take on the disk
    /// under the volume (volumes whose contents are in an object store).
    pub data_cache_bytes: u64,
}

/// The default bound of a node's cache of an object store's contents
/// (JuiceFS's default too).
pub const DEFAULT_DATA_CACHE: u64 = 100 << 30;

impl Default for Options {
    fn default() -> Self {
        Options {
            commit_interval: Duration::from_millis(5),
            sync: false,
            dirsync: false,
            async_commit: false,
            atime: Atime::default(),
            inode_cache: 262_144,
            cache_bytes: 256 << 20,
            read_only: false,
            keys: None,
            dircache: None,
            data_timeout: crate::objstore::Limits::default().timeout,
            data_cache_bytes: DEFAULT_DATA_CACHE,
        }
    }
}

/// Access-time updates, as the kernel's mount options define them. FUSE
/// inodes are `S_NOATIME` in the kernel: the daemon keeps access times.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Atime {
    pub mode: AtimeMode,
    /// `nodiratime`: listing a directory leaves its atime alone.
    pub no_dirs: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtimeMode {
    /// `noatime`: reads never update atime.
    Never,
    /// `relatime` (the kernel's default): a read updates atime when it is
    /// not newer than mtime or ctime, or is a day old.
    #[default]
    Relative,
    /// `strictatime`: every read updates atime.
    Always,
}

impl Atime {
    /// Whether a read at `at` of `inode` moves its atime there.
    fn due(&self, inode: &Inode, at: Timestamp) -> bool {
        if (inode.is_dir() && self.no_dirs) || at <= inode.atime {
            return false;
        }
        match self.mode {
            AtimeMode::Never => false,
            AtimeMode::Always => true,
            AtimeMode::Relative => {
                inode.atime <= inode.mtime
                    || inode.atime <= inode.ctime
                    || at.sec - inode.atime.sec >= 24 * 3600
            }
        }
    }
}

/// What the inode cache holds now, and the most it may hold.
#[derive(Clone, Copy, Debug)]
pub struct CacheFigures {
    pub inodes: usize,
    pub inode_capacity: usize,
    pub bytes: usize,
    pub byte_budget: usize,
    /// The directory cache: directories held, bytes, budget (0: off).
    pub dirs: usize,
    pub dir_bytes: usize,
    pub dir_budget: usize,
    /// Inode loads the inode cache answered, and those it did not.
    pub inode_hits: u64,
    pub inode_misses: u64,
    /// Directory-cache lookups answered, and those it did not.
    pub dir_hits: u64,
    pub dir_misses: u64,
}

pub struct Fs {
    layout: Layout,
    sb: Superblock,
    store: Arc<Store>,
    /// Where records live: names in keys encrypted on encrypted volumes.
    keyspace: Keyspace,
    data: DataStore,
    budget: usize,
    opts: Options,
    /// Shared with the committer, which takes deferred records under it
    /// (see `store`).
    state: Arc<Mutex<State>>,
    handles: Mutex<HashMap<Fh, Arc<Handle>>>,
    /// Rung when a handle goes (see [`Fs::await_exited_writers`]).
    released: parking_lot::Condvar,
    next_fh: AtomicU64,
    /// The mount's atime rules; a remount changes them.
    atime: Mutex<Atime>,
    closed: std::sync::atomic::AtomicBool,
    /// Writes bypass the daemon (FUSE passthrough) and the kernel leaves
    /// clearing set-id bits to it (FUSE_HANDLE_KILLPRIV_V2): a writer's
    /// open clears them instead (see `files.rs`).
    setid_at_open: std::sync::atomic::AtomicBool,
    /// Shared volumes: where kernel invalidations go (see `shared`).
    kernel: std::sync::OnceLock<KernelInval>,
    /// Volumes whose contents are in an object store (see `remote`).
    remote: Option<remote::Remote>,
    /// Whether cold lookups read spill pages with the inode (see `cold`).
    spill_hint: cold::SpillHint,
    /// Directories a cold lookup missed in (see `cold`).
    cold_dirs: cold::ColdDirs,
    /// Where the last spill read ended (see `cold`).
    spill_runs: cold::SpillRuns,
}

impl Fs {
    /// Opens the volume at `dir` on `engine`, reclaims inodes left unlinked
    /// but open by a previous run, and reconciles files that were open for
    /// writing when it stopped.
    pub fn mount(
        dir: &Path,
        engine: Arc<dyn MetaStore>,
        sb: Superblock,
        opts: Options,
    ) -> Result<Self> {
        let layout = Layout::new(dir);
        let data = DataStore::new(&layout.data(), opts.keys.clone());
        if sb.is_encrypted() != opts.keys.is_some() {
            return Err(CoreError::Keys(if sb.is_encrypted() {
                "the volume is encrypted: it needs its keys"
            } else {
                "the volume is not encrypted: keys were given"
            }));
        }
        let (engine, keyspace): (Arc<dyn MetaStore>, Keyspace) = match &opts.keys {
            Some(k) => (
                Arc::new(SealedStore::new(engine, Arc::clone(k))),
                Keyspace::encrypted(Arc::clone(k)),
            ),
            None => (engine, Keyspace::plain()),
        };
        let counters = match volume::read_counters(engine.as_ref()) {
            Ok(c) => c,
            Err(volume::VolumeError::Meta(e)) => return Err(e.into()),
            Err(volume::VolumeError::CorruptCounters(e)) => {
                return Err(CoreError::corrupt(keys::COUNTERS, e));
            }
            Err(_) => {
                return Err(CoreError::corrupt(
                    keys::COUNTERS,
                    crate::format::FormatError::Truncated(0),
                ));
            }
        };
        // Builds before this one kept a `reserve` file instead of holding
        // space inside the metadata file.
        let _ = std::fs::remove_file(layout.root.join("reserve"));
        let hold = (!opts.read_only).then(|| HoldPolicy {
            target: hold_target(&layout.root),
            inline_budget: sb.inline_bytes as usize,
        });
        let remote = if sb.has_object_store() {
            let rec = engine.get(keys::DATA_STORE)?.ok_or_else(|| {
                CoreError::corrupt(keys::DATA_STORE, crate::format::FormatError::Truncated(0))
            })?;
            let url = crate::format::blocks::decode_store(&rec)
                .map_err(|e| CoreError::corrupt(keys::DATA_STORE, e))?;
            Some(remote::Remote::connect(
                &url,
                &layout.data(),
                opts.data_timeout,
                opts.data_cache_bytes,
            )?)
        } else {
            None
        };
        let store = Store::new(engine, opts.commit_interval, hold);
        store.set_async_commit(opts.async_commit);
        let atime = opts.atime;
        // The directory cache: on by default where it saves the most (names
        // to encrypt, records to open; on a shared volume, a round trip to
        // the database per lookup the kernel's shorter TTL sends), a share
        // of the cache budget.
        let dircache = opts
            .dircache
            .unwrap_or(sb.is_encrypted() || store.is_shared());
        let state = State::new(
            opts.inode_cache,
            opts.cache_bytes,
            counters,
            if dircache { opts.cache_bytes / 2 } else { 0 },
        );
        let mut fs = Fs {
            layout,
            budget: sb.inline_bytes as usize,
            sb,
            store,
            keyspace,
            data,
            opts,
            state: Arc::new(Mutex::new(state)),
            handles: Mutex::new(HashMap::new()),
            released: parking_lot::Condvar::new(),
            next_fh: AtomicU64::new(1),
            atime: Mutex::new(atime),
            closed: std::sync::atomic::AtomicBool::new(false),
            setid_at_open: std::sync::atomic::AtomicBool::new(false),
            kernel: std::sync::OnceLock::new(),
            remote,
            spill_hint: cold::SpillHint::default(),
            cold_dirs: cold::ColdDirs::default(),
            spill_runs: cold::SpillRuns::default(),
        };
        let state = Arc::clone(&fs.state);
        let store = Arc::downgrade(&fs.store);
        fs.store.set_flusher(Box::new(move |take| {
            // Briefly: the holder may be waiting for the committer, having
            // handed the records over itself (`Fs::wait_durable`).
            let Some(mut st) = state.try_lock_for(Duration::from_millis(1)) else {
                return false;
            };
            let Some(store) = store.upgrade() else {
                return false;
            };
            stats::pay_owed(&store, &mut st, &mut namespace::Work::new());
            take(st.take_deferred());
            true
        }));
        fs.recover()?;
        if fs.remote.is_some() && !fs.opts.read_only {
            // At every mount, not only after an unclean stop: an fsck
            // --repair marks a volume clean without a store to upload to.
            let uploaded = fs.upload_dirty()?;
            fs.store.sync()?;
            if uploaded > 0 {
                tracing::info!(
                    uploaded,
                    "contents changed before the last stop are in the object store"
                );
            }
        }
        if let (Some(r), false) = (&fs.remote, fs.opts.read_only) {
            r.start_deleter(Arc::clone(&fs.store));
            r.start_stager(Arc::clone(&fs.store), fs.layout.data());
        }
        if !fs.opts.read_only {
            fs.sb.features |= crate::format::superblock::FEATURE_SPILL_PAGES
                | crate::format::superblock::FEATURE_SESSION_SHARES;
        }
        if !fs.opts.read_only {
            // On a shared volume only within this session's block: the
            // numbers after it may be another session's.
            let st = fs.state.lock();
            let block = if fs.store.is_shared() {
                st.own_block()
            } else {
                st.next_ino()..u64::MAX
            };
            drop(st);
            fs.data.start_pool(block);
        }
        Ok(fs)
    }

    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    pub fn volume_dir(&self) -> &Path {
        &self.layout.root
    }

    pub fn is_read_only(&self) -> bool {
        self.opts.read_only
    }

    /// Makes every change so far durable.
    pub fn sync(&self) -> Result<()> {
        self.store.sync()
    }

    /// Asks for every change so far to be made durable without waiting
    /// (see [`Fs::wait_synced`]).
    pub fn start_sync(&self) -> Started {
        self.store.start_sync()
    }

    /// Waits until what [`Fs::start_sync`] asked for is durable.
    pub fn wait_synced(&self, started: Started) -> Result<()> {
        self.store.wait_started(started)
    }

    /// Makes every change so far visible to every node (committed, not
    /// necessarily durable: see `store`).
    pub fn sync_visible(&self) -> Result<()> {
        self.store.wait_landed(self.store.applied_seq())
    }

    /// Records a clean unmount, flushes and stops the committer. The `Fs`
    /// must not be used after; a second call does nothing.
    pub fn close(&self) -> Result<()> {
        if self.closed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        // Before the clean mark: a clean volume has no stray backing files.
        self.data.stop_pool();
        let uploaded = self.finish_remote();
        if !self.opts.read_only && !self.is_shared() {
            if let Err(e) = self.reclaim_at_close() {
                tracing::error!(error = %e, "inodes unlinked while open are left to the next mount");
            }
        }
        self.delete_doomed_at_unmount();
        self.hand_over_all(&mut self.state.lock());
        if !self.opts.read_only {
            // Clean only if no other daemon still serves the volume.
            match self.store.lease() {
                Ok(_lease) => {
                    self.fold_own_session();
                    if self.alone() && uploaded {
                        self.set_mount_state(true);
                    }
                }
                Err(e) => tracing::error!(error = %e, "cannot record a clean unmount"),
            }
        }
        let res = self.store.close();
        if res.is_ok() {
            if let Some(s) = self.store.engine().shared() {
                s.leave();
            }
        }
        res
    }

    /// Mount-time recovery. Always: reclaim inodes unlinked while open.
    /// After an unclean stop (the mount state record says "mounted"): bring
    /// every regular file's size up to date from its backing file — data
    /// writes reach backing files before the batch that records them — and
    /// delete backing files whose creating batch never committed. Then
    /// record "mounted", durably, before serving.
    ///
    /// On a shared volume, under the write lease: the recovery runs when a
    /// daemon died (or this one is alone and the last did not stop
    /// cleanly), and only the orphans of dead sessions (and untagged ones,
    /// alone) are reclaimed; other daemons' open files are theirs.
    fn recover(&self) -> Result<()> {
        let _lease = self.store.lease()?;
        let unclean = match self.store.get(keys::MOUNT_STATE)? {
            Some(rec) => {
                let m = MountState::decode(&rec)
                    .map_err(|e| CoreError::corrupt(keys::MOUNT_STATE, e))?;
                (!m.clean).then_some(m.since_ns)
            }
            None => None,
        };
        {
            let mut st = self.state.lock();
            self.load_sessions(&mut st)?;
            if self.is_shared() && !self.opts.read_only {
                // Shares under this session's id left by an earlier one
                // (ids start again in a database loaded from a dump).
                let me = st.session_id();
                self.fold_shares(&mut st, |id| id == me)?;
            }
        }
        if !self.opts.read_only && !self.sb.has_session_shares() {
            // Inode numbers in blocks, counts per session: builds that
            // would take `N` alone for them must refuse the volume.
            let mut sb = self.sb.clone();
            sb.features |= crate::format::superblock::FEATURE_SESSION_SHARES;
            self.store
                .apply(vec![(keys::SUPERBLOCK.to_vec(), Some(sb.encode()))]);
            tracing::info!("volume upgraded: inode numbers are reserved in blocks");
        }
        if !self.opts.read_only && !self.sb.has_spill_pages() {
            // This build may write spill pages past page 0: builds that
            // would not read them must refuse the volume from now on.
            let mut sb = self.sb.clone();
            sb.features |= crate::format::superblock::FEATURE_SPILL_PAGES
                | crate::format::superblock::FEATURE_SESSION_SHARES;
            self.store
                .apply(vec![(keys::SUPERBLOCK.to_vec(), Some(sb.encode()))]);
            tracing::info!("volume upgraded: the spill tier may now be paged");
        }
        // Markers of early builds (open-for-writing) are retired.
        self.scan_keys(keys::P_WRITING, |k| {
            self.store.apply(vec![(k.to_vec(), None)]);
            Ok(())
        })?;
        self.reclaim(unclean)?;
        self.set_mount_state(false);
        self.store.sync()
    }

    /// Reclaims inodes unlinked while open by daemons gone (this volume's
    /// last daemon, or on a shared volume the sessions that died) and, if
    /// one stopped uncleanly (`unclean`: since when), reconciles sizes with
    /// backing files. On a shared volume: under the write lease, and the
    /// dead sessions are forgotten once that is durable.
    fn reclaim(&self, mut unclean: Option<i64>) -> Result<()> {
        let plan = if self.is_shared() {
            let plan = self.shared_recovery_plan(unclean)?;
            unclean = plan.unclean_since;
            Some(plan)
        } else {
            None
        };
        let mut st = self.state.lock();
        let reclaimed = self.free_orphans(&mut st, |st, k, v, ino| {
            let Some(plan) = &plan else {
                return Ok(true);
            };
            let tag =
                crate::format::dirent::decode_orphan(k, v).map_err(|e| CoreError::corrupt(k, e))?;
            // Still open here: freed when this daemon lets go of it.
            Ok(plan.reclaims(tag) && !st.referenced(ino))
        })?;
        if reclaimed > 0 {
            tracing::info!(reclaimed, "reclaimed inodes unlinked while open");
        }
        self.fresh_sessions(&mut st)?;
        if let Some(since_ns) = unclean {
            tracing::warn!(
                "volume was not unmounted cleanly: reconciling file sizes with backing files"
            );
            // Live sessions' pools make files ahead in their blocks.
            let shielded: Vec<std::ops::Range<u64>> = match &plan {
                Some(plan) => st
                    .other_sessions()
                    .iter()
                    .filter(|(id, _)| plan.live.contains(id))
                    .map(|(_, s)| s.start..s.end)
                    .chain(std::iter::once(st.own_block()))
                    .collect(),
                None => Vec::new(),
            };
            let (fixed, stray) = self.reconcile_all(&mut st, since_ns, &shielded)?;
            tracing::info!(fixed, stray, "recovery done");
        }
        if !self.opts.read_only {
            match &plan {
                Some(plan) => {
                    self.fold_sessions(&mut st, |id| !plan.live.contains(&id));
                    self.fold_shares(&mut st, |id| !plan.live.contains(&id))?;
                }
                None => {
                    self.fold_sessions(&mut st, |_| true);
                    self.fold_shares(&mut st, |_| true)?;
                }
            }
        }
        drop(st);
        if let Some(plan) = &plan {
            self.store.sync()?;
            self.bury(plan)?;
        }
        Ok(())
    }

    /// The session is over, and the kernel's references and open files with
    /// it, whether or not their FORGET and RELEASE arrived before it ended
    /// (an unmount drops those still queued): inodes unlinked while open
    /// are freed now, so that their space is back once the unmount is done,
    /// not at the next mount. (Shared volumes leave them to the recovery
    /// plan: other daemons may hold them.)
    fn reclaim_at_close(&self) -> Result<()> {
        let mut st = self.state.lock();
        let freed = self.free_orphans(&mut st, |_, _, _, _| Ok(true))?;
        if freed > 0 {
            tracing::info!(
                freed,
                "freed inodes unlinked while open, at the end of the session"
            );
        }
        Ok(())
    }

    /// Frees every inode unlinked while open (an orphan record) that
    /// `wanted(state, key, value, ino)` says may go; how many went.
    fn free_orphans(
        &self,
        st: &mut State,
        mut wanted: impl FnMut(&State, &[u8], &[u8], u64) -> Result<bool>,
    ) -> Result<u64> {
        let mut freed = 0u64;
        self.scan_pairs(keys::P_ORPHAN, |k, v| {
            let ino = keys::key_ino(k).ok_or_else(|| {
                CoreError::corrupt(k, crate::format::FormatError::Malformed("short key"))
            })?;
            if !wanted(st, k, v, ino)? {
                return Ok(());
            }
            let mut w = Vec::new();
            let unlink = self.free_inode(st, &mut w, ino)?;
            self.store.apply_then_unlink(w, unlink);
            freed += 1;
            Ok(())
        })?;
        Ok(freed)
    }

    fn set_mount_state(&self, clean: bool) {
        let m = MountState {
            clean,
            pid: std::process::id(),
            since_ns: Timestamp::now().as_nanos() as i64,
        };
        self.store
            .apply(vec![(keys::MOUNT_STATE.to_vec(), Some(m.encode()))]);
    }

    /// Calls `f` for every key under `prefix`, in pages.
    fn scan_keys(&self, prefix: u8, mut f: impl FnMut(&[u8]) -> Result<()>) -> Result<()> {
        self.scan_pairs(prefix, |k, _| f(k))
    }

    /// Calls `f` for every pair under `prefix`, in pages.
    fn scan_pairs(&self, prefix: u8, mut f: impl FnMut(&[u8], &[u8]) -> Result<()>) -> Result<()> {
        let (mut start, end) = keys::prefix_range(prefix);
        loop {
            let page = self.store.scan(&start, &end, 1024)?;
            let Some((last, _)) = page.last() else {
                return Ok(());
            };
            start = last.clone();
            start.push(0);
            for (k, v) in &page {
                f(k, v)?;
            }
        }
    }

    /// Sizes from backing files for every regular file (on encrypted
    /// volumes, after finishing a truncate cut short in any backing file
    /// changed since the unclean mount began, `since_ns`); stray backing
    /// files removed, but for those numbered in `shielded` (blocks of live
    /// sessions, whose pools make files ahead). Returns (inodes fixed,
    /// backing files removed).
    fn reconcile_all(
        &self,
        st: &mut State,
        since_ns: i64,
        shielded: &[std::ops::Range<u64>],
    ) -> Result<(u64, u64)> {
        let mut fixed = 0;
        let (mut start, end) = keys::prefix_range(keys::P_INODE);
        loop {
            let page = self.store.scan(&start, &end, 1024)?;
            let Some((last, _)) = page.last() else { break };
            start = last.clone();
            start.push(0);
            for (k, v) in page {
                let inode = Inode::decode(&k, &v).map_err(|e| CoreError::corrupt(&k, e))?;
                if !inode.is_reg() {
                    continue;
                }
                let ino = keys::key_ino(&k).unwrap_or(0);
                if self.data.is_sealed() {
                    // ctime is the kernel's coarse clock: a second of margin.
                    let changed = self.data.stat(ino)?.is_some_and(|m| {
                        use std::os::unix::fs::MetadataExt;
                        m.ctime()
                            .saturating_mul(1_000_000_000)
                            .saturating_add(m.ctime_nsec())
                            >= since_ns.saturating_sub(1_000_000_000)
                    });
                    if changed {
                        self.data.finish_cut(ino)?;
                    }
                }
                if self.remote.is_some() {
                    // The record's size goes with the block map; backing
                    // files with changes are uploaded after (`upload_dirty`).
                    continue;
                }
                let mut new = inode.clone();
                self.reconcile(ino, &mut new, None)?;
                if new != inode {
                    let mut w = Vec::new();
                    self.put_inode(st, &mut w, ino, new);
                    self.store.apply(w);
                    fixed += 1;
                }
            }
        }
        let mut stray = 0;
        for (i, dir) in self.layout.backing_dirs() {
            for e in std::fs::read_dir(&dir)?.flatten() {
                let owner = volume::backing_ino(&e.file_name(), i);
                if owner.is_some_and(|o| shielded.iter().any(|r| r.contains(&o))) {
                    continue;
                }
                let live = match owner {
                    Some(ino) => self.load_opt(st, ino)?.is_some_and(|c| c.inode.is_reg()),
                    None => false,
                };
                if !live {
                    std::fs::remove_file(e.path())?;
                    stray += 1;
                }
            }
        }
        Ok((fixed, stray))
    }

    // ---- helpers shared by the operation modules -------------------------

    fn load_opt<'s>(&self, st: &'s mut State, ino: u64) -> Result<Option<&'s mut Cached>> {
        load_in(&self.store, st, ino)
    }

    /// A copy of inode `ino`, or `NotFound`.
    fn inode(&self, st: &mut State, ino: u64) -> Result<Inode> {
        Ok(self.load(st, ino)?.inode.clone())
    }

    fn load<'s>(&self, st: &'s mut State, ino: u64) -> Result<&'s mut Cached> {
        self.load_opt(st, ino)?.ok_or(CoreError::NotFound)
    }

    /// Records the new state of `ino` in the cache and in the batch `w`;
    /// a new size moves the byte counts of the directories naming it.
    fn put_inode(&self, st: &mut State, w: &mut Vec<Write>, ino: u64, mut inode: Inode) {
        if self.sb.has_dir_stats() && !inode.is_dir() {
            if let Err(e) = self.account_size(st, w, ino, &inode) {
                // The change itself stands; `safs fsck` finds the counts.
                tracing::error!(ino, error = %e, "directory statistics not moved for a new size");
            }
        }
        if self.sb.has_full_dir_stats() {
            if let Err(e) = self.rctimes_of(st, w, ino, &mut inode) {
                tracing::error!(ino, error = %e, "recursive change times not moved");
            }
        }
        self.put_inode_as_is(st, w, ino, inode);
    }

    /// [`Fs::put_inode`] where statistics are already accounted for.
    fn put_inode_as_is(&self, st: &mut State, w: &mut Vec<Write>, ino: u64, inode: Inode) {
        let key = keys::inode(ino);
        w.push((key.to_vec(), Some(inode.encode(&key))));
        st.written(ino);
        let mut slot = Some(inode);
        if !st.cache_update(ino, |c| c.inode = slot.take().expect("once")) {
            let inode = slot.take().expect("unused");
            st.cache_put(ino, Cached { inode, spill: None });
        }
    }

    /// The counters records a change that took or freed inode numbers
    /// moved: this session's, and `N` when it reserved a block (whose
    /// numbers the pool may then make files for).
    fn put_counters(&self, st: &mut State, w: &mut Vec<Write>) {
        let (own, n, block) = st.counters_due();
        if let Some(own) = own {
            let id = st.session_id();
            w.push((keys::session(id).to_vec(), Some(own.encode(id))));
        }
        if let Some(n) = n {
            w.push((keys::COUNTERS.to_vec(), Some(n.encode())));
        }
        // One daemon: its blocks follow one another, and its pool runs on.
        if let Some(block) = block.filter(|_| self.is_shared()) {
            self.data.pool_block(block);
        }
    }

    /// Loads every session's counters record (at mount, under the
    /// lease): this daemon's own, if one was left, goes on; the others
    /// are counted (and on a shared volume, their blocks are theirs).
    fn load_sessions(&self, st: &mut State) -> Result<()> {
        let mut found = self.read_sessions()?;
        let id = self.session_id();
        st.begin_session(id, found.remove(&id));
        st.set_others(found);
        Ok(())
    }

    /// Other sessions' counters records read again if they changed since
    /// (see `State::mark_others_stale`).
    fn fresh_sessions(&self, st: &mut State) -> Result<()> {
        if st.others_stale() {
            st.set_others(self.read_sessions()?);
        }
        Ok(())
    }

    /// Every session's counters record, by session id.
    fn read_sessions(&self) -> Result<std::collections::BTreeMap<u64, SessionCounters>> {
        let mut found = std::collections::BTreeMap::new();
        self.scan_pairs(keys::P_SESSION, |k, v| {
            let malformed = crate::format::FormatError::Malformed("session key");
            let id = keys::key_ino(k)
                .filter(|_| k.len() == 9)
                .ok_or_else(|| CoreError::corrupt(k, malformed))?;
            let rec = SessionCounters::decode(k, v).map_err(|e| CoreError::corrupt(k, e))?;
            found.insert(id, rec);
            Ok(())
        })?;
        Ok(found)
    }

    /// Folds into `N` the shares of the sessions `gone` says are over
    /// (every other one on a volume one daemon serves; dead ones on a
    /// shared volume): under the lease.
    fn fold_sessions(&self, st: &mut State, gone: impl Fn(u64) -> bool) {
        let ids: Vec<u64> = st
            .other_sessions()
            .keys()
            .copied()
            .filter(|&id| gone(id))
            .collect();
        for id in ids {
            if let Some(n) = st.fold_session(id) {
                self.store.apply(vec![
                    (keys::session(id).to_vec(), None),
                    (keys::COUNTERS.to_vec(), Some(n.encode())),
                ]);
            }
        }
    }

    /// Folds every session's share of directory `dir`'s statistics into
    /// the directory's inode at once (its recursive counts never go below
    /// zero on the way), and deletes their records (under the lease). A
    /// session whose share is folded sees its record go, and starts its
    /// share again from nothing. Shares of a directory gone since go with
    /// nothing.
    fn fold_dir_shares(&self, st: &mut State, dir: u64) -> Result<()> {
        let me = st.session_id();
        let mut total = DirShare::default();
        let mut w = Vec::new();
        if let Some(own) = st.own_share(dir) {
            total.add(own);
            w.push((keys::dir_share(dir, me).to_vec(), None));
        }
        let (start, end) = keys::ino_range(keys::P_SHARE, dir);
        for (k, v) in self.store.scan(&start, &end, usize::MAX)? {
            if keys::share_session(&k) == Some(me) {
                continue;
            }
            total.add(&DirShare::decode(&k, &v).map_err(|e| CoreError::corrupt(&k, e))?);
            w.push((k, None));
        }
        if let Some(c) = self.load_opt(st, dir)? {
            let mut inode = c.inode.clone();
            if let Some(s) = inode.stats.as_mut() {
                total.apply_to(s);
                self.put_inode_as_is(st, &mut w, dir, inode);
            }
        }
        st.drop_shares(dir);
        self.store.apply(w);
        Ok(())
    }

    /// Folds the shares of every directory of which a session `gone`
    /// says is over holds one (see [`Fs::fold_dir_shares`]).
    fn fold_shares(&self, st: &mut State, gone: impl Fn(u64) -> bool) -> Result<()> {
        let mut dirs = std::collections::BTreeSet::new();
        self.scan_keys(keys::P_SHARE, |k| {
            let (Some(dir), Some(session)) = (keys::key_ino(k), keys::share_session(k)) else {
                return Err(CoreError::corrupt(
                    k,
                    crate::format::FormatError::Malformed("share key"),
                ));
            };
            if gone(session) {
                dirs.insert(dir);
            }
            Ok(())
        })?;
        for dir in dirs {
            self.fold_dir_shares(st, dir)?;
        }
        Ok(())
    }

    /// At a clean end: this session's share folded into `N`, and the rest
    /// of its block given back if no block was reserved after it.
    fn fold_own_session(&self) {
        let mut st = self.state.lock();
        let id = st.session_id();
        let dirs = st.own_share_dirs();
        for dir in dirs {
            if let Err(e) = self.fold_dir_shares(&mut st, dir) {
                // Counted again by `safs fsck`, which sums every share.
                tracing::error!(dir, error = %e, "shares of directory statistics not folded");
            }
        }
        if let Some(n) = st.fold_session(id) {
            self.store.apply(vec![
                (keys::session(id).to_vec(), None),
                (keys::COUNTERS.to_vec(), Some(n.encode())),
            ]);
        }
    }

    /// Hands one operation's writes to the store (and waits on `sync` mounts).
    fn commit(&self, st: &mut State, w: Vec<Write>) -> Result<()> {
        if w.is_empty() {
            return Ok(());
        }
        let seq = self.store.apply(w);
        self.hand_over_deferred(st);
        if self.opts.sync {
            self.wait_durable(st, seq)?;
        }
        Ok(())
    }

    /// At the end of an operation: the records deferred in the cache, if
    /// the committer waits for them to take a batch (see `store`).
    fn hand_over_deferred(&self, st: &mut State) {
        if self.store.flush_wanted() {
            self.hand_over_all(st);
        }
    }

    /// Waits until every operation up to `seq` is durable, holding the
    /// state lock: hands the records deferred in the cache to the store
    /// first, which the committer cannot take while the lock is held.
    fn wait_durable(&self, st: &mut State, seq: u64) -> Result<()> {
        self.hand_over_all(st);
        self.store.wait_durable(seq)
    }

    /// Every record deferred in the cache, with what ancestors are owed
    /// (see `stats`), handed to the store; only between operations.
    fn hand_over_all(&self, st: &mut State) {
        stats::pay_owed(&self.store, st, &mut namespace::Work::new());
        self.store.apply_deferred(st.take_deferred());
    }

    /// Admits a metadata change: refused on a read-only mount, while
    /// commits fail, and unless the space its commit may need is held (see
    /// `store`). Keep the ticket until the change is applied.
    fn writable(&self) -> Result<Ticket<'_>> {
        if self.opts.read_only {
            return Err(CoreError::ReadOnly);
        }
        self.store.admit(Admit::Change)
    }

    /// [`Fs::writable`] for a removal, which may use the space kept back
    /// from other changes: removing must work on a full disk.
    fn removable(&self) -> Result<Ticket<'_>> {
        if self.opts.read_only {
            return Err(CoreError::ReadOnly);
        }
        self.store.admit(Admit::Removal)
    }

    /// The mount's atime rules now.
    pub fn atime(&self) -> Atime {
        *self.atime.lock()
    }

    /// New atime rules (a remount changed the mount's options).
    pub fn set_atime(&self, a: Atime) {
        *self.atime.lock() = a;
        tracing::info!(?a, "access-time rules changed");
    }

    /// What the group committer is doing: failures, records waiting, space.
    pub fn health(&self) -> Health {
        self.store.health()
    }

    /// Makes [`Fs::close`] give up on changes it cannot commit (a second
    /// signal to a daemon whose final commit keeps failing).
    pub fn abandon_final_commit(&self) {
        self.store.abandon();
    }

    /// Deletes every record of `ino`; returns its backing file, which must
    /// be removed only once the deletion is durable (see
    /// [`Store::apply_then_unlink`]): a crash before that commit brings the
    /// inode back, and it must come back with its data.
    fn free_inode(
        &self,
        st: &mut State,
        w: &mut Vec<Write>,
        ino: u64,
    ) -> Result<Option<std::path::PathBuf>> {
        let inode = match self.load_opt(st, ino) {
            Ok(Some(c)) => Some(c.inode.clone()),
            Ok(None) => None,
            Err(e) => {
                tracing::error!(ino, error = %e, "freeing an inode whose record is unreadable");
                None
            }
        };
        for key in [
            keys::inode(ino),
            keys::spill(ino),
            keys::symlink(ino),
            keys::orphan(ino),
            keys::writing(ino),
        ] {
            w.push((key.to_vec(), None));
        }
        // Spill pages past page 0 and overflow values: found by a scan, only
        // when the inode says it has some (or is unreadable).
        let spill_pages = inode.as_ref().is_none_or(|i| i.spill_len > 0);
        let overflow = inode.as_ref().is_none_or(|i| i.overflow > 0);
        for (wanted, prefix) in [(spill_pages, keys::P_SPILL), (overflow, keys::P_OVERFLOW)] {
            if wanted {
                let (start, end) = keys::ino_range(prefix, ino);
                for (k, _) in self.store.scan(&start, &end, usize::MAX)? {
                    w.push((k, None));
                }
            }
        }
        if inode.as_ref().is_none_or(Inode::is_reg) {
            self.drop_blocks(w, ino)?;
        }
        // A directory's shares of its statistics go with it (any
        // session's: nothing is below it to move them again).
        if self.is_shared() && inode.as_ref().is_none_or(Inode::is_dir) {
            let (start, end) = keys::ino_range(keys::P_SHARE, ino);
            for (k, _) in self.store.scan(&start, &end, usize::MAX)? {
                w.push((k, None));
            }
            st.drop_shares(ino);
        }
        let backing = inode
            .as_ref()
            .is_none_or(Inode::is_reg)
            .then(|| self.data.path(ino));
        if inode.is_some() {
            st.inode_freed(ino);
            self.put_counters(st, w);
        }
        st.cache_pop(ino);
        st.drop_references(ino);
        Ok(backing)
    }

    /// Frees `ino` if nothing refers to it any more: no name, no open
    /// handle, no kernel reference.
    fn maybe_free(&self, st: &mut State, ino: u64) -> Result<()> {
        if st.referenced(ino) {
            return Ok(());
        }
        let Some(c) = self.load_opt(st, ino)? else {
            return Ok(());
        };
        if c.inode.nlink > 0 {
            return Ok(());
        }
        let mut w = Vec::new();
        let unlink = self.free_inode(st, &mut w, ino)?;
        let seq = self.store.apply_then_unlink(w, unlink);
        if self.opts.sync {
            self.wait_durable(st, seq)?;
        }
        Ok(())
    }

    /// The kernel now holds one more reference to `ino`.
    pub fn note_lookup(&self, ino: Ino) {
        self.state.lock().add_lookup(ino.0);
    }

    /// FUSE `forget`: the kernel dropped `n` references to `ino`.
    pub fn forget(&self, ino: Ino, n: u64) {
        let ino = ino.0;
        let gone = self.state.lock().forget(ino, n);
        if gone {
            if let Err(e) = self.free_if_unused(ino) {
                tracing::error!(ino, error = %e, "could not free forgotten inode");
            }
        }
    }

    /// Turns reads of `ino`'s backing file since it was last armed into
    /// the inode's atime, under the mount's atime rules, and re-arms it.
    /// The filesystem under the volume moved the backing file's atime from
    /// the sentinel 0 to the time of a read (see `data`).
    fn observe_reads(&self, st: &mut State, ino: u64, file: &File) {
        if self.watches_reads() {
            match file.metadata() {
                Ok(meta) => self.observe_reads_in(st, ino, file, Ok(&meta)),
                Err(e) => self.observe_reads_in(st, ino, file, Err(e)),
            }
        }
    }

    /// Whether reads move access times at all (if not, no look at the
    /// backing file is needed for them).
    fn watches_reads(&self) -> bool {
        !self.opts.read_only && self.atime().mode != AtimeMode::Never
    }

    /// [`Fs::observe_reads`] with the backing file's metadata already
    /// taken (`meta`), so that one `statx` serves this and a reconcile.
    fn observe_reads_in(
        &self,
        st: &mut State,
        ino: u64,
        file: &File,
        meta: std::io::Result<&std::fs::Metadata>,
    ) {
        use std::os::unix::fs::MetadataExt;
        if !self.watches_reads() {
            return;
        }
        let res = meta.and_then(|meta| {
            if meta.atime() == 0 && meta.atime_nsec() == 0 {
                return Ok(None);
            }
            data::arm_atime(file)?;
            Ok(Some(Timestamp {
                sec: meta.atime(),
                nsec: meta.atime_nsec() as u32,
            }))
        });
        let res = match res {
            Ok(Some(at)) => self.touch_atime(st, ino, at),
            Ok(None) => Ok(()),
            Err(e) => Err(e.into()),
        };
        // An access time is not worth failing the request that noticed it.
        if let Err(e) = res {
            tracing::warn!(ino, error = %e, "cannot update an access time");
        }
    }

    /// Moves `ino`'s atime to `at` if the mount's rules say a read then
    /// does. Not while commits fail (an access time is not worth an error).
    fn touch_atime(&self, st: &mut State, ino: u64, at: Timestamp) -> Result<()> {
        if self.is_shared() {
            // Written under the write lease, once the caller lets go of the
            // state lock (`flush_atimes`).
            let c = self.load(st, ino)?;
            if self.atime().due(&c.inode, at) {
                st.atimes_due().push((ino, at));
            }
            return Ok(());
        }
        self.touch_atime_now(st, ino, at)
    }

    /// [`Fs::touch_atime`] itself: under the write lease on shared volumes.
    fn touch_atime_now(&self, st: &mut State, ino: u64, at: Timestamp) -> Result<()> {
        let rules = self.atime();
        let c = self.load(st, ino)?;
        if !rules.due(&c.inode, at) || self.store.healthy().is_err() {
            return Ok(());
        }
        let mut inode = c.inode.clone();
        inode.atime = at;
        let mut w = Vec::new();
        self.put_inode(st, &mut w, ino, inode);
        self.commit(st, w)
    }

    /// A listing of directory `ino` began (readdir from offset 0): its
    /// access time, under the mount's rules (`nodiratime` among them).
    pub fn note_dir_read(&self, ino: Ino) -> Result<()> {
        let ino = ino.0;
        if self.opts.read_only || self.atime().mode == AtimeMode::Never {
            return Ok(());
        }
        let mut st = self.state.lock();
        let res = self.touch_atime(&mut st, ino, Timestamp::now());
        drop(st);
        self.flush_atimes();
        res
    }

    /// Brings a regular file's size, blocks and mtime up to date from its
    /// backing file (`file` if open, else looked up by inode number).
    fn reconcile(&self, ino: u64, inode: &mut Inode, file: Option<&File>) -> Result<()> {
        if !inode.is_reg() {
            return Ok(());
        }
        if let Some(f) = file {
            return self.reconcile_with(inode, &f.metadata()?);
        }
        match self.data.stat(ino)? {
            Some(meta) => apply_backing(inode, &meta, self.data.plain_size(meta.len())),
            // Recovery after an unclean stop (the one caller without an
            // open file): a file with contents and no backing file had its
            // backing file's name never made durable — nothing fsync'd it
            // (an fsync makes the name durable too) — so the crash took
            // its contents, as it may. It is empty now, not a size over
            // nothing.
            None if inode.size > 0 => {
                tracing::warn!(
                    ino,
                    size = inode.size,
                    "contents never made durable were lost in the stop: the file is empty"
                );
                inode.size = 0;
                inode.blocks = 0;
            }
            None => {}
        }
        Ok(())
    }

    /// [`Fs::reconcile`] from the backing file's metadata, already taken.
    fn reconcile_with(&self, inode: &mut Inode, meta: &std::fs::Metadata) -> Result<()> {
        if inode.is_reg() {
            apply_backing(inode, meta, self.data.plain_size(meta.len()));
        }
        Ok(())
    }
}

/// Space the metadata engine keeps allocated ahead of its commits on the
/// filesystem under the volume at `root`: 1/64 of it, between 4 and 16 MiB
/// (admission asks for more when a burst needs it).
fn hold_target(root: &Path) -> u64 {
    let size = nix::sys::statvfs::statvfs(root)
        .map(|v| v.blocks().saturating_mul(v.fragment_size()))
        .unwrap_or(0);
    (size / 64).clamp(4 << 20, 16 << 20)
}

/// The size a directory reports: 4 KiB for every 128 entries it has ever
/// held (its readdir cookies: `next_cookie` counts them). Like ext4's, it
/// grows with the directory and does not shrink; tools that size a
/// directory by it see one that grows.
fn dir_size(next_cookie: u64) -> u64 {
    let entries = next_cookie.saturating_sub(FIRST_COOKIE);
    4096 * (1 + entries / 128)
}

/// Inode `ino` from the cache, else from `store` (and then cached);
/// `None` if there is none.
fn load_in<'s>(store: &Store, st: &'s mut State, ino: u64) -> Result<Option<&'s mut Cached>> {
    let hit = st.is_cached(ino);
    st.note_inode_load(hit);
    if !hit {
        let key = keys::inode(ino);
        let Some(rec) = store.get(&key)? else {
            return Ok(None);
        };
        let inode = Inode::decode(&key, &rec).map_err(|e| CoreError::corrupt(&key, e))?;
        st.cache_put(ino, Cached { inode, spill: None });
    }
    Ok(st.cached(ino))
}

/// Size (`size`: the backing file's, converted on encrypted volumes),
/// blocks and (if newer) mtime/ctime from a backing file's metadata.
fn apply_backing(inode: &mut Inode, meta: &std::fs::Metadata, size: u64) {
    use std::os::unix::fs::MetadataExt;
    inode.size = size;
    inode.blocks = meta.blocks();
    let mtime = Timestamp {
        sec: meta.mtime(),
        nsec: meta.mtime_nsec() as u32,
    };
    if mtime > inode.mtime {
        inode.mtime = mtime;
        if mtime > inode.ctime {
            inode.ctime = mtime;
        }
    }
}

/// Checks a name for a new or looked-up entry.
fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > crate::format::NAME_MAX {
        return Err(CoreError::NameTooLong);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(CoreError::Invalid);
    }
    Ok(())
}

#[cfg(test)]
mod tests;

impl Fs {
    /// What the inode cache holds, and its bounds.
    pub fn cache_figures(&self) -> CacheFigures {
        let st = self.state.lock();
        let (inodes, inode_capacity, bytes, byte_budget) = st.cache_figures();
        let (dirs, dir_bytes, dir_budget) = st.dir_figures();
        let (inode_hits, inode_misses, dir_hits, dir_misses) = st.cache_lookups();
        CacheFigures {
            inode_hits,
            inode_misses,
            dir_hits,
            dir_misses,
            inodes,
            inode_capacity,
            bytes,
            byte_budget,
            dirs,
            dir_bytes,
            dir_budget,
        }
    }

    /// Whether file contents are sealed (an encrypted volume): they go
    /// through the daemon, never passthrough.
    pub fn contents_sealed(&self) -> bool {
        self.data.is_sealed()
    }

    /// The volume's inline xattr budget, bytes.
    pub fn inline_budget(&self) -> usize {
        self.budget
    }

    /// What the metadata engine has served since the mount.
    pub fn engine_counters(&self) -> crate::meta::EngineCounters {
        self.store.engine_counters()
    }

    /// A shared volume's write lease: taken how often, waited for how long.
    pub fn lease_figures(&self) -> Option<LeaseFigures> {
        self.store.lease_figures()
    }

    /// Impossible counts met since the mount (see `state`): 0 unless a bug.
    pub fn broken_counts(&self) -> u64 {
        self.state.lock().broken_counts()
    }

    /// Empties the inode cache (the store overlay stays: it is not a cache).
    pub fn drop_caches(&self) {
        self.state.lock().cache_clear();
    }
}
