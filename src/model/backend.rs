//! Run-time choice among the burn backends compiled into this binary.
//!
//! The CPU backend (`ndarray`) is always present; `cuda`, `wgpu` and `flex` exist only when
//! iota was built with the cargo feature of the same name. Code that trains is written once,
//! generic over an autodiff backend, as a [`BackendTask`]; [`dispatch`] runs it on the backend
//! the user picked, or says clearly that the binary lacks it.

use std::fmt;
use std::str::FromStr;

use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

/// The default CPU backend (measured faster than `flex` on the `small` preset; see docs/performance.md).
pub type Cpu = burn::backend::NdArray<f32>;

/// The matrix-multiply kernel behind the CPU backend: OpenBLAS when built with the
/// `openblas` feature, otherwise the pure-Rust `matrixmultiply` crate.
pub const MATMUL: &str = if cfg!(feature = "openblas") {
    "OpenBLAS (system library)"
} else {
    "matrixmultiply (pure Rust)"
};

/// Limits the threads of the matrix-multiply kernel's own pool to `n`.
///
/// OpenBLAS reads `OPENBLAS_NUM_THREADS` when the library is loaded, before `main` runs, so an
/// environment variable set at start-up does not reach it: its pool is resized here through
/// its C API. `matrixmultiply` reads `MATMUL_NUM_THREADS` at its first product instead (the
/// caller sets that variable); for it this function does nothing.
pub fn limit_matmul_threads(n: usize) {
    #[cfg(feature = "openblas")]
    {
        unsafe extern "C" {
            /// OpenBLAS's run-time thread count (`cblas.h`).
            fn openblas_set_num_threads(num_threads: std::os::raw::c_int);
        }
        let n = std::os::raw::c_int::try_from(n.max(1)).unwrap_or(std::os::raw::c_int::MAX);
        // SAFETY: a plain C call with an integer argument; OpenBLAS is linked by the
        // `openblas` feature (burn-ndarray/blas-openblas-system).
        unsafe { openblas_set_num_threads(n) };
    }
    #[cfg(not(feature = "openblas"))]
    let _ = n;
}

/// A device the user can ask for with `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// The CPU (burn's ndarray backend, multi-threaded, SIMD).
    #[default]
    Cpu,
    /// An NVIDIA GPU through CUDA (feature `cuda`).
    Cuda,
    /// A GPU through wgpu: Vulkan, Metal or DX12 (feature `wgpu`).
    Wgpu,
    /// The CPU through burn's `flex` backend (feature `flex`; for benchmarks).
    Flex,
}

impl DeviceKind {
    /// Every kind, compiled in or not.
    pub const ALL: [DeviceKind; 4] = [Self::Cpu, Self::Cuda, Self::Wgpu, Self::Flex];

    /// Whether this binary was built with the backend.
    pub fn compiled_in(self) -> bool {
        match self {
            Self::Cpu => true,
            Self::Cuda => cfg!(feature = "cuda"),
            Self::Wgpu => cfg!(feature = "wgpu"),
            Self::Flex => cfg!(feature = "flex"),
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
            Self::Wgpu => "wgpu",
            Self::Flex => "flex",
        })
    }
}

impl FromStr for DeviceKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.to_string() == s.to_ascii_lowercase())
            .ok_or_else(|| format!("unknown device `{s}` (expected cpu, cuda, wgpu or flex)"))
    }
}

/// The float type the model computes and stores its tensors in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FloatType {
    /// 32-bit floats, on every backend.
    #[default]
    F32,
    /// bfloat16 everywhere (weights, activations, optimizer moments), on CUDA only: burn has
    /// no mixed-precision autocast, so this is pure bf16, for throughput measurements.
    Bf16,
}

impl fmt::Display for FloatType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
        })
    }
}

impl FromStr for FloatType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(Self::F32),
            "bf16" => Ok(Self::Bf16),
            _ => Err(format!("unknown float type `{s}` (expected f32 or bf16)")),
        }
    }
}

/// Turns on cubecl's on-disk cache of compiled GPU kernels (PTX), unless a `cubecl.toml` or
/// the environment already chose a cache, before the first kernel is compiled. Returns whether
/// this call set the configuration (false when cubecl had already read its own).
///
/// burn compiles each kernel with NVRTC the first time it meets it: on one H100 the `small`
/// preset's first batch compiled 399 kernels in about 325 s (docs/performance.md, "On a GPU"). cubecl keeps
/// no compiled kernel between runs unless asked to, so without this every start of a miner paid
/// that again. The cache lives where cubecl keeps its autotune results: `target/` when run
/// inside a cargo project, else the user's cache directory (`~/.cache/cubecl`).
#[cfg(feature = "cuda")]
pub fn cache_gpu_kernels() -> bool {
    use burn::cubecl::config::cache::CacheConfig;
    use burn::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    let mut slot = CubeClRuntimeConfig::storage().lock();
    if slot.is_some() {
        return false;
    }
    let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    if config.compilation.cache.is_none() {
        config.compilation.cache = Some(CacheConfig::Target);
    }
    *slot = Some(std::sync::Arc::new(config));
    true
}

/// Work that runs on any autodiff backend.
pub trait BackendTask {
    /// What the work returns.
    type Output;
    /// Runs the work on backend `B` and `device`.
    fn run<B: AutodiffBackend>(self, device: B::Device) -> Self::Output;
}

/// Runs `task` on the backend for `kind`.
///
/// # Errors
/// When the binary was built without that backend (the message names the cargo feature).
pub fn dispatch<T: BackendTask>(kind: DeviceKind, task: T) -> Result<T::Output, String> {
    use burn::backend::Autodiff;
    match kind {
        DeviceKind::Cpu => Ok(task.run::<Autodiff<Cpu>>(Default::default())),
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => {
            cache_gpu_kernels();
            Ok(task.run::<Autodiff<burn::backend::Cuda>>(Default::default()))
        }
        #[cfg(feature = "wgpu")]
        DeviceKind::Wgpu => Ok(task.run::<Autodiff<burn::backend::Wgpu>>(Default::default())),
        #[cfg(feature = "flex")]
        DeviceKind::Flex => Ok(task.run::<Autodiff<burn::backend::Flex>>(Default::default())),
        #[allow(unreachable_patterns)]
        other => Err(format!(
            "this iota binary was built without the `{other}` backend; rebuild with `cargo build --release --features {other}`"
        )),
    }
}

/// Runs `task` on the backend for `kind`, computing in `float`.
///
/// # Errors
/// When the binary lacks the backend, or `float` is bf16 on a backend other than CUDA.
pub fn dispatch_float<T: BackendTask>(
    kind: DeviceKind,
    float: FloatType,
    task: T,
) -> Result<T::Output, String> {
    match (kind, float) {
        (_, FloatType::F32) => dispatch(kind, task),
        #[cfg(feature = "cuda")]
        (DeviceKind::Cuda, FloatType::Bf16) => {
            use burn::backend::{Autodiff, Cuda};
            cache_gpu_kernels();
            Ok(task.run::<Autodiff<Cuda<burn::tensor::bf16>>>(Default::default()))
        }
        (other, FloatType::Bf16) => Err(format!(
            "bf16 runs on the cuda backend only (asked for {other}{})",
            if cfg!(feature = "cuda") {
                ""
            } else {
                ", and this binary was built without cuda"
            }
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_is_refused_off_cuda_with_a_reason() {
        struct Name;
        impl BackendTask for Name {
            type Output = ();
            fn run<B: AutodiffBackend>(self, _: B::Device) {}
        }
        assert_eq!("BF16".parse::<FloatType>(), Ok(FloatType::Bf16));
        assert!("fp8".parse::<FloatType>().is_err());
        let err = dispatch_float(DeviceKind::Cpu, FloatType::Bf16, Name).unwrap_err();
        assert!(err.contains("cuda backend only"), "{err}");
        assert!(dispatch_float(DeviceKind::Cpu, FloatType::F32, Name).is_ok());
    }

    #[test]
    fn parse_and_report_missing_backends() {
        assert_eq!("CPU".parse::<DeviceKind>().unwrap(), DeviceKind::Cpu);
        assert!("tpu".parse::<DeviceKind>().is_err());
        struct Name;
        impl BackendTask for Name {
            type Output = &'static str;
            fn run<B: AutodiffBackend>(self, _: B::Device) -> &'static str {
                std::any::type_name::<B>()
            }
        }
        assert!(dispatch(DeviceKind::Cpu, Name).unwrap().contains("NdArray"));
        if !cfg!(feature = "cuda") {
            let err = dispatch(DeviceKind::Cuda, Name).unwrap_err();
            assert!(err.contains("--features cuda"), "{err}");
        }
    }
}
