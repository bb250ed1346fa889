//! Passphrases of encrypted volumes: from a file (`--passphrase-file`,
//! `SAFS_PASSPHRASE_FILE`, `-o passphrase_file=`) or typed on the terminal
//! without echo. Never from a command-line argument (visible in `ps`),
//! never logged; held in zeroized buffers.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use zeroize::Zeroizing;

use safs::core::volume::{self, VolumeError};
use safs::format::superblock::Superblock;
use safs::meta::MetaRead;

/// The environment variable naming a passphrase file.
pub const ENV: &str = "SAFS_PASSPHRASE_FILE";
/// The longest passphrase accepted (a file of more is not a passphrase).
const MAX: usize = 4096;

/// The passphrase file given by flag or, failing that, by environment.
pub fn file_from(flag: Option<&Path>) -> Option<PathBuf> {
    flag.map(Path::to_path_buf)
        .or_else(|| std::env::var_os(ENV).map(PathBuf::from))
}

/// The passphrase of an existing volume `volume`.
pub fn existing(file: Option<&Path>, volume: &Path) -> anyhow::Result<Zeroizing<Vec<u8>>> {
    match file_from(file) {
        Some(f) => from_file(&f),
        None => prompt(&format!("passphrase for {}: ", volume.display())),
    }
}

/// The master key of the encrypted volume at `volume`, unlocked with its
/// passphrase (from `file` or asked for). Reads only: a wrong passphrase
/// leaves the volume as it was.
pub fn unlock(
    store: &dyn MetaRead,
    sb: &Superblock,
    file: Option<&Path>,
    volume: &Path,
) -> anyhow::Result<Zeroizing<[u8; 32]>> {
    unlock_with(store, sb, &existing(file, volume)?, volume)
}

/// The master key of the encrypted volume at `volume`, if `pass` is its
/// passphrase: a wrong one is an error that says so and names the volume.
pub fn unlock_with(
    store: &dyn MetaRead,
    sb: &Superblock,
    pass: &[u8],
    volume: &Path,
) -> anyhow::Result<Zeroizing<[u8; 32]>> {
    volume::unlock(store, sb, pass).map_err(|e| match e {
        VolumeError::WrongPassphrase => {
            anyhow::anyhow!("wrong passphrase for volume {}", volume.display())
        }
        e => anyhow::Error::new(e).context(format!("cannot unlock volume {}", volume.display())),
    })
}

/// A new passphrase: from the file, or typed twice on the terminal.
pub fn new(file: Option<&Path>, what: &str) -> anyhow::Result<Zeroizing<Vec<u8>>> {
    match file_from(file) {
        Some(f) => from_file(&f),
        None => typed_twice(what),
    }
}

/// A new passphrase typed twice on the terminal (the same both times).
pub fn typed_twice(what: &str) -> anyhow::Result<Zeroizing<Vec<u8>>> {
    let first = prompt(&format!("{what}: "))?;
    let again = prompt(&format!("{what} (again): "))?;
    if first != again {
        bail!("the two passphrases differ; nothing was changed");
    }
    Ok(first)
}

/// Reads a passphrase file: its whole contents but one trailing newline.
pub fn from_file(path: &Path) -> anyhow::Result<Zeroizing<Vec<u8>>> {
    let mut f = std::fs::File::open(path)
        .with_context(|| format!("cannot read passphrase file {}", path.display()))?;
    let mut buf = Zeroizing::new(Vec::with_capacity(64));
    f.by_ref()
        .take(MAX as u64 + 2)
        .read_to_end(&mut buf)
        .with_context(|| format!("cannot read passphrase file {}", path.display()))?;
    strip_newline(&mut buf);
    if buf.len() > MAX {
        bail!(
            "passphrase file {} is longer than {MAX} bytes: not a passphrase",
            path.display()
        );
    }
    if buf.is_empty() {
        bail!("passphrase file {} is empty", path.display());
    }
    Ok(buf)
}

fn prompt(text: &str) -> anyhow::Result<Zeroizing<Vec<u8>>> {
    let typed = rpassword::prompt_password(text).map_err(|_| {
        anyhow::anyhow!(
            "no passphrase: no terminal to ask for it on; give --passphrase-file FILE \
             (mount: or -o passphrase_file=FILE), or set {ENV}"
        )
    })?;
    let mut bytes = Zeroizing::new(typed.into_bytes());
    strip_newline(&mut bytes);
    if bytes.is_empty() {
        bail!("an empty passphrase is not accepted");
    }
    if bytes.len() > MAX {
        bail!("a passphrase is at most {MAX} bytes");
    }
    Ok(bytes)
}

fn strip_newline(b: &mut Zeroizing<Vec<u8>>) {
    if b.last() == Some(&b'\n') {
        b.pop();
        if b.last() == Some(&b'\r') {
            b.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_loses_one_newline_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("p");
        std::fs::write(&p, b" two words \n\n").unwrap();
        assert_eq!(&*from_file(&p).unwrap(), b" two words \n");
        std::fs::write(&p, b"\n").unwrap();
        assert!(from_file(&p).unwrap_err().to_string().contains("empty"));
        std::fs::write(&p, vec![b'x'; MAX + 1]).unwrap();
        assert!(from_file(&p).unwrap_err().to_string().contains("longer"));
        assert!(
            from_file(&dir.path().join("missing"))
                .unwrap_err()
                .to_string()
                .contains("cannot read passphrase file")
        );
    }
}
