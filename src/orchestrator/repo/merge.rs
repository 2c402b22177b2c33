//! Durable state of the merge cycle: phase deadlines, upload leases, plans, partition results,
//! verification outcomes, flags and section checkpoints. Every change is one transaction, so
//! an orchestrator restarted mid-merge carries on from where it stopped.

use rusqlite::{Connection, OptionalExtension, params};

use super::db::{Cached, Repository, to_i64, to_u64, usize_of};
use super::ledger::penalise;
use crate::api::Phase;
use crate::orchestrator::outliers::UploadDistance;
use crate::orchestrator::repo_types::RepoError;

/// The phase and its deadlines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhaseInfo {
    /// Current phase.
    pub phase: Phase,
    /// Current epoch.
    pub epoch: u64,
    /// End of the current phase (uploading, merging).
    pub deadline_ms: Option<u64>,
    /// When uploading ended (merging only).
    pub upload_closed_ms: Option<u64>,
}

/// State of one miner's upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadState {
    /// The miner was handed an upload URL and has not submitted yet.
    Leased,
    /// Verified and part of the merge.
    Accepted,
    /// Refused (reason recorded); the miner is left out of this merge.
    Refused,
}

impl UploadState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Leased => "leased",
            Self::Accepted => "accepted",
            Self::Refused => "refused",
        }
    }

    fn parse(s: &str) -> Result<Self, RepoError> {
        match s {
            "leased" => Ok(Self::Leased),
            "accepted" => Ok(Self::Accepted),
            "refused" => Ok(Self::Refused),
            other => Err(RepoError::Corrupt(format!("upload state {other:?}"))),
        }
    }
}

/// One miner's upload for a merge.
#[derive(Debug, Clone, PartialEq)]
pub struct UploadRow {
    /// Uploader.
    pub miner: String,
    /// Its section.
    pub section: usize,
    /// State.
    pub state: UploadState,
    /// Lease end.
    pub lease_until_ms: u64,
    /// Hash of the accepted upload.
    pub hash: Option<String>,
    /// Merge weight (backwards in the epoch).
    pub weight: f32,
    /// Why it was refused.
    pub reason: Option<String>,
    /// Its distances from the reference state, measured when it was checked.
    pub distance: Option<UploadDistance>,
}

/// A stored plan: the inputs every party needs to recompute it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanRow {
    /// Accepted uploaders, sorted.
    pub uploaders: Vec<String>,
    /// Their merge weights, same order.
    pub weights: Vec<f32>,
    /// Flat length.
    pub len: usize,
    /// Requested partitions.
    pub partitions: usize,
    /// Requested replication.
    pub replication: usize,
    /// Whether the section's merge is finished.
    pub finalized: bool,
}

/// One submitted partition result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultRow {
    /// Partition index.
    pub partition: usize,
    /// Merger.
    pub merger: String,
    /// Hash of its upload.
    pub hash: String,
    /// When it was recorded, ms since the Unix epoch.
    pub at_ms: u64,
}

/// A section's merged state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRow {
    /// Section.
    pub section: usize,
    /// Epoch it starts.
    pub epoch: u64,
    /// Hash of the flat object.
    pub hash: String,
    /// Size.
    pub bytes: u64,
    /// AdamW step count of its moments (see [`SectionOutcome::optimizer_step`]).
    pub optimizer_step: u64,
}

/// What finalising one section's merge records.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SectionOutcome {
    /// `(partition, verdict)` for every partition.
    pub verdicts: Vec<(usize, String)>,
    /// `(partition, merger, reason)` of every flag.
    pub flags: Vec<(usize, String, String)>,
    /// The new checkpoint `(hash, bytes)`, if one was written.
    pub checkpoint: Option<(String, u64)>,
    /// The AdamW step count that goes with the new checkpoint's moments: the previous
    /// checkpoint's plus the most optimizer steps an uploader of the merge took in the epoch
    /// (its backwards in the ledger over `local_steps`). Miners adopting the checkpoint, late
    /// joiners and validators replaying the next epoch all use it, so nobody's bias
    /// corrections depend on its own history.
    pub optimizer_step: u64,
}

impl Repository {
    /// The upload of `hotkey` for the merge of `epoch`.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`] or [`RepoError::Corrupt`].
    pub fn upload(&self, epoch: u64, hotkey: &str) -> Result<Option<UploadRow>, RepoError> {
        self.read(|conn| {
            let row = conn
                .query_row_cached(
                    "SELECT miner, section, state, lease_until, hash, weight, reason, d_params, \
                     d_exp_avg, d_exp_avg_sq, reference_norm FROM uploads \
                     WHERE epoch = ?1 AND miner = ?2",
                    params![to_i64(epoch), hotkey],
                    read_upload,
                )
                .optional()?;
            row.map(finish_upload).transpose()
        })
    }

    /// Every upload of `section` for the merge of `epoch`, sorted by miner.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`] or [`RepoError::Corrupt`].
    pub fn uploads_of(&self, epoch: u64, section: usize) -> Result<Vec<UploadRow>, RepoError> {
        self.read(|conn| uploads_of_in(conn, epoch, section))
    }

    /// Grants `hotkey` an upload lease until `lease_until_ms` (no-op when it has one).
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn lease_upload(
        &self,
        epoch: u64,
        section: usize,
        hotkey: &str,
        lease_until_ms: u64,
    ) -> Result<(), RepoError> {
        self.write(|tx| {
            tx.execute_cached(
                "INSERT OR IGNORE INTO uploads (epoch, section, miner, state, lease_until) \
                 VALUES (?1, ?2, ?3, 'leased', ?4)",
                params![
                    to_i64(epoch),
                    to_i64(section as u64),
                    hotkey,
                    to_i64(lease_until_ms)
                ],
            )?;
            Ok(())
        })
    }

    /// Ends every lease of `epoch` still open at `now_ms` (the uploads closed early without
    /// them: their holders were waited for and did not deliver): each now ended just before
    /// `now_ms`. Returns how many.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn end_leases(&self, epoch: u64, now_ms: u64) -> Result<usize, RepoError> {
        self.write(|tx| {
            Ok(tx.execute_cached(
                "UPDATE uploads SET lease_until = ?2 - 1 \
                 WHERE epoch = ?1 AND state = 'leased' AND lease_until >= ?2",
                params![to_i64(epoch), to_i64(now_ms)],
            )?)
        })
    }

    /// Accepts a verified upload with its merge weight and distances, if it is still open: still
    /// leased, its lease not over at `now_ms`, and its section's plan not built yet (the check
    /// that precedes this can take long). Returns whether it was accepted.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    #[allow(clippy::too_many_arguments)]
    pub fn accept_upload(
        &self,
        epoch: u64,
        hotkey: &str,
        hash: &str,
        bytes: u64,
        weight: f32,
        distance: &UploadDistance,
        now_ms: u64,
    ) -> Result<bool, RepoError> {
        self.write(|tx| {
            let n = tx.execute_cached(
                "UPDATE uploads SET state = 'accepted', hash = ?3, bytes = ?4, weight = ?5, \
                 d_params = ?6, d_exp_avg = ?7, d_exp_avg_sq = ?8, reference_norm = ?9 \
                 WHERE epoch = ?1 AND miner = ?2 AND state = 'leased' AND lease_until >= ?10 \
                 AND NOT EXISTS (SELECT 1 FROM merge_plans p \
                                 WHERE p.epoch = uploads.epoch AND p.section = uploads.section)",
                params![
                    to_i64(epoch),
                    hotkey,
                    hash,
                    to_i64(bytes),
                    f64::from(weight),
                    distance.distance[0],
                    distance.distance[1],
                    distance.distance[2],
                    distance.reference_norm,
                    to_i64(now_ms)
                ],
            )?;
            Ok(n == 1)
        })
    }

    /// Refuses an upload that is still leased (a verdict reached after it was accepted or
    /// refused otherwise changes nothing): the miner is left out of the merge and penalised.
    /// Returns whether it was refused.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn refuse_upload(
        &self,
        epoch: u64,
        hotkey: &str,
        reason: &str,
        now_ms: u64,
    ) -> Result<bool, RepoError> {
        self.refuse_from(UploadState::Leased, epoch, hotkey, reason, now_ms)
    }

    /// Leaves an accepted upload out of the merge before its plan is built (the robust norm
    /// check, [`crate::orchestrator::outliers`]): refused with `reason`, miner penalised.
    /// Returns whether it was refused.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn reject_outlier(
        &self,
        epoch: u64,
        hotkey: &str,
        reason: &str,
        now_ms: u64,
    ) -> Result<bool, RepoError> {
        self.refuse_from(UploadState::Accepted, epoch, hotkey, reason, now_ms)
    }

    /// Refuses `hotkey`'s upload for `epoch` if it is in state `from`, penalising the miner.
    fn refuse_from(
        &self,
        from: UploadState,
        epoch: u64,
        hotkey: &str,
        reason: &str,
        now_ms: u64,
    ) -> Result<bool, RepoError> {
        self.write(|tx| {
            let n = tx.execute_cached(
                "UPDATE uploads SET state = 'refused', reason = ?3 \
                 WHERE epoch = ?1 AND miner = ?2 AND state = ?4",
                params![to_i64(epoch), hotkey, reason, from.as_str()],
            )?;
            if n == 0 {
                return Ok(false);
            }
            penalise(
                tx,
                &self.standing,
                hotkey,
                None,
                &format!("upload refused: {reason}"),
                now_ms,
            )?;
            Ok(true)
        })
    }

    /// Backwards `hotkey` completed for samples of `epoch` (its merge weight).
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn backwards_in_epoch(&self, hotkey: &str, epoch: u64) -> Result<u64, RepoError> {
        self.read(|conn| {
            let n: i64 = conn.query_row_cached(
                "SELECT COUNT(*) FROM pathway p JOIN samples s ON s.id = p.sample \
                 WHERE p.miner = ?1 AND p.backward_done = 1 AND s.epoch = ?2 AND s.kind = 'train'",
                params![hotkey, to_i64(epoch)],
                |r| r.get(0),
            )?;
            Ok(to_u64(n))
        })
    }

    /// Stores the plan of `section` for the merge of `epoch` (once; later calls keep the first).
    ///
    /// # Errors
    /// [`RepoError::Sqlite`] or [`RepoError::Corrupt`] (unserialisable plan).
    pub fn save_plan(&self, epoch: u64, section: usize, plan: &PlanRow) -> Result<(), RepoError> {
        let uploaders = serde_json::to_string(&plan.uploaders)
            .map_err(|e| RepoError::Corrupt(e.to_string()))?;
        let weights =
            serde_json::to_string(&plan.weights).map_err(|e| RepoError::Corrupt(e.to_string()))?;
        self.write(|tx| {
            tx.execute_cached(
                "INSERT OR IGNORE INTO merge_plans (epoch, section, uploaders, weights, len, \
                 partitions, replication) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    to_i64(epoch),
                    to_i64(section as u64),
                    uploaders,
                    weights,
                    to_i64(plan.len as u64),
                    to_i64(plan.partitions as u64),
                    to_i64(plan.replication as u64)
                ],
            )?;
            Ok(())
        })
    }

    /// The stored plan of `section` for `epoch`.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`] or [`RepoError::Corrupt`].
    pub fn plan(&self, epoch: u64, section: usize) -> Result<Option<PlanRow>, RepoError> {
        self.read(|conn| plan_in(conn, epoch, section))
    }

    /// Records a merger's result for a partition (a resubmission replaces the earlier one).
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    #[allow(clippy::too_many_arguments)]
    pub fn record_result(
        &self,
        epoch: u64,
        section: usize,
        partition: usize,
        merger: &str,
        hash: &str,
        bytes: u64,
        now_ms: u64,
    ) -> Result<(), RepoError> {
        self.write(|tx| {
            tx.execute_cached(
                "INSERT OR REPLACE INTO partition_results (epoch, section, partition, merger, \
                 hash, bytes, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    to_i64(epoch),
                    to_i64(section as u64),
                    to_i64(partition as u64),
                    merger,
                    hash,
                    to_i64(bytes),
                    to_i64(now_ms)
                ],
            )?;
            Ok(())
        })
    }

    /// Every submitted result of `section` for `epoch`, by partition then merger.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn results(&self, epoch: u64, section: usize) -> Result<Vec<ResultRow>, RepoError> {
        self.read(|conn| results_in(conn, epoch, section))
    }

    /// Records the end of a section's merge in one transaction: verdicts, flags (each a
    /// penalty), the new checkpoint (epoch `epoch + 1`) and the plan marked finalised.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn finalize_section(
        &self,
        epoch: u64,
        section: usize,
        outcome: &SectionOutcome,
        now_ms: u64,
    ) -> Result<(), RepoError> {
        let (e, s) = (to_i64(epoch), to_i64(section as u64));
        self.write(|tx| {
            for (partition, verdict) in &outcome.verdicts {
                tx.execute_cached(
                    "INSERT OR REPLACE INTO partition_outcomes (epoch, section, partition, \
                     verdict) VALUES (?1, ?2, ?3, ?4)",
                    params![e, s, to_i64(*partition as u64), verdict],
                )?;
            }
            for (partition, merger, reason) in &outcome.flags {
                tx.execute_cached(
                    "INSERT INTO merge_flags (epoch, section, partition, merger, reason) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![e, s, to_i64(*partition as u64), merger, reason],
                )?;
                penalise(
                    tx,
                    &self.standing,
                    merger,
                    None,
                    &format!("merge of epoch {epoch} partition {partition}: {reason}"),
                    now_ms,
                )?;
            }
            if let Some((hash, bytes)) = &outcome.checkpoint {
                tx.execute_cached(
                    "INSERT OR REPLACE INTO checkpoints (section, epoch, hash, bytes, at, \
                     optimizer_step) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![
                        s,
                        to_i64(epoch + 1),
                        hash,
                        to_i64(*bytes),
                        to_i64(now_ms),
                        to_i64(outcome.optimizer_step)
                    ],
                )?;
            }
            tx.execute_cached(
                "INSERT OR IGNORE INTO merge_plans (epoch, section, uploaders, weights, len, \
                 partitions, replication) VALUES (?1, ?2, '[]', '[]', 0, 0, 0)",
                params![e, s],
            )?;
            tx.execute_cached(
                "UPDATE merge_plans SET finalized_at = ?3 WHERE epoch = ?1 AND section = ?2",
                params![e, s, to_i64(now_ms)],
            )?;
            Ok(())
        })
    }

    /// Verdicts of a section's finished merge: `(partition, verdict)`.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn verdicts(&self, epoch: u64, section: usize) -> Result<Vec<(usize, String)>, RepoError> {
        self.read(|conn| verdicts_in(conn, epoch, section))
    }

    /// Flags of a section's merge: `(partition, merger, reason)`.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn flags(
        &self,
        epoch: u64,
        section: usize,
    ) -> Result<Vec<(usize, String, String)>, RepoError> {
        self.read(|conn| flags_in(conn, epoch, section))
    }

    /// The newest checkpoint of `section`.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn latest_checkpoint(&self, section: usize) -> Result<Option<CheckpointRow>, RepoError> {
        self.start_checkpoint(section, u64::MAX)
    }

    /// The epochs `section` has a checkpoint for, oldest first.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn checkpoint_epochs(&self, section: usize) -> Result<Vec<u64>, RepoError> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT epoch FROM checkpoints WHERE section = ?1 ORDER BY epoch",
            )?;
            let rows = stmt.query_map([to_i64(section as u64)], |r| r.get::<_, i64>(0))?;
            rows.map(|r| Ok(to_u64(r?))).collect()
        })
    }
}

struct RawUpload {
    miner: String,
    section: i64,
    state: String,
    lease_until: i64,
    hash: Option<String>,
    weight: Option<f64>,
    reason: Option<String>,
    distance: [Option<f64>; 3],
    reference_norm: Option<f64>,
}

fn read_upload(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawUpload> {
    Ok(RawUpload {
        miner: r.get(0)?,
        section: r.get(1)?,
        state: r.get(2)?,
        lease_until: r.get(3)?,
        hash: r.get(4)?,
        weight: r.get(5)?,
        reason: r.get(6)?,
        distance: [r.get(7)?, r.get(8)?, r.get(9)?],
        reference_norm: r.get(10)?,
    })
}

fn finish_upload(raw: RawUpload) -> Result<UploadRow, RepoError> {
    let distance = match (raw.distance, raw.reference_norm) {
        ([Some(a), Some(b), Some(c)], Some(norm)) => Some(UploadDistance {
            miner: raw.miner.clone(),
            distance: [a, b, c],
            reference_norm: norm,
        }),
        _ => None,
    };
    Ok(UploadRow {
        miner: raw.miner,
        section: usize_of(raw.section),
        state: UploadState::parse(&raw.state)?,
        lease_until_ms: to_u64(raw.lease_until),
        hash: raw.hash,
        weight: raw.weight.unwrap_or(0.0) as f32,
        reason: raw.reason,
        distance,
    })
}

/// Every upload of `section` for the merge of `epoch`, sorted by miner, read on `conn`.
pub(super) fn uploads_of_in(
    conn: &Connection,
    epoch: u64,
    section: usize,
) -> Result<Vec<UploadRow>, RepoError> {
    let mut stmt = conn.prepare_cached(
        "SELECT miner, section, state, lease_until, hash, weight, reason, d_params, \
         d_exp_avg, d_exp_avg_sq, reference_norm FROM uploads \
         WHERE epoch = ?1 AND section = ?2 ORDER BY miner",
    )?;
    let rows = stmt.query_map(params![to_i64(epoch), to_i64(section as u64)], read_upload)?;
    rows.map(|r| finish_upload(r?)).collect()
}

/// The stored plan of `section` for `epoch`, read on `conn`.
pub(super) fn plan_in(
    conn: &Connection,
    epoch: u64,
    section: usize,
) -> Result<Option<PlanRow>, RepoError> {
    let raw: Option<(String, String, i64, i64, i64, Option<i64>)> = conn
        .query_row_cached(
            "SELECT uploaders, weights, len, partitions, replication, finalized_at \
             FROM merge_plans WHERE epoch = ?1 AND section = ?2",
            params![to_i64(epoch), to_i64(section as u64)],
            |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            },
        )
        .optional()?;
    let Some((uploaders, weights, len, partitions, replication, finalized)) = raw else {
        return Ok(None);
    };
    let corrupt = |e: serde_json::Error| RepoError::Corrupt(format!("merge plan: {e}"));
    Ok(Some(PlanRow {
        uploaders: serde_json::from_str(&uploaders).map_err(corrupt)?,
        weights: serde_json::from_str(&weights).map_err(corrupt)?,
        len: usize_of(len),
        partitions: usize_of(partitions),
        replication: usize_of(replication),
        finalized: finalized.is_some(),
    }))
}

/// The rows `sql` selects for one section's merge (`?1` the epoch, `?2` the section), each
/// made by `row`, read on `conn`.
fn merge_rows<T>(
    conn: &Connection,
    sql: &str,
    epoch: u64,
    section: usize,
    row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> Result<Vec<T>, RepoError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map(params![to_i64(epoch), to_i64(section as u64)], row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Every submitted result of `section` for `epoch`, by partition then merger, read on `conn`.
pub(super) fn results_in(
    conn: &Connection,
    epoch: u64,
    section: usize,
) -> Result<Vec<ResultRow>, RepoError> {
    let sql = "SELECT partition, merger, hash, at FROM partition_results \
               WHERE epoch = ?1 AND section = ?2 ORDER BY partition, merger";
    merge_rows(conn, sql, epoch, section, |r| {
        Ok(ResultRow {
            partition: usize_of(r.get(0)?),
            merger: r.get(1)?,
            hash: r.get(2)?,
            at_ms: to_u64(r.get(3)?),
        })
    })
}

/// Verdicts of a section's finished merge, `(partition, verdict)`, read on `conn`.
pub(super) fn verdicts_in(
    conn: &Connection,
    epoch: u64,
    section: usize,
) -> Result<Vec<(usize, String)>, RepoError> {
    let sql = "SELECT partition, verdict FROM partition_outcomes \
               WHERE epoch = ?1 AND section = ?2 ORDER BY partition";
    merge_rows(conn, sql, epoch, section, |r| {
        Ok((usize_of(r.get(0)?), r.get(1)?))
    })
}

/// Flags of a section's merge, `(partition, merger, reason)`, read on `conn`.
pub(super) fn flags_in(
    conn: &Connection,
    epoch: u64,
    section: usize,
) -> Result<Vec<(usize, String, String)>, RepoError> {
    let sql = "SELECT partition, merger, reason FROM merge_flags \
               WHERE epoch = ?1 AND section = ?2 ORDER BY partition, merger";
    merge_rows(conn, sql, epoch, section, |r| {
        Ok((usize_of(r.get(0)?), r.get(1)?, r.get(2)?))
    })
}

/// The latest checkpoint of `section` at or before `epoch`, read on `conn`.
pub(super) fn start_checkpoint_in(
    conn: &Connection,
    section: usize,
    epoch: u64,
) -> Result<Option<CheckpointRow>, RepoError> {
    Ok(conn
        .query_row_cached(
            "SELECT section, epoch, hash, bytes, optimizer_step FROM checkpoints \
             WHERE section = ?1 AND epoch <= ?2 ORDER BY epoch DESC LIMIT 1",
            params![to_i64(section as u64), to_i64(epoch)],
            |r| {
                Ok(CheckpointRow {
                    section: usize_of(r.get(0)?),
                    epoch: to_u64(r.get(1)?),
                    hash: r.get(2)?,
                    bytes: to_u64(r.get(3)?),
                    optimizer_step: to_u64(r.get(4)?),
                })
            },
        )
        .optional()?)
}
