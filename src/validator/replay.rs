//! Replaying a miner's recorded work: the same starting weights, inputs, upstream gradients
//! and local optimizer steps, in the order the miner did them, comparing each output and
//! input gradient it uploaded with the replay's (magnitude ratio and cosine), the losses it
//! reported, and at the end the state it uploaded for the merge.
//!
//! The core ([`Replayer`]) takes decoded items, so the network driver
//! ([`super::fetch::load_item`]) and `iota bench validate` (in-memory traces) share it.

use std::collections::HashMap;

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};

use super::compare::{Comparison, Similarity, failure, similarity};
use crate::api::{MinerSettings, ReplaySettings, WorkKind};
use crate::merge::FlatLayout;
use crate::miner::CachedInput;
use crate::model::section::Inner;
use crate::model::{ModelError, Section, SectionInput};

/// One piece of a miner's work, decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayItem {
    /// Sample.
    pub sample: u64,
    /// Forward (the tail's includes its backward) or backward.
    pub kind: WorkKind,
    /// Forward: its input (token ids or activations). Backward: the upstream gradient.
    pub input: CachedInput,
    /// Tail forwards: the targets `[batch, seq]`.
    pub targets: Option<Vec<u32>>,
    /// What the miner uploaded (decoded); `None` when there is nothing (the head's backward).
    pub output: Option<Vec<f32>>,
    /// The loss the tail reported.
    pub loss: Option<f32>,
}

/// What replaying one item showed.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemCheck {
    /// Sample.
    pub sample: u64,
    /// Kind of work.
    pub kind: WorkKind,
    /// Replay vs upload (`None` when there was nothing to compare).
    pub similarity: Option<Similarity>,
    /// Relative difference between the reported and the replayed loss (tail forwards).
    pub loss_error: Option<f64>,
    /// Why it fails the thresholds.
    pub failure: Option<String>,
    /// Why it could not be replayed (e.g. a backward whose forward was not accepted).
    pub skipped: Option<String>,
}

/// Totals of a replay.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplayStats {
    /// Items replayed and compared.
    pub replayed: u64,
    /// Items that could not be replayed.
    pub skipped: u64,
    /// Items that failed.
    pub failed: u64,
    /// The first few failures, for the record.
    pub failures: Vec<String>,
    /// Smallest cosine seen.
    pub min_cosine: Option<f64>,
    /// Smallest magnitude ratio seen.
    pub min_magnitude_ratio: Option<f64>,
    /// Largest relative loss error seen.
    pub max_loss_error: Option<f64>,
    /// Optimizer steps the replay applied.
    pub steps: u64,
}

/// Failures kept verbatim in [`ReplayStats::failures`].
const KEPT_FAILURES: usize = 5;

impl ReplayStats {
    fn record(&mut self, check: &ItemCheck) {
        if check.skipped.is_some() {
            self.skipped += 1;
            return;
        }
        self.replayed += 1;
        if let Some(s) = &check.similarity {
            self.min_cosine = Some(self.min_cosine.map_or(s.cosine, |m| m.min(s.cosine)));
            self.min_magnitude_ratio = Some(
                self.min_magnitude_ratio
                    .map_or(s.magnitude_ratio, |m| m.min(s.magnitude_ratio)),
            );
        }
        if let Some(e) = check.loss_error {
            self.max_loss_error = Some(self.max_loss_error.map_or(e, |m| m.max(e)));
        }
        if let Some(reason) = &check.failure {
            self.failed += 1;
            if self.failures.len() < KEPT_FAILURES {
                let kind = match check.kind {
                    WorkKind::Forward => "forward",
                    WorkKind::Backward => "backward",
                };
                self.failures
                    .push(format!("sample {} {kind}: {reason}", check.sample));
            }
        }
    }
}

/// Replays one miner's work on its section; see the module docs.
pub struct Replayer<B: AutodiffBackend> {
    section: Section<B>,
    settings: MinerSettings,
    replay: ReplaySettings,
    kept: HashMap<u64, CachedInput>,
    /// Learning-rate schedule index of the next step (the miner's step count).
    step_index: u64,
    stats: ReplayStats,
}

impl<B: AutodiffBackend> std::fmt::Debug for Replayer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replayer")
            .field("section", &self.section)
            .field("stats", &self.stats)
            .finish()
    }
}

impl<B: AutodiffBackend> Replayer<B> {
    /// A replay starting from `section` as it is now (the epoch's starting weights), whose
    /// next optimizer step is the miner's `step_index`-th.
    pub fn new(
        section: Section<B>,
        settings: MinerSettings,
        replay: ReplaySettings,
        step_index: u64,
    ) -> Self {
        Self {
            section,
            settings,
            replay,
            kept: HashMap::new(),
            step_index,
            stats: ReplayStats::default(),
        }
    }

    /// The section as the replay has left it.
    pub fn section(&self) -> &Section<B> {
        &self.section
    }

    /// Totals so far.
    pub fn stats(&self) -> &ReplayStats {
        &self.stats
    }

    /// Replays one item and compares it.
    ///
    /// # Errors
    /// An item whose shapes do not fit the section (a malformed record, not a miner's fault
    /// the replay can judge).
    pub fn apply(&mut self, item: ReplayItem) -> Result<ItemCheck, ModelError> {
        let tail = self.section.spec().is_tail;
        let mut check = ItemCheck {
            sample: item.sample,
            kind: item.kind,
            similarity: None,
            loss_error: None,
            failure: None,
            skipped: None,
        };
        match (item.kind, tail) {
            (WorkKind::Forward, false) => {
                let out = self.section.forward(self.to_input(&item.input))?;
                self.kept.insert(item.sample, item.input);
                check.similarity = Some(self.compare(out, item.output.as_deref())?);
            }
            (WorkKind::Forward, true) => {
                let Some(targets) = item.targets.as_deref() else {
                    check.skipped = Some("tail forward without targets".into());
                    self.stats.record(&check);
                    return Ok(check);
                };
                let shape = input_dims(&item.input);
                let targets = token_tensor::<Inner<B>>(targets, shape, self.section.device());
                let done = self
                    .section
                    .train_tail(self.to_input(&item.input), targets)?;
                check.similarity = Some(self.compare(done.input_grad, item.output.as_deref())?);
                check.loss_error = Some(match item.loss {
                    Some(reported) if reported.is_finite() => {
                        let (r, v) = (f64::from(reported), f64::from(done.loss));
                        (r - v).abs() / v.abs().max(1e-6)
                    }
                    _ => f64::INFINITY,
                });
                self.after_backward();
            }
            (WorkKind::Backward, _) => {
                let Some(input) = self.kept.remove(&item.sample) else {
                    check.skipped = Some("its forward is not in the replayed work".into());
                    self.stats.record(&check);
                    return Ok(check);
                };
                let CachedInput::Hidden { data, shape } = item.input else {
                    check.skipped = Some("the upstream gradient is not an activation".into());
                    self.stats.record(&check);
                    return Ok(check);
                };
                let upstream = Tensor::<Inner<B>, 3>::from_data(
                    TensorData::new(data, shape),
                    self.section.device(),
                );
                let grad = self.section.backward(self.to_input(&input), upstream)?;
                if let Some(grad) = grad {
                    check.similarity = Some(self.compare(grad, item.output.as_deref())?);
                }
                self.after_backward();
            }
        }
        if let Some(s) = &check.similarity {
            check.failure = failure(&self.replay.outputs, s);
        }
        if check.failure.is_none()
            && let Some(e) = check.loss_error
            && e > self.replay.loss_tolerance
        {
            check.failure = Some(format!(
                "reported loss differs from the replayed one by {:.2}%",
                e * 100.0
            ));
        }
        self.stats.record(&check);
        Ok(check)
    }

    /// The replay's flat state (parameters and moments) in `layout`.
    ///
    /// # Errors
    /// [`ModelError::Params`] when the section does not fit `layout`.
    pub fn export_flat(&self, layout: &FlatLayout) -> Result<Vec<f32>, ModelError> {
        self.section.export_flat(layout)
    }

    /// Steps as the miner does: every `local_steps` backwards, at the schedule's rate.
    fn after_backward(&mut self) {
        if self.section.pending_backwards() < self.settings.local_steps.max(1) {
            return;
        }
        let lr = self.settings.schedule.at(self.step_index);
        if let crate::model::StepOutcome::Applied { .. } = self.section.step(lr) {
            self.step_index += 1;
            self.stats.steps += 1;
        }
    }

    fn compare(
        &self,
        replayed: Tensor<Inner<B>, 3>,
        uploaded: Option<&[f32]>,
    ) -> Result<Similarity, ModelError> {
        let ours: Vec<f32> = replayed
            .into_data()
            .to_vec()
            .map_err(|e| ModelError::Shape(format!("{e:?}")))?;
        Ok(similarity(&ours, uploaded.unwrap_or(&[])))
    }

    fn to_input(&self, input: &CachedInput) -> SectionInput<Inner<B>> {
        let device = self.section.device();
        match input {
            CachedInput::Tokens { ids, shape } => {
                SectionInput::Tokens(token_tensor::<Inner<B>>(ids, *shape, device))
            }
            CachedInput::Hidden { data, shape } => SectionInput::Hidden(Tensor::from_data(
                TensorData::new(data.clone(), *shape),
                device,
            )),
        }
    }
}

fn input_dims(input: &CachedInput) -> [usize; 2] {
    match input {
        CachedInput::Tokens { shape, .. } => *shape,
        CachedInput::Hidden { shape, .. } => [shape[0], shape[1]],
    }
}

fn token_tensor<B: burn::tensor::backend::Backend>(
    ids: &[u32],
    shape: [usize; 2],
    device: &B::Device,
) -> Tensor<B, 2, Int> {
    let data: Vec<i64> = ids.iter().map(|&t| i64::from(t)).collect();
    Tensor::from_data(TensorData::new(data, shape), device)
}

/// Compares the change a miner's upload made to the epoch's starting state with the change the
/// replay made (the first `params_len` values: the parameters). Raw states always look alike
/// (they share the start); their pseudo-gradients do not, unless the miner trained as replayed.
pub fn compare_progress(
    start: &[f32],
    replayed: &[f32],
    uploaded: &[f32],
    params_len: usize,
) -> Similarity {
    let mut c = Comparison::new();
    let n = params_len.min(start.len());
    let diff = |v: &[f32]| -> Vec<f32> {
        start[..n]
            .iter()
            .enumerate()
            .map(|(i, s)| v.get(i).copied().unwrap_or(f32::NAN) - s)
            .collect()
    };
    c.add(&diff(replayed), &diff(uploaded));
    c.similarity()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ModelConfig, OptimizerConfig, TestAutodiff};

    #[test]
    fn progress_is_compared_on_the_change_not_the_state() {
        let start = [1.0f32, 1.0, 1.0, 9.0];
        // The replay moved +0.1 on the first value; an upload that did not move at all has a
        // zero pseudo-gradient (cosine 0, ratio 0) although its raw state is 99.9% alike.
        let replayed = [1.1f32, 1.0, 1.0, 9.0];
        let stale = compare_progress(&start, &replayed, &start, 3);
        assert_eq!((stale.cosine, stale.magnitude_ratio), (0.0, 0.0));
        let same = compare_progress(&start, &replayed, &[1.1, 1.0, 1.0, 5.0], 3);
        assert!((same.cosine - 1.0).abs() < 1e-6, "moments are not compared");
        let short = compare_progress(&start, &replayed, &[1.1], 3);
        assert_eq!(short.cosine, 0.0, "a short upload is not finite");
    }

    #[test]
    fn a_section_replays_its_own_work_exactly_and_catches_a_scaled_output() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let device = Default::default();
        let settings = MinerSettings {
            local_steps: 2,
            max_in_flight: 4,
            wire: crate::storage::WireDtype::F32,
            seq_len: 8,
            batch_size: 2,
            seed: 3,
            optimizer: OptimizerConfig::default(),
            schedule: crate::model::LrSchedule::default(),
            heartbeat_s: 1,
        };
        let new = || {
            Section::<TestAutodiff>::new(&cfg, 1, 3, OptimizerConfig::default(), &device).unwrap()
        };
        // The "miner": four forwards and backwards, stepping every two backwards.
        let mut miner = Replayer::new(new(), settings.clone(), ReplaySettings::default(), 0);
        let w = cfg.boundary_width();
        let act = |s: u64| CachedInput::Hidden {
            data: (0..2 * 8 * w)
                .map(|i| ((i as f32 + s as f32) * 0.37).sin())
                .collect(),
            shape: [2, 8, w],
        };
        let mut trace = Vec::new();
        for s in 0..4u64 {
            let out = miner.section.forward(miner.to_input(&act(s))).unwrap();
            let out: Vec<f32> = out.into_data().to_vec().unwrap();
            miner.kept.insert(s, act(s));
            trace.push(ReplayItem {
                sample: s,
                kind: WorkKind::Forward,
                input: act(s),
                targets: None,
                output: Some(out),
                loss: None,
            });
            let up = act(s + 100);
            let CachedInput::Hidden { data, shape } = up.clone() else {
                unreachable!()
            };
            let upstream = Tensor::from_data(TensorData::new(data, shape), &device);
            let input = miner.kept.remove(&s).unwrap();
            let grad = miner
                .section
                .backward(miner.to_input(&input), upstream)
                .unwrap()
                .unwrap();
            miner.after_backward();
            trace.push(ReplayItem {
                sample: s,
                kind: WorkKind::Backward,
                input: up,
                targets: None,
                output: Some(grad.into_data().to_vec().unwrap()),
                loss: None,
            });
        }
        assert_eq!(miner.stats.steps, 2);
        let mut replay = Replayer::new(new(), settings.clone(), ReplaySettings::default(), 0);
        for item in trace.clone() {
            let check = replay.apply(item).unwrap();
            assert!(check.failure.is_none(), "{check:?}");
        }
        let stats = replay.stats().clone();
        assert_eq!((stats.replayed, stats.failed, stats.steps), (8, 0, 2));
        assert!(stats.min_cosine.unwrap() > 0.99999, "{stats:?}");
        // The same trace with the third forward's output doubled.
        let mut scaled = trace;
        if let Some(out) = scaled[4].output.as_mut() {
            out.iter_mut().for_each(|v| *v *= 2.0);
        }
        let mut replay = Replayer::new(new(), settings, ReplaySettings::default(), 0);
        let failed: Vec<_> = scaled
            .into_iter()
            .map(|i| replay.apply(i).unwrap())
            .filter(|c| c.failure.is_some())
            .collect();
        assert_eq!(failed.len(), 1);
        assert!(
            failed[0]
                .failure
                .as_ref()
                .unwrap()
                .contains("magnitude ratio 0.5"),
            "{failed:?}"
        );
    }
}
