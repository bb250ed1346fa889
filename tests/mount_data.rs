//! File data through a real FUSE mount, in both data paths: kernel FUSE
//! passthrough (`-o passthrough`) and daemon-side read/write
//! (`-o nopassthrough`). Every check runs once per mode, as
//! `<check>::passthrough` and `<check>::nopassthrough`.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::time::Duration;

use common::*;

const MIB: usize = 1024 * 1024;

/// Runs `$check(&[mode])` as one test per data path.
macro_rules! both_modes {
    ($check:ident) => {
        mod $check {
            #[test]
            fn passthrough() {
                super::$check(&["passthrough"]);
            }
            #[test]
            fn nopassthrough() {
                super::$check(&["nopassthrough"]);
            }
        }
    };
}

fn open_rw(p: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(p)
        .unwrap_or_else(|e| panic!("open {}: {e}", p.display()))
}

/// Small deterministic generator for offsets and lengths.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Random pwrite/pread/truncate against an in-memory model, read back
/// through a second descriptor and after remount.
fn random_io_matches_a_model(opts: &[&str]) {
    let mut v = TestVolume::with_options(opts);
    let p = v.path("model");
    let f = open_rw(&p);
    let other = File::open(&p).unwrap();
    let mut model: Vec<u8> = Vec::new();
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    for step in 0..400u64 {
        match rng.below(10) {
            0..=5 => {
                let off = rng.below(6 * MIB as u64) as usize;
                let len = 1 + rng.below(200_000) as usize;
                let data = pattern(step, len);
                f.write_all_at(&data, off as u64).unwrap();
                if model.len() < off + len {
                    model.resize(off + len, 0);
                }
                model[off..off + len].copy_from_slice(&data);
            }
            6..=8 => {
                let off = rng.below(model.len() as u64 + 1000) as usize;
                let len = rng.below(300_000) as usize;
                let mut buf = vec![0u8; len];
                // Alternate descriptors: both see the same bytes.
                let fd = if step % 2 == 0 { &f } else { &other };
                let n = read_fully_at(fd, &mut buf, off as u64);
                let end = model.len().min(off + len);
                let want = if off < end { &model[off..end] } else { &[][..] };
                assert_eq!(n, want.len(), "step {step}: short read at {off}");
                assert_bytes_eq(&buf[..n], want, &format!("step {step}: pread at {off}"));
            }
            _ => {
                let len = rng.below(7 * MIB as u64) as usize;
                f.set_len(len as u64).unwrap();
                model.resize(len, 0);
            }
        }
        assert_eq!(
            f.metadata().unwrap().len(),
            model.len() as u64,
            "step {step}: size"
        );
    }
    drop(f);
    drop(other);
    assert_bytes_eq(&read_file(&p), &model, "whole file before remount");
    v.remount();
    assert_bytes_eq(&read_file(&p), &model, "whole file after remount");
}
both_modes!(random_io_matches_a_model);

/// Reads until `buf` is full or EOF; returns bytes read.
fn read_fully_at(f: &File, buf: &mut [u8], off: u64) -> usize {
    let mut done = 0;
    while done < buf.len() {
        let n = f.read_at(&mut buf[done..], off + done as u64).unwrap();
        if n == 0 {
            break;
        }
        done += n;
    }
    done
}

fn large_sequential_write_and_read(opts: &[&str]) {
    let mut v = TestVolume::with_options(opts);
    let p = v.path("large");
    let mut f = File::create(&p).unwrap();
    for i in 0..48 {
        f.write_all(&pattern(i, MIB)).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    let check = |p: &Path| {
        let mut f = File::open(p).unwrap();
        let mut buf = vec![0u8; MIB];
        for i in 0..48 {
            f.read_exact(&mut buf).unwrap();
            assert_bytes_eq(&buf, &pattern(i, MIB), &format!("MiB {i}"));
        }
        assert_eq!(f.read(&mut buf).unwrap(), 0, "EOF after 48 MiB");
    };
    check(&p);
    v.remount();
    assert_eq!(lmeta(&p).len(), 48 * MIB as u64);
    check(&p);
}
both_modes!(large_sequential_write_and_read);

fn mmap_shared_read_and_write(opts: &[&str]) {
    let mut v = TestVolume::with_options(opts);
    let p = v.path("mapped");
    let page = 4096;
    let len = 3 * page + 100;
    let mut model = pattern(42, len);
    write_file(&p, &model);
    let f = open_rw(&p);
    // SAFETY: mapping a file we own for `len` bytes; unmapped below before
    // the file is closed, and only accessed within bounds.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(
        map,
        libc::MAP_FAILED,
        "mmap: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `map` is a valid mapping of `len` bytes until munmap.
    let view = unsafe { std::slice::from_raw_parts_mut(map.cast::<u8>(), len) };
    assert_bytes_eq(view, &model, "mapping shows the file");

    // Stores through the mapping reach read().
    for off in [0, 1, page - 1, page, 2 * page + 17, len - 1] {
        view[off] = !view[off];
        model[off] = !model[off];
    }
    view[page * 3..page * 3 + 50].copy_from_slice(&[0xAB; 50]);
    model[page * 3..page * 3 + 50].copy_from_slice(&[0xAB; 50]);
    // SAFETY: valid mapping.
    assert_eq!(unsafe { libc::msync(map, len, libc::MS_SYNC) }, 0, "msync");
    assert_bytes_eq(
        &read_file(&p),
        &model,
        "read() after stores through the mapping",
    );

    // write() is visible in the mapping.
    let other = OpenOptions::new().write(true).open(&p).unwrap();
    other.write_all_at(b"written by write()", 100).unwrap();
    model[100..118].copy_from_slice(b"written by write()");
    assert_bytes_eq(view, &model, "mapping after write()");
    // SAFETY: unmapping the mapping created above, once.
    assert_eq!(unsafe { libc::munmap(map, len) }, 0);
    drop(other);
    drop(f);
    v.remount();
    assert_bytes_eq(&read_file(&p), &model, "after remount");
}
both_modes!(mmap_shared_read_and_write);

/// xfstests generic/080, 215: stores through a shared mapping move mtime
/// and ctime, seen by a `stat` while the file is mapped and after it is
/// closed — also under passthrough, where no request carries them.
fn mmap_stores_move_mtime_and_ctime(opts: &[&str]) {
    let v = TestVolume::with_options(opts);
    let p = v.path("m");
    write_file(&p, &[1u8; 4096]);
    let before = (meta(&p).mtime(), meta(&p).mtime_nsec());
    // Coarser than any filesystem clock under the volume.
    std::thread::sleep(Duration::from_millis(1100));
    let f = open_rw(&p);
    // SAFETY: a shared mapping of 4096 bytes of a file that long, unmapped
    // below, and only touched within bounds.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    // SAFETY: within the mapping.
    unsafe { *map.cast::<u8>() = 2 };
    // (On the daemon data path the store reaches the daemon on write-back.)
    // SAFETY: the mapping made above.
    assert_eq!(unsafe { libc::msync(map, 4096, libc::MS_SYNC) }, 0);
    let during = meta(&p);
    assert!(
        (during.mtime(), during.mtime_nsec()) > (before.0, before.1),
        "mtime while mapped"
    );
    // SAFETY: the mapping made above, once.
    assert_eq!(unsafe { libc::munmap(map, 4096) }, 0);
    drop(f);
    let after = meta(&p);
    assert!(
        after.mtime() > before.0,
        "mtime after close: {} vs {}",
        after.mtime(),
        before.0
    );
    assert!(after.ctime() > before.0, "ctime after close");
    assert_eq!(read_file(&p)[0], 2);
}
both_modes!(mmap_stores_move_mtime_and_ctime);

fn mmap_of_a_file_extended_by_ftruncate(opts: &[&str]) {
    let mut v = TestVolume::with_options(opts);
    let p = v.path("grown");
    let f = open_rw(&p);
    let len = 64 * 1024;
    f.set_len(len as u64).unwrap();
    // SAFETY: as in mmap_shared_read_and_write.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(
        map,
        libc::MAP_FAILED,
        "mmap: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: valid mapping of `len` bytes.
    let view = unsafe { std::slice::from_raw_parts_mut(map.cast::<u8>(), len) };
    assert!(view.iter().all(|b| *b == 0));
    let data = pattern(9, len);
    view.copy_from_slice(&data);
    // SAFETY: valid mapping; unmapped once.
    unsafe {
        assert_eq!(libc::msync(map, len, libc::MS_SYNC), 0);
        assert_eq!(libc::munmap(map, len), 0);
    }
    f.sync_all().unwrap();
    drop(f);
    v.remount();
    assert_bytes_eq(
        &read_file(&p),
        &data,
        "pages written through mmap, after remount",
    );
}
both_modes!(mmap_of_a_file_extended_by_ftruncate);

fn fsync_fdatasync_and_syncfs_then_remount(opts: &[&str]) {
    let mut v = TestVolume::with_options(opts);
    fs::create_dir(v.path("d")).unwrap();
    let p = v.path("d/synced");
    let mut f = File::create(&p).unwrap();
    let data = pattern(77, 3 * MIB + 5);
    f.write_all(&data).unwrap();
    f.sync_data().unwrap();
    f.write_all(b"more").unwrap();
    f.sync_all().unwrap();
    nix::unistd::syncfs(&f).unwrap();
    File::open(v.path("d")).unwrap().sync_all().unwrap();
    drop(f);
    v.remount();
    let back = read_file(&p);
    assert_eq!(back.len(), data.len() + 4);
    assert_bytes_eq(&back[..data.len()], &data, "synced data");
    assert_eq!(&back[data.len()..], b"more");
}
both_modes!(fsync_fdatasync_and_syncfs_then_remount);

fn o_append_writes_always_land_at_the_end(opts: &[&str]) {
    let mut v = TestVolume::with_options(opts);
    let p = v.path("log");
    write_file(&p, b"start;");
    let mut a = OpenOptions::new().append(true).open(&p).unwrap();
    let mut b = OpenOptions::new().append(true).open(&p).unwrap();
    let mut expected = b"start;".to_vec();
    for i in 0..50 {
        let (fd, tag) = if i % 3 == 0 {
            (&mut b, "b")
        } else {
            (&mut a, "a")
        };
        // Seeking does not matter for O_APPEND.
        fd.seek(SeekFrom::Start(0)).unwrap();
        let rec = format!("{tag}{i};");
        fd.write_all(rec.as_bytes()).unwrap();
        expected.extend_from_slice(rec.as_bytes());
    }
    // A plain writer in between: appenders go after its data too.
    let plain = OpenOptions::new().write(true).open(&p).unwrap();
    plain.write_all_at(b"TAIL", expected.len() as u64).unwrap();
    expected.extend_from_slice(b"TAIL");
    a.write_all(b"last").unwrap();
    expected.extend_from_slice(b"last");
    drop((a, b, plain));
    assert_eq!(read_file(&p), expected);
    v.remount();
    assert_eq!(read_file(&p), expected);
}
both_modes!(o_append_writes_always_land_at_the_end);

fn truncate_then_extend_never_shows_stale_data(opts: &[&str]) {
    let mut v = TestVolume::with_options(opts);
    let p = v.path("stale");
    let f = open_rw(&p);
    let data = pattern(5, MIB);
    f.write_all_at(&data, 0).unwrap();
    for cut in [4097usize, 1000, 0] {
        f.set_len(cut as u64).unwrap();
        f.set_len(MIB as u64).unwrap();
        let mut back = vec![0u8; MIB];
        assert_eq!(read_fully_at(&f, &mut back, 0), MIB);
        assert_bytes_eq(&back[..cut], &data[..cut], "kept prefix");
        assert!(
            back[cut..].iter().all(|b| *b == 0),
            "bytes after a truncate to {cut} must read as zero after growing again"
        );
    }
    // Truncate to zero then write far away: the gap is zeros.
    f.set_len(0).unwrap();
    f.write_all_at(b"far", 2 * MIB as u64).unwrap();
    let mut back = vec![0xffu8; 2 * MIB + 3];
    assert_eq!(read_fully_at(&f, &mut back, 0), 2 * MIB + 3);
    assert!(back[..2 * MIB].iter().all(|b| *b == 0));
    drop(f);
    v.remount();
    let back = read_file(&p);
    assert_eq!(back.len(), 2 * MIB + 3);
    assert!(back[..2 * MIB].iter().all(|b| *b == 0));
    assert_eq!(&back[2 * MIB..], b"far");
}
both_modes!(truncate_then_extend_never_shows_stale_data);

fn copies_inside_the_mount_are_identical(opts: &[&str]) {
    let mut v = TestVolume::with_options(opts);
    let src = v.path("src");
    let data = pattern(8, 10 * MIB + 123);
    write_file(&src, &data);
    // std::fs::copy uses copy_file_range(2) where it can.
    fs::copy(&src, v.path("dst")).unwrap();
    let outside = v.root().join("outside-copy");
    fs::copy(&src, &outside).unwrap();
    fs::copy(&outside, v.path("back")).unwrap();
    v.remount();
    for name in ["src", "dst", "back"] {
        assert_bytes_eq(&read_file(&v.path(name)), &data, name);
    }
}
both_modes!(copies_inside_the_mount_are_identical);

fn size_and_mtime_are_visible_while_the_file_is_open(opts: &[&str]) {
    let v = TestVolume::with_options(opts);
    let p = v.path("growing");
    let mut f = File::create(&p).unwrap();
    let m0 = lmeta(&p);
    std::thread::sleep(Duration::from_millis(20));
    f.write_all(&pattern(1, 100_000)).unwrap();
    let m1 = fs::metadata(&p).unwrap();
    assert_eq!(
        m1.len(),
        100_000,
        "stat by path sees the new size before close"
    );
    assert!(
        (m1.mtime(), m1.mtime_nsec()) > (m0.mtime(), m0.mtime_nsec()),
        "write advanced mtime"
    );
    assert!(
        m1.blocks() * 512 >= 100_000,
        "blocks reflect the data: {}",
        m1.blocks()
    );
    // Another reader sees the bytes without close or fsync.
    assert_eq!(read_file(&p).len(), 100_000);
}
both_modes!(size_and_mtime_are_visible_while_the_file_is_open);

fn parallel_writers_on_separate_files(opts: &[&str]) {
    let mut v = TestVolume::with_options(opts);
    let paths: Vec<_> = (0..4).map(|i| v.path(format!("w{i}"))).collect();
    std::thread::scope(|s| {
        for (i, p) in paths.iter().enumerate() {
            s.spawn(move || {
                let mut f = File::create(p).unwrap();
                for c in 0..8 {
                    f.write_all(&pattern((i * 100 + c) as u64, MIB)).unwrap();
                }
            });
        }
    });
    v.remount();
    for (i, p) in paths.iter().enumerate() {
        let back = read_file(p);
        assert_eq!(back.len(), 8 * MIB);
        for c in 0..8 {
            assert_bytes_eq(
                &back[c * MIB..(c + 1) * MIB],
                &pattern((i * 100 + c) as u64, MIB),
                &format!("file {i} chunk {c}"),
            );
        }
    }
}
both_modes!(parallel_writers_on_separate_files);

/// A running executable cannot be truncated: every write-opening flag set,
/// O_RDONLY | O_TRUNC included, gets ETXTBSY and leaves the file whole and
/// the process running. (With FUSE_ATOMIC_O_TRUNC the daemon truncated in
/// OPEN, before the kernel's ETXTBSY check, and the process died of SIGBUS.)
fn running_executable_is_never_truncated(opts: &[&str]) {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let v = TestVolume::with_options(opts);
    let exe = v.path("sleep");
    let original = fs::read("/bin/sleep").unwrap();
    fs::copy("/bin/sleep", &exe).unwrap();
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    for round in 0..20 {
        let mut child = spawn_written_executable(&exe);
        for flags in [
            libc::O_WRONLY,
            libc::O_RDWR,
            libc::O_RDONLY | libc::O_TRUNC,
            libc::O_WRONLY | libc::O_TRUNC,
        ] {
            let err = OpenOptions::new()
                .read(flags & libc::O_ACCMODE != libc::O_WRONLY)
                .write(flags & libc::O_ACCMODE != libc::O_RDONLY)
                .custom_flags(flags & libc::O_TRUNC)
                .open(&exe)
                .map(|_| ())
                .expect_err("opening a running executable for writing");
            assert_eq!(
                err.raw_os_error(),
                Some(libc::ETXTBSY),
                "round {round}, flags {flags:#o}: {err}"
            );
        }
        assert_eq!(lmeta(&exe).len(), original.len() as u64, "round {round}");
        assert!(
            child.try_wait().unwrap().is_none(),
            "round {round}: the executable died: {:?}",
            child.try_wait()
        );
        child.kill().unwrap();
        child.wait().unwrap();
    }
    assert_bytes_eq(&read_file(&exe), &original, "sleep");
}
both_modes!(running_executable_is_never_truncated);

/// Starts `exe`, written by this process moments ago, retrying while exec
/// says ETXTBSY: another test thread's fork between our open and close of
/// the copy holds its write descriptor until that child's own exec (a
/// fork-exec race of every multithreaded program, not the filesystem).
fn spawn_written_executable(exe: &std::path::Path) -> std::process::Child {
    let mut tries = 0;
    loop {
        match std::process::Command::new(exe).arg("30").spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            r => return r.unwrap(),
        }
    }
}
