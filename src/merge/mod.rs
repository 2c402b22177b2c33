//! Butterfly merge over flat `f32` buffers: operators, partition plan, verification.
//!
//! After a training epoch every miner of a section uploads its flat parameter vector. The
//! vector is cut into partitions ([`MergePlan`]); each partition is merged by `r` miners with
//! one [`MergeOp`], the `r` copies are cross-checked ([`verify_partition`]), and everyone
//! downloads the accepted result. This module is pure computation on slices and names: it
//! knows nothing of burn, HTTP or storage, so it can be tested (and reused) on its own.
//!
//! # Layout
//! - `error`: [`MergeError`], [`PlanError`].
//! - `mean`, `geometric`, `median`, `trimmed`: the merge operators, one per file.
//! - `outer`: the optional DiLoCo-style Nesterov outer step ([`nesterov_outer_step`]).
//! - `op`: [`MergeOp`], the operator selected by config or command line.
//! - [`FlatLayout`] (re-exported from [`crate::codec::flat`]): the flat vector a section's state
//!   travels as.
//! - `driver`: [`merge_partition`] and [`merge_with_plan`].
//! - `plan` (with `shuffle`): the seeded butterfly partition plan and traffic estimate.
//! - `verify`: comparing redundant copies and flagging mergers.
//!
//! # Example
//! ```
//! use iota::merge::{merge_partition, MergeOp};
//!
//! let a = [1.0f32, 4.0];
//! let b = [3.0f32, 0.0];
//! let merged = merge_partition(MergeOp::Mean, &[&a, &b], &[1.0, 1.0]).unwrap();
//! assert_eq!(merged, vec![2.0, 2.0]);
//! ```

mod driver;
mod error;
mod geometric;
mod inputs;
mod mean;
mod median;
mod op;
mod outer;
mod plan;
mod shuffle;
mod trimmed;
mod verify;

pub use crate::codec::flat::{
    FlatLayout, FlatParts, FlatTensor, LayoutError, f32_from_le_bytes, f32_to_le_bytes,
};
pub use driver::{merge_partition, merge_with_plan};
pub use error::{MergeError, PlanError};
pub use geometric::sign_aware_geometric_mean;
pub use mean::weighted_mean;
pub use median::coordinate_median;
pub use op::{DEFAULT_TRIM_FRACTION, MergeOp};
pub use outer::{OuterStep, nesterov_outer_step};
pub use plan::{
    DEFAULT_REPLICATION, MergePlan, Partition, PlanSpec, Traffic, partition_count,
    traffic_per_miner,
};
pub use shuffle::SeededStream;
pub use trimmed::{trim_count, trimmed_mean, validate_trim_fraction};
pub use verify::{
    Flag, FlagReason, MergedCopy, Tolerance, Verdict, Verification, judge_against_recomputed,
    values_agree, values_hash, verify_partition,
};
