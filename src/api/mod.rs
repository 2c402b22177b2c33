//! The orchestrator's HTTP API: wire types shared by the server ([`crate::orchestrator`]) and
//! its clients (miners, validators, `iota local`).
//!
//! # Conventions
//! - JSON bodies, `Content-Type: application/json`.
//! - Every mutating request (every `POST`) is signed by the caller's hotkey with the headers of
//!   [`crate::wallet::signing`]; `signed_for` is the run name ([`RunInfo::run`]). The server
//!   refuses unsigned, badly signed, stale (> 30 s), replayed and unregistered callers with
//!   401/403 and changes nothing.
//! - Errors come back as [`ApiError`] with a stable `code`.
//! - Tensors never travel through the API: it hands out short-lived URLs ([`BlobRef`]) to
//!   object storage (S3 presigned URLs, or the orchestrator's own `/blob` endpoint with a signed
//!   expiring token when the run stores objects in a local directory).

pub mod blob_ref;
pub mod merge;
pub mod phase;
pub mod types;
pub mod validator;

pub use blob_ref::BlobRef;
pub use merge::*;
pub use phase::Phase;
pub use types::*;
pub use validator::*;
pub mod client;
