//! Subtensor's wire formats, built from its runtime metadata: the calls a miner and a validator
//! send, the commit-reveal v2 hash, the SDK's weight quantisation and a signed extrinsic.
//!
//! Nothing here talks to a node. Everything is pure functions over bytes, checked in
//! `tests/chain_encoding.rs` against an encoder iota did not write (the Bittensor Python SDK and
//! its SCALE codec), from the same recorded metadata (`tests/chain/metadata/`).
//!
//! - [`metadata`]: the runtime metadata, decoded, and the check that every call, storage item
//!   and runtime API iota uses is there with the argument types iota encodes.
//! - [`calls`]: `SubtensorModule` call data (`burned_register`, `set_weights`,
//!   `commit_weights`, `reveal_weights`), encoded against the metadata's types.
//! - [`commit`]: the v2 commit hash and the SDK's f32 -> u16 weight conversion.
//! - [`extrinsic`]: a signed (sr25519) extrinsic with the metadata's transaction extensions.

pub mod calls;
pub mod commit;
pub mod extrinsic;
pub mod metadata;
pub mod node;
pub mod rpc;
pub mod storage;

use thiserror::Error;

/// Why subtensor bytes could not be made. Each message is one line that says what to do.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SubtensorError {
    /// The metadata bytes are not runtime metadata this module reads.
    #[error("runtime metadata unreadable: {reason}")]
    Metadata {
        /// What is wrong with it.
        reason: String,
    },
    /// The runtime has no such pallet, call, storage item or runtime API.
    #[error(
        "the runtime has no {what} `{name}`: the chain's runtime was upgraded or is not subtensor; update iota"
    )]
    Missing {
        /// What kind of item ("call", "storage item", "runtime API method").
        what: &'static str,
        /// Its qualified name (`Pallet.item`).
        name: String,
    },
    /// An item exists but its arguments are not those iota encodes.
    #[error(
        "the runtime changed `{name}`: iota encodes {expected}, the runtime has {found}; update iota"
    )]
    Changed {
        /// The item's qualified name.
        name: String,
        /// What iota encodes.
        expected: String,
        /// What the metadata says.
        found: String,
    },
    /// A value did not fit the type the metadata gives it.
    #[error("cannot encode {what}: {reason}")]
    Encode {
        /// What was being encoded.
        what: String,
        /// The encoder's reason.
        reason: String,
    },
    /// The runtime asks for a transaction extension iota does not know how to fill in.
    #[error(
        "the runtime requires transaction extension `{identifier}`, which iota does not know how to fill in; update iota"
    )]
    UnknownExtension {
        /// The extension's identifier in the metadata.
        identifier: String,
    },
    /// Weights that cannot be set on chain.
    #[error("invalid weights: {reason}")]
    Weights {
        /// What is wrong with them.
        reason: String,
    },
}

/// The recorded metadata the unit tests encode against (see `tests/chain/metadata/README.md`).
#[cfg(test)]
pub(crate) fn recorded_metadata() -> metadata::Metadata {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/chain/metadata/subtensor-spec461-v15.scale"
    );
    metadata::Metadata::decode(&std::fs::read(path).expect("the recorded metadata file"))
        .expect("the recorded metadata decodes")
}
