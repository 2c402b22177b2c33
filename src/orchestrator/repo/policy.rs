//! The standing policy: how penalties act on routing and when a silent miner loses its seat
//! (applied by `standing`, held by the store).

/// The standing policy (run config `penalties` and `miner_ttl_s`), in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// Back-off after the first strike; doubles with each further one.
    pub backoff_ms: u64,
    /// Strikes in a row that exclude a miner.
    pub exclude_after: u32,
    /// How long an exclusion lasts.
    pub exclusion_ms: u64,
    /// A miner not seen for this long no longer holds a seat in its section.
    pub miner_ttl_ms: u64,
    /// A miner that has had no result accepted holds its seat this long after registering.
    pub claim_ms: u64,
}

impl Default for Standing {
    fn default() -> Self {
        Self {
            backoff_ms: 10_000,
            exclude_after: 3,
            exclusion_ms: 600_000,
            miner_ttl_ms: 60_000,
            claim_ms: 30_000,
        }
    }
}

impl Standing {
    /// How long the miner is kept from new work after its `strikes`-th strike, and whether
    /// that is an exclusion.
    pub fn penalty_for(&self, strikes: u32) -> (u64, bool) {
        if strikes >= self.exclude_after {
            (self.exclusion_ms, true)
        } else {
            let doubling = 1u64 << strikes.saturating_sub(1).min(20);
            (self.backoff_ms.saturating_mul(doubling), false)
        }
    }
}
