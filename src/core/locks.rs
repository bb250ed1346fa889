//! File locks on a volume several daemons serve: kept by the shared
//! engine (see `meta::Shared::lock_set`), so a lock taken through one
//! mount holds against every other. Volumes one daemon serves leave locks
//! to the kernel, which keeps them itself.

use super::Fs;
use super::error::{CoreError, Result};
use crate::meta::{LockDrop, LockError, LockHolder, LockReq, Shared};

impl Fs {
    fn lock_engine(&self) -> Result<&dyn Shared> {
        self.store.engine().shared().ok_or(CoreError::NotSupported)
    }

    /// Whether this daemon keeps file locks itself (in the shared engine).
    pub fn keeps_locks(&self) -> bool {
        self.store.engine().shared().is_some()
    }

    /// The first lock of any daemon that conflicts with `req`.
    pub fn lock_test(&self, req: &LockReq) -> Result<Option<LockHolder>> {
        Ok(self.lock_engine()?.lock_test(req)?)
    }

    /// Takes, changes or drops `req`'s lock (see `Shared::lock_set`).
    pub fn lock_set(
        &self,
        req: &LockReq,
        waiting: bool,
    ) -> std::result::Result<Option<LockHolder>, LockError> {
        match self.store.engine().shared() {
            Some(s) => s.lock_set(req, waiting),
            None => Err(LockError::Meta(crate::meta::MetaError::Engine(
                "file locks are kept by the kernel on this volume".into(),
            ))),
        }
    }

    /// Drops this daemon's locks on `ino` that `which` selects.
    pub fn lock_drop(&self, ino: u64, which: LockDrop) -> Result<()> {
        Ok(self.lock_engine()?.lock_drop(ino, which)?)
    }

    /// Calls `ring` whenever some daemon's locks loosen (see
    /// `Shared::on_locks_changed`).
    pub fn on_locks_changed(&self, ring: Box<dyn Fn() + Send + Sync>) {
        if let Some(s) = self.store.engine().shared() {
            s.on_locks_changed(ring);
        }
    }
}
