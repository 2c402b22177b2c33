//! [`Phase`]: where the run is in its training / uploading / merging cycle.

use serde::{Deserialize, Serialize};

/// Phase of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Miners process forward and backward work.
    Training,
    /// Miners upload weights for the merge.
    Uploading,
    /// Miners merge their partitions.
    Merging,
}
