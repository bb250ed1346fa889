//! Directory entries: both halves of each (`D` by name, `C` by cookie),
//! the inodes they name, link counts, and `/lost+found` for inodes that
//! lost every name.

use super::*;

const LOST_FOUND: &[u8] = b"lost+found";

impl Checker<'_> {
    pub(super) fn pass_entries(&mut self) -> Result<()> {
        // D: name → (ino, kind, cookie)
        let mut dirents: HashMap<(u64, Vec<u8>), Dirent> = HashMap::new();
        self.each(keys::P_DIRENT, |c, k, v| {
            let parent = keys::key_ino(&k).unwrap_or(0);
            let entry = match c.names.entry_name(&k) {
                Ok(name) => decoded(&v, |v| Dirent::decode(&k, v)).map(|d| (name, d)),
                Err(_) => Err("its name does not decrypt: changed or moved".to_string()),
            };
            match entry {
                Ok((name, d)) => {
                    dirents.insert((parent, name), d);
                }
                Err(e) => {
                    c.find(format!("entry {}: unreadable ({e})", c.describe(&k)), true);
                    c.delete(&k);
                }
            }
        })?;
        // C: cookie → (ino, kind, name)
        let mut index: HashMap<(u64, Vec<u8>), (u64, IndexEntry)> = HashMap::new();
        self.each(keys::P_DIRINDEX, |c, k, v| {
            let parent = keys::key_ino(&k).unwrap_or(0);
            let cookie = keys::key_cookie(&k).unwrap_or(0);
            match decoded(&v, |v| IndexEntry::decode(&k, v)) {
                Ok(e) => {
                    index.insert((parent, e.name.clone()), (cookie, e));
                }
                Err(e) => {
                    c.find(
                        format!("index entry {}: unreadable ({e})", c.describe(&k)),
                        true,
                    );
                    c.delete(&k);
                }
            }
        })?;
        let mut names: Vec<_> = dirents.keys().chain(index.keys()).cloned().collect();
        names.sort();
        names.dedup();
        for (parent, name) in names {
            self.report.entries += 1;
            let shown = format!("{parent}/{}", String::from_utf8_lossy(&name));
            let d = dirents.get(&(parent, name.clone())).cloned();
            let x = index.get(&(parent, name.clone())).cloned();
            let parent_ok = self
                .inodes
                .get(&parent)
                .is_some_and(|p| p.inode.is_dir() && p.inode.nlink > 0);
            let target = d
                .as_ref()
                .map(|d| d.ino)
                .or(x.as_ref().map(|x| x.1.ino))
                .unwrap_or(0);
            let target_kind = self.inodes.get(&target).map(|i| i.inode.dtype());
            let dk = self.names.dirent(parent, &name);
            if !parent_ok || target_kind.is_none() {
                let why = if parent_ok {
                    "names a missing inode"
                } else {
                    "is in a missing or non-directory parent"
                };
                self.find(format!("entry {shown} {why}"), true);
                self.delete(&dk);
                if let Some((cookie, _)) = &x {
                    self.delete(&keys::dir_index(parent, *cookie));
                }
                continue;
            }
            let kind = target_kind.expect("checked");
            match (&d, &x) {
                (Some(d), Some((cookie, e))) => {
                    if d.ino != e.ino || d.cookie != *cookie {
                        self.find(
                            format!("entry {shown}: name and index records disagree"),
                            true,
                        );
                        self.delete(&keys::dir_index(parent, *cookie));
                        self.add_index(parent, &name, d.ino, kind);
                    }
                }
                (Some(d), None) => {
                    self.find(format!("entry {shown}: index record missing"), true);
                    self.delete(&dk);
                    self.add_index(parent, &name, d.ino, kind);
                }
                (None, Some((cookie, e))) => {
                    self.find(format!("entry {shown}: name record missing"), true);
                    self.delete(&keys::dir_index(parent, *cookie));
                    self.add_index(parent, &name, e.ino, kind);
                }
                (None, None) => unreachable!("name came from one of the maps"),
            }
            if d.as_ref().is_some_and(|d| d.kind != kind) {
                self.find(format!("entry {shown}: type differs from its inode"), true);
                self.delete(&dk);
                self.add_index(parent, &name, target, kind);
            }
            if let Some(cookie) = d.as_ref().map(|d| d.cookie) {
                let p = self.inodes.get_mut(&parent).expect("parent checked");
                if cookie >= p.inode.next_cookie {
                    p.inode.next_cookie = cookie + 1;
                    p.dirty = true;
                    self.find(
                        format!("directory {parent}: next cookie below an entry's cookie"),
                        true,
                    );
                }
            }
            let is_dir = u32::from(kind) << 12 == S_IFDIR;
            if is_dir && parent == ROOT_INO && name == LOST_FOUND {
                self.lost_found = Some(target);
            }
            let t = self.inodes.get_mut(&target).expect("checked");
            t.names += 1;
            let p = self.inodes.get_mut(&parent).expect("checked");
            if is_dir {
                p.subdirs += 1;
                self.inodes.get_mut(&target).expect("checked").named_in = Some(parent);
            } else {
                p.files += 1;
                self.inodes
                    .get_mut(&target)
                    .expect("checked")
                    .homes
                    .push(parent);
            }
        }
        Ok(())
    }

    /// Writes a fresh `D`+`C` pair (repair only), taking a new cookie.
    pub(super) fn add_index(&mut self, parent: u64, name: &[u8], ino: u64, kind: u8) {
        if !self.repair {
            return;
        }
        let p = self.inodes.get_mut(&parent).expect("parent exists");
        let cookie = p.inode.next_cookie.max(crate::core::FIRST_COOKIE);
        p.inode.next_cookie = cookie + 1;
        p.dirty = true;
        let dk = self.names.dirent(parent, name);
        let d = Dirent { ino, kind, cookie };
        self.writes.push((dk.clone(), Some(d.encode(&dk))));
        let ck = keys::dir_index(parent, cookie);
        let e = IndexEntry {
            ino,
            kind,
            name: name.to_vec(),
        };
        self.writes.push((ck.to_vec(), Some(e.encode(&ck))));
    }

    pub(super) fn link_into_lost_found(&mut self, ino: u64) {
        if !self.repair {
            return;
        }
        let lf = self.lost_found();
        let kind = {
            let info = self.inodes.get_mut(&ino).expect("lost inode listed");
            info.names = 1;
            info.inode.nlink = if info.inode.is_dir() {
                2 + info.subdirs
            } else {
                1
            };
            if info.inode.is_dir() {
                info.inode.parent = lf;
                info.named_in = Some(lf);
            }
            let k = keys::inode(ino);
            let rec = info.inode.encode(&k);
            self.writes.push((k.to_vec(), Some(rec)));
            info.inode.dtype()
        };
        let name = format!("#{ino}");
        self.add_index(lf, name.as_bytes(), ino, kind);
        let l = self.inodes.get_mut(&lf).expect("made");
        if u32::from(kind) << 12 == S_IFDIR {
            l.inode.nlink += 1;
            l.subdirs += 1;
        } else {
            l.files += 1;
            self.inodes.get_mut(&ino).expect("lost inode listed").homes = vec![lf];
        }
        self.write_inode(lf);
        self.write_inode(ROOT_INO);
    }

    pub(super) fn write_inode(&mut self, ino: u64) {
        if let Some(info) = self.inodes.get(&ino) {
            let k = keys::inode(ino);
            let rec = info.inode.encode(&k);
            self.writes.push((k.to_vec(), Some(rec)));
        }
    }

    /// The `/lost+found` directory: the one the entries pass found, or
    /// made on first use.
    pub(super) fn lost_found(&mut self) -> u64 {
        if let Some(ino) = self.lost_found {
            return ino;
        }
        let ino = self
            .inodes
            .keys()
            .next_back()
            .copied()
            .unwrap_or(ROOT_INO)
            .max(self.next_ino_floor())
            + 1;
        let now = Timestamp::now();
        let inode = Inode {
            mode: S_IFDIR | 0o700,
            nlink: 2,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            generation: 1,
            parent: ROOT_INO,
            next_cookie: crate::core::FIRST_COOKIE,
            stats: self.dir_stats.then(|| crate::format::inode::DirStats {
                rctime: if self.rctime { now.sec } else { 0 },
                ..Default::default()
            }),
            ..Default::default()
        };
        let kind = inode.dtype();
        self.inodes.insert(
            ino,
            Info {
                inode,
                names: 1,
                subdirs: 0,
                files: 0,
                homes: Vec::new(),
                named_in: Some(ROOT_INO),
                spill_seen: 0,
                spill_lost: false,
                overflow_seen: 0,
                has_symlink: false,
                orphan_marker: false,
                writer_marker: false,
                dirty: true,
            },
        );
        self.add_index(ROOT_INO, LOST_FOUND, ino, kind);
        let root = self.inodes.get_mut(&ROOT_INO).expect("root");
        root.inode.nlink += 1;
        root.subdirs += 1;
        self.write_inode(ino);
        self.lost_found = Some(ino);
        ino
    }
}
