//! The score of one miner for one window (a training epoch and its merge):
//!
//! ```text
//! score = max(0, throughput * quality - penalty)      (0 when flagged)
//! quality = replay * upload * clasp                    (each in [0, 1]; 1 when not checked)
//! penalty = sum_k weight_k * count_k                   (in samples)
//! ```
//!
//! `throughput` is the miner's valid work in the window in compute units
//! ([`super::window::compute_units`]: its accepted results on completed samples weighted by
//! their FLOPs, so that one sample through the average section is 1 and every section pays
//! the same for the same compute; a failed check zeroes the whole window anyway). It is 0 for
//! an epoch whose work never reached the merge (no accepted upload).
//! A flag (failed replay or spot check, copy, CLASP outlier, lying merger, free-riding, an
//! upload that did not train, work without an upload) sets the score to 0 for the window, with
//! every reason kept. So does probation: a flag in one of the validator's recent windows.

pub use crate::api::{PenaltyKind, PenaltyWeights, ScoreParts};

/// What one window of checks found about one miner.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScoreInput {
    /// Valid throughput (compute units: samples through the average section).
    pub throughput: f64,
    /// Quality factor from replay (`None`: not replayed this window).
    pub replay: Option<f64>,
    /// Quality factor from the upload-quality check.
    pub upload: Option<f64>,
    /// Quality factor from CLASP.
    pub clasp: Option<f64>,
    /// Penalty counts.
    pub penalties: Vec<(PenaltyKind, u64)>,
    /// Reasons the miner is flagged this window (empty: not flagged).
    pub flags: Vec<String>,
    /// The epoch of a flag in a recent window: the miner is on probation and scores 0.
    pub probation: Option<u64>,
    /// What the checks measured (kept with the score).
    pub notes: Vec<String>,
}

/// Applies the formula of the module docs.
pub fn score(input: &ScoreInput, weights: &PenaltyWeights) -> ScoreParts {
    let factor = |f: Option<f64>| {
        f.map_or(1.0, |v| {
            if v.is_finite() {
                v.clamp(0.0, 1.0)
            } else {
                0.0
            }
        })
    };
    let (replay, upload, clasp) = (
        factor(input.replay),
        factor(input.upload),
        factor(input.clasp),
    );
    let quality = replay * upload * clasp;
    let mut penalties = input.penalties.clone();
    penalties.sort();
    let penalty: f64 = penalties
        .iter()
        .map(|(k, n)| weights.of(*k) * *n as f64)
        .sum();
    let throughput = if input.throughput.is_finite() {
        input.throughput.max(0.0)
    } else {
        0.0
    };
    let mut notes = input.notes.clone();
    if let Some(epoch) = input.probation {
        notes.push(format!(
            "probation: flagged in epoch {epoch}, within the last windows; scores 0"
        ));
    }
    let score = if input.flags.is_empty() && input.probation.is_none() {
        (throughput * quality - penalty).max(0.0)
    } else {
        0.0
    };
    ScoreParts {
        throughput,
        replay,
        upload,
        clasp,
        quality,
        penalties,
        penalty,
        flags: input.flags.clone(),
        notes,
        score,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed_scores() {
        let w = PenaltyWeights::default();
        // 40 samples x (0.9 x 1 x 0.5) - 2 missed deadlines x 2 = 18 - 4 = 14.
        let parts = score(
            &ScoreInput {
                throughput: 40.0,
                replay: Some(0.9),
                upload: None,
                clasp: Some(0.5),
                penalties: vec![(PenaltyKind::MissedDeadline, 2)],
                flags: vec![],
                notes: vec![],
                probation: None,
            },
            &w,
        );
        assert!((parts.quality - 0.45).abs() < 1e-12);
        assert!((parts.score - 14.0).abs() < 1e-12, "{parts:?}");
        assert_eq!(parts.upload, 1.0);
        // Penalties larger than the work floor at 0.
        let parts = score(
            &ScoreInput {
                throughput: 3.0,
                penalties: vec![(PenaltyKind::RefusedUpload, 1)],
                ..ScoreInput::default()
            },
            &w,
        );
        assert_eq!((parts.penalty, parts.score), (10.0, 0.0));
    }

    #[test]
    fn a_flag_zeroes_the_window_and_keeps_its_reason() {
        let parts = score(
            &ScoreInput {
                throughput: 100.0,
                flags: vec!["copy of 5Abc (cosine 1.0000)".into()],
                ..ScoreInput::default()
            },
            &PenaltyWeights::default(),
        );
        assert_eq!(parts.score, 0.0);
        assert_eq!(parts.flags.len(), 1);
        assert_eq!(parts.quality, 1.0, "the parts still show what was measured");
    }

    #[test]
    fn probation_zeroes_the_window_without_a_new_flag() {
        let parts = score(
            &ScoreInput {
                throughput: 100.0,
                probation: Some(3),
                ..ScoreInput::default()
            },
            &PenaltyWeights::default(),
        );
        assert_eq!(parts.score, 0.0);
        assert!(parts.flags.is_empty());
        assert!(parts.notes.iter().any(|n| n.contains("epoch 3")));
    }

    #[test]
    fn bad_numbers_cannot_raise_a_score() {
        let parts = score(
            &ScoreInput {
                throughput: f64::INFINITY,
                replay: Some(f64::NAN),
                upload: Some(7.0),
                ..ScoreInput::default()
            },
            &PenaltyWeights::default(),
        );
        assert_eq!(
            (parts.throughput, parts.replay, parts.upload),
            (0.0, 0.0, 1.0)
        );
        assert_eq!(parts.score, 0.0);
        assert!(
            PenaltyWeights {
                missed_deadline: -1.0,
                ..PenaltyWeights::default()
            }
            .validate()
            .is_err()
        );
    }
}
