//! The section API that miners, validators and `iota train` share: a forward that keeps its
//! graph for the backward ([`Section::forward_retained`]), or a forward without a graph and a
//! backward that recomputes it from the cached input (the same values, less memory, more
//! compute); gradient accumulation, and an AdamW step that no non-finite value can reach.
//!
//! # Non-finite values
//! A non-finite loss, an upstream gradient with NaN/inf, or a non-finite accumulated gradient
//! poisons the current accumulation window: the next [`Section::step`] is skipped, the
//! accumulated gradients are discarded, and weights and optimizer moments stay exactly as they
//! were after the last good step. Each skipped step is counted in [`SectionStats`]. A step
//! whose result would be non-finite is discarded the same way before it is committed.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use burn::module::AutodiffModule;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::ModelError;
use super::config::{ModelConfig, SectionSpec};
use super::init::Init;
use super::optimizer::{
    AdamW, FlatLayout, Moments, OptimizerConfig, clip_scale, muon_shape, takes_weight_decay,
};
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

/// A forward's graph kept for its backward ([`Section::forward_retained`]): the activations
/// the backward needs, recorded at the weights the forward ran at, so the backward does not
/// recompute the forward (and is at those weights even after later steps: weight stashing for
/// free). It holds the section's activations for one micro-batch until it is used or dropped.
pub struct Retained<B: AutodiffBackend> {
    out: Tensor<B, 3>,
    leaf: Option<Tensor<B, 3>>,
    weights: SectionModel<B>,
}

impl<B: AutodiffBackend> std::fmt::Debug for Retained<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retained")
            .field("out", &self.out.dims())
            .finish()
    }
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
    /// Every parameter end to end, for flat optimizer steps; also says which take weight decay.
    layout: Arc<FlatLayout>,
    /// Whether a step updates the section as one flat vector (see [`Self::set_flat_step`]).
    flat_step: bool,
    /// The shapes of the hidden matrices, which step with Muon when the optimizer's `muon` is
    /// on ([`muon_shape`]).
    matrices: HashMap<String, [usize; 2]>,
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
        let shapes = params::param_shapes(&model, &spec);
        let matrices = shapes
            .iter()
            .filter_map(|(name, shape)| Some((name.clone(), muon_shape(name, shape)?)))
            .collect();
        let layout = Arc::new(FlatLayout::new(
            &shapes
                .into_iter()
                .map(|(name, shape)| {
                    let decays = takes_weight_decay(&shape);
                    (name, shape.iter().product(), decays)
                })
                .collect::<Vec<_>>(),
        ));
        Ok(Self {
            config: config.clone(),
            spec,
            model,
            forward_model: None,
            optimizer: AdamW::new(optimizer.for_section(index, config.n_sections())),
            grads: BTreeMap::new(),
            pending: 0,
            poisoned: None,
            layout,
            flat_step: optimizer.flat_step,
            matrices,
            stats: SectionStats::default(),
            device: device.clone(),
        })
    }

    /// Chooses how [`Self::step`] updates the section: as one flat vector of every parameter
    /// (`true`: a few kernels per step) or parameter by parameter (about nine kernels per
    /// parameter); the default is [`OptimizerConfig::flat_step`]. Both compute the same update,
    /// element by element; the flat step applies only when every parameter has a gradient, and
    /// the section falls back to the other otherwise.
    pub fn set_flat_step(&mut self, flat: bool) {
        self.flat_step = flat;
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

    /// Sends the whole residual stream beside the bottleneck with weight `bridge`, and reads
    /// it when given (a warm-up, see [`SectionModel::bridge`]); 0 turns the bridge off.
    /// Every section of a model must use the same value. Without a bottleneck nothing changes.
    pub fn set_bridge(&mut self, bridge: f64) {
        let bridge = bridge.max(0.0);
        self.model.bridge = bridge;
        if let Some(f) = self.forward_model.as_mut() {
            f.bridge = bridge;
        }
    }

    /// The bridge's weight now ([`Self::set_bridge`]).
    pub fn bridge(&self) -> f64 {
        self.model.bridge
    }

    /// `weights` with this section's bridge ([`Self::set_bridge`]), which governs every
    /// forward whatever the bridge was when the weights were kept.
    fn bridged<'a, M: Backend>(&self, weights: &'a SectionModel<M>) -> Cow<'a, SectionModel<M>> {
        if weights.bridge == self.model.bridge {
            Cow::Borrowed(weights)
        } else {
            let mut w = weights.clone();
            w.bridge = self.model.bridge;
            Cow::Owned(w)
        }
    }

    /// Width of the activations received now: [`Self::input_width`], plus the residual
    /// stream while a bridge is on.
    fn received_width(&self) -> Option<usize> {
        let bridged = self.model.bridge > 0.0 && self.spec.bottleneck_in;
        self.input_width()
            .map(|w| w + if bridged { self.config.d_model } else { 0 })
    }

    /// Width of the activations sent now: [`Self::output_width`], plus the residual stream
    /// while a bridge is on.
    fn sent_width(&self) -> usize {
        let bridge = if self.spec.bottleneck_out {
            self.model.bridge
        } else {
            0.0
        };
        self.config.boundary_width_with_bridge(bridge)
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
        match (input, hidden, self.received_width()) {
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
        Ok(self.bridged(weights).forward(input))
    }

    /// [`Self::forward`] with a graph: returns the output and the graph, which
    /// [`Self::backward_retained`] back-propagates without recomputing the forward. Same output
    /// and, later, the same gradients as a forward and a [`Self::backward_at`] at the same
    /// weights; it costs the forward's activations in memory until then.
    ///
    /// # Errors
    /// As [`Self::forward`].
    pub fn forward_retained(
        &mut self,
        input: SectionInput<Inner<B>>,
    ) -> Result<(Tensor<Inner<B>, 3>, Retained<B>), ModelError> {
        let weights = self.model.clone();
        let out = self.forward_retained_at(&weights, input)?;
        self.stats.forwards += 1;
        Ok(out)
    }

    /// [`Self::forward_retained`] at other weights (e.g. look-ahead weights), without
    /// counting it.
    ///
    /// # Errors
    /// As [`Self::forward`].
    pub fn forward_retained_at(
        &self,
        weights: &SectionModel<B>,
        input: SectionInput<Inner<B>>,
    ) -> Result<(Tensor<Inner<B>, 3>, Retained<B>), ModelError> {
        if self.spec.is_tail {
            return Err(ModelError::Shape(
                "the tail section ends in a loss: call train_tail or eval_loss".into(),
            ));
        }
        self.check_input(&input)?;
        let (input, leaf) = self.to_autodiff(input);
        let weights = self.bridged(weights).into_owned();
        let out = weights.forward(input);
        Ok((out.clone().inner(), Retained { out, leaf, weights }))
    }

    /// The backward of a retained forward with the upstream gradient `upstream`: as
    /// [`Self::backward_at`] at the forward's weights, without recomputing the forward.
    ///
    /// # Errors
    /// An upstream gradient of another shape than the forward's output (the graph is dropped).
    pub fn backward_retained(
        &mut self,
        retained: Retained<B>,
        upstream: Tensor<Inner<B>, 3>,
    ) -> Result<Option<Tensor<Inner<B>, 3>>, ModelError> {
        let Retained { out, leaf, weights } = retained;
        if upstream.dims() != out.dims() {
            return Err(ModelError::Shape(format!(
                "gradient for section {} has shape {:?}, expected {:?}",
                self.spec.index,
                upstream.dims(),
                out.dims()
            )));
        }
        let grads = (out * Tensor::<B, 3>::from_inner(upstream))
            .sum()
            .backward();
        let input_grad = leaf.and_then(|x| x.grad(&grads));
        self.accumulate(&weights, &grads);
        Ok(input_grad)
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
        let width = self.sent_width();
        if upstream.dims() != [b, s, width] {
            return Err(ModelError::Shape(format!(
                "gradient for section {} has shape {:?}, expected {:?}",
                self.spec.index,
                upstream.dims(),
                [b, s, width]
            )));
        }
        let (input, leaf) = self.to_autodiff(input);
        let out = self.bridged(weights).forward(input);
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
        let width = self
            .received_width()
            .unwrap_or(self.config.boundary_width());
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
        Ok(scalar(self.bridged(weights).loss(input, targets)) as f32)
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
        // A Muon step works matrix by matrix, so it never takes the flat path.
        if self.flat_step
            && !self.optimizer.config.muon
            && self.grads.len() == self.layout.names().len()
        {
            let ordered: Option<Vec<Tensor<Inner<B>, 1>>> = self
                .layout
                .names()
                .iter()
                .map(|n| self.grads.get(n).cloned())
                .collect();
            if let Some(ordered) = ordered {
                return self.step_flat(Tensor::cat(ordered, 0), mean, lr);
            }
        }
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
            let decay = self.layout.decays(name);
            let g = g.clone() * scale;
            let (p, m) = match self.matrices.get(name) {
                Some(&shape) if self.optimizer.config.muon => {
                    self.optimizer
                        .update_matrix(name, current.inner(), g, lr, shape)
                }
                _ => self
                    .optimizer
                    .update(name, current.inner(), g, lr, decay, t),
            };
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
        self.optimizer.commit_by_name(new_moments);
        self.applied(t, norm, clip)
    }

    /// Books an update committed at step `t` (the weights and moments already replaced).
    fn applied(&mut self, t: u64, norm: f64, clip: f64) -> StepOutcome {
        self.forward_model = None;
        self.optimizer.step = t;
        self.stats.steps += 1;
        self.stats.last_grad_norm = norm;
        self.discard_grads();
        StepOutcome::Applied {
            grad_norm: norm,
            clipped: clip < 1.0,
        }
    }

    /// [`Self::step`] over every parameter at once: `grad` is the sum of the accumulated
    /// gradients laid out as `self.layout`, `mean` one over the backwards it sums.
    fn step_flat(&mut self, grad: Tensor<Inner<B>, 1>, mean: f64, lr: f64) -> StepOutcome {
        let norm = scalar(grad.clone().square().sum()).sqrt() * mean;
        if !norm.is_finite() {
            return self.skip(format!("non-finite gradient norm {norm}"));
        }
        let clip = clip_scale(norm, self.optimizer.config.grad_clip);
        let t = self.optimizer.step + 1;
        let mut current: HashMap<String, Tensor<Inner<B>, 1>> = HashMap::new();
        params::for_each_param(&self.model, &self.spec, |name, _, value| {
            current.insert(name.to_string(), value.inner());
        });
        let ordered: Option<Vec<Tensor<Inner<B>, 1>>> = self
            .layout
            .names()
            .iter()
            .map(|n| current.remove(n))
            .collect();
        let Some(ordered) = ordered else {
            // Unreachable while the layout is built from this model; refuse rather than guess.
            return self.skip("the parameters do not match the optimizer's layout".into());
        };
        let (param, moments) = self.optimizer.update_flat(
            &self.layout,
            Tensor::cat(ordered, 0),
            grad * (mean * clip),
            lr,
            t,
        );
        let total = scalar(param.clone().sum());
        if !total.is_finite() {
            return self.skip("the update produced non-finite weights".into());
        }
        let layout = self.layout.clone();
        self.model =
            params::map_params(self.model.clone(), &self.spec, |name, current| match layout
                .range(name)
            {
                Some(r) => Tensor::from_inner(param.clone().slice(r)),
                None => current,
            });
        self.optimizer.commit_flat(moments);
        self.applied(t, norm, clip)
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
        let moments = self.optimizer.host_moments();
        let mut tensors = Vec::with_capacity(moments.len() * 2);
        for (name, m, v) in moments {
            for (suffix, data) in [("exp_avg", m), ("exp_avg_sq", v)] {
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
        self.optimizer.set_moments(moments);
        self.optimizer.step = state.step;
        self.discard_grads();
        Ok(())
    }

    /// The current weights extrapolated `steps` optimizer steps ahead at learning rate `lr`
    /// along the direction the moments point to ([`AdamW::direction`], or
    /// [`AdamW::matrix_direction`] for a matrix stepping with Muon): where the weights
    /// will be when a gradient computed now is applied `steps` steps later. A forward and its
    /// backward at these weights take the gradient near the point it updates (look-ahead, the
    /// delay correction of asynchronous pipelines). Parameters without moments stay put.
    pub fn lookahead(&self, steps: u64, lr: f64) -> SectionModel<B> {
        if steps == 0 || self.optimizer.is_empty() {
            return self.model.clone();
        }
        let scale = steps as f64 * lr;
        params::map_params(self.model.clone(), &self.spec, |name, current| {
            let inner = current.clone().inner();
            let direction = match self.matrices.get(name) {
                Some(&shape) if self.optimizer.config.muon => {
                    self.optimizer.matrix_direction(name, &inner, shape)
                }
                _ => self
                    .optimizer
                    .direction(name, &inner, self.layout.decays(name)),
            };
            match direction {
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

    /// Steps with Nesterov momentum (NAdam) or AdamW from now on; the moments are the same
    /// kind either way.
    pub fn set_nesterov(&mut self, on: bool) {
        self.optimizer.config.nesterov = on;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TestAutodiff;
    use crate::model::optimizer::muon_step;
    use burn::tensor::TensorData;

    type Inn = Inner<TestAutodiff>;

    /// `tiny` with the token ids re-embedded after each boundary (the preset's default until
    /// 2026-11-30): most tests here run the section input that carries ids, the longer path.
    fn tiny() -> ModelConfig {
        ModelConfig {
            reembed: true,
            ..plain_tiny()
        }
    }

    /// The `tiny` preset: no re-embedding tables.
    fn plain_tiny() -> ModelConfig {
        ModelConfig::preset("tiny").unwrap()
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
    fn weights_with_other_reembedding_than_the_model_say_which_key_to_set() {
        let device = Default::default();
        let section = |cfg: &ModelConfig| {
            Section::<TestAutodiff>::new(cfg, 1, 1, OptimizerConfig::default(), &device).unwrap()
        };
        let (mut with, mut without) = (section(&tiny()), section(&plain_tiny()));
        let err = without
            .import_params(&with.export_params())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("model.layers.2.reembed.weight") && err.contains("add `reembed: true`"),
            "{err}"
        );
        let err = with
            .import_params(&without.export_params())
            .unwrap_err()
            .to_string();
        assert!(err.contains("remove `reembed: true`"), "{err}");
    }

    fn hidden(cfg: &ModelConfig, seed: f32) -> Tensor<Inn, 3> {
        let w = cfg.boundary_width();
        let values = (0..2 * 8 * w)
            .map(|i| (i as f32 * 0.37 + seed).sin())
            .collect::<Vec<_>>();
        Tensor::from_data(TensorData::new(values, [2, 8, w]), &Default::default())
    }

    #[test]
    fn a_retained_forward_gives_the_recomputed_outputs_gradients_and_steps() {
        let cfg = tiny();
        let device = Default::default();
        for index in [0, 1] {
            let input = |k: usize| {
                if index == 0 {
                    SectionInput::Tokens(tokens(2, 8) + k as i64)
                } else {
                    SectionInput::HiddenTokens(hidden(&cfg, k as f32), tokens(2, 8))
                }
            };
            let mut kept =
                Section::<TestAutodiff>::new(&cfg, index, 3, OptimizerConfig::default(), &device)
                    .unwrap();
            let mut recomputing = kept.clone();
            let upstream = |k: usize| hidden(&cfg, 10.0 + k as f32) * 0.01;
            // Three samples in flight across two steps: sample 1 and 2 run forward at the
            // first weights, sample 3 after a step; a fourth forward is dropped unused.
            let mut graphs = Vec::new();
            let mut stashed = Vec::new();
            for k in [1, 2] {
                let (out, graph) = kept.forward_retained(input(k)).unwrap();
                let expected = recomputing.forward(input(k)).unwrap();
                assert_eq!(
                    out.to_data(),
                    expected.to_data(),
                    "section {index} sample {k}"
                );
                graphs.push(graph);
                stashed.push(recomputing.weights());
            }
            let backward = |kept: &mut Section<TestAutodiff>,
                            recomputing: &mut Section<TestAutodiff>,
                            graph,
                            weights: &SectionModel<TestAutodiff>,
                            k: usize| {
                let a = kept.backward_retained(graph, upstream(k)).unwrap();
                let b = recomputing
                    .backward_at(weights, input(k), upstream(k))
                    .unwrap();
                assert_eq!(a.is_some(), index > 0);
                if let (Some(a), Some(b)) = (a, b) {
                    assert_eq!(a.to_data(), b.to_data(), "section {index} sample {k}");
                }
            };
            let (g1, g2) = (graphs.remove(0), graphs.remove(0));
            backward(&mut kept, &mut recomputing, g1, &stashed[0], 1);
            assert!(matches!(kept.step(1e-2), StepOutcome::Applied { .. }));
            assert!(matches!(
                recomputing.step(1e-2),
                StepOutcome::Applied { .. }
            ));
            let (out, g3) = kept.forward_retained(input(3)).unwrap();
            assert_eq!(
                out.to_data(),
                recomputing.forward(input(3)).unwrap().to_data()
            );
            let w3 = recomputing.weights();
            let (_, unused) = kept.forward_retained(input(4)).unwrap();
            drop(unused);
            backward(&mut kept, &mut recomputing, g2, &stashed[1], 2);
            backward(&mut kept, &mut recomputing, g3, &w3, 3);
            assert!(matches!(kept.step(1e-2), StepOutcome::Applied { .. }));
            assert!(matches!(
                recomputing.step(1e-2),
                StepOutcome::Applied { .. }
            ));
            assert_eq!(kept.export_params(), recomputing.export_params());
            assert_eq!(kept.export_optimizer(), recomputing.export_optimizer());
            // A gradient of the wrong shape is refused.
            let (_, graph) = kept.forward_retained(input(5)).unwrap();
            let wrong = Tensor::<Inn, 3>::zeros([1, 8, cfg.boundary_width()], &device);
            assert!(kept.backward_retained(graph, wrong).is_err());
        }
    }

    /// Boundary activations of 2 x 8 positions and width `w`, value `f(i)` at flat index `i`.
    fn activations(w: usize, f: impl Fn(usize) -> f32) -> Tensor<Inn, 3> {
        Tensor::from_data(
            TensorData::new((0..2 * 8 * w).map(f).collect::<Vec<_>>(), [2, 8, w]),
            &Default::default(),
        )
    }

    fn close(a: &[NamedTensor], b: &[NamedTensor]) -> Result<(), String> {
        close_to(a, b, 1e-5)
    }

    fn close_to(a: &[NamedTensor], b: &[NamedTensor], tol: f32) -> Result<(), String> {
        if a.len() != b.len() {
            return Err(format!("{} tensors against {}", a.len(), b.len()));
        }
        for (x, y) in a.iter().zip(b) {
            if x.name != y.name || x.shape != y.shape {
                return Err(format!(
                    "{} {:?} against {} {:?}",
                    x.name, x.shape, y.name, y.shape
                ));
            }
            for (u, v) in x.data.iter().zip(&y.data) {
                if (u - v).abs() > tol * (1.0 + u.abs()) {
                    return Err(format!("{}: {u} against {v}", x.name));
                }
            }
        }
        Ok(())
    }

    #[test]
    fn the_flat_step_computes_the_per_parameter_update() {
        let cfg = tiny();
        let device = Default::default();
        let w = cfg.boundary_width();
        let act = |k: f32| activations(w, |i| (i as f32 * 0.37 + k).sin());
        // Without clipping both compute the same arithmetic element by element (the gradient
        // norm, a sum in another order, would otherwise scale them apart by f32 rounding).
        let opt = OptimizerConfig {
            grad_clip: 0.0,
            ..Default::default()
        };
        for index in 0..3 {
            let new = || Section::<TestAutodiff>::new(&cfg, index, 1, opt, &device).unwrap();
            // The configuration turns it on (`train.optimizer.flat_step`).
            let flat_config = OptimizerConfig {
                flat_step: true,
                ..opt
            };
            let mut flat =
                Section::<TestAutodiff>::new(&cfg, index, 1, flat_config, &device).unwrap();
            let mut by_name = new();
            let train = |s: &mut Section<TestAutodiff>, k: f32| {
                // Two backwards per step: the mean of the window is what steps.
                for k in [k, k + 1.0] {
                    let input = match index {
                        0 => SectionInput::Tokens(tokens(2, 8)),
                        _ => SectionInput::HiddenTokens(act(k), tokens(2, 8)),
                    };
                    if index == 2 {
                        s.train_tail(input, tokens(2, 8)).unwrap();
                    } else {
                        s.backward(input, act(k + 0.5)).unwrap();
                    }
                }
                s.step(3e-2)
            };
            for k in 0..3 {
                let (a, b) = (train(&mut flat, k as f32), train(&mut by_name, k as f32));
                let (
                    StepOutcome::Applied { grad_norm: na, .. },
                    StepOutcome::Applied { grad_norm: nb, .. },
                ) = (&a, &b)
                else {
                    panic!("section {index}: {a:?} / {b:?}");
                };
                // The same sum of squares in another order: f32 rounding apart.
                assert!(
                    (na - nb).abs() < 2e-4 * nb,
                    "section {index}: norm {na} / {nb}"
                );
                assert!(
                    flat.optimizer.is_flat(),
                    "section {index}: every parameter has a gradient"
                );
                assert!(!by_name.optimizer.is_flat());
            }
            // Weights and exported moments within 1e-5 of each other.
            let same_state = |a: &Section<TestAutodiff>, b: &Section<TestAutodiff>, when: &str| {
                close(&a.export_params(), &b.export_params())
                    .unwrap_or_else(|e| panic!("section {index}, weights{when}: {e}"));
                close(&a.export_optimizer().tensors, &b.export_optimizer().tensors)
                    .unwrap_or_else(|e| panic!("section {index}, moments{when}: {e}"));
            };
            same_state(&flat, &by_name, "");
            let ahead =
                |s: &Section<TestAutodiff>| params::export_params(&s.lookahead(2, 1e-2), &s.spec);
            close(&ahead(&flat), &ahead(&by_name))
                .unwrap_or_else(|e| panic!("section {index}, look-ahead: {e}"));
            // Switching kinds in both directions, and importing flat-exported state, keeps
            // the two in step.
            flat.set_flat_step(false);
            by_name.set_flat_step(true);
            train(&mut flat, 5.0);
            train(&mut by_name, 5.0);
            assert!(by_name.optimizer.is_flat() && !flat.optimizer.is_flat());
            let mut imported = new();
            imported.set_flat_step(true);
            imported
                .import_state(&by_name.export_params(), &by_name.export_optimizer())
                .unwrap();
            assert!(!imported.optimizer.is_flat());
            for s in [&mut flat, &mut by_name, &mut imported] {
                train(s, 6.0);
            }
            assert!(imported.optimizer.is_flat());
            for other in [&by_name, &imported] {
                same_state(&flat, other, " after switching");
            }
            // With clipping (the defaults) the two scale by norms f32 rounding apart.
            let clipped = || {
                Section::<TestAutodiff>::new(&cfg, index, 1, OptimizerConfig::default(), &device)
                    .unwrap()
            };
            let (mut flat, mut by_name) = (clipped(), clipped());
            flat.set_flat_step(true);
            by_name.set_flat_step(false);
            for k in 0..2 {
                for s in [&mut flat, &mut by_name] {
                    let outcome = train(s, k as f32);
                    assert!(
                        matches!(outcome, StepOutcome::Applied { clipped: true, .. }),
                        "{outcome:?}"
                    );
                }
            }
            close_to(&flat.export_params(), &by_name.export_params(), 1e-4)
                .unwrap_or_else(|e| panic!("section {index}, clipped: {e}"));
        }
    }

    #[test]
    fn muon_moves_the_hidden_matrices_at_adamws_size_and_replays_exactly() {
        let cfg = plain_tiny();
        let device = Default::default();
        let w = cfg.boundary_width();
        let act = |k: f32| activations(w, |i| (i as f32 * 0.29 + k).cos());
        let adamw = OptimizerConfig {
            weight_decay: 0.0,
            nesterov: false,
            ..Default::default()
        };
        // `flat_step` asks for the flat path, which a Muon step never takes.
        let muon = OptimizerConfig {
            muon: true,
            flat_step: true,
            ..adamw
        };
        let lr = 1e-2;
        for index in 0..3 {
            let new = |c| Section::<TestAutodiff>::new(&cfg, index, 3, c, &device).unwrap();
            let train = |s: &mut Section<TestAutodiff>, k: f32| {
                let input = match index {
                    0 => SectionInput::Tokens(tokens(2, 8)),
                    _ => SectionInput::Hidden(act(k)),
                };
                if index == 2 {
                    s.train_tail(input, tokens(2, 8)).unwrap();
                } else {
                    s.backward(input, act(k + 0.5)).unwrap();
                }
                let outcome = s.step(lr);
                assert!(
                    matches!(outcome, StepOutcome::Applied { .. }),
                    "{outcome:?}"
                );
            };
            let before = new(adamw).export_params();
            let (mut a, mut b, mut plain) = (new(muon), new(muon), new(adamw));
            train(&mut a, 0.0);
            train(&mut plain, 0.0);
            let (after, plain_after) = (a.export_params(), plain.export_params());
            let mut matrices = 0;
            for ((x, y), z) in before.iter().zip(&after).zip(&plain_after) {
                let moved: Vec<f32> = x.data.iter().zip(&y.data).map(|(u, v)| v - u).collect();
                if muon_shape(&x.name, &x.shape).is_some() {
                    // The first step's direction is the orthogonalized gradient, scaled to a
                    // root mean square of 0.2 when the gradient has full rank (Newton-Schulz
                    // leaves singular values between about 0.7 and 1.2) and less when not.
                    let rms = (moved.iter().map(|d| d * d).sum::<f32>() / moved.len() as f32)
                        .sqrt()
                        / lr as f32;
                    assert!(rms > 0.0 && rms < 0.25, "{}: rms {rms}", x.name);
                    assert!(y.data != z.data, "{}: the same as AdamW", x.name);
                    matrices += 1;
                } else {
                    // Everything else steps with AdamW.
                    assert_eq!(y.data, z.data, "{}", x.name);
                }
            }
            assert!(matrices >= 7, "section {index}: {matrices} hidden matrices");
            // A replay of the same steps from the same start gives the same weights and
            // moments, bit for bit.
            train(&mut a, 1.0);
            train(&mut b, 0.0);
            train(&mut b, 1.0);
            assert_eq!(a.export_params(), b.export_params(), "section {index}");
            assert_eq!(
                a.export_optimizer().tensors,
                b.export_optimizer().tensors,
                "section {index}"
            );
            assert!(!a.optimizer.is_flat());
            // The look-ahead moves a matrix along its orthogonalized first moment.
            let ahead = params::export_params(&a.lookahead(1, lr), &a.spec);
            let moments = a.export_optimizer().tensors;
            for (now, next) in a.export_params().iter().zip(&ahead) {
                let Some(shape) = muon_shape(&now.name, &now.shape) else {
                    continue;
                };
                let m = moments
                    .iter()
                    .find(|t| t.name == format!("{}.exp_avg", now.name))
                    .unwrap();
                let m = Tensor::<Inn, 1>::from_data(
                    TensorData::new(m.data.clone(), [m.data.len()]),
                    &device,
                );
                let dir: Vec<f32> = muon_step(m.reshape(shape)).into_data().to_vec().unwrap();
                for ((p, q), d) in now.data.iter().zip(&next.data).zip(&dir) {
                    assert!((p - lr as f32 * d - q).abs() < 1e-6, "{}", now.name);
                }
            }
        }
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
        // Re-embedding adds one table to every section after the head, and nothing else.
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
