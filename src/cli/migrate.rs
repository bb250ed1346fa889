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
#[command(group = clap::ArgGroup::new("to").required(true).args(["meta", "data"]))]
pub struct MigrateArgs {
    /// The volume directory (must not be mounted anywhere).
    pub volume: PathBuf,
    /// Where the metadata goes: a PostgreSQL connection string (libpq URL
    /// or key=value pairs; an empty database), or `lmdb` for the volume's
    /// own embedded store.
    #[arg(long, value_name = "CONNINFO|lmdb")]
    pub meta: Option<String>,
    /// Move the file contents into this object store (s3://BUCKET/PREFIX,
    /// credentials the AWS way); `data/` becomes this node's cache.
    #[arg(long, value_name = "s3://BUCKET/PREFIX")]
    pub data: Option<String>,
    /// With --data, an encrypted volume's passphrase, so that the contents
    /// are uploaded now (else the first mount uploads them).
    #[arg(long, value_name = "FILE")]
    pub passphrase_file: Option<PathBuf>,
}

pub fn run(a: MigrateArgs) -> anyhow::Result<()> {
    if let Some(url) = &a.data {
        return to_store(&a, url);
    }
    let meta = a.meta.clone().unwrap_or_default();
    let target = if meta == "lmdb" {
        NewEngine::Lmdb
    } else {
        safs::meta::postgres::conninfo::parse(&meta).map_err(|e| anyhow::anyhow!("--meta: {e}"))?;
        NewEngine::Postgres(meta)
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
    check(&a)
}

/// `safs fsck` of the result (an encrypted volume's structure only: its
/// records moved sealed, byte for byte).
fn check(a: &MigrateArgs) -> anyhow::Result<()> {
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

/// `--data`: the contents into an object store, uploaded now by the
/// volume's own recovery of marked files (an encrypted volume's only with
/// its passphrase; else by the first mount).
fn to_store(a: &MigrateArgs, url: &str) -> anyhow::Result<()> {
    use safs::core::volume::{self, Layout, VolumeLock};
    let started = Instant::now();
    let files =
        safs::core::volume::migrate::to_object_store(&a.volume, url).with_context(|| {
            format!(
                "cannot move the contents of {} into {url}",
                a.volume.display()
            )
        })?;
    println!(
        "{}: its contents are now in {url}: {files} files to upload",
        a.volume.display()
    );
    let encrypted = volume_is_encrypted(&a.volume);
    let master = if encrypted {
        match super::passphrase::file_from(a.passphrase_file.as_deref()) {
            Some(_) => {
                let pass = super::passphrase::existing(a.passphrase_file.as_deref(), &a.volume)?;
                let (store, sb) = volume::open_read_only(&a.volume)?;
                Some(volume::unlock(store.as_ref(), &sb, &pass)?)
            }
            None => None,
        }
    } else {
        None
    };
    if encrypted && master.is_none() {
        println!(
            "encrypted volume without --passphrase-file: its first mount uploads them \
             (mount it here before any other node reads it)"
        );
        return check(a);
    }
    {
        let layout = Layout::new(&a.volume);
        let _lock = VolumeLock::acquire(&layout)?;
        let (engine, sb) = volume::open_store(&a.volume)?;
        engine.claim(&safs::meta::Session::of_this_process(
            "(safs migrate)".into(),
        ))?;
        let keys = master.map(|m| volume::keys_for(&m, &sb));
        // Opening the volume uploads every marked file, as after a stop.
        let fs = safs::core::Fs::mount(
            &a.volume,
            engine,
            sb,
            safs::core::Options {
                keys,
                ..Default::default()
            },
        )?;
        fs.close()?;
    }
    println!(
        "{files} files uploaded in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    check(a)
}

fn volume_is_encrypted(vol: &std::path::Path) -> bool {
    safs::core::volume::open_read_only(vol).is_ok_and(|(_, sb)| sb.is_encrypted())
}
