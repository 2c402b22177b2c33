//! From scores to a normalized weight vector with the run's burn share.
//!
//! ```text
//! w_m  = (1 - burn) * score_m / sum_k score_k
//! burn = burn share, plus everything when no miner scored above 0
//! ```
//!
//! The vector (miners plus the burn entry) always sums to 1, and a miner with score 0 (a
//! flagged one included) gets weight 0.

/// A normalized weight vector.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightVector {
    /// `(hotkey, weight)` by hotkey.
    pub miners: Vec<(String, f64)>,
    /// The burned share.
    pub burn: f64,
}

impl WeightVector {
    /// Sum of every entry (1 up to rounding).
    pub fn total(&self) -> f64 {
        self.burn + self.miners.iter().map(|(_, w)| w).sum::<f64>()
    }

    /// The weight of `hotkey` (0 when absent).
    pub fn of(&self, hotkey: &str) -> f64 {
        self.miners
            .iter()
            .find(|(h, _)| h == hotkey)
            .map_or(0.0, |(_, w)| *w)
    }
}

/// Normalizes `scores` (non-finite or negative scores count as 0) with burn share `burn`
/// (clamped to `[0, 1]`).
pub fn normalize(scores: &[(String, f64)], burn: f64) -> WeightVector {
    let burn = if burn.is_finite() {
        burn.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let clean = |s: f64| if s.is_finite() && s > 0.0 { s } else { 0.0 };
    let total: f64 = scores.iter().map(|(_, s)| clean(*s)).sum();
    let mut miners: Vec<(String, f64)> = scores
        .iter()
        .map(|(h, s)| {
            let w = if total > 0.0 {
                (1.0 - burn) * clean(*s) / total
            } else {
                0.0
            };
            (h.clone(), w)
        })
        .collect();
    miners.sort_by(|a, b| a.0.cmp(&b.0));
    let burn = if total > 0.0 { burn } else { 1.0 };
    WeightVector { miners, burn }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scores(v: &[(&str, f64)]) -> Vec<(String, f64)> {
        v.iter().map(|(h, s)| (h.to_string(), *s)).collect()
    }

    #[test]
    fn hand_computed_vector_with_burn() {
        // Scores 30, 10, 0 with 20% burned: 0.8 * 3/4 = 0.6, 0.8 * 1/4 = 0.2, 0.
        let w = normalize(&scores(&[("b", 10.0), ("a", 30.0), ("c", 0.0)]), 0.2);
        assert_eq!(w.miners[0].0, "a");
        assert!((w.of("a") - 0.6).abs() < 1e-12 && (w.of("b") - 0.2).abs() < 1e-12);
        assert_eq!(w.of("c"), 0.0);
        assert!((w.burn - 0.2).abs() < 1e-12);
        assert!((w.total() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn nobody_scored_means_everything_is_burned() {
        let w = normalize(&scores(&[("a", 0.0), ("b", f64::NAN), ("c", -3.0)]), 0.0);
        assert_eq!(w.burn, 1.0);
        assert!(w.miners.iter().all(|(_, x)| *x == 0.0));
        assert_eq!(w.total(), 1.0);
        let w = normalize(&[], 0.5);
        assert_eq!((w.burn, w.miners.len()), (1.0, 0));
    }

    #[test]
    fn burn_is_clamped() {
        let w = normalize(&scores(&[("a", 1.0)]), 7.0);
        assert_eq!((w.of("a"), w.burn), (0.0, 1.0));
        let w = normalize(&scores(&[("a", 1.0)]), f64::NAN);
        assert_eq!((w.of("a"), w.burn), (1.0, 0.0));
    }
}
