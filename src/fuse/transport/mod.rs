//! Moving requests and replies between the kernel and the daemon: the
//! mount, `/dev/fuse`, and FUSE over io_uring. No protocol decoding beyond
//! the request header here (see `proto`).
//!
//! One request-handling path for both transports: each request reaches the
//! [`Handler`] as a [`RawRequest`] (the kernel's header, the operation's own
//! structure, the payload) with a [`Reply`] that knows its way back.

mod conn;
mod dev;
mod mount;
#[cfg(test)]
mod test_wire;
#[cfg(test)]
mod tests;
pub mod trace;
pub mod uring;
mod yielding;

pub use conn::{BackingId, Conn, Notifier};
pub use dev::{InitOutcome, ServeOptions, serve};
pub use mount::{MountOptions, Unmounter, mount};

/// Which transport serves a session, and how much each io_uring queue
/// carried: what `safs info --stats` shows.
#[derive(Default)]
pub struct Status {
    uring: std::sync::OnceLock<uring::QueueCounts>,
}

impl Status {
    fn set_uring(&self, counts: uring::QueueCounts) {
        let _ = self.uring.set(counts);
    }

    /// `None` over `/dev/fuse`; over io_uring, requests served per queue.
    pub fn uring_queues(&self) -> Option<Vec<u64>> {
        self.uring.get().map(uring::QueueCounts::counts)
    }

    /// Over io_uring, requests whose caller had moved to another CPU since
    /// its previous request.
    pub fn uring_caller_moves(&self) -> Option<u64> {
        self.uring.get().map(uring::QueueCounts::moved)
    }
}

thread_local! {
    /// Time this thread spent handing replies to `/dev/fuse` (each
    /// `writev` wakes the caller, across CPUs: microseconds that belong
    /// to the round trip, not to the handler that made the reply).
    static HANDING_BACK: std::cell::Cell<std::time::Duration> =
        const { std::cell::Cell::new(std::time::Duration::ZERO) };
}

/// How long this thread has spent handing replies back to the kernel
/// (see [`HANDING_BACK`]): a handler's timer leaves it out.
pub fn handing_back() -> std::time::Duration {
    HANDING_BACK.get()
}

/// This thread spent `d` more handing a reply back.
pub(crate) fn handed_back(d: std::time::Duration) {
    HANDING_BACK.set(HANDING_BACK.get() + d);
}

/// One request as a transport received it.
pub struct RawRequest<'a> {
    /// The `fuse_in_header` (40 bytes).
    pub header: &'a [u8],
    /// Over io_uring: the ring entry's `op_in` area (the operation's own
    /// structure, e.g. `fuse_write_in`, at its start). Over `/dev/fuse`:
    /// `None`, and that structure starts the payload.
    pub op_in: Option<&'a [u8]>,
    /// The rest: names, values, written data.
    pub payload: &'a [u8],
}

/// What serves requests (the FUSE adapter).
pub trait Handler: Send + Sync + 'static {
    /// Serves one request; `reply` may be answered later, from any thread.
    fn handle(&self, req: RawRequest<'_>, reply: Reply);
}

/// Where a request's reply goes. Dropped without an answer, it answers
/// `EIO` (a handler bug must not leave the caller hanging).
pub struct Reply {
    unique: u64,
    /// The request's opcode and arrival, for the trace (0: not traced).
    opcode: u32,
    arrived_ns: u64,
    route: Option<Route>,
}

enum Route {
    /// Written to the `/dev/fuse` file the request was read from.
    Dev(dev::DevRoute),
    Uring(uring::Slot),
}

impl Reply {
    /// A reply for a request that came over io_uring.
    /// `arrived_ns`: [`trace::arrived`] when it came.
    pub(super) fn from_uring(
        unique: u64,
        opcode: u32,
        arrived_ns: u64,
        slot: uring::Slot,
    ) -> Reply {
        Reply {
            unique,
            opcode,
            arrived_ns,
            route: Some(Route::Uring(slot)),
        }
    }

    /// A reply for a request read from `/dev/fuse`.
    fn from_dev(unique: u64, opcode: u32, arrived_ns: u64, route: dev::DevRoute) -> Reply {
        Reply {
            unique,
            opcode,
            arrived_ns,
            route: Some(Route::Dev(route)),
        }
    }

    /// The request's `unique`.
    pub fn unique(&self) -> u64 {
        self.unique
    }

    /// Success, with `body` (the reply's structures, in order).
    pub fn send(mut self, body: &[&[u8]]) {
        self.finish(0, body);
    }

    /// Failure with `errno` (positive, e.g. `libc::ENOENT`).
    pub fn error(mut self, errno: i32) {
        self.finish(-errno, &[]);
    }

    /// Room to write a body of up to `len` bytes in place, straight into
    /// the buffer the kernel takes the reply from (one copy less on the
    /// way back): over io_uring, when the ring entry's payload buffer is
    /// large enough and free; else `Err(self)`, to reply as usual.
    pub fn in_place(self, len: usize) -> Result<InPlace, Reply> {
        match &self.route {
            Some(Route::Uring(slot)) if slot.can_place(len) => Ok(InPlace { reply: self, len }),
            _ => Err(self),
        }
    }

    /// No reply (FORGET, BATCH_FORGET: the kernel expects none).
    pub fn none(mut self) {
        trace::answered(self.unique, self.opcode, self.arrived_ns);
        self.route = None;
    }

    fn finish(&mut self, error: i32, body: &[&[u8]]) {
        trace::answered(self.unique, self.opcode, self.arrived_ns);
        match self.route.take() {
            Some(Route::Dev(dev)) => {
                let start = std::time::Instant::now();
                dev.send(self.unique, error, body);
                handed_back(start.elapsed());
            }
            Some(Route::Uring(slot)) => slot.send(self.unique, error, body),
            None => {}
        }
    }
}

/// A reply whose body is written in place (see [`Reply::in_place`]).
/// Dropped unsent, it answers `EIO` as a [`Reply`] does.
pub struct InPlace {
    reply: Reply,
    len: usize,
}

impl InPlace {
    /// The body's room: `len` bytes (what they held before is undefined).
    pub fn buf(&mut self) -> &mut [u8] {
        match &mut self.reply.route {
            Some(Route::Uring(slot)) => slot.placed(self.len),
            _ => unreachable!("in place only over io_uring"),
        }
    }

    /// Success, with the first `len` bytes of [`InPlace::buf`] as the body.
    pub fn send(mut self, len: usize) {
        assert!(len <= self.len);
        let r = &mut self.reply;
        trace::answered(r.unique, r.opcode, r.arrived_ns);
        if let Some(Route::Uring(slot)) = r.route.take() {
            slot.send_placed(r.unique, len);
        }
    }

    /// Failure with `errno`.
    pub fn error(self, errno: i32) {
        self.reply.error(errno);
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if self.route.is_some() {
            tracing::error!(
                unique = self.unique,
                "request dropped without a reply; answering EIO"
            );
            self.finish(-libc::EIO, &[]);
        }
    }
}
