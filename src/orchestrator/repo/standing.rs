//! A miner's standing: penalties that act on routing, and liveness that frees section seats.
//!
//! - A **strike** is a penalty for work handed to the miner after its previous strike (or any
//!   penalty when it has none outstanding, and every merge-side penalty). Failures of work it
//!   took before its last strike are recorded as penalties but belong to the same episode, so a
//!   miner that died holding several assignments gets one strike, not one per assignment.
//! - After a strike the miner is **backed off**: no new forwards and no new samples for
//!   `backoff_s x 2^(strikes-1)` (backwards of samples it already holds are still delivered:
//!   only it has their inputs). At `exclude_after` strikes it is **excluded** for `exclusion_s`
//!   and does not hold a seat in its section meanwhile.
//! - An accepted result clears the strikes (they count consecutive failures).
//! - Every decision (`backoff`, `excluded`, `cleared`, `flagged`) is a row of the `standing`
//!   ledger table.
//! - **Validator flags** ([`Repository::flag_window`]): an epoch in which validators that agree
//!   (`orchestrator::flag_quorum`) flagged the miner is a *flagged window*; at
//!   `validation.exclude_after_flags` of them since its last such exclusion the miner is
//!   excluded for `exclusion_s`. Results keep being accepted from a cheating miner, so this
//!   exclusion is kept apart from the strikes (an accepted result does not lift it).
//! - A miner not seen for `miner_ttl_s` is **expired**: it keeps its registration (and its
//!   section, if there is room when it returns) but no longer holds a seat.
//! - A miner none of whose results was accepted holds its seat only for `placement.claim_s`
//!   after registering: keys that never take work cannot fill a section for longer.

use rusqlite::{Connection, OptionalExtension, params};

use super::db::{Cached, Repository, to_i64, to_u64};
pub use super::policy::Standing;
use crate::orchestrator::repo_types::RepoError;

/// One recorded standing decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandingDecision {
    /// The miner.
    pub miner: String,
    /// When, ms since the Unix epoch.
    pub at_ms: u64,
    /// `backoff`, `excluded`, `cleared` or `flagged`.
    pub decision: String,
    /// Strikes in a row after the decision (for `flagged`, and `excluded` after it: flagged
    /// windows since the last exclusion for flags).
    pub strikes: u32,
    /// Until when it gets no new work (none for `cleared`).
    pub until_ms: Option<u64>,
    /// The failure that caused it.
    pub reason: String,
}

/// SQL condition (on table `miners`, parameter `?now`) of a miner holding a seat: seen within
/// the TTL, not excluded, and either *proven* (a result of it was accepted) or registered within
/// the claim window. Parameters: `?1` now, `?2` TTL, `?3` strikes that exclude, `?5` claim
/// window.
pub(super) const HOLDS_SEAT: &str = "last_seen >= ?1 - ?2 \
     AND NOT (strikes >= ?3 AND COALESCE(benched_until, 0) > ?1) \
     AND COALESCE(flag_excluded_until, 0) <= ?1 \
     AND (forwards + backwards > 0 OR registered_at >= ?1 - ?5)";

/// SQL expression (on table `miners`) of a proven miner: one with an accepted result.
pub(super) const PROVEN: &str = "forwards + backwards > 0";

/// SQL condition (on table `miners`) of a miner that takes new forwards now: seen within the
/// TTL, neither backed off nor excluded (what [`benched_until`] says of one miner). Parameters:
/// `?1` now, `?2` TTL.
pub(super) const TAKES_WORK: &str = "last_seen >= ?1 - ?2 \
     AND COALESCE(benched_until, 0) <= ?1 AND COALESCE(flag_excluded_until, 0) <= ?1";

/// Counts a strike against `hotkey` for a penalty on `assignment` (none: a merge-side
/// penalty) if it is a new failure (see the module documentation), backing the miner off or
/// excluding it, and records the decision.
pub(super) fn strike(
    tx: &Connection,
    policy: &Standing,
    hotkey: &str,
    assignment: Option<u64>,
    reason: &str,
    now_ms: u64,
) -> Result<(), RepoError> {
    let Some((strikes, struck_at)) = tx
        .query_row_cached(
            "SELECT strikes, struck_at FROM miners WHERE hotkey = ?1",
            [hotkey],
            |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Option<i64>>(1)?)),
        )
        .optional()?
    else {
        return Ok(());
    };
    if let (Some(id), Some(struck_at)) = (assignment, struck_at) {
        let delivered: Option<i64> = tx
            .query_row_cached(
                "SELECT delivered_at FROM assignments WHERE id = ?1",
                [to_i64(id)],
                |r| r.get(0),
            )
            .optional()?
            .flatten();
        if delivered.is_none_or(|d| d < struck_at) {
            return Ok(());
        }
    }
    let strikes = u32::try_from(strikes).unwrap_or(u32::MAX).saturating_add(1);
    let (span, excluded) = policy.penalty_for(strikes);
    let until = now_ms.saturating_add(span);
    tx.execute_cached(
        "UPDATE miners SET strikes = ?2, struck_at = ?3, benched_until = ?4 WHERE hotkey = ?1",
        params![hotkey, i64::from(strikes), to_i64(now_ms), to_i64(until)],
    )?;
    let decision = if excluded { "excluded" } else { "backoff" };
    record(tx, hotkey, now_ms, decision, strikes, Some(until), reason)
}

/// Clears `hotkey`'s strikes after an accepted result (recorded when there were any).
pub(super) fn clear(tx: &Connection, hotkey: &str, now_ms: u64) -> Result<(), RepoError> {
    let n = tx.execute_cached(
        "UPDATE miners SET strikes = 0, struck_at = NULL, benched_until = NULL \
         WHERE hotkey = ?1 AND strikes > 0",
        [hotkey],
    )?;
    if n > 0 {
        record(
            tx,
            hotkey,
            now_ms,
            "cleared",
            0,
            None,
            "a result was accepted",
        )?;
    }
    Ok(())
}

fn record(
    tx: &Connection,
    hotkey: &str,
    now_ms: u64,
    decision: &str,
    strikes: u32,
    until: Option<u64>,
    reason: &str,
) -> Result<(), RepoError> {
    tx.execute_cached(
        "INSERT INTO standing (miner, at, decision, strikes, until, reason) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            hotkey,
            to_i64(now_ms),
            decision,
            i64::from(strikes),
            until.map(to_i64),
            reason
        ],
    )?;
    Ok(())
}

impl Repository {
    /// The standing decisions recorded for `hotkey`, oldest first.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn standing_of(&self, hotkey: &str) -> Result<Vec<StandingDecision>, RepoError> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT miner, at, decision, strikes, until, reason FROM standing \
                 WHERE miner = ?1 ORDER BY id",
            )?;
            let rows = stmt.query_map([hotkey], |r| {
                Ok(StandingDecision {
                    miner: r.get(0)?,
                    at_ms: to_u64(r.get(1)?),
                    decision: r.get(2)?,
                    strikes: u32::try_from(r.get::<_, i64>(3)?).unwrap_or(0),
                    until_ms: r.get::<_, Option<i64>>(4)?.map(to_u64),
                    reason: r.get(5)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
    }

    /// Whether `hotkey` may be given new forwards or samples at `now_ms` (not backed off or
    /// excluded).
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn may_take_new_work(&self, hotkey: &str, now_ms: u64) -> Result<bool, RepoError> {
        self.read(|conn| benched_until(conn, hotkey).map(|until| until.is_none_or(|u| u <= now_ms)))
    }

    /// Records that agreeing validators flagged `hotkey` in `epoch` (once per epoch; a repeat
    /// changes nothing) and, at `exclude_after` flagged windows (0: never) since its last
    /// exclusion for flags, excludes it until `now_ms + exclusion_ms`. Returns whether this
    /// call excluded it.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn flag_window(
        &self,
        hotkey: &str,
        epoch: u64,
        reason: &str,
        exclude_after: u32,
        exclusion_ms: u64,
        now_ms: u64,
    ) -> Result<bool, RepoError> {
        self.write(|tx| {
            let new = tx.execute_cached(
                "INSERT OR IGNORE INTO flagged_windows (miner, epoch, at, reason) \
                 VALUES (?1, ?2, ?3, ?4)",
                params![hotkey, to_i64(epoch), to_i64(now_ms), reason],
            )?;
            if new == 0 {
                return Ok(false);
            }
            let windows: i64 = tx.query_row_cached(
                "SELECT COUNT(*) FROM flagged_windows WHERE miner = ?1 AND epoch > COALESCE(\
                 (SELECT flag_excluded_epoch FROM miners WHERE hotkey = ?1), -1)",
                [hotkey],
                |r| r.get(0),
            )?;
            let windows = u32::try_from(windows).unwrap_or(u32::MAX);
            record(tx, hotkey, now_ms, "flagged", windows, None, reason)?;
            if exclude_after == 0 || windows < exclude_after {
                return Ok(false);
            }
            let until = now_ms.saturating_add(exclusion_ms);
            tx.execute_cached(
                "UPDATE miners SET flag_excluded_until = ?2, flag_excluded_epoch = ?3 \
                 WHERE hotkey = ?1",
                params![hotkey, to_i64(until), to_i64(epoch)],
            )?;
            let why = format!("{windows} flagged windows, the last: {reason}");
            record(tx, hotkey, now_ms, "excluded", windows, Some(until), &why)?;
            Ok(true)
        })
    }
}

impl Repository {
    /// Whether `hotkey` is excluded at `now_ms` (for strikes or for validator flags): an
    /// excluded miner is not leased uploads or merge partitions either.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn excluded(&self, hotkey: &str, now_ms: u64) -> Result<bool, RepoError> {
        let policy = self.standing;
        self.read_hot(|conn| {
            Ok(conn
                .query_row_cached(
                    "SELECT (strikes >= ?3 AND COALESCE(benched_until, 0) > ?1) \
                     OR COALESCE(flag_excluded_until, 0) > ?1 FROM miners WHERE hotkey = ?2",
                    params![to_i64(now_ms), hotkey, i64::from(policy.exclude_after)],
                    |r| r.get::<_, bool>(0),
                )
                .optional()?
                .unwrap_or(false))
        })
    }
}

/// Until when `hotkey` gets no new work (back-off, exclusion, or exclusion for validator
/// flags), if it is kept from it.
pub(super) fn benched_until(tx: &Connection, hotkey: &str) -> Result<Option<u64>, RepoError> {
    Ok(tx
        .query_row_cached(
            "SELECT CASE WHEN benched_until IS NULL AND flag_excluded_until IS NULL THEN NULL \
             ELSE MAX(COALESCE(benched_until, 0), COALESCE(flag_excluded_until, 0)) END \
             FROM miners WHERE hotkey = ?1",
            [hotkey],
            |r| r.get::<_, Option<i64>>(0),
        )
        .optional()?
        .flatten()
        .map(to_u64))
}
