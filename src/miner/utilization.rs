//! Where a miner's wall time goes: computing, against downloading inputs, uploading results,
//! talking to the orchestrator, waiting for work, and merging.
//!
//! The clock starts at the miner's first assignment (registration and model building are
//! start-up, not steady state). Utilization is compute time over wall time. The miner writes
//! a [`UtilizationReport`] (with its storage traffic, [`crate::storage::traffic`]) as JSON
//! when asked (`iota mine --stats-out FILE`), which `iota bench network` reads.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::api::MinerUsage;
use crate::storage::traffic::{self, TrafficCount, TrafficDir, TrafficKind};

/// What the miner was doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// Forward, backward and optimizer steps (including tensor conversions).
    Compute,
    /// Waiting for inputs still being fetched, hash-checked and decoded (fetches run beside
    /// the compute; only the wait that is not hidden behind it counts).
    Download,
    /// Waiting for results still being encoded, uploaded and submitted (deliveries run
    /// beside the compute; only the wait that is not hidden behind it counts).
    Upload,
    /// Waiting on the orchestrator's answers on the work path (`work`, `release`).
    Orchestrator,
    /// Sleeping because no work was offered.
    Idle,
    /// Merge rounds (upload, merge partitions, adopt).
    Merge,
}

const ACTIVITIES: [Activity; 6] = [
    Activity::Compute,
    Activity::Download,
    Activity::Upload,
    Activity::Orchestrator,
    Activity::Idle,
    Activity::Merge,
];

/// Time per activity since the first assignment.
#[derive(Debug, Clone, Default)]
pub struct Utilization {
    totals: [Duration; 6],
    started: Option<Instant>,
    /// An activity under way since then (a merge round), counted in reports before it ends.
    current: Option<(Activity, Instant)>,
    /// The section served, copied into reports.
    pub section: Option<usize>,
    /// Merged states adopted, copied into reports.
    pub adopted: u64,
}

/// Seconds per activity, the wall time they fall in, and the traffic so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UtilizationReport {
    /// The section served.
    pub section: Option<usize>,
    /// Seconds by activity and total bytes (what heartbeats carry).
    #[serde(flatten)]
    pub usage: MinerUsage,
    /// Compute over wall time (0 before the first assignment).
    pub utilization: f64,
    /// Bytes moved through storage by this process, by kind and direction.
    pub traffic: Vec<TrafficLine>,
    /// Merged states adopted so far (a miner may adopt one without downloading it whole).
    #[serde(default)]
    pub adopted: u64,
}

/// One kind and direction of traffic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrafficLine {
    /// Object kind.
    pub kind: TrafficKind,
    /// Direction.
    pub dir: TrafficDir,
    /// Bytes and requests.
    #[serde(flatten)]
    pub count: TrafficCount,
}

impl Utilization {
    /// Totals for a miner of `section`, clock not started.
    pub fn for_section(section: usize) -> Self {
        Self {
            section: Some(section),
            ..Self::default()
        }
    }

    /// Starts the clock if it has not started (call at the first assignment).
    pub fn start(&mut self) {
        self.started.get_or_insert_with(Instant::now);
    }

    /// Adds `d` to `activity` (ignored before the clock starts).
    pub fn add(&mut self, activity: Activity, d: Duration) {
        if self.started.is_none() {
            return;
        }
        let i = ACTIVITIES.iter().position(|a| *a == activity).unwrap_or(0);
        self.totals[i] += d;
    }

    /// Starts a long `activity` (a merge round): reports written before [`Self::end`] count
    /// the time it has taken so far, so a miner stopped during it, or a stats file written in
    /// it, does not leave that time unaccounted for. Ends one under way first.
    pub fn begin(&mut self, activity: Activity) {
        self.end();
        self.current = Some((activity, Instant::now()));
    }

    /// Ends the activity [`Self::begin`] started, adding its time.
    pub fn end(&mut self) {
        if let Some((activity, since)) = self.current.take() {
            self.add(activity, since.elapsed());
        }
    }

    /// The totals so far.
    pub fn report(&self) -> UtilizationReport {
        let wall_s = self
            .started
            .map(|t| t.elapsed())
            .unwrap_or_default()
            .as_secs_f64();
        let s = |a: Activity| {
            let i = ACTIVITIES.iter().position(|x| *x == a).unwrap_or(0);
            let under_way = match self.current {
                Some((c, since)) if c == a && self.started.is_some() => since.elapsed(),
                _ => Duration::ZERO,
            };
            (self.totals[i] + under_way).as_secs_f64()
        };
        let traffic: Vec<TrafficLine> = traffic::global()
            .snapshot()
            .into_iter()
            .map(|(kind, dir, count)| TrafficLine { kind, dir, count })
            .collect();
        let bytes = |dir: TrafficDir| {
            traffic
                .iter()
                .filter(|t| t.dir == dir)
                .map(|t| t.count.bytes)
                .sum()
        };
        let usage = MinerUsage {
            wall_s,
            compute_s: s(Activity::Compute),
            download_s: s(Activity::Download),
            upload_s: s(Activity::Upload),
            orchestrator_s: s(Activity::Orchestrator),
            idle_s: s(Activity::Idle),
            merge_s: s(Activity::Merge),
            bytes_up: bytes(TrafficDir::Up),
            bytes_down: bytes(TrafficDir::Down),
        };
        UtilizationReport {
            section: self.section,
            utilization: usage.utilization(),
            usage,
            traffic,
            adopted: self.adopted,
        }
    }

    /// Writes [`Self::report`] as JSON to `path` (through a temporary file, so a reader never
    /// sees half a report).
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let json = serde_json::to_vec_pretty(&self.report()).map_err(std::io::Error::other)?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, json)?;
        std::fs::rename(&tmp, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_counts_before_the_first_assignment() {
        let mut u = Utilization::default();
        u.add(Activity::Compute, Duration::from_secs(5));
        assert_eq!(u.report().usage.compute_s, 0.0);
        assert_eq!(u.report().utilization, 0.0);
        u.start();
        u.add(Activity::Compute, Duration::from_millis(30));
        u.add(Activity::Idle, Duration::from_millis(20));
        std::thread::sleep(Duration::from_millis(60));
        let r = u.report();
        assert!((r.usage.compute_s - 0.03).abs() < 1e-9);
        assert!((r.usage.idle_s - 0.02).abs() < 1e-9);
        assert!(r.usage.wall_s >= 0.06, "{r:?}");
        assert!(r.utilization > 0.0 && r.utilization <= 0.5, "{r:?}");
    }

    #[test]
    fn an_activity_under_way_counts_in_reports_once() {
        let mut u = Utilization::default();
        u.start();
        u.begin(Activity::Merge);
        std::thread::sleep(Duration::from_millis(30));
        let during = u.report().usage.merge_s;
        assert!(during >= 0.03, "{during}");
        u.end();
        let after = u.report().usage.merge_s;
        assert!(after >= during);
        std::thread::sleep(Duration::from_millis(20));
        // Ended: no longer growing, and a second end adds nothing.
        assert_eq!(u.report().usage.merge_s, after);
        u.end();
        assert_eq!(u.report().usage.merge_s, after);
        assert_eq!(u.report().usage.compute_s, 0.0);
    }

    #[test]
    fn report_round_trips_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.json");
        let mut u = Utilization::default();
        u.start();
        u.add(Activity::Upload, Duration::from_millis(7));
        u.write(&path).unwrap();
        let back: UtilizationReport =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert!((back.usage.upload_s - 0.007).abs() < 1e-9);
    }
}
