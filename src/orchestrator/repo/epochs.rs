//! The loss summary of every epoch (`/api/merge/status`, `iota merge --status`, `iota local`).
//!
//! An epoch whose training is over never changes again (every sample still under way was
//! dropped when it ended), so its summary is computed once from its own rows and kept in
//! memory; only the epoch in training is read again, a range of the `samples_progress` index
//! no longer than `batches_before_merging`. Mean losses and counts come from the counters.

use std::collections::BTreeMap;

use super::db::{Repository, to_i64, to_u64};
use crate::api::EpochSummary;
use crate::orchestrator::repo_types::RepoError;

impl Repository {
    /// Loss summary of every epoch that completed training samples or was evaluated, oldest
    /// first.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn epoch_summaries(&self) -> Result<Vec<EpochSummary>, RepoError> {
        let (_, current, _) = self.run_state()?;
        let trained: Vec<u64> = self.read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT epoch FROM sample_counts WHERE kind = 'train' AND loss_n > 0 \
                 ORDER BY epoch",
            )?;
            let rows = stmt.query_map([], |r| r.get::<_, i64>(0))?;
            rows.map(|r| Ok(to_u64(r?))).collect()
        })?;
        let mut out = Vec::with_capacity(trained.len() + 1);
        for epoch in trained {
            let cached = self.lock_epochs().get(&epoch).cloned();
            let summary = match cached {
                Some(s) => s,
                None => {
                    let s = self.summarise_epoch(epoch)?;
                    if epoch < current {
                        self.lock_epochs().insert(epoch, s);
                    }
                    s
                }
            };
            out.push(summary);
        }
        // The evaluation of the weights each epoch started with; the last one may belong to
        // an epoch without training (the run's final merge).
        for eval in self.eval_summaries()? {
            match out.iter_mut().find(|s| s.epoch == eval.epoch) {
                Some(summary) => summary.eval_loss = eval.eval_loss,
                None => out.push(EpochSummary {
                    epoch: eval.epoch,
                    completed: 0,
                    mean_loss: None,
                    first_loss: None,
                    last_loss: None,
                    eval_loss: eval.eval_loss,
                }),
            }
        }
        out.sort_by_key(|s| s.epoch);
        Ok(out)
    }

    /// The training loss summary of one epoch, from its completed samples in completion order.
    fn summarise_epoch(&self, epoch: u64) -> Result<EpochSummary, RepoError> {
        let losses: Vec<f64> = self.read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT loss FROM samples WHERE kind = 'train' AND outcome = 'completed' \
                 AND epoch = ?1 AND loss IS NOT NULL ORDER BY finished_at, id",
            )?;
            let rows = stmt.query_map([to_i64(epoch)], |r| r.get(0))?;
            Ok(rows.collect::<Result<_, _>>()?)
        })?;
        let quarter = losses.len().div_ceil(4).max(1);
        let mean =
            |v: &[f64]| (!v.is_empty()).then(|| (v.iter().sum::<f64>() / v.len() as f64) as f32);
        Ok(EpochSummary {
            epoch,
            completed: losses.len() as u64,
            mean_loss: mean(&losses),
            first_loss: mean(&losses[..quarter.min(losses.len())]),
            last_loss: mean(&losses[losses.len().saturating_sub(quarter)..]),
            eval_loss: None,
        })
    }

    fn lock_epochs(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, EpochSummary>> {
        self.epochs.lock().unwrap_or_else(|e| e.into_inner())
    }
}
