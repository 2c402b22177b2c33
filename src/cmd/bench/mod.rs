//! `iota bench`: benchmarks that print tables of ratios measured in one run.

use clap::{Args, Subcommand};

pub mod cpu;
pub mod data;
pub mod latency;
pub mod learning;
pub mod merge;
pub mod model;
pub mod network;
pub mod orchestrator;
pub mod sim_miner;
pub mod step;
pub mod validate;

/// Arguments of `iota bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Which benchmark.
    #[command(subcommand)]
    pub command: BenchCommand,
}

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Whole-graph model against the section chain: throughput, wire bytes, memory.
    Model(model::BenchModelArgs),
    /// One real merge of N miners (a local network, one section) in each merge format:
    /// bytes per miner counted as they moved, wall time, verification.
    Merge(merge::BenchMergeArgs),
    /// Single-process chain against a local network: tokens/s, wire bytes, request latency.
    Network(network::BenchNetworkArgs),
    /// One training step of a preset: whole graph vs section chain, per-op times, and an
    /// optional PyTorch twin run interleaved.
    Step(step::BenchStepArgs),
    /// `iota train` against a local network at equal tokens: eval loss at every merge, the
    /// final gap, throughput.
    Learning(Box<learning::BenchLearningArgs>),
    /// One orchestrator under N simulated miners (signed HTTP, no compute): requests/s,
    /// p50/p99 latency per endpoint, RSS and CPU, latency against rows in the database.
    Orchestrator(orchestrator::BenchOrchestratorArgs),
    /// Tokens/s of the data path on real text (raw text to tokens with the byte and a large
    /// vocabulary, prepared shards to windows), against a 50-miner `1b` network's demand.
    Data(data::BenchDataArgs),
    /// A validator's cost to replay a fraction of one miner's epoch against the miner's cost
    /// of doing it, per section.
    Validate(validate::BenchValidateArgs),
}

/// Runs `iota bench`.
///
/// # Errors
/// Whatever the benchmark reports.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.command {
        BenchCommand::Model(a) => model::run(a),
        BenchCommand::Merge(a) => merge::run(a),
        BenchCommand::Network(a) => network::run(a),
        BenchCommand::Step(a) => step::run(a),
        BenchCommand::Learning(a) => learning::run(*a),
        BenchCommand::Orchestrator(a) => orchestrator::run(a),
        BenchCommand::Validate(a) => validate::run(a),
        BenchCommand::Data(a) => data::run(a),
    }
}

/// Peak resident memory of this process so far (Linux `VmHWM`), in bytes.
pub fn peak_rss_bytes() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
