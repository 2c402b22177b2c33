//! `iota mine`: serve one section of a run's model for an orchestrator.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use clap::Args;

use super::profile::{NodeArgs, Role};
#[cfg(feature = "adversary")]
use crate::miner::adversary::Adversary;
use crate::miner::{MinerOptions, run_miner};

/// Arguments of `iota mine`. Unset flags come from `IOTA_*` variables, then the settings
/// file of `iota setup`, then a reference-format `.env` (see [`super::profile`]).
#[derive(Debug, Args)]
pub struct MineArgs {
    /// Wallet, orchestrator, device and settings sources.
    #[command(flatten)]
    pub node: NodeArgs,
    /// Compute threads (size of the rayon pool; default: all cores). Set it when several
    /// miners share one machine.
    #[arg(long, env = "IOTA_THREADS")]
    pub threads: Option<usize>,
    /// Forwards in flight to ask for (the orchestrator caps it; default 4).
    #[arg(long, env = "IOTA_MAX_IN_FLIGHT")]
    pub max_in_flight: Option<usize>,
    /// Recompute each forward in its backward instead of keeping its activations until then
    /// (about a sixth more compute per sample, the activations of one micro-batch held
    /// instead of one per forward in flight). For a GPU whose memory is the limit.
    #[arg(long, env = "IOTA_RECOMPUTE_BACKWARD")]
    pub recompute_backward: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Test harness only: behave as this kind of hostile miner (see `miner::adversary`; only
    /// with the `adversary` feature, which the release build leaves out).
    #[cfg(feature = "adversary")]
    #[arg(long, hide = true)]
    pub adversary: Option<Adversary>,
    /// Test harness only: the object store directory a `copier` reads other uploads from.
    #[cfg(feature = "adversary")]
    #[arg(long, hide = true)]
    pub copy_from: Option<String>,
    /// Write where the miner's time goes (compute, download, upload, orchestrator, idle,
    /// merge) and the bytes it moved, as JSON, to FILE (rewritten about once a second).
    #[arg(long, value_name = "FILE")]
    pub stats_out: Option<PathBuf>,
}

/// Sets the number of compute threads: the global rayon pool (burn's CPU backend runs its
/// element-wise ops on it) and the matrix-multiply kernel's own pool (`matrixmultiply` reads
/// `MATMUL_NUM_THREADS` once, at its first product; OpenBLAS is resized through its C API,
/// since it reads `OPENBLAS_NUM_THREADS` only at load time), so that several miners sharing a
/// machine each stay within their share of the cores. A value already in the environment is
/// left as it is.
///
/// Call it at start-up, before any other thread exists.
///
/// # Errors
/// When the pool was already built.
pub fn set_threads(threads: Option<usize>) -> anyhow::Result<()> {
    if let Some(n) = threads {
        // OpenBLAS already read a value the user set (at load time); only ours is applied.
        if std::env::var_os("OPENBLAS_NUM_THREADS").is_none() {
            crate::model::backend::limit_matmul_threads(n);
        }
        for var in ["MATMUL_NUM_THREADS", "OPENBLAS_NUM_THREADS"] {
            if std::env::var_os(var).is_none() {
                // SAFETY: called at start-up from the main thread before any other thread is
                // spawned (no runtime, no pool yet), so nothing reads the environment
                // concurrently.
                unsafe { std::env::set_var(var, n.max(1).to_string()) };
            }
        }
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
    let layered = args.node.layered(Role::Miner)?;
    for source in &layered.sources {
        eprintln!("iota mine: {source}");
    }
    set_threads(args.threads.or(layered.profile.threads))?;
    layered.trust_ca_file()?;
    let wallet = layered.wallet()?;
    let hotkey = wallet.load()?;
    let orchestrator = layered.orchestrator()?;
    let device = layered.profile.device.unwrap_or_default();
    eprintln!(
        "iota mine: hotkey {} ({}/{}) on {device} -> {orchestrator}",
        hotkey.address(),
        wallet.wallet,
        wallet.hotkey
    );
    #[cfg(feature = "adversary")]
    let (adversary, copy_from) = (args.adversary, args.copy_from);
    #[cfg(not(feature = "adversary"))]
    let (adversary, copy_from) = (None, None);
    let report = run_miner(MinerOptions {
        orchestrator,
        hotkey,
        device,
        max_in_flight: args
            .max_in_flight
            .or(layered.profile.max_in_flight)
            .unwrap_or(4),
        retain_graphs: !args.recompute_backward,
        progress: !args.quiet,
        stop: Arc::new(AtomicBool::new(false)),
        adversary,
        copy_from,
        stats_out: args.stats_out,
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
