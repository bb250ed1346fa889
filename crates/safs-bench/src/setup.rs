//! `--setup`: the comparison set made in one go — a safs volume and mount,
//! an ext4 and an xfs loop image, a tmpfs — and torn down afterwards.
//!
//! Everything lives under `<workdir>/safs-bench-setup.<pid>/`:
//!
//! ```text
//! safs-disk.img  sparse ext4 image  safs-disk/  holds the safs volume (vol/)
//!                                   safs/       the safs mountpoint
//! ext4.img    sparse image       ext4/   mounted from a loop device
//! xfs.img     sparse image       xfs/    mounted from a loop device
//!                                tmpfs/  tmpfs, size-limited
//! ```
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

use super::config::{Sizes, TargetSpec};
use super::target::{SafsMount, mount_safs, unmount_with_retry, wait_unlocked};

/// An external program the run needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    MkfsExt4,
    MkfsXfs,
    Dbench,
}

impl Tool {
    fn program(self) -> &'static str {
        match self {
            Tool::MkfsExt4 => "mkfs.ext4",
            Tool::MkfsXfs => "mkfs.xfs",
            Tool::Dbench => "dbench",
        }
    }

    /// The Debian package that provides it.
    fn package(self) -> &'static str {
        match self {
            Tool::MkfsExt4 => "e2fsprogs",
            Tool::MkfsXfs => "xfsprogs",
            Tool::Dbench => "dbench",
        }
    }
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
}

enum Mounted {
    Kernel(PathBuf),
    Safs(SafsMount),
}

/// The set-up filesystems; dropping it tears them down.
pub struct Setup {
    root: PathBuf,
    /// In mount order; unmounted in reverse.
    mounts: Vec<Mounted>,
    loops: Vec<String>,
    targets: Vec<TargetSpec>,
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
fn loop_mount(s: &mut Setup, env: &Env<'_>, fs: &str, name: &str) -> anyhow::Result<PathBuf> {
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
        .and_then(|f| f.set_len(env.sizes.image_bytes))
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

impl Setup {
    pub fn create(env: &Env<'_>, stop: &AtomicBool) -> anyhow::Result<Setup> {
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
        };
        let check = || -> anyhow::Result<()> {
            if stop.load(Ordering::Relaxed) {
                bail!("interrupted during setup");
            }
            Ok(())
        };

        // safs, on an ext4 image of its own as fresh as the ext4 target's:
        // the backing files' filesystem is part of what safs costs, and a
        // long-used host filesystem (slow inode allocation after heavy
        // churn) would be measured instead of safs.
        let disk = loop_mount(&mut s, env, "ext4", "safs-disk")?;
        let vol = disk.join("vol");
        let mnt = root.join("safs");
        std::fs::create_dir_all(&mnt)?;
        run_cmd(Command::new(env.safs_exe).arg("format").arg(&vol))?;
        let m = SafsMount {
            volume: std::fs::canonicalize(&vol)?,
            mountpoint: std::fs::canonicalize(&mnt)?,
            options: env.safs_options.to_vec(),
        };
        mount_safs(env.safs_exe, &m)?;
        s.mounts.push(Mounted::Safs(m));
        s.targets.push(TargetSpec {
            label: "safs".into(),
            dir: mnt,
        });
        check()?;

        // ext4 and xfs on loop devices
        for fs in ["ext4", "xfs"] {
            let mnt = loop_mount(&mut s, env, fs, fs)?;
            s.targets.push(TargetSpec {
                label: fs.into(),
                dir: mnt,
            });
            check()?;
        }

        // tmpfs
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
        s.targets.push(TargetSpec {
            label: "tmpfs".into(),
            dir: mnt,
        });
        check()?;
        Ok(s)
    }

    /// safs, ext4, xfs, tmpfs — in that order.
    pub fn targets(&self) -> Vec<TargetSpec> {
        self.targets.clone()
    }

    fn teardown(&mut self) {
        for m in self.mounts.drain(..).rev() {
            let (mnt, vol) = match &m {
                Mounted::Kernel(p) => (p.clone(), None),
                Mounted::Safs(s) => (s.mountpoint.clone(), Some(s.volume.clone())),
            };
            if let Err(e) = unmount_with_retry(&mnt, Duration::from_secs(5)) {
                eprintln!("safs bench: {e}; detaching it lazily");
                let _ = nix::mount::umount2(&mnt, nix::mount::MntFlags::MNT_DETACH);
            }
            if let Some(v) = vol
                && let Err(e) = wait_unlocked(&v, Duration::from_secs(120))
            {
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
}
