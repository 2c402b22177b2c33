//! SwiGLU's gated product `silu(g) * u`: one pass forward, one pass backward.

use std::sync::Arc;

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::activation::silu;
use burn::tensor::backend::Backend;
use burn::tensor::{Shape, Tensor, TensorPrimitive};
use rayon::prelude::*;

use super::{CHUNK, Cpu, downcast, primitive, same_backend, sigmoid, values};

/// `silu(g) * u`, the gated product of a SwiGLU block.
///
/// # Shapes
/// - g, u: `[batch, seq, d_ff]` (equal) -> `[batch, seq, d_ff]`
pub fn swiglu<B: Backend>(g: Tensor<B, 3>, u: Tensor<B, 3>) -> Tensor<B, 3> {
    let pair = match downcast::<(Tensor<Autodiff<Cpu>, 3>, Tensor<Autodiff<Cpu>, 3>), _>((g, u)) {
        Ok((g, u)) => return same_backend(swiglu_autodiff(g, u)),
        Err(pair) => pair,
    };
    let (g, u) = match downcast::<(Tensor<Cpu, 3>, Tensor<Cpu, 3>), _>(pair) {
        Ok((g, u)) => return same_backend(swiglu_cpu(g, u)),
        Err(pair) => pair,
    };
    silu(g) * u
}

/// The forward pass on the CPU backend without autodiff.
fn swiglu_cpu(g: Tensor<Cpu, 3>, u: Tensor<Cpu, 3>) -> Tensor<Cpu, 3> {
    let shape = g.shape();
    let g = values(g.into_primitive().tensor());
    let u = values(u.into_primitive().tensor());
    Tensor::from_primitive(TensorPrimitive::Float(primitive(forward(&g, &u), shape)))
}

/// The backward pass of `silu(g) * u`.
#[derive(Debug)]
struct SwigluBackward;

/// What the backward pass needs: the forward's inputs (as read then) and their shape.
#[derive(Debug, Clone)]
struct SwigluState {
    g: Arc<Vec<f32>>,
    u: Arc<Vec<f32>>,
    shape: Shape,
}

impl Backward<Cpu, 2> for SwigluBackward {
    type State = SwigluState;

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let grad = values(grads.consume::<Cpu>(&ops.node));
        let SwigluState { g, u, shape } = ops.state;
        let (dg, du) = backward(&g, &u, &grad);
        let [g_node, u_node] = ops.parents;
        if let Some(node) = g_node {
            grads.register::<Cpu>(node.id, primitive(dg, shape.clone()));
        }
        if let Some(node) = u_node {
            grads.register::<Cpu>(node.id, primitive(du, shape));
        }
    }
}

/// The forward pass on the CPU autodiff backend, recording [`SwigluBackward`].
fn swiglu_autodiff(
    g: Tensor<Autodiff<Cpu>, 3>,
    u: Tensor<Autodiff<Cpu>, 3>,
) -> Tensor<Autodiff<Cpu>, 3> {
    let shape = g.shape();
    let (g, u) = (g.into_primitive().tensor(), u.into_primitive().tensor());
    let (g_values, u_values) = (values(g.primitive), values(u.primitive));
    let out = primitive(forward(&g_values, &u_values), shape.clone());
    let result = match SwigluBackward
        .prepare::<NoCheckpointing>([g.node, u.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(
            SwigluState {
                g: Arc::new(g_values),
                u: Arc::new(u_values),
                shape,
            },
            out,
        ),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    Tensor::from_primitive(TensorPrimitive::Float(result))
}

/// `silu(g) * u`, element by element, in parallel chunks.
fn forward(g: &[f32], u: &[f32]) -> Vec<f32> {
    let mut out = vec![0.0f32; g.len()];
    out.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)))
        .for_each(|(out, (g, u))| {
            for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
                *o = g * sigmoid(g) * u;
            }
        });
    out
}

/// The gradients of `silu(g) * u` with respect to `g` and `u`, given the output's gradient:
/// `du = d * silu(g)`, `dg = d * u * s * (1 + g * (1 - s))` with `s = sigmoid(g)`.
fn backward(g: &[f32], u: &[f32], d: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut dg = vec![0.0f32; g.len()];
    let mut du = vec![0.0f32; g.len()];
    dg.par_chunks_mut(CHUNK)
        .zip(du.par_chunks_mut(CHUNK))
        .zip(
            g.par_chunks(CHUNK)
                .zip(u.par_chunks(CHUNK))
                .zip(d.par_chunks(CHUNK)),
        )
        .for_each(|((dg, du), ((g, u), d))| {
            for ((((dg, du), &g), &u), &d) in dg.iter_mut().zip(du).zip(g).zip(u).zip(d) {
                let s = sigmoid(g);
                *du = d * g * s;
                *dg = d * u * s * (1.0 + g * (1.0 - s));
            }
        });
    (dg, du)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fused::tests_support::{close, sample};
    use crate::model::{TestAutodiff, TestBackend};
    use burn::tensor::TensorData;

    #[test]
    fn fused_forward_and_gradients_match_burns_composed_ops() {
        let device = Default::default();
        let shape = [2, 3, 40_000];
        let n = shape.iter().product();
        let (g0, u0, d0) = (sample(n, 1), sample(n, 7), sample(n, 13));
        let input = |v: &Vec<f32>| {
            Tensor::<TestAutodiff, 3>::from_data(TensorData::new(v.clone(), shape), &device)
                .require_grad()
        };
        let run = |fused: bool| {
            let (g, u) = (input(&g0), input(&u0));
            let out = if fused {
                swiglu(g.clone(), u.clone())
            } else {
                silu(g.clone()) * u.clone()
            };
            let d =
                Tensor::<TestAutodiff, 3>::from_data(TensorData::new(d0.clone(), shape), &device);
            let grads = (out.clone() * d).sum().backward();
            let read = |t: Tensor<TestBackend, 3>| t.into_data().to_vec::<f32>().unwrap();
            (
                read(out.inner()),
                read(g.grad(&grads).unwrap()),
                read(u.grad(&grads).unwrap()),
            )
        };
        let (fused, composed) = (run(true), run(false));
        close("output", &fused.0, &composed.0, 1e-5);
        close("grad g", &fused.1, &composed.1, 1e-5);
        close("grad u", &fused.2, &composed.2, 1e-5);
        // Without autodiff, the same forward.
        let plain = swiglu(
            Tensor::<TestBackend, 3>::from_data(TensorData::new(g0, shape), &device),
            Tensor::<TestBackend, 3>::from_data(TensorData::new(u0, shape), &device),
        );
        assert_eq!(plain.into_data().to_vec::<f32>().unwrap(), fused.0);
    }
}
