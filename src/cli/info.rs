use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use safs::control::Health;
use safs::control::StatsReply;
use safs::core::crypto::KdfParams;
use safs::core::volume::{self, Layout, VolumeLock};
use safs::format::superblock::Superblock;

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// A volume directory or the mountpoint of a mounted safs.
    pub path: PathBuf,
    /// Also print the running daemon's FUSE request counts and latencies.
    #[arg(long)]
    pub stats: bool,
    /// Print the request statistics as JSON (implies --stats).
    #[arg(long)]
    pub json: bool,
}

/// Resolves a volume directory or a safs mountpoint to (volume, mountpoint).
pub fn resolve(path: &Path) -> anyhow::Result<(PathBuf, Option<PathBuf>)> {
    if Layout::new(path).is_volume() {
        Ok((path.to_path_buf(), None))
    } else if let Some(v) = volume_of_mount(path) {
        Ok((v, Some(path.to_path_buf())))
    } else {
        anyhow::bail!(
            "{} is neither a safs volume nor a safs mountpoint",
            path.display()
        );
    }
}

/// The control socket of the daemon to ask: on a volume several daemons
/// serve, the one of `mountpoint` if given, else of the volume's first
/// mount here.
pub fn daemon_socket(vol: &Path, mountpoint: Option<&Path>) -> anyhow::Result<PathBuf> {
    Ok(match mountpoint {
        Some(m) => safs::control::socket_path_at(vol, &std::fs::canonicalize(m)?),
        None => safs::control::socket_for(vol),
    })
}

/// `hits` of `hits + misses`, as a percentage (or "none" of none).
pub fn ratio(hits: u64, misses: u64) -> String {
    match hits + misses {
        0 => "none".into(),
        n => format!("{:.1} %", hits as f64 * 100.0 / n as f64),
    }
}

fn print_stats(sock: &Path, json: bool) -> anyhow::Result<()> {
    let stats = safs::control::request_at(sock, "stats")?.unwrap_or_default();
    if json {
        println!("{}", serde_json::to_string_pretty(&stats)?);
        return Ok(());
    }
    println!(
        "inode cache:    {} of {} inodes, {} of {} MiB; {} of inode loads answered",
        stats.cached_inodes,
        stats.inode_cache_capacity,
        stats.cache_bytes >> 20,
        stats.cache_budget_bytes >> 20,
        ratio(stats.inode_cache_hits, stats.inode_cache_misses)
    );
    if stats.dircache_budget_bytes > 0 {
        println!(
            "dircache:       {} directories, {} of {} MiB; {} of lookups answered",
            stats.dircache_dirs,
            stats.dircache_bytes >> 20,
            stats.dircache_budget_bytes >> 20,
            ratio(stats.dircache_hits, stats.dircache_misses)
        );
    }
    println!(
        "memory:         {} MiB anonymous now, {} MiB peak resident (with the engine's mapped pages)",
        stats.rss_anon_kib / 1024,
        stats.peak_rss_kib / 1024
    );
    println!(
        "engine:         {} point reads, {} scans, {} commits",
        stats.engine.gets, stats.engine.scans, stats.engine.commits
    );
    if let Some(st) = &stats.store {
        println!(
            "object store:   {}; fetched {} blocks ({} MiB), uploaded {} blocks ({} MiB), \
             deleted {} objects ({} queued); {} uploads waiting",
            st.url,
            st.fetched_blocks,
            st.fetched_bytes >> 20,
            st.uploaded_blocks,
            st.uploaded_bytes >> 20,
            st.deleted_objects,
            match st.deletions_queued {
                n if n >= safs_control::DELETIONS_COUNTED => format!("{n}+"),
                n => n.to_string(),
            },
            st.uploads_waiting
        );
        println!(
            "data cache:     {} closed files, {} of {} MiB; {} of opens found their contents \
             cached; {} files ({} MiB) dropped to stay within the bound",
            st.cache_files,
            st.cache_bytes >> 20,
            st.cache_limit_bytes >> 20,
            ratio(st.hits, st.misses),
            st.evicted_files,
            st.evicted_bytes >> 20
        );
    }
    match &stats.uring_queues {
        Some(q) => {
            println!(
                "transport:      FUSE over io_uring, {} queues; requests per queue: {}",
                q.len(),
                q.iter().map(u64::to_string).collect::<Vec<_>>().join(" ")
            );
            let moved = stats.uring_caller_moves.unwrap_or(0);
            println!(
                "                {moved} requests ({}) came from a caller the scheduler had \
                 moved to another CPU since its previous one",
                ratio(moved, q.iter().sum::<u64>().saturating_sub(moved))
            );
        }
        None => println!("transport:      /dev/fuse"),
    }
    if stats.broken_counts > 0 {
        println!(
            "INTERNAL ERRORS: {} impossible counts since the mount (a bug: please report it with the daemon's log)",
            stats.broken_counts
        );
    }
    if let Some(h) = &stats.commits {
        println!(
            "space held:     {} KiB ahead of metadata commits, {} KiB of it spoken for",
            h.held_bytes.min(u64::MAX >> 1) >> 10,
            h.need_bytes >> 10
        );
    }
    println!();
    println!(
        "{:<12} {:>12} {:>10} {:>9} {:>9}",
        "request", "count", "mean µs", "p50 <µs", "p99 <µs"
    );
    for op in &stats.ops {
        let quantile = |q: f64| {
            let target = (op.count as f64 * q).ceil() as u64;
            let mut seen = 0;
            for (i, n) in op.hist.iter().enumerate() {
                seen += n;
                if seen >= target.max(1) {
                    return 1u64 << i;
                }
            }
            1 << (op.hist.len() - 1)
        };
        println!(
            "{:<12} {:>12} {:>10.1} {:>9} {:>9}",
            op.op,
            op.count,
            op.total_ns as f64 / op.count.max(1) as f64 / 1000.0,
            quantile(0.5),
            quantile(0.99)
        );
    }
    Ok(())
}

/// Whether metadata commits succeed, and what waits if they do not.
fn print_health(h: &Health) {
    match &h.failure {
        None => println!(
            "commits:        healthy ({} records waiting for the next commit)",
            h.waiting_records
        ),
        Some(f) => println!(
            "commits:        DEGRADED for {} s: {f}; {} acknowledged records wait and are retried; new changes are refused until commits succeed (free space under the volume)",
            h.failing_for_s, h.waiting_records
        ),
    }
}

/// What protects an encrypted volume `sb` whose key record says `kdf`:
/// one line for `safs info` and `safs format`.
pub fn describe_encryption(sb: &Superblock, kdf: &KdfParams) -> String {
    let blocks = if sb.has_page_blocks() {
        "one block per 4 KiB page"
    } else {
        "4 KiB blocks straddling pages (first layout: a block written as the daemon is \
         killed can tear; copy the files to a new volume to leave it)"
    };
    format!(
        "names AES-256-SIV, records AES-256-GCM-SIV, contents AES-256-GCM, {blocks}; \
         passphrase Argon2id m={} KiB t={} p={}",
        kdf.m_kib, kdf.t, kdf.p
    )
}

/// The volume mounted at `mnt`, from /proc/self/mountinfo.
pub fn volume_of_mount(mnt: &Path) -> Option<PathBuf> {
    volume::volume_of_mount(&std::fs::canonicalize(mnt).ok()?)
}

pub fn run(a: InfoArgs) -> anyhow::Result<()> {
    let (vol, mountpoint) = resolve(&a.path)?;
    let sock = daemon_socket(&vol, mountpoint.as_deref())?;
    let shared = safs::control::is_shared(&vol);
    let mounted = (shared || VolumeLock::is_held(&vol)) && sock.exists();
    if a.json {
        if !mounted {
            anyhow::bail!(
                "{} is not mounted: request statistics come from the daemon serving a mount",
                vol.display()
            );
        }
        return print_stats(&sock, true);
    }
    let (store, sb) = volume::open_store(&vol)
        .with_context(|| format!("cannot open volume {}", vol.display()))?;
    println!("volume:         {}", vol.display());
    if let Some(m) = &mountpoint {
        println!("mountpoint:     {}", m.display());
    }
    println!("uuid:           {}", uuid::Uuid::from_bytes(sb.uuid));
    println!("format version: {}", sb.format_version);
    println!(
        "metadata:       {}",
        safs::meta::describe(&Layout::new(&vol).meta())
    );
    for s in store
        .sessions()
        .context("cannot list the volume's sessions")?
    {
        println!(
            "session:        {}, since {}{}",
            s.session,
            s.since,
            if s.live {
                ""
            } else {
                " (gone: its daemon stopped or died)"
            }
        );
    }
    println!("inline xattrs:  {} bytes per inode", sb.inline_bytes);
    println!(
        "dir stats:      {}",
        if sb.has_dir_stats() && sb.has_full_dir_stats() {
            "kept (getfattr -n safs.dir.rbytes DIR)"
        } else if sb.has_dir_stats() {
            "kept, without safs.dir.rctime and rallocated (`safs fsck --repair --dir-stats` adds them)"
        } else {
            "not kept (formatted before they were; `safs fsck --repair --dir-stats` adds them)"
        }
    );
    if sb.has_object_store() {
        let url = store
            .get(safs::format::keys::DATA_STORE)?
            .map(|rec| safs::format::blocks::decode_store(&rec))
            .transpose()
            .context("the store record is unreadable")?
            .unwrap_or_else(|| "(the store record is missing)".into());
        println!("contents:       in the object store at {url}; data/ here is this node's cache");
    } else {
        println!("contents:       in {}", Layout::new(&vol).data().display());
    }
    if sb.is_encrypted() {
        // The key record is readable without the passphrase; the counters
        // record is sealed (the daemon's statfs counts inodes).
        let rec = volume::key_record(store.as_ref(), &sb)
            .with_context(|| format!("cannot read the key record of {}", vol.display()))?;
        println!("encryption:     {}", describe_encryption(&sb, &rec.kdf));
        match mountpoint.or_else(|| volume::mountpoint_of(&vol)) {
            Some(m) => println!(
                "inodes:         (sealed on disk; `df -i {}` counts them)",
                m.display()
            ),
            None => {
                println!("inodes:         (sealed on disk; `df -i` on its mountpoint counts them)")
            }
        }
    } else {
        let counters = volume::read_counters(store.as_ref())?;
        let inodes = volume::inodes_in_use(store.as_ref())?;
        println!("encryption:     none");
        println!(
            "inodes:         {inodes} (next inode number {})",
            counters.next_ino
        );
    }
    println!("metadata size:  {} bytes", store.disk_bytes());
    if mounted {
        if shared {
            println!("mounted:        yes (the live sessions above are its daemons)");
        } else {
            let pid = VolumeLock::holder_pid(&vol);
            println!("mounted:        yes (daemon pid {pid})");
        }
        match safs::control::request_at(&sock, "stats") {
            Ok(Some(StatsReply {
                commits: Some(h), ..
            })) => print_health(&h),
            Ok(_) => {}
            Err(e) => println!("commits:        unknown ({e})"),
        }
    } else {
        println!("mounted:        no");
    }
    if a.stats {
        println!();
        if mounted {
            print_stats(&sock, false)?;
        } else {
            println!(
                "request statistics: none (the volume is not mounted; they come from its daemon)"
            );
        }
    }
    Ok(())
}
