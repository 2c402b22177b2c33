//! `iota export`: a trained model in the layout Hugging Face tools read.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use super::trained::{self, ModelSource};
use crate::infer::export::{Architecture, export_hf};

/// Arguments of `iota export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Folder to write the model to as Hugging Face `transformers` loads it (config.json,
    /// model.safetensors, tokenizer.json, and the model code where plain Llama cannot
    /// express the model); created if absent, files of the same names replaced.
    #[arg(long, value_name = "OUT")]
    pub hf: PathBuf,
    /// The trained model.
    #[command(flatten)]
    pub source: ModelSource,
}

/// Runs `iota export`.
///
/// # Errors
/// A checkpoint that cannot be found or read, a model with `int8` boundaries, or a folder
/// that cannot be written.
pub fn run(args: ExportArgs) -> anyhow::Result<()> {
    let trained = trained::open(&args.source)?;
    let done = export_hf(&trained.weights, &trained.tokenizer, trained.wire, &args.hf)
        .with_context(|| format!("exporting {}", trained.weights.origin))?;
    let load = match done.architecture {
        Architecture::Llama => "AutoModelForCausalLM.from_pretrained(OUT)",
        Architecture::Iota => "AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True)",
    };
    let sections = trained.weights.model.n_sections();
    let boundaries = match sections {
        1 => "one section".to_string(),
        n => format!("{n} sections, {} boundaries", trained.wire),
    };
    println!(
        "iota export: {} ({} parameters, {boundaries}) -> {}: {}",
        trained.weights.origin,
        done.params,
        done.dir.display(),
        done.files.join(", ")
    );
    println!("  {}: load with {load}", done.architecture.class());
    for note in &done.notes {
        println!("  note: {note}");
    }
    Ok(())
}
