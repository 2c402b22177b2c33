//! Replaying a miner's recorded work: the same starting weights, inputs, upstream gradients
//! and local optimizer steps, in the order the miner did them, comparing each output and
//! input gradient it uploaded with the replay's (magnitude ratio, and cosine after taking each
//! channel's mean out: [`super::compare::centered_similarity`]), the losses it reported, and
//! at the end the state it uploaded for the merge.
//!
//! The core ([`Replayer`]) takes decoded items, so the network driver
//! ([`super::fetch::load_item`]) and `iota bench validate` (in-memory traces) share it.

use burn::tensor::backend::AutodiffBackend;

use super::compare::{Comparison, Similarity, centered_similarity, failure};
use crate::api::{MinerSettings, ReplaySettings, WorkKind};
use crate::compute::CachedInput;
use crate::compute::engine::{Activations, Engine, EngineError, EngineSettings, StepRecord};
use crate::merge::FlatLayout;
use crate::model::{ModelError, StepOutcome};

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
    /// The replayed loss (tail forwards): the validator's own figure for the sample.
    pub loss: Option<f32>,
    /// Why it fails the thresholds.
    pub failure: Option<String>,
    /// Why it falls short of the strict thresholds while within the late ones, inside the
    /// strict window: drift an honest replay shows on a few items, a cheat on most
    /// ([`ReplayStats::verdict`]).
    pub marginal: Option<String>,
    /// Why it could not be replayed (e.g. a backward whose forward was not accepted).
    pub skipped: Option<String>,
}

/// Totals of a replay.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReplayStats {
    /// Items replayed and compared.
    pub replayed: u64,
    /// Items that could not be replayed.
    pub skipped: u64,
    /// Items that failed.
    pub failed: u64,
    /// The first few failures, for the record.
    pub failures: Vec<String>,
    /// Items inside the strict window that fell short of the strict thresholds but not of the
    /// late ones.
    #[serde(default)]
    pub marginal: u64,
    /// The first few of those, for the record.
    #[serde(default)]
    pub marginals: Vec<String>,
    /// Smallest cosine seen.
    pub min_cosine: Option<f64>,
    /// Smallest magnitude ratio seen.
    pub min_magnitude_ratio: Option<f64>,
    /// Largest relative loss error seen.
    pub max_loss_error: Option<f64>,
    /// Optimizer steps the replay applied.
    pub steps: u64,
    /// Items judged by the late thresholds (after `strict_steps` replayed steps).
    #[serde(default)]
    pub late: u64,
    /// The replayed step at which an item first fell short of the strict thresholds, wherever
    /// it was judged: a failure inside the strict window, the replay's drift after it.
    #[serde(default)]
    pub strict_miss_step: Option<u64>,
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
        let kind = match check.kind {
            WorkKind::Forward => "forward",
            WorkKind::Backward => "backward",
            WorkKind::Eval => "eval",
        };
        if let Some(reason) = &check.failure {
            self.failed += 1;
            if self.failures.len() < KEPT_FAILURES {
                self.failures
                    .push(format!("sample {} {kind}: {reason}", check.sample));
            }
        }
        if let Some(reason) = &check.marginal {
            self.marginal += 1;
            if self.marginals.len() < KEPT_FAILURES {
                self.marginals
                    .push(format!("sample {} {kind}: {reason}", check.sample));
            }
        }
    }

    /// Why the replay flags its miner, if it does: any item past the late thresholds (one
    /// clear difference is a cheat: noise, zeros, a wrong scale or another sample's output),
    /// or items short of the strict thresholds on at least `marginal_share` of the replayed
    /// ones, and at least [`MIN_MARGINAL`] (a systematic difference). An honest replay is not
    /// bit-exact and drifts a little on a few items: on the CI machine an honest head miner's
    /// prefix had 2 of 27 items at centred cosine 0.988 and 0.990 under the strict 0.99.
    pub fn verdict(&self, marginal_share: f64) -> Option<String> {
        if self.failed > 0 {
            return Some(format!(
                "replay: {} of {} items differ from the miner's uploads ({})",
                self.failed,
                self.replayed,
                self.failures.join("; ")
            ));
        }
        let share = self.marginal as f64 / self.replayed.max(1) as f64;
        (self.marginal >= MIN_MARGINAL && share >= marginal_share).then(|| {
            format!(
                "replay: {} of {} items fall short of the strict thresholds ({})",
                self.marginal,
                self.replayed,
                self.marginals.join("; ")
            )
        })
    }
}

/// Fewest items short of the strict thresholds that flag a replay ([`ReplayStats::verdict`]).
pub const MIN_MARGINAL: u64 = 3;

/// Replays one miner's work through the miner's own compute engine; see the module docs.
pub struct Replayer<B: AutodiffBackend> {
    engine: Engine<B>,
    replay: ReplaySettings,
    stats: ReplayStats,
}

impl<B: AutodiffBackend> std::fmt::Debug for Replayer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replayer")
            .field("engine", &self.engine)
            .field("stats", &self.stats)
            .finish()
    }
}

impl<B: AutodiffBackend> Replayer<B> {
    /// A replay on `engine`, whose weights are the epoch's starting ones (version 0), set up
    /// as the miner's ([`EngineSettings::for_miner`]).
    pub fn new(engine: Engine<B>, replay: ReplaySettings) -> Self {
        Self {
            engine,
            replay,
            stats: ReplayStats::default(),
        }
    }

    /// The engine settings every miner of a run uses.
    pub fn engine_settings(settings: &MinerSettings) -> EngineSettings {
        EngineSettings::for_miner(settings)
    }

    /// The engine as the replay has left it.
    pub fn engine(&self) -> &Engine<B> {
        &self.engine
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
        let tail = self.engine.section().spec().is_tail;
        // Steps applied before this item: the version it is computed at.
        let version = self.stats.steps;
        let mut check = ItemCheck {
            sample: item.sample,
            kind: item.kind,
            similarity: None,
            loss_error: None,
            loss: None,
            failure: None,
            marginal: None,
            skipped: None,
        };
        let outcome = match (item.kind, tail) {
            (WorkKind::Eval, _) => {
                check.skipped = Some("evaluation work changes no state".into());
                Ok(None)
            }
            (WorkKind::Forward, false) => self.engine.forward(item.sample, item.input).map(|f| {
                check.similarity = Some(centered_similarity(
                    &f.output.data,
                    item.output.as_deref().unwrap_or(&[]),
                    f.output.shape[2],
                ));
                f.step
            }),
            (WorkKind::Forward, true) => match item.targets.as_deref() {
                None => {
                    check.skipped = Some("tail forward without targets".into());
                    Ok(None)
                }
                Some(targets) => {
                    let shape = input_dims(&item.input);
                    self.engine
                        .train_tail(item.sample, item.input, targets, shape)
                        .map(|t| {
                            check.similarity = Some(centered_similarity(
                                &t.grad.data,
                                item.output.as_deref().unwrap_or(&[]),
                                t.grad.shape[2],
                            ));
                            check.loss = Some(t.loss);
                            check.loss_error = Some(match item.loss {
                                Some(reported) if reported.is_finite() => {
                                    let (r, v) = (f64::from(reported), f64::from(t.loss));
                                    (r - v).abs() / v.abs().max(1e-6)
                                }
                                _ => f64::INFINITY,
                            });
                            t.step
                        })
                }
            },
            (WorkKind::Backward, _) => match item.input {
                CachedInput::Hidden { data, shape, .. } => self
                    .engine
                    .backward(item.sample, Activations { data, shape })
                    .map(|b| {
                        if let Some(grad) = &b.grad {
                            check.similarity = Some(centered_similarity(
                                &grad.data,
                                item.output.as_deref().unwrap_or(&[]),
                                grad.shape[2],
                            ));
                        }
                        b.step
                    }),
                CachedInput::Tokens { .. } => {
                    check.skipped = Some("the upstream gradient is not an activation".into());
                    Ok(None)
                }
            },
        };
        match outcome {
            Ok(step) => self.count(step),
            Err(EngineError::CacheMiss { .. }) => {
                check.skipped = Some("its forward is not in the replayed work".into());
            }
            Err(EngineError::Model(ModelError::NonFiniteLoss(v))) => {
                check.failure = Some(format!(
                    "the replayed loss is {v}, the miner reported a finite one"
                ));
            }
            Err(EngineError::Model(e)) => return Err(e),
        }
        if check.failure.is_none()
            && let Some(s) = &check.similarity
        {
            let strict = failure(&self.replay.outputs, s);
            if strict.is_some() && self.stats.strict_miss_step.is_none() {
                self.stats.strict_miss_step = Some(version);
            }
            let late = failure(&self.replay.late_outputs, s);
            if version < self.replay.strict_steps {
                // Past the late thresholds is a clear difference; between the two, drift.
                match late {
                    Some(why) => check.failure = Some(why),
                    None => check.marginal = strict,
                }
            } else {
                self.stats.late += 1;
                check.failure =
                    late.map(|why| format!("{why} (late thresholds, replayed step {version})"));
            }
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

    /// The replay's flat state (parameters and moments) in `layout`, as the miner uploads it:
    /// gradients accumulated since the last step are applied first, as the miner does before
    /// its upload.
    ///
    /// # Errors
    /// [`ModelError::Params`] when the section does not fit `layout`.
    pub fn export_flat(&mut self, layout: &FlatLayout) -> Result<Vec<f32>, ModelError> {
        let step = self.engine.flush();
        self.count(step);
        self.engine.section().export_flat(layout)
    }

    fn count(&mut self, step: Option<StepRecord>) {
        if let Some(StepRecord {
            outcome: StepOutcome::Applied { .. },
            ..
        }) = step
        {
            self.stats.steps += 1;
        }
    }
}

/// How many of a miner's `items` a replay of `fraction` covers: the first
/// `ceil(fraction x items)` (replays must start where the miner started, so a fraction is a
/// prefix), at most all of them.
pub fn replay_count(items: usize, fraction: f64) -> usize {
    if !fraction.is_finite() || fraction <= 0.0 {
        return 0;
    }
    ((items as f64 * fraction.min(1.0)).ceil() as usize).min(items)
}

fn input_dims(input: &CachedInput) -> [usize; 2] {
    match input {
        CachedInput::Tokens { shape, .. } => *shape,
        CachedInput::Hidden { shape, .. } => [shape[0], shape[1]],
    }
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
    use crate::model::{ModelConfig, OptimizerConfig, Section, TestAutodiff};

    #[test]
    fn late_items_are_judged_by_the_late_thresholds() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let (mut trace, _) = miner_trace(&cfg);
        // The forward of sample 3 runs after the first step (version 1); 10% larger than the
        // replay's: magnitude ratio 0.909, short of the strict 0.95, above the late 0.8.
        assert_eq!((trace[5].sample, trace[5].kind), (3, WorkKind::Forward));
        if let Some(out) = trace[5].output.as_mut() {
            out.iter_mut().for_each(|v| *v *= 1.1);
        }
        let run = |trace: &[ReplayItem], strict_steps: u64| {
            let settings = ReplaySettings {
                strict_steps,
                ..ReplaySettings::default()
            };
            let mut replay = Replayer::new(engine(&cfg, 1), settings);
            let failed: Vec<String> = trace
                .iter()
                .cloned()
                .filter_map(|i| replay.apply(i).unwrap().failure)
                .collect();
            (failed, replay.stats().clone())
        };
        // Inside the strict window it is drift: short of the strict thresholds, recorded,
        // and one item of eight does not flag.
        let (failed, stats) = run(&trace, ReplaySettings::default().strict_steps);
        assert!(failed.is_empty(), "{failed:?}");
        assert_eq!((stats.marginal, stats.late), (1, 0));
        assert_eq!(stats.strict_miss_step, Some(1));
        assert!(stats.marginals[0].starts_with("sample 3 forward: magnitude ratio 0.9"));
        assert_eq!(stats.verdict(0.5), None);
        // With a strict window of one step it is a late item, and passes.
        let (failed, stats) = run(&trace, 1);
        assert!(failed.is_empty(), "{failed:?}");
        assert_eq!(
            stats.strict_miss_step,
            Some(1),
            "the drift is still recorded"
        );
        assert_eq!((stats.late, stats.marginal), (3, 0));
        // Doubled, it fails the late thresholds too, says so, and flags alone.
        if let Some(out) = trace[5].output.as_mut() {
            out.iter_mut().for_each(|v| *v *= 2.0);
        }
        let (failed, _) = run(&trace, 1);
        assert_eq!(failed.len(), 1);
        assert!(
            failed[0].contains("late thresholds, replayed step 1"),
            "{failed:?}"
        );
        let (failed, stats) = run(&trace, ReplaySettings::default().strict_steps);
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert!(stats.verdict(0.5).unwrap().contains("1 of 8 items differ"));
    }

    #[test]
    fn drift_on_most_items_flags_drift_on_a_few_does_not() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let (trace, _) = miner_trace(&cfg);
        let scaled = |k: usize| -> ReplayStats {
            let mut replay = Replayer::new(engine(&cfg, 1), ReplaySettings::default());
            let mut done = 0;
            for mut item in trace.iter().cloned() {
                if done < k
                    && let Some(out) = item.output.as_mut()
                {
                    out.iter_mut().for_each(|v| *v *= 1.1);
                    done += 1;
                }
                replay.apply(item).unwrap();
            }
            replay.stats().clone()
        };
        // Every item of a body section has an output; each scaled one is drift, not a failure.
        let two = scaled(2);
        assert_eq!((two.failed, two.marginal, two.replayed), (0, 2, 8));
        assert_eq!(two.verdict(0.5), None, "2 is under MIN_MARGINAL");
        let four = scaled(4);
        assert_eq!((four.failed, four.marginal), (0, 4));
        let why = four.verdict(0.5).expect("4 of 8 is half");
        assert!(
            why.contains("4 of 8 items fall short of the strict thresholds"),
            "{why}"
        );
        assert_eq!(four.verdict(0.6), None, "4 of 8 is under 0.6");
    }

    #[test]
    fn a_fraction_is_a_prefix_rounded_up() {
        assert_eq!(replay_count(200, 0.01), 2);
        assert_eq!(replay_count(199, 0.01), 2);
        assert_eq!(replay_count(10, 0.1), 1);
        assert_eq!(replay_count(3, 0.01), 1);
        assert_eq!(replay_count(3, 1.0), 3);
        assert_eq!(replay_count(3, 7.0), 3);
        assert_eq!(replay_count(0, 0.5), 0);
        assert_eq!(replay_count(5, f64::NAN), 0);
    }

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

    fn settings() -> MinerSettings {
        MinerSettings {
            local_steps: 2,
            max_in_flight: 4,
            wire: crate::storage::WireDtype::F32,
            seq_len: 8,
            batch_size: 2,
            seed: 3,
            optimizer: OptimizerConfig::default(),
            schedule: crate::model::LrSchedule::default(),
            weight_stashing: true,
            lookahead: false,
            samples_per_step: 0,
            bottleneck_warmup: 0,
            heartbeat_s: 1,
        }
    }

    fn engine(cfg: &ModelConfig, index: usize) -> Engine<TestAutodiff> {
        engine_with(cfg, index, 0)
    }

    /// [`engine`] with a warm-up without the bottleneck of `warmup` samples.
    fn engine_with(cfg: &ModelConfig, index: usize, warmup: u64) -> Engine<TestAutodiff> {
        let section = Section::<TestAutodiff>::new(
            cfg,
            index,
            3,
            OptimizerConfig::default(),
            &Default::default(),
        )
        .unwrap();
        let settings = MinerSettings {
            bottleneck_warmup: warmup,
            ..settings()
        };
        Engine::new(section, EngineSettings::for_miner(&settings))
    }

    /// Sample `s`'s input to section 1 of `cfg` during a warm-up of `warmup` samples (as wide
    /// as sample `s`'s boundary is then), with its token ids where the section re-embeds them.
    fn act_with(s: u64, cfg: &ModelConfig, warmup: u64) -> CachedInput {
        let w = cfg.boundary_width_with_bridge(crate::model::bridge_weight(s, warmup));
        CachedInput::Hidden {
            data: (0..2 * 8 * w)
                .map(|i| ((i as f32 + s as f32) * 0.37).sin())
                .collect(),
            shape: [2, 8, w],
            tokens: cfg
                .reembed
                .then(|| (0..16).map(|i| ((s * 31 + i * 7) % 256) as u32).collect()),
        }
    }

    /// A miner's engine doing forwards and backwards of four samples, interleaved the way a
    /// pipeline interleaves them; the trace it leaves behind.
    fn miner_trace(cfg: &ModelConfig) -> (Vec<ReplayItem>, Vec<f32>) {
        miner_trace_with(cfg, 0)
    }

    /// [`miner_trace`] during a warm-up of `warmup` samples.
    fn miner_trace_with(cfg: &ModelConfig, warmup: u64) -> (Vec<ReplayItem>, Vec<f32>) {
        let mut miner = engine_with(cfg, 1, warmup);
        let mut trace = Vec::new();
        let act = |s: u64, cfg: &ModelConfig| act_with(s, cfg, warmup);
        let forward = |m: &mut Engine<TestAutodiff>, trace: &mut Vec<ReplayItem>, s: u64| {
            let f = m.forward(s, act(s, cfg)).unwrap();
            trace.push(ReplayItem {
                sample: s,
                kind: WorkKind::Forward,
                input: act(s, cfg),
                targets: None,
                output: Some(f.output.data),
                loss: None,
            });
        };
        let backward = |m: &mut Engine<TestAutodiff>, trace: &mut Vec<ReplayItem>, s: u64| {
            // Sample `s`'s width, other values than its input's.
            let w = cfg.boundary_width_with_bridge(crate::model::bridge_weight(s, warmup));
            let data: Vec<f32> = (0..2 * 8 * w)
                .map(|i| ((i as f32 + (s + 100) as f32) * 0.37).sin())
                .collect();
            let shape = [2, 8, w];
            let b = m
                .backward(
                    s,
                    Activations {
                        data: data.clone(),
                        shape,
                    },
                )
                .unwrap();
            trace.push(ReplayItem {
                sample: s,
                kind: WorkKind::Backward,
                input: CachedInput::Hidden {
                    data,
                    shape,
                    tokens: None,
                },
                targets: None,
                output: b.grad.map(|g| g.data),
                loss: None,
            });
        };
        forward(&mut miner, &mut trace, 0);
        forward(&mut miner, &mut trace, 1);
        backward(&mut miner, &mut trace, 0);
        forward(&mut miner, &mut trace, 2);
        backward(&mut miner, &mut trace, 1); // a step: samples 0 and 1
        forward(&mut miner, &mut trace, 3);
        backward(&mut miner, &mut trace, 2);
        backward(&mut miner, &mut trace, 3); // a step: samples 2 and 3
        assert_eq!(miner.version(), 2);
        let layout = crate::model::layout::section_layout(cfg, 1).unwrap();
        (trace, miner.section().export_flat(&layout).unwrap())
    }

    /// Replays all of `trace` on a fresh engine of section 1, asserting every item passes.
    fn replay_all(cfg: &ModelConfig, trace: &[ReplayItem]) -> Replayer<TestAutodiff> {
        replay_all_with(cfg, trace, 0)
    }

    /// [`replay_all`] with the run's warm-up of `warmup` samples.
    fn replay_all_with(
        cfg: &ModelConfig,
        trace: &[ReplayItem],
        warmup: u64,
    ) -> Replayer<TestAutodiff> {
        let mut replay = Replayer::new(engine_with(cfg, 1, warmup), ReplaySettings::default());
        for item in trace.iter().cloned() {
            let check = replay.apply(item).unwrap();
            assert!(
                check.failure.is_none() && check.skipped.is_none(),
                "{check:?}"
            );
        }
        replay
    }

    #[test]
    fn a_replay_reproduces_the_miner_and_catches_a_scaled_output() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let layout = crate::model::layout::section_layout(&cfg, 1).unwrap();
        let (trace, end_state) = miner_trace(&cfg);
        let mut replay = replay_all(&cfg, &trace);
        let stats = replay.stats().clone();
        assert_eq!((stats.replayed, stats.failed, stats.steps), (8, 0, 2));
        assert!(stats.min_cosine.unwrap() > 0.99999, "{stats:?}");
        assert_eq!(
            replay.export_flat(&layout).unwrap(),
            end_state,
            "same process, same bits"
        );
        // The same trace with the third forward's output doubled.
        let mut scaled = trace.clone();
        if let Some(out) = scaled[3].output.as_mut() {
            out.iter_mut().for_each(|v| *v *= 2.0);
        }
        let mut replay = Replayer::new(engine(&cfg, 1), ReplaySettings::default());
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
        // A backward whose forward is missing from the record is skipped, not failed.
        let mut replay = Replayer::new(engine(&cfg, 1), ReplaySettings::default());
        let check = replay.apply(trace[2].clone()).unwrap();
        assert!(check.skipped.is_some() && check.failure.is_none());
    }

    #[test]
    fn a_replay_of_a_reembedding_section_reads_the_samples_ids() {
        let mut cfg = ModelConfig::preset("tiny").unwrap();
        cfg.reembed = true;
        let layout = crate::model::layout::section_layout(&cfg, 1).unwrap();
        let (trace, end_state) = miner_trace(&cfg);
        let mut replay = replay_all(&cfg, &trace);
        assert_eq!(replay.export_flat(&layout).unwrap(), end_state);
        // Outputs computed on other ids than the samples' differ (centred cosine 0.93 on the
        // first forward: short of the strict thresholds), and on every forward the replay flags.
        let mut other = trace.clone();
        for item in &mut other {
            if let (
                WorkKind::Forward,
                CachedInput::Hidden {
                    tokens: Some(ids), ..
                },
            ) = (item.kind, &mut item.input)
            {
                ids.iter_mut().for_each(|t| *t = (*t + 1) % 256);
            }
        }
        let mut replay = Replayer::new(engine(&cfg, 1), ReplaySettings::default());
        let first = replay.apply(other[0].clone()).unwrap();
        assert!(
            first.failure.is_some() || first.marginal.is_some(),
            "{first:?}"
        );
        for item in other.into_iter().skip(1) {
            replay.apply(item).unwrap();
        }
        let why = replay.stats().verdict(0.5);
        assert!(why.is_some(), "{:?}", replay.stats());
    }

    #[test]
    fn a_replay_follows_the_bottleneck_warmup_sample_by_sample() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let (w, d) = (cfg.boundary_width(), cfg.d_model);
        let layout = crate::model::layout::section_layout(&cfg, 1).unwrap();
        // Samples 0-2 cross the bridged boundary at weights 1, 2/3 and 1/3; sample 3 the plain
        // one.
        let (trace, end_state) = miner_trace_with(&cfg, 3);
        let widths: Vec<usize> = trace
            .iter()
            .filter(|i| i.kind == WorkKind::Forward)
            .map(|i| i.output.as_ref().unwrap().len() / 16)
            .collect();
        assert_eq!(widths, [w + d, w + d, w + d, w]);
        let mut replay = replay_all_with(&cfg, &trace, 3);
        assert_eq!(replay.stats().failed, 0);
        assert_eq!(replay.export_flat(&layout).unwrap(), end_state);
        // Without the warm-up the same samples train the section to other weights.
        let (_, plain_end) = miner_trace(&cfg);
        assert_ne!(plain_end, end_state);
        // A miner that kept the bridge at full weight (a warm-up of its own) is caught on the
        // first sample whose weight differs.
        let (mut long, _) = miner_trace_with(&cfg, 1000);
        long.truncate(2);
        let mut replay = Replayer::new(engine_with(&cfg, 1, 3), ReplaySettings::default());
        assert!(replay.apply(long[0].clone()).unwrap().failure.is_none());
        let second = replay.apply(long[1].clone()).unwrap();
        assert!(second.failure.is_some(), "{second:?}");
    }
}
