//! How much of every miner's work a window checks.
//!
//! Every miner with accepted work is replayed exactly ([`super::replay::Replayer`], from the
//! epoch's start state, in the order it worked) over a prefix of its epoch that holds
//! `max(min_items, ceil(fraction x n))` of its `n` checkable items ([`spot_count`],
//! [`prefix_len`]); `replay.miners_per_epoch` miners, drawn secretly, are replayed whole (their
//! upload compared too). A replay must start where the miner started (its weights move with
//! every step), so the cheap sample is a prefix; the secret full replays cover the rest.
//!
//! What that buys, computed:
//! - A miner that cheats on every item (noise, zeros, another sample's output, a faked tail
//!   loss) fails its first checked item, in every window.
//! - A miner that cheats on a random tenth of its items escapes one window's 22 items with
//!   probability at most `0.9^22` ([`miss_probability`]) and two windows' with at most
//!   `0.9^44` = 0.97%: caught within two windows with probability >= 99%.
//! - A miner that cheats only after the prefix is caught by a full replay, with probability
//!   `miners_per_epoch / miners` per window; a flag costs the window and
//!   `validation.probation_windows` more, so the expected loss exceeds the compute saved once
//!   that probability times `1 + probation_windows` exceeds 1 (10 windows of probation and 1
//!   full replay among up to 11 miners).

use crate::api::{SpotSettings, WorkKind};

/// How many of `n` checkable items a window checks: `max(min_items, ceil(fraction n))`, at
/// most `n`.
pub fn spot_count(n: usize, settings: &SpotSettings) -> usize {
    if settings.min_items == 0 {
        return 0;
    }
    let by_fraction = if settings.fraction.is_finite() && settings.fraction > 0.0 {
        (n as f64 * settings.fraction.min(1.0)).ceil() as usize
    } else {
        0
    };
    settings.min_items.max(by_fraction).min(n)
}

/// The probability that `k` items drawn without replacement from `n`, of which `bad` are
/// cheated, miss every cheated one (computed exactly).
pub fn miss_probability(n: usize, bad: usize, k: usize) -> f64 {
    if bad == 0 {
        return 1.0;
    }
    let mut p = 1.0;
    for i in 0..k.min(n) {
        let clean = n.saturating_sub(bad).saturating_sub(i);
        p *= clean as f64 / (n - i) as f64;
    }
    p
}

/// Whether an item of `kind` sends something a replay can compare (the head's backward sends
/// nothing: its effect is in the upload).
pub fn checkable(kind: WorkKind, head: bool) -> bool {
    match kind {
        WorkKind::Forward => true,
        WorkKind::Backward => !head,
        WorkKind::Eval => false,
    }
}

/// The shortest prefix of `kinds` that holds the window's [`spot_count`] checkable items.
pub fn prefix_len(kinds: &[WorkKind], head: bool, settings: &SpotSettings) -> usize {
    let n = kinds.iter().filter(|k| checkable(**k, head)).count();
    let want = spot_count(n, settings);
    if want == 0 {
        return 0;
    }
    let mut seen = 0;
    for (i, k) in kinds.iter().enumerate() {
        if checkable(*k, head) {
            seen += 1;
            if seen == want {
                return i + 1;
            }
        }
    }
    kinds.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_sample_catches_a_tenth_within_two_windows() {
        let s = SpotSettings::default();
        for n in [22usize, 50, 100, 400, 2000] {
            let k = spot_count(n, &s);
            let bad = n.div_ceil(10);
            let two_windows = miss_probability(n, bad, k).powi(2);
            assert!(two_windows <= 0.01, "n {n}: k {k}, missed {two_windows}");
        }
        assert_eq!(spot_count(10, &s), 10, "few items: all of them");
        assert_eq!(spot_count(1000, &s), 100, "the fraction above the floor");
        let off = SpotSettings { min_items: 0, ..s };
        assert_eq!(spot_count(50, &off), 0);
        // 0.9^22 by hand, for large n.
        assert!((miss_probability(1_000_000, 100_000, 22) - 0.9f64.powi(22)).abs() < 1e-4);
    }

    #[test]
    fn the_prefix_holds_the_checkable_items() {
        use WorkKind::{Backward as B, Eval as E, Forward as F};
        let s = SpotSettings {
            min_items: 3,
            fraction: 0.0,
        };
        let kinds = [F, B, E, F, B, F];
        assert_eq!(prefix_len(&kinds, false, &s), 4, "F B (E) F");
        assert_eq!(
            prefix_len(&kinds, true, &s),
            6,
            "the head's backwards do not count"
        );
        assert_eq!(prefix_len(&[F], false, &s), 1);
        assert_eq!(prefix_len(&[], false, &s), 0);
    }
}
