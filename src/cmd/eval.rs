//! `iota eval`: held-out loss and perplexity of a trained model on a data source, and its
//! accuracy on a multiple-choice task file.
//!
//! The held-out windows are those the run held out: the last 2% of the source's windows, or,
//! for a run that streamed its raw shards (`data.stream`, or `--block-shards`), the last 2%
//! of its block 0 (only that block is tokenized).

use std::path::PathBuf;

use anyhow::{Context, bail};
use burn::tensor::backend::AutodiffBackend;
use clap::Args;
use serde::Serialize;

use super::trained::{self, ModelSource, RunData, Trained};
use crate::data::{DataSpec, Dataset, StreamSettings};
use crate::infer::Chain;
use crate::infer::eval::{EvalReport, held_out, held_out_ablation};
use crate::infer::task::{TaskReport, read_questions, score};
use crate::mirror;
use crate::model::ablation::Ablation;
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
    /// .jsonl.zst or .parquet file or directory, or a prepared token directory; its held-out
    /// windows (the ones `iota train` evaluates on) are scored. Default: the run config's
    /// `data.source`, when the model comes with one (--config, or an `iota local --dir`).
    #[arg(long, value_name = "SRC")]
    pub data: Option<String>,
    /// The .jsonl field / .parquet column of --data holding the text (default: `text`).
    #[arg(long, value_name = "NAME", requires = "data")]
    pub text_column: Option<String>,
    /// Score the held-out windows of a run that streamed raw shards in blocks of N files
    /// (`data.stream.block_shards`): block 0's last 2%, not the whole source's. Default: the
    /// run config's `data.stream`, when the model comes with one; 0: the whole source's.
    #[arg(long, value_name = "N")]
    pub block_shards: Option<usize>,
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
    /// Also ablate every section boundary on the held-out windows: the loss with one
    /// boundary's output replaced by zeros, and by each channel's mean, in turn. A boundary
    /// whose ablation costs little marks a section the model hardly uses.
    #[arg(long)]
    pub ablation: bool,
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
    /// Files per block of the streamed layout whose block 0 held the windows out.
    #[serde(skip_serializing_if = "Option::is_none")]
    block_shards: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    eval: Option<EvalReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ablation: Option<Ablation>,
    #[serde(skip_serializing_if = "Option::is_none")]
    task: Option<TaskReport>,
}

/// What `iota eval` says when it has nothing to do.
const NO_DATA: &str = "iota eval needs --data SRC (held-out loss) or --task FILE.jsonl (or both)";

/// The data `iota eval` scores and the layout it is read in.
#[derive(Debug, PartialEq)]
struct EvalData {
    /// The source.
    spec: DataSpec,
    /// The streamed block layout, when the run streamed it.
    stream: Option<StreamSettings>,
}

/// Which data to score, and in which layout: `--data` (else the run's `data.source`) and
/// `--block-shards` (else the run's `data.stream`; 0 turns it off). `None` when neither
/// names a source.
///
/// # Errors
/// A `--data` or `--text-column` that does not parse.
fn eval_data(args: &EvalArgs, run: Option<&RunData>) -> anyhow::Result<Option<EvalData>> {
    let spec = match (&args.data, run) {
        (Some(text), _) => text
            .parse::<DataSpec>()
            .and_then(|spec| spec.with_text_column(args.text_column.as_deref()))
            .with_context(|| format!("--data {text}"))?,
        (
            None,
            Some(RunData {
                source: Some(source),
                ..
            }),
        ) => source.clone(),
        (None, _) => return Ok(None),
    };
    let run_stream = run.and_then(|run| run.stream);
    let stream = match args.block_shards {
        Some(0) => None,
        Some(block_shards) => Some(StreamSettings {
            block_shards,
            ..run_stream.unwrap_or_default()
        }),
        None => run_stream,
    };
    // Only block 0 holds held-out windows: nothing is tokenized ahead of it.
    let stream = stream.map(|settings| StreamSettings {
        ahead: 0,
        ..settings
    });
    Ok(Some(EvalData { spec, stream }))
}

/// Runs `iota eval`.
///
/// # Errors
/// No data (neither `--data` nor a run config's) and no `--task`, a checkpoint that cannot be
/// found or read, unreadable data, or a failure in the model.
pub fn run(args: EvalArgs) -> anyhow::Result<()> {
    // A run config (--config, an `iota local --dir`'s) may name the data: known once read.
    let run_config = args.source.config.is_some() || trained::is_local_dir(&args.source.checkpoint);
    if args.data.is_none() && args.task.is_none() && !run_config {
        bail!("{NO_DATA}");
    }
    let trained = trained::open(&args.source)?;
    let data = eval_data(&args, trained.run_data.as_ref())?;
    if data.is_none() && args.task.is_none() {
        bail!("{NO_DATA}");
    }
    if args.ablation && data.is_none() {
        bail!("--ablation needs held-out data: --data SRC, or a run config that names its source");
    }
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
    data: Option<EvalData>,
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
        let mut chain = Chain::<B::InnerBackend>::new(&trained.weights, trained.wire, &device)
            .with_context(|| format!("loading {}", trained.weights.origin))?;
        let seq_len = args.seq_len.unwrap_or(trained.weights.context);
        if seq_len > chain.model().max_seq_len {
            bail!(
                "--seq-len {seq_len} exceeds the model's max_seq_len {}",
                chain.model().max_seq_len
            );
        }
        let (eval, ablation, block_shards) = match &data {
            Some(EvalData { spec, stream }) => {
                let local = mirror::fetch_to_cache(spec)
                    .with_context(|| format!("copying data `{spec}`"))?;
                let dataset = Dataset::load_with(&local, &trained.tokenizer, seq_len, 0, *stream)
                    .with_context(|| format!("loading data `{spec}`"))?;
                // The synthetic corpus and prepared directories are never streamed.
                let streamed = dataset.stream_stats().and(stream.map(|s| s.block_shards));
                let report = held_out(&chain, &dataset, args.windows, args.batch_size)?;
                let ablation = if args.ablation {
                    let a = held_out_ablation(&mut chain, &dataset, args.windows, args.batch_size);
                    Some(a.context("ablating the boundaries")?)
                } else {
                    None
                };
                (Some(report), ablation, streamed)
            }
            None => (None, None, None),
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
            data: data.map(|d| d.spec.to_string()),
            block_shards,
            eval,
            ablation,
            task,
        })
    }
}

fn print_report(r: &Report) {
    if let (Some(e), Some(data)) = (&r.eval, &r.data) {
        let layout = r
            .block_shards
            .map(|n| format!(" (held out in block 0 of blocks of {n} files)"))
            .unwrap_or_default();
        println!(
            "loss {:.4} nats/token  perplexity {:.3}  bits/token {:.4}  windows {} ({} tokens)  data {data}{layout}  model {}",
            e.loss, e.perplexity, e.bits_per_token, e.windows, e.tokens, r.model
        );
    }
    if let Some(a) = &r.ablation {
        for line in a.lines() {
            println!("ablation {line}");
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `iota eval` arguments parsed from `flags`.
    fn args(flags: &[&str]) -> EvalArgs {
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            eval: EvalArgs,
        }
        let mut argv = vec!["eval", "--checkpoint", "ckpt"];
        argv.extend_from_slice(flags);
        Cli::try_parse_from(argv).unwrap().eval
    }

    #[test]
    fn the_runs_source_and_stream_apply_unless_the_flags_say_otherwise() {
        let streamed = StreamSettings {
            block_shards: 4,
            ahead: 3,
            threads: 5,
        };
        let run = RunData {
            source: Some(DataSpec::path("shards")),
            stream: Some(streamed),
        };
        let read = |flags: &[&str], run: Option<&RunData>| eval_data(&args(flags), run).unwrap();
        let held = |block_shards| {
            Some(StreamSettings {
                block_shards,
                ahead: 0,
                threads: 5,
            })
        };
        assert_eq!(read(&[], None), None);
        let from_run = read(&[], Some(&run)).unwrap();
        assert_eq!(from_run.spec, DataSpec::path("shards"));
        assert_eq!(from_run.stream, held(4));
        let other = read(&["--data", "other", "--block-shards", "2"], Some(&run)).unwrap();
        assert_eq!(other.spec, DataSpec::path("other"));
        assert_eq!(other.stream, held(2));
        assert_eq!(
            read(&["--block-shards", "0"], Some(&run)).unwrap().stream,
            None
        );
        let flag_only = read(&["--data", "x", "--block-shards", "3"], None).unwrap();
        assert_eq!(
            flag_only.stream.map(|s| (s.block_shards, s.ahead)),
            Some((3, 0))
        );
        assert_eq!(read(&["--data", "x"], None).unwrap().stream, None);
        // An `iota train` config that names no source leaves --data to the flag.
        let unnamed = RunData {
            source: None,
            ..run
        };
        assert_eq!(read(&[], Some(&unnamed)), None);
        assert_eq!(
            read(&["--data", "x"], Some(&unnamed)).unwrap().stream,
            held(4)
        );
    }
}
