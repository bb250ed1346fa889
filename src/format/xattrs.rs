//! Packed xattr sets: the layout of the inline SA area and of spill records.
//!
//! ```text
//! count:u32
//! count × { name_len:u8  value_len:u32  name  value }   (sorted by name)
//! ```
//!
//! The same packing serves both tiers, so moving an xattr between them is a
//! map operation; [`XattrSet::packed_len`] is the size the tier budgets count.

use std::collections::BTreeMap;

use super::FormatError;
use super::envelope::Reader;

/// Bytes one entry adds to a packed set besides its name and value.
pub const ENTRY_OVERHEAD: usize = 1 + 4;
/// Bytes an empty packed set takes.
pub const SET_OVERHEAD: usize = 4;

/// An ordered name → value map with a known packed size.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct XattrSet {
    map: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Invariant: equals `SET_OVERHEAD + Σ entry_len(name, value)`.
    packed: usize,
}

pub fn entry_len(name: &[u8], value: &[u8]) -> usize {
    ENTRY_OVERHEAD + name.len() + value.len()
}

impl XattrSet {
    pub fn new() -> Self {
        Self {
            map: BTreeMap::new(),
            packed: SET_OVERHEAD,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn packed_len(&self) -> usize {
        self.packed
    }

    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.map.get(name).map(Vec::as_slice)
    }

    pub fn contains(&self, name: &[u8]) -> bool {
        self.map.contains_key(name)
    }

    pub fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let add = entry_len(&name, &value);
        if let Some(old) = self.map.insert(name.clone(), value) {
            self.packed -= entry_len(&name, &old);
        }
        self.packed += add;
    }

    pub fn remove(&mut self, name: &[u8]) -> Option<Vec<u8>> {
        let old = self.map.remove(name)?;
        self.packed -= entry_len(name, &old);
        Some(old)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.map.iter().map(|(k, v)| (k.as_slice(), v.as_slice()))
    }

    pub fn names(&self) -> impl Iterator<Item = &[u8]> {
        self.map.keys().map(Vec::as_slice)
    }

    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.reserve(self.packed);
        out.extend_from_slice(&(self.map.len() as u32).to_be_bytes());
        for (name, value) in &self.map {
            out.push(name.len() as u8);
            out.extend_from_slice(&(value.len() as u32).to_be_bytes());
            out.extend_from_slice(name);
            out.extend_from_slice(value);
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }

    pub fn decode_from(r: &mut Reader<'_>) -> Result<Self, FormatError> {
        let count = r.u32()?;
        let mut set = XattrSet::new();
        let mut prev: Option<Vec<u8>> = None;
        for _ in 0..count {
            let name_len = usize::from(r.u8()?);
            let value_len = r.u32()? as usize;
            if name_len == 0 {
                return Err(FormatError::Malformed("empty xattr name"));
            }
            if value_len > super::XATTR_SIZE_MAX {
                return Err(FormatError::Malformed("xattr value over 64 KiB"));
            }
            let name = r.bytes(name_len)?.to_vec();
            let value = r.bytes(value_len)?.to_vec();
            if prev.as_ref().is_some_and(|p| *p >= name) {
                return Err(FormatError::Malformed("xattr names out of order"));
            }
            prev = Some(name.clone());
            set.insert(name, value);
        }
        Ok(set)
    }

    pub fn decode(buf: &[u8]) -> Result<Self, FormatError> {
        let mut r = Reader::new(buf);
        let set = Self::decode_from(&mut r)?;
        r.finish()?;
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_set() -> impl Strategy<Value = XattrSet> {
        proptest::collection::btree_map(
            proptest::collection::vec(any::<u8>(), 1..40),
            proptest::collection::vec(any::<u8>(), 0..200),
            0..12,
        )
        .prop_map(|m| {
            let mut s = XattrSet::new();
            for (k, v) in m {
                s.insert(k, v);
            }
            s
        })
    }

    proptest! {
        #[test]
        fn round_trip_and_size(set in arb_set()) {
            let enc = set.encode();
            prop_assert_eq!(enc.len(), set.packed_len());
            prop_assert_eq!(XattrSet::decode(&enc).unwrap(), set);
        }

        #[test]
        fn decode_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = XattrSet::decode(&buf);
        }
    }
}
