//! The FUSE adapter: requests decoded by [`proto`], carried by
//! [`transport`] (`/dev/fuse` or io_uring), served by the core.
//!
//! Consistency contract: safs is the only writer of its volume, so the
//! kernel may cache entries and attributes for long ([`TTL`]); every change
//! made through the mount is seen by the kernel as it makes it (it
//! invalidates what a request changes), and file data goes through kernel
//! passthrough when the kernel allows it.

mod answer;
mod attr;
mod init;
mod locks;
pub mod proto;
mod readers;
pub mod session;
pub mod stats;
mod syncer;
pub mod transport;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use crate::core::{self, Cookie, CoreError, Ctx, Fh, Fs, Ino, OpenMode, SetAttr, TimeSet};
use answer::{Answer, Attrs, Data, Empty, Entries, Entry, Listing, Offset, Statfs, Written, Xattr};
use attr::{dtype, file_attr};
use proto::abi;
use proto::reply::{self as enc, DirBuf};
use proto::request::{Header, Negotiated, Op as Req, SetattrIn, TimeIn};
use stats::{Op, Stats};
use transport::{BackingId, Handler, Notifier, RawRequest, Reply};
use zerocopy::IntoBytes;

/// Entry and attribute lifetime in the kernel's caches.
pub const TTL: Duration = Duration::from_secs(3600);
/// The same on a volume other daemons also serve: their changes reach this
/// kernel by invalidations (`core::shared`), and this bounds how long a
/// reply racing with one (or a doorbell missed while its connection was
/// down) can keep something stale.
pub const SHARED_TTL: Duration = Duration::from_secs(10);

/// Flags for every opened regular file. `FOPEN_NOFLUSH`: no FLUSH request
/// on close — safs has nothing to do then (no write-back cache; POSIX locks
/// are kept by the kernel), so the round trip would be pure cost. On
/// volumes whose locks safs keeps, not for inodes it has locked: a close
/// drops its process's locks (see `locks`).
const FILE_OPEN_FLAGS: u32 = abi::FOPEN_NOFLUSH;

/// How often the dirty marks of uploaded files whose commits have become
/// durable are cleared (see `core::remote`).
const UNDIRTY_EVERY: Duration = Duration::from_secs(1);
/// Failed uploads are tried again every this many of those (5 s).
const RETRY_UPLOADS_TICKS: u64 = 5;

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

/// How requests reach the daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// io_uring when the kernel offers it, `/dev/fuse` otherwise.
    Auto,
    /// io_uring or fail the mount.
    Uring,
    /// `/dev/fuse` reads and writes.
    Dev,
}

/// How long a SETATTR that sets set-id bits waits for the RELEASE of a
/// writer that has exited (see `setattr_after_exited_writers`): it comes
/// within microseconds of the close; only a descriptor handed to another
/// process before its opener exited makes the wait run out.
const RELEASE_WAIT: Duration = Duration::from_millis(500);

/// How long the kernel may keep attributes `a`. Under passthrough a file
/// open for writing can change through a shared mapping without a request
/// (xfstests generic/080, 215): its attributes are not cached, so a `stat`
/// asks, and the daemon answers from the backing file.
fn attr_ttl(passthrough: bool, ttl: Duration, a: &core::Attr) -> Duration {
    if passthrough && a.open_for_write {
        Duration::ZERO
    } else {
        ttl
    }
}

fn ctx(h: &Header) -> Ctx {
    // Pid 0 with a request that carries credentials: a caller outside the
    // mount's PID namespace (requests sent without credentials, such as
    // RELEASE, use none).
    if h.pid == 0 {
        Ctx::unseen(h.uid, h.gid)
    } else {
        Ctx::new(h.uid, h.gid, h.pid)
    }
}

pub struct SafsFuse {
    fs: Arc<Fs>,
    data_path: DataPath,
    transport: Transport,
    /// Whether the kernel agreed to passthrough at init.
    passthrough: AtomicBool,
    /// FUSE_HANDLE_KILLPRIV_V2 agreed: the kernel leaves clearing set-id
    /// bits on write, truncate and chown to safs, flagging the requests.
    killpriv: AtomicBool,
    /// What INIT settled that decoding needs.
    negotiated: OnceLock<Negotiated>,
    /// Why INIT was refused, if it was (for the mount command's error).
    refused: OnceLock<String>,
    /// Backing ids registered with the kernel. The kernel allows one backing
    /// file per inode at a time, so every open of an inode shares one id:
    /// held weakly by inode, strongly by each handle until its release.
    backing: Mutex<Backing>,
    stats: Arc<Stats>,
    /// The session's connection: backing ids and cache invalidations; set
    /// once the session is mounted.
    conn: OnceLock<(transport::Conn, Notifier)>,
    /// The fsync worker's queue.
    syncs: std::sync::mpsc::Sender<syncer::Job>,
    /// Over io_uring: the pool READs of contents through the daemon go to
    /// (see `readers`); set at INIT.
    readers: OnceLock<readers::Pool>,
    /// File locks, on volumes whose engine keeps them (see `locks`).
    locks: OnceLock<Arc<locks::Locks>>,
}

#[derive(Default)]
struct Backing {
    by_ino: HashMap<Ino, Weak<BackingId>>,
    by_fh: HashMap<Fh, Arc<BackingId>>,
}

impl SafsFuse {
    pub fn new(fs: Arc<Fs>, data_path: DataPath, transport: Transport, stats: Arc<Stats>) -> Self {
        SafsFuse {
            data_path,
            transport,
            passthrough: AtomicBool::new(false),
            killpriv: AtomicBool::new(false),
            negotiated: OnceLock::new(),
            refused: OnceLock::new(),
            backing: Mutex::new(Backing::default()),
            stats,
            conn: OnceLock::new(),
            syncs: syncer::start(Arc::clone(&fs)),
            readers: OnceLock::new(),
            locks: OnceLock::new(),
            fs,
        }
    }

    /// Gives the adapter its connection once the session is mounted.
    pub(crate) fn set_conn(&self, conn: transport::Conn) -> std::io::Result<()> {
        let notifier = conn.notifier();
        if self.fs.is_shared() {
            // Other daemons' changes, as invalidations sent from a thread of
            // their own (see `core::shared` for why).
            let (tx, rx) = std::sync::mpsc::channel::<Vec<core::Inval>>();
            let n = notifier.clone();
            std::thread::Builder::new()
                .name("safs-inval".into())
                .spawn(move || {
                    for batch in rx {
                        for i in batch {
                            // ENOENT: the kernel holds nothing of it.
                            let _ = match i {
                                core::Inval::Inode(ino) => n.inval_inode(ino, 0, 0),
                                core::Inval::Entry(p, name) => n.inval_entry(p, &name),
                            };
                        }
                    }
                })?;
            let tx = std::sync::Mutex::new(tx);
            self.fs
                .follow_others(Box::new(move |batch| {
                    let _ = tx.lock().map(|t| t.send(batch));
                }))
                .map_err(|e| std::io::Error::other(e.to_string()))?;
        }
        if self.fs.keeps_locks() {
            let _ = self.locks.set(locks::Locks::start(Arc::clone(&self.fs))?);
        }
        if self.fs.data_store().is_some() && !self.fs.is_read_only() {
            // Closed files whose upload failed go up once the store is back,
            // and the dirty marks of uploads whose commits have become
            // durable go (a weak reference: the session's end drops the
            // filesystem).
            let fs = Arc::downgrade(&self.fs);
            std::thread::Builder::new()
                .name("safs-retry".into())
                .spawn(move || {
                    for tick in 1u64.. {
                        std::thread::sleep(UNDIRTY_EVERY);
                        let Some(fs) = fs.upgrade() else {
                            return;
                        };
                        fs.undirty_durable();
                        if tick % RETRY_UPLOADS_TICKS == 0 {
                            fs.retry_failed_uploads();
                        }
                    }
                })?;
        }
        let _ = self.conn.set((conn, notifier));
        Ok(())
    }

    fn passthrough(&self) -> bool {
        self.passthrough.load(Ordering::Relaxed)
    }

    /// Hands an fsync to the worker that owns it until the commit is durable.
    fn sync_job(&self, job: syncer::Job) {
        if let Err(std::sync::mpsc::SendError(job)) = self.syncs.send(job) {
            // The worker is gone (it never stops before the session): answer
            // rather than drop the reply.
            let reply = match job {
                syncer::Job::File { reply, .. }
                | syncer::Job::Dir { reply }
                | syncer::Job::Flush { reply, .. } => reply,
            };
            reply.0.error(libc::EIO);
        }
    }

    /// How long the kernel may keep `a` (see [`attr_ttl`]).
    fn attr_ttl(&self, a: &core::Attr) -> Duration {
        attr_ttl(self.passthrough(), self.ttl(), a)
    }

    /// How long the kernel may keep entries and attributes.
    fn ttl(&self) -> Duration {
        if self.fs.is_shared() { SHARED_TTL } else { TTL }
    }

    fn entry_of(&self, a: &core::Attr) -> Entry {
        Entry {
            attr_ttl: self.attr_ttl(a),
            entry_ttl: self.ttl(),
            attr: file_attr(a),
            generation: a.generation.0,
        }
    }

    fn entry(&self, reply: Reply, r: core::Result<core::Attr>) {
        Entries(reply).answer(r.map(|a| self.entry_of(&a)));
    }

    fn attr(&self, reply: Reply, r: core::Result<core::Attr>) {
        Attrs(reply).answer(r.map(|a| (self.attr_ttl(&a), file_attr(&a))));
    }

    /// The backing id to open handle `h` with, registering its file with
    /// the kernel if the inode has none yet; `None` means the daemon serves
    /// this handle's I/O.
    fn backing_for(&self, h: &core::Handle) -> Option<Arc<BackingId>> {
        // A file read before it is wholly fetched: the daemon serves every
        // handle of it until its last close (the kernel mixes no cached and
        // passed-through opens of one inode).
        if !self.passthrough() || h.bounded || self.fs.served_by_daemon(h.ino.0) {
            return None;
        }
        let (conn, _) = self.conn.get()?;
        let mut b = self.backing.lock();
        let id = match b.by_ino.get(&h.ino).and_then(Weak::upgrade) {
            Some(id) => id,
            None => match conn.open_backing(std::os::fd::AsFd::as_fd(&*h.file)) {
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

    /// The open reply of handle `h`: passthrough when it has a backing id.
    fn open_out(&self, h: &core::Handle) -> abi::OpenOut {
        // A FLUSH at each close costs a round trip (+20 µs per open and
        // close here): asked for only on inodes this daemon has locked.
        // And at every close of a file open for writing on a volume other
        // nodes share: the close puts its contents in the store.
        let flags = match self.locks.get() {
            Some(l) if l.has_locked(h.ino.0) => 0,
            _ if h.writable && self.fs.uploads_at_close() => 0,
            _ => FILE_OPEN_FLAGS,
        };
        match self.backing_for(h) {
            Some(id) => enc::open_out(h.fh.0, flags | abi::FOPEN_PASSTHROUGH, id.id()),
            None => enc::open_out(h.fh.0, flags, 0),
        }
    }

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

    /// A READDIRPLUS reply of at most `size` bytes: the entries after
    /// cookie `offset` with their attributes. Entries are read a page at a
    /// time, a page being about what the reply can hold, and the attributes
    /// of a page in one go (one engine call for the inodes not cached: a
    /// cold `ls -l` or `du` reads a directory's inodes together).
    fn list_plus(&self, ino: Ino, mut offset: Cookie, size: usize) -> core::Result<DirBuf> {
        // The smallest record: entry_out and dirent headers, a short name.
        const SMALLEST: usize = size_of::<abi::EntryOut>() + size_of::<abi::Dirent>() + 8;
        let page = (size / SMALLEST).clamp(1, 128);
        let mut buf = DirBuf::new(size);
        // The kernel takes a reference for every entry sent but the dots.
        // They are counted with the attributes (see `Fs::entry_attrs`) and
        // given back for entries that do not go out after all.
        let mut sent: Vec<Ino> = Vec::new();
        let give_back = |inos: Vec<Ino>| {
            for i in inos {
                self.fs.forget(i, 1);
            }
        };
        loop {
            let entries = match self.fs.readdir(ino, offset, page) {
                Ok(e) => e,
                Err(err) => {
                    give_back(sent);
                    return Err(err);
                }
            };
            if entries.is_empty() {
                return Ok(buf);
            }
            let inos: Vec<Ino> = entries.iter().map(|e| e.ino).collect();
            let counted: Vec<bool> = entries
                .iter()
                .map(|e| e.name != b"." && e.name != b"..")
                .collect();
            let attrs = self.fs.entry_attrs(&inos, &counted);
            let mut page = entries.iter().zip(attrs).zip(counted);
            let mut stopped = None;
            for ((e, a), count) in page.by_ref() {
                match a {
                    Ok(a) => {
                        let out = self.entry_of(&a).out();
                        if !buf.add_plus(&out, e.cookie.0, dtype(e.kind), &e.name) {
                            stopped = Some(Ok(count.then_some(e.ino)));
                            break;
                        }
                        offset = e.cookie;
                        if count {
                            sent.push(e.ino);
                        }
                    }
                    // Removed since the listing was read: skipped.
                    Err(CoreError::NotFound) => offset = e.cookie,
                    Err(err) => {
                        stopped = Some(Err(err));
                        break;
                    }
                }
            }
            // Entries read but not sent give their references back.
            let mut unsent: Vec<Ino> = page
                .filter(|((_, a), count)| *count && a.is_ok())
                .map(|((e, _), _)| e.ino)
                .collect();
            match stopped {
                None => give_back(unsent),
                Some(Ok(full)) => {
                    unsent.extend(full);
                    give_back(unsent);
                    return Ok(buf);
                }
                Some(Err(err)) => {
                    // The reply is the error: nothing is sent.
                    unsent.append(&mut sent);
                    give_back(unsent);
                    return Err(err);
                }
            }
        }
    }

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

    /// Final commit when the kernel ends the session.
    pub(crate) fn destroy(&self) {
        if let Some(l) = self.locks.get() {
            l.stop();
        }
        if let Err(e) = self.fs.close() {
            tracing::error!(error = %e, "final commit failed");
        }
    }
}

fn set_time(t: Option<TimeIn>) -> Option<TimeSet> {
    t.map(|t| match t {
        TimeIn::Now => TimeSet::Now,
        TimeIn::At { secs, nsecs } => TimeSet::At(core::Timestamp {
            sec: secs,
            nsec: nsecs,
        }),
    })
}

impl Handler for SafsFuse {
    fn handle(&self, req: RawRequest<'_>, reply: Reply) {
        let neg = self.negotiated.get().copied().unwrap_or_default();
        match proto::request::decode(req.header, req.op_in, req.payload, neg) {
            Ok((h, op)) => self.serve(&h, op, reply),
            Err(e) => {
                tracing::warn!(error = %e, "malformed request");
                reply.error(libc::EIO);
            }
        }
    }
}

impl SafsFuse {
    /// One request: the operation's core call and its reply.
    fn serve(&self, h: &Header, op: Req<'_>, reply: Reply) {
        let ino = Ino(h.nodeid);
        match op {
            // INIT is answered by the session before any other request.
            Req::Init(_) => reply.error(libc::EIO),
            Req::Destroy => {
                self.destroy();
                reply.send(&[]);
            }
            // The kernel expects no answer.
            Req::Interrupt { unique } => {
                if let Some(l) = self.locks.get() {
                    l.interrupt(unique);
                }
                reply.none();
            }
            Req::Lock {
                fh,
                owner,
                lk,
                flock,
                test,
                wait,
            } => match self.locks.get() {
                Some(l) => l.request(h.unique, ino.0, fh, owner, lk, flock, (test, wait), reply),
                None => reply.error(libc::ENOSYS),
            },
            Req::Forget { nlookup } => {
                let _t = self.stats.start(Op::Forget);
                self.fs.forget(ino, nlookup);
                reply.none();
            }
            Req::BatchForget { nodes } => {
                for (node, nlookup) in nodes {
                    let _t = self.stats.start(Op::Forget);
                    self.fs.forget(Ino(node), nlookup);
                }
                reply.none();
            }
            Req::Lookup { name } => {
                let _t = self.stats.start(Op::Lookup);
                match self.fs.lookup(ino, name) {
                    // A negative entry the kernel may keep (node id 0 with a
                    // lifetime; ENOENT would not be cached): safs is the only
                    // writer, and every name made through the mount replaces
                    // the kernel's negative dentry as it is made. So a
                    // `stat` then `create` of a new name (Samba's pattern)
                    // costs one LOOKUP, and repeated probes of absent names
                    // none.
                    Err(CoreError::NotFound) => {
                        let out =
                            enc::entry_out(0, 0, self.ttl(), Duration::ZERO, abi::Attr::default());
                        reply.send(&[out.as_bytes()]);
                    }
                    r => self.entry(reply, r),
                }
            }
            Req::Getattr { .. } => {
                let _t = self.stats.start(Op::Getattr);
                self.attr(reply, self.fs.getattr(ino));
            }
            Req::Setattr(s) => {
                let _t = self.stats.start(Op::Setattr);
                let set = set_attr(s);
                if self.fs.setid_waits_for_exited_writers(ino, &set) {
                    self.setattr_after_exited_writers(ctx(h), ino, set, reply);
                } else {
                    self.attr(reply, self.fs.setattr(&ctx(h), ino, &set));
                }
            }
            Req::Readlink => {
                let _t = self.stats.start(Op::Readlink);
                Data(reply).answer(self.fs.readlink(ino));
            }
            Req::Mknod {
                name,
                mode,
                rdev,
                umask,
            } => {
                let _t = self.stats.start(Op::Mknod);
                let r = self
                    .fs
                    .make_node(&ctx(h), ino, name, mode, umask, rdev, None);
                self.entry(reply, r);
            }
            Req::Mkdir { name, mode, umask } => {
                let _t = self.stats.start(Op::Mkdir);
                let mode = libc::S_IFDIR | (mode & 0o7777);
                let r = self.fs.make_node(&ctx(h), ino, name, mode, umask, 0, None);
                self.entry(reply, r);
            }
            Req::Symlink { name, target } => {
                let _t = self.stats.start(Op::Symlink);
                let mode = libc::S_IFLNK | 0o777;
                let r = self
                    .fs
                    .make_node(&ctx(h), ino, name, mode, 0, 0, Some(target));
                self.entry(reply, r);
            }
            Req::Unlink { name } => {
                let _t = self.stats.start(Op::Unlink);
                Empty(reply).answer(self.fs.unlink(ino, name));
            }
            Req::Rmdir { name } => {
                let _t = self.stats.start(Op::Rmdir);
                Empty(reply).answer(self.fs.rmdir(ino, name));
            }
            Req::Rename {
                newdir,
                name,
                newname,
                flags,
            } => {
                let _t = self.stats.start(Op::Rename);
                let f = core::RenameFlags {
                    noreplace: flags & libc::RENAME_NOREPLACE != 0,
                    exchange: flags & libc::RENAME_EXCHANGE != 0,
                    whiteout: flags & libc::RENAME_WHITEOUT != 0,
                };
                let r = self.fs.rename(&ctx(h), ino, name, Ino(newdir), newname, f);
                Empty(reply).answer(r);
            }
            Req::Link { oldnodeid, name } => {
                let _t = self.stats.start(Op::Link);
                self.entry(reply, self.fs.link(Ino(oldnodeid), ino, name));
            }
            Req::Open { flags, open_flags } => {
                let _t = self.stats.start(Op::Open);
                // O_TRUNC by a caller without CAP_FSETID (KILLPRIV_V2).
                if open_flags & abi::FUSE_OPEN_KILL_SUIDGID != 0 && flags & libc::O_TRUNC != 0 {
                    match self.fs.kill_setid(&ctx(h), ino) {
                        Ok(killed) => self.stale_mode(ino, killed),
                        Err(e) => return reply.error(e.errno()),
                    }
                }
                self.open(h, flags, reply);
            }
            Req::Create {
                name,
                flags,
                mode,
                umask,
                ..
            } => {
                let _t = self.stats.start(Op::Create);
                match self.fs.create(&ctx(h), ino, name, mode, umask, flags) {
                    Ok((a, handle)) => {
                        // Cached for long although open for writing: a new
                        // file is empty, so no shared mapping can change it
                        // before a write or truncate drops these attributes
                        // (see `attr_ttl`).
                        let entry = Entry {
                            attr_ttl: self.ttl(),
                            ..self.entry_of(&a)
                        }
                        .out();
                        let open = self.open_out(&handle);
                        reply.send(&[entry.as_bytes(), open.as_bytes()]);
                    }
                    Err(e) => reply.error(e.errno()),
                }
            }
            Req::Read {
                fh, offset, size, ..
            } => {
                let t = self.stats.start(Op::Read);
                let Some(pool) = self.readers.get().filter(|p| p.wanted(size)) else {
                    return readers::answer(&self.fs, Fh(fh), offset, size, Data(reply));
                };
                let job = readers::Job {
                    fh: Fh(fh),
                    offset,
                    size,
                    reply: Data(reply),
                    since: t.hand_off(),
                };
                if let Err(job) = pool.send(job) {
                    // The pool is gone (it never stops before the session).
                    readers::answer(&self.fs, job.fh, job.offset, job.size, job.reply);
                    self.stats.record(Op::Read, job.since);
                }
            }
            Req::Write {
                fh,
                offset,
                data,
                write_flags,
                ..
            } => {
                let _t = self.stats.start(Op::Write);
                // A writer without CAP_FSETID (KILLPRIV_V2): the bits go
                // before the data, as file_remove_privs does.
                if write_flags & abi::FUSE_WRITE_KILL_SUIDGID != 0 {
                    match self.fs.kill_setid(&ctx(h), ino) {
                        Ok(killed) => self.stale_mode(ino, killed),
                        Err(e) => return reply.error(e.errno()),
                    }
                }
                Written(reply).answer(self.fs.write(Fh(fh), offset, data));
            }
            Req::Flush { fh, lock_owner } => {
                let _t = self.stats.start(Op::Flush);
                let locks = self.locks.get().cloned();
                let drop_locks = move || locks.map_or(Ok(()), |l| l.flush(ino.0, lock_owner));
                // On a volume other nodes share, what was written goes to
                // the store before the close returns, and before the
                // owner's locks go (close-to-open across nodes).
                match self.fs.flush_written(Fh(fh)) {
                    Ok(0) => Empty(reply).answer(drop_locks()),
                    Ok(_) => self.sync_job(syncer::Job::Flush {
                        after: Box::new(drop_locks),
                        reply: Empty(reply),
                    }),
                    Err(e) => {
                        // The descriptor is closed all the same.
                        let _ = drop_locks();
                        reply.error(e.errno());
                    }
                }
            }
            Req::Release { fh, .. } => {
                let _t = self.stats.start(Op::Release);
                if let Some(l) = self.locks.get() {
                    l.release(ino.0, fh);
                }
                {
                    let mut b = self.backing.lock();
                    if let Some(id) = b.by_fh.remove(&Fh(fh)) {
                        if Arc::strong_count(&id) == 1 {
                            b.by_ino.remove(&ino);
                        }
                    }
                }
                Empty(reply).answer(self.fs.release(Fh(fh)));
            }
            Req::Fsync { fh, datasync } => {
                let _t = self.stats.start(Op::Fsync);
                self.sync_job(syncer::Job::File {
                    fh: Fh(fh),
                    datasync,
                    reply: Empty(reply),
                });
            }
            Req::Opendir { .. } => {
                let _t = self.stats.start(Op::Opendir);
                // With FUSE_NO_OPENDIR_SUPPORT negotiated, ENOSYS here tells
                // the kernel to stop sending OPENDIR and RELEASEDIR for good;
                // it then opens directories itself with FOPEN_CACHE_DIR |
                // FOPEN_KEEP_CACHE, so listings stay in its page cache
                // (dropped when a directory's mtime changes) and a directory
                // walk costs two requests less per directory. safs keeps no
                // per-open directory state.
                reply.error(libc::ENOSYS);
            }
            Req::Readdir { offset, size, .. } => {
                let _t = self.stats.start(Op::Readdir);
                self.note_listing(ino, offset);
                let mut buf = DirBuf::new(size as usize);
                let r = self.list(ino, Cookie(offset), 256, |e| {
                    Ok(!buf.add(e.ino.0, e.cookie.0, dtype(e.kind), &e.name))
                });
                Listing(reply).answer(r.map(|()| buf));
            }
            Req::Readdirplus { offset, size, .. } => {
                let _t = self.stats.start(Op::Readdirplus);
                self.note_listing(ino, offset);
                Listing(reply).answer(self.list_plus(ino, Cookie(offset), size as usize));
            }
            Req::Releasedir { .. } => {
                let _t = self.stats.start(Op::Releasedir);
                reply.send(&[]);
            }
            Req::Fsyncdir { .. } => {
                let _t = self.stats.start(Op::Fsyncdir);
                self.sync_job(syncer::Job::Dir {
                    reply: Empty(reply),
                });
            }
            Req::Statfs => {
                let _t = self.stats.start(Op::Statfs);
                Statfs(reply).answer(self.fs.statfs(ino));
            }
            Req::Setxattr {
                name, value, flags, ..
            } => {
                let _t = self.stats.start(Op::Setxattr);
                Empty(reply).answer(self.fs.setxattr(&ctx(h), ino, name, value, flags));
            }
            Req::Getxattr { name, size } => {
                let _t = self.stats.start(Op::Getxattr);
                Xattr { reply, size }.answer(self.fs.getxattr(ino, name));
            }
            Req::Listxattr { size } => {
                let _t = self.stats.start(Op::Listxattr);
                Xattr { reply, size }.answer(self.fs.listxattr(&ctx(h), ino));
            }
            Req::Removexattr { name } => {
                let _t = self.stats.start(Op::Removexattr);
                Empty(reply).answer(self.fs.removexattr(&ctx(h), ino, name));
            }
            Req::Access { .. } => {
                let _t = self.stats.start(Op::Access);
                // Only reached without default_permissions, which safs
                // always sets.
                reply.send(&[]);
            }
            Req::Fallocate {
                fh,
                offset,
                length,
                mode,
            } => {
                let _t = self.stats.start(Op::Fallocate);
                let r = self.fs.fallocate(&ctx(h), Fh(fh), offset, length, mode);
                if let Ok(killed) = r {
                    self.stale_mode(ino, killed);
                }
                Empty(reply).answer(r.map(|_| ()));
            }
            Req::Lseek { fh, offset, whence } => {
                let _t = self.stats.start(Op::Lseek);
                Offset(reply).answer(self.fs.lseek(Fh(fh), offset, whence));
            }
            Req::Ioctl { .. } => {
                let _t = self.stats.start(Op::Ioctl);
                // No ioctl of its own (file attribute flags such as chattr +i
                // could not be enforced for writes that go through
                // passthrough): what a local filesystem answers for an ioctl
                // it does not know.
                reply.error(libc::ENOTTY);
            }
            // Locks (GETLK/SETLK: ENOSYS makes the kernel keep POSIX locks
            // itself), STATX (the kernel falls back to GETATTR), TMPFILE,
            // COPY_FILE_RANGE, POLL, BMAP and the rest.
            Req::Other { .. } => reply.error(libc::ENOSYS),
        }
    }

    /// A SETATTR that sets set-id bits while a writer that has exited
    /// still holds the file (see [`Fs::setid_waits_for_exited_writers`]):
    /// answered by a thread of its own once that writer's RELEASE came or
    /// [`RELEASE_WAIT`] passed — not on this worker, whose queue may hold
    /// that RELEASE. Rare: a chmod right after another process's close.
    fn setattr_after_exited_writers(&self, ctx: Ctx, ino: Ino, set: SetAttr, reply: Reply) {
        let fs = Arc::clone(&self.fs);
        let (passthrough, ttl) = (self.passthrough(), self.ttl());
        let spawned = std::thread::Builder::new()
            .name("safs-setattr".into())
            .spawn(move || {
                fs.await_exited_writers(ino, RELEASE_WAIT);
                let r = fs.setattr(&ctx, ino, &set);
                Attrs(reply).answer(r.map(|a| (attr_ttl(passthrough, ttl, &a), file_attr(&a))));
            });
        if let Err(e) = spawned {
            // The reply went with the closure: it answers EIO as it drops.
            tracing::error!(error = %e, "no thread for a SETATTR");
        }
    }

    /// The daemon cleared `ino`'s set-id bits (`killed`) in answering a
    /// request whose reply carries no attributes (write, fallocate, open):
    /// the kernel's cached mode is dropped before the reply, so that a
    /// `stat` right after sees the bits gone (the kernel invalidates only
    /// size and times itself).
    fn stale_mode(&self, ino: Ino, killed: bool) {
        if killed {
            self.drop_cached_attrs(ino);
        }
    }

    /// Drops the kernel's cached attributes of `ino` (not its pages).
    fn drop_cached_attrs(&self, ino: Ino) {
        if let Some((_, n)) = self.conn.get() {
            if let Err(e) = n.inval_inode(ino.0, -1, 0) {
                tracing::debug!(ino = ino.0, error = %e, "attribute invalidation");
            }
        }
    }

    fn open(&self, h: &Header, flags: i32, reply: Reply) {
        let ino = Ino(h.nodeid);
        match self.fs.open_as(&ctx(h), ino, OpenMode::from_flags(flags)) {
            Ok(handle) => {
                if handle.writable && self.passthrough() {
                    // The kernel's cached attributes would hide changes made
                    // through a shared mapping (see `attr_ttl`).
                    self.drop_cached_attrs(ino);
                }
                reply.send(&[self.open_out(&handle).as_bytes()]);
            }
            Err(e) => reply.error(e.errno()),
        }
    }
}

fn set_attr(s: SetattrIn) -> SetAttr {
    SetAttr {
        mode: s.mode,
        uid: s.uid,
        gid: s.gid,
        size: s.size,
        atime: set_time(s.atime),
        mtime: set_time(s.mtime),
        ctime: s.ctime.map(|(sec, nsec)| core::Timestamp { sec, nsec }),
        fh: s.fh,
        kill_setid: s.kill_suidgid,
    }
}
