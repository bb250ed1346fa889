//! A structural check of LMDB's data file, in safe Rust, before LMDB maps it.
//!
//! LMDB trusts its own pages. A flipped page number, node offset or page
//! header makes it read outside the page or outside the map: a crash
//! (SIGSEGV) in whatever process reads it, not an error. safs's records carry
//! checksums, but LMDB has to find a record before its checksum can be
//! checked. So before the engine opens the file, this walks every page LMDB
//! can reach from the meta page it will pick, in both B-trees (the main one
//! and the free-page one), with bounds-checked reads, and checks what LMDB
//! would otherwise take on trust:
//!
//! - the meta pages: type, magic, version, page size, the last page inside
//!   the file, and transaction ids that follow each other (a flipped id
//!   would make LMDB pick the older meta page: a silent rollback);
//! - every page: its own number, its type for its depth, its free-space
//!   bounds;
//! - every node: inside its page, with flags safs writes, child and overflow
//!   page numbers inside the file, overflow runs of the size they claim;
//! - each tree: no page reached twice, keys in order and inside the range
//!   the branch keys above them promise (or a lookup would miss what a scan
//!   finds), the page and entry counts its meta record states;
//! - the free list: page numbers inside the file, listed once, none of them
//!   in use (or LMDB would hand out a live page for a new write).
//!
//! It does not read values (each safs record's checksum covers its own
//! bytes) nor overflow pages past the first of each run of the main tree:
//! the cost is one read of every branch and leaf page.
//!
//! Layout constants follow `mdb.c` of liblmdb 0.9 as built by heed
//! (64-bit `pgno_t`, `MDB_DEVEL` off so `PAGEBASE` is 0). What LMDB writes is
//! checked against this code by the tests below on real LMDB files.

use std::cmp::Ordering;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use thiserror::Error;

const PAGEHDRSZ: usize = 16;
const NODESIZE: usize = 8;
/// The meta record starts after the page header; this is its end.
const META_END: usize = PAGEHDRSZ + 136;
const NUM_METAS: u64 = 2;

const P_BRANCH: u16 = 0x01;
const P_LEAF: u16 = 0x02;
const P_OVERFLOW: u16 = 0x04;
const P_META: u16 = 0x08;
const F_BIGDATA: u16 = 0x01;
const MDB_INTEGERKEY: u16 = 0x08;
const MDB_MAGIC: u32 = 0xBEEF_C0DE;
const MDB_DATA_VERSION: u32 = 1;
const P_INVALID: u64 = u64::MAX;
/// LMDB's cursor stack depth: no tree it can walk is deeper.
const MAX_DEPTH: u16 = 32;

#[derive(Debug, Error)]
pub enum CheckError {
    /// The file is damaged in a way LMDB would not survive or would
    /// silently misread; the text says where.
    #[error("{0}")]
    Damaged(String),
    #[error("reading the metadata file: {0}")]
    Io(#[from] std::io::Error),
}

fn damaged(msg: impl Into<String>) -> CheckError {
    CheckError::Damaged(msg.into())
}

/// What the check walked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// The transaction LMDB will open at.
    pub txnid: u64,
    /// Branch and leaf pages read.
    pub pages_read: u64,
    /// Entries in the main tree.
    pub entries: u64,
}

/// One tree's root record in a meta page (`MDB_db`).
#[derive(Clone, Copy, Debug)]
struct Db {
    flags: u16,
    depth: u16,
    branch_pages: u64,
    leaf_pages: u64,
    overflow_pages: u64,
    entries: u64,
    root: u64,
}

#[derive(Clone, Copy, Debug)]
struct Meta {
    psize: u32,
    trees: [Db; 2],
    last_pg: u64,
    txnid: u64,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn read_meta(file: &File, page: u64, offset: u64) -> Result<Meta, CheckError> {
    let mut b = [0u8; META_END];
    read_exact(file, &mut b, offset, || format!("meta page {page}"))?;
    let flags = u16_at(&b, 10);
    if flags & P_META == 0 {
        return Err(damaged(format!(
            "meta page {page} is not marked as one (flags {flags:#x})"
        )));
    }
    let magic = u32_at(&b, 16);
    if magic != MDB_MAGIC {
        return Err(damaged(format!(
            "meta page {page}: magic {magic:#x}, not LMDB's"
        )));
    }
    let version = u32_at(&b, 20);
    if version != MDB_DATA_VERSION {
        return Err(damaged(format!(
            "meta page {page}: LMDB data version {version}, expected {MDB_DATA_VERSION}"
        )));
    }
    let db = |at: usize| Db {
        flags: u16_at(&b, at + 4),
        depth: u16_at(&b, at + 6),
        branch_pages: u64_at(&b, at + 8),
        leaf_pages: u64_at(&b, at + 16),
        overflow_pages: u64_at(&b, at + 24),
        entries: u64_at(&b, at + 32),
        root: u64_at(&b, at + 40),
    };
    Ok(Meta {
        psize: u32_at(&b, 40),
        trees: [db(40), db(88)],
        last_pg: u64_at(&b, 136),
        txnid: u64_at(&b, 144),
    })
}

/// `read_exact_at`, with a short file reported as damage (the meta page
/// promised more) rather than as an I/O error.
fn read_exact(
    file: &File,
    buf: &mut [u8],
    offset: u64,
    what: impl FnOnce() -> String,
) -> Result<(), CheckError> {
    file.read_exact_at(buf, offset).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            damaged(format!("{} lies past the end of the file", what()))
        } else {
            CheckError::Io(e)
        }
    })
}

/// Checks the LMDB data file at `path` (see the module comment).
pub fn check(path: &Path) -> Result<Summary, CheckError> {
    walk(path).map(|(summary, _)| summary)
}

/// The pages in use in the file at `path` (the meta pages, and every page
/// either tree reaches), in order, after the same check: what tests need to
/// tell a live record's bytes from a stale copy in a free page.
pub fn pages_in_use(path: &Path) -> Result<Vec<u64>, CheckError> {
    let (_, used) = walk(path)?;
    let mut pages = vec![0, 1];
    for (word, bits) in used.iter().enumerate() {
        pages.extend(
            (0..64)
                .filter(|b| bits & (1 << b) != 0)
                .map(|b| word as u64 * 64 + b),
        );
    }
    Ok(pages)
}

/// The check; also returns the bitmap of pages reached.
fn walk(path: &Path) -> Result<(Summary, Vec<u64>), CheckError> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let m0 = read_meta(&file, 0, 0)?;
    let psize = m0.psize;
    if !psize.is_power_of_two() || !(512..=32768).contains(&psize) {
        return Err(damaged(format!("meta page 0: page size {psize}")));
    }
    let m1 = read_meta(&file, 1, u64::from(psize))?;
    if m1.psize != psize {
        return Err(damaged(format!(
            "meta pages disagree on the page size ({psize} and {})",
            m1.psize
        )));
    }
    // LMDB alternates: commit N writes meta page N % 2, so the two pages
    // hold consecutive transactions, each on the page of its parity (both
    // 0 only before the first commit).
    let (newer, older) = if m0.txnid < m1.txnid {
        ((1u64, m1), m0)
    } else {
        ((0u64, m0), m1)
    };
    let consecutive =
        older.txnid.checked_add(1) == Some(newer.1.txnid) && newer.1.txnid % 2 == newer.0;
    if !(consecutive || (m0.txnid == 0 && m1.txnid == 0)) {
        return Err(damaged(format!(
            "meta pages hold transactions {} (page 0) and {} (page 1): one of them is damaged, \
             and LMDB would open the volume at transaction {} of page {}",
            m0.txnid, m1.txnid, newer.1.txnid, newer.0
        )));
    }
    let meta = newer.1;
    let pages_in_file = len / u64::from(psize);
    if meta.last_pg < NUM_METAS - 1 || meta.last_pg >= pages_in_file {
        return Err(damaged(format!(
            "meta page {}: last page {} is outside the file ({pages_in_file} pages)",
            newer.0, meta.last_pg
        )));
    }
    let mut w = Walker {
        file: &file,
        psize: psize as usize,
        last_pg: meta.last_pg,
        used: vec![0; (meta.last_pg / 64 + 1) as usize],
        pages_read: 0,
        free_pages: Vec::new(),
    };
    let [free, main] = meta.trees;
    if free.flags != MDB_INTEGERKEY {
        return Err(damaged(format!(
            "meta page {}: free-page tree flags {:#x}, expected {MDB_INTEGERKEY:#x}",
            newer.0, free.flags
        )));
    }
    if main.flags != 0 {
        return Err(damaged(format!(
            "meta page {}: main tree flags {:#x}; safs creates it with none",
            newer.0, main.flags
        )));
    }
    w.tree(Tree::Free, &free)?;
    w.tree(Tree::Main, &main)?;
    let mut listed = std::mem::take(&mut w.free_pages);
    listed.sort_unstable();
    for pair in listed.windows(2) {
        if pair[0] == pair[1] {
            return Err(damaged(format!(
                "free list: page {} is listed twice",
                pair[0]
            )));
        }
    }
    for &pg in &listed {
        if w.is_used(pg) {
            return Err(damaged(format!(
                "free list: page {pg} is listed as free but is in use"
            )));
        }
    }
    let summary = Summary {
        txnid: meta.txnid,
        pages_read: w.pages_read,
        entries: main.entries,
    };
    Ok((summary, w.used))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tree {
    /// Keys: transaction ids (native u64); values: lists of free pages.
    Free,
    /// safs's records; keys compared as bytes.
    Main,
}

impl Tree {
    fn name(self) -> &'static str {
        match self {
            Tree::Free => "free-page tree",
            Tree::Main => "main tree",
        }
    }

    fn cmp(self, a: &[u8], b: &[u8]) -> Ordering {
        match self {
            // Key sizes are checked (8 bytes) before keys are compared.
            Tree::Free => u64::from_ne_bytes(a.try_into().unwrap_or([0; 8]))
                .cmp(&u64::from_ne_bytes(b.try_into().unwrap_or([0; 8]))),
            Tree::Main => a.cmp(b),
        }
    }
}

/// Counts found while walking one tree, to compare with its meta record.
#[derive(Default)]
struct Counts {
    branch: u64,
    leaf: u64,
    overflow: u64,
    entries: u64,
}

struct Walker<'a> {
    file: &'a File,
    psize: usize,
    last_pg: u64,
    /// One bit per page reached from either tree.
    used: Vec<u64>,
    pages_read: u64,
    /// Pages the free list names.
    free_pages: Vec<u64>,
}

/// A node's header fields and where its key and data lie in the page.
struct Node {
    /// `mn_lo | mn_hi << 16`: the data size (leaf) or low page bits (branch).
    size: u64,
    flags: u16,
    key: std::ops::Range<usize>,
}

impl Walker<'_> {
    fn is_used(&self, pg: u64) -> bool {
        self.used[(pg / 64) as usize] & (1 << (pg % 64)) != 0
    }

    /// Marks `pg` reached; a page reached twice means a cycle or two
    /// parents, which LMDB would follow without noticing.
    fn claim(&mut self, tree: Tree, pg: u64) -> Result<(), CheckError> {
        if !(NUM_METAS..=self.last_pg).contains(&pg) {
            return Err(damaged(format!(
                "{}: page number {pg} is outside the file (pages 2..={})",
                tree.name(),
                self.last_pg
            )));
        }
        if self.is_used(pg) {
            return Err(damaged(format!(
                "{}: page {pg} is reached twice",
                tree.name()
            )));
        }
        self.used[(pg / 64) as usize] |= 1 << (pg % 64);
        Ok(())
    }

    fn read_pages(&mut self, pg: u64, count: usize) -> Result<Vec<u8>, CheckError> {
        let mut buf = vec![0u8; count * self.psize];
        read_exact(self.file, &mut buf, pg * self.psize as u64, || {
            format!("page {pg}")
        })?;
        Ok(buf)
    }

    fn tree(&mut self, tree: Tree, db: &Db) -> Result<(), CheckError> {
        if db.root == P_INVALID {
            if db.depth != 0 || db.entries != 0 {
                return Err(damaged(format!(
                    "{}: no root page, yet depth {} and {} entries",
                    tree.name(),
                    db.depth,
                    db.entries
                )));
            }
            return Ok(());
        }
        if !(1..=MAX_DEPTH).contains(&db.depth) {
            return Err(damaged(format!("{}: depth {}", tree.name(), db.depth)));
        }
        let mut counts = Counts::default();
        self.page(tree, db, db.root, 1, None, None, &mut counts)?;
        let stated = (
            db.branch_pages,
            db.leaf_pages,
            db.overflow_pages,
            db.entries,
        );
        let found = (counts.branch, counts.leaf, counts.overflow, counts.entries);
        if stated != found {
            return Err(damaged(format!(
                "{}: the meta page states {} branch, {} leaf, {} overflow pages and {} entries; \
                 the tree holds {}, {}, {} and {}",
                tree.name(),
                stated.0,
                stated.1,
                stated.2,
                stated.3,
                found.0,
                found.1,
                found.2,
                found.3
            )));
        }
        Ok(())
    }

    /// Checks page `pg` at `depth` and, below it, its subtree, whose keys
    /// must lie in `lo..hi` (unbounded where `None`).
    #[allow(clippy::too_many_arguments)]
    fn page(
        &mut self,
        tree: Tree,
        db: &Db,
        pg: u64,
        depth: u16,
        lo: Option<&[u8]>,
        hi: Option<&[u8]>,
        counts: &mut Counts,
    ) -> Result<(), CheckError> {
        self.claim(tree, pg)?;
        let page = self.read_pages(pg, 1)?;
        self.pages_read += 1;
        let psize = self.psize;
        let at = |what: String| damaged(format!("{} page {pg}: {what}", tree.name()));
        let own = u64_at(&page, 0);
        if own != pg {
            return Err(at(format!("the page says it is page {own}")));
        }
        let flags = u16_at(&page, 10);
        let leaf = depth == db.depth;
        let expected = if leaf { P_LEAF } else { P_BRANCH };
        if flags != expected {
            return Err(at(format!(
                "flags {flags:#x} at depth {depth} of {}, expected {expected:#x}",
                db.depth
            )));
        }
        let (lower, upper) = (u16_at(&page, 12) as usize, u16_at(&page, 14) as usize);
        if lower < PAGEHDRSZ || (lower - PAGEHDRSZ) % 2 != 0 || lower > upper || upper > self.psize
        {
            return Err(at(format!("free-space bounds {lower}..{upper}")));
        }
        let nkeys = (lower - PAGEHDRSZ) / 2;
        if nkeys == 0 {
            return Err(at("no nodes".into()));
        }
        let node = |i: usize| -> Result<Node, CheckError> {
            let off = u16_at(&page, PAGEHDRSZ + 2 * i) as usize;
            if off < upper || off + NODESIZE > psize {
                return Err(at(format!("node {i} at offset {off}, outside {upper}..")));
            }
            let ksize = u16_at(&page, off + 6) as usize;
            let key = off + NODESIZE..off + NODESIZE + ksize;
            if key.end > psize {
                return Err(at(format!(
                    "node {i}: key of {ksize} bytes runs past the page"
                )));
            }
            // (A branch page's first key is empty.)
            if tree == Tree::Free && ksize != 8 && (leaf || i != 0) {
                return Err(at(format!(
                    "node {i}: key of {ksize} bytes, not a transaction id"
                )));
            }
            Ok(Node {
                size: u64::from(u16_at(&page, off)) | u64::from(u16_at(&page, off + 2)) << 16,
                flags: u16_at(&page, off + 4),
                key,
            })
        };
        let nodes = (0..nkeys).map(node).collect::<Result<Vec<_>, _>>()?;
        // Keys in order, inside lo..hi. A branch page's first key is never
        // compared by LMDB (its range comes from the parent), so skip it.
        let first = usize::from(!leaf);
        let mut prev: Option<&[u8]> = lo;
        for (i, n) in nodes.iter().enumerate().skip(first) {
            let key = &page[n.key.clone()];
            let in_order = match prev {
                None => true,
                Some(p) if i == first => tree.cmp(p, key) != Ordering::Greater,
                Some(p) => tree.cmp(p, key) == Ordering::Less,
            };
            if !in_order || hi.is_some_and(|h| tree.cmp(key, h) != Ordering::Less) {
                return Err(at(format!("node {i}: key out of order")));
            }
            prev = Some(key);
        }
        if leaf {
            counts.leaf += 1;
            for (i, n) in nodes.iter().enumerate() {
                self.leaf_node(tree, &page, n, counts)
                    .map_err(|e| match e {
                        CheckError::Damaged(m) => at(format!("node {i}: {m}")),
                        e => e,
                    })?;
            }
            return Ok(());
        }
        counts.branch += 1;
        for (i, n) in nodes.iter().enumerate() {
            let child = n.size | u64::from(n.flags) << 32;
            let child_lo = if i == 0 {
                lo
            } else {
                Some(&page[n.key.clone()])
            };
            let child_hi = nodes
                .get(i + 1)
                .map_or(hi, |next| Some(&page[next.key.clone()]));
            self.page(tree, db, child, depth + 1, child_lo, child_hi, counts)?;
        }
        Ok(())
    }

    fn leaf_node(
        &mut self,
        tree: Tree,
        page: &[u8],
        n: &Node,
        counts: &mut Counts,
    ) -> Result<(), CheckError> {
        counts.entries += 1;
        if n.flags & !F_BIGDATA != 0 {
            // Sub-databases and duplicates: safs never writes them, and
            // LMDB would read the data as a tree root.
            return Err(damaged(format!("flags {:#x}", n.flags)));
        }
        let size = n.size as usize;
        let data = n.key.end;
        if n.flags & F_BIGDATA == 0 {
            if data + size > self.psize {
                return Err(damaged(format!("value of {size} bytes runs past the page")));
            }
            if tree == Tree::Free {
                self.free_list(&page[data..data + size])?;
            }
            return Ok(());
        }
        if data + 8 > self.psize {
            return Err(damaged("overflow page number runs past the page"));
        }
        let first = u64_at(page, data);
        if !(NUM_METAS..=self.last_pg).contains(&first) {
            return Err(damaged(format!(
                "overflow page {first} is outside the file (pages 2..={})",
                self.last_pg
            )));
        }
        let head = self.read_pages(first, 1)?;
        let (own, flags, pages) = (u64_at(&head, 0), u16_at(&head, 10), u32_at(&head, 12));
        if own != first || flags != P_OVERFLOW {
            return Err(damaged(format!(
                "overflow page {first} says it is page {own} with flags {flags:#x}"
            )));
        }
        let pages = u64::from(pages);
        if pages == 0
            || first + pages - 1 > self.last_pg
            || (PAGEHDRSZ + size) as u64 > pages * self.psize as u64
        {
            return Err(damaged(format!(
                "overflow run at page {first}: {pages} pages for a value of {size} bytes"
            )));
        }
        for pg in first..first + pages {
            self.claim(tree, pg)?;
        }
        counts.overflow += pages;
        if tree == Tree::Free {
            let run = self.read_pages(first, pages as usize)?;
            self.free_list(&run[PAGEHDRSZ..PAGEHDRSZ + size])?;
        }
        Ok(())
    }

    /// A free-list record: a count, then that many page numbers (records
    /// may be reserved larger than their count needs).
    fn free_list(&mut self, v: &[u8]) -> Result<(), CheckError> {
        if v.len() < 8 || v.len() % 8 != 0 {
            return Err(damaged(format!("free-list record of {} bytes", v.len())));
        }
        let count = u64_at(v, 0);
        if count > (v.len() / 8 - 1) as u64 {
            return Err(damaged(format!(
                "free-list record of {} bytes claims {count} pages",
                v.len()
            )));
        }
        for i in 1..=count as usize {
            let pg = u64_at(v, i * 8);
            if !(NUM_METAS..=self.last_pg).contains(&pg) {
                return Err(damaged(format!(
                    "free list names page {pg}, outside the file (pages 2..={})",
                    self.last_pg
                )));
            }
            self.free_pages.push(pg);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use heed::types::Bytes;
    use heed::{CommitOrAbort, Database, EnvOpenOptions};

    /// An LMDB file written by LMDB itself: `rounds` batches of puts and
    /// deletes of keys and values of many sizes (inline and overflow), so
    /// that pages split, merge and are freed and reused.
    fn lmdb_file(dir: &Path, rounds: u64) {
        lmdb_file_of(dir, rounds, 5000);
    }

    fn lmdb_file_of(dir: &Path, rounds: u64, keys: u64) {
        let mut opts = EnvOpenOptions::new();
        opts.map_size(1 << 30).max_dbs(1);
        // SAFETY: a fresh directory, opened once in this process.
        #[allow(unsafe_code)]
        let env = unsafe { opts.open(dir) }.unwrap();
        let wtxn = env.write_txn().unwrap();
        let db: Database<'static, Bytes, Bytes> = env
            .create_databases_and_commit(wtxn, |o, w| {
                o.create_database::<Bytes, Bytes>(w, None)
                    .map(CommitOrAbort::<_, ()>::Commit)
            })
            .unwrap()
            .unwrap_commit();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..rounds {
            let mut wtxn = env.write_txn().unwrap();
            for _ in 0..400 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let key = format!("k{:05}", x % keys).into_bytes();
                if x % 7 == 0 {
                    db.delete(&mut wtxn, &key).unwrap();
                } else {
                    let len = [8, 60, 300, 1500, 5000, 20000][(x >> 20) as usize % 6];
                    db.put(&mut wtxn, &key, &vec![x as u8; len]).unwrap();
                }
            }
            wtxn.commit().unwrap();
        }
    }

    #[test]
    fn what_lmdb_writes_passes() {
        let dir = tempfile::tempdir().unwrap();
        lmdb_file(dir.path(), 0);
        check(&dir.path().join("data.mdb")).unwrap();
        for rounds in [1, 30] {
            let dir = tempfile::tempdir().unwrap();
            lmdb_file(dir.path(), rounds);
            let s = check(&dir.path().join("data.mdb")).unwrap();
            assert!(s.pages_read > 1 && s.entries > 100, "{s:?}");
            let used = pages_in_use(&dir.path().join("data.mdb")).unwrap();
            assert!(used.len() as u64 > s.pages_read, "overflow pages count too");
            assert!(used.windows(2).all(|w| w[0] < w[1]) && used[..2] == [0, 1]);
        }
    }

    /// Reads every entry of the LMDB file in `dir` with LMDB itself.
    fn lmdb_reads_all(dir: &Path) -> Result<usize, heed::Error> {
        let mut opts = EnvOpenOptions::new();
        opts.map_size(1 << 30).max_dbs(1);
        // SAFETY: a directory of its own, opened once in this process.
        #[allow(unsafe_code)]
        let env = unsafe { opts.open(dir) }?;
        let db: Database<'static, Bytes, Bytes> = env
            .open_databases_and_commit(env.read_txn()?, |o, r| {
                o.open_database::<Bytes, Bytes>(r, None)
                    .map(CommitOrAbort::<_, ()>::Commit)
            })?
            .unwrap_commit()
            .ok_or(heed::Error::Mdb(heed::MdbError::NotFound))?;
        let rtxn = env.read_txn()?;
        let mut n = 0;
        for item in db.iter(&rtxn)? {
            let (k, v) = item?;
            n += k.len().min(1) + v.len().min(1);
        }
        Ok(n)
    }

    /// Bit flips in every page header and in both meta records of a real
    /// file: the check refuses them, or LMDB itself still reads every
    /// entry of the changed file without crashing (in this process: a
    /// crash fails the test).
    #[test]
    fn header_flips_are_refused_or_harmless() {
        let dir = tempfile::tempdir().unwrap();
        lmdb_file_of(dir.path(), 8, 400);
        let pristine = std::fs::read(dir.path().join("data.mdb")).unwrap();
        let psize = 4096;
        // The headers of up to 64 pages spread over the file.
        let pages = pristine.len() / psize;
        let mut offsets: Vec<usize> = (0..pages)
            .step_by(pages.div_ceil(64))
            .flat_map(|p| (0..PAGEHDRSZ).map(move |b| p * psize + b))
            .collect();
        offsets.extend((PAGEHDRSZ..META_END).chain(psize + PAGEHDRSZ..psize + META_END));
        let (mut refused, mut cases) = (0, 0);
        for at in offsets {
            for bit in [0x01u8, 0x80] {
                let case = tempfile::tempdir().unwrap();
                let path = case.path().join("data.mdb");
                let mut bytes = pristine.clone();
                bytes[at] ^= bit;
                std::fs::write(&path, &bytes).unwrap();
                cases += 1;
                if check(&path).is_err() {
                    refused += 1;
                } else {
                    // Not refused: LMDB must cope (an error is fine).
                    let _ = lmdb_reads_all(case.path());
                }
            }
        }
        assert!(
            refused > 0 && refused < cases,
            "{refused} of {cases} refused"
        );
        eprintln!("{refused} of {cases} header flips refused, the rest harmless to LMDB");
    }

    /// Byte offsets of the (newer, older) meta page, by transaction id.
    fn metas_by_age(bytes: &[u8]) -> (usize, usize) {
        if u64_at(bytes, 144) < u64_at(bytes, 4096 + 144) {
            (4096, 0)
        } else {
            (0, 4096)
        }
    }

    #[test]
    fn a_rolled_back_meta_page_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        lmdb_file(dir.path(), 3);
        let path = dir.path().join("data.mdb");
        let mut bytes = std::fs::read(&path).unwrap();
        // The older meta page's transaction id raised above the newer one's.
        let older = metas_by_age(&bytes).1 + 144;
        bytes[older + 7] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        let e = check(&path).unwrap_err().to_string();
        assert!(e.contains("meta pages hold transactions"), "{e}");
    }

    #[test]
    fn a_page_number_past_the_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        lmdb_file(dir.path(), 1);
        let path = dir.path().join("data.mdb");
        let mut bytes = std::fs::read(&path).unwrap();
        let newer = metas_by_age(&bytes).0;
        // The newer meta page's main-tree root.
        bytes[newer + 88 + 40 + 5] = 0x7f;
        std::fs::write(&path, &bytes).unwrap();
        let e = check(&path).unwrap_err().to_string();
        assert!(e.contains("outside the file"), "{e}");
    }

    #[test]
    fn a_short_or_foreign_file_is_refused_not_misread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.mdb");
        std::fs::write(&path, b"").unwrap();
        assert!(matches!(check(&path), Err(CheckError::Damaged(_))));
        std::fs::write(&path, vec![0x55u8; 8192]).unwrap();
        assert!(matches!(check(&path), Err(CheckError::Damaged(_))));
    }
}
