//! Where records live on a volume that may be encrypted: the key schema of
//! `format::keys`, with the names inside keys (directory entries, overflow
//! xattrs) encrypted when the volume is. Core and fsck build every key that
//! holds a name through here, so no plaintext name reaches the engine.

use std::sync::Arc;

use super::{CryptoError, NameOf, VolumeKeys};
use crate::format::keys;

/// The key schema of one volume. Cheap to clone.
#[derive(Clone, Default)]
pub struct Keyspace {
    keys: Option<Arc<VolumeKeys>>,
}

impl Keyspace {
    /// Plain names (an unencrypted volume).
    pub fn plain() -> Self {
        Keyspace { keys: None }
    }

    /// Names encrypted under `keys`.
    pub fn encrypted(keys: Arc<VolumeKeys>) -> Self {
        Keyspace { keys: Some(keys) }
    }

    pub fn is_encrypted(&self) -> bool {
        self.keys.is_some()
    }

    /// The `D` key of entry `name` of directory `parent`.
    pub fn dirent(&self, parent: u64, name: &[u8]) -> Vec<u8> {
        match &self.keys {
            None => keys::dirent(parent, name),
            Some(k) => keys::dirent(parent, &k.names().encrypt(NameOf::Entry { parent }, name)),
        }
    }

    /// The `X` key of xattr `name` of inode `ino`.
    pub fn overflow(&self, ino: u64, name: &[u8]) -> Vec<u8> {
        match &self.keys {
            None => keys::overflow(ino, name),
            Some(k) => keys::overflow(ino, &k.names().encrypt(NameOf::Xattr { ino }, name)),
        }
    }

    /// The entry name a `D` key holds.
    pub fn entry_name(&self, key: &[u8]) -> Result<Vec<u8>, CryptoError> {
        self.name_in(key, |parent| NameOf::Entry { parent })
    }

    /// The xattr name an `X` key holds.
    pub fn xattr_name(&self, key: &[u8]) -> Result<Vec<u8>, CryptoError> {
        self.name_in(key, |ino| NameOf::Xattr { ino })
    }

    fn name_in(&self, key: &[u8], of: impl FnOnce(u64) -> NameOf) -> Result<Vec<u8>, CryptoError> {
        let name = keys::key_name(key);
        match &self.keys {
            None => Ok(name.to_vec()),
            Some(k) => {
                let id = keys::key_ino(key).ok_or(CryptoError::Tampered)?;
                k.names().decrypt(of(id), name)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_keys_round_trip_and_stay_apart() {
        let plain = Keyspace::plain();
        assert_eq!(plain.dirent(5, b"a"), keys::dirent(5, b"a"));
        assert_eq!(plain.entry_name(&plain.dirent(5, b"a")).unwrap(), b"a");
        let enc = Keyspace::encrypted(Arc::new(VolumeKeys::derive(&[4; 32], &[6; 16])));
        let d = enc.dirent(5, b"notes.txt");
        assert_eq!(keys::key_ino(&d), Some(5), "still sorted under its parent");
        assert!(!d.windows(5).any(|w| w == b"notes"));
        assert_eq!(enc.entry_name(&d).unwrap(), b"notes.txt");
        let x = enc.overflow(5, b"user.big");
        assert_eq!(enc.xattr_name(&x).unwrap(), b"user.big");
        // A name moved to another parent, or read as the other kind, fails.
        let mut moved = d.clone();
        moved[1..9].copy_from_slice(&6u64.to_be_bytes());
        assert!(enc.entry_name(&moved).is_err());
        assert!(enc.xattr_name(&d).is_err());
    }
}
