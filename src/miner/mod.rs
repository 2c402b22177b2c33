//! The miner: serves one section of the run's model for the orchestrator.
//!
//! A miner registers, builds its [`crate::model::Section`] from the run seed (or the weights
//! the orchestrator hands out), then loops: ask for work (backward first), download the input
//! through the assignment's URL, verify its hash, decode it, compute, upload the result,
//! submit it. Forward inputs are cached by sample id until their backward
//! ([`cache::InputCache`]); the optimizer steps every `local_steps` backwards.
//!
//! - [`adversary`]: hostile behaviours for tests (hidden `--adversary`).
//! - [`advice`]: what to do about each [`MinerError`] (one sentence for the operator).
//! - [`cache`]: the bounded forward-input cache.
//! - [`copier`]: the copier adversary's read access to other miners' uploads (tests only).
//! - [`engine`]: the compute without a network (forward, backward with weight stashing,
//!   local steps with the learning rate of the run's global progress, evaluation), which a
//!   validator can drive the same way to replay a miner's work.
//! - [`participant`]: the miner's share of a butterfly merge (read ranges, merge, upload).
//! - [`status_line`]: the run's phase and distance to the next merge, for the live status line.
//! - [`payload`]: blob decoding (token ids and wire tensors) and download checks.
//! - [`utilization`]: where the miner's wall time goes (compute against I/O and waiting).
//! - [`worker`]: the loop itself, generic over the burn backend.

pub mod adversary;
pub mod advice;
pub mod cache;
pub mod copier;
pub mod engine;
pub mod participant;
pub mod payload;
pub mod status_line;
pub mod utilization;
pub mod worker;

pub use cache::{CachedInput, InputCache};
pub use engine::{Engine, EngineError, EngineSettings};
pub use worker::{MinerError, MinerOptions, MinerReport, run_miner};
