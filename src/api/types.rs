//! Request and response bodies of the orchestrator API. Field names are the JSON names.
//!
//! # Endpoints
//! | method, path | body | response | notes |
//! |---|---|---|---|
//! | GET `/health` | – | [`Health`] | public |
//! | GET `/metrics` | – | Prometheus text | public |
//! | GET `/api/status` | – | [`StatusResponse`] | public |
//! | GET `/api/run` | – | [`RunInfo`] | public: what a client signs for |
//! | POST `/api/register` | [`RegisterRequest`] | [`RegisterResponse`] | signed; any hotkey (a local network has no chain) |
//! | POST `/api/heartbeat` | [`HeartbeatRequest`] | [`HeartbeatResponse`] | signed, registered |
//! | POST `/api/work` | [`WorkRequest`] | [`WorkResponse`] | signed, registered; backward work first |
//! | POST `/api/submit` | [`SubmitRequest`] | [`SubmitResponse`] | signed, registered; the assignment's holder only |
//! | POST `/api/release` | [`ReleaseRequest`] | [`SubmitResponse`] | signed: hand assignments back (Ctrl-C) |
//! | `/api/merge/*` | see [`super::merge`] | | the merge cycle |
//! | GET/PUT `/blob/{key}?exp=..&sig=..` | bytes | bytes | local storage only; token from a [`BlobRef`] |

use serde::{Deserialize, Serialize};

use super::blob_ref::BlobRef;
use super::merge::SectionCheckpoint;
use super::phase::Phase;
use crate::codec::WireDtype;
use crate::model::ModelConfig;

/// `GET /health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Health {
    /// Always "ok" when the server answers.
    pub status: String,
}

/// An error response body (any 4xx/5xx).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiError {
    /// Stable machine-readable code: `unauthorized`, `forbidden`, `stale`, `replayed`,
    /// `not_registered`, `bad_request`, `not_found`, `conflict`, `bad_payload`, `internal`.
    pub code: String,
    /// Human-readable explanation (5xx responses say only "internal error").
    pub message: String,
}

/// Version of the HTTP API this binary speaks. Raised when a request or response changes
/// incompatibly; a client refuses an orchestrator that speaks another one
/// ([`super::client::ClientError::Version`]).
pub const API_VERSION: u32 = 1;

/// `GET /api/run`: the run a client is joining.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// [`API_VERSION`] of the orchestrator (0: an orchestrator from before versioning).
    #[serde(default)]
    pub api_version: u32,
    /// The orchestrator's `iota` release (`iota --version`).
    #[serde(default)]
    pub version: String,
    /// Run name; clients sign requests for it (`signed_for`).
    pub run: String,
    /// Model of the run.
    pub model: ModelConfig,
    /// Current phase.
    pub phase: Phase,
    /// Current epoch (merges completed).
    pub epoch: u64,
}

/// `POST /api/register`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegisterRequest {
    /// What the miner can do (informational, for the dashboard).
    pub device: String,
    /// Most forwards the miner wants in flight (the server caps it at its own `max_in_flight`).
    pub max_in_flight: usize,
}

/// Training settings every miner of the run follows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MinerSettings {
    /// Local optimizer step every this many backwards.
    pub local_steps: u64,
    /// Most forwards awaiting their backward per miner.
    pub max_in_flight: usize,
    /// Encoding of boundary tensors.
    pub wire: WireDtype,
    /// Tokens per sample.
    pub seq_len: usize,
    /// Samples per assignment (micro-batch).
    pub batch_size: usize,
    /// Seed of the initial weights (every miner of a section starts identical).
    pub seed: u64,
    /// Inner optimizer.
    pub optimizer: crate::model::OptimizerConfig,
    /// Learning-rate schedule, evaluated at the largest sample id of each local step (the
    /// run's global progress).
    pub schedule: crate::model::LrSchedule,
    /// Recompute a backward at the weights its forward used (weight stashing).
    #[serde(default = "default_true")]
    pub weight_stashing: bool,
    /// Run forwards (and their backwards) at the weights extrapolated to the step their
    /// gradient will be applied at.
    #[serde(default)]
    pub lookahead: bool,
    /// Samples per synchronous optimizer step (0: asynchronous steps every `local_steps`
    /// backwards); see [`crate::compute::engine`].
    #[serde(default)]
    pub samples_per_step: u64,
    /// Length of the warm-up without the bottleneck, counted like the schedule (samples, or
    /// synchronous steps); 0: none. While it lasts, the boundary tensors of a sample are
    /// `d_model` channels wider: the whole residual stream crosses beside the bottleneck,
    /// weighted by [`crate::model::bridge_weight`] at the sample's place.
    #[serde(default)]
    pub bottleneck_warmup: u64,
    /// Seconds between heartbeats.
    pub heartbeat_s: u64,
}

fn default_true() -> bool {
    true
}

/// `POST /api/register` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegisterResponse {
    /// The caller's SS58 hotkey.
    pub hotkey: String,
    /// Section the miner serves (a re-registering hotkey gets its section back).
    pub section: usize,
    /// Run name.
    pub run: String,
    /// Current epoch.
    pub epoch: u64,
    /// Model of the run.
    pub model: ModelConfig,
    /// Settings to follow.
    pub settings: MinerSettings,
    /// Latest merged state of the section to start from; `None` means initialise from the seed.
    pub checkpoint: Option<SectionCheckpoint>,
}

/// Direction of an assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkKind {
    /// Run the section forward on `input`, upload the output activations (the tail instead
    /// computes the loss against `targets`, runs its backward at once and uploads the input
    /// gradient).
    Forward,
    /// Recompute from the cached input of the same sample, back-propagate `input` (the
    /// upstream gradient), upload the input gradient (the head uploads nothing).
    Backward,
    /// Evaluate the epoch's merged model on held-out tokens: run the section forward at the
    /// weights the epoch started with and upload the output, as a forward (the tail instead
    /// computes the loss against `targets` and reports it, uploading nothing). No backward
    /// follows, nothing is kept, no optimizer state changes.
    Eval,
}

/// One unit of work for one micro-batch of samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assignment {
    /// Server-side id; quote it when submitting.
    pub id: u64,
    /// The sample (micro-batch) this work belongs to.
    pub sample_id: u64,
    /// Forward or backward.
    pub kind: WorkKind,
    /// Section index.
    pub section: usize,
    /// Input: activations (non-head forward), upstream gradient (backward), or token ids
    /// `[batch, seq]` (head forward; [`crate::codec::token_ids`]).
    pub input: BlobRef,
    /// Next-token targets `[batch, seq]`, as the token ids (tail forward only).
    pub targets: Option<BlobRef>,
    /// The sample's input token ids `[batch, seq]`, for a non-head forward or evaluation in a
    /// model whose later sections re-embed them ([`crate::model::ModelConfig::reembed`]).
    #[serde(default)]
    pub tokens: Option<BlobRef>,
    /// Where to upload the result (absent for the head's backward, which produces nothing).
    pub output: Option<BlobRef>,
    /// Deadline; work submitted later is refused and the miner penalised.
    pub deadline_unix_ms: u64,
}

/// `POST /api/work`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkRequest {
    /// Most assignments wanted now.
    pub max: usize,
    /// When there is no work now, how long the orchestrator may hold the request open
    /// waiting for some, in ms (capped by the server at [`MAX_WORK_WAIT_MS`]; 0 = answer at
    /// once). A miner that waits this way picks work up the moment it is routed instead of
    /// at its next poll.
    #[serde(default)]
    pub wait_ms: u64,
}

/// The longest an `/api/work` request is held open waiting for work.
pub const MAX_WORK_WAIT_MS: u64 = 5_000;

/// `POST /api/work` response (possibly empty: ask again after a short wait).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkResponse {
    /// Backward assignments come first.
    pub assignments: Vec<Assignment>,
    /// Current phase (the miner stops asking for training work outside `training`).
    pub phase: Phase,
    /// Current epoch: a miner holding older weights adopts the merged ones first.
    #[serde(default)]
    pub epoch: u64,
    /// How long the orchestrator held the request waiting for work, in ms (the rest of the
    /// request's time was spent serving it).
    #[serde(default)]
    pub waited_ms: u64,
}

/// Time spent on an assignment, for the ledger and scoring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Downloading inputs.
    pub download_ms: u64,
    /// Computing.
    pub compute_ms: u64,
    /// Uploading the result.
    pub upload_ms: u64,
}

/// `POST /api/submit`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmitRequest {
    /// The assignment.
    pub assignment_id: u64,
    /// BLAKE3 hex of the uploaded output (absent when there is no output).
    pub output_hash: Option<String>,
    /// Size of the uploaded output in bytes.
    pub output_bytes: Option<u64>,
    /// Loss of the micro-batch (tail forward only).
    pub loss: Option<f32>,
    /// Timings.
    pub timings: Timings,
}

/// `POST /api/submit` and `/api/release` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmitResponse {
    /// Whether the result was accepted (a refused result is re-offered and explained).
    pub accepted: bool,
    /// Why not, when refused.
    pub reason: Option<String>,
}

/// `POST /api/release`: hand assignments back unfinished (shutdown).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReleaseRequest {
    /// Assignments to hand back.
    pub assignment_ids: Vec<u64>,
}

/// `POST /api/heartbeat`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatRequest {
    /// Forwards done since registration.
    pub forwards: u64,
    /// Backwards done since registration.
    pub backwards: u64,
    /// Local optimizer steps applied.
    pub steps: u64,
    /// Epoch of the weights the miner holds.
    #[serde(default)]
    pub weights_epoch: u64,
    /// BLAKE3 hex (64 digits) of the miner's flat state right after it adopted a merge (None
    /// before). Reported by the miner and shown in the status; the orchestrator cannot check
    /// what a miner holds in memory, so this is a report, not a proof.
    #[serde(default)]
    pub weights_hash: Option<String>,
    /// Where the miner's time went and what it moved (self-reported, for monitoring only:
    /// nothing is scored on it).
    #[serde(default)]
    pub usage: Option<MinerUsage>,
}

/// A miner's own account of its time and storage traffic since its first assignment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MinerUsage {
    /// Wall seconds since the first assignment.
    pub wall_s: f64,
    /// Seconds computing.
    pub compute_s: f64,
    /// Seconds getting inputs.
    pub download_s: f64,
    /// Seconds putting results.
    pub upload_s: f64,
    /// Seconds in orchestrator requests on the work path.
    pub orchestrator_s: f64,
    /// Seconds waiting for work.
    pub idle_s: f64,
    /// Seconds in merge rounds.
    pub merge_s: f64,
    /// Bytes uploaded through storage URLs.
    pub bytes_up: u64,
    /// Bytes downloaded through storage URLs.
    pub bytes_down: u64,
}

impl MinerUsage {
    /// Compute time over wall time (0 before any wall time).
    pub fn utilization(&self) -> f64 {
        if self.wall_s > 0.0 {
            self.compute_s / self.wall_s
        } else {
            0.0
        }
    }

    /// The time and bytes between `earlier`, an account of the same miner, and this one.
    pub fn since(&self, earlier: &MinerUsage) -> MinerUsage {
        MinerUsage {
            wall_s: self.wall_s - earlier.wall_s,
            compute_s: self.compute_s - earlier.compute_s,
            download_s: self.download_s - earlier.download_s,
            upload_s: self.upload_s - earlier.upload_s,
            orchestrator_s: self.orchestrator_s - earlier.orchestrator_s,
            idle_s: self.idle_s - earlier.idle_s,
            merge_s: self.merge_s - earlier.merge_s,
            bytes_up: self.bytes_up.saturating_sub(earlier.bytes_up),
            bytes_down: self.bytes_down.saturating_sub(earlier.bytes_down),
        }
    }
}

/// `POST /api/heartbeat` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatResponse {
    /// Current phase.
    pub phase: Phase,
    /// Current epoch.
    pub epoch: u64,
    /// When the current phase must end, if it has a deadline.
    pub phase_deadline_unix_ms: Option<u64>,
    /// Penalties recorded against this miner so far.
    pub penalties: u64,
}

/// One miner in [`StatusResponse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MinerStatus {
    /// SS58 hotkey.
    pub hotkey: String,
    /// Forwards completed.
    pub forwards: u64,
    /// Backwards completed.
    pub backwards: u64,
    /// Penalties (missed deadlines, refused payloads).
    pub penalties: u64,
    /// Seconds since the last request from this miner.
    pub last_seen_s: f64,
    /// Epoch of the weights the miner reported holding.
    #[serde(default)]
    pub weights_epoch: u64,
    /// Hash of its flat state after its last adoption (as reported in its heartbeat).
    #[serde(default)]
    pub weights_hash: Option<String>,
}

/// One section in [`StatusResponse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SectionStatus {
    /// Section index.
    pub index: usize,
    /// Block range `[start, end)`.
    pub blocks: [usize; 2],
    /// Its miners.
    pub miners: Vec<MinerStatus>,
}

/// Sample counters in [`StatusResponse`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SampleCounts {
    /// Samples whose backward reached the head.
    pub completed: u64,
    /// Samples dropped (each with a recorded reason in the ledger).
    pub dropped: u64,
    /// Samples under way.
    pub in_flight: u64,
}

/// `GET /api/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusResponse {
    /// Run name.
    pub run: String,
    /// Current phase.
    pub phase: Phase,
    /// Current epoch.
    pub epoch: u64,
    /// When the current phase must end, if it has a deadline.
    pub phase_deadline_unix_ms: Option<u64>,
    /// Sections and their miners.
    pub sections: Vec<SectionStatus>,
    /// Sample counters.
    pub samples: SampleCounts,
    /// Mean loss of the most recent completed samples.
    pub recent_loss: Option<f32>,
    /// Tokens per second over the recent window.
    pub tokens_per_s: f64,
    /// Tokens of the completed training samples.
    #[serde(default)]
    pub tokens: u64,
    /// Held-out loss of the latest fully evaluated merged model, evaluated through the network.
    #[serde(default)]
    pub eval_loss: Option<f32>,
    /// Held-out loss of the model each epoch started with, oldest first (see
    /// [`super::merge::EpochSummary`]).
    #[serde(default)]
    pub evals: Vec<EvalSummary>,
    /// The sample budget is spent, the last merge is done and its model evaluated.
    #[serde(default)]
    pub finished: bool,
    /// The subnet's metagraph as the orchestrator last read it (runs with `chain:` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<ChainStatus>,
}

/// The subnet a run is on (`chain:` in its run config).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunChain {
    /// The network: `finney`, `test` or a subtensor node's URL.
    pub network: String,
    /// The subnet.
    pub netuid: u16,
    /// The uid a weight vector's burned share goes to on chain.
    pub burn_uid: u16,
    /// The chain's genesis hash (hex), as the orchestrator's node gave it: what names the
    /// chain whatever node a validator reaches it through (absent if it could not be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub genesis: Option<String>,
}

/// The subnet's metagraph in `GET /api/status`, as of the orchestrator's last refresh.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChainStatus {
    /// The network.
    pub network: String,
    /// The subnet.
    pub netuid: u16,
    /// The block the metagraph was read at.
    pub block: u64,
    /// When it was read, ms since the Unix epoch.
    pub refreshed_unix_ms: u64,
    /// Why the latest refresh failed, if it did (the metagraph shown is then the one before).
    pub error: Option<String>,
    /// Every neuron of the subnet, by uid.
    pub neurons: Vec<ChainNeuron>,
}

/// One neuron of [`ChainStatus`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChainNeuron {
    /// Its uid.
    pub uid: u16,
    /// Its SS58 hotkey.
    pub hotkey: String,
    /// Stake on the hotkey, in TAO.
    pub stake_tao: f64,
    /// Whether it holds a validator permit (a validator of the run).
    pub validator_permit: bool,
    /// Its incentive at the chain's last epoch, in `[0, 1]`.
    pub incentive: f64,
    /// The block of its last weights on chain, set or committed (0: never).
    pub last_update: u64,
    /// Whether it is registered with this orchestrator as a miner.
    pub miner: bool,
    /// Validators only: the largest of the weights it last set, as the chain's storage held
    /// them when the metagraph was read: `(uid, share of the sum)`, largest first, at most
    /// five.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weights: Vec<(u16, f64)>,
    /// How many uids those weights cover in all.
    #[serde(default)]
    pub weights_count: usize,
}

/// The network's evaluation of the model one epoch started with (the merged model of the
/// epoch before; the initial weights at epoch 0).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EvalSummary {
    /// Epoch whose starting weights were evaluated.
    pub epoch: u64,
    /// Training samples completed before this epoch (the tokens that model has seen, in
    /// samples).
    pub trained_samples: u64,
    /// Evaluation samples of the epoch.
    pub samples: u64,
    /// Of which completed.
    pub completed: u64,
    /// Mean loss of the completed ones (each sample weighs the same: they hold equally many
    /// windows).
    pub eval_loss: Option<f32>,
}
