//! Directory quotas (CephFS's `ceph.quota.*`): `safs.quota.max_bytes` and
//! `safs.quota.max_files`, set as xattrs by root on a directory of a
//! volume that keeps statistics, kept in the directory's record, and
//! enforced against its statistics (`stats`): a change that would take a
//! directory's `rbytes` past `max_bytes`, or its `rentries` past
//! `max_files`, fails with `EDQUOT` — for every directory above it that
//! has a limit, so nested quotas all hold.
//!
//! Bytes reach the limit three ways: entries (a link or a rename brings a
//! file's size; a rename of a directory everything below it), a size set
//! (truncate up, `fallocate`), and writes. Passthrough writes never reach
//! the daemon, so a file with a byte limit above it is served by the
//! daemon (every open of it, as the kernel mixes no passed-through and
//! daemon-served opens of one inode), and each write that extends it is
//! checked first (`Fs::write_allowed`).

use std::ops::ControlFlow;

use super::creds::CAP_SYS_ADMIN;
use super::error::{CoreError, Result};
use super::state::State;
use super::{Ctx, Fs, Ino};
use crate::format::inode::{DirStats, Inode, Quota, Timestamp};

/// The prefix of the limits' names.
pub const PREFIX: &[u8] = b"safs.quota.";

/// Deeper than any real tree (see `stats`).
const MAX_DEPTH: usize = 4096;

fn field<'q>(q: &'q mut Quota, name: &[u8]) -> Result<&'q mut u64> {
    match &name[PREFIX.len()..] {
        b"max_bytes" => Ok(&mut q.max_bytes),
        b"max_files" => Ok(&mut q.max_files),
        _ => Err(CoreError::NotSupported),
    }
}

impl Fs {
    /// `EDQUOT` unless `entries` more entries and `bytes` more bytes below
    /// `dir` keep every limit on it and above it. Where nothing grows,
    /// nothing is checked.
    pub(super) fn quota_allows(
        &self,
        st: &mut State,
        dir: u64,
        entries: i64,
        bytes: i64,
    ) -> Result<()> {
        if entries <= 0 && bytes <= 0 {
            return Ok(());
        }
        let over = |now: u64, more: i64, max: u64| {
            max > 0 && more > 0 && now.saturating_add(more as u64) > max
        };
        let mut passed = false;
        self.limits_above(st, dir, |q, s| {
            passed = over(s.rfiles + s.rsubdirs, entries, q.max_files)
                || over(s.rbytes, bytes, q.max_bytes);
            if passed {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        if passed {
            return Err(CoreError::Quota);
        }
        Ok(())
    }

    /// Calls `f` with the limits and counts of each directory with a quota,
    /// from `dir` up to the root, until it says to stop.
    fn limits_above(
        &self,
        st: &mut State,
        dir: u64,
        mut f: impl FnMut(Quota, DirStats) -> ControlFlow<()>,
    ) -> Result<()> {
        // No directory with a limit cached since the mount: none lies
        // above anything reached since (reaching it looks each directory
        // of the path up, which caches it). So no walk at every first
        // open of a file on volumes without quotas. Not where another
        // daemon may set one on a directory this one has cached since.
        if !st.quotas_seen() && !self.store.is_shared() {
            return Ok(());
        }
        // Callers hold no copies of directories an operation will write
        // (`make_node` pays with its own first).
        super::stats::pay_owed(&self.store, st, &mut super::namespace::Work::new());
        let mut at = dir;
        for _ in 0..MAX_DEPTH {
            let i = &self.load(st, at)?.inode;
            let parent = i.parent;
            if !i.quota.is_none() {
                let i = i.clone();
                if let Some(s) = self.stats_with_shares(st, at, &i)?
                    && f(i.quota, s).is_break()
                {
                    return Ok(());
                }
            }
            match super::stats::up_from(at, parent) {
                Some(up) => at = up,
                None => return Ok(()),
            }
        }
        Ok(())
    }

    /// [`Fs::quota_allows`] for a file growing by `bytes`: under each of
    /// the directories its names are in.
    pub(super) fn growth_allowed(&self, st: &mut State, inode: &Inode, bytes: u64) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        for home in inode.homes() {
            self.quota_allows(st, home, 0, bytes as i64)?;
        }
        Ok(())
    }

    /// Before a write of a bounded handle (see `files::Handle`) over
    /// `[offset, end)`: where it may end — `end`, or short of it where a
    /// limit leaves less room (a short write, as a local filesystem's
    /// quota gives), `EDQUOT` where it leaves none past `offset`. What it
    /// adds past the recorded size is recorded at once (the bytes of every
    /// directory above move), so that writers of other files in the tree
    /// count it too: no write through the daemon passes a limit. (Not on
    /// volumes whose contents are in an object store, where a size is
    /// recorded only with the block map naming its blocks: there the check
    /// counts this file's growth since its last close, and writers of
    /// other files at the same time can together pass the limit by what
    /// they wrote since theirs.)
    pub(super) fn write_allowed(&self, ino: u64, offset: u64, end: u64) -> Result<u64> {
        let _space = if self.remote.is_none() {
            Some(self.writable()?)
        } else {
            None
        };
        let mut st = self.state.lock();
        let mut inode = self.inode(&mut st, ino)?;
        if end <= inode.size {
            return Ok(end);
        }
        let room = self.room(&mut st, &inode)?;
        let end = end.min(inode.size.saturating_add(room));
        if end <= offset {
            return Err(CoreError::Quota);
        }
        if self.remote.is_none() && end > inode.size {
            inode.size = end;
            let mut w = Vec::new();
            self.put_inode(&mut st, &mut w, ino, inode);
            self.commit(&mut st, w)?;
        }
        Ok(end)
    }

    /// How many bytes a file may grow by: the least room any byte limit
    /// above its names leaves.
    fn room(&self, st: &mut State, inode: &Inode) -> Result<u64> {
        Ok(self
            .byte_limits_above(st, inode, false)?
            .into_iter()
            .map(|(max, used)| max.saturating_sub(used))
            .min()
            .unwrap_or(u64::MAX))
    }

    /// Whether a byte limit lies above any of the names of `inode`.
    pub(super) fn bytes_limited(&self, st: &mut State, inode: &Inode) -> Result<bool> {
        if !self.sb.has_dir_stats() {
            return Ok(false);
        }
        Ok(!self.byte_limits_above(st, inode, true)?.is_empty())
    }

    /// (max_bytes, rbytes) of each directory with a byte limit above the
    /// names of `inode` (the first only, with `first`).
    fn byte_limits_above(
        &self,
        st: &mut State,
        inode: &Inode,
        first: bool,
    ) -> Result<Vec<(u64, u64)>> {
        let mut limits = Vec::new();
        for home in inode.homes() {
            self.limits_above(st, home, |q, s| {
                if q.max_bytes > 0 {
                    limits.push((q.max_bytes, s.rbytes));
                    if first {
                        return ControlFlow::Break(());
                    }
                }
                ControlFlow::Continue(())
            })?;
            if first && !limits.is_empty() {
                break;
            }
        }
        Ok(limits)
    }

    /// The limit `name` (`safs.quota.…`) of directory `ino`, as decimal
    /// text; `NoData` where none is set.
    pub(super) fn quota_get(&self, st: &mut State, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        let mut q = self.inode(st, ino)?.quota;
        match *field(&mut q, name)? {
            0 => Err(CoreError::NoData),
            v => Ok(v.to_string().into_bytes()),
        }
    }

    /// Sets (`Some`, decimal text; 0 removes) or removes (`None`) limit
    /// `name` of directory `ino`: root's (CAP_SYS_ADMIN) to change, as
    /// CephFS's. A limit below what the tree holds already is allowed: the
    /// tree can then only shrink.
    pub(super) fn quota_set(
        &self,
        ctx: &Ctx,
        ino: Ino,
        name: &[u8],
        value: Option<&[u8]>,
        flags: i32,
    ) -> Result<()> {
        let ino = ino.0;
        let limit = match value {
            None => 0,
            Some(v) => std::str::from_utf8(v)
                .ok()
                .map(|v| v.trim_end_matches('\0').trim())
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or(CoreError::Invalid)?,
        };
        let _space = self.writable()?;
        let mut st = self.state.lock();
        let mut inode = self.inode(&mut st, ino)?;
        if !inode.is_dir() || inode.stats.is_none() {
            // On files, and on volumes formatted before statistics.
            return Err(CoreError::NotSupported);
        }
        if !ctx.has_cap(CAP_SYS_ADMIN) {
            return Err(CoreError::Perm);
        }
        let slot = field(&mut inode.quota, name)?;
        let exists = *slot != 0;
        if flags & super::xattr::XATTR_CREATE != 0 && exists {
            return Err(CoreError::Exists);
        }
        if (flags & super::xattr::XATTR_REPLACE != 0 || value.is_none()) && !exists {
            return Err(CoreError::NoData);
        }
        *slot = limit;
        inode.ctime = Timestamp::now();
        let mut w = Vec::new();
        self.put_inode(&mut st, &mut w, ino, inode);
        self.commit(&mut st, w)
    }

    /// What `statfs` reports inside directory `ino` with a limit on it or
    /// above it (the nearest): (max bytes, bytes used, max entries, entries
    /// used), each limit 0 where none is set. As CephFS does, `df` and
    /// Samba then show a share's quota as its size.
    pub(super) fn quota_view(&self, st: &mut State, ino: u64) -> Result<Option<(Quota, u64, u64)>> {
        if !self.sb.has_dir_stats() {
            return Ok(None);
        }
        let mut at = ino;
        if !self.load(st, at)?.inode.is_dir() {
            at = self.load(st, at)?.inode.parent;
            if at == 0 {
                return Ok(None);
            }
        }
        let mut nearest = None;
        self.limits_above(st, at, |q, s| {
            nearest = Some((q, s.rbytes, s.rfiles + s.rsubdirs));
            ControlFlow::Break(())
        })?;
        Ok(nearest)
    }
}
