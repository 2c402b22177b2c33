//! The CUDA backend on a real GPU: the `tiny` section chain trains on `--device cuda` and each
//! step's loss matches the CPU's; and compiled GPU kernels are kept on disk between runs. Built
//! only with `--features cuda` (`cargo test --features cuda --test cuda_smoke`); on a machine
//! without an NVIDIA driver the GPU half says so and passes.
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

/// Losses of three training steps of the `tiny` chain on backend `B`.
fn three_steps<B: burn::tensor::backend::AutodiffBackend>(device: &B::Device) -> Vec<f32> {
    let cfg = ModelConfig::preset("tiny").unwrap();
    let windows = windows();
    let refs: Vec<&[u32]> = windows.iter().map(|w| w.as_slice()).collect();
    let mut pipeline =
        Pipeline::<B>::new(&cfg, 0, OptimizerConfig::default(), WireDtype::F32, device).unwrap();
    (0..3)
        .map(|_| {
            let loss = pipeline.train_batch(&refs).unwrap().loss;
            pipeline.step(1e-3);
            loss
        })
        .collect()
}

#[test]
fn tiny_chain_trains_on_cuda_like_on_cpu() {
    // The CPU half runs everywhere: it checks that these steps do lower the loss (at 1e-2 they
    // did not, on either backend: the first GPU run of this test, 2026-11-25).
    let cpu = three_steps::<Autodiff<Cpu>>(&Default::default());
    assert!(cpu[2] < cpu[0], "cpu losses {cpu:?}");
    if !gpu_present() {
        eprintln!(
            "cuda_smoke: skipped: no NVIDIA GPU here (no /proc/driver/nvidia/version); run it on a GPU machine"
        );
        return;
    }
    iota::model::backend::cache_gpu_kernels();
    let gpu = three_steps::<Autodiff<Cuda>>(&Default::default());
    eprintln!("cuda_smoke: losses cpu {cpu:?}, cuda {gpu:?}");
    for (step, (c, g)) in cpu.iter().zip(&gpu).enumerate() {
        assert!(
            (c - g).abs() < 1e-3 * c.abs().max(1.0),
            "step {step}: cpu {c}, cuda {g} (all: cpu {cpu:?}, cuda {gpu:?})"
        );
    }
}

#[test]
fn compiled_gpu_kernels_are_kept_on_disk() {
    use burn::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    // Needs no GPU: it checks the configuration cubecl will read when its first kernel
    // compiles. (The other test may have set it first: either way it must hold a cache.)
    iota::model::backend::cache_gpu_kernels();
    let config = CubeClRuntimeConfig::get();
    let cache = config.compilation.cache.as_ref();
    assert!(cache.is_some(), "no kernel cache: {config:?}");
    // A second call changes nothing once the configuration is in place.
    assert!(!iota::model::backend::cache_gpu_kernels());
}
