//! The built-in synthetic corpus: a seeded order-2 Markov source over 32 printable ASCII
//! symbols, whose entropy rate is computed exactly so a run can report how far its loss is from
//! the best achievable.
//!
//! # Construction
//! For every context of two symbols `(a, b)` the seed picks 2 to 6 allowed next symbols and
//! integer weights for them. Two rules make the pair chain have a single recurrent class and
//! period 1, so its stationary distribution is unique and power iteration converges:
//! - every context `(a, b)` allows `succ(b)`, the next symbol in the alphabet's cyclic order,
//!   so from any pair the walk can reach the cycle of pairs `(x, succ(x))`, which visits all;
//! - the contexts `(pred(' '), ' ')` and `(' ', ' ')` allow `' '`, so the pair `(' ', ' ')`,
//!   reachable from that cycle, has a self-loop.
//!
//! The entropy rate is `H = sum over contexts c of pi(c) * H(next | c)` nats per symbol, with
//! `pi` the stationary distribution of the pair chain. With the byte tokenizer one symbol is
//! one token, so `H` is the loss floor in nats per token.

use rand_chacha::ChaCha20Rng;

use super::seed::{below, seeded_rng};
use super::source::{Documents, TextSource};

/// The 32 symbols of the synthetic corpus, in their cyclic order.
pub const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz .,;!\n";

/// Number of symbols.
const K: usize = ALPHABET.len();

/// Index of the space symbol in [`ALPHABET`].
const SPACE: usize = 26;

/// Fewest and most allowed next symbols per context.
const MIN_CHOICES: u32 = 2;
const MAX_CHOICES: u32 = 6;

/// Symbols generated and thrown away before the text starts, so it starts near stationarity.
const BURN_IN: usize = 4096;

/// A seeded order-2 Markov text source with a known entropy rate.
#[derive(Clone, Debug)]
pub struct MarkovCorpus {
    /// The seed that fixed the table and drives the text.
    seed: u64,
    /// Symbols per generated text.
    chars: usize,
    /// Allowed next symbols per context `a * K + b`: (symbol index, integer weight).
    table: Vec<Vec<(u8, u32)>>,
    /// Stationary probability of each context `a * K + b`.
    stationary: Vec<f64>,
    /// Entropy rate, nats per symbol.
    rate: f64,
    /// `H(X[t+1] | X[t])` under stationarity, nats: the best loss with only one symbol of context.
    first_order: f64,
}

impl MarkovCorpus {
    /// Builds the source for `seed`, generating `chars` symbols per text.
    pub fn new(seed: u64, chars: usize) -> Self {
        let table = build_table(seed);
        let stationary = stationary_distribution(&table);
        let rate = entropy_rate(&table, &stationary);
        let first_order = first_order_entropy(&stationary);
        Self {
            seed,
            chars,
            table,
            stationary,
            rate,
            first_order,
        }
    }

    /// The entropy rate in nats per symbol (= per byte token).
    pub fn entropy_rate(&self) -> f64 {
        self.rate
    }

    /// The best achievable mean loss over a window whose targets are tokens `1..=seq_len`
    /// predicted from the tokens before them: the first target has one symbol of context
    /// (entropy `H(X2|X1)`), every later one at least two (the entropy rate), so the floor is
    /// `(H(X2|X1) + (seq_len - 1) * rate) / seq_len`. Equals the rate for large `seq_len`.
    pub fn window_floor(&self, seq_len: usize) -> f64 {
        if seq_len == 0 {
            return self.rate;
        }
        let n = seq_len as f64;
        (self.first_order + (n - 1.0) * self.rate) / n
    }

    /// The stationary probability of the context `(a, b)` (indices into [`ALPHABET`]), 0 when
    /// either is out of range.
    pub fn context_probability(&self, a: usize, b: usize) -> f64 {
        if a >= K || b >= K {
            return 0.0;
        }
        self.stationary.get(a * K + b).copied().unwrap_or(0.0)
    }

    /// Generates the text: [`Self::new`]'s `chars` symbols, the same for the same seed.
    pub fn generate(&self) -> String {
        let mut rng = seeded_rng("synthetic.text", &[self.seed]);
        let (mut a, mut b) = (SPACE, SPACE);
        for _ in 0..BURN_IN {
            let c = self.step(&mut rng, a, b);
            (a, b) = (b, c);
        }
        let mut out = Vec::with_capacity(self.chars);
        for _ in 0..self.chars {
            let c = self.step(&mut rng, a, b);
            out.push(ALPHABET[c]);
            (a, b) = (b, c);
        }
        // Every byte comes from ALPHABET, which is ASCII.
        out.into_iter().map(char::from).collect()
    }

    /// Draws the symbol after context `(a, b)`.
    fn step(&self, rng: &mut ChaCha20Rng, a: usize, b: usize) -> usize {
        let choices = &self.table[a * K + b];
        let total: u32 = choices.iter().map(|&(_, w)| w).sum();
        let mut r = below(rng, total);
        for &(symbol, weight) in choices {
            if r < weight {
                return usize::from(symbol);
            }
            r -= weight;
        }
        // Unreachable: r < total = sum of weights.
        choices.last().map_or(SPACE, |&(s, _)| usize::from(s))
    }
}

/// The synthetic corpus as a [`TextSource`]: one document, the whole generated text.
///
/// A single document means no end-of-text tokens, so the packed stream is exactly the Markov
/// chain and its entropy floor holds.
#[derive(Clone, Debug)]
pub struct SyntheticSource {
    /// The generator.
    corpus: MarkovCorpus,
}

impl SyntheticSource {
    /// The source for `seed` with `chars` symbols.
    pub fn new(seed: u64, chars: usize) -> Self {
        Self {
            corpus: MarkovCorpus::new(seed, chars),
        }
    }

    /// The underlying generator (for its entropy figures).
    pub fn corpus(&self) -> &MarkovCorpus {
        &self.corpus
    }
}

impl TextSource for SyntheticSource {
    fn describe(&self) -> String {
        format!(
            "synthetic order-2 Markov text (seed {}, {} chars, entropy rate {:.4} nats/char)",
            self.corpus.seed, self.corpus.chars, self.corpus.rate
        )
    }

    fn documents(&self) -> Documents<'_> {
        Box::new(std::iter::once(Ok(self.corpus.generate())))
    }
}

/// The seeded transition table: for each context, its allowed next symbols and weights.
fn build_table(seed: u64) -> Vec<Vec<(u8, u32)>> {
    let mut rng = seeded_rng("synthetic.table", &[seed]);
    let mut table = Vec::with_capacity(K * K);
    for a in 0..K {
        for b in 0..K {
            let count = (MIN_CHOICES + below(&mut rng, MAX_CHOICES - MIN_CHOICES + 1)) as usize;
            let mut allowed = vec![(b + 1) % K];
            let before_space = (SPACE + K - 1) % K;
            if b == SPACE && (a == before_space || a == SPACE) && !allowed.contains(&SPACE) {
                allowed.push(SPACE);
            }
            while allowed.len() < count {
                let c = below(&mut rng, K as u32) as usize;
                if !allowed.contains(&c) {
                    allowed.push(c);
                }
            }
            allowed.sort_unstable();
            // Weights 1..=16: skewed enough that the floor sits well under ln(choices).
            let row = allowed
                .into_iter()
                .map(|c| (c as u8, 1 + below(&mut rng, 16)))
                .collect();
            table.push(row);
        }
    }
    table
}

/// The stationary distribution of the pair chain `(a, b) -> (b, c)`, by power iteration from
/// the uniform distribution (transient pairs drain to zero).
fn stationary_distribution(table: &[Vec<(u8, u32)>]) -> Vec<f64> {
    let mut pi = vec![1.0 / (K * K) as f64; K * K];
    let mut next = vec![0.0; K * K];
    for _ in 0..100_000 {
        next.iter_mut().for_each(|p| *p = 0.0);
        for (context, row) in table.iter().enumerate() {
            let b = context % K;
            let total: u32 = row.iter().map(|&(_, w)| w).sum();
            for &(c, w) in row {
                next[b * K + usize::from(c)] += pi[context] * f64::from(w) / f64::from(total);
            }
        }
        let change: f64 = pi.iter().zip(&next).map(|(p, q)| (p - q).abs()).sum();
        std::mem::swap(&mut pi, &mut next);
        if change < 1e-14 {
            break;
        }
    }
    pi
}

/// `sum over contexts of pi(context) * H(next | context)`, nats.
fn entropy_rate(table: &[Vec<(u8, u32)>], stationary: &[f64]) -> f64 {
    table
        .iter()
        .zip(stationary)
        .map(|(row, &p)| {
            let total: f64 = row.iter().map(|&(_, w)| f64::from(w)).sum();
            let h: f64 = row
                .iter()
                .map(|&(_, w)| {
                    let q = f64::from(w) / total;
                    -q * q.ln()
                })
                .sum();
            p * h
        })
        .sum()
}

/// `H(X[t+1] | X[t]) = H(pair) - H(single)` under the stationary pair distribution.
fn first_order_entropy(stationary: &[f64]) -> f64 {
    let plogp = |p: f64| if p > 0.0 { -p * p.ln() } else { 0.0 };
    let pair: f64 = stationary.iter().copied().map(plogp).sum();
    let single: f64 = (0..K)
        .map(|a| plogp(stationary[a * K..(a + 1) * K].iter().sum()))
        .sum();
    pair - single
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Plug-in estimate of `H(next | previous `order` symbols)` from a text, nats.
    fn empirical_conditional_entropy(text: &[u8], order: usize) -> f64 {
        let mut counts: HashMap<&[u8], HashMap<u8, usize>> = HashMap::new();
        for w in text.windows(order + 1) {
            *counts
                .entry(&w[..order])
                .or_default()
                .entry(w[order])
                .or_default() += 1;
        }
        let n = (text.len() - order) as f64;
        counts
            .values()
            .map(|next| {
                let m: usize = next.values().sum();
                let h: f64 = next
                    .values()
                    .map(|&c| {
                        let q = c as f64 / m as f64;
                        -q * q.ln()
                    })
                    .sum();
                m as f64 / n * h
            })
            .sum()
    }

    #[test]
    fn computed_rate_matches_empirical_entropy() {
        let corpus = MarkovCorpus::new(0, 2_000_000);
        let text = corpus.generate();
        let empirical2 = empirical_conditional_entropy(text.as_bytes(), 2);
        let rate = corpus.entropy_rate();
        assert!(
            (empirical2 - rate).abs() / rate < 0.01,
            "empirical {empirical2} vs computed {rate}"
        );
        let empirical1 = empirical_conditional_entropy(text.as_bytes(), 1);
        let first = corpus.window_floor(1);
        assert!(
            (empirical1 - first).abs() / first < 0.01,
            "empirical {empirical1} vs computed {first}"
        );
        // Empirical stationary frequency of one frequent context matches too.
        let (a, b) = (SPACE, SPACE);
        let hits = text.as_bytes().windows(2).filter(|w| w == b"  ").count() as f64;
        let p = corpus.context_probability(a, b);
        assert!(p > 0.0);
        let freq = hits / (text.len() - 1) as f64;
        assert!((freq - p).abs() < 0.1 * p + 1e-4, "freq {freq} vs pi {p}");
    }

    #[test]
    fn floor_is_well_below_uniform_loss() {
        for seed in 0..4 {
            let corpus = MarkovCorpus::new(seed, 0);
            let rate = corpus.entropy_rate();
            assert!((0.9..1.6).contains(&rate), "seed {seed}: rate {rate}");
            assert!(rate < 256f64.ln() / 3.0);
            // Stationary distribution sums to one.
            let total: f64 = (0..K)
                .flat_map(|a| (0..K).map(move |b| (a, b)))
                .map(|(a, b)| corpus.context_probability(a, b))
                .sum();
            assert!((total - 1.0).abs() < 1e-9, "{total}");
        }
    }

    #[test]
    fn window_floor_interpolates_between_first_order_and_rate() {
        let corpus = MarkovCorpus::new(3, 0);
        let rate = corpus.entropy_rate();
        let first = corpus.window_floor(1);
        assert!(first > rate);
        let expected = (first + 127.0 * rate) / 128.0;
        assert!((corpus.window_floor(128) - expected).abs() < 1e-12);
        assert!((corpus.window_floor(1_000_000) - rate).abs() < 1e-5);
    }

    #[test]
    fn generation_is_deterministic_per_seed() {
        let a = MarkovCorpus::new(7, 10_000).generate();
        let b = MarkovCorpus::new(7, 10_000).generate();
        let c = MarkovCorpus::new(8, 10_000).generate();
        assert_eq!(a.len(), 10_000);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.bytes().all(|byte| ALPHABET.contains(&byte)));
        let source = SyntheticSource::new(7, 10_000);
        let docs: Vec<_> = source.documents().collect();
        assert_eq!(docs.len(), 1);
        assert_eq!(docs[0].as_deref().unwrap(), a);
    }
}
