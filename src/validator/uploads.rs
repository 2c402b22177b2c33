//! Checks on a section's merge uploads that need no model: the state every miner started the
//! epoch from, uploads identical to it (no training at all), and copies between uploaders.

use burn::tensor::backend::AutodiffBackend;

use super::copy::CopyDetector;
use super::fetch::{FetchError, fetch_flat, fetch_range};
use crate::api::{MinerSettings, SectionCheckpoint, UploadSource};
use crate::codec::{MergeWire, Span};
use crate::model::layout::section_layout;
use crate::model::{ModelConfig, ModelError, Section};
use crate::storage::payload_hash;

/// Values compared at a time when scanning uploads for copies.
const COPY_CHUNK: usize = 1 << 20;

/// Why a start state could not be had.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The checkpoint could not be downloaded.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// The section could not be built.
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// The flat state section `index` started the epoch from: the checkpoint, or (none yet) the
/// run seed's initial weights with zero moments.
///
/// # Errors
/// [`StartError`].
pub async fn start_state<B: AutodiffBackend>(
    start: Option<&SectionCheckpoint>,
    model: &ModelConfig,
    index: usize,
    settings: &MinerSettings,
    device: &B::Device,
) -> Result<Vec<f32>, StartError> {
    if let Some(cp) = start {
        return Ok(fetch_flat(&cp.blob).await?);
    }
    let section = Section::<B>::new(model, index, settings.seed, settings.optimizer, device)?;
    Ok(section.export_flat(&section_layout(model, index)?)?)
}

/// The hash an upload identical to `start` would have in `wire` (`None` when `start` cannot
/// be encoded, so no honest upload can equal it). For `dct` that is an upload with no change
/// from `start` and no error feedback.
pub fn state_hash(start: &[f32], wire: MergeWire) -> Option<String> {
    let span = Span::whole(start.len() as u64 / 3);
    let base = wire.base_of(start, start.len() as u64, span).ok()?;
    wire.encode(start, span, base)
        .ok()
        .map(|b| payload_hash(&b))
}

/// A copy found among uploads: `(copier, original, cosine)`.
pub type Copy = (String, String, f64);

/// Pairs of uploads whose pseudo-gradients (parameters only) have a cosine of at least
/// `threshold`; the later accepted one is the copier. Reads the uploads by byte range, a
/// chunk at a time.
///
/// # Errors
/// [`FetchError`] when an upload cannot be read.
pub async fn find_copies(
    start: &[f32],
    params_len: usize,
    uploads: &[UploadSource],
    threshold: f64,
    wire: MergeWire,
) -> Result<Vec<Copy>, FetchError> {
    let total = start.len() as u64;
    if uploads.len() < 2 {
        return Ok(Vec::new());
    }
    let n = params_len.min(start.len());
    let mut det = CopyDetector::new(uploads.len());
    let mut at = 0;
    while at < n {
        let end = (at + COPY_CHUNK).min(n);
        let mut chunks = Vec::with_capacity(uploads.len());
        for u in uploads {
            chunks.push(fetch_range(&u.blob, at..end, wire, total, start).await?);
        }
        let views: Vec<&[f32]> = chunks.iter().map(Vec::as_slice).collect();
        det.add(&start[at..end], &views);
        at = end;
    }
    let order: Vec<u64> = uploads
        .iter()
        .map(|u| u.accepted_unix_ms.unwrap_or(u64::MAX))
        .collect();
    Ok(det
        .flags(&order, threshold)
        .into_iter()
        .map(|f| {
            (
                uploads[f.copier].hotkey.clone(),
                uploads[f.original].hotkey.clone(),
                f.cosine,
            )
        })
        .collect())
}
