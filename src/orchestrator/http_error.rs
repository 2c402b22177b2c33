//! [`HttpError`]: every refusal of the HTTP API, rendered as an [`ApiError`] JSON body.
//!
//! | status | code | when |
//! |---|---|---|
//! | 400 | `bad_request` | malformed JSON body or query |
//! | 401 | `unauthorized` | missing or malformed auth headers, bad signature, wrong run |
//! | 401 | `stale` | timestamp further than 30 s from the server clock |
//! | 409 | `replayed` | a signature already seen (byte-identical replay) |
//! | 403 | `not_registered` | a registered-only endpoint called by an unknown hotkey |
//! | 403 | `forbidden` | an assignment held by someone else, a bad blob token |
//! | 404 | `not_found` | unknown assignment or object |
//! | 409 | `conflict` | assignment no longer waiting, sections full |
//! | 413 | `bad_request` | body over the route's limit |
//! | 429 | `rate_limited` | too many new hotkeys from one address, with `Retry-After` |
//! | 5xx | `internal` | anything else; the message says only "internal error" |

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::repo_types::RepoError;
use crate::api::ApiError;
use crate::storage::StorageError;
use crate::wallet::SignatureError;

/// An error answer of the API.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable code (see the module table).
    pub code: &'static str,
    /// Explanation for the client.
    pub message: String,
    /// Seconds the client should wait before asking again (a `Retry-After` header).
    pub retry_after_s: Option<u64>,
}

impl HttpError {
    /// An error with the given status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after_s: None,
        }
    }

    /// 429 `rate_limited`, to be asked again in `retry_after_s` seconds.
    pub fn too_many(message: impl Into<String>, retry_after_s: u64) -> Self {
        Self {
            retry_after_s: Some(retry_after_s),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", message)
        }
    }

    /// 400 `bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// 401 `unauthorized`.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    /// 403 `forbidden`.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 500 `internal`; the details go to the log, never to the client.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!(%detail, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error",
        )
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let body = ApiError {
            code: self.code.to_string(),
            message: self.message,
        };
        let mut response = (self.status, Json(body)).into_response();
        if let Some(s) = self.retry_after_s {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, s.into());
        }
        response
    }
}

impl From<SignatureError> for HttpError {
    fn from(e: SignatureError) -> Self {
        match e {
            SignatureError::Stale { .. } => {
                Self::new(StatusCode::UNAUTHORIZED, "stale", e.to_string())
            }
            _ => Self::unauthorized(e.to_string()),
        }
    }
}

impl From<RepoError> for HttpError {
    fn from(e: RepoError) -> Self {
        match e {
            RepoError::NotRegistered { .. } => {
                Self::new(StatusCode::FORBIDDEN, "not_registered", e.to_string())
            }
            RepoError::NotHolder { .. } => Self::forbidden(e.to_string()),
            RepoError::UnknownAssignment { .. } => Self::not_found(e.to_string()),
            RepoError::SectionsFull { .. }
            | RepoError::SectionFull { .. }
            | RepoError::NotAssigned { .. }
            | RepoError::SampleOrder { .. } => {
                Self::new(StatusCode::CONFLICT, "conflict", e.to_string())
            }
            RepoError::Sqlite(_) | RepoError::Corrupt(_) => Self::internal(e),
        }
    }
}

impl From<StorageError> for HttpError {
    fn from(e: StorageError) -> Self {
        match e {
            StorageError::NotFound { .. } => Self::not_found(e.to_string()),
            StorageError::InvalidRange { .. } => Self::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "bad_request",
                e.to_string(),
            ),
            _ => Self::internal(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_table() {
        let stale = HttpError::from(SignatureError::Stale {
            timestamp_ms: 0,
            now_ms: 40_000,
            max_age_ms: 30_000,
        });
        assert_eq!(
            (stale.status, stale.code),
            (StatusCode::UNAUTHORIZED, "stale")
        );
        let bad = HttpError::from(SignatureError::BadSignature);
        assert_eq!(bad.status, StatusCode::UNAUTHORIZED);
        let unreg = HttpError::from(RepoError::NotRegistered { hotkey: "x".into() });
        assert_eq!(
            (unreg.status, unreg.code),
            (StatusCode::FORBIDDEN, "not_registered")
        );
        let internal = HttpError::from(RepoError::Corrupt("secret detail".into()));
        assert_eq!(internal.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(internal.message, "internal error");
    }
}
