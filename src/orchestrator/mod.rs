//! The orchestrator: the server side of the network (`iota orchestrate --config run.yaml`).
//!
//! - [`config`]: the run config (YAML).
//! - [`repo`] / [`repo_types`]: durable state in SQLite and the routing rules.
//! - [`auth`]: the signed-request extractors; [`http_error`]: every refusal.
//! - [`cycle`] / [`finalize`] / [`merge_handlers`]: the merge cycle (phase machine,
//!   verification and checkpoints, its endpoints); its durable state is in [`repo`] too.
//! - [`handlers`]: the JSON endpoints; [`wire`]: assignments on the wire and their URLs.
//! - [`blob`] / [`blob_token`]: the local-storage blob endpoint and its tokens.
//! - [`validation_handlers`] / [`metagraph`] / [`retention`]: what validators read and
//!   publish, the local metagraph (`/api/weights`), and how long an epoch's objects are kept
//!   for them; their durable state is in [`repo`] too. [`flag_quorum`]: validators' agreed
//!   flags, which exclude repeat offenders from routing.
//! - [`samples`] / [`sample_store`]: text sampled from each merged model for the dashboard.
//! - [`metrics`]: Prometheus counters; [`state`]: the shared [`AppState`];
//!   [`server`]: the router, the deadline task, graceful shutdown; [`tls`]: HTTPS (the
//!   certificate and key of the run config, reloaded when they change).

pub mod admission;
pub mod auth;
pub mod blob;
pub mod blob_token;
pub mod chain_refresh;
pub mod config;
pub mod cycle;
pub mod cycle_error;
pub mod dashboard;
pub mod finalize;
pub mod flag_quorum;
pub mod handlers;
pub mod http_error;
pub mod merge_handlers;
pub mod metagraph;
pub mod metrics;
pub mod outliers;
pub mod reference;
pub mod repo;
pub mod repo_types;
pub mod retention;
pub mod sample_store;
pub mod samples;
pub mod server;
pub mod state;
pub mod subnet;
pub mod tls;
pub mod validation_handlers;
pub mod wakeups;
pub mod wire;

pub use config::{ConfigError, RunConfig};
pub use http_error::HttpError;
pub use repo::Repository;
pub use server::{BLOCKING_THREADS, enforce_deadlines, router, serve, shutdown_signal};
pub use state::{AppState, Clock, StartError};
pub use tls::{ServerTls, TlsError, TlsFiles, TlsListener};
