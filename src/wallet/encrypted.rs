//! btcli's encrypted keyfiles: which format a keyfile is in, and the `$NACL` one decrypted.
//!
//! # Format
//!
//! ```text
//! $NACL <24-byte nonce> <16-byte Poly1305 tag> <ciphertext of the JSON keyfile>
//!
//! key    = Argon2i v1.3 (password, salt = NACL_SALT, 8 passes, 512 MiB, 1 lane, 32 bytes)
//! secret = XSalsa20-Poly1305 open (key, nonce, tag || ciphertext)   (NaCl crypto_secretbox)
//! ```
//!
//! That is what `bittensor-wallet` 4.x writes for a coldkey created with a password: libsodium's
//! `crypto_pwhash_argon2i` at `OPSLIMIT_SENSITIVE`/`MEMLIMIT_SENSITIVE` (8 and 512 MiB) with a
//! fixed salt, then `crypto_secretbox_easy` behind the `$NACL` prefix. Deriving the key costs
//! 512 MiB of memory and a few seconds, on purpose; a wrong password shows only as a failed
//! tag check, after that cost.
//!
//! btcli's two older formats, Ansible vault (`$ANSIBLE_VAULT`) and legacy Fernet (`gAAAAA`),
//! are recognised and refused: btcli itself re-encrypts them to `$NACL`.
//!
//! Nothing here reads or writes files; the password, the derived key and the plaintext live
//! in memory that is wiped when dropped.

use argon2::{Algorithm, Argon2, Params, Version};
use crypto_secretbox::aead::{AeadInPlace, KeyInit};
use crypto_secretbox::{Nonce, Tag, XSalsa20Poly1305};
use thiserror::Error;
use zeroize::Zeroizing;

/// The prefix of a `$NACL` keyfile.
pub const NACL_PREFIX: &[u8] = b"$NACL";

/// bittensor-wallet's fixed Argon2i salt for `$NACL` keyfiles.
const NACL_SALT: [u8; 16] = [
    0x13, 0x71, 0x83, 0xdf, 0xf1, 0x5a, 0x09, 0xbc, 0x9c, 0x90, 0xb5, 0x51, 0x87, 0x39, 0xe9, 0xb1,
];

/// libsodium's `crypto_pwhash_argon2i_OPSLIMIT_SENSITIVE`: Argon2 passes.
const NACL_PASSES: u32 = 8;

/// libsodium's `crypto_pwhash_argon2i_MEMLIMIT_SENSITIVE` (512 MiB), in 1 KiB Argon2 blocks.
const NACL_MEMORY_KIB: u32 = 512 * 1024;

/// XSalsa20 nonce length.
const NONCE_LEN: usize = 24;

/// Poly1305 tag length.
const TAG_LEN: usize = 16;

/// The shortest `$NACL` file: prefix, nonce and tag around an empty message.
const MIN_NACL_LEN: usize = NACL_PREFIX.len() + NONCE_LEN + TAG_LEN;

/// What a keyfile's first bytes say it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyfileFormat {
    /// Not encrypted (JSON, or anything else that is not a known encrypted format).
    Plain,
    /// `$NACL`: Argon2i and a NaCl secretbox, what btcli writes today.
    Nacl,
    /// `$ANSIBLE_VAULT`: an older btcli format, not read by iota.
    AnsibleVault,
    /// `gAAAAA`: btcli's oldest (Fernet) format, not read by iota.
    LegacyFernet,
}

impl KeyfileFormat {
    /// The format of keyfile `data` (leading whitespace skipped).
    pub fn of(data: &[u8]) -> KeyfileFormat {
        let data = data.trim_ascii_start();
        if data.starts_with(NACL_PREFIX) {
            KeyfileFormat::Nacl
        } else if data.starts_with(b"$ANSIBLE_VAULT") {
            KeyfileFormat::AnsibleVault
        } else if data.starts_with(b"gAAAAA") {
            KeyfileFormat::LegacyFernet
        } else {
            KeyfileFormat::Plain
        }
    }

    /// True for every encrypted format.
    pub fn is_encrypted(self) -> bool {
        self != KeyfileFormat::Plain
    }

    /// The format's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            KeyfileFormat::Plain => "plain JSON",
            KeyfileFormat::Nacl => "NaCl ($NACL)",
            KeyfileFormat::AnsibleVault => "Ansible vault ($ANSIBLE_VAULT)",
            KeyfileFormat::LegacyFernet => "legacy Fernet",
        }
    }
}

/// Why a `$NACL` keyfile could not be decrypted.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecryptError {
    /// The data does not start with `$NACL`.
    #[error("not a $NACL keyfile")]
    NotNacl,
    /// Shorter than a prefix, nonce and tag.
    #[error("truncated $NACL keyfile ({len} bytes; at least {MIN_NACL_LEN} expected)")]
    Truncated {
        /// The length found, prefix included.
        len: usize,
    },
    /// The tag does not match: a wrong password (or a damaged file, which looks the same).
    #[error("wrong password")]
    WrongPassword,
    /// The key derivation itself failed (it should not, with fixed parameters).
    #[error("key derivation failed: {0}")]
    Kdf(String),
}

/// Argon2 parameters: the real ones, or cheap ones in unit tests.
#[derive(Debug, Clone, Copy)]
struct KdfCost {
    /// Memory in 1 KiB blocks.
    memory_kib: u32,
    /// Passes over the memory.
    passes: u32,
}

/// What bittensor-wallet uses.
const NACL_COST: KdfCost = KdfCost {
    memory_kib: NACL_MEMORY_KIB,
    passes: NACL_PASSES,
};

/// The secretbox key for `password`: Argon2i v1.3 with the fixed salt, one lane.
fn derive_key(password: &[u8], cost: KdfCost) -> Result<Zeroizing<[u8; 32]>, DecryptError> {
    let params = Params::new(cost.memory_kib, cost.passes, 1, Some(32))
        .map_err(|e| DecryptError::Kdf(e.to_string()))?;
    let argon = Argon2::new(Algorithm::Argon2i, Version::V0x13, params);
    let mut key = Zeroizing::new([0u8; 32]);
    argon
        .hash_password_into(password, &NACL_SALT, key.as_mut())
        .map_err(|e| DecryptError::Kdf(e.to_string()))?;
    Ok(key)
}

/// [`decrypt_nacl`] with the given key derivation cost.
fn decrypt_with(
    data: &[u8],
    password: &[u8],
    cost: KdfCost,
) -> Result<Zeroizing<Vec<u8>>, DecryptError> {
    let data = data.trim_ascii_start();
    let body = data
        .strip_prefix(NACL_PREFIX)
        .ok_or(DecryptError::NotNacl)?;
    if data.len() < MIN_NACL_LEN {
        return Err(DecryptError::Truncated { len: data.len() });
    }
    let (nonce, sealed) = body.split_at(NONCE_LEN);
    let (tag, ciphertext) = sealed.split_at(TAG_LEN);
    let key = derive_key(password, cost)?;
    let cipher = XSalsa20Poly1305::new(key.as_ref().into());
    let mut plain = Zeroizing::new(ciphertext.to_vec());
    cipher
        .decrypt_in_place_detached(
            Nonce::from_slice(nonce),
            b"",
            plain.as_mut_slice(),
            Tag::from_slice(tag),
        )
        .map_err(|_| DecryptError::WrongPassword)?;
    Ok(plain)
}

/// Decrypts a `$NACL` keyfile with `password`, giving the JSON keyfile inside.
///
/// Costs 512 MiB of memory and a few seconds (the key derivation), whatever the password.
///
/// # Errors
/// [`DecryptError::NotNacl`], [`DecryptError::Truncated`], or [`DecryptError::WrongPassword`]
/// when the tag does not match.
pub fn decrypt_nacl(data: &[u8], password: &[u8]) -> Result<Zeroizing<Vec<u8>>, DecryptError> {
    decrypt_with(data, password, NACL_COST)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cheap Argon2 parameters, so that the error paths run in milliseconds.
    const CHEAP: KdfCost = KdfCost {
        memory_kib: 64,
        passes: 1,
    };

    /// `$NACL` data as bittensor-wallet lays it out, with `cost` instead of the real cost.
    fn seal(plain: &[u8], password: &[u8], cost: KdfCost) -> Vec<u8> {
        let key = derive_key(password, cost).unwrap();
        let cipher = XSalsa20Poly1305::new(key.as_ref().into());
        let nonce = [7u8; NONCE_LEN];
        let mut body = plain.to_vec();
        let tag = cipher
            .encrypt_in_place_detached(Nonce::from_slice(&nonce), b"", &mut body)
            .unwrap();
        [NACL_PREFIX, &nonce, tag.as_slice(), &body].concat()
    }

    #[test]
    fn formats_are_told_apart() {
        assert_eq!(KeyfileFormat::of(b"$NACL\x00"), KeyfileFormat::Nacl);
        assert_eq!(KeyfileFormat::of(b"\n $NACL"), KeyfileFormat::Nacl);
        assert_eq!(
            KeyfileFormat::of(b"$ANSIBLE_VAULT;1.1;AES256\n"),
            KeyfileFormat::AnsibleVault
        );
        assert_eq!(KeyfileFormat::of(b"gAAAAABk"), KeyfileFormat::LegacyFernet);
        assert_eq!(KeyfileFormat::of(b"{\"a\": 1}"), KeyfileFormat::Plain);
        assert_eq!(KeyfileFormat::of(b""), KeyfileFormat::Plain);
        assert!(!KeyfileFormat::Plain.is_encrypted());
        assert!(KeyfileFormat::LegacyFernet.is_encrypted());
    }

    #[test]
    fn round_trip_and_wrong_password() {
        let data = seal(b"{\"secretPhrase\": \"x\"}", b"pw", CHEAP);
        let plain = decrypt_with(&data, b"pw", CHEAP).unwrap();
        assert_eq!(plain.as_slice(), b"{\"secretPhrase\": \"x\"}");
        assert_eq!(
            decrypt_with(&data, b"pw2", CHEAP),
            Err(DecryptError::WrongPassword)
        );
        // A flipped ciphertext bit fails the tag like a wrong password.
        let mut damaged = data.clone();
        *damaged.last_mut().unwrap() ^= 1;
        assert_eq!(
            decrypt_with(&damaged, b"pw", CHEAP),
            Err(DecryptError::WrongPassword)
        );
    }

    #[test]
    fn truncated_and_foreign_data_are_refused_before_the_kdf() {
        let data = seal(b"{}", b"pw", CHEAP);
        // The real cost would take seconds: these fail on their shape, before any derivation.
        for len in [5, 6, 5 + NONCE_LEN, MIN_NACL_LEN - 1] {
            assert_eq!(
                decrypt_nacl(&data[..len], b"pw"),
                Err(DecryptError::Truncated { len })
            );
        }
        assert_eq!(
            decrypt_nacl(b"$NACK0123456789012345678901234567890123456789", b"pw"),
            Err(DecryptError::NotNacl)
        );
        assert_eq!(decrypt_nacl(b"{}", b"pw"), Err(DecryptError::NotNacl));
        // An empty message is a valid box.
        let empty = seal(b"", b"pw", CHEAP);
        assert_eq!(empty.len(), MIN_NACL_LEN);
        assert!(decrypt_with(&empty, b"pw", CHEAP).unwrap().is_empty());
    }

    /// A coldkey written by bittensor-wallet 4.1.1 (`Wallet.set_coldkey(keypair, encrypt=True,
    /// coldkey_password="iota-test-password")`) for the public development phrase: the real
    /// parameters (512 MiB, a few seconds).
    const DEV_COLDKEY_NACL: [&str; 13] = [
        "244e41434c57d5ac7b99f0367ee48c835d689edbe9e881e1bd4b57449cef7c8587079cd8062577eb61f5a605985f0c53",
        "6eac0c943042aed32de30d4c1e29f9d20bf4d8cd3a68e5a64b362b575e975d6644863cb6750fdef56a5985d4df1e93ba",
        "1dc645ce02db2c6354a641df73f610005bb3bf3d146a0735c236550525992c34072cfc87a69c9a91cb1cbf2e2779cda4",
        "8d0379f8e9b6302718b212ddb7f5b83a84e58ab0c4f2f2e07db47f7f68619aa8122c3f602a3cae402fbdf658fa66197b",
        "d644b7fc8b9f90c6837116fb20ee1640c5a7b3fb79936bd92e818fc8f6eba3348a68361b89c9be0c95f59241f39a56d3",
        "e3c02d50da5314067fe44b4d91ee46bf1c45ebea69d9f6ab7cd289d098a515958e349cd4c7d6239fc6baafae90bfe440",
        "3ddc5f5b61f2b44c9c5f3613431087d17646ae4d14d44e1d4009d6b150708f0f7148221021f2b5154407d344e17ea1ac",
        "5111c1c5dfe562414c008184ad8fba6c571ea2f16f049ee1ac5f1fe3617720502bf333119172edff8e53dab1a87f8a85",
        "7de783a2b4b8444b69fb261d6bf9d6602d3612cd549ff826fa4e0ae889e1569c2fe660a8828cd599b10db6172bf5a1a8",
        "7fbce941c3fb661e1eefdfd92df65aa854bc2a51bf2dfcde83257c8d777504fa554be90cbeb425f089b5b4690227d5ec",
        "c49ba25d5e28b0cb44a14cb6684ff52430981392a4512ca8933cb496c206f3c445f13295c15cf5dd76c4c74a37aa39e3",
        "2290997ddee1ac23e6b2e38e50b2a8fd822d7bb1be3605e1f1d26a7d5e1cebb1cafa7ba245d603d026d5b0e0463e06f0",
        "2ed91757e92f420370747e8f113b4ce81cb5542471388641d80e47",
    ];

    #[test]
    fn bittensor_wallet_coldkey_decrypts() {
        let data = hex::decode(DEV_COLDKEY_NACL.concat()).unwrap();
        assert_eq!(KeyfileFormat::of(&data), KeyfileFormat::Nacl);
        let plain = decrypt_nacl(&data, b"iota-test-password").unwrap();
        let json: serde_json::Value = serde_json::from_slice(&plain).unwrap();
        assert_eq!(
            json["ss58Address"],
            "5DfhGyQdFobKM8NsWvEeAKk5EQQgYe9AydgJ7rMB6E1EqRzV"
        );
    }
}
