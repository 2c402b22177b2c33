//! Model configuration: the shape of the Llama-style decoder, its presets, and how it is cut
//! into pipeline sections.
//!
//! A [`ModelConfig`] is plain data, serialisable to YAML/JSON, so the orchestrator, miners,
//! validators and checkpoints share one description of the model. It is never mutated after
//! validation (the reference implementation rescaled RoPE theta in a shared config on every
//! re-instantiation; here every derived quantity is computed, not stored back).

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::ModelError;

/// Names of the built-in presets, smallest first.
pub const PRESETS: [&str; 5] = ["tiny", "small", "1b", "8b", "15b"];

/// Shape of the whole model and its split into sections.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Preset this config started from (informational; "custom" when built by hand).
    #[serde(default = "custom_name")]
    pub name: String,
    /// Vocabulary size (rows of the embedding and of the LM head).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Number of transformer blocks in the whole model.
    pub n_layers: usize,
    /// Number of query heads.
    pub n_heads: usize,
    /// Number of key/value heads (grouped-query attention when smaller than `n_heads`).
    pub n_kv_heads: usize,
    /// Hidden width of the SwiGLU MLP.
    pub d_ff: usize,
    /// Longest sequence the model is configured for (default training length).
    pub max_seq_len: usize,
    /// Base of the rotary position embedding.
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    /// Epsilon of every RMSNorm.
    #[serde(default = "default_norm_eps")]
    pub norm_eps: f64,
    /// Standard deviation of the normal initialisation of weight matrices.
    #[serde(default = "default_init_std")]
    pub init_std: f64,
    /// Pipeline sections as half-open block ranges `[start, end)`, in order; they must tile
    /// `0..n_layers`. The first section holds the embedding, the last the final norm and LM head.
    pub sections: Vec<[usize; 2]>,
    /// Whether section boundaries carry the learned residual bottleneck. Without it the full
    /// `d_model`-wide residual stream crosses every boundary.
    #[serde(default = "default_true")]
    pub bottleneck: bool,
    /// Width of the bottleneck (`d_b`); defaults to `d_model / 64`.
    #[serde(default)]
    pub d_b: Option<usize>,
    /// How the first block after a boundary expands the `d_b` channels back to `d_model`
    /// (see [`DecoderKind`]). A config written before this choice existed has none and gets
    /// [`DecoderKind::Reference`], the decoder it was trained with.
    #[serde(default)]
    pub bottleneck_decoder: DecoderKind,
    /// Whether every section after the head also reads the sample's input token ids and adds
    /// its own embedding of them to what crossed the boundary:
    /// `x = decode(z) + reembed_scale * E_s[ids]`, with `E_s` a `vocab x d_model` table per
    /// section (`model.layers.{first}.reembed.weight`). A narrow boundary then only has to
    /// carry what the earlier blocks computed, not which tokens they saw.
    #[serde(default)]
    pub reembed: bool,
    /// Multiplier of the re-embedded ids; default `sqrt(d_model)`, the Transformer's
    /// embedding scale. The table starts at `init_std` like every matrix; the multiplier makes
    /// its contribution comparable to the decoded boundary's at the start and lets AdamW move
    /// it that much faster (at scale 1 it changed nothing on `small` in 300 steps; 10 and
    /// `sqrt(384)` = 19.6 ended within 0.3% of each other; docs/performance.md, "Activation compression").
    #[serde(default)]
    pub reembed_scale: Option<f64>,
}

/// The decoder half of a bottleneck, on the receiving side of a boundary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecoderKind {
    /// `x = silu(W_dec z + b) + [z, 0]`: the IOTA reference's, `d_b -> d_model` in one layer.
    #[default]
    Reference,
    /// `x = W_out silu(W_dec z + b) + [z, 0]`: a two-layer MLP with a `d_model`-wide hidden
    /// layer, `d_model^2` more parameters per boundary (+1.0% on `small`, +0.7% on `1b`). It
    /// lets the decoded stream be any function of the `d_b` channels, not only a sum of
    /// `d_model` gated directions. Measured worse than the reference on `small` without
    /// re-embedding at 64x and 1M tokens (+15.1% and +11.4% against +9.3% and +1.4% over no
    /// bottleneck at seeds 0 and 1), though ahead on `tiny` (docs/learning.md), so not a
    /// default.
    Mlp,
}

impl DecoderKind {
    /// The name used in configs.
    pub fn name(self) -> &'static str {
        match self {
            Self::Reference => "reference",
            Self::Mlp => "mlp",
        }
    }
}

fn custom_name() -> String {
    "custom".to_string()
}
fn default_rope_theta() -> f64 {
    10_000.0
}
fn default_norm_eps() -> f64 {
    1e-5
}
fn default_init_std() -> f64 {
    0.02
}
fn default_true() -> bool {
    true
}

/// Sections of `n_layers` blocks split as evenly as possible into `n` ranges.
pub fn even_sections(n_layers: usize, n: usize) -> Vec<[usize; 2]> {
    let n = n.max(1);
    (0..n)
        .map(|i| [i * n_layers / n, (i + 1) * n_layers / n])
        .collect()
}

impl ModelConfig {
    /// The built-in preset called `name`.
    ///
    /// | preset | params | d_model | blocks | heads (kv) | d_ff | sections |
    /// |---|---|---|---|---|---|---|
    /// | `tiny` | ~1.02M | 128 | 6 | 4 (2) | 256 | 3 |
    /// | `small` | ~13.0M | 384 | 8 | 6 (2) | 1024 | 3 |
    /// | `1b` | ~1.2B | 2048 | 16 | 32 (8) | 8192 | 3 |
    /// | `8b` | ~8.0B | 4096 | 32 | 32 (8) | 14336 | 4 |
    /// | `15b` | ~15B | 5120 | 50 | 40 (8) | 13824 | 5 |
    ///
    /// `tiny` and `small` use the byte-level vocabulary (256), the GPU presets a Llama-3 sized
    /// one (128256). No preset re-embeds the token ids after a boundary ([`Self::reembed`]):
    /// with that bypass a later section learns to ignore what crosses the boundary (removing
    /// it costs under 0.01 nats, docs/learning.md), so only the model without it makes every
    /// section matter. A config can still turn it on.
    ///
    /// # Errors
    /// [`ModelError::UnknownPreset`] for any other name.
    pub fn preset(name: &str) -> Result<Self, ModelError> {
        let base = |vocab, d_model, n_layers, n_heads, n_kv_heads, d_ff, seq, n_sections| Self {
            name: name.to_string(),
            vocab_size: vocab,
            d_model,
            n_layers,
            n_heads,
            n_kv_heads,
            d_ff,
            max_seq_len: seq,
            rope_theta: default_rope_theta(),
            norm_eps: default_norm_eps(),
            init_std: default_init_std(),
            sections: even_sections(n_layers, n_sections),
            bottleneck: true,
            d_b: None,
            bottleneck_decoder: DecoderKind::Reference,
            reembed: false,
            reembed_scale: None,
        };
        let cfg = match name {
            "tiny" => base(256, 128, 6, 4, 2, 256, 64, 3),
            "small" => base(256, 384, 8, 6, 2, 1024, 256, 3),
            "1b" => Self {
                rope_theta: 500_000.0,
                ..base(128_256, 2048, 16, 32, 8, 8192, 2048, 3)
            },
            "8b" => Self {
                rope_theta: 500_000.0,
                ..base(128_256, 4096, 32, 32, 8, 14_336, 2048, 4)
            },
            "15b" => Self {
                rope_theta: 500_000.0,
                ..base(128_256, 5120, 50, 40, 8, 13_824, 2048, 5)
            },
            other => {
                return Err(ModelError::UnknownPreset {
                    name: other.to_string(),
                    known: PRESETS.join(", "),
                });
            }
        };
        Ok(cfg)
    }

    /// A preset with overrides from a YAML/JSON mapping applied on top (any field, including
    /// `sections` and `d_b`); an extra key `preset` names the base (default `base`).
    ///
    /// # Errors
    /// Unknown preset, unknown keys, wrong types, or an invalid result (see [`Self::validate`]).
    pub fn from_value(value: &serde_json::Value, default_preset: &str) -> Result<Self, ModelError> {
        let serde_json::Value::Object(map) = value else {
            return Err(ModelError::Invalid(
                "the model config must be a mapping of keys to values".into(),
            ));
        };
        let preset = match map.get("preset") {
            Some(serde_json::Value::String(p)) => p.as_str(),
            Some(_) => return Err(ModelError::Invalid("`preset` must be a string".into())),
            None => default_preset,
        };
        let mut merged = serde_json::to_value(Self::preset(preset)?)
            .map_err(|e| ModelError::Invalid(e.to_string()))?;
        if let serde_json::Value::Object(base) = &mut merged {
            for (k, v) in map {
                if k != "preset" {
                    base.insert(k.clone(), v.clone());
                }
            }
            // A changed layer count without explicit sections keeps the preset's section count.
            if map.contains_key("n_layers") && !map.contains_key("sections") {
                let n_layers = base.get("n_layers").and_then(|v| v.as_u64()).unwrap_or(0);
                let n_sections = Self::preset(preset)?.sections.len();
                base.insert(
                    "sections".into(),
                    serde_json::to_value(even_sections(n_layers as usize, n_sections))
                        .map_err(|e| ModelError::Invalid(e.to_string()))?,
                );
            }
        }
        let cfg: Self = serde_json::from_value(merged)
            .map_err(|e| ModelError::Invalid(format!("model config: {e}")))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks every invariant the model relies on.
    ///
    /// # Errors
    /// [`ModelError::Invalid`] naming the offending key.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |msg: String| Err(ModelError::Invalid(msg));
        for (key, v) in [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("d_ff", self.d_ff),
            ("max_seq_len", self.max_seq_len),
        ] {
            if v == 0 {
                return bad(format!("`{key}` must be positive"));
            }
        }
        if !self.d_model.is_multiple_of(self.n_heads) {
            return bad(format!(
                "`d_model` ({}) must be divisible by `n_heads` ({})",
                self.d_model, self.n_heads
            ));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!(
                "`n_heads` ({}) must be divisible by `n_kv_heads` ({})",
                self.n_heads, self.n_kv_heads
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return bad(format!(
                "the head dimension d_model/n_heads = {} must be even for rotary embeddings",
                self.head_dim()
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return bad("`rope_theta` must be a finite number above 1".into());
        }
        if !(self.norm_eps.is_finite() && self.norm_eps > 0.0) {
            return bad("`norm_eps` must be a small positive number".into());
        }
        if !(self.init_std.is_finite() && self.init_std > 0.0) {
            return bad("`init_std` must be positive".into());
        }
        if self.sections.is_empty() {
            return bad("`sections` must list at least one block range".into());
        }
        let mut next = 0;
        for (i, [start, end]) in self.sections.iter().copied().enumerate() {
            if start != next {
                return bad(format!(
                    "`sections` must cover blocks 0..{} contiguously: section {i} starts at {start}, expected {next}",
                    self.n_layers
                ));
            }
            if end <= start {
                return bad(format!(
                    "`sections`: section {i} [{start}, {end}] holds no blocks"
                ));
            }
            next = end;
        }
        if next != self.n_layers {
            return bad(format!(
                "`sections` cover blocks 0..{next} but the model has {} blocks (`n_layers`)",
                self.n_layers
            ));
        }
        if let Some(scale) = self.reembed_scale
            && !(scale.is_finite() && scale > 0.0)
        {
            return bad(format!(
                "`reembed_scale` must be a finite positive number, got {scale}"
            ));
        }
        if let Some(d_b) = self.d_b
            && (d_b == 0 || d_b > self.d_model)
        {
            return bad(format!(
                "`d_b` must be between 1 and d_model ({}), got {d_b}",
                self.d_model
            ));
        }
        Ok(())
    }

    /// Dimension of one attention head.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads
    }

    /// Number of sections.
    pub fn n_sections(&self) -> usize {
        self.sections.len()
    }

    /// Width of the tensors crossing a section boundary: `d_b` with the bottleneck, else
    /// `d_model`.
    pub fn boundary_width(&self) -> usize {
        if self.bottleneck {
            self.d_b.unwrap_or((self.d_model / 64).max(1))
        } else {
            self.d_model
        }
    }

    /// Width of the boundary tensors while the warm-up's bridge has weight `bridge`
    /// ([`crate::model::SectionModel::bridge`]): [`Self::boundary_width`], plus the whole
    /// residual stream while the bridge is on in a model with a bottleneck.
    pub fn boundary_width_with_bridge(&self, bridge: f64) -> usize {
        let bridged = self.bottleneck && bridge > 0.0;
        self.boundary_width() + if bridged { self.d_model } else { 0 }
    }

    /// Multiplier of the re-embedded token ids (see [`Self::reembed`]).
    pub fn reembed_scale(&self) -> f64 {
        self.reembed_scale
            .unwrap_or_else(|| (self.d_model as f64).sqrt())
    }

    /// Description of section `index`.
    ///
    /// # Errors
    /// [`ModelError::Invalid`] when `index` is out of range.
    pub fn section(&self, index: usize) -> Result<SectionSpec, ModelError> {
        let [start, end] = *self.sections.get(index).ok_or_else(|| {
            ModelError::Invalid(format!(
                "section {index} does not exist (the model has {} sections)",
                self.sections.len()
            ))
        })?;
        let last = self.sections.len() - 1;
        Ok(SectionSpec {
            index,
            blocks: start..end,
            is_head: index == 0,
            is_tail: index == last,
            bottleneck_in: self.bottleneck && index > 0,
            bottleneck_out: self.bottleneck && index < last,
            reembed: self.reembed && index > 0,
        })
    }

    /// Parameters of one block (norms, attention, MLP).
    pub fn block_params(&self) -> usize {
        let d = self.d_model;
        let kv = self.n_kv_heads * self.head_dim();
        2 * d + 2 * d * d + 2 * d * kv + 3 * d * self.d_ff
    }

    /// Parameters held by section `index`, computed from the shapes (no allocation).
    ///
    /// # Errors
    /// [`ModelError::Invalid`] when `index` is out of range.
    pub fn section_params(&self, index: usize) -> Result<usize, ModelError> {
        let spec = self.section(index)?;
        let (d, w) = (self.d_model, self.boundary_width());
        let mut n = spec.blocks.len() * self.block_params();
        if spec.is_head {
            n += self.vocab_size * d;
        }
        if spec.is_tail {
            n += d + self.vocab_size * d;
        }
        if spec.bottleneck_in {
            n += w * d + d;
            if self.bottleneck_decoder == DecoderKind::Mlp {
                n += d * d;
            }
        }
        if spec.bottleneck_out {
            n += d * w;
        }
        if spec.reembed {
            n += self.vocab_size * d;
        }
        Ok(n)
    }

    /// Parameters of the whole model.
    pub fn total_params(&self) -> usize {
        (0..self.n_sections())
            .filter_map(|i| self.section_params(i).ok())
            .sum()
    }

    /// Model FLOPs of one training token (forward and backward) at sequence length `seq`,
    /// computed, not measured: 6 per parameter of every matrix product (the embedding is a
    /// lookup and does not count) plus attention's two `seq`-long products, 12 x blocks x
    /// `d_model` x `seq`, counted over the whole square as the kernels compute it (the
    /// PaLM paper's accounting). Model FLOP utilization is this times tokens/s over the
    /// hardware's peak.
    pub fn train_flops_per_token(&self, seq: usize) -> f64 {
        // The embedding and the re-embedding tables (one per later section) are lookups.
        let lookups = if self.reembed { self.n_sections() } else { 1 };
        let matmul = self.total_params() - lookups * self.vocab_size * self.d_model;
        6.0 * matmul as f64 + 12.0 * (self.n_layers * self.d_model * seq) as f64
    }
}

impl ModelConfig {
    /// Model FLOPs of one training token (forward and backward) through section `index` alone,
    /// computed as [`Self::train_flops_per_token`] counts the whole model: 6 per parameter of
    /// its matrix products (its embedding or re-embedding tables are lookups) plus attention's
    /// products in its blocks. A forward is a third of it, a backward two thirds. The sections'
    /// figures add up to the whole model's.
    ///
    /// # Errors
    /// [`ModelError::Invalid`] when `index` is out of range.
    pub fn section_train_flops_per_token(
        &self,
        index: usize,
        seq: usize,
    ) -> Result<f64, ModelError> {
        let spec = self.section(index)?;
        let mut lookups = 0;
        if spec.is_head {
            lookups += self.vocab_size * self.d_model;
        }
        if spec.reembed {
            lookups += self.vocab_size * self.d_model;
        }
        let matmul = self.section_params(index)? - lookups;
        Ok(6.0 * matmul as f64 + 12.0 * (spec.blocks.len() * self.d_model * seq) as f64)
    }
}

/// Where one section sits in the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectionSpec {
    /// Position of the section in the pipeline (0 = head).
    pub index: usize,
    /// Global indices of the blocks it holds.
    pub blocks: Range<usize>,
    /// Holds the token embedding; its input is token ids.
    pub is_head: bool,
    /// Holds the final norm and LM head; its output is the loss.
    pub is_tail: bool,
    /// Its input arrives through the bottleneck (decoded from `d_b` channels).
    pub bottleneck_in: bool,
    /// Its output leaves through the bottleneck (encoded to `d_b` channels).
    pub bottleneck_out: bool,
    /// It reads the sample's input token ids beside its input and re-embeds them
    /// ([`ModelConfig::reembed`]; never the head, which embeds them anyway).
    pub reembed: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn section_flops_add_up_to_the_model() {
        for preset in ["tiny", "small", "1b"] {
            let c = ModelConfig::preset(preset).unwrap();
            let sum: f64 = (0..c.n_sections())
                .map(|i| c.section_train_flops_per_token(i, 64).unwrap())
                .sum();
            let whole = c.train_flops_per_token(64);
            assert!(
                (sum - whole).abs() <= whole * 1e-12,
                "{preset}: {sum} vs {whole}"
            );
        }
        let c = ModelConfig::preset("tiny").unwrap();
        assert!(c.section_train_flops_per_token(c.n_sections(), 64).is_err());
    }

    #[test]
    fn training_flops_count_the_products_and_attention() {
        let c = ModelConfig::preset("tiny").unwrap();
        let (d, kv) = (c.d_model, c.d_model * c.n_kv_heads / c.n_heads);
        // Per block: q and o (d x d), k and v (d x kv), gate, up and down (d x d_ff).
        let blocks = c.n_layers * (2 * d * d + 2 * d * kv + 3 * d * c.d_ff);
        let head = c.vocab_size * d;
        let products = blocks + head;
        let f0 = c.train_flops_per_token(0);
        // Norm gains and the small bottleneck maps are counted too: within 10% of the products.
        assert!(
            f0 >= 6.0 * products as f64 && f0 < 6.6 * products as f64,
            "{f0} vs {products}"
        );
        let attention = c.train_flops_per_token(100) - f0;
        assert_eq!(attention, 12.0 * (c.n_layers * d * 100) as f64);
    }

    #[test]
    fn presets_are_valid_and_match_their_names() {
        let expect = [
            ("tiny", 0.2e6, 1.1e6),
            ("small", 10e6, 30e6),
            ("1b", 1.0e9, 1.5e9),
            ("8b", 7.5e9, 8.5e9),
            ("15b", 14e9, 16e9),
        ];
        for (name, lo, hi) in expect {
            let cfg = ModelConfig::preset(name).unwrap();
            cfg.validate().unwrap();
            let n = cfg.total_params() as f64;
            assert!(n >= lo && n <= hi, "{name}: {n} params");
        }
        let big = ModelConfig::preset("15b").unwrap();
        assert_eq!(big.n_layers, 50);
        assert_eq!(big.n_sections(), 5);
        assert_eq!(big.boundary_width(), 80);
    }

    #[test]
    fn unknown_preset_is_an_error() {
        let err = ModelConfig::preset("huge").unwrap_err().to_string();
        assert!(err.contains("huge") && err.contains("tiny"), "{err}");
    }

    #[test]
    fn overrides_apply_and_unknown_keys_fail() {
        let v = serde_json::json!({"preset": "tiny", "d_b": 3, "sections": [[0, 3], [3, 6]]});
        let cfg = ModelConfig::from_value(&v, "small").unwrap();
        assert_eq!(cfg.boundary_width(), 3);
        assert_eq!(cfg.n_sections(), 2);
        let v = serde_json::json!({"preset": "tiny", "d_bottle": 3});
        let err = ModelConfig::from_value(&v, "tiny").unwrap_err().to_string();
        assert!(err.contains("d_bottle"), "{err}");
    }

    #[test]
    fn sections_must_tile_the_blocks() {
        for sections in [
            vec![[0, 2], [3, 6]],
            vec![[0, 2], [2, 5]],
            vec![[0, 0], [0, 6]],
            vec![],
        ] {
            let mut cfg = ModelConfig::preset("tiny").unwrap();
            cfg.sections = sections.clone();
            let err = cfg.validate().unwrap_err().to_string();
            assert!(err.contains("sections"), "{sections:?}: {err}");
        }
    }

    #[test]
    fn the_mlp_decoder_is_chosen_in_configs_and_old_configs_keep_the_reference_one() {
        let preset = ModelConfig {
            bottleneck_decoder: DecoderKind::Reference,
            ..ModelConfig::preset("small").unwrap()
        };
        // A config serialised before the key existed lacks it and reads as the reference.
        let mut old = serde_json::to_value(&preset).unwrap();
        old.as_object_mut().unwrap().remove("bottleneck_decoder");
        let read: ModelConfig = serde_json::from_value(old).unwrap();
        assert_eq!(read.bottleneck_decoder, DecoderKind::Reference);
        let mlp =
            ModelConfig::from_value(&serde_json::json!({"bottleneck_decoder": "mlp"}), "small")
                .unwrap();
        assert_eq!(mlp.bottleneck_decoder, DecoderKind::Mlp);
        let err =
            ModelConfig::from_value(&serde_json::json!({"bottleneck_decoder": "deep"}), "small")
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("deep") && err.contains("mlp") && !err.contains('\n'),
            "{err}"
        );
        // The output layer is d_model x d_model on every section that decodes.
        let d = preset.d_model;
        assert_eq!(
            mlp.section_params(0).unwrap(),
            preset.section_params(0).unwrap()
        );
        for i in 1..3 {
            assert_eq!(
                mlp.section_params(i).unwrap(),
                preset.section_params(i).unwrap() + d * d
            );
        }
    }

    #[test]
    fn section_param_counts_add_up() {
        for name in PRESETS {
            let preset = ModelConfig::preset(name).unwrap();
            assert!(!preset.reembed, "{name} re-embeds by default");
        }
        let cfg = ModelConfig::preset("tiny").unwrap();
        let sum: usize = (0..3).map(|i| cfg.section_params(i).unwrap()).sum();
        assert_eq!(sum, cfg.total_params());
        let spec = cfg.section(1).unwrap();
        assert!(spec.bottleneck_in && spec.bottleneck_out && !spec.is_head && !spec.is_tail);
        assert!(cfg.section(3).is_err());
        // Re-embedding adds a table to every section but the head.
        let re = ModelConfig {
            reembed: true,
            ..cfg.clone()
        };
        let table = cfg.vocab_size * cfg.d_model;
        assert_eq!(
            re.section_params(0).unwrap(),
            cfg.section_params(0).unwrap()
        );
        for i in 1..3 {
            assert_eq!(
                re.section_params(i).unwrap(),
                cfg.section_params(i).unwrap() + table
            );
        }
        assert!(!re.section(0).unwrap().reembed && re.section(2).unwrap().reembed);
        // The tables are lookups: no training FLOPs.
        assert_eq!(re.train_flops_per_token(64), cfg.train_flops_per_token(64));
        let bad = ModelConfig {
            reembed_scale: Some(f64::NAN),
            ..re
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("reembed_scale")
        );
    }
}
