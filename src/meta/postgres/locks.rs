//! File locks every daemon of a volume sees (`fcntl` record and OFD locks,
//! `flock`), in two tables: `safs_locks` (the locks held, one row per
//! range) and `safs_lock_waits` (the owners blocked in `F_SETLKW`, for the
//! deadlock search). Every change runs in one transaction under one
//! advisory lock ([`super::LOCKS_LOCK`]), so a conflict check, the change
//! and a deadlock search see one state of every daemon's locks.
//!
//! An owner is a (session, kernel owner) pair: the kernel's lock owners
//! are unique on one machine only. A lock of a session whose daemon died
//! stops counting at once (the live-session test of every conflict
//! query); its rows go when a survivor buries the session.

use postgres::Transaction;

use super::{LOCKS_CHANNEL, SESSION_LIVE};
use crate::meta::{LockDrop, LockHolder, LockKind, LockReq};

/// A conflicting lock and its owner (session, kernel owner).
type Conflict = Option<(LockHolder, (i64, i64))>;

/// What a lock request came to.
pub(super) enum Outcome {
    Granted,
    Held(LockHolder),
    Deadlock,
}

fn typ(kind: LockKind) -> i16 {
    match kind {
        LockKind::Read => 1,
        LockKind::Write => 2,
        LockKind::Unlock => 0,
    }
}

fn kind(typ: i16) -> LockKind {
    if typ == 2 {
        LockKind::Write
    } else {
        LockKind::Read
    }
}

/// Offsets as the table keeps them: the kernel's are within `0..=i64::MAX`
/// (`OFFSET_MAX` meaning "to the end").
fn off(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

/// The first lock of a live session that conflicts with `req` (another
/// owner's, overlapping, one of the two a write lock), and its owner.
pub(super) fn conflict(
    t: &mut Transaction<'_>,
    me: i64,
    req: &LockReq,
) -> Result<Conflict, postgres::Error> {
    find_conflict(
        t,
        (me, req.owner as i64),
        req.ino as i64,
        req.flock,
        typ(req.kind),
        off(req.start),
        off(req.end),
    )
}

fn find_conflict(
    t: &mut Transaction<'_>,
    (session, owner): (i64, i64),
    ino: i64,
    flock: bool,
    typ: i16,
    start: i64,
    end: i64,
) -> Result<Conflict, postgres::Error> {
    let row = t.query_opt(
        &format!(
            "SELECT typ, lstart, lend, pid, session, owner FROM safs_locks l \
             WHERE ino = $1 AND flock = $2 AND NOT (session = $3 AND owner = $4) \
             AND lstart <= $6 AND lend >= $5 AND (typ = 2 OR $7::int2 = 2) \
             AND session IN (SELECT id FROM safs_sessions s WHERE {SESSION_LIVE}) \
             ORDER BY lstart LIMIT 1"
        ),
        &[&ino, &flock, &session, &owner, &start, &end, &typ],
    )?;
    Ok(row.map(|r| {
        (
            LockHolder {
                kind: kind(r.get(0)),
                start: r.get::<_, i64>(1) as u64,
                end: r.get::<_, i64>(2) as u64,
                pid: r.get::<_, i32>(3) as u32,
            },
            (r.get(4), r.get(5)),
        )
    }))
}

/// Takes, changes or drops `req`'s lock for session `me` (see
/// `Shared::lock_set`).
pub(super) fn set(
    t: &mut Transaction<'_>,
    me: i64,
    req: &LockReq,
    waiting: bool,
) -> Result<Outcome, postgres::Error> {
    let owner = req.owner as i64;
    let ino = req.ino as i64;
    if req.kind != LockKind::Unlock {
        if let Some((held, by)) = conflict(t, me, req)? {
            if waiting {
                // Linux looks for cycles among record locks only.
                if !req.flock && closes_cycle(t, (me, owner), by)? {
                    return Ok(Outcome::Deadlock);
                }
                t.execute(
                    "INSERT INTO safs_lock_waits (session, owner, ino, flock, typ, lstart, lend) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (session, owner) DO UPDATE \
                     SET ino = $3, flock = $4, typ = $5, lstart = $6, lend = $7",
                    &[
                        &me,
                        &owner,
                        &ino,
                        &req.flock,
                        &typ(req.kind),
                        &off(req.start),
                        &off(req.end),
                    ],
                )?;
            }
            return Ok(Outcome::Held(held));
        }
    }
    let narrowed = if req.flock {
        // One lock per owner and file; a conversion is a drop and a take,
        // as in Linux.
        let n = t.execute(
            "DELETE FROM safs_locks WHERE ino = $1 AND flock AND session = $2 AND owner = $3",
            &[&ino, &me, &owner],
        )?;
        if req.kind != LockKind::Unlock {
            insert(t, me, req, off(req.start), off(req.end))?;
        }
        n > 0
    } else {
        set_range(t, me, req)?
    };
    t.execute(
        "DELETE FROM safs_lock_waits WHERE session = $1 AND owner = $2",
        &[&me, &owner],
    )?;
    if narrowed {
        t.execute("SELECT pg_notify($1, '')::text", &[&LOCKS_CHANNEL])?;
    }
    Ok(Outcome::Granted)
}

fn insert(
    t: &mut Transaction<'_>,
    me: i64,
    req: &LockReq,
    start: i64,
    end: i64,
) -> Result<(), postgres::Error> {
    insert_typ(t, me, req, typ(req.kind), start, end)
}

fn insert_typ(
    t: &mut Transaction<'_>,
    me: i64,
    req: &LockReq,
    typ: i16,
    start: i64,
    end: i64,
) -> Result<(), postgres::Error> {
    t.execute(
        "INSERT INTO safs_locks (ino, session, owner, flock, fh, typ, lstart, lend, pid) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        &[
            &(req.ino as i64),
            &me,
            &(req.owner as i64),
            &req.flock,
            &(req.fh as i64),
            &typ,
            &start,
            &end,
            &(req.pid as i32),
        ],
    )?;
    Ok(())
}

/// A record lock (or unlock) over `req`'s range, as POSIX has it: the
/// owner's locks of the same kind that touch the range merge with it,
/// those of the other kind are cut around it. Whether some lock of the
/// owner's was dropped or weakened (waiters should look again).
fn set_range(t: &mut Transaction<'_>, me: i64, req: &LockReq) -> Result<bool, postgres::Error> {
    let (mut start, mut end) = (off(req.start), off(req.end));
    let new = typ(req.kind);
    let rows = t.query(
        "DELETE FROM safs_locks WHERE ino = $1 AND NOT flock AND session = $2 AND owner = $3 \
         AND lstart - 1 <= $5::int8 AND lend >= $4::int8 - 1 RETURNING typ, lstart, lend",
        &[&(req.ino as i64), &me, &(req.owner as i64), &start, &end],
    )?;
    let mut narrowed = false;
    let mut keep = Vec::new();
    for r in rows {
        let (rt, rs, re): (i16, i64, i64) = (r.get(0), r.get(1), r.get(2));
        let overlaps = rs <= end && re >= start;
        if rt == new {
            // Same kind, overlapping or adjacent: one lock.
            start = start.min(rs);
            end = end.max(re);
        } else if !overlaps {
            keep.push((rt, rs, re));
        } else {
            narrowed |= rt == 2 || new == 0;
            if rs < start {
                keep.push((rt, rs, start - 1));
            }
            if re > end {
                keep.push((rt, end + 1, re));
            }
        }
    }
    for (rt, rs, re) in keep {
        insert_typ(t, me, req, rt, rs, re)?;
    }
    if new != 0 {
        insert(t, me, req, start, end)?;
    }
    Ok(narrowed)
}

/// Whether `me` waiting for a lock `holder` holds closes a cycle: `holder`
/// waits (through any chain of waiting owners) for a lock of `me`'s.
fn closes_cycle(
    t: &mut Transaction<'_>,
    me: (i64, i64),
    holder: (i64, i64),
) -> Result<bool, postgres::Error> {
    let mut frontier = vec![holder];
    let mut seen = std::collections::HashSet::new();
    while let Some(h) = frontier.pop() {
        if h == me {
            return Ok(true);
        }
        if !seen.insert(h) || seen.len() > super::DEADLOCK_SEARCH {
            continue;
        }
        let waits = t.query_opt(
            "SELECT ino, flock, typ, lstart, lend FROM safs_lock_waits \
             WHERE session = $1 AND owner = $2",
            &[&h.0, &h.1],
        )?;
        let Some(w) = waits else {
            continue;
        };
        // Every holder that stands in that waiter's way.
        let blockers = t.query(
            &format!(
                "SELECT DISTINCT session, owner FROM safs_locks l \
                 WHERE ino = $1 AND flock = $2 AND NOT (session = $3 AND owner = $4) \
                 AND lstart <= $6 AND lend >= $5 AND (typ = 2 OR $7::int2 = 2) \
                 AND session IN (SELECT id FROM safs_sessions s WHERE {SESSION_LIVE})"
            ),
            &[
                &w.get::<_, i64>(0),
                &w.get::<_, bool>(1),
                &h.0,
                &h.1,
                &w.get::<_, i64>(3),
                &w.get::<_, i64>(4),
                &w.get::<_, i16>(2),
            ],
        )?;
        frontier.extend(blockers.iter().map(|r| (r.get(0), r.get(1))));
    }
    Ok(false)
}

/// Drops the locks of session `me` on `ino` that `which` selects.
pub(super) fn drop(
    t: &mut Transaction<'_>,
    me: i64,
    ino: u64,
    which: LockDrop,
) -> Result<(), postgres::Error> {
    let ino = ino as i64;
    let n = match which {
        LockDrop::Posix(owner) => t.execute(
            "DELETE FROM safs_locks WHERE ino = $1 AND NOT flock AND session = $2 AND owner = $3",
            &[&ino, &me, &(owner as i64)],
        )?,
        LockDrop::Flock(owner) => t.execute(
            "DELETE FROM safs_locks WHERE ino = $1 AND flock AND session = $2 AND owner = $3",
            &[&ino, &me, &(owner as i64)],
        )?,
        LockDrop::File(fh) => t.execute(
            "DELETE FROM safs_locks WHERE ino = $1 AND session = $2 AND fh = $3",
            &[&ino, &me, &(fh as i64)],
        )?,
        LockDrop::Wait(owner) => {
            t.execute(
                "DELETE FROM safs_lock_waits WHERE session = $1 AND owner = $2",
                &[&me, &(owner as i64)],
            )?;
            0
        }
    };
    if n > 0 {
        t.execute("SELECT pg_notify($1, '')::text", &[&LOCKS_CHANNEL])?;
    }
    Ok(())
}
