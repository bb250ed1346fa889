//! The disk under a volume fills up: applications get ENOSPC, nothing is
//! corrupted, and service returns to normal once space is freed. The volume
//! lives on a small tmpfs made for the test.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn safs(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_safs"))
        .args(args)
        .output()
        .unwrap();
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

    fn mount(&self) {
        let (ok, out) = safs(&[
            "mount",
            self.vol.to_str().unwrap(),
            self.mnt.to_str().unwrap(),
        ]);
        assert!(ok, "{out}");
    }

    fn unmount(&self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
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
    // (the first few may still fit); none fails otherwise.
    let mut saw_enospc = false;
    for i in 0..2000 {
        let p = m.join(format!("small{i}"));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
        {
            Ok(_) => {}
            Err(e) => {
                assert_eq!(errno(&e), libc::ENOSPC, "creating small{i}: {e}");
                // A create that failed left no name behind.
                assert!(
                    std::fs::symlink_metadata(&p).is_err(),
                    "failed create of small{i} left a file"
                );
                saw_enospc = true;
                break;
            }
        }
    }
    assert!(saw_enospc, "never ran out of space");
    // What was there is intact and readable.
    assert_eq!(std::fs::read(m.join("keep")).unwrap(), b"precious");
    assert_eq!(xattr_get(&m.join("keep"), "user.k"), vec![9u8; 3000]);

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
    let log = std::fs::read_to_string(d.vol.join("safs.log")).unwrap_or_default();
    assert!(
        log.contains("released the reserve"),
        "the engine never needed its reserve: {log}"
    );
    let (ok, out) = safs(&["fsck", d.vol.to_str().unwrap()]);
    assert!(ok, "fsck after ENOSPC: {out}");
    d.mount();
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
