//! Miners: registration (sections balanced, a returning hotkey keeps its section), liveness and
//! the weights they report.

use rusqlite::{OptionalExtension, params};

use super::db::{Repository, to_i64, usize_of};
use super::rows::{MINER_COLUMNS, read_miner};
use crate::orchestrator::repo_types::{MinerRow, RepoError};

impl Repository {
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
        self.write(|tx| {
            tx.execute(
                "UPDATE miners SET weights_epoch = ?2, weights_hash = ?3 WHERE hotkey = ?1",
                params![hotkey, to_i64(epoch), hash],
            )?;
            Ok(())
        })
    }
}
