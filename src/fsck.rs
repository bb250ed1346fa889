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
    fn each(
        &mut self,
        prefix: u8,
        mut f: impl FnMut(&mut Self, Vec<u8>, Vec<u8>),
    ) -> anyhow::Result<()> {
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

    fn flush(&mut self) -> anyhow::Result<()> {
        if !self.writes.is_empty() {
            self.store.commit(&std::mem::take(&mut self.writes))?;
        }
        Ok(())
    }

    fn pass_inodes(&mut self, total: u64, progress: Progress<'_>) -> anyhow::Result<()> {
        let mut done = 0;
        self.each(keys::P_INODE, |c, k, v| {
            done += 1;
            if done % 4096 == 0 {
                progress("inodes", done, total);
            }
            let Some(ino) = keys::key_ino(&k).filter(|_| k.len() == 9) else {
                c.find(format!("malformed inode key {}", describe_key(&k)), true);
                c.delete(&k);
                return;
            };
            match Inode::decode(&k, &v) {
                Ok(inode) => {
                    c.inodes.insert(
                        ino,
                        Info {
                            inode,
                            names: 0,
                            subdirs: 0,
                            named_in: None,
                            has_spill: false,
                            overflow_seen: 0,
                            has_symlink: false,
                            orphan_marker: false,
                            writer_marker: false,
                            dirty: false,
                        },
                    );
                }
                Err(e) => c.find(format!("inode {ino}: unreadable record ({e})"), false),
            }
        })?;
        progress("inodes", done, total);
        self.report.inodes = self.inodes.len() as u64;
        Ok(())
    }

    fn pass_entries(&mut self) -> anyhow::Result<()> {
        // D: name → (ino, kind, cookie)
        let mut dirents: HashMap<(u64, Vec<u8>), Dirent> = HashMap::new();
        self.each(keys::P_DIRENT, |c, k, v| {
            let parent = keys::key_ino(&k).unwrap_or(0);
            let name = keys::key_name(&k).to_vec();
            match Dirent::decode(&k, &v) {
                Ok(d) => {
                    dirents.insert((parent, name), d);
                }
                Err(e) => {
                    c.find(
                        format!("entry {}: unreadable ({e})", describe_key(&k)),
                        true,
                    );
                    c.delete(&k);
                }
            }
        })?;
        // C: cookie → (ino, kind, name)
        let mut index: HashMap<(u64, Vec<u8>), (u64, IndexEntry)> = HashMap::new();
        self.each(keys::P_DIRINDEX, |c, k, v| {
            let parent = keys::key_ino(&k).unwrap_or(0);
            let cookie = keys::key_cookie(&k).unwrap_or(0);
            match IndexEntry::decode(&k, &v) {
                Ok(e) => {
                    index.insert((parent, e.name.clone()), (cookie, e));
                }
                Err(e) => {
                    c.find(
                        format!("index entry {}: unreadable ({e})", describe_key(&k)),
                        true,
                    );
                    c.delete(&k);
                }
            }
        })?;
        let mut names: Vec<_> = dirents.keys().chain(index.keys()).cloned().collect();
        names.sort();
        names.dedup();
        for (parent, name) in names {
            self.report.entries += 1;
            let shown = format!("{parent}/{}", String::from_utf8_lossy(&name));
            let d = dirents.get(&(parent, name.clone())).cloned();
            let x = index.get(&(parent, name.clone())).cloned();
            let parent_ok = self
                .inodes
                .get(&parent)
                .is_some_and(|p| p.inode.is_dir() && p.inode.nlink > 0);
            let target = d
                .as_ref()
                .map(|d| d.ino)
                .or(x.as_ref().map(|x| x.1.ino))
                .unwrap_or(0);
            let target_kind = self.inodes.get(&target).map(|i| i.inode.dtype());
            let dk = keys::dirent(parent, &name);
            if !parent_ok || target_kind.is_none() {
                let why = if parent_ok {
                    "names a missing inode"
                } else {
                    "is in a missing or non-directory parent"
                };
                self.find(format!("entry {shown} {why}"), true);
                self.delete(&dk);
                if let Some((cookie, _)) = &x {
                    self.delete(&keys::dir_index(parent, *cookie));
                }
                continue;
            }
            let kind = target_kind.expect("checked");
            match (&d, &x) {
                (Some(d), Some((cookie, e))) => {
                    if d.ino != e.ino || d.cookie != *cookie {
                        self.find(
                            format!("entry {shown}: name and index records disagree"),
                            true,
                        );
                        self.delete(&keys::dir_index(parent, *cookie));
                        self.add_index(parent, &name, d.ino, kind);
                    }
                }
                (Some(d), None) => {
                    self.find(format!("entry {shown}: index record missing"), true);
                    self.delete(&dk);
                    self.add_index(parent, &name, d.ino, kind);
                }
                (None, Some((cookie, e))) => {
                    self.find(format!("entry {shown}: name record missing"), true);
                    self.delete(&keys::dir_index(parent, *cookie));
                    self.add_index(parent, &name, e.ino, kind);
                }
                (None, None) => unreachable!("name came from one of the maps"),
            }
            if d.as_ref().is_some_and(|d| d.kind != kind) {
                self.find(format!("entry {shown}: type differs from its inode"), true);
                self.delete(&dk);
                self.add_index(parent, &name, target, kind);
            }
            if let Some(cookie) = d.as_ref().map(|d| d.cookie) {
                let p = self.inodes.get_mut(&parent).expect("parent checked");
                if cookie >= p.inode.next_cookie {
                    p.inode.next_cookie = cookie + 1;
                    p.dirty = true;
                    self.find(
                        format!("directory {parent}: next cookie below an entry's cookie"),
                        true,
                    );
                }
            }
            let is_dir = u32::from(kind) << 12 == S_IFDIR;
            let t = self.inodes.get_mut(&target).expect("checked");
            t.names += 1;
            if is_dir {
                t.named_in = Some(parent);
                self.inodes.get_mut(&parent).expect("checked").subdirs += 1;
            }
        }
        Ok(())
    }

    /// Writes a fresh `D`+`C` pair (repair only), taking a new cookie.
    fn add_index(&mut self, parent: u64, name: &[u8], ino: u64, kind: u8) {
        if !self.repair {
            return;
        }
        let p = self.inodes.get_mut(&parent).expect("parent exists");
        let cookie = p.inode.next_cookie.max(crate::core::FIRST_COOKIE);
        p.inode.next_cookie = cookie + 1;
        p.dirty = true;
        let dk = keys::dirent(parent, name);
        let d = Dirent { ino, kind, cookie };
        self.writes.push((dk.clone(), Some(d.encode(&dk))));
        let ck = keys::dir_index(parent, cookie);
        let e = IndexEntry {
            ino,
            kind,
            name: name.to_vec(),
        };
        self.writes.push((ck.to_vec(), Some(e.encode(&ck))));
    }

    fn pass_attachments(&mut self) -> anyhow::Result<()> {
        self.each(keys::P_SPILL, |c, k, v| {
            let ino = keys::key_ino(&k).unwrap_or(0);
            let decoded = open(&k, Kind::Spill, &v)
                .map_err(|e| e.to_string())
                .and_then(|p| XattrSet::decode(p).map_err(|e| e.to_string()));
            let Some(info) = c.inodes.get_mut(&ino) else {
                c.find(format!("spill record of missing inode {ino}"), true);
                c.delete(&k);
                return;
            };
            match decoded {
                Ok(set) => {
                    info.has_spill = true;
                    let wrong_size = info.inode.spill_len as usize != set.packed_len();
                    if wrong_size {
                        info.inode.spill_len = set.packed_len() as u32;
                        info.dirty = true;
                    }
                    let dup = set.names().any(|n| info.inode.inline.contains(n));
                    c.report.xattr_records += 1;
                    if wrong_size {
                        c.find(
                            format!("inode {ino}: spill size disagrees with its spill record"),
                            true,
                        );
                    }
                    if dup {
                        c.find(
                            format!("inode {ino}: an xattr is both inline and spilled"),
                            false,
                        );
                    }
                }
                Err(e) => {
                    info.inode.spill_len = 0;
                    info.dirty = true;
                    c.find(
                        format!("inode {ino}: spill record unreadable ({e}); its xattrs are lost"),
                        true,
                    );
                    c.delete(&k);
                }
            }
        })?;
        self.each(keys::P_OVERFLOW, |c, k, v| {
            let ino = keys::key_ino(&k).unwrap_or(0);
            let ok = open(&k, Kind::Overflow, &v).is_ok();
            let Some(info) = c.inodes.get_mut(&ino) else {
                c.find(
                    format!("overflow xattr {} of a missing inode", describe_key(&k)),
                    true,
                );
                c.delete(&k);
                return;
            };
            if ok {
                info.overflow_seen += 1;
                c.report.xattr_records += 1;
            } else {
                c.find(
                    format!(
                        "overflow xattr {}: unreadable; it is lost",
                        describe_key(&k)
                    ),
                    true,
                );
                c.delete(&k);
            }
        })?;
        self.each(keys::P_SYMLINK, |c, k, v| {
            let ino = keys::key_ino(&k).unwrap_or(0);
            let ok = decode_symlink(&k, &v).is_ok();
            match c.inodes.get_mut(&ino) {
                Some(info) if info.inode.is_symlink() && ok => info.has_symlink = true,
                Some(info) if info.inode.is_symlink() => {
                    info.has_symlink = true;
                    c.find(format!("symlink {ino}: target unreadable"), false);
                }
                _ => {
                    c.find(
                        format!("symlink target of missing or non-symlink inode {ino}"),
                        true,
                    );
                    c.delete(&k);
                }
            }
        })?;
        for prefix in [keys::P_ORPHAN, keys::P_WRITING] {
            self.each(prefix, |c, k, v| {
                let ino = keys::key_ino(&k).unwrap_or(0);
                let ok = decode_marker(&k, &v).is_ok();
                match c.inodes.get_mut(&ino) {
                    Some(info) if ok => {
                        if prefix == keys::P_ORPHAN {
                            info.orphan_marker = true;
                        } else {
                            info.writer_marker = true;
                        }
                    }
                    _ => {
                        c.find(
                            format!("stray or unreadable marker {}", describe_key(&k)),
                            true,
                        );
                        c.delete(&k);
                    }
                }
            })?;
        }
        Ok(())
    }

    /// Compares counts with inodes, markers with link counts, backing files
    /// with sizes.
    fn sweep(&mut self) -> anyhow::Result<()> {
        let data = self.layout.data();
        let inos: Vec<u64> = self.inodes.keys().copied().collect();
        let mut lost = Vec::new();
        for ino in inos {
            let mut info = self.inodes.remove(&ino).expect("listed");
            let i = &mut info.inode;
            // Orphans: reclaimed at mount, so reclaim them here too.
            if info.orphan_marker || (i.nlink == 0 && info.names == 0) {
                if info.names > 0 {
                    // A marker on a named inode: drop the marker.
                    self.find(
                        format!("inode {ino}: orphan marker on a linked inode"),
                        true,
                    );
                    self.delete(&keys::orphan(ino));
                } else {
                    self.report.recovered += 1;
                    if !info.orphan_marker {
                        self.find(
                            format!("inode {ino}: unlinked inode without an orphan marker"),
                            true,
                        );
                    }
                    if self.repair {
                        self.free(ino, i);
                    }
                    continue;
                }
            }
            if info.writer_marker {
                self.report.recovered += 1;
                if self.repair {
                    self.delete(&keys::writing(ino));
                    if let Ok(m) =
                        std::fs::metadata(data.join(format!("{:02x}/{ino:016x}", ino & 0xff)))
                    {
                        if m.size() != i.size {
                            i.size = m.size();
                            i.blocks = m.blocks();
                            info.dirty = true;
                        }
                    }
                }
            }
            let want_links = if i.is_dir() {
                2 + info.subdirs
            } else {
                info.names
            };
            if ino != ROOT_INO && info.names == 0 {
                lost.push(ino);
            } else if i.nlink != want_links {
                self.find(
                    format!("inode {ino}: link count {} should be {want_links}", i.nlink),
                    true,
                );
                i.nlink = want_links;
                info.dirty = true;
            }
            if i.is_dir() {
                if info.names > 1 {
                    self.find(format!("directory {ino} has {} names", info.names), false);
                }
                let parent = if ino == ROOT_INO {
                    Some(ROOT_INO)
                } else {
                    info.named_in
                };
                if let Some(p) = parent {
                    if i.parent != p {
                        self.find(
                            format!("directory {ino}: '..' is {} but it lives in {p}", i.parent),
                            true,
                        );
                        i.parent = p;
                        info.dirty = true;
                    }
                }
            }
            if i.spill_len > 0 && !info.has_spill {
                self.find(
                    format!("inode {ino}: spill record missing; its spilled xattrs are lost"),
                    true,
                );
                i.spill_len = 0;
                info.dirty = true;
            }
            if i.overflow != info.overflow_seen {
                self.find(
                    format!(
                        "inode {ino}: overflow count {} should be {}",
                        i.overflow, info.overflow_seen
                    ),
                    true,
                );
                i.overflow = info.overflow_seen;
                info.dirty = true;
            }
            if i.is_symlink() && !info.has_symlink {
                self.find(format!("symlink {ino}: target missing"), false);
            }
            if i.is_reg() && !info.writer_marker {
                let path = data.join(format!("{:02x}/{ino:016x}", ino & 0xff));
                match std::fs::metadata(&path) {
                    Ok(m) if m.size() != i.size => {
                        if self.unclean {
                            self.report.recovered += 1;
                        } else {
                            self.find(
                                format!(
                                    "file {ino}: size {} but its backing file holds {}",
                                    i.size,
                                    m.size()
                                ),
                                true,
                            );
                        }
                        i.size = m.size();
                        i.blocks = m.blocks();
                        info.dirty = true;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && i.size > 0 => {
                        self.find(
                            format!("file {ino}: backing file missing ({} bytes lost)", i.size),
                            false,
                        );
                    }
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        self.find(format!("file {ino}: backing file unreadable: {e}"), false);
                    }
                    _ => {}
                }
            }
            if info.dirty {
                let k = keys::inode(ino);
                let rec = i.encode(&k);
                self.put(&k, rec);
            }
            self.inodes.insert(ino, info);
        }
        for ino in lost {
            self.find(format!("inode {ino} has no name"), true);
            self.link_into_lost_found(ino)?;
        }
        self.sweep_backing()?;
        Ok(())
    }

    fn free(&mut self, ino: u64, inode: &Inode) {
        for k in [
            keys::inode(ino),
            keys::spill(ino),
            keys::symlink(ino),
            keys::orphan(ino),
            keys::writing(ino),
        ] {
            self.writes.push((k.to_vec(), None));
        }
        if inode.overflow > 0 {
            let (s, e) = keys::ino_range(keys::P_OVERFLOW, ino);
            if let Ok(recs) = self.store.scan(&s, &e, usize::MAX) {
                for (k, _) in recs {
                    self.writes.push((k, None));
                }
            }
        }
        let _ = std::fs::remove_file(
            self.layout
                .data()
                .join(format!("{:02x}/{ino:016x}", ino & 0xff)),
        );
    }

    fn link_into_lost_found(&mut self, ino: u64) -> anyhow::Result<()> {
        if !self.repair {
            return Ok(());
        }
        let lf = self.lost_found()?;
        let kind = {
            let info = self.inodes.get_mut(&ino).expect("lost inode listed");
            info.inode.nlink = if info.inode.is_dir() {
                2 + info.subdirs
            } else {
                1
            };
            if info.inode.is_dir() {
                info.inode.parent = lf;
            }
            let k = keys::inode(ino);
            let rec = info.inode.encode(&k);
            self.writes.push((k.to_vec(), Some(rec)));
            info.inode.dtype()
        };
        let name = format!("#{ino}");
        self.add_index(lf, name.as_bytes(), ino, kind);
        if u32::from(kind) << 12 == S_IFDIR {
            self.inodes.get_mut(&lf).expect("made").inode.nlink += 1;
        }
        self.write_inode(lf);
        self.write_inode(ROOT_INO);
        Ok(())
    }

    fn write_inode(&mut self, ino: u64) {
        if let Some(info) = self.inodes.get(&ino) {
            let k = keys::inode(ino);
            let rec = info.inode.encode(&k);
            self.writes.push((k.to_vec(), Some(rec)));
        }
    }

    /// The `/lost+found` directory, made on first use.
    fn lost_found(&mut self) -> anyhow::Result<u64> {
        let dk = keys::dirent(ROOT_INO, b"lost+found");
        if let Some(rec) = self.store.get(&dk)? {
            if let Ok(d) = Dirent::decode(&dk, &rec) {
                if self.inodes.get(&d.ino).is_some_and(|i| i.inode.is_dir()) {
                    return Ok(d.ino);
                }
            }
        }
        if let Some(ino) = self.lost_found {
            return Ok(ino);
        }
        let ino = self
            .inodes
            .keys()
            .next_back()
            .copied()
            .unwrap_or(ROOT_INO)
            .max(self.next_ino_floor())
            + 1;
        let now = Timestamp::now();
        let inode = Inode {
            mode: S_IFDIR | 0o700,
            nlink: 2,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            generation: 1,
            parent: ROOT_INO,
            next_cookie: crate::core::FIRST_COOKIE,
            ..Default::default()
        };
        let kind = inode.dtype();
        self.inodes.insert(
            ino,
            Info {
                inode,
                names: 1,
                subdirs: 0,
                named_in: Some(ROOT_INO),
                has_spill: false,
                overflow_seen: 0,
                has_symlink: false,
                orphan_marker: false,
                writer_marker: false,
                dirty: true,
            },
        );
        self.add_index(ROOT_INO, b"lost+found", ino, kind);
        self.inodes.get_mut(&ROOT_INO).expect("root").inode.nlink += 1;
        self.write_inode(ino);
        self.lost_found = Some(ino);
        Ok(ino)
    }

    fn next_ino_floor(&self) -> u64 {
        volume::read_counters(self.store).map_or(0, |c| c.next_ino)
    }

    fn sweep_backing(&mut self) -> anyhow::Result<()> {
        let data = self.layout.data();
        for i in 0..256u32 {
            let dir = data.join(format!("{i:02x}"));
            let Ok(rd) = std::fs::read_dir(&dir) else {
                self.find(format!("backing directory {} missing", dir.display()), true);
                if self.repair {
                    std::fs::create_dir_all(&dir)?;
                }
                continue;
            };
            for e in rd.flatten() {
                let name = e.file_name();
                let ino = u64::from_str_radix(&name.to_string_lossy(), 16).ok();
                let owned = ino
                    .and_then(|i| self.inodes.get(&i))
                    .is_some_and(|i| i.inode.is_reg());
                if !owned {
                    if self.unclean {
                        self.report.recovered += 1;
                    } else {
                        self.find(
                            format!("backing file {} belongs to no file", e.path().display()),
                            true,
                        );
                    }
                    if self.repair {
                        std::fs::remove_file(e.path())?;
                    }
                }
            }
        }
        Ok(())
    }

    fn counters(&mut self) -> anyhow::Result<()> {
        let found = volume::read_counters(self.store);
        let max = self.inodes.keys().next_back().copied().unwrap_or(ROOT_INO);
        let live = self.inodes.len() as u64;
        let fresh = Counters {
            next_ino: max + 1,
            inodes: live,
        };
        match found {
            Ok(c) => {
                if c.next_ino <= max {
                    self.find(
                        format!("next inode number {} is not above inode {max}", c.next_ino),
                        true,
                    );
                    self.put(keys::COUNTERS, fresh.encode());
                } else if c.inodes != live {
                    self.find(format!("inode count {} should be {live}", c.inodes), true);
                    self.put(
                        keys::COUNTERS,
                        Counters {
                            next_ino: c.next_ino,
                            inodes: live,
                        }
                        .encode(),
                    );
                }
            }
            Err(volume::VolumeError::CorruptCounters(e)) => {
                self.find(format!("counters record unreadable ({e})"), true);
                self.put(keys::COUNTERS, fresh.encode());
            }
            Err(volume::VolumeError::NoCounters) => {
                self.find("counters record missing".into(), true);
                self.put(keys::COUNTERS, fresh.encode());
            }
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }
}

/// Checks (and with `repair`, repairs) the unmounted volume at `dir`.
pub fn run(dir: &Path, repair: bool, progress: Progress<'_>) -> anyhow::Result<Report> {
    let layout = Layout::new(dir);
    if !layout.is_volume() {
        return Err(volume::VolumeError::NotAVolume(dir.to_path_buf()).into());
    }
    let _lock = VolumeLock::acquire(&layout).map_err(|e| match e {
        volume::VolumeError::Busy(who) => {
            anyhow::anyhow!(
                "volume {} is {who}: fsck checks unmounted volumes only",
                dir.display()
            )
        }
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
) -> anyhow::Result<Report> {
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
