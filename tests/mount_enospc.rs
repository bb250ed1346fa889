//! The disk under a volume fills up: applications get ENOSPC, nothing is
//! corrupted, nothing acknowledged is lost — also when another writer takes
//! every byte the moment it is freed — and service returns to normal once
//! space is freed. The volume lives on a small tmpfs made for the test.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn safs(args: &[&str]) -> (bool, String) {
    run(Command::new(env!("CARGO_BIN_EXE_safs")).args(args))
}

/// Whether `cmd` succeeded, and what it printed.
fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

struct SmallDisk {
    root: PathBuf,
    mnt: PathBuf,
    vol: PathBuf,
}

impl SmallDisk {
    fn new(mib: u32) -> Self {
        assert!(
            Path::new("/dev/fuse").exists(),
            "/dev/fuse is missing: this test mounts a real FUSE filesystem"
        );
        let root = tempfile::Builder::new()
            .prefix("safs-enospc")
            .tempdir_in("/tmp")
            .unwrap()
            .keep();
        let disk = root.join("disk");
        std::fs::create_dir_all(&disk).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(&disk)
            .status()
            .unwrap()
            .success();
        assert!(ok, "cannot mount a tmpfs for the test");
        let vol = disk.join("vol");
        let mnt = root.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        let (ok, out) = safs(&["format", vol.to_str().unwrap()]);
        assert!(ok, "{out}");
        let d = SmallDisk { root, mnt, vol };
        d.mount();
        d
    }

    /// Logging at debug level: the daemon then logs every refused change,
    /// so its log (in the volume) fills up with the disk, which the daemon
    /// must survive.
    fn mount(&self) {
        let (ok, out) = run(Command::new(env!("CARGO_BIN_EXE_safs"))
            .args([
                "mount",
                self.vol.to_str().unwrap(),
                self.mnt.to_str().unwrap(),
            ])
            .env("SAFS_LOG", "debug"));
        assert!(ok, "{out}");
    }

    /// What a failure needs to be understood: the disk's files and the
    /// daemon's log.
    fn report(&self) -> String {
        let mut out = String::from("files on the disk under the volume:\n");
        let mut stack = vec![self.root.join("disk")];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let Ok(meta) = e.metadata() else { continue };
                if meta.is_dir() {
                    stack.push(e.path());
                } else {
                    use std::os::unix::fs::MetadataExt;
                    out += &format!("  {:>10} {}\n", meta.blocks() * 512, e.path().display());
                }
            }
        }
        let log = std::fs::read_to_string(self.vol.join("safs.log")).unwrap_or_default();
        out + "safs.log:\n" + &log
    }

    fn unmount(&self) {
        let _ = common::umount_once_released(&self.mnt);
        let start = Instant::now();
        while safs::core::volume::VolumeLock::is_held(&self.vol)
            && start.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.report());
        }
        if Command::new("mountpoint")
            .arg("-q")
            .arg(&self.mnt)
            .status()
            .is_ok_and(|s| s.success())
        {
            self.unmount();
        }
        let _ = Command::new("umount").arg(self.root.join("disk")).status();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

#[test]
fn full_disk_gives_enospc_and_recovers_when_space_is_freed() {
    let d = SmallDisk::new(48);
    let m = &d.mnt;
    // Some state that must survive.
    std::fs::write(m.join("keep"), b"precious").unwrap();
    xattr_set(&m.join("keep"), "user.k", &[9u8; 3000]);

    // Fill the disk with file data until the kernel says ENOSPC.
    let mut big = std::fs::File::create(m.join("big")).unwrap();
    let chunk = vec![0x5au8; 1 << 20];
    let err = loop {
        if let Err(e) = big.write_all(&chunk) {
            break e;
        }
    };
    assert_eq!(errno(&err), libc::ENOSPC, "filling the disk: {err}");
    drop(big);

    // Metadata changes that need space now fail with ENOSPC, sooner or later
    // (what the engine holds ahead lets some through); none fails otherwise,
    // and each one acknowledged must survive. 64 KiB values take real pages.
    let mut saw_enospc = false;
    let mut acknowledged = Vec::new();
    std::fs::File::create(m.join("x")).unwrap();
    for i in 0..2000 {
        let name = format!("user.v{i}");
        match common::setxattr(&m.join("x"), &name, &[i as u8; 65_536], 0) {
            Ok(()) => acknowledged.push(i),
            Err(e) => {
                assert_eq!(e, common::Errno::ENOSPC, "setting {name}: {e}");
                assert_eq!(
                    common::getxattr(&m.join("x"), &name),
                    Err(common::Errno::ENODATA),
                    "a refused set left a value behind"
                );
                saw_enospc = true;
                break;
            }
        }
    }
    assert!(saw_enospc, "never ran out of space");
    // A refused create leaves no name behind.
    let mut create_refused = false;
    for i in 0..2000 {
        let p = m.join(format!("small{i}"));
        if let Err(e) = std::fs::File::create_new(&p) {
            assert_eq!(errno(&e), libc::ENOSPC, "creating small{i}: {e}");
            assert!(
                std::fs::symlink_metadata(&p).is_err(),
                "failed create of small{i} left a file"
            );
            create_refused = true;
            break;
        }
    }
    assert!(create_refused, "creates were never refused on a full disk");
    // What was there is intact and readable.
    assert_eq!(std::fs::read(m.join("keep")).unwrap(), b"precious");
    assert_eq!(xattr_get(&m.join("keep"), "user.k"), vec![9u8; 3000]);
    // Removing works on a full disk (it is what frees space).
    common::removexattr(&m.join("x"), "user.v0").unwrap();
    acknowledged.retain(|&i| i != 0);

    // Free the space: normal service resumes.
    std::fs::remove_file(m.join("big")).unwrap();
    let start = Instant::now();
    loop {
        match std::fs::write(m.join("after"), b"back") {
            Ok(()) => break,
            Err(e) => {
                assert_eq!(errno(&e), libc::ENOSPC, "{e}");
                assert!(
                    start.elapsed() < Duration::from_secs(15),
                    "service did not resume after space was freed"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    xattr_set(&m.join("after"), "user.a", &[1u8; 20_000]);

    // Nothing corrupted: remount, read back, fsck clean.
    d.unmount();
    assert_no_failed_commit(&d.vol);
    let (ok, out) = safs(&["fsck", d.vol.to_str().unwrap()]);
    assert!(ok, "fsck after ENOSPC: {out}");
    d.mount();
    for i in &acknowledged {
        assert_eq!(
            common::getxattr(&m.join("x"), &format!("user.v{i}")),
            Ok(vec![*i as u8; 65_536]),
            "acknowledged user.v{i} lost"
        );
    }
    assert_eq!(std::fs::read(m.join("keep")).unwrap(), b"precious");
    assert_eq!(std::fs::read(m.join("after")).unwrap(), b"back");
    assert_eq!(xattr_get(&m.join("after"), "user.a"), vec![1u8; 20_000]);
    d.unmount();
}

fn xattr_set(p: &Path, name: &str, value: &[u8]) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid C strings and buffer.
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(r, 0, "setxattr {name}: {}", std::io::Error::last_os_error());
}

fn xattr_get(p: &Path, name: &str) -> Vec<u8> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 65536];
    // SAFETY: valid C strings and buffer.
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(
        r >= 0,
        "getxattr {name}: {}",
        std::io::Error::last_os_error()
    );
    buf.truncate(r as usize);
    buf
}

/// The daemon never failed to commit what it had acknowledged.
fn assert_no_failed_commit(vol: &Path) {
    let log = std::fs::read_to_string(vol.join("safs.log")).unwrap_or_default();
    assert!(
        !log.contains("commit failed"),
        "a metadata commit failed:\n{log}"
    );
}

/// Another writer on the filesystem under the volume takes every byte the
/// moment it is free (generic/103's situation, where the old reserve was
/// released to it). Meanwhile safs creates, writes, sets xattrs and fsyncs.
/// Everything acknowledged must be committed — the volume is unmounted
/// while the disk is still full — and everything refused must have been
/// refused with ENOSPC.
#[test]
fn a_disk_filled_by_another_writer_loses_no_acknowledged_change() {
    let d = SmallDisk::new(64);
    let m = d.mnt.clone();
    let disk = d.root.join("disk");
    // Declared after `d`: stopped before the tmpfs is unmounted, even on a
    // panic.
    let hog = Hog::start(&disk, 128 << 20);

    // (file index, what was acknowledged for it)
    #[derive(Default)]
    struct Acked {
        created: bool,
        data: Option<Vec<u8>>,
        xattr: Option<Vec<u8>>,
    }
    let mut acked: Vec<Acked> = Vec::new();
    // Refused data writes, and refused metadata changes (the ones the
    // space held ahead is about): go on until there have been plenty.
    let (mut data_refusals, mut meta_refusals) = (0, 0);
    let start = Instant::now();
    let mut i = 0usize;
    while meta_refusals < 100 && start.elapsed() < Duration::from_secs(60) {
        let p = m.join(format!("f{i}"));
        let mut a = Acked::default();
        let mut refused = |e: common::Errno, what: &str| {
            assert_eq!(e, common::Errno::ENOSPC, "{what} f{i}: refused with {e}");
            if what == "writing" {
                data_refusals += 1;
            } else {
                meta_refusals += 1;
            }
        };
        match std::fs::File::create_new(&p) {
            Ok(mut f) => {
                a.created = true;
                let data = vec![(i % 251) as u8; 512 + (i % 7) * 1000];
                match f.write_all(&data).and_then(|()| f.sync_all()) {
                    Ok(()) => a.data = Some(data),
                    Err(e) => refused(common::errno_of(e), "writing"),
                }
                let value = vec![(i % 13) as u8; 200 + (i % 5) * 3000];
                match common::setxattr(&p, "user.meta", &value, 0) {
                    Ok(()) => match f.sync_all() {
                        Ok(()) => a.xattr = Some(value),
                        // Never: an acknowledged change must commit.
                        Err(e) => panic!("fsync after setxattr of f{i}: {e}"),
                    },
                    Err(e) => refused(e, "setting an xattr on"),
                }
            }
            Err(e) => {
                refused(common::errno_of(e), "creating");
                assert!(
                    std::fs::symlink_metadata(&p).is_err(),
                    "a refused create of f{i} left a name"
                );
            }
        }
        acked.push(a);
        i += 1;
    }
    eprintln!("{i} files tried, {data_refusals} data and {meta_refusals} metadata refusals");
    assert!(
        data_refusals > 0 && meta_refusals > 0,
        "the disk never filled"
    );
    let acknowledged = acked.iter().filter(|a| a.xattr.is_some()).count();
    assert!(acknowledged > 10, "too little acknowledged: {acknowledged}");

    // Unmount while the disk is still full: the final commit must succeed
    // with the space held for it.
    d.unmount();
    assert!(
        !safs::core::volume::VolumeLock::is_held(&d.vol),
        "the daemon did not finish"
    );
    drop(hog);
    for e in std::fs::read_dir(&disk).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("hog") {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    assert_no_failed_commit(&d.vol);
    let (ok, out) = safs(&["fsck", d.vol.to_str().unwrap()]);
    assert!(ok, "fsck after the full disk: {out}");

    d.mount();
    for (i, a) in acked.iter().enumerate() {
        let p = m.join(format!("f{i}"));
        if a.created {
            assert!(p.exists(), "acknowledged create of f{i} lost");
        }
        if let Some(data) = &a.data {
            assert_eq!(&std::fs::read(&p).unwrap(), data, "f{i}'s data");
        }
        match &a.xattr {
            Some(v) => assert_eq!(
                common::getxattr(&p, "user.meta").as_ref(),
                Ok(v),
                "acknowledged xattr of f{i} lost"
            ),
            None if a.created => assert!(
                matches!(
                    common::getxattr(&p, "user.meta"),
                    Err(common::Errno::ENODATA)
                ),
                "refused xattr of f{i} is there"
            ),
            None => {}
        }
    }
    d.unmount();
}

/// Another writer: takes every free byte of the tmpfs at `disk` with
/// `fallocate`, again and again, until dropped. It allocates only while
/// `disk` is still that tmpfs, and `limit` bytes at most, so that a test
/// gone wrong can never fill the filesystem beneath.
struct Hog {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Hog {
    fn start(disk: &Path, limit: u64) -> Hog {
        use std::os::unix::fs::MetadataExt;
        use std::sync::atomic::Ordering;
        const TMPFS_MAGIC: i64 = 0x0102_1994;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let dev = std::fs::metadata(disk).unwrap().dev();
        let still_the_tmpfs = {
            let disk = disk.to_path_buf();
            move || {
                std::fs::metadata(&disk).is_ok_and(|m| m.dev() == dev)
                    && common::statfs(&disk).f_type == TMPFS_MAGIC
            }
        };
        assert!(still_the_tmpfs(), "{} is not a tmpfs", disk.display());
        let thread = {
            let stop = std::sync::Arc::clone(&stop);
            let disk = disk.to_path_buf();
            std::thread::spawn(move || {
                let mut taken = 0u64;
                let mut n = 0u32;
                while !stop.load(Ordering::Relaxed) && still_the_tmpfs() && taken < limit {
                    let free = nix::sys::statvfs::statvfs(&disk)
                        .map(|v| v.blocks_available() * v.fragment_size())
                        .unwrap_or(0)
                        .min(limit - taken);
                    if free >= 4096 {
                        let Ok(f) = std::fs::File::create_new(disk.join(format!("hog{n}"))) else {
                            break;
                        };
                        n += 1;
                        // All of it, or whatever part of it is still there.
                        let mut len = free;
                        while len >= 4096 {
                            if nix::fcntl::fallocate(
                                &f,
                                nix::fcntl::FallocateFlags::empty(),
                                0,
                                len as i64,
                            )
                            .is_ok()
                            {
                                taken += len;
                                break;
                            }
                            len /= 2;
                        }
                    }
                    std::thread::yield_now();
                }
            })
        };
        Hog {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
