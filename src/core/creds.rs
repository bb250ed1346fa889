//! What the kernel does not put in a FUSE request header: the caller's
//! supplementary groups, capabilities and process, read from
//! `/proc/<pid>/status`. Needed for the few rules the daemon applies itself
//! (set-group-ID inheritance, clearing set-id bits — under passthrough also
//! at a writer's open and against another process's writers — and listing
//! `trusted.*` names).
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
    /// The thread's process (thread group); 0 when unknown.
    tgid: u32,
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

    /// A caller whose process the daemon cannot see: FUSE names it pid 0
    /// when it is outside the PID namespace the mount was made in. Its
    /// capabilities and groups cannot be read, so none are assumed (a
    /// rule that keeps set-id bits for a privileged writer must not keep
    /// them for an unknown one).
    pub fn unseen(uid: u32, gid: u32) -> Self {
        let c = Ctx::new(uid, gid, 0);
        let _ = c.status.set(Status::default());
        c
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
                    tgid: 0,
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
                tgid: field("Tgid:").parse().unwrap_or(0),
            }
        })
    }

    /// Whether the caller's effective capability set holds `cap`.
    pub fn has_cap(&self, cap: u32) -> bool {
        self.status().cap_eff & (1 << cap) != 0
    }

    /// The caller's process: FUSE names the calling thread, and threads of
    /// one process share their files. `None` once the thread has exited.
    pub fn process(&self) -> Option<u32> {
        Some(self.status().tgid).filter(|&t| t != 0)
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
        assert_eq!(me.process(), Some(std::process::id()));
        // Another thread of this process names this process too.
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(nix::unistd::gettid().as_raw() as u32).unwrap();
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap();
        assert_ne!(tid, std::process::id());
        assert_eq!(Ctx::new(0, 0, tid).process(), Some(std::process::id()));
        done_tx.send(()).unwrap();
        t.join().unwrap();
        assert!(Ctx::root().has_cap(CAP_SYS_ADMIN));
        let unseen = Ctx::unseen(0, 0);
        assert!(!unseen.has_cap(CAP_FSETID));
        assert_eq!(unseen.process(), None);
        assert!(unseen.in_group(0) && !unseen.in_group(1));
    }
}
