//! Evaluation samples: at the start of every epoch the weights it starts with (the merged
//! model; the initial weights at epoch 0) are evaluated on held-out windows through the
//! network itself, forward-only, routed like training forwards (any miner of a section takes
//! the next open one), with the loss recorded at the tail. They live in the ledger as samples
//! of kind `eval` with ids from [`EVAL_ID_BASE`] up, so training sample ids stay consecutive
//! (they are the data order and the learning-rate schedule's clock).

use rusqlite::{Connection, params};

use super::db::{Cached, Repository, to_i64, to_u64};
use crate::api::EvalSummary;
use crate::orchestrator::repo_types::RepoError;

/// First id of evaluation samples (far above any training sample id).
pub const EVAL_ID_BASE: u64 = 1 << 48;
/// Most evaluation samples per epoch.
pub const EVAL_SAMPLES_MAX: u64 = 1 << 16;

/// Id of evaluation sample `unit` of `epoch`.
pub fn eval_id(epoch: u64, unit: u64) -> u64 {
    EVAL_ID_BASE + epoch * EVAL_SAMPLES_MAX + unit
}

/// An evaluation sample whose tokens and targets are stored.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalSample {
    /// Its id ([`eval_id`]).
    pub id: u64,
    /// Hash of its token ids object.
    pub tokens_hash: String,
    /// Hash of its targets object.
    pub targets_hash: String,
}

impl Repository {
    /// Whether the evaluation samples of `epoch` were started.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn evals_started(&self, epoch: u64) -> Result<bool, RepoError> {
        self.read_hot(|conn| evals_started_in(conn, epoch))
    }

    /// Starts the evaluation samples of `epoch` (once: nothing happens when some exist): a
    /// ledger row each and an open evaluation of the head section, which any head miner may
    /// take. Returns how many were started.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn start_evals(
        &self,
        epoch: u64,
        samples: &[EvalSample],
        now_ms: u64,
    ) -> Result<u64, RepoError> {
        self.write(|tx| {
            let exists = tx
                .prepare_cached("SELECT 1 FROM samples WHERE kind = 'eval' AND epoch = ?1 LIMIT 1")?
                .exists([to_i64(epoch)])?;
            if exists {
                return Ok(0);
            }
            for s in samples {
                tx.execute_cached(
                    "INSERT INTO samples (id, epoch, outcome, tokens_hash, targets_hash, \
                     started_at, kind) VALUES (?1, ?2, 'active', ?3, ?4, ?5, 'eval')",
                    params![
                        to_i64(s.id),
                        to_i64(epoch),
                        s.tokens_hash,
                        s.targets_hash,
                        to_i64(now_ms)
                    ],
                )?;
                tx.execute_cached(
                    "INSERT INTO assignments (sample, epoch, section, kind, state, input_hash, \
                     created_at) VALUES (?1, ?2, 0, 'eval', 'open', ?3, ?4)",
                    params![to_i64(s.id), to_i64(epoch), s.tokens_hash, to_i64(now_ms)],
                )?;
            }
            Ok(samples.len() as u64)
        })
    }

    /// Evaluation samples of the current epoch still under way (from the counters).
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn evals_active(&self, epoch: u64) -> Result<u64, RepoError> {
        self.read(|conn| evals_active_in(conn, epoch))
    }

    /// The evaluation of every epoch that has one, oldest first. An epoch's loss is the mean
    /// over its completed evaluation samples, reported once none is under way. Read from the
    /// counters: a few rows per epoch, whatever the size of the ledger.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn eval_summaries(&self) -> Result<Vec<EvalSummary>, RepoError> {
        self.read(eval_summaries_in)
    }
}

/// Whether the evaluation samples of `epoch` were started, read on `conn`.
pub(super) fn evals_started_in(conn: &Connection, epoch: u64) -> Result<bool, RepoError> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM samples WHERE kind = 'eval' AND epoch = ?1 LIMIT 1")?
        .exists([to_i64(epoch)])?)
}

/// Evaluation samples of `epoch` still under way (from the counters), read on `conn`.
pub(super) fn evals_active_in(conn: &Connection, epoch: u64) -> Result<u64, RepoError> {
    let n: i64 = conn.query_row_cached(
        "SELECT COALESCE((SELECT active FROM sample_counts WHERE kind = 'eval' \
         AND epoch = ?1), 0)",
        [to_i64(epoch)],
        |r| r.get(0),
    )?;
    Ok(to_u64(n))
}

/// Every epoch's evaluation, oldest first (see [`Repository::eval_summaries`]), read on `conn`.
pub(super) fn eval_summaries_in(conn: &Connection) -> Result<Vec<EvalSummary>, RepoError> {
    let mut stmt = conn.prepare_cached(
        "SELECT e.epoch, e.active + e.completed + e.dropped, e.completed, e.active, \
         CASE WHEN e.loss_n > 0 THEN e.loss_sum / e.loss_n END, \
         COALESCE((SELECT SUM(t.completed) FROM sample_counts t WHERE t.kind = 'train' \
          AND t.epoch < e.epoch), 0) \
         FROM sample_counts e WHERE e.kind = 'eval' ORDER BY e.epoch",
    )?;
    let rows = stmt.query_map([], |r| {
        let active: i64 = r.get(3)?;
        let mean: Option<f64> = r.get(4)?;
        Ok(EvalSummary {
            epoch: to_u64(r.get(0)?),
            samples: to_u64(r.get(1)?),
            completed: to_u64(r.get(2)?),
            eval_loss: if active == 0 {
                mean.map(|m| m as f32)
            } else {
                None
            },
            trained_samples: to_u64(r.get(5)?),
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}
