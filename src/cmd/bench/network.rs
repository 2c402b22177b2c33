//! `iota bench network`: the same number of samples through the single-process section chain
//! and through a local network (`iota local`: an orchestrator and miners as child processes),
//! then one table: tokens/s of each and their ratio, wire bytes per sample, and the
//! orchestrator's request latency.
//!
//! How each number is taken:
//! - single process: `model::pipeline::Pipeline` in this process, `train_batch` + `step` per
//!   sample, timed from the first to the last sample after one warm-up sample.
//! - network: steady state only, from the first status poll that shows a completed sample to
//!   the first that shows the last one (the `--metrics-out` lines of `iota local`), so process
//!   start-up, miner registration and the run's closing merge are left out; merges within the
//!   run (every `merge_every` samples) are inside the span.
//! - single process: uses every core of the machine (the network's processes share the same
//!   cores: `--threads` compute threads per miner).
//! - bytes: counted where they move ([`crate::storage::traffic`]). Each miner counts every
//!   `PUT` and `GET` it makes (its stats file, `iota mine --stats-out`); the orchestrator
//!   counts what its store reads and writes, and what its `/blob` endpoint serves (`/metrics`),
//!   so its own traffic (token writes, read-back checks of uploads) is the store's minus the
//!   served part. Miner bytes are divided by the samples completed at the end, the
//!   orchestrator's by the samples completed between the first and the last scrape.
//! - utilization: each miner's compute time over its wall time since its first assignment,
//!   and where the rest went (its stats file).
//! - latency: from the orchestrator's `/metrics` request histogram (all routes except
//!   `/metrics` and `/api/status`), scraped during the run; a percentile is the upper bound of
//!   the bucket it falls in.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use burn::tensor::backend::AutodiffBackend;
use clap::Args;

use super::cpu;
use crate::api::MinerUsage;
use crate::cmd::model::human_bytes;
use crate::codec::WireDtype;
use crate::data::{DataSpec, Dataset, Tokenizer};
use crate::miner::utilization::UtilizationReport;
use crate::model::backend::{BackendTask, DeviceKind, dispatch};
use crate::model::config::even_sections;
use crate::model::pipeline::Pipeline;
use crate::model::{ModelConfig, OptimizerConfig};
use crate::storage::traffic::{TrafficDir, TrafficKind};

/// Arguments of `iota bench network`.
#[derive(Debug, Args)]
pub struct BenchNetworkArgs {
    /// Model preset.
    #[arg(long, value_name = "NAME", default_value = "tiny")]
    pub preset: String,
    /// Samples (micro-batches) through each variant.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub samples: u64,
    /// Pipeline sections, the layers split evenly (default: the preset's), in both the single
    /// process and the network.
    #[arg(long, value_name = "S", value_parser = clap::value_parser!(u64).range(1..))]
    pub sections: Option<u64>,
    /// Miners per section in the network.
    #[arg(long, value_name = "M", default_value_t = 1)]
    pub miners_per_section: usize,
    /// Windows per sample.
    #[arg(long, value_name = "B", default_value_t = 4)]
    pub batch_size: usize,
    /// Tokens per window.
    #[arg(long, value_name = "L", default_value_t = 64)]
    pub seq_len: usize,
    /// Compute threads per miner (keep miners x threads near the core count).
    #[arg(long, value_name = "T", default_value_t = 1)]
    pub threads: usize,
    /// Synchronous optimizer steps of G samples in the network (`iota local
    /// --samples-per-step`; 0: asynchronous). The single process is the same either way.
    #[arg(long, value_name = "G", default_value_t = 0)]
    pub samples_per_step: u64,
    /// Forwards each miner may hold awaiting their backward (`iota local --max-in-flight`,
    /// the run config's `max_in_flight`).
    #[arg(long, value_name = "K", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_in_flight: u64,
    /// Validators in the network (`iota local --validators`). A validator replays a miner's
    /// epoch on this machine's cores too; in a deployment it runs on its own.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub validators: usize,
    /// Device of the single process and of every miner (`cuda` needs `--features cuda`).
    #[arg(long, value_name = "DEVICE", default_value = "cpu")]
    pub device: DeviceKind,
}

/// Throughput of a run: samples completed over a time span.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    /// Samples completed within the span.
    pub samples: u64,
    /// Length of the span in seconds.
    pub seconds: f64,
}

impl Span {
    /// Tokens per second for samples of `tokens_per_sample` tokens (0 for an empty span).
    pub fn tokens_per_s(&self, tokens_per_sample: usize) -> f64 {
        if self.seconds <= 0.0 {
            return 0.0;
        }
        (self.samples as f64 * tokens_per_sample as f64) / self.seconds
    }
}

/// Steady-state span of a network run from the JSON lines of `iota local --metrics-out`
/// (`t_s`, `completed` per poll): from the first poll with a completed sample to the first
/// poll that shows the final count, counting the samples completed in between. Polls after
/// the last sample (the run's closing merge and evaluation, the miners' shutdown) are left
/// out: on a fast device they outweigh a short run's training.
///
/// Returns `None` when fewer than two polls show completed samples or no time passed.
pub fn steady_state(metrics_jsonl: &str) -> Option<Span> {
    let polls: Vec<(f64, u64)> = metrics_jsonl
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| Some((v["t_s"].as_f64()?, v["completed"].as_u64()?)))
        .filter(|&(_, c)| c > 0)
        .collect();
    let (t0, c0) = *polls.first()?;
    let last = polls.iter().map(|&(_, c)| c).max()?;
    let &(t1, c1) = polls.iter().find(|&&(_, c)| c == last)?;
    (t1 > t0 && c1 > c0).then_some(Span {
        samples: c1 - c0,
        seconds: t1 - t0,
    })
}

/// Cumulative request-latency histogram summed over routes: `(upper bound s, count)` sorted
/// by bound, the last bound being infinity.
///
/// Reads the `iota_request_seconds_bucket{route="..",le=".."} N` lines of Prometheus text and
/// skips the routes named in `skip`. Lines that do not parse are ignored.
pub fn latency_histogram(prometheus: &str, skip: &[&str]) -> Vec<(f64, u64)> {
    let mut buckets: Vec<(f64, u64)> = Vec::new();
    for line in prometheus.lines() {
        let Some(rest) = line.strip_prefix("iota_request_seconds_bucket{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |key: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix("=\"")?.strip_suffix('"'))
        };
        let (Some(route), Some(le), Ok(n)) = (label("route"), label("le"), value.trim().parse())
        else {
            continue;
        };
        if skip.contains(&route) {
            continue;
        }
        let bound = if le == "+Inf" {
            f64::INFINITY
        } else {
            match le.parse::<f64>() {
                Ok(b) => b,
                Err(_) => continue,
            }
        };
        match buckets.iter_mut().find(|(b, _)| *b == bound) {
            Some((_, count)) => *count += n,
            None => buckets.push((bound, n)),
        }
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

/// Upper bound (seconds) of the bucket that holds quantile `q` (0..=1) of a cumulative
/// histogram; `None` when it is empty. May be infinite when the quantile lies past the last
/// finite bound.
pub fn quantile_bound(histogram: &[(f64, u64)], q: f64) -> Option<f64> {
    let total = histogram.last()?.1;
    if total == 0 {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * total as f64).ceil().max(1.0) as u64;
    histogram
        .iter()
        .find(|&&(_, count)| count >= rank)
        .map(|&(bound, _)| bound)
}

/// Result of the single-process run.
struct Single {
    span: Span,
    wire_bytes_per_sample: usize,
}

struct Task {
    cfg: ModelConfig,
    batch: usize,
    seq: usize,
    samples: u64,
}

impl BackendTask for Task {
    type Output = anyhow::Result<Single>;

    fn run<B: AutodiffBackend>(self, device: B::Device) -> Self::Output {
        let data = Dataset::load(&DataSpec::default(), &Tokenizer::byte(), self.seq, 0)?;
        let mut pipeline = Pipeline::<B>::new(
            &self.cfg,
            0,
            OptimizerConfig::default(),
            WireDtype::default(),
            &device,
        )?;
        let mut wire_bytes = 0;
        let mut started = Instant::now();
        // Sample 0 warms up (allocations, caches) and is not timed.
        for s in 0..=self.samples {
            if s == 1 {
                started = Instant::now();
            }
            let owned: Vec<_> = (0..self.batch)
                .map(|i| data.train_sample(s * self.batch as u64 + i as u64))
                .collect();
            let windows: Vec<&[u32]> = owned.iter().map(AsRef::as_ref).collect();
            let report = pipeline.train_batch(&windows)?;
            wire_bytes = report.bytes_forward + report.bytes_backward;
            pipeline.step(1e-3);
        }
        // The last step's kernels may still be queued on a GPU.
        B::sync(&device).map_err(|e| anyhow::anyhow!("device sync: {e:?}"))?;
        Ok(Single {
            span: Span {
                samples: self.samples,
                seconds: started.elapsed().as_secs_f64(),
            },
            wire_bytes_per_sample: wire_bytes,
        })
    }
}

/// What the network run measured.
struct Network {
    span: Span,
    histogram: Vec<(f64, u64)>,
    /// Samples completed by the end.
    completed: u64,
    /// Each miner's last report.
    miners: Vec<UtilizationReport>,
    /// Each miner's time in the steady state (as its reports at the first and last scrapes
    /// of it saw it), where both were read.
    steady_miners: Option<Vec<UtilizationReport>>,
    /// The orchestrator's own traffic per completed sample: `(kind, dir, bytes)`.
    orchestrator: Vec<(String, String, f64)>,
    /// CPU time by process in the steady state (`None` without `/proc`).
    cpu: Option<cpu::Breakdown>,
}

/// CPU time from the first scrape that saw a completed sample to the first that saw the most
/// (the steady state's span, as the scrapes saw it).
fn steady_cpu(snapshots: &[(u64, cpu::Snapshot)]) -> Option<cpu::Breakdown> {
    let most = snapshots.iter().map(|s| s.0).max()?;
    let first = snapshots.iter().find(|s| s.0 > 0)?;
    let last = snapshots.iter().find(|s| s.0 == most)?;
    (last.0 > first.0).then(|| cpu::between(&first.1, &last.1))
}

/// Counter values `name{...kind="K",dir="D"} V` of Prometheus text, summed by (kind, dir).
pub fn traffic_counters(prometheus: &str, name: &str) -> BTreeMap<(String, String), f64> {
    let mut out = BTreeMap::new();
    for line in prometheus.lines() {
        let Some(rest) = line.strip_prefix(name).and_then(|r| r.strip_prefix('{')) else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |key: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix("=\"")?.strip_suffix('"'))
                .map(str::to_string)
        };
        let (Some(kind), Some(dir), Ok(v)) =
            (label("kind"), label("dir"), value.trim().parse::<f64>())
        else {
            continue;
        };
        *out.entry((kind, dir)).or_insert(0.0) += v;
    }
    out
}

/// The value of an unlabelled or singly-labelled sample line (`name{label} V` or `name V`).
fn sample_value(prometheus: &str, name_and_labels: &str) -> Option<f64> {
    prometheus.lines().find_map(|l| {
        l.strip_prefix(name_and_labels)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The orchestrator's own bytes (store minus what `/blob` served) in a scrape.
pub(super) fn own_traffic(prometheus: &str) -> BTreeMap<(String, String), f64> {
    let mut own = traffic_counters(prometheus, "iota_store_bytes_total");
    for (k, v) in traffic_counters(prometheus, "iota_blob_bytes_total") {
        if let Some(x) = own.get_mut(&k) {
            *x = (*x - v).max(0.0);
        }
    }
    own
}

/// Every miner's stats file (`iota mine --stats-out`) in `stats`, the directory `iota local`
/// writes them to.
///
/// # Errors
/// A directory or file that cannot be read or parsed.
pub(super) fn miner_stats(stats: &Path) -> anyhow::Result<Vec<UtilizationReport>> {
    Ok(miner_stats_by_file(stats)?.into_values().collect())
}

/// [`miner_stats`] by file (one file per miner).
///
/// # Errors
/// A directory or file that cannot be read or parsed.
fn miner_stats_by_file(stats: &Path) -> anyhow::Result<BTreeMap<PathBuf, UtilizationReport>> {
    let mut miners = BTreeMap::new();
    for entry in fs::read_dir(stats).with_context(|| format!("reading {}", stats.display()))? {
        let path = entry.context("listing miner stats")?.path();
        if path.extension().is_some_and(|e| e == "json") {
            let report: UtilizationReport = serde_json::from_slice(
                &fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
            )
            .with_context(|| format!("parsing {}", path.display()))?;
            miners.insert(path, report);
        }
    }
    Ok(miners)
}

/// Each miner's time between its report in `a` and its report in `b` (a miner absent from
/// `a` had not started: all of `b`), ordered by section. Traffic is left out.
fn usage_between(
    a: &BTreeMap<PathBuf, UtilizationReport>,
    b: &BTreeMap<PathBuf, UtilizationReport>,
) -> Vec<UtilizationReport> {
    let mut out: Vec<UtilizationReport> = b
        .iter()
        .map(|(path, end)| {
            let start = a.get(path);
            let usage = end
                .usage
                .since(start.map(|r| &r.usage).unwrap_or(&MinerUsage::default()));
            UtilizationReport {
                section: end.section,
                utilization: usage.utilization(),
                usage,
                traffic: Vec::new(),
                adopted: end.adopted.saturating_sub(start.map_or(0, |r| r.adopted)),
            }
        })
        .collect();
    out.sort_by_key(|m| m.section);
    out
}

/// Empties (or creates) `dir` for a fresh network run and finds a free loopback port for it.
///
/// # Errors
/// A directory that cannot be cleared or created, or no free port.
pub(super) fn fresh_run_dir(dir: &Path) -> anyhow::Result<SocketAddr> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("finding a free port")
}

/// `GET /metrics` from `addr` with a plain HTTP/1.0 request; the body on success.
pub(super) fn scrape(addr: SocketAddr) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.to_string())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_string()))
}

/// Runs the network of `n_miners` miners in `dir` and measures it.
fn run_network(args: &BenchNetworkArgs, n_miners: usize, dir: &Path) -> anyhow::Result<Network> {
    let listen = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("finding a free port")?;
    let metrics = dir.join("metrics.jsonl");
    let exe = std::env::current_exe().context("locating the iota binary")?;
    let log = dir.join("local.log");
    let out = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone().context("duplicating the log file")?;
    let mut child = Command::new(exe)
        .arg("local")
        .args(["--preset", &args.preset])
        .args(["--samples", &args.samples.to_string()])
        .args(["--miners-per-section", &args.miners_per_section.to_string()])
        .args(
            args.sections
                .map(|s| vec!["--sections".to_string(), s.to_string()])
                .unwrap_or_default(),
        )
        .args(["--batch-size", &args.batch_size.to_string()])
        .args(["--seq-len", &args.seq_len.to_string()])
        .args(["--threads", &args.threads.max(1).to_string()])
        .args(["--samples-per-step", &args.samples_per_step.to_string()])
        .args(["--max-in-flight", &args.max_in_flight.to_string()])
        .args(["--validators", &args.validators.to_string()])
        .args(["--device", &args.device.to_string()])
        .args(["--listen", &listen.to_string()])
        .args(["--poll-ms", "200"])
        .arg("--dir")
        .arg(dir.join("net"))
        .arg("--metrics-out")
        .arg(&metrics)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .context("starting iota local")?;
    // Scrape the histogram while the network runs: `iota local` stops the orchestrator when
    // it is done, so the last scrape is the one kept.
    let mut last_scrape = None;
    let mut first_busy_scrape: Option<String> = None;
    // The machine's and the network's CPU time at each scrape, with the samples completed.
    // The miners' reports: first at the first scrape that saw a sample and a report of every
    // miner, then at the first scrape of each later count (the last of which ends the steady
    // state).
    let mut cpu_snapshots: Vec<(u64, cpu::Snapshot)> = Vec::new();
    let stats_dir = dir.join("net/stats");
    let mut stats_first: Option<BTreeMap<PathBuf, UtilizationReport>> = None;
    let mut stats_last: Option<(u64, BTreeMap<PathBuf, UtilizationReport>)> = None;
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for iota local")? {
            break status;
        }
        if let Some(text) = scrape(listen) {
            let done = sample_value(&text, "iota_samples_total{outcome=\"completed\"}")
                .unwrap_or(0.0) as u64;
            if first_busy_scrape.is_none() && done > 0 {
                first_busy_scrape = Some(text.clone());
            }
            if let Some(snap) = cpu::snapshot(child.id()) {
                cpu_snapshots.push((done, snap));
            }
            if done > 0 && stats_last.as_ref().is_none_or(|l| done > l.0) {
                // A stats file is replaced whole (renamed into place); one not written yet
                // is not there.
                if let Ok(stats) = miner_stats_by_file(&stats_dir) {
                    if stats_first.is_none() && stats.len() == n_miners {
                        stats_first = Some(stats.clone());
                    }
                    if stats_first.is_some() {
                        stats_last = Some((done, stats));
                    }
                }
            }
            last_scrape = Some(text);
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    if !status.success() {
        let tail = fs::read_to_string(&log).unwrap_or_default();
        let tail: String = tail
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        bail!("iota local failed ({status}):\n{tail}");
    }
    let text =
        fs::read_to_string(&metrics).with_context(|| format!("reading {}", metrics.display()))?;
    let span = steady_state(&text).context(
        "the network completed too few samples to measure a steady state (raise --samples)",
    )?;
    let completed = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["completed"].as_u64())
        .max()
        .unwrap_or(0);
    let cpu = steady_cpu(&cpu_snapshots);
    let mut orchestrator = Vec::new();
    if let (Some(first), Some(last)) = (&first_busy_scrape, &last_scrape) {
        let done = |t: &str| sample_value(t, "iota_samples_total{outcome=\"completed\"}");
        let samples = done(last).unwrap_or(0.0) - done(first).unwrap_or(0.0);
        if samples > 0.0 {
            let before = own_traffic(first);
            for ((kind, dir), v) in own_traffic(last) {
                let delta = v - before
                    .get(&(kind.clone(), dir.clone()))
                    .copied()
                    .unwrap_or(0.0);
                orchestrator.push((kind, dir, delta / samples));
            }
        }
    }
    let mut miners = miner_stats(&stats_dir)?;
    miners.sort_by_key(|m| m.section);
    let steady_miners = match (&stats_first, &stats_last) {
        (Some(a), Some((_, b))) => Some(usage_between(a, b)),
        _ => None,
    };
    let histogram = last_scrape
        .map(|t| latency_histogram(&t, &["/metrics", "/api/status"]))
        .unwrap_or_default();
    Ok(Network {
        span,
        histogram,
        completed,
        miners,
        steady_miners,
        orchestrator,
        cpu,
    })
}

/// Bytes per completed sample by kind, miners (counted by each miner) and orchestrator
/// (counted by its store).
fn print_traffic(net: &Network, chain_bytes: usize, cfg: &ModelConfig) {
    let samples = net.completed.max(1) as f64;
    let mut miners: BTreeMap<(TrafficKind, bool), u64> = BTreeMap::new();
    for m in &net.miners {
        for t in &m.traffic {
            *miners.entry((t.kind, t.dir == TrafficDir::Up)).or_insert(0) += t.count.bytes;
        }
    }
    println!(
        "\nbytes per completed sample, counted   up (PUT)    down (GET)   ({} samples completed)",
        net.completed
    );
    let mut total = 0.0;
    for kind in TrafficKind::ALL {
        let up = miners.get(&(kind, true)).copied().unwrap_or(0) as f64 / samples;
        let down = miners.get(&(kind, false)).copied().unwrap_or(0) as f64 / samples;
        if up + down > 0.0 {
            total += up + down;
            println!(
                "miners: {:<28} {:>10}  {:>10}",
                kind.label(),
                human_bytes(up.round() as usize),
                human_bytes(down.round() as usize)
            );
        }
    }
    for kind in TrafficKind::ALL {
        let get = |dir: &str| {
            net.orchestrator
                .iter()
                .find(|(k, d, _)| k == kind.label() && d == dir)
                .map_or(0.0, |x| x.2)
        };
        let (up, down) = (get("up"), get("down"));
        if up + down > 0.0 {
            total += up + down;
            let what = if down > 0.0 {
                "writes / read-backs"
            } else {
                "writes"
            };
            println!(
                "orchestrator: {:<22} {:>10}  {:>10}",
                format!("{} ({what})", kind.label()),
                human_bytes(up.round() as usize),
                human_bytes(down.round() as usize)
            );
        }
    }
    println!(
        "all storage traffic per sample        {:>10}",
        human_bytes(total.round() as usize)
    );
    println!(
        "codec size in the chain               {:>10}  (activations + gradients over {} boundaries, {}; for comparison)",
        human_bytes(chain_bytes),
        cfg.n_sections().saturating_sub(1),
        WireDtype::default()
    );
}

/// Each miner's utilization and where the rest of its time went: in the steady state where
/// its reports there were read, otherwise since its first assignment; the last column is
/// always the whole run's.
fn print_utilization(net: &Network) {
    let (rows, window) = match &net.steady_miners {
        Some(steady) if steady.len() == net.miners.len() => (steady, "steady state"),
        _ => (&net.miners, "whole run"),
    };
    println!(
        "\nminer  section  utilization  compute s  download s  upload s  orchestrator s  idle s  merge s  other s  wall s  whole run  ({window})"
    );
    for (i, (m, whole)) in rows.iter().zip(&net.miners).enumerate() {
        let u = &m.usage;
        let other = u.wall_s
            - (u.compute_s + u.download_s + u.upload_s + u.orchestrator_s + u.idle_s + u.merge_s);
        println!(
            "{i:<5}  {:<7}  {:>10.1}%  {:>9.2}  {:>10.2}  {:>8.2}  {:>14.2}  {:>6.2}  {:>7.2}  {:>7.2}  {:>6.2}  {:>8.1}%",
            m.section.map_or("-".into(), |s| s.to_string()),
            100.0 * m.utilization,
            u.compute_s,
            u.download_s,
            u.upload_s,
            u.orchestrator_s,
            u.idle_s,
            u.merge_s,
            other.max(0.0),
            u.wall_s,
            100.0 * whole.utilization
        );
    }
}

fn fmt_ms(bound: Option<f64>) -> String {
    match bound {
        Some(b) if b.is_finite() => format!("<= {:.1} ms", b * 1e3),
        Some(_) => "> 5000 ms".into(),
        None => "-".into(),
    }
}

/// Runs `iota bench network`.
///
/// # Errors
/// Unknown preset, zero samples, a network that fails or completes too few samples.
pub fn run(args: BenchNetworkArgs) -> anyhow::Result<()> {
    if args.samples < 2 {
        bail!("--samples must be at least 2");
    }
    let mut cfg = ModelConfig::preset(&args.preset)?;
    if let Some(n) = args.sections {
        cfg.sections = even_sections(cfg.n_layers, n as usize);
    }
    // The network's orchestrator refuses windows longer than the model's: so does the bench,
    // before it spends the single process's run.
    if args.seq_len > cfg.max_seq_len {
        bail!(
            "--seq-len {} is longer than preset {}'s max_seq_len {}",
            args.seq_len,
            cfg.name,
            cfg.max_seq_len
        );
    }
    let tokens_per_sample = args.batch_size * args.seq_len;
    println!(
        "iota bench network: preset {}, {} samples of {} x {} tokens, {} sections x {} miners ({} threads each, {}, at most {} in flight, device {}); single process on all {} cores",
        cfg.name,
        args.samples,
        args.batch_size,
        args.seq_len,
        cfg.n_sections(),
        args.miners_per_section.max(1),
        args.threads.max(1),
        match args.samples_per_step {
            0 => "asynchronous steps".to_string(),
            g => format!("synchronous steps of {g} samples"),
        },
        args.max_in_flight,
        args.device,
        rayon::current_num_threads()
    );
    let task = Task {
        cfg: cfg.clone(),
        batch: args.batch_size,
        seq: args.seq_len,
        samples: args.samples,
    };
    let single = dispatch(args.device, task)
        .map_err(anyhow::Error::msg)?
        .context("running the single-process chain")?;

    let tmp = std::env::temp_dir().join(format!("iota-bench-network-{}", std::process::id()));
    fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let n_miners = cfg.n_sections() * args.miners_per_section.max(1);
    let net = run_network(&args, n_miners, &tmp);
    // Best effort: a leftover directory in /tmp is harmless.
    let _ = fs::remove_dir_all(&tmp);
    let net = net?;

    let single_tps = single.span.tokens_per_s(tokens_per_sample);
    let net_tps = net.span.tokens_per_s(tokens_per_sample);
    println!("\nvariant                     samples  seconds   tokens/s");
    println!(
        "single process (chain)      {:>7}  {:>7.2}  {:>9.1}",
        single.span.samples, single.span.seconds, single_tps
    );
    println!(
        "local network (steady)      {:>7}  {:>7.2}  {:>9.1}",
        net.span.samples, net.span.seconds, net_tps
    );
    println!(
        "network / single            {:>27.3}",
        net_tps / single_tps.max(1e-9)
    );
    print_traffic(&net, single.wire_bytes_per_sample, &cfg);
    print_utilization(&net);
    if let Some(b) = &net.cpu {
        cpu::print(b);
    }
    let total: u64 = net.histogram.last().map_or(0, |b| b.1);
    println!(
        "orchestrator latency        p50 {}  p99 {}  ({} requests, /metrics histogram bucket bounds)",
        fmt_ms(quantile_bound(&net.histogram, 0.5)),
        fmt_ms(quantile_bound(&net.histogram, 0.99)),
        total
    );
    println!(
        "network tokens/s is the steady state: first to last completed sample as the status polls saw them (start-up, registration and the closing merge excluded; merges within the run included)"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_state_starts_at_the_first_completed_sample() {
        let text = "{\"t_s\":0.0,\"completed\":0}\n\
                    {\"t_s\":2.0,\"completed\":0}\n\
                    {\"t_s\":3.0,\"completed\":2}\n\
                    not json\n\
                    {\"t_s\":5.0,\"completed\":10}\n";
        let span = steady_state(text).unwrap();
        assert_eq!(span.samples, 8);
        assert!((span.seconds - 2.0).abs() < 1e-12);
        // Polls after the last sample (the closing merge) do not lengthen the span.
        let tail = format!("{text}{{\"t_s\":9.0,\"completed\":10}}\n");
        assert_eq!(steady_state(&tail), Some(span));
        // 8 samples x 16 tokens / 2 s = 64 tokens/s.
        assert!((span.tokens_per_s(16) - 64.0).abs() < 1e-9);
    }

    #[test]
    fn a_window_longer_than_the_presets_is_refused_before_anything_runs() {
        let args = BenchNetworkArgs {
            preset: "tiny".into(),
            samples: 2,
            sections: None,
            miners_per_section: 1,
            batch_size: 1,
            seq_len: 65,
            threads: 1,
            samples_per_step: 0,
            max_in_flight: 4,
            validators: 1,
            device: DeviceKind::Cpu,
        };
        let err = format!("{:#}", run(args).unwrap_err());
        assert!(
            err.contains("--seq-len 65") && err.contains("max_seq_len 64"),
            "{err}"
        );
    }

    #[test]
    fn steady_cpu_spans_the_first_busy_scrape_to_the_first_with_every_sample() {
        let snap = |busy: u64, miner: u64| cpu::Snapshot {
            machine: cpu::MachineTicks { busy, idle: 0 },
            procs: BTreeMap::from([(9, (cpu::Role::Miner, miner))]),
        };
        let scrapes = [
            (0, snap(100, 10)),
            (3, snap(200, 20)),
            (7, snap(300, 70)),
            (9, snap(400, 100)),
            // The closing merge, after the last sample: outside the span.
            (9, snap(900, 500)),
        ];
        let b = steady_cpu(&scrapes).unwrap();
        // From the scrape with 3 samples to the first with 9: 80 of the 200 busy ticks were
        // the miner's.
        let (n, miner_s) = b.roles[&cpu::Role::Miner];
        assert_eq!(n, 1);
        assert!(
            (miner_s / (miner_s + b.other_s) - 0.4).abs() < 1e-12,
            "{b:?}"
        );
        assert_eq!(b.idle_s, 0.0);
        assert_eq!(
            steady_cpu(&scrapes[..2]),
            None,
            "one busy scrape is no span"
        );
        assert_eq!(steady_cpu(&[]), None);
    }

    #[test]
    fn steady_usage_is_the_difference_of_each_miners_reports() {
        let report =
            |section: usize, wall_s: f64, compute_s: f64, merge_s: f64| UtilizationReport {
                section: Some(section),
                usage: MinerUsage {
                    wall_s,
                    compute_s,
                    merge_s,
                    ..MinerUsage::default()
                },
                ..UtilizationReport::default()
            };
        let a = BTreeMap::from([(PathBuf::from("m1.json"), report(1, 2.0, 1.0, 0.0))]);
        let b = BTreeMap::from([
            (PathBuf::from("m1.json"), report(1, 12.0, 10.0, 0.5)),
            // Absent from the first: counted from its first assignment.
            (PathBuf::from("m0.json"), report(0, 4.0, 3.0, 0.0)),
        ]);
        let got = usage_between(&a, &b);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].section, Some(0));
        assert!((got[0].utilization - 0.75).abs() < 1e-12);
        assert_eq!(got[1].section, Some(1));
        assert!((got[1].usage.wall_s - 10.0).abs() < 1e-12);
        assert!((got[1].usage.merge_s - 0.5).abs() < 1e-12);
        assert!((got[1].utilization - 0.9).abs() < 1e-12);
    }

    #[test]
    fn steady_state_needs_progress() {
        assert_eq!(steady_state(""), None);
        assert_eq!(steady_state("{\"t_s\":1.0,\"completed\":3}\n"), None);
        assert_eq!(
            Span {
                samples: 3,
                seconds: 0.0
            }
            .tokens_per_s(10),
            0.0
        );
    }

    #[test]
    fn traffic_counters_sum_by_kind_and_dir() {
        let text = "iota_store_bytes_total{kind=\"tokens\",dir=\"up\"} 100\n\
            iota_store_bytes_total{kind=\"activations\",dir=\"down\"} 300\n\
            iota_blob_bytes_total{kind=\"activations\",dir=\"down\"} 200\n\
            iota_store_requests_total{kind=\"tokens\",dir=\"up\"} 4\n\
            iota_samples_total{outcome=\"completed\"} 7\n";
        let own = own_traffic(text);
        assert_eq!(own[&("tokens".into(), "up".into())], 100.0);
        assert_eq!(own[&("activations".into(), "down".into())], 100.0);
        assert_eq!(own.len(), 2);
        assert_eq!(
            sample_value(text, "iota_samples_total{outcome=\"completed\"}"),
            Some(7.0)
        );
    }

    #[test]
    fn histogram_sums_routes_and_skips_some() {
        let text = "iota_request_seconds_bucket{route=\"/api/work\",le=\"0.001\"} 1\n\
            iota_request_seconds_bucket{route=\"/api/work\",le=\"0.01\"} 3\n\
            iota_request_seconds_bucket{route=\"/api/work\",le=\"+Inf\"} 4\n\
            iota_request_seconds_bucket{route=\"/api/result\",le=\"0.001\"} 0\n\
            iota_request_seconds_bucket{route=\"/api/result\",le=\"0.01\"} 5\n\
            iota_request_seconds_bucket{route=\"/api/result\",le=\"+Inf\"} 6\n\
            iota_request_seconds_bucket{route=\"/metrics\",le=\"+Inf\"} 99\n\
            iota_request_seconds_count{route=\"/api/work\"} 4\n";
        let h = latency_histogram(text, &["/metrics"]);
        assert_eq!(h, vec![(0.001, 1), (0.01, 8), (f64::INFINITY, 10)]);
        // Rank 5 of 10 falls in the 0.01 bucket, rank 10 past the last finite bound.
        assert_eq!(quantile_bound(&h, 0.5), Some(0.01));
        assert_eq!(quantile_bound(&h, 0.1), Some(0.001));
        assert_eq!(quantile_bound(&h, 0.99), Some(f64::INFINITY));
        assert_eq!(quantile_bound(&[], 0.5), None);
        assert_eq!(fmt_ms(Some(0.0025)), "<= 2.5 ms");
    }
}
