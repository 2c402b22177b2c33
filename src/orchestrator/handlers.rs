//! Handlers of the JSON API (see [`crate::api::types`] for the endpoint table).

use std::fmt::Write as _;

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use super::auth::{Signed, SignedAny};
use super::http_error::HttpError;
use super::merge_handlers::section_checkpoint;
use super::metrics::Metrics;
use super::repo_types::{Accepted, AssignmentRow, Fallout};
use super::state::AppState;
use super::wire::{output_of, to_wire};
use crate::api::*;
use crate::storage::{StorageError, decode_expecting, payload_hash};

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
    let tokens = recent_done as f64 * (state.config.batch_size * state.config.seq_len) as f64;
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
    })
}

/// `GET /metrics` (Prometheus text format).
pub async fn metrics(State(state): State<AppState>) -> Result<impl IntoResponse, HttpError> {
    let status = build_status(&state)?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP iota_samples_total Samples by outcome.\n# TYPE iota_samples_total gauge"
    );
    for (outcome, n) in [
        ("completed", status.samples.completed),
        ("dropped", status.samples.dropped),
        ("in_flight", status.samples.in_flight),
    ] {
        let _ = writeln!(out, "iota_samples_total{{outcome=\"{outcome}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "# HELP iota_section_miners Registered miners per section.\n# TYPE iota_section_miners gauge"
    );
    for s in &status.sections {
        let _ = writeln!(
            out,
            "iota_section_miners{{section=\"{}\"}} {}",
            s.index,
            s.miners.len()
        );
    }
    if let Some(loss) = status.recent_loss {
        let _ = writeln!(
            out,
            "# HELP iota_recent_loss Mean loss of recent samples.\n# TYPE iota_recent_loss gauge\n\
             iota_recent_loss {loss}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP iota_tokens_per_second Recent throughput.\n# TYPE iota_tokens_per_second gauge\n\
         iota_tokens_per_second {}",
        status.tokens_per_s
    );
    state.metrics.render_requests(&mut out);
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out))
}

/// `POST /api/register`.
pub async fn register(
    State(state): State<AppState>,
    req: SignedAny<RegisterRequest>,
) -> Result<Json<RegisterResponse>, HttpError> {
    let c = &state.config;
    let section = state.repo.register(
        &req.hotkey,
        &req.body.device,
        req.body.max_in_flight,
        c.model.n_sections(),
        c.max_miners_per_section,
        state.now_ms(),
    )?;
    let (_, epoch, _) = state.repo.run_state()?;
    let checkpoint = section_checkpoint(&state, section).await?;
    tracing::info!(hotkey = %req.hotkey, section, "miner registered");
    Ok(Json(RegisterResponse {
        hotkey: req.hotkey,
        section,
        run: c.run.clone(),
        epoch,
        model: c.model.clone(),
        settings: MinerSettings {
            local_steps: c.local_steps,
            max_in_flight: c.max_in_flight.min(req.body.max_in_flight.max(1)),
            wire: c.wire,
            seq_len: c.seq_len,
            batch_size: c.batch_size,
            seed: c.seed,
            optimizer: c.optimizer,
            schedule: c.schedule,
            heartbeat_s: c.heartbeat_s,
        },
        checkpoint,
    }))
}

/// `POST /api/heartbeat`.
pub async fn heartbeat(
    State(state): State<AppState>,
    req: Signed<HeartbeatRequest>,
) -> Result<Json<HeartbeatResponse>, HttpError> {
    state.repo.touch(&req.hotkey, state.now_ms())?;
    state.repo.set_weights(
        &req.hotkey,
        req.body.weights_epoch,
        req.body.weights_hash.as_deref(),
    )?;
    let info = state.repo.phase_info()?;
    let penalties = state
        .repo
        .miner(&req.hotkey)?
        .map(|m| m.penalties)
        .unwrap_or(0);
    Ok(Json(HeartbeatResponse {
        phase: info.phase,
        epoch: info.epoch,
        phase_deadline_unix_ms: info.deadline_ms,
        penalties,
    }))
}

/// `POST /api/work`: backwards first, then open forwards, then (head miners) new samples.
pub async fn work(
    State(state): State<AppState>,
    req: Signed<WorkRequest>,
) -> Result<Json<WorkResponse>, HttpError> {
    let limits = state.limits();
    let (phase, epoch, _) = state.repo.run_state()?;
    if phase != Phase::Training {
        return Ok(Json(WorkResponse {
            assignments: Vec::new(),
            phase,
            epoch,
        }));
    }
    let taken = state
        .repo
        .take_work(&req.hotkey, req.body.max, limits, state.now_ms())?;
    let mut rows = taken.assignments;
    // Start no more samples than the epoch still needs before its merge.
    let (done, active) = state.repo.epoch_progress(epoch)?;
    let room = state
        .config
        .batches_before_merging
        .saturating_sub(done + active);
    let head_capacity = taken
        .head_capacity
        .min(usize::try_from(room).unwrap_or(usize::MAX));
    if head_capacity > 0 {
        let _guard = state.start_lock.lock().await;
        for _ in 0..head_capacity {
            match start_sample(&state, &req.hotkey).await? {
                Some(row) => rows.push(row),
                None => break,
            }
        }
    }
    let mut assignments = Vec::with_capacity(rows.len());
    for row in &rows {
        assignments.push(to_wire(&state, row).await?);
    }
    Ok(Json(WorkResponse {
        assignments,
        phase,
        epoch,
    }))
}

/// Stores the tokens and targets of the next sample and starts it (caller holds the start
/// lock). `None` when the sample budget is spent.
async fn start_sample(state: &AppState, hotkey: &str) -> Result<Option<AssignmentRow>, HttpError> {
    let (_, epoch, next) = state.repo.run_state()?;
    if state.config.max_samples.is_some_and(|b| next >= b) {
        return Ok(None);
    }
    let (tokens, targets) = state.sample_tokens(next);
    let tokens_hash = state
        .storage
        .put(&state.token_key(epoch, next, "tokens"), tokens)
        .await?;
    let targets_hash = state
        .storage
        .put(&state.token_key(epoch, next, "targets"), targets)
        .await?;
    Ok(state.repo.start_sample(
        next,
        &tokens_hash,
        &targets_hash,
        hotkey,
        state.config.max_samples,
        state.limits(),
        state.now_ms(),
    )?)
}

/// Why an uploaded result is refused, if it is.
async fn check_result(
    state: &AppState,
    row: &AssignmentRow,
    req: &SubmitRequest,
) -> Result<Option<String>, HttpError> {
    let is_tail_forward = row.kind == WorkKind::Forward && row.section == state.config.tail();
    if is_tail_forward {
        match req.loss {
            Some(loss) if loss.is_finite() => {}
            Some(loss) => return Ok(Some(format!("loss {loss} is not finite"))),
            None => return Ok(Some("the tail must report its loss".into())),
        }
    }
    let Some((key, shape)) = output_of(state, row) else {
        return Ok(None);
    };
    let Some(claimed) = &req.output_hash else {
        return Ok(Some("output_hash is missing".into()));
    };
    let bytes = match state.storage.get(&key).await {
        Ok(bytes) => bytes,
        Err(StorageError::NotFound { .. }) => {
            return Ok(Some(format!("no object was uploaded to {key}")));
        }
        Err(e) => return Err(HttpError::internal(e)),
    };
    let actual = payload_hash(&bytes);
    if !actual.eq_ignore_ascii_case(claimed) {
        return Ok(Some(format!(
            "hash mismatch: reported {claimed}, uploaded object hashes to {actual}"
        )));
    }
    if let Some(n) = req.output_bytes
        && n != bytes.len() as u64
    {
        return Ok(Some(format!(
            "size mismatch: reported {n} bytes, uploaded {}",
            bytes.len()
        )));
    }
    match decode_expecting(&bytes, &shape) {
        Ok(t) if t.dtype != state.config.wire => Ok(Some(format!(
            "dtype {} but the run uses {}",
            t.dtype, state.config.wire
        ))),
        Ok(_) => Ok(None),
        Err(e) => Ok(Some(format!("bad payload: {e}"))),
    }
}

/// `POST /api/submit`: checks the upload (hash, size, shape, dtype, finite) and routes the
/// next piece of work; a refused result is penalised and re-offered.
pub async fn submit(
    State(state): State<AppState>,
    req: Signed<SubmitRequest>,
) -> Result<Json<SubmitResponse>, HttpError> {
    let limits = state.limits();
    let id = req.body.assignment_id;
    let row = state.repo.held(id, &req.hotkey, limits.tail)?;
    if row.deadline_ms.is_some_and(|d| state.now_ms() > d) {
        let fallout = state.repo.expire(limits, state.now_ms())?;
        for _ in &fallout {
            Metrics::bump(&state.metrics.expired);
        }
        Metrics::bump(&state.metrics.refused);
        return Ok(Json(SubmitResponse {
            accepted: false,
            reason: Some("the deadline passed before the result arrived".into()),
        }));
    }
    if let Some(reason) = check_result(&state, &row, &req.body).await? {
        let fallout = state
            .repo
            .refuse(id, &req.hotkey, &reason, limits, state.now_ms())?;
        tracing::warn!(hotkey = %req.hotkey, id, %reason, ?fallout, "result refused");
        Metrics::bump(&state.metrics.refused);
        return Ok(Json(SubmitResponse {
            accepted: false,
            reason: Some(reason),
        }));
    }
    let accepted = Accepted {
        output_hash: req
            .body
            .output_hash
            .as_ref()
            .map(|h| h.to_ascii_lowercase()),
        loss: req.body.loss,
        timings: req.body.timings,
    };
    state
        .repo
        .accept(id, &req.hotkey, &accepted, limits, state.now_ms())?;
    Metrics::bump(&state.metrics.accepted);
    Ok(Json(SubmitResponse {
        accepted: true,
        reason: None,
    }))
}

/// `POST /api/release`: hands assignments back (forwards re-offered, backwards dropped).
pub async fn release(
    State(state): State<AppState>,
    req: Signed<ReleaseRequest>,
) -> Result<Json<SubmitResponse>, HttpError> {
    let fallout = state.repo.release(
        &req.hotkey,
        &req.body.assignment_ids,
        state.limits(),
        state.now_ms(),
    )?;
    let dropped = fallout
        .iter()
        .filter(|f| matches!(f, Fallout::Dropped { .. }))
        .count();
    Ok(Json(SubmitResponse {
        accepted: true,
        reason: Some(format!(
            "{} released ({} samples dropped)",
            fallout.len(),
            dropped
        )),
    }))
}
