//! `iota status`: the state of a run, for people (a table) and scripts (`--json`).

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde_json::json;

use super::profile::{NodeArgs, Role};
use super::register::cli_policy;
use crate::api::client::{ApiClient, now_ms};
use crate::api::{ChainStatus, MergeStatus, StatusResponse};
use crate::miner::status_line::{RunView, render};

/// Arguments of `iota status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Base URL of the orchestrator (default: the one in the `iota setup` settings).
    #[arg(long, env = "IOTA_ORCHESTRATOR", value_name = "URL")]
    pub orchestrator: Option<String>,
    /// Settings file to take the orchestrator from (default ~/.config/iota/miner.yaml).
    #[arg(long, env = "IOTA_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print `{"orchestrator", "status", "merge"}` as JSON (the documents of `/api/status`
    /// and `/api/merge/status`).
    #[arg(long)]
    pub json: bool,
}

/// Prints the run's state.
///
/// # Errors
/// No orchestrator given, or it does not answer.
pub fn run(args: StatusArgs) -> anyhow::Result<()> {
    let node = NodeArgs {
        orchestrator: args.orchestrator,
        config: args.config,
        ..NodeArgs::default()
    };
    let url = node.layered(Role::Miner)?.orchestrator()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let (status, merge) = runtime.block_on(async {
        let client = ApiClient::connect(&url, None, cli_policy())
            .await
            .with_context(|| format!("reaching the orchestrator at {url}"))?;
        let status = client.status().await.context("asking for the status")?;
        let merge = client
            .merge_status()
            .await
            .context("asking for the merge status")?;
        anyhow::Ok((status, merge))
    })?;
    if args.json {
        let doc = json!({ "orchestrator": url, "status": status, "merge": merge });
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).context("encoding the status")?
        );
    } else {
        print!("{}", table(&url, &status, &merge, now_ms()));
    }
    Ok(())
}

/// The status as text: a header, the counters, one line per miner.
pub fn table(url: &str, status: &StatusResponse, merge: &MergeStatus, now_ms: u64) -> String {
    // The rate is not shown here: the table prints the network's tokens/s itself.
    let view = RunView {
        samples_per_s: 0.0,
        ..RunView::from_documents(status, merge, 1.0)
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "run {:?} at {url}: epoch {}{}",
        status.run,
        status.epoch,
        render(&view, now_ms)
    );
    let loss = status
        .recent_loss
        .map_or_else(|| "-".into(), |l| format!("{l:.4}"));
    let _ = writeln!(
        out,
        "samples: {} completed, {} dropped, {} in flight | recent loss {loss} | {:.0} tokens/s",
        status.samples.completed,
        status.samples.dropped,
        status.samples.in_flight,
        status.tokens_per_s
    );
    let _ = writeln!(
        out,
        "section  blocks  miner                                             fwd    bwd  penalties  seen   weights (reported)"
    );
    for section in &status.sections {
        if section.miners.is_empty() {
            let _ = writeln!(
                out,
                "{:>7}  {:>2}..{:<2}  (no miner)",
                section.index, section.blocks[0], section.blocks[1]
            );
        }
        for m in &section.miners {
            let weights = match &m.weights_hash {
                Some(h) => format!("epoch {} {}", m.weights_epoch, h.get(..12).unwrap_or(h)),
                None => "seed".into(),
            };
            let _ = writeln!(
                out,
                "{:>7}  {:>2}..{:<2}  {:<48} {:>6} {:>6} {:>10} {:>4.0}s   {weights}",
                section.index,
                section.blocks[0],
                section.blocks[1],
                m.hotkey,
                m.forwards,
                m.backwards,
                m.penalties,
                m.last_seen_s
            );
        }
    }
    if let Some(chain) = &status.chain {
        chain_table(&mut out, chain, now_ms);
    }
    out
}

/// A validator's largest weights on chain, `uid: share` (and how many more), for a cell.
fn weights_cell(n: &crate::api::ChainNeuron) -> String {
    if n.weights.is_empty() {
        return if n.validator_permit {
            "none".into()
        } else {
            String::new()
        };
    }
    let mut cell = n
        .weights
        .iter()
        .map(|(uid, share)| format!("{uid}: {share:.3}"))
        .collect::<Vec<_>>()
        .join(", ");
    if n.weights_count > n.weights.len() {
        cell.push_str(&format!(" (+{} more)", n.weights_count - n.weights.len()));
    }
    cell
}

/// The subnet's part of the status: each miner's uid and incentive, each validator's stake,
/// the block of its last weights on chain and the largest of those weights.
fn chain_table(out: &mut String, chain: &ChainStatus, now_ms: u64) {
    let age_s = now_ms.saturating_sub(chain.refreshed_unix_ms) / 1000;
    let _ = writeln!(
        out,
        "chain: subnet {} on {}, metagraph of block {} (read {age_s}s ago){}",
        chain.netuid,
        chain.network,
        chain.block,
        chain
            .error
            .as_ref()
            .map_or_else(String::new, |e| format!("; the last refresh failed: {e}"))
    );
    let _ = writeln!(
        out,
        "  uid  role       hotkey                                            stake (TAO)  incentive  last weights (block)  weights on chain (uid: share)"
    );
    for n in chain
        .neurons
        .iter()
        .filter(|n| n.miner || n.validator_permit)
    {
        let role = match (n.miner, n.validator_permit) {
            (true, true) => "miner+val",
            (true, false) => "miner",
            _ => "validator",
        };
        let last = if n.last_update == 0 {
            "never".to_string()
        } else {
            n.last_update.to_string()
        };
        let _ = writeln!(
            out,
            "{:>5}  {role:<9}  {:<48}  {:>11.3}  {:>9.4}  {last:<20}  {}",
            n.uid,
            n.hotkey,
            n.stake_tao,
            n.incentive,
            weights_cell(n)
        );
    }
}
