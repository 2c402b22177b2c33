//! [`CycleError`]: why a step of the merge cycle failed.

use thiserror::Error;

use super::repo_types::RepoError;
use crate::merge::{MergeError, PlanError};
use crate::model::ModelError;
use crate::storage::{KeyError, StorageError};

/// Why a step of the phase machine failed (it is retried at the next tick).
#[derive(Debug, Error)]
pub enum CycleError {
    /// The state store.
    #[error(transparent)]
    Repo(#[from] RepoError),
    /// Object storage.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A key could not be built.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The plan could not be built.
    #[error("merge plan: {0}")]
    Plan(#[from] PlanError),
    /// Merging (recomputation or the outer step) failed.
    #[error("merge: {0}")]
    Merge(#[from] MergeError),
    /// The section layout.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A stored object does not hold what the state store says.
    #[error("stored object {key}: {reason}")]
    BadObject {
        /// The object.
        key: String,
        /// What is wrong.
        reason: String,
    },
}
