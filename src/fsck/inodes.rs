//! The first pass: every inode record decoded into the table the other
//! passes check against.

use super::*;

impl Checker<'_> {
    pub(super) fn pass_inodes(&mut self, total: u64, progress: Progress<'_>) -> Result<()> {
        let mut done = 0;
        self.each(keys::P_INODE, |c, k, v| {
            done += 1;
            if done % 4096 == 0 {
                progress("inodes", done, total);
            }
            let Some(ino) = keys::key_ino(&k).filter(|_| k.len() == 9) else {
                c.find(format!("malformed inode key {}", c.describe(&k)), true);
                c.delete(&k);
                return;
            };
            match decoded(&v, |v| Inode::decode(&k, v)) {
                Ok(inode) => {
                    c.inodes.insert(
                        ino,
                        Info {
                            inode,
                            names: 0,
                            subdirs: 0,
                            files: 0,
                            homes: Vec::new(),
                            named_in: None,
                            spill_seen: 0,
                            spill_lost: false,
                            overflow_seen: 0,
                            has_symlink: false,
                            orphan_marker: false,
                            writer_marker: false,
                            dirty: false,
                        },
                    );
                }
                Err(e) => c.find(format!("inode {ino}: unreadable record ({e})"), false),
            }
        })?;
        progress("inodes", done, total);
        self.report.inodes = self.inodes.len() as u64;
        Ok(())
    }
}
