//! CLASP (Contribution Loss Assessment via Sampling of Pathways): each miner's effect on the
//! loss of the samples that passed through it, from the ledger alone. See `docs/clasp.md` for
//! the derivation and the sample sizes it needs.
//!
//! # Model
//! Every completed sample `b` has a pathway (one miner per section) and a loss `l_b`. The
//! estimator fits the additive ("main effects") model
//!
//! ```text
//! l_b = beta[w(b)] + sum_s e[s][pi_b(s)] + eps_b,      sum_m n[s][m] * e[s][m] = 0 per section
//! ```
//!
//! where `w(b)` is the baseline window of the sample (consecutive samples in time order, so
//! the downward drift of the loss is absorbed by `beta`), and `e[s][m]` is miner `m`'s effect
//! in section `s` relative to the other miners of its section. The fit is by backfitting
//! (Gauss-Seidel over the factors), which is exact least squares for this model and stays
//! correct when routing is unbalanced (a naive per-miner mean is not: it also picks up the
//! effects of the miners it happened to be paired with).
//!
//! A miner is flagged when it has at least `min_samples` samples, its effect is at least
//! `min_effect` nats, and its z-score `e / se` is at least `z_threshold`, with
//! `se = sigma * sqrt(c' (X'X)^-1 c)` (the standard error of the least-squares contrast of the
//! miner against its section's weighted mean; `sigma * sqrt(1/n_m - 1/N_s)` for a balanced
//! design, more where pathways are confounded) and `sigma` the residual standard deviation.
//! Only harmful effects (a higher loss) are flagged. The quality factor
//! `exp(-max(0, e - 2 se) / temperature)` lowers credit by the part of the effect that is
//! statistically solid.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::api::ClaspConfig;

/// One completed sample of the ledger.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerEntry {
    /// Sample id.
    pub sample: u64,
    /// When its loss was measured (ms since the Unix epoch, or any increasing step count).
    pub time: u64,
    /// Its loss (nats per token).
    pub loss: f64,
    /// The miner of each section, by section index.
    pub pathway: Vec<String>,
}

/// The estimate for one miner of one section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MinerEffect {
    /// Section.
    pub section: usize,
    /// Miner hotkey.
    pub miner: String,
    /// Samples through it.
    pub samples: usize,
    /// Its effect on the loss (nats; positive = worse than its section).
    pub effect: f64,
    /// Standard error of `effect` (0 when it cannot be estimated).
    pub std_error: f64,
    /// `effect / std_error` (0 when the error is unknown, infinite when it is exactly 0).
    pub z: f64,
    /// Whether it is an outlier (see the module docs).
    pub flagged: bool,
    /// Credit factor in `(0, 1]`.
    pub quality: f64,
}

/// The estimator's output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaspReport {
    /// One entry per (section, miner), by section then hotkey.
    pub effects: Vec<MinerEffect>,
    /// Residual standard deviation of the per-sample loss (nats), `sigma`.
    pub residual_std: f64,
    /// Samples used (finite losses).
    pub samples: usize,
    /// Baseline windows.
    pub windows: usize,
    /// Residual degrees of freedom (no flags when it is 0).
    pub dof: usize,
}

impl ClaspReport {
    /// The estimate of `miner` in `section`.
    pub fn effect(&self, section: usize, miner: &str) -> Option<&MinerEffect> {
        self.effects
            .iter()
            .find(|e| e.section == section && e.miner == miner)
    }
}

/// Levels of one section: miner names and each sample's level.
struct Factor {
    names: Vec<String>,
    /// Level of each sample, `None` when the sample has no miner for this section.
    of: Vec<Option<usize>>,
    effect: Vec<f64>,
    count: Vec<usize>,
}

/// Backfitting sweeps at most.
const MAX_SWEEPS: usize = 500;
/// Stop when no estimate moves more than this (nats).
const CONVERGED: f64 = 1e-12;

/// Fits the model of the module docs to `entries` (non-finite losses are ignored).
pub fn estimate(entries: &[LedgerEntry], config: &ClaspConfig) -> ClaspReport {
    let mut rows: Vec<&LedgerEntry> = entries.iter().filter(|e| e.loss.is_finite()).collect();
    rows.sort_by_key(|e| (e.time, e.sample));
    let n = rows.len();
    let window = config.window.max(1);
    let n_windows = n.div_ceil(window);
    let win_of: Vec<usize> = (0..n).map(|i| i / window).collect();
    let loss: Vec<f64> = rows.iter().map(|e| e.loss).collect();
    let n_sections = rows.iter().map(|e| e.pathway.len()).max().unwrap_or(0);
    let mut factors: Vec<Factor> = (0..n_sections)
        .map(|s| {
            let mut names: Vec<String> = rows
                .iter()
                .filter_map(|e| e.pathway.get(s).cloned())
                .collect();
            names.sort();
            names.dedup();
            let index: BTreeMap<&str, usize> = names
                .iter()
                .enumerate()
                .map(|(i, m)| (m.as_str(), i))
                .collect();
            let of: Vec<Option<usize>> = rows
                .iter()
                .map(|e| {
                    e.pathway
                        .get(s)
                        .and_then(|m| index.get(m.as_str()).copied())
                })
                .collect();
            let mut count = vec![0; names.len()];
            for l in of.iter().flatten() {
                count[*l] += 1;
            }
            Factor {
                effect: vec![0.0; names.len()],
                names,
                of,
                count,
            }
        })
        .collect();
    let mut beta = vec![0.0; n_windows];
    let effects_of = |factors: &[Factor], i: usize, skip: Option<usize>| -> f64 {
        factors
            .iter()
            .enumerate()
            .filter(|(s, _)| Some(*s) != skip)
            .filter_map(|(_, f)| f.of[i].map(|l| f.effect[l]))
            .sum()
    };
    for _ in 0..MAX_SWEEPS {
        let mut moved = 0.0f64;
        // Baselines: the mean of what the miners' effects leave of each window's losses.
        let mut sum = vec![0.0; n_windows];
        let mut cnt = vec![0usize; n_windows];
        for i in 0..n {
            sum[win_of[i]] += loss[i] - effects_of(&factors, i, None);
            cnt[win_of[i]] += 1;
        }
        for w in 0..n_windows {
            let new = sum[w] / cnt[w].max(1) as f64;
            moved = moved.max((new - beta[w]).abs());
            beta[w] = new;
        }
        // Each section's effects in turn, centred (weighted by samples) within the section.
        for s in 0..factors.len() {
            let levels = factors[s].names.len();
            let mut sum = vec![0.0; levels];
            for i in 0..n {
                if let Some(l) = factors[s].of[i] {
                    sum[l] += loss[i] - beta[win_of[i]] - effects_of(&factors, i, Some(s));
                }
            }
            let f = &mut factors[s];
            let mut new: Vec<f64> = (0..levels)
                .map(|l| sum[l] / f.count[l].max(1) as f64)
                .collect();
            let total: usize = f.count.iter().sum();
            let mean = new
                .iter()
                .zip(&f.count)
                .map(|(e, c)| e * *c as f64)
                .sum::<f64>()
                / total.max(1) as f64;
            for (l, e) in new.iter_mut().enumerate() {
                *e -= mean;
                moved = moved.max((*e - f.effect[l]).abs());
            }
            f.effect = new;
        }
        if moved < CONVERGED {
            break;
        }
    }
    let rss: f64 = (0..n)
        .map(|i| {
            let r = loss[i] - beta[win_of[i]] - effects_of(&factors, i, None);
            r * r
        })
        .sum();
    let params = n_windows
        + factors
            .iter()
            .map(|f| f.names.len().saturating_sub(1))
            .sum::<usize>();
    let dof = n.saturating_sub(params);
    let sigma = if dof > 0 {
        (rss / dof as f64).sqrt()
    } else {
        0.0
    };
    let variances = effect_variances(&factors, &win_of, n_windows);
    let mut effects = Vec::new();
    for (s, f) in factors.iter().enumerate() {
        for (l, name) in f.names.iter().enumerate() {
            let (e, n_m) = (f.effect[l], f.count[l]);
            let var = variances[s][l];
            let std_error = if dof > 0 && var > 0.0 {
                sigma * var.sqrt()
            } else {
                0.0
            };
            let estimable = dof > 0 && var > 0.0;
            let z = match (estimable, std_error > 0.0) {
                (false, _) => 0.0,
                (true, true) => e / std_error,
                (true, false) if e > 0.0 => f64::INFINITY,
                (true, false) if e < 0.0 => f64::NEG_INFINITY,
                (true, false) => 0.0,
            };
            let enough = estimable && n_m >= config.min_samples;
            let flagged = enough && z >= config.z_threshold && e >= config.min_effect;
            let quality = if enough {
                (-(e - 2.0 * std_error).max(0.0) / config.temperature).exp()
            } else {
                1.0
            };
            effects.push(MinerEffect {
                section: s,
                miner: name.clone(),
                samples: n_m,
                effect: e,
                std_error,
                z,
                flagged,
                quality,
            });
        }
    }
    ClaspReport {
        effects,
        residual_std: sigma,
        samples: n,
        windows: n_windows,
        dof,
    }
}

/// Each effect's variance in units of `sigma^2`: `c' (X'X)^-1 c` for the contrast `c` of a
/// miner against its section's sample-weighted mean, with `X` the design (window indicators,
/// then each section's levels after its first, treatment-coded).
///
/// For a balanced design this is `1/n_m - 1/N_s`; it grows where pathways are confounded.
/// Routing keeps samples to lanes, so the miners of two sections often share almost all their
/// samples: then their effects cannot be told apart, and the inverse's growth (infinite for an
/// exact confound, held finite here by a ridge of [`RIDGE`] times the mean diagonal) keeps
/// such effects from being flagged. Measured: with the balanced formula, two honest head miners of `network_hostile` whose 19 samples were
/// nearly confounded with the body's came out at +0.90 and -1.54 nats (z +-4.2) and one was
/// flagged (2026-11-28).
fn effect_variances(factors: &[Factor], win_of: &[usize], n_windows: usize) -> Vec<Vec<f64>> {
    // Column of each section's level (none for a section's first level).
    let mut offset = n_windows;
    let columns: Vec<Vec<Option<usize>>> = factors
        .iter()
        .map(|f| {
            let cols = (0..f.names.len())
                .map(|l| (l > 0).then(|| offset + l - 1))
                .collect();
            offset += f.names.len().saturating_sub(1);
            cols
        })
        .collect();
    let p = offset;
    let mut gram = vec![0.0f64; p * p];
    for (i, &w) in win_of.iter().enumerate() {
        let mut active = vec![w];
        for (f, cols) in factors.iter().zip(&columns) {
            if let Some(c) = f.of[i].and_then(|l| cols[l]) {
                active.push(c);
            }
        }
        for &a in &active {
            for &b in &active {
                gram[a * p + b] += 1.0;
            }
        }
    }
    let mean_diag = (0..p).map(|j| gram[j * p + j]).sum::<f64>() / p.max(1) as f64;
    for j in 0..p {
        gram[j * p + j] += RIDGE * mean_diag.max(1.0);
    }
    let chol = cholesky(&gram, p);
    factors
        .iter()
        .zip(&columns)
        .map(|(f, cols)| {
            let total = f.count.iter().sum::<usize>().max(1) as f64;
            (0..f.names.len())
                .map(|l| {
                    let mut c = vec![0.0; p];
                    for (k, col) in cols.iter().enumerate() {
                        if let Some(col) = col {
                            c[*col] -= f.count[k] as f64 / total;
                        }
                    }
                    if let Some(col) = cols[l] {
                        c[col] += 1.0;
                    }
                    match &chol {
                        Some(lower) => quadratic_inverse(lower, p, &c),
                        None => f64::INFINITY,
                    }
                })
                .collect()
        })
        .collect()
}

/// Ridge added to the normal matrix's diagonal, relative to its mean diagonal.
const RIDGE: f64 = 1e-10;

/// The lower Cholesky factor of the symmetric `p x p` matrix `a` (row-major), or `None` if
/// it is not positive definite.
fn cholesky(a: &[f64], p: usize) -> Option<Vec<f64>> {
    let mut l = vec![0.0f64; p * p];
    for i in 0..p {
        for j in 0..=i {
            let dot: f64 = (0..j).map(|k| l[i * p + k] * l[j * p + k]).sum();
            if i == j {
                let d = a[i * p + i] - dot;
                if d <= 0.0 || !d.is_finite() {
                    return None;
                }
                l[i * p + i] = d.sqrt();
            } else {
                l[i * p + j] = (a[i * p + j] - dot) / l[j * p + j];
            }
        }
    }
    Some(l)
}

/// `c' A^-1 c` from `A`'s lower Cholesky factor: `|L^-1 c|^2`.
fn quadratic_inverse(l: &[f64], p: usize, c: &[f64]) -> f64 {
    let mut y = vec![0.0f64; p];
    for i in 0..p {
        let dot: f64 = (0..i).map(|k| l[i * p + k] * y[k]).sum();
        y[i] = (c[i] - dot) / l[i * p + i];
    }
    y.iter().map(|v| v * v).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(sample: u64, loss: f64, path: &[&str]) -> LedgerEntry {
        LedgerEntry {
            sample,
            time: sample,
            loss,
            pathway: path.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    fn whole(window: usize) -> ClaspConfig {
        ClaspConfig {
            window,
            min_samples: 3,
            z_threshold: 3.0,
            min_effect: 0.1,
            temperature: 0.2,
        }
    }

    #[test]
    fn hand_computed_z_score_for_one_section() {
        // a: 1, 2, 3; b: 4, 5, 6; one window. Mean 3.5, effects -1.5 / +1.5, residuals
        // -1, 0, 1 twice: rss 4 over dof 6 - 1 window - 1 free effect = 4, sigma 1;
        // se = sqrt(1/3 - 1/6) = 0.408248; z_b = 1.5 / 0.408248 = 3.674235.
        let entries: Vec<_> = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
            .iter()
            .enumerate()
            .map(|(i, l)| entry(i as u64, *l, &[if i < 3 { "a" } else { "b" }]))
            .collect();
        let r = estimate(&entries, &whole(100));
        assert_eq!((r.samples, r.windows, r.dof), (6, 1, 4));
        assert!(close(r.residual_std, 1.0), "{r:?}");
        let b = r.effect(0, "b").unwrap();
        assert!(close(b.effect, 1.5) && close(b.std_error, (1.0f64 / 6.0).sqrt()));
        assert!((b.z - 3.674235).abs() < 1e-6, "{b:?}");
        assert!(b.flagged);
        // quality = exp(-(1.5 - 2 * 0.408248) / 0.2) = exp(-3.417517) = 0.032794
        assert!((b.quality - 0.032794).abs() < 1e-6, "{b:?}");
        let a = r.effect(0, "a").unwrap();
        assert!(close(a.effect, -1.5) && !a.flagged && a.quality == 1.0);
    }

    #[test]
    fn unbalanced_routing_does_not_confound_sections() {
        // Exact additive losses: base 3, a +0.5 / b -0.5 (section 0), c +0.1 / d -0.1.
        // a meets c three times and d once; b the opposite. Naive means would give a - b =
        // 1.1; the fit recovers 1.0 and 0.2 exactly.
        let loss = |p: &str, q: &str| {
            3.0 + if p == "a" { 0.5 } else { -0.5 } + if q == "c" { 0.1 } else { -0.1 }
        };
        let pairs = [
            ("a", "c"),
            ("a", "c"),
            ("a", "c"),
            ("a", "d"),
            ("b", "c"),
            ("b", "d"),
            ("b", "d"),
            ("b", "d"),
        ];
        let entries: Vec<_> = pairs
            .iter()
            .enumerate()
            .map(|(i, (p, q))| entry(i as u64, loss(p, q), &[p, q]))
            .collect();
        let r = estimate(&entries, &whole(100));
        assert!(close(r.effect(0, "a").unwrap().effect, 0.5), "{r:?}");
        assert!(close(r.effect(0, "b").unwrap().effect, -0.5));
        assert!(close(r.effect(1, "c").unwrap().effect, 0.1));
        assert!(close(r.effect(1, "d").unwrap().effect, -0.1));
        assert!(r.residual_std < 1e-9);
    }

    #[test]
    fn window_baseline_removes_the_downward_drift() {
        // The loss falls by 0.1 per sample. Miner "bad" adds +0.3 but only works in the
        // second half, when the loss is already lower; "x" and "y" work throughout.
        let mut entries = Vec::new();
        for i in 0..32u64 {
            let miner = match (i >= 16, i % 3) {
                (true, 0) => "bad",
                (_, 1) => "y",
                _ => "x",
            };
            let drift = 5.0 - 0.1 * i as f64;
            let effect = if miner == "bad" { 0.3 } else { 0.0 };
            // A little deterministic noise so sigma > 0.
            let noise = if i % 2 == 0 { 0.01 } else { -0.01 };
            entries.push(entry(i, drift + effect + noise, &[miner]));
        }
        // One window: the drift makes "bad" look better than the others.
        let one = estimate(&entries, &whole(1000));
        assert!(one.effect(0, "bad").unwrap().effect < 0.0, "{one:?}");
        // Windows of 4 samples: the effect comes back (the drift within a window is small).
        let windowed = estimate(&entries, &whole(4));
        let bad = windowed.effect(0, "bad").unwrap();
        assert!((bad.effect - 0.3).abs() < 0.12, "{bad:?}");
        assert!(bad.flagged, "{bad:?}");
        assert!(
            windowed
                .effects
                .iter()
                .filter(|e| e.miner != "bad")
                .all(|e| !e.flagged)
        );
    }

    #[test]
    fn effects_confounded_by_lanes_are_not_flagged() {
        // Two lanes: (a, c) and (b, d), a lane's loss 1 nat above the other's. Which section
        // is to blame cannot be told: nobody may be flagged.
        let mut entries = Vec::new();
        for i in 0..40u64 {
            let noise = [0.05, -0.05, 0.02, -0.02][i as usize % 4];
            if i % 2 == 0 {
                entries.push(entry(i, 4.0 + noise, &["a", "c"]));
            } else {
                entries.push(entry(i, 3.0 + noise, &["b", "d"]));
            }
        }
        let r = estimate(&entries, &whole(8));
        assert!(r.effects.iter().all(|e| !e.flagged), "{r:?}");
        assert!(r.effects.iter().all(|e| e.quality > 0.99), "{r:?}");
        // Two samples that cross the lanes make it estimable, from those two alone: the
        // error is far above the balanced formula's sigma * sqrt(1/n_a - 1/N).
        entries.push(entry(40, 3.5, &["a", "d"]));
        entries.push(entry(41, 3.5, &["b", "c"]));
        let r = estimate(&entries, &whole(8));
        let a = r.effect(0, "a").unwrap();
        let balanced = r.residual_std * (1.0 / 21.0 - 1.0 / 42.0f64).sqrt();
        assert!(a.std_error > 2.0 * balanced, "{a:?} against {balanced}");
        // Routed across the lanes the same effect is found and flagged, in section 0.
        let crossed: Vec<_> = (0..40u64)
            .map(|i| {
                let noise = [0.05, -0.05, 0.02, -0.02][i as usize % 4];
                let (p, q) = match i % 4 {
                    0 => ("a", "c"),
                    1 => ("a", "d"),
                    2 => ("b", "c"),
                    _ => ("b", "d"),
                };
                let bad = if p == "a" { 1.0 } else { 0.0 };
                entry(i, 3.0 + bad + noise, &[p, q])
            })
            .collect();
        let r = estimate(&crossed, &whole(8));
        let a = r.effect(0, "a").unwrap();
        assert!(a.flagged && (a.effect - 0.5).abs() < 0.05, "{a:?}");
        assert!(
            r.effects
                .iter()
                .filter(|e| e.miner != "a")
                .all(|e| !e.flagged)
        );
    }

    #[test]
    fn too_few_samples_flag_nobody() {
        let entries = vec![
            entry(0, 2.0, &["a"]),
            entry(1, 9.0, &["b"]),
            entry(2, 2.1, &["a"]),
        ];
        let r = estimate(&entries, &whole(100));
        assert!(r.effects.iter().all(|e| !e.flagged && e.quality == 1.0));
        // Non-finite losses are ignored, an empty ledger is an empty report.
        let r = estimate(&[entry(0, f64::NAN, &["a"])], &whole(4));
        assert_eq!((r.samples, r.effects.len()), (0, 0));
    }
}
