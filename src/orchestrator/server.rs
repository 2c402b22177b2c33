//! The router, the deadline task, and serving with graceful shutdown.

use std::future::Future;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::connect_info::Connected;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::serve::{IncomingStream, Listener};

use super::blob::{get_blob, put_blob};
use super::handlers;
use super::merge_handlers;
use super::metrics::Metrics;
use super::state::AppState;
use super::validation_handlers;

/// Body limit of the JSON API routes.
pub const API_BODY_LIMIT: usize = 64 * 1024;
/// Body limit of blob uploads.
pub const BLOB_BODY_LIMIT: usize = 1 << 30;
/// Threads the orchestrator's runtime may start beside its async workers. A database call that
/// waits for the connection blocks its worker (`block_in_place`) and tokio hands the worker's
/// other tasks to a fresh thread, so requests queued on the one connection each held a thread
/// (when every call did so): 209 to 370 threads at 150 simulated miners, and the process grew
/// by about 14 MiB over 8,000 samples (`iota bench orchestrator`). Capped, the rest of the
/// queue waits for a thread instead. Storage I/O shares this pool, which is why the cap is not
/// lower: at 16 and 32 blob uploads slowed and samples/s fell by 9-24%.
pub const BLOCKING_THREADS: usize = 64;
/// How often the deadline task looks for missed deadlines and advances the merge cycle.
pub const DEADLINE_TICK: Duration = Duration::from_millis(500);

async fn observe(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let start = Instant::now();
    let response = next.run(req).await;
    // A long-polled `/api/work` reports the time it waited for work; that is not service time.
    let waited = response
        .extensions()
        .get::<handlers::Waited>()
        .map_or(Duration::ZERO, |w| w.0);
    state.metrics.observe(
        &route,
        response.status().as_u16(),
        start.elapsed().saturating_sub(waited).as_secs_f64(),
    );
    response
}

/// The whole HTTP API over `state` (tests drive it with `tower::ServiceExt::oneshot`).
pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route("/api/register", post(handlers::register))
        .route("/api/heartbeat", post(handlers::heartbeat))
        .route("/api/work", post(handlers::work))
        .route("/api/submit", post(handlers::submit))
        .route("/api/release", post(handlers::release))
        .route("/api/merge/task", post(merge_handlers::task))
        .route("/api/merge/submit", post(merge_handlers::submit))
        .route(
            "/api/validator/register",
            post(validation_handlers::register),
        )
        .route("/api/validator/ledger", post(validation_handlers::ledger))
        .route("/api/validator/work", post(validation_handlers::work))
        .route(
            "/api/validator/merge",
            post(validation_handlers::merge_record),
        )
        .route("/api/validator/samples", post(validation_handlers::samples))
        .route("/api/weights", post(validation_handlers::publish))
        .layer(DefaultBodyLimit::max(API_BODY_LIMIT));
    let blob = Router::new()
        .route("/blob/{*key}", get(get_blob).put(put_blob))
        .layer(DefaultBodyLimit::max(BLOB_BODY_LIMIT));
    Router::new()
        .route("/health", get(handlers::health))
        .route("/metrics", get(handlers::metrics))
        .route("/api/status", get(handlers::status))
        .route("/api/run", get(handlers::run_info))
        .route("/api/merge/status", get(merge_handlers::status))
        .route("/api/weights", get(validation_handlers::weights))
        .merge(super::dashboard::routes())
        .merge(api)
        .merge(blob)
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state)
}

/// One pass of the deadline task: expires missed assignments; returns how many.
pub fn enforce_deadlines(state: &AppState) -> usize {
    match state.repo.expire(state.limits(), state.now_ms()) {
        Ok(fallout) => {
            if !fallout.is_empty() {
                state.wakeups.everyone();
            }
            for f in &fallout {
                tracing::warn!(?f, "assignment missed its deadline");
                Metrics::bump(&state.metrics.expired);
            }
            fallout.len()
        }
        Err(e) => {
            tracing::error!(error = %e, "deadline task");
            0
        }
    }
}

/// Serves `state` on `listener` until `shutdown` resolves, running the deadline task
/// alongside (and the metagraph's refresh, on a run with a subnet attached); in-flight
/// requests finish before it returns. `listener` is a plain
/// [`tokio::net::TcpListener`] or a [`super::TlsListener`] (HTTPS).
///
/// # Errors
/// An I/O error of the listener.
pub async fn serve<L>(
    state: AppState,
    listener: L,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: Listener<Addr = std::net::SocketAddr>,
    super::admission::PeerAddr: for<'a> Connected<IncomingStream<'a, L>>,
{
    let ticker_state = state.clone();
    let ticker = tokio::spawn(async move {
        let mut interval = tokio::time::interval(DEADLINE_TICK);
        loop {
            interval.tick().await;
            enforce_deadlines(&ticker_state);
            if let Err(e) = super::cycle::advance(&ticker_state).await {
                tracing::error!("merge cycle: {e}");
            }
            super::retention::release_done(&ticker_state).await;
            super::samples::refresh(&ticker_state);
        }
    });
    // Without a subnet the loop returns at once.
    let refresher = tokio::spawn(super::chain_refresh::refresh_loop(state.clone()));
    let app = router(state).into_make_service_with_connect_info::<super::admission::PeerAddr>();
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await;
    ticker.abort();
    refresher.abort();
    result
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
