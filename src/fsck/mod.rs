//! `safs fsck`: verify every invariant of an unmounted volume, and with
//! `repair` fix what can be fixed without guessing.
//!
//! Two passes over the engine in key order: the first decodes every inode
//! record into a compact table; the second checks every other record
//! against it, counting names per inode as it goes; a final sweep compares
//! the counts with the inodes and the backing files with the records.
//!
//! What `repair` does (each is reported):
//! - reclaims orphans (`O`) and reconciles interrupted writers (`W`), as a
//!   mount would;
//! - deletes records that fail their checksum, except inodes and the
//!   superblock (an unreadable inode is reported and left alone), and
//!   records that belong to no inode;
//! - re-creates the missing half of a `D`/`C` entry pair, deletes entries
//!   naming a missing inode;
//! - sets link counts, spill sizes, overflow counts and the counters to what
//!   the records say; links named inodes that lost every name into
//!   `/lost+found`;
//! - takes a file's size from its backing file when they disagree, and
//!   deletes backing files that belong to no inode.
//!
//! Before any of that, opening the store checks the engine's own page
//! structure (`meta::lmdb::verify`); damage there, or an unreadable
//! superblock, ends the check with that one finding: nothing further can be
//! read safely, and nothing of it can be repaired.
//!
//! Exit codes follow e2fsck: 0 clean, 1 errors corrected, 4 errors left
//! uncorrected, 8 operational error.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use crate::core::error::describe_key;
use crate::core::volume::{self, Layout, ROOT_INO, VolumeLock};
use crate::format::dirent::{Dirent, IndexEntry, decode_marker, decode_symlink};
use crate::format::envelope::{Kind, open};
use crate::format::inode::{Inode, S_IFDIR, S_IFMT, Timestamp};
use crate::format::keys;
use crate::format::superblock::Counters;
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
    InUse {
        volume: std::path::PathBuf,
        who: String,
    },
    #[error(transparent)]
    Volume(#[from] volume::VolumeError),
    #[error(transparent)]
    Meta(#[from] MetaError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T> = std::result::Result<T, FsckError>;

/// One finding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub what: String,
    pub repaired: bool,
}

#[derive(Debug, Default)]
pub struct Report {
    pub findings: Vec<Finding>,
    pub inodes: u64,
    pub entries: u64,
    pub xattr_records: u64,
    /// Orphans reclaimed and writers reconciled (expected after a crash).
    pub recovered: u64,
    /// The check stopped at the first finding: the volume cannot be read
    /// further, and `--repair` cannot help.
    pub unreadable: bool,
}

impl Report {
    pub fn exit_code(&self) -> i32 {
        if self.findings.iter().any(|f| !f.repaired) {
            EXIT_UNCORRECTED
        } else if self.findings.is_empty() {
            EXIT_CLEAN
        } else {
            EXIT_REPAIRED
        }
    }
}

/// Progress callback: (phase, done, total).
pub type Progress<'a> = &'a dyn Fn(&str, u64, u64);

/// What pass 1 keeps of each inode.
struct Info {
    inode: Inode,
    /// Names pointing here (`D` entries).
    names: u32,
    /// Subdirectories (for a directory's link count).
    subdirs: u32,
    /// The directory holding this directory's one name.
    named_in: Option<u64>,
    has_spill: bool,
    overflow_seen: u32,
    has_symlink: bool,
    orphan_marker: bool,
    writer_marker: bool,
    dirty: bool,
}

struct Checker<'a> {
    store: &'a dyn MetaStore,
    layout: Layout,
    repair: bool,
    report: Report,
    inodes: BTreeMap<u64, Info>,
    writes: Vec<Write>,
    lost_found: Option<u64>,
    /// The volume was not unmounted cleanly: stale sizes and stray backing
    /// files are expected (the next mount reconciles them), not errors.
    unclean: bool,
}

const PAGE: usize = 4096;

impl Checker<'_> {
    fn find(&mut self, what: String, fixable: bool) {
        let repaired = fixable && self.repair;
        tracing::warn!(repaired, "{what}");
        self.report.findings.push(Finding { what, repaired });
    }

    /// Streams every record with `prefix` in key order.
    fn each(&mut self, prefix: u8, mut f: impl FnMut(&mut Self, Vec<u8>, Vec<u8>)) -> Result<()> {
        let (mut start, end) = keys::prefix_range(prefix);
        loop {
            let page = self.store.scan(&start, &end, PAGE)?;
            let n = page.len();
            for (k, v) in page {
                start = k.clone();
                f(self, k, v);
            }
            if n < PAGE {
                return Ok(());
            }
            start.push(0);
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

mod entries;
mod inodes;
mod sweep;
mod xattrs;

/// Checks (and with `repair`, repairs) the unmounted volume at `dir`.
pub fn run(dir: &Path, repair: bool, progress: Progress<'_>) -> Result<Report> {
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
        ) => {
            return Ok(Report {
                findings: vec![Finding {
                    what: e.to_string(),
                    repaired: false,
                }],
                unreadable: true,
                ..Report::default()
            });
        }
        Err(e) => return Err(e.into()),
    };
    check_store(store, &layout, sb.inline_bytes, repair, progress)
}

fn check_store(
    store: Arc<dyn MetaStore>,
    layout: &Layout,
    budget: u32,
    repair: bool,
    progress: Progress<'_>,
) -> Result<Report> {
    let mut c = Checker {
        store: store.as_ref(),
        layout: Layout::new(&layout.root),
        repair,
        report: Report::default(),
        inodes: BTreeMap::new(),
        writes: Vec::new(),
        lost_found: None,
        unclean: false,
    };
    c.unclean = match c.store.get(keys::MOUNT_STATE)? {
        Some(rec) => match crate::format::superblock::MountState::decode(&rec) {
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
    progress("done", 1, 1);
    Ok(c.report)
}
