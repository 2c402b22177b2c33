//! Trimmed mean, a robust merge operator between the mean and the median.

use super::error::MergeError;
use super::inputs::{check, reduce_sorted_columns};

/// Checks that a trim fraction is finite and in `[0, 0.5)`.
///
/// # Errors
/// [`MergeError::InvalidTrimFraction`] otherwise.
pub fn validate_trim_fraction(fraction: f32) -> Result<(), MergeError> {
    if fraction.is_finite() && (0.0..0.5).contains(&fraction) {
        Ok(())
    } else {
        Err(MergeError::InvalidTrimFraction { fraction })
    }
}

/// Number of values dropped at each end of a column of `k` values for `fraction`:
/// `t = floor(fraction * k)`, with an allowance of `1e-4` so that the `f32` rounding of a
/// fraction such as `0.45` (stored as `0.44999998..`) does not lose one, and capped at
/// `(k - 1) / 2` so at least one value always remains.
pub fn trim_count(fraction: f32, k: usize) -> usize {
    let t = (f64::from(fraction) * k as f64 + 1e-4).floor();
    // `as usize` saturates; a negative or NaN product (rejected earlier anyway) becomes 0.
    (t as usize).min(k.saturating_sub(1) / 2)
}

/// Trimmed mean, coordinate by coordinate, over the contributors whose weight is `> 0`.
///
/// For `K` participating contributors, sort each coordinate's values, drop the
/// `t = `[`trim_count`]`(fraction, K)` smallest and `t` largest, and take the plain mean of the
/// `K - 2t` values left (in `f64`). `fraction = 0` is the plain mean; `t` is computed with
/// `floor` (as SciPy's `trim_mean` does), so few contributors may trim nothing.
///
/// As for the median, weights only decide who takes part: a robust operator must not let one
/// contributor buy influence by claiming more work. Scratch memory is one column of `K` values.
///
/// # Errors
/// - [`MergeError::InvalidTrimFraction`]: `fraction` not finite or not in `[0, 0.5)`;
/// - [`MergeError::NoContributors`], [`MergeError::WeightCount`],
///   [`MergeError::InvalidWeight`], [`MergeError::ZeroTotalWeight`],
///   [`MergeError::LengthMismatch`]: bad shape of the inputs;
/// - [`MergeError::NonFinite`]: a participating contributor holds NaN or an infinity.
pub fn trimmed_mean(
    contributors: &[&[f32]],
    weights: &[f32],
    fraction: f32,
) -> Result<Vec<f32>, MergeError> {
    validate_trim_fraction(fraction)?;
    let checked = check(contributors, weights)?;
    let k = checked.active.len();
    let t = trim_count(fraction, k);
    reduce_sorted_columns(contributors, &checked, |sorted| {
        let kept = sorted.get(t..k - t).unwrap_or(sorted);
        let sum: f64 = kept.iter().map(|&v| f64::from(v)).sum();
        (sum / kept.len().max(1) as f64) as f32
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOL: f32 = 1e-6;

    #[test]
    fn trim_count_examples() {
        assert_eq!(trim_count(0.2, 5), 1);
        assert_eq!(trim_count(0.2, 4), 0);
        assert_eq!(trim_count(0.45, 20), 9);
        assert_eq!(trim_count(0.0, 7), 0);
        // Capped so one value remains.
        assert_eq!(trim_count(0.499_999_97, 2), 0);
        assert_eq!(trim_count(0.3, 1), 0);
    }

    #[test]
    fn drops_extremes_then_averages() {
        // Column 0 sorted: [-100, 1, 2, 3, 50]; t = 1 -> mean(1, 2, 3) = 2.
        // Column 1 sorted: [0, 0, 4, 8, 9];     t = 1 -> mean(0, 4, 8) = 4.
        let cols = [
            [1.0f32, 0.0],
            [50.0, 9.0],
            [-100.0, 4.0],
            [3.0, 8.0],
            [2.0, 0.0],
        ];
        let refs: Vec<&[f32]> = cols.iter().map(|c| c.as_slice()).collect();
        let out = trimmed_mean(&refs, &[1.0; 5], 0.2).unwrap();
        assert!((out[0] - 2.0).abs() <= TOL);
        assert!((out[1] - 4.0).abs() <= TOL);
    }

    #[test]
    fn zero_fraction_is_the_plain_mean() {
        let a = [1.0f32, 2.0];
        let b = [2.0f32, 6.0];
        // Weights 1 and 9 do not matter: (1+2)/2 = 1.5, (2+6)/2 = 4.
        let out = trimmed_mean(&[&a, &b], &[1.0, 9.0], 0.0).unwrap();
        assert!((out[0] - 1.5).abs() <= TOL);
        assert!((out[1] - 4.0).abs() <= TOL);
    }

    #[test]
    fn rejects_bad_fraction_and_bad_inputs() {
        let a = [1.0f32];
        for fraction in [0.5, -0.1, f32::NAN, f32::INFINITY] {
            assert!(matches!(
                trimmed_mean(&[&a], &[1.0], fraction).unwrap_err(),
                MergeError::InvalidTrimFraction { .. }
            ));
        }
        let bad = [f32::NAN];
        assert_eq!(
            trimmed_mean(&[&a, &bad], &[1.0, 1.0], 0.1).unwrap_err(),
            MergeError::NonFinite {
                contributor: 1,
                index: 0
            }
        );
        assert_eq!(
            trimmed_mean(&[], &[], 0.1).unwrap_err(),
            MergeError::NoContributors
        );
    }
}
