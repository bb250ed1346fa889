//! Records attached to inodes: spill sets, overflow values, symlink
//! targets, orphan and writer markers.

use std::collections::HashSet;

use super::*;
use crate::format::spill::MAX_PAGES;

impl Checker<'_> {
    pub(super) fn pass_attachments(&mut self) -> Result<()> {
        // Pages of one inode come together (key order): the names seen in
        // its earlier pages, to find one in two pages.
        let mut paged: (u64, HashSet<Vec<u8>>) = (u64::MAX, HashSet::new());
        self.each(keys::P_SPILL, |c, k, v| {
            let ino = keys::key_ino(&k).unwrap_or(0);
            let page = keys::spill_page_of(&k);
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
            let set = match (page, set) {
                (None, _) => Err("not a spill page's key".to_string()),
                (Some(p), Ok(_)) if p >= MAX_PAGES => Err(format!("page {p} out of range")),
                (Some(_), set) => set,
            };
            match set {
                Ok(set) => {
                    info.spill_seen += set.packed_len();
                    let dup = set.names().any(|n| info.inode.inline.contains(n));
                    c.report.xattr_records += 1;
                    if paged.0 != ino {
                        paged = (ino, HashSet::new());
                    }
                    let twice = set.names().any(|n| !paged.1.insert(n.to_vec()));
                    if dup {
                        c.find(
                            format!("inode {ino}: an xattr is both inline and spilled"),
                            false,
                        );
                    }
                    if twice {
                        c.find(
                            format!("inode {ino}: an xattr is in two spill pages"),
                            false,
                        );
                    }
                }
                Err(e) => {
                    // The sweep then sets the spill size to what is left.
                    info.spill_lost = true;
                    let what = match page {
                        Some(p) if p > 0 => format!(
                            "spill record unreadable (page {p}: {e}); the xattrs in it are lost"
                        ),
                        _ => format!("spill record unreadable ({e}); its xattrs are lost"),
                    };
                    c.find(format!("inode {ino}: {what}"), true);
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
