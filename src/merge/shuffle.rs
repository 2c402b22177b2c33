//! A fully specified seeded shuffle, so that every party computes the same merge plan.
//!
//! General-purpose RNG crates do not promise the same output across versions (`rand` says so
//! explicitly), and a plan that two versions of iota compute differently would split the
//! network. So the random stream and the shuffle are written down here.
//!
//! # Format
//! - Stream: the BLAKE3 extendable output of `keyed_hash(key = seed, "iota merge shuffle")`,
//!   read 8 bytes at a time as little-endian `u64`s.
//! - Uniform draw in `0..n`: take `x` from the stream; reject while `x < 2^64 mod n`; return
//!   `x mod n` (unbiased).
//! - Shuffle (Fisher–Yates): for `i` from `len - 1` down to `1`, swap item `i` with item
//!   `draw(i + 1)`.

/// Deterministic random stream derived from a 32-byte seed (see the module's `# Format`).
pub struct SeededStream {
    reader: blake3::OutputReader,
}

impl SeededStream {
    /// Starts the stream for `seed`.
    pub fn new(seed: &[u8; 32]) -> Self {
        let mut hasher = blake3::Hasher::new_keyed(seed);
        hasher.update(b"iota merge shuffle");
        Self {
            reader: hasher.finalize_xof(),
        }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut bytes = [0u8; 8];
        self.reader.fill(&mut bytes);
        u64::from_le_bytes(bytes)
    }

    /// Uniform integer in `0..n`; returns 0 when `n` is 0 or 1 without consuming the stream.
    pub fn below(&mut self, n: usize) -> usize {
        if n <= 1 {
            return 0;
        }
        let n = n as u64;
        // 2^64 mod n, computed without 128-bit arithmetic.
        let threshold = n.wrapping_neg() % n;
        loop {
            let x = self.next_u64();
            if x >= threshold {
                return (x % n) as usize;
            }
        }
    }

    /// Shuffles `items` in place with Fisher–Yates driven by this stream.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_different_seed_differs() {
        let mut a = SeededStream::new(&[7; 32]);
        let mut b = SeededStream::new(&[7; 32]);
        let mut c = SeededStream::new(&[8; 32]);
        let xa: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        let xb: Vec<u64> = (0..4).map(|_| b.next_u64()).collect();
        let xc: Vec<u64> = (0..4).map(|_| c.next_u64()).collect();
        assert_eq!(xa, xb);
        assert_ne!(xa, xc);
    }

    #[test]
    fn stream_is_pinned_to_blake3() {
        // The stream is part of the wire contract: its first word is the first 8 bytes of the
        // keyed BLAKE3 hash of the label.
        let seed = [1u8; 32];
        let want = blake3::keyed_hash(&seed, b"iota merge shuffle");
        let mut first = [0u8; 8];
        first.copy_from_slice(&want.as_bytes()[..8]);
        assert_eq!(
            SeededStream::new(&seed).next_u64(),
            u64::from_le_bytes(first)
        );
    }

    #[test]
    fn below_stays_in_range_and_shuffle_is_a_permutation() {
        let mut s = SeededStream::new(&[3; 32]);
        assert!((0..1000).all(|_| s.below(7) < 7));
        assert_eq!(s.below(0), 0);
        let mut items: Vec<u32> = (0..50).collect();
        s.shuffle(&mut items);
        let mut sorted = items.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<u32>>());
        assert_ne!(items, sorted, "50 items should not stay in order");
    }

    #[test]
    fn below_covers_every_value() {
        let mut s = SeededStream::new(&[9; 32]);
        let mut seen = [false; 5];
        for _ in 0..200 {
            seen[s.below(5)] = true;
        }
        assert!(seen.iter().all(|&b| b));
    }
}
