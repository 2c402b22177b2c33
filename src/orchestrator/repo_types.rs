//! Rows and enums of the orchestrator's state, as the [`super::repo::Repository`] returns them.

use thiserror::Error;

use crate::api::{Timings, WorkKind};

/// Why a repository operation failed.
#[derive(Debug, Error)]
pub enum RepoError {
    /// SQLite reported an error (I/O, corruption, locked file).
    #[error("state database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A stored value could not be interpreted (the file was edited or is from another version).
    #[error("state database holds an unexpected value: {0}")]
    Corrupt(String),
    /// The hotkey never registered.
    #[error("hotkey {hotkey} is not registered")]
    NotRegistered {
        /// The hotkey.
        hotkey: String,
    },
    /// Every section already has its maximum of miners.
    #[error("every section is full ({max} miners per section)")]
    SectionsFull {
        /// The per-section maximum.
        max: usize,
    },
    /// The section a new hotkey is placed in is full (seats of keys that take no work lapse
    /// after `placement.claim_s`).
    #[error(
        "section {section}, where this hotkey is placed, is full ({max} miners); try again later"
    )]
    SectionFull {
        /// The section.
        section: usize,
        /// The per-section maximum.
        max: usize,
    },
    /// No assignment has this id.
    #[error("assignment {id} does not exist")]
    UnknownAssignment {
        /// The id.
        id: u64,
    },
    /// The assignment belongs to another miner.
    #[error("assignment {id} is not held by this miner")]
    NotHolder {
        /// The id.
        id: u64,
    },
    /// The assignment is no longer waiting for a result.
    #[error("assignment {id} is {state}, not waiting for a result")]
    NotAssigned {
        /// The id.
        id: u64,
        /// Its current state.
        state: AssignmentState,
    },
    /// A sample unit was started out of order (another one took the id first).
    #[error("sample {got} cannot start: the next sample is {expected}")]
    SampleOrder {
        /// The id the run expects next.
        expected: u64,
        /// The id asked for.
        got: u64,
    },
}

/// Lifecycle of an assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AssignmentState {
    /// A forward waiting for any miner of its section.
    Open,
    /// Held by a miner until its deadline.
    Assigned,
    /// Result accepted.
    Done,
    /// Result refused (bad payload); the work was re-offered or the sample dropped.
    Failed,
    /// Deadline missed; the work was re-offered or the sample dropped.
    Expired,
    /// Handed back by its miner.
    Released,
    /// Its sample was dropped.
    Cancelled,
}

impl AssignmentState {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Assigned => "assigned",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Expired => "expired",
            Self::Released => "released",
            Self::Cancelled => "cancelled",
        }
    }

    /// Parses a stored name.
    ///
    /// # Errors
    /// [`RepoError::Corrupt`] for an unknown name.
    pub fn parse(s: &str) -> Result<Self, RepoError> {
        Ok(match s {
            "open" => Self::Open,
            "assigned" => Self::Assigned,
            "done" => Self::Done,
            "failed" => Self::Failed,
            "expired" => Self::Expired,
            "released" => Self::Released,
            "cancelled" => Self::Cancelled,
            other => return Err(RepoError::Corrupt(format!("assignment state {other:?}"))),
        })
    }
}

impl std::fmt::Display for AssignmentState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Stored name of a [`WorkKind`].
pub fn kind_str(kind: WorkKind) -> &'static str {
    match kind {
        WorkKind::Forward => "forward",
        WorkKind::Backward => "backward",
        WorkKind::Eval => "eval",
    }
}

/// Parses a stored [`WorkKind`].
///
/// # Errors
/// [`RepoError::Corrupt`] for an unknown name.
pub fn parse_kind(s: &str) -> Result<WorkKind, RepoError> {
    match s {
        "forward" => Ok(WorkKind::Forward),
        "backward" => Ok(WorkKind::Backward),
        "eval" => Ok(WorkKind::Eval),
        other => Err(RepoError::Corrupt(format!("work kind {other:?}"))),
    }
}

/// Final state of a sample unit in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleOutcome {
    /// Under way.
    Active,
    /// Its backward reached the head.
    Completed,
    /// Dropped, with a reason.
    Dropped,
}

impl SampleOutcome {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Completed => "completed",
            Self::Dropped => "dropped",
        }
    }

    /// Parses a stored name.
    ///
    /// # Errors
    /// [`RepoError::Corrupt`] for an unknown name.
    pub fn parse(s: &str) -> Result<Self, RepoError> {
        Ok(match s {
            "active" => Self::Active,
            "completed" => Self::Completed,
            "dropped" => Self::Dropped,
            other => return Err(RepoError::Corrupt(format!("sample outcome {other:?}"))),
        })
    }
}

/// One registered miner.
#[derive(Debug, Clone, PartialEq)]
pub struct MinerRow {
    /// SS58 hotkey.
    pub hotkey: String,
    /// Section it serves.
    pub section: usize,
    /// First registration, ms since the Unix epoch.
    pub registered_at_ms: u64,
    /// Last request, ms since the Unix epoch.
    pub last_seen_ms: u64,
    /// Device it reported.
    pub device: String,
    /// Forwards it asked to hold at most.
    pub max_in_flight: usize,
    /// Forwards accepted.
    pub forwards: u64,
    /// Backwards accepted (a tail forward counts as one too: it runs its backward at once).
    pub backwards: u64,
    /// Penalties (missed deadlines, refused payloads).
    pub penalties: u64,
    /// Epoch of the weights it reported holding.
    pub weights_epoch: u64,
    /// Hash of its flat state after its last adoption, as reported.
    pub weights_hash: Option<String>,
}

/// One assignment.
#[derive(Debug, Clone, PartialEq)]
pub struct AssignmentRow {
    /// Id.
    pub id: u64,
    /// Sample unit.
    pub sample: u64,
    /// Epoch of the sample (object keys are grouped by it).
    pub epoch: u64,
    /// Section.
    pub section: usize,
    /// Forward or backward.
    pub kind: WorkKind,
    /// Holder (none for an open forward).
    pub miner: Option<String>,
    /// Deadline, ms since the Unix epoch (none for an open forward).
    pub deadline_ms: Option<u64>,
    /// State.
    pub state: AssignmentState,
    /// BLAKE3 hex of the input object.
    pub input_hash: String,
    /// The assignment whose accepted output is this one's input (none for a head forward,
    /// whose input is the sample's tokens).
    pub input_from: Option<u64>,
    /// BLAKE3 hex of the targets (tail forwards only).
    pub targets_hash: Option<String>,
    /// Earlier attempts at this piece of work.
    pub attempts: u32,
    /// BLAKE3 hex of the sample's token ids (read by the head, and by every later section of a
    /// model that re-embeds them).
    pub tokens_hash: String,
}

/// One sample unit in the ledger.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleRow {
    /// Sample unit id.
    pub id: u64,
    /// Epoch it belongs to.
    pub epoch: u64,
    /// Outcome.
    pub outcome: SampleOutcome,
    /// Why it was dropped.
    pub reason: Option<String>,
    /// Tail loss.
    pub loss: Option<f32>,
    /// Start, ms since the Unix epoch.
    pub started_ms: u64,
    /// End, ms since the Unix epoch.
    pub finished_ms: Option<u64>,
}

/// What a miner reports with an accepted result.
#[derive(Debug, Clone, PartialEq)]
pub struct Accepted {
    /// BLAKE3 hex of the uploaded output (checked by the caller), if any.
    pub output_hash: Option<String>,
    /// Where the accepted output lives (its immutable copy), if any: the ledger records it so
    /// anyone replaying the work can fetch exactly what was accepted.
    pub output_key: Option<String>,
    /// Tail loss.
    pub loss: Option<f32>,
    /// Timings.
    pub timings: Timings,
}

/// What happened to a missed, refused or released assignment.
#[derive(Debug, Clone, PartialEq)]
pub enum Fallout {
    /// A new open forward was created for the same work.
    Reoffered {
        /// The new assignment.
        assignment: u64,
    },
    /// A new backward for the same miner was created.
    RetriedBackward {
        /// The new assignment.
        assignment: u64,
    },
    /// The sample was dropped.
    Dropped {
        /// The sample.
        sample: u64,
        /// The reason recorded in the ledger.
        reason: String,
    },
}

/// Timing limits the routing needs, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutingLimits {
    /// Time allowed for a forward.
    pub forward_ms: u64,
    /// Time allowed for a backward.
    pub backward_ms: u64,
    /// Server cap of forwards awaiting a backward per miner.
    pub max_in_flight: usize,
    /// Index of the tail section.
    pub tail: usize,
    /// Samples per synchronous optimizer step (0: asynchronous steps). With G > 0 a miner
    /// holds at most its share of a step, `ceil(G / live miners of its section)`.
    pub samples_per_step: u64,
    /// A miner seen within this long counts as live for that share.
    pub live_ms: u64,
    /// Lane routing (`Config::lanes`): a forward is offered first to the next section's miner
    /// of its producer's rank.
    pub lanes: bool,
    /// How long a forward waits for its lane's miner before anyone of its section may take it.
    pub lane_wait_ms: u64,
    /// Epochs at the start of the run during which only the first-ranked live miner of each
    /// section takes training work (`Config::single_lane_samples`); 0: none.
    pub single_lane_epochs: u64,
    /// In-flight cap of a miner during those epochs (`Config::single_lane_max_in_flight`);
    /// 0: `max_in_flight`.
    pub single_lane_max_in_flight: usize,
    /// Epochs at the start of the run during which every miner holds at most
    /// `early_max_in_flight` forwards (`Config::early_in_flight_samples`); 0: none.
    pub early_epochs: u64,
    /// In-flight cap of every miner during those epochs (`Config::early_max_in_flight`); 0:
    /// `max_in_flight`.
    pub early_max_in_flight: usize,
    /// How the run's samples divide into epochs (`Config::epochs`).
    pub epochs: Epochs,
    /// A miner holds at most one forward in flight per this many samples of its share of the
    /// current epoch, and at least one (`Config::epoch_share_per_in_flight`); 0: off.
    pub epoch_share_per_in_flight: u64,
}

/// A sample about to start ([`super::repo::Repository::start_sample`]): its id, the epoch it
/// belongs to, and the hashes of its token ids and targets, already stored under that epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewSample<'a> {
    /// Epoch the caller stored its tokens for; nothing starts in another epoch.
    pub epoch: u64,
    /// Its id, which must be the run's next one.
    pub id: u64,
    /// Hash of its token ids.
    pub tokens_hash: &'a str,
    /// Hash of its targets.
    pub targets_hash: &'a str,
}

/// How many samples may be started, checked in the transaction that starts one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SampleRoom {
    /// The run's sample budget (no sample id at or above it starts).
    pub budget: Option<u64>,
    /// Samples an epoch needs before its merge: no sample starts while the epoch's completed
    /// plus active ones reach it.
    pub per_epoch: Option<u64>,
    /// Synchronous steps of this many samples: a sample that opens a step (its id a multiple
    /// of it) starts only when no training sample is active.
    pub per_step: Option<u64>,
}

/// Result of [`super::repo::Repository::take_work`].
#[derive(Debug, Clone, PartialEq)]
pub struct WorkTaken {
    /// Assignments handed out (backwards first).
    pub assignments: Vec<AssignmentRow>,
    /// How many new samples a head miner may still start now (0 outside section 0).
    pub head_capacity: usize,
    /// The miner's section.
    pub section: usize,
    /// How many more forwards the miner could take within its in-flight allowance (0 for a
    /// miner backed off or excluded).
    pub forward_room: usize,
    /// Whether it took open forwards up to its allowance, so some may be left for another
    /// miner of the section to take.
    pub filled: bool,
}

/// What an accepted result routed next (who may now have work).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Routed {
    /// A forward or evaluation was opened to `section`.
    Opened {
        /// The section it is open to.
        section: usize,
        /// The miner it is offered to first (lane routing), if any.
        prefer: Option<String>,
    },
    /// A backward was assigned to `miner`.
    Backward {
        /// Its holder.
        miner: String,
    },
    /// The sample ended (completed or dropped): there may be room for new samples at the head.
    Finished,
}

/// Sample counters and recent losses.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LedgerCounts {
    /// Completed samples.
    pub completed: u64,
    /// Dropped samples.
    pub dropped: u64,
    /// Active samples.
    pub active: u64,
}

/// How a run's samples divide into training epochs: `early_samples / early_every` epochs of
/// `early_every` samples, then epochs of `every` (both at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Epochs {
    /// Samples per epoch after the early merges (`batches_before_merging`).
    pub every: u64,
    /// Samples of the early merges (`early_merge_samples`).
    pub early_samples: u64,
    /// Samples per early epoch (`early_merge_every`).
    pub early_every: u64,
}

impl Epochs {
    fn early_epochs(&self) -> u64 {
        self.early_samples
            .checked_div(self.early_every)
            .unwrap_or(0)
    }

    /// Samples completed in epoch `epoch` before its merge.
    pub fn samples_in(&self, epoch: u64) -> u64 {
        if epoch < self.early_epochs() {
            self.early_every
        } else {
            self.every
        }
    }

    /// How many whole epochs the run's first `samples` samples make, or `None` when the
    /// `samples`-th sample does not end an epoch.
    pub fn count_in(&self, samples: u64) -> Option<u64> {
        if samples <= self.early_samples {
            let every = self.early_every.max(1);
            return samples.is_multiple_of(every).then_some(samples / every);
        }
        let rest = samples - self.early_samples;
        let every = self.every.max(1);
        rest.is_multiple_of(every)
            .then_some(self.early_epochs() + rest / every)
    }
}
