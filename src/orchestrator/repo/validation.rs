//! Durable state of validation: published weight vectors (with the signature that came with
//! them), when each merge upload was accepted, and the objects kept for validators. Also the
//! read-only ledger queries validators ask for. Every change is one transaction.

use rusqlite::{OptionalExtension, params};

use super::db::{Cached, Repository, to_i64, to_u64, usize_of};
use super::merge::{CheckpointRow, start_checkpoint_in};
use crate::api::{LedgerSample, WorkKind};
use crate::orchestrator::repo_types::RepoError;

/// A stored weight vector: the signed body exactly as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedRow {
    /// The validator.
    pub validator: String,
    /// Epoch of the window.
    pub epoch: u64,
    /// When it was received.
    pub received_ms: u64,
    /// The JSON body the validator signed.
    pub body: String,
    /// Its signature (hex).
    pub signature: String,
    /// The signature's timestamp.
    pub signed_ms: u64,
}

/// Counts of one miner's assignments in one epoch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkCounts {
    /// Section (of its registration).
    pub section: usize,
    /// Accepted results.
    pub accepted: u64,
    /// Accepted results on completed samples.
    pub completed_work: u64,
    /// Of those, forwards (the tail's forward includes its backward).
    pub completed_forwards: u64,
    /// Missed deadlines.
    pub missed: u64,
    /// Refused results.
    pub refused: u64,
}

/// An epoch's objects kept for validators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptObjects {
    /// Key prefix to delete once validators are done.
    pub prefix: String,
    /// Epoch the objects belong to (validators are done when they published for it).
    pub epoch: u64,
    /// When they could have been deleted had no validator needed them.
    pub eligible_ms: u64,
}

impl Repository {
    /// Records a weight vector (a validator republishing an epoch replaces its earlier one).
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn save_weights(&self, row: &PublishedRow) -> Result<(), RepoError> {
        self.write(|tx| {
            tx.execute_cached(
                "INSERT OR REPLACE INTO published_weights (validator, epoch, received_at, body, \
                 signature, signed_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    row.validator,
                    to_i64(row.epoch),
                    to_i64(row.received_ms),
                    row.body,
                    row.signature,
                    to_i64(row.signed_ms)
                ],
            )?;
            Ok(())
        })
    }

    /// The latest vector of each validator, by validator.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn latest_weights(&self) -> Result<Vec<PublishedRow>, RepoError> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT p.validator, p.epoch, p.received_at, p.body, p.signature, p.signed_at \
                 FROM published_weights p WHERE p.epoch = (SELECT MAX(q.epoch) FROM \
                 published_weights q WHERE q.validator = p.validator) ORDER BY p.validator",
            )?;
            let rows = stmt.query_map([], published_row)?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
    }

    /// Every validator's vector for `epoch`, by validator.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn weights_of_epoch(&self, epoch: u64) -> Result<Vec<PublishedRow>, RepoError> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT validator, epoch, received_at, body, signature, signed_at \
                 FROM published_weights WHERE epoch = ?1 ORDER BY validator",
            )?;
            let rows = stmt.query_map([to_i64(epoch)], published_row)?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
    }

    /// The latest epoch `validator` published weights for.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn published_epoch(&self, validator: &str) -> Result<Option<u64>, RepoError> {
        self.read(|conn| {
            let e: Option<i64> = conn.query_row_cached(
                "SELECT MAX(epoch) FROM published_weights WHERE validator = ?1",
                [validator],
                |r| r.get(0),
            )?;
            Ok(e.map(to_u64))
        })
    }

    /// Records when `miner`'s upload for the merge of `epoch` was accepted.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn record_upload_time(
        &self,
        epoch: u64,
        miner: &str,
        now_ms: u64,
    ) -> Result<(), RepoError> {
        self.write(|tx| {
            tx.execute_cached(
                "INSERT OR REPLACE INTO upload_times (epoch, miner, accepted_at) VALUES (?1, ?2, ?3)",
                params![to_i64(epoch), miner, to_i64(now_ms)],
            )?;
            Ok(())
        })
    }

    /// When `miner`'s upload for the merge of `epoch` was accepted.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn upload_time(&self, epoch: u64, miner: &str) -> Result<Option<u64>, RepoError> {
        self.read(|conn| {
            let at: Option<i64> = conn
                .query_row_cached(
                    "SELECT accepted_at FROM upload_times WHERE epoch = ?1 AND miner = ?2",
                    params![to_i64(epoch), miner],
                    |r| r.get(0),
                )
                .optional()?;
            Ok(at.map(to_u64))
        })
    }

    /// Keeps the objects under `prefix` (of `epoch`) until validators are done with the epoch.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn keep_objects(&self, prefix: &str, epoch: u64, now_ms: u64) -> Result<(), RepoError> {
        self.write(|tx| {
            tx.execute_cached(
                "INSERT OR IGNORE INTO kept_objects (prefix, epoch, eligible_at) VALUES (?1, ?2, ?3)",
                params![prefix, to_i64(epoch), to_i64(now_ms)],
            )?;
            Ok(())
        })
    }

    /// Every prefix kept for validators, oldest first.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn kept_objects(&self) -> Result<Vec<KeptObjects>, RepoError> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT prefix, epoch, eligible_at FROM kept_objects ORDER BY eligible_at",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok(KeptObjects {
                    prefix: r.get(0)?,
                    epoch: to_u64(r.get(1)?),
                    eligible_ms: to_u64(r.get(2)?),
                })
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
    }

    /// Forgets a kept prefix (its objects were deleted).
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn release_objects(&self, prefix: &str) -> Result<(), RepoError> {
        self.write(|tx| {
            tx.execute_cached("DELETE FROM kept_objects WHERE prefix = ?1", [prefix])?;
            Ok(())
        })
    }

    /// The merged state `section` started `epoch` from: the latest checkpoint at or before it.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn start_checkpoint(
        &self,
        section: usize,
        epoch: u64,
    ) -> Result<Option<CheckpointRow>, RepoError> {
        self.read(|conn| start_checkpoint_in(conn, section, epoch))
    }

    /// Completed samples of `epoch` with their loss, when the loss was accepted, and their
    /// pathway (`n_sections` long; a missing section is an empty string), by sample id.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn epoch_samples(
        &self,
        epoch: u64,
        n_sections: usize,
    ) -> Result<Vec<LedgerSample>, RepoError> {
        self.read(|conn| {
            let tail = to_i64(n_sections.saturating_sub(1) as u64);
            let mut stmt = conn.prepare_cached(
                "SELECT s.id, s.loss, COALESCE((SELECT MAX(a.finished_at) FROM assignments a \
                 WHERE a.sample = s.id AND a.section = ?2 AND a.kind = 'forward' \
                 AND a.state = 'done'), s.finished_at, 0) FROM samples s \
                 WHERE s.epoch = ?1 AND s.outcome = 'completed' AND s.kind = 'train' ORDER BY s.id",
            )?;
            let rows = stmt.query_map(params![to_i64(epoch), tail], |r| {
                Ok(LedgerSample {
                    sample: to_u64(r.get(0)?),
                    loss: r.get::<_, Option<f64>>(1)?.map(|l| l as f32),
                    loss_unix_ms: to_u64(r.get(2)?),
                    pathway: vec![String::new(); n_sections],
                })
            })?;
            let mut samples: Vec<LedgerSample> = rows.collect::<Result<_, _>>()?;
            let mut stmt = conn.prepare_cached(
                "SELECT p.sample, p.section, p.miner FROM pathway p JOIN samples s ON s.id = p.sample \
                 WHERE s.epoch = ?1 AND s.outcome = 'completed' AND s.kind = 'train' \
                 ORDER BY p.sample",
            )?;
            let rows = stmt.query_map([to_i64(epoch)], |r| {
                Ok((
                    to_u64(r.get(0)?),
                    usize_of(r.get(1)?),
                    r.get::<_, String>(2)?,
                ))
            })?;
            for row in rows {
                let (sample, section, miner) = row?;
                if let Ok(i) = samples.binary_search_by_key(&sample, |s| s.sample)
                    && let Some(slot) = samples[i].pathway.get_mut(section)
                {
                    *slot = miner;
                }
            }
            Ok(samples)
        })
    }

    /// Per miner: its assignment counts in `epoch`, by hotkey.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn epoch_work_counts(&self, epoch: u64) -> Result<Vec<(String, WorkCounts)>, RepoError> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT a.miner, m.section, \
                 SUM(a.state = 'done'), \
                 SUM(a.state = 'done' AND s.outcome = 'completed'), \
                 SUM(a.state = 'expired'), SUM(a.state = 'failed'), \
                 SUM(a.state = 'done' AND s.outcome = 'completed' AND a.kind = 'forward') \
                 FROM assignments a JOIN samples s ON s.id = a.sample \
                 JOIN miners m ON m.hotkey = a.miner \
                 WHERE a.epoch = ?1 AND a.miner IS NOT NULL AND s.kind = 'train' \
                 GROUP BY a.miner ORDER BY a.miner",
            )?;
            let rows = stmt.query_map([to_i64(epoch)], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    WorkCounts {
                        section: usize_of(r.get(1)?),
                        accepted: to_u64(r.get(2)?),
                        completed_work: to_u64(r.get(3)?),
                        completed_forwards: to_u64(r.get(6)?),
                        missed: to_u64(r.get(4)?),
                        refused: to_u64(r.get(5)?),
                    },
                ))
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
    }

    /// Ids of `miner`'s accepted assignments in `epoch`, in the order it did them: by
    /// acceptance time, a batch's backwards before its forwards (a miner works a batch in
    /// that order), then by id.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn accepted_in_order(&self, epoch: u64, miner: &str) -> Result<Vec<u64>, RepoError> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT id FROM assignments WHERE epoch = ?1 AND miner = ?2 AND state = 'done' \
                 AND kind != 'eval' ORDER BY finished_at, kind = 'forward', id",
            )?;
            let rows = stmt.query_map(params![to_i64(epoch), miner], |r| r.get::<_, i64>(0))?;
            Ok(rows.map(|r| r.map(to_u64)).collect::<Result<_, _>>()?)
        })
    }

    /// What the ledger holds about accepted assignment `id` beyond its row: when it was
    /// accepted, the hash of its output, and the sample's loss when it is the tail's forward.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn accepted_detail(
        &self,
        id: u64,
        kind: WorkKind,
        tail: usize,
    ) -> Result<AcceptedDetail, RepoError> {
        self.read(|conn| {
            let (at, section, output_hash, loss): (Option<i64>, i64, Option<String>, Option<f64>) =
                conn.query_row_cached(
                    "SELECT a.finished_at, a.section, a.output_hash, s.loss FROM assignments a \
                     JOIN samples s ON s.id = a.sample WHERE a.id = ?1",
                    [to_i64(id)],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                )?;
            let is_tail_forward = kind == WorkKind::Forward && usize_of(section) == tail;
            Ok(AcceptedDetail {
                accepted_ms: at.map(to_u64).unwrap_or(0),
                output_hash: output_hash.filter(|h| !h.is_empty()),
                loss: loss.filter(|_| is_tail_forward).map(|l| l as f32),
            })
        })
    }

    /// Hashes of the token ids and targets of `sample`, when it belongs to `epoch`.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn sample_hashes(
        &self,
        sample: u64,
        epoch: u64,
    ) -> Result<Option<(String, String)>, RepoError> {
        self.read(|conn| {
            Ok(conn
                .query_row_cached(
                    "SELECT tokens_hash, targets_hash FROM samples WHERE id = ?1 AND epoch = ?2",
                    params![to_i64(sample), to_i64(epoch)],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?)
        })
    }
}

/// See [`Repository::accepted_detail`].
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptedDetail {
    /// When the result was accepted.
    pub accepted_ms: u64,
    /// Hash of the uploaded output (none for the head's backward).
    pub output_hash: Option<String>,
    /// The tail's reported loss (tail forwards only).
    pub loss: Option<f32>,
}

/// A `published_weights` row selected as (validator, epoch, received_at, body, signature,
/// signed_at).
fn published_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<PublishedRow> {
    Ok(PublishedRow {
        validator: r.get(0)?,
        epoch: to_u64(r.get(1)?),
        received_ms: to_u64(r.get(2)?),
        body: r.get(3)?,
        signature: r.get(4)?,
        signed_ms: to_u64(r.get(5)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_keep_the_latest_per_validator_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.sqlite");
        let row = |v: &str, epoch: u64| PublishedRow {
            validator: v.into(),
            epoch,
            received_ms: 10 + epoch,
            body: format!("{{\"epoch\":{epoch}}}"),
            signature: "ab".into(),
            signed_ms: 5,
        };
        {
            let repo = Repository::open(&path).unwrap();
            repo.save_weights(&row("v1", 0)).unwrap();
            repo.save_weights(&row("v1", 2)).unwrap();
            repo.save_weights(&row("v2", 1)).unwrap();
            // Republishing an epoch replaces it.
            let mut again = row("v2", 1);
            again.body = "{\"epoch\":1,\"again\":true}".into();
            repo.save_weights(&again).unwrap();
        }
        let repo = Repository::open(&path).unwrap();
        let latest = repo.latest_weights().unwrap();
        assert_eq!(latest.len(), 2);
        assert_eq!((latest[0].validator.as_str(), latest[0].epoch), ("v1", 2));
        assert!(latest[1].body.contains("again"));
        assert_eq!(repo.published_epoch("v1").unwrap(), Some(2));
        assert_eq!(repo.published_epoch("v3").unwrap(), None);
    }

    #[test]
    fn kept_objects_and_upload_times() {
        let repo = Repository::open_in_memory().unwrap();
        repo.keep_objects("runs/r/activations/0", 0, 100).unwrap();
        repo.keep_objects("runs/r/activations/0", 0, 999).unwrap();
        repo.keep_objects("runs/r/activations/1", 1, 200).unwrap();
        let kept = repo.kept_objects().unwrap();
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[0].eligible_ms, 100, "the first record stays");
        repo.release_objects("runs/r/activations/0").unwrap();
        assert_eq!(repo.kept_objects().unwrap().len(), 1);
        assert_eq!(repo.upload_time(3, "m").unwrap(), None);
        repo.record_upload_time(3, "m", 42).unwrap();
        assert_eq!(repo.upload_time(3, "m").unwrap(), Some(42));
    }
}
