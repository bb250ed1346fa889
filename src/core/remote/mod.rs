//! Contents in an object store (volumes formatted with `--data s3://...`).
//!
//! The backing file stays where every data path reads and writes (FUSE
//! passthrough included), but it is a cache: the contents are the blocks
//! the block map (`B` records, see `format::blocks`) names, immutable
//! objects in the store. So:
//!
//! - **Before a file is opened or truncated** its backing file is brought up
//!   to date with the map ([`Fs::fetch`]): blocks whose bytes differ (or a
//!   backing file lost with a node's cache) come from the store, checked
//!   against the hash the map records. Once done, the inode is *current*
//!   for the rest of the session, and reads cost what they cost on a local
//!   volume.
//! - **When the last writer closes, at `fsync` and after a truncate** the
//!   blocks whose bytes changed go up as new objects ([`Fs::upload`]), and
//!   the map records that name them are applied in one batch with the
//!   file's size: after a crash the size and the blocks agree. `fsync`
//!   waits for that batch.
//! - **While a file is open for writing** a thread (the *stager*) watches
//!   its backing file grow and sends each full block behind the writer's
//!   end as an object ahead of time ([`Remote::start_stager`]); the upload
//!   at close or `fsync` names a staged object instead of sending the
//!   block again if the block still hashes the same, and queues for
//!   deletion, in its batch, the staged objects it does not name. A write
//!   and the upload of what it wrote overlap (with kernel passthrough the
//!   daemon never sees the writes: the file's size is what it watches).
//!   A crash leaves staged objects no record names: fsck lists them with
//!   the other leftovers of cut-short uploads and `--repair` deletes them.
//! - **A backing file that may hold what the store does not** carries the
//!   `user.safs.dirty` mark from a writer's open until an upload covers
//!   every change; the recovery after an unclean stop uploads the marked
//!   ones — if the mark names this boot. Backing files are never synced to
//!   the local disk (`fsync` puts the blocks in the store instead), so one
//!   marked in another boot (the machine stopped: a power cut, a crash)
//!   may have lost bytes: its changes since its last upload are dropped,
//!   never uploaded, and it is checked against its map at its next open.
//!   What an `fsync` covered is in the store; what none did may be lost,
//!   as on any filesystem. A backing file that matches a map carries that
//!   map's digest in `user.safs.map`, so a later session need not read it
//!   to know — in the same boot only: the mark names the boot it was set
//!   in, because the backing file is not synced before it (a fetch would
//!   pay a write of every byte to the disk), and a power cut can lose
//!   bytes whose mark survived. After a reboot the first open of a cached file compares
//!   its blocks with the map's hashes instead and fetches what differs.
//! - **Objects no record names** (a block replaced, a file truncated or
//!   freed) are queued (`Q` records, in the batch that drops them) and
//!   deleted by a background thread once that batch is durable. A freed
//!   file is queued whole (one `Q` record for all its blocks): its block
//!   map is the deleter's to read, so a remove costs no read of it.
//!
//! - **The cache is bounded** (`-o cache_size=`): closed files' backing
//!   files are kept in the order of their last close, and the oldest are
//!   deleted once their bytes pass the bound ([`Fs::trim_cache`]). Open
//!   files and files whose changes are not uploaded are never dropped.
//!   An open checks, under the state lock, that its file was not dropped
//!   between its fetch and its handle, and fetches again if it was.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::data::read_up_to;
use super::store::Store;
use super::{CoreError, Fs, Result};
use crate::format::blocks::{self, BLOCK, BlockRef};
use crate::format::keys;
use crate::meta::Write;
use crate::objstore::{self, StoreError};

mod incoming;
mod partial;

/// The mark of a backing file that may hold changes the store lacks.
const DIRTY: &std::ffi::CStr = c"user.safs.dirty";
/// The digest of the block map a backing file matches.
const MAP: &std::ffi::CStr = c"user.safs.map";
/// Per-inode locks: one fetch or upload of a file at a time.
const STRIPES: usize = 64;
/// How often the deleter looks for objects to delete.
const DELETE_EVERY: Duration = Duration::from_secs(1);
/// Objects deleted per batch of `Q` records.
const DELETE_BATCH: usize = 256;

/// Tries of an upload whose map other nodes keep changing.
const RACES: usize = 8;
/// How often the stager looks at the files being written.
const STAGE_EVERY: Duration = Duration::from_millis(20);
/// Blocks the stager sends per file per look.
const STAGE_BATCH: usize = 2 * objstore::PARALLEL;
/// Files [`Remote::bare`] remembers at most (a few dozen bytes each).
const BARE_MAX: usize = 1 << 20;
/// How long the stager leaves the store alone after a failed request.
const STAGE_PAUSE: Duration = Duration::from_secs(5);
/// How long an unmount spends deleting the objects queued so far; what is
/// left waits for the next mount's deleter.
const UNMOUNT_DELETE: Duration = Duration::from_secs(3);

/// Why an upload runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Upload {
    /// The last writer's close (its handle still counts as open).
    Close,
    /// `fsync`, a truncate, an unmount's retry: what the file holds now.
    Sync,
    /// A mount's recovery of what a stopped daemon left dirty.
    Recover,
}

/// A backing file's length and modification time, taken by an upload
/// that then read all of it. Trusted only where a later write must change
/// the time ("racy git"'s rule): the coarse clock read before the `stat`
/// was already past it, so any write after the `stat` stamps a later time;
/// and the time has nanoseconds (a filesystem that keeps seconds would
/// stamp a write in the same second alike). A store through a shared
/// mapping into a page already dirty stamps nothing: the close may miss
/// it, the RELEASE's upload, which reads the file whole, does not (and
/// `msync` is what makes such stores visible anyway).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Unwritten {
    len: u64,
    mtime: (i64, i64),
}

impl Unwritten {
    /// `meta`'s, if the rule above holds for a `stat` made after `before`.
    fn of(meta: &std::fs::Metadata, before: rustix::time::Timespec) -> Option<Unwritten> {
        let u = Unwritten::now(meta);
        let fine = u.mtime.1 % 1000 != 0;
        (fine && (before.tv_sec, before.tv_nsec) > u.mtime).then_some(u)
    }

    fn now(meta: &std::fs::Metadata) -> Unwritten {
        use std::os::unix::fs::MetadataExt;
        Unwritten {
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
        }
    }
}

/// What the store and the cache did since the mount (`safs info --stats`,
/// metrics).
#[derive(Debug, Default)]
struct Counters {
    /// Opens and truncates whose backing file was current, or was brought
    /// up to date without the store; and those that fetched blocks.
    hits: AtomicU64,
    misses: AtomicU64,
    fetched_blocks: AtomicU64,
    fetched_bytes: AtomicU64,
    uploaded_blocks: AtomicU64,
    uploaded_bytes: AtomicU64,
    deleted_objects: AtomicU64,
    evicted_files: AtomicU64,
    evicted_bytes: AtomicU64,
    /// Uploads running now.
    uploading: AtomicU64,
}

/// Closed files' backing files in the order of their last close, with the
/// bytes each takes on the disk under the cache.
#[derive(Debug, Default)]
struct Cache {
    limit: u64,
    files: HashMap<u64, (u64, u64)>,
    order: BTreeMap<u64, u64>,
    bytes: u64,
    tick: u64,
}

impl Cache {
    fn insert(&mut self, ino: u64, bytes: u64) {
        self.remove(ino);
        self.tick += 1;
        self.files.insert(ino, (bytes, self.tick));
        self.order.insert(self.tick, ino);
        self.bytes += bytes;
    }

    fn remove(&mut self, ino: u64) {
        if let Some((bytes, tick)) = self.files.remove(&ino) {
            self.order.remove(&tick);
            self.bytes -= bytes;
        }
    }

    /// The file closed longest ago, if the cache is past its bound.
    fn oldest_over(&self) -> Option<u64> {
        (self.bytes > self.limit)
            .then(|| self.order.first_key_value().map(|(_, &ino)| ino))
            .flatten()
    }
}

/// A full block sent by the stager: the object's generation and the hash
/// of the bytes it holds.
#[derive(Clone, Copy, Debug)]
struct Staged {
    generation: u64,
    hash: [u8; 16],
}

type StagedMap = HashMap<u64, BTreeMap<u32, Staged>>;

/// A dirty mark an upload found it could clear, waiting for the commit
/// that named the file's map to be durable.
struct Undirty {
    /// That commit's sequence number (or later).
    after: u64,
    /// The file's count of writable opens and truncates then, and its
    /// length: changed since, the mark is that change's to clear.
    change: u64,
    len: u64,
}

pub(super) struct Remote {
    store: Arc<objstore::Store>,
    counters: Arc<Counters>,
    cache: Mutex<Cache>,
    stripes: Arc<[Mutex<()>]>,
    /// Inodes whose backing file is known to hold their contents this
    /// session (fetched, uploaded, or dirty).
    current: Mutex<HashSet<u64>>,
    /// The block maps of open files as this node last read or wrote them
    /// (dropped when another node changes one, and at the last close): a
    /// close need not read the map again, and a new file's is empty.
    maps: Arc<Mutex<HashMap<u64, BTreeMap<u32, BlockRef>>>>,
    /// Files open for writing, which the stager watches.
    writing: Arc<Mutex<HashSet<u64>>>,
    /// Blocks the stager sent that no upload has named (or queued) yet.
    staged: Arc<Mutex<StagedMap>>,
    /// Files made on this node that have no block record (created, never
    /// given contents, no other node's change to their map seen): freeing
    /// one needs no read of its map — a round trip on PostgreSQL. At most
    /// [`BARE_MAX`]; a file not in it is read as before.
    bare: Mutex<HashSet<u64>>,
    /// Writable opens and truncates per inode: an upload clears the dirty
    /// mark only if none came while it ran.
    changes: Mutex<HashMap<u64, u64>>,
    /// Files whose last upload failed: tried again at unmount.
    failed: Mutex<HashSet<u64>>,
    /// Files read before they are wholly fetched (see `partial`), until
    /// their last close.
    partial: Mutex<HashMap<u64, Arc<partial::Partial>>>,
    /// What each backing file looked like when an upload read all of it,
    /// where any later write would show (see [`Unwritten`]): a close that
    /// finds it so has nothing to upload.
    uploaded: Mutex<HashMap<u64, Unwritten>>,
    /// Dirty marks to clear once the commit naming the file's map is
    /// durable (see [`Fs::undirty`]): such a mark says nothing newer is
    /// in the backing file.
    undirty: Mutex<HashMap<u64, Undirty>>,
    deleter: Mutex<Option<JoinHandle<()>>>,
    stager: Mutex<Option<JoinHandle<()>>>,
    stop: Arc<(Mutex<bool>, Condvar)>,
}

impl Remote {
    /// Connects to the store the volume's `U` record names, with the
    /// credentials of this process's environment, and checks that it
    /// answers.
    pub(super) fn connect(
        url: &str,
        data_dir: &Path,
        timeout: Duration,
        cache_limit: u64,
    ) -> Result<Remote> {
        let config = objstore::StoreConfig::from_env(url).map_err(CoreError::Store)?;
        let limits = objstore::Limits {
            timeout,
            ..objstore::Limits::default()
        };
        let store = objstore::Store::new(config, limits).map_err(CoreError::Store)?;
        store.check().map_err(CoreError::Store)?;
        // The marks live in xattrs of the backing files.
        let probe = data_dir.join("00");
        let f = File::open(&probe)?;
        if let Err(e) = set_xattr(&f, MAP, b"") {
            return Err(CoreError::Io(std::io::Error::new(
                e.kind(),
                format!(
                    "{}: the filesystem under the volume must support user xattrs \
                     for a volume whose contents are in an object store: {e}",
                    data_dir.display()
                ),
            )));
        }
        let _ = remove_xattr(&f, MAP);
        Ok(Remote {
            store: Arc::new(store),
            counters: Arc::default(),
            cache: Mutex::new(Cache {
                limit: cache_limit,
                ..Cache::default()
            }),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            current: Mutex::new(HashSet::new()),
            maps: Arc::default(),
            writing: Arc::default(),
            staged: Arc::default(),
            bare: Mutex::new(HashSet::new()),
            changes: Mutex::new(HashMap::new()),
            failed: Mutex::new(HashSet::new()),
            partial: Mutex::new(HashMap::new()),
            uploaded: Mutex::new(HashMap::new()),
            undirty: Mutex::new(HashMap::new()),
            deleter: Mutex::new(None),
            stager: Mutex::new(None),
            stop: Arc::new((Mutex::new(false), Condvar::new())),
        })
    }

    pub(super) fn url(&self) -> String {
        self.store.url().to_string()
    }

    fn lock(&self, ino: u64) -> &Mutex<()> {
        &self.stripes[(ino as usize) % STRIPES]
    }

    /// Starts deleting the objects queued for deletion.
    pub(super) fn start_deleter(&self, meta: Arc<Store>) {
        let (store, counters) = (Arc::clone(&self.store), Arc::clone(&self.counters));
        let t = periodic("safs-deleter", DELETE_EVERY, &self.stop, move |stopping| {
            if let Err(e) = delete_doomed(&meta, &store, &counters, stopping) {
                tracing::warn!(error = %e, "deleting unreferenced objects: retried later");
            }
        });
        match t {
            Ok(t) => *self.deleter.lock() = Some(t),
            Err(e) => tracing::warn!(error = %e, "cannot start the object deleter"),
        }
    }

    /// Starts the stager (see the module comment): every [`STAGE_EVERY`],
    /// each file open for writing has the full blocks behind its end that
    /// differ from its map sent ahead, at most [`STAGE_BATCH`] per look.
    pub(super) fn start_stager(&self, meta: Arc<Store>, data_dir: std::path::PathBuf) {
        let store = Arc::clone(&self.store);
        let (writing, staged) = (Arc::clone(&self.writing), Arc::clone(&self.staged));
        let (maps, stripes) = (Arc::clone(&self.maps), Arc::clone(&self.stripes));
        let counters = Arc::clone(&self.counters);
        let mut pause_until: Option<Instant> = None;
        let t = periodic("safs-stager", STAGE_EVERY, &self.stop, move |_| {
            if pause_until.is_some_and(|t| Instant::now() < t) {
                return;
            }
            let files: Vec<u64> = writing.lock().iter().copied().collect();
            for ino in files {
                let path = super::data::backing_path(&data_dir, ino);
                // Under the file's stripe, which its upload takes too: a
                // close waits for the blocks in flight and names them
                // instead of sending them again (with the store away, for
                // one failed try: then the stager pauses).
                let _g = stripes[(ino as usize) % STRIPES].lock();
                if !writing.lock().contains(&ino) {
                    continue;
                }
                // A file opened for writing again has no map kept (the
                // last close let it go): without it every full block
                // would look new, and appending to a large file would
                // send it all again.
                if !maps.lock().contains_key(&ino) {
                    match block_map_in(&meta, ino) {
                        Ok(map) => {
                            maps.lock().entry(ino).or_insert(map);
                        }
                        Err(e) => {
                            tracing::debug!(ino, error = %e, "no block map: not staged");
                            continue;
                        }
                    }
                }
                match stage(&store, &path, ino, &maps, &staged, &counters) {
                    Ok(sent) => {
                        let mut st = staged.lock();
                        let mine = st.entry(ino).or_default();
                        for (idx, generation, hash) in sent {
                            mine.insert(idx, Staged { generation, hash });
                        }
                    }
                    Err((e, lost)) => {
                        tracing::debug!(ino, error = %e, "blocks not staged: the upload sends them");
                        doom(&meta, ino, &lost);
                        // The store away: not asked again for a while.
                        pause_until = Some(Instant::now() + STAGE_PAUSE);
                        return;
                    }
                }
            }
        });
        match t {
            Ok(t) => *self.stager.lock() = Some(t),
            Err(e) => tracing::warn!(error = %e, "cannot start the stager: blocks go up at close"),
        }
    }

    fn stop_threads(&self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        for t in [self.deleter.lock().take(), self.stager.lock().take()]
            .into_iter()
            .flatten()
        {
            let _ = t.join();
        }
    }

    /// The staged blocks of `ino`, no longer the stager's.
    fn take_staged(&self, ino: u64) -> BTreeMap<u32, Staged> {
        self.staged.lock().remove(&ino).unwrap_or_default()
    }
}

/// One look of the stager at `ino`'s backing file: the full blocks not
/// staged yet, not zero and not as its map has them, sent as objects;
/// `(block, generation, hash)` of each. On a failure, the objects that may
/// have been stored (to be queued for deletion).
#[allow(clippy::type_complexity)]
fn stage(
    store: &objstore::Store,
    path: &Path,
    ino: u64,
    maps: &Mutex<HashMap<u64, BTreeMap<u32, BlockRef>>>,
    staged: &Mutex<StagedMap>,
    counters: &Counters,
) -> std::result::Result<Vec<(u32, u64, [u8; 16])>, (String, Vec<(u32, u64)>)> {
    let f = match open_raw(path) {
        Ok(f) => f,
        Err(e) => return Err((e.to_string(), Vec::new())),
    };
    let len = f.metadata().map_err(|e| (e.to_string(), Vec::new()))?.len();
    if len <= blocks::INLINE_MAX {
        return Ok(Vec::new());
    }
    let full = (len / BLOCK) as u32;
    let mut sent: Vec<(u32, u64, [u8; 16])> = Vec::new();
    let mut puts = store.puts();
    let mut buf = vec![0u8; BLOCK as usize];
    for idx in 0..full {
        if sent.len() >= STAGE_BATCH {
            break;
        }
        if staged
            .lock()
            .get(&ino)
            .is_some_and(|s| s.contains_key(&idx))
        {
            continue;
        }
        let n = read_up_to(&f, &mut buf, u64::from(idx) * BLOCK);
        if n.as_ref().map_or(true, |&n| n < buf.len()) {
            break;
        }
        if buf.iter().all(|&x| x == 0) {
            continue;
        }
        let hash = blocks::hash(&buf);
        let same = maps
            .lock()
            .get(&ino)
            .and_then(|m| m.get(&idx))
            .is_some_and(|o| o.has_object() && o.holds_hashed(&buf, &hash));
        if same {
            continue;
        }
        let generation = new_generation();
        sent.push((idx, generation, hash));
        counters.uploaded_blocks.fetch_add(1, Relaxed);
        counters.uploaded_bytes.fetch_add(BLOCK, Relaxed);
        let key = blocks::object_key(ino, idx, generation);
        if let Err(e) = puts.put(key, std::mem::replace(&mut buf, vec![0u8; BLOCK as usize])) {
            return Err((
                e.to_string(),
                sent.iter().map(|&(i, g, _)| (i, g)).collect(),
            ));
        }
    }
    if let Err(e) = puts.finish() {
        return Err((
            e.to_string(),
            sent.iter().map(|&(i, g, _)| (i, g)).collect(),
        ));
    }
    Ok(sent)
}

/// The `Q` records that queue objects `(block, generation)` of `ino` for
/// deletion.
fn doomed_writes(ino: u64, objects: &[(u32, u64)]) -> Vec<Write> {
    objects
        .iter()
        .map(|&(idx, g)| {
            let q = keys::doomed(ino, idx, g);
            (q.to_vec(), Some(blocks::encode_doomed(&q)))
        })
        .collect()
}

/// Queues objects of `ino` no record names for deletion.
fn doom(meta: &Store, ino: u64, objects: &[(u32, u64)]) {
    if objects.is_empty() {
        return;
    }
    match meta.lease() {
        Ok(_lease) => {
            meta.apply(doomed_writes(ino, objects));
        }
        Err(e) => {
            tracing::warn!(ino, error = %e, "staged objects not queued for deletion: fsck lists them")
        }
    }
}

/// A thread named `name` that runs `work` every `every` until `stop` is
/// set (an unmount: the wait ends at once, and `work` is handed a test of
/// it to stop early between its steps).
fn periodic(
    name: &str,
    every: Duration,
    stop: &Arc<(Mutex<bool>, Condvar)>,
    mut work: impl FnMut(&dyn Fn() -> bool) + Send + 'static,
) -> std::io::Result<JoinHandle<()>> {
    let stop = Arc::clone(stop);
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            loop {
                {
                    let (lock, cv) = &*stop;
                    let mut s = lock.lock();
                    if !*s {
                        cv.wait_for(&mut s, every);
                    }
                    if *s {
                        return;
                    }
                }
                work(&|| *stop.0.lock());
            }
        })
}

/// The records of objects just deleted go, durably, before the next page
/// is read (a page read again would delete its objects twice).
fn forget_deleted(meta: &Store, w: Vec<Write>) -> Result<()> {
    let seq = {
        let _lease = meta.lease()?;
        meta.apply(w)
    };
    meta.wait_durable(seq)
}

/// A freed file's blocks (its [`keys::doomed_file`] record): their objects
/// deleted, then their records, a page at a time, so that a stop halfway
/// leaves the rest to the next pass. False if `stopping` cut it short.
fn delete_file_blocks(
    meta: &Store,
    store: &objstore::Store,
    counters: &Counters,
    ino: u64,
    stopping: &dyn Fn() -> bool,
) -> Result<bool> {
    let (start, end) = keys::ino_range(keys::P_BLOCK, ino);
    loop {
        let page = meta.engine().scan(&start, &end, DELETE_BATCH)?;
        if page.is_empty() {
            return Ok(true);
        }
        let mut w: Vec<Write> = Vec::with_capacity(page.len());
        for (k, v) in page {
            if stopping() {
                break;
            }
            let b = BlockRef::decode(&k, &v).map_err(|e| CoreError::corrupt(&k, e))?;
            if let (true, Some(i)) = (b.has_object(), keys::key_block(&k)) {
                store
                    .delete(&blocks::object_key(ino, i, b.generation))
                    .map_err(CoreError::Store)?;
                counters.deleted_objects.fetch_add(1, Relaxed);
            }
            w.push((k, None));
        }
        if w.is_empty() {
            return Ok(false);
        }
        forget_deleted(meta, w)?;
        if stopping() {
            return Ok(false);
        }
    }
}

/// Deletes the objects whose `Q` records are durable (read from the engine,
/// not the overlay), then their records; stops early once `stopping` says
/// so (an unmount does not wait for a long queue: the rest is left to the
/// next mount).
fn delete_doomed(
    meta: &Store,
    store: &objstore::Store,
    counters: &Counters,
    stopping: &dyn Fn() -> bool,
) -> Result<()> {
    let (start, end) = keys::prefix_range(keys::P_DOOMED);
    loop {
        let page = meta.engine().scan(&start, &end, DELETE_BATCH)?;
        if page.is_empty() {
            return Ok(());
        }
        // Visible is not durable on every engine (PostgreSQL: see
        // `MetaStore::commit_iter_visible`), and a commit the engine's
        // server loses in a crash must find its old objects still there.
        // One flush covers every record read above, any node's.
        meta.engine().make_durable()?;
        let mut w: Vec<Write> = Vec::with_capacity(page.len());
        let mut stopped = false;
        for (k, _) in &page {
            if stopping() {
                stopped = true;
                break;
            }
            if keys::is_doomed_file(k) {
                let Some(ino) = keys::key_ino(k) else {
                    continue;
                };
                if !delete_file_blocks(meta, store, counters, ino, stopping)? {
                    stopped = true;
                    break;
                }
            } else if let (Some(ino), Some(b), Some(g)) =
                (keys::key_ino(k), keys::key_block(k), keys::key_gen(k))
            {
                store
                    .delete(&blocks::object_key(ino, b, g))
                    .map_err(CoreError::Store)?;
                counters.deleted_objects.fetch_add(1, Relaxed);
            }
            w.push((k.clone(), None));
        }
        let done = w.len();
        if done > 0 {
            forget_deleted(meta, w)?;
        }
        if stopped || done < DELETE_BATCH {
            return Ok(());
        }
    }
}

impl Fs {
    /// Brings `ino`'s backing file up to date with its block map before it
    /// is opened or truncated (see the module comment). Nothing on volumes
    /// without an object store.
    pub(super) fn fetch(&self, ino: u64) -> Result<()> {
        let Some(r) = &self.remote else {
            return Ok(());
        };
        if r.current.lock().contains(&ino) {
            r.counters.hits.fetch_add(1, Relaxed);
            return Ok(());
        }
        let _g = r.lock(ino).lock();
        for _ in 0..RACES {
            match self.fetch_locked(r, ino) {
                // Replaced by another node and deleted since the map was
                // read: read it again, from the engine.
                Err(CoreError::Store(StoreError::NotFound(_))) => {
                    r.maps.lock().remove(&ino);
                }
                other => return other,
            }
        }
        tracing::warn!(
            ino,
            "the block map kept changing on other nodes: not fetched"
        );
        Err(CoreError::Io(std::io::Error::from_raw_os_error(libc::EIO)))
    }

    fn fetch_locked(&self, r: &Remote, ino: u64) -> Result<()> {
        if r.current.lock().contains(&ino) || self.end_fill(r, ino)? {
            return Ok(());
        }
        let fetched = self.fetch_whole(r, ino);
        match &fetched {
            Ok(()) => self.fill_done(r, ino),
            Err(_) => self.revive_fill(r, ino),
        }
        fetched
    }

    fn fetch_whole(&self, r: &Remote, ino: u64) -> Result<()> {
        // A file freed meanwhile (by another node: its block records wait
        // for the deleter) has nothing to fetch, and no backing file here.
        {
            let mut st = self.state.lock();
            self.inode(&mut st, ino)?;
        }
        let map = self.known_map(r, ino)?;
        let digest = map_digest(&map);
        let path = self.data.path(ino);
        let local = match open_raw(&path) {
            Ok(f) => Some(f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e.into()),
        };
        if let Some(f) = &local {
            // Changes the store does not have yet: the backing file is newer
            // — unless the mark only waits for its upload's commit to be
            // durable (see `undirty`): then the map mark says what it holds.
            let uploaded = r.undirty.lock().contains_key(&ino);
            let dirty = !uploaded && get_xattr(f, DIRTY)?.is_some();
            if dirty || get_xattr(f, MAP)? == Some(map_mark(&digest)) {
                r.counters.hits.fetch_add(1, Relaxed);
                r.current.lock().insert(ino);
                return Ok(());
            }
            if uploaded {
                // Another node's map replaced the uploaded one: the backing
                // file becomes that map's, and the mark goes with the entry.
                remove_xattr(f, DIRTY)?;
                r.undirty.lock().remove(&ino);
            }
        }
        if map.is_empty() && local.is_none() {
            r.counters.hits.fetch_add(1, Relaxed);
            r.current.lock().insert(ino);
            return Ok(());
        }
        r.uploaded.lock().remove(&ino);
        if local.is_none() {
            drop(self.data.open(ino)?);
        }
        let f = open_raw(&path)?;
        let len = map_len(&map);
        // Cut first: what lies past the map's end is not the file's, and
        // a missing block is a hole.
        f.set_len(len)?;
        let mut buf = Vec::new();
        let mut wanted = Vec::new();
        for (idx, off, n) in blocks_of(len) {
            match map.get(&idx).filter(|b| !b.is_zero()) {
                Some(b) => {
                    // A hole here (a lost cache): nothing to compare.
                    if data_in(&f, off, n)? {
                        buf.resize(n as usize, 0);
                        if read_up_to(&f, &mut buf, off)? == buf.len() && b.holds(&buf) {
                            continue;
                        }
                    }
                    if let Some(d) = &b.data {
                        check_block(ino, idx, b, d)?;
                        f.write_all_at(d, off)?;
                    } else {
                        wanted.push((idx, off, b.clone()));
                    }
                }
                // Zeros: a hole, unless the backing file has data there.
                None if data_in(&f, off, n)? => punch(&f, off, n)?,
                None => {}
            }
        }
        let fetched = wanted.len();
        let c = &r.counters;
        if fetched == 0 {
            c.hits.fetch_add(1, Relaxed);
        } else {
            c.misses.fetch_add(1, Relaxed);
            c.fetched_blocks.fetch_add(fetched as u64, Relaxed);
            let bytes: u64 = wanted.iter().map(|(_, _, b)| u64::from(b.len)).sum();
            c.fetched_bytes.fetch_add(bytes, Relaxed);
        }
        let keys: Vec<String> = wanted
            .iter()
            .map(|(idx, _, b)| blocks::object_key(ino, *idx, b.generation))
            .collect();
        // Checked and written by the client's threads as they arrive.
        let (wanted, out) = (Arc::new(wanted), Arc::new(f.try_clone()?));
        let stored = r.store.get_each(
            &keys,
            move |i| {
                let (idx, off, b) = &wanted[i];
                incoming::Incoming::file(ino, *idx, b.clone(), *off, Arc::clone(&out))
            },
            |_, _| Ok(()),
        );
        stored?;
        // Fetching is no change: the backing file keeps the file's mtime
        // (a writer's close takes a newer one from it).
        let mtime = {
            let mut st = self.state.lock();
            self.inode(&mut st, ino)?.mtime
        };
        partial::set_mtime(&f, mtime)?;
        set_xattr(&f, MAP, &map_mark(&digest))?;
        if fetched > 0 {
            tracing::debug!(ino, fetched, "blocks fetched from the object store");
        }
        r.current.lock().insert(ino);
        Ok(())
    }

    /// Marks `ino`'s backing file as holding changes the store lacks: a
    /// writable open or a truncate (under the state lock, before the
    /// change).
    pub(super) fn mark_dirty(&self, ino: u64, file: &File) -> Result<()> {
        let Some(r) = &self.remote else {
            return Ok(());
        };
        *r.changes.lock().entry(ino).or_default() += 1;
        set_xattr(file, DIRTY, boot())?;
        r.current.lock().insert(ino);
        r.writing.lock().insert(ino);
        Ok(())
    }

    /// Uploads the blocks of `ino`'s backing file that differ from its map
    /// and applies the new map with the file's size in one batch; returns
    /// that batch's sequence number (0: nothing to do). See the module
    /// comment. Another node may change the map meanwhile: the new map
    /// is applied only if the one it was built on is still current (last
    /// close wins), else built again.
    pub(super) fn upload(&self, ino: u64, why: Upload) -> Result<u64> {
        let Some(r) = &self.remote else {
            return Ok(0);
        };
        if why == Upload::Close && self.state.lock().writers(ino) <= 1 {
            // Before the stripe: the stager, which takes it too, then
            // leaves the file alone.
            r.writing.lock().remove(&ino);
        }
        let _g = r.lock(ino).lock();
        r.counters.uploading.fetch_add(1, Relaxed);
        let tried = self.upload_tries(r, ino, why);
        r.counters.uploading.fetch_sub(1, Relaxed);
        tried
    }

    fn upload_tries(&self, r: &Remote, ino: u64, why: Upload) -> Result<u64> {
        for _ in 0..RACES {
            if let Some(seq) = self.upload_once(r, ino, why)? {
                return Ok(seq);
            }
        }
        tracing::warn!(
            ino,
            "the block map kept changing on other nodes: not uploaded"
        );
        Err(CoreError::Io(std::io::Error::from_raw_os_error(
            libc::EAGAIN,
        )))
    }

    /// One try of [`Fs::upload`]; `None`: the map changed meanwhile.
    fn upload_once(&self, r: &Remote, ino: u64, why: Upload) -> Result<Option<u64>> {
        let mut staged = r.take_staged(ino);
        let named = self.upload_staged(r, ino, why, &mut staged);
        // What the stager sent that this upload did not name: garbage
        // (named ones are in the map, or queued by a lost race).
        let unused: Vec<(u32, u64)> = staged.iter().map(|(&i, s)| (i, s.generation)).collect();
        doom(&self.store, ino, &unused);
        named
    }

    /// [`Fs::upload_once`] given the blocks staged for it: each one it
    /// names (the block still hashes the same) is taken out of `staged`.
    fn upload_staged(
        &self,
        r: &Remote,
        ino: u64,
        why: Upload,
        staged: &mut BTreeMap<u32, Staged>,
    ) -> Result<Option<u64>> {
        {
            // Unlinked: nobody can open it again, and its blocks go with it.
            let mut st = self.state.lock();
            if self
                .load_opt(&mut st, ino)?
                .is_none_or(|c| c.inode.nlink == 0)
            {
                return Ok(Some(0));
            }
        }
        let change = r.changes.lock().get(&ino).copied().unwrap_or(0);
        let f = match open_raw(&self.data.path(ino)) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Some(0)),
            Err(e) => return Err(e.into()),
        };
        r.uploaded.lock().remove(&ino);
        let before = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse);
        let meta = f.metadata()?;
        let mut len = meta.len();
        let old = self.known_map(r, ino)?;
        if len == 0 && old.is_empty() {
            // Empty, and so was its map (a file created and closed): no
            // block, no record; only the mark goes.
            let writers = self.state.lock().writers(ino);
            if writers <= u32::from(why == Upload::Close) {
                remove_xattr(&f, DIRTY)?;
            }
            return Ok(Some(0));
        }
        if why == Upload::Recover {
            // Changes a daemon left behind, made on a map another node has
            // replaced since: the other node's contents win.
            let base = get_xattr(&f, MAP)?;
            let moved = match &base {
                Some(b) => b.get(..DIGEST) != Some(&map_digest(&old)[..]),
                None => !old.is_empty(),
            };
            if moved {
                tracing::warn!(
                    ino,
                    "changes left by a stopped daemon were made on contents another node \
                     has replaced since: discarded"
                );
                remove_xattr(&f, DIRTY)?;
                r.current.lock().remove(&ino);
                return Ok(Some(0));
            }
        }
        let mut map = BTreeMap::new();
        let mut buf = Vec::new();
        let mut sent = Vec::new();
        // Blocks go up while the next ones are read and hashed.
        let mut puts = r.store.puts();
        let mut at = 0;
        while at < len {
            // Holes are zeros: no read, no record.
            let Some(data) = next_data(&f, at)?.filter(|&d| d < len) else {
                break;
            };
            let idx = (data / BLOCK) as u32;
            let off = u64::from(idx) * BLOCK;
            buf.resize((len - off).min(BLOCK) as usize, 0);
            let n = read_up_to(&f, &mut buf, off)?;
            if n < buf.len() {
                // It shrank meanwhile: a later upload takes the rest.
                buf.truncate(n);
                len = off + n as u64;
            }
            at = off + BLOCK;
            if buf.iter().all(|&x| x == 0) {
                continue;
            }
            let hash = blocks::hash(&buf);
            match old.get(&idx) {
                Some(o) if !o.is_zero() && o.holds_hashed(&buf[..n], &hash) => {
                    map.insert(idx, o.clone());
                }
                // A small file: its bytes go in the record.
                _ if idx == 0 && len <= blocks::INLINE_MAX => {
                    map.insert(
                        idx,
                        BlockRef {
                            generation: blocks::INLINE,
                            len: n as u32,
                            hash,
                            kind: blocks::HASH,
                            data: Some(buf[..n].into()),
                        },
                    );
                }
                // Sent ahead by the stager, and still what the block holds.
                _ if n as u64 == BLOCK && staged.get(&idx).is_some_and(|s| s.hash == hash) => {
                    let s = staged.remove(&idx).expect("looked up");
                    map.insert(
                        idx,
                        BlockRef {
                            generation: s.generation,
                            len: n as u32,
                            hash,
                            kind: blocks::HASH,
                            data: None,
                        },
                    );
                    sent.push((idx, s.generation));
                }
                _ => {
                    let generation = new_generation();
                    map.insert(
                        idx,
                        BlockRef {
                            generation,
                            len: n as u32,
                            hash,
                            kind: blocks::HASH,
                            data: None,
                        },
                    );
                    sent.push((idx, generation));
                    r.counters.uploaded_blocks.fetch_add(1, Relaxed);
                    r.counters.uploaded_bytes.fetch_add(n as u64, Relaxed);
                    puts.put(
                        blocks::object_key(ino, idx, generation),
                        std::mem::take(&mut buf),
                    )
                    .map_err(CoreError::Store)?;
                }
            }
        }
        puts.finish().map_err(CoreError::Store)?;
        // The last block is always recorded: it says where the file ends.
        if let Some((idx, _, n)) = blocks_of(len).last() {
            map.entry(idx).or_insert(BlockRef {
                generation: 0,
                len: n as u32,
                hash: [0; 16],
                kind: blocks::HASH,
                data: None,
            });
        }
        let mut w: Vec<Write> = Vec::new();
        for idx in old
            .keys()
            .chain(map.keys())
            .copied()
            .collect::<std::collections::BTreeSet<u32>>()
        {
            let (was, now) = (old.get(&idx), map.get(&idx));
            if was == now {
                continue;
            }
            let k = keys::block(ino, idx);
            w.push((k.to_vec(), now.map(|b| b.encode(&k))));
            if let Some(o) = was.filter(|o| o.has_object()) {
                let q = keys::doomed(ino, idx, o.generation);
                w.push((q.to_vec(), Some(blocks::encode_doomed(&q))));
            }
        }
        if !map.is_empty() {
            // Before the records exist: a free that races this upload
            // reads them.
            r.bare.lock().remove(&ino);
        }
        let seq = {
            let _t = self.writable()?;
            // Another node's commit since the map was read dropped it from
            // `maps` (the lease catches up first); one node alone never
            // races itself (uploads of a file take its stripe).
            let unchanged = r.maps.lock().get(&ino) == Some(&old)
                || (self.is_shared() && self.block_map(ino)? == old)
                || !self.is_shared();
            if !unchanged {
                // Another node's upload came first: ours is built again on
                // its map, and the objects sent for this one go.
                if !sent.is_empty() {
                    self.store.apply(doomed_writes(ino, &sent));
                }
                return Ok(None);
            }
            let mut st = self.state.lock();
            let Some(c) = self.load_opt(&mut st, ino)? else {
                // Freed meanwhile: its records went with it, and the
                // objects just sent go too.
                drop(st);
                if !sent.is_empty() {
                    self.store.apply(doomed_writes(ino, &sent));
                }
                return Ok(Some(0));
            };
            // A truncate since the blocks were read (it marks the file
            // under this lock): committing `len` as the size would undo
            // it. Built again on what it left.
            let truncated = r.changes.lock().get(&ino).copied().unwrap_or(0) != change
                && f.metadata()?.len() != len;
            if truncated {
                drop(st);
                if !sent.is_empty() {
                    self.store.apply(doomed_writes(ino, &sent));
                }
                return Ok(None);
            }
            // The size only: the times and blocks go with the last
            // writer's release, off the close's path (recorded here, the
            // map mark set below changes the backing file's blocks, and
            // the release's upload then waited for a commit of its own:
            // twice the commits per closed file).
            let mut inode = c.inode.clone();
            let size = self.data.plain_size(len);
            if inode.size != size {
                inode.size = size;
                inode.blocks = std::os::unix::fs::MetadataExt::blocks(&meta);
                self.put_inode(&mut st, &mut w, ino, inode);
            }
            if w.is_empty() { 0 } else { self.store.apply(w) }
        };
        // Visible to every node before the close returns (`fsync` waits
        // for durability after this). The map mark may go on now: while
        // the dirty mark stays, a mount that finds the map mark ahead of
        // the engine's map (a server crash lost the commit) drops the
        // changes rather than trust the backing file. The dirty mark goes
        // only once the commit is durable (cleared earlier, a crash losing
        // the commit left a clean-looking backing file beside the older
        // map: recovery then took its size for the file's, and nothing
        // uploaded it again). On engines whose commits are durable at once
        // (LMDB) the two are the same.
        if seq > 0 {
            self.store.wait_landed(seq)?;
        }
        set_xattr(&f, MAP, &map_mark(&map_digest(&map)))?;
        r.maps.lock().insert(ino, map);
        let unchanged = r.changes.lock().get(&ino).copied().unwrap_or(0) == change;
        if unchanged && len == meta.len() {
            if let Some(u) = Unwritten::of(&meta, before) {
                r.uploaded.lock().insert(ino, u);
            }
            let writers = self.state.lock().writers(ino);
            if writers <= u32::from(why == Upload::Close) {
                self.undirty(r, &f, ino, seq, change, len)?;
            }
        }
        r.failed.lock().remove(&ino);
        if !sent.is_empty() {
            tracing::debug!(
                ino,
                sent = sent.len(),
                "blocks uploaded to the object store"
            );
        }
        Ok(Some(seq))
    }

    /// Clears `ino`'s dirty mark (its backing file, `len` bytes after
    /// `change` writable opens and truncates, matching the map committed by
    /// `seq` or earlier) once that commit is durable: now if it is, else
    /// by [`Fs::undirty_durable`] later.
    fn undirty(
        &self,
        r: &Remote,
        f: &File,
        ino: u64,
        seq: u64,
        change: u64,
        len: u64,
    ) -> Result<()> {
        // Nothing committed for it: the map it matches is in the engine
        // already, so everything landed covers it.
        let after = seq.max(self.store.landed_seq());
        if self.store.durable_seq() >= after {
            remove_xattr(f, DIRTY)?;
        } else {
            r.undirty.lock().insert(ino, Undirty { after, change, len });
        }
        Ok(())
    }

    /// The dirty marks [`Fs::undirty`] left waiting whose commits are
    /// durable now: cleared unless the file changed since (a writable
    /// open or a truncate marked it again, and its own upload clears it).
    pub fn undirty_durable(&self) {
        let Some(r) = &self.remote else {
            return;
        };
        let durable = self.store.durable_seq();
        let ready: Vec<u64> = {
            let q = r.undirty.lock();
            q.iter()
                .filter(|(_, u)| u.after <= durable)
                .map(|(&ino, _)| ino)
                .collect()
        };
        for ino in ready {
            // Not beside an upload or a fetch of it, nor an open marking
            // it (under the state lock); taken out only then, so that a
            // fetch never finds the mark without its entry meanwhile.
            let _g = r.lock(ino).lock();
            let st = self.state.lock();
            let u = {
                let mut q = r.undirty.lock();
                match q.get(&ino) {
                    Some(u) if u.after <= durable && st.writers(ino) == 0 => {
                        q.remove(&ino).expect("looked up")
                    }
                    // Replaced by a newer upload, fetched over, or its
                    // closing writer's handle still registered.
                    _ => continue,
                }
            };
            if r.changes.lock().get(&ino).copied().unwrap_or(0) != u.change {
                continue;
            }
            let path = self.data.path(ino);
            let cleared = match std::fs::metadata(&path) {
                Ok(m) if m.len() == u.len => rustix::fs::removexattr(&path, DIRTY).or_else(|e| {
                    if e == rustix::io::Errno::NODATA {
                        Ok(())
                    } else {
                        Err(e)
                    }
                }),
                _ => Ok(()),
            };
            if let Err(e) = cleared {
                tracing::warn!(ino, error = %e, "cannot clear a dirty mark: the next mount uploads the file again");
            }
        }
    }

    /// Whether `ino`'s backing file is as the last upload that read all
    /// of it found it (see [`Unwritten`]): nothing to upload.
    pub(super) fn unwritten_since_upload(&self, ino: u64) -> bool {
        let Some(r) = &self.remote else {
            return true;
        };
        let Some(was) = r.uploaded.lock().get(&ino).copied() else {
            return false;
        };
        std::fs::metadata(self.data.path(ino)).is_ok_and(|m| Unwritten::now(&m) == was)
    }

    /// [`Fs::upload`] where nobody waits for it (a writer's close): a
    /// failure is logged and tried again at unmount.
    pub(super) fn upload_later_if_failing(&self, ino: u64, why: Upload) {
        if let Err(e) = self.upload(ino, why) {
            tracing::warn!(ino, error = %e, "cannot upload a closed file's contents: tried again at unmount");
            if let Some(r) = &self.remote {
                r.failed.lock().insert(ino);
            }
        }
    }

    /// At unmount: the uploads that failed, tried once more, and the
    /// deleter stopped. False if some contents are still only local (the
    /// volume is then left for the next mount's recovery).
    pub(super) fn finish_remote(&self) -> bool {
        let Some(r) = &self.remote else {
            return true;
        };
        r.stop_threads();
        let failed: Vec<u64> = r.failed.lock().iter().copied().collect();
        let mut all = true;
        for ino in failed {
            if let Err(e) = self.upload(ino, Upload::Sync) {
                tracing::error!(ino, error = %e, "contents not uploaded: the next mount tries again");
                all = false;
            }
        }
        // Every upload's dirty mark goes once its commit is durable: a
        // clean unmount leaves none for the next mount to upload again.
        if let Err(e) = self.store.sync() {
            tracing::warn!(error = %e, "metadata not durable at unmount: dirty marks stay");
            return all;
        }
        self.undirty_durable();
        all
    }

    /// At unmount, after the last uploads and reclaims: the objects queued
    /// for deletion so far are deleted (for at most [`UNMOUNT_DELETE`]),
    /// so that a clean unmount leaves in the store what records name — a
    /// block rewritten or staged and replaced just before it included.
    pub(super) fn delete_doomed_at_unmount(&self) {
        let Some(r) = &self.remote else {
            return;
        };
        if self.opts.read_only {
            return;
        }
        // The deleter takes only records of durable batches.
        if let Err(e) = self.store.sync() {
            tracing::warn!(error = %e, "objects queued for deletion are left to the next mount");
            return;
        }
        let deadline = Instant::now() + UNMOUNT_DELETE;
        let stopping = || Instant::now() >= deadline;
        if let Err(e) = delete_doomed(&self.store, &r.store, &r.counters, &stopping) {
            tracing::warn!(error = %e, "objects queued for deletion are left to the next mount");
        }
    }

    /// At mount: uploads every backing file marked dirty (see the module
    /// comment), left so by a daemon that stopped before its upload; how
    /// many. A look at each cached file's xattr, no read.
    ///
    /// The cached files then make up the cache, oldest change first, and
    /// the cache is trimmed to its bound.
    pub(super) fn upload_dirty(&self) -> Result<u64> {
        let Some(r) = &self.remote else {
            return Ok(0);
        };
        let mut done = 0;
        let mut cached = Vec::new();
        for (i, dir) in self.layout.backing_dirs() {
            for e in std::fs::read_dir(&dir)?.flatten() {
                let Some(ino) = super::volume::backing_ino(&e.file_name(), i) else {
                    continue;
                };
                match dirty_mark(&e.path())? {
                    Dirty::Clean => {}
                    Dirty::Here => {
                        self.upload(ino, Upload::Recover)?;
                        self.doom_unnamed(r, ino)?;
                        done += 1;
                    }
                    Dirty::Lost => {
                        self.drop_unsynced(r, ino, &e.path())?;
                        self.doom_unnamed(r, ino)?;
                    }
                }
                // Empty ones (the pool's made-ahead files among them) take
                // no space.
                if let Ok(m) = e.metadata()
                    && allocated(&m) > 0
                {
                    cached.push((m.modified().ok(), ino, allocated(&m)));
                }
            }
        }
        cached.sort();
        {
            let mut c = r.cache.lock();
            for (_, ino, bytes) in cached {
                c.insert(ino, bytes);
            }
        }
        self.trim_cache();
        Ok(done)
    }

    /// At mount, a backing file marked dirty in another boot (see
    /// [`Dirty::Lost`]): its changes since its last upload are dropped, not
    /// uploaded — what it holds may be torn, and what was synced is in the
    /// store. The record's size goes with the map, so a truncate committed
    /// meanwhile (an open with `O_TRUNC`) is dropped too; then the marks go,
    /// the map's first, so that its next open checks it against the map
    /// whatever happens between the two (a stop before that finds it again).
    fn drop_unsynced(&self, r: &Remote, ino: u64, path: &Path) -> Result<()> {
        let map = self.block_map(ino)?;
        let size = self.data.plain_size(map_len(&map));
        let seq = {
            let _t = self.writable()?;
            let mut st = self.state.lock();
            match self.load_opt(&mut st, ino)? {
                Some(c) if c.inode.size != size => {
                    let mut inode = c.inode.clone();
                    inode.size = size;
                    inode.blocks = map_len(&map).div_ceil(512);
                    let mut w = Vec::new();
                    self.put_inode(&mut st, &mut w, ino, inode);
                    self.store.apply(w)
                }
                _ => 0,
            }
        };
        if seq > 0 {
            self.store.wait_durable(seq)?;
        }
        let f = open_raw(path)?;
        remove_xattr(&f, MAP)?;
        remove_xattr(&f, DIRTY)?;
        r.current.lock().remove(&ino);
        tracing::warn!(
            ino,
            "changes to this file not synced before the machine stopped: dropped; \
             it holds what its last upload put in the object store"
        );
        Ok(())
    }

    /// After the recovery of a file a stopped daemon left dirty (its
    /// changes uploaded, or dropped after a power cut): the objects under
    /// its prefix that its map does not name (blocks the stager sent, an
    /// upload the kill cut short) are queued for deletion,
    /// rather than left for `fsck --repair`. Only where this node is the
    /// volume's only one: on a shared volume another node writing the same
    /// file may be about to name what it staged.
    fn doom_unnamed(&self, r: &Remote, ino: u64) -> Result<()> {
        if self.is_shared() {
            return Ok(());
        }
        let listed = match r.store.list(&blocks::object_prefix(ino)) {
            Ok(l) => l,
            Err(e) => {
                // Garbage, not damage: fsck lists what is left.
                tracing::warn!(ino, error = %e, "cannot list a recovered file's objects");
                return Ok(());
            }
        };
        if listed.is_empty() {
            return Ok(());
        }
        let map = self.block_map(ino)?;
        let unnamed: Vec<(u32, u64)> = listed
            .iter()
            .filter_map(|o| blocks::parse_object_key(&o.key))
            .filter(|&(i, idx, g)| {
                i == ino
                    && map
                        .get(&idx)
                        .is_none_or(|b| !b.has_object() || b.generation != g)
            })
            .map(|(_, idx, g)| (idx, g))
            .collect();
        if !unnamed.is_empty() {
            tracing::info!(
                ino,
                objects = unnamed.len(),
                "objects a stopped daemon sent and no record names: queued for deletion"
            );
            doom(&self.store, ino, &unnamed);
        }
        Ok(())
    }

    /// Deletes `ino`'s block records and queues its objects (the inode is
    /// being freed, in batch `w`).
    pub(super) fn drop_blocks(&self, w: &mut Vec<Write>, ino: u64) -> Result<()> {
        let Some(r) = &self.remote else {
            return Ok(());
        };
        if !r.bare.lock().remove(&ino) {
            // The map is the deleter's to read (inode numbers are never
            // used again, so its records name nothing else meanwhile).
            let q = keys::doomed_file(ino);
            w.push((q.to_vec(), Some(blocks::encode_doomed(&q))));
        }
        r.current.lock().remove(&ino);
        r.maps.lock().remove(&ino);
        r.changes.lock().remove(&ino);
        r.uploaded.lock().remove(&ino);
        r.cache.lock().remove(ino);
        Ok(())
    }

    /// Another node changed `ino`'s block map (`None`: maybe any file's):
    /// its backing file is checked against the map again at the next open.
    pub(super) fn forget_contents(&self, ino: Option<u64>) {
        if let Some(r) = &self.remote {
            match ino {
                Some(ino) => {
                    r.current.lock().remove(&ino);
                    r.maps.lock().remove(&ino);
                    r.bare.lock().remove(&ino);
                    r.uploaded.lock().remove(&ino);
                }
                None => {
                    r.current.lock().clear();
                    r.maps.lock().clear();
                    r.bare.lock().clear();
                    r.uploaded.lock().clear();
                }
            }
        }
    }

    /// Closed files whose upload failed (the store unreachable then), tried
    /// again in turn until one fails (the store is still away: the rest
    /// wait for the next round); how many went up. A daemon's retrier
    /// calls it every few seconds, so that the store coming back heals
    /// them without an `fsync` or a remount; the unmount tries the rest.
    pub fn retry_failed_uploads(&self) -> usize {
        let Some(r) = &self.remote else {
            return 0;
        };
        if self.closed.load(Relaxed) {
            return 0;
        }
        let failed: Vec<u64> = r.failed.lock().iter().copied().collect();
        let mut done = 0;
        for ino in failed {
            match self.upload(ino, Upload::Sync) {
                Ok(_) => done += 1,
                Err(e) => {
                    tracing::debug!(ino, error = %e, "upload still failing: tried again later");
                    break;
                }
            }
        }
        if done > 0 {
            tracing::info!(files = done, "uploads that had failed went up");
        }
        done
    }

    /// The store's URL, on volumes whose contents are in one.
    pub fn data_store(&self) -> Option<String> {
        self.remote.as_ref().map(|r| r.url())
    }

    /// A new regular file `ino` (under the state lock): its map is empty,
    /// and its backing file current.
    pub(super) fn new_contents(&self, ino: u64) {
        if let Some(r) = &self.remote {
            r.current.lock().insert(ino);
            r.maps.lock().insert(ino, BTreeMap::new());
            let mut bare = r.bare.lock();
            if bare.len() < BARE_MAX {
                bare.insert(ino);
            }
            drop(bare);
        }
    }

    /// The last handle of `ino` closed: its map is read again at the next
    /// open (the maps kept stay those of open files), and its backing file
    /// joins the cache's newest end — the cache trimmed to its bound.
    pub(super) fn closed_contents(&self, ino: u64) {
        if let Some(r) = &self.remote {
            r.maps.lock().remove(&ino);
            if let Ok(m) = std::fs::metadata(self.data.path(ino)) {
                r.cache.lock().insert(ino, allocated(&m));
            }
            self.trim_cache();
        }
    }

    /// `ino` is gone from the volume (another node freed it) and nothing
    /// here refers to it any more: this node's cached copy of it goes, or
    /// it would stay on the disk with no file to evict it for.
    pub(super) fn drop_freed_copy(&self, ino: u64) {
        let Some(r) = &self.remote else {
            return;
        };
        let _g = r.lock(ino).lock();
        r.cache.lock().remove(ino);
        self.forget_contents(Some(ino));
        match std::fs::remove_file(self.data.path(ino)) {
            Ok(()) => tracing::debug!(ino, "dropped the cached copy of a file freed elsewhere"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(ino, error = %e, "cannot drop the cached copy of a freed file")
            }
        }
    }

    /// Whether `ino`'s backing file was dropped from the cache since its
    /// fetch (asked under the state lock, after the fetch): the caller
    /// fetches again.
    pub(super) fn evicted(&self, ino: u64) -> bool {
        self.remote
            .as_ref()
            .is_some_and(|r| !r.current.lock().contains(&ino))
    }

    /// [`Fs::evicted`] for a read-only open, which a fill serves too.
    pub(super) fn evicted_unless_filling(&self, ino: u64) -> bool {
        self.remote.as_ref().is_some_and(|r| {
            !r.current.lock().contains(&ino) && !r.partial.lock().contains_key(&ino)
        })
    }

    /// Deletes closed files' backing files, those closed longest ago
    /// first, until the cache is within its bound. A file whose fetch or
    /// upload runs now goes back to the newest end; one open again or
    /// holding changes not uploaded is left out (its close brings it back).
    pub(super) fn trim_cache(&self) {
        let Some(r) = &self.remote else {
            return;
        };
        let mut busy = Vec::new();
        loop {
            let (ino, bytes) = {
                let mut c = r.cache.lock();
                let Some(ino) = c.oldest_over() else {
                    break;
                };
                let bytes = c.files.get(&ino).map_or(0, |f| f.0);
                c.remove(ino);
                (ino, bytes)
            };
            match self.evict(r, ino) {
                Ok(Some(true)) => {
                    r.counters.evicted_files.fetch_add(1, Relaxed);
                    r.counters.evicted_bytes.fetch_add(bytes, Relaxed);
                }
                Ok(Some(false)) => {}
                Ok(None) => busy.push((ino, bytes)),
                Err(e) => {
                    tracing::warn!(ino, error = %e, "cannot drop a cached file: kept");
                }
            }
        }
        let mut c = r.cache.lock();
        for (ino, bytes) in busy {
            c.insert(ino, bytes);
        }
    }

    /// Drops `ino`'s backing file: `Some(true)` done, `Some(false)` left
    /// (open, or changes not uploaded), `None` busy (its fetch or upload
    /// holds its lock).
    fn evict(&self, r: &Remote, ino: u64) -> Result<Option<bool>> {
        let Some(_g) = r.lock(ino).try_lock() else {
            return Ok(None);
        };
        let path = self.data.path(ino);
        {
            // Opens and truncates mark and register under the state lock,
            // and look for their file in `current` under it; a fill lives
            // from before its first handle to after its last.
            let st = self.state.lock();
            if st.any_backing(ino).is_some()
                || r.partial.lock().contains_key(&ino)
                || marked_dirty(&path)?
            {
                return Ok(Some(false));
            }
            r.current.lock().remove(&ino);
            r.uploaded.lock().remove(&ino);
        }
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(Some(true)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Some(false)),
            Err(e) => Err(e.into()),
        }
    }

    /// The store's and the cache's figures, as `safs info --stats` shows
    /// them (`None`: contents are local).
    pub fn store_figures(&self) -> Option<safs_control::StoreReport> {
        let r = self.remote.as_ref()?;
        let c = &r.counters;
        let cache = r.cache.lock();
        Some(safs_control::StoreReport {
            url: r.url(),
            cache_bytes: cache.bytes,
            cache_files: cache.files.len() as u64,
            cache_limit_bytes: cache.limit,
            hits: c.hits.load(Relaxed),
            misses: c.misses.load(Relaxed),
            fetched_blocks: c.fetched_blocks.load(Relaxed),
            fetched_bytes: c.fetched_bytes.load(Relaxed),
            uploaded_blocks: c.uploaded_blocks.load(Relaxed),
            uploaded_bytes: c.uploaded_bytes.load(Relaxed),
            deleted_objects: c.deleted_objects.load(Relaxed),
            evicted_files: c.evicted_files.load(Relaxed),
            evicted_bytes: c.evicted_bytes.load(Relaxed),
            uploads_waiting: c.uploading.load(Relaxed) + r.failed.lock().len() as u64,
            deletions_queued: self.deletions_queued(),
        })
    }

    /// The `Q` records the deleter has yet to take (those of batches not
    /// committed yet too), up to [`safs_control::DELETIONS_COUNTED`] (0 if
    /// the engine cannot say).
    fn deletions_queued(&self) -> u64 {
        let (start, end) = keys::prefix_range(keys::P_DOOMED);
        let limit = safs_control::DELETIONS_COUNTED as usize;
        match self.store.scan(&start, &end, limit) {
            Ok(page) => page.len() as u64,
            Err(e) => {
                tracing::debug!(error = %e, "queued deletions not counted");
                0
            }
        }
    }

    /// `ino`'s map as this node knows it, else as the engine has it.
    fn known_map(&self, r: &Remote, ino: u64) -> Result<BTreeMap<u32, BlockRef>> {
        if let Some(m) = r.maps.lock().get(&ino) {
            return Ok(m.clone());
        }
        let map = self.block_map(ino)?;
        r.maps.lock().insert(ino, map.clone());
        Ok(map)
    }

    /// `ino`'s block map: records of the blocks with data, and of the last
    /// block (where the file ends); a block without one is zeros.
    fn block_map(&self, ino: u64) -> Result<BTreeMap<u32, BlockRef>> {
        block_map_in(&self.store, ino)
    }
}

/// `ino`'s block map as the engine (and what waits to be committed) has it.
fn block_map_in(store: &Store, ino: u64) -> Result<BTreeMap<u32, BlockRef>> {
    let (start, end) = keys::ino_range(keys::P_BLOCK, ino);
    let mut map = BTreeMap::new();
    for (k, v) in store.scan(&start, &end, usize::MAX)? {
        let idx = keys::key_block(&k).ok_or_else(|| {
            CoreError::corrupt(&k, crate::format::FormatError::Malformed("short block key"))
        })?;
        map.insert(
            idx,
            BlockRef::decode(&k, &v).map_err(|e| CoreError::corrupt(&k, e))?,
        );
    }
    Ok(map)
}

impl Drop for Remote {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

/// Marks the backing file at `path` as holding what the store lacks (a
/// volume moving its contents into a store: the next mount uploads it).
pub(crate) fn mark_dirty_at(path: &Path) -> std::io::Result<()> {
    rustix::fs::setxattr(path, DIRTY, b"", rustix::fs::XattrFlags::empty())?;
    Ok(())
}

/// What a backing file's dirty mark says of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dirty {
    /// No mark (or no backing file): the store holds what it holds.
    Clean,
    /// Changes the store lacks, from this boot (a daemon that stopped:
    /// the page cache kept them), or unnamed (a volume moved into a store,
    /// whose files were synced; or a mark made before marks named boots).
    Here,
    /// Marked in another boot: the machine stopped with the file open for
    /// writing, and bytes never synced may be gone (see the module comment).
    Lost,
}

/// The dirty mark of the backing file at `path`. A look at its xattr: no
/// open, no read.
pub(crate) fn dirty_mark(path: &Path) -> std::io::Result<Dirty> {
    let mut buf = [0u8; 64];
    match rustix::fs::getxattr(path, DIRTY, &mut buf) {
        Ok(n) if n == 0 || buf[..n] == *boot() => Ok(Dirty::Here),
        Ok(_) | Err(rustix::io::Errno::RANGE) => Ok(Dirty::Lost),
        Err(rustix::io::Errno::NODATA | rustix::io::Errno::NOENT) => Ok(Dirty::Clean),
        Err(e) => Err(e.into()),
    }
}

/// Whether the backing file at `path` carries a dirty mark of any boot.
pub(crate) fn marked_dirty(path: &Path) -> std::io::Result<bool> {
    Ok(dirty_mark(path)? != Dirty::Clean)
}

/// A block from the store checked against its record: a damaged or
/// foreign object is never served.
fn check_block(ino: u64, block: u32, b: &BlockRef, data: &[u8]) -> Result<()> {
    if !b.holds(data) {
        return Err(bad_block(ino, block, b));
    }
    Ok(())
}

/// Says that what the store gave for `block` of `ino` does not match its
/// record: the error its reads get.
fn bad_block(ino: u64, block: u32, b: &BlockRef) -> CoreError {
    tracing::error!(
        ino,
        block,
        object = %blocks::object_key(ino, block, b.generation),
        "an object from the store does not match its block record: not served"
    );
    CoreError::Io(std::io::Error::from_raw_os_error(libc::EIO))
}

/// Bytes a backing file takes on the disk under the cache.
fn allocated(m: &std::fs::Metadata) -> u64 {
    std::os::unix::fs::MetadataExt::blocks(m) * 512
}

/// Bytes a map covers: up to the end of its last block.
fn map_len(map: &BTreeMap<u32, BlockRef>) -> u64 {
    map.last_key_value()
        .map_or(0, |(&idx, b)| u64::from(idx) * BLOCK + u64::from(b.len))
}

/// This boot's id, which map and dirty marks name (see the module comment).
fn boot() -> &'static [u8] {
    static BOOT: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BOOT.get_or_init(|| {
        std::fs::read("/proc/sys/kernel/random/boot_id")
            .map(|b| b.trim_ascii().to_vec())
            .unwrap_or_else(|e| {
                // Then every mark is distrusted at the next mount instead.
                tracing::warn!(error = %e, "no boot id: cached files are checked at each mount, and changes a stopped daemon left are dropped");
                format!("pid {}", std::process::id()).into_bytes()
            })
    })
}

/// Bytes of a [`map_digest`].
const DIGEST: usize = 16;

/// The `user.safs.map` value of a backing file matching the map of
/// `digest`: the digest, then this boot's id (see the module comment).
fn map_mark(digest: &[u8; DIGEST]) -> Vec<u8> {
    let mut mark = digest.to_vec();
    mark.extend_from_slice(boot());
    mark
}

fn map_digest(map: &BTreeMap<u32, BlockRef>) -> [u8; DIGEST] {
    let mut all = Vec::with_capacity(map.len() * 32);
    for (idx, b) in map {
        all.extend_from_slice(&idx.to_be_bytes());
        all.extend_from_slice(&b.generation.to_be_bytes());
        all.extend_from_slice(&b.len.to_be_bytes());
        all.extend_from_slice(&b.hash);
    }
    // Not the blocks' hash: SHA-256 as ever, so that the marks cached
    // files carry stay valid (a map's few bytes are no cost).
    blocks::Hash::Sha256.of(&all)
}

/// (block, offset, length) of every block of `len` bytes.
fn blocks_of(len: u64) -> impl Iterator<Item = (u32, u64, u64)> {
    (0..len.div_ceil(BLOCK)).map(move |i| (i as u32, i * BLOCK, (len - i * BLOCK).min(BLOCK)))
}

/// Where the first data at or after `at` lies (`None`: only holes follow).
fn next_data(f: &File, at: u64) -> std::io::Result<Option<u64>> {
    match nix::unistd::lseek(f, at as i64, nix::unistd::Whence::SeekData) {
        Ok(d) => Ok(Some(d as u64)),
        Err(nix::errno::Errno::ENXIO) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether `f` has data in `[off, off + n)`.
fn data_in(f: &File, off: u64, n: u64) -> std::io::Result<bool> {
    Ok(next_data(f, off)?.is_some_and(|d| d < off + n))
}

fn punch(f: &File, off: u64, n: u64) -> std::io::Result<()> {
    use nix::fcntl::FallocateFlags as F;
    nix::fcntl::fallocate(
        f,
        F::FALLOC_FL_PUNCH_HOLE | F::FALLOC_FL_KEEP_SIZE,
        off as i64,
        n as i64,
    )
    .map_err(std::io::Error::from)
}

/// A generation for a new object: random, so that nodes need not agree on
/// a counter (two versions of one block meet with odds of 2^-64).
fn new_generation() -> u64 {
    loop {
        let mut b = [0u8; 8];
        getrandom::getrandom(&mut b).expect("the kernel's random numbers");
        let g = u64::from_ne_bytes(b);
        if g != 0 {
            return g;
        }
    }
}

/// The backing file opened for the daemon's own reads and writes, which
/// must not count as a user's reads (atime, see `data`).
fn open_raw(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOATIME)
        .open(path)
}

fn set_xattr(f: &File, name: &std::ffi::CStr, value: &[u8]) -> std::io::Result<()> {
    rustix::fs::fsetxattr(f, name, value, rustix::fs::XattrFlags::empty())?;
    Ok(())
}

fn get_xattr(f: &File, name: &std::ffi::CStr) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = [0u8; 64];
    match rustix::fs::fgetxattr(f, name, &mut buf) {
        Ok(n) => Ok(Some(buf[..n].to_vec())),
        Err(rustix::io::Errno::NODATA) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn remove_xattr(f: &File, name: &std::ffi::CStr) -> std::io::Result<()> {
    match rustix::fs::fremovexattr(f, name) {
        Ok(()) | Err(rustix::io::Errno::NODATA) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

impl From<StoreError> for CoreError {
    fn from(e: StoreError) -> Self {
        CoreError::Store(e)
    }
}

/// A fetch's failure: the store's, or the errno of what was done with
/// what it gave (a block that does not match its record is `EIO`).
impl From<objstore::GetError> for CoreError {
    fn from(e: objstore::GetError) -> Self {
        match e {
            objstore::GetError::Store(e) => CoreError::Store(e),
            objstore::GetError::Each(e) => CoreError::Io(std::io::Error::from_raw_os_error(
                e.raw_os_error().unwrap_or(libc::EIO),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_gives_the_file_closed_longest_ago_once_past_its_bound() {
        let mut c = Cache {
            limit: 10,
            ..Cache::default()
        };
        c.insert(1, 4);
        c.insert(2, 4);
        assert_eq!(c.oldest_over(), None);
        c.insert(3, 4);
        assert_eq!((c.bytes, c.oldest_over()), (12, Some(1)));
        // Closed again: the newest, with its new size.
        c.insert(1, 1);
        assert_eq!((c.bytes, c.oldest_over()), (9, None));
        c.insert(4, 2);
        assert_eq!(c.oldest_over(), Some(2));
        c.remove(2);
        c.remove(2);
        assert_eq!((c.bytes, c.files.len(), c.order.len()), (7, 3, 3));
        assert_eq!(c.oldest_over(), None);
    }
}
