//! Cold reads without the state lock.
//!
//! Every operation runs under the one state lock, but a read that misses
//! the caches goes to the engine, which may fault pages in from disk (LMDB)
//! or wait on a round trip (PostgreSQL). Held across that, the lock queues
//! every other request thread behind one cold read. LMDB readers do not
//! block each other, so reads on the request paths that matter — a lookup
//! (its entry and its inode), `getattr`, `getxattr` (the inode and, for a
//! name not inline, its spill pages) — first fetch what is missing with the
//! lock released, then take it again and keep what they read only if
//! nothing changed meanwhile. The attributes of a readdirplus page's
//! entries are read the same way, all in one engine call.
//!
//! On engines where every read is a round trip (PostgreSQL), a cold
//! lookup that misses in a directory where the last cold lookup found its
//! name reads a window of entries instead of one: the [`WINDOW`] entries
//! from the looked-up name on, in key order (from the directory's first,
//! when it holds no more), and their inodes, in one round trip
//! ([`ColdDirs`]). Where the directory's own entries leave room, the window
//! goes on, breadth first, into the entries of the subdirectories it holds
//! and theirs (a tree of small directories: a source tree, a mail store);
//! a subdirectory it could not hold reads a window at its first miss. A
//! walk through a directory or a tree (`ls -l` by
//! name, a `git status`, Samba listing a share, bench T1 cold) then pays a
//! round trip per window, not per name; a path walk (one lookup per
//! directory) and a run of creates (lookups of names not there) never
//! read one. Spill pages past what a window reads come the same way: a
//! `getxattr` that reads the pages of the inode just after those the last
//! spill read brought reads the next cached inodes' too ([`SpillRuns`]).
//!
//! "Nothing changed" is the pair ([`Store::applied_seq`], [`State::epoch`]):
//! every change of this daemon applies its writes to the store under the
//! state lock (the first moves), and every cache drop for another reason —
//! another daemon's change on a shared volume, a reset after a failed
//! commit — bumps the second. If either moved, what was read is dropped and
//! the operation reads again under the lock, as it always did; so the
//! cache's invariant (an entry is never older than the store's view of its
//! key) holds, and a read is only ever a little slower, never wrong.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use parking_lot::MutexGuard;

use super::state::Cached;
use super::{CoreError, Fs, Result, State};
use crate::format::dirent::Dirent;
use crate::format::inode::Inode;
use crate::format::keys;
use crate::format::spill::Spill;

/// What a lookup found with the lock released, valid under the guard it
/// came back with.
pub(super) enum Entry {
    /// Not read ahead (cached, or read ahead and then changed meanwhile):
    /// the caller reads under the lock.
    Unknown,
    Absent,
    Present(Dirent),
}

/// Where things stood when the lock was let go.
type Epoch = (u64, u64);

impl Fs {
    fn epoch(&self, st: &State) -> Epoch {
        (self.store.applied_seq(), st.epoch())
    }

    /// Runs `read` with the lock released; the guard back, and what `read`
    /// found if nothing changed meanwhile (a failed read is left for the
    /// caller to meet again under the lock, where it is reported).
    fn unlocked<'a, T>(
        &'a self,
        st: MutexGuard<'a, State>,
        read: impl FnOnce() -> Result<T>,
    ) -> (MutexGuard<'a, State>, Option<T>) {
        let before = self.epoch(&st);
        drop(st);
        let got = read().ok();
        let st = self.state.lock();
        let same = self.epoch(&st) == before;
        (st, got.filter(|_| same))
    }

    fn read_inode(&self, ino: u64) -> Result<Option<Inode>> {
        let key = keys::inode(ino);
        self.store
            .get(&key)?
            .map(|rec| decode_inode(&key, &rec))
            .transpose()
    }

    /// The state lock, with every one of `inos` that exists cached: those
    /// not cached are read together (one engine call) without the lock.
    pub(super) fn lock_with_inodes(&self, inos: &[u64]) -> MutexGuard<'_, State> {
        let st = self.state.lock();
        let mut missing: Vec<u64> = inos.iter().copied().filter(|&i| !st.is_cached(i)).collect();
        if missing.is_empty() {
            return st;
        }
        missing.sort_unstable();
        missing.dedup();
        let (mut st, got) = self.unlocked(st, || {
            let keys: Vec<Vec<u8>> = missing.iter().map(|&i| keys::inode(i).to_vec()).collect();
            let recs = self.store.get_many(&keys)?;
            let mut found = Vec::with_capacity(recs.len());
            for ((ino, key), rec) in missing.iter().zip(&keys).zip(recs) {
                if let Some(rec) = rec {
                    found.push((*ino, decode_inode(key, &rec)?));
                }
            }
            Ok(found)
        });
        for (ino, inode) in got.into_iter().flatten() {
            if !st.is_cached(ino) {
                st.cache_put(ino, Cached { inode, spill: None });
            }
        }
        st
    }

    /// The state lock, with inode `ino` cached if it exists — read without
    /// the lock when it was not cached — and, when `name` is given and is
    /// not inline, its spill pages too.
    pub(super) fn lock_with_inode(&self, ino: u64, name: Option<&[u8]>) -> MutexGuard<'_, State> {
        let mut st = self.state.lock();
        let cached = st.cached(ino).map(|c| {
            let wants_spill = c.spill.is_none()
                && c.inode.spill_len > 0
                && name.is_some_and(|n| !c.inode.inline.contains(n));
            wants_spill.then(|| c.inode.clone())
        });
        let known = match cached {
            Some(None) => return st,
            Some(Some(inode)) => Some(inode),
            None => None,
        };
        // Spill pages read in a run through inode numbers (a getxattr of
        // each file of a directory in turn): the next ones' come along.
        let ahead = match &known {
            Some(_) if self.store.reads_are_round_trips() && self.spill_runs.follows(ino) => {
                spill_neighbours(&mut st, ino)
            }
            _ => Vec::new(),
        };
        let (mut st, got) = self.unlocked(st, || {
            let inode = match known {
                Some(i) => i,
                None => match self.read_inode(ino)? {
                    Some(i) => i,
                    None => return Ok(None),
                },
            };
            if inode.spill_len == 0 || name.is_none_or(|n| inode.inline.contains(n)) {
                return Ok(Some((inode, None, Vec::new())));
            }
            if let Some((spill, more)) = self.read_spill_run(ino, &inode, &ahead)? {
                return Ok(Some((inode, Some(spill), more)));
            }
            let spill = self.read_spill_of(ino, &inode)?;
            self.spill_runs.read(ino);
            Ok(Some((inode, Some(spill), Vec::new())))
        });
        let got = got.map(|found| {
            found.map(|(inode, spill, more)| {
                for (n, spill) in more {
                    st.cache_update(n, |c| {
                        if c.spill.is_none() && c.inode.spill_len as usize == spill.packed_len() {
                            c.spill = Some(spill);
                        }
                    });
                }
                (inode, spill)
            })
        });
        if let Some(Some((inode, mut spill))) = got
            && !st.cache_update(ino, |c| {
                if c.spill.is_none() {
                    c.spill = spill.take();
                }
            })
        {
            st.cache_put(ino, Cached { inode, spill });
        }
        st
    }

    /// The state lock for a lookup of `name` in `parent`, with the entry,
    /// the inode it names and (if it was not cached) `parent`'s own inode
    /// read without the lock when they were not cached.
    pub(super) fn lock_for_lookup(
        &self,
        parent: u64,
        name: &[u8],
    ) -> (MutexGuard<'_, State>, Entry) {
        let mut st = self.state.lock();
        if matches!(name, b"." | b"..") {
            return (st, Entry::Unknown);
        }
        let (parent_cached, mut parent_entries) = match st.cached(parent) {
            Some(c) if !c.inode.is_dir() => return (st, Entry::Unknown),
            Some(c) => (true, entries_of(&c.inode)),
            None => (false, None),
        };
        let known = match st.dirs().lookup(parent, name) {
            super::dircache::Found::Absent => return (st, Entry::Unknown),
            super::dircache::Found::Entry(d) if st.is_cached(d.ino) => return (st, Entry::Unknown),
            super::dircache::Found::Entry(d) => Some(d),
            super::dircache::Found::Unknown => None,
        };
        // A window only where the directory cache keeps what it reads.
        let cold = known.is_none();
        let window = cold
            && st.dirs().enabled()
            && self.store.reads_are_round_trips()
            && self.cold_dirs.window(parent);
        let (mut st, got) = self.unlocked(st, || {
            let pinode = match parent_cached {
                true => None,
                false => match self.read_inode(parent)? {
                    Some(p) if p.is_dir() => {
                        parent_entries = entries_of(&p);
                        Some(p)
                    }
                    // Not a directory, or gone: the locked path says which.
                    _ => return Err(CoreError::NotFound),
                },
            };
            let (d, irec, spill_recs) = match known {
                Some(d) => (d, None, None),
                None if window => {
                    // A directory one window holds is read whole: a walk
                    // need not come in key order.
                    let whole = parent_entries.is_some_and(|n| n <= WINDOW as u64);
                    let (found, rest) = self.read_window(parent, name, whole)?;
                    return Ok((pinode, found, rest));
                }
                None => {
                    // With the inode come its spill pages where that costs
                    // no second read (PostgreSQL): a getxattr after a cold
                    // lookup then needs no round trip of its own.
                    let key = self.keyspace.dirent(parent, name);
                    let (at, prefix) = (crate::format::dirent::INO_AT, keys::P_INODE);
                    let found = if self.spill_hint.worth() {
                        self.store
                            .get_follow_and_range(&key, at, prefix, keys::P_SPILL)?
                    } else {
                        self.store
                            .get_and_follow(&key, at, prefix)?
                            .map(|(v, p)| (v, p, None))
                    };
                    let Some((rec, irec, spill_recs)) = found else {
                        return Ok((pinode, None, Vec::new()));
                    };
                    let d = Dirent::decode(&key, &rec).map_err(|e| CoreError::corrupt(&key, e))?;
                    (d, irec, spill_recs)
                }
            };
            let ikey = keys::inode(d.ino);
            let inode = match irec {
                Some(rec) => {
                    Some(Inode::decode(&ikey, &rec).map_err(|e| CoreError::corrupt(&ikey, e))?)
                }
                None => self.read_inode(d.ino)?,
            };
            if let Some(i) = &inode {
                self.spill_hint.saw(i.spill_len > 0);
            }
            // A spill that does not decode is left for its own read to
            // report.
            let spill = match (&inode, spill_recs) {
                (Some(i), Some(recs)) if i.spill_len > 0 => {
                    super::xattr::spill_from_records(d.ino, i, recs).ok()
                }
                _ => None,
            };
            Ok((pinode, Some((d, inode, spill)), Vec::new()))
        });
        let Some((pinode, found, rest)) = got else {
            return (st, Entry::Unknown);
        };
        if cold && self.store.reads_are_round_trips() {
            self.cold_dirs.noted(parent, found.is_some());
        }
        // A walk through `parent` (a window) goes on into its
        // subdirectories (`git status`, `find`): their first cold miss reads
        // a window too, not its name alone and then a window.
        let is_dir = |d: &Dirent| u32::from(d.kind) == libc::S_IFDIR >> 12;
        if window
            && let Some((d, ..)) = &found
            && is_dir(d)
        {
            self.cold_dirs.noted(d.ino, true);
        }
        for (dir, n, d, inode, spill) in rest {
            if is_dir(&d) {
                self.cold_dirs.noted(d.ino, true);
            }
            st.dirs().learn(dir, &n, &d);
            if let Some(inode) = inode
                && !st.is_cached(d.ino)
            {
                st.cache_put(d.ino, Cached { inode, spill });
            }
        }
        if let Some(p) = pinode
            && !st.is_cached(parent)
        {
            st.cache_put(
                parent,
                Cached {
                    inode: p,
                    spill: None,
                },
            );
        }
        let entry = match found {
            None => Entry::Absent,
            Some((d, inode, spill)) => {
                st.dirs().learn(parent, name, &d);
                if let Some(inode) = inode
                    && !st.is_cached(d.ino)
                {
                    st.cache_put(d.ino, Cached { inode, spill });
                }
                Entry::Present(d)
            }
        };
        (st, entry)
    }
}

/// Entries a window read brings (see the module comment): what one round
/// trip carries in about the time of two single reads on this machine's
/// PostgreSQL, and few enough that a window read for nothing costs little.
pub(super) const WINDOW: usize = 128;

/// An entry a window brought: its directory, its name, its record, the
/// inode it names and that inode's spill pages if they came too.
type Windowed = (u64, Vec<u8>, Dirent, Option<Inode>, Option<Spill>);

/// What a window found of the looked-up name itself.
type WindowFound = Option<(Dirent, Option<Inode>, Option<Spill>)>;

/// Spill bytes a window reads at most, in its second round trip: about
/// four round trips' worth of transfer on this machine's PostgreSQL.
const WINDOW_SPILL_BYTES: u64 = 512 << 10;

/// The widest gap between inode numbers of one run (see
/// `Fs::read_window_spills`).
const RUN_GAP: u64 = 4;

impl Fs {
    /// The [`WINDOW`] entries of `parent` from `name` on (from its first,
    /// if `whole`) and their inodes: `name`'s own (if it exists) and the
    /// others.
    fn read_window(
        &self,
        parent: u64,
        name: &[u8],
        whole: bool,
    ) -> Result<(WindowFound, Vec<Windowed>)> {
        let key = self.keyspace.dirent(parent, name);
        let (first, end) = keys::ino_range(keys::P_DIRENT, parent);
        // With the entries of the subdirectories it holds, and theirs, as
        // far as the window goes: a walk through a tree of small
        // directories pays a round trip per window, not per directory.
        let into_dirs = crate::meta::Descend {
            prefix: keys::P_DIRENT,
            kind_at: crate::format::dirent::INO_AT + 8,
            kind: (libc::S_IFDIR >> 12) as u8,
        };
        let rows = self.store.scan_tree_and_follow(
            if whole { &first } else { &key },
            &end,
            WINDOW,
            crate::format::dirent::INO_AT,
            keys::P_INODE,
            Some(into_dirs),
        )?;
        let mut entries = Vec::with_capacity(rows.len());
        let mut inodes = Vec::with_capacity(rows.len());
        for (k, v, irec) in &rows {
            let dir = keys::key_ino(k).unwrap_or(0);
            let decoded = Dirent::decode(k, v)
                .map_err(|e| CoreError::corrupt(k, e))
                .and_then(|d| {
                    let ikey = keys::inode(d.ino);
                    let inode = irec.as_ref().map(|r| decode_inode(&ikey, r)).transpose()?;
                    Ok((d, inode))
                });
            let (d, inode) = match decoded {
                Ok(got) => got,
                // A record of a subdirectory's that does not decode is left
                // for its own lookup to report: it must not fail the
                // lookups of `parent`, which never needed it.
                Err(_) if dir != parent => continue,
                Err(e) => return Err(e),
            };
            inodes.push(inode);
            entries.push((dir, k, d));
        }
        // `parent`'s own (the first range, whole before any other).
        let own = entries.iter().filter(|(p, ..)| *p == parent).count();
        // Whether the window says if `name` exists: it started there, or
        // ran to the directory's end, or past `name`.
        let decides =
            !whole || own < WINDOW || entries.iter().any(|(p, k, _)| *p == parent && **k >= key);
        let spilled: Vec<(u64, u64)> = entries
            .iter()
            .zip(&inodes)
            .filter(|((p, ..), _)| *p == parent)
            .filter_map(|((_, _, d), i)| {
                let len = u64::from(i.as_ref()?.spill_len);
                (len > 0).then_some((d.ino, len))
            })
            .collect();
        let mut spills = self.read_window_spills(spilled, own)?;
        let mut found = None;
        let mut rest = Vec::with_capacity(entries.len());
        for ((p, k, d), inode) in entries.into_iter().zip(inodes) {
            // A spill that does not decode is left for its own read to
            // report.
            let spill = inode.as_ref().and_then(|i| {
                let recs = spills.remove(&d.ino)?;
                super::xattr::spill_from_records(d.ino, i, recs).ok()
            });
            if *k == key {
                found = Some((d, inode, spill));
                continue;
            }
            // A name that does not decode is left for its own lookup.
            if let Ok(n) = self.keyspace.entry_name(k) {
                rest.push((p, n, d, inode, spill));
            }
        }
        if found.is_none() && !decides {
            // The directory grew past a window since its count was read.
            if let Some((rec, irec)) =
                self.store
                    .get_and_follow(&key, crate::format::dirent::INO_AT, keys::P_INODE)?
            {
                let d = Dirent::decode(&key, &rec).map_err(|e| CoreError::corrupt(&key, e))?;
                let ikey = keys::inode(d.ino);
                let inode = match irec {
                    Some(r) => Some(decode_inode(&ikey, &r)?),
                    None => self.read_inode(d.ino)?,
                };
                found = Some((d, inode, None));
            }
        }
        Ok((found, rest))
    }

    /// The spill pages of a window's inodes `spilled` (ino, spill bytes:
    /// those of `of` that have some), in a third round trip, when they are
    /// a third or more (the share [`SpillHint`] weighs for single lookups):
    /// one scan over the spill records of the longest run of them whose
    /// numbers lie close together (a window is in name order, inode
    /// numbers in creation order), if that run holds at least two and at
    /// most [`WINDOW_SPILL_BYTES`]. The others are read on their own when
    /// asked for.
    fn read_window_spills(
        &self,
        mut spilled: Vec<(u64, u64)>,
        of: usize,
    ) -> Result<std::collections::HashMap<u64, crate::meta::Pairs>> {
        let by_ino = std::collections::HashMap::new();
        if spilled.len() < 2 || spilled.len() * 3 < of {
            return Ok(by_ino);
        }
        spilled.sort_unstable();
        // The longest run with gaps of at most RUN_GAP numbers.
        let (mut best, mut start) = ((0, 0), 0);
        for i in 1..=spilled.len() {
            if i == spilled.len() || spilled[i].0 - spilled[i - 1].0 > RUN_GAP {
                if i - start > best.1 - best.0 {
                    best = (start, i);
                }
                start = i;
            }
        }
        let run = &spilled[best.0..best.1];
        let bytes: u64 = run.iter().map(|(_, n)| n).sum();
        if run.len() < 2 || bytes > WINDOW_SPILL_BYTES {
            return Ok(by_ino);
        }
        let (lo, hi) = (run[0].0, run[run.len() - 1].0);
        let Some(mut found) = self.scan_spills(lo, hi, bytes, WINDOW)? else {
            return Ok(by_ino);
        };
        let wanted: std::collections::HashSet<u64> = run.iter().map(|(i, _)| *i).collect();
        found.retain(|ino, _| wanted.contains(ino));
        Ok(found)
    }
}

/// An inode's spill pages and those of the inodes read with them.
type SpillRun = (Spill, Vec<(u64, Spill)>);

impl Fs {
    /// The spill pages of `ino` (record `inode`) and of the inodes
    /// `ahead` after it, in one scan; `None` when there are none ahead or
    /// the range holds more than they promised (the caller reads `ino`'s
    /// alone). A neighbour whose pages do not decode is left for its own
    /// read to report.
    fn read_spill_run(
        &self,
        ino: u64,
        inode: &Inode,
        ahead: &[(u64, Inode)],
    ) -> Result<Option<SpillRun>> {
        let Some((last, _)) = ahead.last() else {
            return Ok(None);
        };
        let bytes = u64::from(inode.spill_len)
            + ahead
                .iter()
                .map(|(_, i)| u64::from(i.spill_len))
                .sum::<u64>();
        let Some(mut by_ino) = self.scan_spills(ino, *last, bytes, ahead.len() + 1)? else {
            return Ok(None);
        };
        let own =
            super::xattr::spill_from_records(ino, inode, by_ino.remove(&ino).unwrap_or_default())?;
        let more = ahead
            .iter()
            .filter_map(|(n, i)| {
                let recs = by_ino.remove(n)?;
                Some((*n, super::xattr::spill_from_records(*n, i, recs).ok()?))
            })
            .collect();
        self.spill_runs.read(*last);
        Ok(Some((own, more)))
    }

    /// The spill records of inodes `lo` to `hi` in one scan, by inode, if
    /// they are no more than `bytes` of pages for `inodes` inodes promise
    /// (pages of about a KiB; inodes in the gaps: a bound, not an
    /// expectation); `None` otherwise.
    fn scan_spills(
        &self,
        lo: u64,
        hi: u64,
        bytes: u64,
        inodes: usize,
    ) -> Result<Option<std::collections::HashMap<u64, crate::meta::Pairs>>> {
        let start = keys::spill(lo).to_vec();
        let (_, end) = keys::ino_range(keys::P_SPILL, hi);
        let limit = (2 * bytes / 1024) as usize + 4 * inodes.max(WINDOW);
        let pairs = self.store.scan(&start, &end, limit + 1)?;
        if pairs.len() > limit {
            return Ok(None);
        }
        let mut by_ino = std::collections::HashMap::new();
        for (k, v) in pairs {
            if let Some(ino) = keys::key_ino(&k) {
                by_ino.entry(ino).or_insert_with(Vec::new).push((k, v));
            }
        }
        Ok(Some(by_ino))
    }
}

/// The cached inodes after `ino` whose spill pages are not cached: the
/// run of them with gaps of at most [`RUN_GAP`] numbers, up to [`WINDOW`]
/// inodes and [`WINDOW_SPILL_BYTES`] of pages with `ino`'s own.
fn spill_neighbours(st: &mut State, ino: u64) -> Vec<(u64, Inode)> {
    let mut bytes = st.cached(ino).map_or(0, |c| u64::from(c.inode.spill_len));
    let (mut out, mut next, mut gap) = (Vec::new(), ino + 1, 0);
    while out.len() < WINDOW && gap < RUN_GAP {
        match st.cached(next) {
            Some(c) if c.spill.is_none() && c.inode.spill_len > 0 => {
                bytes += u64::from(c.inode.spill_len);
                if bytes > WINDOW_SPILL_BYTES {
                    break;
                }
                out.push((next, c.inode.clone()));
                gap = 0;
            }
            _ => gap += 1,
        }
        next += 1;
    }
    out
}

/// Where the last spill read of a getxattr ended: a read of an inode just
/// after it continues a run (see [`spill_neighbours`]). One read alone, of
/// a file among others cached (after an `ls -l`), reads its own pages
/// only.
#[derive(Debug, Default)]
pub(super) struct SpillRuns {
    last: AtomicU64,
}

impl SpillRuns {
    fn follows(&self, ino: u64) -> bool {
        let last = self.last.load(Ordering::Relaxed);
        last < ino && ino - last <= RUN_GAP
    }

    fn read(&self, upto: u64) {
        self.last.store(upto, Ordering::Relaxed);
    }
}

/// Directories a cold lookup has missed in lately, and whether that
/// lookup found its name: a cold miss after one that found its name reads
/// a window, as does the first in a subdirectory a window brought. One that did not (a create's lookup of a new name, in a
/// directory not listed yet) would bring entries nobody asked for: the
/// next miss reads its name alone. Forgotten all at once past
/// [`ColdDirs::MAX`] (a hint).
#[derive(Debug, Default)]
pub(super) struct ColdDirs {
    found: parking_lot::Mutex<std::collections::HashMap<u64, bool>>,
}

impl ColdDirs {
    const MAX: usize = 4096;

    /// Whether a cold miss in `dir` reads a window.
    fn window(&self, dir: u64) -> bool {
        self.found.lock().get(&dir) == Some(&true)
    }

    /// A cold lookup in `dir` found its name, or did not.
    fn noted(&self, dir: u64, found: bool) {
        let mut seen = self.found.lock();
        if seen.len() >= Self::MAX && !seen.contains_key(&dir) {
            seen.clear();
        }
        seen.insert(dir, found);
    }
}

/// Whether a cold lookup reads the inode's spill pages in its round trip.
/// On PostgreSQL that range read costs ~25 µs more per lookup (measured:
/// a cold getxattr of 1 B 118 -> 150 µs) and saves a ~70 µs round trip for
/// an inode that has spill pages (1 KiB 198 -> 146 µs), so it pays once
/// about a third of the inodes recent cold lookups met had them — a share
/// of Samba's NT ACLs or Swift's metadata over the inline budget, not of
/// most trees. Counts are halved every 1,024 lookups.
#[derive(Debug, Default)]
pub(super) struct SpillHint {
    seen: AtomicU32,
    spilled: AtomicU32,
}

impl SpillHint {
    /// Lookups to see before the hint says yes.
    const FIRST: u32 = 16;
    const WINDOW: u32 = 1024;

    fn worth(&self) -> bool {
        let seen = self.seen.load(Ordering::Relaxed);
        seen >= Self::FIRST && self.spilled.load(Ordering::Relaxed) * 3 >= seen
    }

    fn saw(&self, spilled: bool) {
        if spilled {
            self.spilled.fetch_add(1, Ordering::Relaxed);
        }
        // Racing halvings lose a count or two: a hint.
        if self.seen.fetch_add(1, Ordering::Relaxed) + 1 >= Self::WINDOW {
            self.seen.store(Self::WINDOW / 2, Ordering::Relaxed);
            let s = self.spilled.load(Ordering::Relaxed);
            self.spilled.store(s / 2, Ordering::Relaxed);
        }
    }
}

/// How many entries directory `dir` holds, where it keeps the count.
fn entries_of(dir: &Inode) -> Option<u64> {
    let stats = dir.stats?;
    Some(stats.files + u64::from(dir.nlink.saturating_sub(2)))
}

fn decode_inode(key: &[u8], rec: &[u8]) -> Result<Inode> {
    Inode::decode(key, rec).map_err(|e| CoreError::corrupt(key, e))
}
