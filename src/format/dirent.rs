//! Directory entry records.
//!
//! `D parent name` → `ino:u64 kind:u8 cookie:u64` (lookup).
//! `C parent cookie` → `ino:u64 kind:u8 name` (readdir in cookie order).
//! Both are written and removed together in one batch.

use super::FormatError;
use super::envelope::{Kind, Reader, open, seal};

/// File type of an entry, as `d_type` wants it (`S_IFMT >> 12`).
pub type DType = u8;

/// Where an encoded entry holds its inode number (8 bytes, big-endian, as
/// in the inode's key): after the envelope's header. A lookup asks the
/// engine to follow it ([`crate::meta::MetaRead::get_and_follow`]).
pub const INO_AT: usize = 2;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dirent {
    pub ino: u64,
    pub kind: DType,
    pub cookie: u64,
}

impl Dirent {
    pub fn encode(&self, key: &[u8]) -> Vec<u8> {
        let mut p = [0u8; 17];
        p[..8].copy_from_slice(&self.ino.to_be_bytes());
        p[8] = self.kind;
        p[9..].copy_from_slice(&self.cookie.to_be_bytes());
        seal(key, Kind::Dirent, &p)
    }

    pub fn decode(key: &[u8], record: &[u8]) -> Result<Self, FormatError> {
        let mut r = Reader::new(open(key, Kind::Dirent, record)?);
        let d = Dirent {
            ino: r.u64()?,
            kind: r.u8()?,
            cookie: r.u64()?,
        };
        r.finish()?;
        Ok(d)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub ino: u64,
    pub kind: DType,
    pub name: Vec<u8>,
}

impl IndexEntry {
    pub fn encode(&self, key: &[u8]) -> Vec<u8> {
        let mut p = Vec::with_capacity(9 + self.name.len());
        p.extend_from_slice(&self.ino.to_be_bytes());
        p.push(self.kind);
        p.extend_from_slice(&self.name);
        seal(key, Kind::DirIndex, &p)
    }

    pub fn decode(key: &[u8], record: &[u8]) -> Result<Self, FormatError> {
        let mut r = Reader::new(open(key, Kind::DirIndex, record)?);
        let ino = r.u64()?;
        let kind = r.u8()?;
        let name = r.rest().to_vec();
        if name.is_empty() || name.len() > super::NAME_MAX {
            return Err(FormatError::Malformed("bad entry name length"));
        }
        Ok(IndexEntry { ino, kind, name })
    }
}

/// Symlink target record.
pub fn encode_symlink(key: &[u8], target: &[u8]) -> Vec<u8> {
    seal(key, Kind::Symlink, target)
}

pub fn decode_symlink(key: &[u8], record: &[u8]) -> Result<Vec<u8>, FormatError> {
    Ok(open(key, Kind::Symlink, record)?.to_vec())
}

/// Empty marker records (`O`, `W`).
pub fn encode_marker(key: &[u8]) -> Vec<u8> {
    seal(key, Kind::Marker, &[])
}

pub fn decode_marker(key: &[u8], record: &[u8]) -> Result<(), FormatError> {
    open(key, Kind::Marker, record).map(|_| ())
}

/// An `O` marker naming the session whose daemon held the file open, on
/// volumes several daemons serve: only that session's end reclaims it.
pub fn encode_orphan(key: &[u8], session: u64) -> Vec<u8> {
    seal(key, Kind::Marker, &session.to_be_bytes())
}

/// The session an `O` marker names (`None`: an untagged marker, written by
/// the only daemon of its volume).
pub fn decode_orphan(key: &[u8], record: &[u8]) -> Result<Option<u64>, FormatError> {
    let body = open(key, Kind::Marker, record)?;
    Ok(<[u8; 8]>::try_from(body).ok().map(u64::from_be_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::keys;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(ino in any::<u64>(), kind in any::<u8>(), cookie in any::<u64>(),
                      name in proptest::collection::vec(any::<u8>(), 1..=255)) {
            let k = keys::dirent(1, &name);
            let d = Dirent { ino, kind, cookie };
            let rec = d.encode(&k);
            prop_assert_eq!(Dirent::decode(&k, &rec).unwrap(), d);
            // The pointer an engine follows to the inode's key.
            prop_assert_eq!(
                crate::meta::pointer_key(&rec, INO_AT, keys::P_INODE),
                Some(keys::inode(ino))
            );
            let k = keys::dir_index(1, cookie);
            let e = IndexEntry { ino, kind, name };
            prop_assert_eq!(IndexEntry::decode(&k, &e.encode(&k)).unwrap(), e);
        }
    }
}
