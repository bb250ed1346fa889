//! What the kernel does not put in a FUSE request header: the caller's
//! supplementary groups and capabilities, read from `/proc/<pid>/status`.
//! Needed for the few rules the daemon applies itself (setgid inheritance,
//! listing `trusted.*` names).

/// The caller of one request.
#[derive(Clone, Copy, Debug)]
pub struct Ctx {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

pub const CAP_FSETID: u32 = 4;
pub const CAP_SYS_ADMIN: u32 = 21;

impl Ctx {
    pub fn root() -> Self {
        Ctx {
            uid: 0,
            gid: 0,
            pid: 0,
        }
    }

    fn status_field(&self, field: &str) -> Option<String> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix(field).map(|v| v.trim().to_string()))
    }

    /// Whether the caller's effective capability set holds `cap`. A request
    /// the kernel makes on its own (pid 0) counts as privileged.
    pub fn has_cap(&self, cap: u32) -> bool {
        if self.pid == 0 {
            return true;
        }
        self.status_field("CapEff:")
            .and_then(|v| u64::from_str_radix(&v, 16).ok())
            .is_some_and(|bits| bits & (1 << cap) != 0)
    }

    /// Whether `gid` is the caller's fsgid or one of its supplementary groups.
    pub fn in_group(&self, gid: u32) -> bool {
        if self.gid == gid {
            return true;
        }
        self.status_field("Groups:").is_some_and(|v| {
            v.split_whitespace()
                .filter_map(|g| g.parse::<u32>().ok())
                .any(|g| g == gid)
        })
    }
}
