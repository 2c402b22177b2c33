//! `iota mine`: serve one section of a run's model for an orchestrator.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use clap::Args;

use crate::miner::{MinerOptions, run_miner};
use crate::model::backend::DeviceKind;
use crate::wallet::WalletDir;

/// Arguments of `iota mine`.
#[derive(Debug, Args)]
pub struct MineArgs {
    /// Wallet name (a directory under the wallets directory).
    #[arg(long)]
    pub wallet: String,
    /// Hotkey name inside the wallet.
    #[arg(long)]
    pub hotkey: String,
    /// Base URL of the orchestrator, e.g. http://127.0.0.1:8700.
    #[arg(long, env = "IOTA_ORCHESTRATOR")]
    pub orchestrator: String,
    /// Wallets directory (default ~/.bittensor/wallets).
    #[arg(long)]
    pub wallets_dir: Option<PathBuf>,
    /// Backend: cpu, cuda, wgpu or flex.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceKind,
    /// Compute threads (size of the rayon pool; default: all cores). Set it when several
    /// miners share one machine.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Forwards in flight to ask for (the orchestrator caps it).
    #[arg(long, default_value_t = 4)]
    pub max_in_flight: usize,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// Sets the size of the global rayon pool (burn's CPU backend computes on it).
///
/// # Errors
/// When the pool was already built.
pub fn set_threads(threads: Option<usize>) -> anyhow::Result<()> {
    if let Some(n) = threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .build_global()
            .context("setting the compute thread pool size")?;
    }
    Ok(())
}

/// Runs a miner until Ctrl-C.
///
/// # Errors
/// A missing hotkey, an unknown backend, an orchestrator that refuses the miner.
pub fn run(args: MineArgs) -> anyhow::Result<()> {
    set_threads(args.threads)?;
    let wallets = match &args.wallets_dir {
        Some(dir) => WalletDir::new(dir),
        None => WalletDir::default_location()?,
    };
    let hotkey = wallets
        .load_hotkey(&args.wallet, &args.hotkey)
        .with_context(|| format!("loading hotkey {}/{}", args.wallet, args.hotkey))?;
    eprintln!(
        "iota mine: hotkey {} -> {}",
        hotkey.address(),
        args.orchestrator
    );
    let report = run_miner(MinerOptions {
        orchestrator: args.orchestrator,
        hotkey,
        device: args.device,
        max_in_flight: args.max_in_flight,
        progress: !args.quiet,
        stop: Arc::new(AtomicBool::new(false)),
    })?;
    eprintln!(
        "iota mine: section {}: {} forwards, {} backwards, {} steps, {} refused, {} released, {} penalties",
        report.section,
        report.forwards,
        report.backwards,
        report.steps,
        report.refused,
        report.released,
        report.penalties
    );
    Ok(())
}
