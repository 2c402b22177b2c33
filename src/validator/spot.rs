//! Spot checks: a secret sample of *every* miner's items in every window, each recomputed on
//! its own, so a miner that cheats on some of its items is caught without replaying its whole
//! epoch.
//!
//! # Where an item's weights come from
//! A miner's weights move with every optimizer step, and an exact replay of item `k` needs
//! every step before it. A spot check instead places the item on the straight path from the
//! epoch's start state (every miner of the section adopted it) to the state the miner uploaded
//! for the merge: at the share of the epoch's learning-rate sum applied before the item
//! ([`path_positions`]), `w = start + t (upload - start)` for the parameters. Over one epoch
//! of AdamW steps the path is close to straight, so an honest item recomputed there agrees
//! with what the miner sent; the thresholds ([`crate::api::SpotSettings`]) leave room for the
//! bend and are measured against honest runs (docs: validators).
//!
//! This ties each checked item to the miner's upload: an upload that is not what its work
//! produced moves every recomputed item off, and a miner without an accepted upload has no
//! path at all (its epoch's training credit is forfeit in the window instead).
//!
//! # What is compared
//! - a body or head forward: the output activations;
//! - the tail's forward (its loss and backward): the input gradient and the loss, which is
//!   kept as the recomputed loss of that sample (CLASP uses only such losses);
//! - a body section's backward: the input gradient, recomputed at its forward's position.
//!
//! Outputs are compared after taking each channel's mean out
//! ([`super::compare::centered_similarity`]), so noise of the right mean and spread scores
//! about 0 whatever the boundary width. The head's backward sends nothing and is not
//! spot-checked (its effect is in the upload).

use std::collections::HashMap;

use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use super::compare::{Similarity, centered_similarity, failure};
use super::replay::ReplayItem;
use crate::api::{SpotSettings, WorkKind};
use crate::merge::FlatLayout;
use crate::miner::CachedInput;
use crate::miner::engine::{Activations, Engine, EngineError, EngineSettings};
use crate::model::ModelError;

/// How many of `n` checkable items a window checks: `max(min_items, ceil(fraction n))`, at
/// most `n`.
pub fn spot_count(n: usize, settings: &SpotSettings) -> usize {
    if settings.min_items == 0 {
        return 0;
    }
    let by_fraction = if settings.fraction.is_finite() && settings.fraction > 0.0 {
        (n as f64 * settings.fraction.min(1.0)).ceil() as usize
    } else {
        0
    };
    settings.min_items.max(by_fraction).min(n)
}

/// The probability that `k` items drawn without replacement from `n`, of which `bad` are
/// cheated, miss every cheated one (computed exactly).
pub fn miss_probability(n: usize, bad: usize, k: usize) -> f64 {
    if bad == 0 {
        return 1.0;
    }
    let mut p = 1.0;
    for i in 0..k.min(n) {
        let clean = n.saturating_sub(bad).saturating_sub(i);
        p *= clean as f64 / (n - i) as f64;
    }
    p
}

/// Whether an item of `kind` sends something a spot check can compare.
pub fn checkable(kind: WorkKind, head: bool) -> bool {
    match kind {
        WorkKind::Forward => true,
        WorkKind::Backward => !head,
        WorkKind::Eval => false,
    }
}

/// Each item's place on the path from the start state (0) to the upload (1): the learning
/// rate applied by the steps before it over the epoch's whole sum (a backward sits where its
/// forward did, as weight stashing computes it there). Steps follow `settings` as the miner's
/// engine does; the leftover backwards are flushed before the upload.
pub fn path_positions(
    items: &[(u64, WorkKind)],
    tail: bool,
    settings: &EngineSettings,
) -> Vec<f64> {
    let lr = |sample: u64| settings.schedule.at(settings.schedule_index(sample));
    let every = settings.local_steps.max(1);
    let mut applied = 0.0;
    let mut pending = 0;
    let mut last = None;
    let mut forward_at: HashMap<u64, f64> = HashMap::new();
    let mut at = Vec::with_capacity(items.len());
    for &(sample, kind) in items {
        let steps = match (kind, tail) {
            (WorkKind::Forward, false) => {
                forward_at.insert(sample, applied);
                at.push(applied);
                false
            }
            (WorkKind::Forward, true) => {
                at.push(applied);
                true
            }
            (WorkKind::Backward, _) => {
                let here = if settings.weight_stashing || settings.lookahead {
                    forward_at.get(&sample).copied().unwrap_or(applied)
                } else {
                    applied
                };
                at.push(here);
                true
            }
            (WorkKind::Eval, _) => {
                at.push(applied);
                false
            }
        };
        if steps {
            pending += 1;
            last = Some(sample);
            if pending == every {
                applied += lr(sample);
                pending = 0;
            }
        }
    }
    if pending > 0
        && let Some(sample) = last
    {
        applied += lr(sample);
    }
    at.into_iter()
        .map(|a| if applied > 0.0 { a / applied } else { 0.0 })
        .collect()
}

/// What one spot-checked item showed.
#[derive(Debug, Clone, PartialEq)]
pub struct SpotItem {
    /// Sample.
    pub sample: u64,
    /// Kind of work.
    pub kind: WorkKind,
    /// Recomputed against sent.
    pub similarity: Option<Similarity>,
    /// The tail's loss as recomputed.
    pub loss: Option<f32>,
    /// Relative difference of the reported loss from the recomputed one.
    pub loss_error: Option<f64>,
    /// Why it fails (None: it passes).
    pub failure: Option<String>,
}

/// Totals of one miner's spot checks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpotStats {
    /// Items checked.
    pub checked: u64,
    /// Items that failed.
    pub failed: u64,
    /// The first few failures.
    pub failures: Vec<String>,
    /// Smallest centred cosine seen.
    pub min_cosine: Option<f64>,
    /// Smallest magnitude ratio seen.
    pub min_magnitude_ratio: Option<f64>,
    /// Largest relative loss error seen.
    pub max_loss_error: Option<f64>,
}

const KEPT_FAILURES: usize = 5;

impl SpotStats {
    /// Adds one item's verdict.
    pub fn record(&mut self, item: &SpotItem) {
        self.checked += 1;
        if let Some(s) = &item.similarity {
            self.min_cosine = Some(self.min_cosine.map_or(s.cosine, |m| m.min(s.cosine)));
            self.min_magnitude_ratio = Some(
                self.min_magnitude_ratio
                    .map_or(s.magnitude_ratio, |m| m.min(s.magnitude_ratio)),
            );
        }
        if let Some(e) = item.loss_error {
            self.max_loss_error = Some(self.max_loss_error.map_or(e, |m| m.max(e)));
        }
        if let Some(why) = &item.failure {
            self.failed += 1;
            if self.failures.len() < KEPT_FAILURES {
                let kind = match item.kind {
                    WorkKind::Forward => "forward",
                    WorkKind::Backward => "backward",
                    WorkKind::Eval => "eval",
                };
                self.failures
                    .push(format!("sample {} {kind}: {why}", item.sample));
            }
        }
    }
}

/// Recomputes single items of one miner's epoch on the path from `start` to `upload`.
pub struct SpotChecker<B: AutodiffBackend> {
    engine: Engine<B>,
    layout: FlatLayout,
    start: Vec<f32>,
    upload: Vec<f32>,
    settings: SpotSettings,
}

impl<B: AutodiffBackend> std::fmt::Debug for SpotChecker<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpotChecker")
            .field("engine", &self.engine)
            .finish()
    }
}

impl<B: AutodiffBackend> SpotChecker<B> {
    /// A checker on `engine` (the miner's section and settings) between the flat states
    /// `start` and `upload` of `layout`.
    pub fn new(
        engine: Engine<B>,
        layout: FlatLayout,
        start: Vec<f32>,
        upload: Vec<f32>,
        settings: SpotSettings,
    ) -> Self {
        Self {
            engine,
            layout,
            start,
            upload,
            settings,
        }
    }

    /// Sets the engine's weights to the point `t` of the path.
    fn place(&mut self, t: f64) -> Result<(), EngineError> {
        let params = usize::try_from(self.layout.params_len).unwrap_or(usize::MAX);
        let t = t.clamp(0.0, 1.0) as f32;
        let mut w = self.start.clone();
        for (i, (x, u)) in w.iter_mut().zip(&self.upload).enumerate().take(params) {
            if i < params {
                *x += t * (u - *x);
            }
        }
        self.engine.adopt_flat(&self.layout, &w, None)
    }

    /// Recomputes `item` at path position `t`; a backward needs its forward's input.
    ///
    /// # Errors
    /// A record whose shapes do not fit the section.
    pub fn check(
        &mut self,
        item: ReplayItem,
        forward_input: Option<CachedInput>,
        t: f64,
    ) -> Result<SpotItem, ModelError> {
        let tail = self.engine.section().spec().is_tail;
        let mut out = SpotItem {
            sample: item.sample,
            kind: item.kind,
            similarity: None,
            loss: None,
            loss_error: None,
            failure: None,
        };
        self.place(t).map_err(engine_error)?;
        let sent = item.output.as_deref().unwrap_or(&[]);
        let recomputed: Result<Option<Activations>, EngineError> = match (item.kind, tail) {
            (WorkKind::Forward, false) => self.engine.eval_forward(&item.input).map(Some),
            (WorkKind::Forward, true) => match item.targets.as_deref() {
                None => {
                    out.failure = Some("tail work without targets".into());
                    Ok(None)
                }
                Some(targets) => {
                    let shape = match &item.input {
                        CachedInput::Tokens { shape, .. } => *shape,
                        CachedInput::Hidden { shape, .. } => [shape[0], shape[1]],
                    };
                    self.engine
                        .train_tail(item.sample, item.input, targets, shape)
                        .map(|t| {
                            out.loss = Some(t.loss);
                            out.loss_error = Some(match item.loss {
                                Some(r) if r.is_finite() => {
                                    let (r, v) = (f64::from(r), f64::from(t.loss));
                                    (r - v).abs() / v.abs().max(1e-6)
                                }
                                _ => f64::INFINITY,
                            });
                            Some(t.grad)
                        })
                }
            },
            (WorkKind::Backward, _) => match (forward_input, item.input) {
                (Some(input), CachedInput::Hidden { data, shape, .. }) => self
                    .engine
                    .forward(item.sample, input)
                    .and_then(|_| {
                        self.engine
                            .backward(item.sample, Activations { data, shape })
                    })
                    .map(|b| b.grad),
                _ => {
                    out.failure = Some("a backward without its forward's input".into());
                    Ok(None)
                }
            },
            (WorkKind::Eval, _) => Ok(None),
        };
        match recomputed {
            Ok(Some(a)) => {
                let s = centered_similarity(&a.data, sent, a.shape[2]);
                out.failure = failure(&self.settings.outputs, &s);
                out.similarity = Some(s);
            }
            Ok(None) => {}
            Err(EngineError::Model(ModelError::NonFiniteLoss(v))) => {
                out.failure = Some(format!("the recomputed loss is {v}"));
            }
            Err(EngineError::Model(e)) => return Err(e),
            Err(e) => return Err(ModelError::Params(e.to_string())),
        }
        if out.failure.is_none()
            && let Some(e) = out.loss_error
            && e > self.settings.loss_tolerance
        {
            out.failure = Some(format!(
                "reported loss differs from the recomputed one by {:.2}%",
                e * 100.0
            ));
        }
        Ok(out)
    }
}

fn engine_error(e: EngineError) -> ModelError {
    match e {
        EngineError::Model(m) => m,
        other => ModelError::Params(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::LrSchedule;

    #[test]
    fn the_default_sample_catches_a_tenth_within_two_windows() {
        let s = SpotSettings::default();
        for n in [22usize, 50, 100, 400, 2000] {
            let k = spot_count(n, &s);
            let bad = n.div_ceil(10);
            let two_windows = miss_probability(n, bad, k).powi(2);
            assert!(two_windows <= 0.01, "n {n}: k {k}, missed {two_windows}");
        }
        assert_eq!(spot_count(10, &s), 10, "few items: all of them");
        assert_eq!(spot_count(1000, &s), 100, "the fraction above the floor");
        assert_eq!(spot_count(50, &SpotSettings { min_items: 0, ..s }), 0);
        // 0.9^22 by hand, for large n.
        assert!((miss_probability(1_000_000, 100_000, 22) - 0.9f64.powi(22)).abs() < 1e-4);
    }

    #[test]
    fn positions_follow_the_learning_rate_and_stashing() {
        let settings = EngineSettings {
            local_steps: 1,
            schedule: LrSchedule {
                peak: 1.0,
                warmup_steps: 0,
                total_steps: 1000,
                min_ratio: 1.0,
            },
            weight_stashing: true,
            lookahead: false,
            capacity: 8,
            samples_per_step: 0,
            retain_graphs: false,
        };
        use WorkKind::{Backward as B, Forward as F};
        let items = [(0, F), (1, F), (0, B), (2, F), (1, B), (2, B)];
        let at = path_positions(&items, false, &settings);
        // Three equal steps: forwards of 0 and 1 before any, 2 after one.
        assert_eq!(at, vec![0.0, 0.0, 0.0, 1.0 / 3.0, 0.0, 1.0 / 3.0]);
        let tail = path_positions(&[(0, F), (1, F), (2, F), (3, F)], true, &settings);
        assert_eq!(tail, vec![0.0, 0.25, 0.5, 0.75]);
        let every_two = EngineSettings {
            local_steps: 2,
            ..settings
        };
        // Steps after the 2nd item and a flush after the 3rd: two steps in all.
        let at = path_positions(&[(0, F), (1, F), (2, F)], true, &every_two);
        assert_eq!(at, vec![0.0, 0.0, 0.5]);
    }
}
