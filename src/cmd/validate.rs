//! `iota validate`: check miners' work and publish weights for a run.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use clap::Args;

use super::mine::set_threads;
use super::profile::{NodeArgs, Role};
use crate::chain::{DEFAULT_NETUID, Network};
use crate::validator::subnet_choice::SubnetChoice;
use crate::validator::{ValidatorOptions, run_validator};

/// Arguments of `iota validate`. Unset flags come from `IOTA_*` variables, then the settings
/// file of `iota setup --role validator`, then a reference-format `.env` (see
/// [`super::profile`]).
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Wallet (the run config must list the hotkey's address under `validators`),
    /// orchestrator, device for replays, and settings sources.
    #[command(flatten)]
    pub node: NodeArgs,
    /// Compute threads (default: all cores).
    #[arg(long, env = "IOTA_THREADS")]
    pub threads: Option<usize>,
    /// Where the validator keeps its window records (one subdirectory per run).
    #[arg(long, default_value = "iota-validator")]
    pub state_dir: PathBuf,
    /// Milliseconds between checks for a finished epoch.
    #[arg(long, default_value_t = 1000)]
    pub poll_ms: u64,
    /// Recompute each replayed forward in its backward instead of keeping its activations
    /// until then (the same replay; less memory, about a sixth more compute).
    #[arg(long, env = "IOTA_RECOMPUTE_BACKWARD")]
    pub recompute_backward: bool,
    /// No per-window lines on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// The chain this validator sets weights on: `local` (none: weights go to the
    /// orchestrator only), `finney`, `test` or a subtensor node's URL. It must be the chain of
    /// the orchestrator's run, which is never taken from the orchestrator: a run on another
    /// chain or subnet is refused.
    #[arg(long, env = "IOTA_NETWORK", default_value = "local")]
    pub network: Network,
    /// The subnet this validator sets weights on, with --network.
    #[arg(long, env = "IOTA_NETUID", default_value_t = DEFAULT_NETUID)]
    pub netuid: u16,
}

/// Runs a validator until Ctrl-C.
///
/// # Errors
/// A missing hotkey, an unknown backend, an orchestrator that refuses the hotkey.
pub fn run(args: ValidateArgs) -> anyhow::Result<()> {
    let layered = args.node.layered(Role::Validator)?;
    for source in &layered.sources {
        eprintln!("iota validate: {source}");
    }
    set_threads(args.threads.or(layered.profile.threads))?;
    layered.trust_ca_file()?;
    let wallet = layered.wallet()?;
    let hotkey = wallet.load()?;
    let orchestrator = layered.orchestrator()?;
    let device = layered.profile.device.unwrap_or_default();
    eprintln!(
        "iota validate: hotkey {} ({}/{}) on {device} -> {orchestrator}",
        hotkey.address(),
        wallet.wallet,
        wallet.hotkey
    );
    let report = run_validator(ValidatorOptions {
        orchestrator,
        hotkey,
        device,
        state_dir: args.state_dir,
        poll: Duration::from_millis(args.poll_ms.max(50)),
        retain_graphs: !args.recompute_backward,
        progress: !args.quiet,
        stop: Arc::new(AtomicBool::new(false)),
        subnet: SubnetChoice::from_flags(args.network, args.netuid),
        chain: None,
    })?;
    eprintln!(
        "iota validate: {} windows, {} vectors published, {} refused, last epoch {}",
        report.windows,
        report.published,
        report.refused,
        report
            .last_epoch
            .map_or_else(|| "-".to_string(), |e| e.to_string())
    );
    Ok(())
}
