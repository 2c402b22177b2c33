//! The run config of `iota orchestrate --config run.yaml`: everything one training run needs.
//!
//! # Format
//! YAML; unknown keys are errors naming the key. Paths are relative to the current directory.
//!
//! ```yaml
//! run: local-tiny            # run name: clients sign requests for it; [A-Za-z0-9._-]
//! model: { preset: tiny }    # a preset plus any ModelConfig overrides
//! data: { source: synthetic, tokenizer: null }  # text_column: NAME for .jsonl/.parquet
//! storage: null              # StorageConfig; default: a local directory data_dir/objects
//! listen: 127.0.0.1:8700
//! public_url: null           # base URL clients reach; default http(s)://{listen}
//! tls: null                  # {cert: fullchain.pem, key: privkey.pem}: serve HTTPS (PEM files,
//!                            # re-read when they change); see docs/operators-tls.md
//! insecure_http: false       # plain HTTP on a non-loopback `listen` (behind a TLS proxy only)
//! data_dir: ./iota-run       # SQLite file, blob secret and local objects
//! max_miners_per_section: 50
//! batch_size: 4
//! seq_len: 64
//! seed: 0
//! wire: bf16
//! max_in_flight: 4
//! local_steps: 1
//! weight_stashing: true      # a backward recomputes at the weights its forward used
//! lookahead: false           # forwards at the weights extrapolated to their gradient's step
//! lanes: true                # route a sample through the same-ranked miner of each section
//! lane_wait_ms: 2000         # then anyone of the section may take a forward its lane left
//! single_lane_samples: 0     # the run's first N samples go through one lane only (a multiple
//!                            # of batches_before_merging; 0: off)
//! single_lane_max_in_flight: 1 # in-flight cap of the single lane's miners (0: max_in_flight)
//! early_in_flight_samples: 0 # the run's first N samples (ending an epoch) run every miner at...
//! early_max_in_flight: 1     # ...this in-flight cap (0: max_in_flight)
//! epoch_share_per_in_flight: 0 # a miner holds at most 1 forward per this many samples of its
//!                            # share of the epoch (at least 1; 0: off)
//! eval_samples: 32           # held-out windows evaluated through the network per epoch (0: off)
//! eval_every: 1              # evaluate every N-th epoch's starting weights (and the final ones)
//! optimizer: {}              # OptimizerConfig overrides
//! schedule: { peak: 0.003, warmup_steps: 20, total_steps: 1000, min_ratio: 0.1 }
//! deadlines: { forward_s: 30, backward_s: 60 }
//! batches_before_merging: 100  # samples completed per epoch, then uploading -> merging
//! early_merge_samples: 0     # the run's first N samples merge more often (0: off)...
//! early_merge_every: 20      # ...every this many samples (N a multiple of it)
//! merge:                     # MergeConfig
//!   op: mean                 # mean | geometric | median | trimmed[:F]
//!   replication: 2           # mergers per partition, cross-checked
//!   partitions_per_miner: 1
//!   upload_s: 60             # upload phase; leases may finish lease_grace_s later
//!   lease_grace_s: 15
//!   merge_s: 120             # then unmerged partitions fall back to the previous global
//!   tolerance: 1.0e-4        # relative, when comparing copies
//!   outlier_factor: 10       # uploads farther than this x the median distance are left out
//!   outer: null              # e.g. {lr: 0.7, momentum: 0.9}: Nesterov outer step
//! max_samples: null          # optional sample budget (sample units)
//! heartbeat_s: 10
//! miner_ttl_s: 60            # a miner silent this long no longer holds a section seat
//! placement:                 # where a new hotkey goes (orchestrator::repo::registry)
//!   claim_s: 30              # a hotkey that has done no work holds its seat this long
//!   pins: {}                 # {hotkey: section}: the operator's own miners (iota local)
//!   ordered: false           # true: fewest seated first, lowest index (private networks only)
//!   new_keys:                # new hotkeys per source address (orchestrator::admission)
//!     burst: 8               # at once ...
//!     per_hour: 30           # ... then this many an hour
//!     forwarded_for: false   # behind a reverse proxy on loopback: trust its X-Forwarded-For
//! penalties:                 # how penalties act on routing (orchestrator::repo::standing)
//!   backoff_s: 10            # no new work after a failure; doubles with each one in a row
//!   exclude_after: 3         # failures in a row that exclude a miner ...
//!   exclusion_s: 600         # ... for this long
//! validators:                # hotkeys allowed to validate, with their stake (default 1)
//!   - { hotkey: 5F..., stake: 1.0 }
//! validation: {}             # crate::api::ValidationSettings overrides (replay, clasp, ...)
//! chain: null                # {network: finney | test | ws://HOST:PORT, netuid: 9,
//!                            #  refresh_secs: 60, burn_uid: 0}: admit only the subnet's
//!                            # registered hotkeys, validators from its permits (leave out
//!                            # `validators`); see docs/chain.md
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;

use super::repo::Standing;
pub use super::repo_types::Epochs;
use super::tls::TlsFiles;
use crate::api::ValidationSettings;
use crate::chain::Network;
use crate::codec::MergeWire;
use crate::data::{DataSpec, StreamSettings};
use crate::merge::{MergeOp, OuterStep};
use crate::model::{LrSchedule, ModelConfig, OptimizerConfig};
use crate::storage::{KeyPart, StorageConfig, WireDtype};
use crate::wallet::Ss58Address;

/// Why a run config was refused.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read run config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The YAML is malformed, has an unknown key or a value of the wrong type.
    #[error("run config: {0}")]
    Parse(String),
    /// A value is out of range; the message names the key.
    #[error("run config: `{key}` {reason}")]
    Invalid {
        /// The offending key.
        key: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
}

/// Where the training text comes from.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// `synthetic[:SEED[:CHARS]]` or a path to text files ([`DataSpec`]); after validation
    /// it carries `text_column`.
    #[serde(default)]
    pub source: DataSpec,
    /// The `.jsonl` field / `.parquet` column holding the text (`None`: `text`). Refused with
    /// the synthetic corpus.
    #[serde(default)]
    pub text_column: Option<String>,
    /// A `tokenizer.json`; `None` means the byte tokenizer.
    #[serde(default)]
    pub tokenizer: Option<PathBuf>,
    /// Raw shards tokenized a block at a time in a bounded background pool, in the block
    /// layout (`crate::data::StreamSettings`); `None`: the whole source is tokenized before
    /// the run serves. No effect on the synthetic corpus or a prepared directory.
    #[serde(default)]
    pub stream: Option<StreamSettings>,
}

/// Time limits of one assignment.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deadlines {
    /// Seconds a miner has for a forward (a missed one is re-offered).
    #[serde(default = "default_forward_s")]
    pub forward_s: u64,
    /// Seconds a miner has for a backward (a missed one drops the sample).
    #[serde(default = "default_backward_s")]
    pub backward_s: u64,
}

fn default_forward_s() -> u64 {
    30
}
fn default_backward_s() -> u64 {
    60
}

impl Default for Deadlines {
    fn default() -> Self {
        Self {
            forward_s: default_forward_s(),
            backward_s: default_backward_s(),
        }
    }
}

/// How a section's miners merge their weights between training epochs.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MergeConfig {
    /// Operator: `mean` (weighted by backwards), `geometric`, `median`, `trimmed[:F]`.
    #[serde(default)]
    pub op: MergeOp,
    /// Mergers per partition (`r`; their copies are cross-checked).
    #[serde(default = "default_replication")]
    pub replication: usize,
    /// Partitions per uploader (`P = M * this`).
    #[serde(default = "default_one_usize")]
    pub partitions_per_miner: usize,
    /// Seconds miners have to upload their state.
    #[serde(default = "default_upload_s")]
    pub upload_s: u64,
    /// Seconds an upload started under a lease may finish after the upload phase ended.
    #[serde(default = "default_lease_grace_s")]
    pub lease_grace_s: u64,
    /// Seconds the mergers have once the plan is out; unmerged partitions then fall back.
    #[serde(default = "default_merge_s")]
    pub merge_s: u64,
    /// Seconds after the upload phase begins within which a live miner must ask for its
    /// upload to be waited for: a miner that stays silent, or keeps working without asking,
    /// does not hold the phase to its deadline.
    #[serde(default = "default_ask_s")]
    pub ask_s: u64,
    /// Once every partition has at least one copy, the mergers still missing are waited for
    /// as long again as covering them took, and at least this many seconds; then the section
    /// is finalised without them (each missing copy a penalty), so a merger that never
    /// delivers cannot hold the merge to `merge_s`.
    #[serde(default = "default_straggler_s")]
    pub straggler_s: u64,
    /// Relative tolerance when comparing the copies of a partition.
    #[serde(default = "default_tolerance")]
    pub tolerance: f32,
    /// Optional DiLoCo-style outer step (`{lr, momentum}`) on the merged parameters.
    #[serde(default)]
    pub outer: Option<OuterStep>,
    /// An upload whose distance from the previous global state exceeds this many times the
    /// median distance of the section's uploads is left out of the merge
    /// ([`super::outliers`]; applies with 3 or more uploads).
    #[serde(default = "default_outlier_factor")]
    pub outlier_factor: f64,
    /// Element format of the uploads and merged partitions: `f32` (lossless, default),
    /// `bf16`, `int8` (blocks of 256 with one scale; see [`crate::codec::merge_wire`]), or
    /// `dct`, `sign`, `sign2`, `q4` or `q4v2`, with `m4` or `m2` after it to code every first
    /// moment (`q4v2m2`; each optionally `:CHUNK[:KEEP[:MERGED_KEEP]]`), the compressed change
    /// from the previous global state with error feedback ([`crate::codec::merge_delta`]).
    #[serde(default)]
    pub wire: MergeWire,
}

fn default_replication() -> usize {
    2
}
fn default_one_usize() -> usize {
    1
}
fn default_upload_s() -> u64 {
    60
}
fn default_lease_grace_s() -> u64 {
    15
}
fn default_merge_s() -> u64 {
    120
}
fn default_ask_s() -> u64 {
    5
}
fn default_straggler_s() -> u64 {
    2
}
fn default_tolerance() -> f32 {
    1e-4
}

fn default_outlier_factor() -> f64 {
    10.0
}

impl Default for MergeConfig {
    fn default() -> Self {
        Self {
            op: MergeOp::default(),
            replication: default_replication(),
            partitions_per_miner: default_one_usize(),
            upload_s: default_upload_s(),
            lease_grace_s: default_lease_grace_s(),
            merge_s: default_merge_s(),
            ask_s: default_ask_s(),
            straggler_s: default_straggler_s(),
            tolerance: default_tolerance(),
            outer: None,
            outlier_factor: default_outlier_factor(),
            wire: MergeWire::default(),
        }
    }
}

/// A hotkey allowed to validate the run.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidatorEntry {
    /// SS58 hotkey.
    pub hotkey: String,
    /// Stake, for combining validators' weights (`validation.combine: stake`).
    #[serde(default = "default_stake")]
    pub stake: f64,
}

fn default_stake() -> f64 {
    1.0
}

/// The YAML as written (before the model is resolved).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRunConfig {
    run: String,
    #[serde(default)]
    model: Option<serde_json::Value>,
    #[serde(default)]
    data: DataConfig,
    #[serde(default)]
    storage: Option<StorageConfig>,
    #[serde(default = "default_listen")]
    listen: SocketAddr,
    #[serde(default)]
    public_url: Option<String>,
    #[serde(default)]
    tls: Option<TlsFiles>,
    #[serde(default)]
    insecure_http: bool,
    #[serde(default = "default_data_dir")]
    data_dir: PathBuf,
    #[serde(default = "default_max_miners")]
    max_miners_per_section: usize,
    #[serde(default = "default_batch_size")]
    batch_size: usize,
    #[serde(default = "default_seq_len")]
    seq_len: usize,
    #[serde(default)]
    seed: u64,
    #[serde(default)]
    wire: WireDtype,
    #[serde(default = "default_max_in_flight")]
    max_in_flight: usize,
    #[serde(default = "default_one")]
    local_steps: u64,
    #[serde(default = "default_true")]
    weight_stashing: bool,
    #[serde(default)]
    lookahead: bool,
    #[serde(default = "default_true")]
    lanes: bool,
    #[serde(default = "default_lane_wait_ms")]
    lane_wait_ms: u64,
    #[serde(default)]
    single_lane_samples: u64,
    #[serde(default = "default_one_usize")]
    single_lane_max_in_flight: usize,
    #[serde(default)]
    early_in_flight_samples: u64,
    #[serde(default = "default_one_usize")]
    early_max_in_flight: usize,
    #[serde(default)]
    epoch_share_per_in_flight: u64,
    #[serde(default)]
    samples_per_step: u64,
    #[serde(default)]
    bottleneck_warmup: u64,
    #[serde(default = "default_eval_samples")]
    eval_samples: usize,
    #[serde(default = "default_one")]
    eval_every: u64,
    #[serde(default)]
    optimizer: OptimizerConfig,
    #[serde(default)]
    schedule: LrSchedule,
    #[serde(default)]
    deadlines: Deadlines,
    #[serde(default = "default_batches_before_merging")]
    batches_before_merging: u64,
    #[serde(default)]
    early_merge_samples: u64,
    #[serde(default = "default_early_merge_every")]
    early_merge_every: u64,
    #[serde(default)]
    merge: MergeConfig,
    #[serde(default)]
    max_samples: Option<u64>,
    #[serde(default = "default_heartbeat_s")]
    heartbeat_s: u64,
    #[serde(default = "default_miner_ttl_s")]
    miner_ttl_s: u64,
    #[serde(default)]
    placement: PlacementConfig,
    #[serde(default)]
    penalties: PenaltyConfig,
    #[serde(default)]
    retention: RetentionConfig,
    #[serde(default)]
    samples: SamplesConfig,
    #[serde(default)]
    validators: Vec<ValidatorEntry>,
    #[serde(default)]
    validation: ValidationSettings,
    #[serde(default)]
    chain: Option<RawChainConfig>,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8700))
}
fn default_data_dir() -> PathBuf {
    PathBuf::from("iota-run")
}
fn default_max_miners() -> usize {
    50
}
fn default_batch_size() -> usize {
    4
}
fn default_seq_len() -> usize {
    64
}
fn default_max_in_flight() -> usize {
    4
}
fn default_lane_wait_ms() -> u64 {
    2000
}
fn default_one() -> u64 {
    1
}
fn default_true() -> bool {
    true
}
fn default_eval_samples() -> usize {
    32
}
fn default_batches_before_merging() -> u64 {
    100
}
fn default_early_merge_every() -> u64 {
    20
}
fn default_heartbeat_s() -> u64 {
    10
}
fn default_miner_ttl_s() -> u64 {
    60
}

/// Where new hotkeys go (see [`super::repo::Repository::register`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlacementConfig {
    /// Seconds a hotkey that has not had a result accepted holds its seat after registering:
    /// a flood of keys that never take work cannot lock a section for longer.
    pub claim_s: u64,
    /// Hotkeys the operator places in a section (its own miners: `iota local` pins each of
    /// its miners), by SS58 address.
    pub pins: std::collections::BTreeMap<String, usize>,
    /// New keys go to the section with the fewest seated miners, lowest first, whoever they
    /// are: deterministic, for a private network whose miners are all the operator's.
    /// Throwaway keys can steer a key into the section they want under it.
    pub ordered: bool,
    /// How fast new hotkeys may join from one address ([`super::admission`]).
    pub new_keys: NewKeyLimit,
}

/// New hotkeys one source address may register (`placement.new_keys`): `burst` at once, then
/// `per_hour`. Keys already known and pinned keys are not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NewKeyLimit {
    /// New keys an address may register at once.
    pub burst: u32,
    /// New keys an address may register per hour after its burst (0: no more).
    pub per_hour: u32,
    /// Behind a reverse proxy on loopback: the rightmost `X-Forwarded-For` entry is the
    /// source address of a request from the proxy.
    pub forwarded_for: bool,
}

impl Default for NewKeyLimit {
    fn default() -> Self {
        Self {
            burst: 8,
            per_hour: 30,
            forwarded_for: false,
        }
    }
}

impl Default for PlacementConfig {
    fn default() -> Self {
        Self {
            claim_s: Standing::default().claim_ms / 1000,
            pins: Default::default(),
            ordered: false,
            new_keys: NewKeyLimit::default(),
        }
    }
}

/// How penalties act on routing (see [`super::repo::Standing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PenaltyConfig {
    /// Seconds without new work after a failure; doubles with each further one in a row.
    pub backoff_s: u64,
    /// Failures in a row that exclude a miner.
    pub exclude_after: u32,
    /// Seconds an exclusion lasts.
    pub exclusion_s: u64,
}

impl Default for PenaltyConfig {
    fn default() -> Self {
        let d = Standing::default();
        Self {
            backoff_s: d.backoff_ms / 1000,
            exclude_after: d.exclude_after,
            exclusion_s: d.exclusion_ms / 1000,
        }
    }
}

/// How much history the orchestrator keeps ([`super::retention`]): the newest `checkpoints`
/// merged states (parameters and outer momentum) of every section, and the routing detail
/// (assignments, pathways) of the newest `ledger_epochs` epochs. Older ones go once no
/// validator still needs them. The sample ledger itself (one row per sample id, with its
/// outcome, reason and loss) and the per-epoch counters are never pruned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Section checkpoints kept (the newest; at least 1).
    pub checkpoints: u64,
    /// Epochs whose assignments and pathways are kept (the newest; at least 1).
    pub ledger_epochs: u64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            checkpoints: 3,
            ledger_epochs: 4,
        }
    }
}

/// Most tokens generated per dashboard sample.
pub const MAX_SAMPLE_TOKENS: usize = 1024;

/// Text the orchestrator samples from each newly merged model, shown on the dashboard
/// ([`super::samples`]). The whole model is loaded on the orchestrator's CPU for it, once an
/// epoch: no prompts (`prompts: []`) or `max_tokens: 0` turn it off.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplesConfig {
    /// The prompts, one sample each.
    pub prompts: Vec<String>,
    /// Most tokens per sample.
    pub max_tokens: usize,
    /// Sampling temperature (0: the likeliest token every time).
    pub temperature: f64,
    /// Nucleus sampling: the smallest set of tokens holding this much probability.
    pub top_p: f64,
    /// The sampler's seed: the same model and seed give the same text.
    pub seed: u64,
}

impl Default for SamplesConfig {
    fn default() -> Self {
        Self {
            prompts: vec!["The ".into(), "Once upon a time".into(), "He said".into()],
            max_tokens: 48,
            temperature: 0.8,
            top_p: 0.95,
            seed: 0,
        }
    }
}

/// The subnet a run is on, as written (`chain:`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawChainConfig {
    network: String,
    netuid: u16,
    #[serde(default = "default_refresh_secs")]
    refresh_secs: u64,
    #[serde(default)]
    burn_uid: u16,
}

fn default_refresh_secs() -> u64 {
    60
}

/// The subnet a run is on: the orchestrator admits the hotkeys of its metagraph, takes the
/// validators and their stake from its validator permits, and validators set weights there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainConfig {
    /// The network (not [`Network::Local`]).
    pub network: Network,
    /// The subnet.
    pub netuid: u16,
    /// Seconds between two reads of the metagraph (at least 1).
    pub refresh_secs: u64,
    /// The uid a weight vector's burned share goes to on chain (default 0).
    pub burn_uid: u16,
}

impl ChainConfig {
    /// The run's chain, as the API tells validators, with the chain's genesis hash where it
    /// is known.
    pub fn run_chain(&self, genesis: Option<[u8; 32]>) -> crate::api::RunChain {
        crate::api::RunChain {
            network: self.network.to_string(),
            netuid: self.netuid,
            burn_uid: self.burn_uid,
            genesis: genesis.map(hex::encode),
        }
    }
}

impl SamplesConfig {
    /// Whether samples are taken at all.
    pub fn enabled(&self) -> bool {
        !self.prompts.is_empty() && self.max_tokens > 0
    }
}

/// A validated run config.
#[derive(Debug, Clone, PartialEq)]
pub struct RunConfig {
    /// Run name (clients sign for it; a valid object-key component).
    pub run: String,
    /// The model, preset and overrides resolved and validated.
    pub model: ModelConfig,
    /// Training text and tokenizer.
    pub data: DataConfig,
    /// Object storage (default: `data_dir/objects`).
    pub storage: StorageConfig,
    /// Address the HTTP server binds.
    pub listen: SocketAddr,
    /// Base URL clients use to reach this server (blob URLs are built from it).
    pub public_url: String,
    /// The certificate and key to serve HTTPS with; `None`: plain HTTP.
    pub tls: Option<TlsFiles>,
    /// Plain HTTP is allowed on a non-loopback `listen` (a TLS reverse proxy in front).
    pub insecure_http: bool,
    /// Directory of the SQLite file, the blob secret and the local objects.
    pub data_dir: PathBuf,
    /// Most miners one section accepts.
    pub max_miners_per_section: usize,
    /// Token windows per sample unit (micro-batch).
    pub batch_size: usize,
    /// Tokens per window (inputs; windows hold one more token for the targets).
    pub seq_len: usize,
    /// Seed of the initial weights and of the data order.
    pub seed: u64,
    /// Encoding of boundary tensors.
    pub wire: WireDtype,
    /// Most forwards one miner holds awaiting their backward.
    pub max_in_flight: usize,
    /// Local optimizer step every this many backwards.
    pub local_steps: u64,
    /// Miners recompute a backward at the weights its forward used.
    pub weight_stashing: bool,
    /// Miners run forwards at the weights extrapolated to their gradient's step.
    pub lookahead: bool,
    /// Lane routing: miners are ranked within their section (by registration), and the
    /// forward a miner of rank `r` produces is offered first to the next section's miner of
    /// rank `r` (modulo that section's live miners), so between merges each lane is one
    /// consistent pipeline, as in data parallelism over whole pipeline replicas. Anyone of the
    /// section may take it after `lane_wait_ms`.
    pub lanes: bool,
    /// How long a forward waits for its lane's miner before any miner of its section may take
    /// it.
    pub lane_wait_ms: u64,
    /// The run's first this many samples are trained by one lane only: the first-ranked live
    /// miner of each section takes all training work, the others wait, and the merge that ends
    /// them gives every miner that lane's state (the others upload with no merge weight). The
    /// model then leaves its first plateau as one process would, before the miners train apart
    /// (see docs/learning-log.md). A multiple of `batches_before_merging`; 0: off.
    pub single_lane_samples: u64,
    /// During the single lane, each of its miners holds at most this many forwards awaiting a
    /// backward (fewer stale gradients while the model leaves its first plateau, at the cost
    /// of a shallower pipeline; default 1); 0: `max_in_flight`, as in the rest of the run.
    pub single_lane_max_in_flight: usize,
    /// The run's first this many samples run every miner, in every lane, at the in-flight cap
    /// `early_max_in_flight`: no stale gradients while the model leaves its first plateau,
    /// with no miner left idle (unlike the single lane), for a shallower pipeline then. Ends
    /// an epoch (like `single_lane_samples`); 0: off.
    pub early_in_flight_samples: u64,
    /// The in-flight cap of every miner during `early_in_flight_samples` (default 1); 0:
    /// `max_in_flight`.
    pub early_max_in_flight: usize,
    /// A miner holds at most one forward awaiting its backward per this many samples of its
    /// share of the epoch (the epoch's samples over its section's live miners), and at least
    /// one. The steps a miner takes after its last forward of an epoch are blind: no forward
    /// sees them before the merge. With 4-sample epochs and 4 in flight every step is, and the
    /// merged model was set back by up to 7.6 nats (docs/learning.md, "An open setback").
    /// 4 took that setting's setback from 3 of 3 runs to 1 of 10; off by default (0). At 16-sample
    /// epochs over 3 miners per section it holds a free-rider to one sample, so it misses one
    /// deadline an epoch, under the free-rider flag's floor of 3 (`validation.free_rider`):
    /// unflagged, though paid nothing, and `network_adversaries` asks for the flag.
    pub epoch_share_per_in_flight: u64,
    /// Samples per synchronous optimizer step: the orchestrator starts no sample of step
    /// `n + 1` before every sample of step `n` has finished, and every miner steps once per
    /// step (0: asynchronous steps every `local_steps` backwards).
    pub samples_per_step: u64,
    /// Length of the warm-up without the bottleneck, counted like the learning-rate schedule
    /// (samples, or synchronous steps with `samples_per_step`); 0: none. While it lasts the
    /// whole residual stream also crosses each boundary, weighted from 1 down to 0
    /// ([`crate::model::bridge_weight`]), so a sample's boundary tensors are `d_model`
    /// channels wider ([`Self::boundary_shape`]). Evaluations run the plain model.
    pub bottleneck_warmup: u64,
    /// Held-out windows evaluated through the network at the start of an evaluated epoch (0:
    /// none).
    pub eval_samples: usize,
    /// Epochs evaluated: every `eval_every`-th (0, N, 2N, ...), and the run's final one (the
    /// last merged model of a run with a sample budget). With frequent merges an evaluation
    /// every epoch costs a share of the run's throughput.
    pub eval_every: u64,
    /// Inner optimizer.
    pub optimizer: OptimizerConfig,
    /// Learning-rate schedule, evaluated at sample ids (the run's global progress).
    pub schedule: LrSchedule,
    /// Assignment deadlines.
    pub deadlines: Deadlines,
    /// Sample units completed per training epoch before the merge starts (after the early
    /// merges; see [`Config::epoch_samples`]).
    pub batches_before_merging: u64,
    /// The run's first this many samples are merged every `early_merge_every` samples instead
    /// of every `batches_before_merging`: the miners of a section drift apart fastest early,
    /// when the learning rate is at its peak and the model leaves its first plateau, so that
    /// is where frequent merges buy the most for their cost (see docs/learning-log.md). A
    /// multiple of `early_merge_every`; 0: off.
    pub early_merge_samples: u64,
    /// Samples per epoch during the early merges.
    pub early_merge_every: u64,
    /// The merge between epochs.
    pub merge: MergeConfig,
    /// Sample budget: no sample unit with an id at or above it is started.
    pub max_samples: Option<u64>,
    /// Seconds between miner heartbeats.
    pub heartbeat_s: u64,
    /// Seconds after which a silent miner no longer holds a seat in its section.
    pub miner_ttl_s: u64,
    /// Where new hotkeys go.
    pub placement: PlacementConfig,
    /// How penalties act on routing.
    pub penalties: PenaltyConfig,
    /// History kept: checkpoints and routing detail.
    pub retention: RetentionConfig,
    /// Text sampled from each merged model for the dashboard.
    pub samples: SamplesConfig,
    /// Hotkeys allowed to validate, with their stake.
    pub validators: Vec<ValidatorEntry>,
    /// How validators check miners and publish weights.
    pub validation: ValidationSettings,
    /// The subnet the run is on (`None`: no chain, the orchestrator's own registry and the
    /// `validators` list decide).
    pub chain: Option<ChainConfig>,
}

impl RunConfig {
    /// Reads and validates a YAML file.
    ///
    /// # Errors
    /// [`ConfigError::Read`], or as [`RunConfig::from_yaml`].
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_yaml(&text)
    }

    /// Parses and validates YAML text.
    ///
    /// # Errors
    /// [`ConfigError::Parse`] for malformed YAML or unknown keys, [`ConfigError::Invalid`]
    /// naming the key of a bad value.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let raw: RawRunConfig =
            serde_norway::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        let invalid = |key: &'static str, reason: String| ConfigError::Invalid { key, reason };
        KeyPart::new(&raw.run).map_err(|e| invalid("run", e.to_string()))?;
        let model_value = raw
            .model
            .unwrap_or_else(|| serde_json::Value::Object(serde_json::Map::new()));
        let model = ModelConfig::from_value(&model_value, "tiny")
            .map_err(|e| invalid("model", e.to_string()))?;
        for (key, value) in [
            ("max_miners_per_section", raw.max_miners_per_section),
            ("batch_size", raw.batch_size),
            ("seq_len", raw.seq_len),
            ("max_in_flight", raw.max_in_flight),
        ] {
            if value == 0 {
                return Err(invalid(key, "must be at least 1".into()));
            }
        }
        for (key, value) in [
            ("local_steps", raw.local_steps),
            ("deadlines.forward_s", raw.deadlines.forward_s),
            ("deadlines.backward_s", raw.deadlines.backward_s),
            ("batches_before_merging", raw.batches_before_merging),
            ("early_merge_every", raw.early_merge_every),
            ("heartbeat_s", raw.heartbeat_s),
            ("merge.upload_s", raw.merge.upload_s),
            ("merge.merge_s", raw.merge.merge_s),
        ] {
            if value == 0 {
                return Err(invalid(key, "must be at least 1".into()));
            }
        }
        if raw.miner_ttl_s <= raw.heartbeat_s {
            return Err(invalid(
                "miner_ttl_s",
                format!(
                    "is {} but must exceed heartbeat_s ({}): live miners would lose their seats",
                    raw.miner_ttl_s, raw.heartbeat_s
                ),
            ));
        }
        if raw.penalties.exclude_after == 0 {
            return Err(invalid(
                "penalties.exclude_after",
                "must be at least 1".into(),
            ));
        }
        if raw.seq_len > model.max_seq_len {
            return Err(invalid(
                "seq_len",
                format!(
                    "is {} but the model's max_seq_len is {}",
                    raw.seq_len, model.max_seq_len
                ),
            ));
        }
        for (key, value) in [
            ("merge.replication", raw.merge.replication),
            ("merge.partitions_per_miner", raw.merge.partitions_per_miner),
        ] {
            if value == 0 {
                return Err(invalid(key, "must be at least 1".into()));
            }
        }
        if !(raw.merge.tolerance.is_finite() && raw.merge.tolerance >= 0.0) {
            return Err(invalid("merge.tolerance", "must be finite and >= 0".into()));
        }
        if !(raw.merge.outlier_factor.is_finite() && raw.merge.outlier_factor >= 1.0) {
            return Err(invalid(
                "merge.outlier_factor",
                "must be finite and >= 1".into(),
            ));
        }
        if let Some(outer) = raw.merge.outer {
            let ok = outer.lr.is_finite()
                && outer.lr >= 0.0
                && outer.momentum.is_finite()
                && (0.0..1.0).contains(&outer.momentum);
            if !ok {
                return Err(invalid(
                    "merge.outer",
                    "needs a finite lr >= 0 and a momentum in [0, 1)".into(),
                ));
            }
        }
        if raw.bottleneck_warmup > 0 && !model.bottleneck {
            return Err(invalid(
                "bottleneck_warmup",
                format!(
                    "is {} but the model has no bottleneck to warm up (model.bottleneck is false)",
                    raw.bottleneck_warmup
                ),
            ));
        }
        if raw.samples_per_step > 0 {
            if raw.local_steps != 1 || raw.lookahead {
                return Err(invalid(
                    "samples_per_step",
                    "synchronous steps take no local_steps or lookahead: leave them at 1 and \
                     false"
                        .into(),
                ));
            }
            let early = (raw.early_merge_samples > 0).then_some(raw.early_merge_every);
            for (key, every) in [
                ("batches_before_merging", Some(raw.batches_before_merging)),
                ("early_merge_every", early),
            ] {
                if every.is_some_and(|n| !n.is_multiple_of(raw.samples_per_step)) {
                    return Err(invalid(
                        "samples_per_step",
                        format!(
                            "is {} but must divide {key} ({}), so that no optimizer step \
                             spans a merge",
                            raw.samples_per_step,
                            every.unwrap_or_default()
                        ),
                    ));
                }
            }
        }
        if !(raw.samples.temperature.is_finite() && raw.samples.temperature >= 0.0) {
            return Err(invalid(
                "samples.temperature",
                format!(
                    "is {} but must be 0 (the likeliest token) or more",
                    raw.samples.temperature
                ),
            ));
        }
        if !(raw.samples.top_p > 0.0 && raw.samples.top_p <= 1.0) {
            return Err(invalid(
                "samples.top_p",
                format!("is {} but must be in (0, 1]", raw.samples.top_p),
            ));
        }
        if raw.samples.max_tokens > MAX_SAMPLE_TOKENS {
            return Err(invalid(
                "samples.max_tokens",
                format!(
                    "is {} but at most {MAX_SAMPLE_TOKENS} are generated per prompt",
                    raw.samples.max_tokens
                ),
            ));
        }
        if raw.eval_every == 0 {
            return Err(invalid(
                "eval_every",
                "is 0 but must be at least 1 (eval_samples: 0 turns evaluation off)".to_string(),
            ));
        }
        if !raw
            .early_merge_samples
            .is_multiple_of(raw.early_merge_every)
        {
            return Err(invalid(
                "early_merge_samples",
                format!(
                    "is {} but must be a multiple of early_merge_every ({}), so that the early \
                     merges end with a merge",
                    raw.early_merge_samples, raw.early_merge_every
                ),
            ));
        }
        let epochs = Epochs {
            every: raw.batches_before_merging,
            early_samples: raw.early_merge_samples,
            early_every: raw.early_merge_every,
        };
        for (key, value, what) in [
            (
                "single_lane_samples",
                raw.single_lane_samples,
                "the single lane ends with a merge",
            ),
            (
                "early_in_flight_samples",
                raw.early_in_flight_samples,
                "the early cap ends with an epoch",
            ),
        ] {
            if epochs.count_in(value).is_none() {
                return Err(invalid(
                    key,
                    format!(
                        "is {value} but must be a multiple of batches_before_merging ({}) past \
                         the early merges ({} samples, every {}), so that {what}",
                        raw.batches_before_merging, raw.early_merge_samples, raw.early_merge_every
                    ),
                ));
            }
        }
        for (key, value) in [
            ("retention.checkpoints", raw.retention.checkpoints),
            ("retention.ledger_epochs", raw.retention.ledger_epochs),
        ] {
            if value == 0 {
                return Err(invalid(key, "must be at least 1".into()));
            }
        }
        if raw.max_samples == Some(0) {
            return Err(invalid("max_samples", "must be at least 1 when set".into()));
        }
        raw.schedule
            .validate()
            .map_err(|reason| invalid("schedule", reason))?;
        raw.optimizer
            .validate()
            .map_err(|reason| invalid("optimizer", reason))?;
        raw.validation
            .validate()
            .map_err(|(key, reason)| invalid(key, reason))?;
        let chain = match raw.chain {
            None => None,
            Some(c) => {
                let network: Network = c
                    .network
                    .parse()
                    .map_err(|e: String| invalid("chain.network", e))?;
                if network == Network::Local {
                    return Err(invalid(
                        "chain.network",
                        "is local, which is no chain: leave the `chain` block out for a run \
                         without one"
                            .into(),
                    ));
                }
                if c.refresh_secs == 0 {
                    return Err(invalid("chain.refresh_secs", "must be at least 1".into()));
                }
                if !raw.validators.is_empty() {
                    return Err(invalid(
                        "validators",
                        "must be left out with `chain`: the validators and their stake come \
                         from the subnet's validator permits"
                            .into(),
                    ));
                }
                Some(ChainConfig {
                    network,
                    netuid: c.netuid,
                    refresh_secs: c.refresh_secs,
                    burn_uid: c.burn_uid,
                })
            }
        };
        let has_validators = !raw.validators.is_empty() || chain.is_some();
        if has_validators && !raw.merge.wire.checked_by_validators() {
            // A sparse or 1-2 bit upload carries only part of this epoch's change (plus what
            // earlier uploads left out); the validators' state check compares the whole change
            // with one epoch's replay.
            return Err(invalid(
                "merge.wire",
                format!(
                    "{} is not checked by validators (their replay compares the whole \
                     change); with `validators` or `chain` use f32, bf16, int8 or a q4 format (q4, q4v2, \
                     q4v2m4, q4v2m2)",
                    raw.merge.wire
                ),
            ));
        }
        if raw.placement.new_keys.burst == 0 {
            return Err(invalid(
                "placement.new_keys.burst",
                "must be at least 1 (no new miner could ever join)".into(),
            ));
        }
        for (hotkey, section) in &raw.placement.pins {
            if hotkey.parse::<Ss58Address>().is_err() {
                return Err(invalid(
                    "placement.pins",
                    format!("{hotkey:?} is not an SS58 address"),
                ));
            }
            if *section >= model.n_sections() {
                return Err(invalid(
                    "placement.pins",
                    format!(
                        "{hotkey} is pinned to section {section}, but the model has {} sections",
                        model.n_sections()
                    ),
                ));
            }
        }
        for (i, v) in raw.validators.iter().enumerate() {
            if v.hotkey.parse::<Ss58Address>().is_err() {
                return Err(invalid(
                    "validators",
                    format!("entry {i}: {:?} is not an SS58 address", v.hotkey),
                ));
            }
            if !(v.stake.is_finite() && v.stake >= 0.0) {
                return Err(invalid(
                    "validators",
                    format!("entry {i}: stake must be finite and >= 0"),
                ));
            }
            if raw.validators[..i].iter().any(|o| o.hotkey == v.hotkey) {
                return Err(invalid(
                    "validators",
                    format!("entry {i}: {} is listed twice", v.hotkey),
                ));
            }
        }
        let storage = raw.storage.unwrap_or_else(|| {
            StorageConfig::local(raw.data_dir.join("objects").to_string_lossy().into_owned())
        });
        let scheme = if raw.tls.is_some() { "https" } else { "http" };
        let public_url = raw
            .public_url
            .unwrap_or_else(|| format!("{scheme}://{}", raw.listen))
            .trim_end_matches('/')
            .to_string();
        if !(public_url.starts_with("http://") || public_url.starts_with("https://")) {
            return Err(invalid(
                "public_url",
                "must start with http:// or https://".into(),
            ));
        }
        if raw.tls.is_some() && public_url.starts_with("http://") {
            return Err(invalid(
                "public_url",
                format!(
                    "is {public_url} but the orchestrator serves HTTPS (`tls` is set): make it https://"
                ),
            ));
        }
        check_transport(raw.listen, raw.tls.as_ref(), raw.insecure_http)?;
        let mut data = raw.data;
        data.source = data
            .source
            .with_text_column(data.text_column.as_deref())
            .map_err(|e| invalid("data.text_column", e.to_string()))?;
        Ok(Self {
            run: raw.run,
            model,
            data,
            storage,
            listen: raw.listen,
            public_url,
            tls: raw.tls,
            insecure_http: raw.insecure_http,
            data_dir: raw.data_dir,
            max_miners_per_section: raw.max_miners_per_section,
            batch_size: raw.batch_size,
            seq_len: raw.seq_len,
            seed: raw.seed,
            wire: raw.wire,
            max_in_flight: raw.max_in_flight,
            local_steps: raw.local_steps,
            weight_stashing: raw.weight_stashing,
            lookahead: raw.lookahead,
            lanes: raw.lanes,
            lane_wait_ms: raw.lane_wait_ms,
            single_lane_samples: raw.single_lane_samples,
            single_lane_max_in_flight: raw.single_lane_max_in_flight,
            early_in_flight_samples: raw.early_in_flight_samples,
            early_max_in_flight: raw.early_max_in_flight,
            epoch_share_per_in_flight: raw.epoch_share_per_in_flight,
            early_merge_samples: raw.early_merge_samples,
            early_merge_every: raw.early_merge_every,
            samples_per_step: raw.samples_per_step,
            bottleneck_warmup: raw.bottleneck_warmup,
            eval_samples: raw.eval_samples,
            eval_every: raw.eval_every,
            // Synchronous steps have no stale gradients: beta1 does not grow with staleness.
            optimizer: if raw.samples_per_step > 0 {
                raw.optimizer.synchronous()
            } else {
                raw.optimizer
            },
            schedule: raw.schedule,
            deadlines: raw.deadlines,
            batches_before_merging: raw.batches_before_merging,
            merge: raw.merge,
            max_samples: raw.max_samples,
            heartbeat_s: raw.heartbeat_s,
            miner_ttl_s: raw.miner_ttl_s,
            placement: raw.placement,
            penalties: raw.penalties,
            retention: raw.retention,
            samples: raw.samples,
            validators: raw.validators,
            validation: raw.validation,
            chain,
        })
    }

    /// Checks that the orchestrator may serve on its `listen` address as configured (after an
    /// override of `listen`): see [`check_transport`].
    ///
    /// # Errors
    /// As [`check_transport`].
    pub fn check_transport(&self) -> Result<(), ConfigError> {
        check_transport(self.listen, self.tls.as_ref(), self.insecure_http)
    }

    /// The standing policy of the state store (penalties and liveness, in milliseconds).
    pub fn standing(&self) -> Standing {
        Standing {
            backoff_ms: self.penalties.backoff_s.saturating_mul(1000),
            exclude_after: self.penalties.exclude_after,
            exclusion_ms: self.penalties.exclusion_s.saturating_mul(1000),
            miner_ttl_ms: self.miner_ttl_s.saturating_mul(1000),
            claim_ms: self.placement.claim_s.saturating_mul(1000),
        }
    }

    /// Shape of sample `sample`'s boundary tensors (activations and gradients):
    /// `[batch, seq, width]`, `d_model` channels wider during the warm-up without the
    /// bottleneck ([`Self::bottleneck_warmup`]).
    pub fn boundary_shape(&self, sample: u64) -> Vec<usize> {
        let place = crate::model::schedule::schedule_place(sample, self.samples_per_step);
        let bridge = crate::model::bridge_weight(place, self.bottleneck_warmup);
        vec![
            self.batch_size,
            self.seq_len,
            self.model.boundary_width_with_bridge(bridge),
        ]
    }

    /// The settings every miner of the run follows (and a validator replays with), with a
    /// miner's bound of forwards awaiting their backward.
    pub fn miner_settings(&self, max_in_flight: usize) -> crate::api::MinerSettings {
        crate::api::MinerSettings {
            local_steps: self.local_steps,
            max_in_flight,
            wire: self.wire,
            seq_len: self.seq_len,
            batch_size: self.batch_size,
            seed: self.seed,
            optimizer: self.optimizer,
            schedule: self.schedule,
            weight_stashing: self.weight_stashing,
            lookahead: self.lookahead,
            samples_per_step: self.samples_per_step,
            bottleneck_warmup: self.bottleneck_warmup,
            heartbeat_s: self.heartbeat_s,
        }
    }

    /// Shape of the token ids and targets of one sample unit: `[batch, seq]`.
    pub fn token_shape(&self) -> Vec<usize> {
        vec![self.batch_size, self.seq_len]
    }

    /// How the run's samples divide into training epochs.
    pub fn epochs(&self) -> Epochs {
        Epochs {
            every: self.batches_before_merging,
            early_samples: self.early_merge_samples,
            early_every: self.early_merge_every,
        }
    }

    /// Samples completed in training epoch `epoch` before its merge.
    pub fn epoch_samples(&self, epoch: u64) -> u64 {
        self.epochs().samples_in(epoch)
    }

    /// Index of the last (tail) section.
    pub fn tail(&self) -> usize {
        self.model.n_sections().saturating_sub(1)
    }

    /// The validator entry of `hotkey`, if it may validate.
    pub fn validator(&self, hotkey: &str) -> Option<&ValidatorEntry> {
        self.validators.iter().find(|v| v.hotkey == hotkey)
    }
}

/// Refuses plain HTTP on an address other machines can reach, unless the operator said
/// `insecure_http: true` (a TLS reverse proxy in front): miners' upload tokens and the
/// dashboard would cross the network in the clear.
///
/// # Errors
/// [`ConfigError::Invalid`] for `listen`, saying why and what to do, on one line.
pub fn check_transport(
    listen: SocketAddr,
    tls: Option<&TlsFiles>,
    insecure_http: bool,
) -> Result<(), ConfigError> {
    if tls.is_some() || insecure_http || listen.ip().is_loopback() {
        return Ok(());
    }
    Err(ConfigError::Invalid {
        key: "listen",
        reason: format!(
            "is {listen}, reachable from other machines, but the orchestrator would speak plain              HTTP there (upload tokens and the dashboard readable and alterable on the way): add              `tls: {{cert: FULLCHAIN.pem, key: PRIVKEY.pem}}`, or listen on 127.0.0.1 behind a              TLS reverse proxy, or set `insecure_http: true` to accept the risk (see              docs/operators-tls.md)"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_config_takes_defaults() {
        let cfg = RunConfig::from_yaml("run: r1\n").unwrap();
        assert_eq!(cfg.run, "r1");
        assert_eq!(cfg.model.name, "tiny");
        assert_eq!(cfg.max_miners_per_section, 50);
        assert_eq!(cfg.epoch_share_per_in_flight, 0);
        assert_eq!(cfg.public_url, "http://127.0.0.1:8700");
        assert_eq!(cfg.storage.url, "iota-run/objects");
        assert_eq!(cfg.deadlines, Deadlines::default());
        assert_eq!(cfg.token_shape(), vec![4, 64]);
        assert!(cfg.lanes, "lane routing is the default");
        assert_eq!(cfg.single_lane_samples, 0);
        assert_eq!(cfg.single_lane_max_in_flight, 1);
        assert_eq!(cfg.early_in_flight_samples, 0);
        assert_eq!(cfg.early_max_in_flight, 1);
        assert_eq!(cfg.eval_every, 1);
    }

    #[test]
    fn the_bottleneck_warmup_widens_the_boundary_of_its_samples_only() {
        let cfg = RunConfig::from_yaml("run: r\nbottleneck_warmup: 4\n").unwrap();
        let (w, d) = (cfg.model.boundary_width(), cfg.model.d_model);
        assert!(w < d);
        let widths = |cfg: &RunConfig, samples: &[u64]| -> Vec<usize> {
            samples.iter().map(|&s| cfg.boundary_shape(s)[2]).collect()
        };
        assert_eq!(widths(&cfg, &[0, 3, 4, 5]), [w + d, w + d, w, w]);
        // Evaluation samples (ids far past any training sample) cross the plain boundary.
        assert_eq!(widths(&cfg, &[1 << 48]), [w]);
        // Synchronous steps count the warm-up in steps, like the schedule.
        let sync = RunConfig::from_yaml(
            "run: r\nbottleneck_warmup: 2\nsamples_per_step: 4\nbatches_before_merging: 8\n",
        )
        .unwrap();
        assert_eq!(widths(&sync, &[0, 7, 8]), [w + d, w + d, w]);
        let off = RunConfig::from_yaml("run: r\n").unwrap();
        assert_eq!(widths(&off, &[0]), [w]);
        let err = RunConfig::from_yaml(
            "run: r\nmodel: {preset: tiny, bottleneck: false}\nbottleneck_warmup: 4\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("`bottleneck_warmup`") && err.contains("no bottleneck"),
            "{err}"
        );
    }

    #[test]
    fn overrides_are_applied() {
        let yaml = "run: r2\nmodel: {preset: tiny, n_layers: 6, sections: [[0,2],[2,4],[4,6]]}\n\
                    batch_size: 2\nseq_len: 16\nwire: f32\ndeadlines: {forward_s: 5}\n\
                    max_samples: 10\n";
        let cfg = RunConfig::from_yaml(yaml).unwrap();
        assert_eq!(cfg.model.n_sections(), 3);
        assert_eq!(cfg.tail(), 2);
        assert_eq!(cfg.wire, WireDtype::F32);
        assert_eq!(cfg.deadlines.forward_s, 5);
        assert_eq!(cfg.deadlines.backward_s, 60);
        assert_eq!(cfg.max_samples, Some(10));
        assert_eq!(cfg.boundary_shape(0)[..2], [2, 16]);
    }

    #[test]
    fn text_column_is_carried_into_the_data_source() {
        let cfg =
            RunConfig::from_yaml("run: r\ndata: {source: shards, text_column: content}\n").unwrap();
        assert_eq!(
            cfg.data.source,
            DataSpec::path("shards")
                .with_text_column(Some("content"))
                .unwrap()
        );
        let err = RunConfig::from_yaml("run: r\ndata: {text_column: content}\n").unwrap_err();
        assert!(
            err.to_string().contains("`data.text_column`") && err.to_string().contains("synthetic"),
            "{err}"
        );
    }

    #[test]
    fn early_merges_shorten_the_first_epochs() {
        let cfg = RunConfig::from_yaml(
            "run: r\nbatches_before_merging: 100\nearly_merge_samples: 60\n\
             early_merge_every: 20\nsingle_lane_samples: 160\n",
        )
        .unwrap();
        let lens: Vec<u64> = (0..5).map(|e| cfg.epoch_samples(e)).collect();
        assert_eq!(lens, [20, 20, 20, 100, 100]);
        let epochs = cfg.epochs();
        assert_eq!(epochs.count_in(0), Some(0));
        assert_eq!(epochs.count_in(40), Some(2));
        assert_eq!(epochs.count_in(160), Some(4));
        assert_eq!(epochs.count_in(50), None);
        assert_eq!(epochs.count_in(100), None);
        // Off by default: every epoch is `batches_before_merging` long.
        let plain = RunConfig::from_yaml("run: r\n").unwrap();
        assert_eq!(plain.early_merge_samples, 0);
        assert_eq!((plain.epoch_samples(0), plain.epoch_samples(7)), (100, 100));
        // A single lane must end on an epoch's end, early or not.
        let err =
            RunConfig::from_yaml("run: r\nearly_merge_samples: 60\nsingle_lane_samples: 100\n")
                .unwrap_err();
        assert!(err.to_string().contains("`single_lane_samples`"), "{err}");
        // A synchronous step may not span an early merge either.
        let err = RunConfig::from_yaml(
            "run: r\nsamples_per_step: 4\nearly_merge_samples: 60\nearly_merge_every: 30\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("early_merge_every (30)"), "{err}");
    }

    #[test]
    fn plain_http_off_loopback_is_refused_unless_asked_for() {
        let err = RunConfig::from_yaml("run: r\nlisten: 0.0.0.0:8700\n").unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("run config: `listen` is 0.0.0.0:8700"),
            "{text}"
        );
        assert!(
            text.contains("tls:") && text.contains("insecure_http: true"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 1);
        let cfg =
            RunConfig::from_yaml("run: r\nlisten: 0.0.0.0:8700\ninsecure_http: true\n").unwrap();
        assert_eq!(cfg.public_url, "http://0.0.0.0:8700");
        assert!(RunConfig::from_yaml("run: r\nlisten: '[::1]:8700'\n").is_ok());
        // With a certificate the default public URL is https, and an http one is refused.
        let cfg =
            RunConfig::from_yaml("run: r\nlisten: 0.0.0.0:8443\ntls: {cert: c.pem, key: k.pem}\n")
                .unwrap();
        assert_eq!(cfg.public_url, "https://0.0.0.0:8443");
        assert_eq!(
            cfg.tls.as_ref().map(|t| t.key.as_path()),
            Some(Path::new("k.pem"))
        );
        let err = RunConfig::from_yaml(
            "run: r\ntls: {cert: c.pem, key: k.pem}\npublic_url: http://o.example\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("`public_url`"), "{err}");
        let err = RunConfig::from_yaml("run: r\ntls: {cert: c.pem}\n").unwrap_err();
        assert!(err.to_string().contains("key"), "{err}");
        // An override of `listen` is checked again.
        let mut cfg = RunConfig::from_yaml("run: r\n").unwrap();
        cfg.listen = "0.0.0.0:1".parse().unwrap();
        assert!(cfg.check_transport().is_err());
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = RunConfig::from_yaml("run: r\nbatch_sise: 3\n").unwrap_err();
        assert!(err.to_string().contains("batch_sise"), "{err}");
        let err = RunConfig::from_yaml("run: r\ndeadlines: {forward: 3}\n").unwrap_err();
        assert!(err.to_string().contains("forward"), "{err}");
    }

    #[test]
    fn example_configs_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        let local = RunConfig::load(&dir.join("local.yaml")).unwrap();
        assert_eq!(
            (local.run.as_str(), local.model.n_sections()),
            ("local-tiny", 3)
        );
        assert_eq!(local.storage.url, "./iota-run/objects");
        let s3 = RunConfig::load(&dir.join("s3.yaml")).unwrap();
        assert_eq!(s3.storage.url, "s3://iota-bucket/runs");
        assert!(RunConfig::load(&dir.join("missing.yaml")).is_err());
    }

    #[test]
    fn invalid_values_name_the_key() {
        let err = RunConfig::from_yaml("run: r\nbatch_size: 0\n").unwrap_err();
        assert!(err.to_string().contains("`batch_size`"), "{err}");
        let err = RunConfig::from_yaml("run: a/b\n").unwrap_err();
        assert!(err.to_string().contains("`run`"), "{err}");
        let err = RunConfig::from_yaml("run: r\nseq_len: 100000\n").unwrap_err();
        assert!(err.to_string().contains("`seq_len`"), "{err}");
        let err = RunConfig::from_yaml("run: r\neval_every: 0\n").unwrap_err();
        assert!(err.to_string().contains("`eval_every`"), "{err}");
        for (yaml, key) in [
            ("samples: {temperature: -1}", "`samples.temperature`"),
            ("samples: {top_p: 0}", "`samples.top_p`"),
            ("samples: {max_tokens: 5000}", "`samples.max_tokens`"),
        ] {
            let err = RunConfig::from_yaml(&format!("run: r\n{yaml}\n")).unwrap_err();
            assert!(err.to_string().contains(key), "{yaml}: {err}");
        }
        let cfg = RunConfig::from_yaml("run: r\nsamples: {prompts: []}\n").unwrap();
        assert!(!cfg.samples.enabled());
        assert!(RunConfig::from_yaml("run: r\n").unwrap().samples.enabled());
        let err = RunConfig::from_yaml("run: r\nearly_merge_samples: 50\n").unwrap_err();
        assert!(
            err.to_string().contains("multiple of early_merge_every"),
            "{err}"
        );
        let err = RunConfig::from_yaml("run: r\nearly_in_flight_samples: 150\n").unwrap_err();
        assert!(
            err.to_string().contains("`early_in_flight_samples`"),
            "{err}"
        );
        let err = RunConfig::from_yaml("run: r\nsingle_lane_samples: 150\n").unwrap_err();
        assert!(
            err.to_string()
                .contains("multiple of batches_before_merging"),
            "{err}"
        );
        let err = RunConfig::from_yaml("run: r\nplacement: {new_keys: {burst: 0}}\n").unwrap_err();
        assert!(
            err.to_string().contains("`placement.new_keys.burst`"),
            "{err}"
        );
        let cfg = RunConfig::from_yaml(
            "run: r\nplacement: {new_keys: {per_hour: 4, forwarded_for: true}}\n",
        )
        .unwrap();
        assert_eq!(
            (
                cfg.placement.new_keys.burst,
                cfg.placement.new_keys.per_hour
            ),
            (8, 4)
        );
        assert!(cfg.placement.new_keys.forwarded_for);
        let err = RunConfig::from_yaml("run: r\nmerge: {replication: 0}\n").unwrap_err();
        assert!(err.to_string().contains("`merge.replication`"), "{err}");
        let err =
            RunConfig::from_yaml("run: r\nmerge: {outer: {lr: 1, momentum: 1}}\n").unwrap_err();
        assert!(err.to_string().contains("`merge.outer`"), "{err}");
        let cfg = RunConfig::from_yaml("run: r\nmerge: {op: 'trimmed:0.1', merge_s: 5}\n").unwrap();
        assert_eq!(cfg.merge.op, MergeOp::Trimmed { fraction: 0.1 });
        assert_eq!(cfg.merge.merge_s, 5);
        let err = RunConfig::from_yaml("run: r\nmodel: {preset: nope}\n").unwrap_err();
        assert!(err.to_string().contains("`model`"), "{err}");
        let err = RunConfig::from_yaml("run: r\nvalidators: [{hotkey: nope}]\n").unwrap_err();
        assert!(err.to_string().contains("`validators`"), "{err}");
        let err = RunConfig::from_yaml("run: r\nvalidation: {burn: 2}\n").unwrap_err();
        assert!(err.to_string().contains("`validation.burn`"), "{err}");
        let err =
            RunConfig::from_yaml("run: r\nvalidation: {replay: {fractoin: 1}}\n").unwrap_err();
        assert!(err.to_string().contains("fractoin"), "{err}");
        let alice = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY";
        let cfg = RunConfig::from_yaml(&format!(
            "run: r\nvalidators: [{{hotkey: {alice}, stake: 3}}]\nvalidation: {{burn: 0.5}}\n"
        ))
        .unwrap();
        assert_eq!(cfg.validator(alice).map(|v| v.stake), Some(3.0));
        assert_eq!(cfg.validation.burn, 0.5);
        let twice = format!("run: r\nvalidators: [{{hotkey: {alice}}}, {{hotkey: {alice}}}]\n");
        assert!(RunConfig::from_yaml(&twice).is_err());
        // The validators' state check compares the whole change: sparse and 1-2 bit uploads
        // are refused by name, 4-bit ones accepted.
        let with = |wire: &str| {
            RunConfig::from_yaml(&format!(
                "run: r\nvalidators: [{{hotkey: {alice}}}]\nmerge: {{wire: {wire}}}\n"
            ))
        };
        for wire in ["dct", "sign", "sign2v2"] {
            let err = with(wire).unwrap_err();
            assert!(err.to_string().contains("`merge.wire`"), "{wire}: {err}");
        }
        for wire in ["q4", "q4v2", "bf16"] {
            assert!(with(wire).is_ok(), "{wire}");
        }
        assert!(RunConfig::from_yaml("run: r\nmerge: {wire: dct}\n").is_ok());
    }
}
