//! AdamW with decoupled weight decay and global-norm gradient clipping, over flat tensors
//! keyed by parameter name, so its state exports as named tensors like the weights.

use std::collections::HashMap;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

/// Hyper-parameters of the inner optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerConfig {
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Added to the root of the second moment.
    pub eps: f64,
    /// Decoupled weight decay, applied to matrices only (not to norms or biases).
    pub weight_decay: f64,
    /// Clip the global gradient norm of the section to this value; 0 disables clipping.
    pub grad_clip: f64,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: 1.0,
        }
    }
}

/// First and second moments of one parameter, flat.
#[derive(Debug, Clone)]
pub struct Moments<B: Backend> {
    /// Running mean of gradients.
    pub exp_avg: Tensor<B, 1>,
    /// Running mean of squared gradients.
    pub exp_avg_sq: Tensor<B, 1>,
}

/// AdamW state of one section.
#[derive(Debug, Clone)]
pub struct AdamW<B: Backend> {
    /// Hyper-parameters.
    pub config: OptimizerConfig,
    /// Number of updates applied so far (bias correction uses it).
    pub step: u64,
    /// Moments by parameter name; absent until the parameter's first update.
    pub moments: HashMap<String, Moments<B>>,
}

impl<B: Backend> AdamW<B> {
    /// A fresh optimizer.
    pub fn new(config: OptimizerConfig) -> Self {
        Self {
            config,
            step: 0,
            moments: HashMap::new(),
        }
    }

    /// The AdamW update of one parameter at step `t` (1-based), returning the new value and
    /// new moments without touching `self` (the caller commits them only when the whole step
    /// is finite).
    pub fn update(
        &self,
        name: &str,
        param: Tensor<B, 1>,
        grad: Tensor<B, 1>,
        lr: f64,
        decay: bool,
        t: u64,
    ) -> (Tensor<B, 1>, Moments<B>) {
        let c = &self.config;
        let (m, v) = match self.moments.get(name) {
            Some(mo) => (
                mo.exp_avg.clone() * c.beta1 + grad.clone() * (1.0 - c.beta1),
                mo.exp_avg_sq.clone() * c.beta2 + grad.square() * (1.0 - c.beta2),
            ),
            None => (
                grad.clone() * (1.0 - c.beta1),
                grad.square() * (1.0 - c.beta2),
            ),
        };
        let bc1 = 1.0 - c.beta1.powi(t as i32);
        let bc2 = 1.0 - c.beta2.powi(t as i32);
        let update = (m.clone() / bc1) / ((v.clone() / bc2).sqrt() + c.eps);
        let param = if decay && c.weight_decay > 0.0 {
            param * (1.0 - lr * c.weight_decay)
        } else {
            param
        };
        (
            param - update * lr,
            Moments {
                exp_avg: m,
                exp_avg_sq: v,
            },
        )
    }
}

impl<B: Backend> AdamW<B> {
    /// The direction the next update of parameter `name` will most likely take, from the
    /// moments alone (no new gradient), at the current step count: the bias-corrected
    /// `m / (sqrt(v) + eps)`, plus the weight decay term when `decay`. The next step moves the
    /// parameter by about `-lr` times this. `None` before the parameter's first update.
    pub fn direction(&self, name: &str, param: &Tensor<B, 1>, decay: bool) -> Option<Tensor<B, 1>> {
        let mo = self.moments.get(name)?;
        let c = &self.config;
        let t = self.step.max(1);
        let bc1 = 1.0 - c.beta1.powi(t as i32);
        let bc2 = 1.0 - c.beta2.powi(t as i32);
        let dir = (mo.exp_avg.clone() / bc1) / ((mo.exp_avg_sq.clone() / bc2).sqrt() + c.eps);
        Some(if decay && c.weight_decay > 0.0 {
            dir + param.clone() * c.weight_decay
        } else {
            dir
        })
    }
}

/// Scale that brings a gradient of global norm `norm` under `max_norm` (1 when already under,
/// or when clipping is off).
pub fn clip_scale(norm: f64, max_norm: f64) -> f64 {
    if max_norm > 0.0 && norm > max_norm {
        max_norm / (norm + 1e-6)
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TestBackend;
    use burn::tensor::TensorData;

    fn t(v: Vec<f32>) -> Tensor<TestBackend, 1> {
        let n = v.len();
        Tensor::from_data(TensorData::new(v, [n]), &Default::default())
    }

    #[test]
    fn first_step_moves_each_weight_by_lr() {
        let opt = AdamW::<TestBackend>::new(OptimizerConfig {
            weight_decay: 0.0,
            ..Default::default()
        });
        let (p, m) = opt.update("w", t(vec![1.0, 1.0]), t(vec![0.5, -2.0]), 0.1, true, 1);
        let p: Vec<f32> = p.into_data().to_vec().unwrap();
        // After bias correction the first update is lr * sign(g).
        assert!(
            (p[0] - 0.9).abs() < 1e-5 && (p[1] - 1.1).abs() < 1e-5,
            "{p:?}"
        );
        let m: Vec<f32> = m.exp_avg.into_data().to_vec().unwrap();
        assert!((m[0] - 0.05).abs() < 1e-7);
    }

    #[test]
    fn decay_only_when_asked() {
        let opt = AdamW::<TestBackend>::new(OptimizerConfig::default());
        let (a, _) = opt.update("w", t(vec![2.0]), t(vec![0.0]), 0.1, true, 1);
        let (b, _) = opt.update("w", t(vec![2.0]), t(vec![0.0]), 0.1, false, 1);
        let a: Vec<f32> = a.into_data().to_vec().unwrap();
        let b: Vec<f32> = b.into_data().to_vec().unwrap();
        assert!((a[0] - 2.0 * (1.0 - 0.01)).abs() < 1e-6);
        assert!((b[0] - 2.0).abs() < 1e-6);
    }

    #[test]
    fn clipping_scale() {
        assert_eq!(clip_scale(0.5, 1.0), 1.0);
        assert!((clip_scale(4.0, 1.0) - 0.25).abs() < 1e-6);
        assert_eq!(clip_scale(4.0, 0.0), 1.0);
    }
}
