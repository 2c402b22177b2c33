//! The write-ahead log's checkpoints, mostly off the request path.
//!
//! In WAL mode SQLite copies the log back into the database file (a checkpoint) from inside
//! the commit that takes the log past 1,000 pages, and that commit waits for the copy and its
//! `fsync`s: on a disk file system (ext4 on a virtual disk) one request in a thousand or so is
//! held for tens of milliseconds, the tail of the latency the miners see. A thread of the
//! store's own runs a passive checkpoint on a second connection every [`EVERY`], which copies
//! and syncs what no reader still needs without blocking the writer or the readers, so the
//! commit's checkpoint finds the log already copied and has little left to do.
//!
//! The commits keep their checkpoint: only a checkpoint run under the write lock can finish
//! the whole log while requests keep writing, and a log that is never finished is never
//! restarted from its beginning (with the commits' checkpoints turned off, the log of an
//! `iota bench orchestrator` run grew to 5 GiB over 10,000 samples). But they run it every
//! [`COMMIT_PAGES`] pages instead of 1,000: at 150 miners the log grows by 1,000 pages about
//! 25 times a second (computed from that 5 GiB over a 50 s run), and `perf` found the commits'
//! checkpoints, two `fsync`s each under the store's lock, doing 93% of all checkpoint work
//! (5.6% of the orchestrator's CPU against the background thread's 0.4%). The log file then
//! stays under about 41 MB.

use std::path::Path;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::time::Duration;

use rusqlite::Connection;

/// Time between two background checkpoints.
pub(super) const EVERY: Duration = Duration::from_millis(50);

/// Pages of log after which a commit checkpoints it (finishing and restarting the log) while
/// the background thread runs; SQLite's default is 1,000.
pub(super) const COMMIT_PAGES: i64 = 10_000;

/// The background checkpoints of one database file; they stop when this is dropped.
#[derive(Debug)]
pub(super) struct Checkpoints {
    /// Dropping it disconnects the thread's receiver, which ends the thread.
    _stop: Sender<()>,
}

impl Checkpoints {
    /// Starts checkpointing the WAL of the database at `path` every `every`, on a connection
    /// of its own; `None` (and a warning) when that connection or its thread cannot start, in
    /// which case the caller keeps SQLite's own checkpoints.
    pub(super) fn start(path: &Path, every: Duration) -> Option<Self> {
        let conn = match Connection::open(path) {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!("WAL checkpoints stay in the commits: {e}");
                return None;
            }
        };
        let (stop, stopped) = mpsc::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("iota-wal-checkpoints".into())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    // (busy, log frames, frames checkpointed): a busy answer is retried at the
                    // next turn.
                    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                    {
                        tracing::warn!("WAL checkpoint: {e}");
                    }
                }
            });
        match spawned {
            Ok(_) => Some(Self { _stop: stop }),
            Err(e) => {
                tracing::warn!("WAL checkpoints stay in the commits: {e}");
                None
            }
        }
    }
}
