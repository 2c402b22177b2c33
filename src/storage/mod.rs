//! Storage: how bytes leave one machine and arrive at another intact.
//!
//! The byte formats themselves (tensor codec, payload hashes, flat layout) live in
//! [`crate::codec`]; their main items are re-exported here for the code that stores them.
//!
//! - [`key`] builds the key layout (`runs/{run}/...`) from validated components.
//! - [`store`] defines [`Storage`], the store itself (put/get/range/head/list/delete/presign)
//!   over a local directory or an S3-compatible bucket.
//! - [`store_config`] defines [`StorageConfig`], where the objects live.
//! - [`store_error`] defines [`StorageError`].
//! - [`recent`] keeps what a store wrote recently in memory, for the orchestrator's
//!   read-backs.
//! - [`transfer`] uploads and downloads through presigned URLs, for credential-less clients.
//! - [`retry`] defines the retry policy of those transfers.
//! - [`trust`] decides which server certificates HTTPS clients accept (the system's roots,
//!   plus a run's private CA), and explains a refusal.
//!
//! This module knows nothing of models.

pub mod key;
pub mod recent;
pub mod retry;
pub mod store;
pub mod store_config;
pub mod store_error;
pub mod traffic;
pub mod transfer;
pub mod trust;

pub use crate::codec::{
    CodecError, WireDtype, WireTensor, decode, decode_expecting, encode, encoded_len, payload_hash,
    verify_hash,
};
pub use key::{AttemptCopy, Direction, Hotkey, KeyError, KeyPart, ObjectKey, RunKeys, StatePart};
pub use retry::RetryPolicy;
pub use store::{ObjectInfo, ObjectWriter, PresignMethod, Storage};
pub use store_config::{BackendKind, StorageConfig};
pub use store_error::{StorageError, StorageResult};
pub use transfer::{UrlClient, download_from_url, upload_to_url};
