//! Conversions between core attributes and fuser's types.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo};

use crate::core::Attr;
use crate::core::Timestamp;

pub fn system_time(t: Timestamp) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs())
            + Duration::from_nanos(u64::from(t.nsec))
    }
}

pub fn timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let (mut sec, mut nsec) = (-(d.as_secs() as i64), d.subsec_nanos());
            if nsec > 0 {
                sec -= 1;
                nsec = 1_000_000_000 - nsec;
            }
            Timestamp { sec, nsec }
        }
    }
}

/// A time from a request. fuser 0.18 turns a wire time before 1970,
/// (secs < 0, nsecs), into `EPOCH - (|secs| s + nsecs ns)` where it means
/// `EPOCH - |secs| s + nsecs ns`; undo that here so that utimensat with
/// pre-1970 nanoseconds stores what the caller asked for.
pub fn request_time(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(_) => timestamp(t),
        Err(e) => {
            let d = e.duration();
            Timestamp {
                sec: -(d.as_secs() as i64),
                nsec: d.subsec_nanos(),
            }
        }
    }
}

pub fn file_type(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

pub fn dtype(kind: u8) -> FileType {
    file_type(u32::from(kind) << 12)
}

pub fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino.0),
        size: a.size,
        blocks: a.blocks,
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.crtime),
        kind: file_type(a.mode),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_times_round_trip() {
        for t in [
            Timestamp { sec: -1, nsec: 5 },
            Timestamp {
                sec: -100,
                nsec: 999_999_999,
            },
            Timestamp { sec: 0, nsec: 0 },
            Timestamp {
                sec: 1_700_000_000,
                nsec: 123,
            },
        ] {
            assert_eq!(timestamp(system_time(t)), t);
        }
    }

    #[test]
    fn request_times_undo_fusers_pre_1970_nanoseconds() {
        // fuser turns wire (-1_000_000, 500) into EPOCH - 1_000_000.0000005 s.
        let from_fuser = UNIX_EPOCH - Duration::new(1_000_000, 500);
        assert_eq!(
            request_time(from_fuser),
            Timestamp {
                sec: -1_000_000,
                nsec: 500
            }
        );
        let after = UNIX_EPOCH + Duration::new(5, 7);
        assert_eq!(request_time(after), Timestamp { sec: 5, nsec: 7 });
    }
}
