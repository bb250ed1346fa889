//! The S3 server of the tests whose volumes keep their contents in an
//! object store: the one the test script starts for the whole run (found
//! through the variables `safs-s3server start` prints), else one of this
//! test binary's own, stopped when the binary exits.
#![allow(dead_code)]

use std::sync::OnceLock;

use safs_s3server::{ACCESS_KEY, SECRET_KEY, TempRgw};

static SERVER: OnceLock<(TempRgw, tempfile::TempDir)> = OnceLock::new();

/// Stops this binary's own server when the binary exits (statics are never
/// dropped).
extern "C" fn stop_own_server() {
    if let Some((rgw, _)) = SERVER.get() {
        if TempRgw::from_env().is_none() {
            let _ = TempRgw::stop_in(rgw.dir());
        }
    }
}

/// The server, started on first use when the script runs none.
pub fn server() -> &'static TempRgw {
    let (rgw, _) = SERVER.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("safs-s3")
            .tempdir_in("/tmp")
            .unwrap();
        let rgw = TempRgw::shared_or_start(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        if TempRgw::from_env().is_none() {
            // SAFETY: registers a function that takes no arguments and
            // only stops processes; atexit runs it once at exit.
            unsafe { libc::atexit(stop_own_server) };
        }
        (rgw, dir)
    });
    rgw
}

/// The environment a safs command needs to reach the server: credentials
/// and endpoint the standard AWS way.
pub fn env() -> Vec<(String, String)> {
    let rgw = server();
    vec![
        ("AWS_ACCESS_KEY_ID".into(), ACCESS_KEY.into()),
        ("AWS_SECRET_ACCESS_KEY".into(), SECRET_KEY.into()),
        ("AWS_ENDPOINT_URL".into(), rgw.endpoint().into()),
        ("AWS_REGION".into(), "us-east-1".into()),
    ]
}

/// A new bucket for one test, and its URL with a prefix.
pub fn bucket(name: &str) -> String {
    let rgw = server();
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let bucket = format!("safs-{name}-{stamp:x}");
    rgw.create_bucket(&bucket).unwrap_or_else(|e| panic!("{e}"));
    format!("s3://{bucket}/vol")
}

/// Throws a node's cache of the volume `vol` away: every backing file.
pub fn lose_cache(vol: &std::path::Path) {
    for d in std::fs::read_dir(vol.join("data")).unwrap().flatten() {
        for f in std::fs::read_dir(d.path()).unwrap().flatten() {
            std::fs::remove_file(f.path()).unwrap();
        }
    }
}
