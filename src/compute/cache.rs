//! Forward inputs kept on the host until their backward arrives.
//!
//! Backend-agnostic (plain vectors), so the cache neither pins device memory nor depends on
//! burn. Bounded: when full, inserting evicts the oldest entry, whose backward the
//! orchestrator will not give this miner anyway (it caps forwards in flight per miner at the
//! same bound), so the sample is dropped there with a recorded reason.

use std::collections::VecDeque;

/// The input a section received for one sample.
#[derive(Debug, Clone, PartialEq)]
pub enum CachedInput {
    /// Token ids `[batch, seq]` (head).
    Tokens {
        /// Row-major ids.
        ids: Vec<u32>,
        /// `[batch, seq]`.
        shape: [usize; 2],
    },
    /// Activations `[batch, seq, width]`.
    Hidden {
        /// Row-major values.
        data: Vec<f32>,
        /// `[batch, seq, width]`.
        shape: [usize; 3],
        /// The sample's token ids `[batch, seq]`, for a section that re-embeds them.
        tokens: Option<Vec<u32>>,
    },
}

/// A bounded map sample id -> input, evicting the oldest insert first.
#[derive(Debug, Clone)]
pub struct InputCache {
    capacity: usize,
    entries: VecDeque<(u64, CachedInput)>,
    evicted: u64,
}

impl InputCache {
    /// An empty cache holding at most `capacity` inputs (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            entries: VecDeque::new(),
            evicted: 0,
        }
    }

    /// Inputs held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Most inputs held.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entries evicted because the cache was full.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Free slots.
    pub fn free(&self) -> usize {
        self.capacity - self.entries.len()
    }

    /// Stores the input of `sample` (replacing an older one of the same sample), evicting the
    /// oldest entry when full. Returns the evicted sample id, if any.
    pub fn insert(&mut self, sample: u64, input: CachedInput) -> Option<u64> {
        self.entries.retain(|(s, _)| *s != sample);
        let mut evicted = None;
        if self.entries.len() >= self.capacity {
            evicted = self.entries.pop_front().map(|(s, _)| s);
            self.evicted += 1;
        }
        self.entries.push_back((sample, input));
        evicted
    }

    /// Removes and returns the input of `sample`.
    pub fn take(&mut self, sample: u64) -> Option<CachedInput> {
        let pos = self.entries.iter().position(|(s, _)| *s == sample)?;
        self.entries.remove(pos).map(|(_, input)| input)
    }

    /// Forgets every cached input (their samples ended with the epoch).
    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(v: u32) -> CachedInput {
        CachedInput::Tokens {
            ids: vec![v],
            shape: [1, 1],
        }
    }

    #[test]
    fn evicts_oldest_when_full_and_takes_by_sample() {
        let mut cache = InputCache::new(2);
        assert_eq!(cache.insert(10, tokens(1)), None);
        assert_eq!(cache.insert(11, tokens(2)), None);
        assert_eq!(cache.free(), 0);
        assert_eq!(cache.insert(12, tokens(3)), Some(10));
        assert_eq!(cache.evicted(), 1);
        assert_eq!(cache.take(10), None);
        assert_eq!(cache.take(12), Some(tokens(3)));
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.take(12), None);
    }

    #[test]
    fn reinserting_a_sample_replaces_it() {
        let mut cache = InputCache::new(2);
        cache.insert(5, tokens(1));
        cache.insert(5, tokens(2));
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.take(5), Some(tokens(2)));
        assert!(InputCache::new(0).capacity() == 1);
    }
}
