//! Parameters by name: walking a section's burn module with the full path of every tensor,
//! mapping local paths to global Llama-style names, and exporting/importing flat tensors.
//!
//! Parameter names are part of the wire format: they appear in checkpoints, storage keys and
//! merge manifests. They follow the Llama convention common tooling reads
//! (`model.layers.{i}.self_attn.q_proj.weight`), with the bottleneck halves stored under the
//! block they belong to (`model.layers.{i}.bottleneck.encoder.weight`).

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::ModelError;
use super::config::SectionSpec;
use super::section_model::SectionModel;

/// A named tensor in host memory, row-major `f32`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamedTensor {
    /// Global parameter name.
    pub name: String,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Row-major values; `data.len()` is the product of `shape`.
    pub data: Vec<f32>,
}

/// Global name of the parameter at module path `local` inside section `spec`.
pub fn global_name(spec: &SectionSpec, local: &[String]) -> String {
    let first = spec.blocks.start;
    let last = spec.blocks.end.saturating_sub(1);
    let rest = |from: usize| local[from.min(local.len())..].join(".");
    match local.first().map(String::as_str) {
        Some("layers") => {
            let idx: usize = local.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
            format!("model.layers.{}.{}", first + idx, rest(2))
        }
        Some("embed_tokens") => format!("model.embed_tokens.{}", rest(1)),
        Some("norm") => format!("model.norm.{}", rest(1)),
        Some("lm_head") => format!("lm_head.{}", rest(1)),
        Some("bottleneck_in") => match local.get(1).map(String::as_str) {
            Some("bias") => format!("model.layers.{first}.bottleneck.decoder.bias"),
            _ => format!("model.layers.{first}.bottleneck.{}", rest(1)),
        },
        Some("bottleneck_out") => format!("model.layers.{last}.bottleneck.{}", rest(1)),
        Some("reembed") => format!("model.layers.{first}.reembed.{}", rest(1)),
        _ => local.join("."),
    }
}

/// Keeps the module path while a visitor or mapper walks a module.
#[derive(Default)]
struct PathStack(Vec<String>);

impl PathStack {
    fn enter(&mut self, name: &str) {
        self.0.push(name.to_string());
    }
    fn exit(&mut self) {
        self.0.pop();
    }
}

/// Calls `f(global_name, shape, flat_values)` for every float parameter of a section, in
/// module order.
pub fn for_each_param<B: Backend>(
    model: &SectionModel<B>,
    spec: &SectionSpec,
    mut f: impl FnMut(&str, &[usize], Tensor<B, 1>),
) {
    struct V<'a, B: Backend, F> {
        path: PathStack,
        spec: &'a SectionSpec,
        f: F,
        _b: std::marker::PhantomData<B>,
    }
    impl<B: Backend, F: FnMut(&str, &[usize], Tensor<B, 1>)> ModuleVisitor<B> for V<'_, B, F> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.enter(name);
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.exit();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let name = global_name(self.spec, &self.path.0);
            let value = param.val();
            let shape = value.dims().to_vec();
            (self.f)(&name, &shape, value.flatten(0, D - 1));
        }
    }
    let mut v = V {
        path: PathStack::default(),
        spec,
        f: &mut f,
        _b: std::marker::PhantomData,
    };
    model.visit(&mut v);
}

/// Names and shapes of every parameter of a section, in module order.
pub fn param_shapes<B: Backend>(
    model: &SectionModel<B>,
    spec: &SectionSpec,
) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::new();
    for_each_param(model, spec, |name, shape, _| {
        out.push((name.to_string(), shape.to_vec()))
    });
    out
}

/// Copies every parameter of a section to host memory.
pub fn export_params<B: Backend>(model: &SectionModel<B>, spec: &SectionSpec) -> Vec<NamedTensor> {
    let mut out = Vec::new();
    for_each_param(model, spec, |name, shape, flat| {
        out.push(NamedTensor {
            name: name.to_string(),
            shape: shape.to_vec(),
            data: super::host_values(flat).unwrap_or_default(),
        })
    });
    out
}

/// Rebuilds every parameter of a section from `new_value(global_name, current_flat)`, which
/// returns the new flat values (same length). Parameter ids and `require_grad` are kept.
pub fn map_params<B: Backend>(
    model: SectionModel<B>,
    spec: &SectionSpec,
    mut new_value: impl FnMut(&str, Tensor<B, 1>) -> Tensor<B, 1>,
) -> SectionModel<B> {
    struct M<'a, F> {
        path: PathStack,
        spec: &'a SectionSpec,
        f: F,
    }
    impl<B: Backend, F: FnMut(&str, Tensor<B, 1>) -> Tensor<B, 1>> ModuleMapper<B> for M<'_, F> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.enter(name);
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.exit();
        }
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let name = global_name(self.spec, &self.path.0);
            let (id, value, mapper) = param.consume();
            let require_grad = value.is_require_grad();
            let shape = value.shape();
            let flat: Tensor<B, 1> = value.detach().flatten(0, D - 1);
            let updated: Tensor<B, D> = (self.f)(&name, flat).reshape(shape);
            Param::from_mapped_value(id, updated.set_require_grad(require_grad), mapper)
        }
    }
    let mut m = M {
        path: PathStack::default(),
        spec,
        f: &mut new_value,
    };
    model.map(&mut m)
}

/// What to do when the weights and the model disagree on re-embedding (`name` is a
/// `reembed` table the weights have, `extra`, or lack): the presets re-embedded the token ids
/// until 2026-11-30, so weights trained then need `reembed: true` in the model config.
fn reembed_hint(name: &str, extra: bool) -> &'static str {
    match (name.ends_with(".reembed.weight"), extra) {
        (false, _) => "",
        (true, true) => {
            ": these weights re-embed the token ids after each boundary and this model does not \
             (no preset has since 2026-11-30); add `reembed: true` to the model config"
        }
        (true, false) => {
            ": this model re-embeds the token ids after each boundary (`reembed: true`) and \
             these weights do not; remove `reembed: true` from the model config"
        }
    }
}

/// Replaces every parameter of a section with the tensor of the same name in `tensors`.
///
/// # Errors
/// [`ModelError::Params`] naming the first missing, unexpected or wrongly shaped tensor, or
/// a tensor with non-finite values; the model is left untouched in that case.
pub fn import_params<B: Backend>(
    model: SectionModel<B>,
    spec: &SectionSpec,
    tensors: &[NamedTensor],
) -> Result<SectionModel<B>, ModelError> {
    let by_name: HashMap<&str, &NamedTensor> =
        tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let expected = param_shapes(&model, spec);
    for (name, shape) in &expected {
        let t = by_name.get(name.as_str()).ok_or_else(|| {
            ModelError::Params(format!(
                "missing tensor `{name}`{}",
                reembed_hint(name, false)
            ))
        })?;
        if &t.shape != shape || t.data.len() != shape.iter().product::<usize>() {
            return Err(ModelError::Params(format!(
                "tensor `{name}` has shape {:?} ({} values), expected {shape:?}",
                t.shape,
                t.data.len()
            )));
        }
        if let Some(i) = t.data.iter().position(|v| !v.is_finite()) {
            return Err(ModelError::Params(format!(
                "tensor `{name}` has a non-finite value at index {i}"
            )));
        }
    }
    if tensors.len() != expected.len() {
        let known: std::collections::HashSet<&str> =
            expected.iter().map(|(n, _)| n.as_str()).collect();
        if let Some(extra) = tensors.iter().find(|t| !known.contains(t.name.as_str())) {
            return Err(ModelError::Params(format!(
                "unexpected tensor `{}` for section {}{}",
                extra.name,
                spec.index,
                reembed_hint(&extra.name, true)
            )));
        }
    }
    Ok(map_params(model, spec, |name, current| {
        match by_name.get(name) {
            Some(t) => Tensor::from_data(
                TensorData::new(t.data.clone(), [t.data.len()]),
                &current.device(),
            ),
            None => current,
        }
    }))
}

/// The gradient of every parameter of a section after a backward pass, flattened, by global
/// name; parameters that received no gradient are left out.
pub fn collect_grads<B: AutodiffBackend>(
    model: &SectionModel<B>,
    spec: &SectionSpec,
    grads: &B::Gradients,
) -> Vec<(String, Tensor<B::InnerBackend, 1>)> {
    struct V<'a, B: AutodiffBackend> {
        path: PathStack,
        spec: &'a SectionSpec,
        grads: &'a B::Gradients,
        out: Vec<(String, Tensor<B::InnerBackend, 1>)>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for V<'_, B> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.enter(name);
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.exit();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = param.val().grad(self.grads) {
                let name = global_name(self.spec, &self.path.0);
                self.out.push((name, g.flatten(0, D - 1)));
            }
        }
    }
    let mut v = V::<B> {
        path: PathStack::default(),
        spec,
        grads,
        out: Vec::new(),
    };
    model.visit(&mut v);
    v.out
}
