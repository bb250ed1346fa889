//! An engine whose record values are sealed ([`VolumeKeys::seal_record`]):
//! what an encrypted volume's core reads and writes through. Values are
//! sealed on their way into the engine — in the group committer's thread,
//! off the request path — and opened on their way out; keys pass as the
//! core made them (names in them already encrypted, see `names`). The
//! superblock and the key record stay in the clear: they say that the
//! volume is encrypted and how to unlock it.

use std::sync::Arc;

use super::{SEAL_OVERHEAD, VolumeKeys};
use crate::core::error::describe_key;
use crate::format::keys;
use crate::meta::{EngineCounters, MetaError, MetaRead, MetaStore, Pairs, WriteRef};

pub struct SealedStore {
    inner: Arc<dyn MetaStore>,
    keys: Arc<VolumeKeys>,
}

/// Records that stay in the clear.
fn clear(key: &[u8]) -> bool {
    key == keys::SUPERBLOCK || key == keys::KEY_RECORD || key == keys::DATA_STORE
}

impl SealedStore {
    pub fn new(inner: Arc<dyn MetaStore>, keys: Arc<VolumeKeys>) -> Self {
        SealedStore { inner, keys }
    }

    fn open(&self, key: &[u8], value: Vec<u8>) -> Result<Vec<u8>, MetaError> {
        if clear(key) {
            return Ok(value);
        }
        self.keys.open_record(key, &value).map_err(|_| {
            let key = describe_key(key);
            tracing::error!(%key, "sealed record failed authentication");
            MetaError::Sealed(key)
        })
    }
}

impl MetaRead for SealedStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, MetaError> {
        self.inner.get(key)?.map(|v| self.open(key, v)).transpose()
    }

    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Pairs, MetaError> {
        self.inner
            .scan(start, end, limit)?
            .into_iter()
            .map(|(k, v)| {
                let v = self.open(&k, v)?;
                Ok((k, v))
            })
            .collect()
    }
}

/// A write with its value sealed.
type Sealed<'a> = (&'a [u8], Option<Vec<u8>>);

impl SealedStore {
    /// A batch's values sealed (those kept in the clear as they are).
    fn seal<'a>(
        &self,
        batch: &mut dyn Iterator<Item = WriteRef<'a>>,
    ) -> Result<Vec<Sealed<'a>>, MetaError> {
        let mut sealed = Vec::new();
        for (k, v) in batch {
            let v = match v {
                Some(v) if !clear(k) => Some(
                    self.keys
                        .seal_record(k, v)
                        .map_err(|e| MetaError::Engine(e.to_string()))?,
                ),
                Some(v) => Some(v.to_vec()),
                None => None,
            };
            sealed.push((k, v));
        }
        Ok(sealed)
    }
}

impl MetaStore for SealedStore {
    fn counters(&self) -> EngineCounters {
        self.inner.counters()
    }

    fn commit_iter<'a>(
        &self,
        batch: &mut dyn Iterator<Item = WriteRef<'a>>,
    ) -> Result<(), MetaError> {
        let sealed = self.seal(batch)?;
        self.inner
            .commit_iter(&mut sealed.iter().map(|(k, v)| (*k, v.as_deref())))
    }

    fn commit_iter_visible<'a>(
        &self,
        batch: &mut dyn Iterator<Item = WriteRef<'a>>,
    ) -> Result<(), MetaError> {
        let sealed = self.seal(batch)?;
        self.inner
            .commit_iter_visible(&mut sealed.iter().map(|(k, v)| (*k, v.as_deref())))
    }

    fn visible_before_durable(&self) -> bool {
        self.inner.visible_before_durable()
    }

    fn make_durable(&self) -> Result<(), MetaError> {
        self.inner.make_durable()
    }

    fn disk_bytes(&self) -> u64 {
        self.inner.disk_bytes()
    }

    fn write_bound(&self, key_len: usize, value_len: Option<usize>) -> u64 {
        self.inner
            .write_bound(key_len, value_len.map(|n| n + SEAL_OVERHEAD))
    }

    fn batch_bound(&self) -> u64 {
        self.inner.batch_bound()
    }

    fn hold(&self, bytes: u64) -> Result<u64, MetaError> {
        self.inner.hold(bytes)
    }

    fn shared(&self) -> Option<&dyn crate::meta::Shared> {
        self.inner.shared()
    }

    fn held(&self) -> u64 {
        self.inner.held()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::MemStore;

    #[test]
    fn values_are_sealed_at_rest_and_bound_to_their_keys() {
        let raw = Arc::new(MemStore::new());
        let keys = Arc::new(VolumeKeys::derive(&[1u8; 32], &[2u8; 16]));
        let s = SealedStore::new(raw.clone(), keys);
        s.commit(&[
            (b"Ia".to_vec(), Some(b"secret attributes".to_vec())),
            (b"V".to_vec(), Some(b"superblock".to_vec())),
        ])
        .unwrap();
        assert_eq!(s.get(b"Ia").unwrap().unwrap(), b"secret attributes");
        assert_eq!(
            raw.get(b"V").unwrap().unwrap(),
            b"superblock",
            "in the clear"
        );
        let at_rest = raw.get(b"Ia").unwrap().unwrap();
        assert!(!at_rest.windows(6).any(|w| w == b"secret"));
        // A sealed value moved to another key does not open.
        raw.commit(&[(b"Ib".to_vec(), Some(at_rest))]).unwrap();
        assert!(matches!(s.get(b"Ib"), Err(MetaError::Sealed(_))));
        assert!(s.scan(b"I", b"J", 10).is_err());
    }
}
