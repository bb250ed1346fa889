//! Encrypted volumes: the keys and what they protect.
//!
//! ```text
//! passphrase ──Argon2id(salt, m, t, p)──▶ KEK ──AES-256-GCM unwrap──▶ master key (32 B, random)
//!                                                                       │ HKDF-SHA256(salt = volume uuid)
//!            ┌──────────────────────────────┬───────────────────────────┴──────────────┐
//!     "safs names v1" (64 B)      "safs records v1" (32 B)             "safs contents v1" (32 B)
//!     AES-256-SIV: names in keys  AES-256-GCM-SIV: every record value   AES-256-GCM: blocks, one
//!     (dirents, overflow xattrs), but the superblock and the key          per 4 KiB page
//!     deterministic per directory record
//!     / per inode
//! ```
//!
//! - The master key is random and never changes; the passphrase only wraps
//!   it ([`KeyRecord`], the `K` record), so `safs passwd` rewrites one record
//!   in one commit: a crash leaves the old or the new passphrase working.
//! - Names in keys are encrypted deterministically (AES-SIV with the parent
//!   directory, or the inode for xattr names, as associated data), so a
//!   lookup stays one point read of the encrypted name and equal names in
//!   different directories look different.
//! - Record values are sealed with AES-256-GCM-SIV under a random nonce,
//!   with the record's key as associated data: a value moved to another key,
//!   or changed, fails to open (EIO), never reads as another record.
//! - Key material is zeroized when dropped and never logged.

mod blocks;
mod keyfile;
mod keyspace;
mod names;
mod sealed;

use aes_gcm_siv::aead::{Aead, KeyInit, Payload};
use aes_gcm_siv::{Aes256GcmSiv, Nonce};
use hkdf::Hkdf;
use sha2::Sha256;
use zeroize::Zeroizing;

pub use blocks::{BLOCK_OVERHEAD, BlockCipher, BlockLayout};
pub use keyfile::{KdfParams, KeyRecord, tune_kdf};
pub use keyspace::Keyspace;
pub use names::{NAME_OVERHEAD, NameCipher, NameOf};
pub use sealed::SealedStore;

/// What can go wrong with keys and sealed data. Never carries key material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CryptoError {
    /// The passphrase does not unwrap the volume key.
    #[error("wrong passphrase")]
    WrongPassphrase,
    /// Sealed data failed authentication: changed, moved or truncated.
    #[error("authentication failed (the data was changed or moved)")]
    Tampered,
    #[error("key record: {0}")]
    BadKeyRecord(&'static str),
    #[error("no randomness from the kernel: {0}")]
    Random(String),
    #[error("key derivation: {0}")]
    Kdf(String),
}

/// Bytes a sealed record value adds: its nonce and its tag.
pub const SEAL_OVERHEAD: usize = 12 + 16;

/// Fills `buf` from the kernel's random source.
pub fn random(buf: &mut [u8]) -> Result<(), CryptoError> {
    getrandom::getrandom(buf).map_err(|e| CryptoError::Random(e.to_string()))
}

/// A volume's unwrapped keys, derived from its master key.
pub struct VolumeKeys {
    names: NameCipher,
    records: Aes256GcmSiv,
    blocks: BlockCipher,
}

impl VolumeKeys {
    /// Derives every key from `master` for the volume `uuid`, whose
    /// contents are sealed in the current layout.
    pub fn derive(master: &[u8; 32], uuid: &[u8; 16]) -> VolumeKeys {
        Self::derive_for(master, uuid, BlockLayout::PAGE)
    }

    /// [`VolumeKeys::derive`] for contents sealed in `layout`.
    pub fn derive_for(master: &[u8; 32], uuid: &[u8; 16], layout: BlockLayout) -> VolumeKeys {
        let hk = Hkdf::<Sha256>::new(Some(uuid), master);
        let mut names = Zeroizing::new([0u8; 64]);
        let mut records = Zeroizing::new([0u8; 32]);
        let mut contents = Zeroizing::new([0u8; 32]);
        // Lengths within HKDF-SHA256's limit (255 × 32 bytes): cannot fail.
        hk.expand(b"safs names v1", names.as_mut())
            .expect("HKDF length");
        hk.expand(b"safs records v1", records.as_mut())
            .expect("HKDF length");
        hk.expand(b"safs contents v1", contents.as_mut())
            .expect("HKDF length");
        VolumeKeys {
            names: NameCipher::new(&names),
            records: Aes256GcmSiv::new(records.as_ref().into()),
            blocks: BlockCipher::new(&contents, layout),
        }
    }

    pub fn names(&self) -> &NameCipher {
        &self.names
    }

    pub fn blocks(&self) -> &BlockCipher {
        &self.blocks
    }

    /// Seals a record value stored under `key`: nonce ‖ ciphertext ‖ tag.
    pub fn seal_record(&self, key: &[u8], value: &[u8]) -> Result<Vec<u8>, CryptoError> {
        let mut nonce = [0u8; 12];
        random(&mut nonce)?;
        let ct = self
            .records
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: value,
                    aad: key,
                },
            )
            .map_err(|_| CryptoError::Tampered)?;
        let mut out = Vec::with_capacity(12 + ct.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ct);
        Ok(out)
    }

    /// Opens a value [`VolumeKeys::seal_record`] sealed under `key`.
    pub fn open_record(&self, key: &[u8], sealed: &[u8]) -> Result<Vec<u8>, CryptoError> {
        if sealed.len() < SEAL_OVERHEAD {
            return Err(CryptoError::Tampered);
        }
        let (nonce, ct) = sealed.split_at(12);
        self.records
            .decrypt(Nonce::from_slice(nonce), Payload { msg: ct, aad: key })
            .map_err(|_| CryptoError::Tampered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> VolumeKeys {
        VolumeKeys::derive(&[7u8; 32], &[1u8; 16])
    }

    #[test]
    fn records_open_only_under_their_own_key() {
        let k = keys();
        let sealed = k
            .seal_record(b"I\0\0\0\0\0\0\0\x05", b"attributes")
            .unwrap();
        assert_eq!(sealed.len(), 10 + SEAL_OVERHEAD);
        assert_eq!(
            k.open_record(b"I\0\0\0\0\0\0\0\x05", &sealed).unwrap(),
            b"attributes"
        );
        // Moved to another key, changed, cut: refused.
        assert!(k.open_record(b"I\0\0\0\0\0\0\0\x06", &sealed).is_err());
        let mut flipped = sealed.clone();
        flipped[20] ^= 1;
        assert!(k.open_record(b"I\0\0\0\0\0\0\0\x05", &flipped).is_err());
        assert!(
            k.open_record(b"I\0\0\0\0\0\0\0\x05", &sealed[..20])
                .is_err()
        );
        // Another volume's keys (same master, other uuid) do not open it.
        let other = VolumeKeys::derive(&[7u8; 32], &[2u8; 16]);
        assert!(other.open_record(b"I\0\0\0\0\0\0\0\x05", &sealed).is_err());
        // Random nonces: sealing twice gives two different values.
        assert_ne!(
            k.seal_record(b"k", b"v").unwrap(),
            k.seal_record(b"k", b"v").unwrap()
        );
    }
}
