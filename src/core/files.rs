//! Open files: handles, daemon-side I/O, release, fsync.
//!
//! Each open of a regular file opens its backing file; under passthrough the
//! FUSE adapter registers that descriptor with the kernel and data never
//! enters the daemon. While a writer has the file open its backing file is
//! the source of size and mtime; the last close copies them into the record,
//! and after a crash the mount-time recovery does (see `Fs::recover`).

use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{CoreError, Ctx, Fh, Fs, Ino, Result, SetAttr, State};
use crate::format::inode::{S_IFMT, S_IFREG, Timestamp};

#[derive(Clone, Copy, Debug)]
pub struct OpenMode {
    pub write: bool,
    pub truncate: bool,
}

impl OpenMode {
    pub fn from_flags(flags: i32) -> Self {
        let acc = flags & libc::O_ACCMODE;
        OpenMode {
            write: acc == libc::O_WRONLY || acc == libc::O_RDWR,
            truncate: flags & libc::O_TRUNC != 0,
        }
    }
}

/// An open regular file.
pub struct Handle {
    pub fh: Fh,
    pub ino: Ino,
    pub writable: bool,
    /// The thread that opened it (the request's pid; 0: the kernel or a
    /// caller outside the mount's PID namespace).
    pub opener: u32,
    /// The backing file (also what passthrough hands to the kernel).
    pub file: Arc<File>,
    /// A byte quota lies above the file (see `quota`): the daemon serves
    /// this handle's I/O and checks each write that extends the file.
    pub bounded: bool,
}

impl Fs {
    /// Opens regular file `ino`.
    pub fn open(&self, ino: Ino, mode: OpenMode) -> Result<Arc<Handle>> {
        self.open_as(&Ctx::root(), ino, mode)
    }

    /// Opens regular file `ino` for `ctx`. An `O_TRUNC` by a caller without
    /// CAP_FSETID clears set-user-ID, and set-group-ID on a group-executable
    /// file, as a truncate does. (The FUSE adapter does not negotiate
    /// ATOMIC_O_TRUNC, so there the kernel truncates with a SETATTR instead.)
    pub fn open_as(&self, ctx: &Ctx, ino: Ino, mode: OpenMode) -> Result<Arc<Handle>> {
        let ino = ino.0;
        let _space = if mode.write || mode.truncate {
            Some(self.writable()?)
        } else {
            None
        };
        if mode.truncate || (mode.write && self.setid_at_open()) {
            self.load_creds_for_set_ids(ctx, ino);
        }
        let read_only = !mode.write && !mode.truncate;
        let h = loop {
            // A read-only open of a large file not fetched yet reads it in
            // part (see `remote::partial`); any other fetches it whole.
            let partial = read_only && self.begin_partial(ino)?;
            if !mode.truncate && !partial {
                self.fetch(ino)?;
            }
            // None: dropped from the cache since the fetch.
            if let Some(h) = self.open_locked(ctx, ino, mode)? {
                break h;
            }
        };
        // Not under the ticket's lease: flushing takes the lease itself.
        drop(_space);
        self.flush_atimes();
        Ok(h)
    }

    fn open_locked(&self, ctx: &Ctx, ino: u64, mode: OpenMode) -> Result<Option<Arc<Handle>>> {
        let mut st = self.state.lock();
        let evicted = if mode.write {
            self.evicted(ino)
        } else {
            self.evicted_unless_filling(ino)
        };
        if !mode.truncate && evicted {
            return Ok(None);
        }
        let mut inode = self.inode(&mut st, ino)?;
        if inode.is_dir() {
            return Err(CoreError::IsDir);
        }
        if !inode.is_reg() {
            return Err(CoreError::Invalid);
        }
        let file = match self.data.open_existing(ino) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // Another mount freed it, and this one has not heard yet
                // (a read-only open takes no lease): its commit comes
                // before its unlink, so the record is gone too. Creating
                // the file here left a stray no inode names (CI, the
                // two-mount model walk).
                if self.is_shared() && self.store.get(&crate::format::keys::inode(ino))?.is_none() {
                    st.cache_pop(ino);
                    return Err(CoreError::NotFound);
                }
                // After a crash: a file whose backing file's name was never
                // made durable lost its contents with it (see `reconcile`).
                self.data.open(ino)?
            }
            Err(e) => return Err(e.into()),
        };
        let mut w = Vec::new();
        if mode.truncate {
            self.mark_dirty(ino, &file)?;
            self.data.set_len(&file, ino, 0)?;
            let now = Timestamp::now();
            inode.size = 0;
            inode.blocks = 0;
            inode.mtime = now;
            inode.ctime = now;
            inode.mode &= !kill_set_ids(ctx, inode.mode, inode.gid);
            self.put_inode(&mut st, &mut w, ino, inode);
        } else if mode.write && self.setid_at_open() {
            // Its writes will not reach the daemon: the bits such a write
            // would clear go now (the kernel's attributes are invalidated
            // by the adapter on every writable open under passthrough).
            let kill = kill_set_ids(ctx, inode.mode, inode.gid);
            if kill != 0 {
                inode.mode &= !kill;
                inode.ctime = Timestamp::now();
                self.put_inode(&mut st, &mut w, ino, inode);
            }
        }
        self.commit(&mut st, w)?;
        self.register_handle(&mut st, ino, Arc::new(file), mode.write, ctx.pid, false)
            .map(Some)
    }

    /// Turns on clearing set-id bits at a writer's open (see the field).
    pub fn clear_setid_at_open(&self, on: bool) {
        self.setid_at_open.store(on, Ordering::Relaxed);
    }

    pub(super) fn setid_at_open(&self) -> bool {
        self.setid_at_open.load(Ordering::Relaxed)
    }

    /// Whether `ino` is open for writing by a process other than `ctx`'s
    /// (or by one that can no longer be told: its thread has exited).
    /// Reads `/proc` under the state lock: only asked when set-id bits are
    /// being set on a file open for writing.
    pub(super) fn written_by_another_process(&self, st: &State, ctx: &Ctx, ino: u64) -> bool {
        if st.writer_backing(ino).is_none() {
            return false;
        }
        let me = ctx.process();
        self.writers_of(ino)
            .any(|t| me.is_none() || Ctx::new(0, 0, t).process() != me)
    }

    /// Whether a SETATTR `set` would set set-id bits on `ino` while a
    /// process that has exited holds it open for writing: nearly always a
    /// writer that closed the file and exited just before (`cp f g && chmod
    /// u+s g`), whose RELEASE the kernel sends after its close returned, so
    /// that it may reach the daemon after this request. Judged now, that
    /// writer would count as still writing and the bits would not be kept;
    /// the adapter waits for the RELEASE first
    /// ([`Fs::await_exited_writers`]).
    pub fn setid_waits_for_exited_writers(&self, ino: Ino, set: &SetAttr) -> bool {
        let sets_ids = set
            .mode
            .is_some_and(|m| m & (libc::S_ISUID | libc::S_ISGID) != 0);
        sets_ids && self.setid_at_open() && self.writers_of(ino.0).any(opener_exited)
    }

    /// Waits until no handle of `ino` opened for writing by a thread that
    /// has exited is left, or `limit` has passed (such a handle may still
    /// be held: a descriptor the opener passed on before it exited keeps
    /// its writes going, and the bits then go as for any other writer).
    pub fn await_exited_writers(&self, ino: Ino, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut handles = self.handles.lock();
        loop {
            let exited = handles
                .values()
                .filter(|h| h.ino == ino && h.writable)
                .any(|h| opener_exited(h.opener));
            if !exited || self.released.wait_until(&mut handles, deadline).timed_out() {
                return;
            }
        }
    }

    /// The threads that opened `ino`'s writable handles.
    fn writers_of(&self, ino: u64) -> impl Iterator<Item = u32> {
        let openers: Vec<u32> = self
            .handles
            .lock()
            .values()
            .filter(|h| h.ino.0 == ino && h.writable)
            .map(|h| h.opener)
            .collect();
        openers.into_iter()
    }

    /// Registers a handle of `ino` open on its backing `file` (`fresh`:
    /// made by this create, armed and never read).
    pub(super) fn register_handle(
        &self,
        st: &mut State,
        ino: u64,
        file: Arc<File>,
        write: bool,
        opener: u32,
        fresh: bool,
    ) -> Result<Arc<Handle>> {
        if write {
            self.mark_dirty(ino, &file)?;
        }
        let first = st.open_handle(ino, &file, write);
        if first && !fresh {
            // Reads made while nobody had it open (through a mapping kept
            // after close), and arm the backing file for this open's reads.
            self.observe_reads(st, ino, &file);
        }
        let bounded = if first {
            let limited = match self.inode(st, ino) {
                Ok(i) => self.bytes_limited(st, &i),
                Err(e) => Err(e),
            };
            let bounded = limited.unwrap_or_else(|e| {
                tracing::error!(ino, error = %e, "cannot tell whether a quota bounds this file");
                true
            });
            st.set_bounded(ino, bounded);
            bounded
        } else {
            st.is_bounded(ino)
        };
        let fh = Fh(self.next_fh.fetch_add(1, Ordering::Relaxed));
        let h = Arc::new(Handle {
            fh,
            ino: Ino(ino),
            writable: write,
            opener,
            file,
            bounded,
        });
        self.handles.lock().insert(fh, Arc::clone(&h));
        Ok(h)
    }

    /// Creates and opens a regular file (`O_CREAT` with no existing name),
    /// as one operation.
    pub fn create(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(super::Attr, Arc<Handle>)> {
        let mut om = OpenMode::from_flags(flags);
        om.truncate = false;
        let made = self.make_node_opened(
            ctx,
            parent.0,
            name,
            S_IFREG | (mode & 0o7777),
            umask,
            0,
            None,
            Some(om),
        );
        let (attr, h) = match made {
            // Another mount made the name since this kernel looked it up:
            // without O_EXCL the open must find that file, so the kernel
            // is sent to look again (the VFS redoes an open that meets
            // ESTALE with revalidation, and checks permissions itself).
            Err(CoreError::Exists) if flags & libc::O_EXCL == 0 && self.is_shared() => {
                return Err(CoreError::Stale);
            }
            made => made?,
        };
        Ok((attr, h.expect("asked for a handle")))
    }

    pub fn handle(&self, fh: Fh) -> Result<Arc<Handle>> {
        self.handles
            .lock()
            .get(&fh)
            .cloned()
            .ok_or(CoreError::BadHandle)
    }

    pub fn read(&self, fh: Fh, offset: u64, size: u32) -> Result<Vec<u8>> {
        let h = self.handle(fh)?;
        self.fill(h.ino.0, offset, u64::from(size))?;
        Ok(self.data.read(&h.file, h.ino.0, offset, size)?)
    }

    /// [`Fs::read`] into `buf` (as many bytes as it holds), e.g. straight
    /// into the transport's reply buffer: the bytes read.
    pub fn read_into(&self, fh: Fh, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let h = self.handle(fh)?;
        self.fill(h.ino.0, offset, buf.len() as u64)?;
        Ok(self.data.read_into(&h.file, h.ino.0, offset, buf)?)
    }

    pub fn write(&self, fh: Fh, offset: u64, data: &[u8]) -> Result<u32> {
        let h = self.handle(fh)?;
        if !h.writable {
            return Err(CoreError::BadHandle);
        }
        // Data only: no metadata to admit, but no writes while commits fail.
        self.store.healthy()?;
        let data = if h.bounded {
            let end = self.write_allowed(h.ino.0, offset, offset + data.len() as u64)?;
            &data[..(end - offset) as usize]
        } else {
            data
        };
        self.data.write(&h.file, h.ino.0, offset, data)?;
        Ok(data.len() as u32)
    }

    /// Closes handle `fh`. When the last writer closes, the record takes the
    /// backing file's size and mtime and the `W` marker goes.
    pub fn release(&self, fh: Fh) -> Result<()> {
        let Some(h) = self.handles.lock().remove(&fh) else {
            return Err(CoreError::BadHandle);
        };
        self.released.notify_all();
        // The last writer's changes go to the object store (a volume with
        // one), before the close records the size.
        if h.writable
            && self.remote.is_some()
            && !self
                .handles
                .lock()
                .values()
                .any(|o| o.ino == h.ino && o.writable)
        {
            self.upload_later_if_failing(h.ino.0, super::remote::Upload::Close);
        }
        // A writer's close records the size: a change, under the lease.
        let _lease = if h.writable {
            Some(self.store.lease()?)
        } else {
            None
        };
        let mut st = self.state.lock();
        let mut w = Vec::new();
        let closed = st.close_handle(h.ino.0, h.writable);
        // One look at the backing file serves the last writer's size and
        // the last close's access time.
        let meta = match &closed.last_writer {
            Some(backing) => Some(backing.metadata()?),
            // An access time is not worth failing the close for.
            None if closed.last && self.watches_reads() => match h.file.metadata() {
                Ok(m) => Some(m),
                Err(e) => {
                    self.observe_reads_in(&mut st, h.ino.0, &h.file, Err(e));
                    None
                }
            },
            None => None,
        };
        if closed.last_writer.is_some()
            && let Some(meta) = &meta
            && let Ok(mut inode) = self.inode(&mut st, h.ino.0)
        {
            let was = inode.clone();
            self.reconcile_with(&mut inode, meta)?;
            // Unchanged (a close's upload recorded it already): no commit.
            if inode != was {
                self.put_inode(&mut st, &mut w, h.ino.0, inode);
            }
        }
        if closed.last {
            if let Some(meta) = &meta {
                self.observe_reads_in(&mut st, h.ino.0, &h.file, Ok(meta));
            }
            if let Ok(inode) = self.inode(&mut st, h.ino.0) {
                self.end_partial(h.ino.0, Some(inode.mtime));
            } else {
                self.end_partial(h.ino.0, None);
            }
        }
        self.commit(&mut st, w)?;
        drop(st);
        drop(_lease);
        self.flush_atimes();
        if closed.last {
            self.closed_contents(h.ino.0);
            self.free_if_unused(h.ino.0)?;
        }
        Ok(())
    }

    /// Whether file contents live in an object store (an `fsync` uploads
    /// them, a change of metadata its commit must cover).
    pub fn stores_objects(&self) -> bool {
        self.remote.is_some()
    }

    /// Whether a close must put what was written in the object store
    /// before it returns: on a volume other nodes may serve, where a file
    /// closed on one node and opened on another must read the same bytes
    /// (close-to-open). FUSE sends RELEASE after `close(2)` has returned;
    /// FLUSH is inside it.
    pub fn uploads_at_close(&self) -> bool {
        self.remote.is_some() && self.is_shared()
    }

    /// The upload half of a FLUSH (a `close(2)` of a descriptor of `fh`)
    /// on such a volume: what the file holds goes to the store and the map
    /// and size that name it are applied; the commit to wait for before
    /// the close returns (0: none, nothing changed). At every writer's
    /// close, not only the last one's: another handle still counted may be
    /// one whose RELEASE is on its way. The dirty mark stays until RELEASE
    /// (a descriptor that shares `fh` may still write).
    pub fn flush_written(&self, fh: Fh) -> Result<u64> {
        if !self.uploads_at_close() {
            return Ok(0);
        }
        let h = self.handle(fh)?;
        if !h.writable || self.unwritten_since_upload(h.ino.0) {
            return Ok(0);
        }
        self.upload(h.ino.0, super::remote::Upload::Sync)
    }

    /// `fsync`: the backing file's data, then every metadata change so far.
    pub fn fsync(&self, fh: Fh, datasync: bool) -> Result<()> {
        self.sync_data(fh, datasync)?;
        self.store.sync()
    }

    /// The data half of `fsync`: handle `fh`'s backing file made durable
    /// (with its size and times unless `datasync`), or, on a volume whose
    /// contents are in an object store, the file's blocks put there.
    pub fn sync_data(&self, fh: Fh, datasync: bool) -> Result<()> {
        let h = self.handle(fh)?;
        if self.remote.is_some() {
            // In the store, and named by the batch the caller waits for.
            // The backing file is a cache there: after a power cut its
            // blocks are checked against the map's hashes (see
            // `remote`), so writing it to the local disk as well bought
            // nothing and cost a write of every byte before the upload.
            self.upload(h.ino.0, super::remote::Upload::Sync)?;
            return Ok(());
        }
        let contents = || {
            if datasync {
                h.file.sync_data()
            } else {
                h.file.sync_all()
            }
        };
        // The contents are of no use after a crash without their name. The
        // two fsyncs are independent: made at once, the filesystem under
        // the volume commits them together (one after the other, a file
        // just created paid two journal commits per fsync).
        let ino = h.ino.0;
        if !self.data.name_pending(ino) {
            contents()?;
            return self.record_synced(&h);
        }
        let (contents, name) = std::thread::scope(|s| {
            let name = s.spawn(|| self.data.sync_name(ino));
            let contents = contents();
            let name = name
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a directory fsync panicked")));
            (contents, name)
        });
        contents?;
        name?;
        self.record_synced(&h)
    }

    /// The size (blocks, mtime) an `fsync` made durable, recorded as a
    /// writer's close records it: in the batch the `fsync` then waits
    /// for, so that what reads the record and not the backing file —
    /// directory statistics, quotas, other mounts — sees it from then on.
    fn record_synced(&self, h: &Handle) -> Result<()> {
        if !h.writable {
            return Ok(());
        }
        let _lease = self.store.lease()?;
        let mut st = self.state.lock();
        let meta = h.file.metadata()?;
        // Gone through another mount: the contents are durable, nothing
        // names them any more.
        let Ok(mut inode) = self.inode(&mut st, h.ino.0) else {
            return Ok(());
        };
        let was = inode.clone();
        self.reconcile_with(&mut inode, &meta)?;
        if inode == was {
            return Ok(());
        }
        let mut w = Vec::new();
        self.put_inode(&mut st, &mut w, h.ino.0, inode);
        self.commit(&mut st, w)
    }

    /// `fallocate`; mode 0 (allocate, extending size) and the keep-size,
    /// punch-hole and zero-range modes the backing filesystem supports.
    /// Like a write, it drops set-user-ID and set-group-ID for a caller
    /// without CAP_FSETID (the kernel does that itself for writes and
    /// truncates of FUSE files, not for fallocate). True if it cleared
    /// them: the kernel's cached mode is then stale.
    pub fn fallocate(
        &self,
        ctx: &Ctx,
        fh: Fh,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<bool> {
        let h = self.handle(fh)?;
        let _space = self.writable()?;
        if mode & libc::FALLOC_FL_KEEP_SIZE == 0 {
            let mut st = self.state.lock();
            let inode = self.inode(&mut st, h.ino.0)?;
            let end = offset.saturating_add(length);
            self.growth_allowed(&mut st, &inode, end.saturating_sub(inode.size))?;
        }
        self.data
            .fallocate(&h.file, h.ino.0, offset, length, mode)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EOPNOTSUPP) => CoreError::NotSupported,
                _ => e.into(),
            })?;
        self.load_creds_for_set_ids(ctx, h.ino.0);
        let mut st = self.state.lock();
        let mut inode = self.inode(&mut st, h.ino.0)?;
        self.reconcile(h.ino.0, &mut inode, Some(&h.file))?;
        let kill = kill_set_ids(ctx, inode.mode, inode.gid);
        inode.mode &= !kill;
        inode.ctime = Timestamp::now();
        if mode & libc::FALLOC_FL_KEEP_SIZE == 0 {
            inode.mtime = inode.ctime;
        }
        let mut w = Vec::new();
        self.put_inode(&mut st, &mut w, h.ino.0, inode);
        self.commit(&mut st, w)?;
        Ok(kill != 0)
    }

    /// `lseek` for `SEEK_DATA`/`SEEK_HOLE`, answered by the backing file.
    pub fn lseek(&self, fh: Fh, offset: i64, whence: i32) -> Result<i64> {
        let h = self.handle(fh)?;
        // Holes are where the backing file has them once it is whole.
        if self.served_by_daemon(h.ino.0) {
            self.fetch(h.ino.0)?;
        }
        Ok(self.data.lseek(&h.file, h.ino.0, offset, whence)?)
    }
}

impl Fs {
    /// Reads the caller's credentials before the state lock if `ino`
    /// carries set-id bits that [`kill_set_ids`] will judge (a change
    /// meanwhile only means they are read under the lock, once).
    fn load_creds_for_set_ids(&self, ctx: &Ctx, ino: u64) {
        let set_ids = {
            let mut st = self.state.lock();
            self.inode(&mut st, ino).is_ok_and(|i| has_set_ids(i.mode))
        };
        if set_ids {
            ctx.load();
        }
    }
}

/// Whether the thread that opened a handle has exited (0, the kernel or a
/// caller the daemon cannot see, has not).
fn opener_exited(opener: u32) -> bool {
    opener != 0 && Ctx::new(0, 0, opener).process().is_none()
}

/// Whether `mode` is a regular file's with a set-id bit: the only ones a
/// change of contents can clear (nearly no file: the caller's credentials
/// need not be read for the others).
pub(super) fn has_set_ids(mode: u32) -> bool {
    mode & S_IFMT == S_IFREG && mode & (libc::S_ISUID | libc::S_ISGID) != 0
}

/// The set-id bits a change of a regular file's contents by `ctx` clears
/// (the kernel's `setattr_should_drop_suidgid`): none for a caller with
/// CAP_FSETID; otherwise those of [`set_ids_dropped`]. The mode is looked
/// at first: the capability check reads the caller's credentials.
fn kill_set_ids(ctx: &Ctx, mode: u32, gid: u32) -> u32 {
    if !has_set_ids(mode) || ctx.has_cap(super::creds::CAP_FSETID) {
        return 0;
    }
    set_ids_dropped(ctx, mode, gid)
}

/// The set-id bits a change of a regular file's contents clears for a
/// caller without CAP_FSETID: set-user-ID, and set-group-ID when the file
/// is group-executable or the caller is not in its group.
pub(super) fn set_ids_dropped(ctx: &Ctx, mode: u32, gid: u32) -> u32 {
    if !has_set_ids(mode) {
        return 0;
    }
    let mut kill = mode & libc::S_ISUID;
    if mode & libc::S_ISGID != 0 && (mode & libc::S_IXGRP != 0 || !ctx.in_group(gid)) {
        kill |= libc::S_ISGID;
    }
    kill
}
