//! Deterministic weight initialisation keyed by parameter name.
//!
//! Each parameter's initial values are a pure function of `(seed, global parameter name)`:
//! a BLAKE3 extendable output seeded with both is turned into normal samples (Box-Muller).
//! So the weights of a section do not depend on how the model was split, which process built
//! it, or in which order parameters were created.

/// Source of initial weights for one run seed.
#[derive(Debug, Clone, Copy)]
pub struct Init {
    seed: u64,
}

impl Init {
    /// Initialiser for `seed`.
    pub fn new(seed: u64) -> Self {
        Self { seed }
    }

    /// `n` samples of a normal distribution with mean 0 and standard deviation `std`,
    /// identical for the same `(seed, name, n)`.
    pub fn normal(&self, name: &str, n: usize, std: f64) -> Vec<f32> {
        let mut hasher = blake3::Hasher::new();
        hasher.update(b"iota-init-v1");
        hasher.update(&self.seed.to_le_bytes());
        hasher.update(name.as_bytes());
        let mut xof = hasher.finalize_xof();
        let mut out = Vec::with_capacity(n);
        let mut buf = [0u8; 4096];
        while out.len() < n {
            xof.fill(&mut buf);
            for pair in buf.chunks_exact(8) {
                if out.len() >= n {
                    break;
                }
                let a = u32::from_le_bytes([pair[0], pair[1], pair[2], pair[3]]);
                let b = u32::from_le_bytes([pair[4], pair[5], pair[6], pair[7]]);
                // Uniforms in (0, 1]: never 0, so ln() stays finite.
                let u1 = (f64::from(a) + 1.0) / 4_294_967_296.0;
                let u2 = f64::from(b) / 4_294_967_296.0;
                let r = (-2.0 * u1.ln()).sqrt();
                let theta = std::f64::consts::TAU * u2;
                out.push((r * theta.cos() * std) as f32);
                if out.len() < n {
                    out.push((r * theta.sin() * std) as f32);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_name_dependent() {
        let init = Init::new(7);
        assert_eq!(init.normal("a", 100, 1.0), init.normal("a", 100, 1.0));
        assert_ne!(init.normal("a", 100, 1.0), init.normal("b", 100, 1.0));
        assert_ne!(
            init.normal("a", 100, 1.0),
            Init::new(8).normal("a", 100, 1.0)
        );
        // A prefix of a longer draw is the shorter draw.
        assert_eq!(
            init.normal("a", 101, 1.0)[..100],
            init.normal("a", 100, 1.0)[..]
        );
    }

    #[test]
    fn moments_are_right() {
        let xs = Init::new(1).normal("w", 200_000, 0.5);
        let n = xs.len() as f64;
        let mean = xs.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = xs
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var.sqrt() - 0.5).abs() < 0.01, "std {}", var.sqrt());
    }
}
