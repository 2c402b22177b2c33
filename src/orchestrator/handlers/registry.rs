//! Joining and staying: `/api/register` and `/api/heartbeat`.

use axum::extract::{ConnectInfo, State};
use axum::http::HeaderMap;
use axum::{Extension, Json};

use crate::api::*;
use crate::orchestrator::admission::{FORWARDED_FOR, PeerAddr, Source};
use crate::orchestrator::auth::{Signed, SignedAny};
use crate::orchestrator::http_error::HttpError;
use crate::orchestrator::merge_handlers::section_checkpoint;
use crate::orchestrator::repo::Placement;
use crate::orchestrator::state::AppState;

/// `POST /api/register`.
pub async fn register(
    State(state): State<AppState>,
    peer: Option<Extension<ConnectInfo<PeerAddr>>>,
    headers: HeaderMap,
    req: SignedAny<RegisterRequest>,
) -> Result<Json<RegisterResponse>, HttpError> {
    let c = &state.config;
    if let Some(subnet) = state.subnet()
        && !subnet.is_registered(&req.hotkey)
    {
        tracing::warn!(hotkey = %req.hotkey, "registration refused: not on the subnet's metagraph");
        return Err(HttpError::new(
            axum::http::StatusCode::FORBIDDEN,
            "not_on_chain",
            subnet.not_registered(&req.hotkey),
        ));
    }
    let forwarded: Vec<&str> = headers
        .get_all(FORWARDED_FOR)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let source = Source::of(
        peer.map(|Extension(ConnectInfo(PeerAddr(addr)))| addr),
        &forwarded,
        c.placement.new_keys.forwarded_for,
    );
    // Keyed by the orchestrator's secret and the source address, not the hotkey: a registrant
    // cannot predict it, and cannot re-roll it with fresh keys (see `repo::registry`).
    let placement = match c.placement.pins.get(&req.hotkey) {
        Some(&section) => Placement::Pinned(section),
        None if c.placement.ordered => Placement::Ordered,
        None => Placement::Draw(state.secret.placement_draw(&source.to_string())),
    };
    let now = state.now_ms();
    if !matches!(placement, Placement::Pinned(_))
        && state.repo.miner(&req.hotkey)?.is_none()
        && let Err(wait_s) = state.new_keys.take(&c.placement.new_keys, source, now)
    {
        tracing::warn!(hotkey = %req.hotkey, %source, wait_s, "new hotkey refused: rate limit");
        return Err(HttpError::too_many(
            format!(
                "too many new hotkeys from {source} (placement.new_keys: {} at once, then {} \
                 an hour); retry in {wait_s} s",
                c.placement.new_keys.burst, c.placement.new_keys.per_hour
            ),
            wait_s,
        ));
    }
    let section = state.repo.register(
        &req.hotkey,
        &req.body.device,
        req.body.max_in_flight,
        c.model.n_sections(),
        c.max_miners_per_section,
        placement,
        now,
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
        settings: c.miner_settings(c.max_in_flight.min(req.body.max_in_flight.max(1))),
        checkpoint,
    }))
}

/// `POST /api/heartbeat`.
pub async fn heartbeat(
    State(state): State<AppState>,
    req: Signed<HeartbeatRequest>,
) -> Result<Json<HeartbeatResponse>, HttpError> {
    if let Some(hash) = &req.body.weights_hash
        && !(hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err(HttpError::bad_request(
            "weights_hash must be 64 hex digits (the BLAKE3 hash of the adopted state)",
        ));
    }
    if let Some(u) = &req.body.usage {
        let seconds = [
            u.wall_s,
            u.compute_s,
            u.download_s,
            u.upload_s,
            u.orchestrator_s,
            u.idle_s,
            u.merge_s,
        ];
        if seconds.iter().any(|s| !s.is_finite() || *s < 0.0) {
            return Err(HttpError::bad_request(
                "usage seconds must be finite and non-negative",
            ));
        }
    }
    state.repo.touch(&req.hotkey, state.now_ms())?;
    state.repo.set_weights(
        &req.hotkey,
        req.body.weights_epoch,
        req.body
            .weights_hash
            .map(|h| h.to_ascii_lowercase())
            .as_deref(),
    )?;
    let info = state.repo.phase_info()?;
    let miner = state.repo.miner(&req.hotkey)?;
    if let (Some(usage), Some(m)) = (&req.body.usage, &miner) {
        state.metrics.record_usage(&req.hotkey, m.section, usage);
    }
    let penalties = miner.map(|m| m.penalties).unwrap_or(0);
    Ok(Json(HeartbeatResponse {
        phase: info.phase,
        epoch: info.epoch,
        phase_deadline_unix_ms: info.deadline_ms,
        penalties,
    }))
}
