//! sr25519 hotkeys derived exactly as Substrate (and so Bittensor's btcli) derive them, so
//! that a phrase gives the same address in iota as in any Substrate wallet.
//!
//! # Derivation
//!
//! ```text
//! secret URI = [phrase | 0x<32-byte seed hex>] ( "//" hard junction )* [ "///" password ]
//! phrase     -> BIP-39 entropy (English word list, checksum verified)
//! entropy    -> mini secret = substrate_bip39::mini_secret_from_entropy(entropy, password)
//! mini       -> keypair     = mini.expand_to_keypair(ExpansionMode::Ed25519)
//! "//j"      -> mini        = keypair.secret.hard_derive_mini_secret_key(ChainCode(cc(j)), b"")
//! cc(j)      =  SCALE(j) zero-padded to 32 bytes, or blake2b-256(SCALE(j)) if longer, where
//!               SCALE(j) is the u64 little-endian if j parses as a u64, else the compact
//!               length prefix followed by j's UTF-8 bytes
//! ```
//!
//! An empty phrase means Substrate's development phrase ([`DEV_PHRASE`]), so `//Alice` is the
//! well-known Alice key. Soft junctions (`/j`) are refused: iota hotkeys never need them.

use std::fmt;

use bip39::{Language, Mnemonic};
use blake2::{Blake2b256, Digest};
use rand::TryRng;
use schnorrkel::derive::ChainCode;
use schnorrkel::{ExpansionMode, Keypair, MiniSecretKey, PublicKey, SecretKey, Signature};
use thiserror::Error;
use zeroize::{Zeroize, Zeroizing};

use super::ss58::Ss58Address;

/// Substrate's well-known development phrase (Alice, Bob, ... are its `//Name` children).
pub const DEV_PHRASE: &str =
    "bottom drive obey lake curtain smoke basket hold race lonely fit walk";

/// The signing context Substrate uses for sr25519 signatures of arbitrary messages.
pub const SIGNING_CONTEXT: &[u8] = b"substrate";

/// Why a key could not be built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyError {
    /// The phrase is not a valid English BIP-39 mnemonic (unknown word, bad checksum, count).
    #[error("invalid BIP-39 mnemonic: {reason}")]
    InvalidMnemonic {
        /// What the BIP-39 parser objected to (never the phrase itself).
        reason: String,
    },
    /// The secret URI does not have the form `phrase//junction///password`.
    #[error("invalid secret URI: {reason}")]
    InvalidUri {
        /// What is wrong with it.
        reason: String,
    },
    /// A soft (`/j`) derivation junction, which iota does not support.
    #[error(
        "soft derivation junction /{junction} is not supported: use hard junctions (//{junction})"
    )]
    SoftJunction {
        /// The junction text.
        junction: String,
    },
    /// A hex seed that is not 32 bytes of hex.
    #[error("invalid secret seed: expected 32 bytes as hex (0x + 64 digits)")]
    InvalidSeed,
    /// A 64-byte schnorrkel secret key that is the wrong length or not a canonical scalar.
    #[error("invalid sr25519 secret key: expected 64 bytes (canonical scalar then nonce)")]
    InvalidSecretKey,
    /// The operating system's random number generator failed.
    #[error("cannot read OS randomness: {reason}")]
    Randomness {
        /// The OS error.
        reason: String,
    },
}

/// An sr25519 signature: 64 bytes, shown as `0x`-prefixed hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sr25519Signature(pub [u8; 64]);

impl Sr25519Signature {
    /// `0x` followed by 128 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        format!("0x{}", hex::encode(self.0))
    }

    /// Parses 128 hex digits, with or without a `0x` prefix; `None` if malformed.
    pub fn from_hex(text: &str) -> Option<Sr25519Signature> {
        let mut bytes = [0u8; 64];
        hex::decode_to_slice(strip_0x(text.trim()), &mut bytes).ok()?;
        Some(Sr25519Signature(bytes))
    }
}

impl fmt::Debug for Sr25519Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sr25519Signature({})", self.to_hex())
    }
}

/// An sr25519 key pair with the SS58 address it signs for, and the phrase or seed it came
/// from when known (so it can be written back to a Bittensor keyfile unchanged).
///
/// `Debug` shows only the address; secrets are zeroised on drop.
#[derive(Clone)]
pub struct Hotkey {
    /// The key pair used for signing.
    keypair: Keypair,
    /// The mnemonic, when this is the root key of that phrase (no junctions, no password).
    phrase: Option<Zeroizing<String>>,
    /// The 32-byte mini secret the key was expanded from, when known.
    seed: Option<Zeroizing<[u8; 32]>>,
    /// Cached address of the public key.
    address: Ss58Address,
}

impl fmt::Debug for Hotkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hotkey({})", self.address)
    }
}

impl Hotkey {
    fn from_keypair(
        keypair: Keypair,
        phrase: Option<Zeroizing<String>>,
        seed: Option<Zeroizing<[u8; 32]>>,
    ) -> Hotkey {
        let address = Ss58Address::from_public_key(keypair.public.to_bytes());
        Hotkey {
            keypair,
            phrase,
            seed,
            address,
        }
    }

    /// The root key of a BIP-39 phrase (English, 12 to 24 words, empty password), as
    /// `btcli wallet regen-hotkey --mnemonic ...` would derive it.
    ///
    /// # Errors
    /// [`KeyError::InvalidMnemonic`] if the phrase is not a valid mnemonic.
    pub fn from_phrase(phrase: &str) -> Result<Hotkey, KeyError> {
        from_phrase_with_password(phrase, "")
    }

    /// The key expanded from a 32-byte mini secret (Bittensor's `secretSeed`).
    ///
    /// # Errors
    /// [`KeyError::InvalidSeed`] if `seed` is not 32 bytes.
    pub fn from_seed(seed: &[u8]) -> Result<Hotkey, KeyError> {
        let mini = MiniSecretKey::from_bytes(seed).map_err(|_| KeyError::InvalidSeed)?;
        Ok(Hotkey::from_mini(&mini))
    }

    fn from_mini(mini: &MiniSecretKey) -> Hotkey {
        let keypair = mini.expand_to_keypair(ExpansionMode::Ed25519);
        Hotkey::from_keypair(keypair, None, Some(Zeroizing::new(mini.to_bytes())))
    }

    /// The key from schnorrkel's 64-byte secret key encoding (Bittensor's `privateKey`).
    ///
    /// # Errors
    /// [`KeyError::InvalidSecretKey`] if the length is wrong or the scalar is not canonical.
    pub fn from_secret_key_bytes(bytes: &[u8]) -> Result<Hotkey, KeyError> {
        let secret = SecretKey::from_bytes(bytes).map_err(|_| KeyError::InvalidSecretKey)?;
        Ok(Hotkey::from_keypair(secret.to_keypair(), None, None))
    }

    /// The key for a Substrate secret URI such as `"<phrase>"`, `"<phrase>//hot//1"`,
    /// `"//Alice"` (development phrase), `"0x<seed hex>//x"` or `"<phrase>///password"`.
    /// See the module docs for the derivation.
    ///
    /// # Errors
    /// [`KeyError::InvalidUri`], [`KeyError::SoftJunction`], [`KeyError::InvalidMnemonic`] or
    /// [`KeyError::InvalidSeed`].
    pub fn from_uri(uri: &str) -> Result<Hotkey, KeyError> {
        let (root_text, rest) = match uri.find('/') {
            Some(i) => uri.split_at(i),
            None => (uri, ""),
        };
        let (path, password) = match rest.find("///") {
            Some(i) => (&rest[..i], Some(&rest[i + 3..])),
            None => (rest, None),
        };
        let junctions = parse_path(path)?;
        let root_text = root_text.trim();
        let root = if let Some(hex_seed) = root_text.strip_prefix("0x") {
            let mut seed = Zeroizing::new([0u8; 32]);
            hex::decode_to_slice(hex_seed, seed.as_mut()).map_err(|_| KeyError::InvalidSeed)?;
            Hotkey::from_seed(seed.as_ref())?
        } else {
            let phrase = if root_text.is_empty() {
                DEV_PHRASE
            } else {
                root_text
            };
            from_phrase_with_password(phrase, password.unwrap_or(""))?
        };
        if junctions.is_empty() {
            return Ok(root);
        }
        let mut key = root;
        for cc in junctions {
            let (mini, _) = key
                .keypair
                .secret
                .hard_derive_mini_secret_key(Some(ChainCode(cc)), b"");
            key = Hotkey::from_mini(&mini);
        }
        Ok(key)
    }

    /// A fresh key from a new 12-word mnemonic drawn from the operating system's RNG.
    ///
    /// # Errors
    /// [`KeyError::Randomness`] if the OS cannot supply random bytes.
    pub fn generate() -> Result<Hotkey, KeyError> {
        let mut entropy = Zeroizing::new([0u8; 16]);
        rand::rngs::SysRng
            .try_fill_bytes(entropy.as_mut())
            .map_err(|e| KeyError::Randomness {
                reason: e.to_string(),
            })?;
        let mnemonic =
            Mnemonic::from_entropy_in(Language::English, entropy.as_ref()).map_err(|e| {
                KeyError::InvalidMnemonic {
                    reason: e.to_string(),
                }
            })?;
        let phrase = Zeroizing::new(mnemonic.to_string());
        Hotkey::from_phrase(&phrase)
    }

    /// The SS58 address (prefix 42) of the public key.
    pub fn address(&self) -> &Ss58Address {
        &self.address
    }

    /// The 32-byte sr25519 public key.
    pub fn public_key(&self) -> [u8; 32] {
        self.keypair.public.to_bytes()
    }

    /// schnorrkel's 64-byte secret key (scalar then nonce), as stored in `privateKey`.
    pub fn secret_key_bytes(&self) -> Zeroizing<[u8; 64]> {
        Zeroizing::new(self.keypair.secret.to_bytes())
    }

    /// The mnemonic, if this key is the root key of a known phrase.
    pub fn phrase(&self) -> Option<&str> {
        self.phrase.as_deref().map(String::as_str)
    }

    /// The 32-byte mini secret the key was expanded from, if known.
    pub fn seed(&self) -> Option<&[u8; 32]> {
        self.seed.as_deref()
    }

    /// Signs `message` under the Substrate context [`SIGNING_CONTEXT`].
    pub fn sign(&self, message: &[u8]) -> Sr25519Signature {
        Sr25519Signature(
            self.keypair
                .sign_simple(SIGNING_CONTEXT, message)
                .to_bytes(),
        )
    }
}

/// Checks an sr25519 signature of `message` by `public_key` under [`SIGNING_CONTEXT`].
///
/// Returns `false` for an invalid key or signature encoding as well as for a wrong signature.
pub fn verify(public_key: &[u8; 32], message: &[u8], signature: &Sr25519Signature) -> bool {
    let Ok(public) = PublicKey::from_bytes(public_key) else {
        return false;
    };
    let Ok(signature) = Signature::from_bytes(&signature.0) else {
        return false;
    };
    public
        .verify_simple(SIGNING_CONTEXT, message, &signature)
        .is_ok()
}

fn from_phrase_with_password(phrase: &str, password: &str) -> Result<Hotkey, KeyError> {
    let mnemonic =
        Mnemonic::parse_in(Language::English, phrase).map_err(|e| KeyError::InvalidMnemonic {
            reason: e.to_string(),
        })?;
    let (mut entropy, len) = mnemonic.to_entropy_array();
    let mini = entropy
        .get(..len)
        .ok_or_else(|| KeyError::InvalidMnemonic {
            reason: "entropy length".to_string(),
        })
        .and_then(|e| {
            substrate_bip39::mini_secret_from_entropy(e, password).map_err(|_| {
                KeyError::InvalidMnemonic {
                    reason: format!("{len} bytes of entropy is not a supported length"),
                }
            })
        });
    entropy.zeroize();
    let mut key = Hotkey::from_mini(&mini?);
    if password.is_empty() {
        key.phrase = Some(Zeroizing::new(mnemonic.to_string()));
    }
    Ok(key)
}

/// Parses `//a//b` into chain codes, refusing soft junctions and empty ones.
fn parse_path(path: &str) -> Result<Vec<[u8; 32]>, KeyError> {
    let mut codes = Vec::new();
    let mut rest = path;
    while !rest.is_empty() {
        let Some(after) = rest.strip_prefix('/') else {
            return Err(KeyError::InvalidUri {
                reason: format!("expected '/' at {rest:?}"),
            });
        };
        let (hard, after) = match after.strip_prefix('/') {
            Some(after) => (true, after),
            None => (false, after),
        };
        let end = after.find('/').unwrap_or(after.len());
        let (junction, tail) = after.split_at(end);
        if junction.is_empty() {
            return Err(KeyError::InvalidUri {
                reason: "empty derivation junction".to_string(),
            });
        }
        if !hard {
            return Err(KeyError::SoftJunction {
                junction: junction.to_string(),
            });
        }
        codes.push(chain_code(junction));
        rest = tail;
    }
    Ok(codes)
}

/// The chain code of one junction, as Substrate's `DeriveJunction` computes it.
fn chain_code(junction: &str) -> [u8; 32] {
    let encoded = match junction.parse::<u64>() {
        Ok(n) => n.to_le_bytes().to_vec(),
        Err(_) => {
            let mut out = compact_len(junction.len());
            out.extend_from_slice(junction.as_bytes());
            out
        }
    };
    let mut cc = [0u8; 32];
    if encoded.len() > 32 {
        cc.copy_from_slice(&Blake2b256::digest(&encoded));
    } else {
        cc[..encoded.len()].copy_from_slice(&encoded);
    }
    cc
}

/// SCALE compact encoding of a length.
fn compact_len(len: usize) -> Vec<u8> {
    let n = len as u64;
    match n {
        0..=0x3F => vec![(n as u8) << 2],
        0x40..=0x3FFF => (((n as u16) << 2) | 0b01).to_le_bytes().to_vec(),
        0x4000..=0x3FFF_FFFF => (((n as u32) << 2) | 0b10).to_le_bytes().to_vec(),
        _ => {
            let bytes = n.to_le_bytes();
            let used = 8 - (n.leading_zeros() / 8) as usize;
            let mut out = vec![(((used - 4) as u8) << 2) | 0b11];
            out.extend_from_slice(&bytes[..used]);
            out
        }
    }
}

/// Strips one leading `0x` or `0X`.
pub(crate) fn strip_0x(text: &str) -> &str {
    text.strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_phrase_gives_known_address() {
        let key = Hotkey::from_phrase(DEV_PHRASE).unwrap();
        assert_eq!(
            key.address().as_str(),
            "5DfhGyQdFobKM8NsWvEeAKk5EQQgYe9AydgJ7rMB6E1EqRzV"
        );
        assert_eq!(key.phrase(), Some(DEV_PHRASE));
        assert!(key.seed().is_some());
        // The empty URI is the development phrase's root key.
        assert_eq!(Hotkey::from_uri("").unwrap().address(), key.address());
    }

    #[test]
    fn alice_is_the_dev_phrase_hard_child() {
        let alice = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY";
        let explicit = Hotkey::from_uri(&format!("{DEV_PHRASE}//Alice")).unwrap();
        assert_eq!(explicit.address().as_str(), alice);
        assert_eq!(
            hex::encode(explicit.public_key()),
            "d43593c715fdd31c61141abd04a99fd6822c8558854ccde39a5684e7a56da27d"
        );
        assert_eq!(
            Hotkey::from_uri("//Alice").unwrap().address().as_str(),
            alice
        );
        // A derived key is not its phrase's root, but its seed reproduces it.
        assert_eq!(explicit.phrase(), None);
        let seed = *explicit.seed().unwrap();
        assert_eq!(Hotkey::from_seed(&seed).unwrap().address().as_str(), alice);
        // ...and so does the same derivation below a hex seed root.
        let root_seed = *Hotkey::from_phrase(DEV_PHRASE).unwrap().seed().unwrap();
        let via_hex = Hotkey::from_uri(&format!("0x{}//Alice", hex::encode(root_seed))).unwrap();
        assert_eq!(via_hex.address().as_str(), alice);
    }

    #[test]
    fn bob_and_numeric_junctions_differ() {
        let bob = Hotkey::from_uri("//Bob").unwrap();
        assert_eq!(
            bob.address().as_str(),
            "5FHneW46xGXgs5mUiveU4sbTyGBzmstUspZC92UhjJM694ty"
        );
        // "1" is SCALE-encoded as a u64, "x1" as a string: different keys.
        let one = Hotkey::from_uri("//1").unwrap();
        let x1 = Hotkey::from_uri("//x1").unwrap();
        assert_ne!(one.address(), x1.address());
        assert_eq!(chain_code("1")[..9], [1, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            chain_code("Alice")[..7],
            [20, b'A', b'l', b'i', b'c', b'e', 0]
        );
        // Long junctions are hashed, so two long ones sharing 32 bytes still differ.
        let long = "a".repeat(40);
        assert_ne!(chain_code(&long), chain_code(&format!("{long}b")));
    }

    #[test]
    fn compact_lengths_match_scale() {
        assert_eq!(compact_len(0), vec![0]);
        assert_eq!(compact_len(5), vec![20]);
        assert_eq!(compact_len(63), vec![252]);
        assert_eq!(compact_len(64), vec![0x01, 0x01]);
        assert_eq!(compact_len(16383), vec![0xFD, 0xFF]);
        assert_eq!(compact_len(16384), vec![0x02, 0x00, 0x01, 0x00]);
        assert_eq!(compact_len(1 << 30), vec![0x03, 0x00, 0x00, 0x00, 0x40]);
    }

    #[test]
    fn secret_key_bytes_round_trip() {
        let key = Hotkey::from_uri("//Alice").unwrap();
        let again = Hotkey::from_secret_key_bytes(key.secret_key_bytes().as_ref()).unwrap();
        assert_eq!(again.address(), key.address());
        assert_eq!(
            Hotkey::from_secret_key_bytes(&[0u8; 63]).unwrap_err(),
            KeyError::InvalidSecretKey
        );
        // A scalar with the top bits set is not canonical.
        assert_eq!(
            Hotkey::from_secret_key_bytes(&[0xFF; 64]).unwrap_err(),
            KeyError::InvalidSecretKey
        );
    }

    #[test]
    fn sign_and_verify() {
        let key = Hotkey::from_uri("//Alice").unwrap();
        let sig = key.sign(b"hello");
        assert!(verify(&key.public_key(), b"hello", &sig));
        assert!(!verify(&key.public_key(), b"hellp", &sig));
        let bob = Hotkey::from_uri("//Bob").unwrap();
        assert!(!verify(&bob.public_key(), b"hello", &sig));
        assert_eq!(Sr25519Signature::from_hex(&sig.to_hex()), Some(sig));
        assert_eq!(sig.to_hex().len(), 130);
        assert_eq!(Sr25519Signature::from_hex("0x1234"), None);
    }

    #[test]
    fn bad_uris_and_phrases_are_refused() {
        assert!(matches!(
            Hotkey::from_phrase(
                "bottom drive obey lake curtain smoke basket hold race lonely fit fit"
            ),
            Err(KeyError::InvalidMnemonic { .. })
        ));
        assert!(matches!(
            Hotkey::from_phrase("not a phrase"),
            Err(KeyError::InvalidMnemonic { .. })
        ));
        assert!(matches!(
            Hotkey::from_uri("//Alice/soft"),
            Err(KeyError::SoftJunction { .. })
        ));
        for uri in ["//", "//a//", "//a///pw//"] {
            let err = Hotkey::from_uri(uri).map(|k| k.address().to_string());
            if uri == "//a///pw//" {
                // Everything after `///` is the password, slashes included.
                assert!(err.is_ok(), "{uri}");
            } else {
                assert!(matches!(err, Err(KeyError::InvalidUri { .. })), "{uri}");
            }
        }
        assert_eq!(
            Hotkey::from_seed(&[1; 31]).unwrap_err(),
            KeyError::InvalidSeed
        );
        assert_eq!(
            Hotkey::from_uri("0x1234").unwrap_err(),
            KeyError::InvalidSeed
        );
    }

    #[test]
    fn password_changes_the_key() {
        let plain = Hotkey::from_uri(DEV_PHRASE).unwrap();
        let with_pw = Hotkey::from_uri(&format!("{DEV_PHRASE}///secret")).unwrap();
        assert_ne!(plain.address(), with_pw.address());
        assert_eq!(with_pw.phrase(), None);
    }

    #[test]
    fn generated_keys_are_fresh_12_word_phrases() {
        let a = Hotkey::generate().unwrap();
        let b = Hotkey::generate().unwrap();
        assert_ne!(a.address(), b.address());
        let phrase = a.phrase().unwrap();
        assert_eq!(phrase.split_whitespace().count(), 12);
        assert_eq!(Hotkey::from_phrase(phrase).unwrap().address(), a.address());
    }
}
