//! `/metrics`: the status document and request counters in Prometheus text format.

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use super::status::build_status;
use crate::orchestrator::http_error::HttpError;
use crate::orchestrator::state::AppState;

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
    if let Some(loss) = status.eval_loss {
        let _ = writeln!(
            out,
            "# HELP iota_eval_loss Held-out loss of the latest merged model, evaluated through \
             the network.\n# TYPE iota_eval_loss gauge\niota_eval_loss {loss}"
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
