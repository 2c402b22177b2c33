//! Copy detection: uploads of one section that are near-identical to another miner's.
//!
//! Every miner of a section starts the epoch from the same global state `g`, so raw states
//! always look alike; what differs is the *pseudo-gradient* `d_i = u_i - g`, the change the
//! miner's own training made. Two honest miners trained on different samples, so their
//! pseudo-gradients point in clearly different directions; a miner that re-uploads another's
//! state has the same pseudo-gradient (cosine 1). Pairs at or above the threshold are flagged,
//! the later uploader (the copy) first; the earlier one is left alone.
//!
//! The sums are accumulated chunk by chunk ([`CopyDetector::add`]), so sections far larger
//! than memory can be scanned one range at a time.

use serde::{Deserialize, Serialize};

/// Pairwise dot products of the pseudo-gradients of `n` uploads.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyDetector {
    n: usize,
    /// Upper triangle (with the diagonal, the squared norms), row-major.
    dots: Vec<f64>,
}

/// One flagged copy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyFlag {
    /// Index of the later uploader (the copier).
    pub copier: usize,
    /// Index of the upload it matches.
    pub original: usize,
    /// Cosine of their pseudo-gradients.
    pub cosine: f64,
}

impl CopyDetector {
    /// A detector for `n` uploads.
    pub fn new(n: usize) -> Self {
        Self {
            n,
            dots: vec![0.0; n * (n + 1) / 2],
        }
    }

    fn at(&self, i: usize, j: usize) -> usize {
        let (i, j) = (i.min(j), i.max(j));
        // Row i of the packed upper triangle starts at i * n - i * (i - 1) / 2.
        i * self.n - i * i.saturating_sub(1) / 2 + (j - i)
    }

    /// Adds the same range of the global state and of every upload (all equally long).
    /// Uploads past `n`, and values past the global range, are ignored.
    pub fn add(&mut self, global: &[f32], uploads: &[&[f32]]) {
        let n = self.n.min(uploads.len());
        let mut diffs: Vec<f64> = vec![0.0; n];
        for (k, &g) in global.iter().enumerate() {
            for (i, u) in uploads.iter().take(n).enumerate() {
                let v = f64::from(u.get(k).copied().unwrap_or(g));
                diffs[i] = if v.is_finite() { v - f64::from(g) } else { 0.0 };
            }
            for i in 0..n {
                if diffs[i] == 0.0 {
                    continue;
                }
                for j in i..n {
                    let idx = self.at(i, j);
                    self.dots[idx] += diffs[i] * diffs[j];
                }
            }
        }
    }

    /// Norm of upload `i`'s pseudo-gradient.
    pub fn norm(&self, i: usize) -> f64 {
        self.dots[self.at(i, i)].sqrt()
    }

    /// Cosine of the pseudo-gradients of uploads `i` and `j` (`None` when either is zero:
    /// a miner that did not move is not a copier; other checks deal with it).
    pub fn cosine(&self, i: usize, j: usize) -> Option<f64> {
        let (ni, nj) = (self.norm(i), self.norm(j));
        (ni > 0.0 && nj > 0.0).then(|| (self.dots[self.at(i, j)] / (ni * nj)).clamp(-1.0, 1.0))
    }

    /// Pairs whose cosine is at least `threshold`. `order[i]` is when upload `i` arrived
    /// (ties: the larger index counts as later); the later of each pair is the copier.
    pub fn flags(&self, order: &[u64], threshold: f64) -> Vec<CopyFlag> {
        let mut out = Vec::new();
        for i in 0..self.n {
            for j in i + 1..self.n {
                let Some(cosine) = self.cosine(i, j) else {
                    continue;
                };
                if cosine < threshold {
                    continue;
                }
                let ti = order.get(i).copied().unwrap_or(u64::MAX);
                let tj = order.get(j).copied().unwrap_or(u64::MAX);
                let (copier, original) = if tj >= ti { (j, i) } else { (i, j) };
                out.push(CopyFlag {
                    copier,
                    original,
                    cosine,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_indices_are_distinct_and_dense() {
        let d = CopyDetector::new(4);
        let mut seen = Vec::new();
        for i in 0..4 {
            for j in i..4 {
                seen.push(d.at(i, j));
                assert_eq!(d.at(i, j), d.at(j, i));
            }
        }
        seen.sort();
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn hand_computed_cosines_and_the_later_copy_is_flagged() {
        // g = (1, 1, 1). Pseudo-gradients: a = (1, 0, 0), b = (0, 1, 0), c = (1, 0, 0) (a copy
        // of a, uploaded last), d = (0, 0, 0) (never moved).
        let g = [1.0f32, 1.0, 1.0];
        let a = [2.0f32, 1.0, 1.0];
        let b = [1.0f32, 2.0, 1.0];
        let c = a;
        let d = g;
        let mut det = CopyDetector::new(4);
        det.add(&g, &[&a, &b, &c, &d]);
        assert_eq!(det.cosine(0, 1), Some(0.0));
        assert_eq!(det.cosine(0, 2), Some(1.0));
        assert_eq!(det.cosine(0, 3), None, "a zero pseudo-gradient is no copy");
        assert!((det.norm(1) - 1.0).abs() < 1e-12);
        let flags = det.flags(&[10, 20, 30, 40], 0.999);
        assert_eq!(
            flags,
            vec![CopyFlag {
                copier: 2,
                original: 0,
                cosine: 1.0
            }]
        );
        // If c had uploaded first, a would be the copy.
        let flags = det.flags(&[30, 20, 10, 40], 0.999);
        assert_eq!((flags[0].copier, flags[0].original), (0, 2));
    }

    #[test]
    fn chunks_add_up_and_near_copies_count() {
        // b = a + small noise: cosine just below 1, still over a 0.99 threshold.
        let g: Vec<f32> = (0..64).map(|i| (i as f32).cos()).collect();
        let a: Vec<f32> = g
            .iter()
            .enumerate()
            .map(|(i, v)| v + (i as f32 * 0.7).sin())
            .collect();
        let b: Vec<f32> = a
            .iter()
            .enumerate()
            .map(|(i, v)| v + 0.01 * (i as f32 * 3.1).sin())
            .collect();
        let mut whole = CopyDetector::new(2);
        whole.add(&g, &[&a, &b]);
        let mut parts = CopyDetector::new(2);
        for k in (0..64).step_by(10) {
            let e = (k + 10).min(64);
            parts.add(&g[k..e], &[&a[k..e], &b[k..e]]);
        }
        let (cw, cp) = (whole.cosine(0, 1).unwrap(), parts.cosine(0, 1).unwrap());
        assert!((cw - cp).abs() < 1e-12);
        assert!(cw > 0.99 && cw < 1.0, "{cw}");
        assert_eq!(whole.flags(&[1, 2], 0.99).len(), 1);
        assert!(whole.flags(&[1, 2], 0.99999).is_empty());
    }
}
