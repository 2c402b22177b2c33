//! `iota tokenizer`: offline tokenizer tools.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::data::{DataSpec, train_bpe};
use crate::mirror;

/// Arguments of `iota tokenizer`.
#[derive(Debug, Args)]
pub struct TokenizerArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: TokenizerCommand,
}

/// Subcommands of `iota tokenizer`.
#[derive(Debug, Subcommand)]
pub enum TokenizerCommand {
    /// Train a byte-level BPE tokenizer and write it as a Hugging Face tokenizer.json.
    Train(TrainArgs),
}

/// Arguments of `iota tokenizer train`.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// Text to train on: a .txt, .jsonl, .jsonl.gz, .jsonl.zst or .parquet file, a directory
    /// of them, or `synthetic[:SEED[:CHARS]]`.
    #[arg(long, value_name = "PATH")]
    pub data: DataSpec,
    /// The .jsonl field / .parquet column of --data holding the text (default: `text`).
    #[arg(long, value_name = "NAME")]
    pub text_column: Option<String>,
    /// Vocabulary size, including the 256 byte symbols and <|endoftext|> (at least 257).
    #[arg(long, value_name = "N")]
    pub vocab: usize,
    /// Where to write the tokenizer.json.
    #[arg(long, value_name = "FILE", default_value = "tokenizer.json")]
    pub out: PathBuf,
}

/// Runs `iota tokenizer ...`.
///
/// # Errors
/// Unreadable or empty data, a vocabulary below 257, or an unwritable output file.
pub fn run(args: TokenizerArgs) -> anyhow::Result<()> {
    match args.command {
        TokenizerCommand::Train(args) => train(args),
    }
}

/// Trains and saves a BPE, then prints what was written.
fn train(args: TrainArgs) -> anyhow::Result<()> {
    let source = args
        .data
        .clone()
        .with_text_column(args.text_column.as_deref())
        .with_context(|| format!("opening training data {}", args.data))?;
    let source = mirror::fetch_to_cache(&source)
        .with_context(|| format!("copying training data {}", args.data))?
        .open()
        .with_context(|| format!("opening training data {}", args.data))?;
    tracing::info!(source = %source.describe(), vocab = args.vocab, "training BPE tokenizer");
    let tokenizer = train_bpe(source.as_ref(), args.vocab, &args.out)
        .with_context(|| format!("training a BPE tokenizer on {}", args.data))?;
    println!(
        "wrote {} (vocabulary {}, fingerprint {})",
        args.out.display(),
        tokenizer.vocab_size(),
        tokenizer.fingerprint()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::{Cli, Command};
    use clap::Parser;

    #[test]
    fn parses_train_arguments() {
        let cli = Cli::try_parse_from([
            "iota",
            "tokenizer",
            "train",
            "--data",
            "synthetic:3",
            "--vocab",
            "512",
            "--out",
            "t.json",
        ])
        .unwrap();
        // Irrefutable while these are the only variants; other commands will be added.
        #[allow(irrefutable_let_patterns)]
        let Command::Tokenizer(TokenizerArgs {
            command: TokenizerCommand::Train(args),
        }) = cli.command
        else {
            panic!("wrong command");
        };
        assert_eq!(args.vocab, 512);
        assert_eq!(args.out, PathBuf::from("t.json"));
        assert!(matches!(args.data, DataSpec::Synthetic { seed: 3, .. }));
        assert!(Cli::try_parse_from(["iota", "tokenizer", "train", "--vocab", "512"]).is_err());
    }

    #[test]
    fn trains_on_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.txt"),
            "to be or not to be, that is the question. ".repeat(30),
        )
        .unwrap();
        let out = dir.path().join("tok.json");
        run(TokenizerArgs {
            command: TokenizerCommand::Train(TrainArgs {
                data: DataSpec::path(dir.path()),
                text_column: None,
                vocab: 280,
                out: out.clone(),
            }),
        })
        .unwrap();
        let tokenizer = crate::data::Tokenizer::from_file(&out).unwrap();
        assert_eq!(tokenizer.vocab_size(), 280);
    }
}
