//! Checks on a section's merge uploads that need no model: the state every miner started the
//! epoch from, uploads identical to it (no training at all), and copies between uploaders.

use burn::tensor::backend::AutodiffBackend;

use super::copy::CopyDetector;
use super::fetch::{FetchError, fetch_flat, fetch_range};
use crate::api::{MinerSettings, SectionCheckpoint, UploadSource};
use crate::codec::{FlatLayout, MergeWire, Span};
use crate::model::layout::section_layout;
use crate::model::optimizer::takes_weight_decay;
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
/// `threshold` once what any miner's optimizer does from `start` without data is taken out
/// ([`common_directions`]); the later accepted one is the copier. Reads the uploads by byte
/// range, a chunk at a time.
///
/// # Errors
/// [`FetchError`] when an upload cannot be read.
pub async fn find_copies(
    start: &[f32],
    layout: &FlatLayout,
    eps: f64,
    uploads: &[UploadSource],
    threshold: f64,
    wire: MergeWire,
) -> Result<Vec<Copy>, FetchError> {
    let total = start.len() as u64;
    if uploads.len() < 2 {
        return Ok(Vec::new());
    }
    let params = usize::try_from(layout.params_len).unwrap_or(usize::MAX);
    let n = params.min(start.len());
    let decays = decay_mask(layout, n);
    let mut det = CopyDetector::with_common(uploads.len(), COMMON_DIRECTIONS);
    let mut at = 0;
    while at < n {
        let end = (at + COPY_CHUNK).min(n);
        let mut chunks = Vec::with_capacity(uploads.len());
        for u in uploads {
            chunks.push(fetch_range(&u.blob, at..end, wire, total, start).await?);
        }
        let views: Vec<&[f32]> = chunks.iter().map(Vec::as_slice).collect();
        let common = common_directions(start, n, &decays[at..end], at, eps);
        let common: Vec<&[f32]> = common.iter().map(Vec::as_slice).collect();
        det.add_with_common(&start[at..end], &views, &common);
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

/// How many [`common_directions`] there are.
const COMMON_DIRECTIONS: usize = 3;

/// Whether each of the first `n` parameters takes weight decay, as the optimizer decides.
fn decay_mask(layout: &FlatLayout, n: usize) -> Vec<bool> {
    let mut mask = vec![false; n];
    for t in &layout.tensors {
        if takes_weight_decay(&t.shape) {
            let from = usize::try_from(t.offset).unwrap_or(usize::MAX).min(n);
            let to = from.saturating_add(t.len()).min(n);
            mask[from..to].fill(true);
        }
    }
    mask
}

/// The directions, over parameters `at..at + decays.len()` of a flat state `start` with `n`
/// parameters, in which any miner's optimizer moves the parameters from `start` whatever its
/// data: the decayed parameters themselves (weight decay), the others (kept apart, since they
/// take no decay and must not be tied to the decayed ones' share), and the carried momentum
/// over the root of the second moment (AdamW's and NAdam's steps without new gradients, since
/// both moments then only decay, at the same rate everywhere).
fn common_directions(
    start: &[f32],
    n: usize,
    decays: &[bool],
    at: usize,
    eps: f64,
) -> [Vec<f32>; 3] {
    let len = decays.len();
    let mut decayed = vec![0.0; len];
    let mut kept = vec![0.0; len];
    let mut momentum = vec![0.0; len];
    for (i, &d) in decays.iter().enumerate() {
        let p = at + i;
        let theta = start[p];
        if d {
            decayed[i] = theta;
        } else {
            kept[i] = theta;
        }
        let m = f64::from(start.get(n + p).copied().unwrap_or(0.0));
        let v = f64::from(start.get(2 * n + p).copied().unwrap_or(0.0)).max(0.0);
        momentum[i] = (m / (v.sqrt() + eps)) as f32;
    }
    [decayed, kept, momentum]
}
