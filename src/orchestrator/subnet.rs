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
//!   a failed read keeps the metagraph before it and logs one line;
//! - with each read, the weights every validator last set are read from the chain's storage
//!   (`SubtensorModule.Weights`), for the status: the largest few of each.
//!
//! The chain is injected ([`SharedChain`]): `iota orchestrate` opens the configured network's,
//! tests pass the FAKE chain.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::RwLock;

use super::config::{ChainConfig, ValidatorEntry};
use crate::api::{ChainNeuron, ChainStatus};
use crate::chain::shared::SharedChain;
use crate::chain::{ChainError, Metagraph, Neuron};
use crate::wallet::Ss58Address;

/// Rao in one TAO.
pub const RAO_PER_TAO: f64 = 1e9;

/// How many of a validator's largest weights the status shows.
pub const TOP_WEIGHTS: usize = 5;

/// The subnet's metagraph as last read, and the chain to read it from.
pub struct Subnet {
    chain: SharedChain,
    config: ChainConfig,
    /// The chain's genesis hash, read at connect (`None`: the chain cannot tell).
    genesis: Option<[u8; 32]>,
    view: RwLock<View>,
}

struct View {
    metagraph: Metagraph,
    /// The weights each validator (by uid) last set, as read with the metagraph.
    weights: BTreeMap<u16, Vec<(u16, u16)>>,
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
        let genesis = chain.genesis_hash().ok();
        let (weights, error) = match read_weights(chain.as_ref(), config.netuid, &metagraph) {
            Ok(weights) => (weights, None),
            Err(e) => (
                BTreeMap::new(),
                Some(format!("the validators' weights: {e}")),
            ),
        };
        Ok(Subnet {
            chain,
            config,
            genesis,
            view: RwLock::new(View {
                metagraph,
                weights,
                refreshed_ms: now_ms,
                error,
            }),
        })
    }

    /// The run's chain settings.
    pub fn config(&self) -> &ChainConfig {
        &self.config
    }

    /// The run's chain as validators are told it: network, subnet, burn uid and genesis hash.
    pub fn run_chain(&self) -> crate::api::RunChain {
        self.config.run_chain(self.genesis)
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
        let result = self
            .chain
            .metagraph(self.config.netuid)
            .and_then(|metagraph| {
                let weights = read_weights(self.chain.as_ref(), self.config.netuid, &metagraph)?;
                Ok((metagraph, weights))
            });
        let mut view = self.view.write().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok((metagraph, weights)) => {
                *view = View {
                    metagraph,
                    weights,
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
                    let weights = view.weights.get(&n.uid).map_or(&[][..], Vec::as_slice);
                    ChainNeuron {
                        uid: n.uid,
                        miner: is_miner(&hotkey),
                        hotkey,
                        stake_tao: n.stake_rao as f64 / RAO_PER_TAO,
                        validator_permit: n.validator_permit,
                        incentive: n.incentive,
                        last_update: n.last_update,
                        weights: top_weights(weights),
                        weights_count: weights.len(),
                    }
                })
                .collect(),
        }
    }
}

/// The weights of every validator (permit holder) of `metagraph`, by uid.
fn read_weights(
    chain: &dyn crate::chain::Chain,
    netuid: u16,
    metagraph: &Metagraph,
) -> Result<BTreeMap<u16, Vec<(u16, u16)>>, ChainError> {
    metagraph
        .neurons
        .iter()
        .filter(|n| n.validator_permit)
        .map(|n| Ok((n.uid, chain.weights(netuid, n.uid)?)))
        .collect()
}

/// The [`TOP_WEIGHTS`] largest of `weights` as `(uid, share of their sum)`, largest first (ties
/// by uid).
pub fn top_weights(weights: &[(u16, u16)]) -> Vec<(u16, f64)> {
    let total: f64 = weights.iter().map(|(_, w)| f64::from(*w)).sum();
    if total == 0.0 {
        return Vec::new();
    }
    let mut sorted = weights.to_vec();
    sorted.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    sorted
        .into_iter()
        .take(TOP_WEIGHTS)
        .map(|(uid, w)| (uid, f64::from(w) / total))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_weights_come_first_as_shares_of_the_sum() {
        assert!(top_weights(&[]).is_empty());
        assert!(top_weights(&[(3, 0)]).is_empty());
        let weights = [(0, 100), (1, 300), (2, 300), (3, 50), (4, 25), (5, 25)];
        let top = top_weights(&weights);
        assert_eq!(
            top.iter().map(|(u, _)| *u).collect::<Vec<_>>(),
            [1, 2, 0, 3, 4]
        );
        assert!((top[0].1 - 0.375).abs() < 1e-12);
        assert!((top[4].1 - 0.03125).abs() < 1e-12);
    }
}
