//! The state store itself: one SQLite connection (WAL) behind a mutex, its transactions, and
//! the integer conversions every query uses.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rusqlite::{Connection, Transaction};

use super::schema::{ADDED_COLUMNS, ADDED_INDEXES, MERGE_SCHEMA, SCHEMA, VALIDATION_SCHEMA};
use crate::orchestrator::repo_types::RepoError;

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
        conn.execute_batch(MERGE_SCHEMA)?;
        conn.execute_batch(VALIDATION_SCHEMA)?;
        for (table, column, decl) in ADDED_COLUMNS {
            add_column_if_missing(&conn, table, column, decl)?;
        }
        conn.execute_batch(ADDED_INDEXES)?;
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
}

/// Adds `column` to `table` in a state file created before the column existed (the schema's
/// `CREATE TABLE IF NOT EXISTS` leaves an existing table as it is).
fn add_column_if_missing(
    conn: &Connection,
    table: &str,
    column: &str,
    decl: &str,
) -> Result<(), RepoError> {
    let present: bool = conn.query_row(
        &format!("SELECT COUNT(*) > 0 FROM pragma_table_info('{table}') WHERE name = ?1"),
        [column],
        |r| r.get(0),
    )?;
    if !present {
        conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
    }
    Ok(())
}
