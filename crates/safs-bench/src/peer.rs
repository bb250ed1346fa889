//! libfuse's `passthrough_hp` as a `--setup` target: the FUSE floor every
//! safs row is compared with (a pass-through of a directory, with FUSE
//! passthrough for data, over `/dev/fuse` or, with `-o io_uring`, over
//! io_uring). The binary is the user's (`--passthrough-hp PATH`): safs does
//! not ship or build it.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// A running `passthrough_hp` and where it is mounted.
pub struct Peer {
    pub mountpoint: PathBuf,
    child: Child,
}

/// The kernel's switch for FUSE over io_uring.
pub const URING_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether the kernel offers FUSE over io_uring now.
pub fn uring_enabled() -> bool {
    std::fs::read_to_string(URING_PARAM).is_ok_and(|v| v.trim() == "Y")
}

impl Peer {
    /// Starts `exe` over `backing` on `mountpoint` (`uring`: `-o io_uring`),
    /// its output in `log`; returns once the mount is live.
    pub fn start(
        exe: &Path,
        backing: &Path,
        mountpoint: &Path,
        uring: bool,
        log: &Path,
    ) -> anyhow::Result<Peer> {
        if uring && !uring_enabled() {
            bail!("the kernel does not offer FUSE over io_uring ({URING_PARAM} is not Y)");
        }
        let out = std::fs::File::create(log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let mut cmd = Command::new(exe);
        cmd.args(["--foreground", "-o", "allow_other"]);
        if uring {
            cmd.args(["-o", "io_uring"]);
        }
        cmd.arg(backing)
            .arg(mountpoint)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        // It keeps a descriptor open per inode it has seen: T2's tree and
        // T5's largest directory need far more than the default 1024, or
        // than the hard limit (root may raise it up to fs.nr_open).
        let want: u64 = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(1 << 20);
        // SAFETY: setrlimit is async-signal-safe; nothing else runs between
        // fork and exec.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || {
                use nix::sys::resource::{Resource, getrlimit, setrlimit};
                if setrlimit(Resource::RLIMIT_NOFILE, want, want).is_err() {
                    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
                    setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot run {}", exe.display()))?;
        let mut peer = Peer {
            mountpoint: mountpoint.to_path_buf(),
            child,
        };
        let start = Instant::now();
        loop {
            if mounted_at(mountpoint) {
                return Ok(peer);
            }
            if let Some(status) = peer.child.try_wait()? {
                bail!(
                    "{} exited ({status}) before mounting: {}",
                    exe.display(),
                    std::fs::read_to_string(log).unwrap_or_default().trim()
                );
            }
            if start.elapsed() > Duration::from_secs(10) {
                let _ = peer.child.kill();
                bail!(
                    "{} did not mount {} within 10 s",
                    exe.display(),
                    mountpoint.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// After the unmount: the daemon exits on its own; waits for it (and
    /// kills it if it does not).
    pub fn reap(&mut self, patience: Duration) {
        let start = Instant::now();
        while start.elapsed() < patience {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "safs bench: passthrough_hp on {} did not exit after the unmount; killing it",
            self.mountpoint.display()
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn mounted_at(mountpoint: &Path) -> bool {
    safs_control::mountinfo::read()
        .map(|e| safs_control::mountinfo::mounted_at(&e, mountpoint).is_some())
        .unwrap_or(false)
}
