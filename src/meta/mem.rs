//! An in-memory engine for unit tests of the core (not durable).

use std::collections::BTreeMap;

use parking_lot::RwLock;

use super::{MetaError, MetaRead, MetaStore, WriteRef};

#[derive(Default)]
pub struct MemStore {
    map: RwLock<BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl MemStore {
    pub fn new() -> Self {
        Self::default()
    }
}

impl MetaRead for MemStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, MetaError> {
        Ok(self.map.read().get(key).cloned())
    }

    fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, MetaError> {
        Ok(self
            .map
            .read()
            .range(start.to_vec()..end.to_vec())
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}

impl MetaStore for MemStore {
    fn commit_iter<'a>(
        &self,
        batch: &mut dyn Iterator<Item = WriteRef<'a>>,
    ) -> Result<(), MetaError> {
        let mut map = self.map.write();
        for (k, v) in batch {
            match v {
                Some(v) => map.insert(k.to_vec(), v.to_vec()),
                None => map.remove(k),
            };
        }
        Ok(())
    }

    fn disk_bytes(&self) -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn conformance() {
        super::super::conformance::run(&super::MemStore::new());
    }
}
