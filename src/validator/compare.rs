//! Comparing a replayed tensor with the one a miner uploaded: the magnitude ratio and the
//! cosine similarity (the two tests of the reference validator, DESIGN.md section 8).
//!
//! Both are accumulated in `f64` over chunks ([`Comparison::add`]), so a large tensor or a
//! whole section state can be compared piece by piece without holding either side whole.

use serde::{Deserialize, Serialize};

use crate::api::Thresholds;

/// Running sums for comparing a vector `a` (the validator's) with `b` (the miner's).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Comparison {
    dot: f64,
    norm_a_sq: f64,
    norm_b_sq: f64,
    len: u64,
    /// Non-finite values met in `b` (a miner's upload may hold any bytes).
    nonfinite: u64,
}

/// The two figures of a finished [`Comparison`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Similarity {
    /// `a . b / (|a| |b|)`; 1 when both are zero, 0 when exactly one is (or `b` is not finite).
    pub cosine: f64,
    /// `min(|a|, |b|) / max(|a|, |b|)`; 1 when both are zero, 0 when `b` is not finite.
    pub magnitude_ratio: f64,
    /// Values compared.
    pub len: u64,
    /// For a centred comparison ([`centered_similarity`]): how much the replay varies from
    /// position to position (its centred norm over its norm) and how far the upload lies from
    /// it (`|b - a| / |a|`). Kept so that a failure says which of the two was small.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub centring: Option<Centring>,
}

/// The replay's spread and the upload's distance behind a centred cosine.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Centring {
    /// The replay's centred norm over its norm (0 for a replay the same at every position).
    pub spread: f64,
    /// `|b - a| / |a|`, the upload's raw distance from the replay.
    pub distance: f64,
}

impl Comparison {
    /// An empty comparison.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one chunk of both vectors (same positions in each).
    ///
    /// # Panics
    /// Never; a length mismatch counts the extra values of the longer side as compared with
    /// zeros, so a short upload lowers the similarity instead of being silently cut.
    pub fn add(&mut self, a: &[f32], b: &[f32]) {
        let n = a.len().max(b.len());
        for i in 0..n {
            let x = f64::from(a.get(i).copied().unwrap_or(0.0));
            let y = f64::from(b.get(i).copied().unwrap_or(0.0));
            if !y.is_finite() {
                self.nonfinite += 1;
                continue;
            }
            self.dot += x * y;
            self.norm_a_sq += x * x;
            self.norm_b_sq += y * y;
        }
        self.len += n as u64;
    }

    /// The figures so far.
    pub fn similarity(&self) -> Similarity {
        if self.nonfinite > 0 {
            return Similarity {
                cosine: 0.0,
                magnitude_ratio: 0.0,
                len: self.len,
                centring: None,
            };
        }
        let (na, nb) = (self.norm_a_sq.sqrt(), self.norm_b_sq.sqrt());
        let (cosine, magnitude_ratio) = match (na > 0.0, nb > 0.0) {
            (false, false) => (1.0, 1.0),
            (true, true) => (
                (self.dot / (na * nb)).clamp(-1.0, 1.0),
                na.min(nb) / na.max(nb),
            ),
            _ => (0.0, 0.0),
        };
        Similarity {
            cosine,
            magnitude_ratio,
            len: self.len,
            centring: None,
        }
    }
}

/// Compares two whole vectors.
pub fn similarity(a: &[f32], b: &[f32]) -> Similarity {
    let mut c = Comparison::new();
    c.add(a, b);
    c.similarity()
}

/// Compares `b` (the miner's `[.., width]` tensor) with `a` (the validator's) after taking
/// each channel's mean *over `a`* out of both: the cosine then measures agreement in what
/// varies from position to position, which a channel's constant offset cannot fake. With a
/// narrow boundary the offset dominates the raw cosine (a 2-channel `tiny` boundary gave noise
/// of the right mean and spread a raw cosine of 0.966); centred, such noise scores about 0 and
/// zeros exactly 0. The magnitude ratio is taken on the raw vectors, as in [`similarity`].
///
/// A replay that does not vary from position to position has nothing left after centring: a
/// section fed the same input at every position (an upstream cheater's zeros, without
/// re-embedding) gives the same output at every position. Then the upload must not differ
/// from that constant beyond its wire format's rounding (1% of its norm), and the raw cosine
/// decides; before, the honest miner downstream of that cheater was flagged for the cheater's
/// input.
///
/// An upload within its wire format's rounding of the replay (a raw distance of at most 1%
/// of the replay's norm) passes as the raw cosine says, whatever the replay's spread: a replay
/// that varies only a little from position to position (under 1% of its norm) leaves, after
/// centring, a remainder of the size of that rounding, whose centred cosine is noise (the
/// likely reason honest miners were flagged at single items with centred cosines of 0.45-0.89
/// and magnitude ratios of 0.998-0.999, 2026-12-02; not established).
/// A cheat cannot use it: an upload that close is the replay's output.
pub fn centered_similarity(a: &[f32], b: &[f32], width: usize) -> Similarity {
    let width = width.max(1);
    let rows = a.len() / width;
    let mut mean = vec![0f64; width];
    for row in a.chunks(width) {
        for (m, x) in mean.iter_mut().zip(row) {
            *m += f64::from(*x);
        }
    }
    for m in &mut mean {
        *m /= rows.max(1) as f64;
    }
    let center = |v: &[f32]| -> Vec<f32> {
        v.iter()
            .enumerate()
            .map(|(i, x)| (f64::from(*x) - mean[i % width]) as f32)
            .collect()
    };
    // The two comparisons' norms also say how far each side lies from the replay's means.
    let (mut raw, mut centered) = (Comparison::new(), Comparison::new());
    raw.add(a, b);
    centered.add(&center(a), &center(b));
    let plain = raw.similarity();
    let centring = Centring {
        spread: spread(centered.norm_a_sq, raw.norm_a_sq),
        distance: distance(&raw),
    };
    let cosine = if centring.spread <= FLAT_REPLAY {
        if spread(centered.norm_b_sq, raw.norm_b_sq) <= FLAT_UPLOAD {
            plain.cosine
        } else {
            0.0
        }
    } else if centring.distance <= FLAT_UPLOAD {
        plain.cosine
    } else {
        centered.similarity().cosine
    };
    Similarity {
        cosine,
        centring: Some(centring),
        ..plain
    }
}

/// `|b - a| / |a|` from a raw comparison's sums (0 when both are zero, infinite when only `a`
/// is).
fn distance(c: &Comparison) -> f64 {
    let diff_sq = (c.norm_a_sq + c.norm_b_sq - 2.0 * c.dot).max(0.0);
    if c.norm_a_sq > 0.0 {
        (diff_sq / c.norm_a_sq).sqrt()
    } else if diff_sq > 0.0 {
        f64::INFINITY
    } else {
        0.0
    }
}

/// Largest [`spread`] of a replay that counts as the same at every position: `f32` rounding
/// differences between positions are about 1e-7 of the values, a varying boundary's were
/// 3% and more.
const FLAT_REPLAY: f64 = 1e-4;

/// Largest [`spread`] of an upload around a flat replay's constant: a constant tensor sent in
/// bf16 or int8 may differ from it by a rounding step (0.4% of a value).
const FLAT_UPLOAD: f64 = 1e-2;

/// How far a vector lies from the replay's channel means, from the squared norms of its
/// centred copy and of itself (0 for a zero vector). For the replay itself, how much it varies.
fn spread(centered_sq: f64, norm_sq: f64) -> f64 {
    if norm_sq > 0.0 {
        (centered_sq / norm_sq).sqrt()
    } else {
        0.0
    }
}

/// Why `s` fails `t`, or `None` when it passes (the magnitude test first, as in the
/// reference validator).
pub fn failure(t: &Thresholds, s: &Similarity) -> Option<String> {
    if s.magnitude_ratio < t.min_magnitude_ratio {
        return Some(format!(
            "magnitude ratio {:.4} < {}",
            s.magnitude_ratio, t.min_magnitude_ratio
        ));
    }
    if s.cosine < t.min_cosine {
        let behind = s.centring.map_or(String::new(), |c| {
            format!(
                " (replay spread {:.2}%, upload distance {:.2}%)",
                c.spread * 100.0,
                c.distance * 100.0
            )
        });
        return Some(format!("cosine {:.4} < {}{behind}", s.cosine, t.min_cosine));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn hand_computed_figures() {
        // a = (3, 4), |a| = 5; b = (6, 8), |b| = 10: parallel, half the length.
        let s = similarity(&[3.0, 4.0], &[6.0, 8.0]);
        assert!(
            close(s.cosine, 1.0) && close(s.magnitude_ratio, 0.5),
            "{s:?}"
        );
        // a = (1, 0), b = (1, 1): cos = 1 / sqrt 2, ratio = 1 / sqrt 2.
        let s = similarity(&[1.0, 0.0], &[1.0, 1.0]);
        let r = 1.0 / 2f64.sqrt();
        assert!(close(s.cosine, r) && close(s.magnitude_ratio, r), "{s:?}");
        // Opposite directions.
        assert!(close(similarity(&[1.0, 2.0], &[-1.0, -2.0]).cosine, -1.0));
    }

    #[test]
    fn chunks_add_up_to_the_whole() {
        let a: Vec<f32> = (0..100).map(|i| (i as f32 * 0.3).sin()).collect();
        let b: Vec<f32> = (0..100).map(|i| (i as f32 * 0.31).sin()).collect();
        let whole = similarity(&a, &b);
        let mut c = Comparison::new();
        for (x, y) in a.chunks(7).zip(b.chunks(7)) {
            c.add(x, y);
        }
        let parts = c.similarity();
        assert!(close(whole.cosine, parts.cosine));
        assert!(close(whole.magnitude_ratio, parts.magnitude_ratio));
        assert_eq!(parts.len, 100);
    }

    #[test]
    fn zeros_short_uploads_and_nan() {
        assert_eq!(similarity(&[0.0, 0.0], &[0.0, 0.0]).cosine, 1.0);
        let lazy = similarity(&[1.0, 2.0], &[0.0, 0.0]);
        assert_eq!((lazy.cosine, lazy.magnitude_ratio), (0.0, 0.0));
        // A short upload is compared against zeros: (1,1) vs (1,0).
        let short = similarity(&[1.0, 1.0], &[1.0]);
        assert!(close(short.cosine, 1.0 / 2f64.sqrt()));
        let nan = similarity(&[1.0, 1.0], &[1.0, f32::NAN]);
        assert_eq!((nan.cosine, nan.magnitude_ratio), (0.0, 0.0));
    }

    #[test]
    fn centring_sees_through_a_channel_offset() {
        // Two channels with a large constant offset and a small varying part.
        let truth: Vec<f32> = (0..64)
            .map(|i| if i % 2 == 0 { 5.0 } else { -3.0 } + (i as f32 * 0.7).sin() * 0.2)
            .collect();
        let noise: Vec<f32> = (0..64)
            .map(|i| if i % 2 == 0 { 5.0 } else { -3.0 } + (i as f32 * 3.1).cos() * 0.2)
            .collect();
        assert!(similarity(&truth, &noise).cosine > 0.99, "raw is fooled");
        let c = centered_similarity(&truth, &noise, 2);
        assert!(c.cosine.abs() < 0.5, "{c:?}");
        let same = centered_similarity(&truth, &truth, 2);
        assert!(close(same.cosine, 1.0) && close(same.magnitude_ratio, 1.0));
        let zeros = centered_similarity(&truth, &[0.0; 64], 2);
        assert!(
            zeros.cosine.abs() < 1e-6 && zeros.magnitude_ratio == 0.0,
            "{zeros:?}"
        );
        // A constant per channel (the mean itself) carries nothing either.
        let means: Vec<f32> = (0..64)
            .map(|i| if i % 2 == 0 { 5.0 } else { -3.0 })
            .collect();
        assert!(centered_similarity(&truth, &means, 2).cosine.abs() < 0.2);
    }

    #[test]
    fn a_replay_that_is_the_same_at_every_position_is_compared_raw() {
        // A section fed the same input at every position: the replay is constant per channel.
        let flat: Vec<f32> = (0..64)
            .map(|i| if i % 2 == 0 { 0.8 } else { -1.3 })
            .collect();
        // The honest upload, through bf16: one rounding step off at a few positions.
        let honest: Vec<f32> = flat
            .iter()
            .enumerate()
            .map(|(i, x)| {
                if i % 9 == 0 {
                    x * (1.0 + 1.0 / 256.0)
                } else {
                    *x
                }
            })
            .collect();
        let c = centered_similarity(&flat, &honest, 2);
        assert!(c.cosine > 0.9999 && c.magnitude_ratio > 0.999, "{c:?}");
        // An upload that varies where the replay does not, zeros, and a scaled copy all fail.
        let varying: Vec<f32> = flat
            .iter()
            .enumerate()
            .map(|(i, x)| x + (i as f32 * 3.1).cos() * 0.2)
            .collect();
        assert_eq!(centered_similarity(&flat, &varying, 2).cosine, 0.0);
        let zeros = centered_similarity(&flat, &[0.0; 64], 2);
        assert_eq!((zeros.cosine, zeros.magnitude_ratio), (0.0, 0.0));
        let half: Vec<f32> = flat.iter().map(|x| x * 0.5).collect();
        assert!(centered_similarity(&flat, &half, 2).magnitude_ratio < 0.51);
        // Another constant per channel is not the replay's within rounding.
        let other: Vec<f32> = (0..64)
            .map(|i| if i % 2 == 0 { -1.3 } else { 0.8 })
            .collect();
        assert_eq!(centered_similarity(&flat, &other, 2).cosine, 0.0);
    }

    #[test]
    fn a_replay_that_varies_little_is_judged_within_the_wires_rounding() {
        // Two channels that vary by about 0.3% of their values from position to position.
        let nearly_flat: Vec<f32> = (0..64)
            .map(|i| {
                let base = if i % 2 == 0 { 0.8 } else { -1.3 };
                base * (1.0 + 0.003 * (i as f32 * 0.7).sin())
            })
            .collect();
        // The honest upload through bf16 (8 significant bits): centred, the rounding is as
        // large as what varies, and the centred cosine alone would flag it.
        let honest: Vec<f32> = nearly_flat
            .iter()
            .map(|x| half::bf16::from_f32(*x).to_f32())
            .collect();
        let center_only = {
            let mean = |c: usize| {
                nearly_flat
                    .iter()
                    .skip(c)
                    .step_by(2)
                    .map(|x| f64::from(*x))
                    .sum::<f64>()
                    / 32.0
            };
            let (m0, m1) = (mean(0), mean(1));
            let center = |v: &[f32]| -> Vec<f32> {
                v.iter()
                    .enumerate()
                    .map(|(i, x)| (f64::from(*x) - if i % 2 == 0 { m0 } else { m1 }) as f32)
                    .collect()
            };
            similarity(&center(&nearly_flat), &center(&honest)).cosine
        };
        assert!(
            center_only < 0.9,
            "the case this rule is for: {center_only}"
        );
        let c = centered_similarity(&nearly_flat, &honest, 2);
        assert!(c.cosine > 0.9999 && c.magnitude_ratio > 0.999, "{c:?}");
        // Noise around the channels' values, zeros and another constant still fail.
        let noise: Vec<f32> = nearly_flat
            .iter()
            .enumerate()
            .map(|(i, x)| x * (1.0 + 0.05 * (i as f32 * 3.1).cos()))
            .collect();
        assert!(centered_similarity(&nearly_flat, &noise, 2).cosine < 0.5);
        assert_eq!(
            centered_similarity(&nearly_flat, &[0.0; 64], 2).magnitude_ratio,
            0.0
        );
        let other: Vec<f32> = nearly_flat.iter().map(|x| -x).collect();
        assert!(centered_similarity(&nearly_flat, &other, 2).cosine < 0.0);
    }

    #[test]
    fn thresholds_name_what_failed() {
        let t = Thresholds {
            min_cosine: 0.9,
            min_magnitude_ratio: 0.8,
        };
        assert!(failure(&t, &similarity(&[3.0, 4.0], &[3.0, 4.1])).is_none());
        let scaled = failure(&t, &similarity(&[3.0, 4.0], &[6.0, 8.0])).unwrap();
        assert!(scaled.contains("magnitude ratio 0.5000"), "{scaled}");
        // (1, 0) vs (0.6, 0.8): same length, cosine 0.6.
        let turned = failure(&t, &similarity(&[1.0, 0.0], &[0.6, 0.8])).unwrap();
        assert!(turned.contains("cosine 0.6000"), "{turned}");
        // A centred comparison's failure says how much the replay varied and how far the
        // upload lay from it: (1, 3) vs (2.5, 2.5) over one channel of two positions.
        let centred = failure(&t, &centered_similarity(&[1.0, 3.0], &[2.5, 2.5], 1)).unwrap();
        assert!(
            centred.contains("cosine 0.0000 < 0.9 (replay spread 44.72%, upload distance 50.00%)"),
            "{centred}"
        );
    }
}
