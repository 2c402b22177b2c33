//! How much each section boundary matters: the held-out loss with one boundary's output
//! replaced by zeros, and by each channel's mean over the held-out data, against the loss
//! with everything in place. A section whose removal costs little (a re-embedding section
//! that reads the token ids beside a boundary it can ignore, say) is dead weight, and a
//! learning or loss-attribution result measured on such a model says little about a pipeline.

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::ModelError;
use super::pipeline::{Pipeline, windows_to_tensors};
use super::section::Inner;
use super::section_model::SectionInput;

/// What replaces one boundary's output.
#[derive(Debug, Clone, PartialEq)]
pub enum Replacement {
    /// Zeros everywhere.
    Zeros,
    /// Every position holds the same value per channel (one value per channel).
    ChannelMean(Vec<f32>),
}

/// The loss with one boundary's output replaced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BoundaryAblation {
    /// The boundary after section `boundary` (0: between the head and the next section).
    pub boundary: usize,
    /// Held-out loss with the boundary's output zeroed.
    pub zeroed: f32,
    /// Held-out loss with the boundary's output replaced by each channel's mean.
    pub mean: f32,
}

/// The held-out loss of a model with each of its boundaries ablated in turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ablation {
    /// Held-out loss with every boundary in place (through the codec, as the network sends it).
    pub baseline: f32,
    /// One entry per boundary, head side first.
    pub boundaries: Vec<BoundaryAblation>,
}

impl Ablation {
    /// The smallest rise of the loss over the baseline that ablating one boundary causes (by
    /// its mean, the gentler of the two), in nats; `None` for a model of one section.
    pub fn weakest_rise(&self) -> Option<f32> {
        self.boundaries
            .iter()
            .map(|b| b.mean.min(b.zeroed) - self.baseline)
            .min_by(f32::total_cmp)
    }
}

impl<B: AutodiffBackend> Pipeline<B> {
    /// Ablates every boundary in turn over `windows`, evaluated `batch` at a time (each window
    /// weighs the same).
    ///
    /// # Errors
    /// Bad windows, or a boundary tensor the codec refuses.
    pub fn ablation(&mut self, windows: &[&[u32]], batch: usize) -> Result<Ablation, ModelError> {
        let baseline = self.eval_mean(windows, batch)?;
        let mut boundaries = Vec::new();
        for b in 0..self.sections().len().saturating_sub(1) {
            let mean = self.boundary_channel_mean(windows, batch, b)?;
            let zeroed = self.mean_over(windows, batch, b, &Replacement::Zeros)?;
            let mean = self.mean_over(windows, batch, b, &Replacement::ChannelMean(mean))?;
            boundaries.push(BoundaryAblation {
                boundary: b,
                zeroed,
                mean,
            });
        }
        Ok(Ablation {
            baseline,
            boundaries,
        })
    }

    /// Mean over `windows` of [`Self::eval_loss_replacing`].
    fn mean_over(
        &mut self,
        windows: &[&[u32]],
        batch: usize,
        boundary: usize,
        with: &Replacement,
    ) -> Result<f32, ModelError> {
        self.mean_by_chunks(windows, batch, |p, chunk| {
            p.eval_loss_replacing(chunk, boundary, with)
        })
    }

    /// Mean loss of a micro-batch with the output of boundary `boundary` replaced (after it
    /// crossed the codec); the token ids a re-embedding section reads stay as they are.
    ///
    /// # Errors
    /// Bad windows, a boundary that does not exist, or a boundary tensor the codec refuses.
    pub fn eval_loss_replacing(
        &mut self,
        windows: &[&[u32]],
        boundary: usize,
        with: &Replacement,
    ) -> Result<f32, ModelError> {
        let n = self.sections().len();
        if boundary + 1 >= n {
            return Err(ModelError::Shape(format!(
                "boundary {boundary} does not exist in a model of {n} sections"
            )));
        }
        let device = self.device().clone();
        self.eval_loss_mapping(windows, |i, out| {
            if i == boundary {
                replacement(out.dims(), with, &device)
            } else {
                Ok(out)
            }
        })
    }

    /// Each channel's mean of boundary `boundary`'s output over `windows` (every position of
    /// every window weighs the same).
    ///
    /// # Errors
    /// As [`Self::eval_loss_replacing`].
    pub fn boundary_channel_mean(
        &mut self,
        windows: &[&[u32]],
        batch: usize,
        boundary: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let mut sum: Vec<f64> = Vec::new();
        let mut rows = 0usize;
        for chunk in windows.chunks(batch.max(1)) {
            let (inputs, _) = windows_to_tensors::<Inner<B>>(chunk, self.device())?;
            let mut x = SectionInput::Tokens(inputs.clone());
            for i in 0..=boundary {
                let out = self.sections_mut()[i].forward(x)?;
                let out = self.cross(out)?.0;
                if i == boundary {
                    let [_, _, width] = out.dims();
                    let data = super::host_f32(out.into_data())?;
                    sum.resize(width, 0.0);
                    for row in data.chunks(width.max(1)) {
                        for (s, v) in sum.iter_mut().zip(row) {
                            *s += f64::from(*v);
                        }
                        rows += 1;
                    }
                    break;
                }
                x = SectionInput::boundary(out, self.ids_for(i + 1, &inputs));
            }
        }
        Ok(sum
            .iter()
            .map(|s| (s / rows.max(1) as f64) as f32)
            .collect())
    }
}

/// A `[batch, seq, width]` tensor holding `with`.
fn replacement<B: burn::tensor::backend::Backend>(
    [batch, seq, width]: [usize; 3],
    with: &Replacement,
    device: &B::Device,
) -> Result<Tensor<B, 3>, ModelError> {
    let data = match with {
        Replacement::Zeros => vec![0.0f32; batch * seq * width],
        Replacement::ChannelMean(mean) => {
            if mean.len() != width {
                return Err(ModelError::Shape(format!(
                    "a mean of {} channels for a boundary of {width}",
                    mean.len()
                )));
            }
            mean.iter()
                .copied()
                .cycle()
                .take(batch * seq * width)
                .collect()
        }
    };
    Ok(Tensor::from_data(
        TensorData::new(data, [batch, seq, width]),
        device,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::WireDtype;
    use crate::model::{ModelConfig, OptimizerConfig, TestAutodiff};

    fn windows(n: usize, len: usize) -> Vec<Vec<u32>> {
        (0..n)
            .map(|w| (0..len).map(|i| ((w * 7 + i * 3) % 251) as u32).collect())
            .collect()
    }

    #[test]
    fn ablating_a_boundary_changes_the_loss_and_in_place_changes_nothing() {
        let mut cfg = ModelConfig::preset("tiny").unwrap();
        cfg.reembed = false;
        let mut p = Pipeline::<TestAutodiff>::new(
            &cfg,
            3,
            OptimizerConfig::default(),
            WireDtype::F32,
            &Default::default(),
        )
        .unwrap();
        let data = windows(4, 9);
        let refs: Vec<&[u32]> = data.iter().map(Vec::as_slice).collect();
        let a = p.ablation(&refs, 2).unwrap();
        assert_eq!(a.boundaries.len(), cfg.n_sections() - 1);
        assert_eq!(a.baseline, p.eval_mean(&refs, 2).unwrap());
        for b in &a.boundaries {
            assert!(b.zeroed.is_finite() && b.mean.is_finite(), "{b:?}");
            assert_ne!(
                b.zeroed, a.baseline,
                "zeroing boundary {} changed nothing",
                b.boundary
            );
        }
        // The mean of a boundary, replaced by itself on one-row data, is the output itself:
        // one window of one position.
        let one: Vec<&[u32]> = vec![&data[0][..2]];
        let mean = p.boundary_channel_mean(&one, 1, 0).unwrap();
        assert_eq!(mean.len(), cfg.boundary_width());
        let same = p
            .eval_loss_replacing(&one, 0, &Replacement::ChannelMean(mean))
            .unwrap();
        assert!((same - p.eval_loss(&one).unwrap()).abs() < 1e-5);
        // Bad input is an error, not a panic.
        assert!(
            p.eval_loss_replacing(&refs, 9, &Replacement::Zeros)
                .is_err()
        );
        assert!(
            p.eval_loss_replacing(&refs, 0, &Replacement::ChannelMean(vec![0.0]))
                .is_err()
        );
        assert!(a.weakest_rise().is_some());
    }
}
