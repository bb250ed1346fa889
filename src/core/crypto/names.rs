//! Names in keys: AES-256-SIV, deterministic, with the directory (or, for
//! an xattr name, the inode) as associated data — so a lookup encrypts the
//! name and reads one key, equal names in two directories differ, and a
//! name moved under another directory does not decrypt.
//!
//! An encrypted name is the 16-byte synthetic IV followed by a ciphertext
//! as long as the name: a 255-byte name becomes 271 bytes, and a key of a
//! prefix, an inode number and such a name stays far below LMDB's 511.

use aes_siv::Aes256SivAead;
use aes_siv::aead::{Aead, KeyInit, Payload};
use zeroize::Zeroizing;

use super::CryptoError;

/// Bytes an encrypted name adds.
pub const NAME_OVERHEAD: usize = 16;

/// What a name is encrypted for: an entry of a directory, or an xattr of
/// an inode (so the two never share ciphertexts).
#[derive(Clone, Copy, Debug)]
pub enum NameOf {
    Entry { parent: u64 },
    Xattr { ino: u64 },
}

impl NameOf {
    fn aad(self) -> [u8; 9] {
        let (tag, id) = match self {
            NameOf::Entry { parent } => (b'D', parent),
            NameOf::Xattr { ino } => (b'X', ino),
        };
        let mut a = [0u8; 9];
        a[0] = tag;
        a[1..].copy_from_slice(&id.to_be_bytes());
        a
    }
}

pub struct NameCipher {
    siv: Aes256SivAead,
}

impl NameCipher {
    pub fn new(key: &Zeroizing<[u8; 64]>) -> Self {
        NameCipher {
            siv: Aes256SivAead::new(key.as_ref().into()),
        }
    }

    /// The encrypted form of `name` as `of`: the same every time.
    pub fn encrypt(&self, of: NameOf, name: &[u8]) -> Vec<u8> {
        let aad = of.aad();
        // The nonce of the AEAD interface is more associated data for SIV;
        // a fixed one keeps the result deterministic.
        self.siv
            .encrypt(
                &Default::default(),
                Payload {
                    msg: name,
                    aad: &aad,
                },
            )
            .expect("AES-SIV encryption of a short name cannot fail")
    }

    /// The name an encrypted name stands for, if it decrypts as `of`.
    pub fn decrypt(&self, of: NameOf, enc: &[u8]) -> Result<Vec<u8>, CryptoError> {
        let aad = of.aad();
        self.siv
            .decrypt(
                &Default::default(),
                Payload {
                    msg: enc,
                    aad: &aad,
                },
            )
            .map_err(|_| CryptoError::Tampered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_per_directory_and_bound_to_it() {
        let c = NameCipher::new(&Zeroizing::new([3u8; 64]));
        let d1 = NameOf::Entry { parent: 1 };
        let d2 = NameOf::Entry { parent: 2 };
        let a = c.encrypt(d1, b"report.txt");
        assert_eq!(a, c.encrypt(d1, b"report.txt"), "lookups find it");
        assert_ne!(a, c.encrypt(d2, b"report.txt"), "other directory");
        assert_ne!(a, c.encrypt(NameOf::Xattr { ino: 1 }, b"report.txt"));
        assert_eq!(a.len(), 10 + NAME_OVERHEAD);
        assert_eq!(c.decrypt(d1, &a).unwrap(), b"report.txt");
        assert!(c.decrypt(d2, &a).is_err(), "moved under another directory");
        let long = vec![b'n'; 255];
        assert_eq!(c.encrypt(d1, &long).len(), 255 + NAME_OVERHEAD);
        assert!(!a.windows(6).any(|w| w == b"report"), "no plaintext");
    }
}
