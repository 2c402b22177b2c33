//! [`FlatLayout`]: how a section's parameters and optimizer moments are laid out in the one flat
//! `f32` vector that miners upload and the butterfly merge cuts into partitions.
//!
//! # Format
//! Tensors are sorted by name (byte order). With `P` the total parameter count, the vector is
//! `[parameters | exp_avg | exp_avg_sq]`, each block holding the tensors in that order at the
//! same offsets: tensor `t` lives at `t.offset`, `P + t.offset` and `2P + t.offset`. Values are
//! little-endian `f32` on the wire, so partition `a..b` is the byte range `4a..4b`.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Why a flat vector or a layout was refused.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum LayoutError {
    /// Two tensors share a name.
    #[error("tensor `{0}` appears twice")]
    Duplicate(String),
    /// A parameter is missing from what was given.
    #[error("parameter `{0}` is missing")]
    Missing(String),
    /// A tensor has the wrong number of values.
    #[error("`{name}` has {got} values, expected {expected}")]
    Length {
        /// Tensor (or `flat vector`).
        name: String,
        /// Values expected.
        expected: usize,
        /// Values given.
        got: usize,
    },
    /// A layout does not match the expected one.
    #[error("layout mismatch: {0}")]
    Mismatch(String),
}

/// One tensor of a [`FlatLayout`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlatTensor {
    /// Global parameter name.
    pub name: String,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Offset of its first value inside each block.
    pub offset: u64,
}

impl FlatTensor {
    /// Number of values.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True for a tensor without values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The layout of a section's flat state vector (see the module's `# Format`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlatLayout {
    /// Tensors sorted by name, with their offsets.
    pub tensors: Vec<FlatTensor>,
    /// Total parameter count `P`.
    pub params_len: u64,
}

/// A flat vector split back into named tensors.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FlatParts {
    /// `(name, shape, values)` of every parameter, in layout order.
    pub params: Vec<(String, Vec<usize>, Vec<f32>)>,
    /// First moments, same order.
    pub exp_avg: Vec<Vec<f32>>,
    /// Second moments, same order.
    pub exp_avg_sq: Vec<Vec<f32>>,
}

impl FlatLayout {
    /// Builds the layout of `shapes` (any order; sorted by name here).
    ///
    /// # Errors
    /// [`LayoutError::Duplicate`] when a name repeats.
    pub fn new(
        shapes: impl IntoIterator<Item = (String, Vec<usize>)>,
    ) -> Result<Self, LayoutError> {
        let mut shapes: Vec<(String, Vec<usize>)> = shapes.into_iter().collect();
        shapes.sort_by(|a, b| a.0.cmp(&b.0));
        let mut tensors = Vec::with_capacity(shapes.len());
        let mut offset = 0u64;
        for (name, shape) in shapes {
            if tensors.last().is_some_and(|t: &FlatTensor| t.name == name) {
                return Err(LayoutError::Duplicate(name));
            }
            let t = FlatTensor {
                name,
                shape,
                offset,
            };
            offset += t.len() as u64;
            tensors.push(t);
        }
        Ok(Self {
            tensors,
            params_len: offset,
        })
    }

    /// Length of the whole flat vector: `3P`.
    pub fn total_len(&self) -> usize {
        usize::try_from(self.params_len.saturating_mul(3)).unwrap_or(usize::MAX)
    }

    /// Size of the whole flat vector on the wire.
    pub fn total_bytes(&self) -> u64 {
        self.params_len.saturating_mul(12)
    }

    /// Checks that `other` (a miner's manifest) is exactly this layout.
    ///
    /// # Errors
    /// [`LayoutError::Mismatch`] naming the first difference.
    pub fn expect_same(&self, other: &FlatLayout) -> Result<(), LayoutError> {
        if self.tensors.len() != other.tensors.len() {
            return Err(LayoutError::Mismatch(format!(
                "{} tensors, expected {}",
                other.tensors.len(),
                self.tensors.len()
            )));
        }
        for (want, got) in self.tensors.iter().zip(&other.tensors) {
            if want != got {
                return Err(LayoutError::Mismatch(format!(
                    "`{}` {:?} at {}, expected `{}` {:?} at {}",
                    got.name, got.shape, got.offset, want.name, want.shape, want.offset
                )));
            }
        }
        if self.params_len != other.params_len {
            return Err(LayoutError::Mismatch(format!(
                "{} parameters, expected {}",
                other.params_len, self.params_len
            )));
        }
        Ok(())
    }

    /// Assembles the flat vector. Every parameter must be in `params`; a parameter without
    /// moments (never updated) gets zeros, which is what AdamW starts from.
    ///
    /// # Errors
    /// [`LayoutError::Missing`] or [`LayoutError::Length`].
    pub fn flatten(
        &self,
        params: &HashMap<&str, &[f32]>,
        exp_avg: &HashMap<&str, &[f32]>,
        exp_avg_sq: &HashMap<&str, &[f32]>,
    ) -> Result<Vec<f32>, LayoutError> {
        let mut out = Vec::with_capacity(self.total_len());
        for (source, required) in [(params, true), (exp_avg, false), (exp_avg_sq, false)] {
            for t in &self.tensors {
                match source.get(t.name.as_str()) {
                    Some(values) if values.len() == t.len() => out.extend_from_slice(values),
                    Some(values) => {
                        return Err(LayoutError::Length {
                            name: t.name.clone(),
                            expected: t.len(),
                            got: values.len(),
                        });
                    }
                    None if required => return Err(LayoutError::Missing(t.name.clone())),
                    None => out.resize(out.len() + t.len(), 0.0),
                }
            }
        }
        Ok(out)
    }

    /// Splits a flat vector back into tensors.
    ///
    /// # Errors
    /// [`LayoutError::Length`] when `flat` is not `3P` long.
    pub fn split(&self, flat: &[f32]) -> Result<FlatParts, LayoutError> {
        if flat.len() != self.total_len() {
            return Err(LayoutError::Length {
                name: "flat vector".into(),
                expected: self.total_len(),
                got: flat.len(),
            });
        }
        let p = usize::try_from(self.params_len).unwrap_or(usize::MAX);
        let mut parts = FlatParts::default();
        for t in &self.tensors {
            let start = usize::try_from(t.offset).unwrap_or(usize::MAX);
            let range = |block: usize| &flat[block * p + start..block * p + start + t.len()];
            parts
                .params
                .push((t.name.clone(), t.shape.clone(), range(0).to_vec()));
            parts.exp_avg.push(range(1).to_vec());
            parts.exp_avg_sq.push(range(2).to_vec());
        }
        Ok(parts)
    }
}

/// Little-endian bytes of `values` (the wire form of a flat vector or a partition).
///
/// On a little-endian machine the bytes are the values' memory, copied whole (a loop of
/// 4-byte writes was visible in the merge round's profile); elsewhere each value is swapped.
pub fn f32_to_le_bytes(values: &[f32]) -> Vec<u8> {
    if cfg!(target_endian = "little") {
        return bytemuck::cast_slice::<f32, u8>(values).to_vec();
    }
    let mut out = vec![0u8; values.len() * 4];
    for (c, v) in out.chunks_exact_mut(4).zip(values) {
        c.copy_from_slice(&v.to_le_bytes());
    }
    out
}

/// Values from little-endian bytes; `None` when the length is not a multiple of 4. A copy
/// into an aligned buffer on a little-endian machine (the bytes may sit at any address).
pub fn f32_from_le_bytes(bytes: &[u8]) -> Option<Vec<f32>> {
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    if cfg!(target_endian = "little") {
        return Some(bytemuck::pod_collect_to_vec::<u8, f32>(bytes));
    }
    Some(
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> FlatLayout {
        FlatLayout::new([("b".to_string(), vec![2, 2]), ("a".to_string(), vec![3])]).unwrap()
    }

    #[test]
    fn tensors_are_sorted_and_offsets_tile_the_parameters() {
        let l = layout();
        assert_eq!(l.tensors[0].name, "a");
        assert_eq!(l.tensors[0].offset, 0);
        assert_eq!(l.tensors[1].offset, 3);
        assert_eq!(l.params_len, 7);
        assert_eq!(l.total_len(), 21);
        assert_eq!(l.total_bytes(), 84);
    }

    #[test]
    fn flatten_then_split_round_trips_and_fills_missing_moments_with_zeros() {
        let l = layout();
        let (a, b) = ([1.0f32, 2.0, 3.0], [4.0f32, 5.0, 6.0, 7.0]);
        let params = HashMap::from([("a", &a[..]), ("b", &b[..])]);
        let m = HashMap::from([("b", &b[..])]);
        let flat = l.flatten(&params, &m, &m).unwrap();
        assert_eq!(&flat[..7], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        assert_eq!(&flat[7..10], &[0.0, 0.0, 0.0]);
        let parts = l.split(&flat).unwrap();
        assert_eq!(parts.params[1].2, b.to_vec());
        assert_eq!(parts.exp_avg[0], vec![0.0; 3]);
        assert_eq!(parts.exp_avg_sq[1], b.to_vec());
    }

    #[test]
    fn bad_inputs_are_named() {
        let l = layout();
        let a = [1.0f32];
        let params = HashMap::from([("a", &a[..])]);
        let none = HashMap::new();
        assert!(matches!(
            l.flatten(&params, &none, &none),
            Err(LayoutError::Length { .. })
        ));
        let params = HashMap::from([("b", &a[..])]);
        assert!(l.flatten(&params, &none, &none).is_err());
        assert!(matches!(
            l.split(&[0.0; 5]),
            Err(LayoutError::Length { .. })
        ));
        assert!(FlatLayout::new([("x".to_string(), vec![1]), ("x".to_string(), vec![2])]).is_err());
        let mut other = l.clone();
        other.tensors[1].shape = vec![4];
        assert!(l.expect_same(&other).is_err());
        assert!(l.expect_same(&l.clone()).is_ok());
    }

    #[test]
    fn byte_conversion_round_trips() {
        let v = [1.5f32, -2.0, f32::MIN_POSITIVE];
        assert_eq!(f32_from_le_bytes(&f32_to_le_bytes(&v)).unwrap(), v.to_vec());
        assert!(f32_from_le_bytes(&[0, 1, 2]).is_none());
        // The wire form is each value's little-endian bytes, read back from any address.
        let values = [1.5f32, -0.0, f32::MIN_POSITIVE, 3e38];
        let want: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(f32_to_le_bytes(&values), want);
        let mut shifted = vec![7u8];
        shifted.extend_from_slice(&want);
        assert_eq!(f32_from_le_bytes(&shifted[1..]).unwrap(), values.to_vec());
    }
}
