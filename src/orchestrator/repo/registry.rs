//! Miners: registration (sections balanced, a returning hotkey keeps its section), liveness and
//! the weights they report.

use rusqlite::{Connection, OptionalExtension, params};

use super::db::{Cached, Repository, to_i64, usize_of};
use super::rows::{MINER_COLUMNS, read_miner};
use super::standing::HOLDS_SEAT;
use crate::orchestrator::repo_types::{MinerRow, RepoError};

impl Repository {
    /// Registers `hotkey` in the section with the fewest seats taken (lowest index on ties), or
    /// returns its existing section. A seat is held by a miner seen within the TTL and not
    /// excluded ([`super::standing`]), so silent or excluded hotkeys do not fill a section for
    /// good. A returning miner keeps its section unless it had lost its seat and the section
    /// has filled up meanwhile; then it is placed like a new one. Updates the device and
    /// `max_in_flight` it reports.
    ///
    /// # Errors
    /// [`RepoError::SectionsFull`] when every section holds `max_per_section` seated miners.
    pub fn register(
        &self,
        hotkey: &str,
        device: &str,
        max_in_flight: usize,
        n_sections: usize,
        max_per_section: usize,
        now_ms: u64,
    ) -> Result<usize, RepoError> {
        let policy = self.standing;
        self.write(|tx| {
            let existing: Option<(i64, bool)> = tx
                .query_row_cached(
                    &format!("SELECT section, {HOLDS_SEAT} FROM miners WHERE hotkey = ?4"),
                    params![
                        to_i64(now_ms),
                        to_i64(policy.miner_ttl_ms),
                        i64::from(policy.exclude_after),
                        hotkey
                    ],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let mut seats = vec![0usize; n_sections];
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT section, COUNT(*) FROM miners WHERE {HOLDS_SEAT} AND hotkey != ?4 \
                 GROUP BY section"
            ))?;
            let rows = stmt.query_map(
                params![
                    to_i64(now_ms),
                    to_i64(policy.miner_ttl_ms),
                    i64::from(policy.exclude_after),
                    hotkey
                ],
                |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
            )?;
            for row in rows {
                let (section, count) = row?;
                if let Some(c) = seats.get_mut(usize_of(section)) {
                    *c = usize_of(count);
                }
            }
            drop(stmt);
            let has_room = |s: usize| seats.get(s).is_some_and(|c| *c < max_per_section);
            if let Some((section, seated)) = existing {
                let section = usize_of(section);
                let section = if seated || has_room(section) {
                    section
                } else {
                    least_taken(&seats, max_per_section)?
                };
                tx.execute_cached(
                    "UPDATE miners SET device = ?2, max_in_flight = ?3, last_seen = ?4, \
                     section = ?5 WHERE hotkey = ?1",
                    params![
                        hotkey,
                        device,
                        to_i64(max_in_flight as u64),
                        to_i64(now_ms),
                        to_i64(section as u64)
                    ],
                )?;
                return Ok(section);
            }
            let section = least_taken(&seats, max_per_section)?;
            tx.execute_cached(
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
        self.read_hot(|conn| {
            Ok(conn
                .query_row_cached(
                    &format!("SELECT {MINER_COLUMNS} FROM miners WHERE hotkey = ?1"),
                    [hotkey],
                    read_miner,
                )
                .optional()?)
        })
    }

    /// Every registered miner, by section then registration time.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn miners(&self) -> Result<Vec<MinerRow>, RepoError> {
        self.read(miners_in)
    }

    /// Records that `hotkey` was seen now.
    ///
    /// # Errors
    /// [`RepoError::NotRegistered`].
    pub fn touch(&self, hotkey: &str, now_ms: u64) -> Result<(), RepoError> {
        self.write_hot(|tx| {
            let n = tx.execute_cached(
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

    /// Records the weights a miner reports holding (heartbeat).
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn set_weights(
        &self,
        hotkey: &str,
        epoch: u64,
        hash: Option<&str>,
    ) -> Result<(), RepoError> {
        self.write_hot(|tx| {
            tx.execute_cached(
                "UPDATE miners SET weights_epoch = ?2, weights_hash = ?3 WHERE hotkey = ?1",
                params![hotkey, to_i64(epoch), hash],
            )?;
            Ok(())
        })
    }
}

/// Every registered miner, by section then registration time, read on `conn`.
pub(super) fn miners_in(conn: &Connection) -> Result<Vec<MinerRow>, RepoError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {MINER_COLUMNS} FROM miners ORDER BY section, registered_at, hotkey"
    ))?;
    let rows = stmt.query_map([], read_miner)?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

/// The section with the fewest seats taken that still has room (lowest index on ties).
fn least_taken(seats: &[usize], max_per_section: usize) -> Result<usize, RepoError> {
    seats
        .iter()
        .enumerate()
        .filter(|(_, c)| **c < max_per_section)
        .min_by_key(|(i, c)| (**c, *i))
        .map(|(i, _)| i)
        .ok_or(RepoError::SectionsFull {
            max: max_per_section,
        })
}
