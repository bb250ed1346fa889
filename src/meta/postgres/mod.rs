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
//! server's default. The core's group commit amortises the commit latency
//! as it does LMDB's fsync.
//!
//! Faults: a connection that fails is dropped and the call tried again on a
//! new one; while the server cannot be reached (restarting, "starting up")
//! the call waits, retrying with backoff, up to [`OUTAGE_WAIT`], then fails
//! (the core answers EIO and retries its batch). So a restarted server
//! costs a pause, not refused changes. Retrying a commit whose outcome was
//! lost is safe: a batch writes whole values and deletes, so applying it
//! twice is applying it once.
//!
//! One daemon at a time serves a volume, wherever it runs ([`PgStore::claim`]):
//! its claim is a session-level advisory lock, held on a connection of its
//! own for the daemon's life — a daemon that dies, or whose machine does,
//! loses it with its connection, so the next mount needs no cleanup — and
//! a claim number, bumped by every claim, that every commit checks in the
//! same statement: a daemon that lost its claim (its connection was cut and
//! another took the volume over) cannot commit anything more.
//!
//! The connection string is libpq's (a URL or key=value pairs); the
//! password comes from `~/.pgpass` or `PGPASSFILE` ([`conninfo`]) and is
//! never stored in the volume.

pub mod conninfo;
/// Private clusters for tests and the bench (`crates/safs-pgcluster`).
pub use safs_pgcluster as cluster;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use postgres::error::SqlState;
use postgres::{Client, NoTls, Statement};

use super::{
    EngineCounters, EngineTally, MetaError, MetaRead, MetaStore, Session, SessionRow, WriteRef,
};

/// The schema this build writes and reads.
pub const SCHEMA_VERSION: i32 = 1;

/// How long one connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a call waits for an unreachable server to come back, unless
/// the mount says otherwise (`-o meta_timeout=`).
pub const OUTAGE_WAIT: Duration = Duration::from_secs(30);
/// The advisory lock a claim holds (one volume per database).
const CLAIM_LOCK: i64 = 0x5AF5_0001;
/// How often the claim's connection is checked.
const CLAIM_CHECK: Duration = Duration::from_secs(1);

const SCHEMA: &str = "
CREATE TABLE safs_volume (version integer NOT NULL, created timestamptz NOT NULL DEFAULT now(),
                          claim bigint NOT NULL DEFAULT 0);
CREATE TABLE safs_kv (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE safs_sessions (host text NOT NULL, pid integer NOT NULL, mountpoint text NOT NULL,
                            since timestamptz NOT NULL DEFAULT now());
";

/// One pooled connection and its prepared statements.
struct Conn {
    client: Client,
    get: Statement,
    /// A value and the one its bytes point to, in one round trip.
    get_and_follow: Statement,
    scan: Statement,
    commit: Statement,
    /// The commit of a claimed store: applies the batch only while the
    /// volume's claim number is ours, and says whether it was.
    fenced_commit: Statement,
}

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
    tally: EngineTally,
}

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
                t.batch_execute("DROP TABLE IF EXISTS safs_kv, safs_volume, safs_sessions")
                    .map_err(engine_err)?;
            }
            t.batch_execute(SCHEMA).map_err(engine_err)?;
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
            tally: EngineTally::default(),
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
        Ok(Conn {
            client,
            get,
            get_and_follow,
            scan,
            commit,
            fenced_commit,
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
        Ok(())
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

    fn follows_in_one_read(&self) -> bool {
        true
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

impl MetaStore for PgStore {
    fn counters(&self) -> EngineCounters {
        self.tally.counters()
    }

    fn commit_iter<'a>(
        &self,
        batch: &mut dyn Iterator<Item = WriteRef<'a>>,
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

    fn set_outage_wait(&self, wait: Duration) {
        self.outage_ms.store(wait.as_millis() as u64, Relaxed);
    }

    fn claim(&self, who: &Session) -> Result<(), MetaError> {
        let mut client = self.raw_client()?;
        let got: bool = client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&CLAIM_LOCK])
            .map_err(engine_err)?
            .get(0);
        if !got {
            let holder = self
                .sessions()?
                .into_iter()
                .find(|s| s.live)
                .map(|s| format!("{} (since {})", s.session, s.since))
                .unwrap_or_else(|| "another daemon".into());
            return Err(MetaError::Claimed(holder));
        }
        let mut t = client.transaction().map_err(engine_err)?;
        let token: i64 = t
            .query_one(
                "UPDATE safs_volume SET claim = claim + 1 RETURNING claim",
                &[],
            )
            .map_err(engine_err)?
            .get(0);
        // Rows of daemons that died: only the holder of the lock writes here.
        t.execute("DELETE FROM safs_sessions", &[])
            .map_err(engine_err)?;
        t.execute(
            "INSERT INTO safs_sessions (host, pid, mountpoint) VALUES ($1, $2, $3)",
            &[&who.host, &(who.pid as i32), &who.mountpoint],
        )
        .map_err(engine_err)?;
        t.commit().map_err(engine_err)?;
        self.token.store(token, Relaxed);
        let claim = Arc::new(Claim {
            stop: Mutex::new(false),
            wake: parking_lot::Condvar::new(),
            keeper: Mutex::new(None),
        });
        let keeper = {
            let (claim, config, token) = (claim.clone(), self.config.clone(), self.token.clone());
            std::thread::Builder::new()
                .name("safs-pg-claim".into())
                .spawn(move || keep_claim(client, &config, &claim, &token))
                .map_err(MetaError::Io)?
        };
        *claim.keeper.lock() = Some(keeper);
        *self.claim.lock() = Some(claim);
        Ok(())
    }

    fn sessions(&self) -> Result<Vec<SessionRow>, MetaError> {
        self.with_conn(|c| {
            let live: bool = c
                .client
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
                     AND granted AND database = (SELECT oid FROM pg_database \
                     WHERE datname = current_database()) \
                     AND ((classid::bigint << 32) | objid::bigint) = $1)",
                    &[&CLAIM_LOCK],
                )?
                .get(0);
            let rows = c.client.query(
                "SELECT host, pid, mountpoint, since::text FROM safs_sessions ORDER BY since",
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
                    live,
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

impl Drop for PgStore {
    fn drop(&mut self) {
        if let Some(claim) = self.claim.lock().take() {
            *claim.stop.lock() = true;
            claim.wake.notify_all();
            if let Some(t) = claim.keeper.lock().take() {
                let _ = t.join();
            }
        }
    }
}

/// Keeps a claim: checks its connection every [`CLAIM_CHECK`]; after an
/// outage takes the lock again on a new one, and if another daemon claimed
/// the volume meanwhile (the claim number moved), this store is fenced:
/// its commits fail from then on (the number no longer matches).
fn keep_claim(mut client: Client, config: &postgres::Config, claim: &Claim, token: &AtomicI64) {
    let mut lost_since: Option<Instant> = None;
    loop {
        {
            let mut stop = claim.stop.lock();
            if !*stop {
                claim.wake.wait_for(&mut stop, CLAIM_CHECK);
            }
            if *stop {
                return;
            }
        }
        if client.simple_query("SELECT 1").is_ok() {
            continue;
        }
        lost_since.get_or_insert_with(Instant::now);
        let retake = || -> Result<Client, String> {
            let mut c = config.connect(NoTls).map_err(|e| e.to_string())?;
            let got: bool = c
                .query_one("SELECT pg_try_advisory_lock($1)", &[&CLAIM_LOCK])
                .map_err(|e| e.to_string())?
                .get(0);
            if !got {
                return Err("another daemon holds the volume's claim".into());
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

    #[test]
    fn conformance_on_a_real_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = TempCluster::start(dir.path()).unwrap();
        let info = cluster.conninfo("postgres");
        let store = PgStore::create(&info, false).unwrap();
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
        let rows = c.sessions().unwrap();
        assert_eq!(rows.len(), 1, "the dead daemons' rows are gone");
        assert_eq!(rows[0].session, who(3));
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
