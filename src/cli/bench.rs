//! `safs bench`: flags → [`safs_bench::Config`]; the work is in the `safs-bench` crate.

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::Args;

use safs_bench::config::{self, Scale, TargetSpec, Test};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Create the comparison set first — a safs volume and mount, ext4 and
    /// xfs loop images, a tmpfs — and tear it down afterwards (root); the
    /// object-store pair (safs-s3, juicefs) only when named in --targets.
    #[arg(long)]
    pub setup: bool,
    /// Workload sizes: small (minutes) or full (the published sizes).
    #[arg(long, default_value = "small", value_parser = parse_scale)]
    pub scale: Scale,
    /// Directories to measure, as label=dir,… (safs mounts are recognised).
    /// With --setup, measured beside the set-up ones.
    #[arg(long, value_delimiter = ',', value_parser = config::parse_target)]
    pub targets: Vec<TargetSpec>,
    /// The target the ratios are taken against.
    #[arg(long, default_value = "ext4")]
    pub baseline: String,
    /// Where results.json, results.md and the charts go
    /// [default: ./bench-results/<timestamp>].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Run only these tests, e.g. T1,T5 (default: all, T1 … T13).
    #[arg(long, value_parser = parse_only)]
    pub only: Option<BTreeSet<Test>>,
    /// Repetitions of every read-only phase; the best is kept.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Mount options for safs (with --setup, and for remounts in cold phases).
    #[arg(long = "safs-options", value_name = "OPTS")]
    pub safs_options: Option<String>,
    /// Where --setup puts its volume, images and mountpoints.
    #[arg(long, default_value = "/var/tmp")]
    pub workdir: PathBuf,
    /// libfuse's passthrough_hp (3.18 or later): --setup mounts it over a
    /// directory on the FUSE targets' image, as target passthrough_hp and,
    /// when the kernel offers FUSE over io_uring, passthrough_hp-uring.
    #[arg(long = "passthrough-hp", value_name = "PATH")]
    pub passthrough_hp: Option<PathBuf>,
}

fn parse_scale(s: &str) -> Result<Scale, String> {
    s.parse()
}

fn parse_only(s: &str) -> Result<BTreeSet<Test>, String> {
    config::parse_only(s)
}

impl BenchArgs {
    pub fn into_config(self) -> anyhow::Result<config::Config> {
        let out = match self.out {
            Some(o) => o,
            None => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                PathBuf::from("bench-results").join(config::timestamp_name(now))
            }
        };
        let cfg = config::Config {
            setup: self.setup,
            scale: self.scale,
            targets: self.targets,
            baseline: self.baseline,
            out,
            only: self.only.unwrap_or_else(|| Test::ALL.into_iter().collect()),
            reps: self.reps,
            safs_options: self.safs_options.map(|o| vec![o]).unwrap_or_default(),
            workdir: self.workdir,
            passthrough_hp: self.passthrough_hp,
            command: std::env::args().collect(),
        };
        cfg.validate().map_err(anyhow::Error::msg)?;
        Ok(cfg)
    }
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    let cfg = a.into_config()?;
    let out = safs_bench::run(cfg)?;
    println!("results: {}", out.display());
    if let Ok(md) = std::fs::read_to_string(out.join("results.md")) {
        println!("\n{md}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.bench)
    }

    #[test]
    fn defaults_and_flags() {
        let a = parse(&["--setup"]).unwrap();
        assert!(a.setup);
        assert_eq!(a.scale, Scale::Small);
        assert_eq!(a.baseline, "ext4");
        let c = a.into_config().unwrap();
        assert_eq!(c.only.len(), safs_bench::Test::ALL.len());
        assert!(c.out.starts_with("bench-results"));

        let a = parse(&[
            "--targets",
            "safs=/mnt/safs,ext4=/mnt/e4",
            "--scale",
            "full",
            "--only",
            "T1,t5",
            "--baseline",
            "safs",
            "--out",
            "/tmp/o",
        ])
        .unwrap();
        let c = a.into_config().unwrap();
        assert_eq!(c.scale, Scale::Full);
        assert_eq!(c.targets.len(), 2);
        assert_eq!(c.only.into_iter().collect::<Vec<_>>(), [Test::T1, Test::T5]);
        assert_eq!(c.out, PathBuf::from("/tmp/o"));
    }

    #[test]
    fn bad_flags_are_usage_errors() {
        assert!(parse(&["--scale", "huge"]).is_err());
        assert!(parse(&["--only", "T14"]).is_err());
        assert!(parse(&["--targets", "nolabel"]).is_err());
        let dup = parse(&["--targets", "a=/x,a=/y"]).unwrap();
        assert!(dup.into_config().is_err());
        // Neither targets nor --setup: refused with a message.
        assert!(parse(&[]).unwrap().into_config().is_err());
    }
}
