use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use safs::core::crypto::{KdfParams, tune_kdf};
use safs::core::volume::{self, DEFAULT_INLINE_BYTES, Encryption, FormatOptions, MAX_INLINE_BYTES};

use super::passphrase;

/// How long deriving the key from a passphrase takes on this machine: the
/// cost of every guess at it.
pub const KDF_TARGET: Duration = Duration::from_millis(500);

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
    /// Encrypt the volume: names, metadata records, xattrs and file
    /// contents, under a random key that a passphrase unlocks (asked for
    /// twice on the terminal unless --passphrase-file is given).
    #[arg(long)]
    pub encrypt: bool,
    /// Read the new volume's passphrase from FILE (its whole contents but
    /// one trailing newline) instead of the terminal; also taken from the
    /// environment variable SAFS_PASSPHRASE_FILE.
    #[arg(long, value_name = "FILE", requires = "encrypt")]
    pub passphrase_file: Option<PathBuf>,
    /// Keep the metadata in a PostgreSQL database instead of the volume's
    /// embedded LMDB: a libpq connection string, URL
    /// (`postgresql://user@host/db`) or `key=value` pairs. The password
    /// comes from ~/.pgpass, PGPASSFILE or a passfile= parameter, never
    /// from the string (it is stored in the volume). The database must
    /// hold no other volume (--force replaces it).
    #[arg(long, value_name = "CONNINFO")]
    pub meta: Option<String>,
    /// Keep file contents in an object store with Amazon S3's API instead
    /// of the volume's data/ directory (which becomes a cache):
    /// s3://BUCKET or s3://BUCKET/PREFIX. Credentials, region and endpoint
    /// come the AWS way (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    /// ~/.aws/credentials, AWS_REGION, AWS_ENDPOINT_URL for stores other
    /// than AWS) and are never stored in the volume.
    #[arg(long, value_name = "URL")]
    pub data: Option<String>,
    /// Cheap key derivation, for tests only.
    #[arg(long, hide = true, requires = "encrypt")]
    pub kdf_testing: bool,
}

pub fn run(a: FormatArgs) -> anyhow::Result<()> {
    // The passphrase first: a mistyped one leaves nothing behind.
    let encryption = if a.encrypt {
        let passphrase = passphrase::new(a.passphrase_file.as_deref(), "new volume passphrase")?;
        let kdf = if a.kdf_testing {
            KdfParams::TESTING
        } else {
            tune_kdf(KDF_TARGET)
        };
        Some(Encryption { passphrase, kdf })
    } else {
        None
    };
    let kdf = encryption.as_ref().map(|e| e.kdf);
    let opts = FormatOptions {
        inline_bytes: a.inline_xattr_bytes,
        force: a.force,
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
        encryption,
        engine: match a.meta {
            Some(conninfo) => safs::meta::NewEngine::Postgres(conninfo),
            None => safs::meta::NewEngine::Lmdb,
        },
        data: a.data.clone(),
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
    if let Some(kdf) = kdf {
        println!("encrypted: {}", super::info::describe_encryption(&sb, &kdf));
    }
    if let Some(url) = &a.data {
        println!("contents: in the object store at {url}; the volume's data/ is a cache");
    }
    Ok(())
}
