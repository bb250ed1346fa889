//! Where the object store is and who we are to it: an `s3://BUCKET/PREFIX`
//! URL, and credentials, region and endpoint the standard AWS way —
//! `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` (`AWS_SESSION_TOKEN`), else
//! the profile `AWS_PROFILE` (or `default`) of `~/.aws/credentials`
//! (`AWS_SHARED_CREDENTIALS_FILE`); `AWS_REGION`/`AWS_DEFAULT_REGION`, else
//! the profile's `region` in `~/.aws/config` (`AWS_CONFIG_FILE`), else
//! `us-east-1`; `AWS_ENDPOINT_URL_S3`/`AWS_ENDPOINT_URL` for stores other
//! than AWS (Ceph radosgw, MinIO, SeaweedFS...), addressed path-style.
//!
//! Secrets are read at mount from the environment of the process, never
//! stored in the volume or the database: only the URL is.

use std::path::{Path, PathBuf};

use super::StoreError;

/// `s3://BUCKET[/PREFIX]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreUrl {
    pub bucket: String,
    /// Without leading or trailing `/`; empty for the bucket's root.
    pub prefix: String,
}

impl StoreUrl {
    pub fn parse(url: &str) -> Result<StoreUrl, StoreError> {
        let bad = |why: &str| StoreError::BadUrl {
            url: url.to_string(),
            why: why.to_string(),
        };
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| bad("it must start with s3://"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        // S3's bucket naming rules (the common subset every store takes).
        let valid = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && bucket.as_bytes()[0].is_ascii_alphanumeric()
            && bucket.as_bytes()[bucket.len() - 1].is_ascii_alphanumeric();
        if !valid {
            return Err(bad(
                "the bucket name must be 3 to 63 lower-case letters, digits, '-' or '.'",
            ));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|p| p == "." || p == "..")
            || prefix.contains("//")
            || prefix.bytes().any(|b| b.is_ascii_control())
        {
            return Err(bad("the prefix must be plain path components"));
        }
        Ok(StoreUrl {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "s3://{}", self.bucket)
        } else {
            write!(f, "s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

/// Everything needed to reach the store, resolved.
#[derive(Clone)]
pub struct StoreConfig {
    pub url: StoreUrl,
    pub access_key: String,
    pub secret_key: String,
    pub session_token: Option<String>,
    pub region: String,
    /// `None`: AWS itself (virtual-hosted addressing).
    pub endpoint: Option<String>,
}

impl std::fmt::Debug for StoreConfig {
    /// Never shows the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreConfig")
            .field("url", &self.url)
            .field("access_key", &self.access_key)
            .field("region", &self.region)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl StoreConfig {
    /// Resolves `url` from this process's environment and home directory.
    pub fn from_env(url: &str) -> Result<StoreConfig, StoreError> {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        StoreConfig::resolve(url, &|k| std::env::var(k).ok(), home.as_deref())
    }

    /// Resolves `url` with `env` for the environment and `home` for the
    /// `~/.aws` files.
    pub fn resolve(
        url: &str,
        env: &dyn Fn(&str) -> Option<String>,
        home: Option<&Path>,
    ) -> Result<StoreConfig, StoreError> {
        let url = StoreUrl::parse(url)?;
        let get = |k: &str| env(k).filter(|v| !v.is_empty());
        let profile = get("AWS_PROFILE").unwrap_or_else(|| "default".into());
        let aws_file = |var: &str, name: &str| -> Option<PathBuf> {
            get(var)
                .map(PathBuf::from)
                .or_else(|| home.map(|h| h.join(".aws").join(name)))
        };
        let (access_key, secret_key, session_token) =
            match (get("AWS_ACCESS_KEY_ID"), get("AWS_SECRET_ACCESS_KEY")) {
                (Some(a), Some(s)) => (a, s, get("AWS_SESSION_TOKEN")),
                _ => {
                    let file = aws_file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
                    let section = file.as_deref().and_then(|f| read_section(f, &profile));
                    let value = |k: &str| section.as_ref().and_then(|s| s.get(k).cloned());
                    match (value("aws_access_key_id"), value("aws_secret_access_key")) {
                        (Some(a), Some(s)) => (a, s, value("aws_session_token")),
                        _ => {
                            return Err(StoreError::NoCredentials {
                                url: url.to_string(),
                                profile,
                            });
                        }
                    }
                }
            };
        // ~/.aws/config names profiles other than the default "profile X".
        let config_section = if profile == "default" {
            profile.clone()
        } else {
            format!("profile {profile}")
        };
        let region = get("AWS_REGION")
            .or_else(|| get("AWS_DEFAULT_REGION"))
            .or_else(|| {
                aws_file("AWS_CONFIG_FILE", "config")
                    .and_then(|f| read_section(&f, &config_section))
                    .and_then(|s| s.get("region").cloned())
            })
            .unwrap_or_else(|| "us-east-1".into());
        let endpoint = get("AWS_ENDPOINT_URL_S3")
            .or_else(|| get("AWS_ENDPOINT_URL"))
            .map(|e| e.trim_end_matches('/').to_string());
        if let Some(e) = &endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return Err(StoreError::BadEndpoint(e.clone()));
            }
        }
        Ok(StoreConfig {
            url,
            access_key,
            secret_key,
            session_token,
            region,
            endpoint,
        })
    }

    /// Where requests go, as messages name it.
    pub fn endpoint_name(&self) -> String {
        self.endpoint
            .clone()
            .unwrap_or_else(|| format!("https://s3.{}.amazonaws.com", self.region))
    }
}

/// The keys of section `name` of the INI file `path` (None if either is
/// missing or the file cannot be read).
fn read_section(path: &Path, name: &str) -> Option<std::collections::HashMap<String, String>> {
    let ini = ini::Ini::load_from_file(path).ok()?;
    let section = ini.section(Some(name))?;
    Some(
        section
            .iter()
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn urls_name_a_bucket_and_a_prefix() {
        let u = StoreUrl::parse("s3://my-bucket/a/b/").unwrap();
        assert_eq!((u.bucket.as_str(), u.prefix.as_str()), ("my-bucket", "a/b"));
        assert_eq!(u.to_string(), "s3://my-bucket/a/b");
        assert_eq!(StoreUrl::parse("s3://bkt").unwrap().prefix, "");
        for bad in [
            "bucket",
            "http://bucket/x",
            "s3://",
            "s3://ab",
            "s3://Upper",
            "s3://-dash",
            "s3://b_u",
            "s3://bucket/a/../b",
            "s3://bucket/a//b",
        ] {
            assert!(
                matches!(StoreUrl::parse(bad), Err(StoreError::BadUrl { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_environment_comes_first_then_the_aws_files() {
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join(".aws")).unwrap();
        std::fs::write(
            home.path().join(".aws/credentials"),
            "[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = filesecret\n\
             [other]\naws_access_key_id=OTHERKEY\naws_secret_access_key=othersecret\n",
        )
        .unwrap();
        std::fs::write(
            home.path().join(".aws/config"),
            "[default]\nregion = eu-west-3\n[profile other]\nregion = ap-south-1\n",
        )
        .unwrap();
        let h = Some(home.path());
        let c = StoreConfig::resolve("s3://bkt", &env(&[]), h).unwrap();
        assert_eq!(
            (
                c.access_key.as_str(),
                c.secret_key.as_str(),
                c.region.as_str()
            ),
            ("FILEKEY", "filesecret", "eu-west-3")
        );
        assert_eq!(c.endpoint, None);
        let c = StoreConfig::resolve("s3://bkt", &env(&[("AWS_PROFILE", "other")]), h).unwrap();
        assert_eq!(
            (c.access_key.as_str(), c.region.as_str()),
            ("OTHERKEY", "ap-south-1")
        );
        let c = StoreConfig::resolve(
            "s3://bkt",
            &env(&[
                ("AWS_ACCESS_KEY_ID", "ENVKEY"),
                ("AWS_SECRET_ACCESS_KEY", "envsecret"),
                ("AWS_REGION", "us-west-2"),
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:7480/"),
            ]),
            h,
        )
        .unwrap();
        assert_eq!(
            (
                c.access_key.as_str(),
                c.region.as_str(),
                c.endpoint.as_deref()
            ),
            ("ENVKEY", "us-west-2", Some("http://127.0.0.1:7480"))
        );
        assert!(
            !format!("{c:?}").contains("envsecret"),
            "Debug hides the secret"
        );
    }

    #[test]
    fn missing_credentials_and_a_bad_endpoint_are_clear_errors() {
        let home = tempfile::tempdir().unwrap();
        let e = StoreConfig::resolve("s3://bkt", &env(&[]), Some(home.path())).unwrap_err();
        assert!(matches!(e, StoreError::NoCredentials { .. }), "{e}");
        assert!(e.to_string().contains("AWS_ACCESS_KEY_ID"), "{e}");
        let e = StoreConfig::resolve(
            "s3://bkt",
            &env(&[
                ("AWS_ACCESS_KEY_ID", "k"),
                ("AWS_SECRET_ACCESS_KEY", "s"),
                ("AWS_ENDPOINT_URL", "127.0.0.1:7480"),
            ]),
            None,
        )
        .unwrap_err();
        assert!(matches!(e, StoreError::BadEndpoint(_)), "{e}");
    }
}
