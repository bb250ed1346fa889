//! Files read before they are wholly fetched.
//!
//! A read-only open of a file larger than one block whose backing file is
//! not current does not wait for the whole file: its backing file is cut to
//! the map's length and each read first brings in the blocks it touches
//! ([`Fs::fill`]) and waits for those only; once the first read has its
//! bytes, [`SWEEPERS`] threads fetch the rest from where the reads are
//! onwards (`sweep`), and the last block in marks the file current. Until
//! the last handle of the inode closes, every handle of it
//! is served by the daemon, not passed through: the kernel refuses to mix
//! passthrough and cached opens of one inode, and a passed-through read
//! would find holes where blocks are still to come.
//!
//! Blocks land only while the fill is live. A writable open, a truncate or
//! an `lseek` for data needs the whole file: the whole fetch ends the fill
//! first (blocks still in flight are dropped, not written), then makes the
//! backing file current as for any open, checking what is already there
//! against the map's hashes. A read that finds the fill ended waits for,
//! or runs, that whole fetch; a whole fetch that fails (a block the store
//! cannot give) lets the fill go on, so that only the reads of that block
//! fail. An object missing from the store (another
//! node replaced the file since its map was read) ends the fill the same
//! way, with the map read again: the reader sees the newer contents from
//! there on, as after an NFS attribute revalidation.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use parking_lot::{Condvar, Mutex, RwLock};

use super::incoming::Incoming;
use super::{
    CoreError, Counters, DIGEST, Fs, MAP, Remote, Result, StoreError, blocks_of, check_block,
    data_in, get_xattr, map_digest, map_len, map_mark, open_raw, punch, set_xattr,
};
use crate::core::data::read_up_to;
use crate::format::blocks::{self, BLOCK, BlockRef};
use crate::objstore;

/// The sweeper's threads, each fetching one block at a time: the store
/// kept as busy as a whole fetch keeps it, with no batch to wait out.
const SWEEPERS: usize = objstore::PARALLEL;

/// The fill of one inode's backing file.
pub(in crate::core) struct Partial {
    map: BTreeMap<u32, BlockRef>,
    digest: [u8; DIGEST],
    len: u64,
    /// The backing file, opened for the fill's own writes.
    file: Arc<File>,
    state: Mutex<Blocks>,
    landed: Condvar,
    /// Held shared by each block's write into the backing file, and
    /// exclusively by whoever ends the fill once `ended` is set: after
    /// that, no write of the fill is still under way.
    gate: RwLock<()>,
}

struct Blocks {
    /// Per block: in the backing file and checked.
    have: Vec<bool>,
    /// Per block: a fetch of it runs.
    busy: Vec<bool>,
    left: usize,
    /// The fill was ended (see the module comment): nothing more lands.
    ended: bool,
    /// The backing file was made current (by the fill or a whole fetch).
    whole: bool,
    /// The block after the last one a read asked for.
    next: u32,
    /// The sweepers were started.
    swept: bool,
}

/// How a block fetch ended.
enum Landed {
    Done,
    /// The fill ended meanwhile: the whole fetch is the reader's way on.
    Ended,
}

impl Partial {
    fn blocks(&self) -> u32 {
        self.len.div_ceil(BLOCK) as u32
    }
}

impl Fs {
    /// Starts serving a read-only open of `ino` in part, when its backing
    /// file is not current and the file is more than one block long (a
    /// smaller one is one request either way, and then passes through).
    /// Whether it did (or a fill already runs): the open then skips the
    /// whole fetch.
    pub(in crate::core) fn begin_partial(&self, ino: u64) -> Result<bool> {
        let Some(r) = &self.remote else {
            return Ok(false);
        };
        if r.current.lock().contains(&ino) {
            return Ok(false);
        }
        let _g = r.lock(ino).lock();
        if let Some(p) = r.partial.lock().get(&ino) {
            return Ok(!p.state.lock().ended);
        }
        if r.current.lock().contains(&ino) {
            return Ok(false);
        }
        {
            // Handles open already may be passed through: a whole fetch,
            // as before.
            let mut st = self.state.lock();
            self.inode(&mut st, ino)?;
            if st.any_backing(ino).is_some() {
                return Ok(false);
            }
        }
        let map = self.known_map(r, ino)?;
        let len = map_len(&map);
        if len <= BLOCK {
            return Ok(false);
        }
        let digest = map_digest(&map);
        let path = self.data.path(ino);
        match open_raw(&path) {
            Ok(f) => {
                // Changes the store lacks, or current already: the whole
                // fetch's quick answer.
                if get_xattr(&f, super::DIRTY)?.is_some()
                    || get_xattr(&f, MAP)? == Some(map_mark(&digest))
                {
                    return Ok(false);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => drop(self.data.open(ino)?),
            Err(e) => return Err(e.into()),
        }
        r.uploaded.lock().remove(&ino);
        let file = open_raw(&path)?;
        file.set_len(len)?;
        let n = len.div_ceil(BLOCK) as usize;
        let mut have = vec![false; n];
        for (idx, off, size) in blocks_of(len) {
            match map.get(&idx).filter(|b| !b.is_zero()) {
                Some(b) => {
                    if let Some(d) = &b.data {
                        check_block(ino, idx, b, d)?;
                        file.write_all_at(d, off)?;
                        have[idx as usize] = true;
                    }
                }
                None => {
                    if data_in(&file, off, size)? {
                        punch(&file, off, size)?;
                    }
                    have[idx as usize] = true;
                }
            }
        }
        let left = have.iter().filter(|h| !**h).count();
        r.counters.misses.fetch_add(1, Relaxed);
        let p = Arc::new(Partial {
            map,
            digest,
            len,
            file: Arc::new(file),
            state: Mutex::new(Blocks {
                busy: vec![false; n],
                have,
                left,
                ended: false,
                whole: false,
                next: 0,
                swept: false,
            }),
            landed: Condvar::new(),
            gate: RwLock::new(()),
        });
        r.partial.lock().insert(ino, Arc::clone(&p));
        tracing::debug!(ino, blocks = n, "opened for reading before it is fetched");
        Ok(true)
    }

    /// Whether `ino`'s handles are served by the daemon until its last
    /// close, as one of them reads it in part (see the module comment).
    pub fn served_by_daemon(&self, ino: u64) -> bool {
        self.remote
            .as_ref()
            .is_some_and(|r| r.partial.lock().contains_key(&ino))
    }

    /// Brings the blocks under `[offset, offset + len)` of `ino`'s contents
    /// into its backing file, if it is read in part; a reader that goes
    /// forward starts the next blocks' fetch too.
    pub(in crate::core) fn fill(&self, ino: u64, offset: u64, len: u64) -> Result<()> {
        let Some(r) = &self.remote else {
            return Ok(());
        };
        let Some(p) = r.partial.lock().get(&ino).cloned() else {
            return Ok(());
        };
        let (start, end) = self.data.backing_span(offset, len.max(1));
        let end = end.min(p.len);
        if start >= end {
            return Ok(());
        }
        let (first, last) = ((start / BLOCK) as u32, ((end - 1) / BLOCK) as u32);
        p.state.lock().next = last + 1;
        loop {
            let mine = {
                let mut s = p.state.lock();
                if s.whole {
                    return Ok(());
                }
                if (first..=last).all(|i| s.have[i as usize]) {
                    let complete = s.left == 0 && !s.ended;
                    // The rest comes in behind once the first read has
                    // its bytes: never ahead of them.
                    let sweep = !complete && !s.ended && !std::mem::replace(&mut s.swept, true);
                    drop(s);
                    if sweep {
                        start_sweepers(r, ino, &p);
                    }
                    // The last block in: later opens pass through.
                    if complete {
                        let _g = r.lock(ino).lock();
                        if !p.state.lock().ended {
                            self.mark_filled(r, ino, &p)?;
                        }
                    }
                    return Ok(());
                }
                if s.ended {
                    break;
                }
                let mine = claim(&mut s, first..=last, usize::MAX);
                if mine.is_empty() {
                    p.landed.wait(&mut s);
                    continue;
                }
                mine
            };
            match fetch_blocks(&r.store, &r.counters, ino, &p, &mine) {
                Ok(Landed::Done) => {}
                Ok(Landed::Ended) => break,
                // Replaced by another node since the map was read.
                Err(CoreError::Store(StoreError::NotFound(_))) => {
                    p.state.lock().ended = true;
                    r.maps.lock().remove(&ino);
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        // The fill ended: the whole fetch (which may be running) makes the
        // backing file current.
        self.fetch(ino)
    }

    /// Ends `ino`'s fill before a whole fetch (under the inode's fetch
    /// lock): no more blocks land; what landed is checked by that fetch.
    /// If every block had landed, the backing file is marked current at
    /// once (`true`: nothing left to fetch).
    pub(super) fn end_fill(&self, r: &Remote, ino: u64) -> Result<bool> {
        let Some(p) = r.partial.lock().get(&ino).cloned() else {
            return Ok(false);
        };
        let complete = {
            let mut s = p.state.lock();
            s.ended = true;
            s.left == 0 && !s.whole
        };
        drop(p.gate.write());
        p.landed.notify_all();
        if complete && self.known_map(r, ino)? == p.map {
            return self.mark_filled(r, ino, &p);
        }
        Ok(false)
    }

    /// A whole fetch of `ino` made its backing file current: every fill
    /// of it reads from there.
    pub(super) fn fill_done(&self, r: &Remote, ino: u64) {
        if let Some(p) = r.partial.lock().get(&ino) {
            p.state.lock().whole = true;
            p.landed.notify_all();
        }
    }

    /// A whole fetch of `ino` failed (a block the store cannot give): its
    /// fill, if the map it follows is still the file's, goes on serving
    /// the reads of other blocks (what the fetch wrote meanwhile is
    /// checked before it counts).
    pub(super) fn revive_fill(&self, r: &Remote, ino: u64) {
        if let Some(p) = r.partial.lock().get(&ino) {
            if r.maps.lock().get(&ino) == Some(&p.map) {
                p.state.lock().ended = false;
            }
        }
    }

    /// The last handle of `ino` closed (under the state lock): its fill
    /// ends, and a backing file it completed is marked current for later
    /// opens, which pass through again.
    pub(in crate::core) fn end_partial(
        &self,
        ino: u64,
        mtime: Option<crate::format::inode::Timestamp>,
    ) {
        let Some(r) = &self.remote else {
            return;
        };
        let Some(p) = r.partial.lock().remove(&ino) else {
            return;
        };
        let complete = {
            let mut s = p.state.lock();
            let complete = s.left == 0 && !s.ended && !s.whole;
            s.ended = true;
            complete
        };
        // A block being written now lands before the next open's fill
        // looks at the file (rare: a close while blocks come in).
        drop(p.gate.write());
        p.landed.notify_all();
        if let (true, Some(mtime)) = (complete, mtime) {
            if let Err(e) = set_mtime(&p.file, mtime)
                .and_then(|()| set_xattr(&p.file, MAP, &map_mark(&p.digest)))
            {
                tracing::warn!(ino, error = %e, "cannot mark a cached file current: checked at its next open");
                return;
            }
            // Current only if no other node changed the map meanwhile
            // (that drops the map kept): else the mark decides at the next
            // open.
            if r.maps.lock().get(&ino) == Some(&p.map) {
                r.current.lock().insert(ino);
            }
        }
    }

    /// Marks the backing file a fill completed as current, unless another
    /// node changed the file's map meanwhile (that drops the map kept):
    /// whether it did.
    fn mark_filled(&self, r: &Remote, ino: u64, p: &Partial) -> Result<bool> {
        if r.maps.lock().get(&ino) != Some(&p.map) {
            return Ok(false);
        }
        let mtime = {
            let mut st = self.state.lock();
            self.inode(&mut st, ino)?.mtime
        };
        set_mtime(&p.file, mtime)?;
        set_xattr(&p.file, MAP, &map_mark(&p.digest))?;
        p.state.lock().whole = true;
        p.landed.notify_all();
        r.current.lock().insert(ino);
        tracing::debug!(ino, "fetched by its reads");
        Ok(true)
    }
}

/// Starts the sweepers of `ino`'s fill.
fn start_sweepers(r: &Remote, ino: u64, p: &Arc<Partial>) {
    for _ in 0..SWEEPERS {
        let (store, counters) = (Arc::clone(&r.store), Arc::clone(&r.counters));
        let p = Arc::clone(p);
        let spawned = std::thread::Builder::new()
            .name("safs-sweep".into())
            .spawn(move || sweep(&store, &counters, ino, &p));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start fetching a file being read: its reads fetch their own blocks");
            break;
        }
    }
}

/// At most `max` blocks of `order` neither landed nor being fetched,
/// marked as being fetched by the caller.
fn claim(s: &mut Blocks, order: impl IntoIterator<Item = u32>, max: usize) -> Vec<u32> {
    order
        .into_iter()
        .filter(|&i| {
            let i = i as usize;
            let free = i < s.have.len() && !s.have[i] && !s.busy[i];
            if free {
                s.busy[i] = true;
            }
            free
        })
        .take(max)
        .collect()
}

/// A sweeper of a fill (it has [`SWEEPERS`]): fetches the blocks no read
/// has asked for yet, from where the last read ended onwards (then the
/// ones before), one at a time, until the file is whole or the fill ends. A reader going
/// forward finds its next blocks there or on their way; one reading here
/// and there waits for its own block only, while the rest comes in at
/// the store's pace, as a whole fetch at open brought it before the first
/// read. Its errors are the readers' to meet: it just stops.
fn sweep(store: &objstore::Store, counters: &Counters, ino: u64, p: &Arc<Partial>) {
    loop {
        let batch = {
            let mut s = p.state.lock();
            loop {
                if s.ended || s.whole || s.left == 0 {
                    return;
                }
                let start = s.next.min(p.blocks());
                let mine = claim(&mut s, (start..p.blocks()).chain(0..start), 1);
                if !mine.is_empty() {
                    break mine;
                }
                // Every block left is on its way for a reader.
                p.landed.wait(&mut s);
            }
        };
        match fetch_blocks(store, counters, ino, p, &batch) {
            Ok(Landed::Done) => {}
            Ok(Landed::Ended) => return,
            Err(e) => {
                tracing::debug!(ino, error = %e, "the object store's blocks of a file being read: the readers fetch their own");
                return;
            }
        }
    }
}

/// Fetches blocks `idxs` of `p` (claimed by the caller) into its backing
/// file: each already there and matching its hash is kept, the others come
/// from the store, checked. Released for others whatever happens.
fn fetch_blocks(
    store: &objstore::Store,
    counters: &Counters,
    ino: u64,
    p: &Arc<Partial>,
    idxs: &[u32],
) -> Result<Landed> {
    let release = |done: &[u32], landed: bool| {
        let mut s = p.state.lock();
        for &i in done {
            s.busy[i as usize] = false;
            if landed && !s.have[i as usize] {
                s.have[i as usize] = true;
                s.left -= 1;
            }
        }
        drop(s);
        p.landed.notify_all();
    };
    let result = fetch_blocks_claimed(store, counters, ino, p, idxs, &release);
    // Whatever did not land is free for the next reader to try.
    release(idxs, false);
    result
}

fn fetch_blocks_claimed(
    store: &objstore::Store,
    counters: &Counters,
    ino: u64,
    p: &Arc<Partial>,
    idxs: &[u32],
    release: &dyn Fn(&[u32], bool),
) -> Result<Landed> {
    let mut wanted = Vec::new();
    let mut buf = Vec::new();
    for &idx in idxs {
        let b = &p.map[&idx];
        let off = u64::from(idx) * BLOCK;
        let n = u64::from(b.len);
        // What an earlier session left (a mark lost, or a reboot).
        if data_in(&p.file, off, n)? {
            buf.resize(n as usize, 0);
            if read_up_to(&p.file, &mut buf, off)? == buf.len() && b.holds(&buf) {
                release(&[idx], true);
                continue;
            }
        }
        wanted.push((idx, off, b.clone()));
    }
    if wanted.is_empty() {
        return Ok(Landed::Done);
    }
    let keys: Vec<String> = wanted
        .iter()
        .map(|(idx, _, b)| blocks::object_key(ino, *idx, b.generation))
        .collect();
    let (work_wanted, work_p) = (Arc::new(wanted), Arc::clone(p));
    let wanted = Arc::clone(&work_wanted);
    let got = store.get_each(
        &keys,
        move |i| {
            let (idx, off, b) = &work_wanted[i];
            Incoming::fill(ino, *idx, b.clone(), *off, Arc::clone(&work_p))
        },
        |i, landed| {
            if landed {
                // Counted before the block is seen landed.
                counters.fetched_blocks.fetch_add(1, Relaxed);
                counters
                    .fetched_bytes
                    .fetch_add(u64::from(wanted[i].2.len), Relaxed);
                release(&[wanted[i].0], true);
            }
            Ok(())
        },
    );
    got?;
    if p.state.lock().ended {
        return Ok(Landed::Ended);
    }
    Ok(Landed::Done)
}

impl Partial {
    /// Writes a block that came in with `write`, if the fill is still live
    /// — inside its gate: a whole fetch that ended it never meets a late
    /// write. Whether it wrote.
    pub(super) fn write_live(
        &self,
        write: impl FnOnce(&File) -> std::io::Result<()>,
    ) -> std::io::Result<bool> {
        let _g = self.gate.read();
        if self.state.lock().ended {
            return Ok(false);
        }
        write(&self.file)?;
        Ok(true)
    }
}

/// Sets the backing file's mtime to the file's: fetching is no change (a
/// writer's close takes a newer one from it).
pub(super) fn set_mtime(f: &File, mtime: crate::format::inode::Timestamp) -> std::io::Result<()> {
    let t = nix::sys::time::TimeSpec::new(mtime.sec, i64::from(mtime.nsec));
    nix::sys::stat::futimens(f, &nix::sys::time::TimeSpec::UTIME_OMIT, &t)
        .map_err(std::io::Error::from)
}
