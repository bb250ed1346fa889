//! On-disk record layouts: pure encode/decode, no I/O.
//!
//! Every value stored in the metadata engine is wrapped in an [`envelope`]:
//! a kind byte, a format version byte, the payload, and a CRC-32C that covers
//! the *key* as well as the payload, so a record copied under the wrong key is
//! caught as surely as a flipped bit. Decoders never panic on hostile input;
//! they return [`FormatError`], which the core turns into `EIO` plus a log line
//! naming the key.

pub mod blocks;
pub mod dirent;
pub mod envelope;
pub mod inode;
pub mod keys;
pub mod shares;
pub mod spill;
pub mod superblock;
pub mod xattrs;

pub use envelope::FormatError;

/// Version of the record layouts written by this build. Bumped when any
/// payload layout changes incompatibly; a volume whose superblock names a
/// newer version is refused at mount.
pub const FORMAT_VERSION: u32 = 1;

/// Linux limits, enforced exactly (see `limits.h`, `xattr.h`).
pub const NAME_MAX: usize = 255;
pub const XATTR_NAME_MAX: usize = 255;
pub const XATTR_SIZE_MAX: usize = 65_536;
pub const XATTR_LIST_MAX: usize = 65_536;
/// Most packed bytes of an inode's spill tier, all pages (the ZFS spill
/// block size).
pub const SPILL_MAX: usize = 65_536;
/// Longest symlink target accepted (`PATH_MAX`).
pub const SYMLINK_MAX: usize = 4095;
