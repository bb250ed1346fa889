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
//! The connection string is libpq's (a URL or key=value pairs); the
//! password comes from `~/.pgpass` or `PGPASSFILE` ([`conninfo`]) and is
//! never stored in the volume.

pub mod cluster;
pub mod conninfo;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use parking_lot::Mutex;
use postgres::error::SqlState;
use postgres::{Client, NoTls, Statement};

use super::{EngineCounters, MetaError, MetaRead, MetaStore, WriteRef};

/// The schema this build writes and reads.
pub const SCHEMA_VERSION: i32 = 1;

/// How long one connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a call waits for an unreachable server to come back.
pub const OUTAGE_WAIT: Duration = Duration::from_secs(30);

const SCHEMA: &str = "
CREATE TABLE safs_volume (version integer NOT NULL, created timestamptz NOT NULL DEFAULT now());
CREATE TABLE safs_kv (k bytea PRIMARY KEY, v bytea NOT NULL);
";

/// One pooled connection and its prepared statements.
struct Conn {
    client: Client,
    get: Statement,
    scan: Statement,
    commit: Statement,
}

pub struct PgStore {
    config: postgres::Config,
    /// What the connection string names (no password), for messages.
    shown: String,
    read_only: bool,
    idle: Mutex<Vec<Conn>>,
    gets: AtomicU64,
    scans: AtomicU64,
    commits: AtomicU64,
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
                t.batch_execute("DROP TABLE IF EXISTS safs_kv, safs_volume")
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
            gets: AtomicU64::new(0),
            scans: AtomicU64::new(0),
            commits: AtomicU64::new(0),
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
        let commit = client
            .prepare(
                "WITH gone AS (DELETE FROM safs_kv WHERE k = ANY($1::bytea[])) \
                 INSERT INTO safs_kv (k, v) SELECT * FROM unnest($2::bytea[], $3::bytea[]) \
                 ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
            )
            .map_err(engine_err)?;
        Ok(Conn {
            client,
            get,
            scan,
            commit,
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
        let deadline = std::time::Instant::now() + OUTAGE_WAIT;
        let mut pause = Duration::from_millis(20);
        let mut wait = |what: &dyn std::fmt::Display| -> Result<(), ()> {
            if std::time::Instant::now() + pause > deadline {
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
        self.gets.fetch_add(1, Relaxed);
        self.with_conn(|c| {
            let row = c.client.query_opt(&c.get, &[&key])?;
            Ok(row.map(|r| r.get::<_, Vec<u8>>(0)))
        })
    }

    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<super::Pairs, MetaError> {
        self.scans.fetch_add(1, Relaxed);
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
        self.commits.fetch_add(1, Relaxed);
        self.with_conn(|c| {
            c.client.execute(&c.commit, &[&gone, &keys, &values])?;
            Ok(())
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
