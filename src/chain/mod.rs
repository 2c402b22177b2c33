//! The chain a hotkey registers on, behind the [`Chain`] trait.
//!
//! On Bittensor a miner first registers its hotkey on the subnet (an extrinsic on subtensor,
//! paid with the coldkey); the orchestrator then admits registered hotkeys.
//!
//! - [`Network::Local`] ([`LocalRegistry`]): no chain; the orchestrator's own registry is the
//!   whole truth (a local network, a private run). Registration needs nothing on-chain.
//! - [`Network::Finney`], [`Network::Test`] and [`Network::Url`]
//!   ([`subtensor::node::SubtensorChain`]): a subtensor node over JSON-RPC: the metagraph, the
//!   burn, balances and weight settings read from it, `burned_register` and weights submitted
//!   to it and followed until a block carries them. Its methods block: async callers use
//!   `tokio::task::spawn_blocking`.
//! - [`fake::FakeSubtensor`]: an in-memory **fake** chain for tests.
//!
//! What is sent is built in [`subtensor`] (call data, commit hashes, signed extrinsics from the
//! runtime's metadata).

pub mod fake;
pub mod pending;
pub mod shared;
pub mod subtensor;

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use crate::wallet::{Hotkey, Ss58Address};

/// The subnet the reference network runs on (Bittensor subnet 9).
pub const DEFAULT_NETUID: u16 = 9;

/// Which chain a registration is for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Network {
    /// No chain: the orchestrator's registry decides (local and private runs).
    #[default]
    Local,
    /// Bittensor mainnet.
    Finney,
    /// Bittensor testnet.
    Test,
    /// A subtensor node at this endpoint (`ws://`, `wss://`, `http://` or `https://`), such as
    /// a localnet.
    Url(String),
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Local => "local",
            Self::Finney => "finney",
            Self::Test => "test",
            Self::Url(url) => url,
        })
    }
}

impl FromStr for Network {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "local" | "none" => Ok(Self::Local),
            "finney" | "main" | "mainnet" => Ok(Self::Finney),
            "test" | "testnet" => Ok(Self::Test),
            other
                if ["ws://", "wss://", "http://", "https://"]
                    .iter()
                    .any(|scheme| other.starts_with(scheme)) =>
            {
                Ok(Self::Url(s.trim().to_string()))
            }
            other => Err(format!(
                "unknown network `{other}` (expected local, finney, test or a node's ws:// or wss:// URL)"
            )),
        }
    }
}

/// Who is registering, for the messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registrant {
    /// Wallet name (for the `btcli` command line).
    pub wallet: String,
    /// Hotkey name.
    pub hotkey: String,
    /// The hotkey's address.
    pub address: Ss58Address,
}

/// What a chain said about a registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainRegistration {
    /// The network has no chain; the orchestrator's registry is authoritative.
    NotRequired,
}

/// A hotkey registered on chain by [`Chain::burned_register_in_block`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnChainRegistration {
    /// The uid the subnet gave the hotkey.
    pub uid: u16,
    /// The block the registration is in (`None`: it was registered before, nothing was sent).
    pub block: Option<u64>,
    /// What was burned, in rao (0 when nothing was sent).
    pub burned_rao: u64,
}

/// Why a chain operation failed.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ChainError {
    /// This chain does not do that (the local registry has no weights on chain).
    #[error("{network} has no on-chain {what}: {instead}")]
    Unsupported {
        /// The network asked.
        network: Network,
        /// What was asked for.
        what: &'static str,
        /// What to do instead.
        instead: &'static str,
    },
    /// The subnet does not exist.
    #[error("subnet {netuid} does not exist on this chain: check the netuid")]
    NoSubnet {
        /// The subnet asked for.
        netuid: u16,
    },
    /// The hotkey is not registered on the subnet.
    #[error(
        "hotkey {hotkey} is not registered on subnet {netuid}: register it first (`iota register`)"
    )]
    NotRegistered {
        /// The hotkey's SS58 address.
        hotkey: String,
        /// The subnet.
        netuid: u16,
    },
    /// Weights on other uids need a validator permit the hotkey does not hold.
    #[error(
        "this hotkey has no validator permit on subnet {netuid}: only permitted validators set weights on other uids (stake more, then wait for the next epoch)"
    )]
    NoValidatorPermit {
        /// The subnet.
        netuid: u16,
    },
    /// Too soon after the last weights of this uid.
    #[error(
        "weights on subnet {netuid} are rate-limited: the next submission is allowed in {blocks_left} blocks; wait"
    )]
    RateLimited {
        /// The subnet.
        netuid: u16,
        /// Blocks until the limit allows one more.
        blocks_left: u64,
    },
    /// A commit or reveal that the subnet's commit-reveal rules refuse.
    #[error("commit-reveal on subnet {netuid}: {reason}")]
    CommitReveal {
        /// The subnet.
        netuid: u16,
        /// What is wrong and what to do.
        reason: String,
    },
    /// Weights the chain refuses (uids, lengths, version key).
    #[error("weights refused on subnet {netuid}: {reason}")]
    InvalidWeights {
        /// The subnet.
        netuid: u16,
        /// Why.
        reason: String,
    },
    /// The node did not answer, or answered with something that is not subtensor's RPC.
    #[error(
        "cannot reach the subtensor node at {endpoint}: {reason}; check the URL and that the node is up"
    )]
    Endpoint {
        /// The endpoint asked.
        endpoint: String,
        /// What went wrong.
        reason: String,
    },
    /// The coldkey cannot pay for what was asked (a registration's burn).
    #[error(
        "the coldkey {coldkey} holds {balance_rao} rao, and this needs {needed_rao} rao: transfer TAO to it first"
    )]
    InsufficientBalance {
        /// The coldkey's SS58 address.
        coldkey: String,
        /// Its free balance, in rao (1 TAO = 10^9 rao).
        balance_rao: u64,
        /// What the operation costs, in rao.
        needed_rao: u64,
    },
    /// The runtime no longer has a call, storage item or runtime API in the shape iota encodes.
    #[error(
        "the chain's runtime (spec_version {spec_version}) changed what iota uses: {what}; update iota"
    )]
    RuntimeChanged {
        /// The runtime's spec version.
        spec_version: u32,
        /// What changed.
        what: String,
    },
    /// The chain refused an extrinsic for a reason without a variant of its own.
    #[error("the chain refused {call} on subnet {netuid}: {reason}")]
    Refused {
        /// The call.
        call: &'static str,
        /// The subnet.
        netuid: u16,
        /// The pallet's error, and what to do.
        reason: String,
    },
}

/// One registered hotkey of a subnet, as its metagraph has it.
#[derive(Debug, Clone, PartialEq)]
pub struct Neuron {
    /// The uid (its index in the subnet).
    pub uid: u16,
    /// The hotkey's public key.
    pub hotkey: [u8; 32],
    /// The coldkey that owns it.
    pub coldkey: [u8; 32],
    /// Stake on the hotkey, in rao.
    pub stake_rao: u64,
    /// Whether it may set weights on other uids.
    pub validator_permit: bool,
    /// Its share of the subnet's incentive at the last epoch, in `[0, 1]`.
    pub incentive: f64,
    /// The block of its last weights (0: never).
    pub last_update: u64,
}

impl Neuron {
    /// The hotkey's SS58 address.
    pub fn address(&self) -> Ss58Address {
        Ss58Address::from_public_key(self.hotkey)
    }
}

/// A subnet's metagraph at a block: who is registered and with what stake and permits.
#[derive(Debug, Clone, PartialEq)]
pub struct Metagraph {
    /// The subnet.
    pub netuid: u16,
    /// The block this was read at.
    pub block: u64,
    /// The neurons, by uid.
    pub neurons: Vec<Neuron>,
}

impl Metagraph {
    /// The neuron holding `hotkey`, if it is registered.
    pub fn neuron(&self, hotkey: &[u8; 32]) -> Option<&Neuron> {
        self.neurons.iter().find(|n| n.hotkey == *hotkey)
    }
}

/// How a subnet takes weights, at a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightsPolicy {
    /// The block this was read at.
    pub block: u64,
    /// Blocks per epoch, less one (subtensor's `Tempo`).
    pub tempo: u16,
    /// Whether weights go through commit-reveal (v2: commit, then reveal).
    pub commit_reveal: bool,
    /// How many epochs after its commit a reveal is due.
    pub reveal_period_epochs: u64,
    /// Blocks between two submissions of one uid.
    pub weights_rate_limit: u64,
    /// The lowest version key the subnet accepts (0: any).
    pub version_key: u64,
}

impl WeightsPolicy {
    /// The epoch a commit made at `commit_block` on `netuid` is to be revealed in.
    pub fn reveal_epoch(&self, netuid: u16, commit_block: u64) -> u64 {
        epoch_index(netuid, self.tempo, commit_block) + self.reveal_period_epochs
    }

    /// The epoch of the block this policy was read at.
    pub fn current_epoch(&self, netuid: u16) -> u64 {
        epoch_index(netuid, self.tempo, self.block)
    }
}

/// Subtensor's epoch of `block` on subnet `netuid`: `(block + netuid + 1) / (tempo + 1)`.
pub fn epoch_index(netuid: u16, tempo: u16, block: u64) -> u64 {
    (block + u64::from(netuid) + 1) / (u64::from(tempo) + 1)
}

/// Weights a validator submits, as u16 values by uid (see
/// [`subtensor::commit::weights_for_emit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WeightSubmission {
    /// `set_weights`: directly, where commit-reveal is off.
    Set {
        /// The uids.
        uids: Vec<u16>,
        /// Their weights.
        values: Vec<u16>,
        /// The validator's version key.
        version_key: u64,
    },
    /// `commit_weights`: the v2 hash ([`subtensor::commit::commit_hash_v2`]).
    Commit {
        /// The commit hash.
        hash: [u8; 32],
    },
    /// `reveal_weights`: what the hash was made of.
    Reveal {
        /// The uids.
        uids: Vec<u16>,
        /// Their weights.
        values: Vec<u16>,
        /// The salt the hash was made with.
        salt: Vec<u16>,
        /// The version key the hash was made with.
        version_key: u64,
    },
}

/// A chain on which hotkeys register.
pub trait Chain {
    /// The network this chain is.
    fn network(&self) -> Network;

    /// Registers `who` on subnet `netuid` (or checks that nothing is needed).
    ///
    /// # Errors
    /// [`ChainError`] when the registration cannot be made from here.
    fn register(&self, who: &Registrant, netuid: u16) -> Result<ChainRegistration, ChainError>;

    /// The hash of the chain's genesis block: what names a chain whichever node serves it.
    ///
    /// # Errors
    /// [`ChainError::Unsupported`] on a chain without blocks (the default).
    fn genesis_hash(&self) -> Result<[u8; 32], ChainError> {
        Err(ChainError::Unsupported {
            network: self.network(),
            what: "genesis block",
            instead: "compare the networks by name",
        })
    }

    /// Subnet `netuid`'s metagraph now.
    ///
    /// # Errors
    /// [`ChainError::Unsupported`] on a chain without a metagraph (the default).
    fn metagraph(&self, netuid: u16) -> Result<Metagraph, ChainError> {
        let _ = netuid;
        Err(ChainError::Unsupported {
            network: self.network(),
            what: "metagraph",
            instead: "the orchestrator's own registry admits miners",
        })
    }

    /// What registering a hotkey on `netuid` burns now, in rao.
    ///
    /// # Errors
    /// [`ChainError::Unsupported`] on a chain without registration fees (the default).
    fn burn_cost(&self, netuid: u16) -> Result<u64, ChainError> {
        let _ = netuid;
        Err(ChainError::Unsupported {
            network: self.network(),
            what: "registration burn",
            instead: "register with the orchestrator (`iota register` without --network)",
        })
    }

    /// Registers `hotkey` on `netuid` with `burned_register`, paid and signed by `coldkey`, and
    /// waits until it is in a block; returns the uid it was given. A hotkey already registered
    /// returns its uid without paying again.
    ///
    /// # Errors
    /// [`ChainError`] saying why (balance, subnet, node); the default refuses with
    /// [`ChainError::Unsupported`].
    fn burned_register(
        &self,
        coldkey: &Hotkey,
        hotkey: &Ss58Address,
        netuid: u16,
    ) -> Result<u16, ChainError> {
        let _ = (coldkey, hotkey, netuid);
        Err(ChainError::Unsupported {
            network: self.network(),
            what: "registration",
            instead: "register with the orchestrator (`iota register` without --network)",
        })
    }

    /// As [`Chain::burned_register`], and says in which block (where the chain can tell) and
    /// what it burned.
    ///
    /// # Errors
    /// As [`Chain::burned_register`].
    fn burned_register_in_block(
        &self,
        coldkey: &Hotkey,
        hotkey: &Ss58Address,
        netuid: u16,
    ) -> Result<OnChainRegistration, ChainError> {
        let burn = self.burn_cost(netuid).unwrap_or(0);
        self.burned_register(coldkey, hotkey, netuid)
            .map(|uid| OnChainRegistration {
                uid,
                block: None,
                burned_rao: burn,
            })
    }

    /// The free balance of `account`, in rao.
    ///
    /// # Errors
    /// [`ChainError::Unsupported`] on a chain without balances (the default).
    fn free_balance(&self, account: &Ss58Address) -> Result<u64, ChainError> {
        let _ = account;
        Err(ChainError::Unsupported {
            network: self.network(),
            what: "balances",
            instead: "register with the orchestrator (`iota register` without --network)",
        })
    }

    /// How subnet `netuid` takes weights now.
    ///
    /// # Errors
    /// [`ChainError::Unsupported`] on a chain without weights (the default).
    fn weights_policy(&self, netuid: u16) -> Result<WeightsPolicy, ChainError> {
        let _ = netuid;
        Err(ChainError::Unsupported {
            network: self.network(),
            what: "weights",
            instead: "validators publish to the orchestrator's metagraph",
        })
    }

    /// The weights uid `uid` last set on `netuid` as the chain stores them now: `(uid, value)`
    /// pairs, the largest value at `u16::MAX`; empty if it never set any.
    ///
    /// # Errors
    /// [`ChainError::Unsupported`] on a chain without weights (the default).
    fn weights(&self, netuid: u16, uid: u16) -> Result<Vec<(u16, u16)>, ChainError> {
        let _ = (netuid, uid);
        Err(ChainError::Unsupported {
            network: self.network(),
            what: "weights",
            instead: "the orchestrator's /api/weights shows what validators published",
        })
    }

    /// The commits (commit-reveal v2) `hotkey` has on `netuid` as the chain stores them now:
    /// each one's hash and the block it was made in, oldest first; empty if none.
    ///
    /// # Errors
    /// [`ChainError::Unsupported`] on a chain without weights (the default).
    fn weight_commits(
        &self,
        netuid: u16,
        hotkey: &[u8; 32],
    ) -> Result<Vec<([u8; 32], u64)>, ChainError> {
        let _ = (netuid, hotkey);
        Err(ChainError::Unsupported {
            network: self.network(),
            what: "weight commits",
            instead: "validators publish to the orchestrator's metagraph",
        })
    }

    /// Submits `submission` signed by `signer` (a validator's hotkey) on `netuid`; returns the
    /// block it was included in.
    ///
    /// # Errors
    /// [`ChainError`] saying why the chain refused it; the default refuses every submission
    /// with [`ChainError::Unsupported`].
    fn submit_weights(
        &self,
        signer: &Hotkey,
        netuid: u16,
        submission: &WeightSubmission,
    ) -> Result<u64, ChainError> {
        let _ = (signer, netuid, submission);
        Err(ChainError::Unsupported {
            network: self.network(),
            what: "weights",
            instead: "validators publish to the orchestrator's metagraph",
        })
    }
}

/// No chain: the orchestrator's registry is the whole truth.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalRegistry;

impl Chain for LocalRegistry {
    fn network(&self) -> Network {
        Network::Local
    }

    fn register(&self, _who: &Registrant, _netuid: u16) -> Result<ChainRegistration, ChainError> {
        Ok(ChainRegistration::NotRequired)
    }
}

/// A node whose endpoint cannot be used at all (a URL that does not parse): every call says so.
#[derive(Debug, Clone)]
pub struct UnreachableChain {
    network: Network,
    reason: String,
}

impl UnreachableChain {
    fn error(&self) -> ChainError {
        ChainError::Endpoint {
            endpoint: self.network.to_string(),
            reason: self.reason.clone(),
        }
    }
}

impl Chain for UnreachableChain {
    fn network(&self) -> Network {
        self.network.clone()
    }

    fn register(&self, _who: &Registrant, _netuid: u16) -> Result<ChainRegistration, ChainError> {
        Err(self.error())
    }

    fn genesis_hash(&self) -> Result<[u8; 32], ChainError> {
        Err(self.error())
    }

    fn metagraph(&self, _netuid: u16) -> Result<Metagraph, ChainError> {
        Err(self.error())
    }

    fn burn_cost(&self, _netuid: u16) -> Result<u64, ChainError> {
        Err(self.error())
    }

    fn free_balance(&self, _account: &Ss58Address) -> Result<u64, ChainError> {
        Err(self.error())
    }

    fn burned_register(
        &self,
        _coldkey: &Hotkey,
        _hotkey: &Ss58Address,
        _netuid: u16,
    ) -> Result<u16, ChainError> {
        Err(self.error())
    }

    fn weights_policy(&self, _netuid: u16) -> Result<WeightsPolicy, ChainError> {
        Err(self.error())
    }

    fn weights(&self, _netuid: u16, _uid: u16) -> Result<Vec<(u16, u16)>, ChainError> {
        Err(self.error())
    }

    fn weight_commits(
        &self,
        _netuid: u16,
        _hotkey: &[u8; 32],
    ) -> Result<Vec<([u8; 32], u64)>, ChainError> {
        Err(self.error())
    }

    fn submit_weights(
        &self,
        _signer: &Hotkey,
        _netuid: u16,
        _submission: &WeightSubmission,
    ) -> Result<u64, ChainError> {
        Err(self.error())
    }
}

/// The chain for `network`: the local registry, or a subtensor node (finney's and testnet's
/// public entry points as the Bittensor SDK names them, or the URL given).
pub fn chain_for(network: Network) -> Box<dyn Chain> {
    match network {
        Network::Local => Box::new(LocalRegistry),
        Network::Finney | Network::Test | Network::Url(_) => {
            match subtensor::node::SubtensorChain::new(network.clone()) {
                Ok(chain) => Box::new(chain),
                Err(e) => Box::new(UnreachableChain {
                    network,
                    reason: match e {
                        ChainError::Endpoint { reason, .. } => reason,
                        other => other.to_string(),
                    },
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wallet::{DEV_PHRASE, Hotkey};

    fn alice() -> Registrant {
        Registrant {
            wallet: "w".into(),
            hotkey: "h".into(),
            address: Hotkey::from_phrase(DEV_PHRASE).unwrap().address().clone(),
        }
    }

    #[test]
    fn local_needs_nothing_on_chain() {
        let chain = chain_for(Network::Local);
        assert_eq!(chain.network(), Network::Local);
        assert_eq!(
            chain.register(&alice(), DEFAULT_NETUID),
            Ok(ChainRegistration::NotRequired)
        );
    }

    #[test]
    fn bittensor_networks_are_subtensor_nodes() {
        for network in ["finney", "mainnet", "test", "ws://127.0.0.1:9944"] {
            let network: Network = network.parse().unwrap();
            assert_eq!(chain_for(network.clone()).network(), network);
        }
        assert!("moon".parse::<Network>().is_err());
        // A URL that does not parse is refused by every call, in one line.
        let chain = chain_for(Network::Url("http://[::1".into()));
        let err = chain.burn_cost(DEFAULT_NETUID).unwrap_err().to_string();
        assert!(
            err.starts_with("cannot reach the subtensor node at http://[::1"),
            "{err}"
        );
    }
}
