//! Crash loops: a mixed workload runs against a real mount while the daemon
//! is killed with SIGKILL at a random moment; then the volume is mounted
//! again and checked:
//!
//! - it mounts, and after a clean unmount `safs fsck` finds nothing;
//! - its metadata (names, types, modes, hard links, symlink targets,
//!   xattrs) equals the model after *some* operation `k` at or after the
//!   last `fsync`/`fsyncdir` that returned — so everything acknowledged as
//!   durable is there and no operation is half-applied;
//! - every file's contents equal its contents after some operation at or
//!   after `k` (data reaches backing files before the batch recording it).
//!
//! Loops alternate between kernel passthrough and daemon-side I/O.
//! `SAFS_CRASH_LOOPS=N` sets the number of loops (default 6 here; the
//! README's long run uses 200). `SAFS_CRASH_SEED` replays one seed's
//! workload. `SAFS_CRASH_NOKILL=1` runs 3000 operations without a kill and
//! compares the live mount with the model. `SAFS_CRASH_VERBOSE=1` prints
//! refused operations.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn safs() -> Command {
    Command::new(env!("CARGO_BIN_EXE_safs"))
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("spawn");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed: {text}");
    text
}

static OPLOG: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn note(s: String) {
    OPLOG.lock().unwrap().push(s);
}

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
    fn pick<'a, T>(&mut self, v: &'a [T]) -> Option<&'a T> {
        if v.is_empty() {
            None
        } else {
            Some(&v[self.below(v.len() as u64) as usize])
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
    Symlink(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Inode {
    kind: Kind,
    mode: u32,
    xattrs: BTreeMap<String, Vec<u8>>,
    data: Vec<u8>,
}

/// The expected state: paths → inode ids, inode ids → inodes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Model {
    names: BTreeMap<String, u64>,
    inodes: BTreeMap<u64, Inode>,
    next: u64,
}

impl Model {
    fn new() -> Self {
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
    fn add(&mut self, path: &str, inode: Inode) {
        self.inodes.insert(self.next, inode);
        self.names.insert(path.to_string(), self.next);
        self.next += 1;
    }
    fn get(&self, path: &str) -> Option<&Inode> {
        self.names.get(path).and_then(|i| self.inodes.get(i))
    }
    fn get_mut(&mut self, path: &str) -> Option<&mut Inode> {
        let id = *self.names.get(path)?;
        self.inodes.get_mut(&id)
    }
    fn unlink(&mut self, path: &str) {
        if let Some(id) = self.names.remove(path) {
            if !self.names.values().any(|&v| v == id) {
                self.inodes.remove(&id);
            }
        }
    }
    fn children(&self, dir: &str) -> usize {
        let prefix = format!("{dir}/");
        self.names.keys().filter(|p| p.starts_with(&prefix)).count()
    }
    /// Comparable view: per path, (inode group, kind, mode, xattrs).
    fn meta(
        &self,
    ) -> (
        BTreeMap<String, (Kind, u32, BTreeMap<String, Vec<u8>>)>,
        BTreeSet<Vec<String>>,
    ) {
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
fn names() -> Vec<String> {
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

fn err_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// The daemon is gone: every further call fails with one of these.
fn is_dead(errno: i32) -> bool {
    errno == libc::ENOTCONN || errno == libc::ECONNABORTED || errno == libc::EIO
}

enum Outcome {
    Done,
    /// The daemon died during the operation.
    Dead,
    /// The operation was refused (a legal errno for the state).
    Refused,
}

fn setxattr(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
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

fn removexattr(path: &Path, name: &str) -> std::io::Result<()> {
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

fn list_user_xattrs(path: &Path) -> BTreeMap<String, Vec<u8>> {
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
fn step(rng: &mut Rng, mnt: &Path, next: &mut Model, names: &[String]) -> (Outcome, bool) {
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
fn read_tree(mnt: &Path) -> Model {
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

fn daemon_pid(vol: &Path) -> i32 {
    std::fs::read_to_string(vol.join("lock"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn wait_gone(pid: i32) {
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

fn unmount(mnt: &Path) {
    for _ in 0..100 {
        if Command::new("umount").arg(mnt).status().unwrap().success() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = Command::new("umount").arg("-l").arg(mnt).status();
}

fn wait_unlocked(vol: &Path) {
    let start = Instant::now();
    while safs::core::volume::VolumeLock::is_held(vol) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "daemon kept the volume lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Mounted {
    mnt: PathBuf,
    vol: PathBuf,
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

fn one_loop(seed: u64, base: &Path, data_path: &str) {
    let vol = base.join("vol");
    let mnt = base.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    run_ok(safs().args([
        "format",
        vol.to_str().unwrap(),
        "--inline-xattr-bytes",
        "128",
    ]));
    let guard = Mounted {
        mnt: mnt.clone(),
        vol: vol.clone(),
    };
    run_ok(safs().args([
        "mount",
        vol.to_str().unwrap(),
        mnt.to_str().unwrap(),
        "-o",
        data_path,
    ]));
    let mut model = Model::new();
    for d in ["a", "b", "c"] {
        std::fs::create_dir(mnt.join(d)).unwrap();
        std::fs::set_permissions(mnt.join(d), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut rng = Rng(seed | 1);
    let names = names();
    // The kill lands somewhere in the first ~1.5 s of the workload.
    let delay = Duration::from_millis(50 + rng.below(1500));
    let no_kill = std::env::var_os("SAFS_CRASH_NOKILL").is_some();
    let pid = daemon_pid(&vol);
    let stop = Arc::new(AtomicBool::new(false));
    let killer = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            if no_kill {
                return;
            }
            // Raised before the kill, so that every failure the workload
            // sees from the kill on counts as possibly half-done.
            stop.store(true, Ordering::SeqCst);
            // SAFETY: plain kill(2) of the daemon we started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        })
    };
    OPLOG.lock().unwrap().clear();
    let mut snapshots = vec![model.clone()];
    let mut durable = 0usize;
    let inflight: Model;
    let start = Instant::now();
    loop {
        let mut next = model.clone();
        match step(&mut rng, &mnt, &mut next, &names) {
            (Outcome::Done, d) => {
                model = next;
                snapshots.push(model.clone());
                if d {
                    durable = snapshots.len() - 1;
                }
            }
            (Outcome::Refused, _) if stop.load(Ordering::SeqCst) => {
                // After the kill a failure may hide a half-done step (a
                // write that reached the backing file before its fsync
                // failed): treat it as in flight.
                inflight = next;
                break;
            }
            (Outcome::Refused, _) => {}
            (Outcome::Dead, _) => {
                inflight = next;
                break;
            }
        }
        if no_kill && snapshots.len() > 3000 {
            let got = read_tree(&mnt);
            let want = snapshots.last().unwrap();
            for (p, id) in &want.names {
                let w = &want.inodes[id];
                let g = got.get(p).expect("path missing");
                if w.data != g.data {
                    let diff: Vec<usize> = (0..w.data.len().min(g.data.len()))
                        .filter(|&x| w.data[x] != g.data[x])
                        .collect();
                    panic!(
                        "no-kill: {p} differs: len {} vs {}, diff {:?}..{:?}",
                        w.data.len(),
                        g.data.len(),
                        diff.first(),
                        diff.last()
                    );
                }
            }
            assert_eq!(got.meta(), want.meta());
            eprintln!("no-kill run matched the model");
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "workload never saw the daemon die"
        );
    }
    killer.join().unwrap();
    wait_gone(pid);
    snapshots.push(inflight);
    unmount(&mnt);
    wait_unlocked(&vol);

    run_ok(safs().args(["mount", vol.to_str().unwrap(), mnt.to_str().unwrap()]));
    let got = read_tree(&mnt);
    let (got_meta, got_groups) = got.meta();
    let candidates = &snapshots[durable..];
    let k = candidates
        .iter()
        .position(|m| m.meta() == (got_meta.clone(), got_groups.clone()));
    let Some(k) = k else {
        let last = snapshots.last().unwrap().meta();
        let durable_meta = snapshots[durable].meta();
        panic!(
            "seed {seed}: recovered metadata matches no state from the last durable point ({durable} of {} ops)\n\
             recovered: {got_meta:#?}\nlast durable: {:#?}\nlast: {:#?}",
            snapshots.len() - 1,
            durable_meta.0,
            last.0
        );
    };
    // Contents: equal to the file's contents in some state at or after k.
    for (path, id) in &got.names {
        let inode = &got.inodes[id];
        if inode.kind != Kind::File {
            continue;
        }
        // Same inode (model ids are stable across states), wherever later
        // states moved it: data is not tied to the batch that renames it.
        let id = candidates[k].names[path];
        let ok = candidates[k..]
            .iter()
            .any(|m| m.inodes.get(&id).is_some_and(|i| i.data == inode.data));
        if !ok {
            let lens: Vec<String> = snapshots
                .iter()
                .enumerate()
                .map(|(j, m)| {
                    format!(
                        "{j}:{:?}",
                        m.get(path)
                            .map(|i| (i.data.len(), i.data.iter().rposition(|&b| b != 0)))
                    )
                })
                .collect();
            let ino = std::fs::symlink_metadata(mnt.join(path))
                .map(|m| m.ino())
                .unwrap_or(0);
            let backing = vol.join(format!("data/{:02x}/{ino:016x}", ino & 0xff));
            eprintln!(
                "ino {ino} backing {:?}",
                std::fs::metadata(&backing).map(|m| (m.len(), m.ino(), m.mtime(), m.ctime()))
            );
            let log = OPLOG.lock().unwrap();
            for l in &log[log.len().saturating_sub(60)..] {
                eprintln!("op: {l}");
            }
            drop(log);
            for l in std::fs::read_to_string(vol.join("safs.log"))
                .unwrap_or_default()
                .lines()
            {
                if l.contains("recover")
                    || l.contains("reclaim")
                    || l.contains("WARN")
                    || l.contains("ERROR")
                {
                    eprintln!("log: {l}");
                }
            }
            for (j, m) in snapshots.iter().enumerate().rev().take(3) {
                if let Some(i) = m.get(path) {
                    let diff: Vec<usize> = (0..i.data.len().min(inode.data.len()))
                        .filter(|&x| i.data[x] != inode.data[x])
                        .collect();
                    eprintln!(
                        "state {j}: first diff {:?} last diff {:?} ({} bytes differ); model byte there {:?}, recovered {:?}",
                        diff.first(),
                        diff.last(),
                        diff.len(),
                        diff.first().map(|&x| i.data[x]),
                        diff.first().map(|&x| inode.data[x])
                    );
                }
            }
            panic!(
                "seed {seed}: {path} holds contents ({} bytes, last nonzero {:?}) of no state at or after op {} (durable {durable}); history: {}",
                inode.data.len(),
                inode.data.iter().rposition(|&b| b != 0),
                durable + k,
                lens[lens.len().saturating_sub(40)..].join(" ")
            );
        }
    }
    unmount(&mnt);
    wait_unlocked(&vol);
    drop(guard);
    let out = safs()
        .args(["fsck", vol.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "seed {seed}: fsck after recovery: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn kill_9_at_random_moments_loses_nothing_acknowledged() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: these tests mount a real FUSE filesystem"
    );
    let loops: u64 = std::env::var("SAFS_CRASH_LOOPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let seeds: Vec<u64> = match std::env::var("SAFS_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(s) => vec![s],
        None => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
            (0..loops)
                .map(|i| {
                    t.wrapping_mul(6364136223846793005)
                        .wrapping_add(i.wrapping_mul(1442695040888963407))
                })
                .collect()
        }
    };
    for (i, seed) in seeds.iter().enumerate() {
        let tmp = tempfile::Builder::new()
            .prefix("safs-crash")
            .tempdir_in("/tmp")
            .unwrap();
        // Both data paths: kernel passthrough and daemon-side I/O.
        let data_path = if i % 2 == 0 {
            "passthrough"
        } else {
            "nopassthrough"
        };
        eprintln!(
            "crash loop {}/{} seed {seed} ({data_path})",
            i + 1,
            seeds.len()
        );
        one_loop(*seed, tmp.path(), data_path);
    }
}
