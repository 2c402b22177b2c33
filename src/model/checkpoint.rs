//! Checkpoints: the weights as one safetensors file with Llama-style tensor names (loadable by
//! common tooling), the optimizer moments as a second safetensors file, and a small JSON
//! sidecar with the config, step and data position needed to resume exactly.
//!
//! # Format
//! ```text
//! DIR/model.safetensors      every parameter, f32, e.g. model.layers.0.self_attn.q_proj.weight
//! DIR/optimizer.safetensors  {param}.exp_avg and {param}.exp_avg_sq per parameter, f32
//! DIR/checkpoint.json        CheckpointMeta (config, step, next sample id, seeds, tokenizer)
//! ```
//! Files are written to temporary names and renamed into place, sidecar last, so a crash
//! mid-save leaves the previous checkpoint readable.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::{Deserialize, Serialize};

use super::ModelError;
use super::config::ModelConfig;
use super::optimizer::OptimizerConfig;
use super::params::NamedTensor;
use super::schedule::LrSchedule;
use super::section::SectionStats;

/// File name of the weights.
pub const MODEL_FILE: &str = "model.safetensors";
/// File name of the optimizer moments.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// File name of the sidecar.
pub const META_FILE: &str = "checkpoint.json";
/// Version of this layout.
pub const FORMAT_VERSION: u32 = 1;

/// Per-section state saved beside the tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SectionMeta {
    /// Section index.
    pub index: usize,
    /// Optimizer updates applied in this section.
    pub optimizer_step: u64,
    /// Counters at save time.
    pub stats: SectionStats,
}

/// The sidecar: everything besides tensors that a resume needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// Layout version ([`FORMAT_VERSION`]).
    pub format: u32,
    /// The model.
    pub model: ModelConfig,
    /// Training steps (batches) completed.
    pub step: u64,
    /// Id of the next training sample to draw (the data position).
    pub next_sample: u64,
    /// Tokens per sample the run trained with.
    pub seq_len: usize,
    /// Samples per step the run trained with.
    pub batch_size: usize,
    /// Seed of the weight initialisation and of the data order.
    pub seed: u64,
    /// Fingerprint of the tokenizer the model was trained with.
    pub tokenizer: String,
    /// Inner optimizer hyper-parameters.
    pub optimizer: OptimizerConfig,
    /// Learning-rate schedule.
    pub schedule: LrSchedule,
    /// Per-section optimizer state besides the moments.
    pub sections: Vec<SectionMeta>,
    /// Free-form description of the data source.
    pub data: String,
}

/// A checkpoint read back from disk.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The sidecar.
    pub meta: CheckpointMeta,
    /// Every parameter.
    pub params: Vec<NamedTensor>,
    /// Optimizer moments.
    pub optimizer: Vec<NamedTensor>,
}

fn err(path: &Path, message: impl Into<String>) -> ModelError {
    ModelError::Checkpoint {
        path: path.display().to_string(),
        message: message.into(),
    }
}

/// Writes named f32 tensors as a safetensors file (atomically, through a temporary name).
/// The tensors are written from where they lie, one after the other, without a second copy
/// of the whole state in memory.
///
/// # Errors
/// I/O errors and inconsistent tensors (length not matching the shape).
pub fn write_safetensors(
    path: &Path,
    tensors: &[NamedTensor],
    metadata: Option<HashMap<String, String>>,
) -> Result<(), ModelError> {
    write_safetensors_of(path, tensors, metadata)
}

/// [`write_safetensors`] for tensors held anywhere (borrowed from several sections, say).
///
/// # Errors
/// As [`write_safetensors`].
pub fn write_safetensors_of<'a>(
    path: &Path,
    tensors: impl IntoIterator<Item = &'a NamedTensor>,
    metadata: Option<HashMap<String, String>>,
) -> Result<(), ModelError> {
    let views = tensors
        .into_iter()
        .map(|t| {
            let expected: usize = t.shape.iter().product();
            if expected == t.data.len() {
                Ok((t.name.clone(), F32View(t)))
            } else {
                Err(err(
                    path,
                    format!(
                        "tensor `{}`: {} values for shape {:?}",
                        t.name,
                        t.data.len(),
                        t.shape
                    ),
                ))
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let tmp = tmp_path(path);
    safetensors::serialize_to_file(views, metadata, &tmp).map_err(|e| err(path, e.to_string()))?;
    fs::rename(&tmp, path).map_err(|e| err(path, e.to_string()))
}

/// A tensor as safetensors writes it: its f32 values as little-endian bytes, borrowed where
/// the machine is little-endian, so the writer streams each tensor from the state itself.
struct F32View<'a>(&'a NamedTensor);

impl safetensors::View for F32View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        &self.0.shape
    }

    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        if cfg!(target_endian = "little") {
            std::borrow::Cow::Borrowed(bytemuck::cast_slice(&self.0.data))
        } else {
            std::borrow::Cow::Owned(self.0.data.iter().flat_map(|v| v.to_le_bytes()).collect())
        }
    }

    fn data_len(&self) -> usize {
        self.0.data.len() * 4
    }
}

/// Reads every tensor of a safetensors file as f32 (F32, BF16 and F16 are accepted), in
/// name order.
///
/// # Errors
/// Missing or unreadable file, a corrupt header or payload, or an unsupported dtype.
pub fn read_safetensors(path: &Path) -> Result<Vec<NamedTensor>, ModelError> {
    let bytes = fs::read(path).map_err(|e| err(path, e.to_string()))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| err(path, format!("corrupt safetensors file: {e}")))?;
    let mut names: Vec<&str> = st.names();
    names.sort_unstable();
    names
        .into_iter()
        .map(|name| {
            let view = st.tensor(name).map_err(|e| err(path, e.to_string()))?;
            let data =
                view_to_f32(&view).map_err(|m| err(path, format!("tensor `{name}`: {m}")))?;
            Ok(NamedTensor {
                name: name.to_string(),
                shape: view.shape().to_vec(),
                data,
            })
        })
        .collect()
}

fn view_to_f32(view: &TensorView<'_>) -> Result<Vec<f32>, String> {
    let raw = view.data();
    let two = |f: fn([u8; 2]) -> f32| raw.chunks_exact(2).map(|c| f([c[0], c[1]])).collect();
    match view.dtype() {
        Dtype::F32 => crate::codec::f32_from_le_bytes(raw)
            .ok_or_else(|| format!("{} bytes are not a whole number of f32 values", raw.len())),
        Dtype::BF16 => Ok(two(|b| half::bf16::from_le_bytes(b).to_f32())),
        Dtype::F16 => Ok(two(|b| half::f16::from_le_bytes(b).to_f32())),
        other => Err(format!(
            "unsupported dtype {other:?} (expected F32, BF16 or F16)"
        )),
    }
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Saves a checkpoint into `dir` (created if needed).
///
/// # Errors
/// I/O errors.
pub fn save(
    dir: &Path,
    meta: &CheckpointMeta,
    params: &[NamedTensor],
    optimizer: &[NamedTensor],
) -> Result<(), ModelError> {
    fs::create_dir_all(dir).map_err(|e| err(dir, e.to_string()))?;
    let info = HashMap::from([
        ("format".to_string(), "iota".to_string()),
        ("step".to_string(), meta.step.to_string()),
    ]);
    write_safetensors(&dir.join(MODEL_FILE), params, Some(info))?;
    write_safetensors(&dir.join(OPTIMIZER_FILE), optimizer, None)?;
    let meta_path = dir.join(META_FILE);
    let json = serde_json::to_vec_pretty(meta).map_err(|e| err(&meta_path, e.to_string()))?;
    let tmp = tmp_path(&meta_path);
    fs::write(&tmp, json).map_err(|e| err(&meta_path, e.to_string()))?;
    fs::rename(&tmp, &meta_path).map_err(|e| err(&meta_path, e.to_string()))
}

/// Whether `dir` holds a checkpoint sidecar.
pub fn exists(dir: &Path) -> bool {
    dir.join(META_FILE).is_file()
}

/// Loads a checkpoint saved by [`save`].
///
/// # Errors
/// Missing files, corrupt JSON or safetensors, an unknown format version, or an invalid
/// model config.
pub fn load(dir: &Path) -> Result<Checkpoint, ModelError> {
    let (meta, params) = load_weights(dir)?;
    Ok(Checkpoint {
        params,
        optimizer: read_safetensors(&dir.join(OPTIMIZER_FILE))?,
        meta,
    })
}

/// Loads the sidecar and the weights of a checkpoint saved by [`save`], without the
/// optimizer moments (all that using the model needs).
///
/// # Errors
/// As [`load`].
pub fn load_weights(dir: &Path) -> Result<(CheckpointMeta, Vec<NamedTensor>), ModelError> {
    let meta_path = dir.join(META_FILE);
    let json = fs::read(&meta_path).map_err(|e| err(&meta_path, e.to_string()))?;
    let meta: CheckpointMeta = serde_json::from_slice(&json)
        .map_err(|e| err(&meta_path, format!("corrupt sidecar: {e}")))?;
    if meta.format != FORMAT_VERSION {
        return Err(err(
            &meta_path,
            format!(
                "format version {} is not supported (expected {FORMAT_VERSION})",
                meta.format
            ),
        ));
    }
    meta.model.validate()?;
    let params = read_safetensors(&dir.join(MODEL_FILE))?;
    Ok((meta, params))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> CheckpointMeta {
        CheckpointMeta {
            format: FORMAT_VERSION,
            model: ModelConfig::preset("tiny").unwrap(),
            step: 7,
            next_sample: 56,
            seq_len: 32,
            batch_size: 8,
            seed: 3,
            tokenizer: "byte".into(),
            optimizer: OptimizerConfig::default(),
            schedule: LrSchedule::default(),
            sections: vec![],
            data: "synthetic".into(),
        }
    }

    fn tensors() -> Vec<NamedTensor> {
        vec![
            NamedTensor {
                name: "a.weight".into(),
                shape: vec![2, 3],
                // Values whose bits must survive: subnormal, negative zero, extremes.
                data: vec![1.0e-40, -0.0, f32::MAX, f32::MIN_POSITIVE, -1.5, 0.1],
            },
            NamedTensor {
                name: "b".into(),
                shape: vec![1],
                data: vec![42.0],
            },
        ]
    }

    #[test]
    fn round_trip_is_bit_exact() {
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), &meta(), &tensors(), &tensors()[1..]).unwrap();
        let back = load(dir.path()).unwrap();
        assert_eq!(back.meta, meta());
        for (a, b) in back.params.iter().zip(tensors()) {
            assert_eq!(a.name, b.name);
            assert_eq!(a.shape, b.shape);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a.data), bits(&b.data));
        }
        assert_eq!(back.optimizer, tensors()[1..].to_vec());
    }

    #[test]
    fn corrupt_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), &meta(), &tensors(), &[]).unwrap();
        let model = dir.path().join(MODEL_FILE);
        let bytes = fs::read(&model).unwrap();
        fs::write(&model, &bytes[..bytes.len() - 3]).unwrap();
        let err = load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("corrupt") && err.contains(MODEL_FILE), "{err}");
        fs::write(dir.path().join(META_FILE), b"{not json").unwrap();
        let err = load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("corrupt sidecar"), "{err}");
        let empty = tempfile::tempdir().unwrap();
        assert!(load(empty.path()).is_err());
    }
}
