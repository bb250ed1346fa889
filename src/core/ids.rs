//! Identities at the core's edge, as types: an inode number is not a file
//! handle is not a readdir cookie.
//!
//! Inode numbers are never reused: a new inode takes the volume's
//! `next_ino`, which only grows and is committed with the inode (see
//! `state`). So the pair (inode number, generation) never names two
//! inodes over the volume's life with the generation always 1 — which is
//! what the kernel's NFS file handles and FUSE require of it.

use std::fmt;

/// An inode number (FUSE node id); 1 is the root directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ino(pub u64);

impl Ino {
    pub const ROOT: Ino = Ino(1);
}

/// An open file's handle, as the kernel quotes it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fh(pub u64);

/// An inode's generation: always [`Generation::ONLY`] (see the module
/// comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Generation(pub u64);

impl Generation {
    pub const ONLY: Generation = Generation(1);
}

/// A position in a directory listing: 0 is the start, 1 and 2 follow "."
/// and "..", entries have their own cookies from 3 on (see `namespace`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cookie(pub u64);

impl Cookie {
    pub const START: Cookie = Cookie(0);
}

impl fmt::Display for Ino {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
