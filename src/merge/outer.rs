//! Optional DiLoCo-style outer step: Nesterov momentum on the merge's pseudo-gradient.
//!
//! Instead of adopting the merged values directly, the merged values define a pseudo-gradient
//! (how far the merge moved from the previous global values), and an outer SGD-with-Nesterov
//! optimizer takes the step. With `lr = 1` and `momentum = 0` the result is the merged vector.

use serde::{Deserialize, Serialize};

use super::error::MergeError;

/// Hyper-parameters of the outer Nesterov step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OuterStep {
    /// Outer learning rate, finite and `>= 0` (DiLoCo uses 0.7).
    pub lr: f32,
    /// Momentum coefficient `mu`, finite and in `[0, 1)` (DiLoCo uses 0.9).
    pub momentum: f32,
}

impl Default for OuterStep {
    /// DiLoCo's values: `lr = 0.7`, `momentum = 0.9`.
    fn default() -> Self {
        Self {
            lr: 0.7,
            momentum: 0.9,
        }
    }
}

impl OuterStep {
    /// [`nesterov_outer_step`] with the result written over `merged`, which is left as it was
    /// (as is `momentum`) when the step fails.
    ///
    /// # Errors
    /// As [`nesterov_outer_step`].
    pub fn apply(
        self,
        previous: &[f32],
        merged: &mut [f32],
        momentum: &mut [f32],
    ) -> Result<(), MergeError> {
        let stepped = nesterov_outer_step(previous, merged, momentum, self)?;
        merged.copy_from_slice(&stepped);
        Ok(())
    }
}

impl std::str::FromStr for OuterStep {
    type Err = String;

    /// Parses `LR,MOMENTUM` (e.g. `0.7,0.9`), as the command-line flags give it, and checks
    /// both as a step does.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (lr, momentum) = text
            .split_once(',')
            .ok_or_else(|| format!("{text:?}: expected LR,MOMENTUM (e.g. 0.7,0.9)"))?;
        let lr: f32 = lr
            .trim()
            .parse()
            .map_err(|_| format!("{text:?}: bad learning rate {lr:?}"))?;
        let momentum: f32 = momentum
            .trim()
            .parse()
            .map_err(|_| format!("{text:?}: bad momentum {momentum:?}"))?;
        let step = Self { lr, momentum };
        check_hyperparameters(step).map_err(|e| format!("{text:?}: {e}"))?;
        Ok(step)
    }
}

/// One outer Nesterov step on a flat vector (or one partition of it). Per coordinate `i`:
///
/// ```text
/// g    = global_prev[i] - merged[i]          (pseudo-gradient)
/// m[i] = mu * m[i] + g                       (momentum, updated in place)
/// new  = global_prev[i] - lr * (g + mu * m[i])   (Nesterov look-ahead)
/// ```
///
/// Computed in `f64` per coordinate and rounded to `f32`. The step is all-or-nothing: every
/// input and every result is checked first, and `momentum_buf` is written only when the whole
/// step succeeds, so a failed step leaves the caller's state unchanged.
///
/// # Errors
/// - [`MergeError::InvalidHyperparameter`]: `lr` not finite or negative, `momentum` not finite
///   or not in `[0, 1)`;
/// - [`MergeError::StateLength`]: `merged` or `momentum_buf` not as long as `global_prev`;
/// - [`MergeError::NonFiniteState`]: an input holds NaN or an infinity, or a result would
///   overflow `f32` (named `result` or `momentum`).
pub fn nesterov_outer_step(
    global_prev: &[f32],
    merged: &[f32],
    momentum_buf: &mut [f32],
    step: OuterStep,
) -> Result<Vec<f32>, MergeError> {
    check_hyperparameters(step)?;
    let n = global_prev.len();
    for (buffer, got) in [("merged", merged.len()), ("momentum", momentum_buf.len())] {
        if got != n {
            return Err(MergeError::StateLength {
                buffer,
                expected: n,
                got,
            });
        }
    }
    let (lr, mu) = (f64::from(step.lr), f64::from(step.momentum));
    let update = |prev: f32, merged: f32, m: f32| {
        let prev = f64::from(prev);
        let g = prev - f64::from(merged);
        let m = mu * f64::from(m) + g;
        ((prev - lr * (g + mu * m)) as f32, m as f32)
    };
    // Pass 1: check inputs, compute the new values; the momentum buffer is not touched.
    let mut out = Vec::with_capacity(n);
    for (i, ((&p, &x), &m)) in global_prev
        .iter()
        .zip(merged)
        .zip(momentum_buf.iter())
        .enumerate()
    {
        for (buffer, v) in [("global_prev", p), ("merged", x), ("momentum", m)] {
            if !v.is_finite() {
                return Err(MergeError::NonFiniteState { buffer, index: i });
            }
        }
        let (new, new_m) = update(p, x, m);
        for (buffer, v) in [("result", new), ("momentum", new_m)] {
            if !v.is_finite() {
                return Err(MergeError::NonFiniteState { buffer, index: i });
            }
        }
        out.push(new);
    }
    // Pass 2: everything is valid; commit the momentum (same formula, same rounding).
    for ((m, &p), &x) in momentum_buf.iter_mut().zip(global_prev).zip(merged) {
        *m = update(p, x, *m).1;
    }
    Ok(out)
}

/// Checks `lr >= 0` and `0 <= momentum < 1`, both finite.
fn check_hyperparameters(step: OuterStep) -> Result<(), MergeError> {
    if !step.lr.is_finite() || step.lr < 0.0 {
        return Err(MergeError::InvalidHyperparameter {
            name: "lr",
            value: step.lr,
            reason: "must be finite and >= 0",
        });
    }
    if !step.momentum.is_finite() || !(0.0..1.0).contains(&step.momentum) {
        return Err(MergeError::InvalidHyperparameter {
            name: "momentum",
            value: step.momentum,
            reason: "must be finite and in [0, 1)",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOL: f32 = 1e-6;

    #[test]
    fn lr_one_without_momentum_adopts_the_merge() {
        let prev = [1.0f32, -2.0, 3.0];
        let merged = [0.5f32, -1.0, 3.0];
        let mut m = [0.0f32; 3];
        let step = OuterStep {
            lr: 1.0,
            momentum: 0.0,
        };
        let out = nesterov_outer_step(&prev, &merged, &mut m, step).unwrap();
        assert_eq!(out, merged.to_vec());
        // m = g = prev - merged.
        assert_eq!(m, [0.5, -1.0, 0.0]);
    }

    #[test]
    fn hand_computed_nesterov_step() {
        // prev 1, merged 0.8 -> g = 0.2; m = 0.9*0.1 + 0.2 = 0.29;
        // new = 1 - 0.5 * (0.2 + 0.9*0.29) = 1 - 0.5 * 0.461 = 0.7695.
        let prev = [1.0f32];
        let merged = [0.8f32];
        let mut m = [0.1f32];
        let step = OuterStep {
            lr: 0.5,
            momentum: 0.9,
        };
        let out = nesterov_outer_step(&prev, &merged, &mut m, step).unwrap();
        assert!((out[0] - 0.7695).abs() <= TOL, "{}", out[0]);
        assert!((m[0] - 0.29).abs() <= TOL, "{}", m[0]);
    }

    #[test]
    fn errors_leave_momentum_untouched() {
        let prev = [1.0f32, 2.0];
        let merged = [0.0f32, f32::NAN];
        let mut m = [0.25f32, 0.5];
        let err = nesterov_outer_step(&prev, &merged, &mut m, OuterStep::default()).unwrap_err();
        assert_eq!(
            err,
            MergeError::NonFiniteState {
                buffer: "merged",
                index: 1
            }
        );
        assert_eq!(m, [0.25, 0.5]);

        let mut short = [0.0f32];
        assert_eq!(
            nesterov_outer_step(&prev, &[0.0, 0.0], &mut short, OuterStep::default()).unwrap_err(),
            MergeError::StateLength {
                buffer: "momentum",
                expected: 2,
                got: 1
            }
        );

        // Overflow of the result is reported, and the momentum stays as it was.
        let mut m = [0.0f32];
        let huge = OuterStep {
            lr: 1e30,
            momentum: 0.0,
        };
        assert_eq!(
            nesterov_outer_step(&[1e30], &[-1e30], &mut m, huge).unwrap_err(),
            MergeError::NonFiniteState {
                buffer: "result",
                index: 0
            }
        );
        assert_eq!(m, [0.0]);
    }

    #[test]
    fn apply_writes_the_step_over_the_merged_values_or_leaves_them() {
        let step = OuterStep {
            lr: 2.0,
            momentum: 0.0,
        };
        let (mut merged, mut m) = ([1.5f32, -1.0], [0.0f32; 2]);
        step.apply(&[1.0, 0.0], &mut merged, &mut m).unwrap();
        assert_eq!(merged, [2.0, -2.0], "prev - 2 (prev - merged)");
        let mut merged = [1.5f32, f32::NAN];
        assert!(step.apply(&[1.0, 0.0], &mut merged, &mut m).is_err());
        assert_eq!(merged[0], 1.5, "a failed step writes nothing");
    }

    #[test]
    fn parses_lr_and_momentum_and_refuses_what_a_step_would() {
        let step: OuterStep = "0.7, 0.9".parse().unwrap();
        assert_eq!((step.lr, step.momentum), (0.7, 0.9));
        for bad in ["0.7", "x,0.9", "0.7,y", "-1,0.5", "1.4,1"] {
            let err = bad.parse::<OuterStep>().unwrap_err();
            assert!(err.starts_with(&format!("{bad:?}")), "{bad}: {err}");
        }
    }

    #[test]
    fn rejects_bad_hyperparameters() {
        let mut m = [0.0f32];
        for (lr, momentum, name) in [
            (-1.0, 0.5, "lr"),
            (f32::NAN, 0.5, "lr"),
            (1.0, 1.0, "momentum"),
        ] {
            let err = nesterov_outer_step(&[1.0], &[1.0], &mut m, OuterStep { lr, momentum })
                .unwrap_err();
            assert!(
                matches!(err, MergeError::InvalidHyperparameter { name: n, .. } if n == name),
                "{err}"
            );
        }
    }
}
