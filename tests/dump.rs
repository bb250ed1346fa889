//! `safs dump` / `safs load`: a volume's metadata to a file and back, on
//! real volumes — a damaged metadata file restored from a dump taken while
//! the volume was mounted, the round trip byte for byte, a load onto
//! PostgreSQL, and every kind of bad input refused with its line number
//! and nothing written.

mod common;

use std::io::Write;
use std::path::Path;

use common::*;
use safs::meta::postgres::cluster::TempCluster;
use sha2::Digest;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn populate(root: &Path) {
    std::fs::create_dir(root.join("dir")).unwrap();
    for i in 0..200 {
        let p = root.join(format!("dir/f{i}"));
        std::fs::write(&p, vec![i as u8; i * 37]).unwrap();
        setxattr(&p, "user.dos", format!("attr{i}").as_bytes(), 0).unwrap();
    }
    let big = root.join("big");
    std::fs::write(&big, vec![9u8; 1 << 20]).unwrap();
    setxattr(&big, "user.ntacl", &[3u8; 20_000], 0).unwrap();
    std::fs::hard_link(&big, root.join("dir/big2")).unwrap();
    std::os::unix::fs::symlink("dir/f3", root.join("link")).unwrap();
}

#[track_caller]
fn dump_to(vol_or_mnt: &Path, file: &Path) {
    safs(["dump", s(vol_or_mnt), s(file)]).assert_success("safs dump");
}

#[test]
fn a_damaged_metadata_file_is_restored_from_a_dump_taken_while_mounted() {
    let mut v = TestVolume::new();
    populate(v.mnt());
    let before = tree_of(v.mnt());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("vol.dump");
    // Taken through the mountpoint, while it serves.
    dump_to(v.mnt(), &file);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.starts_with("{\"format\":\"safs-dump\",\"version\":1,"),
        "{}",
        &text[..200]
    );
    assert!(text.contains("\"key\":\"I1\""), "records name their keys");
    assert!(
        text.lines()
            .last()
            .unwrap()
            .starts_with("{\"end\":{\"records\":")
    );
    v.unmount();

    // The metadata file damaged past what fsck can repair.
    let mdb = v.vol().join("meta/data.mdb");
    let f = std::fs::OpenOptions::new().write(true).open(&mdb).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0x5a; 8192], 4096).unwrap();
    drop(f);
    assert!(!safs(["fsck", s(v.vol())]).success());

    let out = safs(["load", s(&file), s(v.vol())]);
    out.assert_failure_with_message("load over a volume without --replace");
    assert!(out.stderr.contains("--replace"), "{}", out.stderr);
    let out = safs(["load", s(&file), s(v.vol()), "--replace"]);
    out.assert_success("safs load --replace");
    assert!(v.vol().join("meta.before-load/data.mdb").exists());
    // Dumped while mounted: the check finds the leftovers a mount
    // recovers, nothing worse.
    safs(["fsck", s(v.vol())]).assert_success("fsck of the restored volume");
    v.mount();
    assert_eq!(tree_of(v.mnt()), before);
    v.unmount();
}

#[test]
fn dump_load_dump_is_byte_identical_and_loads_onto_postgresql() {
    let mut v = TestVolume::new();
    populate(v.mnt());
    let before = tree_of(v.mnt());
    v.unmount();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    dump_to(v.vol(), &a);
    let copy = dir.path().join("copy");
    safs(["load", s(&a), s(&copy)]).assert_success("load into a new directory");
    dump_to(&copy, &b);
    assert!(
        std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
        "dump → load → dump differs"
    );

    // The same dump onto PostgreSQL, over the volume's own metadata (its
    // contents stay in data/): the volume now lives there.
    let cluster = TempCluster::start(dir.path()).unwrap();
    cluster.create_database("vol").unwrap();
    let conninfo = cluster.conninfo("vol");
    safs(["load", s(&a), s(v.vol()), "--replace", "--meta", &conninfo])
        .assert_success("load onto PostgreSQL");
    let info = safs(["info", s(v.vol())]);
    assert!(info.stdout.contains("PostgreSQL"), "{}", info.stdout);
    v.mount();
    assert_eq!(tree_of(v.mnt()), before);
    v.unmount();
    // A database that holds a volume is refused, and left as it was.
    let other = dir.path().join("other");
    let out = safs(["load", s(&a), s(&other), "--meta", &conninfo]);
    out.assert_failure_with_message("load into a database holding a volume");
    assert!(!other.exists());
    v.mount();
    assert_eq!(tree_of(v.mnt()), before);
    // A dump of the mounted PostgreSQL volume (one REPEATABLE READ
    // snapshot) holds the same records as the file it was loaded from,
    // but for what a mount rewrites (its mount state).
    let c = dir.path().join("c");
    dump_to(v.mnt(), &c);
    let keys = |p: &Path| -> Vec<String> {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|r| r["key"].as_str().map(String::from))
            .collect()
    };
    assert_eq!(keys(&c), keys(&a));
    // Before the cluster goes (it drops first).
    v.unmount();
}

/// `text` with its end line made to match its records again (an edit a
/// digest cannot catch).
fn reseal(text: &str) -> String {
    let mut lines: Vec<&str> = text.lines().collect();
    lines.pop();
    let mut h = sha2::Sha256::new();
    for l in &lines[1..] {
        let r: serde_json::Value = serde_json::from_str(l).unwrap();
        for f in ["k", "v"] {
            let b = hex::decode(r[f].as_str().unwrap()).unwrap();
            h.update((b.len() as u64).to_be_bytes());
            h.update(&b);
        }
    }
    let end = format!(
        "{{\"end\":{{\"records\":{},\"sha256\":\"{}\"}}}}",
        lines.len() - 1,
        hex::encode(h.finalize())
    );
    let mut out = lines.join("\n");
    out.push('\n');
    out.push_str(&end);
    out.push('\n');
    out
}

#[test]
fn bad_dumps_are_refused_with_their_line_and_nothing_written() {
    let mut v = TestVolume::new();
    populate(v.mnt());
    v.unmount();
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    dump_to(v.vol(), &good);
    let text = std::fs::read_to_string(&good).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let n = lines.len();
    // An inode record dropped (its entries and xattrs then name nothing).
    let inode_line = lines
        .iter()
        .position(|l| l.contains("\"key\":\"I5\""))
        .unwrap();
    let mut no_inode = lines.clone();
    no_inode.remove(inode_line);
    let no_inode = reseal(&(no_inode.join("\n") + "\n"));
    let cases: Vec<(&str, String, String)> = vec![
        ("empty", String::new(), "line 1: empty input".into()),
        (
            "cut short",
            lines[..n - 1].join("\n") + "\n",
            "without its end line".into(),
        ),
        (
            "edited",
            text.replacen("\"v\":\"", "\"v\":\"00", 1),
            "edited or damaged".into(),
        ),
        (
            "newer version",
            text.replacen("\"version\":1", "\"version\":2", 1),
            "line 1: dump format version 2".into(),
        ),
        (
            "not hex",
            text.replacen("\"k\":\"", "\"k\":\"zz", 1),
            "line 2: key".into(),
        ),
        (
            "out of order",
            {
                let mut l = lines.clone();
                l.swap(2, 3);
                reseal(&(l.join("\n") + "\n"))
            },
            "line 4: records out of key order".into(),
        ),
        (
            "inode missing",
            no_inode,
            "a record of inode 5, which the dump does not hold".into(),
        ),
    ];
    for (what, body, want) in cases {
        let file = dir.path().join(what.replace(' ', "-"));
        std::fs::File::create(&file)
            .unwrap()
            .write_all(body.as_bytes())
            .unwrap();
        let target = dir.path().join(format!("vol-{}", what.replace(' ', "-")));
        let out = safs(["load", s(&file), s(&target)]);
        out.assert_failure_with_message(what);
        assert!(out.stderr.contains(&want), "{what}: {}", out.stderr);
        assert!(
            out.stderr.contains("nothing was loaded"),
            "{what}: {}",
            out.stderr
        );
        assert!(
            !target.exists(),
            "{what}: a refused load left {}",
            target.display()
        );
    }
    safs(["load", s(&good), s(&dir.path().join("fine"))]).assert_success("the good dump");
}
