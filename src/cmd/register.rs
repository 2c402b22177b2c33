//! `iota register`: registers a hotkey with an orchestrator (and, for Bittensor networks,
//! says what to run on-chain instead: see [`crate::chain`]).

use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;

use super::profile::{NodeArgs, Role};
use crate::api::client::{ApiClient, ClientError};
use crate::api::{RegisterRequest, ValidatorRegisterRequest};
use crate::chain::{ChainRegistration, DEFAULT_NETUID, Network, Registrant, chain_for};
use crate::storage::RetryPolicy;

/// Arguments of `iota register`.
#[derive(Debug, Args)]
pub struct RegisterArgs {
    /// Wallet, orchestrator, device and settings sources.
    #[command(flatten)]
    pub node: NodeArgs,
    /// Register as a miner or a validator.
    #[arg(long, value_enum, default_value = "miner")]
    pub role: Role,
    /// Chain: `local` (no chain: the orchestrator's registry decides), `finney` or `test`
    /// (Bittensor; not reachable from iota, which says what to run instead).
    #[arg(long, env = "IOTA_NETWORK", default_value = "local")]
    pub network: Network,
    /// Subnet id on a Bittensor network.
    #[arg(long, default_value_t = DEFAULT_NETUID)]
    pub netuid: u16,
}

/// A CLI call fails fast: a few attempts over about two seconds.
pub fn cli_policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 3,
        initial_backoff: Duration::from_millis(300),
        max_backoff: Duration::from_secs(1),
    }
}

/// Registers and prints the assigned section, or the reason for the refusal.
///
/// # Errors
/// A missing hotkey, a Bittensor network, an unreachable orchestrator, a refusal.
pub fn run(args: RegisterArgs) -> anyhow::Result<()> {
    if args.role == Role::Orchestrator {
        bail!(
            "--role orchestrator: an orchestrator does not register; start it with `iota orchestrate --config FILE`"
        );
    }
    let layered = args.node.layered(args.role)?;
    for source in &layered.sources {
        eprintln!("iota register: {source}");
    }
    let wallet = layered.wallet()?;
    let hotkey = wallet.load()?;
    let who = Registrant {
        wallet: wallet.wallet.clone(),
        hotkey: wallet.hotkey.clone(),
        address: hotkey.address().clone(),
    };
    match chain_for(args.network).register(&who, args.netuid)? {
        ChainRegistration::NotRequired => {}
    }
    let url = layered.orchestrator()?;
    let device = layered.profile.device.unwrap_or_default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let client = runtime
        .block_on(ApiClient::connect(&url, Some(hotkey.clone()), cli_policy()))
        .with_context(|| format!("reaching the orchestrator at {url}"))?;
    let refused = |e: ClientError| {
        let what = if matches!(e, ClientError::Api { .. }) {
            format!(
                "the orchestrator at {url} refused to register {}",
                who.address
            )
        } else {
            format!("registering {} at {url}", who.address)
        };
        anyhow::Error::new(e).context(what)
    };
    if args.role == Role::Validator {
        let reg = runtime
            .block_on(client.register_validator(&ValidatorRegisterRequest {
                device: device.to_string(),
            }))
            .map_err(refused)?;
        println!(
            "registered validator {} ({}/{}) with run {:?} at {url}: stake {}, epoch {}, phase {:?}",
            reg.hotkey, wallet.wallet, wallet.hotkey, reg.run, reg.stake, reg.epoch, reg.phase
        );
        return Ok(());
    }
    let reg = runtime
        .block_on(client.register(&RegisterRequest {
            device: device.to_string(),
            max_in_flight: layered.profile.max_in_flight.unwrap_or(4),
        }))
        .map_err(refused)?;
    let blocks = reg
        .model
        .sections
        .get(reg.section)
        .map(|b| format!(" (blocks {}..{})", b[0], b[1]))
        .unwrap_or_default();
    println!(
        "registered {} ({}/{}) with run {:?} at {url}: section {}{blocks} of {}, epoch {}",
        reg.hotkey,
        wallet.wallet,
        wallet.hotkey,
        reg.run,
        reg.section,
        reg.model.sections.len(),
        reg.epoch
    );
    println!(
        "start mining with: iota mine --wallet {} --hotkey {}{} --orchestrator {url}",
        wallet.wallet,
        wallet.hotkey,
        wallet.dir_flag()
    );
    Ok(())
}
