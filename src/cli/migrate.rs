//! `safs migrate`: moves an unmounted volume's metadata to another engine
//! in place (see `core::volume::migrate`), then checks the result.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use safs::core::volume::migrate::migrate;
use safs::meta::{EngineKind, NewEngine};

#[derive(Args, Debug)]
pub struct MigrateArgs {
    /// The volume directory (must not be mounted anywhere).
    pub volume: PathBuf,
    /// Where the metadata goes: a PostgreSQL connection string (libpq URL
    /// or key=value pairs; an empty database), or `lmdb` for the volume's
    /// own embedded store.
    #[arg(long, value_name = "CONNINFO|lmdb")]
    pub meta: String,
}

pub fn run(a: MigrateArgs) -> anyhow::Result<()> {
    let target = if a.meta == "lmdb" {
        NewEngine::Lmdb
    } else {
        safs::meta::postgres::conninfo::parse(&a.meta)
            .map_err(|e| anyhow::anyhow!("--meta: {e}"))?;
        NewEngine::Postgres(a.meta.clone())
    };
    let bar = if std::io::stderr().is_terminal() {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template("copying [{bar:40}] {pos}/{len} records, {eta} left")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    let progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let started = Instant::now();
    let m = migrate(&a.volume, &target, &progress)
        .with_context(|| format!("cannot migrate {}", a.volume.display()))?;
    bar.finish_and_clear();
    let name = |k: EngineKind| match k {
        EngineKind::Lmdb => "LMDB",
        EngineKind::Postgres => "PostgreSQL",
        _ => "?",
    };
    println!(
        "{}: metadata moved from {} to {}: {} records ({:.1} MiB) in {:.1} s; the file \
         contents stayed where they are",
        a.volume.display(),
        name(m.from),
        name(m.to),
        m.pairs,
        m.bytes as f64 / (1 << 20) as f64,
        started.elapsed().as_secs_f64()
    );
    println!("{}", m.left);
    // The result checked as `safs fsck` would (an encrypted volume's
    // structure only: its records moved sealed, byte for byte).
    let exe = std::env::current_exe().context("cannot find safs's own executable")?;
    let mut fsck = Command::new(exe);
    fsck.arg("fsck").arg(&a.volume);
    if volume_is_encrypted(&a.volume) {
        fsck.arg("--structure-only");
    }
    let status = fsck.status().context("cannot run safs fsck")?;
    if !status.success() {
        bail!(
            "safs fsck of the migrated volume exited {}: see above (the migration itself is \
             done; the old engine's data is where the line above says)",
            status.code().unwrap_or(-1)
        );
    }
    Ok(())
}

fn volume_is_encrypted(vol: &std::path::Path) -> bool {
    safs::core::volume::open_read_only(vol).is_ok_and(|(_, sb)| sb.is_encrypted())
}
