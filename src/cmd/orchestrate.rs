//! `iota orchestrate --config run.yaml`: runs the orchestrator of one training run.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::orchestrator::{AppState, BLOCKING_THREADS, RunConfig, serve, shutdown_signal};

/// Arguments of `iota orchestrate`.
#[derive(Debug, Args)]
pub struct OrchestrateArgs {
    /// The run config (YAML; see examples/local.yaml).
    #[arg(long)]
    pub config: PathBuf,
    /// Override the config's listen address.
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
}

/// Runs the orchestrator until Ctrl-C or SIGTERM.
///
/// # Errors
/// A bad config, a state directory or storage that cannot be opened, a busy address.
pub fn run(args: OrchestrateArgs) -> anyhow::Result<()> {
    let mut config = RunConfig::load(&args.config)?;
    if let Some(listen) = args.listen {
        if config.public_url == format!("http://{}", config.listen) {
            config.public_url = format!("http://{listen}");
        }
        config.listen = listen;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .max_blocking_threads(BLOCKING_THREADS)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let listen = config.listen;
        let run = config.run.clone();
        let data_dir = config.data_dir.clone();
        let state = AppState::open(config).context("opening the run")?;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        let local = listener.local_addr().context("reading the bound address")?;
        eprintln!(
            "iota orchestrator: run {run:?} on http://{local} (state in {})",
            data_dir.display()
        );
        serve(state, listener, shutdown_signal())
            .await
            .context("serving")?;
        eprintln!("iota orchestrator: stopped");
        Ok(())
    })
}
