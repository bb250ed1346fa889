//! File contents: 4 KiB blocks, each sealed with AES-256-GCM under a
//! random 12-byte nonce, with the inode number and the block's index as
//! associated data (gocryptfs's scheme, with the inode number — never
//! reused in a volume — as the file id). A block changed, swapped with
//! another file's or moved within its file fails to open: the read gets
//! EIO, never wrong data. Replacing a block by an older version of the
//! same block of the same file is not detected (as with gocryptfs).
//!
//! On disk block `i` sits at `i × (BLOCK + BLOCK_OVERHEAD)`: nonce,
//! ciphertext, tag; the last block may be short. A block of zeros is a
//! hole (a sparse region never written) and reads as zeros.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use zeroize::Zeroizing;

use super::{CryptoError, random};

/// Plaintext bytes of a block.
pub const BLOCK: usize = 4096;
/// Bytes a block adds on disk: its nonce and its tag.
pub const BLOCK_OVERHEAD: usize = 12 + 16;

pub struct BlockCipher {
    gcm: Aes256Gcm,
}

fn aad(ino: u64, index: u64) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[..8].copy_from_slice(&ino.to_be_bytes());
    a[8..].copy_from_slice(&index.to_be_bytes());
    a
}

impl BlockCipher {
    pub fn new(key: &Zeroizing<[u8; 32]>) -> Self {
        BlockCipher {
            gcm: Aes256Gcm::new(key.as_ref().into()),
        }
    }

    /// Seals block `index` of inode `ino` (at most [`BLOCK`] bytes).
    pub fn seal(&self, ino: u64, index: u64, plain: &[u8]) -> Result<Vec<u8>, CryptoError> {
        debug_assert!(plain.len() <= BLOCK);
        let mut nonce = [0u8; 12];
        random(&mut nonce)?;
        let a = aad(ino, index);
        let ct = self
            .gcm
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: plain,
                    aad: &a,
                },
            )
            .map_err(|_| CryptoError::Tampered)?;
        let mut out = Vec::with_capacity(12 + ct.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ct);
        Ok(out)
    }

    /// Opens block `index` of inode `ino` as read from disk. All zeros is
    /// a hole: zeros of the plaintext length.
    pub fn open(&self, ino: u64, index: u64, sealed: &[u8]) -> Result<Vec<u8>, CryptoError> {
        if sealed.len() < BLOCK_OVERHEAD || sealed.len() > BLOCK + BLOCK_OVERHEAD {
            return Err(CryptoError::Tampered);
        }
        if sealed.iter().all(|&b| b == 0) {
            return Ok(vec![0; sealed.len() - BLOCK_OVERHEAD]);
        }
        let (nonce, ct) = sealed.split_at(12);
        let a = aad(ino, index);
        self.gcm
            .decrypt(Nonce::from_slice(nonce), Payload { msg: ct, aad: &a })
            .map_err(|_| CryptoError::Tampered)
    }
}

/// The on-disk size of a file of `plain` bytes.
pub fn sealed_len(plain: u64) -> u64 {
    let full = plain / BLOCK as u64;
    let rest = plain % BLOCK as u64;
    full * (BLOCK + BLOCK_OVERHEAD) as u64
        + if rest > 0 {
            rest + BLOCK_OVERHEAD as u64
        } else {
            0
        }
}

/// The plaintext size of a file whose backing file is `sealed` bytes
/// (`None` if no file of blocks has that size).
pub fn plain_len(sealed: u64) -> Option<u64> {
    let unit = (BLOCK + BLOCK_OVERHEAD) as u64;
    let full = sealed / unit;
    let rest = sealed % unit;
    match rest {
        0 => Some(full * BLOCK as u64),
        r if r > BLOCK_OVERHEAD as u64 => Some(full * BLOCK as u64 + r - BLOCK_OVERHEAD as u64),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_open_only_where_they_were_sealed() {
        let c = BlockCipher::new(&Zeroizing::new([9u8; 32]));
        let data = vec![0x42u8; BLOCK];
        let s = c.seal(10, 3, &data).unwrap();
        assert_eq!(s.len(), BLOCK + BLOCK_OVERHEAD);
        assert_eq!(c.open(10, 3, &s).unwrap(), data);
        assert!(c.open(10, 4, &s).is_err(), "moved within the file");
        assert!(c.open(11, 3, &s).is_err(), "swapped into another file");
        let mut f = s.clone();
        f[100] ^= 0x80;
        assert!(c.open(10, 3, &f).is_err(), "a flipped bit");
        // A hole reads as zeros; a short last block round-trips.
        assert_eq!(
            c.open(10, 0, &[0u8; 100 + BLOCK_OVERHEAD]).unwrap(),
            vec![0u8; 100]
        );
        let short = c.seal(10, 5, b"tail").unwrap();
        assert_eq!(c.open(10, 5, &short).unwrap(), b"tail");
    }

    #[test]
    fn sizes_convert_both_ways() {
        for plain in [0u64, 1, 4095, 4096, 4097, 8192, 1 << 20, (1 << 20) + 3] {
            assert_eq!(plain_len(sealed_len(plain)), Some(plain), "{plain}");
        }
        assert_eq!(plain_len(5), None, "shorter than a block's overhead");
    }
}
