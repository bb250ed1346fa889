//! Reads of file contents through the daemon, answered off the io_uring
//! queue threads. Over io_uring the kernel sends a task's requests to the
//! queue of the CPU it runs on, served by one thread: the readahead of one
//! reader — several READs at once — would be decrypted one after another on
//! that thread while the other CPUs idle (on an encrypted volume: a 256 MiB
//! cold read at 380–670 MB/s against 940–990 over `/dev/fuse`, whose
//! worker threads take the READs in parallel). The queue thread hands each
//! READ to this pool and goes back to fetching; the reply goes back through
//! the queue like any reply made off its thread. A small READ alone — no
//! other request waiting behind it, none in the pool — is served where it
//! came: a hand-off would cost a random 4 KiB read a cross-CPU wakeup
//! (about a third of its IOPS here), where for a readahead READ of 128 KiB
//! it is small beside decrypting it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};

use std::time::Instant;

use super::answer::Data;
use super::stats::{Op, Stats};
use crate::core::{Fh, Fs};

/// A READ at least this large goes to the pool.
const LARGE: u32 = 32 << 10;

pub(super) struct Job {
    pub fh: Fh,
    pub offset: u64,
    pub size: u32,
    pub reply: Data,
    /// When the request came (it is counted once answered).
    pub since: Instant,
}

/// The pool's queue.
pub(super) struct Pool {
    tx: Sender<Job>,
    /// Jobs queued or being read.
    busy: Arc<AtomicUsize>,
}

impl Pool {
    /// Starts `threads` readers; they end when the pool is dropped with
    /// the session.
    pub fn start(fs: Arc<Fs>, stats: Arc<Stats>, threads: usize) -> Pool {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let busy = Arc::new(AtomicUsize::new(0));
        for i in 0..threads.max(1) {
            let (fs, stats, rx, busy) = (
                Arc::clone(&fs),
                Arc::clone(&stats),
                Arc::clone(&rx),
                Arc::clone(&busy),
            );
            std::thread::Builder::new()
                .name(format!("safs-read-{i}"))
                .spawn(move || run(&fs, &stats, &rx, &busy))
                .expect("spawn a reader thread");
        }
        Pool { tx, busy }
    }

    /// Whether a READ of `size` bytes should go to the pool: a large one
    /// (readahead), or when the pool has work or requests wait behind this
    /// one on its queue thread.
    pub fn wanted(&self, size: u32) -> bool {
        size >= LARGE
            || self.busy.load(Ordering::Relaxed) > 0
            || super::transport::uring::requests_waiting()
    }

    /// Queues `job`; gives it back if the pool is gone.
    pub fn send(&self, job: Job) -> Result<(), Job> {
        self.busy.fetch_add(1, Ordering::Relaxed);
        self.tx.send(job).map_err(|e| {
            self.busy.fetch_sub(1, Ordering::Relaxed);
            e.0
        })
    }
}

fn run(fs: &Fs, stats: &Stats, rx: &Mutex<Receiver<Job>>, busy: &AtomicUsize) {
    loop {
        // The lock is held only to take a job, never while reading.
        let job = match rx.lock() {
            Ok(r) => r.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        answer(fs, job.fh, job.offset, job.size, job.reply);
        stats.record(Op::Read, job.since);
        busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Answers a READ of `size` bytes of `fh` at `offset`, wherever it is
/// served.
pub(super) fn answer(fs: &Fs, fh: Fh, offset: u64, size: u32, reply: Data) {
    reply.answer_read(
        size,
        |buf| fs.read_into(fh, offset, buf),
        || fs.read(fh, offset, size),
    );
}
