//! `iota merge --status --orchestrator URL`: the progress of a network's current merge.

use std::fmt::Write as _;

use anyhow::Context;

use crate::api::MergeStatus;
use crate::api::client::{ApiClient, now_ms};
use crate::storage::RetryPolicy;

/// Fetches `/api/merge/status` from `url` and prints it (as a table, or raw JSON).
///
/// # Errors
/// The orchestrator is unreachable or answers with an error.
pub fn run(url: &str, json: bool) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let status = runtime.block_on(async {
        let client = ApiClient::connect(url, None, RetryPolicy::default())
            .await
            .with_context(|| format!("reaching the orchestrator at {url}"))?;
        client
            .merge_status()
            .await
            .context("asking for the merge status")
    })?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&status).context("encoding the status")?
        );
    } else {
        print!("{}", render(&status, now_ms()));
    }
    Ok(())
}

fn short(hash: &str) -> &str {
    &hash[..hash.len().min(12)]
}

/// The status as a human-readable table (`now_ms` for the time left in the phase).
pub fn render(status: &MergeStatus, now_ms: u64) -> String {
    let mut out = String::new();
    let deadline = match status.phase_deadline_unix_ms {
        Some(d) if d >= now_ms => format!(", {:.0} s left", (d - now_ms) as f64 / 1000.0),
        Some(d) => format!(", {:.0} s past the deadline", (now_ms - d) as f64 / 1000.0),
        None => String::new(),
    };
    let _ = writeln!(
        out,
        "epoch {} | phase {:?}{deadline} | op {} | merge every {} samples",
        status.epoch, status.phase, status.op, status.batches_before_merging
    );
    let _ = writeln!(
        out,
        "section  uploads  partitions  with results  results  finalized  recomputed  fallbacks  checkpoint"
    );
    for s in &status.sections {
        let checkpoint = match (&s.checkpoint_epoch, &s.checkpoint_hash) {
            (Some(e), Some(h)) => format!("epoch {e} {}", short(h)),
            _ => "-".into(),
        };
        let _ = writeln!(
            out,
            "{:>7}  {:>7}  {:>10}  {:>12}  {:>7}  {:>9}  {:>10}  {:>9}  {checkpoint}",
            s.section,
            s.uploads,
            s.partitions,
            s.partitions_with_results,
            s.results,
            if s.finalized { "yes" } else { "no" },
            s.recomputed,
            s.fallbacks,
        );
    }
    let flagged: Vec<_> = status
        .sections
        .iter()
        .flat_map(|s| s.flagged.iter().map(move |f| (s.section, f)))
        .collect();
    if flagged.is_empty() {
        let _ = writeln!(out, "flagged mergers: none");
    } else {
        let _ = writeln!(out, "flagged mergers:");
        for (section, f) in flagged {
            let _ = writeln!(
                out,
                "  section {section} partition {}: {} ({})",
                f.partition,
                short(&f.hotkey),
                f.reason
            );
        }
    }
    if !status.epochs.is_empty() {
        let fmt = |l: Option<f32>| l.map_or_else(|| "-".into(), |l| format!("{l:.4}"));
        let _ = writeln!(
            out,
            "epoch  samples  mean loss  first quarter  last quarter  eval (start)"
        );
        for e in &status.epochs {
            let _ = writeln!(
                out,
                "{:>5}  {:>7}  {:>9}  {:>13}  {:>12}  {:>12}",
                e.epoch,
                e.completed,
                fmt(e.mean_loss),
                fmt(e.first_loss),
                fmt(e.last_loss),
                fmt(e.eval_loss)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EpochSummary, FlaggedMerger, Phase, SectionMergeStatus};
    use crate::merge::MergeOp;

    #[test]
    fn renders_sections_flags_and_epochs() {
        let status = MergeStatus {
            phase: Phase::Merging,
            epoch: 2,
            phase_deadline_unix_ms: Some(10_000),
            op: MergeOp::Mean,
            batches_before_merging: 50,
            sections: vec![SectionMergeStatus {
                section: 0,
                uploads: 3,
                partitions: 3,
                partitions_with_results: 2,
                results: 4,
                finalized: false,
                recomputed: 1,
                fallbacks: 0,
                flagged: vec![FlaggedMerger {
                    hotkey: "5FHneW46xGXgs5mUiveU4sbTyGBzmstUspZC92UhjJM694ty".into(),
                    partition: 1,
                    reason: "disagreed".into(),
                }],
                checkpoint_hash: Some("abcdef0123456789".into()),
                checkpoint_epoch: Some(2),
            }],
            epochs: vec![EpochSummary {
                epoch: 0,
                completed: 50,
                mean_loss: Some(4.5),
                first_loss: Some(5.0),
                last_loss: Some(4.0),
                eval_loss: Some(4.25),
            }],
        };
        let text = render(&status, 4_000);
        assert!(
            text.starts_with("epoch 2 | phase Merging, 6 s left | op mean"),
            "{text}"
        );
        assert!(text.contains("      0        3           3             2        4         no           1          0  epoch 2 abcdef012345"), "{text}");
        assert!(
            text.contains("section 0 partition 1: 5FHneW46xGXg (disagreed)"),
            "{text}"
        );
        assert!(
            text.contains("    0       50     4.5000         5.0000        4.0000        4.2500"),
            "{text}"
        );
        assert!(render(&status, 12_000).contains("2 s past the deadline"));
    }
}
