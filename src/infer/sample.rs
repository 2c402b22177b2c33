//! [`Sampler`]: picks the next token from logits: greedy at temperature 0, otherwise a draw
//! from the softmax at that temperature, cut to its nucleus (top-p), with a seeded RNG so a
//! seed reproduces a generation.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::InferError;

/// How tokens are chosen.
#[derive(Debug, Clone)]
pub struct Sampler {
    temperature: f64,
    top_p: f64,
    rng: ChaCha8Rng,
}

impl Sampler {
    /// A sampler at `temperature` (0: greedy) keeping the smallest set of most likely tokens
    /// whose probability reaches `top_p` (1: all of them), drawing from a generator seeded
    /// with `seed`.
    ///
    /// # Errors
    /// [`InferError::BadInput`] for a negative or non-finite temperature, or a `top_p`
    /// outside `(0, 1]`.
    pub fn new(temperature: f64, top_p: f64, seed: u64) -> Result<Self, InferError> {
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(InferError::BadInput(format!(
                "--temperature {temperature}: must be 0 (greedy) or more"
            )));
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(InferError::BadInput(format!(
                "--top-p {top_p}: must be in (0, 1]"
            )));
        }
        Ok(Self {
            temperature,
            top_p,
            rng: ChaCha8Rng::seed_from_u64(seed),
        })
    }

    /// The next token id given the logits of every id. Non-finite logits are never picked
    /// (unless all are).
    pub fn pick(&mut self, logits: &[f32]) -> u32 {
        if self.temperature == 0.0 {
            return argmax(logits);
        }
        let finite = |v: f32| {
            if v.is_finite() {
                f64::from(v)
            } else {
                f64::NEG_INFINITY
            }
        };
        let max = logits
            .iter()
            .map(|&v| finite(v))
            .fold(f64::NEG_INFINITY, f64::max);
        if max == f64::NEG_INFINITY {
            return argmax(logits);
        }
        let weights: Vec<f64> = logits
            .iter()
            .map(|&v| ((finite(v) - max) / self.temperature).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        // Most likely first; ties by id, so the order does not depend on the sort.
        let mut order: Vec<usize> = (0..weights.len()).filter(|&i| weights[i] > 0.0).collect();
        order.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
        let mut kept = 0.0;
        let mut nucleus = 0;
        for &i in &order {
            kept += weights[i];
            nucleus += 1;
            if kept >= self.top_p * total {
                break;
            }
        }
        let mut u = self.rng.random::<f64>() * kept;
        for &i in &order[..nucleus] {
            u -= weights[i];
            if u < 0.0 {
                return i as u32;
            }
        }
        order[nucleus - 1] as u32
    }
}

/// The id of the largest finite logit (the lowest such id on ties; 0 when none is finite).
fn argmax(logits: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        if v.is_finite() && best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temperature_zero_is_greedy_and_ignores_non_finite_logits() {
        let mut s = Sampler::new(0.0, 1.0, 1).unwrap();
        assert_eq!(s.pick(&[0.1, 3.0, f32::NAN, 3.0, -1.0]), 1);
        assert_eq!(s.pick(&[f32::INFINITY, 0.5]), 1);
    }

    #[test]
    fn a_seed_reproduces_the_draws_and_another_seed_differs() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let draw = |seed| {
            let mut s = Sampler::new(1.0, 1.0, seed).unwrap();
            (0..64).map(|_| s.pick(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(5), draw(5));
        assert_ne!(draw(5), draw(6));
    }

    #[test]
    fn the_nucleus_keeps_only_the_most_likely_tokens() {
        // Probabilities about 0.64, 0.24, 0.09, 0.03: top-p 0.8 keeps the first two.
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        let mut s = Sampler::new(1.0, 0.8, 3).unwrap();
        let mut seen = [0usize; 4];
        for _ in 0..2000 {
            seen[s.pick(&logits) as usize] += 1;
        }
        assert_eq!(seen[2] + seen[3], 0, "{seen:?}");
        // Renormalised over the nucleus the first holds 0.73 of the draws.
        let share = seen[0] as f64 / 2000.0;
        assert!((share - 0.731).abs() < 0.04, "{seen:?}");
        // A tiny top-p is greedy.
        let mut s = Sampler::new(1.0, 1e-6, 3).unwrap();
        assert!((0..100).all(|_| s.pick(&logits) == 0));
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(Sampler::new(-0.5, 1.0, 0).is_err());
        assert!(Sampler::new(f64::NAN, 1.0, 0).is_err());
        assert!(Sampler::new(1.0, 0.0, 0).is_err());
        assert!(Sampler::new(1.0, 1.5, 0).is_err());
    }
}
