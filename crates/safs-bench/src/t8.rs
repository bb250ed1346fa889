//! T8 — the pefs table itself: create N files, `ls -Al`, remove them, at
//! the sizes of the pefs dircache post (N = 1,000, 2,000, 3,000), per file.
//!
//! The phases are T5's (see there); beside the loop's `ls -Al` (readdir +
//! lstat of each entry, the figure compared across targets) runs
//! coreutils' `ls -Al` itself, whose per-entry figure adds what the
//! program does beyond that: process start, an SELinux-label and an ACL
//! xattr probe per entry (on a FUSE target those the kernel cannot answer
//! itself are round trips: one per entry on safs in the smoke runs),
//! sorting and formatting. Run on every target, it is the table the
//! encrypted volumes are compared with gocryptfs on.

use super::Step;

pub fn run(s: &mut Step<'_>) -> anyhow::Result<()> {
    let ctx = s.ctx;
    super::t5::dir_sizes(s, &ctx.sizes.t8_counts, true)
}
