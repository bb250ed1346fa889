//! An fsx-style model checker: random operations (create, write + fsync,
//! rename over existing names, link, unlink, mkdir/rmdir, symlink, xattrs at
//! every tier, chmod, truncate) run against a real mount and against a
//! model; after every step the paths it touched are compared with the model
//! (type, mode, xattrs, contents, existence), the whole tree every 1,000
//! steps, and the volume is unmounted and mounted again (alternating
//! passthrough and daemon-side I/O) every 5,000 steps (twice in a short run) and compared again.
//! On volumes whose contents are in an object store (the run's S3 server)
//! every remount first throws the node's cache away, so that the
//! comparison after it reads every file back from the store.
//!
//! `SAFS_FSX_OPS=N` sets the number of steps (default 3,000 here; the
//! long run in docs/testing.md uses 1,000,000). `SAFS_FSX_SEED` fixes the seed.

mod model;
mod store;

use std::path::Path;

use model::*;

/// Compares the named paths of the mount with the model.
fn check_paths(mnt: &Path, want: &Model, paths: &[String], step: usize) {
    for p in paths {
        let full = mnt.join(p);
        let got = std::fs::symlink_metadata(&full);
        let Some(w) = want.get(p) else {
            assert!(
                got.is_err(),
                "step {step}: {p} exists but the model has no such name"
            );
            continue;
        };
        let md = got.unwrap_or_else(|e| panic!("step {step}: {p} missing: {e}"));
        use std::os::unix::fs::MetadataExt;
        match &w.kind {
            Kind::Dir => assert!(md.is_dir(), "step {step}: {p} should be a directory"),
            Kind::File => {
                assert!(md.is_file(), "step {step}: {p} should be a file");
                let data = std::fs::read(&full).unwrap();
                assert!(
                    data == w.data,
                    "step {step}: {p} contents differ ({} vs {} bytes)",
                    data.len(),
                    w.data.len()
                );
            }
            Kind::Symlink(t) => {
                assert_eq!(
                    std::fs::read_link(&full).unwrap().to_string_lossy(),
                    t.as_str(),
                    "step {step}: {p} target"
                );
            }
        }
        if !matches!(w.kind, Kind::Symlink(_)) {
            assert_eq!(md.mode() & 0o7777, w.mode, "step {step}: {p} mode");
            assert_eq!(list_user_xattrs(&full), w.xattrs, "step {step}: {p} xattrs");
        }
    }
}

fn full_check(mnt: &Path, want: &Model, step: usize) {
    let got = read_tree(mnt);
    let (gm, gg) = got.meta();
    let (wm, wg) = want.meta();
    assert_eq!(gm, wm, "step {step}: tree metadata differs from the model");
    assert_eq!(
        gg, wg,
        "step {step}: hard-link groups differ from the model"
    );
    for (p, id) in &want.names {
        let w = &want.inodes[id];
        if w.kind == Kind::File {
            assert!(
                got.get(p).unwrap().data == w.data,
                "step {step}: {p} contents differ"
            );
        }
    }
}

/// What the checker runs on.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Volume {
    Plain,
    Encrypted,
    /// Metadata in a private PostgreSQL cluster.
    Postgres,
    /// Contents in an object store.
    Store,
    /// The same, encrypted.
    StoreEncrypted,
}

#[test]
fn random_operations_match_the_model_across_remounts() {
    fsx(Volume::Plain);
}

/// The same with the metadata in PostgreSQL (a private cluster).
#[test]
fn random_operations_match_the_model_on_a_postgresql_volume() {
    fsx(Volume::Postgres);
}

/// The same on an encrypted volume (sealed records, encrypted names, sealed
/// content blocks through the daemon), alternating the directory cache on
/// and off across remounts.
#[test]
fn random_operations_match_the_model_on_an_encrypted_volume() {
    fsx(Volume::Encrypted);
}

/// The same on a volume whose contents are in an object store.
#[test]
fn random_operations_match_the_model_with_contents_in_an_object_store() {
    fsx(Volume::Store);
}

/// And encrypted: sealed blocks in the store.
#[test]
fn random_operations_match_the_model_with_sealed_contents_in_an_object_store() {
    fsx(Volume::StoreEncrypted);
}

fn fsx(kind: Volume) {
    let encrypted = matches!(kind, Volume::Encrypted | Volume::StoreEncrypted);
    let in_store = matches!(kind, Volume::Store | Volume::StoreEncrypted);
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: this test mounts a real FUSE filesystem"
    );
    let ops: usize = std::env::var("SAFS_FSX_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if encrypted { 2_000 } else { 3_000 });
    let seed: u64 = std::env::var("SAFS_FSX_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("fsx: {ops} steps, seed {seed}, {kind:?}");
    let tmp = tempfile::Builder::new()
        .prefix("safs-fsx")
        .tempdir_in("/tmp")
        .unwrap();
    let (vol, mnt) = (tmp.path().join("vol"), tmp.path().join("mnt"));
    std::fs::create_dir_all(&mnt).unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let enc = encrypted.then(|| Encrypted::new(tmp.path()));
    let mut format = vec!["format".to_string(), s(&vol)];
    format.extend(["--inline-xattr-bytes".into(), "128".into()]);
    format.extend(enc.iter().flat_map(Encrypted::format_args));
    // Declared before the mount guard: stopped after the volume unmounts.
    let cluster = (kind == Volume::Postgres).then(|| {
        let dir = tmp.path().join("cluster");
        std::fs::create_dir(&dir).unwrap();
        safs::meta::postgres::cluster::TempCluster::start(&dir).unwrap()
    });
    if let Some(c) = &cluster {
        format.extend(["--meta".into(), c.conninfo("postgres")]);
    }
    if in_store {
        SAFS_ENV.get_or_init(store::env);
        format.extend(["--data".into(), store::bucket("fsx")]);
    }
    run_ok(safs().args(&format));
    let _guard = Mounted {
        mnt: mnt.clone(),
        vol: vol.clone(),
    };
    let mount = |i: usize| {
        let opts = match &enc {
            None if i % 2 == 0 => "passthrough".to_string(),
            None => "nopassthrough".to_string(),
            Some(e) => format!("dircache={},{}", (i + 1) % 2, e.mount_option()),
        };
        run_ok(safs().args(["mount", &s(&vol), &s(&mnt), "-o", &opts]));
    };
    mount(0);
    let mut model = Model::new();
    for d in ["a", "b", "c"] {
        std::fs::create_dir(mnt.join(d)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(mnt.join(d), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let names = names();
    let mut rng = Rng(seed | 1);
    // At least one remount in a short run.
    let remount_every = (ops / 2).clamp(1, 5000);
    let (mut done, mut refused, mut remounts) = (0usize, 0usize, 0usize);
    for step_no in 1..=ops {
        oplog_clear();
        let mut next = model.clone();
        let (outcome, _) = step(&mut rng, &mnt, &mut next, &names);
        match outcome {
            Outcome::Done => {
                model = next;
                done += 1;
            }
            Outcome::Refused => refused += 1,
            Outcome::Dead => panic!("step {step_no}: the daemon died: {:?}", oplog()),
        }
        // The paths the step named (its log line holds them).
        let touched: Vec<String> = oplog()
            .iter()
            .flat_map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .filter(|t| names.contains(t) || ["a", "b", "c"].contains(&t.as_str()))
            .collect();
        check_paths(&mnt, &model, &touched, step_no);
        if step_no % 1000 == 0 {
            full_check(&mnt, &model, step_no);
        }
        if step_no % remount_every == 0 {
            unmount(&mnt);
            wait_unlocked(&vol);
            if in_store {
                store::lose_cache(&vol);
            }
            remounts += 1;
            mount(remounts);
            full_check(&mnt, &model, step_no);
        }
    }
    full_check(&mnt, &model, ops);
    unmount(&mnt);
    wait_unlocked(&vol);
    let mut fsck = vec!["fsck".to_string(), s(&vol)];
    if in_store {
        // Every object read and checked against its block record.
        fsck.push("--data-check".into());
    }
    if let Some(e) = &enc {
        fsck.extend(["--passphrase-file".into(), s(&e.passfile)]);
    }
    let out = safs().args(&fsck).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "fsck after fsx: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "fsx: {ops} steps ({done} applied, {refused} refused as the model predicted), {remounts} remounts, all matched ({kind:?})"
    );
}
