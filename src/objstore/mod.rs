//! The object store that holds file contents on volumes formatted with
//! `--data s3://...` (any store with Amazon S3's API: AWS, Ceph radosgw,
//! MinIO, SeaweedFS...): a blocking client for the daemon's threads over
//! Apache Arrow's `object_store` (its own runtime, signing and retries),
//! with every call bounded in time and every failure said in one line.
//!
//! Keys live under the URL's prefix; what they hold (immutable content
//! blocks) is the data layer's business, not this client's.

mod config;

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use object_store::{ClientOptions, ObjectStore as _, ObjectStoreExt as _, PutPayload, RetryConfig};

pub use config::{StoreConfig, StoreUrl};

/// Why a call to the store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("{url}: not an object store URL ({why}); give s3://BUCKET or s3://BUCKET/PREFIX")]
    BadUrl { url: String, why: String },
    #[error(
        "no credentials for {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, \
         or put them in profile [{profile}] of ~/.aws/credentials"
    )]
    NoCredentials { url: String, profile: String },
    #[error("AWS_ENDPOINT_URL {0}: it must start with http:// or https://")]
    BadEndpoint(String),
    #[error("cannot reach the object store at {endpoint}: {detail}")]
    Unreachable { endpoint: String, detail: String },
    #[error(
        "the object store at {endpoint} refused the credentials (access key {access_key}): {detail}"
    )]
    Refused {
        endpoint: String,
        access_key: String,
        detail: String,
    },
    #[error(
        "bucket {bucket} does not exist at {endpoint}: create it with your store's tools \
         (e.g. s3cmd mb s3://{bucket})"
    )]
    NoBucket { bucket: String, endpoint: String },
    #[error("object {0} not found in the store")]
    NotFound(String),
    #[error("the object store at {endpoint} did not answer within {timeout:?}")]
    Timeout { endpoint: String, timeout: Duration },
    #[error("object store at {endpoint}: {detail}")]
    Other { endpoint: String, detail: String },
}

impl StoreError {
    /// What a file operation that met this error fails with.
    pub fn errno(&self) -> i32 {
        match self {
            StoreError::NotFound(_) => libc::ENOENT,
            _ => libc::EIO,
        }
    }
}

/// Why [`Store::get_each`] stopped: the store, or the caller's `each`.
#[derive(Debug)]
pub enum GetError {
    Store(StoreError),
    Each(std::io::Error),
}

/// Objects being stored in the background (see [`Store::puts`]); dropped,
/// it abandons those not done.
pub struct Puts<'a> {
    store: &'a Store,
    set: tokio::task::JoinSet<Result<(), (String, object_store::Error)>>,
}

impl Puts<'_> {
    /// Starts storing `data` as object `key`, once fewer than [`PARALLEL`]
    /// are in flight; an earlier one's failure is returned here.
    pub fn put(&mut self, key: String, data: Vec<u8>) -> Result<(), StoreError> {
        while self.set.len() >= PARALLEL {
            self.wait_one()?;
        }
        let path = self.store.key(&key)?;
        let s3 = Arc::clone(&self.store.s3);
        self.set.spawn_on(
            async move {
                s3.put(&path, PutPayload::from(data))
                    .await
                    .map(drop)
                    .map_err(|e| (key, e))
            },
            self.store.rt.handle(),
        );
        Ok(())
    }

    /// Waits for every object started to be stored.
    pub fn finish(mut self) -> Result<(), StoreError> {
        while !self.set.is_empty() {
            self.wait_one()?;
        }
        Ok(())
    }

    fn wait_one(&mut self) -> Result<(), StoreError> {
        let s = self.store;
        let bound = s.limits.timeout + Duration::from_secs(1);
        match s
            .rt
            .block_on(async { tokio::time::timeout(bound, self.set.join_next()).await })
        {
            Ok(None | Some(Ok(Ok(())))) => Ok(()),
            Ok(Some(Ok(Err((k, e))))) => Err(s.classify(Some(&k), e)),
            Ok(Some(Err(e))) => Err(StoreError::Other {
                endpoint: s.config.endpoint_name(),
                detail: format!("an upload task failed: {e}"),
            }),
            Err(_) => Err(StoreError::Timeout {
                endpoint: s.config.endpoint_name(),
                timeout: s.limits.timeout,
            }),
        }
    }
}

/// Requests in flight at once in [`Store::puts`] and [`Store::get_each`]:
/// one stream is bound by a request's latency (a 4 MiB PUT takes ~30 ms on
/// this machine's radosgw: 125 MB/s), the store is not.
pub const PARALLEL: usize = 8;

/// What [`Store::get_each`] does with one object's bytes as they arrive
/// (on a thread of the client's runtime: quick work, a write into the page
/// cache at most).
pub trait Sink: Send + 'static {
    /// What the whole object made, handed back in key order.
    type Made: Send + 'static;
    /// The object's next bytes, `at` bytes from its start.
    /// (`data` as the client received it: kept without a copy.)
    fn piece(&mut self, at: u64, data: bytes::Bytes) -> std::io::Result<()>;
    /// The object ended, `len` bytes long.
    fn end(self, len: u64) -> std::io::Result<Self::Made>;
}

/// Bounds on each call.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A call that has not succeeded after this long fails (retries
    /// included): `-o data_timeout=`.
    pub timeout: Duration,
    /// How long a connection may take to open.
    pub connect: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: Duration::from_secs(30),
            connect: Duration::from_secs(5),
        }
    }
}

/// An object's key (under the prefix) and size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub key: String,
    pub size: u64,
}

/// A client of one bucket and prefix.
pub struct Store {
    s3: Arc<AmazonS3>,
    /// The client's own: the daemon's threads call in and wait.
    rt: tokio::runtime::Runtime,
    config: StoreConfig,
    limits: Limits,
}

impl Store {
    pub fn new(config: StoreConfig, limits: Limits) -> Result<Store, StoreError> {
        // TLS to the store through ring, the crypto the rest of safs uses
        // (reqwest is built without a provider of its own). Installed once
        // per process: a second call finds it there, which is no error.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&config.url.bucket)
            .with_region(&config.region)
            .with_access_key_id(&config.access_key)
            .with_secret_access_key(&config.secret_key)
            .with_client_options(
                ClientOptions::new()
                    .with_connect_timeout(limits.connect)
                    .with_timeout(limits.timeout),
            )
            // The signature covers the headers, not the body: hashing
            // every byte for it cost this client and the store a core's
            // worth on large writes, and every block is checked end to
            // end against the hash its record keeps anyway.
            .with_unsigned_payload(true)
            .with_retry(RetryConfig {
                max_retries: 10,
                retry_timeout: limits.timeout,
                ..RetryConfig::default()
            });
        if let Some(t) = &config.session_token {
            b = b.with_token(t);
        }
        if let Some(e) = &config.endpoint {
            // Stores other than AWS: path-style, and plain HTTP if asked.
            b = b
                .with_endpoint(e)
                .with_virtual_hosted_style_request(false)
                .with_allow_http(e.starts_with("http://"));
        }
        let s3 = b.build().map_err(|e| StoreError::Other {
            endpoint: config.endpoint_name(),
            detail: e.to_string(),
        })?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("safs-store")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Other {
                endpoint: config.endpoint_name(),
                detail: format!("cannot start the client's runtime: {e}"),
            })?;
        Ok(Store {
            s3: Arc::new(s3),
            rt,
            config,
            limits,
        })
    }

    pub fn url(&self) -> &StoreUrl {
        &self.config.url
    }

    /// Checks that the endpoint answers, takes the credentials and has the
    /// bucket: one listing of at most a page under the prefix.
    pub fn check(&self) -> Result<(), StoreError> {
        let prefix = self.key("")?;
        self.call(None, async {
            self.s3.list_with_delimiter(Some(&prefix)).await.map(drop)
        })
    }

    /// Stores `data` as object `key` (whole: objects are never changed).
    pub fn put(&self, key: &str, data: Vec<u8>) -> Result<(), StoreError> {
        let k = self.key(key)?;
        self.call(Some(key), async {
            self.s3.put(&k, PutPayload::from(data)).await.map(drop)
        })
    }

    /// The whole of object `key`.
    pub fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let k = self.key(key)?;
        self.call(Some(key), async {
            Ok(self.s3.get(&k).await?.bytes().await?.to_vec())
        })
    }

    /// Bytes `range` of object `key` (short at its end).
    pub fn get_range(&self, key: &str, range: Range<u64>) -> Result<Vec<u8>, StoreError> {
        let k = self.key(key)?;
        self.call(Some(key), async {
            Ok(self.s3.get_range(&k, range).await?.to_vec())
        })
    }

    /// Uploads that run while the caller reads and hashes the next block:
    /// [`Puts::put`] waits only once [`PARALLEL`] are in flight.
    pub fn puts(&self) -> Puts<'_> {
        Puts {
            store: self,
            set: tokio::task::JoinSet::new(),
        }
    }

    /// Every object `keys` names, [`PARALLEL`] at once, each given piece
    /// by piece as it arrives to the [`Sink`] `sink` makes for it — on the
    /// client's threads: a piece is hashed while it is still in the CPU's
    /// cache, and no object is first gathered into one buffer (on a cold
    /// read that copy, a second pass to hash and the hand-off to another
    /// thread were much of what the daemon spent per byte) — and what each sink made
    /// then handed to `each` on the caller's thread, in key order.
    pub fn get_each<K: Sink>(
        &self,
        keys: &[String],
        sink: impl Fn(usize) -> K + Send + Sync + 'static,
        mut each: impl FnMut(usize, K::Made) -> std::io::Result<()>,
    ) -> Result<(), GetError> {
        let sink = Arc::new(sink);
        let mut flight = std::collections::VecDeque::new();
        let bound = self.limits.timeout + Duration::from_secs(1);
        let mut next = 0;
        while next < keys.len() || !flight.is_empty() {
            while next < keys.len() && flight.len() < PARALLEL {
                let path = self.key(&keys[next]).map_err(GetError::Store)?;
                let s3 = Arc::clone(&self.s3);
                let sink = Arc::clone(&sink);
                let i = next;
                flight.push_back(self.rt.spawn(async move {
                    let mut body = s3.get(&path).await?.into_stream();
                    let mut into = sink(i);
                    let mut at = 0u64;
                    while let Some(piece) = body.try_next().await? {
                        let n = piece.len() as u64;
                        if let Err(e) = into.piece(at, piece) {
                            return Ok(Err(e));
                        }
                        at += n;
                    }
                    Ok::<_, object_store::Error>(into.end(at))
                }));
                next += 1;
            }
            let i = next - flight.len();
            let task = flight.pop_front().expect("one in flight");
            let got = self
                .rt
                .block_on(async { tokio::time::timeout(bound, task).await });
            let made = match got {
                Ok(Ok(Ok(made))) => made.map_err(GetError::Each)?,
                Ok(Ok(Err(e))) => return Err(GetError::Store(self.classify(Some(&keys[i]), e))),
                Ok(Err(e)) => {
                    return Err(GetError::Store(StoreError::Other {
                        endpoint: self.config.endpoint_name(),
                        detail: format!("a download task failed: {e}"),
                    }));
                }
                Err(_) => {
                    return Err(GetError::Store(StoreError::Timeout {
                        endpoint: self.config.endpoint_name(),
                        timeout: self.limits.timeout,
                    }));
                }
            };
            each(i, made).map_err(GetError::Each)?;
        }
        Ok(())
    }

    /// Deletes object `key`; one already gone is no error.
    pub fn delete(&self, key: &str) -> Result<(), StoreError> {
        let k = self.key(key)?;
        match self.call(Some(key), async { self.s3.delete(&k).await }) {
            Err(StoreError::NotFound(_)) => Ok(()),
            r => r,
        }
    }

    /// Every object under `under` (a key prefix below the URL's prefix),
    /// in key order.
    pub fn list(&self, under: &str) -> Result<Vec<Listed>, StoreError> {
        let prefix = self.key(under)?;
        let strip = self.key("")?.to_string();
        let mut found: Vec<Listed> = self.call(None, async {
            self.s3
                .list(Some(&prefix))
                .map_ok(|m| Listed {
                    key: m
                        .location
                        .as_ref()
                        .strip_prefix(strip.as_str())
                        .unwrap_or(m.location.as_ref())
                        .trim_start_matches('/')
                        .to_string(),
                    size: m.size,
                })
                .try_collect()
                .await
        })?;
        found.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(found)
    }

    /// `key` under the URL's prefix.
    fn key(&self, key: &str) -> Result<Key, StoreError> {
        let full = match (self.config.url.prefix.as_str(), key) {
            ("", k) => k.to_string(),
            (p, "") => p.to_string(),
            (p, k) => format!("{p}/{k}"),
        };
        Key::parse(&full).map_err(|e| StoreError::Other {
            endpoint: self.config.endpoint_name(),
            detail: format!("key {full}: {e}"),
        })
    }

    /// Runs `fut` on the client's runtime, bounded by the timeout, and says
    /// what a failure was.
    fn call<T>(
        &self,
        key: Option<&str>,
        fut: impl std::future::Future<Output = object_store::Result<T>>,
    ) -> Result<T, StoreError> {
        // A margin over the client's own bound, which covers its retries.
        let bound = self.limits.timeout + Duration::from_secs(1);
        match self
            .rt
            .block_on(async { tokio::time::timeout(bound, fut).await })
        {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.classify(key, e)),
            Err(_) => Err(StoreError::Timeout {
                endpoint: self.config.endpoint_name(),
                timeout: self.limits.timeout,
            }),
        }
    }

    fn classify(&self, key: Option<&str>, e: object_store::Error) -> StoreError {
        let endpoint = self.config.endpoint_name();
        let detail = chain(&e);
        let has = |s: &str| detail.contains(s);
        if has("NoSuchBucket") {
            return StoreError::NoBucket {
                bucket: self.config.url.bucket.clone(),
                endpoint,
            };
        }
        if matches!(
            e,
            object_store::Error::Unauthenticated { .. }
                | object_store::Error::PermissionDenied { .. }
        ) || has("InvalidAccessKeyId")
            || has("SignatureDoesNotMatch")
            || has("AccessDenied")
        {
            return StoreError::Refused {
                endpoint,
                access_key: self.config.access_key.clone(),
                detail: first_line(&detail),
            };
        }
        if let (object_store::Error::NotFound { .. }, Some(k)) = (&e, key) {
            return StoreError::NotFound(k.to_string());
        }
        if has("error sending request")
            || has("Connection refused")
            || has("dns error")
            || has("timed out")
            || has("connection closed")
        {
            return StoreError::Unreachable {
                endpoint,
                detail: first_line(&detail),
            };
        }
        StoreError::Other {
            endpoint,
            detail: first_line(&detail),
        }
    }
}

/// An error and its sources, as one string.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// A message short enough for a log line or a terminal.
fn first_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or_default();
    match line.char_indices().nth(400) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_string(),
    }
}
