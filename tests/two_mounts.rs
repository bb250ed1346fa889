//! Two daemons serving one PostgreSQL volume at once (two mountpoints, on a
//! real, private cluster): each sees the other's changes, random operations
//! through both give what one model gives, racing operations lose no update
//! and make no cycle, when one daemon is killed the other goes on and
//! reclaims what it held, and crash loops that kill one of the two in the
//! middle of its changes lose nothing synced. `fsck` is clean after each.
//! The model walk runs again through two nodes of a volume whose contents
//! are in an object store (the run's S3 server), each with its own cache.

mod common;
mod store;

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::*;
use nix::errno::Errno;
use safs::meta::postgres::cluster::TempCluster;

/// How long a change on one mount may take to show on the other before a
/// test calls it lost (the target is milliseconds; this only bounds a hang).
const VISIBLE: Duration = Duration::from_secs(5);

/// One daemon serving the volume on `mnt`; unmounted on drop.
struct Mount {
    vol: PathBuf,
    mnt: PathBuf,
    mounted: bool,
}

impl Mount {
    #[track_caller]
    fn new(vol: &Path, mnt: &Path) -> Mount {
        std::fs::create_dir_all(mnt).unwrap();
        let out = safs(["mount".as_ref(), vol.as_os_str(), mnt.as_os_str()]);
        out.assert_success(&format!("safs mount {} {}", vol.display(), mnt.display()));
        Mount {
            vol: vol.to_path_buf(),
            mnt: mnt.to_path_buf(),
            mounted: true,
        }
    }

    fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.mnt.join(rel)
    }

    fn pid(&self) -> nix::unistd::Pid {
        daemon_pid_at(&self.vol, &self.mnt)
    }

    /// `umount`, then waits until the daemon has exited.
    #[track_caller]
    fn unmount(&mut self) {
        let pid = self.pid();
        umount_once_released(&self.mnt).assert_success("umount");
        self.mounted = false;
        assert!(
            wait_until(Duration::from_secs(60), || !process_alive(pid)),
            "the daemon of {} did not exit",
            self.mnt.display()
        );
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted && is_fuse_mounted(&self.mnt) {
            let _ = run_cmd(Command::new("umount").arg("-l").arg(&self.mnt));
            // The daemon commits and leaves; give it a moment.
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// Two mounts of one fresh volume on its own cluster. Fields drop in
/// order: the mounts, then the volume's directory, then the cluster.
struct Two {
    a: Mount,
    b: Mount,
    v: TestVolume,
    _cluster: TempCluster,
    _dir: tempfile::TempDir,
}

fn two_mounts() -> Two {
    let dir = tempfile::tempdir().unwrap();
    let cluster = TempCluster::start(dir.path()).unwrap();
    cluster.create_database("vol").unwrap();
    let v = TestVolume::formatted(&["--meta", &cluster.conninfo("vol")]);
    let a = Mount::new(v.vol(), v.mnt());
    let b = Mount::new(v.vol(), &v.root().join("mnt2"));
    Two {
        a,
        b,
        v,
        _cluster: cluster,
        _dir: dir,
    }
}

/// Two nodes of one fresh volume whose contents are in the run's object
/// store: the volume's own directory, and one `safs attach` made in a
/// directory of its own (a cache of its own), on one cluster.
fn two_nodes() -> Two {
    CHILD_ENV.get_or_init(store::env);
    let dir = tempfile::tempdir().unwrap();
    let cluster = TempCluster::start(dir.path()).unwrap();
    cluster.create_database("vol").unwrap();
    let conninfo = cluster.conninfo("vol");
    let v = TestVolume::formatted(&["--meta", &conninfo, "--data", &store::bucket("nodes")]);
    let node_b = dir.path().join("node-b");
    safs(["attach", node_b.to_str().unwrap(), "--meta", &conninfo]).assert_success("safs attach");
    let a = Mount::new(v.vol(), v.mnt());
    let b = Mount::new(&node_b, &v.root().join("mnt2"));
    Two {
        a,
        b,
        v,
        _cluster: cluster,
        _dir: dir,
    }
}

impl Two {
    /// Commits A's changes, kills A's daemon with SIGKILL and waits until B
    /// has buried its session (what A held reclaimed).
    #[track_caller]
    fn sync_kill_a_and_wait_for_burial(&mut self) {
        let pid = self.a.pid();
        run_cmd(
            Command::new(env!("CARGO_BIN_EXE_safs")).args(["sync", self.a.mnt.to_str().unwrap()]),
        )
        .assert_success("safs sync");
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
        let _ = run_cmd(Command::new("umount").arg("-l").arg(&self.a.mnt));
        self.a.mounted = false;
        assert!(wait_until(Duration::from_secs(10), || !process_alive(pid)));
        let vol = self.v.vol().to_path_buf();
        assert!(
            wait_until(Duration::from_secs(30), || {
                !safs(["info", vol.to_str().unwrap()])
                    .stdout
                    .contains("(gone")
            }),
            "the killed daemon's session is not reclaimed"
        );
    }

    /// Unmounts both and checks the volume at once: fsck waits for the
    /// daemons finishing their last commits (as after `umount; fsck` on
    /// one machine), then must find it clean.
    #[track_caller]
    fn unmount_and_fsck(&mut self) {
        let daemons: Vec<_> = [&self.a, &self.b]
            .iter()
            .map(|m| daemon_pid_at(&m.vol, &m.mnt))
            .collect();
        for m in [&mut self.a, &mut self.b] {
            umount_once_released(&m.mnt).assert_success("umount");
            m.mounted = false;
        }
        // umount returns once the kernel lets go; each daemon then uploads,
        // commits and ends its session, and fsck refuses a volume with a
        // live session (the CI run at fb9deae met one still ending).
        for pid in daemons {
            assert!(
                wait_until(Duration::from_secs(60), || !process_alive(pid)),
                "daemon {pid} still running a minute after its unmount"
            );
        }
        let out = safs(["fsck", self.v.vol().to_str().unwrap()]);
        out.assert_success("safs fsck after two mounts");
        assert!(out.stdout.contains("clean"), "{}", out.stdout);
    }
}

#[test]
fn each_mount_sees_the_others_changes_and_fsck_waits_for_both() {
    let mut t = two_mounts();
    let (a, b) = (&t.a, &t.b);
    // Looked up (absent) on B first: a cached negative entry must not hide
    // A's create.
    assert!(!b.path("f").exists());
    write_file(&a.path("f"), b"from a");
    assert!(
        wait_until(VISIBLE, || std::fs::read(b.path("f")).ok().as_deref()
            == Some(&b"from a"[..])),
        "B does not see A's file"
    );
    setxattr(&a.path("f"), "user.k", b"1", 0).unwrap();
    assert!(wait_until(VISIBLE, || getxattr(&b.path("f"), "user.k")
        .ok()
        == Some(b"1".to_vec())));
    std::fs::create_dir(b.path("d")).unwrap();
    std::fs::rename(b.path("f"), b.path("d/g")).unwrap();
    assert!(wait_until(VISIBLE, || list_dir(&a.mnt) == ["d"]
        && list_dir(&a.path("d")) == ["g"]));
    assert_eq!(getxattr(&a.path("d/g"), "user.k").unwrap(), b"1");
    std::fs::remove_file(a.path("d/g")).unwrap();
    assert!(wait_until(VISIBLE, || list_dir(&b.path("d")).is_empty()));

    // Both daemons are listed; what needs the volume alone waits for them.
    let vol = t.v.vol().to_str().unwrap().to_string();
    let (pa, pb) = (a.pid(), b.pid());
    assert_ne!(pa, pb);
    let out = safs(["fsck", &vol]);
    out.assert_failure_with_message("fsck of a mounted volume");
    assert!(
        out.stderr.contains("mounted on") || out.stderr.contains("in use"),
        "{}",
        out.stderr
    );
    let info = safs(["info", t.b.mnt.to_str().unwrap()]);
    info.assert_success("safs info");
    assert_eq!(live_sessions(t.v.vol()).len(), 2, "{}", info.stdout);
    assert!(
        info.stdout.contains("mounted:        yes"),
        "{}",
        info.stdout
    );
    t.unmount_and_fsck();
}

// ---- a model checker ------------------------------------------------------

/// What one node of the model is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    Dir,
    /// A regular file: its identity (hard links share it).
    File(u32),
}

/// The namespace as POSIX says it must be, with each file's xattr value
/// and contents.
#[derive(Default)]
struct Model {
    nodes: BTreeMap<String, Node>,
    xattr: HashMap<u32, Vec<u8>>,
    data: HashMap<u32, Vec<u8>>,
    next: u32,
}

/// What a walk finds: path → (kind, nlink, xattr `user.v`, contents'
/// length and FNV-1a hash).
type Seen = BTreeMap<String, (char, u64, Option<Vec<u8>>, (usize, u64))>;

fn digest(data: &[u8]) -> (usize, u64) {
    let h = data.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (data.len(), h)
}

/// The contents `Op::Write(_, len, seed)` writes.
fn contents(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + seed) as u8).collect()
}

impl Model {
    /// ENOENT or ENOTDIR if a directory on the way to `p` is missing or
    /// is a file.
    fn walk(&self, p: &str) -> Result<(), Errno> {
        let mut at = String::new();
        let comps: Vec<&str> = p.split('/').collect();
        for c in &comps[..comps.len() - 1] {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(c);
            match self.nodes.get(&at) {
                None => return Err(Errno::ENOENT),
                Some(Node::File(_)) => return Err(Errno::ENOTDIR),
                Some(Node::Dir) => {}
            }
        }
        Ok(())
    }

    fn children(&self, p: &str) -> usize {
        let prefix = format!("{p}/");
        self.nodes
            .keys()
            .filter(|k| k.starts_with(&prefix) && !k[prefix.len()..].contains('/'))
            .count()
    }

    fn nlink(&self, id: u32) -> usize {
        self.nodes
            .values()
            .filter(|n| **n == Node::File(id))
            .count()
    }

    fn apply(&mut self, op: &Op) -> Result<(), Errno> {
        match op {
            Op::Create(p) | Op::Mkdir(p) => {
                self.walk(p)?;
                if self.nodes.contains_key(p) {
                    return Err(Errno::EEXIST);
                }
                let node = if matches!(op, Op::Mkdir(_)) {
                    Node::Dir
                } else {
                    self.next += 1;
                    Node::File(self.next)
                };
                self.nodes.insert(p.clone(), node);
            }
            Op::Unlink(p) => {
                self.walk(p)?;
                match self.nodes.get(p) {
                    None => return Err(Errno::ENOENT),
                    Some(Node::Dir) => return Err(Errno::EISDIR),
                    Some(Node::File(_)) => {
                        self.nodes.remove(p);
                    }
                }
            }
            Op::Rmdir(p) => {
                self.walk(p)?;
                match self.nodes.get(p) {
                    None => return Err(Errno::ENOENT),
                    Some(Node::File(_)) => return Err(Errno::ENOTDIR),
                    Some(Node::Dir) if self.children(p) > 0 => return Err(Errno::ENOTEMPTY),
                    Some(Node::Dir) => {
                        self.nodes.remove(p);
                    }
                }
            }
            Op::Link(p, q) => {
                // link(2) resolves the old name whole before the new one's
                // directory (rename(2) both directories first).
                self.walk(p)?;
                let node = self.nodes.get(p).ok_or(Errno::ENOENT)?.clone();
                self.walk(q)?;
                if self.nodes.contains_key(q) {
                    return Err(Errno::EEXIST);
                }
                if node == Node::Dir {
                    return Err(Errno::EPERM);
                }
                self.nodes.insert(q.clone(), node);
            }
            Op::SetXattr(p, v) => {
                self.walk(p)?;
                match self.nodes.get(p) {
                    None => return Err(Errno::ENOENT),
                    Some(Node::Dir) => {}
                    Some(Node::File(id)) => {
                        self.xattr.insert(*id, v.clone());
                    }
                }
            }
            Op::Write(p, len, seed) => {
                self.walk(p)?;
                match self.nodes.get(p) {
                    None => return Err(Errno::ENOENT),
                    Some(Node::Dir) => return Err(Errno::EISDIR),
                    Some(Node::File(id)) => {
                        self.data.insert(*id, contents(*len, *seed));
                    }
                }
            }
            Op::Rename(p, q) => {
                self.walk(p)?;
                self.walk(q)?;
                let src = self.nodes.get(p).ok_or(Errno::ENOENT)?.clone();
                if p == q {
                    return Ok(());
                }
                // The source is an ancestor of the target's directory.
                if q.starts_with(&format!("{p}/")) {
                    return Err(Errno::EINVAL);
                }
                if let Some(dst) = self.nodes.get(q).cloned() {
                    // The target is an ancestor of the source.
                    if p.starts_with(&format!("{q}/")) {
                        return Err(Errno::ENOTEMPTY);
                    }
                    match (&src, &dst) {
                        (Node::Dir, Node::File(_)) => return Err(Errno::ENOTDIR),
                        (Node::File(_), Node::Dir) => return Err(Errno::EISDIR),
                        (Node::Dir, Node::Dir) if self.children(q) > 0 => {
                            return Err(Errno::ENOTEMPTY);
                        }
                        // Two links of one file: nothing happens.
                        (Node::File(x), Node::File(y)) if x == y => return Ok(()),
                        _ => {}
                    }
                }
                let prefix = format!("{p}/");
                let moved: Vec<(String, Node)> = self
                    .nodes
                    .iter()
                    .filter(|(k, _)| *k == p || k.starts_with(&prefix))
                    .map(|(k, n)| (k.clone(), n.clone()))
                    .collect();
                for (k, _) in &moved {
                    self.nodes.remove(k);
                }
                for (k, n) in moved {
                    self.nodes.insert(format!("{q}{}", &k[p.len()..]), n);
                }
            }
        }
        Ok(())
    }

    /// What a walk of a mount must find.
    fn expected(&self) -> Seen {
        self.nodes
            .iter()
            .map(|(k, n)| {
                let v = match n {
                    Node::Dir => ('d', 0, None, (0, 0)),
                    Node::File(id) => (
                        'f',
                        self.nlink(*id) as u64,
                        self.xattr.get(id).cloned(),
                        digest(self.data.get(id).map_or(&[][..], |d| d)),
                    ),
                };
                (k.clone(), v)
            })
            .collect()
    }
}

#[derive(Clone, Debug)]
enum Op {
    Create(String),
    Mkdir(String),
    Unlink(String),
    Rmdir(String),
    Link(String, String),
    Rename(String, String),
    SetXattr(String, Vec<u8>),
    /// Replaces a file's contents (open O_TRUNC, write, close): length
    /// and seed of `contents`.
    Write(String, usize, usize),
}

fn run_op(root: &Path, op: &Op) -> Result<(), Errno> {
    let at = |p: &String| root.join(p);
    let r = match op {
        Op::Create(p) => std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(at(p))
            .map(drop),
        Op::Mkdir(p) => std::fs::create_dir(at(p)),
        Op::Unlink(p) => std::fs::remove_file(at(p)),
        Op::Rmdir(p) => std::fs::remove_dir(at(p)),
        Op::Link(p, q) => std::fs::hard_link(at(p), at(q)),
        Op::Rename(p, q) => std::fs::rename(at(p), at(q)),
        Op::SetXattr(p, v) => return setxattr(&at(p), "user.v", v, 0),
        Op::Write(p, len, seed) => std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(at(p))
            .and_then(|mut f| std::io::Write::write_all(&mut f, &contents(*len, *seed))),
    };
    r.map_err(errno_of)
}

/// A walk of a mount, in the model's terms (directories' nlink left out:
/// the model does not count subdirectories).
fn walk(root: &Path) -> Seen {
    fn go(root: &Path, rel: &str, out: &mut Seen) {
        let dir = if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(rel)
        };
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let rel = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let Ok(m) = std::fs::symlink_metadata(root.join(&rel)) else {
                continue;
            };
            if m.is_dir() {
                out.insert(rel.clone(), ('d', 0, None, (0, 0)));
                go(root, &rel, out);
            } else {
                let x = getxattr(&root.join(&rel), "user.v").ok();
                let data = std::fs::read(root.join(&rel)).unwrap_or_default();
                out.insert(rel, ('f', m.nlink(), x, digest(&data)));
            }
        }
    }
    let mut out = BTreeMap::new();
    go(root, "", &mut out);
    out
}

#[test]
fn random_operations_through_two_mounts_give_what_one_model_gives() {
    model_walk(two_mounts());
}

/// The same through two nodes of a volume whose contents are in an object
/// store: the second one attached in a directory of its own (its own
/// cache), so every file one writes the other fetches from the store.
#[test]
fn random_operations_through_two_nodes_of_an_object_store_volume_give_one_models() {
    model_walk(two_nodes());
}

/// 300 random operations, alternately through each mount; after each,
/// both show the model.
fn model_walk(mut t: Two) {
    let paths = [
        "a", "b", "a/x", "a/y", "b/x", "b/y", "a/x/z", "b/y/z", "a/z", "b/z", "c",
    ];
    let mut rng = 0x5eed_u64;
    let mut next = |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    let mut model = Model::default();
    let (mut failures, mut writes) = (0, 0);
    for step in 0..300 {
        let p = paths[next(paths.len())].to_string();
        let q = paths[next(paths.len())].to_string();
        let op = match next(11) {
            0 | 1 => Op::Mkdir(p),
            2 | 3 => Op::Create(p),
            4 => Op::Unlink(p),
            5 => Op::Rmdir(p),
            6 => Op::Link(p, q),
            7 | 8 => Op::Rename(p, q),
            9 => Op::SetXattr(p, format!("v{step}").into_bytes()),
            // Sizes from empty past the 16 KiB a record holds inline to
            // a few blocks' worth of pages.
            _ => Op::Write(p, (step * 7919) % 200_000, step),
        };
        let (mine, other) = if step % 2 == 0 {
            (&t.a, &t.b)
        } else {
            (&t.b, &t.a)
        };
        let want = model.apply(&op);
        let got = run_op(&mine.mnt, &op);
        assert_eq!(got, want, "step {step}: {op:?} on {}", mine.mnt.display());
        failures += usize::from(got.is_err());
        writes += usize::from(got.is_ok() && matches!(op, Op::Write(..)));
        // Both mounts show the model before the next step (the other one
        // within moments: its caches are told).
        let expected = model.expected();
        assert_eq!(walk(&mine.mnt), expected, "step {step}: {op:?}, same mount");
        assert!(
            wait_until(VISIBLE, || walk(&other.mnt) == expected),
            "step {step}: {op:?}: the other mount shows {:?}, the model {expected:?}",
            walk(&other.mnt)
        );
    }
    assert!(
        (30..270).contains(&failures),
        "the walk should mix successes and refusals: {failures} of 300 failed"
    );
    assert!(writes >= 5, "only {writes} writes reached a file");
    t.unmount_and_fsck();
}

// ---- races ------------------------------------------------------------------

#[test]
fn racing_mounts_lose_no_update_and_make_no_cycle() {
    let mut t = two_mounts();
    // Links of one file from both mounts at once: nlink counts every one.
    write_file(&t.a.path("f"), b"x");
    assert!(wait_until(VISIBLE, || t.b.path("f").exists()));
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = [(t.a.mnt.clone(), "la"), (t.b.mnt.clone(), "lb")]
        .into_iter()
        .map(|(m, prefix)| {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                for i in 0..100 {
                    std::fs::hard_link(m.join("f"), m.join(format!("{prefix}{i}"))).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    for m in [&t.a, &t.b] {
        assert!(
            wait_until(VISIBLE, || meta(&m.path("f")).nlink() == 201),
            "nlink on {}: {}",
            m.mnt.display(),
            meta(&m.path("f")).nlink()
        );
    }

    // Two directories moved into each other from both mounts at once: at
    // most one move happens, never a cycle.
    for r in 0..15 {
        let (p, q) = (format!("p{r}"), format!("q{r}"));
        std::fs::create_dir(t.a.path(&p)).unwrap();
        std::fs::create_dir(t.a.path(&q)).unwrap();
        assert!(wait_until(VISIBLE, || t.b.path(&q).exists()));
        let barrier = Arc::new(Barrier::new(2));
        let moves = [
            (t.a.mnt.clone(), p.clone(), format!("{q}/{p}")),
            (t.b.mnt.clone(), q.clone(), format!("{p}/{q}")),
        ];
        let handles: Vec<_> = moves
            .into_iter()
            .map(|(m, from, to)| {
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    barrier.wait();
                    std::fs::rename(m.join(from), m.join(to)).map_err(errno_of)
                })
            })
            .collect();
        let res: Vec<Result<(), Errno>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(
            res.iter().any(Result::is_err),
            "round {r}: both moves succeeded: a cycle"
        );
        for e in res.iter().filter_map(|r| r.as_ref().err()) {
            assert!([Errno::EINVAL, Errno::ENOENT].contains(e), "round {r}: {e}");
        }
        let into_q = t.a.path(format!("{q}/{p}"));
        let into_p = t.a.path(format!("{p}/{q}"));
        assert!(wait_until(VISIBLE, || {
            let moved = usize::from(into_q.exists()) + usize::from(into_p.exists());
            moved == res.iter().filter(|r| r.is_ok()).count()
        }));
    }

    // Random renames, links, unlinks and creates in shared directories,
    // two threads per mount.
    for d in ["d0", "d1", "d2"] {
        std::fs::create_dir(t.a.path(d)).unwrap();
    }
    assert!(wait_until(VISIBLE, || t.b.path("d2").exists()));
    let handles: Vec<_> = (0..4u64)
        .map(|k| {
            let m = if k % 2 == 0 {
                t.a.mnt.clone()
            } else {
                t.b.mnt.clone()
            };
            std::thread::spawn(move || {
                let mut rng = 0x9e37_79b9_7f4a_7c15_u64 ^ (k + 1);
                let mut next = |n: u64| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng % n
                };
                for _ in 0..600 {
                    let p = m.join(format!("d{}/f{}", next(3), next(12)));
                    let q = m.join(format!("d{}/f{}", next(3), next(12)));
                    let _ = match next(5) {
                        0 => std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(&p)
                            .map(drop),
                        1 => std::fs::rename(&p, &q),
                        2 => std::fs::hard_link(&p, &q),
                        3 => std::fs::remove_file(&p),
                        _ => setxattr(&p, "user.n", b"1", 0).map_err(|e| e.into()),
                    };
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // Both mounts agree, and every file's link count is its number of
    // names.
    assert!(
        wait_until(VISIBLE, || walk(&t.a.mnt) == walk(&t.b.mnt)),
        "the mounts disagree after the race"
    );
    let mut names: HashMap<u64, (u64, u64)> = HashMap::new();
    for d in ["d0", "d1", "d2"] {
        for e in std::fs::read_dir(t.a.path(d)).unwrap().flatten() {
            let m = e.metadata().unwrap();
            let n = names.entry(m.ino()).or_insert((0, m.nlink()));
            n.0 += 1;
        }
    }
    for (ino, (found, nlink)) in names {
        assert_eq!(found, nlink, "inode {ino}: {found} names, nlink {nlink}");
    }
    t.unmount_and_fsck();
}

#[test]
fn a_killed_daemon_leaves_the_other_serving_and_what_it_held_is_reclaimed() {
    let mut t = two_mounts();
    let vol = t.v.vol().to_path_buf();
    let inodes = |vol: &Path| -> u64 {
        let out = safs(["info", vol.to_str().unwrap()]);
        let line = out
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("inodes:"))
            .unwrap_or_else(|| panic!("{}", out.stdout))
            .trim()
            .to_string();
        line.split_whitespace().next().unwrap().parse().unwrap()
    };
    write_file(&t.a.path("kept"), b"synced");
    std::fs::File::open(t.a.path("kept"))
        .unwrap()
        .sync_all()
        .unwrap();
    // Open on A, then unlinked: A's daemon holds it until it closes.
    let held = std::fs::File::open(t.a.path("kept")).unwrap();
    std::fs::hard_link(t.a.path("kept"), t.a.path("other-name")).unwrap();
    write_file(&t.a.path("held"), b"open");
    let open = std::fs::File::open(t.a.path("held")).unwrap();
    std::fs::remove_file(t.a.path("held")).unwrap();
    run_cmd(Command::new(env!("CARGO_BIN_EXE_safs")).args(["sync", t.a.mnt.to_str().unwrap()]))
        .assert_success("safs sync");
    let before = inodes(&vol);

    let pid = t.a.pid();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    drop(open);
    drop(held);
    let _ = run_cmd(Command::new("umount").arg("-l").arg(&t.a.mnt));
    t.a.mounted = false;
    assert!(wait_until(Duration::from_secs(10), || !process_alive(pid)));

    // B goes on, and reclaims the file A held open (its session is gone).
    write_file(&t.b.path("after"), b"b");
    assert_eq!(std::fs::read(t.b.path("kept")).unwrap(), b"synced");
    assert!(
        wait_until(Duration::from_secs(30), || {
            let out = safs(["info", vol.to_str().unwrap()]);
            !out.stdout.contains("(gone") && inodes(&vol) == before
        }),
        "the dead daemon's session and its open-unlinked file are not reclaimed: {}",
        safs(["info", vol.to_str().unwrap()]).stdout
    );
    t.b.unmount();
    let out = safs(["fsck", vol.to_str().unwrap()]);
    out.assert_success("fsck after a killed daemon");
    assert!(out.stdout.contains("clean"), "{}", out.stdout);
}

/// Each daemon takes inode numbers from a block of its own (no write of
/// the volume's counters per create, so creates on two mounts do not
/// rewrite one record): numbers never collide, both mounts count the same
/// inodes in use, and when one daemon is killed the survivor folds its
/// share of the count into the volume's, with nothing counted twice.
#[test]
fn inode_numbers_come_from_each_mounts_block_and_both_count_the_same() {
    let mut t = two_mounts();
    let vol = t.v.vol().to_path_buf();
    let used = |m: &Mount| {
        let s = nix::sys::statvfs::statvfs(&m.mnt).unwrap();
        s.files() - s.files_free()
    };
    let base = used(&t.a);
    let mut inos = std::collections::BTreeSet::new();
    for i in 0..40 {
        for (m, tag) in [(&t.a, "a"), (&t.b, "b")] {
            let p = m.path(format!("{tag}{i}"));
            write_file(&p, tag.as_bytes());
            assert!(
                inos.insert(std::fs::metadata(&p).unwrap().ino()),
                "{} reused an inode number",
                p.display()
            );
        }
    }
    let (first_a, first_b) = (
        std::fs::metadata(t.a.path("a0")).unwrap().ino(),
        std::fs::metadata(t.b.path("b0")).unwrap().ino(),
    );
    assert!(
        first_a.abs_diff(first_b) >= 40,
        "the mounts took numbers from one run ({first_a}, {first_b})"
    );
    for m in [&t.a, &t.b] {
        assert!(
            wait_until(VISIBLE, || used(m) == base + 80),
            "{}: {} inodes in use, not {}",
            m.mnt.display(),
            used(m),
            base + 80
        );
    }
    // A's files removed through B: A's share goes up, B's down.
    for i in 0..10 {
        std::fs::remove_file(t.b.path(format!("a{i}"))).unwrap();
    }
    assert!(wait_until(VISIBLE, || used(&t.a) == base + 70));
    // B buries A's session and takes its share into the volume's count.
    t.sync_kill_a_and_wait_for_burial();
    assert_eq!(used(&t.b), base + 70);
    write_file(&t.b.path("after"), b"b");
    assert!(inos.insert(std::fs::metadata(t.b.path("after")).unwrap().ino()));
    assert_eq!(used(&t.b), base + 71);
    t.a = Mount::new(&vol, &t.a.mnt.clone());
    write_file(&t.a.path("again"), b"a");
    assert!(
        inos.insert(std::fs::metadata(t.a.path("again")).unwrap().ino()),
        "a number of the killed daemon's block was used again"
    );
    assert!(wait_until(VISIBLE, || used(&t.a) == base + 72
        && used(&t.b) == base + 72));
    t.unmount_and_fsck();
}

/// Both daemons killed, one holding a file unlinked while open: `safs
/// fsck` before any remount lists what recovery will do and exits 0, and
/// the volume mounts with everything synced.
#[test]
fn fsck_after_both_daemons_were_killed_exits_0() {
    let mut t = two_mounts();
    let vol = t.v.vol().to_path_buf();
    write_file(&t.a.path("kept"), b"synced");
    write_file(&t.b.path("held"), b"open");
    let open = std::fs::File::open(t.b.path("held")).unwrap();
    std::fs::remove_file(t.b.path("held")).unwrap();
    for m in [&t.a, &t.b] {
        run_cmd(Command::new(env!("CARGO_BIN_EXE_safs")).args(["sync", m.mnt.to_str().unwrap()]))
            .assert_success("safs sync");
    }
    for m in [&mut t.a, &mut t.b] {
        let pid = m.pid();
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
        assert!(wait_until(Duration::from_secs(10), || !process_alive(pid)));
        let _ = run_cmd(Command::new("umount").arg("-l").arg(&m.mnt));
        m.mounted = false;
    }
    drop(open);
    let out = safs(["fsck", vol.to_str().unwrap()]);
    out.assert_success("fsck after both daemons were killed");
    assert!(
        out.stdout.contains("leftover: inode") && !out.stdout.contains("ERROR"),
        "{}",
        out.stdout
    );
    t.a = Mount::new(&vol, &t.a.mnt.clone());
    t.b = Mount::new(&vol, &t.b.mnt.clone());
    assert_eq!(std::fs::read(t.b.path("kept")).unwrap(), b"synced");
    assert!(!t.a.path("held").exists());
    t.unmount_and_fsck();
}

#[test]
fn crash_loops_with_one_of_two_daemons_killed_lose_nothing_synced() {
    let mut t = two_mounts();
    let vol = t.v.vol().to_path_buf();
    // (name, contents, xattr value) of every file synced so far.
    let mut synced: Vec<(String, Vec<u8>, Vec<u8>)> = Vec::new();
    for round in 0..4 {
        for (k, m) in [&t.a, &t.b].into_iter().enumerate() {
            for i in 0..15 {
                let name = format!("r{round}-m{k}-{i}");
                let data = pattern(round * 100 + i, 3000 + i as usize);
                let x = format!("x{round}.{k}.{i}").into_bytes();
                write_file(&m.path(&name), &data);
                setxattr(&m.path(&name), "user.x", &x, 0).unwrap();
                std::fs::File::open(m.path(&name))
                    .unwrap()
                    .sync_all()
                    .unwrap();
                synced.push((name, data, x));
            }
        }
        // The victim dies in the middle of unsynced changes of its own.
        let victim = if round % 2 == 0 { &mut t.a } else { &mut t.b };
        let pid = victim.pid();
        let noise = {
            let mnt = victim.mnt.clone();
            std::thread::spawn(move || {
                for i in 0..10_000 {
                    let p = mnt.join(format!("noise-{round}-{i}"));
                    if std::fs::write(&p, b"n").is_err() {
                        break;
                    }
                    let _ = std::fs::rename(&p, mnt.join(format!("noise-{round}-{i}-moved")));
                }
            })
        };
        std::thread::sleep(Duration::from_millis(30 + 20 * round));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
        noise.join().unwrap();
        let _ = run_cmd(Command::new("umount").arg("-l").arg(&victim.mnt));
        victim.mounted = false;
        assert!(wait_until(Duration::from_secs(10), || !process_alive(pid)));
        let mnt = victim.mnt.clone();
        *victim = Mount::new(&vol, &mnt);
        // Everything synced is there through both mounts.
        for m in [&t.a, &t.b] {
            for (name, data, x) in &synced {
                assert!(
                    wait_until(VISIBLE, || m.path(name).exists()),
                    "round {round}: {name} missing on {}",
                    m.mnt.display()
                );
                assert_eq!(&read_file(&m.path(name)), data, "round {round}: {name}");
                assert_eq!(&getxattr(&m.path(name), "user.x").unwrap(), x);
            }
        }
    }
    t.unmount_and_fsck();
}

/// `fcntl` lock command `cmd` (F_SETLK, F_SETLKW, F_GETLK, F_OFD_*) of
/// kind `typ` over `len` bytes at `start` (0: to the end) through `f`;
/// the lock F_GETLK reports.
fn lk(f: &std::fs::File, cmd: i32, typ: i32, start: i64, len: i64) -> Result<libc::flock, Errno> {
    use std::os::fd::AsRawFd;
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = typ as i16;
    l.l_whence = libc::SEEK_SET as i16;
    l.l_start = start;
    l.l_len = len;
    // SAFETY: a valid descriptor and a flock structure that outlives the call.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), cmd, &mut l) };
    if r < 0 { Err(Errno::last()) } else { Ok(l) }
}

fn flock(f: &std::fs::File, op: i32) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor.
    let r = unsafe { libc::flock(f.as_raw_fd(), op) };
    if r < 0 { Err(Errno::last()) } else { Ok(()) }
}

fn rw(p: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(p)
        .unwrap()
}

extern "C" fn on_usr1(_: i32) {}

#[test]
fn fcntl_ofd_and_flock_locks_hold_across_mounts() {
    use libc::{F_GETLK, F_OFD_SETLK, F_RDLCK, F_SETLK, F_SETLKW, F_UNLCK, F_WRLCK};
    let mut t = two_mounts();
    std::fs::write(t.a.path("f"), b"locked").unwrap();
    std::fs::write(t.a.path("g"), b"other").unwrap();
    assert!(wait_until(VISIBLE, || t.b.path("g").exists()));
    let (fa, fb) = (rw(&t.a.path("f")), rw(&t.b.path("f")));

    // Record locks: a write lock through A stands against B where the
    // ranges meet, and F_GETLK through B reports it.
    lk(&fa, F_SETLK, F_WRLCK, 0, 100).unwrap();
    assert_eq!(
        lk(&fb, F_SETLK, F_WRLCK, 50, 10).unwrap_err(),
        Errno::EAGAIN
    );
    assert_eq!(lk(&fb, F_SETLK, F_RDLCK, 99, 1).unwrap_err(), Errno::EAGAIN);
    lk(&fb, F_SETLK, F_RDLCK, 100, 100).unwrap();
    let held = lk(&fb, F_GETLK, F_WRLCK, 0, 10).unwrap();
    assert_eq!(
        (i32::from(held.l_type), held.l_start, held.l_len),
        (F_WRLCK, 0, 100)
    );
    // Read locks share; unlocking part of a range frees just that part.
    lk(&fa, F_SETLK, F_UNLCK, 0, 50).unwrap();
    lk(&fb, F_SETLK, F_RDLCK, 0, 50).unwrap();
    assert_eq!(lk(&fb, F_SETLK, F_RDLCK, 50, 1).unwrap_err(), Errno::EAGAIN);
    lk(&fa, F_SETLK, F_RDLCK, 0, 50).unwrap();
    assert_eq!(lk(&fa, F_SETLK, F_WRLCK, 0, 1).unwrap_err(), Errno::EAGAIN);
    lk(&fb, F_SETLK, F_UNLCK, 0, 0).unwrap();
    lk(&fa, F_SETLK, F_UNLCK, 0, 0).unwrap();
    let free = lk(&fb, F_GETLK, F_WRLCK, 0, 0).unwrap();
    assert_eq!(i32::from(free.l_type), F_UNLCK);

    // A close of any descriptor of the file drops the process's record
    // locks (POSIX), through that mount.
    lk(&fa, F_SETLK, F_WRLCK, 0, 0).unwrap();
    assert_eq!(lk(&fb, F_SETLK, F_WRLCK, 0, 0).unwrap_err(), Errno::EAGAIN);
    drop(std::fs::File::open(t.a.path("f")).unwrap());
    lk(&fb, F_SETLK, F_WRLCK, 0, 0).unwrap();
    lk(&fb, F_SETLK, F_UNLCK, 0, 0).unwrap();

    // OFD locks belong to the open file, and go with its last close.
    let fa2 = rw(&t.a.path("f"));
    lk(&fa2, F_OFD_SETLK, F_WRLCK, 0, 0).unwrap();
    assert_eq!(
        lk(&fb, F_OFD_SETLK, F_RDLCK, 0, 1).unwrap_err(),
        Errno::EAGAIN
    );
    drop(fa2);
    assert!(wait_until(VISIBLE, || lk(&fb, F_OFD_SETLK, F_RDLCK, 0, 1).is_ok()));
    lk(&fb, libc::F_OFD_SETLK, F_UNLCK, 0, 0).unwrap();

    // flock: exclusive against shared, shared with shared.
    flock(&fa, libc::LOCK_EX | libc::LOCK_NB).unwrap();
    assert_eq!(
        flock(&fb, libc::LOCK_SH | libc::LOCK_NB).unwrap_err(),
        Errno::EWOULDBLOCK
    );
    flock(&fa, libc::LOCK_SH | libc::LOCK_NB).unwrap();
    flock(&fb, libc::LOCK_SH | libc::LOCK_NB).unwrap();
    assert_eq!(
        flock(&fa, libc::LOCK_EX | libc::LOCK_NB).unwrap_err(),
        Errno::EWOULDBLOCK
    );
    flock(&fa, libc::LOCK_UN).unwrap();
    flock(&fb, libc::LOCK_UN).unwrap();

    // A blocked F_SETLKW through B is woken by the unlock through A.
    lk(&fa, F_SETLK, F_WRLCK, 0, 0).unwrap();
    let fb2 = fb.try_clone().unwrap();
    let waiter = std::thread::spawn(move || {
        lk(&fb2, F_SETLKW, F_WRLCK, 0, 0).map(|_| std::time::Instant::now())
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !waiter.is_finished(),
        "F_SETLKW did not wait for the holder"
    );
    let unlocked = std::time::Instant::now();
    lk(&fa, F_SETLK, F_UNLCK, 0, 0).unwrap();
    let woke = waiter.join().unwrap().unwrap();
    let after = woke.duration_since(unlocked);
    // The doorbell wakes it, not the once-a-second retry.
    assert!(after < Duration::from_millis(900), "woken after {after:?}");
    lk(&fb, F_SETLK, F_UNLCK, 0, 0).unwrap();

    // A signal ends the wait with EINTR.
    lk(&fa, F_SETLK, F_WRLCK, 0, 0).unwrap();
    // SAFETY: a handler that does nothing; installed without SA_RESTART.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as *const () as usize;
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
    }
    let fb2 = fb.try_clone().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        // SAFETY: pthread_self has no preconditions.
        tx.send(unsafe { libc::pthread_self() }).unwrap();
        lk(&fb2, F_SETLKW, F_WRLCK, 0, 0)
    });
    let thread = rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: the thread is alive (it is waiting for the lock).
    unsafe { libc::pthread_kill(thread, libc::SIGUSR1) };
    assert_eq!(waiter.join().unwrap().unwrap_err(), Errno::EINTR);
    // The interrupted wait took nothing: A still holds it, B can have it after.
    assert_eq!(lk(&fb, F_SETLK, F_WRLCK, 0, 0).unwrap_err(), Errno::EAGAIN);
    lk(&fa, F_SETLK, F_UNLCK, 0, 0).unwrap();

    // Two owners waiting for each other across the mounts: the second
    // wait is refused with EDEADLK, as Linux refuses one on one machine.
    let (ga, gb) = (rw(&t.a.path("g")), rw(&t.b.path("g")));
    lk(&fa, F_SETLK, F_WRLCK, 0, 0).unwrap();
    lk(&gb, F_SETLK, F_WRLCK, 0, 0).unwrap();
    let ga2 = ga.try_clone().unwrap();
    let first = std::thread::spawn(move || lk(&ga2, F_SETLKW, F_WRLCK, 0, 0));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!first.is_finished());
    assert_eq!(
        lk(&fb, F_SETLKW, F_WRLCK, 0, 0).unwrap_err(),
        Errno::EDEADLK
    );
    lk(&gb, F_SETLK, F_UNLCK, 0, 0).unwrap();
    first.join().unwrap().unwrap();
    lk(&ga, F_SETLK, F_UNLCK, 0, 0).unwrap();
    lk(&fa, F_SETLK, F_UNLCK, 0, 0).unwrap();
    drop((fa, fb, ga, gb));
    t.unmount_and_fsck();
}

#[test]
fn a_killed_lock_holders_locks_are_dropped() {
    use libc::{F_SETLK, F_SETLKW, F_WRLCK};
    let t = two_mounts();
    std::fs::write(t.a.path("f"), b"x").unwrap();
    assert!(wait_until(VISIBLE, || t.b.path("f").exists()));
    let fa = rw(&t.a.path("f"));
    let fb = rw(&t.b.path("f"));
    lk(&fa, F_SETLK, F_WRLCK, 0, 0).unwrap();
    flock(&fa, libc::LOCK_EX).unwrap();
    assert_eq!(lk(&fb, F_SETLK, F_WRLCK, 0, 0).unwrap_err(), Errno::EAGAIN);
    let fb2 = fb.try_clone().unwrap();
    let waiter = std::thread::spawn(move || lk(&fb2, F_SETLKW, F_WRLCK, 0, 0));
    std::thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(t.a.pid(), nix::sys::signal::Signal::SIGKILL).unwrap();
    // Its session is dead once PostgreSQL drops its connection: the waiter
    // gets the lock, and flock through B too.
    waiter.join().unwrap().unwrap();
    flock(&fb, libc::LOCK_EX | libc::LOCK_NB).unwrap();
    drop(fa);
}

/// Samba's CTDB recovery lock helper, which takes an `fcntl` lock on its
/// file and keeps it while its parent lives (the test script installs
/// Debian's `ctdb`).
const CTDB_HELPER: &str = "/usr/libexec/ctdb/ctdb_mutex_fcntl_helper";

/// Starts the helper on `file`; its verdict: '0' taken, '1' contended.
fn ctdb_helper(file: &Path) -> (std::process::Child, u8) {
    use std::io::Read;
    let mut child = Command::new(CTDB_HELPER)
        .arg(file)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{CTDB_HELPER}: {e} (the test script installs ctdb)"));
    let mut verdict = [0u8];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut verdict)
        .unwrap();
    (child, verdict[0])
}

#[test]
fn ctdbs_recovery_lock_is_held_through_one_mount_at_a_time() {
    let t = two_mounts();
    let (mut first, v) = ctdb_helper(&t.a.path("reclock"));
    assert_eq!(v, b'0', "the first helper did not take the lock");
    let (mut second, v) = ctdb_helper(&t.b.path("reclock"));
    assert_eq!(v, b'1', "the second helper took a lock the first holds");
    let _ = second.wait();
    // The holder dies: its descriptor's close drops the lock, and the
    // other mount's helper takes it.
    first.kill().unwrap();
    first.wait().unwrap();
    let got = wait_until(VISIBLE, || {
        let (mut c, v) = ctdb_helper(&t.b.path("reclock"));
        if v == b'0' {
            c.kill().unwrap();
        }
        let _ = c.wait();
        v == b'0'
    });
    assert!(got, "the lock was not free after its holder died");
}

#[test]
fn an_o_creat_racing_the_other_mounts_create_opens_the_same_file() {
    use std::os::unix::fs::MetadataExt;
    let t = two_mounts();
    for i in 0..40 {
        let name = format!("race{i}");
        let (pa, pb) = (t.a.path(&name), t.b.path(&name));
        let go = Arc::new(Barrier::new(2));
        let g = Arc::clone(&go);
        let other = std::thread::spawn(move || {
            g.wait();
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(pb)
                .map(|f| f.metadata().unwrap().ino())
        });
        go.wait();
        let a = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(pa)
            .map(|f| f.metadata().unwrap().ino());
        let b = other.join().unwrap();
        let (a, b) = (
            a.unwrap(),
            b.unwrap_or_else(|e| panic!("round {i}, mount B: {e}")),
        );
        assert_eq!(a, b, "round {i}: two files for one name");
    }
}

/// A directory statistic read through one mount.
fn dir_stat(dir: &Path, name: &str) -> Option<u64> {
    let v = getxattr(dir, &format!("safs.dir.{name}")).ok()?;
    String::from_utf8(v).ok()?.parse().ok()
}

#[test]
fn a_quota_holds_across_mounts_and_both_see_the_same_statistics() {
    let mut t = two_mounts();
    let (a, b) = (&t.a, &t.b);
    std::fs::create_dir(a.path("q")).unwrap();
    setxattr(&a.path("q"), "safs.quota.max_bytes", b"1000000", 0).unwrap();
    assert!(wait_until(VISIBLE, || getxattr(
        &b.path("q"),
        "safs.quota.max_bytes"
    )
    .ok()
    .as_deref()
        == Some(&b"1000000"[..])));
    // One writer through each mount, in turn, until both are refused: the
    // two files together end exactly at the limit.
    let mut fa = std::fs::File::create(a.path("q/from-a")).unwrap();
    let mut fb = std::fs::File::create(b.path("q/from-b")).unwrap();
    let piece = vec![7u8; 30_000];
    let (mut open_a, mut open_b) = (true, true);
    while open_a || open_b {
        for (f, open) in [(&mut fa, &mut open_a), (&mut fb, &mut open_b)] {
            if *open {
                if let Err(e) = std::io::Write::write(f, &piece) {
                    assert_eq!(e.raw_os_error(), Some(libc::EDQUOT), "{e}");
                    *open = false;
                }
            }
        }
    }
    drop((fa, fb));
    let total = std::fs::metadata(a.path("q/from-a")).unwrap().len()
        + std::fs::metadata(a.path("q/from-b")).unwrap().len();
    assert_eq!(
        total,
        1_000_000,
        "bytes past the limit: {}",
        total as i64 - 1_000_000
    );
    for m in [a, b] {
        assert!(
            wait_until(VISIBLE, || dir_stat(&m.path("q"), "rbytes")
                == Some(1_000_000)
                && dir_stat(&m.path("q"), "rfiles") == Some(2)
                && dir_stat(&m.mnt, "rentries") == Some(3)),
            "statistics through {}",
            m.mnt.display()
        );
    }
    t.unmount_and_fsck();
}

/// On a shared volume a change below a directory moves its session's
/// share of each ancestor's statistics (`format::shares`), not the
/// ancestors' records. The figures through both mounts still add up to
/// what a walk finds: after writes below one ancestor from both mounts,
/// removals through the other mount, a directory moved across subtrees,
/// a daemon killed (the survivor folds its shares) and remounted; fsck is
/// clean after both unmount (their shares folded).
#[test]
fn directory_statistics_of_two_mounts_add_up_and_survive_a_killed_daemon() {
    let mut t = two_mounts();
    let vol = t.v.vol().to_path_buf();
    std::fs::create_dir_all(t.a.path("top/a/deep")).unwrap();
    std::fs::create_dir_all(t.b.path("top/b/deep")).unwrap();
    run_cmd(Command::new(env!("CARGO_BIN_EXE_safs")).args(["sync", t.b.mnt.to_str().unwrap()]))
        .assert_success("safs sync");
    // Every commit's keys are in `safs_changes`: from here on, none may
    // name the inode of `top` or of the root.
    let mut db = postgres::Client::connect(&t._cluster.conninfo("vol"), postgres::NoTls).unwrap();
    let since: i64 = db
        .query_one("SELECT coalesce(max(epoch), 0) FROM safs_changes", &[])
        .unwrap()
        .get(0);
    let inode_key = |ino: u64| [&b"I"[..], &ino.to_be_bytes()].concat();
    let top = std::fs::metadata(t.a.path("top")).unwrap().ino();
    for i in 0..20 {
        write_file(&t.a.path(format!("top/a/deep/f{i}")), &[1u8; 1000]);
    }
    for i in 0..30 {
        write_file(&t.b.path(format!("top/b/deep/g{i}")), &[2u8; 500]);
    }
    for m in [&t.a, &t.b] {
        run_cmd(Command::new(env!("CARGO_BIN_EXE_safs")).args(["sync", m.mnt.to_str().unwrap()]))
            .assert_success("safs sync");
    }
    let commits: i64 = db
        .query_one(
            "SELECT count(*) FROM safs_changes WHERE epoch > $1",
            &[&since],
        )
        .unwrap()
        .get(0);
    assert!(commits > 0);
    let touched = |db: &mut postgres::Client, ino: u64| -> i64 {
        db.query_one(
            "SELECT count(*) FROM safs_changes WHERE epoch > $1 AND $2 = ANY(keys)",
            &[&since, &inode_key(ino)],
        )
        .unwrap()
        .get(0)
    };
    // The directories holding the files are written (their entries).
    let deep = std::fs::metadata(t.a.path("top/a/deep")).unwrap().ino();
    assert!(touched(&mut db, deep) > 0);
    for ino in [1, top] {
        let n = touched(&mut db, ino);
        assert_eq!(
            n, 0,
            "{n} of {commits} commits rewrote the record of ancestor {ino}"
        );
    }
    #[track_caller]
    fn agree(m: &Mount, want: &[(&str, &str, u64)]) {
        assert!(
            wait_until(VISIBLE, || want
                .iter()
                .all(|&(dir, name, v)| dir_stat(&m.path(dir), name) == Some(v))),
            "through {}: {:?}",
            m.mnt.display(),
            want.iter()
                .map(|&(dir, name, _)| (dir, name, dir_stat(&m.path(dir), name)))
                .collect::<Vec<_>>()
        );
    }
    let both = |t: &Two, want: &[(&str, &str, u64)]| {
        agree(&t.a, want);
        agree(&t.b, want);
    };
    both(
        &t,
        &[
            ("top", "rfiles", 50),
            ("top", "rsubdirs", 4),
            ("top", "rbytes", 35_000),
            ("top/a", "rbytes", 20_000),
            ("top/b/deep", "files", 30),
            ("", "rfiles", 50),
        ],
    );
    for i in 0..5 {
        std::fs::remove_file(t.b.path(format!("top/a/deep/f{i}"))).unwrap();
    }
    std::fs::rename(t.a.path("top/b/deep"), t.a.path("top/a/moved")).unwrap();
    let after = [
        ("top", "rfiles", 45),
        ("top", "rsubdirs", 4),
        ("top", "rbytes", 30_000),
        ("top/a", "rfiles", 45),
        ("top/a", "rbytes", 30_000),
        ("top/b", "rbytes", 0),
        ("", "rbytes", 30_000),
    ];
    both(&t, &after);
    t.sync_kill_a_and_wait_for_burial();
    agree(&t.b, &after);
    write_file(&t.b.path("top/a/moved/h"), b"seven b");
    t.a = Mount::new(&vol, &t.a.mnt.clone());
    both(
        &t,
        &[
            ("top", "rfiles", 46),
            ("top", "rbytes", 30_007),
            ("top/a/moved", "rbytes", 15_007),
        ],
    );
    t.unmount_and_fsck();
}
