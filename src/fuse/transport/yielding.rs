//! How an io_uring queue thread gives its CPU back to the caller it answers.
//!
//! The kernel sends a request to the queue of the CPU its caller runs on,
//! and the caller sleeps until the queue thread commits the reply — which
//! wakes the caller while the queue thread still runs on that CPU. The
//! scheduler then places the caller on another CPU if one is idle, its next
//! request goes to that CPU's queue, and the two threads chase each other
//! across CPUs: on a VM whose idle vCPUs halt, each hop waits for a halted
//! vCPU (traced with `perf sched`: one migration per request, a getxattr
//! round trip 30–35 µs; pinned with `taskset`, 11).
//!
//! A CPU that runs only `SCHED_IDLE` tasks counts as idle when a task wakes
//! (`sched_idle_cpu()`), so a queue thread that is `SCHED_IDLE` when it
//! commits keeps its caller where it is, and the caller preempts it at once
//! — the thread has nothing left to do but wait. libfuse's `fuse_uring.c`
//! has the same idea compiled out, for the reason it must be bounded: a
//! `SCHED_IDLE` thread beside a busy normal task gets a sliver of the CPU
//! (a 1 MiB reply copied while idle took 4 ms instead of 0.3). So the
//! thread is `SCHED_IDLE` only while it waits, commits small replies, and
//! answers requests the daemon serves from memory (attributes, lookups,
//! xattrs of up to 4 KiB; a change goes to the committer). It becomes
//! `SCHED_OTHER` before any other request and before it reads the
//! metadata engine (a request that missed the caches); it commits and
//! waits as `SCHED_OTHER` for a millisecond after any other request (a
//! create, a large setxattr: they wake the committer, which would land on
//! the idle thread's CPU and run ahead of the reply) and with large replies
//! (contents, listings), and it waits as
//! `SCHED_OTHER` while a reply made on another thread (a pooled READ, an
//! fsync) is to come back through it: the wakeup that brings it must not
//! queue behind a busy task. Each switch is a syscall (~1.4 µs here), so a
//! thread switches only when the kind of work changes.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// FUSE opcodes answered from the daemon's memory with small replies
/// (their changes committed later, by the committer): LOOKUP, GETATTR,
/// ACCESS, STATFS, GETXATTR, LISTXATTR, SETXATTR, REMOVEXATTR.
const LIGHT: [u32; 8] = [1, 3, 34, 17, 22, 23, 21, 24];
/// ... with at most this much payload (names, a value).
const LIGHT_PAYLOAD: usize = 4096 + 256;
/// How long after a request other than a light one the thread stays
/// `SCHED_OTHER`: longer than the gaps within a stream of changes (tens of
/// µs), short beside a stream of reads.
const HEAVY_SPELL: Duration = Duration::from_millis(1);
/// Opcodes whose replies can be large: READ, READDIR, READDIRPLUS.
const LARGE_REPLY: [u32; 3] = [15, 28, 44];

/// A queue thread's state.
#[derive(Clone, Copy, Default)]
struct State {
    /// Switching is wanted and allowed.
    enabled: bool,
    /// `SCHED_IDLE` now.
    idle: bool,
    /// When the last request other than a light one came.
    heavy: Option<Instant>,
}

thread_local! {
    static STATE: Cell<State> = Cell::new(State::default());
}

/// Makes the calling thread a queue thread that yields (if `wanted` and
/// allowed), and has it leave `SCHED_IDLE` before it reads the metadata
/// engine: a read is no answer from memory (on PostgreSQL a network round
/// trip, whose reply must not wake it behind a busy task).
pub(super) fn start(wanted: bool) {
    let enabled = wanted && can_switch();
    STATE.set(State {
        enabled,
        ..State::default()
    });
    if enabled {
        crate::meta::before_reads_on_this_thread(leave_idle);
    }
}

/// Before handling a request with `payload` bytes of arguments.
pub(super) fn before_request(opcode: u32, payload: usize) {
    if !(LIGHT.contains(&opcode) && payload <= LIGHT_PAYLOAD) {
        leave_idle();
        STATE.set(State {
            heavy: Some(Instant::now()),
            ..STATE.get()
        });
    }
}

/// Before committing replies and waiting: idle unless `busy` (a reply is
/// large, or another thread owes one) or a request other than a light one
/// came within [`HEAVY_SPELL`] (it may have woken the committer, which
/// would land on this CPU while the thread is idle and run ahead of the
/// reply; and a stream of creates would pay two switches per file).
pub(super) fn before_wait(busy: bool) {
    let st = STATE.get();
    let busy = busy || st.heavy.is_some_and(|t| t.elapsed() < HEAVY_SPELL);
    if st.enabled && st.idle == busy {
        set(!busy);
    }
}

fn leave_idle() {
    if STATE.get().idle {
        set(false);
    }
}

fn set(idle: bool) {
    let policy = if idle {
        libc::SCHED_IDLE
    } else {
        libc::SCHED_OTHER
    };
    let st = STATE.get();
    if set_policy(policy) {
        STATE.set(State { idle, ..st });
    } else {
        // Never left idle by a refusal: stop switching.
        STATE.set(State {
            enabled: false,
            ..st
        });
        if st.idle && !idle {
            tracing::warn!("an io_uring queue thread could not leave SCHED_IDLE");
        }
    }
}

/// A reply to `opcode` may be large.
pub(super) fn large_reply(opcode: u32) -> bool {
    LARGE_REPLY.contains(&opcode)
}

/// Callers' last queues: `pid << 16 | qid + 1`, a slot per pid's low bits
/// (a collision only costs a count).
static LAST_QUEUE: [AtomicU64; 1024] = [const { AtomicU64::new(0) }; 1024];

/// Notes that caller `pid` sent a request over queue `qid` (its CPU); true
/// if its previous request came over another — the scheduler moved it
/// while it waited, which is what this module tries to prevent.
pub(super) fn caller_moved(pid: u32, qid: u16) -> bool {
    if pid == 0 {
        return false;
    }
    let now = (u64::from(pid) << 16) | (u64::from(qid) + 1);
    let before = LAST_QUEUE[pid as usize % LAST_QUEUE.len()].swap(now, Ordering::Relaxed);
    before >> 16 == u64::from(pid) && before != now
}

/// Whether this process may go back from `SCHED_IDLE` to `SCHED_OTHER`
/// (`CAP_SYS_NICE`, or `RLIMIT_NICE` allowing nice 0): tried once, on a
/// thread of its own, so a refusal strands nothing.
fn can_switch() -> bool {
    static CAN: OnceLock<bool> = OnceLock::new();
    *CAN.get_or_init(|| {
        let probe = std::thread::Builder::new()
            .name("safs-sched-probe".into())
            .spawn(|| set_policy(libc::SCHED_IDLE) && set_policy(libc::SCHED_OTHER));
        let can = probe.ok().and_then(|h| h.join().ok()).unwrap_or(false);
        if !can {
            tracing::info!(
                "io_uring queue threads keep SCHED_OTHER: this process may not leave SCHED_IDLE"
            );
        }
        can
    })
}

/// Sets the calling thread's policy (priority 0, nice unchanged).
#[allow(unsafe_code)]
fn set_policy(policy: i32) -> bool {
    let p = libc::sched_param { sched_priority: 0 };
    // SAFETY: a valid `sched_param`; pid 0 is the calling thread.
    unsafe { libc::sched_setscheduler(0, policy, &p) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(unsafe_code)]
    fn policy() -> i32 {
        // SAFETY: no arguments but the calling thread.
        unsafe { libc::sched_getscheduler(0) }
    }

    /// On a thread of its own: the policy stays with the thread.
    fn on_thread(f: impl FnOnce() + Send + 'static) {
        std::thread::spawn(f).join().expect("the checks passed");
    }

    const GETXATTR: u32 = 22;
    const CREATE: u32 = 35;
    const SETXATTR: u32 = 21;
    const READ: u32 = 15;

    #[test]
    fn a_queue_thread_is_idle_only_while_it_waits_and_answers_from_memory() {
        assert!(can_switch(), "the tests run as root");
        on_thread(|| {
            start(true);
            assert_eq!(policy(), libc::SCHED_OTHER);
            before_wait(false);
            assert_eq!(policy(), libc::SCHED_IDLE, "waiting");
            before_request(GETXATTR, 12);
            assert_eq!(policy(), libc::SCHED_IDLE, "a getxattr");
            before_request(SETXATTR, 12 + 4096);
            assert_eq!(policy(), libc::SCHED_IDLE, "a setxattr of 4 KiB");
            before_request(SETXATTR, 12 + 65536);
            assert_eq!(policy(), libc::SCHED_OTHER, "a setxattr of 64 KiB");
            before_wait(false);
            assert_eq!(policy(), libc::SCHED_OTHER, "after a setxattr of 64 KiB");
            before_request(CREATE, 12);
            assert_eq!(policy(), libc::SCHED_OTHER, "a create");
            before_wait(false);
            assert_eq!(policy(), libc::SCHED_OTHER, "after a create");
            before_request(GETXATTR, 12);
            before_wait(false);
            assert_eq!(
                policy(),
                libc::SCHED_OTHER,
                "a getxattr right after a create"
            );
            std::thread::sleep(HEAVY_SPELL);
            before_request(GETXATTR, 12);
            before_wait(false);
            assert_eq!(policy(), libc::SCHED_IDLE, "a getxattr a while after");
            before_request(READ, 0);
            assert_eq!(policy(), libc::SCHED_OTHER, "a read");
            before_wait(large_reply(READ));
            assert_eq!(policy(), libc::SCHED_OTHER, "its large reply");
            before_request(GETXATTR, 12);
            assert_eq!(policy(), libc::SCHED_OTHER, "no switch for a getxattr");
            std::thread::sleep(HEAVY_SPELL);
            before_wait(false);
            assert_eq!(policy(), libc::SCHED_IDLE, "a while after the read");
            before_wait(true);
            assert_eq!(
                policy(),
                libc::SCHED_OTHER,
                "a reply owed by another thread"
            );
            before_wait(false);
            before_request(GETXATTR, 12);
            crate::meta::EngineTally::default().get();
            assert_eq!(policy(), libc::SCHED_OTHER, "a read of the engine");
        });
    }

    #[test]
    fn a_caller_that_changed_queue_is_counted() {
        let pid = 4_000_123;
        assert!(!caller_moved(pid, 0), "first request");
        assert!(!caller_moved(pid, 0), "same queue");
        assert!(caller_moved(pid, 1), "moved");
        assert!(!caller_moved(pid, 1));
        assert!(!caller_moved(pid + 1024, 0), "another pid in the slot");
        assert!(!caller_moved(pid, 0), "its slot was taken meanwhile");
        assert!(!caller_moved(0, 1), "no caller (kernel-internal request)");
    }

    #[test]
    fn a_queue_thread_told_not_to_yield_never_switches() {
        on_thread(|| {
            start(false);
            before_wait(false);
            before_request(GETXATTR, 12);
            assert_eq!(policy(), libc::SCHED_OTHER);
            before_wait(false);
            assert_eq!(policy(), libc::SCHED_OTHER);
        });
    }
}
