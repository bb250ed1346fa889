//! `safs dump` and `safs load`: a volume's whole metadata as a streaming,
//! versioned text file, and back.
//!
//! The format (`docs/dump-format.md`) is JSON lines: a header line, one
//! line per record in key order — `{"key": "<readable key>", "k": "<hex>",
//! "v": "<hex>"}` — and an end line with the record count and the SHA-256
//! of every record, so a cut or edited file is refused. Records are the
//! engine's pairs byte for byte (an encrypted volume's stay sealed and its
//! names encrypted): any engine holds them, and dump → load → dump gives
//! the same file.
//!
//! A dump is one snapshot of the engine (`meta::snapshot_each`), taken
//! beside a daemon that goes on serving. A load writes a new engine beside
//! the volume's `meta/` and switches to it by renames only once every line
//! was read, the end line matched, and every record that names an inode
//! names one the dump holds: a refused load writes nothing the volume
//! uses.

use std::collections::HashSet;
use std::fs;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::{Layout, VolumeError, VolumeLock, io_err, make_data_dirs, make_dir, read_superblock};
use crate::core::error::describe_key;
use crate::format::keys;
use crate::format::superblock::Superblock;
use crate::meta::{self, MetaError, MetaStore, NewEngine, Write};

/// The format's name and the version this build writes and reads.
pub const FORMAT: &str = "safs-dump";
pub const VERSION: u32 = 1;
/// Records committed at a time by a load.
const BATCH: usize = 4096;
/// Where a load builds the new metadata, beside `meta/`.
const LOADING: &str = "meta.loading";

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    format: String,
    version: u32,
    /// The volume's uuid (hex).
    volume: String,
    encrypted: bool,
    /// Where the volume's contents are: `data/`, or an object store's URL.
    contents: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    /// The key as people read it (ignored by a load).
    key: String,
    k: String,
    v: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct End {
    records: u64,
    sha256: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EndLine {
    end: End,
}

/// What a dump or a load went through.
#[derive(Debug, Default)]
pub struct Summary {
    pub records: u64,
    pub bytes: u64,
    /// A load: where the metadata it replaced was kept.
    pub replaced: Option<PathBuf>,
}

/// A running digest of records, as the end line carries it.
#[derive(Default)]
struct Digest256(sha2::Sha256);

impl Digest256 {
    fn add(&mut self, k: &[u8], v: &[u8]) {
        self.0.update((k.len() as u64).to_be_bytes());
        self.0.update(k);
        self.0.update((v.len() as u64).to_be_bytes());
        self.0.update(v);
    }
    fn hex(self) -> String {
        hex::encode(self.0.finalize())
    }
}

/// Writes the metadata of the volume at `dir` (mounted or not) to `out`.
pub fn dump(dir: &Path, out: &mut dyn std::io::Write) -> Result<Summary, VolumeError> {
    let layout = Layout::new(dir);
    if !layout.is_volume() {
        return Err(VolumeError::NotAVolume(dir.to_path_buf()));
    }
    let (sb, contents) = {
        let (store, sb) = super::open_read_only(dir)?;
        let contents = match store.get(keys::DATA_STORE)? {
            Some(rec) => {
                crate::format::blocks::decode_store(&rec).map_err(VolumeError::CorruptSuperblock)?
            }
            None => "data/".into(),
        };
        (sb, contents)
    };
    let io = |e: std::io::Error| VolumeError::Io {
        path: PathBuf::from("(the dump)"),
        source: e,
    };
    let header = Header {
        format: FORMAT.into(),
        version: VERSION,
        volume: hex::encode(sb.uuid),
        encrypted: sb.is_encrypted(),
        contents,
    };
    writeln!(out, "{}", json(&header)).map_err(io)?;
    let mut sum = Summary::default();
    let mut digest = Digest256::default();
    let mut failed = None;
    meta::snapshot_each(&layout.meta(), &mut |k, v| {
        let line = Record {
            key: describe_key(k),
            k: hex::encode(k),
            v: hex::encode(v),
        };
        digest.add(k, v);
        sum.records += 1;
        sum.bytes += (k.len() + v.len()) as u64;
        writeln!(out, "{}", json(&line)).map_err(|e| {
            let text = e.to_string();
            failed = Some(e);
            MetaError::Engine(text)
        })
    })
    .map_err(|e| match failed.take() {
        Some(io_err) => io(io_err),
        None => e.into(),
    })?;
    let end = EndLine {
        end: End {
            records: sum.records,
            sha256: digest.hex(),
        },
    };
    writeln!(out, "{}", json(&end)).map_err(io)?;
    out.flush().map_err(io)?;
    Ok(sum)
}

fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("plain structures serialize")
}

/// A load refused at a line of its input.
fn at(line: u64, what: impl std::fmt::Display) -> VolumeError {
    VolumeError::Migrate(format!("line {line}: {what}; nothing was loaded"))
}

/// Restores the metadata `input` holds into the volume directory `dir` on
/// `engine`; see the module comment. `dir` may be missing or empty (a new
/// volume directory: its `data/` made empty, for contents in an object
/// store or copied in), or a volume (`replace` must be given: its `meta/`
/// is kept aside as `meta.before-load`).
pub fn load(
    input: &mut dyn BufRead,
    dir: &Path,
    engine: &NewEngine,
    replace: bool,
    progress: &dyn Fn(u64),
) -> Result<Summary, VolumeError> {
    let layout = Layout::new(dir);
    let exists = dir.exists() && fs::read_dir(dir).map_err(io_err(dir))?.next().is_some();
    if exists && !replace {
        return Err(if layout.is_volume() {
            VolumeError::Migrate(format!(
                "{} holds a volume: give --replace to replace its metadata (the old one is \
                 kept in meta.before-load)",
                dir.display()
            ))
        } else {
            VolumeError::NotEmpty(dir.to_path_buf())
        });
    }
    let created = make_dir(dir)?;
    let _lock = VolumeLock::acquire(&layout)?;
    let loading = dir.join(LOADING);
    if loading.exists() {
        fs::remove_dir_all(&loading).map_err(io_err(&loading))?;
    }
    fs::create_dir(&loading).map_err(io_err(&loading))?;
    let undo = |made_tables: bool| {
        if let (true, NewEngine::Postgres(conninfo)) = (made_tables, engine) {
            let _ = crate::meta::PgStore::remove(conninfo);
        }
        let _ = fs::remove_dir_all(&loading);
        if created {
            let _ = fs::remove_dir_all(dir);
        }
    };
    // A database that holds a volume is refused here, before anything.
    let store = match meta::create(&loading, engine, false) {
        Ok(store) => store,
        Err(e) => {
            undo(false);
            return Err(e.into());
        }
    };
    let read = read_into(input, store.as_ref(), progress);
    drop(store);
    let mut sum = match read {
        Ok(sum) => sum,
        Err(e) => {
            undo(true);
            return Err(e);
        }
    };
    // The switch: the old metadata aside, the new in its place.
    let meta_dir = layout.meta();
    if meta_dir.exists() {
        let aside = dir.join("meta.before-load");
        if aside.exists() {
            fs::remove_dir_all(&aside).map_err(io_err(&aside))?;
        }
        fs::rename(&meta_dir, &aside).map_err(io_err(&meta_dir))?;
        sum.replaced = Some(aside);
    }
    fs::rename(&loading, &meta_dir).map_err(io_err(&loading))?;
    if !layout.data().exists() {
        make_data_dirs(&layout)?;
    }
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))?;
    Ok(sum)
}

/// Reads every line of `input` into `store` (see [`load`]).
fn read_into(
    input: &mut dyn BufRead,
    store: &dyn MetaStore,
    progress: &dyn Fn(u64),
) -> Result<Summary, VolumeError> {
    let mut lines = input.lines();
    let mut n = 0u64;
    let mut next = || -> Result<Option<String>, VolumeError> {
        n += 1;
        lines
            .next()
            .transpose()
            .map_err(|e| at(n, format!("unreadable: {e}")))
    };
    let first = next()?.ok_or_else(|| at(1, "empty input: not a safs dump"))?;
    let header: Header =
        serde_json::from_str(&first).map_err(|e| at(1, format!("not a safs dump header: {e}")))?;
    if header.format != FORMAT {
        return Err(at(
            1,
            format!("format {:?} is not {FORMAT:?}", header.format),
        ));
    }
    if header.version != VERSION {
        return Err(at(
            1,
            format!(
                "dump format version {} (this safs reads version {VERSION})",
                header.version
            ),
        ));
    }
    let mut sum = Summary::default();
    let mut digest = Digest256::default();
    let mut batch: Vec<Write> = Vec::with_capacity(BATCH);
    let mut superblock = None;
    let mut last: Option<Vec<u8>> = None;
    let mut inodes = HashSet::new();
    // (line, inode) of records that name an inode, checked at the end.
    let mut named: Vec<(u64, u64)> = Vec::new();
    let (mut blocks, mut freed) = (Vec::new(), HashSet::new());
    let mut line_no = 1u64;
    let end = loop {
        let Some(line) = next()? else {
            return Err(at(
                line_no + 1,
                "the dump ends without its end line (cut short)",
            ));
        };
        line_no += 1;
        if line.starts_with("{\"end\"") {
            let end: EndLine = serde_json::from_str(&line)
                .map_err(|e| at(line_no, format!("not an end line: {e}")))?;
            break end.end;
        }
        let rec: Record =
            serde_json::from_str(&line).map_err(|e| at(line_no, format!("not a record: {e}")))?;
        let k = hex::decode(&rec.k).map_err(|e| at(line_no, format!("key: {e}")))?;
        let v = hex::decode(&rec.v).map_err(|e| at(line_no, format!("value: {e}")))?;
        if k.is_empty() || k.len() > 511 {
            return Err(at(line_no, format!("a key of {} bytes", k.len())));
        }
        if last.as_ref().is_some_and(|l| *l >= k) {
            return Err(at(line_no, "records out of key order (edited?)"));
        }
        digest.add(&k, &v);
        sum.records += 1;
        sum.bytes += (k.len() + v.len()) as u64;
        // An entry names the inode it leads to (readable on plain volumes).
        if k.first() == Some(&keys::P_DIRENT) && !header.encrypted {
            if let Ok(d) = crate::format::dirent::Dirent::decode(&k, &v) {
                named.push((line_no, d.ino));
            }
        }
        match k.first().copied() {
            Some(keys::P_INODE) if k.len() == 9 => {
                inodes.insert(keys::key_ino(&k).expect("9 bytes"));
            }
            // Queued deletions name inodes already freed, and so may the
            // block records a freed file's queued deletion covers.
            Some(keys::P_DOOMED) if keys::is_doomed_file(&k) => {
                freed.insert(keys::key_ino(&k).expect("21 bytes"));
            }
            Some(keys::P_BLOCK) if k.len() >= 9 => {
                blocks.push((line_no, keys::key_ino(&k).expect("9 bytes")));
            }
            // Sessions' counters are the volume's, keyed by session.
            Some(p) if p != keys::P_DOOMED && p != keys::P_SESSION && k.len() >= 9 => {
                named.push((line_no, keys::key_ino(&k).expect("9 bytes")));
            }
            _ => {}
        }
        last = Some(k.clone());
        if k.as_slice() == keys::SUPERBLOCK {
            superblock = Some(v);
        } else {
            batch.push((k, Some(v)));
        }
        if batch.len() >= BATCH {
            store.commit(&std::mem::take(&mut batch))?;
            progress(sum.records);
        }
    };
    if next()?.is_some_and(|l| !l.trim().is_empty()) {
        return Err(at(line_no + 1, "lines after the end line"));
    }
    if end.records != sum.records || end.sha256 != digest.hex() {
        return Err(at(
            line_no,
            format!(
                "the end line says {} records with another digest than the {} read: the dump \
                 was edited or damaged",
                end.records, sum.records
            ),
        ));
    }
    named.extend(blocks.into_iter().filter(|(_, ino)| !freed.contains(ino)));
    if let Some(&(line, ino)) = named.iter().find(|(_, ino)| !inodes.contains(ino)) {
        return Err(at(
            line,
            format!("a record of inode {ino}, which the dump does not hold"),
        ));
    }
    let sb = superblock.ok_or_else(|| at(line_no, "the dump holds no superblock"))?;
    let parsed: Superblock = Superblock::decode(&sb)
        .map_err(|e| at(line_no, format!("the superblock is damaged: {e}")))?;
    if hex::encode(parsed.uuid) != header.volume {
        return Err(at(1, "the header names another volume than the superblock"));
    }
    if !batch.is_empty() {
        store.commit(&batch)?;
    }
    // Last: a store without it is no volume.
    store.commit(&[(keys::SUPERBLOCK.to_vec(), Some(sb))])?;
    read_superblock(store)?;
    progress(sum.records);
    Ok(sum)
}
