//! The safs daemon's control socket, `<volume>/control.sock` (mode 0600),
//! as its clients see it: the protocol's types, the client call, and how
//! to find a volume's mount and tell whether a daemon serves it. The
//! daemon side is `safs::control`; `safs info`, `safs sync` and
//! `safs bench` are clients, and the bench depends on nothing else of safs.
//!
//! Protocol: one request line, one JSON reply line ([`Reply`]).
//! - `stats`: request counts and latency histograms per FUSE operation, the
//!   inode cache's figures, the engine's counters, the committer's health;
//! - `sync`: make every change so far durable (what `syncfs` would do, had
//!   Linux forwarded it);
//! - `drop-caches`: empty the daemon's inode cache (cold-cache benchmarks);
//! - `atime <noatime|relatime|strictatime> [nodiratime]`: new access-time
//!   rules (sent by `mount -o remount,...`).

pub mod mountinfo;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where a volume's daemon listens.
pub fn socket_path(volume: &Path) -> PathBuf {
    volume.join("control.sock")
}

/// Whether several daemons may serve `volume` at once (its metadata is in
/// PostgreSQL): then each listens on a socket of its own.
pub fn is_shared(volume: &Path) -> bool {
    volume.join("meta").join("postgres.conf").exists()
}

/// Where the daemon serving `volume` on `mountpoint` (of this host)
/// listens: [`socket_path`], or on a shared volume `control-<id>.sock`,
/// the id a hash of host and mountpoint (the volume directory may be on
/// storage several hosts share).
pub fn socket_path_at(volume: &Path, mountpoint: &Path) -> PathBuf {
    if !is_shared(volume) {
        return socket_path(volume);
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    // FNV-1a: stable across builds, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in host
        .trim()
        .bytes()
        .chain([0])
        .chain(mountpoint.as_os_str().as_encoded_bytes().iter().copied())
    {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    volume.join(format!("control-{h:016x}.sock"))
}

/// Where to reach a daemon serving `volume`: [`socket_path`], or on a
/// shared volume the one serving its first mount on this host.
pub fn socket_for(volume: &Path) -> PathBuf {
    if !is_shared(volume) {
        return socket_path(volume);
    }
    let canonical = std::fs::canonicalize(volume).unwrap_or_else(|_| volume.to_path_buf());
    let mount = mountinfo::read().ok().and_then(|t| {
        t.into_iter()
            .find(|m| m.fstype.starts_with("fuse") && m.source == canonical)
            .map(|m| m.mountpoint)
    });
    match mount {
        Some(m) => socket_path_at(volume, &m),
        None => socket_path(volume),
    }
}

/// Histogram buckets of [`OpReport::hist`]: bucket `i` counts requests
/// that took less than `2^i` µs (and at least `2^(i-1)`); the last one
/// everything slower.
pub const BUCKETS: usize = 24;

/// The upper bound of histogram bucket `i`, µs (`None` for the last,
/// which has none).
pub fn bucket_bound_us(i: usize) -> Option<u64> {
    (i + 1 < BUCKETS).then(|| 1u64 << i)
}

/// One FUSE operation's figures since the mount.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct OpReport {
    pub op: String,
    pub count: u64,
    /// Time spent inside the handler, summed.
    pub total_ns: u64,
    /// See [`BUCKETS`].
    pub hist: Vec<u64>,
}

/// What the metadata engine has served since the mount.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineCounters {
    pub gets: u64,
    pub scans: u64,
    pub commits: u64,
}

/// The group committer: failing or not, records waiting, space held.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
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

/// A shared volume's write lease since the mount.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LeaseReport {
    pub takes: u64,
    pub wait_ns: u64,
}

/// The reply to `stats`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StatsReply {
    pub pid: u32,
    pub ops: Vec<OpReport>,
    pub cached_inodes: usize,
    pub inode_cache_capacity: usize,
    /// The daemon's peak resident memory (VmHWM), KiB. It counts the
    /// engine's memory-mapped file pages too (page cache, reclaimable).
    #[serde(default)]
    pub peak_rss_kib: u64,
    /// The daemon's anonymous resident memory now (RssAnon), KiB: heap and
    /// caches, the part the cache bound governs.
    #[serde(default)]
    pub rss_anon_kib: u64,
    /// Bytes the inode cache holds now, and the most it may hold.
    #[serde(default)]
    pub cache_bytes: u64,
    #[serde(default)]
    pub cache_budget_bytes: u64,
    /// The directory cache: directories it holds, bytes, and the most it
    /// may hold (0: turned off).
    #[serde(default)]
    pub dircache_dirs: u64,
    #[serde(default)]
    pub dircache_bytes: u64,
    #[serde(default)]
    pub dircache_budget_bytes: u64,
    /// Inode loads the inode cache answered and did not, and the same of
    /// the directory cache's lookups, since the mount.
    #[serde(default)]
    pub inode_cache_hits: u64,
    #[serde(default)]
    pub inode_cache_misses: u64,
    #[serde(default)]
    pub dircache_hits: u64,
    #[serde(default)]
    pub dircache_misses: u64,
    /// Metadata engine reads and commits since the mount.
    #[serde(default)]
    pub engine: EngineCounters,
    /// Requests each FUSE-over-io_uring queue served; `None`: the session
    /// is served over `/dev/fuse`.
    #[serde(default)]
    pub uring_queues: Option<Vec<u64>>,
    /// Over io_uring, requests whose caller had moved to another CPU since
    /// its previous request (each such move costs the caller a wakeup on
    /// another CPU: see `uring_yield` in the mount options).
    #[serde(default)]
    pub uring_caller_moves: Option<u64>,
    /// The volume's inline xattr budget, bytes.
    #[serde(default)]
    pub inline_bytes: u64,
    #[serde(default)]
    pub commits: Option<Health>,
    /// Impossible counts met since the mount: 0 unless safs has a bug.
    #[serde(default)]
    pub broken_counts: u64,
    /// A volume several daemons serve: its write lease, taken how often
    /// and waited for how long since the mount (`None` otherwise).
    #[serde(default)]
    pub lease: Option<LeaseReport>,
    /// The upper bound, in µs, of each bucket of [`OpReport::hist`] (the
    /// last bucket, `null`, has none).
    #[serde(default)]
    pub hist_bounds_us: Vec<Option<u64>>,
    /// A volume whose contents are in an object store: the store's and
    /// this node's cache's figures since the mount.
    #[serde(default)]
    pub store: Option<StoreReport>,
}

/// The object store and this node's cache of it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StoreReport {
    pub url: String,
    /// Bytes closed files' cached contents take, how many files, and the
    /// bound (`-o cache_size=`).
    pub cache_bytes: u64,
    pub cache_files: u64,
    pub cache_limit_bytes: u64,
    /// Opens and truncates whose contents were cached, and those that
    /// fetched blocks from the store.
    pub hits: u64,
    pub misses: u64,
    pub fetched_blocks: u64,
    pub fetched_bytes: u64,
    pub uploaded_blocks: u64,
    pub uploaded_bytes: u64,
    pub deleted_objects: u64,
    pub evicted_files: u64,
    pub evicted_bytes: u64,
    /// Uploads running, and closed files whose upload failed (tried again
    /// at unmount).
    pub uploads_waiting: u64,
    /// Objects no file names any more, queued for the deleter (a removed
    /// file's whole map counts one); counted up to
    /// [`DELETIONS_COUNTED`].
    #[serde(default)]
    pub deletions_queued: u64,
}

/// How far [`StoreReport::deletions_queued`] counts (one page of the
/// engine: the figure is read at every `stats`).
pub const DELETIONS_COUNTED: u64 = 1000;

/// The trace's clock, `CLOCK_MONOTONIC` in nanoseconds: the same in the
/// daemon and in whoever sets its own times beside a trace.
pub fn trace_clock_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always there");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

/// One request of a trace (`trace N`, then `trace`): when it reached the
/// daemon and when its reply was handed back ([`trace_clock_ns`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRecord {
    pub unique: u64,
    pub opcode: u32,
    pub arrived_ns: u64,
    pub answered_ns: u64,
}

/// One reply line.
#[derive(Debug, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    pub error: Option<String>,
    pub stats: Option<StatsReply>,
    /// The answer to `trace`: what the trace kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<Vec<TraceRecord>>,
}

impl Reply {
    pub fn done() -> Reply {
        Reply {
            ok: true,
            error: None,
            stats: None,
            trace: None,
        }
    }

    pub fn failed(error: String) -> Reply {
        Reply {
            ok: false,
            error: Some(error),
            stats: None,
            trace: None,
        }
    }
}

/// Sends `cmd` to the daemon serving `volume` ([`socket_for`]); returns
/// its stats if any.
pub fn request(volume: &Path, cmd: &str) -> anyhow::Result<Option<StatsReply>> {
    request_at(&socket_for(volume), cmd)
}

/// Sends `cmd` to the daemon listening at `path`.
pub fn request_at(path: &Path, cmd: &str) -> anyhow::Result<Option<StatsReply>> {
    Ok(reply_at(path, cmd)?.stats)
}

/// Starts a trace of the next `n` requests the daemon serving `volume`
/// answers (`n` = 0 ends it).
pub fn trace_start(volume: &Path, n: usize) -> anyhow::Result<()> {
    reply_at(&socket_for(volume), &format!("trace {n}")).map(drop)
}

/// Ends the trace of the daemon serving `volume` and returns it.
pub fn trace_take(volume: &Path) -> anyhow::Result<Vec<TraceRecord>> {
    Ok(reply_at(&socket_for(volume), "trace")?
        .trace
        .unwrap_or_default())
}

/// Sends `cmd` to the daemon listening at `path`; its reply, if it
/// succeeded.
fn reply_at(path: &Path, cmd: &str) -> anyhow::Result<Reply> {
    let mut conn = UnixStream::connect(path)
        .map_err(|e| anyhow::anyhow!("cannot reach the safs daemon at {}: {e}", path.display()))?;
    conn.set_read_timeout(Some(Duration::from_secs(60)))?;
    conn.write_all(format!("{cmd}\n").as_bytes())?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    let reply: Reply = serde_json::from_str(&line)?;
    if !reply.ok {
        anyhow::bail!("daemon: {}", reply.error.unwrap_or_default());
    }
    Ok(reply)
}

/// Whether some process — a daemon serving it, or `safs fsck` — holds the
/// lock of the volume at `volume` (`<volume>/lock`, an `flock`, exclusive,
/// or shared by the daemons of a volume several serve).
pub fn volume_in_use(volume: &Path) -> bool {
    let path = volume.join("lock");
    let Ok(file) = std::fs::File::open(&path) else {
        return false;
    };
    // The kernel's list of locks says so without taking one (a probe that
    // took the lock, even for a moment, could make a mount fail).
    if let Some(held) = flocked(&path) {
        return held;
    }
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock).is_err()
}

/// Whether `/proc/locks` lists an `flock` on `path` (`None`: cannot tell).
fn flocked(path: &Path) -> Option<bool> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    let dev = m.dev();
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    // "1: FLOCK  ADVISORY  WRITE 1234 08:01:123456 0 EOF" (device in hex).
    let want = format!("{major:02x}:{minor:02x}:{}", m.ino());
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    Some(locks.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.get(1) == Some(&"FLOCK") && f.iter().any(|x| *x == want)
    }))
}
