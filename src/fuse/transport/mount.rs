//! Mounting and unmounting: mount(2) on `/dev/fuse` when the process may
//! (`CAP_SYS_ADMIN`), the setuid `fusermount3` helper otherwise.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::socket::{ControlMessageOwned, MsgFlags, UnixAddr, recvmsg};

use super::conn::{Conn, open_dev_fuse};

/// The setuid mount helper of libfuse 3.
const FUSERMOUNT: &str = "fusermount3";
/// The environment variable naming the socket `fusermount3` sends the
/// `/dev/fuse` file through.
const COMMFD_ENV: &str = "_FUSE_COMMFD";

/// How a mount looks to the kernel and to the programs using it.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// The mount's source in the mount table.
    pub fsname: String,
    /// The type is `fuse.<subtype>` (`fuse` when empty).
    pub subtype: String,
    /// Mount flags (MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC,
    /// MS_SYNCHRONOUS, MS_DIRSYNC, the atime flags, ...), as they are.
    /// Through `fusermount3` only those it knows are passed, and it adds
    /// MS_NOSUID and MS_NODEV for other users than root.
    pub flags: MsFlags,
    /// Users other than the mounter may use the mount.
    pub allow_other: bool,
    /// The kernel checks permissions from the mode bits itself.
    pub default_permissions: bool,
}

/// Mounts a FUSE filesystem on `mountpoint`: opens `/dev/fuse` and mounts
/// it with mount(2); when that is not permitted (`EPERM`: no
/// `CAP_SYS_ADMIN`), through `fusermount3`, which sends back its own
/// `/dev/fuse` file. The mount is live when this returns; nothing answers
/// its requests until [`serve`](super::serve) runs.
pub fn mount(mountpoint: &Path, o: &MountOptions) -> io::Result<(Conn, Unmounter)> {
    let mountpoint = mountpoint.canonicalize().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("mountpoint {}: {e}", mountpoint.display()),
        )
    })?;
    let (conn, how) = match mount_syscall(&mountpoint, o) {
        Ok(conn) => (conn, How::Syscall),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            tracing::debug!("mount(2) not permitted; mounting through {FUSERMOUNT}");
            (mount_fusermount(&mountpoint, o)?, How::Fusermount)
        }
        Err(e) => return Err(e),
    };
    let unmounter = Unmounter::new(mountpoint, how);
    Ok((conn, unmounter))
}

/// [`mount`] through `fusermount3` whatever the process may do.
#[cfg(test)]
pub(super) fn mount_with_fusermount(
    mountpoint: &Path,
    o: &MountOptions,
) -> io::Result<(Conn, Unmounter)> {
    let mountpoint = mountpoint.canonicalize()?;
    let conn = mount_fusermount(&mountpoint, o)?;
    let unmounter = Unmounter::new(mountpoint, How::Fusermount);
    Ok((conn, unmounter))
}

/// mount(2), type `fuse.<subtype>`, source `fsname`.
fn mount_syscall(mountpoint: &Path, o: &MountOptions) -> io::Result<Conn> {
    let rootmode = std::fs::metadata(mountpoint)?.mode() & libc::S_IFMT;
    let file = open_dev_fuse()?;
    let mut data = format!(
        "fd={},rootmode={rootmode:o},user_id={},group_id={}",
        file.as_raw_fd(),
        nix::unistd::getuid(),
        nix::unistd::getgid(),
    );
    if o.default_permissions {
        data.push_str(",default_permissions");
    }
    if o.allow_other {
        data.push_str(",allow_other");
    }
    let fstype = if o.subtype.is_empty() {
        "fuse".to_owned()
    } else {
        format!("fuse.{}", o.subtype)
    };
    let source = if o.fsname.is_empty() {
        fstype.as_str()
    } else {
        o.fsname.as_str()
    };
    nix::mount::mount(
        Some(source),
        mountpoint,
        Some(fstype.as_str()),
        o.flags,
        Some(data.as_str()),
    )
    .map_err(|e| match e {
        // Kept bare: the caller then goes through fusermount3.
        Errno::EPERM => io::Error::from(e),
        _ => io::Error::new(
            io::Error::from(e).kind(),
            format!("mount({}, type {fstype}): {e}", mountpoint.display()),
        ),
    })?;
    Ok(Conn::new(file))
}

/// `fusermount3`'s `-o` options for `o`.
fn fusermount_options(o: &MountOptions) -> String {
    let mut opts: Vec<String> = Vec::new();
    if !o.fsname.is_empty() {
        opts.push(format!("fsname={}", escape_option(&o.fsname)));
    }
    if !o.subtype.is_empty() {
        opts.push(format!("subtype={}", escape_option(&o.subtype)));
    }
    if o.allow_other {
        opts.push("allow_other".into());
    }
    if o.default_permissions {
        opts.push("default_permissions".into());
    }
    let f = o.flags;
    for (flag, on, off) in [
        (MsFlags::MS_RDONLY, "ro", "rw"),
        (MsFlags::MS_NOSUID, "nosuid", "suid"),
        (MsFlags::MS_NODEV, "nodev", "dev"),
        (MsFlags::MS_NOEXEC, "noexec", "exec"),
    ] {
        opts.push(if f.contains(flag) { on } else { off }.into());
    }
    for (flag, name) in [
        (MsFlags::MS_SYNCHRONOUS, "sync"),
        (MsFlags::MS_DIRSYNC, "dirsync"),
        (MsFlags::MS_NOATIME, "noatime"),
        (MsFlags::MS_NODIRATIME, "nodiratime"),
    ] {
        if f.contains(flag) {
            opts.push(name.into());
        }
    }
    let known = MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV
        | MsFlags::MS_NOEXEC
        | MsFlags::MS_SYNCHRONOUS
        | MsFlags::MS_DIRSYNC
        | MsFlags::MS_NOATIME
        | MsFlags::MS_NODIRATIME;
    if !(f - known).is_empty() {
        tracing::warn!(flags = ?(f - known), "{FUSERMOUNT} cannot set these mount flags; ignored");
    }
    opts.join(",")
}

/// `fusermount3` takes `\` as the escape in `fsname=` and `subtype=`.
fn escape_option(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == ',' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn fusermount_missing(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::NotFound {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{FUSERMOUNT} not found: mounting without CAP_SYS_ADMIN needs it (package fuse3)"
            ),
        )
    } else {
        io::Error::new(e.kind(), format!("running {FUSERMOUNT}: {e}"))
    }
}

/// Mounts through `fusermount3`: it opens `/dev/fuse`, mounts it, and
/// sends the file back over the socket named by `_FUSE_COMMFD` (here the
/// helper's standard input, so no descriptor of ours needs to lose
/// close-on-exec).
fn mount_fusermount(mountpoint: &Path, o: &MountOptions) -> io::Result<Conn> {
    let (ours, theirs) = UnixStream::pair()?;
    let mut cmd = Command::new(FUSERMOUNT);
    cmd.arg("-o")
        .arg(fusermount_options(o))
        .arg("--")
        .arg(mountpoint)
        .env(COMMFD_ENV, "0")
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = cmd.spawn().map_err(fusermount_missing)?;
    // The command holds our copy of the helper's end: close it, so that the
    // helper's exit ends the receive below.
    drop(cmd);
    let received = receive_fd(&ours);
    drop(ours);
    let out = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stderr = stderr.trim();
    match received {
        Ok(Some(fd)) => {
            if !stderr.is_empty() {
                tracing::warn!("{FUSERMOUNT}: {stderr}");
            }
            Ok(Conn::new(File::from(fd)))
        }
        Ok(None) => Err(io::Error::other(format!(
            "{FUSERMOUNT} failed ({}): {stderr}",
            out.status
        ))),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!(
                "receiving /dev/fuse from {FUSERMOUNT} ({}): {e}; {stderr}",
                out.status
            ),
        )),
    }
}

/// Receives one file descriptor (SCM_RIGHTS) from `sock`; `None` when the
/// peer closed without sending one.
fn receive_fd(sock: &UnixStream) -> io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut cmsg = nix::cmsg_space!([RawFd; 1]);
    let msg = loop {
        match recvmsg::<UnixAddr>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => break msg,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    let mut received = None;
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for fd in fds {
                let fd = adopt_received_fd(fd);
                // One is expected; any other is closed.
                received.get_or_insert(fd);
            }
        }
    }
    Ok(received)
}

/// Takes ownership of a descriptor that SCM_RIGHTS just installed.
#[allow(unsafe_code)]
fn adopt_received_fd(fd: RawFd) -> OwnedFd {
    // SAFETY: the kernel installed `fd` in our table for this message
    // alone; nothing else knows it, so this is its only owner.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    /// mount(2): umount2(2) undoes it.
    Syscall,
    /// `fusermount3`: `fusermount3 -u` undoes it.
    Fusermount,
}

/// Ends a session from another thread (a signal handler): unmounts, after
/// which `serve` ends. Idempotent; dropping it unmounts if that was not
/// done yet (a mount whose daemon stopped must not stay behind).
#[derive(Debug)]
pub struct Unmounter {
    mountpoint: PathBuf,
    how: How,
    /// The mount's device (`major:minor` in /proc/self/mountinfo), to tell
    /// whether what is mounted there is still this mount.
    dev: Option<String>,
    done: bool,
}

impl Unmounter {
    fn new(mountpoint: PathBuf, how: How) -> Unmounter {
        let dev = mounted_dev(&mountpoint);
        if dev.is_none() {
            tracing::warn!(mountpoint = %mountpoint.display(), "the new mount is not in /proc/self/mountinfo");
        }
        Unmounter {
            mountpoint,
            how,
            dev,
            done: false,
        }
    }

    /// The mountpoint (canonical).
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Unmounts, lazily (MNT_DETACH, as libfuse does): the mount leaves the
    /// namespace now, and the session ends once nothing uses it any more.
    /// Without `CAP_SYS_ADMIN`, `fusermount3 -u -z`. Does nothing when the
    /// mount is already gone (unmounted from outside), so as not to unmount
    /// whatever was mounted there since; a mount whose connection was
    /// aborted is unmounted.
    pub fn unmount(&mut self) -> io::Result<()> {
        if self.done {
            return Ok(());
        }
        if self.dev.is_some() && mounted_dev(&self.mountpoint) != self.dev {
            self.done = true;
            return Ok(());
        }
        let r = match self.how {
            How::Syscall => match nix::mount::umount2(&self.mountpoint, MntFlags::MNT_DETACH) {
                Ok(()) => Ok(()),
                // Not (or no longer) a mount point.
                Err(Errno::EINVAL) => Ok(()),
                Err(Errno::EPERM) => fusermount_unmount(&self.mountpoint),
                Err(e) => Err(io::Error::new(
                    io::Error::from(e).kind(),
                    format!("unmounting {}: {e}", self.mountpoint.display()),
                )),
            },
            How::Fusermount => fusermount_unmount(&self.mountpoint),
        };
        if r.is_ok() {
            self.done = true;
        }
        r
    }
}

/// The device (`major:minor`) of the topmost mount at `mountpoint`, from
/// /proc/self/mountinfo.
fn mounted_dev(mountpoint: &Path) -> Option<String> {
    let info = std::fs::read("/proc/self/mountinfo").ok()?;
    let want = mountpoint.as_os_str().as_bytes();
    info.split(|&b| b == b'\n').rev().find_map(|line| {
        // id parent major:minor root mountpoint ...
        let mut fields = line.split(|&b| b == b' ');
        let dev = fields.nth(2)?;
        let point = fields.nth(1)?;
        (unescape_mountinfo(point) == want).then(|| String::from_utf8_lossy(dev).into_owned())
    })
}

/// Undoes the kernel's octal escapes (`\040` for a space) in a
/// mountinfo field.
fn unescape_mountinfo(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\'
            && let Some(oct) = field.get(i + 1..i + 4)
            && oct.iter().all(|d| (b'0'..=b'7').contains(d))
        {
            out.push(oct.iter().fold(0u8, |v, d| (v << 3) | (d - b'0')));
            i += 4;
        } else {
            out.push(field[i]);
            i += 1;
        }
    }
    out
}

impl Drop for Unmounter {
    fn drop(&mut self) {
        if let Err(e) = self.unmount() {
            tracing::error!(mountpoint = %self.mountpoint.display(), error = %e, "unmounting");
        }
    }
}

/// `fusermount3 -u -q -z -- mountpoint`.
fn fusermount_unmount(mountpoint: &Path) -> io::Result<()> {
    let out = Command::new(FUSERMOUNT)
        .args(["-u", "-q", "-z", "--"])
        .arg(OsStr::new(mountpoint))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(fusermount_missing)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{FUSERMOUNT} -u {}: {} ({})",
            mountpoint.display(),
            String::from_utf8_lossy(&out.stderr).trim(),
            out.status
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fusermount_options_escape_and_map_flags() {
        let o = MountOptions {
            fsname: r"a,b\c".into(),
            subtype: "safs".into(),
            flags: MsFlags::MS_RDONLY | MsFlags::MS_NODEV | MsFlags::MS_DIRSYNC,
            allow_other: true,
            default_permissions: true,
        };
        assert_eq!(
            fusermount_options(&o),
            r"fsname=a\,b\\c,subtype=safs,allow_other,default_permissions,ro,suid,nodev,exec,dirsync"
        );
    }

    #[test]
    fn mountinfo_fields_are_unescaped() {
        assert_eq!(unescape_mountinfo(br"/mnt/a\040b\134c"), b"/mnt/a b\\c");
        assert_eq!(unescape_mountinfo(br"/x\04"), br"/x\04");
        assert_eq!(mounted_dev(Path::new("/no/such/mount")), None);
        assert!(mounted_dev(Path::new("/")).is_some());
    }
}
