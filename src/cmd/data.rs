//! `iota data`: data tools. `prepare` tokenizes text shards once into token shards that
//! `--data DIR` then reads in place, without tokenizing.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use crate::data::{DataSpec, MANIFEST_FILE, Tokenizer, is_prepared, prepare};
use crate::mirror;

/// Arguments of `iota data`.
#[derive(Debug, Args)]
pub struct DataArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: DataCommand,
}

/// Subcommands of `iota data`.
#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Tokenize text shards once into token shards (u16/u32 ids and a manifest) that
    /// `--data DIR` reads without tokenizing.
    Prepare(PrepareArgs),
}

/// Arguments of `iota data prepare`.
#[derive(Debug, Args)]
pub struct PrepareArgs {
    /// Text to tokenize: a .txt, .jsonl, .jsonl.gz, .jsonl.zst or .parquet file, a directory
    /// of them, an s3:// prefix or an http(s):// URL.
    #[arg(long, value_name = "SRC")]
    pub data: DataSpec,
    /// The .jsonl field / .parquet column of --data holding the text (default: `text`).
    #[arg(long, value_name = "NAME")]
    pub text_column: Option<String>,
    /// The tokenizer.json the run will use (default: the byte tokenizer).
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// The directory to write the token shards and manifest to (new, empty, or an earlier
    /// preparation, which is replaced).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Files tokenized at once (default: one per core).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub threads: usize,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// Runs `iota data ...`.
///
/// # Errors
/// Unreadable data or tokenizer, an unwritable output directory.
pub fn run(args: DataArgs) -> anyhow::Result<()> {
    match args.command {
        DataCommand::Prepare(args) => run_prepare(args),
    }
}

/// Tokenizes the source into the output directory, then prints what was written.
fn run_prepare(args: PrepareArgs) -> anyhow::Result<()> {
    let spec = args
        .data
        .clone()
        .with_text_column(args.text_column.as_deref())?;
    let local = mirror::fetch_to_cache(&spec).with_context(|| format!("copying {}", args.data))?;
    if let DataSpec::Path { path, .. } = &local
        && is_prepared(path)
    {
        bail!(
            "{}: already prepared (it holds {MANIFEST_FILE}); pass it to --data as it is",
            path.display()
        );
    }
    let Some(source) = local.local_files()? else {
        bail!(
            "{}: the synthetic corpus is generated, not read, so there is nothing to prepare \
             (pass a file, a folder, an s3:// prefix or an https:// URL)",
            args.data
        );
    };
    let tokenizer = Tokenizer::load(args.tokenizer.as_deref())?;
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(source.files().len() as u64)
    };
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} file {pos}/{len} [{elapsed_precise}<{eta_precise}] {wide_bar} {msg}",
    ) {
        bar.set_style(style);
    }
    let started = Instant::now();
    let tokens = std::sync::atomic::AtomicU64::new(0);
    let manifest = prepare(&source, &tokenizer, &args.out, args.threads, &|shard| {
        let so_far =
            tokens.fetch_add(shard.tokens, std::sync::atomic::Ordering::Relaxed) + shard.tokens;
        bar.inc(1);
        bar.set_message(format!("{so_far} tokens"));
    })
    .with_context(|| format!("preparing {}", args.data))?;
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "wrote {} ({} shards, {} documents, {} {:?} tokens, tokenizer {}) in {seconds:.1} s, \
         {:.0} tokens/s",
        args.out.display(),
        manifest.shards.len(),
        manifest.documents,
        manifest.tokens,
        manifest.dtype,
        manifest.tokenizer,
        manifest.tokens as f64 / seconds.max(1e-9)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::{Cli, Command};
    use clap::Parser;

    #[test]
    fn parses_prepare() {
        let cli = Cli::parse_from([
            "iota",
            "data",
            "prepare",
            "--data",
            "shards",
            "--out",
            "tokens",
            "--threads",
            "3",
        ]);
        let Command::Data(DataArgs {
            command: DataCommand::Prepare(args),
        }) = cli.command
        else {
            panic!("not data prepare");
        };
        assert_eq!(args.data, DataSpec::path("shards"));
        assert_eq!(args.out, PathBuf::from("tokens"));
        assert_eq!(args.threads, 3);
    }

    #[test]
    fn synthetic_and_prepared_sources_are_refused() {
        let out = tempfile::tempdir().unwrap();
        let args = |data: &str| DataArgs {
            command: DataCommand::Prepare(PrepareArgs {
                data: data.parse().unwrap(),
                text_column: None,
                tokenizer: None,
                out: out.path().join("t"),
                threads: 1,
                quiet: true,
            }),
        };
        let err = run(args("synthetic")).unwrap_err().to_string();
        assert!(err.contains("nothing to prepare"), "{err}");
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("a.txt"), "some text").unwrap();
        run(args(&src.path().display().to_string())).unwrap();
        let prepared = out.path().join("t").display().to_string();
        let err = run(args(&prepared)).unwrap_err().to_string();
        assert!(err.contains("already prepared"), "{err}");
    }
}
