//! Weighted arithmetic mean, the default merge operator.

use super::error::MergeError;
use super::inputs::{CHUNK, check, check_finite};

/// Weighted arithmetic mean of `K` equally long vectors, coordinate by coordinate:
///
/// `out[i] = sum_k w_k * x_k[i] / sum_k w_k`
///
/// The sums are taken in `f64` and the result rounded to `f32` once, so the result does not
/// depend on how large `K` is beyond ordinary rounding. Coordinates are processed 8192 at a
/// time: extra memory is one small accumulator, not a copy of the inputs.
///
/// Contributors with weight 0 take no part: their values are not read.
///
/// # Errors
/// - [`MergeError::NoContributors`], [`MergeError::WeightCount`],
///   [`MergeError::InvalidWeight`], [`MergeError::ZeroTotalWeight`],
///   [`MergeError::LengthMismatch`]: bad shape of the inputs;
/// - [`MergeError::NonFinite`]: a contributor with a positive weight holds NaN or an infinity
///   (the first one found, chunk by chunk, is named).
pub fn weighted_mean(contributors: &[&[f32]], weights: &[f32]) -> Result<Vec<f32>, MergeError> {
    let checked = check(contributors, weights)?;
    let mut out = vec![0.0f32; checked.len];
    let mut acc = vec![0.0f64; CHUNK.min(checked.len)];
    for (start, out_chunk) in (0..).step_by(CHUNK).zip(out.chunks_mut(CHUNK)) {
        let end = start + out_chunk.len();
        let acc = &mut acc[..out_chunk.len()];
        acc.fill(0.0);
        for &k in &checked.active {
            let values = &contributors[k][start..end];
            check_finite(values, k, start)?;
            let w = f64::from(weights[k]);
            for (a, &v) in acc.iter_mut().zip(values) {
                *a += w * f64::from(v);
            }
        }
        for (o, &a) in out_chunk.iter_mut().zip(acc.iter()) {
            *o = (a / checked.total_weight) as f32;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOL: f32 = 1e-6;

    fn assert_close(got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= TOL, "index {i}: got {g}, want {w}");
        }
    }

    #[test]
    fn hand_computed_weighted_mean() {
        // (1*1 + 3*5) / 4 = 4 ; (1*-2 + 3*2) / 4 = 1 ; (1*0 + 3*1) / 4 = 0.75
        let a = [1.0f32, -2.0, 0.0];
        let b = [5.0f32, 2.0, 1.0];
        let out = weighted_mean(&[&a, &b], &[1.0, 3.0]).unwrap();
        assert_close(&out, &[4.0, 1.0, 0.75]);
    }

    #[test]
    fn single_contributor_is_returned_unchanged() {
        let a = [1.5f32, -7.25, 3.0e-8];
        let out = weighted_mean(&[&a], &[2.0]).unwrap();
        assert_eq!(out, a.to_vec());
    }

    #[test]
    fn zero_weight_contributor_is_ignored_even_with_nan() {
        let a = [2.0f32, 4.0];
        let b = [f32::NAN, 100.0];
        let out = weighted_mean(&[&a, &b], &[1.0, 0.0]).unwrap();
        assert_close(&out, &[2.0, 4.0]);
    }

    #[test]
    fn empty_vectors_give_empty_result() {
        let a: [f32; 0] = [];
        assert_eq!(
            weighted_mean(&[&a, &a], &[1.0, 1.0]).unwrap(),
            Vec::<f32>::new()
        );
    }

    #[test]
    fn spans_several_chunks() {
        // Length crosses two chunk borders; mean of i and 3i is 2i.
        let n = 2 * CHUNK + 5;
        let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..n).map(|i| 3.0 * i as f32).collect();
        let out = weighted_mean(&[&a, &b], &[1.0, 1.0]).unwrap();
        let want: Vec<f32> = (0..n).map(|i| 2.0 * i as f32).collect();
        assert_close(&out, &want);
    }

    #[test]
    fn non_finite_and_length_errors_name_the_contributor() {
        let a = [1.0f32, 2.0, 3.0];
        let b = [1.0f32, f32::NEG_INFINITY, 3.0];
        let c = [1.0f32];
        assert_eq!(
            weighted_mean(&[&a, &b], &[1.0, 1.0]).unwrap_err(),
            MergeError::NonFinite {
                contributor: 1,
                index: 1
            }
        );
        assert_eq!(
            weighted_mean(&[&a, &c], &[1.0, 1.0]).unwrap_err(),
            MergeError::LengthMismatch {
                expected: 3,
                got: 1,
                contributor: 1
            }
        );
        assert_eq!(
            weighted_mean(&[], &[]).unwrap_err(),
            MergeError::NoContributors
        );
    }
}
