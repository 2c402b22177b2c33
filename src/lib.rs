//! iota: an incentivized, orchestrated network for pretraining one large language model
//! across many unreliable machines, each of which holds only a section of it.
//!
//! # Layout
//! - [`api`]: wire types of the orchestrator HTTP API, shared by server and clients.
//! - [`cmd`]: one file per subcommand of the `iota` binary (argument parsing, wiring, progress UI).
//! - [`model`]: the burn Llama-style model, split into sections joined by learned bottlenecks;
//!   the section training API, optimizer, schedules and checkpoints.
//! - [`data`]: tokenizers, text sources, the synthetic corpus and deterministic sample windows.
//! - [`codec`]: byte formats shared by everyone: the tensor wire codec, payload hashes, the flat
//!   state layout. Depends on nothing else in the crate.
//! - [`storage`]: object storage (local directory or S3), keys, presigned-URL transfers.
//! - [`mirror`]: copies data shards from a bucket or an HTTP(S) URL into a local folder.
//! - [`wallet`]: sr25519 hotkeys, Bittensor wallet files and request signing.
//! - [`chain`]: the chain hotkeys register on, behind a trait (local registry; Bittensor
//!   networks refused with what to run instead).
//! - [`orchestrator`]: the server of the network: run config, SQLite state, routing, HTTP API.
//! - [`compute`]: shared ground below the roles: the section compute engine, the forward-input
//!   cache and payload download checks, which miners run and validators replay.
//! - [`infer`]: using a trained model: its sections loaded from a checkpoint and run in
//!   sequence to sample text (`iota generate`) and measure loss or task accuracy (`iota eval`).
//! - [`merge`]: merge operators and the butterfly partition plan over flat `f32` buffers.
//! - [`miner`]: the miner loop serving one section for an orchestrator (`iota mine`).
//! - [`validator`]: replay checks, CLASP, copy detection, scores and weights (`iota validate`).
//!
//! Dependencies point one way: `cmd` uses everything; the roles (`orchestrator`, `miner`,
//! `validator`) never import each other and share `compute` below them; `model` knows nothing
//! of networks; `merge`, `storage` and `wallet` know nothing of burn.
#![warn(missing_docs)]

pub mod api;
pub mod chain;
pub mod cmd;
pub mod codec;
pub mod compute;
pub mod data;
pub mod infer;
pub mod merge;
pub mod miner;
pub mod mirror;
pub mod model;
pub mod orchestrator;
pub mod storage;
pub mod validator;
pub mod wallet;
