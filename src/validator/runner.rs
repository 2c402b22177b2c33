//! The validator loop (`iota validate`): register with the orchestrator as a validator,
//! then for every finished epoch run its window of checks ([`super::window`]), keep the result
//! ([`super::history`]) and publish the weight vector ([`super::chain`]). Stops cleanly on
//! Ctrl-C (or [`ValidatorOptions::stop`]) between windows.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use burn::tensor::backend::AutodiffBackend;
use thiserror::Error;

use super::chain::{LocalMetagraph, WeightsChain};
use super::history::{History, HistoryError};
use super::onchain::{Event, InjectedChain, OnChain, OnChainError};
use super::subnet_choice::{SubnetChoice, SubnetMismatch, check_announced};
use super::tracking::Chooser;
use super::window::{Context, WindowResult, validate_epoch};
use crate::api::ValidatorRegisterRequest;
use crate::api::client::{ApiClient, ClientError, patient_policy};
use crate::chain::ChainError;
use crate::chain::shared::{SharedChain, shared_chain_for};
use crate::model::backend::{BackendTask, DeviceKind, dispatch};
use crate::wallet::Hotkey;

/// Why the validator stopped with an error.
#[derive(Debug, Error)]
pub enum ValidatorError {
    /// The orchestrator refused (e.g. the hotkey is not a listed validator) or stayed
    /// unreachable.
    #[error("orchestrator: {0}")]
    Client(#[from] ClientError),
    /// The state directory.
    #[error("state: {0}")]
    History(#[from] HistoryError),
    /// The async runtime or the backend could not start.
    #[error("runtime: {0}")]
    Runtime(String),
    /// The run's chain could not be opened.
    #[error("chain: {0}")]
    Chain(#[from] OnChainError),
    /// The orchestrator's run is not on the subnet this validator is set for.
    #[error("{0}")]
    Subnet(#[from] SubnetMismatch),
}

/// Least time between two steps of the weights on chain ([`OnChain::step`]) while nothing new
/// is queued: about one block of subtensor.
pub const CHAIN_STEP: Duration = Duration::from_secs(12);

/// How to run a validator.
#[derive(Debug, Clone)]
pub struct ValidatorOptions {
    /// Base URL of the orchestrator.
    pub orchestrator: String,
    /// The validator's hotkey (the run config must list it).
    pub hotkey: Hotkey,
    /// Backend for replays and upload-quality checks.
    pub device: DeviceKind,
    /// Where window records are kept (a subdirectory per run).
    pub state_dir: PathBuf,
    /// How often to ask whether an epoch finished.
    pub poll: Duration,
    /// Keep each replayed forward's graph until its backward (as miners do); false recomputes
    /// it there (less memory, more compute; the same replay).
    pub retain_graphs: bool,
    /// Print one line per window on stderr.
    pub progress: bool,
    /// Set to stop after the current window; Ctrl-C sets it too.
    pub stop: Arc<AtomicBool>,
    /// The subnet this validator sets weights on (`--network`, `--netuid`); the
    /// orchestrator's run must be on it. `None`: no chain, and a run on one is refused.
    pub subnet: Option<SubnetChoice>,
    /// The client of that subnet's chain (tests pass the FAKE chain); `None` opens
    /// `subnet`'s network.
    pub chain: Option<InjectedChain>,
}

/// What a validator did before it stopped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ValidatorReport {
    /// Windows validated in this run.
    pub windows: u64,
    /// Weight vectors the destination accepted.
    pub published: u64,
    /// Weight vectors it refused.
    pub refused: u64,
    /// The newest epoch with a window.
    pub last_epoch: Option<u64>,
}

/// Runs a validator until it is stopped.
///
/// # Errors
/// The backend is not compiled in, the orchestrator refuses the hotkey or stays unreachable,
/// or the state directory cannot be used.
pub fn run_validator(options: ValidatorOptions) -> Result<ValidatorReport, ValidatorError> {
    dispatch(options.device, Task(options)).map_err(ValidatorError::Runtime)?
}

struct Task(ValidatorOptions);

impl BackendTask for Task {
    type Output = Result<ValidatorReport, ValidatorError>;

    fn run<B: AutodiffBackend>(self, device: B::Device) -> Self::Output {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| ValidatorError::Runtime(e.to_string()))?;
        runtime.block_on(validate::<B>(self.0, device))
    }
}

fn short(hotkey: &str) -> &str {
    &hotkey[..hotkey.len().min(8)]
}

async fn validate<B: AutodiffBackend>(
    options: ValidatorOptions,
    device: B::Device,
) -> Result<ValidatorReport, ValidatorError> {
    let stop = options.stop.clone();
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("iota validate: stopping after the current window");
                stop.store(true, Ordering::SeqCst);
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
        .register_validator(&ValidatorRegisterRequest {
            device: options.device.to_string(),
        })
        .await?;
    // The validator's own subnet, checked against the run's before anything is written.
    let shared: Option<SharedChain> = options.subnet.as_ref().map(|own| match &options.chain {
        Some(InjectedChain(chain)) => chain.clone(),
        None => shared_chain_for(own.network.clone()),
    });
    check_subnet(options.subnet.clone(), reg.chain.clone(), shared.clone()).await?;
    let mut history = History::open(&options.state_dir.join(&reg.run))?;
    let chain = LocalMetagraph::new(client.clone());
    let mut onchain = match (&reg.chain, shared) {
        (Some(run_chain), Some(shared)) => {
            let oc = OnChain::open(
                shared,
                options.hotkey.clone(),
                run_chain,
                &options.state_dir.join(&reg.run),
            )?;
            eprintln!(
                "iota validate: weights go to subnet {} of {} too (the run's subnet, and this validator's)",
                run_chain.netuid, run_chain.network
            );
            Some(oc)
        }
        _ => None,
    };
    let mut stepper = ChainStepper::default();
    let mut report = ValidatorReport::default();
    let me = reg.hotkey.clone();
    // A restarted validator first makes sure its newest window reached the metagraph.
    if let Some(w) = history.latest() {
        let published = client
            .metagraph()
            .await?
            .validators
            .into_iter()
            .find(|v| v.hotkey == me)
            .map(|v| v.epoch);
        if published.is_none_or(|e| e < w.epoch) {
            publish(&chain, w, &mut report, options.progress).await;
        }
        // The restarted validator's newest window goes on chain unless it did already;
        // commits waiting for their reveal epoch are revealed by the first step.
        if let Some(oc) = onchain.as_mut() {
            oc.queue(&w.submission());
        }
    }
    let ctx = Context::<B> {
        client: client.clone(),
        run: reg.run.clone(),
        model: reg.model.clone(),
        settings: reg.settings.clone(),
        validation: reg.validation,
        chooser: Chooser::new(&options.hotkey),
        device,
        retain_graphs: options.retain_graphs,
    };
    let mut next = history
        .next_epoch()
        .unwrap_or_else(|| reg.epoch.saturating_sub(1));
    tracing::info!(run = %reg.run, next, "validator registered");
    while !stop.load(Ordering::SeqCst) {
        stepper.step(&mut onchain).await;
        let current = match client.run_info().await {
            Ok(info) => info.epoch,
            Err(e) => {
                tracing::warn!("orchestrator: {e}; still trying");
                tokio::time::sleep(options.poll).await;
                continue;
            }
        };
        if next >= current {
            tokio::time::sleep(options.poll).await;
            continue;
        }
        let probation = history.probation(next, ctx.validation.probation_windows);
        let w = match validate_epoch(&ctx, next, &probation).await {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(epoch = next, "window failed (retrying): {e}");
                tokio::time::sleep(options.poll).await;
                continue;
            }
        };
        history.save(w.clone())?;
        report.windows += 1;
        report.last_epoch = Some(w.epoch);
        publish(&chain, &w, &mut report, options.progress).await;
        if let Some(oc) = onchain.as_mut() {
            oc.queue(&w.submission());
            stepper.now();
        }
        next += 1;
    }
    Ok(report)
}

/// [`check_announced`] on a blocking thread (reading the genesis hash of the validator's
/// chain blocks).
async fn check_subnet(
    own: Option<SubnetChoice>,
    announced: Option<crate::api::RunChain>,
    chain: Option<SharedChain>,
) -> Result<(), ValidatorError> {
    tokio::task::spawn_blocking(move || {
        check_announced(own.as_ref(), announced.as_ref(), || match &chain {
            Some(chain) => chain.genesis_hash(),
            None => Err(ChainError::Unsupported {
                network: crate::chain::Network::Local,
                what: "genesis block",
                instead: "pass --network",
            }),
        })
    })
    .await
    .map_err(|e| ValidatorError::Runtime(e.to_string()))?
    .map_err(ValidatorError::from)
}

/// When to step the weights on chain, and what was said last (a line repeats only when it
/// changes: a validator waiting for the rate limit says so once).
#[derive(Default)]
struct ChainStepper {
    last: Option<Instant>,
    said: Option<String>,
}

impl ChainStepper {
    /// The next step is due at once (a window was queued).
    fn now(&mut self) {
        self.last = None;
    }

    /// One [`OnChain::step`] on a blocking thread, if one is due.
    async fn step(&mut self, onchain: &mut Option<OnChain>) {
        if self.last.is_some_and(|t| t.elapsed() < CHAIN_STEP) {
            return;
        }
        let Some(mut oc) = onchain.take() else {
            return;
        };
        self.last = Some(Instant::now());
        // Reveals, then (when they went through) the submission: one that fails keeps the
        // reveals' events.
        let (oc, results) = match tokio::task::spawn_blocking(move || {
            let revealed = oc.reveal();
            let submitted = revealed.is_ok().then(|| oc.submit());
            (oc, [Some(revealed), submitted])
        })
        .await
        {
            Ok(done) => done,
            Err(e) => {
                eprintln!("iota validate: weights on chain stopped: {e}");
                return;
            }
        };
        *onchain = Some(oc);
        for result in results.into_iter().flatten() {
            self.report(result);
        }
    }

    /// Prints what one part of a step did, or why it failed.
    fn report(&mut self, result: Result<Vec<Event>, OnChainError>) {
        match result {
            Ok(events) => {
                for event in events {
                    let line = format!("iota validate: {event}");
                    if let Event::Waiting { epoch, .. } = event {
                        self.say_once(format!("waiting {epoch}"), line);
                    } else {
                        eprintln!("{line}");
                        self.said = None;
                    }
                }
            }
            Err(e) => {
                let line = format!("iota validate: weights NOT set on chain: {e}");
                self.say_once(line.clone(), line);
            }
        }
    }

    /// Prints `line` unless the last line said was under the same `key`.
    fn say_once(&mut self, key: String, line: String) {
        if self.said.as_ref() != Some(&key) {
            eprintln!("{line}");
            self.said = Some(key);
        }
    }
}

async fn publish(
    chain: &impl WeightsChain,
    w: &WindowResult,
    report: &mut ValidatorReport,
    progress: bool,
) {
    let flagged: Vec<&str> = w.flagged().into_iter().map(short).collect();
    let summary = format!(
        "epoch {}: {} miners, {} flagged [{}], replayed [{}]",
        w.epoch,
        w.miners.len(),
        flagged.len(),
        flagged.join(" "),
        w.tracked
            .iter()
            .map(|t| short(t))
            .collect::<Vec<_>>()
            .join(" ")
    );
    match chain.publish(&w.submission()).await {
        Ok(receipt) if receipt.accepted => {
            report.published += 1;
            tracing::info!(
                epoch = w.epoch,
                "weights published to {}",
                receipt.destination
            );
            if progress {
                eprintln!(
                    "iota validate: {summary}; weights published to {}",
                    receipt.destination
                );
            }
        }
        Ok(receipt) => {
            report.refused += 1;
            eprintln!(
                "iota validate: {summary}; weights REFUSED by {}: {}",
                receipt.destination,
                receipt.reason.unwrap_or_default()
            );
        }
        Err(e) => {
            report.refused += 1;
            eprintln!(
                "iota validate: {summary}; weights NOT published ({}): {e}",
                chain.destination()
            );
        }
    }
}
