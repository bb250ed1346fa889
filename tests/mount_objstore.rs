//! Volumes whose contents are in an object store (`safs format --data
//! s3://...`), mounted for real against a real S3 server: a one-node Ceph
//! cluster with radosgw (`safs-s3server`; the test script starts one per
//! run, else each test starts its own).
//!
//! The local `data/` directory is a cache: every test here throws it away
//! at some point and reads the files back from the store.

mod common;
mod store;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::time::Duration;

use common::*;
use nix::sys::signal::{Signal, kill};
use safs::meta::postgres::cluster::TempCluster;
use safs::objstore::{Limits, Store, StoreConfig};
use safs_s3server::{ACCESS_KEY, SECRET_KEY, TempRgw};

const MIB: usize = 1 << 20;

/// The run's S3 server; every safs command of this binary reaches it.
fn server() -> &'static TempRgw {
    let rgw = store::server();
    CHILD_ENV.get_or_init(store::env);
    rgw
}

/// A new bucket for one test, and its URL with a prefix.
fn bucket(name: &str) -> String {
    server();
    store::bucket(name)
}

/// A client of the same bucket and prefix, to look at what safs stored.
fn client(url: &str) -> Store {
    let rgw = server();
    let env = [
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
        ("AWS_ENDPOINT_URL", rgw.endpoint()),
        ("AWS_REGION", "us-east-1"),
    ];
    let config = StoreConfig::resolve(
        url,
        &move |k| {
            env.iter()
                .find(|(ek, _)| *ek == k)
                .map(|(_, v)| v.to_string())
        },
        None,
    )
    .unwrap();
    Store::new(config, Limits::default()).unwrap()
}

fn objects(s: &Store) -> Vec<(String, u64)> {
    s.list("b/")
        .unwrap()
        .into_iter()
        .map(|o| (o.key, o.size))
        .collect()
}

/// Waits until the store holds exactly `n` objects (deletion runs in the
/// background, after the commit that dropped them).
#[track_caller]
fn expect_objects(s: &Store, n: usize) {
    let ok = wait_until(Duration::from_secs(20), || objects(s).len() == n);
    assert!(ok, "wanted {n} objects, the store holds {:?}", objects(s));
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    let mut x = u64::from(seed) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Throws the node's cache away: every backing file.
fn lose_cache(v: &TestVolume) {
    store::lose_cache(v.vol());
}

fn s(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

fn volume(url: &str, extra: &[&str]) -> TestVolume {
    let mut args = vec!["--data", url];
    args.extend_from_slice(extra);
    let mut v = TestVolume::formatted(&args);
    v.mount();
    v
}

/// Kills `v`'s daemon with SIGKILL and clears its dead mount.
fn kill_9(v: &mut TestVolume) {
    kill(daemon_pid(v.vol()), Signal::SIGKILL).unwrap();
    v.unmount_after_crash();
}

/// The backing file of inode `ino` in `v`'s cache.
fn backing_file(v: &TestVolume, ino: u64) -> std::path::PathBuf {
    v.vol()
        .join("data")
        .join(format!("{:02x}", ino & 0xff))
        .join(format!("{ino:016x}"))
}

/// A boot id that is not this boot's.
const ANOTHER_BOOT: &[u8] = b"00000000-0000-0000-0000-000000000000";

/// Gives `backing` the dirty mark of another boot (the machine stopped
/// with its file open for writing), and checks that fsck says what the
/// next mount will do with it.
fn dirty_in_another_boot(v: &TestVolume, backing: &std::path::Path) {
    setxattr(backing, "user.safs.dirty", ANOTHER_BOOT, 0).unwrap();
    let out = safs(["fsck", s(v.vol())]);
    out.assert_success("fsck after the machine stopped");
    assert!(
        out.stdout.contains("not synced before the machine stopped"),
        "{}",
        out.stdout
    );
}

#[test]
fn a_cached_file_marked_in_another_boot_is_checked_against_its_map() {
    let url = bucket("reboot");
    let mut v = volume(&url, &[]);
    let data = pattern(30, 6 * MIB);
    fs::write(v.path("f"), &data).unwrap();
    let ino = fs::metadata(v.path("f")).unwrap().ino();
    v.unmount();
    let backing = backing_file(&v, ino);
    let mark = getxattr(&backing, "user.safs.map").unwrap();
    assert!(mark.len() > 16, "the mark names its boot: {mark:?}");
    // What a power cut can leave: bytes never synced lost (zeros here, in
    // the second block), the mark set after them kept — from a boot that
    // is not this one.
    let f = OpenOptions::new().write(true).open(&backing).unwrap();
    f.write_all_at(&vec![0; 100_000], 4 * MIB as u64 + 7)
        .unwrap();
    drop(f);
    let mut stale = mark[..16].to_vec();
    stale.extend_from_slice(ANOTHER_BOOT);
    setxattr(&backing, "user.safs.map", &stale, 0).unwrap();
    v.mount();
    assert_eq!(fs::read(v.path("f")).unwrap(), data);
    // Checked and mended: marked for this boot again.
    assert_eq!(getxattr(&backing, "user.safs.map").unwrap(), mark);
    v.unmount();
}

#[test]
fn contents_live_in_the_store_and_come_back_when_the_cache_is_lost() {
    let url = bucket("roundtrip");
    let mut v = volume(&url, &[]);
    let big = pattern(1, 9 * MIB + 123);
    fs::write(v.path("big"), &big).unwrap();
    fs::write(v.path("small"), b"hello").unwrap();
    File::create(v.path("empty")).unwrap();
    // A sparse file: five blocks of zeros, then two bytes.
    let f = File::create(v.path("sparse")).unwrap();
    f.write_all_at(b"xy", 20 * MIB as u64).unwrap();
    drop(f);
    // A terabyte of hole and one byte: holes are neither read nor stored.
    let f = File::create(v.path("huge")).unwrap();
    f.write_all_at(b"z", 1 << 40).unwrap();
    drop(f);
    fs::create_dir(v.path("d")).unwrap();
    fs::write(v.path("d/inner"), pattern(2, 5000)).unwrap();
    v.unmount();

    // 3 blocks of big, 1 of sparse and 1 of huge; small files (small,
    // d/inner) live in their records.
    let store = client(&url);
    let listed = objects(&store);
    assert_eq!(listed.len(), 5, "{listed:?}");
    assert_eq!(
        listed.iter().map(|(_, n)| n).sum::<u64>(),
        (big.len() + 2 + 1) as u64
    );
    let info = safs(["info", s(v.vol())]);
    info.assert_success("safs info");
    assert!(
        info.stdout
            .contains(&format!("contents:       in the object store at {url}")),
        "{}",
        info.stdout
    );
    let out = safs(["fsck", s(v.vol())]);
    out.assert_success("fsck after a clean unmount");
    assert!(
        out.stdout.contains(": clean") && !out.stdout.contains("leftover"),
        "{}",
        out.stdout
    );

    lose_cache(&v);
    let out = safs(["fsck", s(v.vol())]);
    out.assert_success("fsck with the cache lost");
    v.mount();
    assert_eq!(fs::metadata(v.path("big")).unwrap().len(), big.len() as u64);
    assert_eq!(fs::read(v.path("big")).unwrap(), big);
    assert_eq!(fs::read(v.path("small")).unwrap(), b"hello");
    assert_eq!(fs::read(v.path("empty")).unwrap(), b"");
    let sparse = fs::read(v.path("sparse")).unwrap();
    assert_eq!(sparse.len(), 20 * MIB + 2);
    assert!(sparse[..20 * MIB].iter().all(|&b| b == 0));
    assert_eq!(&sparse[20 * MIB..], b"xy");
    let huge = File::open(v.path("huge")).unwrap();
    assert_eq!(huge.metadata().unwrap().len(), (1 << 40) + 1);
    let mut tail = [0u8; 2];
    assert_eq!(huge.read_at(&mut tail, (1 << 40) - 1).unwrap(), 2);
    assert_eq!(&tail, b"\0z");
    assert_eq!(fs::read(v.path("d/inner")).unwrap(), pattern(2, 5000));
    // Reading changed nothing in the store.
    assert_eq!(objects(&store), listed);
}

/// Full blocks behind a writer's end go to the store while it writes (the
/// stager): they are there before any `fsync` or close; a staged block
/// written again before the close is sent again and its staged object
/// deleted; a file removed while open leaves nothing either.
#[test]
fn full_blocks_go_up_while_the_writer_writes_and_nothing_staged_is_left() {
    let url = bucket("stage");
    let mut v = volume(&url, &[]);
    let store = client(&url);
    let mut want = pattern(30, 14 * MIB);
    let mut f = File::create(v.path("f")).unwrap();
    f.write_all(&want).unwrap();
    // Three full blocks behind the end: staged with the file still open
    // and never synced.
    assert!(
        wait_until(Duration::from_secs(20), || objects(&store).len() >= 3),
        "nothing staged while the file is open: {:?}",
        objects(&store)
    );
    let staged = objects(&store);
    // Block 1 changed after it was staged: its staged object is garbage.
    f.write_all_at(b"again", (5 * MIB) as u64).unwrap();
    want[5 * MIB..5 * MIB + 5].copy_from_slice(b"again");
    f.sync_all().unwrap();
    drop(f);
    // Blocks 0, 1 (sent again), 2, and the short last one: four objects.
    expect_objects(&store, 4);
    let now = objects(&store);
    assert_eq!(now[0], staged[0], "an unchanged staged block is sent twice");
    assert_ne!(
        now[1].0, staged[1].0,
        "a changed block kept its staged object"
    );
    // A file removed while its writer is open: nothing stays.
    let mut g = File::create(v.path("g")).unwrap();
    g.write_all(&pattern(31, 9 * MIB)).unwrap();
    assert!(wait_until(Duration::from_secs(20), || objects(&store)
        .len()
        >= 6));
    fs::remove_file(v.path("g")).unwrap();
    drop(g);
    expect_objects(&store, 4);
    v.unmount();
    lose_cache(&v);
    v.mount();
    assert_eq!(fs::read(v.path("f")).unwrap(), want);
    v.unmount();
    let out = safs(["fsck", s(v.vol()), "--data-check"]);
    out.assert_success("fsck after staging");
    assert!(!out.stdout.contains("leftover"), "{}", out.stdout);
}

/// A file opened for writing again keeps its unchanged blocks: the
/// stager, which sends full blocks while a writer writes, compares them
/// with the file's map, which the last close let go — without it every
/// block looked new, and an append to a large file sent it all again.
#[test]
fn appending_to_a_large_file_sends_only_what_changed() {
    let url = bucket("append");
    let v = volume(&url, &[]);
    let store = client(&url);
    let mut want = pattern(11, 12 * MIB + 100);
    fs::write(v.path("log"), &want).unwrap();
    // Three full blocks and the short last one.
    expect_objects(&store, 4);
    let before = objects(&store);
    let uploaded = |v: &TestVolume| store_stats(v)["uploaded_blocks"].as_u64().unwrap();
    let sent = uploaded(&v);

    let mut f = OpenOptions::new().append(true).open(v.path("log")).unwrap();
    f.write_all(b"one more line\n").unwrap();
    want.extend_from_slice(b"one more line\n");
    // Long enough for the stager to look at the file (every 20 ms).
    std::thread::sleep(Duration::from_millis(300));
    drop(f);
    // The last block is new; the full ones are the objects they were.
    let changed = wait_until(Duration::from_secs(20), || {
        let now = objects(&store);
        now.len() == 4 && now[3] != before[3]
    });
    assert!(changed, "{before:?} then {:?}", objects(&store));
    assert_eq!(objects(&store)[..3], before[..3]);
    assert_eq!(uploaded(&v) - sent, 1, "blocks sent for an append");
    assert_eq!(fs::read(v.path("log")).unwrap(), want);
}

#[test]
fn overwrites_truncates_and_removes_leave_no_object_behind() {
    let url = bucket("churn");
    let mut v = volume(&url, &[]);
    let store = client(&url);
    let mut want = pattern(3, 9 * MIB);
    fs::write(v.path("f"), &want).unwrap();
    expect_objects(&store, 3);
    let before = objects(&store);

    // One byte in the middle block: that block is a new object, the old
    // one goes; the others stay as they were.
    let f = OpenOptions::new().write(true).open(v.path("f")).unwrap();
    f.write_all_at(b"!", (5 * MIB) as u64).unwrap();
    want[5 * MIB] = b'!';
    drop(f);
    let changed = wait_until(Duration::from_secs(20), || {
        let now = objects(&store);
        now.len() == 3 && now[1] != before[1]
    });
    assert!(changed, "{before:?} then {:?}", objects(&store));
    let after = objects(&store);
    assert_eq!(after[0], before[0]);
    assert_ne!(after[1].0, before[1].0);
    assert_eq!(after[2], before[2]);
    assert_eq!(fs::read(v.path("f")).unwrap(), want);

    // A truncate by path, with no writer open.
    run_cmd(std::process::Command::new("truncate").args(["-s", "1000000", s(&v.path("f"))]))
        .assert_success("truncate");
    want.truncate(1_000_000);
    expect_objects(&store, 1);
    v.unmount();
    lose_cache(&v);
    v.mount();
    assert_eq!(fs::read(v.path("f")).unwrap(), want);

    // Removed: nothing left in the store.
    fs::remove_file(v.path("f")).unwrap();
    expect_objects(&store, 0);
    v.unmount();
    let out = safs(["fsck", s(v.vol())]);
    out.assert_success("fsck after the removal");
    assert!(!out.stdout.contains("leftover"), "{}", out.stdout);
}

#[test]
fn a_file_removed_just_before_a_kill_has_its_objects_deleted_by_the_next_mount() {
    let url = bucket("freed");
    let mut v = volume(&url, &[]);
    let store = client(&url);
    fs::write(v.path("f"), pattern(6, 6 * MIB)).unwrap();
    // Made by another session: freeing it needs its block map, which the
    // deleter reads (the remove only queues the file).
    v.unmount();
    v.mount();
    assert_eq!(objects(&store).len(), 2);
    fs::remove_file(v.path("f")).unwrap();
    File::open(v.mnt()).unwrap().sync_all().unwrap();
    kill_9(&mut v);
    // Deleted or still queued, the freed file's blocks are no finding.
    let out = safs(["fsck", s(v.vol())]);
    out.assert_success("fsck with a freed file's blocks queued");
    assert!(!out.stdout.contains("block record"), "{}", out.stdout);
    // A dump of that state loads: the queued blocks name no live inode.
    let tmp = tempfile::tempdir().unwrap();
    let dump = tmp.path().join("dump");
    safs(["dump", s(v.vol()), s(&dump)]).assert_success("dump");
    safs(["load", s(&dump), s(&tmp.path().join("loaded"))]).assert_success("load");
    v.mount();
    v.unmount();
    assert_eq!(objects(&store).len(), 0);
    let out = safs(["fsck", s(v.vol())]);
    out.assert_success("fsck after the next mount");
    assert!(!out.stdout.contains("leftover"), "{}", out.stdout);
}

#[test]
fn fsync_puts_contents_in_the_store_before_a_kill() {
    let url = bucket("fsync");
    let mut v = volume(&url, &[]);
    let data = pattern(4, 6 * MIB + 17);
    let mut f = File::create(v.path("synced")).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    // Killed with the file still open: no close uploads it.
    kill_9(&mut v);
    drop(f);
    lose_cache(&v);
    let out = safs(["fsck", s(v.vol())]);
    out.assert_success("fsck after the kill, the cache lost");
    v.mount();
    assert_eq!(fs::read(v.path("synced")).unwrap(), data);
}

#[test]
fn after_a_power_cut_what_fsync_covered_is_read_and_unsynced_changes_are_dropped() {
    let url = bucket("powercut");
    let mut v = volume(&url, &[]);
    let synced = pattern(7, 6 * MIB);
    let mut f = File::create(v.path("f")).unwrap();
    f.write_all(&synced).unwrap();
    f.sync_all().unwrap();
    let store = client(&url);
    assert_eq!(objects(&store).len(), 2, "the fsync stored both blocks");
    // Written after the fsync, never synced; the stager sends the changed
    // block before the kill (an object no record names).
    f.write_all_at(b"after the fsync", 100).unwrap();
    let ino = std::os::unix::fs::MetadataExt::ino(&f.metadata().unwrap());
    assert!(wait_until(Duration::from_secs(10), || objects(&store)
        .len()
        == 3));
    kill_9(&mut v);
    drop(f);
    let backing = backing_file(&v, ino);
    // What the machine stopping can leave: a backing file the fsync never
    // wrote to the disk (bytes lost: zeros here), its dirty mark kept —
    // from a boot that is not this one.
    let mark = getxattr(&backing, "user.safs.dirty").unwrap();
    assert!(!mark.is_empty(), "the dirty mark names its boot");
    let b = OpenOptions::new().write(true).open(&backing).unwrap();
    b.write_all_at(&vec![0; 3 * MIB], MIB as u64).unwrap();
    drop(b);
    dirty_in_another_boot(&v, &backing);
    // The torn backing file is not uploaded over what the fsync put in
    // the store: the file reads as the fsync left it.
    v.mount();
    assert_eq!(fs::read(v.path("f")).unwrap(), synced);
    v.unmount();
    assert!(getxattr(&backing, "user.safs.dirty").is_err());
    let out = safs(["fsck", s(v.vol())]);
    out.assert_success("fsck after the next mount");
    // The mount that dropped the changes deleted the staged block too.
    assert!(!out.stdout.contains("leftover"), "{}", out.stdout);
    assert_eq!(objects(&store).len(), 2, "{}", out.stdout);
    lose_cache(&v);
    v.mount();
    assert_eq!(fs::read(v.path("f")).unwrap(), synced);
}

#[test]
fn a_writers_truncate_not_uploaded_when_the_machine_stopped_is_dropped_with_its_writes() {
    let url = bucket("powercut-trunc");
    let mut v = volume(&url, &[]);
    let old = pattern(8, 6 * MIB);
    fs::write(v.path("f"), &old).unwrap();
    // Its upload done (the close's runs after `close` returns).
    v.unmount();
    v.mount();
    // Cut by the writer that has it open: the size 0 is committed (made
    // durable here) apart from the map, which the writer's close would
    // have uploaded; the new bytes are never uploaded.
    let mut f = OpenOptions::new().write(true).open(v.path("f")).unwrap();
    f.set_len(0).unwrap();
    f.write_all(b"new contents, never synced").unwrap();
    File::open(v.mnt()).unwrap().sync_all().unwrap();
    let ino = std::os::unix::fs::MetadataExt::ino(&f.metadata().unwrap());
    kill_9(&mut v);
    drop(f);
    let backing = backing_file(&v, ino);
    dirty_in_another_boot(&v, &backing);
    // The size goes with the map: the file is as its last upload left
    // it, whole, and fsck finds its size and blocks in agreement.
    v.mount();
    assert_eq!(fs::metadata(v.path("f")).unwrap().len(), old.len() as u64);
    assert_eq!(fs::read(v.path("f")).unwrap(), old);
    v.unmount();
    let out = safs(["fsck", s(v.vol())]);
    out.assert_success("fsck after the next mount");
    assert!(!out.stdout.contains("size"), "{}", out.stdout);
}

#[test]
fn a_killed_daemons_unsynced_writes_are_uploaded_at_the_next_mount() {
    let url = bucket("unsynced");
    let mut v = volume(&url, &[]);
    let data = pattern(5, 5 * MIB);
    let mut f = File::create(v.path("open")).unwrap();
    // The name is durable; the contents are not synced.
    File::open(v.mnt()).unwrap().sync_all().unwrap();
    f.write_all(&data).unwrap();
    f.flush().unwrap();
    // The stager has sent the first block (full, behind the end).
    let store = client(&url);
    assert!(wait_until(Duration::from_secs(10), || !objects(&store).is_empty()));
    kill_9(&mut v);
    drop(f);
    let out = safs(["fsck", s(v.vol())]);
    out.assert_success("fsck after the kill");
    assert!(
        out.stdout.contains("leftover:") && out.stdout.contains("not in the object store yet"),
        "{}",
        out.stdout
    );
    // The next mount uploads what the cache holds, and deletes what the
    // stager sent before the kill that no record names (the upload made
    // its block again: the staged one was never named): nothing is left.
    v.mount();
    v.unmount();
    let out = safs(["fsck", s(v.vol())]);
    out.assert_success("fsck after the next mount");
    assert!(!out.stdout.contains("leftover"), "{}", out.stdout);
    assert_eq!(objects(&store).len(), 2, "{}", out.stdout);
    // The contents outlive the cache.
    lose_cache(&v);
    v.mount();
    assert_eq!(fs::read(v.path("open")).unwrap(), data);
}

#[test]
fn encrypted_contents_reach_the_store_sealed() {
    let url = bucket("sealed");
    let root = tempfile::tempdir().unwrap();
    let pass = root.path().join("pass");
    fs::write(&pass, "a passphrase for the store test\n").unwrap();
    let opt = format!("passphrase_file={}", s(&pass));
    let mut v = TestVolume::formatted(&[
        "--data",
        &url,
        "--encrypt",
        "--passphrase-file",
        s(&pass),
        "--kdf-testing",
    ]);
    v.set_options(&[&opt]);
    v.mount();
    let plain: Vec<u8> = b"PLAINTEXT-MARKER-".repeat(300_000);
    fs::write(v.path("secret"), &plain).unwrap();
    v.unmount();
    let store = client(&url);
    let listed = objects(&store);
    assert!(!listed.is_empty());
    for (key, _) in &listed {
        let bytes = store.get(key).unwrap();
        assert!(
            !bytes.windows(17).any(|w| w == b"PLAINTEXT-MARKER-"),
            "{key} holds plaintext"
        );
    }
    lose_cache(&v);
    v.mount();
    assert_eq!(fs::read(v.path("secret")).unwrap(), plain);
}

#[test]
fn format_refuses_an_unreachable_store_and_a_used_prefix() {
    let url = bucket("format");
    let root = tempfile::tempdir().unwrap();
    // Nobody listens there: one clear line, nothing left behind.
    let vol = root.path().join("v1");
    let out = run_cmd(
        std::process::Command::new(env!("CARGO_BIN_EXE_safs"))
            .args(["format", s(&vol), "--data", &url])
            .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
    );
    assert!(!out.success());
    assert!(
        out.stderr.contains("cannot reach the object store"),
        "{}",
        out.stderr
    );
    assert!(!vol.exists());
    // A prefix that holds a volume already (even one with no file yet).
    let mut v = volume(&url, &[]);
    v.unmount();
    let out = safs(["format", s(&root.path().join("v2")), "--data", &url]);
    assert!(!out.success());
    assert!(
        out.stderr.contains("already holds objects"),
        "{}",
        out.stderr
    );
    // A URL that is none.
    let out = safs(["format", s(&root.path().join("v3")), "--data", "http://x/y"]);
    assert!(!out.success());
    assert!(
        out.stderr.contains("not an object store URL"),
        "{}",
        out.stderr
    );
}

/// A mounted node of a volume: its own directory (cache) and mount point.
struct Node {
    vol: std::path::PathBuf,
    mnt: std::path::PathBuf,
    mounted: bool,
}

impl Node {
    #[track_caller]
    fn mount(vol: std::path::PathBuf, mnt: std::path::PathBuf) -> Node {
        Node::mount_with(vol, mnt, "")
    }

    /// [`Node::mount`] with mount options (`-o`), if any.
    #[track_caller]
    fn mount_with(vol: std::path::PathBuf, mnt: std::path::PathBuf, opts: &str) -> Node {
        fs::create_dir_all(&mnt).unwrap();
        let mut args = vec!["mount", s(&vol), s(&mnt)];
        if !opts.is_empty() {
            args.extend(["-o", opts]);
        }
        safs(args).assert_success("safs mount");
        Node {
            vol,
            mnt,
            mounted: true,
        }
    }

    fn path(&self, rel: &str) -> std::path::PathBuf {
        self.mnt.join(rel)
    }

    #[track_caller]
    fn unmount(&mut self) {
        let pid = if self.vol.join("meta/postgres.conf").exists() {
            daemon_pid_at(&self.vol, &self.mnt)
        } else {
            daemon_pid(&self.vol)
        };
        umount_once_released(&self.mnt).assert_success("umount");
        self.mounted = false;
        assert!(wait_until(Duration::from_secs(60), || !process_alive(pid)));
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.mounted && is_fuse_mounted(&self.mnt) {
            let _ = run_cmd(
                std::process::Command::new("umount")
                    .arg("-l")
                    .arg(&self.mnt),
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// A volume for several nodes: a private cluster in a temporary directory
/// and a new bucket, formatted in the directory's `node-a`; the directory,
/// the cluster (dropped after the directory's mounts) and the conninfo.
fn shared_volume(name: &str) -> (tempfile::TempDir, TempCluster, String) {
    let url = bucket(name);
    let dir = tempfile::tempdir().unwrap();
    let cluster = TempCluster::start(dir.path()).unwrap();
    cluster.create_database("vol").unwrap();
    let conninfo = cluster.conninfo("vol");
    let va = dir.path().join("node-a");
    safs(["format", s(&va), "--meta", &conninfo, "--data", &url]).assert_success("format");
    (dir, cluster, conninfo)
}

#[test]
fn two_nodes_share_nothing_but_the_database_and_the_store() {
    let (dir, cluster, conninfo) = shared_volume("nodes");
    let (va, vb) = (dir.path().join("node-a"), dir.path().join("node-b"));
    // A node's side of a volume that keeps its contents locally cannot be
    // made, and a non-empty directory is refused.
    cluster.create_database("local").unwrap();
    let local = cluster.conninfo("local");
    safs(["format", s(&dir.path().join("local")), "--meta", &local]).assert_success("format");
    let out = safs(["attach", s(&vb), "--meta", &local]);
    assert!(
        !out.success() && out.stderr.contains("not in an object store") && !vb.exists(),
        "{}",
        out.stderr
    );
    let out = safs(["attach", s(&vb), "--meta", &conninfo]);
    out.assert_success("safs attach");
    let out = safs(["attach", s(&vb), "--meta", &conninfo]);
    assert!(
        !out.success() && out.stderr.contains("already holds"),
        "{}",
        out.stderr
    );
    // A commits asynchronously (the default: its closes wait for
    // visibility, not for durability), B durably: what either reads of the
    // other's files must not change.
    let mut a = Node::mount(va.clone(), dir.path().join("mnt-a"));
    let mut b = Node::mount_with(vb.clone(), dir.path().join("mnt-b"), "noasync_commit");

    // Written and closed on A, read exactly on B right after the close
    // returned (close-to-open: the close puts the contents in the store),
    // and the other way.
    let one = pattern(7, 6 * MIB + 5);
    fs::write(a.path("one"), &one).unwrap();
    assert!(
        fs::read(b.path("one")).unwrap() == one,
        "B does not read A's closed file"
    );
    let two = pattern(8, 3000);
    fs::write(b.path("two"), &two).unwrap();
    assert!(
        fs::read(a.path("two")).unwrap() == two,
        "A does not read B's closed file"
    );
    // Written again right after an fsync uploaded it (within the same
    // tick of the clock): the close still puts the last bytes in the store.
    for i in 0..5u8 {
        let name = format!("again-{i}");
        let f = File::create(a.path(&name)).unwrap();
        f.write_all_at(&pattern(i, 300_000), 0).unwrap();
        f.sync_all().unwrap();
        f.write_all_at(b"written after the fsync", 1000).unwrap();
        drop(f);
        let mut want = pattern(i, 300_000);
        want[1000..1023].copy_from_slice(b"written after the fsync");
        assert!(
            fs::read(b.path(&name)).unwrap() == want,
            "{name}: B reads the bytes before the fsync"
        );
    }
    // Changed on B after A has read it: A's next open reads B's bytes.
    let f = OpenOptions::new().write(true).open(b.path("one")).unwrap();
    f.write_all_at(b"changed on b", 4 * MIB as u64 + 10)
        .unwrap();
    drop(f);
    let mut want = one.clone();
    want[4 * MIB + 10..4 * MIB + 22].copy_from_slice(b"changed on b");
    assert!(
        wait_until(Duration::from_secs(10), || fs::read(a.path("one"))
            .ok()
            .as_ref()
            == Some(&want)),
        "A does not read B's change"
    );
    // Many files from both nodes at once, each read back on the other.
    std::thread::scope(|sc| {
        for (node, tag) in [(&a, 1u8), (&b, 2u8)] {
            sc.spawn(move || {
                for i in 0..20 {
                    fs::write(
                        node.path(&format!("m{tag}-{i}")),
                        pattern(tag * 50 + i, 70_000 + i as usize),
                    )
                    .unwrap();
                }
            });
        }
    });
    for (reader, tag) in [(&b, 1u8), (&a, 2u8)] {
        for i in 0..20 {
            let p = reader.path(&format!("m{tag}-{i}"));
            let want = pattern(tag * 50 + i, 70_000 + i as usize);
            assert!(fs::read(&p).unwrap() == want, "{} differs", p.display());
        }
    }
    // A close waits for its commit to be visible, not durable; the
    // writer's dirty mark goes once it is durable (unasked, soon after).
    for (writer, vol, tag) in [(&a, &va, 1u8), (&b, &vb, 2u8)] {
        for i in 0..20 {
            let ino = fs::metadata(writer.path(&format!("m{tag}-{i}")))
                .unwrap()
                .ino();
            let backing = vol
                .join("data")
                .join(format!("{:02x}", ino & 0xff))
                .join(format!("{ino:016x}"));
            assert!(
                wait_until(Duration::from_secs(10), || getxattr(
                    &backing,
                    "user.safs.dirty"
                )
                .is_err()),
                "{}: still dirty",
                backing.display()
            );
        }
    }
    // Removed on A while open on B: B reads on until it closes.
    let held = File::open(b.path("two")).unwrap();
    fs::remove_file(a.path("two")).unwrap();
    let mut back = vec![0u8; two.len()];
    held.read_exact_at(&mut back, 0).unwrap();
    assert_eq!(back, two);
    drop(held);

    // Written just before the unmount: its mark goes with it.
    fs::write(a.path("last"), b"last").unwrap();
    let last = fs::metadata(a.path("last")).unwrap().ino();
    a.unmount();
    b.unmount();
    let backing = va
        .join("data")
        .join(format!("{:02x}", last & 0xff))
        .join(format!("{last:016x}"));
    assert!(
        getxattr(&backing, "user.safs.dirty").is_err(),
        "a clean unmount left a dirty mark"
    );
    let out = safs(["fsck", s(&va)]);
    out.assert_success("fsck after both nodes");
    // Node B's whole directory lost: it is only a cache; attached again,
    // it reads everything.
    fs::remove_dir_all(&vb).unwrap();
    safs(["attach", s(&vb), "--meta", &conninfo]).assert_success("attach again");
    let mut b = Node::mount(vb, dir.path().join("mnt-b"));
    assert_eq!(fs::read(b.path("one")).unwrap(), want);
    assert_eq!(fs::read(b.path("m1-3")).unwrap(), pattern(53, 70_003));
    b.unmount();
}

/// A file node A frees while node B still names it (a kernel reference,
/// no open file): its block records wait for A's deleter, but B's open of
/// it finds no file (or the file whole, while A still held it) — it never
/// fetches objects being deleted, and keeps no cached copy of a file that
/// is gone.
#[test]
fn an_open_on_one_node_of_a_file_the_other_freed_finds_nothing_and_caches_nothing() {
    use std::os::fd::AsRawFd;
    let (dir, _cluster, conninfo) = shared_volume("freed-open");
    let (va, vb) = (dir.path().join("node-a"), dir.path().join("node-b"));
    safs(["attach", s(&vb), "--meta", &conninfo]).assert_success("safs attach");
    let mut a = Node::mount(va.clone(), dir.path().join("mnt-a"));
    let mut b = Node::mount(vb.clone(), dir.path().join("mnt-b"));
    for i in 0..6u8 {
        let name = format!("f{i}");
        fs::write(a.path(&name), pattern(i, 5 * MIB)).unwrap();
        // B names the file (an O_PATH descriptor: a lookup, no open).
        let p = b.path(&name);
        assert!(wait_until(Duration::from_secs(10), || p.exists()));
        let named = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(&p)
            .unwrap();
        fs::remove_file(a.path(&name)).unwrap();
        // Once B has seen the remove, opened again through the descriptor
        // at several moments of A's deleter's second: the file whole or
        // gone, never an I/O error (its objects being deleted) nor a part.
        assert!(wait_until(Duration::from_secs(10), || !p.exists()));
        std::thread::sleep(Duration::from_millis(170 * u64::from(i)));
        let again = format!("/proc/self/fd/{}", named.as_raw_fd());
        match fs::read(&again) {
            // A has not let go of it yet (its RELEASE follows the close):
            // an open file, read whole, as a local one would be.
            Ok(bytes) => assert!(
                bytes == pattern(i, 5 * MIB),
                "{name}: {} bytes",
                bytes.len()
            ),
            Err(e) => assert!(
                matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESTALE)),
                "{name}: {e}"
            ),
        }
        drop(named);
    }
    a.unmount();
    b.unmount();
    for v in [&va, &vb] {
        let out = safs(["fsck", s(v)]);
        out.assert_success("fsck after both nodes");
        assert!(!out.stdout.contains("leftover"), "{}", out.stdout);
    }
    assert_eq!(cached_bytes(&vb), 0, "node B cached a file that is gone");
}

/// Work run in a node's thread, given its mountpoint.
type Job = Box<dyn FnOnce(&std::path::Path) + Send>;

/// A node in a mount namespace of its own: a thread that unshares its
/// mount namespace, mounts its side of the volume there (the daemon
/// inherits the namespace) and runs the jobs it is sent, so that nothing
/// but the database and the store joins it to the other node.
struct NsNode {
    jobs: Option<std::sync::mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl NsNode {
    fn start(vol: std::path::PathBuf, mnt: std::path::PathBuf) -> NsNode {
        let (jobs, rx) = std::sync::mpsc::channel::<Job>();
        let (ready, up) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let mounted = (|| -> Result<Node, String> {
                // SAFETY: unshare(2) of this thread's mount namespace
                // (and with it its fs attributes); no memory involved.
                if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
                    let e = std::io::Error::last_os_error();
                    return Err(format!("unshare(CLONE_NEWNS): {e}"));
                }
                // Nothing mounted here propagates back to the test's
                // namespace, nor the other way.
                nix::mount::mount(
                    None::<&str>,
                    "/",
                    None::<&str>,
                    nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
                    None::<&str>,
                )
                .map_err(|e| format!("make / private: {e}"))?;
                Ok(Node::mount(vol, mnt))
            })();
            let mut node = match mounted {
                Ok(n) => {
                    ready.send(Ok(())).unwrap();
                    n
                }
                Err(e) => return ready.send(Err(e)).unwrap(),
            };
            for job in rx {
                job(&node.mnt);
            }
            // The sender is gone (the test ended or failed): unmount here,
            // where the mount is.
            node.unmount();
        });
        up.recv()
            .expect("the node's thread died")
            .unwrap_or_else(|e| panic!("{e}"));
        NsNode {
            jobs: Some(jobs),
            thread: Some(thread),
        }
    }

    /// Runs `f` with the mountpoint in the node's namespace; its result.
    fn run<T: Send + 'static>(&self, f: impl FnOnce(&std::path::Path) -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        let job = Box::new(move |mnt: &std::path::Path| {
            let _ = tx.send(f(mnt));
        });
        self.jobs.as_ref().unwrap().send(job).unwrap();
        rx.recv().expect("the job failed in the node's thread")
    }

    /// Unmounts (waiting for the daemon's exit) and ends the thread.
    fn stop(mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            t.join().expect("the node's unmount failed");
        }
    }
}

impl Drop for NsNode {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Two nodes, each a daemon in its own mount namespace with its own cache
/// directory: neither mount is visible to the other node nor to the test,
/// and files written and closed on each at the same time are read exactly
/// on the other.
#[test]
fn two_nodes_in_their_own_mount_namespaces_read_each_others_files() {
    let (dir, _cluster, conninfo) = shared_volume("ns");
    let (va, vb) = (dir.path().join("node-a"), dir.path().join("node-b"));
    safs(["attach", s(&vb), "--meta", &conninfo]).assert_success("safs attach");
    // One mountpoint path, a different mount in each namespace.
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let a = NsNode::start(va.clone(), mnt.clone());
    let b = NsNode::start(vb, mnt.clone());
    assert!(
        !is_fuse_mounted(&mnt),
        "a node's mount shows in the test's namespace"
    );
    for node in [&a, &b] {
        assert!(
            node.run(is_fuse_mounted),
            "a node does not see its own mount"
        );
    }
    const N: u8 = 30;
    let name = |tag: u8, i: u8| format!("n{tag}-{i}");
    let want = |tag: u8, i: u8| pattern(tag * 64 + i, 40_000 + usize::from(i) * 150_001);
    // Both nodes write at once.
    let writers: Vec<_> = [(&a, 1u8), (&b, 2u8)]
        .into_iter()
        .map(|(node, tag)| {
            let (tx, rx) = std::sync::mpsc::channel();
            node.jobs
                .as_ref()
                .unwrap()
                .send(Box::new(move |m: &std::path::Path| {
                    for i in 0..N {
                        fs::write(m.join(name(tag, i)), want(tag, i)).unwrap();
                    }
                    let _ = tx.send(());
                }))
                .unwrap();
            rx
        })
        .collect();
    for w in writers {
        w.recv().expect("a node's writes failed");
    }
    for (reader, tag) in [(&b, 1u8), (&a, 2u8)] {
        let bad = reader.run(move |m| {
            (0..N)
                .filter(|&i| {
                    !wait_until(Duration::from_secs(10), || {
                        fs::read(m.join(name(tag, i))).ok() == Some(want(tag, i))
                    })
                })
                .collect::<Vec<u8>>()
        });
        assert!(
            bad.is_empty(),
            "files of node {tag} read otherwise on the other: {bad:?}"
        );
    }
    a.stop();
    b.stop();
    safs(["fsck", s(&va), "--data-check"]).assert_success("fsck after both nodes");
}

#[test]
fn a_store_that_goes_away_fails_fsync_with_eio_and_heals_without_a_remount() {
    // A gateway of its own: the others' tests keep theirs.
    let dir = tempfile::Builder::new()
        .prefix("safs-s3-own")
        .tempdir_in("/tmp")
        .unwrap();
    let own = TempRgw::start(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    own.create_bucket("faults").unwrap();
    let safs_with = |args: &[&str]| {
        run_cmd(
            std::process::Command::new(env!("CARGO_BIN_EXE_safs"))
                .args(args)
                .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
                .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
                .env("AWS_ENDPOINT_URL", own.endpoint())
                .env("AWS_REGION", "us-east-1"),
        )
    };
    let (vol, mnt) = (dir.path().join("vol"), dir.path().join("mnt"));
    fs::create_dir(&mnt).unwrap();
    safs_with(&["format", s(&vol), "--data", "s3://faults/v"]).assert_success("format");
    safs_with(&["mount", s(&vol), s(&mnt), "-o", "data_timeout=3"]).assert_success("mount");
    let mut node = Node {
        vol: vol.clone(),
        mnt: mnt.clone(),
        mounted: true,
    };
    let before = pattern(9, 100_000);
    fs::write(node.path("before"), &before).unwrap();
    File::open(node.path("before")).unwrap().sync_all().unwrap();
    fs::write(node.path("gone"), pattern(10, 100_000)).unwrap();
    File::open(node.path("gone")).unwrap().sync_all().unwrap();
    let queued = || {
        let out = safs(["info".as_ref(), "--json".as_ref(), mnt.as_os_str()]);
        out.assert_success("safs info --json");
        let stats: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        stats["store"]["deletions_queued"].as_u64().unwrap()
    };
    assert_eq!(queued(), 0);

    own.stop_gateway().unwrap();
    // Its object cannot be deleted meanwhile: the deletion waits.
    fs::remove_file(node.path("gone")).unwrap();
    assert_eq!(queued(), 1);
    // Larger than what a record holds: it needs the store.
    let during = pattern(11, 100_000);
    let mut f = File::create(node.path("during")).unwrap();
    f.write_all(&during).unwrap();
    let t = std::time::Instant::now();
    let e = f.sync_all().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
    drop(f);
    // Closed, never synced: its upload at the close fails.
    let closed = pattern(12, 200_000);
    fs::write(node.path("closed"), &closed).unwrap();
    // What is cached reads on.
    assert_eq!(fs::read(node.path("before")).unwrap(), before);

    assert_eq!(queued(), 1, "deleted with the store away");
    own.start_gateway().unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || queued() == 0),
        "the deletion was not retried"
    );
    // The closed file goes up by itself once the store is back: no fsync,
    // no remount.
    let env = [
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
        ("AWS_ENDPOINT_URL", own.endpoint()),
        ("AWS_REGION", "us-east-1"),
    ];
    let lookup = move |k: &str| {
        env.iter()
            .find(|(ek, _)| *ek == k)
            .map(|(_, v)| v.to_string())
    };
    let config = StoreConfig::resolve("s3://faults/v", &lookup, None).unwrap();
    let store = Store::new(config, Limits::default()).unwrap();
    let ino = std::os::unix::fs::MetadataExt::ino(&fs::metadata(node.path("closed")).unwrap());
    let mine = format!("b/{:02x}/{ino:016x}/", ino & 0xff);
    assert!(
        wait_until(Duration::from_secs(30), || objects(&store)
            .iter()
            .any(|(k, _)| k.starts_with(&mine))),
        "the closed file's upload was not retried: {:?}",
        objects(&store)
    );
    let f = OpenOptions::new()
        .append(true)
        .open(node.path("during"))
        .unwrap();
    (&f).write_all(b", and after").unwrap();
    f.sync_all().unwrap();
    drop(f);
    node.unmount();
    store::lose_cache(&vol);
    safs_with(&["mount", s(&vol), s(&mnt)]).assert_success("mount again");
    node.mounted = true;
    let mut want = during;
    want.extend_from_slice(b", and after");
    assert_eq!(fs::read(node.path("during")).unwrap(), want);
    assert_eq!(fs::read(node.path("closed")).unwrap(), closed);
    node.unmount();
}

/// [`lose_cache`] of the volume directory `vol`.
#[test]
fn a_damaged_object_is_an_error_never_served() {
    let url = bucket("damage");
    let mut v = volume(&url, &[]);
    fs::write(v.path("f"), pattern(10, 5 * MIB)).unwrap();
    v.unmount();
    let store = client(&url);
    let listed = objects(&store);
    assert_eq!(listed.len(), 2);
    // The second block's object, same length, one byte changed; then
    // its bytes with more after them, and cut short.
    let good = store.get(&listed[1].0).unwrap();
    let mut flipped = good.clone();
    flipped[100] ^= 1;
    let mut longer = good.clone();
    longer.extend_from_slice(b"and more");
    let shorter = good[..good.len() - 1].to_vec();
    for bad in [flipped, longer, shorter] {
        store.put(&listed[1].0, bad).unwrap();
        lose_cache(&v);
        v.mount();
        // A writer's open fetches the whole file first; a reader's reads
        // fetch the blocks they touch.
        let e = fs::OpenOptions::new()
            .append(true)
            .open(v.path("f"))
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
        let e = fs::read(v.path("f")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
        assert!(v.daemon_log().contains("does not match its block record"));
        v.unmount();
    }
    store.put(&listed[1].0, good).unwrap();
    v.mount();
    assert_eq!(fs::read(v.path("f")).unwrap(), pattern(10, 5 * MIB));
}

#[test]
fn fsck_checks_the_store_against_the_block_maps_and_repairs_from_the_cache() {
    let url = bucket("fsck");
    let mut v = volume(&url, &[]);
    fs::write(v.path("a"), pattern(20, 5 * MIB)).unwrap();
    fs::write(v.path("b"), pattern(21, MIB)).unwrap();
    v.unmount();
    let store = client(&url);
    let listed = objects(&store);
    assert_eq!(listed.len(), 3, "{listed:?}");
    let out = safs(["fsck", "--data-check", s(v.vol())]);
    out.assert_success("fsck --data-check of a clean volume");

    // One object gone, one changed in place (same length), and one that no
    // record names (an upload cut short leaves such).
    store.delete(&listed[0].0).unwrap();
    let mut bytes = store.get(&listed[1].0).unwrap();
    bytes[7] ^= 0x40;
    store.put(&listed[1].0, bytes).unwrap();
    let stray = "b/99/0000000000000099/00000000.0000000000000007";
    store.put(stray, vec![1; 100]).unwrap();

    // Without --data-check the changed bytes go unseen; the rest is said.
    let out = safs(["fsck", s(v.vol())]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(
        out.stdout
            .contains("is missing from the store; the local cache holds its bytes"),
        "{out:?}"
    );
    assert!(!out.stdout.contains("damaged"), "{out:?}");
    assert!(
        out.stdout.contains(&format!(
            "leftover: object {stray} (100 bytes) is named by no block record"
        )),
        "{out:?}"
    );
    let out = safs(["fsck", "--data-check", s(v.vol())]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(
        out.stdout
            .contains("does not match its record's hash (damaged)"),
        "{out:?}"
    );
    assert_eq!(
        objects(&store).len(),
        3,
        "a check without --repair changes nothing"
    );

    // Repair: both blocks uploaded again from the cache, the stray deleted.
    let out = safs(["fsck", "--repair", "--data-check", s(v.vol())]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        out.stdout
            .matches("uploaded again from the local cache")
            .count(),
        2,
        "{out:?}"
    );
    assert_eq!(objects(&store), listed);
    safs(["fsck", "--data-check", s(v.vol())]).assert_success("fsck after the repair");
    lose_cache(&v);
    v.mount();
    assert_eq!(fs::read(v.path("a")).unwrap(), pattern(20, 5 * MIB));
    assert_eq!(fs::read(v.path("b")).unwrap(), pattern(21, MIB));
    v.unmount();

    // With no cache to take it from, a lost object is lost data: said, not
    // repairable.
    lose_cache(&v);
    store.delete(&listed[2].0).unwrap();
    let out = safs(["fsck", "--repair", s(v.vol())]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(
        out.stdout
            .contains("no cache holds its bytes: that block reads as an error"),
        "{out:?}"
    );

    // A store fsck cannot reach: nothing checked, an operational error.
    let out = run_cmd(
        std::process::Command::new(env!("CARGO_BIN_EXE_safs"))
            .args(["fsck", s(v.vol())])
            .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9"),
    );
    assert_eq!(out.status.code(), Some(8), "{out:?}");
    assert!(
        out.stderr.contains("nothing was checked or changed"),
        "{out:?}"
    );
}

/// Bytes the backing files in the volume's cache take on disk.
fn cached_bytes(vol: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut n = 0;
    for d in fs::read_dir(vol.join("data")).unwrap().flatten() {
        for f in fs::read_dir(d.path()).unwrap().flatten() {
            n += f.metadata().map_or(0, |m| m.blocks() * 512);
        }
    }
    n
}

/// The daemon's figures of its store and cache (`safs info --json`).
fn store_stats(v: &TestVolume) -> serde_json::Value {
    let out = safs(["info".as_ref(), "--json".as_ref(), v.mnt().as_os_str()]);
    out.assert_success("safs info --json");
    let stats: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    stats["store"].clone()
}

#[test]
fn the_cache_stays_within_its_bound_and_never_drops_an_open_file() {
    const BOUND: u64 = 8 << 20;
    let url = bucket("bound");
    let mut v = TestVolume::formatted(&["--data", &url]);
    v.set_options(&["cache_size=8M"]);
    v.mount();
    fs::write(v.path("held"), pattern(30, 3 * MIB)).unwrap();
    let held = File::open(v.path("held")).unwrap();
    for i in 0..5u8 {
        fs::write(v.path(format!("f{i}")), pattern(40 + i, 3 * MIB)).unwrap();
    }
    // Closes reach the daemon after the writers' close returns.
    let settled = wait_until(Duration::from_secs(10), || {
        store_stats(&v)["evicted_files"].as_u64().unwrap() >= 3
    });
    let st = store_stats(&v);
    assert!(settled, "{st}");
    assert_eq!(st["cache_limit_bytes"].as_u64(), Some(BOUND), "{st}");
    assert!(st["cache_bytes"].as_u64().unwrap() <= BOUND, "{st}");
    // The open file is not counted, and not dropped: its 3 MiB are on top.
    assert!(cached_bytes(v.vol()) <= BOUND + 3 * MIB as u64, "{st}");
    let mut buf = vec![0u8; 3 * MIB];
    held.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, pattern(30, 3 * MIB));

    // The dropped files come back from the store, whole.
    let misses = st["misses"].as_u64().unwrap();
    for i in 0..5u8 {
        assert_eq!(
            fs::read(v.path(format!("f{i}"))).unwrap(),
            pattern(40 + i, 3 * MIB)
        );
    }
    let st = store_stats(&v);
    assert!(st["misses"].as_u64().unwrap() >= misses + 3, "{st}");
    assert!(
        st["fetched_bytes"].as_u64().unwrap() >= 9 * MIB as u64,
        "{st}"
    );
    drop(held);
    let info = safs(["info", "--stats", s(v.mnt())]);
    info.assert_success("safs info --stats");
    assert!(info.stdout.contains("data cache:"), "{}", info.stdout);

    // A mount with a smaller bound trims what the last one kept.
    v.unmount();
    v.set_options(&["cache_size=4M"]);
    v.mount();
    assert!(
        cached_bytes(v.vol()) <= 4 << 20,
        "{}",
        cached_bytes(v.vol())
    );
    for i in 0..5u8 {
        assert_eq!(
            fs::read(v.path(format!("f{i}"))).unwrap(),
            pattern(40 + i, 3 * MIB)
        );
    }
    assert_eq!(fs::read(v.path("held")).unwrap(), pattern(30, 3 * MIB));
    v.unmount();
    safs(["fsck", s(v.vol())]).assert_success("fsck after the cache was trimmed");

    let spare = tempfile::tempdir().unwrap();
    let out = safs(["mount", s(v.vol()), s(spare.path()), "-o", "cache_size=12Q"]);
    out.assert_failure_with_message("a mount with cache_size=12Q");
    assert!(out.stderr.contains("cache_size"), "{}", out.stderr);
}

#[test]
fn a_local_volume_moves_its_contents_into_the_store_in_place() {
    let url = bucket("migrate");
    let mut v = TestVolume::new();
    fs::write(v.path("big"), pattern(50, 9 * MIB + 5)).unwrap();
    fs::write(v.path("small"), b"tiny").unwrap();
    let f = File::create(v.path("sparse")).unwrap();
    f.write_all_at(b"end", 12 * MIB as u64).unwrap();
    drop(f);
    fs::create_dir(v.path("d")).unwrap();
    fs::write(v.path("d/x"), pattern(51, 100_000)).unwrap();
    setxattr(&v.path("d/x"), "user.k", b"v", 0).unwrap();
    let before = tree_of(v.mnt());
    v.unmount();

    let out = safs(["migrate", s(v.vol()), "--data", &url]);
    out.assert_success("safs migrate --data");
    assert!(out.stdout.contains("4 files uploaded"), "{}", out.stdout);
    // big: 3 blocks, sparse: its last, d/x: 1; small lives in its record.
    let store = client(&url);
    assert_eq!(objects(&store).len(), 5, "{:?}", objects(&store));
    let info = safs(["info", s(v.vol())]);
    assert!(
        info.stdout.contains("in the object store at"),
        "{}",
        info.stdout
    );
    safs(["fsck", "--data-check", s(v.vol())]).assert_success("fsck after the move");

    // data/ is a cache now: thrown away, everything comes back.
    lose_cache(&v);
    v.mount();
    assert_eq!(tree_of(v.mnt()), before);
    v.unmount();
    safs(["migrate", s(v.vol()), "--data", &url])
        .assert_failure_with_message("a second move into a store");
}

#[test]
fn an_encrypted_volume_moves_into_the_store_without_its_passphrase() {
    let url = bucket("migrate-enc");
    let dir = tempfile::tempdir().unwrap();
    let pass = dir.path().join("pass");
    fs::write(&pass, "correct horse").unwrap();
    let mut v =
        TestVolume::formatted(&["--encrypt", "--passphrase-file", s(&pass), "--kdf-testing"]);
    v.set_options(&[&format!("passphrase_file={}", pass.display())]);
    v.mount();
    fs::write(v.path("f"), pattern(60, 5 * MIB)).unwrap();
    v.unmount();
    let out = run_cmd(
        std::process::Command::new(SAFS)
            .args(["migrate", s(v.vol()), "--data", &url])
            .env_remove("SAFS_PASSPHRASE_FILE"),
    );
    out.assert_success("safs migrate --data of an encrypted volume");
    assert!(
        out.stdout.contains("its first mount uploads them"),
        "{}",
        out.stdout
    );
    let store = client(&url);
    assert!(objects(&store).is_empty());
    // The first mount uploads; then the cache can go.
    v.mount();
    v.unmount();
    assert_eq!(objects(&store).len(), 2);
    lose_cache(&v);
    v.mount();
    assert_eq!(fs::read(v.path("f")).unwrap(), pattern(60, 5 * MIB));
}

/// A read-only open of a file the cache lacks does not wait for the whole
/// file: each read brings in the blocks it touches, checked as a whole
/// fetch checks them, while the rest comes in behind (so a damaged block
/// fails the reads of it, not the open and the reads elsewhere); every
/// block is fetched once; a writer's open and an `lseek` for holes finish
/// the file; once whole it is marked current and never fetched again.
/// Plain and encrypted.
#[test]
fn a_large_file_is_read_before_it_is_wholly_fetched() {
    const BLOCK: usize = 4 * MIB;
    for sealed in [false, true] {
        let url = bucket(if sealed { "part-sealed" } else { "part" });
        let root = tempfile::tempdir().unwrap();
        let pass = root.path().join("pass");
        fs::write(&pass, "a passphrase for the fill test\n").unwrap();
        let mut args = vec!["--data", url.as_str()];
        if sealed {
            args.extend(["--encrypt", "--passphrase-file", s(&pass), "--kdf-testing"]);
        }
        let mut v = TestVolume::formatted(&args);
        if sealed {
            v.set_options(&[&format!("passphrase_file={}", s(&pass))]);
        }
        // The plaintext offset whose bytes lie at `backing` in the backing
        // file (sealed: 4,096-byte units of 4,068 plaintext bytes).
        let plain = |backing: usize| {
            if sealed {
                backing / 4096 * 4068
            } else {
                backing
            }
        };
        v.mount();
        let data = pattern(50, 16 * BLOCK + 1000);
        fs::write(v.path("big"), &data).unwrap();
        fs::write(v.path("seq"), &data[..10 * BLOCK]).unwrap();
        let ino = std::os::unix::fs::MetadataExt::ino(&fs::metadata(v.path("big")).unwrap());
        v.unmount();

        // Block 15 of big damaged in the store.
        let store = client(&url);
        let key = objects(&store)
            .into_iter()
            .map(|(k, _)| k)
            .find(|k| k.starts_with(&format!("b/{:02x}/{ino:016x}/0000000f.", ino & 0xff)))
            .expect("block 15 of big");
        let good = store.get(&key).unwrap();
        let mut bad = good.clone();
        bad[1000] ^= 1;
        store.put(&key, bad).unwrap();
        lose_cache(&v);
        v.mount();
        let fetched = |v: &TestVolume| store_stats(v)["fetched_blocks"].as_u64().unwrap();

        let f = File::open(v.path("big")).unwrap();
        let mut buf = vec![0u8; 4096];
        for at in [plain(12 * BLOCK + 77), plain(3 * BLOCK + 5), 0] {
            f.read_exact_at(&mut buf, at as u64).unwrap();
            assert!(buf == data[at..at + 4096], "4 KiB at {at} differ");
        }
        let e = f
            .read_exact_at(&mut buf, plain(15 * BLOCK + BLOCK / 2) as u64)
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
        // Holes are known once the file is whole: it cannot be; the reads
        // of other blocks go on.
        let e = nix::unistd::lseek(&f, 0, nix::unistd::Whence::SeekHole).unwrap_err();
        assert_eq!(e, nix::errno::Errno::EIO);
        let at = plain(16 * BLOCK);
        f.read_exact_at(&mut buf[..500], at as u64).unwrap();
        assert!(buf[..500] == data[at..at + 500]);
        drop(f);
        assert!(v.daemon_log().contains("does not match its block record"));

        // Mended: read whole (what came in before is kept).
        store.put(&key, good).unwrap();
        let before = fetched(&v);
        let f = File::open(v.path("big")).unwrap();
        let hole = nix::unistd::lseek(&f, 0, nix::unistd::Whence::SeekHole).unwrap();
        assert_eq!(hole as usize, data.len());
        nix::unistd::lseek(&f, 0, nix::unistd::Whence::SeekSet).unwrap();
        let mut whole = Vec::new();
        std::io::Read::read_to_end(&mut &f, &mut whole).unwrap();
        assert!(whole == data, "the whole file differs");
        drop(f);
        assert!(fetched(&v) - before < 17, "{before} then {}", fetched(&v));

        // A reader going forward while the rest comes in behind.
        let before = fetched(&v);
        let mut seq = Vec::new();
        std::io::Read::read_to_end(&mut File::open(v.path("seq")).unwrap(), &mut seq).unwrap();
        assert!(seq == data[..10 * BLOCK], "the sequential read differs");
        let blocks = if sealed { 11 } else { 10 };
        assert_eq!(fetched(&v) - before, blocks, "every block once");
        // Marked current by the last read: opened again, nothing fetched.
        let mut again = Vec::new();
        std::io::Read::read_to_end(&mut File::open(v.path("seq")).unwrap(), &mut again).unwrap();
        assert!(again == seq);
        assert_eq!(fetched(&v) - before, blocks);

        // A writer's open while a reader fills finishes the file first.
        v.unmount();
        lose_cache(&v);
        v.mount();
        let r = File::open(v.path("big")).unwrap();
        r.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(buf, data[..4096]);
        let w = OpenOptions::new().write(true).open(v.path("big")).unwrap();
        w.write_all_at(b"written", 9 * BLOCK as u64).unwrap();
        drop(w);
        let mut want = data.clone();
        want[9 * BLOCK..9 * BLOCK + 7].copy_from_slice(b"written");
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut &r, &mut got).unwrap();
        assert!(got == want, "a reader's view after the write differs");
        drop(r);
        v.unmount();
        lose_cache(&v);
        v.mount();
        assert!(fs::read(v.path("big")).unwrap() == want);
        v.unmount();
    }
}
