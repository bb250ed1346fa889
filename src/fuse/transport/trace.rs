//! A trace of when requests reach the daemon and when their replies leave
//! it, for splitting a round trip: off unless armed over the control
//! socket (`trace N`); armed, each request notes its arrival and the
//! moment its reply is handed back, on `CLOCK_MONOTONIC`, which every
//! process reads alike. A caller noting its own times around each call
//! (the bench) then sees the way there, the daemon's part and the way
//! back apart — where a slow round trip is lost, measured rather than
//! guessed. Disarmed, a request pays one relaxed load.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

pub use safs_control::{TraceRecord, trace_clock_ns as now_ns};

static ARMED: AtomicBool = AtomicBool::new(false);
/// The most records kept (the buffer is reserved when armed).
static ROOM: AtomicUsize = AtomicUsize::new(0);
static RECORDS: Mutex<Vec<TraceRecord>> = Mutex::new(Vec::new());

/// The most records one trace may ask for.
pub const MAX_RECORDS: usize = 1 << 20;

/// A request's arrival: the time when armed, else 0 (not traced).
#[inline]
pub(super) fn arrived() -> u64 {
    if ARMED.load(Ordering::Relaxed) {
        now_ns()
    } else {
        0
    }
}

/// A traced request's reply is being handed back now.
#[inline]
pub(super) fn answered(unique: u64, opcode: u32, arrived_ns: u64) {
    if arrived_ns != 0 {
        note(unique, opcode, arrived_ns, now_ns());
    }
}

#[cold]
fn note(unique: u64, opcode: u32, arrived_ns: u64, answered_ns: u64) {
    let mut records = RECORDS.lock().unwrap_or_else(|e| e.into_inner());
    if records.len() < ROOM.load(Ordering::Relaxed) {
        records.push(TraceRecord {
            unique,
            opcode,
            arrived_ns,
            answered_ns,
        });
    } else {
        ARMED.store(false, Ordering::Relaxed);
    }
}

/// Starts a trace of the next `n` requests (at most [`MAX_RECORDS`]),
/// dropping what an earlier one kept.
pub fn arm(n: usize) {
    let n = n.min(MAX_RECORDS);
    let mut records = RECORDS.lock().unwrap_or_else(|e| e.into_inner());
    records.clear();
    records.shrink_to(n);
    records.reserve_exact(n);
    ROOM.store(n, Ordering::Relaxed);
    ARMED.store(n > 0, Ordering::Relaxed);
}

/// Ends the trace and hands over what it kept, in the order replies
/// were handed back.
pub fn take() -> Vec<TraceRecord> {
    ARMED.store(false, Ordering::Relaxed);
    let mut records = RECORDS.lock().unwrap_or_else(|e| e.into_inner());
    ROOM.store(0, Ordering::Relaxed);
    std::mem::take(&mut *records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_what_arrived_while_armed_and_no_more_than_asked() {
        let before = arrived();
        assert_eq!(before, 0, "disarmed, nothing is stamped");
        answered(1, 22, before);
        arm(2);
        for unique in 2..6 {
            let a = arrived();
            answered(unique, 22, a);
        }
        let got = take();
        assert_eq!(got.iter().map(|r| r.unique).collect::<Vec<_>>(), [2, 3]);
        assert!(
            got.iter()
                .all(|r| r.arrived_ns <= r.answered_ns && r.opcode == 22)
        );
        assert_eq!(arrived(), 0, "taken, the trace is off");
        assert!(take().is_empty());
    }
}
