//! Bytes flipped anywhere in the metadata file: every read either returns
//! exactly what was written or fails (EIO), and `safs fsck` reports the
//! damage (or, where the flip hit unused space, finds the volume clean)
//! without ever crashing. A flip inside a record is caught by the record's
//! checksum; a flip in LMDB's own page structure (which has no checksums)
//! is caught by the structure check every open makes, which refuses the
//! file instead of letting the engine crash on it.
//!
//! Each case copies a pristine volume, flips bytes at one spot of
//! `meta/data.mdb`, then reads everything back in a child process (so that
//! a crash would be seen as a crash, not take the test runner down).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use safs::core::volume;
use safs::core::{Ctx, Fs, Ino, OpenMode, Options};
use safs::meta::MetaStore;

const FILES: usize = 40;

/// Per file name: its contents and its xattrs.
type Expected = BTreeMap<String, (Vec<u8>, Vec<(String, Vec<u8>)>)>;

fn expected() -> Expected {
    (0..FILES)
        .map(|i| {
            let data = vec![i as u8; 100 + i * 37];
            let xattrs = vec![
                ("user.small".to_string(), vec![i as u8; 20]),
                ("user.mid".to_string(), vec![(i + 1) as u8; 400]),
                ("user.big".to_string(), vec![(i + 2) as u8; 5000 + i]),
            ];
            (format!("f{i:03}"), (data, xattrs))
        })
        .collect()
}

fn build(vol: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_safs"))
        .args(["format", vol.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    let (store, sb) = volume::open_store(vol).unwrap();
    let fs = Fs::mount(vol, store, sb, Options::default()).unwrap();
    let ctx = Ctx::root();
    let d = fs
        .make_node(&ctx, Ino::ROOT, b"d", libc::S_IFDIR | 0o755, 0, 0, None)
        .unwrap()
        .ino;
    for (name, (data, xattrs)) in expected() {
        let f = fs
            .make_node(&ctx, d, name.as_bytes(), libc::S_IFREG | 0o644, 0, 0, None)
            .unwrap()
            .ino;
        let h = fs
            .open(
                f,
                OpenMode {
                    write: true,
                    truncate: false,
                },
            )
            .unwrap();
        fs.write(h.fh, 0, &data).unwrap();
        fs.release(h.fh).unwrap();
        for (n, v) in xattrs {
            fs.setxattr(&Ctx::root(), f, n.as_bytes(), &v, 0).unwrap();
        }
    }
    fs.close().unwrap();
}

/// Child mode: read the whole volume; exit 0 if every read returned exactly
/// what was written, 2 if some failed (and none was wrong), 3 if any read
/// returned wrong data.
fn reader(vol: &Path) -> i32 {
    const FAILED: i32 = 2;
    let (store, sb) = match volume::open_store(vol) {
        Ok(x) => x,
        Err(_) => return FAILED,
    };
    let fs = match Fs::mount(
        vol,
        store as Arc<dyn MetaStore>,
        sb,
        Options {
            read_only: true,
            ..Options::default()
        },
    ) {
        Ok(f) => f,
        Err(_) => return FAILED,
    };
    let Ok(d) = fs.lookup(Ino::ROOT, b"d") else {
        return FAILED;
    };
    let mut failed = false;
    for (name, (data, xattrs)) in expected() {
        let Ok(a) = fs.lookup(d.ino, name.as_bytes()) else {
            failed = true;
            continue;
        };
        match fs.open(
            a.ino,
            OpenMode {
                write: false,
                truncate: false,
            },
        ) {
            Ok(h) => {
                match fs.read(h.fh, 0, 1 << 20) {
                    Ok(got) if got != data => {
                        eprintln!("{name}: wrong contents");
                        return 3;
                    }
                    Ok(_) => {}
                    Err(_) => failed = true,
                }
                let _ = fs.release(h.fh);
            }
            Err(_) => failed = true,
        }
        for (n, v) in xattrs {
            match fs.getxattr(a.ino, n.as_bytes()) {
                Ok(got) if got != v => {
                    eprintln!("{name} {n}: wrong value");
                    return 3;
                }
                Ok(_) => {}
                Err(_) => failed = true,
            }
        }
    }
    let _ = fs.close();
    if failed { FAILED } else { 0 }
}

/// Runs the reader and fsck on `vol`; returns (reader exit, fsck exit),
/// `None` for death by a signal.
fn probe(vol: &Path) -> (Option<i32>, Option<i32>) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "flipped_bytes_never_serve_wrong_data",
            "--nocapture",
        ])
        .env("SAFS_CORRUPTION_READER", vol)
        .output()
        .unwrap();
    let fsck = Command::new(env!("CARGO_BIN_EXE_safs"))
        .args(["fsck", vol.to_str().unwrap()])
        .output()
        .unwrap();
    (out.status.code(), fsck.status.code())
}

const PSIZE: usize = 4096;

/// Offsets inside runs of ≥ 64 equal non-zero bytes in pages in use: record
/// values. In a leaf or branch page only its nodes count (from `upper` to
/// the end): the gap between the node pointers and the nodes keeps bytes
/// of records deleted or moved since, or of what the page held before
/// LMDB reused it (a leaf's values in a branch page's gap), which nothing
/// reads; free pages hold stale copies too.
fn value_offsets(mdb: &[u8], in_use: &[u64]) -> Vec<usize> {
    let mut out = Vec::new();
    for &page in in_use {
        let page = &mdb[page as usize * PSIZE..][..PSIZE];
        let base = page.as_ptr() as usize - mdb.as_ptr() as usize;
        let u16_at = |at: usize| u16::from_le_bytes([page[at], page[at + 1]]) as usize;
        let (flags, lower, upper) = (u16_at(10), u16_at(12), u16_at(14));
        let nodes = (flags == 1 || flags == 2) && (16..=upper).contains(&lower) && upper <= PSIZE;
        let mut i = if nodes { upper } else { 0 };
        while i < PSIZE {
            let mut j = i;
            while j < PSIZE && page[j] == page[i] {
                j += 1;
            }
            if page[i] != 0 && j - i >= 64 {
                out.extend((base + i + 8..base + j - 8).step_by(97));
            }
            i = j;
        }
    }
    out
}

/// Offsets of LMDB's own structure in the file: the meta records, and in
/// every branch and leaf page in use its header, its node pointers and each
/// node's header (sizes, flags, key size, child page numbers).
fn structure_offsets(mdb: &[u8], in_use: &[u64]) -> Vec<usize> {
    let u16_at = |at: usize| u16::from_le_bytes([mdb[at], mdb[at + 1]]) as usize;
    let mut out: Vec<usize> = (16..152).chain(PSIZE + 16..PSIZE + 152).collect();
    for page in in_use
        .iter()
        .map(|&p| p as usize * PSIZE)
        .filter(|&p| p >= 2 * PSIZE)
    {
        let flags = u16_at(page + 10);
        let lower = u16_at(page + 12);
        if !(flags == 1 || flags == 2) || !(16..PSIZE).contains(&lower) {
            continue;
        }
        out.extend(page..page + lower);
        for ptr in (page + 16..page + lower).step_by(2) {
            let node = page + u16_at(ptr);
            if node + 8 <= page + PSIZE {
                out.extend(node..node + 8);
            }
        }
    }
    out
}

#[test]
fn flipped_bytes_never_serve_wrong_data() {
    if let Ok(vol) = std::env::var("SAFS_CORRUPTION_READER") {
        std::process::exit(reader(Path::new(&vol)));
    }
    let tmp = tempfile::tempdir().unwrap();
    let pristine = tmp.path().join("pristine");
    build(&pristine);
    // The file is sparse up to the map size: take the part in use.
    let path = pristine.join("meta/data.mdb");
    let file = std::fs::File::open(&path).unwrap();
    let used = nix::unistd::lseek(&file, 0, nix::unistd::Whence::SeekHole).unwrap() as usize;
    let mdb = {
        use std::io::Read;
        let mut v = vec![0u8; used];
        std::fs::File::open(&path)
            .unwrap()
            .read_exact(&mut v)
            .unwrap();
        v
    };
    let in_use = safs::meta::lmdb_verify::pages_in_use(&path).unwrap();
    let values = value_offsets(&mdb, &in_use);
    assert!(values.len() > 100, "test records not found in the file");
    let structure = structure_offsets(&mdb, &in_use);
    assert!(structure.len() > 100, "LMDB's pages not found in the file");
    let cases: usize = std::env::var("SAFS_CORRUPTION_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let mut rng = 0x9e3779b97f4a7c15u64;
    let (mut in_values, mut in_structure, mut anywhere) = (0, 0, 0);
    let (mut structure_detected, mut anywhere_detected) = (0, 0);
    for case in 0..cases {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // A third of the cases hit record bytes, a third LMDB's page
        // structure, a third anywhere in the file.
        let at = match case % 3 {
            0 => values[(rng as usize) % values.len()],
            1 => structure[(rng as usize) % structure.len()],
            _ => (rng as usize) % mdb.len(),
        };
        let vol = tmp.path().join(format!("case{case}"));
        assert!(
            Command::new("cp")
                .arg("-a")
                .arg(&pristine)
                .arg(&vol)
                .status()
                .unwrap()
                .success()
        );
        let flipped: Vec<u8> = (0..4.min(mdb.len() - at))
            .map(|k| mdb[at + k] ^ (0x5a ^ (rng >> (8 * k)) as u8 | 1))
            .collect();
        {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(vol.join("meta/data.mdb"))
                .unwrap();
            f.write_all_at(&flipped, at as u64).unwrap();
        }
        let (reader, fsck) = probe(&vol);
        assert!(
            fsck.is_some(),
            "case {case} (offset {at}): fsck died by a signal instead of reporting"
        );
        assert!(
            reader.is_some(),
            "case {case} (offset {at}): the reading process crashed"
        );
        assert_ne!(
            reader,
            Some(3),
            "case {case} (offset {at}): wrong data was served"
        );
        if case % 3 == 0 {
            in_values += 1;
            // A flipped record byte is caught by the record's checksum.
            assert_eq!(
                reader,
                Some(2),
                "case {case} (offset {at}): a flipped record was not refused"
            );
            assert_eq!(
                fsck,
                Some(4),
                "case {case} (offset {at}): fsck did not report a flipped record"
            );
        } else {
            let detected = match fsck {
                Some(4) => true,
                // Unused bytes (free space in a page, a free page, padding):
                // then every read must be exact too.
                Some(0) => {
                    assert_eq!(
                        reader,
                        Some(0),
                        "case {case} (offset {at}): fsck found the volume clean, yet reads failed"
                    );
                    false
                }
                other => panic!("case {case} (offset {at}): fsck ended with {other:?}"),
            };
            if case % 3 == 1 {
                in_structure += 1;
                structure_detected += usize::from(detected);
            } else {
                anywhere += 1;
                anywhere_detected += usize::from(detected);
            }
        }
        let _ = std::fs::remove_dir_all(&vol);
    }
    eprintln!(
        "{in_values} flips in records: all detected; {in_structure} in LMDB's page structure: \
         {structure_detected} detected; {anywhere} anywhere: {anywhere_detected} detected; \
         the undetected ones hit unused bytes (every read exact, fsck clean); nothing crashed"
    );
}
