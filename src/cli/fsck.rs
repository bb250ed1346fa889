use std::io::IsTerminal;
use std::path::PathBuf;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use safs::fsck::{self, EXIT_OPERATIONAL};

#[derive(Args, Debug)]
pub struct FsckArgs {
    /// The volume directory (must not be mounted).
    pub volume: PathBuf,
    /// Fix what can be fixed safely, and say what was done.
    #[arg(long)]
    pub repair: bool,
}

/// Returns the e2fsck-style exit code: 0 clean, 1 repaired, 4 errors left,
/// 8 operational error.
pub fn run(a: FsckArgs) -> i32 {
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
    let result = fsck::run(&a.volume, a.repair, &progress);
    bar.finish_and_clear();
    match result {
        Ok(report) => {
            for f in &report.findings {
                let tag = if f.repaired { "repaired" } else { "ERROR" };
                println!("{tag}: {}", f.what);
            }
            if report.recovered > 0 {
                let verb = if a.repair {
                    "reclaimed or reconciled"
                } else {
                    "to be reclaimed or reconciled at the next mount"
                };
                println!(
                    "{} leftovers of an unclean stop (unlinked-while-open inodes, stale sizes, stray backing files): {verb}",
                    report.recovered
                );
            }
            let verdict = match report.exit_code() {
                0 => "clean",
                1 => "errors repaired",
                _ if a.repair => "errors left uncorrected",
                _ => "errors found (run with --repair)",
            };
            println!(
                "{}: {} inodes, {} entries, {} xattr records: {verdict}",
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
