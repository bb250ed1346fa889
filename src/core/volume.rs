//! The volume directory: layout, `format`, opening, and the one-daemon lock.
//!
//! ```text
//! <volume>/meta/     the metadata engine (LMDB: data.mdb, lock.mdb)
//! <volume>/data/xx/  backing files of regular files, fanned out by inode
//! <volume>/lock      flock()ed by the daemon serving the volume; holds its pid
//! <volume>/safs.log  the daemon's log when it runs in the background
//! ```
//! Everything is created 0700/0600: file contents and xattrs are readable
//! only through the mount, where permissions are enforced.

use std::fs::{self, File, OpenOptions};
use std::io::{Seek, Write as _};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use thiserror::Error;

use crate::format::inode::{Inode, S_IFDIR, Timestamp};
use crate::format::keys;
use crate::format::superblock::{Counters, Superblock};
use crate::format::xattrs::XattrSet;
use crate::format::{FORMAT_VERSION, FormatError};
use crate::meta::{self, EngineKind, MetaError, MetaRead, MetaStore};

pub const DEFAULT_INLINE_BYTES: u32 = 320;
pub const MAX_INLINE_BYTES: u32 = 16_384;
pub const ROOT_INO: u64 = 1;
/// Feature bits this build understands (none yet).
pub const KNOWN_FEATURES: u64 = 0;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum VolumeError {
    #[error("{0} is not empty (use --force to format it anyway)")]
    NotEmpty(PathBuf),
    #[error("{0} already holds a safs volume (use --force to replace it)")]
    AlreadyFormatted(PathBuf),
    #[error("inline xattr budget {0} is out of range (0..={MAX_INLINE_BYTES} bytes)")]
    BadBudget(u32),
    #[error("{0} is not a safs volume (no metadata store in it)")]
    NotAVolume(PathBuf),
    /// The cause is the error's source: shown once, after the path.
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("volume metadata: {0}")]
    Meta(#[from] MetaError),
    #[error("volume superblock is corrupt: {0}")]
    CorruptSuperblock(FormatError),
    #[error("volume has no superblock (not a safs volume, or formatting was interrupted)")]
    NoSuperblock,
    #[error("volume counters record is missing")]
    NoCounters,
    #[error("volume counters record is corrupt: {0}")]
    CorruptCounters(FormatError),
    #[error(
        "volume format version {found} is newer than this safs understands ({FORMAT_VERSION}); upgrade safs"
    )]
    NewerFormat { found: u32 },
    #[error("volume uses features this safs does not know ({0:#x}); upgrade safs")]
    UnknownFeatures(u64),
    /// Another process holds the volume's lock: says who and where.
    #[error("{0}")]
    Busy(String),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> VolumeError + '_ {
    move |source| VolumeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub struct Layout {
    pub root: PathBuf,
}

impl Layout {
    pub fn new(root: &Path) -> Self {
        Layout {
            root: root.to_path_buf(),
        }
    }
    pub fn meta(&self) -> PathBuf {
        self.root.join("meta")
    }
    pub fn data(&self) -> PathBuf {
        self.root.join("data")
    }
    pub fn lock(&self) -> PathBuf {
        self.root.join("lock")
    }
    pub fn log(&self) -> PathBuf {
        self.root.join("safs.log")
    }
    pub fn is_volume(&self) -> bool {
        EngineKind::detect(&self.meta()).is_some()
    }
}

pub struct FormatOptions {
    pub inline_bytes: u32,
    pub force: bool,
    pub uid: u32,
    pub gid: u32,
}

/// Creates a volume in `dir`. On failure nothing is left behind that was
/// not there before.
pub fn format(dir: &Path, opts: &FormatOptions) -> Result<Superblock, VolumeError> {
    if opts.inline_bytes > MAX_INLINE_BYTES {
        return Err(VolumeError::BadBudget(opts.inline_bytes));
    }
    let layout = Layout::new(dir);
    let created_dir = !dir.exists();
    if created_dir {
        fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .map_err(io_err(dir))?;
    } else {
        let meta = fs::metadata(dir).map_err(io_err(dir))?;
        if !meta.is_dir() {
            return Err(VolumeError::Io {
                path: dir.to_path_buf(),
                source: std::io::Error::from_raw_os_error(libc::ENOTDIR),
            });
        }
        let non_empty = fs::read_dir(dir).map_err(io_err(dir))?.next().is_some();
        if non_empty && !opts.force {
            return Err(if layout.is_volume() {
                VolumeError::AlreadyFormatted(dir.to_path_buf())
            } else {
                VolumeError::NotEmpty(dir.to_path_buf())
            });
        }
        if non_empty {
            // --force: refuse to clobber a mounted volume.
            let _lock = VolumeLock::acquire(&layout)?;
            for sub in [layout.meta(), layout.data()] {
                if sub.exists() {
                    fs::remove_dir_all(&sub).map_err(io_err(&sub))?;
                }
            }
            // The old volume's log and leftovers: the new one starts clean.
            for f in [
                layout.log(),
                layout.root.join("reserve"),
                layout.root.join("control.sock"),
            ] {
                match fs::remove_file(&f) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(VolumeError::Io { path: f, source: e });
                    }
                    _ => {}
                }
            }
        }
    }
    let result = write_new_volume(&layout, opts);
    if result.is_err() {
        let _ = fs::remove_dir_all(layout.meta());
        let _ = fs::remove_dir_all(layout.data());
        let _ = fs::remove_file(layout.lock());
        if created_dir {
            let _ = fs::remove_dir(dir);
        }
    }
    result
}

fn write_new_volume(layout: &Layout, opts: &FormatOptions) -> Result<Superblock, VolumeError> {
    let data = layout.data();
    let mut b = fs::DirBuilder::new();
    b.mode(0o700);
    b.create(&data).map_err(io_err(&data))?;
    for i in 0..256 {
        let sub = data.join(format!("{i:02x}"));
        b.create(&sub).map_err(io_err(&sub))?;
    }
    let meta = layout.meta();
    b.create(&meta).map_err(io_err(&meta))?;
    let store = meta::create(&meta, EngineKind::Lmdb)?;
    let (sb, records) = initial_records(opts);
    store.commit(&records)?;
    for f in ["data.mdb", "lock.mdb"] {
        let p = meta.join(f);
        if p.exists() {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).map_err(io_err(&p))?;
        }
    }
    Ok(sb)
}

/// The records of a new, empty volume: superblock, counters, root directory.
pub fn initial_records(opts: &FormatOptions) -> (Superblock, Vec<crate::meta::Write>) {
    let now = Timestamp::now();
    let sb = Superblock {
        format_version: FORMAT_VERSION,
        uuid: *uuid::Uuid::new_v4().as_bytes(),
        inline_bytes: opts.inline_bytes,
        features: 0,
        created_ns: now.as_nanos() as i64,
    };
    let root = Inode {
        mode: S_IFDIR | 0o755,
        uid: opts.uid,
        gid: opts.gid,
        nlink: 2,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        generation: 1,
        parent: ROOT_INO,
        next_cookie: crate::core::FIRST_COOKIE,
        inline: XattrSet::new(),
        ..Default::default()
    };
    let counters = Counters {
        next_ino: ROOT_INO + 1,
        inodes: 1,
    };
    let rk = keys::inode(ROOT_INO);
    let records = vec![
        (keys::SUPERBLOCK.to_vec(), Some(sb.encode())),
        (keys::COUNTERS.to_vec(), Some(counters.encode())),
        (rk.to_vec(), Some(root.encode(&rk))),
    ];
    (sb, records)
}

/// Reads and checks the superblock.
pub fn read_superblock(store: &dyn MetaStore) -> Result<Superblock, VolumeError> {
    let rec = store
        .get(keys::SUPERBLOCK)?
        .ok_or(VolumeError::NoSuperblock)?;
    let sb = Superblock::decode(&rec).map_err(VolumeError::CorruptSuperblock)?;
    if sb.format_version > FORMAT_VERSION {
        return Err(VolumeError::NewerFormat {
            found: sb.format_version,
        });
    }
    if sb.features & !KNOWN_FEATURES != 0 {
        return Err(VolumeError::UnknownFeatures(sb.features & !KNOWN_FEATURES));
    }
    Ok(sb)
}

/// The volume's counters record (next inode number, live inodes): the one
/// place that reads it, for the daemon, `safs info` and `safs fsck`.
pub fn read_counters(store: &dyn MetaRead) -> Result<Counters, VolumeError> {
    let rec = store.get(keys::COUNTERS)?.ok_or(VolumeError::NoCounters)?;
    Counters::decode(&rec).map_err(VolumeError::CorruptCounters)
}

/// Opens a volume's metadata engine after checking it is one.
pub fn open_store(dir: &Path) -> Result<(Arc<dyn MetaStore>, Superblock), VolumeError> {
    let layout = Layout::new(dir);
    if !dir.is_dir() {
        return Err(VolumeError::Io {
            path: dir.to_path_buf(),
            source: std::io::Error::from_raw_os_error(libc::ENOENT),
        });
    }
    if !layout.is_volume() {
        return Err(VolumeError::NotAVolume(dir.to_path_buf()));
    }
    let store = meta::open(&layout.meta())?;
    let sb = read_superblock(store.as_ref())?;
    Ok((store, sb))
}

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
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io_err(&path))?;
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
                    let passing = holder.pid.is_empty() && waited < HOLDER_SETTLING;
                    let stopping =
                        holder.is_stopping(&layout.root) && waited < STOPPING_DAEMON_WAIT;
                    if !passing && !stopping {
                        return Err(VolumeError::Busy(holder.describe(&layout.root)));
                    }
                    // Quiet unless it takes long: `umount; mount` is routine.
                    if stopping && !told && waited >= QUIET_WAIT {
                        eprintln!(
                            "safs: waiting for the unmounted daemon (pid {}) to finish its last commit",
                            holder.pid
                        );
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
        Ok(VolumeLock { file })
    }

    /// Records that the mount is live (see the type's comment).
    pub fn set_mounted(&mut self) {
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
        let Ok(file) = File::open(Layout::new(dir).lock()) else {
            return false;
        };
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock).is_err()
    }
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
        let _ = self.file.set_len(0);
    }
}
