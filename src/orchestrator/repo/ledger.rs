//! The ledger: samples, their pathways and assignments, penalties, and the two writes every
//! failure goes through ([`penalise`], [`drop_sample`]).

use rusqlite::{Connection, OptionalExtension, params};

use super::db::{Cached, Repository, to_i64, to_u64, usize_of};
use super::eval::{EVAL_ID_BASE, eval_id};
use super::rows::{ASSIGNMENT_COLUMNS, get_assignment, read_assignment};
use super::standing::{Standing, strike};
use crate::orchestrator::repo_types::*;

impl Repository {
    /// One assignment by id.
    ///
    /// # Errors
    /// [`RepoError::UnknownAssignment`].
    pub fn assignment(&self, id: u64, tail: usize) -> Result<AssignmentRow, RepoError> {
        self.read(|conn| get_assignment(conn, id, tail))
    }

    /// Every assignment of `sample`, oldest first.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`] or [`RepoError::Corrupt`].
    pub fn assignments_of(
        &self,
        sample: u64,
        tail: usize,
    ) -> Result<Vec<AssignmentRow>, RepoError> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {ASSIGNMENT_COLUMNS} FROM assignments a JOIN samples s ON s.id = a.sample \
                 WHERE a.sample = ?1 ORDER BY a.id"
            ))?;
            let rows = stmt.query_map([to_i64(sample)], read_assignment)?;
            rows.map(|r| r?.finish(Some(tail))).collect()
        })
    }

    /// One sample of the ledger.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`] or [`RepoError::Corrupt`].
    pub fn sample(&self, id: u64) -> Result<Option<SampleRow>, RepoError> {
        self.read(|conn| {
            let raw = conn
                .query_row_cached(
                    "SELECT id, epoch, outcome, reason, loss, started_at, finished_at FROM samples \
                     WHERE id = ?1",
                    [to_i64(id)],
                    |r| {
                        Ok((
                            r.get::<_, i64>(0)?,
                            r.get::<_, i64>(1)?,
                            r.get::<_, String>(2)?,
                            r.get::<_, Option<String>>(3)?,
                            r.get::<_, Option<f64>>(4)?,
                            r.get::<_, i64>(5)?,
                            r.get::<_, Option<i64>>(6)?,
                        ))
                    },
                )
                .optional()?;
            raw.map(|(id, epoch, outcome, reason, loss, started, finished)| {
                Ok(SampleRow {
                    id: to_u64(id),
                    epoch: to_u64(epoch),
                    outcome: SampleOutcome::parse(&outcome)?,
                    reason,
                    loss: loss.map(|l| l as f32),
                    started_ms: to_u64(started),
                    finished_ms: finished.map(to_u64),
                })
            })
            .transpose()
        })
    }

    /// The miners that ran each section's forward of `sample`, by section.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn pathway(&self, sample: u64) -> Result<Vec<(usize, String)>, RepoError> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT section, miner FROM pathway WHERE sample = ?1 ORDER BY section",
            )?;
            let rows = stmt.query_map([to_i64(sample)], |r| {
                Ok((usize_of(r.get(0)?), r.get::<_, String>(1)?))
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
    }
}

/// Records a penalty against `hotkey`, for an assignment or (`None`) for its part in a merge.
pub(super) fn penalise(
    tx: &Connection,
    policy: &Standing,
    hotkey: &str,
    assignment: Option<u64>,
    reason: &str,
    now_ms: u64,
) -> Result<(), RepoError> {
    tx.execute_cached(
        "UPDATE miners SET penalties = penalties + 1 WHERE hotkey = ?1",
        [hotkey],
    )?;
    tx.execute_cached(
        "INSERT INTO penalties (miner, at, assignment, reason) VALUES (?1, ?2, ?3, ?4)",
        params![hotkey, to_i64(now_ms), assignment.map(to_i64), reason],
    )?;
    strike(tx, policy, hotkey, assignment, reason, now_ms)
}

pub(super) fn drop_sample(
    tx: &Connection,
    sample: u64,
    reason: &str,
    now_ms: u64,
) -> Result<(), RepoError> {
    tx.execute_cached(
        "UPDATE samples SET outcome = 'dropped', reason = ?2, finished_at = ?3 \
         WHERE id = ?1 AND outcome = 'active'",
        params![to_i64(sample), reason, to_i64(now_ms)],
    )?;
    tx.execute_cached(
        "UPDATE assignments SET state = 'cancelled', reason = ?2, finished_at = ?3 \
         WHERE sample = ?1 AND state IN ('open', 'assigned')",
        params![
            to_i64(sample),
            format!("sample dropped: {reason}"),
            to_i64(now_ms)
        ],
    )?;
    Ok(())
}

impl Repository {
    /// Deletes the routing detail (assignments and pathways) of every sample of the epochs up
    /// to `last_epoch`, training and evaluation alike; returns the rows deleted. The samples
    /// themselves (outcome, reason, loss), the per-epoch counters and the miners' totals stay,
    /// so every sample id is still accounted for. Sample ids grow with the epochs, so each
    /// delete is a range of a primary key or of the `assignments_sample` index.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn prune_routing(&self, last_epoch: u64) -> Result<u64, RepoError> {
        let next_epoch = to_i64(last_epoch.saturating_add(1));
        self.write(|tx| {
            let train_bound: i64 = tx.query_row_cached(
                "SELECT COALESCE((SELECT MIN(id) FROM samples WHERE kind = 'train' \
                 AND epoch >= ?1), (SELECT next_sample FROM run_state WHERE id = 0))",
                [next_epoch],
                |r| r.get(0),
            )?;
            let eval_from = to_i64(EVAL_ID_BASE);
            let eval_bound = to_i64(eval_id(last_epoch.saturating_add(1), 0));
            let mut deleted = 0;
            for table in ["assignments", "pathway"] {
                deleted += tx.execute_cached(
                    &format!(
                        "DELETE FROM {table} WHERE sample < ?1 OR (sample >= ?2 AND sample < ?3)"
                    ),
                    params![train_bound, eval_from, eval_bound],
                )?;
            }
            Ok(deleted as u64)
        })
    }
}
