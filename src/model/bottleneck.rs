//! The learned residual bottleneck at section boundaries ("uninterrupted residual flow").
//!
//! Sending side: the last block of a section projects its MLP output to `d_b` channels and
//! adds the first `d_b` channels of its residual stream, `z = W_enc mlp(norm(h)) + h[.., :d_b]`.
//! Only `z` (`seq x d_b` values per sample) crosses the network.
//!
//! Receiving side: the first block of the next section decodes `z` back to `d_model`
//! channels and adds `z` itself onto the first `d_b` of them,
//! `x = silu(W_dec z + b_dec) + [z, 0]` (the reference's decoder), or
//! `x = W_out silu(W_dec z + b_dec) + [z, 0]` with [`DecoderKind::Mlp`]. The `z` path is an
//! identity shortcut through every boundary, so gradients reach early sections even at
//! 64-128x compression. Gradients crossing back are `d_b` wide as well.

use burn::module::{Module, Param};
use burn::tensor::activation::silu;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use super::config::DecoderKind;
use super::init::Init;
use super::layers::Linear;

/// Sending half: `d_model -> d_b`, stored as `model.layers.{i}.bottleneck.encoder.weight`.
#[derive(Module, Debug)]
pub struct BottleneckEncoder<B: Backend> {
    /// Projection of the MLP output, `[d_b, d_model]`.
    pub encoder: Linear<B>,
}

impl<B: Backend> BottleneckEncoder<B> {
    /// Encoder attached to block `layer` (the last block of its section).
    pub fn new(
        init: &Init,
        layer: usize,
        d_model: usize,
        d_b: usize,
        std: f64,
        device: &B::Device,
    ) -> Self {
        Self {
            encoder: Linear::new(
                init,
                &format!("model.layers.{layer}.bottleneck.encoder.weight"),
                d_model,
                d_b,
                std,
                device,
            ),
        }
    }

    /// Combines the MLP branch and the residual stream of the last block into the boundary
    /// tensor.
    ///
    /// # Shapes
    /// - mlp_out, residual: `[batch, seq, d_model]` -> `[batch, seq, d_b]`
    pub fn forward(&self, mlp_out: Tensor<B, 3>, residual: Tensor<B, 3>) -> Tensor<B, 3> {
        let z = self.encoder.forward(mlp_out);
        let d_b = z.dims()[2];
        z + residual.narrow(2, 0, d_b)
    }
}

/// Receiving half: `d_b -> d_model`, stored as `model.layers.{i}.bottleneck.decoder.{weight,bias}`.
#[derive(Module, Debug)]
pub struct BottleneckDecoder<B: Backend> {
    /// Expansion `[d_model, d_b]`.
    pub decoder: Linear<B>,
    /// Bias of the expansion, `[d_model]`.
    pub bias: Param<Tensor<B, 1>>,
    /// Output layer `[d_model, d_model]` after the expansion's activation
    /// ([`DecoderKind::Mlp`]), stored as `model.layers.{i}.bottleneck.decoder_out.weight`.
    pub decoder_out: Option<Linear<B>>,
}

impl<B: Backend> BottleneckDecoder<B> {
    /// Decoder of kind `kind` attached to block `layer` (the first block of its section).
    pub fn new(
        init: &Init,
        layer: usize,
        (d_model, d_b): (usize, usize),
        kind: DecoderKind,
        std: f64,
        device: &B::Device,
    ) -> Self {
        Self {
            decoder: Linear::new(
                init,
                &format!("model.layers.{layer}.bottleneck.decoder.weight"),
                d_b,
                d_model,
                std,
                device,
            ),
            bias: Param::from_data(TensorData::new(vec![0.0f32; d_model], [d_model]), device),
            decoder_out: (kind == DecoderKind::Mlp).then(|| {
                Linear::new(
                    init,
                    &format!("model.layers.{layer}.bottleneck.decoder_out.weight"),
                    d_model,
                    d_model,
                    std,
                    device,
                )
            }),
        }
    }

    /// Width of the boundary tensor it expands (`d_b`).
    pub fn width(&self) -> usize {
        self.decoder.weight.dims()[1]
    }

    /// Expands a boundary tensor back to the residual width.
    ///
    /// # Shapes
    /// - z: `[batch, seq, d_b]` -> `[batch, seq, d_model]`
    pub fn forward(&self, z: Tensor<B, 3>) -> Tensor<B, 3> {
        let [batch, seq, d_b] = z.dims();
        let hidden = silu(self.decoder.forward(z.clone()) + self.bias.val().unsqueeze::<3>());
        let decoded = match &self.decoder_out {
            Some(out) => out.forward(hidden),
            None => hidden,
        };
        let d_model = decoded.dims()[2];
        let shortcut = if d_model > d_b {
            let zeros = Tensor::zeros([batch, seq, d_model - d_b], &z.device());
            Tensor::cat(vec![z, zeros], 2)
        } else {
            z
        };
        decoded + shortcut
    }
}
