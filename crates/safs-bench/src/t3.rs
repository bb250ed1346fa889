//! T3 — Swift "Speed up reading and writing xattrs for object metadata":
//! ~31.5 KiB of pickled metadata split into C-byte chunks stored as
//! `user.swift.metadata`, `user.swift.metadata1`, `…2`, …
//!
//! Per chunk size C, on F fresh objects (empty files):
//! - `write`: open, `fsetxattr` of every chunk, close — µs per object;
//! - `read hot`: 2,500 reads spread over the objects, each timed on its own
//!   (mean and sd, as Swift's table), best mean of `--reps`;
//! - `read cold`: one read of every object after making the target cold.
//!
//! A read is open, `fgetxattr` of each chunk into a 64 KiB buffer, close.
//! It knows the chunk count; Swift's own reader also probes for the next
//! name until ENODATA — that extra absent-name lookup is what T7 measures
//! on its own, so it is left out here and the figures compare the storage
//! of the chunks. With C ≥ 31.5 KiB a read is open + one `fgetxattr`.

use std::ffi::CString;
use std::os::fd::AsFd;
use std::time::Instant;

use rustix::fs::XattrFlags;

use super::ops::{self, na};
use super::record::{Unit, mean_sd};
use super::tree::Rng;
use super::{Ctx, Fail, PhaseSpec, Step, Timed, prepared, skipped, timed_each};

/// The chunk names of `chunks` chunks, Swift's scheme.
pub fn chunk_names(chunks: usize) -> Vec<CString> {
    (0..chunks)
        .map(|i| {
            let suffix = if i == 0 { String::new() } else { i.to_string() };
            CString::new(format!("user.swift.metadata{suffix}")).expect("no NUL")
        })
        .collect()
}

/// One read of an object's metadata; returns the bytes read.
#[inline]
fn read_object(
    path: &std::ffi::CStr,
    names: &[CString],
    buf: &mut [u8],
) -> rustix::io::Result<usize> {
    let fd = ops::open_read(path)?;
    let mut total = 0;
    for n in names {
        total += rustix::fs::fgetxattr(fd.as_fd(), n.as_c_str(), &mut buf[..])?;
    }
    Ok(total)
}

pub fn run(st: &mut Step<'_>) -> anyhow::Result<()> {
    let (ctx, t) = (st.ctx, st.t);
    let s = ctx.sizes;
    let reps = ctx.cfg.reps;
    let files = s.t3_files;
    let mut rng = Rng::new(0x5AF5_0003);
    let metadata: Vec<u8> = (0..s.t3_metadata_bytes)
        .map(|_| rng.next_u64() as u8)
        .collect();
    for &c in &s.t3_chunks {
        let [mut write, mut hot, mut cold] = ["write", "read hot", "read cold"]
            .map(|case| st.row(case, Some(c as u64), Unit::UsPerOp));
        let d = st.dir.join(format!("c{c}"));
        let paths = ops::names(&d, "obj", files);
        let chunks: Vec<&[u8]> = metadata.chunks(c).collect();
        let names = chunk_names(chunks.len());
        let ready = prepared(
            ops::mkdirs(&d).and_then(|()| {
                ops::create_all(ctx, &paths, &st.label(&format!("create {files} objects")))
            }),
            &mut [&mut write, &mut hot, &mut cold],
        )?;
        if ready.is_some() {
            let l = st.label(&format!("write C={c}"));
            let wrote = ctx.phase(
                t,
                &mut write,
                PhaseSpec::new(&l, files as u64, 1, false),
                |ctx| {
                    timed_each(ctx, &paths, |i, p| {
                        let fd = ops::open_read(p).map_err(|e| na(e, "open", i, files))?;
                        for (n, v) in names.iter().zip(&chunks) {
                            rustix::fs::fsetxattr(fd.as_fd(), n.as_c_str(), v, XattrFlags::empty())
                                .map_err(|e| na(e, "fsetxattr", i, files))?;
                        }
                        Ok(())
                    })
                },
            )?;
            if wrote {
                let mut buf = vec![0u8; 65_536];
                let mut reads = |ctx: &Ctx<'_>, count: usize| -> Result<Timed, Fail> {
                    let mut each = Vec::with_capacity(count);
                    let start = Instant::now();
                    for i in 0..count {
                        ctx.tick(i)?;
                        let t0 = Instant::now();
                        let got = read_object(&paths[i % files], &names, &mut buf)
                            .map_err(|e| na(e, "read", i, count))?;
                        each.push(t0.elapsed().as_secs_f64() * 1e6);
                        if got != metadata.len() {
                            return Err(Fail::Na(format!(
                                "read {got} bytes of metadata, not {}",
                                metadata.len()
                            )));
                        }
                    }
                    let elapsed = start.elapsed();
                    let (mean, sd) = mean_sd(&each);
                    Ok(Timed {
                        elapsed,
                        sd_us: Some(sd),
                        value: Some(mean),
                    })
                };
                let l = st.label(&format!("read hot C={c}"));
                ctx.phase(
                    t,
                    &mut hot,
                    PhaseSpec::new(&l, s.t3_reads as u64, reps, false),
                    |ctx| reads(ctx, s.t3_reads),
                )?;
                let l = st.label(&format!("read cold C={c}"));
                ctx.phase(
                    t,
                    &mut cold,
                    PhaseSpec::new(&l, files as u64, reps, true),
                    |ctx| reads(ctx, files),
                )?;
            } else {
                skipped(&mut hot, &write);
                skipped(&mut cold, &write);
            }
        }
        st.done([write, hot, cold]);
        st.next_size(&d)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swift_chunk_names() {
        let n = chunk_names(3);
        assert_eq!(n[0].to_str().unwrap(), "user.swift.metadata");
        assert_eq!(n[2].to_str().unwrap(), "user.swift.metadata2");
    }
}
