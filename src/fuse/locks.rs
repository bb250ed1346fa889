//! `fcntl` and `flock` locks on a volume several daemons serve: INIT asks
//! the kernel to send them (`FUSE_POSIX_LOCKS`, `FUSE_FLOCK_LOCKS`), and
//! the core keeps them in the shared engine, so they hold across mounts.
//! Volumes one daemon serves leave them to the kernel, as before.
//!
//! A `F_SETLKW` that meets a conflict does not hold a worker (over io_uring
//! it would hold its queue): its reply is parked here and answered by a
//! thread of its own, which tries the parked requests again in the order
//! they came each time a daemon's locks loosen (the engine's doorbell),
//! and at least once a second. An INTERRUPT (a signal for the waiting
//! process) answers its request with `EINTR`; one that arrives before its
//! request is remembered for a while.
//!
//! The kernel lets a descriptor's close drop its process's record locks by
//! sending FLUSH with that owner, and the last close of an open file drop
//! what was taken through it (OFD locks, `flock`) by RELEASE: both go to
//! the engine only for inodes this daemon ever locked. FLUSH itself is a
//! round trip per close (+20 µs per open and close measured here), so
//! files are opened without it (`FOPEN_NOFLUSH`) unless this daemon has
//! locked their inode: a descriptor opened before an inode's first lock
//! here does not drop that lock when it closes — the last close of the open
//! file the lock was taken through does.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use zerocopy::IntoBytes;

use super::proto::abi;
use super::transport::Reply;
use crate::core::Fs;
use crate::meta::{LockDrop, LockError, LockHolder, LockKind, LockReq};

/// How often parked requests are tried again when no doorbell rang.
const RETRY: Duration = Duration::from_secs(1);
/// How long an INTERRUPT that came before its request is remembered.
const EARLY_KEPT: Duration = Duration::from_secs(10);

struct Parked {
    unique: u64,
    req: LockReq,
    reply: Reply,
}

#[derive(Default)]
struct Inner {
    parked: Vec<Parked>,
    early: VecDeque<(u64, Instant)>,
    rang: bool,
    stop: bool,
}

pub(super) struct Locks {
    fs: Arc<Fs>,
    inner: Mutex<Inner>,
    wake: Condvar,
    /// Inodes this daemon took a lock on (closes of others skip the
    /// engine).
    locked: Mutex<HashSet<u64>>,
}

impl Locks {
    /// Starts the thread that answers parked `F_SETLKW`s.
    pub(super) fn start(fs: Arc<Fs>) -> std::io::Result<Arc<Locks>> {
        let locks = Arc::new(Locks {
            fs,
            inner: Mutex::new(Inner::default()),
            wake: Condvar::new(),
            locked: Mutex::new(HashSet::new()),
        });
        let weak = Arc::downgrade(&locks);
        locks.fs.on_locks_changed(Box::new(move || {
            if let Some(l) = weak.upgrade() {
                l.inner.lock().rang = true;
                l.wake.notify_one();
            }
        }));
        let l = Arc::clone(&locks);
        std::thread::Builder::new()
            .name("safs-locks".into())
            .spawn(move || l.run())?;
        Ok(locks)
    }

    /// GETLK, SETLK, SETLKW for `ino`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn request(
        &self,
        unique: u64,
        ino: u64,
        fh: u64,
        owner: u64,
        lk: abi::FileLock,
        flock: bool,
        (test, wait): (bool, bool),
        reply: Reply,
    ) {
        let kind = match lk.typ as i32 {
            libc::F_RDLCK => LockKind::Read,
            libc::F_WRLCK => LockKind::Write,
            libc::F_UNLCK => LockKind::Unlock,
            _ => return reply.error(libc::EINVAL),
        };
        if lk.start > lk.end {
            return reply.error(libc::EINVAL);
        }
        let req = LockReq {
            ino,
            owner,
            flock,
            kind,
            start: lk.start,
            end: lk.end,
            pid: lk.pid,
            fh,
        };
        if test {
            return match self.fs.lock_test(&req) {
                Ok(held) => reply.send(&[lk_out(held.as_ref()).as_bytes()]),
                Err(e) => reply.error(e.errno()),
            };
        }
        if kind != LockKind::Unlock {
            self.locked.lock().insert(ino);
        }
        match self.fs.lock_set(&req, wait) {
            Ok(None) => reply.send(&[]),
            Ok(Some(_)) if !wait => reply.error(libc::EAGAIN),
            Ok(Some(_)) => self.park(Parked { unique, req, reply }),
            Err(e) => reply.error(lock_errno(&e)),
        }
    }

    fn park(&self, p: Parked) {
        let mut inner = self.inner.lock();
        let now = Instant::now();
        inner
            .early
            .retain(|&(_, at)| now.duration_since(at) < EARLY_KEPT);
        if let Some(i) = inner.early.iter().position(|&(u, _)| u == p.unique) {
            inner.early.remove(i);
            drop(inner);
            self.give_up(p);
            return;
        }
        inner.parked.push(p);
    }

    /// INTERRUPT of request `unique`: a parked `F_SETLKW` ends with EINTR.
    pub(super) fn interrupt(&self, unique: u64) {
        let mut inner = self.inner.lock();
        match inner.parked.iter().position(|p| p.unique == unique) {
            Some(i) => {
                let p = inner.parked.remove(i);
                drop(inner);
                self.give_up(p);
            }
            None => {
                inner.early.push_back((unique, Instant::now()));
                if inner.early.len() > 256 {
                    inner.early.pop_front();
                }
            }
        }
    }

    fn give_up(&self, p: Parked) {
        let _ = self.fs.lock_drop(p.req.ino, LockDrop::Wait(p.req.owner));
        p.reply.error(libc::EINTR);
    }

    /// Whether this daemon ever took a lock on `ino`: its opens then ask
    /// for FLUSH at every close.
    pub(super) fn has_locked(&self, ino: u64) -> bool {
        self.locked.lock().contains(&ino)
    }

    /// FLUSH of a descriptor of `ino` by `owner`: its record locks go.
    pub(super) fn flush(&self, ino: u64, owner: u64) -> crate::core::Result<()> {
        if !self.locked.lock().contains(&ino) {
            return Ok(());
        }
        self.fs.lock_drop(ino, LockDrop::Posix(owner))
    }

    /// RELEASE of open file `fh` of `ino`: what was taken through it goes.
    pub(super) fn release(&self, ino: u64, fh: u64) {
        if self.locked.lock().contains(&ino) {
            if let Err(e) = self.fs.lock_drop(ino, LockDrop::File(fh)) {
                tracing::warn!(ino, error = %e, "cannot drop the locks of a closed file");
            }
        }
    }

    /// Answers every parked request (the session is ending).
    pub(super) fn stop(&self) {
        let parked = {
            let mut inner = self.inner.lock();
            inner.stop = true;
            std::mem::take(&mut inner.parked)
        };
        self.wake.notify_one();
        for p in parked {
            self.give_up(p);
        }
    }

    fn run(&self) {
        loop {
            let parked = {
                let mut inner = self.inner.lock();
                if !inner.rang && !inner.stop {
                    self.wake.wait_for(&mut inner, RETRY);
                }
                if inner.stop {
                    return;
                }
                inner.rang = false;
                std::mem::take(&mut inner.parked)
            };
            let mut still = Vec::new();
            for p in parked {
                match self.fs.lock_set(&p.req, true) {
                    Ok(None) => p.reply.send(&[]),
                    Ok(Some(_)) => still.push(p),
                    Err(e) => {
                        let _ = self.fs.lock_drop(p.req.ino, LockDrop::Wait(p.req.owner));
                        p.reply.error(lock_errno(&e));
                    }
                }
            }
            // Those parked meanwhile come after (the order requests came).
            let mut inner = self.inner.lock();
            still.append(&mut inner.parked);
            inner.parked = still;
        }
    }
}

fn lock_errno(e: &LockError) -> i32 {
    match e {
        LockError::Deadlock => libc::EDEADLK,
        // An engine that failed (what any metadata error answers).
        LockError::Meta(m) => {
            tracing::warn!(error = %m, "file lock not taken");
            libc::EIO
        }
    }
}

/// GETLK's answer: the lock in the way, or `F_UNLCK`.
fn lk_out(held: Option<&LockHolder>) -> abi::LkOut {
    let lk = match held {
        None => abi::FileLock {
            typ: libc::F_UNLCK as u32,
            ..Default::default()
        },
        Some(h) => abi::FileLock {
            start: h.start,
            end: h.end,
            typ: match h.kind {
                LockKind::Write => libc::F_WRLCK,
                _ => libc::F_RDLCK,
            } as u32,
            pid: h.pid,
        },
    };
    abi::LkOut { lk }
}
