//! The SQLite schema: routing and ledger tables, then the merge cycle's tables.

/// Registry, ledger, assignments, penalties and the replay cache.
pub(super) const SCHEMA: &str = "
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
    started_at INTEGER NOT NULL, finished_at INTEGER, kind TEXT NOT NULL DEFAULT 'train');
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
    download_ms INTEGER, compute_ms INTEGER, upload_ms INTEGER,
    input_from INTEGER, output_key TEXT);
CREATE INDEX IF NOT EXISTS assignments_state ON assignments (state, section, kind);
CREATE INDEX IF NOT EXISTS assignments_miner ON assignments (miner, state);
CREATE INDEX IF NOT EXISTS assignments_sample ON assignments (sample);
CREATE INDEX IF NOT EXISTS samples_outcome ON samples (outcome, epoch);
CREATE TABLE IF NOT EXISTS seen_signatures (id TEXT PRIMARY KEY, expires_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS standing (
    id INTEGER PRIMARY KEY AUTOINCREMENT, miner TEXT NOT NULL, at INTEGER NOT NULL,
    decision TEXT NOT NULL, strikes INTEGER NOT NULL, until INTEGER, reason TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS standing_miner ON standing (miner);
";

/// Columns added after the first release of the schema: `(table, column, declaration)`,
/// added to older state files when they are opened.
///
/// `samples.kind`: `train` (a training sample unit) or `eval` (an evaluation sample of the
/// weights an epoch started with, forward-only; see `repo::eval`).
///
/// `miners.flag_excluded_until` / `flag_excluded_epoch`: an exclusion for validator flags
/// (`repo::standing::flag_window`), kept apart from the strikes an accepted result clears.
///
/// `assignments.prefer`: the miner an open forward is offered to first (lane routing).
///
/// `checkpoints.optimizer_step`: the AdamW step count that goes with the merged moments (see
/// `SectionOutcome::optimizer_step`).
pub(super) const ADDED_COLUMNS: [(&str, &str, &str); 15] = [
    ("miners", "flag_excluded_until", "INTEGER"),
    ("miners", "flag_excluded_epoch", "INTEGER"),
    ("assignments", "input_from", "INTEGER"),
    ("assignments", "output_key", "TEXT"),
    ("assignments", "delivered_at", "INTEGER"),
    ("miners", "strikes", "INTEGER NOT NULL DEFAULT 0"),
    ("miners", "struck_at", "INTEGER"),
    ("miners", "benched_until", "INTEGER"),
    ("uploads", "d_params", "REAL"),
    ("uploads", "d_exp_avg", "REAL"),
    ("uploads", "d_exp_avg_sq", "REAL"),
    ("uploads", "reference_norm", "REAL"),
    ("samples", "kind", "TEXT NOT NULL DEFAULT 'train'"),
    ("assignments", "prefer", "TEXT"),
    (
        "checkpoints",
        "optimizer_step",
        "INTEGER NOT NULL DEFAULT 0",
    ),
];

/// Indexes over added columns (created once the columns exist), and the indexes the hot
/// queries need (checked by `repo::tests::hot_queries_use_indexes`): the epoch progress read
/// on every `/api/work` (`samples_progress`), the recent loss on the unauthenticated status
/// and metrics (`samples_finished`), and the replay cache's expiry on every signed request
/// (`seen_signatures_expiry`).
pub(super) const ADDED_INDEXES: &str = "
CREATE INDEX IF NOT EXISTS samples_kind ON samples (kind, epoch);
CREATE INDEX IF NOT EXISTS samples_progress ON samples (kind, outcome, epoch);
CREATE INDEX IF NOT EXISTS samples_finished ON samples (kind, outcome, finished_at);
CREATE INDEX IF NOT EXISTS seen_signatures_expiry ON seen_signatures (expires_at);
";

/// Per-epoch sample counters, kept by triggers in the transaction that changes a sample, so
/// the hot paths (epoch progress on every `/api/work`, the counts and evaluations on the
/// unauthenticated `/api/status` and `/metrics`, the epoch losses on `/api/merge/status`) read
/// a handful of rows instead of counting the ledger. `loss_sum` / `loss_n` cover completed
/// samples with a loss. A sample's `epoch` and `kind` never change. Rows of `samples` pruned
/// later leave their counts here (nothing is subtracted on delete): the roll-up of the ledger.
pub(super) const COUNTER_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sample_counts (
    epoch INTEGER NOT NULL, kind TEXT NOT NULL,
    active INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0,
    dropped INTEGER NOT NULL DEFAULT 0, loss_sum REAL NOT NULL DEFAULT 0,
    loss_n INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (epoch, kind));
CREATE TRIGGER IF NOT EXISTS sample_counts_insert AFTER INSERT ON samples BEGIN
    INSERT INTO sample_counts (epoch, kind, active, completed, dropped, loss_sum, loss_n)
    VALUES (NEW.epoch, NEW.kind, NEW.outcome = 'active', NEW.outcome = 'completed',
            NEW.outcome = 'dropped',
            CASE WHEN NEW.outcome = 'completed' AND NEW.loss IS NOT NULL THEN NEW.loss ELSE 0 END,
            NEW.outcome = 'completed' AND NEW.loss IS NOT NULL)
    ON CONFLICT (epoch, kind) DO UPDATE SET
        active = active + excluded.active, completed = completed + excluded.completed,
        dropped = dropped + excluded.dropped, loss_sum = loss_sum + excluded.loss_sum,
        loss_n = loss_n + excluded.loss_n;
END;
CREATE TRIGGER IF NOT EXISTS sample_counts_update AFTER UPDATE OF outcome, loss ON samples BEGIN
    UPDATE sample_counts SET
        active = active - (OLD.outcome = 'active') + (NEW.outcome = 'active'),
        completed = completed - (OLD.outcome = 'completed') + (NEW.outcome = 'completed'),
        dropped = dropped - (OLD.outcome = 'dropped') + (NEW.outcome = 'dropped'),
        loss_sum = loss_sum
            - (CASE WHEN OLD.outcome = 'completed' AND OLD.loss IS NOT NULL THEN OLD.loss ELSE 0 END)
            + (CASE WHEN NEW.outcome = 'completed' AND NEW.loss IS NOT NULL THEN NEW.loss ELSE 0 END),
        loss_n = loss_n - (OLD.outcome = 'completed' AND OLD.loss IS NOT NULL)
            + (NEW.outcome = 'completed' AND NEW.loss IS NOT NULL)
    WHERE epoch = NEW.epoch AND kind = NEW.kind;
END;
";

/// Fills `sample_counts` from the ledger of a state file written before the counters existed
/// (run once, when the table is empty and the ledger is not).
pub(super) const COUNTER_BACKFILL: &str = "
INSERT INTO sample_counts (epoch, kind, active, completed, dropped, loss_sum, loss_n)
SELECT epoch, kind, SUM(outcome = 'active'), SUM(outcome = 'completed'), SUM(outcome = 'dropped'),
       COALESCE(SUM(CASE WHEN outcome = 'completed' THEN loss END), 0),
       SUM(outcome = 'completed' AND loss IS NOT NULL)
FROM samples WHERE NOT EXISTS (SELECT 1 FROM sample_counts) GROUP BY epoch, kind;
";

/// Tables of the merge cycle (created next to the routing tables).
pub(super) const MERGE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS uploads (
    epoch INTEGER NOT NULL, section INTEGER NOT NULL, miner TEXT NOT NULL, state TEXT NOT NULL,
    lease_until INTEGER NOT NULL, hash TEXT, bytes INTEGER, weight REAL, reason TEXT,
    PRIMARY KEY (epoch, miner));
CREATE TABLE IF NOT EXISTS merge_plans (
    epoch INTEGER NOT NULL, section INTEGER NOT NULL, uploaders TEXT NOT NULL,
    weights TEXT NOT NULL, len INTEGER NOT NULL, partitions INTEGER NOT NULL,
    replication INTEGER NOT NULL, finalized_at INTEGER, PRIMARY KEY (epoch, section));
CREATE TABLE IF NOT EXISTS partition_results (
    epoch INTEGER NOT NULL, section INTEGER NOT NULL, partition INTEGER NOT NULL,
    merger TEXT NOT NULL, hash TEXT NOT NULL, bytes INTEGER NOT NULL, at INTEGER NOT NULL,
    PRIMARY KEY (epoch, section, partition, merger));
CREATE TABLE IF NOT EXISTS partition_outcomes (
    epoch INTEGER NOT NULL, section INTEGER NOT NULL, partition INTEGER NOT NULL,
    verdict TEXT NOT NULL, PRIMARY KEY (epoch, section, partition));
CREATE TABLE IF NOT EXISTS merge_flags (
    epoch INTEGER NOT NULL, section INTEGER NOT NULL, partition INTEGER NOT NULL,
    merger TEXT NOT NULL, reason TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints (
    section INTEGER NOT NULL, epoch INTEGER NOT NULL, hash TEXT NOT NULL, bytes INTEGER NOT NULL,
    at INTEGER NOT NULL, optimizer_step INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (section, epoch));
";

/// Tables of validation (published weights, upload times, objects kept for validators).
pub const VALIDATION_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS published_weights (
    validator TEXT NOT NULL, epoch INTEGER NOT NULL, received_at INTEGER NOT NULL,
    body TEXT NOT NULL, signature TEXT NOT NULL, signed_at INTEGER NOT NULL,
    PRIMARY KEY (validator, epoch));
CREATE TABLE IF NOT EXISTS upload_times (
    epoch INTEGER NOT NULL, miner TEXT NOT NULL, accepted_at INTEGER NOT NULL,
    PRIMARY KEY (epoch, miner));
CREATE TABLE IF NOT EXISTS kept_objects (
    prefix TEXT PRIMARY KEY, epoch INTEGER NOT NULL, eligible_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS flagged_windows (
    miner TEXT NOT NULL, epoch INTEGER NOT NULL, at INTEGER NOT NULL, reason TEXT NOT NULL,
    PRIMARY KEY (miner, epoch));
";
