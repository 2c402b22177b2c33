//! The orthonormal DCT-II basis of a chunk, computed bit-identically on every IEEE machine:
//! the `dct` parameter code of [`super::merge_delta`] keeps the largest coefficients of a
//! chunk's change in this basis.

/// The orthonormal DCT-II basis of length `len`: row `j` is `s_j cos(pi (2n + 1) j / 2len)`,
/// `s_0 = sqrt(1/len)`, `s_j = sqrt(2/len)`.
pub(crate) struct Basis {
    pub(crate) len: usize,
    rows: Vec<f64>,
}

impl Basis {
    pub(crate) fn new(len: usize) -> Self {
        let l = len as f64;
        let (s0, s) = ((1.0 / l).sqrt(), (2.0 / l).sqrt());
        let period = 4 * len as u64;
        let mut rows = Vec::with_capacity(len * len);
        for j in 0..len as u64 {
            let scale = if j == 0 { s0 } else { s };
            for n in 0..len as u64 {
                let m = ((2 * n + 1) * j) % period;
                rows.push(scale * cos_pi_ratio(m, 2 * len as u64));
            }
        }
        Self { len, rows }
    }

    /// Coefficients of `x` (`len` values).
    pub(crate) fn forward(&self, x: &[f32]) -> Vec<f64> {
        (0..self.len)
            .map(|j| {
                let row = &self.rows[j * self.len..(j + 1) * self.len];
                row.iter()
                    .zip(x)
                    .fold(0f64, |acc, (&b, &v)| acc + b * f64::from(v))
            })
            .collect()
    }

    /// Values from sparse coefficients, summed in entry order.
    pub(crate) fn inverse(&self, entries: &[(u8, f32)]) -> Vec<f32> {
        let mut acc = vec![0f64; self.len];
        for &(j, c) in entries {
            let row = &self.rows[usize::from(j) * self.len..(usize::from(j) + 1) * self.len];
            for (a, &b) in acc.iter_mut().zip(row) {
                *a += f64::from(c) * b;
            }
        }
        acc.into_iter().map(|v| v as f32).collect()
    }
}

/// `cos(pi * m / d)` for `0 <= m < 2d`, from `+`, `-`, `*` and `/` alone (the same bits on
/// every IEEE machine), within a few ulps of the true value.
fn cos_pi_ratio(m: u64, d: u64) -> f64 {
    // Fold the angle into [0, pi/4] with exact integer arithmetic on m / d.
    let mut m = m % (2 * d);
    if m > d {
        m = 2 * d - m; // cos(2pi - a) = cos(a)
    }
    let mut sign = 1.0;
    if 2 * m > d {
        m = d - m; // cos(pi - a) = -cos(a)
        sign = -1.0;
    }
    // Now a = pi m / d is in [0, pi/2].
    if 4 * m > d {
        // cos(a) = sin(pi/2 - a)
        let x = std::f64::consts::PI * (d - 2 * m) as f64 / (2 * d) as f64;
        sign * taylor_sin(x)
    } else {
        let x = std::f64::consts::PI * m as f64 / d as f64;
        sign * taylor_cos(x)
    }
}

/// `cos(x)` for `|x| <= pi/4` by its Taylor series (terms to `x^20`).
fn taylor_cos(x: f64) -> f64 {
    let x2 = x * x;
    let (mut term, mut sum) = (1.0f64, 1.0f64);
    for k in 1..=10u32 {
        let k = f64::from(k);
        term *= -x2 / ((2.0 * k - 1.0) * (2.0 * k));
        sum += term;
    }
    sum
}

/// `sin(x)` for `|x| <= pi/4` by its Taylor series (terms to `x^21`).
fn taylor_sin(x: f64) -> f64 {
    let x2 = x * x;
    let (mut term, mut sum) = (x, x);
    for k in 1..=10u32 {
        let k = f64::from(k);
        term *= -x2 / ((2.0 * k) * (2.0 * k + 1.0));
        sum += term;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_basis_is_orthonormal_and_the_cosine_is_accurate() {
        for d in [1u64, 2, 7, 64, 128, 255] {
            for m in 0..2 * d {
                // The platform's cos of a rounded argument is itself a few ulps off.
                let want = (std::f64::consts::PI * m as f64 / d as f64).cos();
                let got = cos_pi_ratio(m, d);
                assert!((got - want).abs() < 4e-15, "{m}/{d}: {got} {want}");
            }
        }
        for len in [2usize, 5, 64] {
            let b = Basis::new(len);
            for i in 0..len {
                for j in 0..len {
                    let dot: f64 = (0..len)
                        .map(|n| b.rows[i * len + n] * b.rows[j * len + n])
                        .sum();
                    let want = if i == j { 1.0 } else { 0.0 };
                    assert!((dot - want).abs() < 1e-12, "{len}: <{i},{j}> = {dot}");
                }
            }
        }
    }
}
