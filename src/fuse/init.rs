//! INIT: what safs asks of the kernel, and what the answer means for the
//! session (passthrough, io_uring, how requests are decoded).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::proto::abi;
use super::proto::reply::{self as enc, InitReply};
use super::proto::request::{Negotiated, Op};
use super::transport::{InitOutcome, RawRequest};
use super::{DataPath, SafsFuse, Transport};

/// The oldest protocol safs speaks: passthrough's and the request layouts
/// the decoder knows (Linux 6.9 and later speak 7.40 and up).
const MIN_MINOR: u32 = 36;
/// The newest it knows.
const MAX_MINOR: u32 = 45;
/// Largest write (and read) per request: 1 MiB.
const MAX_WRITE: u32 = 1 << 20;

/// Capabilities asked for whenever the kernel offers them. Each is asked
/// for on its own so that one the kernel lacks does not take the others
/// with it.
const WANTED: &[(u64, &str)] = &[
    (abi::FUSE_ASYNC_READ, "async_read"),
    (abi::FUSE_BIG_WRITES, "big_writes"),
    (abi::FUSE_MAX_PAGES, "max_pages"),
    // Directory listings carry attributes: `ls -l` needs no LOOKUP per
    // entry. Always plus (not READDIRPLUS_AUTO, which made the kernel send a
    // plain READDIR and then a READDIRPLUS for the same directory).
    (abi::FUSE_DO_READDIRPLUS, "readdirplus"),
    // See the OPENDIR handler.
    (abi::FUSE_NO_OPENDIR_SUPPORT, "no_opendir"),
    // The kernel enforces and caches ACLs (we inherit defaults and keep
    // them in step with chmod; see core::acl).
    (abi::FUSE_POSIX_ACL, "posix_acl"),
    // The umask arrives apart from the mode: a parent's default ACL, not
    // the umask, decides a new inode's permissions.
    (abi::FUSE_DONT_MASK, "dont_mask"),
    // Not FUSE_ATOMIC_O_TRUNC: with it, open(O_RDONLY | O_TRUNC) truncates
    // in OPEN, before the kernel's ETXTBSY check, so a running executable
    // could be cut to 0 bytes (and killed) while the caller gets ETXTBSY.
    // Without it the kernel checks first and then sends a SETATTR.
    // Symlink targets are cached in the page cache.
    (abi::FUSE_CACHE_SYMLINKS, "cache_symlinks"),
    // Lookups and readdirs in one directory may run concurrently.
    (abi::FUSE_PARALLEL_DIROPS, "parallel_dirops"),
    (abi::FUSE_EXPORT_SUPPORT, "export_support"),
];

impl SafsFuse {
    /// Answers INIT: the capabilities safs wants that the kernel offers,
    /// passthrough and io_uring as the options ask. An `Err` is the errno
    /// INIT is refused with (the mount then fails).
    pub(crate) fn init(&self, req: RawRequest<'_>) -> Result<InitOutcome, i32> {
        self.negotiate(req).map_err(|(errno, why)| {
            tracing::error!("{why}");
            let _ = self.refused.set(why);
            errno
        })
    }

    fn negotiate(&self, req: RawRequest<'_>) -> Result<InitOutcome, (i32, String)> {
        let neg = Negotiated {
            minor: MAX_MINOR,
            setxattr_ext: false,
        };
        let init = match super::proto::request::decode(req.header, req.op_in, req.payload, neg) {
            Ok((_, Op::Init(i))) => i,
            Ok(_) => return Err((libc::EPROTO, "the first request was not INIT".into())),
            Err(e) => return Err((libc::EPROTO, format!("malformed INIT: {e}"))),
        };
        if init.major != 7 || init.minor < MIN_MINOR {
            return Err((
                libc::EPROTO,
                format!(
                    "the kernel speaks FUSE {}.{}; safs needs 7.{MIN_MINOR} or later",
                    init.major, init.minor
                ),
            ));
        }
        let offered = init.flags;
        let mut flags = 0u64;
        for &(flag, name) in WANTED {
            if offered & flag != 0 {
                flags |= flag;
            } else {
                tracing::info!(capability = name, "kernel does not offer capability");
            }
        }
        // Locks that hold across mounts: kept by the shared engine. (On a
        // volume one daemon serves the kernel keeps them, as it would.)
        if self.fs.keeps_locks() {
            for flag in [abi::FUSE_POSIX_LOCKS, abi::FUSE_FLOCK_LOCKS] {
                if offered & flag != 0 {
                    flags |= flag;
                }
            }
        }
        let mut max_stack_depth = 0;
        let mut data_path = self.data_path;
        if self.fs.contents_sealed() {
            // The kernel would serve the sealed blocks as they are.
            if data_path == DataPath::Passthrough {
                return Err((
                    libc::EINVAL,
                    "passthrough cannot serve an encrypted volume's contents".into(),
                ));
            }
            data_path = DataPath::Daemon;
        }
        if data_path != DataPath::Daemon {
            if offered & abi::FUSE_PASSTHROUGH != 0 {
                flags |= abi::FUSE_PASSTHROUGH;
                max_stack_depth = 1;
                self.passthrough.store(true, Ordering::Relaxed);
            } else if data_path == DataPath::Passthrough {
                return Err((
                    libc::ENOSYS,
                    "the kernel does not offer FUSE passthrough, and -o passthrough requires it"
                        .into(),
                ));
            } else {
                tracing::warn!(
                    "kernel does not offer FUSE passthrough; file data goes through the daemon"
                );
            }
        }
        // safs clears set-id bits itself (the kernel then marks the
        // superblock SB_NOSEC: once a file is seen to carry no set-id bits
        // and no security.capability, its writes stop costing a GETXATTR
        // round trip each). Through the daemon it clears them on a WRITE,
        // as the kernel would; under passthrough writes never reach it, so
        // a writer's open clears what its writes would, and a chmod does
        // not set them while another process holds the file for writing
        // (core::files). Not on a shared volume: another mount's changes
        // could not clear the flag the kernel keeps on an inode.
        let passthrough = flags & abi::FUSE_PASSTHROUGH != 0;
        if offered & abi::FUSE_HANDLE_KILLPRIV_V2 != 0 && !(passthrough && self.fs.is_shared()) {
            flags |= abi::FUSE_HANDLE_KILLPRIV_V2;
            self.killpriv.store(true, Ordering::Relaxed);
            self.fs.clear_setid_at_open(passthrough);
        }
        let uring = match self.transport {
            Transport::Dev => false,
            _ if offered & abi::FUSE_OVER_IO_URING != 0 => true,
            Transport::Uring => {
                return Err((
                    libc::ENOSYS,
                    "the kernel does not offer FUSE over io_uring, and -o transport=uring \
                     requires it (CONFIG_FUSE_IO_URING, and \
                     /sys/module/fuse/parameters/enable_uring set to Y)"
                        .into(),
                ));
            }
            Transport::Auto => {
                tracing::info!(
                    "kernel does not offer FUSE over io_uring (enable_uring=N?); requests go over /dev/fuse"
                );
                false
            }
        };
        if uring {
            flags |= abi::FUSE_OVER_IO_URING;
            // Contents through the daemon: reads off the queue threads.
            if flags & abi::FUSE_PASSTHROUGH == 0 {
                let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
                let _ = self.readers.set(super::readers::Pool::start(
                    Arc::clone(&self.fs),
                    Arc::clone(&self.stats),
                    cpus,
                ));
            }
        }
        let minor = init.minor.min(MAX_MINOR);
        let _ = self.negotiated.set(Negotiated {
            minor,
            setxattr_ext: flags & abi::FUSE_SETXATTR_EXT != 0,
        });
        let page = 4096;
        tracing::info!(
            minor,
            passthrough = self.passthrough(),
            uring,
            killpriv_v2 = self.killpriv.load(Ordering::Relaxed),
            "FUSE session initialised"
        );
        Ok(InitOutcome {
            reply: enc::init_out(&InitReply {
                minor,
                max_readahead: init.max_readahead,
                flags,
                max_background: 16,
                congestion_threshold: 12,
                max_write: MAX_WRITE,
                time_gran: 1,
                max_pages: (MAX_WRITE.max(init.max_readahead)).div_ceil(page) as u16,
                max_stack_depth,
            }),
            uring,
            max_write: MAX_WRITE,
        })
    }
}
