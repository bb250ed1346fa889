//! `safs man <dir>` (hidden): the manual pages, generated from the command
//! line's own definitions so that they cannot drift from it — `safs.8`, one
//! page per subcommand (`safs-mount.8`, …) and `mount.fuse.safs.8`.
//! `scripts/run.sh` installs them.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Arg, CommandFactory};

#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Directory to write the pages into (e.g. /usr/local/share/man/man8).
    pub dir: PathBuf,
}

pub fn run(a: ManArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.dir)
        .with_context(|| format!("cannot create {}", a.dir.display()))?;
    let safs = super::Cli::command().name("safs");
    write(&a.dir, "safs", safs.clone())?;
    for sub in safs.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("safs-{}", sub.get_name());
        write(&a.dir, &name, sub.clone().name(name.clone()))?;
    }
    write(&a.dir, "mount.fuse.safs", helper())?;
    Ok(())
}

fn write(dir: &Path, name: &str, cmd: clap::Command) -> anyhow::Result<()> {
    let path = dir.join(format!("{name}.8"));
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd).section("8").render(&mut page)?;
    std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))
}

/// The mount helper as mount(8) calls it; its options are `safs mount`'s.
fn helper() -> clap::Command {
    let mount = super::Cli::command()
        .find_subcommand("mount")
        .cloned()
        .expect("the mount subcommand");
    let options = mount
        .get_arguments()
        .find(|a| a.get_id() == "options")
        .map(|a| a.get_help().map(ToString::to_string).unwrap_or_default())
        .unwrap_or_default();
    clap::Command::new("mount.fuse.safs")
        .about("mount helper for safs volumes: what mount -t fuse.safs and fstab entries of type fuse.safs run")
        .long_about(
            "mount(8) runs mount.fuse.safs VOLUME MOUNTPOINT -o OPTIONS for `mount -t fuse.safs` and \
             for /etc/fstab lines of type fuse.safs, e.g.\n\n\
             /var/lib/safs/demo  /mnt/safs  fuse.safs  allow_other,nofail  0 0\n\n\
             It mounts like `safs mount`, with one difference that follows every FUSE mount helper: \
             device nodes and set-id bits are honoured unless nodev or nosuid is given (mount(8) does \
             not pass these defaults on). `mount -o remount,...` changes the kernel's flags of a live \
             mount and the daemon's access-time rules. Every option either arrives or is refused with \
             a message.",
        )
        .arg(Arg::new("volume").required(true).help("The volume directory (made by safs format)."))
        .arg(Arg::new("mountpoint").required(true).help("An existing, empty directory."))
        .arg(Arg::new("options").short('o').value_name("OPTIONS").help(options))
}

#[cfg(test)]
mod tests {
    #[test]
    fn pages_for_every_command_and_the_helper() {
        let dir = tempfile::tempdir().unwrap();
        super::run(super::ManArgs {
            dir: dir.path().to_path_buf(),
        })
        .unwrap();
        for page in [
            "safs",
            "safs-mount",
            "safs-format",
            "safs-fsck",
            "mount.fuse.safs",
        ] {
            let text = std::fs::read_to_string(dir.path().join(format!("{page}.8"))).unwrap();
            assert!(text.contains(".TH"), "{page} is a man page");
        }
        let helper = std::fs::read_to_string(dir.path().join("mount.fuse.safs.8")).unwrap();
        assert!(
            helper.contains("nodiratime"),
            "the helper's page lists the options"
        );
        assert!(
            !dir.path().join("safs-man.8").exists(),
            "the hidden command has no page"
        );
    }
}
