//! The miner's merge round: asks `/api/merge/task` until it is told to train again, doing each
//! task on the way (upload its flat state, merge its partitions, adopt the merged state).
//! A failing step is logged and retried at the next poll; it never stops the miner.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use burn::tensor::backend::AutodiffBackend;
use bytes::Bytes;
use url::Url;

use super::{MinerError, Worker};
use crate::api::{
    BlobRef, MergeSubmitRequest, MergeTask, MergeTaskRequest, PartitionTask, SectionCheckpoint,
    UploadManifest,
};
use crate::codec::{MergeWire, Span};
use crate::merge::{FlatLayout, MergeOp, f32_from_le_bytes, f32_to_le_bytes};
use crate::miner::adversary::Adversary;
use crate::miner::participant::{MergeFormat, merge_partition_task};
use crate::miner::payload::{self, PayloadError};
use crate::storage::{payload_hash, upload_to_url};

/// Longest wait between two polls of the merge task.
const MAX_POLL: Duration = Duration::from_millis(1000);
/// Wait after a failed step.
const RETRY_AFTER_ERROR: Duration = Duration::from_millis(500);

impl<B: AutodiffBackend> Worker<B> {
    /// Takes part in the merge until the orchestrator says to train (or `stop` is set).
    pub(super) async fn merge_round(&mut self, stop: &AtomicBool) {
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
                    if resp.epoch > self.held_epoch {
                        self.engine.begin_epoch();
                    }
                    self.held_epoch = self.held_epoch.max(resp.epoch);
                    self.set_weights_epoch();
                    return;
                }
                MergeTask::Wait { reason, retry_ms } => {
                    tracing::debug!(epoch = resp.epoch, "merge: waiting ({reason})");
                    tokio::time::sleep(Duration::from_millis(retry_ms).min(MAX_POLL)).await;
                    Ok(())
                }
                MergeTask::Upload {
                    epoch,
                    layout,
                    target,
                    wire,
                    ..
                } => {
                    if self.uploaded_epoch == Some(epoch) {
                        tokio::time::sleep(MAX_POLL).await;
                        Ok(())
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
                MergeTask::Adopt { checkpoint } => self.adopt(&checkpoint).await,
            };
            if let Err(e) = result {
                tracing::warn!(epoch = resp.epoch, "merge step failed (retrying): {e}");
                tokio::time::sleep(RETRY_AFTER_ERROR).await;
            }
        }
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
        if let Some(copier) = &self.copier {
            let section = u32::try_from(self.report.section).unwrap_or(u32::MAX);
            let span = Span::whole(layout.params_len);
            flat = copier.disguise(section, epoch, flat, wire, span).await;
        }
        let poisoner = self.adversary.is_some_and(Adversary::poisons_merges);
        if poisoner && epoch.is_multiple_of(2) {
            Adversary::poison(&mut flat, layout.params_len as usize);
        }
        let bytes = wire
            .encode(&flat, Span::whole(layout.params_len))
            .map_err(|e| MinerError::Weights(format!("encoding the state in {wire}: {e}")))?;
        let manifest = UploadManifest {
            layout: layout.clone(),
            dtype: wire.name().into(),
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
        for task in partitions {
            let task = match self.adversary {
                Some(adv) => &adv.merge_task(task),
                None => task,
            };
            let submit = match merge_partition_task(epoch, op, format, task).await {
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
        if checkpoint.blob.hash.is_none() {
            return Err(MinerError::Weights("the checkpoint has no hash".into()));
        }
        let bytes = payload::fetch(&checkpoint.blob).await?;
        let flat = f32_from_le_bytes(&bytes).ok_or_else(|| {
            MinerError::Weights("checkpoint length is not a multiple of 4".into())
        })?;
        // The step count goes with the merged moments, so every miner (late joiners and
        // restarted ones included) and every validator's replay continues from the same one.
        self.engine
            .adopt_flat(&checkpoint.layout, &flat, Some(checkpoint.optimizer_step))?;
        let held = f32_to_le_bytes(&self.engine.section().export_flat(&checkpoint.layout)?);
        let hash = payload_hash(&held);
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
        // Tell the orchestrator at once which weights this miner now holds.
        if let Err(e) = self.client.heartbeat(&self.counters.heartbeat()).await {
            tracing::warn!("heartbeat after adopting: {e}");
        }
        Ok(())
    }

    fn set_weights_epoch(&self) {
        if let Ok(mut w) = self.counters.weights.lock()
            && w.0 < self.held_epoch
        {
            w.0 = self.held_epoch;
        }
    }
}
