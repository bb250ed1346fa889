//! A FUSE session serving one volume on one mountpoint: the kernel mount,
//! its flags, the request threads, and unmounting. The command line asks
//! for "serve this `Fs` on this mountpoint with these options"; what fuser
//! and mount(2) need is decided here.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fuser::{Config, MountOption, SessionACL};
use nix::mount::MsFlags;

use super::stats::Stats;
use super::{DataPath, SafsFuse};
use crate::core::{Atime, AtimeMode, Fs};

/// How a mount looks to the kernel and to the programs using it.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// The name the mount table shows as the mount's source.
    pub fsname: String,
    /// Users other than the mounter may use it (`allow_other`).
    pub allow_other: bool,
    pub read_only: bool,
    /// Honour device nodes and set-id bits.
    pub dev: bool,
    pub suid: bool,
    pub exec: bool,
    pub symfollow: bool,
    /// Synchronous writes, and directory changes (MS_SYNCHRONOUS,
    /// MS_DIRSYNC): the kernel's side of `sync` and `dirsync`.
    pub sync: bool,
    pub dirsync: bool,
    /// The atime rules, for the mount's flags (the daemon applies them).
    pub atime: Atime,
    /// Request threads.
    pub threads: usize,
    pub data_path: DataPath,
}

impl SessionOptions {
    /// The per-mount flags (what `findmnt` shows), all of them: a remount
    /// replaces the set.
    pub fn mount_flags(&self) -> MsFlags {
        let mut f = MsFlags::empty();
        f.set(MsFlags::MS_RDONLY, self.read_only);
        f.set(MsFlags::MS_NODEV, !self.dev);
        f.set(MsFlags::MS_NOSUID, !self.suid);
        f.set(MsFlags::MS_NOEXEC, !self.exec);
        if !self.symfollow {
            f |= MsFlags::from_bits_retain(libc::MS_NOSYMFOLLOW);
        }
        f |= match self.atime.mode {
            AtimeMode::Never => MsFlags::MS_NOATIME,
            AtimeMode::Relative => MsFlags::MS_RELATIME,
            AtimeMode::Always => MsFlags::MS_STRICTATIME,
        };
        f.set(MsFlags::MS_NODIRATIME, self.atime.no_dirs);
        f
    }

    fn fuser_config(&self) -> Config {
        let mut mount_options = vec![
            MountOption::FSName(self.fsname.clone()),
            // fuser's direct mount(2) ignores Subtype; the kernel takes it
            // as an option.
            MountOption::CUSTOM("subtype=safs".into()),
            // The kernel checks permissions (mode bits and ACLs) itself: no
            // ACCESS round trips, and the same rules as any local filesystem.
            MountOption::DefaultPermissions,
            if self.read_only {
                MountOption::RO
            } else {
                MountOption::RW
            },
        ];
        if self.dev {
            mount_options.push(MountOption::Dev);
        }
        if self.suid {
            mount_options.push(MountOption::Suid);
        }
        if !self.exec {
            mount_options.push(MountOption::NoExec);
        }
        if self.sync {
            // The kernel then writes data synchronously too, and asks for
            // an FSYNC after each write.
            mount_options.push(MountOption::Sync);
        }
        if self.dirsync {
            mount_options.push(MountOption::DirSync);
        }
        let mut config = Config::default();
        config.mount_options = mount_options;
        config.acl = if self.allow_other {
            SessionACL::All
        } else {
            SessionACL::Owner
        };
        config.n_threads = Some(self.threads);
        config.clone_fd = true;
        config
    }
}

/// A mounted, not yet serving session.
pub struct Session {
    inner: fuser::Session<SafsFuse>,
    mountpoint: PathBuf,
}

/// Ends a session from another thread (a signal handler).
pub struct Unmounter(fuser::SessionUnmounter);

impl Unmounter {
    pub fn unmount(&mut self) -> std::io::Result<()> {
        self.0.unmount()
    }
}

impl Session {
    /// Mounts `fs` on `mountpoint` with `o`. The mount is live when this
    /// returns; requests are served once [`Session::run`] is called.
    pub fn mount(
        fs: Arc<Fs>,
        mountpoint: &Path,
        o: &SessionOptions,
        stats: Arc<Stats>,
    ) -> std::io::Result<Session> {
        let adapter = SafsFuse::new(fs, o.data_path, stats);
        let notifier = adapter.notifier_slot();
        let inner = fuser::Session::new(adapter, mountpoint, &o.fuser_config())?;
        let _ = notifier.set(inner.notifier());
        // Per-mount flags fuser has no options for (relatime, strictatime,
        // nodiratime, nosymfollow): set them all with one bind remount.
        set_mount_flags(mountpoint, o.mount_flags(), true)?;
        Ok(Session {
            inner,
            mountpoint: mountpoint.to_path_buf(),
        })
    }

    pub fn unmounter(&mut self) -> Unmounter {
        Unmounter(self.inner.unmount_callable())
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Serves requests until the filesystem is unmounted.
    pub fn run(self) -> std::io::Result<()> {
        self.inner.run()
    }
}

/// Sets the per-mount flags of the mount at `mountpoint` (all of them).
/// `bind`: only the mount's flags (MS_BIND), not the superblock's.
pub fn set_mount_flags(mountpoint: &Path, flags: MsFlags, bind: bool) -> std::io::Result<()> {
    let mut f = MsFlags::MS_REMOUNT | flags;
    if bind {
        f |= MsFlags::MS_BIND;
    }
    nix::mount::mount(None::<&str>, mountpoint, None::<&str>, f, None::<&str>)
        .map_err(std::io::Error::from)
}
