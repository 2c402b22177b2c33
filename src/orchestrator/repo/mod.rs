//! The orchestrator's durable state: one SQLite file (WAL) behind a small interface.
//!
//! Every state change runs inside one transaction, so a `kill -9` at any point leaves either
//! the state before or the state after the change. On restart, registrations and the ledger
//! are intact, and assignments that were in flight expire at their deadline and are re-offered
//! (forwards) or recorded as dropped (backwards).
//!
//! The routing rules live here, next to the data they read:
//! - backward work is handed out first, and only to the miner that ran that sample's forward
//!   in the same section (it caches the input);
//! - a miner holds at most `max_in_flight` forwards whose backward it has not done;
//! - with lane routing (`lanes`), the forward a miner's result opens is offered first to the
//!   next section's miner of the same rank, and to anyone of that section after
//!   `lane_wait_ms`;
//! - a missed or refused forward is re-offered to any miner of the section; a missed backward
//!   drops the sample with a recorded reason; a refused backward is retried by the same miner;
//!   work tried [`MAX_ATTEMPTS`] times drops the sample. Nothing is dropped silently.
//!
//! # Layout
//! - `db`: [`Repository`] (connection, transactions) and integer conversions; `schema`: tables;
//!   `checkpoints`: the WAL's checkpoints on a thread of their own.
//! - `registry`: miners; `replay`: the replay cache; `phase`: phase, epoch, deadlines.
//! - `routing`: handing out work and routing results; `rows`: the row readers it shares.
//! - `policy`: the standing policy; `standing`: penalties acting on routing (back-off,
//!   exclusion) and expired miners.
//! - `ledger`: samples, pathways, penalties; `stats`: aggregates for status and metrics;
//!   `history`: the loss and merge history the dashboard plots.
//! - `epochs`: the loss summary of every epoch (finished epochs computed once).
//! - `eval`: the evaluation samples of each epoch's merged model (forward-only).
//! - `merge`: the merge cycle's state (uploads, plans, results, verdicts, checkpoints);
//!   `merge_status`: all of it for `/api/merge/status` in one read.
//! - `validation`: published weights, upload times, objects kept for validators, and the
//!   ledger queries validators ask for.

mod checkpoints;
mod db;
mod epochs;
mod eval;
mod history;
mod ledger;
mod merge;
mod merge_status;
mod phase;
mod policy;
mod registry;
pub use registry::Placement;
mod replay;
mod routing;
mod rows;
mod schema;
mod standing;
mod stats;
#[cfg(test)]
mod tests;
mod validation;

pub use db::Repository;
pub(crate) use db::off_async_workers;
pub use eval::{EVAL_ID_BASE, EVAL_SAMPLES_MAX, EvalSample, eval_id};
pub use history::{LossPoint, MergeRecord};
pub use merge::{
    CheckpointRow, PhaseInfo, PlanRow, ResultRow, SectionOutcome, UploadRow, UploadState,
};
pub use merge_status::{MergeStatusRows, SectionMergeRows};
pub use routing::MAX_ATTEMPTS;
pub use standing::{Standing, StandingDecision};
pub use stats::StatusSnapshot;
pub use validation::{AcceptedDetail, KeptObjects, PublishedRow, WorkCounts};
