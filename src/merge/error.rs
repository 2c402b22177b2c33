//! Typed errors of the merge module: one for merging values, one for building a plan.
//!
//! Every variant names what was wrong (which contributor, which index, which value) so that
//! the caller can flag the right miner or fix the right argument without reading logs.

use thiserror::Error;

/// Why a merge (an operator, the outer step or parsing a [`MergeOp`](super::MergeOp)) failed.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum MergeError {
    /// The operator was given no contributor vectors at all.
    #[error("no contributors to merge")]
    NoContributors,
    /// The weights slice does not have one weight per contributor.
    #[error("expected {expected} weights (one per contributor), got {got}")]
    WeightCount {
        /// Number of contributors.
        expected: usize,
        /// Number of weights given.
        got: usize,
    },
    /// A weight is negative, NaN or infinite.
    #[error("contributor {contributor} has invalid weight {weight} (must be finite and >= 0)")]
    InvalidWeight {
        /// Index of the contributor.
        contributor: usize,
        /// The offending weight.
        weight: f32,
    },
    /// Every weight is zero, so no contributor takes part in the merge.
    #[error("all weights are zero: nothing to merge")]
    ZeroTotalWeight,
    /// A contributor's length differs from the first contributor's (or from the plan's).
    #[error("contributor {contributor} has {got} values, expected {expected}")]
    LengthMismatch {
        /// Length every contributor must have.
        expected: usize,
        /// Length this contributor has.
        got: usize,
        /// Index of the contributor.
        contributor: usize,
    },
    /// A contributor holds NaN or an infinity.
    #[error("contributor {contributor} has a non-finite value at index {index}")]
    NonFinite {
        /// Index of the contributor.
        contributor: usize,
        /// First offending index found.
        index: usize,
    },
    /// The trimmed-mean fraction is outside `[0, 0.5)`.
    #[error("trim fraction {fraction} must be finite and in [0, 0.5)")]
    InvalidTrimFraction {
        /// The offending fraction.
        fraction: f32,
    },
    /// A merge operator name could not be parsed.
    #[error(
        "unknown merge operator {given:?}: expected mean, geometric, median, trimmed or trimmed:F"
    )]
    UnknownOp {
        /// The text that was given.
        given: String,
    },
    /// An outer-step hyper-parameter (learning rate, momentum) is out of range.
    #[error("outer step {name} = {value} is invalid ({reason})")]
    InvalidHyperparameter {
        /// Parameter name (`lr` or `momentum`).
        name: &'static str,
        /// The offending value.
        value: f32,
        /// What the valid range is.
        reason: &'static str,
    },
    /// A state buffer of the outer step (previous global values, momentum) has the wrong length.
    #[error("outer step buffer `{buffer}` has {got} values, expected {expected}")]
    StateLength {
        /// Which buffer (`merged` or `momentum`).
        buffer: &'static str,
        /// Length of `global_prev`.
        expected: usize,
        /// Length of this buffer.
        got: usize,
    },
    /// An outer-step input holds NaN or an infinity, or the step would produce one.
    #[error("outer step buffer `{buffer}` is non-finite at index {index}")]
    NonFiniteState {
        /// Which buffer (`global_prev`, `merged`, `momentum`, or `result` for an overflow).
        buffer: &'static str,
        /// First offending index found.
        index: usize,
    },
}

/// Why a butterfly [`MergePlan`](super::MergePlan) could not be built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PlanError {
    /// Nobody uploaded weights, so there is nobody to merge.
    #[error("no uploaders: a merge plan needs at least one")]
    NoUploaders,
    /// The same uploader id appears twice; the list must come from one source of truth.
    #[error("uploader {id:?} is listed more than once")]
    DuplicateUploader {
        /// The repeated id.
        id: String,
    },
    /// Zero partitions were asked for.
    #[error("the number of partitions must be at least 1")]
    ZeroPartitions,
    /// Zero replication was asked for.
    #[error("the replication factor must be at least 1")]
    ZeroReplication,
    /// The flat vector to partition is empty.
    #[error("the flat vector to partition is empty")]
    EmptyVector,
}
