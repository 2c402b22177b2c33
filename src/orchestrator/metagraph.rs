//! The local metagraph: validators' weight vectors, checked on arrival, combined by stake or
//! equally, and each validator's distance from the others (so one that disagrees is visible).
//!
//! ```text
//! c_v      = stake_v / sum stake   (equal: 1 / V; stake with a zero total falls back to equal)
//! w_m      = sum_v c_v w_{v,m},    burn = sum_v c_v burn_v
//! distance = L1(vector_v, combination of the other validators)   (in [0, 2], burn included)
//! ```

use std::collections::BTreeMap;

use crate::api::{Combine, MinerWeight, WeightSubmission};

/// Largest distance of a vector's sum from 1 that is accepted.
pub const SUM_TOLERANCE: f64 = 1e-6;

/// One validator's vector, as the combination sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Vote {
    /// Stake.
    pub stake: f64,
    /// `hotkey -> weight`.
    pub weights: BTreeMap<String, f64>,
    /// Burned share.
    pub burn: f64,
}

/// A combined vector.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Combined {
    /// `hotkey -> weight`.
    pub weights: BTreeMap<String, f64>,
    /// Burned share.
    pub burn: f64,
}

impl Combined {
    /// L1 distance to `vote` (every hotkey of either, and the burn).
    pub fn distance(&self, vote: &Vote) -> f64 {
        let mut keys: Vec<&String> = self.weights.keys().chain(vote.weights.keys()).collect();
        keys.sort();
        keys.dedup();
        let at = |m: &BTreeMap<String, f64>, k: &String| m.get(k).copied().unwrap_or(0.0);
        keys.iter()
            .map(|k| (at(&self.weights, k) - at(&vote.weights, k)).abs())
            .sum::<f64>()
            + (self.burn - vote.burn).abs()
    }
}

/// Combines `votes` (none: an empty vector with no burn).
pub fn combine(votes: &[&Vote], mode: Combine) -> Combined {
    if votes.is_empty() {
        return Combined::default();
    }
    let total: f64 = votes.iter().map(|v| v.stake.max(0.0)).sum();
    let coefficient = |v: &Vote| match mode {
        Combine::Stake if total > 0.0 => v.stake.max(0.0) / total,
        _ => 1.0 / votes.len() as f64,
    };
    let mut out = Combined::default();
    for v in votes {
        let c = coefficient(v);
        for (k, w) in &v.weights {
            *out.weights.entry(k.clone()).or_insert(0.0) += c * w;
        }
        out.burn += c * v.burn;
    }
    out
}

/// Distance of each vote from the combination of the others (`None` with one vote).
pub fn distances(votes: &[Vote], mode: Combine) -> Vec<Option<f64>> {
    (0..votes.len())
        .map(|i| {
            let others: Vec<&Vote> = votes
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, v)| v)
                .collect();
            (!others.is_empty()).then(|| combine(&others, mode).distance(&votes[i]))
        })
        .collect()
}

/// Why a submitted vector is refused, if it is: weights must be finite and non-negative,
/// hotkeys unique and known (`is_miner`), the burn at least the run's and the whole sum 1.
pub fn check_submission(
    sub: &WeightSubmission,
    min_burn: f64,
    is_miner: impl Fn(&str) -> bool,
) -> Option<String> {
    if !(sub.burn.is_finite() && (0.0..=1.0).contains(&sub.burn)) {
        return Some(format!("burn {} is not in [0, 1]", sub.burn));
    }
    if sub.burn + SUM_TOLERANCE < min_burn {
        return Some(format!(
            "burn {} is below the run's burn share {min_burn}",
            sub.burn
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for MinerWeight { hotkey, weight, .. } in &sub.weights {
        if !(weight.is_finite() && *weight >= 0.0) {
            return Some(format!(
                "weight {weight} of {hotkey} is not finite and >= 0"
            ));
        }
        if !seen.insert(hotkey.as_str()) {
            return Some(format!("{hotkey} appears twice"));
        }
        if !is_miner(hotkey) {
            return Some(format!("{hotkey} is not a registered miner"));
        }
    }
    let sum = sub.burn + sub.weights.iter().map(|w| w.weight).sum::<f64>();
    if (sum - 1.0).abs() > SUM_TOLERANCE {
        return Some(format!("the weights and the burn sum to {sum}, not 1"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ScoreParts;

    fn vote(stake: f64, w: &[(&str, f64)], burn: f64) -> Vote {
        Vote {
            stake,
            weights: w.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            burn,
        }
    }

    #[test]
    fn hand_computed_stake_and_equal_combinations() {
        let a = vote(3.0, &[("x", 0.8), ("y", 0.0)], 0.2);
        let b = vote(1.0, &[("x", 0.0), ("y", 0.8)], 0.2);
        // Stake: 3/4 * 0.8 = 0.6 for x, 1/4 * 0.8 = 0.2 for y.
        let c = combine(&[&a, &b], Combine::Stake);
        assert!((c.weights["x"] - 0.6).abs() < 1e-12 && (c.weights["y"] - 0.2).abs() < 1e-12);
        assert!((c.burn - 0.2).abs() < 1e-12);
        // Equal: 0.4 each.
        let c = combine(&[&a, &b], Combine::Equal);
        assert!((c.weights["x"] - 0.4).abs() < 1e-12);
        // Zero stake everywhere falls back to equal.
        let z = [vote(0.0, &[("x", 1.0)], 0.0), vote(0.0, &[("y", 1.0)], 0.0)];
        let c = combine(&[&z[0], &z[1]], Combine::Stake);
        assert_eq!((c.weights["x"], c.weights["y"]), (0.5, 0.5));
    }

    #[test]
    fn the_dissenting_validator_stands_out() {
        let agree1 = vote(1.0, &[("x", 0.5), ("y", 0.5)], 0.0);
        let agree2 = vote(1.0, &[("x", 0.5), ("y", 0.5)], 0.0);
        let dissent = vote(1.0, &[("x", 0.0), ("y", 0.0), ("z", 1.0)], 0.0);
        let d = distances(&[agree1, agree2, dissent], Combine::Equal);
        // The dissenter: |0.5| + |0.5| + |1| = 2 from the other two.
        assert!((d[2].unwrap() - 2.0).abs() < 1e-12);
        // An agreeing one against (agree + dissent) / 2 = (0.25, 0.25, 0.5): 0.25+0.25+0.5 = 1.
        assert!((d[0].unwrap() - 1.0).abs() < 1e-12);
        assert_eq!(
            distances(&[vote(1.0, &[], 1.0)], Combine::Equal),
            vec![None]
        );
    }

    #[test]
    fn submissions_are_checked() {
        let parts = ScoreParts {
            throughput: 1.0,
            replay: 1.0,
            upload: 1.0,
            clasp: 1.0,
            quality: 1.0,
            penalties: vec![],
            penalty: 0.0,
            flags: vec![],
            notes: vec![],
            score: 1.0,
        };
        let w = |h: &str, x: f64| MinerWeight {
            hotkey: h.into(),
            weight: x,
            parts: parts.clone(),
        };
        let ok = WeightSubmission {
            epoch: 0,
            burn: 0.2,
            weights: vec![w("a", 0.5), w("b", 0.3)],
        };
        let known = |h: &str| h == "a" || h == "b";
        assert_eq!(check_submission(&ok, 0.2, known), None);
        assert!(
            check_submission(&ok, 0.5, known)
                .unwrap()
                .contains("burn share")
        );
        let mut bad = ok.clone();
        bad.weights[1].weight = 0.4;
        assert!(
            check_submission(&bad, 0.0, known)
                .unwrap()
                .contains("sum to")
        );
        let mut bad = ok.clone();
        bad.weights[1].hotkey = "c".into();
        assert!(
            check_submission(&bad, 0.0, known)
                .unwrap()
                .contains("not a registered")
        );
        let mut bad = ok.clone();
        bad.weights[1].hotkey = "a".into();
        assert!(
            check_submission(&bad, 0.0, known)
                .unwrap()
                .contains("twice")
        );
        let mut bad = ok;
        bad.weights[0].weight = f64::NAN;
        assert!(check_submission(&bad, 0.0, known).is_some());
    }
}
