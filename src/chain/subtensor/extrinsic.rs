//! A signed extrinsic: call data, signed by an sr25519 key, with the transaction extensions the
//! runtime's metadata lists.
//!
//! ```text
//! payload   = call ++ extra ++ additional        (blake2b-256 of it when over 256 bytes)
//! signature = sr25519(signer, context b"substrate", payload)
//! extrinsic = Compact(len) ++ (version | 0x80) ++ MultiAddress::Id(signer)
//!             ++ MultiSignature::Sr25519(signature) ++ extra ++ call
//! ```
//!
//! `extra` and `additional` are each extension's two parts, in the metadata's order, each
//! encoded with the type the metadata gives it: the era and nonce and tip go into `extra`; the
//! spec and transaction versions, the genesis hash and the era's birth block hash only into
//! `additional` (signed, never sent). An extension iota does not know is accepted only if both
//! its parts are empty; otherwise signing refuses with one line naming it.

use blake2::{Blake2b256, Digest};
use parity_scale_codec::{Compact, Encode};
use scale_value::Value;

use super::SubtensorError;
use super::metadata::Metadata;
use crate::wallet::{Hotkey, Sr25519Signature};

/// The bit of the version byte that marks a signed extrinsic.
const SIGNED_BIT: u8 = 0x80;

/// Payloads longer than this are signed by their blake2b-256 hash.
const MAX_UNHASHED_PAYLOAD: usize = 256;

/// How long a transaction stays valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// Valid forever (replay-protected by the nonce only).
    Immortal,
    /// Valid for `period` blocks from block `current`, whose hash is `birth_hash`.
    Mortal {
        /// Requested validity in blocks (rounded to a power of two in 4..=65536).
        period: u64,
        /// The block the validity counts from (usually the best block).
        current: u64,
        /// That block's hash: signed in `additional`.
        birth_hash: [u8; 32],
    },
}

impl Era {
    /// The era's two-byte (or, immortal, one-byte) encoding, as Substrate's `Era` encodes it.
    pub fn encoded(&self) -> Vec<u8> {
        match *self {
            Era::Immortal => vec![0],
            Era::Mortal {
                period, current, ..
            } => {
                let period = period.checked_next_power_of_two().unwrap_or(1 << 16);
                let period = period.clamp(4, 1 << 16);
                let phase = current % period;
                let quantize_factor = (period >> 12).max(1);
                let quantized_phase = phase / quantize_factor * quantize_factor;
                let low = u64::from(period.trailing_zeros().saturating_sub(1).clamp(1, 15));
                let high = (quantized_phase / quantize_factor) << 4;
                // Both parts fit: `low` < 16 and `high` < 65536 (phase < period <= 2^16,
                // divided by at least period / 4096).
                let encoded = u16::try_from(low | high).unwrap_or(u16::MAX);
                encoded.to_le_bytes().to_vec()
            }
        }
    }

    /// The era as a value of the metadata's `Era` enum (`Immortal`, or `MortalN(u8)` where N
    /// is the first encoded byte).
    fn value(&self) -> Value {
        match self.encoded().as_slice() {
            [first, second] => {
                Value::unnamed_variant(format!("Mortal{first}"), [Value::u128(u128::from(*second))])
            }
            _ => Value::unnamed_variant("Immortal", []),
        }
    }
}

/// What a transaction is signed for, besides its call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxParams {
    /// The runtime's `spec_version` (from `state_getRuntimeVersion`, or the metadata's
    /// `System.Version`).
    pub spec_version: u32,
    /// The runtime's `transaction_version`.
    pub transaction_version: u32,
    /// The chain's genesis block hash.
    pub genesis_hash: [u8; 32],
    /// The validity window.
    pub era: Era,
    /// The signer's account nonce.
    pub nonce: u64,
    /// A tip to the block author, in rao.
    pub tip: u128,
}

/// A signed extrinsic, ready to submit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedExtrinsic {
    /// The whole extrinsic, length prefix included (what `author_submitExtrinsic` takes).
    pub bytes: Vec<u8>,
    /// What was signed (the payload itself, or its blake2b-256 hash when longer than 256 bytes).
    pub signed_message: Vec<u8>,
    /// The sr25519 signature of `signed_message`.
    pub signature: Sr25519Signature,
}

impl SignedExtrinsic {
    /// The extrinsic's hash (blake2b-256 of its bytes), as the chain names it.
    pub fn hash(&self) -> [u8; 32] {
        let mut hash = [0u8; 32];
        hash.copy_from_slice(&Blake2b256::digest(&self.bytes));
        hash
    }
}

/// The two parts of the transaction extensions for `params`, in the metadata's order: what the
/// extrinsic carries (`extra`) and what is only signed (`additional`).
///
/// # Errors
/// [`SubtensorError::UnknownExtension`] for an extension iota cannot fill in, or
/// [`SubtensorError::Encode`] when a value does not fit its type.
pub fn extensions(md: &Metadata, params: &TxParams) -> Result<(Vec<u8>, Vec<u8>), SubtensorError> {
    let mut extra = Vec::new();
    let mut additional = Vec::new();
    let empty = || Value::unnamed_composite([]);
    for ext in md.transaction_extensions() {
        let (extra_value, additional_value) = match ext.identifier.as_str() {
            "CheckSpecVersion" => (empty(), Value::u128(params.spec_version.into())),
            "CheckTxVersion" => (empty(), Value::u128(params.transaction_version.into())),
            "CheckGenesis" => (empty(), Value::from_bytes(params.genesis_hash)),
            "CheckMortality" | "CheckEra" => {
                let birth = match params.era {
                    Era::Immortal => params.genesis_hash,
                    Era::Mortal { birth_hash, .. } => birth_hash,
                };
                (params.era.value(), Value::from_bytes(birth))
            }
            "CheckNonce" => (Value::u128(params.nonce.into()), empty()),
            "ChargeTransactionPayment" => (Value::u128(params.tip), empty()),
            // No metadata hash is committed to (mode Disabled, additional None).
            "CheckMetadataHash" => (
                Value::named_composite([("mode", Value::unnamed_variant("Disabled", []))]),
                Value::unnamed_variant("None", []),
            ),
            // Any other extension must carry nothing: both its parts empty.
            _ => {
                let unknown = || SubtensorError::UnknownExtension {
                    identifier: ext.identifier.clone(),
                };
                let extra_part = encode_part(md, &empty(), ext.extra_ty, &ext.identifier);
                let additional_part = encode_part(md, &empty(), ext.additional_ty, &ext.identifier);
                match (extra_part, additional_part) {
                    (Ok(a), Ok(b)) if a.is_empty() && b.is_empty() => continue,
                    _ => return Err(unknown()),
                }
            }
        };
        extra.extend(encode_part(
            md,
            &extra_value,
            ext.extra_ty,
            &ext.identifier,
        )?);
        additional.extend(encode_part(
            md,
            &additional_value,
            ext.additional_ty,
            &ext.identifier,
        )?);
    }
    Ok((extra, additional))
}

/// What `signer` signs for `call` under `params`: `call ++ extra ++ additional`, or its
/// blake2b-256 hash when longer than 256 bytes.
///
/// # Errors
/// As [`extensions`].
pub fn signing_message(
    md: &Metadata,
    call: &[u8],
    params: &TxParams,
) -> Result<Vec<u8>, SubtensorError> {
    let (extra, additional) = extensions(md, params)?;
    let mut payload = Vec::with_capacity(call.len() + extra.len() + additional.len());
    payload.extend_from_slice(call);
    payload.extend_from_slice(&extra);
    payload.extend_from_slice(&additional);
    if payload.len() > MAX_UNHASHED_PAYLOAD {
        Ok(Blake2b256::digest(&payload).to_vec())
    } else {
        Ok(payload)
    }
}

/// Signs `call` with `signer` and builds the extrinsic.
///
/// # Errors
/// As [`extensions`], or [`SubtensorError::Encode`] when the metadata's address or signature
/// type does not take an sr25519 account and signature.
pub fn sign(
    md: &Metadata,
    call: &[u8],
    signer: &Hotkey,
    params: &TxParams,
) -> Result<SignedExtrinsic, SubtensorError> {
    let (extra, _) = extensions(md, params)?;
    let signed_message = signing_message(md, call, params)?;
    let signature = signer.sign(&signed_message);
    let address = Value::unnamed_variant("Id", [Value::from_bytes(signer.public_key())]);
    let multi_signature = Value::unnamed_variant("Sr25519", [Value::from_bytes(signature.0)]);
    let mut body = vec![md.extrinsic_version() | SIGNED_BIT];
    body.extend(encode_part(md, &address, md.address_type(), "the sender")?);
    body.extend(encode_part(
        md,
        &multi_signature,
        md.signature_type(),
        "the signature",
    )?);
    body.extend_from_slice(&extra);
    body.extend_from_slice(call);
    let length = u32::try_from(body.len()).map_err(|_| SubtensorError::Encode {
        what: "the extrinsic".into(),
        reason: format!("{} bytes is too long", body.len()),
    })?;
    let mut bytes = Compact(length).encode();
    bytes.extend_from_slice(&body);
    Ok(SignedExtrinsic {
        bytes,
        signed_message,
        signature,
    })
}

fn encode_part(
    md: &Metadata,
    value: &Value,
    ty: u32,
    what: &str,
) -> Result<Vec<u8>, SubtensorError> {
    let mut out = Vec::new();
    scale_value::scale::encode_as_type(value, ty, md.types(), &mut out).map_err(|e| {
        SubtensorError::Encode {
            what: what.to_owned(),
            reason: e.to_string(),
        }
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::subtensor::{calls, recorded_metadata};
    use crate::wallet::keys::verify;

    fn params(era: Era) -> TxParams {
        TxParams {
            spec_version: 461,
            transaction_version: 1,
            genesis_hash: [0x1d; 32],
            era,
            nonce: 7,
            tip: 0,
        }
    }

    #[test]
    fn eras_encode_as_substrate_does() {
        assert_eq!(Era::Immortal.encoded(), [0]);
        let mortal = |period, current| Era::Mortal {
            period,
            current,
            birth_hash: [0; 32],
        };
        // period 64 -> 2^6: low nibble 5; phase 66 % 64 = 2 -> high part 2 << 4.
        assert_eq!(mortal(64, 66).encoded(), [0x25, 0x00]);
        // The metadata's `Era` type encodes the same bytes.
        let md = recorded_metadata();
        let (extra, _) = extensions(&md, &params(mortal(64, 66))).unwrap();
        assert_eq!(extra[..2], [0x25, 0x00]);
    }

    #[test]
    fn a_signed_extrinsic_verifies_with_the_public_key() {
        let md = recorded_metadata();
        let signer = Hotkey::from_uri("//Alice").unwrap();
        let call = calls::set_weights(&md, 1, &[0, 1], &[65535, 100], 0).unwrap();
        for era in [
            Era::Immortal,
            Era::Mortal {
                period: 64,
                current: 1000,
                birth_hash: [3; 32],
            },
        ] {
            let p = params(era);
            let xt = sign(&md, &call, &signer, &p).unwrap();
            assert!(verify(
                &signer.public_key(),
                &xt.signed_message,
                &xt.signature
            ));
            assert_eq!(xt.signed_message, signing_message(&md, &call, &p).unwrap());
            // The extrinsic ends with the call and carries the signer's key.
            assert!(xt.bytes.ends_with(&call));
            let key = signer.public_key();
            assert!(xt.bytes.windows(32).any(|w| w == key));
            // A different nonce is a different message: the signature does not carry over.
            let other = signing_message(&md, &call, &TxParams { nonce: 8, ..p }).unwrap();
            assert!(!verify(&signer.public_key(), &other, &xt.signature));
        }
    }
}
