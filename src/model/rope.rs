//! Rotary position embedding (RoPE), applied element-wise in the "rotate half" layout used by
//! Llama checkpoints: `x * cos + rotate_half(x) * sin`.
//!
//! burn-nn's `RotaryEncoding` does this with a reshape and a small matmul; the element-wise
//! form here is cheaper and matches the checkpoint convention directly.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

/// Cosine and sine tables for one sequence length, shape `[seq, head_dim]` each. The sine
/// table carries the sign of `rotate_half` (negative on the first half of each row), so a
/// rotation is `x * cos + swap_halves(x) * sin`.
#[derive(Debug, Clone)]
pub struct Rope<B: Backend> {
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
}

impl<B: Backend> Rope<B> {
    /// Tables for positions `0..seq` and heads of width `head_dim` (even).
    pub fn new(seq: usize, head_dim: usize, theta: f64, device: &B::Device) -> Self {
        Self::at(0, seq, head_dim, theta, device)
    }

    /// Tables for positions `start..start + seq` (new positions after `start` cached ones).
    pub fn at(start: usize, seq: usize, head_dim: usize, theta: f64, device: &B::Device) -> Self {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(seq * head_dim);
        let mut sin = Vec::with_capacity(seq * head_dim);
        for pos in start..start + seq {
            // The two halves of a row repeat the same frequencies; rotate_half negates the
            // second half of x as it moves it to the front, so the sine's first half is negated.
            for sign in [-1.0, 1.0] {
                for i in 0..half {
                    let inv_freq = theta.powf(-2.0 * i as f64 / head_dim as f64);
                    let angle = pos as f64 * inv_freq;
                    cos.push(angle.cos() as f32);
                    sin.push((sign * angle.sin()) as f32);
                }
            }
        }
        Self {
            cos: Tensor::from_data(TensorData::new(cos, [seq, head_dim]), device),
            sin: Tensor::from_data(TensorData::new(sin, [seq, head_dim]), device),
        }
    }

    /// Rotates queries or keys.
    ///
    /// # Shapes
    /// - x: `[batch, heads, seq, head_dim]` -> same
    pub fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let [batch, heads, seq, head_dim] = x.dims();
        let half = head_dim / 2;
        // Swapping the halves is a flip of a length-2 axis: one pass, and its backward is the
        // same flip (no narrow/cat/negation and their zero-filled gradients).
        let swapped = x
            .clone()
            .reshape([batch, heads, seq, 2, half])
            .flip([3])
            .reshape([batch, heads, seq, head_dim]);
        x * self.cos.clone().unsqueeze::<4>() + swapped * self.sin.clone().unsqueeze::<4>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TestBackend;

    #[test]
    fn rotation_preserves_norm_and_position_zero_is_identity() {
        let device = Default::default();
        let rope = Rope::<TestBackend>::new(3, 4, 10_000.0, &device);
        let values: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 2.0).collect();
        let x = Tensor::<TestBackend, 4>::from_data(
            TensorData::new(values.clone(), [1, 1, 3, 4]),
            &device,
        );
        let y: Vec<f32> = rope.apply(x).into_data().to_vec().unwrap();
        assert_eq!(&y[..4], &values[..4]);
        for row in 0..3 {
            let n0: f32 = values[row * 4..row * 4 + 4].iter().map(|v| v * v).sum();
            let n1: f32 = y[row * 4..row * 4 + 4].iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-4, "row {row}: {n0} vs {n1}");
        }
        // Tables from a start position are the rows of the longer table.
        let later = Rope::<TestBackend>::at(1, 2, 4, 10_000.0, &device);
        let full = Rope::<TestBackend>::new(3, 4, 10_000.0, &device);
        let rows = |t: Tensor<TestBackend, 2>| t.into_data().to_vec::<f32>().unwrap();
        assert_eq!(rows(later.cos), rows(full.cos.clone()).split_off(4));
        assert_eq!(rows(later.sin), rows(full.sin.clone()).split_off(4));
        // Position 1, first frequency (1.0 rad): pairs (x0, x2) rotate by 1 radian.
        let (a, b) = (values[4], values[6]);
        assert!((y[4] - (a * 1f32.cos() - b * 1f32.sin())).abs() < 1e-5);
        assert!((y[6] - (b * 1f32.cos() + a * 1f32.sin())).abs() < 1e-5);
    }
}
