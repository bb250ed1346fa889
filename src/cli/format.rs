use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use safs::core::volume::{self, DEFAULT_INLINE_BYTES, FormatOptions, MAX_INLINE_BYTES};

#[derive(Args, Debug)]
pub struct FormatArgs {
    /// Directory to hold the volume (created if missing; must be empty).
    pub volume: PathBuf,
    /// Bytes of xattrs kept inline in each inode record (0..=16384).
    #[arg(long, default_value_t = DEFAULT_INLINE_BYTES, value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_INLINE_BYTES)))]
    pub inline_xattr_bytes: u32,
    /// Format even if the directory is not empty or holds a volume (its
    /// contents are destroyed; refused while the volume is mounted).
    #[arg(long)]
    pub force: bool,
}

pub fn run(a: FormatArgs) -> anyhow::Result<()> {
    let opts = FormatOptions {
        inline_bytes: a.inline_xattr_bytes,
        force: a.force,
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
        encryption: None,
    };
    let sb = volume::format(&a.volume, &opts)
        .with_context(|| format!("cannot format {}", a.volume.display()))?;
    println!(
        "formatted safs volume {} (uuid {}, format {}, inline xattr budget {} bytes)",
        a.volume.display(),
        uuid::Uuid::from_bytes(sb.uuid),
        sb.format_version,
        sb.inline_bytes
    );
    Ok(())
}
