//! Engine micro-benchmarks on the LMDB store (no FUSE): the metadata
//! engine's share of a request.
//!
//! - a hot point get of an inode record;
//! - a scan of 1,000 directory-index entries (one `readdir` of a
//!   1,000-entry directory);
//! - the durable commit of a 100-write batch (what one group commit of a
//!   busy create loop costs; includes LMDB's fsync, so it measures the
//!   disk under the temporary directory too).

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};

use safs::format::envelope::{Kind, seal};
use safs::format::keys;
use safs::meta::{LmdbStore, MetaRead, MetaStore, Write};

fn filled_store(dir: &std::path::Path) -> LmdbStore {
    let store = LmdbStore::open(dir).expect("open LMDB");
    let mut batch: Vec<Write> = Vec::new();
    for ino in 1..=10_000u64 {
        let k = keys::inode(ino);
        batch.push((k.to_vec(), Some(seal(&k, Kind::Inode, &[7u8; 160]))));
    }
    for cookie in 0..1_000u64 {
        let k = keys::dir_index(1, cookie);
        let name = format!("file-{cookie:05}");
        batch.push((k.to_vec(), Some(seal(&k, Kind::DirIndex, name.as_bytes()))));
    }
    store.commit(&batch).expect("fill");
    store
}

fn engine(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = filled_store(dir.path());

    let key = keys::inode(5_000);
    c.bench_function("lmdb/get_hot", |b| {
        b.iter(|| store.get(black_box(&key)).expect("get").expect("present"))
    });

    let (start, end) = keys::ino_range(keys::P_DIRINDEX, 1);
    let mut g = c.benchmark_group("lmdb");
    g.throughput(Throughput::Elements(1_000));
    g.bench_function("scan_1000", |b| {
        b.iter(|| {
            let rows = store
                .scan(black_box(&start), black_box(&end), 10_000)
                .expect("scan");
            assert_eq!(rows.len(), 1_000);
            rows
        })
    });
    g.finish();

    let mut g = c.benchmark_group("lmdb");
    g.throughput(Throughput::Elements(100));
    // Commits are slow (fsync): fewer samples keep the run short.
    g.sample_size(20);
    let mut next = 1_000_000u64;
    g.bench_function("commit_100", |b| {
        b.iter_batched(
            || {
                (0..100)
                    .map(|_| {
                        next += 1;
                        let k = keys::inode(next);
                        (k.to_vec(), Some(seal(&k, Kind::Inode, &[9u8; 160])))
                    })
                    .collect::<Vec<Write>>()
            },
            |batch| store.commit(&batch).expect("commit"),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, engine);
criterion_main!(benches);
