//! The public read-only endpoints: `/health`, `/api/run`, `/api/status`.

use axum::Json;
use axum::extract::State;

use crate::api::*;
use crate::orchestrator::http_error::HttpError;
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
    let info = state.repo.phase_info()?;
    let (phase, epoch) = (info.phase, info.epoch);
    let miners = state.repo.miners()?;
    let sections = state
        .config
        .model
        .sections
        .iter()
        .enumerate()
        .map(|(index, blocks)| SectionStatus {
            index,
            blocks: *blocks,
            miners: miners
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
    let counts = state.repo.counts()?;
    let since = now
        .saturating_sub(THROUGHPUT_WINDOW_MS)
        .max(state.started_ms);
    let (recent_loss, recent_done) = state.repo.recent(RECENT_LOSSES, since)?;
    let window_s = (now.saturating_sub(since) as f64 / 1000.0).max(1.0);
    let tokens_per_sample = (state.config.batch_size * state.config.seq_len) as u64;
    let tokens = recent_done as f64 * tokens_per_sample as f64;
    let evals = state.repo.eval_summaries()?;
    let eval_loss = evals.iter().rev().find_map(|e| e.eval_loss);
    let finished = run_finished(state, phase, epoch)?;
    Ok(StatusResponse {
        run: state.config.run.clone(),
        phase,
        epoch,
        phase_deadline_unix_ms: info.deadline_ms,
        sections,
        samples: SampleCounts {
            completed: counts.completed,
            dropped: counts.dropped,
            in_flight: counts.active,
        },
        recent_loss,
        tokens_per_s: tokens / window_s,
        tokens: counts.completed * tokens_per_sample,
        eval_loss,
        evals,
        finished,
    })
}

/// Whether a run with a sample budget is over: the budget is spent, nothing is under way, the
/// last training epoch was merged, and the merged model evaluated (when evaluation is on).
fn run_finished(state: &AppState, phase: Phase, epoch: u64) -> Result<bool, HttpError> {
    let (_, _, next) = state.repo.run_state()?;
    let Some(budget) = state.config.max_samples else {
        return Ok(false);
    };
    if next < budget || phase != Phase::Training {
        return Ok(false);
    }
    let (done, active) = state.repo.epoch_progress(epoch)?;
    if done > 0 || active > 0 {
        return Ok(false);
    }
    if state.eval_units() == 0 {
        return Ok(true);
    }
    // Every evaluation sample of the final epoch ended (completed, or dropped with a reason).
    Ok(state.repo.evals_started(epoch)? && state.repo.evals_active(epoch)? == 0)
}
