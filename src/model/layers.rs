//! Leaf layers of the decoder: RMSNorm, a bias-free linear layer in the Llama weight layout,
//! the token embedding and the SwiGLU MLP.
//!
//! Weights are created from a seeded generator keyed by the parameter's global name (see
//! [`super::init`]), so a model split into sections has exactly the weights of the same model
//! in one piece, and every party that knows the seed builds the same section.

use super::fused::{linear, swiglu};
use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use super::init::Init;

/// Root-mean-square normalisation over the last dimension:
/// `y = x / sqrt(mean(x^2) + eps) * weight`.
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    /// Learned per-channel gain, initialised to ones. Shape `[d]`.
    pub weight: Param<Tensor<B, 1>>,
    /// Added to the mean square for numerical stability.
    pub eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    /// A norm of width `d` with unit gain.
    pub fn new(d: usize, eps: f64, device: &B::Device) -> Self {
        let ones = TensorData::new(vec![1.0f32; d], [d]);
        Self {
            weight: Param::from_data(ones, device),
            eps,
        }
    }

    /// # Shapes
    /// - x: `[batch, seq, d]` -> `[batch, seq, d]`
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        // The reciprocal is taken on the small `[batch, seq, 1]` tensor, so the wide tensor
        // sees only multiplications (whose backward is cheaper than a division's). It is a
        // division of ones, not `recip()`: burn-ndarray 0.21 computes `recip` with the CPU's
        // approximate reciprocal instruction (relative error up to 3.7e-4) on the elements its
        // SIMD loop reaches and exactly on the rest, which depends on the buffer's alignment.
        let rms = (x.clone().square().mean_dim(2) + self.eps).sqrt();
        let inv_rms = rms.ones_like() / rms;
        x * inv_rms * self.weight.val().unsqueeze::<3>()
    }
}

/// A bias-free linear map `y = x W^T`, with `W` stored as `[out, in]` like PyTorch/Llama
/// checkpoints, so exported tensors need no transpose.
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    /// Weight matrix, shape `[d_out, d_in]`.
    pub weight: Param<Tensor<B, 2>>,
}

impl<B: Backend> Linear<B> {
    /// A linear layer whose weights are drawn from `init` under `name`.
    pub fn new(
        init: &Init,
        name: &str,
        d_in: usize,
        d_out: usize,
        std: f64,
        device: &B::Device,
    ) -> Self {
        let values = init.normal(name, d_in * d_out, std);
        Self {
            weight: Param::from_data(TensorData::new(values, [d_out, d_in]), device),
        }
    }

    /// # Shapes
    /// - x: `[batch, seq, d_in]` -> `[batch, seq, d_out]`
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        linear(x, self.weight.val())
    }
}

/// Token embedding table, shape `[vocab, d_model]`.
#[derive(Module, Debug)]
pub struct Embedding<B: Backend> {
    /// One row per token id.
    pub weight: Param<Tensor<B, 2>>,
}

impl<B: Backend> Embedding<B> {
    /// An embedding table drawn from `init` under `name`.
    pub fn new(
        init: &Init,
        name: &str,
        vocab: usize,
        d: usize,
        std: f64,
        device: &B::Device,
    ) -> Self {
        let values = init.normal(name, vocab * d, std);
        Self {
            weight: Param::from_data(TensorData::new(values, [vocab, d]), device),
        }
    }

    /// # Shapes
    /// - tokens: `[batch, seq]` -> `[batch, seq, d_model]`
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [batch, seq] = tokens.dims();
        let flat = tokens.reshape([batch * seq]);
        let rows = self.weight.val().select(0, flat);
        let d = rows.dims()[1];
        rows.reshape([batch, seq, d])
    }
}

/// SwiGLU feed-forward block: `down(silu(gate(x)) * up(x))`.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    /// Gate projection `[d_ff, d_model]`.
    pub gate_proj: Linear<B>,
    /// Up projection `[d_ff, d_model]`.
    pub up_proj: Linear<B>,
    /// Down projection `[d_model, d_ff]`.
    pub down_proj: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    /// An MLP for block `prefix` (e.g. `model.layers.3.mlp`); `out_std` scales the down
    /// projection (smaller for deep models so the residual stream does not grow with depth).
    pub fn new(
        init: &Init,
        prefix: &str,
        d_model: usize,
        d_ff: usize,
        std: f64,
        out_std: f64,
        device: &B::Device,
    ) -> Self {
        Self {
            gate_proj: Linear::new(
                init,
                &format!("{prefix}.gate_proj.weight"),
                d_model,
                d_ff,
                std,
                device,
            ),
            up_proj: Linear::new(
                init,
                &format!("{prefix}.up_proj.weight"),
                d_model,
                d_ff,
                std,
                device,
            ),
            down_proj: Linear::new(
                init,
                &format!("{prefix}.down_proj.weight"),
                d_ff,
                d_model,
                out_std,
                device,
            ),
        }
    }

    /// # Shapes
    /// - x: `[batch, seq, d_model]` -> `[batch, seq, d_model]`
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let gated = swiglu(self.gate_proj.forward(x.clone()), self.up_proj.forward(x));
        self.down_proj.forward(gated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TestBackend;

    #[test]
    fn rms_norm_normalises_rows() {
        let device = Default::default();
        let norm = RmsNorm::<TestBackend>::new(2, 1e-6, &device);
        let x = Tensor::<TestBackend, 3>::from_data(
            TensorData::new(vec![3.0f32, 4.0], [1, 1, 2]),
            &device,
        );
        let y: Vec<f32> = norm.forward(x).into_data().to_vec().unwrap();
        // rms = sqrt((9 + 16) / 2) = 3.5355
        assert!((y[0] - 3.0 / 3.535_534).abs() < 1e-5);
        assert!((y[1] - 4.0 / 3.535_534).abs() < 1e-5);
    }

    #[test]
    fn linear_uses_out_in_layout() {
        let device = Default::default();
        let mut lin = Linear::<TestBackend>::new(&Init::new(0), "w", 2, 3, 0.02, &device);
        lin.weight = Param::from_data(
            TensorData::new(vec![1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], [3, 2]),
            &device,
        );
        let x = Tensor::<TestBackend, 3>::from_data(
            TensorData::new(vec![2.0f32, 5.0], [1, 1, 2]),
            &device,
        );
        let y: Vec<f32> = lin.forward(x).into_data().to_vec().unwrap();
        assert_eq!(y, vec![2.0, 5.0, 7.0]);
    }
}
