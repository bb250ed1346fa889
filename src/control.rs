//! The daemon's side of its control socket, `<volume>/control.sock` (mode
//! 0600): how `safs info`, `safs sync`, `mount -o remount` and `safs bench`
//! talk to a running mount. The protocol's types and the client call are
//! in the `safs-control` crate (the bench depends on it alone).
//!
//! Protocol: one request line, one JSON reply line.
//! - `stats`: request counts and latency histograms per FUSE operation, plus
//!   the core's cache figures;
//! - `sync`: make every change so far durable (what `syncfs` would do, had
//!   Linux forwarded it);
//! - `drop-caches`: empty the daemon's inode cache (cold-cache benchmarks);
//! - `atime <noatime|relatime|strictatime> [nodiratime]`: new access-time
//!   rules (sent by `mount -o remount,...`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use safs_control::{
    Health, Reply, StatsReply, is_shared, request, request_at, socket_for, socket_path,
    socket_path_at,
};

use crate::core::Fs;
use crate::fuse::stats::Stats;

/// A `kB` figure of this process's `/proc/self/status` (0 if unreadable).
fn status_kib(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The control socket a daemon made: at the end it is removed only if the
/// path still names it. On a shared volume a daemon mounting the same
/// mountpoint again may already have made its own there while this one
/// was still closing (a mount right after an unmount: xfstests generic/366).
pub struct ControlSocket {
    volume: PathBuf,
    path: PathBuf,
    /// Device and inode of the socket this daemon bound.
    id: (u64, u64),
}

impl ControlSocket {
    /// Removes the socket, unless another daemon's has replaced it.
    pub fn remove(self) {
        let _ = with_volume_locked(&self.volume, || {
            match std::fs::symlink_metadata(&self.path) {
                Ok(m) if (m.dev(), m.ino()) == self.id => std::fs::remove_file(&self.path),
                _ => Ok(()),
            }
        });
    }
}

/// Runs `f` holding an exclusive `flock` of the volume directory: daemons
/// of this host replacing and removing a control socket take turns. (A
/// filesystem that cannot lock a directory only loses that ordering.)
fn with_volume_locked<T>(
    volume: &Path,
    f: impl FnOnce() -> std::io::Result<T>,
) -> std::io::Result<T> {
    let lock = std::fs::File::open(volume)
        .ok()
        .and_then(|d| nix::fcntl::Flock::lock(d, nix::fcntl::FlockArg::LockExclusive).ok());
    let r = f();
    drop(lock);
    r
}

/// Serves the control socket of the daemon serving `volume` on
/// `mountpoint` ([`socket_path_at`]) on a thread of its own until the
/// process ends.
pub fn serve(
    volume: &Path,
    mountpoint: &Path,
    fs: Arc<Fs>,
    stats: Arc<Stats>,
) -> std::io::Result<ControlSocket> {
    let path = socket_path_at(volume, mountpoint);
    let (listener, id) = with_volume_locked(volume, || {
        // A socket left there by a daemon that died.
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        let m = std::fs::symlink_metadata(&path)?;
        Ok((listener, (m.dev(), m.ino())))
    })?;
    std::thread::Builder::new()
        .name("safs-control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                if let Err(e) = handle(conn, &fs, &stats) {
                    tracing::debug!(error = %e, "control connection");
                }
            }
        })?;
    Ok(ControlSocket {
        volume: volume.to_path_buf(),
        path,
        id,
    })
}

/// What the daemon has served and holds now: the reply to `stats`, and
/// what `-o metrics=` exports.
pub fn stats_reply(fs: &Fs, stats: &Stats) -> StatsReply {
    let cache = fs.cache_figures();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    StatsReply {
        pid: std::process::id(),
        ops: stats.report(),
        cached_inodes: cache.inodes,
        inode_cache_capacity: cache.inode_capacity,
        peak_rss_kib: status_kib(&status, "VmHWM"),
        rss_anon_kib: status_kib(&status, "RssAnon"),
        cache_bytes: cache.bytes as u64,
        cache_budget_bytes: cache.byte_budget as u64,
        dircache_dirs: cache.dirs as u64,
        dircache_bytes: cache.dir_bytes as u64,
        dircache_budget_bytes: cache.dir_budget as u64,
        inode_cache_hits: cache.inode_hits,
        inode_cache_misses: cache.inode_misses,
        dircache_hits: cache.dir_hits,
        dircache_misses: cache.dir_misses,
        engine: {
            let e = fs.engine_counters();
            safs_control::EngineCounters {
                gets: e.gets,
                scans: e.scans,
                commits: e.commits,
            }
        },
        uring_queues: stats.transport.uring_queues(),
        uring_caller_moves: stats.transport.uring_caller_moves(),
        inline_bytes: fs.inline_budget() as u64,
        commits: Some({
            let h = fs.health();
            Health {
                failure: h.failure,
                failing_for_s: h.failing_for_s,
                waiting_records: h.waiting_records,
                held_bytes: h.held_bytes,
                need_bytes: h.need_bytes,
            }
        }),
        broken_counts: fs.broken_counts(),
        store: fs.store_figures(),
        lease: fs.lease_figures().map(|l| safs_control::LeaseReport {
            takes: l.takes,
            wait_ns: l.wait_ns,
        }),
        hist_bounds_us: (0..safs_control::BUCKETS)
            .map(safs_control::bucket_bound_us)
            .collect(),
    }
}

fn handle(conn: UnixStream, fs: &Fs, stats: &Stats) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    let reply = match line.trim() {
        "stats" => Reply {
            stats: Some(stats_reply(fs, stats)),
            ..Reply::done()
        },
        "sync" => match fs.sync() {
            Ok(()) => Reply::done(),
            Err(e) => Reply::failed(e.to_string()),
        },
        cmd if cmd.starts_with("atime ") => {
            let mut a = crate::core::Atime::default();
            for word in cmd.split_whitespace().skip(1) {
                match word {
                    "noatime" => a.mode = crate::core::AtimeMode::Never,
                    "relatime" => a.mode = crate::core::AtimeMode::Relative,
                    "strictatime" => a.mode = crate::core::AtimeMode::Always,
                    "nodiratime" => a.no_dirs = true,
                    _ => {}
                }
            }
            fs.set_atime(a);
            Reply::done()
        }
        "trace" => Reply {
            trace: Some(crate::fuse::transport::trace::take()),
            ..Reply::done()
        },
        cmd if cmd.starts_with("trace ") => match cmd[6..].trim().parse::<usize>() {
            Ok(n) => {
                crate::fuse::transport::trace::arm(n);
                Reply::done()
            }
            Err(_) => Reply::failed(format!("{cmd:?}: trace needs a number of requests")),
        },
        "drop-caches" => {
            fs.drop_caches();
            Reply::done()
        }
        other => Reply::failed(format!("unknown command {other:?}")),
    };
    let mut w = &conn;
    serde_json::to_writer(&mut w, &reply)?;
    w.write_all(b"\n")
}
