//! `iota bench learning`: does the network learn as well as one process? Runs `iota train`
//! and a local network (`iota local`, real processes) on the same model, data and token
//! budget, then prints held-out loss at equal tokens at every evaluation (by default every
//! merge; `--eval-every`), the final gap in % and in
//! excess loss above the synthetic corpus's entropy floor, and the throughput of each.
//!
//! How each number is taken:
//! - `iota train`: a child process with `--eval-every` set to the evaluation interval (a
//!   multiple of the merge interval), so it evaluates at the same token counts as the
//!   network's evaluated merges (the mean loss on the first
//!   32 held-out windows, as always).
//! - with M > 1 miners per section, also `iota train` as perfect M-way data parallelism would
//!   train (batch M times larger, M times fewer steps, the same tokens): the bound that
//!   averaging the miners of a section approaches at best, printed as its own column.
//! - network: `iota local` with the same budget as `max_samples`. At the start of every evaluated epoch
//!   the network evaluates the weights the epoch starts with (the merged model) on the same
//!   held-out windows, through the network itself; the run ends with a merge of its last
//!   epoch and that model's evaluation. An evaluation after `n` completed training samples
//!   has seen the tokens of `iota train`'s step `n`.
//! - throughput: `iota train`'s own tokens/s; the network's steady state from `iota local
//!   --metrics-out` (first completed sample to the last status poll, merges and evaluations
//!   included).
//!
//! Flags choose the network's variant (in-flight bound, local steps, weight stashing,
//! look-ahead, learning-rate schedule and the miners' rate scale, outer step, merge operator,
//! interval and wire format), so every
//! ablation of docs/learning-log.md's tables is one command. `iota train` always runs with its
//! defaults: it is the reference.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use clap::Args;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::network::steady_state;
use crate::api::EvalSummary;
use crate::cmd::local::{LocalArgs, generated_config, model_overrides, with_preset};
use crate::codec::{MergeWire, WireDtype};
use crate::data::{DataSpec, Dataset, Tokenizer};
use crate::merge::{MergeOp, OuterStep};
use crate::model::ModelConfig;
use crate::model::ablation::Ablation;
use crate::model::backend::DeviceKind;
use crate::orchestrator::RunConfig;

/// Arguments of `iota bench learning`.
#[derive(Debug, Args)]
pub struct BenchLearningArgs {
    /// Model preset.
    #[arg(long, value_name = "NAME", default_value = "tiny")]
    pub preset: String,
    /// Model fields over the preset for both runs, as a YAML mapping (a run config's `model`
    /// section, e.g. `{d_b: 1, reembed: true}`).
    #[arg(long, value_name = "FILE.yaml")]
    pub model: Option<PathBuf>,
    /// Training text for both runs, as `iota train --data` takes it: `synthetic` (the built-in
    /// corpus, whose entropy floor is known), a .txt / .jsonl / .parquet file, a directory of
    /// them, or one `iota data prepare` wrote.
    #[arg(long, value_name = "SRC", default_value = "synthetic")]
    pub data: String,
    /// The .jsonl field / .parquet column holding the text (default `text`).
    #[arg(long, value_name = "NAME")]
    pub text_column: Option<String>,
    /// Token budget in samples (micro-batches): `iota train --steps N`, `iota local --samples N`.
    #[arg(long, value_name = "N", default_value_t = 1500)]
    pub samples: u64,
    /// Miners per section in the network.
    #[arg(long, value_name = "M", default_value_t = 1)]
    pub miners_per_section: usize,
    /// Windows per sample.
    #[arg(long, value_name = "B", default_value_t = 4)]
    pub batch_size: usize,
    /// Tokens per window.
    #[arg(long, value_name = "L", default_value_t = 64)]
    pub seq_len: usize,
    /// Peak learning rate (both runs).
    #[arg(long, value_name = "LR", default_value_t = 0.003)]
    pub lr: f64,
    /// Seed of the initial weights and of the order of training windows (both runs; the
    /// held-out windows do not depend on it), so a gap can be measured over several seeds.
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// Samples per training epoch of the network, i.e. between merges.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub merge_every: u64,
    /// Samples between evaluations of both runs (default: `--merge-every`; a multiple of it).
    /// The network then evaluates every `N / merge-every`-th epoch (run config `eval_every`)
    /// and its final model, so frequent merges need not pay for an evaluation each.
    #[arg(long, value_name = "N")]
    pub eval_every: Option<u64>,
    /// Compute threads per miner.
    #[arg(long, value_name = "T", default_value_t = 1)]
    pub threads: usize,
    /// Boundary encoding (both runs).
    #[arg(long, value_name = "DTYPE", default_value = "bf16")]
    pub wire: WireDtype,
    /// Variant: forwards a miner may hold awaiting their backward.
    #[arg(long, value_name = "K", default_value_t = 4)]
    pub max_in_flight: usize,
    /// Variant: miner optimizer step every N backwards.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub local_steps: u64,
    /// Variant: synchronous optimizer steps of G samples each (run config `samples_per_step`):
    /// each `iota train` batch of `--batch-size` windows becomes G network samples of
    /// `batch-size / G` windows that make one optimizer step, so with one miner per section
    /// the network computes `iota train`'s steps. 0: asynchronous steps (`--local-steps`).
    #[arg(long, value_name = "G", default_value_t = 0)]
    pub samples_per_step: u64,
    /// Variant: each `iota train` batch of `--batch-size` windows becomes G network samples of
    /// `batch-size / G` windows, each stepped alone (asynchronous steps), so every lane of M
    /// miners takes `G / M` of `iota train`'s steps on `1 / G` of its batch. Merges, the
    /// learning-rate warm-up and `--bottleneck-warmup` keep their tokens (G times the samples).
    #[arg(
        long,
        value_name = "G",
        default_value_t = 1,
        conflicts_with = "samples_per_step"
    )]
    pub split_samples: u64,
    /// Variant: recompute backwards at the current weights instead of the forward's.
    #[arg(long)]
    pub no_weight_stashing: bool,
    /// Lane routing (run config `lanes`, on by default): a sample goes through the same-ranked
    /// miner of every section, so each lane is one consistent pipeline between merges.
    /// `--lanes false`: mixed routing (any miner of the next section), the variant.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub lanes: bool,
    /// Variant: the first N samples (a multiple of --merge-every) go through one lane only
    /// (run config `single_lane_samples`): each section's first-ranked miner trains alone,
    /// and the merge after them gives every miner its state.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub single_lane: u64,
    /// Variant: during --single-lane, each lane miner holds at most N forwards awaiting a
    /// backward (run config `single_lane_max_in_flight`, default 1; 0: --max-in-flight).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub single_lane_in_flight: usize,
    /// Variant: the first N samples (a multiple of --merge-every) run every miner of every
    /// lane at --early-in-flight-cap forwards awaiting a backward (run config
    /// `early_in_flight_samples`).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub early_in_flight: u64,
    /// The in-flight cap during --early-in-flight (run config `early_max_in_flight`, default
    /// 1; 0: --max-in-flight).
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub early_in_flight_cap: usize,
    /// Variant: the first N samples (a multiple of --early-merge-every) merge every
    /// --early-merge-every samples instead of every --merge-every (run config
    /// `early_merge_samples`). The network's evaluations then fall at other sample counts
    /// than `iota train`'s until the last one.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub early_merge: u64,
    /// Samples per epoch during --early-merge (run config `early_merge_every`).
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub early_merge_every: u64,
    /// Variant: forwards at the weights extrapolated to the step their gradient is applied at.
    #[arg(long)]
    pub lookahead: bool,
    /// Both runs: a warm-up without the bottleneck over the first N `iota train` steps (the
    /// network's first N samples, or N synchronous steps): `iota train --bottleneck-warmup N`
    /// and the run config's `bottleneck_warmup`.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub bottleneck_warmup: u64,
    /// Variant: AdamW's first-moment decay of the miners (default: `iota train`'s).
    #[arg(long, value_name = "BETA1")]
    pub beta1: Option<f64>,
    /// Variant: the miners' first-moment decay grows with their section's staleness, from
    /// `--beta1` at the tail to this (run config `optimizer.beta1_max`; 0.99: the IOTA
    /// reference's per-stage rule).
    #[arg(long, value_name = "BETA1")]
    pub beta1_max: Option<f64>,
    /// The miners' asynchronous steps use Nesterov momentum, NAdam with decoupled weight decay
    /// (run config `optimizer.nesterov`, on by default; the IOTA reference's inner optimizer).
    /// `--nesterov false`: AdamW, the variant.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub nesterov: bool,
    /// Both runs: the hidden matrices step with Muon (`iota train --muon`, run config
    /// `optimizer.muon`).
    #[arg(long)]
    pub muon: bool,
    /// Variant: how fast NAdam's momentum warms up from `beta1 / 2` towards `beta1` (run config
    /// `optimizer.momentum_decay`; default 0.004, PyTorch's, under which the momentum is still
    /// about `0.56 beta1` after 750 steps; 1.0 reaches `0.93 beta1` by step 50).
    #[arg(long, value_name = "RATE")]
    pub momentum_decay: Option<f64>,
    /// Variant: the miners' gradient-norm clip per section (0: off; default: `iota train`'s).
    #[arg(long, value_name = "NORM")]
    pub grad_clip: Option<f64>,
    /// Variant: constant learning rate after the warmup instead of `iota train`'s cosine.
    #[arg(long)]
    pub constant_lr: bool,
    /// Variant: the miners' peak learning rate is `--lr` times this (default 1: `iota train`'s
    /// rate; e.g. 1.414 = the square-root rule for 2 miners per section).
    #[arg(long, value_name = "F")]
    pub miner_lr_scale: Option<f64>,
    /// Variant: the network's learning-rate warm-up in `iota train` steps (the network's
    /// samples, or synchronous steps; with `--split-samples` G, G samples a step), run config
    /// `schedule.warmup_steps` (default: `iota train`'s 20).
    #[arg(long, value_name = "STEPS")]
    pub miner_warmup: Option<u64>,
    /// Variant: DiLoCo outer step `LR,MOMENTUM` on the merged parameters (e.g. 0.7,0.9).
    #[arg(long, value_name = "LR,MOMENTUM")]
    pub outer: Option<String>,
    /// Variant: merge operator.
    #[arg(long, value_name = "OP", default_value = "mean")]
    pub merge_op: MergeOp,
    /// Variant: element format of the merge's uploads and partitions (run config
    /// `merge.wire`): f32, bf16, int8, dct, sign, sign2, q4, q4v2, q4v2m4, q4v2m2, or
    /// NAME:CHUNK[:KEEP[:MERGED_KEEP]].
    #[arg(long, value_name = "FORMAT", default_value = "f32")]
    pub merge_wire: MergeWire,
    /// Keep both runs (configs, logs, checkpoints, metrics) in this directory.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Reuse the `iota train` run already in `--dir` when it was made with the same preset,
    /// budget, batch, sequence length, learning rate, interval and wire.
    #[arg(long, requires = "dir")]
    pub reuse_train: bool,
    /// Also write the results as JSON to this file.
    #[arg(long, value_name = "FILE.json")]
    pub summary_out: Option<PathBuf>,
    /// Skip the perfect data-parallel reference run (it doubles `iota train`'s time; the
    /// comparison itself is against `iota train` alone).
    #[arg(long)]
    pub no_data_parallel: bool,
}

/// One evaluation point.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EvalPoint {
    /// Samples trained on before the evaluation.
    pub samples: u64,
    /// Mean held-out loss.
    pub eval_loss: f32,
}

/// What one side of the comparison measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Evaluations, in order.
    pub evals: Vec<EvalPoint>,
    /// Throughput (network: steady state).
    pub tokens_per_s: f64,
    /// Network samples completed (with `--samples-per-step` G, G per `iota train` batch) or
    /// steps run (train).
    pub completed: u64,
    /// Samples dropped (network; 0 for train).
    pub dropped: u64,
    /// The final model's held-out loss with each boundary's output replaced in turn (runs of
    /// more than one section; saved results from before it have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ablation: Option<Ablation>,
}

impl RunResult {
    fn at(&self, samples: u64) -> Option<f32> {
        self.evals
            .iter()
            .find(|p| p.samples == samples)
            .map(|p| p.eval_loss)
    }
}

/// The JSON summary (`--summary-out`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LearningSummary {
    /// The network variant, as flags.
    pub variant: String,
    /// The training text (`--data`).
    #[serde(default = "synthetic")]
    pub data: String,
    /// Samples of the budget.
    pub samples: u64,
    /// Tokens per sample.
    pub tokens_per_sample: u64,
    /// Entropy floor of the data (nats/token), when known.
    pub entropy_floor: Option<f64>,
    /// `iota train`.
    pub train: RunResult,
    /// `iota train` as perfect data parallelism over the section's miners would train: batch
    /// `miners x batch`, `samples / miners` steps (evaluations mapped to samples); only with
    /// more than one miner per section.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_parallel: Option<RunResult>,
    /// The network.
    pub network: RunResult,
    /// Samples of the last point both evaluated.
    pub final_samples: u64,
    /// `iota train`'s eval loss there.
    pub final_train: f32,
    /// The network's eval loss there.
    pub final_network: f32,
    /// `(network - train) / train`, in %.
    pub gap_pct: f64,
    /// `(network - floor) / (train - floor)`: how many times the excess loss, when the floor
    /// is known.
    pub excess_ratio: Option<f64>,
}

impl LearningSummary {
    /// Miners per section the data-parallel reference stands for (its batch over the sample's).
    fn data_parallel_ways(&self) -> u64 {
        self.data_parallel
            .as_ref()
            .map_or(1, |d| self.samples / d.completed.max(1))
    }
}

/// The identity of an `iota train` reference run, for `--reuse-train`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct TrainKey {
    preset: String,
    samples: u64,
    batch_size: usize,
    seq_len: usize,
    lr: f64,
    /// Steps between evaluations (named for the merge interval, which it was before
    /// `--eval-every`, so saved runs are still recognised).
    #[serde(rename = "merge_every")]
    eval_every: u64,
    wire: String,
    #[serde(default)]
    seed: u64,
    /// The model fields given with `--model` (none: the preset's).
    #[serde(default)]
    model: Option<serde_json::Value>,
    /// The training text (`--data`; saved runs from before it are the synthetic corpus's).
    #[serde(default = "synthetic")]
    data: String,
    /// `--text-column`.
    #[serde(default)]
    text_column: Option<String>,
    /// `--bottleneck-warmup` (saved runs from before it had none).
    #[serde(default)]
    bottleneck_warmup: u64,
    /// `--muon` (saved runs from before it stepped with AdamW).
    #[serde(default)]
    muon: bool,
}

fn synthetic() -> String {
    "synthetic".into()
}

impl BenchLearningArgs {
    /// Samples between evaluations of both runs.
    fn eval_interval(&self) -> u64 {
        self.eval_every.unwrap_or(self.merge_every)
    }

    /// `iota train` with `ways` times the batch for `1 / ways` of the steps (1: the reference).
    fn train_key(&self, ways: u64) -> anyhow::Result<TrainKey> {
        Ok(TrainKey {
            preset: self.preset.clone(),
            samples: self.samples / ways,
            batch_size: self.batch_size * ways as usize,
            seq_len: self.seq_len,
            lr: self.lr,
            eval_every: self.eval_interval() / ways,
            wire: self.wire.to_string(),
            seed: self.seed,
            model: self.model.as_deref().map(model_overrides).transpose()?,
            data: self.data.clone(),
            text_column: self.text_column.clone(),
            bottleneck_warmup: self.bottleneck_warmup / ways,
            muon: self.muon,
        })
    }

    /// The model both runs train: the preset with `--model`'s fields over it.
    fn model_config(&self) -> anyhow::Result<ModelConfig> {
        let fields = match &self.model {
            Some(path) => model_overrides(path)?,
            None => json!({}),
        };
        Ok(ModelConfig::from_value(&fields, &self.preset)?)
    }

    /// Network samples per `iota train` batch: `--samples-per-step`'s synchronous steps or
    /// `--split-samples`' asynchronous ones (the flags conflict; 1: one sample per batch).
    fn split(&self) -> u64 {
        self.samples_per_step.max(1) * self.samples_per_schedule_step()
    }

    /// Network samples per schedule step: the schedule and the warm-ups count synchronous
    /// steps (one each), or asynchronous samples (`--split-samples` per `iota train` step).
    fn samples_per_schedule_step(&self) -> u64 {
        self.split_samples.max(1)
    }

    /// The variant as the flags that select it.
    fn variant(&self) -> String {
        let mut v = match &self.model {
            Some(path) => format!("--model {} ", path.display()),
            None => String::new(),
        };
        v += &format!(
            "--miners-per-section {} --max-in-flight {} --local-steps {} --merge-every {} --merge-op {}",
            self.miners_per_section,
            self.max_in_flight,
            self.local_steps,
            self.merge_every,
            self.merge_op
        );
        if let Some(every) = self.eval_every {
            v.push_str(&format!(" --eval-every {every}"));
        }
        if self.samples_per_step > 0 {
            v.push_str(&format!(" --samples-per-step {}", self.samples_per_step));
        }
        if self.split_samples > 1 {
            v.push_str(&format!(" --split-samples {}", self.split_samples));
        }
        if self.merge_wire != MergeWire::F32 {
            v.push_str(&format!(" --merge-wire {}", self.merge_wire));
        }
        if self.no_weight_stashing {
            v.push_str(" --no-weight-stashing");
        }
        if !self.lanes {
            v.push_str(" --lanes false");
        }
        if self.single_lane > 0 {
            v.push_str(&format!(" --single-lane {}", self.single_lane));
        }
        if self.single_lane > 0 && self.single_lane_in_flight != 1 {
            v.push_str(&format!(
                " --single-lane-in-flight {}",
                self.single_lane_in_flight
            ));
        }
        if self.early_in_flight > 0 {
            v.push_str(&format!(
                " --early-in-flight {} --early-in-flight-cap {}",
                self.early_in_flight, self.early_in_flight_cap
            ));
        }
        if self.early_merge > 0 {
            v.push_str(&format!(
                " --early-merge {} --early-merge-every {}",
                self.early_merge, self.early_merge_every
            ));
        }
        if self.bottleneck_warmup > 0 {
            v.push_str(&format!(" --bottleneck-warmup {}", self.bottleneck_warmup));
        }
        if self.lookahead {
            v.push_str(" --lookahead");
        }
        if let Some(beta1) = self.beta1 {
            v.push_str(&format!(" --beta1 {beta1}"));
        }
        if let Some(max) = self.beta1_max {
            v.push_str(&format!(" --beta1-max {max}"));
        }
        if !self.nesterov {
            v.push_str(" --nesterov false");
        }
        if self.muon {
            v.push_str(" --muon");
        }
        if let Some(rate) = self.momentum_decay {
            v.push_str(&format!(" --momentum-decay {rate}"));
        }
        if let Some(clip) = self.grad_clip {
            v.push_str(&format!(" --grad-clip {clip}"));
        }
        if self.constant_lr {
            v.push_str(" --constant-lr");
        }
        if let Some(outer) = &self.outer {
            v.push_str(&format!(" --outer {outer}"));
        }
        if let Some(scale) = self.miner_lr_scale {
            v.push_str(&format!(" --miner-lr-scale {scale}"));
        }
        if let Some(steps) = self.miner_warmup {
            v.push_str(&format!(" --miner-warmup {steps}"));
        }
        v
    }
}

/// Parses `LR,MOMENTUM` as the run config's `merge.outer` takes it.
fn parse_outer(text: &str) -> anyhow::Result<OuterStep> {
    text.parse().map_err(|e| anyhow::anyhow!("--outer {e}"))
}

/// Runs `iota bench learning`.
///
/// # Errors
/// Bad flags, or a run that fails.
pub fn run(args: BenchLearningArgs) -> anyhow::Result<()> {
    for (flag, value, why) in [
        (
            "--single-lane",
            args.single_lane,
            "the lane ends with a merge",
        ),
        (
            "--early-in-flight",
            args.early_in_flight,
            "the cap ends with an epoch",
        ),
    ] {
        if !value.is_multiple_of(args.merge_every.max(1)) {
            bail!(
                "{flag} {value} must be a multiple of --merge-every {} ({why})",
                args.merge_every
            );
        }
    }
    if args.samples < args.merge_every || args.merge_every == 0 {
        bail!(
            "--samples ({}) must be at least --merge-every ({}), which must be positive",
            args.samples,
            args.merge_every
        );
    }
    if !args.eval_interval().is_multiple_of(args.merge_every) || args.eval_interval() == 0 {
        bail!(
            "--eval-every {} must be a positive multiple of --merge-every {} (the network \
             evaluates the model an epoch starts with)",
            args.eval_interval(),
            args.merge_every
        );
    }
    if let Some(outer) = &args.outer {
        parse_outer(outer)?;
    }
    if args.samples_per_step > 0 && !(args.batch_size as u64).is_multiple_of(args.samples_per_step)
    {
        bail!(
            "--samples-per-step {} must divide --batch-size {}: each iota train batch is split \
             into that many network samples",
            args.samples_per_step,
            args.batch_size
        );
    }
    if args.split_samples == 0 || !(args.batch_size as u64).is_multiple_of(args.split_samples) {
        bail!(
            "--split-samples {} must divide --batch-size {}: each iota train batch is split \
             into that many network samples",
            args.split_samples,
            args.batch_size
        );
    }
    if let Some(scale) = args.miner_lr_scale
        && !(scale.is_finite() && scale > 0.0)
    {
        bail!("--miner-lr-scale {scale}: expected a positive number");
    }
    let cfg = args.model_config()?;
    let (dir, temporary) = match &args.dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("iota-bench-learning-{}", std::process::id())),
            true,
        ),
    };
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize().context("resolving --dir")?;
    println!(
        "iota bench learning: preset {}, data {}, {} samples of {} x {} tokens, seed {}, network: {} sections, {}",
        cfg.name,
        args.data,
        args.samples,
        args.batch_size,
        args.seq_len,
        args.seed,
        cfg.n_sections(),
        args.variant()
    );
    let result = compare(&args, &dir);
    if temporary {
        // Best effort: a leftover directory in the temp dir is harmless.
        let _ = fs::remove_dir_all(&dir);
    }
    let summary = result?;
    print_table(&summary);
    if let Some(path) = &args.summary_out {
        let text = serde_json::to_vec_pretty(&summary)?;
        fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn compare(args: &BenchLearningArgs, dir: &Path) -> anyhow::Result<LearningSummary> {
    // Only the synthetic corpus has a known floor; real text has none to measure excess by.
    let floor = if args.data == "synthetic" {
        Dataset::load(&DataSpec::default(), &Tokenizer::byte(), args.seq_len, 0)?.entropy_floor()
    } else {
        None
    };
    let train = run_train(args, &dir.join("train"), 1)?;
    // Perfect data parallelism over the section's miners, where the budget divides evenly.
    let ways = args.miners_per_section as u64;
    let data_parallel = if ways > 1
        && !args.no_data_parallel
        && args.samples.is_multiple_of(ways)
        && args.eval_interval().is_multiple_of(ways)
    {
        Some(run_train(args, &dir.join("train-data-parallel"), ways)?)
    } else {
        None
    };
    let network = run_network(args, &dir.join("network"))?;
    // The last evaluation of each; the network's may have seen a few samples fewer (samples
    // dropped on the way), never more.
    let last_train = train
        .evals
        .last()
        .context("iota train made no evaluation")?;
    let last_network = network
        .evals
        .last()
        .context("the network made no evaluation")?;
    let (final_samples, final_train, final_network) = (
        last_network.samples,
        last_train.eval_loss,
        last_network.eval_loss,
    );
    let gap_pct = f64::from(final_network - final_train) / f64::from(final_train) * 100.0;
    let excess_ratio = floor.map(|f| (f64::from(final_network) - f) / (f64::from(final_train) - f));
    Ok(LearningSummary {
        variant: args.variant(),
        data: args.data.clone(),
        samples: args.samples,
        tokens_per_sample: (args.batch_size * args.seq_len) as u64,
        entropy_floor: floor,
        train,
        data_parallel,
        network,
        final_samples,
        final_train,
        final_network,
        gap_pct,
        excess_ratio,
    })
}

/// Runs (or reuses) in `dir` `iota train` on the budget with `ways` times the batch for
/// `1 / ways` of the steps (1: the reference); evaluations are reported at the samples (of
/// `--batch-size` windows) they had seen.
fn run_train(args: &BenchLearningArgs, dir: &Path, ways: u64) -> anyhow::Result<RunResult> {
    let key = args.train_key(ways)?;
    let key_path = dir.join("reference.json");
    let result_path = dir.join("result.json");
    if args.reuse_train
        && let (Ok(saved), Ok(result)) = (fs::read(&key_path), fs::read(&result_path))
        && serde_json::from_slice::<TrainKey>(&saved).ok() == Some(key.clone())
    {
        eprintln!("reusing the iota train run in {}", dir.display());
        let mut result: RunResult =
            serde_json::from_slice(&result).context("reading the reused train result")?;
        // A result saved before it carried the ablation: `iota train`'s own summary has it.
        if result.ablation.is_none() {
            result.ablation = train_ablation(&dir.join("summary.json"))?;
        }
        return Ok(result);
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let metrics = dir.join("metrics.jsonl");
    let summary = dir.join("summary.json");
    let exe = std::env::current_exe().context("locating the iota binary")?;
    eprintln!(
        "running iota train ({} steps of batch {})...",
        key.samples, key.batch_size
    );
    // The model as `iota train` reads it: the preset, or a config holding `--model`'s fields.
    let model_args = match &key.model {
        Some(fields) => {
            let model = with_preset(fields.clone(), &args.preset);
            let path = dir.join("train.yaml");
            fs::write(&path, serde_norway::to_string(&json!({ "model": model }))?)
                .with_context(|| format!("writing {}", path.display()))?;
            vec!["--config".to_string(), path.display().to_string()]
        }
        None => vec!["--preset".to_string(), args.preset.clone()],
    };
    let out = Command::new(exe)
        .arg("train")
        .args(&model_args)
        .args(["--steps", &key.samples.to_string()])
        .args(["--batch-size", &key.batch_size.to_string()])
        .args(["--seq-len", &args.seq_len.to_string()])
        .args(["--lr", &args.lr.to_string()])
        .args(["--eval-every", &key.eval_every.to_string()])
        .args(["--wire", &args.wire.to_string()])
        .args(["--seed", &args.seed.to_string()])
        .args(["--bottleneck-warmup", &key.bottleneck_warmup.to_string()])
        .args(key.muon.then_some("--muon"))
        .args(["--data", &key.data])
        .args(
            key.text_column
                .iter()
                .flat_map(|c| ["--text-column".to_string(), c.clone()]),
        )
        .arg("--out")
        .arg(dir.join("checkpoint"))
        .arg("--metrics-out")
        .arg(&metrics)
        .arg("--summary-out")
        .arg(&summary)
        .arg("--quiet")
        .stdin(Stdio::null())
        .output()
        .context("starting iota train")?;
    if !out.status.success() {
        bail!(
            "iota train failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text =
        fs::read_to_string(&metrics).with_context(|| format!("reading {}", metrics.display()))?;
    let summary: serde_json::Value = serde_json::from_slice(
        &fs::read(&summary).with_context(|| format!("reading {}", summary.display()))?,
    )?;
    let mut evals = Vec::new();
    if let Some(initial) = summary["initial_eval_loss"].as_f64() {
        evals.push(EvalPoint {
            samples: 0,
            eval_loss: initial as f32,
        });
    }
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).context("a train metrics line")?;
        if let (Some(step), Some(eval)) = (v["step"].as_u64(), v["eval_loss"].as_f64()) {
            evals.push(EvalPoint {
                samples: step * ways,
                eval_loss: eval as f32,
            });
        }
    }
    let result = RunResult {
        evals,
        tokens_per_s: summary["tokens_per_s"].as_f64().unwrap_or(0.0),
        completed: summary["step"].as_u64().unwrap_or(0),
        dropped: 0,
        ablation: serde_json::from_value(summary["ablation"].clone())
            .context("reading iota train's ablation")?,
    };
    fs::write(&key_path, serde_json::to_vec(&key)?)?;
    fs::write(&result_path, serde_json::to_vec(&result)?)?;
    Ok(result)
}

/// Puts the network variant's flags over the generated run config `config`.
fn apply_variant(args: &BenchLearningArgs, config: &mut serde_json::Value) -> anyhow::Result<()> {
    let split = args.split();
    config["local_steps"] = json!(args.local_steps);
    config["wire"] = json!(args.wire.to_string());
    config["weight_stashing"] = json!(!args.no_weight_stashing);
    config["lookahead"] = json!(args.lookahead);
    config["lanes"] = json!(args.lanes);
    config["single_lane_samples"] = json!(args.single_lane * split);
    config["single_lane_max_in_flight"] = json!(args.single_lane_in_flight);
    config["early_in_flight_samples"] = json!(args.early_in_flight * split);
    config["early_max_in_flight"] = json!(args.early_in_flight_cap);
    config["early_merge_samples"] = json!(args.early_merge * split);
    config["early_merge_every"] = json!(args.early_merge_every * split);
    if let Some(beta1) = args.beta1 {
        config["optimizer"]["beta1"] = json!(beta1);
    }
    if let Some(max) = args.beta1_max {
        config["optimizer"]["beta1_max"] = json!(max);
    }
    if !args.nesterov {
        config["optimizer"]["nesterov"] = json!(false);
    }
    if args.muon {
        config["optimizer"]["muon"] = json!(true);
    }
    if let Some(rate) = args.momentum_decay {
        config["optimizer"]["momentum_decay"] = json!(rate);
    }
    if let Some(clip) = args.grad_clip {
        config["optimizer"]["grad_clip"] = json!(clip);
    }
    if args.constant_lr {
        config["schedule"]["total_steps"] = json!(u64::MAX);
        config["schedule"]["min_ratio"] = json!(1.0);
    }
    if let Some(scale) = args.miner_lr_scale {
        config["schedule"]["peak"] = json!(args.lr * scale);
    }
    let per_step = args.samples_per_schedule_step();
    if let Some(steps) = args.miner_warmup {
        config["schedule"]["warmup_steps"] = json!(steps * per_step);
    } else if per_step > 1 {
        let steps = config["schedule"]["warmup_steps"]
            .as_u64()
            .context("the generated run config has no schedule.warmup_steps to scale")?;
        config["schedule"]["warmup_steps"] = json!(steps * per_step);
    }
    if let Some(outer) = &args.outer {
        config["merge"]["outer"] = serde_json::to_value(parse_outer(outer)?)?;
    }
    Ok(())
}

/// Runs the network variant in `dir`; its evaluations come from the network itself.
fn run_network(args: &BenchLearningArgs, dir: &Path) -> anyhow::Result<RunResult> {
    let listen = super::network::fresh_run_dir(dir)?;
    // Synchronous or asynchronous steps split each `iota train` batch into G network samples.
    let split = args.split();
    let local = LocalArgs {
        preset: args.preset.clone(),
        sections: None,
        miners_per_section: args.miners_per_section,
        config: None,
        model: args.model.clone(),
        data: args.data.clone(),
        text_column: args.text_column.clone(),
        dir: dir.to_path_buf(),
        listen: Some(listen),
        // The generated schedule counts optimizer steps (G samples each): `iota train`'s
        // `args.samples` steps.
        samples: Some(args.samples * split),
        keep_running: false,
        metrics_out: None,
        summary_out: None,
        seq_len: args.seq_len,
        batch_size: args.batch_size / split as usize,
        lr: args.lr,
        threads: args.threads,
        device: DeviceKind::Cpu,
        poll_ms: 500,
        merge_every: args.merge_every * split,
        samples_per_step: args.samples_per_step,
        // Counted like the schedule: samples, or synchronous steps (`iota train`'s steps).
        bottleneck_warmup: args.bottleneck_warmup * args.samples_per_schedule_step(),
        max_in_flight: args.max_in_flight as u64,
        eval_every: args.eval_interval() / args.merge_every,
        merge_op: args.merge_op,
        merge_wire: args.merge_wire,
        validators: 0,
        validator_wait_s: 0,
        seed: args.seed,
        muon: args.muon,
        #[cfg(feature = "adversary")]
        adversaries: Vec::new(),
        validation: None,
        placement_overrides: None,
        deadline_s: 20,
    };
    let mut config = generated_config(&local, dir, listen)?;
    apply_variant(args, &mut config)?;
    let config_path = dir.join("run.yaml");
    fs::write(&config_path, serde_norway::to_string(&config)?)
        .with_context(|| format!("writing {}", config_path.display()))?;
    let metrics = dir.join("metrics.jsonl");
    let summary_path = dir.join("summary.json");
    let log = dir.join("local.log");
    let exe = std::env::current_exe().context("locating the iota binary")?;
    eprintln!(
        "running iota local ({} samples, {} miners per section)...",
        args.samples, args.miners_per_section
    );
    let out = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone().context("duplicating the log file")?;
    let status = Command::new(exe)
        .arg("local")
        .arg("--config")
        .arg(&config_path)
        .args(["--samples", &(args.samples * split).to_string()])
        .args(["--miners-per-section", &args.miners_per_section.to_string()])
        .args(["--threads", &args.threads.max(1).to_string()])
        .args(["--listen", &listen.to_string()])
        .args(["--poll-ms", "500"])
        .args(["--validators", "0"])
        .arg("--dir")
        .arg(dir)
        .arg("--metrics-out")
        .arg(&metrics)
        .arg("--summary-out")
        .arg(&summary_path)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .status()
        .context("starting iota local")?;
    if !status.success() {
        let text = fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!("iota local failed ({status}):\n{}", tail.join("\n"));
    }
    let text =
        fs::read_to_string(&metrics).with_context(|| format!("reading {}", metrics.display()))?;
    let span = steady_state(&text).context("the network completed too few samples to measure")?;
    let summary: serde_json::Value = serde_json::from_slice(
        &fs::read(&summary_path).with_context(|| format!("reading {}", summary_path.display()))?,
    )?;
    let evals: Vec<EvalSummary> = serde_json::from_value(summary["evals"].clone())
        .context("reading the network's evaluations")?;
    Ok(RunResult {
        evals: evals
            .iter()
            .filter_map(|e| {
                Some(EvalPoint {
                    samples: e.trained_samples / split,
                    eval_loss: e.eval_loss?,
                })
            })
            .collect(),
        tokens_per_s: span.tokens_per_s(args.batch_size / split as usize * args.seq_len),
        completed: summary["completed"].as_u64().unwrap_or(0),
        dropped: summary["dropped"].as_u64().unwrap_or(0),
        ablation: network_ablation(args, dir)?,
    })
}

/// The ablation in the `iota train --summary-out` file at `path` (`None` where it has none:
/// a model of one section, a run from before it, or no such file).
fn train_ablation(path: &Path) -> anyhow::Result<Option<Ablation>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let summary: serde_json::Value =
        serde_json::from_slice(&text).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_value(summary["ablation"].clone())
        .with_context(|| format!("reading the ablation in {}", path.display()))
}

/// The network's final merged model ablated by `iota eval --ablation` on the held-out windows
/// the network evaluates, those `iota train` evaluates (`None` for a model of one section).
fn network_ablation(args: &BenchLearningArgs, dir: &Path) -> anyhow::Result<Option<Ablation>> {
    if args.model_config()?.n_sections() < 2 {
        return Ok(None);
    }
    let windows = RunConfig::load(&dir.join("run.yaml"))?.eval_samples.max(1);
    let exe = std::env::current_exe().context("locating the iota binary")?;
    let out = Command::new(exe)
        .arg("eval")
        .arg("--checkpoint")
        .arg(dir)
        .args(["--seq-len", &args.seq_len.to_string()])
        .args(["--batch-size", &args.batch_size.to_string()])
        .args(["--windows", &windows.to_string()])
        .args(["--ablation", "--json"])
        .stdin(Stdio::null())
        .output()
        .context("starting iota eval")?;
    if !out.status.success() {
        bail!(
            "iota eval --ablation of the network's model failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("reading iota eval's report")?;
    serde_json::from_value(report["ablation"].clone()).context("reading the network's ablation")
}

fn print_table(s: &LearningSummary) {
    let dp = |samples: u64| {
        s.data_parallel
            .as_ref()
            .and_then(|d| d.at(samples))
            .map_or_else(|| "-".to_string(), |l| format!("{l:.4}"))
    };
    println!("\n samples     tokens  iota train  network    gap %  data-parallel train");
    for p in &s.network.evals {
        let Some(train) = s.train.at(p.samples) else {
            continue;
        };
        println!(
            "{:>8}  {:>9}  {:>10.4}  {:>7.4}  {:>+7.2}  {:>19}",
            p.samples,
            p.samples * s.tokens_per_sample,
            train,
            p.eval_loss,
            f64::from(p.eval_loss - train) / f64::from(train) * 100.0,
            dp(p.samples)
        );
    }
    println!(
        "\nfinal (after {} samples): iota train {:.4}, network {:.4}: {:+.2}%",
        s.final_samples, s.final_train, s.final_network, s.gap_pct
    );
    if let Some(d) = s.data_parallel.as_ref().and_then(|d| d.at(s.final_samples)) {
        let ways = s.data_parallel_ways();
        println!(
            "perfect {ways}-way data parallelism (iota train, batch x{ways}, steps / {ways}): {d:.4}, \
             the network {:+.2}% from it",
            f64::from(s.final_network - d) / f64::from(d) * 100.0
        );
    }
    if let (Some(floor), Some(ratio)) = (s.entropy_floor, s.excess_ratio) {
        println!(
            "above the entropy floor {floor:.4}: iota train {:.4}, network {:.4} ({ratio:.2}x)",
            f64::from(s.final_train) - floor,
            f64::from(s.final_network) - floor
        );
    }
    println!(
        "tokens/s: iota train {:.0}, network {:.0} (steady state, merges included); network samples {} completed, {} dropped",
        s.train.tokens_per_s, s.network.tokens_per_s, s.network.completed, s.network.dropped
    );
    for (who, run) in [("iota train", &s.train), ("network", &s.network)] {
        let Some(a) = &run.ablation else {
            continue;
        };
        println!("ablation of {who}'s final model:");
        for line in a.lines() {
            println!("  {line}");
        }
        if let Some(rise) = a.weakest_rise().filter(|r| *r < 0.05 * a.baseline) {
            println!(
                "  a section can be removed for {:+.1}% of the loss here: a smoke test, not \
                 evidence of pipelined learning",
                100.0 * rise / a.baseline.max(1e-9)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_run_is_reused_only_for_its_seed() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: BenchLearningArgs,
        }
        let args = |extra: &[&str]| {
            let argv = ["bench"].iter().chain(extra).copied();
            <Cli as clap::Parser>::try_parse_from(argv).unwrap().args
        };
        let (zero, one) = (
            args(&[]).train_key(1).unwrap(),
            args(&["--seed", "1"]).train_key(1).unwrap(),
        );
        assert_ne!(zero, one);
        // Model fields are part of the key; a file that is not a mapping is refused by name.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.yaml");
        std::fs::write(&path, "d_b: 1\nreembed: true\n").unwrap();
        let file = path.to_str().unwrap();
        let with_model = args(&["--model", file]).train_key(1).unwrap();
        assert_eq!(with_model.model, Some(json!({"d_b": 1, "reembed": true})));
        assert_ne!(with_model, zero);
        assert!(args(&["--model", file]).model_config().unwrap().reembed);
        std::fs::write(&path, "- tiny\n").unwrap();
        let err = args(&["--model", file]).train_key(1).unwrap_err();
        assert!(format!("{err:#}").contains("m.yaml"), "{err:#}");
        // A key saved before `--seed` existed reads as seed 0.
        let mut saved = serde_json::to_value(&zero).unwrap();
        saved.as_object_mut().unwrap().remove("seed");
        let old: TrainKey = serde_json::from_value(saved).unwrap();
        assert_eq!((old == zero, old == one), (true, false));
    }

    #[test]
    fn variant_flags_reach_the_run_config() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: BenchLearningArgs,
        }
        let argv = [
            "bench",
            "--miner-warmup",
            "100",
            "--miner-lr-scale",
            "0.5",
            "--early-in-flight",
            "200",
            "--early-in-flight-cap",
            "2",
            "--nesterov",
            "false",
            "--momentum-decay",
            "1.0",
            "--muon",
        ];
        let args = <Cli as clap::Parser>::try_parse_from(argv).unwrap().args;
        let mut config = json!({"schedule": {"peak": 0.003, "warmup_steps": 20}});
        apply_variant(&args, &mut config).unwrap();
        assert_eq!(config["schedule"]["warmup_steps"], json!(100));
        assert_eq!(config["schedule"]["peak"], json!(0.0015));
        assert_eq!(config["early_in_flight_samples"], json!(200));
        assert_eq!(config["early_max_in_flight"], json!(2));
        assert_eq!(config["optimizer"]["nesterov"], json!(false));
        assert!(args.variant().contains("--nesterov false"));
        assert_eq!(config["optimizer"]["momentum_decay"], json!(1.0));
        assert!(args.variant().contains("--momentum-decay 1"));
        // Muon is for both runs: the network's config and `iota train`'s reference key.
        assert_eq!(config["optimizer"]["muon"], json!(true));
        assert!(args.variant().contains("--muon"));
        assert!(args.train_key(1).unwrap().muon);
        // Without the flags the generated schedule stays as it was.
        let args = <Cli as clap::Parser>::try_parse_from(["bench"])
            .unwrap()
            .args;
        let mut config = json!({"schedule": {"peak": 0.003, "warmup_steps": 20}});
        apply_variant(&args, &mut config).unwrap();
        assert_eq!(
            config["schedule"],
            json!({"peak": 0.003, "warmup_steps": 20})
        );
        assert_eq!(config["lanes"], json!(true));
        assert_eq!(config["early_in_flight_samples"], json!(0));
        assert!(config.get("optimizer").is_none());
        // Split samples keep the warm-up's and the early settings' tokens: G samples a step.
        let args = <Cli as clap::Parser>::try_parse_from([
            "bench",
            "--split-samples",
            "2",
            "--early-in-flight",
            "100",
        ])
        .unwrap()
        .args;
        let mut config = json!({"schedule": {"peak": 0.003, "warmup_steps": 20}});
        apply_variant(&args, &mut config).unwrap();
        assert_eq!(config["schedule"]["warmup_steps"], json!(40));
        assert_eq!(config["early_in_flight_samples"], json!(200));
        assert_eq!((args.split(), args.samples_per_schedule_step()), (2, 2));
        assert!(args.variant().contains("--split-samples 2"));
        // Synchronous steps count steps: the warm-up stays.
        let args = <Cli as clap::Parser>::try_parse_from(["bench", "--samples-per-step", "2"])
            .unwrap()
            .args;
        assert_eq!((args.split(), args.samples_per_schedule_step()), (2, 1));
        assert!(
            <Cli as clap::Parser>::try_parse_from([
                "bench",
                "--samples-per-step",
                "2",
                "--split-samples",
                "2"
            ])
            .is_err()
        );
    }

    #[test]
    fn outer_step_flag_parses() {
        let step = parse_outer("0.7,0.9").unwrap();
        assert_eq!((step.lr, step.momentum), (0.7, 0.9));
        assert!(parse_outer("0.7").is_err());
        assert!(parse_outer("x,0.9").is_err());
        assert!(parse_outer("0.7,1.0").is_err());
    }
}
