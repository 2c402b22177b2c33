//! How much each section boundary matters: the held-out loss with one boundary's output
//! replaced by zeros, and by each channel's mean over the held-out data, against the loss
//! with everything in place. A section whose removal costs little (a re-embedding section
//! that reads the token ids beside a boundary it can ignore, say) is dead weight, and a
//! learning or loss-attribution result measured on such a model says little about a pipeline.

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::ModelError;
use super::pipeline::{Pipeline, chunk_mean};
use super::section::Inner;

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

    /// The ablation as lines of text, one per boundary after a line for the baseline.
    pub fn lines(&self) -> Vec<String> {
        let rise = |v: f32| {
            let d = v - self.baseline;
            format!(
                "{v:.4} ({d:+.4} nats, {:+.1}%)",
                100.0 * d / self.baseline.max(1e-9)
            )
        };
        let mut lines = vec![format!(
            "held-out loss {:.4} with every boundary; with one boundary's output replaced:",
            self.baseline
        )];
        lines.extend(self.boundaries.iter().map(|b| {
            format!(
                "  after section {}: zeros {}, channel means {}",
                b.boundary,
                rise(b.zeroed),
                rise(b.mean)
            )
        }));
        lines
    }
}

/// A model of sections whose boundaries can be ablated: a training [`Pipeline`], or a
/// trained model loaded for inference.
pub trait Boundaries<B: Backend> {
    /// What the model's evaluation fails with.
    type Error: From<ModelError>;

    /// Sections of the model (one more than its boundaries).
    fn section_count(&self) -> usize;

    /// The device the boundary tensors live on.
    fn boundary_device(&self) -> B::Device;

    /// Mean loss of a micro-batch of windows (`seq + 1` tokens each) with each boundary's
    /// output, after the wire codec, passed through `map(boundary, output)` before the next
    /// section reads it; the token ids a re-embedding section reads stay as they are.
    ///
    /// # Errors
    /// Bad windows, a boundary tensor the codec refuses, or what `map` returns.
    fn loss_mapping(
        &mut self,
        windows: &[&[u32]],
        map: &mut dyn FnMut(usize, Tensor<B, 3>) -> Result<Tensor<B, 3>, ModelError>,
    ) -> Result<f32, Self::Error>;
}

/// Ablates every boundary of `model` in turn over `windows`, evaluated `batch` at a time (each
/// window weighs the same).
///
/// # Errors
/// Bad windows, or a boundary tensor the codec refuses.
pub fn ablate<B: Backend, M: Boundaries<B>>(
    model: &mut M,
    windows: &[&[u32]],
    batch: usize,
) -> Result<Ablation, M::Error> {
    // One pass gives the baseline and every boundary's channel means; then two per boundary.
    let (baseline, means) = baseline_and_channel_means(model, windows, batch)?;
    let mut boundaries = Vec::new();
    for (b, mean) in means.into_iter().enumerate() {
        let zeroed = mean_replacing(model, windows, batch, b, &Replacement::Zeros)?;
        let mean = mean_replacing(model, windows, batch, b, &Replacement::ChannelMean(mean))?;
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

/// Per-channel sums of boundary outputs over every position seen, for channel means.
#[derive(Default)]
struct ChannelSums {
    sum: Vec<f64>,
    rows: usize,
}

impl ChannelSums {
    /// Adds every position of a `[batch, seq, width]` output.
    fn add<B: Backend>(&mut self, out: Tensor<B, 3>) -> Result<(), ModelError> {
        let [_, _, width] = out.dims();
        let data = super::host_f32(out.into_data())?;
        self.sum.resize(width, 0.0);
        for row in data.chunks(width.max(1)) {
            for (s, v) in self.sum.iter_mut().zip(row) {
                *s += f64::from(*v);
            }
            self.rows += 1;
        }
        Ok(())
    }

    /// Each channel's mean (every position weighs the same).
    fn means(&self) -> Vec<f32> {
        let rows = self.rows.max(1) as f64;
        self.sum.iter().map(|s| (s / rows) as f32).collect()
    }
}

/// The mean loss over `windows` with every boundary in place, and each boundary's channel
/// means over the same windows, from one pass.
fn baseline_and_channel_means<B: Backend, M: Boundaries<B>>(
    model: &mut M,
    windows: &[&[u32]],
    batch: usize,
) -> Result<(f32, Vec<Vec<f32>>), M::Error> {
    let mut sums: Vec<ChannelSums> = (0..model.section_count().saturating_sub(1))
        .map(|_| ChannelSums::default())
        .collect();
    let baseline = mean_by_chunks(model, windows, batch, &mut |i, out| {
        if let Some(s) = sums.get_mut(i) {
            s.add(out.clone())?;
        }
        Ok(out)
    })?;
    Ok((baseline, sums.iter().map(ChannelSums::means).collect()))
}

/// The mean over `windows`, `batch` at a time, of the loss with boundary outputs mapped by
/// `map`; each chunk weighs by its windows.
fn mean_by_chunks<B: Backend, M: Boundaries<B>>(
    model: &mut M,
    windows: &[&[u32]],
    batch: usize,
    map: &mut dyn FnMut(usize, Tensor<B, 3>) -> Result<Tensor<B, 3>, ModelError>,
) -> Result<f32, M::Error> {
    chunk_mean(windows, batch, |chunk| model.loss_mapping(chunk, map))
}

/// The mean held-out loss over `windows` with the output of boundary `boundary` replaced.
///
/// # Errors
/// As [`Boundaries::loss_mapping`], or a boundary that does not exist.
pub fn mean_replacing<B: Backend, M: Boundaries<B>>(
    model: &mut M,
    windows: &[&[u32]],
    batch: usize,
    boundary: usize,
    with: &Replacement,
) -> Result<f32, M::Error> {
    check_boundary(model.section_count(), boundary)?;
    let device = model.boundary_device();
    mean_by_chunks(model, windows, batch, &mut |i, out| {
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
/// As [`mean_replacing`].
pub fn boundary_channel_mean<B: Backend, M: Boundaries<B>>(
    model: &mut M,
    windows: &[&[u32]],
    batch: usize,
    boundary: usize,
) -> Result<Vec<f32>, M::Error> {
    check_boundary(model.section_count(), boundary)?;
    let (_, mut means) = baseline_and_channel_means(model, windows, batch)?;
    Ok(means.swap_remove(boundary))
}

impl<B: AutodiffBackend> Boundaries<Inner<B>> for Pipeline<B> {
    type Error = ModelError;

    fn section_count(&self) -> usize {
        self.sections().len()
    }

    fn boundary_device(&self) -> B::Device {
        self.device().clone()
    }

    fn loss_mapping(
        &mut self,
        windows: &[&[u32]],
        map: &mut dyn FnMut(usize, Tensor<Inner<B>, 3>) -> Result<Tensor<Inner<B>, 3>, ModelError>,
    ) -> Result<f32, ModelError> {
        self.eval_loss_mapping(windows, map)
    }
}

impl<B: AutodiffBackend> Pipeline<B> {
    /// Ablates every boundary in turn over `windows`, evaluated `batch` at a time (each window
    /// weighs the same; [`ablate`]).
    ///
    /// # Errors
    /// Bad windows, or a boundary tensor the codec refuses.
    pub fn ablation(&mut self, windows: &[&[u32]], batch: usize) -> Result<Ablation, ModelError> {
        ablate(self, windows, batch)
    }
}

/// Refuses a boundary that a model of `sections` sections does not have.
fn check_boundary(sections: usize, boundary: usize) -> Result<(), ModelError> {
    if boundary + 1 >= sections {
        return Err(ModelError::Shape(format!(
            "boundary {boundary} does not exist in a model of {sections} sections"
        )));
    }
    Ok(())
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
        // On one window of one position a boundary's channel mean is its output, so replacing
        // the output by it changes nothing; checked at every boundary, since one pass gathers
        // the means of all of them.
        let one: Vec<&[u32]> = vec![&data[0][..2]];
        for b in 0..cfg.n_sections() - 1 {
            let mean = boundary_channel_mean(&mut p, &one, 1, b).unwrap();
            assert_eq!(mean.len(), cfg.boundary_width());
            let same = mean_replacing(&mut p, &one, 1, b, &Replacement::ChannelMean(mean)).unwrap();
            assert!(
                (same - p.eval_loss(&one).unwrap()).abs() < 1e-5,
                "boundary {b}"
            );
        }
        // Bad input is an error, not a panic.
        assert!(mean_replacing(&mut p, &refs, 2, 9, &Replacement::Zeros).is_err());
        assert!(boundary_channel_mean(&mut p, &refs, 2, 9).is_err());
        assert!(mean_replacing(&mut p, &refs, 2, 0, &Replacement::ChannelMean(vec![0.0])).is_err());
        assert!(a.weakest_rise().is_some());
    }
}
