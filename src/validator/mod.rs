//! The validator: checks miners' work and turns it into published weights (`iota validate`).
//!
//! # Layout
//! - [`compare`]: replay comparison figures (magnitude ratio, cosine) and their thresholds.
//! - [`clasp`]: CLASP, each miner's effect on the loss from the ledger's pathways.
//! - [`copy`]: copy detection by the cosine of pseudo-gradients between uploads.
//! - [`score`]: the score formula (valid throughput x quality - penalties; 0 when flagged).
//! - [`weights`]: normalization into a weight vector with the run's burn share.
//! - [`replay`]: replaying a miner's recorded work and comparing what it uploaded.
//! - [`spot`]: how much of every miner's work a window replays, and what that catches.
//! - [`fetch`]: downloading work items and states through the orchestrator's URLs.
//! - [`merge_check`]: recomputing merged partitions from their sources.
//! - [`uploads`]: start states, uploads that did not train, copies between uploaders.
//! - [`quality`]: upload quality (held-out loss with a section replaced by an upload).
//! - [`tracking`]: secret, stable choices of what to check (miners, partitions, samples).
//! - [`window`]: one epoch's checks, scores and weight vector.
//! - [`history`]: the windows validated so far, on disk.
//! - [`runner`]: the loop of `iota validate`.
//! - [`onchain`]: the weights on the subnet, for runs on a chain (commit-reveal, rate limit).
//! - [`subnet_choice`]: the subnet a validator is set for, checked against the run's.
//! - [`chain`]: where weight vectors go ([`chain::WeightsChain`]; today only the local
//!   metagraph).

pub mod chain;
pub mod clasp;
pub mod compare;
pub mod copy;
pub mod fetch;
pub mod history;
pub mod merge_check;
pub mod onchain;
pub mod quality;
pub mod replay;
pub mod runner;
pub mod score;
pub mod spot;
pub mod subnet_choice;
pub mod tracking;
pub mod uploads;
pub mod weights;
pub mod window;

pub use clasp::{ClaspConfig, ClaspReport, LedgerEntry, MinerEffect, estimate};
pub use compare::{Comparison, Similarity, failure, similarity};
pub use copy::{CopyDetector, CopyFlag};
pub use runner::{ValidatorError, ValidatorOptions, ValidatorReport, run_validator};
pub use score::{PenaltyKind, PenaltyWeights, ScoreInput, ScoreParts, score};
pub use weights::{WeightVector, normalize};
