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
use super::{Fs, keys};
use crate::format::dirent::Dirent;
use crate::format::inode::{Inode, S_IFDIR};

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
struct Weight {
    files: i64,
    rfiles: i64,
    rsubdirs: i64,
    rbytes: i64,
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
            let w = if is_dir {
                // What the directory holds moves with it. Its own counts
                // do not change in the same operation: it is never above
                // the directory it moves out of or into.
                let s = match work.inodes.get(&ino) {
                    Some(i) => i.stats,
                    None => self.inode(st, ino)?.stats,
                }
                .unwrap_or_default();
                Weight {
                    files: 0,
                    rfiles: s.rfiles as i64 * sign,
                    rsubdirs: (s.rsubdirs as i64 + 1) * sign,
                    rbytes: s.rbytes as i64 * sign,
                }
            } else {
                let size = self.w_get(st, work, ino)?.size;
                homes.push((ino, dir, sign));
                Weight {
                    files: sign,
                    rfiles: sign,
                    rsubdirs: 0,
                    rbytes: size as i64 * sign,
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
        for (dir, w) in weights {
            self.add_up(st, work, dir, w)?;
        }
        self.quotas_hold(st, work)
    }

    /// `EDQUOT` if the operation took a directory with a limit past it:
    /// checked on the counts it leaves (nothing is applied yet), against
    /// those before it, so a rename within a tree with a limit, which adds
    /// nothing to it, is never refused, nor a change that shrinks a tree
    /// already over a limit set below it.
    fn quotas_hold(&self, st: &mut State, work: &Work) -> Result<()> {
        for &dir in &work.dirty {
            let Some(after) = work.inodes.get(&dir) else {
                continue;
            };
            let (q, Some(a)) = (after.quota, after.stats) else {
                continue;
            };
            if q.is_none() {
                continue;
            }
            let Some(b) = self.load(st, dir)?.inode.stats else {
                continue;
            };
            let over = |before: u64, after: u64, max: u64| max > 0 && after > max && after > before;
            if over(b.rfiles + b.rsubdirs, a.rfiles + a.rsubdirs, q.max_files)
                || over(b.rbytes, a.rbytes, q.max_bytes)
            {
                return Err(CoreError::Quota);
            }
        }
        Ok(())
    }

    /// Adds `w` to `dir` (direct and recursive counts) and to the
    /// recursive counts of each of its ancestors.
    fn add_up(&self, st: &mut State, work: &mut Work, dir: u64, w: Weight) -> Result<()> {
        let mut at = dir;
        for depth in 0..MAX_DEPTH {
            let i = self.w_get(st, work, at)?;
            if let Some(s) = i.stats.as_mut() {
                if depth == 0 {
                    s.files = moved_by(s.files, w.files);
                }
                s.rfiles = moved_by(s.rfiles, w.rfiles);
                s.rsubdirs = moved_by(s.rsubdirs, w.rsubdirs);
                s.rbytes = moved_by(s.rbytes, w.rbytes);
            }
            match up_from(at, i.parent) {
                Some(up) => at = up,
                None => return Ok(()),
            }
        }
        Err(loop_at(at))
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
            Some(c) => c.inode.size,
            None => {
                let key = keys::inode(ino);
                match self.store.get(&key)? {
                    Some(rec) => {
                        Inode::decode(&key, &rec)
                            .map_err(|e| CoreError::corrupt(&key, e))?
                            .size
                    }
                    None => return Ok(()), // new: its entry brings its bytes
                }
            }
        };
        let delta = inode.size as i64 - before as i64;
        if delta == 0 {
            return Ok(());
        }
        for &home in std::iter::once(&inode.parent).chain(&inode.links) {
            let mut at = home;
            for _ in 0..MAX_DEPTH {
                let mut d = self.inode(st, at)?;
                if let Some(s) = d.stats.as_mut() {
                    s.rbytes = moved_by(s.rbytes, delta);
                }
                let up = up_from(at, d.parent);
                self.put_inode_as_is(st, w, at, d);
                match up {
                    Some(up) => at = up,
                    None => break,
                }
            }
        }
        Ok(())
    }

    /// The value of statistic `name` (`safs.dir.…`) of `ino`, as decimal
    /// text; `NoData` where the inode keeps none (not a directory, or a
    /// volume formatted before they were kept) or no such statistic.
    pub(super) fn dir_stat(&self, st: &mut State, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        let i = self.inode(st, ino)?;
        let Some(s) = i.stats else {
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
            _ => return Err(CoreError::NoData),
        };
        Ok(v.to_string().into_bytes())
    }
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
