//! The bias-free linear map `y = x W^T` as three matrix products on views of the operands.
//!
//! burn's autodiff writes it as reshape, transpose, batched matmul and reshape: its CPU matmul
//! copies every operand that is not in row-major order (the transposed weight forward, the
//! transposed input for the weight gradient) and its backward goes through each of those ops.
//! Here the forward is `x . W^T` and the backward `dy . W` and `dy^T . x`, all three handed
//! to the matrix-multiply kernel as strided views, with nothing copied.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::ndarray::NdArrayTensor;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};
use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

use super::{Cpu, downcast, primitive, same_backend, values};

/// `x W^T` for `W` stored `[d_out, d_in]`.
///
/// # Shapes
/// - x: `[batch, seq, d_in]`, w: `[d_out, d_in]` -> `[batch, seq, d_out]`
pub fn linear<B: Backend>(x: Tensor<B, 3>, w: Tensor<B, 2>) -> Tensor<B, 3> {
    let pair = match downcast::<(Tensor<Autodiff<Cpu>, 3>, Tensor<Autodiff<Cpu>, 2>), _>((x, w)) {
        Ok((x, w)) => return same_backend(linear_autodiff(x, w)),
        Err(pair) => pair,
    };
    let (x, w) = match downcast::<(Tensor<Cpu, 3>, Tensor<Cpu, 2>), _>(pair) {
        Ok((x, w)) => return same_backend(linear_cpu(x, w)),
        Err(pair) => pair,
    };
    composed(x, w)
}

/// burn's ops: the path of backends other than the CPU. One `[batch * seq, d_in] x [d_in,
/// d_out]` product rather than `batch` small ones, so the weight is packed once.
fn composed<B: Backend>(x: Tensor<B, 3>, w: Tensor<B, 2>) -> Tensor<B, 3> {
    let [batch, seq, d_in] = x.dims();
    let d_out = w.dims()[0];
    x.reshape([batch * seq, d_in])
        .matmul(w.transpose())
        .reshape([batch, seq, d_out])
}

/// Calls `f` with `tensor` as a `rows x cols` matrix view: the array itself when it is in
/// row-major order, else a row-major copy.
fn with_matrix<T>(
    tensor: &FloatTensor<Cpu>,
    (rows, cols): (usize, usize),
    f: impl FnOnce(ArrayView2<'_, f32>) -> T,
) -> T {
    if let NdArrayTensor::F32(storage) = tensor {
        let view = storage.view();
        if let Some(slice) = view.as_slice() {
            return f(matrix(slice, rows, cols));
        }
    }
    let copy = values(tensor.clone());
    f(matrix(&copy, rows, cols))
}

/// `slice` as a `rows x cols` row-major matrix.
fn matrix(slice: &[f32], rows: usize, cols: usize) -> ArrayView2<'_, f32> {
    match ArrayView2::from_shape((rows, cols), slice) {
        Ok(view) => view,
        Err(e) => unreachable!("a {rows} x {cols} operand has {} values: {e}", slice.len()),
    }
}

/// `a . b` into a new row-major `rows x cols` matrix.
fn product(a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>) -> Vec<f32> {
    let (rows, cols) = (a.nrows(), b.ncols());
    let mut out = vec![0.0f32; rows * cols];
    match ArrayViewMut2::from_shape((rows, cols), out.as_mut_slice()) {
        Ok(mut view) => general_mat_mul(1.0, &a, &b, 0.0, &mut view),
        Err(e) => unreachable!("the output was sized for its view: {e}"),
    }
    out
}

/// Dimensions of one product: rows of `x` (batch * seq), `d_in`, `d_out`, and `x`'s batch
/// and sequence sizes for the shapes handed back.
#[derive(Debug, Clone, Copy)]
struct Dims {
    batch: usize,
    seq: usize,
    d_in: usize,
    d_out: usize,
}

impl Dims {
    fn of(x: &[usize; 3], w: &[usize; 2]) -> Self {
        Self {
            batch: x[0],
            seq: x[1],
            d_in: x[2],
            d_out: w[0],
        }
    }

    fn rows(&self) -> usize {
        self.batch * self.seq
    }
}

/// `x . W^T` on CPU primitives.
fn forward(x: &FloatTensor<Cpu>, w: &FloatTensor<Cpu>, d: Dims) -> FloatTensor<Cpu> {
    let y = with_matrix(x, (d.rows(), d.d_in), |x| {
        with_matrix(w, (d.d_out, d.d_in), |w| product(x, w.t()))
    });
    primitive(y, [d.batch, d.seq, d.d_out].into())
}

/// The forward pass on the CPU backend without autodiff.
fn linear_cpu(x: Tensor<Cpu, 3>, w: Tensor<Cpu, 2>) -> Tensor<Cpu, 3> {
    let d = Dims::of(&x.dims(), &w.dims());
    let (x, w) = (x.into_primitive().tensor(), w.into_primitive().tensor());
    Tensor::from_primitive(TensorPrimitive::Float(forward(&x, &w, d)))
}

/// The backward pass of [`linear`].
#[derive(Debug)]
struct LinearBackward;

/// What the backward pass needs: both operands (shared, not copied) and the dimensions.
#[derive(Debug, Clone)]
struct LinearState {
    x: FloatTensor<Cpu>,
    w: FloatTensor<Cpu>,
    dims: Dims,
}

impl Backward<Cpu, 2> for LinearBackward {
    type State = LinearState;

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let dy = grads.consume::<Cpu>(&ops.node);
        let LinearState { x, w, dims: d } = ops.state;
        let [x_node, w_node] = ops.parents;
        with_matrix(&dy, (d.rows(), d.d_out), |dy| {
            if let Some(node) = x_node {
                let dx = with_matrix(&w, (d.d_out, d.d_in), |w| product(dy, w));
                grads.register::<Cpu>(node.id, primitive(dx, [d.batch, d.seq, d.d_in].into()));
            }
            if let Some(node) = w_node {
                let dw = with_matrix(&x, (d.rows(), d.d_in), |x| product(dy.t(), x));
                grads.register::<Cpu>(node.id, primitive(dw, [d.d_out, d.d_in].into()));
            }
        });
    }
}

/// The forward pass on the CPU autodiff backend, recording [`LinearBackward`].
fn linear_autodiff(
    x: Tensor<Autodiff<Cpu>, 3>,
    w: Tensor<Autodiff<Cpu>, 2>,
) -> Tensor<Autodiff<Cpu>, 3> {
    let dims = Dims::of(&x.dims(), &w.dims());
    let (x, w) = (x.into_primitive().tensor(), w.into_primitive().tensor());
    let out = forward(&x.primitive, &w.primitive, dims);
    let result = match LinearBackward
        .prepare::<NoCheckpointing>([x.node, w.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(
            LinearState {
                x: x.primitive,
                w: w.primitive,
                dims,
            },
            out,
        ),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    Tensor::from_primitive(TensorPrimitive::Float(result))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fused::tests_support::{close, sample};
    use crate::model::{TestAutodiff, TestBackend};
    use burn::tensor::TensorData;

    #[test]
    fn fused_linear_and_its_gradients_match_burns_ops() {
        let device = Default::default();
        let (batch, seq, d_in, d_out) = (3, 7, 24, 40);
        let x0: Vec<f32> = sample(batch * seq * d_in, 2)
            .iter()
            .map(|v| v * 0.1)
            .collect();
        let w0: Vec<f32> = sample(d_out * d_in, 4).iter().map(|v| v * 0.1).collect();
        let d0 = sample(batch * seq * d_out, 6);
        let run = |fused: bool| {
            // A permuted input, as attention hands its heads back (after `swap_dims`).
            let x = Tensor::<TestAutodiff, 3>::from_data(
                TensorData::new(x0.clone(), [seq, batch, d_in]),
                &device,
            )
            .require_grad();
            let w = Tensor::<TestAutodiff, 2>::from_data(
                TensorData::new(w0.clone(), [d_out, d_in]),
                &device,
            )
            .require_grad();
            let xt = x.clone().swap_dims(0, 1);
            let y = if fused {
                linear(xt, w.clone())
            } else {
                composed(xt, w.clone())
            };
            let d = Tensor::<TestAutodiff, 3>::from_data(
                TensorData::new(d0.clone(), [batch, seq, d_out]),
                &device,
            );
            let grads = (y.clone() * d).sum().backward();
            let read = |t: Tensor<TestBackend, 3>| t.into_data().to_vec::<f32>().unwrap();
            [
                read(y.inner()),
                read(x.grad(&grads).unwrap()),
                w.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap(),
            ]
        };
        let (fused, burn) = (run(true), run(false));
        for (name, (got, want)) in ["output", "grad x", "grad w"]
            .iter()
            .zip(fused.iter().zip(&burn))
        {
            close(name, got, want, 1e-5);
        }
        // Without autodiff, the same forward.
        let plain = linear(
            Tensor::<TestBackend, 3>::from_data(
                TensorData::new(x0.clone(), [seq, batch, d_in]),
                &device,
            )
            .swap_dims(0, 1),
            Tensor::<TestBackend, 2>::from_data(TensorData::new(w0, [d_out, d_in]), &device),
        );
        close(
            "plain output",
            &plain.into_data().to_vec::<f32>().unwrap(),
            &fused[0],
            1e-6,
        );
    }
}
