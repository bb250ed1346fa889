//! The volume superblock (`V`) and the counters record (`N`).
//!
//! Superblock payload:
//! ```text
//! magic        8   b"SAFSVOL\0"
//! format       u32 FORMAT_VERSION that wrote the volume
//! uuid         16
//! inline_bytes u32 inline SA budget chosen at format
//! features     u64 feature bits (FEATURE_*; unknown bits refuse mount)
//! created_ns   i64 format time, ns since the epoch
//! ```
//! Counters payload: `next_ino:u64 inodes:u64`.
//! Session counters payload (`R` session): `start:u64 end:u64 inodes:i64`.
//! Mount state payload: `clean:u8 pid:u32 since_ns:i64`.

use super::FormatError;
use super::envelope::{Kind, Reader, open, seal};
use super::keys;

pub const MAGIC: &[u8; 8] = b"SAFSVOL\0";

/// The volume is encrypted: names in keys, record values and file contents
/// (see `core::crypto`); its key record `K` unlocks it.
pub const FEATURE_ENCRYPTED: u64 = 1;
/// Encrypted contents are sealed one block per 4 KiB page (never torn by a
/// killed daemon); without it, in 4 KiB blocks straddling pages.
pub const FEATURE_PAGE_BLOCKS: u64 = 2;
/// The spill tier may be split into pages (`format::spill`). A build that
/// reads only page 0 would miss the others, so it must refuse the volume.
/// Set at format, and on an older volume at its first writable mount.
pub const FEATURE_SPILL_PAGES: u64 = 4;
/// File contents live in an object store named by the `U` record, with a
/// block map (`B`) committed with each size: a build that does not know
/// would take the local backing files, a cache, for the contents.
pub const FEATURE_OBJECT_STORE: u64 = 8;
/// Directory inodes carry their counts (`format::inode::DirStats`), kept
/// by every change of an entry: a build that does not know would change
/// entries without them, and read the records' trailer as damage.
pub const FEATURE_DIR_STATS: u64 = 16;
/// Directory statistics also carry the newest change time and the blocks
/// allocated below (`DirStats::rctime`, `rblocks`), moved by every change
/// of a ctime or of a file's blocks: a build that does not know would
/// leave them behind, and read their section as damage.
pub const FEATURE_DIR_STATS_FULL: u64 = 32;
/// Figures several sessions change are kept as per-session shares: inode
/// numbers reserved in blocks and the inodes in use counted per session
/// (`SessionCounters`), and on volumes several daemons serve, directory
/// statistics moved by a session's share of each directory
/// (`format::shares`). A build that does not know would take `N` and the
/// inodes alone for them. Set at format, and on an older volume at its
/// first writable mount.
pub const FEATURE_SESSION_SHARES: u64 = 64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub format_version: u32,
    pub uuid: [u8; 16],
    pub inline_bytes: u32,
    pub features: u64,
    pub created_ns: i64,
}

impl Superblock {
    pub fn is_encrypted(&self) -> bool {
        self.features & FEATURE_ENCRYPTED != 0
    }

    pub fn has_session_shares(&self) -> bool {
        self.features & FEATURE_SESSION_SHARES != 0
    }

    pub fn has_spill_pages(&self) -> bool {
        self.features & FEATURE_SPILL_PAGES != 0
    }

    pub fn has_object_store(&self) -> bool {
        self.features & FEATURE_OBJECT_STORE != 0
    }

    pub fn has_dir_stats(&self) -> bool {
        self.features & FEATURE_DIR_STATS != 0
    }

    pub fn has_full_dir_stats(&self) -> bool {
        self.features & FEATURE_DIR_STATS_FULL != 0
    }

    pub fn has_page_blocks(&self) -> bool {
        self.features & FEATURE_PAGE_BLOCKS != 0
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(44);
        p.extend_from_slice(MAGIC);
        p.extend_from_slice(&self.format_version.to_be_bytes());
        p.extend_from_slice(&self.uuid);
        p.extend_from_slice(&self.inline_bytes.to_be_bytes());
        p.extend_from_slice(&self.features.to_be_bytes());
        p.extend_from_slice(&self.created_ns.to_be_bytes());
        seal(keys::SUPERBLOCK, Kind::Superblock, &p)
    }

    pub fn decode(record: &[u8]) -> Result<Self, FormatError> {
        let mut r = Reader::new(open(keys::SUPERBLOCK, Kind::Superblock, record)?);
        if r.bytes(8)? != MAGIC {
            return Err(FormatError::Malformed("not a safs superblock"));
        }
        let sb = Superblock {
            format_version: r.u32()?,
            uuid: r.bytes(16)?.try_into().expect("16 bytes"),
            inline_bytes: r.u32()?,
            features: r.u64()?,
            created_ns: r.i64()?,
        };
        r.finish()?;
        Ok(sb)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counters {
    /// Invariant: greater than every inode number ever handed out, so an
    /// (ino, generation) pair never repeats on this volume.
    pub next_ino: u64,
    pub inodes: u64,
}

impl Counters {
    pub fn encode(&self) -> Vec<u8> {
        let mut p = [0u8; 16];
        p[..8].copy_from_slice(&self.next_ino.to_be_bytes());
        p[8..].copy_from_slice(&self.inodes.to_be_bytes());
        seal(keys::COUNTERS, Kind::Counters, &p)
    }

    pub fn decode(record: &[u8]) -> Result<Self, FormatError> {
        let mut r = Reader::new(open(keys::COUNTERS, Kind::Counters, record)?);
        let c = Counters {
            next_ino: r.u64()?,
            inodes: r.u64()?,
        };
        r.finish()?;
        Ok(c)
    }
}

/// One session's share of the counters, written only by that session (a
/// daemon; session 0 on volumes one daemon serves), so that creates on
/// different mounts do not all rewrite `N`:
/// - inode numbers `[start, end)` are its block, reserved by moving
///   `N.next_ino` past it: it takes them one by one with no write of `N`
///   (the next one is in memory only; after a crash the rest of the block
///   is skipped, never reused);
/// - `inodes` is what it created minus what it freed since its count was
///   last folded into `N.inodes` (at its clean end, or by whoever
///   recovers after it). The inodes in use are `N.inodes` plus every
///   session's `inodes`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionCounters {
    pub start: u64,
    pub end: u64,
    pub inodes: i64,
}

impl SessionCounters {
    pub fn encode(&self, id: u64) -> Vec<u8> {
        let mut p = [0u8; 24];
        p[..8].copy_from_slice(&self.start.to_be_bytes());
        p[8..16].copy_from_slice(&self.end.to_be_bytes());
        p[16..].copy_from_slice(&self.inodes.to_be_bytes());
        seal(&keys::session(id), Kind::Session, &p)
    }

    pub fn decode(key: &[u8], record: &[u8]) -> Result<Self, FormatError> {
        let mut r = Reader::new(open(key, Kind::Session, record)?);
        let c = SessionCounters {
            start: r.u64()?,
            end: r.u64()?,
            inodes: r.i64()?,
        };
        r.finish()?;
        if c.start > c.end {
            return Err(FormatError::Malformed("inode block ends before it starts"));
        }
        Ok(c)
    }
}

/// Whether the volume was unmounted cleanly, written at mount (`clean =
/// false`) and as the last change of a clean unmount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MountState {
    pub clean: bool,
    pub pid: u32,
    pub since_ns: i64,
}

impl MountState {
    pub fn encode(&self) -> Vec<u8> {
        let mut p = [0u8; 13];
        p[0] = u8::from(self.clean);
        p[1..5].copy_from_slice(&self.pid.to_be_bytes());
        p[5..].copy_from_slice(&self.since_ns.to_be_bytes());
        seal(keys::MOUNT_STATE, Kind::MountState, &p)
    }

    pub fn decode(record: &[u8]) -> Result<Self, FormatError> {
        let mut r = Reader::new(open(keys::MOUNT_STATE, Kind::MountState, record)?);
        let m = MountState {
            clean: r.u8()? != 0,
            pid: r.u32()?,
            since_ns: r.i64()?,
        };
        r.finish()?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let sb = Superblock {
            format_version: 1,
            uuid: [7; 16],
            inline_bytes: 320,
            features: 0,
            created_ns: 42,
        };
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
        let c = Counters {
            next_ino: 9,
            inodes: 3,
        };
        assert_eq!(Counters::decode(&c.encode()).unwrap(), c);
        let s = SessionCounters {
            start: 1024,
            end: 2048,
            inodes: -3,
        };
        let k = keys::session(5);
        assert_eq!(SessionCounters::decode(&k, &s.encode(5)).unwrap(), s);
        // Bound to its session's key.
        assert!(SessionCounters::decode(&keys::session(6), &s.encode(5)).is_err());
        let bad = SessionCounters {
            start: 9,
            end: 8,
            inodes: 0,
        };
        assert!(SessionCounters::decode(&k, &bad.encode(5)).is_err());
        let m = MountState {
            clean: false,
            pid: 77,
            since_ns: -5,
        };
        assert_eq!(MountState::decode(&m.encode()).unwrap(), m);
    }
}
