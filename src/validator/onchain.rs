//! A validator's weights on the subnet, for runs on a chain (`chain:` in the run config):
//! besides `POST /api/weights` to the orchestrator, each window's vector is set on chain.
//!
//! [`OnChain::queue`] takes the newest vector (replacing one still waiting); [`OnChain::step`]
//! (blocking: from async code inside `spawn_blocking`) first reveals every commit whose reveal
//! epoch has come ([`crate::chain::pending::reveal_due`]), then submits the queued vector
//! if the subnet's rate limit allows it, and else leaves it queued for a later step, so a
//! validator waits instead of sending what the chain would refuse:
//!
//! - hotkeys map to uids through the subnet's metagraph (a miner not on it is left out), the
//!   burned share goes to the run's `burn_uid`, and the float weights become u16 weights as
//!   the Bittensor SDK converts them ([`weights_for_emit`]);
//! - [`crate::chain::pending::submit`] sets them where commit-reveal is off, and else commits
//!   them with the salt written first to `pending-commits.json` in the validator's state
//!   directory, so that a restart before the reveal epoch reveals them after it;
//! - `onchain.json` beside it records the epoch and block last submitted, so a restarted
//!   validator does not submit the same window twice.
//!
//! Refusals are one line each: the hotkey is not registered on the subnet, holds no validator
//! permit, or the chain refused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::api::{RunChain, WeightSubmission};
use crate::chain::ChainError;
use crate::chain::pending::{PendingError, PendingStore, Submitted, reveal_due, submit};
use crate::chain::shared::SharedChain;
use crate::chain::subtensor::commit::weights_for_emit;
use crate::wallet::{Hotkey, Ss58Address};

/// File of the pending commits, in the run's state directory.
pub const PENDING_FILE: &str = "pending-commits.json";
/// File of the last submission, in the run's state directory.
pub const RECORD_FILE: &str = "onchain.json";

/// Why weights did not reach the chain.
#[derive(Debug, Error)]
pub enum OnChainError {
    /// The chain refused, or could not be read.
    #[error(transparent)]
    Chain(#[from] ChainError),
    /// The pending commits' file, or a refusal while committing or revealing.
    #[error(transparent)]
    Pending(#[from] PendingError),
    /// The vector has nothing to set (no miner on the subnet, no burn).
    #[error("weights of epoch {epoch}: {reason}")]
    Weights {
        /// The window's epoch.
        epoch: u64,
        /// What is wrong.
        reason: String,
    },
    /// The record of the last submission.
    #[error("{path}: {reason}")]
    Record {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

/// What a step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A window's weights were set at `block`.
    Set {
        /// The window's epoch.
        epoch: u64,
        /// The block.
        block: u64,
        /// How many uids got a weight.
        uids: usize,
    },
    /// A window's weights were committed at `block`; the reveal is due in `reveal_epoch`.
    Committed {
        /// The window's epoch.
        epoch: u64,
        /// The block.
        block: u64,
        /// The chain epoch the reveal is due in.
        reveal_epoch: u64,
    },
    /// A commit was revealed.
    Revealed {
        /// Its uids' count.
        uids: usize,
    },
    /// The queued window waits for the subnet's rate limit.
    Waiting {
        /// The window's epoch.
        epoch: u64,
        /// Blocks until it may go.
        blocks_left: u64,
    },
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::Set { epoch, block, uids } => write!(
                f,
                "weights of epoch {epoch} set on chain at block {block} ({uids} uids)"
            ),
            Event::Committed {
                epoch,
                block,
                reveal_epoch,
            } => write!(
                f,
                "weights of epoch {epoch} committed on chain at block {block}; reveal due in chain epoch {reveal_epoch}"
            ),
            Event::Revealed { uids } => write!(f, "a commit of {uids} uids revealed on chain"),
            Event::Waiting { epoch, blocks_left } => write!(
                f,
                "weights of epoch {epoch} wait {blocks_left} blocks for the subnet's rate limit"
            ),
        }
    }
}

/// The last submission, as `onchain.json` keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The window's epoch.
    pub epoch: u64,
    /// The block it was set or committed in.
    pub block: u64,
}

/// A chain handed to [`super::ValidatorOptions`] (tests pass the FAKE chain); without one,
/// the validator opens its own `--network` with [`crate::chain::shared::shared_chain_for`].
#[derive(Clone)]
pub struct InjectedChain(pub SharedChain);

impl std::fmt::Debug for InjectedChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InjectedChain({})", self.0.network())
    }
}

/// A validator's weights on the subnet (see the module documentation).
pub struct OnChain {
    chain: SharedChain,
    signer: Hotkey,
    netuid: u16,
    burn_uid: u16,
    store: PendingStore,
    record_path: PathBuf,
    record: Option<Record>,
    queued: Option<WeightSubmission>,
}

impl std::fmt::Debug for OnChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnChain")
            .field("netuid", &self.netuid)
            .field("record", &self.record)
            .finish_non_exhaustive()
    }
}

impl OnChain {
    /// `signer`'s weights on the run's chain, with its files in `dir` (the run's state
    /// directory).
    ///
    /// # Errors
    /// [`OnChainError::Record`] when the record exists but cannot be read.
    pub fn open(
        chain: SharedChain,
        signer: Hotkey,
        run_chain: &RunChain,
        dir: &Path,
    ) -> Result<OnChain, OnChainError> {
        let record_path = dir.join(RECORD_FILE);
        let record = match std::fs::read(&record_path) {
            Ok(bytes) => {
                Some(
                    serde_json::from_slice(&bytes).map_err(|e| OnChainError::Record {
                        path: record_path.clone(),
                        reason: format!("not valid JSON: {e}"),
                    })?,
                )
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(OnChainError::Record {
                    path: record_path,
                    reason: e.to_string(),
                });
            }
        };
        Ok(OnChain {
            chain,
            signer,
            netuid: run_chain.netuid,
            burn_uid: run_chain.burn_uid,
            store: PendingStore::new(dir.join(PENDING_FILE)),
            record_path,
            record,
            queued: None,
        })
    }

    /// The last window submitted (set or committed), across restarts.
    pub fn last_submitted(&self) -> Option<Record> {
        self.record
    }

    /// The window waiting to go, if any.
    pub fn queued(&self) -> Option<u64> {
        self.queued.as_ref().map(|q| q.epoch)
    }

    /// Queues `weights` for the chain, replacing an older window still waiting; a window at
    /// or before the last one submitted is ignored.
    pub fn queue(&mut self, weights: &WeightSubmission) {
        let newer = |epoch: u64| self.record.is_none_or(|r| epoch > r.epoch);
        if newer(weights.epoch) && self.queued().is_none_or(|q| weights.epoch >= q) {
            self.queued = Some(weights.clone());
        }
    }

    /// The queued window's uids and float weights (by uid), from the metagraph's uids.
    fn by_uid(
        &self,
        weights: &WeightSubmission,
        metagraph: &crate::chain::Metagraph,
    ) -> (Vec<u16>, Vec<f32>) {
        let mut by_uid: BTreeMap<u16, f64> = BTreeMap::new();
        for w in &weights.weights {
            let uid = Ss58Address::from_str(&w.hotkey)
                .ok()
                .and_then(|a| metagraph.neuron(a.public_key()).map(|n| n.uid));
            match uid {
                Some(uid) => *by_uid.entry(uid).or_default() += w.weight,
                None => tracing::debug!(hotkey = %w.hotkey, "not on the subnet: left out"),
            }
        }
        if weights.burn > 0.0 {
            *by_uid.entry(self.burn_uid).or_default() += weights.burn;
        }
        by_uid.into_iter().map(|(u, w)| (u, w as f32)).unzip()
    }

    /// Reveals the commits that are due, then submits the queued window if the rate limit
    /// allows (see the module documentation): [`Self::reveal`], then [`Self::submit`].
    /// Blocking.
    ///
    /// # Errors
    /// As either; an error in the submission drops the reveals' events (a caller that reports
    /// them calls the two apart).
    pub fn step(&mut self) -> Result<Vec<Event>, OnChainError> {
        let mut events = self.reveal()?;
        events.extend(self.submit()?);
        Ok(events)
    }

    /// Reveals the commits that are due. Blocking.
    ///
    /// # Errors
    /// [`OnChainError`]: the chain refused or could not be read, or a file could not be
    /// written.
    pub fn reveal(&mut self) -> Result<Vec<Event>, OnChainError> {
        Ok(reveal_due(self.chain.as_ref(), &self.signer, &self.store)?
            .into_iter()
            .map(|c| Event::Revealed { uids: c.uids.len() })
            .collect())
    }

    /// Submits the queued window if the rate limit allows. Blocking.
    ///
    /// # Errors
    /// [`OnChainError`]: the chain refused or could not be read (the window stays queued),
    /// or a file could not be written.
    pub fn submit(&mut self) -> Result<Vec<Event>, OnChainError> {
        let mut events = Vec::new();
        let Some(weights) = self.queued.clone() else {
            return Ok(events);
        };
        let metagraph = self.chain.metagraph(self.netuid)?;
        let me = metagraph.neuron(&self.signer.public_key()).ok_or_else(|| {
            ChainError::NotRegistered {
                hotkey: self.signer.address().to_string(),
                netuid: self.netuid,
            }
        })?;
        if !me.validator_permit {
            return Err(ChainError::NoValidatorPermit {
                netuid: self.netuid,
            }
            .into());
        }
        let policy = self.chain.weights_policy(self.netuid)?;
        let since = policy.block.saturating_sub(me.last_update);
        if me.last_update != 0 && since < policy.weights_rate_limit {
            events.push(Event::Waiting {
                epoch: weights.epoch,
                blocks_left: policy.weights_rate_limit - since,
            });
            return Ok(events);
        }
        let (uids, floats) = self.by_uid(&weights, &metagraph);
        let invalid = |reason: String| OnChainError::Weights {
            epoch: weights.epoch,
            reason,
        };
        let (uids, values) =
            weights_for_emit(&uids, &floats).map_err(|e| invalid(e.to_string()))?;
        if uids.is_empty() {
            self.queued = None;
            return Err(invalid(
                "no weight on any uid of the subnet (its miners are not on the metagraph); nothing set".into(),
            ));
        }
        let submitted = match submit(
            self.chain.as_ref(),
            &self.signer,
            &self.store,
            self.netuid,
            &uids,
            &values,
            policy.version_key,
        ) {
            Ok(submitted) => submitted,
            Err(PendingError::Chain(ChainError::RateLimited { blocks_left, .. })) => {
                events.push(Event::Waiting {
                    epoch: weights.epoch,
                    blocks_left,
                });
                return Ok(events);
            }
            Err(e) => return Err(e.into()),
        };
        let block = match submitted {
            Submitted::Set(block) => {
                events.push(Event::Set {
                    epoch: weights.epoch,
                    block,
                    uids: uids.len(),
                });
                block
            }
            Submitted::Committed {
                block,
                reveal_epoch,
            } => {
                events.push(Event::Committed {
                    epoch: weights.epoch,
                    block,
                    reveal_epoch,
                });
                block
            }
        };
        self.queued = None;
        self.save_record(Record {
            epoch: weights.epoch,
            block,
        })?;
        Ok(events)
    }

    fn save_record(&mut self, record: Record) -> Result<(), OnChainError> {
        let failed = |reason: String| OnChainError::Record {
            path: self.record_path.clone(),
            reason,
        };
        let text = serde_json::to_vec_pretty(&record).map_err(|e| failed(e.to_string()))?;
        if let Some(dir) = self.record_path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| failed(e.to_string()))?;
        }
        let staging = self.record_path.with_extension("partial");
        std::fs::write(&staging, text).map_err(|e| failed(e.to_string()))?;
        std::fs::rename(&staging, &self.record_path).map_err(|e| failed(e.to_string()))?;
        self.record = Some(record);
        Ok(())
    }
}
