//! Bytes that really move through storage, counted where they move: every `PUT` and `GET`
//! made through a presigned URL ([`super::transfer`]) and every object read or written
//! through [`super::Storage`] is added here, by what the object is (its key says it, see
//! [`TrafficKind::of_key`]) and by direction.
//!
//! The counters are process-wide: a miner's are what it uploaded and downloaded; the
//! orchestrator's are what its own store read and wrote (token writes, read-back checks of
//! uploads, and the objects its `/blob` endpoint served). Benchmarks read them instead of
//! computing sizes from the codec.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// What an object is, from its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrafficKind {
    /// A sample's token ids or targets (`activations/{e}/{sample}/tokens|targets`).
    Tokens,
    /// A section's forward output (`activations/{e}/{sample}/{k}.forward.{attempt}.{copy}`).
    Activations,
    /// A gradient sent back (`activations/{e}/{sample}/{k}.backward.{attempt}.{copy}`).
    Gradients,
    /// A miner's flat state uploaded for a merge (`weights/...`).
    MergeUploads,
    /// A merged partition (`merged/...`).
    MergedPartitions,
    /// A section checkpoint (`checkpoints/...`).
    Checkpoints,
    /// Anything else.
    Other,
}

impl TrafficKind {
    /// Every kind, in display order.
    pub const ALL: [TrafficKind; 7] = [
        Self::Tokens,
        Self::Activations,
        Self::Gradients,
        Self::MergeUploads,
        Self::MergedPartitions,
        Self::Checkpoints,
        Self::Other,
    ];

    /// The kind of the object at `key` (an object key, or a URL path that ends with one:
    /// `/blob/runs/...` or `/{bucket}/{prefix}/runs/...`).
    pub fn of_key(key: &str) -> Self {
        let parts: Vec<&str> = key.split('/').filter(|p| !p.is_empty()).collect();
        // The layout's area follows `runs/{run}/`; search from the end so a prefix or bucket
        // that happens to be called `runs` does not confuse it.
        let Some(at) = (0..parts.len().saturating_sub(2))
            .rev()
            .find(|&i| parts[i] == "runs")
        else {
            return Self::Other;
        };
        let rest = &parts[at + 2..];
        match rest {
            // Within the activations area the word that names the direction decides, as a
            // part of its own or a dot-separated word of one (an attempt's
            // `{section}.{direction}.{assignment}.{copy}`).
            ["activations", tail @ ..] => tail
                .iter()
                .skip(2)
                .flat_map(|p| p.split('.'))
                .find_map(|w| match w {
                    "tokens" | "targets" => Some(Self::Tokens),
                    "forward" => Some(Self::Activations),
                    "backward" => Some(Self::Gradients),
                    _ => None,
                })
                .unwrap_or(Self::Other),
            ["weights", ..] => Self::MergeUploads,
            ["merged", ..] => Self::MergedPartitions,
            ["checkpoints", ..] => Self::Checkpoints,
            _ => Self::Other,
        }
    }

    /// The label used in metrics and tables.
    pub fn label(self) -> &'static str {
        match self {
            Self::Tokens => "tokens",
            Self::Activations => "activations",
            Self::Gradients => "gradients",
            Self::MergeUploads => "merge_uploads",
            Self::MergedPartitions => "merged_partitions",
            Self::Checkpoints => "checkpoints",
            Self::Other => "other",
        }
    }

    fn index(self) -> usize {
        Self::ALL.iter().position(|k| *k == self).unwrap_or(6)
    }
}

/// Which way bytes moved, seen from the process that counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrafficDir {
    /// Written (`PUT`).
    Up,
    /// Read (`GET`, whole or ranged).
    Down,
}

/// Bytes and requests of one kind in one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrafficCount {
    /// Payload bytes.
    pub bytes: u64,
    /// Requests (or store calls).
    pub requests: u64,
}

/// Counters by kind and direction.
#[derive(Debug, Default)]
pub struct Traffic {
    counts: [[(AtomicU64, AtomicU64); 2]; 7],
}

impl Traffic {
    /// Adds one request of `bytes` bytes.
    pub fn record(&self, kind: TrafficKind, dir: TrafficDir, bytes: u64) {
        let (b, n) = &self.counts[kind.index()][dir as usize];
        b.fetch_add(bytes, Ordering::Relaxed);
        n.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds one request on the object at `key` (classified by [`TrafficKind::of_key`]).
    pub fn record_key(&self, key: &str, dir: TrafficDir, bytes: u64) {
        self.record(TrafficKind::of_key(key), dir, bytes);
    }

    /// The count of one kind and direction so far.
    pub fn get(&self, kind: TrafficKind, dir: TrafficDir) -> TrafficCount {
        let (b, n) = &self.counts[kind.index()][dir as usize];
        TrafficCount {
            bytes: b.load(Ordering::Relaxed),
            requests: n.load(Ordering::Relaxed),
        }
    }

    /// Every non-empty count, as `(kind, dir, count)`.
    pub fn snapshot(&self) -> Vec<(TrafficKind, TrafficDir, TrafficCount)> {
        let mut out = Vec::new();
        for kind in TrafficKind::ALL {
            for dir in [TrafficDir::Up, TrafficDir::Down] {
                let c = self.get(kind, dir);
                if c.requests > 0 {
                    out.push((kind, dir, c));
                }
            }
        }
        out
    }

    /// Prometheus text for counters named `{name}_bytes_total` and `{name}_requests_total`
    /// with `kind` and `dir` labels (plus `extra` labels, e.g. `miner="..."`, already
    /// formatted as `key="value",`).
    pub fn render(&self, name: &str, extra: &str, out: &mut String) {
        use std::fmt::Write as _;
        for (kind, dir, c) in self.snapshot() {
            let dir = match dir {
                TrafficDir::Up => "up",
                TrafficDir::Down => "down",
            };
            let labels = format!("{extra}kind=\"{}\",dir=\"{dir}\"", kind.label());
            let _ = writeln!(out, "{name}_bytes_total{{{labels}}} {}", c.bytes);
            let _ = writeln!(out, "{name}_requests_total{{{labels}}} {}", c.requests);
        }
    }
}

/// The process-wide counters: every transfer through a URL and every store call.
pub fn global() -> &'static Traffic {
    static GLOBAL: std::sync::OnceLock<Traffic> = std::sync::OnceLock::new();
    GLOBAL.get_or_init(Traffic::default)
}

/// The part of [`global`] that an orchestrator's `/blob` endpoint moved for its clients
/// (their uploads and downloads through it), so that the orchestrator's own reads and writes
/// are `global - served`.
pub fn served() -> &'static Traffic {
    static SERVED: std::sync::OnceLock<Traffic> = std::sync::OnceLock::new();
    SERVED.get_or_init(Traffic::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_come_from_the_key_layout() {
        let k = TrafficKind::of_key;
        assert_eq!(k("runs/r/activations/0/17/tokens"), TrafficKind::Tokens);
        assert_eq!(k("runs/r/activations/0/17/targets"), TrafficKind::Tokens);
        assert_eq!(
            k("/blob/runs/r/activations/2/17/1/forward"),
            TrafficKind::Activations
        );
        assert_eq!(
            k("/bucket/prefix/runs/r/activations/2/17/1/backward"),
            TrafficKind::Gradients
        );
        assert_eq!(
            k("/blob/runs/r/activations/2/17/1.forward.40.upload"),
            TrafficKind::Activations
        );
        assert_eq!(
            k("runs/r/activations/2/17/1.backward.41.accepted"),
            TrafficKind::Gradients
        );
        assert_eq!(
            k("runs/r/weights/0/1/5Grw/parameters"),
            TrafficKind::MergeUploads
        );
        assert_eq!(
            k("runs/r/merged/0/1/3/5Grw/parameters"),
            TrafficKind::MergedPartitions
        );
        assert_eq!(
            k("runs/r/checkpoints/1/0/optimizer"),
            TrafficKind::Checkpoints
        );
        // A bucket called `runs` in front of the layout is not the layout.
        assert_eq!(
            k("/runs/runs/r/activations/0/1/0/forward"),
            TrafficKind::Activations
        );
        assert_eq!(k("runs/r/something/else"), TrafficKind::Other);
        assert_eq!(k(""), TrafficKind::Other);
        assert_eq!(k("runs"), TrafficKind::Other);
    }

    #[test]
    fn counts_add_up_and_render() {
        let t = Traffic::default();
        t.record_key("runs/r/activations/0/1/0/forward", TrafficDir::Up, 100);
        t.record_key("runs/r/activations/0/1/0/forward", TrafficDir::Up, 50);
        t.record(TrafficKind::Gradients, TrafficDir::Down, 7);
        assert_eq!(
            t.get(TrafficKind::Activations, TrafficDir::Up),
            TrafficCount {
                bytes: 150,
                requests: 2
            }
        );
        assert_eq!(t.snapshot().len(), 2);
        let mut text = String::new();
        t.render("iota_x", "miner=\"m\",", &mut text);
        assert!(
            text.contains("iota_x_bytes_total{miner=\"m\",kind=\"activations\",dir=\"up\"} 150"),
            "{text}"
        );
        assert!(
            text.contains("iota_x_requests_total{miner=\"m\",kind=\"gradients\",dir=\"down\"} 1")
        );
    }
}
