//! The content hash of a packed token stream: BLAKE3 over the tokens as little-endian `u32`,
//! whatever width they are stored in. A stream packed from raw text and the same stream read
//! from prepared token shards hash the same.

/// An incremental hash of a token stream; feed it the tokens in order, in any chunking.
pub(crate) struct StreamHasher {
    /// The BLAKE3 state.
    hasher: blake3::Hasher,
    /// Reused buffer of little-endian bytes.
    bytes: Vec<u8>,
}

impl StreamHasher {
    /// An empty stream's hasher.
    pub(crate) fn new() -> Self {
        Self {
            hasher: blake3::Hasher::new(),
            bytes: Vec::new(),
        }
    }

    /// Adds the next tokens of the stream.
    pub(crate) fn update(&mut self, tokens: &[u32]) {
        for chunk in tokens.chunks(1 << 16) {
            self.bytes.clear();
            self.bytes
                .extend(chunk.iter().flat_map(|t| t.to_le_bytes()));
            self.hasher.update(&self.bytes);
        }
    }

    /// The hash as 64 hex digits.
    pub(crate) fn finish(&self) -> String {
        self.hasher.finalize().to_hex().to_string()
    }
}

/// The hash of a whole in-memory stream.
pub(crate) fn hash_tokens(tokens: &[u32]) -> String {
    let mut hasher = StreamHasher::new();
    hasher.update(tokens);
    hasher.finish()
}

/// A dataset's fingerprint (`crate::data::Dataset::fingerprint`): the first 16 hex digits of
/// BLAKE3 over the window layout and the stream's content hash.
pub(super) fn dataset_fingerprint(
    stream_hash: &str,
    len: usize,
    seq_len: usize,
    n_train: usize,
    n_eval: usize,
) -> String {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"iota.dataset.v2");
    for n in [seq_len, n_train, n_eval, len] {
        hasher.update(&(n as u64).to_le_bytes());
    }
    hasher.update(stream_hash.as_bytes());
    hasher.finalize().to_hex().as_str()[..16].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunking_does_not_change_the_hash() {
        let tokens: Vec<u32> = (0..200_000u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        let mut pieces = StreamHasher::new();
        for piece in tokens.chunks(777) {
            pieces.update(piece);
        }
        assert_eq!(pieces.finish(), hash_tokens(&tokens));
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(
            hash_tokens(&tokens),
            blake3::hash(&bytes).to_hex().to_string()
        );
        assert_ne!(hash_tokens(&tokens[1..]), hash_tokens(&tokens));
    }
}
