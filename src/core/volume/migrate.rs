//! `safs migrate`: a volume's metadata moved to another engine in place —
//! LMDB to PostgreSQL and back — without touching its contents (they stay
//! in `data/` or the object store, which the records name the same way on
//! every engine).
//!
//! Engines hold the same ordered key-value pairs, so a migration is a copy
//! of every pair in key order, the superblock last (its presence in the
//! target marks a finished copy), a digest of both sides compared, and a
//! switch of the volume's `meta/` directory to the new engine by one
//! rename. Sealed records move as they are: an encrypted volume needs no
//! passphrase.
//!
//! The volume is always the old one or the new one, never neither:
//! - to PostgreSQL: the old `data.mdb` stays where `meta::open` looks
//!   first until `postgres.conf` is in place (written aside, renamed in);
//!   only then is it moved into `meta/lmdb-before-migration/`;
//! - to LMDB: the new store is built in `meta/migrating/` and renamed to
//!   `meta/data.mdb` once verified; `postgres.conf` then becomes
//!   `postgres.conf.before-migration`.
//!
//! A run cut short (a crash, Ctrl-C) is run again: an unfinished copy is
//! thrown away and made anew; a finished one whose digest still matches is
//! switched to.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::Digest;

use super::{Layout, VolumeError, VolumeLock, io_err, read_superblock};
use crate::format::keys;
use crate::meta::{self, EngineKind, MetaRead, MetaStore, NewEngine, PgStore, Write};

/// Pairs read and committed at a time.
const PAGE: usize = 4096;
/// Where the LMDB store of a volume moved to PostgreSQL is kept.
pub const LMDB_BACKUP: &str = "lmdb-before-migration";
/// Where a PostgreSQL volume's connection file goes once moved to LMDB.
pub const PG_BACKUP: &str = "postgres.conf.before-migration";
/// Where the LMDB store of a migration to LMDB is built.
const BUILDING: &str = "migrating";

/// What a migration did, for the user.
#[derive(Debug)]
pub struct Migrated {
    pub from: EngineKind,
    pub to: EngineKind,
    pub pairs: u64,
    pub bytes: u64,
    /// Where the old engine's data stays (for the user to delete).
    pub left: String,
}

/// Progress: (pairs copied, pairs in all).
pub type Progress<'a> = &'a dyn Fn(u64, u64);

/// Moves the unmounted volume at `dir` to `target`; see the module comment.
pub fn migrate(
    dir: &Path,
    target: &NewEngine,
    progress: Progress<'_>,
) -> Result<Migrated, VolumeError> {
    let layout = Layout::new(dir);
    let meta_dir = layout.meta();
    let from =
        EngineKind::detect(&meta_dir).ok_or_else(|| VolumeError::NotAVolume(dir.to_path_buf()))?;
    let _lock = VolumeLock::acquire(&layout)?;
    match (from, target) {
        (EngineKind::Lmdb, NewEngine::Lmdb) | (EngineKind::Postgres, NewEngine::Postgres(_)) => {
            Err(VolumeError::Migrate(format!(
                "{} is already on that engine ({})",
                dir.display(),
                meta::describe(&meta_dir)
            )))
        }
        (EngineKind::Lmdb, NewEngine::Postgres(conninfo)) => {
            to_postgres(dir, &meta_dir, conninfo, progress)
        }
        (EngineKind::Postgres, NewEngine::Lmdb) => to_lmdb(dir, &meta_dir, progress),
    }
}

/// Claims the source so that no daemon anywhere serves it meanwhile.
fn claim(store: &dyn MetaStore, dir: &Path) -> Result<(), VolumeError> {
    let me = meta::Session::of_this_process("(safs migrate)".into());
    store.claim(&me).map_err(|e| match e {
        meta::MetaError::Claimed(who) => VolumeError::Busy(who),
        e => VolumeError::Migrate(format!("cannot claim {}: {e}", dir.display())),
    })
}

fn to_postgres(
    dir: &Path,
    meta_dir: &Path,
    conninfo: &str,
    progress: Progress<'_>,
) -> Result<Migrated, VolumeError> {
    let source = meta::open(meta_dir)?;
    let sb_bytes = source
        .get(keys::SUPERBLOCK)?
        .ok_or(VolumeError::NoSuperblock)?;
    read_superblock(source.as_ref())?;
    let target: Arc<dyn MetaStore> = match PgStore::open(conninfo) {
        // A database that holds a volume: ours, from a run cut short, or
        // another's (refused).
        Ok(existing) => match existing.get(keys::SUPERBLOCK)? {
            Some(sb) if sb == sb_bytes => Arc::new(existing),
            Some(_) => {
                return Err(VolumeError::Migrate(format!(
                    "the database {} holds another volume; give an empty one",
                    existing.shown()
                )));
            }
            // A copy that never finished: made anew.
            None => Arc::new(PgStore::create(conninfo, true)?),
        },
        Err(_) => Arc::new(PgStore::create(conninfo, false)?),
    };
    claim(target.as_ref(), dir)?;
    let (pairs, bytes) = copy(source.as_ref(), target.as_ref(), progress)?;
    drop(source);
    // The switch: postgres.conf in place, then the LMDB files aside.
    let conf = meta_dir.join(meta::POSTGRES_CONF);
    let aside = meta_dir.join(format!("{}.new", meta::POSTGRES_CONF));
    write_synced(&aside, format!("{}\n", conninfo.trim()).as_bytes())?;
    let backup = meta_dir.join(LMDB_BACKUP);
    fs::create_dir_all(&backup).map_err(io_err(&backup))?;
    fs::rename(&aside, &conf).map_err(io_err(&conf))?;
    for f in ["data.mdb", "lock.mdb"] {
        let p = meta_dir.join(f);
        if p.exists() {
            fs::rename(&p, backup.join(f)).map_err(io_err(&p))?;
        }
    }
    sync_dir(meta_dir)?;
    Ok(Migrated {
        from: EngineKind::Lmdb,
        to: EngineKind::Postgres,
        pairs,
        bytes,
        left: format!(
            "the LMDB store is kept in {} (delete it once the volume serves you)",
            backup.display()
        ),
    })
}

fn to_lmdb(dir: &Path, meta_dir: &Path, progress: Progress<'_>) -> Result<Migrated, VolumeError> {
    let conninfo = meta::postgres_conninfo(meta_dir)?;
    let source = meta::open(meta_dir)?;
    read_superblock(source.as_ref())?;
    claim(source.as_ref(), dir)?;
    let building = meta_dir.join(BUILDING);
    // A run cut short left its copy: made anew (a local copy is quick).
    if building.exists() {
        fs::remove_dir_all(&building).map_err(io_err(&building))?;
    }
    fs::create_dir(&building).map_err(io_err(&building))?;
    let (pairs, bytes) = {
        let target = meta::create(&building, &NewEngine::Lmdb, false)?;
        copy(source.as_ref(), target.as_ref(), progress)?
    };
    drop(source);
    let db = building.join("data.mdb");
    fs::rename(&db, meta_dir.join("data.mdb")).map_err(io_err(&db))?;
    let conf = meta_dir.join(meta::POSTGRES_CONF);
    fs::rename(&conf, meta_dir.join(PG_BACKUP)).map_err(io_err(&conf))?;
    fs::remove_dir_all(&building).map_err(io_err(&building))?;
    sync_dir(meta_dir)?;
    Ok(Migrated {
        from: EngineKind::Postgres,
        to: EngineKind::Lmdb,
        pairs,
        bytes,
        left: format!(
            "the PostgreSQL database ({}) is left as it was, and its connection string in {} \
             (drop the database once the volume serves you)",
            meta::postgres::conninfo::parse(&conninfo).map_or(conninfo.clone(), |p| p.shown),
            meta_dir.join(PG_BACKUP).display()
        ),
    })
}

/// Copies every pair of `source` into `target` (superblock last, anything
/// `target` holds that `source` does not deleted), then compares digests
/// of both. Returns the pairs and bytes copied.
fn copy(
    source: &dyn MetaStore,
    target: &dyn MetaStore,
    progress: Progress<'_>,
) -> Result<(u64, u64), VolumeError> {
    let total = count(source)?;
    let mut done = 0u64;
    let mut bytes = 0u64;
    let mut superblock = None;
    // Whatever the target holds is overwritten; keys only it holds go.
    each_page(target, |page| {
        let stale: Vec<Write> = page
            .iter()
            .filter(|(k, _)| source.get(k).ok().flatten().is_none())
            .map(|(k, _)| (k.clone(), None))
            .collect();
        if !stale.is_empty() {
            target.commit(&stale)?;
        }
        Ok(())
    })?;
    each_page(source, |page| {
        let mut w: Vec<Write> = Vec::with_capacity(page.len());
        for (k, v) in page {
            bytes += (k.len() + v.len()) as u64;
            if k.as_slice() == keys::SUPERBLOCK {
                superblock = Some(v);
            } else {
                w.push((k, Some(v)));
            }
        }
        done += w.len() as u64;
        if !w.is_empty() {
            target.commit(&w)?;
        }
        progress(done, total);
        Ok(())
    })?;
    let sb = superblock.ok_or(VolumeError::NoSuperblock)?;
    // Commits are durable on return.
    target.commit(&[(keys::SUPERBLOCK.to_vec(), Some(sb))])?;
    progress(total, total);
    let (a, b) = (digest(source)?, digest(target)?);
    if a != b {
        return Err(VolumeError::Migrate(
            "the copy does not match the volume (changed meanwhile?); nothing was switched: \
             run the migration again"
                .into(),
        ));
    }
    Ok((total, bytes))
}

fn each_page(
    store: &dyn MetaStore,
    mut f: impl FnMut(Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), VolumeError>,
) -> Result<(), VolumeError> {
    // LMDB takes no empty key, even as a bound; no key starts with 0.
    let (mut start, end) = (vec![0u8], vec![0xff; 64]);
    loop {
        let page = store.scan(&start, &end, PAGE)?;
        let n = page.len();
        let Some((last, _)) = page.last() else {
            return Ok(());
        };
        start = last.clone();
        start.push(0);
        f(page)?;
        if n < PAGE {
            return Ok(());
        }
    }
}

fn count(store: &dyn MetaStore) -> Result<u64, VolumeError> {
    let mut n = 0;
    each_page(store, |page| {
        n += page.len() as u64;
        Ok(())
    })?;
    Ok(n)
}

/// SHA-256 of every pair in key order.
fn digest(store: &dyn MetaStore) -> Result<[u8; 32], VolumeError> {
    let mut h = sha2::Sha256::new();
    each_page(store, |page| {
        for (k, v) in page {
            h.update((k.len() as u64).to_be_bytes());
            h.update(&k);
            h.update((v.len() as u64).to_be_bytes());
            h.update(&v);
        }
        Ok(())
    })?;
    Ok(h.finalize().into())
}

fn write_synced(path: &PathBuf, bytes: &[u8]) -> Result<(), VolumeError> {
    use std::io::Write as _;
    let mut f = fs::File::create(path).map_err(io_err(path))?;
    f.write_all(bytes).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))
}

fn sync_dir(dir: &Path) -> Result<(), VolumeError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

/// Moves the contents of the unmounted volume at `dir` into the object
/// store at `url` (`safs migrate --data`): every file's backing file is
/// marked as holding what the store lacks, then the store record and the
/// superblock's feature bit are committed in one batch, and from then on
/// `data/` is a cache — the next mount uploads every marked file (as it
/// uploads what a killed daemon left), or the caller does now. A run cut
/// short before the batch leaves a volume whose contents are local, with
/// marks nothing reads; after it, the uploads finish at the next mount.
/// Returns how many files are to be uploaded.
pub fn to_object_store(dir: &Path, url: &str) -> Result<u64, VolumeError> {
    let layout = Layout::new(dir);
    let meta_dir = layout.meta();
    if EngineKind::detect(&meta_dir).is_none() {
        return Err(VolumeError::NotAVolume(dir.to_path_buf()));
    }
    let _lock = VolumeLock::acquire(&layout)?;
    let store = meta::open(&meta_dir)?;
    claim(store.as_ref(), dir)?;
    let mut sb = read_superblock(store.as_ref())?;
    if sb.has_object_store() {
        return Err(VolumeError::Migrate(format!(
            "{}'s contents are in an object store already",
            dir.display()
        )));
    }
    // The store answers and holds nothing but, after a run cut short,
    // this volume's name.
    let objects = super::check_data_store(url, true)?;
    let id = uuid::Uuid::from_bytes(sb.uuid).to_string();
    let listed = objects.list("").map_err(VolumeError::Store)?;
    let ours = |o: &crate::objstore::Listed| {
        o.key == super::VOLUME_OBJECT && objects.get(&o.key).is_ok_and(|b| b == id.as_bytes())
    };
    if !listed.iter().all(ours) {
        return Err(VolumeError::StoreInUse(url.to_string()));
    }
    objects
        .put(super::VOLUME_OBJECT, id.into_bytes())
        .map_err(VolumeError::Store)?;
    let mut marked = 0;
    for (i, sub) in layout.backing_dirs() {
        for e in fs::read_dir(&sub).map_err(io_err(&sub))?.flatten() {
            let Some(ino) = super::backing_ino(&e.file_name(), i) else {
                continue;
            };
            // The pool's made-ahead files belong to no inode yet.
            if store.get(&keys::inode(ino))?.is_none() {
                continue;
            }
            crate::core::remote::mark_dirty_at(&e.path()).map_err(|e2| {
                VolumeError::Migrate(format!(
                    "{}: {e2} (the filesystem under the volume must keep user xattrs for \
                     a volume whose contents are in an object store)",
                    e.path().display()
                ))
            })?;
            marked += 1;
        }
    }
    // The marks durable before the switch that makes them matter.
    let data = fs::File::open(layout.data()).map_err(io_err(&layout.data()))?;
    nix::unistd::syncfs(&data).map_err(|e| io_err(&layout.data())(e.into()))?;
    sb.features |= crate::format::superblock::FEATURE_OBJECT_STORE;
    store.commit(&[
        (
            keys::DATA_STORE.to_vec(),
            Some(crate::format::blocks::encode_store(url)),
        ),
        (keys::SUPERBLOCK.to_vec(), Some(sb.encode())),
    ])?;
    Ok(marked)
}
