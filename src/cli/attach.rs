use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use safs::core::volume;

#[derive(Args, Debug)]
pub struct AttachArgs {
    /// Directory for this node's side of the volume (created if missing;
    /// must be empty): the connection string and this node's cache.
    pub volume: PathBuf,
    /// The PostgreSQL database holding the volume, as given to `safs
    /// format --meta` (a libpq connection string or URL; the password from
    /// ~/.pgpass, PGPASSFILE or passfile=).
    #[arg(long, value_name = "CONNINFO")]
    pub meta: String,
}

pub fn run(a: AttachArgs) -> anyhow::Result<()> {
    let url = volume::attach(&a.volume, &a.meta)
        .with_context(|| format!("cannot attach {}", a.volume.display()))?;
    println!(
        "attached {} to the volume in that database; contents in {url}, cached here",
        a.volume.display()
    );
    Ok(())
}
