//! Codec micro-benchmarks (no FUSE, no I/O): what the daemon spends per
//! request encoding and decoding records.
//!
//! - inode record encode/decode with a few inline xattrs (a Samba file:
//!   DOS attributes, an NT ACL, a stream name);
//! - a 64 KiB packed xattr set (a full spill record) pack/unpack;
//! - the envelope checksum alone (seal/open) at inode and spill sizes.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

use safs::format::envelope::{Kind, open, seal};
use safs::format::inode::{Inode, S_IFREG, Timestamp};
use safs::format::keys;
use safs::format::xattrs::XattrSet;

fn samba_inode() -> Inode {
    let mut inline = XattrSet::new();
    inline.insert(b"user.DosAttrib".to_vec(), vec![0x20; 24]);
    inline.insert(b"security.NTACL".to_vec(), vec![0x5A; 180]);
    inline.insert(b"user.DOSATTRIB.stream".to_vec(), vec![1; 16]);
    let now = Timestamp {
        sec: 1_700_000_000,
        nsec: 123_456_789,
    };
    Inode {
        mode: S_IFREG | 0o644,
        uid: 1000,
        gid: 1000,
        nlink: 1,
        size: 4096,
        blocks: 8,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        generation: 7,
        inline,
        ..Default::default()
    }
}

/// Packed xattrs adding up to just under 64 KiB: 15 values of 4 KiB and
/// a few small ones, as a spill record holds them.
fn spill_set() -> XattrSet {
    let mut s = XattrSet::new();
    for i in 0..15 {
        s.insert(
            format!("user.chunk{i:02}").into_bytes(),
            vec![i as u8; 4096],
        );
    }
    for i in 0..8 {
        s.insert(format!("user.small{i}").into_bytes(), vec![i as u8; 100]);
    }
    assert!(s.packed_len() <= 65_536);
    s
}

fn inode(c: &mut Criterion) {
    let ino = samba_inode();
    let key = keys::inode(42);
    let rec = ino.encode(&key);
    let mut g = c.benchmark_group("inode");
    g.throughput(Throughput::Bytes(rec.len() as u64));
    g.bench_function("encode", |b| {
        b.iter(|| black_box(&ino).encode(black_box(&key)))
    });
    g.bench_function("decode", |b| {
        b.iter(|| Inode::decode(black_box(&key), black_box(&rec)).expect("valid"))
    });
    g.finish();
}

fn xattr_set(c: &mut Criterion) {
    let set = spill_set();
    let packed = set.encode();
    let mut g = c.benchmark_group("xattr_set_64k");
    g.throughput(Throughput::Bytes(packed.len() as u64));
    g.bench_function("pack", |b| b.iter(|| black_box(&set).encode()));
    g.bench_function("unpack", |b| {
        b.iter(|| XattrSet::decode(black_box(&packed)).expect("valid"))
    });
    g.finish();
}

fn envelope(c: &mut Criterion) {
    let key = keys::spill(42);
    let mut g = c.benchmark_group("envelope");
    for size in [128usize, 4096, 65_536] {
        let payload = vec![0xA5u8; size];
        let rec = seal(&key, Kind::Spill, &payload);
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::new("seal", size), &payload, |b, p| {
            b.iter(|| seal(black_box(&key), Kind::Spill, black_box(p)))
        });
        g.bench_with_input(BenchmarkId::new("open", size), &rec, |b, r| {
            b.iter(|| {
                open(black_box(&key), Kind::Spill, black_box(r))
                    .expect("valid")
                    .len()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, inode, xattr_set, envelope);
criterion_main!(benches);
