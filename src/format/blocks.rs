//! File contents in an object store: the block map and the store record.
//!
//! A file's contents are blocks of [`BLOCK`] bytes of its backing file (the
//! last one short), each stored as one immutable object whose key names
//! the inode, the block and a generation ([`object_key`]): a changed block
//! is a new object, never a rewrite, so no reader ever sees half of one.
//! On encrypted volumes the backing file holds sealed pages, so the store
//! only ever sees ciphertext.
//!
//! Blocks of zeros have no object and no record — a file's holes cost
//! nothing — except the last block, which is always recorded: it says
//! where the contents end.
//!
//! Block record (`B` ino block) payload:
//! ```text
//! gen   u64  the object's generation; 0: zeros (only the last block);
//!            INLINE: the bytes follow in the record (a file of at most
//!            INLINE_MAX bytes: no object, no request to the store)
//! len   u32  bytes of the block (BLOCK but for the last)
//! hash  16   the first 16 bytes of those bytes' BLAKE3 hash (SHA-256 in
//!            records of payload version 1, which older releases wrote):
//!            checks what comes back from the store and tells a changed
//!            block from an unchanged one
//! data  len  (INLINE only) the bytes
//! ```
//! A block keeps the hash it was recorded with until it changes: nothing
//! is hashed again to convert a volume.
//! Store record (`U`) payload: the URL, `s3://BUCKET[/PREFIX]` (never a
//! credential: those come from the environment of each node).

use super::FormatError;
use super::envelope::{Kind, Reader, open, open_version, seal, seal_version};
use super::keys;

/// Bytes per block: a request to an object store costs about the same up
/// to a few MiB (measured on radosgw: 4 KiB PUT 3.5 ms, 4 MiB 32 ms), while
/// rewriting a block for a small change stays bounded.
pub const BLOCK: u64 = 4 << 20;

/// The generation of a block kept in its record.
pub const INLINE: u64 = u64::MAX;
/// The largest file whose only block is kept in its record: a small file
/// costs a store request per write and per cold read otherwise (~3 ms
/// each on radosgw here), a record read costs a fraction of a millisecond.
pub const INLINE_MAX: u64 = 16 << 10;

/// The hash a block record names its bytes by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hash {
    /// Records of payload version 1.
    Sha256,
    /// Every block recorded since: each block is hashed when it is sent
    /// and when it comes back, and BLAKE3 takes a quarter of SHA-256's time
    /// (with SHA-NI) here — a core's worth of a 1 GiB write.
    Blake3,
}

impl Hash {
    /// The first 16 bytes of `data`'s hash.
    pub fn of(self, data: &[u8]) -> [u8; 16] {
        let mut h = self.hasher();
        h.update(data);
        h.finish()
    }

    fn version(self) -> u8 {
        match self {
            Hash::Sha256 => 1,
            Hash::Blake3 => 2,
        }
    }

    /// A hash of this kind made piece by piece, as bytes arrive.
    pub fn hasher(self) -> Hasher {
        match self {
            Hash::Sha256 => Hasher::Sha256(Box::default()),
            Hash::Blake3 => Hasher::Blake3(Box::default()),
        }
    }
}

/// [`Hash::of`] of bytes given in pieces.
pub enum Hasher {
    Sha256(Box<sha2::Sha256>),
    Blake3(Box<blake3::Hasher>),
}

impl Hasher {
    pub fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Sha256(h) => sha2::Digest::update(h.as_mut(), data),
            Hasher::Blake3(h) => {
                h.update(data);
            }
        }
    }

    /// The first 16 bytes of the hash of everything given.
    pub fn finish(self) -> [u8; 16] {
        match self {
            Hasher::Sha256(h) => sha2::Digest::finalize(*h)[..16]
                .try_into()
                .expect("16 bytes"),
            Hasher::Blake3(h) => h.finalize().as_bytes()[..16].try_into().expect("16 bytes"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockRef {
    pub generation: u64,
    pub len: u32,
    /// `kind`'s hash of the block's bytes.
    pub hash: [u8; 16],
    pub kind: Hash,
    /// The bytes, for an [`INLINE`] block.
    pub data: Option<Box<[u8]>>,
}

impl BlockRef {
    /// Whether the block is zeros, with no object behind it.
    pub fn is_zero(&self) -> bool {
        self.generation == 0
    }

    /// Whether an object in the store holds the block.
    pub fn has_object(&self) -> bool {
        self.generation != 0 && self.generation != INLINE
    }

    /// Whether `data` is the block's bytes (by its record's hash).
    pub fn holds(&self, data: &[u8]) -> bool {
        data.len() == self.len as usize && self.kind.of(data) == self.hash
    }

    /// Whether `data`, whose [`hash`] is `new`, is the block's bytes: the
    /// hash compared, or made again for a block recorded with another.
    pub fn holds_hashed(&self, data: &[u8], new: &[u8; 16]) -> bool {
        match self.kind {
            Hash::Blake3 => data.len() == self.len as usize && *new == self.hash,
            Hash::Sha256 => self.holds(data),
        }
    }

    pub fn encode(&self, key: &[u8]) -> Vec<u8> {
        let mut p = Vec::with_capacity(28 + self.data.as_ref().map_or(0, |d| d.len()));
        p.extend_from_slice(&self.generation.to_be_bytes());
        p.extend_from_slice(&self.len.to_be_bytes());
        p.extend_from_slice(&self.hash);
        if let Some(d) = &self.data {
            p.extend_from_slice(d);
        }
        seal_version(key, Kind::BlockRef, self.kind.version(), p.len(), |out| {
            out.extend_from_slice(&p)
        })
    }

    pub fn decode(key: &[u8], record: &[u8]) -> Result<Self, FormatError> {
        let (version, payload) = open_version(key, Kind::BlockRef, record)?;
        let mut r = Reader::new(payload);
        let mut b = BlockRef {
            generation: r.u64()?,
            len: r.u32()?,
            hash: r.bytes(16)?.try_into().expect("16 bytes"),
            kind: if version == 1 {
                Hash::Sha256
            } else {
                Hash::Blake3
            },
            data: None,
        };
        if b.generation == INLINE {
            let d = r.rest();
            if d.len() != b.len as usize || u64::from(b.len) > INLINE_MAX {
                return Err(FormatError::Malformed("inline block of the wrong length"));
            }
            b.data = Some(d.into());
        }
        r.finish()?;
        if u64::from(b.len) > BLOCK {
            return Err(FormatError::Malformed("block longer than a block"));
        }
        Ok(b)
    }
}

/// The hash blocks are recorded with now.
pub const HASH: Hash = Hash::Blake3;

/// [`HASH`] of `data`: what a block recorded now names its bytes by.
pub fn hash(data: &[u8]) -> [u8; 16] {
    HASH.of(data)
}

/// The key (under the store's prefix) of version `gen` of block `block`
/// of file `ino`. Spread by the inode's low byte, as backing files are.
pub fn object_key(ino: u64, block: u32, generation: u64) -> String {
    format!(
        "b/{:02x}/{ino:016x}/{block:08x}.{generation:016x}",
        ino & 0xff
    )
}

/// The prefix every [`object_key`] of file `ino` starts with.
pub fn object_prefix(ino: u64) -> String {
    format!("b/{:02x}/{ino:016x}/", ino & 0xff)
}

/// The inode, block and generation an [`object_key`] names; `None` for a
/// key no safs volume makes.
pub fn parse_object_key(key: &str) -> Option<(u64, u32, u64)> {
    let mut parts = key.strip_prefix("b/")?.split('/');
    let (spread, ino, rest) = (parts.next()?, parts.next()?, parts.next()?);
    let (block, generation) = rest.split_once('.')?;
    let sizes = (spread.len(), ino.len(), block.len(), generation.len());
    if parts.next().is_some() || sizes != (2, 16, 8, 16) {
        return None;
    }
    let ino = u64::from_str_radix(ino, 16).ok()?;
    let found = (
        ino,
        u32::from_str_radix(block, 16).ok()?,
        u64::from_str_radix(generation, 16).ok()?,
    );
    (u64::from_str_radix(spread, 16).ok()? == ino & 0xff
        && object_key(found.0, found.1, found.2) == key)
        .then_some(found)
}

pub fn encode_store(url: &str) -> Vec<u8> {
    seal(keys::DATA_STORE, Kind::DataStore, url.as_bytes())
}

pub fn decode_store(record: &[u8]) -> Result<String, FormatError> {
    let p = open(keys::DATA_STORE, Kind::DataStore, record)?;
    String::from_utf8(p.to_vec()).map_err(|_| FormatError::Malformed("store URL is not UTF-8"))
}

/// The doomed-object marker (`Q`): no payload, the key says it all.
pub fn encode_doomed(key: &[u8]) -> Vec<u8> {
    seal(key, Kind::Marker, &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_of_either_hash_decode_and_check_their_bytes() {
        // Known answers: the first 16 bytes of each hash of "abc".
        assert_eq!(
            hex::encode(Hash::Sha256.of(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223"
        );
        assert_eq!(
            hex::encode(Hash::Blake3.of(b"abc")),
            "6437b3ac38465133ffb63b75273a8db5"
        );
        assert_eq!(HASH, Hash::Blake3);
        let k = keys::block(7, 0);
        let (data, other) = (&b"some block bytes"[..], &b"some block bytez"[..]);
        for kind in [Hash::Sha256, Hash::Blake3] {
            let b = BlockRef {
                generation: 5,
                len: data.len() as u32,
                hash: kind.of(data),
                kind,
                data: None,
            };
            let back = BlockRef::decode(&k, &b.encode(&k)).unwrap();
            assert_eq!(back, b);
            assert!(back.holds(data) && !back.holds(other) && !back.holds(&data[1..]));
            assert!(back.holds_hashed(data, &hash(data)));
            assert!(!back.holds_hashed(other, &hash(other)));
        }
        // What releases before BLAKE3 wrote: payload version 1, SHA-256.
        let mut p = Vec::new();
        p.extend_from_slice(&5u64.to_be_bytes());
        p.extend_from_slice(&(data.len() as u32).to_be_bytes());
        p.extend_from_slice(&Hash::Sha256.of(data));
        let old = BlockRef::decode(&k, &seal(&k, Kind::BlockRef, &p)).unwrap();
        assert_eq!(old.kind, Hash::Sha256);
        assert!(old.holds(data) && old.holds_hashed(data, &hash(data)));
    }

    #[test]
    fn a_hash_made_in_pieces_is_the_hash_of_the_whole() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for kind in [Hash::Sha256, Hash::Blake3] {
            for piece in [1, 1000, 16384, 65536, data.len()] {
                let mut h = kind.hasher();
                data.chunks(piece).for_each(|c| h.update(c));
                assert_eq!(h.finish(), kind.of(&data), "{kind:?} in pieces of {piece}");
            }
            assert_eq!(kind.hasher().finish(), kind.of(b""));
        }
    }

    #[test]
    fn records_round_trip_and_refuse_another_key() {
        let k = keys::block(7, 3);
        let b = BlockRef {
            generation: 9,
            len: 100,
            hash: hash(b"abc"),
            kind: HASH,
            data: None,
        };
        assert_eq!(BlockRef::decode(&k, &b.encode(&k)), Ok(b.clone()));
        let i = BlockRef {
            generation: INLINE,
            len: 3,
            hash: hash(b"abc"),
            kind: HASH,
            data: Some(b"abc"[..].into()),
        };
        assert_eq!(BlockRef::decode(&k, &i.encode(&k)), Ok(i.clone()));
        let mut short = i.clone();
        short.len = 4;
        assert!(BlockRef::decode(&k, &short.encode(&k)).is_err());
        assert!(BlockRef::decode(&keys::block(7, 4), &b.encode(&k)).is_err());
        let url = "s3://bucket/pre/fix";
        assert_eq!(decode_store(&encode_store(url)).unwrap(), url);
        assert_eq!(
            object_key(0x1234, 2, 5),
            "b/34/0000000000001234/00000002.0000000000000005"
        );
        assert_eq!(
            parse_object_key("b/34/0000000000001234/00000002.0000000000000005"),
            Some((0x1234, 2, 5))
        );
        for foreign in [
            "b/35/0000000000001234/00000002.0000000000000005",
            "b/34/0000000000001234/00000002",
            "b/34/0000000000001234/00000002.000000000000000g",
            "b/34/0000000000001234/00000002.0000000000000005/x",
            "volume",
            "b/34/0000000000001234/0000002.00000000000000005",
        ] {
            assert_eq!(parse_object_key(foreign), None, "{foreign}");
        }
        let q = keys::doomed(0x1234, 2, 5);
        assert_eq!(
            (keys::key_ino(&q), keys::key_block(&q), keys::key_gen(&q)),
            (Some(0x1234), Some(2), Some(5))
        );
    }
}
