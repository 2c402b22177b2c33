//! The miner's merge round: asks `/api/merge/task` until it is told to train again, doing each
//! task on the way (upload its flat state, merge its partitions, adopt the merged state).
//! A failing step is logged and retried at the next poll; it never stops the miner.
//!
//! With a merge format that has a base (`dct`) the miner keeps the parameters of the global
//! state it last adopted (the base every party decodes against) and its error feedback: what
//! the sparse encoding of its last uploads left out of its parameters' change, added to the
//! next upload so it is sent later instead of lost.

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
use crate::codec::{MergeWire, Span};
use crate::merge::{FlatLayout, MergeOp, f32_from_le_bytes, f32_to_le_bytes};
use crate::miner::adversary::Adversary;
use crate::miner::participant::{MergeFormat, merge_partition_task};
use crate::miner::payload::{self, PayloadError};
use crate::storage::{payload_hash, upload_to_url};

/// Longest wait between two polls of the merge task.
const MAX_POLL: Duration = Duration::from_millis(1000);
/// First wait after a merge step: it doubles while there is nothing to do, up to the
/// orchestrator's suggested wait and [`MAX_POLL`], so the next step is picked up soon after
/// it becomes possible without polling fast through a long wait.
const MIN_POLL: Duration = Duration::from_millis(25);
/// Wait after a failed step.
const RETRY_AFTER_ERROR: Duration = Duration::from_millis(500);

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
        upload_to_url(&url, Bytes::from(bytes)).await?;
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
        for task in partitions {
            let task = match self.adversary {
                Some(adv) => &adv.merge_task(task),
                None => task,
            };
            let submit = match merge_partition_task(epoch, op, format, task, &global).await {
                Ok(submit) => submit,
                Err(e) => {
                    tracing::warn!(epoch, partition = task.index, "merge: {e}");
                    continue;
                }
            };
            let resp = self.client.merge_submit(&submit).await?;
            if resp.accepted {
                self.report.partitions_merged += 1;
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
    /// reports the hash of the state now held, computed from the model itself.
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
        let flat = match rebuilt {
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
        let held = f32_to_le_bytes(&self.engine.section().export_flat(&checkpoint.layout)?);
        let hash = payload_hash(&held);
        let p = usize::try_from(checkpoint.layout.params_len).unwrap_or(usize::MAX);
        self.merge_base = MergeBase {
            epoch: checkpoint.epoch,
            params: flat.get(..p).map(<[f32]>::to_vec).unwrap_or_default(),
        };
        self.held_epoch = checkpoint.epoch;
        self.report.adopted += 1;
        if let Ok(mut w) = self.counters.weights.lock() {
            *w = (checkpoint.epoch, Some(hash.clone()));
        }
        tracing::info!(
            epoch = checkpoint.epoch,
            section = checkpoint.section,
            hash = %hash,
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
            let bytes = crate::storage::download_from_url(&url, None)
                .await
                .map_err(|e| e.to_string())?;
            if bytes.len() as u64 != size {
                return Err(format!("{} bytes, expected {size}", bytes.len()));
            }
            let flat = delta
                .wire
                .decode_partitions(&bytes, &delta.bounds, params_len, &self.merge_base.params)
                .map_err(|e| e.to_string())?;
            let got = payload_hash(&f32_to_le_bytes(&flat));
            if !got.eq_ignore_ascii_case(want) {
                return Err(format!("the rebuilt state hashes to {got}, not {want}"));
            }
            Ok(flat)
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
