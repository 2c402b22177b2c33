//! Validator flags that act on routing: a miner flagged for one epoch by validators that agree
//! enough counts one *flagged window*; `validation.exclude_after_flags` flagged windows exclude
//! it from routing for `penalties.exclusion_s` (see `repo::standing`).
//!
//! Agreement, for miner `m` and epoch `e`, over the validators that published a vector for `e`:
//!
//! ```text
//! share(m, e) = sum of c_v over the validators v that flagged m in e
//! c_v         = stake_v / sum of every configured validator's stake  (combine: stake)
//!             = 1 / number of configured validators                  (combine: equal)
//! agreed      <=> share > validation.flag_quorum  and  at least min(2, V) validators flagged m
//! ```
//!
//! The denominator counts every configured validator, published or not, so a validator that
//! publishes first cannot reach the quorum alone by being the only one heard so far; and with
//! two or more validators one validator's flags never suffice, whatever its stake, so a single
//! lying (or broken) validator cannot exclude honest miners. Its flags still zero the miner in
//! its own vector, where the combination and the dissent measure of the metagraph show it.

use std::collections::BTreeMap;

use crate::api::{Combine, WeightSubmission};
use crate::orchestrator::config::ValidatorEntry;

/// A miner the validators agree to flag for one epoch.
#[derive(Debug, Clone, PartialEq)]
pub struct AgreedFlag {
    /// The miner.
    pub miner: String,
    /// The flagging validators' share (see the module docs).
    pub share: f64,
    /// The flagging validators and their first reason, `validator: reason`.
    pub reasons: Vec<String>,
}

impl AgreedFlag {
    /// One line for the standing ledger.
    pub fn reason(&self, epoch: u64) -> String {
        format!(
            "flagged in epoch {epoch} by validators holding {:.0}% of the validators' share: {}",
            self.share * 100.0,
            self.reasons.join("; ")
        )
    }
}

/// The miners flagged by agreeing validators among `published` (one epoch's vectors, by
/// validator hotkey); validators not in `validators` count for nothing.
pub fn agreed_flags(
    validators: &[ValidatorEntry],
    combine: Combine,
    quorum: f64,
    published: &[(String, WeightSubmission)],
) -> Vec<AgreedFlag> {
    let total: f64 = validators.iter().map(|v| v.stake.max(0.0)).sum();
    let share_of = |hotkey: &str| -> f64 {
        let Some(v) = validators.iter().find(|v| v.hotkey == hotkey) else {
            return 0.0;
        };
        match combine {
            Combine::Stake if total > 0.0 => v.stake.max(0.0) / total,
            _ => 1.0 / validators.len() as f64,
        }
    };
    let mut by_miner: BTreeMap<&str, (f64, Vec<String>)> = BTreeMap::new();
    for (validator, sub) in published {
        let c = share_of(validator);
        if c <= 0.0 {
            continue;
        }
        for w in &sub.weights {
            if let Some(first) = w.parts.flags.first() {
                let entry = by_miner.entry(w.hotkey.as_str()).or_default();
                entry.0 += c;
                entry.1.push(format!("{validator}: {first}"));
            }
        }
    }
    let needed = validators.len().min(2);
    by_miner
        .into_iter()
        .filter(|(_, (share, reasons))| *share > quorum && reasons.len() >= needed)
        .map(|(miner, (share, reasons))| AgreedFlag {
            miner: miner.to_string(),
            share,
            reasons,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MinerWeight, ScoreParts};

    fn entry(hotkey: &str, stake: f64) -> ValidatorEntry {
        ValidatorEntry {
            hotkey: hotkey.into(),
            stake,
        }
    }

    /// A vector flagging `flagged` (weight 0) and giving the rest equal weights.
    fn vector(miners: &[&str], flagged: &[&str]) -> WeightSubmission {
        let paid = (miners.len() - flagged.len()) as f64;
        WeightSubmission {
            epoch: 0,
            burn: 0.0,
            weights: miners
                .iter()
                .map(|m| {
                    let flags = if flagged.contains(m) {
                        vec![format!("replay of {m} failed")]
                    } else {
                        vec![]
                    };
                    let weight = if flags.is_empty() { 1.0 / paid } else { 0.0 };
                    MinerWeight {
                        hotkey: m.to_string(),
                        weight,
                        parts: ScoreParts {
                            throughput: 1.0,
                            replay: 1.0,
                            upload: 1.0,
                            clasp: 1.0,
                            quality: 1.0,
                            penalties: vec![],
                            penalty: 0.0,
                            flags,
                            notes: vec![],
                            score: weight,
                        },
                    }
                })
                .collect(),
        }
    }

    #[test]
    fn a_stake_majority_of_two_or_more_validators_is_needed() {
        let vals = [entry("v1", 3.0), entry("v2", 1.0), entry("v3", 1.0)];
        let miners = ["a", "b", "c"];
        let published = vec![
            ("v1".to_string(), vector(&miners, &["b", "c"])),
            ("v2".to_string(), vector(&miners, &["b"])),
            ("v3".to_string(), vector(&miners, &["a"])),
        ];
        let agreed = agreed_flags(&vals, Combine::Stake, 0.5, &published);
        // b: v1 + v2 = 4/5. c: v1 alone holds 3/5 but is one validator. a: v3 alone, 1/5.
        assert_eq!(agreed.len(), 1, "{agreed:?}");
        assert_eq!(agreed[0].miner, "b");
        assert!((agreed[0].share - 0.8).abs() < 1e-12);
        assert!(agreed[0].reason(4).contains("80%"));
        assert!(agreed[0].reason(4).contains("v2: replay of b failed"));
        // Equal shares: v2 + v3 agreeing on a would be 2/3.
        let published = vec![
            ("v2".to_string(), vector(&miners, &["a"])),
            ("v3".to_string(), vector(&miners, &["a"])),
        ];
        let agreed = agreed_flags(&vals, Combine::Equal, 0.5, &published);
        assert_eq!(agreed.len(), 1);
        assert!((agreed[0].share - 2.0 / 3.0).abs() < 1e-12);
        // Under stake the same two hold 2/5: not enough, and the silent v1 still counts.
        assert!(agreed_flags(&vals, Combine::Stake, 0.5, &published).is_empty());
    }

    #[test]
    fn a_lone_validator_decides_alone_and_strangers_count_for_nothing() {
        let one = [entry("v1", 1.0)];
        let miners = ["a", "b"];
        let published = vec![
            ("v1".to_string(), vector(&miners, &["a"])),
            ("intruder".to_string(), vector(&miners, &["b"])),
        ];
        let agreed = agreed_flags(&one, Combine::Stake, 0.5, &published);
        assert_eq!(agreed.len(), 1);
        assert_eq!((agreed[0].miner.as_str(), agreed[0].share), ("a", 1.0));
    }
}
