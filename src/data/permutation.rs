//! Seeded permutations of `0..n` evaluated one index at a time, for sample-id lookup.
//!
//! A sample id must map to a window in constant time and without storing a shuffled array per
//! epoch, so the permutation is a small Feistel network on the smallest even number of bits
//! that covers `n`, with cycle walking: indices that land outside `0..n` are permuted again
//! until they land inside. A Feistel network is a bijection on its bit domain, so cycle walking
//! always terminates, stays a bijection on `0..n`, and takes fewer than four rounds of the
//! network on average (the domain is under `4 n`).

use rand_chacha::rand_core::Rng;

use super::seed::seeded_rng;

/// Feistel rounds; four rounds of a good mixing function make a well-shuffled permutation.
const ROUNDS: usize = 4;

/// A permutation of `0..n` fixed by `(seed, epoch)`.
#[derive(Clone, Debug)]
pub struct EpochPermutation {
    /// Size of the permuted range.
    n: u64,
    /// Bits in each Feistel half; the network permutes `0..4^half_bits`.
    half_bits: u32,
    /// Round keys drawn from ChaCha20 seeded by `(seed, epoch)`.
    keys: [u64; ROUNDS],
}

impl EpochPermutation {
    /// The permutation of `0..n` for `(seed, epoch)`. `n == 0` gives an empty permutation.
    pub fn new(seed: u64, epoch: u64, n: u64) -> Self {
        let mut half_bits = 1;
        while half_bits < 32 && (1u64 << (2 * half_bits)) < n {
            half_bits += 1;
        }
        let mut rng = seeded_rng("epoch.permutation", &[seed, epoch]);
        let keys = std::array::from_fn(|_| rng.next_u64());
        Self { n, half_bits, keys }
    }

    /// The permutation of `0..n` for block `block` of a streamed dataset in pass `epoch`
    /// (`crate::data::StreamSettings`): block 0 uses [`Self::new`]'s, so a source of one block
    /// orders its windows exactly as the whole-corpus layout does; every other block draws its
    /// own keys from `(seed, block, epoch)`.
    pub fn for_block(seed: u64, block: u64, epoch: u64, n: u64) -> Self {
        let mut permutation = Self::new(seed, epoch, n);
        if block > 0 {
            let mut rng = seeded_rng("block.permutation", &[seed, block, epoch]);
            permutation.keys = std::array::from_fn(|_| rng.next_u64());
        }
        permutation
    }

    /// The image of `i`, a value in `0..n`; `None` when `i >= n`.
    pub fn apply(&self, i: u64) -> Option<u64> {
        if i >= self.n {
            return None;
        }
        let mut x = i;
        loop {
            x = self.feistel(x);
            if x < self.n {
                return Some(x);
            }
        }
    }

    /// One pass of the Feistel network over `0..4^half_bits`.
    fn feistel(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (x >> self.half_bits, x & mask);
        for key in self.keys {
            let mixed = mix(right ^ key) & mask;
            (left, right) = (right, left ^ mixed);
        }
        (left << self.half_bits) | right
    }
}

/// SplitMix64's finalizer: a fast bijective mixer of 64 bits.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(p: &EpochPermutation, n: u64) -> Vec<u64> {
        (0..n).map(|i| p.apply(i).unwrap()).collect()
    }

    #[test]
    fn is_a_bijection_for_many_sizes() {
        for n in [1u64, 2, 3, 4, 5, 7, 16, 17, 100, 1000, 4097] {
            for epoch in 0..3 {
                let p = EpochPermutation::new(42, epoch, n);
                let mut values = image(&p, n);
                values.sort_unstable();
                assert_eq!(values, (0..n).collect::<Vec<_>>(), "n {n} epoch {epoch}");
                assert_eq!(p.apply(n), None);
            }
        }
    }

    #[test]
    fn deterministic_and_different_per_epoch_and_seed() {
        let n = 500;
        let a = image(&EpochPermutation::new(1, 0, n), n);
        assert_eq!(a, image(&EpochPermutation::new(1, 0, n), n));
        assert_ne!(a, image(&EpochPermutation::new(1, 1, n), n));
        assert_ne!(a, image(&EpochPermutation::new(2, 0, n), n));
        // Actually shuffled: few fixed points (expected about one).
        let fixed = a
            .iter()
            .enumerate()
            .filter(|&(i, &v)| i as u64 == v)
            .count();
        assert!(fixed < 10, "{fixed} fixed points");
    }

    #[test]
    fn empty_range_maps_nothing() {
        assert_eq!(EpochPermutation::new(0, 0, 0).apply(0), None);
    }

    #[test]
    fn huge_ranges_work() {
        let n = u64::MAX / 3;
        let p = EpochPermutation::new(9, 9, n);
        let v = p.apply(n - 1).unwrap();
        assert!(v < n);
    }
}
