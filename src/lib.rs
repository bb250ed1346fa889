//! safs: a FUSE filesystem built for metadata speed.
//!
//! Layers, each depending only downward:
//! `cli` → `fuse` (the FUSE session: mount, `/dev/fuse` and io_uring
//! transports, wire protocol, adapter) → `core` (POSIX
//! semantics, SA xattr tiers, caches, group commit) → `meta` (engines) and
//! `format` (record layouts, pure).
// Unsafe is denied everywhere but `meta::lmdb::LmdbStore::open` (heed's
// `open` is unsafe because LMDB memory-maps its file) and
// `process::default_sigpipe` (libc's `signal`), the `/dev/fuse` ioctls in
// `fuse::transport::conn` and the io_uring submissions in
// `fuse::transport::uring`; see their SAFETY notes.
// (Tests that write LMDB files of their own open them the same way.)
#![deny(unsafe_code)]

pub mod control;
pub mod core;
pub mod format;
pub mod fsck;
pub mod fuse;
pub mod meta;
pub mod metrics;
pub mod objstore;
pub use safs_control::mountinfo;
pub mod process;
