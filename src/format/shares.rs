//! A session's share of a directory's statistics (`T` dir session).
//!
//! On volumes several daemons serve, a change below a directory does not
//! rewrite the directory's inode to move its recursive counts: the
//! session that made it adds the change to its own share of that
//! directory, a record only it writes. A directory's statistics are its
//! inode's (`format::inode::DirStats`) plus every session's share, and a
//! share goes into the inode when its session ends (or when whoever
//! recovers after a dead one buries it). So changes in unrelated
//! directories on different mounts write no record in common, not even
//! their common ancestors' inodes.
//!
//! Payload: `files rfiles rsubdirs rbytes rblocks:i64 rctime:i64`: counts
//! as signed changes, `rctime` the newest change time the session saw
//! below (a maximum, not a change).

use super::FormatError;
use super::envelope::{Kind, Reader, open, seal};
use super::inode::DirStats;
use super::keys;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirShare {
    pub files: i64,
    pub rfiles: i64,
    pub rsubdirs: i64,
    pub rbytes: i64,
    pub rblocks: i64,
    pub rctime: i64,
}

impl DirShare {
    /// Both shares together.
    pub fn add(&mut self, o: &DirShare) {
        self.files += o.files;
        self.rfiles += o.rfiles;
        self.rsubdirs += o.rsubdirs;
        self.rbytes += o.rbytes;
        self.rblocks += o.rblocks;
        self.rctime = self.rctime.max(o.rctime);
    }

    /// `s` with this share in it.
    pub fn apply_to(&self, s: &mut DirStats) {
        s.files = s.files.saturating_add_signed(self.files);
        s.rfiles = s.rfiles.saturating_add_signed(self.rfiles);
        s.rsubdirs = s.rsubdirs.saturating_add_signed(self.rsubdirs);
        s.rbytes = s.rbytes.saturating_add_signed(self.rbytes);
        s.rblocks = s.rblocks.saturating_add_signed(self.rblocks);
        s.rctime = s.rctime.max(self.rctime);
    }

    /// Moves nothing (a share that may go).
    pub fn is_empty(&self) -> bool {
        *self == DirShare::default()
    }

    pub fn encode(&self, dir: u64, session: u64) -> Vec<u8> {
        let mut p = [0u8; 48];
        for (i, v) in [
            self.files,
            self.rfiles,
            self.rsubdirs,
            self.rbytes,
            self.rblocks,
            self.rctime,
        ]
        .iter()
        .enumerate()
        {
            p[i * 8..i * 8 + 8].copy_from_slice(&v.to_be_bytes());
        }
        seal(&keys::dir_share(dir, session), Kind::DirShare, &p)
    }

    pub fn decode(key: &[u8], record: &[u8]) -> Result<Self, FormatError> {
        let mut r = Reader::new(open(key, Kind::DirShare, record)?);
        let s = DirShare {
            files: r.i64()?,
            rfiles: r.i64()?,
            rsubdirs: r.i64()?,
            rbytes: r.i64()?,
            rblocks: r.i64()?,
            rctime: r.i64()?,
        };
        r.finish()?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_bound_to_its_key() {
        let s = DirShare {
            files: -1,
            rfiles: 5,
            rsubdirs: 0,
            rbytes: -70_000,
            rblocks: 8,
            rctime: 1_700_000_000,
        };
        let k = keys::dir_share(9, 3);
        assert_eq!(DirShare::decode(&k, &s.encode(9, 3)).unwrap(), s);
        assert!(DirShare::decode(&keys::dir_share(9, 4), &s.encode(9, 3)).is_err());
        let mut stats = DirStats {
            files: 1,
            rfiles: 1,
            rbytes: 100_000,
            rctime: 5,
            ..Default::default()
        };
        s.apply_to(&mut stats);
        assert_eq!(
            (
                stats.files,
                stats.rfiles,
                stats.rbytes,
                stats.rblocks,
                stats.rctime
            ),
            (0, 6, 30_000, 8, 1_700_000_000)
        );
        assert!(DirShare::default().is_empty());
        assert!(!s.is_empty());
    }
}
