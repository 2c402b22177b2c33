//! Learning-rate schedule: linear warmup to the peak, then cosine decay to a floor.

use serde::{Deserialize, Serialize};

/// Warmup + cosine schedule, evaluated at optimizer steps (0-based).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LrSchedule {
    /// Learning rate at the end of warmup.
    pub peak: f64,
    /// Steps of linear warmup from `peak / warmup_steps` to `peak`.
    pub warmup_steps: u64,
    /// Step at which the cosine reaches its floor; constant afterwards.
    pub total_steps: u64,
    /// Floor as a fraction of the peak.
    pub min_ratio: f64,
}

/// Where sample `sample` of a network run falls on the run's schedule (the learning rate's,
/// the warm-up without the bottleneck's): its synchronous optimizer step with `samples_per_step`
/// G > 0 (samples `nG .. (n+1)G` make step `n`), the sample id itself with asynchronous steps
/// (0).
pub fn schedule_place(sample: u64, samples_per_step: u64) -> u64 {
    match samples_per_step {
        0 => sample,
        g => sample / g,
    }
}

impl Default for LrSchedule {
    fn default() -> Self {
        Self {
            peak: 3e-3,
            warmup_steps: 20,
            total_steps: 1000,
            min_ratio: 0.1,
        }
    }
}

impl LrSchedule {
    /// Learning rate for optimizer step `step`.
    pub fn at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.peak * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let floor = self.peak * self.min_ratio;
        let span = self.total_steps.saturating_sub(self.warmup_steps);
        if span == 0 || step >= self.total_steps {
            return floor;
        }
        let progress = (step - self.warmup_steps) as f64 / span as f64;
        floor + (self.peak - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
    }

    /// Checks the values make sense.
    ///
    /// # Errors
    /// A message naming the bad key.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.peak.is_finite() && self.peak > 0.0) {
            return Err(format!("`lr` must be a positive number, got {}", self.peak));
        }
        if !(0.0..=1.0).contains(&self.min_ratio) {
            return Err(format!(
                "`min_lr_ratio` must be in [0, 1], got {}",
                self.min_ratio
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_to_floor() {
        let s = LrSchedule {
            peak: 1.0,
            warmup_steps: 10,
            total_steps: 110,
            min_ratio: 0.1,
        };
        assert!((s.at(0) - 0.1).abs() < 1e-12);
        assert!((s.at(9) - 1.0).abs() < 1e-12);
        assert!((s.at(10) - 1.0).abs() < 1e-12);
        assert!((s.at(60) - 0.55).abs() < 1e-12);
        assert!((s.at(110) - 0.1).abs() < 1e-12);
        assert!((s.at(10_000) - 0.1).abs() < 1e-12);
        for step in 10..110 {
            assert!(s.at(step + 1) <= s.at(step));
        }
    }
}
