//! One pre-norm transformer block: `h = x + attn(norm(x))`, `y = h + mlp(norm(h))`.
//!
//! The two halves are exposed separately because the last block of a section that sends
//! through the bottleneck replaces the second residual add (see [`super::bottleneck`]).

use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::attention::{Attention, KvCache};
use super::config::ModelConfig;
use super::init::Init;
use super::layers::{Mlp, RmsNorm};
use super::rope::Rope;

/// A decoder block with Llama parameter names.
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    /// Norm before attention.
    pub input_layernorm: RmsNorm<B>,
    /// Causal self-attention.
    pub self_attn: Attention<B>,
    /// Norm before the MLP.
    pub post_attention_layernorm: RmsNorm<B>,
    /// SwiGLU MLP.
    pub mlp: Mlp<B>,
}

impl<B: Backend> Block<B> {
    /// Block number `layer` of the whole model (global index, used for its parameter names).
    pub fn new(cfg: &ModelConfig, init: &Init, layer: usize, device: &B::Device) -> Self {
        let prefix = format!("model.layers.{layer}");
        // Output projections start smaller so the residual stream does not grow with depth.
        let out_std = cfg.init_std / (2.0 * cfg.n_layers as f64).sqrt();
        Self {
            input_layernorm: RmsNorm::new(cfg.d_model, cfg.norm_eps, device),
            self_attn: Attention::new(
                init,
                &format!("{prefix}.self_attn"),
                cfg.d_model,
                cfg.n_heads,
                cfg.n_kv_heads,
                cfg.init_std,
                out_std,
                device,
            ),
            post_attention_layernorm: RmsNorm::new(cfg.d_model, cfg.norm_eps, device),
            mlp: Mlp::new(
                init,
                &format!("{prefix}.mlp"),
                cfg.d_model,
                cfg.d_ff,
                cfg.init_std,
                out_std,
                device,
            ),
        }
    }

    /// The attention half with its residual: `x + attn(norm(x))`.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]` -> `[batch, seq, d_model]`
    pub fn attend(&self, x: Tensor<B, 3>, rope: &Rope<B>) -> Tensor<B, 3> {
        let a = self
            .self_attn
            .forward(self.input_layernorm.forward(x.clone()), rope);
        x + a
    }

    /// [`Self::attend`] for the positions after those in `cache` (see
    /// [`Attention::forward_cached`]).
    ///
    /// # Shapes
    /// - x: `[batch, new, d_model]` -> `[batch, new, d_model]`
    pub fn attend_cached(
        &self,
        x: Tensor<B, 3>,
        rope: &Rope<B>,
        cache: &mut KvCache<B>,
    ) -> Tensor<B, 3> {
        let a = self
            .self_attn
            .forward_cached(self.input_layernorm.forward(x.clone()), rope, cache);
        x + a
    }

    /// The MLP branch without its residual: `mlp(norm(h))`.
    ///
    /// # Shapes
    /// - h: `[batch, seq, d_model]` -> `[batch, seq, d_model]`
    pub fn mlp_branch(&self, h: Tensor<B, 3>) -> Tensor<B, 3> {
        self.mlp.forward(self.post_attention_layernorm.forward(h))
    }

    /// The whole block.
    ///
    /// # Shapes
    /// - x: `[batch, seq, d_model]` -> `[batch, seq, d_model]`
    pub fn forward(&self, x: Tensor<B, 3>, rope: &Rope<B>) -> Tensor<B, 3> {
        let h = self.attend(x, rope);
        h.clone() + self.mlp_branch(h)
    }
}
