//! A block on its way from the store into a backing file.
//!
//! Each piece is hashed as it arrives, while it is still in the CPU's
//! cache, and kept as the client received it (no copy into one buffer).
//! The pieces go into the backing file in vectored writes of whole
//! [`SPAN`]s: large writes, so that the page cache holds them in large
//! folios and later reads of the cached file (passed through) run at local
//! speed — a write per piece cost those reads a fifth. A fill's block is
//! written span by span as it comes (its last span once it checks out),
//! since no read of a fill looks at a block before it landed (see
//! `partial`) and one that does not check out is fetched again; any other
//! block only once the whole of it hashes to its record, as its backing
//! file may be open and passed through there.
//! A block whose bytes do not hash to its record is never served.

use std::fs::File;
use std::io::IoSlice;
use std::sync::Arc;

use bytes::Bytes;

use super::bad_block;
use super::partial::Partial;
use crate::format::blocks::{BLOCK, BlockRef, Hasher};
use crate::objstore::Sink;

/// The writes of a fill's block, aligned: large enough that the page
/// cache keeps the block in large folios (a write per piece cost later
/// reads of the cached file a fifth), small enough that the client reuses
/// its receive buffers while they are still in the CPU's cache (keeping a
/// whole block's pieces cost more CPU than the copy it saved); 512 KiB and
/// 1 MiB measured alike.
const SPAN: u64 = 512 << 10;
const _: () = assert!(BLOCK % SPAN == 0);

pub(super) struct Incoming {
    ino: u64,
    idx: u32,
    block: BlockRef,
    /// Where the block starts in the backing file.
    off: u64,
    hasher: Hasher,
    /// Received and not yet written, from `written` on.
    pieces: Vec<Bytes>,
    written: u64,
    into: Into,
}

enum Into {
    /// This backing file, once checked.
    File(Arc<File>),
    /// A fill's backing file, span by span while the fill is live;
    /// `stopped` once it ended.
    Fill { fill: Arc<Partial>, stopped: bool },
}

impl Incoming {
    /// Block `idx` of `ino`, to be written into `file` at `off`.
    pub(super) fn file(ino: u64, idx: u32, block: BlockRef, off: u64, file: Arc<File>) -> Self {
        Self::new(ino, idx, block, off, Into::File(file))
    }

    /// Block `idx` of `ino` for `fill`, at `off`.
    pub(super) fn fill(ino: u64, idx: u32, block: BlockRef, off: u64, fill: Arc<Partial>) -> Self {
        let into = Into::Fill {
            fill,
            stopped: false,
        };
        Self::new(ino, idx, block, off, into)
    }

    fn new(ino: u64, idx: u32, block: BlockRef, off: u64, into: Into) -> Self {
        Incoming {
            ino,
            idx,
            hasher: block.kind.hasher(),
            block,
            off,
            pieces: Vec::new(),
            written: 0,
            into,
        }
    }
}

impl Sink for Incoming {
    /// Whether the block landed (a fill that ended meanwhile took none).
    type Made = bool;

    fn piece(&mut self, at: u64, data: Bytes) -> std::io::Result<()> {
        // Longer than its record: refused before it is kept.
        if at + data.len() as u64 > u64::from(self.block.len) {
            return Err(std::io::Error::other(bad_block(
                self.ino,
                self.idx,
                &self.block,
            )));
        }
        self.hasher.update(&data);
        let Into::Fill { fill, stopped } = &mut self.into else {
            self.pieces.push(data);
            return Ok(());
        };
        if *stopped {
            return Ok(());
        }
        // Whole spans written up to the one this piece ends in — never the
        // block's last, which waits for the check: with all its bytes in
        // the backing file, a block whose object ran on past them (damaged)
        // would check out at the next read, its damage unseen.
        let end = at + data.len() as u64;
        let last = u64::from(self.block.len).saturating_sub(1) / SPAN * SPAN;
        let span_end = (end / SPAN * SPAN).min(last);
        if span_end <= self.written {
            self.pieces.push(data);
            return Ok(());
        }
        let mut rest = data;
        let head = rest.split_to((span_end - at) as usize);
        self.pieces.push(head);
        let (pieces, off) = (std::mem::take(&mut self.pieces), self.off + self.written);
        if !fill.write_live(|file| write_pieces_at(file, &pieces, off))? {
            *stopped = true;
            return Ok(());
        }
        self.written = span_end;
        if !rest.is_empty() {
            self.pieces.push(rest);
        }
        Ok(())
    }

    fn end(self, len: u64) -> std::io::Result<bool> {
        let Incoming {
            ino,
            idx,
            block,
            off,
            hasher,
            pieces,
            written,
            into,
        } = self;
        if len != u64::from(block.len) || hasher.finish() != block.hash {
            return Err(std::io::Error::other(bad_block(ino, idx, &block)));
        }
        let off = off + written;
        match into {
            Into::File(file) => write_pieces_at(&file, &pieces, off).map(|()| true),
            Into::Fill { stopped: true, .. } => Ok(false),
            Into::Fill { fill, .. } => fill.write_live(|file| write_pieces_at(file, &pieces, off)),
        }
    }
}

/// Writes `pieces`, one after the other, at `off` of `file`.
pub(super) fn write_pieces_at(file: &File, pieces: &[Bytes], mut off: u64) -> std::io::Result<()> {
    // IOV_MAX slices per call.
    for batch in pieces.chunks(1024) {
        let mut slices: Vec<IoSlice<'_>> = batch.iter().map(|p| IoSlice::new(p)).collect();
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            match rustix::io::pwritev(file, rest, off) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    off += n as u64;
                    IoSlice::advance_slices(&mut rest, n);
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}
