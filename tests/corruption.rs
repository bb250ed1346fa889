//! Bytes flipped anywhere in the metadata file: every read either returns
//! exactly what was written or fails (EIO), and `safs fsck` reports the
//! damage (or, where the flip hit unused space, finds the volume clean)
//! without ever crashing. A flip inside a record never crashes anything; a
//! flip in LMDB's own page structure may crash the engine in the reading
//! process (LMDB has no page checksums), which is counted and printed.
//!
//! Each case copies a pristine volume, flips bytes at one spot of
//! `meta/data.mdb`, then reads everything back in a child process (so that
//! a crash would be seen as a crash, not take the test runner down).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use safs::core::volume;
use safs::core::{Ctx, Fs, OpenMode, Options};
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
        .make_node(&ctx, 1, b"d", libc::S_IFDIR | 0o755, 0, 0, None)
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

/// Child mode: read the whole volume; exit 0 if every value read is right
/// (errors allowed), 3 if any read returned wrong data.
fn reader(vol: &Path) -> i32 {
    let (store, sb) = match volume::open_store(vol) {
        Ok(x) => x,
        Err(_) => return 0,
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
        Err(_) => return 0,
    };
    let Ok(d) = fs.lookup(1, b"d") else { return 0 };
    for (name, (data, xattrs)) in expected() {
        let Ok(a) = fs.lookup(d.ino, name.as_bytes()) else {
            continue;
        };
        if let Ok(h) = fs.open(
            a.ino,
            OpenMode {
                write: false,
                truncate: false,
            },
        ) {
            if let Ok(got) = fs.read(h.fh, 0, 1 << 20) {
                if got != data {
                    eprintln!("{name}: wrong contents");
                    return 3;
                }
            }
            let _ = fs.release(h.fh);
        }
        for (n, v) in xattrs {
            if let Ok(got) = fs.getxattr(a.ino, n.as_bytes()) {
                if got != v {
                    eprintln!("{name} {n}: wrong value");
                    return 3;
                }
            }
        }
    }
    let _ = fs.close();
    0
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

/// Offsets inside runs of ≥ 64 equal non-zero bytes: record values (free
/// space in LMDB pages is zero).
fn value_offsets(mdb: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < mdb.len() {
        let mut j = i;
        while j < mdb.len() && mdb[j] == mdb[i] {
            j += 1;
        }
        if mdb[i] != 0 && j - i >= 64 {
            out.extend((i + 8..j - 8).step_by(97));
        }
        i = j;
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
    let values = value_offsets(&mdb);
    assert!(values.len() > 100, "test records not found in the file");
    let cases: usize = std::env::var("SAFS_CORRUPTION_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let mut rng = 0x9e3779b97f4a7c15u64;
    let (mut in_values, mut anywhere, mut detected, mut crashes) = (0, 0, 0, 0);
    for case in 0..cases {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // Even cases hit record bytes, odd cases anywhere in the file.
        let strict = case % 2 == 0;
        let at = if strict {
            values[(rng as usize) % values.len()]
        } else {
            (rng as usize) % mdb.len()
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
        // fsck checks in a child process of its own: whatever the flip
        // hit, it reports instead of dying.
        assert!(
            fsck.is_some(),
            "case {case} (offset {at}): fsck died by a signal instead of reporting"
        );
        assert_ne!(
            reader,
            Some(3),
            "case {case} (offset {at}): wrong data was served"
        );
        if strict {
            in_values += 1;
            // A flipped record byte is caught by the record's checksum.
            assert_eq!(
                reader,
                Some(0),
                "case {case} (offset {at}): reader crashed or failed on a record flip"
            );
            assert_eq!(
                fsck,
                Some(4),
                "case {case} (offset {at}): fsck did not report a flipped record"
            );
            detected += 1;
        } else {
            anywhere += 1;
            match (reader, fsck) {
                (None, _) => crashes += 1,
                (_, Some(4) | Some(8)) => detected += 1,
                (_, Some(0)) => {}
                (_, other) => panic!("case {case} (offset {at}): fsck ended with {other:?}"),
            }
        }
        let _ = std::fs::remove_dir_all(&vol);
    }
    // Flips in LMDB's own page structure (headers, node flags, page
    // numbers) can still crash the engine in the reading process: LMDB has
    // no page checksums. See the README's limits; counted, not hidden.
    eprintln!(
        "{in_values} flips in records (all detected), {anywhere} anywhere: {detected} detected in all, \
         {crashes} crashed the reading process inside the engine; fsck never crashed"
    );
}
