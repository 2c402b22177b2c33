//! Request and response bodies of the validator endpoints and the metagraph, and the
//! validation settings of the run config (the orchestrator parses them, validators follow
//! them).
//!
//! # Endpoints
//! | method, path | body | response | notes |
//! |---|---|---|---|
//! | POST `/api/validator/register` | [`ValidatorRegisterRequest`] | [`ValidatorRegisterResponse`] | signed by a hotkey the run config lists under `validators` |
//! | POST `/api/validator/ledger` | [`LedgerRequest`] | [`EpochLedger`] | signed, validator: pathways, losses and penalties of one epoch |
//! | POST `/api/validator/work` | [`MinerWorkRequest`] | [`MinerWork`] | signed, validator: one miner's accepted work, in the order it was done, with URLs |
//! | POST `/api/validator/merge` | [`MergeRecordRequest`] | [`MergeRecord`] | signed, validator: one section's merge inputs and outputs, with URLs |
//! | POST `/api/validator/samples` | [`SamplesRequest`] | [`SampleBlobs`] | signed, validator: token ids and targets of samples |
//! | POST `/api/weights` | [`WeightSubmission`] | [`super::SubmitResponse`] | signed, validator: its weight vector for an epoch |
//! | GET `/api/weights` | – | [`MetagraphView`] | public: the latest vector per validator and their combination |
//!
//! A validator never learns object keys, only short-lived URLs, and a miner never learns which
//! miner a validator checks: the orchestrator keeps every object of an epoch until each
//! configured validator has published weights for it (or `validation.retain_s` passed).

use serde::{Deserialize, Serialize};

use super::blob_ref::BlobRef;
use super::merge::{FlaggedMerger, SectionCheckpoint};
use super::phase::Phase;
use super::types::{MinerSettings, RunChain, WorkKind};
use crate::merge::MergeOp;
use crate::model::ModelConfig;

/// Acceptance thresholds of a comparison between a replayed vector and a miner's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Thresholds {
    /// Smallest cosine similarity that passes.
    pub min_cosine: f64,
    /// Smallest magnitude ratio `min(|a|,|b|) / max(|a|,|b|)` that passes.
    pub min_magnitude_ratio: f64,
}

impl Thresholds {
    /// Checks that both thresholds lie in `[0, 1]`.
    ///
    /// # Errors
    /// A message naming the bad value.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("min_cosine", self.min_cosine),
            ("min_magnitude_ratio", self.min_magnitude_ratio),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{name} must lie in [0, 1], got {v}"));
            }
        }
        Ok(())
    }
}

/// How much of every miner's work each window replays (run config `validation.spot`; see
/// `validator::spot`): the prefix of its epoch that holds `max(min_items, ceil(fraction x n))`
/// of its `n` checkable items.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpotSettings {
    /// Items checked per miner and window at least (all of them when it has fewer; 0: only
    /// the `replay.miners_per_epoch` whole replays). 22 catches a miner that cheats on a
    /// random tenth of its items within two windows with probability at least
    /// 1 - 0.9^44 = 99.03% (computed).
    #[serde(default = "spot_items")]
    pub min_items: usize,
    /// Fraction of a miner's checkable items checked when that is more than `min_items`.
    #[serde(default = "spot_fraction")]
    pub fraction: f64,
}

impl Default for SpotSettings {
    fn default() -> Self {
        Self {
            min_items: spot_items(),
            fraction: spot_fraction(),
        }
    }
}

fn spot_items() -> usize {
    22
}
fn spot_fraction() -> f64 {
    0.1
}

/// Replay checks (run config `validation.replay`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplaySettings {
    /// Miners each validator replays whole per epoch, chosen secretly at random (the others
    /// are replayed over a prefix: `validation.spot`).
    #[serde(default = "one")]
    pub miners_per_epoch: usize,
    /// Fraction of a tracked miner's work replayed, from the start of the epoch, in `(0, 1]`.
    /// Only a full replay (1) also compares the uploaded state with the replayed one.
    #[serde(default = "one_f")]
    pub fraction: f64,
    /// Thresholds for outputs and input gradients during the first `strict_steps` optimizer
    /// steps of the replay.
    #[serde(default = "output_thresholds")]
    pub outputs: Thresholds,
    /// Optimizer steps of a replay judged by `outputs`; later items are judged by
    /// `late_outputs`. A replay is not bit-exact (the CPU kernels' rounding differs from run
    /// to run, and more between devices), and AdamW steps amplify the difference, so an honest
    /// miner's later items drift from their replay.
    #[serde(default = "strict_steps")]
    pub strict_steps: u64,
    /// Thresholds for outputs and input gradients after `strict_steps` replayed steps.
    #[serde(default = "late_output_thresholds")]
    pub late_outputs: Thresholds,
    /// Thresholds for the uploaded state's pseudo-gradient (upload - start) against the
    /// replay's.
    #[serde(default = "state_thresholds")]
    pub state: Thresholds,
    /// Largest relative difference between a reported tail loss and the replayed one.
    #[serde(default = "loss_tolerance")]
    pub loss_tolerance: f64,
    /// Share of a replay's items that must fall short of `outputs` (inside the strict window,
    /// while within `late_outputs`) for the replay to flag; an item past `late_outputs` flags
    /// alone. An honest replay drifts on a few items, a systematic cheat shows on most.
    #[serde(default = "marginal_share")]
    pub marginal_share: f64,
}

fn one() -> usize {
    1
}
fn one_f() -> f64 {
    1.0
}
fn output_thresholds() -> Thresholds {
    Thresholds {
        min_cosine: 0.99,
        min_magnitude_ratio: 0.95,
    }
}
fn strict_steps() -> u64 {
    32
}
fn late_output_thresholds() -> Thresholds {
    Thresholds {
        min_cosine: 0.9,
        min_magnitude_ratio: 0.8,
    }
}
fn state_thresholds() -> Thresholds {
    Thresholds {
        min_cosine: 0.9,
        min_magnitude_ratio: 0.8,
    }
}
fn loss_tolerance() -> f64 {
    0.01
}
fn marginal_share() -> f64 {
    0.5
}

impl Default for ReplaySettings {
    fn default() -> Self {
        Self {
            miners_per_epoch: one(),
            fraction: one_f(),
            outputs: output_thresholds(),
            strict_steps: strict_steps(),
            late_outputs: late_output_thresholds(),
            state: state_thresholds(),
            loss_tolerance: loss_tolerance(),
            marginal_share: marginal_share(),
        }
    }
}

/// Settings of the CLASP estimator (run config `validation.clasp`); see `docs/clasp.md`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaspConfig {
    /// Samples per baseline window (consecutive in time).
    #[serde(default = "default_window")]
    pub window: usize,
    /// Fewest samples through a miner before it can be flagged.
    #[serde(default = "default_min_samples")]
    pub min_samples: usize,
    /// Smallest z-score that flags.
    #[serde(default = "default_z")]
    pub z_threshold: f64,
    /// Smallest effect (nats) that flags.
    #[serde(default = "default_min_effect")]
    pub min_effect: f64,
    /// Scale (nats) of the quality factor's decay.
    #[serde(default = "default_temperature")]
    pub temperature: f64,
}

fn default_window() -> usize {
    8
}
fn default_min_samples() -> usize {
    12
}
fn default_z() -> f64 {
    4.0
}
fn default_min_effect() -> f64 {
    0.5
}
fn default_temperature() -> f64 {
    0.2
}

impl Default for ClaspConfig {
    fn default() -> Self {
        Self {
            window: default_window(),
            min_samples: default_min_samples(),
            z_threshold: default_z(),
            min_effect: default_min_effect(),
            temperature: default_temperature(),
        }
    }
}

impl ClaspConfig {
    /// Checks the values.
    ///
    /// # Errors
    /// A message naming the bad value.
    pub fn validate(&self) -> Result<(), String> {
        if self.window == 0 {
            return Err("window must be at least 1".into());
        }
        for (name, v) in [
            ("z_threshold", self.z_threshold),
            ("min_effect", self.min_effect),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{name} must be finite and >= 0, got {v}"));
            }
        }
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return Err(format!(
                "temperature must be finite and > 0, got {}",
                self.temperature
            ));
        }
        Ok(())
    }
}

/// Kinds of penalty, each costing a configurable number of samples per occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PenaltyKind {
    /// An assignment's deadline passed before its result arrived.
    MissedDeadline,
    /// A result the orchestrator refused (bad hash, shape, values).
    RefusedResult,
    /// A merge upload the orchestrator refused.
    RefusedUpload,
    /// A merge partition the miner was assigned and never delivered.
    MissingMerge,
    /// Work in an epoch whose merge got no accepted upload from the miner (its training
    /// credit for the epoch is forfeit as well).
    MissedUpload,
}

/// Samples each penalty costs (run config `validation.penalties`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PenaltyWeights {
    /// Per missed deadline.
    #[serde(default = "two")]
    pub missed_deadline: f64,
    /// Per refused result.
    #[serde(default = "two")]
    pub refused_result: f64,
    /// Per refused upload.
    #[serde(default = "ten")]
    pub refused_upload: f64,
    /// Per merge partition not delivered.
    #[serde(default = "ten")]
    pub missing_merge: f64,
    /// Per epoch of work without an accepted merge upload.
    #[serde(default = "ten")]
    pub missed_upload: f64,
}

fn two() -> f64 {
    2.0
}
fn ten() -> f64 {
    10.0
}

impl Default for PenaltyWeights {
    fn default() -> Self {
        Self {
            missed_deadline: two(),
            refused_result: two(),
            refused_upload: ten(),
            missing_merge: ten(),
            missed_upload: ten(),
        }
    }
}

impl PenaltyWeights {
    /// Samples one penalty of `kind` costs.
    pub fn of(&self, kind: PenaltyKind) -> f64 {
        match kind {
            PenaltyKind::MissedDeadline => self.missed_deadline,
            PenaltyKind::RefusedResult => self.refused_result,
            PenaltyKind::RefusedUpload => self.refused_upload,
            PenaltyKind::MissingMerge => self.missing_merge,
            PenaltyKind::MissedUpload => self.missed_upload,
        }
    }

    /// Checks that every weight is finite and non-negative.
    ///
    /// # Errors
    /// A message naming the bad value.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("missed_deadline", self.missed_deadline),
            ("refused_result", self.refused_result),
            ("refused_upload", self.refused_upload),
            ("missing_merge", self.missing_merge),
            ("missed_upload", self.missed_upload),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{name} must be finite and >= 0, got {v}"));
            }
        }
        Ok(())
    }
}

/// When taking work and not finishing it makes a miner a free-rider (run config
/// `validation.free_rider`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreeRiderRule {
    /// Fewest missed deadlines in an epoch before it can flag.
    #[serde(default = "three")]
    pub min_missed: u64,
    /// Flag when `missed / (missed + accepted)` reaches this.
    #[serde(default = "half")]
    pub missed_ratio: f64,
}

fn three() -> u64 {
    3
}
fn half() -> f64 {
    0.5
}

impl Default for FreeRiderRule {
    fn default() -> Self {
        Self {
            min_missed: three(),
            missed_ratio: half(),
        }
    }
}

/// How the orchestrator combines several validators' vectors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Combine {
    /// Weighted by each validator's stake (run config `validators[].stake`).
    #[default]
    Stake,
    /// Every validator counts the same.
    Equal,
}

/// The run's validation settings (run config `validation`); sent to every validator.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidationSettings {
    /// Replay checks.
    #[serde(default)]
    pub replay: ReplaySettings,
    /// Spot checks of every miner.
    #[serde(default)]
    pub spot: SpotSettings,
    /// CLASP.
    #[serde(default)]
    pub clasp: ClaspConfig,
    /// Cosine of two uploads' pseudo-gradients at or above which the later one is a copy.
    #[serde(default = "copy_cosine")]
    pub copy_cosine: f64,
    /// Partitions per section each validator recomputes from their sources per merge.
    #[serde(default = "merge_checks")]
    pub merge_checks: usize,
    /// Samples per uploader for the upload-quality check (0: off).
    #[serde(default = "upload_samples")]
    pub upload_samples: usize,
    /// When missed deadlines make a free-rider.
    #[serde(default)]
    pub free_rider: FreeRiderRule,
    /// Samples each penalty costs.
    #[serde(default)]
    pub penalties: PenaltyWeights,
    /// Share of every weight vector that is burned, in `[0, 1]`.
    #[serde(default)]
    pub burn: f64,
    /// How several validators' vectors are combined.
    #[serde(default)]
    pub combine: Combine,
    /// L1 distance from the other validators' combination above which a validator is shown
    /// as dissenting (the L1 distance of two weight vectors lies in `[0, 2]`).
    #[serde(default = "dissent_l1")]
    pub dissent_l1: f64,
    /// Seconds an epoch's objects are kept for validators after they could be deleted.
    #[serde(default = "retain_s")]
    pub retain_s: u64,
    /// Share of the validators (by stake or equally, as `combine`) above which their flags
    /// on a miner for one epoch count as agreed (and at least two must agree when two or
    /// more are configured); see `orchestrator::flag_quorum`.
    #[serde(default = "half")]
    pub flag_quorum: f64,
    /// Windows after a flag in which this validator scores the miner 0 (probation), whether
    /// or not a check catches it again.
    #[serde(default = "probation_windows")]
    pub probation_windows: u64,
    /// Agreed flagged epochs that exclude a miner from routing for `penalties.exclusion_s`
    /// (0: validator flags never act on routing).
    #[serde(default = "two_windows")]
    pub exclude_after_flags: u32,
}

fn copy_cosine() -> f64 {
    0.999
}
fn merge_checks() -> usize {
    2
}
fn upload_samples() -> usize {
    4
}
fn probation_windows() -> u64 {
    10
}
fn dissent_l1() -> f64 {
    0.5
}
fn retain_s() -> u64 {
    600
}
fn two_windows() -> u32 {
    2
}

impl Default for ValidationSettings {
    fn default() -> Self {
        Self {
            replay: ReplaySettings::default(),
            spot: SpotSettings::default(),
            clasp: ClaspConfig::default(),
            copy_cosine: copy_cosine(),
            merge_checks: merge_checks(),
            upload_samples: upload_samples(),
            free_rider: FreeRiderRule::default(),
            penalties: PenaltyWeights::default(),
            burn: 0.0,
            combine: Combine::default(),
            dissent_l1: dissent_l1(),
            retain_s: retain_s(),
            flag_quorum: half(),
            probation_windows: probation_windows(),
            exclude_after_flags: two_windows(),
        }
    }
}

impl ValidationSettings {
    /// Checks every value; the error names the key under `validation`.
    ///
    /// # Errors
    /// `(key, reason)`.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        let r = &self.replay;
        if !(r.fraction > 0.0 && r.fraction <= 1.0) {
            return Err((
                "validation.replay.fraction",
                format!("must lie in (0, 1], got {}", r.fraction),
            ));
        }
        r.outputs
            .validate()
            .map_err(|e| ("validation.replay.outputs", e))?;
        r.late_outputs
            .validate()
            .map_err(|e| ("validation.replay.late_outputs", e))?;
        r.state
            .validate()
            .map_err(|e| ("validation.replay.state", e))?;
        if !(r.loss_tolerance.is_finite() && r.loss_tolerance >= 0.0) {
            return Err((
                "validation.replay.loss_tolerance",
                "must be finite and >= 0".into(),
            ));
        }
        let spot = &self.spot;
        if !(spot.fraction.is_finite() && (0.0..=1.0).contains(&spot.fraction)) {
            return Err((
                "validation.spot.fraction",
                format!("must lie in [0, 1], got {}", spot.fraction),
            ));
        }
        self.clasp.validate().map_err(|e| ("validation.clasp", e))?;
        self.penalties
            .validate()
            .map_err(|e| ("validation.penalties", e))?;
        for (key, v) in [
            ("validation.copy_cosine", self.copy_cosine),
            ("validation.burn", self.burn),
            ("validation.flag_quorum", self.flag_quorum),
            (
                "validation.free_rider.missed_ratio",
                self.free_rider.missed_ratio,
            ),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err((key, format!("must lie in [0, 1], got {v}")));
            }
        }
        if !(0.0..=2.0).contains(&self.dissent_l1) {
            return Err((
                "validation.dissent_l1",
                format!("must lie in [0, 2], got {}", self.dissent_l1),
            ));
        }
        Ok(())
    }
}

/// A miner's score for one window and where it came from (published with the weights).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoreParts {
    /// Valid throughput (samples).
    pub throughput: f64,
    /// Replay factor (1 when not checked).
    pub replay: f64,
    /// Upload-quality factor (1 when not checked).
    pub upload: f64,
    /// CLASP factor (1 when not checked).
    pub clasp: f64,
    /// `replay * upload * clasp`.
    pub quality: f64,
    /// Penalty counts by kind.
    pub penalties: Vec<(PenaltyKind, u64)>,
    /// Total penalty (samples).
    pub penalty: f64,
    /// Why the miner is flagged (empty when it is not).
    pub flags: Vec<String>,
    /// What the checks measured, in words (evidence for the flags and factors).
    #[serde(default)]
    pub notes: Vec<String>,
    /// The score.
    pub score: f64,
}

/// `POST /api/validator/register`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidatorRegisterRequest {
    /// What the validator computes on (informational).
    pub device: String,
}

/// `POST /api/validator/register` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidatorRegisterResponse {
    /// The caller's SS58 hotkey.
    pub hotkey: String,
    /// Run name.
    pub run: String,
    /// Current epoch.
    pub epoch: u64,
    /// Current phase.
    pub phase: Phase,
    /// Model of the run.
    pub model: ModelConfig,
    /// What every miner follows (a replay follows it too).
    pub settings: MinerSettings,
    /// How to validate.
    pub validation: ValidationSettings,
    /// The caller's stake (run config, or the metagraph's in TAO on a chain).
    pub stake: f64,
    /// The subnet the run is on, where it is on one: the validator sets its weights there.
    #[serde(default)]
    pub chain: Option<RunChain>,
}

/// `POST /api/validator/ledger`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerRequest {
    /// Training epoch.
    pub epoch: u64,
}

/// One completed sample of an epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerSample {
    /// Sample id.
    pub sample: u64,
    /// Loss reported by the tail.
    pub loss: Option<f32>,
    /// When its loss was accepted (the tail's result), ms since the Unix epoch.
    pub loss_unix_ms: u64,
    /// The miner of each section, by section.
    pub pathway: Vec<String>,
}

/// What became of a miner's merge upload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UploadRecord {
    /// `leased`, `accepted` or `refused`.
    pub state: String,
    /// Why it was refused.
    pub reason: Option<String>,
    /// When it was accepted, ms since the Unix epoch.
    pub accepted_unix_ms: Option<u64>,
}

/// One miner's record in an epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MinerRecord {
    /// SS58 hotkey.
    pub hotkey: String,
    /// Section.
    pub section: usize,
    /// Accepted results on samples that completed (the tail's combined forward counts once).
    pub completed_work: u64,
    /// Of those, forwards (the rest are backwards; the tail's forward includes its backward).
    #[serde(default)]
    pub completed_forwards: u64,
    /// Accepted results in all.
    pub accepted: u64,
    /// Assignments whose deadline passed.
    pub missed_deadlines: u64,
    /// Results the orchestrator refused.
    pub refused_results: u64,
    /// Its merge upload, if it was leased one.
    pub upload: Option<UploadRecord>,
    /// Flags the merge verification raised against it.
    pub merge_flags: Vec<FlaggedMerger>,
}

/// `POST /api/validator/ledger` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochLedger {
    /// Training epoch.
    pub epoch: u64,
    /// Whether the epoch's merge is finished (its records are final).
    pub merged: bool,
    /// Completed samples, by sample id.
    pub samples: Vec<LedgerSample>,
    /// Every miner that did work in the epoch or was leased an upload.
    pub miners: Vec<MinerRecord>,
}

/// `POST /api/validator/work`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MinerWorkRequest {
    /// Training epoch.
    pub epoch: u64,
    /// The miner.
    pub miner: String,
}

/// One accepted piece of a miner's work.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkItem {
    /// Assignment id.
    pub assignment: u64,
    /// Sample.
    pub sample: u64,
    /// Forward (the tail's forward includes its backward) or backward.
    pub kind: WorkKind,
    /// Input (token ids, activations or upstream gradient), with its hash and shape.
    pub input: BlobRef,
    /// Targets (tail forwards).
    pub targets: Option<BlobRef>,
    /// The sample's input token ids, for a non-head forward in a model that re-embeds them.
    #[serde(default)]
    pub tokens: Option<BlobRef>,
    /// The result the miner uploaded, with the hash it reported (none for the head's backward).
    pub output: Option<BlobRef>,
    /// Loss the tail reported.
    pub loss: Option<f32>,
    /// When the result was accepted, ms since the Unix epoch.
    pub accepted_unix_ms: u64,
}

/// `POST /api/validator/work` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MinerWork {
    /// Training epoch.
    pub epoch: u64,
    /// The miner.
    pub miner: String,
    /// Its section.
    pub section: usize,
    /// The state every miner of the section started the epoch from (`None`: the seed's).
    pub start: Option<SectionCheckpoint>,
    /// Its accepted work, in the order it was done.
    pub items: Vec<WorkItem>,
    /// Its accepted merge upload (flat state at the end of the epoch), with its hash.
    pub upload: Option<BlobRef>,
    /// Element format of the upload (`f32` when absent).
    #[serde(default)]
    pub wire: crate::codec::MergeWire,
}

/// `POST /api/validator/merge`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MergeRecordRequest {
    /// Merge epoch.
    pub epoch: u64,
    /// Section.
    pub section: usize,
}

/// One accepted upload of a merge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UploadSource {
    /// Uploader.
    pub hotkey: String,
    /// Its merge weight.
    pub weight: f32,
    /// Its flat state, with its hash.
    pub blob: BlobRef,
    /// When it was accepted, ms since the Unix epoch.
    pub accepted_unix_ms: Option<u64>,
}

/// One merger's copy of a partition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionCopy {
    /// Partition index.
    pub partition: usize,
    /// Merger.
    pub merger: String,
    /// The copy, with the hash it reported.
    pub blob: BlobRef,
}

/// `POST /api/validator/merge` response: what a party needs to recompute the plan and check
/// any partition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MergeRecord {
    /// Merge epoch.
    pub epoch: u64,
    /// Section.
    pub section: usize,
    /// Operator.
    pub op: MergeOp,
    /// Relative tolerance of copy comparisons.
    pub tolerance: f32,
    /// The state the section started the epoch from (`None`: the seed's).
    pub start: Option<SectionCheckpoint>,
    /// Accepted uploads (the plan's uploaders), sorted by hotkey.
    pub uploads: Vec<UploadSource>,
    /// Partitions requested (the plan is recomputed from these and the uploaders).
    pub partitions: usize,
    /// Mergers per partition.
    pub replication: usize,
    /// Flat length.
    pub len: usize,
    /// Submitted partition copies.
    pub results: Vec<PartitionCopy>,
    /// The merged state the merge produced (starts the next epoch), if finalised.
    pub merged: Option<SectionCheckpoint>,
    /// Element format of the uploads and partition copies (`f32` when absent).
    #[serde(default)]
    pub wire: crate::codec::MergeWire,
}

/// `POST /api/validator/samples`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplesRequest {
    /// Epoch of the samples.
    pub epoch: u64,
    /// Sample ids (at most [`MAX_SAMPLES_PER_REQUEST`]).
    pub samples: Vec<u64>,
}

/// Most samples one [`SamplesRequest`] may ask for.
pub const MAX_SAMPLES_PER_REQUEST: usize = 256;

/// Token ids and targets of one sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleBlob {
    /// Sample id.
    pub sample: u64,
    /// Token ids `[batch, seq]` ([`crate::codec::token_ids`]).
    pub tokens: BlobRef,
    /// Targets, the same layout.
    pub targets: BlobRef,
}

/// `POST /api/validator/samples` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleBlobs {
    /// One entry per known sample asked for.
    pub samples: Vec<SampleBlob>,
}

/// One miner's weight in a published vector.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MinerWeight {
    /// SS58 hotkey.
    pub hotkey: String,
    /// Normalized weight.
    pub weight: f64,
    /// Where it came from.
    pub parts: ScoreParts,
}

/// `POST /api/weights`: a validator's weight vector for the window of one epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightSubmission {
    /// Epoch the window covers.
    pub epoch: u64,
    /// Burned share.
    pub burn: f64,
    /// Miners and their weights (with the burn, they sum to 1).
    pub weights: Vec<MinerWeight>,
}

/// One validator's latest vector in [`MetagraphView`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidatorWeights {
    /// The validator's hotkey.
    pub hotkey: String,
    /// Its stake.
    pub stake: f64,
    /// Epoch of its latest vector.
    pub epoch: u64,
    /// When it was received, ms since the Unix epoch.
    pub received_unix_ms: u64,
    /// Burned share.
    pub burn: f64,
    /// Its vector with the score parts.
    pub weights: Vec<MinerWeight>,
    /// L1 distance to the combination of the other validators (none alone).
    pub distance: Option<f64>,
    /// Whether `distance` exceeds `validation.dissent_l1`.
    pub dissent: bool,
    /// The exact JSON body the validator signed.
    pub signed_body: String,
    /// Its sr25519 signature (hex) over
    /// `POST /api/weights.{hex(sha256(signed_body))}.{signed_unix_ms}.{run}`.
    pub signature: String,
    /// The signature's timestamp.
    pub signed_unix_ms: u64,
}

/// `GET /api/weights`: the local metagraph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetagraphView {
    /// Run name.
    pub run: String,
    /// How validators are combined.
    pub combine: Combine,
    /// The combined vector: `(hotkey, weight)` by hotkey.
    pub combined: Vec<(String, f64)>,
    /// The combined burned share (with `combined`, sums to 1; 0 with no validator).
    pub combined_burn: f64,
    /// The latest vector of each validator that published one.
    pub validators: Vec<ValidatorWeights>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_name_their_key() {
        assert!(ValidationSettings::default().validate().is_ok());
        let mut s = ValidationSettings::default();
        s.replay.fraction = 0.0;
        assert_eq!(s.validate().unwrap_err().0, "validation.replay.fraction");
        let s = ValidationSettings {
            burn: 1.5,
            ..ValidationSettings::default()
        };
        assert_eq!(s.validate().unwrap_err().0, "validation.burn");
        let mut s = ValidationSettings::default();
        s.clasp.window = 0;
        assert_eq!(s.validate().unwrap_err().0, "validation.clasp");
        let mut s = ValidationSettings::default();
        s.replay.outputs.min_cosine = 2.0;
        assert_eq!(s.validate().unwrap_err().0, "validation.replay.outputs");
    }

    #[test]
    fn settings_parse_with_defaults_and_refuse_unknown_keys() {
        let s: ValidationSettings =
            serde_json::from_str(r#"{"replay": {"fraction": 0.5}, "burn": 0.2}"#).unwrap();
        assert_eq!(s.replay.fraction, 0.5);
        assert_eq!(s.replay.miners_per_epoch, 1);
        assert_eq!(s.combine, Combine::Stake);
        assert!(serde_json::from_str::<ValidationSettings>(r#"{"burnt": 0.2}"#).is_err());
    }
}
