//! FUSE over io_uring (Linux >= 6.14, `FUSE_OVER_IO_URING`): one queue per
//! possible CPU, each a thread pinned to its CPU with a ring of 128-byte
//! SQEs whose entries the kernel fills with requests and the daemon answers
//! with COMMIT_AND_FETCH.
//!
//! How the kernel (`fs/fuse/dev_uring.c`) uses a ring entry:
//!
//! - REGISTER (`IORING_OP_URING_CMD`, `cmd_op` 1, `fuse_uring_cmd_req` with
//!   the queue's `qid` in the command area) hands it two buffers through
//!   `sqe->addr`/`sqe->len = 2`: an iovec array whose first element is the
//!   `fuse_uring_req_header` (>= 288 bytes) and whose second is the payload
//!   buffer (>= the kernel's `max(8192, max_write, max_pages * PAGE_SIZE)`).
//!   A successful REGISTER completes only when a request arrives.
//! - A request arrives as the completion (result 0) of the entry's last
//!   REGISTER or COMMIT_AND_FETCH: `fuse_in_header` at the start of
//!   `in_out`, the operation's first argument (`fuse_write_in`, ...) in
//!   `op_in`, the other arguments (names, data) in the payload buffer,
//!   their length in `ring_ent_in_out.payload_sz`, and `commit_id`
//!   (the request's unique) there too.
//! - The reply: `fuse_out_header` at the start of `in_out`, the reply's
//!   structures (never the out header) in the payload buffer, their length
//!   in `payload_sz`; COMMIT_AND_FETCH (`cmd_op` 2) with `commit_id` in the
//!   command area hands it to the kernel, and the entry waits for the next
//!   request.
//! - The kernel sends a request to the queue of the CPU its caller runs on
//!   and uses the rings only once every queue (`num_possible_cpus()` of
//!   them) has an entry registered; until then new requests wait. A
//!   REGISTER that fails turns the rings off for the connection: `/dev/fuse`
//!   serves everything.
//! - FORGET, BATCH_FORGET and INTERRUPT never come over the rings (the
//!   kernel queues them on `/dev/fuse`); notifications go there too.
//! - When the connection ends (unmount, abort), every entry waiting in the
//!   kernel completes with `-ENOTCONN`, and a COMMIT_AND_FETCH sent later
//!   fails with `-ENOTCONN` (or `-ECONNABORTED`): a queue thread ends once
//!   none of its entries is left in the kernel.
//!
//! Who may touch an entry's buffers: the kernel while the entry's command
//! is in flight; the queue thread from the command's completion until the
//! handler returns; the reply (writer of the out header, the body and
//! `payload_sz`) from then until the queue thread submits the commit. A
//! reply sent while the handler still holds the request's payload (it
//! answers inside `handle`) is copied aside and written by the queue thread
//! once `handle` has returned.

use std::alloc::{self, Layout};
use std::cell::{Cell, RefCell};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use io_uring::{IoUring, cqueue, opcode, squeue, types};
use parking_lot::Mutex;

use super::{Handler, RawRequest, Reply, yielding};

// ---- the kernel's ABI (include/uapi/linux/fuse.h, protocol 7.42+) ----

/// `struct fuse_in_header`.
const IN_HEADER_LEN: usize = 40;
/// `struct fuse_out_header`.
const OUT_HEADER_LEN: usize = 16;
/// `fuse_uring_req_header.op_in`: offset and size.
const OP_IN_OFFSET: usize = 128;
const OP_IN_LEN: usize = 128;
/// `fuse_uring_req_header.ring_ent_in_out` (`struct fuse_uring_ent_in_out`).
const ENT_IN_OUT_OFFSET: usize = 256;
/// Offsets in `fuse_uring_ent_in_out`: `commit_id` (u64), `payload_sz` (u32).
const ENT_COMMIT_ID: usize = 8;
const ENT_PAYLOAD_SZ: usize = 16;
/// `sizeof(struct fuse_uring_req_header)`.
const REQ_HEADER_LEN: usize = 288;
/// `enum fuse_uring_cmd`.
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// Offsets in `struct fuse_uring_cmd_req` (the SQE's command area):
/// `commit_id` (u64), `qid` (u16).
const CMD_COMMIT_ID: usize = 8;
const CMD_QID: usize = 16;
/// `FUSE_MIN_READ_BUFFER`, and the kernel's `max_pages` when INIT does not
/// set `FUSE_MAX_PAGES` (`FUSE_DEFAULT_MAX_PAGES_PER_REQ`): the payload
/// buffer must hold at least both.
const FUSE_MIN_READ_BUFFER: usize = 8192;
const DEFAULT_MAX_PAGES: usize = 32;
/// Opcodes that expect no reply: FORGET, INTERRUPT, BATCH_FORGET,
/// NOTIFY_REPLY. Only the last can come over a ring.
const NO_REPLY_OPCODES: [u32; 4] = [2, 36, 42, 41];
/// `len` in `struct io_uring_sqe` (REGISTER's iovec count).
const SQE_LEN_OFFSET: usize = 24;

// ---- this module's layout ----

/// Room per entry in the queue's header block (a header is 288 bytes).
const HEADER_STRIDE: usize = 512;
/// Alignment of the buffers: the kernel pins and copies pages.
const PAGE: usize = 4096;
/// `user_data` of the eventfd poll (entries use their index).
const WAKE: u64 = u64::MAX;
/// Most entries per queue (indices travel as `u16`).
const MAX_DEPTH: usize = 4096;

/// `struct iovec`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Iov {
    base: usize,
    len: usize,
}

const _: () = assert!(size_of::<Iov>() == size_of::<libc::iovec>());
const _: () = assert!(REQ_HEADER_LEN <= HEADER_STRIDE && HEADER_STRIDE.is_power_of_two());

/// The running queues (one per possible CPU, each a thread pinned to its
/// CPU with its own ring).
pub(super) struct Queues {
    threads: Vec<JoinHandle<Retained>>,
    queues: Vec<Arc<Queue>>,
    counts: QueueCounts,
}

/// Requests served per queue; cloneable, readable while the queues run.
#[derive(Clone)]
pub(super) struct QueueCounts(Arc<[PaddedCounter]>);

/// One queue's counters on their own cache line.
#[repr(align(64))]
#[derive(Default)]
struct PaddedCounter {
    served: AtomicU64,
    /// Requests whose caller sent its previous one from another CPU.
    moved: AtomicU64,
}

impl QueueCounts {
    /// Requests served so far, per queue.
    pub(super) fn counts(&self) -> Vec<u64> {
        self.0
            .iter()
            .map(|c| c.served.load(Ordering::Relaxed))
            .collect()
    }

    /// Requests so far whose caller had moved to another CPU since its
    /// previous request, all queues.
    pub(super) fn moved(&self) -> u64 {
        self.0.iter().map(|c| c.moved.load(Ordering::Relaxed)).sum()
    }
}

/// Registers `depth` ring entries per queue on the session's `/dev/fuse`
/// file, each with a header buffer and a payload buffer of at least
/// `payload_size` bytes, and starts one thread per queue that hands each
/// request to `handler`. Call it once the INIT reply that enabled
/// `FUSE_OVER_IO_URING` was written.
///
/// `payload_size` must be at least what the kernel may put in a request
/// (`max(max_write, max_pages * PAGE_SIZE)`); it is raised to the kernel's
/// floor (8 KiB, and 32 pages: the `max_pages` of an INIT reply without
/// `FUSE_MAX_PAGES`).
///
/// On `Err` nothing runs, and the rings were turned off for the
/// connection: `/dev/fuse` serves every request.
///
/// The rings hold the session file open: closing the `/dev/fuse` fd does
/// not end the connection while they run. It ends at the unmount (or an
/// abort), and then the queue threads end; [`Queues::shutdown`] stops them
/// earlier.
pub(super) fn start(
    fuse_fd: BorrowedFd<'_>,
    handler: Arc<dyn Handler>,
    depth: usize,
    payload_size: usize,
    yield_cpu: bool,
) -> io::Result<Queues> {
    if depth == 0 || depth > MAX_DEPTH {
        give_up_rings(fuse_fd);
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("io_uring queue depth {depth} is not in 1..={MAX_DEPTH}"),
        ));
    }
    let payload_size = payload_size
        .max(FUSE_MIN_READ_BUFFER)
        .max(DEFAULT_MAX_PAGES * PAGE)
        .next_multiple_of(PAGE);
    let nr_queues = possible_cpus();
    let counts = QueueCounts((0..nr_queues).map(|_| PaddedCounter::default()).collect());
    let fd = fuse_fd.as_raw_fd();

    let (tx, rx) = mpsc::channel::<(usize, io::Result<Arc<Queue>>)>();
    let mut threads = Vec::with_capacity(nr_queues);
    let mut failure = None;
    for qid in 0..nr_queues {
        let tx = tx.clone();
        let handler = Arc::clone(&handler);
        let counts = counts.clone();
        let spawned = thread::Builder::new()
            .name(format!("safs-uring-{qid}"))
            .spawn(move || {
                // `fd` is used only before the report: `start` waits for it,
                // so the borrowed fd is still open.
                // `tx` goes right after the report: `start` reads reports
                // until every sender is gone.
                match QueueThread::setup(qid, fd, depth, payload_size, handler, counts, yield_cpu) {
                    Ok(t) => {
                        let _ = tx.send((qid, Ok(Arc::clone(&t.queue))));
                        drop(tx);
                        t.run()
                    }
                    Err((e, t)) => {
                        let _ = tx.send((qid, Err(e)));
                        drop(tx);
                        t.map_or(Retained(None), |t| t.finish())
                    }
                }
            });
        match spawned {
            Ok(h) => threads.push(h),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    drop(tx);

    let mut queues: Vec<Option<Arc<Queue>>> = (0..nr_queues).map(|_| None).collect();
    for (qid, r) in rx.iter() {
        match r {
            Ok(q) => queues[qid] = Some(q),
            Err(e) => {
                tracing::error!(qid, error = %e, "io_uring queue setup failed");
                failure.get_or_insert(e);
            }
        }
    }

    if let Some(e) = failure {
        for q in queues.iter().flatten() {
            q.request_stop();
        }
        drop(queues);
        for t in threads {
            if let Ok(r) = t.join() {
                r.release();
            }
        }
        give_up_rings(fuse_fd);
        return Err(e);
    }
    let queues: Vec<Arc<Queue>> = queues.into_iter().flatten().collect();
    tracing::debug!(
        queues = nr_queues,
        depth,
        payload_size,
        "FUSE over io_uring started"
    );
    Ok(Queues {
        threads,
        queues,
        counts,
    })
}

impl Queues {
    /// Requests served so far, per queue (`safs info --stats` reads them
    /// through [`counters`](Self::counters)).
    #[cfg(test)]
    pub(super) fn counts(&self) -> Vec<u64> {
        self.counts.counts()
    }

    /// A handle to the counters that outlives `join`.
    pub(super) fn counters(&self) -> QueueCounts {
        self.counts.clone()
    }

    /// Stops the queue threads without waiting for the connection to end
    /// (their rings close, which cancels the entries waiting in the
    /// kernel). Requests the kernel sends to the rings afterwards wait
    /// until the connection is aborted or unmounted. The daemon ends its
    /// queues by ending the connection; tests stop them on a live one.
    #[cfg(test)]
    pub(super) fn shutdown(&self) {
        for q in &self.queues {
            q.request_stop();
        }
    }

    /// Waits for every queue thread to end (they end when the connection
    /// ends, or after [`shutdown`](Self::shutdown)).
    pub(super) fn join(self) {
        drop(self.queues);
        for (qid, t) in self.threads.into_iter().enumerate() {
            match t.join() {
                Ok(r) => r.release(),
                Err(_) => tracing::error!(qid, "io_uring queue thread panicked"),
            }
        }
    }
}

/// Where the reply to one request that came over io_uring goes.
pub struct Slot {
    /// `None` once sent.
    queue: Option<Arc<Queue>>,
    idx: u16,
    unique: u64,
    opcode: u32,
}

impl Slot {
    /// Writes the reply (`error`: 0 or a negative errno) into the ring
    /// entry and hands the entry back to the kernel (from the queue thread:
    /// once the handler returns; from any other thread: through the queue
    /// thread, which it wakes).
    pub(super) fn send(mut self, unique: u64, error: i32, body: &[&[u8]]) {
        if let Some(q) = self.queue.take() {
            q.complete(self.idx, unique, error, body);
        }
    }

    /// Whether a reply body of `len` bytes can be written in place, into
    /// the entry's payload buffer: it is large enough, and the handler
    /// does not read the request's own payload from it.
    pub(super) fn can_place(&self, len: usize) -> bool {
        self.queue
            .as_ref()
            .is_some_and(|q| q.payload_free(self.idx as usize, len))
    }

    /// The first `len` bytes of the entry's payload buffer, for a body
    /// written in place (`can_place(len)` must have said so).
    pub(super) fn placed(&mut self, len: usize) -> &mut [u8] {
        let q = self.queue.as_ref().expect("a slot not sent yet");
        assert!(q.payload_free(self.idx as usize, len));
        // SAFETY: inside the entry's payload buffer (`payload_free` checks
        // `len`), which is out of the kernel until this slot sends; the
        // slot is the entry's only reply and borrowed mutably here, and the
        // handler holds none of that buffer (`payload_free`).
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(q.payload_at(self.idx as usize), len)
        }
    }

    /// Sends the reply whose first `len` body bytes were written in place
    /// (see [`Slot::placed`]).
    pub(super) fn send_placed(mut self, unique: u64, len: usize) {
        if let Some(q) = self.queue.take() {
            q.complete_placed(self.idx, unique, len);
        }
    }
}

impl Drop for Slot {
    /// No reply (`Reply::none`): the entry still has to be committed to be
    /// fetched again. For a request that expects no reply (only
    /// NOTIFY_REPLY comes over the rings) that is an empty success, as
    /// libfuse's `fuse_reply_none` does; any other request is answered EIO.
    fn drop(&mut self) {
        if let Some(q) = self.queue.take() {
            let error = if NO_REPLY_OPCODES.contains(&self.opcode) {
                0
            } else {
                tracing::error!(
                    unique = self.unique,
                    opcode = self.opcode,
                    "no reply to a request that expects one; answering EIO"
                );
                -libc::EIO
            };
            q.complete(self.idx, self.unique, error, &[]);
        }
    }
}

// ---- one queue: what its thread and its slots share ----

/// Memory the kernel reads and writes through user pointers.
struct RawBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: a plain allocation; who may access which bytes when is ruled by
// the entry states (see the module documentation), not by the owner.
#[allow(unsafe_code)]
unsafe impl Send for RawBuf {}
// SAFETY: as for `Send`.
#[allow(unsafe_code)]
unsafe impl Sync for RawBuf {}

impl RawBuf {
    /// `len` zeroed, page-aligned bytes.
    #[allow(unsafe_code)]
    fn zeroed(len: usize) -> io::Result<RawBuf> {
        let layout = Layout::from_size_align(len.max(1), PAGE)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the layout's size is not zero.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        NonNull::new(ptr)
            .map(|ptr| RawBuf { ptr, layout })
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))
    }

    /// The address of byte `off`.
    fn at(&self, off: usize) -> *mut u8 {
        assert!(off <= self.layout.size(), "offset {off} out of the buffer");
        self.ptr.as_ptr().wrapping_add(off)
    }
}

impl Drop for RawBuf {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: allocated by `zeroed` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A reply written by the queue thread (its sender could not write the
/// entry's buffers yet).
struct Staged {
    unique: u64,
    error: i32,
    body: Vec<u8>,
}

/// A replied entry, ready to be committed.
struct Done {
    idx: u16,
    staged: Option<Box<Staged>>,
}

/// What the queue thread and the slots of one entry share.
#[derive(Default)]
struct EntryShared {
    /// The handler is running with this entry's request.
    in_handle: AtomicBool,
    /// The length of the payload the handler was given.
    req_len: AtomicU32,
}

/// One queue's buffers and mailbox; lives as long as its thread or a slot.
struct Queue {
    qid: u16,
    /// Each entry's payload buffer size (the iovec's length).
    payload_size: usize,
    /// `depth` headers, `HEADER_STRIDE` apart.
    headers: RawBuf,
    /// `depth` payload buffers, `payload_size` apart.
    payloads: RawBuf,
    /// Each entry's two iovecs (REGISTER points the kernel at them).
    iovecs: Box<[[Iov; 2]]>,
    entries: Box<[EntryShared]>,
    /// Entries replied from other threads.
    inbox: Mutex<Vec<Done>>,
    /// The eventfd written since the queue thread last drained the inbox.
    wake_pending: AtomicBool,
    stop: AtomicBool,
    /// Wakes the queue thread (a poll on it is armed in the ring).
    eventfd: File,
}

thread_local! {
    /// The queue this thread serves (its address; 0: none).
    static SERVING: Cell<usize> = const { Cell::new(0) };
    /// Requests fetched with the one being served and not served yet.
    static WAITING: Cell<usize> = const { Cell::new(0) };
    /// Entries replied on the queue thread, committed after `handle`.
    static LOCAL_DONE: RefCell<Vec<Done>> = const { RefCell::new(Vec::new()) };
}

impl Queue {
    fn new(qid: u16, depth: usize, payload_size: usize) -> io::Result<Queue> {
        let headers = RawBuf::zeroed(depth * HEADER_STRIDE)?;
        let payloads = RawBuf::zeroed(depth * payload_size)?;
        let iovecs = (0..depth)
            .map(|i| {
                [
                    Iov {
                        base: headers.at(i * HEADER_STRIDE) as usize,
                        len: HEADER_STRIDE,
                    },
                    Iov {
                        base: payloads.at(i * payload_size) as usize,
                        len: payload_size,
                    },
                ]
            })
            .collect();
        Ok(Queue {
            qid,
            payload_size,
            headers,
            payloads,
            iovecs,
            entries: (0..depth).map(|_| EntryShared::default()).collect(),
            inbox: Mutex::new(Vec::new()),
            wake_pending: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            eventfd: eventfd()?,
        })
    }

    fn id(&self) -> usize {
        self as *const Queue as usize
    }

    /// Wakes the queue thread.
    fn wake(&self) {
        if !self.wake_pending.swap(true, Ordering::AcqRel)
            && let Err(e) = (&self.eventfd).write(&1u64.to_ne_bytes())
        {
            tracing::error!(qid = self.qid, error = %e, "waking an io_uring queue");
        }
    }

    fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake_pending.store(false, Ordering::Release);
        self.wake();
    }

    /// The reply to entry `idx`'s request: written now if nobody reads the
    /// bytes it covers, else staged; then queued for the commit.
    fn complete(&self, idx: u16, unique: u64, mut error: i32, mut body: &[&[u8]]) {
        let mut len: usize = body.iter().map(|b| b.len()).sum();
        if error == 0 && len > self.payload_size {
            tracing::error!(
                unique,
                len,
                max = self.payload_size,
                "reply larger than the ring's payload buffer; answering EIO"
            );
            error = -libc::EIO;
        }
        if error != 0 {
            body = &[];
            len = 0;
        }
        let free = len == 0 || self.payload_free(idx as usize, len);
        let staged = if free {
            // SAFETY: the entry is out of the kernel until this `Done` is
            // committed, no other reply exists for it, and the bytes written
            // are not borrowed (see `free`).
            #[allow(unsafe_code)]
            unsafe {
                self.write_reply(idx as usize, unique, error, body)
            };
            None
        } else {
            Some(Box::new(Staged {
                unique,
                error,
                body: body.concat(),
            }))
        };
        self.queue_done(Done { idx, staged });
    }

    /// Whether entry `idx`'s payload buffer may take a reply body of `len`
    /// bytes now.
    fn payload_free(&self, idx: usize, len: usize) -> bool {
        let ent = &self.entries[idx];
        // The handler holds the request's payload (and nothing else the
        // reply writes: it got a copy of the header) until it returns.
        len <= self.payload_size
            && (!ent.in_handle.load(Ordering::Acquire) || ent.req_len.load(Ordering::Relaxed) == 0)
    }

    /// The start of entry `idx`'s payload buffer (`payload_size` bytes,
    /// allocated zeroed, so initialized).
    fn payload_at(&self, idx: usize) -> *mut u8 {
        self.payloads.at(idx * self.payload_size)
    }

    /// A success whose first `len` body bytes are in entry `idx`'s payload
    /// buffer already: its header, then queued for the commit.
    fn complete_placed(&self, idx: u16, unique: u64, len: usize) {
        // SAFETY: the entry is out of the kernel until this `Done` is
        // committed, and its only reply (the slot, consumed) wrote the body.
        #[allow(unsafe_code)]
        unsafe {
            self.write_header(idx as usize, unique, 0, len)
        };
        self.queue_done(Done { idx, staged: None });
    }

    /// Queues replied entry `done` for the commit.
    fn queue_done(&self, done: Done) {
        let mut done = Some(done);
        // On the queue thread: committed after the handler returns, with no
        // wakeup. (`SERVING` is cleared before the loop ends.)
        if SERVING.try_with(Cell::get).unwrap_or(0) == self.id()
            && LOCAL_DONE
                .try_with(|l| l.borrow_mut().extend(done.take()))
                .is_ok()
        {
            return;
        }
        if let Some(done) = done {
            self.inbox.lock().push(done);
            self.wake();
        }
    }

    /// Writes a reply into entry `idx`: out header, body, `payload_sz`.
    ///
    /// # Safety
    /// The entry must be out of the kernel (its request completed, its
    /// commit not yet submitted), this must be its only reply, and no
    /// reference into its out header or into the first `body` bytes of its
    /// payload buffer may be alive.
    #[allow(unsafe_code)]
    unsafe fn write_reply(&self, idx: usize, unique: u64, error: i32, body: &[&[u8]]) {
        let len: usize = body.iter().map(|b| b.len()).sum();
        assert!(len <= self.payload_size);
        let payload = self.payload_at(idx);
        // SAFETY: inside entry `idx`'s payload buffer (`len <=
        // payload_size`), which the caller owns now; then its header.
        unsafe {
            let mut at = 0;
            for part in body {
                std::ptr::copy_nonoverlapping(part.as_ptr(), payload.add(at), part.len());
                at += part.len();
            }
            self.write_header(idx, unique, error, len);
        }
    }

    /// Writes entry `idx`'s out header and `payload_sz` for a body of
    /// `len` bytes.
    ///
    /// # Safety
    /// As for [`Queue::write_reply`].
    #[allow(unsafe_code)]
    unsafe fn write_header(&self, idx: usize, unique: u64, error: i32, len: usize) {
        assert!(len <= self.payload_size);
        let mut out = [0u8; OUT_HEADER_LEN];
        out[0..4].copy_from_slice(&((OUT_HEADER_LEN + len) as u32).to_ne_bytes());
        out[4..8].copy_from_slice(&error.to_ne_bytes());
        out[8..16].copy_from_slice(&unique.to_ne_bytes());
        let header = self.headers.at(idx * HEADER_STRIDE);
        // SAFETY: inside entry `idx`'s header (288 bytes), which the
        // caller owns now.
        unsafe {
            std::ptr::copy_nonoverlapping(out.as_ptr(), header, OUT_HEADER_LEN);
            let sz = (len as u32).to_ne_bytes();
            std::ptr::copy_nonoverlapping(
                sz.as_ptr(),
                header.add(ENT_IN_OUT_OFFSET + ENT_PAYLOAD_SZ),
                sz.len(),
            );
        }
    }

    /// Copies bytes `off..off + dst.len()` of entry `idx`'s header.
    ///
    /// # Safety
    /// The entry must be out of the kernel.
    #[allow(unsafe_code)]
    unsafe fn read_header(&self, idx: usize, off: usize, dst: &mut [u8]) {
        assert!(off + dst.len() <= REQ_HEADER_LEN);
        // SAFETY: inside the entry's header, which the kernel does not
        // write while the entry is out of it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.headers.at(idx * HEADER_STRIDE + off),
                dst.as_mut_ptr(),
                dst.len(),
            )
        }
    }

    /// Entry `idx`'s `op_in` area and the first `len` bytes of its payload.
    ///
    /// # Safety
    /// The entry must be out of the kernel, and stay so while the slices
    /// live; nothing may write them meanwhile (a reply checks
    /// `in_handle`/`req_len` before writing the payload).
    #[allow(unsafe_code)]
    unsafe fn request(&self, idx: usize, len: usize) -> (&[u8], &[u8]) {
        assert!(len <= self.payload_size);
        // SAFETY: both ranges lie in entry `idx`'s buffers; the caller
        // guarantees nobody writes them while they are borrowed.
        unsafe {
            (
                std::slice::from_raw_parts(
                    self.headers.at(idx * HEADER_STRIDE + OP_IN_OFFSET),
                    OP_IN_LEN,
                ),
                std::slice::from_raw_parts(self.payloads.at(idx * self.payload_size), len),
            )
        }
    }
}

// ---- the queue thread ----

/// Where an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ent {
    /// Its command (REGISTER or COMMIT_AND_FETCH) is in the kernel.
    Kernel(u32),
    /// Its request is with the handler, or its reply not yet committed.
    User,
    /// Its command failed for good.
    Dead,
}

struct QueueThread {
    queue: Arc<Queue>,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    handler: Arc<dyn Handler>,
    counts: QueueCounts,
    ents: Vec<Ent>,
    commit_ids: Vec<u64>,
    /// A command failed because the connection ended.
    disconnected: bool,
    /// Completions not yet handled: `(user_data, result)`.
    cqes: Vec<(u64, i32)>,
    /// Replied entries being committed.
    done: Vec<Done>,
    /// Each entry's last request's opcode (for the size of its reply).
    opcodes: Vec<u32>,
    /// A reply committed next may be large.
    large_reply: bool,
}

impl QueueThread {
    /// Pins the thread, builds the queue and its ring, and registers every
    /// entry. On error, the thread to `finish` if the ring exists.
    fn setup(
        qid: usize,
        fuse_fd: RawFd,
        depth: usize,
        payload_size: usize,
        handler: Arc<dyn Handler>,
        counts: QueueCounts,
        yield_cpu: bool,
    ) -> Result<QueueThread, (io::Error, Option<Box<QueueThread>>)> {
        if let Err(e) = pin_to_cpu(qid) {
            tracing::debug!(qid, error = %e, "io_uring queue thread not pinned");
        }
        yielding::start(yield_cpu);
        let queue = Queue::new(qid as u16, depth, payload_size).map_err(|e| (e, None))?;
        let entries = (depth + 1).next_power_of_two() as u32;
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_cqsize(2 * entries)
            .setup_submit_all()
            .build(entries)
            .map_err(|e| (e, None))?;
        ring.submitter()
            .register_files(&[fuse_fd])
            .map_err(|e| (e, None))?;
        let mut t = QueueThread {
            queue: Arc::new(queue),
            ring,
            handler,
            counts,
            ents: vec![Ent::Kernel(CMD_REGISTER); depth],
            commit_ids: vec![0; depth],
            disconnected: false,
            cqes: Vec::with_capacity(2 * entries as usize),
            done: Vec::with_capacity(depth),
            opcodes: vec![0; depth],
            large_reply: false,
        };
        t.arm_poll();
        for idx in 0..depth {
            let e = t.register_sqe(idx);
            t.push(&e);
        }
        if let Err(e) = t.ring.submit() {
            return Err((e, Some(Box::new(t))));
        }
        // A refused REGISTER completes at once (a good one only when a
        // request comes).
        t.reap();
        let mut refused = None;
        let ents = &mut t.ents;
        t.cqes.retain(|&(ud, res)| {
            let fatal = ud != WAKE && res < 0 && res != -libc::EAGAIN && res != -libc::EINTR;
            if fatal {
                ents[ud as usize] = Ent::Dead;
                refused.get_or_insert(res);
            }
            !fatal
        });
        if let Some(res) = refused {
            let e = io::Error::from_raw_os_error(-res);
            return Err((
                io::Error::new(e.kind(), format!("io_uring REGISTER refused: {e}")),
                Some(Box::new(t)),
            ));
        }
        Ok(t)
    }

    fn run(mut self) -> Retained {
        SERVING.set(self.queue.id());
        loop {
            let cqes = std::mem::take(&mut self.cqes);
            for (i, &(ud, res)) in cqes.iter().enumerate() {
                WAITING.set(cqes.len() - 1 - i);
                self.on_cqe(ud, res);
            }
            WAITING.set(0);
            self.cqes = cqes;
            self.cqes.clear();
            self.commit_replies();

            if self.queue.stop.load(Ordering::Acquire) {
                break;
            }
            let in_kernel = self
                .ents
                .iter()
                .filter(|e| matches!(e, Ent::Kernel(_)))
                .count();
            let in_user = self.ents.iter().filter(|e| **e == Ent::User).count();
            if in_kernel == 0 && (self.disconnected || in_user == 0) {
                if !self.disconnected {
                    tracing::error!(qid = self.queue.qid, "every io_uring entry failed");
                }
                break;
            }
            // A reply made off this thread (a pooled READ, an fsync) wakes
            // it through the eventfd: not as `SCHED_IDLE` behind a busy
            // task.
            let owed = in_user > 0;
            yielding::before_wait(std::mem::take(&mut self.large_reply) || owed);
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => {}
                Err(e) => {
                    tracing::error!(qid = self.queue.qid, error = %e, "io_uring_enter failed");
                    break;
                }
            }
            self.reap();
        }
        SERVING.set(0);
        self.finish()
    }

    /// Closes the ring. With entries still in the kernel, the queue (their
    /// buffers) is handed out of the thread to be freed only once the
    /// thread has been joined: until the kernel has cancelled the ring's
    /// commands, which it does asynchronously after the close, it may still
    /// write a request into them (from this thread's context: a thread's
    /// exit cancels its io_uring requests before it can be joined).
    fn finish(self) -> Retained {
        let in_kernel = self
            .ents
            .iter()
            .filter(|e| matches!(e, Ent::Kernel(_)))
            .count();
        let QueueThread { queue, ring, .. } = self;
        drop(ring);
        tracing::debug!(qid = queue.qid, in_kernel, "io_uring queue thread ends");
        Retained((in_kernel > 0).then_some(queue))
    }

    /// Moves the completions out of the ring.
    fn reap(&mut self) {
        self.cqes
            .extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
    }

    fn on_cqe(&mut self, ud: u64, res: i32) {
        let qid = self.queue.qid;
        if ud == WAKE {
            if res < 0 && res != -libc::ECANCELED {
                tracing::warn!(qid, error = res, "io_uring eventfd poll failed");
            }
            let mut counter = [0u8; 8];
            let _ = (&self.queue.eventfd).read(&mut counter);
            self.queue.wake_pending.store(false, Ordering::Release);
            let mut inbox = self.queue.inbox.lock();
            self.done.append(&mut inbox);
            drop(inbox);
            if !self.queue.stop.load(Ordering::Acquire) {
                self.arm_poll();
            }
            return;
        }
        let idx = ud as usize;
        let Some(&Ent::Kernel(cmd)) = self.ents.get(idx) else {
            tracing::error!(
                qid,
                idx,
                res,
                "completion for an io_uring entry not in the kernel"
            );
            return;
        };
        match res {
            0 => {
                self.ents[idx] = Ent::User;
                self.serve(idx);
            }
            _ if res == -libc::EAGAIN || res == -libc::EINTR => {
                // REGISTER before the kernel saw the INIT reply, or an
                // interrupted command: send it again.
                if cmd == CMD_REGISTER {
                    thread::sleep(Duration::from_millis(1));
                }
                let e = if cmd == CMD_REGISTER {
                    self.register_sqe(idx)
                } else {
                    self.commit_sqe(idx)
                };
                self.push(&e);
            }
            _ if [
                libc::ENOTCONN,
                libc::ECONNABORTED,
                libc::ECANCELED,
                libc::ENODEV,
            ]
            .contains(&-res) =>
            {
                self.ents[idx] = Ent::Dead;
                if !self.disconnected {
                    tracing::debug!(
                        qid,
                        error = res,
                        "FUSE connection ended; io_uring queue stops"
                    );
                }
                self.disconnected = true;
            }
            _ => {
                self.ents[idx] = Ent::Dead;
                tracing::error!(qid, idx, cmd, error = res, "io_uring entry failed");
            }
        }
    }

    /// Hands entry `idx`'s request to the handler.
    #[allow(unsafe_code)]
    fn serve(&mut self, idx: usize) {
        let arrived = super::trace::arrived();
        let q = Arc::clone(&self.queue);
        let mut header = [0u8; IN_HEADER_LEN];
        let mut ent_in_out = [0u8; 32];
        // SAFETY: the entry's command completed: it is out of the kernel.
        unsafe {
            q.read_header(idx, 0, &mut header);
            q.read_header(idx, ENT_IN_OUT_OFFSET, &mut ent_in_out);
        }
        let u64_at = |b: &[u8], at: usize| u64::from_ne_bytes(b[at..at + 8].try_into().unwrap());
        let u32_at = |b: &[u8], at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().unwrap());
        let opcode = u32_at(&header, 4);
        let unique = u64_at(&header, 8);
        let commit_id = u64_at(&ent_in_out, ENT_COMMIT_ID);
        let mut len = u32_at(&ent_in_out, ENT_PAYLOAD_SZ) as usize;
        if commit_id == 0 {
            // The kernel could not match a commit to it: nothing to answer.
            tracing::error!(
                qid = q.qid,
                idx,
                opcode,
                "io_uring request without commit id"
            );
            self.ents[idx] = Ent::Dead;
            return;
        }
        if len > q.payload_size {
            tracing::error!(qid = q.qid, len, "io_uring payload size beyond the buffer");
            len = q.payload_size;
        }
        self.commit_ids[idx] = commit_id;
        self.opcodes[idx] = opcode;
        yielding::before_request(opcode, len);
        let counts = &self.counts.0[q.qid as usize];
        counts.served.fetch_add(1, Ordering::Relaxed);
        if yielding::caller_moved(u32_at(&header, 32), q.qid) {
            counts.moved.fetch_add(1, Ordering::Relaxed);
        }

        let ent = &q.entries[idx];
        ent.req_len.store(len as u32, Ordering::Relaxed);
        ent.in_handle.store(true, Ordering::Relaxed);
        // SAFETY: the entry is out of the kernel until its reply is
        // committed, which happens in this thread after `handle` returns;
        // replies sent meanwhile stage their body instead of writing the
        // payload (`in_handle`), and never write `op_in`.
        let (op_in, payload) = unsafe { q.request(idx, len) };
        let slot = Slot {
            queue: Some(Arc::clone(&q)),
            idx: idx as u16,
            unique,
            opcode,
        };
        let req = RawRequest {
            header: &header,
            op_in: Some(op_in),
            payload,
        };
        let handler = &self.handler;
        // A handler bug fails one request (its dropped reply answers EIO),
        // not the queue.
        if catch_unwind(AssertUnwindSafe(|| {
            handler.handle(req, Reply::from_uring(unique, opcode, arrived, slot))
        }))
        .is_err()
        {
            tracing::error!(unique, opcode, "FUSE handler panicked");
        }
        ent.in_handle.store(false, Ordering::Release);
    }

    /// Commits every replied entry (replies staged in handlers written
    /// first).
    #[allow(unsafe_code)]
    fn commit_replies(&mut self) {
        let _ = LOCAL_DONE.try_with(|l| self.done.append(&mut l.borrow_mut()));
        if self.queue.wake_pending.load(Ordering::Acquire) {
            // Replies whose wakeup has not been seen yet.
            let mut inbox = self.queue.inbox.lock();
            self.done.append(&mut inbox);
        }
        let mut done = std::mem::take(&mut self.done);
        for d in done.drain(..) {
            let idx = d.idx as usize;
            if self.ents[idx] != Ent::User {
                tracing::error!(qid = self.queue.qid, idx, state = ?self.ents[idx], "reply for an entry not in userspace");
                continue;
            }
            if let Some(s) = d.staged {
                // SAFETY: the entry is out of the kernel (state `User`), its
                // handler has returned (we are in the loop), and this is its
                // only reply.
                unsafe { self.queue.write_reply(idx, s.unique, s.error, &[&s.body]) };
            }
            self.large_reply |= yielding::large_reply(self.opcodes[idx]);
            let e = self.commit_sqe(idx);
            self.push(&e);
            self.ents[idx] = Ent::Kernel(CMD_COMMIT_AND_FETCH);
        }
        self.done = done;
    }

    fn register_sqe(&self, idx: usize) -> squeue::Entry128 {
        let mut cmd = [0u8; 80];
        cmd[CMD_QID..CMD_QID + 2].copy_from_slice(&self.queue.qid.to_ne_bytes());
        let sqe = opcode::UringCmd80::new(types::Fixed(0), CMD_REGISTER)
            .cmd(cmd)
            .addr(Some(self.queue.iovecs[idx].as_ptr() as u64))
            .build()
            .user_data(idx as u64);
        with_len(sqe, 2)
    }

    fn commit_sqe(&self, idx: usize) -> squeue::Entry128 {
        let mut cmd = [0u8; 80];
        cmd[CMD_COMMIT_ID..CMD_COMMIT_ID + 8].copy_from_slice(&self.commit_ids[idx].to_ne_bytes());
        cmd[CMD_QID..CMD_QID + 2].copy_from_slice(&self.queue.qid.to_ne_bytes());
        opcode::UringCmd80::new(types::Fixed(0), CMD_COMMIT_AND_FETCH)
            .cmd(cmd)
            .build()
            .user_data(idx as u64)
    }

    fn arm_poll(&mut self) {
        let sqe = opcode::PollAdd::new(
            types::Fd(self.queue.eventfd.as_raw_fd()),
            libc::POLLIN as u32,
        )
        .build()
        .user_data(WAKE);
        self.push(&sqe.into());
    }

    /// Queues an SQE (submitting first if the SQ is full).
    #[allow(unsafe_code)]
    fn push(&mut self, sqe: &squeue::Entry128) {
        loop {
            // SAFETY: the SQE points at the queue's iovecs and buffers and
            // its eventfd (and the registered /dev/fuse file): `self.queue`
            // owns them, and `finish` drops the ring before it — or keeps
            // them for good while commands are in the kernel.
            if unsafe { self.ring.submission().push(sqe) }.is_ok() {
                return;
            }
            if let Err(e) = self.ring.submit() {
                tracing::error!(qid = self.queue.qid, error = %e, "io_uring submit failed");
                thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// A queue whose buffers the kernel may still write until its thread is
/// joined: freed by [`release`](Retained::release) after the join, never
/// otherwise (dropped unjoined, it is leaked).
struct Retained(Option<Arc<Queue>>);

impl Retained {
    /// Frees the queue (if no slot holds it); call after joining the
    /// thread that returned it.
    fn release(mut self) {
        self.0.take();
    }
}

impl Drop for Retained {
    fn drop(&mut self) {
        if let Some(q) = self.0.take() {
            tracing::debug!(
                qid = q.qid,
                "io_uring queue buffers kept: thread not joined"
            );
            std::mem::forget(q);
        }
    }
}

/// Sets the iovec count of a URING_CMD SQE (the crate's `UringCmd80` has no
/// setter for `len`, which REGISTER needs).
#[allow(unsafe_code)]
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: `Entry128` is `#[repr(C)]`: the kernel's 64-byte
    // `io_uring_sqe` then 64 bytes of command; it is built from a zeroed
    // SQE, so every byte is initialised, and any byte pattern is a valid SQE
    // value for the round trip.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[SQE_LEN_OFFSET..SQE_LEN_OFFSET + 4].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

/// After a failed start: a REGISTER the kernel refuses (a header buffer too
/// small) turns the rings off for the connection and wakes the requests
/// waiting for them, which `/dev/fuse` then serves.
fn give_up_rings(fuse_fd: BorrowedFd<'_>) {
    let iov = [Iov { base: 0, len: 0 }; 2];
    let result = (|| -> io::Result<i32> {
        let mut ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2)?;
        let sqe = with_len(
            opcode::UringCmd80::new(types::Fd(fuse_fd.as_raw_fd()), CMD_REGISTER)
                .addr(Some(iov.as_ptr() as u64))
                .build(),
            2,
        );
        push_once(&mut ring, &sqe)?;
        ring.submit_and_wait(1)?;
        let res = ring.completion().next().map_or(0, |c| c.result());
        Ok(res)
    })();
    match result {
        Ok(res) if res < 0 => tracing::debug!(error = res, "FUSE over io_uring turned off"),
        Ok(res) => tracing::error!(res, "turning FUSE over io_uring off: REGISTER accepted"),
        Err(e) => tracing::error!(error = %e, "turning FUSE over io_uring off"),
    }
}

#[allow(unsafe_code)]
fn push_once(
    ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
    sqe: &squeue::Entry128,
) -> io::Result<()> {
    // SAFETY: only used by `give_up_rings`, which waits for the completion
    // while the iovecs the SQE points at are alive (the kernel refuses the
    // header before storing any pointer).
    unsafe { ring.submission().push(sqe) }.map_err(|_| io::Error::other("io_uring SQ full"))
}

/// A non-blocking, close-on-exec eventfd.
#[allow(unsafe_code)]
fn eventfd() -> io::Result<File> {
    // SAFETY: no pointers; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor nothing else owns.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Whether, on an io_uring queue thread, other requests arrived with the
/// one being served and wait for this thread (a handler may then hand slow
/// work to other threads rather than keep them waiting).
pub fn requests_waiting() -> bool {
    WAITING.try_with(Cell::get).unwrap_or(0) > 0
}

/// Binds the calling thread to `cpu`.
#[allow(unsafe_code)]
fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    // SAFETY: `cpu_set_t` is a plain bit array; zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= 8 * size_of::<libc::cpu_set_t>() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: `cpu` is within the set (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid `cpu_set_t` of the size passed.
    let r = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The kernel's `num_possible_cpus()`: the number of queues it expects.
fn possible_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| count_cpu_list(&s))
        .unwrap_or_else(|| thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The number of CPUs in a list like `0-3,6,8-9`.
fn count_cpu_list(s: &str) -> Option<usize> {
    let mut n = 0;
    for part in s.trim().split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let a = part.parse::<usize>().ok()?;
                (a, a)
            }
        };
        n += b.checked_sub(a)? + 1;
    }
    (n > 0).then_some(n)
}

#[cfg(test)]
mod tests {
    //! The SQE layout, and real mounts served over the rings by a test-only
    //! session (mount(2), INIT answered by hand) and a handler built on
    //! hand-made structures.

    use std::fs::OpenOptions;
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex as StdMutex;
    use std::time::Instant;

    use nix::mount::{MntFlags, MsFlags};

    use super::super::test_wire::*;
    use super::*;

    const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";
    const PAYLOAD: usize = 128 * 1024;
    const DEPTH: usize = 2;
    const TIMEOUT: Duration = Duration::from_secs(10);

    fn sqe_bytes(sqe: squeue::Entry128) -> [u8; 128] {
        #[allow(unsafe_code)]
        // SAFETY: as in `with_len`.
        unsafe {
            std::mem::transmute(sqe)
        }
    }

    #[test]
    fn sqes_carry_the_commands_where_the_kernel_reads_them() {
        let queue = Arc::new(Queue::new(1, 2, PAYLOAD).unwrap());
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .build(4)
            .unwrap();
        let t = QueueThread {
            queue: Arc::clone(&queue),
            ring,
            handler: Arc::new(TestFs::default()),
            counts: QueueCounts(Arc::new([
                PaddedCounter::default(),
                PaddedCounter::default(),
            ])),
            ents: vec![Ent::Dead; 2],
            commit_ids: vec![0, 0xdead_beef_0042],
            disconnected: false,
            cqes: Vec::new(),
            done: Vec::new(),
            opcodes: vec![0; 2],
            large_reply: false,
        };

        let reg = sqe_bytes(t.register_sqe(1));
        assert_eq!(reg[0], 46, "IORING_OP_URING_CMD");
        assert_eq!(reg[1], 1, "IOSQE_FIXED_FILE");
        assert_eq!(u32_at(&reg, 4), 0, "registered file 0");
        assert_eq!(u32_at(&reg, 8), CMD_REGISTER);
        assert_eq!(u64_at(&reg, 16), queue.iovecs[1].as_ptr() as u64);
        assert_eq!(u32_at(&reg, 24), 2, "two iovecs");
        assert_eq!(u64_at(&reg, 32), 1, "user_data: the entry");
        // The command area starts at byte 48: flags, commit_id, qid.
        assert_eq!(u64_at(&reg, 48), 0);
        assert_eq!(u64_at(&reg, 56), 0);
        assert_eq!(&reg[64..66], &1u16.to_ne_bytes());
        let iov = queue.iovecs[1];
        assert_eq!(iov[0].base, queue.headers.at(HEADER_STRIDE) as usize);
        assert!(iov[0].len >= REQ_HEADER_LEN);
        assert_eq!(iov[1].base, queue.payloads.at(PAYLOAD) as usize);
        assert_eq!(iov[1].len, PAYLOAD);

        let commit = sqe_bytes(t.commit_sqe(1));
        assert_eq!(commit[0], 46);
        assert_eq!(u32_at(&commit, 8), CMD_COMMIT_AND_FETCH);
        assert_eq!(u64_at(&commit, 16), 0, "no iovecs");
        assert_eq!(u32_at(&commit, 24), 0);
        assert_eq!(u64_at(&commit, 32), 1);
        assert_eq!(u64_at(&commit, 56), 0xdead_beef_0042);
        assert_eq!(&commit[64..66], &1u16.to_ne_bytes());

        // The reply lands where the kernel's commit reads it.
        #[allow(unsafe_code)]
        // SAFETY: no command was submitted; nothing borrows the entry.
        unsafe {
            queue.write_reply(1, 77, 0, &[b"abc", b"de"]);
        }
        let mut h = [0u8; REQ_HEADER_LEN];
        #[allow(unsafe_code)]
        // SAFETY: as above.
        let (_, payload) = unsafe {
            queue.read_header(1, 0, &mut h);
            queue.request(1, 5)
        };
        assert_eq!(u32_at(&h, 0), 21);
        assert_eq!(u32_at(&h, 4), 0);
        assert_eq!(u64_at(&h, 8), 77);
        assert_eq!(u32_at(&h, ENT_IN_OUT_OFFSET + ENT_PAYLOAD_SZ), 5);
        assert_eq!(payload, b"abcde");
    }

    #[test]
    fn cpu_lists_count_like_the_kernel() {
        assert_eq!(count_cpu_list("0-1\n"), Some(2));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("0-3,6,8-9"), Some(7));
        assert_eq!(count_cpu_list(""), None);
        assert_eq!(count_cpu_list("3-1"), None);
        assert!(possible_cpus() >= 1);
    }

    // ---- hand-made replies ----

    /// `struct fuse_attr`.
    fn attr(ino: u64, mode: u32, size: u64) -> Vec<u8> {
        let mut a = Vec::with_capacity(88);
        for v in [ino, size, 0, 0, 0, 0] {
            a.extend_from_slice(&v.to_ne_bytes());
        }
        for v in [0u32, 0, 0, mode, 1, 0, 0, 0, 4096, 0] {
            a.extend_from_slice(&v.to_ne_bytes());
        }
        a
    }

    /// What each inode is: mode and size (the size tells replies apart).
    fn inode(ino: u64) -> (u32, u64) {
        match ino {
            1 => (libc::S_IFDIR | 0o755, 4242),
            2 => (libc::S_IFREG | 0o644, 777),
            _ => (libc::S_IFREG | 0o600, 3333),
        }
    }

    /// `struct fuse_attr_out`, valid for no time (every stat asks again).
    fn attr_out(ino: u64) -> Vec<u8> {
        let (mode, size) = inode(ino);
        let mut o = vec![0u8; 16];
        o.extend_from_slice(&attr(ino, mode, size));
        o
    }

    /// `struct fuse_entry_out`, valid for no time.
    fn entry_out(ino: u64) -> Vec<u8> {
        let (mode, size) = inode(ino);
        let mut o = Vec::with_capacity(128);
        o.extend_from_slice(&ino.to_ne_bytes());
        o.extend_from_slice(&[0; 32]);
        o.extend_from_slice(&attr(ino, mode, size));
        o
    }

    /// A writev-free reply on `/dev/fuse`.
    fn dev_reply(f: &File, unique: u64, error: i32, body: &[u8]) {
        let mut m = Vec::with_capacity(16 + body.len());
        m.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&error.to_ne_bytes());
        m.extend_from_slice(&unique.to_ne_bytes());
        m.extend_from_slice(body);
        let _ = (&*f).write(&m);
    }

    // ---- the handler ----

    /// `(opcode, payload, thread name, header len)` of a request.
    type Seen = (u32, Vec<u8>, String, u32);

    /// The root (1) holds `sync` (2, answered in `handle`), `deferred` (3,
    /// answered by another thread), `big` (a reply too large: EIO) and
    /// `none` (no reply: EIO).
    #[derive(Default)]
    struct TestFs {
        /// Every request.
        seen: StdMutex<Vec<Seen>>,
    }

    impl Handler for TestFs {
        fn handle(&self, req: RawRequest<'_>, reply: Reply) {
            let opcode = u32_at(req.header, 4);
            let nodeid = u64_at(req.header, 16);
            assert_eq!(req.header.len(), IN_HEADER_LEN);
            assert_eq!(u64_at(req.header, 8), reply.unique());
            assert_eq!(req.op_in.map(<[u8]>::len), Some(OP_IN_LEN));
            let name = thread::current().name().unwrap_or("").to_string();
            self.seen.lock().unwrap().push((
                opcode,
                req.payload.to_vec(),
                name,
                u32_at(req.header, 0),
            ));
            match opcode {
                OP_GETATTR => reply.send(&[&attr_out(nodeid)]),
                OP_LOOKUP => match req.payload.split(|&b| b == 0).next().unwrap_or(b"") {
                    b"sync" => reply.send(&[&entry_out(2)]),
                    b"deferred" => {
                        thread::spawn(move || {
                            thread::sleep(Duration::from_millis(5));
                            reply.send(&[&entry_out(3)]);
                        });
                    }
                    b"big" => reply.send(&[&vec![0u8; 4 * PAYLOAD]]),
                    b"none" => reply.none(),
                    _ => reply.error(libc::ENOENT),
                },
                _ => reply.error(libc::ENOSYS),
            }
        }
    }

    // ---- the session ----

    /// Serialises the tests that mount within this process.
    static SERIAL: StdMutex<()> = StdMutex::new(());

    /// `enable_uring` set to Y for a test, restored after. Holds a lock
    /// file, so that test processes running at once (other worktrees'
    /// `cargo test`) do not restore each other's value.
    struct UringParam {
        old: String,
        _lock: nix::fcntl::Flock<File>,
    }

    impl UringParam {
        /// `None` (with the reason printed) where the test cannot run.
        fn enable() -> Option<UringParam> {
            if !Path::new(PARAM).exists() {
                eprintln!("skipped: the kernel has no FUSE over io_uring ({PARAM} is missing)");
                return None;
            }
            if !nix::unistd::geteuid().is_root() {
                eprintln!("skipped: mounting needs root");
                return None;
            }
            let lock = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open("/tmp/safs-uring-tests.lock")
                .unwrap();
            let lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
                .map_err(|(_, e)| e)
                .unwrap();
            let old = std::fs::read_to_string(PARAM).unwrap().trim().to_string();
            std::fs::write(PARAM, "Y").unwrap();
            Some(UringParam { old, _lock: lock })
        }
    }

    impl Drop for UringParam {
        fn drop(&mut self) {
            let _ = std::fs::write(PARAM, &self.old);
        }
    }

    /// A mount served by hand: the test's INIT, its queues, and a
    /// `/dev/fuse` reader that records what reaches it (and answers
    /// GETATTR, for the fallback). Unmounted (forcibly: that aborts the
    /// connection) when dropped.
    struct Session {
        mnt: tempfile::TempDir,
        fuse: Arc<File>,
        mounted: bool,
        queues: Option<Queues>,
        reader: Option<JoinHandle<()>>,
        /// Opcodes read from `/dev/fuse` after INIT.
        dev_seen: Arc<StdMutex<Vec<u32>>>,
    }

    impl Session {
        /// Mounts and answers INIT with FUSE over io_uring.
        fn mount() -> Session {
            let fuse = Arc::new(
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open("/dev/fuse")
                    .unwrap(),
            );
            let mnt = tempfile::tempdir().unwrap();
            let data = format!(
                "fd={},rootmode=40000,user_id=0,group_id=0,subtype=safs-uring-test",
                fuse.as_raw_fd()
            );
            nix::mount::mount(
                Some("safs-uring-test"),
                mnt.path(),
                Some("fuse"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some(data.as_str()),
            )
            .unwrap();
            let mut s = Session {
                mnt,
                fuse,
                mounted: true,
                queues: None,
                reader: None,
                dev_seen: Arc::default(),
            };

            let mut buf = vec![0u8; 2 * PAYLOAD];
            let n = (&*s.fuse).read(&mut buf).unwrap();
            assert!(n >= IN_HEADER_LEN + 20, "INIT is {n} bytes");
            assert_eq!(u32_at(&buf, 4), OP_INIT);
            let unique = u64_at(&buf, 8);
            let flags = u32_at(&buf, IN_HEADER_LEN + 12);
            let flags2 = if flags & FUSE_INIT_EXT != 0 {
                u32_at(&buf, IN_HEADER_LEN + 16)
            } else {
                0
            };
            assert!(
                flags2 & FUSE_OVER_IO_URING_2 != 0,
                "the kernel does not offer FUSE_OVER_IO_URING (flags2 {flags2:#x})"
            );
            // struct fuse_init_out (64 bytes).
            let mut out = vec![0u8; 64];
            out[0..4].copy_from_slice(&7u32.to_ne_bytes());
            out[4..8].copy_from_slice(&45u32.to_ne_bytes());
            out[12..16].copy_from_slice(&(FUSE_INIT_EXT | FUSE_MAX_PAGES).to_ne_bytes());
            out[16..18].copy_from_slice(&16u16.to_ne_bytes());
            out[18..20].copy_from_slice(&12u16.to_ne_bytes());
            out[20..24].copy_from_slice(&(PAYLOAD as u32).to_ne_bytes());
            out[24..28].copy_from_slice(&1u32.to_ne_bytes());
            out[28..30].copy_from_slice(&((PAYLOAD / PAGE) as u16).to_ne_bytes());
            out[32..36].copy_from_slice(&FUSE_OVER_IO_URING_2.to_ne_bytes());
            dev_reply(&s.fuse, unique, 0, &out);

            let fuse = Arc::clone(&s.fuse);
            let seen = Arc::clone(&s.dev_seen);
            s.reader = Some(thread::spawn(move || {
                let mut buf = vec![0u8; 2 * PAYLOAD];
                loop {
                    let n = match (&*fuse).read(&mut buf) {
                        Ok(n) => n,
                        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => return,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                        Err(e) => panic!("reading /dev/fuse: {e}"),
                    };
                    let req = &buf[..n];
                    let opcode = u32_at(req, 4);
                    seen.lock().unwrap().push(opcode);
                    let unique = u64_at(req, 8);
                    match opcode {
                        OP_FORGET | OP_BATCH_FORGET | OP_INTERRUPT => {}
                        OP_GETATTR => dev_reply(&fuse, unique, 0, &attr_out(u64_at(req, 16))),
                        _ => dev_reply(&fuse, unique, -libc::ENOSYS, &[]),
                    }
                }
            }));
            s
        }

        fn path(&self, name: &str) -> PathBuf {
            self.mnt.path().join(name)
        }

        /// Opcodes `/dev/fuse` saw, FORGETs left out.
        fn dev_requests(&self) -> Vec<u32> {
            let seen = self.dev_seen.lock().unwrap();
            seen.iter()
                .copied()
                .filter(|&o| o != OP_FORGET && o != OP_BATCH_FORGET)
                .collect()
        }

        /// Unmounts normally and waits (bounded) for the queues and the
        /// reader to end.
        fn unmount(&mut self) {
            nix::mount::umount2(self.mnt.path(), MntFlags::empty()).unwrap();
            self.mounted = false;
            let queues = self.queues.take();
            let reader = self.reader.take();
            within(
                TIMEOUT,
                "the queues and the reader end after the unmount",
                move || {
                    if let Some(q) = queues {
                        q.join();
                    }
                    if let Some(r) = reader {
                        r.join().unwrap();
                    }
                },
            );
        }
    }

    impl Drop for Session {
        fn drop(&mut self) {
            if self.mounted {
                // MNT_FORCE aborts the connection first: stuck callers and
                // the queues end.
                let p = self.mnt.path();
                if nix::mount::umount2(p, MntFlags::MNT_FORCE).is_err() {
                    let _ = nix::mount::umount2(p, MntFlags::MNT_DETACH);
                }
            }
            if let Some(q) = self.queues.take() {
                q.shutdown();
            }
        }
    }

    /// Runs `f` on a thread; panics if it takes longer than `limit`.
    fn within<T: Send + 'static>(
        limit: Duration,
        what: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(limit)
            .unwrap_or_else(|e| panic!("{what}: {e} after {limit:?}"))
    }

    fn stat(path: PathBuf) -> io::Result<std::fs::Metadata> {
        within(TIMEOUT, &format!("stat {}", path.display()), move || {
            std::fs::metadata(path)
        })
    }

    fn start_queues(s: &mut Session, fs: &Arc<TestFs>) {
        let handler: Arc<dyn Handler> = Arc::clone(fs) as Arc<dyn Handler>;
        s.queues = Some(start(s.fuse.as_fd(), handler, DEPTH, PAYLOAD, true).unwrap());
    }

    fn served(s: &Session) -> u64 {
        s.queues.as_ref().unwrap().counts().iter().sum()
    }

    #[test]
    fn requests_are_served_over_the_rings() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let Some(_param) = UringParam::enable() else {
            return;
        };
        let mut s = Session::mount();
        let fs = Arc::new(TestFs::default());
        start_queues(&mut s, &fs);
        assert_eq!(s.queues.as_ref().unwrap().counts().len(), possible_cpus());

        let root = stat(s.mnt.path().to_path_buf()).unwrap();
        assert!(root.is_dir());
        assert_eq!((root.ino(), root.size()), (1, 4242));
        let sync = stat(s.path("sync")).unwrap();
        assert_eq!((sync.ino(), sync.size()), (2, 777));
        let missing = stat(s.path("missing")).unwrap_err();
        assert_eq!(missing.raw_os_error(), Some(libc::ENOENT));
        // A body beyond the payload buffer, and no reply at all: EIO, and
        // the entries serve again (more requests than the depth follow).
        let big = stat(s.path("big")).unwrap_err();
        assert_eq!(big.raw_os_error(), Some(libc::EIO));
        let none = stat(s.path("none")).unwrap_err();
        assert_eq!(none.raw_os_error(), Some(libc::EIO));
        for _ in 0..4 * DEPTH {
            assert_eq!(stat(s.path("sync")).unwrap().size(), 777);
        }

        let seen = fs.seen.lock().unwrap().clone();
        assert!(seen.len() >= 5 + 4 * DEPTH, "{} requests", seen.len());
        assert_eq!(served(&s), seen.len() as u64);
        assert!(
            seen.iter().all(|(_, _, t, _)| t.starts_with("safs-uring-")),
            "every request on a queue thread"
        );
        // Names come in the payload (LOOKUP has no op_in structure); the
        // header's len still counts the op_in structure (GETATTR's
        // fuse_getattr_in: 16 bytes) beside the payload.
        assert!(
            seen.iter()
                .any(|(op, p, _, _)| *op == OP_LOOKUP && p.as_slice() == b"sync\0")
        );
        for (op, p, _, len) in &seen {
            match *op {
                OP_LOOKUP => assert_eq!(*len as usize, IN_HEADER_LEN + p.len()),
                OP_GETATTR => assert_eq!(*len as usize, IN_HEADER_LEN + 16 + p.len()),
                _ => {}
            }
        }
        assert_eq!(
            s.dev_requests(),
            Vec::<u32>::new(),
            "nothing over /dev/fuse"
        );

        // FORGET goes to /dev/fuse, never to the rings.
        std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
        let start = Instant::now();
        while !s
            .dev_seen
            .lock()
            .unwrap()
            .iter()
            .any(|&o| o == OP_FORGET || o == OP_BATCH_FORGET)
        {
            assert!(start.elapsed() < TIMEOUT, "no FORGET on /dev/fuse");
            thread::sleep(Duration::from_millis(10));
        }
        assert!(
            fs.seen
                .lock()
                .unwrap()
                .iter()
                .all(|(op, _, _, _)| *op != OP_FORGET && *op != OP_BATCH_FORGET)
        );

        s.unmount();
    }

    #[test]
    fn replies_sent_later_from_other_threads_reach_the_caller() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let Some(_param) = UringParam::enable() else {
            return;
        };
        let mut s = Session::mount();
        let fs = Arc::new(TestFs::default());
        start_queues(&mut s, &fs);

        let deferred = stat(s.path("deferred")).unwrap();
        assert_eq!((deferred.ino(), deferred.size()), (3, 3333));

        // Callers on every CPU, more of them than entries: deferred and
        // immediate replies interleave on each queue.
        let callers: Vec<_> = (0..4)
            .map(|i| {
                let dir = s.mnt.path().to_path_buf();
                thread::spawn(move || {
                    for j in 0..25 {
                        let (name, size) = if (i + j) % 2 == 0 {
                            ("deferred", 3333)
                        } else {
                            ("sync", 777)
                        };
                        let m = std::fs::metadata(dir.join(name)).unwrap();
                        assert_eq!(m.size(), size);
                    }
                })
            })
            .collect();
        within(TIMEOUT, "100 mixed stats", move || {
            for c in callers {
                c.join().unwrap();
            }
        });
        assert!(served(&s) >= 101);
        assert_eq!(
            s.dev_requests(),
            Vec::<u32>::new(),
            "nothing over /dev/fuse"
        );
        s.unmount();
    }

    #[test]
    fn shutdown_ends_the_queues_while_mounted() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let Some(_param) = UringParam::enable() else {
            return;
        };
        let mut s = Session::mount();
        let fs = Arc::new(TestFs::default());
        start_queues(&mut s, &fs);
        assert_eq!(stat(s.path("sync")).unwrap().size(), 777);

        let queues = s.queues.take().unwrap();
        let counts = queues.counters();
        queues.shutdown();
        within(TIMEOUT, "queues end after shutdown", move || queues.join());
        assert!(counts.counts().iter().sum::<u64>() >= 1);
        // Dropping `s` aborts the connection (MNT_FORCE).
    }

    #[test]
    fn giving_up_the_rings_hands_requests_to_dev_fuse() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let Some(_param) = UringParam::enable() else {
            return;
        };
        // INIT enabled the rings but none is registered: requests wait
        // for them until a refused REGISTER turns them off.
        let mut s = Session::mount();
        give_up_rings(s.fuse.as_fd());
        let root = stat(s.mnt.path().to_path_buf()).unwrap();
        assert_eq!((root.ino(), root.size()), (1, 4242));
        assert!(s.dev_requests().contains(&OP_GETATTR));
        s.unmount();
    }
}
