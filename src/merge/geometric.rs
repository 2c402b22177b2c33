//! Sign-aware weighted geometric mean.
//!
//! A plain geometric mean is undefined for negative numbers; parameters are signed. This
//! operator takes the geometric mean of the magnitudes and chooses the sign by weighted vote.

use super::error::MergeError;
use super::inputs::{CHUNK, check, check_finite};

/// Sign-aware weighted geometric mean, coordinate by coordinate. With `W = sum_k w_k`:
///
/// - magnitude: `exp(sum_k w_k * ln|x_k[i]| / W)`;
/// - sign: the sign of the vote `s = sum_k w_k * sign(x_k[i])` (weighted majority);
///   on a tie (`s == 0`) the sign of the weighted mean `sum_k w_k * x_k[i] / W`;
/// - exactly zero when any participating contributor is exactly `0` (or `-0`) at `i`, since
///   `ln 0 = -inf` drives the product to zero;
/// - exactly zero as well when both the vote and the weighted mean are zero (for example
///   `-2` and `2` with equal weights): no direction is preferred, so none is taken.
///
/// Computed in `f64`; the magnitude never exceeds the largest input magnitude (beyond
/// rounding), so the result is finite for finite inputs. Coordinates are processed 8192 at a
/// time. Contributors with weight 0 take no part: their values are not read.
///
/// # Errors
/// - [`MergeError::NoContributors`], [`MergeError::WeightCount`],
///   [`MergeError::InvalidWeight`], [`MergeError::ZeroTotalWeight`],
///   [`MergeError::LengthMismatch`]: bad shape of the inputs;
/// - [`MergeError::NonFinite`]: a contributor with a positive weight holds NaN or an infinity.
pub fn sign_aware_geometric_mean(
    contributors: &[&[f32]],
    weights: &[f32],
) -> Result<Vec<f32>, MergeError> {
    let checked = check(contributors, weights)?;
    let mut out = vec![0.0f32; checked.len];
    let scratch = CHUNK.min(checked.len);
    let mut log_sum = vec![0.0f64; scratch];
    let mut vote = vec![0.0f64; scratch];
    let mut sum = vec![0.0f64; scratch];
    let mut has_zero = vec![false; scratch];
    for (start, out_chunk) in (0..).step_by(CHUNK).zip(out.chunks_mut(CHUNK)) {
        let n = out_chunk.len();
        let end = start + n;
        log_sum[..n].fill(0.0);
        vote[..n].fill(0.0);
        sum[..n].fill(0.0);
        has_zero[..n].fill(false);
        for &k in &checked.active {
            let values = &contributors[k][start..end];
            check_finite(values, k, start)?;
            let w = f64::from(weights[k]);
            for (i, &v) in values.iter().enumerate() {
                let v = f64::from(v);
                if v == 0.0 {
                    has_zero[i] = true;
                    continue;
                }
                log_sum[i] += w * v.abs().ln();
                vote[i] += w * v.signum();
                sum[i] += w * v;
            }
        }
        for (i, o) in out_chunk.iter_mut().enumerate() {
            *o = combine(
                has_zero[i],
                log_sum[i],
                vote[i],
                sum[i],
                checked.total_weight,
            );
        }
    }
    Ok(out)
}

/// Turns the per-coordinate sums into the result, following the rules of
/// [`sign_aware_geometric_mean`].
fn combine(has_zero: bool, log_sum: f64, vote: f64, sum: f64, total_weight: f64) -> f32 {
    if has_zero {
        return 0.0;
    }
    let sign = if vote != 0.0 {
        vote.signum()
    } else if sum != 0.0 {
        sum.signum()
    } else {
        return 0.0;
    };
    // Rounding in exp(ln) could step just past f32::MAX for inputs at the very top of the range.
    let magnitude = (log_sum / total_weight).exp().min(f64::from(f32::MAX));
    (sign * magnitude) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Relative tolerance: results pass through exp/ln in f64 then round to f32.
    const REL_TOL: f32 = 1e-6;

    fn assert_close(got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let tol = REL_TOL * w.abs().max(1.0);
            assert!((g - w).abs() <= tol, "index {i}: got {g}, want {w}");
        }
    }

    #[test]
    fn positive_values_equal_weights() {
        // sqrt(2*8) = 4 ; sqrt(1*100) = 10 ; sqrt(0.5*0.5) = 0.5
        let a = [2.0f32, 1.0, 0.5];
        let b = [8.0f32, 100.0, 0.5];
        let out = sign_aware_geometric_mean(&[&a, &b], &[1.0, 1.0]).unwrap();
        assert_close(&out, &[4.0, 10.0, 0.5]);
    }

    #[test]
    fn weighted_magnitude_and_majority_sign() {
        // Magnitude with weights 1 and 3: exp((ln 16 + 3 ln 1)/4) = 16^(1/4) = 2.
        // Coordinate 0: signs (+, -), vote = 1 - 3 < 0 -> -2.
        // Coordinate 1: signs (-, +), vote = -1 + 3 > 0 -> +2.
        let a = [16.0f32, -16.0];
        let b = [-1.0f32, 1.0];
        let out = sign_aware_geometric_mean(&[&a, &b], &[1.0, 3.0]).unwrap();
        assert_close(&out, &[-2.0, 2.0]);
    }

    #[test]
    fn vote_tie_takes_sign_of_weighted_mean() {
        // Signs (+, -) with equal weights tie; mean (1 - 4)/2 < 0 so the result is -sqrt(4) = -2.
        let a = [1.0f32, -1.0];
        let b = [-4.0f32, 4.0];
        let out = sign_aware_geometric_mean(&[&a, &b], &[1.0, 1.0]).unwrap();
        assert_close(&out, &[-2.0, 2.0]);
    }

    #[test]
    fn zero_rules() {
        // Coordinate 0: one exact zero -> 0. Coordinate 1: -0.0 counts as zero -> 0.
        // Coordinate 2: +3 and -3 tie in vote and mean -> 0.
        let a = [0.0f32, -0.0, 3.0];
        let b = [5.0f32, 5.0, -3.0];
        let out = sign_aware_geometric_mean(&[&a, &b], &[1.0, 1.0]).unwrap();
        assert_eq!(out, vec![0.0, 0.0, 0.0]);
    }

    #[test]
    fn single_contributor_and_extremes_are_preserved() {
        let a = [f32::MAX, -f32::MAX, f32::MIN_POSITIVE, -3.5];
        let out = sign_aware_geometric_mean(&[&a], &[0.5]).unwrap();
        assert!(out.iter().all(|v| v.is_finite()));
        assert_close(&out, &a);
    }

    #[test]
    fn errors_name_the_contributor() {
        let a = [1.0f32, 2.0];
        let b = [1.0f32, f32::NAN];
        let c = [1.0f32, 2.0, 3.0];
        assert_eq!(
            sign_aware_geometric_mean(&[&a, &b], &[1.0, 1.0]).unwrap_err(),
            MergeError::NonFinite {
                contributor: 1,
                index: 1
            }
        );
        assert_eq!(
            sign_aware_geometric_mean(&[&a, &c], &[1.0, 1.0]).unwrap_err(),
            MergeError::LengthMismatch {
                expected: 2,
                got: 3,
                contributor: 1
            }
        );
        assert_eq!(
            sign_aware_geometric_mean(&[&a], &[0.0]).unwrap_err(),
            MergeError::ZeroTotalWeight
        );
    }
}
