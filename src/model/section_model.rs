//! The burn module of one pipeline section: an optional token embedding (head), an optional
//! re-embedding of the token ids (later sections, [`ModelConfig::reembed`]), a contiguous run
//! of blocks, optional bottleneck halves at its edges, and an optional final norm and LM head
//! (tail). The whole model is just its sections applied in order.

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

use super::attention::KvCache;
use super::block::Block;
use super::bottleneck::{BottleneckDecoder, BottleneckEncoder};
use super::config::{ModelConfig, SectionSpec};
use super::init::Init;
use super::layers::{Embedding, Linear, RmsNorm};
use super::rope::Rope;

/// What flows into a section.
#[derive(Debug, Clone)]
pub enum SectionInput<B: Backend> {
    /// Token ids `[batch, seq]` (head section).
    Tokens(Tensor<B, 2, Int>),
    /// Boundary activations `[batch, seq, width]` from the previous section.
    Hidden(Tensor<B, 3>),
    /// Boundary activations with the sample's input token ids `[batch, seq]`, for a section
    /// that re-embeds them.
    HiddenTokens(Tensor<B, 3>, Tensor<B, 2, Int>),
}

impl<B: Backend> SectionInput<B> {
    /// Boundary activations `hidden`, with the sample's token ids when the receiving section
    /// re-embeds them (`tokens` given) and without otherwise.
    pub fn boundary(hidden: Tensor<B, 3>, tokens: Option<Tensor<B, 2, Int>>) -> Self {
        match tokens {
            Some(ids) => Self::HiddenTokens(hidden, ids),
            None => Self::Hidden(hidden),
        }
    }
}

/// The bridge's weight ([`SectionModel::bridge`]) at `position` of a warm-up of `warmup`
/// positions: a linear ramp from 1 at position 0 down to 0 at `warmup`, then 0. `iota train`
/// counts positions in optimizer steps; the network in samples, like its learning-rate
/// schedule (its samples, or its synchronous steps).
pub fn bridge_weight(position: u64, warmup: u64) -> f64 {
    if position >= warmup {
        0.0
    } else {
        1.0 - position as f64 / warmup as f64
    }
}

/// Parameters and forward pass of one section.
#[derive(Module, Debug)]
pub struct SectionModel<B: Backend> {
    /// Token embedding (head only).
    pub embed_tokens: Option<Embedding<B>>,
    /// Decoder of the incoming bottleneck (non-head sections with a bottleneck).
    pub bottleneck_in: Option<BottleneckDecoder<B>>,
    /// This section's own embedding of the input token ids (non-head sections of a model
    /// with [`ModelConfig::reembed`]).
    pub reembed: Option<Embedding<B>>,
    /// Multiplier of the re-embedded ids.
    pub reembed_scale: f64,
    /// The section's blocks, in order.
    pub layers: Vec<Block<B>>,
    /// Encoder of the outgoing bottleneck (non-tail sections with a bottleneck).
    pub bottleneck_out: Option<BottleneckEncoder<B>>,
    /// Weight of the bridge, the whole residual stream sent beside the bottleneck during a
    /// warm-up (`train.bottleneck_warmup`): a sending section emits `[z, bridge · y]`, where
    /// `y` is what its last block would send without a bottleneck, and a receiving section given
    /// that wider tensor adds its second part onto the decoded `z`. 0 (the default): the
    /// bottleneck alone.
    pub bridge: f64,
    /// Final norm (tail only).
    pub norm: Option<RmsNorm<B>>,
    /// LM head `[vocab, d_model]` (tail only).
    pub lm_head: Option<Linear<B>>,
    /// Head dimension, for the rotary tables.
    pub head_dim: usize,
    /// Rotary base.
    pub rope_theta: f64,
}

impl<B: Backend> SectionModel<B> {
    /// Builds section `spec` of `cfg` with weights drawn from `init`.
    pub fn new(cfg: &ModelConfig, spec: &SectionSpec, init: &Init, device: &B::Device) -> Self {
        let (d, w, std) = (cfg.d_model, cfg.boundary_width(), cfg.init_std);
        let first = spec.blocks.start;
        let last = spec.blocks.end - 1;
        Self {
            embed_tokens: spec.is_head.then(|| {
                Embedding::new(
                    init,
                    "model.embed_tokens.weight",
                    cfg.vocab_size,
                    d,
                    std,
                    device,
                )
            }),
            bottleneck_in: spec.bottleneck_in.then(|| {
                BottleneckDecoder::new(init, first, (d, w), cfg.bottleneck_decoder, std, device)
            }),
            reembed: spec.reembed.then(|| {
                Embedding::new(
                    init,
                    &format!("model.layers.{first}.reembed.weight"),
                    cfg.vocab_size,
                    d,
                    std,
                    device,
                )
            }),
            reembed_scale: cfg.reembed_scale(),
            layers: spec
                .blocks
                .clone()
                .map(|layer| Block::new(cfg, init, layer, device))
                .collect(),
            bottleneck_out: spec
                .bottleneck_out
                .then(|| BottleneckEncoder::new(init, last, d, w, std, device)),
            bridge: 0.0,
            norm: spec.is_tail.then(|| RmsNorm::new(d, cfg.norm_eps, device)),
            lm_head: spec
                .is_tail
                .then(|| Linear::new(init, "lm_head.weight", d, cfg.vocab_size, std, device)),
            head_dim: cfg.head_dim(),
            rope_theta: cfg.rope_theta,
        }
    }

    /// Runs the section up to its output: the boundary tensor for non-tail sections
    /// (`[batch, seq, width]`), or the final normalised hidden state for the tail
    /// (`[batch, seq, d_model]`).
    pub fn forward(&self, input: SectionInput<B>) -> Tensor<B, 3> {
        let x = self.embed(input);
        let [_, seq, _] = x.dims();
        let rope = Rope::new(seq, self.head_dim, self.rope_theta, &x.device());
        self.blocks(x, |_, block, x| block.attend(x, &rope))
    }

    /// An empty cache for [`Self::forward_cached`]: one [`KvCache`] per block.
    pub fn new_cache(&self) -> SectionCache<B> {
        SectionCache {
            layers: vec![KvCache::default(); self.layers.len()],
        }
    }

    /// [`Self::forward`] for the positions after those in `cache`, whose keys and values it
    /// adds: the same values as the whole sequence through [`Self::forward`], at the new
    /// positions. Everything besides attention works position by position.
    ///
    /// # Panics
    /// As [`Self::forward`], and several new positions on a non-empty cache.
    pub fn forward_cached(
        &self,
        input: SectionInput<B>,
        cache: &mut SectionCache<B>,
    ) -> Tensor<B, 3> {
        let x = self.embed(input);
        let [_, seq, _] = x.dims();
        let rope = Rope::at(
            cache.len(),
            seq,
            self.head_dim,
            self.rope_theta,
            &x.device(),
        );
        self.blocks(x, |i, block, x| {
            block.attend_cached(x, &rope, &mut cache.layers[i])
        })
    }

    /// The section's input as the first block reads it: embedded token ids, or decoded
    /// boundary activations plus the re-embedded ids.
    fn embed(&self, input: SectionInput<B>) -> Tensor<B, 3> {
        let decode = |z: Tensor<B, 3>| match &self.bottleneck_in {
            Some(decoder) => {
                let [_, _, width] = z.dims();
                let d_b = decoder.width();
                if width > d_b {
                    // A bridged input: the bottleneck tensor, then the whole residual stream.
                    let bridged = z.clone().narrow(2, d_b, width - d_b);
                    decoder.forward(z.narrow(2, 0, d_b)) + bridged
                } else {
                    decoder.forward(z)
                }
            }
            None => z,
        };
        match input {
            SectionInput::Tokens(tokens) => match &self.embed_tokens {
                Some(embed) => embed.forward(tokens),
                None => panic!("token ids given to a section without an embedding"),
            },
            SectionInput::Hidden(z) => decode(z),
            SectionInput::HiddenTokens(z, tokens) => match &self.reembed {
                Some(table) => decode(z) + table.forward(tokens) * self.reembed_scale,
                None => decode(z),
            },
        }
    }

    /// The blocks from the embedded input to the output, each block's attention half done
    /// by `attend(index, block, x)`; the last block sends through the bottleneck, the tail
    /// normalises.
    fn blocks(
        &self,
        mut x: Tensor<B, 3>,
        mut attend: impl FnMut(usize, &Block<B>, Tensor<B, 3>) -> Tensor<B, 3>,
    ) -> Tensor<B, 3> {
        let n = self.layers.len();
        for (i, block) in self.layers.iter().enumerate() {
            let h = attend(i, block, x);
            x = match (&self.bottleneck_out, i + 1 == n) {
                (Some(encoder), true) => {
                    let m = block.mlp_branch(h.clone());
                    if self.bridge > 0.0 {
                        let z = encoder.forward(m.clone(), h.clone());
                        Tensor::cat(vec![z, (h + m) * self.bridge], 2)
                    } else {
                        encoder.forward(m, h)
                    }
                }
                _ => h.clone() + block.mlp_branch(h),
            };
        }
        match &self.norm {
            Some(norm) => norm.forward(x),
            None => x,
        }
    }

    /// Logits of the tail section.
    ///
    /// # Shapes
    /// - returns `[batch, seq, vocab]`
    pub fn logits(&self, input: SectionInput<B>) -> Tensor<B, 3> {
        self.lm_head_of(self.forward(input))
    }

    /// [`Self::logits`] of the positions after those in `cache` ([`Self::forward_cached`]).
    ///
    /// # Shapes
    /// - returns `[batch, new, vocab]`
    pub fn logits_cached(
        &self,
        input: SectionInput<B>,
        cache: &mut SectionCache<B>,
    ) -> Tensor<B, 3> {
        self.lm_head_of(self.forward_cached(input, cache))
    }

    fn lm_head_of(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => panic!("logits asked of a section without an LM head"),
        }
    }

    /// Mean next-token cross-entropy (nats) of the tail section against `targets`
    /// (`[batch, seq]`), as a one-element tensor.
    pub fn loss(&self, input: SectionInput<B>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        cross_entropy(self.logits(input), targets)
    }
}

/// Keys and values of every block of one section for the positions it has run
/// ([`SectionModel::forward_cached`]).
#[derive(Debug, Clone)]
pub struct SectionCache<B: Backend> {
    layers: Vec<KvCache<B>>,
}

impl<B: Backend> SectionCache<B> {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, KvCache::len)
    }

    /// Whether no position is held yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Mean cross-entropy of `logits` (`[batch, seq, vocab]`) against `targets` (`[batch, seq]`).
pub fn cross_entropy<B: Backend>(logits: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
    let [batch, seq, vocab] = logits.dims();
    let logp = exact_log_softmax(logits.reshape([batch * seq, vocab]));
    let picked = logp.gather(1, targets.reshape([batch * seq, 1]));
    picked.mean().neg()
}

/// `log_softmax` over the last dimension of `[rows, classes]`, with a backward that takes no
/// reciprocal. burn's `log` backward multiplies by `recip(x)`, which burn-ndarray 0.21
/// computes with the CPU's approximate reciprocal instruction (relative error up to 3.7e-4) on
/// the elements its SIMD loop reaches and exactly on the rest; which elements those are depends
/// on the buffer's alignment, so the same step gave different gradients from run to run. Here
/// `log(s)` is taken on a detached `s = sum(exp(x - max))`, and `(s - s') * (1 / s')` (`s'`
/// the detached `s`, `1 / s'` an exact division outside the graph) adds 0 to the value and
/// `softmax(x)` to the gradient.
fn exact_log_softmax<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 2> {
    let z = x.clone() - x.max_dim(1).detach();
    let s = z.clone().exp().sum_dim(1);
    let fixed = s.clone().detach();
    let inv = fixed.ones_like() / fixed.clone();
    let lse = fixed.clone().log() + (s - fixed) * inv;
    z - lse
}

#[cfg(test)]
mod tests {
    use burn::tensor::activation::log_softmax;
    use burn::tensor::{Tensor, TensorData};

    use super::exact_log_softmax;
    use crate::model::TestAutodiff as B;

    fn logits() -> Tensor<B, 2> {
        let values: Vec<f32> = (0..37 * 53)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0)
            .collect();
        Tensor::from_data(TensorData::new(values, [37, 53]), &Default::default()).require_grad()
    }

    fn weights() -> Tensor<B, 2> {
        let values: Vec<f32> = (0..37 * 53)
            .map(|i| ((i * 31) % 17) as f32 / 17.0)
            .collect();
        Tensor::from_data(TensorData::new(values, [37, 53]), &Default::default())
    }

    fn to_vec<const D: usize>(t: Tensor<crate::model::TestBackend, D>) -> Vec<f32> {
        t.into_data().to_vec().unwrap()
    }

    #[test]
    fn exact_log_softmax_has_burns_value_the_analytic_gradient_and_repeats_bit_for_bit() {
        let x = logits();
        let ours = exact_log_softmax(x.clone());
        let burns = log_softmax(x.clone(), 1);
        let (a, b) = (to_vec(ours.clone().inner()), to_vec(burns.inner()));
        assert!(
            a.iter().zip(&b).all(|(a, b)| (a - b).abs() <= 1e-6),
            "values differ"
        );
        // d/dx sum(w * logp) = w - softmax(x) * sum_row(w), from the definitions in f64.
        let grads = (ours * weights()).sum().backward();
        let g = to_vec(x.grad(&grads).unwrap());
        let (xs, ws) = (to_vec(x.inner()), to_vec(weights().inner()));
        for r in 0..37 {
            let row = &xs[r * 53..(r + 1) * 53];
            let max = row.iter().fold(f64::MIN, |m, &v| m.max(f64::from(v)));
            let z: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
            let wsum: f64 = ws[r * 53..(r + 1) * 53].iter().map(|&v| f64::from(v)).sum();
            for c in 0..53 {
                let p = (f64::from(row[c]) - max).exp() / z;
                let want = f64::from(ws[r * 53 + c]) - p * wsum;
                let got = f64::from(g[r * 53 + c]);
                assert!(
                    (got - want).abs() <= 2e-6,
                    "row {r} col {c}: {got} vs {want}"
                );
            }
        }
        // The same graph again, on freshly allocated tensors, gives the same bits (burn's
        // `log_softmax` did not: its backward used the approximate `recip`).
        for _ in 0..8 {
            let x = logits();
            let grads = (exact_log_softmax(x.clone()) * weights()).sum().backward();
            assert_eq!(to_vec(x.grad(&grads).unwrap()), g);
        }
    }
}
