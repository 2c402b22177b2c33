//! All sections of a model chained in one process through the same [`Section`] API and wire
//! codec the network uses. This is `iota train`, and the single-process baseline the network
//! is measured against.

use std::collections::HashMap;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};

use super::ModelError;
use super::config::ModelConfig;
use super::optimizer::OptimizerConfig;
use super::params;
use super::section::{Inner, Retained, Section, StepOutcome};
use super::section_model::{SectionInput, cross_entropy};
use crate::codec::{self, WireDtype};

/// What one training micro-batch did.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchReport {
    /// Mean loss of the micro-batch.
    pub loss: f32,
    /// Bytes that crossed section boundaries forwards (encoded activations).
    pub bytes_forward: usize,
    /// Bytes that crossed section boundaries backwards (encoded gradients).
    pub bytes_backward: usize,
}

/// Loss and gradients of the whole model computed in one graph.
#[derive(Debug, Clone)]
pub struct WholeGraph {
    /// Mean loss.
    pub loss: f32,
    /// Parameter gradients by global name.
    pub param_grads: HashMap<String, Vec<f32>>,
    /// Gradient at each section boundary, head side first.
    pub boundary_grads: Vec<Vec<f32>>,
}

/// What a section's backward starts from.
enum Kept<B: AutodiffBackend> {
    Graph(Box<Retained<B>>),
    Input(SectionInput<Inner<B>>),
}

/// Every section of one model, in order.
#[derive(Debug)]
pub struct Pipeline<B: AutodiffBackend> {
    sections: Vec<Section<B>>,
    wire: WireDtype,
    device: B::Device,
    /// Keep each section's forward graph for its backward instead of recomputing it.
    retain_graphs: bool,
}

/// Input ids and next-token targets of a batch, both `[batch, seq]`.
pub type TokenBatch<B> = (Tensor<B, 2, Int>, Tensor<B, 2, Int>);

/// Splits windows of `seq + 1` tokens into inputs and next-token targets (`[batch, seq]`).
///
/// # Errors
/// An empty batch or windows of different or too short lengths.
pub fn windows_to_tensors<B: burn::tensor::backend::Backend>(
    windows: &[&[u32]],
    device: &B::Device,
) -> Result<TokenBatch<B>, ModelError> {
    let len = windows.first().map(|w| w.len()).unwrap_or(0);
    if len < 2 || windows.iter().any(|w| w.len() != len) {
        return Err(ModelError::Shape(format!(
            "a batch needs windows of equal length >= 2 (got {} windows of lengths {:?})",
            windows.len(),
            windows.iter().map(|w| w.len()).take(4).collect::<Vec<_>>()
        )));
    }
    let seq = len - 1;
    let mut inputs = Vec::with_capacity(windows.len() * seq);
    let mut targets = Vec::with_capacity(windows.len() * seq);
    for w in windows {
        inputs.extend(w[..seq].iter().map(|&t| i64::from(t)));
        targets.extend(w[1..].iter().map(|&t| i64::from(t)));
    }
    let shape = [windows.len(), seq];
    Ok((
        Tensor::from_data(TensorData::new(inputs, shape), device),
        Tensor::from_data(TensorData::new(targets, shape), device),
    ))
}

/// The mean of `loss(chunk)` over `windows` taken `batch` at a time, each chunk weighed by
/// its windows (0 for no windows).
///
/// # Errors
/// What `loss` returns.
pub fn chunk_mean<E>(
    windows: &[&[u32]],
    batch: usize,
    mut loss: impl FnMut(&[&[u32]]) -> Result<f32, E>,
) -> Result<f32, E> {
    let (mut total, mut n) = (0.0f64, 0usize);
    for chunk in windows.chunks(batch.max(1)) {
        total += f64::from(loss(chunk)?) * chunk.len() as f64;
        n += chunk.len();
    }
    Ok((total / n.max(1) as f64) as f32)
}

/// Sends a boundary tensor through the wire codec as `wire` and decodes it on `device`, as the
/// network does between two sections. Returns the decoded tensor and the encoded size in bytes.
///
/// # Errors
/// A tensor the codec refuses (NaN or infinite values).
pub fn through_wire<B: Backend>(
    t: Tensor<B, 3>,
    wire: WireDtype,
    device: &B::Device,
) -> Result<(Tensor<B, 3>, usize), ModelError> {
    let shape = t.dims();
    let data = super::host_f32(t.into_data())?;
    let bytes = codec::encode(&shape, &data, wire)?;
    let decoded = codec::decode_expecting(&bytes, &shape)?;
    let tensor = Tensor::from_data(TensorData::new(decoded.data, shape), device);
    Ok((tensor, bytes.len()))
}

impl<B: AutodiffBackend> Pipeline<B> {
    /// All sections of `config`, initialised from `seed`; boundary tensors are sent as `wire`.
    ///
    /// # Errors
    /// An invalid config.
    pub fn new(
        config: &ModelConfig,
        seed: u64,
        optimizer: OptimizerConfig,
        wire: WireDtype,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        // One process steps every section with fresh gradients: no growth of beta1.
        let optimizer = optimizer.synchronous();
        let sections = (0..config.n_sections())
            .map(|i| Section::new(config, i, seed, optimizer, device))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            sections,
            wire,
            device: device.clone(),
            retain_graphs: true,
        })
    }

    /// Whether a section's backward uses the graph its forward kept (the default: no
    /// recomputation, every section's activations held until the backward, as one graph
    /// would) or recomputes its forward from the boundary input (one section's activations
    /// at a time). Both compute the same values.
    pub fn set_retain_graphs(&mut self, retain: bool) {
        self.retain_graphs = retain;
    }

    /// The sections, head first.
    pub fn sections(&self) -> &[Section<B>] {
        &self.sections
    }

    /// The sections, mutably.
    pub fn sections_mut(&mut self) -> &mut [Section<B>] {
        &mut self.sections
    }

    /// The device.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// The token ids section `i` reads beside its activations: `ids` when it re-embeds them.
    pub(super) fn ids_for<T: Backend>(
        &self,
        i: usize,
        ids: &Tensor<T, 2, Int>,
    ) -> Option<Tensor<T, 2, Int>> {
        self.sections[i].reembeds().then(|| ids.clone())
    }

    /// Sends a boundary tensor through the wire codec, as the network would.
    pub(super) fn cross(
        &self,
        t: Tensor<Inner<B>, 3>,
    ) -> Result<(Tensor<Inner<B>, 3>, usize), ModelError> {
        through_wire(t, self.wire, &self.device)
    }

    /// Forward and backward of one micro-batch of token windows (`seq + 1` tokens each)
    /// through every section; gradients accumulate until [`Self::step`].
    ///
    /// # Errors
    /// Bad windows, a non-finite loss, or a boundary tensor the codec refuses (NaN/inf).
    pub fn train_batch(&mut self, windows: &[&[u32]]) -> Result<BatchReport, ModelError> {
        Ok(self.run_batch(windows, false)?.0)
    }

    /// [`Self::train_batch`] that also returns, for each boundary (head side first), the
    /// decoded gradient that crossed it, flattened.
    ///
    /// # Errors
    /// As [`Self::train_batch`].
    pub fn train_batch_recording(
        &mut self,
        windows: &[&[u32]],
    ) -> Result<(BatchReport, Vec<Vec<f32>>), ModelError> {
        self.run_batch(windows, true)
    }

    fn run_batch(
        &mut self,
        windows: &[&[u32]],
        record: bool,
    ) -> Result<(BatchReport, Vec<Vec<f32>>), ModelError> {
        let (inputs, targets) = windows_to_tensors::<Inner<B>>(windows, &self.device)?;
        let n = self.sections.len();
        let mut cached = Vec::with_capacity(n);
        let mut x = SectionInput::Tokens(inputs.clone());
        let (mut bytes_forward, mut bytes_backward) = (0, 0);
        for i in 0..n - 1 {
            let out = if self.retain_graphs {
                let (out, graph) = self.sections[i].forward_retained(x)?;
                cached.push(Kept::Graph(Box::new(graph)));
                out
            } else {
                cached.push(Kept::Input(x.clone()));
                self.sections[i].forward(x)?
            };
            let (out, bytes) = self.cross(out)?;
            bytes_forward += bytes;
            if self.sections[i + 1].reembeds() {
                // The network sends the ids as the token objects' codec does.
                let width = codec::token_ids::width(self.sections[0].config().vocab_size);
                bytes_forward += width * inputs.shape().num_elements();
            }
            x = SectionInput::boundary(out, self.ids_for(i + 1, &inputs));
        }
        let tail = self.sections[n - 1].train_tail(x, targets)?;
        let mut grad = tail.input_grad;
        let mut recorded = Vec::new();
        for i in (0..n - 1).rev() {
            let (g, bytes) = self.cross(grad)?;
            bytes_backward += bytes;
            if record {
                recorded.push(super::host_f32(g.to_data())?);
            }
            let kept = cached
                .pop()
                .ok_or_else(|| ModelError::Shape("lost a cached input".into()))?;
            let input_grad = match kept {
                Kept::Graph(graph) => self.sections[i].backward_retained(*graph, g)?,
                Kept::Input(input) => self.sections[i].backward(input, g)?,
            };
            match input_grad {
                Some(g) => grad = g,
                None => break,
            }
        }
        recorded.reverse();
        let report = BatchReport {
            loss: tail.loss,
            bytes_forward,
            bytes_backward,
        };
        Ok((report, recorded))
    }

    /// Mean loss of a micro-batch without gradients (activations still cross the codec).
    ///
    /// # Errors
    /// Bad windows, or a boundary tensor the codec refuses.
    pub fn eval_loss(&mut self, windows: &[&[u32]]) -> Result<f32, ModelError> {
        self.eval_loss_mapping(windows, |_, out| Ok(out))
    }

    /// [`Self::eval_loss`] with each boundary's output (after the codec) passed through
    /// `map(boundary, output)` before the next section reads it (ablations).
    ///
    /// # Errors
    /// As [`Self::eval_loss`], or what `map` returns.
    pub(super) fn eval_loss_mapping(
        &mut self,
        windows: &[&[u32]],
        mut map: impl FnMut(usize, Tensor<Inner<B>, 3>) -> Result<Tensor<Inner<B>, 3>, ModelError>,
    ) -> Result<f32, ModelError> {
        let (inputs, targets) = windows_to_tensors::<Inner<B>>(windows, &self.device)?;
        let n = self.sections.len();
        let mut x = SectionInput::Tokens(inputs.clone());
        for i in 0..n - 1 {
            let out = self.sections[i].forward(x)?;
            let out = map(i, self.cross(out)?.0)?;
            x = SectionInput::boundary(out, self.ids_for(i + 1, &inputs));
        }
        self.sections[n - 1].eval_loss(x, targets)
    }

    /// Mean loss over `windows` evaluated `batch` at a time (each window weighs the same).
    ///
    /// # Errors
    /// As [`Self::eval_loss`].
    pub fn eval_mean(&mut self, windows: &[&[u32]], batch: usize) -> Result<f32, ModelError> {
        chunk_mean(windows, batch, |chunk| self.eval_loss(chunk))
    }

    /// [`Self::eval_mean`] of the plain model: the warm-up's bridge ([`Self::set_bridge`]) is
    /// off for the evaluation and back on after it, as the network evaluates.
    ///
    /// # Errors
    /// As [`Self::eval_mean`].
    pub fn eval_mean_plain(&mut self, windows: &[&[u32]], batch: usize) -> Result<f32, ModelError> {
        let bridge = self.sections.first().map_or(0.0, Section::bridge);
        self.set_bridge(0.0);
        let loss = self.eval_mean(windows, batch);
        self.set_bridge(bridge);
        loss
    }

    /// Sets the bridge of every section (the whole residual stream sent beside the
    /// bottleneck with this weight, [`Section::set_bridge`]); 0 turns it off.
    pub fn set_bridge(&mut self, bridge: f64) {
        for s in &mut self.sections {
            s.set_bridge(bridge);
        }
    }

    /// One optimizer step in every section at learning rate `lr`.
    pub fn step(&mut self, lr: f64) -> Vec<StepOutcome> {
        self.sections.iter_mut().map(|s| s.step(lr)).collect()
    }

    /// Forward and backward of one micro-batch through the whole model in one autodiff
    /// graph (no boundaries, codec or recomputation), accumulating every section's parameter
    /// gradients for [`Self::step`]: an ordinary training step, the yardstick that the chain
    /// and other frameworks are timed against (`iota bench step`). Returns the loss.
    ///
    /// # Errors
    /// Bad windows.
    pub fn train_whole(&mut self, windows: &[&[u32]]) -> Result<f32, ModelError> {
        let (inputs, targets) = windows_to_tensors::<B>(windows, &self.device)?;
        let n = self.sections.len();
        let mut x = SectionInput::Tokens(inputs.clone());
        for (i, s) in self.sections[..n - 1].iter().enumerate() {
            x = SectionInput::boundary(s.module().forward(x), self.ids_for(i + 1, &inputs));
        }
        let loss = cross_entropy(self.sections[n - 1].module().logits(x), targets);
        let value = super::section::scalar(loss.clone()) as f32;
        let grads = loss.backward();
        for s in &mut self.sections {
            let weights = s.module().clone();
            s.accumulate(&weights, &grads);
        }
        Ok(value)
    }

    /// The same model run as one autodiff graph, without section boundaries, codecs or
    /// recomputation: the reference the chain must match. Returns the loss, the parameter
    /// gradients by name, and the gradient at each boundary (head side first).
    ///
    /// # Errors
    /// Bad windows.
    pub fn whole_graph(&self, windows: &[&[u32]]) -> Result<WholeGraph, ModelError> {
        let (inputs, targets) = windows_to_tensors::<B>(windows, &self.device)?;
        let n = self.sections.len();
        let mut x = SectionInput::Tokens(inputs.clone());
        let mut probes = Vec::new();
        for (i, s) in self.sections[..n - 1].iter().enumerate() {
            let out = s.module().forward(x);
            // Adding a zero leaf keeps the graph whole while exposing d loss / d boundary.
            let probe = Tensor::<B, 3>::zeros(out.dims(), &self.device).require_grad();
            probes.push(probe.clone());
            x = SectionInput::boundary(out + probe, self.ids_for(i + 1, &inputs));
        }
        let loss = cross_entropy(self.sections[n - 1].module().logits(x), targets);
        let value = super::section::scalar(loss.clone()) as f32;
        let grads = loss.backward();
        let mut param_grads = HashMap::new();
        for s in &self.sections {
            for (name, g) in params::collect_grads(s.module(), s.spec(), &grads) {
                param_grads.insert(name, super::host_f32(g.into_data())?);
            }
        }
        let boundary_grads = probes
            .iter()
            .map(|p| match p.grad(&grads) {
                Some(g) => super::host_f32(g.into_data()),
                None => Ok(Vec::new()),
            })
            .collect::<Result<_, _>>()?;
        Ok(WholeGraph {
            loss: value,
            param_grads,
            boundary_grads,
        })
    }
}
