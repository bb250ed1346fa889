//! `safs fsck`: verify every invariant of an unmounted volume, and with
//! `repair` fix what can be fixed without guessing.
//!
//! Two passes over the engine in key order: the first decodes every inode
//! record into a compact table; the second checks every other record
//! against it, counting names per inode as it goes; a final sweep compares
//! the counts with the inodes and the backing files with the records.
//!
//! Leftovers of an unclean stop that a mount recovers by design — inodes
//! unlinked while open (`O`), sizes behind their backing files, backing
//! files whose creating batch never committed, a sealed truncate cut short,
//! a file whose never-synced contents the stop lost with its backing
//! file's name — are listed apart from findings: without `repair` they leave the exit
//! code at 0 (as e2fsck treats its orphan list), and `repair` finishes
//! that recovery itself (exit 1).
//!
//! What `repair` does (each is reported):
//! - the recovery of leftovers, as a mount would;
//! - deletes records that fail their checksum, except inodes and the
//!   superblock (an unreadable inode is reported and left alone), and
//!   records that belong to no inode;
//! - re-creates the missing half of a `D`/`C` entry pair, deletes entries
//!   naming a missing inode;
//! - sets link counts, spill sizes, overflow counts and the counters to what
//!   the records say; links named inodes that lost every name into
//!   `/lost+found`;
//! - takes a file's size from its backing file when they disagree (on an
//!   encrypted volume first cutting a torn length to its whole blocks),
//!   and deletes backing files that belong to no inode.
//!
//! Before any of that, opening the store checks the engine's own page
//! structure (`meta::lmdb::verify`); damage there, or an unreadable
//! superblock, ends the check with that one finding: nothing further can be
//! read safely, and nothing of it can be repaired.
//!
//! Encrypted volumes: with the passphrase ([`Access::Full`]) every pass
//! runs as on a plain volume, reading through the volume's keys: a value
//! that does not open, or a name in a key that does not decrypt, is a
//! finding like a checksum failure (never data), repairs write sealed
//! records under encrypted names, sizes come from sealed backing files,
//! and every content block is opened (so every file is read once).
//! Without it ([`Access::StructureOnly`]) only what needs no key is
//! checked (see `structure`) and nothing is repaired.
//!
//! Exit codes follow e2fsck: 0 clean, 1 errors corrected, 4 errors left
//! uncorrected, 8 operational error.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use zeroize::Zeroizing;

use crate::core::crypto::{Keyspace, SealedStore, VolumeKeys};
use crate::core::error::describe_key;
use crate::core::volume::{self, Layout, ROOT_INO, VolumeLock};
use crate::format::dirent::{Dirent, IndexEntry, decode_marker, decode_symlink};
use crate::format::envelope::{Kind, open};
use crate::format::inode::{Inode, S_IFDIR, S_IFMT, Timestamp};
use crate::format::keys;
use crate::format::superblock::{Counters, SessionCounters};
use crate::format::xattrs::XattrSet;
use crate::meta::{MetaError, MetaStore, Write};

/// e2fsck-style exit codes.
pub const EXIT_CLEAN: i32 = 0;
pub const EXIT_REPAIRED: i32 = 1;
pub const EXIT_UNCORRECTED: i32 = 4;
pub const EXIT_OPERATIONAL: i32 = 8;

/// Why a check could not run (exit 8) — as opposed to damage it found,
/// which is a [`Finding`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsckError {
    #[error("volume {} is {who}: fsck checks unmounted volumes only", volume.display())]
    InUse { volume: PathBuf, who: String },
    #[error("wrong passphrase for volume {}", .0.display())]
    WrongPassphrase(PathBuf),
    /// The passphrase could not be had (unreadable file, no terminal...).
    #[error("{0}")]
    Passphrase(String),
    #[error(
        "volume {} is encrypted: repairing it needs its passphrase \
         (give --passphrase-file FILE, set SAFS_PASSPHRASE_FILE, or run on a terminal)",
        .0.display()
    )]
    RepairNeedsPassphrase(PathBuf),
    #[error(transparent)]
    Volume(#[from] volume::VolumeError),
    #[error(transparent)]
    Meta(#[from] MetaError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The volume's object store cannot be checked (no credentials, not
    /// reachable): nothing was checked or repaired.
    #[error(
        "the volume's contents are in an object store, which fsck checks too: {0} \
         (nothing was checked or changed)"
    )]
    Store(#[from] crate::objstore::StoreError),
}

pub type Result<T> = std::result::Result<T, FsckError>;

/// One finding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub what: String,
    pub repaired: bool,
    /// A leftover of an unclean stop that the next mount recovers by
    /// design: not an error, whether or not it was repaired here.
    pub leftover: bool,
}

#[derive(Debug, Default)]
pub struct Report {
    pub findings: Vec<Finding>,
    pub inodes: u64,
    pub entries: u64,
    pub xattr_records: u64,
    /// The check stopped at the first finding: the volume cannot be read
    /// further, and `--repair` cannot help.
    pub unreadable: bool,
    /// An encrypted volume checked without its passphrase: its structure
    /// only, not its records, names or contents.
    pub structure_only: bool,
    /// Directory statistics were added to a volume without them (`Checks::
    /// dir_stats`): for this many directories.
    pub dir_stats_added: Option<u64>,
}

impl Report {
    pub fn exit_code(&self) -> i32 {
        if self.findings.iter().any(|f| !f.repaired && !f.leftover) {
            EXIT_UNCORRECTED
        } else if self.findings.iter().any(|f| f.repaired) {
            EXIT_REPAIRED
        } else {
            EXIT_CLEAN
        }
    }

    /// Leftovers of an unclean stop (recovered, or left to the next mount).
    pub fn leftovers(&self) -> usize {
        self.findings.iter().filter(|f| f.leftover).count()
    }
}

/// Progress callback: (phase, done, total).
pub type Progress<'a> = &'a dyn Fn(&str, u64, u64);

/// Gives the passphrase of an encrypted volume, or says why it cannot.
pub type Passphrase<'a> = &'a dyn Fn() -> std::result::Result<Zeroizing<Vec<u8>>, String>;

/// How much of an encrypted volume fsck may read. A plain volume is always
/// checked in full.
pub enum Access<'a> {
    /// Everything: the passphrase is asked for only if the volume is
    /// encrypted (after it is locked and its key record read).
    Full(Passphrase<'a>),
    /// The structure alone, without the passphrase; never repairs.
    StructureOnly,
}

/// A record value as a pass sees it: opened, or refused by the volume's
/// keys.
type Value = std::result::Result<Vec<u8>, Unsealed>;

/// A sealed value that does not open under the volume's keys.
#[derive(Debug)]
struct Unsealed;

impl std::fmt::Display for Unsealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("it does not open under the volume's keys: changed, moved or torn")
    }
}

/// A `D` or `X` key whose name is shown encrypted (as stored).
fn encrypted_name(key: &[u8]) -> String {
    format!(
        "{}/(a {}-byte encrypted name)",
        describe_key(&key[..9]),
        key.len() - 9
    )
}

/// Decodes an opened value with `f`; either failure as one message.
fn decoded<T, E: std::fmt::Display>(
    v: &Value,
    f: impl FnOnce(&[u8]) -> std::result::Result<T, E>,
) -> std::result::Result<T, String> {
    match v {
        Ok(v) => f(v).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// What pass 1 keeps of each inode.
struct Info {
    inode: Inode,
    /// Names pointing here (`D` entries).
    names: u32,
    /// Subdirectories (for a directory's link count).
    subdirs: u32,
    /// Names of non-directories in this directory (its statistics).
    files: u64,
    /// A non-directory's names: the directory of each (its statistics).
    homes: Vec<u64>,
    /// The directory holding this directory's one name.
    named_in: Option<u64>,
    /// Σ packed sizes of the readable spill pages.
    spill_seen: usize,
    /// A spill page was unreadable (reported, and deleted on repair).
    spill_lost: bool,
    overflow_seen: u32,
    has_symlink: bool,
    orphan_marker: bool,
    writer_marker: bool,
    dirty: bool,
}

struct Checker<'a> {
    /// Reads and commits: sealing and opening values on encrypted volumes.
    store: &'a dyn MetaStore,
    /// The engine itself: scans, whose values the passes open one by one
    /// (a record that does not open must not hide the others).
    raw: &'a dyn MetaStore,
    keys: Option<Arc<VolumeKeys>>,
    /// Where names live in keys (encrypted on encrypted volumes).
    names: Keyspace,
    layout: Layout,
    repair: bool,
    report: Report,
    inodes: BTreeMap<u64, Info>,
    writes: Vec<Write>,
    lost_found: Option<u64>,
    /// Inodes unlinked while open, freed (with `repair`) or left to the
    /// next mount: the counters still count them.
    orphans: u64,
    /// A session's counters record did not read: the counters are
    /// rewritten whole.
    sessions_corrupt: bool,
    /// The volume was not unmounted cleanly: stale sizes and stray backing
    /// files are expected (the next mount reconciles them), not errors.
    unclean: bool,
    /// Contents are in an object store: sizes come from block maps, and
    /// backing files are a cache.
    remote: bool,
    /// That store, on such volumes.
    objects: Option<crate::objstore::Store>,
    /// Read every object and check it against its record's hash.
    data_check: bool,
    /// Directories carry statistics (`FEATURE_DIR_STATS`).
    dir_stats: bool,
    /// They are being added to a volume without them: what the passes
    /// find missing is what they add, not damage.
    adding_dir_stats: bool,
    /// Directories carry recursive change times (`FEATURE_DIR_STATS_FULL`).
    rctime: bool,
}

const PAGE: usize = 4096;

impl Checker<'_> {
    fn find(&mut self, what: String, fixable: bool) {
        let repaired = fixable && self.repair;
        tracing::warn!(repaired, "{what}");
        self.report.findings.push(Finding {
            what,
            repaired,
            leftover: false,
        });
    }

    /// A leftover of an unclean stop that a mount recovers by design;
    /// `repair` recovers it here.
    fn leftover(&mut self, what: String) {
        tracing::info!(repaired = self.repair, "{what}");
        self.report.findings.push(Finding {
            what,
            repaired: self.repair,
            leftover: true,
        });
    }

    /// A finding that is a leftover after an unclean stop and damage after
    /// a clean one.
    fn leftover_or_find(&mut self, what: String) {
        if self.unclean {
            self.leftover(what);
        } else {
            self.find(what, true);
        }
    }

    /// Streams every record with `prefix` in key order.
    fn each(&mut self, prefix: u8, mut f: impl FnMut(&mut Self, Vec<u8>, Value)) -> Result<()> {
        let (mut start, end) = keys::prefix_range(prefix);
        loop {
            let page = self.raw.scan(&start, &end, PAGE)?;
            let n = page.len();
            for (k, v) in page {
                start = k.clone();
                let v = self.open(&k, v);
                f(self, k, v);
            }
            if n < PAGE {
                return Ok(());
            }
            start.push(0);
        }
    }

    /// Opens a value as read from the engine.
    fn open(&self, key: &[u8], value: Vec<u8>) -> Value {
        match &self.keys {
            None => Ok(value),
            Some(k) => k.open_record(key, &value).map_err(|_| Unsealed),
        }
    }

    /// A key as findings show it: names decrypted where they can be.
    fn describe(&self, key: &[u8]) -> String {
        let name = match key.first() {
            _ if !self.names.is_encrypted() || key.len() < 9 => return describe_key(key),
            Some(&keys::P_DIRENT) => self.names.entry_name(key),
            Some(&keys::P_OVERFLOW) => self.names.xattr_name(key),
            _ => return describe_key(key),
        };
        match name {
            Ok(name) => describe_key(&[&key[..9], &name].concat()),
            Err(_) => encrypted_name(key),
        }
    }

    fn delete(&mut self, key: &[u8]) {
        if self.repair {
            self.writes.push((key.to_vec(), None));
        }
    }

    fn put(&mut self, key: &[u8], value: Vec<u8>) {
        if self.repair {
            self.writes.push((key.to_vec(), Some(value)));
        }
    }

    fn flush(&mut self) -> Result<()> {
        if !self.writes.is_empty() {
            self.store.commit(&std::mem::take(&mut self.writes))?;
        }
        Ok(())
    }
}

mod contents;
mod entries;
mod inodes;
mod objects;
mod stats;
mod structure;
mod sweep;
mod xattrs;

/// The report of a check that cannot read past its one finding.
fn unreadable(what: String) -> Report {
    Report {
        findings: vec![Finding {
            what,
            repaired: false,
            leftover: false,
        }],
        unreadable: true,
        ..Report::default()
    }
}

/// What a check does beyond reading the metadata.
#[derive(Clone, Copy, Debug, Default)]
pub struct Checks {
    /// Fix what can be fixed without guessing.
    pub repair: bool,
    /// On a volume whose contents are in an object store: read every
    /// object and check its bytes (else its presence and length only).
    pub data_check: bool,
    /// With `repair`, on a volume without directory statistics or their
    /// change times: count them and keep them from now on
    /// (`FEATURE_DIR_STATS`, `FEATURE_DIR_STATS_FULL`).
    pub dir_stats: bool,
}

/// Checks (and with `repair`, repairs) the unmounted volume at `dir`,
/// reading as much of an encrypted one as `access` allows.
pub fn run(
    dir: &Path,
    access: Access<'_>,
    checks: Checks,
    progress: Progress<'_>,
) -> Result<Report> {
    let repair = checks.repair;
    let layout = Layout::new(dir);
    if !layout.is_volume() {
        return Err(volume::VolumeError::NotAVolume(dir.to_path_buf()).into());
    }
    let _lock = VolumeLock::acquire(&layout).map_err(|e| match e {
        volume::VolumeError::Busy(who) => FsckError::InUse {
            volume: dir.to_path_buf(),
            who,
        },
        e => e.into(),
    })?;
    let (store, sb) = match volume::open_store(dir) {
        Ok(opened) => opened,
        Err(
            e @ (volume::VolumeError::Meta(MetaError::Damaged { .. })
            | volume::VolumeError::CorruptSuperblock(_)),
        ) => return Ok(unreadable(e.to_string())),
        Err(e) => return Err(e.into()),
    };
    // A database shared between machines: no daemon anywhere may serve
    // the volume while it is checked.
    let me = crate::meta::Session::of_this_process("(safs fsck)".into());
    store.claim(&me).map_err(|e| match e {
        MetaError::Claimed(who) => FsckError::InUse {
            volume: dir.to_path_buf(),
            who,
        },
        e => volume::VolumeError::Meta(e).into(),
    })?;
    if !sb.is_encrypted() {
        return check_store(store, None, &layout, &sb, checks, progress);
    }
    let ask = match access {
        Access::StructureOnly if repair => {
            return Err(FsckError::RepairNeedsPassphrase(dir.to_path_buf()));
        }
        Access::StructureOnly => None,
        Access::Full(ask) => Some(ask),
    };
    // Unlocking needs the key record: without it nothing sealed is
    // readable, with or without the passphrase.
    let record = match volume::key_record(store.as_ref(), &sb) {
        Ok(record) => record,
        Err(e @ (volume::VolumeError::NoKeyRecord | volume::VolumeError::Crypto(_))) => {
            return Ok(unreadable(e.to_string()));
        }
        Err(e) => return Err(e.into()),
    };
    let Some(ask) = ask else {
        return structure::check(store.as_ref(), &layout, volume::block_layout(&sb), progress);
    };
    let passphrase = ask().map_err(FsckError::Passphrase)?;
    let master = record.unwrap(&passphrase, &sb.uuid).map_err(|e| match e {
        crate::core::crypto::CryptoError::WrongPassphrase => {
            FsckError::WrongPassphrase(dir.to_path_buf())
        }
        e => volume::VolumeError::Crypto(e).into(),
    })?;
    let keys = volume::keys_for(&master, &sb);
    check_store(store, Some(keys), &layout, &sb, checks, progress)
}

fn check_store(
    raw: Arc<dyn MetaStore>,
    keys: Option<Arc<VolumeKeys>>,
    layout: &Layout,
    sb: &crate::format::superblock::Superblock,
    checks: Checks,
    progress: Progress<'_>,
) -> Result<Report> {
    let repair = checks.repair;
    let budget = sb.inline_bytes;
    // Before anything is read or changed: a store fsck cannot reach ends
    // the check with nothing done.
    let objects = if sb.has_object_store() {
        Some(objects::connect(raw.as_ref())?)
    } else {
        None
    };
    let (store, names): (Arc<dyn MetaStore>, Keyspace) = match &keys {
        Some(k) => (
            Arc::new(SealedStore::new(Arc::clone(&raw), Arc::clone(k))),
            Keyspace::encrypted(Arc::clone(k)),
        ),
        None => (Arc::clone(&raw), Keyspace::plain()),
    };
    let mut c = Checker {
        store: store.as_ref(),
        raw: raw.as_ref(),
        keys,
        names,
        layout: Layout::new(&layout.root),
        repair,
        report: Report::default(),
        inodes: BTreeMap::new(),
        writes: Vec::new(),
        lost_found: None,
        orphans: 0,
        sessions_corrupt: false,
        unclean: false,
        remote: sb.has_object_store(),
        objects,
        data_check: checks.data_check,
        dir_stats: sb.has_dir_stats() || (repair && checks.dir_stats),
        adding_dir_stats: !(sb.has_dir_stats() && sb.has_full_dir_stats())
            && repair
            && checks.dir_stats,
        rctime: sb.has_full_dir_stats() || (repair && checks.dir_stats),
    };
    let mount_state = c.raw.get(keys::MOUNT_STATE)?;
    c.unclean = match mount_state.map(|rec| c.open(keys::MOUNT_STATE, rec)) {
        Some(v) => match decoded(&v, crate::format::superblock::MountState::decode) {
            Ok(m) => !m.clean,
            Err(e) => {
                c.find(format!("mount state record unreadable ({e})"), true);
                true
            }
        },
        None => false,
    };
    let total = volume::read_counters(c.store).map_or(0, |c| c.inodes);
    c.pass_inodes(total, progress)?;
    match c.inodes.get(&ROOT_INO) {
        Some(r) if r.inode.is_dir() => {}
        _ => {
            c.find("root directory missing or unreadable".into(), false);
            return Ok(c.report);
        }
    }
    for (ino, info) in &c.inodes {
        if info.inode.inline.packed_len() > budget as usize && info.inode.inline.len() > 1 {
            tracing::warn!(ino, "inline xattrs exceed the volume's budget");
        }
        if info.inode.mode & S_IFMT == 0 {
            tracing::warn!(ino, "inode without a file type");
        }
    }
    progress("entries", 0, 1);
    c.pass_entries()?;
    progress("xattrs", 0, 1);
    c.pass_attachments()?;
    progress("sweep", 0, 1);
    c.sweep()?;
    c.dir_stats();
    if c.adding_dir_stats {
        // In the commit that writes the counts: a crash leaves the volume
        // as it was (records with counts no build maintains or reads
        // without the bit) or with both.
        let mut upgraded = sb.clone();
        upgraded.features |= crate::format::superblock::FEATURE_DIR_STATS
            | crate::format::superblock::FEATURE_DIR_STATS_FULL;
        c.writes
            .push((keys::SUPERBLOCK.to_vec(), Some(upgraded.encode())));
    }
    c.counters()?;
    if repair && c.unclean {
        let m = crate::format::superblock::MountState {
            clean: true,
            pid: std::process::id(),
            since_ns: Timestamp::now().as_nanos() as i64,
        };
        c.writes
            .push((keys::MOUNT_STATE.to_vec(), Some(m.encode())));
    }
    c.flush()?;
    if c.objects.is_some() {
        progress("objects", 0, 1);
        c.check_objects(progress)?;
        c.flush()?;
    }
    progress("done", 1, 1);
    Ok(c.report)
}
