//! A simulated miner for load benchmarks: a real signed HTTP client that registers, polls for
//! work, downloads its inputs, uploads a zero tensor of the announced shape and submits it,
//! without any model compute (optionally it sleeps a fixed time per assignment in place of the
//! compute). It polls like `iota mine` (10 ms after work, doubling to 150 ms while idle) and
//! heartbeats at the run's interval.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;

use super::latency::Recorder;
use crate::api::client::ApiClient;
use crate::api::*;
use crate::codec::{WireDtype, encode, payload_hash};
use crate::storage::{RetryPolicy, StorageError, UrlClient};
use crate::wallet::Hotkey;

/// The idle poll interval after work arrived, doubled while idle up to [`Shared::idle_max`].
const IDLE_MIN: Duration = Duration::from_millis(10);

/// What every simulated miner of one run shares.
#[derive(Debug)]
pub struct Shared {
    /// The orchestrator's base URL.
    pub base: String,
    /// The run name requests are signed for.
    pub run: String,
    /// The wire dtype of the run.
    pub wire: WireDtype,
    /// The tail section's index.
    pub tail: usize,
    /// Assignments asked for per poll.
    pub max_in_flight: usize,
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// Longest idle poll interval.
    pub idle_max: Duration,
    /// How long an `/api/work` request may be held open waiting for work, in ms (`iota mine`
    /// asks for 1000; 0 polls).
    pub wait_ms: u64,
    /// Time slept per assignment between download and upload, standing in for the model
    /// compute a real miner would do (zero: none).
    pub compute: Duration,
    /// Samples whose head backward was accepted (completed), as the miners saw them.
    pub completed: AtomicU64,
    /// Assignments given up: a request failed, or the submission was refused.
    pub refused: AtomicU64,
    /// Blob uploads answered 503 because [`crate::orchestrator::blob::MAX_CONCURRENT_PUTS`]
    /// uploads were streaming; each is retried after the server's `Retry-After`, as `iota
    /// mine` retries it (every attempt's latency is recorded).
    pub busy_puts: AtomicU64,
    /// Requests are tagged with `completed / window`.
    pub window: u64,
    /// Set to stop every miner.
    pub stop: AtomicBool,
    /// Every request's latency.
    pub recorder: Recorder,
}

impl Shared {
    fn window_now(&self) -> u64 {
        self.completed.load(Ordering::Relaxed) / self.window.max(1)
    }

    async fn timed<T, E>(
        &self,
        endpoint: &'static str,
        fut: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let window = self.window_now();
        let start = Instant::now();
        let out = fut.await;
        self.recorder
            .add(endpoint, start.elapsed(), window, out.is_ok());
        out
    }
}

/// One request attempt, no retries: a retry would hide latency.
fn no_retry() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 1,
        initial_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(50),
    }
}

/// Runs simulated miner `index` (hotkey `//<tag>//<index>`) until [`Shared::stop`].
///
/// # Errors
/// Registration refused or the clients cannot be built; errors of single requests are
/// recorded as failures and the miner goes on.
pub async fn run(shared: Arc<Shared>, tag: String, index: usize) -> anyhow::Result<()> {
    let hotkey = Hotkey::from_uri(&format!("//{tag}//{index}")).context("deriving a hotkey")?;
    let api = ApiClient::new(&shared.base, Some(hotkey), shared.run.clone(), no_retry())
        .context("building the API client")?;
    let blobs = UrlClient::new(no_retry()).context("building the blob client")?;
    let reg = RegisterRequest {
        device: "bench".into(),
        max_in_flight: shared.max_in_flight,
    };
    shared
        .timed("register", api.register(&reg))
        .await
        .with_context(|| format!("registering simulated miner {index}"))?;
    let mut done = (0u64, 0u64);
    let mut last_heartbeat = Instant::now();
    let mut idle = IDLE_MIN;
    while !shared.stop.load(Ordering::Relaxed) {
        if last_heartbeat.elapsed() >= shared.heartbeat {
            last_heartbeat = Instant::now();
            let hb = HeartbeatRequest {
                forwards: done.0,
                backwards: done.1,
                steps: done.1,
                weights_epoch: 0,
                weights_hash: None,
                usage: None,
            };
            let _ = shared.timed("heartbeat", api.heartbeat(&hb)).await;
        }
        let work = WorkRequest {
            max: shared.max_in_flight,
            wait_ms: shared.wait_ms,
        };
        // The time the orchestrator held the request waiting for work is not its latency.
        let window = shared.window_now();
        let start = Instant::now();
        let answer = api.work(&work).await;
        let took = start.elapsed();
        let waited = Duration::from_millis(answer.as_ref().map_or(0, |w| w.waited_ms));
        shared
            .recorder
            .add("work", took.saturating_sub(waited), window, answer.is_ok());
        let assignments = answer.map(|w| w.assignments).unwrap_or_default();
        if assignments.is_empty() {
            // A request that waited its time is sent again at once; one that came back early
            // (no wait asked, or an error) backs off.
            if took < Duration::from_millis(shared.wait_ms / 2) || shared.wait_ms == 0 {
                tokio::time::sleep(idle).await;
                idle = (idle * 2).min(shared.idle_max);
            }
            continue;
        }
        idle = IDLE_MIN;
        for a in assignments {
            if shared.stop.load(Ordering::Relaxed) {
                break;
            }
            let accepted = serve(&shared, &api, &blobs, &a).await;
            if accepted {
                match a.kind {
                    WorkKind::Backward => done.1 += 1,
                    _ => done.0 += 1,
                }
                if a.section == 0 && a.kind == WorkKind::Backward {
                    shared.completed.fetch_add(1, Ordering::Relaxed);
                }
            } else {
                shared.refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(())
}

/// Downloads the inputs of `a`, uploads a zero result of the announced shape and submits it;
/// whether the orchestrator accepted it.
async fn serve(shared: &Shared, api: &ApiClient, blobs: &UrlClient, a: &Assignment) -> bool {
    for blob in std::iter::once(&a.input).chain(a.targets.as_ref()) {
        let Ok(url) = url::Url::parse(&blob.url) else {
            return false;
        };
        if shared
            .timed("blob GET", blobs.download(&url, None))
            .await
            .is_err()
        {
            return false;
        }
    }
    if !shared.compute.is_zero() {
        tokio::time::sleep(shared.compute).await;
    }
    let (output_hash, output_bytes) = match &a.output {
        Some(out) => {
            let Some(shape) = &out.shape else {
                return false;
            };
            let zeros = vec![0.0f32; shape.iter().product()];
            let Ok(bytes) = encode(shape, &zeros, shared.wire) else {
                return false;
            };
            let hash = payload_hash(&bytes);
            let len = bytes.len() as u64;
            let Ok(url) = url::Url::parse(&out.url) else {
                return false;
            };
            if !put(shared, blobs, &url, Bytes::from(bytes)).await {
                return false;
            }
            (Some(hash), Some(len))
        }
        None => (None, None),
    };
    let at_tail = a.section == shared.tail && a.kind != WorkKind::Backward;
    let req = SubmitRequest {
        assignment_id: a.id,
        output_hash,
        output_bytes,
        loss: at_tail.then_some(2.0),
        timings: Timings::default(),
    };
    matches!(
        shared.timed("submit", api.submit(&req)).await,
        Ok(SubmitResponse { accepted: true, .. })
    )
}

/// Attempts at one blob upload that the server turns away as busy (503).
const BUSY_ATTEMPTS: u32 = 10;

/// The wait the orchestrator's busy answer asks for (`Retry-After: 1`).
const BUSY_WAIT: Duration = Duration::from_secs(1);

/// Uploads `bytes` to `url`, retrying a busy answer (503) [`BUSY_ATTEMPTS`] times
/// [`BUSY_WAIT`] apart; whether it was stored.
async fn put(shared: &Shared, blobs: &UrlClient, url: &url::Url, bytes: Bytes) -> bool {
    for _ in 0..BUSY_ATTEMPTS {
        match shared
            .timed("blob PUT", blobs.upload(url, bytes.clone()))
            .await
        {
            Ok(()) => return true,
            Err(StorageError::HttpStatus { status: 503, .. }) => {
                shared.busy_puts.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(BUSY_WAIT).await;
            }
            Err(_) => return false,
        }
    }
    false
}

/// Interval of a watcher's polls (the dashboard refreshes every 2 s).
pub const WATCH_INTERVAL: Duration = Duration::from_secs(2);

/// A dashboard-like watcher: polls the unauthenticated `/api/status`, `/api/merge/status`
/// and `/metrics` every [`WATCH_INTERVAL`] until [`Shared::stop`].
///
/// # Errors
/// The clients cannot be built.
pub async fn watch(shared: Arc<Shared>) -> anyhow::Result<()> {
    let api = ApiClient::new(&shared.base, None, shared.run.clone(), no_retry())
        .context("building the API client")?;
    let plain = UrlClient::new(no_retry()).context("building the HTTP client")?;
    let metrics = url::Url::parse(&format!("{}/metrics", shared.base.trim_end_matches('/')))
        .context("the metrics URL")?;
    while !shared.stop.load(Ordering::Relaxed) {
        let _ = shared.timed("status", api.status()).await;
        let _ = shared.timed("merge status", api.merge_status()).await;
        let _ = shared
            .timed("metrics", plain.download(&metrics, None))
            .await;
        tokio::time::sleep(WATCH_INTERVAL).await;
    }
    Ok(())
}
