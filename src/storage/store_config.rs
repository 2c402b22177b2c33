//! Where objects live: a local directory, memory, or an S3-compatible bucket.

use std::fmt;
use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use serde::{Deserialize, Serialize};

use super::key::ObjectKey;
use super::store_error::{StorageError, StorageResult};

/// Where a run's objects are stored, as written in the run's YAML.
///
/// `url` picks the backend:
/// - `s3://bucket` or `s3://bucket/some/prefix`: an S3-compatible bucket (AWS S3, Cloudflare
///   R2, MinIO, s3s-fs). The endpoint, region and credentials come from the fields below when
///   set, else from the usual AWS environment variables (`AWS_ACCESS_KEY_ID`,
///   `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`, `AWS_SESSION_TOKEN`, ...).
///   An `http://` endpoint is allowed (local test servers); otherwise HTTPS is required.
///   Requests are path-style (`endpoint/bucket/key`), which all of these servers accept.
/// - `file:///abs/dir` or a plain path such as `./data/store`: a local directory, created if
///   missing (the embedded default).
/// - `memory://`: an in-process store, emptied when the process exits (tests).
///
/// The bucket must already exist: `object_store` cannot create buckets.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// The store URL (see the type's documentation).
    pub url: String,
    /// S3 endpoint, e.g. `http://127.0.0.1:9000` or `https://ACCOUNT.r2.cloudflarestorage.com`;
    /// `None` means AWS's regional endpoint or `AWS_ENDPOINT_URL`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// S3 region; `None` means `AWS_REGION`, else `us-east-1` (R2 wants `auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// S3 access key id; `None` means `AWS_ACCESS_KEY_ID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key_id: Option<String>,
    /// S3 secret access key; `None` means `AWS_SECRET_ACCESS_KEY`. Never printed by `Debug`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_access_key: Option<String>,
}

impl StorageConfig {
    /// A config for the local directory `dir`.
    pub fn local(dir: impl Into<String>) -> Self {
        Self {
            url: dir.into(),
            ..Self::default()
        }
    }
}

impl fmt::Debug for StorageConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StorageConfig")
            .field("url", &self.url)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// Which kind of backend a [`Storage`](super::store::Storage) talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// A local directory.
    Local,
    /// An in-process store.
    Memory,
    /// An S3-compatible bucket.
    S3,
}

/// An opened backend: the store, its presigner when it has one, and the key prefix.
pub(crate) struct Opened {
    pub store: Arc<dyn ObjectStore>,
    pub s3: Option<Arc<AmazonS3>>,
    pub prefix: Option<ObjectKey>,
    pub kind: BackendKind,
}

/// Opens the backend described by `config`.
pub(crate) fn open(config: &StorageConfig) -> StorageResult<Opened> {
    let url = config.url.trim();
    if url.is_empty() {
        return Err(bad_url(url, "empty storage URL"));
    }
    if let Some(rest) = url.strip_prefix("s3://") {
        return open_s3(config, rest);
    }
    if url == "memory://" || url == "memory:" {
        return Ok(Opened {
            store: Arc::new(InMemory::new()),
            s3: None,
            prefix: None,
            kind: BackendKind::Memory,
        });
    }
    let dir = if url.starts_with("file://") {
        let parsed = url::Url::parse(url).map_err(|e| bad_url(url, &e.to_string()))?;
        parsed
            .to_file_path()
            .map_err(|()| bad_url(url, "not an absolute local path"))?
    } else if url.contains("://") {
        return Err(bad_url(
            url,
            "unsupported scheme (use s3://, file://, memory:// or a plain directory path)",
        ));
    } else {
        std::path::PathBuf::from(url)
    };
    std::fs::create_dir_all(&dir).map_err(|source| StorageError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let local = LocalFileSystem::new_with_prefix(&dir)
        .map_err(|source| StorageError::from_backend(&dir.display().to_string(), source))?
        // Remove directories left empty by deletes, so garbage collection leaves no husks.
        .with_automatic_cleanup(true);
    Ok(Opened {
        store: Arc::new(local),
        s3: None,
        prefix: None,
        kind: BackendKind::Local,
    })
}

fn open_s3(config: &StorageConfig, rest: &str) -> StorageResult<Opened> {
    let url = &config.url;
    let (bucket, prefix) = match rest.split_once('/') {
        Some((bucket, prefix)) => (bucket, prefix.trim_end_matches('/')),
        None => (rest, ""),
    };
    if bucket.is_empty() {
        return Err(bad_url(url, "no bucket name"));
    }
    let prefix = if prefix.is_empty() {
        None
    } else {
        Some(ObjectKey::parse(prefix)?)
    };

    let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
    if let Some(endpoint) = &config.endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    if let Some(region) = &config.region {
        builder = builder.with_region(region);
    }
    if let Some(id) = &config.access_key_id {
        builder = builder.with_access_key_id(id);
    }
    if let Some(secret) = &config.secret_access_key {
        builder = builder.with_secret_access_key(secret);
    }
    let http_endpoint = builder
        .get_config_value(&AmazonS3ConfigKey::Endpoint)
        .is_some_and(|e| e.starts_with("http://"));
    if http_endpoint {
        builder = builder.with_allow_http(true);
    }
    let s3 = Arc::new(
        builder
            .build()
            .map_err(|e| bad_url(url, &format!("cannot configure S3 client: {e}")))?,
    );
    Ok(Opened {
        store: s3.clone(),
        s3: Some(s3),
        prefix,
        kind: BackendKind::S3,
    })
}

fn bad_url(url: &str, reason: &str) -> StorageError {
    StorageError::BadUrl {
        url: url.to_owned(),
        reason: reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_secret() {
        let config = StorageConfig {
            url: "s3://b".into(),
            secret_access_key: Some("hunter2".into()),
            ..StorageConfig::default()
        };
        let printed = format!("{config:?}");
        assert!(!printed.contains("hunter2"), "{printed}");
        assert!(printed.contains("<redacted>"), "{printed}");
    }

    #[test]
    fn yaml_round_trip_and_unknown_fields() {
        let yaml = "url: s3://bucket/prefix\nendpoint: http://127.0.0.1:9000\nregion: auto\n";
        let config: StorageConfig = serde_norway::from_str(yaml).unwrap();
        assert_eq!(config.url, "s3://bucket/prefix");
        assert_eq!(config.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(config.region.as_deref(), Some("auto"));
        assert_eq!(config.access_key_id, None);
        let back: StorageConfig =
            serde_norway::from_str(&serde_norway::to_string(&config).unwrap()).unwrap();
        assert_eq!(back, config);
        assert!(serde_norway::from_str::<StorageConfig>("url: x\nbucket: y\n").is_err());
    }

    #[test]
    fn s3_urls_give_bucket_and_validated_prefix() {
        let mut config = StorageConfig {
            url: "s3://bucket/a/b/".into(),
            endpoint: Some("http://127.0.0.1:1".into()),
            region: Some("us-east-1".into()),
            access_key_id: Some("k".into()),
            secret_access_key: Some("s".into()),
        };
        let opened = open(&config).unwrap();
        assert_eq!(opened.kind, BackendKind::S3);
        assert_eq!(opened.prefix.map(|p| p.to_string()), Some("a/b".into()));
        assert!(opened.s3.is_some());

        config.url = "s3://bucket/../x".into();
        assert!(matches!(open(&config), Err(StorageError::BadKey(_))));
        config.url = "s3:///x".into();
        assert!(matches!(open(&config), Err(StorageError::BadUrl { .. })));
        config.url = "gs://bucket".into();
        assert!(matches!(open(&config), Err(StorageError::BadUrl { .. })));
        config.url = " ".into();
        assert!(matches!(open(&config), Err(StorageError::BadUrl { .. })));
    }

    #[test]
    fn local_urls_create_the_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("nested/store");
        let opened = open(&StorageConfig::local(dir.display().to_string())).unwrap();
        assert_eq!(opened.kind, BackendKind::Local);
        assert!(dir.is_dir());

        let dir2 = tmp.path().join("by-url");
        let url = url::Url::from_directory_path(&dir2).unwrap().to_string();
        assert_eq!(
            open(&StorageConfig::local(url)).unwrap().kind,
            BackendKind::Local
        );
        assert!(dir2.is_dir());
        assert_eq!(
            open(&StorageConfig::local("memory://")).unwrap().kind,
            BackendKind::Memory
        );
    }
}
