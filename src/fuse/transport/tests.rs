//! Real mounts served by a tiny handler built on hand-made structures (no
//! `proto`): INIT, LOOKUP and GETATTR, replies dropped or sent later,
//! notifications, passthrough ids, both ways of mounting.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use nix::mount::MsFlags;

use super::test_wire::*;
use super::*;

const SUBTYPE: &str = "safs";
const MAX_WRITE: u32 = 1 << 20;

/// `struct fuse_attr` (88 bytes).
fn attr(ino: u64, mode: u32, nlink: u32) -> Vec<u8> {
    let mut a = Vec::with_capacity(88);
    for v in [ino, 0, 0, 0, 0, 0] {
        a.extend_from_slice(&v.to_ne_bytes());
    }
    for v in [0u32, 0, 0, mode, nlink, 0, 0, 0, 4096, 0] {
        a.extend_from_slice(&v.to_ne_bytes());
    }
    assert_eq!(a.len(), 88);
    a
}

/// `struct fuse_attr_out`.
fn attr_out(ino: u64, mode: u32, nlink: u32) -> Vec<u8> {
    let mut o = Vec::with_capacity(104);
    o.extend_from_slice(&3600u64.to_ne_bytes());
    o.extend_from_slice(&[0; 8]);
    o.extend_from_slice(&attr(ino, mode, nlink));
    o
}

/// `struct fuse_entry_out`.
fn entry_out(ino: u64, mode: u32) -> Vec<u8> {
    let mut o = Vec::with_capacity(128);
    for v in [ino, 0, 3600, 3600] {
        o.extend_from_slice(&v.to_ne_bytes());
    }
    o.extend_from_slice(&[0; 8]);
    o.extend_from_slice(&attr(ino, mode, 1));
    o
}

/// The 64-byte `fuse_init_out` for the kernel's `fuse_init_in`.
fn init_reply(init_in: &[u8], passthrough: bool) -> (Vec<u8>, bool) {
    let kernel_flags = u32_at(init_in, 12);
    let kernel_flags2 = if kernel_flags & FUSE_INIT_EXT != 0 {
        u32_at(init_in, 16)
    } else {
        0
    };
    let mut flags = kernel_flags & (FUSE_MAX_PAGES | FUSE_INIT_EXT);
    let mut flags2 = 0;
    let passthrough = passthrough && kernel_flags2 & FUSE_PASSTHROUGH_2 != 0;
    if passthrough {
        flags |= FUSE_INIT_EXT;
        flags2 |= FUSE_PASSTHROUGH_2;
    }
    let mut o = Vec::with_capacity(64);
    for v in [7u32, 45, u32_at(init_in, 8), flags] {
        o.extend_from_slice(&v.to_ne_bytes());
    }
    o.extend_from_slice(&16u16.to_ne_bytes()); // max_background
    o.extend_from_slice(&12u16.to_ne_bytes()); // congestion_threshold
    o.extend_from_slice(&MAX_WRITE.to_ne_bytes());
    o.extend_from_slice(&1u32.to_ne_bytes()); // time_gran
    o.extend_from_slice(&256u16.to_ne_bytes()); // max_pages
    o.extend_from_slice(&0u16.to_ne_bytes()); // map_alignment
    o.extend_from_slice(&flags2.to_ne_bytes());
    o.extend_from_slice(&u32::from(passthrough).to_ne_bytes()); // max_stack_depth
    o.resize(64, 0);
    (o, passthrough)
}

/// A root directory whose only names are `file` (ino 2), `drop` (the reply
/// is dropped: EIO), and `later` (answered from another thread).
#[derive(Default)]
struct TestFs {
    lookups: Mutex<HashMap<Vec<u8>, u32>>,
    requests: AtomicU32,
}

impl TestFs {
    fn lookups(&self, name: &[u8]) -> u32 {
        self.lookups.lock().unwrap().get(name).copied().unwrap_or(0)
    }
}

impl Handler for TestFs {
    fn handle(&self, req: RawRequest<'_>, reply: Reply) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let opcode = u32_at(req.header, 4);
        let nodeid = u64_at(req.header, 16);
        assert_eq!(u64_at(req.header, 8), reply.unique());
        match opcode {
            OP_FORGET | OP_BATCH_FORGET | OP_INTERRUPT => reply.none(),
            OP_GETATTR if nodeid == 1 => reply.send(&[&attr_out(1, libc::S_IFDIR | 0o755, 2)]),
            OP_GETATTR if nodeid == 2 => reply.send(&[&attr_out(2, libc::S_IFREG | 0o644, 1)]),
            OP_LOOKUP if nodeid == 1 => {
                let name = req.payload.split(|&b| b == 0).next().unwrap_or(&[]);
                *self
                    .lookups
                    .lock()
                    .unwrap()
                    .entry(name.to_vec())
                    .or_default() += 1;
                match name {
                    b"file" => reply.send(&[&entry_out(2, libc::S_IFREG | 0o644)]),
                    b"drop" => drop(reply),
                    b"later" => {
                        std::thread::spawn(move || {
                            std::thread::sleep(Duration::from_millis(20));
                            reply.send(&[&entry_out(2, libc::S_IFREG | 0o644)]);
                        });
                    }
                    _ => reply.error(libc::ENOENT),
                }
            }
            _ => reply.error(libc::ENOSYS),
        }
    }
}

/// A mount being served; dropping it unmounts and waits for `serve`.
struct Mounted {
    dir: tempfile::TempDir,
    conn: Conn,
    fs: Arc<TestFs>,
    unmounter: Option<Unmounter>,
    served: mpsc::Receiver<io::Result<()>>,
    /// INIT enabled passthrough.
    passthrough: bool,
}

fn options() -> MountOptions {
    MountOptions {
        fsname: "safs-transport-test".into(),
        subtype: SUBTYPE.into(),
        flags: MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        allow_other: false,
        default_permissions: true,
    }
}

fn start(
    mounter: fn(&Path, &MountOptions) -> io::Result<(Conn, Unmounter)>,
    passthrough: bool,
) -> Mounted {
    start_uring(mounter, passthrough, false)
}

/// `uring`: the outcome of INIT asks for the rings (its reply does not).
fn start_uring(
    mounter: fn(&Path, &MountOptions) -> io::Result<(Conn, Unmounter)>,
    passthrough: bool,
    uring: bool,
) -> Mounted {
    let dir = tempfile::tempdir().unwrap();
    let (conn, unmounter) = mounter(dir.path(), &options()).unwrap();
    let fs = Arc::new(TestFs::default());
    let (tx, served) = mpsc::channel();
    let (init_tx, init_rx) = mpsc::channel();
    let handler: Arc<dyn Handler> = fs.clone();
    let serving = conn.clone();
    std::thread::spawn(move || {
        let init = |req: RawRequest<'_>| {
            assert_eq!(u32_at(req.header, 4), 26);
            let (reply, passthrough) = init_reply(req.payload, passthrough);
            let _ = init_tx.send(passthrough);
            Ok(InitOutcome {
                reply,
                uring,
                max_write: MAX_WRITE,
            })
        };
        let o = ServeOptions {
            threads: 2,
            uring_depth: 4,
            uring_yield: true,
            status: Default::default(),
        };
        let _ = tx.send(serve(&serving, handler, init, || {}, &o));
    });
    let mut m = Mounted {
        dir,
        conn,
        fs,
        unmounter: Some(unmounter),
        served,
        passthrough: false,
    };
    // INIT is answered once the first request comes: make one.
    std::fs::metadata(m.path()).unwrap();
    m.passthrough = init_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    m
}

impl Mounted {
    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Unmounts and returns what `serve` returned.
    fn unmount(&mut self) -> io::Result<()> {
        self.unmounter.as_mut().unwrap().unmount()?;
        self.served
            .recv_timeout(Duration::from_secs(5))
            .expect("serve did not end after the unmount")
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut u) = self.unmounter.take() {
            let _ = u.unmount();
        }
        let _ = self.served.recv_timeout(Duration::from_secs(5));
    }
}

/// `(fstype, source)` of the mount at `path` in /proc/self/mountinfo.
fn mountinfo(path: &Path) -> Option<(String, String)> {
    let path = path.canonicalize().ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().find_map(|l| {
        let fields: Vec<&str> = l.split(' ').collect();
        let dash = fields.iter().position(|f| *f == "-")?;
        (Path::new(fields[4]) == path)
            .then(|| (fields[dash + 1].to_owned(), fields[dash + 2].to_owned()))
    })
}

fn errno(r: io::Result<std::fs::Metadata>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

fn have_fusermount() -> bool {
    std::process::Command::new("fusermount3")
        .arg("-V")
        .output()
        .is_ok()
}

fn mount_serve_unmount(mounter: fn(&Path, &MountOptions) -> io::Result<(Conn, Unmounter)>) {
    let mut m = start(mounter, false);
    let root = std::fs::metadata(m.path()).unwrap();
    assert!(root.is_dir());
    assert_eq!(root.ino(), 1);
    assert_eq!(root.mode() & 0o7777, 0o755);
    let file = std::fs::metadata(m.path().join("file")).unwrap();
    assert!(file.is_file());
    assert_eq!(file.ino(), 2);
    assert_eq!(
        errno(std::fs::metadata(m.path().join("missing"))),
        Some(libc::ENOENT)
    );
    assert_eq!(
        mountinfo(m.path()),
        Some((format!("fuse.{SUBTYPE}"), "safs-transport-test".into()))
    );
    assert!(m.fs.requests.load(Ordering::Relaxed) >= 3);

    m.unmount().unwrap();
    assert_eq!(mountinfo(m.path()), None);
    // Idempotent, also once the session is gone.
    m.unmounter.as_mut().unwrap().unmount().unwrap();
}

#[test]
fn mount_serve_unmount_syscall() {
    mount_serve_unmount(mount);
}

#[test]
fn mount_serve_unmount_fusermount() {
    if !have_fusermount() {
        eprintln!("skipped: no fusermount3");
        return;
    }
    mount_serve_unmount(mount::mount_with_fusermount);
}

#[test]
fn a_failed_uring_start_leaves_dev_fuse_serving() {
    // The INIT reply lacks FUSE_OVER_IO_URING: the kernel refuses the rings.
    let mut m = start_uring(mount, false, true);
    assert!(std::fs::metadata(m.path().join("file")).unwrap().is_file());
    assert_eq!(m.fs.lookups(b"file"), 1);
    m.unmount().unwrap();
}

#[test]
fn dropped_reply_answers_eio_and_late_reply_arrives() {
    let m = start(mount, false);
    assert_eq!(
        errno(std::fs::metadata(m.path().join("drop"))),
        Some(libc::EIO)
    );
    let later = std::fs::metadata(m.path().join("later")).unwrap();
    assert_eq!(later.ino(), 2);
}

#[test]
fn inval_entry_drops_a_cached_name() {
    let m = start(mount, false);
    let file = m.path().join("file");
    std::fs::metadata(&file).unwrap();
    std::fs::metadata(&file).unwrap();
    assert_eq!(m.fs.lookups(b"file"), 1, "the entry is cached for an hour");

    let notifier = m.conn.notifier();
    notifier.inval_entry(1, b"file").unwrap();
    std::fs::metadata(&file).unwrap();
    assert_eq!(m.fs.lookups(b"file"), 2);

    notifier.inval_inode(2, -1, 0).unwrap();
    // Nothing cached under that parent: the kernel says ENOENT.
    let e = notifier.inval_entry(99, b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
}

#[test]
fn replies_and_notifications_after_the_session_fail_harmlessly() {
    let mut m = start(mount, false);
    let notifier = m.conn.notifier();
    let late = Reply::from_dev(12345, 0, 0, dev::DevRoute::new(Arc::clone(m.conn.file())));
    m.unmount().unwrap();
    // The kernel has nothing left to invalidate.
    assert!(notifier.inval_entry(1, b"file").is_err());
    late.send(&[&entry_out(2, libc::S_IFREG)]);
    let dropped = Reply::from_dev(12346, 0, 0, dev::DevRoute::new(Arc::clone(m.conn.file())));
    drop(dropped);
    drop(m);
    // Once every file of the session is closed.
    assert_eq!(
        notifier.inval_inode(1, 0, 0).unwrap_err().raw_os_error(),
        Some(libc::ENOTCONN)
    );
}

#[test]
fn backing_ids_open_and_close() {
    let m = start(mount, true);
    if !m.passthrough {
        eprintln!("skipped: the kernel offers no FUSE_PASSTHROUGH");
        return;
    }
    let backing = tempfile::tempfile().unwrap();
    let id = m.conn.open_backing(backing.as_fd()).unwrap();
    assert!(id.id() > 0);
    let second = m.conn.open_backing(backing.as_fd()).unwrap();
    assert_ne!(id.id(), second.id());
    drop(id);
    drop(second);
}

#[test]
fn unmounter_drop_unmounts() {
    let mut m = start(mount, false);
    assert!(mountinfo(m.path()).is_some());
    drop(m.unmounter.take());
    let served = m.served.recv_timeout(Duration::from_secs(5));
    assert!(matches!(served, Ok(Ok(()))), "{served:?}");
    assert_eq!(mountinfo(m.path()), None);
}

#[test]
fn refused_init_fails_serve_and_the_callers() {
    let dir = tempfile::tempdir().unwrap();
    // Declared after `dir`: dropped (unmounting) first, also on failure.
    let (conn, unmounter) = mount(dir.path(), &options()).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let o = ServeOptions {
            threads: 1,
            uring_depth: 0,
            uring_yield: true,
            status: Default::default(),
        };
        let handler = Arc::new(TestFs::default());
        let _ = tx.send(serve(&conn, handler, |_| Err(libc::EPROTO), || {}, &o));
    });
    let e = std::fs::metadata(dir.path()).unwrap_err();
    // Refused; or, once `serve` returned and closed the session file,
    // aborted.
    assert!(
        matches!(
            e.raw_os_error(),
            Some(libc::ECONNREFUSED) | Some(libc::ENOTCONN)
        ),
        "{e}"
    );
    let served = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(served.is_err());
    drop(unmounter);
    assert_eq!(mountinfo(dir.path()), None);
}
