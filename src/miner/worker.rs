//! The miner loop, generic over the burn backend.
//!
//! One process computes its assignments one after another (the compute is CPU or GPU bound
//! anyway) while its transfers run beside it ([`transfer`]): the inputs of every assignment
//! in a batch are fetched as soon as the batch arrives, each result is uploaded and submitted
//! while the next computes, and the next `/api/work` poll goes out while the batch's last
//! assignment computes. A background task sends heartbeats. Stopping (Ctrl-C or
//! [`MinerOptions::stop`]) finishes the assignment under way and its delivery, hands the rest
//! back with `/api/release`, and returns a [`MinerReport`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use burn::tensor::backend::AutodiffBackend;
use indicatif::{ProgressBar, ProgressStyle};
use thiserror::Error;
use tokio::task::JoinHandle;

use super::adversary::Adversary;
#[cfg(not(feature = "adversary"))]
use super::adversary::Copier;
#[cfg(feature = "adversary")]
use super::copier::Copier;
use super::utilization::{Activity, Utilization};
use crate::compute::cache::CachedInput;
use crate::compute::engine::{Activations, Engine, EngineError, EngineSettings, StepRecord};
use crate::compute::payload::PayloadError;

mod merging;
mod transfer;
use crate::api::client::{ApiClient, ClientError, patient_policy};
use crate::api::{
    Assignment, HeartbeatRequest, MinerSettings, MinerUsage, Phase, RegisterRequest,
    ReleaseRequest, SubmitRequest, Timings, WorkKind, WorkRequest, WorkResponse,
};
use crate::codec::ErrorFeedback;
use crate::model::backend::{BackendTask, DeviceKind, dispatch};
use crate::model::{ModelError, Section, StepOutcome};
use crate::storage::StorageError;
use crate::wallet::Hotkey;
use transfer::{Delivered, Fetched, Inputs, Outcome};

/// How long an `/api/work` request may be held open by the orchestrator when there is no work
/// yet: the answer comes the moment work is routed to this miner, instead of at its next poll.
const WORK_WAIT: Duration = Duration::from_millis(1_000);
/// Longest wait between two empty answers to `/api/work` that came back early (an orchestrator
/// that does not hold requests open, or one outside training).
const IDLE_WAIT: Duration = Duration::from_millis(150);
/// First wait after an empty answer; it doubles with each further empty answer up to
/// [`IDLE_WAIT`] and starts over when work arrives, so a miner whose upstream is about to
/// deliver picks the work up within milliseconds, and an idle one polls slowly.
const IDLE_WAIT_MIN: Duration = Duration::from_millis(10);

/// An `/api/work` request for up to `max` assignments, waiting up to [`WORK_WAIT`] for them.
fn work_request(max: usize) -> WorkRequest {
    let wait_ms = u64::try_from(WORK_WAIT.as_millis()).unwrap_or(u64::MAX);
    WorkRequest { max, wait_ms }
}

/// Why the miner stopped with an error.
#[derive(Debug, Error)]
pub enum MinerError {
    /// The orchestrator refused a request or stayed unreachable.
    #[error("orchestrator: {0}")]
    Client(#[from] ClientError),
    /// The section could not be built or ran into a shape error.
    #[error("model: {0}")]
    Model(#[from] ModelError),
    /// The compute refused the work (shapes, a non-finite loss, an input not kept).
    #[error("compute: {0}")]
    Engine(#[from] EngineError),
    /// An input could not be obtained.
    #[error("input: {0}")]
    Payload(#[from] PayloadError),
    /// The result could not be uploaded.
    #[error("upload: {0}")]
    Upload(#[from] StorageError),
    /// The assignment is inconsistent (missing targets or output URL).
    #[error("malformed assignment {id}: {reason}")]
    Malformed {
        /// Assignment id.
        id: u64,
        /// What is missing.
        reason: String,
    },
    /// The initial weights could not be loaded.
    #[error("weights: {0}")]
    Weights(String),
    /// The async runtime or the backend could not start.
    #[error("runtime: {0}")]
    Runtime(String),
}

/// How to run a miner.
#[derive(Debug, Clone)]
pub struct MinerOptions {
    /// Base URL of the orchestrator.
    pub orchestrator: String,
    /// The miner's hotkey.
    pub hotkey: Hotkey,
    /// Backend to compute on.
    pub device: DeviceKind,
    /// Forwards in flight the miner asks for (the server caps it).
    pub max_in_flight: usize,
    /// Keep each forward's graph until its backward (see
    /// [`crate::compute::engine::EngineSettings::retain_graphs`]); false recomputes it there.
    pub retain_graphs: bool,
    /// Draw a progress bar on stderr (hidden anyway when stderr is not a terminal).
    pub progress: bool,
    /// Set to stop the miner cleanly; Ctrl-C sets it too.
    pub stop: Arc<AtomicBool>,
    /// Where to write the utilization and traffic report (JSON, rewritten about once a
    /// second and when the miner stops).
    pub stats_out: Option<std::path::PathBuf>,
    /// A hostile behaviour, for tests only (`None`: honest).
    pub adversary: Option<Adversary>,
    /// The object store directory a copier reads other miners' uploads from (tests only;
    /// required with the `copier` adversary).
    pub copy_from: Option<String>,
}

/// What a miner did before it stopped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MinerReport {
    /// Section served.
    pub section: usize,
    /// Forwards submitted and accepted (the tail's combined forward-backward counts here).
    pub forwards: u64,
    /// Backwards submitted and accepted (the tail's included).
    pub backwards: u64,
    /// Local optimizer steps applied.
    pub steps: u64,
    /// Results the server refused.
    pub refused: u64,
    /// Assignments handed back (failures and shutdown).
    pub released: u64,
    /// Penalties the server reported at the last heartbeat.
    pub penalties: u64,
    /// Last tail loss.
    pub last_loss: Option<f32>,
    /// Flat-state uploads submitted for merges.
    pub uploads: u64,
    /// Partitions merged and accepted.
    pub partitions_merged: u64,
    /// Merged states adopted (after a merge, or at registration).
    pub adopted: u64,
    /// Epoch of the weights held at the end.
    pub weights_epoch: u64,
    /// Evaluation forwards (and the tail's evaluation losses) submitted and accepted.
    pub evals: u64,
}

/// Counters shared with the heartbeat task.
#[derive(Debug, Default)]
struct Counters {
    forwards: AtomicU64,
    backwards: AtomicU64,
    steps: AtomicU64,
    penalties: AtomicU64,
    /// Epoch of the weights held, and the hash of the flat state right after adopting them.
    weights: std::sync::Mutex<(u64, Option<String>)>,
    /// The latest account of where the time went, sent with heartbeats.
    usage: std::sync::Mutex<Option<MinerUsage>>,
}

impl Counters {
    fn heartbeat(&self) -> HeartbeatRequest {
        let (weights_epoch, weights_hash) = self
            .weights
            .lock()
            .map(|w| w.clone())
            .unwrap_or_else(|e| e.into_inner().clone());
        let usage = self
            .usage
            .lock()
            .map(|u| u.clone())
            .unwrap_or_else(|e| e.into_inner().clone());
        HeartbeatRequest {
            usage,
            forwards: self.forwards.load(Ordering::Relaxed),
            backwards: self.backwards.load(Ordering::Relaxed),
            steps: self.steps.load(Ordering::Relaxed),
            weights_epoch,
            weights_hash,
        }
    }
}

/// Runs a miner until it is stopped.
///
/// # Errors
/// The backend is not compiled in, the orchestrator refuses registration or stays unreachable
/// through registration, or the section cannot be built.
pub fn run_miner(options: MinerOptions) -> Result<MinerReport, MinerError> {
    dispatch(options.device, MinerTask(options)).map_err(MinerError::Runtime)?
}

struct MinerTask(MinerOptions);

impl BackendTask for MinerTask {
    type Output = Result<MinerReport, MinerError>;

    fn run<B: AutodiffBackend>(self, device: B::Device) -> Self::Output {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| MinerError::Runtime(e.to_string()))?;
        runtime.block_on(mine::<B>(self.0, device))
    }
}

/// The state of a running miner.
struct Worker<B: AutodiffBackend> {
    client: ApiClient,
    device: String,
    engine: Engine<B>,
    settings: MinerSettings,
    counters: Arc<Counters>,
    report: MinerReport,
    tokens: u64,
    bar: ProgressBar,
    started: Instant,
    /// Epoch of the weights held (0: the seed's).
    held_epoch: u64,
    /// The run's phase and distance to the next merge, for the status line.
    view: super::status_line::SharedView,
    /// Merge epoch whose upload was already submitted.
    uploaded_epoch: Option<u64>,
    /// The parameters of the global state last adopted (or the initial one): what a merge
    /// format with a base encodes and decodes against.
    merge_base: MergeBase,
    /// Error feedback of such a format: the parameters' change its uploads left out so far.
    feedback: ErrorFeedback,
    /// This merge's own upload and merged partitions, kept so they need not be read back.
    merge_held: merging::MergeHeld,
    /// Hostile behaviour (tests only).
    adversary: Option<Adversary>,
    /// Where a copier finds the uploads it copies (tests only).
    copier: Option<Copier>,
    /// Where the wall time went.
    util: Utilization,
    /// Where to write it (`--stats-out`).
    stats_out: Option<std::path::PathBuf>,
    /// When it was last written and sent to the heartbeat task.
    stats_written: Instant,
    /// Results being uploaded and submitted, oldest first.
    deliveries: VecDeque<JoinHandle<Delivered>>,
    /// Resolves when the newest delivery has submitted (submits go in compute order).
    last_submit: Option<tokio::sync::oneshot::Receiver<()>>,
    /// A `/api/work` poll sent while the last assignment in hand computed.
    next_poll: Option<JoinHandle<Result<WorkResponse, ClientError>>>,
}

/// The parameters of a global state the miner holds, and its epoch (0: the seed's).
#[derive(Debug, Default)]
struct MergeBase {
    epoch: u64,
    params: Vec<f32>,
}

/// An assignment and the task fetching its inputs.
type Fetching = (Assignment, JoinHandle<Result<Fetched, MinerError>>);

async fn mine<B: AutodiffBackend>(
    options: MinerOptions,
    device: B::Device,
) -> Result<MinerReport, MinerError> {
    let stop = options.stop.clone();
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!(
                    "iota mine: stopping after the current assignment (Ctrl-C again to abort)"
                );
                stop.store(true, Ordering::SeqCst);
                if tokio::signal::ctrl_c().await.is_ok() {
                    std::process::exit(130);
                }
            }
        });
    }
    let client = ApiClient::connect(
        &options.orchestrator,
        Some(options.hotkey.clone()),
        patient_policy(),
    )
    .await?;
    let reg = client
        .register(&RegisterRequest {
            device: options.device.to_string(),
            max_in_flight: options.max_in_flight,
        })
        .await?;
    let settings = reg.settings.clone();
    let section = Section::<B>::new(
        &reg.model,
        reg.section,
        settings.seed,
        settings.optimizer,
        &device,
    )?;
    let mut engine_settings = EngineSettings::for_miner(&settings);
    engine_settings.retain_graphs = options.retain_graphs;
    if options.adversary.is_some_and(Adversary::never_steps) {
        engine_settings.local_steps = u64::MAX;
        engine_settings.samples_per_step = 0;
    }
    let layout = crate::model::layout::section_layout(&reg.model, reg.section)?;
    let initial = section.export_flat(&layout)?;
    let params_len = usize::try_from(layout.params_len).unwrap_or(usize::MAX);
    let merge_base = MergeBase {
        epoch: 0,
        params: initial
            .get(..params_len)
            .map(<[f32]>::to_vec)
            .unwrap_or_default(),
    };
    drop(initial);
    // Before the first request for work: a GPU compiles its kernels here, not inside the
    // deadlines of the first assignments (silent meanwhile, so routing passes this miner by
    // once its registration's TTL is out).
    eprintln!(
        "iota mine: warming up section {} (the first start on a GPU compiles its kernels: minutes; later starts load them from the kernel cache)",
        reg.section
    );
    let (engine, warm) = Engine::warmed(
        section,
        engine_settings,
        [settings.batch_size, settings.seq_len],
    )?;
    eprintln!("iota mine: warmed up in {:.1} s", warm.took.as_secs_f64());
    if settings.bottleneck_warmup > 0 {
        let unit = match settings.samples_per_step {
            0 => "samples",
            _ => "synchronous steps",
        };
        eprintln!(
            "iota mine: the run starts with a warm-up without the bottleneck: in its first {} {unit} the boundary tensors are {} channels wider",
            settings.bottleneck_warmup, reg.model.d_model
        );
    }
    tracing::info!(took_ms = warm.took.as_millis() as u64, step = ?warm.step, "warm-up done");
    let copier = match (options.adversary, &options.copy_from) {
        (Some(a), Some(dir)) if a.copies_uploads() => Some(
            Copier::open(dir, &reg.run, options.hotkey.address().as_str())
                .map_err(MinerError::Runtime)?,
        ),
        (Some(a), None) if a.copies_uploads() => {
            return Err(MinerError::Runtime(
                "the copier needs the object store directory (--copy-from)".into(),
            ));
        }
        _ => None,
    };
    tracing::info!(section = reg.section, run = %reg.run, "miner registered");
    let counters = Arc::new(Counters::default());
    let view = super::status_line::SharedView::default();
    let poller = tokio::spawn(super::status_line::poll(
        client.clone(),
        view.clone(),
        (settings.batch_size * settings.seq_len) as f64,
        Duration::from_secs(3),
    ));
    let heartbeat = tokio::spawn(heartbeats(
        client.clone(),
        counters.clone(),
        Duration::from_secs(settings.heartbeat_s.max(1)),
    ));
    let mut worker = Worker {
        client,
        device: options.device.to_string(),
        settings,
        counters,
        report: MinerReport {
            section: reg.section,
            ..MinerReport::default()
        },
        tokens: 0,
        bar: progress_bar(options.progress),
        started: Instant::now(),
        engine,
        held_epoch: 0,
        view,
        uploaded_epoch: None,
        merge_base,
        feedback: ErrorFeedback::default(),
        merge_held: merging::MergeHeld::default(),
        util: Utilization::for_section(reg.section),
        stats_out: options.stats_out.clone(),
        adversary: options.adversary,
        copier,
        stats_written: Instant::now(),
        deliveries: VecDeque::new(),
        last_submit: None,
        next_poll: None,
    };
    if let Some(checkpoint) = &reg.checkpoint {
        // A late joiner starts from the section's merged state.
        worker.adopt(checkpoint).await?;
    }
    let result = worker.serve(&stop).await;
    worker.write_stats(true);
    heartbeat.abort();
    poller.abort();
    worker.bar.finish_and_clear();
    worker.report.penalties = worker.counters.penalties.load(Ordering::Relaxed);
    worker.report.weights_epoch = worker.held_epoch;
    result.map(|()| worker.report)
}

fn progress_bar(show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(250));
    bar
}

async fn heartbeats(client: ApiClient, counters: Arc<Counters>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let req = counters.heartbeat();
        match client.heartbeat(&req).await {
            Ok(resp) => counters.penalties.store(resp.penalties, Ordering::Relaxed),
            Err(e) => tracing::warn!("heartbeat failed: {e}"),
        }
    }
}

impl<B: AutodiffBackend> Worker<B> {
    /// Asks for work and does it until `stop` is set.
    async fn serve(&mut self, stop: &AtomicBool) -> Result<(), MinerError> {
        let mut idle_wait = IDLE_WAIT_MIN;
        while !stop.load(Ordering::SeqCst) {
            self.write_stats(false);
            self.collect_deliveries(false).await;
            let asked = Instant::now();
            let answer = match self.next_poll.take() {
                Some(poll) => poll
                    .await
                    .map_err(|e| MinerError::Runtime(format!("work poll task: {e}")))?,
                None => {
                    let max = self.work_wanted(0).max(1);
                    self.client.work(&work_request(max)).await
                }
            };
            let polled = asked.elapsed();
            let work = match answer {
                Ok(work) => work,
                Err(ClientError::Unreachable { reason, .. }) => {
                    tracing::warn!("orchestrator unreachable ({reason}); still trying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                Err(e) if e.api_code() == Some("not_registered") => {
                    // The orchestrator lost its state: register again (same hotkey, and the
                    // section it gives back must be ours, or the weights would not fit).
                    let reg = self
                        .client
                        .register(&RegisterRequest {
                            device: self.device.clone(),
                            max_in_flight: self.settings.max_in_flight,
                        })
                        .await?;
                    if reg.section != self.report.section {
                        return Err(MinerError::Malformed {
                            id: 0,
                            reason: format!(
                                "re-registration moved this miner from section {} to {}",
                                self.report.section, reg.section
                            ),
                        });
                    }
                    tracing::warn!("orchestrator forgot this miner; registered again");
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            if work.phase != Phase::Training || work.epoch > self.held_epoch {
                // The run is merging, or merged since: finish what is under way, take part,
                // adopt, then go on.
                self.collect_deliveries(true).await;
                // Under way in reports (the stats file written at adoption, a miner stopped
                // during the run's closing merge) as well as once it ends.
                self.util.begin(Activity::Merge);
                self.merge_round(stop).await;
                self.util.end();
                if work.assignments.is_empty() {
                    // The merge round returns when the orchestrator says to train: ask for
                    // work at once (the poll is held until there is some), not after a pause.
                    self.util.add(Activity::Idle, polled);
                    idle_wait = IDLE_WAIT_MIN;
                    continue;
                }
            }
            if work.assignments.is_empty() || work.phase != Phase::Training {
                self.show();
                // A poll that found nothing is part of waiting for work. One that waited its
                // full time is asked again at once; one that came back early backs off.
                let t = Instant::now();
                if work.phase != Phase::Training || polled < WORK_WAIT / 2 {
                    tokio::time::sleep(idle_wait).await;
                    idle_wait = (idle_wait * 2).min(IDLE_WAIT);
                }
                self.util.add(Activity::Idle, polled + t.elapsed());
                continue;
            }
            idle_wait = IDLE_WAIT_MIN;
            self.util.start();
            // Time the orchestrator held the request waiting for work is idle time.
            let waited = Duration::from_millis(work.waited_ms).min(polled);
            self.util.add(Activity::Idle, waited);
            self.util.add(Activity::Orchestrator, polled - waited);
            self.work_batch(work.assignments, stop).await;
        }
        self.collect_deliveries(true).await;
        if let Some(poll) = self.next_poll.take() {
            // Stopped with a poll out: hand back whatever it brought.
            if let Ok(Ok(work)) = poll.await {
                self.release(work.assignments.iter().map(|a| a.id).collect())
                    .await;
            }
        }
        Ok(())
    }

    /// How many assignments to ask for, with `forwards_in_hand` forwards received and not yet
    /// computed: the tail keeps up to `max_in_flight`; other sections as many as the engine
    /// has slots to keep their inputs in.
    fn work_wanted(&self, forwards_in_hand: usize) -> usize {
        if self.engine.section().spec().is_tail {
            self.settings.max_in_flight.max(1)
        } else {
            self.engine.free_slots().saturating_sub(forwards_in_hand)
        }
    }

    /// Works one batch: every input is fetched at once, the assignments compute in order, each
    /// result is delivered in the background, and the next poll goes out while the last one
    /// computes. When `stop` is set, what has not started computing is handed back.
    async fn work_batch(&mut self, batch: Vec<Assignment>, stop: &AtomicBool) {
        if self.adversary.is_some_and(Adversary::abandons_work) {
            return;
        }
        let spec = self.engine.section().spec().clone();
        let mut fetching: VecDeque<Fetching> = batch
            .into_iter()
            .map(|a| {
                let task = tokio::spawn(transfer::fetch(a.clone(), spec.is_head, spec.is_tail));
                (a, task)
            })
            .collect();
        while let Some((assignment, task)) = fetching.pop_front() {
            if stop.load(Ordering::SeqCst) {
                let mut ids = vec![assignment.id];
                task.abort();
                for (a, task) in fetching.drain(..) {
                    task.abort();
                    ids.push(a.id);
                }
                self.release(ids).await;
                return;
            }
            let t = Instant::now();
            let fetched = match task.await {
                Ok(fetched) => fetched,
                Err(e) => Err(MinerError::Runtime(format!("fetch task: {e}"))),
            };
            self.util.add(Activity::Download, t.elapsed());
            if fetching.is_empty() && self.next_poll.is_none() {
                let forwards = usize::from(assignment.kind == WorkKind::Forward);
                let max = self.work_wanted(forwards);
                if max > 0 {
                    let client = self.client.clone();
                    self.next_poll = Some(tokio::spawn(async move {
                        client.work(&work_request(max)).await
                    }));
                }
            }
            match fetched.and_then(|f| self.compute(&assignment, f)) {
                Ok((out, submit)) => {
                    let (done, next) = tokio::sync::oneshot::channel();
                    let turn = transfer::SubmitTurn {
                        after: self.last_submit.replace(next),
                        done,
                    };
                    let task = tokio::spawn(transfer::deliver(
                        self.client.clone(),
                        assignment,
                        out,
                        self.settings.wire,
                        submit,
                        turn,
                    ));
                    self.deliveries.push_back(task);
                }
                Err(e) => {
                    let advice = e
                        .advice()
                        .map(|a| format!(". What to do: {a}"))
                        .unwrap_or_default();
                    tracing::warn!(
                        id = assignment.id,
                        sample = assignment.sample_id,
                        "assignment failed: {e}{advice}"
                    );
                    self.release(vec![assignment.id]).await;
                }
            }
            self.collect_deliveries(false).await;
        }
    }

    /// Takes in the deliveries that are done (all of them when `all`, waiting as long as it
    /// takes; also when more than `max_in_flight` are under way, the oldest).
    async fn collect_deliveries(&mut self, all: bool) {
        let t = Instant::now();
        while let Some(oldest) = self.deliveries.front() {
            let must = all || self.deliveries.len() > self.settings.max_in_flight.max(1);
            if !must && !oldest.is_finished() {
                break;
            }
            let Some(task) = self.deliveries.pop_front() else {
                break;
            };
            match task.await {
                Ok(delivered) => self.delivered(delivered).await,
                Err(e) => tracing::warn!("delivery task: {e}"),
            }
        }
        self.util.add(Activity::Upload, t.elapsed());
    }

    /// Counts a delivered result; one that could not be uploaded is handed back.
    async fn delivered(&mut self, d: Delivered) {
        let assignment = d.assignment;
        match d.outcome {
            Outcome::Answered(resp) if resp.accepted => match assignment.kind {
                WorkKind::Eval => self.report.evals += 1,
                WorkKind::Forward if !self.engine.section().spec().is_tail => {
                    self.report.forwards += 1;
                    self.counters.forwards.fetch_add(1, Ordering::Relaxed);
                }
                _ => {
                    if self.engine.section().spec().is_tail {
                        self.report.forwards += 1;
                        self.counters.forwards.fetch_add(1, Ordering::Relaxed);
                    }
                    self.report.backwards += 1;
                    self.counters.backwards.fetch_add(1, Ordering::Relaxed);
                }
            },
            Outcome::Answered(resp) => {
                self.report.refused += 1;
                tracing::warn!(
                    id = assignment.id,
                    "result refused: {}",
                    resp.reason.unwrap_or_default()
                );
            }
            Outcome::SubmitFailed(e) => {
                self.report.refused += 1;
                tracing::warn!(id = assignment.id, "submit failed: {e}");
            }
            Outcome::NotUploaded(e) => {
                let advice = e
                    .advice()
                    .map(|a| format!(". What to do: {a}"))
                    .unwrap_or_default();
                tracing::warn!(
                    id = assignment.id,
                    sample = assignment.sample_id,
                    "assignment failed: {e}{advice}"
                );
                self.release(vec![assignment.id]).await;
            }
        }
        self.show();
    }

    async fn release(&mut self, ids: Vec<u64>) {
        if ids.is_empty() {
            return;
        }
        let n = ids.len() as u64;
        let t = Instant::now();
        let answer = self
            .client
            .release(&ReleaseRequest {
                assignment_ids: ids,
            })
            .await;
        self.util.add(Activity::Orchestrator, t.elapsed());
        match answer {
            Ok(_) => self.report.released += n,
            Err(e) => tracing::warn!("release failed: {e}"),
        }
    }

    /// Refreshes the usage sent with heartbeats and writes the stats file when asked for
    /// one: at most once a second, or now when `force` (a failure to write is logged, never
    /// fatal).
    fn write_stats(&mut self, force: bool) {
        if !force && self.stats_written.elapsed() < Duration::from_secs(1) {
            return;
        }
        self.stats_written = Instant::now();
        let usage = self.util.report().usage;
        match self.counters.usage.lock() {
            Ok(mut u) => *u = Some(usage),
            Err(e) => *e.into_inner() = Some(usage),
        }
        if let Some(path) = &self.stats_out
            && let Err(e) = self.util.write(path)
        {
            tracing::warn!(path = %path.display(), "could not write the stats file: {e}");
        }
    }

    fn show(&self) {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let loss = self
            .report
            .last_loss
            .map(|l| format!(" | loss {l:.3}"))
            .unwrap_or_default();
        self.bar.set_message(format!(
            "section {} epoch {} | fwd {} bwd {} | steps {} | {:.0} tok/s{loss} | merged {} | refused {} | penalties {}{}",
            self.report.section,
            self.held_epoch,
            self.report.forwards,
            self.report.backwards,
            self.report.steps,
            self.tokens as f64 / secs,
            self.report.adopted,
            self.report.refused,
            self.counters.penalties.load(Ordering::Relaxed),
            super::status_line::describe(&self.view),
        ));
    }

    /// Runs one assignment's compute on its fetched inputs; returns the output to upload and
    /// the submit to send once it is uploaded (hash, size and upload time filled in then).
    fn compute(
        &mut self,
        a: &Assignment,
        fetched: Fetched,
    ) -> Result<(Option<Activations>, SubmitRequest), MinerError> {
        let t1 = Instant::now();
        let spec_tail = self.engine.section().spec().is_tail;
        let (out, loss) = match fetched.inputs {
            Inputs::Forward { input, targets } => {
                let [b, s] = input_dims(&input);
                let kept = self.adversary.map(|_| input.clone());
                let done = match targets {
                    Some((ids, shape)) => {
                        let tail = self.engine.train_tail(a.sample_id, input, &ids, shape)?;
                        self.count_step(tail.step.as_ref());
                        self.report.last_loss = Some(tail.loss);
                        (tail.grad, Some(tail.loss))
                    }
                    None => {
                        let fwd = self.engine.forward(a.sample_id, input)?;
                        self.count_step(fwd.step.as_ref());
                        (fwd.output, None)
                    }
                };
                self.tokens += (b * s) as u64;
                let out = match self.adversary {
                    Some(adv) => adv.tamper(a.sample_id, kept.as_ref(), done.0),
                    None => done.0,
                };
                (Some(out), done.1)
            }
            Inputs::Eval { input, targets } => match (spec_tail, targets) {
                (true, Some((ids, shape))) => {
                    (None, Some(self.engine.eval_tail(&input, &ids, shape)?))
                }
                (true, None) => {
                    return Err(MinerError::Malformed {
                        id: a.id,
                        reason: "tail evaluation without targets".into(),
                    });
                }
                (false, _) => (Some(self.engine.eval_forward(&input)?), None),
            },
            Inputs::Backward(upstream) => {
                let kept = self.adversary.map(|_| CachedInput::Hidden {
                    data: upstream.data.clone(),
                    shape: upstream.shape,
                    tokens: None,
                });
                let done = self.engine.backward(a.sample_id, upstream)?;
                self.count_step(done.step.as_ref());
                let grad = match self.adversary {
                    Some(adv) => done.grad.map(|g| adv.tamper(a.sample_id, kept.as_ref(), g)),
                    None => done.grad,
                };
                (grad, None)
            }
        };
        // Whole milliseconds for the orchestrator; the exact time for utilization (a few
        // milliseconds per assignment on a small model, where truncating lost a tenth of it).
        let computed = t1.elapsed();
        let compute_ms = u64::try_from(computed.as_millis()).unwrap_or(u64::MAX);
        self.util.add(Activity::Compute, computed);
        let submit = SubmitRequest {
            assignment_id: a.id,
            output_hash: None,
            output_bytes: None,
            loss,
            timings: Timings {
                download_ms: fetched.download_ms,
                compute_ms,
                upload_ms: 0,
            },
        };
        Ok((out, submit))
    }

    /// Counts a step the engine took.
    fn count_step(&mut self, step: Option<&StepRecord>) {
        match step.map(|s| &s.outcome) {
            Some(StepOutcome::Applied { .. }) => {
                self.report.steps += 1;
                self.counters.steps.fetch_add(1, Ordering::Relaxed);
            }
            Some(StepOutcome::Skipped { reason }) => {
                tracing::warn!("optimizer step skipped: {reason}")
            }
            Some(StepOutcome::NoGradients) | None => {}
        }
    }
}

fn input_dims(input: &CachedInput) -> [usize; 2] {
    match input {
        CachedInput::Tokens { shape, .. } => *shape,
        CachedInput::Hidden { shape, .. } => [shape[0], shape[1]],
    }
}

fn elapsed_ms(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX)
}
