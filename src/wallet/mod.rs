//! Identity: sr25519 hotkeys, SS58 addresses, Bittensor wallet files and request signing.
//!
//! - [`keys`]: [`Hotkey`], derived from a BIP-39 phrase exactly as Substrate and btcli do.
//! - [`ss58`]: [`Ss58Address`], parsed and validated (checksum, prefix 42, length).
//! - [`files`]: the `~/.bittensor/wallets/<wallet>/hotkeys/<hotkey>` layout, read and written
//!   so that existing Bittensor wallets work unchanged, and the wallet's coldkey, read.
//! - [`encrypted`]: btcli's encrypted keyfile formats told apart, and `$NACL` decrypted.
//! - [`signing`]: the signed-request headers every mutating API call carries.
//!
//! Everything here is pure Rust over bytes and files; nothing talks to a network or a chain.

pub mod encrypted;
pub mod files;
pub mod keys;
pub mod signing;
pub mod ss58;

pub use encrypted::{DecryptError, KeyfileFormat};
pub use files::{WalletDir, WalletFileError};
pub use keys::{DEV_PHRASE, Hotkey, KeyError, Sr25519Signature};
pub use signing::{
    RequestLine, SignatureError, SignedHeaders, sign_request, signature_id, verify_request,
};
pub use ss58::{Ss58Address, Ss58Error};
