//! `iota bench merge`: one real merge of N miners, in each merge format. Each run is a local
//! network (`iota local`: an orchestrator and N `iota mine` processes) of a model with one
//! section, so all N miners merge the same state concurrently: they train a few samples,
//! upload their flat state (parameters and both AdamW moments), read their partitions' slices
//! of every upload, merge and upload them, the orchestrator verifies the copies and writes
//! the checkpoint, and every miner adopts it. That is the protocol miners run
//! (`miner::participant`, the worker's merge round, `orchestrator::{cycle, finalize}`), not a
//! simulation of it.
//!
//! How each number is taken:
//! - bytes: counted where they move ([`crate::storage::traffic`]): each miner counts every
//!   `PUT` and `GET` it makes (`iota mine --stats-out`), by object kind: its upload, the
//!   slices it reads to merge, the partitions it writes, and the checkpoint (or, with `dct`,
//!   the checkpoint's delta) it downloads to adopt. The orchestrator's own bytes (copies and
//!   read-back checks of uploads, reading the partition copies, writing the checkpoint) are
//!   its store's counters between two `/metrics` scrapes, before the merge and after it.
//!   The stats files are read as soon as each shows its adoption, during the epoch after the
//!   merge (each network trains a second, shorter epoch whose closing merge is not measured).
//! - wall time: from the first status poll (every 20 ms) that shows the phase `uploading`
//!   to the first that shows every miner holding the merged state (`weights_epoch` 1, which
//!   each miner reports as soon as it adopted). It includes the orchestrator's ticks and the
//!   miners' polls, as a real merge does.
//! - verification: the merge's own status (flagged mergers, recomputed partitions, fallbacks)
//!   and every miner's reported hash of the state it holds, which must equal the checkpoint's.

use std::collections::BTreeMap;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;

use super::network::{fresh_run_dir, own_traffic, scrape};
use crate::api::client::ApiClient;
use crate::api::{MergeStatus, Phase, StatusResponse};
use crate::cmd::local::{LocalArgs, generated_config};
use crate::cmd::model::human_bytes;
use crate::codec::{MergeWire, Span};
use crate::merge::MergeOp;
use crate::miner::utilization::UtilizationReport;
use crate::model::ModelConfig;
use crate::model::backend::DeviceKind;
use crate::model::layout::section_layout;
use crate::storage::RetryPolicy;
use crate::storage::traffic::{TrafficDir, TrafficKind};

/// Arguments of `iota bench merge`.
#[derive(Debug, Args)]
pub struct BenchMergeArgs {
    /// Model preset; the whole model is one section, so every miner merges the same state.
    #[arg(long, value_name = "NAME", default_value = "tiny")]
    pub preset: String,
    /// Miner counts to run, comma-separated (one network each).
    #[arg(
        long,
        value_name = "N,..",
        value_delimiter = ',',
        default_value = "2,4,8"
    )]
    pub miners: Vec<usize>,
    /// Merge formats to measure, comma-separated (`merge.wire`).
    #[arg(
        long,
        value_name = "FORMAT,..",
        value_delimiter = ',',
        default_value = "f32,bf16,int8,dct,sign,q4v2,q4v2m2:128"
    )]
    pub wire: Vec<MergeWire>,
    /// Training samples per miner before the merge (1 x 16 tokens each).
    #[arg(long, value_name = "K", default_value_t = 2)]
    pub samples_per_miner: u64,
    /// Merge operator.
    #[arg(long, value_name = "OP", default_value = "mean")]
    pub op: MergeOp,
    /// Keep the runs (configs, logs, stats, state) in this directory.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Give up a run after this many seconds.
    #[arg(long, value_name = "S", default_value_t = 600)]
    pub timeout_s: u64,
}

/// Bytes one miner moved in the merge, by what they were.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MinerBytes {
    /// Its flat state uploaded.
    pub upload: u64,
    /// Slices of the uploads read to merge its partitions.
    pub reads: u64,
    /// Its merged partitions uploaded.
    pub partitions: u64,
    /// The merged state downloaded to adopt it (the checkpoint or its delta).
    pub adopt: u64,
}

impl MinerBytes {
    /// Everything it moved.
    pub fn total(&self) -> u64 {
        self.upload + self.reads + self.partitions + self.adopt
    }

    /// The merge's bytes in a miner's stats (its training traffic is left out).
    pub fn of(report: &UtilizationReport) -> Self {
        let mut b = Self::default();
        for t in &report.traffic {
            let n = t.count.bytes;
            match (t.kind, t.dir) {
                (TrafficKind::MergeUploads, TrafficDir::Up) => b.upload += n,
                (TrafficKind::MergeUploads, TrafficDir::Down) => b.reads += n,
                (TrafficKind::MergedPartitions, TrafficDir::Up) => b.partitions += n,
                (TrafficKind::MergedPartitions, TrafficDir::Down) => b.reads += n,
                (TrafficKind::Checkpoints, TrafficDir::Down) => b.adopt += n,
                _ => {}
            }
        }
        b
    }
}

/// One network's merge.
#[derive(Debug, Clone)]
pub struct MergeRun {
    /// Format.
    pub wire: MergeWire,
    /// Miners.
    pub miners: usize,
    /// The section's flat state in f32, bytes.
    pub state_bytes: u64,
    /// Per miner.
    pub bytes: Vec<MinerBytes>,
    /// Orchestrator's own store bytes over the merge (read and written).
    pub orchestrator: u64,
    /// Seconds from `uploading` to every miner holding the merged state.
    pub seconds: f64,
    /// Partitions in the plan.
    pub partitions: usize,
    /// Flagged mergers, recomputed partitions, fallbacks.
    pub flags: usize,
    /// Partitions the orchestrator recomputed.
    pub recomputed: usize,
    /// Partitions that fell back to the previous state.
    pub fallbacks: usize,
    /// Miners whose reported state hash equals the checkpoint's.
    pub identical: usize,
}

impl MergeRun {
    fn mean(&self, f: impl Fn(&MinerBytes) -> u64) -> f64 {
        self.bytes.iter().map(&f).sum::<u64>() as f64 / self.bytes.len().max(1) as f64
    }
}

/// What the status polls saw.
#[derive(Debug, Default)]
struct Watch {
    uploading_at: Option<Instant>,
    adopted_at: Option<Instant>,
    before_merge: Option<String>,
    after_merge: Option<String>,
    merge: Option<MergeStatus>,
    status: Option<StatusResponse>,
    /// Each miner's first stats report that shows the adoption (a miner writes one as it
    /// adopts), by file: its bytes before the next merge can add to them.
    adopted: BTreeMap<PathBuf, UtilizationReport>,
}

/// Records in `w` every miner stats file in `dir` that shows its first adoption.
fn snapshot_adoptions(dir: &Path, w: &mut Watch) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        if path.extension().is_none_or(|e| e != "json") || w.adopted.contains_key(&path) {
            continue;
        }
        let report = fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<UtilizationReport>(&b).ok());
        if let Some(r) = report.filter(|r| r.adopted > 0 || MinerBytes::of(r).adopt > 0) {
            w.adopted.insert(path, r);
        }
    }
}

fn every_miner_adopted(status: &StatusResponse, miners: usize) -> bool {
    let held: Vec<u64> = status
        .sections
        .iter()
        .flat_map(|s| s.miners.iter().map(|m| m.weights_epoch))
        .collect();
    held.len() >= miners && held.iter().all(|&e| e >= 1)
}

/// Polls the orchestrator at `addr` until `child` exits or every miner adopted the merge, and
/// the miners' stats files in `stats` until each has shown its adoption.
async fn watch(
    addr: SocketAddr,
    miners: usize,
    stats: &Path,
    child: &mut Child,
    timeout: Duration,
) -> Watch {
    let mut w = Watch::default();
    let policy = RetryPolicy {
        max_attempts: 1,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(20),
    };
    let until = Instant::now() + timeout;
    let mut client = None;
    while Instant::now() < until {
        if matches!(child.try_wait(), Ok(Some(_))) {
            break;
        }
        if client.is_none() {
            client = ApiClient::connect(&format!("http://{addr}"), None, policy)
                .await
                .ok();
        }
        if let Some(c) = &client
            && let Ok(status) = c.status().await
        {
            let now = Instant::now();
            if status.phase == Phase::Training && status.epoch == 0 {
                // The last scrape before the merge starts.
                w.before_merge = scrape(addr).or(w.before_merge.take());
            }
            if status.phase == Phase::Uploading && w.uploading_at.is_none() {
                w.uploading_at = Some(now);
            }
            if w.uploading_at.is_some()
                && w.adopted_at.is_none()
                && every_miner_adopted(&status, miners)
            {
                w.adopted_at = Some(now);
                w.after_merge = scrape(addr);
                w.status = Some(status);
            }
            // The merge's verification figures, from a status that still describes it (the
            // next merge can have begun by the time every miner reports its adoption).
            if w.uploading_at.is_some()
                && let Ok(m) = c.merge_status().await
                && describes_the_first_merge(&m)
            {
                w.merge = Some(m);
            }
        }
        if w.uploading_at.is_some() {
            snapshot_adoptions(stats, &mut w);
        }
        if w.adopted_at.is_some() && w.adopted.len() >= miners {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    w
}

/// Whether `m` describes the run's first merge, finalised: during its last phase (epoch 0) or
/// the training epoch after it (epoch 1), with every section's plan built and finalised.
fn describes_the_first_merge(m: &MergeStatus) -> bool {
    let finalised =
        !m.sections.is_empty() && m.sections.iter().all(|s| s.finalized && s.partitions > 0);
    finalised && (m.epoch == 0 || (m.epoch == 1 && m.phase == Phase::Training))
}

fn run_one(
    args: &BenchMergeArgs,
    wire: MergeWire,
    miners: usize,
    dir: &Path,
) -> anyhow::Result<MergeRun> {
    let listen = fresh_run_dir(dir)?;
    // The merged epoch, then a second one during which the miners' stats are read (the run's
    // last merge, at the end of its budget, is not measured).
    let per_epoch = args.samples_per_miner.max(1) * miners as u64;
    let samples = per_epoch + 4 * miners as u64;
    let local = LocalArgs {
        preset: args.preset.clone(),
        sections: Some(1),
        miners_per_section: miners,
        config: None,
        model: None,
        data: "synthetic".into(),
        text_column: None,
        dir: dir.to_path_buf(),
        listen: Some(listen),
        samples: Some(samples),
        keep_running: false,
        metrics_out: None,
        summary_out: None,
        seq_len: 16,
        batch_size: 1,
        lr: 3e-3,
        threads: 1,
        device: DeviceKind::Cpu,
        poll_ms: 200,
        merge_every: per_epoch,
        samples_per_step: 0,
        bottleneck_warmup: 0,
        max_in_flight: 4,
        eval_every: 1,
        merge_op: args.op,
        merge_wire: wire,
        validators: 0,
        validator_wait_s: 0,
        seed: 0,
        muon: false,
        #[cfg(feature = "adversary")]
        adversaries: Vec::new(),
        validation: None,
        placement_overrides: None,
        deadline_s: 60,
    };
    let mut config = generated_config(&local, dir, listen)?;
    config["merge"]["wire"] = serde_json::json!(wire.to_string());
    config["max_in_flight"] = serde_json::json!(1);
    config["eval_samples"] = serde_json::json!(0);
    let config_path = dir.join("run.yaml");
    fs::write(&config_path, serde_norway::to_string(&config)?)
        .with_context(|| format!("writing {}", config_path.display()))?;
    let log = dir.join("local.log");
    let out = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone().context("duplicating the log file")?;
    let exe = std::env::current_exe().context("locating the iota binary")?;
    let mut child = Command::new(exe)
        .arg("local")
        .arg("--config")
        .arg(&config_path)
        .args(["--samples", &samples.to_string()])
        .args(["--miners-per-section", &miners.to_string()])
        .args(["--threads", "1"])
        .args(["--listen", &listen.to_string()])
        .args(["--poll-ms", "200"])
        .args(["--validators", "0"])
        .arg("--dir")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .context("starting iota local")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let timeout = Duration::from_secs(args.timeout_s);
    let stats_dir = dir.join("stats");
    let mut w = rt.block_on(watch(listen, miners, &stats_dir, &mut child, timeout));
    let reports: Vec<UtilizationReport> = std::mem::take(&mut w.adopted).into_values().collect();
    // The network ends by itself once its budget is spent (one merge); wait for the miners'
    // final stats files.
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for iota local")? {
            break Some(status);
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let tail = || {
        let text = fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().rev().take(20).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    };
    let (Some(up), Some(done), Some(merge), Some(final_status)) =
        (w.uploading_at, w.adopted_at, w.merge, w.status)
    else {
        bail!(
            "the merge of {miners} miners in {wire} did not complete, or its finalised status \
             was never seen (exit {status:?}):\n{}",
            tail()
        );
    };
    if status.is_none_or(|s| !s.success()) {
        bail!("iota local failed ({status:?}):\n{}", tail());
    }
    let bytes: Vec<MinerBytes> = reports.iter().map(MinerBytes::of).collect();
    let adopted = |(r, b): (&UtilizationReport, &MinerBytes)| r.adopted > 0 || b.adopt > 0;
    if bytes.len() < miners || !reports.iter().zip(&bytes).all(adopted) {
        bail!(
            "the miners' stats ({}) never showed every adoption",
            stats_dir.display()
        );
    }
    // Every miner uploads its state once per merge: more means the next merge had begun
    // before the stats were read, and its bytes would be counted with this one's.
    let layout = section_layout(&single_section(ModelConfig::preset(&args.preset)?)?, 0)?;
    let one_upload = wire.encoded_len(layout.total_len() as u64, Span::whole(layout.params_len));
    if let Some(b) = bytes.iter().find(|b| b.upload != one_upload) {
        return Err(SecondMerge {
            uploaded: b.upload,
            expected: one_upload,
        }
        .into());
    }
    let orchestrator = match (&w.before_merge, &w.after_merge) {
        (Some(a), Some(b)) => {
            let before = own_traffic(a);
            own_traffic(b)
                .into_iter()
                .filter(|((kind, _), _)| {
                    [
                        TrafficKind::MergeUploads,
                        TrafficKind::MergedPartitions,
                        TrafficKind::Checkpoints,
                    ]
                    .iter()
                    .any(|k| k.label() == kind)
                })
                .map(|(k, v)| (v - before.get(&k).copied().unwrap_or(0.0)).max(0.0))
                .sum::<f64>() as u64
        }
        _ => 0,
    };
    let cfg = ModelConfig::preset(&args.preset)?;
    let layout = section_layout(&single_section(cfg)?, 0)?;
    let section = merge.sections.first();
    let checkpoint = section.and_then(|s| s.checkpoint_hash.clone());
    let identical = final_status
        .sections
        .iter()
        .flat_map(|s| &s.miners)
        .filter(|m| m.weights_hash.is_some() && m.weights_hash == checkpoint)
        .count();
    Ok(MergeRun {
        wire,
        miners,
        state_bytes: layout.total_len() as u64 * 4,
        bytes,
        orchestrator,
        seconds: (done - up).as_secs_f64(),
        partitions: section.map_or(0, |s| s.partitions),
        flags: section.map_or(0, |s| s.flagged.len()),
        recomputed: section.map_or(0, |s| s.recomputed),
        fallbacks: section.map_or(0, |s| s.fallbacks),
        identical,
    })
}

/// Networks run per (format, miner count) before giving up on one whose stats mixed two
/// merges.
const ATTEMPTS: usize = 3;

/// A miner's stats counted more than one upload: the next merge had begun.
#[derive(Debug, thiserror::Error)]
#[error(
    "a miner's stats show {uploaded} bytes of merge uploads, one upload is {expected}: the \
     next merge began before they were read"
)]
struct SecondMerge {
    uploaded: u64,
    expected: u64,
}

/// `cfg` with all its blocks in one section.
fn single_section(mut cfg: ModelConfig) -> anyhow::Result<ModelConfig> {
    cfg.sections = vec![[0, cfg.n_layers]];
    cfg.validate()?;
    Ok(cfg)
}

/// Runs `iota bench merge`.
///
/// # Errors
/// An unknown preset, or a network that fails or does not complete its merge.
pub fn run(args: BenchMergeArgs) -> anyhow::Result<()> {
    let cfg = single_section(ModelConfig::preset(&args.preset)?)?;
    let layout = section_layout(&cfg, 0)?;
    println!(
        "iota bench merge: preset {} as one section ({} parameters, flat state of parameters \
         and two moments {} in f32), {} samples of 1 x 16 tokens per miner, op {}, r = 2",
        cfg.name,
        layout.params_len,
        human_bytes(layout.total_len() * 4),
        args.samples_per_miner,
        args.op
    );
    let root = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("iota-bench-merge-{}", std::process::id())),
    };
    let mut runs = Vec::new();
    for &wire in &args.wire {
        for &n in &args.miners {
            if n == 0 {
                continue;
            }
            let dir = root.join(format!("{}-{n}", wire.to_string().replace(':', "_")));
            eprintln!("merging {n} miners in {wire}...");
            let mut run = run_one(&args, wire, n, &dir);
            for _ in 1..ATTEMPTS {
                match &run {
                    Err(e) if e.is::<SecondMerge>() => {
                        eprintln!("  {e}; running it again");
                        run = run_one(&args, wire, n, &dir);
                    }
                    _ => break,
                }
            }
            if args.dir.is_none() {
                let _ = fs::remove_dir_all(&dir);
            }
            runs.push(run?);
        }
    }
    if args.dir.is_none() {
        let _ = fs::remove_dir_all(&root);
    }
    print_table(&runs);
    Ok(())
}

fn print_table(runs: &[MergeRun]) {
    // The f32 total of the same miner count, for the ratio.
    let f32_total: BTreeMap<usize, f64> = runs
        .iter()
        .filter(|r| r.wire == MergeWire::F32)
        .map(|r| (r.miners, r.mean(MinerBytes::total)))
        .collect();
    println!(
        "\nper miner, mean (S = the flat state in f32):\n\
         wire           miners  parts  upload    reads     partitions  adopt     total      total/S  vs f32   orch.     wall s  verified"
    );
    for r in runs {
        let s = r.state_bytes.max(1) as f64;
        let total = r.mean(MinerBytes::total);
        let ratio = f32_total
            .get(&r.miners)
            .map_or("-".to_string(), |f| format!("{:.2}x", f / total.max(1.0)));
        let verified = format!(
            "{}/{} identical, {} flagged, {} recomputed, {} fallbacks",
            r.identical, r.miners, r.flags, r.recomputed, r.fallbacks
        );
        println!(
            "{:<13}  {:>6}  {:>5}  {:>8}  {:>8}  {:>10}  {:>8}  {:>9}  {:>7.3}  {:>6}  {:>8}  {:>6.2}  {verified}",
            r.wire.to_string(),
            r.miners,
            r.partitions,
            human_bytes(r.mean(|b| b.upload) as usize),
            human_bytes(r.mean(|b| b.reads) as usize),
            human_bytes(r.mean(|b| b.partitions) as usize),
            human_bytes(r.mean(|b| b.adopt) as usize),
            human_bytes(total as usize),
            total / s,
            ratio,
            human_bytes(r.orchestrator as usize),
            r.seconds,
        );
    }
    println!(
        "\n(bytes counted by each miner as it moved them; orch.: the orchestrator's own store \
         traffic over the merge; wall: uploading -> every miner holds the merged state)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MinerUsage, SectionMergeStatus};
    use crate::miner::utilization::TrafficLine;
    use crate::storage::traffic::TrafficCount;

    #[test]
    fn a_miners_merge_bytes_are_picked_by_kind_and_direction() {
        let line = |kind, dir, bytes| TrafficLine {
            kind,
            dir,
            count: TrafficCount { bytes, requests: 1 },
        };
        let report = UtilizationReport {
            section: Some(0),
            usage: MinerUsage::default(),
            utilization: 0.5,
            traffic: vec![
                line(TrafficKind::Tokens, TrafficDir::Down, 1000),
                line(TrafficKind::MergeUploads, TrafficDir::Up, 10),
                line(TrafficKind::MergeUploads, TrafficDir::Down, 20),
                line(TrafficKind::MergedPartitions, TrafficDir::Up, 5),
                line(TrafficKind::Checkpoints, TrafficDir::Down, 7),
            ],
            adopted: 1,
        };
        let b = MinerBytes::of(&report);
        assert_eq!(
            b,
            MinerBytes {
                upload: 10,
                reads: 20,
                partitions: 5,
                adopt: 7
            }
        );
        assert_eq!(b.total(), 42);
    }

    /// The verification figures are taken only from a status of the measured merge: not from
    /// the next merge's, whose plan may not be built (it once showed 0 partitions and 0
    /// flags, which read as a clean check).
    #[test]
    fn only_the_first_merges_finalised_status_is_reported() {
        let section = |finalized, partitions| SectionMergeStatus {
            section: 0,
            uploads: 4,
            partitions,
            partitions_with_results: partitions,
            results: partitions,
            finalized,
            recomputed: 0,
            fallbacks: 0,
            flagged: Vec::new(),
            checkpoint_hash: None,
            checkpoint_epoch: None,
        };
        let status = |phase, epoch, sections| MergeStatus {
            phase,
            epoch,
            phase_deadline_unix_ms: None,
            op: MergeOp::Mean,
            batches_before_merging: 8,
            sections,
            epochs: Vec::new(),
        };
        // The merge finalised (its last phase, or the training epoch after it); then the merge
        // still under way, the next one begun (plan not built, or built), no sections.
        let cases = [
            (Phase::Training, 1, vec![section(true, 4)], true),
            (Phase::Merging, 0, vec![section(true, 4)], true),
            (Phase::Merging, 0, vec![section(false, 4)], false),
            (Phase::Uploading, 1, vec![section(false, 0)], false),
            (Phase::Uploading, 1, vec![section(true, 4)], false),
            (Phase::Training, 1, vec![], false),
        ];
        for (phase, epoch, sections, expected) in cases {
            assert_eq!(
                describes_the_first_merge(&status(phase, epoch, sections)),
                expected,
                "{phase:?} epoch {epoch}"
            );
        }
    }
}
