//! Inputs of an assignment: download through a [`BlobRef`], hash check, decoding.
//!
//! # Format
//! Token blobs (head input, tail targets, the ids re-embedding sections read) are raw
//! little-endian ids in 1, 2 or 4 bytes each, row-major `[batch, seq]`, no header
//! ([`crate::codec::token_ids`]). Activations and gradients are wire-codec tensors
//! ([`crate::codec`]).

use bytes::Bytes;
use thiserror::Error;
use url::Url;

use crate::api::BlobRef;
use crate::codec::token_ids;
use crate::storage::{CodecError, StorageError, decode_expecting, download_from_url, verify_hash};

/// Why an input could not be obtained.
#[derive(Debug, Error)]
pub enum PayloadError {
    /// The URL does not parse.
    #[error("bad blob URL: {0}")]
    BadUrl(String),
    /// The download failed.
    #[error("download failed: {0}")]
    Download(#[from] StorageError),
    /// The hash does not match or the tensor does not decode.
    #[error("bad payload: {0}")]
    Codec(#[from] CodecError),
    /// The blob carries no shape although one is required.
    #[error("blob has no shape")]
    MissingShape,
    /// The shape is not of the expected rank.
    #[error("expected a shape of rank {expected}, got {got:?}")]
    Rank {
        /// Rank wanted.
        expected: usize,
        /// Shape given.
        got: Vec<usize>,
    },
    /// A blob's shape is not the one its companion input implies.
    #[error("expected a blob of shape {expected:?}, got {got:?}")]
    ShapeMismatch {
        /// Shape wanted.
        expected: Vec<usize>,
        /// Shape given.
        got: Vec<usize>,
    },
    /// A token blob's size is not 1, 2 or 4 bytes per id of its shape.
    #[error(
        "token blob holds {got} bytes, not 1, 2 or 4 per id of shape {shape:?} ({expected} ids)"
    )]
    LengthMismatch {
        /// Ids implied by the shape (`usize::MAX` when their count overflows).
        expected: usize,
        /// Bytes received.
        got: usize,
        /// The shape.
        shape: Vec<usize>,
    },
}

/// Downloads the object behind `blob` and checks its hash when one is given.
///
/// # Errors
/// [`PayloadError::BadUrl`], [`PayloadError::Download`], [`PayloadError::Codec`] (hash).
pub async fn fetch(blob: &BlobRef) -> Result<Bytes, PayloadError> {
    let url = Url::parse(&blob.url).map_err(|e| PayloadError::BadUrl(e.to_string()))?;
    let bytes = download_from_url(&url, None).await?;
    if let Some(hash) = &blob.hash {
        verify_hash(&bytes, hash)?;
    }
    Ok(bytes)
}

/// The shape of `blob` as a fixed-rank array.
///
/// # Errors
/// [`PayloadError::MissingShape`] or [`PayloadError::Rank`].
pub fn shape_of<const N: usize>(blob: &BlobRef) -> Result<[usize; N], PayloadError> {
    let shape = blob.shape.as_ref().ok_or(PayloadError::MissingShape)?;
    <[usize; N]>::try_from(shape.as_slice()).map_err(|_| PayloadError::Rank {
        expected: N,
        got: shape.clone(),
    })
}

/// Decodes the little-endian token ids of `shape` (`[batch, seq]`), 1, 2 or 4 bytes each.
///
/// # Errors
/// [`PayloadError::LengthMismatch`] when the size is not 1, 2 or 4 bytes per id.
pub fn decode_tokens(bytes: &[u8], shape: [usize; 2]) -> Result<Vec<u32>, PayloadError> {
    let count = shape[0].saturating_mul(shape[1]);
    token_ids::decode(bytes, count).ok_or_else(|| PayloadError::LengthMismatch {
        expected: count,
        got: bytes.len(),
        shape: shape.to_vec(),
    })
}

/// Downloads and decodes the token ids behind `blob`, with their shape (`[batch, seq]`).
///
/// # Errors
/// As [`shape_of`], [`fetch`] and [`decode_tokens`].
pub async fn fetch_ids(blob: &BlobRef) -> Result<(Vec<u32>, [usize; 2]), PayloadError> {
    let shape = shape_of::<2>(blob)?;
    Ok((decode_tokens(&fetch(blob).await?, shape)?, shape))
}

/// [`fetch_ids`] for ids that must have shape `expected` (`[batch, seq]` of the activations
/// they accompany); checked before downloading.
///
/// # Errors
/// As [`fetch_ids`], or [`PayloadError::ShapeMismatch`].
pub async fn fetch_tokens(blob: &BlobRef, expected: [usize; 2]) -> Result<Vec<u32>, PayloadError> {
    let shape = shape_of::<2>(blob)?;
    if shape != expected {
        return Err(PayloadError::ShapeMismatch {
            expected: expected.to_vec(),
            got: shape.to_vec(),
        });
    }
    Ok(fetch_ids(blob).await?.0)
}

/// Decodes a wire tensor of exactly `shape`.
///
/// # Errors
/// [`PayloadError::Codec`] (wrong shape, corrupt payload, non-finite values).
pub fn decode_tensor<const N: usize>(
    bytes: &[u8],
    shape: [usize; N],
) -> Result<Vec<f32>, PayloadError> {
    Ok(decode_expecting(bytes, &shape)?.data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{WireDtype, encode};

    fn blob(shape: Option<Vec<usize>>) -> BlobRef {
        BlobRef {
            url: "http://x/y".into(),
            hash: None,
            shape,
            expires_unix_ms: 0,
        }
    }

    #[test]
    fn tokens_are_little_endian_and_length_checked() {
        let bytes = [1u8, 0, 0, 0, 0, 1, 0, 0, 255, 255, 255, 255, 7, 0, 0, 0];
        assert_eq!(
            decode_tokens(&bytes, [2, 2]).unwrap(),
            vec![1, 256, u32::MAX, 7]
        );
        assert!(matches!(
            decode_tokens(&bytes[..15], [2, 2]),
            Err(PayloadError::LengthMismatch {
                expected: 4,
                got: 15,
                ..
            })
        ));
        // One and two bytes per id (vocabularies of up to 256 and 65,536 tokens).
        assert_eq!(
            decode_tokens(&bytes[..4], [2, 2]).unwrap(),
            vec![1, 0, 0, 0]
        );
        assert_eq!(
            decode_tokens(&bytes[..8], [2, 2]).unwrap(),
            vec![1, 0, 256, 0]
        );
        assert!(decode_tokens(&bytes, [usize::MAX, 3]).is_err());
    }

    #[test]
    fn shapes_must_be_present_and_of_the_right_rank() {
        assert_eq!(shape_of::<2>(&blob(Some(vec![2, 3]))).unwrap(), [2, 3]);
        assert!(matches!(
            shape_of::<3>(&blob(Some(vec![2, 3]))),
            Err(PayloadError::Rank { expected: 3, .. })
        ));
        assert!(matches!(
            shape_of::<2>(&blob(None)),
            Err(PayloadError::MissingShape)
        ));
    }

    #[test]
    fn tensors_decode_only_with_the_expected_shape() {
        let bytes = encode(&[1, 2, 2], &[0.5, -1.0, 2.0, 4.0], WireDtype::F32).unwrap();
        assert_eq!(
            decode_tensor(&bytes, [1, 2, 2]).unwrap(),
            vec![0.5, -1.0, 2.0, 4.0]
        );
        assert!(decode_tensor(&bytes, [2, 1, 2]).is_err());
    }
}
