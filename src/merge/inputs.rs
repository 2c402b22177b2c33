//! Input checks shared by every merge operator.
//!
//! The rules, applied before any value is read:
//! - at least one contributor ([`MergeError::NoContributors`]);
//! - exactly one weight per contributor ([`MergeError::WeightCount`]);
//! - every weight finite and `>= 0` ([`MergeError::InvalidWeight`]);
//! - at least one weight `> 0` ([`MergeError::ZeroTotalWeight`]): an all-zero weighting is
//!   treated as a caller bug rather than silently replaced by equal weights;
//! - every contributor as long as the first one ([`MergeError::LengthMismatch`]).
//!
//! A contributor with weight 0 takes no part in the merge: its values are never read (so its
//! NaNs are not reported), but its length is still checked.

use super::error::MergeError;

/// Number of coordinates an operator processes at a time, so that per-chunk scratch buffers
/// stay small (64 KiB of `f64`) however long the vectors are.
pub(crate) const CHUNK: usize = 8192;

/// Validated inputs of one merge.
#[derive(Debug)]
pub(crate) struct Checked {
    /// Common length of every contributor.
    pub len: usize,
    /// Indices of the contributors with a weight `> 0`, in input order.
    pub active: Vec<usize>,
    /// Sum of the weights, in `f64`.
    pub total_weight: f64,
}

/// Checks contributors and weights against the rules in the module doc.
pub(crate) fn check(contributors: &[&[f32]], weights: &[f32]) -> Result<Checked, MergeError> {
    let first = contributors.first().ok_or(MergeError::NoContributors)?;
    if weights.len() != contributors.len() {
        return Err(MergeError::WeightCount {
            expected: contributors.len(),
            got: weights.len(),
        });
    }
    let len = first.len();
    let mut active = Vec::with_capacity(contributors.len());
    let mut total_weight = 0.0f64;
    for (k, (values, &weight)) in contributors.iter().zip(weights).enumerate() {
        if !weight.is_finite() || weight < 0.0 {
            return Err(MergeError::InvalidWeight {
                contributor: k,
                weight,
            });
        }
        if values.len() != len {
            return Err(MergeError::LengthMismatch {
                expected: len,
                got: values.len(),
                contributor: k,
            });
        }
        if weight > 0.0 {
            active.push(k);
            total_weight += f64::from(weight);
        }
    }
    if active.is_empty() {
        return Err(MergeError::ZeroTotalWeight);
    }
    Ok(Checked {
        len,
        active,
        total_weight,
    })
}

/// Returns `Err(NonFinite)` naming contributor `k` and the absolute index of the first NaN or
/// infinity in `values`, which starts at absolute index `offset`.
pub(crate) fn check_finite(values: &[f32], k: usize, offset: usize) -> Result<(), MergeError> {
    match values.iter().position(|v| !v.is_finite()) {
        Some(i) => Err(MergeError::NonFinite {
            contributor: k,
            index: offset + i,
        }),
        None => Ok(()),
    }
}

/// Applies `reduce` to every coordinate's values, sorted ascending, of the active contributors.
///
/// Coordinates are checked for non-finite values chunk by chunk before they are gathered, so
/// the sort (by [`f32::total_cmp`]) only ever sees finite numbers. Scratch memory is one
/// `Vec` of `active.len()` values, reused for every coordinate.
pub(crate) fn reduce_sorted_columns(
    contributors: &[&[f32]],
    checked: &Checked,
    mut reduce: impl FnMut(&[f32]) -> f32,
) -> Result<Vec<f32>, MergeError> {
    let mut out = vec![0.0f32; checked.len];
    let mut column = Vec::with_capacity(checked.active.len());
    for (start, out_chunk) in (0..).step_by(CHUNK).zip(out.chunks_mut(CHUNK)) {
        let end = start + out_chunk.len();
        for &k in &checked.active {
            check_finite(&contributors[k][start..end], k, start)?;
        }
        for (i, o) in (start..end).zip(out_chunk.iter_mut()) {
            column.clear();
            column.extend(checked.active.iter().map(|&k| contributors[k][i]));
            column.sort_unstable_by(f32::total_cmp);
            *o = reduce(&column);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_valid_inputs_and_skips_zero_weights() {
        let a = [1.0f32, 2.0];
        let b = [3.0f32, 4.0];
        let c = [f32::NAN, 0.0];
        let checked = check(&[&a, &b, &c], &[1.0, 2.5, 0.0]).unwrap();
        assert_eq!(checked.len, 2);
        assert_eq!(checked.active, vec![0, 1]);
        assert!((checked.total_weight - 3.5).abs() < 1e-12);
    }

    #[test]
    fn rejects_each_bad_input_with_its_variant() {
        let a = [1.0f32, 2.0];
        let short = [1.0f32];
        assert_eq!(check(&[], &[]).unwrap_err(), MergeError::NoContributors);
        assert_eq!(
            check(&[&a, &a], &[1.0]).unwrap_err(),
            MergeError::WeightCount {
                expected: 2,
                got: 1
            }
        );
        assert_eq!(
            check(&[&a, &a], &[1.0, -1.0]).unwrap_err(),
            MergeError::InvalidWeight {
                contributor: 1,
                weight: -1.0
            }
        );
        assert!(matches!(
            check(&[&a], &[f32::NAN]).unwrap_err(),
            MergeError::InvalidWeight { contributor: 0, .. }
        ));
        assert_eq!(
            check(&[&a, &a], &[0.0, 0.0]).unwrap_err(),
            MergeError::ZeroTotalWeight
        );
        assert_eq!(
            check(&[&a, &short], &[1.0, 1.0]).unwrap_err(),
            MergeError::LengthMismatch {
                expected: 2,
                got: 1,
                contributor: 1
            }
        );
    }

    #[test]
    fn check_finite_reports_absolute_index() {
        assert_eq!(check_finite(&[1.0, 2.0], 3, 10), Ok(()));
        assert_eq!(
            check_finite(&[1.0, f32::INFINITY], 3, 10),
            Err(MergeError::NonFinite {
                contributor: 3,
                index: 11
            })
        );
    }
}
