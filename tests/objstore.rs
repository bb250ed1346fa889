//! The object store client against a real S3 server: a one-node Ceph
//! cluster with radosgw on 127.0.0.1 (`safs-s3server`; the test script
//! starts one for the whole run; without it each test starts its own).
//! Objects go in and come back whole and by range, are listed under the
//! prefix and deleted; wrong keys, a missing bucket, an endpoint nobody
//! listens on and a gateway that goes away are each one clear error,
//! within the time bound, and the same client works again once the
//! gateway is back.

use std::time::{Duration, Instant};

use safs::objstore::{Limits, Store, StoreConfig, StoreError};
use safs_s3server::{ACCESS_KEY, SECRET_KEY, TempRgw};

/// The test script's server, else one of this test's own (stopped when
/// the returned guard drops, also on failure), with a fresh bucket.
struct Server {
    rgw: TempRgw,
    bucket: String,
    _dir: tempfile::TempDir,
}

fn server(name: &str) -> Server {
    let dir = tempfile::Builder::new()
        .prefix("safs-s3")
        .tempdir_in("/tmp")
        .unwrap();
    let rgw = TempRgw::shared_or_start(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    // Unique across runs that share one server (a pid can come again).
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let bucket = format!("safs-{name}-{stamp:x}");
    rgw.create_bucket(&bucket).unwrap_or_else(|e| panic!("{e}"));
    Server {
        rgw,
        bucket,
        _dir: dir,
    }
}

fn config(srv: &Server, url: &str, pairs: &[(&str, &str)]) -> Result<StoreConfig, StoreError> {
    let mut env: Vec<(String, String)> = vec![
        ("AWS_ACCESS_KEY_ID".into(), ACCESS_KEY.into()),
        ("AWS_SECRET_ACCESS_KEY".into(), SECRET_KEY.into()),
        ("AWS_ENDPOINT_URL".into(), srv.rgw.endpoint().into()),
    ];
    for (k, v) in pairs {
        env.retain(|(ek, _)| ek != k);
        env.push((k.to_string(), v.to_string()));
    }
    StoreConfig::resolve(
        url,
        &move |k| env.iter().find(|(ek, _)| ek == k).map(|(_, v)| v.clone()),
        None,
    )
}

fn store(srv: &Server, url: &str, limits: Limits) -> Store {
    Store::new(config(srv, url, &[]).unwrap(), limits).unwrap()
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn objects_go_in_and_come_back_whole_by_range_listed_and_deleted() {
    let srv = server("roundtrip");
    let b = &srv.bucket;
    let s = store(&srv, &format!("s3://{b}/vol/one"), Limits::default());
    s.check().unwrap();
    let big = pattern(7, 5 << 20);
    s.put("blocks/00/a", b"small".to_vec()).unwrap();
    s.put("blocks/01/b", big.clone()).unwrap();
    s.put("other", Vec::new()).unwrap();
    assert_eq!(s.get("blocks/00/a").unwrap(), b"small");
    assert_eq!(s.get("blocks/01/b").unwrap(), big);
    assert_eq!(s.get("other").unwrap(), b"");
    assert_eq!(
        s.get_range("blocks/01/b", 4096..12_288).unwrap(),
        &big[4096..12_288]
    );
    let listed = s.list("blocks").unwrap();
    let keys: Vec<(&str, u64)> = listed.iter().map(|l| (l.key.as_str(), l.size)).collect();
    assert_eq!(keys, [("blocks/00/a", 5), ("blocks/01/b", 5 << 20)]);
    // Another prefix of the same bucket sees none of it.
    let t = store(&srv, &format!("s3://{b}/vol/two"), Limits::default());
    assert!(t.list("").unwrap().is_empty());
    assert!(matches!(t.get("other"), Err(StoreError::NotFound(_))));
    s.delete("blocks/00/a").unwrap();
    s.delete("blocks/00/a").unwrap();
    assert!(matches!(s.get("blocks/00/a"), Err(StoreError::NotFound(k)) if k == "blocks/00/a"));
    assert_eq!(s.list("").unwrap().len(), 2);
}

#[test]
fn wrong_keys_a_missing_bucket_and_no_listener_are_each_one_clear_error() {
    let srv = server("errors");
    let url = format!("s3://{}", srv.bucket);
    let wrong = Store::new(
        config(&srv, &url, &[("AWS_SECRET_ACCESS_KEY", "not-the-secret")]).unwrap(),
        Limits::default(),
    )
    .unwrap();
    let e = wrong.check().unwrap_err();
    assert!(matches!(e, StoreError::Refused { .. }), "{e}");
    assert!(e.to_string().contains(ACCESS_KEY), "{e}");
    let unknown = Store::new(
        config(&srv, &url, &[("AWS_ACCESS_KEY_ID", "NOSUCHKEY")]).unwrap(),
        Limits::default(),
    )
    .unwrap();
    assert!(matches!(unknown.check(), Err(StoreError::Refused { .. })));

    let e = store(&srv, "s3://no-such-bucket-here", Limits::default())
        .check()
        .unwrap_err();
    assert!(matches!(e, StoreError::NoBucket { .. }), "{e}");
    assert!(e.to_string().contains("no-such-bucket-here"), "{e}");

    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nobody = Store::new(
        config(
            &srv,
            &url,
            &[("AWS_ENDPOINT_URL", &format!("http://127.0.0.1:{port}"))],
        )
        .unwrap(),
        Limits {
            timeout: Duration::from_secs(3),
            connect: Duration::from_secs(1),
        },
    )
    .unwrap();
    let start = Instant::now();
    let e = nobody.check().unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::Unreachable { .. } | StoreError::Timeout { .. }
        ),
        "{e}"
    );
    assert!(e.to_string().contains(&port.to_string()), "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(e.errno(), libc::EIO);
}

#[test]
fn a_gateway_that_goes_away_fails_calls_in_time_and_its_return_heals_them() {
    // A server of its own: stopping the shared one would fail other tests.
    let dir = tempfile::Builder::new()
        .prefix("safs-s3-own")
        .tempdir_in("/tmp")
        .unwrap();
    let own = TempRgw::start(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    own.create_bucket("fault-bucket").unwrap();
    let cfg = StoreConfig::resolve(
        "s3://fault-bucket",
        &|k| match k {
            "AWS_ACCESS_KEY_ID" => Some(ACCESS_KEY.into()),
            "AWS_SECRET_ACCESS_KEY" => Some(SECRET_KEY.into()),
            "AWS_ENDPOINT_URL" => Some(own.endpoint().into()),
            _ => None,
        },
        None,
    )
    .unwrap();
    let s = Store::new(
        cfg,
        Limits {
            timeout: Duration::from_secs(4),
            connect: Duration::from_secs(1),
        },
    )
    .unwrap();
    s.put("k", b"before".to_vec()).unwrap();
    own.stop_gateway().unwrap();
    let start = Instant::now();
    let e = s.get("k").unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::Unreachable { .. } | StoreError::Timeout { .. }
        ),
        "{e}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "{:?}",
        start.elapsed()
    );
    own.start_gateway().unwrap();
    assert_eq!(s.get("k").unwrap(), b"before");
    s.put("k2", b"after".to_vec()).unwrap();
    assert_eq!(s.get("k2").unwrap(), b"after");
}
