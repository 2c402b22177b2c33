//! Spot-checking a section's merge: recompute a few partitions from their sources (the
//! uploads, read by byte range) with the run's operator, and compare every merger's copy with
//! the recomputation. Independent of the orchestrator's own verification: a validator trusts
//! neither the mergers nor the verdicts it is told. Also counts assigned partitions a merger
//! never delivered.

use std::collections::BTreeMap;

use super::fetch::{FetchError, fetch_merge_object, fetch_range};
use super::tracking::Chooser;
use crate::api::MergeRecord;
use crate::codec::Span;
use crate::merge::{MergeError, PlanError, PlanSpec, Tolerance, merge_partition, values_agree};

/// What the spot-checks found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MergeFindings {
    /// `(merger, reason)` for every copy that differs from its recomputation.
    pub wrong: Vec<(String, String)>,
    /// Assigned partitions each merger did not deliver.
    pub missing: BTreeMap<String, u64>,
    /// Partitions recomputed.
    pub checked: Vec<usize>,
}

/// Why a merge could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum MergeCheckError {
    /// An object could not be read.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// The plan could not be rebuilt from the record.
    #[error("merge plan: {0}")]
    Plan(#[from] PlanError),
    /// The recomputation failed.
    #[error("merge: {0}")]
    Merge(#[from] MergeError),
}

/// Checks `checks` partitions (chosen by `chooser`) of the merge in `record`; `start` is the
/// state the section started the epoch from (what `dct` objects are a change from).
///
/// # Errors
/// [`MergeCheckError`] when sources cannot be read (a copy that cannot be read or does not
/// match its reported hash is the merger's fault and counts as wrong instead).
pub async fn check_merge(
    record: &MergeRecord,
    run: &str,
    chooser: &Chooser,
    checks: usize,
    start: &[f32],
) -> Result<MergeFindings, MergeCheckError> {
    let mut findings = MergeFindings::default();
    if record.uploads.is_empty() || record.partitions == 0 {
        return Ok(findings);
    }
    let plan = PlanSpec::new(
        run.to_string(),
        u32::try_from(record.section).unwrap_or(u32::MAX),
        record.epoch,
        record.uploads.iter().map(|u| u.hotkey.clone()),
        record.len,
    )
    .with_partitions(record.partitions)
    .with_replication(record.replication)
    .build()?;
    for part in plan.partitions() {
        for m in part.mergers() {
            let delivered = record
                .results
                .iter()
                .any(|r| r.partition == part.index() && &r.merger == m);
            if !delivered {
                *findings.missing.entry(m.clone()).or_insert(0) += 1;
            }
        }
    }
    let indices: Vec<String> = plan
        .partitions()
        .iter()
        .map(|p| p.index().to_string())
        .collect();
    let tolerance = Tolerance {
        relative: record.tolerance,
    };
    let sources: Vec<_> = record.uploads.iter().filter(|u| u.weight > 0.0).collect();
    let weights: Vec<f32> = sources.iter().map(|u| u.weight).collect();
    for chosen in chooser.pick(
        &format!("merge-{}", record.section),
        record.epoch,
        &indices,
        checks,
    ) {
        let Some(part) = plan
            .partitions()
            .iter()
            .find(|p| p.index().to_string() == *chosen)
        else {
            continue;
        };
        let range = part.range();
        let n = record.len as u64;
        let mut slices = Vec::with_capacity(sources.len());
        for u in &sources {
            slices.push(fetch_range(&u.blob, range.clone(), record.wire, n, start).await?);
        }
        let views: Vec<&[f32]> = slices.iter().map(Vec::as_slice).collect();
        // The copies went through the run's wire format; so does the recomputation.
        let span = Span::partition(range.start as u64, n / 3);
        let malformed = |e: crate::codec::MergeWireError| {
            FetchError::Malformed(format!("partition {}: {e}", part.index()))
        };
        let base = record
            .wire
            .base_of(start, range.len() as u64, span)
            .map_err(malformed)?;
        let merged = merge_partition(record.op, &views, &weights)?;
        let expected = record
            .wire
            .round_trip(&merged, span, base)
            .map_err(malformed)?;
        findings.checked.push(part.index());
        for copy in record
            .results
            .iter()
            .filter(|r| r.partition == part.index())
        {
            let len = range.len() as u64;
            let verdict = match fetch_merge_object(&copy.blob, record.wire, len, span, start).await
            {
                Ok(values) if values_agree(&values, &expected, tolerance) => None,
                Ok(values) => Some(format!(
                    "merged partition {} differs from its sources (max relative difference {:.3e})",
                    part.index(),
                    max_relative_difference(&values, &expected)
                )),
                Err(e) => Some(format!(
                    "merged partition {} cannot be read or does not match its hash: {e}",
                    part.index()
                )),
            };
            if let Some(reason) = verdict {
                findings.wrong.push((copy.merger.clone(), reason));
            }
        }
    }
    Ok(findings)
}

/// `max |a - b| / max(|a|, |b|)` over all values (infinite on a length mismatch).
fn max_relative_difference(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let (mut diff, mut scale) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        diff = diff.max((x - y).abs());
        scale = scale.max(x.abs()).max(y.abs());
    }
    if scale > 0.0 { diff / scale } else { diff }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_difference_is_hand_computed() {
        assert_eq!(max_relative_difference(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        // max diff 0.5, scale 4 -> 0.125.
        assert_eq!(max_relative_difference(&[1.0, 4.0], &[1.5, 4.0]), 0.125);
        assert!(max_relative_difference(&[1.0], &[1.0, 2.0]).is_infinite());
    }
}
