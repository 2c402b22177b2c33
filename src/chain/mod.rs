//! The chain a hotkey registers on, behind the [`Chain`] trait.
//!
//! On Bittensor a miner first registers its hotkey on the subnet (an extrinsic on subtensor,
//! paid with the coldkey); the orchestrator then admits registered hotkeys. iota has no
//! subtensor client, so this module is explicit about what it can and cannot do:
//!
//! - [`Network::Local`] ([`LocalRegistry`]): no chain; the orchestrator's own registry is the
//!   whole truth (a local network, a private run). Registration needs nothing on-chain.
//! - [`Network::Finney`] and [`Network::Test`] ([`UnreachableChain`]): refuse with
//!   [`ChainError::Unreachable`], whose message names the `btcli` command to run instead and
//!   the `iota register` to run after it. Never a silent success.
//!
//! A real subtensor backend would be one more implementation of [`Chain`].

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use crate::wallet::Ss58Address;

/// The subnet the reference network runs on (Bittensor subnet 9).
pub const DEFAULT_NETUID: u16 = 9;

/// Which chain a registration is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Network {
    /// No chain: the orchestrator's registry decides (local and private runs).
    #[default]
    Local,
    /// Bittensor mainnet.
    Finney,
    /// Bittensor testnet.
    Test,
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Local => "local",
            Self::Finney => "finney",
            Self::Test => "test",
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
            other => Err(format!(
                "unknown network `{other}` (expected local, finney or test)"
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

/// Why a chain operation failed.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ChainError {
    /// The chain cannot be reached from this binary; `instead` says what to run.
    #[error(
        "on-chain registration on {network} (netuid {netuid}) is not reachable from iota: this binary has no subtensor client. {instead}"
    )]
    Unreachable {
        /// The network asked for.
        network: Network,
        /// The subnet.
        netuid: u16,
        /// The commands to run instead.
        instead: String,
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

/// A Bittensor network this binary cannot reach: every registration is refused with the
/// `btcli` command to run instead.
#[derive(Debug, Clone, Copy)]
pub struct UnreachableChain {
    network: Network,
}

impl Chain for UnreachableChain {
    fn network(&self) -> Network {
        self.network
    }

    fn register(&self, who: &Registrant, netuid: u16) -> Result<ChainRegistration, ChainError> {
        Err(ChainError::Unreachable {
            network: self.network,
            netuid,
            instead: format!(
                "Register the hotkey ({}) with the Bittensor CLI: `btcli subnet register --netuid {netuid} --network {} --wallet.name {} --wallet.hotkey {}`; then join the orchestrator with `iota register --wallet {} --hotkey {} --orchestrator URL` (without --network).",
                who.address, self.network, who.wallet, who.hotkey, who.wallet, who.hotkey
            ),
        })
    }
}

/// The chain for `network`.
pub fn chain_for(network: Network) -> Box<dyn Chain> {
    match network {
        Network::Local => Box::new(LocalRegistry),
        Network::Finney | Network::Test => Box::new(UnreachableChain { network }),
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
    fn finney_refuses_and_says_what_to_run() {
        for network in ["finney", "mainnet", "test"] {
            let network: Network = network.parse().unwrap();
            let err = chain_for(network)
                .register(&alice(), DEFAULT_NETUID)
                .unwrap_err()
                .to_string();
            assert!(err.contains("not reachable"), "{err}");
            assert!(
                err.contains(&format!(
                    "btcli subnet register --netuid 9 --network {network} --wallet.name w --wallet.hotkey h"
                )),
                "{err}"
            );
            assert!(err.contains("iota register --wallet w --hotkey h"), "{err}");
        }
        assert!("moon".parse::<Network>().is_err());
    }
}
