//! `iota generate`: samples text from a trained model, printing each token as it is chosen.

use std::io::Write;
use std::time::Instant;

use anyhow::Context;
use burn::tensor::backend::AutodiffBackend;
use clap::Args;

use super::trained::{self, ModelSource, Trained};
use crate::infer::generate::generate_text;
use crate::infer::{Chain, InferError, Sampler};
use crate::model::backend::{BackendTask, DeviceKind, dispatch};

/// Arguments of `iota generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The trained model.
    #[command(flatten)]
    pub source: ModelSource,
    /// Device: cpu, cuda, wgpu (GPU backends need the matching cargo feature).
    #[arg(long, value_name = "DEVICE", default_value = "cpu")]
    pub device: DeviceKind,
    /// Text to continue.
    #[arg(long, value_name = "TEXT")]
    pub prompt: String,
    /// Most tokens to generate (fewer when the model ends the text).
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 picks the most likely token every time (greedy).
    #[arg(long, value_name = "T", default_value_t = 0.8)]
    pub temperature: f64,
    /// Nucleus sampling: draw only among the most likely tokens whose probabilities add up
    /// to P (1: all tokens).
    #[arg(long, value_name = "P", default_value_t = 0.95)]
    pub top_p: f64,
    /// Seed of the sampling; the same seed, model and flags give the same text.
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// Rerun the whole context for every token instead of keeping each position's keys and
    /// values (same text, slower; for comparison).
    #[arg(long)]
    pub no_kv_cache: bool,
}

/// Runs `iota generate`.
///
/// # Errors
/// A checkpoint that cannot be found or read, bad sampling flags, or a failure while
/// generating.
pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let trained = trained::open(&args.source)?;
    let sampler = Sampler::new(args.temperature, args.top_p, args.seed)?;
    let device = args.device;
    dispatch(
        device,
        Task {
            args,
            trained,
            sampler,
        },
    )
    .map_err(anyhow::Error::msg)?
}

struct Task {
    args: GenerateArgs,
    trained: Trained,
    sampler: Sampler,
}

impl BackendTask for Task {
    type Output = anyhow::Result<()>;

    fn run<B: AutodiffBackend>(self, device: B::Device) -> Self::Output {
        let Task {
            args,
            trained,
            mut sampler,
        } = self;
        let chain = Chain::<B::InnerBackend>::new(&trained.weights, trained.wire, &device)
            .with_context(|| format!("loading {}", trained.weights.origin))?;
        let mut out = std::io::stdout().lock();
        let started = Instant::now();
        let generated = generate_text(
            &chain,
            &trained.tokenizer,
            &args.prompt,
            args.max_tokens,
            !args.no_kv_cache,
            &mut sampler,
            |text| {
                out.write_all(text.as_bytes())
                    .and_then(|()| out.flush())
                    .map_err(|e| InferError::BadInput(format!("writing to stdout: {e}")))
            },
        )?;
        writeln!(out).context("writing to stdout")?;
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "iota generate: {} tokens in {secs:.2} s ({:.1} tokens/s), {} prompt tokens, model {}",
            generated.ids.len(),
            generated.ids.len() as f64 / secs.max(1e-9),
            generated.prompt_tokens,
            trained.weights.origin
        );
        Ok(())
    }
}
