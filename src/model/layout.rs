//! Names and shapes of a section's parameters computed from the config alone, and the section's
//! flat state vector ([`FlatLayout`]) for the merge.
//!
//! The orchestrator never builds a model, yet it must know the exact layout every miner of a
//! section uploads, so that a miner cannot make up its own. [`section_layout`] derives it from
//! [`ModelConfig`]; a test pins it to what the burn module actually holds.

use std::collections::HashMap;

use burn::tensor::backend::AutodiffBackend;

use super::ModelError;
use super::config::{DecoderKind, ModelConfig};
use super::params::NamedTensor;
use super::section::{OptimizerState, Section};
use crate::codec::FlatLayout;

/// `(global name, shape)` of every parameter of section `index`, in no particular order.
///
/// # Errors
/// [`ModelError::Invalid`] when `index` is out of range.
pub fn param_shapes(
    cfg: &ModelConfig,
    index: usize,
) -> Result<Vec<(String, Vec<usize>)>, ModelError> {
    let spec = cfg.section(index)?;
    let (d, w, v) = (cfg.d_model, cfg.boundary_width(), cfg.vocab_size);
    let kv = cfg.n_kv_heads * cfg.head_dim();
    let mut out = Vec::new();
    let mut push = |name: String, shape: Vec<usize>| out.push((name, shape));
    if spec.is_head {
        push("model.embed_tokens.weight".into(), vec![v, d]);
    }
    if spec.bottleneck_in {
        let first = spec.blocks.start;
        push(
            format!("model.layers.{first}.bottleneck.decoder.weight"),
            vec![d, w],
        );
        push(
            format!("model.layers.{first}.bottleneck.decoder.bias"),
            vec![d],
        );
        if cfg.bottleneck_decoder == DecoderKind::Mlp {
            push(
                format!("model.layers.{first}.bottleneck.decoder_out.weight"),
                vec![d, d],
            );
        }
    }
    if spec.reembed {
        let first = spec.blocks.start;
        push(format!("model.layers.{first}.reembed.weight"), vec![v, d]);
    }
    for i in spec.blocks.clone() {
        let p = format!("model.layers.{i}");
        push(format!("{p}.input_layernorm.weight"), vec![d]);
        push(format!("{p}.post_attention_layernorm.weight"), vec![d]);
        push(format!("{p}.self_attn.q_proj.weight"), vec![d, d]);
        push(format!("{p}.self_attn.k_proj.weight"), vec![kv, d]);
        push(format!("{p}.self_attn.v_proj.weight"), vec![kv, d]);
        push(format!("{p}.self_attn.o_proj.weight"), vec![d, d]);
        push(format!("{p}.mlp.gate_proj.weight"), vec![cfg.d_ff, d]);
        push(format!("{p}.mlp.up_proj.weight"), vec![cfg.d_ff, d]);
        push(format!("{p}.mlp.down_proj.weight"), vec![d, cfg.d_ff]);
    }
    if spec.bottleneck_out {
        let last = spec.blocks.end - 1;
        push(
            format!("model.layers.{last}.bottleneck.encoder.weight"),
            vec![w, d],
        );
    }
    if spec.is_tail {
        push("model.norm.weight".into(), vec![d]);
        push("lm_head.weight".into(), vec![v, d]);
    }
    Ok(out)
}

/// The flat layout of section `index` (see [`FlatLayout`]).
///
/// # Errors
/// [`ModelError::Invalid`] when `index` is out of range.
pub fn section_layout(cfg: &ModelConfig, index: usize) -> Result<FlatLayout, ModelError> {
    FlatLayout::new(param_shapes(cfg, index)?).map_err(|e| ModelError::Params(e.to_string()))
}

impl<B: AutodiffBackend> Section<B> {
    /// The section's parameters and optimizer moments as one flat vector in `layout`.
    ///
    /// # Errors
    /// [`ModelError::Params`] when the section does not match `layout`.
    pub fn export_flat(&self, layout: &FlatLayout) -> Result<Vec<f32>, ModelError> {
        let params = self.export_params();
        let optimizer = self.export_optimizer();
        let p: HashMap<&str, &[f32]> = params
            .iter()
            .map(|t| (t.name.as_str(), t.data.as_slice()))
            .collect();
        let moment = |suffix: &str| -> HashMap<&str, &[f32]> {
            optimizer
                .tensors
                .iter()
                .filter_map(|t| Some((t.name.strip_suffix(suffix)?, t.data.as_slice())))
                .collect()
        };
        layout
            .flatten(&p, &moment(".exp_avg"), &moment(".exp_avg_sq"))
            .map_err(|e| ModelError::Params(e.to_string()))
    }

    /// Replaces parameters and optimizer moments with `flat` (laid out as `layout`); the
    /// optimizer's step count is kept.
    ///
    /// # Errors
    /// [`ModelError::Params`] for a wrong length, names that do not fit or non-finite values;
    /// the section is unchanged then.
    pub fn import_flat(&mut self, layout: &FlatLayout, flat: &[f32]) -> Result<(), ModelError> {
        let parts = layout
            .split(flat)
            .map_err(|e| ModelError::Params(e.to_string()))?;
        let mut params = Vec::with_capacity(parts.params.len());
        let mut moments = Vec::with_capacity(parts.params.len() * 2);
        for (((name, shape, data), m), v) in parts
            .params
            .into_iter()
            .zip(parts.exp_avg)
            .zip(parts.exp_avg_sq)
        {
            let n = m.len();
            moments.push(NamedTensor {
                name: format!("{name}.exp_avg"),
                shape: vec![n],
                data: m,
            });
            moments.push(NamedTensor {
                name: format!("{name}.exp_avg_sq"),
                shape: vec![n],
                data: v,
            });
            params.push(NamedTensor { name, shape, data });
        }
        let state = OptimizerState {
            step: self.optimizer_step(),
            tensors: moments,
        };
        self.import_state(&params, &state)
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, NdArray};

    use super::*;
    use crate::model::OptimizerConfig;

    type B = Autodiff<NdArray>;

    fn sorted(mut v: Vec<(String, Vec<usize>)>) -> Vec<(String, Vec<usize>)> {
        v.sort();
        v
    }

    #[test]
    fn computed_shapes_match_the_module_for_every_section() {
        let mut cfgs = vec![ModelConfig::preset("tiny").unwrap()];
        let mut gqa = ModelConfig::preset("tiny").unwrap();
        gqa.n_kv_heads = 2;
        gqa.bottleneck = false;
        cfgs.push(gqa);
        let mut one = ModelConfig::preset("tiny").unwrap();
        one.sections = vec![[0, one.n_layers]];
        cfgs.push(one);
        let mut reembed = ModelConfig::preset("tiny").unwrap();
        reembed.reembed = true;
        cfgs.push(reembed);
        let mut mlp = ModelConfig::preset("tiny").unwrap();
        mlp.bottleneck_decoder = crate::model::DecoderKind::Mlp;
        cfgs.push(mlp);
        for cfg in cfgs {
            for index in 0..cfg.n_sections() {
                let section = Section::<B>::new(
                    &cfg,
                    index,
                    0,
                    OptimizerConfig::default(),
                    &Default::default(),
                )
                .unwrap();
                assert_eq!(
                    sorted(param_shapes(&cfg, index).unwrap()),
                    sorted(section.param_shapes()),
                    "section {index}"
                );
                let n: usize = param_shapes(&cfg, index)
                    .unwrap()
                    .iter()
                    .map(|(_, s)| s.iter().product::<usize>())
                    .sum();
                assert_eq!(n, cfg.section_params(index).unwrap());
            }
        }
    }

    #[test]
    fn flat_export_import_round_trips_bit_exactly() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let layout = section_layout(&cfg, 1).unwrap();
        let device = Default::default();
        let a = Section::<B>::new(&cfg, 1, 0, OptimizerConfig::default(), &device).unwrap();
        let flat = a.export_flat(&layout).unwrap();
        assert_eq!(flat.len(), layout.total_len());
        let changed: Vec<f32> = flat.iter().map(|x| x * 0.5 + 0.25).collect();
        let mut b = Section::<B>::new(&cfg, 1, 7, OptimizerConfig::default(), &device).unwrap();
        b.import_flat(&layout, &changed).unwrap();
        assert_eq!(b.export_flat(&layout).unwrap(), changed);
        let mut bad = changed.clone();
        bad[0] = f32::NAN;
        assert!(b.import_flat(&layout, &bad).is_err());
        bad[0] = 0.0;
        let last = bad.len() - 1;
        bad[last] = f32::INFINITY;
        assert!(b.import_flat(&layout, &bad).is_err());
        assert_eq!(
            b.export_flat(&layout).unwrap(),
            changed,
            "refused import changed state"
        );
        assert!(b.import_flat(&layout, &changed[1..]).is_err());
    }
}
