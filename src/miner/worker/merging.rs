//! The miner's merge round: asks `/api/merge/task` until it is told to train again, doing each
//! task on the way (upload its flat state, merge its partitions, adopt the merged state).
//! A failing step is logged and retried at the next poll; it never stops the miner.
//!
//! With a merge format that has a base (`dct`) the miner keeps the parameters of the global
//! state it last adopted (the base every party decodes against) and its error feedback: what
//! the sparse encoding of its last uploads left out of its parameters' change, added to the
//! next upload so it is sent later instead of lost.
//!
//! What the miner moved itself is not read back ([`MergeHeld`]): its own range of each
//! partition it merges comes from the upload it holds (the source whose verified hash is its
//! upload's), and the checkpoint's ranges it merged come from its merged partitions, only the
//! rest being read from the checkpoint; the assembled state must hash to the checkpoint's hash,
//! or the whole checkpoint is downloaded. With two miners per section (each merges both
//! partitions) a miner's merge reads half of what it did and its adoption reads nothing.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use burn::tensor::backend::AutodiffBackend;
use bytes::Bytes;
use url::Url;

use super::{MergeBase, MinerError, Worker};
use crate::api::{
    BlobRef, CheckpointDelta, MergeSubmitRequest, MergeTask, MergeTaskRequest, PartitionTask,
    Phase, SectionCheckpoint, UploadManifest,
};
use crate::codec::{MergeWire, Span, f32_payload_hash};
use crate::compute::payload::{self, PayloadError};
use crate::merge::{FlatLayout, MergeOp, f32_from_le_bytes};
use crate::miner::adversary::Adversary;
use crate::miner::participant::{HeldUpload, MergeFormat, merge_partition_task};
use crate::storage::{payload_hash, upload_to_url};

/// Longest wait between two polls of the merge task.
const MAX_POLL: Duration = Duration::from_millis(1000);
/// First wait after a merge step: it doubles while there is nothing to do, up to the
/// orchestrator's suggested wait and [`MAX_POLL`], so the next step is picked up soon after
/// it becomes possible without polling fast through a long wait.
const MIN_POLL: Duration = Duration::from_millis(25);
/// Wait after a failed step.
const RETRY_AFTER_ERROR: Duration = Duration::from_millis(500);
/// Largest upload kept in memory after it is sent, to read the miner's own ranges from
/// instead of downloading them back (a larger state is not held twice).
const HOLD_UPLOAD_MAX_BYTES: usize = 1 << 30;

/// What a miner sent and computed in the current merge: its upload (its own ranges of every
/// partition it merges are read from here) and its merged partitions (a miner that merged
/// every partition of its section assembles the checkpoint from them, checked against the
/// checkpoint's hash, instead of downloading it). Cleared once a checkpoint is adopted.
#[derive(Debug, Default)]
pub(super) struct MergeHeld {
    /// Epoch, BLAKE3 hex and content of the upload.
    upload: Option<(u64, String, Bytes)>,
    /// Epoch of the merged partitions below.
    epoch: u64,
    /// Merged partitions accepted this merge: first flat index, value count, encoding.
    partitions: Vec<(u64, u64, Bytes)>,
    /// The merge format of those partitions.
    format: Option<MergeFormat>,
}

impl MergeHeld {
    /// The held partitions of the merge of `epoch` decoded, by first flat index, if there are
    /// any, they do not overlap, lie within `total` values, and the format decodes without a
    /// base (a format with one has its own delta object).
    fn decoded(&self, epoch: u64, total: u64) -> Option<Vec<(u64, Vec<f32>)>> {
        let format = self.format?;
        if self.epoch != epoch || format.wire.needs_base() || self.partitions.is_empty() {
            return None;
        }
        let mut parts: Vec<&(u64, u64, Bytes)> = self.partitions.iter().collect();
        parts.sort_by_key(|p| p.0);
        let mut end = 0;
        let mut out = Vec::with_capacity(parts.len());
        for (start, len, bytes) in parts {
            if *start < end || start.checked_add(*len)? > total {
                return None;
            }
            end = start + len;
            let span = Span::partition(*start, format.params_len);
            out.push((*start, format.wire.decode(bytes, *len, span, &[]).ok()?));
        }
        Some(out)
    }

    /// The encodings of the partitions of `epoch`'s merge held in `wire`, by first flat index
    /// and value count (empty for another epoch or format).
    fn encoded(&self, epoch: u64, wire: MergeWire) -> Vec<(u64, u64, &Bytes)> {
        match self.format {
            Some(format) if self.epoch == epoch && format.wire == wire => self
                .partitions
                .iter()
                .map(|(start, len, bytes)| (*start, *len, bytes))
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// A checkpoint's delta object (`wire`'s merged partitions ending at `bounds`, back to back)
/// read from `url`, its `size` bytes taken from `held` (encodings by first index and value
/// count) where a held partition has the delta's bounds and size, and read by byte range
/// between them; and how many of its bytes came from `held`. What the caller rebuilds from it
/// is checked against the checkpoint's hash, so a held copy that was not the one accepted
/// only costs a second, whole read.
async fn read_delta(
    url: &Url,
    wire: MergeWire,
    bounds: &[u64],
    params_len: u64,
    size: u64,
    held: &[(u64, u64, &Bytes)],
) -> Result<(Vec<u8>, u64), String> {
    // The held partitions that are the delta's, by byte offset in it.
    let mut mine: Vec<(u64, &Bytes)> = Vec::new();
    let (mut start, mut at) = (0u64, 0u64);
    for &end in bounds {
        let len = wire.encoded_len(end - start, Span::partition(start, params_len));
        if let Some((_, _, bytes)) = held
            .iter()
            .find(|(s, n, b)| *s == start && *n == end - start && b.len() as u64 == len)
        {
            mine.push((at, *bytes));
        }
        (start, at) = (end, at + len);
    }
    let used: u64 = mine.iter().map(|(_, b)| b.len() as u64).sum();
    if used == 0 {
        let bytes = crate::storage::download_from_url(url, None)
            .await
            .map_err(|e| e.to_string())?;
        return Ok((bytes.to_vec(), 0));
    }
    let read = |from: u64, to: u64| async move {
        let bytes = crate::storage::download_from_url(url, Some(from..to))
            .await
            .map_err(|e| e.to_string())?;
        if bytes.len() as u64 == to - from {
            Ok(bytes)
        } else {
            Err(format!("bytes {from}..{to}: {} read", bytes.len()))
        }
    };
    let pieces = mine.into_iter().map(|(at, b)| (at, b.iter().copied()));
    Ok((fill_between(pieces, size, read).await?, used))
}

/// The `total` items of an object: the `held` pieces (by first index, in order, not
/// overlapping) where there are any, and `read(from, to)` (which must give `to - from` items)
/// for each gap between them.
async fn fill_between<T, P, R, F, Fut>(
    held: impl IntoIterator<Item = (u64, P)>,
    total: u64,
    read: F,
) -> Result<Vec<T>, String>
where
    P: IntoIterator<Item = T>,
    R: IntoIterator<Item = T>,
    F: Fn(u64, u64) -> Fut,
    Fut: Future<Output = Result<R, String>>,
{
    let mut out = Vec::with_capacity(usize::try_from(total).map_err(|e| e.to_string())?);
    for (start, piece) in held {
        let at = out.len() as u64;
        if start > at {
            out.extend(read(at, start).await?);
        }
        out.extend(piece);
    }
    let at = out.len() as u64;
    if at < total {
        out.extend(read(at, total).await?);
    }
    Ok(out)
}

/// The `f32` checkpoint `blob` of `total` values, taken from `held` (decoded partitions by
/// first index, in order) where it has them and read by byte range from `blob` between
/// them; the result is only what the caller then checks against the checkpoint's hash.
async fn assemble_checkpoint(
    blob: &BlobRef,
    held: Vec<(u64, Vec<f32>)>,
    total: u64,
) -> Result<Vec<f32>, String> {
    let url = Url::parse(&blob.url).map_err(|e| e.to_string())?;
    let read = |from: u64, to: u64| {
        let url = url.clone();
        async move {
            let bytes = crate::storage::download_from_url(&url, Some(4 * from..4 * to))
                .await
                .map_err(|e| e.to_string())?;
            f32_from_le_bytes(&bytes)
                .filter(|v| v.len() as u64 == to - from)
                .ok_or_else(|| format!("values {from}..{to}: {} bytes", bytes.len()))
        }
    };
    fill_between(held, total, read).await
}

impl<B: AutodiffBackend> Worker<B> {
    /// Takes part in the merge until the orchestrator says to train (or `stop` is set).
    pub(super) async fn merge_round(&mut self, stop: &AtomicBool) {
        let mut pause = MIN_POLL;
        while !stop.load(Ordering::SeqCst) {
            let req = MergeTaskRequest {
                held_epoch: self.held_epoch,
            };
            let resp = match self.client.merge_task(&req).await {
                Ok(resp) => resp,
                Err(e) => {
                    tracing::warn!("merge task: {e}");
                    tokio::time::sleep(RETRY_AFTER_ERROR).await;
                    continue;
                }
            };
            let result = match resp.task {
                MergeTask::Train => {
                    // No newer merged state for this section: the weights held are current,
                    // and the new epoch starts from them.
                    self.start_training(resp.epoch);
                    return;
                }
                MergeTask::Wait { reason, retry_ms } => {
                    tracing::debug!(epoch = resp.epoch, "merge: waiting ({reason})");
                    let most = Duration::from_millis(retry_ms).min(MAX_POLL);
                    tokio::time::sleep(pause.min(most)).await;
                    pause = (pause * 2).min(most);
                    continue;
                }
                MergeTask::Upload {
                    epoch,
                    layout,
                    target,
                    wire,
                    ..
                } => {
                    if self.uploaded_epoch == Some(epoch) {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(MAX_POLL);
                        continue;
                    } else {
                        self.upload_state(epoch, &layout, &target, wire).await
                    }
                }
                MergeTask::Merge {
                    epoch,
                    op,
                    partitions,
                    wire,
                    params_len,
                } => {
                    let format = MergeFormat { wire, params_len };
                    self.merge_partitions(epoch, op, format, &partitions).await
                }
                MergeTask::Adopt { checkpoint } => {
                    let adopted = self.adopt(&checkpoint).await;
                    if adopted.is_ok() && resp.phase == Phase::Training {
                        // The run trains again already: asking once more would only hear so.
                        self.start_training(resp.epoch);
                        return;
                    }
                    adopted
                }
            };
            // A step was taken (or failed): the next one may be possible soon.
            pause = MIN_POLL;
            if let Err(e) = result {
                tracing::warn!(epoch = resp.epoch, "merge step failed (retrying): {e}");
                tokio::time::sleep(RETRY_AFTER_ERROR).await;
            }
        }
    }

    /// The parameters of the global state the miner last adopted (the initial state before
    /// any), for a format with a base: the section's latest checkpoint, which the orchestrator,
    /// the other mergers and the validators decode against too.
    fn base_params(&self, wire: MergeWire, params_len: u64) -> Result<&[f32], MinerError> {
        if !wire.needs_base() {
            return Ok(&[]);
        }
        let held = &self.merge_base;
        if held.params.len() as u64 != params_len {
            return Err(MinerError::Weights(format!(
                "the {wire} merge format needs the {params_len} parameters of the global state, \
                 this miner kept {} (of epoch {})",
                held.params.len(),
                held.epoch
            )));
        }
        Ok(&held.params)
    }

    /// Uploads the section's flat state for the merge of `epoch` and submits its manifest.
    async fn upload_state(
        &mut self,
        epoch: u64,
        layout: &FlatLayout,
        target: &BlobRef,
        wire: MergeWire,
    ) -> Result<(), MinerError> {
        // Gradients accumulated since the last step belong to this epoch (the last
        // synchronous step, or a partial group of `local_steps`): apply them first.
        let step = self.engine.flush();
        self.count_step(step.as_ref());
        let mut flat = self.engine.section().export_flat(layout)?;
        let span = Span::whole(layout.params_len);
        let p = usize::try_from(layout.params_len).unwrap_or(usize::MAX);
        // Error feedback: the parameters' change the last uploads could not carry.
        self.feedback.add_to(wire, &mut flat, p);
        if let Some(copier) = &self.copier {
            let section = u32::try_from(self.report.section).unwrap_or(u32::MAX);
            let global = self.base_params(wire, layout.params_len)?.to_vec();
            flat = copier
                .disguise(section, epoch, flat, wire, span, &global)
                .await;
        }
        let poisoner = self.adversary.is_some_and(Adversary::poisons_merges);
        if poisoner && epoch.is_multiple_of(2) {
            Adversary::poison(&mut flat, layout.params_len as usize);
        }
        let base = self.base_params(wire, layout.params_len)?;
        let bytes = wire
            .encode(&flat, span, base)
            .map_err(|e| MinerError::Weights(format!("encoding the state in {wire}: {e}")))?;
        if wire.needs_base() {
            // What the others will read back; the rest of the parameters' change is kept.
            let sent = wire
                .decode(&bytes, flat.len() as u64, span, base)
                .map_err(|e| MinerError::Weights(format!("decoding its own {wire} upload: {e}")))?;
            self.feedback.keep(wire, &flat, &sent, p);
        }
        let manifest = UploadManifest {
            layout: layout.clone(),
            dtype: wire.to_string(),
            hash: payload_hash(&bytes),
            bytes: bytes.len() as u64,
        };
        let url = Url::parse(&target.url).map_err(|e| PayloadError::BadUrl(e.to_string()))?;
        let bytes = Bytes::from(bytes);
        upload_to_url(&url, bytes.clone()).await?;
        self.merge_held.upload =
            (bytes.len() <= HOLD_UPLOAD_MAX_BYTES).then(|| (epoch, manifest.hash.clone(), bytes));
        let resp = self
            .client
            .merge_submit(&MergeSubmitRequest::Upload { epoch, manifest })
            .await?;
        self.uploaded_epoch = Some(epoch);
        self.report.uploads += 1;
        if poisoner {
            // The URL stays valid until the lease ends: try to swap what was accepted.
            if let Err(e) = upload_to_url(&url, Bytes::from_static(&[0u8; 16])).await {
                tracing::warn!(epoch, "poisoner: swapping the upload: {e}");
            }
        }
        if resp.accepted {
            tracing::info!(
                epoch,
                section = self.report.section,
                "merge: state uploaded"
            );
        } else {
            tracing::warn!(
                epoch,
                "merge: upload refused: {}",
                resp.reason.unwrap_or_default()
            );
        }
        Ok(())
    }

    /// Merges the given partitions and submits each result.
    async fn merge_partitions(
        &mut self,
        epoch: u64,
        op: MergeOp,
        format: MergeFormat,
        partitions: &[PartitionTask],
    ) -> Result<(), MinerError> {
        let global = self.base_params(format.wire, format.params_len)?.to_vec();
        if self.merge_held.epoch != epoch || self.merge_held.format != Some(format) {
            self.merge_held.epoch = epoch;
            self.merge_held.format = Some(format);
            self.merge_held.partitions.clear();
        }
        for task in partitions {
            let task = match self.adversary {
                Some(adv) => &adv.merge_task(task),
                None => task,
            };
            let held = match &self.merge_held.upload {
                Some((e, hash, bytes)) if *e == epoch => Some(HeldUpload { hash, bytes }),
                _ => None,
            };
            let merged = match merge_partition_task(epoch, op, format, task, &global, held).await {
                Ok(merged) => merged,
                Err(e) => {
                    tracing::warn!(epoch, partition = task.index, "merge: {e}");
                    continue;
                }
            };
            let resp = self.client.merge_submit(&merged.submit).await?;
            if resp.accepted {
                self.report.partitions_merged += 1;
                self.merge_held
                    .partitions
                    .retain(|(start, _, _)| *start != task.start);
                self.merge_held
                    .partitions
                    .push((task.start, task.end - task.start, merged.bytes));
                tracing::info!(epoch, partition = task.index, "merge: partition merged");
            } else {
                tracing::warn!(
                    epoch,
                    partition = task.index,
                    "merge: result refused: {}",
                    resp.reason.unwrap_or_default()
                );
            }
        }
        Ok(())
    }

    /// Loads a merged section state (hash-checked), forgets the old epoch's cached inputs and
    /// reports the hash of the state now held (the checkpoint's, which the loaded values were
    /// checked against).
    pub(super) async fn adopt(&mut self, checkpoint: &SectionCheckpoint) -> Result<(), MinerError> {
        if checkpoint.section != self.report.section {
            return Err(MinerError::Malformed {
                id: 0,
                reason: format!(
                    "checkpoint of section {} offered to a miner of section {}",
                    checkpoint.section, self.report.section
                ),
            });
        }
        let Some(want) = &checkpoint.blob.hash else {
            return Err(MinerError::Weights("the checkpoint has no hash".into()));
        };
        let rebuilt = match &checkpoint.delta {
            Some(delta) => self.rebuild(checkpoint, delta, want).await,
            None => None,
        };
        // The partitions merged here are the checkpoint's values in their ranges if the
        // copies this miner computed are the ones accepted: only the rest is read, and the
        // whole is checked against the checkpoint's hash (else it is downloaded whole).
        let total = checkpoint.layout.total_len() as u64;
        let held = match (&rebuilt, checkpoint.epoch.checked_sub(1)) {
            (None, Some(epoch)) => self.merge_held.decoded(epoch, total),
            _ => None,
        };
        self.merge_held = MergeHeld::default();
        let assembled = match (rebuilt, held) {
            (Some(flat), _) => Some(flat),
            (None, Some(held)) => match assemble_checkpoint(&checkpoint.blob, held, total).await {
                Ok(flat) if f32_payload_hash(&flat).eq_ignore_ascii_case(want) => Some(flat),
                Ok(_) => {
                    tracing::info!(
                        epoch = checkpoint.epoch,
                        "merge: the partitions merged here do not make up the checkpoint (an \
                         outer step, or other copies accepted): downloading it"
                    );
                    None
                }
                Err(e) => {
                    tracing::warn!(
                        epoch = checkpoint.epoch,
                        "merge: assembling the checkpoint: {e}"
                    );
                    None
                }
            },
            (None, None) => None,
        };
        let downloaded_whole = assembled.is_none();
        let flat = match assembled {
            Some(flat) => flat,
            None => {
                let bytes = payload::fetch(&checkpoint.blob).await?;
                f32_from_le_bytes(&bytes).ok_or_else(|| {
                    MinerError::Weights("checkpoint length is not a multiple of 4".into())
                })?
            }
        };
        // The step count goes with the merged moments, so every miner (late joiners and
        // restarted ones included) and every validator's replay continues from the same one.
        self.engine
            .adopt_flat(&checkpoint.layout, &flat, Some(checkpoint.optimizer_step))?;
        // Every path above checked `flat` against the checkpoint's hash, and the import is
        // exact (`flat_export_import_round_trips_bit_exactly`): so the state now held hashes to
        // it, without exporting and hashing it again (a self-report either way).
        let hash = want.to_ascii_lowercase();
        let p = usize::try_from(checkpoint.layout.params_len).unwrap_or(usize::MAX);
        self.merge_base = MergeBase {
            epoch: checkpoint.epoch,
            params: flat.get(..p).map(<[f32]>::to_vec).unwrap_or_default(),
        };
        self.held_epoch = checkpoint.epoch;
        self.report.adopted += 1;
        self.util.adopted += 1;
        if let Ok(mut w) = self.counters.weights.lock() {
            *w = (checkpoint.epoch, Some(hash.clone()));
        }
        tracing::info!(
            epoch = checkpoint.epoch,
            section = checkpoint.section,
            hash = %hash,
            downloaded_whole,
            "merge: adopted the merged state"
        );
        // The stats file and the orchestrator learn at once which weights this miner holds
        // (`iota bench merge` reads the merge's bytes from the file written here).
        self.write_stats(true);
        if let Err(e) = self.client.heartbeat(&self.counters.heartbeat()).await {
            tracing::warn!("heartbeat after adopting: {e}");
        }
        Ok(())
    }

    /// The checkpoint rebuilt from its delta against the state this miner holds, if it holds
    /// the delta's base and the result hashes to the checkpoint's hash (`want`); `None` (and a
    /// log line) otherwise, and the whole checkpoint is downloaded instead.
    async fn rebuild(
        &self,
        checkpoint: &SectionCheckpoint,
        delta: &CheckpointDelta,
        want: &str,
    ) -> Option<Vec<f32>> {
        let params_len = checkpoint.layout.params_len;
        if delta.base_epoch != self.merge_base.epoch
            || self.merge_base.params.len() as u64 != params_len
        {
            tracing::info!(
                base = delta.base_epoch,
                held = self.merge_base.epoch,
                "merge: the checkpoint's delta is against a state this miner does not hold"
            );
            return None;
        }
        let attempt = async {
            let size = delta
                .wire
                .partitions_len(&delta.bounds, params_len)
                .ok_or_else(|| "bounds that do not increase".to_string())?;
            if delta.bounds.last().copied() != Some(checkpoint.layout.total_len() as u64) {
                return Err("bounds that do not cover the flat state".to_string());
            }
            let url = Url::parse(&delta.blob.url).map_err(|e| e.to_string())?;
            // The partitions merged here are the delta's bytes in their ranges if this
            // miner's copies were the ones accepted: only the rest is read.
            let held = checkpoint
                .epoch
                .checked_sub(1)
                .map(|epoch| self.merge_held.encoded(epoch, delta.wire))
                .unwrap_or_default();
            let rebuild_from = |bytes: &[u8], from_held: u64| {
                if bytes.len() as u64 != size {
                    return Err(format!("{} bytes, expected {size}", bytes.len()));
                }
                let flat = delta
                    .wire
                    .decode_partitions(bytes, &delta.bounds, params_len, &self.merge_base.params)
                    .map_err(|e| e.to_string())?;
                let got = f32_payload_hash(&flat);
                if !got.eq_ignore_ascii_case(want) {
                    return Err(format!("the rebuilt state hashes to {got}, not {want}"));
                }
                tracing::info!(
                    epoch = checkpoint.epoch,
                    held_bytes = from_held,
                    read_bytes = size - from_held,
                    "merge: rebuilt the merged state from the checkpoint's delta"
                );
                Ok(flat)
            };
            let (bytes, from_held) =
                read_delta(&url, delta.wire, &delta.bounds, params_len, size, &held).await?;
            match rebuild_from(&bytes, from_held) {
                Err(e) if from_held > 0 => tracing::info!(
                    epoch = checkpoint.epoch,
                    "merge: the partitions merged here do not make up the checkpoint's delta \
                     ({e}): reading it whole"
                ),
                done => return done,
            }
            let (bytes, _) =
                read_delta(&url, delta.wire, &delta.bounds, params_len, size, &[]).await?;
            rebuild_from(&bytes, 0)
        };
        match attempt.await {
            Ok(flat) => Some(flat),
            Err(e) => {
                tracing::warn!(
                    epoch = checkpoint.epoch,
                    "merge: checkpoint delta unusable ({e}): downloading the whole state"
                );
                None
            }
        }
    }

    /// Goes back to training in epoch `epoch` from the weights held (a new epoch forgets the
    /// old one's cached inputs).
    fn start_training(&mut self, epoch: u64) {
        // What the merge round kept is of no use once training starts.
        self.merge_held = MergeHeld::default();
        if epoch > self.held_epoch {
            self.engine.begin_epoch();
        }
        self.held_epoch = self.held_epoch.max(epoch);
        self.set_weights_epoch();
    }

    fn set_weights_epoch(&self) {
        if let Ok(mut w) = self.counters.weights.lock()
            && w.0 < self.held_epoch
        {
            w.0 = self.held_epoch;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gaps between held pieces are read, in order, and only they.
    #[tokio::test]
    async fn fill_between_reads_only_the_gaps() {
        let object: Vec<u32> = (0..10).collect();
        let reads = std::sync::Mutex::new(Vec::new());
        let read = |from: u64, to: u64| {
            reads.lock().unwrap().push((from, to));
            let piece = object[from as usize..to as usize].to_vec();
            async move { Ok::<_, String>(piece) }
        };
        let held = vec![(2, vec![2, 3]), (6, vec![6])];
        assert_eq!(fill_between(held, 10, read).await.unwrap(), object);
        assert_eq!(*reads.lock().unwrap(), vec![(0, 2), (4, 6), (7, 10)]);
        reads.lock().unwrap().clear();
        let whole = vec![(0, object.clone())];
        assert_eq!(fill_between(whole, 10, read).await.unwrap(), object);
        assert!(reads.lock().unwrap().is_empty());
    }

    /// A delta whose every partition is held is taken from memory (the URL is never read:
    /// it names no server), and a held partition of the wrong bounds or size is not used.
    #[tokio::test]
    async fn a_delta_held_whole_is_not_read() {
        let wire: MergeWire = "q4v2".parse().unwrap();
        let (p, bounds) = (200u64, [300u64, 600]);
        let len0 = wire.encoded_len(300, Span::partition(0, p));
        let len1 = wire.encoded_len(300, Span::partition(300, p));
        let (a, b) = (
            Bytes::from(vec![1u8; len0 as usize]),
            Bytes::from(vec![2u8; len1 as usize]),
        );
        let url = Url::parse("http://127.0.0.1:9/delta").unwrap();
        let held = [(300, 300, &b), (0, 300, &a)];
        let (bytes, used) = read_delta(&url, wire, &bounds, p, len0 + len1, &held)
            .await
            .unwrap();
        assert_eq!(used, len0 + len1);
        assert_eq!(bytes, [a.to_vec(), b.to_vec()].concat());
        // Wrong bounds: nothing held matches, so the whole object is read (and fails here).
        let short = a.slice(1..);
        let wrong = [(0, 299, &a), (300, 300, &short)];
        assert!(
            read_delta(&url, wire, &bounds, p, len0 + len1, &wrong)
                .await
                .is_err()
        );
    }
}
