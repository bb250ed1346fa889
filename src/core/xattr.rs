//! Extended attribute operations over the tiers in [`super::tiers`].
//!
//! Namespaces as Linux has them: `user.`, `trusted.` (the kernel checks
//! CAP_SYS_ADMIN; we hide the names from others in listings), `security.`,
//! and the two POSIX ACL names under `system.` (validated and cached by the
//! kernel under `FUSE_POSIX_ACL`). Anything else is `EOPNOTSUPP`; a bare
//! namespace (`user.`) is `EINVAL`.

use super::tiers::{self, Tier};
use super::{CoreError, Ctx, Fs, Ino, Result, State, acl};
use crate::format::envelope::{Kind, open, seal};
use crate::format::inode::{Inode, Timestamp};
use crate::format::keys;
use crate::format::spill::{self, Spill};
use crate::format::xattrs::XattrSet;
use crate::format::{XATTR_NAME_MAX, XATTR_SIZE_MAX};
use crate::meta::Write;

pub const XATTR_CREATE: i32 = 1;
pub const XATTR_REPLACE: i32 = 2;

fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return Err(CoreError::Range);
    }
    let prefixes = [&b"user."[..], b"trusted.", b"security."];
    // A namespace with no name in it: EINVAL, as the VFS answers for
    // local filesystems (FUSE hands every name to the daemon unchecked).
    if prefixes.contains(&name) {
        return Err(CoreError::Invalid);
    }
    let ok =
        prefixes.iter().any(|p| name.starts_with(p)) || name == acl::ACCESS || name == acl::DEFAULT;
    if ok {
        Ok(())
    } else {
        Err(CoreError::NotSupported)
    }
}

/// Where a value to read lives, decided under the state lock.
enum Found {
    Value(Vec<u8>),
    Overflow,
    Absent,
}

impl Fs {
    /// The spill tier of `ino`, read once and then kept with the cached inode.
    fn spill_set<'s>(&self, st: &'s mut State, ino: u64) -> Result<&'s Spill> {
        if self.load(st, ino)?.spill.is_none() {
            let set = self.read_spill(st, ino)?;
            st.set_spill(ino, set);
        }
        Ok(self.load(st, ino)?.spill.get_or_insert_with(Spill::new))
    }

    /// The spill tier of `ino`, moved out of the cache for a change (it
    /// can hold a thousand entries: no copy per operation). The caller
    /// puts it back with `set_spill`; if it fails first, the next use reads
    /// the committed record again.
    fn take_spill(&self, st: &mut State, ino: u64) -> Result<Spill> {
        let mut taken = None;
        st.cache_update(ino, |c| taken = c.spill.take());
        match taken {
            Some(s) => Ok(s),
            None => self.read_spill(st, ino),
        }
    }

    /// Reads and decodes the spill pages of `ino` (none if `spill_len` is
    /// 0): one range read of adjacent keys.
    fn read_spill(&self, st: &mut State, ino: u64) -> Result<Spill> {
        let c = self.load(st, ino)?;
        self.read_spill_of(ino, &c.inode)
    }

    /// The spill pages of `ino`, whose record is `inode` (no lock needed).
    pub(super) fn read_spill_of(&self, ino: u64, inode: &Inode) -> Result<Spill> {
        if inode.spill_len == 0 {
            return Ok(Spill::new());
        }
        let (start, end) = keys::ino_range(keys::P_SPILL, ino);
        let recs = self.store.scan(&start, &end, spill::MAX_PAGES + 1)?;
        spill_from_records(ino, inode, recs)
    }
}

/// The spill tier of `ino` (record `inode`) from its spill records, as a
/// range read (or a cold lookup's companion read) returned them.
pub(super) fn spill_from_records(
    ino: u64,
    inode: &Inode,
    recs: crate::meta::Pairs,
) -> Result<Spill> {
    let want = inode.spill_len as usize;
    let key = keys::spill(ino);
    let malformed =
        |k: &[u8], what| CoreError::corrupt(k, crate::format::FormatError::Malformed(what));
    let mut pages = Vec::new();
    for (k, rec) in recs {
        let p = keys::spill_page_of(&k).ok_or_else(|| malformed(&k, "spill key"))?;
        let payload = open(&k, Kind::Spill, &rec).map_err(|e| CoreError::corrupt(&k, e))?;
        pages.push((
            p,
            XattrSet::decode(payload).map_err(|e| CoreError::corrupt(&k, e))?,
        ));
    }
    let set = Spill::from_pages(pages).map_err(|what| malformed(&key, what))?;
    if set.packed_len() != want {
        return Err(malformed(
            &key,
            "spill pages disagree with the inode's spill size",
        ));
    }
    Ok(set)
}

impl Fs {
    fn find(&self, st: &mut State, ino: u64, name: &[u8]) -> Result<Found> {
        let c = self.load(st, ino)?;
        if let Some(v) = c.inode.inline.get(name) {
            return Ok(Found::Value(v.to_vec()));
        }
        let (spilled, overflow) = (c.inode.spill_len > 0, c.inode.overflow > 0);
        if spilled && let Some(v) = self.spill_set(st, ino)?.get(name) {
            return Ok(Found::Value(v.to_vec()));
        }
        Ok(if overflow {
            Found::Overflow
        } else {
            Found::Absent
        })
    }

    fn overflow_get(&self, ino: u64, name: &[u8]) -> Result<Option<Vec<u8>>> {
        let key = self.keyspace.overflow(ino, name);
        match self.store.get(&key)? {
            Some(rec) => Ok(Some(
                open(&key, Kind::Overflow, &rec)
                    .map_err(|e| CoreError::corrupt(&key, e))?
                    .to_vec(),
            )),
            None => Ok(None),
        }
    }

    pub(super) fn xattr_get_locked(
        &self,
        st: &mut State,
        ino: u64,
        name: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        match self.find(st, ino, name)? {
            Found::Value(v) => Ok(Some(v)),
            Found::Absent => Ok(None),
            Found::Overflow => self.overflow_get(ino, name),
        }
    }

    /// Sets (`Some`) or removes (`None`) `name` on `inode`, whose inline set
    /// is current and whose spill tier is `spill` (`None`: not loaded yet).
    /// `overflow`: whether `name` is an overflow value, if the caller read
    /// that already under this hold of the lock (`None`: read it here).
    /// Pushes the records the change touches and updates the cache; the
    /// caller owns writing `inode` itself.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn xattr_store(
        &self,
        st: &mut State,
        w: &mut Vec<Write>,
        ino: u64,
        inode: &mut Inode,
        spill: Option<Spill>,
        name: &[u8],
        value: Option<Vec<u8>>,
        overflow: Option<bool>,
    ) -> Result<Option<Tier>> {
        let mut spill = match spill {
            Some(s) => s,
            None => self.take_spill(st, ino)?,
        };
        let in_overflow = inode.overflow > 0
            && !inode.inline.contains(name)
            && !spill.contains(name)
            && match overflow {
                Some(known) => known,
                None => self
                    .store
                    .get(&self.keyspace.overflow(ino, name))?
                    .is_some(),
            };
        let before = tiers::locate(&inode.inline, &spill, in_overflow, name);
        let t = match value {
            Some(v) => tiers::set(
                &mut inode.inline,
                &mut spill,
                in_overflow,
                self.budget,
                name,
                v,
            ),
            None => tiers::remove(&mut inode.inline, &mut spill, in_overflow, name),
        };
        if t.spill != 0 {
            // Only the pages the change touched: the cost of a set does not
            // grow with the rest of the file's xattrs.
            for p in Spill::pages_in(t.spill) {
                let key = keys::spill_page(ino, p);
                let rec = spill.sealed_page(p, &key);
                w.push((key, rec));
            }
            inode.spill_len = spill.packed_len() as u32;
        }
        if let Some(ov) = t.overflow {
            let key = self.keyspace.overflow(ino, name);
            match ov {
                Some(v) => {
                    if !in_overflow {
                        inode.overflow += 1;
                    }
                    let rec = seal(&key, Kind::Overflow, &v);
                    w.push((key, Some(rec)));
                }
                None => {
                    inode.overflow = st.drop_overflow(ino, inode.overflow);
                    w.push((key, None));
                }
            }
        } else if in_overflow {
            // Moved out of overflow into a packed tier.
            inode.overflow = st.drop_overflow(ino, inode.overflow);
            w.push((self.keyspace.overflow(ino, name), None));
        }
        self.load(st, ino)?;
        st.set_spill(ino, spill);
        Ok(before)
    }

    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        let ino = ino.0;
        if name.starts_with(super::stats::PREFIX) {
            let mut st = self.state.lock();
            return self.dir_stat(&mut st, ino, name);
        }
        if name.starts_with(super::quota::PREFIX) {
            let mut st = self.state.lock();
            return self.quota_get(&mut st, ino, name);
        }
        check_name(name)?;
        let found = {
            let mut st = self.lock_with_inode(ino, Some(name));
            self.find(&mut st, ino, name)?
        };
        match found {
            Found::Value(v) => Ok(v),
            Found::Absent => Err(CoreError::NoData),
            Found::Overflow => self.overflow_get(ino, name)?.ok_or(CoreError::NoData),
        }
    }

    /// Sets an xattr. Setting the access ACL also sets the permission bits
    /// it implies (the kernel leaves `posix_acl_update_mode` to FUSE
    /// filesystems), and an ACL the mode alone expresses is not stored.
    pub fn setxattr(
        &self,
        ctx: &Ctx,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        if name.starts_with(super::quota::PREFIX) {
            return self.quota_set(ctx, ino, name, Some(value), flags);
        }
        check_name(name)?;
        let ino = ino.0;
        if value.len() > XATTR_SIZE_MAX {
            return Err(CoreError::TooBig);
        }
        if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
            return Err(CoreError::Invalid);
        }
        let _space = self.writable()?;
        if name == acl::ACCESS {
            // The set-group-ID rule below may need the caller's groups.
            ctx.load();
        }
        let mut st = self.state.lock();
        let mut inode = self.inode(&mut st, ino)?;
        // Whether it exists, and whether as an overflow value: one read of
        // its record at most, whose answer the store below reuses.
        let (exists, overflow) = match self.find(&mut st, ino, name)? {
            Found::Value(_) => (true, false),
            Found::Absent => (false, false),
            Found::Overflow => {
                let there = self.overflow_get(ino, name)?.is_some();
                (there, there)
            }
        };
        if flags & XATTR_CREATE != 0 && exists {
            return Err(CoreError::Exists);
        }
        if flags & XATTR_REPLACE != 0 && !exists {
            return Err(CoreError::NoData);
        }
        let mut w = Vec::new();
        let mut stored = Some(value.to_vec());
        if name == acl::ACCESS {
            let (perms, equivalent) = acl::mode_of(value).ok_or(CoreError::Invalid)?;
            let mut mode = (inode.mode & !0o777) | perms;
            if !ctx.in_group(inode.gid) && !ctx.has_cap(super::creds::CAP_FSETID) {
                mode &= !libc::S_ISGID;
            }
            inode.mode = mode;
            if equivalent {
                stored = None;
            }
        }
        if stored.is_some() || exists {
            self.xattr_store(
                &mut st,
                &mut w,
                ino,
                &mut inode,
                None,
                name,
                stored,
                Some(overflow),
            )?;
        }
        inode.ctime = Timestamp::now();
        self.put_inode(&mut st, &mut w, ino, inode);
        self.commit(&mut st, w)
    }

    pub fn removexattr(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<()> {
        if name.starts_with(super::quota::PREFIX) {
            return self.quota_set(ctx, ino, name, None, 0);
        }
        let ino = ino.0;
        check_name(name)?;
        let _space = self.removable()?;
        let mut st = self.state.lock();
        let mut inode = self.inode(&mut st, ino)?;
        let mut w = Vec::new();
        if self
            .xattr_store(&mut st, &mut w, ino, &mut inode, None, name, None, None)?
            .is_none()
        {
            return Err(CoreError::NoData);
        }
        inode.ctime = Timestamp::now();
        self.put_inode(&mut st, &mut w, ino, inode);
        self.commit(&mut st, w)
    }

    /// All names, NUL-terminated, as `listxattr` returns them; `trusted.*`
    /// only for callers with CAP_SYS_ADMIN.
    pub fn listxattr(&self, ctx: &Ctx, ino: Ino) -> Result<Vec<u8>> {
        let ino = ino.0;
        let (mut names, overflow) = {
            let mut st = self.state.lock();
            let inode = self.inode(&mut st, ino)?;
            let mut names: Vec<Vec<u8>> = inode.inline.names().map(<[u8]>::to_vec).collect();
            if inode.spill_len > 0 {
                names.extend(self.spill_set(&mut st, ino)?.names().map(<[u8]>::to_vec));
            }
            (names, inode.overflow > 0)
        };
        if overflow {
            let (start, end) = keys::ino_range(keys::P_OVERFLOW, ino);
            for (k, _) in self.store.scan(&start, &end, usize::MAX)? {
                let name = self.keyspace.xattr_name(&k).map_err(|_| {
                    CoreError::corrupt(
                        &k,
                        crate::format::FormatError::Malformed("name does not decrypt"),
                    )
                })?;
                names.push(name);
            }
        }
        let show_trusted = names.iter().any(|n| n.starts_with(b"trusted."))
            && ctx.has_cap(super::creds::CAP_SYS_ADMIN);
        let mut out = Vec::new();
        for n in names {
            if n.starts_with(b"trusted.") && !show_trusted {
                continue;
            }
            out.extend_from_slice(&n);
            out.push(0);
        }
        Ok(out)
    }
}
