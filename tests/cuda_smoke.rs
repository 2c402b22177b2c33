//! The CUDA backend on a real GPU: the `tiny` section chain trains on `--device cuda` and its
//! first loss matches the CPU's. Built only with `--features cuda`
//! (`cargo test --features cuda --test cuda_smoke`); on a machine without an NVIDIA driver it
//! says so and passes without running anything.
#![cfg(feature = "cuda")]

use burn::backend::{Autodiff, Cuda};
use iota::model::backend::Cpu;
use iota::model::pipeline::Pipeline;
use iota::model::{ModelConfig, OptimizerConfig};
use iota::storage::WireDtype;

/// Whether an NVIDIA driver is loaded (the kernel module publishes its version here).
fn gpu_present() -> bool {
    std::path::Path::new("/proc/driver/nvidia/version").exists()
}

fn windows() -> Vec<Vec<u32>> {
    (0..4)
        .map(|w| (0..33).map(|i| ((i * 7 + w * 13) % 251) as u32).collect())
        .collect()
}

#[test]
fn tiny_chain_trains_on_cuda_like_on_cpu() {
    if !gpu_present() {
        eprintln!(
            "cuda_smoke: skipped: no NVIDIA GPU here (no /proc/driver/nvidia/version); run it on a GPU machine"
        );
        return;
    }
    let cfg = ModelConfig::preset("tiny").unwrap();
    let windows = windows();
    let refs: Vec<&[u32]> = windows.iter().map(|w| w.as_slice()).collect();
    let opt = OptimizerConfig::default();

    let mut cpu =
        Pipeline::<Autodiff<Cpu>>::new(&cfg, 0, opt, WireDtype::F32, &Default::default()).unwrap();
    let mut gpu =
        Pipeline::<Autodiff<Cuda>>::new(&cfg, 0, opt, WireDtype::F32, &Default::default()).unwrap();
    let mut losses = Vec::new();
    for _ in 0..3 {
        let c = cpu.train_batch(&refs).unwrap().loss;
        let g = gpu.train_batch(&refs).unwrap().loss;
        cpu.step(1e-2);
        gpu.step(1e-2);
        losses.push((c, g));
    }
    let (c0, g0) = losses[0];
    assert!(
        (c0 - g0).abs() < 1e-3 * c0.abs().max(1.0),
        "first loss: cpu {c0}, cuda {g0}"
    );
    let (_, g_last) = losses[losses.len() - 1];
    assert!(g_last.is_finite() && g_last < g0, "cuda losses {losses:?}");
}
