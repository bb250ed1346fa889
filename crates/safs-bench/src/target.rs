//! The directories measured, what is mounted under them, and how a target
//! is made cold.
//!
//! A target is a directory. Its filesystem is looked up in
//! `/proc/self/mountinfo` (longest mountpoint that is a prefix of the
//! canonical path; the last such line wins, as the kernel stacks mounts).
//! A target whose filesystem is `fuse.safs` is a *safs target*: the mount
//! source is the volume directory, whose control socket gives the FUSE
//! request counts, and whose daemon is restarted for cold phases.
//!
//! Cold, per docs/benchmarks.md:
//! - kernel filesystems: `sync`, then `echo 3 > /proc/sys/vm/drop_caches`;
//! - safs: unmount (the daemon commits and exits, its inode cache and
//!   LMDB map go with it), wait for the volume lock to be free, `sync`, drop
//!   caches, mount again, and drop caches once more (the mount's structure
//!   check reads the engine's whole tree) — the honest cold: the next figure
//!   includes reading the metadata engine from disk. If the unmount is refused (the mount is
//!   busy, e.g. someone's shell sits in it), the daemon is asked to
//!   `drop-caches` instead and the run says so.
//! - safs whose contents are in an object store (`safs-s3`): the same,
//!   and the node's cache (the volume's `data/`) emptied while unmounted,
//!   so that contents come from the store;
//! - JuiceFS made by `--setup`: unmount, wait for its daemon to exit, its
//!   cache directory removed, drop caches, mount again;
//! - gocryptfs made by `--setup` (the bench holds its passphrase file):
//!   the same as safs — unmount, wait for its daemon to exit, drop caches,
//!   mount again (scrypt unlock) — so both FUSE daemons start cold. A
//!   gocryptfs mount found as it is gets the kernel filesystems' treatment.

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::config::{Remount, TargetSpec};
use super::record::{DaemonMem, Requests, TargetInfo};

use safs_control::mountinfo::{self, MountEntry};

/// A safs mount the bench can restart.
#[derive(Clone, Debug)]
pub struct SafsMount {
    pub volume: PathBuf,
    pub mountpoint: PathBuf,
    /// `-o` options to mount it again with.
    pub options: Vec<String>,
    /// Environment of `safs mount` (an object store's credentials).
    pub env: Vec<(String, String)>,
    /// Contents in an object store: a cold phase also throws the node's
    /// cache (the volume's `data/`) away.
    pub store: bool,
}

/// A JuiceFS mount the bench can restart.
#[derive(Clone, Debug)]
pub struct JuicefsMount {
    pub meta: String,
    pub mountpoint: PathBuf,
    pub cache_dir: PathBuf,
}

/// A gocryptfs mount the bench can restart.
#[derive(Clone, Debug)]
pub struct GocryptfsMount {
    pub cipherdir: PathBuf,
    pub mountpoint: PathBuf,
    pub passfile: PathBuf,
}

pub struct Target {
    pub label: String,
    /// Canonical path of the directory measured.
    pub dir: PathBuf,
    pub mount: MountEntry,
    pub safs: Option<SafsMount>,
    pub gocryptfs: Option<GocryptfsMount>,
    pub juicefs: Option<JuicefsMount>,
    about: Option<String>,
    /// How cold phases are made cold (for results.json), updated if the
    /// remount ever has to fall back.
    cold: RefCell<String>,
    /// (cold phases prepared, seconds spent preparing them).
    cold_spent: Cell<(u32, f64)>,
}

/// What making a target cold needs from the run.
pub struct ColdEnv<'a> {
    pub is_root: bool,
    pub safs_exe: &'a Path,
}

/// What a safs daemon reports at one moment: cumulative request counts and
/// nanoseconds by opcode, engine operations, and its memory.
pub struct Snapshot {
    pub counts: Requests,
    pub nanos: Requests,
    pub engine: Requests,
    pub mem: DaemonMem,
}

impl Target {
    /// Resolves the spec's directory and recognises safs mounts.
    /// `safs_options` (and the spec's own) are used when a safs target has
    /// to be mounted again.
    pub fn resolve(spec: &TargetSpec, safs_options: &[String]) -> anyhow::Result<Target> {
        let (label, dir) = (spec.label.as_str(), spec.dir.as_path());
        let dir = std::fs::canonicalize(dir)
            .with_context(|| format!("target {label}: {} does not exist", dir.display()))?;
        if !dir.is_dir() {
            bail!("target {label}: {} is not a directory", dir.display());
        }
        let info = std::fs::read_to_string("/proc/self/mountinfo")
            .context("cannot read /proc/self/mountinfo")?;
        let entries = mountinfo::parse(&info);
        let mount = mountinfo::mount_of(&entries, &dir)
            .cloned()
            .with_context(|| format!("target {label}: no mount holds {}", dir.display()))?;
        let safs = (mount.fstype == "fuse.safs").then(|| {
            let mut options = safs_options.to_vec();
            if let Remount::SafsWith(extra) = &spec.remount {
                options.extend(extra.iter().cloned());
            }
            if mount.super_opts.split(',').any(|o| o == "allow_other")
                && !options
                    .iter()
                    .any(|o| o.split(',').any(|x| x == "allow_other"))
            {
                options.push("allow_other".into());
            }
            let env = match &spec.remount {
                Remount::SafsStore { env } => env.clone(),
                _ => Vec::new(),
            };
            SafsMount {
                volume: mount.source.clone(),
                mountpoint: mount.mountpoint.clone(),
                options,
                store: matches!(spec.remount, Remount::SafsStore { .. }),
                env,
            }
        });
        let gocryptfs = match &spec.remount {
            Remount::Gocryptfs {
                cipherdir,
                passfile,
            } if mount.fstype == "fuse.gocryptfs" => Some(GocryptfsMount {
                cipherdir: cipherdir.clone(),
                mountpoint: mount.mountpoint.clone(),
                passfile: passfile.clone(),
            }),
            _ => None,
        };
        let juicefs = match &spec.remount {
            Remount::Juicefs { meta, cache_dir } if mount.fstype == "fuse.juicefs" => {
                Some(JuicefsMount {
                    meta: meta.clone(),
                    mountpoint: mount.mountpoint.clone(),
                    cache_dir: cache_dir.clone(),
                })
            }
            _ => None,
        };
        let cold = if safs.as_ref().is_some_and(|s| s.store) {
            "unmount, node's cache (data/) emptied, sync, drop_caches, mount (daemon restarted), \
             drop_caches"
        } else if safs.is_some() {
            "unmount, sync, drop_caches, mount (daemon restarted), drop_caches"
        } else if juicefs.is_some() {
            "unmount, cache directory emptied, sync, drop_caches, mount (daemon restarted)"
        } else if gocryptfs.is_some() {
            "unmount, sync, drop_caches, mount (daemon restarted)"
        } else if mount.fstype.starts_with("fuse") {
            "sync, drop_caches (its daemon kept running)"
        } else {
            "sync, drop_caches"
        };
        Ok(Target {
            label: label.to_string(),
            dir,
            mount,
            safs,
            gocryptfs,
            juicefs,
            about: spec.about.clone(),
            cold: RefCell::new(cold.to_string()),
            cold_spent: Cell::new((0, 0.0)),
        })
    }

    pub fn info(&self) -> TargetInfo {
        let stats = self
            .safs
            .as_ref()
            .and_then(|s| safs_control::request(&s.volume, "stats").ok().flatten());
        TargetInfo {
            label: self.label.clone(),
            dir: self.dir.display().to_string(),
            fstype: self.mount.fstype.clone(),
            mount_source: self.mount.source.display().to_string(),
            mount_options: self.mount.super_opts.clone(),
            about: self.about.clone(),
            safs_volume: self.safs.as_ref().map(|s| s.volume.display().to_string()),
            inline_bytes: stats.as_ref().map(|r| r.inline_bytes).filter(|b| *b > 0),
            dircache_budget_bytes: stats.as_ref().map(|r| r.dircache_budget_bytes),
            transport: stats.as_ref().map(|r| match &r.uring_queues {
                Some(q) => format!("io_uring, {} queues", q.len()),
                None => "/dev/fuse".into(),
            }),
            cold: self.cold.borrow().clone(),
            cold_count: self.cold_spent.get().0,
            cold_secs: self.cold_spent.get().1,
        }
    }

    /// On a safs target whose contents are in an object store: waits, up
    /// to `limit`, until its daemon has no object deletions queued — the
    /// previous test's removals, which its deleter works through in the
    /// background (a PostgreSQL scan and a store DELETE per freed file).
    /// JuiceFS, the peer on such stores, keeps removed files in its trash
    /// for a day by default and deletes nothing during a run: a test
    /// measured under safs's backlog alone would compare unlike work.
    /// Returns the seconds waited and the deletions still queued.
    pub fn settle_deletions(&self, limit: Duration) -> anyhow::Result<(f64, u64)> {
        let Some(s) = &self.safs else {
            return Ok((0.0, 0));
        };
        let start = Instant::now();
        loop {
            let queued = safs_control::request(&s.volume, "stats")
                .with_context(|| format!("target {}: cannot read its store's figures", self.label))?
                .and_then(|r| r.store)
                .map_or(0, |st| st.deletions_queued);
            let waited = start.elapsed();
            if queued == 0 || waited >= limit {
                return Ok((waited.as_secs_f64(), queued));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The daemon's request counters, for safs targets: requests served
    /// and nanoseconds spent serving them, by opcode; and the engine's
    /// operations (`get`, `scan`, `commit`).
    pub fn requests(&self) -> anyhow::Result<Option<Snapshot>> {
        let Some(s) = &self.safs else { return Ok(None) };
        let reply = safs_control::request(&s.volume, "stats")
            .with_context(|| format!("target {}: cannot read request counts", self.label))?
            .unwrap_or_default();
        let counts = reply.ops.iter().map(|o| (o.op.clone(), o.count)).collect();
        let nanos = reply.ops.into_iter().map(|o| (o.op, o.total_ns)).collect();
        let e = reply.engine;
        let engine = [("get", e.gets), ("scan", e.scans), ("commit", e.commits)]
            .into_iter()
            .map(|(k, n)| (k.to_string(), n))
            .collect();
        let mem = DaemonMem {
            peak_rss_kib: reply.peak_rss_kib,
            rss_anon_kib: reply.rss_anon_kib,
            cache_bytes: reply.cache_bytes,
            cache_budget_bytes: reply.cache_budget_bytes,
        };
        Ok(Some(Snapshot {
            counts,
            nanos,
            engine,
            mem,
        }))
    }

    /// Makes the target cold (see the module comment). Returns a warning
    /// when it had to settle for less than the full procedure.
    pub fn make_cold(&self, env: &ColdEnv<'_>) -> anyhow::Result<Option<String>> {
        let start = Instant::now();
        let res = self.make_cold_inner(env);
        let (n, secs) = self.cold_spent.get();
        self.cold_spent
            .set((n + 1, secs + start.elapsed().as_secs_f64()));
        res
    }

    fn make_cold_inner(&self, env: &ColdEnv<'_>) -> anyhow::Result<Option<String>> {
        if !env.is_root {
            bail!("cold phases need root (to write /proc/sys/vm/drop_caches)");
        }
        let mut warning = None;
        if let Some(s) = &self.safs {
            match unmount_with_retry(&s.mountpoint, Duration::from_secs(3)) {
                Ok(()) => {
                    wait_unlocked(&s.volume, Duration::from_secs(120))?;
                    if s.store {
                        empty_files_under(&s.volume.join("data"))?;
                    }
                    drop_kernel_caches()?;
                    mount_safs(env.safs_exe, s)?;
                    // The mount's structure check read the engine's tree.
                    drop_kernel_caches()?;
                    return Ok(None);
                }
                Err(e) => {
                    safs_control::request(&s.volume, "drop-caches")
                        .with_context(|| format!("target {}: drop-caches", self.label))?;
                    let w = format!(
                        "target {}: could not unmount for a cold phase ({e}); used the daemon's drop-caches instead",
                        self.label
                    );
                    *self.cold.borrow_mut() =
                        "sync, drop_caches, daemon drop-caches (unmount refused)".into();
                    warning = Some(w);
                }
            }
        }
        if let Some(j) = &self.juicefs {
            match unmount_with_retry(&j.mountpoint, Duration::from_secs(3)) {
                Ok(()) => {
                    wait_juicefs_exit(&j.mountpoint, Duration::from_secs(30))?;
                    remove_settled(&j.cache_dir)?;
                    drop_kernel_caches()?;
                    mount_juicefs(j)?;
                    return Ok(None);
                }
                Err(e) => {
                    *self.cold.borrow_mut() = "sync, drop_caches (unmount refused)".into();
                    warning = Some(format!(
                        "target {}: could not unmount for a cold phase ({e}); dropped the kernel's caches only",
                        self.label
                    ));
                }
            }
        }
        if let Some(g) = &self.gocryptfs {
            match unmount_with_retry(&g.mountpoint, Duration::from_secs(3)) {
                Ok(()) => {
                    wait_gocryptfs_exit(&g.cipherdir, Duration::from_secs(30))?;
                    drop_kernel_caches()?;
                    mount_gocryptfs(g)?;
                    return Ok(None);
                }
                Err(e) => {
                    *self.cold.borrow_mut() = "sync, drop_caches (unmount refused)".into();
                    warning = Some(format!(
                        "target {}: could not unmount for a cold phase ({e}); dropped the kernel's caches only",
                        self.label
                    ));
                }
            }
        }
        drop_kernel_caches()?;
        Ok(warning)
    }
}

pub fn drop_kernel_caches() -> anyhow::Result<()> {
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n")
        .context("cannot write /proc/sys/vm/drop_caches")?;
    Ok(())
}

/// `umount(2)`, retrying while the mount is busy (a `release` still in
/// flight, a just-exited child) for up to `patience`.
pub fn unmount_with_retry(mountpoint: &Path, patience: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        match nix::mount::umount(mountpoint) {
            Ok(()) => return Ok(()),
            Err(nix::errno::Errno::EBUSY) if start.elapsed() < patience => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => bail!("cannot unmount {}: {e}", mountpoint.display()),
        }
    }
}

/// Waits until no daemon holds the volume (it has committed and exited).
pub fn wait_unlocked(volume: &Path, patience: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    while safs_control::volume_in_use(volume) {
        if start.elapsed() > patience {
            bail!(
                "the safs daemon of {} did not exit within {:?} of the unmount",
                volume.display(),
                patience
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Removes `dir` and everything in it, trying again for a few seconds
/// while something still writes in it: a JuiceFS daemon's last cache
/// writes can land after its mount is gone (a run failed on "Directory
/// not empty").
fn remove_settled(dir: &Path) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(_) if start.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e).with_context(|| format!("cannot empty {}", dir.display())),
        }
    }
}

/// Removes every regular file under `dir` (two levels: the layout of a
/// volume's `data/`), keeping the directories.
fn empty_files_under(dir: &Path) -> anyhow::Result<()> {
    let cannot = |p: &Path| format!("cannot empty {}", p.display());
    for d in std::fs::read_dir(dir).with_context(|| cannot(dir))? {
        let d = d.with_context(|| cannot(dir))?.path();
        if !d.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&d).with_context(|| cannot(&d))? {
            let f = f.with_context(|| cannot(&d))?.path();
            std::fs::remove_file(&f).with_context(|| cannot(&f))?;
        }
    }
    Ok(())
}

/// `juicefs mount -d META MOUNTPOINT --enable-xattr --cache-dir DIR` (its
/// defaults otherwise), which returns once the mount is live.
pub fn mount_juicefs(j: &JuicefsMount) -> anyhow::Result<()> {
    let out = Command::new("juicefs")
        .args(["mount", "-d", &j.meta])
        .arg(&j.mountpoint)
        .arg("--enable-xattr")
        .arg("--cache-dir")
        .arg(&j.cache_dir)
        .output()
        .context("cannot run juicefs")?;
    if !out.status.success() {
        bail!(
            "juicefs mount {} failed ({}): {}",
            j.mountpoint.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Waits until no JuiceFS process serves `mountpoint` (its command line
/// names it).
pub fn wait_juicefs_exit(mountpoint: &Path, patience: Duration) -> anyhow::Result<()> {
    let want = mountpoint.as_os_str().as_encoded_bytes();
    let serving = || {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                let mut args = cmd.split(|&b| b == 0);
                args.next().is_some_and(|a0| a0.ends_with(b"juicefs")) && args.any(|a| a == want)
            })
    };
    let start = Instant::now();
    while serving() {
        if start.elapsed() > patience {
            bail!(
                "the juicefs daemon of {} did not exit within {patience:?} of the unmount",
                mountpoint.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// `safs mount VOLUME MOUNTPOINT -o …`, which returns once the mount is live.
pub fn mount_safs(safs_exe: &Path, s: &SafsMount) -> anyhow::Result<()> {
    let mut cmd = Command::new(safs_exe);
    cmd.envs(s.env.iter().map(|(k, v)| (k, v)));
    cmd.arg("mount").arg(&s.volume).arg(&s.mountpoint);
    if !s.options.is_empty() {
        cmd.arg("-o").arg(s.options.join(","));
    }
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {}", safs_exe.display()))?;
    if !out.status.success() {
        bail!(
            "safs mount {} {} failed: {}",
            s.volume.display(),
            s.mountpoint.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// `gocryptfs -passfile F CIPHERDIR MOUNTPOINT` (default settings), which
/// returns once the mount is live and its daemon in the background.
pub fn mount_gocryptfs(g: &GocryptfsMount) -> anyhow::Result<()> {
    let out = Command::new("gocryptfs")
        .arg("-q")
        .arg("-passfile")
        .arg(&g.passfile)
        .arg(&g.cipherdir)
        .arg(&g.mountpoint)
        .output()
        .context("cannot run gocryptfs")?;
    if !out.status.success() {
        bail!(
            "gocryptfs {} {} failed ({}): {}",
            g.cipherdir.display(),
            g.mountpoint.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Whether a gocryptfs process serves `cipherdir` (its command line names
/// it): after an unmount its daemon still closes its files in the
/// filesystem underneath, which must not be unmounted or remounted before.
pub fn gocryptfs_running(cipherdir: &Path) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    let want = cipherdir.as_os_str().as_encoded_bytes();
    procs.flatten().any(|p| {
        let Ok(cmd) = std::fs::read(p.path().join("cmdline")) else {
            return false;
        };
        let mut args = cmd.split(|b| *b == 0);
        args.next().is_some_and(|a0| a0.ends_with(b"gocryptfs")) && args.any(|a| a == want)
    })
}

/// Waits until no gocryptfs daemon serves `cipherdir`.
pub fn wait_gocryptfs_exit(cipherdir: &Path, patience: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    while gocryptfs_running(cipherdir) {
        if start.elapsed() > patience {
            bail!(
                "the gocryptfs daemon of {} did not exit within {patience:?} of the unmount",
                cipherdir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}
