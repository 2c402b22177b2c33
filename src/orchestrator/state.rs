//! [`AppState`]: what every request handler shares (config, state store, object storage,
//! dataset, blob secret, clock, metrics).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use thiserror::Error;

use super::blob_token::BlobSecret;
use super::config::RunConfig;
use super::metrics::Metrics;
use super::repo::{EVAL_SAMPLES_MAX, Repository, off_async_workers};
use super::repo_types::{RepoError, RoutingLimits};
use crate::codec::token_ids;
use crate::data::{DataError, Dataset, Tokenizer};
use crate::storage::{
    Hotkey, KeyError, KeyPart, ObjectKey, RunKeys, StatePart, Storage, StorageError,
};

/// File name of the state database inside `data_dir`.
pub const STATE_FILE: &str = "state.sqlite";
/// File name of the blob secret inside `data_dir`.
pub const SECRET_FILE: &str = "blob_secret";
/// File name, inside `data_dir`, of the token counts of a streamed source's blocks
/// ([`Dataset::keep_stream_counts`]), so a restart locates samples without tokenizing again.
pub const STREAM_COUNTS_FILE: &str = "stream-counts.json";

/// Most `/blob` uploads streaming at once ([`super::blob`]); more are turned away (503).
pub const MAX_CONCURRENT_PUTS: usize = 8;
/// Bytes of what the orchestrator stored recently kept in memory for its own read-backs
/// (uploads it checks and serves to mergers, merged copies, checkpoints; see
/// [`crate::storage::recent`]): 256 MiB, objects up to 64 MiB each.
pub const RECENT_WRITES_BUDGET: usize = 256 << 20;

/// Most stored sample tokens [`AppState`] remembers.
pub const STAGED_MAX: usize = 256;

/// Samples past the run's next id whose tokens are stored ahead of their start, in the
/// background ([`AppState::prestaging`]); well below [`STAGED_MAX`].
pub const PRESTAGE_AHEAD: u64 = 32;

/// Why the orchestrator could not start.
#[derive(Debug, Error)]
pub enum StartError {
    /// The data directory or the secret file.
    #[error("data directory: {0}")]
    Io(#[from] std::io::Error),
    /// The state database.
    #[error(transparent)]
    Repo(#[from] RepoError),
    /// Object storage.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The dataset or tokenizer.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The run name is not a valid key component.
    #[error("run name: {0}")]
    Key(#[from] KeyError),
    /// The tokenizer does not fit the model.
    #[error("the tokenizer has {tokenizer} tokens but the model's vocab_size is {model}")]
    Vocab {
        /// Tokenizer vocabulary.
        tokenizer: usize,
        /// Model vocabulary.
        model: usize,
    },
}

/// Milliseconds since the Unix epoch, from a replaceable clock (tests move time by hand).
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The system clock.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    })
}

/// Shared state of the server; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

/// The shared parts (reach them through [`AppState`]'s `Deref`).
pub struct Inner {
    /// The run config.
    pub config: RunConfig,
    /// Durable state.
    pub repo: Repository,
    /// Object storage.
    pub storage: Storage,
    /// Training data.
    pub dataset: Dataset,
    /// Key layout of the run.
    pub keys: RunKeys,
    /// Secret of the local blob tokens.
    pub secret: BlobSecret,
    /// Time source.
    pub clock: Clock,
    /// Request and routing counters.
    pub metrics: Metrics,
    /// Taken by the one request that starts an epoch's evaluation samples.
    pub eval_lock: tokio::sync::Mutex<()>,
    /// Hashes of sample tokens already stored, by `(epoch, sample)` ([`Self::stage_tokens`]).
    pub staged: std::sync::Mutex<std::collections::BTreeMap<(u64, u64), (String, String)>>,
    /// Set while a background task stores the tokens of the next samples ahead of their
    /// start (one at a time).
    pub prestaging: std::sync::atomic::AtomicBool,
    /// Serialises the phase machine ([`super::cycle::advance`]).
    pub cycle_lock: tokio::sync::Mutex<()>,
    /// Initial flat states of sections, built once ([`super::reference`]).
    pub initial_states: std::sync::Mutex<std::collections::HashMap<usize, Arc<Vec<f32>>>>,
    /// Assignments whose submitted result is being checked (one check each at a time).
    pub in_check: std::sync::Mutex<std::collections::HashSet<u64>>,
    /// Permits of the `/blob` uploads streaming at once ([`MAX_CONCURRENT_PUTS`]).
    pub blob_puts: Arc<tokio::sync::Semaphore>,
    /// Server start, ms since the Unix epoch.
    pub started_ms: u64,
    /// Wakes `/api/work` requests waiting for work when routing gives their miner some.
    pub wakeups: super::wakeups::Wakeups,
    /// Counts changes of the merge cycle (a phase began, a plan was built, a section was
    /// merged): `/api/merge/task` requests that have nothing to do wait for the next one.
    pub merge_events: tokio::sync::watch::Sender<u64>,
    /// New hotkeys' registrations per source address ([`super::admission`]).
    pub new_keys: super::admission::NewKeys,
    /// Text sampled from the newest merged model, for the dashboard.
    pub samples: super::sample_store::Samples,
    /// The subnet the run is on, once attached ([`AppState::attach_subnet`]).
    pub subnet: std::sync::OnceLock<Arc<super::subnet::Subnet>>,
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.inner
    }
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("run", &self.config.run)
            .finish_non_exhaustive()
    }
}

impl AppState {
    /// Opens everything `config` names: creates `data_dir`, opens `data_dir/state.sqlite`,
    /// the blob secret, the object storage, and loads the dataset.
    ///
    /// # Errors
    /// [`StartError`] naming what could not be opened.
    pub fn open(config: RunConfig) -> Result<Self, StartError> {
        std::fs::create_dir_all(&config.data_dir)?;
        let repo = Repository::open(&config.data_dir.join(STATE_FILE))?;
        let secret = BlobSecret::load_or_create(&config.data_dir.join(SECRET_FILE))?;
        let storage = Storage::open(&config.storage)?.with_recent_writes(RECENT_WRITES_BUDGET);
        let tokenizer = Tokenizer::load(config.data.tokenizer.as_deref())?;
        if tokenizer.vocab_size() > config.model.vocab_size {
            return Err(StartError::Vocab {
                tokenizer: tokenizer.vocab_size(),
                model: config.model.vocab_size,
            });
        }
        let dataset = Dataset::load_with(
            &config.data.source,
            &tokenizer,
            config.seq_len,
            config.seed,
            config.data.stream,
        )?;
        dataset.keep_stream_counts(&config.data_dir.join(STREAM_COUNTS_FILE));
        Self::from_parts(config, repo, storage, dataset, secret, system_clock())
    }

    /// Assembles a state from opened parts (tests use an in-memory store and a fake clock).
    ///
    /// # Errors
    /// [`StartError::Key`] for a run name that is not a key component.
    pub fn from_parts(
        config: RunConfig,
        repo: Repository,
        storage: Storage,
        dataset: Dataset,
        secret: BlobSecret,
        clock: Clock,
    ) -> Result<Self, StartError> {
        let keys = RunKeys::new(&config.run)?;
        let started_ms = clock();
        let repo = repo.with_standing(config.standing());
        let n_sections = config.model.n_sections();
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                repo,
                storage,
                dataset,
                keys,
                secret,
                clock,
                metrics: Metrics::default(),
                eval_lock: tokio::sync::Mutex::new(()),
                staged: std::sync::Mutex::new(std::collections::BTreeMap::new()),
                prestaging: std::sync::atomic::AtomicBool::new(false),
                cycle_lock: tokio::sync::Mutex::new(()),
                initial_states: std::sync::Mutex::new(std::collections::HashMap::new()),
                in_check: std::sync::Mutex::new(std::collections::HashSet::new()),
                blob_puts: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_PUTS)),
                started_ms,
                wakeups: super::wakeups::Wakeups::new(n_sections),
                merge_events: tokio::sync::watch::Sender::new(0),
                new_keys: super::admission::NewKeys::default(),
                samples: super::sample_store::Samples::default(),
                subnet: std::sync::OnceLock::new(),
            }),
        })
    }

    /// Puts the run on `subnet` (before serving): from now on its metagraph admits miners and
    /// names the validators ([`super::subnet`]). A second call changes nothing.
    pub fn attach_subnet(&self, subnet: Arc<super::subnet::Subnet>) {
        let _ = self.subnet.set(subnet);
    }

    /// The subnet the run is on, if one is attached.
    pub fn subnet(&self) -> Option<&Arc<super::subnet::Subnet>> {
        self.subnet.get()
    }

    /// The run's validators: the subnet's validator permits where the run is on a chain, else
    /// the run config's list.
    pub fn validators(&self) -> Vec<super::config::ValidatorEntry> {
        match self.subnet() {
            Some(subnet) => subnet.validators(),
            None => self.config.validators.clone(),
        }
    }

    /// The validator entry of `hotkey`, if it may validate ([`Self::validators`]).
    pub fn validator(&self, hotkey: &str) -> Option<super::config::ValidatorEntry> {
        match self.subnet() {
            Some(_) => self.validators().into_iter().find(|v| v.hotkey == hotkey),
            None => self.config.validator(hotkey).cloned(),
        }
    }

    /// Tells the merge tasks waiting on [`Inner::merge_events`] that the merge cycle moved.
    pub fn merge_changed(&self) {
        self.merge_events.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Now, in ms since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        (self.clock)()
    }

    /// The routing limits of the config.
    pub fn limits(&self) -> RoutingLimits {
        RoutingLimits {
            forward_ms: self.config.deadlines.forward_s.saturating_mul(1000),
            backward_ms: self.config.deadlines.backward_s.saturating_mul(1000),
            max_in_flight: self.config.max_in_flight,
            tail: self.config.tail(),
            samples_per_step: self.config.samples_per_step,
            live_ms: self.config.miner_ttl_s.saturating_mul(1000),
            lanes: self.config.lanes,
            lane_wait_ms: self.config.lane_wait_ms,
            single_lane_epochs: self
                .config
                .epochs()
                .count_in(self.config.single_lane_samples)
                .unwrap_or(0),
            single_lane_max_in_flight: self.config.single_lane_max_in_flight,
            early_epochs: self
                .config
                .epochs()
                .count_in(self.config.early_in_flight_samples)
                .unwrap_or(0),
            early_max_in_flight: self.config.early_max_in_flight,
            epochs: self.config.epochs(),
            epoch_share_per_in_flight: self.config.epoch_share_per_in_flight,
        }
    }

    /// Key of the token ids (`part` = `tokens`) or targets (`targets`) of a sample unit.
    pub fn token_key(&self, epoch: u64, sample: u64, part: &str) -> ObjectKey {
        let base = self
            .keys
            .activations_epoch(epoch)
            .join(&KeyPart::from(sample));
        match KeyPart::new(part) {
            Ok(p) => base.join(&p),
            Err(_) => base,
        }
    }

    /// Key of `hotkey`'s flat upload for the merge of `epoch`.
    ///
    /// # Errors
    /// [`KeyError`] for a hotkey that is not a key component.
    pub fn upload_key(
        &self,
        section: usize,
        epoch: u64,
        hotkey: &str,
    ) -> Result<ObjectKey, KeyError> {
        Ok(self.keys.weights(
            section_u32(section),
            epoch,
            &Hotkey::new(hotkey)?,
            StatePart::Flat,
        ))
    }

    /// Key of the orchestrator's copy of `hotkey`'s accepted upload for the merge of `epoch`:
    /// made when the upload was checked, under a key no upload URL exists for, so the uploader
    /// cannot change what the mergers and the orchestrator read.
    ///
    /// # Errors
    /// [`KeyError`] for a hotkey that is not a key component.
    pub fn accepted_upload_key(
        &self,
        section: usize,
        epoch: u64,
        hotkey: &str,
    ) -> Result<ObjectKey, KeyError> {
        Ok(self
            .keys
            .weights_epoch(section_u32(section), epoch)
            .join(&KeyPart::new(hotkey)?)
            .join(&KeyPart::new("accepted")?))
    }

    /// Key of `merger`'s result for partition `partition` of the merge of `epoch`.
    ///
    /// # Errors
    /// [`KeyError`] for a hotkey that is not a key component.
    pub fn partition_key(
        &self,
        section: usize,
        epoch: u64,
        partition: usize,
        merger: &str,
    ) -> Result<ObjectKey, KeyError> {
        Ok(self.keys.merged(
            section_u32(section),
            epoch,
            u32::try_from(partition).unwrap_or(u32::MAX),
            &Hotkey::new(merger)?,
            StatePart::Flat,
        ))
    }

    /// Key of the merged state of `section` that starts epoch `epoch` (`part`: the flat state
    /// or the outer momentum).
    pub fn checkpoint_key(&self, section: usize, epoch: u64, part: StatePart) -> ObjectKey {
        self.keys.checkpoint(epoch, section_u32(section), part)
    }

    /// Token ids and targets of sample unit `sample`, `[batch, seq]` in the fewest bytes per
    /// id the vocabulary allows ([`token_ids`]): dataset sample ids `sample * batch .. (sample + 1) * batch`.
    /// A streamed dataset may wait for the sample's block to be tokenized: the wait happens
    /// off the async workers ([`off_async_workers`]).
    pub fn sample_tokens(&self, sample: u64) -> (Bytes, Bytes) {
        let batch = self.config.batch_size as u64;
        off_async_workers(|| {
            self.pack_windows((0..batch).map(|i| self.dataset.train_sample(sample * batch + i)))
        })
    }

    /// The hashes of the token ids and targets of sample `id` of `epoch`, if this process
    /// stored them ([`Self::stage_tokens`]).
    pub fn staged_tokens(&self, epoch: u64, id: u64) -> Option<(String, String)> {
        let staged = self.staged.lock().unwrap_or_else(|e| e.into_inner());
        staged.get(&(epoch, id)).cloned()
    }

    /// Remembers that the tokens of sample `id` of `epoch` are stored with these hashes, so
    /// a request that lost the race for that id does not store them again. Only the newest
    /// [`STAGED_MAX`] are remembered (older ids were started or never will be).
    pub fn stage_tokens(&self, epoch: u64, id: u64, hashes: (String, String)) {
        let mut staged = self.staged.lock().unwrap_or_else(|e| e.into_inner());
        staged.insert((epoch, id), hashes);
        while staged.len() > STAGED_MAX {
            staged.pop_first();
        }
    }

    /// Whether training epoch `epoch` has its starting weights evaluated: every
    /// `eval_every`-th epoch does, and so does the run's final one, the epoch after the last
    /// merge of a run whose sample budget is spent (`next` is the run's next sample id) and
    /// which trains no sample.
    ///
    /// # Errors
    /// A state-store error.
    pub fn evaluates(&self, epoch: u64, next: u64) -> Result<bool, RepoError> {
        if epoch.is_multiple_of(self.config.eval_every.max(1)) {
            return Ok(true);
        }
        if self.config.max_samples.is_none_or(|b| next < b) {
            return Ok(false);
        }
        let (done, active) = self.repo.epoch_progress(epoch)?;
        Ok(done == 0 && active == 0)
    }

    /// Evaluation samples per epoch: `eval_samples` held-out windows in samples of
    /// `batch_size` windows (at least one when evaluation is on), no more than the held-out
    /// split holds. The same windows `iota train` evaluates on when `eval_samples` is a
    /// multiple of `batch_size`.
    pub fn eval_units(&self) -> u64 {
        let batch = self.config.batch_size.max(1);
        if self.config.eval_samples == 0 {
            return 0;
        }
        let wanted = (self.config.eval_samples / batch).max(1);
        let held_out = self.dataset.num_eval_windows() / batch;
        (wanted.min(held_out) as u64).min(EVAL_SAMPLES_MAX)
    }

    /// Token ids and targets of evaluation sample `unit` (held-out windows
    /// `unit * batch .. (unit + 1) * batch`), as [`Self::sample_tokens`].
    pub fn eval_tokens(&self, unit: u64) -> (Bytes, Bytes) {
        let batch = self.config.batch_size;
        let first = usize::try_from(unit)
            .unwrap_or(usize::MAX)
            .saturating_mul(batch);
        let last = self.dataset.num_eval_windows().saturating_sub(1);
        self.pack_windows((0..batch).map(|i| self.dataset.eval_sample((first + i).min(last))))
    }

    /// Inputs and next-token targets of `windows` (`seq_len + 1` tokens each), packed.
    fn pack_windows(&self, windows: impl Iterator<Item = impl AsRef<[u32]>>) -> (Bytes, Bytes) {
        let batch = self.config.batch_size;
        let seq = self.config.seq_len;
        let width = token_ids::width(self.config.model.vocab_size);
        let mut tokens = Vec::with_capacity(batch * seq * width);
        let mut targets = Vec::with_capacity(batch * seq * width);
        for window in windows {
            let window = window.as_ref();
            for pos in 0..seq {
                let t = window.get(pos).copied().unwrap_or(0);
                let y = window.get(pos + 1).copied().unwrap_or(0);
                token_ids::push(&mut tokens, t, width);
                token_ids::push(&mut targets, y, width);
            }
        }
        (Bytes::from(tokens), Bytes::from(targets))
    }
}

fn section_u32(s: usize) -> u32 {
    u32::try_from(s).unwrap_or(u32::MAX)
}
