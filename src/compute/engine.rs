//! A section's compute without a network: decoded inputs in, outputs out, local optimizer
//! steps. The miner loop ([`crate::miner::worker`]) drives it with what it downloads; a validator can
//! drive another one with the same inputs, upstream gradients and order of work, and gets the
//! same outputs, gradients and weights.
//!
//! # Semantics (what a replay must reproduce)
//! - **Versions.** The weights a miner holds at the start of an epoch (the adopted merge, or
//!   the seed's at epoch 0) are version 0; each applied optimizer step makes the next version.
//!   Every forward reports the version it ran at.
//! - **Forward** of a non-tail section runs at the current version and keeps the input (and,
//!   with weight stashing, that version) until the sample's backward. At most `capacity`
//!   samples are kept; the oldest is dropped first (the orchestrator gives a miner no more
//!   forwards in flight than that, so a dropped one's backward never comes).
//! - **Backward** takes the gradient at the version the forward used (weight stashing, as
//!   PipeDream) — or at the current version when stashing is off — and accumulates it. With
//!   stashing (or synchronous steps) the engine keeps the forward's graph and back-propagates
//!   through it ([`EngineSettings::retain_graphs`]); otherwise, or when told to save memory,
//!   it recomputes the forward from the kept input. Both give the same values.
//! - **Tail**: loss, backward and accumulation at once, at the current version.
//! - **Step, asynchronous** (`samples_per_step` 0): after every `local_steps` backwards (the
//!   tail's included) the mean accumulated gradient is applied with AdamW at learning rate
//!   `schedule.at(s)`, where `s` is the largest sample id among those backwards. Sample ids
//!   are handed out in order by the orchestrator, so `s` is the run's global progress: every
//!   miner, late joiners included, is at the same point of one schedule, and a validator
//!   recomputes the rate from the ledger instead of trusting the miner.
//! - **Step, synchronous** (`samples_per_step` G > 0): samples `nG .. (n+1)G` make optimizer
//!   step `n`. The orchestrator starts no sample of step `n + 1` before every sample of step
//!   `n` has finished, so the first piece of work of a later step a miner sees (a forward, or
//!   the tail's loss) is its cue: it first applies the gradients accumulated for the earlier
//!   step, at `schedule.at(n)`. [`Engine::flush`] applies them at the end of an epoch. Every
//!   forward and backward of a step then runs at the same weights, so with one miner per
//!   section the network computes exactly what one process computes with a batch of G
//!   samples.
//! - **Evaluation** forwards and losses always run at version 0 of the epoch (the merged
//!   model), whatever training did since, and change nothing.

use std::collections::HashMap;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use thiserror::Error;

use super::cache::{CachedInput, InputCache};
use crate::merge::FlatLayout;
use crate::model::section::Inner;
use crate::model::{
    LrSchedule, ModelError, Retained, Section, SectionInput, SectionModel, StepOutcome,
};

/// Why the engine could not do a piece of work.
#[derive(Debug, Error)]
pub enum EngineError {
    /// Wrong shapes, a non-finite loss, or a state that does not fit the section.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A backward for a sample whose forward input is not kept (never run here, dropped as
    /// the oldest, or forgotten at the epoch's end).
    #[error("no kept input for sample {sample}: its forward was evicted or done elsewhere")]
    CacheMiss {
        /// The sample.
        sample: u64,
    },
}

/// How the engine trains; the orchestrator announces these ([`crate::api::MinerSettings`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineSettings {
    /// Optimizer step every this many backwards (at least 1).
    pub local_steps: u64,
    /// Learning rate by sample id (the run's global progress).
    pub schedule: LrSchedule,
    /// Recompute a backward at the weights its forward used (else at the current weights).
    pub weight_stashing: bool,
    /// Run a forward (and its backward) at the weights extrapolated to the step its gradient
    /// will be applied at ([`Section::lookahead`]); implies weight stashing.
    pub lookahead: bool,
    /// Most forward inputs kept for their backward (at least 1).
    pub capacity: usize,
    /// Keep each forward's graph (its activations) until its backward instead of recomputing
    /// the forward there: about a sixth less compute per sample, for up to `capacity`
    /// samples' activations in memory. Used where the backward is at the forward's weights
    /// (weight stashing, look-ahead, synchronous steps). The same values either way, so it is
    /// the miner's own choice (`iota mine --recompute-backward` turns it off), not the run's.
    pub retain_graphs: bool,
    /// Samples per synchronous optimizer step (see the module docs); 0: asynchronous steps
    /// every `local_steps` backwards.
    pub samples_per_step: u64,
    /// Length of the warm-up without the bottleneck, counted like the learning-rate schedule
    /// ([`Self::schedule_index`]); 0: none. Each sample's work runs with the bridge weight of
    /// its place ([`crate::model::bridge_weight`]), so its boundary tensors are `d_model`
    /// channels wider while the weight is above 0. Evaluations run the plain model.
    pub bottleneck_warmup: u64,
}

impl EngineSettings {
    /// The settings every miner of a run uses (a validator's replay uses the same).
    pub fn for_miner(settings: &crate::api::MinerSettings) -> Self {
        Self {
            local_steps: settings.local_steps.max(1),
            schedule: settings.schedule,
            weight_stashing: settings.weight_stashing,
            lookahead: settings.lookahead,
            capacity: settings.max_in_flight.max(1),
            samples_per_step: settings.samples_per_step,
            retain_graphs: true,
            bottleneck_warmup: settings.bottleneck_warmup,
        }
    }

    /// Where `sample`'s gradient falls on the learning-rate schedule: its optimizer step in
    /// synchronous mode, the sample id itself otherwise.
    pub fn schedule_index(&self, sample: u64) -> u64 {
        crate::model::schedule::schedule_place(sample, self.samples_per_step)
    }

    /// The warm-up bridge's weight for `sample`'s work ([`Self::bottleneck_warmup`]).
    pub fn bridge_at(&self, sample: u64) -> f64 {
        crate::model::bridge_weight(self.schedule_index(sample), self.bottleneck_warmup)
    }
}

/// Boundary activations or gradients in host memory, row-major `[batch, seq, width]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Activations {
    /// Values.
    pub data: Vec<f32>,
    /// `[batch, seq, width]`.
    pub shape: [usize; 3],
}

/// An optimizer step the engine took (or tried) after a backward.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    /// Version of the weights after the step (unchanged when it was skipped).
    pub version: u64,
    /// Learning rate used.
    pub lr: f64,
    /// Samples whose gradients the step applied, in the order they were accumulated.
    pub samples: Vec<u64>,
    /// What the step did.
    pub outcome: StepOutcome,
}

/// What [`Engine::warmed`] ran before the engine took real work.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmUp {
    /// The throwaway optimizer step (undone afterwards).
    pub step: Option<StepOutcome>,
    /// Wall time of the whole warm-up.
    pub took: std::time::Duration,
}

/// Small, varied, finite values for throwaway inputs and gradients.
fn throwaway_values(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i % 13) as f32 - 6.0) * 1e-2).collect()
}

/// Result of a forward of a non-tail section.
#[derive(Debug, Clone, PartialEq)]
pub struct Forwarded {
    /// Output activations to send to the next section.
    pub output: Activations,
    /// Version of the weights it ran at.
    pub version: u64,
    /// Steps of look-ahead applied to those weights (0 without look-ahead).
    pub lookahead: u64,
    /// The synchronous step this forward's new step number made the engine apply first.
    pub step: Option<StepRecord>,
}

/// What a kept sample's backward needs besides its input.
struct Stash<B: AutodiffBackend> {
    /// Version its forward ran at.
    version: u64,
    /// The weights its forward ran at (weight stashing).
    weights: Option<SectionModel<B>>,
    /// The forward's graph, at the weights it ran at ([`EngineSettings::retain_graphs`]).
    graph: Option<Retained<B>>,
}

/// Result of the tail's loss + backward.
#[derive(Debug, Clone, PartialEq)]
pub struct TailDone {
    /// Mean cross-entropy of the micro-batch.
    pub loss: f32,
    /// Gradient with respect to the tail's input, to send back.
    pub grad: Activations,
    /// Version of the weights it ran at.
    pub version: u64,
    /// The step this backward completed, if any.
    pub step: Option<StepRecord>,
}

/// Result of a backward of a non-tail section.
#[derive(Debug, Clone, PartialEq)]
pub struct BackwardDone {
    /// Gradient with respect to the section's input (None for the head).
    pub grad: Option<Activations>,
    /// Version of the weights the backward's gradient was taken at.
    pub version: u64,
    /// The step this backward completed, if any.
    pub step: Option<StepRecord>,
}

/// One section's training state driven by decoded inputs; see the module docs.
pub struct Engine<B: AutodiffBackend> {
    section: Section<B>,
    settings: EngineSettings,
    /// Forward inputs awaiting their backward.
    cache: InputCache,
    /// Version (and weights) each kept sample's forward ran at.
    stashed: HashMap<u64, Stash<B>>,
    /// Version 0 of the epoch, graph-free, for evaluation.
    base: SectionModel<Inner<B>>,
    /// Steps applied since version 0.
    version: u64,
    /// Samples accumulated for the next step.
    step_samples: Vec<u64>,
    /// Synchronous mode: the optimizer step the accumulated gradients belong to.
    open_step: Option<u64>,
}

impl<B: AutodiffBackend> std::fmt::Debug for Engine<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("section", &self.section)
            .field("settings", &self.settings)
            .field("version", &self.version)
            .field("kept", &self.cache.len())
            .finish()
    }
}

impl<B: AutodiffBackend> Engine<B> {
    /// An engine around `section`, whose current weights become version 0.
    pub fn new(section: Section<B>, settings: EngineSettings) -> Self {
        let base = section.weights().valid();
        Self {
            cache: InputCache::new(settings.capacity.max(1)),
            section,
            settings,
            stashed: HashMap::new(),
            base,
            version: 0,
            step_samples: Vec::new(),
            open_step: None,
        }
    }

    /// An engine around `section` that has first run each kind of its work once, on a clone of
    /// the section and throwaway input of `batch` windows of `seq` tokens (a forward, an
    /// evaluation, a backward and an optimizer step), leaving `section` itself as it was. A
    /// GPU backend compiles its kernels the first time it meets them (minutes on a first
    /// start, about a second from its kernel cache), so a miner that does this before asking
    /// for work does not spend that time inside its first assignments' deadlines.
    ///
    /// # Errors
    /// The section cannot run that shape (the first real work would fail the same way).
    pub fn warmed(
        section: Section<B>,
        settings: EngineSettings,
        [batch, seq]: [usize; 2],
    ) -> Result<(Self, WarmUp), EngineError> {
        let started = std::time::Instant::now();
        let mut engine = Self::new(section.clone(), settings);
        let sample = 0;
        // An input at the boundary's width with the bridge at `bridge`: the evaluation reads
        // the plain boundary (0), sample 0's work the warm-up's.
        let input = |bridge: f64| match engine.section.input_width() {
            None => CachedInput::Tokens {
                ids: vec![0; batch * seq],
                shape: [batch, seq],
            },
            Some(_) => {
                let width = engine.section.config().boundary_width_with_bridge(bridge);
                CachedInput::Hidden {
                    data: throwaway_values(batch * seq * width),
                    shape: [batch, seq, width],
                    tokens: engine.section.reembeds().then(|| vec![0; batch * seq]),
                }
            }
        };
        let (eval_input, input) = (input(0.0), input(settings.bridge_at(sample)));
        let trained = if engine.section.spec().is_tail {
            let targets = vec![0; batch * seq];
            engine.eval_tail(&eval_input, &targets, [batch, seq])?;
            engine
                .train_tail(sample, input, &targets, [batch, seq])?
                .step
        } else {
            engine.eval_forward(&eval_input)?;
            let out = engine.forward(sample, input)?.output;
            let upstream = Activations {
                data: throwaway_values(out.data.len()),
                shape: out.shape,
            };
            engine.backward(sample, upstream)?.step
        };
        let step = trained.or_else(|| engine.flush()).map(|r| r.outcome);
        Ok((
            Self::new(section, settings),
            WarmUp {
                step,
                took: started.elapsed(),
            },
        ))
    }

    /// The section (weights, optimizer, counters).
    pub fn section(&self) -> &Section<B> {
        &self.section
    }

    /// The settings.
    pub fn settings(&self) -> &EngineSettings {
        &self.settings
    }

    /// Version of the current weights (steps applied since version 0).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Forward inputs kept for their backward.
    pub fn kept(&self) -> usize {
        self.cache.len()
    }

    /// How many more forwards can be kept without dropping one.
    pub fn free_slots(&self) -> usize {
        self.cache.free()
    }

    /// Distinct weight versions kept for backwards (the memory cost of weight stashing: one
    /// copy of the section's weights each, shared by the samples of that version; with
    /// look-ahead every kept sample has its own).
    pub fn held_versions(&self) -> usize {
        let mut versions: Vec<u64> = self
            .stashed
            .values()
            .filter(|s| s.weights.is_some() || s.graph.is_some())
            .map(|s| s.version)
            .collect();
        versions.sort_unstable();
        versions.dedup();
        versions.len()
    }

    /// Starts an epoch at the weights held now: they become version 0 (and the evaluation
    /// weights); kept inputs and accumulated gradients of the old epoch are dropped.
    pub fn begin_epoch(&mut self) {
        self.cache.clear();
        self.stashed.clear();
        self.step_samples.clear();
        self.open_step = None;
        self.section.discard_grads();
        self.base = self.section.weights().valid();
        self.version = 0;
    }

    /// Loads a merged state (parameters and moments in `layout`) and begins an epoch at it.
    /// `optimizer_step`, when given, becomes the AdamW step count (the bias corrections of
    /// moments that already hold that many updates).
    ///
    /// # Errors
    /// [`ModelError::Params`] when `flat` does not fit; nothing changes then.
    pub fn adopt_flat(
        &mut self,
        layout: &FlatLayout,
        flat: &[f32],
        optimizer_step: Option<u64>,
    ) -> Result<(), EngineError> {
        self.section.import_flat(layout, flat)?;
        if let Some(step) = optimizer_step {
            self.section.set_optimizer_step(step);
        }
        self.begin_epoch();
        Ok(())
    }

    /// Runs a non-tail section forward on `input` at the current version and keeps the input
    /// for the sample's backward.
    ///
    /// # Errors
    /// The tail, or an input of the wrong kind or shape.
    pub fn forward(&mut self, sample: u64, input: CachedInput) -> Result<Forwarded, EngineError> {
        let step = self.enter(sample);
        self.bridge_for(Some(sample));
        let version = self.version;
        // Steps that will be applied before this sample's backward (backwards come in the
        // order of their forwards).
        let ahead = if self.settings.lookahead {
            (self.cache.len() as u64 + self.section.pending_backwards())
                / self.settings.local_steps.max(1)
        } else {
            0
        };
        // Synchronous steps never move the weights between a forward and its backward.
        let synchronous = self.settings.samples_per_step > 0;
        let stash = (self.settings.weight_stashing || self.settings.lookahead) && !synchronous;
        let retain = self.settings.retain_graphs && (stash || synchronous);
        let (out, weights, graph) = if ahead > 0 {
            let lr = self.settings.schedule.at(sample);
            let weights = self.section.lookahead(ahead, lr);
            let input = self.to_input(&input)?;
            if retain {
                let (out, graph) = self.section.forward_retained_at(&weights, input)?;
                (out, None, Some(graph))
            } else {
                let out = self.section.forward_at(&weights.valid(), input)?;
                (out, Some(weights), None)
            }
        } else if retain {
            let (out, graph) = self.section.forward_retained(self.to_input(&input)?)?;
            (out, None, Some(graph))
        } else {
            let out = self.section.forward(self.to_input(&input)?)?;
            (out, stash.then(|| self.section.weights()), None)
        };
        let output = to_host(out)?;
        if let Some(evicted) = self.cache.insert(sample, input) {
            self.stashed.remove(&evicted);
        }
        self.stashed.insert(
            sample,
            Stash {
                version,
                weights,
                graph,
            },
        );
        Ok(Forwarded {
            output,
            version,
            lookahead: ahead,
            step,
        })
    }

    /// The tail's loss against `targets` (`[batch, seq]` ids), its backward and the step it
    /// completes, at the current version.
    ///
    /// # Errors
    /// Not the tail, wrong shapes, or [`ModelError::NonFiniteLoss`] (nothing accumulated; the
    /// next step is skipped).
    pub fn train_tail(
        &mut self,
        sample: u64,
        input: CachedInput,
        targets: &[u32],
        targets_shape: [usize; 2],
    ) -> Result<TailDone, EngineError> {
        let targets = self.token_tensor(targets, targets_shape)?;
        let input = self.owned_input(input)?;
        let entered = self.enter(sample);
        self.bridge_for(Some(sample));
        let version = self.version;
        let out = self.section.train_tail(input, targets)?;
        let grad = to_host(out.input_grad)?;
        let step = self.after_backward(sample).or(entered);
        Ok(TailDone {
            loss: out.loss,
            grad,
            version,
            step,
        })
    }

    /// The backward of `sample` with the upstream gradient `upstream`: back-propagates through
    /// the forward's kept graph, or recomputes the forward from the kept input (at the
    /// forward's version with stashing); accumulates, and steps when `local_steps` backwards
    /// are in.
    ///
    /// # Errors
    /// [`EngineError::CacheMiss`], or an upstream gradient of the wrong shape (the input is
    /// not kept then either: the sample is lost to this miner).
    pub fn backward(
        &mut self,
        sample: u64,
        upstream: Activations,
    ) -> Result<BackwardDone, EngineError> {
        let input = self
            .cache
            .take(sample)
            .ok_or(EngineError::CacheMiss { sample })?;
        self.bridge_for(Some(sample));
        let upstream = Tensor::<Inner<B>, 3>::from_data(
            TensorData::new(upstream.data, upstream.shape),
            self.section.device(),
        );
        let (version, grad) = match self.stashed.remove(&sample) {
            Some(Stash {
                version,
                graph: Some(graph),
                ..
            }) => (version, self.section.backward_retained(graph, upstream)?),
            stash => {
                let (version, weights) = match stash {
                    Some(Stash {
                        version,
                        weights: Some(weights),
                        ..
                    }) => (version, weights),
                    _ => (self.version, self.section.weights()),
                };
                let input = self.owned_input(input)?;
                (
                    version,
                    self.section.backward_at(&weights, input, upstream)?,
                )
            }
        };
        let grad = grad.map(to_host).transpose()?;
        let step = self.after_backward(sample);
        Ok(BackwardDone {
            grad,
            version,
            step,
        })
    }

    /// An evaluation forward of a non-tail section at version 0 (nothing kept or counted).
    ///
    /// # Errors
    /// The tail, or an input of the wrong kind or shape.
    pub fn eval_forward(&mut self, input: &CachedInput) -> Result<Activations, EngineError> {
        self.bridge_for(None);
        let out = self.section.forward_at(&self.base, self.to_input(input)?)?;
        Ok(to_host(out)?)
    }

    /// The tail's evaluation loss at version 0 (no gradient, no step).
    ///
    /// # Errors
    /// Not the tail, or wrong shapes.
    pub fn eval_tail(
        &mut self,
        input: &CachedInput,
        targets: &[u32],
        targets_shape: [usize; 2],
    ) -> Result<f32, EngineError> {
        self.bridge_for(None);
        let targets = self.token_tensor(targets, targets_shape)?;
        Ok(self
            .section
            .eval_loss_at(&self.base, self.to_input(input)?, targets)?)
    }

    /// Applies the gradients accumulated so far, if any (synchronous mode: the last step of
    /// an epoch, before the state is uploaded; asynchronous mode: fewer than `local_steps`
    /// backwards left over, which are otherwise dropped with the epoch).
    pub fn flush(&mut self) -> Option<StepRecord> {
        self.apply_step()
    }

    /// Sets the section's warm-up bridge for the work of `sample` (`None`: an evaluation,
    /// which runs the plain model).
    fn bridge_for(&mut self, sample: Option<u64>) {
        let bridge = sample.map_or(0.0, |s| self.settings.bridge_at(s));
        self.section.set_bridge(bridge);
    }

    /// Synchronous mode: the first work of a later step applies the earlier step's gradients.
    fn enter(&mut self, sample: u64) -> Option<StepRecord> {
        let g = self.settings.samples_per_step;
        if g == 0 {
            return None;
        }
        let step = sample / g;
        match self.open_step {
            Some(open) if step > open => {
                let record = self.apply_step();
                self.open_step = Some(step);
                record
            }
            Some(_) => None,
            None => {
                self.open_step = Some(step);
                None
            }
        }
    }

    /// Counts a backward and, in asynchronous mode, steps when `local_steps` of them are in.
    fn after_backward(&mut self, sample: u64) -> Option<StepRecord> {
        self.step_samples.push(sample);
        if self.settings.samples_per_step > 0
            || self.section.pending_backwards() < self.settings.local_steps.max(1)
        {
            return None;
        }
        self.apply_step()
    }

    /// One AdamW step with the accumulated gradients, at the rate of the latest sample among
    /// them; `None` when nothing is accumulated.
    fn apply_step(&mut self) -> Option<StepRecord> {
        let at = self.step_samples.iter().copied().max()?;
        if self.section.pending_backwards() == 0 {
            self.step_samples.clear();
            return None;
        }
        let lr = self.settings.schedule.at(self.settings.schedule_index(at));
        let outcome = self.section.step(lr);
        if matches!(outcome, StepOutcome::Applied { .. }) {
            self.version += 1;
        }
        Some(StepRecord {
            version: self.version,
            lr,
            samples: std::mem::take(&mut self.step_samples),
            outcome,
        })
    }

    fn to_input(&self, input: &CachedInput) -> Result<SectionInput<Inner<B>>, ModelError> {
        match input {
            CachedInput::Tokens { ids, shape } => {
                Ok(SectionInput::Tokens(self.token_tensor(ids, *shape)?))
            }
            CachedInput::Hidden {
                data,
                shape,
                tokens,
            } => self.boundary_input(data.clone(), *shape, tokens.as_deref()),
        }
    }

    fn owned_input(&self, input: CachedInput) -> Result<SectionInput<Inner<B>>, ModelError> {
        match input {
            CachedInput::Tokens { ids, shape } => {
                Ok(SectionInput::Tokens(self.token_tensor(&ids, shape)?))
            }
            CachedInput::Hidden {
                data,
                shape,
                tokens,
            } => self.boundary_input(data, shape, tokens.as_deref()),
        }
    }

    /// Activations `data` of `shape` as a section input, with the sample's token ids where
    /// they were given (a section that re-embeds them).
    fn boundary_input(
        &self,
        data: Vec<f32>,
        shape: [usize; 3],
        tokens: Option<&[u32]>,
    ) -> Result<SectionInput<Inner<B>>, ModelError> {
        let ids = tokens
            .map(|ids| self.token_tensor(ids, [shape[0], shape[1]]))
            .transpose()?;
        let hidden = Tensor::from_data(TensorData::new(data, shape), self.section.device());
        Ok(SectionInput::boundary(hidden, ids))
    }

    /// Token ids (inputs or targets) as a tensor, each checked against the vocabulary on the
    /// host: an id past the table is an error here, not a panic in the embedding's lookup.
    fn token_tensor(
        &self,
        ids: &[u32],
        shape: [usize; 2],
    ) -> Result<Tensor<Inner<B>, 2, Int>, ModelError> {
        let vocab = self.section.config().vocab_size;
        if let Some(bad) = crate::codec::token_ids::first_outside(ids, vocab) {
            return Err(ModelError::Shape(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        if ids.len() != shape[0].saturating_mul(shape[1]) {
            return Err(ModelError::Shape(format!(
                "{} token ids for shape {shape:?}",
                ids.len()
            )));
        }
        let data: Vec<i64> = ids.iter().map(|&t| i64::from(t)).collect();
        Ok(Tensor::from_data(
            TensorData::new(data, shape),
            self.section.device(),
        ))
    }
}

/// Copies a boundary tensor to host memory.
fn to_host<B: burn::tensor::backend::Backend>(t: Tensor<B, 3>) -> Result<Activations, ModelError> {
    let shape = t.dims();
    let data = crate::model::host_f32(t.into_data())?;
    Ok(Activations { data, shape })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{self, WireDtype};
    use crate::model::pipeline::Pipeline;
    use crate::model::{ModelConfig, OptimizerConfig, TestAutodiff};

    type E = Engine<TestAutodiff>;

    /// `tiny` at 8 tokens, re-embedding the token ids after each boundary (the preset's
    /// default until 2026-11-30), so the engines carry ids beside every section's input.
    fn cfg() -> ModelConfig {
        let mut cfg = ModelConfig::preset("tiny").unwrap();
        cfg.max_seq_len = 8;
        cfg.reembed = true;
        cfg
    }

    fn schedule() -> LrSchedule {
        LrSchedule {
            peak: 1e-2,
            warmup_steps: 2,
            total_steps: 10,
            min_ratio: 0.1,
        }
    }

    fn engine(index: usize, stashing: bool, local_steps: u64) -> E {
        engine_with(index, stashing, local_steps, 0)
    }

    fn engine_with(index: usize, stashing: bool, local_steps: u64, samples_per_step: u64) -> E {
        engine_set(index, |s| {
            s.weight_stashing = stashing;
            s.local_steps = local_steps;
            s.samples_per_step = samples_per_step;
        })
    }

    fn engine_set(index: usize, set: impl FnOnce(&mut EngineSettings)) -> E {
        let mut settings = EngineSettings {
            local_steps: 1,
            schedule: schedule(),
            weight_stashing: true,
            lookahead: false,
            capacity: 4,
            samples_per_step: 0,
            retain_graphs: true,
            bottleneck_warmup: 0,
        };
        set(&mut settings);
        // The single-process chain's optimizer (no growth of beta1 with staleness), so engines
        // and chain compute the same steps; the orchestrator sends the same for synchronous
        // steps.
        let section = Section::new(
            &cfg(),
            index,
            3,
            OptimizerConfig::default().synchronous(),
            &Default::default(),
        )
        .unwrap();
        Engine::new(section, settings)
    }

    /// Windows of 9 tokens for sample `s` (2 per sample).
    fn windows(s: u64) -> Vec<Vec<u32>> {
        (0..2)
            .map(|w| {
                (0..9)
                    .map(|i| ((s * 31 + w * 7 + i * 13) % 251) as u32)
                    .collect()
            })
            .collect()
    }

    fn split(s: u64) -> (CachedInput, Vec<u32>) {
        let (mut ids, mut targets) = (Vec::new(), Vec::new());
        for w in windows(s) {
            ids.extend_from_slice(&w[..8]);
            targets.extend_from_slice(&w[1..]);
        }
        (CachedInput::Tokens { ids, shape: [2, 8] }, targets)
    }

    /// What crossing the wire does to a boundary tensor.
    fn wire(a: Activations) -> Activations {
        let bytes = codec::encode(&a.shape, &a.data, WireDtype::Bf16).unwrap();
        Activations {
            data: codec::decode_expecting(&bytes, &a.shape).unwrap().data,
            shape: a.shape,
        }
    }

    /// Sample `s`'s input token ids (what `tiny`'s re-embedding sections read).
    fn ids(s: u64) -> Vec<u32> {
        windows(s).iter().flat_map(|w| &w[..8]).copied().collect()
    }

    /// Boundary activations of sample `s` as a body or tail section receives them.
    fn hidden(a: Activations, s: u64) -> CachedInput {
        let a = wire(a);
        CachedInput::Hidden {
            data: a.data,
            shape: a.shape,
            tokens: Some(ids(s)),
        }
    }

    /// One sample through three engines, one at a time (in flight 1); returns the loss.
    fn through(engines: &mut [E], s: u64) -> f32 {
        let (tokens, targets) = split(s);
        let a = engines[0].forward(s, tokens).unwrap().output;
        let b = engines[1].forward(s, hidden(a, s)).unwrap().output;
        let tail = engines[2]
            .train_tail(s, hidden(b, s), &targets, [2, 8])
            .unwrap();
        let g = engines[1]
            .backward(s, wire(tail.grad))
            .unwrap()
            .grad
            .unwrap();
        assert!(engines[0].backward(s, wire(g)).unwrap().grad.is_none());
        tail.loss
    }

    #[test]
    fn a_warm_up_runs_each_kind_of_work_and_leaves_no_trace() {
        let mut plain: Vec<E> = (0..3).map(|i| engine(i, true, 1)).collect();
        let mut warmed: Vec<E> = (0..3)
            .map(|i| {
                let section = Section::new(
                    &cfg(),
                    i,
                    3,
                    OptimizerConfig::default().synchronous(),
                    &Default::default(),
                )
                .unwrap();
                let (e, w) = Engine::warmed(section, *plain[i].settings(), [2, 8]).unwrap();
                // The throwaway work reached the optimizer (so its kernels ran too) ...
                assert!(
                    matches!(w.step, Some(StepOutcome::Applied { .. })),
                    "section {i}: {w:?}"
                );
                // ... and was undone.
                assert_eq!(
                    e.section().stats(),
                    plain[i].section().stats(),
                    "section {i}"
                );
                assert_eq!((e.version(), e.kept()), (0, 0), "section {i}");
                e
            })
            .collect();
        for s in 0..3 {
            let (a, b) = (through(&mut plain, s), through(&mut warmed, s));
            assert_eq!(a.to_bits(), b.to_bits(), "sample {s}: loss {a} against {b}");
        }
        // Same weights and optimizer moments after three steps each.
        for i in 0..3 {
            let layout = crate::model::layout::section_layout(&cfg(), i).unwrap();
            let (a, b) = (
                plain[i].section().export_flat(&layout).unwrap(),
                warmed[i].section().export_flat(&layout).unwrap(),
            );
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()) && a.len() == b.len(),
                "section {i}: state differs after a warm-up"
            );
        }
    }

    #[test]
    fn token_ids_past_the_vocabulary_are_errors_and_change_nothing() {
        let (mut head, mut tail) = (engine(0, true, 1), engine(2, true, 1));
        let (CachedInput::Tokens { mut ids, shape }, mut targets) = split(0) else {
            unreachable!()
        };
        ids[3] = 256;
        let err = head
            .forward(0, CachedInput::Tokens { ids, shape })
            .unwrap_err();
        assert!(err.to_string().contains("token id 256"), "{err}");
        let input = hidden(
            Activations {
                data: vec![0.1; 2 * 8 * head.section().config().boundary_width()],
                shape: [2, 8, head.section().config().boundary_width()],
            },
            0,
        );
        targets[0] = u32::MAX;
        let err = tail.train_tail(0, input, &targets, [2, 8]).unwrap_err();
        assert!(err.to_string().contains("outside the vocabulary"), "{err}");
        assert_eq!(tail.section().stats().forwards, 0);
        assert_eq!(tail.version(), 0);
    }

    #[test]
    fn engines_one_sample_at_a_time_equal_the_single_process_chain() {
        let mut engines: Vec<E> = (0..3).map(|i| engine(i, true, 1)).collect();
        let mut chain = Pipeline::<TestAutodiff>::new(
            &cfg(),
            3,
            OptimizerConfig::default(),
            WireDtype::Bf16,
            &Default::default(),
        )
        .unwrap();
        for s in 0..6 {
            let loss = through(&mut engines, s);
            let w = windows(s);
            let refs: Vec<&[u32]> = w.iter().map(Vec::as_slice).collect();
            let expected = chain.train_batch(&refs).unwrap().loss;
            chain.step(schedule().at(s));
            assert_eq!(loss, expected, "sample {s}");
        }
        for (e, c) in engines.iter().zip(chain.sections()) {
            assert_eq!(e.section().export_params(), c.export_params());
            assert_eq!(e.version(), 6);
        }
    }

    /// Samples `first .. first + n` through three engines as a pipeline would run them: every
    /// forward first (head, body, tail), then every backward (body, head), in sample order.
    /// Returns the losses.
    fn pipelined(engines: &mut [E], first: u64, n: u64) -> Vec<f32> {
        let samples: Vec<u64> = (first..first + n).collect();
        let mut mid = Vec::new();
        for &s in &samples {
            let (tokens, _) = split(s);
            mid.push(hidden(engines[0].forward(s, tokens).unwrap().output, s));
        }
        let mut last = Vec::new();
        for (&s, input) in samples.iter().zip(mid) {
            last.push(hidden(engines[1].forward(s, input).unwrap().output, s));
        }
        let mut grads = Vec::new();
        let mut losses = Vec::new();
        for (&s, input) in samples.iter().zip(last) {
            let (_, targets) = split(s);
            let tail = engines[2].train_tail(s, input, &targets, [2, 8]).unwrap();
            losses.push(tail.loss);
            grads.push(wire(tail.grad));
        }
        let mut grads2 = Vec::new();
        for (&s, g) in samples.iter().zip(grads) {
            let done = engines[1].backward(s, g).unwrap();
            assert!(
                done.step.is_none(),
                "synchronous steps wait for the next step's work"
            );
            grads2.push(wire(done.grad.unwrap()));
        }
        for (&s, g) in samples.iter().zip(grads2) {
            assert!(engines[0].backward(s, g).unwrap().step.is_none());
        }
        losses
    }

    #[test]
    fn synchronous_steps_equal_the_single_process_chain_with_the_step_as_batch() {
        // Two samples per step, both in flight at once: every section's forwards and
        // backwards of a step run at the same weights, so the engines compute exactly what
        // the chain computes with both samples in one step.
        let mut engines: Vec<E> = (0..3).map(|i| engine_with(i, true, 1, 2)).collect();
        let mut chain = Pipeline::<TestAutodiff>::new(
            &cfg(),
            3,
            OptimizerConfig::default(),
            WireDtype::Bf16,
            &Default::default(),
        )
        .unwrap();
        for step in 0..3u64 {
            let losses = pipelined(&mut engines, 2 * step, 2);
            for (i, s) in (2 * step..2 * step + 2).enumerate() {
                let w = windows(s);
                let refs: Vec<&[u32]> = w.iter().map(Vec::as_slice).collect();
                assert_eq!(
                    losses[i],
                    chain.train_batch(&refs).unwrap().loss,
                    "sample {s}"
                );
            }
            chain.step(schedule().at(step));
            // The engines have not stepped yet: the next step's first work (or a flush) does.
            assert!(engines.iter().all(|e| e.version() == step));
        }
        for e in &mut engines {
            let record = e.flush().expect("the last step is applied by the flush");
            assert_eq!((record.samples.len(), record.lr), (2, schedule().at(2)));
            assert!(e.flush().is_none(), "nothing left to apply");
        }
        for (e, c) in engines.iter().zip(chain.sections()) {
            assert_eq!(e.section().export_params(), c.export_params());
            assert_eq!(e.version(), 3);
        }
    }

    #[test]
    fn a_synchronous_step_is_applied_by_the_first_work_of_the_next_step() {
        let mut engines: Vec<E> = (0..3).map(|i| engine_with(i, true, 1, 2)).collect();
        pipelined(&mut engines, 0, 2);
        let (tokens, _) = split(2);
        let fwd = engines[0].forward(2, tokens).unwrap();
        let step = fwd
            .step
            .expect("sample 2 opens step 1, so step 0 is applied first");
        assert_eq!(step.samples, vec![0, 1]);
        assert_eq!(fwd.version, 1, "the forward runs at the stepped weights");
        // A sample of the same step applies nothing.
        let (tokens, _) = split(3);
        assert!(engines[0].forward(3, tokens).unwrap().step.is_none());
        // A new epoch forgets the accumulated step and starts counting afresh.
        engines[1].begin_epoch();
        assert!(engines[1].flush().is_none());
    }

    fn activations(s: u64) -> Activations {
        let w = cfg().boundary_width();
        Activations {
            data: (0..2 * 8 * w)
                .map(|i| ((i as u64 * 3 + s) as f32 * 0.37).sin())
                .collect(),
            shape: [2, 8, w],
        }
    }

    fn input(s: u64) -> CachedInput {
        let a = activations(s + 100);
        CachedInput::Hidden {
            data: a.data,
            shape: a.shape,
            tokens: Some(ids(s)),
        }
    }

    /// Body engine: forwards of samples 0 and 1, then their backwards; the step after the
    /// first backward moves the weights before the second. Returns sample 1's input gradient
    /// and the version its backward reported.
    fn second_backward(stashing: bool) -> (Activations, u64, E) {
        let mut body = engine(1, stashing, 1);
        assert_eq!(body.forward(0, input(0)).unwrap().version, 0);
        assert_eq!(body.forward(1, input(1)).unwrap().version, 0);
        assert_eq!(body.held_versions(), usize::from(stashing));
        let first = body.backward(0, activations(0)).unwrap();
        let step = first.step.unwrap();
        assert_eq!((step.version, step.samples), (1, vec![0]));
        let done = body.backward(1, activations(1)).unwrap();
        (done.grad.unwrap(), done.version, body)
    }

    #[test]
    fn a_stashed_backward_recomputes_at_the_weights_of_its_forward() {
        let (stashed, version, body) = second_backward(true);
        assert_eq!(version, 0);
        assert_eq!(body.version(), 2);
        assert_eq!(
            body.held_versions(),
            0,
            "no kept sample needs an old version"
        );
        // The same backward on a fresh engine, at version 0.
        let mut fresh = engine(1, true, 1);
        fresh.forward(1, input(1)).unwrap();
        let reference = fresh.backward(1, activations(1)).unwrap().grad.unwrap();
        assert_eq!(stashed, reference);
        // Without stashing the backward runs at version 1 and its gradient differs.
        let (current, version, _) = second_backward(false);
        assert_eq!(version, 1);
        assert_ne!(current, reference);
    }

    #[test]
    fn a_kept_graph_does_the_work_of_a_recomputed_forward() {
        // Stashing, look-ahead and synchronous steps, each with graphs kept and recomputed:
        // four forwards in flight, backwards interleaved with forwards (and, asynchronously,
        // with steps), the same numbers.
        type Mode = fn(&mut EngineSettings);
        let modes: [(&str, Mode); 3] = [
            ("stashing", |_| {}),
            ("look-ahead", |s| s.lookahead = true),
            // One synchronous step of all eight samples (the orchestrator starts no sample of
            // the next step before every sample of a step is done).
            ("synchronous", |s| s.samples_per_step = 8),
        ];
        for (name, mode) in modes {
            let mut kept = engine_set(1, mode);
            let mut recomputing = engine_set(1, |s| {
                mode(s);
                s.retain_graphs = false;
            });
            let run = |e: &mut E| {
                let mut seen = Vec::new();
                for s in 0..4 {
                    seen.push(e.forward(s, input(s)).unwrap().output);
                }
                for s in 0..4 {
                    let done = e.backward(s, activations(s)).unwrap();
                    seen.push(done.grad.unwrap());
                    let out = e.forward(s + 4, input(s + 4)).unwrap();
                    seen.push(out.output);
                }
                e.flush();
                (seen, e.version(), e.section().export_params())
            };
            let (a, b) = (run(&mut kept), run(&mut recomputing));
            assert!(a.1 >= 1, "{name}: no step");
            assert!(a == b, "{name}: kept graphs and recomputed forwards differ");
            assert!(
                kept.held_versions() > 0,
                "{name}: the last forwards' graphs"
            );
        }
    }

    #[test]
    fn evaluation_runs_at_version_zero_and_changes_nothing() {
        let mut body = engine(1, true, 1);
        let before = body.eval_forward(&input(5)).unwrap();
        body.forward(0, input(0)).unwrap();
        body.backward(0, activations(0)).unwrap();
        assert_eq!(body.version(), 1);
        let params = body.section().export_params();
        assert_eq!(body.eval_forward(&input(5)).unwrap(), before);
        assert_eq!(body.section().export_params(), params);
        assert_ne!(body.forward(9, input(5)).unwrap().output, before);
        // A new epoch starts at the current weights and forgets kept inputs.
        body.begin_epoch();
        assert_eq!((body.version(), body.kept()), (0, 0));
        assert_ne!(body.eval_forward(&input(5)).unwrap(), before);
        assert!(matches!(
            body.backward(9, activations(9)),
            Err(EngineError::CacheMiss { sample: 9 })
        ));
    }

    /// Sample `s`'s values at `width` channels.
    fn activations_of_width(s: u64, width: usize) -> Activations {
        Activations {
            data: (0..2 * 8 * width)
                .map(|i| ((i as u64 * 3 + s) as f32 * 0.37).sin())
                .collect(),
            shape: [2, 8, width],
        }
    }

    #[test]
    fn the_bottleneck_warmup_widens_its_samples_boundary_and_leaves_evaluation_plain() {
        let (w, d) = (cfg().boundary_width(), cfg().d_model);
        let wide_input = |s: u64| {
            let a = activations_of_width(s + 100, w + d);
            CachedInput::Hidden {
                data: a.data,
                shape: a.shape,
                tokens: Some(ids(s)),
            }
        };
        let plain_eval = engine(1, true, 1).eval_forward(&input(5)).unwrap();
        for retain_graphs in [true, false] {
            let mut warm = engine_set(1, |s| {
                s.bottleneck_warmup = 2;
                s.retain_graphs = retain_graphs;
            });
            assert_eq!(warm.eval_forward(&input(5)).unwrap(), plain_eval);
            assert!(
                warm.forward(0, input(0)).is_err(),
                "sample 0 crosses the bridged boundary"
            );
            let out = warm.forward(0, wide_input(0)).unwrap().output;
            assert_eq!(out.shape, [2, 8, w + d]);
            // Evaluations run the plain model between a sample's forward and its backward.
            assert_eq!(warm.eval_forward(&input(5)).unwrap(), plain_eval);
            let grad = warm
                .backward(0, activations_of_width(0, w + d))
                .unwrap()
                .grad
                .unwrap();
            assert_eq!(grad.shape, [2, 8, w + d]);
            // Sample 2 is past the warm-up.
            let out = warm.forward(2, input(2)).unwrap().output;
            assert_eq!(out.shape, [2, 8, w]);
            let grad = warm.backward(2, activations(2)).unwrap().grad.unwrap();
            assert_eq!(grad.shape, [2, 8, w]);
        }
        // A miner's warm-up before its first work evaluates on the plain boundary and trains
        // on sample 0's bridged one, in every section.
        for i in 0..3 {
            let settings = *engine_set(i, |s| s.bottleneck_warmup = 2).settings();
            let section = Section::<TestAutodiff>::new(
                &cfg(),
                i,
                3,
                OptimizerConfig::default(),
                &Default::default(),
            )
            .unwrap();
            let (_, w) = Engine::warmed(section, settings, [2, 8]).unwrap();
            assert!(
                matches!(w.step, Some(StepOutcome::Applied { .. })),
                "section {i}: {w:?}"
            );
        }
    }

    #[test]
    fn local_steps_accumulate_and_take_the_rate_of_the_latest_sample() {
        let mut body = engine(1, true, 2);
        for s in [4, 2] {
            body.forward(s, input(s)).unwrap();
        }
        assert!(body.backward(4, activations(4)).unwrap().step.is_none());
        let step = body.backward(2, activations(2)).unwrap().step.unwrap();
        assert_eq!(step.samples, vec![4, 2]);
        assert_eq!(step.lr, schedule().at(4));
        assert_eq!(body.version(), 1);
    }

    #[test]
    fn the_oldest_kept_input_is_dropped_when_full() {
        let mut body = engine(1, true, 1);
        for s in 0..5 {
            body.forward(s, input(s)).unwrap();
        }
        assert_eq!(body.kept(), 4);
        assert!(matches!(
            body.backward(0, activations(0)),
            Err(EngineError::CacheMiss { sample: 0 })
        ));
        assert!(body.backward(4, activations(4)).is_ok());
    }
}
