//! The FUSE adapter: the only module that knows `fuser`.
//!
//! Consistency contract: safs is the only writer of its volume, so the
//! kernel may cache entries and attributes for long ([`TTL`]); every change
//! made through the mount is seen by the kernel as it makes it (it
//! invalidates what a request changes), and file data goes through kernel
//! passthrough when the kernel allows it.

mod answer;
mod attr;
pub mod proto;
pub mod session;
pub mod stats;
mod syncer;
pub mod transport;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use fuser::{
    BackingId, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

use crate::core::{self, Cookie, CoreError, Ctx, Fh, Fs, Ino, OpenMode, SetAttr, TimeSet};
use answer::{Answer, Entry};
use attr::{file_attr, request_time};
use stats::{Op, Stats};

/// Entry and attribute lifetime in the kernel's caches.
pub const TTL: Duration = Duration::from_secs(3600);

/// Flags for every opened regular file. `FOPEN_NOFLUSH`: no FLUSH request
/// on close — safs has nothing to do then (no write-back cache; POSIX locks
/// are kept by the kernel), so the round trip would be pure cost.
const FILE_OPEN_FLAGS: FopenFlags = FopenFlags::FOPEN_NOFLUSH;

/// How file data moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataPath {
    /// Passthrough when the kernel accepts it, daemon I/O otherwise.
    Auto,
    /// Passthrough or fail the mount.
    Passthrough,
    /// Always through the daemon.
    Daemon,
}

/// The one conversion from core errors to errnos. Corruption and I/O
/// failures were logged where they arose.
impl From<CoreError> for Errno {
    fn from(e: CoreError) -> Errno {
        Errno::from_i32(e.errno())
    }
}

fn ctx(req: &Request) -> Ctx {
    Ctx::new(req.uid(), req.gid(), req.pid())
}

pub struct SafsFuse {
    fs: Arc<Fs>,
    data_path: DataPath,
    /// Whether the kernel agreed to passthrough at init.
    passthrough: bool,
    /// Backing ids registered with the kernel. The kernel allows one backing
    /// file per inode at a time, so every open of an inode shares one id:
    /// held weakly by inode, strongly by each handle until its release.
    backing: Mutex<Backing>,
    stats: Arc<Stats>,
    /// Tells the kernel to drop what it caches; set once the session is up.
    notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
    /// The fsync worker's queue.
    syncs: std::sync::mpsc::Sender<syncer::Job>,
}

#[derive(Default)]
struct Backing {
    by_ino: HashMap<Ino, Weak<BackingId>>,
    by_fh: HashMap<Fh, Arc<BackingId>>,
}

impl SafsFuse {
    pub fn new(fs: Arc<Fs>, data_path: DataPath, stats: Arc<Stats>) -> Self {
        SafsFuse {
            data_path,
            passthrough: false,
            backing: Mutex::new(Backing::default()),
            stats,
            notifier: Arc::new(std::sync::OnceLock::new()),
            syncs: syncer::start(Arc::clone(&fs)),
            fs,
        }
    }

    /// Hands an fsync to the worker that owns it until the commit is durable.
    fn sync_job(&self, job: syncer::Job) {
        if let Err(std::sync::mpsc::SendError(job)) = self.syncs.send(job) {
            // The worker is gone (it never stops before the session): answer
            // rather than drop the reply.
            let reply = match job {
                syncer::Job::File { reply, .. } | syncer::Job::Dir { reply } => reply,
            };
            reply.error(Errno::from_i32(libc::EIO));
        }
    }

    /// Where the session's notifier goes once the session exists.
    pub fn notifier_slot(&self) -> Arc<std::sync::OnceLock<fuser::Notifier>> {
        Arc::clone(&self.notifier)
    }

    /// How long the kernel may keep `a`. Under passthrough a file open for
    /// writing can change through a shared mapping without a request
    /// (xfstests generic/080, 215): its attributes are not cached, so a
    /// `stat` asks, and the daemon answers from the backing file.
    fn attr_ttl(&self, a: &core::Attr) -> Duration {
        if self.passthrough && a.open_for_write {
            Duration::ZERO
        } else {
            TTL
        }
    }

    fn entry(&self, reply: ReplyEntry, r: core::Result<core::Attr>) {
        reply.answer(r.map(|a| Entry {
            attr_ttl: self.attr_ttl(&a),
            entry_ttl: TTL,
            attr: file_attr(&a),
            generation: Generation(a.generation.0),
        }));
    }

    fn attr(&self, reply: ReplyAttr, r: core::Result<core::Attr>) {
        reply.answer(r.map(|a| (self.attr_ttl(&a), file_attr(&a))));
    }

    /// The backing id to open handle `h` with, registering its file with
    /// the kernel if the inode has none yet; `None` means the daemon serves
    /// this handle's I/O.
    fn backing_for(
        &self,
        h: &core::Handle,
        register: impl FnOnce(&std::fs::File) -> std::io::Result<BackingId>,
    ) -> Option<Arc<BackingId>> {
        if !self.passthrough {
            return None;
        }
        let mut b = self.backing.lock();
        let id = match b.by_ino.get(&h.ino).and_then(Weak::upgrade) {
            Some(id) => id,
            None => match register(&h.file) {
                Ok(id) => {
                    let id = Arc::new(id);
                    b.by_ino.insert(h.ino, Arc::downgrade(&id));
                    id
                }
                Err(e) => {
                    tracing::warn!(error = %e, ino = h.ino.0, "kernel refused a passthrough backing file; serving it from the daemon");
                    return None;
                }
            },
        };
        b.by_fh.insert(h.fh, Arc::clone(&id));
        Some(id)
    }
}

impl SafsFuse {
    /// Feeds the entries of directory `ino` after cookie `offset` to `add`,
    /// a page of `page` at a time, until `add` says the reply is full or the
    /// directory ends.
    fn list(
        &self,
        ino: Ino,
        mut offset: Cookie,
        page: usize,
        mut add: impl FnMut(&core::DirEntry) -> core::Result<bool>,
    ) -> core::Result<()> {
        loop {
            let entries = self.fs.readdir(ino, offset, page)?;
            if entries.is_empty() {
                return Ok(());
            }
            for e in &entries {
                if add(e)? {
                    return Ok(());
                }
                offset = e.cookie;
            }
        }
    }
}

impl SafsFuse {
    /// A listing that starts at offset 0 reads the directory: its atime.
    /// (A listing the kernel serves from its own cache never comes here;
    /// the first one after a change always does, which is what `relatime`
    /// needs.)
    fn note_listing(&self, ino: Ino, offset: u64) {
        if offset == 0 {
            if let Err(e) = self.fs.note_dir_read(ino) {
                tracing::debug!(ino = ino.0, error = %e, "directory access time not updated");
            }
        }
    }
}

fn set_time(t: Option<TimeOrNow>) -> Option<TimeSet> {
    t.map(|t| match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(st) => TimeSet::At(request_time(st)),
    })
}

impl Filesystem for SafsFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Each capability is asked for on its own so that one the kernel
        // lacks does not take the others with it.
        let wanted = [
            // Directory listings carry attributes: `ls -l` needs no LOOKUP
            // per entry.
            // Always plus (not READDIRPLUS_AUTO, which made the kernel send a
            // plain READDIR and then a READDIRPLUS for the same directory).
            InitFlags::FUSE_DO_READDIRPLUS,
            // See `opendir`.
            InitFlags::FUSE_NO_OPENDIR_SUPPORT,
            // The kernel enforces and caches ACLs (we inherit defaults and
            // keep them in step with chmod; see core::acl).
            InitFlags::FUSE_POSIX_ACL,
            // The umask arrives apart from the mode: a parent's default ACL,
            // not the umask, decides a new inode's permissions.
            InitFlags::FUSE_DONT_MASK,
            // Not FUSE_ATOMIC_O_TRUNC: with it, open(O_RDONLY | O_TRUNC)
            // truncates in OPEN, before the kernel's ETXTBSY check, so a
            // running executable could be cut to 0 bytes (and killed) while
            // the caller gets ETXTBSY. Without it the kernel checks first and
            // then sends a SETATTR: one round trip more per O_TRUNC open.
            // Symlink targets are cached in the page cache.
            InitFlags::FUSE_CACHE_SYMLINKS,
            // Lookups and readdirs in one directory may run concurrently.
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_EXPORT_SUPPORT,
            InitFlags::FUSE_BIG_WRITES,
            InitFlags::FUSE_MAX_PAGES,
            // Not FUSE_SETXATTR_EXT: fuser 0.18 parses only the old layout.
        ];
        for flag in wanted {
            if let Err(missing) = config.add_capabilities(flag) {
                tracing::info!(?missing, "kernel does not offer capability");
            }
        }
        if self.fs.contents_sealed() {
            // The kernel would serve the sealed blocks as they are.
            if self.data_path == DataPath::Passthrough {
                tracing::error!("passthrough cannot serve an encrypted volume's contents");
                return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
            }
            self.data_path = DataPath::Daemon;
        }
        if self.data_path != DataPath::Daemon {
            let ok = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(1).is_ok();
            self.passthrough = ok;
            if !ok {
                if self.data_path == DataPath::Passthrough {
                    tracing::error!("kernel does not offer FUSE passthrough, and it was required");
                    return Err(std::io::Error::from_raw_os_error(libc::ENOSYS));
                }
                tracing::warn!(
                    "kernel does not offer FUSE passthrough; file data goes through the daemon"
                );
            }
        }
        let _ = config.set_max_write(1 << 20);
        tracing::info!(passthrough = self.passthrough, "FUSE session initialised");
        Ok(())
    }

    fn destroy(&mut self) {
        if let Err(e) = self.fs.close() {
            tracing::error!(error = %e, "final commit failed");
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _t = self.stats.start(Op::Lookup);
        let r = self.fs.lookup(Ino(parent.0), name.as_bytes());
        self.entry(reply, r);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let _t = self.stats.start(Op::Forget);
        self.fs.forget(Ino(ino.0), nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _t = self.stats.start(Op::Getattr);
        self.attr(reply, self.fs.getattr(Ino(ino.0)));
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _t = self.stats.start(Op::Setattr);
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: set_time(atime),
            mtime: set_time(mtime),
            ctime: ctime.map(request_time),
            fh: fh.map(|f| f.0),
        };
        self.attr(reply, self.fs.setattr(&ctx(req), Ino(ino.0), &set));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _t = self.stats.start(Op::Readlink);
        reply.answer(self.fs.readlink(Ino(ino.0)));
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _t = self.stats.start(Op::Mknod);
        let r = self.fs.make_node(
            &ctx(req),
            Ino(parent.0),
            name.as_bytes(),
            mode,
            umask,
            rdev,
            None,
        );
        self.entry(reply, r);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let _t = self.stats.start(Op::Mkdir);
        let mode = libc::S_IFDIR | (mode & 0o7777);
        let r = self.fs.make_node(
            &ctx(req),
            Ino(parent.0),
            name.as_bytes(),
            mode,
            umask,
            0,
            None,
        );
        self.entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.stats.start(Op::Unlink);
        reply.answer(self.fs.unlink(Ino(parent.0), name.as_bytes()))
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.stats.start(Op::Rmdir);
        reply.answer(self.fs.rmdir(Ino(parent.0), name.as_bytes()))
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _t = self.stats.start(Op::Symlink);
        let r = self.fs.make_node(
            &ctx(req),
            Ino(parent.0),
            link_name.as_bytes(),
            libc::S_IFLNK | 0o777,
            0,
            0,
            Some(target.as_os_str().as_bytes()),
        );
        self.entry(reply, r);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _t = self.stats.start(Op::Rename);
        let f = core::RenameFlags {
            noreplace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(RenameFlags::RENAME_EXCHANGE),
            whiteout: flags.contains(RenameFlags::RENAME_WHITEOUT),
        };
        reply.answer(self.fs.rename(
            &ctx(req),
            Ino(parent.0),
            name.as_bytes(),
            Ino(newparent.0),
            newname.as_bytes(),
            f,
        ));
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _t = self.stats.start(Op::Link);
        let r = self
            .fs
            .link(Ino(ino.0), Ino(newparent.0), newname.as_bytes());
        self.entry(reply, r);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.stats.start(Op::Open);
        match self
            .fs
            .open_as(&ctx(req), Ino(ino.0), OpenMode::from_flags(flags.0))
        {
            Ok(h) => {
                if h.writable && self.passthrough {
                    // The kernel's cached attributes would hide changes made
                    // through a shared mapping (see `attr_ttl`).
                    if let Some(n) = self.notifier.get() {
                        if let Err(e) = n.inval_inode(ino, -1, 0) {
                            tracing::debug!(ino = ino.0, error = %e, "attribute invalidation");
                        }
                    }
                }
                if let Some(id) = self.backing_for(&h, |f| reply.open_backing(f)) {
                    reply.opened_passthrough(FileHandle(h.fh.0), FILE_OPEN_FLAGS, &id);
                } else {
                    reply.opened(FileHandle(h.fh.0), FILE_OPEN_FLAGS);
                }
            }
            Err(e) => reply.error(e.into()),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _t = self.stats.start(Op::Create);
        match self.fs.create(
            &ctx(req),
            Ino(parent.0),
            name.as_bytes(),
            mode,
            umask,
            flags,
        ) {
            Ok((a, h)) => {
                let attr = file_attr(&a);
                let generation = Generation(a.generation.0);
                if let Some(id) = self.backing_for(&h, |f| reply.open_backing(f)) {
                    reply.created_passthrough(
                        &TTL,
                        &attr,
                        generation,
                        FileHandle(h.fh.0),
                        FILE_OPEN_FLAGS,
                        &id,
                    );
                } else {
                    reply.created(&TTL, &attr, generation, FileHandle(h.fh.0), FILE_OPEN_FLAGS);
                }
            }
            Err(e) => reply.error(e.into()),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _t = self.stats.start(Op::Read);
        reply.answer(self.fs.read(Fh(fh.0), offset, size));
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _t = self.stats.start(Op::Write);
        reply.answer(self.fs.write(Fh(fh.0), offset, data));
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _t = self.stats.start(Op::Flush);
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.stats.start(Op::Release);
        {
            let mut b = self.backing.lock();
            if let Some(id) = b.by_fh.remove(&Fh(fh.0)) {
                if Arc::strong_count(&id) == 1 {
                    b.by_ino.remove(&Ino(ino.0));
                }
            }
        }
        reply.answer(self.fs.release(Fh(fh.0)))
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.stats.start(Op::Fsync);
        self.sync_job(syncer::Job::File {
            fh: Fh(fh.0),
            datasync,
            reply,
        });
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.stats.start(Op::Opendir);
        // With FUSE_NO_OPENDIR_SUPPORT negotiated, ENOSYS here tells the
        // kernel to stop sending OPENDIR and RELEASEDIR for good; it then
        // opens directories itself with FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE,
        // so listings stay in its page cache (dropped when a directory's
        // mtime changes) and a directory walk costs two requests less per
        // directory. safs keeps no per-open directory state.
        reply.error(Errno::from_i32(libc::ENOSYS));
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _t = self.stats.start(Op::Readdir);
        self.note_listing(Ino(ino.0), offset);
        let r = self.list(Ino(ino.0), Cookie(offset), 256, |e| {
            Ok(reply.add(
                INodeNo(e.ino.0),
                e.cookie.0,
                attr::dtype(e.kind),
                OsStr::from_bytes(&e.name),
            ))
        });
        reply.answer(r);
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _t = self.stats.start(Op::Readdirplus);
        self.note_listing(Ino(ino.0), offset);
        let r = self.list(Ino(ino.0), Cookie(offset), 128, |e| {
            let a = match self.fs.entry_attr(e.ino) {
                Ok(a) => a,
                // Removed since the listing was read: skip it.
                Err(CoreError::NotFound) => return Ok(false),
                Err(err) => return Err(err),
            };
            let full = reply.add(
                INodeNo(e.ino.0),
                e.cookie.0,
                OsStr::from_bytes(&e.name),
                &self.attr_ttl(&a),
                &file_attr(&a),
                Generation(a.generation.0),
            );
            // The kernel takes a reference for every entry but the dots.
            if !full && e.name != b"." && e.name != b".." {
                self.fs.note_lookup(e.ino);
            }
            Ok(full)
        });
        reply.answer(r);
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _t = self.stats.start(Op::Releasedir);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.stats.start(Op::Fsyncdir);
        self.sync_job(syncer::Job::Dir { reply });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _t = self.stats.start(Op::Statfs);
        reply.answer(self.fs.statfs());
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _t = self.stats.start(Op::Setxattr);
        reply.answer(
            self.fs
                .setxattr(&ctx(req), Ino(ino.0), name.as_bytes(), value, flags),
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _t = self.stats.start(Op::Getxattr);
        reply.answer(
            self.fs
                .getxattr(Ino(ino.0), name.as_bytes())
                .map(|v| (v, size)),
        );
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _t = self.stats.start(Op::Listxattr);
        reply.answer(self.fs.listxattr(&ctx(req), Ino(ino.0)).map(|v| (v, size)));
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.stats.start(Op::Removexattr);
        reply.answer(self.fs.removexattr(Ino(ino.0), name.as_bytes()))
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        let _t = self.stats.start(Op::Access);
        // Only reached without default_permissions, which safs always sets.
        reply.ok();
    }

    fn fallocate(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _t = self.stats.start(Op::Fallocate);
        reply.answer(self.fs.fallocate(&ctx(req), Fh(fh.0), offset, length, mode))
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        let _t = self.stats.start(Op::Ioctl);
        // No ioctl of its own (file attribute flags such as chattr +i could
        // not be enforced for writes that go through passthrough): what a
        // local filesystem answers for an ioctl it does not know.
        reply.error(Errno::from_i32(libc::ENOTTY));
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let _t = self.stats.start(Op::Lseek);
        reply.answer(self.fs.lseek(Fh(fh.0), offset, whence));
    }
}
