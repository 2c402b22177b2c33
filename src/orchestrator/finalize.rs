//! Finalising one section's merge: verify every partition's copies, choose its values (the
//! agreed copy, the orchestrator's own recomputation, or the previous global values), apply the
//! optional outer step, and write the section checkpoint every miner then adopts.
//!
//! | copies | result |
//! |---|---|
//! | a majority agrees (hash, then tolerance) | the agreed copy; dissenters flagged `disagreed` |
//! | one valid copy (its twin died) | that copy, after the orchestrator recomputed and compared it |
//! | no majority | recomputed here from the uploads; copies that differ flagged |
//! | none | the previous global values (recomputed when there is no previous merge) |
//!
//! With a merge format that has a base (`dct`) every partition's values are a change from the
//! previous global state; the checkpoint is written twice: in `f32` (late joiners, validators)
//! and as the partitions' encodings back to back ([`StatePart::Delta`]), which miners that
//! hold the previous state download instead (far smaller), rebuild and check against the
//! checkpoint's hash. The `f32` checkpoint is, value for value, what that object decodes to.
//! A section that falls back to previous values for any partition writes no delta object.

use std::sync::Arc;

use bytes::Bytes;

use super::cycle_error::CycleError;
use super::reference::Reference;
use super::repo::{PlanRow, ResultRow, SectionOutcome};
use super::state::AppState;
use crate::codec::{MergeWire, Span};
use crate::merge::{
    FlagReason, MergePlan, MergedCopy, Partition, Tolerance, Verdict, f32_from_le_bytes,
    f32_to_le_bytes, judge_against_recomputed, merge_partition, values_hash, verify_partition,
};
use crate::model::layout::section_layout;
use crate::storage::{ObjectKey, StatePart, StorageError};

/// Values merged at a time when the orchestrator recomputes a partition.
const RECOMPUTE_CHUNK: usize = 1 << 20;

/// A partition copy loaded from storage.
struct Loaded {
    merger: String,
    hash: [u8; 32],
    /// Shared by the copies submitted with the same hash.
    values: Arc<Vec<f32>>,
    /// The copy as stored (what the delta object takes for an agreed copy).
    bytes: Bytes,
}

/// Verifies, assembles and stores the merged state of `section` for the merge of `epoch`, and
/// records verdicts, flags and the checkpoint.
///
/// # Errors
/// [`CycleError`] when storage fails or a stored object is not what the ledger says.
pub async fn finalize_section(
    state: &AppState,
    epoch: u64,
    section: usize,
    row: &PlanRow,
    plan: &MergePlan,
    results: &[ResultRow],
) -> Result<(), CycleError> {
    let layout = section_layout(&state.config.model, section)?;
    let params_len = usize::try_from(layout.params_len).unwrap_or(usize::MAX);
    let wire = state.config.merge.wire;
    let reference = Reference::of(state, section).await?;
    let previous = state.repo.latest_checkpoint(section)?.map(|cp| {
        (
            cp.epoch,
            state.checkpoint_key(section, cp.epoch, StatePart::Flat),
        )
    });
    let outer = match (state.config.merge.outer, &previous) {
        (Some(step), Some((prev_epoch, _))) => {
            let key = state.checkpoint_key(section, *prev_epoch, StatePart::OuterMomentum);
            let momentum = state.storage.exists(&key).await?.then_some(key);
            Some((step, momentum))
        }
        _ => None,
    };
    let tolerance = Tolerance {
        relative: state.config.merge.tolerance,
    };
    // The checkpoint (and the outer momentum) are written partition by partition: the
    // partitions tile the flat vector in order, so no more than one is held at a time.
    let mut out = state
        .storage
        .writer(&state.checkpoint_key(section, epoch + 1, StatePart::Flat));
    let mut momentum_out = outer.as_ref().map(|_| {
        state
            .storage
            .writer(&state.checkpoint_key(section, epoch + 1, StatePart::OuterMomentum))
    });
    let mut delta_out = wire.needs_base().then(|| {
        state
            .storage
            .writer(&state.checkpoint_key(section, epoch + 1, StatePart::Delta))
    });
    let mut outcome = SectionOutcome::default();
    // The checkpoint's hash, over the bytes as they are written.
    let mut hasher = blake3::Hasher::new();
    for part in plan.partitions() {
        let range = part.range();
        let part_span = Span::partition(range.start as u64, layout.params_len);
        // The previous global values of the partition's parameters (dct's base).
        let base_range = wire.base_range(range.len() as u64, part_span);
        let base = if base_range.is_empty() {
            Vec::new()
        } else {
            reference.values(state, base_range).await?
        };
        let copies = load_copies(state, epoch, section, part, results, part_span, &base).await;
        let views: Vec<MergedCopy<'_>> = copies
            .iter()
            .map(|c| MergedCopy {
                merger: &c.merger,
                hash: &c.hash,
                values: c.values.as_slice(),
            })
            .collect();
        let mut verification = verify_partition(part.mergers(), &views, range.len(), tolerance);
        // The partition's encoding for the delta object (`None`: only f32 values exist).
        let mut encoded: Option<Bytes> = None;
        let (mut values, verdict) = match verification.verdict {
            Verdict::Agreed { copy, support } => {
                encoded = Some(copies[copy].bytes.clone());
                (copies[copy].values.clone(), format!("agreed by {support}"))
            }
            Verdict::Single { copy } => {
                // Nobody can cross-check a lone copy, so the orchestrator does.
                let (values, bytes) = recompute(state, epoch, section, row, part, &base).await?;
                let judged = judge_against_recomputed(part.mergers(), &views, &values, tolerance);
                let agrees = judged
                    .flagged
                    .iter()
                    .all(|f| f.merger != copies[copy].merger);
                for flag in judged.flagged {
                    if !verification.flagged.contains(&flag) {
                        verification.flagged.push(flag);
                    }
                }
                if agrees {
                    encoded = Some(copies[copy].bytes.clone());
                    (copies[copy].values.clone(), "single copy".to_string())
                } else {
                    encoded = Some(Bytes::from(bytes));
                    (Arc::new(values), "recomputed".to_string())
                }
            }
            Verdict::FallbackToPrevious => match &previous {
                Some((_, key)) => (
                    Arc::new(read_values(state, key, range.clone()).await?),
                    "fallback to previous".to_string(),
                ),
                None => {
                    let (values, bytes) =
                        recompute(state, epoch, section, row, part, &base).await?;
                    encoded = Some(Bytes::from(bytes));
                    (
                        Arc::new(values),
                        "recomputed (no previous global)".to_string(),
                    )
                }
            },
            Verdict::NeedsRecompute | Verdict::Recomputed => {
                let (values, bytes) = recompute(state, epoch, section, row, part, &base).await?;
                verification = judge_against_recomputed(part.mergers(), &views, &values, tolerance);
                encoded = Some(Bytes::from(bytes));
                (Arc::new(values), "recomputed".to_string())
            }
        };
        for flag in &verification.flagged {
            let reason = match flag.reason {
                FlagReason::Disagreed => "disagreed",
                FlagReason::Missing => "missing",
                FlagReason::Invalid => "invalid",
                FlagReason::Unassigned => "unassigned",
            };
            tracing::warn!(epoch, section, partition = part.index(), merger = %flag.merger, reason, "merger flagged");
            outcome
                .flags
                .push((part.index(), flag.merger.clone(), reason.to_string()));
        }
        // The outer step applies to the parameter block only.
        let in_params = range.start..range.end.min(params_len);
        if let (Some((step, momentum_key)), Some((_, prev_key)), Some(writer)) =
            (&outer, &previous, momentum_out.as_mut())
            && !in_params.is_empty()
        {
            let prev = read_values(state, prev_key, in_params.clone()).await?;
            let mut momentum = match momentum_key {
                Some(key) => read_values(state, key, in_params.clone()).await?,
                None => vec![0.0; in_params.len()],
            };
            let values = Arc::make_mut(&mut values);
            step.apply(&prev, &mut values[..in_params.len()], &mut momentum)?;
            writer.write(&f32_to_le_bytes(&momentum)).await?;
            if wire.needs_base() {
                // The stepped values go through the format too, so the checkpoint is what the
                // delta object decodes to.
                let bytes = encode_partition(wire, values, part_span, &base, part.index())?;
                *values =
                    decode_partition(wire, &bytes, values.len(), part_span, &base, part.index())?;
                encoded = Some(Bytes::from(bytes));
            } else {
                // The encoding no longer holds these values.
                encoded = None;
            }
        }
        // In `f32` a copy's encoding is the checkpoint's bytes themselves.
        let bytes = match (&encoded, wire) {
            (Some(bytes), MergeWire::F32) => bytes.clone(),
            _ => Bytes::from(f32_to_le_bytes(&values)),
        };
        hasher.update(&bytes);
        out.write(&bytes).await?;
        match (encoded, delta_out.as_mut()) {
            (Some(bytes), Some(writer)) => writer.write(&bytes).await?,
            (None, Some(_)) => {
                // Values that exist only in f32 (the previous checkpoint's): no delta object.
                if let Some(writer) = delta_out.take() {
                    writer.abort().await;
                }
            }
            _ => {}
        }
        outcome.verdicts.push((part.index(), verdict));
    }
    if let Some(writer) = momentum_out {
        writer.finish().await?;
    }
    if let Some(writer) = delta_out {
        writer.finish().await?;
    }
    let size = out.finish().await?;
    let hash = hasher.finalize().to_hex().to_string();
    tracing::info!(epoch, section, hash = %hash, flags = outcome.flags.len(), "section merged");
    outcome.checkpoint = Some((hash, size));
    outcome.optimizer_step = merged_optimizer_step(state, epoch, section, row)?;
    state
        .repo
        .finalize_section(epoch, section, &outcome, state.now_ms())?;
    Ok(())
}

/// The AdamW step count of the merged moments: the previous checkpoint's (0 for the seed) plus
/// the most local optimizer steps an uploader took in the epoch, counted from its backwards in
/// the ledger (its merge weight), never from what a miner says.
fn merged_optimizer_step(
    state: &AppState,
    epoch: u64,
    section: usize,
    row: &PlanRow,
) -> Result<u64, CycleError> {
    let previous = state
        .repo
        .latest_checkpoint(section)?
        .map_or(0, |cp| cp.optimizer_step);
    if state.config.samples_per_step > 0 {
        // Synchronous steps: every miner stepped once per step of the epoch it worked in.
        let steps = state
            .repo
            .epoch_steps(epoch, state.config.samples_per_step)?;
        return Ok(previous.saturating_add(steps));
    }
    let local_steps = state.config.local_steps.max(1);
    let most = row
        .weights
        .iter()
        .map(|w| (w.max(0.0).round() as u64) / local_steps)
        .max()
        .unwrap_or(0);
    Ok(previous.saturating_add(most))
}

/// Values `range` (flat indices) of the f32 object under `key`.
async fn read_values(
    state: &AppState,
    key: &ObjectKey,
    range: std::ops::Range<usize>,
) -> Result<Vec<f32>, CycleError> {
    let bytes = state
        .storage
        .get_range(key, range.start as u64 * 4..range.end as u64 * 4)
        .await?;
    f32_from_le_bytes(&bytes)
        .filter(|v| v.len() == range.len())
        .ok_or_else(|| CycleError::BadObject {
            key: key.as_str().to_string(),
            reason: format!("range {range:?} is short"),
        })
}

/// The copies submitted for `part`; one that cannot be read or does not match its reported
/// hash is kept with no values, so verification flags it `invalid`. `base`: the previous
/// global values of the partition's parameters (for a format with a base).
///
/// Every copy is read and hashed; one whose bytes hash like a copy already decoded here is
/// the same bytes, so it shares that copy's values instead of being decoded again.
async fn load_copies(
    state: &AppState,
    epoch: u64,
    section: usize,
    part: &Partition,
    results: &[ResultRow],
    span: Span,
    base: &[f32],
) -> Vec<Loaded> {
    let wire = state.config.merge.wire;
    let len = part.range().len() as u64;
    let mut out: Vec<Loaded> = Vec::new();
    // Hashes of the copies decoded so far, with the copy holding their values.
    let mut decoded: Vec<(&str, usize)> = Vec::new();
    for r in results.iter().filter(|r| r.partition == part.index()) {
        let submitted = blake3::Hash::from_hex(&r.hash).ok();
        let (values, bytes) = match state.partition_key(section, epoch, part.index(), &r.merger) {
            // Exactly the partition's size, and the hash it was accepted with: a copy replaced
            // after it was submitted is neither read whole nor used.
            Ok(key) => match state
                .storage
                .get_exact(&key, wire.encoded_len(len, span))
                .await
            {
                // A copy that does not decode (a bad scale, a non-finite value, a malformed
                // sparse chunk) is invalid.
                Ok(bytes) if Some(blake3::hash(&bytes)) == submitted => {
                    let same = decoded
                        .iter()
                        .find(|(h, _)| h.eq_ignore_ascii_case(&r.hash));
                    if let Some(&(_, i)) = same {
                        let same = &out[i];
                        out.push(Loaded {
                            merger: r.merger.clone(),
                            hash: same.hash,
                            values: same.values.clone(),
                            bytes,
                        });
                        continue;
                    }
                    match wire.decode(&bytes, len, span, base) {
                        Ok(values) => {
                            decoded.push((r.hash.as_str(), out.len()));
                            // `f32` values hash like the bytes they were decoded from, which
                            // were just hashed: no need to hash them again.
                            let hash = match (wire, submitted) {
                                (MergeWire::F32, Some(h)) => *h.as_bytes(),
                                _ => values_hash(&values),
                            };
                            out.push(Loaded {
                                merger: r.merger.clone(),
                                hash,
                                values: Arc::new(values),
                                bytes,
                            });
                            continue;
                        }
                        Err(_) => (Vec::new(), Bytes::new()),
                    }
                }
                Ok(_) => (Vec::new(), Bytes::new()),
                Err(e) => {
                    tracing::warn!(merger = %r.merger, "cannot read a partition copy: {e}");
                    (Vec::new(), Bytes::new())
                }
            },
            Err(_) => (Vec::new(), Bytes::new()),
        };
        out.push(Loaded {
            merger: r.merger.clone(),
            hash: values_hash(&values),
            values: Arc::new(values),
            bytes,
        });
    }
    out
}

/// `values` of the partition at `span` in the run's merge format.
fn encode_partition(
    wire: MergeWire,
    values: &[f32],
    span: Span,
    base: &[f32],
    index: usize,
) -> Result<Vec<u8>, CycleError> {
    wire.encode(values, span, base)
        .map_err(|e| CycleError::BadObject {
            key: format!("partition {index} encoded"),
            reason: e.to_string(),
        })
}

/// The `n` values the partition's encoding `bytes` at `span` stands for.
fn decode_partition(
    wire: MergeWire,
    bytes: &[u8],
    n: usize,
    span: Span,
    base: &[f32],
    index: usize,
) -> Result<Vec<f32>, CycleError> {
    wire.decode(bytes, n as u64, span, base)
        .map_err(|e| CycleError::BadObject {
            key: format!("partition {index} decoded"),
            reason: e.to_string(),
        })
}

/// Merges `part` here, from the uploads (the same inputs the mergers were given), and returns
/// the values an honest merger's copy holds with that copy's encoding.
async fn recompute(
    state: &AppState,
    epoch: u64,
    section: usize,
    row: &PlanRow,
    part: &Partition,
    base: &[f32],
) -> Result<(Vec<f32>, Vec<u8>), CycleError> {
    let range = part.range();
    let sources = merge_sources(row);
    let mut keys = Vec::with_capacity(sources.len());
    for (miner, _) in &sources {
        keys.push(state.accepted_upload_key(section, epoch, miner)?);
    }
    let weights: Vec<f32> = sources.iter().map(|(_, w)| *w).collect();
    let n = row.len as u64;
    let span = Span::whole(n / 3);
    let wire = state.config.merge.wire;
    // Coordinate-wise operators: merge a chunk at a time, so memory stays at one chunk per
    // uploader however large the partition.
    let mut out = Vec::with_capacity(range.len());
    let mut start = range.start;
    while start < range.end {
        let end = (start + RECOMPUTE_CHUNK).min(range.end);
        // `base` starts at the partition's start; this chunk's part of it.
        let b = wire.base_range((end - start) as u64, span.shifted(start as u64));
        let from = (b.start as usize).saturating_sub(range.start);
        let chunk_base = base
            .get(from..from + (b.end - b.start) as usize)
            .unwrap_or_default();
        let mut slices = Vec::with_capacity(keys.len());
        for key in &keys {
            slices.push(read_upload(state, key, start..end, n, span, chunk_base).await?);
        }
        let views: Vec<&[f32]> = slices.iter().map(Vec::as_slice).collect();
        out.extend(merge_partition(state.config.merge.op, &views, &weights)?);
        start = end;
    }
    // An honest merger's copy went through the run's wire format: so does the recomputation,
    // so the two are equal value for value, and the checkpoint holds what the copies hold.
    let part_span = Span::partition(range.start as u64, n / 3);
    let bytes = encode_partition(wire, &out, part_span, base, part.index())?;
    let values = decode_partition(wire, &bytes, out.len(), part_span, base, part.index())?;
    Ok((values, bytes))
}

/// Values `range` (flat indices) of an accepted upload of `n` values in the run's merge wire
/// format (checked when it was accepted; decoded strictly again here).
async fn read_upload(
    state: &AppState,
    key: &ObjectKey,
    range: std::ops::Range<usize>,
    n: u64,
    span: Span,
    base: &[f32],
) -> Result<Vec<f32>, CycleError> {
    let wire: MergeWire = state.config.merge.wire;
    let elems = range.start as u64..range.end as u64;
    let bytes = state
        .storage
        .get_range(key, wire.byte_range(elems.clone(), n, span))
        .await?;
    wire.decode_range(&bytes, elems, n, span, base)
        .map_err(|e| CycleError::BadObject {
            key: key.as_str().to_string(),
            reason: e.to_string(),
        })
}

/// The uploaders that take part in the merge with their weights: those with a positive weight
/// (the plan row already replaced an all-zero weighting by equal weights).
pub fn merge_sources(row: &PlanRow) -> Vec<(String, f32)> {
    row.uploaders
        .iter()
        .cloned()
        .zip(row.weights.iter().copied())
        .filter(|(_, w)| *w > 0.0)
        .collect()
}

/// Ends the merge of `section` without a merged result, recording `reason`: the previous
/// global state (if there is one) is carried into the next epoch as the section's checkpoint,
/// so its miners adopt it as usual; when even that cannot be copied, the section ends with no
/// new checkpoint (its miners keep their weights). It always finishes, so a merge whose
/// inputs are broken cannot stall the run.
///
/// # Errors
/// Only a state-store error.
pub async fn fall_back(
    state: &AppState,
    epoch: u64,
    section: usize,
    reason: &str,
) -> Result<(), CycleError> {
    let mut outcome = SectionOutcome::default();
    let mut verdict = format!("fallback to previous: {reason}");
    // A delta object a failed attempt may have left is not this checkpoint's.
    let delta = state.checkpoint_key(section, epoch + 1, StatePart::Delta);
    if let Err(e) = state.storage.delete(&delta).await {
        tracing::warn!(epoch, section, "removing a stale checkpoint delta: {e}");
    }
    if let Some(cp) = state.repo.latest_checkpoint(section)? {
        let mut copied = Ok(());
        for part in [StatePart::Flat, StatePart::OuterMomentum] {
            let from = state.checkpoint_key(section, cp.epoch, part);
            let to = state.checkpoint_key(section, epoch + 1, part);
            match state.storage.copy(&from, &to).await {
                Ok(()) => {}
                // No outer momentum is kept without an outer step.
                Err(StorageError::NotFound { .. }) if part == StatePart::OuterMomentum => {}
                Err(e) => copied = Err(e),
            }
        }
        match copied {
            Ok(()) => outcome.checkpoint = Some((cp.hash, cp.bytes)),
            Err(e) => verdict.push_str(&format!(
                "; the previous state could not be copied ({e}): no new checkpoint"
            )),
        }
    } else {
        verdict.push_str("; there is no previous state: no new checkpoint");
    }
    outcome.verdicts.push((0, verdict));
    state
        .repo
        .finalize_section(epoch, section, &outcome, state.now_ms())?;
    Ok(())
}
