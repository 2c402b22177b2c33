//! Shared ground below the roles: the compute a miner runs and a validator replays.
//!
//! Miners ([`crate::miner`]) drive an [`Engine`] with what they download; validators
//! ([`crate::validator`]) drive another one with the same inputs and order of work and must get
//! the same outputs, gradients and weights. Neither role imports the other: both import this.
//!
//! - [`cache`]: the bounded forward-input cache (inputs kept on the host until their backward).
//! - [`engine`]: the section compute without a network (forward, backward with weight
//!   stashing, local steps with the learning rate of the run's global progress, evaluation).
//! - [`payload`]: blob decoding (token ids and wire tensors) and download checks.

pub mod cache;
pub mod engine;
pub mod payload;

pub use cache::{CachedInput, InputCache};
pub use engine::{Engine, EngineError, EngineSettings};
