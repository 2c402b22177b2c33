//! The replay cache: ids of signed requests already seen, until their timestamps expire.

use rusqlite::params;

use super::db::{Cached, Repository, to_i64, to_u64};
use crate::orchestrator::repo_types::RepoError;

/// Forgets at most 256 signature ids that expired before `?1` (on every signed request: a
/// range of the `seen_signatures_expiry` index, not a scan of the cache). Bounded, because it
/// runs on an async worker with the other hot calls ([`Repository::write_hot`]): after a
/// quiet spell every id recorded before it has expired at once, and one request would delete
/// them all. Each request records one id and forgets up to 256, so a backlog of expired ids
/// is gone within a few requests.
pub(super) const FORGET_EXPIRED: &str = "DELETE FROM seen_signatures WHERE id IN \
     (SELECT id FROM seen_signatures WHERE expires_at < ?1 LIMIT 256)";

/// Most expired ids one request forgets (the `LIMIT` of [`FORGET_EXPIRED`]; tests).
#[cfg(test)]
pub(super) const FORGET_AT_ONCE: u64 = 256;

impl Repository {
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
        self.write_hot(|tx| {
            tx.execute_cached(FORGET_EXPIRED, [to_i64(now_ms)])?;
            let n = tx.execute_cached(
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
        self.read(|conn| {
            let n: i64 =
                conn.query_row_cached("SELECT COUNT(*) FROM seen_signatures", [], |r| r.get(0))?;
            Ok(to_u64(n))
        })
    }
}
