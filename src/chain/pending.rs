//! A validator's weights through a [`Chain`], with commit-reveal commits kept on disk so that
//! a restart between the commit and its reveal loses nothing.
//!
//! [`submit`] sets the weights directly where the subnet has commit-reveal off. Where it is on,
//! it makes a salt and the v2 hash, **writes the pending commit to the file first**, then
//! commits; the entry records the block of the commit once the chain took it. [`reveal_due`]
//! (called on every round, and so first thing after a restart) reveals each entry whose reveal
//! epoch has come, drops those the chain has let expire, and rewrites the file. An entry whose
//! block was never noted (the validator stopped while the commit was sent or waited for) is
//! looked up in the chain's own commits (`WeightCommits`): revealed if the chain took it,
//! dropped if not.
//!
//! The file is JSON, replaced atomically (written beside, then renamed). It holds no secret:
//! a salt only hides weights until their reveal.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::subtensor::commit::{commit_hash_v2, new_salt};
use super::{Chain, ChainError, WeightSubmission};
use crate::wallet::Hotkey;

/// Why a submission or the pending file failed.
#[derive(Debug, Error)]
pub enum PendingError {
    /// The pending-commit file could not be read or written.
    #[error("pending weight commits in {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The chain refused.
    #[error(transparent)]
    Chain(#[from] ChainError),
}

/// A commit not yet revealed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingCommit {
    /// The subnet.
    pub netuid: u16,
    /// The uids.
    pub uids: Vec<u16>,
    /// Their u16 weights.
    pub values: Vec<u16>,
    /// The salt of the hash.
    pub salt: Vec<u16>,
    /// The version key of the hash.
    pub version_key: u64,
    /// The hash, hex.
    pub hash: String,
    /// The block the chain took the commit in; `None` until it did.
    pub commit_block: Option<u64>,
}

/// What [`submit`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submitted {
    /// The weights were set at this block.
    Set(u64),
    /// The weights were committed at this block; the reveal is due in epoch `reveal_epoch`.
    Committed {
        /// The commit's block.
        block: u64,
        /// The epoch the reveal is due in.
        reveal_epoch: u64,
    },
}

/// The pending commits of one validator, in a file.
#[derive(Debug, Clone)]
pub struct PendingStore {
    path: PathBuf,
}

impl PendingStore {
    /// The store in `path` (created on first write).
    pub fn new(path: impl Into<PathBuf>) -> PendingStore {
        PendingStore { path: path.into() }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every pending commit (none if the file does not exist).
    ///
    /// # Errors
    /// [`PendingError::File`] when the file cannot be read or parsed.
    pub fn load(&self) -> Result<Vec<PendingCommit>, PendingError> {
        let text = match std::fs::read(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.error(e.to_string())),
        };
        serde_json::from_slice(&text).map_err(|e| self.error(format!("not valid JSON: {e}")))
    }

    /// Replaces the file with `commits`, atomically.
    ///
    /// # Errors
    /// [`PendingError::File`] when it cannot be written.
    pub fn save(&self, commits: &[PendingCommit]) -> Result<(), PendingError> {
        let text = serde_json::to_vec_pretty(commits).map_err(|e| self.error(e.to_string()))?;
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| self.error(e.to_string()))?;
        }
        let staging = self.path.with_extension("partial");
        std::fs::write(&staging, text).map_err(|e| self.error(e.to_string()))?;
        std::fs::rename(&staging, &self.path).map_err(|e| self.error(e.to_string()))
    }

    fn error(&self, reason: String) -> PendingError {
        PendingError::File {
            path: self.path.clone(),
            reason,
        }
    }
}

/// Submits `signer`'s weights on `netuid`: directly, or as a commit kept in `store` where the
/// subnet has commit-reveal on.
///
/// # Errors
/// [`PendingError`]: the chain's refusal (the pending entry is then removed again), or the file.
pub fn submit(
    chain: &dyn Chain,
    signer: &Hotkey,
    store: &PendingStore,
    netuid: u16,
    uids: &[u16],
    values: &[u16],
    version_key: u64,
) -> Result<Submitted, PendingError> {
    let policy = chain.weights_policy(netuid)?;
    if !policy.commit_reveal {
        let block = chain.submit_weights(
            signer,
            netuid,
            &WeightSubmission::Set {
                uids: uids.to_vec(),
                values: values.to_vec(),
                version_key,
            },
        )?;
        return Ok(Submitted::Set(block));
    }
    let salt = new_salt();
    let hash = commit_hash_v2(
        &signer.public_key(),
        netuid,
        uids,
        values,
        &salt,
        version_key,
    );
    let mut commits = store.load()?;
    commits.push(PendingCommit {
        netuid,
        uids: uids.to_vec(),
        values: values.to_vec(),
        salt,
        version_key,
        hash: hex::encode(hash),
        commit_block: None,
    });
    // On disk before the chain sees it: a crash after the commit cannot lose the salt.
    store.save(&commits)?;
    let result = chain.submit_weights(signer, netuid, &WeightSubmission::Commit { hash });
    let hash_hex = hex::encode(hash);
    match result {
        Ok(block) => {
            if let Some(entry) = commits.iter_mut().find(|c| c.hash == hash_hex) {
                entry.commit_block = Some(block);
            }
            store.save(&commits)?;
            Ok(Submitted::Committed {
                block,
                reveal_epoch: policy.reveal_epoch(netuid, block),
            })
        }
        Err(e) => {
            commits.retain(|c| c.hash != hash_hex);
            store.save(&commits)?;
            Err(e.into())
        }
    }
}

/// Reveals every pending commit of `signer` whose reveal epoch is now (an entry without its
/// commit block takes it from the chain's commits); keeps those not yet due; drops those past
/// their epoch (the chain has expired them) and those the chain never took,
/// and rewrites the file if that changed anything. Returns the commits revealed.
///
/// # Errors
/// [`PendingError`]: the file, or a chain refusal of a reveal that was due (the entry is kept).
pub fn reveal_due(
    chain: &dyn Chain,
    signer: &Hotkey,
    store: &PendingStore,
) -> Result<Vec<PendingCommit>, PendingError> {
    let commits = store.load()?;
    let before = commits.clone();
    let mut kept = Vec::new();
    let mut revealed = Vec::new();
    let mut failure = None;
    for mut commit in commits {
        let commit_block = match commit.commit_block {
            Some(block) => block,
            // Written before the commit was sent, and the block never noted (a crash while
            // it was sent or waited for): the chain says whether it took it, and when.
            None => match chain.weight_commits(commit.netuid, &signer.public_key()) {
                Ok(on_chain) => {
                    match on_chain.iter().find(|(h, _)| hex::encode(h) == commit.hash) {
                        Some((_, block)) => {
                            commit.commit_block = Some(*block);
                            *block
                        }
                        None => continue, // it never reached the chain: nothing to reveal
                    }
                }
                Err(e) => {
                    failure.get_or_insert(e);
                    kept.push(commit);
                    continue;
                }
            },
        };
        let policy = match chain.weights_policy(commit.netuid) {
            Ok(policy) => policy,
            Err(e) => {
                failure.get_or_insert(e);
                kept.push(commit);
                continue;
            }
        };
        let due = policy.reveal_epoch(commit.netuid, commit_block);
        let now = policy.current_epoch(commit.netuid);
        if now < due {
            kept.push(commit);
            continue;
        }
        if now > due {
            continue; // expired on chain
        }
        let reveal = WeightSubmission::Reveal {
            uids: commit.uids.clone(),
            values: commit.values.clone(),
            salt: commit.salt.clone(),
            version_key: commit.version_key,
        };
        match chain.submit_weights(signer, commit.netuid, &reveal) {
            Ok(_) => revealed.push(commit),
            Err(e) => {
                failure.get_or_insert(e);
                kept.push(commit);
            }
        }
    }
    // Rewritten only when something changed: a step with nothing pending writes nothing.
    if kept != before {
        store.save(&kept)?;
    }
    match failure {
        Some(e) => Err(e.into()),
        None => Ok(revealed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::epoch_index;
    use crate::chain::fake::{FakeSubnetConfig, FakeSubtensor};

    const NETUID: u16 = 3;

    #[test]
    fn a_commit_is_revealed_after_a_restart_on_the_fake_chain() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("validator/pending-commits.json");
        let chain = FakeSubtensor::new();
        chain.add_subnet(
            NETUID,
            FakeSubnetConfig {
                tempo: 20,
                commit_reveal: true,
                reveal_period_epochs: 2,
                weights_rate_limit: 10,
                version_key: 0,
            },
        );
        let validator = Hotkey::from_uri("//Alice").unwrap();
        for (i, uri) in ["//Alice", "//Bob", "//Charlie"].iter().enumerate() {
            let key = Hotkey::from_uri(uri).unwrap();
            let uid = chain
                .register_hotkey(NETUID, &key.public_key(), i == 0)
                .unwrap();
            assert_eq!(usize::from(uid), i);
        }

        // The validator commits, then stops.
        let submitted = {
            let store = PendingStore::new(&path);
            submit(
                &chain,
                &validator,
                &store,
                NETUID,
                &[1, 2],
                &[65535, 1200],
                0,
            )
            .unwrap()
        };
        let Submitted::Committed {
            block,
            reveal_epoch,
        } = submitted
        else {
            panic!("commit-reveal is on: {submitted:?}")
        };
        assert_eq!(reveal_epoch, epoch_index(NETUID, 20, block) + 2);
        assert_eq!(chain.pending_commits(NETUID, &validator.public_key()), 1);

        // A restart before the reveal epoch: nothing is due, the commit stays on disk.
        chain.advance(21);
        let store = PendingStore::new(&path);
        assert!(reveal_due(&chain, &validator, &store).unwrap().is_empty());
        assert_eq!(store.load().unwrap().len(), 1);
        assert!(chain.weights_of(NETUID, 0).is_empty());

        // Another restart, in the reveal epoch: the commit is revealed and the file emptied.
        while chain.weights_policy(NETUID).unwrap().current_epoch(NETUID) < reveal_epoch {
            chain.advance(1);
        }
        let store = PendingStore::new(&path);
        let revealed = reveal_due(&chain, &validator, &store).unwrap();
        assert_eq!(revealed.len(), 1);
        assert_eq!(chain.weights_of(NETUID, 0), [(1, 65535), (2, 1200)]);
        assert!(store.load().unwrap().is_empty());
        assert_eq!(chain.pending_commits(NETUID, &validator.public_key()), 0);
    }

    #[test]
    fn a_refused_commit_leaves_no_entry_and_direct_weights_need_none() {
        let dir = tempfile::tempdir().unwrap();
        let store = PendingStore::new(dir.path().join("pending.json"));
        let chain = FakeSubtensor::new();
        let base = FakeSubnetConfig {
            tempo: 20,
            commit_reveal: true,
            reveal_period_epochs: 1,
            weights_rate_limit: 10,
            version_key: 0,
        };
        chain.add_subnet(NETUID, base);
        let stranger = Hotkey::from_uri("//Eve").unwrap();
        let err = submit(&chain, &stranger, &store, NETUID, &[0], &[1], 0).unwrap_err();
        assert!(err.to_string().contains("not registered"), "{err}");
        assert!(store.load().unwrap().is_empty());

        chain.add_subnet(
            NETUID,
            FakeSubnetConfig {
                commit_reveal: false,
                ..base
            },
        );
        let validator = Hotkey::from_uri("//Alice").unwrap();
        chain
            .register_hotkey(NETUID, &validator.public_key(), true)
            .unwrap();
        let done = submit(&chain, &validator, &store, NETUID, &[0], &[5], 0).unwrap();
        assert!(matches!(done, Submitted::Set(_)));
        assert!(store.load().unwrap().is_empty());
        let err = submit(&chain, &validator, &store, NETUID, &[0], &[5], 0).unwrap_err();
        assert!(err.to_string().contains("rate-limited"), "{err}");
    }

    #[test]
    fn a_commit_whose_block_was_never_noted_is_found_on_the_fake_chain_and_revealed() {
        let dir = tempfile::tempdir().unwrap();
        let store = PendingStore::new(dir.path().join("pending-commits.json"));
        let chain = FakeSubtensor::new();
        chain.add_subnet(
            NETUID,
            FakeSubnetConfig {
                tempo: 20,
                commit_reveal: true,
                reveal_period_epochs: 1,
                weights_rate_limit: 0,
                version_key: 0,
            },
        );
        let validator = Hotkey::from_uri("//Alice").unwrap();
        chain
            .register_hotkey(NETUID, &validator.public_key(), true)
            .unwrap();
        // Two entries written before their commits went out; the validator stopped before it
        // noted a block. The chain took the first only.
        let entry = |values: &[u16]| {
            let salt = new_salt();
            let hash = commit_hash_v2(&validator.public_key(), NETUID, &[0], values, &salt, 0);
            PendingCommit {
                netuid: NETUID,
                uids: vec![0],
                values: values.to_vec(),
                salt,
                version_key: 0,
                hash: hex::encode(hash),
                commit_block: None,
            }
        };
        let (taken, lost) = (entry(&[7]), entry(&[8]));
        let mut hash = [0u8; 32];
        hex::decode_to_slice(&taken.hash, &mut hash).unwrap();
        let block = chain
            .submit_weights(&validator, NETUID, &WeightSubmission::Commit { hash })
            .unwrap();
        store.save(&[taken.clone(), lost]).unwrap();

        // Before the reveal epoch: the taken one is kept with its block, the other dropped.
        assert!(reveal_due(&chain, &validator, &store).unwrap().is_empty());
        let kept = store.load().unwrap();
        assert_eq!(kept.len(), 1);
        assert_eq!(
            (&kept[0].hash, kept[0].commit_block),
            (&taken.hash, Some(block))
        );
        let reveal_epoch = epoch_index(NETUID, 20, block) + 1;
        while chain.weights_policy(NETUID).unwrap().current_epoch(NETUID) < reveal_epoch {
            chain.advance(1);
        }
        assert_eq!(reveal_due(&chain, &validator, &store).unwrap().len(), 1);
        assert_eq!(chain.weights_of(NETUID, 0), [(0, 7)]);
        assert!(store.load().unwrap().is_empty());
    }

    #[test]
    fn a_corrupt_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pending.json");
        std::fs::write(&path, b"{not json").unwrap();
        let err = PendingStore::new(&path).load().unwrap_err().to_string();
        assert!(
            err.contains("pending.json") && err.contains("not valid JSON"),
            "{err}"
        );
    }
}
