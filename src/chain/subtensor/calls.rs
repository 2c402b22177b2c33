//! Call data for the `SubtensorModule` calls iota sends, encoded against the runtime metadata.
//!
//! A call is the value `RuntimeCall::<Pallet>(<pallet call>::<call> { args })`, SCALE-encoded
//! with the metadata's own `RuntimeCall` type: the pallet and call indices and every
//! argument's encoding (`NetUid` as a `u16`, `AccountId32` and `H256` as 32 bytes, the
//! weights as `Vec<u16>`) come from the metadata, after [`Metadata::check_call`] has confirmed
//! the arguments are those iota means. A runtime that renamed, reordered or retyped an argument
//! fails here with one line, before anything is signed.

use scale_value::Value;

use super::SubtensorError;
use super::metadata::{
    BURNED_REGISTER, COMMIT_WEIGHTS, CallSpec, Metadata, REVEAL_WEIGHTS, SET_WEIGHTS,
};

/// `SubtensorModule.burned_register(netuid, hotkey)`: registers `hotkey` on `netuid`, paid by
/// the signer (the coldkey) at the subnet's current burn cost.
///
/// # Errors
/// [`SubtensorError`] when the runtime's call differs from what iota encodes.
pub fn burned_register(
    md: &Metadata,
    netuid: u16,
    hotkey: &[u8; 32],
) -> Result<Vec<u8>, SubtensorError> {
    encode(
        md,
        &BURNED_REGISTER,
        vec![Value::u128(netuid.into()), Value::from_bytes(hotkey)],
    )
}

/// `SubtensorModule.set_weights(netuid, dests, weights, version_key)`, signed by a validator's
/// hotkey; `dests` are uids and `weights` their u16 weights (see
/// [`super::commit::weights_for_emit`]).
///
/// # Errors
/// [`SubtensorError`] when the runtime's call differs or the lists differ in length.
pub fn set_weights(
    md: &Metadata,
    netuid: u16,
    dests: &[u16],
    weights: &[u16],
    version_key: u64,
) -> Result<Vec<u8>, SubtensorError> {
    same_length("dests", dests, "weights", weights)?;
    encode(
        md,
        &SET_WEIGHTS,
        vec![
            Value::u128(netuid.into()),
            u16s(dests),
            u16s(weights),
            Value::u128(version_key.into()),
        ],
    )
}

/// `SubtensorModule.commit_weights(netuid, commit_hash)`: the commit of commit-reveal v2, with
/// the hash from [`super::commit::commit_hash_v2`].
///
/// # Errors
/// [`SubtensorError`] when the runtime's call differs from what iota encodes.
pub fn commit_weights(
    md: &Metadata,
    netuid: u16,
    commit_hash: &[u8; 32],
) -> Result<Vec<u8>, SubtensorError> {
    encode(
        md,
        &COMMIT_WEIGHTS,
        vec![Value::u128(netuid.into()), Value::from_bytes(commit_hash)],
    )
}

/// `SubtensorModule.reveal_weights(netuid, uids, values, salt, version_key)`: the reveal of
/// commit-reveal v2; the same inputs as the commit's hash.
///
/// # Errors
/// [`SubtensorError`] when the runtime's call differs or `uids` and `values` differ in length.
pub fn reveal_weights(
    md: &Metadata,
    netuid: u16,
    uids: &[u16],
    values: &[u16],
    salt: &[u16],
    version_key: u64,
) -> Result<Vec<u8>, SubtensorError> {
    same_length("uids", uids, "values", values)?;
    encode(
        md,
        &REVEAL_WEIGHTS,
        vec![
            Value::u128(netuid.into()),
            u16s(uids),
            u16s(values),
            u16s(salt),
            Value::u128(version_key.into()),
        ],
    )
}

fn u16s(values: &[u16]) -> Value {
    Value::unnamed_composite(values.iter().map(|v| Value::u128((*v).into())))
}

fn same_length(a: &str, xs: &[u16], b: &str, ys: &[u16]) -> Result<(), SubtensorError> {
    if xs.len() == ys.len() {
        Ok(())
    } else {
        Err(SubtensorError::Weights {
            reason: format!("{} {a} but {} {b}: they must pair up", xs.len(), ys.len()),
        })
    }
}

/// Checks `spec` against the metadata, then encodes `args` (in `spec`'s order) as the runtime's
/// `RuntimeCall`.
fn encode(md: &Metadata, spec: &CallSpec, args: Vec<Value>) -> Result<Vec<u8>, SubtensorError> {
    md.check_call(spec)?;
    let fields = spec
        .args
        .iter()
        .map(|(name, _)| *name)
        .zip(args)
        .collect::<Vec<_>>();
    let call = Value::unnamed_variant(spec.pallet, [Value::named_variant(spec.call, fields)]);
    let mut out = Vec::new();
    scale_value::scale::encode_as_type(&call, md.call_type(), md.types(), &mut out).map_err(
        |e| SubtensorError::Encode {
            what: format!("{}.{}", spec.pallet, spec.call),
            reason: e.to_string(),
        },
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::subtensor::recorded_metadata;

    #[test]
    fn call_data_starts_with_the_metadata_indices() {
        let md = recorded_metadata();
        let hotkey = [7u8; 32];
        let info = md.check_call(&BURNED_REGISTER).unwrap();
        let data = burned_register(&md, 3, &hotkey).unwrap();
        assert_eq!(data[..2], [info.pallet_index, info.call_index]);
        // The netuid, a u16 in little-endian order, then the 32 bytes of the account.
        assert_eq!(data[2..4], [3, 0]);
        assert_eq!(data[4..], hotkey);
        assert_eq!(data.len(), 36);
    }

    #[test]
    fn mismatched_lists_are_refused() {
        let md = recorded_metadata();
        let err = set_weights(&md, 1, &[1, 2], &[3], 0).unwrap_err();
        assert!(err.to_string().contains("2 dests but 1 weights"), "{err}");
        assert!(reveal_weights(&md, 1, &[1], &[], &[1], 0).is_err());
        assert!(commit_weights(&md, 1, &[0; 32]).is_ok());
    }
}
