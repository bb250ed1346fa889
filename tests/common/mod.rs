//! Integration-test harness: format and mount a real safs volume through FUSE.
//!
//! Every `tests/mount_*.rs` file does `mod common;` and builds its own
//! [`TestVolume`] per test, so tests are independent and can run in parallel.
//!
//! # What the harness promises
//!
//! * A volume lives in a fresh directory under `/tmp` (`<root>/vol`), mounted at
//!   `<root>/mnt`. `<root>` is mode 0755 so that non-root test users can reach
//!   the mount point.
//! * `safs mount` must return only once the mount is live; the harness checks
//!   `/proc/self/mountinfo` right after it returns and fails the test otherwise.
//! * Dropping a [`TestVolume`] always unmounts (`umount`, then `umount -l`) and
//!   waits (bounded) until the daemon has released the flock on `<vol>/lock`,
//!   so a test never leaves a daemon behind.
//! * Without `/dev/fuse` every test fails with a message saying so. These tests
//!   are never skipped.
//! * The stdout/stderr of `safs mount` (and so of the daemon, unless it
//!   redirects them) go to `<root>/daemon.log`; when a test panics that log and
//!   the tail of `<vol>/safs.log` are printed, so a failure shows what the
//!   daemon said.
//!
//! # Other users
//!
//! Tests that need another uid never change the test process's credentials.
//! [`as_user`] forks a child that drops to the user's uid/gid/groups, runs a
//! closure there and sends its `Result<_, Errno>` back over a pipe.
//! [`run_as`] runs an external program (`setfacl`, `cat`, ...) through
//! `setpriv`. The users `safs_u1` (also in group `safs_shared`) and `safs_u2`
//! are created on first use if missing ([`users`]).

#![allow(dead_code)]

use std::ffi::{CString, OsStr};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Gid, Pid, Uid, fork, setgroups, setresgid, setresuid};

/// Path of the binary under test, built by cargo for integration tests.
pub const SAFS: &str = env!("CARGO_BIN_EXE_safs");

/// How long any one external command may take before the test fails.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// How long the daemon may take to release its lock after an unmount.
pub const UNMOUNT_TIMEOUT: Duration = Duration::from_secs(10);

/// `statfs` magic number of FUSE file systems.
pub const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// Linux's limit on one xattr value (`XATTR_SIZE_MAX`).
pub const XATTR_SIZE_MAX: usize = 65_536;

// ---------------------------------------------------------------------------
// Running commands
// ---------------------------------------------------------------------------

/// The result of a finished command: exit status and captured output.
#[derive(Debug)]
pub struct CmdOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl CmdOutput {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Panics with the full output unless the command succeeded.
    #[track_caller]
    pub fn assert_success(&self, what: &str) -> &Self {
        assert!(
            self.status.success(),
            "{what} failed ({}):\nstdout: {}\nstderr: {}",
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }

    /// Panics unless the command failed with a non-empty message on stderr.
    #[track_caller]
    pub fn assert_failure_with_message(&self, what: &str) -> &Self {
        assert!(
            !self.status.success(),
            "{what} should have failed but exited 0:\nstdout: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
        assert!(
            self.status.code().is_some(),
            "{what} should exit with a code, not die by a signal: {}",
            self.status
        );
        assert!(
            !self.stderr.trim().is_empty(),
            "{what} failed ({}) but printed no message on stderr (stdout: {:?})",
            self.status,
            self.stdout
        );
        self
    }
}

/// Variables every command these helpers run gets on top of the test's
/// environment (an object store's endpoint and keys), set once per test
/// binary: tests run in threads, and changing their own environment
/// would race.
pub static CHILD_ENV: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();

fn with_child_env(cmd: &mut Command) {
    if let Some(env) = CHILD_ENV.get() {
        // What the caller set on this command itself wins.
        let own: Vec<std::ffi::OsString> = cmd.get_envs().map(|(k, _)| k.to_owned()).collect();
        for (k, v) in env {
            if !own.iter().any(|o| o == k.as_str()) {
                cmd.env(k, v);
            }
        }
    }
}

/// Runs `cmd` to completion with a timeout. stdout and stderr go to anonymous
/// temporary files, not pipes: a daemon that inherits them can never make the
/// caller hang waiting for end-of-file.
#[track_caller]
pub fn run_cmd(cmd: &mut Command) -> CmdOutput {
    run_cmd_timeout(cmd, COMMAND_TIMEOUT)
}

/// `umount mnt`, tried again for up to 5 s while the kernel says the mount
/// is busy: right after a file on it is closed it sometimes still is (its
/// RELEASE goes to the daemon in the background), as `try_unmount` found.
#[track_caller]
pub fn umount_once_released(mnt: &Path) -> CmdOutput {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = run_cmd(Command::new("umount").arg(mnt));
        if out.success() || !out.stderr.contains("busy") || Instant::now() >= deadline {
            return out;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[track_caller]
pub fn run_cmd_timeout(cmd: &mut Command, timeout: Duration) -> CmdOutput {
    with_child_env(cmd);
    let mut out = tempfile::tempfile().expect("temp file for stdout");
    let mut err = tempfile::tempfile().expect("temp file for stderr");
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone().expect("dup stdout file"))
        .stderr(err.try_clone().expect("dup stderr file"))
        .env("LC_ALL", "C");
    let desc = format!("{cmd:?}");
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {desc}: {e}"));
    let status = wait_child_timeout(&mut child, timeout)
        .unwrap_or_else(|| panic!("{desc} did not finish within {timeout:?} (killed)"));
    let read_back = |f: &mut File| {
        let mut s = Vec::new();
        f.seek(SeekFrom::Start(0)).unwrap();
        f.read_to_end(&mut s).unwrap();
        String::from_utf8_lossy(&s).into_owned()
    };
    CmdOutput {
        status,
        stdout: read_back(&mut out),
        stderr: read_back(&mut err),
    }
}

/// Waits for `child` at most `timeout`; on timeout kills it and returns None.
pub fn wait_child_timeout(
    child: &mut std::process::Child,
    timeout: Duration,
) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs the safs binary with `args` (output captured, see [`run_cmd`]).
#[track_caller]
pub fn safs<I, S>(args: I) -> CmdOutput
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run_cmd(Command::new(SAFS).args(args))
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes.
/// How many requests of opcode `op` (`"lookup"`, `"getxattr"`…) the daemon
/// serving `v` has answered so far (`safs info --json`).
pub fn served(v: &TestVolume, op: &str) -> u64 {
    let out = safs(["info".as_ref(), "--json".as_ref(), v.mnt().as_os_str()]);
    out.assert_success("safs info --json");
    let stats: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    stats["ops"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["op"] == op)
        .map_or(0, |o| o["count"].as_u64().unwrap())
}

pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------
// Mount table and lock inspection
// ---------------------------------------------------------------------------

/// Fails the test (never skips) when the machine has no FUSE device.
#[track_caller]
pub fn require_fuse() {
    let dev = Path::new("/dev/fuse");
    assert!(
        dev.exists(),
        "/dev/fuse is missing: the safs mount tests need FUSE (modprobe fuse, or give the \
         container --device /dev/fuse). These tests are never skipped."
    );
    if let Err(e) = OpenOptions::new().read(true).write(true).open(dev) {
        panic!(
            "/dev/fuse exists but cannot be opened ({e}): the safs mount tests need FUSE \
             access (run them as root). These tests are never skipped."
        );
    }
}

/// The file-system type of the mount at exactly `mountpoint`, if any,
/// from `/proc/self/mountinfo` (reading it never touches the FUSE mount).
pub fn mount_fstype(mountpoint: &Path) -> Option<String> {
    // The calling thread's view: a test thread may have a mount namespace
    // of its own.
    let info = fs::read_to_string("/proc/thread-self/mountinfo")
        .expect("read /proc/thread-self/mountinfo");
    let want = mountpoint.as_os_str().as_bytes();
    let mut found = None;
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() < 5 || unescape_mountinfo(fields[4]) != want {
            continue;
        }
        let sep = fields.iter().position(|f| *f == "-");
        // The last matching line is the top of a stack of mounts.
        found = sep
            .and_then(|i| fields.get(i + 1))
            .map(|s| (*s).to_string());
    }
    found
}

fn unescape_mountinfo(s: &str) -> Vec<u8> {
    // mountinfo escapes space, tab, newline and backslash as \ooo (octal).
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let code = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok());
            if let Some(v) = code {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// True if a FUSE file system is mounted at `mountpoint`.
pub fn is_fuse_mounted(mountpoint: &Path) -> bool {
    mount_fstype(mountpoint).is_some_and(|t| t == "fuse" || t.starts_with("fuse."))
}

/// Outcome of probing the daemon's lock file.
#[derive(Debug, PartialEq, Eq)]
pub enum LockState {
    /// Someone (the daemon) holds the exclusive flock.
    Held,
    /// The lock file exists and nobody holds it.
    Free,
    /// There is no lock file.
    Missing,
}

/// Probes `<vol>/lock` with a non-blocking exclusive flock (released at once).
pub fn lock_state(vol: &Path) -> LockState {
    let f = match File::open(vol.join("lock")) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return LockState::Missing,
        Err(e) => panic!("cannot open {}: {e}", vol.join("lock").display()),
    };
    // SAFETY: flock on a valid, owned descriptor; the lock dies with `f`.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r == 0 {
        LockState::Free
    } else {
        let e = Errno::last();
        assert_eq!(
            e,
            Errno::EWOULDBLOCK,
            "flock probe on the lock file failed: {e}"
        );
        LockState::Held
    }
}

/// The pid of the daemon serving `vol`: what it wrote into `<vol>/lock`,
/// or on a volume several daemons may serve (PostgreSQL), the one live
/// session `safs info` lists.
#[track_caller]
pub fn daemon_pid(vol: &Path) -> Pid {
    if vol.join("meta/postgres.conf").exists() {
        let live = live_sessions(vol);
        assert_eq!(live.len(), 1, "one live session expected: {live:?}");
        return live[0].0;
    }
    let text = fs::read_to_string(vol.join("lock"))
        .unwrap_or_else(|e| panic!("cannot read {}/lock: {e}", vol.display()));
    let pid: i32 = text
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{}/lock does not start with a pid: {text:?}", vol.display()));
    Pid::from_raw(pid)
}

/// The live sessions of a PostgreSQL volume, as `safs info` lists them:
/// (daemon pid, mountpoint).
#[track_caller]
pub fn live_sessions(vol: &Path) -> Vec<(Pid, String)> {
    let out = safs(["info".as_ref(), vol.as_os_str()]);
    assert!(out.success(), "safs info {}: {}", vol.display(), out.stderr);
    out.stdout
        .lines()
        .filter_map(|l| l.strip_prefix("session:"))
        .filter(|l| !l.contains("(gone"))
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("pid ")?;
            let (pid, rest) = rest.split_once(' ')?;
            let (_, m) = rest.split_once(", mounted on ")?;
            let (m, _) = m.rsplit_once(", since ")?;
            Some((Pid::from_raw(pid.parse().ok()?), m.to_string()))
        })
        .collect()
}

/// The pid of the daemon serving PostgreSQL volume `vol` on `mnt`.
#[track_caller]
pub fn daemon_pid_at(vol: &Path, mnt: &Path) -> Pid {
    let mnt = fs::canonicalize(mnt).unwrap().display().to_string();
    let live = live_sessions(vol);
    live.iter()
        .find(|(_, m)| *m == mnt)
        .unwrap_or_else(|| panic!("no live session on {mnt}: {live:?}"))
        .0
}

/// True while a process with this pid exists (and is not a zombie).
pub fn process_alive(pid: Pid) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // State is the field after the parenthesised command name.
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

// ---------------------------------------------------------------------------
// The test volume
// ---------------------------------------------------------------------------

/// A formatted safs volume mounted through FUSE in a temporary directory.
pub struct TestVolume {
    /// Holds `vol/`, `mnt/` and `daemon.log`; `None` once deliberately leaked.
    root: Option<tempfile::TempDir>,
    root_path: PathBuf,
    vol: PathBuf,
    mnt: PathBuf,
    options: Vec<String>,
    mounted: bool,
}

impl TestVolume {
    /// Formats a fresh volume and mounts it with safs's default options.
    #[track_caller]
    pub fn new() -> Self {
        Self::with_options(&[])
    }

    /// Formats a fresh volume and mounts it with `-o <options joined by ,>`.
    #[track_caller]
    pub fn with_options(options: &[&str]) -> Self {
        Self::with_format_args(&[], options)
    }

    /// Like [`TestVolume::with_options`], passing extra arguments to `safs format`.
    #[track_caller]
    pub fn with_format_args(format_args: &[&str], options: &[&str]) -> Self {
        let mut v = Self::formatted(format_args);
        v.options = options.iter().map(|s| (*s).to_string()).collect();
        v.mount();
        v
    }

    /// A formatted but not yet mounted volume (call [`TestVolume::mount`]).
    #[track_caller]
    pub fn formatted(format_args: &[&str]) -> Self {
        require_fuse();
        let root = tempfile::Builder::new()
            .prefix("safs-test-")
            .tempdir_in("/tmp")
            .expect("create temp dir under /tmp");
        let root_path = root.path().to_path_buf();
        // Non-root test users must be able to walk to the mount point.
        fs::set_permissions(&root_path, fs::Permissions::from_mode(0o755)).unwrap();
        let vol = root_path.join("vol");
        let mnt = root_path.join("mnt");
        fs::create_dir(&mnt).unwrap();
        let mut args: Vec<&OsStr> = vec![OsStr::new("format"), vol.as_os_str()];
        args.extend(format_args.iter().map(OsStr::new));
        let out = safs(&args);
        out.assert_success(&format!("safs format {}", vol.display()));
        TestVolume {
            root: Some(root),
            root_path,
            vol,
            mnt,
            options: Vec::new(),
            mounted: false,
        }
    }

    /// The mount point.
    pub fn mnt(&self) -> &Path {
        &self.mnt
    }

    /// `mnt().join(rel)`.
    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.mnt.join(rel)
    }

    /// The volume directory (where `safs format` wrote).
    pub fn vol(&self) -> &Path {
        &self.vol
    }

    /// The temporary directory holding `vol/` and `mnt/`; free for scratch files.
    pub fn root(&self) -> &Path {
        &self.root_path
    }

    pub fn is_mounted(&self) -> bool {
        self.mounted
    }

    /// The mount options this volume is (re)mounted with.
    pub fn options(&self) -> &[String] {
        &self.options
    }

    /// Changes the options used by the next [`TestVolume::mount`].
    pub fn set_options(&mut self, options: &[&str]) {
        self.options = options.iter().map(|s| (*s).to_string()).collect();
    }

    /// What the daemon said so far: stdout and stderr of every `safs mount`,
    /// then the last 200 lines of `<vol>/safs.log` if the daemon keeps one.
    pub fn daemon_log(&self) -> String {
        let mut log = fs::read_to_string(self.root_path.join("daemon.log")).unwrap_or_default();
        if let Ok(own) = fs::read_to_string(self.vol.join("safs.log")) {
            let lines: Vec<&str> = own.lines().collect();
            let tail = &lines[lines.len().saturating_sub(200)..];
            log.push_str(&format!(
                "\n[{}/safs.log, last {} lines]\n",
                self.vol.display(),
                tail.len()
            ));
            log.push_str(&tail.join("\n"));
        }
        log
    }

    /// The arguments of `safs mount` for this volume.
    pub fn mount_args(&self) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = vec![
            "mount".into(),
            self.vol.clone().into_os_string(),
            self.mnt.clone().into_os_string(),
        ];
        if !self.options.is_empty() {
            args.push("-o".into());
            args.push(self.options.join(",").into());
        }
        args
    }

    /// Runs `safs mount` and checks the mount is live when it returns.
    #[track_caller]
    pub fn mount(&mut self) {
        assert!(!self.mounted, "mount() on a mounted volume");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root_path.join("daemon.log"))
            .expect("open daemon.log");
        let mut cmd = Command::new(SAFS);
        with_child_env(&mut cmd);
        cmd.args(self.mount_args())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let desc = format!("{cmd:?}");
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {desc}: {e}"));
        let status = wait_child_timeout(&mut child, COMMAND_TIMEOUT)
            .unwrap_or_else(|| panic!("{desc} did not return within {COMMAND_TIMEOUT:?}"));
        assert!(
            status.success(),
            "{desc} failed ({status}); daemon.log:\n{}",
            self.daemon_log()
        );
        // Contract: `safs mount` returns only once the mount is live.
        assert!(
            is_fuse_mounted(&self.mnt),
            "`safs mount` exited 0 but {} is not a FUSE mount yet (it must return only \
             once the mount is live); daemon.log:\n{}",
            self.mnt.display(),
            self.daemon_log()
        );
        self.mounted = true;
    }

    /// Unmounts with `umount` and waits until the daemon released its lock.
    /// Panics if that does not happen within [`UNMOUNT_TIMEOUT`].
    #[track_caller]
    pub fn unmount(&mut self) {
        if let Err(msg) = self.try_unmount() {
            panic!("{msg}");
        }
    }

    /// Unmount, then mount again with the same options. Afterwards nothing is
    /// served from the kernel's caches of the previous mount.
    #[track_caller]
    pub fn remount(&mut self) {
        self.unmount();
        self.mount();
    }

    /// Waits until the daemon has released `<vol>/lock` (bounded).
    pub fn wait_lock_released(&self, timeout: Duration) -> bool {
        wait_until(timeout, || lock_state(&self.vol) != LockState::Held)
    }

    /// Marks the volume as unmounted by some other means (SIGTERM,
    /// `fusermount3 -u`, ...) after the caller checked that it is.
    pub fn forget_mounted(&mut self) {
        self.mounted = false;
    }

    /// Takes charge of a mount the test made itself (e.g. `safs mount -f`),
    /// so that [`Drop`] unmounts it.
    pub fn adopt_mount(&mut self) {
        assert!(is_fuse_mounted(&self.mnt), "adopt_mount: nothing mounted");
        self.mounted = true;
    }

    /// After the daemon was killed (SIGKILL): detach the dead mount and
    /// wait until the lock is free, so the volume can be mounted again.
    #[track_caller]
    pub fn unmount_after_crash(&mut self) {
        if is_fuse_mounted(&self.mnt) {
            let out = run_cmd_timeout(
                Command::new("umount").arg("-l").arg(&self.mnt),
                Duration::from_secs(30),
            );
            assert!(
                !is_fuse_mounted(&self.mnt),
                "umount -l {} failed: {}",
                self.mnt.display(),
                out.stderr
            );
        }
        self.mounted = false;
        assert!(
            self.wait_lock_released(UNMOUNT_TIMEOUT),
            "lock still held {UNMOUNT_TIMEOUT:?} after the daemon was killed"
        );
    }

    fn try_unmount(&mut self) -> Result<(), String> {
        if !self.mounted {
            return Ok(());
        }
        self.mounted = false;
        // umount can fail with EBUSY for a moment after a file is closed
        // (the kernel releases asynchronously): retry briefly.
        let deadline = Instant::now() + Duration::from_secs(5);
        while is_fuse_mounted(&self.mnt) {
            let out = run_cmd_timeout(
                Command::new("umount").arg(&self.mnt),
                Duration::from_secs(30),
            );
            if out.success() {
                break;
            }
            let last = out.stderr;
            if Instant::now() >= deadline {
                let lazy = run_cmd_timeout(
                    Command::new("umount").arg("-l").arg(&self.mnt),
                    Duration::from_secs(30),
                );
                if is_fuse_mounted(&self.mnt) {
                    return Err(format!(
                        "cannot unmount {}: umount said {last:?}, umount -l said {:?}",
                        self.mnt.display(),
                        lazy.stderr
                    ));
                }
                return Err(format!(
                    "umount {} kept failing ({last:?}); detached it with umount -l",
                    self.mnt.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if !self.wait_lock_released(UNMOUNT_TIMEOUT) {
            return Err(format!(
                "the safs daemon did not release {}/lock within {UNMOUNT_TIMEOUT:?} after \
                 unmount; daemon.log:\n{}",
                self.vol.display(),
                self.daemon_log()
            ));
        }
        Ok(())
    }

    /// Last resort after a failed unmount: kill the daemon we started.
    fn kill_daemon(&self) {
        if lock_state(&self.vol) == LockState::Held {
            let pid = daemon_pid(&self.vol);
            let _ = kill(pid, Signal::SIGKILL);
            let _ = wait_until(UNMOUNT_TIMEOUT, || !process_alive(pid));
        }
        if is_fuse_mounted(&self.mnt) {
            let _ = run_cmd_timeout(
                Command::new("umount").arg("-l").arg(&self.mnt),
                Duration::from_secs(30),
            );
        }
    }
}

impl Drop for TestVolume {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        if panicking {
            eprintln!(
                "---- safs daemon.log for {} ----\n{}\n---- end of daemon.log ----",
                self.root_path.display(),
                self.daemon_log()
            );
        }
        let was_mounted = self.mounted;
        let mut result = self.try_unmount();
        if result.is_ok() && !was_mounted && lock_state(&self.vol) == LockState::Held {
            // Unmounted by the test through another path: still wait for the daemon.
            if !self.wait_lock_released(UNMOUNT_TIMEOUT) {
                result = Err(format!(
                    "the safs daemon still holds {}/lock {UNMOUNT_TIMEOUT:?} after the \
                     volume was unmounted",
                    self.vol.display()
                ));
            }
        }
        if let Err(msg) = result {
            self.kill_daemon();
            if is_fuse_mounted(&self.mnt) {
                // Never let TempDir's cleanup walk into a live mount.
                if let Some(root) = self.root.take() {
                    let _ = root.keep();
                }
            }
            if !panicking {
                panic!("{msg}");
            }
            eprintln!("{msg}");
        }
    }
}

// ---------------------------------------------------------------------------
// Errno helpers
// ---------------------------------------------------------------------------

/// The errno inside an `io::Error` from a system call.
#[track_caller]
pub fn errno_of(e: io::Error) -> Errno {
    Errno::from_raw(
        e.raw_os_error()
            .unwrap_or_else(|| panic!("io::Error without an errno: {e}")),
    )
}

/// Maps an `io::Result` to a `Result<_, Errno>` so tests can compare errnos.
pub trait IoErrno<T> {
    fn errno(self) -> Result<T, Errno>;
}

impl<T> IoErrno<T> for io::Result<T> {
    #[track_caller]
    fn errno(self) -> Result<T, Errno> {
        self.map_err(errno_of)
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

fn cname(name: &str) -> CString {
    CString::new(name).expect("xattr name without NUL")
}

// ---------------------------------------------------------------------------
// Extended attributes through libc, with exact errnos
// ---------------------------------------------------------------------------

pub const XATTR_CREATE: i32 = libc::XATTR_CREATE;
pub const XATTR_REPLACE: i32 = libc::XATTR_REPLACE;

/// `setxattr(2)` (follows symlinks).
pub fn setxattr(path: &Path, name: &str, value: &[u8], flags: i32) -> Result<(), Errno> {
    let (p, n) = (cpath(path), cname(name));
    // SAFETY: valid NUL-terminated strings and a buffer of value.len() bytes.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    Errno::result(r).map(drop)
}

/// `lsetxattr(2)` (acts on a symlink itself).
pub fn lsetxattr(path: &Path, name: &str, value: &[u8], flags: i32) -> Result<(), Errno> {
    let (p, n) = (cpath(path), cname(name));
    // SAFETY: as in setxattr.
    let r = unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    Errno::result(r).map(drop)
}

fn getxattr_raw(path: &Path, name: &str, buf: &mut [u8], follow: bool) -> Result<usize, Errno> {
    let (p, n) = (cpath(path), cname(name));
    let (ptr, len) = if buf.is_empty() {
        (std::ptr::null_mut(), 0)
    } else {
        (buf.as_mut_ptr().cast(), buf.len())
    };
    // SAFETY: `ptr` is null with len 0, or points to `len` writable bytes.
    let r = unsafe {
        if follow {
            libc::getxattr(p.as_ptr(), n.as_ptr(), ptr, len)
        } else {
            libc::lgetxattr(p.as_ptr(), n.as_ptr(), ptr, len)
        }
    };
    Errno::result(r).map(|n| n as usize)
}

/// The size of an xattr value (`getxattr` with a zero-length buffer).
pub fn getxattr_size(path: &Path, name: &str) -> Result<usize, Errno> {
    getxattr_raw(path, name, &mut [], true)
}

/// `getxattr` into a buffer of exactly `bufsize` bytes (to provoke `ERANGE`).
pub fn getxattr_with_buf(path: &Path, name: &str, bufsize: usize) -> Result<Vec<u8>, Errno> {
    let mut buf = vec![0u8; bufsize];
    let n = if bufsize == 0 {
        // A zero-size buffer asks for the size; return no bytes.
        getxattr_raw(path, name, &mut [], true).map(|_| 0)?
    } else {
        getxattr_raw(path, name, &mut buf, true)?
    };
    buf.truncate(n);
    Ok(buf)
}

fn getxattr_any(path: &Path, name: &str, follow: bool) -> Result<Vec<u8>, Errno> {
    for _ in 0..5 {
        let size = getxattr_raw(path, name, &mut [], follow)?;
        // One spare byte: a value that grew in between gives ERANGE, retry.
        let mut buf = vec![0u8; size + 1];
        match getxattr_raw(path, name, &mut buf, follow) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(Errno::ERANGE) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Errno::ERANGE)
}

/// The whole value of an xattr (`getxattr`, follows symlinks).
pub fn getxattr(path: &Path, name: &str) -> Result<Vec<u8>, Errno> {
    getxattr_any(path, name, true)
}

/// The whole value of an xattr of the symlink itself (`lgetxattr`).
pub fn lgetxattr(path: &Path, name: &str) -> Result<Vec<u8>, Errno> {
    getxattr_any(path, name, false)
}

fn listxattr_raw(path: &Path, buf: &mut [u8], follow: bool) -> Result<usize, Errno> {
    let p = cpath(path);
    let (ptr, len) = if buf.is_empty() {
        (std::ptr::null_mut(), 0)
    } else {
        (buf.as_mut_ptr().cast(), buf.len())
    };
    // SAFETY: `ptr` is null with len 0, or points to `len` writable bytes.
    let r = unsafe {
        if follow {
            libc::listxattr(p.as_ptr(), ptr, len)
        } else {
            libc::llistxattr(p.as_ptr(), ptr, len)
        }
    };
    Errno::result(r).map(|n| n as usize)
}

/// The size `listxattr` asks for (zero-length buffer).
pub fn listxattr_size(path: &Path) -> Result<usize, Errno> {
    listxattr_raw(path, &mut [], true)
}

/// `listxattr` into a buffer of exactly `bufsize` (> 0) bytes; the raw list.
pub fn listxattr_with_buf(path: &Path, bufsize: usize) -> Result<Vec<u8>, Errno> {
    assert!(bufsize > 0, "use listxattr_size for a zero-length buffer");
    let mut buf = vec![0u8; bufsize];
    let n = listxattr_raw(path, &mut buf, true)?;
    buf.truncate(n);
    Ok(buf)
}

fn split_names(raw: &[u8]) -> Vec<String> {
    assert!(
        raw.is_empty() || raw.last() == Some(&0),
        "listxattr result is not NUL-terminated: {raw:?}"
    );
    raw.split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8(s.to_vec()).expect("xattr name is UTF-8"))
        .collect()
}

fn listxattr_any(path: &Path, follow: bool) -> Result<Vec<String>, Errno> {
    for _ in 0..5 {
        let size = listxattr_raw(path, &mut [], follow)?;
        if size == 0 {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; size];
        match listxattr_raw(path, &mut buf, follow) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(split_names(&buf));
            }
            Err(Errno::ERANGE) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Errno::ERANGE)
}

/// The xattr names of a file, in the order listed (`listxattr`).
pub fn listxattr(path: &Path) -> Result<Vec<String>, Errno> {
    listxattr_any(path, true)
}

/// The xattr names of a symlink itself (`llistxattr`).
pub fn llistxattr(path: &Path) -> Result<Vec<String>, Errno> {
    listxattr_any(path, false)
}

/// `removexattr(2)`.
pub fn removexattr(path: &Path, name: &str) -> Result<(), Errno> {
    let (p, n) = (cpath(path), cname(name));
    // SAFETY: valid NUL-terminated strings.
    Errno::result(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) }).map(drop)
}

/// `lremovexattr(2)`.
pub fn lremovexattr(path: &Path, name: &str) -> Result<(), Errno> {
    let (p, n) = (cpath(path), cname(name));
    // SAFETY: valid NUL-terminated strings.
    Errno::result(unsafe { libc::lremovexattr(p.as_ptr(), n.as_ptr()) }).map(drop)
}

// ---------------------------------------------------------------------------
// Other syscalls the tests need with exact errnos
// ---------------------------------------------------------------------------

/// `renameat2(AT_FDCWD, from, AT_FDCWD, to, flags)`.
pub fn renameat2(from: &Path, to: &Path, flags: u32) -> Result<(), Errno> {
    let (a, b) = (cpath(from), cpath(to));
    // SAFETY: valid NUL-terminated paths.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    Errno::result(r).map(drop)
}

/// `mknod(2)`.
pub fn mknod(path: &Path, mode: libc::mode_t, dev: libc::dev_t) -> Result<(), Errno> {
    let p = cpath(path);
    // SAFETY: valid NUL-terminated path.
    Errno::result(unsafe { libc::mknod(p.as_ptr(), mode, dev) }).map(drop)
}

/// `utimensat(AT_FDCWD, path, [atime, mtime], flags)`; use `libc::UTIME_NOW`
/// / `libc::UTIME_OMIT` in `tv_nsec` for the special values.
pub fn utimensat(
    path: &Path,
    atime: (i64, i64),
    mtime: (i64, i64),
    flags: i32,
) -> Result<(), Errno> {
    let p = cpath(path);
    let ts = [
        libc::timespec {
            tv_sec: atime.0,
            tv_nsec: atime.1,
        },
        libc::timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1,
        },
    ];
    // SAFETY: valid path and an array of two timespecs.
    Errno::result(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), ts.as_ptr(), flags) })
        .map(drop)
}

/// `statfs(2)` on a path.
pub fn statfs(path: &Path) -> libc::statfs {
    let p = cpath(path);
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: valid path and a writable statfs buffer.
    let r = unsafe { libc::statfs(p.as_ptr(), st.as_mut_ptr()) };
    Errno::result(r).unwrap_or_else(|e| panic!("statfs {}: {e}", path.display()));
    // SAFETY: statfs succeeded and filled the buffer.
    unsafe { st.assume_init() }
}

/// `open(2)` with raw flags and mode; returns the owned file.
pub fn open_raw(path: &Path, flags: i32, mode: libc::mode_t) -> Result<File, Errno> {
    use std::os::fd::FromRawFd;
    let p = cpath(path);
    // SAFETY: valid path; the returned descriptor is owned by the File.
    let fd = unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    let fd = Errno::result(fd)?;
    // SAFETY: `fd` was just returned by open(2) and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// `lstat`-based helpers that read well in assertions.
pub fn lmeta(path: &Path) -> fs::Metadata {
    fs::symlink_metadata(path).unwrap_or_else(|e| panic!("lstat {}: {e}", path.display()))
}

pub fn meta(path: &Path) -> fs::Metadata {
    fs::metadata(path).unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
}

/// Permission and type bits of `path` (`st_mode`, without following symlinks).
pub fn mode_of(path: &Path) -> u32 {
    lmeta(path).mode()
}

/// The process umask, read without changing it (from /proc/self/status).
pub fn current_umask() -> u32 {
    let status = fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        .expect("Umask line in /proc/self/status")
}

/// Sets the permission bits exactly (chmod ignores the umask).
pub fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {:o} {}: {e}", mode, path.display()));
}

/// `chown` as root.
pub fn chown(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
        .unwrap_or_else(|e| panic!("chown {uid}:{gid} {}: {e}", path.display()));
}

/// Deterministic pseudo-random bytes (xorshift64*), different for each seed,
/// with plenty of zero and 0xff bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Finds the first differing offset, for readable assertion messages.
#[track_caller]
pub fn assert_bytes_eq(actual: &[u8], expected: &[u8], what: &str) {
    if actual == expected {
        return;
    }
    let first = actual
        .iter()
        .zip(expected)
        .position(|(a, b)| a != b)
        .unwrap_or(actual.len().min(expected.len()));
    panic!(
        "{what}: content differs (len {} vs expected {}), first difference at byte {first}",
        actual.len(),
        expected.len()
    );
}

/// Writes `data` to a new file at `path` (create/truncate) and closes it.
pub fn write_file(path: &Path, data: &[u8]) {
    fs::write(path, data).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

pub fn read_file(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Sorted names in a directory (without `.` and `..`).
pub fn list_dir(path: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(path)
        .unwrap_or_else(|e| panic!("readdir {}: {e}", path.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

// ---------------------------------------------------------------------------
// Test users and running code as them
// ---------------------------------------------------------------------------

/// A local user for permission tests.
#[derive(Clone, Debug)]
pub struct TestUser {
    pub name: String,
    pub uid: u32,
    /// Primary group.
    pub gid: u32,
    /// All groups, primary first (what a login would get).
    pub groups: Vec<u32>,
}

/// The test users, created on first use if missing.
pub struct Users {
    /// `safs_u1`: own primary group, and a member of `safs_shared`.
    pub u1: TestUser,
    /// `safs_u2`: own primary group only.
    pub u2: TestUser,
    /// gid of `safs_shared`.
    pub shared_gid: u32,
}

pub const SHARED_GROUP: &str = "safs_shared";

/// The test users `safs_u1` and `safs_u2` and the group `safs_shared`,
/// created (idempotently, tolerating concurrent test processes) if missing.
pub fn users() -> &'static Users {
    static USERS: OnceLock<Users> = OnceLock::new();
    USERS.get_or_init(|| {
        ensure_group(SHARED_GROUP);
        ensure_user("safs_u1", Some(SHARED_GROUP));
        ensure_user("safs_u2", None);
        let shared_gid = nix::unistd::Group::from_name(SHARED_GROUP)
            .unwrap()
            .expect("safs_shared exists")
            .gid
            .as_raw();
        Users {
            u1: lookup_user("safs_u1"),
            u2: lookup_user("safs_u2"),
            shared_gid,
        }
    })
}

fn retry_admin(what: &str, mut done: impl FnMut() -> bool, mut cmd: impl FnMut() -> Command) {
    // The shadow tools lock /etc/passwd; parallel test processes may collide.
    for _ in 0..50 {
        if done() {
            return;
        }
        let _ = run_cmd(&mut cmd());
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("could not {what} (needs root and the passwd package: useradd/groupadd/usermod)");
}

fn ensure_group(name: &str) {
    retry_admin(
        &format!("create group {name}"),
        || nix::unistd::Group::from_name(name).ok().flatten().is_some(),
        || {
            let mut c = Command::new("groupadd");
            c.args(["-f", name]);
            c
        },
    );
}

fn ensure_user(name: &str, extra_group: Option<&str>) {
    retry_admin(
        &format!("create user {name}"),
        || nix::unistd::User::from_name(name).ok().flatten().is_some(),
        || {
            let mut c = Command::new("useradd");
            c.args([
                "--no-create-home",
                "--user-group",
                "--shell",
                "/usr/sbin/nologin",
            ]);
            if let Some(g) = extra_group {
                c.args(["--groups", g]);
            }
            c.arg(name);
            c
        },
    );
    if let Some(g) = extra_group {
        let member = || {
            nix::unistd::Group::from_name(g)
                .ok()
                .flatten()
                .is_some_and(|gr| gr.mem.iter().any(|m| m == name))
        };
        retry_admin(&format!("add {name} to group {g}"), member, || {
            let mut c = Command::new("usermod");
            c.args(["-a", "-G", g, name]);
            c
        });
    }
}

fn lookup_user(name: &str) -> TestUser {
    let u = nix::unistd::User::from_name(name)
        .unwrap()
        .unwrap_or_else(|| panic!("user {name} missing"));
    let cname = CString::new(name).unwrap();
    let groups = nix::unistd::getgrouplist(&cname, u.gid)
        .unwrap()
        .into_iter()
        .map(Gid::as_raw);
    let mut all = vec![u.gid.as_raw()];
    all.extend(groups.filter(|g| *g != u.gid.as_raw()));
    TestUser {
        name: name.to_string(),
        uid: u.uid.as_raw(),
        gid: u.gid.as_raw(),
        groups: all,
    }
}

/// Runs `program args...` as `user` (with its supplementary groups) through
/// `setpriv`, capturing output. `LC_ALL=C`, so messages are in English.
#[track_caller]
pub fn run_as<I, S>(user: &TestUser, program: &str, args: I) -> CmdOutput
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--reuid={}", user.uid))
        .arg(format!("--regid={}", user.gid))
        .arg("--init-groups")
        .arg("--")
        .arg(program)
        .args(args);
    run_cmd(&mut cmd)
}

/// Runs `sh -c script` as `user` (see [`run_as`]).
#[track_caller]
pub fn sh_as(user: &TestUser, script: &str) -> CmdOutput {
    run_as(user, "sh", ["-c", script])
}

/// Values a closure run by [`as_user`] can hand back to the test.
pub trait ChildValue: Sized {
    fn encode(&self) -> Vec<u8>;
    fn decode(bytes: &[u8]) -> Self;
}

impl ChildValue for () {
    fn encode(&self) -> Vec<u8> {
        Vec::new()
    }
    fn decode(_: &[u8]) -> Self {}
}

impl ChildValue for Vec<u8> {
    fn encode(&self) -> Vec<u8> {
        self.clone()
    }
    fn decode(bytes: &[u8]) -> Self {
        bytes.to_vec()
    }
}

impl ChildValue for String {
    fn encode(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
    fn decode(bytes: &[u8]) -> Self {
        String::from_utf8(bytes.to_vec()).expect("UTF-8 from child")
    }
}

impl ChildValue for u64 {
    fn encode(&self) -> Vec<u8> {
        self.to_le_bytes().to_vec()
    }
    fn decode(bytes: &[u8]) -> Self {
        u64::from_le_bytes(bytes.try_into().expect("8 bytes from child"))
    }
}

impl ChildValue for usize {
    fn encode(&self) -> Vec<u8> {
        (*self as u64).encode()
    }
    fn decode(bytes: &[u8]) -> Self {
        usize::try_from(u64::decode(bytes)).unwrap()
    }
}

impl ChildValue for Vec<String> {
    fn encode(&self) -> Vec<u8> {
        self.join("\0").into_bytes()
    }
    fn decode(bytes: &[u8]) -> Self {
        if bytes.is_empty() {
            return Vec::new();
        }
        String::from_utf8(bytes.to_vec())
            .expect("UTF-8 from child")
            .split('\0')
            .map(str::to_string)
            .collect()
    }
}

/// Serialises the window between creating a result pipe and closing its write
/// end in the parent, so that no other `as_user` child inherits that end and
/// delays the end-of-file the parent waits for.
static FORK_LOCK: Mutex<()> = Mutex::new(());

const TAG_OK: u8 = 0;
const TAG_ERRNO: u8 = 1;
const TAG_PANIC: u8 = 2;
const TAG_SETUP: u8 = 3;

/// Runs `f` in a forked child process whose real, effective and saved uid and
/// gid are `user`'s, with `user`'s supplementary groups, and returns what `f`
/// returned. The test process's own credentials never change.
///
/// `f` should only do file-system work (std::fs, libc, the helpers here); it
/// must not touch the test harness (no printing, no locks, no env). The child
/// is forked from a multi-threaded process: glibc makes `malloc` safe after
/// fork, but other locks held by other threads at that moment stay locked in
/// the child. A panic in `f` fails the calling test with the panic message.
#[track_caller]
pub fn as_user<T: ChildValue>(
    user: &TestUser,
    f: impl FnOnce() -> Result<T, Errno>,
) -> Result<T, Errno> {
    let uid = Uid::from_raw(user.uid);
    let gid = Gid::from_raw(user.gid);
    let groups: Vec<Gid> = user.groups.iter().map(|g| Gid::from_raw(*g)).collect();

    let guard = FORK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (rd, wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe2");
    // SAFETY: the child only runs `f` and the credential calls, then `_exit`s
    // without returning into the harness; see the doc comment for what `f`
    // may do.
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            drop(rd);
            let mut w = File::from(wr);
            let mut msg = Vec::new();
            let setup = setgroups(&groups)
                .and_then(|()| setresgid(gid, gid, gid))
                .and_then(|()| setresuid(uid, uid, uid));
            let code = match setup {
                Err(e) => {
                    msg.push(TAG_SETUP);
                    msg.extend_from_slice(&(e as i32).to_le_bytes());
                    3
                }
                Ok(()) => match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
                    Ok(Ok(v)) => {
                        msg.push(TAG_OK);
                        msg.extend_from_slice(&v.encode());
                        0
                    }
                    Ok(Err(e)) => {
                        msg.push(TAG_ERRNO);
                        msg.extend_from_slice(&(e as i32).to_le_bytes());
                        0
                    }
                    Err(p) => {
                        let text = p
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_string()))
                            .unwrap_or_else(|| "non-string panic".to_string());
                        msg.push(TAG_PANIC);
                        msg.extend_from_slice(text.as_bytes());
                        101
                    }
                },
            };
            let _ = w.write_all(&msg);
            drop(w);
            // SAFETY: leave the child at once, skipping atexit handlers and
            // destructors that belong to the parent's state.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => {
            drop(wr);
            drop(guard);
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut r = File::from(rd);
                let mut buf = Vec::new();
                let res = r.read_to_end(&mut buf).map(|_| buf);
                let _ = tx.send(res);
            });
            let Ok(received) = rx.recv_timeout(COMMAND_TIMEOUT) else {
                let _ = kill(child, Signal::SIGKILL);
                let _ = waitpid(child, None);
                panic!(
                    "closure run as {} did not finish within {COMMAND_TIMEOUT:?}",
                    user.name
                );
            };
            let buf = received.expect("read result pipe");
            let status = waitpid(child, None).expect("waitpid");
            decode_child_result(user, &buf, status)
        }
    }
}

#[track_caller]
fn decode_child_result<T: ChildValue>(
    user: &TestUser,
    buf: &[u8],
    status: WaitStatus,
) -> Result<T, Errno> {
    let errno = |b: &[u8]| Errno::from_raw(i32::from_le_bytes(b.try_into().expect("4-byte errno")));
    match buf.split_first() {
        Some((&TAG_OK, rest)) => Ok(T::decode(rest)),
        Some((&TAG_ERRNO, rest)) => Err(errno(rest)),
        Some((&TAG_PANIC, rest)) => panic!(
            "closure run as {} panicked: {}",
            user.name,
            String::from_utf8_lossy(rest)
        ),
        Some((&TAG_SETUP, rest)) => panic!(
            "could not switch to user {} (uid {}): {}",
            user.name,
            user.uid,
            errno(rest)
        ),
        _ => panic!(
            "closure run as {} died without a result: {status:?}",
            user.name
        ),
    }
}

/// `/sbin/mount.fuse.safs` pointed at the binary under test for the life of
/// the guard (tests of one file take turns; cargo runs test files one after
/// another), then put back as it was.
pub struct MountHelper {
    previous: Option<PathBuf>,
    _turn: std::sync::MutexGuard<'static, ()>,
}

static HELPER_TURN: Mutex<()> = Mutex::new(());
const HELPER: &str = "/sbin/mount.fuse.safs";

impl MountHelper {
    pub fn install() -> MountHelper {
        let turn = HELPER_TURN.lock().unwrap_or_else(|e| e.into_inner());
        let previous = fs::read_link(HELPER).ok();
        let _ = fs::remove_file(HELPER);
        std::os::unix::fs::symlink(SAFS, HELPER).unwrap();
        MountHelper {
            previous,
            _turn: turn,
        }
    }
}

impl Drop for MountHelper {
    fn drop(&mut self) {
        let _ = fs::remove_file(HELPER);
        if let Some(p) = &self.previous {
            let _ = std::os::unix::fs::symlink(p, HELPER);
        }
    }
}

/// What a tree holds, path by path: mode, size, link count, a sum of the
/// contents (or the symlink target's length), and every xattr with its
/// value — what must come back the same after the volume moves or is
/// restored.
pub fn tree_of(root: &Path) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            let body = if m.is_dir() {
                stack.push(p.clone());
                0
            } else if m.file_type().is_symlink() {
                fs::read_link(&p).unwrap().as_os_str().len() as u64
            } else {
                fs::read(&p).unwrap().iter().map(|&b| u64::from(b)).sum()
            };
            let mut names = llistxattr(&p).unwrap();
            names.sort();
            let x: Vec<(String, Vec<u8>)> = names
                .into_iter()
                .map(|n| (n.clone(), lgetxattr(&p, &n).unwrap()))
                .collect();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            out.insert(
                rel,
                format!("{:o} {} {} {body} {x:?}", m.mode(), m.size(), m.nlink()),
            );
        }
    }
    out
}
