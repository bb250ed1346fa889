//! Encrypted volumes from the command line: `format --encrypt`, mounting
//! with a passphrase file (flag, `-o passphrase_file=`, `mount -t
//! fuse.safs`), a wrong or missing passphrase changing nothing, `passwd`
//! (also killed at any moment), `info`, passthrough refused, and nothing
//! written in the clear: names, contents, xattrs and symlink targets.
//!
//! Every volume is formatted with `--kdf-testing` (cheap Argon2id) so that
//! the tests stay fast.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// Passphrase files, outside every volume.
struct Secrets {
    dir: tempfile::TempDir,
}

impl Secrets {
    fn new() -> Secrets {
        Secrets {
            dir: tempfile::tempdir_in("/tmp").unwrap(),
        }
    }

    /// A file holding `contents`, named `name`.
    fn file(&self, name: &str, contents: &[u8]) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, contents).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        p
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A formatted, unmounted encrypted volume whose passphrase is in `pass`,
/// set to mount with `-o passphrase_file=<pass>`.
fn encrypted(pass: &Path) -> TestVolume {
    let mut v =
        TestVolume::formatted(&["--encrypt", "--passphrase-file", s(pass), "--kdf-testing"]);
    v.set_options(&[&format!("passphrase_file={}", pass.display())]);
    v
}

/// `safs mount` of `v` with `args` after the volume and mountpoint. On
/// success the test volume takes charge of the mount.
fn mount_with(v: &mut TestVolume, args: &[&str]) -> CmdOutput {
    let out = safs(
        ["mount", s(v.vol()), s(v.mnt())]
            .iter()
            .chain(args)
            .collect::<Vec<_>>(),
    );
    if out.success() {
        v.adopt_mount();
    }
    out
}

/// What a file holds on disk: its length, when it was last written and
/// its data extents (LMDB's data file is sparse and as large as its map:
/// holes are not read).
#[derive(PartialEq, Eq)]
struct OnDisk {
    len: u64,
    mtime: std::time::SystemTime,
    extents: Vec<(u64, Vec<u8>)>,
}

fn on_disk(path: &Path) -> OnDisk {
    let mut f = std::fs::File::open(path).unwrap();
    let meta = f.metadata().unwrap();
    let len = meta.len();
    let mut extents = Vec::new();
    let mut pos = 0i64;
    while (pos as u64) < len {
        let Ok(data) = nix::unistd::lseek(&f, pos, nix::unistd::Whence::SeekData) else {
            break;
        };
        let hole = nix::unistd::lseek(&f, data, nix::unistd::Whence::SeekHole).unwrap();
        f.seek(SeekFrom::Start(data as u64)).unwrap();
        let mut buf = vec![0; (hole - data) as usize];
        f.read_exact(&mut buf).unwrap();
        extents.push((data as u64, buf));
        pos = hole;
    }
    OnDisk {
        len,
        mtime: meta.modified().unwrap(),
        extents,
    }
}

type Snapshot = BTreeMap<PathBuf, Option<OnDisk>>;

/// Every regular file under `dir` (relative path → what it holds on disk),
/// and every directory (with `None`).
fn snapshot(dir: &Path) -> Snapshot {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            let rel = e.path().strip_prefix(dir).unwrap().to_path_buf();
            if t.is_dir() {
                todo.push(e.path());
                out.insert(rel, None);
            } else if t.is_file() {
                out.insert(rel, Some(on_disk(&e.path())));
            }
        }
    }
    out
}

/// Every file of the volume, LMDB's lock file included: a refused mount
/// opens the engine with neither its lock file nor its reader table
/// (`MDB_RDONLY | MDB_NOLOCK`), so not one byte or mtime may change.
fn snapshot_of_volume(vol: &Path) -> Snapshot {
    let snap = snapshot(vol);
    assert!(snap.contains_key(Path::new("meta/data.mdb")));
    assert!(
        snap.contains_key(Path::new("meta/lock.mdb")),
        "LMDB's lock file is where expected"
    );
    snap
}

/// Fails, naming what differs, unless the volume is as in `before`.
#[track_caller]
fn assert_unchanged(vol: &Path, before: &Snapshot, after_what: &str) {
    assert_same(before, &snapshot_of_volume(vol), after_what);
}

#[track_caller]
fn assert_same(before: &Snapshot, now: &Snapshot, after_what: &str) {
    let changed: Vec<&PathBuf> = before
        .keys()
        .chain(now.keys())
        .filter(|p| before.get(*p) != now.get(*p))
        .collect();
    assert!(
        changed.is_empty(),
        "{after_what} changed the volume: {changed:?}"
    );
}

/// The files of `dir` (relative paths) whose bytes on disk contain `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    snapshot(dir)
        .into_iter()
        .filter_map(|(p, d)| {
            let d = d?;
            let mut all = Vec::new();
            for (_, bytes) in &d.extents {
                all.extend_from_slice(bytes);
            }
            all.windows(needle.len()).any(|w| w == needle).then_some(p)
        })
        .collect()
}

/// A tree whose names, contents, xattr names and values and symlink
/// targets all contain `mark`.
fn populate(v: &TestVolume, mark: &str) {
    let dir = v.path(format!("dir-{mark}"));
    std::fs::create_dir(&dir).unwrap();
    write_file(&dir.join(format!("small-{mark}")), mark.as_bytes());
    // Several blocks, the last one partial.
    write_file(
        &dir.join(format!("big-{mark}")),
        mark.repeat(20_000 / mark.len()).as_bytes(),
    );
    std::os::unix::fs::symlink(format!("target-{mark}"), dir.join(format!("link-{mark}"))).unwrap();
    std::os::unix::fs::symlink(
        format!("{mark}/").repeat(100),
        dir.join(format!("longlink-{mark}")),
    )
    .unwrap();
    std::fs::hard_link(
        dir.join(format!("small-{mark}")),
        v.path(format!("hard-{mark}")),
    )
    .unwrap();
    let f = dir.join(format!("small-{mark}"));
    // Inline, spilled and large xattrs, with the mark in names and values.
    setxattr(&f, &format!("user.inline-{mark}"), mark.as_bytes(), 0).unwrap();
    for i in 0..40 {
        setxattr(
            &f,
            &format!("user.many-{i}-{mark}"),
            mark.repeat(8).as_bytes(),
            0,
        )
        .unwrap();
    }
    setxattr(
        &f,
        &format!("user.large-{mark}"),
        mark.repeat(30_000 / mark.len()).as_bytes(),
        0,
    )
    .unwrap();
    lsetxattr(
        &dir.join(format!("link-{mark}")),
        &format!("trusted.{mark}"),
        mark.as_bytes(),
        0,
    )
    .unwrap();
}

/// Checks what [`populate`] made reads back the same.
fn verify(v: &TestVolume, mark: &str) {
    let dir = v.path(format!("dir-{mark}"));
    let mut names = list_dir(&dir);
    names.sort();
    let mut want = vec![
        format!("big-{mark}"),
        format!("link-{mark}"),
        format!("longlink-{mark}"),
        format!("small-{mark}"),
    ];
    want.sort();
    assert_eq!(names, want);
    let small = dir.join(format!("small-{mark}"));
    assert_eq!(read_file(&small), mark.as_bytes());
    assert_eq!(read_file(&v.path(format!("hard-{mark}"))), mark.as_bytes());
    assert_bytes_eq(
        &read_file(&dir.join(format!("big-{mark}"))),
        mark.repeat(20_000 / mark.len()).as_bytes(),
        "big file",
    );
    assert_eq!(
        std::fs::read_link(dir.join(format!("link-{mark}"))).unwrap(),
        PathBuf::from(format!("target-{mark}"))
    );
    assert_eq!(
        std::fs::read_link(dir.join(format!("longlink-{mark}"))).unwrap(),
        PathBuf::from(format!("{mark}/").repeat(100))
    );
    assert_eq!(
        getxattr(&small, &format!("user.inline-{mark}")).unwrap(),
        mark.as_bytes()
    );
    assert_eq!(
        getxattr(&small, &format!("user.many-39-{mark}")).unwrap(),
        mark.repeat(8).as_bytes()
    );
    assert_eq!(
        getxattr(&small, &format!("user.large-{mark}")).unwrap(),
        mark.repeat(30_000 / mark.len()).as_bytes()
    );
    assert_eq!(listxattr(&small).unwrap().len(), 42);
    assert_eq!(
        lgetxattr(
            &dir.join(format!("link-{mark}")),
            &format!("trusted.{mark}")
        )
        .unwrap(),
        mark.as_bytes()
    );
}

/// A mark no volume holds by chance.
fn unique_mark() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("MARK{:x}{:x}", nanos, std::process::id())
}

#[test]
fn an_encrypted_volume_keeps_names_contents_xattrs_and_links_across_remounts() {
    let secrets = Secrets::new();
    let pass = secrets.file("pass", b"correct horse battery staple\n");
    let root = tempfile::tempdir_in("/tmp").unwrap();
    let out = safs([
        "format",
        s(&root.path().join("vol")),
        "--encrypt",
        "--passphrase-file",
        s(&pass),
        "--kdf-testing",
    ]);
    out.assert_success("safs format --encrypt");
    assert!(
        out.stdout.contains("encrypted") && out.stdout.contains("AES-256"),
        "format says the volume is encrypted: {}",
        out.stdout
    );

    let mut v = encrypted(&pass);
    v.mount();
    let mark = unique_mark();
    populate(&v, &mark);
    verify(&v, &mark);
    v.remount();
    verify(&v, &mark);
    v.unmount();

    // The flag works as the option does.
    mount_with(&mut v, &["--passphrase-file", s(&pass)]).assert_success("mount --passphrase-file");
    verify(&v, &mark);
    v.unmount();
}

#[test]
fn nothing_is_written_in_the_clear() {
    let secrets = Secrets::new();
    let mark = unique_mark();
    // The passphrase holds the mark too: it must not be written anywhere.
    let pass = secrets.file("pass", format!("passphrase {mark}").as_bytes());

    // The search finds the mark on a plain volume: names, contents, xattrs.
    let mut plain = TestVolume::new();
    populate(&plain, &mark);
    plain.unmount();
    let found = files_containing(plain.vol(), mark.as_bytes());
    assert!(
        found.iter().any(|p| p.starts_with("meta")) && found.iter().any(|p| p.starts_with("data")),
        "the search sees a plain volume's names and contents: {found:?}"
    );

    let mut v = encrypted(&pass);
    v.mount();
    populate(&v, &mark);
    verify(&v, &mark);
    v.unmount();
    let found = files_containing(v.vol(), mark.as_bytes());
    assert!(
        found.is_empty(),
        "the mark is in the clear on an encrypted volume in {found:?}"
    );
    // The daemon's log was among the files searched.
    let log = std::fs::read_to_string(v.vol().join("safs.log")).unwrap();
    assert!(log.contains("mounted"), "the daemon logged: {log}");
}

#[test]
fn a_wrong_passphrase_fails_the_mount_and_changes_nothing() {
    let secrets = Secrets::new();
    let pass = secrets.file("pass", b"right");
    let wrong = secrets.file("wrong", b"wrong");
    let mut v = encrypted(&pass);
    // A volume that has been mounted: a log, backing files, a lock file.
    v.mount();
    write_file(&v.path("f"), b"contents");
    v.unmount();
    let before = snapshot_of_volume(v.vol());
    assert!(before.contains_key(Path::new("lock")));
    assert!(before.contains_key(Path::new("safs.log")));

    let opt = format!("passphrase_file={}", wrong.display());
    for args in [
        vec!["--passphrase-file", s(&wrong)],
        vec!["-o", &opt],
        vec!["-f", "-o", &opt],
    ] {
        let start = Instant::now();
        let out = mount_with(&mut v, &args);
        out.assert_failure_with_message("mount with a wrong passphrase");
        assert_eq!(out.status.code(), Some(1), "{args:?}: exit 1");
        assert!(
            out.stderr.contains(&format!(
                "wrong passphrase for volume {}",
                v.vol().display()
            )),
            "{args:?}: {}",
            out.stderr
        );
        assert!(start.elapsed() < Duration::from_secs(10), "{args:?}: quick");
        assert!(!is_fuse_mounted(v.mnt()));
        assert_unchanged(v.vol(), &before, &format!("mount {args:?}"));
    }
    v.mount();
    assert_eq!(read_file(&v.path("f")), b"contents");
}

#[test]
fn a_missing_empty_or_unreadable_passphrase_file_fails_clearly_and_changes_nothing() {
    let secrets = Secrets::new();
    let pass = secrets.file("pass", b"right");
    let empty = secrets.file("empty", b"\n");
    let mut v = encrypted(&pass);
    v.mount();
    v.unmount();
    let before = snapshot_of_volume(v.vol());

    let missing = secrets.dir.path().join("missing");
    // A directory: unreadable as a file, even by root.
    let unreadable = secrets.dir.path().to_path_buf();
    for (file, says) in [
        (&missing, "cannot read passphrase file"),
        (&empty, "is empty"),
        (&unreadable, "cannot read passphrase file"),
    ] {
        let out = mount_with(&mut v, &["--passphrase-file", s(file)]);
        out.assert_failure_with_message("mount with a bad passphrase file");
        assert!(
            out.stderr.contains(says) && out.stderr.contains(s(file)),
            "{}: {}",
            file.display(),
            out.stderr
        );
        assert_unchanged(
            v.vol(),
            &before,
            &format!("--passphrase-file {}", file.display()),
        );
    }

    // No file and no terminal to ask on (setsid: no controlling terminal).
    let out = run_cmd(
        Command::new("setsid")
            .args(["-w", SAFS, "mount", s(v.vol()), s(v.mnt())])
            .env_remove("SAFS_PASSPHRASE_FILE"),
    );
    out.assert_failure_with_message("mount without a passphrase or a terminal");
    assert!(out.stderr.contains("--passphrase-file"), "{}", out.stderr);
    assert_unchanged(v.vol(), &before, "mount without a passphrase");
    assert!(!is_fuse_mounted(v.mnt()));

    // The environment variable names a passphrase file too.
    let out = run_cmd(
        Command::new(SAFS)
            .args(["mount", s(v.vol()), s(v.mnt())])
            .env("SAFS_PASSPHRASE_FILE", &pass),
    );
    out.assert_success("mount with SAFS_PASSPHRASE_FILE");
    v.adopt_mount();
    v.unmount();

    // format --encrypt: the same refusals, and no volume left behind.
    let new_vol = v.root().join("new");
    let out = run_cmd(
        Command::new("setsid")
            .args([
                "-w",
                SAFS,
                "format",
                s(&new_vol),
                "--encrypt",
                "--kdf-testing",
            ])
            .env_remove("SAFS_PASSPHRASE_FILE"),
    );
    out.assert_failure_with_message("format --encrypt without a passphrase or a terminal");
    assert!(out.stderr.contains("--passphrase-file"), "{}", out.stderr);
    safs([
        "format",
        s(&new_vol),
        "--encrypt",
        "--passphrase-file",
        s(&empty),
    ])
    .assert_failure_with_message("format --encrypt with an empty passphrase file");
    assert!(!new_vol.exists(), "a failed format leaves nothing");
    let out = safs(["format", s(&new_vol), "--passphrase-file", s(&pass)]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "--passphrase-file needs --encrypt"
    );
    assert!(out.stderr.contains("--encrypt"), "{}", out.stderr);
    assert!(!new_vol.exists());
}

#[test]
fn a_passphrase_for_a_plain_volume_and_passthrough_for_an_encrypted_one_are_refused() {
    let secrets = Secrets::new();
    let pass = secrets.file("pass", b"pass");
    let mut plain = TestVolume::formatted(&[]);
    let out = mount_with(
        &mut plain,
        &["-o", &format!("passphrase_file={}", pass.display())],
    );
    out.assert_failure_with_message("passphrase_file= for a plain volume");
    assert!(out.stderr.contains("not encrypted"), "{}", out.stderr);
    let out = safs(["passwd", s(plain.vol()), "--passphrase-file", s(&pass)]);
    out.assert_failure_with_message("passwd of a plain volume");
    assert!(out.stderr.contains("not encrypted"), "{}", out.stderr);
    assert!(!is_fuse_mounted(plain.mnt()));

    let mut v = encrypted(&pass);
    let out = mount_with(
        &mut v,
        &[
            "-o",
            &format!("passthrough,passphrase_file={}", pass.display()),
        ],
    );
    out.assert_failure_with_message("passthrough on an encrypted volume");
    assert!(
        out.stderr
            .contains("encrypted volumes cannot use passthrough"),
        "{}",
        out.stderr
    );
    assert!(!is_fuse_mounted(v.mnt()));
    // The default data path (Auto) serves it through the daemon.
    v.mount();
    write_file(&v.path("f"), &pattern(7, 100_000));
    v.remount();
    assert_bytes_eq(&read_file(&v.path("f")), &pattern(7, 100_000), "contents");
}

#[test]
fn info_says_how_a_volume_is_encrypted() {
    let secrets = Secrets::new();
    let pass = secrets.file("pass", b"pass");
    let mut v = encrypted(&pass);
    let info = |path: &Path| {
        let out = safs(["info", s(path)]);
        out.assert_success("safs info");
        out.stdout
    };
    for text in [info(v.vol()), {
        v.mount();
        info(v.mnt())
    }] {
        let line = text
            .lines()
            .find(|l| l.starts_with("encryption:"))
            .unwrap_or_else(|| panic!("no encryption line: {text}"));
        for part in [
            "AES-256-SIV",
            "AES-256-GCM-SIV",
            "AES-256-GCM",
            "4 KiB",
            "Argon2id m=8192 KiB t=1 p=1",
        ] {
            assert!(line.contains(part), "{part} missing: {line}");
        }
        assert!(
            text.contains("inodes:") && text.contains("sealed"),
            "{text}"
        );
    }
    let plain = TestVolume::formatted(&[]);
    assert!(
        info(plain.vol())
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["encryption:", "none"]),
        "a plain volume says so"
    );
}

#[test]
fn mount_t_fuse_safs_takes_a_passphrase_file_option() {
    let secrets = Secrets::new();
    let pass = secrets.file("pass", b"pass");
    let wrong = secrets.file("wrong", b"wrong");
    let mut v = encrypted(&pass);
    v.mount();
    write_file(&v.path("f"), b"through mount(8)");
    v.unmount();
    let mount_t = |file: &Path| {
        let _h = MountHelper::install();
        run_cmd(
            Command::new("mount")
                .args(["-t", "fuse.safs", s(v.vol()), s(v.mnt())])
                .args(["-o", &format!("passphrase_file={}", file.display())]),
        )
    };
    let out = mount_t(&wrong);
    out.assert_failure_with_message("mount -t fuse.safs with a wrong passphrase");
    assert!(
        out.stderr.contains("wrong passphrase for volume"),
        "{}",
        out.stderr
    );
    assert!(!is_fuse_mounted(v.mnt()));
    mount_t(&pass).assert_success("mount -t fuse.safs -o passphrase_file=");
    v.adopt_mount();
    assert_eq!(read_file(&v.path("f")), b"through mount(8)");
}

/// Whether the volume mounts with the passphrase in `pass` (and then its
/// file `f` reads back); false only when the passphrase is refused as wrong.
fn mounts_with(v: &mut TestVolume, pass: &Path) -> bool {
    let out = mount_with(v, &["--passphrase-file", s(pass)]);
    if !out.success() {
        assert!(
            out.stderr.contains("wrong passphrase for volume"),
            "mount failed for another reason: {}",
            out.stderr
        );
        return false;
    }
    assert_eq!(read_file(&v.path("f")), b"survives");
    v.unmount();
    true
}

#[test]
fn passwd_changes_the_passphrase_and_refuses_what_it_must() {
    let secrets = Secrets::new();
    let old = secrets.file("old", b"old");
    let new = secrets.file("new", b"new");
    let mut v = encrypted(&old);
    v.mount();
    write_file(&v.path("f"), b"survives");

    let vol = v.vol().to_path_buf();
    let passwd = |cur: &Path, next: &Path| {
        safs([
            "passwd",
            s(&vol),
            "--passphrase-file",
            s(cur),
            "--new-passphrase-file",
            s(next),
            "--kdf-testing",
        ])
    };
    let out = passwd(&old, &new);
    out.assert_failure_with_message("passwd of a mounted volume");
    assert!(out.stderr.contains("already mounted"), "{}", out.stderr);
    v.unmount();

    // passwd takes the volume's lock (as fsck does) and opens the engine
    // for writing before it reads the passphrase: the lock files (the
    // volume's and LMDB's reader table) are the one thing it may touch.
    let unlocked = |vol: &Path| {
        let mut snap = snapshot_of_volume(vol);
        snap.remove(Path::new("lock"));
        snap.remove(Path::new("meta/lock.mdb"));
        snap
    };
    let before = unlocked(v.vol());
    let out = passwd(&new, &old);
    out.assert_failure_with_message("passwd with a wrong current passphrase");
    assert!(
        out.stderr.contains("wrong passphrase for volume"),
        "{}",
        out.stderr
    );
    assert_same(
        &before,
        &unlocked(v.vol()),
        "passwd with a wrong passphrase",
    );

    passwd(&old, &new).assert_success("passwd");
    assert!(
        !mounts_with(&mut v, &old),
        "the old passphrase no longer works"
    );
    assert!(mounts_with(&mut v, &new), "the new passphrase works");
}

#[test]
fn passwd_killed_at_any_moment_leaves_exactly_one_passphrase_working() {
    let secrets = Secrets::new();
    let a = secrets.file("a", b"first passphrase");
    let b = secrets.file("b", b"second passphrase");
    let mut v = encrypted(&a);
    v.mount();
    write_file(&v.path("f"), b"survives");
    v.unmount();

    let vol = v.vol().to_path_buf();
    let passwd = |cur: &Path, next: &Path| {
        let mut cmd = Command::new(SAFS);
        cmd.args([
            "passwd",
            s(&vol),
            "--passphrase-file",
            s(cur),
            "--new-passphrase-file",
            s(next),
            "--kdf-testing",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
        cmd
    };
    // How long one change takes here: kills land anywhere in it.
    let start = Instant::now();
    assert!(passwd(&a, &b).status().unwrap().success());
    let span = start.elapsed().as_micros() as u64 * 3 / 2;
    let (mut cur, mut next) = (&b, &a);

    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
        | 1;
    eprintln!("kill delays: 0..{span} µs, seed {seed}");
    let (mut changed, mut kept) = (0, 0);
    for round in 0..20 {
        // xorshift: reproducible from the printed seed.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = Duration::from_micros(seed % span);
        let mut child = passwd(cur, next).spawn().unwrap();
        std::thread::sleep(delay);
        let _ = child.kill();
        let _ = child.wait();
        let with_cur = mounts_with(&mut v, cur);
        let with_next = mounts_with(&mut v, next);
        assert!(
            with_cur != with_next,
            "round {round}, killed after {delay:?}: old works {with_cur}, new works {with_next}"
        );
        if with_next {
            std::mem::swap(&mut cur, &mut next);
            changed += 1;
        } else {
            kept += 1;
        }
    }
    eprintln!("{changed} changes completed, {kept} interrupted before their commit");
}

#[test]
fn the_dircache_option_reaches_the_daemon() {
    let secrets = Secrets::new();
    let pass = secrets.file("pass", b"pass");
    let opt = format!("passphrase_file={}", pass.display());
    let budget = |v: &TestVolume| -> u64 {
        let out = safs(["info", "--json", s(v.mnt())]);
        out.assert_success("safs info --json");
        let stats: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        stats["dircache_budget_bytes"].as_u64().unwrap()
    };
    let mut v = encrypted(&pass);
    v.mount();
    assert!(budget(&v) > 0, "on by default for an encrypted volume");
    v.unmount();
    v.set_options(&[&opt, "dircache=0"]);
    v.mount();
    assert_eq!(budget(&v), 0, "dircache=0 turns it off");
    v.unmount();
    mount_with(&mut v, &["-o", &format!("{opt},dircache=2")])
        .assert_failure_with_message("dircache=2");

    let plain = TestVolume::new();
    assert_eq!(budget(&plain), 0, "off by default for a plain volume");
    let plain = TestVolume::with_options(&["dircache=1"]);
    assert!(budget(&plain) > 0, "dircache=1 turns it on");
}

/// `SEEK_DATA`/`SEEK_HOLE` on sealed contents answer in 4 KiB pages, as
/// ext4 does (xfstests' seek_sanity_test): hole, data, hole, data; a
/// punched page is a hole; negative offsets are past the end (ENXIO).
#[test]
fn seek_data_and_seek_hole_find_the_holes_of_sealed_contents() {
    use nix::unistd::{Whence, lseek};
    let dir = tempfile::tempdir().unwrap();
    let pass = dir.path().join("passphrase");
    std::fs::write(&pass, b"seek test\n").unwrap();
    let mut v = encrypted(&pass);
    v.mount();
    let p = v.path("holes");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    let page = vec![b'a'; 4096];
    // |- hole -|- data -|- hole -|- data -|- data, punched -|- data -|
    for at in [4096, 12288, 16384, 20480] {
        f.write_all_at(&page, at).unwrap();
    }
    nix::fcntl::fallocate(
        &f,
        nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
            | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
        16384,
        4096,
    )
    .unwrap();
    let size = 24576;
    let cases = [
        (0, Whence::SeekData, Some(4096)),
        (0, Whence::SeekHole, Some(0)),
        (4095, Whence::SeekData, Some(4096)),
        (4096, Whence::SeekHole, Some(8192)),
        (8191, Whence::SeekData, Some(8191)),
        (8192, Whence::SeekData, Some(12288)),
        (12289, Whence::SeekHole, Some(16384)),
        (16384, Whence::SeekData, Some(20480)),
        (20481, Whence::SeekHole, Some(size)),
        (size - 1, Whence::SeekData, Some(size - 1)),
        (size, Whence::SeekData, None),
        (size, Whence::SeekHole, None),
        (-1, Whence::SeekData, None),
        (-1, Whence::SeekHole, None),
    ];
    for (at, whence, want) in cases {
        let got = lseek(&f, at, whence);
        match want {
            Some(w) => assert_eq!(got, Ok(w), "{whence:?} from {at}"),
            None => assert_eq!(got, Err(nix::errno::Errno::ENXIO), "{whence:?} from {at}"),
        }
    }
    // Contents are unchanged by the looking.
    let mut want = vec![0u8; size as usize];
    for at in [4096usize, 12288, 20480] {
        want[at..at + 4096].fill(b'a');
    }
    assert_eq!(std::fs::read(&p).unwrap(), want);
}
