//! POSIX ACLs through a real FUSE mount, set and read with `setfacl` /
//! `getfacl` (package `acl`) as the non-root users `safs_u1` and `safs_u2`,
//! and enforced by the kernel for those users.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use common::*;

/// `getfacl -c -p -E -a|-d` as `user`: the access (or default) ACL entries,
/// without header or "#effective" comments, as a set of lines.
fn getfacl(user: &TestUser, path: &Path, default: bool) -> BTreeSet<String> {
    let mut args = vec!["-c", "-p", "-E"];
    args.push(if default { "-d" } else { "-a" });
    let p = path.to_str().unwrap();
    args.push(p);
    let out = run_as(user, "getfacl", &args);
    out.assert_success(&format!("getfacl {args:?}"));
    out.stdout
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

#[track_caller]
fn setfacl(user: &TestUser, args: &[&str], path: &Path) {
    let mut all: Vec<&str> = args.to_vec();
    all.push(path.to_str().unwrap());
    run_as(user, "setfacl", &all).assert_success(&format!("setfacl {all:?} as {}", user.name));
}

fn set_of(lines: &[&str]) -> BTreeSet<String> {
    lines.iter().map(|s| (*s).to_string()).collect()
}

/// A mount with `allow_other` and a directory `home` owned by `safs_u1`.
fn volume_with_u1_home() -> (TestVolume, PathBuf) {
    let v = TestVolume::with_options(&["allow_other"]);
    let u = users();
    let home = v.path("home");
    fs::create_dir(&home).unwrap();
    chown(&home, u.u1.uid, u.u1.gid);
    chmod(&home, 0o755);
    (v, home)
}

fn can_read(user: &TestUser, path: &Path) -> bool {
    let out = run_as(user, "cat", [path]);
    if !out.success() {
        assert!(
            out.stderr.contains("Permission denied"),
            "cat {} as {} failed for another reason: {}",
            path.display(),
            user.name,
            out.stderr
        );
    }
    out.success()
}

fn can_append(user: &TestUser, path: &Path) -> bool {
    let out = sh_as(user, &format!("echo appended >> '{}'", path.display()));
    if !out.success() {
        assert!(
            out.stderr.contains("Permission denied"),
            "append to {} as {} failed for another reason: {}",
            path.display(),
            user.name,
            out.stderr
        );
    }
    out.success()
}

#[test]
fn access_acl_grants_a_second_user_read() {
    let (mut v, home) = volume_with_u1_home();
    let u = users();
    let f = home.join("f");
    sh_as(
        &u.u1,
        &format!("umask 077 && echo secret > '{}'", f.display()),
    )
    .assert_success("create file as u1");
    assert_eq!(mode_of(&f) & 0o777, 0o600);
    assert!(!can_read(&u.u2, &f), "0600 file must be unreadable for u2");

    setfacl(&u.u1, &["-m", "u:safs_u2:r"], &f);
    let expected = set_of(&[
        "user::rw-",
        "user:safs_u2:r--",
        "group::---",
        "mask::r--",
        "other::---",
    ]);
    assert_eq!(getfacl(&u.u1, &f, false), expected);
    assert_eq!(mode_of(&f) & 0o777, 0o640, "group bits show the mask");
    assert!(can_read(&u.u2, &f), "the ACL entry grants u2 read");
    assert!(!can_append(&u.u2, &f), "but not write");
    let raw = getxattr(&f, "system.posix_acl_access").unwrap();
    assert_eq!(&raw[..4], &[2, 0, 0, 0], "POSIX ACL xattr version 2");

    v.remount();
    assert_eq!(getfacl(&u.u2, &f, false), expected);
    assert!(can_read(&u.u2, &f), "still granted after remount");

    // Removing the entry takes the access away again.
    setfacl(&u.u1, &["-b"], &f);
    assert!(!can_read(&u.u2, &f));
    assert_eq!(
        getfacl(&u.u1, &f, false),
        set_of(&["user::rw-", "group::---", "other::---"])
    );
    assert_eq!(
        getxattr(&f, "system.posix_acl_access").unwrap_err(),
        Errno::ENODATA,
        "a minimal ACL is stored as mode bits only"
    );
}

#[test]
fn named_user_entry_can_deny_what_other_allows() {
    let (v, home) = volume_with_u1_home();
    let u = users();
    let f = home.join("f");
    sh_as(
        &u.u1,
        &format!("umask 022 && echo public > '{}'", f.display()),
    )
    .assert_success("create file as u1");
    assert!(can_read(&u.u2, &f), "0644: others may read");
    setfacl(&u.u1, &["-m", "u:safs_u2:---"], &f);
    assert!(
        !can_read(&u.u2, &f),
        "a named-user entry takes precedence over other"
    );
    assert!(can_read(&u.u1, &f), "the owner still reads");
    drop(v);
}

#[test]
fn group_entry_grants_members_only() {
    let (v, home) = volume_with_u1_home();
    let u = users();
    let f = home.join("f");
    fs::write(&f, b"for the group").unwrap();
    chmod(&f, 0o600);
    // Root owns it; u1 is a member of safs_shared, u2 is not.
    let out = run_cmd(
        std::process::Command::new("setfacl")
            .args(["-m", "g:safs_shared:r"])
            .arg(&f),
    );
    out.assert_success("setfacl as root");
    assert!(can_read(&u.u1, &f), "member of safs_shared reads");
    assert!(!can_read(&u.u2, &f), "non-member does not");
    assert!(getfacl(&u.u2, &f, false).contains("group:safs_shared:r--"));
    drop(v);
}

#[test]
fn default_acl_is_inherited_by_new_files_and_directories() {
    let (mut v, home) = volume_with_u1_home();
    let u = users();
    let proj = home.join("proj");
    run_as(&u.u1, "mkdir", [&proj]).assert_success("mkdir proj");
    chmod(&proj, 0o700);
    setfacl(&u.u1, &["-m", "u:safs_u2:rwx"], &proj);
    setfacl(&u.u1, &["-d", "-m", "u:safs_u2:rwx"], &proj);
    let default = set_of(&[
        "user::rwx",
        "user:safs_u2:rwx",
        "group::---",
        "mask::rwx",
        "other::---",
    ]);
    assert_eq!(getfacl(&u.u1, &proj, true), default);

    // umask 077 is ignored where a default ACL exists.
    let file = proj.join("file");
    let sub = proj.join("sub");
    sh_as(
        &u.u1,
        &format!(
            "umask 077 && echo data > '{}' && mkdir '{}'",
            file.display(),
            sub.display()
        ),
    )
    .assert_success("create in proj as u1");

    let check = || {
        assert_eq!(
            getfacl(&u.u1, &file, false),
            set_of(&[
                "user::rw-",
                "user:safs_u2:rwx",
                "group::---",
                "mask::rw-",
                "other::---"
            ]),
            "file inherits the default ACL, masked by its create mode 0666"
        );
        assert_eq!(mode_of(&file) & 0o777, 0o660);
        assert_eq!(
            getfacl(&u.u1, &sub, false),
            set_of(&[
                "user::rwx",
                "user:safs_u2:rwx",
                "group::---",
                "mask::rwx",
                "other::---"
            ]),
            "subdirectory's access ACL"
        );
        assert_eq!(
            getfacl(&u.u1, &sub, true),
            default,
            "subdirectory inherits the default ACL"
        );
        assert_eq!(mode_of(&sub) & 0o777, 0o770);
        assert!(
            getfacl(&u.u1, &file, true).is_empty(),
            "files have no default ACL"
        );
    };
    check();
    assert!(can_read(&u.u2, &file));
    assert!(
        can_append(&u.u2, &file),
        "u2 may write through the inherited entry"
    );

    // u2 creates inside the inherited directory; the ACL passes on again.
    let by_u2 = sub.join("by_u2");
    sh_as(
        &u.u2,
        &format!("umask 077 && echo hi > '{}'", by_u2.display()),
    )
    .assert_success("u2 creates in sub");
    assert_eq!(lmeta(&by_u2).uid(), u.u2.uid);
    assert!(
        !can_read(&u.u1, &by_u2),
        "u1 falls under other::--- on u2's file"
    );

    v.remount();
    check();
    assert!(getfacl(&u.u1, &by_u2, false).contains("user:safs_u2:rwx"));

    // setfacl -k removes the default ACL; new files then follow the umask.
    setfacl(&u.u1, &["-k"], &proj);
    assert!(getfacl(&u.u1, &proj, true).is_empty());
    let plain = proj.join("plain");
    sh_as(
        &u.u1,
        &format!("umask 077 && echo p > '{}'", plain.display()),
    )
    .assert_success("create after -k");
    assert_eq!(mode_of(&plain) & 0o777, 0o600);
    assert_eq!(
        getfacl(&u.u1, &plain, false),
        set_of(&["user::rw-", "group::---", "other::---"])
    );
}

#[test]
fn chmod_updates_the_acl_mask() {
    let (mut v, home) = volume_with_u1_home();
    let u = users();
    let f = home.join("f");
    sh_as(
        &u.u1,
        &format!("umask 022 && echo shared > '{}'", f.display()),
    )
    .assert_success("create as u1");
    setfacl(&u.u1, &["-m", "u:safs_u2:rw"], &f);
    assert_eq!(
        getfacl(&u.u1, &f, false),
        set_of(&[
            "user::rw-",
            "user:safs_u2:rw-",
            "group::r--",
            "mask::rw-",
            "other::r--"
        ])
    );
    assert!(can_append(&u.u2, &f));

    // chmod's group bits set the mask, not the owning group entry.
    run_as(&u.u1, "chmod", ["0640", f.to_str().unwrap()]).assert_success("chmod 0640");
    assert_eq!(
        getfacl(&u.u1, &f, false),
        set_of(&[
            "user::rw-",
            "user:safs_u2:rw-",
            "group::r--",
            "mask::r--",
            "other::---"
        ])
    );
    assert!(can_read(&u.u2, &f), "mask r-- still lets u2 read");
    assert!(!can_append(&u.u2, &f), "mask r-- stops u2 writing");

    run_as(&u.u1, "chmod", ["0600", f.to_str().unwrap()]).assert_success("chmod 0600");
    assert!(getfacl(&u.u1, &f, false).contains("mask::---"));
    assert!(!can_read(&u.u2, &f), "mask --- stops u2 reading");

    run_as(&u.u1, "chmod", ["0660", f.to_str().unwrap()]).assert_success("chmod 0660");
    v.remount();
    assert_eq!(
        getfacl(&u.u1, &f, false),
        set_of(&[
            "user::rw-",
            "user:safs_u2:rw-",
            "group::r--",
            "mask::rw-",
            "other::---"
        ])
    );
    assert!(
        can_append(&u.u2, &f),
        "mask rw- after chmod 0660 and remount"
    );
}

#[test]
fn acls_on_directories_control_lookup_and_listing() {
    let (v, home) = volume_with_u1_home();
    let u = users();
    let d = home.join("private");
    run_as(&u.u1, "mkdir", [&d]).assert_success("mkdir");
    run_as(&u.u1, "chmod", ["0700", d.to_str().unwrap()]).assert_success("chmod");
    sh_as(
        &u.u1,
        &format!(
            "echo inside > '{}/f' && chmod 0644 '{}/f'",
            d.display(),
            d.display()
        ),
    )
    .assert_success("file in private");
    assert!(
        !can_read(&u.u2, &d.join("f")),
        "no search permission on private"
    );
    setfacl(&u.u1, &["-m", "u:safs_u2:x"], &d);
    assert!(can_read(&u.u2, &d.join("f")), "x entry allows lookup");
    let ls = run_as(&u.u2, "ls", [&d]);
    assert!(
        !ls.success() && ls.stderr.contains("Permission denied"),
        "no r: no listing"
    );
    setfacl(&u.u1, &["-m", "u:safs_u2:rx"], &d);
    let ls = run_as(&u.u2, "ls", [&d]);
    ls.assert_success("ls with rx");
    assert_eq!(ls.stdout.trim(), "f");
    drop(v);
}
