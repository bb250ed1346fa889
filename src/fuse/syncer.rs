//! One worker answers `fsync` and `fsyncdir`: they wait for a commit, which
//! must not hold a request thread. It takes every request queued meanwhile
//! as one group — each file's data made durable, then a single wait for the
//! metadata commit that covers them all — and owns their replies until
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
}

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
        let mut waiting = Vec::new();
        for job in std::iter::once(first).chain(rx.try_iter()) {
            match job {
                Job::File {
                    fh,
                    datasync,
                    reply,
                } => match fs.sync_data(fh, datasync) {
                    Ok(()) => waiting.push(reply),
                    Err(e) => reply.answer(Err(e)),
                },
                Job::Dir { reply } => waiting.push(reply),
            }
        }
        // One commit wait covers every change made before these requests.
        match fs.sync() {
            Ok(()) => waiting.into_iter().for_each(|r| r.value(())),
            Err(e) => {
                let errno = e.errno();
                for r in waiting {
                    r.0.error(errno);
                }
            }
        }
    }
}
