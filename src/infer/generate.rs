//! The autoregressive loop: the context through every section, one token sampled, appended,
//! and again. While the text fits the model's trained context a key/value cache runs only
//! the new token; past it the window slides (older tokens drop out) and each step reruns the
//! whole window.

use burn::tensor::backend::Backend;

use super::{Chain, InferError, Sampler, TextStream};
use crate::data::Tokenizer;

/// When generation stops.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most tokens generated.
    pub max_tokens: usize,
    /// Stop (without emitting it) when this id is sampled: the tokenizer's end of text.
    pub stop: Option<u32>,
    /// Keep each position's keys and values while the text fits the context (when the chain
    /// [caches exactly](Chain::caches_exactly)); `false` reruns the whole context every step.
    pub kv_cache: bool,
}

/// Generates up to `limits.max_tokens` ids after `prompt`, calling `on_token` with each as
/// soon as it is chosen; returns the generated ids.
///
/// # Errors
/// An empty prompt, an id outside the vocabulary, a failure in the model, or whatever
/// `on_token` returns.
pub fn generate<B: Backend>(
    chain: &Chain<B>,
    prompt: &[u32],
    limits: Limits,
    sampler: &mut Sampler,
    mut on_token: impl FnMut(u32) -> Result<(), InferError>,
) -> Result<Vec<u32>, InferError> {
    if prompt.is_empty() {
        return Err(InferError::BadInput(
            "the prompt is empty and the tokenizer has no end-of-text token to start from".into(),
        ));
    }
    let context = chain.context();
    let mut ids = prompt.to_vec();
    let mut cache = (limits.kv_cache && chain.caches_exactly()).then(|| chain.new_cache());
    for _ in 0..limits.max_tokens {
        // Once the text outgrows the context the window slides: every step then starts at
        // another position and the cache no longer applies.
        let logits = match cache.as_mut() {
            Some(cache) if ids.len() <= context => chain.extend(cache, &ids)?,
            _ => chain.next_logits(&ids[ids.len().saturating_sub(context)..])?,
        };
        let id = sampler.pick(&logits);
        if Some(id) == limits.stop {
            break;
        }
        ids.push(id);
        on_token(id)?;
    }
    Ok(ids.split_off(prompt.len()))
}

/// What [`generate_text`] produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextGeneration {
    /// Tokens the prompt encoded to (an empty prompt: the end-of-text token, if any).
    pub prompt_tokens: usize,
    /// The generated ids.
    pub ids: Vec<u32>,
}

/// Generates text after `prompt`: encodes it with `tokenizer` (an empty prompt starts a new
/// document at the end-of-text token), samples up to `max_tokens` ids, stopping at the
/// tokenizer's end of text, and passes the decoded text to `on_text` piece by piece as soon as
/// it is whole, the last piece included.
///
/// # Errors
/// As [`generate`], a prompt the tokenizer cannot encode, or whatever `on_text` returns.
pub fn generate_text<B: Backend>(
    chain: &Chain<B>,
    tokenizer: &Tokenizer,
    prompt: &str,
    max_tokens: usize,
    kv_cache: bool,
    sampler: &mut Sampler,
    mut on_text: impl FnMut(&str) -> Result<(), InferError>,
) -> Result<TextGeneration, InferError> {
    let mut prompt = tokenizer.encode(prompt)?;
    if prompt.is_empty() {
        prompt.extend(tokenizer.end_of_text());
    }
    let limits = Limits {
        max_tokens,
        stop: tokenizer.end_of_text(),
        kv_cache,
    };
    let mut stream = TextStream::new(tokenizer);
    let ids = generate(chain, &prompt, limits, sampler, |id| {
        on_text(&stream.push(id)?)
    })?;
    on_text(&stream.finish()?)?;
    Ok(TextGeneration {
        prompt_tokens: prompt.len(),
        ids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer::chain::tests::tiny_chain;

    fn run(
        chain: &Chain<crate::model::TestBackend>,
        temperature: f64,
        seed: u64,
        kv_cache: bool,
    ) -> Vec<u32> {
        let mut sampler = Sampler::new(temperature, 0.9, seed).unwrap();
        let limits = Limits {
            max_tokens: 20,
            stop: None,
            kv_cache,
        };
        let mut streamed = Vec::new();
        let out = generate(chain, &[1, 2, 3], limits, &mut sampler, |id| {
            streamed.push(id);
            Ok(())
        })
        .unwrap();
        assert_eq!(out, streamed);
        out
    }

    #[test]
    fn generation_is_bounded_reproducible_and_slides_past_the_context() {
        let chain = tiny_chain();
        // 3 + 20 tokens exceed the 16-token context: the window slides.
        let greedy = run(&chain, 0.0, 1, false);
        assert_eq!(greedy.len(), 20);
        assert_eq!(
            greedy,
            run(&chain, 0.0, 2, false),
            "greedy depends on the seed"
        );
        assert_eq!(run(&chain, 1.0, 9, false), run(&chain, 1.0, 9, false));
        // The cache, used while the text fits the context, changes nothing.
        assert_eq!(greedy, run(&chain, 0.0, 1, true));
        assert_eq!(run(&chain, 1.0, 9, false), run(&chain, 1.0, 9, true));
        // The first greedy token is the argmax of the prompt's next-token logits.
        let logits = chain.next_logits(&[1, 2, 3]).unwrap();
        let mut s = Sampler::new(0.0, 1.0, 0).unwrap();
        assert_eq!(greedy[0], s.pick(&logits));
    }

    #[test]
    fn an_empty_prompt_is_refused_and_the_stop_token_ends_early() {
        let chain = tiny_chain();
        let mut s = Sampler::new(0.0, 1.0, 0).unwrap();
        let limits = Limits {
            max_tokens: 5,
            stop: None,
            kv_cache: true,
        };
        assert!(generate(&chain, &[], limits, &mut s, |_| Ok(())).is_err());
        let first = generate(&chain, &[4, 5], limits, &mut s, |_| Ok(())).unwrap()[0];
        let stop = Limits {
            stop: Some(first),
            ..limits
        };
        assert!(
            generate(&chain, &[4, 5], stop, &mut s, |_| Ok(()))
                .unwrap()
                .is_empty()
        );
    }
}
