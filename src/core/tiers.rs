//! System-attribute xattr tiers: inline → spill → overflow.
//!
//! Modeled on ZFS `xattr=sa` (`module/zfs/sa.c`, `zpl_xattr.c`):
//!
//! - **inline**: small xattrs are packed into the inode record itself, up to
//!   the volume's inline budget (chosen at format, like `dnodesize`). One
//!   point read brings the attributes and these xattrs together.
//! - **spill**: what does not fit inline goes to the inode's spill tier,
//!   packed the same way, up to 64 KiB, in pages of about 1 KiB
//!   (`format::spill`). It is read only when a name is not inline, and a
//!   page is written only when its own contents change — so an `mtime` or
//!   inline change never rewrites it, and a change rewrites one page
//!   however many xattrs the file holds.
//! - **overflow**: a value that fits neither goes to a record of its own,
//!   keyed by inode and name. There is no per-file total limit (as on XFS and
//!   ZFS; ext4 stops at one 4 KiB block).
//!
//! Placement is decided per `setxattr`, greedily and incrementally: a new or
//! replaced value goes to the first tier with room for it (in the spill
//! tier, back to its own page if that has room, else the first page that
//! has). Nothing is moved
//! to make room (that would rewrite tiers the call did not touch); a later
//! removal may leave room unused, which costs space, never correctness.
//! The inode record counts its overflow records and stores the packed size of
//! the spill record, so an absent name is answered without reading either
//! tier when both are empty.

use crate::format::spill::{PageMask, Spill};
use crate::format::xattrs::{XattrSet, entry_len};

/// Which tiers a change touched; the caller writes exactly these.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Touched {
    pub inline: bool,
    /// The spill pages to write (or delete, when empty).
    pub spill: PageMask,
    /// `Some(Some(v))`: put the overflow record; `Some(None)`: delete it.
    pub overflow: Option<Option<Vec<u8>>>,
}

/// Where a name currently lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    Inline,
    Spill,
    Overflow,
}

pub fn locate(inline: &XattrSet, spill: &Spill, in_overflow: bool, name: &[u8]) -> Option<Tier> {
    if inline.contains(name) {
        Some(Tier::Inline)
    } else if spill.contains(name) {
        Some(Tier::Spill)
    } else if in_overflow {
        Some(Tier::Overflow)
    } else {
        None
    }
}

/// Sets `name` to `value`, wherever it was before. `in_overflow` says
/// whether an overflow record for `name` exists.
pub fn set(
    inline: &mut XattrSet,
    spill: &mut Spill,
    in_overflow: bool,
    budget: usize,
    name: &[u8],
    value: Vec<u8>,
) -> Touched {
    let was = spill.page_of(name);
    let mut t = remove(inline, spill, in_overflow, name);
    let need = entry_len(name, &value);
    if inline.packed_len() + need <= budget {
        inline.insert(name.to_vec(), value);
        t.inline = true;
    } else if let Some(p) = spill.room(need, was) {
        spill.insert(p, name.to_vec(), value);
        t.spill |= 1 << p;
    } else {
        t.overflow = Some(Some(value));
    }
    t
}

/// Removes `name` from whichever tier holds it.
pub fn remove(inline: &mut XattrSet, spill: &mut Spill, in_overflow: bool, name: &[u8]) -> Touched {
    let mut t = Touched::default();
    match locate(inline, spill, in_overflow, name) {
        Some(Tier::Inline) => {
            inline.remove(name);
            t.inline = true;
        }
        Some(Tier::Spill) => {
            if let Some((p, _)) = spill.remove(name) {
                t.spill |= 1 << p;
            }
        }
        Some(Tier::Overflow) => t.overflow = Some(None),
        None => {}
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone)]
    enum Op {
        Set(u8, usize),
        Remove(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (
                0u8..40,
                prop_oneof![
                    0usize..64,
                    0usize..64,
                    0usize..64,
                    64usize..400,
                    1000usize..20_000,
                    30_000usize..=65_536
                ]
            )
                .prop_map(|(n, s)| Op::Set(n, s)),
            (0u8..40).prop_map(Op::Remove),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Random xattr sets round-trip through inline / spill / overflow:
        /// every tier stays within its bound, names are never duplicated
        /// across tiers, every value reads back exactly, and writing only
        /// the pages a change touched keeps the stored pages equal to the
        /// tier.
        #[test]
        fn tiers_agree_with_model(budget in 0usize..1024, ops in proptest::collection::vec(op(), 1..60)) {
            let mut inline = XattrSet::new();
            let mut spill = Spill::new();
            let mut overflow: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            let mut stored: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
            for (i, op) in ops.into_iter().enumerate() {
                let apply = |t: Touched, name: &[u8], overflow: &mut BTreeMap<Vec<u8>, Vec<u8>>, spill: &Spill, stored: &mut BTreeMap<usize, Vec<u8>>| {
                    for p in Spill::pages_in(t.spill) {
                        match spill.page(p).filter(|s| !s.is_empty()) {
                            Some(page) => { stored.insert(p, page.encode()); }
                            None => { stored.remove(&p); }
                        }
                    }
                    match t.overflow {
                        Some(Some(v)) => { overflow.insert(name.to_vec(), v); }
                        Some(None) => { overflow.remove(name); }
                        None => {}
                    }
                };
                match op {
                    Op::Set(n, size) => {
                        let name = format!("user.n{n}").into_bytes();
                        let value: Vec<u8> = (0..size).map(|j| (i + j) as u8).collect();
                        let in_ov = overflow.contains_key(&name);
                        let t = set(&mut inline, &mut spill, in_ov, budget, &name, value.clone());
                        apply(t, &name, &mut overflow, &spill, &mut stored);
                        model.insert(name, value);
                    }
                    Op::Remove(n) => {
                        let name = format!("user.n{n}").into_bytes();
                        let in_ov = overflow.contains_key(&name);
                        let t = remove(&mut inline, &mut spill, in_ov, &name);
                        apply(t, &name, &mut overflow, &spill, &mut stored);
                        model.remove(&name);
                    }
                }
                prop_assert!(inline.packed_len() <= budget.max(crate::format::xattrs::SET_OVERHEAD));
                prop_assert!(spill.packed_len() <= crate::format::SPILL_MAX);
                let mut all: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
                for (k, v) in inline.iter().chain(spill.iter()) {
                    prop_assert!(all.insert(k.to_vec(), v.to_vec()).is_none(), "name in two tiers");
                }
                for (k, v) in &overflow {
                    prop_assert!(all.insert(k.clone(), v.clone()).is_none(), "name in two tiers");
                }
                prop_assert_eq!(&all, &model);
                let read = Spill::from_pages(
                    stored.iter().map(|(p, b)| (*p, XattrSet::decode(b).unwrap())),
                ).unwrap();
                prop_assert_eq!(read.iter().collect::<BTreeMap<_, _>>(), spill.iter().collect::<BTreeMap<_, _>>());
                prop_assert_eq!(read.packed_len(), spill.packed_len());
                // Encoded tiers decode to themselves.
                prop_assert_eq!(XattrSet::decode(&inline.encode()).unwrap(), inline.clone());
                for p in 0..crate::format::spill::MAX_PAGES {
                    if let Some(page) = spill.page(p) {
                        prop_assert!(page.packed_len() <= crate::format::spill::PAGE_BYTES || page.len() == 1);
                        prop_assert_eq!(&XattrSet::decode(&page.encode()).unwrap(), page);
                    }
                }
            }
        }
    }
}
