//! [`RecentWrites`]: the objects a process stored most recently, kept in memory so that
//! reading them back costs no request and no copy.
//!
//! The orchestrator reads back much of what it has just stored: an upload it checks, the
//! same upload served to the section's mergers, the merged copies it verifies, the
//! checkpoint it measures the next uploads against. From a local directory each read zeroes
//! a buffer and copies the file into it; from a bucket it is a request. Kept here, a read is a
//! reference to the bytes already in memory (a slice of them for a range).
//!
//! Only what goes through the [`Storage`](super::Storage) holding the cache is kept, so the
//! cache is for a store that one process writes (the orchestrator's; miners write their own
//! keys through URLs the orchestrator hands out, never a key it stored itself). Every write,
//! copy and delete through that `Storage` updates it. It holds at most its byte budget, the
//! oldest entries leaving first; an entry larger than a quarter of the budget is not kept. An
//! entry is charged its bytes plus its bookkeeping ([`entry_cost`]): with only the bytes
//! counted, small objects (a `tiny` activation is tens of bytes) cost several times their
//! size in map entries and path copies, uncounted, and the orchestrator's live heap grew by
//! about 3.3 MiB per 1,000 samples under `iota bench orchestrator` (heaptrack, 2026-11-28).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use bytes::Bytes;

/// Recently stored objects by their full path in the backend, within a byte budget.
#[derive(Debug)]
pub struct RecentWrites {
    inner: Mutex<Inner>,
    budget: usize,
}

#[derive(Debug, Default)]
struct Inner {
    /// Ordered by path, so everything under a prefix is one range ([`RecentWrites::forget_under`]).
    objects: BTreeMap<String, Bytes>,
    /// Paths in the order they were stored (a path stored again appears again; the stale
    /// entry is skipped when it comes up for eviction).
    order: VecDeque<(String, u64)>,
    /// Version of each path's current entry, to tell stale entries of `order` apart.
    versions: HashMap<String, u64>,
    next: u64,
    held: usize,
}

impl RecentWrites {
    /// An empty cache holding at most `budget` bytes.
    pub fn new(budget: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            budget,
        }
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.lock().held
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the maps consistent (every update is a few
        // infallible map operations), so a poisoned lock is still usable.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records that `path` now holds `bytes` (replacing what it held). An entry costing over
    /// a quarter of the budget is forgotten instead.
    pub fn stored(&self, path: &str, bytes: Bytes) {
        let mut inner = self.lock();
        inner.remove(path);
        let cost = entry_cost(path, bytes.len());
        if cost > self.budget / 4 {
            return;
        }
        let version = inner.next;
        inner.next += 1;
        inner.held += cost;
        inner.objects.insert(path.to_string(), bytes);
        inner.versions.insert(path.to_string(), version);
        inner.order.push_back((path.to_string(), version));
        while inner.held > self.budget {
            let Some((oldest, version)) = inner.order.pop_front() else {
                break;
            };
            if inner.versions.get(&oldest) == Some(&version) {
                inner.remove(&oldest);
            }
        }
        // Stale entries (paths stored again or removed) are dropped as they reach the front;
        // compact when they make up most of the queue, so it stays bounded.
        if inner.order.len() > 2 * inner.objects.len() + 64 {
            let Inner {
                order, versions, ..
            } = &mut *inner;
            order.retain(|(p, v)| versions.get(p) == Some(v));
        }
    }

    /// Forgets `path` (deleted, or replaced by a write this cache cannot hold).
    pub fn forget(&self, path: &str) {
        self.lock().remove(path);
    }

    /// Forgets every object whose path starts with `prefix` (which should end with `/`, so
    /// that `a/1/` does not take `a/10/` along): objects that stay in the store but that
    /// nobody will read back soon, as a finished sample's activations.
    pub fn forget_under(&self, prefix: &str) {
        let mut inner = self.lock();
        let paths: Vec<String> = inner
            .objects
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(path, _)| path.starts_with(prefix))
            .map(|(path, _)| path.clone())
            .collect();
        for path in paths {
            inner.remove(&path);
        }
    }

    /// The object under `path`, if it is held.
    pub fn get(&self, path: &str) -> Option<Bytes> {
        self.lock().objects.get(path).cloned()
    }
}

/// Bookkeeping of one entry besides its bytes and path copies: the three maps' slots, the
/// `Bytes` and `String` headers, the version numbers (an estimate, on the high side).
const ENTRY_OVERHEAD: usize = 160;

/// What an entry of `len` bytes under `path` is charged against the budget: its bytes, the
/// path's three copies (object map, versions, order queue) and [`ENTRY_OVERHEAD`].
pub fn entry_cost(path: &str, len: usize) -> usize {
    len + 3 * path.len() + ENTRY_OVERHEAD
}

impl Inner {
    fn remove(&mut self, path: &str) {
        if let Some(old) = self.objects.remove(path) {
            self.held -= entry_cost(path, old.len());
        }
        self.versions.remove(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(n: usize, fill: u8) -> Bytes {
        Bytes::from(vec![fill; n])
    }

    #[test]
    fn a_stored_object_reads_back_until_replaced_or_forgotten() {
        let cache = RecentWrites::new(1000);
        assert_eq!(cache.get("a/b"), None);
        cache.stored("a/b", b(10, 1));
        assert_eq!(cache.get("a/b"), Some(b(10, 1)));
        cache.stored("a/b", b(20, 2));
        assert_eq!(cache.get("a/b"), Some(b(20, 2)));
        assert_eq!(cache.held(), entry_cost("a/b", 20));
        cache.forget("a/b");
        assert_eq!(cache.get("a/b"), None);
        assert_eq!(cache.held(), 0);
    }

    #[test]
    fn the_oldest_objects_leave_first_within_the_budget() {
        let one = entry_cost("k/0", 25);
        let cache = RecentWrites::new(4 * one);
        for i in 0..5 {
            cache.stored(&format!("k/{i}"), b(25, i));
        }
        // Five entries stored, four allowed: the first object left.
        assert_eq!(cache.get("k/0"), None);
        for i in 1..5 {
            assert_eq!(cache.get(&format!("k/{i}")), Some(b(25, i)), "k/{i}");
        }
        assert_eq!(cache.held(), 4 * one);
        // Storing k/1 again makes it the newest: k/2 leaves next, not k/1.
        cache.stored("k/1", b(25, 9));
        cache.stored("k/5", b(25, 5));
        assert_eq!(cache.get("k/2"), None);
        assert_eq!(cache.get("k/1"), Some(b(25, 9)));
        assert!(cache.held() <= 4 * one);
    }

    #[test]
    fn small_objects_are_charged_their_bookkeeping() {
        // 10,000 objects of 16 bytes: 160 KB of payload, but far more memory; the budget
        // holds the entries' whole cost.
        let budget = 1 << 20;
        let cache = RecentWrites::new(budget);
        for i in 0..10_000u32 {
            cache.stored(&format!("run/act/{i}/fwd"), b(16, 0));
        }
        assert!(cache.held() <= budget);
        let kept = cache.lock().objects.len();
        assert!(kept < 10_000 && kept > 1_000, "{kept}");
    }

    #[test]
    fn an_object_over_a_quarter_of_the_budget_is_not_kept_and_replaces_nothing_stale() {
        let cache = RecentWrites::new(1000);
        cache.stored("big", b(10, 1));
        assert_eq!(cache.get("big"), Some(b(10, 1)));
        cache.stored("big", b(100, 2));
        // The new, larger content is not held, and neither is the old one it replaced.
        assert_eq!(cache.get("big"), None);
        assert_eq!(cache.held(), 0);
    }

    #[test]
    fn forgetting_a_prefix_takes_only_what_is_under_it() {
        let cache = RecentWrites::new(1 << 20);
        for path in ["a/1/x", "a/1/y", "a/10/x", "a/2/x", "a/1"] {
            cache.stored(path, b(4, 0));
        }
        cache.forget_under("a/1/");
        assert_eq!(cache.get("a/1/x"), None);
        assert_eq!(cache.get("a/1/y"), None);
        for kept in ["a/10/x", "a/2/x", "a/1"] {
            assert!(cache.get(kept).is_some(), "{kept}");
        }
        let kept: usize = ["a/10/x", "a/2/x", "a/1"]
            .iter()
            .map(|p| entry_cost(p, 4))
            .sum();
        assert_eq!(cache.held(), kept);
    }

    #[test]
    fn the_order_queue_stays_bounded_when_the_same_keys_are_stored_again() {
        let cache = RecentWrites::new(1 << 20);
        for round in 0..10_000u32 {
            cache.stored(&format!("k/{}", round % 3), b(1, 0));
        }
        let inner = cache.lock();
        assert_eq!(inner.objects.len(), 3);
        assert!(inner.order.len() <= 2 * 3 + 64 + 1, "{}", inner.order.len());
    }
}
