//! The spill tier in pages.
//!
//! ZFS keeps what misses the bonus buffer in one spill block, rewritten
//! whole on every change. With a 64 KiB spill that makes a 32 B `setxattr`
//! on a file with many xattrs re-encode, checksum and store 64 KiB. Here the
//! spill tier is the same 64 KiB of packed xattrs, split into pages of at
//! most [`PAGE_BYTES`]: a change rewrites the one page its
//! name lives in, so its cost does not grow with the file's xattrs.
//!
//! Page 0 is the record `S ino` (a whole spill record of volumes made before
//! pages: it keeps working, it only takes no new entries while over
//! [`PAGE_BYTES`]); page `p ≥ 1` is `S ino p:u8`. All pages of an inode are
//! one range of adjacent keys, read together. An entry larger than a page
//! gets an empty page of its own, so values up to 64 KiB still spill.

use std::collections::HashMap;

use super::SPILL_MAX;
use super::envelope::{Kind, seal_with};
use super::xattrs::{SET_OVERHEAD, XattrSet};

/// Largest packed page that takes another entry. Small enough that a page
/// (sealed, even encrypted) stays inside an LMDB leaf node instead of
/// overflow pages of its own, and that encoding it costs about what the
/// rest of a `setxattr` does.
pub const PAGE_BYTES: usize = 1024;
/// Pages one inode's spill can have (page numbers are one byte): room for
/// the 64 KiB with pages half full.
pub const MAX_PAGES: usize = 128;

/// The spill tier of one inode: its pages, some possibly empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spill {
    pages: Vec<XattrSet>,
    /// Which page holds each name: one hash lookup instead of a search of
    /// every page (a name absent from the tier is the common question).
    index: HashMap<Vec<u8>, u8>,
    /// Invariant: Σ `packed_len` of the non-empty pages.
    packed: usize,
}

/// A set of page numbers (bit `p` = page `p`).
pub type PageMask = u128;

impl Spill {
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds the tier from its pages as read. Fails when a page number is
    /// out of range or repeated, or a name is in two pages.
    pub fn from_pages(
        pages: impl IntoIterator<Item = (usize, XattrSet)>,
    ) -> Result<Self, &'static str> {
        let mut s = Spill::new();
        for (p, set) in pages {
            if p >= MAX_PAGES {
                return Err("spill page number out of range");
            }
            if s.pages.len() <= p {
                s.pages.resize_with(p + 1, XattrSet::new);
            }
            if !s.pages[p].is_empty() {
                return Err("spill page read twice");
            }
            for n in set.names() {
                if s.index.insert(n.to_vec(), p as u8).is_some() {
                    return Err("an xattr in two spill pages");
                }
            }
            if !set.is_empty() {
                s.packed += set.packed_len();
            }
            s.pages[p] = set;
        }
        Ok(s)
    }

    pub fn is_empty(&self) -> bool {
        self.packed == 0
    }

    /// Σ of the pages' packed sizes: the inode's `spill_len`.
    pub fn packed_len(&self) -> usize {
        self.packed
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn page_of(&self, name: &[u8]) -> Option<usize> {
        self.index.get(name).map(|&p| usize::from(p))
    }

    pub fn contains(&self, name: &[u8]) -> bool {
        self.index.contains_key(name)
    }

    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.pages[self.page_of(name)?].get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &[u8]> {
        self.pages.iter().flat_map(XattrSet::names)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.pages.iter().flat_map(XattrSet::iter)
    }

    /// Page `p` (empty if it does not exist).
    pub fn page(&self, p: usize) -> Option<&XattrSet> {
        self.pages.get(p)
    }

    /// The pages that hold entries, with their numbers: what is stored.
    pub fn stored(&self) -> impl Iterator<Item = (usize, &XattrSet)> {
        self.pages.iter().enumerate().filter(|(_, s)| !s.is_empty())
    }

    /// Page `p` as its record under `key`; `None` when the page is empty
    /// (its record is deleted).
    pub fn sealed_page(&self, p: usize, key: &[u8]) -> Option<Vec<u8>> {
        let page = self.pages.get(p).filter(|s| !s.is_empty())?;
        Some(seal_with(key, Kind::Spill, page.packed_len(), |out| {
            page.encode_into(out)
        }))
    }

    /// The page numbers of `mask`, in order.
    pub fn pages_in(mask: PageMask) -> impl Iterator<Item = usize> {
        let mut rest = mask;
        std::iter::from_fn(move || {
            let p = rest.trailing_zeros() as usize;
            (rest != 0).then(|| {
                rest &= rest - 1;
                p
            })
        })
    }

    /// The page an entry of `need` bytes would go to: `prefer` if it has
    /// room, else the first page with room, else the first empty one; `None`
    /// if the tier is full.
    pub fn room(&self, need: usize, prefer: Option<usize>) -> Option<usize> {
        let fits = |p: usize| {
            let page = self.pages.get(p);
            let (len, empty) =
                page.map_or((SET_OVERHEAD, true), |s| (s.packed_len(), s.is_empty()));
            let grow = if empty { SET_OVERHEAD + need } else { need };
            self.packed + grow <= SPILL_MAX && (empty || len + need <= PAGE_BYTES)
        };
        if let Some(p) = prefer
            && fits(p)
        {
            return Some(p);
        }
        (0..self.pages.len())
            .find(|&p| !self.pages[p].is_empty() && fits(p))
            .or_else(|| {
                (0..MAX_PAGES).find(|&p| self.pages.get(p).is_none_or(|s| s.is_empty()) && fits(p))
            })
    }

    /// Puts `name` in page `p` (it must not be in another page).
    pub fn insert(&mut self, p: usize, name: Vec<u8>, value: Vec<u8>) {
        debug_assert!(self.page_of(&name).is_none_or(|q| q == p));
        if self.pages.len() <= p {
            self.pages.resize_with(p + 1, XattrSet::new);
        }
        self.index.insert(name.clone(), p as u8);
        let page = &mut self.pages[p];
        let before = if page.is_empty() {
            0
        } else {
            page.packed_len()
        };
        page.insert(name, value);
        self.packed = self.packed - before + page.packed_len();
    }

    /// Removes `name`; returns its page and value.
    pub fn remove(&mut self, name: &[u8]) -> Option<(usize, Vec<u8>)> {
        let p = usize::from(self.index.remove(name)?);
        let page = &mut self.pages[p];
        let before = page.packed_len();
        let v = page.remove(name)?;
        let after = if page.is_empty() {
            0
        } else {
            page.packed_len()
        };
        self.packed = self.packed - before + after;
        while self.pages.last().is_some_and(XattrSet::is_empty) {
            self.pages.pop();
        }
        Some((p, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::xattrs::entry_len as need;

    fn filled(n: usize, value: usize) -> Spill {
        let mut s = Spill::new();
        for i in 0..n {
            let name = format!("user.{i:05}").into_bytes();
            let v = vec![7u8; value];
            let p = s.room(need(&name, &v), None).expect("room");
            s.insert(p, name, v);
        }
        s
    }

    #[test]
    fn pages_stay_small_and_the_total_bounded() {
        let s = filled(1000, 40);
        assert!(s.packed_len() <= SPILL_MAX);
        for p in 0..MAX_PAGES {
            if let Some(page) = s.page(p) {
                assert!(page.packed_len() <= PAGE_BYTES, "page {p}");
            }
        }
        let sum: usize = (0..MAX_PAGES)
            .filter_map(|p| s.page(p))
            .filter(|p| !p.is_empty())
            .map(XattrSet::packed_len)
            .sum();
        assert_eq!(sum, s.packed_len());
    }

    #[test]
    fn a_full_tier_has_no_room() {
        let mut s = filled(0, 0);
        let mut n = 0;
        loop {
            let name = format!("user.{n:05}").into_bytes();
            let v = vec![1u8; 100];
            match s.room(need(&name, &v), None) {
                Some(p) => s.insert(p, name, v),
                None => break,
            }
            n += 1;
        }
        assert!(s.packed_len() <= SPILL_MAX);
        assert!(s.packed_len() + need(b"user.00000", &[1u8; 100]) > SPILL_MAX - PAGE_BYTES);
        assert_eq!(s.len(), n);
    }

    #[test]
    fn a_value_larger_than_a_page_gets_a_page_of_its_own() {
        let mut s = filled(10, 40);
        let big = vec![3u8; 20_000];
        let p = s.room(need(b"user.big", &big), None).expect("room");
        assert_eq!(p, 1, "page 0 holds the small ones");
        s.insert(p, b"user.big".to_vec(), big.clone());
        assert_eq!(s.get(b"user.big"), Some(&big[..]));
        // A page over PAGE_BYTES takes nothing more.
        assert_ne!(s.room(need(b"user.x", b"v"), Some(1)), Some(1));
    }

    #[test]
    fn removing_keeps_the_count_and_drops_trailing_empty_pages() {
        let mut s = filled(300, 40);
        let total = s.packed_len();
        let (p, v) = s.remove(b"user.00299").expect("there");
        assert_eq!(v, vec![7u8; 40]);
        assert_eq!(s.packed_len(), total - need(b"user.00299", &v));
        assert!(s.page(p).is_none() || !s.contains(b"user.00299"));
        for i in 0..299 {
            s.remove(format!("user.{i:05}").as_bytes()).expect("there");
        }
        assert!(s.is_empty());
        assert_eq!(s.packed_len(), 0);
        assert!(s.page(0).is_none());
    }

    #[test]
    fn pages_read_back_are_checked() {
        let mut a = XattrSet::new();
        a.insert(b"user.a".to_vec(), b"1".to_vec());
        let b = a.clone();
        assert!(Spill::from_pages([(0, a.clone()), (1, b)]).is_err());
        assert!(Spill::from_pages([(0, a.clone()), (0, a.clone())]).is_err());
        assert!(Spill::from_pages([(MAX_PAGES, a.clone())]).is_err());
        let s = Spill::from_pages([(3, a.clone())]).expect("ok");
        assert_eq!(s.page_of(b"user.a"), Some(3));
        assert_eq!(s.packed_len(), a.packed_len());
    }
}
