//! A block on its way from the store into a backing file.
//!
//! Each piece is hashed as it arrives (still in the CPU's cache) and goes
//! where the block belongs: a fill's block is written at once, since no
//! read of a fill looks at a block before it landed (see `partial`), and a
//! block it could not check is fetched again; any other block is kept
//! whole until checked, as the backing file may be open and passed through
//! there. A block whose bytes do not hash to its record is never served.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::bad_block;
use super::partial::Partial;
use crate::format::blocks::{BlockRef, Hasher};
use crate::objstore::Sink;

pub(super) struct Incoming {
    ino: u64,
    idx: u32,
    block: BlockRef,
    /// Where the block starts in the backing file.
    off: u64,
    hasher: Hasher,
    into: Into,
}

enum Into {
    /// Written once checked, into this file.
    Kept(Arc<File>, Vec<u8>),
    /// Written as it comes, while the fill is live; `stopped` once it
    /// ended.
    Fill { fill: Arc<Partial>, stopped: bool },
}

impl Incoming {
    /// Block `idx` of `ino`, kept whole and written into `file` once
    /// checked.
    pub(super) fn kept(ino: u64, idx: u32, block: BlockRef, off: u64, file: Arc<File>) -> Self {
        let kept = Vec::with_capacity(block.len as usize);
        Self::new(ino, idx, block, off, Into::Kept(file, kept))
    }

    /// Block `idx` of `ino` for `fill`, written as it comes.
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
            into,
        }
    }

    fn bad(&self) -> std::io::Error {
        std::io::Error::other(bad_block(self.ino, self.idx, &self.block))
    }
}

impl Sink for Incoming {
    /// Whether the block landed (a fill that ended meanwhile took none).
    type Made = bool;

    fn piece(&mut self, at: u64, data: &[u8]) -> std::io::Result<()> {
        // Longer than its record: never written over the next block.
        if at + data.len() as u64 > u64::from(self.block.len) {
            return Err(self.bad());
        }
        self.hasher.update(data);
        match &mut self.into {
            Into::Kept(_, kept) => kept.extend_from_slice(data),
            Into::Fill { fill, stopped } => {
                if !*stopped && !fill.write_live(data, self.off + at)? {
                    *stopped = true;
                }
            }
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
            into,
        } = self;
        if len != u64::from(block.len) || hasher.finish() != block.hash {
            return Err(std::io::Error::other(bad_block(ino, idx, &block)));
        }
        match into {
            Into::Kept(file, kept) => {
                file.write_all_at(&kept, off)?;
                Ok(true)
            }
            Into::Fill { stopped, .. } => Ok(!stopped),
        }
    }
}
