//! Content hashes for payloads: the producer of a blob reports its BLAKE3 hash to the
//! orchestrator, and every consumer checks the bytes it downloaded against that report.

use super::tensor::CodecError;

/// BLAKE3 hash of `bytes` as 64 lowercase hex digits.
pub fn payload_hash(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// BLAKE3 hash of `values` written as little-endian `f32` (an `f32` state or checkpoint):
/// their own bytes on a little-endian machine, else converted a block at a time instead of
/// through one copy of the whole.
pub fn f32_hash(values: &[f32]) -> blake3::Hash {
    if cfg!(target_endian = "little") {
        return blake3::hash(bytemuck::cast_slice(values));
    }
    let mut hasher = blake3::Hasher::new();
    let mut block = [0u8; 4 * 4096];
    for chunk in values.chunks(4096) {
        for (out, v) in block.chunks_exact_mut(4).zip(chunk) {
            out.copy_from_slice(&v.to_le_bytes());
        }
        hasher.update(&block[..4 * chunk.len()]);
    }
    hasher.finalize()
}

/// [`payload_hash`] of `values` written as little-endian `f32` (see [`f32_hash`]).
pub fn f32_payload_hash(values: &[f32]) -> String {
    f32_hash(values).to_hex().to_string()
}

/// Checks that `bytes` hash to `expected_hex` (64 hex digits, either case).
///
/// The comparison is constant-time, although the hash is not a secret.
///
/// # Errors
/// [`CodecError::MalformedHash`] if `expected_hex` is not 64 hex digits, and
/// [`CodecError::HashMismatch`] (with both hashes) if the bytes differ from what was reported.
pub fn verify_hash(bytes: &[u8], expected_hex: &str) -> Result<(), CodecError> {
    let expected =
        blake3::Hash::from_hex(expected_hex.trim()).map_err(|_| CodecError::MalformedHash {
            got: expected_hex.to_string(),
        })?;
    let got = blake3::hash(bytes);
    if got == expected {
        Ok(())
    } else {
        Err(CodecError::HashMismatch {
            expected: expected.to_hex().to_string(),
            got: got.to_hex().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_values_hash_like_their_little_endian_bytes() {
        for n in [0usize, 1, 4095, 4096, 10_001] {
            let values: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            assert_eq!(
                f32_payload_hash(&values),
                payload_hash(&bytes),
                "{n} values"
            );
        }
    }

    #[test]
    fn known_vector_for_empty_input() {
        // The BLAKE3 reference test vector for the empty message.
        assert_eq!(
            payload_hash(b""),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
    }

    #[test]
    fn verify_accepts_own_hash_in_either_case() {
        let bytes = b"activation bytes";
        let h = payload_hash(bytes);
        assert_eq!(h.len(), 64);
        assert_eq!(verify_hash(bytes, &h), Ok(()));
        assert_eq!(verify_hash(bytes, &h.to_uppercase()), Ok(()));
    }

    #[test]
    fn verify_rejects_changed_bytes_and_bad_hex() {
        let h = payload_hash(b"abc");
        match verify_hash(b"abd", &h) {
            Err(CodecError::HashMismatch { expected, got }) => {
                assert_eq!(expected, h);
                assert_eq!(got, payload_hash(b"abd"));
            }
            other => panic!("expected HashMismatch, got {other:?}"),
        }
        assert!(matches!(
            verify_hash(b"abc", "xyz"),
            Err(CodecError::MalformedHash { .. })
        ));
        assert!(matches!(
            verify_hash(b"abc", &h[..62]),
            Err(CodecError::MalformedHash { .. })
        ));
    }
}
