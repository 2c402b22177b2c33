//! Storage: how bytes leave one machine and arrive at another intact.
//!
//! - [`codec`]: the wire format of boundary tensors (activations and gradients passed between
//!   pipeline sections) in f32, bf16 or per-row int8, validated strictly on decode.
//! - [`hash`]: BLAKE3 payload hashes that producers report and consumers check.
//!
//! The object store (local directory or S3-compatible, presigned URLs, key layout) will live
//! here too; this module knows nothing of models.

pub mod codec;
pub mod hash;

pub use codec::{CodecError, WireDtype, WireTensor, decode, decode_expecting, encode, encoded_len};
pub use hash::{payload_hash, verify_hash};
