//! The `dct`, `sign`, `sign2`, `q4` and `q4v2` merge formats: a section's flat state as a
//! compressed change from the previous global state, 9x to 13x smaller than f32 in uploads
//! (see [`DeltaSpec`]). They differ in how the parameters' change is coded ([`ParamCode`]) and
//! in how many bits each second moment gets ([`MomentCode`]).
//!
//! The flat state has three segments (see [`super::flat`]): parameters (flat indices `0..P`),
//! first moments (`P..2P`) and second moments (`2P..3P`). Each is cut into chunks of `C`
//! values and each chunk is stored on its own, in a fixed number of bytes, so an element range
//! maps to a byte range (HTTP range reads of a partition) and every object has a size known
//! from its position alone.
//!
//! - **Parameters**: the *pseudo-gradient* `d = x - g` (`g`: the previous global state, which
//!   every party holds), decoded as `g + d'`. Miners keep what the code left out (`d - d'`)
//!   and add it to their next upload (error feedback), like DeMo and Templar.
//!   - `dct`: `d` in an orthonormal DCT-II basis of the chunk ([`super::dct_basis`]); only the
//!     `k` largest coefficients are kept (`k = keep` in uploads, `keep_merged` in merged
//!     partitions), as `(u8 index, bf16 value)`.
//!   - `sign`: every value of `d`, one bit each in uploads (its sign, times the chunk's mean
//!     magnitude) and four bits in merged partitions ([`super::sign_code`]). The same upload
//!     size as `dct`'s default, but nothing is left out for long: measured in the in-process
//!     simulation (docs/learning-log.md), `dct`'s top-k parameter code is what costs it its learning.
//!   - `sign2`: as `sign` with two bits per value in uploads (the sign, and whether the value
//!     is above the chunk's mean magnitude; two scales per chunk).
//!   - `q4`: four bits per value in uploads too (symmetric, scale max / 7).
//! - **First moments**: the `k` largest values themselves (identity basis, no base), the rest
//!   zero: a moment is renewed within a few dozen steps, so its change from `g` is no smaller
//!   than the moment, and a zero first moment can never cause a large step. The `m4` and `m2`
//!   formats (`q4v2m4`, `q4v2m2`) code every first moment instead, in 4 bits (as `q4`'s
//!   parameters) or 2 (as `sign2`'s), without error feedback ([`FirstMomentCode`]): with
//!   frequent merges a lane takes too few steps between them to rebuild zeroed moments.
//! - **Second moments**: one `f32` per chunk (its largest value `t`), then a 4-bit code `q` per
//!   value, decoded `t * 2^-q`, the nearer of the two such values around the true one (ties
//!   go to the larger). The `v2` formats (`q4v2`) use a 2-bit code instead, decoded `t * 4^-q`
//!   ([`MomentCode`]): values below `t / 64` decode as `t / 64`, which only shortens those
//!   values' steps. Rounding to the nearer value, not up: a moment is coded again at every
//!   merge after a few steps have decayed it (AdamW's `beta2` 0.95 keeps 60% of it over 10
//!   steps), and a code that always rounds up inflates it anew each time. Measured in the
//!   in-process simulation with 10-step merges (docs/learning-log.md): rounding up cost `q4v2m4` about 4% of
//!   the eval loss against `f32`, rounding to the nearer value nothing measurable.
//!
//! The chunk grid of an object starts at the object's first element, and again at every
//! segment boundary inside it (`P`, `2P`); a chunk shorter than `C` ends a segment or an
//! object. An upload (starting at 0) and a partition read by range therefore cut their chunks
//! at the same places.
//!
//! # Bytes
//! ```text
//! dct parameter or first-moment chunk of L values
//!                                               min(k, L) x (u8 index, bf16 value)
//! sign parameter chunk of L values              f32 scale, ceil(L / 8) bytes of sign bits in
//!                                               uploads; f32 scale, ceil(L / 2) bytes of
//!                                               4-bit codes in merged partitions
//! sign2 parameter chunk of L values             two f32 scales, ceil(L / 4) bytes of 2-bit
//!                                               codes in uploads; merged as sign
//! q4 parameter chunk of L values                f32 scale, ceil(L / 2) bytes of 4-bit codes
//!                                               (uploads and merged partitions)
//! second-moment chunk of L values               f32 top, ceil(L / 2) bytes of 4-bit codes
//!                                               (value i in the low nibble of byte i/2 when i
//!                                               is even, the high nibble when odd)
//! v2 second-moment chunk of L values            f32 top, ceil(L / 4) bytes of 2-bit codes
//!                                               (value i in bits 2(i % 4) and 2(i % 4) + 1 of
//!                                               byte i / 4)
//! ```
//! Indices are strictly increasing, so every chunk has one encoding of its entries.
//!
//! # Determinism
//! Every party decodes the same bytes to the same `f32` values bit for bit: the basis is
//! computed with a fixed sequence of IEEE operations (no platform `cos`), sums run in a fixed
//! order in `f64`, and Rust never fuses or reorders floating-point operations. Encoding is
//! deterministic too (ties in the top-k go to the lower index), so the orchestrator's and the
//! validators' recomputations equal an honest merger's copy byte for byte.
//!
//! # What decoding refuses
//! A payload of the wrong length, a base of the wrong length or with a non-finite value, an
//! index beyond its chunk, indices not strictly increasing (duplicates), a NaN, infinite or
//! huge (> [`MAX_MAGNITUDE`]) coefficient, a `sign` scale that is NaN, negative, infinite or
//! above [`MAX_MAGNITUDE`], the 4-bit code -8, a second-moment top that is NaN, negative,
//! infinite or above [`MAX_MAGNITUDE`] squared, padding bits that are not zero, and a decoded
//! value that is not finite. Every error names the flat index of the chunk (and the entry).

use std::fmt;
use std::ops::Range;

use half::bf16;
use thiserror::Error;

use super::bit_pack;
use super::dct_basis::Basis;
use super::sign_code::{Bits, Fault};

/// Longest chunk (indices are one byte).
pub const MAX_CHUNK: u16 = 256;

/// Largest coefficient or first moment the format carries; anything larger is refused (an
/// honest state is many orders of magnitude below it).
pub const MAX_MAGNITUDE: f32 = 1e12;

/// Largest second-moment chunk top ([`MAX_MAGNITUDE`] squared).
const MAX_SECOND_MOMENT: f32 = 1e24;

/// Bytes of one sparse entry: u8 index, bf16 value.
const ENTRY_BYTES: u64 = 3;

/// How the parameters' change from the previous global state is coded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ParamCode {
    /// The largest coefficients of each chunk's DCT (`keep` in uploads, `keep_merged` in
    /// merged partitions).
    Dct,
    /// Every value: 1 bit (sign x the chunk's mean magnitude) in uploads, 4 bits in merged
    /// partitions.
    Sign,
    /// Every value: 2 bits (sign, and one of two magnitudes) in uploads, 4 bits in merged
    /// partitions.
    Sign2,
    /// Every value: 4 bits (symmetric, scale max / 7) in uploads and merged partitions.
    Q4,
}

impl ParamCode {
    /// The code's name: `dct`, `sign`, `sign2` or `q4`.
    pub fn name(self) -> &'static str {
        match self {
            ParamCode::Dct => "dct",
            ParamCode::Sign => "sign",
            ParamCode::Sign2 => "sign2",
            ParamCode::Q4 => "q4",
        }
    }

    /// Every parameter code.
    const ALL: [ParamCode; 4] = [
        ParamCode::Dct,
        ParamCode::Sign,
        ParamCode::Sign2,
        ParamCode::Q4,
    ];
}

/// How the second moments are coded: an `f32` top per chunk (its largest value) and a code
/// `q` per value, decoded `top * 2^-(step * q)` and rounded to the nearer of the two such
/// values around the true one (ties to the larger; values below the smallest decode as it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MomentCode {
    /// 4 bits, `top * 2^-q` for `q` in `0..=15` (down to `top / 32768`).
    Four,
    /// 2 bits, `top * 4^-q` for `q` in `0..=3` (down to `top / 64`): the `v2` formats.
    Two,
}

impl MomentCode {
    /// Bits per value.
    fn width(self) -> usize {
        match self {
            MomentCode::Four => 4,
            MomentCode::Two => 2,
        }
    }

    /// Largest code.
    fn max_code(self) -> u8 {
        (1u8 << self.width()) - 1
    }

    /// Halvings per code step.
    fn step(self) -> u8 {
        match self {
            MomentCode::Four => 1,
            MomentCode::Two => 2,
        }
    }

    /// Bytes of a chunk of `len` values.
    fn chunk_bytes(self, len: u64) -> u64 {
        4 + bit_pack::packed_len(len, self.width())
    }

    /// Where a value between two neighbouring codes' values `a` and `a / 2^step` is nearer
    /// the smaller: below their midpoint, as a multiple of the smaller (exact in `f32`).
    fn midpoint(self) -> f32 {
        match self {
            MomentCode::Four => 1.5,
            MomentCode::Two => 2.5,
        }
    }
}

/// How the first moments are coded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FirstMomentCode {
    /// The `keep` largest values of each chunk (`keep_merged` in merged partitions), the rest
    /// zero.
    TopK,
    /// Every value in 4 bits (symmetric, scale max / 7, as `q4`'s parameters): the formats
    /// named `...m4` (`q4v2m4`). A moment survives a merge instead of restarting from zero.
    Four,
    /// Every value in 2 bits (its sign, and whether it is above the chunk's mean magnitude;
    /// decoded as the mean magnitude of the small or of the large values, as `sign2`'s
    /// parameters): the formats named `...m2` (`q4v2m2`).
    Two,
}

impl FirstMomentCode {
    /// Every first-moment code.
    const ALL: [FirstMomentCode; 3] = [
        FirstMomentCode::TopK,
        FirstMomentCode::Four,
        FirstMomentCode::Two,
    ];

    /// The dense code of every value, if the moments are not sparse.
    fn dense(self) -> Option<Bits> {
        match self {
            FirstMomentCode::TopK => None,
            FirstMomentCode::Four => Some(Bits::Four),
            FirstMomentCode::Two => Some(Bits::Two),
        }
    }
}

/// Parameters of the `dct` and `sign` formats: the parameter code, the chunk length and how
/// many values each sparse chunk keeps (first moments, and `dct`'s parameters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeltaSpec {
    /// How the parameters' change is coded.
    pub params: ParamCode,
    /// Values per chunk `C` (2 to [`MAX_CHUNK`]).
    pub chunk: u16,
    /// Values kept per sparse chunk in uploads (1 to `C`).
    pub keep: u16,
    /// Values kept per sparse chunk in merged partitions (`keep` to `C`): a merge of several
    /// sparse uploads holds more than one upload's worth.
    pub keep_merged: u16,
    /// How the second moments are coded (`Two` in the formats named `...v2`).
    pub moments: MomentCode,
    /// How the first moments are coded (`Four` in the formats named `...m4`, `Two` in those
    /// named `...m2`).
    pub first_moments: FirstMomentCode,
}

impl Default for DeltaSpec {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl DeltaSpec {
    /// `dct`: chunks of 64, 4 coefficients per chunk in uploads, 8 in merged partitions.
    pub const DEFAULT: DeltaSpec = DeltaSpec {
        params: ParamCode::Dct,
        chunk: 64,
        keep: 4,
        keep_merged: 8,
        moments: MomentCode::Four,
        first_moments: FirstMomentCode::TopK,
    };

    /// `sign`: chunks of 64, parameters in 1 bit (uploads) and 4 bits (merged partitions),
    /// first moments as `dct`'s default.
    pub const SIGN: DeltaSpec = DeltaSpec {
        params: ParamCode::Sign,
        ..Self::DEFAULT
    };

    /// `q4`: as [`SIGN`](Self::SIGN) with 4-bit parameters in uploads.
    pub const Q4: DeltaSpec = DeltaSpec {
        params: ParamCode::Q4,
        ..Self::DEFAULT
    };

    /// `q4v2`: as [`Q4`](Self::Q4) with the second moments in 2 bits.
    pub const Q4V2: DeltaSpec = DeltaSpec {
        params: ParamCode::Q4,
        moments: MomentCode::Two,
        ..Self::DEFAULT
    };

    /// `sign2`: as [`SIGN`](Self::SIGN) with 2-bit parameters in uploads.
    pub const SIGN2: DeltaSpec = DeltaSpec {
        params: ParamCode::Sign2,
        ..Self::DEFAULT
    };

    /// A checked `dct` spec.
    ///
    /// # Errors
    /// A message naming the bound that is broken.
    pub fn new(chunk: u16, keep: u16, keep_merged: u16) -> Result<Self, String> {
        Self::with_code(ParamCode::Dct, chunk, keep, keep_merged)
    }

    /// A checked spec with the parameter code `params`.
    ///
    /// # Errors
    /// A message naming the bound that is broken.
    pub fn with_code(
        params: ParamCode,
        chunk: u16,
        keep: u16,
        keep_merged: u16,
    ) -> Result<Self, String> {
        Self::with_codes(
            params,
            MomentCode::Four,
            FirstMomentCode::TopK,
            chunk,
            keep,
            keep_merged,
        )
    }

    /// A checked spec with the parameter code `params`, the second-moment code `moments` and
    /// the first-moment code `first_moments`.
    ///
    /// # Errors
    /// A message naming the bound that is broken.
    pub fn with_codes(
        params: ParamCode,
        moments: MomentCode,
        first_moments: FirstMomentCode,
        chunk: u16,
        keep: u16,
        keep_merged: u16,
    ) -> Result<Self, String> {
        let name = Self::name_of(params, moments, first_moments);
        if !(2..=MAX_CHUNK).contains(&chunk) {
            return Err(format!("{name} chunk {chunk} must be 2 to {MAX_CHUNK}"));
        }
        if keep == 0 || keep > chunk {
            return Err(format!(
                "{name} keep {keep} must be 1 to the chunk ({chunk})"
            ));
        }
        if keep_merged < keep || keep_merged > chunk {
            return Err(format!(
                "{name} merged keep {keep_merged} must be {keep} to the chunk ({chunk})"
            ));
        }
        Ok(Self {
            params,
            chunk,
            keep,
            keep_merged,
            moments,
            first_moments,
        })
    }

    /// The format's name: the parameter code's name, with `v2` after it when the second
    /// moments are in 2 bits (`q4v2`) and `m4` or `m2` last when every first moment is coded
    /// in 4 or 2 bits (`q4v2m4`, `q4v2m2`).
    pub fn name(self) -> &'static str {
        Self::name_of(self.params, self.moments, self.first_moments)
    }

    fn name_of(params: ParamCode, moments: MomentCode, first: FirstMomentCode) -> &'static str {
        use FirstMomentCode::{Four as M4, TopK, Two as M2};
        match (params, moments, first) {
            (code, MomentCode::Four, TopK) => code.name(),
            (ParamCode::Dct, MomentCode::Two, TopK) => "dctv2",
            (ParamCode::Sign, MomentCode::Two, TopK) => "signv2",
            (ParamCode::Sign2, MomentCode::Two, TopK) => "sign2v2",
            (ParamCode::Q4, MomentCode::Two, TopK) => "q4v2",
            (ParamCode::Dct, MomentCode::Four, M4) => "dctm4",
            (ParamCode::Sign, MomentCode::Four, M4) => "signm4",
            (ParamCode::Sign2, MomentCode::Four, M4) => "sign2m4",
            (ParamCode::Q4, MomentCode::Four, M4) => "q4m4",
            (ParamCode::Dct, MomentCode::Two, M4) => "dctv2m4",
            (ParamCode::Sign, MomentCode::Two, M4) => "signv2m4",
            (ParamCode::Sign2, MomentCode::Two, M4) => "sign2v2m4",
            (ParamCode::Q4, MomentCode::Two, M4) => "q4v2m4",
            (ParamCode::Dct, MomentCode::Four, M2) => "dctm2",
            (ParamCode::Sign, MomentCode::Four, M2) => "signm2",
            (ParamCode::Sign2, MomentCode::Four, M2) => "sign2m2",
            (ParamCode::Q4, MomentCode::Four, M2) => "q4m2",
            (ParamCode::Dct, MomentCode::Two, M2) => "dctv2m2",
            (ParamCode::Sign, MomentCode::Two, M2) => "signv2m2",
            (ParamCode::Sign2, MomentCode::Two, M2) => "sign2v2m2",
            (ParamCode::Q4, MomentCode::Two, M2) => "q4v2m2",
        }
    }

    /// The DCT basis of a whole chunk, for the `dct` parameter code only (building it costs
    /// `C^2` cosines).
    fn basis(self) -> Option<Basis> {
        (self.params == ParamCode::Dct).then(|| Basis::new(usize::from(self.chunk)))
    }

    fn keep_for(self, merged: bool) -> usize {
        usize::from(if merged { self.keep_merged } else { self.keep })
    }
}

impl fmt::Display for DeltaSpec {
    /// The name alone for the default chunking, `NAME:C:K:KM` otherwise.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.name();
        if (self.chunk, self.keep, self.keep_merged) == (64, 4, 8) {
            f.write_str(name)
        } else {
            write!(
                f,
                "{name}:{}:{}:{}",
                self.chunk, self.keep, self.keep_merged
            )
        }
    }
}

impl DeltaSpec {
    /// Parses `NAME`, `NAME:C` (keeps as the default's, at most `C`), `NAME:C:K` (merged keep
    /// `min(2K, C)`) or `NAME:C:K:KM` for `NAME` a parameter code's name (`dct`, `sign`,
    /// `sign2`, `q4`), optionally followed by `v2`, then optionally by `m4` or `m2` (ASCII case
    /// ignored); `None` when `s` is none of them.
    pub fn parse(s: &str) -> Option<Result<Self, String>> {
        let s = s.trim();
        let mut parts = s.split(':');
        let head = parts.next()?;
        let (params, moments, first_moments) = ParamCode::ALL
            .into_iter()
            .flat_map(|c| [(c, MomentCode::Four), (c, MomentCode::Two)])
            .flat_map(|(c, m)| FirstMomentCode::ALL.map(|f| (c, m, f)))
            .find(|&(c, m, f)| Self::name_of(c, m, f).eq_ignore_ascii_case(head))?;
        let name = Self::name_of(params, moments, first_moments);
        let nums: Result<Vec<u16>, _> = parts.map(str::parse::<u16>).collect();
        let codes =
            |c: u16, k: u16, km: u16| Self::with_codes(params, moments, first_moments, c, k, km);
        Some(match nums.as_deref() {
            Ok([]) => Ok(DeltaSpec {
                params,
                moments,
                first_moments,
                ..Self::DEFAULT
            }),
            Ok([c]) => codes(
                *c,
                Self::DEFAULT.keep.min(*c),
                Self::DEFAULT.keep_merged.min(*c),
            ),
            Ok([c, k]) => codes(*c, *k, (k.saturating_mul(2)).min(*c)),
            Ok([c, k, km]) => codes(*c, *k, *km),
            _ => Err(format!(
                "bad {name} spec {s:?}: expected {name}, {name}:CHUNK, {name}:CHUNK:KEEP or \
                 {name}:CHUNK:KEEP:MERGED_KEEP"
            )),
        })
    }
}

/// Where an object sits: its first flat index, the section's parameter count `P` (0: every
/// value is a parameter), and whether it is a merged partition (which keeps more).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// Global flat index of the object's first value.
    pub start: u64,
    /// The section's parameter count.
    pub params_len: u64,
    /// A merged partition (keeps `keep_merged`), not an upload.
    pub merged: bool,
}

/// Why a `dct` object could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum DeltaError {
    /// The payload's length is not the one the layout gives.
    #[error("merge payload of {got} bytes, expected {expected} for {elements} values")]
    Length {
        /// Values expected.
        elements: u64,
        /// Bytes expected.
        expected: u64,
        /// Bytes present.
        got: u64,
    },
    /// The previous global values given for the parameters are not as many as the parameters
    /// in the object.
    #[error("dct base of {got} values, the object holds {expected} parameters")]
    BaseLength {
        /// Parameters in the object.
        expected: u64,
        /// Base values given.
        got: u64,
    },
    /// An index past the end of its chunk.
    #[error("dct index {value} past the end of the {len}-value chunk at flat index {index}")]
    IndexOutOfRange {
        /// Flat index of the chunk's first value.
        index: u64,
        /// The index found.
        value: u8,
        /// The chunk's length.
        len: usize,
    },
    /// Indices not strictly increasing (a duplicate, or out of order).
    #[error("dct index {value} repeated or out of order in the chunk at flat index {index}")]
    UnorderedIndex {
        /// Flat index of the chunk's first value.
        index: u64,
        /// The index found.
        value: u8,
    },
    /// A coefficient, value or base that is NaN or infinite, or a decoded value that is.
    #[error("non-finite value {value} at flat index {index}")]
    NonFinite {
        /// Flat index (of the value, or of the chunk for a coefficient).
        index: u64,
        /// The value.
        value: f32,
    },
    /// A finite coefficient or value beyond what the format carries.
    #[error("value {value} at flat index {index} exceeds the dct limit {MAX_MAGNITUDE:e}")]
    TooLarge {
        /// Flat index (of the value, or of the chunk for a coefficient).
        index: u64,
        /// The value.
        value: f32,
    },
    /// A second-moment chunk top that is NaN, negative, infinite or too large.
    #[error("invalid second-moment top {value} of the chunk at flat index {index}")]
    BadTop {
        /// Flat index of the chunk's first value.
        index: u64,
        /// The top found.
        value: f32,
    },
    /// Unused bits after the last code of a chunk are not zero.
    #[error("non-zero padding bits after the chunk at flat index {index}")]
    Padding {
        /// Flat index of the chunk's first value.
        index: u64,
    },
    /// A `sign` chunk scale that is NaN, negative, infinite or above [`MAX_MAGNITUDE`].
    #[error("invalid scale {value} of the sign chunk at flat index {index}")]
    BadScale {
        /// Flat index of the chunk's first value.
        index: u64,
        /// The scale found.
        value: f32,
    },
    /// The 4-bit code -8, which the symmetric code never writes.
    #[error("invalid 4-bit code -8 at flat index {index}")]
    BadCode {
        /// Flat index of the value.
        index: u64,
    },
}

impl DeltaError {
    /// The flat index the error is about, if any.
    pub fn index(&self) -> Option<u64> {
        match self {
            Self::IndexOutOfRange { index, .. }
            | Self::UnorderedIndex { index, .. }
            | Self::NonFinite { index, .. }
            | Self::TooLarge { index, .. }
            | Self::BadTop { index, .. }
            | Self::BadScale { index, .. }
            | Self::BadCode { index }
            | Self::Padding { index } => Some(*index),
            Self::Length { .. } | Self::BaseLength { .. } => None,
        }
    }
}

/// The three segments of a flat state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Segment {
    Params,
    Moment1,
    Moment2,
}

/// The segment of global index `g` and the index where it ends.
fn segment_of(g: u64, p: u64) -> (Segment, u64) {
    if p == 0 {
        (Segment::Params, u64::MAX)
    } else if g < p {
        (Segment::Params, p)
    } else if g < p.saturating_mul(2) {
        (Segment::Moment1, p.saturating_mul(2))
    } else {
        (Segment::Moment2, u64::MAX)
    }
}

/// One chunk of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Chunk {
    /// Global index of its first value.
    start: u64,
    /// Values.
    len: usize,
    segment: Segment,
}

/// A maximal run of an object inside one segment.
#[derive(Debug, Clone, Copy)]
struct Piece {
    start: u64,
    end: u64,
    segment: Segment,
}

/// The pieces of the object `start..start + n`.
fn pieces(start: u64, n: u64, p: u64) -> Vec<Piece> {
    let end = start.saturating_add(n);
    let mut out = Vec::with_capacity(3);
    let mut at = start;
    while at < end {
        let (segment, seg_end) = segment_of(at, p);
        let piece_end = end.min(seg_end);
        out.push(Piece {
            start: at,
            end: piece_end,
            segment,
        });
        at = piece_end;
    }
    out
}

/// Every chunk of the object `start..start + n`, in order.
fn chunks(start: u64, n: u64, p: u64, c: u64) -> impl Iterator<Item = Chunk> {
    pieces(start, n, p).into_iter().flat_map(move |piece| {
        let count = (piece.end - piece.start).div_ceil(c);
        (0..count).map(move |i| {
            let s = piece.start + i * c;
            Chunk {
                start: s,
                len: usize::try_from((piece.end - s).min(c)).unwrap_or(usize::MAX),
                segment: piece.segment,
            }
        })
    })
}

impl DeltaSpec {
    /// Bytes of a chunk of `len` values of `segment`.
    fn chunk_bytes(self, len: u64, segment: Segment, merged: bool) -> u64 {
        match segment {
            Segment::Params if self.params != ParamCode::Dct => {
                sign_bits(self.params, merged).chunk_bytes(len)
            }
            Segment::Moment1 if let Some(bits) = self.first_moments.dense() => {
                bits.chunk_bytes(len)
            }
            Segment::Params | Segment::Moment1 => {
                ENTRY_BYTES * len.min(self.keep_for(merged) as u64)
            }
            Segment::Moment2 => self.moments.chunk_bytes(len),
        }
    }

    /// Bytes of the object of `n` values at `place`.
    pub fn encoded_len(self, n: u64, place: Place) -> u64 {
        let c = u64::from(self.chunk);
        pieces(place.start, n, place.params_len)
            .iter()
            .map(|piece| {
                let len = piece.end - piece.start;
                let full = (len / c) * self.chunk_bytes(c, piece.segment, place.merged);
                let rest = len % c;
                full + if rest > 0 {
                    self.chunk_bytes(rest, piece.segment, place.merged)
                } else {
                    0
                }
            })
            .sum()
    }

    /// The smallest run of whole chunks of the object (`len` values at `place`) that covers
    /// `elems` (object-local indices), clipped to the object.
    pub fn aligned(self, elems: Range<u64>, len: u64, place: Place) -> Range<u64> {
        if elems.start >= elems.end || elems.end > len {
            return elems.start.min(len)..elems.start.min(len);
        }
        let c = u64::from(self.chunk);
        // The chunk grid is anchored at the object's start and at each segment start.
        let anchor = |local: u64| -> (u64, u64) {
            let g = place.start + local;
            let (_, seg_end) = segment_of(g, place.params_len);
            let seg_start = match segment_of(g, place.params_len).0 {
                Segment::Params => 0,
                Segment::Moment1 => place.params_len,
                Segment::Moment2 => place.params_len.saturating_mul(2),
            };
            let a = seg_start.max(place.start) - place.start;
            let piece_end = seg_end.saturating_sub(place.start).min(len);
            (a, piece_end)
        };
        let (a0, _) = anchor(elems.start);
        let start = a0 + (elems.start - a0) / c * c;
        let last = elems.end - 1;
        let (a1, piece_end) = anchor(last);
        let end = (a1 + ((last - a1) / c + 1) * c).min(piece_end);
        start..end
    }

    /// The bytes of the object (`len` values at `place`) that hold
    /// [`aligned`](Self::aligned)`(elems)`.
    pub fn byte_range(self, elems: Range<u64>, len: u64, place: Place) -> Range<u64> {
        let a = self.aligned(elems, len, place);
        // A prefix ending on the grid is itself an object with the same chunks.
        self.encoded_len(a.start, place)..self.encoded_len(a.end, place)
    }

    /// Parameters among the object's values (those a base value is needed for).
    pub fn params_in(n: u64, place: Place) -> u64 {
        if place.params_len == 0 {
            return n;
        }
        let end = place.start.saturating_add(n).min(place.params_len);
        end.saturating_sub(place.start)
    }

    /// Encodes `values` (the object at `place`); `base` holds the previous global values of
    /// its parameters ([`params_in`](Self::params_in) of them). The caller has checked that
    /// `values` are finite and second moments non-negative.
    ///
    /// # Errors
    /// [`DeltaError::BaseLength`], a non-finite base or difference, or a value beyond
    /// [`MAX_MAGNITUDE`].
    pub fn encode(self, values: &[f32], place: Place, base: &[f32]) -> Result<Vec<u8>, DeltaError> {
        let n = values.len() as u64;
        check_base(n, place, base)?;
        let c = u64::from(self.chunk);
        let full = self.basis();
        let keep = self.keep_for(place.merged);
        let mut out = Vec::with_capacity(usize::try_from(self.encoded_len(n, place)).unwrap_or(0));
        for chunk in chunks(place.start, n, place.params_len, c) {
            let local = (chunk.start - place.start) as usize;
            let vals = &values[local..local + chunk.len];
            match chunk.segment {
                Segment::Params => {
                    let mut delta = Vec::with_capacity(chunk.len);
                    for (i, (&x, &g)) in vals.iter().zip(&base[local..]).enumerate() {
                        let index = chunk.start + i as u64;
                        if !g.is_finite() {
                            return Err(DeltaError::NonFinite { index, value: g });
                        }
                        let d = x - g;
                        if !d.is_finite() {
                            return Err(DeltaError::NonFinite { index, value: d });
                        }
                        delta.push(d);
                    }
                    match self.params {
                        ParamCode::Dct => {
                            let coefs = match &full {
                                Some(full) if chunk.len == full.len => full.forward(&delta),
                                _ => Basis::new(chunk.len).forward(&delta),
                            };
                            write_top_k(&coefs, keep, chunk.start, &mut out)?;
                        }
                        code => sign_bits(code, place.merged)
                            .write(&delta, MAX_MAGNITUDE, &mut out)
                            .map_err(|f| fault(f, chunk.start))?,
                    }
                }
                Segment::Moment1 if let Some(bits) = self.first_moments.dense() => bits
                    .write(vals, MAX_MAGNITUDE, &mut out)
                    .map_err(|f| fault(f, chunk.start))?,
                Segment::Moment1 => {
                    let coefs: Vec<f64> = vals.iter().map(|&v| f64::from(v)).collect();
                    write_top_k(&coefs, keep, chunk.start, &mut out)?;
                }
                Segment::Moment2 => write_codes(self.moments, vals, chunk.start, &mut out)?,
            }
        }
        Ok(out)
    }

    /// Decodes the object of `n` values at `place`; `base` as for [`encode`](Self::encode).
    ///
    /// # Errors
    /// Every refusal of the module's `# What decoding refuses`.
    pub fn decode(
        self,
        bytes: &[u8],
        n: u64,
        place: Place,
        base: &[f32],
    ) -> Result<Vec<f32>, DeltaError> {
        let expected = self.encoded_len(n, place);
        if bytes.len() as u64 != expected {
            return Err(DeltaError::Length {
                elements: n,
                expected,
                got: bytes.len() as u64,
            });
        }
        check_base(n, place, base)?;
        let c = u64::from(self.chunk);
        let full = self.basis();
        let keep = self.keep_for(place.merged);
        let mut out = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
        let mut at = 0usize;
        for chunk in chunks(place.start, n, place.params_len, c) {
            let size = self.chunk_bytes(chunk.len as u64, chunk.segment, place.merged) as usize;
            let bytes = &bytes[at..at + size];
            at += size;
            let local = (chunk.start - place.start) as usize;
            match chunk.segment {
                Segment::Params => {
                    let x = match self.params {
                        ParamCode::Dct => {
                            let entries = read_entries(bytes, chunk.len, keep, chunk.start)?;
                            match &full {
                                Some(full) if chunk.len == full.len => full.inverse(&entries),
                                _ => Basis::new(chunk.len).inverse(&entries),
                            }
                        }
                        code => sign_bits(code, place.merged)
                            .read(bytes, chunk.len, MAX_MAGNITUDE)
                            .map_err(|f| fault(f, chunk.start))?,
                    };
                    for (i, (d, &g)) in x.into_iter().zip(&base[local..]).enumerate() {
                        let index = chunk.start + i as u64;
                        if !g.is_finite() {
                            return Err(DeltaError::NonFinite { index, value: g });
                        }
                        let v = g + d;
                        if !v.is_finite() {
                            return Err(DeltaError::NonFinite { index, value: v });
                        }
                        out.push(v);
                    }
                }
                Segment::Moment1 if let Some(bits) = self.first_moments.dense() => out.extend(
                    bits.read(bytes, chunk.len, MAX_MAGNITUDE)
                        .map_err(|f| fault(f, chunk.start))?,
                ),
                Segment::Moment1 => {
                    let entries = read_entries(bytes, chunk.len, keep, chunk.start)?;
                    let first = out.len();
                    out.resize(first + chunk.len, 0.0);
                    for (j, v) in entries {
                        out[first + usize::from(j)] = v;
                    }
                }
                Segment::Moment2 => {
                    read_codes(self.moments, bytes, chunk.len, chunk.start, &mut out)?
                }
            }
        }
        Ok(out)
    }
}

/// The parameter code of a `sign` or `sign2` upload (1 or 2 bits) or merged partition (4
/// bits).
fn sign_bits(code: ParamCode, merged: bool) -> Bits {
    match (code, merged) {
        (_, true) => Bits::Four,
        (ParamCode::Sign2, false) => Bits::Two,
        (ParamCode::Q4, false) => Bits::Four,
        _ => Bits::One,
    }
}

/// A [`Fault`] of the `sign` chunk at flat index `index`.
fn fault(f: Fault, index: u64) -> DeltaError {
    match f {
        Fault::Scale(value) => DeltaError::BadScale { index, value },
        Fault::TooLarge(value) => DeltaError::TooLarge { index, value },
        Fault::Padding => DeltaError::Padding { index },
        Fault::Code(at) => DeltaError::BadCode {
            index: index + at as u64,
        },
    }
}

/// `base` must hold exactly the object's parameters.
fn check_base(n: u64, place: Place, base: &[f32]) -> Result<(), DeltaError> {
    let expected = DeltaSpec::params_in(n, place);
    if base.len() as u64 != expected {
        return Err(DeltaError::BaseLength {
            expected,
            got: base.len() as u64,
        });
    }
    Ok(())
}

/// Writes the `keep` largest of `coefs` (ties to the lower index) as entries in index order.
fn write_top_k(
    coefs: &[f64],
    keep: usize,
    index: u64,
    out: &mut Vec<u8>,
) -> Result<(), DeltaError> {
    let k = keep.min(coefs.len());
    let mut order: Vec<usize> = (0..coefs.len()).collect();
    order.sort_by(|&a, &b| coefs[b].abs().total_cmp(&coefs[a].abs()).then(a.cmp(&b)));
    let mut kept: Vec<usize> = order[..k].to_vec();
    kept.sort_unstable();
    for j in kept {
        let value = coefs[j] as f32;
        if !value.is_finite() {
            return Err(DeltaError::NonFinite { index, value });
        }
        if value.abs() > MAX_MAGNITUDE {
            return Err(DeltaError::TooLarge { index, value });
        }
        out.push(u8::try_from(j).unwrap_or(u8::MAX));
        out.extend_from_slice(&bf16::from_f32(value).to_bits().to_le_bytes());
    }
    Ok(())
}

/// Reads and checks a chunk's `min(keep, len)` entries.
fn read_entries(
    bytes: &[u8],
    len: usize,
    keep: usize,
    index: u64,
) -> Result<Vec<(u8, f32)>, DeltaError> {
    let k = keep.min(len);
    let mut entries = Vec::with_capacity(k);
    let mut last: Option<u8> = None;
    for e in bytes.chunks_exact(ENTRY_BYTES as usize) {
        let j = e[0];
        if usize::from(j) >= len {
            return Err(DeltaError::IndexOutOfRange {
                index,
                value: j,
                len,
            });
        }
        if last.is_some_and(|l| j <= l) {
            return Err(DeltaError::UnorderedIndex { index, value: j });
        }
        last = Some(j);
        let value = bf16::from_bits(u16::from_le_bytes([e[1], e[2]])).to_f32();
        if !value.is_finite() {
            return Err(DeltaError::NonFinite { index, value });
        }
        if value.abs() > MAX_MAGNITUDE {
            return Err(DeltaError::TooLarge { index, value });
        }
        entries.push((j, value));
    }
    Ok(entries)
}

/// `top * 2^-(step * q)`, exactly (a power-of-two scaling; at most 2^-30).
fn scaled(top: f32, code: MomentCode, q: u8) -> f32 {
    let halvings = u32::from(code.step()) * u32::from(q);
    top * f32::from_bits((127 - halvings) << 23)
}

/// Writes a second-moment chunk: its top, then each value's code (the nearer of the two code
/// values around it), packed from the least significant bits of each byte.
fn write_codes(
    code: MomentCode,
    vals: &[f32],
    index: u64,
    out: &mut Vec<u8>,
) -> Result<(), DeltaError> {
    let top = vals.iter().fold(0f32, |m, &v| m.max(v));
    if top > MAX_SECOND_MOMENT {
        return Err(DeltaError::TooLarge { index, value: top });
    }
    out.extend_from_slice(&top.to_le_bytes());
    let q_of = |v: f32| -> u8 {
        let mut q = 0u8;
        while q < code.max_code() && scaled(top, code, q + 1) * code.midpoint() > v {
            q += 1;
        }
        if top == 0.0 { 0 } else { q }
    };
    bit_pack::pack(vals.iter().map(|&v| q_of(v)), code.width(), out);
    Ok(())
}

/// Reads and checks a second-moment chunk of `len` values.
fn read_codes(
    code: MomentCode,
    bytes: &[u8],
    len: usize,
    index: u64,
    out: &mut Vec<f32>,
) -> Result<(), DeltaError> {
    let top = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if !(0.0..=MAX_SECOND_MOMENT).contains(&top) {
        return Err(DeltaError::BadTop { index, value: top });
    }
    let codes = &bytes[4..];
    let mut table = [0f32; 16];
    for (q, value) in (0u8..).zip(table.iter_mut().take(1 << code.width())) {
        *value = scaled(top, code, q);
    }
    out.extend(bit_pack::codes(codes, code.width(), len).map(|q| table[usize::from(q)]));
    if !bit_pack::padding_is_clear(codes, code.width(), len) {
        return Err(DeltaError::Padding { index });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn place(start: u64, p: u64, merged: bool) -> Place {
        Place {
            start,
            params_len: p,
            merged,
        }
    }

    /// A flat state of `p` parameters (weights ~0.05, first moments ~1e-3, second moments
    /// over eight orders of magnitude) and a previous global state a small step away.
    /// `flat` encoded with `spec` at `at` and decoded again.
    fn coded(spec: DeltaSpec, flat: &[f32], at: Place, base: &[f32]) -> Vec<f32> {
        let bytes = spec.encode(flat, at, base).unwrap();
        spec.decode(&bytes, flat.len() as u64, at, base).unwrap()
    }

    fn state(p: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let base: Vec<f32> = (0..p).map(|_| rng.random_range(-0.1f32..0.1)).collect();
        let mut v: Vec<f32> = base
            .iter()
            .map(|g| g + rng.random_range(-1e-3f32..1e-3))
            .collect();
        v.extend((0..p).map(|_| rng.random_range(-2e-3f32..2e-3)));
        v.extend((0..p).map(|_| 10f32.powf(rng.random_range(-12.0f32..-4.0))));
        (v, base)
    }

    #[test]
    fn lengths_follow_the_chunk_grid() {
        let s = DeltaSpec::new(4, 2, 3).unwrap();
        // P = 10: params 0..10 as chunks 4,4,2 (6+6+6 bytes), moments 10..20 likewise (18),
        // second moments 20..30 as 4,4,2 (6+6+5).
        assert_eq!(s.encoded_len(30, place(0, 10, false)), 18 + 18 + 17);
        // Merged keeps 3: 9+9+6 per sparse segment.
        assert_eq!(s.encoded_len(30, place(0, 10, true)), 24 + 24 + 17);
        // An object from 7 to 23: params 7..10 (3 values: 6 bytes), m 10..20 (18), v 20..23
        // (4 + 2).
        assert_eq!(s.encoded_len(16, place(7, 10, false)), 6 + 18 + 6);
        // Ranges of an upload: 5..6 lies in chunk 4..8 (bytes 6..12); 9..13 covers 8..10 and
        // 10..14.
        let up = place(0, 10, false);
        assert_eq!(s.aligned(5..6, 30, up), 4..8);
        assert_eq!(s.byte_range(5..6, 30, up), 6..12);
        assert_eq!(s.aligned(9..13, 30, up), 8..14);
        assert_eq!(s.byte_range(9..13, 30, up), 12..24);
        assert_eq!(s.aligned(29..30, 30, up), 28..30);
        assert_eq!(s.byte_range(29..30, 30, up), 48..53);
        // P = 0: every value is a parameter.
        assert_eq!(s.encoded_len(10, place(3, 0, false)), 18);
        assert_eq!(DeltaSpec::params_in(10, place(3, 0, false)), 10);
        assert_eq!(DeltaSpec::params_in(16, place(7, 10, false)), 3);
        assert_eq!(DeltaSpec::params_in(5, place(20, 10, false)), 0);
    }

    #[test]
    fn specs_parse_and_print() {
        assert_eq!(DeltaSpec::parse("dct"), Some(Ok(DeltaSpec::DEFAULT)));
        assert_eq!(DeltaSpec::DEFAULT.to_string(), "dct");
        let s = DeltaSpec::parse("DCT:128:8").unwrap().unwrap();
        assert_eq!((s.chunk, s.keep, s.keep_merged), (128, 8, 16));
        assert_eq!(s.to_string(), "dct:128:8:16");
        assert_eq!(DeltaSpec::parse(&s.to_string()), Some(Ok(s)));
        assert!(DeltaSpec::parse("int8").is_none());
        assert_eq!(DeltaSpec::parse("sign"), Some(Ok(DeltaSpec::SIGN)));
        assert_eq!(DeltaSpec::SIGN.to_string(), "sign");
        let s = DeltaSpec::parse("Sign:32:2").unwrap().unwrap();
        assert_eq!(
            (s.params, s.chunk, s.keep, s.keep_merged),
            (ParamCode::Sign, 32, 2, 4)
        );
        assert_eq!(s.to_string(), "sign:32:2:4");
        assert!(matches!(DeltaSpec::parse("sign:1:1"), Some(Err(e)) if e.contains("sign chunk")));
        assert!(DeltaSpec::parse("signs").is_none());
        assert_eq!(DeltaSpec::parse("sign2"), Some(Ok(DeltaSpec::SIGN2)));
        assert_eq!(DeltaSpec::SIGN2.to_string(), "sign2");
        assert_eq!(DeltaSpec::parse("q4"), Some(Ok(DeltaSpec::Q4)));
        assert_eq!(DeltaSpec::Q4.to_string(), "q4");
        assert_eq!(DeltaSpec::parse("q4v2"), Some(Ok(DeltaSpec::Q4V2)));
        assert_eq!(DeltaSpec::Q4V2.to_string(), "q4v2");
        assert_eq!(DeltaSpec::Q4V2.name(), "q4v2");
        let s = DeltaSpec::parse("Q4V2:32:2").unwrap().unwrap();
        assert_eq!(
            (s.params, s.moments, s.chunk, s.keep, s.keep_merged),
            (ParamCode::Q4, MomentCode::Two, 32, 2, 4)
        );
        assert_eq!(s.to_string(), "q4v2:32:2:4");
        assert_eq!(DeltaSpec::parse(&s.to_string()), Some(Ok(s)));
        let s = DeltaSpec::parse("sign2v2").unwrap().unwrap();
        assert_eq!((s.params, s.moments), (ParamCode::Sign2, MomentCode::Two));
        assert!(matches!(DeltaSpec::parse("q4v2:1:1"), Some(Err(e)) if e.contains("q4v2 chunk")));
        assert!(DeltaSpec::parse("q4v3").is_none());
        assert!(DeltaSpec::parse("v2").is_none());
        let s = DeltaSpec::parse("Q4V2M4").unwrap().unwrap();
        assert_eq!(
            (s.params, s.moments, s.first_moments),
            (ParamCode::Q4, MomentCode::Two, FirstMomentCode::Four)
        );
        assert_eq!(s.to_string(), "q4v2m4");
        let s = DeltaSpec::parse("q4m4:32:2").unwrap().unwrap();
        assert_eq!(
            (s.moments, s.first_moments),
            (MomentCode::Four, FirstMomentCode::Four)
        );
        assert_eq!(s.to_string(), "q4m4:32:2:4");
        assert_eq!(DeltaSpec::parse(&s.to_string()), Some(Ok(s)));
        assert!(
            matches!(DeltaSpec::parse("q4v2m4:1:1"), Some(Err(e)) if e.contains("q4v2m4 chunk"))
        );
        let s = DeltaSpec::parse("Q4V2M2:128").unwrap().unwrap();
        assert_eq!(
            (s.params, s.moments, s.first_moments, s.chunk),
            (ParamCode::Q4, MomentCode::Two, FirstMomentCode::Two, 128)
        );
        assert_eq!(s.to_string(), "q4v2m2:128:4:8");
        assert_eq!(DeltaSpec::parse(&s.to_string()), Some(Ok(s)));
        assert!(DeltaSpec::parse("q4m3").is_none());
        assert!(DeltaSpec::parse("m4").is_none());
        for bad in [
            "dct:1:1",
            "dct:300:4",
            "dct:64:0",
            "dct:64:65",
            "dct:64:4:3",
            "dct:x",
        ] {
            assert!(matches!(DeltaSpec::parse(bad), Some(Err(_))), "{bad}");
        }
    }

    /// `m4`: every first moment in 4 bits (none zeroed, each within half a step of the
    /// chunk's scale `max / 7`), the parameters and second moments as without it; a bad
    /// first-moment scale or the code -8 is refused with the chunk's index.
    #[test]
    fn m4_first_moments_keep_every_value_within_half_a_step() {
        let p = 300usize;
        let (flat, base) = state(p, 7);
        let n = flat.len() as u64;
        for merged in [false, true] {
            let at = place(0, p as u64, merged);
            let m4 = DeltaSpec::parse("q4v2m4").unwrap().unwrap();
            let bytes = m4.encode(&flat, at, &base).unwrap();
            // 300 first moments: four chunks of 64 (4 + 32 bytes) and one of 44 (4 + 22),
            // where the top-k code keeps 4 (uploads) or 8 (merged) entries of 3 bytes.
            let k = if merged { 8 } else { 4 };
            let topk = DeltaSpec::Q4V2.encoded_len(n, at);
            assert_eq!(m4.encoded_len(n, at) - topk, 4 * 36 + 26 - 5 * 3 * k);
            assert_eq!(bytes.len() as u64, m4.encoded_len(n, at));
            let back = m4.decode(&bytes, n, at, &base).unwrap();
            let q4v2 = coded(DeltaSpec::Q4V2, &flat, at, &base);
            assert_eq!(back[..p], q4v2[..p]);
            assert_eq!(back[2 * p..], q4v2[2 * p..]);
            for (chunk, got) in flat[p..2 * p].chunks(64).zip(back[p..2 * p].chunks(64)) {
                let step = chunk.iter().fold(0f32, |m, &v| m.max(v.abs())) / 7.0;
                for (&x, &y) in chunk.iter().zip(got) {
                    assert!((x - y).abs() <= step / 2.0 * 1.0001, "{x} decoded as {y}");
                }
            }
        }
        let spec = DeltaSpec::parse("q4m4:4:1").unwrap().unwrap();
        let at = place(0, 4, false);
        let values = [
            0.1f32, 0.2, -0.1, 0.3, 1e-3, -2e-3, 5e-4, 0.0, 1e-6, 2e-6, 3e-6, 4e-6,
        ];
        let good = spec.encode(&values, at, &[0.0; 4]).unwrap();
        assert!(spec.decode(&good, 12, at, &[0.0; 4]).is_ok());
        // The first-moment chunk starts after the parameter chunk (4 + 2 bytes).
        for scale in [f32::NAN, -1.0, f32::INFINITY] {
            let mut bad = good.clone();
            bad[6..10].copy_from_slice(&scale.to_le_bytes());
            assert!(spec.decode(&bad, 12, at, &[0.0; 4]).is_err(), "{scale}");
        }
        let mut bad = good.clone();
        bad[10] = 0x08;
        assert!(spec.decode(&bad, 12, at, &[0.0; 4]).is_err());
    }

    /// `m2`: every first moment in 2 bits (two scales per chunk): its sign kept, decoded as
    /// the mean magnitude of its chunk's small or large values (split at the mean magnitude);
    /// the parameters and second moments exactly as without it.
    #[test]
    fn m2_first_moments_keep_every_sign_and_a_class_mean_magnitude() {
        let p = 300usize;
        let (flat, base) = state(p, 8);
        let n = flat.len() as u64;
        for merged in [false, true] {
            let at = place(0, p as u64, merged);
            let m2 = DeltaSpec::parse("q4v2m2").unwrap().unwrap();
            let bytes = m2.encode(&flat, at, &base).unwrap();
            // 300 first moments: four chunks of 64 (8 + 16 bytes) and one of 44 (8 + 11).
            let m4 = DeltaSpec::parse("q4v2m4").unwrap().unwrap();
            assert_eq!(
                m4.encoded_len(n, at) - m2.encoded_len(n, at),
                4 * (36 - 24) + (26 - 19)
            );
            assert_eq!(bytes.len() as u64, m2.encoded_len(n, at));
            let back = m2.decode(&bytes, n, at, &base).unwrap();
            let q4v2 = coded(DeltaSpec::Q4V2, &flat, at, &base);
            assert_eq!(back[..p], q4v2[..p]);
            assert_eq!(back[2 * p..], q4v2[2 * p..]);
            for (chunk, got) in flat[p..2 * p].chunks(64).zip(back[p..2 * p].chunks(64)) {
                let t = chunk.iter().map(|v| v.abs()).sum::<f32>() / chunk.len() as f32;
                let mean = |large: bool| {
                    let class: Vec<f32> = chunk
                        .iter()
                        .map(|v| v.abs())
                        .filter(|&a| (a > t) == large)
                        .collect();
                    class.iter().sum::<f32>() / class.len().max(1) as f32
                };
                for (&x, &y) in chunk.iter().zip(got) {
                    let want = mean(x.abs() > t);
                    assert!(x == 0.0 || (y < 0.0) == (x < 0.0), "{x} decoded as {y}");
                    assert!(
                        (y.abs() - want).abs() <= want * 1e-3,
                        "{x}: {y}, want +-{want}"
                    );
                }
            }
        }
        // A forged first-moment scale (either of the two) is refused.
        let spec = DeltaSpec::parse("q4v2m2:4:1").unwrap().unwrap();
        let at = place(0, 4, false);
        let values = [
            0.1f32, 0.2, -0.1, 0.3, 1e-3, -2e-3, 5e-4, 0.0, 1e-6, 2e-6, 3e-6, 4e-6,
        ];
        let good = spec.encode(&values, at, &[0.0; 4]).unwrap();
        assert!(spec.decode(&good, 12, at, &[0.0; 4]).is_ok());
        // The first-moment chunk starts after the parameter chunk (4 + 2 bytes).
        for (offset, scale) in [(6, f32::NAN), (6, -1.0), (10, f32::INFINITY), (10, 1e30)] {
            let mut bad = good.clone();
            bad[offset..offset + 4].copy_from_slice(&scale.to_le_bytes());
            assert!(spec.decode(&bad, 12, at, &[0.0; 4]).is_err(), "{scale}");
        }
    }

    /// `q4v2`: the parameters and first moments exactly as `q4` codes them, the second
    /// moments in 2 bits, each the nearer of the two code values around it, and `top / 64` for
    /// everything smaller.
    #[test]
    fn v2_second_moments_round_to_the_nearer_code_value() {
        let p = 300usize;
        let (flat, base) = state(p, 6);
        let n = flat.len() as u64;
        for merged in [false, true] {
            let at = place(0, p as u64, merged);
            let v2 = DeltaSpec::Q4V2;
            let bytes = v2.encode(&flat, at, &base).unwrap();
            // 300 second moments: four chunks of 64 (4 + 16 bytes) and one of 44 (4 + 11).
            let q4_len = DeltaSpec::Q4.encoded_len(n, at);
            assert_eq!(q4_len - v2.encoded_len(n, at), 4 * (36 - 20) + (26 - 15));
            assert_eq!(bytes.len() as u64, v2.encoded_len(n, at));
            let back = v2.decode(&bytes, n, at, &base).unwrap();
            let q4 = coded(DeltaSpec::Q4, &flat, at, &base);
            assert_eq!(back[..2 * p], q4[..2 * p]);
            for (chunk, got) in flat[2 * p..].chunks(64).zip(back[2 * p..].chunks(64)) {
                let top = chunk.iter().fold(0f32, |m, &v| m.max(v));
                for (&x, &y) in chunk.iter().zip(got) {
                    assert_nearest(x, y, top, 4.0, 3);
                }
            }
        }
        // A second-moment chunk of 3 values: the top, then one byte of which bits 6 and 7
        // are padding; a bad top is refused like the 4-bit code's.
        let spec = DeltaSpec::parse("q4v2:3:1").unwrap().unwrap();
        let at = place(0, 1, false);
        let values = [0.5f32, 0.1, 1e-3];
        let good = spec.encode(&values, at, &[0.4]).unwrap();
        assert_eq!(good.len(), 5 + 3 + 5);
        assert!(spec.decode(&good, 3, at, &[0.4]).is_ok());
        let last = good.len() - 1;
        let mut bad = good.clone();
        bad[last] |= 0x40;
        assert_eq!(
            spec.decode(&bad, 3, at, &[0.4]),
            Err(DeltaError::Padding { index: 2 })
        );
        for top in [f32::NAN, -1.0, f32::INFINITY, 1e30] {
            let mut bad = good.clone();
            bad[last - 4..last].copy_from_slice(&top.to_le_bytes());
            assert!(
                matches!(
                    spec.decode(&bad, 3, at, &[0.4]),
                    Err(DeltaError::BadTop { index: 2, .. })
                ),
                "{top}"
            );
        }
    }

    #[test]
    fn round_trips_keep_the_largest_coefficients() {
        let p = 300usize;
        let (flat, base) = state(p, 1);
        let spec = DeltaSpec::new(64, 8, 16).unwrap();
        let at = place(0, p as u64, false);
        let bytes = spec.encode(&flat, at, &base).unwrap();
        assert_eq!(bytes.len() as u64, spec.encoded_len(flat.len() as u64, at));
        let back = spec.decode(&bytes, flat.len() as u64, at, &base).unwrap();
        assert_eq!(back.len(), flat.len());
        // Parameters: the decoded change is the projection of the true change onto the kept
        // coefficients, so its error is smaller than the change itself.
        let err: f32 = (0..p).map(|i| (back[i] - flat[i]).powi(2)).sum();
        let norm: f32 = (0..p).map(|i| (flat[i] - base[i]).powi(2)).sum();
        assert!(err < norm, "{err} {norm}");
        // With every coefficient kept, the round trip is exact to bf16's precision.
        let dense = DeltaSpec::new(64, 64, 64).unwrap();
        let back = coded(dense, &flat, at, &base);
        for i in 0..p {
            assert!(
                (back[i] - flat[i]).abs() < 2e-5,
                "{i}: {} {}",
                back[i],
                flat[i]
            );
        }
        // First moments keep their largest values exactly (to bf16), zero elsewhere.
        for (chunk, got) in flat[p..2 * p].chunks(64).zip(back[p..2 * p].chunks(64)) {
            for (&x, &y) in chunk.iter().zip(got) {
                assert!((x - y).abs() <= x.abs() / 256.0, "{x} {y}");
            }
        }
        let sparse = spec.decode(&bytes, flat.len() as u64, at, &base).unwrap();
        for (chunk, got) in flat[p..2 * p].chunks(64).zip(sparse[p..2 * p].chunks(64)) {
            let kept = got.iter().filter(|v| **v != 0.0).count();
            assert!(kept <= 8);
            let smallest_kept = got
                .iter()
                .filter(|v| **v != 0.0)
                .fold(f32::MAX, |m, v| m.min(v.abs()));
            for (&x, &y) in chunk.iter().zip(got) {
                if y == 0.0 {
                    assert!(
                        x.abs() <= smallest_kept * 1.01,
                        "{x} dropped, {smallest_kept} kept"
                    );
                }
            }
        }
        // Second moments: the nearer of the two code values around each.
        for (chunk, got) in flat[2 * p..].chunks(64).zip(sparse[2 * p..].chunks(64)) {
            let top = chunk.iter().fold(0f32, |m, &v| m.max(v));
            for (&x, &y) in chunk.iter().zip(got) {
                assert_nearest(x, y, top, 2.0, 15);
            }
        }
    }

    /// `y`, the decoded second moment `x` of a chunk topped by `top` whose code values are
    /// `top / ratio^q` for `q` in `0..=max_q`, is the code value nearer to `x` (the larger on
    /// a tie), or the smallest code value when `x` is below it.
    fn assert_nearest(x: f32, y: f32, top: f32, ratio: f32, max_q: i32) {
        let floor = top / ratio.powi(max_q);
        if x <= floor {
            assert_eq!(y, floor, "{x} below the smallest code value (top {top})");
            return;
        }
        let above = (0..=max_q)
            .map(|q| top / ratio.powi(q))
            .rfind(|&a| a >= x)
            .unwrap_or(top);
        let below = above / ratio;
        let want = if x - below < above - x { below } else { above };
        assert_eq!(y, want, "{x} between {below} and {above} (top {top})");
    }

    #[test]
    fn ranges_decode_like_the_whole_object() {
        let p = 300u64;
        let (flat, base) = state(p as usize, 2);
        let n = flat.len() as u64;
        for (spec, r) in [ParamCode::Dct, ParamCode::Sign]
            .into_iter()
            .map(|c| DeltaSpec::with_code(c, 16, 3, 6).unwrap())
            .flat_map(|s| {
                [0..1, 5..40, 290..310, 299..601, 600..900, 899..900, 17..18].map(|r| (s, r))
            })
        {
            let at = place(0, p, false);
            let bytes = spec.encode(&flat, at, &base).unwrap();
            let whole = spec.decode(&bytes, n, at, &base).unwrap();
            let a = spec.aligned(r.clone(), n, at);
            let br = spec.byte_range(r.clone(), n, at);
            let sub = place(a.start, p, false);
            let pb = (a.start.min(p) as usize)..(a.end.min(p) as usize);
            let got = spec
                .decode(
                    &bytes[br.start as usize..br.end as usize],
                    a.end - a.start,
                    sub,
                    &base[pb],
                )
                .unwrap();
            assert_eq!(got, whole[a.start as usize..a.end as usize], "{spec} {r:?}");
        }
    }

    #[test]
    fn sign_lengths_follow_the_chunk_grid() {
        let s = DeltaSpec::with_code(ParamCode::Sign, 4, 2, 3).unwrap();
        // P = 10: params 0..10 as chunks 4,4,2, each a 4-byte scale and one byte of sign bits
        // (15); first moments top-2 (18); second moments 4,4,2 (6 + 6 + 5).
        assert_eq!(s.encoded_len(30, place(0, 10, false)), 15 + 18 + 17);
        // Merged: parameters in 4 bits (6 + 6 + 5), first moments top-3 (24).
        assert_eq!(s.encoded_len(30, place(0, 10, true)), 17 + 24 + 17);
        // The default: 12 bytes per 64 parameters in an upload, as dct's default; sign2 24.
        let p = 64 * 100;
        let up = place(0, p, false);
        let dct = DeltaSpec::DEFAULT.encoded_len(3 * p, up);
        assert_eq!(DeltaSpec::SIGN.encoded_len(3 * p, up), dct);
        assert_eq!(DeltaSpec::SIGN2.encoded_len(3 * p, up), dct + 12 * 100);
        assert_eq!(DeltaSpec::Q4.encoded_len(3 * p, up), dct + 24 * 100);
        let up = place(0, 10, false);
        assert_eq!(s.aligned(5..6, 30, up), 4..8);
        assert_eq!(s.byte_range(5..6, 30, up), 5..10);
    }

    /// The sign code sends every parameter's change: in a round trip each decoded change has
    /// the true sign, and with error feedback what a run of uploads delivers converges to what
    /// the miner's state moved, which a top-k code only does for the coefficients it keeps.
    #[test]
    fn the_sign_code_delivers_every_change_with_error_feedback() {
        let p = 640usize;
        let (flat, base) = state(p, 7);
        let at = place(0, p as u64, false);
        let back = coded(DeltaSpec::SIGN, &flat, at, &base);
        for i in 0..p {
            let (d, e) = (flat[i] - base[i], back[i] - base[i]);
            assert!(d == 0.0 || (d > 0.0) == (e > 0.0), "{i}: {d} sent as {e}");
        }
        // A miner whose parameters move by the same `d` between uploads: after T uploads with
        // error feedback, the receivers have summed T x d less what is still held back.
        let d: Vec<f32> = (0..p).map(|i| flat[i] - base[i]).collect();
        for spec in [
            DeltaSpec::SIGN,
            DeltaSpec::SIGN2,
            DeltaSpec::Q4,
            DeltaSpec::DEFAULT,
        ] {
            let mut residual = vec![0f32; p];
            let mut delivered = vec![0f64; p];
            let rounds = 200;
            for _ in 0..rounds {
                let mut x = base.clone();
                for i in 0..p {
                    x[i] += d[i] + residual[i];
                }
                let at = place(0, 0, false);
                let sent = spec
                    .decode(&spec.encode(&x, at, &base).unwrap(), p as u64, at, &base)
                    .unwrap();
                for i in 0..p {
                    let s = sent[i] - base[i];
                    delivered[i] += f64::from(s);
                    residual[i] = x[i] - base[i] - s;
                }
            }
            let (mut err, mut norm) = (0f64, 0f64);
            for i in 0..p {
                let want = f64::from(d[i]) * f64::from(rounds);
                err += (delivered[i] - want).powi(2);
                norm += want.powi(2);
            }
            let rel = (err / norm).sqrt();
            if spec != DeltaSpec::DEFAULT {
                assert!(rel < 0.02, "{spec} delivered {rel} off");
            } else {
                // dct with error feedback converges too, more slowly (4 of 64 coefficients).
                assert!(rel < 0.2, "dct delivered {rel} off");
            }
        }
    }

    #[test]
    fn partitions_encode_from_their_own_start() {
        // A merged partition 250..700 of P = 300 cuts its chunks at 250, 266, ..., 300, ...
        let p = 300u64;
        let (flat, base) = state(p as usize, 3);
        let spec = DeltaSpec::new(16, 3, 6).unwrap();
        let at = place(250, p, true);
        let part = &flat[250..700];
        let bytes = spec.encode(part, at, &base[250..300]).unwrap();
        assert_eq!(bytes.len() as u64, spec.encoded_len(450, at));
        let back = spec.decode(&bytes, 450, at, &base[250..300]).unwrap();
        assert_eq!(back.len(), 450);
        // Deterministic: the same input gives the same bytes.
        assert_eq!(bytes, spec.encode(part, at, &base[250..300]).unwrap());
    }

    /// Hostile bytes: each is refused with an error that says what and where.
    #[test]
    fn hostile_payloads_are_refused() {
        let spec = DeltaSpec::new(4, 2, 2).unwrap();
        let p = 8u64;
        let at = place(0, p, false);
        let (flat, base) = {
            let (f, b) = state(8, 4);
            (f, b)
        };
        let good = spec.encode(&flat, at, &base).unwrap();
        let n = flat.len() as u64;
        assert!(spec.decode(&good, n, at, &base).is_ok());
        let decode = |bytes: &[u8]| spec.decode(bytes, n, at, &base);
        // Chunk 0's entries sit at bytes 0..6: (index, bf16) x 2.
        let mut bad = good.clone();
        bad[0] = 4;
        bad[3] = 5;
        assert_eq!(
            decode(&bad),
            Err(DeltaError::IndexOutOfRange {
                index: 0,
                value: 4,
                len: 4
            })
        );
        let mut bad = good.clone();
        bad[3] = bad[0];
        assert!(matches!(
            decode(&bad),
            Err(DeltaError::UnorderedIndex { index: 0, .. })
        ));
        let mut bad = good.clone();
        (bad[0], bad[3]) = (3, 1);
        assert!(matches!(
            decode(&bad),
            Err(DeltaError::UnorderedIndex { index: 0, value: 1 })
        ));
        for (bits, name) in [(0x7FC0u16, "NaN"), (0x7F80, "inf"), (0x7F00, "huge")] {
            let mut bad = good.clone();
            bad[4..6].copy_from_slice(&bits.to_le_bytes());
            let err = decode(&bad).unwrap_err();
            assert!(
                matches!(
                    err,
                    DeltaError::NonFinite { index: 0, .. } | DeltaError::TooLarge { index: 0, .. }
                ),
                "{name}: {err}"
            );
        }
        // Second moments start at flat index 16 (byte 24): top, then codes.
        let v0 = 24;
        for (top, name) in [
            (f32::NAN, "NaN"),
            (-1.0, "negative"),
            (f32::INFINITY, "inf"),
            (1e30, "huge"),
        ] {
            let mut bad = good.clone();
            bad[v0..v0 + 4].copy_from_slice(&top.to_le_bytes());
            assert!(
                matches!(decode(&bad), Err(DeltaError::BadTop { index: 16, .. })),
                "{name}"
            );
        }
        assert!(matches!(
            decode(&good[..good.len() - 1]),
            Err(DeltaError::Length { .. })
        ));
        assert!(matches!(
            spec.decode(&good, n, at, &base[..7]),
            Err(DeltaError::BaseLength {
                expected: 8,
                got: 7
            })
        ));
        let mut nan_base = base.clone();
        nan_base[2] = f32::NAN;
        assert!(matches!(
            spec.decode(&good, n, at, &nan_base),
            Err(DeltaError::NonFinite { index: 2, .. })
        ));
        let mut inf_base = base.clone();
        inf_base[5] = f32::NEG_INFINITY;
        assert!(matches!(
            spec.decode(&good, n, at, &inf_base),
            Err(DeltaError::NonFinite { index: 5, .. })
        ));
        // Odd chunk: a non-zero padding nibble.
        let odd = DeltaSpec::new(3, 1, 1).unwrap();
        let at3 = place(0, 1, false);
        let v = [0.5f32, 0.1, 1e-3];
        let enc = odd.encode(&v, at3, &[0.4]).unwrap();
        // Second moment chunk of 1 value at the end: top + 1 byte of which the high nibble is
        // padding.
        let mut bad = enc.clone();
        let last = bad.len() - 1;
        bad[last] |= 0x10;
        assert_eq!(
            odd.decode(&bad, 3, at3, &[0.4]),
            Err(DeltaError::Padding { index: 2 })
        );
        assert!(odd.decode(&enc, 3, at3, &[0.4]).is_ok());
    }

    /// Hostile `sign` bytes: each is refused naming the chunk or the value.
    #[test]
    fn hostile_sign_payloads_are_refused() {
        let (flat, base) = state(8, 4);
        let n = flat.len() as u64;
        for (code, merged) in [
            (ParamCode::Sign, false),
            (ParamCode::Sign, true),
            (ParamCode::Sign2, false),
            (ParamCode::Q4, false),
        ] {
            let spec = DeltaSpec::with_code(code, 4, 2, 2).unwrap();
            let at = place(0, 8, merged);
            let good = spec.encode(&flat, at, &base).unwrap();
            let decode = |bytes: &[u8]| spec.decode(bytes, n, at, &base);
            assert!(decode(&good).is_ok());
            // Chunk 1 (flat index 4) starts after chunk 0's scale(s) and codes.
            let c1 = spec.chunk_bytes(4, Segment::Params, merged) as usize;
            for scale in [f32::NAN, -1.0, f32::INFINITY, 1e13] {
                let mut bad = good.clone();
                bad[c1..c1 + 4].copy_from_slice(&scale.to_le_bytes());
                assert!(
                    matches!(decode(&bad), Err(DeltaError::BadScale { index: 4, .. })),
                    "{scale}: {:?}",
                    decode(&bad)
                );
            }
            if merged {
                // Value 5 sits in the high nibble of chunk 1's first code byte.
                let mut bad = good.clone();
                bad[c1 + 4] = (bad[c1 + 4] & 0x0F) | 0x80;
                assert_eq!(decode(&bad), Err(DeltaError::BadCode { index: 5 }));
            }
        }
        // A chunk of 3 values: bits 3..8 of its sign byte are padding.
        let at = place(0, 3, false);
        let odd = DeltaSpec::with_code(ParamCode::Sign, 3, 1, 1).unwrap();
        let (flat, base) = state(3, 5);
        let mut bad = odd.encode(&flat, at, &base).unwrap();
        bad[4] |= 0x20;
        assert_eq!(
            odd.decode(&bad, 9, at, &base),
            Err(DeltaError::Padding { index: 0 })
        );
        // A change too large to carry is refused when encoding.
        assert!(matches!(
            DeltaSpec::SIGN.encode(&[1e13], place(0, 0, false), &[0.0]),
            Err(DeltaError::TooLarge { index: 0, .. })
        ));
    }

    #[test]
    fn encoding_refuses_what_it_cannot_carry() {
        let spec = DeltaSpec::DEFAULT;
        let at = place(0, 0, false);
        assert!(matches!(
            spec.encode(&[1e13], at, &[0.0]),
            Err(DeltaError::TooLarge { index: 0, .. })
        ));
        assert!(matches!(
            spec.encode(&[1.0], at, &[f32::INFINITY]),
            Err(DeltaError::NonFinite { index: 0, .. })
        ));
        assert!(matches!(
            spec.encode(&[f32::MAX], at, &[-f32::MAX]),
            Err(DeltaError::NonFinite { index: 0, .. })
        ));
    }

    /// Random bytes, random base: whatever decodes is finite, nothing panics.
    #[test]
    fn random_bytes_never_decode_to_non_finite_values() {
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        let mut decoded = 0;
        for i in 0..3_000u64 {
            let chunk = rng.random_range(2..40u16);
            // Half the payloads keep one entry per chunk and get index bytes of 0, so the
            // value checks are reached too (random indices mostly fail the order check).
            let one = i % 2 == 0;
            let spec = if one {
                DeltaSpec::new(chunk, 1, 1).unwrap()
            } else {
                let k = rng.random_range(1..=chunk);
                DeltaSpec::new(chunk, k, rng.random_range(k..=chunk)).unwrap()
            };
            let moments = if rng.random() {
                MomentCode::Two
            } else {
                MomentCode::Four
            };
            let spec = DeltaSpec { moments, ..spec };
            let p = rng.random_range(0..200u64);
            let at = place(i % 500, p, rng.random());
            let n = rng.random_range(1..700u64);
            let len = spec.encoded_len(n, at) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            if one {
                let sparse = 3 * DeltaSpec::params_in(n, at).div_ceil(u64::from(chunk)) as usize;
                for b in bytes.iter_mut().take(sparse).step_by(3) {
                    *b = 0;
                }
            }
            let base: Vec<f32> = (0..DeltaSpec::params_in(n, at))
                .map(|_| {
                    if one {
                        rng.random_range(-1e3f32..1e3)
                    } else {
                        f32::from_bits(rng.random())
                    }
                })
                .collect();
            if let Ok(values) = spec.decode(&bytes, n, at, &base) {
                decoded += 1;
                assert_eq!(values.len() as u64, n);
                assert!(values.iter().all(|v| v.is_finite()));
            }
        }
        assert!(decoded > 0, "no random payload decoded at all");
    }
}
