//! Hostile miner behaviours for tests (`iota mine --adversary KIND`, a hidden flag; `iota local`
//! passes it to some miners with its hidden `--adversaries`). Built only with the `adversary`
//! cargo feature, which the tests enable and the release build does not (without it the loop
//! sees `no_adversary.rs`). Not a user feature: they exist so
//! that the validator's and the orchestrator's defences are shown working against real miner
//! processes. Each kind does the honest compute, then cheats in one way:
//!
//! | kind | what it does |
//! |---|---|
//! | `noisy` | adds noise of half the output's RMS to every output and input gradient |
//! | `scaled` | multiplies every output and input gradient by 2 |
//! | `lazy` | uploads its input (activations, upstream gradient) instead of its result, zeros at the head |
//! | `stale` | never steps its optimizer (it uploads the state it started the epoch from) |
//! | `free-rider` | takes work and never finishes it (no result, no release) |
//! | `lying-merger` | submits, for every partition it merges, its first source's values instead of the merge |
//! | `copier` | uploads, for the merge, another miner's accepted state read from the store, moved 2% towards its own ([`super::copier`]) |
//! | `poisoner` | uploads, for the merges of even epochs, parameters of ±3e38 (finite, so they pass the decoder; odd epochs: its honest state), and after every upload overwrites it with a short object through the URL it still holds |

use std::fmt;
use std::str::FromStr;

use crate::api::PartitionTask;
use crate::compute::cache::CachedInput;
use crate::compute::engine::Activations;

/// A hostile behaviour; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adversary {
    /// Noise on outputs and gradients.
    Noisy,
    /// Outputs and gradients doubled.
    Scaled,
    /// Its input returned as its output (zeros at the head).
    Lazy,
    /// No optimizer steps.
    Stale,
    /// Work taken, never finished.
    FreeRider,
    /// Wrong merged partitions.
    LyingMerger,
    /// Another miner's merge upload re-uploaded as its own.
    Copier,
    /// Huge finite merge uploads, swapped for a short object after submitting.
    Poisoner,
}

/// Every kind, in the order of the module docs.
pub const ALL: [Adversary; 8] = [
    Adversary::Noisy,
    Adversary::Scaled,
    Adversary::Lazy,
    Adversary::Stale,
    Adversary::FreeRider,
    Adversary::LyingMerger,
    Adversary::Copier,
    Adversary::Poisoner,
];

impl fmt::Display for Adversary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Noisy => "noisy",
            Self::Scaled => "scaled",
            Self::Lazy => "lazy",
            Self::Stale => "stale",
            Self::FreeRider => "free-rider",
            Self::LyingMerger => "lying-merger",
            Self::Copier => "copier",
            Self::Poisoner => "poisoner",
        })
    }
}

impl FromStr for Adversary {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ALL.into_iter().find(|a| a.to_string() == s).ok_or_else(|| {
            let kinds: Vec<String> = ALL.iter().map(ToString::to_string).collect();
            format!("unknown adversary {s:?} (one of {})", kinds.join(", "))
        })
    }
}

/// A deterministic value in `[-1, 1)` for `(seed, i)` (splitmix64).
fn unit(seed: u64, i: u64) -> f32 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(i.wrapping_mul(0xBF58_476D_1CE4_E5B9));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

impl Adversary {
    /// Whether it never steps its optimizer.
    pub fn never_steps(self) -> bool {
        self == Self::Stale
    }

    /// Whether it abandons every assignment it takes.
    pub fn abandons_work(self) -> bool {
        self == Self::FreeRider
    }

    /// Whether it uploads another miner's state as its own ([`super::copier`]).
    pub fn copies_uploads(self) -> bool {
        self == Self::Copier
    }

    /// Whether it poisons its merge uploads ([`Self::poison`]).
    pub fn poisons_merges(self) -> bool {
        self == Self::Poisoner
    }

    /// Replaces the parameters (the first `params_len` values of a flat state) by ±3e38:
    /// finite, so only the orchestrator's distance check can keep them out of a mean.
    pub fn poison(flat: &mut [f32], params_len: usize) {
        for (i, v) in flat.iter_mut().take(params_len).enumerate() {
            *v = if i % 2 == 0 { 3e38 } else { -3e38 };
        }
    }

    /// The result it uploads instead of `out`, computed honestly from `input` for `sample`.
    pub fn tamper(
        self,
        sample: u64,
        input: Option<&CachedInput>,
        mut out: Activations,
    ) -> Activations {
        match self {
            Self::Noisy => {
                let n = out.data.len().max(1) as f32;
                let rms = (out.data.iter().map(|v| v * v).sum::<f32>() / n).sqrt();
                // Uniform in [-1, 1) has RMS 1/sqrt(3).
                let amp = 0.5 * rms * 3f32.sqrt();
                for (i, v) in out.data.iter_mut().enumerate() {
                    *v += amp * unit(sample, i as u64);
                }
            }
            Self::Scaled => out.data.iter_mut().for_each(|v| *v *= 2.0),
            Self::Lazy => match input {
                Some(CachedInput::Hidden { data, shape, .. }) if *shape == out.shape => {
                    out.data.clone_from(data);
                }
                _ => out.data.iter_mut().for_each(|v| *v = 0.0),
            },
            Self::Stale | Self::FreeRider | Self::LyingMerger | Self::Copier | Self::Poisoner => {}
        }
        out
    }

    /// The partition task it merges instead of `task` (the lying merger keeps only the first
    /// source; others merge what they were given).
    pub fn merge_task(self, task: &PartitionTask) -> PartitionTask {
        let mut task = task.clone();
        if self == Self::LyingMerger && task.sources.len() > 1 {
            for (i, s) in task.sources.iter_mut().enumerate() {
                s.weight = if i == 0 { 1.0 } else { 0.0 };
            }
        }
        task
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_from_their_names_and_tampering_changes_what_it_should() {
        for a in ALL {
            assert_eq!(a.to_string().parse::<Adversary>().unwrap(), a);
        }
        assert!(
            "sneaky"
                .parse::<Adversary>()
                .unwrap_err()
                .contains("lying-merger")
        );
        let out = Activations {
            data: (0..64).map(|i| (i as f32 * 0.3).sin()).collect(),
            shape: [1, 8, 8],
        };
        let input = CachedInput::Hidden {
            data: vec![0.5; 64],
            shape: [1, 8, 8],
            tokens: None,
        };
        let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        let cosine = |a: &Activations| {
            let dot: f32 = a.data.iter().zip(&out.data).map(|(x, y)| x * y).sum();
            dot / (norm(&a.data) * norm(&out.data))
        };
        let noisy = cosine(&Adversary::Noisy.tamper(1, Some(&input), out.clone()));
        assert!(noisy < 0.95 && noisy > 0.7, "{noisy}");
        let scaled = Adversary::Scaled.tamper(1, Some(&input), out.clone());
        assert!((norm(&scaled.data) / norm(&out.data) - 2.0).abs() < 1e-5);
        let lazy = Adversary::Lazy.tamper(1, Some(&input), out.clone());
        assert_eq!(lazy.data, vec![0.5; 64]);
        let head = Adversary::Lazy.tamper(1, None, out.clone());
        assert!(head.data.iter().all(|v| *v == 0.0));
        assert_eq!(Adversary::Stale.tamper(1, Some(&input), out.clone()), out);
    }
}
