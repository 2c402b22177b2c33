//! Coordinate-wise median, a robust merge operator.

use super::error::MergeError;
use super::inputs::{check, reduce_sorted_columns};

/// Plain (unweighted) coordinate-wise median of the contributors whose weight is `> 0`.
///
/// For `K` participating contributors sorted at coordinate `i` as `v_(1) <= .. <= v_(K)`:
/// `out[i] = v_((K+1)/2)` for odd `K`, and `(v_(K/2) + v_(K/2+1)) / 2` (in `f64`) for even `K`.
///
/// Weights only decide who takes part (weight 0 excludes a contributor); their size is ignored
/// on purpose: a robust operator must not let one contributor buy influence by claiming more
/// work. Scratch memory is one column of `K` values, reused for every coordinate.
///
/// # Errors
/// - [`MergeError::NoContributors`], [`MergeError::WeightCount`],
///   [`MergeError::InvalidWeight`], [`MergeError::ZeroTotalWeight`],
///   [`MergeError::LengthMismatch`]: bad shape of the inputs;
/// - [`MergeError::NonFinite`]: a participating contributor holds NaN or an infinity.
pub fn coordinate_median(contributors: &[&[f32]], weights: &[f32]) -> Result<Vec<f32>, MergeError> {
    let checked = check(contributors, weights)?;
    reduce_sorted_columns(contributors, &checked, median_of_sorted)
}

/// Median of a sorted, non-empty column (the caller guarantees at least one value).
fn median_of_sorted(sorted: &[f32]) -> f32 {
    let k = sorted.len();
    let upper = sorted.get(k / 2).copied().unwrap_or(0.0);
    if k % 2 == 1 {
        upper
    } else {
        let lower = sorted.get(k / 2 - 1).copied().unwrap_or(0.0);
        ((f64::from(lower) + f64::from(upper)) / 2.0) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_count_takes_middle_value() {
        let a = [1.0f32, 10.0, -3.0];
        let b = [100.0f32, 2.0, -1.0];
        let c = [3.0f32, 5.0, -2.0];
        let out = coordinate_median(&[&a, &b, &c], &[1.0, 1.0, 1.0]).unwrap();
        assert_eq!(out, vec![3.0, 5.0, -2.0]);
    }

    #[test]
    fn even_count_averages_the_two_middle_values() {
        // Sorted columns: [1, 2, 3, 1000] -> 2.5 ; [-4, -1, 0, 7] -> -0.5.
        let a = [1.0f32, 7.0];
        let b = [1000.0f32, -4.0];
        let c = [3.0f32, 0.0];
        let d = [2.0f32, -1.0];
        let out = coordinate_median(&[&a, &b, &c, &d], &[1.0, 1.0, 1.0, 1.0]).unwrap();
        assert!((out[0] - 2.5).abs() < 1e-6);
        assert!((out[1] + 0.5).abs() < 1e-6);
    }

    #[test]
    fn weights_only_select_participants() {
        // Weight size is ignored; weight 0 drops contributor c (its NaN is never read).
        let a = [1.0f32];
        let b = [5.0f32];
        let c = [f32::NAN];
        let d = [9.0f32];
        let out = coordinate_median(&[&a, &b, &c, &d], &[1.0, 100.0, 0.0, 1.0]).unwrap();
        assert_eq!(out, vec![5.0]);
    }

    #[test]
    fn single_contributor_and_errors() {
        let a = [4.0f32, -1.0];
        assert_eq!(coordinate_median(&[&a], &[1.0]).unwrap(), a.to_vec());
        let bad = [4.0f32, f32::INFINITY];
        assert_eq!(
            coordinate_median(&[&a, &bad], &[1.0, 1.0]).unwrap_err(),
            MergeError::NonFinite {
                contributor: 1,
                index: 1
            }
        );
        let short = [4.0f32];
        assert!(matches!(
            coordinate_median(&[&a, &short], &[1.0, 1.0]).unwrap_err(),
            MergeError::LengthMismatch { contributor: 1, .. }
        ));
    }
}
