//! Volumes that are missing, foreign, corrupt or from a newer safs, and
//! mountpoints that are missing, busy or not empty: each gets a clear error,
//! nothing is changed, and the volume files keep their private modes. Also
//! `mount -t fuse.safs` through the installed helper.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

fn safs(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_safs"))
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn fresh() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let vol = t.path().join("vol");
    let mnt = t.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    assert_eq!(safs(&["format", p(&vol)]).0, 0);
    (t, vol, mnt)
}

fn assert_refused(args: &[&str], expect: &str) {
    let (code, out) = safs(args);
    assert_ne!(code, 0, "{args:?} should fail: {out}");
    assert!(
        out.to_lowercase().contains(expect),
        "{args:?}: expected '{expect}' in: {out}"
    );
}

#[test]
fn missing_and_foreign_volumes_are_refused() {
    let (t, _, mnt) = fresh();
    assert_refused(&["mount", "/nonexistent/volume", p(&mnt)], "does not exist");
    let foreign = t.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("some-file"), b"x").unwrap();
    assert_refused(&["mount", p(&foreign), p(&mnt)], "not a safs volume");
    assert_refused(&["info", p(&foreign)], "neither");
    assert_eq!(std::fs::read(foreign.join("some-file")).unwrap(), b"x");
}

#[test]
fn corrupt_and_newer_superblocks_are_refused() {
    use safs::format::keys;
    use safs::format::superblock::Superblock;
    use safs::meta::{LmdbStore, MetaRead, MetaStore};
    let (_t, vol, mnt) = fresh();
    let store = LmdbStore::open(&vol.join("meta")).unwrap();
    let good = store.get(keys::SUPERBLOCK).unwrap().unwrap();
    let mut sb = Superblock::decode(&good).unwrap();
    sb.format_version += 1;
    store
        .commit(&[(keys::SUPERBLOCK.to_vec(), Some(sb.encode()))])
        .unwrap();
    assert_refused(&["mount", p(&vol), p(&mnt)], "newer than this safs");
    let mut bad = good.clone();
    bad[12] ^= 0x10;
    store
        .commit(&[(keys::SUPERBLOCK.to_vec(), Some(bad))])
        .unwrap();
    assert_refused(&["mount", p(&vol), p(&mnt)], "superblock is corrupt");
    // Damage found, that nothing can repair: exit 4, and it says so.
    let (code, out) = safs(&["fsck", p(&vol), "--repair"]);
    assert_eq!(code, 4, "{out}");
    assert!(
        out.contains("superblock is corrupt") && out.contains("nor repaired"),
        "{out}"
    );
    store
        .commit(&[(keys::SUPERBLOCK.to_vec(), Some(good))])
        .unwrap();
    drop(store);
    assert_eq!(safs(&["fsck", p(&vol)]).0, 0);
}

/// Damage to LMDB's own page structure (here: the main tree's root page
/// number in the newer meta page) is refused by mount and reported by fsck,
/// before the engine could crash on it; nothing is written.
#[test]
fn damaged_engine_structure_is_refused() {
    use std::os::unix::fs::FileExt;
    let (_t, vol, mnt) = fresh();
    let path = vol.join("meta/data.mdb");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let u64_at = |at: u64| {
        let mut b = [0u8; 8];
        file.read_exact_at(&mut b, at).unwrap();
        u64::from_le_bytes(b)
    };
    // The meta record starts at byte 16 of pages 0 and 1: the main tree's
    // root page number is at 128, the transaction id at 144.
    let newer = if u64_at(144) < u64_at(4096 + 144) {
        4096
    } else {
        0
    };
    file.write_all_at(&(1u64 << 40).to_le_bytes(), newer + 128)
        .unwrap();
    assert_refused(&["mount", p(&vol), p(&mnt)], "outside the file");
    let (code, out) = safs(&["fsck", p(&vol), "--repair"]);
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("data.mdb is damaged"), "{out}");
    assert_eq!(
        u64_at(newer + 128),
        1 << 40,
        "the damaged file was written to"
    );
}

#[test]
fn mountpoints_missing_or_not_empty_are_refused() {
    let (t, vol, mnt) = fresh();
    assert_refused(
        &["mount", p(&vol), p(&t.path().join("nowhere"))],
        "does not exist",
    );
    std::fs::write(mnt.join("occupied"), b"").unwrap();
    assert_refused(&["mount", p(&vol), p(&mnt)], "not empty");
    let file = t.path().join("file");
    std::fs::write(&file, b"").unwrap();
    assert_refused(&["mount", p(&vol), p(&file)], "not a directory");
}

#[test]
fn volume_files_are_private() {
    let (_t, vol, _) = fresh();
    let mode = |q: &Path| std::fs::metadata(q).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&vol), 0o700);
    assert_eq!(mode(&vol.join("meta")), 0o700);
    assert_eq!(mode(&vol.join("data")), 0o700);
    assert_eq!(mode(&vol.join("data/7f")), 0o700);
    assert_eq!(mode(&vol.join("meta/data.mdb")), 0o600);
}

#[test]
fn mount_t_fuse_safs_works_through_the_helper() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: this test mounts a real FUSE filesystem"
    );
    // mount(8) runs /sbin/mount.fuse.safs, which scripts/run.sh installs;
    // point it at the binary under test.
    let helper = Path::new("/sbin/mount.fuse.safs");
    let previous = std::fs::read_link(helper).ok();
    let _ = std::fs::remove_file(helper);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_safs"), helper).unwrap();
    // Put back whatever an installation had there.
    struct Restore(Option<std::path::PathBuf>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let helper = Path::new("/sbin/mount.fuse.safs");
            let _ = std::fs::remove_file(helper);
            if let Some(p) = &self.0 {
                let _ = std::os::unix::fs::symlink(p, helper);
            }
        }
    }
    let _restore = Restore(previous);
    let (_t, vol, mnt) = fresh();
    let st = Command::new("mount")
        .args(["-t", "fuse.safs", p(&vol), p(&mnt), "-o", "allow_other"])
        .status()
        .unwrap();
    assert!(st.success(), "mount -t fuse.safs failed");
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.contains(p(&mnt)))
        .expect("mounted")
        .to_string();
    std::fs::write(mnt.join("f"), b"hello").unwrap();
    common::umount_once_released(&mnt).assert_success("umount");
    assert!(
        line.contains("fuse.safs") && line.contains("allow_other"),
        "{line}"
    );
    let start = std::time::Instant::now();
    while safs::core::volume::VolumeLock::is_held(&vol) {
        assert!(start.elapsed().as_secs() < 10, "daemon did not exit");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(safs(&["fsck", p(&vol)]).0, 0);
}

#[test]
fn format_force_starts_a_fresh_volume_and_log() {
    let (_t, vol, _) = fresh();
    std::fs::write(vol.join("safs.log"), b"the old volume's log\n").unwrap();
    let (code, out) = safs(&["format", p(&vol)]);
    assert_ne!(code, 0, "format over a volume without --force: {out}");
    assert!(out.contains("--force"), "{out}");
    assert_eq!(safs(&["format", p(&vol), "--force"]).0, 0);
    assert!(
        !std::fs::read_to_string(vol.join("safs.log"))
            .unwrap_or_default()
            .contains("old volume"),
        "the old log was kept"
    );
    assert_eq!(safs(&["fsck", p(&vol)]).0, 0);
}

#[test]
fn info_on_an_unmounted_volume_says_it_is_not_mounted() {
    let (_t, vol, _) = fresh();
    let (code, out) = safs(&["info", "--stats", p(&vol)]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("mounted:        no"), "{out}");
    assert!(out.contains("not mounted"), "{out}");
    let (code, out) = safs(&["info", "--json", p(&vol)]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("is not mounted"), "{out}");
}

#[test]
fn format_of_a_plain_file_says_why_once() {
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("plain");
    std::fs::write(&f, b"x").unwrap();
    let (code, out) = safs(&["format", p(&f)]);
    assert_ne!(code, 0);
    assert_eq!(out.matches("Not a directory").count(), 1, "{out}");
    assert_eq!(std::fs::read(&f).unwrap(), b"x", "the file is untouched");
}
