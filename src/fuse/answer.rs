//! Every handler replies exactly once, through [`Answer::answer`]: the
//! outcome of a core operation becomes the reply or its errno in one place
//! (the `From<CoreError> for Errno` conversion), so no handler can forget
//! the error arm or reply twice.

use std::time::Duration;

use fuser::{
    Errno, FileAttr, Generation, ReplyAttr, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyLseek, ReplyStatfs, ReplyWrite, ReplyXattr,
};

use crate::core;

pub(super) trait Answer: Sized {
    /// What a successful operation hands to the reply.
    type Value;

    fn value(self, v: Self::Value);

    fn errno(self, e: Errno);

    fn answer(self, r: core::Result<Self::Value>) {
        match r {
            Ok(v) => self.value(v),
            Err(e) => self.errno(e.into()),
        }
    }
}

impl Answer for ReplyEmpty {
    type Value = ();
    fn value(self, (): ()) {
        self.ok();
    }
    fn errno(self, e: Errno) {
        self.error(e);
    }
}

impl Answer for ReplyData {
    type Value = Vec<u8>;
    fn value(self, v: Vec<u8>) {
        self.data(&v);
    }
    fn errno(self, e: Errno) {
        self.error(e);
    }
}

impl Answer for ReplyWrite {
    type Value = u32;
    fn value(self, n: u32) {
        self.written(n);
    }
    fn errno(self, e: Errno) {
        self.error(e);
    }
}

impl Answer for ReplyLseek {
    type Value = i64;
    fn value(self, o: i64) {
        self.offset(o);
    }
    fn errno(self, e: Errno) {
        self.error(e);
    }
}

/// Attributes and how long the kernel may keep them.
impl Answer for ReplyAttr {
    type Value = (Duration, FileAttr);
    fn value(self, (ttl, attr): (Duration, FileAttr)) {
        self.attr(&ttl, &attr);
    }
    fn errno(self, e: Errno) {
        self.error(e);
    }
}

/// An entry: attributes with their lifetime, the name's lifetime, and the
/// inode's generation.
pub(super) struct Entry {
    pub attr_ttl: Duration,
    pub entry_ttl: Duration,
    pub attr: FileAttr,
    pub generation: Generation,
}

impl Answer for ReplyEntry {
    type Value = Entry;
    fn value(self, e: Entry) {
        self.entry_with_ttls(&e.attr_ttl, &e.entry_ttl, &e.attr, e.generation);
    }
    fn errno(self, e: Errno) {
        self.error(e);
    }
}

/// A listing whose entries were added to the reply as it was read.
impl Answer for ReplyDirectory {
    type Value = ();
    fn value(self, (): ()) {
        self.ok();
    }
    fn errno(self, e: Errno) {
        self.error(e);
    }
}

impl Answer for ReplyDirectoryPlus {
    type Value = ();
    fn value(self, (): ()) {
        self.ok();
    }
    fn errno(self, e: Errno) {
        self.error(e);
    }
}

impl Answer for ReplyStatfs {
    type Value = core::Statfs;
    fn value(self, s: core::Statfs) {
        self.statfs(
            s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
        );
    }
    fn errno(self, e: Errno) {
        self.error(e);
    }
}

/// An xattr value or name list, and the size of the caller's buffer:
/// `size == 0` asks for the length; a smaller buffer than needed is ERANGE.
impl Answer for ReplyXattr {
    type Value = (Vec<u8>, u32);
    fn value(self, (value, size): (Vec<u8>, u32)) {
        if size == 0 {
            self.size(value.len() as u32);
        } else if (size as usize) < value.len() {
            self.error(Errno::from_i32(libc::ERANGE));
        } else {
            self.data(&value);
        }
    }
    fn errno(self, e: Errno) {
        self.error(e);
    }
}
