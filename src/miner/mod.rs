//! The miner: serves one section of the run's model for the orchestrator.
//!
//! A miner registers, builds its [`crate::model::Section`] from the run seed (or the weights
//! the orchestrator hands out), then loops: ask for work (backward first), download the input
//! through the assignment's URL, verify its hash, decode it, compute, upload the result,
//! submit it. Forward inputs are cached by sample id until their backward
//! ([`cache::InputCache`]); the optimizer steps every `local_steps` backwards.
//!
//! - [`advice`]: what to do about each [`MinerError`] (one sentence for the operator).
//! - [`cache`]: the bounded forward-input cache.
//! - [`participant`]: the miner's share of a butterfly merge (read ranges, merge, upload).
//! - [`status_line`]: the run's phase and distance to the next merge, for the live status line.
//! - [`payload`]: blob decoding (token ids and wire tensors) and download checks.
//! - [`worker`]: the loop itself, generic over the burn backend.

pub mod advice;
pub mod cache;
pub mod participant;
pub mod payload;
pub mod status_line;
pub mod worker;

pub use cache::{CachedInput, InputCache};
pub use worker::{MinerError, MinerOptions, MinerReport, run_miner};
