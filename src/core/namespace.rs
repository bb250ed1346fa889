//! Namespace operations: lookup, create, link, unlink, rename, readdir,
//! attributes.
//!
//! Directory entries are two records written together: `D parent name` for
//! lookup and `C parent cookie` for readdir. Cookies come from the parent's
//! `next_cookie` and are never reused within a directory, so a readdir that
//! resumes from cookie `c` sees every entry that existed throughout exactly
//! once, however the directory changed meanwhile.

use super::dircache::{Found, Listed};
use super::ids::{Cookie, Ino};
use super::tiers;
use super::{Attr, CoreError, Ctx, FIRST_COOKIE, Fs, Result, State, acl, check_name};
use crate::format::dirent::{Dirent, IndexEntry, decode_symlink, encode_marker, encode_symlink};
use crate::format::inode::{Inode, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG, Timestamp};
use crate::format::keys;
use crate::format::spill::Spill;
use crate::format::xattrs::XattrSet;
use crate::meta::Write;

/// One directory entry as readdir returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub cookie: Cookie,
    pub ino: Ino,
    pub kind: u8,
    pub name: Vec<u8>,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
    /// Leave a whiteout (a 0/0 character device, overlayfs's "deleted"
    /// marker) where the source was, in the same operation.
    pub whiteout: bool,
}

#[derive(Clone, Copy, Debug)]
pub enum TimeSet {
    Now,
    At(Timestamp),
}

/// The fields a `setattr` changes; `None` leaves one alone.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    pub ctime: Option<Timestamp>,
    pub fh: Option<u64>,
    /// Clear the set-id bits as a truncate or chown does (see
    /// [`Fs::kill_setid`]); the adapter's kernel says when.
    pub kill_setid: bool,
}

/// `mode` after a write, truncate or chown by a caller without CAP_FSETID:
/// no set-user-ID bit, and no set-group-ID bit if the group may execute
/// (without that bit it marks mandatory locking, not a privilege).
fn setid_killed(mode: u32) -> u32 {
    if mode & S_IFMT == S_IFDIR {
        return mode;
    }
    let mode = mode & !libc::S_ISUID;
    if mode & libc::S_IXGRP != 0 {
        mode & !libc::S_ISGID
    } else {
        mode
    }
}

/// Inodes an operation touches, loaded once and written once at the end, so
/// that aliases (same parent twice, a directory and its parent) are safe.
pub(super) struct Work {
    pub(super) inodes: rustc_hash::FxHashMap<u64, Inode>,
    pub(super) dirty: Vec<u64>,
    writes: Vec<Write>,
    /// The entries changed, for the directory cache once applied.
    entries: Vec<EntryChange>,
    /// Entries added to or removed from a directory, for its statistics
    /// and its ancestors' (`stats`).
    pub(super) moved: Vec<super::stats::Moved>,
    /// Moves of this session's shares of directories' statistics (volumes
    /// several daemons serve), applied with the writes.
    pub(super) shares: Vec<(u64, crate::format::shares::DirShare)>,
}

enum EntryChange {
    Put(u64, Vec<u8>, Dirent),
    Remove(u64, Vec<u8>, u64),
}

impl Work {
    pub(super) fn new() -> Self {
        Work {
            inodes: Default::default(),
            dirty: Vec::new(),
            writes: Vec::new(),
            entries: Vec::new(),
            moved: Vec::new(),
            shares: Vec::new(),
        }
    }
}

impl Fs {
    pub(super) fn w_get<'w>(
        &self,
        st: &mut State,
        work: &'w mut Work,
        ino: u64,
    ) -> Result<&'w mut Inode> {
        if let std::collections::hash_map::Entry::Vacant(e) = work.inodes.entry(ino) {
            e.insert(self.inode(st, ino)?);
        }
        if !work.dirty.contains(&ino) {
            work.dirty.push(ino);
        }
        Ok(work.inodes.get_mut(&ino).expect("just inserted"))
    }

    fn w_finish(&self, st: &mut State, mut work: Work) -> Result<()> {
        if self.sb.has_dir_stats() {
            self.account(st, &mut work)?;
            if self.sb.has_full_dir_stats() {
                self.rctimes_of_work(st, &mut work)?;
            }
        }
        for ino in std::mem::take(&mut work.dirty) {
            let inode = work.inodes.remove(&ino).expect("dirty inode loaded");
            // Sizes do not change here (statistics moved with the entries).
            self.put_inode_as_is(st, &mut work.writes, ino, inode);
        }
        let shares = std::mem::take(&mut work.shares);
        self.put_shares(st, &mut work.writes, shares);
        // Only directory changes finish here: `dirsync` makes them durable.
        let seq = self.store.apply(work.writes);
        self.hand_over_deferred(st);
        // The store shows the change from now on; so does the cache.
        let dirs = st.dirs();
        for c in work.entries {
            match c {
                EntryChange::Put(dir, name, d) => dirs.put(dir, &name, &d),
                EntryChange::Remove(dir, name, cookie) => dirs.remove(dir, &name, cookie),
            }
        }
        if self.opts.sync || self.opts.dirsync {
            self.wait_durable(st, seq)?;
        }
        Ok(())
    }

    /// Entry `name` of `parent`: from the directory cache, else from the
    /// engine (and then cached).
    fn dirent(&self, st: &mut State, parent: u64, name: &[u8]) -> Result<Option<Dirent>> {
        self.dirent_then(st, parent, name, false)
    }

    /// [`Fs::dirent`]; with `and_inode`, the inode it names is read in the
    /// same engine call where that costs one round trip (PostgreSQL) and
    /// put in the cache, for a lookup that needs it next.
    fn dirent_then(
        &self,
        st: &mut State,
        parent: u64,
        name: &[u8],
        and_inode: bool,
    ) -> Result<Option<Dirent>> {
        match st.dirs().lookup(parent, name) {
            Found::Entry(d) => return Ok(Some(d)),
            Found::Absent => return Ok(None),
            Found::Unknown => {}
        }
        let key = self.keyspace.dirent(parent, name);
        let found = if and_inode {
            self.store
                .get_and_follow(&key, crate::format::dirent::INO_AT, keys::P_INODE)?
        } else {
            self.store.get(&key)?.map(|rec| (rec, None))
        };
        let Some((rec, inode)) = found else {
            return Ok(None);
        };
        let d = Dirent::decode(&key, &rec).map_err(|e| CoreError::corrupt(&key, e))?;
        st.dirs().learn(parent, name, &d);
        if let Some(irec) = inode
            && !st.is_cached(d.ino)
        {
            let ikey = keys::inode(d.ino);
            let inode = Inode::decode(&ikey, &irec).map_err(|e| CoreError::corrupt(&ikey, e))?;
            st.cache_put(d.ino, super::Cached { inode, spill: None });
        }
        Ok(Some(d))
    }

    fn add_entry(
        &self,
        work: &mut Work,
        parent: &mut Inode,
        parent_ino: u64,
        name: &[u8],
        ino: u64,
        kind: u8,
    ) {
        let cookie = parent.next_cookie.max(FIRST_COOKIE);
        parent.next_cookie = cookie + 1;
        self.put_entry_at(work, parent_ino, name, cookie, ino, kind);
    }

    /// Writes entry `name` of `parent_ino` at `cookie`, naming `ino`: a
    /// rename within one directory and an exchange keep the cookie, so a
    /// listing under way sees the entry once, never again at the end (a
    /// directory renamed into and out of while listed would never end).
    fn put_entry_at(
        &self,
        work: &mut Work,
        parent_ino: u64,
        name: &[u8],
        cookie: u64,
        ino: u64,
        kind: u8,
    ) {
        let dk = self.keyspace.dirent(parent_ino, name);
        let d = Dirent { ino, kind, cookie };
        work.moved.push(super::stats::Moved::added(parent_ino, &d));
        work.writes.push((dk.clone(), Some(d.encode(&dk))));
        work.entries
            .push(EntryChange::Put(parent_ino, name.to_vec(), d));
        let ck = keys::dir_index(parent_ino, cookie);
        let e = IndexEntry {
            ino,
            kind,
            name: name.to_vec(),
        };
        work.writes.push((ck.to_vec(), Some(e.encode(&ck))));
    }

    fn remove_entry(&self, work: &mut Work, parent_ino: u64, name: &[u8], d: &Dirent) {
        work.moved.push(super::stats::Moved::removed(parent_ino, d));
        work.writes
            .push((self.keyspace.dirent(parent_ino, name), None));
        work.writes
            .push((keys::dir_index(parent_ino, d.cookie).to_vec(), None));
        work.entries
            .push(EntryChange::Remove(parent_ino, name.to_vec(), d.cookie));
    }

    fn dir_is_empty(&self, st: &mut State, ino: u64) -> Result<bool> {
        if let Some(empty) = st.dirs().is_empty(ino) {
            return Ok(empty);
        }
        let (start, end) = keys::ino_range(keys::P_DIRINDEX, ino);
        Ok(self.store.scan(&start, &end, 1)?.is_empty())
    }

    /// Drops one link of `ino` (an entry naming it was removed). A directory
    /// loses both its links. Unreferenced inodes become orphans until the
    /// kernel forgets them and every handle is closed.
    fn drop_link(&self, st: &mut State, work: &mut Work, ino: u64, now: Timestamp) -> Result<()> {
        let inode = self.w_get(st, work, ino)?;
        inode.nlink = if inode.is_dir() {
            0
        } else {
            st.drop_link(ino, inode.nlink)
        };
        inode.ctime = now;
        if inode.nlink == 0 {
            let k = keys::orphan(ino);
            let marker = match self.session_id() {
                0 => encode_marker(&k),
                session => crate::format::dirent::encode_orphan(&k, session),
            };
            work.writes.push((k.to_vec(), Some(marker)));
        }
        Ok(())
    }

    // ---- lookups and attributes ------------------------------------------

    /// Looks `name` up in `parent`; counts a kernel reference on success.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
        let parent = parent.0;
        if name.len() > crate::format::NAME_MAX {
            return Err(CoreError::NameTooLong);
        }
        let (mut st, pre) = self.lock_for_lookup(parent, name);
        let p = self.inode(&mut st, parent)?;
        // "." of any inode is the inode itself: the kernel looks up "." in
        // a node id to open an NFS file handle (`open_by_handle_at`) whose
        // inode it no longer caches (FUSE_EXPORT_SUPPORT).
        if !p.is_dir() && name != b"." {
            return Err(CoreError::NotDir);
        }
        let ino = match name {
            b"." => parent,
            b".." => p.parent,
            _ => match pre {
                super::cold::Entry::Present(d) => d.ino,
                super::cold::Entry::Absent => return Err(CoreError::NotFound),
                super::cold::Entry::Unknown => {
                    self.dirent_then(&mut st, parent, name, true)?
                        .ok_or(CoreError::NotFound)?
                        .ino
                }
            },
        };
        let attr = self.attr_locked(&mut st, ino)?;
        st.add_lookup(ino);
        Ok(attr)
    }

    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        let ino = ino.0;
        let mut st = self.lock_with_inode(ino, None);
        self.attr_locked(&mut st, ino)
    }

    pub(super) fn attr_locked(&self, st: &mut State, ino: u64) -> Result<Attr> {
        let writer = st.writer_backing(ino);
        let open = writer.clone().or_else(|| st.any_backing(ino));
        let f = match open {
            Some(f) if writer.is_some() || self.watches_reads() => f,
            _ => return Ok(Attr::of(ino, &self.load(st, ino)?.inode)),
        };
        // One look at the backing file serves both: the reads since the
        // last look (the atime) and, with a writer, the current size and
        // mtime.
        let meta = match f.metadata() {
            Ok(m) => m,
            Err(e) if writer.is_some() => return Err(e.into()),
            Err(e) => {
                self.observe_reads_in(st, ino, &f, Err(e));
                return Ok(Attr::of(ino, &self.load(st, ino)?.inode));
            }
        };
        self.observe_reads_in(st, ino, &f, Ok(&meta));
        let c = self.load(st, ino)?;
        if writer.is_none() {
            return Ok(Attr::of(ino, &c.inode));
        }
        let mut inode = c.inode.clone();
        self.reconcile_with(&mut inode, &meta)?;
        Ok(Attr {
            open_for_write: true,
            ..Attr::of(ino, &inode)
        })
    }

    /// The attributes of `ino`, made just now with nothing read from or
    /// written to it yet: its record is its attributes (no look at its
    /// backing file).
    fn attr_fresh(&self, st: &mut State, ino: u64) -> Result<Attr> {
        let open_for_write = st.writer_backing(ino).is_some();
        Ok(Attr {
            open_for_write,
            ..Attr::of(ino, &self.load(st, ino)?.inode)
        })
    }

    pub fn setattr(&self, ctx: &Ctx, ino: Ino, set: &SetAttr) -> Result<Attr> {
        let ino = ino.0;
        if set.kill_setid && set.size.is_some() {
            // The caller's groups decide the set-group-ID bit below.
            ctx.load();
        }
        if set.size.is_some() {
            self.fetch(ino)?;
        }
        let _space = self.writable()?;
        let mut st = self.state.lock();
        while set.size.is_some() && self.evicted(ino) {
            // Dropped from the cache since the fetch.
            drop(st);
            self.fetch(ino)?;
            st = self.state.lock();
        }
        let mut inode = self.inode(&mut st, ino)?;
        let now = Timestamp::now();
        let mut w = Vec::new();
        if let Some(size) = set.size {
            if inode.is_dir() {
                return Err(CoreError::IsDir);
            }
            if !inode.is_reg() {
                return Err(CoreError::Invalid);
            }
            self.growth_allowed(&mut st, &inode, size.saturating_sub(inode.size))?;
            let open = st.writer_backing(ino);
            let file = match open {
                Some(f) => f,
                None => std::sync::Arc::new(self.data.open(ino)?),
            };
            self.mark_dirty(ino, &file)?;
            self.data.set_len(&file, ino, size)?;
            inode.size = size;
            self.reconcile(ino, &mut inode, Some(&file))?;
            inode.size = size;
            inode.mtime = now;
            inode.ctime = now;
        }
        if let Some(mode) = set.mode {
            inode.mode = (inode.mode & S_IFMT) | (mode & 0o7777);
            // Keep an access ACL in step with the new mode (posix_acl_chmod).
            if let Some(a) = self.xattr_get_locked(&mut st, ino, acl::ACCESS)? {
                if let Some(new) = acl::chmod(&a, mode) {
                    self.xattr_store(
                        &mut st,
                        &mut w,
                        ino,
                        &mut inode,
                        None,
                        acl::ACCESS,
                        Some(new),
                        None,
                    )?;
                }
            }
        }
        if let Some(uid) = set.uid {
            inode.uid = uid;
        }
        if let Some(gid) = set.gid {
            inode.gid = gid;
        }
        if set.kill_setid {
            inode.mode = if set.size.is_some() {
                // A truncate by a caller without CAP_FSETID (the kernel
                // asks only then): as a write by it would.
                inode.mode & !super::files::set_ids_dropped(ctx, inode.mode, inode.gid)
            } else {
                setid_killed(inode.mode)
            };
        }
        // Set-id bits set on a file another process holds open for writing
        // through passthrough: that process's later writes could not clear
        // them, so they are not kept (as a chmod by a caller outside the
        // group keeps no set-group-ID bit). The caller's own open handles
        // do not count: `cp -p`, `install` and package managers set modes
        // on the file they are writing.
        if set.mode.is_some()
            && self.setid_at_open()
            && setid_killed(inode.mode) != inode.mode
            && self.written_by_another_process(&st, ctx, ino)
        {
            inode.mode = setid_killed(inode.mode);
        }
        let stamp = |t: TimeSet| match t {
            TimeSet::Now => now,
            TimeSet::At(t) => t,
        };
        if let Some(t) = set.atime {
            inode.atime = stamp(t);
        }
        if let Some(t) = set.mtime {
            inode.mtime = stamp(t);
            if inode.is_reg() {
                // Keep the backing file's mtime from overriding an explicit
                // (possibly older) time while writers are open.
                self.set_backing_mtime(&st, ino, inode.mtime);
            }
        }
        inode.ctime = set.ctime.unwrap_or(now);
        self.put_inode(&mut st, &mut w, ino, inode);
        self.commit(&mut st, w)?;
        let attr = self.attr_locked(&mut st, ino)?;
        // A truncate of a file nobody writes: its last writer's close
        // will not upload it.
        let upload =
            set.size.is_some() && self.remote.is_some() && st.writer_backing(ino).is_none();
        drop(st);
        drop(_space);
        if upload {
            self.upload_later_if_failing(ino, super::remote::Upload::Sync);
            if self.state.lock().any_backing(ino).is_none() {
                self.closed_contents(ino);
            }
        }
        Ok(attr)
    }

    /// Clears `ino`'s set-id bits before a write (or an `O_TRUNC` open) by
    /// a caller the kernel found without CAP_FSETID (its
    /// `file_remove_privs`, left to safs under FUSE_HANDLE_KILLPRIV_V2):
    /// set-user-ID, and set-group-ID as [`super::files::set_ids_dropped`]
    /// says. A file without them — nearly every one — costs a cached read.
    /// True if bits went: the kernel's cached mode is then stale.
    pub fn kill_setid(&self, ctx: &Ctx, ino: Ino) -> Result<bool> {
        let ino = ino.0;
        {
            let mut st = self.state.lock();
            let mode = self.load(&mut st, ino)?.inode.mode;
            if !super::files::has_set_ids(mode) {
                return Ok(false);
            }
        }
        // The caller's groups, read before the lock.
        ctx.load();
        let _space = self.writable()?;
        let mut st = self.state.lock();
        let mut inode = self.inode(&mut st, ino)?;
        let kill = super::files::set_ids_dropped(ctx, inode.mode, inode.gid);
        if kill == 0 {
            return Ok(false);
        }
        inode.mode &= !kill;
        inode.ctime = Timestamp::now();
        let mut w = Vec::new();
        self.put_inode(&mut st, &mut w, ino, inode);
        self.commit(&mut st, w)?;
        Ok(true)
    }

    fn set_backing_mtime(&self, st: &State, ino: u64, t: Timestamp) {
        if let Some(f) = st.writer_backing(ino) {
            let ts = nix::sys::time::TimeSpec::new(t.sec, i64::from(t.nsec));
            let omit = nix::sys::time::TimeSpec::UTIME_OMIT;
            let _ = nix::sys::stat::futimens(&*f, &omit, &ts);
        }
    }

    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let ino = ino.0;
        let mut st = self.state.lock();
        if !self.inode(&mut st, ino)?.is_symlink() {
            return Err(CoreError::Invalid);
        }
        let key = keys::symlink(ino);
        let rec = self.store.get(&key)?.ok_or_else(|| {
            CoreError::corrupt(
                &key,
                crate::format::FormatError::Malformed("symlink without target"),
            )
        })?;
        decode_symlink(&key, &rec).map_err(|e| CoreError::corrupt(&key, e))
    }

    // ---- creation -----------------------------------------------------------

    /// Creates an inode of `mode` (type and permissions) named `name` in
    /// `parent`: mknod, mkdir, symlink and create all come here.
    pub fn make_node(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
        target: Option<&[u8]>,
    ) -> Result<Attr> {
        self.make_node_opened(ctx, parent.0, name, mode, umask, rdev, target, None)
            .map(|(attr, _)| attr)
    }

    /// [`Fs::make_node`], and with `open` a regular file's backing file
    /// made and a handle opened on it, all under one hold of the state lock:
    /// a create either happens whole or not at all (a backing file that
    /// cannot be made fails it before any record changes).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn make_node_opened(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
        target: Option<&[u8]>,
        open: Option<super::OpenMode>,
    ) -> Result<(Attr, Option<std::sync::Arc<super::Handle>>)> {
        let _space = self.writable()?;
        check_name(name)?;
        if let Some(t) = target {
            if t.is_empty() {
                return Err(CoreError::NotFound);
            }
            if t.len() > crate::format::SYMLINK_MAX {
                return Err(CoreError::NameTooLong);
            }
        }
        if mode & libc::S_ISGID != 0 && mode & S_IFMT != S_IFDIR {
            // The set-group-ID rule below may need the caller's groups.
            ctx.load();
        }
        let mut st = self.state.lock();
        let mut work = Work::new();
        let p = self.w_get(&mut st, &mut work, parent)?.clone();
        if !p.is_dir() {
            return Err(CoreError::NotDir);
        }
        if p.nlink == 0 {
            return Err(CoreError::NotFound);
        }
        if self.dirent(&mut st, parent, name)?.is_some() {
            return Err(CoreError::Exists);
        }
        // Before anything is taken (an inode number, a backing file).
        if st.quotas_seen() {
            // What ancestors are owed, with this operation's copy of the
            // parent taking its share, before the limits are read.
            super::stats::pay_owed(&self.store, &mut st, &mut work);
            let bytes = target.map_or(0, |t| t.len() as i64);
            self.quota_allows(&mut st, parent, 1, bytes)?;
        }
        let ftype = mode & S_IFMT;
        let is_dir = ftype == S_IFDIR;
        let now = Timestamp::now();
        let gid = if p.mode & libc::S_ISGID != 0 {
            p.gid
        } else {
            ctx.gid
        };
        let mut perm = mode & 0o7777;
        let mut inline = XattrSet::new();
        let mut spill = Spill::new();
        if ftype == S_IFLNK {
            perm = 0o777;
        } else {
            let inherited = match self.xattr_get_locked(&mut st, parent, acl::DEFAULT)? {
                Some(d) => acl::inherit(&d, perm, is_dir),
                None => None,
            };
            match inherited {
                Some(inh) => {
                    perm = inh.mode & 0o7777;
                    for (n, v) in [(acl::ACCESS, inh.access), (acl::DEFAULT, inh.default)] {
                        if let Some(v) = v {
                            tiers::set(&mut inline, &mut spill, false, self.budget, n, v);
                        }
                    }
                }
                None => perm &= !(umask & 0o777),
            }
            if is_dir && p.mode & libc::S_ISGID != 0 {
                perm |= libc::S_ISGID;
            } else if !is_dir
                && perm & libc::S_ISGID != 0
                && !ctx.in_group(gid)
                && !ctx.has_cap(super::creds::CAP_FSETID)
            {
                perm &= !libc::S_ISGID;
            }
        }
        // Taken only once nothing can fail any more (see below).
        let ino = st.next_ino();
        let inode = Inode {
            mode: ftype | perm,
            uid: ctx.uid,
            gid,
            nlink: if is_dir { 2 } else { 1 },
            rdev,
            flags: 0,
            size: target.map_or(0, |t| t.len() as u64),
            blocks: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            generation: 1,
            parent: if is_dir { parent } else { 0 },
            next_cookie: if is_dir { FIRST_COOKIE } else { 0 },
            spill_len: if spill.is_empty() {
                0
            } else {
                spill.packed_len() as u32
            },
            overflow: 0,
            inline,
            stats: (is_dir && self.sb.has_dir_stats()).then(Default::default),
            links: Vec::new(),
            quota: Default::default(),
        };
        for (p, _) in spill.stored() {
            let k = keys::spill_page(ino, p);
            let rec = spill.sealed_page(p, &k);
            work.writes.push((k, rec));
        }
        if let Some(t) = target {
            let k = keys::symlink(ino);
            work.writes.push((k.to_vec(), Some(encode_symlink(&k, t))));
        }
        let kind = inode.dtype();
        {
            let p = self.w_get(&mut st, &mut work, parent)?;
            let mut pc = p.clone();
            self.add_entry(&mut work, &mut pc, parent, name, ino, kind);
            if is_dir {
                pc.nlink += 1;
            }
            pc.mtime = now;
            pc.ctime = now;
            work.inodes.insert(parent, pc);
        }
        work.inodes.insert(ino, inode);
        work.dirty.push(ino);
        // A regular file made by mknod keeps a ready backing file too
        // (an empty one reads as the missing one would).
        let ready = self.data.take_ready(ino, ftype == S_IFREG);
        if ftype == S_IFREG && open.is_some() {
            self.new_contents(ino);
        }
        let file = match (open, ready) {
            (Some(_), Some(f)) => Some(std::sync::Arc::new(f)),
            (Some(_), None) => Some(std::sync::Arc::new(self.data.create(ino)?)),
            (None, _) => None,
        };
        let taken = st.take_ino();
        debug_assert_eq!(taken, ino, "inode numbers are taken under the lock");
        self.put_counters(&mut st, &mut work.writes);
        if let Err(e) = self.w_finish(&mut st, work) {
            // Refused before anything was applied (a quota the check above
            // could not see yet): the backing file taken goes, unnamed.
            if ftype == S_IFREG {
                drop(file);
                let _ = std::fs::remove_file(self.data.path(ino));
            }
            return Err(e);
        }
        if is_dir {
            st.dirs().made(ino);
        }
        if !spill.is_empty() {
            st.set_spill(ino, spill);
        }
        let handle = match (open, file) {
            (Some(mode), Some(file)) => {
                Some(self.register_handle(&mut st, ino, file, mode.write, ctx.pid, true)?)
            }
            _ => None,
        };
        let attr = self.attr_fresh(&mut st, ino)?;
        st.add_lookup(ino);
        Ok((attr, handle))
    }

    pub fn link(&self, ino: Ino, newparent: Ino, newname: &[u8]) -> Result<Attr> {
        let (ino, newparent) = (ino.0, newparent.0);
        let _space = self.writable()?;
        check_name(newname)?;
        let mut st = self.state.lock();
        let mut work = Work::new();
        let target = self.w_get(&mut st, &mut work, ino)?.clone();
        if target.is_dir() {
            return Err(CoreError::Perm);
        }
        if target.nlink == 0 {
            return Err(CoreError::NotFound);
        }
        if target.nlink >= 65_000 {
            return Err(CoreError::TooManyLinks);
        }
        let p = self.w_get(&mut st, &mut work, newparent)?.clone();
        if !p.is_dir() {
            return Err(CoreError::NotDir);
        }
        if p.nlink == 0 {
            return Err(CoreError::NotFound);
        }
        if self.dirent(&mut st, newparent, newname)?.is_some() {
            return Err(CoreError::Exists);
        }
        let now = Timestamp::now();
        let mut pc = p;
        self.add_entry(&mut work, &mut pc, newparent, newname, ino, target.dtype());
        pc.mtime = now;
        pc.ctime = now;
        work.inodes.insert(newparent, pc);
        let t = self.w_get(&mut st, &mut work, ino)?;
        t.nlink += 1;
        t.ctime = now;
        self.w_finish(&mut st, work)?;
        let attr = self.attr_locked(&mut st, ino)?;
        st.add_lookup(ino);
        Ok(attr)
    }

    // ---- removal ------------------------------------------------------------

    pub fn unlink(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.remove(parent.0, name, false)
    }

    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        let parent = parent.0;
        if name == b"." {
            return Err(CoreError::Invalid);
        }
        if name == b".." {
            return Err(CoreError::NotEmpty);
        }
        self.remove(parent, name, true)
    }

    fn remove(&self, parent: u64, name: &[u8], dir: bool) -> Result<()> {
        if name.len() > crate::format::NAME_MAX {
            return Err(CoreError::NameTooLong);
        }
        let _space = self.removable()?;
        let mut st = self.state.lock();
        let mut work = Work::new();
        if !self.w_get(&mut st, &mut work, parent)?.is_dir() {
            return Err(CoreError::NotDir);
        }
        let d = self
            .dirent(&mut st, parent, name)?
            .ok_or(CoreError::NotFound)?;
        let child_is_dir = u32::from(d.kind) << 12 == S_IFDIR;
        match (dir, child_is_dir) {
            (true, false) => return Err(CoreError::NotDir),
            (false, true) => return Err(CoreError::IsDir),
            _ => {}
        }
        if dir && !self.dir_is_empty(&mut st, d.ino)? {
            return Err(CoreError::NotEmpty);
        }
        let now = Timestamp::now();
        self.remove_entry(&mut work, parent, name, &d);
        let p = self.w_get(&mut st, &mut work, parent)?;
        if dir {
            p.nlink = st.drop_link(parent, p.nlink);
        }
        p.mtime = now;
        p.ctime = now;
        self.drop_link(&mut st, &mut work, d.ino, now)?;
        self.w_finish(&mut st, work)?;
        if dir {
            st.dirs().forget(d.ino);
        }
        self.maybe_free(&mut st, d.ino)
    }

    pub fn rename(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        let (parent, newparent) = (parent.0, newparent.0);
        let _space = self.writable()?;
        check_name(newname)?;
        if name.len() > crate::format::NAME_MAX {
            return Err(CoreError::NameTooLong);
        }
        if flags.exchange && (flags.noreplace || flags.whiteout) {
            return Err(CoreError::Invalid);
        }
        let mut st = self.state.lock();
        let mut work = Work::new();
        for p in [parent, newparent] {
            if !self.w_get(&mut st, &mut work, p)?.is_dir() {
                return Err(CoreError::NotDir);
            }
        }
        let src = self
            .dirent(&mut st, parent, name)?
            .ok_or(CoreError::NotFound)?;
        let dst = self.dirent(&mut st, newparent, newname)?;
        let is_dir = |k: u8| u32::from(k) << 12 == S_IFDIR;
        // A directory cannot move under itself. The kernel checks this for
        // its own mount; another daemon of a shared volume may have moved
        // things since this kernel looked, so the daemon checks too.
        if parent != newparent {
            if is_dir(src.kind) && self.is_ancestor(&mut st, src.ino, newparent)? {
                return Err(CoreError::Invalid);
            }
            if let Some(d) = dst.as_ref().filter(|d| is_dir(d.kind)) {
                if flags.exchange && self.is_ancestor(&mut st, d.ino, parent)? {
                    return Err(CoreError::Invalid);
                }
                // The target is an ancestor of the source.
                if !flags.exchange && self.is_ancestor(&mut st, d.ino, parent)? {
                    return Err(CoreError::NotEmpty);
                }
            }
        }
        let now = Timestamp::now();
        if flags.exchange {
            let dst = dst.clone().ok_or(CoreError::NotFound)?;
            if src.ino == dst.ino {
                return Ok(());
            }
            // The names stay where they are, each at its cookie; only the
            // inodes they name change places.
            work.moved.push(super::stats::Moved::removed(parent, &src));
            work.moved
                .push(super::stats::Moved::removed(newparent, &dst));
            self.put_entry_at(&mut work, parent, name, src.cookie, dst.ino, dst.kind);
            self.put_entry_at(&mut work, newparent, newname, dst.cookie, src.ino, src.kind);
            if parent != newparent {
                let delta = i64::from(is_dir(src.kind)) - i64::from(is_dir(dst.kind));
                let p = self.w_get(&mut st, &mut work, parent)?;
                p.nlink = (i64::from(p.nlink) - delta) as u32;
                let np = self.w_get(&mut st, &mut work, newparent)?;
                np.nlink = (i64::from(np.nlink) + delta) as u32;
            }
            for (ino, new_parent) in [(src.ino, newparent), (dst.ino, parent)] {
                let i = self.w_get(&mut st, &mut work, ino)?;
                i.ctime = now;
                if i.is_dir() {
                    i.parent = new_parent;
                }
            }
        } else {
            if let Some(dst) = &dst {
                if flags.noreplace {
                    return Err(CoreError::Exists);
                }
                if dst.ino == src.ino {
                    return Ok(());
                }
                match (is_dir(src.kind), is_dir(dst.kind)) {
                    (true, false) => return Err(CoreError::NotDir),
                    (false, true) => return Err(CoreError::IsDir),
                    (true, true) if !self.dir_is_empty(&mut st, dst.ino)? => {
                        return Err(CoreError::NotEmpty);
                    }
                    _ => {}
                }
                self.remove_entry(&mut work, newparent, newname, dst);
                if is_dir(dst.kind) {
                    let np = self.w_get(&mut st, &mut work, newparent)?;
                    np.nlink = st.drop_link(newparent, np.nlink);
                }
                self.drop_link(&mut st, &mut work, dst.ino, now)?;
            }
            self.remove_entry(&mut work, parent, name, &src);
            if parent == newparent {
                // Same directory: the entry keeps its place in listings.
                self.put_entry_at(&mut work, parent, newname, src.cookie, src.ino, src.kind);
            } else {
                let mut np = self.w_get(&mut st, &mut work, newparent)?.clone();
                self.add_entry(&mut work, &mut np, newparent, newname, src.ino, src.kind);
                work.inodes.insert(newparent, np);
            }
            if is_dir(src.kind) && parent != newparent {
                let p = self.w_get(&mut st, &mut work, parent)?;
                p.nlink = st.drop_link(parent, p.nlink);
                let np = self.w_get(&mut st, &mut work, newparent)?;
                np.nlink += 1;
            }
            let i = self.w_get(&mut st, &mut work, src.ino)?;
            i.ctime = now;
            if i.is_dir() {
                i.parent = newparent;
            }
            if flags.whiteout {
                self.add_whiteout(&mut st, &mut work, ctx, parent, name, now)?;
            }
        }
        for p in [parent, newparent] {
            let p = self.w_get(&mut st, &mut work, p)?;
            p.mtime = now;
            p.ctime = now;
        }
        self.w_finish(&mut st, work)?;
        if let Some(dst) = dst {
            if !flags.exchange {
                if is_dir(dst.kind) {
                    st.dirs().forget(dst.ino);
                }
                self.maybe_free(&mut st, dst.ino)?;
            }
        }
        Ok(())
    }

    /// Whether directory `dir` is `ino` or one of its ancestors (walking
    /// up the parent pointers of directory inodes).
    fn is_ancestor(&self, st: &mut State, dir: u64, mut ino: u64) -> Result<bool> {
        // Bounded: a damaged volume with a loop must not hang the daemon.
        for _ in 0..4096 {
            if ino == dir {
                return Ok(true);
            }
            if ino == crate::core::volume::ROOT_INO {
                return Ok(false);
            }
            let up = self.inode(st, ino)?.parent;
            if up == ino || up == 0 {
                return Ok(false);
            }
            ino = up;
        }
        Err(CoreError::corrupt(
            &keys::inode(ino),
            crate::format::FormatError::Malformed("directory parents loop"),
        ))
    }

    /// Puts a whiteout named `name` in `parent`: a character device 0/0
    /// with no permissions, owned by the caller (as ext4 makes them).
    fn add_whiteout(
        &self,
        st: &mut State,
        work: &mut Work,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        now: Timestamp,
    ) -> Result<()> {
        let ino = st.take_ino();
        let _ = self.data.take_ready(ino, false);
        let inode = Inode {
            mode: libc::S_IFCHR,
            uid: ctx.uid,
            gid: ctx.gid,
            nlink: 1,
            rdev: 0,
            flags: 0,
            size: 0,
            blocks: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            generation: 1,
            parent: 0,
            next_cookie: 0,
            spill_len: 0,
            overflow: 0,
            inline: XattrSet::new(),
            stats: None,
            links: Vec::new(),
            quota: Default::default(),
        };
        let kind = inode.dtype();
        let mut p = self.w_get(st, work, parent)?.clone();
        self.add_entry(work, &mut p, parent, name, ino, kind);
        work.inodes.insert(parent, p);
        work.inodes.insert(ino, inode);
        work.dirty.push(ino);
        self.put_counters(st, &mut work.writes);
        Ok(())
    }

    // ---- listing ------------------------------------------------------------

    /// Up to `limit` entries after `offset` (a cookie; 0 = from the start),
    /// "." and ".." first.
    pub fn readdir(&self, ino: Ino, offset: Cookie, limit: usize) -> Result<Vec<DirEntry>> {
        let (ino, offset) = (ino.0, offset.0);
        let mut st = self.state.lock();
        let dir = self.inode(&mut st, ino)?;
        if !dir.is_dir() {
            return Err(CoreError::NotDir);
        }
        let mut out = Vec::with_capacity(limit.min(1024));
        let dtype = (S_IFDIR >> 12) as u8;
        if offset < 1 {
            out.push(DirEntry {
                cookie: Cookie(1),
                ino: Ino(ino),
                kind: dtype,
                name: b".".to_vec(),
            });
        }
        if offset < 2 {
            out.push(DirEntry {
                cookie: Cookie(2),
                ino: Ino(dir.parent),
                kind: dtype,
                name: b"..".to_vec(),
            });
        }
        let after = offset.max(2);
        let want = limit.saturating_sub(out.len());
        if want == 0 {
            return Ok(out);
        }
        let entry = |(cookie, ino, kind, name): &Listed| DirEntry {
            cookie: Cookie(*cookie),
            ino: Ino(*ino),
            kind: *kind,
            name: name.to_vec(),
        };
        if let Some(cached) = st.dirs().list(ino, after, want) {
            out.extend(cached.iter().map(entry));
            return Ok(out);
        }
        let generation = st.dirs().begin_fill(ino, offset);
        // The scan runs without the state lock; the generation says
        // whether what it read may still fill the cache.
        drop(st);
        let start = keys::dir_index(ino, after + 1);
        let (_, end) = keys::ino_range(keys::P_DIRINDEX, ino);
        let page = self.store.scan(&start, &end, want)?;
        let mut listed = Vec::with_capacity(page.len());
        for (k, v) in &page {
            let e = IndexEntry::decode(k, v).map_err(|e| CoreError::corrupt(k, e))?;
            let cookie = keys::key_cookie(k).unwrap_or(0);
            listed.push((cookie, e.ino, e.kind, std::sync::Arc::from(e.name)));
        }
        if let Some(generation) = generation {
            let mut st = self.state.lock();
            st.dirs().fill(ino, generation, &listed, page.len() < want);
        }
        out.extend(listed.iter().map(entry));
        Ok(out)
    }

    /// Attributes for readdirplus entries, in their order; inodes not
    /// cached are read in one engine call. Each entry found whose `counted`
    /// flag is set gets a kernel reference under the same hold of the lock
    /// (so it cannot be freed between the two): the adapter gives back,
    /// with [`Fs::forget`], those it does not send after all.
    pub fn entry_attrs(&self, inos: &[Ino], counted: &[bool]) -> Vec<Result<Attr>> {
        let raw: Vec<u64> = inos.iter().map(|i| i.0).collect();
        let mut st = self.lock_with_inodes(&raw);
        raw.iter()
            .zip(counted)
            .map(|(&ino, &count)| {
                let a = self.attr_locked(&mut st, ino)?;
                if count {
                    st.add_lookup(ino);
                }
                Ok(a)
            })
            .collect()
    }

    /// The filesystem's figures as seen from `ino`: inside a directory
    /// with a quota, its limits are the size and what they leave is free.
    pub fn statfs(&self, ino: Ino) -> Result<Statfs> {
        let vfs =
            nix::sys::statvfs::statvfs(self.layout.root.as_path()).map_err(std::io::Error::from)?;
        let (inodes, quota) = {
            let mut st = self.state.lock();
            let quota = match self.quota_view(&mut st, ino.0) {
                Ok(q) => q,
                Err(CoreError::NotFound) => None,
                Err(e) => return Err(e),
            };
            self.fresh_sessions(&mut st)?;
            (st.inodes_in_use(), quota)
        };
        let bsize = vfs.fragment_size().max(512);
        let bavail = vfs.blocks_available();
        let ffree = bavail.saturating_mul(bsize) / 1024;
        let mut s = Statfs {
            blocks: vfs.blocks(),
            bfree: vfs.blocks_free(),
            bavail,
            files: inodes + ffree,
            ffree,
            bsize: bsize as u32,
            namelen: crate::format::NAME_MAX as u32,
        };
        if let Some((q, bytes, entries)) = quota {
            if q.max_bytes > 0 {
                s.blocks = q.max_bytes.div_ceil(bsize);
                let left = q.max_bytes.saturating_sub(bytes) / bsize;
                s.bfree = s.bfree.min(left);
                s.bavail = s.bavail.min(left);
            }
            if q.max_files > 0 {
                s.files = q.max_files;
                s.ffree = q.max_files.saturating_sub(entries).min(s.ffree);
            }
        }
        Ok(s)
    }

    /// Inode type bits of `ino`.
    pub fn kind(&self, ino: Ino) -> Result<u32> {
        let ino = ino.0;
        let mut st = self.state.lock();
        Ok(self.inode(&mut st, ino)?.mode & S_IFMT)
    }

    pub fn is_regular(&self, ino: Ino) -> Result<bool> {
        Ok(self.kind(ino)? == S_IFREG)
    }
}

pub struct Statfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
}
