//! One worker answers `fsync`, `fsyncdir` and the FLUSH of a file whose
//! close put contents in the object store: they wait for a commit, which
//! must not hold a request thread. It takes every request queued meanwhile
//! as one group — each file's data made durable, then a single wait for
//! the metadata commit that covers them all (durable for an `fsync`,
//! visible to every node for a close) — and owns their replies until
//! then.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};

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

type After = Box<dyn FnOnce() -> crate::core::Result<()> + Send>;

/// Starts the worker; it ends when the returned sender (and its clones)
/// are dropped with the session.
pub(super) fn start(fs: Arc<Fs>) -> Sender<Job> {
    let (tx, rx) = channel();
    std::thread::Builder::new()
        .name("safs-sync".into())
        .spawn(move || run(&fs, &rx))
        .expect("spawn the fsync worker");
    tx
}

fn run(fs: &Fs, rx: &Receiver<Job>) {
    while let Ok(first) = rx.recv() {
        let mut waiting: Vec<(Empty, Option<After>)> = Vec::new();
        // A close needs its changes visible to every node, not durable
        // (see `core::store`): unless an fsync joins the group.
        let mut durable = false;
        for job in std::iter::once(first).chain(rx.try_iter()) {
            durable |= !matches!(job, Job::Flush { .. });
            match job {
                Job::File {
                    fh,
                    datasync,
                    reply,
                } => match fs.sync_data(fh, datasync) {
                    Ok(()) => waiting.push((reply, None)),
                    Err(e) => reply.answer(Err(e)),
                },
                Job::Dir { reply } => waiting.push((reply, None)),
                Job::Flush { after, reply } => waiting.push((reply, Some(after))),
            }
        }
        // One commit wait covers every change made before these requests.
        let synced = if durable {
            fs.sync()
        } else {
            fs.sync_visible()
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
