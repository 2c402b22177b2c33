//! Using a trained model: loading its sections from a checkpoint, running them in sequence
//! (head, bodies, tail, through the wire codec and the learned bottlenecks exactly as
//! training does), sampling text, and measuring held-out loss and multiple-choice accuracy.
//!
//! # Layout
//! - [`load`]: [`Weights`], every section's parameters read from an `iota train` checkpoint
//!   or from a folder of section checkpoints (the network's merged state).
//! - [`chain`]: [`Chain`], the sections as one graph-free model: logits, losses,
//!   log-probabilities.
//! - [`sample`]: [`Sampler`], greedy, temperature and nucleus (top-p) sampling from a seed.
//! - [`stream`]: [`TextStream`], generated ids to printable text as they come.
//! - [`generate`]: the autoregressive loop.
//! - [`eval`]: held-out loss and perplexity over a dataset's evaluation windows.
//! - [`task`]: multiple-choice questions scored by log-likelihood.
//! - [`export`]: the model in the layout Hugging Face `transformers` loads.
//!
//! Generation keeps a key/value cache per block ([`Chain::extend`]) while the text fits the
//! model's trained context and the boundary encoding works value by value (`f32`, `bf16`);
//! past the context, or with `int8` boundaries, each token reruns the whole context.

pub mod chain;
pub mod eval;
pub mod export;
pub mod generate;
pub mod load;
pub mod sample;
pub mod stream;
pub mod task;

pub use chain::Chain;
pub use load::Weights;
pub use sample::Sampler;
pub use stream::TextStream;

use std::path::PathBuf;

use crate::data::DataError;
use crate::model::ModelError;

/// Why a trained model could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum InferError {
    /// The place named holds no checkpoint of any known kind.
    #[error("no checkpoint in {path}: {what}")]
    NoCheckpoint {
        /// Where it was looked for.
        path: PathBuf,
        /// What was expected there.
        what: String,
    },
    /// One section's checkpoint is absent.
    #[error("section {section} has no checkpoint: {path} is missing")]
    MissingSection {
        /// The section.
        section: usize,
        /// The file expected.
        path: PathBuf,
    },
    /// The weights do not fit the model config they are read with.
    #[error("wrong model config: {0}")]
    WrongConfig(String),
    /// A file could not be read.
    #[error("reading {path}: {message}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A file or folder could not be written.
    #[error("writing {path}: {message}")]
    Write {
        /// The file or folder.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A setting or input that cannot be used (empty prompt, temperature below 0, ...).
    #[error("{0}")]
    BadInput(String),
    /// The model core failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Tokenizing or reading data failed.
    #[error(transparent)]
    Data(#[from] DataError),
}
