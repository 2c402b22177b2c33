//! The miner: serves one section of the run's model for the orchestrator.
//!
//! A miner registers, builds its [`crate::model::Section`] from the run seed (or the weights
//! the orchestrator hands out), then loops: ask for work (backward first), download the input
//! through the assignment's URL, verify its hash, decode it, compute, upload the result,
//! submit it. Forward inputs are cached by sample id until their backward
//! ([`crate::compute::InputCache`]); the optimizer steps every `local_steps` backwards. The
//! compute itself ([`crate::compute::engine`]) and the payload checks are shared ground, which
//! validators replay too.
//!
//! - [`adversary`]: hostile behaviours for tests (hidden `--adversary`); only with the
//!   `adversary` feature, otherwise an empty stand-in (`no_adversary.rs`).
//! - [`advice`]: what to do about each [`MinerError`] (one sentence for the operator).
//! - `copier`: the copier adversary's read access to other miners' uploads (tests only; with
//!   the `adversary` feature).
//! - [`participant`]: the miner's share of a butterfly merge (read ranges, merge, upload).
//! - [`status_line`]: the run's phase and distance to the next merge, for the live status line.
//! - [`utilization`]: where the miner's wall time goes (compute against I/O and waiting).
//! - [`worker`]: the loop itself, generic over the burn backend.

#[cfg(feature = "adversary")]
pub mod adversary;
/// The hostile behaviours' empty stand-in: the release build has none.
#[cfg(not(feature = "adversary"))]
#[path = "no_adversary.rs"]
pub mod adversary;
pub mod advice;
#[cfg(feature = "adversary")]
pub mod copier;
pub mod participant;
pub mod status_line;
pub mod utilization;
pub mod worker;

pub use worker::{MinerError, MinerOptions, MinerReport, run_miner};
