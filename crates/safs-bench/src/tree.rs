//! A deterministic `/usr`-shaped tree for T2's `du` walk.
//!
//! Shape, taken from a Debian 12 `/usr` (130 k files, 17 k directories,
//! 5.5 k symlinks; directory depth peaking at 7; entries per directory:
//! median 3, p90 12, p99 85, a few directories with thousands):
//!
//! - 85 % regular files, 11 % directories, 4 % symlinks;
//! - directories form a uniform random recursive tree (each new directory
//!   hangs under a uniformly chosen earlier one), which gives the same depth
//!   profile; depth is capped at 14;
//! - files go to directories with Zipf(1) weights over a shuffled order, so
//!   a handful get thousands (`/usr/bin`, `/usr/lib/x86_64-linux-gnu`) and
//!   most get a few;
//! - file sizes: 1 % empty, 66 % up to 4 KiB, 29 % 4–64 KiB, 3.7 % 64 KiB–
//!   1 MiB, 0.3 % 1–4 MiB (log-uniform within each band). Only the first
//!   16 KiB of a file is written; the rest is a hole (`ftruncate`), so
//!   building the tree stays cheap — `du` reads only metadata.
//!
//! The same seed always gives the same tree, byte for byte in its names
//! and sizes, so figures from different runs and targets compare.

/// Bytes of a file actually written; the rest of its size is a hole.
pub const WRITTEN_MAX: u64 = 16 * 1024;

/// SplitMix64: small, fast, and good enough to shape a tree.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        (self.unit() * n as f64) as usize % n.max(1)
    }

    /// Log-uniform in [lo, hi).
    pub fn log_uniform(&mut self, lo: u64, hi: u64) -> u64 {
        let (l, h) = ((lo.max(1)) as f64, hi as f64);
        (l * (h / l).powf(self.unit())) as u64
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File { size: u64 },
    Symlink { target: String },
}

/// One entry, its path relative to the tree's root; a directory always
/// comes before anything inside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub path: String,
    pub kind: Kind,
}

const PREFIXES: [&str; 8] = [
    "lib",
    "",
    "python3-",
    "x86_64-linux-gnu-",
    "README.",
    "perl-",
    "gir1.2-",
    "",
];
const SUFFIXES: [&str; 8] = [".so.1", "", ".h", ".py", ".gz", ".pm", "", ".conf"];

fn name(rng: &mut Rng, i: usize) -> String {
    let p = PREFIXES[rng.below(PREFIXES.len())];
    let s = SUFFIXES[rng.below(SUFFIXES.len())];
    format!("{p}e{i}{s}")
}

fn file_size(rng: &mut Rng) -> u64 {
    let u = rng.unit();
    if u < 0.01 {
        0
    } else if u < 0.67 {
        rng.log_uniform(16, 4096)
    } else if u < 0.96 {
        rng.log_uniform(4096, 65_536)
    } else if u < 0.997 {
        rng.log_uniform(65_536, 1 << 20)
    } else {
        rng.log_uniform(1 << 20, 4 << 20)
    }
}

/// The tree of `entries` entries (the root itself not counted).
pub fn plan(entries: usize, seed: u64) -> Vec<Entry> {
    let mut rng = Rng::new(seed);
    let dirs = (entries * 11 / 100).max(1);
    let links = entries * 4 / 100;
    let files = entries.saturating_sub(dirs + links);

    // Directory 0 is the root ("" path); 1..=dirs are entries.
    let mut dir_path: Vec<String> = vec![String::new()];
    let mut depth: Vec<u32> = vec![0];
    let mut out = Vec::with_capacity(entries);
    let join = |parent: &str, name: &str| {
        if parent.is_empty() {
            name.to_string()
        } else {
            format!("{parent}/{name}")
        }
    };
    for i in 1..=dirs {
        let parent = loop {
            let j = rng.below(i);
            if depth[j] < 14 {
                break j;
            }
        };
        let path = join(&dir_path[parent], &format!("d{i}"));
        depth.push(depth[parent] + 1);
        out.push(Entry {
            path: path.clone(),
            kind: Kind::Dir,
        });
        dir_path.push(path);
    }

    // Zipf(1) weights over a shuffled order of all directories (root too).
    let n = dir_path.len();
    let mut rank: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        rank.swap(i, rng.below(i + 1));
    }
    let mut cum = Vec::with_capacity(n);
    let mut total = 0.0;
    for r in &rank {
        total += 1.0 / (*r as f64 + 1.0);
        cum.push(total);
    }
    let pick = |rng: &mut Rng| {
        let x = rng.unit() * total;
        cum.partition_point(|c| *c <= x).min(n - 1)
    };
    for i in 0..files {
        let d = pick(&mut rng);
        let nm = name(&mut rng, i);
        out.push(Entry {
            path: join(&dir_path[d], &nm),
            kind: Kind::File {
                size: file_size(&mut rng),
            },
        });
    }
    for i in 0..links {
        let d = pick(&mut rng);
        let up = "../".repeat(rng.below(3));
        let target = format!(
            "{up}lib/x86_64-linux-gnu/lib{}.so.{}",
            rng.below(5000),
            i % 7
        );
        out.push(Entry {
            path: join(&dir_path[d], &format!("l{i}")),
            kind: Kind::Symlink { target },
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    #[test]
    fn deterministic_and_sized() {
        let a = plan(3000, 7);
        assert_eq!(a, plan(3000, 7));
        assert_ne!(a, plan(3000, 8));
        assert_eq!(a.len(), 3000);
        let dirs = a.iter().filter(|e| e.kind == Kind::Dir).count();
        assert_eq!(dirs, 330);
    }

    #[test]
    fn parents_come_first_and_names_are_unique() {
        let t = plan(5000, 1);
        let mut seen: HashSet<&str> = HashSet::new();
        for e in &t {
            if let Some((parent, _)) = e.path.rsplit_once('/') {
                assert!(seen.contains(parent), "{} before its parent", e.path);
            }
            assert!(seen.insert(&e.path), "{} twice", e.path);
        }
    }

    #[test]
    fn usr_like_shape() {
        let t = plan(30_000, 42);
        let mut per_dir: HashMap<&str, usize> = HashMap::new();
        for e in &t {
            let parent = e.path.rsplit_once('/').map_or("", |(p, _)| p);
            *per_dir.entry(parent).or_default() += 1;
        }
        let max = per_dir.values().copied().max().unwrap();
        assert!(max > 1000, "no huge directory (max {max})");
        let depth = t.iter().map(|e| e.path.matches('/').count()).max().unwrap();
        assert!((5..=14).contains(&depth), "depth {depth}");
        let big = t
            .iter()
            .filter(|e| matches!(e.kind, Kind::File { size } if size > 65_536))
            .count();
        assert!(big > 0 && big < t.len() / 10);
    }
}
