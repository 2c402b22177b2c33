//! The model core: a Llama-style decoder in burn, split into pipeline sections joined by learned
//! residual bottlenecks, with the section training API that miners and `iota train` share.
//!
//! # Layout
//! - [`config`]: [`ModelConfig`], presets and section specs.
//! - [`init`]: deterministic initialisation keyed by parameter name.
//! - [`fused`]: fused CPU kernels with their own backward (SwiGLU's gated product).
//! - [`layers`], [`rope`], [`attention`], [`block`], [`bottleneck`]: the blocks, leaves first.
//! - [`section_model`]: the burn module of one section and the loss.
//! - [`params`]: parameters by global Llama-style name; export/import as flat tensors.
//! - [`optimizer`], [`schedule`]: AdamW with clipping, warmup + cosine learning rate.
//! - [`section`]: [`Section`], the forward/backward/step API with non-finite protection.
//! - [`pipeline`]: all sections chained in one process through the wire codec.
//! - [`replica_merge`]: the network's merge through a merge format, over replicas in one
//!   process.
//! - [`checkpoint`]: safetensors checkpoints with a JSON sidecar.
//! - [`backend`]: run-time choice among the compiled-in burn backends.

pub mod ablation;
pub mod attention;
pub mod backend;
pub mod block;
pub mod bottleneck;
pub mod checkpoint;
pub mod config;
pub mod fused;
pub mod init;
pub mod layers;
pub mod layout;
pub mod optimizer;
pub mod params;
pub mod pipeline;
pub mod replica_merge;
pub mod rope;
pub mod schedule;
pub mod section;
pub mod section_model;

pub use config::{DecoderKind, ModelConfig, SectionSpec};
pub use optimizer::OptimizerConfig;
pub use params::NamedTensor;
pub use schedule::LrSchedule;
pub use section::{Retained, Section, SectionStats, StepOutcome};
pub use section_model::{SectionInput, SectionModel, bridge_weight};

/// Errors of the model core.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// No preset has this name.
    #[error("unknown model preset `{name}` (known: {known})")]
    UnknownPreset {
        /// The name asked for.
        name: String,
        /// The presets that exist.
        known: String,
    },
    /// A configuration value is out of range or inconsistent.
    #[error("invalid model config: {0}")]
    Invalid(String),
    /// A tensor has the wrong kind or shape for this section.
    #[error("shape error: {0}")]
    Shape(String),
    /// Parameters or optimizer state could not be imported.
    #[error("parameters: {0}")]
    Params(String),
    /// The loss was NaN or infinite; the micro-batch was not used.
    #[error("non-finite loss ({0}); the micro-batch was dropped and the next step will be skipped")]
    NonFiniteLoss(f32),
    /// A boundary tensor could not be encoded or decoded.
    #[error("wire codec: {0}")]
    Codec(#[from] crate::codec::CodecError),
    /// A checkpoint could not be written or read.
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The file involved.
        path: String,
        /// What went wrong.
        message: String,
    },
}

/// A float tensor's values as `f32`, whatever the backend's float type (a bf16 backend's
/// values are widened; an f32 tensor's are moved, not copied).
///
/// # Errors
/// When burn cannot read the values as `f32` (a quantized tensor); the message names the dtype.
pub fn host_f32(data: burn::tensor::TensorData) -> Result<Vec<f32>, ModelError> {
    let dtype = data.dtype;
    data.convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| ModelError::Shape(format!("reading a {dtype:?} tensor as f32: {e:?}")))
}

/// A float tensor's values as `f32` in row-major order, on any backend: a copy of the array
/// on the CPU backend ([`fused::cpu_values`]), burn's `into_data` elsewhere ([`host_f32`]).
///
/// # Errors
/// As [`host_f32`].
pub fn host_values<B: burn::tensor::backend::Backend, const D: usize>(
    tensor: burn::tensor::Tensor<B, D>,
) -> Result<Vec<f32>, ModelError> {
    match fused::cpu_values(tensor) {
        Ok(values) => Ok(values),
        Err(tensor) => host_f32(tensor.into_data()),
    }
}

/// The CPU backend used by unit tests.
#[cfg(test)]
pub type TestBackend = burn::backend::NdArray<f32>;
/// The CPU autodiff backend used by unit tests.
#[cfg(test)]
pub type TestAutodiff = burn::backend::Autodiff<TestBackend>;
