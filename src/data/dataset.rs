//! `Dataset`: a packed token stream cut into training and evaluation windows, with the
//! deterministic map from sample ids to training windows.
//!
//! # Windows
//! Window `w` is the `seq_len + 1` tokens starting at `w * seq_len`: consecutive windows share
//! one token (the last target of one is the first input of the next), so every token after the
//! first is a target exactly once per epoch. The last ~2% of the windows (at least one) are
//! held out for evaluation; the held-out region starts at the token after the last training
//! window's final token (rather than sharing it), so no token position is in both.
//!
//! # Sample ids
//! Sample `id` belongs to epoch `id / n_train` and is training window
//! `perm(seed, epoch)[id % n_train]`, where `perm` is a seeded permutation
//! ([`EpochPermutation`]). So anyone holding the same data, tokenizer, `seq_len` and seed can
//! re-derive any sample from its id alone, and each epoch visits every training window once.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use super::permutation::EpochPermutation;
use super::pool::PoolStats;
use super::prepared::{PreparedTokens, is_prepared};
use super::stream_counts::SavedCounts;
use super::stream_hash::{dataset_fingerprint, hash_tokens};
use super::streamed::{StreamSettings, Streamed};
use super::synthetic::SyntheticSource;
use super::{DataError, DataSpec, Tokenizer, pack_documents};

/// Fraction of the windows held out for evaluation: one in fifty (2%), at least one.
const EVAL_DIVISOR: usize = 50;

/// Where a dataset's packed token stream lives.
#[derive(Clone)]
enum Tokens {
    /// Packed in memory from raw text.
    Memory(Arc<[u32]>),
    /// Prepared token shards, read in place.
    Prepared(Arc<PreparedTokens>),
}

impl Tokens {
    /// Tokens in the stream.
    fn len(&self) -> usize {
        match self {
            Self::Memory(tokens) => tokens.len(),
            Self::Prepared(tokens) => tokens.len(),
        }
    }

    /// The `len` tokens from `start` (inside the stream).
    fn read(&self, start: usize, len: usize) -> Cow<'_, [u32]> {
        match self {
            Self::Memory(tokens) => Cow::Borrowed(&tokens[start..start + len]),
            Self::Prepared(tokens) => Cow::Owned(tokens.read(start, len)),
        }
    }
}

/// Tokens of packed text, windowed for training and evaluation. Cheap to clone (the tokens are
/// shared).
///
/// The stream is packed in memory from raw text, or read in place from a directory of
/// prepared token shards (`iota data prepare`); a prepared directory gives the same stream,
/// and so the same windows and samples, as the raw files it was prepared from. Raw shards can
/// also be streamed ([`Dataset::load_with`] with [`StreamSettings`]): tokenized a block of
/// files at a time in a bounded background pool, in the block layout (`streamed.rs`).
#[derive(Clone)]
pub struct Dataset {
    /// The windows.
    body: Body,
    /// Tokens of input per window; windows hold `seq_len + 1`.
    seq_len: usize,
    /// Seed of the per-epoch permutations.
    seed: u64,
    /// Loss floor in nats per token, when the source's entropy is known.
    entropy_floor: Option<f64>,
    /// Where the tokens came from, for logs.
    source_name: String,
    /// The tokenizer's fingerprint, for logs and consistency checks.
    tokenizer: String,
}

/// How a dataset's windows are laid out and where their tokens are.
#[derive(Clone)]
enum Body {
    /// One packed stream, windowed as a whole (module docs).
    Whole(Whole),
    /// Raw shards in blocks, tokenized as they are needed (`streamed.rs`).
    Streamed(Arc<Streamed>),
}

/// The whole-stream layout.
#[derive(Clone)]
struct Whole {
    /// The packed token stream.
    tokens: Tokens,
    /// Number of training windows (at least 1).
    n_train: usize,
    /// Number of evaluation windows (at least 1).
    n_eval: usize,
    /// Token offset of the first evaluation window.
    eval_offset: usize,
    /// BLAKE3 of the tokens and the window layout; see [`Dataset::fingerprint`].
    fingerprint: String,
}

impl Dataset {
    /// Reads, tokenizes and packs the data of `spec`, then windows it. A path to a prepared
    /// directory (one holding [`crate::data::MANIFEST_FILE`]) is read in place instead, with
    /// no tokenizing; its tokenizer must be `tokenizer`.
    ///
    /// # Errors
    /// [`DataError::ZeroSeqLen`]; any error of the source or tokenizer; those of
    /// [`PreparedTokens::open`] for a prepared directory;
    /// [`DataError::NoDocuments`] and [`DataError::TooFewTokens`] when there is not enough
    /// text for one training and one evaluation window.
    pub fn load(
        spec: &DataSpec,
        tokenizer: &Tokenizer,
        seq_len: usize,
        seed: u64,
    ) -> Result<Self, DataError> {
        Self::load_with(spec, tokenizer, seq_len, seed, None)
    }

    /// [`Self::load`], with raw shards streamed when `stream` is given: a path of raw files
    /// is then tokenized a block at a time in a bounded background pool, and this returns
    /// once block 0 is tokenized (the synthetic corpus and prepared directories are read as
    /// [`Self::load`] reads them; `stream` does not apply to them).
    ///
    /// # Errors
    /// As [`Self::load`]; for a streamed source, any Parquet shard without the text column as
    /// strings, and the errors of block 0 only (a bad file of a later block is skipped with a
    /// logged reason, [`Self::stream_stats`]).
    pub fn load_with(
        spec: &DataSpec,
        tokenizer: &Tokenizer,
        seq_len: usize,
        seed: u64,
        stream: Option<StreamSettings>,
    ) -> Result<Self, DataError> {
        if seq_len == 0 {
            return Err(DataError::ZeroSeqLen);
        }
        let (tokens, source_name, floor) = match spec {
            DataSpec::Synthetic {
                seed: data_seed,
                chars,
            } => {
                let source = SyntheticSource::new(*data_seed, *chars);
                let tokens = pack_documents(&source, tokenizer)?;
                // The floor is per byte; only the byte tokenizer makes that per token.
                let floor = tokenizer
                    .is_byte()
                    .then(|| source.corpus().window_floor(seq_len));
                (tokens, super::TextSource::describe(&source), floor)
            }
            DataSpec::Path { path, .. } if is_prepared(path) => {
                let tokens = PreparedTokens::open(path, tokenizer)?;
                let source_name = tokens.describe();
                let stream_hash = tokens.manifest().stream_hash.clone();
                let mut dataset = Self::windowed(
                    Tokens::Prepared(Arc::new(tokens)),
                    &stream_hash,
                    seq_len,
                    seed,
                    &source_name,
                )?;
                dataset.tokenizer = tokenizer.fingerprint();
                tracing::info!(dataset = %dataset.describe(), "prepared dataset opened");
                return Ok(dataset);
            }
            DataSpec::Path { .. } | DataSpec::Several { .. } if stream.is_some() => {
                let source = spec.local_files()?.ok_or_else(|| DataError::NoDocuments {
                    source_name: spec.to_string(),
                })?;
                let settings = stream.unwrap_or_default();
                let streamed = Streamed::open(&source, tokenizer, seq_len, seed, settings)?;
                let dataset = Self {
                    body: Body::Streamed(Arc::new(streamed)),
                    seq_len,
                    seed,
                    entropy_floor: None,
                    source_name: super::TextSource::describe(&source),
                    tokenizer: tokenizer.fingerprint(),
                };
                tracing::info!(dataset = %dataset.describe(), ?settings, "streaming dataset opened");
                return Ok(dataset);
            }
            DataSpec::Path { .. } | DataSpec::Remote { .. } | DataSpec::Several { .. } => {
                let source = spec.open()?;
                let tokens = pack_documents(source.as_ref(), tokenizer)?;
                (tokens, source.describe(), None)
            }
        };
        let mut dataset = Self::from_tokens(tokens, seq_len, seed, &source_name)?;
        dataset.entropy_floor = floor;
        dataset.tokenizer = tokenizer.fingerprint();
        tracing::info!(dataset = %dataset.describe(), "dataset loaded");
        Ok(dataset)
    }

    /// Windows an already packed token stream (no tokenizer or entropy floor recorded).
    ///
    /// # Errors
    /// [`DataError::ZeroSeqLen`]; [`DataError::TooFewTokens`] below `2 * seq_len + 2` tokens.
    pub fn from_tokens(
        tokens: Vec<u32>,
        seq_len: usize,
        seed: u64,
        source_name: &str,
    ) -> Result<Self, DataError> {
        let stream_hash = hash_tokens(&tokens);
        Self::windowed(
            Tokens::Memory(tokens.into()),
            &stream_hash,
            seq_len,
            seed,
            source_name,
        )
    }

    /// Windows a token stream whose content hash is `stream_hash`.
    fn windowed(
        tokens: Tokens,
        stream_hash: &str,
        seq_len: usize,
        seed: u64,
        source_name: &str,
    ) -> Result<Self, DataError> {
        if seq_len == 0 {
            return Err(DataError::ZeroSeqLen);
        }
        let needed = 2 * seq_len + 2;
        if tokens.len() < needed {
            return Err(DataError::TooFewTokens {
                source_name: source_name.to_owned(),
                found: tokens.len(),
                needed,
                window: seq_len + 1,
            });
        }
        // Each region (training, evaluation) holds `windows * seq_len + 1` tokens, since its
        // windows share boundary tokens with each other but not with the other region.
        let n_total = (tokens.len() - 2) / seq_len;
        let n_eval = (n_total / EVAL_DIVISOR).max(1);
        let n_train = n_total - n_eval;
        let eval_offset = n_train * seq_len + 1;
        let fingerprint = dataset_fingerprint(stream_hash, tokens.len(), seq_len, n_train, n_eval);
        Ok(Self {
            body: Body::Whole(Whole {
                tokens,
                n_train,
                n_eval,
                eval_offset,
                fingerprint,
            }),
            seq_len,
            seed,
            entropy_floor: None,
            source_name: source_name.to_owned(),
            tokenizer: "unknown".to_owned(),
        })
    }

    /// Input tokens per window (a window holds `seq_len + 1`: inputs and shifted targets).
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Number of training windows, the length of one epoch. At least 1. For a streamed
    /// dataset, those of the blocks tokenized so far (every block's once a pass was read).
    pub fn num_train_windows(&self) -> usize {
        match &self.body {
            Body::Whole(whole) => whole.n_train,
            Body::Streamed(streamed) => streamed.known_train_windows(),
        }
    }

    /// Number of held-out evaluation windows. At least 1.
    pub fn num_eval_windows(&self) -> usize {
        match &self.body {
            Body::Whole(whole) => whole.n_eval,
            Body::Streamed(streamed) => streamed.num_eval_windows(),
        }
    }

    /// Total number of tokens in the packed stream (for a streamed dataset, in the blocks
    /// tokenized so far).
    pub fn num_tokens(&self) -> usize {
        match &self.body {
            Body::Whole(whole) => whole.tokens.len(),
            Body::Streamed(streamed) => streamed.known_tokens(),
        }
    }

    /// The epoch of a sample id: `sample_id / num_train_windows` (a streamed dataset's pass;
    /// past pass 0 it needs every block's count, and may tokenize them to know it).
    pub fn epoch(&self, sample_id: u64) -> u64 {
        match &self.body {
            Body::Whole(whole) => sample_id / whole.n_train as u64,
            Body::Streamed(streamed) => streamed.locate(sample_id).0,
        }
    }

    /// The training window that sample `sample_id` is: a deterministic function of the data,
    /// `seq_len`, the seed and the id (see the module docs; a streamed dataset numbers its
    /// windows block by block). Always `< num_train_windows` once the window's block is read.
    pub fn train_window_index(&self, sample_id: u64) -> usize {
        match &self.body {
            Body::Whole(whole) => {
                let n = whole.n_train as u64;
                let permutation = EpochPermutation::new(self.seed, sample_id / n, n);
                // `sample_id % n < n`, so the permutation always answers.
                permutation.apply(sample_id % n).unwrap_or(0) as usize
            }
            Body::Streamed(streamed) => {
                let (_, located) = streamed.locate(sample_id);
                located.first + located.window
            }
        }
    }

    /// The `seq_len + 1` tokens of sample `sample_id`: inputs are `[..seq_len]`, targets
    /// `[1..]`. A streamed dataset may wait here for the sample's block to be tokenized.
    pub fn train_sample(&self, sample_id: u64) -> Cow<'_, [u32]> {
        match &self.body {
            Body::Whole(_) => self.train_window(self.train_window_index(sample_id)),
            Body::Streamed(streamed) => Cow::Owned(streamed.sample(sample_id)),
        }
    }

    /// Training window `window` (not a sample id), `seq_len + 1` tokens.
    ///
    /// # Panics
    /// If `window >= num_train_windows()` (for a streamed dataset: past a whole pass).
    pub fn train_window(&self, window: usize) -> Cow<'_, [u32]> {
        match &self.body {
            Body::Whole(whole) => {
                assert!(
                    window < whole.n_train,
                    "training window {window} of {}",
                    whole.n_train
                );
                whole.tokens.read(window * self.seq_len, self.seq_len + 1)
            }
            Body::Streamed(streamed) => match streamed.numbered_window(window) {
                Some(tokens) => Cow::Owned(tokens),
                None => panic!("training window {window} is past the data's last"),
            },
        }
    }

    /// Evaluation window `i`, `seq_len + 1` tokens.
    ///
    /// # Panics
    /// If `i >= num_eval_windows()`.
    pub fn eval_sample(&self, i: usize) -> Cow<'_, [u32]> {
        let n_eval = self.num_eval_windows();
        assert!(i < n_eval, "evaluation window {i} of {n_eval}");
        match &self.body {
            Body::Whole(whole) => {
                let start = whole.eval_offset + i * self.seq_len;
                whole.tokens.read(start, self.seq_len + 1)
            }
            Body::Streamed(streamed) => Cow::Borrowed(streamed.eval_window(i)),
        }
    }

    /// The best achievable mean loss per target token in nats, when known: for the synthetic
    /// corpus with the byte tokenizer, the exact floor for windows of this `seq_len` (see
    /// [`crate::data::MarkovCorpus::window_floor`]); `None` otherwise.
    pub fn entropy_floor(&self) -> Option<f64> {
        self.entropy_floor
    }

    /// A short hash of the packed tokens and the window layout (`seq_len`, split), so parties
    /// can check that they hold the same dataset before exchanging sample ids. Raw files and
    /// the token shards prepared from them give the same fingerprint, and so does a streamed
    /// source of one block. A streamed source of several blocks hashes its file listing
    /// (names and sizes), the layout and block 0's tokens, since the rest is not read yet.
    pub fn fingerprint(&self) -> String {
        match &self.body {
            Body::Whole(whole) => whole.fingerprint.clone(),
            Body::Streamed(streamed) => streamed.fingerprint().to_owned(),
        }
    }

    /// For a streamed dataset, takes the block counts saved at `path` (a small JSON file) when
    /// they were written for this source, files, tokenizer, text column and `block_shards`,
    /// and keeps the file up to date as blocks are counted, so that a reader started again
    /// locates its next sample without tokenizing every block before it. A file written for
    /// another source, or damaged, is ignored with a logged reason and the blocks are counted
    /// again; the samples are the same either way. Nothing is done for a dataset that is not
    /// streamed.
    pub fn keep_stream_counts(&self, path: &std::path::Path) -> SavedCounts {
        match &self.body {
            Body::Whole(_) => SavedCounts::NotStreamed,
            Body::Streamed(streamed) => streamed.keep_counts(path),
        }
    }

    /// The streaming pool's counters, for a streamed dataset.
    pub fn stream_stats(&self) -> Option<PoolStats> {
        match &self.body {
            Body::Whole(_) => None,
            Body::Streamed(streamed) => Some(streamed.stats()),
        }
    }

    /// One line for logs: source, tokenizer, sizes and floor.
    pub fn describe(&self) -> String {
        let floor = self
            .entropy_floor
            .map(|f| format!(", floor {f:.4} nats/token"))
            .unwrap_or_default();
        let (tokens, train) = match &self.body {
            Body::Whole(whole) => (
                format!("{} tokens", whole.tokens.len()),
                whole.n_train.to_string(),
            ),
            Body::Streamed(streamed) => (
                format!(
                    "{} tokens so far, streamed in {} blocks",
                    self.num_tokens(),
                    streamed.blocks()
                ),
                format!("{} so far", self.num_train_windows()),
            ),
        };
        format!(
            "{}, tokenizer {}: {tokens}, seq_len {}, {train} train + {} eval windows, seed {}, id {}{floor}",
            self.source_name,
            self.tokenizer,
            self.seq_len,
            self.num_eval_windows(),
            self.seed,
            self.fingerprint(),
        )
    }
}

impl fmt::Debug for Dataset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dataset")
            .field("describe", &self.describe())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Checks that two datasets are the same: sizes, fingerprint, three epochs of samples and
    /// every held-out window.
    pub(in crate::data) fn assert_twins(a: &Dataset, b: &Dataset) {
        assert_eq!(a.num_tokens(), b.num_tokens());
        assert_eq!(a.num_train_windows(), b.num_train_windows());
        assert_eq!(a.num_eval_windows(), b.num_eval_windows());
        assert_eq!(a.fingerprint(), b.fingerprint());
        for id in 0..3 * a.num_train_windows() as u64 {
            assert_eq!(a.train_sample(id), b.train_sample(id), "sample {id}");
        }
        for i in 0..a.num_eval_windows() {
            assert_eq!(a.eval_sample(i), b.eval_sample(i));
        }
    }

    fn counting(n: u32) -> Vec<u32> {
        (0..n).collect()
    }

    #[test]
    fn windows_and_split_by_hand() {
        // 2 + 10 * 4 tokens, seq_len 4: 10 windows, 1 held out (10 / 50 rounds to 0, min 1).
        let data = Dataset::from_tokens(counting(42), 4, 0, "count").unwrap();
        assert_eq!(data.num_train_windows(), 9);
        assert_eq!(data.num_eval_windows(), 1);
        assert_eq!(*data.train_window(0), [0, 1, 2, 3, 4]);
        assert_eq!(*data.train_window(1), [4, 5, 6, 7, 8]);
        assert_eq!(*data.train_window(8), [32, 33, 34, 35, 36]);
        // 36 is the last training target; evaluation starts at 37 instead of sharing it.
        assert_eq!(*data.eval_sample(0), [37, 38, 39, 40, 41]);
    }

    #[test]
    fn two_percent_held_out() {
        let data = Dataset::from_tokens(counting(2 + 1000 * 8), 8, 0, "count").unwrap();
        assert_eq!(data.num_eval_windows(), 20);
        assert_eq!(data.num_train_windows(), 980);
    }

    #[test]
    fn eval_windows_never_overlap_training_windows() {
        // Distinct token values, so overlap in position shows as shared values.
        let data = Dataset::from_tokens(counting(5_003), 7, 3, "count").unwrap();
        let train: HashSet<u32> = (0..data.num_train_windows())
            .flat_map(|w| data.train_window(w).to_vec())
            .collect();
        for i in 0..data.num_eval_windows() {
            let eval = data.eval_sample(i);
            assert_eq!(eval.len(), 8);
            assert!(eval.iter().all(|t| !train.contains(t)), "eval window {i}");
        }
    }

    #[test]
    fn each_epoch_covers_every_training_window_once() {
        let data = Dataset::from_tokens(counting(3_000), 10, 11, "count").unwrap();
        let n = data.num_train_windows() as u64;
        let epoch0: Vec<usize> = (0..n).map(|id| data.train_window_index(id)).collect();
        let epoch1: Vec<usize> = (n..2 * n).map(|id| data.train_window_index(id)).collect();
        for epoch in [&epoch0, &epoch1] {
            let mut sorted = epoch.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n as usize).collect::<Vec<_>>());
        }
        assert_ne!(epoch0, epoch1, "each epoch has its own order");
        assert_eq!(data.epoch(n - 1), 0);
        assert_eq!(data.epoch(n), 1);
        // Sample ids are a pure function of (data, seed, id).
        let again = Dataset::from_tokens(counting(3_000), 10, 11, "count").unwrap();
        for id in [0, 5, n, 3 * n + 7, u64::MAX] {
            assert_eq!(again.train_window_index(id), data.train_window_index(id));
            assert_eq!(again.train_sample(id), data.train_sample(id));
            assert_eq!(data.train_sample(id).len(), 11);
        }
        let other_seed = Dataset::from_tokens(counting(3_000), 10, 12, "count").unwrap();
        let other: Vec<usize> = (0..n).map(|id| other_seed.train_window_index(id)).collect();
        assert_ne!(other, epoch0);
    }

    #[test]
    fn too_few_tokens_says_how_many() {
        let err = Dataset::from_tokens(counting(9), 4, 0, "tiny").unwrap_err();
        assert!(matches!(
            err,
            DataError::TooFewTokens {
                found: 9,
                needed: 10,
                window: 5,
                ..
            }
        ));
        assert!(
            err.to_string()
                .contains("found 9 tokens but need at least 10")
        );
        assert!(Dataset::from_tokens(counting(10), 4, 0, "tiny").is_ok());
        assert!(matches!(
            Dataset::from_tokens(counting(100), 0, 0, "x"),
            Err(DataError::ZeroSeqLen)
        ));
    }

    #[test]
    fn synthetic_load_is_deterministic_with_floor() {
        let spec = DataSpec::Synthetic {
            seed: 1,
            chars: 20_000,
        };
        let a = Dataset::load(&spec, &Tokenizer::byte(), 64, 5).unwrap();
        let b = Dataset::load(&spec, &Tokenizer::byte(), 64, 5).unwrap();
        assert_eq!(a.num_tokens(), 20_000);
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.num_train_windows(), b.num_train_windows());
        for id in 0..50 {
            assert_eq!(a.train_sample(id), b.train_sample(id));
        }
        assert_eq!(a.eval_sample(0), b.eval_sample(0));
        let floor = a.entropy_floor().unwrap();
        assert!((0.9..1.7).contains(&floor), "{floor}");
        assert!(a.describe().contains("floor"));
        assert!(a.describe().contains("tokenizer byte"));
        let other = Dataset::load(
            &DataSpec::Synthetic {
                seed: 2,
                chars: 20_000,
            },
            &Tokenizer::byte(),
            64,
            5,
        )
        .unwrap();
        assert_ne!(other.fingerprint(), a.fingerprint());
    }

    #[test]
    fn file_load_packs_documents_and_reports_empty_data() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "hello").unwrap();
        std::fs::write(dir.path().join("b.jsonl"), "{\"text\":\"world\"}\n").unwrap();
        let spec = DataSpec::path(dir.path());
        let data = Dataset::load(&spec, &Tokenizer::byte(), 2, 0).unwrap();
        // "hello" NUL "world" = 11 tokens: (11 - 2) / 2 = 4 windows, 1 held out; the final
        // "d" is left over.
        assert_eq!(data.num_tokens(), 11);
        assert_eq!(data.num_train_windows(), 3);
        assert_eq!(*data.train_window(2), [u32::from(b'o'), 0, u32::from(b'w')]);
        assert_eq!(*data.eval_sample(0), b"orl".map(u32::from));
        assert_eq!(data.entropy_floor(), None);

        let err = Dataset::load(&spec, &Tokenizer::byte(), 8, 0).unwrap_err();
        assert!(
            matches!(
                err,
                DataError::TooFewTokens {
                    found: 11,
                    needed: 18,
                    ..
                }
            ),
            "{err}"
        );

        let empty = tempfile::tempdir().unwrap();
        std::fs::write(empty.path().join("blank.txt"), "").unwrap();
        let err =
            Dataset::load(&DataSpec::path(empty.path()), &Tokenizer::byte(), 2, 0).unwrap_err();
        assert!(matches!(err, DataError::NoDocuments { .. }), "{err}");
    }

    #[test]
    fn a_prepared_directory_gives_the_raw_windows_and_fingerprint() {
        let src = tempfile::tempdir().unwrap();
        for (name, text) in [
            ("a.txt", "the first document, "),
            ("b.txt", ""),
            ("c.txt", "a third"),
        ] {
            std::fs::write(src.path().join(name), text.repeat(7)).unwrap();
        }
        let out = tempfile::tempdir().unwrap();
        let files = crate::data::LocalFiles::open(src.path()).unwrap();
        crate::data::prepare(&files, &Tokenizer::byte(), out.path(), 2, &|_| {}).unwrap();
        let raw = Dataset::load(&DataSpec::path(src.path()), &Tokenizer::byte(), 9, 4).unwrap();
        let prepared =
            Dataset::load(&DataSpec::path(out.path()), &Tokenizer::byte(), 9, 4).unwrap();
        assert_twins(&raw, &prepared);
        assert!(prepared.describe().contains("prepared"));

        let bpe = tempfile::tempdir().unwrap();
        let file = bpe.path().join("t.json");
        let other = crate::data::train_bpe(&files, 300, &file).unwrap();
        let err = Dataset::load(&DataSpec::path(out.path()), &other, 9, 4).unwrap_err();
        let message = err.to_string();
        assert!(
            matches!(err, DataError::PreparedTokenizerMismatch { .. })
                && message.contains(crate::data::MANIFEST_FILE)
                && message.contains("byte"),
            "{message}"
        );
    }
}
