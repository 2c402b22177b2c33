//! The orchestrator's durable state: one SQLite file (WAL) behind a small interface.
//!
//! Every state change runs inside one transaction, so a `kill -9` at any point leaves either
//! the state before or the state after the change. On restart, registrations and the ledger
//! are intact, and assignments that were in flight expire at their deadline and are re-offered
//! (forwards) or recorded as dropped (backwards).
//!
//! The routing rules live here, next to the data they read:
//! - backward work is handed out first, and only to the miner that ran that sample's forward
//!   in the same section (it caches the input);
//! - a miner holds at most `max_in_flight` forwards whose backward it has not done;
//! - a missed or refused forward is re-offered to any miner of the section; a missed backward
//!   drops the sample with a recorded reason; a refused backward is retried by the same miner;
//!   work tried [`MAX_ATTEMPTS`] times drops the sample. Nothing is dropped silently.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::repo_types::*;
use crate::api::{Phase, WorkKind};

/// Attempts at one piece of work before its sample is dropped.
pub const MAX_ATTEMPTS: u32 = 5;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS run_state (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    phase TEXT NOT NULL, epoch INTEGER NOT NULL, next_sample INTEGER NOT NULL,
    phase_deadline INTEGER, upload_closed INTEGER);
INSERT OR IGNORE INTO run_state (id, phase, epoch, next_sample) VALUES (0, 'training', 0, 0);
CREATE TABLE IF NOT EXISTS miners (
    hotkey TEXT PRIMARY KEY, section INTEGER NOT NULL, registered_at INTEGER NOT NULL,
    last_seen INTEGER NOT NULL, device TEXT NOT NULL, max_in_flight INTEGER NOT NULL,
    forwards INTEGER NOT NULL DEFAULT 0, backwards INTEGER NOT NULL DEFAULT 0,
    penalties INTEGER NOT NULL DEFAULT 0, weights_epoch INTEGER NOT NULL DEFAULT 0,
    weights_hash TEXT);
CREATE TABLE IF NOT EXISTS penalties (
    id INTEGER PRIMARY KEY AUTOINCREMENT, miner TEXT NOT NULL, at INTEGER NOT NULL,
    assignment INTEGER, reason TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS samples (
    id INTEGER PRIMARY KEY, epoch INTEGER NOT NULL, outcome TEXT NOT NULL, reason TEXT,
    loss REAL, tokens_hash TEXT NOT NULL, targets_hash TEXT NOT NULL,
    started_at INTEGER NOT NULL, finished_at INTEGER);
CREATE TABLE IF NOT EXISTS pathway (
    sample INTEGER NOT NULL, section INTEGER NOT NULL, miner TEXT NOT NULL,
    backward_done INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (sample, section));
CREATE INDEX IF NOT EXISTS pathway_miner ON pathway (miner, backward_done);
CREATE TABLE IF NOT EXISTS assignments (
    id INTEGER PRIMARY KEY AUTOINCREMENT, sample INTEGER NOT NULL, epoch INTEGER NOT NULL,
    section INTEGER NOT NULL, kind TEXT NOT NULL, miner TEXT, deadline INTEGER,
    state TEXT NOT NULL, delivered INTEGER NOT NULL DEFAULT 0, input_hash TEXT NOT NULL,
    output_hash TEXT, attempts INTEGER NOT NULL DEFAULT 0, reason TEXT,
    created_at INTEGER NOT NULL, finished_at INTEGER,
    download_ms INTEGER, compute_ms INTEGER, upload_ms INTEGER);
CREATE INDEX IF NOT EXISTS assignments_state ON assignments (state, section, kind);
CREATE INDEX IF NOT EXISTS assignments_miner ON assignments (miner, state);
CREATE INDEX IF NOT EXISTS assignments_sample ON assignments (sample);
CREATE INDEX IF NOT EXISTS samples_outcome ON samples (outcome, epoch);
CREATE TABLE IF NOT EXISTS seen_signatures (id TEXT PRIMARY KEY, expires_at INTEGER NOT NULL);
";

const ASSIGNMENT_COLUMNS: &str = "a.id, a.sample, a.epoch, a.section, a.kind, a.miner, a.deadline, \
     a.state, a.input_hash, s.targets_hash, a.attempts";

/// The state store. Cheap to share behind an `Arc`; calls are serialised by an inner mutex.
#[derive(Debug)]
pub struct Repository {
    conn: Mutex<Connection>,
}

pub(super) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(super) fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

pub(super) fn usize_of(v: i64) -> usize {
    usize::try_from(v).unwrap_or(0)
}

fn read_assignment(row: &rusqlite::Row<'_>) -> rusqlite::Result<RawAssignment> {
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
    })
}

struct RawAssignment {
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
}

impl RawAssignment {
    fn finish(self, tail: Option<usize>) -> Result<AssignmentRow, RepoError> {
        let kind = parse_kind(&self.kind)?;
        let section = usize_of(self.section);
        let is_tail_forward = kind == WorkKind::Forward && Some(section) == tail;
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
        })
    }
}

fn read_miner(row: &rusqlite::Row<'_>) -> rusqlite::Result<MinerRow> {
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

const MINER_COLUMNS: &str = "hotkey, section, registered_at, last_seen, device, max_in_flight, \
     forwards, backwards, penalties, weights_epoch, weights_hash";

impl Repository {
    /// Opens (creating if needed) the state file at `path`, in WAL mode.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`] when the file cannot be opened or the schema cannot be created.
    pub fn open(path: &Path) -> Result<Self, RepoError> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        Self::init(conn)
    }

    /// An in-memory store (tests).
    ///
    /// # Errors
    /// [`RepoError::Sqlite`] when the schema cannot be created.
    pub fn open_in_memory() -> Result<Self, RepoError> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(conn: Connection) -> Result<Self, RepoError> {
        conn.execute_batch(SCHEMA)?;
        conn.execute_batch(super::merge_repo::MERGE_SCHEMA)?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave a half-done transaction behind (it rolls
        // back on drop), so a poisoned lock is safe to reuse.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn write<T>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, RepoError>,
    ) -> Result<T, RepoError> {
        let mut conn = self.lock();
        let tx = conn.transaction()?;
        let out = f(&tx)?;
        tx.commit()?;
        Ok(out)
    }

    /// Phase, epoch and next sample id.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`] or [`RepoError::Corrupt`].
    pub fn run_state(&self) -> Result<(Phase, u64, u64), RepoError> {
        let conn = self.lock();
        let (phase, epoch, next): (String, i64, i64) = conn.query_row(
            "SELECT phase, epoch, next_sample FROM run_state WHERE id = 0",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?;
        let phase = match phase.as_str() {
            "training" => Phase::Training,
            "uploading" => Phase::Uploading,
            "merging" => Phase::Merging,
            other => return Err(RepoError::Corrupt(format!("phase {other:?}"))),
        };
        Ok((phase, to_u64(epoch), to_u64(next)))
    }

    /// Registers `hotkey` in the least-populated section (lowest index on ties), or returns its
    /// existing section. Updates the device and `max_in_flight` it reports.
    ///
    /// # Errors
    /// [`RepoError::SectionsFull`] when every section holds `max_per_section` miners.
    pub fn register(
        &self,
        hotkey: &str,
        device: &str,
        max_in_flight: usize,
        n_sections: usize,
        max_per_section: usize,
        now_ms: u64,
    ) -> Result<usize, RepoError> {
        self.write(|tx| {
            let existing: Option<i64> = tx
                .query_row(
                    "SELECT section FROM miners WHERE hotkey = ?1",
                    [hotkey],
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(section) = existing {
                tx.execute(
                    "UPDATE miners SET device = ?2, max_in_flight = ?3, last_seen = ?4 \
                     WHERE hotkey = ?1",
                    params![hotkey, device, to_i64(max_in_flight as u64), to_i64(now_ms)],
                )?;
                return Ok(usize_of(section));
            }
            let mut counts = vec![0usize; n_sections];
            let mut stmt = tx.prepare("SELECT section, COUNT(*) FROM miners GROUP BY section")?;
            let rows = stmt.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))?;
            for row in rows {
                let (section, count) = row?;
                if let Some(c) = counts.get_mut(usize_of(section)) {
                    *c = usize_of(count);
                }
            }
            drop(stmt);
            let section = counts
                .iter()
                .enumerate()
                .filter(|(_, c)| **c < max_per_section)
                .min_by_key(|(i, c)| (**c, *i))
                .map(|(i, _)| i)
                .ok_or(RepoError::SectionsFull {
                    max: max_per_section,
                })?;
            tx.execute(
                "INSERT INTO miners (hotkey, section, registered_at, last_seen, device, \
                 max_in_flight) VALUES (?1, ?2, ?3, ?3, ?4, ?5)",
                params![
                    hotkey,
                    to_i64(section as u64),
                    to_i64(now_ms),
                    device,
                    to_i64(max_in_flight as u64)
                ],
            )?;
            Ok(section)
        })
    }

    /// The miner registered under `hotkey`, if any.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn miner(&self, hotkey: &str) -> Result<Option<MinerRow>, RepoError> {
        let conn = self.lock();
        Ok(conn
            .query_row(
                &format!("SELECT {MINER_COLUMNS} FROM miners WHERE hotkey = ?1"),
                [hotkey],
                read_miner,
            )
            .optional()?)
    }

    /// Every registered miner, by section then registration time.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn miners(&self) -> Result<Vec<MinerRow>, RepoError> {
        let conn = self.lock();
        let mut stmt = conn.prepare(&format!(
            "SELECT {MINER_COLUMNS} FROM miners ORDER BY section, registered_at, hotkey"
        ))?;
        let rows = stmt.query_map([], read_miner)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Records that `hotkey` was seen now.
    ///
    /// # Errors
    /// [`RepoError::NotRegistered`].
    pub fn touch(&self, hotkey: &str, now_ms: u64) -> Result<(), RepoError> {
        self.write(|tx| {
            let n = tx.execute(
                "UPDATE miners SET last_seen = ?2 WHERE hotkey = ?1",
                params![hotkey, to_i64(now_ms)],
            )?;
            if n == 0 {
                return Err(RepoError::NotRegistered {
                    hotkey: hotkey.to_string(),
                });
            }
            Ok(())
        })
    }

    /// Records a signature id until `expires_ms`; `false` when it was already recorded (a
    /// replay). Also forgets ids that expired before `now_ms`.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn record_signature(
        &self,
        id: &str,
        expires_ms: u64,
        now_ms: u64,
    ) -> Result<bool, RepoError> {
        self.write(|tx| {
            tx.execute(
                "DELETE FROM seen_signatures WHERE expires_at < ?1",
                [to_i64(now_ms)],
            )?;
            let n = tx.execute(
                "INSERT OR IGNORE INTO seen_signatures (id, expires_at) VALUES (?1, ?2)",
                params![id, to_i64(expires_ms)],
            )?;
            Ok(n == 1)
        })
    }

    /// Number of remembered signature ids (tests and metrics).
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn signature_count(&self) -> Result<u64, RepoError> {
        let conn = self.lock();
        let n: i64 = conn.query_row("SELECT COUNT(*) FROM seen_signatures", [], |r| r.get(0))?;
        Ok(to_u64(n))
    }

    /// One assignment by id.
    ///
    /// # Errors
    /// [`RepoError::UnknownAssignment`].
    pub fn assignment(&self, id: u64, tail: usize) -> Result<AssignmentRow, RepoError> {
        let conn = self.lock();
        get_assignment(&conn, id, tail)
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
        let conn = self.lock();
        let mut stmt = conn.prepare(&format!(
            "SELECT {ASSIGNMENT_COLUMNS} FROM assignments a JOIN samples s ON s.id = a.sample \
             WHERE a.sample = ?1 ORDER BY a.id"
        ))?;
        let rows = stmt.query_map([to_i64(sample)], read_assignment)?;
        rows.map(|r| r?.finish(Some(tail))).collect()
    }

    /// Hands `hotkey` up to `max` assignments: its pending backwards first, then open forwards
    /// of its section within its in-flight allowance. For a head miner it also says how many
    /// new samples it may start ([`Repository::start_sample`]).
    ///
    /// # Errors
    /// [`RepoError::NotRegistered`], [`RepoError::Sqlite`].
    pub fn take_work(
        &self,
        hotkey: &str,
        max: usize,
        limits: RoutingLimits,
        now_ms: u64,
    ) -> Result<WorkTaken, RepoError> {
        self.write(|tx| {
            let miner = tx
                .query_row(
                    &format!("SELECT {MINER_COLUMNS} FROM miners WHERE hotkey = ?1"),
                    [hotkey],
                    read_miner,
                )
                .optional()?
                .ok_or_else(|| RepoError::NotRegistered {
                    hotkey: hotkey.to_string(),
                })?;
            tx.execute(
                "UPDATE miners SET last_seen = ?2 WHERE hotkey = ?1",
                params![hotkey, to_i64(now_ms)],
            )?;
            let section = to_i64(miner.section as u64);
            let mut out = Vec::new();
            // 1. Backwards waiting for this miner.
            let ids: Vec<i64> = {
                let mut stmt = tx.prepare(
                    "SELECT id FROM assignments WHERE miner = ?1 AND kind = 'backward' \
                     AND state = 'assigned' AND delivered = 0 ORDER BY id LIMIT ?2",
                )?;
                let rows = stmt.query_map(params![hotkey, to_i64(max as u64)], |r| r.get(0))?;
                rows.collect::<Result<_, _>>()?
            };
            for id in ids {
                tx.execute("UPDATE assignments SET delivered = 1 WHERE id = ?1", [id])?;
                out.push(get_assignment(tx, to_u64(id), limits.tail)?);
            }
            // 2. Forwards within the in-flight allowance.
            let in_flight: i64 = tx.query_row(
                "SELECT COUNT(*) FROM pathway p JOIN samples s ON s.id = p.sample \
                 WHERE p.miner = ?1 AND p.section = ?2 AND p.backward_done = 0 \
                 AND s.outcome = 'active'",
                params![hotkey, section],
                |r| r.get(0),
            )?;
            let allowance = limits
                .max_in_flight
                .min(miner.max_in_flight.max(1))
                .saturating_sub(usize_of(in_flight));
            let mut wanted = allowance.min(max.saturating_sub(out.len()));
            let open: Vec<i64> = {
                let mut stmt = tx.prepare(
                    "SELECT id FROM assignments WHERE state = 'open' AND section = ?1 \
                     AND kind = 'forward' ORDER BY id LIMIT ?2",
                )?;
                let rows = stmt.query_map(params![section, to_i64(wanted as u64)], |r| r.get(0))?;
                rows.collect::<Result<_, _>>()?
            };
            for id in open {
                tx.execute(
                    "UPDATE assignments SET state = 'assigned', miner = ?2, deadline = ?3, \
                     delivered = 1 WHERE id = ?1",
                    params![id, hotkey, to_i64(now_ms.saturating_add(limits.forward_ms))],
                )?;
                let row = get_assignment(tx, to_u64(id), limits.tail)?;
                tx.execute(
                    "INSERT OR REPLACE INTO pathway (sample, section, miner, backward_done) \
                     VALUES (?1, ?2, ?3, 0)",
                    params![to_i64(row.sample), section, hotkey],
                )?;
                out.push(row);
                wanted = wanted.saturating_sub(1);
            }
            let head_capacity = if miner.section == 0 { wanted } else { 0 };
            Ok(WorkTaken {
                assignments: out,
                head_capacity,
            })
        })
    }

    /// Starts sample unit `sample` (which must be the run's next one, below `budget`), with
    /// its head forward assigned to `hotkey`. The caller has stored its token ids and targets
    /// (hashes given) beforehand. Returns `None` when the budget is spent.
    ///
    /// # Errors
    /// [`RepoError::SampleOrder`] when another sample took the id first.
    #[allow(clippy::too_many_arguments)]
    pub fn start_sample(
        &self,
        sample: u64,
        tokens_hash: &str,
        targets_hash: &str,
        hotkey: &str,
        budget: Option<u64>,
        limits: RoutingLimits,
        now_ms: u64,
    ) -> Result<Option<AssignmentRow>, RepoError> {
        self.write(|tx| {
            let (epoch, next): (i64, i64) = tx.query_row(
                "SELECT epoch, next_sample FROM run_state WHERE id = 0",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            if to_u64(next) != sample {
                return Err(RepoError::SampleOrder {
                    expected: to_u64(next),
                    got: sample,
                });
            }
            if budget.is_some_and(|b| sample >= b) {
                return Ok(None);
            }
            tx.execute(
                "INSERT INTO samples (id, epoch, outcome, tokens_hash, targets_hash, started_at) \
                 VALUES (?1, ?2, 'active', ?3, ?4, ?5)",
                params![
                    to_i64(sample),
                    epoch,
                    tokens_hash,
                    targets_hash,
                    to_i64(now_ms)
                ],
            )?;
            tx.execute(
                "UPDATE run_state SET next_sample = ?1 WHERE id = 0",
                [to_i64(sample + 1)],
            )?;
            tx.execute(
                "INSERT INTO assignments (sample, epoch, section, kind, miner, deadline, state, \
                 delivered, input_hash, created_at) \
                 VALUES (?1, ?2, 0, 'forward', ?3, ?4, 'assigned', 1, ?5, ?6)",
                params![
                    to_i64(sample),
                    epoch,
                    hotkey,
                    to_i64(now_ms.saturating_add(limits.forward_ms)),
                    tokens_hash,
                    to_i64(now_ms)
                ],
            )?;
            let id = to_u64(tx.last_insert_rowid());
            tx.execute(
                "INSERT OR REPLACE INTO pathway (sample, section, miner, backward_done) \
                 VALUES (?1, 0, ?2, 0)",
                params![to_i64(sample), hotkey],
            )?;
            Ok(Some(get_assignment(tx, id, limits.tail)?))
        })
    }

    /// Checks that `hotkey` holds assignment `id` and that it is waiting for a result.
    ///
    /// # Errors
    /// [`RepoError::UnknownAssignment`], [`RepoError::NotHolder`], [`RepoError::NotAssigned`].
    pub fn held(&self, id: u64, hotkey: &str, tail: usize) -> Result<AssignmentRow, RepoError> {
        let conn = self.lock();
        let row = get_assignment(&conn, id, tail)?;
        check_held(&row, hotkey)?;
        Ok(row)
    }

    /// Accepts the result of assignment `id` from `hotkey` and routes the next piece of work:
    /// a forward output becomes an open forward of the next section; the tail's input gradient
    /// or a backward's becomes a backward of the previous section for the miner that ran its
    /// forward; the head's backward completes the sample.
    ///
    /// # Errors
    /// As [`Repository::held`].
    pub fn accept(
        &self,
        id: u64,
        hotkey: &str,
        result: &Accepted,
        limits: RoutingLimits,
        now_ms: u64,
    ) -> Result<(), RepoError> {
        self.write(|tx| {
            let row = get_assignment(tx, id, limits.tail)?;
            check_held(&row, hotkey)?;
            let output_hash = result.output_hash.clone().unwrap_or_default();
            tx.execute(
                "UPDATE assignments SET state = 'done', output_hash = ?2, finished_at = ?3, \
                 download_ms = ?4, compute_ms = ?5, upload_ms = ?6 WHERE id = ?1",
                params![
                    to_i64(id),
                    result.output_hash,
                    to_i64(now_ms),
                    to_i64(result.timings.download_ms),
                    to_i64(result.timings.compute_ms),
                    to_i64(result.timings.upload_ms)
                ],
            )?;
            let sample = to_i64(row.sample);
            let section = row.section;
            let backward_done = |s: usize| -> Result<(), RepoError> {
                tx.execute(
                    "UPDATE pathway SET backward_done = 1 WHERE sample = ?1 AND section = ?2",
                    params![sample, to_i64(s as u64)],
                )?;
                Ok(())
            };
            let next_step = match row.kind {
                WorkKind::Forward if section < limits.tail => {
                    tx.execute(
                        "UPDATE miners SET forwards = forwards + 1 WHERE hotkey = ?1",
                        [hotkey],
                    )?;
                    tx.execute(
                        "INSERT INTO assignments (sample, epoch, section, kind, state, \
                         input_hash, created_at) VALUES (?1, ?2, ?3, 'forward', 'open', ?4, ?5)",
                        params![
                            sample,
                            to_i64(row.epoch),
                            to_i64(section as u64 + 1),
                            output_hash,
                            to_i64(now_ms)
                        ],
                    )?;
                    None
                }
                WorkKind::Forward => {
                    tx.execute(
                        "UPDATE miners SET forwards = forwards + 1, backwards = backwards + 1 \
                         WHERE hotkey = ?1",
                        [hotkey],
                    )?;
                    tx.execute(
                        "UPDATE samples SET loss = ?2 WHERE id = ?1",
                        params![sample, result.loss.map(f64::from)],
                    )?;
                    backward_done(section)?;
                    section.checked_sub(1)
                }
                WorkKind::Backward => {
                    tx.execute(
                        "UPDATE miners SET backwards = backwards + 1 WHERE hotkey = ?1",
                        [hotkey],
                    )?;
                    backward_done(section)?;
                    section.checked_sub(1)
                }
            };
            let done_at_head = row.kind == WorkKind::Backward && section == 0
                || row.kind == WorkKind::Forward && section == limits.tail && section == 0;
            if done_at_head {
                tx.execute(
                    "UPDATE samples SET outcome = 'completed', finished_at = ?2 WHERE id = ?1",
                    params![sample, to_i64(now_ms)],
                )?;
            } else if let Some(prev) = next_step {
                let owner: Option<String> = tx
                    .query_row(
                        "SELECT miner FROM pathway WHERE sample = ?1 AND section = ?2",
                        params![sample, to_i64(prev as u64)],
                        |r| r.get(0),
                    )
                    .optional()?;
                match owner {
                    Some(owner) => {
                        insert_backward(tx, &row, prev, &owner, &output_hash, 0, limits, now_ms)?;
                    }
                    None => drop_sample(
                        tx,
                        row.sample,
                        &format!("no miner on record for the forward of section {prev}"),
                        now_ms,
                    )?,
                }
            }
            Ok(())
        })
    }

    /// Refuses the result of assignment `id` (bad payload): records `reason`, penalises the
    /// miner and re-offers the work (see the module documentation).
    ///
    /// # Errors
    /// As [`Repository::held`].
    pub fn refuse(
        &self,
        id: u64,
        hotkey: &str,
        reason: &str,
        limits: RoutingLimits,
        now_ms: u64,
    ) -> Result<Fallout, RepoError> {
        self.write(|tx| {
            let row = get_assignment(tx, id, limits.tail)?;
            check_held(&row, hotkey)?;
            let reason = format!("refused result from {hotkey}: {reason}");
            set_state(tx, id, AssignmentState::Failed, &reason, now_ms)?;
            penalise(tx, hotkey, Some(id), &reason, now_ms)?;
            reoffer(tx, &row, &reason, true, limits, now_ms)
        })
    }

    /// Hands assignments back (miner shutdown): forwards are re-offered without penalty;
    /// a released backward drops its sample (only this miner held the forward's input).
    /// Ids that `hotkey` does not hold are ignored. Returns what happened to each released one.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn release(
        &self,
        hotkey: &str,
        ids: &[u64],
        limits: RoutingLimits,
        now_ms: u64,
    ) -> Result<Vec<Fallout>, RepoError> {
        self.write(|tx| {
            let mut out = Vec::new();
            for &id in ids {
                let row = match get_assignment(tx, id, limits.tail) {
                    Ok(row) => row,
                    Err(RepoError::UnknownAssignment { .. }) => continue,
                    Err(e) => return Err(e),
                };
                if check_held(&row, hotkey).is_err() {
                    continue;
                }
                let reason = format!("released by {hotkey}");
                set_state(tx, id, AssignmentState::Released, &reason, now_ms)?;
                out.push(reoffer(tx, &row, &reason, false, limits, now_ms)?);
            }
            Ok(out)
        })
    }

    /// Expires every held assignment whose deadline is before `now_ms`: penalises its miner,
    /// re-offers a forward, drops the sample of a backward. Returns what happened.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn expire(&self, limits: RoutingLimits, now_ms: u64) -> Result<Vec<Fallout>, RepoError> {
        self.write(|tx| {
            let ids: Vec<i64> = {
                let mut stmt = tx.prepare(
                    "SELECT id FROM assignments WHERE state = 'assigned' AND deadline < ?1 \
                     ORDER BY id",
                )?;
                let rows = stmt.query_map([to_i64(now_ms)], |r| r.get(0))?;
                rows.collect::<Result<_, _>>()?
            };
            let mut out = Vec::new();
            for id in ids {
                let row = get_assignment(tx, to_u64(id), limits.tail)?;
                // An earlier expiry in this loop may have cancelled it (same sample).
                if row.state != AssignmentState::Assigned {
                    continue;
                }
                let miner = row.miner.clone().unwrap_or_default();
                let kind = kind_str(row.kind);
                let reason = format!(
                    "{kind} of section {} missed its deadline (miner {miner})",
                    row.section
                );
                set_state(tx, row.id, AssignmentState::Expired, &reason, now_ms)?;
                penalise(tx, &miner, Some(row.id), &reason, now_ms)?;
                out.push(match row.kind {
                    WorkKind::Forward => reoffer(tx, &row, &reason, true, limits, now_ms)?,
                    WorkKind::Backward => {
                        drop_sample(tx, row.sample, &reason, now_ms)?;
                        Fallout::Dropped {
                            sample: row.sample,
                            reason,
                        }
                    }
                });
            }
            Ok(out)
        })
    }

    /// One sample of the ledger.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`] or [`RepoError::Corrupt`].
    pub fn sample(&self, id: u64) -> Result<Option<SampleRow>, RepoError> {
        let conn = self.lock();
        let raw = conn
            .query_row(
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
    }

    /// The miners that ran each section's forward of `sample`, by section.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn pathway(&self, sample: u64) -> Result<Vec<(usize, String)>, RepoError> {
        let conn = self.lock();
        let mut stmt =
            conn.prepare("SELECT section, miner FROM pathway WHERE sample = ?1 ORDER BY section")?;
        let rows = stmt.query_map([to_i64(sample)], |r| {
            Ok((usize_of(r.get(0)?), r.get::<_, String>(1)?))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Completed, dropped and active sample counts.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn counts(&self) -> Result<LedgerCounts, RepoError> {
        let conn = self.lock();
        let mut counts = LedgerCounts::default();
        let mut stmt = conn.prepare("SELECT outcome, COUNT(*) FROM samples GROUP BY outcome")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        for row in rows {
            let (outcome, n) = row?;
            match SampleOutcome::parse(&outcome)? {
                SampleOutcome::Active => counts.active = to_u64(n),
                SampleOutcome::Completed => counts.completed = to_u64(n),
                SampleOutcome::Dropped => counts.dropped = to_u64(n),
            }
        }
        Ok(counts)
    }

    /// Mean loss of the last `n` completed samples, and how many completed at or after
    /// `since_ms`.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn recent(&self, n: usize, since_ms: u64) -> Result<(Option<f32>, u64), RepoError> {
        let conn = self.lock();
        let mean: Option<f64> = conn.query_row(
            "SELECT AVG(loss) FROM (SELECT loss FROM samples WHERE outcome = 'completed' \
             AND loss IS NOT NULL ORDER BY finished_at DESC, id DESC LIMIT ?1)",
            [to_i64(n as u64)],
            |r| r.get(0),
        )?;
        let done: i64 = conn.query_row(
            "SELECT COUNT(*) FROM samples WHERE outcome = 'completed' AND finished_at >= ?1",
            [to_i64(since_ms)],
            |r| r.get(0),
        )?;
        Ok((mean.map(|m| m as f32), to_u64(done)))
    }
}

fn get_assignment(conn: &Connection, id: u64, tail: usize) -> Result<AssignmentRow, RepoError> {
    conn.query_row(
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

fn check_held(row: &AssignmentRow, hotkey: &str) -> Result<(), RepoError> {
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

fn set_state(
    tx: &Connection,
    id: u64,
    state: AssignmentState,
    reason: &str,
    now_ms: u64,
) -> Result<(), RepoError> {
    tx.execute(
        "UPDATE assignments SET state = ?2, reason = ?3, finished_at = ?4 WHERE id = ?1",
        params![to_i64(id), state.as_str(), reason, to_i64(now_ms)],
    )?;
    Ok(())
}

/// Records a penalty against `hotkey`, for an assignment or (`None`) for its part in a merge.
pub(super) fn penalise(
    tx: &Connection,
    hotkey: &str,
    assignment: Option<u64>,
    reason: &str,
    now_ms: u64,
) -> Result<(), RepoError> {
    tx.execute(
        "UPDATE miners SET penalties = penalties + 1 WHERE hotkey = ?1",
        [hotkey],
    )?;
    tx.execute(
        "INSERT INTO penalties (miner, at, assignment, reason) VALUES (?1, ?2, ?3, ?4)",
        params![hotkey, to_i64(now_ms), assignment.map(to_i64), reason],
    )?;
    Ok(())
}

pub(super) fn drop_sample(
    tx: &Connection,
    sample: u64,
    reason: &str,
    now_ms: u64,
) -> Result<(), RepoError> {
    tx.execute(
        "UPDATE samples SET outcome = 'dropped', reason = ?2, finished_at = ?3 \
         WHERE id = ?1 AND outcome = 'active'",
        params![to_i64(sample), reason, to_i64(now_ms)],
    )?;
    tx.execute(
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

#[allow(clippy::too_many_arguments)]
fn insert_backward(
    tx: &Connection,
    row: &AssignmentRow,
    section: usize,
    owner: &str,
    input_hash: &str,
    attempts: u32,
    limits: RoutingLimits,
    now_ms: u64,
) -> Result<u64, RepoError> {
    tx.execute(
        "INSERT INTO assignments (sample, epoch, section, kind, miner, deadline, state, \
         delivered, input_hash, attempts, created_at) \
         VALUES (?1, ?2, ?3, 'backward', ?4, ?5, 'assigned', 0, ?6, ?7, ?8)",
        params![
            to_i64(row.sample),
            to_i64(row.epoch),
            to_i64(section as u64),
            owner,
            to_i64(now_ms.saturating_add(limits.backward_ms)),
            input_hash,
            i64::from(attempts),
            to_i64(now_ms)
        ],
    )?;
    Ok(to_u64(tx.last_insert_rowid()))
}

/// Re-offers the work of `row` after it failed (`counts` says whether the failure counts
/// towards [`MAX_ATTEMPTS`]).
fn reoffer(
    tx: &Connection,
    row: &AssignmentRow,
    reason: &str,
    counts: bool,
    limits: RoutingLimits,
    now_ms: u64,
) -> Result<Fallout, RepoError> {
    let attempts = if counts {
        row.attempts + 1
    } else {
        row.attempts
    };
    if attempts >= MAX_ATTEMPTS {
        let reason = format!("{reason}; gave up after {attempts} attempts");
        drop_sample(tx, row.sample, &reason, now_ms)?;
        return Ok(Fallout::Dropped {
            sample: row.sample,
            reason,
        });
    }
    match row.kind {
        WorkKind::Forward => {
            tx.execute(
                "DELETE FROM pathway WHERE sample = ?1 AND section = ?2",
                params![to_i64(row.sample), to_i64(row.section as u64)],
            )?;
            tx.execute(
                "INSERT INTO assignments (sample, epoch, section, kind, state, input_hash, \
                 attempts, created_at) VALUES (?1, ?2, ?3, 'forward', 'open', ?4, ?5, ?6)",
                params![
                    to_i64(row.sample),
                    to_i64(row.epoch),
                    to_i64(row.section as u64),
                    row.input_hash,
                    i64::from(attempts),
                    to_i64(now_ms)
                ],
            )?;
            Ok(Fallout::Reoffered {
                assignment: to_u64(tx.last_insert_rowid()),
            })
        }
        WorkKind::Backward if counts => {
            let owner = row.miner.clone().unwrap_or_default();
            let id = insert_backward(
                tx,
                row,
                row.section,
                &owner,
                &row.input_hash,
                attempts,
                limits,
                now_ms,
            )?;
            Ok(Fallout::RetriedBackward { assignment: id })
        }
        WorkKind::Backward => {
            drop_sample(tx, row.sample, reason, now_ms)?;
            Ok(Fallout::Dropped {
                sample: row.sample,
                reason: reason.to_string(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: RoutingLimits = RoutingLimits {
        forward_ms: 1_000,
        backward_ms: 2_000,
        max_in_flight: 2,
        tail: 2,
    };
    const T0: u64 = 1_000_000;

    /// Three sections, miners a0/a1 (head), b0/b1 (middle), c0 (tail).
    fn network() -> Repository {
        let repo = Repository::open_in_memory().unwrap();
        for (i, hk) in ["a0", "b0", "c0", "a1", "b1"].iter().enumerate() {
            let section = repo.register(hk, "cpu", 8, 3, 50, T0 + i as u64).unwrap();
            assert_eq!(section, [0, 1, 2, 0, 1][i], "{hk}");
        }
        repo
    }

    fn ok(hash: &str) -> Accepted {
        Accepted {
            output_hash: Some(hash.into()),
            loss: Some(2.5),
            timings: Default::default(),
        }
    }

    /// Starts sample `u` at the head and returns its assignment id.
    fn start(repo: &Repository, u: u64) -> u64 {
        repo.start_sample(u, "tok", "tgt", "a0", None, LIMITS, T0)
            .unwrap()
            .unwrap()
            .id
    }

    #[test]
    fn registration_balances_and_remembers() {
        let repo = Repository::open_in_memory().unwrap();
        let sections: Vec<usize> = (0..7)
            .map(|i| repo.register(&format!("m{i}"), "cpu", 1, 3, 3, 0).unwrap())
            .collect();
        assert_eq!(sections, vec![0, 1, 2, 0, 1, 2, 0]);
        // Re-registering keeps the section, even when another section is emptier.
        assert_eq!(repo.register("m6", "gpu", 2, 3, 3, 5).unwrap(), 0);
        assert_eq!(repo.miner("m6").unwrap().unwrap().device, "gpu");
        assert_eq!(repo.miners().unwrap().len(), 7);
        repo.register("m7", "cpu", 1, 3, 3, 0).unwrap();
        repo.register("m8", "cpu", 1, 3, 3, 0).unwrap();
        assert!(matches!(
            repo.register("m9", "cpu", 1, 3, 3, 0),
            Err(RepoError::SectionsFull { max: 3 })
        ));
    }

    #[test]
    fn a_sample_travels_forward_then_backward_through_the_forward_miners() {
        let repo = network();
        let f0 = start(&repo, 0);
        repo.accept(f0, "a0", &ok("h0"), LIMITS, T0 + 10).unwrap();
        // The head's output is an open forward of section 1, taken by whoever asks.
        let w = repo.take_work("b1", 4, LIMITS, T0 + 20).unwrap();
        assert_eq!(w.assignments.len(), 1);
        let f1 = &w.assignments[0];
        assert_eq!(
            (f1.section, f1.kind, f1.input_hash.as_str()),
            (1, WorkKind::Forward, "h0")
        );
        assert_eq!(f1.deadline_ms, Some(T0 + 20 + 1_000));
        assert!(
            repo.take_work("b0", 4, LIMITS, T0 + 20)
                .unwrap()
                .assignments
                .is_empty()
        );
        repo.accept(f1.id, "b1", &ok("h1"), LIMITS, T0 + 30)
            .unwrap();
        let w = repo.take_work("c0", 4, LIMITS, T0 + 40).unwrap();
        let f2 = &w.assignments[0];
        assert_eq!(f2.targets_hash.as_deref(), Some("tgt"));
        repo.accept(f2.id, "c0", &ok("g2"), LIMITS, T0 + 50)
            .unwrap();
        // The backward of section 1 goes to b1 (it ran the forward), not to b0.
        assert!(
            repo.take_work("b0", 4, LIMITS, T0 + 60)
                .unwrap()
                .assignments
                .is_empty()
        );
        let w = repo.take_work("b1", 4, LIMITS, T0 + 60).unwrap();
        let b1 = &w.assignments[0];
        assert_eq!(
            (b1.kind, b1.section, b1.input_hash.as_str()),
            (WorkKind::Backward, 1, "g2")
        );
        repo.accept(b1.id, "b1", &ok("g1"), LIMITS, T0 + 70)
            .unwrap();
        let w = repo.take_work("a0", 1, LIMITS, T0 + 80).unwrap();
        let b0 = &w.assignments[0];
        assert_eq!((b0.kind, b0.section), (WorkKind::Backward, 0));
        let none = Accepted {
            output_hash: None,
            loss: None,
            timings: Default::default(),
        };
        repo.accept(b0.id, "a0", &none, LIMITS, T0 + 90).unwrap();
        let s = repo.sample(0).unwrap().unwrap();
        assert_eq!(s.outcome, SampleOutcome::Completed);
        assert_eq!(s.loss, Some(2.5));
        assert_eq!(
            repo.pathway(0).unwrap(),
            vec![(0, "a0".into()), (1, "b1".into()), (2, "c0".into())]
        );
        let c0 = repo.miner("c0").unwrap().unwrap();
        assert_eq!((c0.forwards, c0.backwards), (1, 1));
        let b1m = repo.miner("b1").unwrap().unwrap();
        assert_eq!((b1m.forwards, b1m.backwards), (1, 1));
    }

    #[test]
    fn backward_work_is_served_first_and_in_flight_is_capped() {
        let repo = network();
        // Two samples through the head: a0 reaches its in-flight cap of 2.
        let f0 = start(&repo, 0);
        let f1 = start(&repo, 1);
        assert_eq!(
            repo.take_work("a0", 4, LIMITS, T0).unwrap().head_capacity,
            0
        );
        repo.accept(f0, "a0", &ok("x0"), LIMITS, T0).unwrap();
        repo.accept(f1, "a0", &ok("x1"), LIMITS, T0).unwrap();
        // b0 takes both forwards (cap 2); b1 then gets nothing.
        let w = repo.take_work("b0", 4, LIMITS, T0).unwrap();
        assert_eq!(w.assignments.len(), 2);
        for a in &w.assignments {
            repo.accept(a.id, "b0", &ok("y"), LIMITS, T0).unwrap();
        }
        let w = repo.take_work("c0", 1, LIMITS, T0).unwrap();
        repo.accept(w.assignments[0].id, "c0", &ok("g"), LIMITS, T0)
            .unwrap();
        // Sample 2's forward is open in section 1, and b0 has a backward: b0 asks for one
        // piece of work and gets the backward, even though the forward is older.
        let f2 = repo
            .start_sample(
                2,
                "tok",
                "tgt",
                "a0",
                None,
                RoutingLimits {
                    max_in_flight: 3,
                    ..LIMITS
                },
                T0,
            )
            .unwrap()
            .unwrap();
        repo.accept(f2.id, "a0", &ok("x2"), LIMITS, T0).unwrap();
        let w = repo
            .take_work(
                "b0",
                1,
                RoutingLimits {
                    max_in_flight: 3,
                    ..LIMITS
                },
                T0,
            )
            .unwrap();
        assert_eq!(w.assignments.len(), 1);
        assert_eq!(w.assignments[0].kind, WorkKind::Backward);
        // b0 is at its cap (two samples awaiting backward), so the open forward goes to b1.
        assert!(
            repo.take_work("b0", 4, LIMITS, T0)
                .unwrap()
                .assignments
                .is_empty()
        );
        let w = repo.take_work("b1", 4, LIMITS, T0).unwrap();
        assert_eq!(
            (w.assignments[0].sample, w.assignments[0].kind),
            (2, WorkKind::Forward)
        );
    }

    #[test]
    fn missed_forward_is_reoffered_and_missed_backward_drops_the_sample() {
        let repo = network();
        let f0 = start(&repo, 0);
        // Nothing expires before the deadline.
        assert!(repo.expire(LIMITS, T0 + 1_000).unwrap().is_empty());
        let fallout = repo.expire(LIMITS, T0 + 1_001).unwrap();
        assert!(matches!(fallout.as_slice(), [Fallout::Reoffered { .. }]));
        assert_eq!(repo.miner("a0").unwrap().unwrap().penalties, 1);
        assert!(matches!(
            repo.accept(f0, "a0", &ok("late"), LIMITS, T0 + 1_002),
            Err(RepoError::NotAssigned {
                state: AssignmentState::Expired,
                ..
            })
        ));
        // The re-offered forward goes to the next head miner that asks.
        let w = repo.take_work("a0", 4, LIMITS, T0 + 2_000).unwrap();
        let again = &w.assignments[0];
        assert_eq!((again.sample, again.section, again.attempts), (0, 0, 1));
        repo.accept(again.id, "a0", &ok("h"), LIMITS, T0 + 2_010)
            .unwrap();
        let w = repo.take_work("b0", 4, LIMITS, T0 + 2_020).unwrap();
        repo.accept(w.assignments[0].id, "b0", &ok("h1"), LIMITS, T0 + 2_030)
            .unwrap();
        let w = repo.take_work("c0", 4, LIMITS, T0 + 2_040).unwrap();
        repo.accept(w.assignments[0].id, "c0", &ok("g"), LIMITS, T0 + 2_050)
            .unwrap();
        // b0 never collects its backward: it expires 2 s later and the sample is dropped.
        let fallout = repo.expire(LIMITS, T0 + 4_051).unwrap();
        match fallout.as_slice() {
            [Fallout::Dropped { sample: 0, reason }] => {
                assert!(reason.contains("backward of section 1"), "{reason}");
                assert!(reason.contains("b0"), "{reason}");
            }
            other => panic!("unexpected {other:?}"),
        }
        let s = repo.sample(0).unwrap().unwrap();
        assert_eq!(s.outcome, SampleOutcome::Dropped);
        assert!(s.reason.unwrap().contains("deadline"));
        assert_eq!(repo.miner("b0").unwrap().unwrap().penalties, 1);
        assert_eq!(
            repo.counts().unwrap(),
            LedgerCounts {
                completed: 0,
                dropped: 1,
                active: 0
            }
        );
    }

    #[test]
    fn refused_forward_is_reoffered_and_repeated_failures_drop() {
        let repo = network();
        let mut id = start(&repo, 0);
        for attempt in 1..MAX_ATTEMPTS {
            let f = repo.refuse(id, "a0", "hash mismatch", LIMITS, T0).unwrap();
            let Fallout::Reoffered { assignment } = f else {
                panic!("attempt {attempt}: {f:?}");
            };
            let w = repo.take_work("a0", 1, LIMITS, T0).unwrap();
            assert_eq!(w.assignments[0].id, assignment);
            assert_eq!(w.assignments[0].attempts, attempt);
            id = assignment;
        }
        let f = repo.refuse(id, "a0", "hash mismatch", LIMITS, T0).unwrap();
        assert!(matches!(f, Fallout::Dropped { sample: 0, .. }), "{f:?}");
        assert_eq!(
            repo.miner("a0").unwrap().unwrap().penalties,
            u64::from(MAX_ATTEMPTS)
        );
        assert!(
            repo.sample(0)
                .unwrap()
                .unwrap()
                .reason
                .unwrap()
                .contains("hash mismatch")
        );
    }

    #[test]
    fn only_the_holder_may_submit_or_release() {
        let repo = network();
        let f0 = start(&repo, 0);
        assert!(matches!(
            repo.accept(f0, "b0", &ok("h"), LIMITS, T0),
            Err(RepoError::NotHolder { .. })
        ));
        assert!(matches!(
            repo.held(999, "a0", 2),
            Err(RepoError::UnknownAssignment { id: 999 })
        ));
        assert!(
            repo.release("b0", &[f0, 999], LIMITS, T0)
                .unwrap()
                .is_empty()
        );
        let f = repo.release("a0", &[f0], LIMITS, T0).unwrap();
        assert!(matches!(f.as_slice(), [Fallout::Reoffered { .. }]));
        assert_eq!(
            repo.miner("a0").unwrap().unwrap().penalties,
            0,
            "release is no fault"
        );
    }

    #[test]
    fn signatures_are_remembered_until_expiry() {
        let repo = Repository::open_in_memory().unwrap();
        assert!(repo.record_signature("s1", 100, 0).unwrap());
        assert!(!repo.record_signature("s1", 100, 50).unwrap());
        assert!(repo.record_signature("s2", 300, 101).unwrap());
        assert_eq!(
            repo.signature_count().unwrap(),
            1,
            "s1 expired and was forgotten"
        );
    }

    #[test]
    fn samples_start_in_order_within_the_budget() {
        let repo = network();
        assert!(matches!(
            repo.start_sample(1, "t", "t", "a0", None, LIMITS, T0),
            Err(RepoError::SampleOrder {
                expected: 0,
                got: 1
            })
        ));
        start(&repo, 0);
        assert_eq!(
            repo.start_sample(1, "t", "t", "a0", Some(1), LIMITS, T0)
                .unwrap(),
            None
        );
        assert_eq!(repo.run_state().unwrap().2, 1);
    }

    #[test]
    fn state_survives_reopening_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.sqlite");
        {
            let repo = Repository::open(&path).unwrap();
            repo.register("a0", "cpu", 4, 1, 50, T0).unwrap();
            let one = RoutingLimits { tail: 0, ..LIMITS };
            let f = repo
                .start_sample(0, "t", "g", "a0", None, one, T0)
                .unwrap()
                .unwrap();
            repo.accept(f.id, "a0", &ok("g0"), one, T0).unwrap();
            repo.start_sample(1, "t", "g", "a0", None, one, T0).unwrap();
        }
        let repo = Repository::open(&path).unwrap();
        assert_eq!(repo.miner("a0").unwrap().unwrap().forwards, 1);
        assert_eq!(
            repo.sample(0).unwrap().unwrap().outcome,
            SampleOutcome::Completed
        );
        assert_eq!(repo.run_state().unwrap().2, 2);
        // The in-flight forward of sample 1 is re-offered after its deadline.
        let f = repo
            .expire(RoutingLimits { tail: 0, ..LIMITS }, T0 + 5_000)
            .unwrap();
        assert!(matches!(f.as_slice(), [Fallout::Reoffered { .. }]));
    }
}
