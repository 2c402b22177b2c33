//! `iota eval`: held-out loss and perplexity of a trained model on a data source, and its
//! accuracy on a multiple-choice task file.

use std::path::PathBuf;

use anyhow::{Context, bail};
use burn::tensor::backend::AutodiffBackend;
use clap::Args;
use serde::Serialize;

use super::trained::{self, ModelSource, Trained};
use crate::data::{DataSpec, Dataset};
use crate::infer::Chain;
use crate::infer::eval::{EvalReport, held_out};
use crate::infer::task::{TaskReport, read_questions, score};
use crate::mirror;
use crate::model::backend::{BackendTask, DeviceKind, dispatch};

/// Arguments of `iota eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The trained model.
    #[command(flatten)]
    pub source: ModelSource,
    /// Device: cpu, cuda, wgpu (GPU backends need the matching cargo feature).
    #[arg(long, value_name = "DEVICE", default_value = "cpu")]
    pub device: DeviceKind,
    /// Text to evaluate on: `synthetic[:SEED[:CHARS]]` or a .txt, .jsonl, .jsonl.gz,
    /// .jsonl.zst or .parquet file or directory, or a prepared token directory; its held-out windows (the ones `iota train`
    /// evaluates on) are scored.
    #[arg(long, value_name = "SRC")]
    pub data: Option<String>,
    /// The .jsonl field / .parquet column of --data holding the text (default: `text`).
    #[arg(long, value_name = "NAME", requires = "data")]
    pub text_column: Option<String>,
    /// Held-out windows to evaluate (all of them when the data has fewer).
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub windows: usize,
    /// Tokens per window (default: the length the model was trained on).
    #[arg(long, value_name = "L")]
    pub seq_len: Option<usize>,
    /// Windows per forward pass.
    #[arg(long, value_name = "B", default_value_t = 8)]
    pub batch_size: usize,
    /// Multiple-choice questions (JSONL: `{"context", "choices", "answer"}` per line) scored
    /// by the log-likelihood of each choice.
    #[arg(long, value_name = "FILE.jsonl")]
    pub task: Option<PathBuf>,
    /// Print the figures as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// What `iota eval` measured.
#[derive(Debug, Serialize)]
struct Report {
    model: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    eval: Option<EvalReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    task: Option<TaskReport>,
}

/// Runs `iota eval`.
///
/// # Errors
/// Neither `--data` nor `--task`, a checkpoint that cannot be found or read, unreadable
/// data, or a failure in the model.
pub fn run(args: EvalArgs) -> anyhow::Result<()> {
    if args.data.is_none() && args.task.is_none() {
        bail!("iota eval needs --data SRC (held-out loss) or --task FILE.jsonl (or both)");
    }
    let data = match &args.data {
        Some(text) => Some(
            text.parse::<DataSpec>()
                .and_then(|spec| spec.with_text_column(args.text_column.as_deref()))
                .with_context(|| format!("--data {text}"))?,
        ),
        None => None,
    };
    let trained = trained::open(&args.source)?;
    let device = args.device;
    let json = args.json;
    let report = dispatch(
        device,
        Task {
            args,
            data,
            trained,
        },
    )
    .map_err(anyhow::Error::msg)??;
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

struct Task {
    args: EvalArgs,
    data: Option<DataSpec>,
    trained: Trained,
}

impl BackendTask for Task {
    type Output = anyhow::Result<Report>;

    fn run<B: AutodiffBackend>(self, device: B::Device) -> Self::Output {
        let Task {
            args,
            data,
            trained,
        } = self;
        let chain = Chain::<B::InnerBackend>::new(&trained.weights, trained.wire, &device)
            .with_context(|| format!("loading {}", trained.weights.origin))?;
        let seq_len = args.seq_len.unwrap_or(trained.weights.context);
        if seq_len > chain.model().max_seq_len {
            bail!(
                "--seq-len {seq_len} exceeds the model's max_seq_len {}",
                chain.model().max_seq_len
            );
        }
        let eval = match &data {
            Some(spec) => {
                let local = mirror::fetch_to_cache(spec)
                    .with_context(|| format!("copying data `{spec}`"))?;
                let dataset = Dataset::load(&local, &trained.tokenizer, seq_len, 0)
                    .with_context(|| format!("loading data `{spec}`"))?;
                Some(held_out(&chain, &dataset, args.windows, args.batch_size)?)
            }
            None => None,
        };
        let task = match &args.task {
            Some(path) => {
                let questions = read_questions(path)?;
                Some(score(&chain, &trained.tokenizer, &questions)?)
            }
            None => None,
        };
        Ok(Report {
            model: trained.weights.origin.clone(),
            data: data.map(|d| d.to_string()),
            eval,
            task,
        })
    }
}

fn print_report(r: &Report) {
    if let (Some(e), Some(data)) = (&r.eval, &r.data) {
        println!(
            "loss {:.4} nats/token  perplexity {:.3}  bits/token {:.4}  windows {} ({} tokens)  data {data}  model {}",
            e.loss, e.perplexity, e.bits_per_token, e.windows, e.tokens, r.model
        );
    }
    if let Some(t) = &r.task {
        println!(
            "task accuracy {:.4} ({}/{})  per-token {:.4} ({}/{})  chance {:.4}  model {}",
            t.accuracy,
            t.correct,
            t.questions,
            t.accuracy_per_token,
            t.correct_per_token,
            t.questions,
            t.chance,
            r.model
        );
    }
}
