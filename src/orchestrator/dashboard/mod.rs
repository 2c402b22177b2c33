//! The dashboard: a page at `/` (HTML, CSS and JS embedded in the binary; no CDN, plots drawn
//! as SVG by the page itself) that refreshes from the public JSON endpoints: `/api/status`,
//! `/api/merge/status`, `/api/weights`, [`history`]'s `/api/history` and [`samples`]'s
//! `/api/samples`.

use axum::Json;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use serde::{Deserialize, Serialize};

use super::http_error::HttpError;
use super::repo::{LossPoint, MergeRecord};
use super::state::AppState;

/// The page.
const INDEX_HTML: &str = include_str!("index.html");
/// Its script.
const DASHBOARD_JS: &str = include_str!("dashboard.js");
/// Most loss points `/api/history` returns.
pub const MAX_POINTS: usize = 5000;
/// Epochs of merge history `/api/history` returns.
pub const MERGE_EPOCHS: u64 = 50;

/// The dashboard's routes: `/`, `/dashboard.js`, `/api/history`, `/api/samples`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(index))
        .route("/dashboard.js", get(script))
        .route("/api/history", get(history))
        .route("/api/samples", get(samples))
}

/// `GET /api/samples`: text generated from the newest merged model
/// ([`super::samples`]), and the last generation's error if it failed.
async fn samples(State(state): State<AppState>) -> Json<super::sample_store::SamplesView> {
    Json(state.samples.view())
}

async fn index() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        INDEX_HTML,
    )
}

async fn script() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        DASHBOARD_JS,
    )
}

/// Query of `GET /api/history`.
#[derive(Debug, Deserialize)]
pub struct HistoryQuery {
    /// Most points (default and cap [`MAX_POINTS`]).
    pub limit: Option<usize>,
}

/// `GET /api/history`: the loss of the most recent completed samples and the finished merges
/// of the last [`MERGE_EPOCHS`] epochs, oldest first.
#[derive(Debug, Clone, Serialize)]
pub struct History {
    /// Tokens per sample (`batch_size * seq_len`), to turn completions into tokens/s.
    pub tokens_per_sample: u64,
    /// The points.
    pub points: Vec<LossPoint>,
    /// Finished section merges: verdict counts and flagged mergers.
    pub merges: Vec<MergeRecord>,
}

async fn history(
    State(state): State<AppState>,
    Query(q): Query<HistoryQuery>,
) -> Result<Json<History>, HttpError> {
    let limit = q.limit.unwrap_or(MAX_POINTS).clamp(1, MAX_POINTS);
    let points = state.repo.loss_history(limit)?;
    let merges = state.repo.merge_history(MERGE_EPOCHS)?;
    Ok(Json(History {
        tokens_per_sample: (state.config.batch_size * state.config.seq_len) as u64,
        points,
        merges,
    }))
}
