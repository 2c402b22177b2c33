//! Cross-checking the redundant copies of one merged partition.
//!
//! Each partition is merged by `r` mergers from the same uploads, so honest copies agree.
//! The orchestrator compares the copies it received, keeps the majority's value and flags the
//! mergers that disagreed with it, sent garbage, or sent nothing. Every rule is deterministic:
//! given the same copies in the same order, every verifier reaches the same verdict.
//!
//! Rules, in order:
//! 1. A copy from a merger not assigned to the partition is ignored and flagged
//!    [`FlagReason::Unassigned`]; a second copy from the same merger is ignored (retries happen).
//! 2. A copy of the wrong length or with a NaN/infinity is flagged [`FlagReason::Invalid`] and
//!    set aside; an assigned merger with no copy is flagged [`FlagReason::Missing`].
//! 3. The remaining (valid) copies are grouped: a copy joins the first group whose first
//!    member it matches, by equal hash or else by [`values_agree`]; otherwise it starts a group.
//! 4. No valid copy: [`Verdict::FallbackToPrevious`]. One: [`Verdict::Single`] (nothing to
//!    compare it with; the caller may spot-check it). A group holding a strict majority of the
//!    valid copies: [`Verdict::Agreed`], and the members of other groups are flagged
//!    [`FlagReason::Disagreed`]. No strict majority (e.g. two copies that differ):
//!    [`Verdict::NeedsRecompute`]; the caller recomputes the partition from the uploads and
//!    calls [`judge_against_recomputed`] to learn whom to flag.

use serde::{Deserialize, Serialize};

/// How close two copies must be to count as the same result.
///
/// Two equally long copies `a`, `b` agree when
/// `max_i |a_i - b_i| <= relative * max(max_i |a_i|, max_i |b_i|)`:
/// the largest coordinate error, relative to the largest magnitude (the L-infinity norm). Using
/// the largest magnitude rather than the L2 norm keeps the test independent of the partition's
/// length. Two all-zero copies agree; an all-zero copy agrees with nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    /// Relative bound (default `1e-4`): far above the rounding differences between honest
    /// machines summing in a different order, far below any change that matters to training.
    pub relative: f32,
}

impl Default for Tolerance {
    fn default() -> Self {
        Self { relative: 1e-4 }
    }
}

/// One merged copy of a partition, as received from a merger.
#[derive(Debug, Clone, Copy)]
pub struct MergedCopy<'a> {
    /// Hotkey of the merger that uploaded it.
    pub merger: &'a str,
    /// Digest of the copy's bytes, computed by the verifier over what it downloaded (such as
    /// the storage payload hash or [`values_hash`]), never a digest the merger claims: equal
    /// digests are taken to mean equal values.
    pub hash: &'a [u8],
    /// The merged values, decoded to `f32`.
    pub values: &'a [f32],
}

/// Why a merger is flagged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FlagReason {
    /// Its copy disagreed with the accepted value (majority or recomputation).
    Disagreed,
    /// It was assigned the partition and sent no copy.
    Missing,
    /// Its copy had the wrong length or non-finite values.
    Invalid,
    /// It sent a copy of a partition it was not assigned.
    Unassigned,
}

/// A flagged merger and the reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Flag {
    /// Hotkey of the merger.
    pub merger: String,
    /// What it did wrong.
    pub reason: FlagReason,
}

/// What to do with the partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// A strict majority agreed: use `copies[copy]`; `support` copies agreed with it.
    Agreed {
        /// Index (into the given copies) of the copy to use.
        copy: usize,
        /// Number of valid copies in the majority.
        support: usize,
    },
    /// Exactly one valid copy arrived: use `copies[copy]`, unverified.
    Single {
        /// Index (into the given copies) of the copy to use.
        copy: usize,
    },
    /// Valid copies disagree with no strict majority: recompute the partition from the
    /// uploads, use that, and judge the copies with [`judge_against_recomputed`].
    NeedsRecompute,
    /// The copies were judged against a recomputation; use the recomputed values.
    Recomputed,
    /// No valid copy arrived: keep the previous global values for this partition, so every
    /// miner still ends the merge with identical weights.
    FallbackToPrevious,
}

/// The verdict and the mergers to flag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verification {
    /// What to do with the partition.
    pub verdict: Verdict,
    /// Flagged mergers, in the order: missing (assignment order), then copies in input order.
    pub flagged: Vec<Flag>,
}

/// BLAKE3 digest of `values` as little-endian `f32` bytes: a [`MergedCopy::hash`] for callers
/// that have no payload hash at hand.
pub fn values_hash(values: &[f32]) -> [u8; 32] {
    *crate::codec::f32_hash(values).as_bytes()
}

/// Whether two copies agree within `tol` (see [`Tolerance`]); copies of different lengths or
/// holding NaN never agree.
pub fn values_agree(a: &[f32], b: &[f32], tol: Tolerance) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut max_diff = 0.0f64;
    let mut scale = 0.0f64;
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        let diff = (x - y).abs();
        if diff.is_nan() {
            return false;
        }
        max_diff = max_diff.max(diff);
        scale = scale.max(x.abs()).max(y.abs());
    }
    max_diff <= f64::from(tol.relative) * scale
}

/// Judges the copies of one partition by the rules in the module doc.
///
/// `assigned` are the partition's mergers from the plan; `expected_len` its length.
pub fn verify_partition(
    assigned: &[String],
    copies: &[MergedCopy<'_>],
    expected_len: usize,
    tol: Tolerance,
) -> Verification {
    let (valid, mut flagged) = screen(assigned, copies, expected_len);
    let verdict = match valid.as_slice() {
        [] => Verdict::FallbackToPrevious,
        [only] => Verdict::Single { copy: *only },
        _ => {
            let groups = group(copies, &valid, tol);
            let largest = groups
                .iter()
                .enumerate()
                .max_by_key(|(i, g)| (g.len(), std::cmp::Reverse(*i)))
                .map(|(i, _)| i)
                .unwrap_or(0);
            let majority = groups.get(largest).filter(|g| 2 * g.len() > valid.len());
            match majority {
                Some(winners) => {
                    for &c in &valid {
                        if !winners.contains(&c) {
                            flagged.push(flag(copies[c].merger, FlagReason::Disagreed));
                        }
                    }
                    Verdict::Agreed {
                        copy: winners[0],
                        support: winners.len(),
                    }
                }
                None => Verdict::NeedsRecompute,
            }
        }
    };
    sort_flags(&mut flagged, assigned, copies);
    Verification { verdict, flagged }
}

/// Judges the copies against values the caller recomputed from the uploads itself (after
/// [`Verdict::NeedsRecompute`]): every valid copy that does not agree with `recomputed` within
/// `tol` is flagged [`FlagReason::Disagreed`]; missing, invalid and unassigned copies are
/// flagged as in [`verify_partition`]. The verdict is [`Verdict::Recomputed`].
pub fn judge_against_recomputed(
    assigned: &[String],
    copies: &[MergedCopy<'_>],
    recomputed: &[f32],
    tol: Tolerance,
) -> Verification {
    let (valid, mut flagged) = screen(assigned, copies, recomputed.len());
    for &c in &valid {
        if !values_agree(copies[c].values, recomputed, tol) {
            flagged.push(flag(copies[c].merger, FlagReason::Disagreed));
        }
    }
    sort_flags(&mut flagged, assigned, copies);
    Verification {
        verdict: Verdict::Recomputed,
        flagged,
    }
}

/// Rules 1 and 2: returns the indices of valid copies and the flags raised so far.
fn screen(
    assigned: &[String],
    copies: &[MergedCopy<'_>],
    expected_len: usize,
) -> (Vec<usize>, Vec<Flag>) {
    let mut valid = Vec::new();
    let mut flagged = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for (i, copy) in copies.iter().enumerate() {
        if !assigned.iter().any(|a| a == copy.merger) {
            flagged.push(flag(copy.merger, FlagReason::Unassigned));
            continue;
        }
        if seen.contains(&copy.merger) {
            continue;
        }
        seen.push(copy.merger);
        if copy.values.len() != expected_len || copy.values.iter().any(|v| !v.is_finite()) {
            flagged.push(flag(copy.merger, FlagReason::Invalid));
        } else {
            valid.push(i);
        }
    }
    for a in assigned {
        if !seen.contains(&a.as_str()) {
            flagged.push(flag(a, FlagReason::Missing));
        }
    }
    (valid, flagged)
}

/// Rule 3: groups valid copies (indices into `copies`) by agreement with each group's first.
fn group(copies: &[MergedCopy<'_>], valid: &[usize], tol: Tolerance) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for &c in valid {
        let copy = &copies[c];
        let home = groups.iter_mut().find(|g| {
            let first = &copies[g[0]];
            first.hash == copy.hash || values_agree(first.values, copy.values, tol)
        });
        match home {
            Some(g) => g.push(c),
            None => groups.push(vec![c]),
        }
    }
    groups
}

fn flag(merger: &str, reason: FlagReason) -> Flag {
    Flag {
        merger: merger.to_string(),
        reason,
    }
}

/// Orders flags as documented on [`Verification::flagged`]: missing first in assignment
/// order, then the others by the position of the merger's first copy.
fn sort_flags(flagged: &mut [Flag], assigned: &[String], copies: &[MergedCopy<'_>]) {
    let key = |f: &Flag| match f.reason {
        FlagReason::Missing => (0, assigned.iter().position(|a| *a == f.merger)),
        _ => (1, copies.iter().position(|c| c.merger == f.merger)),
    };
    flagged.sort_by_key(key);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assigned(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn copy<'a>(merger: &'a str, hash: &'a [u8], values: &'a [f32]) -> MergedCopy<'a> {
        MergedCopy {
            merger,
            hash,
            values,
        }
    }

    const GOOD: [f32; 3] = [1.0, -2.0, 4.0];
    const BAD: [f32; 3] = [1.0, -2.0, 5.0];

    #[test]
    fn agreeing_pair_by_hash() {
        let v = verify_partition(
            &assigned(&["a", "b"]),
            &[copy("a", b"h1", &GOOD), copy("b", b"h1", &GOOD)],
            3,
            Tolerance::default(),
        );
        assert_eq!(
            v.verdict,
            Verdict::Agreed {
                copy: 0,
                support: 2
            }
        );
        assert!(v.flagged.is_empty());
    }

    #[test]
    fn agreeing_pair_within_tolerance_despite_different_hashes() {
        // Largest diff 4e-5 <= 1e-4 * 4.
        let close = [1.0f32, -2.0, 4.00004];
        let v = verify_partition(
            &assigned(&["a", "b"]),
            &[copy("a", b"h1", &GOOD), copy("b", b"h2", &close)],
            3,
            Tolerance::default(),
        );
        assert_eq!(
            v.verdict,
            Verdict::Agreed {
                copy: 0,
                support: 2
            }
        );
        assert!(v.flagged.is_empty());
    }

    #[test]
    fn one_liar_among_three_is_flagged() {
        let v = verify_partition(
            &assigned(&["a", "b", "c"]),
            &[
                copy("a", b"bad", &BAD),
                copy("b", b"good", &GOOD),
                copy("c", b"good", &GOOD),
            ],
            3,
            Tolerance::default(),
        );
        assert_eq!(
            v.verdict,
            Verdict::Agreed {
                copy: 1,
                support: 2
            }
        );
        assert_eq!(v.flagged, vec![flag("a", FlagReason::Disagreed)]);
    }

    #[test]
    fn two_disagreeing_need_recompute_then_liar_is_flagged() {
        let names = assigned(&["a", "b"]);
        let copies = [copy("a", b"good", &GOOD), copy("b", b"bad", &BAD)];
        let v = verify_partition(&names, &copies, 3, Tolerance::default());
        assert_eq!(v.verdict, Verdict::NeedsRecompute);
        assert!(v.flagged.is_empty());
        let judged = judge_against_recomputed(&names, &copies, &GOOD, Tolerance::default());
        assert_eq!(judged.verdict, Verdict::Recomputed);
        assert_eq!(judged.flagged, vec![flag("b", FlagReason::Disagreed)]);
    }

    #[test]
    fn none_arrived_falls_back_and_flags_everyone_missing() {
        let v = verify_partition(&assigned(&["a", "b"]), &[], 3, Tolerance::default());
        assert_eq!(v.verdict, Verdict::FallbackToPrevious);
        assert_eq!(
            v.flagged,
            vec![
                flag("a", FlagReason::Missing),
                flag("b", FlagReason::Missing)
            ]
        );
    }

    #[test]
    fn one_present_is_used_unverified() {
        let v = verify_partition(
            &assigned(&["a", "b"]),
            &[copy("b", b"h", &GOOD)],
            3,
            Tolerance::default(),
        );
        assert_eq!(v.verdict, Verdict::Single { copy: 0 });
        assert_eq!(v.flagged, vec![flag("a", FlagReason::Missing)]);
    }

    #[test]
    fn invalid_unassigned_and_duplicate_copies() {
        let nan = [1.0f32, f32::NAN, 4.0];
        let short = [1.0f32];
        let v = verify_partition(
            &assigned(&["a", "b", "c"]),
            &[
                copy("a", b"x", &nan),
                copy("z", b"good", &GOOD),
                copy("b", b"good", &GOOD),
                copy("b", b"bad", &BAD),
                copy("c", b"s", &short),
            ],
            3,
            Tolerance::default(),
        );
        // Only b's first copy is valid.
        assert_eq!(v.verdict, Verdict::Single { copy: 2 });
        assert_eq!(
            v.flagged,
            vec![
                flag("a", FlagReason::Invalid),
                flag("z", FlagReason::Unassigned),
                flag("c", FlagReason::Invalid),
            ]
        );
    }

    #[test]
    fn even_split_without_majority_needs_recompute() {
        let v = verify_partition(
            &assigned(&["a", "b", "c", "d"]),
            &[
                copy("a", b"g", &GOOD),
                copy("b", b"x", &BAD),
                copy("c", b"g", &GOOD),
                copy("d", b"x", &BAD),
            ],
            3,
            Tolerance::default(),
        );
        assert_eq!(v.verdict, Verdict::NeedsRecompute);
    }

    #[test]
    fn agreement_rule_edges() {
        let tol = Tolerance::default();
        assert!(values_agree(&[0.0, 0.0], &[0.0, -0.0], tol));
        assert!(!values_agree(&[0.0], &[1e-30], tol));
        assert!(!values_agree(&[1.0], &[1.0, 2.0], tol));
        assert!(!values_agree(&[f32::NAN], &[f32::NAN], tol));
        // 1e-4 relative to the largest magnitude (1000): a diff of 0.09 at a small coordinate passes.
        assert!(values_agree(&[1000.0, 0.01], &[1000.0, 0.1], tol));
        assert!(!values_agree(&[1000.0, 0.01], &[1000.0, 0.2], tol));
    }

    #[test]
    fn values_hash_depends_on_every_value() {
        assert_eq!(values_hash(&GOOD), values_hash(&GOOD));
        assert_ne!(values_hash(&GOOD), values_hash(&BAD));
        assert_eq!(values_hash(&[]), *blake3::hash(b"").as_bytes());
    }
}
