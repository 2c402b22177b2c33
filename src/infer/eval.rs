//! Held-out loss and perplexity of a trained model over a dataset's evaluation windows, the
//! same windows and the same per-batch mean that `iota train` evaluates.

use std::borrow::Cow;

use burn::tensor::backend::Backend;
use serde::Serialize;

use super::{Chain, InferError};
use crate::data::Dataset;
use crate::model::ablation::{Ablation, ablate};

/// What an evaluation measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalReport {
    /// Held-out windows evaluated.
    pub windows: usize,
    /// Target tokens scored.
    pub tokens: usize,
    /// Mean next-token cross-entropy, nats per token.
    pub loss: f64,
    /// `exp(loss)`.
    pub perplexity: f64,
    /// Bits per token (`loss / ln 2`).
    pub bits_per_token: f64,
}

/// Evaluates the first `windows` held-out windows of `dataset` (all of them when it has
/// fewer), `batch` windows at a time; each window weighs the same.
///
/// # Errors
/// `windows` or `batch` of 0, or a failure in the model.
pub fn held_out<B: Backend>(
    chain: &Chain<B>,
    dataset: &Dataset,
    windows: usize,
    batch: usize,
) -> Result<EvalReport, InferError> {
    check_counts(windows, batch)?;
    let owned = held_out_windows(dataset, windows);
    let n = owned.len();
    let all: Vec<&[u32]> = owned.iter().map(AsRef::as_ref).collect();
    let mut total = 0.0f64;
    for chunk in all.chunks(batch) {
        total += f64::from(chain.mean_loss(chunk)?) * chunk.len() as f64;
    }
    let loss = total / n as f64;
    Ok(EvalReport {
        windows: n,
        tokens: n * dataset.seq_len(),
        loss,
        perplexity: loss.exp(),
        bits_per_token: loss / std::f64::consts::LN_2,
    })
}

/// The first `windows` held-out windows of `dataset` (all of them when it has fewer): the ones
/// `iota train` evaluates.
pub fn held_out_windows(dataset: &Dataset, windows: usize) -> Vec<Cow<'_, [u32]>> {
    let n = windows.min(dataset.num_eval_windows());
    (0..n).map(|i| dataset.eval_sample(i)).collect()
}

/// The held-out loss of `chain` with each boundary's output replaced by zeros, and by its
/// channel means, in turn ([`ablate`]), over the first `windows` held-out windows of
/// `dataset`, `batch` at a time.
///
/// # Errors
/// `windows` or `batch` of 0, or a failure in the model.
pub fn held_out_ablation<B: Backend>(
    chain: &mut Chain<B>,
    dataset: &Dataset,
    windows: usize,
    batch: usize,
) -> Result<Ablation, InferError> {
    check_counts(windows, batch)?;
    let owned = held_out_windows(dataset, windows);
    let all: Vec<&[u32]> = owned.iter().map(AsRef::as_ref).collect();
    ablate(chain, &all, batch)
}

/// Refuses a count of 0 windows or a batch of 0.
fn check_counts(windows: usize, batch: usize) -> Result<(), InferError> {
    if windows == 0 || batch == 0 {
        return Err(InferError::BadInput(
            "--windows and --batch-size must be at least 1".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer::chain::tests::tiny_chain;

    #[test]
    fn the_report_is_the_mean_over_windows_whatever_the_batch() {
        let chain = tiny_chain();
        let tokens: Vec<u32> = (0..4000).map(|i| (i * 31 % 251) as u32).collect();
        let data = Dataset::from_tokens(tokens, 16, 0, "test").unwrap();
        let a = held_out(&chain, &data, 3, 1).unwrap();
        let b = held_out(&chain, &data, 3, 2).unwrap();
        assert_eq!(a.windows, 3);
        assert_eq!(a.tokens, 48);
        assert!((a.loss - b.loss).abs() < 1e-5, "{a:?} {b:?}");
        assert!((a.perplexity - a.loss.exp()).abs() < 1e-9);
        // Asking for more windows than there are evaluates them all.
        let all = held_out(&chain, &data, 1_000_000, 8).unwrap();
        assert_eq!(all.windows, data.num_eval_windows());
        assert!(held_out(&chain, &data, 0, 1).is_err());
    }
}
