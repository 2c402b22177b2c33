//! `iota register`: registers a hotkey on a Bittensor subnet (`--network finney|test|URL`:
//! `burned_register`, paid by the wallet's coldkey after a confirmation) and with an
//! orchestrator (`--orchestrator`, or always on the local network). See [`crate::chain`].

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;

use super::profile::{NodeArgs, Role};
use super::wallet::{WalletRef, coldkey_address, open_coldkey};
use crate::api::client::{ApiClient, ClientError};
use crate::api::{RegisterRequest, ValidatorRegisterRequest};
use crate::chain::{ChainError, ChainRegistration, DEFAULT_NETUID, Network, Registrant, chain_for};
use crate::storage::RetryPolicy;
use crate::wallet::Hotkey;

/// Arguments of `iota register`.
#[derive(Debug, Args)]
pub struct RegisterArgs {
    /// Wallet, orchestrator, device and settings sources.
    #[command(flatten)]
    pub node: NodeArgs,
    /// Register as a miner or a validator.
    #[arg(long, value_enum, default_value = "miner")]
    pub role: Role,
    /// Chain: `local` (no chain: the orchestrator's registry decides), `finney`, `test` or a
    /// subtensor node's URL (`ws://`, `wss://`, `http://`, `https://`): the hotkey is
    /// registered on the subnet by burning TAO from the wallet's coldkey.
    #[arg(long, env = "IOTA_NETWORK", default_value = "local")]
    pub network: Network,
    /// Subnet id on a Bittensor network.
    #[arg(long, default_value_t = DEFAULT_NETUID)]
    pub netuid: u16,
    /// Pay the burn without asking (for scripts); without it a terminal is needed to confirm.
    #[arg(long)]
    pub yes: bool,
    /// Read the coldkey's password from the environment variable of this name (the name, not
    /// the password); else a hidden prompt on a terminal.
    #[arg(long, value_name = "VAR")]
    pub password_env: Option<String>,
}

/// A CLI call fails fast: a few attempts over about two seconds.
pub fn cli_policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 3,
        initial_backoff: Duration::from_millis(300),
        max_backoff: Duration::from_secs(1),
    }
}

/// Registers on the subnet (a Bittensor network) and with the orchestrator (always on the
/// local network; on a Bittensor network when one is given), and prints the uid and the
/// assigned section, or the reason for the refusal.
///
/// # Errors
/// A missing hotkey or coldkey, an unreachable node or orchestrator, too little balance, a
/// changed runtime, a refusal.
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
    if args.network == Network::Local {
        match chain_for(Network::Local).register(&who, args.netuid)? {
            ChainRegistration::NotRequired => {}
        }
    } else {
        register_on_chain(&args, &wallet, &hotkey, &who)?;
        if layered.profile.orchestrator.is_none() {
            return Ok(());
        }
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

/// `rao` as TAO (1 TAO = 10^9 rao), without trailing zeros.
fn tao(rao: u64) -> String {
    let fraction = format!("{:09}", rao % 1_000_000_000);
    let fraction = fraction.trim_end_matches('0');
    if fraction.is_empty() {
        format!("{} TAO", rao / 1_000_000_000)
    } else {
        format!("{}.{fraction} TAO", rao / 1_000_000_000)
    }
}

/// Registers the hotkey on `args.netuid` by burning TAO: shows the burn and the coldkey's
/// balance, asks (unless `--yes`), decrypts the coldkey, submits `burned_register` and waits
/// for its block. Nothing is written locally.
fn register_on_chain(
    args: &RegisterArgs,
    wallet: &WalletRef,
    hotkey: &Hotkey,
    who: &Registrant,
) -> anyhow::Result<()> {
    let network = &args.network;
    let netuid = args.netuid;
    let chain = chain_for(network.clone());
    let burn = chain.burn_cost(netuid)?;
    let payer = coldkey_address(wallet)?;
    match chain.register(who, netuid) {
        Ok(ChainRegistration::NotRequired) => {
            let uid = chain
                .metagraph(netuid)
                .ok()
                .and_then(|m| m.neuron(&hotkey.public_key()).map(|n| n.uid));
            println!(
                "hotkey {} is already registered on subnet {netuid} ({network}){}: nothing burned",
                who.address,
                uid.map(|u| format!(" as uid {u}")).unwrap_or_default()
            );
            return Ok(());
        }
        Err(ChainError::NotRegistered { .. }) => {}
        Err(other) => return Err(other.into()),
    }
    let balance = chain.free_balance(&payer)?;
    println!(
        "subnet {netuid} on {network}: registering hotkey {} burns {} ({burn} rao); coldkey {payer} ({}) holds {} ({balance} rao)",
        who.address,
        tao(burn),
        wallet.wallet,
        tao(balance)
    );
    if balance < burn {
        return Err(ChainError::InsufficientBalance {
            coldkey: payer.to_string(),
            balance_rao: balance,
            needed_rao: burn,
        }
        .into());
    }
    confirm(args, burn)?;
    let coldkey = open_coldkey(wallet, args.password_env.as_deref())?;
    let registered = chain.burned_register_in_block(&coldkey, &who.address, netuid)?;
    match registered.block {
        Some(block) => println!(
            "registered hotkey {} on subnet {netuid} ({network}): uid {} in block {block}, burned {}",
            who.address,
            registered.uid,
            tao(registered.burned_rao)
        ),
        None => println!(
            "hotkey {} is already registered on subnet {netuid} ({network}) as uid {}: nothing burned",
            who.address, registered.uid
        ),
    }
    Ok(())
}

/// `--yes`, or a yes on a terminal.
fn confirm(args: &RegisterArgs, burn: u64) -> anyhow::Result<()> {
    if args.yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        bail!(
            "registering burns {} and needs a confirmation: run on a terminal, or pass --yes",
            tao(burn)
        );
    }
    let go = dialoguer::Confirm::new()
        .with_prompt(format!(
            "Burn {} to register on subnet {} ({})?",
            tao(burn),
            args.netuid,
            args.network
        ))
        .default(false)
        .interact()
        .context("reading the confirmation")?;
    if !go {
        bail!("not registered: the burn was declined");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::tao;

    #[test]
    fn rao_reads_as_tao() {
        assert_eq!(tao(0), "0 TAO");
        assert_eq!(tao(1_000_000_000), "1 TAO");
        assert_eq!(tao(1_500_000_000), "1.5 TAO");
        assert_eq!(tao(1), "0.000000001 TAO");
    }
}
