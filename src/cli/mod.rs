//! The `safs` command line: flags, messages a person can act on, exit codes.

mod attach;
mod bench;
mod dump;
mod format;
mod fsck;
mod info;
mod logfile;
mod man;
mod migrate;
mod mount;
mod passphrase;
mod passwd;
mod quota;
mod stats;

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "safs",
    version,
    about = "safs: a FUSE filesystem built for metadata speed (xattrs live with the inode)"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create a new volume in an empty (or new) directory.
    Format(format::FormatArgs),
    /// Make a local directory for an existing volume whose metadata is in
    /// PostgreSQL and whose contents are in an object store, on a further
    /// node: then `safs mount` it there.
    Attach(attach::AttachArgs),
    /// Mount a volume; returns once the mount is live (daemon in background).
    Mount(mount::MountArgs),
    /// Print what a volume or a mounted safs is (and, with --stats, its
    /// request counts).
    Info(info::InfoArgs),
    /// Change the passphrase of an unmounted encrypted volume (its data
    /// stays as it is: only the wrapping of its key changes).
    Passwd(passwd::PasswdArgs),
    /// Check an unmounted volume's every invariant (exit 0 clean, 1
    /// repaired, 4 errors left, 8 operational error).
    Fsck(fsck::FsckArgs),
    /// Make every change on a mounted safs durable (what sync(1) cannot do
    /// for FUSE filesystems).
    Sync(SyncArgs),
    /// A live view of a mounted safs: requests per second and their mean
    /// time per operation, engine reads and commits, caches, memory.
    Stats(stats::StatsArgs),
    /// Measure safs beside other filesystems: the tables T1–T13 of
    /// docs/benchmarks.md, with FUSE requests per operation (see --setup).
    Bench(bench::BenchArgs),
    /// Convert an unmounted volume's metadata to the schema this safs
    /// writes (PostgreSQL volumes made by an earlier safs).
    Upgrade(UpgradeArgs),
    /// Move an unmounted volume's metadata to another engine in place
    /// (LMDB to PostgreSQL and back), contents untouched; resumable.
    Migrate(migrate::MigrateArgs),
    /// Write a volume's whole metadata (one snapshot, also of a mounted
    /// one) as JSON lines: a backup with the contents, or something to read.
    Dump(dump::DumpArgs),
    /// Restore metadata `safs dump` wrote into a new volume directory, or
    /// (--replace) over a volume's damaged metadata.
    Load(dump::LoadArgs),
    /// Directory quotas: set, read, remove and list the `safs.quota.*`
    /// limits of directories on a mounted safs, with their usage.
    Quota(quota::QuotaArgs),
    /// Write the manual pages into a directory (scripts/run.sh installs them).
    #[command(hide = true)]
    Man(man::ManArgs),
}

#[derive(clap::Args, Debug)]
pub struct UpgradeArgs {
    /// The volume directory.
    pub volume: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct SyncArgs {
    /// The mountpoint (or volume directory) of a mounted safs.
    pub path: PathBuf,
}

/// Runs the command and returns its exit code; an error is printed by
/// `main` and turns into exit 1.
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    if matches!(
        cli.command,
        Command::Info(_)
            | Command::Fsck(_)
            | Command::Format(_)
            | Command::Attach(_)
            | Command::Sync(_)
            | Command::Passwd(_)
            | Command::Upgrade(_)
            | Command::Migrate(_)
            | Command::Dump(_)
            | Command::Load(_)
            | Command::Stats(_)
            | Command::Quota(_)
    ) {
        safs::process::default_sigpipe();
    }
    if let Command::Fsck(a) = cli.command {
        return Ok(fsck::run(a));
    }
    run_plain(cli.command).map(|()| 0)
}

fn run_plain(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Fsck(_) => unreachable!("handled by run"),
        Command::Format(a) => format::run(a),
        Command::Attach(a) => attach::run(a),
        Command::Mount(a) => mount::run(a),
        Command::Info(a) => info::run(a),
        Command::Passwd(a) => passwd::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Man(a) => man::run(a),
        Command::Stats(a) => stats::run(a),
        Command::Quota(a) => quota::run(a),
        Command::Sync(a) => {
            let (vol, mountpoint) = info::resolve(&a.path)?;
            let sock = info::daemon_socket(&vol, mountpoint.as_deref())?;
            safs::control::request_at(&sock, "sync")?;
            Ok(())
        }
        Command::Upgrade(a) => upgrade(&a.volume),
        Command::Migrate(a) => migrate::run(a),
        Command::Dump(a) => dump::run_dump(a),
        Command::Load(a) => dump::run_load(a),
    }
}

/// `mount.fuse.safs <volume> <mountpoint> [-o opts]`, as mount(8) calls it
/// for `mount -t fuse.safs` and fstab entries of type `fuse.safs` (and as
/// `mount.fuse3` calls `safs <volume> <mountpoint> -o opts` for the
/// `safs#<volume>` form).
pub fn run_mount_helper(args: Vec<String>) -> anyhow::Result<()> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut it = args.into_iter().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => options.push(
                it.next()
                    .ok_or_else(|| anyhow::anyhow!("-o needs an argument"))?,
            ),
            // mount(8) passes these; none changes what safs does.
            "-n" | "-s" | "-v" | "-f" | "-r" | "-w" => {
                if a == "-r" {
                    options.push("ro".into());
                }
            }
            s if s.starts_with("-o") => options.push(s[2..].to_string()),
            s if s.starts_with('-') => anyhow::bail!("unknown flag {s}"),
            _ => positional.push(a),
        }
    }
    let [volume, mountpoint]: [String; 2] = positional.try_into().map_err(|_| {
        anyhow::anyhow!("usage: mount.fuse.safs <volume> <mountpoint> [-o options]")
    })?;
    // mount(8) leaves out options that are mount(2)'s defaults (`dev`,
    // `suid`, `exec`), also from the current ones it passes on a remount:
    // through it, as with every FUSE mount helper (libfuse's mount.fuse),
    // device nodes and set-id bits are honoured unless `nodev`/`nosuid`
    // say otherwise. (`safs mount` itself defaults to nodev,nosuid.)
    options.insert(0, "dev,suid".to_string());
    let remounting = options
        .iter()
        .flat_map(|o| o.split(','))
        .any(|o| o == "remount");
    if remounting {
        return mount::remount(Path::new(&mountpoint), &options);
    }
    mount::run(mount::MountArgs {
        volume: PathBuf::from(volume),
        mountpoint: PathBuf::from(mountpoint),
        foreground: false,
        options,
        passphrase_file: None,
        daemon_child: false,
    })
}

/// `safs upgrade`: the volume's metadata to this build's schema, with the
/// volume's lock held (no daemon or fsck on this host meanwhile; the
/// engine refuses while one serves it from elsewhere).
fn upgrade(volume: &Path) -> anyhow::Result<()> {
    use safs::core::volume::{Layout, VolumeLock};
    let layout = Layout::new(volume);
    if !layout.is_volume() {
        anyhow::bail!("{} is not a safs volume", volume.display());
    }
    let _lock = VolumeLock::acquire(&layout).map_err(|e| match e {
        safs::core::volume::VolumeError::Busy(who) => {
            anyhow::anyhow!("volume {} is {who}; unmount it first", volume.display())
        }
        e => e.into(),
    })?;
    match safs::meta::upgrade(&layout.meta())
        .map_err(|e| anyhow::anyhow!("cannot upgrade {}: {e}", volume.display()))?
    {
        None => println!("{}: nothing to upgrade", volume.display()),
        Some((from, to)) if from == to => {
            println!("{}: schema version {to} already", volume.display())
        }
        Some((from, to)) => println!(
            "{}: schema version {from} upgraded to {to}",
            volume.display()
        ),
    }
    Ok(())
}
