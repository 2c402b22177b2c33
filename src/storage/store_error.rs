//! The error type of the object store layer.

use thiserror::Error;

use super::key::KeyError;

/// Everything that can go wrong storing, fetching or transferring an object.
///
/// Variants carry the key (or the URL without its query string, which would hold a presigned
/// URL's signature) so that a log line says which object failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StorageError {
    /// No object under this key.
    #[error("object {key} not found")]
    NotFound {
        /// The key, relative to the store's prefix.
        key: String,
    },
    /// The object's BLAKE3 hash is not the one its producer reported.
    #[error("object {key} has BLAKE3 hash {got}, expected {expected}")]
    HashMismatch {
        /// The key, relative to the store's prefix.
        key: String,
        /// The hash that was expected (lowercase hex).
        expected: String,
        /// The hash of the bytes actually read (lowercase hex).
        got: String,
    },
    /// A key component was not a plain path component.
    #[error("bad object key: {0}")]
    BadKey(#[from] KeyError),
    /// The configured store URL cannot be used.
    #[error("bad storage URL {url:?}: {reason}")]
    BadUrl {
        /// The URL as configured.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A setting is out of range (multipart sizes, presign expiry, ...).
    #[error("invalid storage setting: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// A byte range whose end lies before its start.
    #[error("invalid byte range {start}..{end} for {key}")]
    InvalidRange {
        /// The key, or URL, the range was for.
        key: String,
        /// First byte requested.
        start: u64,
        /// One past the last byte requested.
        end: u64,
    },
    /// Fewer (or more) bytes came back than were asked for, e.g. a range past the end.
    #[error("{key}: expected {expected} bytes, got {got}")]
    LengthMismatch {
        /// The key, or URL, that was read.
        key: String,
        /// Bytes asked for.
        expected: u64,
        /// Bytes received.
        got: u64,
    },
    /// The store refused our credentials (HTTP 401/403): wrong key or secret, or no access to
    /// the bucket.
    #[error("access to {key} denied: {source}")]
    AccessDenied {
        /// The key, relative to the store's prefix.
        key: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
    /// Any other error of the object store backend (after its own retries).
    #[error("storage backend failed on {key}: {source}")]
    Backend {
        /// The key, relative to the store's prefix, or the operation.
        key: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
    /// A local filesystem operation failed (creating the store directory).
    #[error("storage directory {path}: {source}")]
    Io {
        /// The path involved.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An HTTP transfer to or from a URL failed below HTTP (connect, timeout, body), after
    /// the retries of [`RetryPolicy`](super::retry::RetryPolicy).
    #[error("HTTP transfer with {url} failed after {attempts} attempt(s): {source}")]
    Http {
        /// The URL without its query string.
        url: String,
        /// How many attempts were made.
        attempts: u32,
        /// The last transport error.
        #[source]
        source: reqwest::Error,
    },
    /// An HTTP transfer got an error status, after retrying the transient ones.
    #[error("HTTP transfer with {url} got status {status} after {attempts} attempt(s)")]
    HttpStatus {
        /// The URL without its query string.
        url: String,
        /// The last status received.
        status: u16,
        /// How many attempts were made.
        attempts: u32,
    },
}

impl StorageError {
    /// What the user should do about it, in one sentence, when there is something to do.
    pub fn advice(&self) -> Option<&'static str> {
        match self {
            Self::HttpStatus {
                status: 401 | 403, ..
            } => Some(
                "a storage URL expired or was refused: check this machine's clock (`timedatectl`; URLs live for minutes) and that transfers are not stalled by a slow link",
            ),
            Self::HttpStatus { status: 404, .. } => Some(
                "the object is gone (an old epoch was cleaned up): restart the miner so it adopts the current checkpoint",
            ),
            Self::Http { .. } => Some(
                "the storage cannot be reached from here: check the network, proxy and firewall towards the storage host",
            ),
            Self::AccessDenied { .. } => Some(
                "the storage refused the credentials: check the access key, secret and bucket permissions (`iota setup --role orchestrator` checks them live)",
            ),
            _ => None,
        }
    }

    /// Wraps an `object_store` error about `key`, keeping "not found" and "access denied"
    /// distinct so callers can act on them.
    pub(crate) fn from_backend(key: &str, source: object_store::Error) -> Self {
        match source {
            object_store::Error::NotFound { .. } => Self::NotFound {
                key: key.to_owned(),
            },
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => Self::AccessDenied {
                key: key.to_owned(),
                source,
            },
            source => Self::Backend {
                key: key.to_owned(),
                source,
            },
        }
    }
}

/// Shorthand for results of this layer.
pub type StorageResult<T> = Result<T, StorageError>;
