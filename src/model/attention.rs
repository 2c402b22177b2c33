//! Causal multi-head self-attention with rotary embeddings and optional grouped-query
//! attention (fewer key/value heads than query heads).

use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::fused::{attention_to_all, causal_attention};
use super::init::Init;
use super::layers::Linear;
use super::rope::Rope;

/// Self-attention of one block; parameter names follow Llama (`self_attn.q_proj.weight`, ...).
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    /// Query projection `[n_heads * head_dim, d_model]`.
    pub q_proj: Linear<B>,
    /// Key projection `[n_kv_heads * head_dim, d_model]`.
    pub k_proj: Linear<B>,
    /// Value projection `[n_kv_heads * head_dim, d_model]`.
    pub v_proj: Linear<B>,
    /// Output projection `[d_model, n_heads * head_dim]`.
    pub o_proj: Linear<B>,
    /// Number of query heads.
    pub n_heads: usize,
    /// Number of key/value heads; each serves `n_heads / n_kv_heads` query heads.
    pub n_kv_heads: usize,
}

impl<B: Backend> Attention<B> {
    /// Attention for block `prefix` (e.g. `model.layers.3.self_attn`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        init: &Init,
        prefix: &str,
        d_model: usize,
        n_heads: usize,
        n_kv_heads: usize,
        std: f64,
        out_std: f64,
        device: &B::Device,
    ) -> Self {
        let head_dim = d_model / n_heads;
        let kv = n_kv_heads * head_dim;
        let lin = |name: &str, d_in, d_out, std| {
            Linear::new(
                init,
                &format!("{prefix}.{name}.weight"),
                d_in,
                d_out,
                std,
                device,
            )
        };
        Self {
            q_proj: lin("q_proj", d_model, d_model, std),
            k_proj: lin("k_proj", d_model, kv, std),
            v_proj: lin("v_proj", d_model, kv, std),
            o_proj: lin("o_proj", d_model, d_model, out_std),
            n_heads,
            n_kv_heads,
        }
    }

    /// # Shapes
    /// - x: `[batch, seq, d_model]` -> `[batch, seq, d_model]`
    pub fn forward(&self, x: Tensor<B, 3>, rope: &Rope<B>) -> Tensor<B, 3> {
        let dims = x.dims();
        let (q, k, v) = self.project(x, rope);
        self.merge_heads(self.core(q, k, v), dims)
    }

    /// Rotated queries and keys, and values, by head: `[batch, heads, seq, head_dim]`.
    fn project(
        &self,
        x: Tensor<B, 3>,
        rope: &Rope<B>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
        let [batch, seq, d_model] = x.dims();
        let head_dim = d_model / self.n_heads;
        let heads =
            |t: Tensor<B, 3>, n: usize| t.reshape([batch, seq, n, head_dim]).swap_dims(1, 2);
        let q = rope.apply(heads(self.q_proj.forward(x.clone()), self.n_heads));
        let k = rope.apply(heads(self.k_proj.forward(x.clone()), self.n_kv_heads));
        let v = heads(self.v_proj.forward(x), self.n_kv_heads);
        (q, k, v)
    }

    /// The heads' outputs back to `[batch, seq, d_model]` (`dims`), through the output
    /// projection.
    fn merge_heads(&self, out: Tensor<B, 4>, dims: [usize; 3]) -> Tensor<B, 3> {
        self.o_proj.forward(out.swap_dims(1, 2).reshape(dims))
    }

    /// [`Self::forward`] for the positions after those in `cache`, whose keys and values are
    /// added to it: the whole sequence on an empty cache, or one new position (a decoding
    /// step) on a filled one. `rope` holds the tables of the new positions
    /// ([`Rope::at`] the cache's length).
    ///
    /// # Shapes
    /// - x: `[batch, new, d_model]` -> `[batch, new, d_model]`
    ///
    /// # Panics
    /// Several new positions on a non-empty cache.
    pub fn forward_cached(
        &self,
        x: Tensor<B, 3>,
        rope: &Rope<B>,
        cache: &mut KvCache<B>,
    ) -> Tensor<B, 3> {
        let dims = x.dims();
        let seq = dims[1];
        let (q, k, v) = self.project(x, rope);
        let (k, v) = match (cache.k.take(), cache.v.take()) {
            (Some(pk), Some(pv)) => (Tensor::cat(vec![pk, k], 2), Tensor::cat(vec![pv, v], 2)),
            _ => (k, v),
        };
        cache.k = Some(k.clone());
        cache.v = Some(v.clone());
        let out = if k.dims()[2] == seq {
            self.core(q, k, v)
        } else {
            assert_eq!(seq, 1, "a filled cache takes one new position at a time");
            attention_to_all(q, k, v)
        };
        self.merge_heads(out, dims)
    }

    /// Causal scaled dot-product attention of rotated queries and keys over values, each
    /// key/value head serving `n_heads / n_kv_heads` query heads.
    ///
    /// # Shapes
    /// - q: `[batch, n_heads, seq, head_dim]`
    /// - k, v: `[batch, n_kv_heads, seq, head_dim]`
    /// - output: `[batch, n_heads, seq, head_dim]`
    pub fn core(&self, q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>) -> Tensor<B, 4> {
        causal_attention(q, k, v)
    }
}

/// Keys and values (rotated keys) of the positions one attention layer has seen, so a
/// decoding step computes only its new position's.
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    /// `[batch, n_kv_heads, len, head_dim]`, `None` before the first position.
    k: Option<Tensor<B, 4>>,
    /// Same shape as `k`.
    v: Option<Tensor<B, 4>>,
}

impl<B: Backend> Default for KvCache<B> {
    fn default() -> Self {
        Self { k: None, v: None }
    }
}

impl<B: Backend> KvCache<B> {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.k.as_ref().map_or(0, |k| k.dims()[2])
    }

    /// Whether no position is held yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
