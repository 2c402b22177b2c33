//! The loss history the dashboard plots: completed samples in completion order.

use super::db::{Repository, to_i64, to_u64};
use crate::orchestrator::repo_types::RepoError;

/// One completed sample.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LossPoint {
    /// Sample id.
    pub sample: u64,
    /// Training epoch it belonged to.
    pub epoch: u64,
    /// When its backward reached the head (Unix ms).
    pub finished_ms: u64,
    /// Its loss.
    pub loss: f32,
}

impl Repository {
    /// The most recent `limit` completed samples with a loss, oldest first.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn loss_history(&self, limit: usize) -> Result<Vec<LossPoint>, RepoError> {
        let conn = self.lock();
        let mut stmt = conn.prepare(
            "SELECT id, epoch, finished_at, loss FROM samples \
             WHERE outcome = 'completed' AND loss IS NOT NULL AND finished_at IS NOT NULL \
             ORDER BY finished_at DESC, id DESC LIMIT ?1",
        )?;
        let rows = stmt.query_map([to_i64(limit as u64)], |r| {
            Ok(LossPoint {
                sample: to_u64(r.get(0)?),
                epoch: to_u64(r.get(1)?),
                finished_ms: to_u64(r.get(2)?),
                loss: r.get::<_, f64>(3)? as f32,
            })
        })?;
        let mut points = rows.collect::<Result<Vec<_>, _>>()?;
        points.reverse();
        Ok(points)
    }
}
