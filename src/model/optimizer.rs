//! AdamW with decoupled weight decay and global-norm gradient clipping, over flat tensors
//! keyed by parameter name, so its state exports as named tensors like the weights. NAdam
//! (`nesterov`) and Muon for the hidden matrices (`muon`) are variants of its step over the
//! same two moments.
//!
//! The moments live in one of two forms. By name: one pair of tensors per parameter, updated
//! parameter by parameter (about nine kernels each on a GPU). Flat ([`FlatMoments`]): every
//! parameter's moments laid end to end in one pair of tensors ([`FlatLayout`]), so a step
//! updates the whole section with a handful of element-wise kernels over one long vector.
//! Both forms hold the same numbers; each converts to the other when a step of the other
//! kind needs it.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

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
    /// Update all of a section's parameters as one flat vector (a few kernels per step)
    /// instead of parameter by parameter (about nine kernels each). The same update either
    /// way. Measured faster only for small models on a GPU (`small` on an H200: 8.2 against
    /// 11.2 ms per step); slower for `1b` on that GPU (351 against 122 ms) and on the CPU
    /// (111.7 against 32.4 ms for `small`), so off by default.
    pub flat_step: bool,
    /// First-moment decay growing with a section's staleness, for asynchronous pipeline steps:
    /// section `i` of `n` uses `beta1 + (beta1_max - beta1) * (n - 1 - i) / n`, so the tail
    /// (whose gradients are fresh) keeps `beta1` and each earlier section, whose gradients are
    /// older when applied, averages over more of them. With `beta1` 0.9 and `beta1_max` 0.99
    /// this is the IOTA reference's rule (`0.9 + 0.09 (n - (i + 1)) / n`). A value not above
    /// `beta1` (0) keeps `beta1` in every section. `iota train` and synchronous network steps
    /// (`samples_per_step`) have no stale gradients and use `beta1` throughout
    /// ([`Self::synchronous`]). Default 0.99: on real text (`tiny` without re-embedding, 3 x 2
    /// miners, 1500 samples, five runs over seeds 0-2) it cut the mean gap to `iota train` from
    /// +20.3% to +13.3% at the same throughput (docs/learning.md).
    pub beta1_max: f64,
    /// Nesterov momentum for asynchronous steps: NAdam with decoupled weight decay (PyTorch's
    /// `NAdam` with `decoupled_weight_decay`) instead of AdamW. Each step moves by a blend of
    /// the new gradient and the first moment, weighted by a momentum that warms up from
    /// `beta1 / 2` towards `beta1` as `momentum_decay` sets ([`nadam_weights`]). The moments
    /// are AdamW's, so merges, checkpoints and replays carry nothing new. Like `beta1_max` it
    /// corrects for stale gradients: `iota train` and synchronous network steps step with
    /// AdamW ([`Self::synchronous`]). The IOTA reference's miners step with NAdam. Default on:
    /// on real text it took `tiny` 3 x 2's gap to `iota train` from +15.0% to +5.5% (seeds 0-2,
    /// interleaved) and `small` 3 x 1's from +31.5% to +11.2% (docs/learning.md).
    pub nesterov: bool,
    /// How fast the Nesterov momentum warms up towards `beta1` (PyTorch's `momentum_decay`,
    /// default 0.004: the momentum is `beta1 (1 - 0.96^(t momentum_decay) / 2)` at step `t`).
    /// Used only with `nesterov`.
    pub momentum_decay: f64,
    /// Muon for the hidden matrices (attention, MLP and bottleneck weights; not the token
    /// embedding or the output head, nor any vector): each step moves such a matrix along the
    /// orthogonalized Nesterov blend of its new gradient and its first moment ([`muon_step`]),
    /// scaled to AdamW's update size so the same learning rate serves both. The other
    /// parameters keep AdamW or NAdam as set above. The moments are AdamW's (the second is
    /// kept but unused by a Muon step), so merges, checkpoints and replays carry nothing new.
    /// Unlike `nesterov` this is the optimizer itself, not a correction for stale gradients:
    /// `iota train` and synchronous steps use it too. Default off (docs/learning.md).
    pub muon: bool,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: 1.0,
            flat_step: false,
            beta1_max: 0.99,
            nesterov: true,
            momentum_decay: 0.004,
            muon: false,
        }
    }
}

impl OptimizerConfig {
    /// The settings section `index` of `n_sections` steps with: `beta1` resolved from
    /// `beta1_max` (see there), the rest as given.
    pub fn for_section(&self, index: usize, n_sections: usize) -> Self {
        let mut resolved = Self {
            beta1_max: 0.0,
            ..*self
        };
        if self.beta1_max > self.beta1 && n_sections > 0 {
            let behind = n_sections.saturating_sub(index + 1) as f64;
            resolved.beta1 =
                self.beta1 + (self.beta1_max - self.beta1) * behind / n_sections as f64;
        }
        resolved
    }

    /// These settings without the corrections for stale gradients (the growth of `beta1`,
    /// Nesterov momentum), for steps whose gradients are never stale: AdamW with `beta1`.
    pub fn synchronous(&self) -> Self {
        Self {
            beta1_max: 0.0,
            nesterov: false,
            ..*self
        }
    }

    /// Checks the values make sense.
    ///
    /// # Errors
    /// A message naming the bad key.
    pub fn validate(&self) -> Result<(), String> {
        for (key, value) in [
            ("beta1", self.beta1),
            ("beta2", self.beta2),
            ("beta1_max", self.beta1_max),
        ] {
            if !(0.0..1.0).contains(&value) {
                return Err(format!("`{key}` must be in [0, 1), got {value}"));
            }
        }
        if !(self.momentum_decay.is_finite() && self.momentum_decay >= 0.0) {
            return Err(format!(
                "`momentum_decay` must be a finite number not below 0, got {}",
                self.momentum_decay
            ));
        }
        Ok(())
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

/// Whether a parameter of this shape takes weight decay: matrices do, norms and biases
/// (one dimension) do not.
pub fn takes_weight_decay(shape: &[usize]) -> bool {
    shape.len() >= 2
}

/// Whether parameter `name` of this shape steps with Muon when `muon` is on: the hidden
/// matrices do, the token embeddings (`embed_tokens`, `reembed`), the output head (`lm_head`)
/// and every vector do not (they map tokens, not a hidden space, and keep AdamW as in Muon's
/// own recipe). Returns the matrix's shape.
pub fn muon_shape(name: &str, shape: &[usize]) -> Option<[usize; 2]> {
    match shape {
        &[rows, cols] if !name.contains("embed") && !name.starts_with("lm_head") => {
            Some([rows, cols])
        }
        _ => None,
    }
}

/// Where each parameter of a section lies in one vector of all of them: the parameters that
/// take weight decay first (`..decayed()`), then the others, each group in module order.
#[derive(Debug, Clone, PartialEq)]
pub struct FlatLayout {
    names: Vec<String>,
    offsets: Vec<usize>,
    /// How many parameters (the first ones) take weight decay.
    decayed_params: usize,
    index: HashMap<String, usize>,
}

impl FlatLayout {
    /// The layout of `params` (name, number of values, whether it takes weight decay), in the
    /// order given within each group.
    pub fn new(params: &[(String, usize, bool)]) -> Self {
        let ordered: Vec<&(String, usize, bool)> = params
            .iter()
            .filter(|p| p.2)
            .chain(params.iter().filter(|p| !p.2))
            .collect();
        let mut offsets = vec![0];
        for (_, len, _) in &ordered {
            offsets.push(offsets[offsets.len() - 1] + len);
        }
        let decayed_params = params.iter().filter(|p| p.2).count();
        let names: Vec<String> = ordered.iter().map(|p| p.0.clone()).collect();
        let index = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        Self {
            names,
            offsets,
            decayed_params,
            index,
        }
    }

    /// Parameter names in layout order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Total number of values.
    pub fn len(&self) -> usize {
        self.offsets[self.offsets.len() - 1]
    }

    /// Whether the layout holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values `..decayed()` take weight decay.
    pub fn decayed(&self) -> usize {
        self.offsets[self.decayed_params]
    }

    /// Whether parameter `name` takes weight decay (false for a name not in the layout).
    pub fn decays(&self, name: &str) -> bool {
        self.index
            .get(name)
            .is_some_and(|&i| i < self.decayed_params)
    }

    /// Where parameter `name` lies.
    pub fn range(&self, name: &str) -> Option<Range<usize>> {
        let i = *self.index.get(name)?;
        Some(self.offsets[i]..self.offsets[i + 1])
    }

    /// The range of the `i`-th parameter in layout order.
    pub fn range_at(&self, i: usize) -> Range<usize> {
        self.offsets[i]..self.offsets[i + 1]
    }
}

/// Both moments of every parameter of a [`FlatLayout`], each in one tensor.
#[derive(Debug, Clone)]
pub struct FlatMoments<B: Backend> {
    /// Where each parameter's values lie.
    pub layout: Arc<FlatLayout>,
    /// Running mean of gradients.
    pub exp_avg: Tensor<B, 1>,
    /// Running mean of squared gradients.
    pub exp_avg_sq: Tensor<B, 1>,
}

impl<B: Backend> FlatMoments<B> {
    /// The moments of the values in `range` (views, not copies).
    fn part(&self, range: Range<usize>) -> Moments<B> {
        Moments {
            exp_avg: self.exp_avg.clone().slice(range.clone()),
            exp_avg_sq: self.exp_avg_sq.clone().slice(range),
        }
    }
}

/// AdamW state of one section.
#[derive(Debug, Clone)]
pub struct AdamW<B: Backend> {
    /// Hyper-parameters.
    pub config: OptimizerConfig,
    /// Number of updates applied so far (bias correction uses it).
    pub step: u64,
    /// Moments by parameter name; absent until the parameter's first update. Empty while
    /// `flat` holds them.
    moments: HashMap<String, Moments<B>>,
    /// Every parameter's moments end to end, after a flat step.
    flat: Option<FlatMoments<B>>,
}

impl<B: Backend> AdamW<B> {
    /// A fresh optimizer.
    pub fn new(config: OptimizerConfig) -> Self {
        Self {
            config,
            step: 0,
            moments: HashMap::new(),
            flat: None,
        }
    }

    /// Whether no parameter has moments yet.
    pub fn is_empty(&self) -> bool {
        self.moments.is_empty() && self.flat.is_none()
    }

    /// Whether the moments are held flat (after a flat step).
    pub fn is_flat(&self) -> bool {
        self.flat.is_some()
    }

    /// The moments of parameter `name` (a view into the flat tensors when they are flat).
    pub fn moments_of(&self, name: &str) -> Option<Moments<B>> {
        match &self.flat {
            Some(f) => Some(f.part(f.layout.range(name)?)),
            None => self.moments.get(name).cloned(),
        }
    }

    /// Every parameter's two moments in host memory, sorted by name (one read-back per moment
    /// when they are flat).
    pub fn host_moments(&self) -> Vec<(String, Vec<f32>, Vec<f32>)> {
        let mut out = match &self.flat {
            Some(f) => {
                let m = super::host_values(f.exp_avg.clone()).unwrap_or_default();
                let v = super::host_values(f.exp_avg_sq.clone()).unwrap_or_default();
                (0..f.layout.names.len())
                    .map(|i| {
                        let r = f.layout.range_at(i);
                        let part = |x: &Vec<f32>| x.get(r.clone()).map(<[f32]>::to_vec);
                        (
                            f.layout.names[i].clone(),
                            part(&m).unwrap_or_default(),
                            part(&v).unwrap_or_default(),
                        )
                    })
                    .collect::<Vec<_>>()
            }
            None => self
                .moments
                .iter()
                .map(|(name, mo)| {
                    (
                        name.clone(),
                        super::host_values(mo.exp_avg.clone()).unwrap_or_default(),
                        super::host_values(mo.exp_avg_sq.clone()).unwrap_or_default(),
                    )
                })
                .collect(),
        };
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Replaces every moment with `moments` (by name).
    pub fn set_moments(&mut self, moments: HashMap<String, Moments<B>>) {
        self.moments = moments;
        self.flat = None;
    }

    /// Adds or replaces the moments of the parameters in `moments` (a by-name step), turning
    /// flat moments into by-name ones first.
    pub fn commit_by_name(&mut self, moments: HashMap<String, Moments<B>>) {
        if let Some(f) = self.flat.take() {
            for (i, name) in f.layout.names.iter().enumerate() {
                self.moments
                    .insert(name.clone(), f.part(f.layout.range_at(i)));
            }
        }
        self.moments.extend(moments);
    }

    /// Replaces every moment with the result of a flat step.
    pub fn commit_flat(&mut self, flat: FlatMoments<B>) {
        self.moments.clear();
        self.flat = Some(flat);
    }

    /// The moments laid out as `layout` (zeros for a parameter without moments yet, which is
    /// what its first update assumes).
    fn flat_for(
        &self,
        layout: &Arc<FlatLayout>,
        device: &B::Device,
    ) -> (Tensor<B, 1>, Tensor<B, 1>) {
        if let Some(f) = &self.flat
            && (Arc::ptr_eq(&f.layout, layout) || *f.layout == **layout)
        {
            return (f.exp_avg.clone(), f.exp_avg_sq.clone());
        }
        let mut ms = Vec::with_capacity(layout.names.len());
        let mut vs = Vec::with_capacity(layout.names.len());
        for (i, name) in layout.names.iter().enumerate() {
            let len = layout.range_at(i).len();
            match self.moments_of(name) {
                Some(mo) => {
                    ms.push(mo.exp_avg);
                    vs.push(mo.exp_avg_sq);
                }
                None => {
                    ms.push(Tensor::zeros([len], device));
                    vs.push(Tensor::zeros([len], device));
                }
            }
        }
        (Tensor::cat(ms, 0), Tensor::cat(vs, 0))
    }

    /// The AdamW update of a whole section at step `t` (1-based): `param` and `grad` hold
    /// every parameter as laid out by `layout`. Returns the new values and moments without
    /// touching `self`, as [`Self::update`] does for one parameter, with the same arithmetic
    /// element by element.
    pub fn update_flat(
        &self,
        layout: &Arc<FlatLayout>,
        param: Tensor<B, 1>,
        grad: Tensor<B, 1>,
        lr: f64,
        t: u64,
    ) -> (Tensor<B, 1>, FlatMoments<B>) {
        let c = &self.config;
        let fresh = c.nesterov.then(|| grad.clone());
        let (m, v) = self.next_moments(Some(self.flat_for(layout, &param.device())), grad);
        let update = self.step_direction(&m, &v, fresh, t);
        let k = layout.decayed();
        let param = if k > 0 && c.weight_decay > 0.0 {
            let decayed = param.clone().slice(0..k) * (1.0 - lr * c.weight_decay);
            param.slice_assign(0..k, decayed)
        } else {
            param
        };
        (
            param - update * lr,
            FlatMoments {
                layout: layout.clone(),
                exp_avg: m,
                exp_avg_sq: v,
            },
        )
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
        let previous = self.moments_of(name).map(|mo| (mo.exp_avg, mo.exp_avg_sq));
        let fresh = c.nesterov.then(|| grad.clone());
        let (m, v) = self.next_moments(previous, grad);
        let update = self.step_direction(&m, &v, fresh, t);
        self.moved(
            param,
            update,
            lr,
            decay,
            Moments {
                exp_avg: m,
                exp_avg_sq: v,
            },
        )
    }

    /// The Muon update of the hidden matrix `name` of shape `shape` (flat in `param` and
    /// `grad`), as [`Self::update`] returns it: the first moment moves as AdamW's (the second
    /// too, unused here), and the matrix by `lr` times [`muon_step`] of the Nesterov blend
    /// `(1 - beta1) grad + beta1 m`, after decoupled weight decay.
    pub fn update_matrix(
        &self,
        name: &str,
        param: Tensor<B, 1>,
        grad: Tensor<B, 1>,
        lr: f64,
        shape: [usize; 2],
    ) -> (Tensor<B, 1>, Moments<B>) {
        let c = &self.config;
        let previous = self.moments_of(name).map(|mo| (mo.exp_avg, mo.exp_avg_sq));
        let (m, v) = self.next_moments(previous, grad.clone());
        let blend = grad * (1.0 - c.beta1) + m.clone() * c.beta1;
        let update = muon_step(blend.reshape(shape)).reshape([shape[0] * shape[1]]);
        self.moved(
            param,
            update,
            lr,
            true,
            Moments {
                exp_avg: m,
                exp_avg_sq: v,
            },
        )
    }

    /// `param` after decoupled weight decay (when `decay`) and a move of `lr` times `update`,
    /// with its new `moments`.
    fn moved(
        &self,
        param: Tensor<B, 1>,
        update: Tensor<B, 1>,
        lr: f64,
        decay: bool,
        moments: Moments<B>,
    ) -> (Tensor<B, 1>, Moments<B>) {
        let param = if decay && self.config.weight_decay > 0.0 {
            param * (1.0 - lr * self.config.weight_decay)
        } else {
            param
        };
        (param - update * lr, moments)
    }
}

/// Muon's direction for one matrix: `x` orthogonalized by five Newton-Schulz iterations (the
/// quintic of Jordan et al.'s Muon, coefficients 3.4445, -4.7750, 2.0315, which takes every
/// singular value into about [0.7, 1.2] rather than exactly to 1), times
/// `0.2 sqrt(max(rows, cols))` so that its root mean square is about AdamW's 0.2 (Moonshot's
/// scaling, which lets Muon share AdamW's learning rate). A zero matrix stays zero.
pub fn muon_step<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 2> {
    let [rows, cols] = x.dims();
    let wide = rows <= cols;
    // Iterate on the wide orientation, so `X Xᵀ` is the smaller square.
    let mut x = if wide { x } else { x.transpose() };
    let norm = x.clone().square().sum().sqrt().add_scalar(1e-7);
    x = x / norm.unsqueeze();
    let (a, b, c) = (3.4445, -4.7750, 2.0315);
    for _ in 0..5 {
        let gram = x.clone().matmul(x.clone().transpose());
        let poly = gram.clone() * b + gram.clone().matmul(gram) * c;
        x = x.clone() * a + poly.matmul(x);
    }
    let x = if wide { x } else { x.transpose() };
    x * (0.2 * (rows.max(cols) as f64).sqrt())
}

impl<B: Backend> AdamW<B> {
    /// Both moments after gradient `grad`, from `previous` (none before a parameter's first
    /// update: zero moments, without building them).
    fn next_moments(
        &self,
        previous: Option<(Tensor<B, 1>, Tensor<B, 1>)>,
        grad: Tensor<B, 1>,
    ) -> (Tensor<B, 1>, Tensor<B, 1>) {
        let c = &self.config;
        match previous {
            Some((m, v)) => (
                m * c.beta1 + grad.clone() * (1.0 - c.beta1),
                v * c.beta2 + grad.square() * (1.0 - c.beta2),
            ),
            None => (
                grad.clone() * (1.0 - c.beta1),
                grad.square() * (1.0 - c.beta2),
            ),
        }
    }

    /// What a step at `t` (1-based) moves a parameter by, over `lr`, before weight decay, from
    /// the new moments `m` and `v` and, for Nesterov steps (`fresh` given only then), the new
    /// gradient `fresh`: AdamW's bias-corrected `m / (sqrt(v) + eps)`, or NAdam's blend of
    /// `fresh` and `m` over the same denominator ([`nadam_weights`]).
    fn step_direction(
        &self,
        m: &Tensor<B, 1>,
        v: &Tensor<B, 1>,
        fresh: Option<Tensor<B, 1>>,
        t: u64,
    ) -> Tensor<B, 1> {
        let c = &self.config;
        let bc2 = 1.0 - c.beta2.powi(t as i32);
        let denom = (v.clone() / bc2).sqrt() + c.eps;
        match fresh {
            Some(g) => {
                let (on_grad, on_moment) = nadam_weights(c.beta1, c.momentum_decay, t);
                (g * on_grad + m.clone() * on_moment) / denom
            }
            None => {
                let bc1 = 1.0 - c.beta1.powi(t as i32);
                (m.clone() / bc1) / denom
            }
        }
    }

    /// The direction the next update of parameter `name` will most likely take, from the
    /// moments alone (no new gradient), at the current step count: the bias-corrected
    /// `m / (sqrt(v) + eps)`, plus the weight decay term when `decay`. The next step moves the
    /// parameter by about `-lr` times this. `None` before the parameter's first update.
    pub fn direction(&self, name: &str, param: &Tensor<B, 1>, decay: bool) -> Option<Tensor<B, 1>> {
        let mo = self.moments_of(name)?;
        let c = &self.config;
        // A Nesterov step's new gradient is not known yet: the first moment stands in for it.
        let stand_in = c.nesterov.then(|| {
            let bc1 = 1.0 - c.beta1.powi(self.step.max(1) as i32);
            mo.exp_avg.clone() / bc1
        });
        let dir = self.step_direction(&mo.exp_avg, &mo.exp_avg_sq, stand_in, self.step.max(1));
        Some(if decay && c.weight_decay > 0.0 {
            dir + param.clone() * c.weight_decay
        } else {
            dir
        })
    }
}

impl<B: Backend> AdamW<B> {
    /// [`Self::direction`] for a hidden matrix of shape `shape` that steps with Muon: the
    /// orthogonalized first moment ([`muon_step`]), plus the weight decay term. `None` before
    /// the matrix's first update.
    pub fn matrix_direction(
        &self,
        name: &str,
        param: &Tensor<B, 1>,
        shape: [usize; 2],
    ) -> Option<Tensor<B, 1>> {
        let m = self.moments_of(name)?.exp_avg;
        let dir = muon_step(m.reshape(shape)).reshape([shape[0] * shape[1]]);
        Some(if self.config.weight_decay > 0.0 {
            dir + param.clone() * self.config.weight_decay
        } else {
            dir
        })
    }
}

/// NAdam's weights at step `t` (1-based) on the new gradient and on the new first moment,
/// both over `sqrt(v̂) + eps` (Dozat's NAdam with PyTorch's momentum warm-up): with
/// `μ_i = beta1 (1 - 0.96^(i momentum_decay) / 2)` and `P_t = μ_1 ⋯ μ_t`, they are
/// `(1 - μ_t) / (1 - P_t)` and `μ_{t+1} / (1 - P_t μ_{t+1})`. A function of `t` alone, so
/// replays and merged miners need no extra state.
pub fn nadam_weights(beta1: f64, momentum_decay: f64, t: u64) -> (f64, f64) {
    let mu = |i: u64| beta1 * (1.0 - 0.5 * 0.96f64.powf(i as f64 * momentum_decay));
    let t = t.max(1);
    let mut product = 1.0;
    for i in 1..=t {
        product *= mu(i);
        // Past this `1 - product` is 1 in `f64`: the rest of the product changes nothing.
        if product < 1e-18 {
            product = 0.0;
            break;
        }
    }
    let next = mu(t + 1);
    (
        (1.0 - mu(t)) / (1.0 - product),
        next / (1.0 - product * next),
    )
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
    fn beta1_grows_with_a_sections_staleness_as_the_reference_rule() {
        let c = OptimizerConfig {
            beta1_max: 0.99,
            ..OptimizerConfig::default()
        };
        let betas: Vec<f64> = (0..3).map(|i| c.for_section(i, 3).beta1).collect();
        // 0.9 + 0.09 (3 - (i + 1)) / 3: the head 0.96, the body 0.93, the tail 0.9.
        for (got, want) in betas.iter().zip([0.96, 0.93, 0.9]) {
            assert!((got - want).abs() < 1e-12, "{betas:?}");
        }
        assert_eq!(c.for_section(2, 3).beta1_max, 0.0);
        assert!(c.for_section(0, 3).nesterov);
        // Not above `beta1`, and for synchronous steps, every section keeps `beta1` and steps
        // with AdamW.
        let plain = c.synchronous();
        assert_eq!(plain.for_section(0, 3), plain);
        assert_eq!(plain.beta1, 0.9);
        assert!(!plain.nesterov);
        assert!(c.validate().is_ok());
        let one = OptimizerConfig {
            beta1_max: 1.0,
            ..OptimizerConfig::default()
        };
        assert!(one.validate().unwrap_err().contains("beta1_max"));
    }

    #[test]
    fn first_step_moves_each_weight_by_lr() {
        let opt = AdamW::<TestBackend>::new(OptimizerConfig {
            weight_decay: 0.0,
            nesterov: false,
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
    fn a_nesterov_step_blends_the_gradient_and_the_moment_as_nadam() {
        let config = OptimizerConfig {
            weight_decay: 0.0,
            nesterov: true,
            ..Default::default()
        };
        let opt = AdamW::<TestBackend>::new(config);
        let (p, _) = opt.update("w", t(vec![1.0, 1.0]), t(vec![0.5, -2.0]), 0.1, true, 1);
        let p: Vec<f32> = p.into_data().to_vec().unwrap();
        // Step 1: m = (1 - b1) g and sqrt(v̂) = |g|, so the step is lr sign(g) times
        // (1 - mu1) / (1 - mu1) + mu2 (1 - b1) / (1 - mu1 mu2), written out by hand here.
        let mu = |i: f64| 0.9 * (1.0 - 0.5 * 0.96f64.powf(i * 0.004));
        let size = 0.1 * (1.0 + mu(2.0) * 0.1 / (1.0 - mu(1.0) * mu(2.0)));
        assert!((f64::from(p[0]) - (1.0 - size)).abs() < 1e-6, "{p:?}");
        assert!((f64::from(p[1]) - (1.0 + size)).abs() < 1e-6, "{p:?}");
        // The by-name and the flat step agree.
        let layout = Arc::new(FlatLayout::new(&[("w".into(), 2, true)]));
        let (flat, _) = opt.update_flat(&layout, t(vec![1.0, 1.0]), t(vec![0.5, -2.0]), 0.1, 1);
        let flat: Vec<f32> = flat.into_data().to_vec().unwrap();
        assert_eq!(flat, p);
    }

    #[test]
    fn nadam_weights_tend_to_the_heavy_ball_blend() {
        // Early the momentum is near beta1 / 2; late, (1 - beta1) on the gradient and beta1 on
        // the moment.
        let mu = |i: f64| 0.99 * (1.0 - 0.5 * 0.96f64.powf(i * 0.004));
        let (g1, m1) = nadam_weights(0.99, 0.004, 1);
        assert!((g1 - 1.0).abs() < 1e-12, "{g1}");
        assert!(
            (m1 - mu(2.0) / (1.0 - mu(1.0) * mu(2.0))).abs() < 1e-12,
            "{m1}"
        );
        let (g2, _) = nadam_weights(0.99, 0.004, 2);
        assert!(
            (g2 - (1.0 - mu(2.0)) / (1.0 - mu(1.0) * mu(2.0))).abs() < 1e-12,
            "{g2}"
        );
        let (g, m) = nadam_weights(0.99, 0.004, 1_000_000);
        assert!(
            (g - 0.01).abs() < 1e-6 && (m - 0.99).abs() < 1e-6,
            "{g} {m}"
        );
        // Without warm-up the momentum stays beta1 / 2.
        let (g, m) = nadam_weights(0.9, 0.0, 50);
        assert!(
            (g - 0.55).abs() < 1e-12 && (m - 0.45).abs() < 1e-12,
            "{g} {m}"
        );
        let bad = OptimizerConfig {
            momentum_decay: -1.0,
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("momentum_decay"));
    }

    #[test]
    fn muons_step_is_near_orthogonal_at_adamws_size_in_either_orientation() {
        let (rows, cols) = (6, 10);
        // Pseudo-random values (a linear congruential generator), so the matrix has full rank.
        let mut state = 12345u32;
        let values: Vec<f32> = (0..rows * cols)
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect();
        let x = Tensor::<TestBackend, 2>::from_data(
            TensorData::new(values, [rows, cols]),
            &Default::default(),
        );
        let o = muon_step(x.clone());
        // O Oᵀ is about (0.2 sqrt(10))² I: every singular value of the iteration lies in
        // about [0.7, 1.2], and the rows are orthogonal to a few percent.
        let scale = 0.04 * cols as f32;
        let gram: Vec<f32> = (o.clone().matmul(o.clone().transpose()) / scale)
            .into_data()
            .to_vec()
            .unwrap();
        for i in 0..rows {
            for j in 0..rows {
                let g = gram[i * rows + j];
                if i == j {
                    assert!((0.45..1.5).contains(&g), "diagonal {i}: {g}");
                } else {
                    assert!(g.abs() < 0.3, "({i}, {j}): {g}");
                }
            }
        }
        // A tall matrix is orthogonalized as its transpose.
        let tall: Vec<f32> = muon_step(x.transpose())
            .transpose()
            .into_data()
            .to_vec()
            .unwrap();
        let wide: Vec<f32> = o.into_data().to_vec().unwrap();
        for (a, b) in tall.iter().zip(&wide) {
            assert!((a - b).abs() < 1e-5, "{a} against {b}");
        }
        // Nothing to orthogonalize: no move.
        let zero = muon_step(Tensor::<TestBackend, 2>::zeros([3, 4], &Default::default()));
        assert_eq!(zero.into_data().to_vec::<f32>().unwrap(), vec![0.0; 12]);
    }

    #[test]
    fn muon_takes_the_hidden_matrices_only() {
        assert_eq!(
            muon_shape("model.layers.0.self_attn.q_proj.weight", &[128, 128]),
            Some([128, 128])
        );
        assert_eq!(
            muon_shape("model.layers.1.bottleneck.encoder.weight", &[128, 2]),
            Some([128, 2])
        );
        assert_eq!(muon_shape("model.embed_tokens.weight", &[256, 128]), None);
        assert_eq!(
            muon_shape("model.layers.2.reembed.weight", &[256, 128]),
            None
        );
        assert_eq!(muon_shape("lm_head.weight", &[128, 256]), None);
        assert_eq!(muon_shape("model.norm.weight", &[128]), None);
        assert!(!OptimizerConfig::default().muon);
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
    fn the_flat_step_is_off_unless_configured() {
        assert!(!OptimizerConfig::default().flat_step);
        let on: OptimizerConfig = serde_norway::from_str("flat_step: true").unwrap();
        assert!(on.flat_step);
        assert_eq!(on.grad_clip, 1.0);
        let typo = serde_norway::from_str::<OptimizerConfig>("flat_steps: true").unwrap_err();
        assert!(typo.to_string().contains("flat_steps"), "{typo}");
    }

    #[test]
    fn a_flat_layout_puts_the_decayed_parameters_first() {
        let layout = FlatLayout::new(&[
            ("norm".into(), 4, false),
            ("w".into(), 6, true),
            ("b".into(), 2, false),
            ("v".into(), 3, true),
        ]);
        assert_eq!(layout.names(), ["w", "v", "norm", "b"]);
        assert_eq!(layout.decayed(), 9);
        assert_eq!(layout.len(), 15);
        assert_eq!(layout.range("norm"), Some(9..13));
        assert!(layout.decays("v") && !layout.decays("b") && !layout.decays("missing"));
    }

    #[test]
    fn clipping_scale() {
        assert_eq!(clip_scale(0.5, 1.0), 1.0);
        assert!((clip_scale(4.0, 1.0) - 0.25).abs() < 1e-6);
        assert_eq!(clip_scale(4.0, 0.0), 1.0);
    }
}
