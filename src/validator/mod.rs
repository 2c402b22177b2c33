//! The validator: checks miners' work and turns it into published weights (`iota validate`).
//!
//! # Layout
//! - [`compare`]: replay comparison figures (magnitude ratio, cosine) and their thresholds.
//! - [`clasp`]: CLASP, each miner's effect on the loss from the ledger's pathways.
//! - [`copy`]: copy detection by the cosine of pseudo-gradients between uploads.
//! - [`score`]: the score formula (valid throughput x quality - penalties; 0 when flagged).
//! - [`weights`]: normalization into a weight vector with the run's burn share.
//! - [`replay`]: replaying a miner's recorded work and comparing what it uploaded.
//! - [`fetch`]: downloading work items and states through the orchestrator's URLs.

pub mod clasp;
pub mod compare;
pub mod copy;
pub mod fetch;
pub mod replay;
pub mod score;
pub mod weights;

pub use clasp::{ClaspConfig, ClaspReport, LedgerEntry, MinerEffect, estimate};
pub use compare::{Comparison, Similarity, failure, similarity};
pub use copy::{CopyDetector, CopyFlag};
pub use score::{PenaltyKind, PenaltyWeights, ScoreInput, ScoreParts, score};
pub use weights::{WeightVector, normalize};
