//! Upload quality, Templar's idea adapted to sections: the held-out loss of the model the
//! epoch produced with one section replaced by a miner's uploaded state, against the same
//! model with that section at the state it started the epoch from.
//!
//! The surroundings are the epoch's merged states (the model the network goes on with), not
//! the epoch's starting model: every miner trained against sections that moved during the
//! epoch, and an upload put back among the unmoved ones pays for that mismatch. Under NAdam one
//! honest upload of a `tiny` network paid 2.2 nats (half the starting loss) that way while its
//! peer paid 0.1, and lost its credit (CI, 2026-12-01). Where a section's merge did not finish,
//! its start stands in.
//!
//! It is measured on the miner's own samples (those that passed through it this epoch) and
//! on control samples of the same epoch that passed through other miners of its section. A
//! miner that trained on its samples improves them; one that did not train improves nothing;
//! one that copied another's state improves the other's samples, not its own, more.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};

use super::fetch::{FetchError, fetch_merge_object};
use super::tracking::Chooser;
use crate::api::client::{ApiClient, ClientError};
use crate::api::{EpochLedger, MAX_SAMPLES_PER_REQUEST, MergeRecord, MinerSettings};
use crate::codec::{Span, token_ids};
use crate::compute::payload::{self, PayloadError};
use crate::model::layout::section_layout;
use crate::model::section::Inner;
use crate::model::{ModelConfig, ModelError, Section, SectionInput};

/// One uploader's figures (nats; positive = its state lowers the loss).
#[derive(Debug, Clone, PartialEq)]
pub struct Quality {
    /// Mean improvement on its own samples.
    pub own: f64,
    /// Mean improvement on control samples.
    pub control: f64,
    /// Own samples measured.
    pub own_n: usize,
    /// Control samples measured.
    pub control_n: usize,
    /// Mean loss of the control samples with the section at its start among the surroundings.
    pub base_control: f64,
}

impl Quality {
    /// The credit factor, judged against the section's peers.
    ///
    /// Honest uploads of one section differ: each miner saw other samples and trained against
    /// other downstream miners, and early in a run that moves the loss by tenths of a nat either
    /// way. `peer` is the median control improvement of the section's unflagged uploaders. The
    /// factor is 1 while this upload's control improvement stays within 10% of the baseline
    /// control loss below the lower of 0 and `peer`; further below it falls linearly to 0 at
    /// 25%. The margin is measured: in 20 runs of `tests/network_validators.rs`'s setting (tiny,
    /// NAdam, 3 x 2, two validators, epochs 0-2; 360 honest uploads, each measured by both) 11
    /// measurements fell more than 3% below that floor and 4 more than 10% (factors 0.936,
    /// 0.851, and one upload at 0.758 for both validators), the worst by 13.6%; none reached 25%,
    /// and all of them were at epoch 0. (An upload that improves less than its peers is not
    /// penalised here: honest miners that did less work improve less.)
    /// Apart from the peers, a worsening of more than 25% of the baseline falls linearly to 0
    /// at 50% (a section with one uploader has only itself as a peer).
    pub fn factor(&self, peer: f64) -> f64 {
        if self.control_n == 0 || self.base_control <= 0.0 || !self.control.is_finite() {
            return if self.control_n == 0 { 1.0 } else { 0.0 };
        }
        let ramp = |rel: f64, start: f64, width: f64| {
            if rel >= start {
                1.0
            } else {
                (1.0 + (rel - start) / width).max(0.0)
            }
        };
        let floor = if peer.is_finite() { peer.min(0.0) } else { 0.0 };
        let against_peers = ramp((self.control - floor) / self.base_control, -0.10, 0.15);
        let absolute = ramp(self.control / self.base_control, -0.25, 0.25);
        against_peers.min(absolute)
    }
}

/// The median of `values` (`0` when empty).
pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// Why upload quality could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum QualityError {
    /// The orchestrator refused or could not be reached.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// An object could not be read.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// A token blob could not be read.
    #[error(transparent)]
    Payload(#[from] PayloadError),
    /// The model could not be built or run.
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Sample tokens and targets.
struct Tokens {
    ids: Vec<u32>,
    targets: Vec<u32>,
    shape: [usize; 2],
}

/// Measures every accepted upload of every section (`records`, one per section, in order),
/// with `per_side` own and `per_side` control samples per uploader, among the sections'
/// `context` states (see the module docs); `starts` are the states the sections started the
/// epoch from.
///
/// # Errors
/// [`QualityError`].
#[allow(clippy::too_many_arguments)]
pub async fn measure<B: AutodiffBackend>(
    client: &ApiClient,
    ledger: &EpochLedger,
    records: &[MergeRecord],
    starts: &[Vec<f32>],
    context: &[Vec<f32>],
    model: &ModelConfig,
    settings: &MinerSettings,
    chooser: &Chooser,
    per_side: usize,
    device: &B::Device,
) -> Result<BTreeMap<String, Quality>, QualityError> {
    let mut out = BTreeMap::new();
    if per_side == 0 || ledger.samples.is_empty() {
        return Ok(out);
    }
    let n = model.n_sections();
    // Which samples each uploader is measured on.
    let mut plan: Vec<(usize, usize, Vec<u64>, Vec<u64>)> = Vec::new();
    for (s, record) in records.iter().enumerate() {
        for (u, up) in record.uploads.iter().enumerate() {
            let mut own = Vec::new();
            let mut control = Vec::new();
            for x in &ledger.samples {
                let id = x.sample.to_string();
                if x.pathway.get(s) == Some(&up.hotkey) {
                    own.push(id);
                } else {
                    control.push(id);
                }
            }
            let what = format!("quality-{s}-{}", up.hotkey);
            let pick = |v: &[String], side: &str| -> Vec<u64> {
                chooser
                    .pick(&format!("{what}-{side}"), ledger.epoch, v, per_side)
                    .into_iter()
                    .filter_map(|id| id.parse().ok())
                    .collect()
            };
            plan.push((s, u, pick(&own, "own"), pick(&control, "control")));
        }
    }
    let mut wanted: Vec<u64> = plan
        .iter()
        .flat_map(|(_, _, a, b)| a.iter().chain(b))
        .copied()
        .collect();
    wanted.sort();
    wanted.dedup();
    let mut tokens: HashMap<u64, Tokens> = HashMap::new();
    for ids in wanted.chunks(MAX_SAMPLES_PER_REQUEST) {
        let blobs = client.sample_blobs(ledger.epoch, ids.to_vec()).await?;
        for b in blobs.samples {
            let (ids, shape) = payload::fetch_ids(&b.tokens).await?;
            let t = Tokens {
                ids,
                targets: payload::fetch_tokens(&b.targets, shape).await?,
                shape,
            };
            // An id past the tables would panic in the lookup: refuse the sample's blobs.
            let outside = |ids: &[u32]| token_ids::first_outside(ids, model.vocab_size);
            if let Some(bad) = outside(&t.ids).or_else(|| outside(&t.targets)) {
                return Err(ModelError::Shape(format!(
                    "sample {}: token id {bad} is outside the vocabulary of {}",
                    b.sample, model.vocab_size
                ))
                .into());
            }
            tokens.insert(b.sample, t);
        }
    }
    // The surroundings every upload is measured in: each section at `context` (the state the
    // epoch's merge produced, or its start where the merge did not finish), and each sample's
    // input to every section under them.
    let build = |s: usize, flat: &[f32]| -> Result<Section<B>, QualityError> {
        let mut section = Section::<B>::new(model, s, settings.seed, settings.optimizer, device)?;
        section.import_flat(&section_layout(model, s)?, flat)?;
        Ok(section)
    };
    let mut around = Vec::with_capacity(n);
    for (s, flat) in context.iter().enumerate().take(n) {
        around.push(build(s, flat)?);
    }
    let mut inputs: HashMap<(u64, usize), Vec<f32>> = HashMap::new();
    for (&id, t) in &tokens {
        let mut hidden: Option<Tensor<Inner<B>, 3>> = None;
        for (s, section) in around.iter_mut().enumerate().take(n.saturating_sub(1)) {
            let input = match hidden.take() {
                None => SectionInput::Tokens(ids(&t.ids, t.shape, device)),
                Some(h) => {
                    inputs.insert((id, s), to_vec(h.clone())?);
                    reembedded(section, h, t, device)
                }
            };
            hidden = Some(section.forward(input)?);
        }
        if let Some(h) = hidden {
            inputs.insert((id, n - 1), to_vec(h)?);
        }
    }
    // Each section's baseline, on the samples its uploaders are measured on: the surroundings
    // with that section at its start.
    let mut measured: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); n];
    for (s, _, own, control) in &plan {
        measured[*s].extend(own.iter().chain(control));
    }
    let mut base: HashMap<(u64, usize), f64> = HashMap::new();
    for (s, flat) in starts.iter().enumerate().take(n) {
        let mut start = build(s, flat)?;
        for &id in &measured[s] {
            let Some(t) = tokens.get(&id) else {
                continue;
            };
            let later = &mut around[s + 1..];
            if let Some(loss) = loss_from(&mut start, later, s, id, t, &inputs, model, device)? {
                base.insert((id, s), loss);
            }
        }
    }
    // Each upload in place of its section.
    for (s, u, own, control) in plan {
        let up = &records[s].uploads[u];
        let layout = section_layout(model, s)?;
        let flat = fetch_merge_object(
            &up.blob,
            records[s].wire,
            layout.total_len() as u64,
            Span::whole(layout.params_len),
            &starts[s],
        )
        .await?;
        let mut replaced = build(s, &flat)?;
        let mut mean = |samples: &[u64]| -> Result<(f64, f64, usize), QualityError> {
            let (mut gain, mut base_sum, mut k) = (0.0, 0.0, 0);
            for id in samples {
                let (Some(t), Some(b)) = (tokens.get(id), base.get(&(*id, s))) else {
                    continue;
                };
                let later = &mut around[s + 1..];
                let Some(loss) =
                    loss_from(&mut replaced, later, s, *id, t, &inputs, model, device)?
                else {
                    continue;
                };
                gain += b - loss;
                base_sum += b;
                k += 1;
            }
            let d = k.max(1) as f64;
            Ok((gain / d, base_sum / d, k))
        };
        let (own_gain, _, own_n) = mean(&own)?;
        let (control_gain, base_control, control_n) = mean(&control)?;
        out.insert(
            up.hotkey.clone(),
            Quality {
                own: own_gain,
                control: control_gain,
                own_n,
                control_n,
                base_control,
            },
        );
    }
    Ok(out)
}

/// The loss of sample `id` with `first` as section `s`, fed the surroundings' input to it, and
/// `later` (the surroundings' sections after `s`) after it; `None` when that input is missing.
#[allow(clippy::too_many_arguments)]
fn loss_from<B: AutodiffBackend>(
    first: &mut Section<B>,
    later: &mut [Section<B>],
    s: usize,
    id: u64,
    t: &Tokens,
    inputs: &HashMap<(u64, usize), Vec<f32>>,
    model: &ModelConfig,
    device: &B::Device,
) -> Result<Option<f64>, QualityError> {
    let input = if s == 0 {
        SectionInput::Tokens(ids(&t.ids, t.shape, device))
    } else {
        let Some(data) = inputs.get(&(id, s)) else {
            return Ok(None);
        };
        let w = model.boundary_width();
        let h = Tensor::from_data(
            TensorData::new(data.clone(), [t.shape[0], t.shape[1], w]),
            device,
        );
        reembedded(first, h, t, device)
    };
    let targets = ids(&t.targets, t.shape, device);
    let Some((tail, middle)) = later.split_last_mut() else {
        return Ok(Some(f64::from(first.eval_loss(input, targets)?)));
    };
    let mut h = first.forward(input)?;
    for section in middle {
        h = section.forward(reembedded(section, h, t, device))?;
    }
    let loss = tail.eval_loss(reembedded(tail, h, t, device), targets)?;
    Ok(Some(f64::from(loss)))
}

/// Boundary activations `h` as `section`'s input, with the sample's ids where it re-embeds
/// them.
fn reembedded<B: AutodiffBackend>(
    section: &Section<B>,
    h: Tensor<Inner<B>, 3>,
    t: &Tokens,
    device: &B::Device,
) -> SectionInput<Inner<B>> {
    let tokens = section.reembeds().then(|| ids(&t.ids, t.shape, device));
    SectionInput::boundary(h, tokens)
}

fn ids<B: burn::tensor::backend::Backend>(
    v: &[u32],
    shape: [usize; 2],
    device: &B::Device,
) -> Tensor<B, 2, Int> {
    let data: Vec<i64> = v.iter().map(|&t| i64::from(t)).collect();
    Tensor::from_data(TensorData::new(data, shape), device)
}

fn to_vec<B: burn::tensor::backend::Backend>(t: Tensor<B, 3>) -> Result<Vec<f32>, ModelError> {
    t.into_data()
        .to_vec()
        .map_err(|e| ModelError::Shape(format!("{e:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(control: f64) -> Quality {
        Quality {
            own: 0.0,
            control,
            own_n: 4,
            control_n: 4,
            base_control: 2.0,
        }
    }

    #[test]
    fn factor_is_hand_computed_against_the_peers() {
        assert_eq!(q(0.1).factor(0.0), 1.0);
        // Within the 10% margin (0.2 nats on a base of 2) below the peers: full credit.
        assert_eq!(q(-0.2).factor(0.0), 1.0);
        // 0.35 nats below = 17.5%: halfway from 10% to 25%.
        assert!((q(-0.35).factor(0.0) - 0.5).abs() < 1e-12);
        assert_eq!(q(-0.5).factor(0.0), 0.0);
        assert_eq!(q(-1.0).factor(0.0), 0.0);
        // Honest uploads that all worsen the swapped-in model by 0.3 nats (co-adaptation)
        // keep full credit; one 0.5 below them (25% of 2) gets none.
        assert_eq!(q(-0.3).factor(-0.3), 1.0);
        assert_eq!(q(-0.5).factor(-0.3), 1.0);
        assert_eq!(q(-0.8).factor(-0.3), 0.0);
        // Improving less than peers that improve is no fault (less work, less improvement).
        assert_eq!(q(0.68).factor(1.18), 1.0);
        assert!((q(-0.35).factor(1.18) - 0.5).abs() < 1e-12);
        // Above the absolute bound whatever the peers: 0.75 nats = 37.5%, halfway to 0.
        assert!((q(-0.75).factor(-0.75) - 0.5).abs() < 1e-12);
        assert_eq!(q(-1.0).factor(-1.0), 0.0);
        // Unmeasurable numbers give no credit; nothing measured gives full credit.
        assert_eq!(q(f64::NAN).factor(0.0), 0.0);
        let none = Quality {
            control_n: 0,
            ..q(-5.0)
        };
        assert_eq!(none.factor(0.0), 1.0);
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&mut [3.0, -1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }
}
