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

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use thiserror::Error;

use crate::format::inode::{Inode, S_IFDIR, Timestamp};
use crate::format::keys;
use crate::format::superblock::{Counters, SessionCounters, Superblock};
use crate::format::xattrs::XattrSet;
use crate::format::{FORMAT_VERSION, FormatError};
use crate::meta::{self, EngineKind, MetaError, MetaRead, MetaStore};

pub mod dump;
mod lock;
pub mod migrate;
mod unlock;
pub use lock::{STOPPING_DAEMON_WAIT, VolumeLock, is_mounted, mountpoint_of, volume_of_mount};
pub use unlock::{
    Encryption, block_layout, change_passphrase, check_keys, key_record, keys_for, unlock,
};

/// The inline xattr budget of a new volume. Room for what Samba keeps on
/// every file it creates (DOSATTRIB, NTACL, a POSIX ACL: 514–660 bytes,
/// `docs/samba-and-swift.md`) and for a 1 KiB value, so that none of it
/// costs a second read; small enough that the largest inode record, even
/// encrypted, stays in one LMDB leaf node (the test below). ZFS's legacy
/// 512-byte dnode leaves 320 bytes, which Samba's set outgrows; its large
/// dnodes (`dnodesize=auto`) are the same answer as this one.
pub const DEFAULT_INLINE_BYTES: u32 = 1536;
pub const MAX_INLINE_BYTES: u32 = 16_384;
pub const ROOT_INO: u64 = 1;
/// Feature bits this build understands.
pub const KNOWN_FEATURES: u64 = crate::format::superblock::FEATURE_ENCRYPTED
    | crate::format::superblock::FEATURE_PAGE_BLOCKS
    | crate::format::superblock::FEATURE_SPILL_PAGES
    | crate::format::superblock::FEATURE_OBJECT_STORE
    | crate::format::superblock::FEATURE_DIR_STATS
    | crate::format::superblock::FEATURE_DIR_STATS_FULL
    | crate::format::superblock::FEATURE_SESSION_SHARES;

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
    /// Not a `#[source]`: the text is in the message already, and error
    /// chains (`safs: {e:#}`) would print it twice.
    #[error("volume metadata: {0}")]
    Meta(MetaError),
    #[error("volume superblock is corrupt: {0}")]
    CorruptSuperblock(FormatError),
    #[error("volume has no superblock (not a safs volume, or formatting was interrupted)")]
    NoSuperblock,
    #[error("volume counters record is missing")]
    NoCounters,
    #[error("volume counters record is corrupt: {0}")]
    CorruptCounters(FormatError),
    #[error(
        "session counters record {} is corrupt: {error}",
        crate::core::error::describe_key(key)
    )]
    CorruptSession { key: Vec<u8>, error: FormatError },
    #[error(
        "volume format version {found} is newer than this safs understands ({FORMAT_VERSION}); upgrade safs"
    )]
    NewerFormat { found: u32 },
    #[error("volume uses features this safs does not know ({0:#x}); upgrade safs")]
    UnknownFeatures(u64),
    #[error("wrong passphrase")]
    WrongPassphrase,
    #[error("the volume is not encrypted")]
    NotEncrypted,
    #[error("the volume is encrypted but has no key record: it cannot be unlocked")]
    NoKeyRecord,
    #[error("volume keys: {0}")]
    Crypto(crate::core::crypto::CryptoError),
    /// Another process holds the volume's lock: says who and where.
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    Store(crate::objstore::StoreError),
    #[error(
        "{0} already holds objects (another volume?): give an empty prefix, \
         or use --force to format over them (they are not deleted)"
    )]
    StoreInUse(String),
    #[error(
        "the volume in that database keeps its file contents in its own volume directory, \
         not in an object store: a node can only serve it from that directory (format \
         volumes for many nodes with --data s3://...)"
    )]
    NotAttachable,
    /// A migration that cannot go on (see `migrate`).
    #[error("{0}")]
    Migrate(String),
}

impl From<MetaError> for VolumeError {
    fn from(e: MetaError) -> Self {
        VolumeError::Meta(e)
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> VolumeError + '_ {
    move |source| VolumeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The inode a backing file's name in directory `dir` of `data/` stands
/// for: 16 hex digits whose low byte is `dir`'s number; `None` for a name
/// safs never makes.
pub fn backing_ino(name: &std::ffi::OsStr, dir: u8) -> Option<u64> {
    let name = name.to_str().filter(|n| n.len() == 16)?;
    u64::from_str_radix(name, 16)
        .ok()
        .filter(|ino| ino & 0xff == u64::from(dir))
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
    /// The 256 directories of `data/` (`00` … `ff`), each with its number:
    /// a backing file lives in the one its inode's low byte names.
    pub fn backing_dirs(&self) -> impl Iterator<Item = (u8, PathBuf)> + use<> {
        let data = self.data();
        (0..=255u8).map(move |i| (i, data.join(format!("{i:02x}"))))
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
    /// Encrypt the volume (names, records, contents) under a passphrase.
    pub encryption: Option<Encryption>,
    /// Where the metadata goes: LMDB in the volume, or a PostgreSQL database.
    pub engine: meta::NewEngine,
    /// Where file contents go: an object store's URL (`s3://BUCKET/PREFIX`),
    /// or `None` for the volume's `data/` directory.
    pub data: Option<String>,
}

/// Creates a volume in `dir`. On failure nothing is left behind that was
/// not there before.
pub fn format(dir: &Path, opts: &FormatOptions) -> Result<Superblock, VolumeError> {
    if opts.inline_bytes > MAX_INLINE_BYTES {
        return Err(VolumeError::BadBudget(opts.inline_bytes));
    }
    let layout = Layout::new(dir);
    let created_dir = make_dir(dir)?;
    if !created_dir {
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
    // The store first: a wrong URL or credentials leave nothing behind.
    let objects = match &opts.data {
        Some(url) => Some(check_data_store(url, opts.force)?),
        None => None,
    };
    make_data_dirs(layout)?;
    let meta = layout.meta();
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&meta)
        .map_err(io_err(&meta))?;
    let mut store = meta::create(&meta, &opts.engine, opts.force)?;
    let (sb, mut records) = initial_records(opts);
    if let Some(enc) = &opts.encryption {
        store = unlock::seal_new_volume(store, &sb, enc, &mut records)?;
    }
    if let Some(objects) = &objects {
        // Names the volume the prefix holds, so that no other is made there.
        let id = uuid::Uuid::from_bytes(sb.uuid).to_string();
        objects
            .put(VOLUME_OBJECT, id.into_bytes())
            .map_err(VolumeError::Store)?;
    }
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

/// Makes `dir` (new or empty) a local directory for the existing volume
/// whose metadata is in the PostgreSQL database `conninfo` names, with its
/// contents in an object store: the connection string and an empty cache,
/// nothing else (every record is read from the database). On failure
/// nothing is left behind. The store's URL, for the caller to show.
pub fn attach(dir: &Path, conninfo: &str) -> Result<String, VolumeError> {
    let layout = Layout::new(dir);
    let created_dir = make_dir(dir)?;
    if !created_dir && fs::read_dir(dir).map_err(io_err(dir))?.next().is_some() {
        return Err(if layout.is_volume() {
            VolumeError::AlreadyFormatted(dir.to_path_buf())
        } else {
            VolumeError::NotEmpty(dir.to_path_buf())
        });
    }
    let result = (|| {
        let mut b = fs::DirBuilder::new();
        b.mode(0o700);
        let meta_dir = layout.meta();
        b.create(&meta_dir).map_err(io_err(&meta_dir))?;
        let conf = meta_dir.join(meta::POSTGRES_CONF);
        fs::write(&conf, format!("{}\n", conninfo.trim())).map_err(io_err(&conf))?;
        let store = meta::open(&meta_dir)?;
        let sb = read_superblock(store.as_ref())?;
        if !sb.has_object_store() {
            return Err(VolumeError::NotAttachable);
        }
        let url = store
            .get(keys::DATA_STORE)?
            .ok_or(VolumeError::NotAttachable)
            .and_then(|rec| {
                crate::format::blocks::decode_store(&rec).map_err(VolumeError::CorruptSuperblock)
            })?;
        // The store must answer from this node too.
        check_data_store(&url, true)?;
        make_data_dirs(&layout)?;
        Ok(url)
    })();
    if result.is_err() {
        let _ = fs::remove_dir_all(layout.meta());
        let _ = fs::remove_dir_all(layout.data());
        if created_dir {
            let _ = fs::remove_dir(dir);
        }
    }
    result
}

/// Creates `dir` (0700) if it does not exist; whether it did not.
fn make_dir(dir: &Path) -> Result<bool, VolumeError> {
    if dir.exists() {
        return Ok(false);
    }
    fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(io_err(dir))?;
    Ok(true)
}

/// `data/` and its 256 fan-out directories.
fn make_data_dirs(layout: &Layout) -> Result<(), VolumeError> {
    let data = layout.data();
    let mut b = fs::DirBuilder::new();
    b.mode(0o700);
    b.create(&data).map_err(io_err(&data))?;
    for i in 0..256 {
        let sub = data.join(format!("{i:02x}"));
        b.create(&sub).map_err(io_err(&sub))?;
    }
    Ok(())
}

/// The object under a volume's prefix that names it (its uuid).
pub(crate) const VOLUME_OBJECT: &str = "volume";

/// Checks that the object store at `url` answers with this process's
/// credentials and (unless `force`) holds nothing under its prefix: no
/// other volume's contents or name.
pub(crate) fn check_data_store(
    url: &str,
    force: bool,
) -> Result<crate::objstore::Store, VolumeError> {
    use crate::objstore::{Limits, Store, StoreConfig};
    let config = StoreConfig::from_env(url).map_err(VolumeError::Store)?;
    let store = Store::new(config, Limits::default()).map_err(VolumeError::Store)?;
    store.check().map_err(VolumeError::Store)?;
    if !force && !store.list("").map_err(VolumeError::Store)?.is_empty() {
        return Err(VolumeError::StoreInUse(url.to_string()));
    }
    Ok(store)
}

/// The records of a new, empty volume: superblock, counters, root directory.
pub fn initial_records(opts: &FormatOptions) -> (Superblock, Vec<crate::meta::Write>) {
    let now = Timestamp::now();
    let sb = Superblock {
        format_version: FORMAT_VERSION,
        uuid: *uuid::Uuid::new_v4().as_bytes(),
        inline_bytes: opts.inline_bytes,
        features: crate::format::superblock::FEATURE_SPILL_PAGES
            | crate::format::superblock::FEATURE_SESSION_SHARES
            | crate::format::superblock::FEATURE_DIR_STATS
            | crate::format::superblock::FEATURE_DIR_STATS_FULL
            | if opts.encryption.is_some() {
                crate::format::superblock::FEATURE_ENCRYPTED
                    | crate::format::superblock::FEATURE_PAGE_BLOCKS
            } else {
                0
            }
            | if opts.data.is_some() {
                crate::format::superblock::FEATURE_OBJECT_STORE
            } else {
                0
            },
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
        stats: Some(crate::format::inode::DirStats {
            rctime: now.sec,
            ..Default::default()
        }),
        ..Default::default()
    };
    let counters = Counters {
        next_ino: ROOT_INO + 1,
        inodes: 1,
    };
    let rk = keys::inode(ROOT_INO);
    let mut records = vec![
        (keys::SUPERBLOCK.to_vec(), Some(sb.encode())),
        (keys::COUNTERS.to_vec(), Some(counters.encode())),
        (rk.to_vec(), Some(root.encode(&rk))),
    ];
    if let Some(url) = &opts.data {
        records.push((
            keys::DATA_STORE.to_vec(),
            Some(crate::format::blocks::encode_store(url)),
        ));
    }
    (sb, records)
}

/// Reads and checks the superblock.
pub fn read_superblock(store: &dyn MetaRead) -> Result<Superblock, VolumeError> {
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

/// Every session's counters record (`R`), by session id; a record that
/// does not decode is an error naming its key.
pub fn read_sessions(
    store: &dyn MetaRead,
) -> Result<std::collections::BTreeMap<u64, SessionCounters>, VolumeError> {
    let (start, end) = keys::prefix_range(keys::P_SESSION);
    let mut found = std::collections::BTreeMap::new();
    for (k, v) in store.scan(&start, &end, usize::MAX)? {
        let id = keys::key_ino(&k).filter(|_| k.len() == 9).ok_or_else(|| {
            VolumeError::CorruptSession {
                key: k.clone(),
                error: crate::format::FormatError::Malformed("session key"),
            }
        })?;
        let c = SessionCounters::decode(&k, &v)
            .map_err(|error| VolumeError::CorruptSession { key: k, error })?;
        found.insert(id, c);
    }
    Ok(found)
}

/// The inodes in use: `N`'s count and every session's share of it.
pub fn inodes_in_use(store: &dyn MetaRead) -> Result<u64, VolumeError> {
    let n = read_counters(store)?.inodes;
    let shares: i64 = read_sessions(store)?.values().map(|s| s.inodes).sum();
    Ok(n.saturating_add_signed(shares))
}

/// Opens a volume's metadata engine after checking it is one.
pub fn open_store(dir: &Path) -> Result<(Arc<dyn MetaStore>, Superblock), VolumeError> {
    let store = meta::open(&checked_layout(dir)?.meta())?;
    let sb = read_superblock(store.as_ref())?;
    Ok((store, sb))
}

/// Opens a volume's metadata engine for reads that write nothing to the
/// volume (see [`meta::open_read_only`]): what a mount reads before it
/// serves the volume, so that a refused mount (a wrong passphrase) leaves
/// every byte of it as it was.
pub fn open_read_only(dir: &Path) -> Result<(Box<dyn MetaRead>, Superblock), VolumeError> {
    let store = meta::open_read_only(&checked_layout(dir)?.meta())?;
    let sb = read_superblock(store.as_ref())?;
    Ok((store, sb))
}

/// The layout of the volume at `dir`, once it is known to be one.
fn checked_layout(dir: &Path) -> Result<Layout, VolumeError> {
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
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::inode::{DirStats, Inode, Quota, S_IFDIR};

    /// The default budget's fullest inode record — the inline area full,
    /// a directory's statistics and quota, sealed as an encrypted volume
    /// seals it — is one LMDB leaf node on 4 KiB pages, not a page of
    /// overflow of its own.
    #[test]
    fn the_default_budget_keeps_an_inode_record_in_a_leaf() {
        let mut inline = XattrSet::new();
        let name = b"user.DOSATTRIB".to_vec();
        let filler = DEFAULT_INLINE_BYTES as usize
            - inline.packed_len()
            - crate::format::xattrs::entry_len(&name, &[]);
        inline.insert(name, vec![0xa5; filler]);
        assert_eq!(inline.packed_len(), DEFAULT_INLINE_BYTES as usize);
        let full = Inode {
            mode: S_IFDIR | 0o755,
            inline,
            stats: Some(DirStats {
                files: 1,
                rfiles: 1,
                rsubdirs: 1,
                rbytes: 1,
                rctime: 1,
                rblocks: 1,
            }),
            quota: Quota {
                max_bytes: 1,
                max_files: 1,
            },
            ..Default::default()
        };
        let key = keys::inode(u64::MAX);
        let sealed = full.encode(&key).len() + crate::core::crypto::SEAL_OVERHEAD;
        assert!(
            meta::lmdb_stays_in_leaf(4096, key.len(), sealed),
            "{sealed}-byte inode record"
        );
    }
}
