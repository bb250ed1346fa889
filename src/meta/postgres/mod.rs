//! PostgreSQL as a metadata engine, for volumes that outgrow one machine.
//!
//! The pairs live in one table, `safs_kv (k bytea PRIMARY KEY, v bytea)`:
//! `bytea` compares like `memcmp` (then by length), which is exactly the
//! order LMDB keeps, so ordered scans mean the same on both engines and the
//! core needs no change. `safs_volume` holds the schema version; a database
//! without it is no safs volume, one with a newer version is refused.
//!
//! Costs: a get or a scan is one statement (one round trip) on a pooled
//! connection with the statements prepared; a commit is one statement too —
//! the batch, reduced to the last write of each key, goes as two arrays to
//! a `DELETE … WHERE k = ANY($1)` and an `INSERT … ON CONFLICT DO UPDATE`
//! joined in one CTE, which PostgreSQL runs atomically. Durable on return:
//! `synchronous_commit` is set on for every connection, whatever the
//! server's default — except the commits of joined daemons that only need
//! to be visible ([`MetaStore::commit_iter_visible`]), which turn it off
//! for their own transaction in the same statement and are made durable
//! later by [`MetaStore::make_durable`]. The core's group commit amortises
//! the commit latency as it does LMDB's fsync.
//!
//! Faults: a connection that fails is dropped and the call tried again on a
//! new one; while the server cannot be reached (restarting, "starting up")
//! the call waits, retrying with backoff, up to [`OUTAGE_WAIT`], then fails
//! (the core answers EIO and retries its batch). So a restarted server
//! costs a pause, not refused changes. Retrying a commit whose outcome was
//! lost is safe: a batch writes whole values and deletes, so applying it
//! twice is applying it once.
//!
//! Many daemons serve a volume at once ([`PgStore::join`], the design in
//! `docs/multi-mount.md`). Each registers a session — a row, and an advisory
//! lock on its id held on a connection of its own for the daemon's life, so
//! that a daemon that dies, or whose machine does, is seen dead by the
//! others — and holds the volume's lock shared. Writers take turns under a
//! write lease (another advisory lock, [`Shared::lease`]); every commit made
//! under it bumps the volume's epoch in the same statement, only if the
//! epoch is still the one the lease began at, logs the keys it wrote in
//! `safs_changes` and rings a doorbell (`NOTIFY safs`), from which the other
//! daemons learn what to drop from their caches ([`Shared::watch`]).
//!
//! An exclusive claim ([`PgStore::claim`], fsck) holds the volume's lock
//! alone, and bumps a claim number that every commit checks too: a daemon
//! whose connection was cut while fsck took the volume over cannot commit
//! anything more.
//!
//! The connection string is libpq's (a URL or key=value pairs); the
//! password comes from `~/.pgpass` or `PGPASSFILE` ([`conninfo`]) and is
//! never stored in the volume.

pub mod conninfo;
mod locks;
/// Private clusters for tests and the bench (`crates/safs-pgcluster`).
pub use safs_pgcluster as cluster;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use postgres::error::SqlState;
use postgres::{Client, NoTls, Statement};

use super::{
    Changes, EngineCounters, EngineTally, LockDrop, LockError, LockHolder, LockReq, MetaError,
    MetaRead, MetaStore, Session, SessionRow, Shared, WriteRef,
};

/// The schema this build writes and reads.
pub const SCHEMA_VERSION: i32 = 2;

/// How long one connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a call waits for an unreachable server to come back, unless
/// the mount says otherwise (`-o meta_timeout=`).
pub const OUTAGE_WAIT: Duration = Duration::from_secs(30);
/// The advisory lock of the volume (one volume per database): held shared
/// by every daemon serving it, exclusively by fsck.
const CLAIM_LOCK: i64 = 0x5AF5_0001;
/// The write lease: held by the one daemon changing metadata now.
const WRITE_LOCK: i64 = 0x5AF5_0002;
/// Session `id` is alive while advisory lock `SESSION_LOCKS + id` is held.
const SESSION_LOCKS: i64 = 0x5AF5_1000_0000_0000;
/// Held (for a transaction) by every change to the lock tables: a lock
/// and the deadlock search see one state of every daemon's locks.
const LOCKS_LOCK: i64 = 0x5AF5_0003;
/// The doorbell of lock changes (the metadata's is `safs`).
const LOCKS_CHANNEL: &str = "safs_locks";
/// Owners a deadlock search follows at most.
const DEADLOCK_SEARCH: usize = 64;
/// The lock tables (created by the first daemon of this build to join a
/// volume: no schema change, older daemons simply do not use them).
/// `typ`: 1 read, 2 write; ranges inclusive, within `0..=i64::MAX`.
const LOCK_TABLES: &str = "
CREATE TABLE IF NOT EXISTS safs_locks (ino bigint NOT NULL, session bigint NOT NULL,
    owner bigint NOT NULL, flock boolean NOT NULL, fh bigint NOT NULL, typ smallint NOT NULL,
    lstart bigint NOT NULL, lend bigint NOT NULL, pid integer NOT NULL);
CREATE INDEX IF NOT EXISTS safs_locks_ino ON safs_locks (ino);
CREATE TABLE IF NOT EXISTS safs_lock_waits (session bigint NOT NULL, owner bigint NOT NULL,
    ino bigint NOT NULL, flock boolean NOT NULL, typ smallint NOT NULL, lstart bigint NOT NULL,
    lend bigint NOT NULL, PRIMARY KEY (session, owner));
";
/// Commits whose keys `safs_changes` keeps; a daemon further behind drops
/// all it caches instead.
const CHANGES_KEPT: i64 = 100_000;
/// How often a watcher asks for the epoch when no doorbell rang.
const WATCH_POLL: Duration = Duration::from_secs(1);
/// How often the claim's connection is checked.
const CLAIM_CHECK: Duration = Duration::from_secs(1);

const SCHEMA: &str = "
CREATE TABLE safs_volume (version integer NOT NULL, created timestamptz NOT NULL DEFAULT now(),
                          claim bigint NOT NULL DEFAULT 0, epoch bigint NOT NULL DEFAULT 0);
CREATE TABLE safs_kv (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE safs_sessions (id bigserial PRIMARY KEY, host text NOT NULL, pid integer NOT NULL,
                            mountpoint text NOT NULL, since timestamptz NOT NULL DEFAULT now());
CREATE TABLE safs_changes (epoch bigint PRIMARY KEY, keys bytea[] NOT NULL);
";

/// Values' compression (see `PgStore::create`).
const KV_LZ4: &str = "ALTER TABLE safs_kv ALTER COLUMN v SET COMPRESSION lz4";

/// Every table a volume has (the lock tables too).
const DROP_ALL: &str = "DROP TABLE IF EXISTS safs_kv, safs_volume, safs_sessions, safs_changes, \
                        safs_locks, safs_lock_waits";

/// From schema 1 (one daemon at a time) to 2 (sessions with ids, epochs,
/// the change log).
const UPGRADE_1_TO_2: &str = "
ALTER TABLE safs_volume ADD COLUMN epoch bigint NOT NULL DEFAULT 0;
ALTER TABLE safs_sessions ADD COLUMN id bigserial PRIMARY KEY;
CREATE TABLE safs_changes (epoch bigint PRIMARY KEY, keys bytea[] NOT NULL);
UPDATE safs_volume SET version = 2;
";

/// The live-session test: whether the advisory lock of session `s.id` is
/// held by anyone in this database.
const SESSION_LIVE: &str = "EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' \
     AND l.granted AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database \
     WHERE datname = current_database()) \
     AND ((l.classid::bigint << 32) | l.objid::bigint) = 6554162424893669376 + s.id)";

/// One pooled connection and its prepared statements.
struct Conn {
    client: Client,
    get: Statement,
    /// Values of several keys in one round trip.
    get_many: Statement,
    /// A value and the one its bytes point to, in one round trip.
    get_and_follow: Statement,
    /// A scan's pairs and what each value points to, in one round trip.
    scan_and_follow: Statement,
    /// The same, going down into the ranges the pairs point to (see
    /// `MetaRead::scan_tree_and_follow`), in one round trip.
    scan_tree_and_follow: Statement,
    /// The same and the pointee's companion records (one row each).
    get_follow_and_range: Statement,
    scan: Statement,
    commit: Statement,
    /// The commit of a claimed store: applies the batch only while the
    /// volume's claim number is ours, and says whether it was.
    fenced_commit: Statement,
    /// The commit under a write lease: applies the batch only if the epoch
    /// is still the lease's (and the claim number ours), bumps it, logs the
    /// keys and rings the doorbell; returns the new epoch, or no row.
    leased_commit: Statement,
    /// When the server this connection reaches started (µs): commits made
    /// visible on a server that started since may have been lost with it.
    born: i64,
}

/// A store that joined the volume: its session, the lease it may hold and
/// the epoch its commits expect.
struct Joined {
    id: i64,
    /// The connection holding the write lease while it is held.
    writer: Mutex<Option<Client>>,
    /// The epoch the next commit must find (valid while the lease is held).
    epoch: AtomicI64,
    /// Set when the store drops: the watcher stops.
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// Rung when some daemon's locks change (see [`Shared::on_locks_changed`]).
    locks_rang: LocksRing,
    watcher: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Commits made visible and not yet known durable, oldest first: a
    /// server crash loses them, and [`PgStore::recover_unflushed`] commits
    /// them again.
    unflushed: Mutex<Vec<Unflushed>>,
    /// Some of them were lost for good: the next commit is refused
    /// (`MetaError::LeaseLost`, which drops what was computed on them) and
    /// the next lease resets every cache.
    lost: std::sync::atomic::AtomicBool,
}

/// One commit made visible before durable, as it was sent.
struct Unflushed {
    /// The epoch it made.
    epoch: i64,
    /// The server it landed on (`Conn::born`).
    born: i64,
    gone: Vec<Vec<u8>>,
    keys: Vec<Vec<u8>>,
    values: Vec<Vec<u8>>,
}

type LocksRing = Arc<Mutex<Option<Box<dyn Fn() + Send + Sync>>>>;

/// A claim on the volume: the connection holding its advisory lock, kept
/// alive (and re-taken after an outage) by a thread until the store drops.
struct Claim {
    /// Set when the store drops; `wake` cuts the keeper's wait short.
    stop: Mutex<bool>,
    wake: parking_lot::Condvar,
    keeper: Mutex<Option<std::thread::JoinHandle<()>>>,
}

pub struct PgStore {
    config: postgres::Config,
    /// What the connection string names (no password), for messages.
    shown: String,
    read_only: bool,
    idle: Mutex<Vec<Conn>>,
    outage_ms: AtomicU64,
    /// The claim number this store holds (0: none, commits unfenced).
    token: Arc<AtomicI64>,
    claim: Mutex<Option<Arc<Claim>>>,
    joined: std::sync::OnceLock<Joined>,
    tally: EngineTally,
    /// Runs once between a lease's read of the epoch and what it makes of
    /// it: where the syncer's flush may come between (a test's race).
    #[cfg(test)]
    after_lease_read: Mutex<Option<LeaseHook>>,
}

#[cfg(test)]
type LeaseHook = Box<dyn FnOnce(&PgStore) + Send>;

/// `e` and its causes ("error connecting to server: No such file or
/// directory"): the client's own message leaves the cause out.
fn with_causes(e: &postgres::Error) -> String {
    let mut s = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

/// The server is stopping or restarting under this connection.
fn server_going(e: &postgres::Error) -> bool {
    [
        SqlState::ADMIN_SHUTDOWN,
        SqlState::CRASH_SHUTDOWN,
        SqlState::CANNOT_CONNECT_NOW,
    ]
    .iter()
    .any(|c| e.code() == Some(c))
}

fn engine_err(e: postgres::Error) -> MetaError {
    if e.code() == Some(&SqlState::DISK_FULL) {
        return MetaError::NoSpace;
    }
    // The server's message where there is one ("relation … does not
    // exist"), not only its category.
    match e.as_db_error() {
        Some(db) => MetaError::Engine(format!("PostgreSQL: {}", db.message())),
        None => MetaError::Engine(format!("PostgreSQL: {}", with_causes(&e))),
    }
}

impl PgStore {
    /// Connects to the safs volume in the database `conninfo` names.
    pub fn open(conninfo: &str) -> Result<Self, MetaError> {
        let store = Self::connect(conninfo, false)?;
        store.check_schema()?;
        Ok(store)
    }

    /// [`PgStore::open`] for reads only: every transaction read-only.
    pub fn open_read_only(conninfo: &str) -> Result<Self, MetaError> {
        let store = Self::connect(conninfo, true)?;
        store.check_schema()?;
        Ok(store)
    }

    /// Drops every table of the volume in the database `conninfo` names
    /// (a load that failed removes what it made).
    pub fn remove(conninfo: &str) -> Result<(), MetaError> {
        let store = Self::connect(conninfo, false)?;
        store
            .raw_client()?
            .batch_execute(DROP_ALL)
            .map_err(engine_err)
    }

    /// Hands every pair to `f` in key order, from one read-only
    /// `REPEATABLE READ` transaction: a consistent snapshot while daemons
    /// go on writing.
    pub fn snapshot_each(conninfo: &str, f: &mut super::EachPair) -> Result<(), MetaError> {
        let store = Self::connect(conninfo, true)?;
        store.check_schema()?;
        let mut c = store.raw_client()?;
        let mut t = c
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .map_err(engine_err)?;
        let page = t
            .prepare("SELECT k, v FROM safs_kv WHERE k > $1 ORDER BY k LIMIT 4096")
            .map_err(engine_err)?;
        let mut after: Vec<u8> = Vec::new();
        loop {
            let rows = t.query(&page, &[&after]).map_err(engine_err)?;
            for r in &rows {
                f(r.get::<_, &[u8]>(0), r.get::<_, &[u8]>(1))?;
            }
            match rows.last() {
                Some(r) if rows.len() == 4096 => after = r.get::<_, Vec<u8>>(0),
                _ => break,
            }
        }
        t.commit().map_err(engine_err)
    }

    /// Creates the tables of a new volume in the database `conninfo`
    /// names. A database that already holds one is refused unless `force`,
    /// which drops it first.
    pub fn create(conninfo: &str, force: bool) -> Result<Self, MetaError> {
        let store = Self::connect(conninfo, false)?;
        {
            let mut c = store.raw_client()?;
            let exists: bool = c
                .query_one("SELECT to_regclass('safs_kv') IS NOT NULL", &[])
                .map_err(engine_err)?
                .get(0);
            if exists && !force {
                return Err(MetaError::Engine(format!(
                    "{} already holds a safs volume (--force replaces it)",
                    store.shown
                )));
            }
            let mut t = c.transaction().map_err(engine_err)?;
            if exists {
                t.batch_execute(DROP_ALL).map_err(engine_err)?;
            }
            t.batch_execute(SCHEMA).map_err(engine_err)?;
            // The server compresses values over ~2 KiB (spilled xattrs,
            // directory pages) on every write; lz4 costs a third of the
            // default pglz's CPU. A server without it (before 14, or built
            // without lz4) keeps pglz.
            let mut lz4 = t.savepoint("lz4").map_err(engine_err)?;
            if lz4.batch_execute(KV_LZ4).is_ok() {
                lz4.commit().map_err(engine_err)?;
            } else {
                drop(lz4);
                tracing::info!(
                    "{}: lz4 not offered, values compressed with pglz",
                    store.shown
                );
            }
            t.execute(
                "INSERT INTO safs_volume (version) VALUES ($1)",
                &[&SCHEMA_VERSION],
            )
            .map_err(engine_err)?;
            t.commit().map_err(engine_err)?;
        }
        Ok(store)
    }

    fn connect(conninfo: &str, read_only: bool) -> Result<Self, MetaError> {
        let parsed = conninfo::parse(conninfo).map_err(MetaError::Engine)?;
        let mut config = parsed.config;
        config.connect_timeout(CONNECT_TIMEOUT);
        config.application_name("safs");
        let store = PgStore {
            config,
            shown: parsed.shown,
            read_only,
            idle: Mutex::new(Vec::new()),
            outage_ms: AtomicU64::new(OUTAGE_WAIT.as_millis() as u64),
            token: Arc::new(AtomicI64::new(0)),
            claim: Mutex::new(None),
            joined: std::sync::OnceLock::new(),
            tally: EngineTally::default(),
            #[cfg(test)]
            after_lease_read: Mutex::new(None),
        };
        // Fail now, with the server's reason, rather than at first use.
        let c = store.raw_client()?;
        drop(c);
        Ok(store)
    }

    /// What the connection string names, without a password.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// A new connection with the session settings safs relies on.
    fn raw_client(&self) -> Result<Client, MetaError> {
        let mut c = self.config.connect(NoTls).map_err(|e| {
            MetaError::Engine(format!(
                "cannot connect to PostgreSQL at {}: {}",
                self.shown,
                with_causes(&e)
            ))
        })?;
        let mut set = String::from("SET synchronous_commit = on;");
        if self.read_only {
            set.push_str("SET default_transaction_read_only = on;");
        }
        c.batch_execute(&set).map_err(engine_err)?;
        Ok(c)
    }

    fn new_conn(&self) -> Result<Conn, MetaError> {
        let mut client = self.raw_client()?;
        let get = client
            .prepare("SELECT v FROM safs_kv WHERE k = $1")
            .map_err(engine_err)?;
        let get_many = client
            .prepare("SELECT k, v FROM safs_kv WHERE k = ANY($1::bytea[])")
            .map_err(engine_err)?;
        let scan = client
            .prepare("SELECT k, v FROM safs_kv WHERE k >= $1 AND k < $2 ORDER BY k LIMIT $3")
            .map_err(engine_err)?;
        // substring() is 1-based; a value too short to point joins nothing.
        let get_and_follow = client
            .prepare(
                "SELECT a.v, b.v FROM safs_kv a LEFT JOIN safs_kv b \
                 ON length(a.v) >= $3 + 7 AND b.k = $2 || substring(a.v FROM $3 FOR 8) \
                 WHERE a.k = $1",
            )
            .map_err(engine_err)?;
        let scan_and_follow = client
            .prepare(
                "SELECT a.k, a.v, b.v FROM (SELECT k, v FROM safs_kv \
                 WHERE k >= $1 AND k < $2 ORDER BY k LIMIT $3) a LEFT JOIN safs_kv b \
                 ON length(a.v) >= $5 + 7 AND b.k = $4 || substring(a.v FROM $5 FOR 8) \
                 ORDER BY a.k",
            )
            .map_err(engine_err)?;
        // Breadth first, as the default method: PostgreSQL emits the first
        // range before recursing and stops at the outer limit. The inner
        // limit bounds each range; `bit(64)` reads the pointer as a number.
        let scan_tree_and_follow = client
            .prepare(
                "WITH RECURSIVE w(k, v) AS ((SELECT k, v FROM safs_kv \
                 WHERE k >= $1 AND k < $2 ORDER BY k LIMIT $3) \
                 UNION ALL SELECT c.k, c.v FROM w CROSS JOIN LATERAL (\
                 SELECT k, v FROM safs_kv WHERE k >= $6 || substring(w.v FROM $5 FOR 8) \
                 AND k < $6 || int8send(('x' || encode(substring(w.v FROM $5 FOR 8), 'hex'))\
                 ::bit(64)::bigint + 1) ORDER BY k LIMIT $3) c \
                 WHERE length(w.v) > $7 AND get_byte(w.v, $7) = $8 \
                 AND length(w.v) >= $5 + 7 \
                 AND substring(w.v FROM $5 FOR 8) < '\\x7fffffffffffffff'::bytea) \
                 SELECT a.k, a.v, b.v FROM (SELECT k, v FROM w LIMIT $3) a \
                 LEFT JOIN LATERAL (SELECT v FROM safs_kv \
                 WHERE length(a.v) >= $5 + 7 AND k = $4 || substring(a.v FROM $5 FOR 8)) b \
                 ON true",
            )
            .map_err(engine_err)?;
        // One row per companion record (or one with NULLs): the value and
        // the pointee repeat, a few hundred bytes for a spill page or two.
        let get_follow_and_range = client
            .prepare(
                "SELECT a.v, b.v, s.k, s.v FROM safs_kv a LEFT JOIN safs_kv b \
                 ON length(a.v) >= $3 + 7 AND b.k = $2 || substring(a.v FROM $3 FOR 8) \
                 LEFT JOIN LATERAL (SELECT k, v FROM safs_kv WHERE b.k IS NOT NULL \
                 AND k >= $4 || substring(a.v FROM $3 FOR 8) \
                 AND k < $4 || substring(a.v FROM $3 FOR 8) || '\\xff'::bytea) s ON true \
                 WHERE a.k = $1 ORDER BY s.k",
            )
            .map_err(engine_err)?;
        let commit = client
            .prepare(
                "WITH gone AS (DELETE FROM safs_kv WHERE k = ANY($1::bytea[])) \
                 INSERT INTO safs_kv (k, v) SELECT * FROM unnest($2::bytea[], $3::bytea[]) \
                 ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
            )
            .map_err(engine_err)?;
        let fenced_commit = client
            .prepare(
                "WITH ours AS (SELECT 1 FROM safs_volume WHERE claim = $4 FOR SHARE), \
                 gone AS (DELETE FROM safs_kv WHERE k = ANY($1::bytea[]) \
                          AND EXISTS (SELECT 1 FROM ours)), \
                 put AS (INSERT INTO safs_kv (k, v) \
                         SELECT * FROM unnest($2::bytea[], $3::bytea[]) \
                         WHERE EXISTS (SELECT 1 FROM ours) \
                         ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v) \
                 SELECT count(*) FROM ours",
            )
            .map_err(engine_err)?;
        // The doorbell's payload is the new epoch. The final SELECT names
        // pg_notify so that it runs (a CTE nobody reads would not). The
        // change log is pruned by one commit in 64: a delete in every
        // commit cost each ~10 % of its time.
        let leased_commit = client
            .prepare(
                "WITH v AS (UPDATE safs_volume SET epoch = epoch + 1 \
                            WHERE epoch = $4 AND claim = $5 RETURNING epoch), \
                 gone AS (DELETE FROM safs_kv WHERE k = ANY($1::bytea[]) \
                          AND EXISTS (SELECT 1 FROM v)), \
                 put AS (INSERT INTO safs_kv (k, v) \
                         SELECT * FROM unnest($2::bytea[], $3::bytea[]) \
                         WHERE EXISTS (SELECT 1 FROM v) \
                         ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v), \
                 logged AS (INSERT INTO safs_changes (epoch, keys) SELECT epoch, $6 FROM v), \
                 pruned AS (DELETE FROM safs_changes WHERE epoch <= $4 - $7 \
                            AND $4 % 64 = 0 AND EXISTS (SELECT 1 FROM v)) \
                 SELECT epoch, pg_notify('safs', epoch::text)::text, \
                        set_config('synchronous_commit', $8, true) FROM v",
            )
            .map_err(engine_err)?;
        let born: i64 = client
            .query_one(
                "SELECT (extract(epoch FROM pg_postmaster_start_time()) * 1e6)::bigint",
                &[],
            )
            .map_err(engine_err)?
            .get(0);
        Ok(Conn {
            born,
            client,
            get,
            get_many,
            get_and_follow,
            scan_and_follow,
            scan_tree_and_follow,
            get_follow_and_range,
            scan,
            commit,
            fenced_commit,
            leased_commit,
        })
    }

    /// Runs `f` on a pooled connection. A connection that failed is
    /// dropped (with every other pooled one: a restarted server closed them
    /// all) and `f` tried again on a new one; an unreachable server is
    /// waited for, up to [`OUTAGE_WAIT`].
    fn with_conn<T>(
        &self,
        mut f: impl FnMut(&mut Conn) -> Result<T, postgres::Error>,
    ) -> Result<T, MetaError> {
        let deadline = Instant::now() + Duration::from_millis(self.outage_ms.load(Relaxed));
        let mut pause = Duration::from_millis(20);
        let mut wait = |what: &dyn std::fmt::Display| -> Result<(), ()> {
            if Instant::now() + pause > deadline {
                return Err(());
            }
            tracing::warn!("PostgreSQL unavailable ({what}); retrying in {pause:?}");
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(1));
            Ok(())
        };
        loop {
            let pooled = self.idle.lock().pop();
            let mut conn = match pooled {
                Some(c) => c,
                None => match self.new_conn() {
                    Ok(c) => c,
                    Err(e) => {
                        if wait(&e).is_err() {
                            return Err(e);
                        }
                        continue;
                    }
                },
            };
            match f(&mut conn) {
                Ok(v) => {
                    self.idle.lock().push(conn);
                    return Ok(v);
                }
                Err(e) if conn.client.is_closed() || server_going(&e) => {
                    self.idle.lock().clear();
                    if wait(&with_causes(&e)).is_err() {
                        return Err(engine_err(e));
                    }
                }
                Err(e) => {
                    self.idle.lock().push(conn);
                    return Err(engine_err(e));
                }
            }
        }
    }

    fn check_schema(&self) -> Result<(), MetaError> {
        let mut c = self.raw_client()?;
        let present: bool = c
            .query_one("SELECT to_regclass('safs_volume') IS NOT NULL", &[])
            .map_err(engine_err)?
            .get(0);
        if !present {
            return Err(MetaError::Engine(format!(
                "{} holds no safs volume (no safs_volume table)",
                self.shown
            )));
        }
        let version: i32 = c
            .query_one("SELECT max(version) FROM safs_volume", &[])
            .map_err(engine_err)?
            .try_get(0)
            .map_err(|_| {
                MetaError::Engine(format!("{}: safs_volume holds no version", self.shown))
            })?;
        if version > SCHEMA_VERSION {
            return Err(MetaError::Engine(format!(
                "{}: schema version {version} is newer than this safs understands \
                 ({SCHEMA_VERSION}); upgrade safs",
                self.shown
            )));
        }
        if version < SCHEMA_VERSION {
            return Err(MetaError::Engine(format!(
                "{}: schema version {version} is older than this safs writes \
                 ({SCHEMA_VERSION}); `safs upgrade <volume>` converts it (once, \
                 with no daemon serving it)",
                self.shown
            )));
        }
        Ok(())
    }

    /// Converts the volume in the database `conninfo` names to this build's
    /// schema, in one transaction. Returns the version it had. Refused
    /// while a daemon serves the volume.
    pub fn upgrade(conninfo: &str) -> Result<i32, MetaError> {
        let store = Self::connect(conninfo, false)?;
        let mut c = store.raw_client()?;
        let mut t = c.transaction().map_err(engine_err)?;
        let busy: bool = t
            .query_one("SELECT NOT pg_try_advisory_xact_lock($1)", &[&CLAIM_LOCK])
            .map_err(engine_err)?
            .get(0);
        if busy {
            return Err(MetaError::Claimed("a running daemon or fsck".into()));
        }
        let version: i32 = t
            .query_one("SELECT max(version) FROM safs_volume", &[])
            .map_err(engine_err)?
            .get(0);
        match version {
            1 => t.batch_execute(UPGRADE_1_TO_2).map_err(engine_err)?,
            SCHEMA_VERSION => {}
            v => {
                return Err(MetaError::Engine(format!(
                    "{}: schema version {v} cannot be converted by this safs",
                    store.shown
                )));
            }
        }
        t.commit().map_err(engine_err)?;
        Ok(version)
    }

    /// Runs `f` on the writer connection (made on first use), which holds
    /// the write lease while it is held; retried like [`PgStore::with_conn`]
    /// only while `retry` (a lost connection loses the lease with it).
    fn with_writer<T>(
        &self,
        j: &Joined,
        retry: bool,
        mut f: impl FnMut(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, MetaError> {
        let deadline = Instant::now() + Duration::from_millis(self.outage_ms.load(Relaxed));
        let mut pause = Duration::from_millis(20);
        let mut w = j.writer.lock();
        loop {
            let err = match w.as_mut() {
                Some(c) => match f(c) {
                    Ok(v) => return Ok(v),
                    Err(e) => {
                        if !(c.is_closed() || server_going(&e)) {
                            return Err(engine_err(e));
                        }
                        *w = None;
                        with_causes(&e)
                    }
                },
                None => match self.raw_client() {
                    Ok(c) => {
                        *w = Some(c);
                        continue;
                    }
                    Err(e) => e.to_string(),
                },
            };
            if !retry || Instant::now() + pause > deadline {
                return Err(MetaError::Engine(format!("PostgreSQL: {err}")));
            }
            tracing::warn!("PostgreSQL unavailable ({err}); retrying in {pause:?}");
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// What changed after epoch `seen`, read on `c`: the keys of every
    /// commit since, or `None` if the log no longer reaches back that far.
    fn changes_on(c: &mut Client, seen: i64) -> Result<Changes, postgres::Error> {
        let now: i64 = c.query_one("SELECT epoch FROM safs_volume", &[])?.get(0);
        if now <= seen {
            // Behind what was seen: commits were lost (a server restart),
            // and what they changed is unknown here.
            return Ok(Changes {
                epoch: now.max(0) as u64,
                keys: (now == seen).then(Vec::new),
            });
        }
        let rows = c.query(
            "SELECT epoch, keys FROM safs_changes WHERE epoch > $1 AND epoch <= $2 ORDER BY epoch",
            &[&seen, &now],
        )?;
        let complete = rows.len() as i64 == now - seen;
        let keys = complete.then(|| {
            rows.into_iter()
                .flat_map(|r| r.get::<_, Vec<Vec<u8>>>(1))
                .collect()
        });
        Ok(Changes {
            epoch: now as u64,
            keys,
        })
    }
}

impl MetaRead for PgStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, MetaError> {
        self.tally.get();
        self.with_conn(|c| {
            let row = c.client.query_opt(&c.get, &[&key])?;
            Ok(row.map(|r| r.get::<_, Vec<u8>>(0)))
        })
    }

    fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, MetaError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        // One round trip: counted as one read.
        self.tally.get();
        let found: std::collections::HashMap<Vec<u8>, Vec<u8>> = self.with_conn(|c| {
            let rows = c.client.query(&c.get_many, &[&keys])?;
            Ok(rows
                .into_iter()
                .map(|r| (r.get::<_, Vec<u8>>(0), r.get::<_, Vec<u8>>(1)))
                .collect())
        })?;
        Ok(keys.iter().map(|k| found.get(k).cloned()).collect())
    }

    fn get_and_follow(
        &self,
        key: &[u8],
        at: usize,
        prefix: u8,
    ) -> Result<super::Followed, MetaError> {
        self.tally.get();
        let from = i32::try_from(at + 1).unwrap_or(i32::MAX - 8);
        let prefix = [prefix];
        self.with_conn(|c| {
            let row = c
                .client
                .query_opt(&c.get_and_follow, &[&key, &&prefix[..], &from])?;
            Ok(row.map(|r| (r.get::<_, Vec<u8>>(0), r.get::<_, Option<Vec<u8>>>(1))))
        })
    }

    fn get_follow_and_range(
        &self,
        key: &[u8],
        at: usize,
        prefix: u8,
        companion: u8,
    ) -> Result<super::FollowedWith, MetaError> {
        self.tally.get();
        let from = i32::try_from(at + 1).unwrap_or(i32::MAX - 8);
        let (prefix, companion) = ([prefix], [companion]);
        self.with_conn(|c| {
            let rows = c.client.query(
                &c.get_follow_and_range,
                &[&key, &&prefix[..], &from, &&companion[..]],
            )?;
            let Some(first) = rows.first() else {
                return Ok(None);
            };
            let (value, pointee) = (
                first.get::<_, Vec<u8>>(0),
                first.get::<_, Option<Vec<u8>>>(1),
            );
            let range = pointee.is_some().then(|| {
                rows.iter()
                    .filter_map(|r| Some((r.get::<_, Option<Vec<u8>>>(2)?, r.get(3))))
                    .collect()
            });
            Ok(Some((value, pointee, range)))
        })
    }

    fn follows_in_one_read(&self) -> bool {
        true
    }

    fn scan_and_follow(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        at: usize,
        prefix: u8,
    ) -> Result<Vec<super::ScannedFollowed>, MetaError> {
        self.tally.scan();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let from = i32::try_from(at + 1).unwrap_or(i32::MAX - 8);
        let prefix = [prefix];
        self.with_conn(|c| {
            let rows = c.client.query(
                &c.scan_and_follow,
                &[&start, &end, &limit, &&prefix[..], &from],
            )?;
            Ok(rows
                .into_iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect())
        })
    }

    fn scan_tree_and_follow(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        at: usize,
        prefix: u8,
        descend: super::Descend,
    ) -> Result<Vec<super::ScannedFollowed>, MetaError> {
        self.tally.scan();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let from = i32::try_from(at + 1).unwrap_or(i32::MAX - 8);
        let kind_at = i32::try_from(descend.kind_at).unwrap_or(i32::MAX);
        let kind = i32::from(descend.kind);
        let (prefix, down) = ([prefix], [descend.prefix]);
        self.with_conn(|c| {
            let rows = c.client.query(
                &c.scan_tree_and_follow,
                &[
                    &start,
                    &end,
                    &limit,
                    &&prefix[..],
                    &from,
                    &&down[..],
                    &kind_at,
                    &kind,
                ],
            )?;
            Ok(rows
                .into_iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect())
        })
    }

    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<super::Pairs, MetaError> {
        self.tally.scan();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with_conn(|c| {
            let rows = c.client.query(&c.scan, &[&start, &end, &limit])?;
            Ok(rows
                .into_iter()
                .map(|r| (r.get::<_, Vec<u8>>(0), r.get::<_, Vec<u8>>(1)))
                .collect())
        })
    }
}

impl PgStore {
    /// Whether the leased commit of this batch on epoch `expect` is in the
    /// database already: the epoch is one past it under the same claim,
    /// that commit logged exactly these keys, and they hold what the batch
    /// writes (its deletions gone). Another daemon that took the lease
    /// meanwhile would have had to write the very same batch.
    fn landed(
        &self,
        expect: i64,
        token: i64,
        logged: &[&[u8]],
        gone: &[&[u8]],
        keys: &[&[u8]],
        values: &[&[u8]],
    ) -> Result<bool, MetaError> {
        self.with_conn(|c| {
            let v = c
                .client
                .query_one("SELECT epoch, claim FROM safs_volume", &[])?;
            if (v.get::<_, i64>(0), v.get::<_, i64>(1)) != (expect + 1, token) {
                return Ok(false);
            }
            let Some(l) = c.client.query_opt(
                "SELECT keys FROM safs_changes WHERE epoch = $1",
                &[&(expect + 1)],
            )?
            else {
                return Ok(false);
            };
            let mut theirs: Vec<Vec<u8>> = l.get(0);
            let mut ours: Vec<Vec<u8>> = logged.iter().map(|k| k.to_vec()).collect();
            theirs.sort_unstable();
            ours.sort_unstable();
            if theirs != ours {
                return Ok(false);
            }
            let rows = c.client.query(
                "SELECT k, v FROM safs_kv WHERE k = ANY($1::bytea[])",
                &[&logged],
            )?;
            let held: BTreeMap<Vec<u8>, Vec<u8>> =
                rows.into_iter().map(|r| (r.get(0), r.get(1))).collect();
            Ok(gone.iter().all(|k| !held.contains_key(*k))
                && keys
                    .iter()
                    .zip(values)
                    .all(|(k, v)| held.get(*k).is_some_and(|h| h == v)))
        })
    }
}

impl PgStore {
    /// [`MetaStore::commit_iter`], durable on return or (`durable` false,
    /// joined daemons) only visible: `synchronous_commit` off for this one
    /// transaction, set in its statement (no round trip of its own).
    fn commit_as<'a>(
        &self,
        batch: &mut dyn Iterator<Item = WriteRef<'a>>,
        durable: bool,
    ) -> Result<(), MetaError> {
        // The last write of each key wins, as in a batch applied in order;
        // the statement needs disjoint deletes and puts, each key once.
        let last: BTreeMap<&[u8], Option<&[u8]>> = batch.collect();
        if last.is_empty() {
            return Ok(());
        }
        let mut gone: Vec<&[u8]> = Vec::new();
        let (mut keys, mut values): (Vec<&[u8]>, Vec<&[u8]>) = (Vec::new(), Vec::new());
        for (k, v) in last {
            match v {
                Some(v) => {
                    keys.push(k);
                    values.push(v);
                }
                None => gone.push(k),
            }
        }
        self.tally.commit();
        let token = self.token.load(Relaxed);
        if let Some(j) = self.joined.get() {
            return self.leased_commit(j, token, &gone, &keys, &values, durable);
        }
        if token == 0 {
            return self.with_conn(|c| {
                c.client.execute(&c.commit, &[&gone, &keys, &values])?;
                Ok(())
            });
        }
        let ours: i64 = self.with_conn(|c| {
            let row = c
                .client
                .query_one(&c.fenced_commit, &[&gone, &keys, &values, &token])?;
            Ok(row.get(0))
        })?;
        if ours == 0 {
            return Err(MetaError::Claimed(
                "another mount, which took the volume over while this daemon's claim was lost \
                 (nothing more is committed here)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// A commit under the write lease (joined daemons): applied only while
    /// the epoch is the one the lease left (see `Conn::leased_commit`).
    fn leased_commit(
        &self,
        j: &Joined,
        token: i64,
        gone: &[&[u8]],
        keys: &[&[u8]],
        values: &[&[u8]],
        durable: bool,
    ) -> Result<(), MetaError> {
        let logged: Vec<&[u8]> = gone.iter().chain(keys.iter()).copied().collect();
        if j.lost.swap(false, Relaxed) {
            return Err(MetaError::LeaseLost(
                "the PostgreSQL server lost this daemon's commits".into(),
            ));
        }
        let mut recovered = false;
        loop {
            let expect = j.epoch.load(Relaxed);
            if expect < 0 {
                return Err(MetaError::LeaseLost(
                    "a commit without the write lease".into(),
                ));
            }
            let (tries, born) = (Cell::new(0u32), Cell::new(0i64));
            let row = self.with_conn(|c| {
                tries.set(tries.get() + 1);
                born.set(c.born);
                c.client.query_opt(
                    &c.leased_commit,
                    &[
                        &gone,
                        &keys,
                        &values,
                        &expect,
                        &token,
                        &logged,
                        &CHANGES_KEPT,
                        &if durable { "on" } else { "off" },
                    ],
                )
            })?;
            let made = match row {
                Some(r) => Some(r.get::<_, i64>(0)),
                // An earlier try committed and its answer was lost with the
                // connection (the server went down in between): the retry
                // finds the epoch moved by one — by this very batch.
                None if tries.get() > 1
                    && self.landed(expect, token, &logged, gone, keys, values)? =>
                {
                    tracing::info!(
                        epoch = expect + 1,
                        "a commit whose answer was lost had landed"
                    );
                    Some(expect + 1)
                }
                None => None,
            };
            if let Some(epoch) = made {
                j.epoch.store(epoch, Relaxed);
                let mut u = j.unflushed.lock();
                if durable {
                    // Its WAL flush covered every commit before it on this
                    // server, which holds them all: the epoch it expected
                    // was there.
                    u.clear();
                } else {
                    let owned = |v: &[&[u8]]| v.iter().map(|x| x.to_vec()).collect();
                    u.push(Unflushed {
                        epoch,
                        born: born.get(),
                        gone: owned(gone),
                        keys: owned(keys),
                        values: owned(values),
                    });
                }
                return Ok(());
            }
            // Not the epoch this lease left: if a server crash lost this
            // daemon's unflushed commits, they are committed again, and
            // then this batch on top of them — tried once more also when
            // none are left to recover (another thread, flushing, may have
            // just committed them again).
            if recovered || !self.recover_unflushed(j)? {
                return Err(MetaError::LeaseLost(
                    "another daemon committed since this one took the lease, or fsck took \
                     the volume over"
                        .into(),
                ));
            }
            recovered = true;
        }
    }

    /// After a server restart, commits made visible but not durable may be
    /// gone. Those the server still holds (its change log names their keys
    /// at their epochs) are durable now; the rest are committed again, in
    /// order and durably, if they follow the server's epoch with nothing of
    /// another daemon's between them (the server keeps a prefix of what
    /// was committed: anything of another daemon's after them was built on
    /// them and is gone too, for that daemon to commit again). One
    /// transaction holding the volume row: no commit comes between.
    /// Returns whether this daemon's commits are all on the server again;
    /// false when some cannot be (their changes are lost, as a crash
    /// loses what nobody synced).
    fn recover_unflushed(&self, j: &Joined) -> Result<bool, MetaError> {
        let mut u = j.unflushed.lock();
        if u.is_empty() {
            return Ok(true);
        }
        let token = self.token.load(Relaxed);
        let epochs: Vec<i64> = u.iter().map(|c| c.epoch).collect();
        let (whole, replayed, now) = self.with_conn(|c| {
            let Conn {
                client,
                leased_commit,
                ..
            } = c;
            let mut t = client.transaction()?;
            let v = t.query_one("SELECT epoch, claim FROM safs_volume FOR UPDATE", &[])?;
            let (mut now, claim): (i64, i64) = (v.get(0), v.get(1));
            if claim != token {
                return Ok((false, 0, now));
            }
            let logged: BTreeMap<i64, Vec<Vec<u8>>> = t
                .query(
                    "SELECT epoch, keys FROM safs_changes WHERE epoch = ANY($1)",
                    &[&epochs],
                )?
                .into_iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            let mut replayed = 0;
            for c in u.iter() {
                let mut ours: Vec<Vec<u8>> = c.gone.iter().chain(&c.keys).cloned().collect();
                if c.epoch <= now {
                    let mut theirs = logged.get(&c.epoch).cloned().unwrap_or_default();
                    theirs.sort_unstable();
                    ours.sort_unstable();
                    if theirs != ours {
                        return Ok((false, replayed, now));
                    }
                    continue;
                }
                if c.epoch != now + 1 {
                    return Ok((false, replayed, now));
                }
                let r = t.query_opt(
                    &*leased_commit,
                    &[
                        &c.gone,
                        &c.keys,
                        &c.values,
                        &now,
                        &token,
                        &ours,
                        &CHANGES_KEPT,
                        &"on",
                    ],
                )?;
                if r.is_none() {
                    return Ok((false, replayed, now));
                }
                now += 1;
                replayed += 1;
            }
            t.commit()?;
            Ok((true, replayed, now))
        })?;
        if whole {
            if replayed > 0 {
                tracing::warn!(
                    commits = replayed,
                    epoch = now,
                    "the PostgreSQL server lost commits it had made visible and not yet durable (it restarted): committed again"
                );
            }
            // The epoch this daemon's lease expects is not moved here: what
            // was committed again is its own lineage, up to the epoch it
            // last made; anything past that is another daemon's, which its
            // next commit must meet as a lost lease (its caches never saw
            // it), not pass over.
            u.clear();
        } else {
            tracing::error!(
                commits = u.len(),
                "the PostgreSQL server lost commits it had made visible and not yet durable, and another daemon's commits came between them: their changes are lost"
            );
            u.clear();
            j.lost.store(true, Relaxed);
        }
        Ok(whole)
    }
}

impl MetaStore for PgStore {
    fn counters(&self) -> EngineCounters {
        self.tally.counters()
    }

    fn commit_iter<'a>(
        &self,
        batch: &mut dyn Iterator<Item = WriteRef<'a>>,
    ) -> Result<(), MetaError> {
        self.commit_as(batch, true)
    }

    fn commit_iter_visible<'a>(
        &self,
        batch: &mut dyn Iterator<Item = WriteRef<'a>>,
    ) -> Result<(), MetaError> {
        self.commit_as(batch, false)
    }

    /// Joined daemons only: a lost commit moves the epoch back under their
    /// lease, so their next commit is refused and their caches dropped
    /// (`MetaError::LeaseLost`), as for a lease lost otherwise.
    fn visible_before_durable(&self) -> bool {
        self.joined.get().is_some()
    }

    fn make_durable(&self) -> Result<(), MetaError> {
        let Some(j) = self.joined.get() else {
            return Ok(());
        };
        // A write committed synchronously flushes the WAL up to its own
        // commit record, so every commit before it: the cheapest one is
        // this daemon's own session row, which nobody else writes.
        // (A simple query: one round trip, and no statement to prepare on
        // every connection.) Without its row (another daemon took this one
        // for dead during an outage; the keeper puts it back) the volume's
        // row, which commits write anyway.
        // What it covers: the unflushed commits made before it, if they
        // landed on the server it flushed (not one that restarted since).
        let upto = j.unflushed.lock().last().map(|c| c.epoch);
        let born = Cell::new(0i64);
        let sql = format!("UPDATE safs_sessions SET since = since WHERE id = {}", j.id);
        let wrote = self.with_conn(|c| {
            born.set(c.born);
            Ok(c.client
                .simple_query(&sql)?
                .iter()
                .any(|m| matches!(m, postgres::SimpleQueryMessage::CommandComplete(n) if *n > 0)))
        })?;
        if !wrote {
            self.with_conn(|c| {
                born.set(c.born);
                c.client
                    .batch_execute("UPDATE safs_volume SET epoch = epoch")
            })?;
        }
        let Some(upto) = upto else {
            return Ok(());
        };
        {
            let mut u = j.unflushed.lock();
            let covered = u.iter().take_while(|c| c.epoch <= upto).count();
            if u[..covered].iter().all(|c| c.born == born.get()) {
                u.drain(..covered);
                return Ok(());
            }
        }
        if self.recover_unflushed(j)? {
            Ok(())
        } else {
            Err(MetaError::LeaseLost(
                "the PostgreSQL server lost this daemon's commits".into(),
            ))
        }
    }

    fn set_outage_wait(&self, wait: Duration) {
        self.outage_ms.store(wait.as_millis() as u64, Relaxed);
    }

    fn claim(&self, who: &Session) -> Result<(), MetaError> {
        let mut client = self.raw_client()?;
        if !take_volume_lock(&mut client, Mode::Exclusive).map_err(engine_err)? {
            return Err(MetaError::Claimed(self.holder()));
        }
        let token: i64 = client
            .query_one(
                "UPDATE safs_volume SET claim = claim + 1 RETURNING claim",
                &[],
            )
            .map_err(engine_err)?
            .get(0);
        // Rows of daemons that died stay: the next mount reclaims what
        // they held.
        let id = register(&mut client, who)?;
        self.token.store(token, Relaxed);
        self.start_keeper(client, Mode::Exclusive, id)
    }

    fn join(&self, who: &Session) -> Result<bool, MetaError> {
        self.join_shared(who).map(|()| true)
    }

    fn shared(&self) -> Option<&dyn Shared> {
        self.joined.get().map(|_| self as &dyn Shared)
    }

    fn sessions(&self) -> Result<Vec<SessionRow>, MetaError> {
        self.with_conn(|c| {
            let rows = c.client.query(
                &format!(
                    "SELECT host, pid, mountpoint, since::text, {SESSION_LIVE} \
                     FROM safs_sessions s ORDER BY since"
                ),
                &[],
            )?;
            Ok(rows
                .into_iter()
                .map(|r| SessionRow {
                    session: Session {
                        host: r.get(0),
                        pid: r.get::<_, i32>(1) as u32,
                        mountpoint: r.get(2),
                    },
                    since: r.get(3),
                    live: r.get(4),
                })
                .collect())
        })
    }

    fn disk_bytes(&self) -> u64 {
        self.with_conn(|c| {
            let row = c
                .client
                .query_one("SELECT pg_total_relation_size('safs_kv')", &[])?;
            Ok(row.get::<_, i64>(0))
        })
        .map(|n| n.max(0) as u64)
        .unwrap_or(0)
    }
}

/// How a store holds the volume's lock.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Exclusive,
    Shared,
}

/// Tries to take the volume's lock on `c` as `mode` says; false if a
/// holder of the other kind (or, exclusively, any holder) has it.
fn take_volume_lock(c: &mut Client, mode: Mode) -> Result<bool, postgres::Error> {
    let take = match mode {
        Mode::Exclusive => "SELECT pg_try_advisory_lock($1)",
        Mode::Shared => "SELECT pg_try_advisory_lock_shared($1)",
    };
    Ok(c.query_one(take, &[&CLAIM_LOCK])?.get(0))
}

/// Takes a new session id, locks it (before its row exists, so that no
/// survivor can see the row and think it dead) and records the session.
fn register(client: &mut Client, who: &Session) -> Result<i64, MetaError> {
    let id: i64 = client
        .query_one("SELECT nextval('safs_sessions_id_seq')", &[])
        .map_err(engine_err)?
        .get(0);
    client
        .execute(
            "SELECT pg_advisory_lock($1)::text",
            &[&(SESSION_LOCKS + id)],
        )
        .map_err(engine_err)?;
    client
        .execute(
            "INSERT INTO safs_sessions (id, host, pid, mountpoint) VALUES ($1, $2, $3, $4)",
            &[&id, &who.host, &(who.pid as i32), &who.mountpoint],
        )
        .map_err(engine_err)?;
    Ok(id)
}

impl PgStore {
    /// Joins the volume (see [`MetaStore::join`]): the volume's lock
    /// shared, a session, and a keeper for both.
    fn join_shared(&self, who: &Session) -> Result<(), MetaError> {
        if self.joined.get().is_some() {
            return Ok(());
        }
        let mut client = self.raw_client()?;
        if !take_volume_lock(&mut client, Mode::Shared).map_err(engine_err)? {
            return Err(MetaError::Claimed(self.holder()));
        }
        let token: i64 = client
            .query_one("SELECT claim FROM safs_volume", &[])
            .map_err(engine_err)?
            .get(0);
        let id = register(&mut client, who)?;
        let mut t = client.transaction().map_err(engine_err)?;
        t.execute("SELECT pg_advisory_xact_lock($1)::text", &[&LOCKS_LOCK])
            .map_err(engine_err)?;
        let missing: bool = t
            .query_one("SELECT to_regclass('safs_lock_waits') IS NULL", &[])
            .map_err(engine_err)?
            .get(0);
        if missing {
            t.batch_execute(LOCK_TABLES).map_err(engine_err)?;
        }
        t.commit().map_err(engine_err)?;
        self.token.store(token, Relaxed);
        let _ = self.joined.set(Joined {
            id,
            writer: Mutex::new(None),
            epoch: AtomicI64::new(-1),
            stop: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            locks_rang: Arc::default(),
            watcher: Mutex::new(None),
            unflushed: Mutex::new(Vec::new()),
            lost: Default::default(),
        });
        self.start_keeper(client, Mode::Shared, id)
    }

    /// Who holds the volume (for a refusal): the live sessions.
    fn holder(&self) -> String {
        let live: Vec<String> = self
            .sessions()
            .unwrap_or_default()
            .into_iter()
            .filter(|s| s.live)
            .map(|s| format!("{} (since {})", s.session, s.since))
            .collect();
        if live.is_empty() {
            "another daemon".into()
        } else {
            live.join("; ")
        }
    }

    fn start_keeper(&self, client: Client, mode: Mode, id: i64) -> Result<(), MetaError> {
        let claim = Arc::new(Claim {
            stop: Mutex::new(false),
            wake: parking_lot::Condvar::new(),
            keeper: Mutex::new(None),
        });
        let keeper = {
            let (claim, config, token) = (claim.clone(), self.config.clone(), self.token.clone());
            std::thread::Builder::new()
                .name("safs-pg-claim".into())
                .spawn(move || keep_claim(client, &config, &claim, &token, mode, id))
                .map_err(MetaError::Io)?
        };
        *claim.keeper.lock() = Some(keeper);
        *self.claim.lock() = Some(claim);
        Ok(())
    }
}

impl Shared for PgStore {
    fn lease(&self, seen: u64) -> Result<Changes, MetaError> {
        let j = self.joined.get().expect("joined");
        let seen = seen as i64;
        let mut changes = self.with_writer(j, true, |c| {
            c.execute("SELECT pg_advisory_lock($1)::text", &[&WRITE_LOCK])?;
            match Self::changes_on(c, seen) {
                Ok(ch) => Ok(ch),
                Err(e) => {
                    let _ = c.execute("SELECT pg_advisory_unlock($1)", &[&WRITE_LOCK]);
                    Err(e)
                }
            }
        })?;
        #[cfg(test)]
        if let Some(hook) = self.after_lease_read.lock().take() {
            hook(self);
        }
        // Behind what this daemon saw: a server restart lost commits. Its
        // own are committed again (under the lease, before anyone reads
        // the log past them) — here, or by the syncer's flush since the
        // read above: read again either way. (Taking an empty list of
        // unflushed commits for "nothing to recover" left the lease at the
        // epoch before the syncer's recovery, and the next commit found
        // the lease lost: CI, mount_postgres and crash.rs.)
        if (changes.epoch as i64) < seen && self.recover_unflushed(j)? {
            changes = self.with_writer(j, true, |c| Self::changes_on(c, seen))?;
        }
        j.epoch.store(changes.epoch as i64, Relaxed);
        if j.lost.swap(false, Relaxed) {
            return Ok(Changes {
                keys: None,
                ..changes
            });
        }
        Ok(changes)
    }

    fn release(&self) -> u64 {
        let j = self.joined.get().expect("joined");
        let reached = j.epoch.swap(-1, Relaxed);
        // A connection that failed took the lock with it.
        let _ = self.with_writer(j, false, |c| {
            c.execute("SELECT pg_advisory_unlock($1)", &[&WRITE_LOCK])
        });
        reached.max(0) as u64
    }

    fn lease_wanted(&self) -> bool {
        // A daemon waiting in `lease` is an advisory lock not granted (a
        // bigint key is split into classid, objid; objsubid 1).
        let waiting = self.with_conn(|c| {
            let r = c.client.query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
                 AND NOT granted AND objsubid = 1 \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND (classid::text::bigint << 32) | objid::text::bigint = $1)",
                &[&WRITE_LOCK],
            )?;
            Ok(r.get::<_, bool>(0))
        });
        waiting.unwrap_or(true)
    }

    fn reached(&self) -> Option<u64> {
        let e = self.joined.get()?.epoch.load(Relaxed);
        (e >= 0).then_some(e as u64)
    }

    fn leave(&self) {
        if self.joined.get().is_some() {
            self.stop_threads();
        }
    }

    fn changes(&self, seen: u64) -> Result<Changes, MetaError> {
        self.with_conn(|c| Self::changes_on(&mut c.client, seen as i64))
    }

    fn watch(&self, ring: Box<dyn Fn(u64) + Send + Sync>) -> Result<(), MetaError> {
        let j = self.joined.get().expect("joined");
        let mut client = self.raw_client()?;
        client.batch_execute(LISTEN).map_err(engine_err)?;
        let (config, stop) = (self.config.clone(), Arc::clone(&j.stop));
        let locks = Arc::clone(&j.locks_rang);
        let t = std::thread::Builder::new()
            .name("safs-pg-watch".into())
            .spawn(move || watch(client, &config, &stop, &*ring, &locks))
            .map_err(MetaError::Io)?;
        *j.watcher.lock() = Some(t);
        Ok(())
    }

    fn session_id(&self) -> u64 {
        self.joined.get().map_or(0, |j| j.id as u64)
    }

    fn dead_sessions(&self) -> Result<Vec<(u64, i64)>, MetaError> {
        self.with_conn(|c| {
            let rows = c.client.query(
                &format!(
                    "SELECT id, (extract(epoch FROM since) * 1e9)::bigint \
                     FROM safs_sessions s WHERE NOT {SESSION_LIVE} ORDER BY id"
                ),
                &[],
            )?;
            Ok(rows
                .into_iter()
                .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, i64>(1)))
                .collect())
        })
    }

    fn live_sessions(&self) -> Result<Vec<u64>, MetaError> {
        self.with_conn(|c| {
            let rows = c.client.query(
                &format!("SELECT id FROM safs_sessions s WHERE {SESSION_LIVE} ORDER BY id"),
                &[],
            )?;
            Ok(rows
                .into_iter()
                .map(|r| r.get::<_, i64>(0) as u64)
                .collect())
        })
    }

    fn bury(&self, id: u64) -> Result<bool, MetaError> {
        let n = self.with_conn(|c| {
            let mut t = c.client.transaction()?;
            let n = t.execute(
                &format!("DELETE FROM safs_sessions s WHERE id = $1 AND NOT {SESSION_LIVE}"),
                &[&(id as i64)],
            )?;
            if n == 1 {
                // Its locks stopped counting when it died; now they go,
                // and waiters look again.
                t.execute("SELECT pg_advisory_xact_lock($1)::text", &[&LOCKS_LOCK])?;
                t.execute("DELETE FROM safs_locks WHERE session = $1", &[&(id as i64)])?;
                t.execute(
                    "DELETE FROM safs_lock_waits WHERE session = $1",
                    &[&(id as i64)],
                )?;
                t.execute("SELECT pg_notify($1, '')::text", &[&LOCKS_CHANNEL])?;
            }
            t.commit()?;
            Ok(n)
        })?;
        Ok(n == 1)
    }

    fn alone(&self) -> Result<bool, MetaError> {
        let live: i64 = self.with_conn(|c| {
            let r = c.client.query_one(
                &format!("SELECT count(*) FROM safs_sessions s WHERE {SESSION_LIVE}"),
                &[],
            )?;
            Ok(r.get(0))
        })?;
        Ok(live <= 1)
    }

    fn lock_set(&self, req: &LockReq, waiting: bool) -> Result<Option<LockHolder>, LockError> {
        let me = self.joined.get().expect("joined").id;
        let out = self.with_conn(|c| {
            let mut t = c.client.transaction()?;
            t.execute("SELECT pg_advisory_xact_lock($1)::text", &[&LOCKS_LOCK])?;
            let out = locks::set(&mut t, me, req, waiting)?;
            t.commit()?;
            Ok(out)
        })?;
        match out {
            locks::Outcome::Granted => Ok(None),
            locks::Outcome::Held(h) => Ok(Some(h)),
            locks::Outcome::Deadlock => Err(LockError::Deadlock),
        }
    }

    fn lock_test(&self, req: &LockReq) -> Result<Option<LockHolder>, MetaError> {
        let me = self.joined.get().expect("joined").id;
        self.with_conn(|c| {
            let mut t = c.client.transaction()?;
            let held = locks::conflict(&mut t, me, req)?.map(|(h, _)| h);
            t.commit()?;
            Ok(held)
        })
    }

    fn lock_drop(&self, ino: u64, which: LockDrop) -> Result<(), MetaError> {
        let me = self.joined.get().expect("joined").id;
        self.with_conn(|c| {
            let mut t = c.client.transaction()?;
            t.execute("SELECT pg_advisory_xact_lock($1)::text", &[&LOCKS_LOCK])?;
            locks::drop(&mut t, me, ino, which)?;
            t.commit()
        })
    }

    fn on_locks_changed(&self, ring: Box<dyn Fn() + Send + Sync>) {
        if let Some(j) = self.joined.get() {
            *j.locks_rang.lock() = Some(ring);
        }
    }
}

/// The channels the doorbell's connection listens on.
const LISTEN: &str = "LISTEN safs; LISTEN safs_locks";

/// The watcher's loop: waits for doorbells, and rings `ring` with the
/// newest epoch they carry, or with the epoch it reads every
/// [`WATCH_POLL`] when none rang; reconnects after an outage.
fn watch(
    mut client: Client,
    config: &postgres::Config,
    stop: &std::sync::atomic::AtomicBool,
    ring: &(dyn Fn(u64) + Send + Sync),
    locks: &LocksRing,
) {
    let ring_locks = || {
        if let Some(r) = &*locks.lock() {
            r();
        }
    };
    use postgres::fallible_iterator::FallibleIterator;
    // Short waits, so that a dropping store is not kept waiting.
    const WAIT: Duration = Duration::from_millis(250);
    let mut down_since: Option<Instant> = None;
    let mut quiet = Duration::ZERO;
    while !stop.load(Relaxed) {
        let res = (|| -> Result<Option<u64>, postgres::Error> {
            let first = client.notifications().timeout_iter(WAIT).next()?;
            let Some(first) = first else {
                quiet += WAIT;
                if quiet < WATCH_POLL {
                    return Ok(None);
                }
                quiet = Duration::ZERO;
                // Waiters look again too: a holder that died is seen dead
                // before the survivors bury it (and ring).
                ring_locks();
                let now: i64 = client
                    .query_one("SELECT epoch FROM safs_volume", &[])?
                    .get(0);
                return Ok(Some(now.max(0) as u64));
            };
            quiet = Duration::ZERO;
            let mut newest = None;
            let mut locks_changed = false;
            let mut seen = |m: &postgres::Notification| {
                if m.channel() == LOCKS_CHANNEL {
                    locks_changed = true;
                } else {
                    let e = m.payload().parse::<u64>().unwrap_or(0);
                    newest = Some(newest.unwrap_or(0).max(e));
                }
            };
            seen(&first);
            // Those that arrived with it: one ring for all.
            let mut n = client.notifications();
            let mut rest = n.iter();
            while let Some(m) = rest.next()? {
                seen(&m);
            }
            if locks_changed {
                ring_locks();
            }
            Ok(newest)
        })();
        match res {
            Ok(newest) => {
                if let Some(t) = down_since.take() {
                    tracing::info!(after = ?t.elapsed(), "PostgreSQL doorbell connection restored");
                }
                if let Some(e) = newest {
                    ring(e);
                }
            }
            Err(e) => {
                if down_since.is_none() {
                    tracing::warn!(
                        "PostgreSQL doorbell connection lost ({}); reconnecting",
                        with_causes(&e)
                    );
                    down_since = Some(Instant::now());
                }
                std::thread::sleep(WAIT);
                if let Ok(mut c) = config.connect(NoTls) {
                    if c.batch_execute(LISTEN).is_ok() {
                        client = c;
                        // What rang while it was down: look now.
                        quiet = WATCH_POLL;
                    }
                }
            }
        }
    }
}

impl PgStore {
    /// Stops the doorbell's watcher and the claim's keeper (which deletes
    /// the session's row as it stops: a clean end).
    fn stop_threads(&self) {
        if let Some(j) = self.joined.get() {
            j.stop.store(true, Relaxed);
            if let Some(t) = j.watcher.lock().take() {
                let _ = t.join();
            }
        }
        if let Some(claim) = self.claim.lock().take() {
            *claim.stop.lock() = true;
            claim.wake.notify_all();
            if let Some(t) = claim.keeper.lock().take() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

/// Keeps a claim: checks its connection every [`CLAIM_CHECK`]; after an
/// outage takes the lock again on a new one, and if another daemon claimed
/// the volume meanwhile (the claim number moved), this store is fenced:
/// its commits fail from then on (the number no longer matches).
fn keep_claim(
    mut client: Client,
    config: &postgres::Config,
    claim: &Claim,
    token: &AtomicI64,
    mode: Mode,
    id: i64,
) {
    let mut lost_since: Option<Instant> = None;
    loop {
        {
            let mut stop = claim.stop.lock();
            if !*stop {
                claim.wake.wait_for(&mut stop, CLAIM_CHECK);
            }
            if *stop {
                // A clean end: the session leaves no row behind (a row
                // whose lock nobody holds is a daemon that died).
                let _ = client.execute("DELETE FROM safs_sessions WHERE id = $1", &[&id]);
                // Locks are dropped with the files they were taken through;
                // any left (a lazy unmount) go with the session.
                if mode == Mode::Shared {
                    let _ = client.batch_execute(&format!(
                        "DELETE FROM safs_locks WHERE session = {id}; \
                         DELETE FROM safs_lock_waits WHERE session = {id}; \
                         NOTIFY {LOCKS_CHANNEL}"
                    ));
                }
                return;
            }
        }
        if client.simple_query("SELECT 1").is_ok() {
            continue;
        }
        lost_since.get_or_insert_with(Instant::now);
        let retake = || -> Result<Client, String> {
            let mut c = config.connect(NoTls).map_err(|e| e.to_string())?;
            if !take_volume_lock(&mut c, mode).map_err(|e| e.to_string())? {
                return Err("another daemon holds the volume's claim".into());
            }
            let mine: bool = c
                .query_one("SELECT pg_try_advisory_lock($1)", &[&(SESSION_LOCKS + id)])
                .map_err(|e| e.to_string())?
                .get(0);
            if !mine {
                return Err("another daemon took this session over".into());
            }
            if mode == Mode::Shared {
                let rows = c
                    .execute("SELECT 1 FROM safs_sessions WHERE id = $1", &[&id])
                    .map_err(|e| e.to_string())?;
                if rows == 0 {
                    // Cut off long enough for the others to take it for
                    // dead: they reclaimed the files it had open unlinked.
                    tracing::error!(
                        session = id,
                        "this daemon was taken for dead while cut off from PostgreSQL: files it \
                         held open after their unlink may be gone; registering it again"
                    );
                    c.execute(
                        "INSERT INTO safs_sessions (id, host, pid, mountpoint) \
                         VALUES ($1, '?', 0, '(re-registered)')",
                        &[&id],
                    )
                    .map_err(|e| e.to_string())?;
                }
            }
            let now: i64 = c
                .query_one("SELECT claim FROM safs_volume", &[])
                .map_err(|e| e.to_string())?
                .get(0);
            if now != token.load(Relaxed) {
                return Err("another daemon claimed the volume meanwhile".into());
            }
            Ok(c)
        };
        match retake() {
            Ok(c) => {
                tracing::info!(
                    after = ?lost_since.take().map(|t| t.elapsed()),
                    "PostgreSQL claim connection restored"
                );
                client = c;
            }
            Err(e) => {
                tracing::warn!("PostgreSQL claim connection lost; retaking it: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::cluster::TempCluster;
    use super::*;
    use crate::meta::LockKind;

    #[test]
    fn conformance_on_a_real_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = TempCluster::start(dir.path()).unwrap();
        let info = cluster.conninfo("postgres");
        let store = PgStore::create(&info, false).unwrap();
        let compression: i8 = store
            .raw_client()
            .unwrap()
            .query_one(
                "SELECT attcompression FROM pg_attribute \
                 WHERE attrelid = 'safs_kv'::regclass AND attname = 'v'",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(compression as u8, b'l', "safs_kv.v compressed with lz4");
        super::super::conformance::run(&store);
        // Byte order, as LMDB keeps it: 0xff sorts after 0x7f, a prefix
        // before its extensions.
        store
            .commit(&[
                (vec![0x7f], Some(b"a".to_vec())),
                (vec![0xff], Some(b"b".to_vec())),
                (vec![0x7f, 0], Some(b"c".to_vec())),
            ])
            .unwrap();
        let keys: Vec<Vec<u8>> = store
            .scan(&[0x7f], &[0xff, 0xff], 10)
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys, vec![vec![0x7f], vec![0x7f, 0], vec![0xff]]);
        // A put and a delete of one key in a batch: the last one wins.
        store
            .commit(&[(b"k".to_vec(), Some(b"1".to_vec())), (b"k".to_vec(), None)])
            .unwrap();
        assert_eq!(store.get(b"k").unwrap(), None);
        store
            .commit(&[(b"k".to_vec(), None), (b"k".to_vec(), Some(b"2".to_vec()))])
            .unwrap();
        assert_eq!(store.get(b"k").unwrap().as_deref(), Some(&b"2"[..]));
        assert!(store.disk_bytes() > 0);

        // A second volume in the same database is refused; --force
        // replaces it.
        let e = PgStore::create(&info, false).err().unwrap();
        assert!(e.to_string().contains("already holds a safs volume"), "{e}");
        let fresh = PgStore::create(&info, true).unwrap();
        assert_eq!(fresh.get(b"k").unwrap(), None);

        // A restarted server: the pooled connection fails, the next call
        // reconnects by itself.
        cluster.restart().unwrap();
        assert_eq!(fresh.get(b"k").unwrap(), None);
        fresh
            .commit(&[(b"after".to_vec(), Some(b"restart".to_vec()))])
            .unwrap();
        assert_eq!(
            PgStore::open(&info)
                .unwrap()
                .get(b"after")
                .unwrap()
                .as_deref(),
            Some(&b"restart"[..])
        );

        // Read-only: reads work, a commit is refused by the server.
        let ro = PgStore::open_read_only(&info).unwrap();
        assert!(ro.get(b"after").unwrap().is_some());
        assert!(ro.commit(&[(b"x".to_vec(), None)]).is_err());
    }

    fn who(pid: u32) -> Session {
        Session {
            host: "h".into(),
            pid,
            mountpoint: format!("/m{pid}"),
        }
    }

    #[test]
    fn one_claim_at_a_time_and_a_claim_lost_to_another_daemon_fences_its_commits() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = TempCluster::start(dir.path()).unwrap();
        let info = cluster.conninfo("postgres");
        drop(PgStore::create(&info, false).unwrap());
        let a = PgStore::open(&info).unwrap();
        a.claim(&who(1)).unwrap();
        a.commit(&[(b"a".to_vec(), Some(b"1".to_vec()))]).unwrap();
        let b = PgStore::open(&info).unwrap();
        let e = b.claim(&who(2)).err().unwrap();
        assert!(
            e.to_string().contains("pid 1 on host h, mounted on /m1"),
            "{e}"
        );
        let rows = b.sessions().unwrap();
        assert_eq!(rows.len(), 1);
        assert!(rows[0].live && rows[0].session == who(1));

        // A's connections are cut (a network partition, an admin); B claims
        // at once. Whoever wins, never both: the loser's claim or commits fail.
        let mut admin = postgres::Client::connect(&info, NoTls).unwrap();
        admin
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name = 'safs'",
                &[],
            )
            .unwrap();
        match b.claim(&who(2)) {
            Ok(()) => {
                let e = a
                    .commit(&[(b"a".to_vec(), Some(b"stale".to_vec()))])
                    .err()
                    .unwrap();
                assert!(matches!(e, MetaError::Claimed(_)), "{e}");
                b.commit(&[(b"b".to_vec(), Some(b"2".to_vec()))]).unwrap();
                assert_eq!(b.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
            }
            Err(MetaError::Claimed(_)) => {
                a.commit(&[(b"a".to_vec(), Some(b"3".to_vec()))]).unwrap();
                assert_eq!(b.get(b"a").unwrap().as_deref(), Some(&b"3"[..]));
            }
            Err(e) => panic!("{e}"),
        }

        // A dropped (its daemon gone): its claim goes with its connection.
        drop(a);
        drop(b);
        let c = PgStore::open(&info).unwrap();
        c.claim(&who(3)).unwrap();
        // Rows of daemons that died stay (a mount reclaims what they held);
        // those that ended cleanly are gone; only the claimant is live.
        let rows = c.sessions().unwrap();
        let live: Vec<_> = rows.iter().filter(|r| r.live).collect();
        assert_eq!(live.len(), 1, "{rows:?}");
        assert_eq!(live[0].session, who(3));
    }

    #[test]
    fn record_locks_merge_split_and_conflict_across_sessions() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = TempCluster::start(dir.path()).unwrap();
        let info = cluster.conninfo("postgres");
        drop(PgStore::create(&info, false).unwrap());
        let a = PgStore::open(&info).unwrap();
        let b = PgStore::open(&info).unwrap();
        assert!(a.join(&who(1)).unwrap());
        assert!(b.join(&who(2)).unwrap());
        let req = |kind, start, end| LockReq {
            ino: 7,
            owner: 42,
            flock: false,
            kind,
            start,
            end,
            pid: 100,
            fh: 1,
        };
        let (r, w, u) = (LockKind::Read, LockKind::Write, LockKind::Unlock);
        let max = i64::MAX as u64;
        // A: write 0..=9 and 10..=19 merge into one; B (the same kernel
        // owner number, another daemon) conflicts with them.
        assert_eq!(a.lock_set(&req(w, 0, 9), false).unwrap(), None);
        assert_eq!(a.lock_set(&req(w, 10, 19), false).unwrap(), None);
        let held = b.lock_test(&req(r, 15, 15)).unwrap().unwrap();
        assert_eq!((held.kind, held.start, held.end, held.pid), (w, 0, 19, 100));
        // A read lock in the middle splits A's write lock in three.
        assert_eq!(a.lock_set(&req(r, 5, 14), false).unwrap(), None);
        assert_eq!(b.lock_test(&req(r, 5, 14)).unwrap(), None);
        let held = b.lock_test(&req(w, 0, max)).unwrap().unwrap();
        assert_eq!((held.kind, held.start, held.end), (w, 0, 4));
        let held = b.lock_test(&req(r, 15, max)).unwrap().unwrap();
        assert_eq!((held.kind, held.start, held.end), (w, 15, 19));
        // B shares the read part; unlocking A's whole range frees all.
        assert_eq!(b.lock_set(&req(r, 8, 8), false).unwrap(), None);
        assert!(a.lock_set(&req(w, 8, 8), false).unwrap().is_some());
        assert_eq!(a.lock_set(&req(u, 0, max), false).unwrap(), None);
        assert_eq!(b.lock_test(&req(w, 0, 7)).unwrap(), None);
        assert!(a.lock_test(&req(w, 0, max)).unwrap().is_some());
        // flock is its own space: B's record lock does not stand in its way.
        let fl = |kind| LockReq {
            flock: true,
            ..req(kind, 0, max)
        };
        assert_eq!(a.lock_set(&fl(w), false).unwrap(), None);
        assert!(b.lock_set(&fl(r), false).unwrap().is_some());
        // A's last close of file 1 drops what was taken through it; a
        // session that ends drops the rest.
        a.lock_drop(7, LockDrop::File(1)).unwrap();
        assert_eq!(b.lock_set(&fl(r), false).unwrap(), None);
        drop(b);
        assert_eq!(a.lock_set(&req(w, 0, max), false).unwrap(), None);
    }

    #[test]
    fn joined_daemons_take_turns_see_each_others_changes_and_a_lost_lease_commits_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = TempCluster::start(dir.path()).unwrap();
        let info = cluster.conninfo("postgres");
        assert!(SESSION_LIVE.contains(&SESSION_LOCKS.to_string()));
        drop(PgStore::create(&info, false).unwrap());
        let a = Arc::new(PgStore::open(&info).unwrap());
        let b = Arc::new(PgStore::open(&info).unwrap());
        assert!(a.join(&who(1)).unwrap());
        assert!(b.join(&who(2)).unwrap());
        assert_ne!(a.session_id(), b.session_id());
        // Both live; fsck (an exclusive claim) is refused, naming them.
        let e = PgStore::open(&info).unwrap().claim(&who(9)).err().unwrap();
        let e = e.to_string();
        assert!(e.contains("/m1") && e.contains("/m2"), "{e}");
        assert!(a.dead_sessions().unwrap().is_empty());
        assert!(!a.alone().unwrap());

        let (tx, rx) = std::sync::mpsc::channel();
        let tx = Mutex::new(tx);
        b.watch(Box::new(move |e| {
            let _ = tx.lock().send(e);
        }))
        .unwrap();

        // A commits under the lease; B waits for its turn meanwhile.
        assert_eq!(a.lease(0).unwrap().epoch, 0);
        a.commit(&[(b"k1".to_vec(), Some(b"a".to_vec()))]).unwrap();
        assert!(!a.lease_wanted(), "nobody waits yet");
        let waiter = {
            let b = Arc::clone(&b);
            std::thread::spawn(move || b.lease(0).unwrap())
        };
        std::thread::sleep(Duration::from_millis(300));
        assert!(!waiter.is_finished(), "B got the lease while A held it");
        // A sees B waiting (its turn then ends).
        assert!(a.lease_wanted());
        assert_eq!(a.release(), 1);
        let seen = waiter.join().unwrap();
        assert_eq!(seen.epoch, 1);
        assert_eq!(seen.keys, Some(vec![b"k1".to_vec()]));
        // B's doorbell rang for A's commit.
        let rang = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(rang >= 1);
        b.commit(&[
            (b"k1".to_vec(), None),
            (b"k2".to_vec(), Some(b"b".to_vec())),
        ])
        .unwrap();
        assert_eq!(b.release(), 2);
        let ch = a.changes(1).unwrap();
        assert_eq!(ch.epoch, 2);
        let mut keys = ch.keys.unwrap();
        keys.sort();
        assert_eq!(keys, vec![b"k1".to_vec(), b"k2".to_vec()]);
        // Without the lease, a commit is refused.
        let e = a.commit(&[(b"x".to_vec(), None)]).err().unwrap();
        assert!(matches!(e, MetaError::LeaseLost(_)), "{e}");

        // A's lease is lost with its connection; B takes it and commits:
        // A's commit under the lost lease must not land.
        assert_eq!(a.lease(2).unwrap().epoch, 2);
        let mut admin = postgres::Client::connect(&info, NoTls).unwrap();
        admin
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks \
                 WHERE locktype = 'advisory' AND granted AND objid = $1::bigint::oid",
                &[&WRITE_LOCK],
            )
            .unwrap();
        assert_eq!(b.lease(2).unwrap().epoch, 2);
        b.commit(&[(b"k3".to_vec(), Some(b"b".to_vec()))]).unwrap();
        b.release();
        let e = a
            .commit(&[(b"k3".to_vec(), Some(b"stale".to_vec()))])
            .err()
            .unwrap();
        assert!(matches!(e, MetaError::LeaseLost(_)), "{e}");
        a.release();
        assert_eq!(a.get(b"k3").unwrap().as_deref(), Some(&b"b"[..]));
        // The log reaches back only so far: further behind, everything.
        let mut admin2 = postgres::Client::connect(&info, NoTls).unwrap();
        admin2
            .execute("DELETE FROM safs_changes WHERE epoch = 1", &[])
            .unwrap();
        assert_eq!(a.changes(0).unwrap().keys, None);
        assert!(a.changes(1).unwrap().keys.is_some());
        // A clean end leaves no row; B is alone.
        drop(a);
        assert!(b.alone().unwrap());
        assert_eq!(b.sessions().unwrap().len(), 1);
    }

    /// A commit only made visible is seen by every connection at once,
    /// turns `synchronous_commit` off for its own transaction only, and is
    /// made durable by a flush — also when the session's row is gone.
    #[test]
    fn visible_commits_are_seen_at_once_and_made_durable_by_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = TempCluster::start(dir.path()).unwrap();
        let info = cluster.conninfo("postgres");
        drop(PgStore::create(&info, false).unwrap());
        let a = PgStore::open(&info).unwrap();
        assert!(!a.visible_before_durable(), "not before joining");
        assert!(a.join(&who(1)).unwrap());
        assert!(a.visible_before_durable());
        assert_eq!(a.lease(0).unwrap().epoch, 0);
        let batch = [(&b"k"[..], Some(&b"v"[..]))];
        a.commit_iter_visible(&mut batch.iter().copied()).unwrap();
        let mut other = postgres::Client::connect(&info, NoTls).unwrap();
        let seen: Vec<u8> = other
            .query_one("SELECT v FROM safs_kv WHERE k = $1", &[&&b"k"[..]])
            .unwrap()
            .get(0);
        assert_eq!(seen, b"v");
        for _ in 0..4 {
            let setting: String = a
                .with_conn(|c| Ok(c.client.query_one("SHOW synchronous_commit", &[])?.get(0)))
                .unwrap();
            assert_eq!(
                setting, "on",
                "the setting stayed off on a pooled connection"
            );
        }
        a.make_durable().unwrap();
        other
            .execute(
                "DELETE FROM safs_sessions WHERE id = $1",
                &[&(a.session_id() as i64)],
            )
            .unwrap();
        let batch = [(&b"k"[..], Some(&b"w"[..]))];
        a.commit_iter_visible(&mut batch.iter().copied()).unwrap();
        a.make_durable().unwrap();
        a.release();
        assert_eq!(a.get(b"k").unwrap().as_deref(), Some(&b"w"[..]));
    }

    #[test]
    fn visible_commits_a_server_crash_lost_are_committed_again_unless_another_daemons_came_between()
    {
        let dir = tempfile::tempdir().unwrap();
        let cluster = TempCluster::start(dir.path()).unwrap();
        let info = cluster.conninfo("postgres");
        drop(PgStore::create(&info, false).unwrap());
        // A crash of the server (restarted at once), losing every commit
        // after `epoch` — as one whose WAL was not flushed loses them; if
        // the WAL writer flushed some first, their loss is made by hand.
        let crash_back_to = |epoch: i64| {
            cluster.restart().unwrap();
            let mut c = postgres::Client::connect(&info, NoTls).unwrap();
            let mut t = c.transaction().unwrap();
            let logged: Vec<Vec<u8>> = t
                .query(
                    "DELETE FROM safs_changes WHERE epoch > $1 RETURNING keys",
                    &[&epoch],
                )
                .unwrap()
                .into_iter()
                .flat_map(|r| r.get::<_, Vec<Vec<u8>>>(0))
                .collect();
            t.execute("DELETE FROM safs_kv WHERE k = ANY($1)", &[&logged])
                .unwrap();
            t.execute("UPDATE safs_volume SET epoch = $1", &[&epoch])
                .unwrap();
            t.commit().unwrap();
        };
        let put = |s: &PgStore, k: &[u8], durable: bool| {
            let batch = [(k, Some(&b"v"[..]))];
            if durable {
                s.commit_iter(&mut batch.iter().copied())
            } else {
                s.commit_iter_visible(&mut batch.iter().copied())
            }
        };
        let on_server = |k: &[u8]| {
            let mut c = postgres::Client::connect(&info, NoTls).unwrap();
            c.query_opt("SELECT 1 FROM safs_kv WHERE k = $1", &[&k])
                .unwrap()
                .is_some()
        };
        let (a, b) = (PgStore::open(&info).unwrap(), PgStore::open(&info).unwrap());
        assert!(a.join(&who(1)).unwrap() && b.join(&who(2)).unwrap());
        a.lease(0).unwrap();
        put(&a, b"k0", true).unwrap();
        put(&a, b"k1", false).unwrap();
        put(&a, b"k2", false).unwrap();
        assert!(on_server(b"k2"), "visible at once");
        crash_back_to(1);
        assert!(!on_server(b"k1"), "the crash lost what was not durable");
        // The next commit finds the epoch moved back, commits the lost two
        // again, then itself; the flush after covers them.
        put(&a, b"k3", false).unwrap();
        a.make_durable().unwrap();
        assert_eq!(a.release(), 4);
        for k in [&b"k0"[..], b"k1", b"k2", b"k3"] {
            assert!(on_server(k), "{k:?} committed again");
        }
        cluster.restart().unwrap();
        assert!(on_server(b"k3"), "durable after the flush");

        // A's commit, then B's on top of it, both lost: B cannot commit
        // its own again first (A's is missing under it); A can.
        a.lease(4).unwrap();
        put(&a, b"a5", false).unwrap();
        assert_eq!(a.release(), 5);
        b.lease(4).unwrap();
        put(&b, b"b6", false).unwrap();
        assert_eq!(b.release(), 6);
        crash_back_to(4);
        let seen_by_b = b.lease(6).unwrap();
        assert_eq!(seen_by_b.epoch, 4);
        assert!(seen_by_b.keys.is_none(), "B's caches are reset");
        b.release();
        let seen_by_a = a.lease(5).unwrap();
        assert_eq!(seen_by_a.epoch, 5, "A committed its own again");
        assert_eq!(seen_by_a.keys, Some(Vec::new()));
        a.make_durable().unwrap();
        a.release();
        assert!(on_server(b"a5"));
        assert!(
            !on_server(b"b6"),
            "B's commit is lost, as its caches were told"
        );

        // A's visible commit made durable by B's after it; a restart loses
        // nothing. A's next flush meets a restarted server: it finds its
        // commit there, and leaves its lease's epoch alone (B's commit is
        // B's: A must meet it as anyone's, through its lease).
        a.lease(5).unwrap();
        put(&a, b"a6", false).unwrap();
        assert_eq!(a.release(), 6);
        b.lease(6).unwrap();
        put(&b, b"b7", true).unwrap();
        assert_eq!(b.release(), 7);
        cluster.restart().unwrap();
        a.make_durable().unwrap();
        assert_eq!(a.reached(), None, "no lease taken by the check");
        assert!(on_server(b"a6") && on_server(b"b7"));
        let seen = a.lease(6).unwrap();
        assert_eq!((seen.epoch, seen.keys), (7, Some(vec![b"b7".to_vec()])));
        assert_eq!(a.release(), 7);

        // The syncer's flush commits A's lost commit again between the
        // lease's read of the epoch (behind) and its look at what is left
        // to recover (nothing): the lease reads again, and A's next commit
        // goes on top of its own.
        a.lease(7).unwrap();
        put(&a, b"a8", false).unwrap();
        assert_eq!(a.release(), 8);
        crash_back_to(7);
        *a.after_lease_read.lock() = Some(Box::new(|s: &PgStore| s.make_durable().unwrap()));
        let seen = a.lease(8).unwrap();
        assert_eq!((seen.epoch, seen.keys), (8, Some(Vec::new())));
        put(&a, b"a9", false).unwrap();
        assert_eq!(a.release(), 9);
        assert!(on_server(b"a8") && on_server(b"a9"));
    }

    #[test]
    fn a_leased_commit_whose_answer_was_lost_is_found_landed() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = TempCluster::start(dir.path()).unwrap();
        let info = cluster.conninfo("postgres");
        drop(PgStore::create(&info, false).unwrap());
        let a = PgStore::open(&info).unwrap();
        assert!(a.join(&who(1)).unwrap());
        assert_eq!(a.lease(0).unwrap().epoch, 0);
        a.commit(&[(b"old".to_vec(), Some(b"x".to_vec()))]).unwrap();
        a.commit(&[
            (b"old".to_vec(), None),
            (b"k".to_vec(), Some(b"v".to_vec())),
        ])
        .unwrap();
        let token = a.token.load(Relaxed);
        let landed = |expect: i64, gone: &[&[u8]], keys: &[&[u8]], values: &[&[u8]]| {
            let logged: Vec<&[u8]> = gone.iter().chain(keys).copied().collect();
            a.landed(expect, token, &logged, gone, keys, values)
                .unwrap()
        };
        // The second commit (epoch 1 -> 2) is there, as its retry would see it.
        assert!(landed(1, &[b"old"], &[b"k"], &[b"v"]));
        // Not what another batch, another epoch or another claim left.
        assert!(!landed(1, &[b"old"], &[b"k"], &[b"w"]));
        assert!(!landed(1, &[], &[b"k"], &[b"v"]));
        assert!(!landed(0, &[b"old"], &[b"k"], &[b"v"]));
        assert!(
            !a.landed(1, token + 1, &[b"old", b"k"], &[b"old"], &[b"k"], &[b"v"])
                .unwrap()
        );
        a.release();
    }

    #[test]
    fn an_old_schema_is_refused_until_upgraded() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = TempCluster::start(dir.path()).unwrap();
        let info = cluster.conninfo("postgres");
        let mut c = postgres::Client::connect(&info, NoTls).unwrap();
        // Schema 1, as the previous release made it.
        c.batch_execute(
            "CREATE TABLE safs_volume (version integer NOT NULL, \
               created timestamptz NOT NULL DEFAULT now(), claim bigint NOT NULL DEFAULT 0);
             CREATE TABLE safs_kv (k bytea PRIMARY KEY, v bytea NOT NULL);
             CREATE TABLE safs_sessions (host text NOT NULL, pid integer NOT NULL, \
               mountpoint text NOT NULL, since timestamptz NOT NULL DEFAULT now());
             INSERT INTO safs_volume (version) VALUES (1);
             INSERT INTO safs_kv VALUES ('\\x01', '\\x02');",
        )
        .unwrap();
        let e = PgStore::open(&info).err().unwrap().to_string();
        assert!(e.contains("safs upgrade"), "{e}");
        assert_eq!(PgStore::upgrade(&info).unwrap(), 1);
        assert_eq!(PgStore::upgrade(&info).unwrap(), SCHEMA_VERSION);
        let s = PgStore::open(&info).unwrap();
        assert_eq!(s.get(&[1]).unwrap().as_deref(), Some(&[2u8][..]));
        assert!(s.join(&who(1)).unwrap());
        assert_eq!(s.lease(0).unwrap().epoch, 0);
        s.commit(&[(vec![3], Some(vec![4]))]).unwrap();
        assert_eq!(s.release(), 1);
    }

    #[test]
    fn a_database_without_a_volume_or_no_server_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = TempCluster::start(dir.path()).unwrap();
        let e = PgStore::open(&cluster.conninfo("postgres")).err().unwrap();
        assert!(e.to_string().contains("holds no safs volume"), "{e}");
        let e = PgStore::open(&cluster.conninfo("nosuchdb")).err().unwrap();
        assert!(e.to_string().contains("cannot connect"), "{e}");
        drop(cluster);
        let e = PgStore::open(&format!("host={} user=postgres", dir.path().display()))
            .err()
            .unwrap();
        assert!(e.to_string().contains("cannot connect"), "{e}");
    }
}
