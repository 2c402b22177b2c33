//! `iota bench step`: the CPU (or GPU) cost of one training step of a preset, and where it
//! goes.
//!
//! How each number is taken:
//! - whole-graph step: forward + backward of the whole model in one autodiff graph
//!   ([`Pipeline::train_whole`]) and one AdamW step of every section, timed end to end; the
//!   median over `--steps` steps after one warm-up step. This is the step a PyTorch twin of
//!   the model takes (`benches/torch_twin.py`).
//! - chain step: what `iota train` and the miners do (sections chained through the wire codec,
//!   each section's backward from the graph its forward kept, then the AdamW steps), timed
//!   the same way; and the chain recomputing each section's forward in its backward instead
//!   (a miner's `--recompute-backward`, which holds one section's activations at a time).
//! - per op: each kind of operation alone (forward + backward, median of `--op-reps`
//!   repetitions) at the shapes it has in the preset; "x per step" is how often it occurs in
//!   one step, and the share column is the op time x occurrences over the whole-graph step
//!   (computed, so the shares need not add up to 100%).
//! - every time is taken twice: wall clock, and CPU time of the whole process (the sum over
//!   its threads of `/proc/self/task/*/schedstat`), which a busy machine hardly changes.
//!   With one compute thread (`--threads 1`, the twin's `--threads 1`) the CPU-time ratio is
//!   the cost ratio of the two implementations.
//! - `--torch SCRIPT`: runs the PyTorch twin as a child process between rounds of iota steps
//!   (interleaved, same machine, same threads), so the ratio is taken within one run even
//!   when the machine's load changes.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Int, Tensor};
use clap::Args;

use crate::codec::WireDtype;
use crate::data::{DataSpec, Dataset, Tokenizer};
use crate::model::attention::Attention;
use crate::model::backend::{BackendTask, DeviceKind, dispatch};
use crate::model::init::Init;
use crate::model::layers::{Linear, RmsNorm};
use crate::model::pipeline::Pipeline;
use crate::model::rope::Rope;
use crate::model::section_model::cross_entropy;
use crate::model::{ModelConfig, OptimizerConfig};

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

/// CPU time used so far by every live thread of this process (Linux; `None` elsewhere).
pub fn process_cpu_time() -> Option<Duration> {
    let mut ns: u64 = 0;
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        let path = entry.ok()?.path().join("schedstat");
        // A thread that ended between the listing and the read is skipped.
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        ns += text.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(ns))
}

/// Wall and CPU time of one measured stretch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Cost {
    /// Wall-clock time.
    pub(crate) wall: Duration,
    /// CPU time of the whole process.
    pub(crate) cpu: Duration,
}

/// Starts a [`Cost`] measurement; `stop` ends it.
pub(crate) struct Meter(Instant, Option<Duration>);

impl Meter {
    /// Starts measuring now.
    pub(crate) fn start() -> Self {
        Self(Instant::now(), process_cpu_time())
    }

    /// Wall and CPU time since `start`.
    pub(crate) fn stop(&self) -> Cost {
        let wall = self.0.elapsed();
        let cpu = match (self.1, process_cpu_time()) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => Duration::ZERO,
        };
        Cost { wall, cpu }
    }
}

/// Medians of wall and CPU times, taken separately.
pub(crate) fn median_cost(xs: &[Cost]) -> Cost {
    Cost {
        wall: median(xs.iter().map(|c| c.wall).collect()),
        cpu: median(xs.iter().map(|c| c.cpu).collect()),
    }
}

/// One row of the per-op table.
struct OpTime {
    name: String,
    shape: String,
    per_step: usize,
    time: Cost,
}

/// Step times of one round.
#[derive(Default)]
struct Round {
    whole: Vec<Cost>,
    step: Vec<Cost>,
    chain: Vec<Cost>,
    recompute: Vec<Cost>,
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
    whole: Cost,
    optimizer: Cost,
    chain: Cost,
    recompute: Cost,
    ops: Vec<OpTime>,
    torch: Vec<Cost>,
    torch_label: Option<String>,
}

impl BackendTask for StepTask {
    type Output = anyhow::Result<Measured>;

    fn run<B: AutodiffBackend>(self, device: B::Device) -> Self::Output {
        let data = Dataset::load(&DataSpec::default(), &Tokenizer::byte(), self.seq, 0)?;
        let pipeline = || {
            Pipeline::<B>::new(
                &self.cfg,
                0,
                OptimizerConfig::default(),
                WireDtype::default(),
                &device,
            )
        };
        let (mut whole, mut chain, mut recompute) = (pipeline()?, pipeline()?, pipeline()?);
        recompute.set_retain_graphs(false);
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
                let m = Meter::start();
                whole.train_whole(&refs)?;
                let s = Meter::start();
                whole.step(1e-3);
                let (step, total) = (s.stop(), m.stop());
                let c = Meter::start();
                chain.train_batch(&refs)?;
                chain.step(1e-3);
                let chained = c.stop();
                let c = Meter::start();
                recompute.train_batch(&refs)?;
                recompute.step(1e-3);
                let recomputed = c.stop();
                if it > 0 {
                    r.recompute.push(recomputed);
                    r.whole.push(total);
                    r.step.push(step);
                    r.chain.push(chained);
                }
            }
            rounds.push(r);
            if let Some(script) = &self.torch {
                let (cost, label) = run_torch(script, &self)
                    .with_context(|| format!("running the PyTorch twin (round {round})"))?;
                torch.push(cost);
                torch_label = Some(label);
            }
        }
        let pick = |f: fn(&Round) -> &Vec<Cost>| {
            median_cost(
                &rounds
                    .iter()
                    .flat_map(|r| f(r).iter().copied())
                    .collect::<Vec<_>>(),
            )
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
            recompute: pick(|r| &r.recompute),
            ops,
            torch,
            torch_label,
        })
    }
}

/// Runs the twin once; its median step (wall and CPU) and its one-line description.
fn run_torch(script: &str, task: &StepTask) -> anyhow::Result<(Cost, String)> {
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
    let ms = |field: &str| {
        v[field]
            .as_f64()
            .map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1e3))
            .with_context(|| format!("the twin's JSON lacks {field}"))
    };
    let cost = Cost {
        wall: ms("median_step_ms")?,
        cpu: ms("median_step_cpu_ms")?,
    };
    let label = format!(
        "{} ({} threads)",
        v["framework"].as_str().unwrap_or("pytorch"),
        v["threads"]
    );
    Ok((cost, label))
}

/// Median cost of `reps` runs of `f` (forward) plus the backward of the sum of its output.
fn time_op<B: AutodiffBackend, const D: usize>(reps: usize, f: impl Fn() -> Tensor<B, D>) -> Cost {
    // One untimed run warms allocations up.
    let _ = f().sum().backward();
    let costs: Vec<Cost> = (0..reps)
        .map(|_| {
            let m = Meter::start();
            let _ = f().sum().backward();
            m.stop()
        })
        .collect();
    median_cost(&costs)
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
        name: "swiglu silu(g) * u (fused on CPU)".into(),
        shape: format!("[{b},{s},{ff}]"),
        per_step: layers,
        time: time_op(reps, || crate::model::fused::swiglu(g.clone(), u.clone())),
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
    println!("\nstep (median)                            wall ms    CPU ms  tokens/s (wall)");
    let row = |name: &str, c: Cost| {
        println!(
            "{name:<38} {:>9.1} {:>9.1} {:>9.0}",
            ms(c.wall),
            ms(c.cpu),
            tps(c.wall)
        );
    };
    row("whole graph fwd+bwd + AdamW", m.whole);
    row("  of which AdamW (all sections)", m.optimizer);
    row("section chain (iota train) + AdamW", m.chain);
    row("  recomputing forwards in backwards", m.recompute);
    if let Some(label) = &m.torch_label {
        let t = median_cost(&m.torch);
        row(&format!("PyTorch twin, {label}"), t);
        println!("(twin: median of {} interleaved runs)", m.torch.len());
        let ratio = |a: Duration, b: Duration| ms(a) / ms(b).max(1e-9);
        println!("\nratio to PyTorch                          wall       CPU");
        println!(
            "iota whole-graph step / PyTorch step   {:>9.2} {:>9.2}",
            ratio(m.whole.wall, t.wall),
            ratio(m.whole.cpu, t.cpu)
        );
        println!(
            "iota chain step / PyTorch step         {:>9.2} {:>9.2}",
            ratio(m.chain.wall, t.wall),
            ratio(m.chain.cpu, t.cpu)
        );
        println!(
            "  recomputing chain / PyTorch step     {:>9.2} {:>9.2}",
            ratio(m.recompute.wall, t.wall),
            ratio(m.recompute.cpu, t.cpu)
        );
    }
    if !m.ops.is_empty() {
        println!(
            "\nop (forward + backward, alone)      shape                                  wall ms   CPU ms  x per step  CPU share of whole step (computed)"
        );
        for op in &m.ops {
            println!(
                "{:<35} {:<38} {:>7.2}  {:>7.2}  {:>10}  {:>5.1}%",
                op.name,
                op.shape,
                ms(op.time.wall),
                ms(op.time.cpu),
                op.per_step,
                100.0 * ms(op.time.cpu) * op.per_step as f64 / ms(m.whole.cpu).max(1e-9)
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_grows_with_work() {
        let before = process_cpu_time().expect("Linux /proc");
        let mut x = 0u64;
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(30) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let after = process_cpu_time().unwrap();
        assert!(after > before, "{before:?} -> {after:?}");
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        let ms = |v: &[u64]| v.iter().map(|&x| Duration::from_millis(x)).collect();
        assert_eq!(median(ms(&[5, 1, 3])), Duration::from_millis(3));
        assert_eq!(median(ms(&[4, 1, 3, 2])), Duration::from_micros(2500));
        assert_eq!(median(Vec::new()), Duration::ZERO);
    }
}
