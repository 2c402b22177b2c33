//! Storage keys as the metadata declares them, and SCALE values read back through the
//! metadata's types.
//!
//! A key is `twox128(pallet prefix) ++ twox128(item name)`, then each map key SCALE-encoded
//! with its type and hashed with the hasher the metadata gives it (`Identity`,
//! `Twox64Concat`, `Blake2_128Concat`, ...). Values decode with `scale-value` against the
//! metadata's type registry; the helpers below read numbers, flags, accounts and fields out of
//! them, seeing through the newtypes subtensor wraps them in (`NetUid`, `TaoCurrency`,
//! `AccountId32`).

use blake2::digest::consts::U16;
use blake2::{Blake2b, Blake2b256, Digest};
use frame_metadata::v15::StorageHasher;
use scale_value::{Composite, Primitive, Value, ValueDef};

use super::SubtensorError;
use super::metadata::{Metadata, StorageInfo};

/// A decoded value, each part labelled with its type id.
pub type Decoded = Value<u32>;

/// xxHash64 of `data` with seeds 0 and 1, little-endian, concatenated (Substrate's `twox_128`).
pub fn twox_128(data: &[u8]) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&twox_hash::XxHash64::oneshot(0, data).to_le_bytes());
    out[8..].copy_from_slice(&twox_hash::XxHash64::oneshot(1, data).to_le_bytes());
    out
}

/// `hasher` applied to an encoded key (the `Concat` hashers append the key itself).
pub fn hash_key(hasher: &StorageHasher, key: &[u8]) -> Result<Vec<u8>, SubtensorError> {
    Ok(match hasher {
        StorageHasher::Identity => key.to_vec(),
        StorageHasher::Twox64Concat => {
            let mut out = twox_hash::XxHash64::oneshot(0, key).to_le_bytes().to_vec();
            out.extend_from_slice(key);
            out
        }
        StorageHasher::Twox128 => twox_128(key).to_vec(),
        StorageHasher::Blake2_128 => Blake2b::<U16>::digest(key).to_vec(),
        StorageHasher::Blake2_128Concat => {
            let mut out = Blake2b::<U16>::digest(key).to_vec();
            out.extend_from_slice(key);
            out
        }
        StorageHasher::Blake2_256 => Blake2b256::digest(key).to_vec(),
        StorageHasher::Twox256 => {
            return Err(SubtensorError::Encode {
                what: "a storage key".into(),
                reason: "the Twox256 hasher is not supported".into(),
            });
        }
    })
}

/// The key of `pallet.entry` at `keys` (one value per map key, none for a plain item), and the
/// item as the metadata declares it.
///
/// # Errors
/// [`SubtensorError::Missing`] for an unknown item, [`SubtensorError::Encode`] when the keys do
/// not fit its key types or count.
pub fn storage_key(
    md: &Metadata,
    pallet: &str,
    entry: &str,
    keys: &[Value],
) -> Result<(Vec<u8>, StorageInfo), SubtensorError> {
    let info = md.storage_entry(pallet, entry)?;
    if keys.len() != info.key_tys.len() {
        return Err(SubtensorError::Encode {
            what: format!("the key of {pallet}.{entry}"),
            reason: format!(
                "{} keys given, the item takes {}",
                keys.len(),
                info.key_tys.len()
            ),
        });
    }
    let mut out = twox_128(info.prefix.as_bytes()).to_vec();
    out.extend_from_slice(&twox_128(info.name.as_bytes()));
    for ((key, ty), hasher) in keys.iter().zip(&info.key_tys).zip(&info.hashers) {
        let mut encoded = Vec::new();
        scale_value::scale::encode_as_type(key, *ty, md.types(), &mut encoded).map_err(|e| {
            SubtensorError::Encode {
                what: format!("a key of {pallet}.{entry}"),
                reason: e.to_string(),
            }
        })?;
        out.extend(hash_key(hasher, &encoded)?);
    }
    Ok((out, info))
}

/// `bytes` decoded as type `ty`, all of them.
///
/// # Errors
/// [`SubtensorError::Metadata`] naming `what` when they do not decode or bytes are left over.
pub fn decode(md: &Metadata, ty: u32, bytes: &[u8], what: &str) -> Result<Decoded, SubtensorError> {
    let mut input = bytes;
    let value = scale_value::scale::decode_as_type(&mut input, ty, md.types()).map_err(|e| {
        SubtensorError::Metadata {
            reason: format!("{what} does not decode with the metadata's type: {e}"),
        }
    })?;
    if !input.is_empty() {
        return Err(SubtensorError::Metadata {
            reason: format!("{what}: {} bytes left over after its value", input.len()),
        });
    }
    Ok(value)
}

/// A storage value read from the node (`None`: the key holds nothing), decoded: an absent
/// `Default` item reads as the metadata's default, an absent `Optional` one as `None`.
///
/// # Errors
/// As [`decode`].
pub fn decode_storage(
    md: &Metadata,
    info: &StorageInfo,
    bytes: Option<&[u8]>,
) -> Result<Option<Decoded>, SubtensorError> {
    let what = format!("storage {}.{}", info.prefix, info.name);
    match bytes {
        Some(bytes) => decode(md, info.value_ty, bytes, &what).map(Some),
        None if info.optional => Ok(None),
        None => decode(md, info.value_ty, &info.default, &what).map(Some),
    }
}

/// The value inside single-field wrappers (`NetUid(u16)`, `TaoCurrency(u64)`, `AccountId32`'s
/// array stays an array).
pub fn inner(value: &Decoded) -> &Decoded {
    match &value.value {
        ValueDef::Composite(Composite::Unnamed(fields)) if fields.len() == 1 => inner(&fields[0]),
        ValueDef::Composite(Composite::Named(fields)) if fields.len() == 1 => inner(&fields[0].1),
        _ => value,
    }
}

/// An unsigned number, through wrappers.
pub fn number(value: &Decoded) -> Option<u128> {
    match &inner(value).value {
        ValueDef::Primitive(Primitive::U128(n)) => Some(*n),
        _ => None,
    }
}

/// A flag, through wrappers.
pub fn flag(value: &Decoded) -> Option<bool> {
    match &inner(value).value {
        ValueDef::Primitive(Primitive::Bool(b)) => Some(*b),
        _ => None,
    }
}

/// The elements of a sequence, array or tuple. Wrappers are not seen through here: a list of
/// one element looks like a wrapper.
pub fn elements(value: &Decoded) -> Option<Vec<&Decoded>> {
    match &value.value {
        ValueDef::Composite(Composite::Unnamed(items)) => Some(items.iter().collect()),
        _ => None,
    }
}

/// Bytes: an array or sequence of `u8` inside wrappers (an `AccountId32`, an `H256`); at least
/// two bytes long.
pub fn bytes(value: &Decoded) -> Option<Vec<u8>> {
    elements(inner(value))?
        .into_iter()
        .map(|v| number(v).and_then(|n| u8::try_from(n).ok()))
        .collect()
}

/// 32 bytes (an account or a hash).
pub fn bytes32(value: &Decoded) -> Option<[u8; 32]> {
    bytes(value)?.try_into().ok()
}

/// A named field of a struct (not seeing through wrappers: the struct itself).
pub fn field<'a>(value: &'a Decoded, name: &str) -> Option<&'a Decoded> {
    match &value.value {
        ValueDef::Composite(Composite::Named(fields)) => {
            fields.iter().find(|(n, _)| n == name).map(|(_, v)| v)
        }
        _ => None,
    }
}

/// An enum value's variant name and fields.
pub fn variant(value: &Decoded) -> Option<(&str, Vec<&Decoded>)> {
    match &value.value {
        ValueDef::Variant(v) => Some((v.name.as_str(), v.values.values().collect())),
        _ => None,
    }
}

/// A named field of an enum variant's fields.
pub fn variant_field<'a>(value: &'a Decoded, name: &str) -> Option<&'a Decoded> {
    match &value.value {
        ValueDef::Variant(v) => match &v.values {
            Composite::Named(fields) => fields.iter().find(|(n, _)| n == name).map(|(_, v)| v),
            Composite::Unnamed(_) => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::subtensor::recorded_metadata;

    #[test]
    fn twox_128_matches_substrates_well_known_prefixes() {
        // `System` and `Account`: every Substrate chain's account storage starts with these.
        assert_eq!(
            hex::encode(twox_128(b"System")),
            "26aa394eea5630e07c48ae0c9558cef7"
        );
        assert_eq!(
            hex::encode(twox_128(b"Account")),
            "b99d880ec681799c0cf30e8886371da9"
        );
    }

    #[test]
    fn keys_follow_the_declared_hashers() {
        let md = recorded_metadata();
        // Burn: Identity over the netuid (u16, little-endian).
        let (key, info) = storage_key(&md, "SubtensorModule", "Burn", &[Value::u128(3)]).unwrap();
        assert_eq!(key.len(), 32 + 2);
        assert_eq!(key[32..], [3, 0]);
        assert!(!info.optional);
        // Burn's default decodes as a number (the metadata's default, in rao).
        let default = decode_storage(&md, &info, None).unwrap().unwrap();
        assert!(number(&default).is_some());
        // System.Account: Blake2_128Concat over the 32-byte account.
        let (key, _) =
            storage_key(&md, "System", "Account", &[Value::from_bytes([7u8; 32])]).unwrap();
        assert_eq!(key.len(), 32 + 16 + 32);
        assert_eq!(key[48..], [7u8; 32]);
        // Uids: two keys, Identity then Blake2_128Concat.
        let (key, info) = storage_key(
            &md,
            "SubtensorModule",
            "Uids",
            &[Value::u128(1), Value::from_bytes([9u8; 32])],
        )
        .unwrap();
        assert_eq!(key.len(), 32 + 2 + 16 + 32);
        assert!(info.optional);
        assert!(storage_key(&md, "SubtensorModule", "Burn", &[]).is_err());
    }
}
