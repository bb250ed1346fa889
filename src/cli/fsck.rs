use std::io::IsTerminal;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use safs::fsck::{self, Access, EXIT_OPERATIONAL, EXIT_UNCORRECTED};

use super::passphrase;

/// Set in the environment of the process that does the checking.
const WORKER_ENV: &str = "SAFS_FSCK_WORKER";

#[derive(Args, Debug)]
pub struct FsckArgs {
    /// The volume directory (must not be mounted).
    pub volume: PathBuf,
    /// Fix what can be fixed safely, and say what was done.
    #[arg(long)]
    pub repair: bool,
    /// The passphrase of an encrypted volume, from this file (else from
    /// the file SAFS_PASSPHRASE_FILE names, else asked on the terminal;
    /// with none of them only the volume's structure is checked).
    #[arg(long, value_name = "FILE")]
    pub passphrase_file: Option<PathBuf>,
    /// Check an encrypted volume's structure alone, without its passphrase:
    /// keys, superblock, key record, backing file names and lengths (not
    /// records, names or contents).
    #[arg(long, conflicts_with_all = ["repair", "passphrase_file"])]
    pub structure_only: bool,
    /// On a volume whose contents are in an object store, read every
    /// object and check its bytes against its record (else only that each
    /// is there, with its length).
    #[arg(long, conflicts_with = "structure_only")]
    pub data_check: bool,
    /// On a volume formatted before directory statistics were kept: count
    /// every directory's tree and keep the counts from now on (the
    /// `safs.dir.*` xattrs and quotas then work there). With --repair.
    #[arg(long, requires = "repair")]
    pub dir_stats: bool,
}

/// Returns the e2fsck-style exit code: 0 clean, 1 repaired, 4 errors left,
/// 8 operational error.
///
/// LMDB keeps no checksums of its own page structure. Opening the store
/// checks that structure first (`meta::lmdb::verify`) and refuses damage
/// it finds; as a second line, for anything that check could miss, the
/// check runs in a child process of its own: a crash of the engine is
/// reported as damage, never as a crashed fsck.
pub fn run(a: FsckArgs) -> i32 {
    if std::env::var_os(WORKER_ENV).is_some() {
        return check(a);
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("safs fsck: cannot find its own executable to run the check: {e}");
            return EXIT_OPERATIONAL;
        }
    };
    let mut cmd = Command::new(exe);
    cmd.arg("fsck").arg(&a.volume).env(WORKER_ENV, "1");
    if a.repair {
        cmd.arg("--repair");
    }
    if a.dir_stats {
        cmd.arg("--dir-stats");
    }
    if let Some(f) = &a.passphrase_file {
        cmd.arg("--passphrase-file").arg(f);
    }
    if a.structure_only {
        cmd.arg("--structure-only");
    }
    if a.data_check {
        cmd.arg("--data-check");
    }
    match cmd.status() {
        Ok(status) => verdict(&a.volume, status),
        Err(e) => {
            eprintln!("safs fsck: cannot start the checking process: {e}");
            EXIT_OPERATIONAL
        }
    }
}

/// Whether a passphrase can be asked for: there is a terminal to ask on.
fn can_prompt() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .is_ok()
}

/// The exit code for a checking process that ended with `status`.
fn verdict(volume: &Path, status: ExitStatus) -> i32 {
    if let Some(code) = status.code() {
        return code;
    }
    let signal = status.signal().map_or_else(
        || "an unknown signal".to_string(),
        |s| {
            nix::sys::signal::Signal::try_from(s)
                .map_or_else(|_| format!("signal {s}"), |s| s.as_str().to_string())
        },
    );
    eprintln!(
        "ERROR: the metadata engine crashed ({signal}) reading {}: its page structure \
         is damaged, which fsck can neither check record by record nor repair \
         (LMDB keeps no page checksums). Restore the volume from a backup.",
        volume.join("meta/data.mdb").display()
    );
    EXIT_UNCORRECTED
}

/// Does the checking (in the child process).
fn check(a: FsckArgs) -> i32 {
    let bar = if std::io::stderr().is_terminal() {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template("{prefix:>8} [{bar:40}] {pos}/{len} {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    let progress = |phase: &str, done: u64, total: u64| {
        bar.set_prefix(phase.to_string());
        bar.set_length(total.max(done));
        bar.set_position(done);
    };
    let ask = || {
        passphrase::existing(a.passphrase_file.as_deref(), &a.volume).map_err(|e| format!("{e:#}"))
    };
    // Asked only if the volume is encrypted; with no file and no terminal
    // to ask on, the structure alone is checked.
    let access = if a.structure_only
        || (passphrase::file_from(a.passphrase_file.as_deref()).is_none() && !can_prompt())
    {
        Access::StructureOnly
    } else {
        Access::Full(&ask)
    };
    let checks = fsck::Checks {
        repair: a.repair,
        data_check: a.data_check,
        dir_stats: a.dir_stats,
    };
    let result = fsck::run(&a.volume, access, checks, &progress);
    bar.finish_and_clear();
    match result {
        Ok(report) => {
            for f in &report.findings {
                let tag = match (f.leftover, f.repaired) {
                    (true, true) => "recovered",
                    (true, false) => "leftover",
                    (false, true) => "repaired",
                    (false, false) => "ERROR",
                };
                println!("{tag}: {}", f.what);
            }
            if let Some(n) = report.dir_stats_added {
                println!(
                    "directory statistics counted for {n} directories: kept from now on \
                     (safs.dir.*, safs.quota.*)"
                );
            }
            if report.structure_only {
                println!(
                    "encrypted volume checked without its passphrase: structure only; \
                     records, names and contents not verified"
                );
            }
            let leftovers = report.leftovers();
            if leftovers > 0 {
                let verb = if a.repair {
                    "recovered here"
                } else if report
                    .findings
                    .iter()
                    .any(|f| f.leftover && f.what.starts_with("object "))
                {
                    "the next mount recovers them, objects no record names excepted \
                     (run with --repair to delete those)"
                } else {
                    "the next mount recovers them (or run with --repair)"
                };
                println!(
                    "{leftovers} leftovers of an unclean stop, not errors (inodes unlinked while \
                     open, stale sizes, stray backing files, unfinished truncates, objects no \
                     record names): {verb}"
                );
            }
            let verdict = match report.exit_code() {
                _ if report.unreadable => "cannot be checked further, nor repaired",
                0 if leftovers > 0 => "clean but for the leftovers of an unclean stop",
                0 => "clean",
                1 if report.findings.iter().all(|f| f.leftover) => "recovered from an unclean stop",
                1 => "errors repaired",
                _ if a.repair => "errors left uncorrected",
                _ if report.structure_only => {
                    "errors found (check with the passphrase to see them whole and repair)"
                }
                _ => "errors found (run with --repair)",
            };
            println!(
                "{}: {} inodes, {} entries, {} xattr records beside the inodes (spill sets, large values): {verdict}",
                a.volume.display(),
                report.inodes,
                report.entries,
                report.xattr_records
            );
            report.exit_code()
        }
        Err(e) => {
            eprintln!("safs fsck: {e:#}");
            EXIT_OPERATIONAL
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crashed_check_is_reported_as_damage_left_uncorrected() {
        let vol = Path::new("/vol");
        // Exit codes of a check that ran to the end pass through.
        for code in [0, 1, 4, 8] {
            assert_eq!(verdict(vol, ExitStatus::from_raw(code << 8)), code);
        }
        // Death by a signal (raw wait status = the signal number).
        assert_eq!(
            verdict(vol, ExitStatus::from_raw(libc::SIGSEGV)),
            EXIT_UNCORRECTED
        );
        assert_eq!(
            verdict(vol, ExitStatus::from_raw(libc::SIGBUS)),
            EXIT_UNCORRECTED
        );
    }
}
