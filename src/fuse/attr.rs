//! Core attributes in the kernel's layout.

use super::proto::abi;
use super::proto::reply::{self as enc, AttrFields};
use crate::core::{Attr, Timestamp};

fn wire(t: Timestamp) -> (i64, u32) {
    (t.sec, t.nsec)
}

/// The directory-entry type (`DT_*`) of an inode kind as the core stores it
/// (the mode's type bits shifted down by 12, which is what `DT_*` are).
pub fn dtype(kind: u8) -> u32 {
    u32::from(kind)
}

pub fn file_attr(a: &Attr) -> abi::Attr {
    enc::attr(&AttrFields {
        ino: a.ino.0,
        size: a.size,
        blocks: a.blocks,
        atime: wire(a.atime),
        mtime: wire(a.mtime),
        ctime: wire(a.ctime),
        mode: a.mode,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
    })
}
