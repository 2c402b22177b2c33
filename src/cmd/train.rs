//! `iota train`: trains the whole model in one process by chaining its sections through the
//! same section API and wire codec that miners use. It is the newcomer's first run and the
//! single-process baseline the network is measured against.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use burn::tensor::backend::AutodiffBackend;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::cmd::stop_request::StopRequest;
use crate::codec::{MergeWire, WireDtype};
use crate::data::{DataSpec, Dataset, StreamSettings, Tokenizer};
use crate::merge::OuterStep;
use crate::mirror;
use crate::model::ablation::Ablation;
use crate::model::backend::{BackendTask, DeviceKind, dispatch};
use crate::model::checkpoint::{self, CheckpointMeta, SectionMeta};
use crate::model::pipeline::Pipeline;
use crate::model::replica_merge::{ReplicaMerge, average_boundaries};
use crate::model::section::OptimizerState;
use crate::model::{LrSchedule, ModelConfig, OptimizerConfig, StepOutcome};

/// Arguments of `iota train`.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// Model preset: tiny, small, 1b, 8b or 15b (default: small, or the config's).
    #[arg(long, value_name = "NAME", conflicts_with = "config")]
    pub preset: Option<String>,
    /// Run config (YAML) with `model`, `train` and `data` sections; see examples/train.yaml.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Training text: `synthetic` (built in, default), or a .txt, .jsonl, .jsonl.gz,
    /// .jsonl.zst or .parquet file, or a directory of them, or one `iota data prepare` wrote.
    #[arg(long, value_name = "PATH")]
    pub data: Option<String>,
    /// The .jsonl field / .parquet column holding the text (default: `text`, or the config's
    /// `data.text_column`).
    #[arg(long, value_name = "NAME")]
    pub text_column: Option<String>,
    /// HF tokenizer.json (default: the built-in byte-level tokenizer).
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Train until this many steps (batches) have been done in total.
    #[arg(long, value_name = "N")]
    pub steps: Option<u64>,
    /// Samples per step.
    #[arg(long, value_name = "B")]
    pub batch_size: Option<usize>,
    /// Tokens per sample.
    #[arg(long, value_name = "L")]
    pub seq_len: Option<usize>,
    /// Peak learning rate.
    #[arg(long, value_name = "LR")]
    pub lr: Option<f64>,
    /// Step at which the cosine decay reaches its floor (default: --steps).
    #[arg(long, value_name = "N")]
    pub lr_decay_steps: Option<u64>,
    /// Evaluate on held-out windows every N steps (and at the end); 0 = only at the end.
    #[arg(long, value_name = "N")]
    pub eval_every: Option<u64>,
    /// Seed of the initial weights and of the data order.
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Encoding of tensors crossing section boundaries: f32, bf16 or int8.
    #[arg(long, value_name = "DTYPE")]
    pub wire: Option<WireDtype>,
    /// Simulate R data-parallel miners per section in this process: each step, each replica
    /// trains on 1/R of the batch and steps alone; every --average-every steps their weights and
    /// moments are averaged (the network's `mean` merge). 1: ordinary training.
    #[arg(long, value_name = "R")]
    pub replicas: Option<usize>,
    /// With --replicas: average the replicas every N steps (and at the end).
    #[arg(long, value_name = "N")]
    pub average_every: Option<u64>,
    /// With --replicas: also average the boundary's encoder and decoder (and their moments),
    /// and nothing else, every N steps between the full averagings.
    #[arg(long, value_name = "N")]
    pub average_boundary_every: Option<u64>,
    /// With --replicas: merge them through this merge format (the run config's `merge.wire`:
    /// f32, bf16, int8, dct, sign, sign2, q4, q4v2, q4v2m4, q4v2m2, or
    /// NAME:CHUNK[:KEEP[:MERGED_KEEP]]), with error feedback for the compressed changes, as the
    /// network does; measures a format's learning cost without the network's timing noise.
    #[arg(long, value_name = "FORMAT")]
    pub merge_wire: Option<MergeWire>,
    /// With --replicas: take a Nesterov outer step `LR,MOMENTUM` on each averaging's move
    /// instead of adopting the mean (the network's `merge.outer`; 1,0 adopts the mean). Its
    /// momentum starts at zero, also on --resume.
    #[arg(long, value_name = "LR,MOMENTUM")]
    pub outer: Option<OuterStep>,
    /// Warm up without the bottleneck for N steps: the whole residual stream also crosses
    /// each boundary, its weight falling from 1 to 0 over those steps (`train.bottleneck_warmup`).
    #[arg(long, value_name = "N")]
    pub bottleneck_warmup: Option<u64>,
    /// Directory for the checkpoint.
    #[arg(long, value_name = "DIR", default_value = "runs/train")]
    pub out: PathBuf,
    /// Continue from the checkpoint in --out.
    #[arg(long)]
    pub resume: bool,
    /// Write one JSON object per step to this file, as each step ends.
    #[arg(long, value_name = "FILE.jsonl")]
    pub metrics_out: Option<PathBuf>,
    /// Device: cpu, cuda, wgpu (GPU backends need the matching cargo feature).
    #[arg(long, value_name = "DEVICE", default_value = "cpu")]
    pub device: DeviceKind,
    /// Also write the final summary as JSON to this file.
    #[arg(long, value_name = "FILE.json")]
    pub summary_out: Option<PathBuf>,
    /// Recompute each section's forward in its backward instead of keeping every section's
    /// activations until the backward (one section's activations at a time; about a sixth
    /// more compute per step).
    #[arg(long)]
    pub recompute_backward: bool,
    /// Step every section with NAdam (the miners' optimizer for stale gradients, run config
    /// `optimizer.nesterov`) instead of AdamW: the yardstick's variant, to tell how much of a
    /// network's gain is the optimizer itself.
    #[arg(long)]
    pub nesterov: bool,
    /// Step the hidden matrices with Muon (run config `optimizer.muon`; the embeddings, the
    /// output head and every vector keep AdamW). Also on a resumed run.
    #[arg(long)]
    pub muon: bool,
    /// Hide the progress bar (log lines only).
    #[arg(long)]
    pub quiet: bool,
}

/// The `train` section of a run config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSettings {
    /// Total steps.
    pub steps: u64,
    /// Samples per step.
    pub batch_size: usize,
    /// Tokens per sample (`null`: the model's `max_seq_len`).
    pub seq_len: Option<usize>,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warmup steps.
    pub warmup_steps: u64,
    /// Step where the cosine reaches its floor (default: `steps`).
    pub lr_decay_steps: Option<u64>,
    /// Floor of the schedule as a fraction of `lr`.
    pub min_lr_ratio: f64,
    /// Inner optimizer.
    pub optimizer: OptimizerConfig,
    /// Evaluate every N steps (0: only at the end).
    pub eval_every: u64,
    /// Held-out windows per evaluation.
    pub eval_samples: usize,
    /// Seed of weights and data order.
    pub seed: u64,
    /// Boundary tensor encoding.
    pub wire: WireDtype,
    /// Data-parallel replicas simulated in this process (1: none); each trains on
    /// `batch_size / replicas` windows per step.
    pub replicas: usize,
    /// Steps between two averagings of the replicas (the last step always averages).
    pub average_every: u64,
    /// Steps between two averagings of the boundary's halves alone (0: none).
    pub average_boundary_every: u64,
    /// The merge format the replicas are averaged through.
    pub merge_wire: MergeWire,
    /// An outer step on each averaging of the replicas (none: they adopt the mean).
    pub outer: Option<OuterStep>,
    /// Steps of a warm-up without the bottleneck (0: none): the whole residual stream also
    /// crosses each boundary, weighted from 1 at the first step down to 0 at this one, so the
    /// sections first train as one wide model and hand over to the bottleneck gradually (see
    /// `SectionModel::bridge`). The boundary is `d_model` channels wider while it lasts.
    pub bottleneck_warmup: u64,
}

impl TrainSettings {
    /// Whether the periodic evaluation (`eval_every`) falls after `step`; the last step is
    /// always evaluated besides.
    fn evaluates_after(&self, step: u64) -> bool {
        self.eval_every > 0 && step.is_multiple_of(self.eval_every)
    }

    /// The bridge's weight for the step after `step` steps: a linear ramp from 1 to 0 over
    /// `bottleneck_warmup` steps, then 0.
    fn bridge_at(&self, step: u64) -> f64 {
        crate::model::bridge_weight(step, self.bottleneck_warmup)
    }
}

impl Default for TrainSettings {
    fn default() -> Self {
        Self {
            steps: 200,
            batch_size: 8,
            seq_len: Some(128),
            lr: 3e-3,
            warmup_steps: 20,
            lr_decay_steps: None,
            min_lr_ratio: 0.1,
            optimizer: OptimizerConfig::default(),
            eval_every: 50,
            eval_samples: 32,
            seed: 0,
            wire: WireDtype::Bf16,
            replicas: 1,
            average_every: 0,
            average_boundary_every: 0,
            merge_wire: MergeWire::F32,
            outer: None,
            bottleneck_warmup: 0,
        }
    }
}

/// The `data` section of a run config.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataSettings {
    /// `synthetic` or a path.
    pub source: Option<String>,
    /// The `.jsonl` field / `.parquet` column holding the text (`null`: `text`).
    pub text_column: Option<String>,
    /// HF tokenizer.json.
    pub tokenizer: Option<PathBuf>,
    /// Raw shards tokenized a block at a time in a bounded background pool (the run
    /// config's `data.stream`; see [`StreamSettings`]).
    pub stream: Option<StreamSettings>,
}

/// A training run config file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainFile {
    /// Preset name plus overrides of any model field.
    pub model: Option<serde_json::Value>,
    /// Training settings.
    pub train: TrainSettings,
    /// Data settings.
    pub data: DataSettings,
}

impl TrainFile {
    /// Reads and checks a run config.
    ///
    /// # Errors
    /// Unreadable file, YAML errors and unknown keys (naming the key).
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        serde_norway::from_str(&text).with_context(|| format!("config {}", path.display()))
    }
}

/// Everything a run needs, resolved from flags, config file and checkpoint.
struct Plan {
    model: ModelConfig,
    settings: TrainSettings,
    schedule: LrSchedule,
    data: DataSpec,
    stream: Option<StreamSettings>,
    tokenizer: Tokenizer,
    resume_from: Option<checkpoint::Checkpoint>,
    out: PathBuf,
    metrics_out: Option<PathBuf>,
    summary_out: Option<PathBuf>,
    recompute_backward: bool,
    nesterov: bool,
    quiet: bool,
}

/// What a finished run reports.
#[derive(Debug, Clone, Serialize)]
pub struct TrainSummary {
    /// Steps done in this invocation.
    pub steps_run: u64,
    /// Final step count.
    pub step: u64,
    /// The run stopped before `--steps` on a Ctrl-C or SIGTERM (evaluated, saved and ablated
    /// at the step it reached; `--resume` continues it).
    pub stopped_early: bool,
    /// Loss of the first step of this invocation.
    pub first_loss: Option<f32>,
    /// Loss of the last step.
    pub last_loss: Option<f32>,
    /// Held-out loss before the first step of this invocation.
    pub initial_eval_loss: Option<f32>,
    /// Last held-out loss.
    pub eval_loss: Option<f32>,
    /// Entropy floor of the data, when known (nats/token).
    pub entropy_floor: Option<f64>,
    /// Training throughput.
    pub tokens_per_s: f64,
    /// Optimizer steps skipped (non-finite values), over all sections.
    pub skipped_steps: u64,
    /// Where the checkpoint went.
    pub checkpoint: PathBuf,
    /// The held-out loss with each boundary's output replaced by zeros and by its channel
    /// means, at the end (none for a model of one section).
    pub ablation: Option<Ablation>,
}

/// Runs `iota train`.
///
/// # Errors
/// Bad flags or config, unreadable data, a tokenizer that does not fit the checkpoint, a
/// corrupt checkpoint, or a failure while training.
pub fn run(args: TrainArgs) -> anyhow::Result<()> {
    let device = args.device;
    let plan = resolve(args)?;
    let summary_out = plan.summary_out.clone();
    let stop = StopRequest::on_signals("training")?;
    let summary = dispatch(device, TrainTask { plan, stop }).map_err(anyhow::Error::msg)??;
    print_summary(&summary);
    if let Some(path) = summary_out {
        let json = serde_json::to_vec_pretty(&summary)?;
        std::fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Replicas must split the batch evenly, average at some interval, and be evaluated only
/// right after averaging (the evaluated model is then their common one).
fn check_replicas(s: &TrainSettings) -> anyhow::Result<()> {
    let r = s.replicas;
    if r == 0 {
        bail!("--replicas must be at least 1");
    }
    if r == 1 {
        if s.average_boundary_every > 0 {
            bail!("--average-boundary-every needs --replicas R (R > 1)");
        }
        if s.merge_wire != MergeWire::F32 {
            bail!(
                "--merge-wire {} needs --replicas R (R > 1): one process has nothing to merge",
                s.merge_wire
            );
        }
        if s.outer.is_some() {
            bail!("--outer needs --replicas R (R > 1): one process has nothing to merge");
        }
        return Ok(());
    }
    if !s.batch_size.is_multiple_of(r) {
        bail!(
            "--batch-size {} does not split evenly over --replicas {r}",
            s.batch_size
        );
    }
    if s.average_every == 0 {
        bail!("--replicas {r} needs --average-every N (steps between averagings)");
    }
    if !s.eval_every.is_multiple_of(s.average_every) {
        bail!(
            "--eval-every {} must be a multiple of --average-every {} (replicas are evaluated \
             right after they are averaged)",
            s.eval_every,
            s.average_every
        );
    }
    Ok(())
}

fn resolve(args: TrainArgs) -> anyhow::Result<Plan> {
    let file = match &args.config {
        Some(path) => TrainFile::load(path)?,
        None => TrainFile::default(),
    };
    let mut settings = file.train.clone();
    if let Some(v) = args.steps {
        settings.steps = v;
    }
    if let Some(v) = args.batch_size {
        settings.batch_size = v;
    }
    if let Some(v) = args.seq_len {
        settings.seq_len = Some(v);
    }
    if let Some(v) = args.lr {
        settings.lr = v;
    }
    if let Some(v) = args.lr_decay_steps {
        settings.lr_decay_steps = Some(v);
    }
    if let Some(v) = args.eval_every {
        settings.eval_every = v;
    }
    if let Some(v) = args.seed {
        settings.seed = v;
    }
    if let Some(v) = args.wire {
        settings.wire = v;
    }
    if let Some(v) = args.replicas {
        settings.replicas = v;
    }
    if let Some(v) = args.average_every {
        settings.average_every = v;
    }
    if let Some(v) = args.average_boundary_every {
        settings.average_boundary_every = v;
    }
    if let Some(v) = args.merge_wire {
        settings.merge_wire = v;
    }
    if let Some(v) = args.outer {
        settings.outer = Some(v);
    }
    if let Some(v) = args.bottleneck_warmup {
        settings.bottleneck_warmup = v;
    }
    if settings.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    check_replicas(&settings)?;
    let tokenizer_path = args.tokenizer.clone().or(file.data.tokenizer.clone());
    let tokenizer = Tokenizer::load(tokenizer_path.as_deref())
        .with_context(|| "loading the tokenizer".to_string())?;
    let data_text = args
        .data
        .clone()
        .or(file.data.source.clone())
        .unwrap_or_else(|| "synthetic".to_string());
    let data: DataSpec = data_text
        .parse()
        .with_context(|| format!("--data {data_text}"))?;
    let text_column = args.text_column.as_deref();
    let data = data
        .with_text_column(text_column.or(file.data.text_column.as_deref()))
        .with_context(|| format!("--data {data_text}"))?;

    let resume_from = if args.resume && checkpoint::exists(&args.out) {
        Some(
            checkpoint::load(&args.out)
                .with_context(|| format!("loading checkpoint from {}", args.out.display()))?,
        )
    } else if args.resume {
        bail!(
            "--resume: no checkpoint in {} (expected {})",
            args.out.display(),
            checkpoint::META_FILE
        );
    } else {
        None
    };

    let (model, schedule) = match &resume_from {
        Some(ckpt) => {
            let meta = &ckpt.meta;
            if meta.tokenizer != tokenizer.fingerprint() {
                bail!(
                    "the tokenizer ({}, vocab {}) does not match the checkpoint's ({}); pass the tokenizer the checkpoint was trained with",
                    tokenizer.fingerprint(),
                    tokenizer.vocab_size(),
                    meta.tokenizer
                );
            }
            settings.seed = meta.seed;
            settings.optimizer = meta.optimizer;
            settings.seq_len = Some(args.seq_len.unwrap_or(meta.seq_len));
            settings.batch_size = args.batch_size.unwrap_or(meta.batch_size);
            let mut schedule = meta.schedule;
            if let Some(v) = args.lr_decay_steps {
                schedule.total_steps = v;
            }
            (meta.model.clone(), schedule)
        }
        None => {
            let model_value = match (&args.preset, &file.model) {
                (Some(p), _) => serde_json::json!({ "preset": p }),
                (None, Some(v)) => v.clone(),
                (None, None) => serde_json::json!({ "preset": "small" }),
            };
            let explicit_vocab = model_value.get("vocab_size").is_some();
            let mut model = ModelConfig::from_value(&model_value, "small")?;
            if !explicit_vocab {
                model.vocab_size = tokenizer.vocab_size();
            }
            if tokenizer.vocab_size() > model.vocab_size {
                bail!(
                    "the tokenizer has {} tokens but the model's vocabulary holds {}",
                    tokenizer.vocab_size(),
                    model.vocab_size
                );
            }
            if let Some(seq) = settings.seq_len {
                model.max_seq_len = model.max_seq_len.max(seq);
            }
            let schedule = LrSchedule {
                peak: settings.lr,
                warmup_steps: settings.warmup_steps,
                total_steps: settings.lr_decay_steps.unwrap_or(settings.steps),
                min_ratio: settings.min_lr_ratio,
            };
            schedule.validate().map_err(anyhow::Error::msg)?;
            (model, schedule)
        }
    };
    if settings.bottleneck_warmup > 0 && !model.bottleneck {
        bail!(
            "--bottleneck-warmup {} needs a model with a bottleneck (this one sends the whole \
             residual stream already)",
            settings.bottleneck_warmup
        );
    }
    let seq_len = settings.seq_len.unwrap_or(model.max_seq_len);
    if seq_len > model.max_seq_len {
        bail!(
            "--seq-len {seq_len} exceeds the checkpoint's max_seq_len {}",
            model.max_seq_len
        );
    }
    settings.seq_len = Some(seq_len);
    if args.muon {
        settings.optimizer.muon = true;
    }
    Ok(Plan {
        model,
        settings,
        schedule,
        data,
        stream: file.data.stream,
        tokenizer,
        resume_from,
        out: args.out,
        metrics_out: args.metrics_out,
        summary_out: args.summary_out,
        recompute_backward: args.recompute_backward,
        nesterov: args.nesterov,
        quiet: args.quiet,
    })
}

struct TrainTask {
    plan: Plan,
    stop: StopRequest,
}

impl BackendTask for TrainTask {
    type Output = anyhow::Result<TrainSummary>;

    fn run<B: AutodiffBackend>(self, device: B::Device) -> Self::Output {
        train::<B>(self.plan, &self.stop, &device)
    }
}

#[derive(Serialize)]
struct MetricsLine {
    step: u64,
    loss: f32,
    lr: f64,
    tokens: u64,
    tokens_per_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    eval_loss: Option<f32>,
}

fn train<B: AutodiffBackend>(
    plan: Plan,
    stop: &StopRequest,
    device: &B::Device,
) -> anyhow::Result<TrainSummary> {
    let s = &plan.settings;
    let seq_len = s.seq_len.unwrap_or(plan.model.max_seq_len);
    let data = mirror::fetch_to_cache(&plan.data)
        .with_context(|| format!("copying data `{}`", plan.data))?;
    let dataset = Dataset::load_with(&data, &plan.tokenizer, seq_len, s.seed, plan.stream)
        .with_context(|| format!("loading data `{}`", plan.data))?;
    for t in dataset.train_sample(0).iter() {
        if *t as usize >= plan.model.vocab_size {
            bail!(
                "token id {t} is outside the model's vocabulary of {}",
                plan.model.vocab_size
            );
        }
    }
    let mut pipeline = Pipeline::<B>::new(&plan.model, s.seed, s.optimizer, s.wire, device)?;
    set_nesterov(&mut pipeline, plan.nesterov);
    let (mut step, mut next_sample) = (0u64, 0u64);
    if let Some(ckpt) = &plan.resume_from {
        restore(&mut pipeline, ckpt)?;
        step = ckpt.meta.step;
        next_sample = ckpt.meta.next_sample;
    }
    let start_step = step;
    // Data-parallel replicas (all from the same seed), when simulated.
    pipeline.set_retain_graphs(!plan.recompute_backward);
    let mut replicas = vec![pipeline];
    for _ in 1..s.replicas.max(1) {
        let mut replica = Pipeline::<B>::new(&plan.model, s.seed, s.optimizer, s.wire, device)?;
        set_nesterov(&mut replica, plan.nesterov);
        replica.set_retain_graphs(!plan.recompute_backward);
        if let Some(ckpt) = &plan.resume_from {
            // Every replica continues from the checkpoint (one model, split from here on).
            restore(&mut replica, ckpt)?;
        }
        replicas.push(replica);
    }
    let mut merging = ReplicaMerge::new(s.merge_wire, &replicas)?;
    // The outer step's momentum per section, as the network keeps it beside each checkpoint.
    let mut outer_momentum: Vec<Vec<f32>> = vec![Vec::new(); replicas[0].sections().len()];
    let mut outer = |section: usize, previous: &[f32], merged: &mut [f32]| {
        let Some(step) = s.outer else {
            return Ok(());
        };
        let momentum = &mut outer_momentum[section];
        momentum.resize(previous.len(), 0.0);
        step.apply(previous, merged, momentum)
            .map_err(|e| e.to_string())
    };
    let mut metrics = match &plan.metrics_out {
        Some(path) => Some(BufWriter::new(
            File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => None,
    };
    let bar = progress_bar(s.steps.saturating_sub(start_step), plan.quiet);
    say(
        &bar,
        format!(
            "iota train: {} ({:.2}M params, {} sections, boundary width {}), {}",
            plan.model.name,
            plan.model.total_params() as f64 / 1e6,
            plan.model.n_sections(),
            plan.model.boundary_width(),
            dataset.describe()
        ),
    );
    let eval_owned: Vec<_> = (0..dataset.num_eval_windows().min(s.eval_samples.max(1)))
        .map(|i| dataset.eval_sample(i))
        .collect();
    let eval_windows: Vec<&[u32]> = eval_owned.iter().map(AsRef::as_ref).collect();
    let (mut first_loss, mut last_loss, mut eval_loss) = (None, None, None);
    for r in &mut replicas {
        r.set_bridge(s.bridge_at(step));
    }
    let initial_eval_loss = if step < s.steps {
        Some(replicas[0].eval_mean_plain(&eval_windows, s.batch_size)?)
    } else {
        None
    };
    let started = Instant::now();
    let mut tokens_done = 0u64;
    while step < s.steps && !stop.requested() {
        let owned: Vec<_> = (0..s.batch_size as u64)
            .map(|i| dataset.train_sample(next_sample + i))
            .collect();
        let windows: Vec<&[u32]> = owned.iter().map(AsRef::as_ref).collect();
        let lr = plan.schedule.at(step);
        // Each replica trains on its share of the batch and steps alone.
        let share = s.batch_size / replicas.len();
        let mut losses = Vec::with_capacity(replicas.len());
        for (r, pipeline) in replicas.iter_mut().enumerate() {
            match pipeline.train_batch(&windows[r * share..(r + 1) * share]) {
                Ok(report) => losses.push(report.loss),
                Err(crate::model::ModelError::NonFiniteLoss(v)) => {
                    say(
                        &bar,
                        format!("step {step}: non-finite loss {v}; step skipped"),
                    );
                }
                Err(e) => return Err(e.into()),
            }
            for outcome in pipeline.step(lr) {
                if let StepOutcome::Skipped { reason } = outcome {
                    say(&bar, format!("step {step}: update skipped ({reason})"));
                }
            }
        }
        let report = (losses.len() == replicas.len())
            .then(|| losses.iter().sum::<f32>() / losses.len() as f32);
        next_sample += s.batch_size as u64;
        step += 1;
        for r in &mut replicas {
            r.set_bridge(s.bridge_at(step));
        }
        if replicas.len() > 1 && (step.is_multiple_of(s.average_every) || step == s.steps) {
            merging
                .merge_then(&mut replicas, &mut outer)
                .with_context(|| format!("merging the replicas through {}", s.merge_wire))?;
        } else if replicas.len() > 1
            && s.average_boundary_every > 0
            && step.is_multiple_of(s.average_boundary_every)
        {
            average_boundaries(&mut replicas).context("averaging the replicas' boundaries")?;
        }
        let pipeline = &mut replicas[0];
        tokens_done += (s.batch_size * seq_len) as u64;
        let tokens_per_s = tokens_done as f64 / started.elapsed().as_secs_f64().max(1e-9);
        let evaluate = step == s.steps || s.evaluates_after(step);
        let this_eval = if evaluate {
            let e = pipeline.eval_mean_plain(&eval_windows, s.batch_size)?;
            eval_loss = Some(e);
            Some(e)
        } else {
            None
        };
        if let Some(loss) = report {
            first_loss.get_or_insert(loss);
            last_loss = Some(loss);
        }
        if let Some(w) = metrics.as_mut() {
            let line = MetricsLine {
                step,
                loss: report.unwrap_or(f32::NAN),
                lr,
                tokens: step * (s.batch_size * seq_len) as u64,
                tokens_per_s,
                eval_loss: this_eval,
            };
            serde_json::to_writer(&mut *w, &line)?;
            w.write_all(b"\n")?;
            // Flushed per step so that a long run can be followed (`tail -f`) and a run that
            // stops early keeps every step it finished.
            w.flush()?;
        }
        bar.set_message(format!(
            "loss {:.4}  eval {}  lr {lr:.2e}  {tokens_per_s:.0} tok/s",
            last_loss.unwrap_or(f32::NAN),
            eval_loss.map_or("-".to_string(), |e| format!("{e:.4}")),
        ));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let stopped_early = step < s.steps;
    if stopped_early {
        // Stopped after steps since the last averaging or evaluation: average the replicas,
        // then evaluate the model that is saved, so that the summary describes the checkpoint.
        let stepped = step > start_step;
        if stepped && replicas.len() > 1 && !step.is_multiple_of(s.average_every) {
            merging
                .merge_then(&mut replicas, &mut outer)
                .with_context(|| format!("merging the replicas through {}", s.merge_wire))?;
        }
        if stepped && !s.evaluates_after(step) {
            eval_loss = Some(replicas[0].eval_mean_plain(&eval_windows, s.batch_size)?);
        }
        println!(
            "stopped early at step {step} of {} (--resume continues)",
            s.steps
        );
    }
    // Replicas hold the same (averaged) model at the end.
    save(&replicas[0], &plan, step, next_sample, &dataset)?;
    let ablation = if plan.model.n_sections() > 1 {
        Some(
            replicas[0]
                .ablation(&eval_windows, s.batch_size)
                .context("ablating the boundaries")?,
        )
    } else {
        None
    };
    let skipped_steps = replicas
        .iter()
        .flat_map(|p| p.sections())
        .map(|s| s.stats().skipped_steps)
        .sum();
    Ok(TrainSummary {
        steps_run: step - start_step,
        step,
        stopped_early,
        first_loss,
        last_loss,
        initial_eval_loss,
        eval_loss,
        entropy_floor: dataset.entropy_floor(),
        tokens_per_s: tokens_done as f64 / started.elapsed().as_secs_f64().max(1e-9),
        skipped_steps,
        checkpoint: plan.out.clone(),
        ablation,
    })
}

fn restore<B: AutodiffBackend>(
    pipeline: &mut Pipeline<B>,
    ckpt: &checkpoint::Checkpoint,
) -> anyhow::Result<()> {
    for section in pipeline.sections_mut() {
        let index = section.spec().index;
        let names: std::collections::HashSet<String> =
            section.param_shapes().into_iter().map(|(n, _)| n).collect();
        let params: Vec<_> = ckpt
            .params
            .iter()
            .filter(|t| names.contains(&t.name))
            .cloned()
            .collect();
        section
            .import_params(&params)
            .with_context(|| format!("checkpoint weights of section {index}"))?;
        let moments: Vec<_> = ckpt
            .optimizer
            .iter()
            .filter(|t| {
                let base = t
                    .name
                    .trim_end_matches(".exp_avg_sq")
                    .trim_end_matches(".exp_avg");
                names.contains(base)
            })
            .cloned()
            .collect();
        let step = ckpt
            .meta
            .sections
            .iter()
            .find(|m| m.index == index)
            .map(|m| m.optimizer_step)
            .unwrap_or(0);
        section
            .import_optimizer(&OptimizerState {
                step,
                tensors: moments,
            })
            .with_context(|| format!("checkpoint optimizer state of section {index}"))?;
    }
    Ok(())
}

fn save<B: AutodiffBackend>(
    pipeline: &Pipeline<B>,
    plan: &Plan,
    step: u64,
    next_sample: u64,
    dataset: &Dataset,
) -> anyhow::Result<()> {
    let mut params = Vec::new();
    let mut moments = Vec::new();
    let mut sections = Vec::new();
    for section in pipeline.sections() {
        params.extend(section.export_params());
        let opt = section.export_optimizer();
        moments.extend(opt.tensors);
        sections.push(SectionMeta {
            index: section.spec().index,
            optimizer_step: opt.step,
            stats: section.stats().clone(),
        });
    }
    let meta = CheckpointMeta {
        format: checkpoint::FORMAT_VERSION,
        model: plan.model.clone(),
        step,
        next_sample,
        seq_len: dataset.seq_len(),
        batch_size: plan.settings.batch_size,
        seed: plan.settings.seed,
        tokenizer: plan.tokenizer.fingerprint(),
        optimizer: plan.settings.optimizer,
        schedule: plan.schedule,
        sections,
        data: dataset.describe(),
    };
    checkpoint::save(&plan.out, &meta, &params, &moments)
        .with_context(|| format!("saving checkpoint to {}", plan.out.display()))
}

/// Steps every section of `pipeline` with NAdam when `on` (`--nesterov`); `Pipeline::new` gives
/// AdamW, as for steps whose gradients are never stale.
fn set_nesterov<B: AutodiffBackend>(pipeline: &mut Pipeline<B>, on: bool) {
    for section in pipeline.sections_mut() {
        section.set_nesterov(on);
    }
}

/// Prints a line above the progress bar, or plainly where the bar is hidden (`--quiet`, or
/// output that is not a terminal), where `ProgressBar::println` would drop it.
fn say(bar: &ProgressBar, line: String) {
    bar.suspend(|| println!("{line}"));
}

fn progress_bar(steps: u64, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(steps);
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} step {pos}/{len} [{elapsed_precise}<{eta_precise}] {wide_bar} {msg}",
    ) {
        bar.set_style(style);
    }
    bar
}

fn print_summary(s: &TrainSummary) {
    let fmt = |v: Option<f32>| v.map_or("-".to_string(), |v| format!("{v:.4}"));
    println!("steps        {} (now at step {})", s.steps_run, s.step);
    println!("loss         {} -> {}", fmt(s.first_loss), fmt(s.last_loss));
    println!(
        "eval loss    {} -> {}",
        fmt(s.initial_eval_loss),
        fmt(s.eval_loss)
    );
    if let Some(floor) = s.entropy_floor {
        let gap = s.eval_loss.map_or(String::new(), |e| {
            format!(" (eval is {:.4} above it)", f64::from(e) - floor)
        });
        println!("entropy floor {floor:.4} nats/token{gap}");
    }
    println!("throughput   {:.0} tokens/s", s.tokens_per_s);
    if s.skipped_steps > 0 {
        println!(
            "skipped      {} optimizer steps (non-finite values)",
            s.skipped_steps
        );
    }
    println!("checkpoint   {}", s.checkpoint.display());
    if let Some(a) = &s.ablation {
        for (i, line) in a.lines().iter().enumerate() {
            println!("{}{line}", if i == 0 { "ablation     " } else { "" });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TrainSettings;

    #[test]
    fn the_bridge_ramps_from_one_to_zero_over_the_warmup() {
        let s = TrainSettings {
            bottleneck_warmup: 4,
            ..TrainSettings::default()
        };
        let weights: Vec<f64> = (0..6).map(|step| s.bridge_at(step)).collect();
        assert_eq!(weights, [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]);
        let off = TrainSettings::default();
        assert!((0..3).all(|step| off.bridge_at(step) == 0.0));
    }
}
