//! The network's merge of one section's miners, simulated over data-parallel replicas held in
//! one process (`iota train --replicas R --merge-wire W`): each replica's flat state (see
//! [`super::layout`]) goes through the merge format `W` as an upload, the decoded uploads are
//! averaged (the `mean` operator with equal weights), the mean goes through `W` again as the
//! merged partitions do, and every replica adopts what that decodes to.
//!
//! A format with a base ([`MergeWire::needs_base`], `dct`) encodes the parameters as their
//! change from the previous global state, which is kept here per section, and each replica
//! keeps the change its upload left out and adds it to its next one (error feedback), as a
//! miner does. So the learning cost of a format can be measured deterministically, apart
//! from the timing noise of a real network; what differs from the network: the mean is taken
//! over the whole vector, where the network's butterfly cuts it into partitions (a `dct`
//! chunk grid restarts at each partition's first element).

use burn::tensor::backend::AutodiffBackend;

use super::ModelError;
use super::layout::section_layout;
use super::pipeline::Pipeline;
use crate::codec::{ErrorFeedback, FlatLayout, MergeWire, Span};

/// Gives every pipeline of `replicas` (copies of one model) the mean of their parameters and
/// optimizer moments, section by section: what the network's `mean` merge does to the miners
/// of every section, in `f32`. Step counts are kept (they are equal when the replicas stepped
/// together).
///
/// # Errors
/// Replicas of different models.
pub fn average<B: AutodiffBackend>(replicas: &mut [Pipeline<B>]) -> Result<(), ModelError> {
    if replicas.is_empty() {
        return Ok(());
    }
    ReplicaMerge::new(MergeWire::F32, replicas)?.merge(replicas)
}

/// Gives every pipeline of `replicas` the mean of its boundary's parameters and optimizer
/// moments only (every `.bottleneck.` tensor: the encoder that ends a section and the decoder
/// that starts the next), in `f32`, and leaves the rest of each replica as it was. A
/// simulation lever (`iota train --average-boundary-every N`): the boundary's two halves,
/// averaged more often than the sections' blocks, keep one code for every lane.
///
/// # Errors
/// Replicas of different models.
pub fn average_boundaries<B: AutodiffBackend>(
    replicas: &mut [Pipeline<B>],
) -> Result<(), ModelError> {
    let Some(first) = replicas.first() else {
        return Ok(());
    };
    let config = first.sections()[0].config().clone();
    let n = first.sections().len();
    let scale = 1.0 / replicas.len() as f32;
    for i in 0..n {
        let layout = section_layout(&config, i)?;
        let p = params_len(&layout);
        let spans: Vec<(usize, usize)> = layout
            .tensors
            .iter()
            .filter(|t| t.name.contains(".bottleneck."))
            .map(|t| (usize::try_from(t.offset).unwrap_or(usize::MAX), t.len()))
            .collect();
        if spans.is_empty() || p == 0 {
            continue;
        }
        let mut flats = replicas
            .iter()
            .map(|r| {
                r.sections()
                    .get(i)
                    .ok_or_else(|| ModelError::Invalid("replicas of different depths".into()))?
                    .export_flat(&layout)
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Parameters, then each moment: the same spans in every block of `p` values.
        for b in 0..flats[0].len() / p {
            for &(offset, len) in &spans {
                for k in b * p + offset..b * p + offset + len {
                    let mean = flats.iter().map(|f| f[k]).sum::<f32>() * scale;
                    flats.iter_mut().for_each(|f| f[k] = mean);
                }
            }
        }
        for (replica, flat) in replicas.iter_mut().zip(&flats) {
            replica.sections_mut()[i].import_flat(&layout, flat)?;
        }
    }
    Ok(())
}

/// A change to one section's merged parameters before the replicas adopt them:
/// `(section, previous global parameters, merged parameters)`; see [`ReplicaMerge::merge_then`].
pub type MergeAdjust<'a> = dyn FnMut(usize, &[f32], &mut [f32]) -> Result<(), String> + 'a;

/// What the merges of replicas carry from one to the next: the format, each section's global
/// parameters of the last merge, and each replica's error feedback.
#[derive(Debug, Clone)]
pub struct ReplicaMerge {
    wire: MergeWire,
    /// Per section: the flat layout and the parameters of the last global state.
    sections: Vec<(FlatLayout, Vec<f32>)>,
    /// Per replica, per section: the parameters' change its uploads left out so far.
    feedback: Vec<Vec<ErrorFeedback>>,
}

impl ReplicaMerge {
    /// Starts from `replicas`' current state (they must hold the same model, as after a
    /// merge or at initialisation from one seed).
    ///
    /// # Errors
    /// No replicas, or replicas of different models.
    pub fn new<B: AutodiffBackend>(
        wire: MergeWire,
        replicas: &[Pipeline<B>],
    ) -> Result<Self, ModelError> {
        let first = replicas
            .first()
            .ok_or_else(|| ModelError::Invalid("no replicas to merge".into()))?;
        let n = first.sections().len();
        if replicas.iter().any(|r| r.sections().len() != n) {
            return Err(ModelError::Invalid(
                "replicas with different numbers of sections".into(),
            ));
        }
        let config = first.sections()[0].config().clone();
        let mut sections = Vec::with_capacity(n);
        for (i, section) in first.sections().iter().enumerate() {
            let layout = section_layout(&config, i)?;
            let p = params_len(&layout);
            let mut params = section.export_flat(&layout)?;
            params.truncate(p);
            sections.push((layout, params));
        }
        Ok(Self {
            wire,
            sections,
            feedback: vec![vec![ErrorFeedback::default(); n]; replicas.len()],
        })
    }

    /// Merges `replicas` section by section through the format and gives each the result.
    ///
    /// # Errors
    /// A different number of replicas than at [`Self::new`], or a state the format refuses
    /// (a non-finite or out-of-range value).
    pub fn merge<B: AutodiffBackend>(
        &mut self,
        replicas: &mut [Pipeline<B>],
    ) -> Result<(), ModelError> {
        self.merge_then(replicas, &mut |_, _, _| Ok(()))
    }

    /// As [`Self::merge`], but `adjust(section, previous, merged)` may change each section's
    /// merged parameters (`merged`, the first of the merged values; the moments stay their
    /// mean) from the previous global parameters (`previous`) before the replicas adopt them:
    /// an outer step, as the network's `merge.outer` takes on the merged partitions. What it
    /// leaves becomes the next merge's previous global state.
    ///
    /// # Errors
    /// As [`Self::merge`], and what `adjust` returns.
    pub fn merge_then<B: AutodiffBackend>(
        &mut self,
        replicas: &mut [Pipeline<B>],
        adjust: &mut MergeAdjust<'_>,
    ) -> Result<(), ModelError> {
        if replicas.len() != self.feedback.len() {
            return Err(ModelError::Invalid(format!(
                "{} replicas to merge, {} at the start",
                replicas.len(),
                self.feedback.len()
            )));
        }
        let wire = self.wire;
        let scale = 1.0 / replicas.len() as f32;
        let encoding = |e| ModelError::Invalid(format!("merge format {wire}: {e}"));
        for (i, (layout, base)) in self.sections.iter_mut().enumerate() {
            let p = params_len(layout);
            let span = Span::whole(p as u64);
            let base_now: &[f32] = if wire.needs_base() { base } else { &[] };
            let mut sum: Vec<f32> = Vec::new();
            for (r, replica) in replicas.iter().enumerate() {
                let mut flat = replica.sections()[i].export_flat(layout)?;
                let feedback = &mut self.feedback[r][i];
                feedback.add_to(wire, &mut flat, p);
                let sent = wire.round_trip(&flat, span, base_now).map_err(encoding)?;
                feedback.keep(wire, &flat, &sent, p);
                if sum.is_empty() {
                    sum = sent;
                } else {
                    sum.iter_mut().zip(&sent).for_each(|(acc, x)| *acc += x);
                }
            }
            sum.iter_mut().for_each(|x| *x *= scale);
            let mut merged = wire
                .round_trip(&sum, Span::partition(0, p as u64), base_now)
                .map_err(encoding)?;
            adjust(i, base, &mut merged[..p])
                .map_err(|e| ModelError::Invalid(format!("section {i}: {e}")))?;
            for replica in replicas.iter_mut() {
                replica.sections_mut()[i].import_flat(layout, &merged)?;
            }
            base.clear();
            base.extend_from_slice(&merged[..p]);
        }
        Ok(())
    }
}

fn params_len(layout: &FlatLayout) -> usize {
    usize::try_from(layout.params_len).unwrap_or(usize::MAX)
}
