//! Downloading what a validator checks: work items, flat states and byte ranges of them,
//! through the short-lived URLs the orchestrator hands out (hash-checked where the ledger
//! holds a hash).

use std::ops::Range;

use thiserror::Error;
use url::Url;

use super::replay::ReplayItem;
use crate::api::{BlobRef, WorkItem, WorkKind};
use crate::codec::{MergeWire, Span};
use crate::compute::CachedInput;
use crate::compute::payload::{self, PayloadError};
use crate::merge::f32_from_le_bytes;
use crate::storage::{StorageError, download_from_url};

/// Why something could not be fetched.
#[derive(Debug, Error)]
pub enum FetchError {
    /// The download, the hash check or the decoding failed.
    #[error(transparent)]
    Payload(#[from] PayloadError),
    /// A ranged download failed.
    #[error("download failed: {0}")]
    Download(#[from] StorageError),
    /// An object that should hold little-endian f32 values does not.
    #[error("{0}")]
    Malformed(String),
}

/// Downloads and decodes one work item. A missing or undecodable *output* is not an error:
/// it is the miner's, and the item is kept with an empty output (so it fails its comparison).
///
/// # Errors
/// [`FetchError`] when an input the orchestrator verified cannot be had (objects deleted, the
/// URL expired).
pub async fn load_item(item: &WorkItem, head: bool, tail: bool) -> Result<ReplayItem, FetchError> {
    let input = match (item.kind, head) {
        (WorkKind::Forward, true) => {
            let (ids, shape) = payload::fetch_ids(&item.input).await?;
            CachedInput::Tokens { ids, shape }
        }
        _ => {
            let shape = payload::shape_of::<3>(&item.input)?;
            let data = payload::decode_tensor(&payload::fetch(&item.input).await?, shape)?;
            let tokens = match (&item.tokens, item.kind) {
                (Some(blob), WorkKind::Forward) => {
                    Some(payload::fetch_tokens(blob, [shape[0], shape[1]]).await?)
                }
                _ => None,
            };
            CachedInput::Hidden {
                data,
                shape,
                tokens,
            }
        }
    };
    let targets = match (&item.targets, item.kind == WorkKind::Forward && tail) {
        (Some(blob), true) => Some(payload::fetch_ids(blob).await?.0),
        _ => None,
    };
    let output = match &item.output {
        Some(blob) => Some(fetch_output(blob).await.unwrap_or_default()),
        None => None,
    };
    Ok(ReplayItem {
        sample: item.sample,
        kind: item.kind,
        input,
        targets,
        output,
        loss: item.loss,
    })
}

/// The miner's uploaded result, decoded with the shape it must have.
async fn fetch_output(blob: &BlobRef) -> Result<Vec<f32>, PayloadError> {
    let shape = payload::shape_of::<3>(blob)?;
    payload::decode_tensor(&payload::fetch(blob).await?, shape)
}

/// A whole flat state (little-endian f32), hash-checked.
///
/// # Errors
/// [`FetchError`].
pub async fn fetch_flat(blob: &BlobRef) -> Result<Vec<f32>, FetchError> {
    let bytes = payload::fetch(blob).await?;
    f32_from_le_bytes(&bytes)
        .ok_or_else(|| FetchError::Malformed("a flat state's length is not a multiple of 4".into()))
}

/// A whole merge object (an upload of `span.start == 0`, or a partition copy) of `n` values
/// in `wire`, hash-checked and strictly decoded; `global` is the previous global state from
/// flat index 0 (what a `dct` object is a change from; ignored by the other formats).
///
/// # Errors
/// [`FetchError`].
pub async fn fetch_merge_object(
    blob: &BlobRef,
    wire: MergeWire,
    n: u64,
    span: Span,
    global: &[f32],
) -> Result<Vec<f32>, FetchError> {
    let bytes = payload::fetch(blob).await?;
    let base = wire
        .base_of(global, n, span)
        .map_err(|e| FetchError::Malformed(e.to_string()))?;
    wire.decode(&bytes, n, span, base)
        .map_err(|e| FetchError::Malformed(e.to_string()))
}

/// Values `range` (flat indices) of the upload of `n` values in `wire` behind `blob` (not
/// hash-checked: a part of an object cannot be); `global` as for [`fetch_merge_object`].
///
/// # Errors
/// [`FetchError`].
pub async fn fetch_range(
    blob: &BlobRef,
    range: Range<usize>,
    wire: MergeWire,
    n: u64,
    global: &[f32],
) -> Result<Vec<f32>, FetchError> {
    let url = Url::parse(&blob.url).map_err(|e| PayloadError::BadUrl(e.to_string()))?;
    let elems = range.start as u64..range.end as u64;
    let span = Span::whole(n / 3);
    let base = wire
        .base_of(global, elems.end - elems.start, span.shifted(elems.start))
        .map_err(|e| FetchError::Malformed(e.to_string()))?;
    let bytes = download_from_url(&url, Some(wire.byte_range(elems.clone(), n, span))).await?;
    wire.decode_range(&bytes, elems, n, span, base)
        .map_err(|e| FetchError::Malformed(format!("range {range:?}: {e}")))
}
