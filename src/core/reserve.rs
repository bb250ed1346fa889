//! Space held back for the metadata engine.
//!
//! LMDB copies pages on write, so even deleting a record needs free space.
//! Were the disk under a volume to fill up entirely (file data goes straight
//! to backing files, possibly by kernel passthrough), no batch could commit
//! — not even the unlinks that would free space. So the volume keeps a
//! preallocated `reserve` file: when a commit fails for lack of space it is
//! deleted and the commit retried; while it is gone, operations that need
//! space fail with ENOSPC (removal still works); once enough space is free
//! again it is re-created and normal service resumes.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

pub struct Reserve {
    path: PathBuf,
    bytes: u64,
    /// Invariant: true iff the reserve file is (believed) absent.
    released: AtomicBool,
}

impl Reserve {
    /// The reserve for the volume at `root`: 1 % of its filesystem, between
    /// 1 and 32 MiB. Creates the file if it can.
    pub fn new(root: &Path) -> Self {
        let size = nix::sys::statvfs::statvfs(root)
            .map(|v| v.blocks().saturating_mul(v.fragment_size()))
            .unwrap_or(0);
        let bytes = (size / 100).clamp(1 << 20, 32 << 20);
        let r = Reserve {
            path: root.join("reserve"),
            bytes,
            released: AtomicBool::new(true),
        };
        r.refill();
        r
    }

    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// Deletes the reserve to let a commit through; false if there was none.
    pub fn release(&self) -> bool {
        if self.released.swap(true, Ordering::AcqRel) {
            return false;
        }
        match std::fs::remove_file(&self.path) {
            Ok(()) => {
                tracing::warn!(
                    bytes = self.bytes,
                    "disk under the volume is full: released the reserve; new data is refused until space is freed"
                );
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot release the space reserve");
                false
            }
        }
    }

    /// Re-creates the reserve if it is gone and the space is there (with
    /// room to spare, so that service does not flap).
    pub fn refill(&self) {
        if !self.is_released() {
            return;
        }
        let free = nix::sys::statvfs::statvfs(self.path.parent().unwrap_or(Path::new("/")))
            .map(|v| v.blocks_available().saturating_mul(v.fragment_size()))
            .unwrap_or(0);
        let have = std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0);
        if have < self.bytes && free < self.bytes.saturating_mul(4) {
            return;
        }
        let made = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&self.path)
            .and_then(|f| {
                nix::fcntl::fallocate(
                    &f,
                    nix::fcntl::FallocateFlags::empty(),
                    0,
                    self.bytes as i64,
                )
                .map_err(std::io::Error::from)
            });
        match made {
            Ok(()) => {
                if self.released.swap(false, Ordering::AcqRel) && have == 0 {
                    tracing::debug!(bytes = self.bytes, "space reserve in place");
                }
            }
            Err(e) => {
                let _ = std::fs::remove_file(&self.path);
                tracing::warn!(error = %e, "cannot create the space reserve");
            }
        }
    }
}
