//! The state store itself: one SQLite connection (WAL) behind a mutex, its transactions, and
//! the integer conversions every query uses.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rusqlite::config::DbConfig;
use rusqlite::{Connection, Params, Row, Transaction};

use super::checkpoints::{self, Checkpoints};
use super::policy::Standing;
use super::schema::{
    ADDED_COLUMNS, ADDED_INDEXES, COUNTER_BACKFILL, COUNTER_SCHEMA, MERGE_SCHEMA, SCHEMA,
    VALIDATION_SCHEMA,
};
use crate::api::EpochSummary;
use crate::orchestrator::repo_types::RepoError;

/// The state store. Cheap to share behind an `Arc`; calls are serialised by an inner mutex.
#[derive(Debug)]
pub struct Repository {
    conn: Mutex<Connection>,
    /// How penalties act on routing and when a silent miner loses its seat.
    pub(super) standing: Standing,
    /// Loss summaries of epochs whose training is over ([`super::epochs`]).
    pub(super) epochs: Mutex<BTreeMap<u64, EpochSummary>>,
    /// The WAL's checkpoints in the background (a file store).
    checkpoints: Option<Checkpoints>,
}

/// Prepared statements kept per connection: more than the distinct statements the store runs,
/// so that none is parsed twice.
const STATEMENT_CACHE: usize = 256;

/// Statements run through the connection's cache of prepared statements. Parsing and planning
/// a statement cost more CPU than running most of the store's queries (`perf` of the
/// orchestrator under `iota bench orchestrator`), and every request runs several.
pub(super) trait Cached {
    /// [`Connection::execute`] with the statement prepared once per connection.
    fn execute_cached<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;

    /// [`Connection::query_row`] with the statement prepared once per connection.
    fn query_row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>;
}

impl Cached for Connection {
    fn execute_cached<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn query_row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }
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
    /// Opens (creating if needed) the state file at `path`, in WAL mode, with most of the
    /// log's checkpointing on a thread of its own ([`super::checkpoints`]): the commits then
    /// checkpoint only every [`checkpoints::COMMIT_PAGES`] pages of log instead of SQLite's
    /// 1,000.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`] when the file cannot be opened or the schema cannot be created.
    pub fn open(path: &Path) -> Result<Self, RepoError> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let background = Checkpoints::start(path, checkpoints::EVERY);
        if background.is_some() {
            conn.pragma_update(None, "wal_autocheckpoint", checkpoints::COMMIT_PAGES)?;
        }
        let mut repo = Self::init(conn)?;
        repo.checkpoints = background;
        Ok(repo)
    }

    /// Whether the WAL is also checkpointed in the background ([`super::checkpoints`]).
    pub fn checkpoints_in_background(&self) -> bool {
        self.checkpoints.is_some()
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
        // The counters come after the added columns (`samples.kind`), and are filled from an
        // older ledger before any trigger fires on it.
        conn.execute_batch(COUNTER_SCHEMA)?;
        conn.execute_batch(COUNTER_BACKFILL)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        // Without the query planner's stability guarantee, SQLite marks a cached statement
        // whose `LIMIT ?` is a bound parameter as expired whenever that parameter is bound
        // again, and parses and plans it anew on every run (`sqlite3Reprepare`: 6% of the
        // orchestrator's CPU under `iota bench orchestrator`, all in `take_work`). The plans
        // do not depend on bound values here (no `ANALYZE` statistics, no `LIKE ?`).
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
        Ok(Self {
            conn: Mutex::new(conn),
            standing: Standing::default(),
            epochs: Mutex::new(BTreeMap::new()),
            checkpoints: None,
        })
    }

    /// The same store under the standing policy `standing` (default: [`Standing::default`]).
    pub fn with_standing(mut self, standing: Standing) -> Self {
        self.standing = standing;
        self
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave a half-done transaction behind (it rolls
        // back on drop), so a poisoned lock is safe to reuse.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The `EXPLAIN QUERY PLAN` of `sql` (parameters unbound), one step per line (tests).
    ///
    /// # Errors
    /// [`RepoError::Sqlite`] when `sql` does not prepare.
    #[cfg(test)]
    pub(super) fn query_plan(&self, sql: &str) -> Result<String, RepoError> {
        self.read(|conn| {
            let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
            // Unbound parameters read as NULL, which leaves the plan as it is.
            let mut rows = stmt.raw_query();
            let mut steps = Vec::new();
            while let Some(row) = rows.next()? {
                steps.push(row.get::<_, String>(3)?);
            }
            Ok(steps.join("\n"))
        })
    }

    /// Runs `f` on the connection (reads), off the async workers.
    pub(super) fn read<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, RepoError>,
    ) -> Result<T, RepoError> {
        off_async_workers(|| f(&self.lock()))
    }

    /// Runs `f` in one transaction, committed when it returns `Ok`, off the async workers.
    pub(super) fn write<T>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, RepoError>,
    ) -> Result<T, RepoError> {
        off_async_workers(|| transact(&mut self.lock(), f))
    }

    /// [`Self::read`] for the short, indexed queries every miner request makes (a handful of
    /// index lookups): run where the caller is when the connection is free, and only a wait
    /// for a busy connection moves off the async workers. Each move (`block_in_place`) hands
    /// the worker's tasks to another thread, and at 150 simulated miners those hand-offs and
    /// the blocking pool's wakeups were about a quarter of the orchestrator's CPU (`perf`,
    /// `iota bench orchestrator`).
    pub(super) fn read_hot<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, RepoError>,
    ) -> Result<T, RepoError> {
        f(&self.lock_hot())
    }

    /// [`Self::write`] for the short transactions of every miner request; see
    /// [`Self::read_hot`].
    pub(super) fn write_hot<T>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, RepoError>,
    ) -> Result<T, RepoError> {
        transact(&mut self.lock_hot(), f)
    }

    /// The connection: at once when it is free, else waited for off the async workers.
    fn lock_hot(&self) -> MutexGuard<'_, Connection> {
        match self.conn.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => off_async_workers(|| self.lock()),
        }
    }
}

/// Runs `f` in one transaction on `conn`, committed when it returns `Ok`.
fn transact<T>(
    conn: &mut Connection,
    f: impl FnOnce(&Transaction<'_>) -> Result<T, RepoError>,
) -> Result<T, RepoError> {
    let tx = conn.transaction()?;
    let out = f(&tx)?;
    tx.commit()?;
    Ok(out)
}

/// Runs blocking database work `f` (waiting for the connection, then the queries) so that
/// it does not hold up an async worker: on a multi-threaded tokio runtime the worker's other
/// tasks move to another thread while `f` blocks (`block_in_place`). Elsewhere (a
/// current-thread runtime in tests, or no runtime) `f` simply runs.
pub(crate) fn off_async_workers<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
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
