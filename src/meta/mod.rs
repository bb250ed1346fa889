//! Metadata engines: an ordered key-value store with atomic, durable batches.
//!
//! The core needs only three things from an engine — point reads, ordered
//! range scans and atomic batch commits — so that LMDB (embedded, default)
//! and later PostgreSQL or a distributed KV can sit behind the same trait
//! (JuiceFS `tkvClient`, TiKV `engine_traits`). Engines know nothing of
//! POSIX or of the record layouts.

mod lmdb;
mod mem;
pub mod postgres;

use std::path::Path;
use std::sync::Arc;

pub use lmdb::verify as lmdb_verify;
pub use lmdb::{LmdbSnapshot, LmdbStore, stays_in_leaf as lmdb_stays_in_leaf};
pub use mem::MemStore;
pub use postgres::PgStore;
use thiserror::Error;

/// The engines a volume's metadata can live in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EngineKind {
    /// LMDB in `<volume>/meta` (the embedded default).
    Lmdb,
    /// A PostgreSQL database that `<volume>/meta/postgres.conf` names.
    Postgres,
}

/// The file in a volume's `meta` directory naming its PostgreSQL database:
/// one line, a libpq connection string without a password.
pub const POSTGRES_CONF: &str = "postgres.conf";

impl EngineKind {
    /// The engine whose files are in `dir` (a volume's `meta` directory),
    /// if any.
    pub fn detect(dir: &Path) -> Option<EngineKind> {
        if dir.join("data.mdb").exists() {
            Some(EngineKind::Lmdb)
        } else if dir.join(POSTGRES_CONF).exists() {
            Some(EngineKind::Postgres)
        } else {
            None
        }
    }
}

/// What a new volume's metadata goes into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NewEngine {
    Lmdb,
    /// The database a libpq connection string names.
    Postgres(String),
}

/// The connection string a PostgreSQL volume's `meta` directory holds.
pub fn postgres_conninfo(dir: &Path) -> Result<String, MetaError> {
    let text = std::fs::read_to_string(dir.join(POSTGRES_CONF))?;
    let line = text
        .lines()
        .find(|l| !l.trim().is_empty() && !l.starts_with('#'));
    line.map(|l| l.trim().to_string()).ok_or_else(|| {
        MetaError::Engine(format!(
            "{} names no database",
            dir.join(POSTGRES_CONF).display()
        ))
    })
}

/// Which engine holds the metadata in `dir` and where, for `safs info`.
pub fn describe(dir: &Path) -> String {
    match EngineKind::detect(dir) {
        Some(EngineKind::Lmdb) => format!("LMDB in {}", dir.display()),
        Some(EngineKind::Postgres) => match postgres_conninfo(dir)
            .and_then(|c| postgres::conninfo::parse(&c).map_err(MetaError::Engine))
        {
            Ok(p) => format!("PostgreSQL, {}", p.shown),
            Err(e) => format!("PostgreSQL ({e})"),
        },
        None => "none".into(),
    }
}

/// Opens the metadata engine in `dir`, whichever it is: the one place that
/// chooses an engine. Opening checks the engine's own structure first
/// (for LMDB, every page: [`lmdb_verify`]; for PostgreSQL, the schema
/// version) and refuses a damaged one.
pub fn open(dir: &Path) -> Result<Arc<dyn MetaStore>, MetaError> {
    match EngineKind::detect(dir) {
        Some(EngineKind::Lmdb) => Ok(Arc::new(LmdbStore::open(dir)?)),
        Some(EngineKind::Postgres) => Ok(Arc::new(PgStore::open(&postgres_conninfo(dir)?)?)),
        None => Err(MetaError::Missing(dir.to_path_buf())),
    }
}

/// Opens the metadata engine in `dir` for reads only, writing nothing to
/// it (not even a lock or reader table): what is read before a volume is
/// served, e.g. to unlock an encrypted one. Checked like [`open`].
pub fn open_read_only(dir: &Path) -> Result<Box<dyn MetaRead>, MetaError> {
    match EngineKind::detect(dir) {
        Some(EngineKind::Lmdb) => Ok(Box::new(LmdbSnapshot::open(dir)?)),
        Some(EngineKind::Postgres) => {
            Ok(Box::new(PgStore::open_read_only(&postgres_conninfo(dir)?)?))
        }
        None => Err(MetaError::Missing(dir.to_path_buf())),
    }
}

/// What takes each pair of a snapshot (see [`snapshot_each`]).
pub type EachPair<'a> = dyn FnMut(&[u8], &[u8]) -> Result<(), MetaError> + 'a;

/// Hands every pair of the engine in `dir` to `f` in key order, as one
/// consistent snapshot that does not stop a daemon serving the volume.
pub fn snapshot_each(dir: &Path, f: &mut EachPair) -> Result<(), MetaError> {
    match EngineKind::detect(dir) {
        Some(EngineKind::Lmdb) => lmdb::snapshot_each(dir, f),
        Some(EngineKind::Postgres) => PgStore::snapshot_each(&postgres_conninfo(dir)?, f),
        None => Err(MetaError::Missing(dir.to_path_buf())),
    }
}

/// Converts the metadata in `dir` to the schema this build writes:
/// `Some((from, to))` for engines with a schema (PostgreSQL), `None` for
/// those whose format the volume's own version covers (LMDB).
pub fn upgrade(dir: &Path) -> Result<Option<(i32, i32)>, MetaError> {
    match EngineKind::detect(dir) {
        Some(EngineKind::Lmdb) => Ok(None),
        Some(EngineKind::Postgres) => {
            let from = PgStore::upgrade(&postgres_conninfo(dir)?)?;
            Ok(Some((from, postgres::SCHEMA_VERSION)))
        }
        None => Err(MetaError::Missing(dir.to_path_buf())),
    }
}

/// Creates a new, empty store in `dir` (a volume's `meta` directory). A
/// PostgreSQL database that already holds a volume is refused unless
/// `force`.
pub fn create(
    dir: &Path,
    engine: &NewEngine,
    force: bool,
) -> Result<Arc<dyn MetaStore>, MetaError> {
    match engine {
        NewEngine::Lmdb => Ok(Arc::new(LmdbStore::open(dir)?)),
        NewEngine::Postgres(conninfo) => {
            let store = PgStore::create(conninfo, force)?;
            std::fs::write(dir.join(POSTGRES_CONF), format!("{}\n", conninfo.trim()))?;
            Ok(Arc::new(store))
        }
    }
}

/// One write of a batch: a put (`Some`) or a delete (`None`).
pub type Write = (Vec<u8>, Option<Vec<u8>>);
/// A write borrowed from a batch its owner keeps: key, and value or `None`
/// to delete.
pub type WriteRef<'a> = (&'a [u8], Option<&'a [u8]>);

/// Key-value pairs in key order, as scans return them.
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum MetaError {
    /// The store cannot grow: the disk under it is full (or the map is).
    #[error("metadata store is full")]
    NoSpace,
    #[error("metadata engine: {0}")]
    Engine(String),
    /// The engine's own structure is damaged: opening it could crash the
    /// engine or misread it, so it is not opened.
    #[error(
        "{} is damaged: {what}. safs will not open it (the engine could crash or misread it); \
         restore the volume from a backup",
        path.display()
    )]
    Damaged {
        path: std::path::PathBuf,
        what: String,
    },
    #[error("metadata I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A sealed (encrypted) record failed authentication: changed, moved
    /// or truncated. Never served.
    #[error("record {0} failed authentication (changed or moved)")]
    Sealed(String),
    /// Another daemon (anywhere) serves the volume.
    #[error("the volume is in use by {0}")]
    Claimed(String),
    /// A commit under a write lease found that another daemon committed
    /// since the lease was taken: the lease was lost (its connection cut).
    #[error("the volume's write lease was lost: {0}")]
    LeaseLost(String),
    /// No engine's files in the directory.
    #[error("{} holds no metadata store", .0.display())]
    Missing(std::path::PathBuf),
}

/// Point reads and range scans. Every call sees one consistent snapshot.
pub trait MetaRead {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, MetaError>;

    /// Up to `limit` pairs with `start <= key < end`, in key order.
    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Pairs, MetaError>;

    /// The value at `key` and, if it is long enough, the value at the key
    /// it points to: `prefix` followed by its 8 bytes at `at` (a directory
    /// entry and the inode it names, for a lookup). Engines that pay a
    /// round trip per read answer both in one (and say so in
    /// [`MetaRead::follows_in_one_read`]); the default reads twice.
    fn get_and_follow(&self, key: &[u8], at: usize, prefix: u8) -> Result<Followed, MetaError> {
        let Some(value) = self.get(key)? else {
            return Ok(None);
        };
        let pointee = match pointer_key(&value, at, prefix) {
            Some(k) => self.get(&k)?,
            None => None,
        };
        Ok(Some((value, pointee)))
    }

    /// The values at `keys`, in their order. Engines answer them in one
    /// read transaction (LMDB) or one round trip (PostgreSQL); the default
    /// reads each in turn.
    fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, MetaError> {
        keys.iter().map(|k| self.get(k)).collect()
    }

    /// [`MetaRead::scan`], each pair with the value its value points to, as
    /// [`MetaRead::get_and_follow`] follows (directory entries and their
    /// inodes, for a window of a cold walk). Engines that follow in one
    /// read answer in one round trip; the default reads the pointees in
    /// one [`MetaRead::get_many`].
    fn scan_and_follow(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        at: usize,
        prefix: u8,
    ) -> Result<Vec<ScannedFollowed>, MetaError> {
        let pairs = self.scan(start, end, limit)?;
        with_pointees(pairs, at, prefix, |keys| self.get_many(keys))
    }

    /// [`MetaRead::scan_and_follow`], then, breadth first while fewer than
    /// `limit` pairs are read, the range each pair that `descend` marks
    /// points to (see [`Descend`]), each scanned in key order: a directory's
    /// window and its subdirectories' entries, for a walk through a tree of
    /// small directories (`git status`). The first range comes whole (up to
    /// `limit`) before any other; a later range may be cut by the limit.
    /// Engines that follow in one read answer in one round trip; the default
    /// reads each range in turn.
    fn scan_tree_and_follow(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        at: usize,
        prefix: u8,
        descend: Descend,
    ) -> Result<Vec<ScannedFollowed>, MetaError> {
        descend.walk(start, end, limit, at, |lo, hi, n| {
            self.scan_and_follow(lo, hi, n, at, prefix)
        })
    }

    /// [`MetaRead::get_and_follow`], and with it, when the pointee was
    /// found, the pairs whose keys lie in `[companion ‖ p, companion ‖ p ‖
    /// 0xff)`, `p` being the 8 pointer bytes (an inode's spill pages, for a
    /// cold lookup whose next request will want them). Only engines that
    /// follow in one read answer the range (in the same round trip);
    /// `None` here means not read.
    fn get_follow_and_range(
        &self,
        key: &[u8],
        at: usize,
        prefix: u8,
        _companion: u8,
    ) -> Result<FollowedWith, MetaError> {
        Ok(self
            .get_and_follow(key, at, prefix)?
            .map(|(v, p)| (v, p, None)))
    }

    /// Whether [`MetaRead::get_and_follow`] costs what one read costs: only
    /// then is it worth calling by a caller that may not need the pointee.
    fn follows_in_one_read(&self) -> bool {
        false
    }
}

/// Which pairs [`MetaRead::scan_tree_and_follow`] goes down from: those
/// whose value holds `kind` at byte `kind_at`; and where: the keys
/// `[prefix ‖ p, prefix ‖ (p + 1))`, `p` the value's 8 pointer bytes read
/// as a big-endian number (a directory entry's inode number, and the
/// entries of that directory).
#[derive(Clone, Copy, Debug)]
pub struct Descend {
    pub prefix: u8,
    pub kind_at: usize,
    pub kind: u8,
}

impl Descend {
    /// [`MetaRead::scan_tree_and_follow`] as the default method answers
    /// it, by a scan of each range in turn (`scan(lo, hi, limit)`).
    pub fn walk<E>(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        at: usize,
        mut scan: impl FnMut(&[u8], &[u8], usize) -> Result<Vec<ScannedFollowed>, E>,
    ) -> Result<Vec<ScannedFollowed>, E> {
        let mut rows = scan(start, end, limit)?;
        let mut next = 0;
        while next < rows.len() && rows.len() < limit {
            let range = self.range(&rows[next].1, at);
            next += 1;
            if let Some((lo, hi)) = range {
                let more = scan(&lo, &hi, limit - rows.len())?;
                rows.extend(more);
            }
        }
        Ok(rows)
    }

    /// The range `value` points to, if it is one to go down from. Pointers
    /// at or past `i64::MAX` are not followed (PostgreSQL counts in
    /// `bigint`), nor are those of values too short to hold them.
    pub fn range(&self, value: &[u8], at: usize) -> Option<(Vec<u8>, Vec<u8>)> {
        if value.get(self.kind_at) != Some(&self.kind) {
            return None;
        }
        let p = u64::from_be_bytes(value.get(at..at.checked_add(8)?)?.try_into().ok()?);
        if p >= i64::MAX as u64 {
            return None;
        }
        let key = |n: u64| {
            let mut k = vec![self.prefix];
            k.extend_from_slice(&n.to_be_bytes());
            k
        };
        Some((key(p), key(p + 1)))
    }
}

/// What [`MetaRead::get_and_follow`] found: the value, and the value it
/// points to (`None` if absent or if the value is too short to point).
pub type Followed = Option<(Vec<u8>, Option<Vec<u8>>)>;

/// A pair [`MetaRead::scan_and_follow`] found, with its pointee.
pub type ScannedFollowed = (Vec<u8>, Vec<u8>, Option<Vec<u8>>);

/// What [`MetaRead::get_follow_and_range`] found: as [`Followed`], and the
/// pointee's companion records (`None`: not read).
pub type FollowedWith = Option<(Vec<u8>, Option<Vec<u8>>, Option<Pairs>)>;

/// Each of `pairs` with what its value points to (see
/// [`MetaRead::scan_and_follow`]), the pointees read by `read` in one call.
pub fn with_pointees<E>(
    pairs: Pairs,
    at: usize,
    prefix: u8,
    read: impl FnOnce(&[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, E>,
) -> Result<Vec<ScannedFollowed>, E> {
    let keys: Vec<Vec<u8>> = pairs
        .iter()
        .filter_map(|(_, v)| pointer_key(v, at, prefix).map(|k| k.to_vec()))
        .collect();
    let mut pointees = read(&keys)?.into_iter();
    Ok(pairs
        .into_iter()
        .map(|(k, v)| {
            let p = pointer_key(&v, at, prefix).and_then(|_| pointees.next().flatten());
            (k, v, p)
        })
        .collect())
}

/// The key `value` points to: `prefix` and its 8 bytes at `at`.
pub fn pointer_key(value: &[u8], at: usize, prefix: u8) -> Option<[u8; 9]> {
    let bytes = value.get(at..at.checked_add(8)?)?;
    let mut k = [0u8; 9];
    k[0] = prefix;
    k[1..].copy_from_slice(bytes);
    Some(k)
}

/// The key range `[companion ‖ p, companion ‖ p ‖ 0xff)` of the records
/// that go with pointee `key` (`prefix ‖ p`): see
/// [`MetaRead::get_follow_and_range`].
pub fn companion_range(key: &[u8; 9], companion: u8) -> (Vec<u8>, Vec<u8>) {
    let mut lo = key.to_vec();
    lo[0] = companion;
    let mut hi = lo.clone();
    hi.push(0xff);
    (lo, hi)
}

/// What an engine has been asked to do since it was opened: the figure that
/// shows whether a request was served from memory or read the engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EngineCounters {
    pub gets: u64,
    pub scans: u64,
    pub commits: u64,
}

/// The running counts behind [`EngineCounters`], kept by an engine.
#[derive(Debug, Default)]
pub struct EngineTally {
    gets: std::sync::atomic::AtomicU64,
    scans: std::sync::atomic::AtomicU64,
    commits: std::sync::atomic::AtomicU64,
}

thread_local! {
    static BEFORE_READ: std::cell::Cell<Option<fn()>> = const { std::cell::Cell::new(None) };
}

/// Has `hook` run on the calling thread before each engine read it makes
/// (the io_uring queue threads leave `SCHED_IDLE` before they wait for the
/// engine).
pub fn before_reads_on_this_thread(hook: fn()) {
    BEFORE_READ.set(Some(hook));
}

fn before_read() {
    if let Some(hook) = BEFORE_READ.get() {
        hook();
    }
}

impl EngineTally {
    pub fn get(&self) {
        before_read();
        self.gets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    pub fn scan(&self) {
        before_read();
        self.scans
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    pub fn commit(&self) {
        self.commits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    pub fn counters(&self) -> EngineCounters {
        use std::sync::atomic::Ordering::Relaxed;
        EngineCounters {
            gets: self.gets.load(Relaxed),
            scans: self.scans.load(Relaxed),
            commits: self.commits.load(Relaxed),
        }
    }
}

/// A metadata engine.
pub trait MetaStore: MetaRead + Send + Sync + 'static {
    /// Operations served so far (engines that do not count report zeros).
    fn counters(&self) -> EngineCounters {
        EngineCounters::default()
    }

    /// Applies the writes `batch` yields atomically and durably: when this
    /// returns `Ok`, every write survives a crash; when it returns `Err`,
    /// none was applied. Borrowed, so that a caller keeping its batch (the
    /// group committer, whose readers still see it) need not copy it.
    fn commit_iter<'a>(
        &self,
        batch: &mut dyn Iterator<Item = WriteRef<'a>>,
    ) -> Result<(), MetaError>;

    /// [`MetaStore::commit_iter`], except that the writes need only be
    /// visible when this returns (every later read, on any connection or
    /// node, sees them): they become durable with the next durable commit
    /// or [`MetaStore::make_durable`], and a crash of the engine's server
    /// before that may lose them — never some of them, and never one
    /// without every later commit too. Engines whose commits cost the same
    /// either way make them durable (the default).
    fn commit_iter_visible<'a>(
        &self,
        batch: &mut dyn Iterator<Item = WriteRef<'a>>,
    ) -> Result<(), MetaError> {
        self.commit_iter(batch)
    }

    /// Whether [`MetaStore::commit_iter_visible`] may return before its
    /// writes are durable (then the caller must call
    /// [`MetaStore::make_durable`] before relying on them surviving).
    fn visible_before_durable(&self) -> bool {
        false
    }

    /// Makes every commit visible when it is called — this process's and
    /// any other's — durable.
    fn make_durable(&self) -> Result<(), MetaError> {
        Ok(())
    }

    /// [`MetaStore::commit_iter`] of owned writes.
    fn commit(&self, batch: &[Write]) -> Result<(), MetaError> {
        self.commit_iter(&mut batch.iter().map(|(k, v)| (k.as_slice(), v.as_deref())))
    }

    /// Bytes the store occupies on disk.
    fn disk_bytes(&self) -> u64;

    /// The most disk space committing one write — `key_len` bytes of key
    /// and a value of `value_len` bytes, or a delete — can make the store
    /// allocate, in bytes. The core sums it over everything it has accepted
    /// but not yet committed and acknowledges a change only while the store
    /// holds at least that much ([`MetaStore::hold`]). Default: 0, for
    /// engines whose commits take no space from the disk under the volume.
    fn write_bound(&self, key_len: usize, value_len: Option<usize>) -> u64 {
        let _ = (key_len, value_len);
        0
    }

    /// What one commit may allocate on top of the sum of its writes'
    /// bounds (the engine's own bookkeeping), in bytes.
    fn batch_bound(&self) -> u64 {
        0
    }

    /// Makes sure at least `bytes` of disk space are allocated to the store
    /// beyond what it uses, so that commits needing no more than that cannot
    /// fail for lack of space whatever else fills the disk. Returns the bytes
    /// held afterwards; `Err(NoSpace)` if the disk cannot provide them (what
    /// was held stays held).
    fn hold(&self, bytes: u64) -> Result<u64, MetaError> {
        let _ = bytes;
        Ok(u64::MAX)
    }

    /// Bytes allocated to the store beyond what it uses now.
    fn held(&self) -> u64 {
        u64::MAX
    }

    /// How long a call may wait for an engine it cannot reach (a server
    /// restarting) before it fails. Embedded engines are always there.
    fn set_outage_wait(&self, wait: std::time::Duration) {
        let _ = wait;
    }

    /// Claims the volume for this process (`who`) where the engine is
    /// shared between machines, so that no other daemon anywhere serves it
    /// meanwhile: [`MetaError::Claimed`] if one does. The claim lasts as
    /// long as the process; a daemon that died loses it by itself. Embedded
    /// engines are claimed by the volume directory's lock alone.
    fn claim(&self, who: &Session) -> Result<(), MetaError> {
        let _ = who;
        Ok(())
    }

    /// The sessions the engine has seen serve the volume (shared engines).
    fn sessions(&self) -> Result<Vec<SessionRow>, MetaError> {
        Ok(Vec::new())
    }

    /// Joins the daemons serving the volume at once (shared engines): like
    /// [`MetaStore::claim`], but other mounts may join too, and only an
    /// exclusive claim (fsck) is refused meanwhile. `Ok(false)`: the engine
    /// is served by one daemon at a time; claim it instead.
    fn join(&self, who: &Session) -> Result<bool, MetaError> {
        let _ = who;
        Ok(false)
    }

    /// The shared side of a joined engine (see [`Shared`]).
    fn shared(&self) -> Option<&dyn Shared> {
        None
    }
}

/// What changed in a volume several daemons serve, since a daemon last
/// looked: the epoch it has reached (every commit bumps it by one) and the
/// keys the commits in between wrote, or `None` when the engine no longer
/// keeps that far back (then everything cached must go).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub epoch: u64,
    pub keys: Option<Vec<Vec<u8>>>,
}

/// An engine several daemons serve at once (see `docs/multi-mount.md`).
/// Writers take turns: a daemon changes metadata only while it holds the
/// volume's write lease, catches up with every commit made before it got
/// it (so that what it caches is current while it holds it), and its
/// commits check that no other commit came in between (so that a lease
/// lost with a connection cannot lose another daemon's update).
pub trait Shared: Send + Sync {
    /// Waits for the write lease; returns what changed since `seen`.
    fn lease(&self, seen: u64) -> Result<Changes, MetaError>;
    /// Gives the lease back (every commit made under it has returned);
    /// returns the epoch its last commit reached.
    fn release(&self) -> u64;
    /// Whether another daemon waits for the lease now (its holder gives it
    /// back at the end of its turn only then). True when the engine
    /// cannot tell.
    fn lease_wanted(&self) -> bool {
        true
    }
    /// The epoch the commits under the lease held now have reached.
    fn reached(&self) -> Option<u64>;
    /// Ends this daemon's session cleanly: its row goes (a row left behind
    /// is a daemon that died), its doorbell stops.
    fn leave(&self);
    /// What changed since `seen`, without the lease.
    fn changes(&self, seen: u64) -> Result<Changes, MetaError>;
    /// Calls `ring` with the newest epoch each time another daemon commits
    /// (a doorbell; also at least once a second while the engine cannot
    /// tell, so that nothing stays stale for long), from a thread of the
    /// engine's own, until the engine drops.
    fn watch(&self, ring: Box<dyn Fn(u64) + Send + Sync>) -> Result<(), MetaError>;
    /// This daemon's session id (what its orphans are tagged with).
    fn session_id(&self) -> u64;
    /// Sessions whose daemons died without leaving (their ids), with the
    /// oldest time one of them started serving, ns since the epoch.
    fn dead_sessions(&self) -> Result<Vec<(u64, i64)>, MetaError>;
    /// The sessions alive now (their ids), this one among them.
    fn live_sessions(&self) -> Result<Vec<u64>, MetaError>;
    /// Forgets a dead session, once what it held is reclaimed; false if it
    /// was not dead (another survivor got there first, or it came back).
    fn bury(&self, id: u64) -> Result<bool, MetaError>;
    /// Whether this daemon is the only one serving the volume now.
    fn alone(&self) -> Result<bool, MetaError>;

    /// Takes, changes or drops (`Unlock`) `req`'s lock, as one atomic step
    /// against every daemon's locks; `Ok(Some(holder))`: a conflicting lock
    /// of a live session stands (nothing changed). With `waiting`, a
    /// conflict also records that `req`'s owner waits, and a wait that
    /// would close a cycle of waiting owners is refused as
    /// [`LockError::Deadlock`].
    fn lock_set(&self, req: &LockReq, waiting: bool) -> Result<Option<LockHolder>, LockError>;
    /// The first lock of a live session that conflicts with `req`.
    fn lock_test(&self, req: &LockReq) -> Result<Option<LockHolder>, MetaError>;
    /// Drops this session's locks on `ino` that `which` selects, and any
    /// wait of `owner`.
    fn lock_drop(&self, ino: u64, which: LockDrop) -> Result<(), MetaError>;
    /// Calls `ring` each time some daemon drops or narrows a lock (or one
    /// dies), from the doorbell's thread: waiters try again.
    fn on_locks_changed(&self, ring: Box<dyn Fn() + Send + Sync>);
}

/// A lock's kind, as `fcntl` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    Read,
    Write,
    Unlock,
}

/// A lock request of one owner of this daemon: a byte range
/// `start..=end` (POSIX record and OFD locks) or the whole file (`flock`).
/// Owners are the kernel's (a process's file table, an open file), unique
/// on one machine: a session's id makes them unique across daemons.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockReq {
    pub ino: u64,
    pub owner: u64,
    pub flock: bool,
    pub kind: LockKind,
    pub start: u64,
    pub end: u64,
    /// The requesting process (reported to `F_GETLK`).
    pub pid: u32,
    /// The open file the lock is taken through (dropped with it).
    pub fh: u64,
}

/// A lock that stands in a request's way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockHolder {
    pub kind: LockKind,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
}

/// Which of a session's locks on an inode to drop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockDrop {
    /// An owner's record locks (a process closed a descriptor of the file:
    /// POSIX drops them all).
    Posix(u64),
    /// An owner's `flock`.
    Flock(u64),
    /// Every lock taken through an open file (its last close: OFD locks
    /// and `flock`s go with it).
    File(u64),
    /// An owner's wait (given up: interrupted).
    Wait(u64),
}

#[derive(Debug, Error)]
pub enum LockError {
    /// Waiting would close a cycle of owners waiting for each other.
    #[error("waiting for the lock would deadlock")]
    Deadlock,
    #[error(transparent)]
    Meta(#[from] MetaError),
}

/// A daemon serving a volume, as a shared engine records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub host: String,
    pub pid: u32,
    pub mountpoint: String,
}

/// A recorded session and whether its daemon still holds the volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionRow {
    pub session: Session,
    /// When it claimed the volume, as the server tells it.
    pub since: String,
    pub live: bool,
}

impl Session {
    /// This process on this host, serving `mountpoint` (or, in
    /// parentheses, what it does instead: "(safs fsck)").
    pub fn of_this_process(mountpoint: String) -> Session {
        Session {
            host: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "?".into()),
            pid: std::process::id(),
            mountpoint,
        }
    }
}

impl std::fmt::Display for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A mountpoint in parentheses is what a process that mounts
        // nothing is doing: "(safs fsck)".
        let (pid, host, m) = (self.pid, &self.host, &self.mountpoint);
        if m.starts_with('(') {
            write!(f, "pid {pid} on host {host} {m}")
        } else {
            write!(f, "pid {pid} on host {host}, mounted on {m}")
        }
    }
}

#[cfg(test)]
pub(crate) mod conformance {
    //! One suite every engine must pass.
    use super::*;

    pub fn run(store: &dyn MetaStore) {
        assert_eq!(store.get(b"a").unwrap(), None);
        store
            .commit(&[
                (b"a".to_vec(), Some(b"1".to_vec())),
                (b"b".to_vec(), Some(b"2".to_vec())),
                (b"c".to_vec(), Some(b"3".to_vec())),
            ])
            .unwrap();
        assert_eq!(store.get(b"b").unwrap().as_deref(), Some(&b"2"[..]));
        let all = store.scan(b"a", b"z", 10).unwrap();
        assert_eq!(all.len(), 3);
        let some = store.scan(b"b", b"c", 10).unwrap();
        assert_eq!(some, vec![(b"b".to_vec(), b"2".to_vec())]);
        assert_eq!(store.scan(b"a", b"z", 2).unwrap().len(), 2);
        store
            .commit(&[(b"a".to_vec(), None), (b"b".to_vec(), Some(b"x".to_vec()))])
            .unwrap();
        assert_eq!(store.get(b"a").unwrap(), None);
        assert_eq!(store.get(b"b").unwrap().as_deref(), Some(&b"x"[..]));
        // Deleting a missing key is not an error.
        store.commit(&[(b"nope".to_vec(), None)]).unwrap();
        // A value pointing at another key (prefix + its bytes 1..9).
        store
            .commit(&[
                (b"Eptr".to_vec(), Some(b"x\0\0\0\0\0\0\0\x07y".to_vec())),
                (b"I\0\0\0\0\0\0\0\x07".to_vec(), Some(b"inode 7".to_vec())),
                (b"Eshort".to_vec(), Some(b"x\0\0".to_vec())),
                (b"Edangling".to_vec(), Some(b"x\0\0\0\0\0\0\0\x08".to_vec())),
            ])
            .unwrap();
        assert_eq!(
            store.get_and_follow(b"Eptr", 1, b'I').unwrap(),
            Some((b"x\0\0\0\0\0\0\0\x07y".to_vec(), Some(b"inode 7".to_vec())))
        );
        assert_eq!(
            store.get_and_follow(b"Eshort", 1, b'I').unwrap(),
            Some((b"x\0\0".to_vec(), None))
        );
        assert_eq!(
            store
                .get_and_follow(b"Edangling", 1, b'I')
                .unwrap()
                .unwrap()
                .1,
            None
        );
        assert_eq!(store.get_and_follow(b"Enone", 1, b'I').unwrap(), None);
        // The same for every pair of a scan, in key order, within its
        // limit.
        let found = |v: &[u8], p: Option<&[u8]>| (v.to_vec(), p.map(<[u8]>::to_vec));
        let scanned: Vec<_> = store
            .scan_and_follow(b"E", b"F", 10, 1, b'I')
            .unwrap()
            .into_iter()
            .map(|(k, v, p)| (k, (v, p)))
            .collect();
        assert_eq!(
            scanned,
            vec![
                (b"Edangling".to_vec(), found(b"x\0\0\0\0\0\0\0\x08", None)),
                (
                    b"Eptr".to_vec(),
                    found(b"x\0\0\0\0\0\0\0\x07y", Some(b"inode 7"))
                ),
                (b"Eshort".to_vec(), found(b"x\0\0", None)),
            ]
        );
        let first: Vec<_> = store
            .scan_and_follow(b"Ep", b"F", 1, 1, b'I')
            .unwrap()
            .into_iter()
            .map(|(k, _, p)| (k, p))
            .collect();
        assert_eq!(first, vec![(b"Eptr".to_vec(), Some(b"inode 7".to_vec()))]);
        // A tree: each pair a directory marks (kind byte 4 at 9) leads to
        // its own range, breadth first, within the limit.
        let ent = |ino: u64, kind: u8| {
            let mut v = b"x".to_vec();
            v.extend_from_slice(&ino.to_be_bytes());
            v.push(kind);
            v
        };
        let dkey = |parent: u64, name: &[u8]| {
            let mut k = b"T".to_vec();
            k.extend_from_slice(&parent.to_be_bytes());
            k.extend_from_slice(name);
            k
        };
        let ikey = |ino: u64| {
            let mut k = b"I".to_vec();
            k.extend_from_slice(&ino.to_be_bytes());
            k
        };
        store
            .commit(&[
                (dkey(1, b"a"), Some(ent(2, 4))),
                (dkey(1, b"b"), Some(ent(3, 8))),
                (dkey(1, b"c"), Some(ent(4, 4))),
                (dkey(1, b"d"), Some(ent(i64::MAX as u64, 4))),
                (dkey(2, b"x"), Some(ent(5, 4))),
                (dkey(4, b"y"), Some(ent(6, 8))),
                (dkey(5, b"z"), Some(ent(7, 8))),
                // Not below 1: the next directory's range.
                (dkey(8, b"w"), Some(ent(9, 8))),
                (ikey(2), Some(b"inode 2".to_vec())),
                (ikey(5), Some(b"inode 5".to_vec())),
            ])
            .unwrap();
        let descend = Descend {
            prefix: b'T',
            kind_at: 9,
            kind: 4,
        };
        let tree = |limit| {
            let mut rows = store
                .scan_tree_and_follow(&dkey(1, b""), &dkey(2, b""), limit, 1, b'I', descend)
                .unwrap();
            let n = rows.len();
            rows.sort();
            (n, rows)
        };
        let (n, all) = tree(100);
        assert_eq!(n, 7);
        let want: Vec<_> = [
            (1, &b"a"[..], 2, 4, Some(&b"inode 2"[..])),
            (1, b"b", 3, 8, None),
            (1, b"c", 4, 4, None),
            (1, b"d", i64::MAX as u64, 4, None),
            (2, b"x", 5, 4, Some(b"inode 5")),
            (4, b"y", 6, 8, None),
            // Inode 7 was written above.
            (5, b"z", 7, 8, Some(b"inode 7")),
        ]
        .into_iter()
        .map(|(p, name, ino, kind, inode)| {
            (dkey(p, name), ent(ino, kind), inode.map(<[u8]>::to_vec))
        })
        .collect();
        assert_eq!(all, want);
        // The first range whole before any other; then as far as the limit.
        let (n, some) = tree(5);
        assert_eq!(n, 5);
        assert!(want[..4].iter().all(|r| some.contains(r)));
        let (n, first) = tree(2);
        assert_eq!((n, first), (2, want[..2].to_vec()));

        // With the pointee's companion records: exactly those of its 8
        // bytes (not the next inode's), where the engine reads them at all.
        store
            .commit(&[
                (b"S\0\0\0\0\0\0\0\x07".to_vec(), Some(b"page 0".to_vec())),
                (
                    b"S\0\0\0\0\0\0\0\x07\x01".to_vec(),
                    Some(b"page 1".to_vec()),
                ),
                (b"S\0\0\0\0\0\0\0\x08".to_vec(), Some(b"not 7's".to_vec())),
                (
                    b"S\0\0\0\0\0\0\0\x06\x7f".to_vec(),
                    Some(b"not 7's".to_vec()),
                ),
            ])
            .unwrap();
        let (v, p, range) = store
            .get_follow_and_range(b"Eptr", 1, b'I', b'S')
            .unwrap()
            .unwrap();
        assert_eq!(v, b"x\0\0\0\0\0\0\0\x07y".to_vec());
        assert_eq!(p, Some(b"inode 7".to_vec()));
        if store.follows_in_one_read() {
            assert_eq!(
                range,
                Some(vec![
                    (b"S\0\0\0\0\0\0\0\x07".to_vec(), b"page 0".to_vec()),
                    (b"S\0\0\0\0\0\0\0\x07\x01".to_vec(), b"page 1".to_vec()),
                ])
            );
        } else {
            assert_eq!(range, None);
        }
        // No pointee, no range; no value, nothing.
        let (_, p, range) = store
            .get_follow_and_range(b"Edangling", 1, b'I', b'S')
            .unwrap()
            .unwrap();
        assert_eq!((p, range), (None, None));
        assert_eq!(
            store.get_follow_and_range(b"Enone", 1, b'I', b'S').unwrap(),
            None
        );
        // A large value.
        let big = vec![7u8; 70_000];
        store
            .commit(&[(b"big".to_vec(), Some(big.clone()))])
            .unwrap();
        assert_eq!(store.get(b"big").unwrap(), Some(big));
    }
}
