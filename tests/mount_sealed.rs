//! Tampering with an encrypted volume at rest, then reading it through a
//! real mount: a changed content block reads as EIO (the pages it shares,
//! and the log names it), content blocks swapped between files read as EIO, an
//! inode record moved onto another inode's key reads as EIO — never as
//! other data.

mod common;

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use common::*;

/// Plaintext bytes of a block: each is sealed into one 4 KiB page of the
/// backing file (nonce and tag take 28 bytes).
const BLOCK: u64 = 4096 - 28;
const UNIT: u64 = 4096;

/// A mounted encrypted volume, and the directory holding its passphrase
/// file (removed when dropped, after the volume).
fn encrypted_volume() -> (TestVolume, tempfile::TempDir) {
    let dir = tempfile::Builder::new()
        .prefix("safs-sealed-pass")
        .tempdir_in("/tmp")
        .unwrap();
    let pass = dir.path().join("passphrase");
    std::fs::write(&pass, b"tamper test\n").unwrap();
    let p = pass.to_str().unwrap().to_string();
    let mut v = TestVolume::formatted(&["--encrypt", "--kdf-testing", "--passphrase-file", &p]);
    v.set_options(&[&format!("passphrase_file={p}")]);
    v.mount();
    (v, dir)
}

fn backing(vol: &Path, ino: u64) -> PathBuf {
    vol.join(format!("data/{:02x}/{ino:016x}", ino & 0xff))
}

fn read_at(path: &Path, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; len];
    let n = f.read_at(&mut buf, offset)?;
    buf.truncate(n);
    Ok(buf)
}

#[test]
fn a_changed_content_block_reads_as_eio_and_only_the_pages_it_shares() {
    let (mut v, _pass) = encrypted_volume();
    let data = pattern(7, 5 * BLOCK as usize);
    write_file(&v.path("f"), &data);
    let ino = meta(&v.path("f")).ino();
    v.unmount();
    let b = backing(v.vol(), ino);
    assert_eq!(
        std::fs::metadata(&b).unwrap().len(),
        5 * UNIT,
        "five whole blocks, a page each"
    );
    // Flip a byte of block 2 (a constant would leave it as it was once in
    // 256 runs: sealed bytes are random).
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&b)
        .unwrap();
    let mut byte = [0u8];
    f.read_exact_at(&mut byte, 2 * UNIT + 100).unwrap();
    f.write_all_at(&[byte[0] ^ 0xff], 2 * UNIT + 100).unwrap();
    drop(f);
    v.mount();
    // Block 2 is plaintext bytes 8136..12204: the kernel reads whole
    // pages, so pages 1 and 2 (4096..12288) fail; pages 0 and 3.. read.
    let p = v.path("f");
    assert_eq!(read_at(&p, 0, 4096).unwrap(), &data[..4096]);
    assert_eq!(read_at(&p, 12288, 1 << 20).unwrap(), &data[12288..]);
    let e = read_at(&p, 2 * BLOCK + 10, 100).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let log = v.daemon_log();
    assert!(
        log.contains("failed authentication")
            && log.contains(&format!("ino={ino}"))
            && log.contains("block=2"),
        "the log names the inode and block: {log}"
    );
    // Writing the pages it shares whole again heals it (a partial page
    // would have the kernel read the rest of it first).
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(&data[4096..12288], 4096).unwrap();
    drop(f);
    assert_eq!(read_file(&p), data);
}

#[test]
fn blocks_swapped_between_files_read_as_eio() {
    let (mut v, _pass) = encrypted_volume();
    let (a, b) = (
        pattern(1, 2 * BLOCK as usize),
        pattern(2, 2 * BLOCK as usize),
    );
    write_file(&v.path("a"), &a);
    write_file(&v.path("b"), &b);
    let (ia, ib) = (meta(&v.path("a")).ino(), meta(&v.path("b")).ino());
    v.unmount();
    let (pa, pb) = (backing(v.vol(), ia), backing(v.vol(), ib));
    let tmp = v.root().join("swap");
    std::fs::rename(&pa, &tmp).unwrap();
    std::fs::rename(&pb, &pa).unwrap();
    std::fs::rename(&tmp, &pb).unwrap();
    v.mount();
    for name in ["a", "b"] {
        let e = std::fs::read(v.path(name)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{name}: {e}");
    }
}

#[test]
fn an_inode_record_moved_to_another_key_reads_as_eio() {
    use safs::format::keys;
    let (mut v, _pass) = encrypted_volume();
    write_file(&v.path("a"), b"first");
    std::fs::create_dir(v.path("d")).unwrap();
    write_file(&v.path("d/b"), b"second");
    let (ia, ib) = (meta(&v.path("a")).ino(), meta(&v.path("d/b")).ino());
    v.unmount();
    {
        let (store, _sb) = safs::core::volume::open_store(v.vol()).unwrap();
        let ra = store.get(&keys::inode(ia)).unwrap().unwrap();
        store
            .commit(&[(keys::inode(ib).to_vec(), Some(ra))])
            .unwrap();
    }
    v.mount();
    let e = std::fs::metadata(v.path("d/b")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    // Everything else is served.
    assert_eq!(read_file(&v.path("a")), b"first");
}

#[test]
fn sparse_files_truncate_and_append_keep_working() {
    let (v, _pass) = encrypted_volume();
    let p = v.path("sparse");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    f.write_all_at(b"head", 0).unwrap();
    f.write_all_at(b"tail", 10 * BLOCK + 5).unwrap();
    let mut want = vec![0u8; (10 * BLOCK + 9) as usize];
    want[..4].copy_from_slice(b"head");
    want[(10 * BLOCK + 5) as usize..].copy_from_slice(b"tail");
    assert_eq!(read_file(&p), want);
    f.set_len(3 * BLOCK + 1).unwrap();
    want.truncate((3 * BLOCK + 1) as usize);
    assert_eq!(read_file(&p), want);
    f.set_len(5 * BLOCK).unwrap();
    want.resize((5 * BLOCK) as usize, 0);
    assert_eq!(read_file(&p), want);
    drop(f);
    let mut app = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
    use std::io::Write;
    app.write_all(b"appended").unwrap();
    drop(app);
    want.extend_from_slice(b"appended");
    assert_eq!(read_file(&p), want);
    assert_eq!(meta(&p).len(), want.len() as u64);
    // mmap through the daemon data path.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    let len = want.len();
    // SAFETY: a private mapping of a file this test owns, unmapped below.
    unsafe {
        let m = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        );
        assert_ne!(m, libc::MAP_FAILED);
        let s = std::slice::from_raw_parts_mut(m as *mut u8, len);
        assert_eq!(&s[..4], b"head");
        s[100..104].copy_from_slice(b"mmap");
        assert_eq!(libc::msync(m, len, libc::MS_SYNC), 0);
        libc::munmap(m, len);
    }
    drop(f);
    want[100..104].copy_from_slice(b"mmap");
    assert_eq!(read_file(&p), want);
}
