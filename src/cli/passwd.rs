//! `safs passwd`: changes the passphrase of an encrypted volume. The master
//! key stays; only its wrapping changes, in one record written in one
//! commit, so a crash at any moment leaves the old or the new passphrase
//! working.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;

use safs::core::crypto::{KdfParams, tune_kdf};
use safs::core::volume::{self, Layout, VolumeError, VolumeLock};

use super::format::KDF_TARGET;
use super::passphrase;

#[derive(Args, Debug)]
pub struct PasswdArgs {
    /// The volume directory (must not be mounted).
    pub volume: PathBuf,
    /// Read the current passphrase from FILE (its whole contents but one
    /// trailing newline) instead of asking on the terminal; also taken from
    /// the environment variable SAFS_PASSPHRASE_FILE.
    #[arg(long, value_name = "FILE")]
    pub passphrase_file: Option<PathBuf>,
    /// Read the new passphrase from FILE (the same way) instead of asking
    /// for it twice on the terminal.
    #[arg(long, value_name = "FILE")]
    pub new_passphrase_file: Option<PathBuf>,
    /// Cheap key derivation for the new passphrase, for tests only.
    #[arg(long, hide = true)]
    pub kdf_testing: bool,
}

pub fn run(a: PasswdArgs) -> anyhow::Result<()> {
    let vol = &a.volume;
    if !Layout::new(vol).is_volume() {
        bail!("{} is not a safs volume", vol.display());
    }
    // No daemon may serve the volume while its key record changes.
    let _lock = VolumeLock::acquire(&Layout::new(vol)).map_err(|e| match e {
        VolumeError::Busy(who) => anyhow::anyhow!(
            "volume {} is {who}: unmount it before changing its passphrase",
            vol.display()
        ),
        e => e.into(),
    })?;
    let (store, sb) =
        volume::open_store(vol).with_context(|| format!("cannot open volume {}", vol.display()))?;
    if !sb.is_encrypted() {
        bail!(
            "volume {} is not encrypted: it has no passphrase to change",
            vol.display()
        );
    }
    // The current passphrase is checked before a new one is asked for.
    let old = passphrase::existing(a.passphrase_file.as_deref(), vol)?;
    passphrase::unlock_with(store.as_ref(), &sb, &old, vol)?;
    // Not SAFS_PASSPHRASE_FILE: it names the current passphrase.
    let new = match &a.new_passphrase_file {
        Some(f) => passphrase::from_file(f)?,
        None => passphrase::typed_twice("new passphrase")?,
    };
    let kdf = if a.kdf_testing {
        KdfParams::TESTING
    } else {
        tune_kdf(KDF_TARGET)
    };
    volume::change_passphrase(store.as_ref(), &sb, &old, &new, kdf)
        .with_context(|| format!("cannot change the passphrase of {}", vol.display()))?;
    println!(
        "changed the passphrase of volume {} (Argon2id m={} KiB t={} p={})",
        vol.display(),
        kdf.m_kib,
        kdf.t,
        kdf.p
    );
    Ok(())
}
