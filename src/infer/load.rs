//! Every section's parameters, read from one of the two checkpoint layouts iota writes.
//!
//! # Format
//! ```text
//! DIR/checkpoint.json + DIR/model.safetensors      `iota train --out DIR` (config inside)
//! DIR/{section}/flat                                one epoch of the network's checkpoints:
//!                                                   little-endian f32 [params | moments]
//!                                                   per section, laid out as section_layout
//! DIR/{epoch}/{section}/flat                        every epoch; the newest complete one
//! ```
//! The network's checkpoints carry no model config: the run config supplies it.

use std::path::{Path, PathBuf};

use super::InferError;
use crate::codec::f32_from_le_bytes;
use crate::model::checkpoint;
use crate::model::layout::{param_shapes, section_layout};
use crate::model::{ModelConfig, NamedTensor};

/// File name of a section's flat state inside a section checkpoint folder.
pub const FLAT_FILE: &str = "flat";

/// A trained model's parameters, section by section.
#[derive(Debug, Clone)]
pub struct Weights {
    /// The model.
    pub model: ModelConfig,
    /// Parameters of each section (index = section), by global name.
    pub sections: Vec<Vec<NamedTensor>>,
    /// Fingerprint of the tokenizer the model was trained with, when recorded.
    pub tokenizer: Option<String>,
    /// Tokens per window the model was trained on: the longest context it has learned.
    pub context: usize,
    /// Where the weights came from, for messages.
    pub origin: String,
}

/// Reads an `iota train --out` checkpoint (the optimizer moments are not read).
///
/// # Errors
/// [`InferError::Model`] for missing or corrupt files; [`InferError::WrongConfig`] when the
/// weights lack a tensor of the config recorded beside them.
pub fn from_train_dir(dir: &Path) -> Result<Weights, InferError> {
    let (meta, params) = checkpoint::load_weights(dir)?;
    let mut sections = Vec::with_capacity(meta.model.n_sections());
    for index in 0..meta.model.n_sections() {
        let mut section = Vec::new();
        for (name, shape) in param_shapes(&meta.model, index)? {
            let tensor = params.iter().find(|t| t.name == name).ok_or_else(|| {
                InferError::WrongConfig(format!(
                    "{} has no tensor `{name}` (section {index} of the config in {})",
                    dir.join(checkpoint::MODEL_FILE).display(),
                    checkpoint::META_FILE
                ))
            })?;
            if tensor.shape != shape {
                return Err(InferError::WrongConfig(format!(
                    "tensor `{name}` has shape {:?}, the config says {shape:?}",
                    tensor.shape
                )));
            }
            section.push(tensor.clone());
        }
        sections.push(section);
    }
    Ok(Weights {
        context: meta.seq_len.min(meta.model.max_seq_len).max(1),
        model: meta.model,
        sections,
        tokenizer: Some(meta.tokenizer),
        origin: format!("{} (step {})", dir.display(), meta.step),
    })
}

/// Whether `dir` looks like a folder of section checkpoints: `0/flat` in it, or in one of
/// its numbered sub-folders (epochs).
pub fn holds_sections(dir: &Path) -> bool {
    dir.join("0").join(FLAT_FILE).is_file() || !epochs(dir).is_empty()
}

/// The numbered sub-folders of `dir` that hold a section 0 checkpoint, newest first.
fn epochs(dir: &Path) -> Vec<(u64, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(u64, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let n = e.file_name().to_str()?.parse::<u64>().ok()?;
            e.path()
                .join("0")
                .join(FLAT_FILE)
                .is_file()
                .then(|| (n, e.path()))
        })
        .collect();
    out.sort_by_key(|e| std::cmp::Reverse(e.0));
    out
}

/// Reads a folder of section checkpoints (one epoch's, or the newest epoch of a folder of
/// epochs) as sections of `model`; `context` is the run's tokens per window.
///
/// # Errors
/// [`InferError::NoCheckpoint`] when `dir` holds no section checkpoint;
/// [`InferError::MissingSection`] for an absent section; [`InferError::WrongConfig`] when a
/// section's values do not fit `model`; [`InferError::Read`] for unreadable files.
pub fn from_section_dir(
    dir: &Path,
    model: &ModelConfig,
    context: usize,
) -> Result<Weights, InferError> {
    let epoch_dir = if dir.join("0").join(FLAT_FILE).is_file() {
        dir.to_path_buf()
    } else {
        match epochs(dir).into_iter().next() {
            Some((_, path)) => path,
            None => {
                return Err(InferError::NoCheckpoint {
                    path: dir.to_path_buf(),
                    what: format!(
                        "expected section folders (0/{FLAT_FILE}, 1/{FLAT_FILE}, ...) or epoch \
                         folders holding them"
                    ),
                });
            }
        }
    };
    let sections = (0..model.n_sections())
        .map(|index| read_section(&epoch_dir, model, index))
        .collect::<Result<Vec<_>, _>>()?;
    let extra = epoch_dir.join(model.n_sections().to_string());
    if extra.join(FLAT_FILE).is_file() {
        return Err(InferError::WrongConfig(format!(
            "{} holds a section {} but the model config has {} sections",
            epoch_dir.display(),
            model.n_sections(),
            model.n_sections()
        )));
    }
    Ok(Weights {
        model: model.clone(),
        sections,
        tokenizer: None,
        context: context.min(model.max_seq_len).max(1),
        origin: epoch_dir.display().to_string(),
    })
}

fn read_section(
    dir: &Path,
    model: &ModelConfig,
    index: usize,
) -> Result<Vec<NamedTensor>, InferError> {
    let path = dir.join(index.to_string()).join(FLAT_FILE);
    if !path.is_file() {
        return Err(InferError::MissingSection {
            section: index,
            path,
        });
    }
    let bytes = std::fs::read(&path).map_err(|e| InferError::Read {
        path: path.clone(),
        message: e.to_string(),
    })?;
    section_from_flat(&bytes, model, index, &path.display().to_string())
}

/// Builds a model from each section's flat state, as the orchestrator stores it (the `flat`
/// file of a section checkpoint, in section order); `context` is the run's tokens per window
/// and `origin` names where the states came from, for messages.
///
/// # Errors
/// [`InferError::WrongConfig`] when the number of sections, or a section's values, do not fit
/// `model`; [`InferError::Read`] for a state that is not whole `f32` values.
pub fn from_section_flats(
    flats: &[impl AsRef<[u8]>],
    model: &ModelConfig,
    context: usize,
    origin: &str,
) -> Result<Weights, InferError> {
    if flats.len() != model.n_sections() {
        return Err(InferError::WrongConfig(format!(
            "{origin} holds {} sections but the model config has {}",
            flats.len(),
            model.n_sections()
        )));
    }
    let sections = flats
        .iter()
        .enumerate()
        .map(|(index, flat)| {
            section_from_flat(
                flat.as_ref(),
                model,
                index,
                &format!("{origin} section {index}"),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Weights {
        model: model.clone(),
        sections,
        tokenizer: None,
        context: context.min(model.max_seq_len).max(1),
        origin: origin.to_string(),
    })
}

/// One section's parameters out of its flat state; `what` names the state for messages.
fn section_from_flat(
    bytes: &[u8],
    model: &ModelConfig,
    index: usize,
    what: &str,
) -> Result<Vec<NamedTensor>, InferError> {
    let values = f32_from_le_bytes(bytes).ok_or_else(|| InferError::Read {
        path: what.into(),
        message: format!("{} bytes are not a whole number of f32 values", bytes.len()),
    })?;
    let layout = section_layout(model, index)?;
    if values.len() != layout.total_len() {
        return Err(InferError::WrongConfig(format!(
            "section {index}'s checkpoint {what} holds {} values, the model config expects {}",
            values.len(),
            layout.total_len()
        )));
    }
    let parts = layout
        .split(&values)
        .map_err(|e| InferError::WrongConfig(format!("section {index}: {e}")))?;
    Ok(parts
        .params
        .into_iter()
        .map(|(name, shape, data)| NamedTensor { name, shape, data })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> ModelConfig {
        ModelConfig::preset("tiny").unwrap()
    }

    /// Writes a zero flat state for every section of `model` under `dir`.
    fn write_sections(dir: &Path, model: &ModelConfig) {
        for i in 0..model.n_sections() {
            let len = section_layout(model, i).unwrap().total_len();
            std::fs::create_dir_all(dir.join(i.to_string())).unwrap();
            std::fs::write(
                dir.join(i.to_string()).join(FLAT_FILE),
                crate::codec::f32_to_le_bytes(&vec![0.5; len]),
            )
            .unwrap();
        }
    }

    #[test]
    fn the_newest_complete_epoch_is_read() {
        let dir = tempfile::tempdir().unwrap();
        write_sections(&dir.path().join("3"), &tiny());
        write_sections(&dir.path().join("12"), &tiny());
        let w = from_section_dir(dir.path(), &tiny(), 32).unwrap();
        assert!(w.origin.ends_with("12"), "{}", w.origin);
        assert_eq!(w.sections.len(), tiny().n_sections());
        assert_eq!(w.context, 32);
        let names: Vec<_> = param_shapes(&tiny(), 0).unwrap();
        assert_eq!(w.sections[0].len(), names.len());
    }

    #[test]
    fn a_missing_section_and_a_wrong_config_are_named() {
        let dir = tempfile::tempdir().unwrap();
        write_sections(dir.path(), &tiny());
        std::fs::remove_file(dir.path().join("1").join(FLAT_FILE)).unwrap();
        let err = from_section_dir(dir.path(), &tiny(), 32).unwrap_err();
        assert!(
            matches!(err, InferError::MissingSection { section: 1, .. }),
            "{err}"
        );
        write_sections(dir.path(), &tiny());
        let mut wider = tiny();
        wider.d_model *= 2;
        let err = from_section_dir(dir.path(), &wider, 32).unwrap_err();
        assert!(matches!(err, InferError::WrongConfig(_)), "{err}");
        let empty = tempfile::tempdir().unwrap();
        let err = from_section_dir(empty.path(), &tiny(), 32).unwrap_err();
        assert!(matches!(err, InferError::NoCheckpoint { .. }), "{err}");
    }
}
