//! `GET/PUT /blob/{key}?exp=..[&max=..]&sig=..`: the orchestrator serves a local-directory
//! store itself, to holders of a signed, expiring token ([`super::blob_token`]). `GET` honours a
//! single `Range: bytes=a-b` (or `bytes=a-`) header with `206 Partial Content`.
//!
//! A `PUT` is checked before a byte of its body is read: a bad or expired token is refused
//! (403), a `Content-Length` above the token's `max` too (413), and when
//! [`MAX_CONCURRENT_PUTS`] uploads are already streaming the request is turned away (503,
//! `Retry-After`). The body then streams into storage and the upload is cut off (413, nothing
//! stored) the moment it passes `max`. So an unauthenticated flood costs no memory, and
//! authenticated uploads at most their limit and a bounded number at once.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;

use super::http_error::HttpError;
use super::state::AppState;
use crate::storage::ObjectKey;
use crate::storage::traffic::{self, TrafficDir};

/// The token in the query string.
#[derive(Debug, Deserialize)]
pub struct BlobToken {
    /// Expiry, ms since the Unix epoch.
    pub exp: u64,
    /// Largest body an upload may carry (uploads only).
    pub max: Option<u64>,
    /// Signature (64 hex digits).
    pub sig: String,
}

fn authorise(
    state: &AppState,
    method: &str,
    key: &str,
    token: &BlobToken,
) -> Result<ObjectKey, HttpError> {
    let key = ObjectKey::parse(key).map_err(|e| HttpError::bad_request(format!("bad key: {e}")))?;
    if (method == "PUT") != token.max.is_some()
        || !state.secret.verify(
            method,
            key.as_str(),
            token.exp,
            token.max,
            &token.sig,
            state.now_ms(),
        )
    {
        return Err(HttpError::forbidden("blob token is invalid or expired"));
    }
    Ok(key)
}

/// Parses `bytes=a-b` / `bytes=a-` into a half-open range within `size`.
///
/// # Errors
/// 416 for an unsatisfiable or malformed range.
pub fn parse_range(value: &str, size: u64) -> Result<std::ops::Range<u64>, HttpError> {
    let bad = || {
        HttpError::new(
            StatusCode::RANGE_NOT_SATISFIABLE,
            "bad_request",
            format!("unsupported or unsatisfiable range {value:?} (object is {size} bytes)"),
        )
    };
    let spec = value.trim().strip_prefix("bytes=").ok_or_else(bad)?;
    let (a, b) = spec.split_once('-').ok_or_else(bad)?;
    let start: u64 = a.trim().parse().map_err(|_| bad())?;
    let end_inclusive: u64 = if b.trim().is_empty() {
        size.checked_sub(1).ok_or_else(bad)?
    } else {
        b.trim()
            .parse::<u64>()
            .map_err(|_| bad())?
            .min(size.saturating_sub(1))
    };
    if start > end_inclusive || start >= size {
        return Err(bad());
    }
    Ok(start..end_inclusive + 1)
}

/// `GET /blob/{key}`.
pub async fn get_blob(
    State(state): State<AppState>,
    Path(key): Path<String>,
    Query(token): Query<BlobToken>,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    let key = authorise(&state, "GET", &key, &token)?;
    if let Some(range) = headers.get(header::RANGE).and_then(|v| v.to_str().ok()) {
        let size = state.storage.head(&key).await?;
        let range = parse_range(range, size)?;
        let content_range = format!("bytes {}-{}/{size}", range.start, range.end - 1);
        let bytes = state.storage.get_range(&key, range).await?;
        traffic::served().record_key(key.as_str(), TrafficDir::Down, bytes.len() as u64);
        return Ok((
            StatusCode::PARTIAL_CONTENT,
            [
                (header::CONTENT_RANGE, content_range),
                (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            ],
            bytes,
        )
            .into_response());
    }
    let bytes = state.storage.get(&key).await?;
    traffic::served().record_key(key.as_str(), TrafficDir::Down, bytes.len() as u64);
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

pub use super::state::MAX_CONCURRENT_PUTS;

fn too_large(max: u64) -> HttpError {
    HttpError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!("this upload may carry at most {max} bytes"),
    )
}

/// `PUT /blob/{key}`: token, declared length and concurrency are checked before the body is
/// read; the body streams to storage and is cut off past the token's limit.
pub async fn put_blob(
    State(state): State<AppState>,
    Path(key): Path<String>,
    Query(token): Query<BlobToken>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, HttpError> {
    let key = authorise(&state, "PUT", &key, &token)?;
    let max = token.max.unwrap_or(0);
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max) {
        return Err(too_large(max));
    }
    let Ok(_permit) = state.blob_puts.clone().try_acquire_owned() else {
        return Ok((
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            "too many uploads in progress; retry shortly",
        )
            .into_response());
    };
    let mut writer = state.storage.writer(&key);
    if let Some(n) = declared {
        // At most the token's limit, checked above.
        writer.reserve(usize::try_from(n).unwrap_or(usize::MAX));
    }
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => {
                writer.abort().await;
                return Err(HttpError::bad_request(format!("upload interrupted: {e}")));
            }
        };
        if writer.len().saturating_add(chunk.len() as u64) > max {
            writer.abort().await;
            return Err(too_large(max));
        }
        if let Err(e) = writer.write(&chunk).await {
            writer.abort().await;
            return Err(e.into());
        }
    }
    let len = writer.finish().await?;
    traffic::served().record_key(key.as_str(), TrafficDir::Up, len);
    Ok(StatusCode::OK.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_parsed_inclusively() {
        assert_eq!(parse_range("bytes=0-9", 100).unwrap(), 0..10);
        assert_eq!(parse_range("bytes=90-", 100).unwrap(), 90..100);
        assert_eq!(parse_range("bytes=90-200", 100).unwrap(), 90..100);
        assert!(parse_range("bytes=100-", 100).is_err());
        assert!(parse_range("bytes=5-2", 100).is_err());
        assert!(parse_range("items=0-1", 100).is_err());
        assert!(parse_range("bytes=-5", 100).is_err());
    }
}
