//! Request and response bodies of the merge cycle (training -> uploading -> merging).
//!
//! # Endpoints
//! | method, path | body | response | notes |
//! |---|---|---|---|
//! | POST `/api/merge/task` | [`MergeTaskRequest`] | [`MergeTaskResponse`] | signed, registered: what to do now |
//! | POST `/api/merge/submit` | [`MergeSubmitRequest`] | [`SubmitResponse`] | signed: an upload or a merged partition is done |
//! | GET `/api/merge/status` | – | [`MergeStatus`] | public: progress of the current merge |
//!
//! # The cycle, seen from a miner
//! 1. `training`: `/api/work` as usual. Once `batches_before_merging` samples of the epoch
//!    completed, the phase becomes `uploading` (work answers say so).
//! 2. The miner asks `/api/merge/task`: [`MergeTask::Upload`] gives a PUT URL and a lease. It
//!    uploads its flat state ([`crate::codec::FlatLayout`], in the run's
//!    [`MergeWire`] format, `f32` by default) and submits
//!    [`MergeSubmitRequest::Upload`] with the manifest. An upload started under a lease is
//!    accepted until `lease_until_unix_ms`, even after the phase moved on.
//! 3. `merging`: [`MergeTask::Merge`] lists the miner's partitions of the seeded plan, with a
//!    GET URL per uploader (the miner reads the bytes holding `start..end`) and a PUT URL for the
//!    result. Each result is submitted with [`MergeSubmitRequest::Partition`].
//! 4. When the section's merge is verified, [`MergeTask::Adopt`] hands out the merged state
//!    (the same object for every miner of the section, so they end bit-identical). The miner
//!    imports it, reports it in its heartbeat, and trains again once the phase is `training`.

use serde::{Deserialize, Serialize};

use super::blob_ref::BlobRef;
use super::phase::Phase;
use crate::codec::{FlatLayout, MergeWire};
use crate::merge::MergeOp;

/// `POST /api/merge/task`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MergeTaskRequest {
    /// Epoch of the weights the miner holds (0: the seed's initial weights).
    pub held_epoch: u64,
}

/// `POST /api/merge/task` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MergeTaskResponse {
    /// Current phase.
    pub phase: Phase,
    /// Current epoch (merges completed).
    pub epoch: u64,
    /// When the current phase ends, if it has a deadline.
    pub phase_deadline_unix_ms: Option<u64>,
    /// What to do.
    pub task: MergeTask,
}

/// What a miner should do next in the merge cycle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MergeTask {
    /// The phase is `training` and the miner holds the current weights: ask `/api/work`.
    Train,
    /// Nothing to do yet; ask again after `retry_ms` (0: at once, the orchestrator held the
    /// request until the merge cycle moved or its hold ran out).
    Wait {
        /// Why (for logs).
        reason: String,
        /// Suggested wait.
        retry_ms: u64,
    },
    /// Upload the flat state for the merge of `epoch`.
    Upload {
        /// Merge epoch.
        epoch: u64,
        /// Layout the upload must follow.
        layout: FlatLayout,
        /// Element format of the upload (run config `merge.wire`; `f32` when absent).
        #[serde(default)]
        wire: MergeWire,
        /// PUT URL of the upload.
        target: BlobRef,
        /// The upload is accepted until then.
        lease_until_unix_ms: u64,
    },
    /// Merge these partitions.
    Merge {
        /// Merge epoch.
        epoch: u64,
        /// Operator.
        op: MergeOp,
        /// The caller's partitions that still lack its result.
        partitions: Vec<PartitionTask>,
        /// Element format of the sources and of the result (`f32` when absent).
        #[serde(default)]
        wire: MergeWire,
        /// The section's parameter count `P` (the int8 format stores second moments, flat
        /// indices from `2P` on, differently).
        #[serde(default)]
        params_len: u64,
    },
    /// Load the section's merged state.
    Adopt {
        /// The merged state.
        checkpoint: SectionCheckpoint,
    },
}

/// One partition a miner must merge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionTask {
    /// Partition index in the plan.
    pub index: usize,
    /// First flat index (inclusive).
    pub start: u64,
    /// Last flat index (exclusive).
    pub end: u64,
    /// Every uploader's state: read the bytes that hold `start..end` in the merge's wire
    /// format ([`MergeWire::byte_range`]; `4*start..4*end` for f32).
    pub sources: Vec<MergeSource>,
    /// PUT URL of the merged partition (`end-start` values in the merge's wire format, their
    /// first at flat index `start`).
    pub output: BlobRef,
}

/// One uploader's contribution to a partition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MergeSource {
    /// The uploader's hotkey.
    pub hotkey: String,
    /// Its weight in the merge (backwards it completed in the epoch).
    pub weight: f32,
    /// GET URL of its whole flat upload (already verified by the orchestrator).
    pub blob: BlobRef,
}

/// The merged state of one section: the starting point of every miner of the section after a
/// merge, and of late joiners.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SectionCheckpoint {
    /// Section index.
    pub section: usize,
    /// Epoch these weights start (merges completed).
    pub epoch: u64,
    /// Layout of the flat vector.
    pub layout: FlatLayout,
    /// GET URL, with the BLAKE3 hash of the whole object.
    pub blob: BlobRef,
    /// AdamW step count that goes with the moments (their bias corrections): whoever adopts
    /// the checkpoint (miners after a merge, late joiners, validators replaying the epoch)
    /// continues from this step, not from its own count. 0 in state files from before it.
    #[serde(default)]
    pub optimizer_step: u64,
    /// The same state as a compressed change from the previous checkpoint (a run whose
    /// `merge.wire` has a base, `dct`), for a miner that holds that previous state: far fewer
    /// bytes than `blob`. The state it rebuilds must hash to `blob`'s hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<CheckpointDelta>,
}

/// A checkpoint as the merged partitions it was assembled from, in the run's merge format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointDelta {
    /// Epoch of the state the change applies to (0: the seed's initial state).
    pub base_epoch: u64,
    /// The merge format of the partitions.
    pub wire: MergeWire,
    /// Where each partition ends (flat indices, increasing; the last is the flat length).
    /// The object holds the partitions' encodings back to back, each a merged partition
    /// starting where the previous one ended.
    pub bounds: Vec<u64>,
    /// GET URL of the object (its hash is not needed: the rebuilt state is checked).
    pub blob: BlobRef,
}

/// What a miner reports about its flat upload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UploadManifest {
    /// Layout of the uploaded vector (must equal the section's).
    pub layout: FlatLayout,
    /// Element format: the run's `merge.wire` (`f32`, `bf16` or `int8`).
    pub dtype: String,
    /// BLAKE3 hex of the uploaded bytes.
    pub hash: String,
    /// Size in bytes.
    pub bytes: u64,
}

/// `POST /api/merge/submit`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MergeSubmitRequest {
    /// The flat state was uploaded.
    Upload {
        /// Merge epoch.
        epoch: u64,
        /// What was uploaded.
        manifest: UploadManifest,
    },
    /// A merged partition was uploaded.
    Partition {
        /// Merge epoch.
        epoch: u64,
        /// Partition index.
        index: usize,
        /// BLAKE3 hex of the uploaded bytes.
        hash: String,
        /// Size in bytes.
        bytes: u64,
    },
}

/// A merger flagged by verification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlaggedMerger {
    /// Hotkey.
    pub hotkey: String,
    /// Partition.
    pub partition: usize,
    /// `disagreed`, `missing`, `invalid` or `unassigned`.
    pub reason: String,
}

/// One section in [`MergeStatus`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SectionMergeStatus {
    /// Section index.
    pub section: usize,
    /// Uploads accepted for this merge.
    pub uploads: usize,
    /// Partitions in the plan (0 before it is built).
    pub partitions: usize,
    /// Partitions with at least one submitted result.
    pub partitions_with_results: usize,
    /// Submitted partition results.
    pub results: usize,
    /// Whether the merge of this section is verified and its checkpoint written.
    pub finalized: bool,
    /// Partitions whose result came from the orchestrator's own recomputation.
    pub recomputed: usize,
    /// Partitions that fell back to the previous global values.
    pub fallbacks: usize,
    /// Flagged mergers.
    pub flagged: Vec<FlaggedMerger>,
    /// Hash of the section's latest checkpoint.
    pub checkpoint_hash: Option<String>,
    /// Epoch of the section's latest checkpoint.
    pub checkpoint_epoch: Option<u64>,
}

/// Loss summary of one training epoch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EpochSummary {
    /// Epoch.
    pub epoch: u64,
    /// Samples completed.
    pub completed: u64,
    /// Mean loss of the completed samples.
    pub mean_loss: Option<f32>,
    /// Mean loss of the first quarter of its completed samples.
    pub first_loss: Option<f32>,
    /// Mean loss of the last quarter of its completed samples.
    pub last_loss: Option<f32>,
    /// Held-out loss of the weights the epoch started with, evaluated through the network
    /// (None until all its evaluation samples completed).
    #[serde(default)]
    pub eval_loss: Option<f32>,
}

/// `GET /api/merge/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MergeStatus {
    /// Current phase.
    pub phase: Phase,
    /// Current epoch (merges completed).
    pub epoch: u64,
    /// Deadline of the current phase.
    pub phase_deadline_unix_ms: Option<u64>,
    /// Operator of the run.
    pub op: MergeOp,
    /// Samples of the current training epoch (`batches_before_merging`, or `early_merge_every`
    /// during the run's early merges).
    pub batches_before_merging: u64,
    /// Per section: the current merge (or the last one while training).
    pub sections: Vec<SectionMergeStatus>,
    /// Epochs so far, oldest first.
    pub epochs: Vec<EpochSummary>,
}
