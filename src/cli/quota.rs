//! `safs quota`: directory quotas for people — the `safs.quota.*` xattrs
//! that `setfattr` sets, with sizes in units and the usage beside them
//! (from `safs.dir.*`), and a list of every limit under a directory.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

#[derive(Args, Debug)]
pub struct QuotaArgs {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(Subcommand, Debug)]
pub enum Action {
    /// Set a directory's limits (root only); 0 removes one.
    Set {
        /// A directory on a mounted safs.
        dir: PathBuf,
        /// Bytes below it, e.g. 500M, 10G, 2T (binary units) or a number.
        #[arg(long, value_parser = size)]
        max_bytes: Option<u64>,
        /// Files and directories below it.
        #[arg(long)]
        max_files: Option<u64>,
    },
    /// A directory's limits and what lies below it now.
    Get {
        /// A directory on a mounted safs.
        dir: PathBuf,
    },
    /// Remove a directory's limits (both unless one is named; root only).
    Remove {
        dir: PathBuf,
        #[arg(long)]
        bytes: bool,
        #[arg(long)]
        files: bool,
    },
    /// Every directory with a limit under a directory (a walk), with its
    /// usage.
    List {
        /// Where to start (a mountpoint lists the whole volume).
        dir: PathBuf,
    },
}

/// `10G` → 10 GiB; a plain number is bytes.
fn size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, shift) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                'P' => 50,
                _ => return Err(format!("{s}: the units are K, M, G, T and P")),
            };
            (&s[..i], shift)
        }
        _ => (s, 0),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("{s}: not a size (a number, optionally with K, M, G, T or P)"))
}

fn get(dir: &Path, name: &str) -> anyhow::Result<Option<u64>> {
    let mut buf = [0u8; 32];
    match rustix::fs::getxattr(dir, name, &mut buf[..]) {
        Ok(n) => {
            let v = std::str::from_utf8(&buf[..n]).unwrap_or("").trim();
            Ok(Some(v.parse().with_context(|| {
                format!("{}: {name} is {v:?}, not a number", dir.display())
            })?))
        }
        Err(rustix::io::Errno::NODATA) => Ok(None),
        Err(e) => Err(std::io::Error::from(e)).with_context(|| {
            format!(
                "{}: cannot read {name} (a directory on a safs volume that keeps \
                 statistics?)",
                dir.display()
            )
        }),
    }
}

fn set(dir: &Path, name: &str, value: u64) -> anyhow::Result<()> {
    let r = if value == 0 {
        match rustix::fs::removexattr(dir, name) {
            Err(rustix::io::Errno::NODATA) => Ok(()),
            r => r,
        }
    } else {
        rustix::fs::setxattr(
            dir,
            name,
            value.to_string().as_bytes(),
            rustix::fs::XattrFlags::empty(),
        )
    };
    r.map_err(|e| match e {
        rustix::io::Errno::PERM => anyhow::anyhow!("{}: only root sets quotas", dir.display()),
        rustix::io::Errno::OPNOTSUPP => anyhow::anyhow!(
            "{}: not a directory on a safs volume that keeps statistics",
            dir.display()
        ),
        e => anyhow::Error::from(std::io::Error::from(e))
            .context(format!("{}: cannot set {name}", dir.display())),
    })
}

fn show(dir: &Path) -> anyhow::Result<String> {
    let stat = |n: &str| get(dir, &format!("safs.dir.{n}"));
    let (Some(bytes), Some(entries)) = (stat("rbytes")?, stat("rentries")?) else {
        bail!(
            "{}: not a directory on a safs volume that keeps statistics",
            dir.display()
        );
    };
    let max_bytes = get(dir, "safs.quota.max_bytes")?;
    let max_files = get(dir, "safs.quota.max_files")?;
    let of = |used: u64, max: Option<u64>, unit: fn(u64) -> String| match max {
        Some(m) => format!(
            "{} of {} ({:.1}%)",
            unit(used),
            unit(m),
            used as f64 * 100.0 / m as f64
        ),
        None => format!("{} (no limit)", unit(used)),
    };
    Ok(format!(
        "{}: bytes {}; entries {}",
        dir.display(),
        of(bytes, max_bytes, human),
        of(entries, max_files, |n| n.to_string())
    ))
}

/// Bytes in binary units, as `df -h`.
fn human(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

fn list(dir: &Path, out: &mut Vec<String>) -> anyhow::Result<()> {
    if get(dir, "safs.quota.max_bytes")?.is_some() || get(dir, "safs.quota.max_files")?.is_some() {
        out.push(show(dir)?);
    }
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    for e in entries {
        let e = e?;
        if e.file_type()?.is_dir() {
            list(&e.path(), out)?;
        }
    }
    Ok(())
}

pub fn run(a: QuotaArgs) -> anyhow::Result<()> {
    match a.action {
        Action::Set {
            dir,
            max_bytes,
            max_files,
        } => {
            if max_bytes.is_none() && max_files.is_none() {
                bail!("say what to limit: --max-bytes, --max-files or both");
            }
            if let Some(b) = max_bytes {
                set(&dir, "safs.quota.max_bytes", b)?;
            }
            if let Some(f) = max_files {
                set(&dir, "safs.quota.max_files", f)?;
            }
            println!("{}", show(&dir)?);
        }
        Action::Get { dir } => println!("{}", show(&dir)?),
        Action::Remove { dir, bytes, files } => {
            let both = !bytes && !files;
            if bytes || both {
                set(&dir, "safs.quota.max_bytes", 0)?;
            }
            if files || both {
                set(&dir, "safs.quota.max_files", 0)?;
            }
            println!("{}", show(&dir)?);
        }
        Action::List { dir } => {
            let mut out = Vec::new();
            list(&dir, &mut out)?;
            if out.is_empty() {
                println!("no quotas under {}", dir.display());
            }
            for line in out {
                println!("{line}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(size("4096"), Ok(4096));
        assert_eq!(size("10G"), Ok(10 << 30));
        assert_eq!(size("500m"), Ok(500 << 20));
        assert!(size("10X").is_err());
        assert!(size("G").is_err());
        assert!(size("99999999999P").is_err());
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(12), "12 B");
    }
}
