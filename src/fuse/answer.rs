//! Every handler replies exactly once, through [`Answer::answer`]: the
//! outcome of a core operation becomes the reply or its errno in one place
//! (`CoreError::errno`), so no handler can forget the error arm or reply
//! twice. Each reply kind wraps the transport's [`Reply`] with the one
//! encoding its operation takes.

use std::time::Duration;

use zerocopy::IntoBytes;

use super::proto::abi;
use super::proto::reply::{self as enc, DirBuf};
use super::transport::Reply;
use crate::core;

pub(super) trait Answer: Sized {
    /// What a successful operation hands to the reply.
    type Value;

    fn value(self, v: Self::Value);

    fn into_reply(self) -> Reply;

    fn answer(self, r: core::Result<Self::Value>) {
        match r {
            Ok(v) => self.value(v),
            Err(e) => self.into_reply().error(e.errno()),
        }
    }
}

/// Success with no body.
pub(super) struct Empty(pub Reply);

impl Answer for Empty {
    type Value = ();
    fn value(self, (): ()) {
        self.0.send(&[]);
    }
    fn into_reply(self) -> Reply {
        self.0
    }
}

/// File or link contents.
pub(super) struct Data(pub Reply);

impl Answer for Data {
    type Value = Vec<u8>;
    fn value(self, v: Vec<u8>) {
        self.0.send(&[&v]);
    }
    fn into_reply(self) -> Reply {
        self.0
    }
}

impl Data {
    /// Answers a READ of up to `size` bytes: read straight into the
    /// reply's buffer where the transport has one (`read_into`, one copy
    /// less per byte on the way back), else into a buffer of its own
    /// (`read`).
    pub(super) fn answer_read(
        self,
        size: u32,
        read_into: impl FnOnce(&mut [u8]) -> core::Result<usize>,
        read: impl FnOnce() -> core::Result<Vec<u8>>,
    ) {
        match self.0.in_place(size as usize) {
            Ok(mut out) => match read_into(out.buf()) {
                Ok(n) => out.send(n),
                Err(e) => out.error(e.errno()),
            },
            Err(reply) => Data(reply).answer(read()),
        }
    }
}

/// Bytes written.
pub(super) struct Written(pub Reply);

impl Answer for Written {
    type Value = u32;
    fn value(self, n: u32) {
        self.0.send(&[enc::write_out(n).as_bytes()]);
    }
    fn into_reply(self) -> Reply {
        self.0
    }
}

/// A file offset (`lseek`).
pub(super) struct Offset(pub Reply);

impl Answer for Offset {
    type Value = i64;
    fn value(self, o: i64) {
        self.0.send(&[enc::lseek_out(o).as_bytes()]);
    }
    fn into_reply(self) -> Reply {
        self.0
    }
}

/// Attributes and how long the kernel may keep them.
pub(super) struct Attrs(pub Reply);

impl Answer for Attrs {
    type Value = (Duration, abi::Attr);
    fn value(self, (ttl, attr): (Duration, abi::Attr)) {
        self.0.send(&[enc::attr_out(ttl, attr).as_bytes()]);
    }
    fn into_reply(self) -> Reply {
        self.0
    }
}

/// An entry: attributes with their lifetime, the name's lifetime, and the
/// inode's generation.
pub(super) struct Entry {
    pub attr_ttl: Duration,
    pub entry_ttl: Duration,
    pub attr: abi::Attr,
    pub generation: u64,
}

impl Entry {
    pub fn out(&self) -> abi::EntryOut {
        enc::entry_out(
            self.attr.ino,
            self.generation,
            self.entry_ttl,
            self.attr_ttl,
            self.attr,
        )
    }
}

pub(super) struct Entries(pub Reply);

impl Answer for Entries {
    type Value = Entry;
    fn value(self, e: Entry) {
        self.0.send(&[e.out().as_bytes()]);
    }
    fn into_reply(self) -> Reply {
        self.0
    }
}

/// A listing whose entries were added to the buffer as it was read.
pub(super) struct Listing(pub Reply);

impl Answer for Listing {
    type Value = DirBuf;
    fn value(self, buf: DirBuf) {
        self.0.send(&[buf.bytes()]);
    }
    fn into_reply(self) -> Reply {
        self.0
    }
}

pub(super) struct Statfs(pub Reply);

impl Answer for Statfs {
    type Value = core::Statfs;
    fn value(self, s: core::Statfs) {
        let out = enc::statfs_out(
            s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
        );
        self.0.send(&[out.as_bytes()]);
    }
    fn into_reply(self) -> Reply {
        self.0
    }
}

/// An xattr value or name list, and the size of the caller's buffer:
/// `size == 0` asks for the length; a smaller buffer than needed is ERANGE.
pub(super) struct Xattr {
    pub reply: Reply,
    pub size: u32,
}

impl Answer for Xattr {
    type Value = Vec<u8>;
    fn value(self, value: Vec<u8>) {
        if self.size == 0 {
            self.reply
                .send(&[enc::getxattr_out(value.len() as u32).as_bytes()]);
        } else if (self.size as usize) < value.len() {
            self.reply.error(libc::ERANGE);
        } else {
            self.reply.send(&[&value]);
        }
    }
    fn into_reply(self) -> Reply {
        self.reply
    }
}
