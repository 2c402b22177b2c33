//! The subnet a run is on (`chain:` in the run config), as the orchestrator sees it: the
//! metagraph it last read. With one attached ([`super::AppState::attach_subnet`]):
//!
//! - only hotkeys registered on the subnet register as miners, and a miner whose hotkey left
//!   the metagraph (its uid went to another hotkey) is refused and loses its seat, so routing
//!   drops it ([`super::chain_refresh::retire_departed`]);
//! - the validators are the hotkeys holding a validator permit, with their stake in TAO (the
//!   run config's `validators` list is not used);
//! - the metagraph is read again every `refresh_secs` ([`super::chain_refresh::refresh_loop`],
//!   on a blocking thread);
//!   a failed read keeps the metagraph before it and logs one line.
//!
//! The chain is injected ([`SharedChain`]): `iota orchestrate` opens the configured network's,
//! tests pass the FAKE chain.

use std::str::FromStr;
use std::sync::RwLock;

use super::config::{ChainConfig, ValidatorEntry};
use crate::api::{ChainNeuron, ChainStatus};
use crate::chain::shared::SharedChain;
use crate::chain::{ChainError, Metagraph, Neuron};
use crate::wallet::Ss58Address;

/// Rao in one TAO.
pub const RAO_PER_TAO: f64 = 1e9;

/// The subnet's metagraph as last read, and the chain to read it from.
pub struct Subnet {
    chain: SharedChain,
    config: ChainConfig,
    view: RwLock<View>,
}

struct View {
    metagraph: Metagraph,
    refreshed_ms: u64,
    error: Option<String>,
}

impl std::fmt::Debug for Subnet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subnet")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Why the subnet could not be read at start.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the metagraph of subnet {netuid} on {network}: {}", explain(.error))]
pub struct SubnetError {
    /// The network.
    pub network: String,
    /// The subnet.
    pub netuid: u16,
    /// The chain's error.
    pub error: ChainError,
}

/// The chain's error, where it is that this build has no client for the network, in words
/// that say what to do about it.
fn explain(error: &ChainError) -> String {
    match error {
        ChainError::Unsupported { network, .. } => format!(
            "this build has no subtensor client for {network}; leave out `chain` to run on the \
             orchestrator's own registry"
        ),
        other => other.to_string(),
    }
}

impl Subnet {
    /// Reads the subnet's metagraph once (a blocking call: from async code, inside
    /// `spawn_blocking`).
    ///
    /// # Errors
    /// [`SubnetError`] when the chain does not answer with it.
    pub fn connect(
        chain: SharedChain,
        config: ChainConfig,
        now_ms: u64,
    ) -> Result<Subnet, SubnetError> {
        let metagraph = chain
            .metagraph(config.netuid)
            .map_err(|error| SubnetError {
                network: config.network.to_string(),
                netuid: config.netuid,
                error,
            })?;
        Ok(Subnet {
            chain,
            config,
            view: RwLock::new(View {
                metagraph,
                refreshed_ms: now_ms,
                error: None,
            }),
        })
    }

    /// The run's chain settings.
    pub fn config(&self) -> &ChainConfig {
        &self.config
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, View> {
        self.view.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the metagraph again (blocking). On failure the one before stays, and the error
    /// is kept for the status.
    ///
    /// # Errors
    /// The chain's error.
    pub fn refresh(&self, now_ms: u64) -> Result<(), ChainError> {
        let result = self.chain.metagraph(self.config.netuid);
        let mut view = self.view.write().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(metagraph) => {
                *view = View {
                    metagraph,
                    refreshed_ms: now_ms,
                    error: None,
                };
                Ok(())
            }
            Err(e) => {
                view.error = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// The metagraph as last read.
    pub fn metagraph(&self) -> Metagraph {
        self.read().metagraph.clone()
    }

    /// The neuron of SS58 `hotkey`, if it is registered on the subnet.
    pub fn neuron(&self, hotkey: &str) -> Option<Neuron> {
        let address = Ss58Address::from_str(hotkey).ok()?;
        self.read().metagraph.neuron(address.public_key()).cloned()
    }

    /// Whether SS58 `hotkey` is registered on the subnet.
    pub fn is_registered(&self, hotkey: &str) -> bool {
        self.neuron(hotkey).is_some()
    }

    /// Why `hotkey` may not join, in one line that says what to run.
    pub fn not_registered(&self, hotkey: &str) -> String {
        format!(
            "hotkey {hotkey} is not registered on subnet {netuid} of {network}: register it with \
             `iota register --network {network} --netuid {netuid}`, then try again",
            netuid = self.config.netuid,
            network = self.config.network
        )
    }

    /// The validators: hotkeys with a validator permit, with their stake in TAO.
    pub fn validators(&self) -> Vec<ValidatorEntry> {
        self.read()
            .metagraph
            .neurons
            .iter()
            .filter(|n| n.validator_permit)
            .map(|n| ValidatorEntry {
                hotkey: n.address().to_string(),
                stake: n.stake_rao as f64 / RAO_PER_TAO,
            })
            .collect()
    }

    /// The metagraph for `/api/status`; `is_miner` says which hotkeys are registered here.
    pub fn status(&self, is_miner: impl Fn(&str) -> bool) -> ChainStatus {
        let view = self.read();
        ChainStatus {
            network: self.config.network.to_string(),
            netuid: self.config.netuid,
            block: view.metagraph.block,
            refreshed_unix_ms: view.refreshed_ms,
            error: view.error.clone(),
            neurons: view
                .metagraph
                .neurons
                .iter()
                .map(|n| {
                    let hotkey = n.address().to_string();
                    ChainNeuron {
                        uid: n.uid,
                        miner: is_miner(&hotkey),
                        hotkey,
                        stake_tao: n.stake_rao as f64 / RAO_PER_TAO,
                        validator_permit: n.validator_permit,
                        incentive: n.incentive,
                        last_update: n.last_update,
                    }
                })
                .collect(),
        }
    }
}
