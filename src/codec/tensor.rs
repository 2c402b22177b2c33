//! Wire codec for the boundary tensors (activations and gradients) that cross the network
//! between pipeline sections.
//!
//! A producer encodes a tensor once with [`encode`], reports the BLAKE3 [`payload_hash`](super::payload_hash) of
//! the bytes to the orchestrator, and uploads them; a consumer checks the hash with
//! [`verify_hash`](super::verify_hash) and decodes with [`decode_expecting`], which also checks the shape it was
//! told to expect. Decoding validates everything before it allocates and never panics, since
//! the bytes come from an untrusted peer.
//!
//! # Format
//!
//! All integers and floats are little-endian.
//!
//! ```text
//! offset  size     field
//! 0       4        magic  b"IOTW"
//! 4       1        format version (currently 1)
//! 5       1        dtype code: 0 = f32, 1 = bf16, 2 = int8
//! 6       2        rank R as u16 (at most MAX_RANK = 8)
//! 8       4 * R    dims, each a u32
//! 8 + 4R  ...      payload, N = product of dims elements in row-major order:
//!                    f32:  N x f32 (4 bytes each)
//!                    bf16: N x bf16 bit patterns (2 bytes each, round-to-nearest-even)
//!                    int8: BLOCKS x f32 scales, then N x i8 values
//! ```
//!
//! For int8 a row is the last dimension (`ROWS = product of dims[..R-1]`, 1 for a scalar) and
//! rows are grouped into blocks of `G = ceil(256 / row length)` whole rows (one row per block
//! once a row holds 256 values or more; `G = 1` for empty rows), so a scale is spread over at
//! least 256 values even where rows are narrow (a bottleneck 3 channels wide carries 1.02
//! bytes per value instead of 2.3 with a scale per row): `BLOCKS = ceil(ROWS / G)`. Each block
//! has its own symmetric scale `scale = max|x| / 127` (0 for an all-zero block). Values are
//! stored as `round(x / scale)` clamped to `[-127, 127]` and decoded as `q * scale`, so the
//! error per element is at most `scale / 2`. A scale must be non-negative with `127 * scale`
//! finite (so every value decodes finite), and `-128` never appears. (Version 1 of the format
//! had one scale per row.)
//!
//! The payload length is fully determined by the header: anything shorter is truncated and
//! anything longer is refused.

use std::fmt;
use std::str::FromStr;

use half::bf16;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The four magic bytes that open every encoded tensor.
pub const MAGIC: [u8; 4] = *b"IOTW";

/// The only format version this codec reads and writes (2: int8 scales per block of rows).
pub const FORMAT_VERSION: u8 = 2;

/// Least values an int8 scale covers (whole rows: see the module's `# Format`).
pub const INT8_BLOCK_VALUES: usize = 256;

/// Largest rank accepted, so that a hostile header cannot make the decoder walk a huge
/// dimension list. Boundary tensors are `[batch, seq, d_b]`, far below this.
pub const MAX_RANK: usize = 8;

/// Size of the fixed part of the header (magic, version, dtype, rank).
const FIXED_HEADER_LEN: usize = 8;

/// Element type of a tensor on the wire.
///
/// Serialises (serde, [`Display`](fmt::Display), [`FromStr`]) as `f32`, `bf16` or `int8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WireDtype {
    /// 32-bit IEEE floats, lossless.
    F32,
    /// bfloat16, half the bytes of f32 with f32's range; the default on the wire.
    #[default]
    Bf16,
    /// 8-bit integers with one f32 scale per block of rows holding at least 256 values; about
    /// a quarter of f32.
    Int8,
}

impl WireDtype {
    /// Every dtype, in code order (useful for tests and CLI help).
    pub const ALL: [WireDtype; 3] = [WireDtype::F32, WireDtype::Bf16, WireDtype::Int8];

    /// The byte that identifies this dtype in the header.
    pub fn code(self) -> u8 {
        match self {
            WireDtype::F32 => 0,
            WireDtype::Bf16 => 1,
            WireDtype::Int8 => 2,
        }
    }

    /// The dtype for a header byte, if the code is known.
    pub fn from_code(code: u8) -> Option<WireDtype> {
        match code {
            0 => Some(WireDtype::F32),
            1 => Some(WireDtype::Bf16),
            2 => Some(WireDtype::Int8),
            _ => None,
        }
    }

    /// The lowercase name used by serde, `Display` and `FromStr`.
    pub fn name(self) -> &'static str {
        match self {
            WireDtype::F32 => "f32",
            WireDtype::Bf16 => "bf16",
            WireDtype::Int8 => "int8",
        }
    }
}

impl fmt::Display for WireDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WireDtype {
    type Err = CodecError;

    /// Parses `f32`, `bf16` or `int8`, ignoring ASCII case and surrounding whitespace.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim();
        WireDtype::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(wanted))
            .ok_or_else(|| CodecError::UnknownDtypeName {
                name: s.to_string(),
            })
    }
}

/// A decoded tensor: its shape, the dtype it travelled as, and its values widened to f32.
#[derive(Debug, Clone, PartialEq)]
pub struct WireTensor {
    /// Dimensions, outermost first; the product is `data.len()`.
    pub shape: Vec<usize>,
    /// The dtype the payload was encoded with (tells the consumer how lossy it was).
    pub dtype: WireDtype,
    /// Values in row-major order.
    pub data: Vec<f32>,
}

/// Everything that can go wrong encoding or decoding a wire tensor.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum CodecError {
    /// The bytes do not start with [`MAGIC`]: not an iota tensor at all.
    #[error("bad magic bytes {got:02x?}: expected {MAGIC:02x?} (b\"IOTW\")")]
    BadMagic {
        /// The first bytes found (up to four).
        got: Vec<u8>,
    },
    /// Written by a newer (or corrupt) codec.
    #[error("unsupported wire format version {got}: this build reads version {FORMAT_VERSION}")]
    UnsupportedVersion {
        /// Version byte found in the header.
        got: u8,
    },
    /// The dtype byte names no known dtype.
    #[error("unknown dtype code {code}: expected 0 (f32), 1 (bf16) or 2 (int8)")]
    UnknownDtype {
        /// The dtype byte found in the header.
        code: u8,
    },
    /// A dtype name (config, CLI) that is not `f32`, `bf16` or `int8`.
    #[error("unknown wire dtype {name:?}: expected f32, bf16 or int8")]
    UnknownDtypeName {
        /// The name given.
        name: String,
    },
    /// The header stops before its declared end.
    #[error("truncated header: expected {expected} bytes, got {got}")]
    TruncatedHeader {
        /// Header length needed so far.
        expected: usize,
        /// Bytes available.
        got: usize,
    },
    /// The payload is shorter than the header says.
    #[error("truncated payload: expected {expected} bytes, got {got}")]
    TruncatedPayload {
        /// Payload length implied by the header.
        expected: usize,
        /// Payload bytes present.
        got: usize,
    },
    /// Extra bytes after the payload the header describes.
    #[error(
        "{extra} trailing bytes after the payload: expected {expected} bytes in total, got {got}"
    )]
    TrailingBytes {
        /// Total length implied by the header.
        expected: usize,
        /// Total length received.
        got: usize,
        /// `got - expected`.
        extra: usize,
    },
    /// More dimensions than [`MAX_RANK`].
    #[error("rank {rank} exceeds the maximum of {MAX_RANK}")]
    RankTooLarge {
        /// Rank requested or found.
        rank: usize,
    },
    /// A dimension does not fit the header's u32 field (encoding only).
    #[error(
        "dimension {axis} has size {size}, larger than the wire limit {}",
        u32::MAX
    )]
    DimTooLarge {
        /// Axis index.
        axis: usize,
        /// Its size.
        size: usize,
    },
    /// The shape's element or byte count overflows the address space.
    #[error("shape {shape:?} is too large: its byte size overflows")]
    SizeOverflow {
        /// The offending shape.
        shape: Vec<u64>,
    },
    /// The data slice does not hold exactly `product(shape)` values (encoding only).
    #[error("data length mismatch: shape implies {expected} values, got {got}")]
    LengthMismatch {
        /// `product(shape)`.
        expected: usize,
        /// `data.len()`.
        got: usize,
    },
    /// The decoded shape is not the one the consumer expected.
    #[error("shape mismatch: expected {expected:?}, got {got:?}")]
    ShapeMismatch {
        /// The shape the caller asked for.
        expected: Vec<usize>,
        /// The shape in the header.
        got: Vec<usize>,
    },
    /// NaN or infinity in the data to encode or in a decoded f32/bf16 payload.
    #[error("non-finite value {value} at element {index}")]
    NonFinite {
        /// Flat element index.
        index: usize,
        /// The value (NaN or +-inf).
        value: f32,
    },
    /// A finite f32 too large for bf16 (it would round to infinity).
    #[error("value {value} at element {index} overflows bf16 (max about 3.39e38)")]
    Bf16Overflow {
        /// Flat element index.
        index: usize,
        /// The value.
        value: f32,
    },
    /// An int8 block scale that is NaN, negative, or so large that `127 * scale` overflows.
    #[error("invalid int8 scale {value} for block {block}: must be >= 0 with 127 * scale finite")]
    BadScale {
        /// Block index (blocks of whole rows).
        block: usize,
        /// The scale found.
        value: f32,
    },
    /// An int8 value of -128, which the symmetric format never produces.
    #[error("invalid int8 value -128 at element {index}: quantized values lie in [-127, 127]")]
    QuantizedOutOfRange {
        /// Flat element index.
        index: usize,
    },
    /// The expected hash given to [`verify_hash`](super::verify_hash) is not 64 hex digits.
    #[error("malformed BLAKE3 hash {got:?}: expected 64 hex digits")]
    MalformedHash {
        /// The string given.
        got: String,
    },
    /// The payload's BLAKE3 hash differs from the one its producer reported.
    #[error("payload hash mismatch: expected {expected}, got {got}")]
    HashMismatch {
        /// Hash reported by the producer.
        expected: String,
        /// Hash of the bytes received.
        got: String,
    },
}

/// Byte sizes implied by a shape and dtype, computed with overflow checks.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// Number of elements, `product(shape)`.
    elements: usize,
    /// Number of int8 blocks, i.e. scales (0 for other dtypes).
    blocks: usize,
    /// Header bytes, including the dims.
    header: usize,
    /// Payload bytes.
    payload: usize,
}

impl Layout {
    /// Sizes for `shape` (as u64 so it works on header values before any conversion).
    /// `None` if any count overflows `usize`.
    fn new(shape: &[u64], dtype: WireDtype) -> Option<Layout> {
        let product = |dims: &[u64]| -> Option<usize> {
            dims.iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
        };
        let elements = product(shape)?;
        let header = shape.len().checked_mul(4)?.checked_add(FIXED_HEADER_LEN)?;
        let (blocks, payload) = match dtype {
            WireDtype::F32 => (0, elements.checked_mul(4)?),
            WireDtype::Bf16 => (0, elements.checked_mul(2)?),
            WireDtype::Int8 => {
                let (rows, row_len) = match shape.split_last() {
                    Some((&last, leading)) => (product(leading)?, usize::try_from(last).ok()?),
                    None => (1, 1),
                };
                let blocks = rows.div_ceil(Self::block_rows(row_len));
                (blocks, blocks.checked_mul(4)?.checked_add(elements)?)
            }
        };
        header.checked_add(payload)?;
        Some(Layout {
            elements,
            blocks,
            header,
            payload,
        })
    }

    /// Length of a row for int8 (the last dimension; 1 for a scalar).
    fn row_len(shape: &[usize]) -> usize {
        shape.last().copied().unwrap_or(1)
    }

    /// Rows per int8 block: the fewest whole rows holding [`INT8_BLOCK_VALUES`] values (1 for
    /// empty rows).
    fn block_rows(row_len: usize) -> usize {
        if row_len == 0 {
            1
        } else {
            INT8_BLOCK_VALUES.div_ceil(row_len)
        }
    }

    fn total(&self) -> usize {
        // Checked in `new`.
        self.header + self.payload
    }
}

fn shape_u64(shape: &[usize]) -> Vec<u64> {
    shape.iter().map(|&d| d as u64).collect()
}

/// Exact number of bytes [`encode`] produces for `shape` and `dtype` (header included), for
/// benchmarks and buffer sizing.
///
/// Saturates at `usize::MAX` for a shape whose size overflows; such a shape cannot be
/// encoded anyway.
pub fn encoded_len(shape: &[usize], dtype: WireDtype) -> usize {
    Layout::new(&shape_u64(shape), dtype).map_or(usize::MAX, |l| l.total())
}

/// Encodes a row-major tensor in the wire format (see the module's `# Format`).
///
/// # Errors
/// - [`CodecError::RankTooLarge`] / [`CodecError::DimTooLarge`] / [`CodecError::SizeOverflow`]
///   if the shape cannot be described by the header.
/// - [`CodecError::LengthMismatch`] if `data.len()` is not the product of `shape`.
/// - [`CodecError::NonFinite`] for NaN or infinity anywhere in `data`, and
///   [`CodecError::Bf16Overflow`] for a finite value beyond bf16's range.
pub fn encode(shape: &[usize], data: &[f32], dtype: WireDtype) -> Result<Vec<u8>, CodecError> {
    if shape.len() > MAX_RANK {
        return Err(CodecError::RankTooLarge { rank: shape.len() });
    }
    let mut dims = Vec::with_capacity(shape.len());
    for (axis, &size) in shape.iter().enumerate() {
        let dim = u32::try_from(size).map_err(|_| CodecError::DimTooLarge { axis, size })?;
        dims.push(dim);
    }
    let layout = Layout::new(&shape_u64(shape), dtype).ok_or_else(|| CodecError::SizeOverflow {
        shape: shape_u64(shape),
    })?;
    if data.len() != layout.elements {
        return Err(CodecError::LengthMismatch {
            expected: layout.elements,
            got: data.len(),
        });
    }
    if let Some((index, &value)) = data.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(CodecError::NonFinite { index, value });
    }

    let mut out = Vec::with_capacity(layout.total());
    out.extend_from_slice(&MAGIC);
    out.push(FORMAT_VERSION);
    out.push(dtype.code());
    // Rank <= MAX_RANK, checked above, so it fits a u16.
    out.extend_from_slice(&(shape.len() as u16).to_le_bytes());
    for dim in dims {
        out.extend_from_slice(&dim.to_le_bytes());
    }
    match dtype {
        WireDtype::F32 => {
            for v in data {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        WireDtype::Bf16 => {
            for (index, &value) in data.iter().enumerate() {
                let b = bf16::from_f32(value);
                if b.is_infinite() {
                    return Err(CodecError::Bf16Overflow { index, value });
                }
                out.extend_from_slice(&b.to_bits().to_le_bytes());
            }
        }
        WireDtype::Int8 => encode_int8(data, layout.blocks, Layout::row_len(shape), &mut out),
    }
    debug_assert_eq!(out.len(), layout.total());
    Ok(out)
}

/// The int8 scale for a block whose largest magnitude is `max_abs` (finite, >= 0):
/// `max_abs / 127`, nudged down by an ulp in the rare case (values near `f32::MAX`) where
/// `127 * scale` would round to infinity, so that every decoded value stays finite.
fn int8_scale(max_abs: f32) -> f32 {
    let mut scale = max_abs / 127.0;
    while scale > 0.0 && !(scale * 127.0).is_finite() {
        scale = f32::from_bits(scale.to_bits() - 1);
    }
    scale
}

/// Appends the int8 payload: all block scales, then all quantized values.
fn encode_int8(data: &[f32], blocks: usize, row_len: usize, out: &mut Vec<u8>) {
    if row_len == 0 {
        // Every row is empty: scale 0 each, no values.
        for _ in 0..blocks {
            out.extend_from_slice(&0f32.to_le_bytes());
        }
        return;
    }
    let block = Layout::block_rows(row_len) * row_len;
    let scales: Vec<f32> = data
        .chunks(block)
        .map(|b| int8_scale(b.iter().fold(0f32, |m, v| m.max(v.abs()))))
        .collect();
    for s in &scales {
        out.extend_from_slice(&s.to_le_bytes());
    }
    for (values, &scale) in data.chunks(block).zip(&scales) {
        for &x in values {
            let q = if scale > 0.0 {
                (x / scale).round().clamp(-127.0, 127.0) as i8
            } else {
                0
            };
            out.push(q as u8);
        }
    }
}

/// The parsed fixed header and dims, before any payload is read.
struct Header {
    dtype: WireDtype,
    shape: Vec<usize>,
    layout: Layout,
}

/// Parses and validates the header, including that the total length matches exactly.
fn parse_header(bytes: &[u8]) -> Result<Header, CodecError> {
    let Some(fixed) = bytes
        .get(..FIXED_HEADER_LEN)
        .and_then(|s| <[u8; FIXED_HEADER_LEN]>::try_from(s).ok())
    else {
        if !bytes.starts_with(&MAGIC[..bytes.len().min(4)]) {
            return Err(CodecError::BadMagic {
                got: bytes.iter().take(4).copied().collect(),
            });
        }
        return Err(CodecError::TruncatedHeader {
            expected: FIXED_HEADER_LEN,
            got: bytes.len(),
        });
    };
    let [m0, m1, m2, m3, version, code, r0, r1] = fixed;
    if [m0, m1, m2, m3] != MAGIC {
        return Err(CodecError::BadMagic {
            got: vec![m0, m1, m2, m3],
        });
    }
    if version != FORMAT_VERSION {
        return Err(CodecError::UnsupportedVersion { got: version });
    }
    let dtype = WireDtype::from_code(code).ok_or(CodecError::UnknownDtype { code })?;
    let rank = usize::from(u16::from_le_bytes([r0, r1]));
    if rank > MAX_RANK {
        return Err(CodecError::RankTooLarge { rank });
    }
    let header_len = FIXED_HEADER_LEN + 4 * rank;
    let dim_bytes = bytes
        .get(FIXED_HEADER_LEN..header_len)
        .ok_or(CodecError::TruncatedHeader {
            expected: header_len,
            got: bytes.len(),
        })?;
    let dims: Vec<u64> = dim_bytes
        .chunks_exact(4)
        .map(|c| u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        .collect();
    let layout = Layout::new(&dims, dtype).ok_or_else(|| CodecError::SizeOverflow {
        shape: dims.clone(),
    })?;
    // Every dim fits usize: `Layout::new` converted each one.
    let shape = dims.iter().map(|&d| d as usize).collect();
    Ok(Header {
        dtype,
        shape,
        layout,
    })
}

/// Checks the real byte length against the one the header implies, before allocating.
fn check_length(bytes: &[u8], layout: &Layout) -> Result<(), CodecError> {
    let total = layout.total();
    if bytes.len() < total {
        return Err(CodecError::TruncatedPayload {
            expected: layout.payload,
            got: bytes.len() - layout.header,
        });
    }
    if bytes.len() > total {
        return Err(CodecError::TrailingBytes {
            expected: total,
            got: bytes.len(),
            extra: bytes.len() - total,
        });
    }
    Ok(())
}

/// Decodes a wire tensor, validating the header, the exact length and every value.
///
/// # Errors
/// [`CodecError::BadMagic`], [`CodecError::UnsupportedVersion`], [`CodecError::UnknownDtype`],
/// [`CodecError::TruncatedHeader`], [`CodecError::RankTooLarge`], [`CodecError::SizeOverflow`],
/// [`CodecError::TruncatedPayload`], [`CodecError::TrailingBytes`], [`CodecError::NonFinite`]
/// (f32/bf16 payloads), [`CodecError::BadScale`] and [`CodecError::QuantizedOutOfRange`]
/// (int8 payloads). Never panics, whatever the input.
pub fn decode(bytes: &[u8]) -> Result<WireTensor, CodecError> {
    let header = parse_header(bytes)?;
    decode_payload(bytes, header)
}

/// Like [`decode`], but first checks that the header's shape is `shape`, so a consumer
/// learns of a mismatch before the payload is read.
///
/// # Errors
/// [`CodecError::ShapeMismatch`] if the shapes differ, otherwise as [`decode`].
pub fn decode_expecting(bytes: &[u8], shape: &[usize]) -> Result<WireTensor, CodecError> {
    let header = parse_header(bytes)?;
    if header.shape != shape {
        return Err(CodecError::ShapeMismatch {
            expected: shape.to_vec(),
            got: header.shape,
        });
    }
    decode_payload(bytes, header)
}

fn decode_payload(bytes: &[u8], header: Header) -> Result<WireTensor, CodecError> {
    let Header {
        dtype,
        shape,
        layout,
    } = header;
    check_length(bytes, &layout)?;
    let payload = bytes.get(layout.header..).unwrap_or_default();
    let data = match dtype {
        WireDtype::F32 => {
            decode_floats(payload, 4, |c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))?
        }
        WireDtype::Bf16 => decode_floats(payload, 2, |c| {
            bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()
        })?,
        WireDtype::Int8 => decode_int8(payload, &layout, Layout::row_len(&shape))?,
    };
    Ok(WireTensor { shape, dtype, data })
}

/// Decodes fixed-width floats; `width` is the chunk size `read` is given.
fn decode_floats(
    payload: &[u8],
    width: usize,
    read: impl Fn(&[u8]) -> f32,
) -> Result<Vec<f32>, CodecError> {
    let mut data = Vec::with_capacity(payload.len() / width);
    for (index, chunk) in payload.chunks_exact(width).enumerate() {
        let value = read(chunk);
        if !value.is_finite() {
            return Err(CodecError::NonFinite { index, value });
        }
        data.push(value);
    }
    Ok(data)
}

fn decode_int8(payload: &[u8], layout: &Layout, row_len: usize) -> Result<Vec<f32>, CodecError> {
    let (scale_bytes, values) = payload.split_at(layout.blocks * 4);
    let mut scales = Vec::with_capacity(layout.blocks);
    for (block, c) in scale_bytes.chunks_exact(4).enumerate() {
        let value = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        // `127 * scale` must be finite too, or the largest value would decode to infinity.
        if !(value * 127.0).is_finite() || value < 0.0 {
            return Err(CodecError::BadScale { block, value });
        }
        scales.push(value);
    }
    let mut data = Vec::with_capacity(layout.elements);
    if row_len == 0 {
        return Ok(data);
    }
    let block = Layout::block_rows(row_len) * row_len;
    for (b, (chunk, &scale)) in values.chunks(block).zip(&scales).enumerate() {
        for (i, &byte) in chunk.iter().enumerate() {
            let q = byte as i8;
            if q == i8::MIN {
                return Err(CodecError::QuantizedOutOfRange {
                    index: b * block + i,
                });
            }
            data.push(f32::from(q) * scale);
        }
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Deterministic test data with a wide spread of magnitudes and signs.
    fn sample_data(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let mag: f32 = rng.random_range(-8.0f32..8.0);
                let sign = if rng.random_bool(0.5) { -1.0 } else { 1.0 };
                sign * rng.random_range(1.0f32..2.0) * mag.exp2()
            })
            .collect()
    }

    fn header(dtype: u8, dims: &[u32]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.push(FORMAT_VERSION);
        out.push(dtype);
        out.extend_from_slice(&(dims.len() as u16).to_le_bytes());
        for d in dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out
    }

    #[test]
    fn f32_bytes_are_laid_out_as_documented() {
        let bytes = encode(&[2], &[1.0, -2.0], WireDtype::F32).unwrap();
        let expected: Vec<u8> = [
            &b"IOTW"[..],
            &[2, 0],                   // version, dtype f32
            &[1, 0],                   // rank 1
            &[2, 0, 0, 0],             // dim 2
            &[0x00, 0x00, 0x80, 0x3f], // 1.0
            &[0x00, 0x00, 0x00, 0xc0], // -2.0
        ]
        .concat();
        assert_eq!(bytes, expected);
        assert_eq!(encoded_len(&[2], WireDtype::F32), expected.len());
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 0x3F808000 lies exactly between bf16 0x3F80 and 0x3F81: ties go to the even 0x3F80.
        // 0x3F818000 lies between 0x3F81 and 0x3F82: ties go to the even 0x3F82.
        // 0x3F808001 is just above the midpoint: rounds up to 0x3F81.
        let data = [0x3F80_8000, 0x3F81_8000, 0x3F80_8001].map(f32::from_bits);
        let bytes = encode(&[3], &data, WireDtype::Bf16).unwrap();
        assert_eq!(&bytes[12..], &[0x80, 0x3F, 0x82, 0x3F, 0x81, 0x3F]);
        let back = decode(&bytes).unwrap();
        assert_eq!(
            back.data,
            [0x3F80_0000, 0x3F82_0000, 0x3F81_0000].map(f32::from_bits)
        );
    }

    #[test]
    fn int8_quantizes_per_block_of_rows_as_documented() {
        // Rows of 128: two rows per block. Block 0 (rows 0-1): max 1.0, scale 1/127:
        // 1.0 -> 127, -0.5 -> round(-63.5) = -64, 0.25 -> 32. Block 1 (row 2): all zero ->
        // scale 0, values 0.
        let mut data = vec![0f32; 3 * 128];
        (data[0], data[1], data[129]) = (1.0, -0.5, 0.25);
        let bytes = encode(&[3, 128], &data, WireDtype::Int8).unwrap();
        let h = 8 + 2 * 4;
        assert_eq!(bytes.len(), h + 2 * 4 + 3 * 128);
        assert_eq!(&bytes[h..h + 4], &(1.0f32 / 127.0).to_le_bytes());
        assert_eq!(&bytes[h + 4..h + 8], &0f32.to_le_bytes());
        let q = &bytes[h + 8..];
        assert_eq!((q[0], q[1], q[129]), (127, (-64i8) as u8, 32));
        assert_eq!(q.iter().filter(|b| **b != 0).count(), 3);
        let back = decode(&bytes).unwrap();
        let s = 1.0f32 / 127.0;
        assert_eq!(
            (back.data[0], back.data[1], back.data[129]),
            (127.0 * s, -64.0 * s, 32.0 * s)
        );
        // Narrow rows share a scale over 256 values or more: a bottleneck 3 wide, 1024 rows,
        // takes ceil(1024 / 86) = 12 scales (one per 86 rows), not 1024.
        assert_eq!(
            encoded_len(&[4, 256, 3], WireDtype::Int8),
            20 + 12 * 4 + 3072
        );
        // Wide rows keep a scale each.
        assert_eq!(encoded_len(&[2, 384], WireDtype::Int8), 16 + 2 * 4 + 768);
    }

    #[test]
    fn round_trips_within_tolerance_for_each_dtype() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let shapes: [&[usize]; 6] = [&[], &[5], &[3, 17], &[2, 4, 33], &[0], &[4, 0]];
        for shape in shapes {
            let n: usize = shape.iter().product();
            let data = sample_data(&mut rng, n);
            for dtype in WireDtype::ALL {
                let bytes = encode(shape, &data, dtype).unwrap();
                assert_eq!(bytes.len(), encoded_len(shape, dtype), "{shape:?} {dtype}");
                let back = decode_expecting(&bytes, shape).unwrap();
                assert_eq!(back.shape, shape);
                assert_eq!(back.dtype, dtype);
                assert_eq!(back.data.len(), n);
                let row_len = shape.last().copied().unwrap_or(1).max(1);
                let block = Layout::block_rows(row_len) * row_len;
                for (i, (&x, &y)) in data.iter().zip(&back.data).enumerate() {
                    match dtype {
                        WireDtype::F32 => assert_eq!(x.to_bits(), y.to_bits()),
                        WireDtype::Bf16 => {
                            assert!((x - y).abs() <= x.abs() * 2f32.powi(-8), "{x} vs {y}")
                        }
                        WireDtype::Int8 => {
                            let start = i / block * block;
                            let values = &data[start..(start + block).min(n)];
                            let scale = values.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                            // scale/2 plus a few ulps of float rounding in x/scale and q*scale.
                            let tol = scale * 0.5 * (1.0 + 1e-5);
                            assert!((x - y).abs() <= tol, "{x} vs {y}, scale {scale}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn int8_keeps_extreme_rows_finite() {
        // Rows of 256 values: a block each.
        let mut data = vec![0f32; 512];
        (data[0], data[1], data[256], data[257]) = (f32::MAX, -f32::MAX, 1.0, 3.0);
        let back = decode(&encode(&[2, 256], &data, WireDtype::Int8).unwrap()).unwrap();
        assert!(back.data.iter().all(|v| v.is_finite()));
        // The nudged scale costs at most a few ulps beyond scale / 2.
        let scale = f32::MAX / 127.0;
        assert!((back.data[0] - f32::MAX).abs() <= scale * 0.5);
        assert!((back.data[257] - 3.0).abs() <= 1.5 / 127.0);
    }

    #[test]
    fn encoded_len_is_exact() {
        // Header 8 + 4 * rank, then the payload.
        assert_eq!(encoded_len(&[], WireDtype::F32), 8 + 4);
        assert_eq!(encoded_len(&[2, 3], WireDtype::F32), 16 + 24);
        assert_eq!(encoded_len(&[2, 3], WireDtype::Bf16), 16 + 12);
        assert_eq!(encoded_len(&[2, 3], WireDtype::Int8), 16 + 4 + 6);
        assert_eq!(encoded_len(&[7], WireDtype::Int8), 12 + 4 + 7);
        assert_eq!(encoded_len(&[600], WireDtype::Int8), 12 + 4 + 600);
        assert_eq!(encoded_len(&[300, 2], WireDtype::Int8), 16 + 3 * 4 + 600);
        assert_eq!(encoded_len(&[usize::MAX, 2], WireDtype::F32), usize::MAX);
    }

    #[test]
    fn dtype_names_parse_print_and_serialise() {
        for dtype in WireDtype::ALL {
            assert_eq!(dtype.to_string().parse::<WireDtype>(), Ok(dtype));
            let json = serde_json::to_string(&dtype).unwrap();
            assert_eq!(json, format!("\"{dtype}\""));
            assert_eq!(serde_json::from_str::<WireDtype>(&json).unwrap(), dtype);
            assert_eq!(WireDtype::from_code(dtype.code()), Some(dtype));
        }
        assert_eq!(" BF16 ".parse::<WireDtype>(), Ok(WireDtype::Bf16));
        assert_eq!(WireDtype::default(), WireDtype::Bf16);
        assert!(matches!(
            "fp8".parse::<WireDtype>(),
            Err(CodecError::UnknownDtypeName { .. })
        ));
    }

    #[test]
    fn encode_rejects_bad_input() {
        assert_eq!(
            encode(&[2, 3], &[0.0; 5], WireDtype::F32),
            Err(CodecError::LengthMismatch {
                expected: 6,
                got: 5
            })
        );
        let nan = encode(&[3], &[0.0, f32::NAN, 1.0], WireDtype::Int8);
        assert!(matches!(nan, Err(CodecError::NonFinite { index: 1, .. })));
        assert_eq!(
            encode(&[2], &[1.0, f32::NEG_INFINITY], WireDtype::F32),
            Err(CodecError::NonFinite {
                index: 1,
                value: f32::NEG_INFINITY
            })
        );
        assert_eq!(
            encode(&[1], &[f32::MAX], WireDtype::Bf16),
            Err(CodecError::Bf16Overflow {
                index: 0,
                value: f32::MAX
            })
        );
        assert_eq!(
            encode(&[1; 9], &[0.0], WireDtype::F32),
            Err(CodecError::RankTooLarge { rank: 9 })
        );
        let big = u32::MAX as usize + 1;
        assert_eq!(
            encode(&[big, 0], &[], WireDtype::F32),
            Err(CodecError::DimTooLarge { axis: 0, size: big })
        );
    }

    #[test]
    fn decode_rejects_bad_header() {
        let good = encode(&[2], &[1.0, 2.0], WireDtype::F32).unwrap();

        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(matches!(decode(&bad), Err(CodecError::BadMagic { .. })));
        assert_eq!(
            decode(b"PK"),
            Err(CodecError::BadMagic {
                got: b"PK".to_vec()
            })
        );
        assert_eq!(
            decode(&good[..6]),
            Err(CodecError::TruncatedHeader {
                expected: 8,
                got: 6
            })
        );
        assert_eq!(
            decode(&[]),
            Err(CodecError::TruncatedHeader {
                expected: 8,
                got: 0
            })
        );

        // Version 1 (a scale per int8 row) and anything newer are refused.
        for v in [1u8, 3] {
            let mut bad = good.clone();
            bad[4] = v;
            assert_eq!(decode(&bad), Err(CodecError::UnsupportedVersion { got: v }));
        }

        let mut bad = good.clone();
        bad[5] = 9;
        assert_eq!(decode(&bad), Err(CodecError::UnknownDtype { code: 9 }));

        let mut bad = header(0, &[]);
        bad[6] = 200;
        assert_eq!(decode(&bad), Err(CodecError::RankTooLarge { rank: 200 }));

        // Rank 3 declared, only one dim present.
        let bad = &header(0, &[1, 1, 1])[..12];
        assert_eq!(
            decode(bad),
            Err(CodecError::TruncatedHeader {
                expected: 20,
                got: 12
            })
        );
    }

    #[test]
    fn decode_rejects_wrong_lengths_without_allocating() {
        let good = encode(&[2], &[1.0, 2.0], WireDtype::F32).unwrap();
        assert_eq!(
            decode(&good[..good.len() - 3]),
            Err(CodecError::TruncatedPayload {
                expected: 8,
                got: 5
            })
        );
        let mut long = good.clone();
        long.extend_from_slice(&[0, 0]);
        assert_eq!(
            decode(&long),
            Err(CodecError::TrailingBytes {
                expected: 20,
                got: 22,
                extra: 2
            })
        );
        // A header promising 16 GiB of payload is refused by length, not by allocation.
        assert_eq!(
            decode(&header(0, &[u32::MAX])),
            Err(CodecError::TruncatedPayload {
                expected: 4 * u32::MAX as usize,
                got: 0
            })
        );
        // Byte counts that overflow usize are refused outright.
        assert!(matches!(
            decode(&header(0, &[u32::MAX; 3])),
            Err(CodecError::SizeOverflow { .. })
        ));
        assert!(matches!(
            decode(&header(2, &[u32::MAX, u32::MAX, 0])),
            Err(CodecError::SizeOverflow { .. })
        ));
    }

    #[test]
    fn decode_expecting_reports_both_shapes() {
        let bytes = encode(&[2, 3], &[0.5; 6], WireDtype::Bf16).unwrap();
        assert_eq!(
            decode_expecting(&bytes, &[3, 2]),
            Err(CodecError::ShapeMismatch {
                expected: vec![3, 2],
                got: vec![2, 3]
            })
        );
        assert_eq!(
            decode_expecting(&bytes, &[2, 3]).unwrap().data,
            vec![0.5; 6]
        );
    }

    #[test]
    fn decode_rejects_non_finite_payloads() {
        let mut bytes = header(0, &[2]);
        bytes.extend_from_slice(&1.0f32.to_le_bytes());
        bytes.extend_from_slice(&f32::NAN.to_le_bytes());
        assert!(matches!(
            decode(&bytes),
            Err(CodecError::NonFinite { index: 1, .. })
        ));

        let mut bytes = header(1, &[2]);
        bytes.extend_from_slice(&[0x80, 0xFF, 0x80, 0x3F]); // -inf, 1.0
        assert_eq!(
            decode(&bytes),
            Err(CodecError::NonFinite {
                index: 0,
                value: f32::NEG_INFINITY
            })
        );

        let huge = f32::MAX / 100.0;
        for (scale, block) in [(-1.0f32, 1), (f32::INFINITY, 1), (f32::NAN, 1), (huge, 1)] {
            // Rows of 256: one block each.
            let mut bytes = header(2, &[2, 256]);
            bytes.extend_from_slice(&1.0f32.to_le_bytes());
            bytes.extend_from_slice(&scale.to_le_bytes());
            bytes.extend_from_slice(&[1; 512]);
            assert!(
                matches!(decode(&bytes), Err(CodecError::BadScale { block: b, .. }) if b == block),
                "scale {scale}"
            );
        }

        let mut bytes = header(2, &[2]);
        bytes.extend_from_slice(&1.0f32.to_le_bytes());
        bytes.extend_from_slice(&[5, 0x80]);
        assert_eq!(
            decode(&bytes),
            Err(CodecError::QuantizedOutOfRange { index: 1 })
        );
    }

    #[test]
    fn fuzzed_input_never_panics() {
        let mut rng = ChaCha8Rng::seed_from_u64(0x10_7a);
        let mut decoded_ok = 0usize;

        // Random byte strings, half of them behind a plausible fixed header.
        for i in 0..10_000 {
            let len = rng.random_range(0..64usize);
            let mut bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            if i % 2 == 0 && bytes.len() >= 8 {
                bytes[..5].copy_from_slice(&[b'I', b'O', b'T', b'W', FORMAT_VERSION]);
                bytes[5] = rng.random_range(0..3);
                bytes[6] = rng.random_range(0..4);
                bytes[7] = 0;
            }
            decoded_ok += usize::from(decode(&bytes).is_ok());
            let _ = decode_expecting(&bytes, &[2, 2]);
        }

        // Truncations and bit flips of valid payloads.
        for i in 0..3_000 {
            let dtype = WireDtype::ALL[i % 3];
            let shape = [rng.random_range(0..4usize), rng.random_range(0..5usize)];
            let data = sample_data(&mut rng, shape[0] * shape[1]);
            let good = encode(&shape, &data, dtype).unwrap();
            let cut = rng.random_range(0..good.len());
            assert!(
                decode(&good[..cut]).is_err(),
                "truncation at {cut} accepted"
            );
            let mut flipped = good.clone();
            let at = rng.random_range(0..flipped.len());
            flipped[at] ^= 1 << rng.random_range(0..8u32);
            if let Ok(t) = decode(&flipped) {
                // A flip that still decodes must give a well-formed tensor.
                assert_eq!(t.data.len(), t.shape.iter().product::<usize>());
                assert!(t.data.iter().all(|v| v.is_finite()));
                decoded_ok += 1;
            }
        }
        // Payload bit flips mostly still decode: the loop did exercise the success path.
        assert!(decoded_ok > 0);
    }
}
