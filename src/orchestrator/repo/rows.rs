//! Reading assignment and miner rows, and the checks and updates every routing step shares.

use rusqlite::{Connection, OptionalExtension, params};

use super::db::{Cached, to_i64, to_u64, usize_of};
use crate::api::WorkKind;
use crate::orchestrator::repo_types::*;

pub(super) const ASSIGNMENT_COLUMNS: &str = "a.id, a.sample, a.epoch, a.section, a.kind, a.miner, a.deadline, \
     a.state, a.input_hash, s.targets_hash, a.attempts, a.input_from, s.tokens_hash";

pub(super) fn read_assignment(row: &rusqlite::Row<'_>) -> rusqlite::Result<RawAssignment> {
    Ok(RawAssignment {
        id: row.get(0)?,
        sample: row.get(1)?,
        epoch: row.get(2)?,
        section: row.get(3)?,
        kind: row.get(4)?,
        miner: row.get(5)?,
        deadline: row.get(6)?,
        state: row.get(7)?,
        input_hash: row.get(8)?,
        targets_hash: row.get(9)?,
        attempts: row.get(10)?,
        input_from: row.get(11)?,
        tokens_hash: row.get(12)?,
    })
}

pub(super) struct RawAssignment {
    id: i64,
    sample: i64,
    epoch: i64,
    section: i64,
    kind: String,
    miner: Option<String>,
    deadline: Option<i64>,
    state: String,
    input_hash: String,
    targets_hash: Option<String>,
    attempts: i64,
    input_from: Option<i64>,
    tokens_hash: String,
}

impl RawAssignment {
    pub(super) fn finish(self, tail: Option<usize>) -> Result<AssignmentRow, RepoError> {
        let kind = parse_kind(&self.kind)?;
        let section = usize_of(self.section);
        let is_tail_forward =
            matches!(kind, WorkKind::Forward | WorkKind::Eval) && Some(section) == tail;
        Ok(AssignmentRow {
            id: to_u64(self.id),
            sample: to_u64(self.sample),
            epoch: to_u64(self.epoch),
            section,
            kind,
            miner: self.miner,
            deadline_ms: self.deadline.map(to_u64),
            state: AssignmentState::parse(&self.state)?,
            input_hash: self.input_hash,
            targets_hash: if is_tail_forward {
                self.targets_hash
            } else {
                None
            },
            attempts: u32::try_from(self.attempts).unwrap_or(u32::MAX),
            input_from: self.input_from.map(to_u64),
            tokens_hash: self.tokens_hash,
        })
    }
}

pub(super) fn read_miner(row: &rusqlite::Row<'_>) -> rusqlite::Result<MinerRow> {
    Ok(MinerRow {
        hotkey: row.get(0)?,
        section: usize_of(row.get(1)?),
        registered_at_ms: to_u64(row.get(2)?),
        last_seen_ms: to_u64(row.get(3)?),
        device: row.get(4)?,
        max_in_flight: usize_of(row.get(5)?),
        forwards: to_u64(row.get(6)?),
        backwards: to_u64(row.get(7)?),
        penalties: to_u64(row.get(8)?),
        weights_epoch: to_u64(row.get(9)?),
        weights_hash: row.get(10)?,
    })
}

pub(super) const MINER_COLUMNS: &str = "hotkey, section, registered_at, last_seen, device, max_in_flight, \
     forwards, backwards, penalties, weights_epoch, weights_hash";

pub(super) fn get_assignment(
    conn: &Connection,
    id: u64,
    tail: usize,
) -> Result<AssignmentRow, RepoError> {
    conn.query_row_cached(
        &format!(
            "SELECT {ASSIGNMENT_COLUMNS} FROM assignments a JOIN samples s ON s.id = a.sample \
             WHERE a.id = ?1"
        ),
        [to_i64(id)],
        read_assignment,
    )
    .optional()?
    .ok_or(RepoError::UnknownAssignment { id })?
    .finish(Some(tail))
}

pub(super) fn check_held(row: &AssignmentRow, hotkey: &str) -> Result<(), RepoError> {
    if row.miner.as_deref() != Some(hotkey) {
        return Err(RepoError::NotHolder { id: row.id });
    }
    if row.state != AssignmentState::Assigned {
        return Err(RepoError::NotAssigned {
            id: row.id,
            state: row.state,
        });
    }
    Ok(())
}

pub(super) fn set_state(
    tx: &Connection,
    id: u64,
    state: AssignmentState,
    reason: &str,
    now_ms: u64,
) -> Result<(), RepoError> {
    tx.execute_cached(
        "UPDATE assignments SET state = ?2, reason = ?3, finished_at = ?4 WHERE id = ?1",
        params![to_i64(id), state.as_str(), reason, to_i64(now_ms)],
    )?;
    Ok(())
}
