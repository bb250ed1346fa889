//! The daemon's control socket, `<volume>/control.sock` (mode 0600): how
//! `safs info --stats` and `safs bench` talk to a running mount.
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
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::core::Fs;
use crate::fuse::stats::{OpReport, Stats};

pub fn socket_path(volume: &Path) -> PathBuf {
    volume.join("control.sock")
}

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
    /// Metadata engine reads and commits since the mount.
    #[serde(default)]
    pub engine: crate::meta::EngineCounters,
    /// The volume's inline xattr budget, bytes.
    #[serde(default)]
    pub inline_bytes: u64,
    /// The group committer: failing or not, records waiting, space held.
    #[serde(default)]
    pub commits: Option<crate::core::Health>,
    /// Impossible counts met since the mount: 0 unless safs has a bug.
    #[serde(default)]
    pub broken_counts: u64,
}

/// A `kB` figure of this process's `/proc/self/status` (0 if unreadable).
fn status_kib(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[derive(Serialize, Deserialize)]
struct Reply {
    ok: bool,
    error: Option<String>,
    stats: Option<StatsReply>,
}

/// Serves the control socket on a thread of its own until the process ends.
pub fn serve(volume: &Path, fs: Arc<Fs>, stats: Arc<Stats>) -> std::io::Result<()> {
    let path = socket_path(volume);
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
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
    Ok(())
}

fn handle(conn: UnixStream, fs: &Fs, stats: &Stats) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    let reply = match line.trim() {
        "stats" => {
            let cache = fs.cache_figures();
            let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            Reply {
                ok: true,
                error: None,
                stats: Some(StatsReply {
                    pid: std::process::id(),
                    ops: stats.report(),
                    cached_inodes: cache.inodes,
                    inode_cache_capacity: cache.inode_capacity,
                    peak_rss_kib: status_kib(&status, "VmHWM"),
                    rss_anon_kib: status_kib(&status, "RssAnon"),
                    cache_bytes: cache.bytes as u64,
                    cache_budget_bytes: cache.byte_budget as u64,
                    engine: fs.engine_counters(),
                    inline_bytes: fs.inline_budget() as u64,
                    commits: Some(fs.health()),
                    broken_counts: fs.broken_counts(),
                }),
            }
        }
        "sync" => match fs.sync() {
            Ok(()) => Reply {
                ok: true,
                error: None,
                stats: None,
            },
            Err(e) => Reply {
                ok: false,
                error: Some(e.to_string()),
                stats: None,
            },
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
            Reply {
                ok: true,
                error: None,
                stats: None,
            }
        }
        "drop-caches" => {
            fs.drop_caches();
            Reply {
                ok: true,
                error: None,
                stats: None,
            }
        }
        other => Reply {
            ok: false,
            error: Some(format!("unknown command {other:?}")),
            stats: None,
        },
    };
    let mut w = &conn;
    serde_json::to_writer(&mut w, &reply)?;
    w.write_all(b"\n")
}

/// Sends `cmd` to the daemon serving `volume`; returns its stats if any.
pub fn request(volume: &Path, cmd: &str) -> anyhow::Result<Option<StatsReply>> {
    let path = socket_path(volume);
    let mut conn = UnixStream::connect(&path)
        .map_err(|e| anyhow::anyhow!("cannot reach the safs daemon at {}: {e}", path.display()))?;
    conn.set_read_timeout(Some(Duration::from_secs(60)))?;
    conn.write_all(format!("{cmd}\n").as_bytes())?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    let reply: Reply = serde_json::from_str(&line)?;
    if !reply.ok {
        anyhow::bail!("daemon: {}", reply.error.unwrap_or_default());
    }
    Ok(reply.stats)
}
