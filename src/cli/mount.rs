//! `safs mount`: checks, the background daemon, signals and clean unmount.
//!
//! Without `-f` the command re-executes itself as a detached daemon child
//! and returns only when the child reports the mount live (exit 0) or
//! failed (its error is printed, exit 1) — like mount(8). The child logs to
//! `<volume>/safs.log`. `umount`, `fusermount3 -u`, SIGTERM, SIGINT and
//! SIGHUP all end the session; the final batch is committed before exit.
//!
//! An encrypted volume is unlocked by the command the user ran, before
//! anything writes to the volume, so that a wrong passphrase is reported
//! there and changes nothing. The daemon child gets the master key on a
//! pipe on its stdin — never in its arguments, environment or a file.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;

use safs::core::volume::{self, Layout, VolumeLock};
use safs::core::{Atime, AtimeMode, Fs, Options};
use safs::fuse::session::{Session, SessionOptions, set_mount_flags};
use safs::fuse::{DataPath, Transport};
use zeroize::Zeroizing;

use super::passphrase;

const READY: &str = "SAFS-READY";

#[derive(Args, Debug)]
pub struct MountArgs {
    /// The volume directory (made by `safs format`).
    pub volume: PathBuf,
    /// An existing, empty directory to mount on.
    pub mountpoint: PathBuf,
    /// Stay in the foreground (log to stderr) instead of daemonizing.
    #[arg(short, long)]
    pub foreground: bool,
    /// Mount options, comma-separated: allow_other, ro, sync, dirsync,
    /// async_commit (default; PostgreSQL volumes: a commit nobody waits to
    /// be durable is made visible at once and durable within 50 ms; after a
    /// server crash each node commits its lost ones again), noasync_commit
    /// (every commit durable before it is visible),
    /// passthrough, nopassthrough, nonempty, dev, suid, noexec,
    /// nosymfollow, relatime (default), noatime, strictatime, nodiratime,
    /// commit_ms=N (default 5, 2 on PostgreSQL volumes), threads=N, cache_mb=N (inode cache budget, default 256),
    /// meta_timeout=SECONDS (how long a metadata call waits for a
    /// PostgreSQL server it cannot reach before it fails, default 30),
    /// data_timeout=SECONDS (how long a call to the object store of a
    /// --data volume may take, retries included, before the file
    /// operation fails with EIO; default 30), cache_size=SIZE (the most
    /// closed files' contents this node keeps cached from the object
    /// store: 500M, 20G, 1T, a bare number in MiB; default 100G),
    /// transport=auto|uring|dev (FUSE over io_uring when the kernel offers
    /// it, the default, or required, or /dev/fuse reads and writes),
    /// read_ahead_kb=N (the kernel's read-ahead for reads the daemon serves,
    /// default 4096; 0 turns it off),
    /// uring_yield=0|1 (io_uring queue threads run as SCHED_IDLE while they
    /// wait and answer from memory, so a caller stays on its CPU; default 1),
    /// dircache=0|1 (the directory cache, half of cache_mb at most; on by
    /// default for encrypted and PostgreSQL volumes), passphrase_file=FILE (the passphrase of an encrypted volume, e.g.
    /// in /etc/fstab; encrypted volumes refuse passthrough),
    /// metrics=ADDRESS:PORT (serve Prometheus metrics at
    /// http://ADDRESS:PORT/metrics, e.g. metrics=127.0.0.1:9567).
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub options: Vec<String>,
    /// Read the passphrase of an encrypted volume from FILE (its whole
    /// contents but one trailing newline) instead of asking on the
    /// terminal; also taken from the environment variable
    /// SAFS_PASSPHRASE_FILE.
    #[arg(long, value_name = "FILE")]
    pub passphrase_file: Option<PathBuf>,
    #[arg(long, hide = true)]
    pub daemon_child: bool,
}

/// A size in bytes from `N[K|M|G|T]` (binary units; a bare number is in
/// MiB, as JuiceFS's `--cache-size` is).
fn size_mib(v: &str) -> anyhow::Result<u64> {
    let v = v.trim();
    let (digits, shift) = match v.char_indices().last() {
        Some((i, 'k' | 'K')) => (&v[..i], 10),
        Some((i, 'm' | 'M')) => (&v[..i], 20),
        Some((i, 'g' | 'G')) => (&v[..i], 30),
        Some((i, 't' | 'T')) => (&v[..i], 40),
        _ => (v, 20),
    };
    let n: u64 = digits
        .parse()
        .with_context(|| format!("{v:?} is not a size"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| anyhow::anyhow!("{v} is too large"))
}

/// The mount's read-ahead by default: one object-store block, four READs
/// of `max_pages` (see `fuse::session`).
const READ_AHEAD_KB: u32 = 4096;

#[derive(Debug)]
struct MountOpts {
    allow_other: bool,
    read_only: bool,
    sync: bool,
    dirsync: bool,
    /// Shared volumes: commits nobody syncs are visible at once and
    /// durable within 50 ms (see `core::store`).
    async_commit: bool,
    data_path: DataPath,
    transport: Transport,
    nonempty: bool,
    dev: bool,
    suid: bool,
    exec: bool,
    symfollow: bool,
    atime: Atime,
    /// `None`: 5 ms, or 2 ms on volumes several daemons serve (another
    /// mount sees a change once it is committed).
    commit_ms: Option<u64>,
    /// Seconds a metadata call waits for an unreachable database.
    meta_timeout: u64,
    /// Seconds a call to the object store may take.
    data_timeout: u64,
    /// Bytes of closed files' contents cached from the object store.
    cache_size: u64,
    threads: usize,
    uring_yield: bool,
    /// The kernel's read-ahead for the mount, in KiB.
    read_ahead_kb: u32,
    cache_mb: u64,
    /// `None`: the core's default (on for encrypted volumes).
    dircache: Option<bool>,
    passphrase_file: Option<PathBuf>,
    /// Where to serve Prometheus metrics (`None`: nowhere).
    metrics: Option<std::net::SocketAddr>,
}

impl MountOpts {
    /// What the FUSE session needs of these options.
    fn session(&self, volume: &Path) -> SessionOptions {
        SessionOptions {
            fsname: volume.to_string_lossy().into_owned(),
            allow_other: self.allow_other,
            read_only: self.read_only,
            dev: self.dev,
            suid: self.suid,
            exec: self.exec,
            symfollow: self.symfollow,
            sync: self.sync,
            dirsync: self.dirsync,
            atime: self.atime,
            threads: self.threads,
            uring_yield: self.uring_yield,
            data_path: self.data_path,
            transport: self.transport,
            read_ahead_kb: self.read_ahead_kb,
        }
    }
}

/// Parses `-o` options. Every option mount(8) can pass is either honoured
/// or refused with a message saying why; none is silently dropped.
fn parse_options(raw: &[String]) -> anyhow::Result<MountOpts> {
    let mut o = MountOpts {
        allow_other: false,
        read_only: false,
        sync: false,
        dirsync: false,
        async_commit: true,
        data_path: DataPath::Auto,
        transport: match std::env::var("SAFS_TRANSPORT") {
            Ok(v) => transport(Some(&v)).context("environment variable SAFS_TRANSPORT")?,
            Err(_) => Transport::Auto,
        },
        nonempty: false,
        dev: false,
        suid: false,
        exec: true,
        symfollow: true,
        atime: Atime::default(),
        commit_ms: None,
        meta_timeout: safs::meta::postgres::OUTAGE_WAIT.as_secs(),
        data_timeout: safs::objstore::Limits::default().timeout.as_secs(),
        cache_size: safs::core::DEFAULT_DATA_CACHE,
        threads: 4,
        uring_yield: true,
        read_ahead_kb: READ_AHEAD_KB,
        cache_mb: 256,
        dircache: None,
        passphrase_file: None,
        metrics: None,
    };
    for opt in raw
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.is_empty())
    {
        let (key, val) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        let num = |v: Option<&str>| -> anyhow::Result<u64> {
            v.ok_or_else(|| anyhow::anyhow!("option {key} needs a value"))?
                .parse()
                .with_context(|| format!("option {key} needs a number"))
        };
        match key {
            "allow_other" => o.allow_other = true,
            "ro" => o.read_only = true,
            "rw" => o.read_only = false,
            "sync" => o.sync = true,
            "async" => o.sync = false,
            "dirsync" => o.dirsync = true,
            "async_commit" => o.async_commit = true,
            "noasync_commit" => o.async_commit = false,
            "passthrough" => o.data_path = DataPath::Passthrough,
            "nopassthrough" => o.data_path = DataPath::Daemon,
            "transport" => o.transport = transport(val)?,
            "nonempty" => o.nonempty = true,
            "dev" => o.dev = true,
            "nodev" => o.dev = false,
            "suid" => o.suid = true,
            "nosuid" => o.suid = false,
            "exec" => o.exec = true,
            "noexec" => o.exec = false,
            "symfollow" => o.symfollow = true,
            "nosymfollow" => o.symfollow = false,
            "noatime" => o.atime.mode = AtimeMode::Never,
            // `atime`, `norelatime` and `nostrictatime` undo another
            // choice; the kernel's default is then relatime.
            "relatime" | "atime" | "norelatime" | "nostrictatime" => {
                o.atime.mode = AtimeMode::Relative;
            }
            "strictatime" => o.atime.mode = AtimeMode::Always,
            "nodiratime" => o.atime.no_dirs = true,
            "diratime" => o.atime.no_dirs = false,
            "commit_ms" => {
                let ms = num(val)?;
                o.commit_ms = Some(ms);
                if !(1..=10_000).contains(&ms) {
                    bail!("commit_ms must be 1..=10000");
                }
            }
            "meta_timeout" => {
                o.meta_timeout = num(val)?;
                if !(1..=3600).contains(&o.meta_timeout) {
                    bail!("meta_timeout must be 1..=3600 (seconds)");
                }
            }
            "data_timeout" => {
                o.data_timeout = num(val)?;
                if !(1..=3600).contains(&o.data_timeout) {
                    bail!("data_timeout must be 1..=3600 (seconds)");
                }
            }
            "cache_size" => {
                o.cache_size = size_mib(val.unwrap_or_default())
                    .context("option cache_size needs a size: 500M, 20G, 1T, or MiB")?;
            }
            "cache_mb" => {
                o.cache_mb = num(val)?;
                if !(1..=1 << 20).contains(&o.cache_mb) {
                    bail!("cache_mb must be 1..=1048576");
                }
            }
            "threads" => {
                o.threads = num(val)? as usize;
                if !(1..=64).contains(&o.threads) {
                    bail!("threads must be 1..=64");
                }
            }
            "read_ahead_kb" => {
                o.read_ahead_kb = num(val)?
                    .try_into()
                    .ok()
                    .filter(|kb| *kb <= 1 << 20)
                    .ok_or_else(|| anyhow::anyhow!("read_ahead_kb must be 0..=1048576"))?;
            }
            "uring_yield" => {
                o.uring_yield = match val {
                    Some("0") => false,
                    Some("1") => true,
                    _ => bail!("option uring_yield needs 0 or 1"),
                }
            }
            "dircache" => {
                o.dircache = match val {
                    Some("0") => Some(false),
                    Some("1") => Some(true),
                    _ => bail!("option dircache needs 0 or 1 (dircache=0 turns it off)"),
                }
            }
            "metrics" => {
                o.metrics = Some(val.and_then(|v| v.parse().ok()).ok_or_else(|| {
                    anyhow::anyhow!(
                        "option metrics needs ADDRESS:PORT (e.g. metrics=127.0.0.1:9567)"
                    )
                })?)
            }
            "passphrase_file" => match val {
                Some(f) if !f.is_empty() => o.passphrase_file = Some(PathBuf::from(f)),
                _ => bail!("option passphrase_file needs a file name (passphrase_file=FILE)"),
            },
            "mand" => bail!("option mand: mandatory locks are not supported by Linux (since 5.15)"),
            "iversion" => bail!("option iversion: safs keeps no inode version counter"),
            k if k.ends_with("context") => {
                bail!(
                    "option {k}: safs has no SELinux labelling of its own (use the default policy)"
                )
            }
            // lazytime: safs keeps timestamp updates in memory until the
            // next group commit anyway (at most commit_ms later).
            "lazytime" | "nolazytime" | "nomand" | "noiversion" | "silent" | "loud" => {}
            // For fstab and mount(8) themselves; nothing for safs to do.
            "defaults"
            | "auto"
            | "noauto"
            | "user"
            | "nouser"
            | "users"
            | "owner"
            | "group"
            | "_netdev"
            | "nofail"
            | "default_permissions" => {}
            k if k.starts_with("x-") || k.starts_with("comment=") => {}
            k => bail!("unknown mount option '{k}' (see `safs mount --help`)"),
        }
    }
    Ok(o)
}

/// The value of `-o transport=` (or of `SAFS_TRANSPORT`, its default:
/// e.g. to run a test suite over each transport).
fn transport(val: Option<&str>) -> anyhow::Result<Transport> {
    Ok(match val {
        Some("auto") => Transport::Auto,
        Some("uring") => Transport::Uring,
        Some("dev") => Transport::Dev,
        _ => bail!("option transport takes auto, uring or dev (transport=uring)"),
    })
}

fn check_mountpoint(volume: &Path, mnt: &Path, nonempty: bool) -> anyhow::Result<()> {
    let meta = match std::fs::metadata(mnt) {
        // A FUSE mount whose daemon is gone: ENOTCONN, or ECONNABORTED
        // while the kernel is still aborting the connection, or ECANCELED
        // while it is still cancelling the dead daemon's io_uring queues.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED)
            ) =>
        {
            clear_dead_mount(volume, mnt)?;
            std::fs::metadata(mnt)
        }
        other => other,
    }
    .with_context(|| format!("mountpoint {} does not exist", mnt.display()))?;
    if !meta.is_dir() {
        bail!("mountpoint {} is not a directory", mnt.display());
    }
    if !nonempty && std::fs::read_dir(mnt)?.next().is_some() {
        bail!(
            "mountpoint {} is not empty (use -o nonempty to mount over it)",
            mnt.display()
        );
    }
    if !Path::new("/dev/fuse").exists() {
        bail!("/dev/fuse is missing: load the fuse module (modprobe fuse) or install fuse3");
    }
    Ok(())
}

/// `mnt` answers ENOTCONN (or ECONNABORTED): a FUSE mount whose daemon is gone (killed, or
/// crashed). If it was this volume's — whose lock the caller just took, so
/// no daemon serves it — detach it, so that mounting again after a crash
/// just works; anyone else's dead mount is theirs to remove.
fn clear_dead_mount(volume: &Path, mnt: &Path) -> anyhow::Result<()> {
    let abs = std::path::absolute(mnt)?;
    let table = safs::mountinfo::read().context("cannot read the mount table")?;
    let Some(dead) = safs::mountinfo::mounted_at(&table, &abs) else {
        bail!(
            "mountpoint {} cannot be reached (transport endpoint is not connected)",
            mnt.display()
        );
    };
    if dead.fstype != "fuse.safs" || dead.source != volume {
        bail!(
            "mountpoint {} is a dead {} mount of {} (its daemon has stopped): unmount it first (umount {})",
            mnt.display(),
            dead.fstype,
            dead.source.display(),
            mnt.display()
        );
    }
    nix::mount::umount2(&abs, nix::mount::MntFlags::MNT_DETACH).with_context(|| {
        format!(
            "cannot unmount the dead mount of this volume at {}",
            mnt.display()
        )
    })?;
    eprintln!(
        "safs: {} was a dead mount of this volume (its daemon had stopped); unmounted it",
        mnt.display()
    );
    Ok(())
}

pub fn run(a: MountArgs) -> anyhow::Result<()> {
    let opts = parse_options(&a.options)?;
    let file = match (&a.passphrase_file, &opts.passphrase_file) {
        (Some(_), Some(_)) => {
            bail!("give the passphrase file once: --passphrase-file or -o passphrase_file=")
        }
        (flag, option) => flag.as_deref().or(option.as_deref()),
    };
    let volume = std::fs::canonicalize(&a.volume)
        .with_context(|| format!("volume {} does not exist", a.volume.display()))?;
    if !Layout::new(&volume).is_volume() {
        bail!(
            "{} is not a safs volume (create one with `safs format`)",
            volume.display()
        );
    }
    // "Already mounted" before any passphrase prompt. Looking at the lock
    // writes nothing; taking it (below) writes the lock file.
    if VolumeLock::is_held(&volume) {
        check_free(&volume)?;
    }
    // The daemon child has its key from this process (see spawn_daemon).
    let master = if a.daemon_child {
        None
    } else {
        unlock(&volume, &opts, file)?
    };
    // Fail fast, in the caller, when another daemon serves the volume (and
    // wait here if that daemon was just unmounted and is finishing).
    check_free(&volume)?;
    check_mountpoint(&volume, &a.mountpoint, opts.nonempty)?;
    let mountpoint = std::fs::canonicalize(&a.mountpoint)?;
    if a.foreground || a.daemon_child {
        serve(&volume, &mountpoint, &opts, a.daemon_child, master)
    } else {
        spawn_daemon(&volume, &mountpoint, &a.options, master.as_ref())
    }
}

/// The volume directory's lock as a mount holds it: shared on volumes
/// several daemons serve (their engine keeps them apart), else exclusive.
fn lock_volume(layout: &Layout) -> Result<VolumeLock, volume::VolumeError> {
    if safs::control::is_shared(&layout.root) {
        VolumeLock::acquire_shared(layout)
    } else {
        VolumeLock::acquire(layout)
    }
}

/// Fails, saying who holds it, when the volume's lock is held (waiting
/// first if its holder is a daemon finishing after an unmount).
fn check_free(volume: &Path) -> anyhow::Result<()> {
    drop(lock_volume(&Layout::new(volume)).map_err(|e| match e {
        volume::VolumeError::Busy(who) => {
            anyhow::anyhow!("volume {} is {who}", volume.display())
        }
        e => e.into(),
    })?);
    Ok(())
}

/// The master key of an encrypted volume (`None` for a plain one), asked
/// of its passphrase. Reads only: a wrong passphrase changes nothing.
fn unlock(
    volume: &Path,
    o: &MountOpts,
    file: Option<&Path>,
) -> anyhow::Result<Option<Zeroizing<[u8; 32]>>> {
    let (store, sb) = volume::open_read_only(volume)
        .with_context(|| format!("cannot open volume {}", volume.display()))?;
    if !sb.is_encrypted() {
        if let Some(f) = file {
            bail!(
                "volume {} is not encrypted: it takes no passphrase (drop the passphrase file {})",
                volume.display(),
                f.display()
            );
        }
        return Ok(None);
    }
    if o.data_path == DataPath::Passthrough {
        bail!(
            "encrypted volumes cannot use passthrough: the kernel would read the sealed \
             blocks as they lie on disk; mount {} without -o passthrough (contents then \
             go through the daemon)",
            volume.display()
        );
    }
    passphrase::unlock(store.as_ref(), &sb, file, volume).map(Some)
}

/// The daemon child's master key: the 32 bytes its parent wrote on its
/// stdin. Read unbuffered, so that no copy stays in stdin's buffer.
fn key_from_parent() -> anyhow::Result<Zeroizing<[u8; 32]>> {
    use std::os::fd::AsFd;
    let mut pipe = std::fs::File::from(std::io::stdin().as_fd().try_clone_to_owned()?);
    let mut key = Zeroizing::new([0u8; 32]);
    pipe.read_exact(key.as_mut())
        .context("the volume key did not arrive from the mounting process")?;
    Ok(key)
}

/// Starts the daemon child, hands it the master key of an encrypted
/// volume, and waits for its verdict.
fn spawn_daemon(
    volume: &Path,
    mountpoint: &Path,
    options: &[String],
    master: Option<&Zeroizing<[u8; 32]>>,
) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the safs executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount")
        .arg(volume)
        .arg(mountpoint)
        .arg("--daemon-child");
    for o in options {
        cmd.arg("-o").arg(o);
    }
    let mut child = cmd
        .stdin(if master.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start the safs daemon")?;
    if let Some(key) = master {
        let mut pipe = child.stdin.take().expect("piped");
        // 32 bytes fit in the pipe's buffer. A child that failed before
        // reading them says why on stderr, read below.
        let _ = pipe.write_all(key.as_ref());
    }
    let stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    for line in BufReader::new(stdout).lines() {
        if line.unwrap_or_default().trim() == READY {
            return Ok(());
        }
    }
    let mut msg = String::new();
    let _ = stderr.read_to_string(&mut msg);
    let status = child.wait()?;
    let msg = msg.trim();
    if msg.is_empty() {
        bail!("safs daemon exited ({status}) before the mount was live");
    }
    bail!("{msg}");
}

fn init_logging(to_file: Option<&Path>) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SAFS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    let res = match to_file.and_then(|p| super::logfile::LogFile::open(p).ok()) {
        Some(f) => builder
            .with_ansi(false)
            .log_internal_errors(false)
            .with_writer(f)
            .try_init(),
        None => builder.with_writer(std::io::stderr).try_init(),
    };
    let _ = res;
}

/// Mounts and serves until unmounted or signalled.
fn serve(
    volume: &Path,
    mountpoint: &Path,
    o: &MountOpts,
    daemon_child: bool,
    master: Option<Zeroizing<[u8; 32]>>,
) -> anyhow::Result<()> {
    let layout = Layout::new(volume);
    if daemon_child {
        // Detach from the caller's session so its terminal signals do not
        // reach the daemon.
        let _ = nix::unistd::setsid();
        init_logging(Some(&layout.log()));
    } else {
        init_logging(None);
    }
    let mut lock = lock_volume(&layout)?;
    let (engine, sb) = volume::open_store(volume)?;
    engine.set_outage_wait(std::time::Duration::from_secs(o.meta_timeout));
    // A database shared between machines: join the daemons serving the
    // volume (refused while fsck holds it); an engine that is not shared
    // has the directory lock alone.
    engine
        .join(&safs::meta::Session::of_this_process(
            mountpoint.display().to_string(),
        ))
        .map_err(|e| anyhow::anyhow!("cannot mount {}: {e}", volume.display()))?;
    let master = match master {
        None if daemon_child && sb.is_encrypted() => Some(key_from_parent()?),
        m => m,
    };
    let keys = master.map(|m| volume::keys_for(&m, &sb));
    let fs = Fs::mount(
        volume,
        engine,
        sb,
        Options {
            commit_interval: std::time::Duration::from_millis(o.commit_ms.unwrap_or(
                if safs::control::is_shared(volume) {
                    2
                } else {
                    5
                },
            )),
            sync: o.sync,
            dirsync: o.dirsync,
            async_commit: o.async_commit,
            atime: o.atime,
            read_only: o.read_only,
            cache_bytes: (o.cache_mb as usize) << 20,
            dircache: o.dircache,
            keys,
            data_timeout: std::time::Duration::from_secs(o.data_timeout),
            data_cache_bytes: o.cache_size,
            ..Options::default()
        },
    )
    .context("cannot open the volume")?;
    let fs = Arc::new(fs);

    let stats = Arc::new(safs::fuse::stats::Stats::default());
    // Before the control socket: a failure here leaves nothing behind.
    if let Some(addr) = o.metrics {
        safs::metrics::serve(addr, Arc::clone(&fs), Arc::clone(&stats))
            .with_context(|| format!("cannot serve metrics on {addr}"))?;
    }
    let control = safs::control::serve(volume, mountpoint, Arc::clone(&fs), Arc::clone(&stats))
        .context("cannot open the control socket")?;
    let mut session = Session::mount(Arc::clone(&fs), mountpoint, &o.session(volume), stats)
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot mount {} on {}: {e}",
                volume.display(),
                mountpoint.display()
            )
        })?;

    let mut unmounter = session
        .unmounter()
        .expect("a new session has its unmounter");
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ])?;
    let sig_handle = signals.handle();
    let fs_sig = Arc::clone(&fs);
    std::thread::Builder::new()
        .name("safs-signals".into())
        .spawn(move || {
            let mut signals = signals.forever();
            if let Some(sig) = signals.next() {
                tracing::info!(signal = sig, "signal received: unmounting");
                if let Err(e) = unmounter.unmount() {
                    tracing::error!(error = %e, "unmount on signal failed");
                }
            }
            // A second signal while the final commit keeps failing: give up.
            if let Some(sig) = signals.next() {
                tracing::warn!(
                    signal = sig,
                    "second signal: giving up on changes that cannot be committed"
                );
                fs_sig.abandon_final_commit();
            }
        })?;

    lock.set_mounted();
    tracing::info!(volume = %volume.display(), mountpoint = %mountpoint.display(), "mounted");
    // Ready once the kernel's INIT is answered: a mount whose INIT is
    // refused (a transport or data path the kernel lacks) fails the command.
    let log = layout.log();
    let said_ready = std::sync::atomic::AtomicBool::new(false);
    let res = session.run(|| {
        if daemon_child {
            println!("{READY}");
            said_ready.store(true, std::sync::atomic::Ordering::Relaxed);
            // From here on nobody reads our pipes: send everything to the log.
            if let Ok(f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
            {
                let _ = nix::unistd::dup2_stdout(&f);
                let _ = nix::unistd::dup2_stderr(&f);
            }
        }
    });
    sig_handle.close();
    // `destroy` committed the last batch; make sure even if it was not sent.
    let close = fs.close();
    control.remove();
    let res = res
        .context("FUSE session failed")
        .and(close.context("final metadata commit failed"));
    match &res {
        Ok(()) => tracing::info!("unmounted"),
        Err(e) => tracing::error!("unmounted: {e:#}"),
    }
    // A refused INIT never said READY: the caller still reads our stderr
    // and prints why. After READY the log has the error; the caller's
    // report of it would go to the log too (our stderr) after the lock is
    // free.
    if daemon_child && said_ready.load(std::sync::atomic::Ordering::Relaxed) {
        if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
            let _ = nix::unistd::dup2_stderr(&null);
        }
    }
    // The daemon's last act on the volume: once the lock is free, a new
    // mount or anyone comparing the volume's files finds it finished (the
    // "unmounted" line came after it, and a test saw the log change).
    drop(lock);
    res
}

/// `mount -o remount,...`: the kernel's flags of a live mount (read-only,
/// set-id, exec, atime rules), and the daemon's atime rules with them.
/// mount(8) passes the mount's whole option list with the changes.
pub fn remount(mountpoint: &Path, options: &[String]) -> anyhow::Result<()> {
    let o = parse_options(
        &options
            .iter()
            .flat_map(|s| s.split(','))
            // mount(8) adds the options the kernel shows for the mount:
            // FUSE's own are fixed at mount time.
            .filter(|s| {
                *s != "remount"
                    && ![
                        "user_id=",
                        "group_id=",
                        "rootmode=",
                        "max_read=",
                        "blksize=",
                        "fd=",
                    ]
                    .iter()
                    .any(|p| s.starts_with(p))
            })
            .map(str::to_string)
            .collect::<Vec<_>>(),
    )?;
    set_mount_flags(mountpoint, o.session(mountpoint).mount_flags(), false)
        .with_context(|| format!("cannot set the mount flags of {}", mountpoint.display()))?;
    let volume = std::fs::canonicalize(mountpoint)
        .ok()
        .and_then(|m| safs::core::volume::volume_of_mount(&m))
        .ok_or_else(|| anyhow::anyhow!("{} is not a safs mount", mountpoint.display()))?;
    let mode = match o.atime.mode {
        AtimeMode::Never => "noatime",
        AtimeMode::Relative => "relatime",
        AtimeMode::Always => "strictatime",
    };
    let dirs = if o.atime.no_dirs {
        "nodiratime"
    } else {
        "diratime"
    };
    let mountpoint = std::fs::canonicalize(mountpoint)?;
    safs::control::request_at(
        &safs::control::socket_path_at(&volume, &mountpoint),
        &format!("atime {mode} {dirs}"),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_units_and_mib_by_default() {
        assert_eq!(size_mib("500").unwrap(), 500 << 20);
        assert_eq!(size_mib("500M").unwrap(), 500 << 20);
        assert_eq!(size_mib("20g").unwrap(), 20 << 30);
        assert_eq!(size_mib("1T").unwrap(), 1 << 40);
        assert_eq!(size_mib("64K").unwrap(), 64 << 10);
        assert_eq!(size_mib("0").unwrap(), 0);
        for bad in ["", "M", "12Q", "-1G", "1.5G", "99999999999T"] {
            assert!(size_mib(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn queue_threads_yield_unless_told_not_to() {
        let opts = |o: &str| parse_options(&[o.to_string()]);
        assert!(opts("allow_other").unwrap().uring_yield);
        assert!(opts("uring_yield=1").unwrap().uring_yield);
        assert!(!opts("uring_yield=0").unwrap().uring_yield);
        for bad in ["uring_yield", "uring_yield=2", "uring_yield=yes"] {
            let Err(e) = opts(bad) else {
                panic!("{bad} was taken");
            };
            let e = e.to_string();
            assert!(e.contains("uring_yield needs 0 or 1"), "{bad}: {e}");
        }
    }
}
