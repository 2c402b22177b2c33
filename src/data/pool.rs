//! `TokenPool`: raw shards tokenized in a bounded background pool, a block of consecutive
//! files at a time, a fixed number of blocks ahead of the reader.
//!
//! # Bounds
//! One producer thread makes blocks in order, starting at the reader's cursor (the block it
//! asked for last) and going at most `ahead` blocks past it, cyclically (after the last block
//! comes block 0 again: the next pass over the data). A block's files are packed on a rayon
//! pool of `threads` threads (files in parallel, and inside an HF tokenizer's batch encoding).
//! Resident blocks are those from the one before the cursor to `ahead` past it, so at most
//! `ahead + 2` blocks are held in memory, whatever the size of the corpus, plus any block a
//! reader is waiting for outside that range (several readers asking for far-apart blocks at
//! once; the orchestrator's ask for nearby sample ids); a block asked for again after it was
//! dropped is tokenized again (the same tokens: packing is deterministic).
//!
//! # Failures
//! Before [`TokenPool::serving`] is called (the run has not started), a file that cannot be
//! read or tokenized is an error for the reader. After it, the file is skipped (its documents
//! are left out of its block), the reason is logged and kept ([`PoolStats::skipped`]), and the
//! run goes on: nothing stops mid-run for one bad shard.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use rayon::prelude::*;

use super::pack::pack_into;
use super::source::LocalFiles;
use super::{DataError, Tokenizer};

/// Counters of a pool, for logs and tests: how much it did and held.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Blocks of the source.
    pub blocks: usize,
    /// Blocks tokenized so far (a block made again after it was dropped counts again).
    pub tokenized: u64,
    /// Blocks held in memory now.
    pub resident: usize,
    /// The most blocks ever held in memory at once.
    pub max_resident: usize,
    /// Times a reader had to wait for a block that was not ready.
    pub waits: u64,
    /// Files left out of their block after the run started, each with the reason.
    pub skipped: Vec<String>,
}

/// Called with every block's count (`None`: not known yet) each time a block's count becomes
/// known or is corrected; calls are one at a time, each with the counts as they are then.
pub(crate) type CountSink = Box<dyn Fn(&[Option<u64>]) + Send + Sync>;

/// The raw shards of a source, tokenized block by block in the background. Dropping the pool
/// stops its thread after the block it is making.
pub(crate) struct TokenPool {
    /// What the reader and the producer thread share.
    shared: Arc<Shared>,
}

/// The pool's fixed parts and its state.
struct Shared {
    /// The files, in reading order.
    files: Vec<PathBuf>,
    /// The text column of `.jsonl` and `.parquet` files.
    column: String,
    /// The tokenizer.
    tokenizer: Tokenizer,
    /// File indices of each block.
    blocks: Vec<Range<usize>>,
    /// Blocks made past the reader's cursor.
    ahead: usize,
    /// The threads that tokenize.
    workers: rayon::ThreadPool,
    /// What changes.
    state: Mutex<State>,
    /// Signalled when a block is made, the cursor moves or the pool stops.
    changed: Condvar,
    /// Told of new counts ([`TokenPool::on_count`]); its lock also keeps calls one at a time.
    sink: Mutex<Option<CountSink>>,
}

/// The pool's changing state.
#[derive(Default)]
struct State {
    /// The block the reader asked for last.
    cursor: usize,
    /// Blocks in memory.
    resident: BTreeMap<usize, Arc<[u32]>>,
    /// Token count of each block, once made (kept after the block is dropped) or taken from
    /// saved counts ([`TokenPool::preload`]).
    counts: Vec<Option<u64>>,
    /// Blocks readers are waiting for, with the number of readers: made first, and kept
    /// while waited for even outside the cursor's range (another reader may have moved it).
    waiting: BTreeMap<usize, usize>,
    /// An error making a block before the run started: (block, error).
    failed: Option<(usize, DataError)>,
    /// Files fail the reader until this is set; skipped after.
    serving: bool,
    /// Set when the pool is dropped.
    stop: bool,
    /// Set when the producer thread has ended (stopped, or panicked).
    dead: bool,
    /// Counters.
    stats: PoolStats,
}

impl TokenPool {
    /// Starts a pool over the files of `source`, `block_files` files a block, `ahead` blocks
    /// made past the reader, on `threads` threads. Nothing is tokenized until a block is asked
    /// for ([`Self::block`]).
    ///
    /// # Errors
    /// [`DataError::Tokenizer`] when the threads cannot start.
    pub(crate) fn start(
        source: &LocalFiles,
        tokenizer: &Tokenizer,
        block_files: usize,
        ahead: usize,
        threads: usize,
    ) -> Result<Self, DataError> {
        let files = source.files().to_vec();
        let block_files = block_files.max(1);
        let blocks: Vec<Range<usize>> = (0..files.len())
            .step_by(block_files)
            .map(|start| start..(start + block_files).min(files.len()))
            .collect();
        let cannot = |e: &dyn std::fmt::Display| DataError::Tokenizer {
            reason: format!("cannot start the tokenizing threads: {e}"),
        };
        let workers = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("iota-tokenize-{i}"))
            .build()
            .map_err(|e| cannot(&e))?;
        let state = State {
            counts: vec![None; blocks.len()],
            ..State::default()
        };
        let shared = Arc::new(Shared {
            files,
            column: source.text_column().to_owned(),
            tokenizer: tokenizer.clone(),
            blocks,
            ahead,
            workers,
            state: Mutex::new(state),
            changed: Condvar::new(),
            sink: Mutex::new(None),
        });
        let producer = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("iota-token-pool".to_owned())
            .spawn(move || produce(&producer))
            .map_err(|e| cannot(&e))?;
        Ok(Self { shared })
    }

    /// Number of blocks.
    pub(crate) fn len(&self) -> usize {
        self.shared.blocks.len()
    }

    /// Marks the run as started: from now on a file that fails is skipped, not an error (a
    /// block that failed while made ahead is made again under that rule).
    pub(crate) fn serving(&self) {
        let mut state = self.shared.lock();
        state.serving = true;
        state.failed = None;
        drop(state);
        self.shared.changed.notify_all();
    }

    /// The packed tokens of block `k`, waiting for them if they are not made yet. Moves the
    /// reader's cursor to `k`: blocks outside `k - 1 ..= k + ahead` are dropped, and the
    /// producer makes the missing ones of that range, `k` first.
    ///
    /// # Errors
    /// Before [`Self::serving`], the first error reading or tokenizing a file of block `k`.
    ///
    /// # Panics
    /// If `k` is not a block (a caller bug).
    pub(crate) fn block(&self, k: usize) -> Result<Arc<[u32]>, DataError> {
        assert!(k < self.len(), "block {k} of {}", self.len());
        let shared = &self.shared;
        let mut state = shared.lock();
        if state.cursor != k {
            state.cursor = k;
            shared.evict(&mut state);
            shared.changed.notify_all();
        }
        let mut waited = false;
        let result = loop {
            if let Some(tokens) = state.resident.get(&k) {
                break Ok(Arc::clone(tokens));
            }
            if state.failed.as_ref().is_some_and(|(b, _)| *b == k)
                && let Some((_, error)) = state.failed.take()
            {
                break Err(error);
            }
            if state.dead {
                // The producer is gone (it panicked): make the block here.
                let serving = state.serving;
                drop(state);
                let (tokens, skipped) = shared.make(k, serving)?;
                let tokens: Arc<[u32]> = tokens.into();
                let mut state = shared.lock();
                let new_count = shared.store(&mut state, k, tokens.to_vec(), skipped);
                state = finish_wait(state, k, waited);
                drop(state);
                if new_count {
                    shared.report_counts();
                }
                return Ok(tokens);
            }
            if !waited {
                waited = true;
                state.stats.waits += 1;
                *state.waiting.entry(k).or_default() += 1;
                shared.changed.notify_all();
            }
            state = shared
                .changed
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        };
        drop(finish_wait(state, k, waited));
        result
    }

    /// The token count of block `k`: known once the block was made, else made now (moving the
    /// cursor, as [`Self::block`]).
    ///
    /// # Errors
    /// As [`Self::block`].
    pub(crate) fn count(&self, k: usize) -> Result<u64, DataError> {
        if let Some(Some(count)) = self.shared.lock().counts.get(k) {
            return Ok(*count);
        }
        Ok(self.block(k)?.len() as u64)
    }

    /// The token counts of the blocks made so far, or preloaded (`None` for the others).
    pub(crate) fn counts(&self) -> Vec<Option<u64>> {
        self.shared.lock().counts.clone()
    }

    /// Takes saved token counts (`saved[k]` for block `k`) for the blocks not counted yet, so
    /// they are located without being tokenized. Each is checked when its block is made: a
    /// count that differs is replaced by the made one, with a logged warning. Returns how many
    /// were taken.
    pub(crate) fn preload(&self, saved: &[Option<u64>]) -> usize {
        let mut state = self.shared.lock();
        let mut taken = 0;
        for (k, count) in saved.iter().enumerate().take(self.len()) {
            if let (None, Some(count)) = (state.counts[k], count) {
                state.counts[k] = Some(*count);
                taken += 1;
            }
        }
        taken
    }

    /// Tells `sink` of the counts now and each time a block's count becomes known or is
    /// corrected (from the thread that made the block, outside the pool's lock).
    pub(crate) fn on_count(&self, sink: CountSink) {
        *self.shared.sink.lock().unwrap_or_else(|e| e.into_inner()) = Some(sink);
        self.shared.report_counts();
    }

    /// The pool's counters now.
    pub(crate) fn stats(&self) -> PoolStats {
        let state = self.shared.lock();
        PoolStats {
            blocks: self.len(),
            resident: state.resident.len(),
            ..state.stats.clone()
        }
    }
}

impl Drop for TokenPool {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
    }
}

impl Shared {
    /// The state, even if a thread panicked holding it (every change is complete when made).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether block `k` is in the resident range of `cursor`: `cursor - 1 ..= cursor + ahead`,
    /// cyclically.
    fn keeps(&self, cursor: usize, k: usize) -> bool {
        let n = self.blocks.len();
        (k + n + 1 - cursor) % n <= self.ahead + 1
    }

    /// Drops the resident blocks outside the cursor's range that no reader waits for.
    fn evict(&self, state: &mut State) {
        let cursor = state.cursor;
        let waiting = &state.waiting;
        state
            .resident
            .retain(|&k, _| self.keeps(cursor, k) || waiting.contains_key(&k));
    }

    /// The next block the producer should make: a block a reader waits for, else the first of
    /// `cursor ..= cursor + ahead` (cyclically); never one resident or failed.
    fn next_to_make(&self, state: &State) -> Option<usize> {
        let n = self.blocks.len();
        let todo = |k: &usize| {
            !state.resident.contains_key(k) && state.failed.as_ref().is_none_or(|(b, _)| b != k)
        };
        state.waiting.keys().copied().find(todo).or_else(|| {
            (0..=self.ahead.min(n.saturating_sub(1)))
                .map(|i| (state.cursor + i) % n)
                .find(todo)
        })
    }

    /// Records a made block: its count, and the tokens if it is still in range. Returns
    /// whether the count is new (not known before, or not the preloaded one).
    fn store(&self, state: &mut State, k: usize, tokens: Vec<u32>, skipped: Vec<String>) -> bool {
        let count = tokens.len() as u64;
        let new_count = match state.counts[k] {
            Some(known) if known != count => {
                tracing::warn!(
                    block = k,
                    saved = known,
                    tokens = count,
                    "a block's tokens are not the count known for it (a saved count that was \
                     wrong, or a file that changed or failed); using its tokens' count"
                );
                true
            }
            Some(_) => false,
            None => true,
        };
        state.counts[k] = Some(count);
        state.stats.tokenized += 1;
        state.stats.skipped.extend(skipped);
        if self.keeps(state.cursor, k) || state.waiting.contains_key(&k) {
            state.resident.insert(k, tokens.into());
            state.stats.max_resident = state.stats.max_resident.max(state.resident.len());
        }
        new_count
    }

    /// Gives the sink, if any, the counts as they are now.
    fn report_counts(&self) {
        let sink = self.sink.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sink) = sink.as_ref() {
            let counts = self.lock().counts.clone();
            sink(&counts);
        }
    }

    /// Tokenizes block `k`: each file packed on the workers (in parallel), then the files'
    /// streams joined with one end-of-text id between non-empty ones, which is
    /// [`crate::data::pack_documents`] over the block's files. A file that fails is an error
    /// unless `serving`; then it is left out and its reason returned.
    fn make(&self, k: usize, serving: bool) -> Result<(Vec<u32>, Vec<String>), DataError> {
        let files = &self.files[self.blocks[k].clone()];
        let packed: Vec<Result<Vec<u32>, DataError>> = self.workers.install(|| {
            files
                .par_iter()
                .map(|path| {
                    let one = LocalFiles::open(path)?.with_text_column(&self.column);
                    let mut tokens = Vec::new();
                    pack_into(&one, &self.tokenizer, |ids| {
                        tokens.extend_from_slice(ids);
                        Ok(())
                    })?;
                    Ok(tokens)
                })
                .collect()
        });
        let separator = self.tokenizer.end_of_text();
        let (mut tokens, mut skipped) = (Vec::new(), Vec::new());
        for result in packed {
            let file_tokens = match result {
                Ok(file_tokens) => file_tokens,
                Err(error) if serving => {
                    tracing::warn!(block = k, %error, "shard skipped");
                    skipped.push(error.to_string());
                    continue;
                }
                Err(error) => return Err(error),
            };
            if file_tokens.is_empty() {
                continue;
            }
            if let (Some(separator), false) = (separator, tokens.is_empty()) {
                tokens.push(separator);
            }
            tokens.extend_from_slice(&file_tokens);
        }
        Ok((tokens, skipped))
    }
}

/// Ends a reader's wait for block `k` (if it waited), dropping the block once it is outside
/// the cursor's range and waited for no more.
fn finish_wait(mut state: MutexGuard<'_, State>, k: usize, waited: bool) -> MutexGuard<'_, State> {
    if waited && let Some(readers) = state.waiting.get_mut(&k) {
        *readers -= 1;
        if *readers == 0 {
            state.waiting.remove(&k);
        }
    }
    state
}

/// The producer thread: makes the blocks the cursor's range lacks, one at a time, until the
/// pool is dropped.
fn produce(shared: &Shared) {
    /// Marks the pool dead when the thread ends, even by a panic, so readers never wait on it.
    struct Dead<'a>(&'a Shared);
    impl Drop for Dead<'_> {
        fn drop(&mut self) {
            self.0.lock().dead = true;
            self.0.changed.notify_all();
        }
    }
    let _dead = Dead(shared);
    loop {
        let (k, serving) = {
            let mut state = shared.lock();
            loop {
                if state.stop {
                    return;
                }
                if let Some(k) = shared.next_to_make(&state) {
                    break (k, state.serving);
                }
                state = shared
                    .changed
                    .wait(state)
                    .unwrap_or_else(|e| e.into_inner());
            }
        };
        let made = shared.make(k, serving);
        let mut state = shared.lock();
        let new_count = match made {
            Ok((tokens, skipped)) => shared.store(&mut state, k, tokens, skipped),
            Err(error) => {
                state.failed = Some((k, error));
                false
            }
        };
        drop(state);
        shared.changed.notify_all();
        if new_count {
            shared.report_counts();
        }
    }
}
