//! Token ids on the wire: the head's input, the tail's targets, and the ids that re-embedding
//! sections read. Little-endian unsigned integers, row-major `[batch, seq]`, no header, each in
//! the fewest bytes that hold the model's vocabulary: 1 byte up to 256 tokens, 2 up to 65,536,
//! 4 beyond. The width is not stored: with the shape known, an object's length gives it (the
//! lengths for 1, 2 and 4 bytes per id differ whenever there is an id).

/// Bytes per id for a vocabulary of `vocab` tokens.
pub fn width(vocab: usize) -> usize {
    match vocab {
        0..=256 => 1,
        257..=65_536 => 2,
        _ => 4,
    }
}

/// Appends `id` in `width` bytes (1, 2 or 4; the caller picked `width` with [`width`] for a
/// vocabulary holding `id`, so nothing is cut off).
pub fn push(out: &mut Vec<u8>, id: u32, width: usize) {
    out.extend_from_slice(&id.to_le_bytes()[..width.clamp(1, 4)]);
}

/// `ids` in [`width`]`(vocab)` bytes each.
pub fn encode(ids: &[u32], vocab: usize) -> Vec<u8> {
    let width = width(vocab);
    let mut out = Vec::with_capacity(ids.len() * width);
    for &id in ids {
        push(&mut out, id, width);
    }
    out
}

/// The first of `ids` that a vocabulary of `vocab` tokens does not hold, if any: an id past
/// an embedding table or the logits must be refused before any lookup.
pub fn first_outside(ids: &[u32], vocab: usize) -> Option<u32> {
    ids.iter().copied().find(|&t| t as usize >= vocab)
}

/// Decodes `count` ids from `bytes`, whose length must be 1, 2 or 4 bytes per id; `None`
/// otherwise.
pub fn decode(bytes: &[u8], count: usize) -> Option<Vec<u32>> {
    let width = [1, 2, 4]
        .into_iter()
        .find(|w| count.checked_mul(*w) == Some(bytes.len()))?;
    Some(
        bytes
            .chunks_exact(width)
            .map(|c| {
                let mut le = [0u8; 4];
                le[..width].copy_from_slice(c);
                u32::from_le_bytes(le)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_take_the_fewest_bytes_the_vocabulary_needs_and_round_trip() {
        assert_eq!(
            (width(256), width(257), width(65_536), width(128_256)),
            (1, 2, 2, 4)
        );
        for (vocab, ids) in [
            (256, vec![0u32, 7, 255, 128]),
            (65_536, vec![0, 256, 65_535, 9]),
            (128_256, vec![0, 65_536, 128_255, 3]),
        ] {
            let bytes = encode(&ids, vocab);
            assert_eq!(bytes.len(), ids.len() * width(vocab));
            assert_eq!(decode(&bytes, ids.len()), Some(ids));
        }
        // Little-endian: 256 in two bytes is [0, 1].
        let mut two = Vec::new();
        push(&mut two, 256, 2);
        assert_eq!(two, [0, 1]);
        // A length that is not 1, 2 or 4 bytes per id is refused; so is an overflowing count.
        assert_eq!(decode(&[1, 2, 3], 2), None);
        assert_eq!(decode(&[0; 12], 2), None);
        assert_eq!(decode(&[0; 4], usize::MAX), None);
        assert_eq!(decode(&[], 0), Some(Vec::new()));
        assert_eq!(first_outside(&[0, 255, 256, 300], 256), Some(256));
        assert_eq!(first_outside(&[0, 255], 256), None);
    }
}
