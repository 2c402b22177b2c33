//! In-memory merge driver: dispatches a [`MergeOp`] over a partition or a whole vector.

use super::error::MergeError;
use super::geometric::sign_aware_geometric_mean;
use super::mean::weighted_mean;
use super::median::coordinate_median;
use super::op::MergeOp;
use super::plan::MergePlan;
use super::trimmed::trimmed_mean;

/// Merges one partition (or any set of equally long slices) with `op`.
///
/// `contributors[k]` is contributor `k`'s slice and `weights[k]` its weight (for example the
/// backward passes it did since the last merge). See each operator for its formula.
///
/// # Errors
/// Whatever the chosen operator reports: bad shapes, bad weights, non-finite values (naming
/// the contributor), or an invalid trim fraction.
pub fn merge_partition(
    op: MergeOp,
    contributors: &[&[f32]],
    weights: &[f32],
) -> Result<Vec<f32>, MergeError> {
    match op {
        MergeOp::Mean => weighted_mean(contributors, weights),
        MergeOp::Geometric => sign_aware_geometric_mean(contributors, weights),
        MergeOp::Median => coordinate_median(contributors, weights),
        MergeOp::Trimmed { fraction } => trimmed_mean(contributors, weights, fraction),
    }
}

/// Merges whole flat vectors partition by partition, as the butterfly network does, and
/// assembles the result. Every operator is coordinate-wise, so the result equals
/// [`merge_partition`] on the whole vectors; this function exists to exercise (and to let a
/// single machine simulate) the partitioned path. Memory beyond the result is one partition.
///
/// # Errors
/// - [`MergeError::LengthMismatch`]: a contributor is not `plan.flat_len()` long;
/// - [`MergeError::NonFinite`] with the absolute index, and every error of [`merge_partition`].
pub fn merge_with_plan(
    op: MergeOp,
    plan: &MergePlan,
    contributors: &[&[f32]],
    weights: &[f32],
) -> Result<Vec<f32>, MergeError> {
    let n = plan.flat_len();
    if let Some((k, c)) = contributors.iter().enumerate().find(|(_, c)| c.len() != n) {
        return Err(MergeError::LengthMismatch {
            expected: n,
            got: c.len(),
            contributor: k,
        });
    }
    let mut out = vec![0.0f32; n];
    for partition in plan.partitions() {
        let range = partition.range();
        let slices: Vec<&[f32]> = contributors.iter().map(|c| &c[range.clone()]).collect();
        let merged = merge_partition(op, &slices, weights).map_err(|err| match err {
            MergeError::NonFinite { contributor, index } => MergeError::NonFinite {
                contributor,
                index: range.start + index,
            },
            other => other,
        })?;
        out[range].copy_from_slice(&merged);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::plan::PlanSpec;
    use super::*;

    const TOL: f32 = 1e-5;

    fn assert_close(got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= TOL * w.abs().max(1.0),
                "index {i}: got {g}, want {w}"
            );
        }
    }

    /// Three contributors, four coordinates, weights 1, 1, 2. Expected values by hand:
    /// - mean: (a + b + 2c) / 4
    /// - geometric: |a b c^2|^(1/4) with the weighted sign vote
    /// - median / trimmed: plain statistics of the three values
    const A: [f32; 4] = [1.0, 2.0, -1.0, 8.0];
    const B: [f32; 4] = [3.0, 8.0, -4.0, -2.0];
    const C: [f32; 4] = [2.0, 4.0, 2.0, 4.0];
    const W: [f32; 3] = [1.0, 1.0, 2.0];

    #[test]
    fn every_operator_matches_hand_computation() {
        let inputs: [&[f32]; 3] = [&A, &B, &C];
        let cases = [
            // (1+3+4)/4 = 2 ; (2+8+8)/4 = 4.5 ; (-1-4+4)/4 = -0.25 ; (8-2+8)/4 = 3.5
            (MergeOp::Mean, [2.0, 4.5, -0.25, 3.5]),
            // |1*3*4|^(1/4) = 12^(1/4) ; |2*8*16|^(1/4) = 4 ;
            // |1*4*4|^(1/4) = 2 with vote -1-1+2 = 0 -> mean -0.25 < 0 -> -2 ;
            // |8*2*16|^(1/4) = 256^(1/4) = 4 with vote 1-1+2 > 0 -> +4.
            (MergeOp::Geometric, [12f32.powf(0.25), 4.0, -2.0, 4.0]),
            (MergeOp::Median, [2.0, 4.0, -1.0, 4.0]),
            // Three contributors with fraction 0.34: t = 1, so the trimmed mean is the median.
            (MergeOp::Trimmed { fraction: 0.34 }, [2.0, 4.0, -1.0, 4.0]),
            // Fraction 0: plain (unweighted) mean: 2, 14/3, -1, 10/3.
            (
                MergeOp::Trimmed { fraction: 0.0 },
                [2.0, 14.0 / 3.0, -1.0, 10.0 / 3.0],
            ),
        ];
        for (op, want) in cases {
            let got = merge_partition(op, &inputs, &W).unwrap();
            assert_close(&got, &want);
        }
    }

    #[test]
    fn merging_by_plan_equals_merging_whole_vectors() {
        let n = 1037;
        let contributors: Vec<Vec<f32>> = (0..5)
            .map(|k| {
                (0..n)
                    .map(|i| ((i * 7 + k * 13) % 23) as f32 - 11.0 + 0.25 * k as f32)
                    .collect()
            })
            .collect();
        let refs: Vec<&[f32]> = contributors.iter().map(Vec::as_slice).collect();
        let weights = [1.0, 2.0, 0.5, 3.0, 1.0];
        let uploaders = ["e", "d", "c", "b", "a"];
        let plan = PlanSpec::new("run", 0, 3, uploaders, n)
            .with_partitions(7)
            .build()
            .unwrap();
        for op in [
            MergeOp::Mean,
            MergeOp::Geometric,
            MergeOp::Median,
            MergeOp::Trimmed { fraction: 0.2 },
        ] {
            let whole = merge_partition(op, &refs, &weights).unwrap();
            let by_plan = merge_with_plan(op, &plan, &refs, &weights).unwrap();
            // Same arithmetic per coordinate, so the results are bit-identical.
            assert_eq!(whole, by_plan, "{op}");
        }
    }

    #[test]
    fn plan_errors_use_absolute_indices_and_check_lengths() {
        let n = 10;
        let plan = PlanSpec::new("run", 0, 0, ["a", "b"], n)
            .with_partitions(3)
            .build()
            .unwrap();
        let good = vec![1.0f32; n];
        let mut bad = vec![1.0f32; n];
        bad[8] = f32::NAN;
        assert_eq!(
            merge_with_plan(MergeOp::Mean, &plan, &[&good, &bad], &[1.0, 1.0]).unwrap_err(),
            MergeError::NonFinite {
                contributor: 1,
                index: 8
            }
        );
        let short = vec![1.0f32; n - 1];
        assert_eq!(
            merge_with_plan(MergeOp::Median, &plan, &[&good, &short], &[1.0, 1.0]).unwrap_err(),
            MergeError::LengthMismatch {
                expected: n,
                got: n - 1,
                contributor: 1
            }
        );
    }
}
