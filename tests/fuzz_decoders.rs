//! Fuzzing of the record decoders from a committed seed corpus.
//!
//! Seeds (`tests/corpus/<kind>-<n>.seed`: `key_len:u8 key record`) are real
//! records. Each run mutates them — bit flips, byte overwrites, truncation,
//! extension, splices between seeds — and feeds every result to every
//! decoder. A decoder may refuse (it must, for almost every mutation: the
//! checksum covers key and payload) but must never panic, and anything it
//! accepts must re-encode to the very bytes it decoded.
//!
//! `SAFS_FUZZ_ITERS` sets the number of mutations (default 20,000).
//! `cargo test --test fuzz_decoders -- --ignored write_seed_corpus`
//! regenerates the seeds.

use std::path::PathBuf;

use safs::format::dirent::{self, Dirent, IndexEntry};
use safs::format::envelope::{self, Kind};
use safs::format::inode::{Inode, Timestamp};
use safs::format::keys;
use safs::format::superblock::{Counters, MountState, Superblock};
use safs::format::xattrs::XattrSet;

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

fn seed(key: &[u8], rec: &[u8]) -> Vec<u8> {
    let mut s = vec![key.len() as u8];
    s.extend_from_slice(key);
    s.extend_from_slice(rec);
    s
}

fn split(seed: &[u8]) -> Option<(&[u8], &[u8])> {
    let n = *seed.first()? as usize;
    if seed.len() < 1 + n {
        return None;
    }
    Some((&seed[1..1 + n], &seed[1 + n..]))
}

/// Every decoder on (key, record); checks round trips of what decodes.
fn decode_all(key: &[u8], rec: &[u8]) -> usize {
    let mut accepted = 0;
    if let Ok(i) = Inode::decode(key, rec) {
        assert_eq!(i.encode(key), rec, "inode re-encodes differently");
        accepted += 1;
    }
    if let Ok(d) = Dirent::decode(key, rec) {
        assert_eq!(d.encode(key), rec);
        accepted += 1;
    }
    if let Ok(e) = IndexEntry::decode(key, rec) {
        assert_eq!(e.encode(key), rec);
        accepted += 1;
    }
    if key == keys::SUPERBLOCK {
        if let Ok(s) = Superblock::decode(rec) {
            assert_eq!(s.encode(), rec);
            accepted += 1;
        }
    }
    if key == keys::COUNTERS {
        if let Ok(c) = Counters::decode(rec) {
            assert_eq!(c.encode(), rec);
            accepted += 1;
        }
    }
    if key == keys::MOUNT_STATE {
        if let Ok(m) = MountState::decode(rec) {
            assert_eq!(m.encode(), rec);
            accepted += 1;
        }
    }
    if dirent::decode_marker(key, rec).is_ok() {
        assert_eq!(dirent::encode_marker(key), rec);
        accepted += 1;
    }
    if let Ok(t) = dirent::decode_symlink(key, rec) {
        assert_eq!(dirent::encode_symlink(key, &t), rec);
        accepted += 1;
    }
    for kind in [Kind::Spill, Kind::Overflow] {
        if let Ok(payload) = envelope::open(key, kind, rec) {
            accepted += 1;
            if kind == Kind::Spill {
                if let Ok(set) = XattrSet::decode(payload) {
                    assert_eq!(set.encode(), payload);
                }
            }
        }
    }
    // The raw packed-set decoder on arbitrary bytes, too.
    if let Ok(set) = XattrSet::decode(rec) {
        assert_eq!(set.encode(), rec);
    }
    accepted
}

fn load_corpus() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(corpus_dir())
        .expect("tests/corpus is committed")
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    seeds.sort();
    seeds
}

#[test]
fn seeds_decode_and_mutations_never_panic() {
    let seeds = load_corpus();
    assert!(seeds.len() >= 8, "seed corpus is missing");
    for s in &seeds {
        let (k, r) = split(s).expect("well-formed seed");
        assert!(decode_all(k, r) >= 1, "a seed record does not decode");
    }
    let iters: usize = std::env::var("SAFS_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let mut rng = 0x2545f4914f6cdd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut accepted = 0;
    for _ in 0..iters {
        let base = &seeds[(next() as usize) % seeds.len()];
        let (k, r) = split(base).unwrap();
        let (mut key, mut rec) = (k.to_vec(), r.to_vec());
        for _ in 0..1 + next() % 4 {
            match next() % 6 {
                0 if !rec.is_empty() => {
                    let i = (next() as usize) % rec.len();
                    rec[i] ^= 1 << (next() % 8);
                }
                1 if !rec.is_empty() => {
                    let i = (next() as usize) % rec.len();
                    rec[i] = next() as u8;
                }
                2 => rec.truncate((next() as usize) % (rec.len() + 1)),
                3 => rec.extend((0..next() % 16).map(|_| next() as u8)),
                4 => {
                    let other = &seeds[(next() as usize) % seeds.len()];
                    let (_, or) = split(other).unwrap();
                    let cut = (next() as usize) % (rec.len() + 1);
                    let from = (next() as usize) % (or.len() + 1);
                    rec.truncate(cut);
                    rec.extend_from_slice(&or[from..]);
                }
                _ if !key.is_empty() => {
                    let i = (next() as usize) % key.len();
                    key[i] ^= 1 << (next() % 8);
                }
                _ => {}
            }
        }
        accepted += decode_all(&key, &rec);
    }
    // Checksums make accepted mutants rare; they are not impossible (a
    // mutation can undo itself), so only report.
    eprintln!("{iters} mutants, {accepted} accepted by some decoder");
}

#[test]
#[ignore = "regenerates the committed seed corpus"]
fn write_seed_corpus() {
    let dir = corpus_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let mut inline = XattrSet::new();
    inline.insert(b"user.DOSATTRIB".to_vec(), b"0x20".to_vec());
    inline.insert(
        b"security.selinux".to_vec(),
        b"system_u:object_r:tmp_t:s0\0".to_vec(),
    );
    let ts = Timestamp {
        sec: 1_700_000_000,
        nsec: 123_456_789,
    };
    let inode = Inode {
        mode: 0o100644,
        uid: 1000,
        gid: 1000,
        nlink: 2,
        size: 31_500,
        blocks: 64,
        atime: ts,
        mtime: ts,
        ctime: ts,
        crtime: ts,
        generation: 1,
        spill_len: 0,
        overflow: 1,
        inline,
        ..Default::default()
    };
    let dir_inode = Inode {
        mode: 0o040755,
        nlink: 3,
        parent: 1,
        next_cookie: 9,
        ..Default::default()
    };
    let mut spill = XattrSet::new();
    spill.insert(b"user.swift.metadata".to_vec(), vec![0x80; 2000]);
    spill.insert(b"user.swift.metadata1".to_vec(), vec![0x81; 300]);
    let sk = keys::spill(42);
    let ok = keys::overflow(42, b"user.big");
    let dk = keys::dirent(1, b"report.docx");
    let ck = keys::dir_index(1, 7);
    let lk = keys::symlink(43);
    let sb = Superblock {
        format_version: 1,
        uuid: [7; 16],
        inline_bytes: 320,
        features: 0,
        created_ns: 5,
    };
    let seeds: Vec<(&str, Vec<u8>)> = vec![
        (
            "inode-file",
            seed(&keys::inode(42), &inode.encode(&keys::inode(42))),
        ),
        (
            "inode-dir",
            seed(&keys::inode(1), &dir_inode.encode(&keys::inode(1))),
        ),
        (
            "spill",
            seed(&sk, &envelope::seal(&sk, Kind::Spill, &spill.encode())),
        ),
        (
            "overflow",
            seed(&ok, &envelope::seal(&ok, Kind::Overflow, &[0x42; 700])),
        ),
        (
            "dirent",
            seed(
                &dk,
                &Dirent {
                    ino: 42,
                    kind: 8,
                    cookie: 7,
                }
                .encode(&dk),
            ),
        ),
        (
            "dirindex",
            seed(
                &ck,
                &IndexEntry {
                    ino: 42,
                    kind: 8,
                    name: b"report.docx".to_vec(),
                }
                .encode(&ck),
            ),
        ),
        (
            "symlink",
            seed(&lk, &dirent::encode_symlink(&lk, b"../target/of/link")),
        ),
        ("superblock", seed(keys::SUPERBLOCK, &sb.encode())),
        (
            "counters",
            seed(
                keys::COUNTERS,
                &Counters {
                    next_ino: 44,
                    inodes: 3,
                }
                .encode(),
            ),
        ),
        (
            "mountstate",
            seed(
                keys::MOUNT_STATE,
                &MountState {
                    clean: true,
                    pid: 1,
                    since_ns: 2,
                }
                .encode(),
            ),
        ),
        (
            "orphan",
            seed(&keys::orphan(9), &dirent::encode_marker(&keys::orphan(9))),
        ),
    ];
    for (name, bytes) in seeds {
        std::fs::write(dir.join(format!("{name}.seed")), bytes).unwrap();
    }
}
