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
//! oldest entries leaving first; an object larger than a quarter of the budget is not kept.

use std::collections::{HashMap, VecDeque};
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
    objects: HashMap<String, Bytes>,
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

    /// Records that `path` now holds `bytes` (replacing what it held). An object over a
    /// quarter of the budget is forgotten instead.
    pub fn stored(&self, path: &str, bytes: Bytes) {
        let mut inner = self.lock();
        inner.remove(path);
        if bytes.len() > self.budget / 4 {
            return;
        }
        let version = inner.next;
        inner.next += 1;
        inner.held += bytes.len();
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

    /// The object under `path`, if it is held.
    pub fn get(&self, path: &str) -> Option<Bytes> {
        self.lock().objects.get(path).cloned()
    }
}

impl Inner {
    fn remove(&mut self, path: &str) {
        if let Some(old) = self.objects.remove(path) {
            self.held -= old.len();
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
        assert_eq!(cache.held(), 20);
        cache.forget("a/b");
        assert_eq!(cache.get("a/b"), None);
        assert_eq!(cache.held(), 0);
    }

    #[test]
    fn the_oldest_objects_leave_first_within_the_budget() {
        let cache = RecentWrites::new(100);
        for i in 0..5 {
            cache.stored(&format!("k/{i}"), b(25, i));
        }
        // 125 bytes stored, 100 allowed: the first object left.
        assert_eq!(cache.get("k/0"), None);
        for i in 1..5 {
            assert_eq!(cache.get(&format!("k/{i}")), Some(b(25, i)), "k/{i}");
        }
        assert_eq!(cache.held(), 100);
        // Storing k/1 again makes it the newest: k/2 leaves next, not k/1.
        cache.stored("k/1", b(25, 9));
        cache.stored("k/5", b(25, 5));
        assert_eq!(cache.get("k/2"), None);
        assert_eq!(cache.get("k/1"), Some(b(25, 9)));
        assert!(cache.held() <= 100);
    }

    #[test]
    fn an_object_over_a_quarter_of_the_budget_is_not_kept_and_replaces_nothing_stale() {
        let cache = RecentWrites::new(100);
        cache.stored("big", b(10, 1));
        cache.stored("big", b(26, 2));
        // The new, larger content is not held, and neither is the old one it replaced.
        assert_eq!(cache.get("big"), None);
        assert_eq!(cache.held(), 0);
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
