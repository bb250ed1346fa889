//! The kernel's FUSE structures and constants, bit for bit.
//!
//! Mirrors `include/uapi/linux/fuse.h` at protocol 7.45; each struct is the
//! kernel's `struct fuse_x` named `X` in CamelCase. Every struct is
//! `#[repr(C)]` with explicit padding fields (the kernel pads each to 64
//! bits), so zerocopy can read and write them without `unsafe`. Fields are
//! the kernel's own types: times are `u64` there even though they are
//! signed seconds, and the conversion is left to `request`/`reply`.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Major version of the protocol (a different major cannot be spoken).
pub const FUSE_KERNEL_VERSION: u32 = 7;
/// Minor version of the header this file mirrors.
pub const FUSE_KERNEL_MINOR_VERSION: u32 = 45;
/// The node ID of the root inode.
pub const FUSE_ROOT_ID: u64 = 1;
/// The smallest read buffer `/dev/fuse` accepts.
pub const FUSE_MIN_READ_BUFFER: usize = 8192;

// ---- Opcodes (enum fuse_opcode) ----

pub const FUSE_LOOKUP: u32 = 1;
/// No reply.
pub const FUSE_FORGET: u32 = 2;
pub const FUSE_GETATTR: u32 = 3;
pub const FUSE_SETATTR: u32 = 4;
pub const FUSE_READLINK: u32 = 5;
pub const FUSE_SYMLINK: u32 = 6;
pub const FUSE_MKNOD: u32 = 8;
pub const FUSE_MKDIR: u32 = 9;
pub const FUSE_UNLINK: u32 = 10;
pub const FUSE_RMDIR: u32 = 11;
pub const FUSE_RENAME: u32 = 12;
pub const FUSE_LINK: u32 = 13;
pub const FUSE_OPEN: u32 = 14;
pub const FUSE_READ: u32 = 15;
pub const FUSE_WRITE: u32 = 16;
pub const FUSE_STATFS: u32 = 17;
pub const FUSE_RELEASE: u32 = 18;
pub const FUSE_FSYNC: u32 = 20;
pub const FUSE_SETXATTR: u32 = 21;
pub const FUSE_GETXATTR: u32 = 22;
pub const FUSE_LISTXATTR: u32 = 23;
pub const FUSE_REMOVEXATTR: u32 = 24;
pub const FUSE_FLUSH: u32 = 25;
pub const FUSE_INIT: u32 = 26;
pub const FUSE_OPENDIR: u32 = 27;
pub const FUSE_READDIR: u32 = 28;
pub const FUSE_RELEASEDIR: u32 = 29;
pub const FUSE_FSYNCDIR: u32 = 30;
pub const FUSE_GETLK: u32 = 31;
pub const FUSE_SETLK: u32 = 32;
pub const FUSE_SETLKW: u32 = 33;
pub const FUSE_ACCESS: u32 = 34;
pub const FUSE_CREATE: u32 = 35;
pub const FUSE_INTERRUPT: u32 = 36;
pub const FUSE_BMAP: u32 = 37;
pub const FUSE_DESTROY: u32 = 38;
pub const FUSE_IOCTL: u32 = 39;
pub const FUSE_POLL: u32 = 40;
pub const FUSE_NOTIFY_REPLY: u32 = 41;
/// No reply.
pub const FUSE_BATCH_FORGET: u32 = 42;
pub const FUSE_FALLOCATE: u32 = 43;
pub const FUSE_READDIRPLUS: u32 = 44;
pub const FUSE_RENAME2: u32 = 45;
pub const FUSE_LSEEK: u32 = 46;
pub const FUSE_COPY_FILE_RANGE: u32 = 47;
pub const FUSE_SETUPMAPPING: u32 = 48;
pub const FUSE_REMOVEMAPPING: u32 = 49;
pub const FUSE_SYNCFS: u32 = 50;
pub const FUSE_TMPFILE: u32 = 51;
pub const FUSE_STATX: u32 = 52;
pub const FUSE_COPY_FILE_RANGE_64: u32 = 53;
pub const CUSE_INIT: u32 = 4096;

// ---- Notification codes (enum fuse_notify_code), sent with unique 0 ----

pub const FUSE_NOTIFY_POLL: i32 = 1;
/// Body: [`NotifyInvalInodeOut`].
pub const FUSE_NOTIFY_INVAL_INODE: i32 = 2;
/// Body: [`NotifyInvalEntryOut`], the name, a NUL.
pub const FUSE_NOTIFY_INVAL_ENTRY: i32 = 3;
pub const FUSE_NOTIFY_STORE: i32 = 4;
pub const FUSE_NOTIFY_RETRIEVE: i32 = 5;
/// Body: [`NotifyDeleteOut`], the name, a NUL.
pub const FUSE_NOTIFY_DELETE: i32 = 6;
pub const FUSE_NOTIFY_RESEND: i32 = 7;
pub const FUSE_NOTIFY_INC_EPOCH: i32 = 8;
pub const FUSE_NOTIFY_PRUNE: i32 = 9;

// ---- fuse_setattr_in.valid ----

pub const FATTR_MODE: u32 = 1 << 0;
pub const FATTR_UID: u32 = 1 << 1;
pub const FATTR_GID: u32 = 1 << 2;
pub const FATTR_SIZE: u32 = 1 << 3;
pub const FATTR_ATIME: u32 = 1 << 4;
pub const FATTR_MTIME: u32 = 1 << 5;
pub const FATTR_FH: u32 = 1 << 6;
pub const FATTR_ATIME_NOW: u32 = 1 << 7;
pub const FATTR_MTIME_NOW: u32 = 1 << 8;
pub const FATTR_LOCKOWNER: u32 = 1 << 9;
pub const FATTR_CTIME: u32 = 1 << 10;
pub const FATTR_KILL_SUIDGID: u32 = 1 << 11;

// ---- fuse_open_out.open_flags ----

pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;
pub const FOPEN_NONSEEKABLE: u32 = 1 << 2;
pub const FOPEN_CACHE_DIR: u32 = 1 << 3;
pub const FOPEN_STREAM: u32 = 1 << 4;
pub const FOPEN_NOFLUSH: u32 = 1 << 5;
pub const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
pub const FOPEN_PASSTHROUGH: u32 = 1 << 7;

// ---- INIT flags: u64 here, the kernel splits them into flags | flags2 << 32 ----

pub const FUSE_ASYNC_READ: u64 = 1 << 0;
pub const FUSE_POSIX_LOCKS: u64 = 1 << 1;
pub const FUSE_FILE_OPS: u64 = 1 << 2;
pub const FUSE_ATOMIC_O_TRUNC: u64 = 1 << 3;
pub const FUSE_EXPORT_SUPPORT: u64 = 1 << 4;
pub const FUSE_BIG_WRITES: u64 = 1 << 5;
pub const FUSE_DONT_MASK: u64 = 1 << 6;
pub const FUSE_SPLICE_WRITE: u64 = 1 << 7;
pub const FUSE_SPLICE_MOVE: u64 = 1 << 8;
pub const FUSE_SPLICE_READ: u64 = 1 << 9;
pub const FUSE_FLOCK_LOCKS: u64 = 1 << 10;
pub const FUSE_HAS_IOCTL_DIR: u64 = 1 << 11;
pub const FUSE_AUTO_INVAL_DATA: u64 = 1 << 12;
pub const FUSE_DO_READDIRPLUS: u64 = 1 << 13;
pub const FUSE_READDIRPLUS_AUTO: u64 = 1 << 14;
pub const FUSE_ASYNC_DIO: u64 = 1 << 15;
pub const FUSE_WRITEBACK_CACHE: u64 = 1 << 16;
pub const FUSE_NO_OPEN_SUPPORT: u64 = 1 << 17;
pub const FUSE_PARALLEL_DIROPS: u64 = 1 << 18;
pub const FUSE_HANDLE_KILLPRIV: u64 = 1 << 19;
pub const FUSE_POSIX_ACL: u64 = 1 << 20;
pub const FUSE_ABORT_ERROR: u64 = 1 << 21;
pub const FUSE_MAX_PAGES: u64 = 1 << 22;
pub const FUSE_CACHE_SYMLINKS: u64 = 1 << 23;
pub const FUSE_NO_OPENDIR_SUPPORT: u64 = 1 << 24;
pub const FUSE_EXPLICIT_INVAL_DATA: u64 = 1 << 25;
pub const FUSE_MAP_ALIGNMENT: u64 = 1 << 26;
pub const FUSE_SUBMOUNTS: u64 = 1 << 27;
pub const FUSE_HANDLE_KILLPRIV_V2: u64 = 1 << 28;
pub const FUSE_SETXATTR_EXT: u64 = 1 << 29;
/// The INIT structures carry `flags2` (the bits from 32 up).
pub const FUSE_INIT_EXT: u64 = 1 << 30;
pub const FUSE_INIT_RESERVED: u64 = 1 << 31;
pub const FUSE_SECURITY_CTX: u64 = 1 << 32;
pub const FUSE_HAS_INODE_DAX: u64 = 1 << 33;
pub const FUSE_CREATE_SUPP_GROUP: u64 = 1 << 34;
pub const FUSE_HAS_EXPIRE_ONLY: u64 = 1 << 35;
pub const FUSE_DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
pub const FUSE_PASSTHROUGH: u64 = 1 << 37;
pub const FUSE_NO_EXPORT_SUPPORT: u64 = 1 << 38;
pub const FUSE_HAS_RESEND: u64 = 1 << 39;
pub const FUSE_ALLOW_IDMAP: u64 = 1 << 40;
pub const FUSE_OVER_IO_URING: u64 = 1 << 41;
pub const FUSE_REQUEST_TIMEOUT: u64 = 1 << 42;

// ---- Per-request flags ----

/// `fuse_release_in.release_flags`: flush before releasing.
pub const FUSE_RELEASE_FLUSH: u32 = 1 << 0;
/// `fuse_release_in.release_flags`: drop the flock of `lock_owner`.
pub const FUSE_RELEASE_FLOCK_UNLOCK: u32 = 1 << 1;
/// `fuse_getattr_in.getattr_flags`: `fh` is valid.
pub const FUSE_GETATTR_FH: u32 = 1 << 0;
/// `fuse_lk_in.lk_flags`: a BSD flock rather than a POSIX lock.
pub const FUSE_LK_FLOCK: u32 = 1 << 0;
/// `fuse_write_in.write_flags`: delayed write from the page cache.
pub const FUSE_WRITE_CACHE: u32 = 1 << 0;
/// `fuse_write_in.write_flags`: `lock_owner` is valid.
pub const FUSE_WRITE_LOCKOWNER: u32 = 1 << 1;
/// `fuse_write_in.write_flags`: kill suid and sgid.
pub const FUSE_WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// `fuse_read_in.read_flags`: `lock_owner` is valid.
pub const FUSE_READ_LOCKOWNER: u32 = 1 << 1;
/// `fuse_fsync_in.fsync_flags`: data only.
pub const FUSE_FSYNC_FDATASYNC: u32 = 1 << 0;
/// `fuse_open_in.open_flags`: kill suid and sgid if executable.
pub const FUSE_OPEN_KILL_SUIDGID: u32 = 1 << 0;
/// `fuse_setxattr_in.setxattr_flags`: clear sgid (setting an access ACL).
pub const FUSE_SETXATTR_ACL_KILL_SGID: u32 = 1 << 0;
/// `fuse_notify_inval_entry_out.flags`: expire the entry, keep it cached.
pub const FUSE_EXPIRE_ONLY: u32 = 1 << 0;
/// `fuse_attr.flags`: the object is a submount root.
pub const FUSE_ATTR_SUBMOUNT: u32 = 1 << 0;
/// `fuse_attr.flags`: DAX for this file.
pub const FUSE_ATTR_DAX: u32 = 1 << 1;

pub const FUSE_IOCTL_COMPAT: u32 = 1 << 0;
pub const FUSE_IOCTL_UNRESTRICTED: u32 = 1 << 1;
pub const FUSE_IOCTL_RETRY: u32 = 1 << 2;
pub const FUSE_IOCTL_32BIT: u32 = 1 << 3;
pub const FUSE_IOCTL_DIR: u32 = 1 << 4;
pub const FUSE_IOCTL_COMPAT_X32: u32 = 1 << 5;
pub const FUSE_IOCTL_MAX_IOV: u32 = 256;

/// The high bit of `unique`: the kernel resends this request.
pub const FUSE_UNIQUE_RESEND: u64 = 1 << 63;
/// `uid`/`gid` of a request the kernel could not map (idmapped mounts).
pub const FUSE_INVALID_UIDGID: u32 = u32::MAX;

/// Reply sizes for protocols older than 7.9; unused (safs needs 7.36).
pub const FUSE_COMPAT_ENTRY_OUT_SIZE: usize = 120;
pub const FUSE_COMPAT_ATTR_OUT_SIZE: usize = 96;
pub const FUSE_COMPAT_STATFS_SIZE: usize = 48;
pub const FUSE_COMPAT_INIT_OUT_SIZE: usize = 8;
pub const FUSE_COMPAT_22_INIT_OUT_SIZE: usize = 24;
/// `fuse_setxattr_in` without `FUSE_SETXATTR_EXT`: `size` and `flags` only.
pub const FUSE_COMPAT_SETXATTR_IN_SIZE: usize = 8;

// ---- Extensions after the arguments (fuse_in_header.total_extlen) ----

pub const FUSE_MAX_NR_SECCTX: u32 = 31;
pub const FUSE_EXT_GROUPS: u32 = 32;

// ---- io_uring ----

/// Size of a ring entry's header area (`fuse_in_header` / `fuse_out_header`).
pub const FUSE_URING_IN_OUT_HEADER_SZ: usize = 128;
/// Size of a ring entry's `op_in` area (the operation's own structure).
pub const FUSE_URING_OP_IN_OUT_SZ: usize = 128;
pub const FUSE_IO_URING_CMD_INVALID: u32 = 0;
/// Register an entry's buffer and fetch a request.
pub const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
/// Commit a reply and fetch the next request.
pub const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;

// ---- /dev/fuse ioctls: _IO*(FUSE_DEV_IOC_MAGIC, nr, type) ----

pub const FUSE_DEV_IOC_MAGIC: u32 = 229;
/// `_IOR(229, 0, uint32_t)`: attach a cloned fd to a session.
pub const FUSE_DEV_IOC_CLONE: u32 = ioc(2, 0, 4);
/// `_IOW(229, 1, struct fuse_backing_map)`: returns a backing id.
pub const FUSE_DEV_IOC_BACKING_OPEN: u32 = ioc(1, 1, size_of::<BackingMap>() as u32);
/// `_IOW(229, 2, uint32_t)`: closes a backing id.
pub const FUSE_DEV_IOC_BACKING_CLOSE: u32 = ioc(1, 2, 4);
/// `_IO(229, 3)`.
pub const FUSE_DEV_IOC_SYNC_INIT: u32 = ioc(0, 3, 0);

/// Linux's generic `_IOC(dir, FUSE_DEV_IOC_MAGIC, nr, size)` (dir: 1 write,
/// 2 read; x86, arm and riscv share this encoding).
const fn ioc(dir: u32, nr: u32, size: u32) -> u32 {
    (dir << 30) | (size << 16) | (FUSE_DEV_IOC_MAGIC << 8) | nr
}

// ---- Structures ----

/// `struct fuse_attr`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub flags: u32,
}

/// `struct fuse_sx_time` (statx's `struct statx_timestamp`).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct SxTime {
    pub tv_sec: i64,
    pub tv_nsec: u32,
    pub reserved: i32,
}

/// `struct fuse_statx` (statx(2)'s `struct statx`).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct Statx {
    pub mask: u32,
    pub blksize: u32,
    pub attributes: u64,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub mode: u16,
    pub spare0: [u16; 1],
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub attributes_mask: u64,
    pub atime: SxTime,
    pub btime: SxTime,
    pub ctime: SxTime,
    pub mtime: SxTime,
    pub rdev_major: u32,
    pub rdev_minor: u32,
    pub dev_major: u32,
    pub dev_minor: u32,
    pub spare2: [u64; 14],
}

/// `struct fuse_kstatfs`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct Kstatfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
    pub padding: u32,
    pub spare: [u32; 6],
}

/// `struct fuse_file_lock`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct FileLock {
    pub start: u64,
    pub end: u64,
    pub typ: u32,
    /// The owner's tgid.
    pub pid: u32,
}

/// `struct fuse_entry_out`: the reply to LOOKUP, MKNOD, MKDIR, SYMLINK,
/// LINK, and the first part of CREATE's.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct EntryOut {
    pub nodeid: u64,
    /// `nodeid:generation` must be unique for the filesystem's lifetime.
    pub generation: u64,
    pub entry_valid: u64,
    pub attr_valid: u64,
    pub entry_valid_nsec: u32,
    pub attr_valid_nsec: u32,
    pub attr: Attr,
}

/// `struct fuse_forget_in`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct ForgetIn {
    pub nlookup: u64,
}

/// `struct fuse_forget_one`: one node of a BATCH_FORGET.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct ForgetOne {
    pub nodeid: u64,
    pub nlookup: u64,
}

/// `struct fuse_batch_forget_in`, followed by `count` [`ForgetOne`].
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct BatchForgetIn {
    pub count: u32,
    pub dummy: u32,
}

/// `struct fuse_getattr_in`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct GetattrIn {
    pub getattr_flags: u32,
    pub dummy: u32,
    pub fh: u64,
}

/// `struct fuse_attr_out`: the reply to GETATTR and SETATTR.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct AttrOut {
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub dummy: u32,
    pub attr: Attr,
}

/// `struct fuse_statx_in`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct StatxIn {
    pub getattr_flags: u32,
    pub reserved: u32,
    pub fh: u64,
    pub sx_flags: u32,
    pub sx_mask: u32,
}

/// `struct fuse_statx_out`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct StatxOut {
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub flags: u32,
    pub spare: [u64; 2],
    pub stat: Statx,
}

/// `struct fuse_mknod_in` (16 bytes since 7.12).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct MknodIn {
    pub mode: u32,
    pub rdev: u32,
    pub umask: u32,
    pub padding: u32,
}

/// `struct fuse_mkdir_in`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct MkdirIn {
    pub mode: u32,
    pub umask: u32,
}

/// `struct fuse_rename_in` (RENAME, i.e. no flags).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct RenameIn {
    pub newdir: u64,
}

/// `struct fuse_rename2_in`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct Rename2In {
    pub newdir: u64,
    pub flags: u32,
    pub padding: u32,
}

/// `struct fuse_link_in`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct LinkIn {
    pub oldnodeid: u64,
}

/// `struct fuse_setattr_in`; `valid` (FATTR_*) says which fields count.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct SetattrIn {
    pub valid: u32,
    pub padding: u32,
    pub fh: u64,
    pub size: u64,
    pub lock_owner: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub unused4: u32,
    pub uid: u32,
    pub gid: u32,
    pub unused5: u32,
}

/// `struct fuse_open_in` (OPEN and OPENDIR).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct OpenIn {
    pub flags: u32,
    /// FUSE_OPEN_*.
    pub open_flags: u32,
}

/// `struct fuse_create_in`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct CreateIn {
    pub flags: u32,
    pub mode: u32,
    pub umask: u32,
    /// FUSE_OPEN_*.
    pub open_flags: u32,
}

/// `struct fuse_open_out`: the reply to OPEN, OPENDIR, and the second part
/// of CREATE's.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct OpenOut {
    pub fh: u64,
    /// FOPEN_*.
    pub open_flags: u32,
    /// With FOPEN_PASSTHROUGH: the id from FUSE_DEV_IOC_BACKING_OPEN.
    pub backing_id: i32,
}

/// `struct fuse_release_in` (RELEASE and RELEASEDIR).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct ReleaseIn {
    pub fh: u64,
    pub flags: u32,
    pub release_flags: u32,
    pub lock_owner: u64,
}

/// `struct fuse_flush_in`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct FlushIn {
    pub fh: u64,
    pub unused: u32,
    pub padding: u32,
    pub lock_owner: u64,
}

/// `struct fuse_read_in` (READ, READDIR, READDIRPLUS).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct ReadIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub read_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

/// `struct fuse_write_in`, followed by `size` bytes of data.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct WriteIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub write_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

/// `struct fuse_write_out`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct WriteOut {
    pub size: u32,
    pub padding: u32,
}

/// `struct fuse_statfs_out`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct StatfsOut {
    pub st: Kstatfs,
}

/// `struct fuse_fsync_in` (FSYNC and FSYNCDIR).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct FsyncIn {
    pub fh: u64,
    pub fsync_flags: u32,
    pub padding: u32,
}

/// `struct fuse_setxattr_in` as sent with `FUSE_SETXATTR_EXT`; without it
/// only the first [`FUSE_COMPAT_SETXATTR_IN_SIZE`] bytes are sent.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct SetxattrIn {
    pub size: u32,
    pub flags: u32,
    pub setxattr_flags: u32,
    pub padding: u32,
}

/// `struct fuse_getxattr_in` (GETXATTR and LISTXATTR).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct GetxattrIn {
    pub size: u32,
    pub padding: u32,
}

/// `struct fuse_getxattr_out`: the reply to a size query (`size` 0).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct GetxattrOut {
    pub size: u32,
    pub padding: u32,
}

/// `struct fuse_lk_in` (GETLK, SETLK, SETLKW).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct LkIn {
    pub fh: u64,
    pub owner: u64,
    pub lk: FileLock,
    pub lk_flags: u32,
    pub padding: u32,
}

/// `struct fuse_lk_out`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct LkOut {
    pub lk: FileLock,
}

/// `struct fuse_access_in`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct AccessIn {
    pub mask: u32,
    pub padding: u32,
}

/// `struct fuse_init_in` (64 bytes since 7.36; older kernels send the
/// first 16).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct InitIn {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    /// Flag bits 32..63, valid with `FUSE_INIT_EXT` in `flags`.
    pub flags2: u32,
    pub unused: [u32; 11],
}

/// `struct fuse_init_out`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct InitOut {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub time_gran: u32,
    pub max_pages: u16,
    pub map_alignment: u16,
    /// Flag bits 32..63, read with `FUSE_INIT_EXT` in `flags`.
    pub flags2: u32,
    pub max_stack_depth: u32,
    pub request_timeout: u16,
    pub unused: [u16; 11],
}

/// `struct fuse_interrupt_in`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct InterruptIn {
    pub unique: u64,
}

/// `struct fuse_bmap_in`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct BmapIn {
    pub block: u64,
    pub blocksize: u32,
    pub padding: u32,
}

/// `struct fuse_bmap_out`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct BmapOut {
    pub block: u64,
}

/// `struct fuse_ioctl_in`, followed by `in_size` bytes.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct IoctlIn {
    pub fh: u64,
    pub flags: u32,
    pub cmd: u32,
    pub arg: u64,
    pub in_size: u32,
    pub out_size: u32,
}

/// `struct fuse_ioctl_iovec`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct IoctlIovec {
    pub base: u64,
    pub len: u64,
}

/// `struct fuse_ioctl_out`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct IoctlOut {
    pub result: i32,
    pub flags: u32,
    pub in_iovs: u32,
    pub out_iovs: u32,
}

/// `struct fuse_poll_in`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct PollIn {
    pub fh: u64,
    pub kh: u64,
    pub flags: u32,
    pub events: u32,
}

/// `struct fuse_poll_out`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct PollOut {
    pub revents: u32,
    pub padding: u32,
}

/// `struct fuse_notify_poll_wakeup_out`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct NotifyPollWakeupOut {
    pub kh: u64,
}

/// `struct fuse_fallocate_in`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct FallocateIn {
    pub fh: u64,
    pub offset: u64,
    pub length: u64,
    pub mode: u32,
    pub padding: u32,
}

/// `struct fuse_in_header`: starts every request.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct InHeader {
    /// The whole request's length, this header included.
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// Length of the extensions after the arguments, in 8-byte units.
    pub total_extlen: u16,
    pub padding: u16,
}

/// `struct fuse_out_header`: starts every reply and notification.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct OutHeader {
    /// The whole reply's length, this header included.
    pub len: u32,
    /// 0 or a negative errno; for a notification (`unique` 0), its code.
    pub error: i32,
    pub unique: u64,
}

/// `struct fuse_dirent` without its name: the name (`namelen` bytes)
/// follows, then zeros up to the next 8-byte boundary.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct Dirent {
    pub ino: u64,
    /// The cookie of the next entry (the offset to resume after this one).
    pub off: u64,
    pub namelen: u32,
    /// The file type, `(mode & S_IFMT) >> 12` (a `DT_*` value).
    pub typ: u32,
}

/// `struct fuse_direntplus` without its name (as [`Dirent`]).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct Direntplus {
    pub entry_out: EntryOut,
    pub dirent: Dirent,
}

/// `FUSE_NAME_OFFSET`: where a dirent's name starts.
pub const FUSE_NAME_OFFSET: usize = size_of::<Dirent>();
/// `FUSE_NAME_OFFSET_DIRENTPLUS`.
pub const FUSE_NAME_OFFSET_DIRENTPLUS: usize = size_of::<Direntplus>();

/// `FUSE_REC_ALIGN` / `FUSE_DIRENT_ALIGN`: up to the next multiple of 8.
pub const fn rec_align(len: usize) -> usize {
    (len + 7) & !7
}

/// `struct fuse_notify_inval_inode_out`: drop cached data of `ino` in
/// `[off, off + len)` (`len` <= 0: to the end) and its attributes.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct NotifyInvalInodeOut {
    pub ino: u64,
    pub off: i64,
    pub len: i64,
}

/// `struct fuse_notify_inval_entry_out`, followed by the name and a NUL.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct NotifyInvalEntryOut {
    pub parent: u64,
    pub namelen: u32,
    /// FUSE_EXPIRE_ONLY.
    pub flags: u32,
}

/// `struct fuse_notify_delete_out`, followed by the name and a NUL.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct NotifyDeleteOut {
    pub parent: u64,
    pub child: u64,
    pub namelen: u32,
    pub padding: u32,
}

/// `struct fuse_notify_store_out`, followed by `size` bytes.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct NotifyStoreOut {
    pub nodeid: u64,
    pub offset: u64,
    pub size: u32,
    pub padding: u32,
}

/// `struct fuse_notify_retrieve_out`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct NotifyRetrieveOut {
    pub notify_unique: u64,
    pub nodeid: u64,
    pub offset: u64,
    pub size: u32,
    pub padding: u32,
}

/// `struct fuse_notify_retrieve_in` (the same size as `fuse_write_in`).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct NotifyRetrieveIn {
    pub dummy1: u64,
    pub offset: u64,
    pub size: u32,
    pub dummy2: u32,
    pub dummy3: u64,
    pub dummy4: u64,
}

/// `struct fuse_notify_prune_out`, followed by `count` node ids.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct NotifyPruneOut {
    pub count: u32,
    pub padding: u32,
    pub spare: u64,
}

/// `struct fuse_backing_map`: the argument of FUSE_DEV_IOC_BACKING_OPEN.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct BackingMap {
    pub fd: i32,
    pub flags: u32,
    pub padding: u64,
}

/// `struct fuse_lseek_in`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct LseekIn {
    pub fh: u64,
    pub offset: u64,
    pub whence: u32,
    pub padding: u32,
}

/// `struct fuse_lseek_out`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct LseekOut {
    pub offset: u64,
}

/// `struct fuse_copy_file_range_in`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct CopyFileRangeIn {
    pub fh_in: u64,
    pub off_in: u64,
    pub nodeid_out: u64,
    pub fh_out: u64,
    pub off_out: u64,
    pub len: u64,
    pub flags: u64,
}

/// `struct fuse_copy_file_range_out` (COPY_FILE_RANGE_64).
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct CopyFileRangeOut {
    pub bytes_copied: u64,
}

/// `struct fuse_syncfs_in`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct SyncfsIn {
    pub padding: u64,
}

/// `struct fuse_secctx`, followed by the context's name and label.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct Secctx {
    pub size: u32,
    pub padding: u32,
}

/// `struct fuse_secctx_header`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct SecctxHeader {
    pub size: u32,
    pub nr_secctx: u32,
}

/// `struct fuse_ext_header`: one extension after a request's arguments.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct ExtHeader {
    /// This extension's size, this header included.
    pub size: u32,
    pub typ: u32,
}

/// `struct fuse_uring_ent_in_out`.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct UringEntInOut {
    pub flags: u64,
    /// To quote in the COMMIT_AND_FETCH of this entry's reply.
    pub commit_id: u64,
    /// Bytes of the payload buffer in use.
    pub payload_sz: u32,
    pub padding: u32,
    pub reserved: u64,
}

/// `struct fuse_uring_req_header`: the fixed part of a ring entry.
#[repr(C)]
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, PartialEq, Eq)]
pub struct UringReqHeader {
    /// `fuse_in_header` (request) / `fuse_out_header` (reply) at its start.
    pub in_out: [u8; FUSE_URING_IN_OUT_HEADER_SZ],
    /// The operation's own structure (its first in-argument) at its start.
    pub op_in: [u8; FUSE_URING_OP_IN_OUT_SZ],
    pub ring_ent_in_out: UringEntInOut,
}

/// `struct fuse_uring_cmd_req`: in the SQE's 80-byte command area.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, Immutable, KnownLayout, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub struct UringCmdReq {
    pub flags: u64,
    pub commit_id: u64,
    /// The queue (one per CPU).
    pub qid: u16,
    pub padding: [u8; 6],
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes from the kernel header (summing its fields; all are naturally
    /// aligned with explicit padding, so C adds none).
    #[test]
    fn sizes_match_the_kernel() {
        let sizes: &[(&str, usize, usize)] = &[
            ("fuse_in_header", size_of::<InHeader>(), 40),
            ("fuse_out_header", size_of::<OutHeader>(), 16),
            ("fuse_attr", size_of::<Attr>(), 88),
            ("fuse_sx_time", size_of::<SxTime>(), 16),
            ("fuse_statx", size_of::<Statx>(), 256),
            ("fuse_kstatfs", size_of::<Kstatfs>(), 80),
            ("fuse_file_lock", size_of::<FileLock>(), 24),
            ("fuse_entry_out", size_of::<EntryOut>(), 128),
            ("fuse_forget_in", size_of::<ForgetIn>(), 8),
            ("fuse_forget_one", size_of::<ForgetOne>(), 16),
            ("fuse_batch_forget_in", size_of::<BatchForgetIn>(), 8),
            ("fuse_getattr_in", size_of::<GetattrIn>(), 16),
            ("fuse_attr_out", size_of::<AttrOut>(), 104),
            ("fuse_statx_in", size_of::<StatxIn>(), 24),
            ("fuse_statx_out", size_of::<StatxOut>(), 288),
            ("fuse_mknod_in", size_of::<MknodIn>(), 16),
            ("fuse_mkdir_in", size_of::<MkdirIn>(), 8),
            ("fuse_rename_in", size_of::<RenameIn>(), 8),
            ("fuse_rename2_in", size_of::<Rename2In>(), 16),
            ("fuse_link_in", size_of::<LinkIn>(), 8),
            ("fuse_setattr_in", size_of::<SetattrIn>(), 88),
            ("fuse_open_in", size_of::<OpenIn>(), 8),
            ("fuse_create_in", size_of::<CreateIn>(), 16),
            ("fuse_open_out", size_of::<OpenOut>(), 16),
            ("fuse_release_in", size_of::<ReleaseIn>(), 24),
            ("fuse_flush_in", size_of::<FlushIn>(), 24),
            ("fuse_read_in", size_of::<ReadIn>(), 40),
            ("fuse_write_in", size_of::<WriteIn>(), 40),
            ("fuse_write_out", size_of::<WriteOut>(), 8),
            ("fuse_statfs_out", size_of::<StatfsOut>(), 80),
            ("fuse_fsync_in", size_of::<FsyncIn>(), 16),
            ("fuse_setxattr_in", size_of::<SetxattrIn>(), 16),
            ("fuse_getxattr_in", size_of::<GetxattrIn>(), 8),
            ("fuse_getxattr_out", size_of::<GetxattrOut>(), 8),
            ("fuse_lk_in", size_of::<LkIn>(), 48),
            ("fuse_lk_out", size_of::<LkOut>(), 24),
            ("fuse_access_in", size_of::<AccessIn>(), 8),
            ("fuse_init_in", size_of::<InitIn>(), 64),
            ("fuse_init_out", size_of::<InitOut>(), 64),
            ("fuse_interrupt_in", size_of::<InterruptIn>(), 8),
            ("fuse_bmap_in", size_of::<BmapIn>(), 16),
            ("fuse_bmap_out", size_of::<BmapOut>(), 8),
            ("fuse_ioctl_in", size_of::<IoctlIn>(), 32),
            ("fuse_ioctl_iovec", size_of::<IoctlIovec>(), 16),
            ("fuse_ioctl_out", size_of::<IoctlOut>(), 16),
            ("fuse_poll_in", size_of::<PollIn>(), 24),
            ("fuse_poll_out", size_of::<PollOut>(), 8),
            (
                "fuse_notify_poll_wakeup_out",
                size_of::<NotifyPollWakeupOut>(),
                8,
            ),
            ("fuse_fallocate_in", size_of::<FallocateIn>(), 32),
            ("fuse_dirent (header)", size_of::<Dirent>(), 24),
            ("fuse_direntplus (header)", size_of::<Direntplus>(), 152),
            (
                "fuse_notify_inval_inode_out",
                size_of::<NotifyInvalInodeOut>(),
                24,
            ),
            (
                "fuse_notify_inval_entry_out",
                size_of::<NotifyInvalEntryOut>(),
                16,
            ),
            ("fuse_notify_delete_out", size_of::<NotifyDeleteOut>(), 24),
            ("fuse_notify_store_out", size_of::<NotifyStoreOut>(), 24),
            (
                "fuse_notify_retrieve_out",
                size_of::<NotifyRetrieveOut>(),
                32,
            ),
            ("fuse_notify_retrieve_in", size_of::<NotifyRetrieveIn>(), 40),
            ("fuse_notify_prune_out", size_of::<NotifyPruneOut>(), 16),
            ("fuse_backing_map", size_of::<BackingMap>(), 16),
            ("fuse_lseek_in", size_of::<LseekIn>(), 24),
            ("fuse_lseek_out", size_of::<LseekOut>(), 8),
            ("fuse_copy_file_range_in", size_of::<CopyFileRangeIn>(), 56),
            ("fuse_copy_file_range_out", size_of::<CopyFileRangeOut>(), 8),
            ("fuse_syncfs_in", size_of::<SyncfsIn>(), 8),
            ("fuse_secctx", size_of::<Secctx>(), 8),
            ("fuse_secctx_header", size_of::<SecctxHeader>(), 8),
            ("fuse_ext_header", size_of::<ExtHeader>(), 8),
            ("fuse_uring_ent_in_out", size_of::<UringEntInOut>(), 32),
            ("fuse_uring_req_header", size_of::<UringReqHeader>(), 288),
            ("fuse_uring_cmd_req", size_of::<UringCmdReq>(), 24),
        ];
        for &(name, got, want) in sizes {
            assert_eq!(got, want, "size of {name}");
        }
    }

    /// The write_in prefix the kernel's `FUSE_COMPAT_WRITE_IN_SIZE` names
    /// and the dirent offsets the header's macros compute.
    #[test]
    fn offsets_match_the_kernel() {
        assert_eq!(std::mem::offset_of!(WriteIn, lock_owner), 24);
        assert_eq!(
            std::mem::offset_of!(SetxattrIn, setxattr_flags),
            FUSE_COMPAT_SETXATTR_IN_SIZE
        );
        assert_eq!(
            std::mem::offset_of!(InitOut, time_gran),
            FUSE_COMPAT_22_INIT_OUT_SIZE
        );
        assert_eq!(std::mem::offset_of!(InitOut, flags2), 32);
        assert_eq!(std::mem::offset_of!(InitOut, request_timeout), 40);
        assert_eq!(std::mem::offset_of!(EntryOut, attr), 40);
        assert_eq!(FUSE_NAME_OFFSET, 24);
        assert_eq!(FUSE_NAME_OFFSET_DIRENTPLUS, 152);
        assert_eq!(std::mem::offset_of!(UringReqHeader, op_in), 128);
        assert_eq!(std::mem::offset_of!(UringReqHeader, ring_ent_in_out), 256);
        assert_eq!(std::mem::offset_of!(UringCmdReq, qid), 16);
    }

    #[test]
    fn rec_align_rounds_up_to_8() {
        assert_eq!(rec_align(0), 0);
        assert_eq!(rec_align(1), 8);
        assert_eq!(rec_align(24), 24);
        assert_eq!(rec_align(25), 32);
        assert_eq!(rec_align(31), 32);
    }

    /// The ioctl numbers as asm-generic's `_IOR`/`_IOW`/`_IO` expand them
    /// (direction in bits 30-31, size in 16-29, magic in 8-15).
    #[test]
    fn dev_ioctl_numbers() {
        assert_eq!(FUSE_DEV_IOC_CLONE, 0x8004_e500);
        assert_eq!(FUSE_DEV_IOC_BACKING_OPEN, 0x4010_e501);
        assert_eq!(FUSE_DEV_IOC_BACKING_CLOSE, 0x4004_e502);
        assert_eq!(FUSE_DEV_IOC_SYNC_INIT, 0x0000_e503);
    }

    #[test]
    fn high_init_flags_are_above_32_bits() {
        assert_eq!(FUSE_PASSTHROUGH, 1 << 37);
        assert_eq!(FUSE_OVER_IO_URING >> 32, 1 << 9);
        assert_eq!(FUSE_INIT_EXT, 0x4000_0000);
    }
}
