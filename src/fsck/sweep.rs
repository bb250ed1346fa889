//! The final sweep: link counts, sizes and spill/overflow counts against
//! what the passes found, inodes nothing names, backing files no inode
//! owns, and the volume counters.

use super::*;

impl Checker<'_> {
    /// Compares counts with inodes, markers with link counts, backing files
    /// with sizes.
    pub(super) fn sweep(&mut self) -> Result<()> {
        let inos: Vec<u64> = self.inodes.keys().copied().collect();
        let mut lost = Vec::new();
        for ino in inos {
            let mut info = self.inodes.remove(&ino).expect("listed");
            let i = &mut info.inode;
            // Orphans: reclaimed at mount, so reclaim them here too.
            if info.orphan_marker || (i.nlink == 0 && info.names == 0) {
                if info.names > 0 {
                    // A marker on a named inode: drop the marker.
                    self.find(
                        format!("inode {ino}: orphan marker on a linked inode"),
                        true,
                    );
                    self.delete(&keys::orphan(ino));
                } else {
                    if info.orphan_marker {
                        self.leftover(format!(
                            "inode {ino}: unlinked while open when the daemon stopped; \
                             its space is freed at recovery"
                        ));
                    } else {
                        self.find(
                            format!("inode {ino}: unlinked inode without an orphan marker"),
                            true,
                        );
                    }
                    if self.repair {
                        self.orphans += 1;
                        self.free(ino, i);
                    } else {
                        // Still there, counted and owning its backing file.
                        self.inodes.insert(ino, info);
                    }
                    continue;
                }
            }
            // Before the sizes: repair may finish a killed truncate's cut.
            if i.is_reg() {
                self.open_blocks(ino);
            }
            if info.writer_marker {
                self.leftover(format!(
                    "file {ino}: an open-for-writing marker of an early build; \
                     its size is taken from its backing file"
                ));
                if self.repair {
                    self.delete(&keys::writing(ino));
                    if let Ok(m) = std::fs::metadata(self.backing_path(ino)) {
                        let size = self.backing_size(ino, m.size())?;
                        if size != i.size {
                            i.size = size;
                            i.blocks = m.blocks();
                            info.dirty = true;
                        }
                    }
                }
            }
            let want_links = if i.is_dir() {
                2 + info.subdirs
            } else {
                info.names
            };
            if ino != ROOT_INO && info.names == 0 {
                lost.push(ino);
            } else if i.nlink != want_links {
                self.find(
                    format!("inode {ino}: link count {} should be {want_links}", i.nlink),
                    true,
                );
                i.nlink = want_links;
                info.dirty = true;
            }
            if i.is_dir() {
                if info.names > 1 {
                    self.find(format!("directory {ino} has {} names", info.names), false);
                }
                let parent = if ino == ROOT_INO {
                    Some(ROOT_INO)
                } else {
                    info.named_in
                };
                if let Some(p) = parent {
                    if i.parent != p {
                        self.find(
                            format!("directory {ino}: '..' is {} but it lives in {p}", i.parent),
                            true,
                        );
                        i.parent = p;
                        info.dirty = true;
                    }
                }
            }
            if i.spill_len as usize != info.spill_seen {
                // An unreadable page was reported (and goes) already.
                if !info.spill_lost {
                    self.find(
                        if info.spill_seen == 0 {
                            format!(
                                "inode {ino}: spill record missing; its spilled xattrs are lost"
                            )
                        } else {
                            format!("inode {ino}: spill size disagrees with its spill pages")
                        },
                        true,
                    );
                }
                i.spill_len = info.spill_seen as u32;
                info.dirty = true;
            }
            if i.overflow != info.overflow_seen {
                self.find(
                    format!(
                        "inode {ino}: overflow count {} should be {}",
                        i.overflow, info.overflow_seen
                    ),
                    true,
                );
                i.overflow = info.overflow_seen;
                info.dirty = true;
            }
            if i.is_symlink() && !info.has_symlink {
                self.find(format!("symlink {ino}: target missing"), false);
            }
            if i.is_reg() && self.remote {
                self.check_block_map(ino, i, &mut info.dirty)?;
            } else if i.is_reg() && !info.writer_marker {
                match std::fs::metadata(self.backing_path(ino)) {
                    Ok(m) => {
                        let size = self.backing_size(ino, m.size())?;
                        if size != i.size {
                            self.leftover_or_find(format!(
                                "file {ino}: size {} but its backing file holds {size}",
                                i.size
                            ));
                            i.size = size;
                            i.blocks = m.blocks();
                            info.dirty = true;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && i.size > 0 => {
                        if self.unclean {
                            // Its name never became durable: nothing fsync'd
                            // it (an fsync makes the name durable too), so
                            // the crash took the contents, as it may.
                            self.leftover(format!(
                                "file {ino}: its {} bytes were never made durable and the \
                                 stop lost them; it is empty",
                                i.size
                            ));
                            i.size = 0;
                            i.blocks = 0;
                            info.dirty = true;
                        } else {
                            self.find(
                                format!("file {ino}: backing file missing ({} bytes lost)", i.size),
                                false,
                            );
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        self.find(format!("file {ino}: backing file unreadable: {e}"), false);
                    }
                }
            }
            if info.dirty {
                let k = keys::inode(ino);
                let rec = i.encode(&k);
                self.put(&k, rec);
            }
            self.inodes.insert(ino, info);
        }
        for ino in lost {
            self.find(format!("inode {ino} has no name"), true);
            self.link_into_lost_found(ino);
        }
        self.sweep_backing()?;
        Ok(())
    }

    pub(super) fn free(&mut self, ino: u64, inode: &Inode) {
        for k in [
            keys::inode(ino),
            keys::spill(ino),
            keys::symlink(ino),
            keys::orphan(ino),
            keys::writing(ino),
        ] {
            self.writes.push((k.to_vec(), None));
        }
        for (wanted, prefix) in [
            (inode.spill_len > 0, keys::P_SPILL),
            (inode.overflow > 0, keys::P_OVERFLOW),
            // Its objects then belong to no record: the object pass
            // deletes them.
            (inode.is_reg() && self.remote, keys::P_BLOCK),
        ] {
            if !wanted {
                continue;
            }
            let (s, e) = keys::ino_range(prefix, ino);
            // Keys only: the engine's own scan, which opens no value.
            if let Ok(recs) = self.raw.scan(&s, &e, usize::MAX) {
                for (k, _) in recs {
                    self.writes.push((k, None));
                }
            }
        }
        let _ = std::fs::remove_file(self.backing_path(ino));
    }

    pub(super) fn next_ino_floor(&self) -> u64 {
        volume::read_counters(self.store).map_or(0, |c| c.next_ino)
    }

    /// Every session's counters record; unreadable ones are a finding
    /// (repaired with the counters: see [`Checker::counters`]).
    pub(super) fn sessions(&mut self) -> BTreeMap<u64, SessionCounters> {
        match volume::read_sessions(self.store) {
            Ok(s) => s,
            Err(e) => {
                self.find(format!("{e}"), true);
                self.sessions_corrupt = true;
                BTreeMap::new()
            }
        }
    }

    pub(super) fn sweep_backing(&mut self) -> Result<()> {
        // The pool makes backing files ahead for the next inode numbers: a
        // crash leaves them, one line says so.
        let ahead_from = self.next_ino_floor();
        // And within the blocks sessions reserved (made by their pools).
        let blocks: Vec<std::ops::Range<u64>> = volume::read_sessions(self.store)
            .map(|s| s.values().map(|s| s.start..s.end).collect())
            .unwrap_or_default();
        let mut ahead = 0u64;
        for (i, dir) in self.layout.backing_dirs() {
            let Ok(rd) = std::fs::read_dir(&dir) else {
                self.find(format!("backing directory {} missing", dir.display()), true);
                if self.repair {
                    std::fs::create_dir_all(&dir)?;
                }
                continue;
            };
            for e in rd.flatten() {
                let ino = crate::core::volume::backing_ino(&e.file_name(), i);
                let owned = ino
                    .and_then(|i| self.inodes.get(&i))
                    .is_some_and(|i| i.inode.is_reg());
                if !owned {
                    if self.unclean
                        && ino.is_some_and(|i| {
                            i >= ahead_from || blocks.iter().any(|b| b.contains(&i))
                        })
                    {
                        ahead += 1;
                    } else if self.remote && ino.is_some_and(|i| !self.inodes.contains_key(&i)) {
                        // Only a node's cache: the copy of a file another
                        // node freed while this one held it cached.
                        self.leftover(format!(
                            "cached copy {} of a file freed since (on another node)",
                            e.path().display()
                        ));
                    } else {
                        self.leftover_or_find(format!(
                            "backing file {} belongs to no file",
                            e.path().display()
                        ));
                    }
                    if self.repair {
                        std::fs::remove_file(e.path())?;
                    }
                }
            }
        }
        if ahead > 0 {
            self.leftover(format!(
                "{ahead} backing files made ahead for inodes not yet created, removed at recovery"
            ));
        }
        Ok(())
    }

    /// `N` and the sessions' records against the inodes found: the count
    /// is `N`'s plus every session's share, and `N.next_ino` lies above
    /// every inode and every session's block. Repair writes `N` whole and
    /// deletes the sessions' records (nothing serves the volume).
    pub(super) fn counters(&mut self) -> Result<()> {
        let found = volume::read_counters(self.store);
        let sessions = self.sessions();
        let max = self.inodes.keys().next_back().copied().unwrap_or(ROOT_INO);
        let blocks_end = sessions.values().map(|s| s.end).max().unwrap_or(0);
        let live = self.inodes.len() as u64;
        let fresh = Counters {
            next_ino: (max + 1).max(blocks_end),
            inodes: live,
        };
        let mut rewrite = self.sessions_corrupt;
        match found {
            Ok(c) => {
                if c.next_ino <= max {
                    self.find(
                        format!("next inode number {} is not above inode {max}", c.next_ino),
                        true,
                    );
                    rewrite = true;
                } else if c.next_ino < blocks_end {
                    self.find(
                        format!(
                            "next inode number {} is inside a session's block (up to {blocks_end})",
                            c.next_ino
                        ),
                        true,
                    );
                    rewrite = true;
                }
                let shares: i64 = sessions.values().map(|s| s.inodes).sum();
                let counted = c.inodes.saturating_add_signed(shares);
                // Orphans freed here were counted until now.
                let expected = live + self.orphans;
                if counted != expected {
                    self.find(format!("inode count {counted} should be {expected}"), true);
                }
                if counted != live {
                    rewrite = true;
                }
                if rewrite {
                    self.put(
                        keys::COUNTERS,
                        Counters {
                            next_ino: c.next_ino.max(fresh.next_ino),
                            inodes: live,
                        }
                        .encode(),
                    );
                }
            }
            Err(volume::VolumeError::CorruptCounters(e)) => {
                self.find(format!("counters record unreadable ({e})"), true);
                self.put(keys::COUNTERS, fresh.encode());
                rewrite = true;
            }
            Err(volume::VolumeError::Meta(MetaError::Sealed(_))) => {
                self.find(format!("counters record unreadable ({Unsealed})"), true);
                self.put(keys::COUNTERS, fresh.encode());
                rewrite = true;
            }
            Err(volume::VolumeError::NoCounters) => {
                self.find("counters record missing".into(), true);
                self.put(keys::COUNTERS, fresh.encode());
                rewrite = true;
            }
            Err(e) => return Err(e.into()),
        }
        if rewrite {
            // `N` now holds the whole count: the shares go.
            let (start, end) = keys::prefix_range(keys::P_SESSION);
            for (k, _) in self.raw.scan(&start, &end, usize::MAX)? {
                self.delete(&k);
            }
        }
        Ok(())
    }
}
