//! The public read-only endpoints: `/health`, `/api/run`, `/api/status`.

use axum::Json;
use axum::extract::State;

use crate::api::*;
use crate::orchestrator::http_error::HttpError;
use crate::orchestrator::repo::StatusSnapshot;
use crate::orchestrator::state::AppState;

/// Losses averaged for `recent_loss`.
const RECENT_LOSSES: usize = 16;

/// Window of the throughput estimate.
const THROUGHPUT_WINDOW_MS: u64 = 60_000;

/// `GET /health`.
pub async fn health() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

/// `GET /api/run`.
pub async fn run_info(State(state): State<AppState>) -> Result<Json<RunInfo>, HttpError> {
    let (phase, epoch, _) = state.repo.run_state()?;
    Ok(Json(RunInfo {
        api_version: API_VERSION,
        version: env!("CARGO_PKG_VERSION").to_string(),
        run: state.config.run.clone(),
        model: state.config.model.clone(),
        phase,
        epoch,
    }))
}

/// `GET /api/status`.
pub async fn status(State(state): State<AppState>) -> Result<Json<StatusResponse>, HttpError> {
    Ok(Json(build_status(&state)?))
}

/// The status document.
///
/// # Errors
/// A state-store error.
pub fn build_status(state: &AppState) -> Result<StatusResponse, HttpError> {
    let now = state.now_ms();
    let since = now
        .saturating_sub(THROUGHPUT_WINDOW_MS)
        .max(state.started_ms);
    // One read of the store: behind 150 miners' requests, each separate query waited its own
    // turn for the connection.
    let snap = state.repo.status_snapshot(RECENT_LOSSES, since)?;
    let (phase, epoch) = (snap.phase.phase, snap.phase.epoch);
    let sections = state
        .config
        .model
        .sections
        .iter()
        .enumerate()
        .map(|(index, blocks)| SectionStatus {
            index,
            blocks: *blocks,
            miners: snap
                .miners
                .iter()
                .filter(|m| m.section == index)
                .map(|m| MinerStatus {
                    hotkey: m.hotkey.clone(),
                    forwards: m.forwards,
                    backwards: m.backwards,
                    penalties: m.penalties,
                    last_seen_s: now.saturating_sub(m.last_seen_ms) as f64 / 1000.0,
                    weights_epoch: m.weights_epoch,
                    weights_hash: m.weights_hash.clone(),
                })
                .collect(),
        })
        .collect();
    let window_s = (now.saturating_sub(since) as f64 / 1000.0).max(1.0);
    let tokens_per_sample = (state.config.batch_size * state.config.seq_len) as u64;
    let tokens = snap.completed_since as f64 * tokens_per_sample as f64;
    let eval_loss = snap.evals.iter().rev().find_map(|e| e.eval_loss);
    let finished = run_finished(state, &snap);
    let chain = state.subnet().map(|subnet| {
        subnet.status(|hotkey| {
            snap.miners
                .iter()
                .any(|m| m.hotkey == hotkey && m.last_seen_ms > 0)
        })
    });
    Ok(StatusResponse {
        run: state.config.run.clone(),
        phase,
        epoch,
        phase_deadline_unix_ms: snap.phase.deadline_ms,
        sections,
        samples: SampleCounts {
            completed: snap.counts.completed,
            dropped: snap.counts.dropped,
            in_flight: snap.counts.active,
        },
        recent_loss: snap.recent_loss,
        tokens_per_s: tokens / window_s,
        tokens: snap.counts.completed * tokens_per_sample,
        eval_loss,
        evals: snap.evals,
        chain,
        finished,
    })
}

/// Whether a run with a sample budget is over: the budget is spent, nothing is under way, the
/// last training epoch was merged, and the merged model evaluated (when evaluation is on).
fn run_finished(state: &AppState, snap: &StatusSnapshot) -> bool {
    let Some(budget) = state.config.max_samples else {
        return false;
    };
    if snap.next_sample < budget || snap.phase.phase != Phase::Training {
        return false;
    }
    let (done, active) = snap.epoch_progress;
    if done > 0 || active > 0 {
        return false;
    }
    if state.eval_units() == 0 {
        return true;
    }
    // Every evaluation sample of the final epoch ended (completed, or dropped with a reason).
    let (started, under_way) = snap.epoch_evals;
    started && under_way == 0
}
