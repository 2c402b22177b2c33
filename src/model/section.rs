//! The section API that miners, validators and `iota train` share: forward without a graph,
//! backward by recomputation from the cached input, gradient accumulation, and an AdamW step
//! that no non-finite value can reach.
//!
//! # Non-finite values
//! A non-finite loss, an upstream gradient with NaN/inf, or a non-finite accumulated gradient
//! poisons the current accumulation window: the next [`Section::step`] is skipped, the
//! accumulated gradients are discarded, and weights and optimizer moments stay exactly as they
//! were after the last good step. Each skipped step is counted in [`SectionStats`]. A step
//! whose result would be non-finite is discarded the same way before it is committed.

use std::collections::{BTreeMap, HashMap, HashSet};

use burn::module::AutodiffModule;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::ModelError;
use super::config::{ModelConfig, SectionSpec};
use super::init::Init;
use super::optimizer::{AdamW, Moments, OptimizerConfig, clip_scale};
use super::params::{self, NamedTensor};
use super::section_model::{SectionInput, SectionModel};

/// The non-autodiff backend under `B`, on which forwards and the optimizer run.
pub type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Reads a one-element tensor back to the host (one device sync).
pub fn scalar<B: Backend>(t: Tensor<B, 1>) -> f64 {
    t.into_scalar().elem::<f64>()
}

/// Counters a section keeps for progress displays and reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SectionStats {
    /// Forward passes run.
    pub forwards: u64,
    /// Backward passes accumulated.
    pub backwards: u64,
    /// Optimizer steps applied.
    pub steps: u64,
    /// Optimizer steps skipped because a loss or gradient was not finite.
    pub skipped_steps: u64,
    /// Non-finite losses seen (tail only).
    pub nonfinite_losses: u64,
    /// Global gradient norm before clipping at the last applied step.
    pub last_grad_norm: f64,
}

/// What [`Section::step`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutcome {
    /// The update was applied.
    Applied {
        /// Global gradient norm of the section before clipping.
        grad_norm: f64,
        /// Whether clipping scaled the gradient down.
        clipped: bool,
    },
    /// Nothing was accumulated since the last step.
    NoGradients,
    /// The step was skipped and state kept at the last good step.
    Skipped {
        /// Why.
        reason: String,
    },
}

/// Result of the tail's combined forward and backward.
#[derive(Debug, Clone)]
pub struct TailOutput<B: Backend> {
    /// Mean cross-entropy of the micro-batch (nats per token).
    pub loss: f32,
    /// Gradient with respect to the tail's input (boundary width), to send back.
    pub input_grad: Tensor<B, 3>,
}

/// Optimizer state exported as named flat tensors (`{param}.exp_avg`, `{param}.exp_avg_sq`).
#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerState {
    /// Updates applied so far.
    pub step: u64,
    /// Moments, two tensors per parameter that has been updated.
    pub tensors: Vec<NamedTensor>,
}

/// One pipeline section with its optimizer, on backend `B` (an autodiff backend). A clone
/// shares the tensors (handles, not copies) and trains on independently of the original.
#[derive(Clone)]
pub struct Section<B: AutodiffBackend> {
    config: ModelConfig,
    spec: SectionSpec,
    model: SectionModel<B>,
    /// Graph-free copy of the weights for forwards, rebuilt lazily after each change.
    forward_model: Option<SectionModel<Inner<B>>>,
    optimizer: AdamW<Inner<B>>,
    /// Sum of gradients since the last step, by parameter name (ordered, so reductions over
    /// it are deterministic and resumes are exact).
    grads: BTreeMap<String, Tensor<Inner<B>, 1>>,
    pending: u64,
    poisoned: Option<String>,
    decayed: HashSet<String>,
    stats: SectionStats,
    device: B::Device,
}

impl<B: AutodiffBackend> std::fmt::Debug for Section<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Section")
            .field("spec", &self.spec)
            .field("stats", &self.stats)
            .finish()
    }
}

impl<B: AutodiffBackend> Section<B> {
    /// Section `index` of `config`, initialised from `seed` (identical for every party using
    /// the same seed, whatever the split).
    ///
    /// # Errors
    /// An invalid config or section index.
    pub fn new(
        config: &ModelConfig,
        index: usize,
        seed: u64,
        optimizer: OptimizerConfig,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        config.validate()?;
        let spec = config.section(index)?;
        let model = SectionModel::new(config, &spec, &Init::new(seed), device);
        let decayed = params::param_shapes(&model, &spec)
            .into_iter()
            .filter(|(_, shape)| shape.len() >= 2)
            .map(|(name, _)| name)
            .collect();
        Ok(Self {
            config: config.clone(),
            spec,
            model,
            forward_model: None,
            optimizer: AdamW::new(optimizer),
            grads: BTreeMap::new(),
            pending: 0,
            poisoned: None,
            decayed,
            stats: SectionStats::default(),
            device: device.clone(),
        })
    }

    /// Where this section sits in the model.
    pub fn spec(&self) -> &SectionSpec {
        &self.spec
    }

    /// The model configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Counters.
    pub fn stats(&self) -> &SectionStats {
        &self.stats
    }

    /// The device the section lives on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// The trainable module (for whole-graph comparisons).
    pub fn module(&self) -> &SectionModel<B> {
        &self.model
    }

    /// Backward passes accumulated since the last step.
    pub fn pending_backwards(&self) -> u64 {
        self.pending
    }

    /// Width of the activations this section receives (None for the head, which takes tokens).
    pub fn input_width(&self) -> Option<usize> {
        (!self.spec.is_head).then(|| self.config.boundary_width())
    }

    /// Width of the activations this section sends (None for the tail, which ends in a loss).
    pub fn output_width(&self) -> Option<usize> {
        (!self.spec.is_tail).then(|| self.config.boundary_width())
    }

    /// Whether the section reads the sample's token ids beside its activations
    /// ([`ModelConfig::reembed`]): its input must then be [`SectionInput::HiddenTokens`].
    pub fn reembeds(&self) -> bool {
        self.spec.reembed
    }

    fn check_input(&self, input: &SectionInput<Inner<B>>) -> Result<[usize; 2], ModelError> {
        let hidden = match (input, self.reembeds()) {
            (SectionInput::Hidden(h), false) => Some(h),
            (SectionInput::HiddenTokens(h, t), true) => {
                let [b, s, _] = h.dims();
                if t.dims() != [b, s] {
                    return Err(ModelError::Shape(format!(
                        "section {} got token ids of shape {:?} with activations for {:?}",
                        self.spec.index,
                        t.dims(),
                        [b, s]
                    )));
                }
                Some(h)
            }
            (SectionInput::Hidden(_), true) => {
                return Err(ModelError::Shape(format!(
                    "section {} re-embeds the token ids: give them with its activations",
                    self.spec.index
                )));
            }
            (SectionInput::HiddenTokens(..), false) => {
                return Err(ModelError::Shape(format!(
                    "section {} does not re-embed token ids: give its activations alone",
                    self.spec.index
                )));
            }
            (SectionInput::Tokens(_), _) => None,
        };
        match (input, hidden, self.input_width()) {
            (SectionInput::Tokens(t), _, None) => {
                let [b, s] = t.dims();
                self.check_seq(s)?;
                Ok([b, s])
            }
            (_, Some(h), Some(width)) => {
                let [b, s, w] = h.dims();
                self.check_seq(s)?;
                if w != width {
                    return Err(ModelError::Shape(format!(
                        "section {} expects activations of width {width}, got {w}",
                        self.spec.index
                    )));
                }
                Ok([b, s])
            }
            (_, None, Some(_)) => Err(ModelError::Shape(format!(
                "section {} takes activations, not token ids",
                self.spec.index
            ))),
            (_, _, None) => Err(ModelError::Shape(
                "the head section takes token ids, not activations".into(),
            )),
        }
    }

    fn check_seq(&self, seq: usize) -> Result<(), ModelError> {
        if seq == 0 || seq > self.config.max_seq_len {
            return Err(ModelError::Shape(format!(
                "sequence length {seq} is outside 1..={}",
                self.config.max_seq_len
            )));
        }
        Ok(())
    }

    fn forward_model(&mut self) -> &SectionModel<Inner<B>> {
        self.forward_model.get_or_insert_with(|| self.model.valid())
    }

    /// The current weights: a cheap copy (burn tensors are reference-counted), unaffected by
    /// later steps, which build new tensors. Keep one to run a backward at the weights a
    /// forward used ([`Self::backward_at`]) or to evaluate a fixed version
    /// ([`Self::forward_at`]).
    pub fn weights(&self) -> SectionModel<B> {
        self.model.clone()
    }

    /// Runs the section without recording a graph and returns its output activations
    /// (`[batch, seq, width]`). The caller keeps `input` for the backward.
    ///
    /// # Errors
    /// The tail (use [`Self::train_tail`]), or an input of the wrong kind or shape.
    pub fn forward(
        &mut self,
        input: SectionInput<Inner<B>>,
    ) -> Result<Tensor<Inner<B>, 3>, ModelError> {
        if self.spec.is_tail {
            return Err(ModelError::Shape(
                "the tail section ends in a loss: call train_tail or eval_loss".into(),
            ));
        }
        self.check_input(&input)?;
        self.stats.forwards += 1;
        Ok(self.forward_model().forward(input))
    }

    /// [`Self::forward`] at other weights (for example a version kept with [`Self::weights`],
    /// made graph-free with `valid()`), without counting it.
    ///
    /// # Errors
    /// As [`Self::forward`].
    pub fn forward_at(
        &self,
        weights: &SectionModel<Inner<B>>,
        input: SectionInput<Inner<B>>,
    ) -> Result<Tensor<Inner<B>, 3>, ModelError> {
        if self.spec.is_tail {
            return Err(ModelError::Shape(
                "the tail section ends in a loss: call train_tail or eval_loss".into(),
            ));
        }
        self.check_input(&input)?;
        Ok(weights.forward(input))
    }

    fn to_autodiff(
        &self,
        input: SectionInput<Inner<B>>,
    ) -> (SectionInput<B>, Option<Tensor<B, 3>>) {
        match input {
            SectionInput::Tokens(t) => (SectionInput::Tokens(Tensor::from_inner(t)), None),
            SectionInput::Hidden(h) => {
                let h = Tensor::<B, 3>::from_inner(h).require_grad();
                (SectionInput::Hidden(h.clone()), Some(h))
            }
            SectionInput::HiddenTokens(h, t) => {
                let h = Tensor::<B, 3>::from_inner(h).require_grad();
                (
                    SectionInput::HiddenTokens(h.clone(), Tensor::from_inner(t)),
                    Some(h),
                )
            }
        }
    }

    /// Recomputes the forward from `input` with a graph, back-propagates `upstream`
    /// (d loss / d output), accumulates the parameter gradients, and returns d loss / d input
    /// (None for the head, whose input is token ids).
    ///
    /// # Errors
    /// The tail (use [`Self::train_tail`]), or inputs of the wrong kind or shape.
    pub fn backward(
        &mut self,
        input: SectionInput<Inner<B>>,
        upstream: Tensor<Inner<B>, 3>,
    ) -> Result<Option<Tensor<Inner<B>, 3>>, ModelError> {
        let weights = self.model.clone();
        self.backward_at(&weights, input, upstream)
    }

    /// [`Self::backward`] with the forward recomputed at `weights` (a version kept with
    /// [`Self::weights`]) instead of the current weights: the parameter gradient is taken at
    /// the weights the sample's forward used (weight stashing), and accumulates by parameter
    /// name for the next [`Self::step`], which updates the current weights.
    ///
    /// # Errors
    /// As [`Self::backward`].
    pub fn backward_at(
        &mut self,
        weights: &SectionModel<B>,
        input: SectionInput<Inner<B>>,
        upstream: Tensor<Inner<B>, 3>,
    ) -> Result<Option<Tensor<Inner<B>, 3>>, ModelError> {
        if self.spec.is_tail {
            return Err(ModelError::Shape(
                "the tail section starts the backward itself: call train_tail".into(),
            ));
        }
        let [b, s] = self.check_input(&input)?;
        let width = self.config.boundary_width();
        if upstream.dims() != [b, s, width] {
            return Err(ModelError::Shape(format!(
                "gradient for section {} has shape {:?}, expected {:?}",
                self.spec.index,
                upstream.dims(),
                [b, s, width]
            )));
        }
        let (input, leaf) = self.to_autodiff(input);
        let out = weights.forward(input);
        let grads = (out * Tensor::<B, 3>::from_inner(upstream))
            .sum()
            .backward();
        let input_grad = leaf.and_then(|x| x.grad(&grads));
        self.accumulate(weights, &grads);
        Ok(input_grad)
    }

    /// The tail's whole job for one micro-batch: loss against `targets` (`[batch, seq]`),
    /// backward, gradient accumulation, and the gradient to send upstream.
    ///
    /// # Errors
    /// Not the tail, wrong shapes, or [`ModelError::NonFiniteLoss`] (nothing is accumulated
    /// and the next step is skipped).
    pub fn train_tail(
        &mut self,
        input: SectionInput<Inner<B>>,
        targets: Tensor<Inner<B>, 2, Int>,
    ) -> Result<TailOutput<Inner<B>>, ModelError> {
        let [b, s] = self.check_tail(&input, &targets)?;
        let (input, leaf) = self.to_autodiff(input);
        let loss = self.model.loss(input, Tensor::from_inner(targets));
        let value = scalar(loss.clone()) as f32;
        if !value.is_finite() {
            self.stats.nonfinite_losses += 1;
            self.poisoned = Some(format!("non-finite loss {value}"));
            return Err(ModelError::NonFiniteLoss(value));
        }
        let grads = loss.backward();
        let width = self.config.boundary_width();
        let input_grad = leaf
            .and_then(|x| x.grad(&grads))
            .unwrap_or_else(|| Tensor::zeros([b, s, width], &self.device));
        let weights = self.model.clone();
        self.accumulate(&weights, &grads);
        self.stats.forwards += 1;
        Ok(TailOutput {
            loss: value,
            input_grad,
        })
    }

    /// Mean loss of the tail on a micro-batch, without a graph and without touching gradients.
    ///
    /// # Errors
    /// Not the tail, or wrong shapes.
    pub fn eval_loss(
        &mut self,
        input: SectionInput<Inner<B>>,
        targets: Tensor<Inner<B>, 2, Int>,
    ) -> Result<f32, ModelError> {
        self.check_tail(&input, &targets)?;
        let loss = self.forward_model().loss(input, targets);
        Ok(scalar(loss) as f32)
    }

    /// [`Self::eval_loss`] at other weights (graph-free, e.g. a kept version's `valid()`).
    ///
    /// # Errors
    /// Not the tail, or wrong shapes.
    pub fn eval_loss_at(
        &self,
        weights: &SectionModel<Inner<B>>,
        input: SectionInput<Inner<B>>,
        targets: Tensor<Inner<B>, 2, Int>,
    ) -> Result<f32, ModelError> {
        self.check_tail(&input, &targets)?;
        Ok(scalar(weights.loss(input, targets)) as f32)
    }

    fn check_tail(
        &self,
        input: &SectionInput<Inner<B>>,
        targets: &Tensor<Inner<B>, 2, Int>,
    ) -> Result<[usize; 2], ModelError> {
        if !self.spec.is_tail {
            return Err(ModelError::Shape(format!(
                "section {} is not the tail: it has no loss",
                self.spec.index
            )));
        }
        let dims = self.check_input(input)?;
        if targets.dims() != dims {
            return Err(ModelError::Shape(format!(
                "targets have shape {:?}, expected {dims:?}",
                targets.dims()
            )));
        }
        Ok(dims)
    }

    /// Adds this section's parameter gradients from a backward pass over a graph built on
    /// `weights` (the section's own backward, or a whole-model graph) to the accumulation
    /// window, and counts one backward.
    pub(crate) fn accumulate(&mut self, weights: &SectionModel<B>, grads: &B::Gradients) {
        for (name, g) in params::collect_grads(weights, &self.spec, grads) {
            let sum = match self.grads.remove(&name) {
                Some(acc) => acc + g,
                None => g,
            };
            self.grads.insert(name, sum);
        }
        self.pending += 1;
        self.stats.backwards += 1;
    }

    /// The sum of the gradients accumulated since the last step, by parameter name.
    pub fn accumulated_grads(&self) -> HashMap<String, Vec<f32>> {
        self.grads
            .iter()
            .map(|(name, g)| {
                (
                    name.clone(),
                    super::host_values(g.clone()).unwrap_or_default(),
                )
            })
            .collect()
    }

    /// Drops the gradients accumulated since the last step.
    pub fn discard_grads(&mut self) {
        self.grads.clear();
        self.pending = 0;
        self.poisoned = None;
    }

    /// Applies one AdamW update with the mean of the accumulated gradients, clipped to the
    /// configured global norm, at learning rate `lr`. See the module docs for how non-finite
    /// values are handled.
    pub fn step(&mut self, lr: f64) -> StepOutcome {
        if let Some(reason) = self.poisoned.take() {
            return self.skip(reason);
        }
        if self.pending == 0 {
            return StepOutcome::NoGradients;
        }
        let mean = 1.0 / self.pending as f64;
        let squares: Vec<Tensor<Inner<B>, 1>> = self
            .grads
            .values()
            .map(|g| g.clone().square().sum())
            .collect();
        if squares.is_empty() {
            self.discard_grads();
            return StepOutcome::NoGradients;
        }
        let norm_sq = scalar(Tensor::cat(squares, 0).sum());
        let norm = norm_sq.sqrt() * mean;
        if !norm.is_finite() {
            return self.skip(format!("non-finite gradient norm {norm}"));
        }
        let clip = clip_scale(norm, self.optimizer.config.grad_clip);
        let scale = mean * clip;
        let t = self.optimizer.step + 1;
        let mut new_moments = HashMap::new();
        let mut sums = Vec::new();
        let grads = std::mem::take(&mut self.grads);
        let candidate = params::map_params(self.model.clone(), &self.spec, |name, current| {
            let Some(g) = grads.get(name) else {
                return current;
            };
            let decay = self.decayed.contains(name);
            let (p, m) =
                self.optimizer
                    .update(name, current.inner(), g.clone() * scale, lr, decay, t);
            sums.push(p.clone().sum());
            new_moments.insert(name.to_string(), m);
            Tensor::from_inner(p)
        });
        self.grads = grads;
        let total = scalar(Tensor::cat(sums, 0).sum());
        if !total.is_finite() {
            return self.skip("the update produced non-finite weights".into());
        }
        self.model = candidate;
        self.forward_model = None;
        self.optimizer.step = t;
        self.optimizer.moments.extend(new_moments);
        self.stats.steps += 1;
        self.stats.last_grad_norm = norm;
        self.discard_grads();
        StepOutcome::Applied {
            grad_norm: norm,
            clipped: clip < 1.0,
        }
    }

    fn skip(&mut self, reason: String) -> StepOutcome {
        tracing::warn!(section = self.spec.index, %reason, "optimizer step skipped");
        self.stats.skipped_steps += 1;
        self.discard_grads();
        StepOutcome::Skipped { reason }
    }

    /// Every parameter, by global name, in host memory.
    pub fn export_params(&self) -> Vec<NamedTensor> {
        params::export_params(&self.model, &self.spec)
    }

    /// Names and shapes of every parameter, in module order.
    pub fn param_shapes(&self) -> Vec<(String, Vec<usize>)> {
        params::param_shapes(&self.model, &self.spec)
    }

    /// Replaces every parameter (all names must be present with the right shapes and finite
    /// values). Accumulated gradients are discarded.
    ///
    /// # Errors
    /// [`ModelError::Params`]; the section is unchanged then.
    pub fn import_params(&mut self, tensors: &[NamedTensor]) -> Result<(), ModelError> {
        self.model = params::import_params(self.model.clone(), &self.spec, tensors)?;
        self.forward_model = None;
        self.discard_grads();
        Ok(())
    }

    /// The optimizer's step count and moments.
    pub fn export_optimizer(&self) -> OptimizerState {
        let mut names: Vec<&String> = self.optimizer.moments.keys().collect();
        names.sort();
        let mut tensors = Vec::with_capacity(names.len() * 2);
        for name in names {
            let m = &self.optimizer.moments[name];
            for (suffix, t) in [("exp_avg", &m.exp_avg), ("exp_avg_sq", &m.exp_avg_sq)] {
                let data = super::host_values(t.clone()).unwrap_or_default();
                tensors.push(NamedTensor {
                    name: format!("{name}.{suffix}"),
                    shape: vec![data.len()],
                    data,
                });
            }
        }
        OptimizerState {
            step: self.optimizer.step,
            tensors,
        }
    }

    /// Restores optimizer state exported by [`Self::export_optimizer`].
    ///
    /// # Errors
    /// [`ModelError::Params`] for unknown names, wrong lengths, unpaired moments or
    /// non-finite values; the section is unchanged then.
    pub fn import_optimizer(&mut self, state: &OptimizerState) -> Result<(), ModelError> {
        let sizes: HashMap<String, usize> = self
            .param_shapes()
            .into_iter()
            .map(|(n, s)| (n, s.iter().product()))
            .collect();
        let mut halves: HashMap<String, [Option<Tensor<Inner<B>, 1>>; 2]> = HashMap::new();
        for t in &state.tensors {
            let (param, which) = if let Some(p) = t.name.strip_suffix(".exp_avg_sq") {
                (p, 1)
            } else if let Some(p) = t.name.strip_suffix(".exp_avg") {
                (p, 0)
            } else {
                return Err(ModelError::Params(format!(
                    "unexpected optimizer tensor `{}`",
                    t.name
                )));
            };
            let expected = *sizes.get(param).ok_or_else(|| {
                ModelError::Params(format!("optimizer tensor `{}` names no parameter", t.name))
            })?;
            if t.data.len() != expected {
                return Err(ModelError::Params(format!(
                    "optimizer tensor `{}` has {} values, expected {expected}",
                    t.name,
                    t.data.len()
                )));
            }
            if t.data.iter().any(|v| !v.is_finite()) {
                return Err(ModelError::Params(format!(
                    "optimizer tensor `{}` has non-finite values",
                    t.name
                )));
            }
            let tensor =
                Tensor::from_data(TensorData::new(t.data.clone(), [expected]), &self.device);
            halves.entry(param.to_string()).or_default()[which] = Some(tensor);
        }
        let mut moments = HashMap::new();
        for (name, [m, v]) in halves {
            match (m, v) {
                (Some(exp_avg), Some(exp_avg_sq)) => {
                    moments.insert(
                        name,
                        Moments {
                            exp_avg,
                            exp_avg_sq,
                        },
                    );
                }
                _ => {
                    return Err(ModelError::Params(format!(
                        "optimizer state of `{name}` lacks one of its two moments"
                    )));
                }
            }
        }
        self.optimizer.moments = moments;
        self.optimizer.step = state.step;
        self.discard_grads();
        Ok(())
    }

    /// The current weights extrapolated `steps` optimizer steps ahead at learning rate `lr`
    /// along the direction the moments point to ([`AdamW::direction`]): where the weights
    /// will be when a gradient computed now is applied `steps` steps later. A forward and its
    /// backward at these weights take the gradient near the point it updates (look-ahead, the
    /// delay correction of asynchronous pipelines). Parameters without moments stay put.
    pub fn lookahead(&self, steps: u64, lr: f64) -> SectionModel<B> {
        if steps == 0 || self.optimizer.moments.is_empty() {
            return self.model.clone();
        }
        let scale = steps as f64 * lr;
        params::map_params(self.model.clone(), &self.spec, |name, current| {
            let inner = current.clone().inner();
            let decay = self.decayed.contains(name);
            match self.optimizer.direction(name, &inner, decay) {
                Some(dir) => Tensor::from_inner(inner - dir * scale),
                None => current,
            }
        })
    }

    /// Sets the AdamW step count, whose bias corrections assume moments that have seen that
    /// many updates (after importing moments merged from miners that took that many steps).
    pub fn set_optimizer_step(&mut self, step: u64) {
        self.optimizer.step = step;
    }

    /// The optimizer's step count (the number of updates its bias corrections count).
    pub fn optimizer_step(&self) -> u64 {
        self.optimizer.step
    }

    /// Replaces the parameters and the optimizer's moments and step together: both or neither.
    /// A refused optimizer state puts the old parameters back from a clone of the module
    /// (shared tensors, no copy of their values). Accumulated gradients are discarded once the
    /// parameters are accepted, as by [`Self::import_params`].
    ///
    /// # Errors
    /// As [`Self::import_params`] and [`Self::import_optimizer`]; the parameters, moments and
    /// step are unchanged then (gradients accumulated before a refused optimizer state are
    /// gone: they were computed for parameters this import meant to replace).
    pub fn import_state(
        &mut self,
        params: &[NamedTensor],
        optimizer: &OptimizerState,
    ) -> Result<(), ModelError> {
        let saved = self.model.clone();
        self.import_params(params)?;
        if let Err(e) = self.import_optimizer(optimizer) {
            self.model = saved;
            self.forward_model = None;
            return Err(e);
        }
        Ok(())
    }

    /// Optimizer hyper-parameters.
    pub fn optimizer_config(&self) -> &OptimizerConfig {
        &self.optimizer.config
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TestAutodiff;
    use burn::tensor::TensorData;

    type Inn = Inner<TestAutodiff>;

    fn tiny() -> ModelConfig {
        ModelConfig::preset("tiny").unwrap()
    }

    /// `tiny` without the re-embedding tables.
    fn plain_tiny() -> ModelConfig {
        ModelConfig {
            reembed: false,
            ..tiny()
        }
    }

    fn tokens(b: usize, s: usize) -> Tensor<Inn, 2, Int> {
        let ids: Vec<i64> = (0..b * s).map(|i| (i * 7 % 251) as i64).collect();
        Tensor::from_data(TensorData::new(ids, [b, s]), &Default::default())
    }

    #[test]
    fn injected_nan_gradient_leaves_weights_unchanged_and_is_reported() {
        let cfg = tiny();
        let device = Default::default();
        let mut head =
            Section::<TestAutodiff>::new(&cfg, 0, 1, OptimizerConfig::default(), &device).unwrap();
        let before = head.export_params();
        let w = cfg.boundary_width();
        let mut grad = vec![0.01f32; 2 * 8 * w];
        grad[5] = f32::NAN;
        let upstream = Tensor::<Inn, 3>::from_data(TensorData::new(grad, [2, 8, w]), &device);
        head.backward(SectionInput::Tokens(tokens(2, 8)), upstream)
            .unwrap();
        let outcome = head.step(1e-2);
        assert!(
            matches!(outcome, StepOutcome::Skipped { .. }),
            "{outcome:?}"
        );
        assert_eq!(head.stats().skipped_steps, 1);
        assert_eq!(head.stats().steps, 0);
        assert_eq!(
            head.export_params(),
            before,
            "weights changed after a NaN step"
        );
        assert!(head.export_optimizer().tensors.is_empty());
        // A good step afterwards is applied.
        let upstream = Tensor::<Inn, 3>::from_data(
            TensorData::new(vec![0.01f32; 2 * 8 * w], [2, 8, w]),
            &device,
        );
        head.backward(SectionInput::Tokens(tokens(2, 8)), upstream)
            .unwrap();
        assert!(matches!(head.step(1e-2), StepOutcome::Applied { .. }));
        assert_ne!(head.export_params(), before);
    }

    #[test]
    fn nonfinite_loss_is_refused_and_skips_the_step() {
        let mut cfg = tiny();
        cfg.sections = vec![[0, 6]];
        let device = Default::default();
        let mut only =
            Section::<TestAutodiff>::new(&cfg, 0, 1, OptimizerConfig::default(), &device).unwrap();
        // An LM head so large that the logits overflow to inf - inf.
        let mut params = only.export_params();
        for t in params.iter_mut().filter(|t| t.name == "lm_head.weight") {
            t.data.iter_mut().for_each(|v| *v = 3.0e38);
        }
        only.import_params(&params).unwrap();
        let before = only.export_params();
        let err = only.train_tail(SectionInput::Tokens(tokens(1, 8)), tokens(1, 8));
        assert!(matches!(err, Err(ModelError::NonFiniteLoss(_))), "{err:?}");
        assert_eq!(only.stats().nonfinite_losses, 1);
        assert!(matches!(only.step(1e-2), StepOutcome::Skipped { .. }));
        assert_eq!(only.export_params(), before);
        assert_eq!(only.pending_backwards(), 0);
    }

    #[test]
    fn params_and_optimizer_round_trip() {
        let cfg = tiny();
        let device = Default::default();
        let mut a =
            Section::<TestAutodiff>::new(&cfg, 2, 1, OptimizerConfig::default(), &device).unwrap();
        let w = cfg.boundary_width();
        let act = Tensor::<Inn, 3>::from_data(
            TensorData::new(
                (0..2 * 8 * w)
                    .map(|i| (i as f32 * 0.37).sin())
                    .collect::<Vec<_>>(),
                [2, 8, w],
            ),
            &device,
        );
        a.train_tail(SectionInput::HiddenTokens(act, tokens(2, 8)), tokens(2, 8))
            .unwrap();
        assert!(matches!(a.step(1e-2), StepOutcome::Applied { .. }));
        let mut b =
            Section::<TestAutodiff>::new(&cfg, 2, 99, OptimizerConfig::default(), &device).unwrap();
        assert_ne!(a.export_params(), b.export_params());
        b.import_params(&a.export_params()).unwrap();
        b.import_optimizer(&a.export_optimizer()).unwrap();
        assert_eq!(a.export_params(), b.export_params());
        assert_eq!(a.export_optimizer(), b.export_optimizer());
        // Wrong shapes and unknown names are refused and change nothing.
        let mut bad = a.export_params();
        bad[0].shape = vec![1, bad[0].data.len()];
        assert!(b.import_params(&bad).is_err());
        let mut bad = a.export_params();
        bad[0].data[0] = f32::INFINITY;
        assert!(b.import_params(&bad).is_err());
        let mut bad = a.export_params();
        bad.pop();
        assert!(b.import_params(&bad).is_err());
        assert_eq!(a.export_params(), b.export_params());
    }

    #[test]
    fn wrong_inputs_are_errors_not_panics() {
        let cfg = tiny();
        let device = Default::default();
        let mut body =
            Section::<TestAutodiff>::new(&cfg, 1, 1, OptimizerConfig::default(), &device).unwrap();
        assert!(body.forward(SectionInput::Tokens(tokens(1, 4))).is_err());
        let wrong = Tensor::<Inn, 3>::zeros([1, 4, cfg.boundary_width() + 1], &device);
        assert!(body.forward(SectionInput::Hidden(wrong)).is_err());
        let too_long =
            Tensor::<Inn, 3>::zeros([1, cfg.max_seq_len + 1, cfg.boundary_width()], &device);
        assert!(body.forward(SectionInput::Hidden(too_long)).is_err());
        let ok = Tensor::<Inn, 3>::zeros([1, 4, cfg.boundary_width()], &device);
        let bad_grad = Tensor::<Inn, 3>::zeros([1, 5, cfg.boundary_width()], &device);
        assert!(
            body.backward(SectionInput::Hidden(ok.clone()), bad_grad)
                .is_err()
        );
        assert!(
            body.eval_loss(SectionInput::Hidden(ok), tokens(1, 4))
                .is_err()
        );
    }

    #[test]
    fn a_reembedding_section_needs_the_ids_of_its_samples_and_reads_them() {
        let cfg = tiny();
        assert!(cfg.reembed);
        let device = Default::default();
        let w = cfg.boundary_width();
        let section = |i| {
            Section::<TestAutodiff>::new(&cfg, i, 1, OptimizerConfig::default(), &device).unwrap()
        };
        let (mut head, mut body, mut tail) = (section(0), section(1), section(2));
        assert!(!head.reembeds() && body.reembeds() && tail.reembeds());
        // The head takes the ids themselves, as without re-embedding.
        assert!(head.forward(SectionInput::Tokens(tokens(1, 4))).is_ok());
        let z = || Tensor::<Inn, 3>::zeros([1, 4, w], &device);
        let refused = |r: Result<Tensor<Inn, 3>, ModelError>| r.unwrap_err().to_string();
        assert!(refused(body.forward(SectionInput::Hidden(z()))).contains("re-embeds"));
        let short = SectionInput::HiddenTokens(z(), tokens(1, 3));
        assert!(refused(body.forward(short)).contains("token ids of shape"));
        assert!(
            tail.eval_loss(SectionInput::Hidden(z()), tokens(1, 4))
                .is_err()
        );
        // A section that does not re-embed refuses ids it would ignore.
        let plain =
            Section::<TestAutodiff>::new(&plain_tiny(), 1, 1, OptimizerConfig::default(), &device)
                .unwrap()
                .forward(SectionInput::HiddenTokens(z(), tokens(1, 4)));
        assert!(refused(plain).contains("does not re-embed"));
        // The output depends on the ids, and the table is a parameter under its global name.
        let a = body
            .forward(SectionInput::HiddenTokens(z(), tokens(1, 4)))
            .unwrap();
        let other = Tensor::from_data(TensorData::new(vec![9i64, 8, 7, 6], [1, 4]), &device);
        let b = body
            .forward(SectionInput::HiddenTokens(z(), other))
            .unwrap();
        let diff: f32 = (a - b).abs().sum().into_scalar();
        assert!(diff > 1e-3, "the ids changed nothing: {diff}");
        let names: Vec<String> = body.param_shapes().into_iter().map(|(n, _)| n).collect();
        assert!(names.contains(&"model.layers.2.reembed.weight".to_string()));
        let shapes = tail.param_shapes();
        assert!(shapes.contains(&(
            "model.layers.4.reembed.weight".to_string(),
            vec![cfg.vocab_size, cfg.d_model]
        )));
        let counted: usize = shapes
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum();
        assert_eq!(counted, cfg.section_params(2).unwrap());
    }

    #[test]
    fn parameter_names_are_pinned() {
        let device = Default::default();
        let names_of = |cfg: &ModelConfig, i| -> Vec<String> {
            Section::<TestAutodiff>::new(cfg, i, 1, OptimizerConfig::default(), &device)
                .unwrap()
                .param_shapes()
                .into_iter()
                .map(|(n, _)| n)
                .collect()
        };
        let block = |i: usize| {
            [
                "input_layernorm.weight",
                "self_attn.q_proj.weight",
                "self_attn.k_proj.weight",
                "self_attn.v_proj.weight",
                "self_attn.o_proj.weight",
                "post_attention_layernorm.weight",
                "mlp.gate_proj.weight",
                "mlp.up_proj.weight",
                "mlp.down_proj.weight",
            ]
            .map(|p| format!("model.layers.{i}.{p}"))
            .to_vec()
        };
        let names = |i| names_of(&plain_tiny(), i);
        let mut head = vec!["model.embed_tokens.weight".to_string()];
        head.extend(block(0));
        head.extend(block(1));
        head.push("model.layers.1.bottleneck.encoder.weight".into());
        assert_eq!(names(0), head);
        let mut tail = vec![
            "model.layers.4.bottleneck.decoder.weight".to_string(),
            "model.layers.4.bottleneck.decoder.bias".to_string(),
        ];
        tail.extend(block(4));
        tail.extend(block(5));
        tail.push("model.norm.weight".into());
        tail.push("lm_head.weight".into());
        assert_eq!(names(2), tail);
        // The preset adds one table to every section after the head, and nothing else.
        for (i, first) in [(0, None), (1, Some(2)), (2, Some(4))] {
            let mut with: Vec<String> = names_of(&tiny(), i);
            let table = first.map(|f| format!("model.layers.{f}.reembed.weight"));
            assert_eq!(
                with.iter().any(|n| Some(n) == table.as_ref()),
                table.is_some()
            );
            with.retain(|n| Some(n) != table.as_ref());
            assert_eq!(with, names(i));
        }
    }
}
