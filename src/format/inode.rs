//! The inode record: fixed attributes followed by the inline SA area.
//!
//! ```text
//! mode u32  uid u32  gid u32  nlink u32  rdev u32  flags u32
//! size u64  blocks u64
//! atime, mtime, ctime, crtime: each sec:i64 nsec:u32
//! generation u64
//! parent u64        directories: the ino of "..", others on volumes with
//!                   `FEATURE_DIR_STATS`: the directory of their first name
//!                   (0 = none), else 0
//! next_cookie u64   directories: next readdir cookie to hand out
//! spill_len u32     packed size of the spill record, 0 = none
//! overflow u32      number of overflow records (`X` keys)
//! inline area       a packed xattr set (see `xattrs`)
//! then, on volumes with `FEATURE_DIR_STATS` only:
//! stats             directories: tag u8 = 1, files u64, rfiles u64,
//!                   rsubdirs u64, rbytes u64
//! links             others with names in more than one directory: tag u8
//!                   = 2, n u32, n × u64 (the directories of the names
//!                   after the first, one per name)
//! quota             directories with a limit: tag u8 = 3, max_bytes u64,
//!                   max_files u64 (0: no limit)
//! more stats        directories, on volumes with `FEATURE_DIR_STATS_FULL`:
//!                   tag u8 = 4, rctime i64 (the newest ctime at or below,
//!                   in seconds), rblocks u64 (512-byte blocks allocated
//!                   to the non-directories below); absent while both 0
//! ```
//!
//! One point read of `I<ino>` returns the attributes *and* the small xattrs
//! (ZFS `xattr=sa`: "one seek instead of three"). The spill and overflow
//! fields let `getxattr` of an absent name answer `ENODATA` without a second
//! read when nothing spilled.

use super::FormatError;
use super::envelope::{Kind, Reader, open, seal_with};
use super::xattrs::XattrSet;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp {
    pub sec: i64,
    pub nsec: u32,
}

impl Timestamp {
    pub fn now() -> Self {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        }
    }

    pub fn as_nanos(&self) -> i128 {
        i128::from(self.sec) * 1_000_000_000 + i128::from(self.nsec)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inode {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub rdev: u32,
    pub flags: u32,
    pub size: u64,
    pub blocks: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub crtime: Timestamp,
    pub generation: u64,
    pub parent: u64,
    pub next_cookie: u64,
    /// Invariant: 0 iff no `S<ino>` record exists; otherwise its packed size.
    pub spill_len: u32,
    /// Invariant: the number of `X<ino>…` records.
    pub overflow: u32,
    /// Invariant: `inline.packed_len()` ≤ the volume's inline budget.
    pub inline: XattrSet,
    /// A directory's counts, on volumes that keep them (`core::stats`).
    pub stats: Option<DirStats>,
    /// A non-directory's names after the first: the directory of each
    /// (on volumes that keep statistics; `parent` holds the first).
    pub links: Vec<u64>,
    /// A directory's limits (`safs.quota.*`).
    pub quota: Quota,
}

/// Limits on what may lie below a directory; 0: none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quota {
    /// On its `rbytes`.
    pub max_bytes: u64,
    /// On its `rentries` (files and directories below it), as CephFS's
    /// `max_files` counts.
    pub max_files: u64,
}

impl Quota {
    pub fn is_none(&self) -> bool {
        *self == Quota::default()
    }
}

/// What lies below a directory, kept current by every change of an entry
/// (CephFS's rstats). A non-directory entry is a file, whatever its type;
/// `subdirs` (direct) is the link count's business (`nlink - 2`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirStats {
    /// Non-directory entries directly in it.
    pub files: u64,
    /// Non-directory entries anywhere below it (each name counts).
    pub rfiles: u64,
    /// Directories anywhere below it.
    pub rsubdirs: u64,
    /// Bytes of the non-directories anywhere below it (their sizes, once
    /// for each name: a symlink's is its target's length).
    pub rbytes: u64,
    /// The newest ctime of it and of anything below it, in whole seconds
    /// (so that within a second a change moves its directory's, not every
    /// ancestor's); 0 where the volume does not keep it.
    pub rctime: i64,
    /// 512-byte blocks allocated to the non-directories anywhere below it
    /// (their `st_blocks`, once for each name); 0 where not kept.
    pub rblocks: u64,
}

const STATS_TAG: u8 = 1;
const LINKS_TAG: u8 = 2;
const QUOTA_TAG: u8 = 3;
const MORE_TAG: u8 = 4;

pub const S_IFMT: u32 = 0o170_000;
pub const S_IFDIR: u32 = 0o040_000;
pub const S_IFREG: u32 = 0o100_000;
pub const S_IFLNK: u32 = 0o120_000;

impl Inode {
    /// The directories a non-directory's names are in: `parent` (none
    /// while it has no name) and `links`, once per name.
    pub fn homes(&self) -> Vec<u64> {
        std::iter::once(self.parent)
            .filter(|&p| p != 0)
            .chain(self.links.iter().copied())
            .collect()
    }

    pub fn file_type(&self) -> u32 {
        self.mode & S_IFMT
    }

    pub fn is_dir(&self) -> bool {
        self.file_type() == S_IFDIR
    }

    pub fn is_reg(&self) -> bool {
        self.file_type() == S_IFREG
    }

    pub fn is_symlink(&self) -> bool {
        self.file_type() == S_IFLNK
    }

    /// `d_type` of this inode.
    pub fn dtype(&self) -> u8 {
        (self.file_type() >> 12) as u8
    }

    pub fn encode(&self, key: &[u8]) -> Vec<u8> {
        // Written straight into the sealed record: one allocation.
        let len = 192 + self.inline.packed_len() + 8 * self.links.len();
        seal_with(key, Kind::Inode, len, |p| {
            for v in [
                self.mode, self.uid, self.gid, self.nlink, self.rdev, self.flags,
            ] {
                p.extend_from_slice(&v.to_be_bytes());
            }
            p.extend_from_slice(&self.size.to_be_bytes());
            p.extend_from_slice(&self.blocks.to_be_bytes());
            for t in [self.atime, self.mtime, self.ctime, self.crtime] {
                p.extend_from_slice(&t.sec.to_be_bytes());
                p.extend_from_slice(&t.nsec.to_be_bytes());
            }
            p.extend_from_slice(&self.generation.to_be_bytes());
            p.extend_from_slice(&self.parent.to_be_bytes());
            p.extend_from_slice(&self.next_cookie.to_be_bytes());
            p.extend_from_slice(&self.spill_len.to_be_bytes());
            p.extend_from_slice(&self.overflow.to_be_bytes());
            self.inline.encode_into(p);
            if let Some(s) = &self.stats {
                p.push(STATS_TAG);
                for v in [s.files, s.rfiles, s.rsubdirs, s.rbytes] {
                    p.extend_from_slice(&v.to_be_bytes());
                }
            }
            if !self.links.is_empty() {
                p.push(LINKS_TAG);
                p.extend_from_slice(&(self.links.len() as u32).to_be_bytes());
                for v in &self.links {
                    p.extend_from_slice(&v.to_be_bytes());
                }
            }
            if !self.quota.is_none() {
                p.push(QUOTA_TAG);
                for v in [self.quota.max_bytes, self.quota.max_files] {
                    p.extend_from_slice(&v.to_be_bytes());
                }
            }
            if let Some(s) = &self.stats
                && (s.rctime != 0 || s.rblocks != 0)
            {
                p.push(MORE_TAG);
                p.extend_from_slice(&s.rctime.to_be_bytes());
                p.extend_from_slice(&s.rblocks.to_be_bytes());
            }
        })
    }

    pub fn decode(key: &[u8], record: &[u8]) -> Result<Self, FormatError> {
        let mut r = Reader::new(open(key, Kind::Inode, record)?);
        let ts = |r: &mut Reader<'_>| -> Result<Timestamp, FormatError> {
            let sec = r.i64()?;
            let nsec = r.u32()?;
            if nsec >= 1_000_000_000 {
                return Err(FormatError::Malformed("nanoseconds out of range"));
            }
            Ok(Timestamp { sec, nsec })
        };
        let ino = Inode {
            mode: r.u32()?,
            uid: r.u32()?,
            gid: r.u32()?,
            nlink: r.u32()?,
            rdev: r.u32()?,
            flags: r.u32()?,
            size: r.u64()?,
            blocks: r.u64()?,
            atime: ts(&mut r)?,
            mtime: ts(&mut r)?,
            ctime: ts(&mut r)?,
            crtime: ts(&mut r)?,
            generation: r.u64()?,
            parent: r.u64()?,
            next_cookie: r.u64()?,
            spill_len: r.u32()?,
            overflow: r.u32()?,
            inline: XattrSet::decode_from(&mut r)?,
            stats: None,
            links: Vec::new(),
            quota: Quota::default(),
        };
        let mut ino = ino;
        // Tagged sections, each at most once, in tag order.
        let mut last = 0;
        while !r.is_empty() {
            let tag = r.u8()?;
            if tag <= last {
                return Err(FormatError::Malformed("inode trailer out of order"));
            }
            last = tag;
            match (tag, ino.is_dir()) {
                (STATS_TAG, true) => {
                    ino.stats = Some(DirStats {
                        files: r.u64()?,
                        rfiles: r.u64()?,
                        rsubdirs: r.u64()?,
                        rbytes: r.u64()?,
                        rctime: 0,
                        rblocks: 0,
                    })
                }
                (LINKS_TAG, false) => {
                    let n = r.u32()? as usize;
                    if n == 0 || n > 65_536 {
                        return Err(FormatError::Malformed("link count out of range"));
                    }
                    ino.links = (0..n).map(|_| r.u64()).collect::<Result<_, _>>()?;
                }
                (QUOTA_TAG, true) => {
                    ino.quota = Quota {
                        max_bytes: r.u64()?,
                        max_files: r.u64()?,
                    };
                    if ino.quota.is_none() {
                        return Err(FormatError::Malformed("an empty quota"));
                    }
                }
                (MORE_TAG, true) => {
                    let Some(s) = ino.stats.as_mut() else {
                        return Err(FormatError::Malformed("more statistics without statistics"));
                    };
                    s.rctime = r.i64()?;
                    s.rblocks = r.u64()?;
                    if s.rctime == 0 && s.rblocks == 0 {
                        return Err(FormatError::Malformed("empty further statistics"));
                    }
                }
                _ => return Err(FormatError::Malformed("unknown inode trailer")),
            }
        }
        r.finish()?;
        Ok(ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::envelope::seal;
    use crate::format::keys;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(mode in any::<u32>(), size in any::<u64>(), sec in any::<i64>(), nsec in 0u32..1_000_000_000,
                      names in proptest::collection::btree_map(proptest::collection::vec(any::<u8>(), 1..20), proptest::collection::vec(any::<u8>(), 0..50), 0..5)) {
            let mut inline = XattrSet::new();
            for (k, v) in names { inline.insert(k, v); }
            let dir = size % 2 == 0;
            let stats = dir.then_some(DirStats { files: size / 3, rfiles: size / 2, rsubdirs: size / 5, rbytes: size / 7, rctime: sec, rblocks: size / 13 });
            let links = if dir || size % 3 == 0 { Vec::new() } else { vec![size, 7, 7] };
            let mode = if dir { S_IFDIR | (mode & 0o7777) } else { S_IFREG | (mode & 0o7777) };
            let quota = if dir && size % 3 == 0 { Quota { max_bytes: size | 1, max_files: size / 11 } } else { Quota::default() };
            let ino = Inode { mode, size, mtime: Timestamp { sec, nsec }, nlink: 3, inline, stats, links, quota, ..Default::default() };
            let k = keys::inode(42);
            prop_assert_eq!(Inode::decode(&k, &ino.encode(&k)).unwrap(), ino);
        }

        #[test]
        fn decode_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..200)) {
            let k = keys::inode(1);
            let _ = Inode::decode(&k, &buf);
            let _ = Inode::decode(&k, &seal(&k, Kind::Inode, &buf));
        }
    }
}
