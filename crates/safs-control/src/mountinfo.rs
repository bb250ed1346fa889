//! `/proc/self/mountinfo`: which filesystem is mounted where, from what.
//!
//! One parser for everyone who asks: the volume lock (is a stopping daemon's
//! mount gone?), `safs mount` (is the mountpoint a dead mount?), `safs info`
//! (which volume is at this mountpoint?) and the bench (what is each target
//! on?).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One line of `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    pub mountpoint: PathBuf,
    pub fstype: String,
    /// The mount source: for safs, the volume directory.
    pub source: PathBuf,
    pub mount_opts: String,
    pub super_opts: String,
}

/// Undoes the octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(OsStr::from_bytes(&out))
}

/// Parses a mount table, in its order (later lines are mounted on top).
pub fn parse(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|l| {
            // "<id> <parent> <dev> <root> <mountpoint> <opts> [tags] - <fstype> <source> <super opts>"
            let (left, right) = l.split_once(" - ")?;
            let mut lf = left.split(' ');
            let mountpoint = lf.nth(4)?;
            let mount_opts = lf.next().unwrap_or("");
            let mut r = right.split(' ');
            let fstype = r.next()?;
            let source = r.next().unwrap_or("");
            let super_opts = r.next().unwrap_or("");
            Some(MountEntry {
                mountpoint: unescape(mountpoint),
                fstype: fstype.to_string(),
                source: unescape(source),
                mount_opts: mount_opts.to_string(),
                super_opts: super_opts.to_string(),
            })
        })
        .collect()
}

/// This process's mount table.
pub fn read() -> std::io::Result<Vec<MountEntry>> {
    Ok(parse(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// The mount holding `path` (already canonical): the longest mountpoint
/// that is a prefix of it, the last one where mounts are stacked.
pub fn mount_of<'a>(entries: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    let mut best: Option<&MountEntry> = None;
    for e in entries {
        if path.starts_with(&e.mountpoint)
            && best.is_none_or(|b| {
                e.mountpoint.components().count() >= b.mountpoint.components().count()
            })
        {
            best = Some(e);
        }
    }
    best
}

/// The topmost mount exactly at `mountpoint` (compared as given: callers
/// pass a canonical or absolute path).
pub fn mounted_at<'a>(entries: &'a [MountEntry], mountpoint: &Path) -> Option<&'a MountEntry> {
    entries.iter().rev().find(|e| e.mountpoint == mountpoint)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
40 22 0:35 / /tmp rw,nosuid shared:20 - tmpfs tmpfs rw,size=4194304k
51 22 0:44 / /mnt/my\\040safs rw,nosuid,nodev,relatime shared:30 - fuse.safs /var/lib/safs/demo rw,user_id=0,group_id=0,default_permissions,allow_other
52 40 0:45 / /tmp/x rw shared:31 - xfs /dev/loop0 rw,attr2
";

    #[test]
    fn parses_lines_and_escapes() {
        let e = parse(INFO);
        assert_eq!(e.len(), 4);
        assert_eq!(e[2].mountpoint, PathBuf::from("/mnt/my safs"));
        assert_eq!(e[2].fstype, "fuse.safs");
        assert_eq!(e[2].source, PathBuf::from("/var/lib/safs/demo"));
        assert!(e[2].super_opts.contains("allow_other"));
        assert_eq!(e[3].fstype, "xfs");
        assert_eq!(
            mounted_at(&e, Path::new("/mnt/my safs")).map(|m| m.fstype.as_str()),
            Some("fuse.safs")
        );
        assert_eq!(mounted_at(&e, Path::new("/mnt")), None);
    }

    #[test]
    fn longest_prefix_wins() {
        let e = parse(INFO);
        let m = |p: &str| mount_of(&e, Path::new(p)).unwrap().fstype.clone();
        assert_eq!(m("/home/x"), "ext4");
        assert_eq!(m("/tmp"), "tmpfs");
        assert_eq!(m("/tmp/xy"), "tmpfs");
        assert_eq!(m("/tmp/x/y"), "xfs");
        assert_eq!(m("/mnt/my safs/a"), "fuse.safs");
    }

    #[test]
    fn overmount_last_wins() {
        let text = format!("{INFO}60 22 0:50 / /tmp rw - ext4 /dev/loop1 rw\n");
        let e = parse(&text);
        assert_eq!(
            mount_of(&e, Path::new("/tmp/a")).unwrap().source,
            PathBuf::from("/dev/loop1")
        );
        assert_eq!(
            mounted_at(&e, Path::new("/tmp")).unwrap().source,
            PathBuf::from("/dev/loop1")
        );
    }
}
