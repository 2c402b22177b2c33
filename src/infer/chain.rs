//! [`Chain`]: a trained model's sections run one after another without gradients, the
//! boundary tensors sent through the wire codec and the token ids handed to every section
//! that re-embeds them, as `iota train` and the network do.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use super::{InferError, Weights};
use crate::codec::WireDtype;
use crate::model::ablation::Boundaries;
use crate::model::config::SectionSpec;
use crate::model::init::Init;
use crate::model::params::import_params;
use crate::model::pipeline::{through_wire, windows_to_tensors};
use crate::model::section_model::{SectionCache, cross_entropy};
use crate::model::{ModelConfig, ModelError, SectionInput, SectionModel, host_values};

/// Every section of a trained model, head first, on one device.
#[derive(Debug)]
pub struct Chain<B: Backend> {
    model: ModelConfig,
    sections: Vec<(SectionSpec, SectionModel<B>)>,
    wire: WireDtype,
    context: usize,
    device: B::Device,
}

impl<B: Backend> Chain<B> {
    /// The sections of `weights` on `device`; boundary tensors cross as `wire`.
    ///
    /// # Errors
    /// [`InferError::WrongConfig`] when a section's tensors do not fit the config (a missing,
    /// extra or wrongly shaped tensor, or a non-finite value).
    pub fn new(weights: &Weights, wire: WireDtype, device: &B::Device) -> Result<Self, InferError> {
        let model = &weights.model;
        model.validate()?;
        if weights.sections.len() != model.n_sections() {
            return Err(InferError::WrongConfig(format!(
                "{} sections of weights for a config of {}",
                weights.sections.len(),
                model.n_sections()
            )));
        }
        // The initial values are overwritten; the seed does not matter.
        let init = Init::new(0);
        let sections = weights
            .sections
            .iter()
            .enumerate()
            .map(|(i, tensors)| {
                let spec = model.section(i)?;
                let fresh = SectionModel::new(model, &spec, &init, device);
                let loaded = import_params(fresh, &spec, tensors)
                    .map_err(|e| InferError::WrongConfig(format!("section {i}: {e}")))?;
                Ok((spec, loaded))
            })
            .collect::<Result<Vec<_>, InferError>>()?;
        Ok(Self {
            model: model.clone(),
            sections,
            wire,
            context: weights.context,
            device: device.clone(),
        })
    }

    /// The model config.
    pub fn model(&self) -> &ModelConfig {
        &self.model
    }

    /// The longest context the model was trained on, in tokens.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Logits at every position of `ids`.
    ///
    /// # Shapes
    /// - ids: `[batch, seq]` -> `[batch, seq, vocab]`
    ///
    /// # Errors
    /// A boundary tensor the codec refuses (non-finite activations).
    pub fn logits(&self, ids: Tensor<B, 2, Int>) -> Result<Tensor<B, 3>, InferError> {
        self.logits_mapping(ids, &mut |_, out| Ok(out))
    }

    /// [`Self::logits`] with each boundary's output (after the codec) passed through
    /// `map(boundary, output)` before the next section reads it (ablations).
    fn logits_mapping(
        &self,
        ids: Tensor<B, 2, Int>,
        map: &mut dyn FnMut(usize, Tensor<B, 3>) -> Result<Tensor<B, 3>, ModelError>,
    ) -> Result<Tensor<B, 3>, InferError> {
        let mut x = SectionInput::Tokens(ids.clone());
        let n = self.sections.len();
        for i in 0..n - 1 {
            let out = self.sections[i].1.forward(x);
            let (out, _) = through_wire(out, self.wire, &self.device)?;
            let out = map(i, out)?;
            let tokens = self.sections[i + 1].0.reembed.then(|| ids.clone());
            x = SectionInput::boundary(out, tokens);
        }
        Ok(self.sections[n - 1].1.logits(x))
    }

    /// The ids as a `[1, len]` tensor, checked against the vocabulary and the context.
    fn sequence(&self, ids: &[u32]) -> Result<Tensor<B, 2, Int>, InferError> {
        if ids.is_empty() || ids.len() > self.model.max_seq_len {
            return Err(InferError::BadInput(format!(
                "a sequence of {} tokens is outside 1..={}",
                ids.len(),
                self.model.max_seq_len
            )));
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.model.vocab_size) {
            return Err(InferError::BadInput(format!(
                "token id {id} is outside the model's vocabulary of {}",
                self.model.vocab_size
            )));
        }
        let data: Vec<i64> = ids.iter().map(|&t| i64::from(t)).collect();
        Ok(Tensor::from_data(
            TensorData::new(data, [1, ids.len()]),
            &self.device,
        ))
    }

    /// Whether [`Self::extend`] computes what [`Self::next_logits`] does: the boundary
    /// encoding must work value by value (`f32`, `bf16`). `int8` shares one scale among the
    /// positions of a block of rows, so a position sent alone is rounded differently.
    pub fn caches_exactly(&self) -> bool {
        self.wire != WireDtype::Int8
    }

    /// An empty key/value cache for [`Self::extend`].
    pub fn new_cache(&self) -> Cache<B> {
        Cache {
            sections: self.sections.iter().map(|(_, m)| m.new_cache()).collect(),
        }
    }

    /// Logits of the token that follows `ids`, running only the ids `cache` has not seen
    /// (all of them on an empty cache, then one at a time) and adding them to it.
    ///
    /// # Errors
    /// `ids` not one or more ids past the cache's (all of them on an empty cache, exactly one
    /// more on a filled one), longer than `max_seq_len`, an id outside the vocabulary, or
    /// non-finite activations.
    pub fn extend(&self, cache: &mut Cache<B>, ids: &[u32]) -> Result<Vec<f32>, InferError> {
        let seen = cache.len();
        if ids.len() <= seen || (seen > 0 && ids.len() != seen + 1) {
            return Err(InferError::BadInput(format!(
                "a cache of {seen} positions extended to {} ids (one new id at a time)",
                ids.len()
            )));
        }
        if ids.len() > self.model.max_seq_len {
            return Err(InferError::BadInput(format!(
                "a sequence of {} tokens is longer than {}",
                ids.len(),
                self.model.max_seq_len
            )));
        }
        let new = self.sequence(&ids[seen..])?;
        let mut x = SectionInput::Tokens(new.clone());
        let n = self.sections.len();
        for (i, cache) in cache.sections[..n - 1].iter_mut().enumerate() {
            let out = self.sections[i].1.forward_cached(x, cache);
            let (out, _) = through_wire(out, self.wire, &self.device)?;
            let tokens = self.sections[i + 1].0.reembed.then(|| new.clone());
            x = SectionInput::boundary(out, tokens);
        }
        let logits = self.sections[n - 1]
            .1
            .logits_cached(x, &mut cache.sections[n - 1]);
        let [_, seq, vocab] = logits.dims();
        Ok(host_values(logits.slice([0..1, seq - 1..seq, 0..vocab]))?)
    }

    /// Logits of the token that follows `ids` (`vocab` values).
    ///
    /// # Errors
    /// An empty or too long sequence, an id outside the vocabulary, or non-finite activations.
    pub fn next_logits(&self, ids: &[u32]) -> Result<Vec<f32>, InferError> {
        let logits = self.logits(self.sequence(ids)?)?;
        let [_, seq, vocab] = logits.dims();
        let last = logits.slice([0..1, seq - 1..seq, 0..vocab]);
        Ok(host_values(last)?)
    }

    /// Mean next-token cross-entropy (nats) over `windows` of `seq + 1` tokens each, as
    /// `iota train` evaluates a micro-batch.
    ///
    /// # Errors
    /// Windows of unequal or too short length, or non-finite activations.
    pub fn mean_loss(&self, windows: &[&[u32]]) -> Result<f32, InferError> {
        self.mean_loss_mapping(windows, &mut |_, out| Ok(out))
    }

    /// [`Self::mean_loss`] with boundary outputs mapped as in [`Self::logits_mapping`].
    fn mean_loss_mapping(
        &self,
        windows: &[&[u32]],
        map: &mut dyn FnMut(usize, Tensor<B, 3>) -> Result<Tensor<B, 3>, ModelError>,
    ) -> Result<f32, InferError> {
        let (inputs, targets) = windows_to_tensors::<B>(windows, &self.device)?;
        let loss = cross_entropy(self.logits_mapping(inputs, map)?, targets);
        let value = host_values(loss)?;
        value
            .first()
            .copied()
            .ok_or_else(|| InferError::BadInput("an empty batch has no loss".into()))
    }

    /// `log p(window[t + 1] | window[..=t])` for every `t`: one value per target token.
    ///
    /// # Errors
    /// A window shorter than 2 tokens or longer than the model's `max_seq_len + 1`, an id
    /// outside the vocabulary, or non-finite activations.
    pub fn target_log_probs(&self, window: &[u32]) -> Result<Vec<f64>, InferError> {
        if window.len() < 2 {
            return Err(InferError::BadInput(
                "scoring needs at least two tokens".into(),
            ));
        }
        let inputs = &window[..window.len() - 1];
        let logits = host_values(self.logits(self.sequence(inputs)?)?)?;
        let vocab = self.model.vocab_size;
        Ok(logits
            .chunks_exact(vocab)
            .zip(&window[1..])
            .map(|(row, &target)| log_softmax_at(row, target as usize))
            .collect())
    }
}

impl<B: Backend> Boundaries<B> for Chain<B> {
    type Error = InferError;

    fn section_count(&self) -> usize {
        self.sections.len()
    }

    fn boundary_device(&self) -> B::Device {
        self.device.clone()
    }

    fn loss_mapping(
        &mut self,
        windows: &[&[u32]],
        map: &mut dyn FnMut(usize, Tensor<B, 3>) -> Result<Tensor<B, 3>, ModelError>,
    ) -> Result<f32, InferError> {
        self.mean_loss_mapping(windows, map)
    }
}

/// Keys and values of every section for the positions run so far ([`Chain::extend`]).
#[derive(Debug, Clone)]
pub struct Cache<B: Backend> {
    sections: Vec<SectionCache<B>>,
}

impl<B: Backend> Cache<B> {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.sections.first().map_or(0, SectionCache::len)
    }

    /// Whether no position is held yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `log softmax(row)[index]`, computed in f64.
fn log_softmax_at(row: &[f32], index: usize) -> f64 {
    let max = row
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    let max = f64::from(max);
    let sum: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
    f64::from(row[index]) - max - sum.ln()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::TestBackend as B;
    use crate::model::params::export_params;

    /// The initial weights of `model` (seed `seed`) as [`Weights`].
    pub(crate) fn initial_weights(model: &ModelConfig, seed: u64) -> Weights {
        let init = Init::new(seed);
        let sections = (0..model.n_sections())
            .map(|i| {
                let spec = model.section(i).unwrap();
                let m = SectionModel::<B>::new(model, &spec, &init, &Default::default());
                export_params(&m, &spec)
            })
            .collect();
        Weights {
            model: model.clone(),
            sections,
            tokenizer: None,
            context: 16,
            origin: "initial".into(),
        }
    }

    pub(crate) fn tiny_chain() -> Chain<B> {
        let mut model = ModelConfig::preset("tiny").unwrap();
        model.max_seq_len = 16;
        Chain::new(
            &initial_weights(&model, 7),
            WireDtype::F32,
            &Default::default(),
        )
        .unwrap()
    }

    #[test]
    fn the_last_position_and_the_log_probs_agree_with_the_batched_loss() {
        let chain = tiny_chain();
        let window: Vec<u32> = (0..9).map(|i| (i * 37 % 256) as u32).collect();
        let lp = chain.target_log_probs(&window).unwrap();
        assert_eq!(lp.len(), 8);
        let mean = -lp.iter().sum::<f64>() / lp.len() as f64;
        let loss = chain.mean_loss(&[&window]).unwrap();
        assert!((mean - f64::from(loss)).abs() < 1e-4, "{mean} vs {loss}");
        // The next-token logits of a prefix give the same log-probability of the next id.
        let next = chain.next_logits(&window[..4]).unwrap();
        let direct = log_softmax_at(&next, window[4] as usize);
        assert!((direct - lp[3]).abs() < 1e-4, "{direct} vs {}", lp[3]);
    }

    #[test]
    fn the_cache_gives_the_logits_of_the_whole_sequence() {
        let chain = tiny_chain();
        assert!(chain.caches_exactly());
        let ids: Vec<u32> = (0..12).map(|i| (i * 53 % 256) as u32).collect();
        let mut cache = chain.new_cache();
        for end in 3..=ids.len() {
            let cached = chain.extend(&mut cache, &ids[..end]).unwrap();
            let full = chain.next_logits(&ids[..end]).unwrap();
            let worst = cached
                .iter()
                .zip(&full)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(worst < 1e-4, "{end} ids: logits differ by {worst}");
            assert_eq!(cache.len(), end);
        }
        // Two new ids at once, or none, on a filled cache are refused.
        assert!(chain.extend(&mut cache, &ids).is_err());
        let mut other = chain.new_cache();
        chain.extend(&mut other, &ids[..3]).unwrap();
        assert!(chain.extend(&mut other, &ids[..5]).is_err());
    }

    #[test]
    fn bad_sequences_are_refused() {
        let chain = tiny_chain();
        assert!(chain.next_logits(&[]).is_err());
        assert!(chain.next_logits(&[300]).is_err());
        assert!(chain.next_logits(&[1; 17]).is_err());
        assert!(chain.target_log_probs(&[1]).is_err());
    }

    #[test]
    fn a_section_with_the_wrong_tensors_is_a_config_error() {
        let model = ModelConfig::preset("tiny").unwrap();
        let mut w = initial_weights(&model, 1);
        w.sections[1].pop();
        let err = Chain::<B>::new(&w, WireDtype::F32, &Default::default()).unwrap_err();
        assert!(matches!(err, InferError::WrongConfig(_)), "{err}");
    }
}
