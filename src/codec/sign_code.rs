//! Dense codes of one chunk of a parameter change, used by the `sign` merge format of
//! [`super::merge_delta`]: every value of the chunk is sent, each in a few bits, with one
//! `f32` scale for the chunk.
//!
//! ```text
//! 1-bit (uploads)            f32 scale s = mean |d|, then ceil(L / 8) bytes of sign bits:
//!                            bit i (byte i / 8, bit i % 8 from the least significant) is 1
//!                            when d_i < 0; decoded as -s or +s
//! 2-bit (uploads)            f32 lo, f32 hi, then ceil(L / 4) bytes of 2-bit codes (value i
//!                            in bits 2(i % 4) and 2(i % 4) + 1 of byte i / 4): the low bit is
//!                            the sign, the high bit says |d_i| > mean |d|; decoded as +-lo or
//!                            +-hi, the mean magnitude of the small and of the large values
//! 4-bit (merged partitions)  f32 scale s = max |d| / 7, then ceil(L / 2) bytes of codes
//!                            q_i = round(d_i / s) in -7..=7, 4-bit two's complement, value i
//!                            in the low nibble of byte i / 2 when i is even, the high nibble
//!                            when odd; decoded as q_i * s
//! ```
//!
//! The sign code with the mean magnitude as its scale is the least-squares 1-bit code of a
//! chunk (as in signSGD with error feedback and 1-bit Adam): what it leaves out goes back into
//! the miner's next upload. Merged partitions average several such uploads, which no longer
//! have one magnitude, so they get 4 bits.
//!
//! Decoding refuses a scale that is NaN, negative, infinite or above the caller's limit, a
//! set padding bit, and the 4-bit code -8 (never written). Nothing here knows flat indices:
//! a [`Fault`] says what is wrong and the caller names the place.

use super::bit_pack;

/// What is wrong with a coded chunk.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Fault {
    /// A scale that is NaN, negative, infinite or above the limit (the value found).
    Scale(f32),
    /// A finite change too large to carry (the value, when encoding).
    TooLarge(f32),
    /// A bit or nibble past the chunk's end that is not zero.
    Padding,
    /// The 4-bit code -8 at this chunk-local offset.
    Code(usize),
}

/// Bits per value of a code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bits {
    /// Sign times the chunk's mean magnitude.
    One,
    /// Sign times the mean magnitude of the values below or above the chunk's mean magnitude.
    Two,
    /// Symmetric round-to-nearest in `-7..=7` times `max / 7`.
    Four,
}

/// The most negative 4-bit code, which the symmetric code never writes.
const NIBBLE_MIN: u8 = 0x8;

impl Bits {
    /// Bytes of a chunk of `len` values.
    pub(crate) fn chunk_bytes(self, len: u64) -> u64 {
        let scales = if self == Bits::Two { 8 } else { 4 };
        scales + bit_pack::packed_len(len, self.width())
    }

    /// Bits per value.
    fn width(self) -> usize {
        match self {
            Bits::One => 1,
            Bits::Two => 2,
            Bits::Four => 4,
        }
    }

    /// Writes the chunk `d` (finite values); its scales must be at most `limit`.
    pub(crate) fn write(self, d: &[f32], limit: f32, out: &mut Vec<u8>) -> Result<(), Fault> {
        // The scales, and each value's code from them.
        let t = mean_abs(d, |_| true);
        let scales = match self {
            Bits::One => vec![t],
            Bits::Two => vec![mean_abs(d, |a| a <= t), mean_abs(d, |a| a > t)],
            Bits::Four => vec![d.iter().fold(0f32, |m, v| m.max(v.abs())) / 7.0],
        };
        if let Some(&bad) = scales.iter().find(|s| !s.is_finite() || **s > limit) {
            return Err(Fault::TooLarge(bad));
        }
        let code = |v: f32| -> u8 {
            match self {
                Bits::One => u8::from(v < 0.0),
                Bits::Two => u8::from(v < 0.0) | (u8::from(v.abs() > t) << 1),
                Bits::Four => {
                    let q = if scales[0] > 0.0 {
                        (v / scales[0]).round().clamp(-7.0, 7.0) as i8
                    } else {
                        0
                    };
                    (q as u8) & 0x0F
                }
            }
        };
        for scale in &scales {
            out.extend_from_slice(&scale.to_le_bytes());
        }
        bit_pack::pack(d.iter().map(|&v| code(v)), self.width(), out);
        Ok(())
    }

    /// Reads a chunk of `len` values from exactly [`chunk_bytes`](Self::chunk_bytes)`(len)`
    /// bytes; its scales must be at most `limit`.
    pub(crate) fn read(self, bytes: &[u8], len: usize, limit: f32) -> Result<Vec<f32>, Fault> {
        let count = if self == Bits::Two { 2 } else { 1 };
        let mut scales = [0f32; 2];
        for (k, scale) in scales.iter_mut().take(count).enumerate() {
            let at = 4 * k;
            *scale = f32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
            if !(0.0..=limit).contains(scale) {
                return Err(Fault::Scale(*scale));
            }
        }
        let codes = &bytes[4 * count..];
        let w = self.width();
        // Each code's value, looked up (a chunk holds many values and few codes).
        let mut table = [0f32; 16];
        for (c, value) in (0u8..).zip(table.iter_mut().take(1 << w)) {
            *value = match self {
                Bits::One => {
                    if c == 1 {
                        -scales[0]
                    } else {
                        scales[0]
                    }
                }
                Bits::Two => {
                    let magnitude = scales[usize::from(c >> 1)];
                    if c & 1 == 1 { -magnitude } else { magnitude }
                }
                // Sign-extend the nibble.
                Bits::Four => f32::from(((c << 4) as i8) >> 4) * scales[0],
            };
        }
        let mut out = Vec::with_capacity(len);
        for (i, c) in bit_pack::codes(codes, w, len).enumerate() {
            if self == Bits::Four && c == NIBBLE_MIN {
                return Err(Fault::Code(i));
            }
            out.push(table[usize::from(c)]);
        }
        if !bit_pack::padding_is_clear(codes, w, len) {
            return Err(Fault::Padding);
        }
        Ok(out)
    }
}

/// Mean magnitude of the values of `d` that `pick` selects (0 when none is).
fn mean_abs(d: &[f32], pick: impl Fn(f32) -> bool) -> f32 {
    let (sum, n) = d
        .iter()
        .map(|v| v.abs())
        .filter(|&a| pick(a))
        .fold((0f64, 0u32), |(s, n), a| (s + f64::from(a), n + 1));
    if n == 0 {
        0.0
    } else {
        (sum / f64::from(n)) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(bits: Bits, d: &[f32]) -> Vec<f32> {
        let mut out = Vec::new();
        bits.write(d, 1e12, &mut out).unwrap();
        assert_eq!(out.len() as u64, bits.chunk_bytes(d.len() as u64));
        bits.read(&out, d.len(), 1e12).unwrap()
    }

    #[test]
    fn the_sign_code_keeps_signs_and_the_mean_magnitude() {
        let d = [0.5f32, -0.25, 0.0, -1.0, 0.125, 0.75, -0.5, 0.25, -0.125];
        let back = round_trip(Bits::One, &d);
        let mean = d.iter().map(|v| v.abs()).sum::<f32>() / d.len() as f32;
        for (&x, &y) in d.iter().zip(&back) {
            assert_eq!(y.abs(), mean);
            assert_eq!(y < 0.0, x < 0.0, "{x} decoded {y}");
        }
        // Of all codes sign x s, the mean magnitude leaves the least squared error.
        let err = |s: f32| -> f32 {
            d.iter()
                .map(|&x| (x - if x < 0.0 { -s } else { s }).powi(2))
                .sum()
        };
        assert!(err(mean) < err(mean * 1.1) && err(mean) < err(mean * 0.9));
    }

    #[test]
    fn the_two_bit_code_keeps_signs_and_two_magnitudes() {
        let d = [0.5f32, -0.25, 0.0, -1.0, 0.125, 0.75, -0.5, 0.25, -0.125];
        let back = round_trip(Bits::Two, &d);
        let t = d.iter().map(|v| v.abs()).sum::<f32>() / d.len() as f32;
        let mean = |big: bool| {
            let v: Vec<f32> = d
                .iter()
                .map(|v| v.abs())
                .filter(|&a| (a > t) == big)
                .collect();
            v.iter().sum::<f32>() / v.len() as f32
        };
        for (&x, &y) in d.iter().zip(&back) {
            assert_eq!(y < 0.0, x < 0.0, "{x} decoded {y}");
            assert!(
                (y.abs() - mean(x.abs() > t)).abs() < 1e-7,
                "{x} decoded {y}"
            );
        }
        // Closer than the 1-bit code.
        let err = |b: &[f32]| -> f32 { d.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum() };
        assert!(err(&back) < err(&round_trip(Bits::One, &d)) / 2.0);
    }

    #[test]
    fn the_four_bit_code_is_within_half_a_step() {
        let d: Vec<f32> = (0..13).map(|i| (i as f32 - 6.3) * 0.01).collect();
        let back = round_trip(Bits::Four, &d);
        let step = d.iter().fold(0f32, |m, v| m.max(v.abs())) / 7.0;
        for (&x, &y) in d.iter().zip(&back) {
            assert!(
                (x - y).abs() <= step * 0.5 * (1.0 + 1e-5),
                "{x} decoded {y}"
            );
        }
        // The largest magnitude decodes to itself (to rounding).
        assert!((back[0] - d[0]).abs() < 1e-7);
        assert_eq!(round_trip(Bits::Four, &[0.0; 3]), vec![0.0; 3]);
        assert_eq!(round_trip(Bits::One, &[0.0; 3]), vec![0.0; 3]);
        assert_eq!(round_trip(Bits::Two, &[0.0; 3]), vec![0.0; 3]);
    }

    #[test]
    fn hostile_chunks_are_refused() {
        let mut good = Vec::new();
        Bits::One.write(&[0.1, -0.2, 0.3], 1e12, &mut good).unwrap();
        for scale in [f32::NAN, -1.0, f32::INFINITY, 1e13] {
            let mut bad = good.clone();
            bad[..4].copy_from_slice(&scale.to_le_bytes());
            assert!(matches!(
                Bits::One.read(&bad, 3, 1e12),
                Err(Fault::Scale(_))
            ));
        }
        let mut bad = good.clone();
        bad[4] |= 0x08;
        assert_eq!(Bits::One.read(&bad, 3, 1e12), Err(Fault::Padding));

        let mut good = Vec::new();
        Bits::Two.write(&[0.1, -0.2, 0.3], 1e12, &mut good).unwrap();
        for at in [0, 4] {
            let mut bad = good.clone();
            bad[at..at + 4].copy_from_slice(&(-1.0f32).to_le_bytes());
            assert_eq!(Bits::Two.read(&bad, 3, 1e12), Err(Fault::Scale(-1.0)));
        }
        let mut bad = good.clone();
        bad[8] |= 0x40;
        assert_eq!(Bits::Two.read(&bad, 3, 1e12), Err(Fault::Padding));

        let mut good = Vec::new();
        Bits::Four
            .write(&[0.1, -0.2, 0.3], 1e12, &mut good)
            .unwrap();
        let mut bad = good.clone();
        bad[4] = (bad[4] & 0xF0) | NIBBLE_MIN;
        assert_eq!(Bits::Four.read(&bad, 3, 1e12), Err(Fault::Code(0)));
        let mut bad = good.clone();
        bad[5] |= 0x10;
        assert_eq!(Bits::Four.read(&bad, 3, 1e12), Err(Fault::Padding));
        assert!(matches!(
            Bits::Four.write(&[1e20], 1e12, &mut Vec::new()),
            Err(Fault::TooLarge(_))
        ));
    }
}
