//! Reply bodies: the structures that follow the `fuse_out_header`. The
//! transport writes the header; `IntoBytes::as_bytes` gives each body's
//! bytes.

use std::time::Duration;

use zerocopy::IntoBytes;

use super::abi;

/// A file's attributes, in the adapter's terms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttrFields {
    pub ino: u64,
    pub size: u64,
    /// In 512-byte units.
    pub blocks: u64,
    /// `(seconds since the epoch, nanoseconds)`; seconds may be negative.
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    /// File type and permission bits (`st_mode`).
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

/// `fuse_attr` from the adapter's attributes.
pub fn attr(a: &AttrFields) -> abi::Attr {
    abi::Attr {
        ino: a.ino,
        size: a.size,
        blocks: a.blocks,
        // The kernel's fields are u64 but read back as signed (time64_t).
        atime: a.atime.0 as u64,
        mtime: a.mtime.0 as u64,
        ctime: a.ctime.0 as u64,
        atimensec: a.atime.1,
        mtimensec: a.mtime.1,
        ctimensec: a.ctime.1,
        mode: a.mode,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

/// A cache lifetime as the kernel's `(valid, valid_nsec)` pair.
fn valid(d: Duration) -> (u64, u32) {
    (d.as_secs(), d.subsec_nanos())
}

/// The reply to LOOKUP, MKNOD, MKDIR, SYMLINK, LINK (and CREATE's first
/// part). `nodeid` 0 with an `entry_ttl` caches a negative entry.
pub fn entry_out(
    nodeid: u64,
    generation: u64,
    entry_ttl: Duration,
    attr_ttl: Duration,
    attr: abi::Attr,
) -> abi::EntryOut {
    let (entry_valid, entry_valid_nsec) = valid(entry_ttl);
    let (attr_valid, attr_valid_nsec) = valid(attr_ttl);
    abi::EntryOut {
        nodeid,
        generation,
        entry_valid,
        attr_valid,
        entry_valid_nsec,
        attr_valid_nsec,
        attr,
    }
}

/// The reply to GETATTR and SETATTR.
pub fn attr_out(ttl: Duration, attr: abi::Attr) -> abi::AttrOut {
    let (attr_valid, attr_valid_nsec) = valid(ttl);
    abi::AttrOut {
        attr_valid,
        attr_valid_nsec,
        dummy: 0,
        attr,
    }
}

/// The reply to OPEN and OPENDIR (and CREATE's second part). `backing_id`
/// counts only with `FOPEN_PASSTHROUGH` in `open_flags`.
pub fn open_out(fh: u64, open_flags: u32, backing_id: i32) -> abi::OpenOut {
    abi::OpenOut {
        fh,
        open_flags,
        backing_id,
    }
}

/// The reply to WRITE: the bytes written.
pub fn write_out(size: u32) -> abi::WriteOut {
    abi::WriteOut { size, padding: 0 }
}

/// The reply to STATFS.
#[allow(clippy::too_many_arguments)] // statfs's own fields, in its order
pub fn statfs_out(
    blocks: u64,
    bfree: u64,
    bavail: u64,
    files: u64,
    ffree: u64,
    bsize: u32,
    namelen: u32,
    frsize: u32,
) -> abi::StatfsOut {
    abi::StatfsOut {
        st: abi::Kstatfs {
            blocks,
            bfree,
            bavail,
            files,
            ffree,
            bsize,
            namelen,
            frsize,
            padding: 0,
            spare: [0; 6],
        },
    }
}

/// The reply to a GETXATTR or LISTXATTR size query (`size` 0 asked).
pub fn getxattr_out(size: u32) -> abi::GetxattrOut {
    abi::GetxattrOut { size, padding: 0 }
}

/// The reply to LSEEK: the new offset.
pub fn lseek_out(offset: i64) -> abi::LseekOut {
    abi::LseekOut {
        offset: offset as u64,
    }
}

/// What the daemon answers to INIT.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InitReply {
    /// The minor version to speak: the smaller of the kernel's and ours.
    pub minor: u32,
    pub max_readahead: u32,
    /// The `abi::FUSE_*` INIT flags accepted, all 64 bits.
    pub flags: u64,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    /// Timestamp granularity in nanoseconds (1 = exact).
    pub time_gran: u32,
    /// With `FUSE_MAX_PAGES`: the most pages in one request.
    pub max_pages: u16,
    /// With `FUSE_PASSTHROUGH`: how deep backing files may stack.
    pub max_stack_depth: u32,
}

/// The INIT reply, 64 bytes: major 7, `FUSE_INIT_EXT` set and the flags'
/// high half in `flags2`.
pub fn init_out(o: &InitReply) -> Vec<u8> {
    let flags = o.flags | abi::FUSE_INIT_EXT;
    abi::InitOut {
        major: abi::FUSE_KERNEL_VERSION,
        minor: o.minor,
        max_readahead: o.max_readahead,
        flags: flags as u32,
        max_background: o.max_background,
        congestion_threshold: o.congestion_threshold,
        max_write: o.max_write,
        time_gran: o.time_gran,
        max_pages: o.max_pages,
        map_alignment: 0,
        flags2: (flags >> 32) as u32,
        max_stack_depth: o.max_stack_depth,
        request_timeout: 0,
        unused: [0; 11],
    }
    .as_bytes()
    .to_vec()
}

/// A READDIR / READDIRPLUS reply being filled, never over `max` bytes.
///
/// Each record is a `fuse_dirent` (or `fuse_direntplus`) header, the name,
/// and zeros to the next 8-byte boundary, as `FUSE_DIRENT_SIZE` counts.
/// Names must be non-empty and free of `/` (the kernel fails the whole
/// READDIR with EIO otherwise).
#[derive(Clone, Debug)]
pub struct DirBuf {
    buf: Vec<u8>,
    max: usize,
}

impl DirBuf {
    /// An empty reply for a READDIR of `size` bytes (`max`).
    pub fn new(max: usize) -> Self {
        DirBuf {
            buf: Vec::new(),
            max,
        }
    }

    /// Adds a READDIR record; `cookie` is the offset to resume after it,
    /// `dtype` a `DT_*` value. False when it does not fit (nothing added).
    pub fn add(&mut self, ino: u64, cookie: u64, dtype: u32, name: &[u8]) -> bool {
        let Ok(namelen) = u32::try_from(name.len()) else {
            return false;
        };
        let dirent = abi::Dirent {
            ino,
            off: cookie,
            namelen,
            typ: dtype,
        };
        self.push(dirent.as_bytes(), name)
    }

    /// Adds a READDIRPLUS record: the entry as LOOKUP would answer it
    /// (`nodeid` 0: no lookup is counted), then the dirent, whose `ino` is
    /// `entry.attr.ino`. False when it does not fit (nothing added).
    pub fn add_plus(
        &mut self,
        entry: &abi::EntryOut,
        cookie: u64,
        dtype: u32,
        name: &[u8],
    ) -> bool {
        let Ok(namelen) = u32::try_from(name.len()) else {
            return false;
        };
        let plus = abi::Direntplus {
            entry_out: *entry,
            dirent: abi::Dirent {
                ino: entry.attr.ino,
                off: cookie,
                namelen,
                typ: dtype,
            },
        };
        self.push(plus.as_bytes(), name)
    }

    fn push(&mut self, head: &[u8], name: &[u8]) -> bool {
        let len = head.len() + name.len();
        let padded = abi::rec_align(len);
        if self.buf.len() + padded > self.max {
            return false;
        }
        self.buf.extend_from_slice(head);
        self.buf.extend_from_slice(name);
        self.buf.resize(self.buf.len() + padded - len, 0);
        true
    }

    /// The reply body.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// No record yet (the reply then means: end of directory).
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// The body of a `FUSE_NOTIFY_INVAL_INODE` notification: drop `ino`'s
/// cached attributes and its cached data in `[off, off + len)` (`len` 0:
/// to the end; `off` negative: attributes only).
pub fn notify_inval_inode(ino: u64, off: i64, len: i64) -> abi::NotifyInvalInodeOut {
    abi::NotifyInvalInodeOut { ino, off, len }
}

/// The body of a `FUSE_NOTIFY_INVAL_ENTRY` notification: the structure,
/// the name, a NUL. `flags`: 0 or `FUSE_EXPIRE_ONLY`. `None` if the name
/// does not fit the kernel's `namelen`.
pub fn notify_inval_entry(parent: u64, name: &[u8], flags: u32) -> Option<Vec<u8>> {
    let head = abi::NotifyInvalEntryOut {
        parent,
        namelen: u32::try_from(name.len()).ok()?,
        flags,
    };
    let mut body = Vec::with_capacity(size_of_val(&head) + name.len() + 1);
    body.extend_from_slice(head.as_bytes());
    body.extend_from_slice(name);
    body.push(0);
    Some(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromBytes;

    fn sample_attr() -> abi::Attr {
        attr(&AttrFields {
            ino: 42,
            size: 1 << 33,
            blocks: 17,
            atime: (-1, 5),
            mtime: (1_700_000_000, 6),
            ctime: (1_700_000_001, 7),
            mode: 0o100644,
            nlink: 2,
            uid: 1000,
            gid: 1001,
            rdev: 0x0801,
            blksize: 4096,
        })
    }

    #[test]
    fn attr_maps_every_field() {
        let a = sample_attr();
        assert_eq!((a.ino, a.size, a.blocks), (42, 1 << 33, 17));
        // Pre-epoch times travel as two's complement, read back signed.
        assert_eq!(a.atime as i64, -1);
        assert_eq!((a.mtime, a.ctime), (1_700_000_000, 1_700_000_001));
        assert_eq!((a.atimensec, a.mtimensec, a.ctimensec), (5, 6, 7));
        assert_eq!((a.mode, a.nlink, a.uid, a.gid), (0o100644, 2, 1000, 1001));
        assert_eq!((a.rdev, a.blksize, a.flags), (0x0801, 4096, 0));
    }

    #[test]
    fn entry_and_attr_out_split_ttls_into_secs_and_nsecs() {
        let e = entry_out(
            42,
            3,
            Duration::from_millis(1500),
            Duration::new(3600, 7),
            sample_attr(),
        );
        assert_eq!((e.nodeid, e.generation), (42, 3));
        assert_eq!((e.entry_valid, e.entry_valid_nsec), (1, 500_000_000));
        assert_eq!((e.attr_valid, e.attr_valid_nsec), (3600, 7));
        assert_eq!(e.attr, sample_attr());
        let bytes = e.as_bytes();
        assert_eq!(bytes.len(), 128);
        assert_eq!(bytes[16..24], 1u64.to_ne_bytes()); // entry_valid
        assert_eq!(bytes[40..48], 42u64.to_ne_bytes()); // attr.ino

        let o = attr_out(Duration::from_nanos(2_000_000_003), sample_attr());
        assert_eq!((o.attr_valid, o.attr_valid_nsec, o.dummy), (2, 3, 0));
        assert_eq!(o.as_bytes().len(), 104);
        assert_eq!(o.as_bytes()[16..24], 42u64.to_ne_bytes()); // attr.ino
    }

    #[test]
    fn small_replies_hold_their_fields() {
        let o = open_out(0xfeed, abi::FOPEN_PASSTHROUGH | abi::FOPEN_KEEP_CACHE, 9);
        assert_eq!(
            o.as_bytes(),
            [
                0xfeedu64.to_ne_bytes().as_slice(),
                &0x82u32.to_ne_bytes(),
                &9i32.to_ne_bytes()
            ]
            .concat()
        );
        assert_eq!(
            write_out(4096).as_bytes(),
            [4096u32.to_ne_bytes(), [0; 4]].concat()
        );
        assert_eq!(
            getxattr_out(77).as_bytes(),
            [77u32.to_ne_bytes(), [0; 4]].concat()
        );
        assert_eq!(lseek_out(-1).as_bytes(), (-1i64).to_ne_bytes());
        let s = statfs_out(1, 2, 3, 4, 5, 4096, 255, 512).st;
        assert_eq!(
            (s.blocks, s.bfree, s.bavail, s.files, s.ffree),
            (1, 2, 3, 4, 5)
        );
        assert_eq!((s.bsize, s.namelen, s.frsize), (4096, 255, 512));
        assert_eq!(statfs_out(1, 2, 3, 4, 5, 6, 7, 8).as_bytes().len(), 80);
    }

    #[test]
    fn init_out_is_64_bytes_with_flags2_from_the_high_bits() {
        let flags = abi::FUSE_ASYNC_READ
            | abi::FUSE_MAX_PAGES
            | abi::FUSE_PASSTHROUGH
            | abi::FUSE_OVER_IO_URING;
        let bytes = init_out(&InitReply {
            minor: 45,
            max_readahead: 1 << 20,
            flags,
            max_background: 64,
            congestion_threshold: 48,
            max_write: 1 << 20,
            time_gran: 1,
            max_pages: 256,
            max_stack_depth: 1,
        });
        assert_eq!(bytes.len(), 64);
        let o = abi::InitOut::read_from_bytes(&bytes).unwrap();
        assert_eq!((o.major, o.minor, o.max_readahead), (7, 45, 1 << 20));
        assert_eq!(
            o.flags,
            (abi::FUSE_ASYNC_READ | abi::FUSE_MAX_PAGES | abi::FUSE_INIT_EXT) as u32
        );
        assert_eq!(o.flags2, (1 << 5) | (1 << 9)); // bits 37 and 41
        assert_eq!(bytes[32..36], o.flags2.to_ne_bytes()); // where the kernel reads flags2
        assert_eq!((o.max_background, o.congestion_threshold), (64, 48));
        assert_eq!((o.max_write, o.time_gran, o.max_pages), (1 << 20, 1, 256));
        assert_eq!(
            (o.map_alignment, o.max_stack_depth, o.request_timeout),
            (0, 1, 0)
        );
        assert!(bytes[42..].iter().all(|&b| b == 0)); // unused
    }

    /// Reads the records back the way the kernel's `fuse_parse_dirfile`
    /// walks them: (ino, off, type, name), checking padding on the way.
    fn parse(mut bytes: &[u8]) -> Vec<(u64, u64, u32, Vec<u8>)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let (d, rest) = abi::Dirent::read_from_prefix(bytes).unwrap();
            let len = abi::rec_align(abi::FUSE_NAME_OFFSET + d.namelen as usize);
            let name = rest[..d.namelen as usize].to_vec();
            assert!(
                bytes[24 + name.len()..len].iter().all(|&b| b == 0),
                "padding zeroed"
            );
            out.push((d.ino, d.off, d.typ, name));
            bytes = &bytes[len..];
        }
        out
    }

    #[test]
    fn dirbuf_records_are_aligned_and_padded() {
        let mut b = DirBuf::new(4096);
        assert!(b.is_empty());
        assert!(b.add(2, 1, 4, b"."));
        assert!(b.add(1, 2, 4, b".."));
        assert!(b.add(77, 3, 8, b"eight..8")); // 24 + 8: no padding
        assert!(b.add(78, 4, 10, b"nine.....")); // 24 + 9: 7 bytes of it
        assert!(!b.is_empty());
        assert_eq!(b.bytes().len(), 32 + 32 + 32 + 40);
        assert_eq!(
            parse(b.bytes()),
            vec![
                (2, 1, 4, b".".to_vec()),
                (1, 2, 4, b"..".to_vec()),
                (77, 3, 8, b"eight..8".to_vec()),
                (78, 4, 10, b"nine.....".to_vec()),
            ]
        );
    }

    #[test]
    fn dirbuf_refuses_what_does_not_fit_and_writes_nothing_of_it() {
        let mut b = DirBuf::new(32 + 39);
        assert!(b.add(5, 1, 8, b"a"));
        let before = b.bytes().to_vec();
        assert!(!b.add(6, 2, 8, b"0123456789abcdef")); // 40 bytes > 39 left
        assert_eq!(b.bytes(), before);
        assert!(b.add(6, 2, 8, b"0123456")); // 24 + 7 = 31, padded 32: fits
        assert_eq!(b.bytes().len(), 64);
        assert!(!b.add(7, 3, 8, b"x"));
        assert_eq!(parse(b.bytes()).len(), 2);

        let mut tiny = DirBuf::new(31);
        assert!(!tiny.add(1, 1, 4, b"x"));
        assert!(tiny.is_empty());
        assert!(!tiny.add_plus(&abi::EntryOut::default(), 1, 4, b"x"));
        assert!(tiny.is_empty());
    }

    #[test]
    fn dirbuf_plus_layout() {
        let e = entry_out(
            42,
            9,
            Duration::from_secs(1),
            Duration::from_secs(2),
            sample_attr(),
        );
        let mut b = DirBuf::new(4096);
        assert!(b.add_plus(&e, 7, 8, b"file"));
        let mut zero = abi::EntryOut::default();
        zero.attr.ino = 43;
        assert!(b.add_plus(&zero, 8, 4, b"dir")); // nodeid 0: a plain dirent
        let bytes = b.bytes();
        assert_eq!(bytes.len(), 160 + 160); // rec_align(152 + 4), rec_align(152 + 3)

        let (plus, rest) = abi::Direntplus::read_from_prefix(bytes).unwrap();
        assert_eq!(plus.entry_out, e);
        assert_eq!(
            plus.dirent,
            abi::Dirent {
                ino: 42,
                off: 7,
                namelen: 4,
                typ: 8
            }
        );
        assert_eq!(&rest[..4], b"file");
        assert!(rest[4..8].iter().all(|&b| b == 0));

        let (plus, rest) = abi::Direntplus::read_from_prefix(&bytes[160..]).unwrap();
        assert_eq!(
            (plus.entry_out.nodeid, plus.dirent.ino, plus.dirent.off),
            (0, 43, 8)
        );
        assert_eq!(&rest[..3], b"dir");
        assert!(rest[3..8].iter().all(|&b| b == 0));

        let mut full = DirBuf::new(160 + 159);
        assert!(full.add_plus(&e, 1, 8, b"file"));
        assert!(!full.add_plus(&e, 2, 8, b"file"));
        assert_eq!(full.bytes().len(), 160);
    }

    #[test]
    fn notify_bodies() {
        assert_eq!(
            notify_inval_inode(5, -1, 0).as_bytes(),
            [
                5u64.to_ne_bytes(),
                (-1i64).to_ne_bytes(),
                0i64.to_ne_bytes()
            ]
            .concat()
        );
        let body = notify_inval_entry(1, b"name", abi::FUSE_EXPIRE_ONLY).unwrap();
        assert_eq!(
            body,
            [
                1u64.to_ne_bytes().as_slice(),
                &4u32.to_ne_bytes(),
                &1u32.to_ne_bytes(),
                b"name\0"
            ]
            .concat()
        );
    }
}
