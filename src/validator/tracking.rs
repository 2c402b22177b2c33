//! Which miners (and which partitions, which samples) a validator checks: drawn from a keyed
//! hash of the validator's own secret, so a miner cannot predict them (it would need the
//! validator's private key), while a restarted validator draws exactly the same ones again.

use crate::wallet::Hotkey;

/// A deterministic source of choices, secret to one validator.
#[derive(Clone)]
pub struct Chooser {
    key: [u8; 32],
}

impl std::fmt::Debug for Chooser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Chooser(..)")
    }
}

impl Chooser {
    /// Choices keyed by `hotkey`'s secret key (never revealed: only a hash derived from it
    /// is used).
    pub fn new(hotkey: &Hotkey) -> Self {
        Self {
            key: blake3::derive_key("iota validator choices v1", &hotkey.secret_key_bytes()[..]),
        }
    }

    /// A chooser from raw key material (tests and benchmarks).
    pub fn from_key(key: [u8; 32]) -> Self {
        Self { key }
    }

    /// A uniform-looking 64-bit draw for (`what`, `epoch`, `item`).
    pub fn draw(&self, what: &str, epoch: u64, item: &str) -> u64 {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(what.as_bytes());
        h.update(&[0]);
        h.update(&epoch.to_le_bytes());
        h.update(item.as_bytes());
        let bytes = h.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&bytes.as_bytes()[..8]);
        u64::from_le_bytes(first)
    }

    /// The `k` items of `items` with the smallest draws (a uniform sample without
    /// replacement), in the order of `items`.
    pub fn pick<'a>(
        &self,
        what: &str,
        epoch: u64,
        items: &'a [String],
        k: usize,
    ) -> Vec<&'a String> {
        let mut scored: Vec<(u64, usize)> = items
            .iter()
            .enumerate()
            .map(|(i, it)| (self.draw(what, epoch, it), i))
            .collect();
        scored.sort();
        let mut chosen: Vec<usize> = scored.into_iter().take(k).map(|(_, i)| i).collect();
        chosen.sort();
        chosen.into_iter().map(|i| &items[i]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_are_stable_per_key_and_differ_between_keys() {
        let items: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
        let a = Chooser::from_key([1; 32]);
        let b = Chooser::from_key([2; 32]);
        let pick_a = a.pick("replay", 3, &items, 3);
        assert_eq!(pick_a.len(), 3);
        assert_eq!(
            pick_a,
            Chooser::from_key([1; 32]).pick("replay", 3, &items, 3)
        );
        assert_ne!(pick_a, b.pick("replay", 3, &items, 3));
        assert_ne!(
            pick_a,
            a.pick("replay", 4, &items, 3),
            "a new epoch, a new draw"
        );
        assert_eq!(a.pick("replay", 3, &items, 50).len(), 20);
        // Over many epochs every miner gets tracked about equally often.
        let mut counts = vec![0; 20];
        for epoch in 0..2000 {
            for m in a.pick("replay", epoch, &items, 1) {
                counts[items.iter().position(|x| x == m).unwrap()] += 1;
            }
        }
        assert!(counts.iter().all(|c| (50..=150).contains(c)), "{counts:?}");
        let hk = Hotkey::from_uri("//Val1").unwrap();
        assert_eq!(
            Chooser::new(&hk).draw("x", 0, "y"),
            Chooser::new(&Hotkey::from_uri("//Val1").unwrap()).draw("x", 0, "y")
        );
    }
}
