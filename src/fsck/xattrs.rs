//! Records attached to inodes: spill sets, overflow values, symlink
//! targets, orphan and writer markers.

use super::*;

impl Checker<'_> {
    pub(super) fn pass_attachments(&mut self) -> Result<()> {
        self.each(keys::P_SPILL, |c, k, v| {
            let ino = keys::key_ino(&k).unwrap_or(0);
            let set = decoded(&v, |v| {
                open(&k, Kind::Spill, v)
                    .map_err(|e| e.to_string())
                    .and_then(|p| XattrSet::decode(p).map_err(|e| e.to_string()))
            });
            let Some(info) = c.inodes.get_mut(&ino) else {
                c.find(format!("spill record of missing inode {ino}"), true);
                c.delete(&k);
                return;
            };
            match set {
                Ok(set) => {
                    info.has_spill = true;
                    let wrong_size = info.inode.spill_len as usize != set.packed_len();
                    if wrong_size {
                        info.inode.spill_len = set.packed_len() as u32;
                        info.dirty = true;
                    }
                    let dup = set.names().any(|n| info.inode.inline.contains(n));
                    c.report.xattr_records += 1;
                    if wrong_size {
                        c.find(
                            format!("inode {ino}: spill size disagrees with its spill record"),
                            true,
                        );
                    }
                    if dup {
                        c.find(
                            format!("inode {ino}: an xattr is both inline and spilled"),
                            false,
                        );
                    }
                }
                Err(e) => {
                    info.inode.spill_len = 0;
                    info.dirty = true;
                    c.find(
                        format!("inode {ino}: spill record unreadable ({e}); its xattrs are lost"),
                        true,
                    );
                    c.delete(&k);
                }
            }
        })?;
        self.each(keys::P_OVERFLOW, |c, k, v| {
            let ino = keys::key_ino(&k).unwrap_or(0);
            let shown = c.describe(&k);
            if !c.inodes.contains_key(&ino) {
                c.find(format!("overflow xattr {shown} of a missing inode"), true);
                c.delete(&k);
                return;
            }
            let readable = match c.names.xattr_name(&k) {
                Err(_) => Err("its name does not decrypt: changed or moved".to_string()),
                Ok(_) => decoded(&v, |v| open(&k, Kind::Overflow, v).map(|_| ())),
            };
            match readable {
                Ok(()) => {
                    c.inodes.get_mut(&ino).expect("checked").overflow_seen += 1;
                    c.report.xattr_records += 1;
                }
                Err(e) => {
                    c.find(
                        format!("overflow xattr {shown}: unreadable ({e}); it is lost"),
                        true,
                    );
                    c.delete(&k);
                }
            }
        })?;
        self.each(keys::P_SYMLINK, |c, k, v| {
            let ino = keys::key_ino(&k).unwrap_or(0);
            let ok = decoded(&v, |v| decode_symlink(&k, v)).is_ok();
            match c.inodes.get_mut(&ino) {
                Some(info) if info.inode.is_symlink() && ok => info.has_symlink = true,
                Some(info) if info.inode.is_symlink() => {
                    info.has_symlink = true;
                    c.find(format!("symlink {ino}: target unreadable"), false);
                }
                _ => {
                    c.find(
                        format!("symlink target of missing or non-symlink inode {ino}"),
                        true,
                    );
                    c.delete(&k);
                }
            }
        })?;
        for prefix in [keys::P_ORPHAN, keys::P_WRITING] {
            self.each(prefix, |c, k, v| {
                let ino = keys::key_ino(&k).unwrap_or(0);
                let ok = decoded(&v, |v| decode_marker(&k, v)).is_ok();
                match c.inodes.get_mut(&ino) {
                    Some(info) if ok => {
                        if prefix == keys::P_ORPHAN {
                            info.orphan_marker = true;
                        } else {
                            info.writer_marker = true;
                        }
                    }
                    _ => {
                        c.find(
                            format!("stray or unreadable marker {}", c.describe(&k)),
                            true,
                        );
                        c.delete(&k);
                    }
                }
            })?;
        }
        Ok(())
    }
}
