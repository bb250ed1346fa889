//! A FUSE session serving one volume on one mountpoint: the kernel mount,
//! its flags, the transport, and unmounting. The command line asks for
//! "serve this `Fs` on this mountpoint with these options"; what the
//! transport and mount(2) need is decided here.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::mount::MsFlags;

use super::stats::Stats;
use super::{DataPath, SafsFuse, Transport, transport};
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
    /// io_uring queue threads yield their CPU to the callers they answer
    /// (`-o uring_yield=`).
    pub uring_yield: bool,
    pub data_path: DataPath,
    /// How requests reach the daemon (`-o transport=`).
    pub transport: Transport,
    /// The kernel's read-ahead for the mount, in KiB (`-o read_ahead_kb=`).
    pub read_ahead_kb: u32,
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

    /// What mount(2) is given: the flags FUSE's mount takes at once (the
    /// atime rules and nosymfollow follow with a bind remount, see
    /// [`Session::mount`]).
    fn transport_options(&self) -> transport::MountOptions {
        let mut flags = MsFlags::empty();
        flags.set(MsFlags::MS_RDONLY, self.read_only);
        flags.set(MsFlags::MS_NODEV, !self.dev);
        flags.set(MsFlags::MS_NOSUID, !self.suid);
        flags.set(MsFlags::MS_NOEXEC, !self.exec);
        // The kernel then writes data synchronously too, and asks for an
        // FSYNC after each write.
        flags.set(MsFlags::MS_SYNCHRONOUS, self.sync);
        flags.set(MsFlags::MS_DIRSYNC, self.dirsync);
        transport::MountOptions {
            fsname: self.fsname.clone(),
            subtype: "safs".into(),
            flags,
            allow_other: self.allow_other,
            // The kernel checks permissions (mode bits and ACLs) itself: no
            // ACCESS round trips, and the same rules as any local filesystem.
            default_permissions: true,
        }
    }
}

/// Ring entries per io_uring queue (one queue per CPU). Each holds a
/// payload buffer of the largest write.
const URING_DEPTH: usize = 8;

/// A mounted, not yet serving session.
pub struct Session {
    adapter: Arc<SafsFuse>,
    conn: transport::Conn,
    unmounter: Option<transport::Unmounter>,
    mountpoint: PathBuf,
    threads: usize,
    uring_yield: bool,
    status: Arc<transport::Status>,
    /// The mount's device (its backing-dev-info is named for it), when
    /// known, and the read-ahead to set on it once INIT is answered.
    dev: Option<(u32, u32)>,
    read_ahead_kb: u32,
}

/// Ends a session from another thread (a signal handler).
pub struct Unmounter(transport::Unmounter);

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
        let status = Arc::clone(&stats.transport);
        let adapter = Arc::new(SafsFuse::new(fs, o.data_path, o.transport, stats));
        let (conn, unmounter) = transport::mount(mountpoint, &o.transport_options())?;
        adapter.set_conn(conn.clone())?;
        // Per-mount flags mount(2) of FUSE takes apart (relatime,
        // strictatime, nodiratime, nosymfollow): all set with one bind
        // remount.
        set_mount_flags(mountpoint, o.mount_flags(), true)?;
        let dev = mount_dev(mountpoint);
        Ok(Session {
            adapter,
            conn,
            unmounter: Some(unmounter),
            mountpoint: mountpoint.to_path_buf(),
            threads: o.threads,
            uring_yield: o.uring_yield,
            status,
            dev,
            read_ahead_kb: o.read_ahead_kb,
        })
    }

    /// The unmounter (once: later calls get `None`).
    pub fn unmounter(&mut self) -> Option<Unmounter> {
        self.unmounter.take().map(Unmounter)
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Which transport serves the session (known once INIT is answered).
    pub fn status(&self) -> Arc<transport::Status> {
        Arc::clone(&self.status)
    }

    /// Serves requests until the filesystem is unmounted; `ready` runs once
    /// the kernel's INIT is answered and the transport it chose serves (not
    /// at all if INIT was refused).
    pub fn run(self, ready: impl FnOnce()) -> std::io::Result<()> {
        let handler: Arc<dyn transport::Handler> = self.adapter.clone();
        let adapter = Arc::clone(&self.adapter);
        let (dev, read_ahead_kb) = (self.dev, self.read_ahead_kb);
        transport::serve(
            &self.conn,
            handler,
            move |req| adapter.init(req),
            move || {
                // After INIT: its reply lowers the read-ahead to what it
                // names, which cannot exceed the kernel's 128 KiB default.
                set_read_ahead(dev, read_ahead_kb);
                ready()
            },
            &transport::ServeOptions {
                threads: self.threads,
                uring_depth: URING_DEPTH,
                uring_yield: self.uring_yield,
                status: self.status,
            },
        )
        .map_err(|e| match self.adapter.refused.get() {
            Some(why) => std::io::Error::other(format!("the mount's INIT was refused: {why}")),
            None => e,
        })
    }
}

/// The device number of the FUSE mount on `mountpoint`, without asking
/// the daemon (which is not serving yet): `AT_STATX_DONT_SYNC` answers
/// from what the kernel has.
fn mount_dev(mountpoint: &Path) -> Option<(u32, u32)> {
    use rustix::fs::{AtFlags, CWD, StatxFlags, statx};
    let flags = AtFlags::STATX_DONT_SYNC | AtFlags::NO_AUTOMOUNT;
    match statx(CWD, mountpoint, flags, StatxFlags::empty()) {
        Ok(stx) => Some((stx.stx_dev_major, stx.stx_dev_minor)),
        Err(e) => {
            tracing::debug!(error = %e, "statx of the mountpoint");
            None
        }
    }
}

/// Sets the mount's read-ahead (`/sys/class/bdi/MAJ:MIN/read_ahead_kb`).
/// The kernel's 128 KiB makes a sequential read the daemon serves (on
/// encrypted volumes, without passthrough, a file still coming from the
/// object store) eight READs per MiB; a few MiB let each READ carry
/// `max_pages` (1 MiB) with more in flight, as network filesystems do
/// (CephFS reads ahead 8 MiB, NFS 15 × rsize). Passthrough reads use the
/// backing file's own. Only root may write it: otherwise the kernel's
/// stays, said in the log.
fn set_read_ahead(dev: Option<(u32, u32)>, kb: u32) {
    let Some((major, minor)) = dev else {
        tracing::info!("the mount's device is unknown: the kernel's read-ahead stays");
        return;
    };
    let path = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    match std::fs::write(&path, format!("{kb}\n")) {
        Ok(()) => tracing::debug!(path, kb, "read-ahead set"),
        Err(e) => tracing::info!(path, error = %e, "cannot set the read-ahead: the kernel's stays"),
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
