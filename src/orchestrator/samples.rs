//! Text sampled from each newly merged model, for the dashboard (`GET /api/samples`).
//!
//! When every section has a checkpoint for an epoch newer than the last one sampled, the
//! orchestrator reads the sections' `f32` states from its storage, runs the whole model on its
//! CPU ([`crate::infer`], with a key/value cache) and generates one text per configured prompt
//! ([`SamplesConfig`]). One generation runs at a time, off the async threads; the newest result
//! is kept in memory (a restart samples the newest epoch again). The same checkpoint and seed
//! give the same text, which is what `iota generate` prints for that checkpoint with the same
//! flags.

use std::time::Instant;

use super::config::SamplesConfig;
use super::sample_store::{EpochSamples, Sample};
use super::state::AppState;
use crate::data::Tokenizer;
use crate::infer::generate::generate_text;
use crate::infer::{Chain, InferError, Sampler, load};
use crate::model::backend::Cpu;
use crate::storage::StatePart;

/// Starts a generation in the background when every section has a checkpoint newer than the
/// last epoch sampled (and none is running). Called on the orchestrator's tick.
pub fn refresh(state: &AppState) {
    if !state.config.samples.enabled() {
        return;
    }
    let epoch = match newest_complete_epoch(state) {
        Ok(Some(epoch)) => epoch,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!("dashboard samples: {e}");
            return;
        }
    };
    if !state.samples.start(epoch) {
        return;
    }
    let state = state.clone();
    tokio::spawn(async move {
        let started = Instant::now();
        let result = sample_epoch(&state, epoch).await;
        let seconds = started.elapsed().as_secs_f64();
        let outcome = match result {
            Ok(samples) => {
                tracing::info!(
                    "dashboard samples of epoch {epoch}: {} prompts in {seconds:.1} s",
                    samples.len()
                );
                Ok(EpochSamples {
                    epoch,
                    generated_ms: state.now_ms(),
                    seconds,
                    samples,
                })
            }
            Err(e) => {
                tracing::warn!("dashboard samples of epoch {epoch}: {e:#}");
                Err(format!("epoch {epoch}: {e:#}"))
            }
        };
        state.samples.finish(outcome);
    });
}

/// The newest epoch for which every section has a checkpoint.
fn newest_complete_epoch(state: &AppState) -> Result<Option<u64>, super::repo_types::RepoError> {
    let mut common: Option<std::collections::BTreeSet<u64>> = None;
    for section in 0..state.config.model.n_sections() {
        let epochs: std::collections::BTreeSet<u64> =
            state.repo.checkpoint_epochs(section)?.into_iter().collect();
        common = Some(match common {
            None => epochs,
            Some(c) => c.intersection(&epochs).copied().collect(),
        });
    }
    Ok(common.and_then(|c| c.last().copied()))
}

/// Reads `epoch`'s section states and generates every prompt's sample.
async fn sample_epoch(state: &AppState, epoch: u64) -> anyhow::Result<Vec<Sample>> {
    let mut flats = Vec::with_capacity(state.config.model.n_sections());
    for section in 0..state.config.model.n_sections() {
        let key = state.checkpoint_key(section, epoch, StatePart::Flat);
        let bytes = state
            .storage
            .get(&key)
            .await
            .map_err(|e| anyhow::anyhow!("reading {key}: {e}"))?;
        flats.push(bytes);
    }
    let model = state.config.model.clone();
    let context = state.config.seq_len;
    let wire = state.config.wire;
    let config = state.config.samples.clone();
    let tokenizer_path = state.config.data.tokenizer.clone();
    let origin = format!("epoch {epoch}'s checkpoints");
    tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<Sample>> {
        let tokenizer = Tokenizer::load(tokenizer_path.as_deref())?;
        let weights = load::from_section_flats(&flats, &model, context, &origin)?;
        drop(flats);
        let chain = Chain::<Cpu>::new(&weights, wire, &Default::default())?;
        drop(weights);
        Ok(sample_all(&chain, &tokenizer, &config)?)
    })
    .await?
}

/// One sample per prompt of `config`, each with its own sampler seeded from `config.seed`.
fn sample_all(
    chain: &Chain<Cpu>,
    tokenizer: &Tokenizer,
    config: &SamplesConfig,
) -> Result<Vec<Sample>, InferError> {
    config
        .prompts
        .iter()
        .enumerate()
        .map(|(i, prompt)| {
            let mut sampler = Sampler::new(
                config.temperature,
                config.top_p,
                config.seed.wrapping_add(i as u64),
            )?;
            let mut text = String::new();
            generate_text(
                chain,
                tokenizer,
                prompt,
                config.max_tokens,
                true,
                &mut sampler,
                |piece| {
                    text.push_str(piece);
                    Ok(())
                },
            )?;
            Ok(Sample {
                prompt: prompt.clone(),
                text,
            })
        })
        .collect()
}
