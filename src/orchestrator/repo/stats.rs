//! Aggregates for the status page and metrics.

use super::db::{Cached, Repository, to_i64, to_u64};
use crate::orchestrator::repo_types::{LedgerCounts, RepoError};

/// Mean loss of the last `?1` completed training samples: the newest rows of the
/// `samples_finished` index, not a sort of the ledger (status and metrics, unauthenticated).
pub(super) const RECENT_LOSS: &str = "SELECT AVG(loss) FROM (SELECT loss FROM samples \
     WHERE kind = 'train' AND outcome = 'completed' AND loss IS NOT NULL \
     ORDER BY finished_at DESC, id DESC LIMIT ?1)";

/// Training samples completed at or after `?1` (a range of `samples_finished`).
pub(super) const COMPLETED_SINCE: &str = "SELECT COUNT(*) FROM samples \
     WHERE kind = 'train' AND outcome = 'completed' AND finished_at >= ?1";

impl Repository {
    /// Completed, dropped and active training sample counts (evaluation samples apart), from
    /// the counters.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn counts(&self) -> Result<LedgerCounts, RepoError> {
        self.read(|conn| {
            let (active, completed, dropped): (i64, i64, i64) = conn.query_row_cached(
                "SELECT COALESCE(SUM(active), 0), COALESCE(SUM(completed), 0), \
                 COALESCE(SUM(dropped), 0) FROM sample_counts WHERE kind = 'train'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?;
            Ok(LedgerCounts {
                completed: to_u64(completed),
                dropped: to_u64(dropped),
                active: to_u64(active),
            })
        })
    }

    /// Mean loss of the last `n` completed training samples, and how many completed at or
    /// after `since_ms`.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn recent(&self, n: usize, since_ms: u64) -> Result<(Option<f32>, u64), RepoError> {
        self.read(|conn| {
            let mean: Option<f64> =
                conn.query_row_cached(RECENT_LOSS, [to_i64(n as u64)], |r| r.get(0))?;
            let done: i64 =
                conn.query_row_cached(COMPLETED_SINCE, [to_i64(since_ms)], |r| r.get(0))?;
            Ok((mean.map(|m| m as f32), to_u64(done)))
        })
    }
}
