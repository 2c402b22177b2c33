//! The signed-request extractors: [`Signed<T>`] (registered callers) and [`SignedAny<T>`]
//! (any hotkey: `/api/register`).
//!
//! Checks, in order, each refusing with nothing changed:
//! 1. the four auth headers are present and parse (401 `unauthorized`);
//! 2. the request is for this run and the signature covers the method, the path (with its
//!    query) and the raw body (401 `unauthorized`),
//!    signed within [`MAX_AGE_MS`] of the server clock (401 `stale`);
//! 3. the body is valid JSON for `T` (400 `bad_request`);
//! 4. on a run with a chain, the hotkey is on the subnet's metagraph (403 `not_on_chain`;
//!    skipped by [`SignedAny`], whose `/api/register` checks it itself); the hotkey is
//!    registered (403 `not_registered`; skipped by [`SignedAny`]), or for [`SignedValidator`]
//!    listed under `validators` in the run config, or holding a validator permit on the
//!    subnet (403 `not_a_validator`);
//! 5. the signature was not seen before (409 `replayed`; ids are kept for `2 * MAX_AGE_MS`,
//!    longer than a signature stays fresh). Only this last step writes, and only on success.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

use super::http_error::HttpError;
use super::state::AppState;
use crate::wallet::{RequestLine, SignedHeaders, signature_id, verify_request};

/// Largest allowed distance between a request's timestamp and the server clock.
pub const MAX_AGE_MS: u64 = 30_000;

/// A verified request from a registered hotkey.
#[derive(Debug, Clone)]
pub struct Signed<T> {
    /// The caller's SS58 hotkey.
    pub hotkey: String,
    /// The parsed body.
    pub body: T,
}

/// A verified request from any hotkey (registration).
#[derive(Debug, Clone)]
pub struct SignedAny<T> {
    /// The caller's SS58 hotkey.
    pub hotkey: String,
    /// The parsed body.
    pub body: T,
}

/// A verified request from a hotkey the run config lists as a validator.
#[derive(Debug, Clone)]
pub struct SignedValidator<T> {
    /// The caller's SS58 hotkey.
    pub hotkey: String,
    /// The parsed body.
    pub body: T,
    /// The exact body bytes (what the signature covers).
    pub raw: Bytes,
    /// The signature (`0x`-hex) and its timestamp (ms).
    pub signature: (String, u64),
}

/// Who may make a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    Anyone,
    Miner,
    Validator,
}

struct Verified<T> {
    hotkey: String,
    body: T,
    raw: Bytes,
    signature: (String, u64),
}

async fn verify<T: DeserializeOwned>(
    req: Request,
    state: &AppState,
    caller: Caller,
) -> Result<Verified<T>, HttpError> {
    let headers =
        SignedHeaders::from_lookup(|name| req.headers().get(name).and_then(|v| v.to_str().ok()))?;
    let method = req.method().as_str().to_string();
    let path = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_string(), |p| p.as_str().to_string());
    let bytes = Bytes::from_request(req, state)
        .await
        .map_err(|e| HttpError::new(e.status(), "bad_request", e.body_text()))?;
    let now = state.now_ms();
    let address = verify_request(
        &headers,
        RequestLine {
            method: &method,
            path: &path,
        },
        &bytes,
        now,
        MAX_AGE_MS,
        &state.config.run,
    )?;
    let hotkey = address.to_string();
    let body: T = serde_json::from_slice(&bytes)
        .map_err(|e| HttpError::bad_request(format!("malformed body: {e}")))?;
    if let Some(subnet) = state.subnet()
        && caller != Caller::Anyone
        && !subnet.is_registered(&hotkey)
    {
        return Err(HttpError::new(
            axum::http::StatusCode::FORBIDDEN,
            "not_on_chain",
            subnet.not_registered(&hotkey),
        ));
    }
    if caller == Caller::Validator && state.validator(&hotkey).is_none() {
        let why = match state.subnet() {
            Some(subnet) => format!(
                "hotkey {hotkey} holds no validator permit on subnet {}: only permitted \
                 validators validate the run",
                subnet.config().netuid
            ),
            None => format!("hotkey {hotkey} is not one of the run's validators"),
        };
        return Err(HttpError::new(
            axum::http::StatusCode::FORBIDDEN,
            "not_a_validator",
            why,
        ));
    }
    if caller == Caller::Miner && state.repo.miner(&hotkey)?.is_none() {
        return Err(HttpError::new(
            axum::http::StatusCode::FORBIDDEN,
            "not_registered",
            format!("hotkey {hotkey} is not registered: POST /api/register first"),
        ));
    }
    let fresh = state.repo.record_signature(
        &signature_id(&headers),
        now.saturating_add(2 * MAX_AGE_MS),
        now,
    )?;
    if !fresh {
        return Err(HttpError::new(
            axum::http::StatusCode::CONFLICT,
            "replayed",
            "this signature was already used: sign every request afresh",
        ));
    }
    Ok(Verified {
        hotkey,
        body,
        raw: bytes,
        signature: (
            headers.signature.clone(),
            headers.timestamp_ms.parse().unwrap_or(0),
        ),
    })
}

impl<T: DeserializeOwned + Send> FromRequest<AppState> for Signed<T> {
    type Rejection = HttpError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let v = verify(req, state, Caller::Miner).await?;
        Ok(Self {
            hotkey: v.hotkey,
            body: v.body,
        })
    }
}

impl<T: DeserializeOwned + Send> FromRequest<AppState> for SignedAny<T> {
    type Rejection = HttpError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let v = verify(req, state, Caller::Anyone).await?;
        Ok(Self {
            hotkey: v.hotkey,
            body: v.body,
        })
    }
}

impl<T: DeserializeOwned + Send> FromRequest<AppState> for SignedValidator<T> {
    type Rejection = HttpError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let v = verify(req, state, Caller::Validator).await?;
        Ok(Self {
            hotkey: v.hotkey,
            body: v.body,
            raw: v.raw,
            signature: v.signature,
        })
    }
}
