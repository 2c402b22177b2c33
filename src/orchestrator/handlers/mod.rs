//! Handlers of the JSON API (see [`crate::api::types`] for the endpoint table), one file per job.
//!
//! - `status`: `/health`, `/api/run`, `/api/status`; `prometheus`: `/metrics`.
//! - `registry`: `/api/register`, `/api/heartbeat`.
//! - `routing`: `/api/work`, `/api/submit`, `/api/release`; `payload`: the checks a submitted
//!   result must pass.
//!
//! The merge cycle's endpoints are in [`super::merge_handlers`].

mod payload;
mod prometheus;
mod registry;
mod routing;
mod status;

pub use prometheus::metrics;
pub use registry::{heartbeat, register};
pub use routing::{Waited, release, submit, work};
pub use status::{build_status, health, run_info, status};
