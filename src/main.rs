//! `safs`: format, mount and inspect safs volumes.
#![forbid(unsafe_code)]

mod cli;

use clap::{CommandFactory, Parser};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let argv0 = args
        .first()
        .map(|a| {
            std::path::Path::new(a)
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    // mount.fuse3 runs `safs <volume> <mountpoint> -o opts` for fstab
    // entries of the `safs#<volume>` form: no subcommand, two paths.
    // The subcommands are clap's own list: one written out here missed
    // `upgrade` (and would have missed every command added since).
    let helper_form = args.len() >= 3 && !args[1].starts_with('-') && {
        let cmd = cli::Cli::command();
        !(args[1] == "help" || cmd.get_subcommands().any(|c| c.get_name() == args[1]))
    };
    let result = if argv0.starts_with("mount.fuse.safs") || argv0 == "mount.safs" || helper_form {
        cli::run_mount_helper(args).map(|()| 0)
    } else {
        cli::run(cli::Cli::parse())
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("safs: {e:#}");
            std::process::exit(1);
        }
    }
}
