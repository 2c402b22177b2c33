//! What the dashboard's samples ([`super::samples`]) keep between epochs: the newest texts,
//! the last error, and which epoch was last tried, so that one generation runs at a time and
//! each epoch is tried once.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;

/// One prompt and what the model wrote after it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// The prompt.
    pub prompt: String,
    /// The generated continuation (without the prompt).
    pub text: String,
}

/// The samples of one merged model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EpochSamples {
    /// The epoch whose checkpoints were sampled (the model after `epoch` merges).
    pub epoch: u64,
    /// When they were generated, ms since the Unix epoch.
    pub generated_ms: u64,
    /// Seconds the generation took, the model's loading included.
    pub seconds: f64,
    /// One per prompt, in the config's order.
    pub samples: Vec<Sample>,
}

/// What `GET /api/samples` returns.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SamplesView {
    /// The newest samples, if any were generated yet.
    pub latest: Option<EpochSamples>,
    /// Why the last attempt failed, if it did (cleared by the next success).
    pub error: Option<String>,
}

/// The samples the orchestrator holds, and whether a generation is running.
#[derive(Debug, Default)]
pub struct Samples {
    view: Mutex<SamplesView>,
    busy: AtomicBool,
    tried: Mutex<Option<u64>>,
}

impl Samples {
    /// The newest samples and the last error.
    pub fn view(&self) -> SamplesView {
        lock(&self.view).clone()
    }

    /// Claims the generation of `epoch`'s samples: false when one is running, or `epoch` (or a
    /// newer one) was tried already. A failed epoch is not retried; the next epoch is.
    pub fn start(&self, epoch: u64) -> bool {
        let mut tried = lock(&self.tried);
        if tried.is_some_and(|done| done >= epoch) || self.busy.swap(true, Ordering::AcqRel) {
            return false;
        }
        *tried = Some(epoch);
        true
    }

    /// Ends the generation [`Self::start`] claimed: its samples, or why it failed (the
    /// previous samples stay shown then).
    pub fn finish(&self, outcome: Result<EpochSamples, String>) {
        {
            let mut view = lock(&self.view);
            match outcome {
                Ok(latest) => {
                    view.latest = Some(latest);
                    view.error = None;
                }
                Err(e) => view.error = Some(e),
            }
        }
        self.busy.store(false, Ordering::Release);
    }
}

/// A poisoned lock still holds a complete value (every update is one assignment): use it.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(epoch: u64) -> EpochSamples {
        EpochSamples {
            epoch,
            generated_ms: 0,
            seconds: 0.0,
            samples: vec![Sample {
                prompt: "a".into(),
                text: "b".into(),
            }],
        }
    }

    #[test]
    fn each_epoch_is_tried_once_and_one_at_a_time() {
        let store = Samples::default();
        assert!(store.start(1));
        assert!(!store.start(2), "one generation at a time");
        store.finish(Ok(samples(1)));
        assert!(!store.start(1), "epoch 1 was tried");
        assert!(store.start(3));
        store.finish(Err("epoch 3: boom".into()));
        let view = store.view();
        assert_eq!(view.latest, Some(samples(1)), "the last good samples stay");
        assert_eq!(view.error.as_deref(), Some("epoch 3: boom"));
        assert!(!store.start(3), "a failed epoch is not retried");
        assert!(store.start(4));
        store.finish(Ok(samples(4)));
        assert_eq!(store.view().error, None);
    }
}
