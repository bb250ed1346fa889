//! T9 — file contents: one large file (1 GiB full, 256 MiB small;
//! `SAFS_BENCH_T9_BYTES` sets it) written and read sequentially, and
//! 4 KiB reads at random offsets in it.
//!
//! - `write`: create the file, write it in 1 MiB `write(2)`s, `fsync`,
//!   close — all timed, so the figure is what reached the disk, not the
//!   page cache. Once.
//! - `read cold`: after making the target cold (drop_caches; safs and
//!   set-up gocryptfs remounted), read it front to back in 1 MiB
//!   `read(2)`s into a page-aligned buffer (as dd's; see
//!   `ops::PageBuf`), the kernel's readahead on. Best of `--reps`.
//! - `read hot`: the same read right after, nothing dropped: what a file
//!   cached by the target costs (for a filesystem whose contents are in an
//!   object store, its local cache). Best of `--reps`.
//! - `4 KiB writes`: 20,000 `write(2)`s of 4 KiB appending to a new file
//!   (80 MiB, page cache, no fsync), µs per write. Best of `--reps`. What
//!   an application writing in small pieces pays per call: on FUSE, any
//!   request the kernel sends per write (e.g. asking for
//!   `security.capability` before each one) shows here.
//! - `random 4 KiB read cold`: after making the target cold, `pread` 4 KiB
//!   at block-aligned offsets, each block once, in a fixed shuffled order
//!   (a sample of under a tenth of the blocks), with `POSIX_FADV_RANDOM`
//!   on the file read. Every read misses the page cache and no readahead
//!   of the measured file fills it, so each is a request to the filesystem;
//!   what that filesystem does underneath — a FUSE daemon's own reads of
//!   its backing file, with that file's readahead, or safs' passthrough —
//!   is part of the figure, and so is the open (a filesystem that fetches
//!   the whole file at open pays for it here). Buffered I/O: FUSE offers no O_DIRECT unless
//!   the daemon asks for direct_io. Best of `--reps`, in IOPS.
//!
//! - `first 4 KiB cold`: after making the target cold, open the file and
//!   `pread` 4 KiB from its middle, µs: how long an application waits for
//!   the first bytes of a large file it does not have (a filesystem that
//!   brings the whole file in at open pays for all of it here). Best of
//!   `--reps`.
//!
//! MB/s are 10^6 bytes per second. Requests per operation are per MiB for
//! the sequential rows and per read for the random one.

use std::time::Instant;

use rustix::fs::{Advice, Mode, OFlags};

use super::config::T9_CHUNK;
use super::ops::{self, cpath, na};
use super::record::Unit;
use super::{Ctx, Fail, PhaseSpec, Step, Timed, prepared, skipped};

pub const WRITE: &str = "write (fsync)";
pub const READ: &str = "read cold";
pub const READ_HOT: &str = "read hot";
pub const RANDOM: &str = "random 4 KiB read cold";
pub const SMALL: &str = "4 KiB writes";
pub const FIRST: &str = "first 4 KiB cold";

/// Writes in the small-writes row.
const SMALL_WRITES: usize = 20_000;

const BLOCK: u64 = 4096;

/// Fixed, so every target reads the same blocks in the same order.
const SEED: u64 = 0x5AF5_0009;

/// xorshift64*: enough to fill a buffer nothing can compress and to
/// shuffle the blocks, the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// `reads` distinct block numbers of a file of `blocks` blocks, shuffled.
pub fn random_blocks(blocks: u64, reads: usize, seed: u64) -> Vec<u64> {
    let mut all: Vec<u64> = (0..blocks).collect();
    let mut rng = Rng(seed | 1);
    let take = reads.min(all.len());
    // The first `take` steps of Fisher–Yates.
    for i in 0..take {
        let j = i + (rng.next() % (all.len() - i) as u64) as usize;
        all.swap(i, j);
    }
    all.truncate(take);
    all
}

fn mb_per_sec(bytes: u64, elapsed: std::time::Duration) -> f64 {
    bytes as f64 / 1e6 / elapsed.as_secs_f64().max(1e-9)
}

pub fn run(s: &mut Step<'_>) -> anyhow::Result<()> {
    let (ctx, t) = (s.ctx, s.t);
    let reps = ctx.cfg.reps;
    let bytes = ctx.sizes.t9_file_bytes;
    let chunks = bytes / T9_CHUNK;
    let mut write = s.row(WRITE, None, Unit::MbPerSec);
    let mut read = s.row(READ, None, Unit::MbPerSec);
    let mut hot = s.row(READ_HOT, None, Unit::MbPerSec);
    let mut random = s.row(RANDOM, None, Unit::Iops);
    let mut small = s.row(SMALL, Some(SMALL_WRITES as u64), Unit::UsPerOp);
    let mut first = s.row(FIRST, None, Unit::UsPerOp);
    let file = cpath(&s.dir.join("big"));
    let small_file = cpath(&s.dir.join("small"));
    let ready = prepared(
        ops::mkdirs(s.dir),
        &mut [
            &mut write,
            &mut read,
            &mut hot,
            &mut random,
            &mut small,
            &mut first,
        ],
    )?;
    if ready.is_some() {
        let mut rng = Rng(SEED);
        let data: Vec<u8> = (0..T9_CHUNK / 8)
            .flat_map(|_| rng.next().to_le_bytes())
            .collect();
        let mib = bytes >> 20;
        let l = s.label(&format!("write {mib} MiB + fsync"));
        // Earlier tests' dirty pages are not this phase's to write.
        rustix::fs::sync();
        let wrote = ctx.phase(t, &mut write, PhaseSpec::new(&l, chunks, 1, false), |ctx| {
            let start = Instant::now();
            let fd = ops::create(&file).map_err(|e| na(e, "create", 0, 1))?;
            for i in 0..chunks as usize {
                ctx.tick(i)?;
                let mut rest = &data[..];
                while !rest.is_empty() {
                    let w = rustix::io::write(&fd, rest)
                        .map_err(|e| na(e, "write", i, chunks as usize))?;
                    rest = &rest[w..];
                }
            }
            rustix::fs::fsync(&fd).map_err(|e| na(e, "fsync", 0, 1))?;
            drop(fd);
            let elapsed = start.elapsed();
            Ok(Timed {
                elapsed,
                sd_us: None,
                value: Some(mb_per_sec(bytes, elapsed)),
            })
        })?;
        if wrote {
            let mut buf = ops::PageBuf::new(T9_CHUNK as usize);
            let l = s.label(&format!("read {mib} MiB cold"));
            let spec = PhaseSpec::new(&l, chunks, reps, true);
            let read_done = ctx.phase(t, &mut read, spec, |ctx| {
                sequential_read(ctx, &file, bytes, &mut buf[..])
            })?;
            if read_done {
                let l = s.label(&format!("read {mib} MiB hot"));
                let spec = PhaseSpec::new(&l, chunks, reps, false);
                ctx.phase(t, &mut hot, spec, |ctx| {
                    sequential_read(ctx, &file, bytes, &mut buf[..])
                })?;
            } else {
                skipped(&mut hot, &read);
            }
            let blocks = random_blocks(bytes / BLOCK, ctx.sizes.t9_random_reads, SEED);
            let n = blocks.len();
            let l = s.label(&format!("{n} random 4 KiB reads cold"));
            let spec = PhaseSpec::new(&l, n as u64, reps, true);
            ctx.phase(t, &mut random, spec, |ctx| {
                random_reads(ctx, &file, &blocks, &mut buf[..BLOCK as usize])
            })?;
            let l = s.label("open + 4 KiB from the middle, cold");
            let spec = PhaseSpec::new(&l, 1, reps, true);
            let middle = bytes / 2 / BLOCK * BLOCK;
            ctx.phase(t, &mut first, spec, |ctx| {
                let b = &mut buf[..BLOCK as usize];
                random_reads_at(ctx, &file, &[middle / BLOCK], b, false)
            })?;
        } else {
            skipped(&mut read, &write);
            skipped(&mut hot, &write);
            skipped(&mut random, &write);
            skipped(&mut first, &write);
        }
        let l = s.label(&format!("{SMALL_WRITES} writes of 4 KiB"));
        let spec = PhaseSpec::new(&l, SMALL_WRITES as u64, reps, false);
        let block = &data[..BLOCK as usize];
        ctx.phase(t, &mut small, spec, |ctx| {
            small_writes(ctx, &small_file, block)
        })?;
    }
    s.done([write, read, hot, random, small, first]);
    Ok(())
}

/// `SMALL_WRITES` appends of `block` to a new `file`, then removes it
/// (outside the time).
fn small_writes(ctx: &Ctx<'_>, file: &std::ffi::CStr, block: &[u8]) -> Result<Timed, Fail> {
    let fd = ops::create(file).map_err(|e| na(e, "create", 0, 1))?;
    let start = Instant::now();
    for i in 0..SMALL_WRITES {
        ctx.tick(i)?;
        let w = rustix::io::write(&fd, block).map_err(|e| na(e, "write", i, SMALL_WRITES))?;
        if w != block.len() {
            return Err(Fail::Na(format!("short write ({w} bytes) at {}", i + 1)));
        }
    }
    let elapsed = start.elapsed();
    drop(fd);
    rustix::fs::unlink(file).map_err(|e| na(e, "unlink", 0, 1))?;
    Ok(Timed::of(elapsed))
}

fn open(file: &std::ffi::CStr) -> Result<std::os::fd::OwnedFd, Fail> {
    rustix::fs::open(file, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| na(e, "open", 0, 1))
}

fn sequential_read(
    ctx: &Ctx<'_>,
    file: &std::ffi::CStr,
    bytes: u64,
    buf: &mut [u8],
) -> Result<Timed, Fail> {
    let start = Instant::now();
    let fd = open(file)?;
    let mut total = 0u64;
    let mut i = 0;
    loop {
        ctx.tick(i)?;
        let r = rustix::io::read(&fd, &mut *buf).map_err(|e| na(e, "read", i, 0))?;
        if r == 0 {
            break;
        }
        total += r as u64;
        i += 1;
    }
    drop(fd);
    let elapsed = start.elapsed();
    if total != bytes {
        return Err(Fail::Na(format!("read {total} bytes, not {bytes}")));
    }
    Ok(Timed {
        elapsed,
        sd_us: None,
        value: Some(mb_per_sec(bytes, elapsed)),
    })
}

fn random_reads(
    ctx: &Ctx<'_>,
    file: &std::ffi::CStr,
    blocks: &[u64],
    buf: &mut [u8],
) -> Result<Timed, Fail> {
    random_reads_at(ctx, file, blocks, buf, true)
}

/// Opens `file` and reads each of `blocks` (4 KiB); IOPS, or µs for one
/// read (`iops` false).
fn random_reads_at(
    ctx: &Ctx<'_>,
    file: &std::ffi::CStr,
    blocks: &[u64],
    buf: &mut [u8],
    iops: bool,
) -> Result<Timed, Fail> {
    // The open is timed too: a filesystem that brings a whole file in at
    // open (safs-s3's cache) pays for it here, not before the clock starts.
    let start = Instant::now();
    let fd = open(file)?;
    rustix::fs::fadvise(&fd, 0, None, Advice::Random).map_err(|e| na(e, "fadvise", 0, 1))?;
    let n = blocks.len();
    for (i, b) in blocks.iter().enumerate() {
        ctx.tick(i)?;
        let r = rustix::io::pread(&fd, &mut *buf, b * BLOCK).map_err(|e| na(e, "pread", i, n))?;
        if r as u64 != BLOCK {
            return Err(Fail::Na(format!("short read ({r} bytes) at {}", i + 1)));
        }
    }
    let elapsed = start.elapsed();
    if !iops {
        return Ok(Timed::of(elapsed));
    }
    Ok(Timed {
        elapsed,
        sd_us: None,
        value: Some(n as f64 / elapsed.as_secs_f64().max(1e-9)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_blocks_are_distinct_in_range_and_fixed() {
        let b = random_blocks(1000, 300, SEED);
        assert_eq!(b.len(), 300);
        let mut sorted = b.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 300);
        assert!(b.iter().all(|x| *x < 1000));
        assert_eq!(b, random_blocks(1000, 300, SEED));
        // Not in file order: a shuffled sample.
        assert!(b.windows(2).any(|w| w[0] > w[1]));
        // More reads than blocks: each block once.
        assert_eq!(random_blocks(10, 50, SEED).len(), 10);
    }
}
