//! [`MergeOp`]: which operator a merge uses, as selected in a run config or on the command line.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::error::MergeError;
use super::trimmed::validate_trim_fraction;

/// Trim fraction used by `trimmed` when none is given: 20% dropped at each end.
pub const DEFAULT_TRIM_FRACTION: f32 = 0.2;

/// A merge operator.
///
/// # Format
/// One lowercase word, the same in YAML configs (serde) and on the command line (`FromStr`):
/// `mean`, `geometric`, `median`, `trimmed` (fraction [`DEFAULT_TRIM_FRACTION`]) or
/// `trimmed:F` with `F` in `[0, 0.5)`, e.g. `trimmed:0.1`. `Display` writes the canonical form
/// (`trimmed:0.2`), which parses back to the same value.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum MergeOp {
    /// Weighted arithmetic mean ([`weighted_mean`](super::weighted_mean)).
    #[default]
    Mean,
    /// Sign-aware weighted geometric mean
    /// ([`sign_aware_geometric_mean`](super::sign_aware_geometric_mean)).
    Geometric,
    /// Coordinate-wise median ([`coordinate_median`](super::coordinate_median)).
    Median,
    /// Trimmed mean ([`trimmed_mean`](super::trimmed_mean)).
    Trimmed {
        /// Fraction of contributors dropped at each end, in `[0, 0.5)`.
        fraction: f32,
    },
}

impl FromStr for MergeOp {
    type Err = MergeError;

    /// Parses the format described on [`MergeOp`]; surrounding whitespace is ignored.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let unknown = || MergeError::UnknownOp {
            given: s.to_string(),
        };
        let op = match s.trim() {
            "mean" => Self::Mean,
            "geometric" => Self::Geometric,
            "median" => Self::Median,
            "trimmed" => Self::Trimmed {
                fraction: DEFAULT_TRIM_FRACTION,
            },
            other => {
                let fraction = other
                    .strip_prefix("trimmed:")
                    .ok_or_else(unknown)?
                    .trim()
                    .parse::<f32>()
                    .map_err(|_| unknown())?;
                validate_trim_fraction(fraction)?;
                Self::Trimmed { fraction }
            }
        };
        Ok(op)
    }
}

impl fmt::Display for MergeOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Mean => f.write_str("mean"),
            Self::Geometric => f.write_str("geometric"),
            Self::Median => f.write_str("median"),
            Self::Trimmed { fraction } => write!(f, "trimmed:{fraction}"),
        }
    }
}

impl TryFrom<String> for MergeOp {
    type Error = MergeError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<MergeOp> for String {
    fn from(op: MergeOp) -> Self {
        op.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        assert_eq!("mean".parse::<MergeOp>().unwrap(), MergeOp::Mean);
        assert_eq!(
            " geometric ".parse::<MergeOp>().unwrap(),
            MergeOp::Geometric
        );
        assert_eq!("median".parse::<MergeOp>().unwrap(), MergeOp::Median);
        assert_eq!(
            "trimmed".parse::<MergeOp>().unwrap(),
            MergeOp::Trimmed {
                fraction: DEFAULT_TRIM_FRACTION
            }
        );
        assert_eq!(
            "trimmed:0.1".parse::<MergeOp>().unwrap(),
            MergeOp::Trimmed { fraction: 0.1 }
        );
    }

    #[test]
    fn rejects_unknown_names_and_bad_fractions() {
        for bad in ["", "Mean", "avg", "trimmed:", "trimmed:x", "median:0.1"] {
            assert!(
                matches!(bad.parse::<MergeOp>(), Err(MergeError::UnknownOp { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(
            "trimmed:0.5".parse::<MergeOp>().unwrap_err(),
            MergeError::InvalidTrimFraction { fraction: 0.5 }
        );
    }

    #[test]
    fn display_round_trips() {
        for op in [
            MergeOp::Mean,
            MergeOp::Geometric,
            MergeOp::Median,
            MergeOp::Trimmed { fraction: 0.15 },
        ] {
            assert_eq!(op.to_string().parse::<MergeOp>().unwrap(), op);
        }
        assert_eq!(
            MergeOp::Trimmed { fraction: 0.2 }.to_string(),
            "trimmed:0.2"
        );
    }

    #[test]
    fn yaml_uses_the_same_names() {
        #[derive(Debug, Deserialize, Serialize, PartialEq)]
        struct Cfg {
            op: MergeOp,
        }
        let cfg: Cfg = serde_norway::from_str("op: trimmed:0.25\n").unwrap();
        assert_eq!(cfg.op, MergeOp::Trimmed { fraction: 0.25 });
        let cfg: Cfg = serde_norway::from_str("op: median\n").unwrap();
        assert_eq!(cfg.op, MergeOp::Median);
        assert_eq!(
            serde_norway::to_string(&Cfg { op: MergeOp::Mean }).unwrap(),
            "op: mean\n"
        );
        assert!(serde_norway::from_str::<Cfg>("op: average\n").is_err());
    }
}
