//! Request accounting: how many FUSE requests of each kind the daemon
//! served and how long it took, as a power-of-two latency histogram.
//!
//! These counts are the figure that explains all the others in a benchmark
//! (requests per operation), so they are always on: one relaxed atomic add
//! per request for the count and one for the bucket.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::transport::handing_back;

macro_rules! ops {
    ($($name:ident => $text:literal),+ $(,)?) => {
        /// The FUSE operations safs answers.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Op { $($name),+ }
        pub const OP_NAMES: &[&str] = &[$($text),+];
    };
}

ops! {
    Lookup => "lookup", Forget => "forget", Getattr => "getattr", Setattr => "setattr",
    Readlink => "readlink", Mknod => "mknod", Mkdir => "mkdir", Unlink => "unlink",
    Rmdir => "rmdir", Symlink => "symlink", Rename => "rename", Link => "link",
    Open => "open", Read => "read", Write => "write", Flush => "flush",
    Release => "release", Fsync => "fsync", Opendir => "opendir", Readdir => "readdir",
    Readdirplus => "readdirplus", Releasedir => "releasedir", Fsyncdir => "fsyncdir",
    Statfs => "statfs", Setxattr => "setxattr", Getxattr => "getxattr",
    Listxattr => "listxattr", Removexattr => "removexattr", Access => "access",
    Create => "create", Fallocate => "fallocate", Lseek => "lseek", Ioctl => "ioctl",
}

pub use safs_control::{BUCKETS, OpReport};

struct OpStats {
    count: AtomicU64,
    nanos: AtomicU64,
    hist: [AtomicU64; BUCKETS],
}

pub struct Stats {
    ops: Vec<OpStats>,
    /// Which transport serves the session, and its io_uring queues' counts.
    pub transport: std::sync::Arc<super::transport::Status>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            ops: OP_NAMES
                .iter()
                .map(|_| OpStats {
                    count: AtomicU64::new(0),
                    nanos: AtomicU64::new(0),
                    hist: std::array::from_fn(|_| AtomicU64::new(0)),
                })
                .collect(),
            transport: Default::default(),
        }
    }
}

/// Records one request when dropped: the handler's own time, without the
/// time its thread spent handing the reply back to `/dev/fuse` (which
/// wakes the caller; over io_uring replies are committed after the
/// handler returns), so that both transports count the same work.
pub struct Timer<'a> {
    stats: &'a Stats,
    op: Op,
    start: Instant,
    handing_back: Duration,
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        let replying = handing_back().saturating_sub(self.handing_back);
        self.stats
            .record_ns(self.op, self.start.elapsed().saturating_sub(replying));
    }
}

impl Timer<'_> {
    /// The request is answered on another thread, which records it with
    /// [`Stats::record`] when done; when it started.
    pub fn hand_off(self) -> Instant {
        let start = self.start;
        std::mem::forget(self);
        start
    }
}

impl Stats {
    /// Records one request of `op` that started at `start` and is done.
    pub fn record(&self, op: Op, start: Instant) {
        self.record_ns(op, start.elapsed());
    }

    fn record_ns(&self, op: Op, took: Duration) {
        let ns = took.as_nanos() as u64;
        let s = &self.ops[op as usize];
        s.count.fetch_add(1, Ordering::Relaxed);
        s.nanos.fetch_add(ns, Ordering::Relaxed);
        let us = ns / 1000;
        let bucket = (u64::BITS - us.leading_zeros()) as usize;
        s.hist[bucket.min(BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn start(&self, op: Op) -> Timer<'_> {
        Timer {
            stats: self,
            op,
            start: Instant::now(),
            handing_back: handing_back(),
        }
    }

    /// The operations served at least once.
    pub fn report(&self) -> Vec<OpReport> {
        self.ops
            .iter()
            .zip(OP_NAMES)
            .filter(|(s, _)| s.count.load(Ordering::Relaxed) > 0)
            .map(|(s, name)| OpReport {
                op: (*name).to_string(),
                count: s.count.load(Ordering::Relaxed),
                total_ns: s.nanos.load(Ordering::Relaxed),
                hist: s.hist.iter().map(|h| h.load(Ordering::Relaxed)).collect(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_buckets() {
        let s = Stats::default();
        for _ in 0..3 {
            let _t = s.start(Op::Getxattr);
        }
        let r = s.report();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].op, "getxattr");
        assert_eq!(r[0].count, 3);
        assert_eq!(r[0].hist.iter().sum::<u64>(), 3);
    }

    #[test]
    fn a_reply_handed_back_is_not_the_handlers_time() {
        let s = Stats::default();
        let outside = Instant::now();
        {
            let _t = s.start(Op::Getattr);
            std::thread::sleep(Duration::from_millis(20));
            // As if 15 ms of that were the reply's writev.
            super::super::transport::handed_back(Duration::from_millis(15));
        }
        let whole = outside.elapsed().as_nanos() as u64;
        let ns = s.report()[0].total_ns;
        assert!(ns >= 5_000_000, "{ns} ns");
        assert!(ns + 15_000_000 <= whole, "{ns} ns of {whole}");
    }
}
