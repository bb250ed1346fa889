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
//! Loops rotate between kernel passthrough, daemon-side I/O, an encrypted
//! volume, a volume whose metadata is in PostgreSQL (a private cluster
//! per loop), and a plain and an encrypted volume whose contents are in an
//! object store (the run's S3 server): there the recovered contents are
//! also read back from the store with the node's cache thrown away. A second test stops the PostgreSQL server as in a crash
//! (`pg_ctl stop -m immediate`) under a running workload: the daemon waits
//! for it and goes on, and nothing it acknowledged is lost.
//! `SAFS_CRASH_LOOPS=N` sets the number of loops (default 6 here; the
//! long run in docs/testing.md uses 200). `SAFS_CRASH_SEED` replays one seed's
//! workload, `SAFS_CRASH_KIND=K` (0–5) runs every loop on one kind of volume. `SAFS_CRASH_VERBOSE=1` prints
//! refused operations.

mod model;
mod store;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use model::*;

/// What a loop's volume is.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Volume {
    Plain,
    /// Contents then always go through the daemon.
    Encrypted,
    /// Metadata in a private PostgreSQL cluster.
    Postgres,
    /// Contents in an object store (metadata in the embedded engine).
    Store,
    /// The same, encrypted: sealed blocks in the store.
    StoreEncrypted,
}

impl Volume {
    fn encrypted(self) -> bool {
        matches!(self, Volume::Encrypted | Volume::StoreEncrypted)
    }

    fn in_store(self) -> bool {
        matches!(self, Volume::Store | Volume::StoreEncrypted)
    }
}

/// One loop on `base`: `data_path` is a mount option.
fn one_loop(seed: u64, base: &Path, data_path: &str, kind: Volume) {
    let vol = base.join("vol");
    let mnt = base.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let enc = kind.encrypted().then(|| Encrypted::new(base));
    // Dropped last: stopped and removed after the volume is unmounted.
    let cluster = (kind == Volume::Postgres).then(|| {
        let dir = base.join("cluster");
        std::fs::create_dir(&dir).unwrap();
        safs::meta::postgres::cluster::TempCluster::start(&dir).unwrap()
    });
    let mut format = vec![
        "format".to_string(),
        vol.to_str().unwrap().into(),
        "--inline-xattr-bytes".into(),
        "128".into(),
    ];
    format.extend(enc.iter().flat_map(Encrypted::format_args));
    if let Some(c) = &cluster {
        format.extend(["--meta".into(), c.conninfo("postgres")]);
    }
    if kind.in_store() {
        SAFS_ENV.get_or_init(store::env);
        format.extend(["--data".into(), store::bucket("crash")]);
    }
    run_ok(safs().args(&format));
    let data_path = match &enc {
        Some(e) => format!("{data_path},{}", e.mount_option()),
        None => data_path.to_string(),
    };
    let data_path = data_path.as_str();
    let mount = || {
        run_ok(safs().args([
            "mount",
            vol.to_str().unwrap(),
            mnt.to_str().unwrap(),
            "-o",
            data_path,
        ]))
    };
    let guard = Mounted {
        mnt: mnt.clone(),
        vol: vol.clone(),
    };
    mount();
    let mut model = Model::new();
    for d in ["a", "b", "c"] {
        std::fs::create_dir(mnt.join(d)).unwrap();
        std::fs::set_permissions(mnt.join(d), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut rng = Rng(seed | 1);
    let names = names();
    // The kill lands somewhere in the first ~1.5 s of the workload.
    let delay = Duration::from_millis(50 + rng.below(1500));
    let pid = daemon_pid(&vol);
    let stop = Arc::new(AtomicBool::new(false));
    let killer = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            // Raised before the kill, so that every failure the workload
            // sees from the kill on counts as possibly half-done.
            stop.store(true, Ordering::SeqCst);
            // SAFETY: plain kill(2) of the daemon we started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        })
    };
    oplog_clear();
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
    // What a boot's fsck pass sees: the leftovers of a crash are no errors.
    fsck_clean(seed, "fsck before the remount", &vol, enc.as_ref());

    mount();
    let got = read_tree(&mnt);
    let (got_meta, got_groups) = got.meta();
    let candidates = &snapshots[durable..];
    let matching: Vec<usize> = candidates
        .iter()
        .enumerate()
        .filter(|(_, m)| m.meta() == (got_meta.clone(), got_groups.clone()))
        .map(|(k, _)| k)
        .collect();
    let Some(&k) = matching.first() else {
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
    // Contents: each file's equal to its contents in some state at or
    // after k. Same inode (model ids are stable across states), wherever
    // later states moved it: data is not tied to the batch that renames it.
    let contents_ok = |k: usize, path: &String, data: &[u8]| {
        let id = candidates[k].names[path];
        candidates[k..]
            .iter()
            .any(|m| m.inodes.get(&id).is_some_and(|i| i.data == data))
            || torn_inflight_write(&snapshots, id, data)
    };
    // Metadata alone can match several states — a name unlinked and
    // created again with the same mode looks the same (sizes are
    // contents) — and the files are then those of one of them.
    let k = matching
        .iter()
        .copied()
        .find(|&k| {
            got.names.iter().all(|(path, id)| {
                let inode = &got.inodes[id];
                inode.kind != Kind::File || contents_ok(k, path, &inode.data)
            })
        })
        .unwrap_or(k);
    for (path, id) in &got.names {
        let inode = &got.inodes[id];
        if inode.kind != Kind::File {
            continue;
        }
        let ok = contents_ok(k, path, &inode.data);
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
            let log = oplog();
            for l in &log[log.len().saturating_sub(60)..] {
                eprintln!("op: {l}");
            }
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
    if kind.in_store() {
        // What the recovery uploaded is in the store: the same tree read
        // back with nothing cached.
        store::lose_cache(&vol);
        mount();
        let again = read_tree(&mnt);
        unmount(&mnt);
        wait_unlocked(&vol);
        assert_eq!(
            contents(&again),
            contents(&got),
            "seed {seed}: the store holds other contents than the recovered cache"
        );
    }
    drop(guard);
    let out = fsck_clean(seed, "fsck after recovery", &vol, enc.as_ref());
    // An upload the kill cut short leaves objects no record names (the
    // store's garbage, listed as `leftover: object ...`); nothing else may.
    let garbage = |l: &str| l.starts_with("leftover: object ");
    let other = if kind.in_store() {
        out.lines()
            .any(|l| l.starts_with("leftover:") && !garbage(l))
    } else {
        out.contains("leftover")
    };
    assert!(
        !other,
        "seed {seed}: leftovers of a crash after a clean unmount: {out}"
    );
    drop(cluster);
}

/// Every regular file's path and contents.
fn contents(m: &Model) -> std::collections::BTreeMap<&str, &[u8]> {
    m.names
        .iter()
        .filter(|(_, id)| m.inodes[id].kind == Kind::File)
        .map(|(p, id)| (p.as_str(), m.inodes[id].data.as_slice()))
        .collect()
}

/// Runs `safs fsck` on the unmounted `vol`, requires exit 0 and returns
/// what it printed.
fn fsck_clean(seed: u64, when: &str, vol: &Path, enc: Option<&Encrypted>) -> String {
    let mut fsck = vec!["fsck".to_string(), vol.to_str().unwrap().into()];
    if let Some(e) = enc {
        fsck.extend([
            "--passphrase-file".into(),
            e.passfile.to_str().unwrap().into(),
        ]);
    }
    let out = safs().args(&fsck).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "seed {seed}: {when}: {text}");
    text
}

#[test]
fn a_postgresql_server_crash_under_a_workload_loses_nothing_acknowledged() {
    let tmp = tempfile::Builder::new()
        .prefix("safs-crash-pg")
        .tempdir_in("/tmp")
        .unwrap();
    let base = tmp.path();
    let (vol, mnt, dir) = (base.join("vol"), base.join("mnt"), base.join("cluster"));
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::create_dir(&dir).unwrap();
    let cluster = safs::meta::postgres::cluster::TempCluster::start(&dir).unwrap();
    run_ok(safs().args([
        "format",
        vol.to_str().unwrap(),
        "--meta",
        &cluster.conninfo("postgres"),
    ]));
    let guard = Mounted {
        mnt: mnt.clone(),
        vol: vol.clone(),
    };
    run_ok(safs().args(["mount", vol.to_str().unwrap(), mnt.to_str().unwrap()]));
    for d in ["a", "b", "c"] {
        std::fs::create_dir(mnt.join(d)).unwrap();
    }
    // SAFS_CRASH_SEED replays one run, as for the crash loops.
    let seed = std::env::var("SAFS_CRASH_SEED")
        .ok()
        .and_then(|s| s.split(',').next()?.trim().parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("seed {seed}");
    let mut rng = Rng(seed | 1);
    let names = names();
    let mut model = Model::new();
    let (mut done, mut crashes) = (0, 0);
    // Two server crashes at random moments; operations in flight wait for
    // the server and complete: none fails, none is lost.
    let crash_at = [50 + rng.below(150), 250 + rng.below(150)];
    for i in 0..450 {
        if crash_at.contains(&i) {
            cluster.restart().unwrap();
            crashes += 1;
        }
        let mut next = model.clone();
        match step(&mut rng, &mnt, &mut next, &names) {
            (Outcome::Done, _) => {
                model = next;
                done += 1;
            }
            (Outcome::Refused, _) => {}
            (Outcome::Dead, _) => panic!(
                "seed {seed}: the daemon died at step {i}; its log:\n{}",
                std::fs::read_to_string(vol.join("safs.log")).unwrap_or_default()
            ),
        }
    }
    assert_eq!(crashes, 2);
    assert!(done > 100, "seed {seed}: only {done} operations completed");
    let log = std::fs::read_to_string(vol.join("safs.log")).unwrap();
    assert!(
        log.contains("PostgreSQL unavailable"),
        "seed {seed}: the daemon never met the crashed server: {log}"
    );
    // Commits made visible before durable that the crash lost were
    // committed again (one daemon: nothing of another's between them).
    assert!(
        !log.contains("their changes are lost") && !log.contains("write lease was lost"),
        "seed {seed}: changes were lost: {log}"
    );
    assert!(
        !log.contains("metadata commit failed"),
        "seed {seed}: a commit failed instead of waiting: {log}"
    );
    unmount(&mnt);
    wait_unlocked(&vol);
    drop(guard);
    run_ok(safs().args(["mount", vol.to_str().unwrap(), mnt.to_str().unwrap()]));
    let guard = Mounted {
        mnt: mnt.clone(),
        vol: vol.clone(),
    };
    let got = read_tree(&mnt);
    assert_eq!(got.meta(), model.meta(), "seed {seed}: metadata");
    for (path, id) in &got.names {
        let inode = &got.inodes[id];
        let want = &model.inodes[&model.names[path]];
        assert!(
            inode.data == want.data,
            "seed {seed}: contents of {path} differ"
        );
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
        "seed {seed}: fsck: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Whether `got` is the last completed state of inode `id` with a prefix
/// of the in-flight write applied: a write cut short by the kill lands in
/// order, request by request (daemon-side I/O splits it), so any prefix is a
/// legitimate outcome for a write that was never acknowledged.
fn torn_inflight_write(snapshots: &[Model], id: u64, got: &[u8]) -> bool {
    let Some(last) = oplog_last() else {
        return false;
    };
    let w: Vec<&str> = last.split_whitespace().collect();
    let ["write", path, "off", off, "len", len, "byte", byte] = w[..] else {
        return false;
    };
    let (Ok(off), Ok(len), Ok(byte)) = (
        off.parse::<usize>(),
        len.parse::<usize>(),
        byte.parse::<u8>(),
    ) else {
        return false;
    };
    // The state before the in-flight step is the one before the last.
    let Some(before) = snapshots.len().checked_sub(2).map(|i| &snapshots[i]) else {
        return false;
    };
    if before.names.get(path) != Some(&id) {
        return false;
    }
    let old = &before.inodes[&id].data;
    (off..=off + len).any(|x| {
        let mut want = old.clone();
        if want.len() < x {
            want.resize(x, 0);
        }
        want[off.min(x)..x].fill(byte);
        want == got
    })
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
        // Both data paths (kernel passthrough, daemon-side I/O) and an
        // encrypted volume (sealed blocks through the daemon, the
        // directory cache on).
        // SAFS_CRASH_KIND=N runs every loop on the N-th kind below.
        let at = std::env::var("SAFS_CRASH_KIND")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(i);
        let (data_path, kind) = match at % 6 {
            0 => ("passthrough", Volume::Plain),
            1 => ("nopassthrough", Volume::Plain),
            2 => ("dircache=1", Volume::Encrypted),
            3 => ("passthrough", Volume::Postgres),
            4 => ("passthrough", Volume::Store),
            _ => ("dircache=1", Volume::StoreEncrypted),
        };
        eprintln!(
            "crash loop {}/{} seed {seed} ({data_path}, {kind:?})",
            i + 1,
            seeds.len()
        );
        one_loop(*seed, tmp.path(), data_path, kind);
    }
}
