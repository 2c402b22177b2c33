//! `iota bench step`: the CPU (or GPU) cost of one training step of a preset, and where it
//! goes.
//!
//! How each number is taken:
//! - whole-graph step: forward + backward of the whole model in one autodiff graph
//!   ([`Pipeline::train_whole`]) and one AdamW step of every section, timed end to end; the
//!   median over `--steps` steps after one warm-up step. This is the step a PyTorch twin of
//!   the model takes (`benches/torch_twin.py`).
//! - chain step: what `iota train` does (sections chained through the wire codec, backward by
//!   recomputation, then the AdamW steps), timed the same way.
//! - per op: each kind of operation alone (forward + backward, median of `--op-reps`
//!   repetitions) at the shapes it has in the preset; "x per step" is how often it occurs in
//!   one step, and the share column is the op time x occurrences over the whole-graph step
//!   (computed, so the shares need not add up to 100%).
//! - `--torch SCRIPT`: runs the PyTorch twin as a child process between rounds of iota steps
//!   (interleaved, same machine, same threads), so the ratio is taken within one run even
//!   when the machine's load changes.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Int, Tensor};
use clap::Args;

use crate::data::{DataSpec, Dataset, Tokenizer};
use crate::model::attention::Attention;
use crate::model::backend::{BackendTask, DeviceKind, dispatch};
use crate::model::init::Init;
use crate::model::layers::{Linear, RmsNorm};
use crate::model::pipeline::Pipeline;
use crate::model::rope::Rope;
use crate::model::section_model::cross_entropy;
use crate::model::{ModelConfig, OptimizerConfig};
use crate::codec::WireDtype;

/// Arguments of `iota bench step`.
#[derive(Debug, Args)]
pub struct BenchStepArgs {
    /// Model preset.
    #[arg(long, value_name = "NAME", default_value = "small")]
    pub preset: String,
    /// Samples per batch.
    #[arg(long, value_name = "B", default_value_t = 8)]
    pub batch_size: usize,
    /// Tokens per sample.
    #[arg(long, value_name = "L", default_value_t = 128)]
    pub seq_len: usize,
    /// Timed steps per round (after one warm-up step).
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub steps: usize,
    /// Rounds; with `--torch`, the twin runs once between rounds.
    #[arg(long, value_name = "R", default_value_t = 2)]
    pub rounds: usize,
    /// Repetitions of each op in the per-op table (0: no table).
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub op_reps: usize,
    /// Compute threads (rayon pool; default: all cores).
    #[arg(long, value_name = "T")]
    pub threads: Option<usize>,
    /// Device.
    #[arg(long, value_name = "DEVICE", default_value = "cpu")]
    pub device: DeviceKind,
    /// Path of the PyTorch twin (`benches/torch_twin.py`) to run interleaved with iota's
    /// steps (needs `python3` with `torch`).
    #[arg(long, value_name = "SCRIPT")]
    pub torch: Option<String>,
}

/// Median of a list of durations (zero when empty).
pub fn median(mut xs: Vec<Duration>) -> Duration {
    if xs.is_empty() {
        return Duration::ZERO;
    }
    xs.sort();
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2
    }
}

/// One row of the per-op table.
struct OpTime {
    name: String,
    shape: String,
    per_step: usize,
    time: Duration,
}

/// Step times of one round.
#[derive(Default)]
struct Round {
    whole: Vec<Duration>,
    step: Vec<Duration>,
    chain: Vec<Duration>,
}

struct StepTask {
    cfg: ModelConfig,
    batch: usize,
    seq: usize,
    steps: usize,
    op_reps: usize,
    rounds: usize,
    torch: Option<String>,
    threads: usize,
}

struct Measured {
    whole: Duration,
    optimizer: Duration,
    chain: Duration,
    ops: Vec<OpTime>,
    torch: Vec<Duration>,
    torch_label: Option<String>,
}

impl BackendTask for StepTask {
    type Output = anyhow::Result<Measured>;

    fn run<B: AutodiffBackend>(self, device: B::Device) -> Self::Output {
        let data = Dataset::load(&DataSpec::default(), &Tokenizer::byte(), self.seq, 0)?;
        let mut whole = Pipeline::<B>::new(
            &self.cfg,
            0,
            OptimizerConfig::default(),
            WireDtype::default(),
            &device,
        )?;
        let mut chain = Pipeline::<B>::new(
            &self.cfg,
            0,
            OptimizerConfig::default(),
            WireDtype::default(),
            &device,
        )?;
        let mut next = 0u64;
        let mut batch = || {
            let windows: Vec<Vec<u32>> = (0..self.batch)
                .map(|i| data.train_sample(next + i as u64).to_vec())
                .collect();
            next += self.batch as u64;
            windows
        };
        let mut rounds = Vec::new();
        let mut torch = Vec::new();
        let mut torch_label = None;
        for round in 0..self.rounds.max(1) {
            let mut r = Round::default();
            for it in 0..=self.steps {
                let windows = batch();
                let refs: Vec<&[u32]> = windows.iter().map(|w| w.as_slice()).collect();
                let t0 = Instant::now();
                whole.train_whole(&refs)?;
                let t1 = Instant::now();
                whole.step(1e-3);
                let t2 = Instant::now();
                chain.train_batch(&refs)?;
                chain.step(1e-3);
                let t3 = Instant::now();
                if it > 0 {
                    r.whole.push(t2 - t0);
                    r.step.push(t2 - t1);
                    r.chain.push(t3 - t2);
                }
            }
            rounds.push(r);
            if let Some(script) = &self.torch {
                let (ms, label) = run_torch(script, &self)
                    .with_context(|| format!("running the PyTorch twin (round {round})"))?;
                torch.push(Duration::from_secs_f64(ms / 1e3));
                torch_label = Some(label);
            }
        }
        let pick = |f: fn(&Round) -> &Vec<Duration>| {
            median(rounds.iter().flat_map(|r| f(r).iter().copied()).collect())
        };
        let ops = if self.op_reps > 0 {
            op_times::<B>(&self.cfg, self.batch, self.seq, self.op_reps, &device)
        } else {
            Vec::new()
        };
        Ok(Measured {
            whole: pick(|r| &r.whole),
            optimizer: pick(|r| &r.step),
            chain: pick(|r| &r.chain),
            ops,
            torch,
            torch_label,
        })
    }
}

/// Runs the twin once; its median step in ms and its one-line description.
fn run_torch(script: &str, task: &StepTask) -> anyhow::Result<(f64, String)> {
    let out = Command::new("python3")
        .arg(script)
        .args(["--preset", &task.cfg.name])
        .args(["--batch-size", &task.batch.to_string()])
        .args(["--seq-len", &task.seq.to_string()])
        .args(["--steps", &task.steps.max(1).to_string()])
        .args(["--threads", &task.threads.to_string()])
        .arg("--json")
        .output()
        .context("starting python3")?;
    if !out.status.success() {
        bail!(
            "the twin failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or_default()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .context("the twin printed no JSON line")?;
    let v: serde_json::Value = serde_json::from_str(line).context("parsing the twin's JSON")?;
    let ms = v["median_step_ms"]
        .as_f64()
        .context("the twin's JSON lacks median_step_ms")?;
    let label = format!(
        "{} ({} threads)",
        v["framework"].as_str().unwrap_or("pytorch"),
        v["threads"]
    );
    Ok((ms, label))
}

/// Median time of `reps` runs of `f` (forward) plus the backward of the sum of its output.
fn time_op<B: AutodiffBackend, const D: usize>(
    reps: usize,
    f: impl Fn() -> Tensor<B, D>,
) -> Duration {
    // One untimed run warms allocations up.
    let _ = f().sum().backward();
    median(
        (0..reps)
            .map(|_| {
                let t = Instant::now();
                let _ = f().sum().backward();
                t.elapsed()
            })
            .collect(),
    )
}

/// Each kind of op of `cfg`'s blocks alone, forward + backward, at the preset's shapes.
fn op_times<B: AutodiffBackend>(
    cfg: &ModelConfig,
    b: usize,
    s: usize,
    reps: usize,
    device: &B::Device,
) -> Vec<OpTime> {
    let init = Init::new(0);
    let (d, ff, h, kv) = (cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.n_kv_heads);
    let hd = cfg.head_dim();
    let layers = cfg.n_layers;
    let rand3 = |w: usize| {
        Tensor::<B, 3>::random([b, s, w], Distribution::Normal(0.0, 1.0), device).require_grad()
    };
    let rand4 = |n: usize| {
        Tensor::<B, 4>::random([b, n, s, hd], Distribution::Normal(0.0, 1.0), device).require_grad()
    };
    let mut rows = Vec::new();
    let mut linear = |d_in: usize, d_out: usize, per_step: usize, what: &str| {
        let lin = Linear::<B>::new(&init, "w", d_in, d_out, 0.02, device);
        let x = rand3(d_in);
        rows.push(OpTime {
            name: format!("linear ({what})"),
            shape: format!("[{b},{s},{d_in}] x [{d_out},{d_in}]^T"),
            per_step,
            time: time_op(reps, || lin.forward(x.clone())),
        });
    };
    linear(d, d, 2 * layers, "q, o");
    linear(d, kv * hd, 2 * layers, "k, v");
    linear(d, ff, 2 * layers, "gate, up");
    linear(ff, d, layers, "down");
    linear(d, cfg.vocab_size, 1, "lm head");
    let attn = Attention::<B>::new(&init, "a", d, h, kv, 0.02, 0.02, device);
    let (q, k, v) = (rand4(h), rand4(kv), rand4(kv));
    rows.push(OpTime {
        name: "attention core (causal, GQA)".into(),
        shape: format!("q [{b},{h},{s},{hd}], kv [{b},{kv},{s},{hd}]"),
        per_step: layers,
        time: time_op(reps, || attn.core(q.clone(), k.clone(), v.clone())),
    });
    let rope = Rope::<B>::new(s, hd, cfg.rope_theta, device);
    rows.push(OpTime {
        name: "rope (q and k)".into(),
        shape: format!("[{b},{h}+{kv},{s},{hd}]"),
        per_step: layers,
        time: time_op(reps, || {
            Tensor::cat(vec![rope.apply(q.clone()), rope.apply(k.clone())], 1)
        }),
    });
    let norm = RmsNorm::<B>::new(d, cfg.norm_eps, device);
    let x = rand3(d);
    rows.push(OpTime {
        name: "rmsnorm".into(),
        shape: format!("[{b},{s},{d}]"),
        per_step: 2 * layers + 1,
        time: time_op(reps, || norm.forward(x.clone())),
    });
    let (g, u) = (rand3(ff), rand3(ff));
    rows.push(OpTime {
        name: "swiglu gate silu(g) * u".into(),
        shape: format!("[{b},{s},{ff}]"),
        per_step: layers,
        time: time_op(reps, || {
            burn::tensor::activation::silu(g.clone()) * u.clone()
        }),
    });
    let logits = rand3(cfg.vocab_size);
    let targets = Tensor::<B, 2, Int>::random(
        [b, s],
        Distribution::Uniform(0.0, cfg.vocab_size as f64),
        device,
    );
    rows.push(OpTime {
        name: "cross-entropy".into(),
        shape: format!("[{b},{s},{}]", cfg.vocab_size),
        per_step: 1,
        time: time_op(reps, || {
            cross_entropy(logits.clone(), targets.clone()).unsqueeze::<1>()
        }),
    });
    rows
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs `iota bench step`.
///
/// # Errors
/// Unknown preset, backend not compiled in, a failing twin, or a failure while running.
pub fn run(args: BenchStepArgs) -> anyhow::Result<()> {
    crate::cmd::mine::set_threads(args.threads)?;
    let mut cfg = ModelConfig::preset(&args.preset)?;
    cfg.max_seq_len = cfg.max_seq_len.max(args.seq_len);
    let threads = rayon::current_num_threads();
    println!(
        "iota bench step: preset {}, batch {} x {} tokens, {} rounds x {} timed steps, device {}, {} threads, matmul: {}",
        cfg.name,
        args.batch_size,
        args.seq_len,
        args.rounds.max(1),
        args.steps,
        args.device,
        threads,
        crate::model::backend::MATMUL
    );
    let task = StepTask {
        cfg: cfg.clone(),
        batch: args.batch_size,
        seq: args.seq_len,
        steps: args.steps.max(1),
        op_reps: args.op_reps,
        rounds: args.rounds,
        torch: args.torch.clone(),
        threads,
    };
    let m = dispatch(args.device, task)
        .map_err(anyhow::Error::msg)?
        .context("running the benchmark")?;
    let tokens = (args.batch_size * args.seq_len) as f64;
    let tps = |d: Duration| tokens / d.as_secs_f64().max(1e-9);
    println!("\nstep (median)                          ms/step   tokens/s");
    println!(
        "whole graph fwd+bwd + AdamW            {:>7.1}  {:>9.0}",
        ms(m.whole),
        tps(m.whole)
    );
    println!(
        "  of which AdamW (all sections)        {:>7.1}",
        ms(m.optimizer)
    );
    println!(
        "section chain (iota train) + AdamW     {:>7.1}  {:>9.0}",
        ms(m.chain),
        tps(m.chain)
    );
    if let Some(label) = &m.torch_label {
        let t = median(m.torch.clone());
        println!(
            "{:<38} {:>7.1}  {:>9.0}   (median of {} interleaved runs)",
            format!("PyTorch twin: {label}"),
            ms(t),
            tps(t),
            m.torch.len()
        );
        println!(
            "iota whole-graph step / PyTorch step   {:>7.2}",
            ms(m.whole) / ms(t).max(1e-9)
        );
        println!(
            "iota chain step / PyTorch step         {:>7.2}",
            ms(m.chain) / ms(t).max(1e-9)
        );
    }
    if !m.ops.is_empty() {
        println!(
            "\nop (forward + backward, alone)      shape                                  ms/op  x per step  share of whole step (computed)"
        );
        for op in &m.ops {
            println!(
                "{:<35} {:<38} {:>6.2}  {:>10}  {:>5.1}%",
                op.name,
                op.shape,
                ms(op.time),
                op.per_step,
                100.0 * ms(op.time) * op.per_step as f64 / ms(m.whole).max(1e-9)
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        let ms = |v: &[u64]| v.iter().map(|&x| Duration::from_millis(x)).collect();
        assert_eq!(median(ms(&[5, 1, 3])), Duration::from_millis(3));
        assert_eq!(median(ms(&[4, 1, 3, 2])), Duration::from_micros(2500));
        assert_eq!(median(Vec::new()), Duration::ZERO);
    }
}
