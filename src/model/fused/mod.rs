//! Fused kernels for the CPU backend, with their own backward.
//!
//! burn composes SwiGLU's `silu(g) * u` and causal attention's masked softmax from generic
//! element-wise ops: its sigmoid alone is `exp(-log(1 + exp(-x)))`, each op is a pass over
//! memory with its own allocation, and autodiff records, recomputes and differentiates every
//! one of them. Measured with `iota bench step` on the `small` preset (one thread), SwiGLU's
//! gated product took 22-28 ms per layer forward + backward and the attention core 28-35 ms,
//! against PyTorch's 4.6 and 13 ms (`benches/torch_ops.py`). Here each is one pass forward and
//! one backward over plain slices (attention keeps burn's matrix products), with an `exp` the
//! compiler can vectorise.
//!
//! The entry points are generic over the backend like the rest of the model: on the CPU
//! backend (with or without autodiff) they take the fused path, on any other backend (CUDA,
//! wgpu) burn's composed ops, which those backends fuse themselves.
//!
//! # Layout
//! - [`swiglu`](mod@swiglu): SwiGLU's gated product.
//! - [`attention`](mod@attention): causal grouped-query attention.
//! - [`linear`](mod@linear): the bias-free linear map, its products on strided views.

pub mod attention;
pub mod linear;
pub mod swiglu;

pub use attention::{attention_to_all, causal_attention};
pub use linear::linear;
pub use swiglu::swiglu;

use std::any::Any;

use burn::backend::Autodiff;
use burn::backend::ndarray::NdArrayTensor;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Shape, Tensor, TensorData, TensorPrimitive};

use super::backend::Cpu;

/// Elements per parallel work item: large enough to amortise scheduling, small enough to
/// split a layer's activations over every thread.
const CHUNK: usize = 16 * 1024;

/// `value` as type `T`, when it is one (how the generic entry points find the CPU backend).
fn downcast<T: 'static, U: 'static>(value: U) -> Result<T, U> {
    let boxed: Box<dyn Any> = Box::new(value);
    match boxed.downcast::<T>() {
        Ok(t) => Ok(*t),
        Err(boxed) => match boxed.downcast::<U>() {
            Ok(u) => Err(*u),
            Err(_) => unreachable!("the box holds the U it was built from"),
        },
    }
}

/// Hands back a tensor of a concrete backend as the generic `B` that a downcast showed it to be.
fn same_backend<A: Backend, B: Backend, const D: usize>(tensor: Tensor<A, D>) -> Tensor<B, D> {
    match downcast::<Tensor<B, D>, _>(tensor) {
        Ok(tensor) => tensor,
        Err(_) => unreachable!("called only after a downcast showed that A is B"),
    }
}

/// A CPU float tensor's values, in row-major order. Read through a view of the array: burn's
/// `into_data` walks a shared or permuted array element by element over a dynamic index (29 ms
/// for 1M values, measured); a permuted array (after `swap_dims`) is gathered here with its
/// strides instead.
fn values(tensor: FloatTensor<Cpu>) -> Vec<f32> {
    if let NdArrayTensor::F32(storage) = &tensor {
        let view = storage.view();
        if let Some(contiguous) = view.as_slice() {
            return contiguous.to_vec();
        }
        let strides = view.strides();
        if let (Some(memory), true) = (
            view.as_slice_memory_order(),
            strides.iter().all(|&s| s >= 0),
        ) {
            let strides: Vec<usize> = strides.iter().map(|&s| s as usize).collect();
            return gather(memory, view.shape(), &strides);
        }
        return view.iter().copied().collect();
    }
    let data = Tensor::<Cpu, 1>::from_primitive(TensorPrimitive::Float(tensor)).into_data();
    // (`into_data` reads the primitive's own shape; the 1 above is only the type.)
    match data.convert::<f32>().into_vec::<f32>() {
        Ok(values) => values,
        Err(e) => unreachable!("a tensor converted to f32 reads back as f32: {e:?}"),
    }
}

/// The values of `tensor` in row-major order when it lives on the CPU backend (with or without
/// autodiff), read through a view of its array as [`values`] does; the tensor itself back on
/// any other backend. burn's `into_data` copies a tensor whose array is shared (every `to_data`,
/// every parameter, every optimizer moment) element by element over a dynamic index: 17% of a
/// miner's CPU time with merges every 20 samples of `tiny`, measured with `perf`.
pub fn cpu_values<B: Backend, const D: usize>(
    tensor: Tensor<B, D>,
) -> Result<Vec<f32>, Tensor<B, D>> {
    let tensor = match downcast::<Tensor<Autodiff<Cpu>, D>, _>(tensor) {
        Ok(t) => return Ok(values(t.inner().into_primitive().tensor())),
        Err(t) => t,
    };
    downcast::<Tensor<Cpu, D>, _>(tensor).map(|t| values(t.into_primitive().tensor()))
}

/// The elements of an array stored in `memory` with non-negative `strides`, in row-major order
/// of `shape`.
fn gather(memory: &[f32], shape: &[usize], strides: &[usize]) -> Vec<f32> {
    let total: usize = shape.iter().product();
    let mut out = Vec::with_capacity(total);
    let Some((&inner, outer)) = shape.split_last() else {
        return memory.iter().take(1).copied().collect();
    };
    let inner_stride = strides[strides.len() - 1];
    let mut index = vec![0usize; outer.len()];
    if inner == 0 || outer.contains(&0) {
        return out;
    }
    loop {
        let base: usize = index.iter().zip(strides).map(|(i, s)| i * s).sum();
        out.extend((0..inner).map(|j| memory[base + j * inner_stride]));
        // The next index of the outer dimensions, last one fastest.
        let mut dim = outer.len();
        loop {
            if dim == 0 {
                return out;
            }
            dim -= 1;
            index[dim] += 1;
            if index[dim] < outer[dim] {
                break;
            }
            index[dim] = 0;
        }
    }
}

/// A CPU float tensor of `shape` holding `values` (row-major).
fn primitive(values: Vec<f32>, shape: Shape) -> FloatTensor<Cpu> {
    NdArrayTensor::from_data(TensorData::new(values, shape))
}

/// The logistic function `1 / (1 + e^-x)`.
#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `e^x` in f32 without a library call, so that loops over it vectorise: `x = n ln 2 + r`
/// with `|r| <= ln 2 / 2`, `e^r` by a degree-7 polynomial (Cephes' `expf` coefficients),
/// `2^n` put together from its exponent bits. Relative error below 5e-7 over the clamped
/// range (tested); inputs beyond it saturate (to about 1.6e-38 and 1.7e38), which the
/// logistic function and a max-subtracted softmax never notice.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer in plain SSE2.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let e_r = p * r * r + r + 1.0;
    e_r * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TestBackend;

    #[test]
    fn exp_matches_the_library_over_the_range_the_kernels_use() {
        let mut worst = 0.0f32;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let want = x.exp();
            worst = worst.max(((exp(x) - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 5e-7, "worst relative error {worst}");
        assert_eq!(sigmoid(-200.0), 1.0 / (1.0 + exp(88.0)));
        assert_eq!(sigmoid(200.0), 1.0);
        assert!(sigmoid(f32::NAN).is_nan(), "NaN must propagate");
    }

    #[test]
    fn values_of_a_permuted_tensor_come_back_in_row_major_order() {
        let device = Default::default();
        let data: Vec<f32> = (0..2 * 3 * 4 * 5).map(|i| i as f32).collect();
        let t = Tensor::<TestBackend, 4>::from_data(TensorData::new(data, [2, 3, 4, 5]), &device);
        for permuted in [t.clone().swap_dims(1, 2), t.clone().swap_dims(0, 3), t] {
            let want = permuted.clone().into_data().to_vec::<f32>().unwrap();
            let got = values(permuted.into_primitive().tensor());
            assert_eq!(got, want);
        }
    }

    #[test]
    fn shared_cpu_tensors_with_or_without_autodiff_are_read_whole_and_in_order() {
        use crate::model::TestAutodiff;
        let device = Default::default();
        let data: Vec<f32> = (0..6 * 7).map(|i| i as f32 * 0.5 - 3.0).collect();
        let plain =
            Tensor::<TestBackend, 2>::from_data(TensorData::new(data.clone(), [6, 7]), &device);
        let kept = plain.clone(); // shared: burn's into_data would walk it element by element
        assert_eq!(
            cpu_values(plain.swap_dims(0, 1)).ok(),
            Some(
                kept.clone()
                    .swap_dims(0, 1)
                    .into_data()
                    .to_vec::<f32>()
                    .unwrap()
            )
        );
        assert_eq!(cpu_values(kept.clone()).ok(), Some(data.clone()));
        let tracked =
            Tensor::<TestAutodiff, 2>::from_data(TensorData::new(data.clone(), [6, 7]), &device)
                .require_grad();
        let shared = tracked.clone().flatten::<1>(0, 1);
        assert_eq!(cpu_values(shared).ok(), Some(data.clone()));
        assert_eq!(crate::model::host_values(tracked).unwrap(), data);
    }
}

/// Inputs and comparisons shared by the kernels' tests.
#[cfg(test)]
pub(crate) mod tests_support {
    /// `n` values with both signs, large and small magnitudes, from `seed`.
    pub fn sample(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let t = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) as f32;
                (t / u32::MAX as f32 - 0.5) * 16.0
            })
            .collect()
    }

    /// Asserts that `got` and `want` agree within `tol`, relative to `1 + |want|`.
    pub fn close(name: &str, got: &[f32], want: &[f32], tol: f32) {
        assert_eq!(got.len(), want.len(), "{name}: lengths");
        let worst = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
            .fold(0.0f32, f32::max);
        eprintln!("{name}: worst difference {worst} (bound {tol})");
        assert!(worst < tol, "{name}: worst difference {worst}");
    }
}
