//! Attributes through a real FUSE mount: modes and the suid/sgid rules,
//! ownership, timestamps, truncate, fallocate, sparse and > 4 GiB files,
//! open flags, sticky and setgid directories, permission bits for other users
//! and statfs.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt, symlink};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;

const GIB: u64 = 1024 * 1024 * 1024;
const MIB: u64 = 1024 * 1024;

type Ts = (i64, i64);

fn atime(p: &Path) -> Ts {
    let m = lmeta(p);
    (m.atime(), m.atime_nsec())
}

fn mtime(p: &Path) -> Ts {
    let m = lmeta(p);
    (m.mtime(), m.mtime_nsec())
}

fn ctime(p: &Path) -> Ts {
    let m = lmeta(p);
    (m.ctime(), m.ctime_nsec())
}

fn now_ts() -> Ts {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    (d.as_secs() as i64, i64::from(d.subsec_nanos()))
}

fn ts_add_ms(t: Ts, ms: i64) -> Ts {
    let ns = t.0 as i128 * 1_000_000_000 + t.1 as i128 + ms as i128 * 1_000_000;
    (
        (ns.div_euclid(1_000_000_000)) as i64,
        (ns.rem_euclid(1_000_000_000)) as i64,
    )
}

/// Sleep long enough that a new timestamp is strictly greater.
fn tick() {
    std::thread::sleep(Duration::from_millis(20));
}

fn perm(p: &Path) -> u32 {
    mode_of(p) & 0o7777
}

#[test]
fn chmod_sets_every_mode_bit_and_updates_ctime() {
    let mut v = TestVolume::new();
    let f = v.path("f");
    let d = v.path("d");
    write_file(&f, b"x");
    fs::create_dir(&d).unwrap();
    for mode in [0o000, 0o640, 0o755, 0o1777, 0o2755, 0o4755, 0o7777, 0o0421] {
        let before = ctime(&f);
        tick();
        chmod(&f, mode);
        chmod(&d, mode);
        assert_eq!(perm(&f), mode, "file mode {mode:o}");
        assert_eq!(perm(&d), mode, "dir mode {mode:o}");
        assert!(ctime(&f) > before, "chmod {mode:o} must advance ctime");
    }
    chmod(&f, 0o6711);
    chmod(&d, 0o3750);
    v.remount();
    assert_eq!(perm(&f), 0o6711);
    assert_eq!(perm(&d), 0o3750);
    assert!(
        lmeta(&f).is_file() && lmeta(&d).is_dir(),
        "chmod keeps the file type"
    );
}

#[test]
fn new_files_belong_to_their_creator_and_respect_the_umask() {
    let v = TestVolume::with_options(&["allow_other"]);
    let u = users();
    let um = current_umask();
    fs::create_dir(v.path("root_dir")).unwrap();
    assert_eq!(perm(&v.path("root_dir")), 0o777 & !um);
    chmod(v.mnt(), 0o777);
    let base = v.path("u1file");
    let dir = v.path("u1dir");
    as_user(&u.u1, || {
        // umask is per process: set one in the child explicitly.
        nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o027));
        File::create(&base).errno()?;
        fs::create_dir(&dir).errno()?;
        mknod(&dir.join("fifo"), libc::S_IFIFO | 0o666, 0)?;
        symlink("target", dir.join("sym")).errno()
    })
    .unwrap();
    for p in [&base, &dir, &dir.join("fifo")] {
        let m = lmeta(p);
        assert_eq!(
            (m.uid(), m.gid()),
            (u.u1.uid, u.u1.gid),
            "owner of {}",
            p.display()
        );
    }
    let s = lmeta(&dir.join("sym"));
    assert_eq!(
        (s.uid(), s.gid()),
        (u.u1.uid, u.u1.gid),
        "owner of the symlink"
    );
    assert_eq!(perm(&base), 0o640, "0666 & ~027");
    assert_eq!(perm(&dir), 0o750, "0777 & ~027");
    assert_eq!(perm(&dir.join("fifo")), 0o640);
    assert_eq!(perm(&dir.join("sym")), 0o777, "symlinks are always 0777");
}

/// With the data through the daemon safs negotiates
/// FUSE_HANDLE_KILLPRIV_V2, and the set-id bits of a chown, write or
/// truncate are safs's to clear, not the kernel's: each rule runs both ways.
#[test]
fn chown_as_root_changes_owner_and_clears_setid_bits() {
    chown_as_root(&["allow_other"]);
}

#[test]
fn chown_as_root_changes_owner_and_clears_setid_bits_nopassthrough() {
    chown_as_root(&["allow_other", "nopassthrough"]);
}

fn chown_as_root(options: &[&str]) {
    let mut v = TestVolume::with_options(options);
    let u = users();
    let f = v.path("f");
    let g = v.path("g_no_group_exec");
    let d = v.path("d");
    write_file(&f, b"x");
    write_file(&g, b"x");
    fs::create_dir(&d).unwrap();
    chmod(&f, 0o6755);
    chmod(&g, 0o2644);
    chmod(&d, 0o2755);
    let before = ctime(&f);
    tick();
    chown(&f, u.u1.uid, u.shared_gid);
    chown(&g, u.u1.uid, u.shared_gid);
    chown(&d, u.u2.uid, u.u2.gid);
    let m = lmeta(&f);
    assert_eq!((m.uid(), m.gid()), (u.u1.uid, u.shared_gid));
    assert!(ctime(&f) > before, "chown advances ctime");
    assert_eq!(
        perm(&f),
        0o755,
        "chown clears suid, and sgid when group-executable"
    );
    assert_eq!(
        perm(&g),
        0o2644,
        "sgid without group exec is not a privilege: kept"
    );
    assert_eq!(perm(&d), 0o2755, "directories keep their sgid bit");

    // Only the group changes; uid stays (chown with -1).
    std::os::unix::fs::chown(&f, None, Some(u.u2.gid)).unwrap();
    assert_eq!((lmeta(&f).uid(), lmeta(&f).gid()), (u.u1.uid, u.u2.gid));

    // lchown changes the symlink, not its target.
    symlink("f", v.path("sym")).unwrap();
    std::os::unix::fs::lchown(v.path("sym"), Some(u.u2.uid), Some(u.u2.gid)).unwrap();
    assert_eq!(lmeta(&v.path("sym")).uid(), u.u2.uid);
    assert_eq!(lmeta(&f).uid(), u.u1.uid);

    v.remount();
    assert_eq!((lmeta(&f).uid(), lmeta(&f).gid()), (u.u1.uid, u.u2.gid));
    assert_eq!(perm(&f), 0o755);
    assert_eq!((lmeta(&d).uid(), lmeta(&d).gid()), (u.u2.uid, u.u2.gid));
    assert_eq!(lmeta(&v.path("sym")).uid(), u.u2.uid);
}

#[test]
fn chown_by_non_root_owner_is_limited_and_clears_setid_bits() {
    chown_by_non_root_owner(&["allow_other"]);
}

#[test]
fn chown_by_non_root_owner_is_limited_and_clears_setid_bits_nopassthrough() {
    chown_by_non_root_owner(&["allow_other", "nopassthrough"]);
}

fn chown_by_non_root_owner(options: &[&str]) {
    let v = TestVolume::with_options(options);
    let u = users();
    let f = v.path("f");
    write_file(&f, b"x");
    chown(&f, u.u1.uid, u.u1.gid);
    chmod(&f, 0o6755);
    let (shared, u2gid, u2uid) = (u.shared_gid, u.u2.gid, u.u2.uid);

    // The owner may give the file to a group they belong to.
    as_user(&u.u1, || {
        std::os::unix::fs::chown(&f, None, Some(shared)).errno()
    })
    .unwrap();
    assert_eq!(lmeta(&f).gid(), shared);
    assert_eq!(perm(&f), 0o755, "non-root chown clears suid and sgid");

    chmod(&f, 0o6755);
    // ... but not to a group they are not in, nor to another user.
    assert_eq!(
        as_user(&u.u1, || std::os::unix::fs::chown(&f, None, Some(u2gid))
            .errno())
        .unwrap_err(),
        Errno::EPERM
    );
    assert_eq!(
        as_user(&u.u1, || std::os::unix::fs::chown(&f, Some(u2uid), None)
            .errno())
        .unwrap_err(),
        Errno::EPERM
    );
    // A non-owner may change neither owner nor mode.
    assert_eq!(
        as_user(&u.u2, || std::os::unix::fs::chown(&f, None, Some(u2gid))
            .errno())
        .unwrap_err(),
        Errno::EPERM
    );
    assert_eq!(
        as_user(&u.u2, || {
            fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o777)).errno()
        })
        .unwrap_err(),
        Errno::EPERM
    );
    assert_eq!(perm(&f), 0o6755, "failed calls change nothing");
    assert_eq!((lmeta(&f).uid(), lmeta(&f).gid()), (u.u1.uid, shared));
}

#[test]
fn chmod_setgid_by_owner_outside_the_group_is_dropped() {
    let mut v = TestVolume::with_options(&["allow_other"]);
    let u = users();
    let f = v.path("f");
    write_file(&f, b"x");
    // Owned by u1, group u2's: u1 is not a member of that group.
    chown(&f, u.u1.uid, u.u2.gid);
    as_user(&u.u1, || {
        fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o2755)).errno()
    })
    .unwrap();
    assert_eq!(perm(&f), 0o755, "sgid silently dropped for a non-member");
    as_user(&u.u1, || {
        fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o4755)).errno()
    })
    .unwrap();
    assert_eq!(perm(&f), 0o4755, "the owner may set suid");
    // In a group they belong to, the owner may set sgid.
    chown(&f, u.u1.uid, u.shared_gid);
    as_user(&u.u1, || {
        fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o2750)).errno()
    })
    .unwrap();
    assert_eq!(perm(&f), 0o2750);
    v.remount();
    assert_eq!(perm(&f), 0o2750);
}

/// A write or truncate by a user without CAP_FSETID clears suid and sgid.
fn write_by_other_user_clears_setid(options: &[&str]) {
    let mut opts = vec!["allow_other"];
    opts.extend_from_slice(options);
    let mut v = TestVolume::with_options(&opts);
    let u = users();
    let w = v.path("written");
    let t = v.path("truncated");
    for p in [&w, &t] {
        write_file(p, b"#!/bin/sh\necho hi\n");
        chmod(p, 0o6777);
    }
    as_user(&u.u1, || {
        let mut f = OpenOptions::new().append(true).open(&w).errno()?;
        f.write_all(b"# appended by u1\n").errno()
    })
    .unwrap();
    assert_eq!(
        perm(&w),
        0o777,
        "write by a non-root user clears suid and sgid"
    );
    assert!(read_file(&w).ends_with(b"# appended by u1\n"));
    as_user(&u.u1, || {
        OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&t)
            .errno()
            .map(drop)
    })
    .unwrap();
    assert_eq!(
        perm(&t),
        0o777,
        "O_TRUNC by a non-root user clears suid and sgid"
    );
    assert_eq!(lmeta(&t).len(), 0);
    // Root writing keeps the bits (CAP_FSETID).
    chmod(&w, 0o6777);
    OpenOptions::new()
        .append(true)
        .open(&w)
        .unwrap()
        .write_all(b"# root\n")
        .unwrap();
    assert_eq!(perm(&w), 0o6777, "root's write keeps suid/sgid");
    v.remount();
    assert_eq!(perm(&t), 0o777);
}

#[test]
fn write_by_other_user_clears_setid_bits_nopassthrough() {
    write_by_other_user_clears_setid(&["nopassthrough"]);
}

#[test]
fn write_by_other_user_clears_setid_bits_passthrough() {
    write_by_other_user_clears_setid(&["passthrough"]);
}

/// Writes do not ask for `security.capability` first (under
/// FUSE_HANDLE_KILLPRIV_V2 the kernel marks a checked inode S_NOSEC) —
/// through the daemon or through passthrough — and a file that has the
/// capability xattr still loses it to a write by another user, as on ext4.
#[test]
fn writes_through_the_daemon_ask_for_no_capability_xattr() {
    writes_ask_for_no_capability_xattr("nopassthrough");
}

#[test]
fn writes_through_passthrough_ask_for_no_capability_xattr() {
    writes_ask_for_no_capability_xattr("passthrough");
}

fn writes_ask_for_no_capability_xattr(data_path: &str) {
    let v = TestVolume::with_options(&["allow_other", data_path]);
    let f = v.path("f");
    write_file(&f, b"");
    let before = served(&v, "getxattr");
    {
        let file = OpenOptions::new().write(true).open(&f).unwrap();
        for i in 0..200u64 {
            std::os::unix::fs::FileExt::write_all_at(&file, &[7u8; 512], i * 512).unwrap();
        }
    }
    let asked = served(&v, "getxattr") - before;
    assert!(asked <= 1, "{asked} GETXATTR requests for 200 writes");
    assert_eq!(lmeta(&f).len(), 200 * 512);

    // A file capability goes with a write by a user without CAP_FSETID.
    let u = users();
    let c = v.path("capable");
    write_file(&c, b"x");
    chmod(&c, 0o777);
    // VFS_CAP_REVISION_2 with CAP_NET_RAW permitted: a valid capability.
    let mut cap = vec![0u8; 20];
    cap[..4].copy_from_slice(&0x0200_0000u32.to_le_bytes());
    cap[4..8].copy_from_slice(&(1u32 << 13).to_le_bytes());
    setxattr(&c, "security.capability", &cap, 0).unwrap();
    assert_eq!(getxattr(&c, "security.capability").unwrap(), cap);
    as_user(&u.u1, || {
        let mut f = OpenOptions::new().append(true).open(&c).errno()?;
        f.write_all(b"y").errno()
    })
    .unwrap();
    assert_eq!(
        getxattr(&c, "security.capability").unwrap_err(),
        Errno::ENODATA,
        "a write by another user removes the file capability"
    );
}

/// A process holding a file open for writing, as another user.
struct HeldWriter(std::process::Child);

impl HeldWriter {
    /// `user` opens `path` for appending and waits (the open is done when
    /// this returns).
    fn open(user: &TestUser, path: &Path) -> HeldWriter {
        use nix::unistd::{Gid, Uid};
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        let (uid, gid) = (Uid::from_raw(user.uid), Gid::from_raw(user.gid));
        let groups: Vec<Gid> = user.groups.iter().map(|g| Gid::from_raw(*g)).collect();
        let mut cmd = std::process::Command::new("sh");
        cmd.arg("-c")
            .arg(r#"exec 3>>"$0" && echo ready && read x && echo "$x" >&3"#)
            .arg(path)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        // SAFETY: only the credential calls run between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                nix::unistd::setgroups(&groups)?;
                nix::unistd::setresgid(gid, gid, gid)?;
                nix::unistd::setresuid(uid, uid, uid)?;
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("sh");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(
            line,
            "ready\n",
            "{} could not open {}",
            user.name,
            path.display()
        );
        HeldWriter(child)
    }

    /// Writes `line` through the held descriptor, closes it and waits.
    fn write_and_close(mut self, line: &str) {
        let mut stdin = self.0.stdin.take().unwrap();
        writeln!(stdin, "{line}").unwrap();
        drop(stdin);
        assert!(self.0.wait().unwrap().success());
    }
}

impl Drop for HeldWriter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A fresh volume mounted `allow_other` and `data_path`, holding file `f`
/// (one byte) with mode `mode`.
fn volume_with_file(data_path: &str, mode: u32) -> (TestVolume, std::path::PathBuf) {
    let v = TestVolume::with_options(&["allow_other", data_path]);
    let f = v.path("f");
    write_file(&f, b"x");
    chmod(&f, mode);
    (v, f)
}

/// Under passthrough a write never reaches the daemon, so set-id bits are
/// cleared when a user without CAP_FSETID opens the file for writing (what
/// their first write would clear); through the daemon, at the write, as
/// on ext4.
#[test]
fn opening_for_writing_clears_setid_bits_under_passthrough_only() {
    let u = users();
    let (_v, f) = volume_with_file("passthrough", 0o6777);
    let held = HeldWriter::open(&u.u1, &f);
    assert_eq!(perm(&f), 0o777, "the open by u1 clears them");
    held.write_and_close("u1");
    assert_eq!(read_file(&f), b"xu1\n");
    // Set-group-ID without group execute is no privilege: u1 is not in
    // root's group, so it goes; for root's open (CAP_FSETID) nothing goes.
    chmod(&f, 0o2766);
    drop(HeldWriter::open(&u.u1, &f));
    assert_eq!(perm(&f), 0o766);
    chmod(&f, 0o6777);
    drop(OpenOptions::new().append(true).open(&f).unwrap());
    assert_eq!(perm(&f), 0o6777, "root's open keeps them");

    let (_v, f) = volume_with_file("nopassthrough", 0o6777);
    let held = HeldWriter::open(&u.u1, &f);
    assert_eq!(perm(&f), 0o6777, "through the daemon the open keeps them");
    held.write_and_close("u1");
    assert_eq!(perm(&f), 0o777, "and the write clears them");
}

/// A chmod that sets set-id bits on a file another process holds open for
/// writing keeps none under passthrough (that process's writes could not
/// clear them); the caller's own open files do not count (`cp -p`,
/// `install`), and once the other writer is gone the bits stay.
#[test]
fn setid_bits_set_while_another_process_writes_do_not_stay_under_passthrough() {
    let u = users();
    let (_v, f) = volume_with_file("passthrough", 0o666);
    let held = HeldWriter::open(&u.u1, &f);
    for (set, kept) in [(0o4777, 0o777), (0o2777, 0o777), (0o6755, 0o755)] {
        chmod(&f, set);
        assert_eq!(perm(&f), kept, "chmod {set:o} with u1 writing");
    }
    // Set-group-ID without group execute marks locking, not a privilege.
    chmod(&f, 0o2766);
    assert_eq!(perm(&f), 0o2766);
    held.write_and_close("u1");
    chmod(&f, 0o6777);
    assert_eq!(perm(&f), 0o6777, "no other writer: kept");

    // The caller's own writable descriptor does not count.
    chmod(&f, 0o644);
    let mut own = OpenOptions::new().append(true).open(&f).unwrap();
    own.write_all(b"root\n").unwrap();
    chmod(&f, 0o4755);
    own.write_all(b"more\n").unwrap();
    drop(own);
    assert_eq!(perm(&f), 0o4755);

    // Through the daemon the bits are set, and the writer's write clears
    // them, as on ext4.
    let (_v, f) = volume_with_file("nopassthrough", 0o666);
    let held = HeldWriter::open(&u.u1, &f);
    chmod(&f, 0o4777);
    assert_eq!(perm(&f), 0o4777);
    held.write_and_close("u1");
    assert_eq!(perm(&f), 0o777);
}

/// A writer that closed the file and exited writes no more: a chmod that
/// sets set-id bits right after keeps them, though the writer's RELEASE
/// (sent by the kernel after its close returned) may reach the daemon
/// after the chmod (`cp f g && chmod u+s g`). Without the daemon waiting
/// for it, some rounds lose the bits.
#[test]
fn setid_bits_set_right_after_another_writer_exits_stay() {
    let u = users();
    let (_v, f) = volume_with_file("passthrough", 0o666);
    for round in 0..100 {
        as_user(&u.u1, || {
            let file = OpenOptions::new().write(true).open(&f).errno()?;
            file.write_all_at(b"u1", 0).errno()?;
            // Closed by the exit, the last thing before the wait returns.
            std::mem::forget(file);
            Ok(())
        })
        .unwrap();
        chmod(&f, 0o4777);
        assert_eq!(perm(&f), 0o4777, "round {round}");
        chmod(&f, 0o666);
    }
}

/// A descriptor its opener handed on before exiting (here to a background
/// subshell) can still write through passthrough: the bits a chmod sets
/// meanwhile do not stay, as for any other writer.
#[test]
fn setid_bits_set_while_an_exited_openers_descriptor_lives_do_not_stay() {
    use std::io::BufRead;
    let (_v, f) = volume_with_file("passthrough", 0o666);
    let mut sh = std::process::Command::new("sh")
        .arg("-c")
        .arg(r#"exec 3>>"$0" 4<&0; (read x <&4 && echo "$x" >&3 && echo written) & echo ready"#)
        .arg(&f)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sh");
    // Taken: `wait` would close it, and the subshell would end.
    let mut stdin = sh.stdin.take().unwrap();
    let mut out = std::io::BufReader::new(sh.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    // The opener is gone; its background subshell holds the descriptor.
    assert!(sh.wait().unwrap().success());
    chmod(&f, 0o4777);
    assert_eq!(perm(&f), 0o777, "the descriptor outlives its opener");
    writeln!(stdin, "late").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "written\n");
    assert!(std::fs::read_to_string(&f).unwrap().ends_with("late\n"));
}

/// A safs daemon started in a PID namespace of its own (`unshare -p`), so
/// that this test's processes are invisible to it: FUSE names them pid 0.
struct DaemonInOwnPidNs {
    daemon: std::process::Child,
    mnt: std::path::PathBuf,
}

impl Drop for DaemonInOwnPidNs {
    fn drop(&mut self) {
        if is_fuse_mounted(&self.mnt) {
            let _ = umount_once_released(&self.mnt);
        }
        if self.daemon.try_wait().ok().flatten().is_none() {
            // Unmounted, it exits; a daemon that did not gets no second chance.
            if !wait_until(Duration::from_secs(5), || {
                self.daemon.try_wait().ok().flatten().is_some()
            }) {
                let _ = self.daemon.kill();
            }
        }
        let _ = self.daemon.wait();
    }
}

/// Under passthrough a writer's open clears set-id bits unless it has
/// CAP_FSETID; a writer whose process the daemon cannot see (outside the
/// PID namespace it was mounted in) cannot show it has, so the bits go,
/// even for root.
#[test]
fn a_writer_the_daemon_cannot_see_counts_as_unprivileged() {
    let v = TestVolume::formatted(&[]);
    let mnt = v.mnt().to_path_buf();
    let mut held = DaemonInOwnPidNs {
        daemon: std::process::Command::new("unshare")
            .args(["--pid", "--fork", SAFS, "mount", "--foreground"])
            .args(["-o", "allow_other,passthrough"])
            .arg(v.vol())
            .arg(&mnt)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("unshare"),
        mnt: mnt.clone(),
    };
    assert!(
        wait_until(Duration::from_secs(10), || is_fuse_mounted(&mnt)),
        "the daemon in its own PID namespace did not mount (exit: {:?})",
        held.daemon.try_wait()
    );
    let u = users();
    let f = mnt.join("f");
    write_file(&f, b"x");
    chmod(&f, 0o6777);
    as_user(&u.u1, || {
        let mut f = OpenOptions::new().append(true).open(&f).errno()?;
        f.write_all(b"u1").errno()
    })
    .unwrap();
    assert_eq!(perm(&f), 0o777, "u1's write clears them");
    chmod(&f, 0o6777);
    OpenOptions::new()
        .append(true)
        .open(&f)
        .unwrap()
        .write_all(b"root")
        .unwrap();
    assert_eq!(
        perm(&f),
        0o777,
        "root unseen: its capabilities cannot be read"
    );
    assert_eq!(read_file(&f), b"xu1root");
    drop(held);
    assert!(!is_fuse_mounted(&mnt));
}

/// xfstests generic/683, 684, 685: fallocate, punching a hole and zeroing
/// a range by a user without CAP_FSETID clear set-user-ID, and
/// set-group-ID when the file is group-executable or the user is not in
/// its group — as the kernel does for writes. Root's keep them.
#[test]
fn fallocate_punch_and_zero_by_other_user_clear_setid_bits() {
    let mut v = TestVolume::with_options(&["allow_other"]);
    let u = users();
    let f = v.path("f");
    let modes = [
        (libc::FALLOC_FL_KEEP_SIZE, "fallocate"),
        (
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            "punch",
        ),
        (libc::FALLOC_FL_ZERO_RANGE, "zero"),
    ];
    // (mode before, mode after an unprivileged change): root owns the file,
    // u1 is not in its group.
    let cases = [
        (0o6666, 0o666),
        (0o6676, 0o676),
        (0o6766, 0o766),
        (0o6777, 0o777),
        (0o2676, 0o676),
        (0o2666, 0o666),
    ];
    for (flag, what) in modes {
        for (before, after) in cases {
            write_file(&f, &[0x58; 192 * 1024]);
            chmod(&f, before);
            as_user(&u.u1, || falloc(&f, flag, 65_536, 65_536))
                .unwrap_or_else(|e| panic!("{what} by u1 on {before:o}: {e}"));
            assert_eq!(perm(&f), after, "{what} by u1 on {before:o}");
            // Root (CAP_FSETID) keeps them.
            chmod(&f, before);
            falloc(&f, flag, 0, 4096).unwrap();
            assert_eq!(perm(&f), before, "{what} by root on {before:o}");
        }
    }
    v.remount();
    assert_eq!(perm(&f), 0o2666);
}

/// `fallocate(flag, offset, len)` of `f`, opened for writing.
fn falloc(f: &Path, flag: i32, offset: i64, len: i64) -> Result<(), Errno> {
    let file = OpenOptions::new().write(true).open(f).errno()?;
    nix::fcntl::fallocate(
        &file,
        nix::fcntl::FallocateFlags::from_bits_retain(flag),
        offset,
        len,
    )
    .map_err(|e| Errno::from_raw(e as i32))
}

/// One change of a file's contents, made by the caller on `f`.
type ContentChange = fn(&Path) -> Result<(), Errno>;

/// Every change of a file's contents a user without CAP_FSETID can make
/// through the daemon (an encrypted volume's only data path).
fn content_changes() -> Vec<(&'static str, ContentChange)> {
    vec![
        ("write", |f| {
            let file = OpenOptions::new().write(true).open(f).errno()?;
            file.write_all_at(b"w", 1).errno()
        }),
        ("O_DIRECT write", |f| {
            #[repr(align(4096))]
            struct Page([u8; 4096]);
            let page = Box::new(Page([b'd'; 4096]));
            let file = open_raw(f, libc::O_WRONLY | libc::O_DIRECT, 0)?;
            file.write_all_at(&page.0, 0).errno()
        }),
        ("truncate", |f| {
            let file = OpenOptions::new().write(true).open(f).errno()?;
            file.set_len(100).errno()
        }),
        ("O_TRUNC", |f| {
            OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(f)
                .errno()
                .map(drop)
        }),
        ("fallocate", |f| falloc(f, 0, 4096, 8192)),
        ("fallocate keep-size", |f| {
            falloc(f, libc::FALLOC_FL_KEEP_SIZE, 4096, 8192)
        }),
        ("punch hole", |f| {
            falloc(
                f,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                4096,
                8192,
            )
        }),
        ("zero range", |f| {
            falloc(f, libc::FALLOC_FL_ZERO_RANGE, 4096, 8192)
        }),
        ("copy_file_range into it", |f| {
            let src = f.with_file_name("source");
            let from = File::open(&src).errno()?;
            let to = OpenOptions::new().write(true).open(f).errno()?;
            let (mut off_in, mut off_out) = (0i64, 0i64);
            // SAFETY: two open descriptors and offsets that outlive the call.
            let n = unsafe {
                libc::copy_file_range(
                    std::os::fd::AsRawFd::as_raw_fd(&from),
                    &mut off_in,
                    std::os::fd::AsRawFd::as_raw_fd(&to),
                    &mut off_out,
                    1000,
                    0,
                )
            };
            if n < 0 { Err(Errno::last()) } else { Ok(()) }
        }),
    ]
}

/// The mode as `stat -c %a` sees it: coreutils asks for the mode alone,
/// which the kernel answers from its attribute cache (xfstests reads modes
/// this way).
fn stat_mode(f: &Path) -> u32 {
    let out = run_cmd(std::process::Command::new("stat").args(["-c", "%a"]).arg(f));
    out.assert_success("stat -c %a");
    u32::from_str_radix(out.stdout.trim(), 8).unwrap()
}

/// On an encrypted volume every byte goes through the daemon: each change
/// of contents by a user without CAP_FSETID clears set-user-ID, and
/// set-group-ID when the file is group-executable or the user is not in its
/// group, as the kernel does on ext4 — and `stat` shows it at once (xfstests
/// generic/355, 683–685). Root's changes keep them.
#[test]
fn every_change_of_contents_by_other_user_clears_setid_bits_on_an_encrypted_volume() {
    let dir = tempfile::tempdir().unwrap();
    let pass = dir.path().join("passphrase");
    fs::write(&pass, b"set-id test\n").unwrap();
    let p = pass.to_str().unwrap();
    let mut v = TestVolume::formatted(&["--encrypt", "--kdf-testing", "--passphrase-file", p]);
    v.set_options(&["allow_other", &format!("passphrase_file={p}")]);
    v.mount();
    let u = users();
    let f = v.path("f");
    write_file(&v.path("source"), &[b's'; 4000]);
    chmod(&v.path("source"), 0o644);
    // (group of the file, mode before, mode after u1's change): u1 is in
    // `shared`, not in root's group.
    let cases = [
        (0, 0o6666, 0o666),
        (0, 0o6676, 0o676),
        (0, 0o4757, 0o757),
        (u.shared_gid, 0o6666, 0o2666),
        (u.shared_gid, 0o6676, 0o676),
    ];
    for (what, change) in content_changes() {
        for (gid, before, after) in cases {
            write_file(&f, &[0x58; 20_000]);
            std::os::unix::fs::chown(&f, Some(0), Some(gid)).unwrap();
            chmod(&f, before);
            assert_eq!(stat_mode(&f), before);
            as_user(&u.u1, || change(&f))
                .unwrap_or_else(|e| panic!("{what} by u1 on {before:o}: {e}"));
            assert_eq!(
                stat_mode(&f),
                after,
                "{what} by u1 on {before:o}, group {gid}"
            );
            chmod(&f, before);
            change(&f).unwrap_or_else(|e| panic!("{what} by root: {e}"));
            assert_eq!(stat_mode(&f), before, "{what} by root on {before:o}");
        }
    }
}

#[test]
fn utimensat_sets_exact_nanoseconds_and_honours_omit_and_now() {
    let mut v = TestVolume::new();
    let f = v.path("f");
    write_file(&f, b"x");

    utimensat(
        &f,
        (1_000_000_000, 123_456_789),
        (1_500_000_000, 987_654_321),
        0,
    )
    .unwrap();
    assert_eq!(atime(&f), (1_000_000_000, 123_456_789));
    assert_eq!(mtime(&f), (1_500_000_000, 987_654_321));

    // UTIME_OMIT leaves that time alone, but ctime still moves.
    let c0 = ctime(&f);
    tick();
    utimensat(&f, (0, libc::UTIME_OMIT), (1_600_000_000, 1), 0).unwrap();
    assert_eq!(atime(&f), (1_000_000_000, 123_456_789));
    assert_eq!(mtime(&f), (1_600_000_000, 1));
    assert!(ctime(&f) > c0, "utimensat advances ctime");
    utimensat(&f, (1_700_000_000, 999_999_999), (0, libc::UTIME_OMIT), 0).unwrap();
    assert_eq!(atime(&f), (1_700_000_000, 999_999_999));
    assert_eq!(mtime(&f), (1_600_000_000, 1));

    // UTIME_NOW sets the current time.
    let before = ts_add_ms(now_ts(), -50);
    utimensat(&f, (0, libc::UTIME_NOW), (0, libc::UTIME_NOW), 0).unwrap();
    let after = ts_add_ms(now_ts(), 50);
    for (what, t) in [("atime", atime(&f)), ("mtime", mtime(&f))] {
        assert!(
            before <= t && t <= after,
            "{what} {t:?} not within [{before:?}, {after:?}]"
        );
    }
    // Mixed: atime now, mtime explicit.
    utimensat(&f, (0, libc::UTIME_NOW), (42, 42), 0).unwrap();
    assert_eq!(mtime(&f), (42, 42));
    assert!(atime(&f) >= before);

    // Times before 1970 and after 2038 round-trip.
    let g = v.path("g");
    write_file(&g, b"y");
    utimensat(&g, (-1_000_000, 500), (1 << 33, 7), 0).unwrap();
    assert_eq!(atime(&g), (-1_000_000, 500));
    assert_eq!(mtime(&g), (1 << 33, 7));

    // AT_SYMLINK_NOFOLLOW sets the symlink's own times.
    symlink("g", v.path("sym")).unwrap();
    utimensat(
        &v.path("sym"),
        (11, 11),
        (22, 22),
        libc::AT_SYMLINK_NOFOLLOW,
    )
    .unwrap();
    assert_eq!(mtime(&v.path("sym")), (22, 22));
    assert_eq!(mtime(&g), (1 << 33, 7), "the target is untouched");

    // Invalid nanoseconds.
    assert_eq!(
        utimensat(&f, (1, 1_000_000_000), (1, 0), 0).unwrap_err(),
        Errno::EINVAL
    );

    v.remount();
    assert_eq!(mtime(&f), (42, 42));
    assert_eq!(atime(&g), (-1_000_000, 500));
    assert_eq!(mtime(&g), (1 << 33, 7));
    assert_eq!(
        (atime(&v.path("sym")), mtime(&v.path("sym"))),
        ((11, 11), (22, 22))
    );
}

#[test]
fn utimensat_permission_rules_for_other_users() {
    let v = TestVolume::with_options(&["allow_other"]);
    let u = users();
    let writable = v.path("writable");
    let readonly = v.path("readonly");
    let owned = v.path("owned");
    write_file(&writable, b"x");
    write_file(&readonly, b"x");
    write_file(&owned, b"x");
    chmod(&writable, 0o666);
    chmod(&readonly, 0o644);
    chown(&owned, u.u1.uid, u.u1.gid);
    chmod(&owned, 0o444);
    let now = (0, libc::UTIME_NOW);
    // Write permission is enough to set the current time...
    as_user(&u.u1, || utimensat(&writable, now, now, 0)).unwrap();
    // ... but not explicit times.
    assert_eq!(
        as_user(&u.u1, || utimensat(&writable, (5, 0), (5, 0), 0)).unwrap_err(),
        Errno::EPERM
    );
    assert_eq!(
        as_user(&u.u1, || utimensat(&readonly, now, now, 0)).unwrap_err(),
        Errno::EACCES
    );
    // The owner may set any time even without write permission.
    as_user(&u.u1, || utimensat(&owned, (5, 6), (7, 8), 0)).unwrap();
    assert_eq!(mtime(&owned), (7, 8));
    assert_ne!(mtime(&writable), (5, 0));
}

#[test]
fn ctime_and_mtime_follow_metadata_and_data_changes() {
    let v = TestVolume::new();
    let d = v.path("d");
    fs::create_dir(&d).unwrap();
    let f = d.join("f");
    write_file(&f, b"x");

    let (dm, dc) = (mtime(&d), ctime(&d));
    tick();
    write_file(&d.join("g"), b"g");
    assert!(
        mtime(&d) > dm && ctime(&d) > dc,
        "creating an entry updates the directory"
    );

    let (fm, fc) = (mtime(&f), ctime(&f));
    tick();
    OpenOptions::new()
        .append(true)
        .open(&f)
        .unwrap()
        .write_all(b"y")
        .unwrap();
    assert!(
        mtime(&f) > fm && ctime(&f) > fc,
        "write updates mtime and ctime"
    );

    type Op<'a> = Box<dyn Fn() + 'a>;
    let checks: Vec<(&str, Op)> = vec![
        ("link", Box::new(|| fs::hard_link(&f, d.join("l")).unwrap())),
        (
            "setxattr",
            Box::new(|| setxattr(&f, "user.t", b"v", 0).unwrap()),
        ),
        (
            "removexattr",
            Box::new(|| removexattr(&f, "user.t").unwrap()),
        ),
        (
            "unlink of a link",
            Box::new(|| fs::remove_file(d.join("l")).unwrap()),
        ),
        ("rename", Box::new(|| fs::rename(&f, d.join("f2")).unwrap())),
    ];
    let mut cur = f.clone();
    for (what, op) in checks {
        let (m, c) = (mtime(&cur), ctime(&cur));
        tick();
        op();
        if what == "rename" {
            cur = d.join("f2");
        }
        assert!(ctime(&cur) > c, "{what} must advance the file's ctime");
        assert_eq!(mtime(&cur), m, "{what} must not change the file's mtime");
    }
    let (dm, dc) = (mtime(&d), ctime(&d));
    tick();
    fs::remove_file(d.join("g")).unwrap();
    assert!(
        mtime(&d) > dm && ctime(&d) > dc,
        "unlink updates the directory"
    );
}

#[test]
fn truncate_sets_size_and_times_and_reports_errors() {
    let mut v = TestVolume::with_options(&["allow_other"]);
    let f = v.path("f");
    let data = pattern(1, 100_000);
    write_file(&f, &data);
    let (m, c) = (mtime(&f), ctime(&f));
    tick();
    nix::unistd::truncate(&f, 10).unwrap();
    assert_eq!(lmeta(&f).len(), 10);
    assert!(
        mtime(&f) > m && ctime(&f) > c,
        "truncate updates mtime and ctime"
    );
    nix::unistd::truncate(&f, 300_000).unwrap();
    let back = read_file(&f);
    assert_eq!(back.len(), 300_000);
    assert_eq!(&back[..10], &data[..10]);
    assert!(
        back[10..].iter().all(|b| *b == 0),
        "growing exposes zeros, not old data"
    );

    // Through an open descriptor.
    let file = OpenOptions::new().write(true).open(&f).unwrap();
    file.set_len(5).unwrap();
    assert_eq!(file.metadata().unwrap().len(), 5);
    drop(file);

    // Errors.
    fs::create_dir(v.path("d")).unwrap();
    assert_eq!(
        nix::unistd::truncate(&v.path("d"), 0).unwrap_err(),
        Errno::EISDIR
    );
    assert_eq!(nix::unistd::truncate(&f, -1).unwrap_err(), Errno::EINVAL);
    chmod(&f, 0o644);
    let u = users();
    assert_eq!(
        as_user(&u.u1, || nix::unistd::truncate(&f, 0)).unwrap_err(),
        Errno::EACCES
    );
    assert_eq!(lmeta(&f).len(), 5);
    v.remount();
    assert_eq!(read_file(&f), &data[..5]);
}

#[test]
fn fallocate_mode_zero_allocates_and_extends() {
    let mut v = TestVolume::new();
    let p = v.path("f");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    f.write_all_at(b"head", 0).unwrap();
    nix::fcntl::fallocate(&f, nix::fcntl::FallocateFlags::empty(), 0, 8 * MIB as i64).unwrap();
    let m = f.metadata().unwrap();
    assert_eq!(m.len(), 8 * MIB, "mode 0 extends the size");
    assert!(
        m.blocks() * 512 >= 8 * MIB,
        "space is allocated: {} blocks",
        m.blocks()
    );
    let mut buf = vec![0xffu8; 4096];
    f.read_exact_at(&mut buf, 4 * MIB).unwrap();
    assert!(
        buf.iter().all(|b| *b == 0),
        "allocated range reads as zeros"
    );
    f.read_exact_at(&mut buf[..4], 0).unwrap();
    assert_eq!(&buf[..4], b"head", "existing data is kept");

    // Inside the file: size unchanged. Beyond: size grows.
    nix::fcntl::fallocate(
        &f,
        nix::fcntl::FallocateFlags::empty(),
        MIB as i64,
        MIB as i64,
    )
    .unwrap();
    assert_eq!(f.metadata().unwrap().len(), 8 * MIB);
    nix::fcntl::posix_fallocate(&f, 10 * MIB as i64, MIB as i64).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 11 * MIB);
    assert_eq!(
        nix::fcntl::fallocate(&f, nix::fcntl::FallocateFlags::empty(), 0, 0).unwrap_err(),
        Errno::EINVAL,
        "zero length"
    );
    drop(f);
    v.remount();
    assert_eq!(lmeta(&p).len(), 11 * MIB);
    assert_eq!(&read_file(&p)[..4], b"head");
}

#[test]
fn sparse_files_read_zeros_in_holes_and_stay_small() {
    let mut v = TestVolume::new();
    let p = v.path("sparse");
    let f = File::create(&p).unwrap();
    let a = pattern(10, 4096);
    let b = pattern(11, 4096);
    f.write_all_at(&a, 0).unwrap();
    f.write_all_at(&b, 256 * MIB).unwrap();
    drop(f);
    let check = |v: &TestVolume| {
        let m = lmeta(&v.path("sparse"));
        assert_eq!(m.len(), 256 * MIB + 4096);
        assert!(
            m.blocks() * 512 < 4 * MIB,
            "a 256 MiB file with 8 KiB of data occupies {} bytes",
            m.blocks() * 512
        );
        let f = File::open(v.path("sparse")).unwrap();
        let mut buf = vec![0xffu8; 1 << 20];
        f.read_exact_at(&mut buf, 100 * MIB).unwrap();
        assert!(buf.iter().all(|x| *x == 0), "hole reads as zeros");
        let mut got = vec![0u8; 4096];
        f.read_exact_at(&mut got, 0).unwrap();
        assert_eq!(got, a);
        f.read_exact_at(&mut got, 256 * MIB).unwrap();
        assert_eq!(got, b);
        // Reading at EOF returns nothing.
        assert_eq!(f.read_at(&mut got, 256 * MIB + 4096).unwrap(), 0);
    };
    check(&v);
    v.remount();
    check(&v);
}

#[test]
fn files_larger_than_4_gib_work() {
    let mut v = TestVolume::new();
    let p = v.path("huge");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    let at5 = pattern(5, MIB as usize);
    let straddle = pattern(6, 8192);
    f.write_all_at(&at5, 5 * GIB).unwrap();
    f.write_all_at(&straddle, 4 * GIB - 4096).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 5 * GIB + MIB);
    drop(f);

    let check = |v: &TestVolume| {
        let f = File::open(v.path("huge")).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 5 * GIB + MIB);
        let mut got = vec![0u8; MIB as usize];
        f.read_exact_at(&mut got, 5 * GIB).unwrap();
        assert_bytes_eq(&got, &at5, "1 MiB at 5 GiB");
        let mut got = vec![0u8; 8192];
        f.read_exact_at(&mut got, 4 * GIB - 4096).unwrap();
        assert_bytes_eq(&got, &straddle, "8 KiB across the 4 GiB boundary");
        let mut hole = vec![0xffu8; 4096];
        f.read_exact_at(&mut hole, 4 * GIB + GIB / 2).unwrap();
        assert!(hole.iter().all(|b| *b == 0));
    };
    check(&v);
    v.remount();
    check(&v);
    nix::unistd::truncate(&p, (4 * GIB + 1) as i64).unwrap();
    assert_eq!(lmeta(&p).len(), 4 * GIB + 1);
    let f = File::open(&p).unwrap();
    let mut two = [0u8; 2];
    assert_eq!(f.read_at(&mut two, 4 * GIB - 1).unwrap(), 2);
    assert_eq!(two, [straddle[4095], straddle[4096]]);
}

#[test]
fn o_excl_o_creat_and_o_trunc() {
    let v = TestVolume::with_options(&["allow_other"]);
    let f = v.path("f");
    write_file(&f, &pattern(2, 100_000));
    let um = current_umask();

    let excl = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
    assert_eq!(open_raw(&f, excl, 0o644).unwrap_err(), Errno::EEXIST);
    fs::create_dir(v.path("d")).unwrap();
    assert_eq!(
        open_raw(&v.path("d"), excl, 0o644).unwrap_err(),
        Errno::EEXIST
    );
    // O_EXCL does not follow a dangling symlink, and creates nothing.
    symlink("target", v.path("dangling")).unwrap();
    assert_eq!(
        open_raw(&v.path("dangling"), excl, 0o644).unwrap_err(),
        Errno::EEXIST
    );
    assert!(!v.path("target").exists());
    // New file: created with the requested mode minus the umask.
    drop(open_raw(&v.path("new"), excl, 0o666).unwrap());
    assert_eq!(perm(&v.path("new")), 0o666 & !um);
    assert_eq!(lmeta(&v.path("new")).len(), 0);

    // O_CREAT without O_EXCL opens the existing file without truncating.
    drop(open_raw(&f, libc::O_WRONLY | libc::O_CREAT, 0o600).unwrap());
    assert_eq!(lmeta(&f).len(), 100_000);
    assert_ne!(perm(&f), 0o600, "mode only applies to new files");

    // O_TRUNC empties the file and updates mtime/ctime.
    let (m, c) = (mtime(&f), ctime(&f));
    tick();
    let mut h = open_raw(&f, libc::O_RDWR | libc::O_TRUNC, 0).unwrap();
    assert_eq!(h.metadata().unwrap().len(), 0);
    let mut s = Vec::new();
    h.read_to_end(&mut s).unwrap();
    assert!(s.is_empty());
    h.write_all(b"fresh").unwrap();
    drop(h);
    assert_eq!(read_file(&f), b"fresh");
    assert!(
        mtime(&f) > m && ctime(&f) > c,
        "O_TRUNC updates mtime and ctime"
    );

    // O_TRUNC without write permission fails and leaves the data.
    chmod(&f, 0o644);
    let u = users();
    assert_eq!(
        as_user(&u.u1, || open_raw(&f, libc::O_RDONLY | libc::O_TRUNC, 0)
            .map(drop))
        .unwrap_err(),
        Errno::EACCES
    );
    assert_eq!(read_file(&f), b"fresh");
}

#[test]
fn permission_bits_are_enforced_for_other_users() {
    let v = TestVolume::with_options(&["allow_other"]);
    let u = users();
    let f = v.path("f");
    write_file(&f, b"secret");
    chown(&f, 0, u.shared_gid);
    chmod(&f, 0o640);
    // u1 is in safs_shared: group read, no write. u2: nothing.
    assert_eq!(as_user(&u.u1, || fs::read(&f).errno()).unwrap(), b"secret");
    assert_eq!(
        as_user(&u.u1, || OpenOptions::new()
            .write(true)
            .open(&f)
            .errno()
            .map(drop))
        .unwrap_err(),
        Errno::EACCES
    );
    assert_eq!(
        as_user(&u.u2, || fs::read(&f).errno()).unwrap_err(),
        Errno::EACCES
    );

    // Directory search (x) and list (r) permissions.
    let d = v.path("d");
    fs::create_dir(&d).unwrap();
    write_file(&d.join("inner"), b"in");
    chmod(&d.join("inner"), 0o644);
    chmod(&d, 0o711);
    assert_eq!(
        as_user(&u.u2, || fs::read(d.join("inner")).errno()).unwrap(),
        b"in"
    );
    assert_eq!(
        as_user(&u.u2, || fs::read_dir(&d).errno().map(drop)).unwrap_err(),
        Errno::EACCES
    );
    chmod(&d, 0o700);
    assert_eq!(
        as_user(&u.u2, || fs::read(d.join("inner")).errno()).unwrap_err(),
        Errno::EACCES
    );
    // No write permission on the directory: no create, no unlink.
    chmod(&d, 0o755);
    assert_eq!(
        as_user(&u.u2, || File::create(d.join("new")).errno().map(drop)).unwrap_err(),
        Errno::EACCES
    );
    assert_eq!(
        as_user(&u.u2, || fs::remove_file(d.join("inner")).errno()).unwrap_err(),
        Errno::EACCES
    );
    assert!(d.join("inner").exists());
}

#[test]
fn sticky_directory_protects_other_users_files() {
    let mut v = TestVolume::with_options(&["allow_other"]);
    let u = users();
    let t = v.path("tmp");
    fs::create_dir(&t).unwrap();
    chmod(&t, 0o1777);
    let f1 = t.join("f1");
    let f2 = t.join("f2");
    as_user(&u.u1, || fs::write(&f1, b"u1's").errno()).unwrap();
    as_user(&u.u2, || fs::write(&f2, b"u2's").errno()).unwrap();
    chmod(&f1, 0o666);

    // u2 may neither remove nor rename u1's file, nor replace it by rename.
    assert_eq!(
        as_user(&u.u2, || fs::remove_file(&f1).errno()).unwrap_err(),
        Errno::EPERM
    );
    assert_eq!(
        as_user(&u.u2, || fs::rename(&f1, t.join("stolen")).errno()).unwrap_err(),
        Errno::EPERM
    );
    assert_eq!(
        as_user(&u.u2, || fs::rename(&f2, &f1).errno()).unwrap_err(),
        Errno::EPERM
    );
    assert_eq!(read_file(&f1), b"u1's");
    // ... but may still write it (mode 0666) and remove their own file.
    as_user(&u.u2, || fs::write(&f1, b"edited").errno()).unwrap();
    as_user(&u.u2, || fs::remove_file(&f2).errno()).unwrap();
    assert!(!f2.exists());

    // The directory's owner may remove anything in it.
    chown(&t, u.u2.uid, u.u2.gid);
    as_user(&u.u2, || fs::remove_file(&f1).errno()).unwrap();
    assert!(!f1.exists());
    as_user(&u.u1, || fs::write(&f1, b"again").errno()).unwrap();
    v.remount();
    assert_eq!(perm(&t), 0o1777);
    assert_eq!(
        as_user(&users().u1, || fs::remove_file(&f1).errno()),
        Ok(())
    );
}

#[test]
fn setgid_directory_passes_its_group_to_new_entries() {
    let mut v = TestVolume::with_options(&["allow_other"]);
    let u = users();
    let um = current_umask();
    let s = v.path("shared");
    fs::create_dir(&s).unwrap();
    chown(&s, 0, u.shared_gid);
    chmod(&s, 0o2777);
    let plain = v.path("plain");
    fs::create_dir(&plain).unwrap();
    chmod(&plain, 0o777);

    // u2 is not a member of safs_shared.
    let (file, sub, sgidfile) = (s.join("file"), s.join("sub"), s.join("sgidfile"));
    as_user(&u.u2, || {
        fs::write(&file, b"x").errno()?;
        fs::create_dir(&sub).errno()?;
        open_raw(
            &sgidfile,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o2775,
        )
        .map(drop)?;
        fs::write(plain.join("outside"), b"x").errno()
    })
    .unwrap();
    let check = |v: &TestVolume| {
        let s = v.path("shared");
        for p in [s.join("file"), s.join("sub"), s.join("sgidfile")] {
            let m = lmeta(&p);
            assert_eq!(
                m.gid(),
                u.shared_gid,
                "{} inherits the directory's group",
                p.display()
            );
            assert_eq!(m.uid(), u.u2.uid);
        }
        assert_eq!(
            perm(&s.join("sub")) & 0o2000,
            0o2000,
            "new subdirectories inherit the setgid bit"
        );
        assert_eq!(
            perm(&s.join("sgidfile")),
            0o775 & !um,
            "sgid on a new file is dropped for a creator outside the group"
        );
        assert_eq!(
            lmeta(&v.path("plain/outside")).gid(),
            u.u2.gid,
            "no sgid: creator's group"
        );
    };
    check(&v);
    v.remount();
    check(&v);
    // A directory created inside the inherited setgid directory passes it on.
    let deep = s.join("sub/deeper");
    as_user(&u.u2, || fs::create_dir(&deep).errno()).unwrap();
    assert_eq!(lmeta(&deep).gid(), u.shared_gid);
    assert_eq!(perm(&deep) & 0o2000, 0o2000);
}

#[test]
fn statfs_reports_real_capacity_and_inode_figures() {
    let v = TestVolume::new();
    let st = statfs(v.mnt());
    assert_eq!(st.f_type, FUSE_SUPER_MAGIC, "statfs type is FUSE");
    assert!(st.f_bsize > 0, "f_bsize");
    assert!(st.f_blocks > 0, "f_blocks");
    assert!(
        st.f_bfree > 0 && st.f_bfree <= st.f_blocks,
        "f_bfree {}",
        st.f_bfree
    );
    assert!(
        st.f_bavail > 0 && st.f_bavail <= st.f_bfree,
        "f_bavail {}",
        st.f_bavail
    );
    assert!(st.f_files > 0, "f_files");
    assert!(
        st.f_ffree > 0 && st.f_ffree <= st.f_files,
        "f_ffree {}",
        st.f_ffree
    );
    assert_eq!(st.f_namelen, 255, "f_namelen");
    // Capacity is real: at most what the disk under the volume holds.
    let host = statfs(v.vol());
    let host_bytes = host.f_blocks as u128 * host.f_bsize as u128;
    let bytes = st.f_blocks as u128 * st.f_bsize as u128;
    assert!(
        bytes <= host_bytes * 11 / 10,
        "safs claims {bytes} bytes on a {host_bytes}-byte disk"
    );

    let used_before = st.f_files - st.f_ffree;
    for i in 0..200 {
        File::create(v.path(format!("f{i}"))).unwrap();
    }
    let st2 = statfs(v.mnt());
    let used_after = st2.f_files - st2.f_ffree;
    assert!(
        used_after >= used_before + 200,
        "200 new inodes: used inodes went from {used_before} to {used_after}"
    );
}
