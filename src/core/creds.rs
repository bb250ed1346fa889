//! What the kernel does not put in a FUSE request header: the caller's
//! supplementary groups and capabilities, read from `/proc/<pid>/status`.
//! Needed for the few rules the daemon applies itself (set-group-ID
//! inheritance and clearing, listing `trusted.*` names).
//!
//! Reading `/proc` costs a few microseconds, so it is done at most once per
//! request, only for the requests that need it, and never under the state
//! lock: operations call [`Ctx::load`] before taking the lock when the rule
//! may apply, and [`Ctx::has_cap`]/[`Ctx::in_group`] then answer from what
//! was read (reading it there, late, only if a caller forgot).

use std::sync::OnceLock;

/// The caller of one request.
#[derive(Debug)]
pub struct Ctx {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// Read from `/proc/<pid>/status` on first need.
    status: OnceLock<Status>,
}

/// The part of `/proc/<pid>/status` the rules need.
#[derive(Debug, Default)]
struct Status {
    cap_eff: u64,
    groups: Vec<u32>,
}

pub const CAP_FSETID: u32 = 4;
pub const CAP_SYS_ADMIN: u32 = 21;

impl Ctx {
    pub fn new(uid: u32, gid: u32, pid: u32) -> Self {
        Ctx {
            uid,
            gid,
            pid,
            status: OnceLock::new(),
        }
    }

    /// The kernel itself (or a test): privileged, group 0.
    pub fn root() -> Self {
        Ctx::new(0, 0, 0)
    }

    /// Reads the caller's capabilities and groups now, before a lock is
    /// taken (see the module comment). Cheap when already read.
    pub fn load(&self) {
        self.status();
    }

    fn status(&self) -> &Status {
        self.status.get_or_init(|| {
            // Pid 0 is a request the kernel makes on its own: privileged.
            if self.pid == 0 {
                return Status {
                    cap_eff: u64::MAX,
                    groups: Vec::new(),
                };
            }
            let text =
                std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
            let field = |name: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(name).map(str::trim))
                    .unwrap_or("")
            };
            Status {
                cap_eff: u64::from_str_radix(field("CapEff:"), 16).unwrap_or(0),
                groups: field("Groups:")
                    .split_whitespace()
                    .filter_map(|g| g.parse().ok())
                    .collect(),
            }
        })
    }

    /// Whether the caller's effective capability set holds `cap`.
    pub fn has_cap(&self, cap: u32) -> bool {
        self.status().cap_eff & (1 << cap) != 0
    }

    /// Whether `gid` is the caller's fsgid or one of its supplementary groups.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.status().groups.contains(&gid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_once() {
        let me = Ctx::new(
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
            std::process::id(),
        );
        me.load();
        // Root in the test environment: every capability.
        assert_eq!(me.has_cap(CAP_FSETID), nix::unistd::geteuid().is_root());
        assert!(me.in_group(nix::unistd::getegid().as_raw()));
        assert!(Ctx::root().has_cap(CAP_SYS_ADMIN));
    }
}
