//! Aggregates for the status page and metrics.

use rusqlite::Connection;

use super::db::{Cached, Repository, to_i64, to_u64};
use super::eval::{eval_summaries_in, evals_active_in, evals_started_in};
use super::merge::PhaseInfo;
use super::phase::{epoch_progress_in, run_row_in};
use super::registry::miners_in;
use crate::api::EvalSummary;
use crate::orchestrator::repo_types::{LedgerCounts, MinerRow, RepoError};

/// Mean loss of the last `?1` completed training samples: the newest rows of the
/// `samples_finished` index, not a sort of the ledger (status and metrics, unauthenticated).
pub(super) const RECENT_LOSS: &str = "SELECT AVG(loss) FROM (SELECT loss FROM samples \
     WHERE kind = 'train' AND outcome = 'completed' AND loss IS NOT NULL \
     ORDER BY finished_at DESC, id DESC LIMIT ?1)";

/// Training samples completed at or after `?1` (a range of `samples_finished`).
pub(super) const COMPLETED_SINCE: &str = "SELECT COUNT(*) FROM samples \
     WHERE kind = 'train' AND outcome = 'completed' AND finished_at >= ?1";

/// One consistent read of everything the status document needs
/// ([`Repository::status_snapshot`]).
#[derive(Debug, Clone)]
pub struct StatusSnapshot {
    /// Phase, epoch and deadlines.
    pub phase: PhaseInfo,
    /// The next sample id to start.
    pub next_sample: u64,
    /// Every registered miner, by section then registration time.
    pub miners: Vec<MinerRow>,
    /// Training sample counts.
    pub counts: LedgerCounts,
    /// Mean loss of the last `recent` completed training samples.
    pub recent_loss: Option<f32>,
    /// Training samples completed since the given time.
    pub completed_since: u64,
    /// Every epoch's evaluation, oldest first.
    pub evals: Vec<EvalSummary>,
    /// Training samples of the current epoch completed, and training samples active.
    pub epoch_progress: (u64, u64),
    /// Whether the current epoch's evaluation samples were started, and how many are under way.
    pub epoch_evals: (bool, u64),
}

fn counts_in(conn: &Connection) -> Result<LedgerCounts, RepoError> {
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
}

fn recent_in(conn: &Connection, n: usize, since_ms: u64) -> Result<(Option<f32>, u64), RepoError> {
    let mean: Option<f64> = conn.query_row_cached(RECENT_LOSS, [to_i64(n as u64)], |r| r.get(0))?;
    let done: i64 = conn.query_row_cached(COMPLETED_SINCE, [to_i64(since_ms)], |r| r.get(0))?;
    Ok((mean.map(|m| m as f32), to_u64(done)))
}

impl Repository {
    /// Completed, dropped and active training sample counts (evaluation samples apart), from
    /// the counters.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn counts(&self) -> Result<LedgerCounts, RepoError> {
        self.read(counts_in)
    }

    /// Mean loss of the last `n` completed training samples, and how many completed at or
    /// after `since_ms`.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn recent(&self, n: usize, since_ms: u64) -> Result<(Option<f32>, u64), RepoError> {
        self.read(|conn| recent_in(conn, n, since_ms))
    }

    /// Everything `/api/status` and `/metrics` show, read under one hold of the connection:
    /// one wait behind the miners' requests instead of one per query, and counts that agree
    /// with the phase they are shown with. `recent` and `since_ms` as in [`Self::recent`].
    ///
    /// # Errors
    /// [`RepoError::Sqlite`] or [`RepoError::Corrupt`].
    pub fn status_snapshot(
        &self,
        recent: usize,
        since_ms: u64,
    ) -> Result<StatusSnapshot, RepoError> {
        self.read(|conn| {
            let (phase, next_sample) = run_row_in(conn)?;
            let (recent_loss, completed_since) = recent_in(conn, recent, since_ms)?;
            Ok(StatusSnapshot {
                next_sample,
                miners: miners_in(conn)?,
                counts: counts_in(conn)?,
                recent_loss,
                completed_since,
                evals: eval_summaries_in(conn)?,
                epoch_progress: epoch_progress_in(conn, phase.epoch)?,
                epoch_evals: (
                    evals_started_in(conn, phase.epoch)?,
                    evals_active_in(conn, phase.epoch)?,
                ),
                phase,
            })
        })
    }
}
