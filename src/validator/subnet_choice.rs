//! The subnet a validator sets weights on comes from its own settings (`iota validate --network
//! ... --netuid ...`), never from the orchestrator: an orchestrator that could name the chain
//! could send a validator's weights (and its signature) to a subnet of its choosing.
//!
//! [`check_announced`] compares the validator's choice with what the orchestrator announces
//! for its run (`/api/validator/register`), before anything is written or sent, and refuses
//! with one line when they differ: another netuid, a chain on one side only, or another
//! network. Two networks are the same when they name the same endpoint (`finney` and its
//! public entry point are one), or else when the validator's own node reports the genesis hash
//! the orchestrator's node reported (the same chain reached through two nodes).

use std::str::FromStr;

use thiserror::Error;

use crate::api::RunChain;
use crate::chain::subtensor::rpc::endpoint_of;
use crate::chain::{ChainError, Network};

/// The subnet a validator is set for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetChoice {
    /// The network (not [`Network::Local`]).
    pub network: Network,
    /// The subnet.
    pub netuid: u16,
}

impl SubnetChoice {
    /// The choice of `--network` and `--netuid`: `None` for the local network (no chain).
    pub fn from_flags(network: Network, netuid: u16) -> Option<SubnetChoice> {
        (network != Network::Local).then_some(SubnetChoice { network, netuid })
    }
}

/// Why the validator will not validate the orchestrator's run.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SubnetMismatch {
    /// The run is on a subnet; the validator is set for none.
    #[error(
        "the orchestrator's run is on subnet {netuid} of {network}, and this validator is set for no chain: pass --network {network} --netuid {netuid} if that is the subnet you validate for"
    )]
    ValidatorHasNone {
        /// The run's network.
        network: String,
        /// The run's subnet.
        netuid: u16,
    },
    /// The validator is set for a subnet; the run is on none.
    #[error(
        "this validator is set for subnet {netuid} of {network}, and the orchestrator's run is on no chain: leave out --network and --netuid, or point --orchestrator at that subnet's run"
    )]
    RunHasNone {
        /// The validator's network.
        network: String,
        /// The validator's subnet.
        netuid: u16,
    },
    /// Both name a subnet, not the same one.
    #[error(
        "the orchestrator announces subnet {run_netuid} of {run_network}, and this validator is set for subnet {netuid} of {network}: it sets weights only on its own subnet; check --network, --netuid and --orchestrator"
    )]
    Different {
        /// The run's network.
        run_network: String,
        /// The run's subnet.
        run_netuid: u16,
        /// The validator's network.
        network: String,
        /// The validator's subnet.
        netuid: u16,
    },
    /// The validator's node could not say which chain it serves.
    #[error(
        "cannot tell whether {network} is the chain of the orchestrator's run ({run_network}): {error}"
    )]
    Unverified {
        /// The validator's network.
        network: String,
        /// The run's network.
        run_network: String,
        /// Why the genesis hash could not be read.
        error: ChainError,
    },
}

/// Checks the validator's `own` subnet against the run's `announced` one. `own_genesis` reads
/// the genesis hash of the validator's chain; it is called only when the two networks are
/// named differently and the orchestrator announced a genesis hash.
///
/// # Errors
/// [`SubnetMismatch`], one line saying what to change.
pub fn check_announced(
    own: Option<&SubnetChoice>,
    announced: Option<&RunChain>,
    own_genesis: impl FnOnce() -> Result<[u8; 32], ChainError>,
) -> Result<(), SubnetMismatch> {
    let (own, run) = match (own, announced) {
        (None, None) => return Ok(()),
        (None, Some(run)) => {
            return Err(SubnetMismatch::ValidatorHasNone {
                network: run.network.clone(),
                netuid: run.netuid,
            });
        }
        (Some(own), None) => {
            return Err(SubnetMismatch::RunHasNone {
                network: own.network.to_string(),
                netuid: own.netuid,
            });
        }
        (Some(own), Some(run)) => (own, run),
    };
    let different = || SubnetMismatch::Different {
        run_network: run.network.clone(),
        run_netuid: run.netuid,
        network: own.network.to_string(),
        netuid: own.netuid,
    };
    if own.netuid != run.netuid {
        return Err(different());
    }
    let run_network = Network::from_str(&run.network).ok();
    if run_network.as_ref().and_then(endpoint_of) == endpoint_of(&own.network) {
        return Ok(());
    }
    let Some(run_genesis) = run.genesis.as_deref() else {
        return Err(different());
    };
    match own_genesis() {
        Ok(genesis) if hex::encode(genesis) == run_genesis.trim_start_matches("0x") => Ok(()),
        Ok(_) => Err(different()),
        Err(error) => Err(SubnetMismatch::Unverified {
            network: own.network.to_string(),
            run_network: run.network.clone(),
            error,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(network: &str, netuid: u16, genesis: Option<[u8; 32]>) -> RunChain {
        RunChain {
            network: network.into(),
            netuid,
            burn_uid: 0,
            genesis: genesis.map(hex::encode),
        }
    }

    fn own(network: &str, netuid: u16) -> SubnetChoice {
        SubnetChoice {
            network: network.parse().unwrap(),
            netuid,
        }
    }

    fn no_node() -> Result<[u8; 32], ChainError> {
        panic!("the genesis hash is not needed here")
    }

    #[test]
    fn the_same_subnet_passes_and_another_is_refused_in_one_line() {
        assert_eq!(check_announced(None, None, no_node), Ok(()));
        let finney = own("finney", 9);
        assert_eq!(
            check_announced(Some(&finney), Some(&run("finney", 9, None)), no_node),
            Ok(())
        );
        // finney by name and by its public entry point are one network.
        assert_eq!(
            check_announced(
                Some(&own("wss://entrypoint-finney.opentensor.ai:443", 9)),
                Some(&run("finney", 9, None)),
                no_node
            ),
            Ok(())
        );
        let refused = [
            check_announced(Some(&finney), Some(&run("finney", 3, None)), no_node),
            check_announced(Some(&finney), Some(&run("test", 9, None)), no_node),
            check_announced(None, Some(&run("finney", 9, None)), no_node),
            check_announced(Some(&finney), None, no_node),
        ];
        for (result, needle) in refused.into_iter().zip([
            "announces subnet 3 of finney, and this validator is set for subnet 9 of finney",
            "announces subnet 9 of test",
            "pass --network finney --netuid 9",
            "the orchestrator's run is on no chain",
        ]) {
            let line = result.unwrap_err().to_string();
            assert!(line.contains(needle) && !line.contains('\n'), "{line}");
        }
    }

    #[test]
    fn two_nodes_of_one_chain_are_told_apart_by_the_genesis_hash() {
        let mine = own("ws://10.0.0.2:9944", 9);
        let theirs = run("ws://10.0.0.1:9944", 9, Some([7; 32]));
        assert_eq!(
            check_announced(Some(&mine), Some(&theirs), || Ok([7; 32])),
            Ok(())
        );
        assert!(matches!(
            check_announced(Some(&mine), Some(&theirs), || Ok([8; 32])),
            Err(SubnetMismatch::Different { .. })
        ));
        // No genesis announced: the names decide.
        assert!(matches!(
            check_announced(
                Some(&mine),
                Some(&run("ws://10.0.0.1:9944", 9, None)),
                no_node
            ),
            Err(SubnetMismatch::Different { .. })
        ));
        let unreachable = check_announced(Some(&mine), Some(&theirs), || {
            Err(ChainError::Endpoint {
                endpoint: "ws://10.0.0.2:9944".into(),
                reason: "connection refused".into(),
            })
        })
        .unwrap_err()
        .to_string();
        assert!(
            unreachable.contains("cannot reach the subtensor node"),
            "{unreachable}"
        );
    }
}
