//! Streamed raw shards: the block layout of windows and sample ids over a [`TokenPool`], so a
//! run serves samples after its first block is tokenized and never holds the whole corpus.
//!
//! # Layout
//! The files (in [`LocalFiles`] path order) are cut into blocks of `block_shards` consecutive
//! files; each block is packed on its own (as [`crate::data::pack_documents`] packs its files)
//! and cut into windows of `seq_len + 1` tokens at stride `seq_len` that never cross into
//! another block.
//! - Block 0 holds out its last ~2% of windows (at least one) for evaluation, exactly as the
//!   whole-corpus layout holds out the last 2% of the corpus; every other block is all
//!   training windows. The held-out windows are thus known as soon as block 0 is tokenized.
//! - Training windows are numbered block by block. A pass (the whole-corpus layout's epoch)
//!   visits every training window once, block after block, each block's windows in the order
//!   of its own seeded permutation ([`EpochPermutation::for_block`]): sample `id` of pass `p`
//!   is offset `r` of the pass; the block whose window range holds `r` gives its window.
//!   Pass 0 needs only the blocks before the sample's; the pass of an id past pass 0 needs
//!   every block's count, known once pass 0 has been read.
//!
//! A source of at most `block_shards` files is one block, and then the tokens, windows,
//! held-out split, sample ids and fingerprint are exactly the whole-corpus layout's. With
//! more blocks the shuffle is within a block, not over the corpus: consecutive samples come
//! from the same few shards, which suits shards that are each a random mix of documents
//! (FineWeb's) and not a corpus sorted by topic or source.

use std::sync::Arc;

use super::pool::{PoolStats, TokenPool};
use super::source::LocalFiles;
use super::stream_hash::hash_tokens;
use super::{DataError, EpochPermutation, Tokenizer};

/// Fraction of block 0's windows held out for evaluation: one in fifty, at least one (as
/// [`crate::data::Dataset`]'s whole-corpus split).
const EVAL_DIVISOR: usize = 50;

/// How a run reads raw shards as they are tokenized (the `data.stream` key of a run config).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct StreamSettings {
    /// Files per block: a block is shuffled as a whole, so all of it is held in memory.
    /// Part of the sample order: every party of a run must use the same value.
    #[serde(default = "default_block_shards")]
    pub block_shards: usize,
    /// Blocks tokenized ahead of the one being read. Not part of the sample order.
    #[serde(default = "default_ahead")]
    pub ahead: usize,
    /// Threads that tokenize. Not part of the sample order.
    #[serde(default = "default_threads")]
    pub threads: usize,
}

fn default_block_shards() -> usize {
    1
}

fn default_ahead() -> usize {
    2
}

fn default_threads() -> usize {
    2
}

impl Default for StreamSettings {
    fn default() -> Self {
        Self {
            block_shards: default_block_shards(),
            ahead: default_ahead(),
            threads: default_threads(),
        }
    }
}

/// Where a training window lives: its block, its index in the block, and its global number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Located {
    /// The block.
    pub block: usize,
    /// The window's index inside the block.
    pub window: usize,
    /// Training windows of the blocks before this one (so `first + window` numbers it).
    pub first: usize,
}

/// A raw source read through a [`TokenPool`] in the block layout (module docs).
pub(crate) struct Streamed {
    /// The blocks' tokens.
    pool: TokenPool,
    /// Input tokens per window.
    seq_len: usize,
    /// Seed of the blocks' permutations.
    seed: u64,
    /// Block 0's held-out tokens: `n_eval * seq_len + 1`.
    eval: Arc<[u32]>,
    /// Held-out windows (block 0's).
    n_eval: usize,
    /// The fingerprint: the whole-corpus one for a single block, else one over the listing.
    fingerprint: String,
}

impl Streamed {
    /// Starts the pool over `source` and waits for block 0 (the held-out windows and the first
    /// samples); the files of later blocks are tokenized in the background. Parquet shards'
    /// schemas are checked first, so a missing or wrong text column stops here, before
    /// anything is served.
    ///
    /// # Errors
    /// [`DataError::ZeroSeqLen`]; the first bad Parquet schema; any error reading or
    /// tokenizing block 0; [`DataError::TooFewTokens`] when block 0 has too few tokens for one
    /// training and one held-out window.
    pub(crate) fn open(
        source: &LocalFiles,
        tokenizer: &Tokenizer,
        seq_len: usize,
        seed: u64,
        settings: StreamSettings,
    ) -> Result<Self, DataError> {
        if seq_len == 0 {
            return Err(DataError::ZeroSeqLen);
        }
        super::parquet::check_schemas(source.files(), source.text_column())?;
        let pool = TokenPool::start(
            source,
            tokenizer,
            settings.block_shards,
            settings.ahead,
            settings.threads,
        )?;
        let first = pool.block(0)?;
        let needed = 2 * seq_len + 2;
        if first.len() < needed {
            return Err(DataError::TooFewTokens {
                source_name: format!("{} (block 0)", super::TextSource::describe(source)),
                found: first.len(),
                needed,
                window: seq_len + 1,
            });
        }
        let (n_train, n_eval) = split_first(first.len(), seq_len);
        let eval_offset = n_train * seq_len + 1;
        let eval: Arc<[u32]> = first[eval_offset..eval_offset + n_eval * seq_len + 1].into();
        let fingerprint = if pool.len() == 1 {
            super::dataset::fingerprint(&hash_tokens(&first), first.len(), seq_len, n_train, n_eval)
        } else {
            listing_fingerprint(source, &first, seq_len, settings.block_shards)?
        };
        pool.serving();
        Ok(Self {
            pool,
            seq_len,
            seed,
            eval,
            n_eval,
            fingerprint,
        })
    }

    /// Training windows of block `k` when it holds `tokens` tokens.
    fn train_windows(&self, k: usize, tokens: u64) -> usize {
        let tokens = usize::try_from(tokens).unwrap_or(usize::MAX);
        if k == 0 {
            split_first(tokens, self.seq_len).0
        } else {
            tokens.saturating_sub(1) / self.seq_len
        }
    }

    /// The block window of pass offset `r`, walking the blocks in order from the first
    /// (tokenizing those whose counts are unknown); `None` when `r` is past the pass.
    fn find(&self, r: u64) -> Option<Located> {
        let counts = self.pool.counts();
        let mut first = 0u64;
        for (k, count) in counts.into_iter().enumerate() {
            // After the pool started serving, a block is always made (a bad file is skipped).
            let count = match count {
                Some(count) => count,
                None => self.pool.count(k).unwrap_or(0),
            };
            let windows = self.train_windows(k, count) as u64;
            if r < first + windows {
                return Some(Located {
                    block: k,
                    window: (r - first) as usize,
                    first: first as usize,
                });
            }
            first += windows;
        }
        None
    }

    /// Training windows of a whole pass, when every block's count is known.
    fn pass_windows(&self) -> Option<u64> {
        self.pool
            .counts()
            .into_iter()
            .enumerate()
            .map(|(k, count)| count.map(|c| self.train_windows(k, c) as u64))
            .sum()
    }

    /// Where sample `id`'s window is (module docs), and its pass.
    pub(crate) fn locate(&self, id: u64) -> (u64, Located) {
        let total = match self.pass_windows() {
            Some(total) => total,
            None => match self.find(id) {
                Some(located) => return (0, self.permuted(0, located)),
                // Past pass 0: every count is known now.
                None => self.pass_windows().unwrap_or(1),
            },
        };
        let total = total.max(1);
        let (pass, r) = (id / total, id % total);
        // `r` is inside the pass, so some block holds it.
        let located = self.find(r).unwrap_or(Located {
            block: 0,
            window: 0,
            first: 0,
        });
        (pass, self.permuted(pass, located))
    }

    /// `located` with its window moved by the block's permutation of `pass`.
    fn permuted(&self, pass: u64, located: Located) -> Located {
        let count = self.pool.count(located.block).unwrap_or(0);
        let n = self.train_windows(located.block, count) as u64;
        let permutation = EpochPermutation::for_block(self.seed, located.block as u64, pass, n);
        let window = permutation.apply(located.window as u64).unwrap_or(0) as usize;
        Located { window, ..located }
    }

    /// The `seq_len + 1` tokens of window `window` of block `block`.
    pub(crate) fn window(&self, block: usize, window: usize) -> Vec<u32> {
        let start = window * self.seq_len;
        match self.pool.block(block) {
            Ok(tokens) => tokens[start..start + self.seq_len + 1].to_vec(),
            // Only before serving can a block fail, and `open` serves once block 0 is read.
            Err(_) => vec![0; self.seq_len + 1],
        }
    }

    /// Training window `w`, numbered block by block.
    pub(crate) fn numbered_window(&self, w: usize) -> Option<Vec<u32>> {
        let located = self.find(w as u64)?;
        Some(self.window(located.block, located.window))
    }

    /// Held-out window `i` of block 0.
    pub(crate) fn eval_window(&self, i: usize) -> &[u32] {
        let start = i * self.seq_len;
        &self.eval[start..start + self.seq_len + 1]
    }

    /// Held-out windows.
    pub(crate) fn num_eval_windows(&self) -> usize {
        self.n_eval
    }

    /// Training windows of the blocks tokenized so far (all of them once a pass was read).
    pub(crate) fn known_train_windows(&self) -> usize {
        self.pool
            .counts()
            .into_iter()
            .enumerate()
            .filter_map(|(k, count)| count.map(|c| self.train_windows(k, c)))
            .sum()
    }

    /// Tokens of the blocks tokenized so far.
    pub(crate) fn known_tokens(&self) -> usize {
        let tokens: u64 = self.pool.counts().into_iter().flatten().sum();
        usize::try_from(tokens).unwrap_or(usize::MAX)
    }

    /// Number of blocks.
    pub(crate) fn blocks(&self) -> usize {
        self.pool.len()
    }

    /// The fingerprint (see [`crate::data::Dataset::fingerprint`]).
    pub(crate) fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The pool's counters.
    pub(crate) fn stats(&self) -> PoolStats {
        self.pool.stats()
    }
}

/// Training and held-out windows of block 0 when it holds `tokens` tokens (the whole-corpus
/// split: each region holds `windows * seq_len + 1` tokens).
fn split_first(tokens: usize, seq_len: usize) -> (usize, usize) {
    let n_total = tokens.saturating_sub(2) / seq_len;
    let n_eval = (n_total / EVAL_DIVISOR).max(1);
    (n_total.saturating_sub(n_eval), n_eval)
}

/// The fingerprint of a source of several blocks: BLAKE3 over the layout, each file's name
/// and size, and block 0's tokens. It does not cover the later blocks' tokens (they are not
/// read yet), so parties should also compare sample hashes (the ledger does).
fn listing_fingerprint(
    source: &LocalFiles,
    first: &[u32],
    seq_len: usize,
    block_shards: usize,
) -> Result<String, DataError> {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"iota.dataset.stream.v1");
    for n in [seq_len, block_shards, source.files().len()] {
        hasher.update(&(n as u64).to_le_bytes());
    }
    for path in source.files() {
        let name = path.strip_prefix(source.root()).unwrap_or(path);
        let size = std::fs::metadata(path)
            .map_err(|error| DataError::io(path, error))?
            .len();
        hasher.update(name.as_os_str().as_encoded_bytes());
        hasher.update(&[0]);
        hasher.update(&size.to_le_bytes());
    }
    hasher.update(hash_tokens(first).as_bytes());
    Ok(hasher.finalize().to_hex().as_str()[..16].to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{DataSpec, Dataset, pack_documents};
    use std::collections::BTreeSet;
    use std::path::Path;

    /// Writes `files` text files of distinct documents (sizes vary from file to file).
    fn write_files(dir: &Path, files: usize) {
        for f in 0..files {
            let text: String = (0..20 + 7 * (f % 4))
                .map(|i| format!("file {f} line {i}: the quick brown fox. "))
                .collect();
            std::fs::write(dir.join(format!("{f:03}.txt")), text).unwrap();
        }
    }

    fn settings(block_shards: usize, ahead: usize) -> Option<StreamSettings> {
        Some(StreamSettings {
            block_shards,
            ahead,
            threads: 2,
        })
    }

    /// Each block's windows computed on their own: the block's files packed with
    /// `pack_documents`, cut at stride `seq`; block 0 without its held-out tail.
    fn expected_windows(dir: &Path, block_shards: usize, seq: usize) -> (Vec<Vec<u32>>, Vec<u32>) {
        let files = LocalFiles::open(dir).unwrap();
        let (mut train, mut eval) = (Vec::new(), Vec::new());
        for (k, block) in files.files().chunks(block_shards).enumerate() {
            let block_dir = tempfile::tempdir().unwrap();
            for path in block {
                std::fs::copy(path, block_dir.path().join(path.file_name().unwrap())).unwrap();
            }
            let source = LocalFiles::open(block_dir.path()).unwrap();
            let tokens = pack_documents(&source, &Tokenizer::byte()).unwrap();
            let windows = if k == 0 {
                let (n_train, n_eval) = split_first(tokens.len(), seq);
                let at = n_train * seq + 1;
                eval = tokens[at..at + n_eval * seq + 1].to_vec();
                n_train
            } else {
                (tokens.len() - 1) / seq
            };
            train.extend((0..windows).map(|w| tokens[w * seq..w * seq + seq + 1].to_vec()));
        }
        (train, eval)
    }

    #[test]
    fn one_block_is_exactly_the_whole_corpus_layout() {
        let dir = tempfile::tempdir().unwrap();
        write_files(dir.path(), 3);
        let spec = DataSpec::path(dir.path());
        let whole = Dataset::load(&spec, &Tokenizer::byte(), 16, 7).unwrap();
        let streamed =
            Dataset::load_with(&spec, &Tokenizer::byte(), 16, 7, settings(3, 1)).unwrap();
        assert!(streamed.stream_stats().is_some() && whole.stream_stats().is_none());
        crate::data::dataset::tests::assert_twins(&streamed, &whole);
    }

    #[test]
    fn serving_starts_early_memory_stays_bounded_and_samples_repeat() {
        let dir = tempfile::tempdir().unwrap();
        let (files, seq, ahead) = (12, 16, 1);
        write_files(dir.path(), files);
        let spec = DataSpec::path(dir.path());
        let open = || Dataset::load_with(&spec, &Tokenizer::byte(), seq, 3, settings(1, ahead));
        let data = open().unwrap();
        // Served (sample 0 is there) with at most block 0 and `ahead` more tokenized.
        assert_eq!(data.train_sample(0).len(), seq + 1);
        let stats = data.stream_stats().unwrap();
        assert_eq!(stats.blocks, files);
        assert!(
            (1..=1 + ahead as u64).contains(&stats.tokenized),
            "{stats:?}"
        );

        // Pass 0 and half of pass 1: every pass is every training window once, and the pool
        // never holds more than `ahead + 2` blocks.
        let (expected, eval) = expected_windows(dir.path(), 1, seq);
        let n = expected.len() as u64;
        let mut stream = Vec::new();
        for id in 0..n + n / 2 {
            stream.push(data.train_sample(id).into_owned());
            let stats = data.stream_stats().unwrap();
            assert!(stats.resident <= ahead + 2, "{stats:?}");
        }
        assert_eq!(data.num_train_windows() as u64, n);
        let stats = data.stream_stats().unwrap();
        assert!(stats.max_resident <= ahead + 2, "{stats:?}");
        assert!(stats.skipped.is_empty());
        // Pass 1 began at block 0 again: blocks were made a second time, not kept.
        assert!(stats.tokenized > files as u64, "{stats:?}");
        let pass0: BTreeSet<&Vec<u32>> = stream[..n as usize].iter().collect();
        let all: BTreeSet<&Vec<u32>> = expected.iter().collect();
        assert_eq!(pass0, all);
        let pass0_ids: BTreeSet<usize> = (0..n).map(|id| data.train_window_index(id)).collect();
        assert_eq!(pass0_ids, (0..n as usize).collect());
        assert_eq!(data.epoch(n - 1), 0);
        assert_eq!(data.epoch(n), 1);
        for i in 0..data.num_eval_windows() {
            assert_eq!(*data.eval_sample(i), eval[i * seq..i * seq + seq + 1]);
        }
        // Within a block, shuffled; and a second pass orders it anew.
        assert_ne!(stream[..5], expected[..5]);
        assert_ne!(stream[..n as usize / 2], stream[n as usize..]);

        // A second run gives the same stream, read in another order (last ids first).
        let again = open().unwrap();
        for id in (0..n + n / 2).rev() {
            assert_eq!(*again.train_sample(id), stream[id as usize], "sample {id}");
        }
        assert_eq!(again.fingerprint(), data.fingerprint());
        assert!(again.stream_stats().unwrap().max_resident <= ahead + 2);
    }

    #[test]
    fn readers_far_apart_at_once_get_the_same_samples() {
        let dir = tempfile::tempdir().unwrap();
        write_files(dir.path(), 10);
        let spec = DataSpec::path(dir.path());
        let open = || Dataset::load_with(&spec, &Tokenizer::byte(), 16, 1, settings(1, 1));
        let alone = open().unwrap();
        let n = (expected_windows(dir.path(), 1, 16).0.len()) as u64;
        let stream: Vec<Vec<u32>> = (0..2 * n)
            .map(|id| alone.train_sample(id).to_vec())
            .collect();
        let shared = open().unwrap();
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let (shared, stream) = (&shared, &stream);
                scope.spawn(move || {
                    // Each reader walks its own quarter of two passes, so they ask for blocks
                    // far from each other's.
                    for id in (t * n / 2..(t + 1) * n / 2).step_by(3) {
                        assert_eq!(*shared.train_sample(id), stream[id as usize], "{id}");
                    }
                });
            }
        });
        // Four readers wait for at most four blocks beyond the cursor's range.
        assert!(shared.stream_stats().unwrap().max_resident <= 3 + 4);
    }

    #[test]
    fn a_bad_file_stops_block_0_and_is_skipped_later() {
        let dir = tempfile::tempdir().unwrap();
        write_files(dir.path(), 6);
        std::fs::write(
            dir.path().join("004.jsonl"),
            "{\"text\": \"ok\"}\n{broken\n",
        )
        .unwrap();
        let spec = DataSpec::path(dir.path());
        let data = Dataset::load_with(&spec, &Tokenizer::byte(), 16, 0, settings(2, 1)).unwrap();
        let n = (0..)
            .take_while(|&id| data.epoch(id) == 0)
            .inspect(|&id| assert_eq!(data.train_sample(id).len(), 17))
            .count();
        assert!(n > 0);
        let skipped = data.stream_stats().unwrap().skipped;
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        assert!(skipped[0].contains("004.jsonl:2:"), "{skipped:?}");

        std::fs::write(dir.path().join("000.jsonl"), "[1]\n").unwrap();
        let err = Dataset::load_with(&spec, &Tokenizer::byte(), 16, 0, settings(2, 1))
            .err()
            .unwrap();
        assert!(err.to_string().contains("000.jsonl:1:"), "{err}");
    }

    #[test]
    fn block_permutations_differ_and_block_0_keeps_the_whole_one() {
        let n = 300;
        let image = |p: EpochPermutation| (0..n).map(|i| p.apply(i).unwrap()).collect::<Vec<_>>();
        let whole = image(EpochPermutation::new(5, 2, n));
        assert_eq!(image(EpochPermutation::for_block(5, 0, 2, n)), whole);
        let one = image(EpochPermutation::for_block(5, 1, 2, n));
        assert_ne!(one, whole);
        assert_ne!(one, image(EpochPermutation::for_block(5, 2, 2, n)));
        let mut sorted = one.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..n).collect::<Vec<_>>());
    }
}
