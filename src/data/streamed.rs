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
//!
//! # Saved counts
//! Locating a sample of pass 0 needs the token counts of the blocks before it. A reader that
//! restarts can take them from a file ([`Streamed::keep_counts`], `stream_counts.rs`) instead
//! of tokenizing those blocks again; the file is kept up to date as blocks are counted.

use std::path::Path;
use std::sync::Arc;

use super::pool::{PoolStats, TokenPool};
use super::source::LocalFiles;
use super::stream_counts::{self, CountsKey, SavedCounts};
use super::stream_hash::{dataset_fingerprint, hash_tokens};
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
    /// What the blocks' counts depend on, for a count file.
    counts_key: CountsKey,
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
            dataset_fingerprint(&hash_tokens(&first), first.len(), seq_len, n_train, n_eval)
        } else {
            listing_fingerprint(source, &first, seq_len, settings.block_shards)?
        };
        let counts_key = CountsKey::of(source, tokenizer, settings.block_shards, &first)?;
        pool.serving();
        Ok(Self {
            pool,
            seq_len,
            seed,
            eval,
            n_eval,
            fingerprint,
            counts_key,
        })
    }

    /// Takes the block counts saved at `path` when they were written for this source, and
    /// keeps that file up to date from now on (rewritten, atomically, each time a block is
    /// counted). A file written for another source, damaged, or unreadable is ignored with
    /// the reason logged, and the blocks are counted again; a file that cannot be written is
    /// logged and the run goes on (the counts stay in memory).
    pub(crate) fn keep_counts(&self, path: &Path) -> SavedCounts {
        let saved = match stream_counts::read(path, &self.counts_key) {
            Ok(None) => SavedCounts::Missing,
            Ok(Some(counts)) => {
                let known = counts.iter().flatten().count();
                self.pool.preload(&counts);
                tracing::info!(file = %path.display(), known, blocks = self.blocks(), "saved block counts taken");
                SavedCounts::Loaded {
                    known,
                    blocks: self.blocks(),
                }
            }
            Err(reason) => {
                tracing::warn!(%reason, "saved block counts ignored; the blocks are counted again");
                SavedCounts::Ignored { reason }
            }
        };
        let (path, key) = (path.to_path_buf(), self.counts_key.clone());
        self.pool.on_count(Box::new(move |counts| {
            if let Err(reason) = stream_counts::write(&path, &key, counts) {
                tracing::warn!(%reason, "block counts not saved");
            }
        }));
        saved
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

    /// The `seq_len + 1` tokens of window `window` of block `block`; `None` when the block
    /// is shorter than its known count said (a saved count that was wrong: making the block
    /// has now corrected it).
    fn window(&self, block: usize, window: usize) -> Option<Vec<u32>> {
        let start = window * self.seq_len;
        match self.pool.block(block) {
            Ok(tokens) => tokens
                .get(start..start + self.seq_len + 1)
                .map(<[u32]>::to_vec),
            // Only before serving can a block fail, and `open` serves once block 0 is read.
            Err(_) => Some(vec![0; self.seq_len + 1]),
        }
    }

    /// The tokens of sample `id`: located, then read. Reading makes the block if it is not in
    /// memory, which checks a saved count of it; if that moved the sample, it is read again
    /// where it is now.
    pub(crate) fn sample(&self, id: u64) -> Vec<u32> {
        let (_, mut located) = self.locate(id);
        for _ in 0..2 {
            let tokens = self.window(located.block, located.window);
            let (_, now) = self.locate(id);
            if let (Some(tokens), true) = (tokens, now == located) {
                return tokens;
            }
            located = now;
        }
        self.window(located.block, located.window)
            .unwrap_or_else(|| vec![0; self.seq_len + 1])
    }

    /// Training window `w`, numbered block by block.
    pub(crate) fn numbered_window(&self, w: usize) -> Option<Vec<u32>> {
        let located = self.find(w as u64)?;
        self.window(located.block, located.window).or_else(|| {
            let located = self.find(w as u64)?;
            self.window(located.block, located.window)
        })
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
pub(super) fn split_first(tokens: usize, seq_len: usize) -> (usize, usize) {
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
        let size = std::fs::metadata(path)
            .map_err(|error| DataError::io(path, error))?
            .len();
        hasher.update(source.name_of(path).as_bytes());
        hasher.update(&[0]);
        hasher.update(&size.to_le_bytes());
    }
    hasher.update(hash_tokens(first).as_bytes());
    Ok(hasher.finalize().to_hex().as_str()[..16].to_owned())
}
