//! Serving a session over `/dev/fuse`: INIT on the session file, then
//! worker threads, each reading requests from its own clone of it and
//! writing the replies back to the file the request came from.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use super::conn::{Conn, write_message};
use super::{Handler, RawRequest, Reply, uring};

/// Size of `struct fuse_in_header`.
const IN_HEADER_LEN: usize = 40;
/// `FUSE_INIT`.
const OP_INIT: u32 = 26;
/// `FUSE_FORGET`, `FUSE_BATCH_FORGET`.
const OP_FORGET: u32 = 2;
const OP_BATCH_FORGET: u32 = 42;
/// How long a reader beside io_uring gathers FORGETs (see `worker`).
const FORGET_GATHER: std::time::Duration = std::time::Duration::from_millis(1);
/// `FUSE_MAX_PAGES` in `fuse_init_out.flags`.
const FLAG_MAX_PAGES: u32 = 1 << 22;
/// The largest extended attribute value (`XATTR_SIZE_MAX`): a SETXATTR
/// carries it whole, whatever `max_write` is.
const XATTR_SIZE_MAX: usize = 64 * 1024;
/// Room for a request's headers and names beside its data: the in-header
/// and `fuse_write_in` (80 bytes), a page for the rest.
const HEADROOM: usize = 4096 + 80;
/// The read buffer for INIT, before `max_write` is known (what libfuse
/// reads it with: 32 pages and a page). INIT itself is ~100 bytes.
const INIT_BUFFER: usize = 33 * 4096;

/// How a session is served.
#[derive(Clone, Default)]
pub struct ServeOptions {
    /// `/dev/fuse` reader threads (0 counts as 1); one when io_uring serves.
    pub threads: usize,
    /// Entries per io_uring queue, when INIT enabled FUSE over io_uring.
    pub uring_depth: usize,
    /// io_uring queue threads yield their CPU to the callers they answer
    /// (`transport::yielding`).
    pub uring_yield: bool,
    /// Where the session says which transport serves it (for stats).
    pub status: Arc<super::Status>,
}

/// What the daemon answers to INIT, and what it means for the transport.
#[derive(Clone, Debug)]
pub struct InitOutcome {
    /// The `fuse_init_out` bytes.
    pub reply: Vec<u8>,
    /// The reply enables FUSE over io_uring (`FUSE_OVER_IO_URING`): start
    /// the rings.
    pub uring: bool,
    /// The `max_write` of the reply.
    pub max_write: u32,
}

impl InitOutcome {
    /// The most data one request may carry: `max_write`, the request size
    /// `max_pages` allows (when the reply sets `FUSE_MAX_PAGES`), and an
    /// extended attribute value.
    fn payload_size(&self) -> usize {
        let mut size = (self.max_write as usize).max(XATTR_SIZE_MAX);
        let r = &self.reply;
        if r.len() >= 32 {
            let flags = u32::from_ne_bytes([r[12], r[13], r[14], r[15]]);
            let max_pages = u16::from_ne_bytes([r[28], r[29]]) as usize;
            if flags & FLAG_MAX_PAGES != 0 {
                size = size.max(max_pages * page_size());
            }
        }
        size
    }
}

fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |p| p as usize)
}

/// The way back for a request read from `/dev/fuse`: the file it came from
/// (a clone's replies must go to that clone).
pub(super) struct DevRoute {
    file: Arc<File>,
}

impl DevRoute {
    pub(super) fn new(file: Arc<File>) -> DevRoute {
        DevRoute { file }
    }

    /// Writes `fuse_out_header` + `body` with one `writev`.
    pub(super) fn send(self, unique: u64, error: i32, body: &[&[u8]]) {
        if let Err(e) = write_message(&self.file, unique, error, body) {
            match e.raw_os_error() {
                // The request was interrupted and is gone; or the session has
                // ended (a reply sent after `serve` returned).
                Some(libc::ENOENT) | Some(libc::ENODEV) => {}
                _ => tracing::warn!(unique, error, %e, "writing a FUSE reply"),
            }
        }
    }
}

/// Serves the session until it is unmounted and every worker has stopped.
///
/// Reads INIT on the session file and answers it with what `init` returns
/// (`Err(errno)`: that errno is the answer, and `serve` fails). Then
/// `o.threads` workers, each on its own clone of the file, read requests
/// and pass them to `handler`; when INIT enabled FUSE over io_uring, the
/// rings are started too (if that fails, `/dev/fuse` serves everything).
/// FORGET, INTERRUPT and notifications always use `/dev/fuse`.
///
/// `started` runs once everything that will serve is serving (the rings
/// included), so that what the mount reports from then on is final.
///
/// Returns once reads fail with `ENODEV` (the mount is gone) in every
/// worker, all of them joined; `Ok` also when the mount went away before
/// INIT. A `Reply` still held then fails harmlessly.
pub fn serve(
    conn: &Conn,
    handler: Arc<dyn Handler>,
    init: impl FnOnce(RawRequest<'_>) -> Result<InitOutcome, i32>,
    started: impl FnOnce(),
    o: &ServeOptions,
) -> io::Result<()> {
    let Some(outcome) = answer_init(conn, init)? else {
        tracing::info!("the mount went away before INIT");
        return Ok(());
    };
    let payload_size = outcome.payload_size();
    let buffer_size = payload_size + HEADROOM;

    // Over io_uring one reader carries what the rings do not (FORGET,
    // INTERRUPT) and gathers FORGETs (see `worker`); over /dev/fuse they
    // carry everything.
    let threads = o.threads.max(1);
    let gather = Arc::new(AtomicBool::new(false));
    let mut workers = Workers {
        conn,
        handler: &handler,
        buffer_size,
        gather: &gather,
        cloning: true,
        running: Vec::with_capacity(threads),
    };
    workers.spawn(if outcome.uring { 1 } else { threads })?;

    let queues = if outcome.uring {
        match uring::start(
            conn.as_fd(),
            Arc::clone(&handler),
            o.uring_depth,
            payload_size,
            o.uring_yield,
        ) {
            Ok(q) => {
                o.status.set_uring(q.counters());
                gather.store(true, Ordering::Relaxed);
                Some(q)
            }
            Err(e) => {
                tracing::warn!(error = %e, "FUSE over io_uring did not start; serving on /dev/fuse");
                workers.spawn(threads - 1)?;
                None
            }
        }
    } else {
        None
    };
    started();

    let mut result = Ok(());
    for w in workers.running {
        let r = w
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("a FUSE worker panicked")));
        if let Err(e) = r {
            tracing::error!(error = %e, "FUSE worker failed");
            if result.is_ok() {
                result = Err(e);
            }
        }
    }
    if let Some(q) = queues {
        q.join();
    }
    result
}

/// The `/dev/fuse` reader threads of a session.
struct Workers<'a> {
    conn: &'a Conn,
    handler: &'a Arc<dyn Handler>,
    buffer_size: usize,
    gather: &'a Arc<AtomicBool>,
    /// Each reads its own clone of the session file (while cloning works).
    cloning: bool,
    running: Vec<thread::JoinHandle<io::Result<()>>>,
}

impl Workers<'_> {
    /// Starts `n` more readers. Fails only if none runs at all.
    fn spawn(&mut self, n: usize) -> io::Result<()> {
        for _ in 0..n {
            let i = self.running.len();
            let file = if self.cloning {
                match self.conn.clone_dev() {
                    Ok(f) => Arc::new(f),
                    Err(e) => {
                        // Pre-4.5 kernels: every worker reads the session file.
                        tracing::warn!(error = %e, "cannot clone /dev/fuse; workers share one file");
                        self.cloning = false;
                        Arc::clone(self.conn.file())
                    }
                }
            } else {
                Arc::clone(self.conn.file())
            };
            let handler = Arc::clone(self.handler);
            let gather = Arc::clone(self.gather);
            let buffer_size = self.buffer_size;
            let spawned = thread::Builder::new()
                .name(format!("safs-fuse-{i}"))
                .spawn(move || worker(file, handler, buffer_size, &gather));
            match spawned {
                Ok(w) => self.running.push(w),
                // Already-running workers serve until the unmount; with none,
                // nothing would read the requests.
                Err(e) if self.running.is_empty() => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, started = i, "cannot start every FUSE worker");
                    break;
                }
            }
        }
        Ok(())
    }
}

/// Reads INIT on the session file and answers it. `None`: the mount went
/// away first.
fn answer_init(
    conn: &Conn,
    init: impl FnOnce(RawRequest<'_>) -> Result<InitOutcome, i32>,
) -> io::Result<Option<InitOutcome>> {
    let file = conn.file();
    let mut buf = vec![0u8; INIT_BUFFER];
    let Some(n) = read_request(file, &mut buf)? else {
        return Ok(None);
    };
    let Some((opcode, unique)) = parse_header(&buf[..n]) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a {n}-byte first request from the kernel"),
        ));
    };
    if opcode != OP_INIT {
        let _ = write_message(file, unique, -libc::EIO, &[]);
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the kernel's first request is opcode {opcode}, not INIT"),
        ));
    }
    let req = RawRequest {
        header: &buf[..IN_HEADER_LEN],
        op_in: None,
        payload: &buf[IN_HEADER_LEN..n],
    };
    match init(req) {
        Ok(outcome) => {
            write_message(file, unique, 0, &[&outcome.reply])?;
            Ok(Some(outcome))
        }
        Err(errno) => {
            let _ = write_message(file, unique, -errno, &[]);
            let e = io::Error::from_raw_os_error(errno);
            Err(io::Error::new(e.kind(), format!("INIT refused: {e}")))
        }
    }
}

/// One request into `buf`: its length, or `None` once the session has
/// ended (`ENODEV`).
fn read_request(file: &File, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        match (&*file).read(buf) {
            Ok(n) => return Ok(Some(n)),
            Err(e) => match e.raw_os_error() {
                // ENOENT: the request was interrupted before we read it.
                Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::ENOENT) => continue,
                Some(libc::ENODEV) => return Ok(None),
                _ => return Err(e),
            },
        }
    }
}

/// The opcode and unique of a request whose length is consistent.
fn parse_header(req: &[u8]) -> Option<(u32, u64)> {
    if req.len() < IN_HEADER_LEN {
        return None;
    }
    let len = u32::from_ne_bytes(req[0..4].try_into().ok()?) as usize;
    let opcode = u32::from_ne_bytes(req[4..8].try_into().ok()?);
    let unique = u64::from_ne_bytes(req[8..16].try_into().ok()?);
    (len == req.len()).then_some((opcode, unique))
}

/// One worker: reads requests from `file` until the session ends.
///
/// With `gather` set (io_uring serves the rest), a worker that answered a
/// FORGET pauses before it reads again: the kernel keeps the FORGETs that
/// come meanwhile and hands them over as one BATCH_FORGET. Each unlinked
/// file's FORGET otherwise woke this thread on the other CPU, an
/// interprocessor wakeup and a state lock per file, beside the caller's
/// chain of requests; nobody waits for a FORGET, and an INTERRUPT waits
/// at most the pause.
fn worker(
    file: Arc<File>,
    handler: Arc<dyn Handler>,
    buffer_size: usize,
    gather: &AtomicBool,
) -> io::Result<()> {
    let mut buf = vec![0u8; buffer_size];
    while let Some(n) = read_request(&file, &mut buf)? {
        let arrived = super::trace::arrived();
        let req = &buf[..n];
        let Some((opcode, unique)) = parse_header(req) else {
            tracing::error!(len = n, "malformed FUSE request ignored");
            if n >= 16 {
                let unique = u64::from_ne_bytes(req[8..16].try_into().expect("8 bytes"));
                let _ = write_message(&file, unique, -libc::EIO, &[]);
            }
            continue;
        };
        let reply = Reply::from_dev(unique, opcode, arrived, DevRoute::new(Arc::clone(&file)));
        let raw = RawRequest {
            header: &req[..IN_HEADER_LEN],
            op_in: None,
            payload: &req[IN_HEADER_LEN..],
        };
        // A handler bug fails one request (its dropped reply answers EIO),
        // not the worker: the mount must keep being served.
        if catch_unwind(AssertUnwindSafe(|| handler.handle(raw, reply))).is_err() {
            tracing::error!(unique, "FUSE handler panicked");
        }
        if matches!(opcode, OP_FORGET | OP_BATCH_FORGET) && gather.load(Ordering::Relaxed) {
            thread::sleep(FORGET_GATHER);
        }
    }
    Ok(())
}
