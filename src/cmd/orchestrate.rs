//! `iota orchestrate --config run.yaml`: runs the orchestrator of one training run, over HTTPS
//! when the config names a certificate (`tls:`), else over plain HTTP (loopback, or behind a
//! TLS reverse proxy with `insecure_http: true`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::chain::shared::shared_chain_for;
use crate::mirror;
use crate::orchestrator::state::system_clock;
use crate::orchestrator::subnet::Subnet;
use crate::orchestrator::{
    AppState, BLOCKING_THREADS, RunConfig, ServerTls, TlsListener, serve, shutdown_signal,
};

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
/// A bad config, a certificate or key that does not load, a state directory or storage that
/// cannot be opened, a busy address, a configured chain whose metagraph cannot be read.
pub fn run(args: OrchestrateArgs) -> anyhow::Result<()> {
    let mut config = RunConfig::load(&args.config)?;
    if let Some(listen) = args.listen {
        for scheme in ["http", "https"] {
            if config.public_url == format!("{scheme}://{}", config.listen) {
                config.public_url = format!("{scheme}://{listen}");
            }
        }
        config.listen = listen;
        config.check_transport()?;
    }
    // Before anything is opened: a certificate that does not load is the operator's first
    // error to fix, and nothing has been written yet.
    let tls = match &config.tls {
        Some(files) => Some(ServerTls::load(files)?),
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .max_blocking_threads(BLOCKING_THREADS)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let listen = config.listen;
        let run = config.run.clone();
        let data_dir = config.data_dir.clone();
        let public_url = config.public_url.clone();
        let mut config = config;
        // First of all: a run on a chain that cannot be read admits nobody, so it stops here,
        // before anything is copied, opened or served.
        let subnet = match config.chain.clone() {
            Some(chain) => {
                let network = chain.network.clone();
                let now = system_clock()();
                let subnet = tokio::task::spawn_blocking(move || {
                    Subnet::connect(shared_chain_for(network), chain, now)
                })
                .await
                .context("reading the subnet's metagraph")??;
                eprintln!(
                    "iota orchestrator: subnet {} on {} at block {}: {} neurons, {} validator permits",
                    subnet.config().netuid,
                    subnet.config().network,
                    subnet.metagraph().block,
                    subnet.metagraph().neurons.len(),
                    subnet.validators().len()
                );
                Some(subnet)
            }
            None => None,
        };
        // Shards in a bucket or at a URL are copied under the run's folder first; the bucket's
        // endpoint and keys are the run's own storage settings where those are S3.
        config.data.source = mirror::fetch(
            &config.data.source,
            &data_dir.join("shards"),
            Some(&config.storage),
        )
        .await
        .context("copying the run's data")?;
        let state = AppState::open(config).context("opening the run")?;
        if let Some(subnet) = subnet {
            state.attach_subnet(std::sync::Arc::new(subnet));
        }
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        let local = listener.local_addr().context("reading the bound address")?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        eprintln!(
            "iota orchestrator: run {run:?} on {scheme}://{local}, public URL {public_url} (state in {})",
            data_dir.display()
        );
        match tls {
            Some(tls) => {
                let listener = TlsListener::new(listener, tls).context("starting TLS")?;
                serve(state, listener, shutdown_signal()).await
            }
            None => serve(state, listener, shutdown_signal()).await,
        }
        .context("serving")?;
        eprintln!("iota orchestrator: stopped");
        Ok(())
    })
}
