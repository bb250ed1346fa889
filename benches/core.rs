//! Filesystem-core micro-benchmarks (no FUSE, LMDB underneath): the daemon's
//! own work for the xattr requests of a file that carries many xattrs, as
//! Samba streams or Swift metadata chunks make them.
//!
//! - `setxattr` replacing one value on a file with 2,000 xattrs (inline
//!   full, spill at its 64 KiB, the rest in overflow records): the cost of a
//!   change must not grow with the number of xattrs beyond re-packing the
//!   one tier the value lives in;
//! - `getxattr` of a spilled and of an overflow value, and of an absent name.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};

use safs::core::volume::{self, DEFAULT_INLINE_BYTES, FormatOptions};
use safs::core::{Ctx, Fs, Options};

fn core(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let vol = dir.path().join("vol");
    volume::format(
        &vol,
        &FormatOptions {
            inline_bytes: DEFAULT_INLINE_BYTES,
            force: false,
            uid: 0,
            gid: 0,
            encryption: None,
            engine: safs::meta::NewEngine::Lmdb,
            data: None,
        },
    )
    .expect("format");
    let (store, sb) = volume::open_store(&vol).expect("open");
    let fs = Fs::mount(&vol, store, sb, Options::default()).expect("mount");
    let ctx = Ctx::root();
    let (attr, _h) = fs
        .create(&ctx, safs::core::Ino::ROOT, b"many", 0o644, 0, libc::O_RDWR)
        .expect("create");
    let ino = attr.ino;
    for i in 0..2_000 {
        let name = format!("user.stream.{i:05}");
        fs.setxattr(&ctx, ino, name.as_bytes(), &[b'v'; 40], 0)
            .expect("setxattr");
    }

    let (one, _h) = fs
        .create(&ctx, safs::core::Ino::ROOT, b"one", 0o644, 0, libc::O_RDWR)
        .expect("create");
    fs.setxattr(&ctx, one.ino, b"user.stream.00100", &[b'v'; 40], 0)
        .expect("setxattr");

    let mut g = c.benchmark_group("core/2000-xattrs");
    let mut flip = 0u8;
    g.bench_function("setxattr_replace_on_file_with_one", |b| {
        b.iter(|| {
            flip = flip.wrapping_add(1);
            fs.setxattr(&ctx, one.ino, b"user.stream.00100", &[flip; 40], 0)
                .expect("setxattr")
        })
    });
    g.bench_function("setxattr_replace_spilled", |b| {
        b.iter(|| {
            flip = flip.wrapping_add(1);
            fs.setxattr(&ctx, ino, b"user.stream.00100", &[flip; 40], 0)
                .expect("setxattr")
        })
    });
    g.bench_function("setxattr_replace_overflow", |b| {
        b.iter(|| {
            flip = flip.wrapping_add(1);
            fs.setxattr(&ctx, ino, b"user.stream.01999", &[flip; 40], 0)
                .expect("setxattr")
        })
    });
    g.bench_function("getxattr_spilled", |b| {
        b.iter(|| {
            fs.getxattr(ino, black_box(b"user.stream.00100"))
                .expect("get")
        })
    });
    g.bench_function("getxattr_overflow", |b| {
        b.iter(|| {
            fs.getxattr(ino, black_box(b"user.stream.01999"))
                .expect("get")
        })
    });
    g.bench_function("getxattr_absent", |b| {
        b.iter(|| fs.getxattr(ino, black_box(b"user.absent")).unwrap_err())
    });
    g.finish();
    fs.close().expect("close");
}

criterion_group!(benches, core);
criterion_main!(benches);
