//! [`BlobRef`]: how the API hands out an object without carrying its bytes.

use serde::{Deserialize, Serialize};

/// A short-lived URL for one object, with what the consumer must check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlobRef {
    /// GET (download) or PUT (upload) URL, valid until `expires_unix_ms`.
    pub url: String,
    /// BLAKE3 hex of the content (downloads only; the producer reported it).
    pub hash: Option<String>,
    /// Shape of the tensor inside, when the object is a wire-codec tensor.
    pub shape: Option<Vec<usize>>,
    /// Expiry of the URL.
    pub expires_unix_ms: u64,
}
