//! A FAKE subtensor: an in-memory stand-in for tests of the flows around a chain (a validator's
//! commit, restart and reveal). It is not a chain, talks to nothing, and proves nothing about
//! what a real subtensor accepts: the encoding is checked elsewhere (`tests/chain_encoding.rs`).
//!
//! It applies the checks subtensor's pallet applies to weights, as its source states them:
//!
//! - only a hotkey registered on the subnet may set, commit or reveal weights;
//! - weights on other uids need a validator permit (a single weight on one's own uid does not);
//! - uids must exist, without duplicates, and pair up with the values; the version key must be
//!   at least the subnet's;
//! - with commit-reveal off, `set_weights` only once per `weights_rate_limit` blocks; with it
//!   on, `set_weights` is refused and the rate limit applies to commits;
//! - a commit is revealed only in epoch `commit_epoch + reveal_period_epochs`, where the epoch
//!   of block `b` on subnet `n` is `(b + n + 1) / (tempo + 1)` ([`super::epoch_index`]); after
//!   that epoch it has expired; at most 10 unrevealed commits per hotkey;
//! - a reveal must hash (the v2 commit hash) to a pending commit of the revealing hotkey.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use super::subtensor::commit::commit_hash_v2;
use super::{
    Chain, ChainError, ChainRegistration, Metagraph, Network, Neuron, Registrant, WeightSubmission,
    WeightsPolicy, epoch_index,
};
use crate::wallet::{Hotkey, Ss58Address};

/// The fake chain's genesis hash.
pub const FAKE_GENESIS: [u8; 32] = [0xfa; 32];

/// How many unrevealed commits a hotkey may have on a subnet (the pallet's limit).
const MAX_UNREVEALED_COMMITS: usize = 10;

/// A subnet's settings on the fake chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FakeSubnetConfig {
    /// Blocks per epoch, less one (subtensor's `Tempo`).
    pub tempo: u16,
    /// Whether weights go through commit-reveal.
    pub commit_reveal: bool,
    /// How many epochs after its commit a reveal is due.
    pub reveal_period_epochs: u64,
    /// Blocks between two weight submissions of one uid.
    pub weights_rate_limit: u64,
    /// The lowest version key accepted (0: any).
    pub version_key: u64,
}

#[derive(Debug, Clone)]
struct FakeNeuron {
    hotkey: [u8; 32],
    coldkey: [u8; 32],
    permit: bool,
    stake: u64,
    incentive: f64,
    last_update: u64,
}

#[derive(Debug, Clone)]
struct FakeCommit {
    hash: [u8; 32],
    block: u64,
}

#[derive(Debug, Clone)]
struct FakeSubnet {
    config: FakeSubnetConfig,
    neurons: Vec<FakeNeuron>,
    commits: BTreeMap<[u8; 32], VecDeque<FakeCommit>>,
    weights: BTreeMap<u16, Vec<(u16, u16)>>,
    burn: u64,
}

#[derive(Debug, Default)]
struct FakeState {
    block: u64,
    subnets: BTreeMap<u16, FakeSubnet>,
    balances: BTreeMap<[u8; 32], u64>,
    unreadable: bool,
}

/// The fake chain. Interior state behind a mutex, so it is shared by reference like a client.
#[derive(Debug, Default)]
pub struct FakeSubtensor {
    state: Mutex<FakeState>,
}

impl FakeSubtensor {
    /// A fake chain at block 1 with no subnets.
    pub fn new() -> FakeSubtensor {
        let fake = FakeSubtensor::default();
        fake.lock().block = 1;
        fake
    }

    fn lock(&self) -> MutexGuard<'_, FakeState> {
        // A test that panicked while holding the lock leaves consistent state: keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds subnet `netuid` with `config` (replacing one of that number).
    pub fn add_subnet(&self, netuid: u16, config: FakeSubnetConfig) {
        self.lock().subnets.insert(
            netuid,
            FakeSubnet {
                config,
                neurons: Vec::new(),
                commits: BTreeMap::new(),
                weights: BTreeMap::new(),
                burn: 0,
            },
        );
    }

    /// Sets what a registration on `netuid` burns, in rao (no-op for a missing subnet).
    pub fn set_burn(&self, netuid: u16, rao: u64) {
        if let Some(subnet) = self.lock().subnets.get_mut(&netuid) {
            subnet.burn = rao;
        }
    }

    /// Sets `coldkey`'s free balance, in rao.
    pub fn set_balance(&self, coldkey: &[u8; 32], rao: u64) {
        self.lock().balances.insert(*coldkey, rao);
    }

    /// `coldkey`'s free balance, in rao.
    pub fn balance(&self, coldkey: &[u8; 32]) -> u64 {
        self.lock().balances.get(coldkey).copied().unwrap_or(0)
    }

    /// Sets the stake and incentive of `hotkey` on `netuid` (no-op if it is not registered).
    pub fn set_neuron(&self, netuid: u16, hotkey: &[u8; 32], stake_rao: u64, incentive: f64) {
        if let Some(neuron) = self
            .lock()
            .subnets
            .get_mut(&netuid)
            .and_then(|s| s.neurons.iter_mut().find(|n| n.hotkey == *hotkey))
        {
            neuron.stake = stake_rao;
            neuron.incentive = incentive;
        }
    }

    /// Gives uid `uid` of `netuid` to `hotkey`, as subtensor does when a registration prunes
    /// the uid's old holder (who leaves the subnet). No-op for a missing uid.
    pub fn replace_uid(&self, netuid: u16, uid: u16, hotkey: &[u8; 32]) {
        if let Some(subnet) = self.lock().subnets.get_mut(&netuid)
            && let Some(neuron) = subnet.neurons.get_mut(usize::from(uid))
        {
            *neuron = FakeNeuron {
                hotkey: *hotkey,
                coldkey: [0; 32],
                permit: false,
                stake: 0,
                incentive: 0.0,
                last_update: 0,
            };
            subnet.weights.remove(&uid);
        }
    }

    /// Registers `hotkey` on `netuid` (as `burned_register` would) and returns its uid; the
    /// same uid if it is registered already. `permit` gives it a validator permit.
    ///
    /// # Errors
    /// [`ChainError::NoSubnet`] when the subnet does not exist.
    pub fn register_hotkey(
        &self,
        netuid: u16,
        hotkey: &[u8; 32],
        permit: bool,
    ) -> Result<u16, ChainError> {
        let mut state = self.lock();
        let subnet = state
            .subnets
            .get_mut(&netuid)
            .ok_or(ChainError::NoSubnet { netuid })?;
        if let Some(uid) = subnet.neurons.iter().position(|n| n.hotkey == *hotkey) {
            subnet.neurons[uid].permit = permit;
            return Ok(uid as u16);
        }
        subnet.neurons.push(FakeNeuron {
            hotkey: *hotkey,
            coldkey: [0; 32],
            permit,
            stake: 0,
            incentive: 0.0,
            last_update: 0,
        });
        Ok((subnet.neurons.len() - 1) as u16)
    }

    /// While `down`, every metagraph read fails as a node that does not answer would (a test
    /// of what a failed refresh keeps).
    pub fn set_unreadable(&self, down: bool) {
        self.lock().unreadable = down;
    }

    /// Moves the fake chain `blocks` blocks on.
    pub fn advance(&self, blocks: u64) {
        self.lock().block += blocks;
    }

    /// The weights uid `uid` has set on `netuid` (empty if none).
    pub fn weights_of(&self, netuid: u16, uid: u16) -> Vec<(u16, u16)> {
        self.lock()
            .subnets
            .get(&netuid)
            .and_then(|s| s.weights.get(&uid).cloned())
            .unwrap_or_default()
    }

    /// How many commits `hotkey` has pending on `netuid`.
    pub fn pending_commits(&self, netuid: u16, hotkey: &[u8; 32]) -> usize {
        self.lock()
            .subnets
            .get(&netuid)
            .and_then(|s| s.commits.get(hotkey).map(VecDeque::len))
            .unwrap_or(0)
    }
}

impl Chain for FakeSubtensor {
    fn network(&self) -> Network {
        Network::Local
    }

    fn register(&self, who: &Registrant, netuid: u16) -> Result<ChainRegistration, ChainError> {
        self.register_hotkey(netuid, who.address.public_key(), false)?;
        Ok(ChainRegistration::NotRequired)
    }

    /// The fake chain's genesis hash: 32 bytes of `0xfa`.
    fn genesis_hash(&self) -> Result<[u8; 32], ChainError> {
        Ok(FAKE_GENESIS)
    }

    fn metagraph(&self, netuid: u16) -> Result<Metagraph, ChainError> {
        let state = self.lock();
        if state.unreadable {
            return Err(ChainError::Endpoint {
                endpoint: "the fake chain".into(),
                reason: "it is set to fail reads".into(),
            });
        }
        let subnet = state
            .subnets
            .get(&netuid)
            .ok_or(ChainError::NoSubnet { netuid })?;
        Ok(Metagraph {
            netuid,
            block: state.block,
            neurons: subnet
                .neurons
                .iter()
                .enumerate()
                .map(|(uid, n)| Neuron {
                    uid: uid as u16,
                    hotkey: n.hotkey,
                    coldkey: n.coldkey,
                    stake_rao: n.stake,
                    validator_permit: n.permit,
                    incentive: n.incentive,
                    last_update: n.last_update,
                })
                .collect(),
        })
    }

    fn burn_cost(&self, netuid: u16) -> Result<u64, ChainError> {
        let state = self.lock();
        let subnet = state
            .subnets
            .get(&netuid)
            .ok_or(ChainError::NoSubnet { netuid })?;
        Ok(subnet.burn)
    }

    fn free_balance(&self, account: &Ss58Address) -> Result<u64, ChainError> {
        Ok(self.balance(account.public_key()))
    }

    fn burned_register(
        &self,
        coldkey: &Hotkey,
        hotkey: &Ss58Address,
        netuid: u16,
    ) -> Result<u16, ChainError> {
        let mut state = self.lock();
        let payer = coldkey.public_key();
        let balance = state.balances.get(&payer).copied().unwrap_or(0);
        let subnet = state
            .subnets
            .get_mut(&netuid)
            .ok_or(ChainError::NoSubnet { netuid })?;
        let key = *hotkey.public_key();
        if let Some(uid) = subnet.neurons.iter().position(|n| n.hotkey == key) {
            return Ok(uid as u16);
        }
        let burn = subnet.burn;
        if balance < burn {
            return Err(ChainError::InsufficientBalance {
                coldkey: coldkey.address().to_string(),
                balance_rao: balance,
                needed_rao: burn,
            });
        }
        subnet.neurons.push(FakeNeuron {
            hotkey: key,
            coldkey: payer,
            permit: false,
            stake: 0,
            incentive: 0.0,
            last_update: 0,
        });
        let uid = (subnet.neurons.len() - 1) as u16;
        state.balances.insert(payer, balance - burn);
        Ok(uid)
    }

    fn weights_policy(&self, netuid: u16) -> Result<WeightsPolicy, ChainError> {
        let state = self.lock();
        let subnet = state
            .subnets
            .get(&netuid)
            .ok_or(ChainError::NoSubnet { netuid })?;
        Ok(WeightsPolicy {
            block: state.block,
            tempo: subnet.config.tempo,
            commit_reveal: subnet.config.commit_reveal,
            reveal_period_epochs: subnet.config.reveal_period_epochs,
            weights_rate_limit: subnet.config.weights_rate_limit,
            version_key: subnet.config.version_key,
        })
    }

    fn weights(&self, netuid: u16, uid: u16) -> Result<Vec<(u16, u16)>, ChainError> {
        let state = self.lock();
        let subnet = state
            .subnets
            .get(&netuid)
            .ok_or(ChainError::NoSubnet { netuid })?;
        Ok(subnet.weights.get(&uid).cloned().unwrap_or_default())
    }

    fn weight_commits(
        &self,
        netuid: u16,
        hotkey: &[u8; 32],
    ) -> Result<Vec<([u8; 32], u64)>, ChainError> {
        let state = self.lock();
        let subnet = state
            .subnets
            .get(&netuid)
            .ok_or(ChainError::NoSubnet { netuid })?;
        Ok(subnet
            .commits
            .get(hotkey)
            .map(|commits| commits.iter().map(|c| (c.hash, c.block)).collect())
            .unwrap_or_default())
    }

    fn submit_weights(
        &self,
        signer: &Hotkey,
        netuid: u16,
        submission: &WeightSubmission,
    ) -> Result<u64, ChainError> {
        let mut state = self.lock();
        let block = state.block;
        let subnet = state
            .subnets
            .get_mut(&netuid)
            .ok_or(ChainError::NoSubnet { netuid })?;
        let hotkey = signer.public_key();
        let uid = subnet
            .neurons
            .iter()
            .position(|n| n.hotkey == hotkey)
            .ok_or_else(|| ChainError::NotRegistered {
                hotkey: Ss58Address::from_public_key(hotkey).to_string(),
                netuid,
            })?;
        let config = subnet.config;
        let epoch = |b: u64| epoch_index(netuid, config.tempo, b);
        // Never set (0), or at least `weights_rate_limit` blocks ago.
        let rate_limit = |last_update: u64| {
            let since = block.saturating_sub(last_update);
            if last_update != 0 && since < config.weights_rate_limit {
                Err(ChainError::RateLimited {
                    netuid,
                    blocks_left: config.weights_rate_limit - since,
                })
            } else {
                Ok(())
            }
        };
        match submission {
            WeightSubmission::Set {
                uids,
                values,
                version_key,
            } => {
                if config.commit_reveal {
                    return Err(ChainError::CommitReveal {
                        netuid,
                        reason: "commit-reveal is on: commit the weights, then reveal them".into(),
                    });
                }
                rate_limit(subnet.neurons[uid].last_update)?;
                set_weights(subnet, netuid, uid, uids, values, *version_key)?;
                subnet.neurons[uid].last_update = block;
            }
            WeightSubmission::Commit { hash } => {
                if !config.commit_reveal {
                    return Err(ChainError::CommitReveal {
                        netuid,
                        reason: "commit-reveal is off: set the weights directly".into(),
                    });
                }
                rate_limit(subnet.neurons[uid].last_update)?;
                let commits = subnet.commits.entry(hotkey).or_default();
                commits.retain(|c| epoch(block) <= epoch(c.block) + config.reveal_period_epochs);
                if commits.len() >= MAX_UNREVEALED_COMMITS {
                    return Err(ChainError::CommitReveal {
                        netuid,
                        reason: format!(
                            "{MAX_UNREVEALED_COMMITS} commits are unrevealed: reveal them first"
                        ),
                    });
                }
                commits.push_back(FakeCommit { hash: *hash, block });
                subnet.neurons[uid].last_update = block;
            }
            WeightSubmission::Reveal {
                uids,
                values,
                salt,
                version_key,
            } => {
                if !config.commit_reveal {
                    return Err(ChainError::CommitReveal {
                        netuid,
                        reason: "commit-reveal is off: there is nothing to reveal".into(),
                    });
                }
                let hash = commit_hash_v2(&hotkey, netuid, uids, values, salt, *version_key);
                let commits = subnet.commits.entry(hotkey).or_default();
                let due = |c: &FakeCommit| epoch(c.block) + config.reveal_period_epochs;
                let expired = commits
                    .iter()
                    .any(|c| c.hash == hash && epoch(block) > due(c));
                commits.retain(|c| epoch(block) <= due(c));
                let Some(position) = commits.iter().position(|c| c.hash == hash) else {
                    let reason = if expired {
                        "the commit expired: its reveal epoch has passed; commit again"
                    } else {
                        "no pending commit matches these weights, salt and version key"
                    };
                    return Err(ChainError::CommitReveal {
                        netuid,
                        reason: reason.into(),
                    });
                };
                let reveal_epoch = due(&commits[position]);
                if epoch(block) != reveal_epoch {
                    return Err(ChainError::CommitReveal {
                        netuid,
                        reason: format!(
                            "too early: block {block} is in epoch {}, the reveal is due in epoch {reveal_epoch}",
                            epoch(block)
                        ),
                    });
                }
                commits.drain(..=position);
                set_weights(subnet, netuid, uid, uids, values, *version_key)?;
            }
        }
        Ok(block)
    }
}

/// The checks `set_weights` and a reveal share, then the weights stored.
fn set_weights(
    subnet: &mut FakeSubnet,
    netuid: u16,
    uid: usize,
    uids: &[u16],
    values: &[u16],
    version_key: u64,
) -> Result<(), ChainError> {
    let invalid = |reason: String| ChainError::InvalidWeights { netuid, reason };
    if uids.len() != values.len() {
        return Err(invalid(format!(
            "{} uids but {} values",
            uids.len(),
            values.len()
        )));
    }
    if subnet.config.version_key != 0 && version_key < subnet.config.version_key {
        return Err(invalid(format!(
            "version key {version_key} is below the subnet's {}: update iota",
            subnet.config.version_key
        )));
    }
    let self_weight = uids.len() == 1 && usize::from(uids[0]) == uid;
    if !self_weight && !subnet.neurons[uid].permit {
        return Err(ChainError::NoValidatorPermit { netuid });
    }
    let mut seen = std::collections::BTreeSet::new();
    for u in uids {
        if usize::from(*u) >= subnet.neurons.len() {
            return Err(invalid(format!("uid {u} does not exist")));
        }
        if !seen.insert(*u) {
            return Err(invalid(format!("uid {u} appears twice")));
        }
    }
    let uid = u16::try_from(uid).map_err(|_| invalid("uid out of range".into()))?;
    subnet.weights.insert(
        uid,
        uids.iter().copied().zip(values.iter().copied()).collect(),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NETUID: u16 = 9;

    #[test]
    fn a_burned_registration_pays_once_and_shows_in_the_metagraph() {
        let chain = FakeSubtensor::new();
        chain.add_subnet(NETUID, subnet(false));
        chain.set_burn(NETUID, 1_000);
        let coldkey = Hotkey::from_uri("//Alice").unwrap();
        let hotkey = Hotkey::from_uri("//Bob").unwrap();
        let err = chain
            .burned_register(&coldkey, hotkey.address(), NETUID)
            .unwrap_err();
        assert!(
            matches!(err, ChainError::InsufficientBalance { .. }),
            "{err}"
        );
        assert!(chain.metagraph(NETUID).unwrap().neurons.is_empty());

        chain.set_balance(&coldkey.public_key(), 2_500);
        assert_eq!(chain.burn_cost(NETUID), Ok(1_000));
        let uid = chain
            .burned_register(&coldkey, hotkey.address(), NETUID)
            .unwrap();
        assert_eq!(chain.balance(&coldkey.public_key()), 1_500);
        // Registered already: the same uid, nothing paid.
        assert_eq!(
            chain.burned_register(&coldkey, hotkey.address(), NETUID),
            Ok(uid)
        );
        assert_eq!(chain.balance(&coldkey.public_key()), 1_500);

        chain.set_neuron(NETUID, &hotkey.public_key(), 7, 0.25);
        let graph = chain.metagraph(NETUID).unwrap();
        let neuron = graph.neuron(&hotkey.public_key()).unwrap();
        assert_eq!(
            (
                neuron.uid,
                neuron.coldkey,
                neuron.stake_rao,
                neuron.incentive
            ),
            (uid, coldkey.public_key(), 7, 0.25)
        );

        let newcomer = Hotkey::from_uri("//Charlie").unwrap();
        chain.replace_uid(NETUID, uid, &newcomer.public_key());
        let graph = chain.metagraph(NETUID).unwrap();
        assert!(graph.neuron(&hotkey.public_key()).is_none());
        assert_eq!(
            graph.neuron(&newcomer.public_key()).map(|n| n.uid),
            Some(uid)
        );
        assert_eq!(
            chain.burn_cost(NETUID + 1),
            Err(ChainError::NoSubnet { netuid: NETUID + 1 })
        );
    }

    fn subnet(commit_reveal: bool) -> FakeSubnetConfig {
        FakeSubnetConfig {
            tempo: 10,
            commit_reveal,
            reveal_period_epochs: 1,
            weights_rate_limit: 5,
            version_key: 0,
        }
    }

    fn key(uri: &str) -> Hotkey {
        Hotkey::from_uri(uri).unwrap()
    }

    fn set(uids: &[u16], values: &[u16]) -> WeightSubmission {
        WeightSubmission::Set {
            uids: uids.to_vec(),
            values: values.to_vec(),
            version_key: 0,
        }
    }

    #[test]
    fn the_fake_refuses_unregistered_unpermitted_and_too_fast() {
        let chain = FakeSubtensor::new();
        chain.add_subnet(NETUID, subnet(false));
        let validator = key("//Alice");
        let miner = key("//Bob");
        let stranger = key("//Eve");
        chain
            .register_hotkey(NETUID, &validator.public_key(), true)
            .unwrap();
        chain
            .register_hotkey(NETUID, &miner.public_key(), false)
            .unwrap();
        let err = chain
            .submit_weights(&stranger, NETUID, &set(&[0], &[1]))
            .unwrap_err();
        assert!(matches!(err, ChainError::NotRegistered { .. }), "{err}");
        let err = chain
            .submit_weights(&miner, NETUID, &set(&[0], &[1]))
            .unwrap_err();
        assert_eq!(err, ChainError::NoValidatorPermit { netuid: NETUID });
        // A miner's weight on itself alone needs no permit.
        chain
            .submit_weights(&miner, NETUID, &set(&[1], &[1]))
            .unwrap();
        chain
            .submit_weights(&validator, NETUID, &set(&[0, 1], &[1, 65535]))
            .unwrap();
        chain.advance(2);
        let err = chain
            .submit_weights(&validator, NETUID, &set(&[1], &[1]))
            .unwrap_err();
        assert_eq!(
            err,
            ChainError::RateLimited {
                netuid: NETUID,
                blocks_left: 3
            }
        );
        chain.advance(3);
        chain
            .submit_weights(&validator, NETUID, &set(&[1], &[7]))
            .unwrap();
        assert_eq!(chain.weights_of(NETUID, 0), [(1, 7)]);
        assert!(
            chain
                .submit_weights(&validator, NETUID, &set(&[1, 1], &[1, 2]))
                .is_err()
        );
    }

    #[test]
    fn the_fake_reveals_only_in_the_reveal_epoch() {
        let chain = FakeSubtensor::new();
        chain.add_subnet(NETUID, subnet(true));
        let validator = key("//Alice");
        chain
            .register_hotkey(NETUID, &validator.public_key(), true)
            .unwrap();
        let salt = [1, 2, 3];
        let hash = commit_hash_v2(&validator.public_key(), NETUID, &[0], &[9], &salt, 0);
        let reveal = WeightSubmission::Reveal {
            uids: vec![0],
            values: vec![9],
            salt: salt.to_vec(),
            version_key: 0,
        };
        assert!(
            chain
                .submit_weights(&validator, NETUID, &set(&[0], &[1]))
                .is_err()
        );
        let block = chain
            .submit_weights(&validator, NETUID, &WeightSubmission::Commit { hash })
            .unwrap();
        let err = chain
            .submit_weights(&validator, NETUID, &reveal)
            .unwrap_err();
        assert!(err.to_string().contains("too early"), "{err}");
        // On to the first block of the next epoch.
        let next = (epoch_index(NETUID, 10, block) + 1) * 11 - u64::from(NETUID) - 1;
        chain.advance(next - block);
        chain.submit_weights(&validator, NETUID, &reveal).unwrap();
        assert_eq!(chain.weights_of(NETUID, 0), [(0, 9)]);
        assert_eq!(chain.pending_commits(NETUID, &validator.public_key()), 0);
        // A second reveal of the same commit finds nothing.
        assert!(chain.submit_weights(&validator, NETUID, &reveal).is_err());
    }
}
