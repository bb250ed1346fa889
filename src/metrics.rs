//! `-o metrics=ADDRESS:PORT`: the daemon's figures in Prometheus's text
//! exposition format (version 0.0.4) at `http://ADDRESS:PORT/metrics`, for
//! a monitoring system to scrape. The same figures as `safs info --stats`
//! ([`crate::control::stats_reply`]), named by Prometheus's conventions:
//! `safs_` prefix, base units (seconds, bytes), `_total` counters, and
//! request latencies as `_seconds` histograms whose buckets are the
//! daemon's own (powers of two of microseconds).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use safs_control::{StatsReply, bucket_bound_us};

use crate::core::Fs;
use crate::fuse::stats::Stats;

/// The content type Prometheus expects of the text format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serves `/metrics` on `addr` from a thread of its own for the life of
/// the process. Fails if the address cannot be bound.
pub fn serve(addr: SocketAddr, fs: Arc<Fs>, stats: Arc<Stats>) -> std::io::Result<()> {
    let server = tiny_http::Server::http(addr).map_err(std::io::Error::other)?;
    std::thread::Builder::new()
        .name("safs-metrics".into())
        .spawn(move || {
            for req in server.incoming_requests() {
                let reply = match (req.method(), req.url()) {
                    (tiny_http::Method::Get, "/metrics") => {
                        let body = render(&crate::control::stats_reply(&fs, &stats));
                        tiny_http::Response::from_string(body).with_header(
                            tiny_http::Header::from_bytes("Content-Type", CONTENT_TYPE)
                                .expect("a valid header"),
                        )
                    }
                    (tiny_http::Method::Get, _) => {
                        tiny_http::Response::from_string("safs: see /metrics\n")
                            .with_status_code(404)
                    }
                    _ => tiny_http::Response::from_string("").with_status_code(405),
                };
                if let Err(e) = req.respond(reply) {
                    tracing::debug!(error = %e, "metrics request");
                }
            }
        })?;
    Ok(())
}

/// One metric family's header.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A sample with no labels.
fn sample(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    family(out, name, kind, help);
    let _ = writeln!(out, "{name} {value}");
}

/// The figures of `s` in the text format.
pub fn render(s: &StatsReply) -> String {
    let mut out = String::with_capacity(16 << 10);
    let o = &mut out;
    family(
        o,
        "safs_requests_total",
        "counter",
        "FUSE requests answered, by operation.",
    );
    for op in &s.ops {
        let _ = writeln!(o, "safs_requests_total{{op=\"{}\"}} {}", op.op, op.count);
    }
    family(
        o,
        "safs_request_duration_seconds",
        "histogram",
        "Time spent in the daemon's handler per FUSE request, by operation.",
    );
    for op in &s.ops {
        let mut cumulative = 0u64;
        for (i, n) in op.hist.iter().enumerate() {
            cumulative += n;
            let le = match bucket_bound_us(i) {
                Some(us) => format!("{}", us as f64 / 1e6),
                None => "+Inf".into(),
            };
            let _ = writeln!(
                o,
                "safs_request_duration_seconds_bucket{{op=\"{}\",le=\"{le}\"}} {cumulative}",
                op.op
            );
        }
        let _ = writeln!(
            o,
            "safs_request_duration_seconds_sum{{op=\"{}\"}} {}",
            op.op,
            op.total_ns as f64 / 1e9
        );
        let _ = writeln!(
            o,
            "safs_request_duration_seconds_count{{op=\"{}\"}} {}",
            op.op, op.count
        );
    }
    family(
        o,
        "safs_engine_reads_total",
        "counter",
        "Metadata engine reads, by kind (point reads, scans).",
    );
    let _ = writeln!(
        o,
        "safs_engine_reads_total{{kind=\"get\"}} {}",
        s.engine.gets
    );
    let _ = writeln!(
        o,
        "safs_engine_reads_total{{kind=\"scan\"}} {}",
        s.engine.scans
    );
    sample(
        o,
        "safs_engine_commits_total",
        "counter",
        "Metadata engine commits (group-committed batches).",
        s.engine.commits,
    );
    if let Some(h) = &s.commits {
        sample(
            o,
            "safs_commits_failing",
            "gauge",
            "1 while commits fail (no space, I/O error) and are retried, else 0.",
            u8::from(h.failure.is_some()),
        );
        sample(
            o,
            "safs_commits_failing_seconds",
            "gauge",
            "How long commits have been failing.",
            h.failing_for_s,
        );
        sample(
            o,
            "safs_commit_waiting_records",
            "gauge",
            "Changes accepted and not yet durable.",
            h.waiting_records,
        );
        sample(
            o,
            "safs_space_held_bytes",
            "gauge",
            "Disk space the metadata engine holds ahead of its commits.",
            h.held_bytes,
        );
        sample(
            o,
            "safs_space_needed_bytes",
            "gauge",
            "Worst case of what is accepted and not yet committed.",
            h.need_bytes,
        );
    }
    sample(
        o,
        "safs_inode_cache_inodes",
        "gauge",
        "Inodes in the daemon's inode cache.",
        s.cached_inodes,
    );
    sample(
        o,
        "safs_inode_cache_bytes",
        "gauge",
        "Bytes the inode cache holds.",
        s.cache_bytes,
    );
    sample(
        o,
        "safs_inode_cache_limit_bytes",
        "gauge",
        "The most the inode cache may hold (cache_mb).",
        s.cache_budget_bytes,
    );
    family(
        o,
        "safs_inode_cache_loads_total",
        "counter",
        "Inode loads, answered by the inode cache (hit) or by the engine (miss).",
    );
    let _ = writeln!(
        o,
        "safs_inode_cache_loads_total{{result=\"hit\"}} {}",
        s.inode_cache_hits
    );
    let _ = writeln!(
        o,
        "safs_inode_cache_loads_total{{result=\"miss\"}} {}",
        s.inode_cache_misses
    );
    family(
        o,
        "safs_dircache_lookups_total",
        "counter",
        "Name lookups the directory cache answered (hit: an entry or a known absence) or not (miss).",
    );
    let _ = writeln!(
        o,
        "safs_dircache_lookups_total{{result=\"hit\"}} {}",
        s.dircache_hits
    );
    let _ = writeln!(
        o,
        "safs_dircache_lookups_total{{result=\"miss\"}} {}",
        s.dircache_misses
    );
    sample(
        o,
        "safs_dircache_directories",
        "gauge",
        "Directories in the directory cache.",
        s.dircache_dirs,
    );
    sample(
        o,
        "safs_dircache_bytes",
        "gauge",
        "Bytes the directory cache holds.",
        s.dircache_bytes,
    );
    sample(
        o,
        "safs_dircache_limit_bytes",
        "gauge",
        "The most the directory cache may hold (0: off).",
        s.dircache_budget_bytes,
    );
    sample(
        o,
        "safs_memory_anonymous_bytes",
        "gauge",
        "The daemon's anonymous resident memory (heap and caches).",
        s.rss_anon_kib * 1024,
    );
    sample(
        o,
        "safs_memory_peak_resident_bytes",
        "gauge",
        "The daemon's peak resident memory, memory-mapped engine pages included.",
        s.peak_rss_kib * 1024,
    );
    if let Some(queues) = &s.uring_queues {
        family(
            o,
            "safs_uring_queue_requests_total",
            "counter",
            "Requests each FUSE-over-io_uring queue served.",
        );
        for (q, n) in queues.iter().enumerate() {
            let _ = writeln!(o, "safs_uring_queue_requests_total{{queue=\"{q}\"}} {n}");
        }
    }
    if let Some(l) = &s.lease {
        sample(
            o,
            "safs_lease_takes_total",
            "counter",
            "Times this daemon took the volume's write lease (other daemons serve it too).",
            l.takes,
        );
        sample(
            o,
            "safs_lease_wait_seconds_total",
            "counter",
            "Time operations waited for the write lease, summed.",
            l.wait_ns as f64 / 1e9,
        );
    }
    if let Some(st) = &s.store {
        let gauges: [(&str, &str, u64); 5] = [
            (
                "safs_data_cache_bytes",
                "Bytes closed files' contents cached from the object store take.",
                st.cache_bytes,
            ),
            (
                "safs_data_cache_files",
                "Closed files whose contents are cached from the object store.",
                st.cache_files,
            ),
            (
                "safs_data_cache_limit_bytes",
                "The bound of the object store's cache (-o cache_size).",
                st.cache_limit_bytes,
            ),
            (
                "safs_store_uploads_waiting",
                "Uploads running and closed files whose upload failed (tried again at unmount).",
                st.uploads_waiting,
            ),
            (
                "safs_store_deletions_queued",
                "Objects queued for the deleter (a removed file counts one), counted up to 1000.",
                st.deletions_queued,
            ),
        ];
        for (name, help, v) in gauges {
            sample(o, name, "gauge", help, v);
        }
        let counters: [(&str, &str, u64); 9] = [
            (
                "safs_data_cache_hits_total",
                "Opens and truncates whose contents were cached.",
                st.hits,
            ),
            (
                "safs_data_cache_misses_total",
                "Opens and truncates that fetched blocks from the object store.",
                st.misses,
            ),
            (
                "safs_store_fetched_blocks_total",
                "Blocks fetched from the object store.",
                st.fetched_blocks,
            ),
            (
                "safs_store_fetched_bytes_total",
                "Bytes fetched from the object store.",
                st.fetched_bytes,
            ),
            (
                "safs_store_uploaded_blocks_total",
                "Blocks uploaded to the object store.",
                st.uploaded_blocks,
            ),
            (
                "safs_store_uploaded_bytes_total",
                "Bytes uploaded to the object store.",
                st.uploaded_bytes,
            ),
            (
                "safs_store_deleted_objects_total",
                "Objects no record names any more, deleted from the store.",
                st.deleted_objects,
            ),
            (
                "safs_data_cache_evicted_files_total",
                "Cached files dropped to keep the cache within its bound.",
                st.evicted_files,
            ),
            (
                "safs_data_cache_evicted_bytes_total",
                "Bytes of cached files dropped to keep the cache within its bound.",
                st.evicted_bytes,
            ),
        ];
        for (name, help, v) in counters {
            sample(o, name, "counter", help, v);
        }
    }
    sample(
        o,
        "safs_broken_counts_total",
        "counter",
        "Impossible counts met (0 unless safs has a bug).",
        s.broken_counts,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use safs_control::{BUCKETS, OpReport};

    #[test]
    fn histograms_are_cumulative_and_end_at_the_count() {
        let mut hist = vec![0u64; BUCKETS];
        hist[3] = 2;
        hist[10] = 5;
        hist[BUCKETS - 1] = 1;
        let s = StatsReply {
            ops: vec![OpReport {
                op: "getxattr".into(),
                count: 8,
                total_ns: 1_500_000,
                hist,
            }],
            ..StatsReply::default()
        };
        let text = render(&s);
        assert!(
            text.contains("safs_requests_total{op=\"getxattr\"} 8\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "safs_request_duration_seconds_bucket{op=\"getxattr\",le=\"0.000008\"} 2\n"
            )
        );
        assert!(
            text.contains(
                "safs_request_duration_seconds_bucket{op=\"getxattr\",le=\"0.001024\"} 7\n"
            )
        );
        assert!(
            text.contains("safs_request_duration_seconds_bucket{op=\"getxattr\",le=\"+Inf\"} 8\n")
        );
        assert!(text.contains("safs_request_duration_seconds_sum{op=\"getxattr\"} 0.0015\n"));
        assert!(text.contains("safs_request_duration_seconds_count{op=\"getxattr\"} 8\n"));
        // Every family is declared once, before its samples.
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE")).collect();
        let mut names: Vec<&str> = types.iter().map(|l| l.split(' ').nth(2).unwrap()).collect();
        let n = names.len();
        names.dedup();
        assert_eq!(n, names.len());
    }
}
