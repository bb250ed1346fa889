//! The directory cache (pefs's dircache): per directory, the entries
//! lookups and listings have met — by name, and in cookie order — so that
//! a lookup, a negative lookup before a create, an emptiness check and a
//! whole listing cost no engine read and, on encrypted volumes, no name
//! encryption and no record decryption.
//!
//! A view is filled by lookups (one name at a time) and by listings from
//! the start (a contiguous prefix of cookies; the whole directory once a
//! listing reaches its end: the view is then *complete* and answers
//! "no such name" too). Every change to a directory bumps its view's
//! generation and is applied to the view in place, under the state lock,
//! when the change is applied to the store. A listing scans the engine
//! without that lock, so it fills the view only if the generation it saw
//! before the scan is still the view's: a change meanwhile (or an eviction
//! and a new view: generations come from one counter and never repeat)
//! makes the fill be dropped, never half-applied.
//!
//! Bounded in bytes (an estimate per entry: its name twice over, the maps'
//! overhead); least recently used directories go first. A directory too big
//! for a share of the budget is not cached at all and costs what it costs
//! without the cache.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use lru::LruCache;

use crate::format::dirent::Dirent;

/// What one cached entry is charged (beyond its name, counted twice).
const ENTRY_COST: usize = 128;
/// What an empty view is charged.
const VIEW_COST: usize = 256;

/// A generation: the version of one directory's view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gen(u64);

struct View {
    generation: Gen,
    /// Entries met, by name: every entry once `complete`.
    names: HashMap<Arc<[u8]>, Dirent>,
    /// Entries by cookie, for every cookie up to `listed` (a listing from
    /// the start has reached it; every one when `complete`).
    order: BTreeMap<u64, Arc<[u8]>>,
    listed: u64,
    complete: bool,
    bytes: usize,
}

impl View {
    fn new(generation: Gen) -> Self {
        View {
            generation,
            names: HashMap::new(),
            order: BTreeMap::new(),
            listed: 0,
            complete: false,
            bytes: VIEW_COST,
        }
    }

    fn cost(name: &[u8]) -> usize {
        ENTRY_COST + 2 * name.len()
    }

    /// Records entry `name`; returns the bytes it added.
    fn put(&mut self, name: &[u8], d: Dirent) -> isize {
        let mut delta = 0isize;
        let key: Arc<[u8]> = match self.names.get_key_value(name) {
            Some((k, old)) => {
                let k = Arc::clone(k);
                if old.cookie != d.cookie && self.order.remove(&old.cookie).is_some() {
                    delta -= Self::cost(name) as isize / 2;
                }
                k
            }
            None => {
                delta += Self::cost(name) as isize / 2;
                Arc::from(name)
            }
        };
        if self.complete || d.cookie <= self.listed {
            match self.order.insert(d.cookie, Arc::clone(&key)) {
                None => delta += Self::cost(name) as isize / 2,
                Some(old) if *old == *name => {}
                // Cookies are unique in a directory; kept exact regardless.
                Some(old) => {
                    delta += Self::cost(name) as isize / 2 - Self::cost(&old) as isize / 2;
                }
            }
        }
        self.names.insert(key, d);
        delta
    }

    fn remove(&mut self, name: &[u8], cookie: u64) -> isize {
        let mut delta = 0isize;
        if self.names.remove(name).is_some() {
            delta -= Self::cost(name) as isize / 2;
        }
        if self.order.get(&cookie).is_some_and(|n| **n == *name) {
            self.order.remove(&cookie);
            delta -= Self::cost(name) as isize / 2;
        }
        delta
    }
}

/// What a lookup in the cache found.
pub enum Found {
    Entry(Dirent),
    /// The view is complete and has no such name.
    Absent,
    /// Not known: ask the engine.
    Unknown,
}

/// One listed entry: cookie, inode, type, name.
pub type Listed = (u64, u64, u8, Arc<[u8]>);

pub struct DirCache {
    views: LruCache<u64, View>,
    bytes: usize,
    budget: usize,
    next_gen: u64,
    /// Lookups answered (an entry, or a name known absent), and not.
    hits: u64,
    misses: u64,
}

impl DirCache {
    /// A cache of at most `budget` bytes (0: none at all).
    pub fn new(budget: usize) -> Self {
        DirCache {
            views: LruCache::unbounded(),
            bytes: 0,
            budget,
            next_gen: 1,
            hits: 0,
            misses: 0,
        }
    }

    /// (lookups answered, lookups that went to the engine) while enabled.
    pub fn lookups(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }

    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// (directories, bytes, budget) for the memory figures.
    pub fn figures(&self) -> (usize, usize, usize) {
        (self.views.len(), self.bytes, self.budget)
    }

    fn next_generation(&mut self) -> Gen {
        self.next_gen += 1;
        Gen(self.next_gen)
    }

    /// The most one directory may hold: half the budget.
    fn dir_cap(&self) -> usize {
        self.budget / 2
    }

    fn charge(&mut self, dir: u64, delta: isize) {
        let Some(v) = self.views.peek_mut(&dir) else {
            return;
        };
        v.bytes = v.bytes.saturating_add_signed(delta);
        self.bytes = self.bytes.saturating_add_signed(delta);
        if v.bytes > self.dir_cap() {
            // Too big to keep whole: drop it (a later fill starts over,
            // and is dropped again if the directory is still too big).
            self.forget(dir);
        }
        while self.bytes > self.budget {
            match self.views.pop_lru() {
                Some((_, v)) => self.bytes -= v.bytes,
                None => break,
            }
        }
    }

    fn view(&mut self, dir: u64) -> &mut View {
        if !self.views.contains(&dir) {
            let g = self.next_generation();
            self.views.put(dir, View::new(g));
            self.bytes += VIEW_COST;
        }
        self.views.get_mut(&dir).expect("just put")
    }

    /// What the cache knows of `name` in `dir`.
    pub fn lookup(&mut self, dir: u64, name: &[u8]) -> Found {
        let found = match self.views.get(&dir) {
            None => Found::Unknown,
            Some(v) => match v.names.get(name) {
                Some(d) => Found::Entry(d.clone()),
                None if v.complete => Found::Absent,
                None => Found::Unknown,
            },
        };
        if self.enabled() {
            match found {
                Found::Unknown => self.misses += 1,
                _ => self.hits += 1,
            }
        }
        found
    }

    /// `dir` was just made: its view is complete and empty (every lookup
    /// in a new directory, the negative one before each create included,
    /// is answered at once).
    pub fn made(&mut self, dir: u64) {
        if !self.enabled() {
            return;
        }
        let v = self.view(dir);
        v.complete = true;
        v.listed = u64::MAX;
    }

    /// Records what a lookup read from the engine.
    pub fn learn(&mut self, dir: u64, name: &[u8], d: &Dirent) {
        if !self.enabled() {
            return;
        }
        let delta = self.view(dir).put(name, d.clone());
        self.charge(dir, delta);
    }

    /// Whether `dir` is known to have no entries.
    pub fn is_empty(&mut self, dir: u64) -> Option<bool> {
        let v = self.views.get(&dir)?;
        v.complete.then_some(v.names.is_empty())
    }

    /// Entries after cookie `after`, at most `limit`, if the view has the
    /// directory's whole listing.
    pub fn list(&mut self, dir: u64, after: u64, limit: usize) -> Option<Vec<Listed>> {
        let v = self.views.get(&dir)?;
        if !v.complete {
            return None;
        }
        Some(
            v.order
                .range(after + 1..)
                .take(limit)
                .map(|(&c, n)| {
                    let d = &v.names[n];
                    (c, d.ino, d.kind, Arc::clone(n))
                })
                .collect(),
        )
    }

    /// Before a listing scans the engine from cookie `after`: the
    /// generation its results must still match (`None`: nothing to fill).
    pub fn begin_fill(&mut self, dir: u64, after: u64) -> Option<Gen> {
        if !self.enabled() {
            return None;
        }
        let v = self.view(dir);
        // Only a listing that continues the prefix extends it.
        // (The kernel may resume before the last entry it was sent.)
        (v.listed >= after || (v.listed == 0 && after <= 2)).then_some(v.generation)
    }

    /// After the scan: `entries` (in cookie order, after `after`) are the
    /// directory's, `end` says the scan reached its last entry.
    pub fn fill(&mut self, dir: u64, generation: Gen, entries: &[Listed], end: bool) {
        let Some(v) = self.views.get_mut(&dir) else {
            return;
        };
        if v.generation != generation {
            return;
        }
        let mut delta = 0;
        for (cookie, ino, kind, name) in entries {
            let d = Dirent {
                ino: *ino,
                kind: *kind,
                cookie: *cookie,
            };
            v.listed = v.listed.max(*cookie);
            delta += v.put(name, d);
        }
        if end {
            v.complete = true;
            v.listed = u64::MAX;
        }
        self.charge(dir, delta);
    }

    /// A change to `dir` is applied: `name` now names `d`.
    pub fn put(&mut self, dir: u64, name: &[u8], d: &Dirent) {
        let g = self.next_generation();
        if let Some(v) = self.views.peek_mut(&dir) {
            v.generation = g;
            let delta = v.put(name, d.clone());
            self.charge(dir, delta);
        }
    }

    /// A change to `dir` is applied: entry `name` at `cookie` is gone.
    pub fn remove(&mut self, dir: u64, name: &[u8], cookie: u64) {
        let g = self.next_generation();
        if let Some(v) = self.views.peek_mut(&dir) {
            v.generation = g;
            let delta = v.remove(name, cookie);
            self.charge(dir, delta);
        }
    }

    /// `dir` is gone (or its view must not be trusted any more).
    pub fn forget(&mut self, dir: u64) {
        if let Some(v) = self.views.pop(&dir) {
            self.bytes -= v.bytes;
        }
    }

    pub fn clear(&mut self) {
        self.views.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(ino: u64, cookie: u64) -> Dirent {
        Dirent {
            ino,
            kind: 8,
            cookie,
        }
    }

    fn listed(c: u64, name: &str) -> Listed {
        (c, c * 10, 8, Arc::from(name.as_bytes()))
    }

    #[test]
    fn a_full_listing_answers_absent_names_and_lists() {
        let mut c = DirCache::new(1 << 20);
        let g = c.begin_fill(1, 0).unwrap();
        c.fill(1, g, &[listed(3, "a"), listed(4, "b")], false);
        assert!(matches!(c.lookup(1, b"zz"), Found::Unknown));
        let g = c.begin_fill(1, 4).unwrap();
        c.fill(1, g, &[listed(5, "c")], true);
        assert!(matches!(c.lookup(1, b"zz"), Found::Absent));
        assert!(matches!(c.lookup(1, b"b"), Found::Entry(e) if e.ino == 40));
        let all = c.list(1, 2, 10).unwrap();
        assert_eq!(all.iter().map(|e| e.0).collect::<Vec<_>>(), [3, 4, 5]);
        assert_eq!(c.list(1, 3, 1).unwrap()[0].0, 4);
        // Changes apply in place.
        c.put(1, b"zz", &d(99, 6));
        c.remove(1, b"a", 3);
        let names: Vec<_> = c
            .list(1, 0, 10)
            .unwrap()
            .into_iter()
            .map(|e| e.3.to_vec())
            .collect();
        assert_eq!(names, [b"b".to_vec(), b"c".to_vec(), b"zz".to_vec()]);
        assert!(matches!(c.lookup(1, b"a"), Found::Absent));
        assert_eq!(c.is_empty(1), Some(false));
    }

    #[test]
    fn a_change_during_a_scan_drops_the_fill() {
        let mut c = DirCache::new(1 << 20);
        let g = c.begin_fill(1, 0).unwrap();
        c.put(1, b"new", &d(7, 9));
        c.fill(1, g, &[listed(3, "a")], true);
        assert!(c.list(1, 0, 10).is_none(), "stale scan dropped");
        // An evicted and re-made view does not take an old generation.
        let g = c.begin_fill(2, 0).unwrap();
        c.forget(2);
        c.begin_fill(2, 0);
        c.fill(2, g, &[listed(3, "a")], true);
        assert!(c.list(2, 0, 10).is_none());
        // A rename within the directory keeps the cookie.
        let g = c.begin_fill(3, 0).unwrap();
        c.fill(3, g, &[listed(3, "a"), listed(4, "b")], true);
        c.remove(3, b"a", 3);
        c.put(3, b"a2", &d(30, 3));
        let l = c.list(3, 0, 10).unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(&*l[0].3, b"a2");
    }

    #[test]
    fn a_new_directory_is_known_empty() {
        let mut c = DirCache::new(1 << 20);
        c.made(9);
        assert!(matches!(c.lookup(9, b"x"), Found::Absent));
        assert_eq!(c.is_empty(9), Some(true));
        c.put(9, b"x", &d(10, 3));
        assert!(matches!(c.lookup(9, b"x"), Found::Entry(e) if e.ino == 10));
        assert_eq!(c.list(9, 2, 10).unwrap().len(), 1);
        let mut off = DirCache::new(0);
        off.made(9);
        assert!(matches!(off.lookup(9, b"x"), Found::Unknown));
    }

    #[test]
    fn the_budget_holds() {
        let mut c = DirCache::new(64 << 10);
        for dir in 0..100u64 {
            let g = c.begin_fill(dir, 0).unwrap();
            let names: Vec<Listed> = (3..50).map(|i| listed(i, &format!("n{i}"))).collect();
            c.fill(dir, g, &names, true);
            assert!(c.bytes <= c.budget);
        }
        // Too big for its share: not cached at all.
        let g = c.begin_fill(500, 0).unwrap();
        let names: Vec<Listed> = (3..2000).map(|i| listed(i, &format!("n{i}"))).collect();
        c.fill(500, g, &names, true);
        assert!(c.list(500, 0, 10).is_none());
        let sum: usize = c.views.iter().map(|(_, v)| v.bytes).sum();
        assert_eq!(sum, c.bytes);
    }
}
