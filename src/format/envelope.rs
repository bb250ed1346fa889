//! The envelope every record travels in.
//!
//! ```text
//! offset  size  field
//! 0       1     kind      (which record layout follows; see `Kind`)
//! 1       1     version   (payload layout version of that kind)
//! 2       n     payload
//! 2+n     4     crc32c    (big-endian) over key ‖ kind ‖ version ‖ payload
//! ```

use thiserror::Error;

/// Record kinds. Frozen: values are on disk and never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Superblock = 1,
    Counters = 2,
    Inode = 3,
    Spill = 4,
    Overflow = 5,
    Dirent = 6,
    DirIndex = 7,
    Symlink = 8,
    Marker = 9,
    MountState = 10,
    BlockRef = 11,
    DataStore = 12,
    Session = 13,
    DirShare = 14,
}

/// Current payload version of every kind but those [`newest`] names.
pub const PAYLOAD_VERSION: u8 = 1;

/// The newest payload version of `kind` this build reads.
fn newest(kind: Kind) -> u8 {
    match kind {
        // 2: the block's hash is BLAKE3's, not SHA-256's.
        Kind::BlockRef => 2,
        _ => PAYLOAD_VERSION,
    }
}
const HEADER: usize = 2;
const TRAILER: usize = 4;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FormatError {
    #[error("record too short ({0} bytes)")]
    Truncated(usize),
    #[error("checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("unexpected record kind {found} (wanted {wanted})")]
    WrongKind { found: u8, wanted: u8 },
    #[error("record version {0} is newer than this build understands")]
    NewerVersion(u8),
    #[error("malformed payload: {0}")]
    Malformed(&'static str),
}

fn checksum(key: &[u8], head: &[u8], payload: &[u8]) -> u32 {
    let c = crc32c::crc32c(key);
    let c = crc32c::crc32c_append(c, head);
    crc32c::crc32c_append(c, payload)
}

/// Wraps `payload` for storage under `key`.
pub fn seal(key: &[u8], kind: Kind, payload: &[u8]) -> Vec<u8> {
    seal_with(key, kind, payload.len(), |out| {
        out.extend_from_slice(payload)
    })
}

/// [`seal`] of the payload `write` appends (about `len` bytes), encoded in
/// place: no copy of a large payload.
pub fn seal_with(key: &[u8], kind: Kind, len: usize, write: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    seal_version(key, kind, PAYLOAD_VERSION, len, write)
}

/// [`seal_with`] in payload version `version` of `kind`'s layout.
pub fn seal_version(
    key: &[u8],
    kind: Kind,
    version: u8,
    len: usize,
    write: impl FnOnce(&mut Vec<u8>),
) -> Vec<u8> {
    debug_assert!((1..=newest(kind)).contains(&version));
    let mut out = Vec::with_capacity(HEADER + len + TRAILER);
    out.push(kind as u8);
    out.push(version);
    write(&mut out);
    let crc = checksum(key, &out[..HEADER], &out[HEADER..]);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

/// Checks the envelope of a record read under `key` and returns its payload.
pub fn open<'a>(key: &[u8], kind: Kind, record: &'a [u8]) -> Result<&'a [u8], FormatError> {
    open_version(key, kind, record).map(|(_, p)| p)
}

/// [`open`], with the payload's layout version.
pub fn open_version<'a>(
    key: &[u8],
    kind: Kind,
    record: &'a [u8],
) -> Result<(u8, &'a [u8]), FormatError> {
    if record.len() < HEADER + TRAILER {
        return Err(FormatError::Truncated(record.len()));
    }
    let (body, tail) = record.split_at(record.len() - TRAILER);
    let stored = u32::from_be_bytes([tail[0], tail[1], tail[2], tail[3]]);
    let computed = checksum(key, &body[..HEADER], &body[HEADER..]);
    if stored != computed {
        return Err(FormatError::Checksum { stored, computed });
    }
    if body[0] != kind as u8 {
        return Err(FormatError::WrongKind {
            found: body[0],
            wanted: kind as u8,
        });
    }
    if body[1] > newest(kind) {
        return Err(FormatError::NewerVersion(body[1]));
    }
    Ok((body[1], &body[HEADER..]))
}

/// A bounds-checked big-endian reader over a payload.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        if self.buf.len() < n {
            return Err(FormatError::Malformed("field runs past the end"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    pub fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.bytes(1)?[0])
    }

    pub fn u16(&mut self) -> Result<u16, FormatError> {
        let b = self.bytes(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub fn u32(&mut self) -> Result<u32, FormatError> {
        let b = self.bytes(4)?;
        Ok(u32::from_be_bytes(b.try_into().expect("4 bytes")))
    }

    pub fn u64(&mut self) -> Result<u64, FormatError> {
        let b = self.bytes(8)?;
        Ok(u64::from_be_bytes(b.try_into().expect("8 bytes")))
    }

    pub fn i64(&mut self) -> Result<i64, FormatError> {
        Ok(self.u64()? as i64)
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }

    pub fn finish(self) -> Result<(), FormatError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(FormatError::Malformed("trailing bytes"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wrong_key_is_caught() {
        let rec = seal(b"I1", Kind::Inode, b"payload");
        assert_eq!(open(b"I1", Kind::Inode, &rec).unwrap(), b"payload");
        assert!(matches!(
            open(b"I2", Kind::Inode, &rec),
            Err(FormatError::Checksum { .. })
        ));
        assert!(matches!(
            open(b"I1", Kind::Spill, &rec),
            Err(FormatError::WrongKind { .. })
        ));
    }

    proptest! {
        #[test]
        fn any_single_bit_flip_is_detected(payload in proptest::collection::vec(any::<u8>(), 0..300), bit in any::<usize>()) {
            let mut rec = seal(b"key", Kind::Spill, &payload);
            let bit = bit % (rec.len() * 8);
            rec[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(open(b"key", Kind::Spill, &rec).is_err());
        }

        #[test]
        fn open_never_panics(rec in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = open(b"k", Kind::Inode, &rec);
        }
    }
}
