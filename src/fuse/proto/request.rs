//! Requests decoded from the kernel's bytes.
//!
//! The kernel describes a request as a list of in-arguments (`fuse_args`):
//! the operation's own structure first (zero-sized for LOOKUP, UNLINK,
//! RMDIR, SYMLINK and REMOVEXATTR, which carry only names), then names
//! (NUL-terminated), values or data, then optional extensions. Over
//! `/dev/fuse` they arrive back to back after the header. Over io_uring the
//! first argument, when not empty, is copied into the ring entry's `op_in`
//! area and the rest into the payload buffer. [`decode`] takes both: with
//! `op_in: None` the structure starts the payload.
//!
//! Structure sizes are those of protocol 7.36 and later: the adapter must
//! refuse older kernels at INIT. Only INIT itself is read from the shorter,
//! older layouts too, so that an old kernel gets a clear refusal.

use std::fmt;

use zerocopy::{FromBytes, IntoBytes};

use super::abi;

/// The request header (`fuse_in_header`) as the adapter needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The whole request's length as the kernel counts it (not checked
    /// against the bytes given: the transport bounds the buffers).
    pub len: u32,
    pub opcode: u32,
    /// Quoted by the reply; 0 never occurs in a request.
    pub unique: u64,
    /// The inode the request is about (the parent for name operations).
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// What decoding needs from INIT.
#[derive(Clone, Copy, Debug, Default)]
pub struct Negotiated {
    /// The minor version agreed on. Not consulted yet: every layout decoded
    /// is that of 7.36 and later.
    pub minor: u32,
    /// Both sides agreed on `FUSE_SETXATTR_EXT`: SETXATTR's structure is the
    /// 16-byte `fuse_setxattr_in` rather than its first 8 bytes.
    pub setxattr_ext: bool,
}

/// Why a request could not be decoded. The adapter answers it with an
/// error (the kernel sent something this decoder does not understand).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The header is shorter than `fuse_in_header`.
    ShortHeader { have: usize },
    /// An argument is shorter than its structure or its stated size.
    Short {
        opcode: u32,
        need: usize,
        have: usize,
    },
    /// A name without its terminating NUL, or empty.
    BadName { opcode: u32 },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DecodeError::ShortHeader { have } => {
                write!(f, "FUSE request header of {have} bytes (needs 40)")
            }
            DecodeError::Short { opcode, need, have } => {
                write!(
                    f,
                    "FUSE opcode {opcode}: argument needs {need} bytes, has {have}"
                )
            }
            DecodeError::BadName { opcode } => {
                write!(f, "FUSE opcode {opcode}: name empty or not NUL-terminated")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// A time to set: the caller's clock now, or a given time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeIn {
    Now,
    At { secs: i64, nsecs: u32 },
}

/// SETATTR: `None` for what is not to change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetattrIn {
    /// The file handle, when the change comes through an open file
    /// (`ftruncate`, `fchmod`...).
    pub fh: Option<u64>,
    pub size: Option<u64>,
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime: Option<TimeIn>,
    pub mtime: Option<TimeIn>,
    pub ctime: Option<(i64, u32)>,
    /// Kill suid/sgid (FUSE_HANDLE_KILLPRIV_V2: the kernel decided it).
    pub kill_suidgid: bool,
    pub lock_owner: Option<u64>,
}

/// INIT, the first request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InitIn {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    /// `flags | flags2 << 32` (flags2 only when the kernel set
    /// `FUSE_INIT_EXT`): the `abi::FUSE_*` INIT flags the kernel offers.
    pub flags: u64,
}

/// One decoded request. Names exclude their NUL; `flags` of OPEN, CREATE,
/// READ, WRITE, RELEASE are the `open(2)` flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op<'a> {
    Init(InitIn),
    Destroy,
    Lookup {
        name: &'a [u8],
    },
    /// No reply.
    Forget {
        nlookup: u64,
    },
    /// No reply. `(nodeid, nlookup)` pairs.
    BatchForget {
        nodes: Vec<(u64, u64)>,
    },
    Getattr {
        fh: Option<u64>,
    },
    Setattr(SetattrIn),
    Readlink,
    Symlink {
        name: &'a [u8],
        target: &'a [u8],
    },
    Mknod {
        name: &'a [u8],
        mode: u32,
        rdev: u32,
        umask: u32,
    },
    Mkdir {
        name: &'a [u8],
        mode: u32,
        umask: u32,
    },
    Unlink {
        name: &'a [u8],
    },
    Rmdir {
        name: &'a [u8],
    },
    /// RENAME (`flags` 0) and RENAME2 (`RENAME_NOREPLACE`, `_EXCHANGE`...).
    Rename {
        newdir: u64,
        name: &'a [u8],
        newname: &'a [u8],
        flags: u32,
    },
    /// A new name `name` in the header's `nodeid` for `oldnodeid`.
    Link {
        oldnodeid: u64,
        name: &'a [u8],
    },
    Open {
        flags: i32,
        open_flags: u32,
    },
    Read {
        fh: u64,
        offset: u64,
        size: u32,
        flags: i32,
        lock_owner: Option<u64>,
    },
    Write {
        fh: u64,
        offset: u64,
        data: &'a [u8],
        /// `abi::FUSE_WRITE_*`.
        write_flags: u32,
        flags: i32,
        lock_owner: Option<u64>,
    },
    Statfs,
    Release {
        fh: u64,
        flags: i32,
        /// `abi::FUSE_RELEASE_*`.
        release_flags: u32,
        /// With `FUSE_RELEASE_FLOCK_UNLOCK`: the owner whose flock to drop.
        lock_owner: Option<u64>,
    },
    Fsync {
        fh: u64,
        datasync: bool,
    },
    Setxattr {
        name: &'a [u8],
        value: &'a [u8],
        /// `XATTR_CREATE` / `XATTR_REPLACE`.
        flags: i32,
        /// `abi::FUSE_SETXATTR_*`; 0 unless `Negotiated::setxattr_ext`.
        setxattr_flags: u32,
    },
    /// `size` 0: a query of the value's size.
    Getxattr {
        name: &'a [u8],
        size: u32,
    },
    /// `size` 0: a query of the list's size.
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a [u8],
    },
    Flush {
        fh: u64,
        lock_owner: u64,
    },
    Opendir {
        flags: i32,
    },
    Readdir {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Readdirplus {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Releasedir {
        fh: u64,
        flags: i32,
    },
    Fsyncdir {
        fh: u64,
        datasync: bool,
    },
    Access {
        mask: u32,
    },
    Create {
        name: &'a [u8],
        flags: i32,
        mode: u32,
        umask: u32,
        open_flags: u32,
    },
    /// Interrupt the request `unique` (answered by that request, with
    /// EINTR, or by this one with EAGAIN if it is not known yet).
    Interrupt {
        unique: u64,
    },
    Fallocate {
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
    },
    Lseek {
        fh: u64,
        offset: i64,
        whence: i32,
    },
    Ioctl {
        fh: u64,
        cmd: u32,
        flags: u32,
        in_size: u32,
        out_size: u32,
    },
    /// GETLK (`test`), SETLK, SETLKW (`wait`): a record lock (`fcntl`,
    /// OFD) or, with `flock`, a whole-file `flock`.
    Lock {
        fh: u64,
        owner: u64,
        lk: abi::FileLock,
        flock: bool,
        test: bool,
        wait: bool,
    },
    /// Any other opcode (POLL, STATX, COPY_FILE_RANGE...).
    Other {
        opcode: u32,
    },
}

/// Decodes one request. `header`: the `fuse_in_header` (more bytes are
/// ignored). `op_in`: over io_uring, the entry's `op_in` area; `None` over
/// `/dev/fuse`. `payload`: everything after the header (`/dev/fuse`) or the
/// payload buffer's used bytes (io_uring). Never panics.
pub fn decode<'a>(
    header: &'a [u8],
    op_in: Option<&'a [u8]>,
    payload: &'a [u8],
    neg: Negotiated,
) -> Result<(Header, Op<'a>), DecodeError> {
    let (h, _) = abi::InHeader::read_from_prefix(header)
        .map_err(|_| DecodeError::ShortHeader { have: header.len() })?;
    let header = Header {
        len: h.len,
        opcode: h.opcode,
        unique: h.unique,
        nodeid: h.nodeid,
        uid: h.uid,
        gid: h.gid,
        pid: h.pid,
    };
    let mut args = Args {
        opcode: h.opcode,
        op_in,
        rest: payload,
    };
    Ok((header, decode_op(&mut args, neg)?))
}

fn decode_op<'a>(a: &mut Args<'a>, neg: Negotiated) -> Result<Op<'a>, DecodeError> {
    // The kernel's names for opcodes, flags and the operations' structures.
    use abi::*;
    Ok(match a.opcode {
        FUSE_INIT => Op::Init(init(a)?),
        FUSE_DESTROY => Op::Destroy,
        FUSE_LOOKUP => Op::Lookup { name: a.name()? },
        FUSE_FORGET => Op::Forget {
            nlookup: a.op::<ForgetIn>()?.nlookup,
        },
        FUSE_BATCH_FORGET => batch_forget(a)?,
        FUSE_GETATTR => {
            let i: GetattrIn = a.op()?;
            Op::Getattr {
                fh: (i.getattr_flags & FUSE_GETATTR_FH != 0).then_some(i.fh),
            }
        }
        FUSE_SETATTR => Op::Setattr(setattr(&a.op()?)),
        FUSE_READLINK => Op::Readlink,
        FUSE_SYMLINK => Op::Symlink {
            name: a.name()?,
            target: a.name()?,
        },
        FUSE_MKNOD => {
            let i: MknodIn = a.op()?;
            Op::Mknod {
                name: a.name()?,
                mode: i.mode,
                rdev: i.rdev,
                umask: i.umask,
            }
        }
        FUSE_MKDIR => {
            let i: MkdirIn = a.op()?;
            Op::Mkdir {
                name: a.name()?,
                mode: i.mode,
                umask: i.umask,
            }
        }
        FUSE_UNLINK => Op::Unlink { name: a.name()? },
        FUSE_RMDIR => Op::Rmdir { name: a.name()? },
        FUSE_RENAME => {
            let i: RenameIn = a.op()?;
            Op::Rename {
                newdir: i.newdir,
                name: a.name()?,
                newname: a.name()?,
                flags: 0,
            }
        }
        FUSE_RENAME2 => {
            let i: Rename2In = a.op()?;
            Op::Rename {
                newdir: i.newdir,
                name: a.name()?,
                newname: a.name()?,
                flags: i.flags,
            }
        }
        FUSE_LINK => {
            let i: LinkIn = a.op()?;
            Op::Link {
                oldnodeid: i.oldnodeid,
                name: a.name()?,
            }
        }
        FUSE_OPEN => {
            let i: OpenIn = a.op()?;
            Op::Open {
                flags: i.flags as i32,
                open_flags: i.open_flags,
            }
        }
        FUSE_READ => {
            let i: ReadIn = a.op()?;
            Op::Read {
                fh: i.fh,
                offset: i.offset,
                size: i.size,
                flags: i.flags as i32,
                lock_owner: (i.read_flags & FUSE_READ_LOCKOWNER != 0).then_some(i.lock_owner),
            }
        }
        FUSE_WRITE => {
            let i: WriteIn = a.op()?;
            Op::Write {
                fh: i.fh,
                offset: i.offset,
                data: a.bytes(i.size as usize)?,
                write_flags: i.write_flags,
                flags: i.flags as i32,
                lock_owner: (i.write_flags & FUSE_WRITE_LOCKOWNER != 0).then_some(i.lock_owner),
            }
        }
        FUSE_STATFS => Op::Statfs,
        FUSE_RELEASE => {
            let i: ReleaseIn = a.op()?;
            Op::Release {
                fh: i.fh,
                flags: i.flags as i32,
                release_flags: i.release_flags,
                lock_owner: (i.release_flags & FUSE_RELEASE_FLOCK_UNLOCK != 0)
                    .then_some(i.lock_owner),
            }
        }
        FUSE_FSYNC => {
            let i: FsyncIn = a.op()?;
            Op::Fsync {
                fh: i.fh,
                datasync: i.fsync_flags & FUSE_FSYNC_FDATASYNC != 0,
            }
        }
        FUSE_SETXATTR => {
            // Without SETXATTR_EXT the kernel sends only `size` and `flags`;
            // the rest of an io_uring op_in area is then stale.
            let size = if neg.setxattr_ext {
                size_of::<SetxattrIn>()
            } else {
                FUSE_COMPAT_SETXATTR_IN_SIZE
            };
            let i: SetxattrIn = a.op_prefix(size)?;
            Op::Setxattr {
                name: a.name()?,
                value: a.bytes(i.size as usize)?,
                flags: i.flags as i32,
                setxattr_flags: i.setxattr_flags,
            }
        }
        FUSE_GETXATTR => {
            let i: GetxattrIn = a.op()?;
            Op::Getxattr {
                name: a.name()?,
                size: i.size,
            }
        }
        FUSE_LISTXATTR => Op::Listxattr {
            size: a.op::<GetxattrIn>()?.size,
        },
        FUSE_REMOVEXATTR => Op::Removexattr { name: a.name()? },
        FUSE_FLUSH => {
            let i: FlushIn = a.op()?;
            Op::Flush {
                fh: i.fh,
                lock_owner: i.lock_owner,
            }
        }
        FUSE_OPENDIR => Op::Opendir {
            flags: a.op::<OpenIn>()?.flags as i32,
        },
        FUSE_READDIR => {
            let i: ReadIn = a.op()?;
            Op::Readdir {
                fh: i.fh,
                offset: i.offset,
                size: i.size,
            }
        }
        FUSE_READDIRPLUS => {
            let i: ReadIn = a.op()?;
            Op::Readdirplus {
                fh: i.fh,
                offset: i.offset,
                size: i.size,
            }
        }
        FUSE_RELEASEDIR => {
            let i: ReleaseIn = a.op()?;
            Op::Releasedir {
                fh: i.fh,
                flags: i.flags as i32,
            }
        }
        FUSE_FSYNCDIR => {
            let i: FsyncIn = a.op()?;
            Op::Fsyncdir {
                fh: i.fh,
                datasync: i.fsync_flags & FUSE_FSYNC_FDATASYNC != 0,
            }
        }
        FUSE_ACCESS => Op::Access {
            mask: a.op::<AccessIn>()?.mask,
        },
        FUSE_CREATE => {
            let i: CreateIn = a.op()?;
            Op::Create {
                name: a.name()?,
                flags: i.flags as i32,
                mode: i.mode,
                umask: i.umask,
                open_flags: i.open_flags,
            }
        }
        FUSE_GETLK | FUSE_SETLK | FUSE_SETLKW => {
            let i: LkIn = a.op()?;
            Op::Lock {
                fh: i.fh,
                owner: i.owner,
                lk: i.lk,
                flock: i.lk_flags & FUSE_LK_FLOCK != 0,
                test: a.opcode == FUSE_GETLK,
                wait: a.opcode == FUSE_SETLKW,
            }
        }
        FUSE_INTERRUPT => Op::Interrupt {
            unique: a.op::<InterruptIn>()?.unique,
        },
        FUSE_FALLOCATE => {
            let i: FallocateIn = a.op()?;
            Op::Fallocate {
                fh: i.fh,
                offset: i.offset,
                length: i.length,
                mode: i.mode as i32,
            }
        }
        FUSE_LSEEK => {
            let i: LseekIn = a.op()?;
            Op::Lseek {
                fh: i.fh,
                offset: i.offset as i64,
                whence: i.whence as i32,
            }
        }
        FUSE_IOCTL => {
            // The `in_size` bytes of input that follow are not decoded: safs
            // answers every ioctl without reading them.
            let i: IoctlIn = a.op()?;
            Op::Ioctl {
                fh: i.fh,
                cmd: i.cmd,
                flags: i.flags,
                in_size: i.in_size,
                out_size: i.out_size,
            }
        }
        opcode => Op::Other { opcode },
    })
}

/// INIT is read from any layout since 7.6's 16 bytes, so that the adapter,
/// not the decoder, refuses an old kernel (with a version it can log).
fn init(a: &mut Args<'_>) -> Result<InitIn, DecodeError> {
    const OLD: usize = 16; // major, minor, max_readahead, flags
    let full = size_of::<abi::InitIn>();
    let size = match a.op_in {
        Some(_) => full,
        None => a.rest.len().clamp(OLD, full),
    };
    let i: abi::InitIn = a.op_prefix(size)?;
    let mut flags = u64::from(i.flags);
    if flags & abi::FUSE_INIT_EXT != 0 {
        flags |= u64::from(i.flags2) << 32;
    }
    Ok(InitIn {
        major: i.major,
        minor: i.minor,
        max_readahead: i.max_readahead,
        flags,
    })
}

fn batch_forget<'a>(a: &mut Args<'a>) -> Result<Op<'a>, DecodeError> {
    let i: abi::BatchForgetIn = a.op()?;
    let one = size_of::<abi::ForgetOne>();
    // Checked before allocating: `count` is the kernel's word, not a size.
    let need = (i.count as usize).saturating_mul(one);
    let bytes = a.bytes(need)?;
    let nodes = bytes
        .chunks_exact(one)
        .filter_map(|c| abi::ForgetOne::read_from_bytes(c).ok())
        .map(|f| (f.nodeid, f.nlookup))
        .collect();
    Ok(Op::BatchForget { nodes })
}

fn setattr(i: &abi::SetattrIn) -> SetattrIn {
    use abi::{
        FATTR_ATIME, FATTR_ATIME_NOW, FATTR_CTIME, FATTR_FH, FATTR_GID, FATTR_KILL_SUIDGID,
        FATTR_LOCKOWNER, FATTR_MODE, FATTR_MTIME, FATTR_MTIME_NOW, FATTR_SIZE, FATTR_UID,
    };
    let has = |bit: u32| i.valid & bit != 0;
    let time = |set: u32, now: u32, secs: u64, nsecs: u32| {
        if has(now) {
            Some(TimeIn::Now)
        } else if has(set) {
            Some(TimeIn::At {
                secs: secs as i64,
                nsecs,
            })
        } else {
            None
        }
    };
    SetattrIn {
        fh: has(FATTR_FH).then_some(i.fh),
        size: has(FATTR_SIZE).then_some(i.size),
        mode: has(FATTR_MODE).then_some(i.mode),
        uid: has(FATTR_UID).then_some(i.uid),
        gid: has(FATTR_GID).then_some(i.gid),
        atime: time(FATTR_ATIME, FATTR_ATIME_NOW, i.atime, i.atimensec),
        mtime: time(FATTR_MTIME, FATTR_MTIME_NOW, i.mtime, i.mtimensec),
        ctime: has(FATTR_CTIME).then_some((i.ctime as i64, i.ctimensec)),
        kill_suidgid: has(FATTR_KILL_SUIDGID),
        lock_owner: has(FATTR_LOCKOWNER).then_some(i.lock_owner),
    }
}

/// A request's arguments after the header, consumed in order.
struct Args<'a> {
    opcode: u32,
    /// io_uring: where the operation's structure is (else: `rest`'s front).
    op_in: Option<&'a [u8]>,
    /// The arguments not consumed yet.
    rest: &'a [u8],
}

impl<'a> Args<'a> {
    fn short(&self, need: usize, have: usize) -> DecodeError {
        DecodeError::Short {
            opcode: self.opcode,
            need,
            have,
        }
    }

    /// The operation's own structure, whole.
    fn op<T: FromBytes>(&mut self) -> Result<T, DecodeError> {
        let bytes = self.op_bytes(size_of::<T>())?;
        T::read_from_bytes(bytes).map_err(|_| self.short(size_of::<T>(), bytes.len()))
    }

    /// The first `size` bytes of the operation's structure (a shorter
    /// layout the kernel sends), the rest zero.
    fn op_prefix<T: FromBytes + IntoBytes>(&mut self, size: usize) -> Result<T, DecodeError> {
        let bytes = self.op_bytes(size)?;
        let mut v = T::new_zeroed();
        let dst = v.as_mut_bytes();
        match dst.get_mut(..bytes.len()) {
            Some(prefix) => prefix.copy_from_slice(bytes),
            None => return Err(self.short(bytes.len(), dst.len())),
        }
        Ok(v)
    }

    fn op_bytes(&mut self, size: usize) -> Result<&'a [u8], DecodeError> {
        match self.op_in {
            Some(area) => area.get(..size).ok_or(self.short(size, area.len())),
            None => self.bytes(size),
        }
    }

    /// The next `n` bytes of the payload.
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let Some((taken, rest)) = self.rest.split_at_checked(n) else {
            return Err(self.short(n, self.rest.len()));
        };
        self.rest = rest;
        Ok(taken)
    }

    /// The next NUL-terminated, non-empty name, without its NUL.
    fn name(&mut self) -> Result<&'a [u8], DecodeError> {
        let bad = DecodeError::BadName {
            opcode: self.opcode,
        };
        let end = self.rest.iter().position(|&b| b == 0).ok_or(bad.clone())?;
        let (name, rest) = self.rest.split_at(end);
        if name.is_empty() {
            return Err(bad);
        }
        self.rest = &rest[1..];
        Ok(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const UNIQUE: u64 = 0xfeed_0000_0000_0042;
    const NODEID: u64 = 0x77;
    const EXT: Negotiated = Negotiated {
        minor: 45,
        setxattr_ext: true,
    };
    const NO_EXT: Negotiated = Negotiated {
        minor: 45,
        setxattr_ext: false,
    };

    fn header(opcode: u32, body_len: usize) -> Vec<u8> {
        abi::InHeader {
            len: (40 + body_len) as u32,
            opcode,
            unique: UNIQUE,
            nodeid: NODEID,
            uid: 1000,
            gid: 1001,
            pid: 4242,
            total_extlen: 0,
            padding: 0,
        }
        .as_bytes()
        .to_vec()
    }

    /// Each part followed by its NUL, as the kernel sends names.
    fn names(parts: &[&[u8]]) -> Vec<u8> {
        parts
            .iter()
            .flat_map(|p| p.iter().copied().chain([0]))
            .collect()
    }

    /// One request laid out both ways the kernel lays it out.
    struct Wire {
        opcode: u32,
        header: Vec<u8>,
        arg0_len: usize,
        /// `/dev/fuse`: the first argument, then the others.
        dev: Vec<u8>,
        /// io_uring: the 128-byte `op_in` area, the first argument at its
        /// start and stale bytes after it...
        op_in: Vec<u8>,
        /// ...and the other arguments in the payload buffer.
        payload: Vec<u8>,
    }

    impl Wire {
        /// `arg0`: the operation's structure (empty for name-only
        /// operations); `rest`: the other arguments, back to back.
        fn new(opcode: u32, arg0: &[u8], rest: &[u8]) -> Wire {
            let dev = [arg0, rest].concat();
            let mut op_in = vec![0xa5; abi::FUSE_URING_OP_IN_OUT_SZ];
            op_in[..arg0.len()].copy_from_slice(arg0);
            Wire {
                opcode,
                header: header(opcode, dev.len()),
                arg0_len: arg0.len(),
                dev,
                op_in,
                payload: rest.to_vec(),
            }
        }

        fn dev(&self, neg: Negotiated) -> Result<(Header, Op<'_>), DecodeError> {
            decode(&self.header, None, &self.dev, neg)
        }

        fn uring(&self, neg: Negotiated) -> Result<(Header, Op<'_>), DecodeError> {
            decode(&self.header, Some(&self.op_in), &self.payload, neg)
        }
    }

    /// Every decoded opcode, with distinct values in every field.
    fn cases() -> Vec<(Wire, Negotiated, Op<'static>)> {
        use abi::*;
        let read_in = |read_flags| ReadIn {
            fh: 0x1111,
            offset: 0x2222_0000_0000,
            size: 131072,
            read_flags,
            lock_owner: 0x3333,
            flags: 0o100002,
            padding: 0,
        };
        let release_in = ReleaseIn {
            fh: 0x4444,
            flags: 0o2,
            release_flags: FUSE_RELEASE_FLUSH | FUSE_RELEASE_FLOCK_UNLOCK,
            lock_owner: 0x5555,
        };
        let setattr_in = abi::SetattrIn {
            valid: FATTR_MODE
                | FATTR_UID
                | FATTR_GID
                | FATTR_SIZE
                | FATTR_ATIME
                | FATTR_MTIME
                | FATTR_MTIME_NOW
                | FATTR_FH
                | FATTR_LOCKOWNER
                | FATTR_CTIME
                | FATTR_KILL_SUIDGID,
            padding: 0,
            fh: 0x66,
            size: 1 << 40,
            lock_owner: 0x77,
            atime: (-5i64) as u64,
            mtime: 1_700_000_000,
            ctime: 1_700_000_001,
            atimensec: 11,
            mtimensec: 22,
            ctimensec: 33,
            mode: 0o104755,
            unused4: 0,
            uid: 501,
            gid: 502,
            unused5: 0,
        };
        let write_in = WriteIn {
            fh: 0x8888,
            offset: 4096,
            size: 5,
            write_flags: FUSE_WRITE_LOCKOWNER | FUSE_WRITE_KILL_SUIDGID,
            lock_owner: 0x9999,
            flags: 0o1,
            padding: 0,
        };
        let forgets = [
            ForgetOne {
                nodeid: 10,
                nlookup: 3,
            },
            ForgetOne {
                nodeid: 11,
                nlookup: 1 << 33,
            },
        ];
        let forget_bytes: Vec<u8> = forgets.iter().flat_map(|f| f.as_bytes().to_vec()).collect();
        let sx = SetxattrIn {
            size: 3,
            flags: 2,
            setxattr_flags: FUSE_SETXATTR_ACL_KILL_SGID,
            padding: 0,
        };
        let sx_rest = [names(&[b"user.k"]), b"v\0w".to_vec()].concat();
        vec![
            (
                Wire::new(FUSE_LOOKUP, &[], &names(&[b"file.txt"])),
                NO_EXT,
                Op::Lookup { name: b"file.txt" },
            ),
            (
                Wire::new(FUSE_FORGET, ForgetIn { nlookup: 12 }.as_bytes(), &[]),
                NO_EXT,
                Op::Forget { nlookup: 12 },
            ),
            (
                Wire::new(
                    FUSE_BATCH_FORGET,
                    BatchForgetIn { count: 2, dummy: 0 }.as_bytes(),
                    &forget_bytes,
                ),
                NO_EXT,
                Op::BatchForget {
                    nodes: vec![(10, 3), (11, 1 << 33)],
                },
            ),
            (
                Wire::new(
                    FUSE_GETATTR,
                    GetattrIn {
                        getattr_flags: FUSE_GETATTR_FH,
                        dummy: 0,
                        fh: 0xabc,
                    }
                    .as_bytes(),
                    &[],
                ),
                NO_EXT,
                Op::Getattr { fh: Some(0xabc) },
            ),
            (
                Wire::new(FUSE_SETATTR, setattr_in.as_bytes(), &[]),
                NO_EXT,
                Op::Setattr(super::SetattrIn {
                    fh: Some(0x66),
                    size: Some(1 << 40),
                    mode: Some(0o104755),
                    uid: Some(501),
                    gid: Some(502),
                    atime: Some(TimeIn::At {
                        secs: -5,
                        nsecs: 11,
                    }),
                    mtime: Some(TimeIn::Now),
                    ctime: Some((1_700_000_001, 33)),
                    kill_suidgid: true,
                    lock_owner: Some(0x77),
                }),
            ),
            (
                Wire::new(FUSE_SYMLINK, &[], &names(&[b"link", b"../target/x"])),
                NO_EXT,
                Op::Symlink {
                    name: b"link",
                    target: b"../target/x",
                },
            ),
            (
                Wire::new(
                    FUSE_MKNOD,
                    MknodIn {
                        mode: 0o20644,
                        rdev: 0x0801,
                        umask: 0o022,
                        padding: 0,
                    }
                    .as_bytes(),
                    &names(&[b"dev"]),
                ),
                NO_EXT,
                Op::Mknod {
                    name: b"dev",
                    mode: 0o20644,
                    rdev: 0x0801,
                    umask: 0o022,
                },
            ),
            (
                Wire::new(
                    FUSE_MKDIR,
                    MkdirIn {
                        mode: 0o40755,
                        umask: 0o027,
                    }
                    .as_bytes(),
                    &names(&[b"sub"]),
                ),
                NO_EXT,
                Op::Mkdir {
                    name: b"sub",
                    mode: 0o40755,
                    umask: 0o027,
                },
            ),
            (
                Wire::new(FUSE_UNLINK, &[], &names(&[b"gone"])),
                NO_EXT,
                Op::Unlink { name: b"gone" },
            ),
            (
                Wire::new(FUSE_RMDIR, &[], &names(&[b"dir"])),
                NO_EXT,
                Op::Rmdir { name: b"dir" },
            ),
            (
                Wire::new(
                    FUSE_RENAME,
                    RenameIn { newdir: 0x99 }.as_bytes(),
                    &names(&[b"old", b"new"]),
                ),
                NO_EXT,
                Op::Rename {
                    newdir: 0x99,
                    name: b"old",
                    newname: b"new",
                    flags: 0,
                },
            ),
            (
                Wire::new(
                    FUSE_RENAME2,
                    Rename2In {
                        newdir: 0x98,
                        flags: 2, // RENAME_EXCHANGE
                        padding: 0,
                    }
                    .as_bytes(),
                    &names(&[b"a", b"bb"]),
                ),
                NO_EXT,
                Op::Rename {
                    newdir: 0x98,
                    name: b"a",
                    newname: b"bb",
                    flags: 2,
                },
            ),
            (
                Wire::new(
                    FUSE_LINK,
                    LinkIn { oldnodeid: 0x55 }.as_bytes(),
                    &names(&[b"hard"]),
                ),
                NO_EXT,
                Op::Link {
                    oldnodeid: 0x55,
                    name: b"hard",
                },
            ),
            (
                Wire::new(
                    FUSE_OPEN,
                    OpenIn {
                        flags: 0o1000002,
                        open_flags: FUSE_OPEN_KILL_SUIDGID,
                    }
                    .as_bytes(),
                    &[],
                ),
                NO_EXT,
                Op::Open {
                    flags: 0o1000002,
                    open_flags: FUSE_OPEN_KILL_SUIDGID,
                },
            ),
            (
                Wire::new(FUSE_READ, read_in(FUSE_READ_LOCKOWNER).as_bytes(), &[]),
                NO_EXT,
                Op::Read {
                    fh: 0x1111,
                    offset: 0x2222_0000_0000,
                    size: 131072,
                    flags: 0o100002,
                    lock_owner: Some(0x3333),
                },
            ),
            (
                Wire::new(FUSE_WRITE, write_in.as_bytes(), b"hello"),
                NO_EXT,
                Op::Write {
                    fh: 0x8888,
                    offset: 4096,
                    data: b"hello",
                    write_flags: FUSE_WRITE_LOCKOWNER | FUSE_WRITE_KILL_SUIDGID,
                    flags: 0o1,
                    lock_owner: Some(0x9999),
                },
            ),
            (Wire::new(FUSE_STATFS, &[], &[]), NO_EXT, Op::Statfs),
            (
                Wire::new(FUSE_RELEASE, release_in.as_bytes(), &[]),
                NO_EXT,
                Op::Release {
                    fh: 0x4444,
                    flags: 0o2,
                    release_flags: FUSE_RELEASE_FLUSH | FUSE_RELEASE_FLOCK_UNLOCK,
                    lock_owner: Some(0x5555),
                },
            ),
            (
                Wire::new(
                    FUSE_FSYNC,
                    FsyncIn {
                        fh: 0x12,
                        fsync_flags: FUSE_FSYNC_FDATASYNC,
                        padding: 0,
                    }
                    .as_bytes(),
                    &[],
                ),
                NO_EXT,
                Op::Fsync {
                    fh: 0x12,
                    datasync: true,
                },
            ),
            (
                Wire::new(FUSE_SETXATTR, sx.as_bytes(), &sx_rest),
                EXT,
                Op::Setxattr {
                    name: b"user.k",
                    value: b"v\0w",
                    flags: 2,
                    setxattr_flags: FUSE_SETXATTR_ACL_KILL_SGID,
                },
            ),
            (
                // Without SETXATTR_EXT only `size` and `flags` are sent.
                Wire::new(FUSE_SETXATTR, &sx.as_bytes()[..8], &sx_rest),
                NO_EXT,
                Op::Setxattr {
                    name: b"user.k",
                    value: b"v\0w",
                    flags: 2,
                    setxattr_flags: 0,
                },
            ),
            (
                Wire::new(
                    FUSE_GETXATTR,
                    GetxattrIn {
                        size: 64,
                        padding: 0,
                    }
                    .as_bytes(),
                    &names(&[b"security.capability"]),
                ),
                NO_EXT,
                Op::Getxattr {
                    name: b"security.capability",
                    size: 64,
                },
            ),
            (
                Wire::new(
                    FUSE_LISTXATTR,
                    GetxattrIn {
                        size: 4096,
                        padding: 0,
                    }
                    .as_bytes(),
                    &[],
                ),
                NO_EXT,
                Op::Listxattr { size: 4096 },
            ),
            (
                Wire::new(FUSE_REMOVEXATTR, &[], &names(&[b"user.gone"])),
                NO_EXT,
                Op::Removexattr { name: b"user.gone" },
            ),
            (
                Wire::new(
                    FUSE_FLUSH,
                    FlushIn {
                        fh: 0x13,
                        unused: 0,
                        padding: 0,
                        lock_owner: 0x14,
                    }
                    .as_bytes(),
                    &[],
                ),
                NO_EXT,
                Op::Flush {
                    fh: 0x13,
                    lock_owner: 0x14,
                },
            ),
            (
                Wire::new(
                    FUSE_OPENDIR,
                    OpenIn {
                        flags: 0o200000,
                        open_flags: 0,
                    }
                    .as_bytes(),
                    &[],
                ),
                NO_EXT,
                Op::Opendir { flags: 0o200000 },
            ),
            (
                Wire::new(FUSE_READDIR, read_in(0).as_bytes(), &[]),
                NO_EXT,
                Op::Readdir {
                    fh: 0x1111,
                    offset: 0x2222_0000_0000,
                    size: 131072,
                },
            ),
            (
                Wire::new(FUSE_READDIRPLUS, read_in(0).as_bytes(), &[]),
                NO_EXT,
                Op::Readdirplus {
                    fh: 0x1111,
                    offset: 0x2222_0000_0000,
                    size: 131072,
                },
            ),
            (
                Wire::new(FUSE_RELEASEDIR, release_in.as_bytes(), &[]),
                NO_EXT,
                Op::Releasedir {
                    fh: 0x4444,
                    flags: 0o2,
                },
            ),
            (
                Wire::new(
                    FUSE_FSYNCDIR,
                    FsyncIn {
                        fh: 0x15,
                        fsync_flags: 0,
                        padding: 0,
                    }
                    .as_bytes(),
                    &[],
                ),
                NO_EXT,
                Op::Fsyncdir {
                    fh: 0x15,
                    datasync: false,
                },
            ),
            (
                Wire::new(
                    FUSE_ACCESS,
                    AccessIn {
                        mask: 6,
                        padding: 0,
                    }
                    .as_bytes(),
                    &[],
                ),
                NO_EXT,
                Op::Access { mask: 6 },
            ),
            (
                Wire::new(
                    FUSE_CREATE,
                    CreateIn {
                        flags: 0o100301,
                        mode: 0o100640,
                        umask: 0o002,
                        open_flags: FUSE_OPEN_KILL_SUIDGID,
                    }
                    .as_bytes(),
                    &names(&[b"new.file"]),
                ),
                NO_EXT,
                Op::Create {
                    name: b"new.file",
                    flags: 0o100301,
                    mode: 0o100640,
                    umask: 0o002,
                    open_flags: FUSE_OPEN_KILL_SUIDGID,
                },
            ),
            (
                Wire::new(
                    FUSE_INTERRUPT,
                    InterruptIn { unique: 0x4321 }.as_bytes(),
                    &[],
                ),
                NO_EXT,
                Op::Interrupt { unique: 0x4321 },
            ),
            (
                Wire::new(
                    FUSE_FALLOCATE,
                    FallocateIn {
                        fh: 0x16,
                        offset: 1 << 20,
                        length: 1 << 21,
                        mode: 3, // KEEP_SIZE | PUNCH_HOLE
                        padding: 0,
                    }
                    .as_bytes(),
                    &[],
                ),
                NO_EXT,
                Op::Fallocate {
                    fh: 0x16,
                    offset: 1 << 20,
                    length: 1 << 21,
                    mode: 3,
                },
            ),
            (
                Wire::new(
                    FUSE_LSEEK,
                    LseekIn {
                        fh: 0x17,
                        offset: 8192,
                        whence: 3, // SEEK_DATA
                        padding: 0,
                    }
                    .as_bytes(),
                    &[],
                ),
                NO_EXT,
                Op::Lseek {
                    fh: 0x17,
                    offset: 8192,
                    whence: 3,
                },
            ),
            (
                Wire::new(
                    FUSE_IOCTL,
                    IoctlIn {
                        fh: 0x18,
                        flags: FUSE_IOCTL_DIR,
                        cmd: 0x8008_6601, // FS_IOC_GETFLAGS
                        arg: 0x7fff_0000,
                        in_size: 0,
                        out_size: 8,
                    }
                    .as_bytes(),
                    &[],
                ),
                NO_EXT,
                Op::Ioctl {
                    fh: 0x18,
                    cmd: 0x8008_6601,
                    flags: FUSE_IOCTL_DIR,
                    in_size: 0,
                    out_size: 8,
                },
            ),
            (Wire::new(FUSE_READLINK, &[], &[]), NO_EXT, Op::Readlink),
            (Wire::new(FUSE_DESTROY, &[], &[]), NO_EXT, Op::Destroy),
            (
                Wire::new(
                    FUSE_SETLKW,
                    LkIn {
                        fh: 0x4444,
                        owner: 0x5555,
                        lk: FileLock {
                            start: 10,
                            end: 19,
                            typ: 1,
                            pid: 77,
                        },
                        lk_flags: FUSE_LK_FLOCK,
                        padding: 0,
                    }
                    .as_bytes(),
                    &[],
                ),
                NO_EXT,
                Op::Lock {
                    fh: 0x4444,
                    owner: 0x5555,
                    lk: FileLock {
                        start: 10,
                        end: 19,
                        typ: 1,
                        pid: 77,
                    },
                    flock: true,
                    test: false,
                    wait: true,
                },
            ),
            (
                Wire::new(FUSE_GETLK, LkIn::default().as_bytes(), &[]),
                NO_EXT,
                Op::Lock {
                    fh: 0,
                    owner: 0,
                    lk: FileLock::default(),
                    flock: false,
                    test: true,
                    wait: false,
                },
            ),
            (
                Wire::new(FUSE_STATX, &[], &[]),
                NO_EXT,
                Op::Other { opcode: FUSE_STATX },
            ),
            (
                Wire::new(0xdead, &[], &[1, 2, 3]),
                NO_EXT,
                Op::Other { opcode: 0xdead },
            ),
        ]
    }

    #[test]
    fn every_opcode_decodes_in_both_layouts() {
        let cases = cases();
        assert_eq!(cases.len(), 42);
        for (w, neg, want) in &cases {
            for (layout, got) in [("/dev/fuse", w.dev(*neg)), ("io_uring", w.uring(*neg))] {
                let (h, op) = got.unwrap_or_else(|e| panic!("{layout}: {e}"));
                let want_header = Header {
                    len: 40 + w.dev.len() as u32,
                    opcode: w.opcode,
                    unique: UNIQUE,
                    nodeid: NODEID,
                    uid: 1000,
                    gid: 1001,
                    pid: 4242,
                };
                assert_eq!(h, want_header, "{layout}, opcode {}", w.opcode);
                assert_eq!(&op, want, "{layout}");
            }
        }
    }

    #[test]
    fn every_truncation_is_an_error() {
        for (w, neg, _) in cases() {
            let opcode = w.opcode;
            for cut in 0..w.dev.len() {
                let got = decode(&w.header, None, &w.dev[..cut], neg);
                if matches!(got, Ok((_, Op::Other { .. }))) {
                    continue; // not decoded, so nothing to be short of
                }
                assert!(
                    got.is_err(),
                    "/dev/fuse, opcode {opcode}, cut at {cut}: {got:?}"
                );
            }
            for cut in 0..w.payload.len() {
                let got = decode(&w.header, Some(&w.op_in), &w.payload[..cut], neg);
                if matches!(got, Ok((_, Op::Other { .. }))) {
                    continue;
                }
                assert!(
                    got.is_err(),
                    "io_uring, opcode {opcode}, cut at {cut}: {got:?}"
                );
            }
            if w.arg0_len > 0 && !matches!(w.uring(neg), Ok((_, Op::Other { .. }))) {
                let area = &w.op_in[..w.arg0_len - 1];
                let got = decode(&w.header, Some(area), &w.payload, neg);
                assert!(
                    matches!(got, Err(DecodeError::Short { need, .. }) if need == w.arg0_len),
                    "io_uring op_in short, opcode {opcode}: {got:?}"
                );
            }
            let got = decode(&w.header[..39], None, &w.dev, neg);
            assert_eq!(got.unwrap_err(), DecodeError::ShortHeader { have: 39 });
        }
    }

    #[test]
    fn short_struct_reports_sizes() {
        let w = Wire::new(abi::FUSE_READ, &[0; 40], &[]);
        let got = decode(&w.header, None, &w.dev[..39], NO_EXT);
        assert_eq!(
            got.unwrap_err(),
            DecodeError::Short {
                opcode: abi::FUSE_READ,
                need: 40,
                have: 39
            }
        );
    }

    #[test]
    fn optional_fields_absent_without_their_flags() {
        use abi::*;
        let getattr = GetattrIn {
            getattr_flags: 0,
            dummy: 0,
            fh: 0xabc,
        };
        let w = Wire::new(FUSE_GETATTR, getattr.as_bytes(), &[]);
        assert_eq!(w.dev(NO_EXT).unwrap().1, Op::Getattr { fh: None });

        let read = ReadIn {
            fh: 1,
            offset: 2,
            size: 3,
            read_flags: 0,
            lock_owner: 0x3333,
            flags: 4,
            padding: 0,
        };
        let w = Wire::new(FUSE_READ, read.as_bytes(), &[]);
        let Op::Read { lock_owner, .. } = w.uring(NO_EXT).unwrap().1 else {
            panic!("not a read")
        };
        assert_eq!(lock_owner, None);

        let write = WriteIn {
            size: 1,
            write_flags: FUSE_WRITE_CACHE,
            lock_owner: 0x9999,
            ..Default::default()
        };
        let w = Wire::new(FUSE_WRITE, write.as_bytes(), b"x");
        let Op::Write {
            lock_owner,
            write_flags,
            ..
        } = w.dev(NO_EXT).unwrap().1
        else {
            panic!("not a write")
        };
        assert_eq!((lock_owner, write_flags), (None, FUSE_WRITE_CACHE));

        let release = ReleaseIn {
            fh: 5,
            flags: 0,
            release_flags: FUSE_RELEASE_FLUSH,
            lock_owner: 0x5555,
        };
        let w = Wire::new(FUSE_RELEASE, release.as_bytes(), &[]);
        assert_eq!(
            w.dev(NO_EXT).unwrap().1,
            Op::Release {
                fh: 5,
                flags: 0,
                release_flags: FUSE_RELEASE_FLUSH,
                lock_owner: None
            }
        );

        // Nothing valid: nothing to change, whatever the other fields hold.
        let setattr = abi::SetattrIn {
            valid: 0,
            fh: 1,
            size: 2,
            mode: 3,
            atime: 4,
            ..Default::default()
        };
        let w = Wire::new(FUSE_SETATTR, setattr.as_bytes(), &[]);
        assert_eq!(
            w.uring(NO_EXT).unwrap().1,
            Op::Setattr(super::SetattrIn::default())
        );

        // ATIME_NOW wins over ATIME; MTIME alone is a given time.
        let setattr = abi::SetattrIn {
            valid: FATTR_ATIME | FATTR_ATIME_NOW | FATTR_MTIME,
            atime: 9,
            mtime: 10,
            mtimensec: 999_999_999,
            ..Default::default()
        };
        let w = Wire::new(FUSE_SETATTR, setattr.as_bytes(), &[]);
        let Op::Setattr(s) = w.dev(NO_EXT).unwrap().1 else {
            panic!("not a setattr")
        };
        assert_eq!(s.atime, Some(TimeIn::Now));
        assert_eq!(
            s.mtime,
            Some(TimeIn::At {
                secs: 10,
                nsecs: 999_999_999
            })
        );
        assert_eq!((s.ctime, s.kill_suidgid, s.size), (None, false, None));
    }

    #[test]
    fn init_reads_flags2_only_with_init_ext() {
        use abi::*;
        let mut init = abi::InitIn {
            major: 7,
            minor: 45,
            max_readahead: 131072,
            flags: (FUSE_ASYNC_READ | FUSE_INIT_EXT) as u32,
            flags2: ((FUSE_PASSTHROUGH | FUSE_OVER_IO_URING) >> 32) as u32,
            unused: [0; 11],
        };
        let want = super::InitIn {
            major: 7,
            minor: 45,
            max_readahead: 131072,
            flags: FUSE_ASYNC_READ | FUSE_INIT_EXT | FUSE_PASSTHROUGH | FUSE_OVER_IO_URING,
        };
        let w = Wire::new(FUSE_INIT, init.as_bytes(), &[]);
        assert_eq!(w.dev(NO_EXT).unwrap().1, Op::Init(want));
        assert_eq!(w.uring(NO_EXT).unwrap().1, Op::Init(want));

        init.flags = FUSE_ASYNC_READ as u32;
        let w = Wire::new(FUSE_INIT, init.as_bytes(), &[]);
        let Op::Init(got) = w.dev(NO_EXT).unwrap().1 else {
            panic!("not an init")
        };
        assert_eq!(got.flags, FUSE_ASYNC_READ);
    }

    #[test]
    fn init_from_an_old_kernel_decodes_for_refusal() {
        let init = abi::InitIn {
            major: 7,
            minor: 31,
            max_readahead: 4096,
            flags: abi::FUSE_BIG_WRITES as u32,
            ..Default::default()
        };
        let w = Wire::new(abi::FUSE_INIT, &init.as_bytes()[..16], &[]);
        assert_eq!(
            w.dev(NO_EXT).unwrap().1,
            Op::Init(super::InitIn {
                major: 7,
                minor: 31,
                max_readahead: 4096,
                flags: abi::FUSE_BIG_WRITES
            })
        );
        for cut in 0..16 {
            assert!(
                decode(&w.header, None, &w.dev[..cut], NO_EXT).is_err(),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn names_must_be_terminated_and_non_empty() {
        use abi::*;
        let bad = |opcode| Err(DecodeError::BadName { opcode });
        for (opcode, arg0, rest) in [
            (FUSE_LOOKUP, vec![], b"\0".to_vec()),
            (FUSE_LOOKUP, vec![], b"abc".to_vec()),
            (FUSE_SYMLINK, vec![], b"a\0\0".to_vec()),
            (FUSE_RENAME, vec![0; 8], b"a\0b".to_vec()),
            (FUSE_MKDIR, vec![0; 8], b"\0x\0".to_vec()),
            (FUSE_REMOVEXATTR, vec![], vec![]),
        ] {
            let w = Wire::new(opcode, &arg0, &rest);
            assert_eq!(w.dev(NO_EXT).map(|_| ()), bad(opcode), "opcode {opcode}");
            assert_eq!(w.uring(NO_EXT).map(|_| ()), bad(opcode), "opcode {opcode}");
        }
    }

    /// What follows the last argument (extensions such as supplementary
    /// groups, `total_extlen * 8` bytes) is not taken as part of it.
    #[test]
    fn bytes_after_the_arguments_are_ignored() {
        use abi::*;
        let ext = [
            16u32.to_ne_bytes(),
            FUSE_EXT_GROUPS.to_ne_bytes(),
            1u32.to_ne_bytes(),
            100u32.to_ne_bytes(),
        ]
        .concat();
        let create = CreateIn {
            flags: 1,
            mode: 2,
            umask: 3,
            open_flags: 4,
        };
        let w = Wire::new(
            FUSE_CREATE,
            create.as_bytes(),
            &[names(&[b"f"]), ext.clone()].concat(),
        );
        assert_eq!(
            w.uring(NO_EXT).unwrap().1,
            Op::Create {
                name: b"f",
                flags: 1,
                mode: 2,
                umask: 3,
                open_flags: 4
            }
        );
        let write = WriteIn {
            size: 2,
            ..Default::default()
        };
        let w = Wire::new(
            FUSE_WRITE,
            write.as_bytes(),
            &[b"ab".as_slice(), &ext].concat(),
        );
        let Op::Write { data, .. } = w.dev(NO_EXT).unwrap().1 else {
            panic!("not a write")
        };
        assert_eq!(data, b"ab");
    }

    #[test]
    fn batch_forget_count_beyond_the_bytes_is_short() {
        let head = abi::BatchForgetIn {
            count: u32::MAX,
            dummy: 0,
        };
        let w = Wire::new(abi::FUSE_BATCH_FORGET, head.as_bytes(), &[0; 32]);
        assert_eq!(
            w.dev(NO_EXT).unwrap_err(),
            DecodeError::Short {
                opcode: abi::FUSE_BATCH_FORGET,
                need: u32::MAX as usize * 16,
                have: 32
            }
        );
    }

    #[test]
    fn errors_display_what_went_wrong() {
        let short = DecodeError::Short {
            opcode: 16,
            need: 40,
            have: 12,
        };
        assert_eq!(
            short.to_string(),
            "FUSE opcode 16: argument needs 40 bytes, has 12"
        );
        assert_eq!(
            DecodeError::BadName { opcode: 1 }.to_string(),
            "FUSE opcode 1: name empty or not NUL-terminated"
        );
        assert_eq!(
            DecodeError::ShortHeader { have: 3 }.to_string(),
            "FUSE request header of 3 bytes (needs 40)"
        );
    }

    proptest! {
        /// Arbitrary bytes under any opcode, in both layouts: an answer,
        /// never a panic, and the header read whenever it is whole.
        #[test]
        fn decode_never_panics_on_arbitrary_bytes(
            opcode in prop_oneof![0u32..60, any::<u32>()],
            header_len in prop_oneof![Just(40usize), 0usize..64],
            body in proptest::collection::vec(any::<u8>(), 0..600),
            op_in in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..160)),
            setxattr_ext in any::<bool>(),
        ) {
            let mut h = header(opcode, body.len());
            h.resize(header_len, 0);
            let neg = Negotiated { minor: 45, setxattr_ext };
            match decode(&h, op_in.as_deref(), &body, neg) {
                Ok((got, _)) => prop_assert_eq!(got.opcode, opcode),
                Err(DecodeError::ShortHeader { have }) => {
                    prop_assert!(header_len < 40);
                    prop_assert_eq!(have, header_len);
                }
                Err(_) => prop_assert!(header_len >= 40),
            }
        }

        /// Real requests with bytes changed and cut: still no panic, and a
        /// decoded request keeps its opcode.
        #[test]
        fn decode_never_panics_on_damaged_requests(
            case in 0usize..40,
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
            cut in any::<usize>(),
            uring in any::<bool>(),
        ) {
            let cases = cases();
            let (w, neg, _) = &cases[case % cases.len()];
            let (mut op_in, mut body) = if uring {
                (Some(w.op_in.clone()), w.payload.clone())
            } else {
                (None, w.dev.clone())
            };
            for (at, byte) in flips {
                let target = match op_in.as_mut() {
                    Some(area) if at % 2 == 0 => area,
                    _ => &mut body,
                };
                if !target.is_empty() {
                    let i = at % target.len();
                    target[i] = byte;
                }
            }
            body.truncate(cut % (body.len() + 1));
            if let Ok((h, _)) = decode(&w.header, op_in.as_deref(), &body, *neg) {
                prop_assert_eq!(h.opcode, w.opcode);
            }
        }
    }
}
