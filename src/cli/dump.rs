//! `safs dump` and `safs load`: a volume's metadata to a file and back
//! (see `core::volume::dump`).

use std::io::{BufReader, BufWriter, IsTerminal};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;

use safs::core::volume::dump;
use safs::meta::NewEngine;

#[derive(Args, Debug)]
pub struct DumpArgs {
    /// The volume directory, or the mountpoint of a mounted safs (the dump
    /// is then one snapshot, taken while it goes on serving).
    pub volume: PathBuf,
    /// Where to write it (default: standard output).
    pub file: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct LoadArgs {
    /// A file `safs dump` wrote (`-`: standard input).
    pub file: PathBuf,
    /// The volume directory to restore into: new or empty, or (with
    /// --replace) a volume whose metadata the dump replaces.
    pub volume: PathBuf,
    /// Load into a PostgreSQL database (an empty one) instead of the
    /// volume's own LMDB store.
    #[arg(long, value_name = "CONNINFO")]
    pub meta: Option<String>,
    /// Replace the metadata of the volume in VOLUME (kept aside in
    /// meta.before-load): how a damaged one is restored from a dump.
    #[arg(long)]
    pub replace: bool,
}

pub fn run_dump(a: DumpArgs) -> anyhow::Result<()> {
    let (vol, mountpoint) = super::info::resolve(&a.volume)?;
    if let Some(m) = &mountpoint {
        // The snapshot is of what is committed: every change made before
        // the dump was asked for goes in (the group committer may hold
        // the last few milliseconds', more on a busy machine).
        let sock = super::info::daemon_socket(&vol, Some(m))?;
        safs::control::request_at(&sock, "sync")
            .with_context(|| format!("cannot ask the daemon of {} to commit", m.display()))?;
    }
    let started = Instant::now();
    let sum = match &a.file {
        Some(path) => {
            let f = std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            let mut w = BufWriter::new(f);
            let sum = dump::dump(&vol, &mut w)?;
            w.into_inner()
                .map_err(|e| e.into_error())
                .and_then(|f| f.sync_all())
                .with_context(|| format!("cannot write {}", path.display()))?;
            sum
        }
        None => {
            let stdout = std::io::stdout();
            let mut w = BufWriter::new(stdout.lock());
            dump::dump(&vol, &mut w)?
        }
    };
    if a.file.is_some() || !std::io::stdout().is_terminal() {
        eprintln!(
            "{}: {} records ({:.1} MiB of keys and values) dumped in {:.1} s",
            vol.display(),
            sum.records,
            sum.bytes as f64 / (1 << 20) as f64,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

pub fn run_load(a: LoadArgs) -> anyhow::Result<()> {
    let engine = match a.meta {
        Some(conninfo) => {
            safs::meta::postgres::conninfo::parse(&conninfo)
                .map_err(|e| anyhow::anyhow!("--meta: {e}"))?;
            NewEngine::Postgres(conninfo)
        }
        None => NewEngine::Lmdb,
    };
    let started = Instant::now();
    let mut input: Box<dyn std::io::BufRead> = if a.file.as_os_str() == "-" {
        Box::new(BufReader::new(std::io::stdin().lock()))
    } else {
        let f = std::fs::File::open(&a.file)
            .with_context(|| format!("cannot open {}", a.file.display()))?;
        Box::new(BufReader::new(f))
    };
    let sum =
        dump::load(&mut input, &a.volume, &engine, a.replace, &|_| {}).with_context(|| {
            format!(
                "cannot load {} into {}",
                a.file.display(),
                a.volume.display()
            )
        })?;
    println!(
        "{}: {} records loaded in {:.1} s{}",
        a.volume.display(),
        sum.records,
        started.elapsed().as_secs_f64(),
        sum.replaced
            .map(|p| format!("; the metadata it replaced is kept in {}", p.display()))
            .unwrap_or_default()
    );
    println!(
        "check it with `safs fsck {}` before you mount it",
        a.volume.display()
    );
    Ok(())
}
