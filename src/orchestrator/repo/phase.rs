//! The run's phase machine state: phase, epoch, next sample id and deadlines.

use rusqlite::{Connection, params};

use super::db::{Cached, Repository, to_i64, to_u64};
use super::ledger::drop_sample;
use super::merge::PhaseInfo;
use crate::api::Phase;
use crate::orchestrator::repo_types::RepoError;

fn phase_str(p: Phase) -> &'static str {
    match p {
        Phase::Training => "training",
        Phase::Uploading => "uploading",
        Phase::Merging => "merging",
    }
}

/// Training samples of epoch `?1` completed, and training samples active (any epoch). It runs
/// on every work request, so it reads the counters (`sample_counts`), not the ledger.
pub(super) const EPOCH_PROGRESS: &str = "SELECT \
     COALESCE((SELECT completed FROM sample_counts WHERE kind = 'train' AND epoch = ?1), 0), \
     COALESCE((SELECT SUM(active) FROM sample_counts WHERE kind = 'train'), 0)";

/// The run's state row, read on `conn` in one query: phase information and the next sample id.
pub(super) fn run_row_in(conn: &Connection) -> Result<(PhaseInfo, u64), RepoError> {
    let (phase, epoch, next, deadline, closed): (String, i64, i64, Option<i64>, Option<i64>) = conn
        .query_row_cached(
            "SELECT phase, epoch, next_sample, phase_deadline, upload_closed \
             FROM run_state WHERE id = 0",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )?;
    let phase = match phase.as_str() {
        "training" => Phase::Training,
        "uploading" => Phase::Uploading,
        "merging" => Phase::Merging,
        other => return Err(RepoError::Corrupt(format!("phase {other:?}"))),
    };
    let info = PhaseInfo {
        phase,
        epoch: to_u64(epoch),
        deadline_ms: deadline.map(to_u64),
        upload_closed_ms: closed.map(to_u64),
    };
    Ok((info, to_u64(next)))
}

/// Training samples of `epoch` completed, and training samples active (any epoch), read on
/// `conn`.
pub(super) fn epoch_progress_in(conn: &Connection, epoch: u64) -> Result<(u64, u64), RepoError> {
    let (done, active): (i64, i64) =
        conn.query_row_cached(EPOCH_PROGRESS, [to_i64(epoch)], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    Ok((to_u64(done), to_u64(active)))
}

impl Repository {
    /// Phase, epoch and next sample id.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`] or [`RepoError::Corrupt`].
    pub fn run_state(&self) -> Result<(Phase, u64, u64), RepoError> {
        let (info, next) = self.read_hot(run_row_in)?;
        Ok((info.phase, info.epoch, next))
    }

    /// Phase, epoch and deadlines.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`] or [`RepoError::Corrupt`].
    pub fn phase_info(&self) -> Result<PhaseInfo, RepoError> {
        Ok(self.read_hot(run_row_in)?.0)
    }

    /// Training samples of `epoch` completed, and training samples still active (any epoch).
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn epoch_progress(&self, epoch: u64) -> Result<(u64, u64), RepoError> {
        self.read_hot(|conn| epoch_progress_in(conn, epoch))
    }

    /// Synchronous optimizer steps (of `samples_per_step` sample ids each) that completed
    /// training samples of `epoch` fall in.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn epoch_steps(&self, epoch: u64, samples_per_step: u64) -> Result<u64, RepoError> {
        self.read(|conn| {
            let steps: i64 = conn.query_row_cached(
                "SELECT COUNT(DISTINCT id / ?2) FROM samples \
                 WHERE kind = 'train' AND outcome = 'completed' AND epoch = ?1",
                params![to_i64(epoch), to_i64(samples_per_step.max(1))],
                |r| r.get(0),
            )?;
            Ok(to_u64(steps))
        })
    }

    /// Ends training of `epoch`: every sample still under way is dropped with a recorded
    /// reason (its assignments cancelled), and the phase becomes `uploading` until
    /// `deadline_ms`. Returns the samples cancelled.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn begin_uploading(
        &self,
        epoch: u64,
        deadline_ms: u64,
        now_ms: u64,
    ) -> Result<u64, RepoError> {
        self.write(|tx| {
            let active: Vec<i64> = {
                let mut stmt =
                    tx.prepare_cached("SELECT id FROM samples WHERE outcome = 'active'")?;
                let rows = stmt.query_map([], |r| r.get(0))?;
                rows.collect::<Result<_, _>>()?
            };
            let reason = format!("cancelled: training of epoch {epoch} ended for the merge");
            for id in &active {
                drop_sample(tx, to_u64(*id), &reason, now_ms)?;
            }
            tx.execute_cached(
                "UPDATE run_state SET phase = 'uploading', phase_deadline = ?1, \
                 upload_closed = NULL WHERE id = 0",
                [to_i64(deadline_ms)],
            )?;
            Ok(active.len() as u64)
        })
    }

    /// Closes uploading: the phase becomes `merging` until `deadline_ms`.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn begin_merging(&self, deadline_ms: u64, now_ms: u64) -> Result<(), RepoError> {
        self.write(|tx| {
            tx.execute_cached(
                "UPDATE run_state SET phase = 'merging', phase_deadline = ?1, upload_closed = ?2 \
                 WHERE id = 0",
                params![to_i64(deadline_ms), to_i64(now_ms)],
            )?;
            Ok(())
        })
    }

    /// Ends the merge of `epoch`: training resumes in epoch `epoch + 1`.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn finish_merge(&self, epoch: u64) -> Result<(), RepoError> {
        self.write(|tx| {
            tx.execute_cached(
                "UPDATE run_state SET phase = ?1, epoch = ?2, phase_deadline = NULL, \
                 upload_closed = NULL WHERE id = 0 AND epoch = ?3",
                params![phase_str(Phase::Training), to_i64(epoch + 1), to_i64(epoch)],
            )?;
            Ok(())
        })
    }
}
