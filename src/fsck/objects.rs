//! On a volume whose contents are in an object store: the store against
//! the block maps. Every object a block record names must be in the store
//! with the record's length — and with `--data-check`, the record's hash:
//! every object is read. An object missing or damaged is lost data unless
//! this node's cache (the backing file) still holds the block's bytes,
//! which `--repair` uploads again.
//!
//! An object that no record names and no queued deletion covers is what
//! an upload cut short leaves (its objects were sent, its batch never
//! committed), or a file freed while its upload ran: garbage, not damage
//! (listed as leftovers), which `--repair` deletes. Objects queued for
//! deletion (`Q`) are the mount's to delete.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;

use super::*;
use crate::format::blocks::{self, BLOCK, BlockRef};
use crate::objstore::{self, Store};

/// A block record that names an object.
struct Named {
    ino: u64,
    block: u32,
    len: u32,
    hash: [u8; 16],
    kind: blocks::Hash,
}

/// Connects to the store the volume's `U` record names, with this
/// process's credentials, and checks that it answers.
pub(super) fn connect(raw: &dyn MetaStore) -> Result<Store> {
    let url = match raw.get(keys::DATA_STORE)? {
        Some(rec) => blocks::decode_store(&rec).map_err(|e| {
            FsckError::Io(std::io::Error::other(format!(
                "the volume's object store record is unreadable: {e}"
            )))
        })?,
        None => {
            return Err(FsckError::Io(std::io::Error::other(
                "the volume says its contents are in an object store, but names none",
            )));
        }
    };
    let store = Store::new(
        objstore::StoreConfig::from_env(&url)?,
        objstore::Limits::default(),
    )?;
    store.check()?;
    Ok(store)
}

impl Checker<'_> {
    pub(super) fn check_objects(&mut self, progress: Progress<'_>) -> Result<()> {
        let (named, pending) = self.named_objects()?;
        // Records of missing inodes go before their objects can.
        self.flush()?;
        let store = self.objects.take().expect("a volume with an object store");
        let result = self.check_against(&store, named, pending, progress);
        self.objects = Some(store);
        result
    }

    /// Every object a block record names; block records of inodes that
    /// are missing or not regular files are findings (repair deletes them,
    /// and their objects with the other unnamed ones).
    fn named_objects(&mut self) -> Result<(BTreeMap<String, Named>, HashSet<String>)> {
        let mut named = BTreeMap::new();
        // Freed files whose blocks wait for the deleter: their records and
        // objects are its to delete, not findings.
        let (start, end) = keys::prefix_range(keys::P_DOOMED);
        let freed: HashSet<u64> = self
            .raw
            .scan(&start, &end, usize::MAX)?
            .into_iter()
            .filter(|(k, _)| keys::is_doomed_file(k))
            .filter_map(|(k, _)| keys::key_ino(&k))
            .collect();
        let mut pending = HashSet::new();
        self.each(keys::P_BLOCK, |c, k, v| {
            let (Some(ino), Some(block)) = (keys::key_ino(&k), keys::key_block(&k)) else {
                return;
            };
            let owner = c.inodes.get(&ino).map(|i| i.inode.is_reg());
            if owner.is_none() && freed.contains(&ino) {
                if let Ok(b) = decoded(&v, |v| BlockRef::decode(&k, v)) {
                    pending.insert(blocks::object_key(ino, block, b.generation));
                }
                return;
            }
            if owner != Some(true) {
                let what = if owner.is_some() {
                    "not a regular file"
                } else {
                    "missing"
                };
                c.find(
                    format!("block record {block} of inode {ino}, which is {what}"),
                    true,
                );
                c.delete(&k);
                if c.repair {
                    return;
                }
            }
            // Unreadable records are findings of the file's own check.
            if let Ok(b) = decoded(&v, |v| BlockRef::decode(&k, v))
                && b.has_object()
            {
                named.insert(
                    blocks::object_key(ino, block, b.generation),
                    Named {
                        ino,
                        block,
                        len: b.len,
                        hash: b.hash,
                        kind: b.kind,
                    },
                );
            }
        })?;
        Ok((named, pending))
    }

    fn check_against(
        &mut self,
        store: &Store,
        mut named: BTreeMap<String, Named>,
        pending: HashSet<String>,
        progress: Progress<'_>,
    ) -> Result<()> {
        let mut queued = pending;
        let (start, end) = keys::prefix_range(keys::P_DOOMED);
        for (k, _) in self.raw.scan(&start, &end, usize::MAX)? {
            if let (Some(ino), Some(b), Some(g)) =
                (keys::key_ino(&k), keys::key_block(&k), keys::key_gen(&k))
            {
                queued.insert(blocks::object_key(ino, b, g));
            }
        }
        let listed = store.list("b")?;
        let total = listed.len() as u64;
        let mut present = Vec::new();
        let mut unnamed = Vec::new();
        for (i, l) in listed.into_iter().enumerate() {
            if i % 1024 == 0 {
                progress("objects", i as u64, total);
            }
            match named.remove(&l.key) {
                Some(n) if u64::from(n.len) != l.size => {
                    let why = format!("holds {} bytes, its record says {}", l.size, n.len);
                    self.restore(store, &l.key, &n, &why);
                }
                Some(n) => present.push((l.key, n)),
                None if queued.contains(&l.key) => {}
                None if blocks::parse_object_key(&l.key).is_none() => self.find(
                    format!(
                        "object {} under the volume's prefix is not one safs makes: left alone",
                        l.key
                    ),
                    false,
                ),
                None => unnamed.push(l),
            }
        }
        for (key, n) in &named {
            self.restore(store, key, n, "is missing from the store");
        }
        if self.data_check {
            self.read_all(store, &present, progress)?;
        }
        for l in unnamed {
            self.leftover(format!(
                "object {} ({} bytes) is named by no block record (an upload cut short, \
                 or a file freed while it was uploaded){}",
                l.key,
                l.size,
                if self.repair { ": deleted" } else { "" }
            ));
            if self.repair {
                store.delete(&l.key)?;
            }
        }
        Ok(())
    }

    /// Reads every object in `present` and checks it against its record.
    fn read_all(
        &mut self,
        store: &Store,
        present: &[(String, Named)],
        progress: Progress<'_>,
    ) -> Result<()> {
        let keys: Vec<String> = present.iter().map(|(k, _)| k.clone()).collect();
        let total = keys.len() as u64;
        let mut damaged = Vec::new();
        // Hashed on the client's threads; each verdict comes back here.
        let expect: Arc<Vec<(u32, [u8; 16], blocks::Hash)>> = Arc::new(
            present
                .iter()
                .map(|(_, n)| (n.len, n.hash, n.kind))
                .collect(),
        );
        let read = store.get_each(
            &keys,
            move |i| {
                let (len, hash, kind) = expect[i];
                Damage {
                    len,
                    hash,
                    hasher: kind.hasher(),
                }
            },
            |i, bad| {
                if bad {
                    damaged.push(i);
                }
                if i % 64 == 0 {
                    progress("data", i as u64, total);
                }
                Ok(())
            },
        );
        match read {
            Ok(()) => {}
            Err(objstore::GetError::Store(e)) => return Err(e.into()),
            Err(objstore::GetError::Each(e)) => return Err(e.into()),
        }
        for i in damaged {
            let (key, n) = &present[i];
            self.restore(store, key, n, "does not match its record's hash (damaged)");
        }
        Ok(())
    }

    /// An object that is missing or damaged: uploaded again from this
    /// node's cache if the backing file holds the block's bytes, else the
    /// block's data is lost (reads of it fail with EIO).
    fn restore(&mut self, store: &Store, key: &str, n: &Named, why: &str) {
        let what = format!("file {} block {}: object {key} {why}", n.ino, n.block);
        let Some(bytes) = self.cached_block(n) else {
            self.find(
                format!("{what}; no cache holds its bytes: that block reads as an error"),
                false,
            );
            return;
        };
        if !self.repair {
            self.find(format!("{what}; the local cache holds its bytes"), true);
            return;
        }
        match store.put(key, bytes) {
            Ok(()) => self.find(format!("{what}; uploaded again from the local cache"), true),
            Err(e) => self.find(
                format!("{what}; uploading it again from the local cache failed: {e}"),
                false,
            ),
        }
    }

    /// Block `n`'s bytes from its file's backing file, if they are there.
    fn cached_block(&self, n: &Named) -> Option<Vec<u8>> {
        let f = File::open(self.backing_path(n.ino)).ok()?;
        let mut buf = vec![0u8; n.len as usize];
        f.read_exact_at(&mut buf, u64::from(n.block) * BLOCK).ok()?;
        (n.kind.of(&buf) == n.hash).then_some(buf)
    }
}

/// Whether an object read back differs from its record: hashed as it
/// arrives, never kept.
struct Damage {
    len: u32,
    hash: [u8; 16],
    hasher: blocks::Hasher,
}

impl objstore::Sink for Damage {
    type Made = bool;

    fn piece(&mut self, _at: u64, data: bytes::Bytes) -> std::io::Result<()> {
        self.hasher.update(&data);
        Ok(())
    }

    fn end(self, len: u64) -> std::io::Result<bool> {
        Ok(len != u64::from(self.len) || self.hasher.finish() != self.hash)
    }
}
