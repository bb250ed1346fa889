//! Encrypted volumes: the key record written at format, unlocking a volume
//! with its passphrase, and changing the passphrase (see `core::crypto`).

use std::sync::Arc;

use zeroize::Zeroizing;

use super::VolumeError;
use crate::core::crypto::{self, KdfParams, KeyRecord, SealedStore, VolumeKeys};
use crate::format::keys;
use crate::format::superblock::Superblock;
use crate::meta::{MetaRead, MetaStore, Write};

/// How to encrypt a new volume.
pub struct Encryption {
    pub passphrase: Zeroizing<Vec<u8>>,
    /// Argon2id's cost (see [`crypto::tune_kdf`]).
    pub kdf: KdfParams,
}

/// For a new encrypted volume: a random master key, wrapped under the
/// passphrase into the key record (added to `records`), and the engine
/// that seals the other records under it.
pub(super) fn seal_new_volume(
    store: Arc<dyn MetaStore>,
    sb: &Superblock,
    enc: &Encryption,
    records: &mut Vec<Write>,
) -> Result<Arc<dyn MetaStore>, VolumeError> {
    let mut master = Zeroizing::new([0u8; 32]);
    crypto::random(master.as_mut()).map_err(VolumeError::Crypto)?;
    let rec = KeyRecord::wrap(&master, &enc.passphrase, enc.kdf, &sb.uuid)
        .map_err(VolumeError::Crypto)?;
    records.push((keys::KEY_RECORD.to_vec(), Some(rec.encode())));
    Ok(Arc::new(SealedStore::new(store, keys_for(&master, sb))))
}

/// The key record of an encrypted volume.
pub fn key_record(store: &dyn MetaRead, sb: &Superblock) -> Result<KeyRecord, VolumeError> {
    if !sb.is_encrypted() {
        return Err(VolumeError::NotEncrypted);
    }
    let rec = store
        .get(keys::KEY_RECORD)?
        .ok_or(VolumeError::NoKeyRecord)?;
    KeyRecord::decode(&rec).map_err(VolumeError::Crypto)
}

/// The master key of the volume, if `passphrase` is its passphrase.
/// Reads only: a wrong passphrase leaves the volume as it was.
pub fn unlock(
    store: &dyn MetaRead,
    sb: &Superblock,
    passphrase: &[u8],
) -> Result<Zeroizing<[u8; 32]>, VolumeError> {
    key_record(store, sb)?
        .unwrap(passphrase, &sb.uuid)
        .map_err(|e| match e {
            crypto::CryptoError::WrongPassphrase => VolumeError::WrongPassphrase,
            e => VolumeError::Crypto(e),
        })
}

/// Every key of the volume, derived from its master key.
pub fn keys_for(master: &[u8; 32], sb: &Superblock) -> Arc<VolumeKeys> {
    Arc::new(VolumeKeys::derive_for(master, &sb.uuid, block_layout(sb)))
}

/// How the encrypted volume `sb` seals file contents.
pub fn block_layout(sb: &Superblock) -> crypto::BlockLayout {
    if sb.has_page_blocks() {
        crypto::BlockLayout::PAGE
    } else {
        crypto::BlockLayout::SPREAD
    }
}

/// Checks that `keys` are the volume's: its sealed counters record opens
/// under them.
pub fn check_keys(store: Arc<dyn MetaStore>, keys: &Arc<VolumeKeys>) -> Result<(), VolumeError> {
    let sealed = SealedStore::new(store, Arc::clone(keys));
    match sealed.get(keys::COUNTERS) {
        Ok(_) => Ok(()),
        Err(crate::meta::MetaError::Sealed(_)) => Err(VolumeError::WrongPassphrase),
        Err(e) => Err(e.into()),
    }
}

/// Re-wraps the master key under `new` (with `kdf`), after checking `old`:
/// one record in one commit, so a crash leaves the old or the new
/// passphrase working.
pub fn change_passphrase(
    store: &dyn MetaStore,
    sb: &Superblock,
    old: &[u8],
    new: &[u8],
    kdf: KdfParams,
) -> Result<(), VolumeError> {
    let master = unlock(store, sb, old)?;
    let rec = KeyRecord::wrap(&master, new, kdf, &sb.uuid).map_err(VolumeError::Crypto)?;
    store.commit(&[(keys::KEY_RECORD.to_vec(), Some(rec.encode()))])?;
    Ok(())
}
