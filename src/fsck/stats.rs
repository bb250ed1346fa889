//! Directory statistics (`core::stats`): every directory's counts
//! recomputed from the entries found, deepest directories first, and
//! compared with what its record says; and each non-directory's list of
//! the directories naming it, which its size changes follow.

use super::*;
use crate::format::inode::DirStats;

impl Checker<'_> {
    pub(super) fn dir_stats(&mut self) {
        if !self.dir_stats {
            return;
        }
        self.homes();
        self.fold_shares();
        // Depth of each named directory, by its chain of names up to the
        // root (bounded: a loop of names is reported elsewhere).
        let mut order: Vec<(usize, u64)> = Vec::new();
        let mut want: HashMap<u64, DirStats> = HashMap::new();
        for (&ino, info) in &self.inodes {
            if !info.inode.is_dir() || (ino != ROOT_INO && info.names == 0) {
                continue;
            }
            let mut depth = 0;
            let mut at = ino;
            while at != ROOT_INO && depth < 4096 {
                match self.inodes.get(&at).and_then(|i| i.named_in) {
                    Some(up) => at = up,
                    None => break,
                }
                depth += 1;
            }
            order.push((depth, ino));
            want.insert(
                ino,
                DirStats {
                    files: info.files,
                    rfiles: info.files,
                    rsubdirs: u64::from(info.subdirs),
                    rbytes: 0,
                    rctime: if self.rctime { info.inode.ctime.sec } else { 0 },
                    rblocks: 0,
                },
            );
        }
        for info in self.inodes.values().filter(|i| !i.inode.is_dir()) {
            for home in &info.homes {
                if let Some(w) = want.get_mut(home) {
                    w.rbytes += info.inode.size;
                    if self.rctime {
                        w.rctime = w.rctime.max(info.inode.ctime.sec);
                        w.rblocks += info.inode.blocks;
                    }
                }
            }
        }
        // Children before their parents: each adds its totals to its
        // parent's once its own are complete.
        order.sort_unstable_by(|a, b| b.cmp(a));
        for &(_, ino) in &order {
            if ino == ROOT_INO {
                continue;
            }
            let Some(up) = self.inodes.get(&ino).and_then(|i| i.named_in) else {
                continue;
            };
            let mine = want[&ino];
            if let Some(p) = want.get_mut(&up) {
                p.rfiles += mine.rfiles;
                p.rsubdirs += mine.rsubdirs;
                p.rbytes += mine.rbytes;
                p.rctime = p.rctime.max(mine.rctime);
                p.rblocks += mine.rblocks;
            }
        }
        if self.adding_dir_stats {
            self.report.dir_stats_added = Some(order.len() as u64);
        }
        for (_, ino) in order {
            let mut w = want[&ino];
            let info = self.inodes.get_mut(&ino).expect("listed");
            if let Some(h) = info.inode.stats
                && h.rctime > w.rctime
            {
                // Newer than anything left below: what was there changed
                // and then left (a removal moves the parent's ctime, but a
                // clock set back does not). Never behind, but may be ahead.
                w.rctime = h.rctime;
            }
            let Some(h) = info.inode.stats.replace(w) else {
                if !self.adding_dir_stats {
                    self.find(format!("directory {ino}: statistics missing"), true);
                }
                self.put_inode_of(ino);
                continue;
            };
            if h == w {
                continue;
            }
            let mut what = format!(
                "directory {ino}: statistics say {} files here, {} files, {} directories \
                 and {} bytes below; a walk finds {}, {}, {} and {}",
                h.files, h.rfiles, h.rsubdirs, h.rbytes, w.files, w.rfiles, w.rsubdirs, w.rbytes
            );
            if h.rctime != w.rctime {
                what += &format!("; newest change {} s, but {} s below", h.rctime, w.rctime);
            }
            if h.rblocks != w.rblocks {
                what += &format!(
                    "; {} blocks allocated below, but the files hold {}",
                    h.rblocks, w.rblocks
                );
            }
            // After an unclean stop the walk counts sizes the sweep took
            // from backing files, which the next mount's reconciliation
            // moves the counts by: only bytes and blocks may lag, by design.
            let counts = |s: DirStats| (s.files, s.rfiles, s.rsubdirs, s.rctime);
            if counts(h) == counts(w) {
                self.leftover_or_find(what);
            } else {
                self.find(what, true);
            }
            self.put_inode_of(ino);
        }
    }

    /// Each named non-directory's record of the directories naming it
    /// (`parent` and `links`) against the entries found.
    fn homes(&mut self) {
        let mut wrong = Vec::new();
        for (&ino, info) in &self.inodes {
            let i = &info.inode;
            if i.is_dir() || info.names == 0 {
                continue;
            }
            let mut have: Vec<u64> = std::iter::once(i.parent)
                .filter(|&p| p != 0)
                .chain(i.links.iter().copied())
                .collect();
            let mut seen = info.homes.clone();
            have.sort_unstable();
            seen.sort_unstable();
            if have != seen {
                wrong.push((ino, have, seen));
            }
        }
        for (ino, have, seen) in wrong {
            if !self.adding_dir_stats {
                self.find(
                    format!("inode {ino}: named in directories {have:?}, but entries in {seen:?}"),
                    true,
                );
            }
            let i = &mut self.inodes.get_mut(&ino).expect("listed").inode;
            i.parent = seen.first().copied().unwrap_or(0);
            i.links = seen.get(1..).unwrap_or_default().to_vec();
            self.put_inode_of(ino);
        }
    }

    /// Sessions' shares of directories' statistics (`format::shares`),
    /// added to the counts their directories' records say before those
    /// are checked; with `repair`, folded into the records and deleted
    /// (nothing serves the volume). A share that does not read, or of a
    /// directory that is gone, is a finding.
    fn fold_shares(&mut self) {
        let mut shares: Vec<(Vec<u8>, Value)> = Vec::new();
        if let Err(e) = self.each(keys::P_SHARE, |_, k, v| shares.push((k, v))) {
            self.find(
                format!("shares of directory statistics unreadable ({e})"),
                false,
            );
            return;
        }
        // Summed per directory first: one share may be negative where
        // another holds what it takes away.
        let mut folded: BTreeMap<u64, crate::format::shares::DirShare> = BTreeMap::new();
        for (k, v) in shares {
            let dir = keys::key_ino(&k).unwrap_or(0);
            let share = match v {
                Ok(v) => crate::format::shares::DirShare::decode(&k, &v).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            let share = match share {
                Ok(s) if keys::share_session(&k).is_some() => s,
                Ok(_) => {
                    self.find(format!("malformed share key {}", describe_key(&k)), true);
                    self.delete(&k);
                    continue;
                }
                Err(e) => {
                    self.find(format!("share {} unreadable ({e})", describe_key(&k)), true);
                    self.delete(&k);
                    continue;
                }
            };
            match self.inodes.get(&dir).and_then(|i| i.inode.stats) {
                Some(_) => folded.entry(dir).or_default().add(&share),
                None => self.find(
                    format!("share {} of a directory that is gone", describe_key(&k)),
                    true,
                ),
            }
            self.delete(&k);
        }
        for (dir, share) in folded {
            if let Some(s) = self
                .inodes
                .get_mut(&dir)
                .and_then(|i| i.inode.stats.as_mut())
            {
                share.apply_to(s);
            }
            self.put_inode_of(dir);
        }
    }

    fn put_inode_of(&mut self, ino: u64) {
        let k = keys::inode(ino);
        let rec = self.inodes[&ino].inode.encode(&k);
        self.put(&k, rec);
    }
}
