//! Subcommands of the `iota` binary: one file per subcommand, each with its clap `Args`
//! struct and a `run` function. This file holds the top-level [`Cli`] and the dispatch.

use clap::{Parser, Subcommand};

pub mod allocator;
pub mod bench;
pub mod data;
pub mod dotenv;
pub mod eval;
pub mod export;
pub mod generate;
pub mod hint;
pub mod local;
pub mod merge;
pub mod merge_status;
pub mod mine;
pub mod model;
pub mod orchestrate;
pub mod profile;
pub mod register;
pub mod service;
pub mod setup;
pub mod status;
pub mod stop_request;
pub mod subnormals;
pub mod tokenizer;
pub mod train;
pub mod trained;
pub mod validate;
pub mod wallet;

/// Command-line interface of the `iota` binary.
#[derive(Debug, Parser)]
#[command(
    name = "iota",
    version,
    about = "Incentivized Orchestrated Training Architecture: pretrain one LLM across many machines, each holding a section of it"
)]
pub struct Cli {
    /// More log output (repeat for more: -v info, -vv debug). `RUST_LOG` overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Log lines as `pretty` text or `json` objects (one per line, for log collectors).
    #[arg(long, global = true, env = "IOTA_LOG_FORMAT", default_value = "pretty")]
    pub log_format: LogFormat,
    /// Also trust the CA certificates in FILE (PEM) when verifying an HTTPS orchestrator, for a
    /// private run whose operator signs its own certificate. Miners and validators may instead
    /// name it as `ca_file:` in their settings.
    #[arg(long, global = true, env = "IOTA_CA_FILE", value_name = "FILE")]
    pub ca_file: Option<std::path::PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
// Parsed once per process: the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train the whole model in one process (sections chained through the wire codec).
    Train(train::TrainArgs),
    /// Describe model presets: parameters per section, bytes crossing each boundary.
    Model(model::ModelArgs),
    /// Sample text from a trained model, streaming tokens as they are chosen.
    Generate(generate::GenerateArgs),
    /// Held-out loss and perplexity of a trained model (and multiple-choice accuracy).
    Eval(eval::EvalArgs),
    /// Write a trained model as Hugging Face `transformers` loads it (config, safetensors,
    /// tokenizer).
    Export(export::ExportArgs),
    /// Benchmarks that print tables (model, merge, network).
    Bench(bench::BenchArgs),
    /// Merge checkpoints offline with the network's merge operators.
    Merge(merge::MergeArgs),
    /// Run the orchestrator of a training run (HTTP API, state, routing).
    Orchestrate(orchestrate::OrchestrateArgs),
    /// Serve one section of a run's model for an orchestrator (a miner).
    Mine(mine::MineArgs),
    /// Check miners' work (replays, CLASP, copies, merges) and publish weights for a run.
    Validate(validate::ValidateArgs),
    /// A whole network on this machine: an orchestrator and miners as child processes.
    Local(local::LocalArgs),
    /// Data tools: tokenize text shards once into token shards (`prepare`).
    Data(data::DataArgs),
    /// Offline tokenizer tools (train a byte-level BPE).
    Tokenizer(tokenizer::TokenizerArgs),
    /// Hotkeys in the Bittensor wallet layout: new, import, list, show; check a coldkey.
    Wallet(wallet::WalletCmdArgs),
    /// Register a hotkey with an orchestrator (prints the assigned section).
    Register(register::RegisterArgs),
    /// Set this machine up as a miner, validator or orchestrator (asks, or takes flags).
    Setup(setup::SetupArgs),
    /// The state of a run: phase, samples, loss, miners (`--json` for scripts).
    Status(status::StatusArgs),
    /// Keep a miner or orchestrator running with systemd (user unit, restarts on failure).
    Service(service::ServiceArgs),
}

impl Command {
    /// Whether this command sets the allocator up for merges ([`allocator::tune`]): every
    /// command but `orchestrate`, a long-running server whose memory must stay flat. Keeping
    /// up to 1 GiB of freed heap for reuse made its RSS climb over a run: `iota bench
    /// orchestrator --miners 150 --samples 10000 --compute-ms 100` (2026-11-28) measured 47.7
    /// MiB after the first 1,000 samples and 126.5 MiB after 10,000 with it.
    pub fn tunes_allocator(&self) -> bool {
        !matches!(self, Self::Orchestrate(_))
    }
}

/// Runs one parsed command line.
///
/// # Errors
/// Whatever the subcommand reports; `main` prints it on one line and exits non-zero.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    if let Some(path) = &cli.ca_file {
        crate::storage::trust::trust_ca_file(path)?;
    }
    match cli.command {
        Command::Train(args) => train::run(args),
        Command::Model(args) => model::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Eval(args) => eval::run(args),
        Command::Export(args) => export::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Merge(args) => merge::run(args),
        Command::Data(args) => data::run(args),
        Command::Tokenizer(args) => tokenizer::run(args),
        Command::Orchestrate(args) => orchestrate::run(args),
        Command::Mine(args) => mine::run(args),
        Command::Validate(args) => validate::run(args),
        Command::Local(args) => local::run(args),
        Command::Wallet(args) => wallet::run(args),
        Command::Register(args) => register::run(args),
        Command::Setup(args) => setup::run(args),
        Command::Status(args) => status::run(args),
        Command::Service(args) => service::run(args),
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable text.
    #[default]
    Pretty,
    /// One JSON object per line.
    Json,
}

/// Sets up `tracing` logging to stderr in `format`; `RUST_LOG` wins over `-v`.
pub fn init_tracing(verbose: u8, format: LogFormat) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    // The platform verifier logs every refused certificate as an ERROR of its own; iota's
    // error for it already says which server and what to do, in one line.
    let default = format!("{default},rustls_platform_verifier=off");
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_ca_file_flag_goes_after_any_subcommand() {
        let cli = Cli::try_parse_from([
            "iota",
            "status",
            "--orchestrator",
            "https://o.example",
            "--ca-file",
            "ca.pem",
        ])
        .unwrap();
        assert_eq!(cli.ca_file.as_deref(), Some(std::path::Path::new("ca.pem")));
    }
}
