//! A few workers answer `fsync`, `fsyncdir` and the FLUSH of a file whose
//! close put contents in the object store: they wait for a commit, which
//! must not hold a request thread. A free worker takes every request
//! queued meanwhile as one group — each file's data made durable, and a
//! single wait for the metadata commit that covers them all (durable for
//! an `fsync`, visible to every node for a close) — and owns their replies
//! until then. Where the contents are local the committer commits while
//! the worker syncs the files: the two are independent writes, and the
//! filesystem under the volume then commits them together (one after the
//! other, an fsync under dbench's load took both commits' time).

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};

use parking_lot::Mutex;

use super::answer::{Answer, Empty};
use crate::core::{Fh, Fs};

pub(super) enum Job {
    /// `fsync`/`fdatasync` of an open file: its data, then the metadata.
    File {
        fh: Fh,
        datasync: bool,
        reply: Empty,
    },
    /// `fsync` of a directory: every metadata change so far.
    Dir { reply: Empty },
    /// FLUSH (a `close(2)`) of a file whose contents went to the object
    /// store for it (a volume other nodes share): the commit naming them
    /// before `close` returns; then `after` (the closing owner's record
    /// locks go, once what they guarded is visible to every node).
    Flush { after: After, reply: Empty },
}

/// Workers: a group waits for the one before it only when all are busy
/// (with one, an fsync arriving during a group's 1–2 ms waited for all of
/// it before its own began).
const WORKERS: usize = 4;

type After = Box<dyn FnOnce() -> crate::core::Result<()> + Send>;

/// Starts the workers; they end when the returned sender (and its clones)
/// are dropped with the session.
pub(super) fn start(fs: Arc<Fs>) -> Sender<Job> {
    let (tx, rx) = channel();
    let rx = Arc::new(Mutex::new(rx));
    for i in 0..WORKERS {
        let (fs, rx) = (Arc::clone(&fs), Arc::clone(&rx));
        std::thread::Builder::new()
            .name(format!("safs-fsync-{i}"))
            .spawn(move || run(&fs, &rx))
            .expect("spawn the fsync workers");
    }
    tx
}

fn run(fs: &Fs, rx: &Mutex<Receiver<Job>>) {
    loop {
        let jobs: Vec<Job> = {
            let rx = rx.lock();
            let Ok(first) = rx.recv() else {
                return;
            };
            std::iter::once(first).chain(rx.try_iter()).collect()
        };
        // A close needs its changes visible to every node, not durable
        // (see `core::store`): unless an fsync joins the group.
        let durable = jobs.iter().any(|j| !matches!(j, Job::Flush { .. }));
        // Uploads to an object store change the metadata the commit must
        // cover: first. Local contents go beside the commit.
        let overlap =
            durable && !fs.stores_objects() && jobs.iter().any(|j| matches!(j, Job::File { .. }));
        // The committer commits while this thread syncs the files.
        let started = overlap.then(|| fs.start_sync());
        let waiting = sync_contents(fs, jobs);
        let synced = match started {
            Some(started) => fs.wait_synced(started),
            None if durable => fs.sync(),
            None => fs.sync_visible(),
        };
        let synced = synced.map_err(|e| e.errno());
        for (reply, after) in waiting {
            let done = after.map_or(Ok(()), |f| f()).map_err(|e| e.errno());
            match synced.and(done) {
                Ok(()) => reply.value(()),
                Err(errno) => reply.0.error(errno),
            }
        }
    }
}

/// Makes each `fsync`ed file's contents durable, the files at once; the
/// replies still owed (a failed file is answered here).
fn sync_contents(fs: &Fs, jobs: Vec<Job>) -> Vec<(Empty, Option<After>)> {
    let mut waiting = Vec::with_capacity(jobs.len());
    let mut files = Vec::new();
    for job in jobs {
        match job {
            Job::File {
                fh,
                datasync,
                reply,
            } => files.push((fh, datasync, reply)),
            Job::Dir { reply } => waiting.push((reply, None)),
            Job::Flush { after, reply } => waiting.push((reply, Some(after))),
        }
    }
    // The first file on this thread, the others beside it.
    let synced: Vec<crate::core::Result<()>> = std::thread::scope(|s| {
        let others: Vec<_> = files
            .iter()
            .skip(1)
            .map(|&(fh, datasync, _)| s.spawn(move || fs.sync_data(fh, datasync)))
            .collect();
        let first = files
            .first()
            .map(|&(fh, datasync, _)| fs.sync_data(fh, datasync));
        first
            .into_iter()
            .chain(others.into_iter().map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(crate::core::CoreError::Io(std::io::Error::other(
                        "an fsync panicked",
                    )))
                })
            }))
            .collect()
    });
    for ((_, _, reply), r) in files.into_iter().zip(synced) {
        match r {
            Ok(()) => waiting.push((reply, None)),
            Err(e) => reply.answer(Err(e)),
        }
    }
    waiting
}
