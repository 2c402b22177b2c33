//! Tests of streamed raw shards through [`Dataset`]: the block layout (`streamed.rs`) over
//! the bounded pool (`pool.rs`), against the whole-source layout and against each block's
//! windows computed on their own.

use super::dataset::tests::assert_twins;
use super::source::LocalFiles;
use super::streamed::{StreamSettings, split_first};
use super::{DataSpec, Dataset, EpochPermutation, SavedCounts, Tokenizer, pack_documents};
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
    let streamed = Dataset::load_with(&spec, &Tokenizer::byte(), 16, 7, settings(3, 1)).unwrap();
    assert!(streamed.stream_stats().is_some() && whole.stream_stats().is_none());
    assert_twins(&streamed, &whole);
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

#[test]
fn a_restart_takes_the_saved_counts_and_ignores_a_file_not_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let files = 12;
    write_files(dir.path(), files);
    let state = tempfile::tempdir().unwrap();
    let counts = state.path().join("stream-counts.json");
    let spec = DataSpec::path(dir.path());
    // Nothing made ahead: every tokenized block is one a reader asked for.
    let open = |block_shards| {
        Dataset::load_with(&spec, &Tokenizer::byte(), 16, 3, settings(block_shards, 0)).unwrap()
    };
    let tokenized = |data: &Dataset| data.stream_stats().unwrap().tokenized;

    // The first run reads pass 0 whole: every block is counted, and the counts saved.
    let first = open(1);
    assert_eq!(first.keep_stream_counts(&counts), SavedCounts::Missing);
    let n = (0..).take_while(|&id| first.epoch(id) == 0).count() as u64;
    let ids = [n - 1, n - 40, n + 5, 2 * n + 3];
    let samples: Vec<Vec<u32>> = ids
        .iter()
        .map(|&id| first.train_sample(id).to_vec())
        .collect();
    drop(first);
    // The last count is saved by the thread that made its block, maybe after it was read.
    let saved = |path: &Path| {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.contains("\"counts\"") && !text.contains("null")
    };
    wait_for(|| saved(&counts));

    // A restart finds the last blocks' samples, and the next passes', with only those blocks
    // and block 0 tokenized (block 0 twice: opened, then read again by pass 1).
    let again = open(1);
    assert_eq!(
        again.keep_stream_counts(&counts),
        SavedCounts::Loaded {
            known: files,
            blocks: files
        }
    );
    for (id, sample) in ids.iter().zip(&samples) {
        assert_eq!(*again.train_sample(*id), sample[..], "sample {id}");
    }
    assert!(tokenized(&again) <= 4, "{:?}", again.stream_stats());
    assert_eq!(again.num_train_windows() as u64, n);
    drop(again);

    // A damaged file is ignored with its reason: every block before the sample is tokenized
    // again, the samples are the same, and the file is written anew.
    let text = std::fs::read_to_string(&counts).unwrap();
    std::fs::write(&counts, &text[..text.len() - 9]).unwrap();
    let damaged = open(1);
    let SavedCounts::Ignored { reason } = damaged.keep_stream_counts(&counts) else {
        panic!("a damaged file was taken");
    };
    assert!(
        reason.contains("not a count file") && !reason.contains('\n'),
        "{reason}"
    );
    assert_eq!(*damaged.train_sample(ids[0]), samples[0][..]);
    assert!(
        tokenized(&damaged) >= files as u64,
        "{:?}",
        damaged.stream_stats()
    );
    drop(damaged);
    wait_for(|| std::fs::read_to_string(&counts).is_ok_and(|now| now == text));

    // Counts of another layout (blocks of 2 files) are not this one's: ignored, counted again.
    let pairs = open(2);
    pairs.keep_stream_counts(&counts);
    let _ = pairs.epoch(10 * n);
    drop(pairs);
    wait_for(|| saved(&counts));
    let other = open(1);
    let SavedCounts::Ignored { reason } = other.keep_stream_counts(&counts) else {
        panic!("another layout's counts were taken");
    };
    assert!(reason.contains("blocks of 2 files"), "{reason}");
    for (id, sample) in ids.iter().zip(&samples) {
        assert_eq!(*other.train_sample(*id), sample[..], "sample {id}");
    }
    assert!(
        tokenized(&other) >= files as u64,
        "{:?}",
        other.stream_stats()
    );
}

/// Waits up to 10 s for `done`.
fn wait_for(done: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(start.elapsed().as_secs() < 10, "timed out");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
