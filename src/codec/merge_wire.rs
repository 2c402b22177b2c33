//! [`MergeWire`]: how a section's flat state (see [`super::flat`]) and the butterfly merge's
//! partitions are written on the wire: `f32`, `bf16`, `int8` in blocks with one scale each, or
//! `dct`, `sign`, `sign2`, `q4` and `q4v2`, compressed changes from the previous global state
//! ([`super::merge_delta`]).
//!
//! The run config picks one format for the whole run (`merge.wire`); every party knows the
//! layout, so the objects carry no header and an element range maps to a byte range that can
//! be read on its own (HTTP range reads of a partition).
//!
//! # Format
//! An object holds `n` consecutive elements of a flat vector, the first of which has the
//! global index `span.start`; `span.params_len` (`P`) tells which elements are second
//! moments (global index `>= 2P`). Little-endian throughout.
//!
//! ```text
//! f32   n x f32                                   element i at byte 4i
//! bf16  n x bf16 (round to nearest even)          element i at byte 2i
//! int8  ceil(n / 256) blocks; block k holds elements 256k..min(256k + 256, n):
//!         f32 scale, then one i8 per element      block k at byte 260k
//!
//! dct   chunks of C values, each in a fixed number of bytes; see [`super::merge_delta`]
//! sign, sign2, q4, q4v2
//!       likewise
//! ```
//!
//! int8 is symmetric: `scale = max|t| / 127` over the block (0 for an all-zero block), values
//! `q` in `[-127, 127]`, decoded as `q * scale`. Parameters and first moments are stored as
//! they are (`t = x`, `q = round(x / scale)`). Second moments are stored as their square root
//! rounded up (`t = sqrt(v)`, `q = ceil(t / scale)`, decoded `(q * scale)^2`), so a small `v`
//! never decodes to 0 and the Adam step `m / sqrt(v)` after a merge is never larger than the
//! one the miner held.
//!
//! # The base (dct, sign, sign2, q4, q4v2)
//! These store the parameters as a change from the previous global state `g`, which every
//! party holds (miners adopted it, the orchestrator and validators read the checkpoint), so
//! encoding and decoding take `g`'s values for the object's parameters as `base` (the other
//! formats ignore it; pass `&[]`). [`MergeWire::base_range`] says which values that is.
//!
//! # What decoding refuses
//! The bytes come from miners. [`MergeWire::decode`] refuses, naming the global index: a
//! payload of the wrong length, NaN or infinity (f32, bf16), a block scale that is NaN,
//! negative, infinite or so large that a value would decode to infinity, the int8 value -128,
//! a negative second moment (any format), and everything [`super::merge_delta`] refuses.
//! Every decoded value is therefore finite.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use half::bf16;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

use super::flat::{f32_from_le_bytes, f32_to_le_bytes};
use super::merge_delta::{DeltaError, DeltaSpec, ParamCode, Place};

/// Elements per int8 block (each block has one `f32` scale).
pub const INT8_BLOCK: usize = 256;

/// Bytes of one full int8 block: its scale and its values.
const INT8_BLOCK_BYTES: u64 = INT8_BLOCK as u64 + 4;

/// Where an object's elements sit in the section's flat vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    /// Global flat index of the object's first element.
    pub start: u64,
    /// The section's parameter count `P` (elements from `2P` on are second moments).
    pub params_len: u64,
    /// A merged partition rather than an upload (`dct` keeps more coefficients in those).
    pub merged: bool,
}

impl Span {
    /// A whole flat state (an upload) of a section with `params_len` parameters.
    pub fn whole(params_len: u64) -> Self {
        Self {
            start: 0,
            params_len,
            merged: false,
        }
    }

    /// A merged partition whose first element has the flat index `start`.
    pub fn partition(start: u64, params_len: u64) -> Self {
        Self {
            start,
            params_len,
            merged: true,
        }
    }

    /// The span of the sub-object that starts `offset` elements later.
    pub fn shifted(self, offset: u64) -> Self {
        Self {
            start: self.start.saturating_add(offset),
            ..self
        }
    }

    fn place(self) -> Place {
        Place {
            start: self.start,
            params_len: self.params_len,
            merged: self.merged,
        }
    }

    /// Whether the element with global index `global` is a second moment.
    fn is_second_moment(self, global: u64) -> bool {
        self.params_len > 0 && global >= self.params_len.saturating_mul(2)
    }

    /// The first value of `values` (the object's elements from `self.start` on) that is not
    /// finite, or is a negative second moment, as the refusal it earns; in index order.
    fn check(self, values: &[f32]) -> Result<(), MergeWireError> {
        // A branch-free pass the compiler vectorises; the element-wise walk below only runs
        // to name the first bad value.
        // Local index of the first second moment (none without a parameter count).
        let second_from = if self.params_len > 0 {
            self.params_len.saturating_mul(2).saturating_sub(self.start)
        } else {
            values.len() as u64
        };
        let split = usize::try_from(second_from).map_or(values.len(), |s| s.min(values.len()));
        let finite = values.iter().fold(true, |ok, v| ok & v.is_finite());
        let non_negative = values[split..].iter().fold(true, |ok, v| ok & (*v >= 0.0));
        if finite && non_negative {
            return Ok(());
        }
        for (i, &value) in values.iter().enumerate() {
            let index = self.start + i as u64;
            if !value.is_finite() {
                return Err(MergeWireError::NonFinite { index, value });
            }
            if value < 0.0 && self.is_second_moment(index) {
                return Err(MergeWireError::NegativeSecondMoment { index, value });
            }
        }
        Ok(())
    }
}

/// The element format of merge uploads and partitions (run config `merge.wire`).
///
/// Serialises (serde, [`Display`](fmt::Display), [`FromStr`]) as `f32`, `bf16`, `int8`,
/// `dct`, `dct:CHUNK:KEEP[:MERGED_KEEP]`, `sign` or `sign:CHUNK:KEEP[:MERGED_KEEP]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MergeWire {
    /// Little-endian `f32`: lossless, the default.
    #[default]
    F32,
    /// bfloat16: half the bytes, 8 bits of mantissa.
    Bf16,
    /// int8 with one `f32` scale per [`INT8_BLOCK`] elements: about a quarter of the bytes.
    Int8,
    /// A compressed change from the previous global state, `dct` or `sign`
    /// ([`super::merge_delta`]).
    Delta(DeltaSpec),
}

/// Why merge bytes could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum MergeWireError {
    /// The payload's length is not the one the format gives for its element count.
    #[error("{format} payload of {got} bytes, expected {expected} for {elements} values")]
    Length {
        /// The format.
        format: MergeWire,
        /// Values expected.
        elements: u64,
        /// Bytes expected.
        expected: u64,
        /// Bytes present.
        got: u64,
    },
    /// NaN or infinity (in values to encode, or decoded from f32/bf16).
    #[error("non-finite value {value} at flat index {index}")]
    NonFinite {
        /// Global flat index.
        index: u64,
        /// The value.
        value: f32,
    },
    /// A finite value the format cannot hold (beyond bf16's range, or a block too large for
    /// int8's scale).
    #[error("value {value} at flat index {index} is out of range for {format}")]
    OutOfRange {
        /// The format.
        format: MergeWire,
        /// Global flat index.
        index: u64,
        /// The value.
        value: f32,
    },
    /// A second moment below zero.
    #[error("negative second moment {value} at flat index {index}")]
    NegativeSecondMoment {
        /// Global flat index.
        index: u64,
        /// The value.
        value: f32,
    },
    /// An int8 block scale that is NaN, negative, or too large to decode finite values.
    #[error("invalid int8 block scale {value} for the block starting at flat index {index}")]
    BadScale {
        /// Global flat index of the block's first element.
        index: u64,
        /// The scale found.
        value: f32,
    },
    /// An int8 value of -128 (the symmetric format never writes it).
    #[error("invalid int8 value -128 at flat index {index}")]
    QuantizedOutOfRange {
        /// Global flat index.
        index: u64,
    },
    /// A `dct` or `sign` object or base that is not what the format allows.
    #[error(transparent)]
    Delta(#[from] DeltaError),
    /// A range that does not lie inside the object.
    #[error("range {start}..{end} is not inside an object of {len} values")]
    BadRange {
        /// Range start.
        start: u64,
        /// Range end.
        end: u64,
        /// Object length.
        len: u64,
    },
}

impl MergeWireError {
    /// The global flat index the error is about, if it is about one value or block.
    pub fn index(&self) -> Option<u64> {
        match self {
            Self::NonFinite { index, .. }
            | Self::OutOfRange { index, .. }
            | Self::NegativeSecondMoment { index, .. }
            | Self::BadScale { index, .. }
            | Self::QuantizedOutOfRange { index } => Some(*index),
            Self::Delta(e) => e.index(),
            Self::Length { .. } | Self::BadRange { .. } => None,
        }
    }
}

impl MergeWire {
    /// Every format, lossless first (`dct` and `sign` with their default parameters).
    pub const ALL: [MergeWire; 8] = [
        MergeWire::F32,
        MergeWire::Bf16,
        MergeWire::Int8,
        MergeWire::Delta(DeltaSpec::DEFAULT),
        MergeWire::Delta(DeltaSpec::SIGN),
        MergeWire::Delta(DeltaSpec::SIGN2),
        MergeWire::Delta(DeltaSpec::Q4),
        MergeWire::Delta(DeltaSpec::Q4V2),
    ];

    /// The lowercase name of the format's family (`dct` for every `dct` spec, `sign` for every
    /// `sign` spec); [`Display`](fmt::Display) gives the full spec.
    pub fn name(self) -> &'static str {
        match self {
            MergeWire::F32 => "f32",
            MergeWire::Bf16 => "bf16",
            MergeWire::Int8 => "int8",
            MergeWire::Delta(spec) => spec.name(),
        }
    }

    /// Whether encoding and decoding need the previous global values (`dct`, `sign`).
    pub fn needs_base(self) -> bool {
        matches!(self, MergeWire::Delta(_))
    }

    /// Whether validators check uploads in this format: every parameter's change arrives
    /// (f32, bf16, int8, or the 4-bit delta code of `q4` and `q4v2`), so an honest upload's
    /// change agrees with a replay of its work within the state thresholds. The sparse (`dct`)
    /// and 1-2 bit (`sign`, `sign2`) codes drop too much of it: a sign code's change has a
    /// cosine of about 0.8 with the true one (computed for normally distributed changes),
    /// below the check's 0.9.
    pub fn checked_by_validators(self) -> bool {
        match self {
            MergeWire::Delta(spec) => spec.params == ParamCode::Q4,
            _ => true,
        }
    }

    /// The flat indices (a prefix of the object's `n` elements at `span`, as global indices)
    /// whose previous global values are the object's base: its parameters for the formats with
    /// one, none otherwise.
    pub fn base_range(self, n: u64, span: Span) -> Range<u64> {
        match self {
            MergeWire::Delta(_) => span.start..span.start + DeltaSpec::params_in(n, span.place()),
            _ => span.start..span.start,
        }
    }

    /// The base of the object of `n` elements at `span` out of `global`, the previous global
    /// values from flat index 0 (its parameters at least; `&[]` for a format without a base).
    ///
    /// # Errors
    /// [`MergeWireError::Delta`] when `global` is too short.
    pub fn base_of(self, global: &[f32], n: u64, span: Span) -> Result<&[f32], MergeWireError> {
        let r = self.base_range(n, span);
        if r.is_empty() {
            return Ok(&[]);
        }
        let (a, b) = (
            usize::try_from(r.start).unwrap_or(usize::MAX),
            usize::try_from(r.end).unwrap_or(usize::MAX),
        );
        global
            .get(a..b)
            .ok_or(MergeWireError::Delta(DeltaError::BaseLength {
                expected: r.end,
                got: global.len() as u64,
            }))
    }

    /// Bytes of an object of `n` elements at `span`.
    pub fn encoded_len(self, n: u64, span: Span) -> u64 {
        match self {
            MergeWire::F32 => n.saturating_mul(4),
            MergeWire::Bf16 => n.saturating_mul(2),
            MergeWire::Int8 => n.saturating_add(n.div_ceil(INT8_BLOCK as u64).saturating_mul(4)),
            MergeWire::Delta(spec) => spec.encoded_len(n, span.place()),
        }
    }

    /// Elements a range read must start at and cover so it can be decoded on its own: `elems`
    /// itself for f32/bf16, widened to whole int8 blocks or dct/sign chunks (clipped at the
    /// object's `len`). `span` is the whole object's.
    pub fn aligned(self, elems: Range<u64>, len: u64, span: Span) -> Range<u64> {
        match self {
            MergeWire::F32 | MergeWire::Bf16 => elems,
            MergeWire::Int8 => {
                let b = INT8_BLOCK as u64;
                let start = elems.start / b * b;
                let end = elems.end.div_ceil(b).saturating_mul(b).min(len);
                start..end.max(start)
            }
            MergeWire::Delta(spec) => spec.aligned(elems, len, span.place()),
        }
    }

    /// The bytes of an object of `len` elements at `span` that hold
    /// [`aligned`](Self::aligned)`(elems)`.
    pub fn byte_range(self, elems: Range<u64>, len: u64, span: Span) -> Range<u64> {
        let a = self.aligned(elems.clone(), len, span);
        match self {
            MergeWire::F32 | MergeWire::Bf16 => {
                let w = self.encoded_len(1, span);
                a.start.saturating_mul(w)..a.end.saturating_mul(w)
            }
            MergeWire::Int8 => {
                let first = a.start / INT8_BLOCK as u64 * INT8_BLOCK_BYTES;
                first..first.saturating_add(self.encoded_len(a.end - a.start, span))
            }
            MergeWire::Delta(spec) => spec.byte_range(elems, len, span.place()),
        }
    }

    /// Encodes `values`, whose first element sits at `span.start`; `base` holds the previous
    /// global values of [`base_range`](Self::base_range) (`&[]` for the formats without one).
    ///
    /// # Errors
    /// [`MergeWireError::NonFinite`], [`MergeWireError::NegativeSecondMoment`],
    /// [`MergeWireError::OutOfRange`]: an honest state never has them; [`MergeWireError::Delta`]
    /// for a base that does not fit.
    pub fn encode(
        self,
        values: &[f32],
        span: Span,
        base: &[f32],
    ) -> Result<Vec<u8>, MergeWireError> {
        span.check(values)?;
        let capacity = self.encoded_len(values.len() as u64, span) as usize;
        let out = match self {
            MergeWire::F32 => f32_to_le_bytes(values),
            MergeWire::Bf16 => {
                let mut out = Vec::with_capacity(capacity);
                for (i, &value) in values.iter().enumerate() {
                    let b = bf16::from_f32(value);
                    if !b.is_finite() {
                        let index = span.start + i as u64;
                        return Err(MergeWireError::OutOfRange {
                            format: self,
                            index,
                            value,
                        });
                    }
                    out.extend_from_slice(&b.to_bits().to_le_bytes());
                }
                out
            }
            MergeWire::Int8 => {
                let mut out = Vec::with_capacity(capacity);
                for (k, block) in values.chunks(INT8_BLOCK).enumerate() {
                    let first = span.start + (k * INT8_BLOCK) as u64;
                    encode_int8_block(block, first, span, &mut out)?;
                }
                out
            }
            MergeWire::Delta(spec) => spec.encode(values, span.place(), base)?,
        };
        Ok(out)
    }

    /// Decodes a whole object of `n` elements whose first element sits at `span.start`;
    /// `base` as for [`encode`](Self::encode).
    ///
    /// # Errors
    /// Every refusal listed in the module's `# What decoding refuses`.
    pub fn decode(
        self,
        bytes: &[u8],
        n: u64,
        span: Span,
        base: &[f32],
    ) -> Result<Vec<f32>, MergeWireError> {
        if let MergeWire::Delta(spec) = self {
            // The delta decoder checks its own length; its values are finite and its second
            // moments non-negative by construction.
            return Ok(spec.decode(bytes, n, span.place(), base)?);
        }
        let expected = self.encoded_len(n, span);
        let wrong_length = MergeWireError::Length {
            format: self,
            elements: n,
            expected,
            got: bytes.len() as u64,
        };
        if bytes.len() as u64 != expected {
            return Err(wrong_length);
        }
        let out = match self {
            MergeWire::F32 => f32_from_le_bytes(bytes).ok_or(wrong_length)?,
            MergeWire::Bf16 => bytes
                .chunks_exact(2)
                .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            MergeWire::Int8 => {
                let mut out = Vec::with_capacity(n as usize);
                for (k, block) in bytes.chunks(INT8_BLOCK_BYTES as usize).enumerate() {
                    let first = span.start + (k * INT8_BLOCK) as u64;
                    decode_int8_block(block, first, span, &mut out)?;
                }
                out
            }
            MergeWire::Delta(_) => Vec::new(),
        };
        span.check(&out)?;
        Ok(out)
    }

    /// Decodes elements `elems` of an object of `len` elements (object-local indices), from
    /// `bytes` = that object's [`byte_range`](Self::byte_range)`(elems, len, span)`. `span` is
    /// the whole object's; `base` holds the previous global values of
    /// [`base_range`](Self::base_range)`(elems.end - elems.start, span.shifted(elems.start))`.
    ///
    /// # Errors
    /// [`MergeWireError::BadRange`] for a range outside the object, and every refusal of
    /// [`decode`](Self::decode).
    pub fn decode_range(
        self,
        bytes: &[u8],
        elems: Range<u64>,
        len: u64,
        span: Span,
        base: &[f32],
    ) -> Result<Vec<f32>, MergeWireError> {
        if elems.start > elems.end || elems.end > len {
            return Err(MergeWireError::BadRange {
                start: elems.start,
                end: elems.end,
                len,
            });
        }
        let a = self.aligned(elems.clone(), len, span);
        let skip = (elems.start - a.start) as usize;
        let sub = span.shifted(a.start);
        // The aligned read starts up to a chunk earlier and ends up to a chunk later than
        // `elems`: its base is `base` with placeholders (zeros) for the values cut off again.
        let wanted = self.base_range(elems.end - elems.start, span.shifted(elems.start));
        let whole = self.base_range(a.end - a.start, sub);
        let widened;
        let base = if !self.needs_base() || whole.end - whole.start == wanted.end - wanted.start {
            base
        } else {
            if base.len() as u64 != wanted.end - wanted.start {
                return Err(MergeWireError::Delta(DeltaError::BaseLength {
                    expected: wanted.end - wanted.start,
                    got: base.len() as u64,
                }));
            }
            let mut b = vec![0f32; (whole.end - whole.start) as usize];
            let at = (wanted.start - whole.start) as usize;
            b[at..at + base.len()].copy_from_slice(base);
            widened = b;
            &widened
        };
        let mut values = self.decode(bytes, a.end - a.start, sub, base)?;
        values.truncate(skip + (elems.end - elems.start) as usize);
        values.drain(..skip);
        Ok(values)
    }

    /// Bytes of merged partitions that end at `bounds` (flat indices, increasing), written
    /// back to back; `None` when `bounds` does not increase.
    pub fn partitions_len(self, bounds: &[u64], params_len: u64) -> Option<u64> {
        let mut start = 0u64;
        let mut total = 0u64;
        for &end in bounds {
            if end <= start {
                return None;
            }
            total = total
                .saturating_add(self.encoded_len(end - start, Span::partition(start, params_len)));
            start = end;
        }
        Some(total)
    }

    /// Decodes merged partitions that end at `bounds`, written back to back (a checkpoint's
    /// delta object), against `global` (the previous global values from flat index 0), into
    /// the whole flat vector.
    ///
    /// # Errors
    /// [`MergeWireError::BadRange`] for bounds that do not increase, [`MergeWireError::Length`]
    /// when `bytes` is not exactly their size, and every refusal of [`decode`](Self::decode).
    pub fn decode_partitions(
        self,
        bytes: &[u8],
        bounds: &[u64],
        params_len: u64,
        global: &[f32],
    ) -> Result<Vec<f32>, MergeWireError> {
        let total = self
            .partitions_len(bounds, params_len)
            .ok_or(MergeWireError::BadRange {
                start: 0,
                end: 0,
                len: bounds.last().copied().unwrap_or(0),
            })?;
        if bytes.len() as u64 != total {
            return Err(MergeWireError::Length {
                format: self,
                elements: bounds.last().copied().unwrap_or(0),
                expected: total,
                got: bytes.len() as u64,
            });
        }
        let mut out = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
        let (mut start, mut at) = (0u64, 0usize);
        for &end in bounds {
            let span = Span::partition(start, params_len);
            let n = end - start;
            let size = self.encoded_len(n, span) as usize;
            let base = self.base_of(global, n, span)?;
            out.extend(self.decode(&bytes[at..at + size], n, span, base)?);
            (start, at) = (end, at + size);
        }
        Ok(out)
    }

    /// `values` as the parties read them after a trip through this format (what a merger's
    /// honest copy holds, to compare a recomputation with); `base` as for
    /// [`encode`](Self::encode).
    ///
    /// # Errors
    /// As [`encode`](Self::encode).
    pub fn round_trip(
        self,
        values: &[f32],
        span: Span,
        base: &[f32],
    ) -> Result<Vec<f32>, MergeWireError> {
        if self == MergeWire::F32 {
            return Ok(values.to_vec());
        }
        let bytes = self.encode(values, span, base)?;
        self.decode(&bytes, values.len() as u64, span, base)
    }
}

/// Error feedback of a format with a base ([`MergeWire::needs_base`]): the parameters' change
/// that one party's uploads have left out so far. [`add_to`](Self::add_to) puts it into the
/// next upload before encoding, [`keep`](Self::keep) keeps what that upload left out in turn.
/// The formats without a base lose nothing worth carrying, so for them both do nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ErrorFeedback {
    residual: Vec<f32>,
}

impl ErrorFeedback {
    /// Adds what earlier uploads in `wire` left out to the `params_len` parameters that start
    /// `flat` (nothing when none was kept for a state of that size).
    pub fn add_to(&self, wire: MergeWire, flat: &mut [f32], params_len: usize) {
        if wire.needs_base() && self.residual.len() == params_len && params_len <= flat.len() {
            for (x, e) in flat[..params_len].iter_mut().zip(&self.residual) {
                *x += e;
            }
        }
    }

    /// Keeps what the upload of `flat` left out of its `params_len` parameters: `sent` is what
    /// the others decode from it.
    pub fn keep(&mut self, wire: MergeWire, flat: &[f32], sent: &[f32], params_len: usize) {
        if wire.needs_base() {
            self.residual = flat[..params_len]
                .iter()
                .zip(sent)
                .map(|(x, s)| x - s)
                .collect();
        }
    }
}

/// The largest scale whose values (and, for a block with second moments, their squares)
/// decode finite.
fn scale_is_valid(scale: f32, squared: bool) -> bool {
    let top = scale * 127.0;
    scale >= 0.0 && top.is_finite() && (!squared || (top * top).is_finite())
}

fn encode_int8_block(
    block: &[f32],
    first: u64,
    span: Span,
    out: &mut Vec<u8>,
) -> Result<(), MergeWireError> {
    let stored = |i: usize, v: f32| {
        if span.is_second_moment(first + i as u64) {
            v.sqrt()
        } else {
            v
        }
    };
    let squared = span.is_second_moment(first + block.len() as u64 - 1);
    let top = block
        .iter()
        .enumerate()
        .fold(0f32, |m, (i, &v)| m.max(stored(i, v).abs()));
    let scale = top / 127.0;
    if !scale_is_valid(scale, squared) {
        let (i, &value) = block
            .iter()
            .enumerate()
            .max_by(|a, b| stored(a.0, *a.1).abs().total_cmp(&stored(b.0, *b.1).abs()))
            .unwrap_or((0, &0.0));
        return Err(MergeWireError::OutOfRange {
            format: MergeWire::Int8,
            index: first + i as u64,
            value,
        });
    }
    out.extend_from_slice(&scale.to_le_bytes());
    for (i, &v) in block.iter().enumerate() {
        let q = if scale == 0.0 {
            0.0
        } else if span.is_second_moment(first + i as u64) {
            (v.sqrt() / scale).ceil()
        } else {
            (v / scale).round()
        };
        out.push(q.clamp(-127.0, 127.0) as i8 as u8);
    }
    Ok(())
}

fn decode_int8_block(
    block: &[u8],
    first: u64,
    span: Span,
    out: &mut Vec<f32>,
) -> Result<(), MergeWireError> {
    // `decode` checked the total length, so every block has its scale and at least one value.
    let (head, values) = block.split_at(4);
    let scale = f32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let squared = span.is_second_moment(first + values.len() as u64 - 1);
    if !scale_is_valid(scale, squared) {
        return Err(MergeWireError::BadScale {
            index: first,
            value: scale,
        });
    }
    for (i, &byte) in values.iter().enumerate() {
        let index = first + i as u64;
        let q = byte as i8;
        if q == i8::MIN {
            return Err(MergeWireError::QuantizedOutOfRange { index });
        }
        let t = f32::from(q) * scale;
        if span.is_second_moment(index) {
            if q < 0 {
                return Err(MergeWireError::NegativeSecondMoment { index, value: t });
            }
            out.push(t * t);
        } else {
            out.push(t);
        }
    }
    Ok(())
}

impl fmt::Display for MergeWire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MergeWire::Delta(spec) => spec.fmt(f),
            other => f.write_str(other.name()),
        }
    }
}

impl FromStr for MergeWire {
    type Err = String;

    /// Parses `f32`, `bf16`, `int8`, `dct`, `sign`, or `dct`/`sign` with
    /// `:CHUNK:KEEP[:MERGED_KEEP]` (ASCII case ignored).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(spec) = DeltaSpec::parse(s) {
            return spec.map(MergeWire::Delta);
        }
        [MergeWire::F32, MergeWire::Bf16, MergeWire::Int8]
            .into_iter()
            .find(|w| w.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                format!(
                    "unknown merge wire format {s:?}: expected f32, bf16, int8, dct, sign, \
                     sign2, q4, or one of the last four with :CHUNK:KEEP[:MERGED_KEEP]"
                )
            })
    }
}

impl Serialize for MergeWire {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MergeWire {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The formats without a base.
    const DENSE: [MergeWire; 3] = [MergeWire::F32, MergeWire::Bf16, MergeWire::Int8];

    /// A flat state of `p` parameters: weights ~0.05, first moments ~1e-3, second moments
    /// spread over eight orders of magnitude (as Adam's are).
    fn state(p: usize, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut v = Vec::with_capacity(3 * p);
        v.extend((0..p).map(|_| rng.random_range(-0.1f32..0.1)));
        v.extend((0..p).map(|_| rng.random_range(-2e-3f32..2e-3)));
        v.extend((0..p).map(|_| 10f32.powf(rng.random_range(-12.0f32..-4.0))));
        v
    }

    #[test]
    fn lengths_and_byte_ranges_are_exact() {
        assert_eq!(MergeWire::F32.encoded_len(10, Span::default()), 40);
        assert_eq!(MergeWire::Bf16.encoded_len(10, Span::default()), 20);
        assert_eq!(MergeWire::Int8.encoded_len(10, Span::default()), 14);
        assert_eq!(MergeWire::Int8.encoded_len(512, Span::default()), 520);
        assert_eq!(MergeWire::Int8.encoded_len(513, Span::default()), 525);
        assert_eq!(MergeWire::F32.byte_range(3..7, 10, Span::default()), 12..28);
        assert_eq!(MergeWire::Bf16.byte_range(3..7, 10, Span::default()), 6..14);
        // Elements 300..600 of 700: blocks 1 and 2 (256..700 clipped), bytes 260..260+444+8.
        assert_eq!(
            MergeWire::Int8.aligned(300..600, 700, Span::default()),
            256..700
        );
        assert_eq!(
            MergeWire::Int8.byte_range(300..600, 700, Span::default()),
            260..712
        );
        assert_eq!(
            MergeWire::Int8.byte_range(0..256, 700, Span::default()),
            0..260
        );
    }

    #[test]
    fn round_trips_within_each_formats_bound() {
        let p = 1000;
        let flat = state(p, 1);
        let span = Span::whole(p as u64);
        for wire in DENSE {
            let bytes = wire.encode(&flat, span, &[]).unwrap();
            assert_eq!(
                bytes.len() as u64,
                wire.encoded_len(flat.len() as u64, span)
            );
            let back = wire.decode(&bytes, flat.len() as u64, span, &[]).unwrap();
            assert_eq!(back, wire.round_trip(&flat, span, &[]).unwrap());
            for (k, (block, got)) in flat
                .chunks(INT8_BLOCK)
                .zip(back.chunks(INT8_BLOCK))
                .enumerate()
            {
                let first = k * INT8_BLOCK;
                let top = block.iter().enumerate().fold(0f32, |m, (i, &x)| {
                    let t = if first + i >= 2 * p { x.sqrt() } else { x };
                    m.max(t.abs())
                });
                let scale = top / 127.0;
                for (i, (&x, &y)) in block.iter().zip(got).enumerate() {
                    let moment2 = first + i >= 2 * p;
                    match wire {
                        MergeWire::F32 => assert_eq!(x.to_bits(), y.to_bits()),
                        MergeWire::Bf16 => assert!((x - y).abs() <= x.abs() / 256.0, "{x} {y}"),
                        MergeWire::Int8 if moment2 => {
                            // Rounded up in the square root: never smaller, at most one step.
                            let (tx, ty) = (x.sqrt(), y.sqrt());
                            assert!(ty >= tx * (1.0 - 1e-6), "{x} decoded as {y}");
                            assert!(ty - tx <= scale * (1.0 + 1e-5), "{x} decoded as {y}");
                            assert!(y > 0.0, "a positive moment decoded as 0");
                        }
                        MergeWire::Int8 => {
                            assert!((x - y).abs() <= scale * 0.5 * (1.0 + 1e-5), "{x} {y}")
                        }
                        MergeWire::Delta(_) => unreachable!("not among the dense formats"),
                    }
                }
            }
        }
    }

    #[test]
    fn ranges_decode_like_the_whole_object() {
        let p = 700;
        let flat = state(p, 2);
        let n = flat.len() as u64;
        let span = Span::whole(p as u64);
        for wire in DENSE {
            let bytes = wire.encode(&flat, span, &[]).unwrap();
            let whole = wire.decode(&bytes, n, span, &[]).unwrap();
            for range in [0..1, 5..300, 256..512, 699..1401, 1300..2100, 2099..2100] {
                let br = wire.byte_range(range.clone(), n, span);
                let part = &bytes[br.start as usize..br.end as usize];
                let got = wire
                    .decode_range(part, range.clone(), n, span, &[])
                    .unwrap();
                let want = &whole[range.start as usize..range.end as usize];
                assert_eq!(got, want, "{wire} {range:?}");
            }
            assert!(matches!(
                wire.decode_range(&bytes, 5..2101, n, span, &[]),
                Err(MergeWireError::BadRange { .. })
            ));
        }
    }

    #[test]
    fn encoding_refuses_what_no_honest_state_holds() {
        let span = Span::whole(2);
        for wire in DENSE {
            let nan = wire.encode(&[0.0, f32::NAN, 0.0, 0.0, 0.0, 0.0], span, &[]);
            assert!(matches!(
                nan,
                Err(MergeWireError::NonFinite { index: 1, .. })
            ));
            let negative = wire.encode(&[0.0, 0.0, 0.0, 0.0, 1.0, -1.0], span, &[]);
            assert!(matches!(
                negative,
                Err(MergeWireError::NegativeSecondMoment { index: 5, .. })
            ));
        }
        assert!(matches!(
            MergeWire::Bf16.encode(&[f32::MAX], Span::default(), &[]),
            Err(MergeWireError::OutOfRange { index: 0, .. })
        ));
        // sqrt(3e38)^2 * (127/127)^2 fits, but 1e30 in a second-moment block is fine too; an
        // int8 block whose scale cannot decode finite is refused.
        assert!(matches!(
            MergeWire::Int8.encode(&[f32::MAX, 1.0], Span::default(), &[]),
            Err(MergeWireError::OutOfRange { index: 0, .. })
        ));
    }

    /// What a hostile uploader can write instead of an honest object: every one is refused
    /// with the index it is at, and nothing non-finite or negative-in-v comes out.
    #[test]
    fn hostile_payloads_are_refused() {
        let p = 300u64;
        let span = Span::whole(p);
        let flat = state(p as usize, 3);
        let n = flat.len() as u64;
        let int8 = MergeWire::Int8.encode(&flat, span, &[]).unwrap();
        let scale_at = |k: usize| k * INT8_BLOCK_BYTES as usize;
        for (scale, name) in [
            (f32::NAN, "NaN"),
            (f32::INFINITY, "inf"),
            (-1.0, "negative"),
            (f32::MAX / 100.0, "overflowing"),
        ] {
            let mut bad = int8.clone();
            bad[scale_at(1)..scale_at(1) + 4].copy_from_slice(&scale.to_le_bytes());
            assert!(
                matches!(
                    MergeWire::Int8.decode(&bad, n, span, &[]),
                    Err(MergeWireError::BadScale { index: 256, .. })
                ),
                "{name} scale"
            );
        }
        // A scale fine for a linear block, but whose squares overflow in a second-moment block.
        let mut bad = int8.clone();
        let k = 3; // elements 768..1024 are second moments (from 600 on)
        bad[scale_at(k)..scale_at(k) + 4].copy_from_slice(&1e18f32.to_le_bytes());
        assert!(matches!(
            MergeWire::Int8.decode(&bad, n, span, &[]),
            Err(MergeWireError::BadScale { index: 768, .. })
        ));
        let mut bad = int8.clone();
        bad[scale_at(0) + 4 + 7] = 0x80;
        assert_eq!(
            MergeWire::Int8.decode(&bad, n, span, &[]),
            Err(MergeWireError::QuantizedOutOfRange { index: 7 })
        );
        let mut bad = int8.clone();
        bad[scale_at(3) + 4 + 2] = (-5i8) as u8;
        assert!(matches!(
            MergeWire::Int8.decode(&bad, n, span, &[]),
            Err(MergeWireError::NegativeSecondMoment { index: 770, .. })
        ));

        let bf = MergeWire::Bf16.encode(&flat, span, &[]).unwrap();
        for (bits, index) in [(0x7FC0u16, 4u64), (0xFF80, 5), (0xBF80, 650)] {
            let mut bad = bf.clone();
            bad[2 * index as usize..2 * index as usize + 2].copy_from_slice(&bits.to_le_bytes());
            let err = MergeWire::Bf16.decode(&bad, n, span, &[]).unwrap_err();
            assert!(
                matches!(err, MergeWireError::NonFinite { index: i, .. } | MergeWireError::NegativeSecondMoment { index: i, .. } if i == index),
                "{err}"
            );
        }
        let f = MergeWire::F32.encode(&flat, span, &[]).unwrap();
        let mut bad = f.clone();
        bad[4 * 620..4 * 621].copy_from_slice(&(-1e-9f32).to_le_bytes());
        assert!(matches!(
            MergeWire::F32.decode(&bad, n, span, &[]),
            Err(MergeWireError::NegativeSecondMoment { index: 620, .. })
        ));
        for wire in DENSE {
            let bytes = wire.encode(&flat, span, &[]).unwrap();
            assert!(matches!(
                wire.decode(&bytes[..bytes.len() - 1], n, span, &[]),
                Err(MergeWireError::Length { .. })
            ));
        }
    }

    #[test]
    fn random_bytes_never_decode_to_non_finite_values() {
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        let span = Span::whole(200);
        for i in 0..3_000 {
            let wire = DENSE[i % 3];
            let n = rng.random_range(1..700u64);
            let len = wire.encoded_len(n, span) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            if let Ok(values) = wire.decode(&bytes, n, span.shifted(i as u64 % 500), &[]) {
                assert!(values.iter().all(|v| v.is_finite()));
            }
        }
    }

    #[test]
    fn names_parse_and_serialise() {
        for wire in MergeWire::ALL {
            assert_eq!(wire.to_string().parse::<MergeWire>(), Ok(wire));
            let json = serde_json::to_string(&wire).unwrap();
            assert_eq!(serde_json::from_str::<MergeWire>(&json).unwrap(), wire);
        }
        let custom: MergeWire = "dct:32:2:4".parse().unwrap();
        assert_eq!(serde_json::to_string(&custom).unwrap(), "\"dct:32:2:4\"");
        assert_eq!(custom.name(), "dct");
        assert_eq!(MergeWire::default(), MergeWire::F32);
        assert!("fp8".parse::<MergeWire>().is_err());
        assert!("dct:1000:4".parse::<MergeWire>().is_err());
        // `NAME:C` sets the chunk alone; a fifth field is refused.
        let chunked: MergeWire = serde_json::from_str("\"q4v2m2:128\"").unwrap();
        assert_eq!(chunked.to_string(), "q4v2m2:128:4:8");
        assert_eq!("dct:64".parse::<MergeWire>(), "dct".parse::<MergeWire>());
        assert!(serde_json::from_str::<MergeWire>("\"dct:64:4:8:1\"").is_err());
    }

    /// A dct or sign state read by ranges (as mergers read partitions) decodes to the same
    /// values as the whole object, with the base given for the range alone.
    #[test]
    fn dct_ranges_take_the_base_of_the_range_only() {
        for wire in ["dct:64:8", "sign:64:8"] {
            delta_ranges_take_the_base_of_the_range_only(wire.parse().unwrap());
        }
    }

    fn delta_ranges_take_the_base_of_the_range_only(wire: MergeWire) {
        let p = 700u64;
        let mut flat = state(p as usize, 5);
        let base: Vec<f32> = flat[..p as usize].iter().map(|v| v * 0.9).collect();
        // Second moments of the test state are tiny; the chunk tops carry them.
        flat[2 * p as usize] = 0.0;
        let span = Span::whole(p);
        let n = flat.len() as u64;
        let bytes = wire.encode(&flat, span, &base).unwrap();
        assert_eq!(bytes.len() as u64, wire.encoded_len(n, span));
        let whole = wire.decode(&bytes, n, span, &base).unwrap();
        assert!(whole.iter().all(|v| v.is_finite()));
        for range in [0..1, 5..300, 650..1450, 699..701, 1390..2100, 2099..2100] {
            let br = wire.byte_range(range.clone(), n, span);
            let part = &bytes[br.start as usize..br.end as usize];
            let b = wire
                .base_of(&base, range.end - range.start, span.shifted(range.start))
                .unwrap();
            let got = wire.decode_range(part, range.clone(), n, span, b).unwrap();
            assert_eq!(
                got,
                &whole[range.start as usize..range.end as usize],
                "{wire} {range:?}"
            );
        }
        // The base of a range is its parameters.
        assert_eq!(wire.base_range(100, span.shifted(650)), 650..700);
        assert_eq!(wire.base_range(100, span.shifted(800)), 800..800);
        assert_eq!(MergeWire::Int8.base_range(100, span), 0..0);
        // A merged partition keeps more and is sized so.
        let part = Span::partition(650, p);
        assert!(wire.encoded_len(800, part) > wire.encoded_len(800, span.shifted(650)));
        assert!(wire.needs_base() && !MergeWire::Int8.needs_base());
        // Partitions back to back rebuild the state partition by partition.
        let bounds = [650u64, 1400, 2100];
        let mut object = Vec::new();
        let mut want = Vec::new();
        let mut start = 0;
        for &end in &bounds {
            let part = Span::partition(start, p);
            let values = &whole[start as usize..end as usize];
            let g = wire.base_of(&base, end - start, part).unwrap();
            object.extend(wire.encode(values, part, g).unwrap());
            want.extend(wire.round_trip(values, part, g).unwrap());
            start = end;
        }
        assert_eq!(wire.partitions_len(&bounds, p), Some(object.len() as u64));
        assert_eq!(
            wire.decode_partitions(&object, &bounds, p, &base).unwrap(),
            want
        );
        assert!(matches!(
            wire.decode_partitions(&object[1..], &bounds, p, &base),
            Err(MergeWireError::Length { .. })
        ));
        assert!(matches!(
            wire.decode_partitions(&object, &[650, 650, 2100], p, &base),
            Err(MergeWireError::BadRange { .. })
        ));
        assert!(
            wire.decode_partitions(&object, &bounds, p, &base[..10])
                .is_err()
        );
    }
}
