//! The model shared by the model-based tests (`crash.rs`, `fsx.rs`): an
//! expected filesystem state, a random mixed workload that applies each
//! step to the model and to a real mount, and helpers to read a mount back
//! and to mount and unmount volumes.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// What every safs command of this test binary runs with besides the
/// binary's own environment (an object store's credentials and endpoint),
/// set once; tests run in threads and must not change their own.
pub static SAFS_ENV: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();

pub fn safs() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_safs"));
    cmd.envs(SAFS_ENV.get().into_iter().flatten().map(|(k, v)| (k, v)));
    cmd
}

/// An encrypted volume's passphrase file, written into `dir`; formats
/// with the fast test KDF (the real one is tuned to ~0.5 s per unlock).
pub struct Encrypted {
    pub passfile: std::path::PathBuf,
}

impl Encrypted {
    pub fn new(dir: &Path) -> Self {
        let passfile = dir.join("passphrase");
        std::fs::write(&passfile, b"model checker passphrase\n").unwrap();
        Encrypted { passfile }
    }

    /// Extra arguments of `safs format`.
    pub fn format_args(&self) -> Vec<String> {
        vec![
            "--encrypt".into(),
            "--kdf-testing".into(),
            "--passphrase-file".into(),
            self.passfile.to_str().unwrap().into(),
        ]
    }

    /// The mount option naming the passphrase file.
    pub fn mount_option(&self) -> String {
        format!("passphrase_file={}", self.passfile.display())
    }
}

pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("spawn");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed: {text}");
    text
}

thread_local! {
    /// The steps this thread's workload took, for failure reports and the
    /// check for a torn in-flight write. Per thread: the tests of one
    /// binary run side by side, and one shared log gave a test the other's
    /// last step as its own (crash.rs: a torn write of the kill loop taken
    /// for a lost one, as the PostgreSQL loop's step came last).
    static OPLOG: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub fn note(s: String) {
    OPLOG.with_borrow_mut(|log| log.push(s));
}

/// Starts this thread's step log afresh.
pub fn oplog_clear() {
    OPLOG.with_borrow_mut(Vec::clear);
}

/// The last step this thread logged.
pub fn oplog_last() -> Option<String> {
    OPLOG.with_borrow(|log| log.last().cloned())
}

/// This thread's step log, oldest first.
pub fn oplog() -> Vec<String> {
    OPLOG.with_borrow(Clone::clone)
}

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> Option<&'a T> {
        if v.is_empty() {
            None
        } else {
            Some(&v[self.below(v.len() as u64) as usize])
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    pub kind: Kind,
    pub mode: u32,
    pub xattrs: BTreeMap<String, Vec<u8>>,
    pub data: Vec<u8>,
}

/// The expected state: paths → inode ids, inode ids → inodes.
/// The comparable metadata of a state: per path (kind, mode, xattrs), and
/// the groups of paths that are hard links of one inode.
pub type Meta = (
    BTreeMap<String, (Kind, u32, BTreeMap<String, Vec<u8>>)>,
    BTreeSet<Vec<String>>,
);

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Model {
    pub names: BTreeMap<String, u64>,
    pub inodes: BTreeMap<u64, Inode>,
    pub next: u64,
}

impl Model {
    pub fn new() -> Self {
        let mut m = Model {
            next: 1,
            ..Default::default()
        };
        for d in ["a", "b", "c"] {
            m.add(
                d,
                Inode {
                    kind: Kind::Dir,
                    mode: 0o755,
                    xattrs: BTreeMap::new(),
                    data: Vec::new(),
                },
            );
        }
        m
    }
    pub fn add(&mut self, path: &str, inode: Inode) {
        self.inodes.insert(self.next, inode);
        self.names.insert(path.to_string(), self.next);
        self.next += 1;
    }
    pub fn get(&self, path: &str) -> Option<&Inode> {
        self.names.get(path).and_then(|i| self.inodes.get(i))
    }
    pub fn get_mut(&mut self, path: &str) -> Option<&mut Inode> {
        let id = *self.names.get(path)?;
        self.inodes.get_mut(&id)
    }
    pub fn unlink(&mut self, path: &str) {
        if let Some(id) = self.names.remove(path) {
            if !self.names.values().any(|&v| v == id) {
                self.inodes.remove(&id);
            }
        }
    }
    pub fn children(&self, dir: &str) -> usize {
        let prefix = format!("{dir}/");
        self.names.keys().filter(|p| p.starts_with(&prefix)).count()
    }
    /// Comparable view: per path, (inode group, kind, mode, xattrs).
    pub fn meta(&self) -> Meta {
        let mut by_path = BTreeMap::new();
        let mut groups: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for (p, id) in &self.names {
            let i = &self.inodes[id];
            by_path.insert(p.clone(), (i.kind.clone(), i.mode, i.xattrs.clone()));
            groups.entry(*id).or_default().push(p.clone());
        }
        (by_path, groups.into_values().collect())
    }
}

/// Names the workload uses: three directories, a few names in each (and
/// the subdirectory names "a/sub", "b/sub").
pub fn names() -> Vec<String> {
    let mut v = Vec::new();
    for d in ["a", "b", "c"] {
        for n in ["f1", "f2", "f3", "f4", "l1", "s1"] {
            v.push(format!("{d}/{n}"));
        }
    }
    v.push("a/sub".into());
    v.push("b/sub".into());
    v
}

pub fn err_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// The daemon is gone: every further call fails with one of these.
pub fn is_dead(errno: i32) -> bool {
    errno == libc::ENOTCONN || errno == libc::ECONNABORTED || errno == libc::EIO
}

pub enum Outcome {
    Done,
    /// The daemon died during the operation.
    Dead,
    /// The operation was refused (a legal errno for the state).
    Refused,
}

pub fn setxattr(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    // SAFETY: valid C strings and a valid buffer for the call's duration.
    let r = unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

pub fn removexattr(path: &Path, name: &str) -> std::io::Result<()> {
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    // SAFETY: valid C strings.
    let r = unsafe { libc::lremovexattr(p.as_ptr(), n.as_ptr()) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

pub fn list_user_xattrs(path: &Path) -> BTreeMap<String, Vec<u8>> {
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut buf = vec![0u8; 65536];
    // SAFETY: valid C string and buffer.
    let n = unsafe { libc::llistxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(
        n >= 0,
        "listxattr {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    let mut out = BTreeMap::new();
    for name in buf[..n as usize]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
    {
        let name = String::from_utf8(name.to_vec()).unwrap();
        if !name.starts_with("user.") {
            continue;
        }
        let n = CString::new(name.clone()).unwrap();
        let mut v = vec![0u8; 65536];
        // SAFETY: valid C strings and buffer.
        let len =
            unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        assert!(
            len >= 0,
            "getxattr {name}: {}",
            std::io::Error::last_os_error()
        );
        v.truncate(len as usize);
        out.insert(name, v);
    }
    out
}

/// Performs one random operation on the mount and on `next` (a copy of the
/// model that becomes the model if the operation completes). Returns
/// whether the operation was a durability point.
pub fn step(rng: &mut Rng, mnt: &Path, next: &mut Model, names: &[String]) -> (Outcome, bool) {
    let path = rng.pick(names).unwrap().clone();
    let full = mnt.join(&path);
    let files: Vec<String> = next
        .names
        .iter()
        .filter(|(_, id)| next.inodes[id].kind == Kind::File)
        .map(|(p, _)| p.clone())
        .collect();
    let existing: Vec<String> = next.names.keys().cloned().collect();
    // Each branch updates `next` to the step's intended effect *before* the
    // system calls, so that a step cut short by the kill is still a
    // candidate state.
    let res: std::io::Result<bool> = (|| {
        match rng.below(12) {
            0 | 1 => {
                // create
                if next.names.contains_key(&path) || path.ends_with("sub") {
                    return Ok(false);
                }
                note(format!("create {path}"));
                next.add(
                    &path,
                    Inode {
                        kind: Kind::File,
                        mode: 0o644,
                        xattrs: BTreeMap::new(),
                        data: Vec::new(),
                    },
                );
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&full)?;
            }
            2 | 3 => {
                // write + fsync: a durability point
                let Some(f) = rng.pick(&files).cloned() else {
                    return Ok(false);
                };
                let off = rng.below(20_000) as usize;
                let len = 1 + rng.below(40_000) as usize;
                let byte = rng.below(255) as u8 + 1;
                note(format!("write {f} off {off} len {len} byte {byte}"));
                let i = next.get_mut(&f).unwrap();
                if i.data.len() < off + len {
                    i.data.resize(off + len, 0);
                }
                i.data[off..off + len].fill(byte);
                let file = std::fs::OpenOptions::new().write(true).open(mnt.join(&f))?;
                use std::os::unix::fs::FileExt;
                file.write_all_at(&vec![byte; len], off as u64)?;
                file.sync_all()?;
                return Ok(true);
            }
            4 => {
                // rename, possibly over an existing name
                let Some(src) = rng.pick(&existing).cloned() else {
                    return Ok(false);
                };
                if ["a", "b", "c"].contains(&src.as_str())
                    || src == path
                    || path.starts_with(&format!("{src}/"))
                {
                    return Ok(false);
                }
                let src_dir = next.get(&src).unwrap().kind == Kind::Dir;
                if let Some(dst) = next.get(&path) {
                    let dst_dir = dst.kind == Kind::Dir;
                    if src_dir != dst_dir || (dst_dir && next.children(&path) > 0) {
                        return Ok(false);
                    }
                }
                if src_dir && next.children(&src) > 0 {
                    return Ok(false);
                }
                note(format!("rename {src} {path}"));
                let id = next.names[&src];
                if next.names.get(&path) != Some(&id) {
                    next.unlink(&path);
                    next.names.remove(&src);
                    next.names.insert(path.clone(), id);
                }
                std::fs::rename(mnt.join(&src), &full)?;
            }
            5 => {
                // hard link
                let Some(src) = rng.pick(&files).cloned() else {
                    return Ok(false);
                };
                if next.names.contains_key(&path) || path.ends_with("sub") {
                    return Ok(false);
                }
                note(format!("link {src} {path}"));
                let id = next.names[&src];
                next.names.insert(path.clone(), id);
                std::fs::hard_link(mnt.join(&src), &full)?;
            }
            6 => {
                // unlink a file or symlink / rmdir an empty directory
                let Some(i) = next.get(&path) else {
                    return Ok(false);
                };
                let dir = i.kind == Kind::Dir;
                if dir && next.children(&path) > 0 {
                    return Ok(false);
                }
                note(format!("unlink {path}"));
                next.unlink(&path);
                if dir {
                    std::fs::remove_dir(&full)?;
                } else {
                    std::fs::remove_file(&full)?;
                }
            }
            7 => {
                // mkdir or symlink
                if next.names.contains_key(&path) {
                    return Ok(false);
                }
                note(format!("make {path}"));
                if path.ends_with("sub") {
                    next.add(
                        &path,
                        Inode {
                            kind: Kind::Dir,
                            mode: 0o755,
                            xattrs: BTreeMap::new(),
                            data: Vec::new(),
                        },
                    );
                    std::fs::create_dir(&full)?;
                    std::fs::set_permissions(&full, std::fs::Permissions::from_mode(0o755))?;
                } else {
                    let target = format!("target-{}", rng.below(1000));
                    next.add(
                        &path,
                        Inode {
                            kind: Kind::Symlink(target.clone()),
                            mode: 0o777,
                            xattrs: BTreeMap::new(),
                            data: Vec::new(),
                        },
                    );
                    std::os::unix::fs::symlink(&target, &full)?;
                }
            }
            8 => {
                // setxattr at every tier
                let Some(i) = next.get(&path) else {
                    return Ok(false);
                };
                if matches!(i.kind, Kind::Symlink(_)) {
                    return Ok(false);
                }
                let size = [10usize, 300, 5_000, 40_000, 65_536][rng.below(5) as usize];
                let name = format!("user.x{}", rng.below(4));
                let value: Vec<u8> = (0..size).map(|j| (j as u64 ^ rng.0) as u8).collect();
                note(format!("setxattr {path} {name} {size}"));
                next.get_mut(&path)
                    .unwrap()
                    .xattrs
                    .insert(name.clone(), value.clone());
                setxattr(&full, &name, &value)?;
            }
            9 => {
                let Some(i) = next.get(&path) else {
                    return Ok(false);
                };
                let Some(name) = i.xattrs.keys().next().cloned() else {
                    return Ok(false);
                };
                note(format!("removexattr {path} {name}"));
                next.get_mut(&path).unwrap().xattrs.remove(&name);
                removexattr(&full, &name)?;
            }
            10 => {
                // chmod or truncate
                let Some(i) = next.get(&path) else {
                    return Ok(false);
                };
                if matches!(i.kind, Kind::Symlink(_)) {
                    return Ok(false);
                }
                if i.kind == Kind::File && rng.below(2) == 0 {
                    let size = rng.below(70_000) as usize;
                    note(format!("truncate {path} {size}"));
                    next.get_mut(&path).unwrap().data.resize(size, 0);
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(&full)?
                        .set_len(size as u64)?;
                } else {
                    let mode = [0o600, 0o640, 0o755, 0o700][rng.below(4) as usize];
                    note(format!("chmod {path} {mode:o}"));
                    next.get_mut(&path).unwrap().mode = mode;
                    std::fs::set_permissions(&full, std::fs::Permissions::from_mode(mode))?;
                }
            }
            _ => {
                // fsyncdir: a durability point
                let d = ["a", "b", "c"][rng.below(3) as usize];
                note(format!("fsyncdir {d}"));
                std::fs::File::open(mnt.join(d))?.sync_all()?;
                return Ok(true);
            }
        }
        Ok(false)
    })();
    match res {
        Ok(durable) => (Outcome::Done, durable),
        Err(e) if is_dead(err_of(&e)) => (Outcome::Dead, false),
        Err(e) => {
            if std::env::var_os("SAFS_CRASH_VERBOSE").is_some() {
                eprintln!("refused: {path}: {e}");
            }
            (Outcome::Refused, false)
        }
    }
}

/// Reads the mounted tree into a model (contents and all).
pub fn read_tree(mnt: &Path) -> Model {
    let mut m = Model::default();
    let mut by_ino: BTreeMap<u64, u64> = BTreeMap::new();
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        let dir = if rel.is_empty() {
            mnt.to_path_buf()
        } else {
            mnt.join(&rel)
        };
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let full = mnt.join(&path);
            let md = std::fs::symlink_metadata(&full).unwrap();
            let kind = if md.is_dir() {
                stack.push(path.clone());
                Kind::Dir
            } else if md.file_type().is_symlink() {
                Kind::Symlink(
                    std::fs::read_link(&full)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                )
            } else {
                Kind::File
            };
            let id = *by_ino.entry(md.ino()).or_insert_with(|| {
                let id = m.next;
                m.next += 1;
                id
            });
            let data = if kind == Kind::File {
                std::fs::read(&full).unwrap()
            } else {
                Vec::new()
            };
            let xattrs = if matches!(kind, Kind::Symlink(_)) {
                BTreeMap::new()
            } else {
                list_user_xattrs(&full)
            };
            let mode = if matches!(kind, Kind::Symlink(_)) {
                0o777
            } else {
                md.mode() & 0o7777
            };
            m.inodes.insert(
                id,
                Inode {
                    kind,
                    mode,
                    xattrs,
                    data,
                },
            );
            m.names.insert(path, id);
        }
    }
    m
}

/// The pid on the first line of `<vol>/lock` (a second line says
/// `mounted`); on a PostgreSQL volume, whose daemons share the lock, the
/// one live session `safs info` lists.
pub fn daemon_pid(vol: &Path) -> i32 {
    if vol.join("meta/postgres.conf").exists() {
        let out = safs().arg("info").arg(vol).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let live: Vec<i32> = text
            .lines()
            .filter_map(|l| l.strip_prefix("session:"))
            .filter(|l| !l.contains("(gone"))
            .filter_map(|l| {
                l.trim()
                    .strip_prefix("pid ")?
                    .split(' ')
                    .next()?
                    .parse()
                    .ok()
            })
            .collect();
        assert_eq!(live.len(), 1, "one live session expected: {text}");
        return live[0];
    }
    let text = std::fs::read_to_string(vol.join("lock")).unwrap();
    text.split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{}/lock does not start with a pid: {text:?}", vol.display()))
}

pub fn wait_gone(pid: i32) {
    let start = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        // A zombie child of nobody we know: its /proc entry stays until
        // reaped by init; the status says so.
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        if status.contains("State:\tZ") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "daemon {pid} did not die"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn unmount(mnt: &Path) {
    for _ in 0..100 {
        if Command::new("umount").arg(mnt).status().unwrap().success() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = Command::new("umount").arg("-l").arg(mnt).status();
}

pub fn wait_unlocked(vol: &Path) {
    let start = Instant::now();
    while safs::core::volume::VolumeLock::is_held(vol) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "daemon kept the volume lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub struct Mounted {
    pub mnt: PathBuf,
    pub vol: PathBuf,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if Command::new("mountpoint")
            .arg("-q")
            .arg(&self.mnt)
            .status()
            .is_ok_and(|s| s.success())
        {
            unmount(&self.mnt);
            wait_unlocked(&self.vol);
        }
    }
}
