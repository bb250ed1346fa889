//! Directory statistics (CephFS's rstats): every directory of a volume
//! with `FEATURE_DIR_STATS` carries how many files and directories lie
//! below it (`format::inode::DirStats`), and each operation that adds or
//! removes entries moves the counts of the directories it changes and of
//! all their ancestors in the same batch as the entries themselves. So the
//! counts are exactly as durable and as atomic as the names they count:
//! no journal to replay after a crash, nothing to recompute at mount, and
//! reading them is one `getxattr` of the directory, whatever lies below.
//!
//! They are read as virtual xattrs, `safs.dir.*` (CephFS's `ceph.dir.*`),
//! which `listxattr` does not list, so `cp -a`, `rsync -X` and Samba never
//! copy or expose them; they cannot be set or removed.

use super::error::{CoreError, Result};
use super::namespace::Work;
use super::state::State;
use super::store::Store;
use super::{Fs, keys};
use crate::format::dirent::Dirent;
use crate::format::inode::{DirStats, Inode, S_IFDIR};
use crate::format::shares::DirShare;

/// The prefix of the statistics' names.
pub const PREFIX: &[u8] = b"safs.dir.";

/// Deeper than any real tree; a damaged volume with a loop of parents must
/// not hang the daemon.
const MAX_DEPTH: usize = 4096;

/// One entry added to or removed from `dir`.
pub struct Moved {
    dir: u64,
    ino: u64,
    is_dir: bool,
    added: bool,
}

impl Moved {
    pub fn added(dir: u64, d: &Dirent) -> Self {
        Self::new(dir, d, true)
    }

    pub fn removed(dir: u64, d: &Dirent) -> Self {
        Self::new(dir, d, false)
    }

    fn new(dir: u64, d: &Dirent, added: bool) -> Self {
        Moved {
            dir,
            ino: d.ino,
            is_dir: u32::from(d.kind) << 12 == S_IFDIR,
            added,
        }
    }
}

/// What an entry brings to the directories above it.
#[derive(Clone, Copy, Default)]
pub(super) struct Weight {
    files: i64,
    rfiles: i64,
    rsubdirs: i64,
    rbytes: i64,
    rblocks: i64,
}

impl Weight {
    pub(super) fn add(&mut self, o: Weight) {
        self.files += o.files;
        self.rfiles += o.rfiles;
        self.rsubdirs += o.rsubdirs;
        self.rbytes += o.rbytes;
        self.rblocks += o.rblocks;
    }

    /// The same change as a session's share of a directory.
    fn share(&self) -> DirShare {
        DirShare {
            files: self.files,
            rfiles: self.rfiles,
            rsubdirs: self.rsubdirs,
            rbytes: self.rbytes,
            rblocks: self.rblocks,
            rctime: 0,
        }
    }

    fn apply_to(&self, i: &mut Inode) {
        if let Some(s) = i.stats.as_mut() {
            s.files = moved_by(s.files, self.files);
            s.rfiles = moved_by(s.rfiles, self.rfiles);
            s.rsubdirs = moved_by(s.rsubdirs, self.rsubdirs);
            s.rbytes = moved_by(s.rbytes, self.rbytes);
            s.rblocks = moved_by(s.rblocks, self.rblocks);
        }
    }
}

fn moved_by(v: u64, by: i64) -> u64 {
    v.saturating_add_signed(by)
}

impl Fs {
    /// Moves the statistics for the entries `work` added and removed: the
    /// directories holding them and every ancestor, loaded into `work` and
    /// written with it; and keeps each non-directory's list of the
    /// directories naming it, whose counts its size changes move.
    pub(super) fn account(&self, st: &mut State, work: &mut Work) -> Result<()> {
        // Without limits to check, each ancestor's share waits in `owed`
        // until the batch is taken; with them, every count must be exact
        // before the check, and is kept so.
        let lazy = self.defers_stats() && !st.quotas_seen();
        if !lazy {
            pay_owed(&self.store, st, work);
        }
        let moved = std::mem::take(&mut work.moved);
        // A rename within a directory removes and adds the same entry: its
        // two halves cancel, and nothing above moves.
        let mut net: Vec<(u64, u64, bool, i64)> = Vec::with_capacity(moved.len());
        for m in moved {
            let sign = if m.added { 1 } else { -1 };
            match net
                .iter_mut()
                .find(|(d, i, _, _)| (*d, *i) == (m.dir, m.ino))
            {
                Some(n) => n.3 += sign,
                None => net.push((m.dir, m.ino, m.is_dir, sign)),
            }
        }
        let mut weights: Vec<(u64, Weight)> = Vec::with_capacity(net.len());
        let mut homes: Vec<(u64, u64, i64)> = Vec::new();
        for (dir, ino, is_dir, sign) in net {
            if sign == 0 {
                continue;
            }
            if is_dir
                && sign < 0
                && let Some(owed) = st.take_owed_of(ino)
            {
                // Paid to the ancestors it had, before it leaves them: the
                // ones it will have are owed by its weight below.
                pay(&self.store, st, work, dir, owed)?;
            }
            let w = if is_dir {
                // What the directory holds moves with it. Its own counts
                // do not change in the same operation: it is never above
                // the directory it moves out of or into.
                let i = match work.inodes.get(&ino) {
                    Some(i) => i.clone(),
                    None => self.inode(st, ino)?,
                };
                let s = self.stats_with_shares(st, ino, &i)?.unwrap_or_default();
                Weight {
                    files: 0,
                    rfiles: s.rfiles as i64 * sign,
                    rsubdirs: (s.rsubdirs as i64 + 1) * sign,
                    rbytes: s.rbytes as i64 * sign,
                    rblocks: s.rblocks as i64 * sign,
                }
            } else {
                let i = self.w_get(st, work, ino)?;
                let (size, blocks) = (i.size, self.kept_blocks(i));
                homes.push((ino, dir, sign));
                Weight {
                    files: sign,
                    rfiles: sign,
                    rsubdirs: 0,
                    rbytes: size as i64 * sign,
                    rblocks: blocks as i64 * sign,
                }
            };
            weights.push((dir, w));
        }
        for (ino, dir, sign) in homes {
            let i = self.w_get(st, work, ino)?;
            for _ in 0..sign.abs() {
                if sign > 0 {
                    add_home(i, dir);
                } else {
                    drop_home(i, dir);
                }
            }
        }
        if lazy {
            // The directories holding the entries at once (loaded first:
            // nothing changes unless all are had), their ancestors later.
            for &(dir, _) in &weights {
                if !work.inodes.contains_key(&dir) {
                    self.load(st, dir)?;
                    st.defer(dir);
                    self.store.note_deferred();
                }
            }
            for (dir, w) in weights {
                match work.inodes.get_mut(&dir) {
                    Some(i) => w.apply_to(i),
                    None => {
                        if let Some(c) = st.cached(dir) {
                            w.apply_to(&mut c.inode);
                        }
                    }
                }
                if dir != crate::core::volume::ROOT_INO {
                    st.owe(dir, Weight { files: 0, ..w });
                    // Owed counts go with this operation's batch, like
                    // deferred records (the committer pays them first).
                    self.store.note_deferred();
                }
            }
            return Ok(());
        }
        // Every directory whose counts move, with what moves them: first
        // all of them (nothing changes yet), then the limits, then the
        // change, so that a refused operation leaves every count as it was.
        let mut deltas: Vec<(u64, Weight)> = Vec::new();
        for (dir, w) in weights {
            self.chain(st, work, dir, |at, depth| {
                let w = if depth == 0 {
                    w
                } else {
                    Weight { files: 0, ..w }
                };
                match deltas.iter_mut().find(|(d, _)| *d == at) {
                    Some((_, sum)) => sum.add(w),
                    None => deltas.push((at, w)),
                }
            })?;
        }
        // Every directory with a limit met is cached by now.
        if st.quotas_seen() {
            self.quotas_hold(st, work, &deltas)?;
        }
        let deferred = self.defers_stats();
        for (dir, w) in deltas {
            if !deferred {
                // Several daemons: what lies below moves this session's
                // share of the directory (see `format::shares`), never its
                // record, whose recursive counts change only when every
                // share is folded in at once — so they never go below
                // zero on the way. Its own entries' count is its own.
                work.shares.push((dir, Weight { files: 0, ..w }.share()));
                if w.files != 0 {
                    let files = Weight {
                        files: w.files,
                        ..Weight::default()
                    };
                    files.apply_to(self.w_get(st, work, dir)?);
                }
            } else if let Some(i) = work.inodes.get_mut(&dir) {
                w.apply_to(i);
            } else if let Some(c) = st.cached(dir) {
                // Written once per batch, not once per operation: an
                // ancestor changes in every operation below it. (Counts
                // do not change what the entry costs the cache.)
                w.apply_to(&mut c.inode);
            }
        }
        Ok(())
    }

    /// `dir`'s statistics (`inode` its record) with every session's share
    /// of them in: on a volume several daemons serve, this session's from
    /// memory, the others' read once and then followed.
    pub(super) fn stats_with_shares(
        &self,
        st: &mut State,
        dir: u64,
        inode: &Inode,
    ) -> Result<Option<DirStats>> {
        let Some(mut s) = inode.stats else {
            return Ok(None);
        };
        if self.defers_stats() {
            return Ok(Some(s));
        }
        // Summed before they are applied: one share may be negative
        // where another holds what it takes away.
        let mut shares = st.own_share(dir).copied().unwrap_or_default();
        let others = match st.other_shares_of(dir) {
            Some(o) => o,
            None => {
                let (start, end) = keys::ino_range(keys::P_SHARE, dir);
                let me = st.session_id();
                let mut found = std::collections::BTreeMap::new();
                for (k, v) in self.store.scan(&start, &end, usize::MAX)? {
                    let Some(session) = keys::share_session(&k).filter(|&s| s != me) else {
                        continue;
                    };
                    let share = DirShare::decode(&k, &v).map_err(|e| CoreError::corrupt(&k, e))?;
                    found.insert(session, share);
                }
                st.set_other_shares(dir, found);
                st.other_shares_of(dir).unwrap_or_default()
            }
        };
        shares.add(&others);
        shares.apply_to(&mut s);
        Ok(Some(s))
    }

    /// Adds an operation's moves of this session's shares (`shares`) to
    /// them, with their records into `w`.
    pub(super) fn put_shares(
        &self,
        st: &mut State,
        w: &mut Vec<crate::meta::Write>,
        shares: Vec<(u64, DirShare)>,
    ) {
        let me = st.session_id();
        for (dir, d) in shares {
            if d.is_empty() {
                continue;
            }
            let now = st.add_own_share(dir, &d);
            w.push((keys::dir_share(dir, me).to_vec(), Some(now.encode(dir, me))));
        }
    }

    /// The blocks of non-directory `i` its directories count: none on
    /// volumes that do not keep them (their records must not gain them).
    fn kept_blocks(&self, i: &Inode) -> u64 {
        if self.sb.has_full_dir_stats() {
            i.blocks
        } else {
            0
        }
    }

    /// Whether moved counts of directories an operation does not otherwise
    /// write are deferred to the batch (`state::State::defer`) rather than
    /// written with each operation: on volumes this daemon alone writes.
    pub(super) fn defers_stats(&self) -> bool {
        !self.store.is_shared()
    }

    /// Calls `f` with `dir` and each of its ancestors, and its depth (0
    /// for `dir`). Where counts are deferred, each directory not in `work`
    /// is marked deferred as it is met, so that it stays cached whatever
    /// is loaded after it (marked and left unchanged, it is written as it
    /// was: harmless).
    fn chain(
        &self,
        st: &mut State,
        work: &Work,
        dir: u64,
        mut f: impl FnMut(u64, usize),
    ) -> Result<()> {
        let deferred = self.defers_stats();
        if deferred {
            self.store.note_deferred();
        }
        let mut at = dir;
        for depth in 0..MAX_DEPTH {
            let parent = match work.inodes.get(&at) {
                Some(i) => i.parent,
                None => {
                    let p = self.load(st, at)?.inode.parent;
                    if deferred {
                        st.defer(at);
                    }
                    p
                }
            };
            f(at, depth);
            match up_from(at, parent) {
                Some(up) => at = up,
                None => return Ok(()),
            }
        }
        Err(loop_at(at))
    }

    /// Raises the recursive change time of `from` and of its ancestors to
    /// `sec` (a ctime just written below or at them), up to the first one
    /// already there: its ancestors are too, for none is ever behind a
    /// directory below it. Within a second, that is the first directory.
    pub(super) fn raise_rctime(
        &self,
        st: &mut State,
        work: &mut Work,
        from: u64,
        sec: i64,
    ) -> Result<()> {
        let deferred = self.defers_stats();
        let mut at = from;
        for _ in 0..MAX_DEPTH {
            let (rctime, parent) = match work.inodes.get(&at) {
                Some(i) => (i.stats.map(|s| s.rctime), i.parent),
                None => {
                    let i = &self.load(st, at)?.inode;
                    let (r, p) = (i.stats.map(|s| s.rctime), i.parent);
                    // This session's share raised it already, and every
                    // directory above (other sessions' shares may be
                    // ahead too: raising again is harmless).
                    let own = st.own_share(at).map_or(0, |s| s.rctime);
                    (r.map(|r| r.max(own)), p)
                }
            };
            match rctime {
                Some(r) if r < sec => {}
                _ => return Ok(()),
            }
            let raise = |i: &mut Inode| {
                if let Some(s) = i.stats.as_mut() {
                    s.rctime = sec;
                }
            };
            if let Some(i) = work.inodes.get_mut(&at) {
                raise(i);
            } else if deferred {
                st.defer(at);
                self.store.note_deferred();
                if let Some(c) = st.cached(at) {
                    raise(&mut c.inode);
                }
            } else {
                work.shares.push((
                    at,
                    DirShare {
                        rctime: sec,
                        ..DirShare::default()
                    },
                ));
            }
            match up_from(at, parent) {
                Some(up) => at = up,
                None => return Ok(()),
            }
        }
        Err(loop_at(at))
    }

    /// The recursive change times for the inodes `work` changed (their
    /// ctimes as they will be written): each directory's own, and those
    /// of the directories naming each other inode, and up.
    pub(super) fn rctimes_of_work(&self, st: &mut State, work: &mut Work) -> Result<()> {
        for ino in work.dirty.clone() {
            let i = &work.inodes[&ino];
            let sec = i.ctime.sec;
            if i.is_dir() {
                self.raise_rctime(st, work, ino, sec)?;
            } else {
                for home in i.homes() {
                    self.raise_rctime(st, work, home, sec)?;
                }
            }
        }
        Ok(())
    }

    /// [`Fs::rctimes_of_work`] for one inode written alone (`inode`, not
    /// yet in the cache): its own raised in place, the others' put in `w`
    /// or deferred.
    pub(super) fn rctimes_of(
        &self,
        st: &mut State,
        w: &mut Vec<crate::meta::Write>,
        ino: u64,
        inode: &mut Inode,
    ) -> Result<()> {
        let sec = inode.ctime.sec;
        let mut work = Work::new();
        if let Some(s) = inode.stats.as_mut() {
            s.rctime = s.rctime.max(sec);
            if let Some(up) = up_from(ino, inode.parent) {
                self.raise_rctime(st, &mut work, up, sec)?;
            }
        } else if !inode.is_dir() {
            for home in inode.homes() {
                self.raise_rctime(st, &mut work, home, sec)?;
            }
        }
        for at in std::mem::take(&mut work.dirty) {
            let i = work.inodes.remove(&at).expect("dirty inode loaded");
            self.put_inode_as_is(st, w, at, i);
        }
        self.put_shares(st, w, std::mem::take(&mut work.shares));
        Ok(())
    }

    /// `EDQUOT` if the operation would take a directory with a limit past
    /// it: the counts it leaves (`deltas` added) against those before, so
    /// a rename within a tree with a limit, which adds nothing to it, is
    /// never refused, nor a change that shrinks a tree already over a
    /// limit set below it.
    fn quotas_hold(&self, st: &mut State, work: &Work, deltas: &[(u64, Weight)]) -> Result<()> {
        for &(dir, w) in deltas {
            let before = match work.inodes.get(&dir) {
                Some(i) => i,
                None => &self.load(st, dir)?.inode,
            };
            let q = before.quota;
            if q.is_none() {
                continue;
            }
            let before = before.clone();
            let Some(b) = self.stats_with_shares(st, dir, &before)? else {
                continue;
            };
            let over = |before: u64, delta: i64, max: u64| {
                let after = moved_by(before, delta);
                max > 0 && after > max && after > before
            };
            if over(b.rfiles + b.rsubdirs, w.rfiles + w.rsubdirs, q.max_files)
                || over(b.rbytes, w.rbytes, q.max_bytes)
            {
                return Err(CoreError::Quota);
            }
        }
        Ok(())
    }

    /// Before `inode` (a non-directory) is written: if its size changed,
    /// the same change to the bytes of every directory naming it and of
    /// their ancestors, written into `w` beside it.
    pub(super) fn account_size(
        &self,
        st: &mut State,
        w: &mut Vec<crate::meta::Write>,
        ino: u64,
        inode: &Inode,
    ) -> Result<()> {
        if inode.parent == 0 {
            return Ok(()); // no name: nothing counts it
        }
        let before = match st.cached(ino) {
            Some(c) => (c.inode.size, self.kept_blocks(&c.inode)),
            None => {
                let key = keys::inode(ino);
                match self.store.get(&key)? {
                    Some(rec) => {
                        let i =
                            Inode::decode(&key, &rec).map_err(|e| CoreError::corrupt(&key, e))?;
                        (i.size, self.kept_blocks(&i))
                    }
                    None => return Ok(()), // new: its entry brings its bytes
                }
            }
        };
        let w8 = Weight {
            rbytes: inode.size as i64 - before.0 as i64,
            rblocks: self.kept_blocks(inode) as i64 - before.1 as i64,
            ..Weight::default()
        };
        if w8.rbytes == 0 && w8.rblocks == 0 {
            return Ok(());
        }
        if self.defers_stats() && !st.quotas_seen() {
            for home in inode.homes() {
                self.load(st, home)?;
                st.defer(home);
                self.store.note_deferred();
                if let Some(c) = st.cached(home) {
                    w8.apply_to(&mut c.inode);
                }
                if home != crate::core::volume::ROOT_INO {
                    st.owe(home, w8);
                    self.store.note_deferred();
                }
            }
            return Ok(());
        }
        let none = Work::new();
        for home in inode.homes() {
            let mut dirs = Vec::new();
            self.chain(st, &none, home, |at, _| dirs.push(at))?;
            for at in dirs {
                if self.defers_stats() {
                    if let Some(c) = st.cached(at) {
                        w8.apply_to(&mut c.inode);
                    }
                } else {
                    self.put_shares(st, w, vec![(at, w8.share())]);
                }
            }
        }
        Ok(())
    }

    /// The value of statistic `name` (`safs.dir.…`) of `ino`, as decimal
    /// text; `NoData` where the inode keeps none (not a directory, or a
    /// volume formatted before they were kept) or no such statistic.
    pub(super) fn dir_stat(&self, st: &mut State, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        pay_owed(&self.store, st, &mut Work::new());
        let i = self.inode(st, ino)?;
        let Some(s) = self.stats_with_shares(st, ino, &i)? else {
            return Err(CoreError::NoData);
        };
        let subdirs = u64::from(i.nlink.saturating_sub(2));
        let v = match &name[PREFIX.len()..] {
            b"files" => s.files,
            b"subdirs" => subdirs,
            b"entries" => s.files + subdirs,
            b"rfiles" => s.rfiles,
            b"rsubdirs" => s.rsubdirs,
            b"rentries" => s.rfiles + s.rsubdirs,
            b"rbytes" => s.rbytes,
            b"rctime" if self.sb.has_full_dir_stats() => s.rctime as u64,
            b"rallocated" if self.sb.has_full_dir_stats() => s.rblocks * 512,
            _ => return Err(CoreError::NoData),
        };
        Ok(v.to_string().into_bytes())
    }
}

/// Pays everything directories' ancestors owe (`State::owe`): each sum
/// is added up the chain of directories above it now. Before a batch is
/// taken and before counts are read or checked; during an operation, its
/// `work` copies take their share (they are written after). An ancestor
/// that cannot be read is left out, said in the log (`safs fsck` finds
/// the counts).
pub(super) fn pay_owed(store: &Store, st: &mut State, work: &mut Work) {
    if !st.has_owed() {
        return;
    }
    for (dir, w) in st.take_owed() {
        let parent = match super::load_in(store, st, dir) {
            Ok(Some(c)) => c.inode.parent,
            // Gone: what it owed was paid as it left (`account`).
            Ok(None) => continue,
            Err(e) => {
                tracing::error!(dir, error = %e, "directory statistics not moved above a directory");
                continue;
            }
        };
        if let Some(up) = up_from(dir, parent)
            && let Err(e) = pay(store, st, work, up, w)
        {
            tracing::error!(dir, error = %e, "directory statistics not moved above a directory");
        }
    }
}

/// Adds `w` to the recursive counts of `from` and each directory above
/// it, by the chain the cache holds (during an operation, the one before
/// it: a directory it moves is paid where it was), changing `work`'s copy
/// where it has one, else the cached entry (deferred).
fn pay(store: &Store, st: &mut State, work: &mut Work, from: u64, w: Weight) -> Result<()> {
    let mut at = from;
    for _ in 0..MAX_DEPTH {
        let parent = match super::load_in(store, st, at)? {
            Some(c) => c.inode.parent,
            None => return Err(CoreError::NotFound),
        };
        match work.inodes.get_mut(&at) {
            Some(i) => w.apply_to(i),
            None => {
                st.defer(at);
                store.note_deferred();
                if let Some(c) = st.cached(at) {
                    w.apply_to(&mut c.inode);
                }
            }
        }
        match up_from(at, parent) {
            Some(up) => at = up,
            None => return Ok(()),
        }
    }
    Err(loop_at(at))
}

/// The directory above `at` (whose `..` is `parent`), or `None` at the top.
pub(super) fn up_from(at: u64, parent: u64) -> Option<u64> {
    (at != crate::core::volume::ROOT_INO && parent != at && parent != 0).then_some(parent)
}

fn loop_at(at: u64) -> CoreError {
    CoreError::corrupt(
        &keys::inode(at),
        crate::format::FormatError::Malformed("directory parents loop"),
    )
}

/// A non-directory gains a name in `dir`: its first in `parent`, others in
/// `links`.
fn add_home(i: &mut Inode, dir: u64) {
    if i.parent == 0 {
        i.parent = dir;
    } else {
        i.links.push(dir);
    }
}

/// A non-directory loses a name in `dir`.
fn drop_home(i: &mut Inode, dir: u64) {
    if i.parent == dir {
        i.parent = i.links.pop().unwrap_or(0);
    } else if let Some(at) = i.links.iter().position(|&d| d == dir) {
        i.links.swap_remove(at);
    }
}
