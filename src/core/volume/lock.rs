//! The one-daemon lock of a volume, and where a volume is mounted.

use std::fs::{self, File, OpenOptions};
use std::io::{Seek, Write as _};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::{Layout, VolumeError, io_err};

/// The exclusive lock held by the one daemon serving a volume (or by fsck).
/// Released by the kernel when the process exits, however it exits.
///
/// The lock file holds the holder's pid and, once its mount is live, a line
/// `mounted`. A holder that says `mounted` while the volume no longer appears
/// in the mount table has been unmounted and is committing its last batch:
/// `acquire` waits for it rather than fail, so that `umount` followed at once
/// by `safs mount` or `safs fsck` works.
pub struct VolumeLock {
    /// Unlocked when dropped (and by the kernel when the process exits).
    file: nix::fcntl::Flock<File>,
    /// Held shared ([`VolumeLock::acquire_shared`]): the file is not ours.
    shared: bool,
}

/// How long `acquire` waits for an unmounted daemon to finish and exit.
pub const STOPPING_DAEMON_WAIT: std::time::Duration = std::time::Duration::from_secs(60);
/// How long a wait for a stopping daemon stays silent.
const QUIET_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
/// How long a holder that has not written its pid (or has just cleared it)
/// is given before the lock counts as busy.
const HOLDER_SETTLING: std::time::Duration = std::time::Duration::from_secs(5);

impl VolumeLock {
    pub fn acquire(layout: &Layout) -> Result<Self, VolumeError> {
        let path = layout.lock();
        let mut file = open_lock_file(&path)?;
        let start = std::time::Instant::now();
        let mut told = false;
        let mut file = loop {
            match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(locked) => break locked,
                Err((f, nix::errno::Errno::EWOULDBLOCK)) => {
                    let holder = Holder::read(layout);
                    let waited = start.elapsed();
                    // An empty lock file: its holder is between taking the
                    // lock and writing its pid, or between clearing it and
                    // exiting. Either way it is a matter of moments.
                    // Daemons sharing a volume write no pid: with no mount of
                    // it left here they are finishing after an unmount.
                    let shared = safs_control::is_shared(&layout.root);
                    let passing = holder.pid.is_empty() && waited < HOLDER_SETTLING && !shared;
                    let stopping = (holder.is_stopping(&layout.root)
                        || (shared && holder.pid.is_empty() && !is_mounted(&layout.root)))
                        && waited < STOPPING_DAEMON_WAIT;
                    if !passing && !stopping {
                        return Err(VolumeError::Busy(holder.describe(&layout.root)));
                    }
                    // Quiet unless it takes long: `umount; mount` is routine.
                    if stopping && !told && waited >= QUIET_WAIT {
                        if holder.pid.is_empty() {
                            eprintln!(
                                "safs: waiting for the unmounted daemons to finish their last commits"
                            );
                        } else {
                            eprintln!(
                                "safs: waiting for the unmounted daemon (pid {}) to finish its last commit",
                                holder.pid
                            );
                        }
                        told = true;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    file = f;
                }
                Err((_, e)) => {
                    return Err(VolumeError::Io {
                        path,
                        source: std::io::Error::from(e),
                    });
                }
            }
        };
        file.set_len(0).map_err(io_err(&path))?;
        file.rewind().map_err(io_err(&path))?;
        let _ = writeln!(file, "{}", std::process::id());
        Ok(VolumeLock {
            file,
            shared: false,
        })
    }

    /// The lock of a volume several daemons serve at once (its metadata in
    /// PostgreSQL, which keeps them apart): held shared by each daemon on
    /// this host, so that what needs the volume alone (fsck, passwd,
    /// format) is refused while any serves it. The file is left as it is.
    pub fn acquire_shared(layout: &Layout) -> Result<Self, VolumeError> {
        let path = layout.lock();
        let file = open_lock_file(&path)?;
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock) {
            Ok(file) => Ok(VolumeLock { file, shared: true }),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(VolumeError::Busy(
                Holder::read(layout).describe(&layout.root),
            )),
            Err((_, e)) => Err(VolumeError::Io {
                path,
                source: std::io::Error::from(e),
            }),
        }
    }

    /// Records that the mount is live (see the type's comment).
    pub fn set_mounted(&mut self) {
        if self.shared {
            return;
        }
        let _ = self.file.seek(std::io::SeekFrom::End(0));
        let _ = writeln!(self.file, "mounted");
    }

    /// The pid the holder of the lock of the volume at `dir` wrote (it may
    /// be stale or empty when nobody holds the lock).
    pub fn holder_pid(dir: &Path) -> String {
        Holder::read(&Layout::new(dir)).pid
    }

    /// Whether some process holds the lock of the volume at `dir`.
    pub fn is_held(dir: &Path) -> bool {
        safs_control::volume_in_use(dir)
    }
}

/// The lock file, created (0600) if missing, its contents kept.
fn open_lock_file(path: &Path) -> Result<File, VolumeError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(io_err(path))
}

/// What the lock file says about its holder.
struct Holder {
    pid: String,
    mounted: bool,
}

impl Holder {
    fn read(layout: &Layout) -> Holder {
        let text = fs::read_to_string(layout.lock()).unwrap_or_default();
        let mut lines = text.lines();
        Holder {
            pid: lines.next().unwrap_or("").trim().to_string(),
            mounted: lines.any(|l| l.trim() == "mounted"),
        }
    }

    /// A daemon that had mounted the volume, and whose mount is gone.
    fn is_stopping(&self, dir: &Path) -> bool {
        self.mounted && !is_mounted(dir)
    }

    /// Who holds the lock, for a "busy" message: the daemon's pid and where
    /// the volume is mounted.
    fn describe(&self, dir: &Path) -> String {
        if self.pid.is_empty() && safs_control::is_shared(dir) {
            return match mountpoint_of(dir) {
                Some(m) => format!(
                    "mounted on {} (and maybe elsewhere: `safs info` lists the daemons)",
                    m.display()
                ),
                None => "in use by safs daemons or fsck (`safs info` lists them)".into(),
            };
        }
        let pid = if self.pid.is_empty() {
            "of unknown pid"
        } else {
            self.pid.as_str()
        };
        match mountpoint_of(dir) {
            Some(m) => format!("already mounted on {} (daemon pid {pid})", m.display()),
            None if self.mounted => format!("already mounted (daemon pid {pid})"),
            None => format!("in use by process {pid} (a mount starting, or safs fsck)"),
        }
    }
}

/// The volume of the safs mount at `mnt` (canonical), if it is one.
pub fn volume_of_mount(mnt: &Path) -> Option<PathBuf> {
    let table = crate::mountinfo::read().ok()?;
    crate::mountinfo::mounted_at(&table, mnt)
        .filter(|m| m.fstype == "fuse.safs")
        .map(|m| m.source.clone())
}

/// Where the volume at `dir` is mounted, if it is (in this namespace).
pub fn mountpoint_of(dir: &Path) -> Option<PathBuf> {
    let dir = fs::canonicalize(dir).ok()?;
    let table = crate::mountinfo::read().ok()?;
    table
        .iter()
        .find(|m| m.fstype.starts_with("fuse") && m.source == dir)
        .map(|m| m.mountpoint.clone())
}

/// Whether the volume at `dir` appears as the source of a FUSE mount in this
/// mount namespace (the daemon names the mount after the volume's path).
pub fn is_mounted(dir: &Path) -> bool {
    let Ok(dir) = fs::canonicalize(dir) else {
        return false;
    };
    let Ok(table) = crate::mountinfo::read() else {
        // Without a mount table we cannot tell: assume it is still mounted.
        return true;
    };
    table
        .iter()
        .any(|m| m.fstype.starts_with("fuse") && m.source == dir)
}

impl Drop for VolumeLock {
    fn drop(&mut self) {
        if !self.shared {
            let _ = self.file.set_len(0);
        }
    }
}
