//! SS58 addresses: the base58 text form of a 32-byte public key that Substrate chains (and so
//! Bittensor) show to people, with a network prefix and a checksum against typos.
//!
//! # Format
//!
//! ```text
//! address  = base58( prefix || public_key (32 bytes) || checksum (2 bytes) )
//! checksum = blake2b-512( b"SS58PRE" || prefix || public_key )[..2]
//! prefix   = one byte for network ids 0..=63 (iota and Bittensor use 42),
//!            two bytes for ids 64..=16383
//! ```

use std::fmt;
use std::str::FromStr;

use blake2::{Blake2b512, Digest};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

/// The SS58 network id of generic Substrate, used by Bittensor and by iota.
pub const SS58_PREFIX: u16 = 42;

/// Why a string is not a valid address for this network.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Ss58Error {
    /// The text contains characters outside the base58 alphabet.
    #[error("invalid SS58 address {address:?}: not base58")]
    NotBase58 {
        /// The text given.
        address: String,
    },
    /// The decoded byte length fits no prefix + 32-byte key + checksum layout.
    #[error("invalid SS58 address {address:?}: decodes to {got} bytes, expected 35 or 36")]
    BadLength {
        /// The text given.
        address: String,
        /// Decoded length.
        got: usize,
    },
    /// The first byte is not a valid prefix encoding (128 and above are reserved).
    #[error("invalid SS58 address {address:?}: reserved prefix byte {byte}")]
    ReservedPrefix {
        /// The text given.
        address: String,
        /// The first decoded byte.
        byte: u8,
    },
    /// The checksum does not match: most likely a typo.
    #[error("invalid SS58 address {address:?}: checksum mismatch (typo?)")]
    BadChecksum {
        /// The text given.
        address: String,
    },
    /// A valid address, but for another network.
    #[error("SS58 address {address:?} has network prefix {got}, expected {expected}")]
    WrongPrefix {
        /// The text given.
        address: String,
        /// The prefix required.
        expected: u16,
        /// The prefix found.
        got: u16,
    },
}

/// A validated SS58 address for network [`SS58_PREFIX`]: the public key plus its canonical text.
///
/// Parse one with [`str::parse`] (checks base58, length, checksum and prefix) or build one
/// from a public key with [`Ss58Address::from_public_key`].
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ss58Address {
    /// Canonical text; kept so that `Display` and `as_str` cost nothing.
    text: String,
    /// The 32-byte sr25519 public key it encodes.
    public_key: [u8; 32],
}

impl Ss58Address {
    /// The address of `public_key` on network [`SS58_PREFIX`].
    pub fn from_public_key(public_key: [u8; 32]) -> Ss58Address {
        Ss58Address {
            text: encode(SS58_PREFIX, &public_key),
            public_key,
        }
    }

    /// The public key this address encodes.
    pub fn public_key(&self) -> &[u8; 32] {
        &self.public_key
    }

    /// The address as text.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for Ss58Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for Ss58Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ss58Address({})", self.text)
    }
}

impl FromStr for Ss58Address {
    type Err = Ss58Error;

    /// Parses an address and requires network prefix [`SS58_PREFIX`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (prefix, public_key) = decode(s)?;
        if prefix != SS58_PREFIX {
            return Err(Ss58Error::WrongPrefix {
                address: s.to_string(),
                expected: SS58_PREFIX,
                got: prefix,
            });
        }
        Ok(Ss58Address::from_public_key(public_key))
    }
}

impl Serialize for Ss58Address {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Ss58Address {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The prefix bytes for network id `prefix` (one byte below 64, two bytes up to 16383).
fn prefix_bytes(prefix: u16) -> Vec<u8> {
    let prefix = prefix & 0x3FFF;
    if prefix < 64 {
        vec![prefix as u8]
    } else {
        // Substrate's two-byte form: the low six bits of the first byte and the next eight
        // bits are the id's lower byte shuffled, the second byte's low six bits its upper bits.
        let first = (((prefix & 0b0000_0000_1111_1100) >> 2) as u8) | 0b0100_0000;
        let second = ((prefix >> 8) as u8) | (((prefix & 0b0000_0000_0000_0011) << 6) as u8);
        vec![first, second]
    }
}

fn checksum(prefix_and_key: &[u8]) -> [u8; 2] {
    let mut hasher = Blake2b512::new();
    hasher.update(b"SS58PRE");
    hasher.update(prefix_and_key);
    let hash = hasher.finalize();
    [hash[0], hash[1]]
}

/// Encodes `public_key` for network id `prefix` (ids above 16383 are masked to 14 bits).
pub fn encode(prefix: u16, public_key: &[u8; 32]) -> String {
    let mut bytes = prefix_bytes(prefix);
    bytes.extend_from_slice(public_key);
    let check = checksum(&bytes);
    bytes.extend_from_slice(&check);
    bs58::encode(bytes).into_string()
}

/// Decodes any SS58 address into its network id and public key, checking the checksum.
///
/// # Errors
/// [`Ss58Error::NotBase58`], [`Ss58Error::BadLength`], [`Ss58Error::ReservedPrefix`] or
/// [`Ss58Error::BadChecksum`].
pub fn decode(address: &str) -> Result<(u16, [u8; 32]), Ss58Error> {
    let owned = || address.to_string();
    let bytes = bs58::decode(address)
        .into_vec()
        .map_err(|_| Ss58Error::NotBase58 { address: owned() })?;
    let (prefix, prefix_len) = match bytes.first().copied() {
        Some(b @ 0..=63) => (u16::from(b), 1),
        Some(b @ 64..=127) => {
            let second = bytes.get(1).copied().unwrap_or(0);
            let lower = (b << 2) | (second >> 6);
            let upper = second & 0b0011_1111;
            (u16::from(lower) | (u16::from(upper) << 8), 2)
        }
        Some(byte) => {
            return Err(Ss58Error::ReservedPrefix {
                address: owned(),
                byte,
            });
        }
        None => {
            return Err(Ss58Error::BadLength {
                address: owned(),
                got: 0,
            });
        }
    };
    if bytes.len() != prefix_len + 32 + 2 {
        return Err(Ss58Error::BadLength {
            address: owned(),
            got: bytes.len(),
        });
    }
    let (body, check) = bytes.split_at(prefix_len + 32);
    if checksum(body) != check {
        return Err(Ss58Error::BadChecksum { address: owned() });
    }
    let mut public_key = [0u8; 32];
    public_key.copy_from_slice(&body[prefix_len..]);
    Ok((prefix, public_key))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Alice's well-known public key and generic-Substrate address.
    const ALICE_HEX: &str = "d43593c715fdd31c61141abd04a99fd6822c8558854ccde39a5684e7a56da27d";
    const ALICE: &str = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY";

    fn alice_key() -> [u8; 32] {
        let mut key = [0u8; 32];
        hex::decode_to_slice(ALICE_HEX, &mut key).unwrap();
        key
    }

    #[test]
    fn encodes_and_parses_alice() {
        let addr = Ss58Address::from_public_key(alice_key());
        assert_eq!(addr.as_str(), ALICE);
        let parsed: Ss58Address = ALICE.parse().unwrap();
        assert_eq!(parsed.public_key(), &alice_key());
        assert_eq!(parsed, addr);
        assert_eq!(
            serde_json::to_string(&addr).unwrap(),
            format!("\"{ALICE}\"")
        );
        let back: Ss58Address = serde_json::from_str(&format!("\"{ALICE}\"")).unwrap();
        assert_eq!(back, addr);
    }

    #[test]
    fn other_prefixes_round_trip_but_are_refused_here() {
        // Polkadot (0) uses one prefix byte, 1284 (Moonbeam) two.
        for prefix in [0u16, 2, 63, 64, 1284, 16383] {
            let text = encode(prefix, &alice_key());
            assert_eq!(decode(&text), Ok((prefix, alice_key())), "prefix {prefix}");
        }
        // Alice on Polkadot is a well-known address.
        let polkadot = encode(0, &alice_key());
        assert_eq!(polkadot, "15oF4uVJwmo4TdGW7VfQxNLavjCXviqxT9S1MgbjMNHr6Sp5");
        assert!(matches!(
            polkadot.parse::<Ss58Address>(),
            Err(Ss58Error::WrongPrefix {
                expected: 42,
                got: 0,
                ..
            })
        ));
    }

    #[test]
    fn rejects_malformed_addresses() {
        // Changing one character breaks the checksum (or the length).
        let mut typo = ALICE.to_string();
        typo.replace_range(10..11, "a");
        assert!(matches!(
            typo.parse::<Ss58Address>(),
            Err(Ss58Error::BadChecksum { .. })
        ));
        assert!(matches!(
            "0OIl".parse::<Ss58Address>(),
            Err(Ss58Error::NotBase58 { .. })
        ));
        assert!(matches!(
            ALICE[..40].parse::<Ss58Address>(),
            Err(Ss58Error::BadLength { .. })
        ));
        assert!(matches!(
            "".parse::<Ss58Address>(),
            Err(Ss58Error::BadLength { got: 0, .. })
        ));
        let reserved = bs58::encode([200u8; 35]).into_string();
        assert!(matches!(
            reserved.parse::<Ss58Address>(),
            Err(Ss58Error::ReservedPrefix { byte: 200, .. })
        ));
    }
}
