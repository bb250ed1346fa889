//! Bytes flipped anywhere in the metadata file: every read either returns
//! exactly what was written or fails (EIO); nothing panics or crashes, and
//! `safs fsck` reports the damage (or, where the flip hit unused space,
//! finds the volume clean).
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

fn expected() -> BTreeMap<String, (Vec<u8>, Vec<(String, Vec<u8>)>)> {
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
            fs.setxattr(f, n.as_bytes(), &v, 0).unwrap();
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

#[test]
fn flipped_bytes_never_serve_wrong_data_nor_crash() {
    if let Ok(vol) = std::env::var("SAFS_CORRUPTION_READER") {
        std::process::exit(reader(Path::new(&vol)));
    }
    let tmp = tempfile::tempdir().unwrap();
    let pristine = tmp.path().join("pristine");
    build(&pristine);
    let mdb = std::fs::read(pristine.join("meta/data.mdb")).unwrap();
    let cases: usize = std::env::var("SAFS_CORRUPTION_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let mut rng = 0x9e3779b97f4a7c15u64;
    let (mut detected, mut clean) = (0, 0);
    for case in 0..cases {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // Spread over the used part of the file, a few bytes each.
        let used = mdb.len();
        let at = (rng as usize) % used;
        let vol = tmp.path().join(format!("case{case}"));
        let cp = Command::new("cp")
            .arg("-a")
            .arg(&pristine)
            .arg(&vol)
            .status()
            .unwrap();
        assert!(cp.success());
        let mut bytes = mdb.clone();
        for k in 0..4 {
            if let Some(b) = bytes.get_mut(at + k) {
                *b ^= 0x5a ^ (rng >> (8 * k)) as u8 | 1;
            }
        }
        std::fs::write(vol.join("meta/data.mdb"), &bytes).unwrap();
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "flipped_bytes_never_serve_wrong_data_nor_crash",
                "--nocapture",
            ])
            .env("SAFS_CORRUPTION_READER", &vol)
            .output()
            .unwrap();
        let code = out.status.code();
        assert!(
            code == Some(0),
            "case {case} (offset {at}): reader {}: {}",
            match code {
                Some(3) => "served wrong data".to_string(),
                Some(c) => format!("exited {c}"),
                None => format!(
                    "was killed by a signal ({:?})",
                    std::os::unix::process::ExitStatusExt::signal(&out.status)
                ),
            },
            String::from_utf8_lossy(&out.stderr)
        );
        let fsck = Command::new(env!("CARGO_BIN_EXE_safs"))
            .args(["fsck", vol.to_str().unwrap()])
            .output()
            .unwrap();
        match fsck.status.code() {
            Some(0) => clean += 1,
            Some(4) | Some(8) => detected += 1,
            other => panic!(
                "case {case} (offset {at}): fsck ended with {other:?}: {}",
                String::from_utf8_lossy(&fsck.stdout)
            ),
        }
        let _ = std::fs::remove_dir_all(&vol);
    }
    eprintln!("{cases} corruptions: {detected} detected by fsck, {clean} in unused space");
    assert!(detected > 0, "no corruption was ever detected");
}
