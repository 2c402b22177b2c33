//! `iota bench model`: forward+backward throughput of the whole model in one autodiff graph
//! against the section chain (each section's graph kept from its forward to its backward,
//! boundary tensors through the wire codec; `iota train`'s step), bytes per sample at each boundary, and peak memory.

use std::time::{Duration, Instant};

use anyhow::Context;
use burn::tensor::backend::AutodiffBackend;
use clap::Args;

use super::peak_rss_bytes;
use crate::cmd::model::{boundary_bytes, human_bytes, human_count};
use crate::codec::WireDtype;
use crate::data::{DataSpec, Dataset, Tokenizer};
use crate::model::backend::{BackendTask, DeviceKind, FloatType, dispatch_float};
use crate::model::pipeline::Pipeline;
use crate::model::{ModelConfig, OptimizerConfig, Section};

/// Arguments of `iota bench model`.
#[derive(Debug, Args)]
pub struct BenchModelArgs {
    /// Model preset.
    #[arg(long, value_name = "NAME", default_value = "tiny")]
    pub preset: String,
    /// Samples per batch.
    #[arg(long, value_name = "B", default_value_t = 8)]
    pub batch_size: usize,
    /// Tokens per sample (default: the preset's max_seq_len).
    #[arg(long, value_name = "L")]
    pub seq_len: Option<usize>,
    /// Timed batches per variant (after one warm-up batch each).
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub iters: usize,
    /// Boundary encoding used by the chain.
    #[arg(long, value_name = "DTYPE", default_value = "bf16")]
    pub wire: WireDtype,
    /// Device.
    #[arg(long, value_name = "DEVICE", default_value = "cpu")]
    pub device: DeviceKind,
    /// Float type of the whole computation: f32, or bf16 (cuda only).
    #[arg(long, value_name = "TYPE", default_value = "f32")]
    pub float: FloatType,
    /// The device's peak in TFLOP/s (e.g. 989 for an H100 SXM's dense bf16): adds model FLOP
    /// utilization (MFU) to the report.
    #[arg(long, value_name = "TFLOPS")]
    pub peak_tflops: Option<f64>,
}

struct Measured {
    /// The untimed first batch of all three variants (where a GPU compiles its kernels).
    warmup: Duration,
    /// Building the pipeline (weights, optimizer state) on the device.
    setup: Duration,
    whole: Duration,
    chain: Duration,
    /// The flat optimizer step (`OptimizerConfig::flat_step`).
    step_flat: Duration,
    /// The same step parameter by parameter, on the same gradients.
    step_by_name: Duration,
    wire_bytes_per_sample: usize,
}

struct Task {
    cfg: ModelConfig,
    batch: usize,
    seq: usize,
    iters: usize,
    wire: WireDtype,
}

impl BackendTask for Task {
    type Output = anyhow::Result<Measured>;

    fn run<B: AutodiffBackend>(self, device: B::Device) -> Self::Output {
        let data = Dataset::load(&DataSpec::default(), &Tokenizer::byte(), self.seq, 0)?;
        // A GPU backend queues work and returns: every timed region ends by waiting for it.
        let sync = || B::sync(&device).map_err(|e| anyhow::anyhow!("device sync: {e:?}"));
        let started = Instant::now();
        let mut pipeline =
            Pipeline::<B>::new(&self.cfg, 0, OptimizerConfig::default(), self.wire, &device)?;
        sync()?;
        let setup = started.elapsed();
        let (mut whole, mut chain) = (Duration::ZERO, Duration::ZERO);
        let (mut step_flat, mut step_by_name) = (Duration::ZERO, Duration::ZERO);
        let mut warmup = Duration::ZERO;
        let mut wire_bytes = 0;
        for it in 0..=self.iters {
            let owned: Vec<_> = (0..self.batch)
                .map(|i| data.train_sample((it * self.batch + i) as u64))
                .collect();
            let windows: Vec<&[u32]> = owned.iter().map(AsRef::as_ref).collect();
            let run_whole = |p: &mut Pipeline<B>| {
                time(|| {
                    p.train_whole(&windows)?;
                    sync()
                })
            };
            let mut run_chain = |p: &mut Pipeline<B>| {
                time(|| {
                    let r = p.train_batch(&windows)?;
                    wire_bytes = r.bytes_forward + r.bytes_backward;
                    sync()
                })
            };
            // Alternate the order so neither variant always runs on a warm cache.
            let (t_whole, t_chain) = if it % 2 == 0 {
                let w = run_whole(&mut pipeline)?;
                (w, run_chain(&mut pipeline)?)
            } else {
                let c = run_chain(&mut pipeline)?;
                (run_whole(&mut pipeline)?, c)
            };
            // Both kinds of optimizer step on the same gradients, one on a copy of the sections
            // (shared tensors, no copy of values) that is dropped after.
            let run_kind = |s: &mut [Section<B>], flat: bool| {
                time(|| {
                    for s in s.iter_mut() {
                        s.set_flat_step(flat);
                        s.step(1e-4);
                    }
                    sync()
                })
            };
            let run_by_name = |p: &Pipeline<B>| run_kind(&mut p.sections().to_vec(), false);
            let run_flat = |p: &mut Pipeline<B>| run_kind(p.sections_mut(), true);
            let (t_step, t_by_name) = if it % 2 == 0 {
                let b = run_by_name(&pipeline)?;
                (run_flat(&mut pipeline)?, b)
            } else {
                let f = run_flat(&mut pipeline)?;
                (f, run_by_name(&pipeline)?)
            };
            if it > 0 {
                whole += t_whole;
                chain += t_chain;
                step_flat += t_step;
                step_by_name += t_by_name;
            } else {
                warmup = t_whole + t_chain + t_step + t_by_name;
            }
        }
        Ok(Measured {
            warmup,
            setup,
            whole,
            chain,
            step_flat,
            step_by_name,
            wire_bytes_per_sample: wire_bytes / self.batch.max(1),
        })
    }
}

fn time(f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<Duration> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed())
}

/// Runs `iota bench model`.
///
/// # Errors
/// Unknown preset, backend not compiled in, or a failure while running.
pub fn run(args: BenchModelArgs) -> anyhow::Result<()> {
    let mut cfg = ModelConfig::preset(&args.preset)?;
    let seq = args.seq_len.unwrap_or(cfg.max_seq_len);
    cfg.max_seq_len = cfg.max_seq_len.max(seq);
    let iters = args.iters.max(1);
    println!(
        "iota bench model: preset {} ({} params), batch {} x {} tokens, {} timed batches, device {} ({}), wire {}",
        cfg.name,
        human_count(cfg.total_params()),
        args.batch_size,
        seq,
        iters,
        args.device,
        args.float,
        args.wire
    );
    println!("\nsection  blocks  params");
    for i in 0..cfg.n_sections() {
        let [a, b] = cfg.sections[i];
        println!(
            "{i:<7}  {:<6}  {}",
            format!("{a}..{b}"),
            human_count(cfg.section_params(i)?)
        );
    }
    let task = Task {
        cfg: cfg.clone(),
        batch: args.batch_size,
        seq,
        iters,
        wire: args.wire,
    };
    let m = dispatch_float(args.device, args.float, task)
        .map_err(anyhow::Error::msg)?
        .context("running the benchmark")?;
    let tokens = (args.batch_size * seq * iters) as f64;
    let tps = |d: Duration| tokens / d.as_secs_f64().max(1e-9);
    println!(
        "\nsetup (weights, optimizer state) {:.2} s; untimed first batch of each variant {:.2} s (on a GPU: kernel compilation, or the kernel cache's load)",
        m.setup.as_secs_f64(),
        m.warmup.as_secs_f64()
    );
    println!("\nforward+backward          tokens/s   ms/batch");
    println!(
        "whole graph (one process)  {:>9.0}  {:>8.1}",
        tps(m.whole),
        m.whole.as_secs_f64() * 1e3 / iters as f64
    );
    println!(
        "section chain (+codec)     {:>9.0}  {:>8.1}",
        tps(m.chain),
        m.chain.as_secs_f64() * 1e3 / iters as f64
    );
    println!(
        "chain / whole              {:>9.2}",
        tps(m.chain) / tps(m.whole)
    );
    println!(
        "optimizer step (all sections)  {:.1} ms flat, {:.1} ms parameter by parameter ({:.2}x)",
        m.step_flat.as_secs_f64() * 1e3 / iters as f64,
        m.step_by_name.as_secs_f64() * 1e3 / iters as f64,
        m.step_by_name.as_secs_f64() / m.step_flat.as_secs_f64().max(1e-12)
    );
    // Model FLOPs (computed from the shape) over measured time: the whole graph and one
    // optimizer step per batch (of the kind the default configuration takes), as a training
    // step of `iota train` runs.
    let per_token = cfg.train_flops_per_token(seq);
    let default_step = if OptimizerConfig::default().flat_step {
        m.step_flat
    } else {
        m.step_by_name
    };
    let gflops = per_token * tokens / (m.whole + default_step).as_secs_f64().max(1e-9) / 1e9;
    print!(
        "model FLOPs {:.3} G/token (computed); whole graph + step: {gflops:.1} GFLOP/s",
        per_token / 1e9
    );
    match args.peak_tflops {
        Some(peak) if peak > 0.0 => println!(
            ", MFU {:.2}% of {peak} TFLOP/s",
            100.0 * gflops / (peak * 1e3)
        ),
        _ => println!(),
    }

    let [f32_full, bf16_full, bf16_b, int8_b] = boundary_bytes(&cfg, seq);
    println!("\nbytes per sample per boundary per direction");
    println!("full width f32       {:>12}  1x", human_bytes(f32_full));
    println!(
        "full width bf16      {:>12}  {:.0}x",
        human_bytes(bf16_full),
        f32_full as f64 / bf16_full as f64
    );
    println!(
        "bottleneck bf16      {:>12}  {:.0}x",
        human_bytes(bf16_b),
        f32_full as f64 / bf16_b as f64
    );
    println!(
        "bottleneck int8      {:>12}  {:.0}x",
        human_bytes(int8_b),
        f32_full as f64 / int8_b as f64
    );
    println!(
        "measured in the chain: {} per sample over all {} boundaries, both directions",
        human_bytes(m.wire_bytes_per_sample),
        cfg.n_sections().saturating_sub(1)
    );
    if let Some(peak) = peak_rss_bytes() {
        println!("\npeak memory (process RSS) {}", human_bytes(peak));
    }
    Ok(())
}
