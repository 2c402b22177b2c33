//! In-process counters rendered as Prometheus text on `GET /metrics`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::api::MinerUsage;

/// Upper bounds (seconds) of the request-latency histogram buckets.
pub const LATENCY_BUCKETS: [f64; 10] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0];

#[derive(Debug, Default, Clone)]
struct RouteStats {
    by_status: BTreeMap<u16, u64>,
    buckets: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum_s: f64,
}

/// Request and routing counters.
#[derive(Debug, Default)]
pub struct Metrics {
    routes: Mutex<BTreeMap<String, RouteStats>>,
    /// Results accepted.
    pub accepted: AtomicU64,
    /// Results refused (bad payload, late).
    pub refused: AtomicU64,
    /// Assignments that missed their deadline.
    pub expired: AtomicU64,
    /// Each miner's latest self-reported usage (section, usage), by hotkey.
    usage: Mutex<BTreeMap<String, (usize, MinerUsage)>>,
}

impl Metrics {
    /// Records one request on `route` with `status`, taking `seconds`.
    pub fn observe(&self, route: &str, status: u16, seconds: f64) {
        let mut routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        let stats = routes.entry(route.to_string()).or_default();
        *stats.by_status.entry(status).or_default() += 1;
        stats.count += 1;
        stats.sum_s += seconds;
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(stats.buckets.iter_mut()) {
            if seconds <= *bound {
                *bucket += 1;
            }
        }
    }

    /// Adds one to a counter.
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Keeps `hotkey`'s latest usage report (from its heartbeat).
    pub fn record_usage(&self, hotkey: &str, section: usize, usage: &MinerUsage) {
        let mut map = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(hotkey.to_string(), (section, usage.clone()));
    }

    /// Prometheus text of the miners' self-reported utilization, time by activity and bytes.
    pub fn render_usage(&self, out: &mut String) {
        let map = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        if map.is_empty() {
            return;
        }
        out.push_str(
            "# HELP iota_miner_utilization Compute time over wall time since the miner's first assignment (self-reported at heartbeats).\n\
             # TYPE iota_miner_utilization gauge\n",
        );
        for (hotkey, (section, u)) in map.iter() {
            let ratio = u.utilization();
            let _ = writeln!(
                out,
                "iota_miner_utilization{{miner=\"{hotkey}\",section=\"{section}\"}} {ratio}"
            );
        }
        out.push_str(
            "# HELP iota_miner_seconds_total Miner wall time by activity (self-reported).\n\
             # TYPE iota_miner_seconds_total counter\n",
        );
        for (hotkey, (section, u)) in map.iter() {
            for (activity, v) in [
                ("wall", u.wall_s),
                ("compute", u.compute_s),
                ("download", u.download_s),
                ("upload", u.upload_s),
                ("orchestrator", u.orchestrator_s),
                ("idle", u.idle_s),
                ("merge", u.merge_s),
            ] {
                let _ = writeln!(
                    out,
                    "iota_miner_seconds_total{{miner=\"{hotkey}\",section=\"{section}\",activity=\"{activity}\"}} {v}"
                );
            }
        }
        out.push_str(
            "# HELP iota_miner_bytes_total Bytes a miner moved through storage URLs (self-reported).\n\
             # TYPE iota_miner_bytes_total counter\n",
        );
        for (hotkey, (section, u)) in map.iter() {
            for (dir, v) in [("up", u.bytes_up), ("down", u.bytes_down)] {
                let _ = writeln!(
                    out,
                    "iota_miner_bytes_total{{miner=\"{hotkey}\",section=\"{section}\",dir=\"{dir}\"}} {v}"
                );
            }
        }
    }

    /// Prometheus text of the request counters and latency histograms, the storage traffic
    /// counters and the miners' usage.
    pub fn render_requests(&self, out: &mut String) {
        let routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        out.push_str("# HELP iota_requests_total HTTP requests by route and status.\n");
        out.push_str("# TYPE iota_requests_total counter\n");
        for (route, stats) in routes.iter() {
            for (status, n) in &stats.by_status {
                let _ = writeln!(
                    out,
                    "iota_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
                );
            }
        }
        out.push_str("# HELP iota_request_seconds HTTP request latency by route.\n");
        out.push_str("# TYPE iota_request_seconds histogram\n");
        for (route, stats) in routes.iter() {
            for (bound, n) in LATENCY_BUCKETS.iter().zip(stats.buckets.iter()) {
                let _ = writeln!(
                    out,
                    "iota_request_seconds_bucket{{route=\"{route}\",le=\"{bound}\"}} {n}"
                );
            }
            let _ = writeln!(
                out,
                "iota_request_seconds_bucket{{route=\"{route}\",le=\"+Inf\"}} {}",
                stats.count
            );
            let _ = writeln!(
                out,
                "iota_request_seconds_sum{{route=\"{route}\"}} {}",
                stats.sum_s
            );
            let _ = writeln!(
                out,
                "iota_request_seconds_count{{route=\"{route}\"}} {}",
                stats.count
            );
        }
        for (name, help, counter) in [
            (
                "iota_results_accepted_total",
                "Results accepted.",
                &self.accepted,
            ),
            (
                "iota_results_refused_total",
                "Results refused.",
                &self.refused,
            ),
            (
                "iota_assignments_expired_total",
                "Assignments past their deadline.",
                &self.expired,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            let _ = writeln!(out, "{name} {}", counter.load(Ordering::Relaxed));
        }
        out.push_str(
            "# HELP iota_store_bytes_total Bytes this orchestrator's store read (down) and wrote (up), by object kind; includes what /blob served.\n\
             # TYPE iota_store_bytes_total counter\n",
        );
        crate::storage::traffic::global().render("iota_store", "", out);
        out.push_str(
            "# HELP iota_blob_bytes_total Bytes clients uploaded (up) and downloaded (down) through /blob, by object kind.\n\
             # TYPE iota_blob_bytes_total counter\n",
        );
        crate::storage::traffic::served().render("iota_blob", "", out);
        self.render_usage(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let m = Metrics::default();
        m.observe("/api/work", 200, 0.003);
        m.observe("/api/work", 200, 0.2);
        m.observe("/api/work", 401, 10.0);
        let mut out = String::new();
        m.render_requests(&mut out);
        assert!(out.contains("iota_requests_total{route=\"/api/work\",status=\"200\"} 2"));
        assert!(out.contains("iota_requests_total{route=\"/api/work\",status=\"401\"} 1"));
        assert!(out.contains("iota_request_seconds_bucket{route=\"/api/work\",le=\"0.001\"} 0"));
        assert!(out.contains("iota_request_seconds_bucket{route=\"/api/work\",le=\"0.005\"} 1"));
        assert!(out.contains("iota_request_seconds_bucket{route=\"/api/work\",le=\"0.25\"} 2"));
        assert!(out.contains("iota_request_seconds_bucket{route=\"/api/work\",le=\"+Inf\"} 3"));
        assert!(out.contains("iota_request_seconds_count{route=\"/api/work\"} 3"));
    }
}
