//! Checks on a section's merge uploads that need no model: the state every miner started the
//! epoch from, uploads identical to it (no training at all), and copies between uploaders.

use std::ops::Range;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};

use super::copy::CopyDetector;
use super::fetch::{FetchError, fetch_flat, fetch_range};
use crate::api::{MinerSettings, SectionCheckpoint, UploadSource};
use crate::codec::{FlatLayout, MergeWire, Span};
use crate::model::layout::section_layout;
use crate::model::optimizer::{OptimizerConfig, muon_shape, muon_step, takes_weight_decay};
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
pub async fn find_copies<B: Backend>(
    start: &[f32],
    layout: &FlatLayout,
    optimizer: &OptimizerConfig,
    uploads: &[UploadSource],
    threshold: f64,
    wire: MergeWire,
    device: &B::Device,
) -> Result<Vec<Copy>, FetchError> {
    let total = start.len() as u64;
    if uploads.len() < 2 {
        return Ok(Vec::new());
    }
    let params = usize::try_from(layout.params_len).unwrap_or(usize::MAX);
    let n = params.min(start.len());
    let decays = decay_mask(layout, n);
    let mut muon = MuonMomentum::<B>::new(start, n, layout, optimizer.muon, device);
    let mut det = CopyDetector::with_common(uploads.len(), COMMON_DIRECTIONS);
    let mut at = 0;
    while at < n {
        let end = (at + COPY_CHUNK).min(n);
        let mut chunks = Vec::with_capacity(uploads.len());
        for u in uploads {
            chunks.push(fetch_range(&u.blob, at..end, wire, total, start).await?);
        }
        let views: Vec<&[f32]> = chunks.iter().map(Vec::as_slice).collect();
        let mut common = common_directions(start, n, &decays[at..end], at, optimizer.eps);
        muon.split_off(at, &mut common);
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
const COMMON_DIRECTIONS: usize = 4;

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
/// both moments then only decay, at the same rate everywhere). The fourth, zero here, is
/// Muon's move on the hidden matrices when the run uses it ([`MuonMomentum`]).
fn common_directions(
    start: &[f32],
    n: usize,
    decays: &[bool],
    at: usize,
    eps: f64,
) -> [Vec<f32>; COMMON_DIRECTIONS] {
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
    [decayed, kept, momentum, vec![0.0; len]]
}

/// Muon's move from the carried momentum alone on each hidden matrix of a run that steps them
/// with Muon: the orthogonalized first moment ([`muon_step`]), which is what a Muon step
/// without new data does, and no function of one element as AdamW's is. Computed one matrix
/// at a time as the chunks reach it, on the validator's device.
struct MuonMomentum<'a, B: Backend> {
    start: &'a [f32],
    n: usize,
    /// Each hidden matrix's parameters and shape, by offset; none without Muon.
    matrices: Vec<(Range<usize>, [usize; 2])>,
    /// The last matrix's move (its index in `matrices`), while chunks pass through it.
    cached: Option<(usize, Vec<f32>)>,
    device: B::Device,
}

impl<'a, B: Backend> MuonMomentum<'a, B> {
    fn new(start: &'a [f32], n: usize, layout: &FlatLayout, on: bool, device: &B::Device) -> Self {
        let mut matrices: Vec<(Range<usize>, [usize; 2])> = Vec::new();
        for t in layout.tensors.iter().filter(|_| on) {
            let from = usize::try_from(t.offset).unwrap_or(usize::MAX);
            let to = from.saturating_add(t.len());
            if let Some(shape) = muon_shape(&t.name, &t.shape)
                && to <= n
                && start.len() >= n + to
            {
                matrices.push((from..to, shape));
            }
        }
        matrices.sort_by_key(|(r, _)| r.start);
        Self {
            start,
            n,
            matrices,
            cached: None,
            device: device.clone(),
        }
    }

    /// Moves the hidden matrices' share of `common`'s carried momentum (direction 2, over
    /// parameters `at..`) to direction 3 as Muon's move.
    fn split_off(&mut self, at: usize, common: &mut [Vec<f32>; COMMON_DIRECTIONS]) {
        let end = at + common[2].len();
        for k in 0..self.matrices.len() {
            let (range, shape) = self.matrices[k].clone();
            let (from, to) = (range.start.max(at), range.end.min(end));
            if from >= to {
                continue;
            }
            if self.cached.as_ref().is_none_or(|(i, _)| *i != k) {
                let m = &self.start[self.n + range.start..self.n + range.end];
                let x =
                    Tensor::<B, 1>::from_data(TensorData::new(m.to_vec(), [m.len()]), &self.device)
                        .reshape(shape);
                let moved = muon_step(x).into_data().to_vec::<f32>().unwrap_or_default();
                self.cached = Some((k, moved));
            }
            let Some((_, moved)) = &self.cached else {
                continue;
            };
            for p in from..to {
                common[2][p - at] = 0.0;
                common[3][p - at] = moved.get(p - range.start).copied().unwrap_or(0.0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TestBackend;

    /// Pseudo-random values in [-0.5, 0.5) (a linear congruential generator).
    fn noise(seed: u32, len: usize) -> Vec<f32> {
        let mut state = seed;
        (0..len)
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    #[test]
    fn muons_move_without_data_is_a_common_direction_and_no_sign_of_a_copy() {
        // A hidden matrix (Muon's), a norm, and the embedding (AdamW's under Muon too).
        let layout = FlatLayout::new([
            (
                "model.layers.0.mlp.up_proj.weight".to_string(),
                vec![12, 20],
            ),
            ("model.norm.weight".to_string(), vec![20]),
            ("model.embed_tokens.weight".to_string(), vec![8, 20]),
        ])
        .unwrap();
        let n = usize::try_from(layout.params_len).unwrap();
        let mut start = noise(1, n);
        start.extend(noise(2, n));
        start.extend(noise(3, n).iter().map(|x| x * x + 0.01));
        let up = layout
            .tensors
            .iter()
            .find(|t| t.name.contains("up_proj"))
            .unwrap();
        let from = usize::try_from(up.offset).unwrap();
        let matrix = from..from + up.len();
        let device = Default::default();
        let m = start[n + matrix.start..n + matrix.end].to_vec();
        let expected: Vec<f32> = muon_step(
            Tensor::<TestBackend, 1>::from_data(TensorData::new(m.clone(), [m.len()]), &device)
                .reshape([12, 20]),
        )
        .into_data()
        .to_vec()
        .unwrap();
        let decays = decay_mask(&layout, n);
        // The directions of two chunks that split the matrix, as `find_copies` reads them.
        let directions = |on: bool| {
            let mut muon = MuonMomentum::<TestBackend>::new(&start, n, &layout, on, &device);
            let cut = matrix.start + 100;
            let mut whole: [Vec<f32>; COMMON_DIRECTIONS] = Default::default();
            for (at, end) in [(0, cut), (cut, n)] {
                let mut common = common_directions(&start, n, &decays[at..end], at, 1e-8);
                muon.split_off(at, &mut common);
                for (w, c) in whole.iter_mut().zip(common) {
                    w.extend(c);
                }
            }
            whole
        };
        let with = directions(true);
        assert_eq!(&with[3][matrix.clone()], expected.as_slice());
        assert!(with[2][matrix.clone()].iter().all(|&x| x == 0.0));
        assert!(with[3][..matrix.start].iter().all(|&x| x == 0.0));
        assert!(with[3][matrix.end..].iter().all(|&x| x == 0.0));
        let without = directions(false);
        assert!(without[3].iter().all(|&x| x == 0.0));
        assert_ne!(without[2][matrix.clone()], with[2][matrix.clone()]);

        // Two honest Muon miners whose data moved them little beside what the momentum did
        // (the learnt-corpus case): alike overall, told apart once Muon's move is taken out.
        let moved = |seed: u32| -> Vec<f32> {
            let own = noise(seed, n);
            (0..n)
                .map(|p| {
                    let carried = if matrix.contains(&p) {
                        expected[p - matrix.start]
                    } else {
                        0.0
                    };
                    start[p] - 1e-2 * carried + 1e-4 * own[p]
                })
                .collect()
        };
        let (a, b) = (moved(7), moved(8));
        let cosine = |common: &[Vec<f32>; COMMON_DIRECTIONS]| {
            let mut det = CopyDetector::with_common(2, COMMON_DIRECTIONS);
            let common: Vec<&[f32]> = common.iter().map(Vec::as_slice).collect();
            det.add_with_common(&start[..n], &[&a, &b], &common);
            det.cosine(0, 1).unwrap()
        };
        let (told, blind) = (cosine(&with), cosine(&without));
        assert!(blind > 0.999, "without Muon's direction: {blind}");
        assert!(told.abs() < 0.5, "with it: {told}");
    }
}
