//! Weights as subtensor takes them: the Bittensor SDK's conversion of a float vector to u16
//! weights, and the commit-reveal v2 hash that `commit_weights` carries.
//!
//! # The u16 conversion ([`weights_for_emit`])
//!
//! As the SDK's `convert_weights_and_uids_for_emit` does it: weights must be non-negative and
//! pair up with the uids; an all-zero vector sets nothing; otherwise every weight is divided by
//! the largest (in f64, from the f32 values), multiplied by 65535 and rounded half to even
//! (Python's `round`), and the uids whose weight rounds to 0 are left out. A validator's vector
//! thus maps to the same u16s the SDK would send.
//!
//! # The v2 commit hash ([`commit_hash_v2`])
//!
//! ```text
//! commit_hash = blake2b-256( SCALE( hotkey: [u8; 32], netuid: u16, uids: Vec<u16>,
//!                                   values: Vec<u16>, salt: Vec<u16>, version_key: u64 ) )
//! ```
//!
//! The reveal sends the same uids, values, salt and version key; the chain recomputes this hash
//! for the revealing hotkey and accepts the reveal only if it matches a pending commit.

use blake2::{Blake2b256, Digest};
use parity_scale_codec::Encode;

use super::SubtensorError;

/// The largest u16 weight: the SDK scales the largest weight to it.
pub const U16_MAX_WEIGHT: u16 = u16::MAX;

/// How many u16s of salt iota commits with (the SDK's default length).
pub const SALT_LEN: usize = 8;

/// Converts a validator's weights (one per uid) to the uids and u16 weights set on chain,
/// exactly as the Bittensor SDK's `convert_weights_and_uids_for_emit` does.
///
/// # Errors
/// [`SubtensorError::Weights`] for a negative or non-finite weight, or lists of different
/// lengths.
pub fn weights_for_emit(
    uids: &[u16],
    weights: &[f32],
) -> Result<(Vec<u16>, Vec<u16>), SubtensorError> {
    let invalid = |reason: String| SubtensorError::Weights { reason };
    if uids.len() != weights.len() {
        return Err(invalid(format!(
            "{} uids but {} weights: they must pair up",
            uids.len(),
            weights.len()
        )));
    }
    if let Some(bad) = weights.iter().find(|w| !w.is_finite()) {
        return Err(invalid(format!("weight {bad} is not a finite number")));
    }
    if let Some(bad) = weights.iter().find(|w| **w < 0.0) {
        return Err(invalid(format!(
            "weight {bad} is negative: weights on chain are non-negative"
        )));
    }
    let values: Vec<f64> = weights.iter().map(|w| f64::from(*w)).collect();
    let sum: f64 = values.iter().sum();
    if sum == 0.0 {
        return Ok((Vec::new(), Vec::new()));
    }
    let max = values.iter().copied().fold(f64::MIN, f64::max);
    let mut out_uids = Vec::new();
    let mut out_values = Vec::new();
    for (uid, value) in uids.iter().zip(values) {
        let scaled = ((value / max) * f64::from(U16_MAX_WEIGHT)).round_ties_even();
        // `value <= max`, so the scaled weight is in 0..=65535.
        let weight = scaled.clamp(0.0, f64::from(U16_MAX_WEIGHT)) as u16;
        if weight != 0 {
            out_uids.push(*uid);
            out_values.push(weight);
        }
    }
    Ok((out_uids, out_values))
}

/// The commit-reveal v2 hash of `hotkey`'s weights on `netuid` (see the module docs).
pub fn commit_hash_v2(
    hotkey: &[u8; 32],
    netuid: u16,
    uids: &[u16],
    values: &[u16],
    salt: &[u16],
    version_key: u64,
) -> [u8; 32] {
    let encoded = (hotkey, netuid, uids, values, salt, version_key).encode();
    let mut hash = [0u8; 32];
    hash.copy_from_slice(&Blake2b256::digest(&encoded));
    hash
}

/// A fresh random salt of [`SALT_LEN`] u16s, to be kept until the reveal.
pub fn new_salt() -> Vec<u16> {
    (0..SALT_LEN).map(|_| rand::random::<u16>()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_weight_becomes_65535_and_zeros_drop_out() {
        let (uids, values) = weights_for_emit(&[0, 1, 2, 3], &[0.5, 1.0, 0.0, 0.25]).unwrap();
        assert_eq!(uids, [0, 1, 3]);
        assert_eq!(values, [32768, 65535, 16384]);
    }

    #[test]
    fn halves_round_to_even_as_python_does() {
        // 1/131070 of the largest weight scales to exactly 0.5: Python's round gives 0.
        let max = 131_070.0_f32;
        let (uids, values) = weights_for_emit(&[0, 1, 2], &[max, 1.0, 3.0]).unwrap();
        assert_eq!(uids, [0, 2]);
        assert_eq!(values, [65535, 2]); // 1.5 rounds to 2
    }

    #[test]
    fn nothing_to_set_and_bad_input() {
        assert_eq!(
            weights_for_emit(&[0, 1], &[0.0, 0.0]).unwrap(),
            (vec![], vec![])
        );
        assert!(weights_for_emit(&[0], &[-1.0]).is_err());
        assert!(weights_for_emit(&[0], &[f32::NAN]).is_err());
        assert!(weights_for_emit(&[0, 1], &[1.0]).is_err());
    }

    #[test]
    fn the_hash_covers_every_input() {
        let base = commit_hash_v2(&[1; 32], 9, &[0, 1], &[10, 20], &[5; 8], 3);
        assert_ne!(
            base,
            commit_hash_v2(&[2; 32], 9, &[0, 1], &[10, 20], &[5; 8], 3)
        );
        assert_ne!(
            base,
            commit_hash_v2(&[1; 32], 8, &[0, 1], &[10, 20], &[5; 8], 3)
        );
        assert_ne!(
            base,
            commit_hash_v2(&[1; 32], 9, &[0, 2], &[10, 20], &[5; 8], 3)
        );
        assert_ne!(
            base,
            commit_hash_v2(&[1; 32], 9, &[0, 1], &[10, 21], &[5; 8], 3)
        );
        assert_ne!(
            base,
            commit_hash_v2(&[1; 32], 9, &[0, 1], &[10, 20], &[6; 8], 3)
        );
        assert_ne!(
            base,
            commit_hash_v2(&[1; 32], 9, &[0, 1], &[10, 20], &[5; 8], 4)
        );
        assert_eq!(new_salt().len(), SALT_LEN);
    }
}
