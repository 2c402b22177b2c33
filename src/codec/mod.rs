//! The byte formats shared by every part of the network: how a boundary tensor, a payload hash
//! and a section's flat state look on the wire.
//!
//! - [`tensor`]: the wire codec of boundary tensors (activations and gradients passed between
//!   pipeline sections) in f32, bf16 or int8 with a scale per block of rows, validated
//!   strictly on decode.
//! - [`hash`]: BLAKE3 payload hashes that producers report and consumers check.
//! - [`flat`]: [`FlatLayout`], the flat `f32` vector a section's parameters and optimizer
//!   moments travel as (uploads, merge partitions, checkpoints).
//! - [`merge_wire`]: [`MergeWire`], the element format (f32, bf16, block int8, or a compressed
//!   change from the previous global state) of merge uploads and partitions, validated
//!   strictly on decode; [`merge_delta`] holds its `dct` and `sign` formats, whose parameter
//!   codes live in `dct_basis` and `sign_code`, with `bit_pack` packing their small codes.
//! - [`token_ids`]: token ids (`[batch, seq]`) in 1, 2 or 4 bytes each, by vocabulary size.
//!
//! It depends on nothing else in the crate, so the model core, the merge, storage and the API
//! can all use it without depending on each other.

mod bit_pack;
mod dct_basis;
pub mod flat;
pub mod hash;
pub mod merge_delta;
pub mod merge_wire;
mod sign_code;
pub mod tensor;
pub mod token_ids;

pub use flat::{
    FlatLayout, FlatParts, FlatTensor, LayoutError, f32_from_le_bytes, f32_to_le_bytes,
};
pub use hash::{f32_hash, f32_payload_hash, payload_hash, verify_hash};
pub use merge_delta::{DeltaError, DeltaSpec, ParamCode};
pub use merge_wire::{ErrorFeedback, INT8_BLOCK, MergeWire, MergeWireError, Span};
pub use tensor::{
    CodecError, WireDtype, WireTensor, decode, decode_expecting, encode, encoded_len,
};
