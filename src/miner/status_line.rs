//! The run's side of the miner's live status line: phase, its deadline, and how far the next
//! merge is (samples left in the epoch, and the time that takes at the network's recent rate),
//! polled from the orchestrator's public `/api/status` and `/api/merge/status`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::api::client::{ApiClient, now_ms};
use crate::api::{MergeStatus, Phase, StatusResponse};

/// What the miner last learned about the run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunView {
    /// Current phase.
    pub phase: Phase,
    /// When the phase ends, if it has a deadline.
    pub deadline_ms: Option<u64>,
    /// Samples still to complete before the miners merge (training only).
    pub samples_to_merge: Option<u64>,
    /// Samples the whole network completes per second, recently.
    pub samples_per_s: f64,
}

impl RunView {
    /// The view from the two status documents; `tokens_per_sample` converts the network's
    /// tokens/s into samples/s.
    pub fn from_documents(
        status: &StatusResponse,
        merge: &MergeStatus,
        tokens_per_sample: f64,
    ) -> RunView {
        let done = merge
            .epochs
            .iter()
            .find(|e| e.epoch == status.epoch)
            .map_or(0, |e| e.completed);
        RunView {
            phase: status.phase,
            deadline_ms: status.phase_deadline_unix_ms,
            samples_to_merge: (status.phase == Phase::Training)
                .then(|| merge.batches_before_merging.saturating_sub(done)),
            samples_per_s: status.tokens_per_s / tokens_per_sample.max(1.0),
        }
    }
}

/// The view shared between the poller and the status line (`None` until the first poll).
pub type SharedView = Arc<Mutex<Option<RunView>>>;

/// Polls the orchestrator every `every` and keeps `view` current; `tokens_per_sample`
/// converts the network's tokens/s into samples/s. Failed polls leave the last view.
pub async fn poll(client: ApiClient, view: SharedView, tokens_per_sample: f64, every: Duration) {
    loop {
        if let (Ok(status), Ok(merge)) = (client.status().await, client.merge_status().await) {
            let next = RunView::from_documents(&status, &merge, tokens_per_sample);
            if let Ok(mut slot) = view.lock() {
                *slot = Some(next);
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// The run's part of the status line, e.g. ` | training, merge in 40 samples (~12 s)` or
/// ` | merging, 35 s left`; empty before the first poll.
pub fn describe(view: &SharedView) -> String {
    let Some(v) = view.lock().ok().and_then(|v| *v) else {
        return String::new();
    };
    render(&v, now_ms())
}

/// [`describe`] for a given view and time.
pub fn render(v: &RunView, now_ms: u64) -> String {
    let phase = match v.phase {
        Phase::Training => "training",
        Phase::Uploading => "uploading",
        Phase::Merging => "merging",
    };
    match (v.samples_to_merge, v.deadline_ms) {
        (Some(left), _) if v.samples_per_s > 0.0 => format!(
            " | {phase}, merge in {left} samples (~{:.0} s)",
            left as f64 / v.samples_per_s
        ),
        (Some(left), _) => format!(" | {phase}, merge in {left} samples"),
        (None, Some(deadline)) => format!(
            " | {phase}, {:.0} s left",
            deadline.saturating_sub(now_ms) as f64 / 1000.0
        ),
        (None, None) => format!(" | {phase}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_for_each_phase() {
        let training = RunView {
            phase: Phase::Training,
            deadline_ms: None,
            samples_to_merge: Some(40),
            samples_per_s: 4.0,
        };
        assert_eq!(
            render(&training, 0),
            " | training, merge in 40 samples (~10 s)"
        );
        let cold = RunView {
            samples_per_s: 0.0,
            ..training
        };
        assert_eq!(render(&cold, 0), " | training, merge in 40 samples");
        let merging = RunView {
            phase: Phase::Merging,
            deadline_ms: Some(35_000),
            samples_to_merge: None,
            samples_per_s: 0.0,
        };
        assert_eq!(render(&merging, 0), " | merging, 35 s left");
        assert_eq!(describe(&SharedView::default()), "");
    }
}
