//! `iota validate`: check miners' work and publish weights for a run.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use super::mine::set_threads;
use crate::model::backend::DeviceKind;
use crate::validator::{ValidatorOptions, run_validator};
use crate::wallet::WalletDir;

/// Arguments of `iota validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Wallet name (a directory under the wallets directory).
    #[arg(long)]
    pub wallet: String,
    /// Hotkey name inside the wallet (the run config must list its address under
    /// `validators`).
    #[arg(long)]
    pub hotkey: String,
    /// Base URL of the orchestrator, e.g. http://127.0.0.1:8700.
    #[arg(long, env = "IOTA_ORCHESTRATOR")]
    pub orchestrator: String,
    /// Wallets directory (default ~/.bittensor/wallets).
    #[arg(long)]
    pub wallets_dir: Option<PathBuf>,
    /// Backend for replays: cpu, cuda, wgpu or flex.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceKind,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Where the validator keeps its window records (one subdirectory per run).
    #[arg(long, default_value = "iota-validator")]
    pub state_dir: PathBuf,
    /// Milliseconds between checks for a finished epoch.
    #[arg(long, default_value_t = 1000)]
    pub poll_ms: u64,
    /// No per-window lines on stderr.
    #[arg(long)]
    pub quiet: bool,
}

/// Runs a validator until Ctrl-C.
///
/// # Errors
/// A missing hotkey, an unknown backend, an orchestrator that refuses the hotkey.
pub fn run(args: ValidateArgs) -> anyhow::Result<()> {
    set_threads(args.threads)?;
    let wallets = match &args.wallets_dir {
        Some(dir) => WalletDir::new(dir),
        None => WalletDir::default_location()?,
    };
    let hotkey = wallets
        .load_hotkey(&args.wallet, &args.hotkey)
        .with_context(|| format!("loading hotkey {}/{}", args.wallet, args.hotkey))?;
    eprintln!(
        "iota validate: hotkey {} -> {}",
        hotkey.address(),
        args.orchestrator
    );
    let report = run_validator(ValidatorOptions {
        orchestrator: args.orchestrator,
        hotkey,
        device: args.device,
        state_dir: args.state_dir,
        poll: Duration::from_millis(args.poll_ms.max(50)),
        progress: !args.quiet,
        stop: Arc::new(AtomicBool::new(false)),
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
