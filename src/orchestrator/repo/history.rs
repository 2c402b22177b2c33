//! What the dashboard plots over time: the training loss of completed samples in completion
//! order (evaluation samples left out), and the verdicts and flags of finished merges.

use super::db::{Cached, Repository, to_i64, to_u64};
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
    /// The most recent `limit` completed training samples with a loss, oldest first.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn loss_history(&self, limit: usize) -> Result<Vec<LossPoint>, RepoError> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT id, epoch, finished_at, loss FROM samples \
                 WHERE outcome = 'completed' AND kind = 'train' AND loss IS NOT NULL \
                 AND finished_at IS NOT NULL \
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
        })
    }
}

/// One finished section merge, for the dashboard's merge history.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MergeRecord {
    /// The epoch whose end it merged.
    pub epoch: u64,
    /// Section.
    pub section: usize,
    /// Partitions whose copies agreed (a majority of the mergers).
    pub agreed: u64,
    /// Partitions with one copy that the orchestrator's recomputation confirmed.
    pub single: u64,
    /// Partitions the orchestrator recomputed itself.
    pub recomputed: u64,
    /// Partitions that kept the previous global values.
    pub fallback: u64,
    /// `(merger, partition, reason)` of every flagged merger.
    pub flags: Vec<(String, usize, String)>,
}

impl Repository {
    /// The finished section merges of the last `epochs` epochs, oldest first.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn merge_history(&self, epochs: u64) -> Result<Vec<MergeRecord>, RepoError> {
        self.read(|conn| {
            let first: i64 = conn.query_row_cached(
                "SELECT COALESCE(MAX(epoch), 0) FROM partition_outcomes",
                [],
                |r| r.get(0),
            )?;
            let first = (first - to_i64(epochs) + 1).max(0);
            let mut records: Vec<MergeRecord> = Vec::new();
            let mut stmt = conn.prepare_cached(
                "SELECT epoch, section, verdict FROM partition_outcomes WHERE epoch >= ?1 \
                 ORDER BY epoch, section, partition",
            )?;
            let rows = stmt.query_map([first], |r| {
                Ok((
                    to_u64(r.get(0)?),
                    to_u64(r.get(1)?) as usize,
                    r.get::<_, String>(2)?,
                ))
            })?;
            for row in rows {
                let (epoch, section, verdict) = row?;
                if records
                    .last()
                    .is_none_or(|m| (m.epoch, m.section) != (epoch, section))
                {
                    records.push(MergeRecord {
                        epoch,
                        section,
                        agreed: 0,
                        single: 0,
                        recomputed: 0,
                        fallback: 0,
                        flags: Vec::new(),
                    });
                }
                if let Some(record) = records.last_mut() {
                    match verdict.split(' ').next().unwrap_or_default() {
                        "agreed" => record.agreed += 1,
                        "single" => record.single += 1,
                        "fallback" => record.fallback += 1,
                        _ => record.recomputed += 1,
                    }
                }
            }
            let mut stmt = conn.prepare_cached(
                "SELECT epoch, section, merger, partition, reason FROM merge_flags WHERE epoch >= ?1 \
                 ORDER BY epoch, section, partition, merger",
            )?;
            let rows = stmt.query_map([first], |r| {
                Ok((
                    to_u64(r.get(0)?),
                    to_u64(r.get(1)?) as usize,
                    r.get::<_, String>(2)?,
                    to_u64(r.get(3)?) as usize,
                    r.get::<_, String>(4)?,
                ))
            })?;
            for row in rows {
                let (epoch, section, merger, partition, reason) = row?;
                if let Some(record) = records
                    .iter_mut()
                    .find(|m| (m.epoch, m.section) == (epoch, section))
                {
                    record.flags.push((merger, partition, reason));
                }
            }
            Ok(records)
        })
    }
}
