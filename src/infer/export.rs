//! A trained model in the layout Hugging Face tools read: `config.json`, the weights as
//! `model.safetensors`, the tokenizer as `tokenizer.json` + `tokenizer_config.json`, and,
//! where plain Llama cannot express the model, the Python model code that can.
//!
//! # Format
//! ```text
//! OUT/config.json             the model's shape; `model_type` llama or iota
//! OUT/model.safetensors       every parameter, f32, under iota's (Llama's) names
//! OUT/tokenizer.json          the tokenizer (see Tokenizer::hf_json)
//! OUT/tokenizer_config.json   PreTrainedTokenizerFast, no special tokens added to a text
//! OUT/configuration_iota.py   IotaConfig        } only for `iota` models, loaded with
//! OUT/modeling_iota.py        IotaForCausalLM   } trust_remote_code=True (config `auto_map`)
//! ```
//! A model is plain `LlamaForCausalLM` when nothing happens at its section boundaries: one
//! section, or boundaries without bottleneck or re-embedding that cross as `f32`. Otherwise
//! it is `IotaForCausalLM`, which applies each boundary as [`super::Chain`] does: the
//! bottleneck's encoder and decoder with their identity path, the wire format's rounding
//! (`bf16`: to bf16 and back; `f32`: none) and the re-embedded token ids. `int8` boundaries
//! are refused: their rounding depends on which positions cross together.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{InferError, Weights};
use crate::codec::WireDtype;
use crate::data::Tokenizer;
use crate::model::checkpoint::write_safetensors_of;
use crate::model::{ModelConfig, NamedTensor};

/// File name of the model config.
pub const CONFIG_FILE: &str = "config.json";
/// File name of the weights.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// File name of the tokenizer.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// File name of the tokenizer's settings.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// File name of the config class of `iota` models.
pub const CONFIGURATION_FILE: &str = "configuration_iota.py";
/// File name of the model code of `iota` models.
pub const MODELING_FILE: &str = "modeling_iota.py";

/// The config class of `iota` models, written beside their weights.
const CONFIGURATION_PY: &str = include_str!("export/configuration_iota.py");
/// The model code of `iota` models, written beside their weights.
const MODELING_PY: &str = include_str!("export/modeling_iota.py");

/// The Python class that runs an exported model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// `transformers`' own `LlamaForCausalLM`: no boundary changes anything.
    Llama,
    /// `IotaForCausalLM` from the exported `modeling_iota.py` (`trust_remote_code=True`).
    Iota,
}

impl Architecture {
    /// The architecture that runs `model` with boundaries crossing as `wire` exactly.
    pub fn of(model: &ModelConfig, wire: WireDtype) -> Self {
        let plain_boundaries = !model.bottleneck && !model.reembed && wire == WireDtype::F32;
        if model.n_sections() == 1 || plain_boundaries {
            Self::Llama
        } else {
            Self::Iota
        }
    }

    /// The class name in `config.json`'s `architectures`.
    pub fn class(self) -> &'static str {
        match self {
            Self::Llama => "LlamaForCausalLM",
            Self::Iota => "IotaForCausalLM",
        }
    }
}

/// What [`export_hf`] wrote.
#[derive(Debug, Clone)]
pub struct HfExport {
    /// The folder written.
    pub dir: PathBuf,
    /// The class that loads it.
    pub architecture: Architecture,
    /// Files written, by name.
    pub files: Vec<&'static str>,
    /// Parameters written.
    pub params: usize,
    /// What a user of the export should know (the tokenizer's post-processor dropped, ...).
    pub notes: Vec<String>,
}

/// Writes `weights`, trained with `tokenizer` and boundaries crossing as `wire`, to `out` in
/// the Hugging Face layout (see the module's `# Format`), creating the folder; files of the
/// same names in it are replaced. Everything is checked and built before anything is
/// written.
///
/// # Errors
/// [`InferError::BadInput`] for `int8` boundaries (a model of one section has none), a
/// tokenizer larger than the model's vocabulary or `out` naming a file;
/// [`InferError::WrongConfig`] for weights that do not fit their config;
/// [`InferError::Write`] (naming the file) when writing fails.
pub fn export_hf(
    weights: &Weights,
    tokenizer: &Tokenizer,
    wire: WireDtype,
    out: &Path,
) -> Result<HfExport, InferError> {
    let model = &weights.model;
    model.validate()?;
    if wire == WireDtype::Int8 && model.n_sections() > 1 {
        return Err(InferError::BadInput(
            "int8 boundaries cannot be exported: their rounding shares one scale among the \
             positions that cross together, which a Hugging Face model cannot reproduce \
             (export a model trained with --wire bf16 or f32)"
                .into(),
        ));
    }
    if tokenizer.vocab_size() > model.vocab_size {
        return Err(InferError::BadInput(format!(
            "the tokenizer has {} tokens but the model's vocabulary holds {}",
            tokenizer.vocab_size(),
            model.vocab_size
        )));
    }
    if out.exists() && !out.is_dir() {
        return Err(InferError::BadInput(format!(
            "--hf {}: a file is in the way of the output folder",
            out.display()
        )));
    }
    let tensors = all_tensors(weights)?;
    let architecture = Architecture::of(model, wire);
    let config = config_json(model, wire, architecture, tokenizer.end_of_text());
    let tokenizer_json = tokenizer.hf_json()?;
    let tokenizer_config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": weights.context,
        "add_bos_token": false,
        "add_eos_token": false,
        "clean_up_tokenization_spaces": false,
    });
    let mut notes = Vec::new();
    if tokenizer.drops_post_processor() {
        notes.push(
            "the tokenizer's post-processor is left out: iota adds no special tokens to a text"
                .to_string(),
        );
    }
    if tokenizer.is_byte() {
        notes.push(
            "the byte tokenizer declares no special tokens (byte 0 ends a text: \
             eos_token_id 0 in config.json)"
                .to_string(),
        );
    }

    std::fs::create_dir_all(out).map_err(|e| write_error(out, e))?;
    let mut files = vec![CONFIG_FILE];
    write_text(out, CONFIG_FILE, &pretty(&config))?;
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors_of(
        &out.join(WEIGHTS_FILE),
        tensors.iter().copied(),
        Some(metadata),
    )?;
    files.push(WEIGHTS_FILE);
    write_text(out, TOKENIZER_FILE, &tokenizer_json)?;
    write_text(out, TOKENIZER_CONFIG_FILE, &pretty(&tokenizer_config))?;
    files.extend([TOKENIZER_FILE, TOKENIZER_CONFIG_FILE]);
    if architecture == Architecture::Iota {
        write_text(out, CONFIGURATION_FILE, CONFIGURATION_PY)?;
        write_text(out, MODELING_FILE, MODELING_PY)?;
        files.extend([CONFIGURATION_FILE, MODELING_FILE]);
    }
    Ok(HfExport {
        dir: out.to_path_buf(),
        architecture,
        files,
        params: tensors.iter().map(|t| t.data.len()).sum(),
        notes,
    })
}

/// Every section's tensors in one list (borrowed, not copied), by name; each name once.
fn all_tensors(weights: &Weights) -> Result<Vec<&NamedTensor>, InferError> {
    if weights.sections.len() != weights.model.n_sections() {
        return Err(InferError::WrongConfig(format!(
            "{} sections of weights for a config of {}",
            weights.sections.len(),
            weights.model.n_sections()
        )));
    }
    let mut all: Vec<&NamedTensor> = weights.sections.iter().flatten().collect();
    all.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(pair) = all.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(InferError::WrongConfig(format!(
            "tensor `{}` is held by two sections",
            pair[0].name
        )));
    }
    if let Some(t) = all.iter().find(|t| t.data.iter().any(|v| !v.is_finite())) {
        return Err(InferError::WrongConfig(format!(
            "tensor `{}` holds a value that is not finite",
            t.name
        )));
    }
    Ok(all)
}

/// `config.json`: Llama's keys (so tools that read them see the model's shape), and for
/// `iota` models the boundaries and the classes to load.
fn config_json(
    model: &ModelConfig,
    wire: WireDtype,
    architecture: Architecture,
    end_of_text: Option<u32>,
) -> Value {
    let mut config = json!({
        "architectures": [architecture.class()],
        "vocab_size": model.vocab_size,
        "hidden_size": model.d_model,
        "intermediate_size": model.d_ff,
        "num_hidden_layers": model.n_layers,
        "num_attention_heads": model.n_heads,
        "num_key_value_heads": model.n_kv_heads,
        "head_dim": model.head_dim(),
        "hidden_act": "silu",
        "max_position_embeddings": model.max_seq_len,
        "rms_norm_eps": model.norm_eps,
        "rope_theta": model.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": model.rope_theta},
        "attention_bias": false,
        "attention_dropout": 0.0,
        "mlp_bias": false,
        "tie_word_embeddings": false,
        "initializer_range": model.init_std,
        "bos_token_id": null,
        "eos_token_id": end_of_text,
        "pad_token_id": null,
        "dtype": "float32",
        "use_cache": true,
    });
    let extra = match architecture {
        Architecture::Llama => json!({"model_type": "llama"}),
        Architecture::Iota => json!({
            "model_type": "iota",
            "auto_map": {
                "AutoConfig": "configuration_iota.IotaConfig",
                "AutoModelForCausalLM": "modeling_iota.IotaForCausalLM",
            },
            "sections": model.sections,
            "bottleneck": model.bottleneck,
            "bottleneck_width": model.boundary_width(),
            "bottleneck_decoder": model.bottleneck_decoder.name(),
            "reembed": model.reembed,
            "reembed_scale": model.reembed_scale(),
            "wire": wire.name(),
        }),
    };
    if let (Value::Object(config), Value::Object(extra)) = (&mut config, extra) {
        config.extend(extra);
    }
    config
}

fn pretty(value: &Value) -> String {
    // Serializing a `Value` cannot fail.
    serde_json::to_string_pretty(value).unwrap_or_default() + "\n"
}

fn write_error(path: &Path, e: std::io::Error) -> InferError {
    InferError::Write {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Writes `text` to `dir/name` through a temporary name, so a failed write leaves no
/// half-written file under the real one.
fn write_text(dir: &Path, name: &str, text: &str) -> Result<(), InferError> {
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, text).map_err(|e| write_error(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| write_error(&path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer::chain::tests::initial_weights;

    fn tiny() -> ModelConfig {
        ModelConfig::preset("tiny").unwrap()
    }

    #[test]
    fn plain_llama_only_where_no_boundary_changes_anything() {
        let t = tiny();
        assert_eq!(Architecture::of(&t, WireDtype::F32), Architecture::Iota);
        let one = ModelConfig {
            sections: vec![[0, t.n_layers]],
            ..t.clone()
        };
        assert_eq!(Architecture::of(&one, WireDtype::Bf16), Architecture::Llama);
        let open = ModelConfig {
            bottleneck: false,
            reembed: false,
            ..t.clone()
        };
        assert_eq!(Architecture::of(&open, WireDtype::F32), Architecture::Llama);
        assert_eq!(Architecture::of(&open, WireDtype::Bf16), Architecture::Iota);
        let reembed = ModelConfig {
            bottleneck: false,
            reembed: true,
            ..t
        };
        assert_eq!(
            Architecture::of(&reembed, WireDtype::F32),
            Architecture::Iota
        );
    }

    #[test]
    fn the_folder_holds_the_config_weights_tokenizer_and_code() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("hf");
        let weights = initial_weights(&tiny(), 3);
        let done = export_hf(&weights, &Tokenizer::byte(), WireDtype::Bf16, &out).unwrap();
        assert_eq!(done.architecture, Architecture::Iota);
        assert_eq!(done.params, tiny().total_params());
        for file in &done.files {
            assert!(out.join(file).is_file(), "{file}");
        }
        let config: Value =
            serde_json::from_slice(&std::fs::read(out.join(CONFIG_FILE)).unwrap()).unwrap();
        assert_eq!(config["model_type"], "iota");
        assert_eq!(config["wire"], "bf16");
        assert_eq!(config["eos_token_id"], 0);
        assert_eq!(config["sections"], json!([[0, 2], [2, 4], [4, 6]]));
        let written = crate::model::checkpoint::read_safetensors(&out.join(WEIGHTS_FILE)).unwrap();
        let mut want: Vec<NamedTensor> = all_tensors(&weights)
            .unwrap()
            .into_iter()
            .cloned()
            .collect();
        want.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(written, want);
    }

    #[test]
    fn int8_and_a_file_in_the_way_are_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("hf");
        let weights = initial_weights(&tiny(), 3);
        let err = export_hf(&weights, &Tokenizer::byte(), WireDtype::Int8, &out).unwrap_err();
        assert!(err.to_string().contains("int8"), "{err}");
        assert!(!out.exists());
        std::fs::write(&out, "x").unwrap();
        let err = export_hf(&weights, &Tokenizer::byte(), WireDtype::F32, &out).unwrap_err();
        assert!(matches!(err, InferError::BadInput(_)), "{err}");
    }
}
