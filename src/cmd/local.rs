//! `iota local`: a whole network on one machine. Starts an orchestrator and N miners per
//! section as child processes of this same binary, shows one progress view by polling
//! `/api/status`, and ends with a summary.
//!
//! Everything lives under `--dir`: the generated run config (`run.yaml`), the orchestrator's
//! state (`state/`), the miners' hotkeys (`wallets/`) and each child's log (`logs/`).
//! Children are killed when the command ends, however it ends.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::api::client::ApiClient;
use crate::api::{MergeStatus, MetagraphView, StatusResponse};
use crate::codec::MergeWire;
use crate::merge::MergeOp;
#[cfg(feature = "adversary")]
use crate::miner::adversary::Adversary;
use crate::model::backend::DeviceKind;
use crate::model::config::even_sections;
use crate::model::{LrSchedule, ModelConfig};
use crate::orchestrator::RunConfig;
use crate::storage::RetryPolicy;
use crate::wallet::WalletDir;

/// Wallet that holds the local miners' hotkeys.
const WALLET: &str = "local";

/// Arguments of `iota local`.
#[derive(Debug, Args)]
pub struct LocalArgs {
    /// Model preset (ignored with --config).
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    /// Number of pipeline sections (default: the preset's).
    #[arg(long)]
    pub sections: Option<usize>,
    /// Miners per section.
    #[arg(long, default_value_t = 2)]
    pub miners_per_section: usize,
    /// A run config to use instead of the generated one (see examples/local.yaml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Model fields over the preset, as a YAML mapping: the run config's `model` section, e.g.
    /// `{preset: small, d_b: 3, reembed: true}` (ignored with --config).
    #[arg(long, value_name = "FILE.yaml")]
    pub model: Option<PathBuf>,
    /// Training text: `synthetic[:SEED[:CHARS]]` or a path to a .txt, .jsonl, .jsonl.gz,
    /// .jsonl.zst or .parquet file or a directory of them (ignored with --config).
    #[arg(long, default_value = "synthetic")]
    pub data: String,
    /// The .jsonl field / .parquet column holding the text (default: `text`; ignored with
    /// --config).
    #[arg(long, value_name = "NAME")]
    pub text_column: Option<String>,
    /// Working directory (config, state, wallets, logs).
    #[arg(long, default_value = "iota-local")]
    pub dir: PathBuf,
    /// Address of the orchestrator (default: a free port on 127.0.0.1).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Stop after this many samples (micro-batches) completed or dropped; default: Ctrl-C.
    #[arg(long)]
    pub samples: Option<u64>,
    /// After the --samples budget, stop the miners but keep the orchestrator (its API and
    /// metrics) serving until Ctrl-C, so the run can be inspected.
    #[arg(long)]
    pub keep_running: bool,
    /// Write one JSON line per status poll to this file, with `iota train`'s keys where the
    /// meaning is the same: `loss` (recent training loss), `eval_loss` (the latest merged
    /// model's, evaluated through the network), `tokens`, `tokens_per_s`; plus `t_s`,
    /// `completed`, `dropped`, `in_flight`, `epoch`.
    #[arg(long)]
    pub metrics_out: Option<PathBuf>,
    /// Also write the final summary (per-epoch training and evaluation loss, counts,
    /// throughput) as JSON to this file.
    #[arg(long, value_name = "FILE.json")]
    pub summary_out: Option<PathBuf>,
    /// Tokens per sample window (ignored with --config).
    #[arg(long, default_value_t = 64)]
    pub seq_len: usize,
    /// Windows per sample unit (ignored with --config).
    #[arg(long, default_value_t = 4)]
    pub batch_size: usize,
    /// Peak learning rate (ignored with --config).
    #[arg(long, default_value_t = 0.003)]
    pub lr: f64,
    /// Compute threads per miner.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Backend of the miners.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceKind,
    /// Milliseconds between status polls.
    #[arg(long, default_value_t = 1000)]
    pub poll_ms: u64,
    /// Samples completed per training epoch before the miners merge (ignored with --config).
    #[arg(long, default_value_t = 100)]
    pub merge_every: u64,
    /// Samples per optimizer step: 0 steps asynchronously (each miner after every backward, on
    /// weights up to `max_in_flight - 1` steps stale); G > 0 makes synchronous steps of G
    /// samples, every one computed at the same weights, with the learning-rate schedule
    /// counting steps (`--merge-every` must be a multiple of G; ignored with --config).
    #[arg(long, value_name = "G", default_value_t = 0)]
    pub samples_per_step: u64,
    /// A warm-up without the bottleneck over the first N samples (N synchronous steps with
    /// `--samples-per-step`): the whole residual stream also crosses each boundary, weighted
    /// from 1 down to 0, so those samples' boundary tensors are `d_model` channels wider (the
    /// run config's `bottleneck_warmup`; ignored with --config).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub bottleneck_warmup: u64,
    /// Forwards each miner may hold awaiting their backward (the run config's
    /// `max_in_flight`; ignored with --config). Fewer keeps the asynchronous backward closer
    /// to its forward's weights (Performance, Learning: 2 with `--merge-every 20` comes within
    /// about 3% of `iota train` at 1500 samples of `tiny`).
    #[arg(long, value_name = "K", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_in_flight: u64,
    /// Evaluate the merged model through the network every N-th epoch, and the final one (the
    /// run config's `eval_every`; ignored with --config). With frequent merges an evaluation
    /// every epoch costs about as much as the merge itself.
    #[arg(long, value_name = "EPOCHS", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub eval_every: u64,
    /// Merge operator: mean, geometric, median, trimmed[:F] (ignored with --config).
    #[arg(long, default_value = "mean")]
    pub merge_op: MergeOp,
    /// Merge payload format (the run config's `merge.wire`: f32, bf16, int8, dct, sign, sign2,
    /// q4, q4v2, q4v2m4, q4v2m2, or NAME:CHUNK[:KEEP[:MERGED_KEEP]]; ignored with --config).
    #[arg(long, value_name = "FORMAT", default_value = "f32")]
    pub merge_wire: MergeWire,
    /// Validators to start (hotkeys `validator0..`, listed in the generated run config; with
    /// --config, the config must list them).
    #[arg(long, default_value_t = 1)]
    pub validators: usize,
    /// After the --samples budget, seconds to wait for every validator to publish weights for
    /// the last finished epoch.
    #[arg(long, default_value_t = 180)]
    pub validator_wait_s: u64,
    /// Seed of the initial weights and the data order (the run config's `seed`; ignored with
    /// --config).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u64,
    /// Step the miners' hidden matrices with Muon (the run config's `optimizer.muon`; ignored
    /// with --config).
    #[arg(long)]
    pub muon: bool,
    /// Test harness only: hostile miners, one per listed kind (`miner0` gets the first; only
    /// with the `adversary` feature).
    #[cfg(feature = "adversary")]
    #[arg(long, hide = true, value_delimiter = ',')]
    pub adversaries: Vec<Adversary>,
    /// Test harness only: the generated config's `validation` section, as JSON.
    #[arg(long, hide = true)]
    pub validation: Option<String>,
    /// Test harness only: keys merged into the generated config's `placement` section, as
    /// JSON (its pins stay).
    #[arg(long = "placement", hide = true)]
    pub placement_overrides: Option<String>,
    /// Test harness only: forward deadline in seconds (the backward gets twice as long).
    #[arg(long, hide = true, default_value_t = 20)]
    pub deadline_s: u64,
}

/// The hidden flags that make miner `i` hostile (`--adversaries`, tests only).
#[cfg(feature = "adversary")]
fn hostile_args(args: &LocalArgs, i: usize, dir: &Path) -> Vec<String> {
    let Some(kind) = args.adversaries.get(i) else {
        return Vec::new();
    };
    let mut flags = vec!["--adversary".to_string(), kind.to_string()];
    if *kind == Adversary::Copier {
        // It reads the generated config's local store (data_dir/objects).
        let store = dir.join("state/objects").display().to_string();
        flags.extend(["--copy-from".to_string(), store]);
    }
    flags
}

/// No hostile miners without the `adversary` feature.
#[cfg(not(feature = "adversary"))]
fn hostile_args(_args: &LocalArgs, _i: usize, _dir: &Path) -> Vec<String> {
    Vec::new()
}

/// Child processes, killed and reaped on drop.
#[derive(Debug, Default)]
pub struct Children {
    /// Each child under its name, the orchestrator first.
    procs: Vec<(String, Child)>,
    /// The miners among them.
    miners: Vec<LocalMiner>,
}

impl Children {
    /// Kills and reaps every child except the first (the orchestrator).
    pub fn stop_miners(&mut self) {
        for (_, child) in self.procs.iter_mut().skip(1) {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.procs.truncate(1);
        self.miners.clear();
    }

    /// Kills and reaps the children whose name starts with `prefix`.
    pub fn stop_named(&mut self, prefix: &str) {
        for (_, child) in self.procs.iter_mut().filter(|(n, _)| n.starts_with(prefix)) {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.procs.retain(|(n, _)| !n.starts_with(prefix));
        self.miners.retain(|m| !m.name.starts_with(prefix));
    }

    /// Adds a child under `name`.
    pub fn push(&mut self, name: String, child: Child) {
        self.procs.push((name, child));
    }

    /// Adds a miner under `name`, logging to `log`, pinned to `section` if the run config
    /// pins it.
    pub fn push_miner(&mut self, name: String, log: PathBuf, section: Option<usize>, child: Child) {
        self.miners.push(LocalMiner {
            name: name.clone(),
            log,
            section,
        });
        self.procs.push((name, child));
    }

    /// The exit status of child `index` (in the order pushed), if it has exited.
    pub fn exit_status(&mut self, index: usize) -> Option<std::process::ExitStatus> {
        self.procs.get_mut(index)?.1.try_wait().ok().flatten()
    }

    /// Names of children that have exited, with their status.
    pub fn exited(&mut self) -> Vec<String> {
        self.exit_statuses()
            .into_iter()
            .map(|(name, status)| format!("{name} ({status})"))
            .collect()
    }

    /// Each child that has exited, by name, with its status, in the order pushed.
    fn exit_statuses(&mut self) -> Vec<(String, ExitStatus)> {
        self.procs
            .iter_mut()
            .filter_map(|(name, c)| Some((name.clone(), c.try_wait().ok()??)))
            .collect()
    }

    /// Why the run cannot go on if a section has lost every miner this command started:
    /// the section (or "every miner", where the run config does not pin them all), the
    /// miners with their exit status, and the end of the first one's log. A network whose
    /// section has no miner left completes no sample, so watching it would wait forever.
    pub fn lost_section(&mut self) -> Option<String> {
        let exits: HashMap<String, ExitStatus> = self.exit_statuses().into_iter().collect();
        let pinned = self.miners.iter().all(|m| m.section.is_some());
        let mut sections: BTreeMap<Option<usize>, Vec<&LocalMiner>> = BTreeMap::new();
        for miner in &self.miners {
            let section = miner.section.filter(|_| pinned);
            sections.entry(section).or_default().push(miner);
        }
        let (section, miners) = sections
            .into_iter()
            .find(|(_, ms)| ms.iter().all(|m| exits.contains_key(&m.name)))?;
        let statuses: Vec<String> = miners
            .iter()
            .map(|m| format!("{} ({})", m.name, exits[&m.name]))
            .collect();
        let whose = match section {
            Some(k) => format!("every miner of section {k}"),
            None => "every miner".to_string(),
        };
        let log = &miners.first()?.log;
        Some(format!(
            "{whose} exited, so no sample can complete: {}; the end of {}:\n{}",
            statuses.join(", "),
            log.display(),
            log_tail(log, 3)
        ))
    }
}

/// A miner `iota local` started.
#[derive(Debug)]
struct LocalMiner {
    /// Its hotkey name, also its child's name.
    name: String,
    /// Where its output goes.
    log: PathBuf,
    /// The section the run config pins it to; `None`: placed by the orchestrator's rules.
    section: Option<usize>,
}

/// The last `n` non-empty lines of the log at `path` (empty if it cannot be read).
fn log_tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Connects to the orchestrator just started as the first of `children`, retrying for up to
/// about 30 s while it comes up. If it exits first (a config it refuses, a port in use), the
/// error says so at once with the last lines of its log instead of waiting out the retries.
fn wait_for_orchestrator(
    runtime: &tokio::runtime::Runtime,
    url: &str,
    children: &mut Children,
    log: &Path,
) -> anyhow::Result<ApiClient> {
    let once = RetryPolicy {
        max_attempts: 1,
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(100),
    };
    let mut last = None;
    for _ in 0..100 {
        match runtime.block_on(ApiClient::connect(url, None, once)) {
            Ok(client) => return Ok(client),
            Err(e) => last = Some(e),
        }
        if let Some(status) = children.exit_status(0) {
            let tail = log_tail(log, 3);
            bail!(
                "the orchestrator exited ({status}) before it came up; the end of its log ({}):\n{tail}",
                log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let last = last.map(|e| e.to_string()).unwrap_or_default();
    bail!(
        "the orchestrator did not come up on {url} (see {}): {last}",
        log.display()
    )
}

impl Drop for Children {
    fn drop(&mut self) {
        // Miners first, the orchestrator (pushed first) last.
        for (_, child) in self.procs.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A free TCP port on 127.0.0.1 (bound and released; a race is unlikely on one machine).
fn free_addr() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    listener.local_addr().context("reading the free port")
}

/// The run name of a local network: the one already in `dir`'s generated config (so a
/// network restarted on the same `--dir` resumes its run), else a fresh `local-` name. Every
/// network gets its own name because requests are signed for the run name: a request made for
/// one local orchestrator must not verify at another.
fn local_run_name(config_path: &Path) -> String {
    let existing = fs::read_to_string(config_path)
        .ok()
        .and_then(|text| serde_norway::from_str::<serde_json::Value>(&text).ok())
        .and_then(|v| v.get("run").and_then(|r| r.as_str()).map(str::to_string))
        .filter(|name| name.starts_with("local-"));
    existing.unwrap_or_else(|| format!("local-{:016x}", rand::random::<u64>()))
}

/// Writes the generated run config and returns its path.
fn write_config(args: &LocalArgs, dir: &Path, listen: SocketAddr) -> anyhow::Result<PathBuf> {
    let path = dir.join("run.yaml");
    let config = generated_config(args, dir, listen)?;
    let text = serde_norway::to_string(&config).context("writing the run config")?;
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// `--config` as given, or, when it places keys by the default rules (no `placement.pins`,
/// not `placement.ordered`), a copy in `dir` that pins this network's miners round the
/// sections as the generated config does; returns the path to run.
fn pinned_copy(path: &Path, args: &LocalArgs, dir: &Path) -> anyhow::Result<PathBuf> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let config = RunConfig::from_yaml(&text).with_context(|| path.display().to_string())?;
    if !config.placement.pins.is_empty() || config.placement.ordered {
        return Ok(path.to_path_buf());
    }
    let mut value: serde_json::Value = serde_norway::from_str(&text)
        .with_context(|| format!("reading {} as YAML", path.display()))?;
    let pins = miner_pins(dir, config.model.n_sections(), args.miners_per_section)?;
    match value.get_mut("placement") {
        Some(placement) if placement.is_object() => placement["pins"] = json!(pins),
        _ => value["placement"] = json!({ "pins": pins }),
    }
    let copy = dir.join("run.pinned.yaml");
    let text = serde_norway::to_string(&value).context("writing the run config")?;
    fs::write(&copy, text).with_context(|| format!("writing {}", copy.display()))?;
    Ok(copy)
}

/// This network's miners pinned round the sections (miner `i` to section `i mod n`); any
/// other key that joins is placed by the orchestrator's rules.
fn miner_pins(
    dir: &Path,
    n_sections: usize,
    miners_per_section: usize,
) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    let wallets = WalletDir::new(dir.join("wallets"));
    let mut pins = serde_json::Map::new();
    for i in 0..n_sections * miners_per_section.max(1) {
        let name = format!("miner{i}");
        ensure_hotkey(&wallets, &name)?;
        let hotkey = wallets.load_hotkey(WALLET, &name)?;
        pins.insert(hotkey.address().to_string(), json!(i % n_sections));
    }
    Ok(pins)
}

/// The run config `iota local` generates from its flags (state under `dir/state`), as the
/// JSON value written to `run.yaml`; `iota bench learning` starts from it and changes keys.
///
/// # Errors
/// An unknown preset with `--sections`.
pub fn generated_config(
    args: &LocalArgs,
    dir: &Path,
    listen: SocketAddr,
) -> anyhow::Result<serde_json::Value> {
    let path = dir.join("run.yaml");
    let wallets = WalletDir::new(dir.join("wallets"));
    let mut validators = Vec::new();
    for i in 0..args.validators {
        let name = validator_name(i);
        ensure_hotkey(&wallets, &name)?;
        let hotkey = wallets.load_hotkey(WALLET, &name)?;
        validators.push(json!({ "hotkey": hotkey.address(), "stake": 1.0 }));
    }
    let fields = match &args.model {
        Some(path) => model_overrides(path)?,
        None => json!({}),
    };
    let mut model = with_preset(fields, &args.preset);
    if let Some(n) = args.sections
        && model.get("sections").is_none()
    {
        let base = ModelConfig::from_value(&model, &args.preset)?;
        model["sections"] = json!(even_sections(base.n_layers, n));
    }
    // Refused here, with the file named, rather than by the orchestrator.
    let n_sections = ModelConfig::from_value(&model, &args.preset)
        .with_context(|| format!("the model of this run: {model}"))?
        .n_sections();
    let pins = miner_pins(dir, n_sections, args.miners_per_section)?;
    let config = json!({
        "run": local_run_name(&path),
        "model": model,
        "data": { "source": args.data, "text_column": args.text_column },
        "listen": listen.to_string(),
        "data_dir": dir.join("state"),
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "seed": args.seed,
        "max_in_flight": args.max_in_flight,
        "local_steps": 1,
        "schedule": schedule_for(args),
        "deadlines": { "forward_s": args.deadline_s, "backward_s": 2 * args.deadline_s },
        "heartbeat_s": 2,
        "batches_before_merging": args.merge_every,
        "samples_per_step": args.samples_per_step,
        "bottleneck_warmup": args.bottleneck_warmup,
        "eval_every": args.eval_every,
        "max_samples": args.samples,
        "merge": {
            "op": args.merge_op.to_string(),
            "wire": args.merge_wire.to_string(),
            "upload_s": 30,
            "lease_grace_s": 10,
            "merge_s": 60,
        },
        "placement": { "pins": pins },
        "validators": validators,
    });
    let mut config = config;
    if args.muon {
        config["optimizer"]["muon"] = serde_json::json!(true);
    }
    if let Some(text) = &args.validation {
        config["validation"] = serde_json::from_str(text).context("parsing --validation")?;
    }
    if let Some(text) = &args.placement_overrides {
        let overrides: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(text).context("parsing --placement")?;
        for (key, value) in overrides {
            config["placement"][key] = value;
        }
    }
    Ok(config)
}

/// Model `fields` (a run config's `model` section) with `preset` as their base where they
/// name none.
pub fn with_preset(mut fields: serde_json::Value, preset: &str) -> serde_json::Value {
    if fields.get("preset").is_none() {
        fields["preset"] = json!(preset);
    }
    fields
}

/// Reads a YAML mapping of model fields (a run config's `model` section) from `path`.
///
/// # Errors
/// An unreadable file, or anything but a mapping.
pub fn model_overrides(path: &Path) -> anyhow::Result<serde_json::Value> {
    let text = fs::read_to_string(path)
        .with_context(|| format!("reading model file {}", path.display()))?;
    let value: serde_json::Value =
        serde_norway::from_str(&text).with_context(|| format!("model file {}", path.display()))?;
    if !value.is_object() {
        bail!(
            "model file {}: expected a mapping of model fields (e.g. `preset: tiny`), got {value}",
            path.display()
        );
    }
    Ok(value)
}

/// The learning-rate schedule of the generated config: `iota train`'s (warmup, then a cosine
/// to a tenth of the peak) over the `--samples` budget, so a network and `iota train` at equal
/// tokens follow the same rates. Sample ids are the schedule's steps (one sample unit is one
/// `iota train` step of `--batch-size` windows; with `--samples-per-step G`, G samples are one
/// step). Without a budget the rate stays at its peak after the warmup.
fn schedule_for(args: &LocalArgs) -> LrSchedule {
    let defaults = crate::cmd::train::TrainSettings::default();
    let per_step = args.samples_per_step.max(1);
    LrSchedule {
        peak: args.lr,
        warmup_steps: defaults.warmup_steps,
        total_steps: args.samples.map_or(u64::MAX, |n| n.div_ceil(per_step)),
        min_ratio: defaults.min_lr_ratio,
    }
}

/// Hotkey name of the `i`-th local validator.
fn validator_name(i: usize) -> String {
    format!("validator{i}")
}

/// Spawns `iota <args>` with stdout and stderr going to `log`.
fn spawn_self(args: &[String], log: &Path) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("locating the iota binary")?;
    let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone().context("duplicating the log file")?;
    Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("starting iota {}", args.join(" ")))
}

/// Loads the hotkey `name` from `wallets`, creating it the first time.
fn ensure_hotkey(wallets: &WalletDir, name: &str) -> anyhow::Result<()> {
    if wallets.load_hotkey(WALLET, name).is_err() {
        wallets
            .create_hotkey(WALLET, name, true)
            .with_context(|| format!("creating hotkey {name}"))?;
    }
    Ok(())
}

/// Loss and counters seen over the run, for the summary.
#[derive(Debug, Default)]
struct Tally {
    first_loss: Option<f32>,
    last_loss: Option<f32>,
    tokens_per_s: Vec<f64>,
    /// Ctrl-C ended the watch.
    interrupted: bool,
}

/// The arguments every node of the network (`iota mine`, `iota validate`) starts with: its
/// hotkey `name` in this network's wallet, the orchestrator, threads and device.
fn node_command(
    subcommand: &str,
    name: &str,
    url: &str,
    wallets: &WalletDir,
    args: &LocalArgs,
) -> Vec<String> {
    vec![
        subcommand.to_string(),
        "--wallet".into(),
        WALLET.into(),
        "--hotkey".into(),
        name.to_string(),
        "--orchestrator".into(),
        url.to_string(),
        "--wallets-dir".into(),
        wallets.root().display().to_string(),
        "--threads".into(),
        args.threads.max(1).to_string(),
        "--device".into(),
        args.device.to_string(),
    ]
}

/// The arguments of miner `name`'s `iota mine`: `max_in_flight` is the run config's, and
/// `stats` where it writes its stats.
fn mine_command(
    name: &str,
    url: &str,
    wallets: &WalletDir,
    args: &LocalArgs,
    max_in_flight: usize,
    stats: &Path,
) -> Vec<String> {
    let mut cmd = node_command("mine", name, url, wallets, args);
    cmd.extend([
        // Explicit, so an operator's ~/.config/iota/miner.yaml changes nothing here.
        "--max-in-flight".into(),
        max_in_flight.to_string(),
        "--quiet".into(),
        "--stats-out".into(),
        stats.display().to_string(),
    ]);
    cmd
}

/// Runs a local network.
///
/// # Errors
/// A directory that cannot be written, an orchestrator that does not come up, or one that
/// exits early.
pub fn run(args: LocalArgs) -> anyhow::Result<()> {
    fs::create_dir_all(args.dir.join("logs"))
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let dir = args.dir.canonicalize().context("resolving --dir")?;
    let listen = match args.listen {
        Some(addr) => addr,
        None => free_addr()?,
    };
    let config = match &args.config {
        Some(path) => pinned_copy(path, &args, &dir)?,
        None => write_config(&args, &dir, listen)?,
    };
    let mut children = Children::default();
    let orchestrate = vec![
        "orchestrate".to_string(),
        "--config".to_string(),
        config.display().to_string(),
        "--listen".to_string(),
        listen.to_string(),
    ];
    children.push(
        "orchestrator".into(),
        spawn_self(&orchestrate, &dir.join("logs/orchestrator.log"))?,
    );
    let url = format!("http://{listen}");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let client = wait_for_orchestrator(
        &runtime,
        &url,
        &mut children,
        &dir.join("logs/orchestrator.log"),
    )?;
    let info = runtime.block_on(client.run_info())?;
    let n_sections = info.model.n_sections();
    let wallets = WalletDir::new(dir.join("wallets"));
    let n_miners = n_sections * args.miners_per_section.max(1);
    // Miners ask for as many forwards in flight as the run allows (the orchestrator caps
    // what they ask; asking for fewer would cap a run config's larger `max_in_flight`).
    let run_config = RunConfig::load(&config)?;
    let max_in_flight = run_config.max_in_flight;
    eprintln!(
        "iota local: run {:?} on {url}: {} sections x {} miners, logs in {}",
        info.run,
        n_sections,
        args.miners_per_section.max(1),
        dir.join("logs").display()
    );
    // Each miner writes where its time goes and what it moved here (`iota bench network`).
    let stats_dir = dir.join("stats");
    std::fs::create_dir_all(&stats_dir)
        .with_context(|| format!("creating {}", stats_dir.display()))?;
    for i in 0..n_miners {
        let name = format!("miner{i}");
        ensure_hotkey(&wallets, &name)?;
        let stats = stats_dir.join(format!("{name}.json"));
        let mut mine = mine_command(&name, &url, &wallets, &args, max_in_flight, &stats);
        mine.extend(hostile_args(&args, i, &dir));
        let log = dir.join(format!("logs/{name}.log"));
        let hotkey = wallets.load_hotkey(WALLET, &name)?;
        let section = run_config
            .placement
            .pins
            .get(&hotkey.address().to_string())
            .copied();
        let child = spawn_self(&mine, &log)?;
        children.push_miner(name, log, section, child);
    }
    for i in 0..args.validators {
        let name = validator_name(i);
        ensure_hotkey(&wallets, &name)?;
        let mut validate = node_command("validate", &name, &url, &wallets, &args);
        validate.extend([
            "--state-dir".into(),
            dir.join("validators").join(&name).display().to_string(),
        ]);
        let log = dir.join(format!("logs/{name}.log"));
        children.push(name, spawn_self(&validate, &log)?);
    }
    if args.validators > 0 {
        eprintln!(
            "iota local: {} validator(s); weights at {url}/api/weights",
            args.validators
        );
    }
    // With a budget in the run config the orchestrator ends the run itself (last merge and
    // its evaluation included); otherwise --samples completed or dropped ends it here.
    let budgeted = match &args.config {
        Some(path) => RunConfig::load(path)?.max_samples.is_some(),
        None => args.samples.is_some(),
    };
    // One Ctrl-C listener for the whole run, first polled while watching it: tokio registers
    // the handler at that first poll and a listener only hears signals sent after it exists,
    // so a Ctrl-C sent while the run is being wound up (validators publishing, miners
    // stopping) reaches the `--keep-running` wait below instead of being lost.
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let (final_status, tally) = runtime.block_on(watch(
        &args,
        budgeted,
        &client,
        &mut children,
        ctrl_c.as_mut(),
    ))?;
    let merge = runtime.block_on(client.merge_status()).ok();
    if let Some(path) = &args.summary_out {
        write_summary(path, &final_status, merge.as_ref(), &tally)?;
    }
    let weights = if args.validators > 0 && args.samples.is_some() {
        children.stop_named("miner");
        runtime.block_on(wait_for_weights(&args, &client, &mut children))
    } else {
        runtime.block_on(client.metagraph()).ok()
    };
    if args.keep_running && args.samples.is_some() && !tally.interrupted {
        children.stop_miners();
        print_summary(&final_status, merge.as_ref(), &tally);
        print_weights(weights.as_ref());
        eprintln!(
            "iota local: miners stopped; the orchestrator keeps serving {url} (/api/status, /metrics) until Ctrl-C"
        );
        runtime.block_on(ctrl_c).context("waiting for Ctrl-C")?;
        drop(children);
        return Ok(());
    }
    drop(children);
    print_summary(&final_status, merge.as_ref(), &tally);
    print_weights(weights.as_ref());
    Ok(())
}

/// Waits until every configured validator has published weights for the last finished epoch
/// (or `--validator-wait-s` passes, or every validator exited); returns the metagraph then.
async fn wait_for_weights(
    args: &LocalArgs,
    client: &ApiClient,
    children: &mut Children,
) -> Option<MetagraphView> {
    let epoch = client.run_info().await.ok()?.epoch;
    let Some(last) = epoch.checked_sub(1) else {
        eprintln!("iota local: no epoch finished, so validators had nothing to weigh");
        return client.metagraph().await.ok();
    };
    eprintln!(
        "iota local: miners stopped; waiting up to {} s for the validators' weights of epoch {last}",
        args.validator_wait_s
    );
    let deadline = Instant::now() + Duration::from_secs(args.validator_wait_s);
    loop {
        let view = client.metagraph().await.ok();
        let published = view.as_ref().map_or(0, |v| {
            v.validators.iter().filter(|w| w.epoch >= last).count()
        });
        let running = children
            .procs
            .iter_mut()
            .filter(|(n, _)| n.starts_with("validator"))
            .filter_map(|(_, c)| c.try_wait().ok())
            .filter(Option::is_none)
            .count();
        if published >= args.validators || running == 0 || Instant::now() >= deadline {
            if published < args.validators {
                eprintln!(
                    "iota local: {published} of {} validators published weights for epoch {last} (see logs/validator*.log)",
                    args.validators
                );
            }
            return view;
        }
        tokio::time::sleep(Duration::from_millis(args.poll_ms.max(50))).await;
    }
}

/// Prints the metagraph: the combined weights, then each validator's vector with its parts.
fn print_weights(view: Option<&MetagraphView>) {
    let Some(view) = view.filter(|v| !v.validators.is_empty()) else {
        return;
    };
    println!(
        "weights (GET /api/weights, combined by {:?}; burn {:.3})",
        view.combine, view.combined_burn
    );
    for v in &view.validators {
        println!(
            "validator {} (stake {}) epoch {}{}",
            v.hotkey,
            v.stake,
            v.epoch,
            if v.dissent { " DISSENTS" } else { "" }
        );
        println!(
            "  miner                                              weight  combined  throughput  quality  penalty  flags"
        );
        let mut rows: Vec<_> = v.weights.iter().collect();
        rows.sort_by(|a, b| b.weight.total_cmp(&a.weight));
        for w in rows {
            let combined = view
                .combined
                .iter()
                .find(|(h, _)| *h == w.hotkey)
                .map_or(0.0, |(_, x)| *x);
            println!(
                "  {:<48} {:>8.4} {:>9.4} {:>11.0} {:>8.3} {:>8.1}  {}",
                w.hotkey,
                w.weight,
                combined,
                w.parts.throughput,
                w.parts.quality,
                w.parts.penalty,
                w.parts.flags.join("; ")
            );
        }
    }
}

/// Polls the status until the run is over (`budgeted`: the orchestrator says so; else
/// `--samples` completed or dropped) or Ctrl-C; returns the last status.
async fn watch(
    args: &LocalArgs,
    budgeted: bool,
    client: &ApiClient,
    children: &mut Children,
    mut ctrl_c: Pin<&mut impl Future<Output = std::io::Result<()>>>,
) -> anyhow::Result<(StatusResponse, Tally)> {
    let mut metrics = match &args.metrics_out {
        Some(path) => {
            Some(File::create(path).with_context(|| format!("creating {}", path.display()))?)
        }
        None => None,
    };
    let bar = match args.samples {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {pos} samples {msg}")
    {
        bar.set_style(style);
    }
    let started = Instant::now();
    let mut tally = Tally::default();
    let mut reported_exits = 0;
    loop {
        let status = client.status().await.context("polling the orchestrator")?;
        let done = status.samples.completed + status.samples.dropped;
        if let Some(loss) = status.recent_loss {
            tally.first_loss.get_or_insert(loss);
            tally.last_loss = Some(loss);
        }
        if status.tokens_per_s > 0.0 {
            tally.tokens_per_s.push(status.tokens_per_s);
        }
        if let Some(file) = metrics.as_mut() {
            let line = json!({
                "t_s": started.elapsed().as_secs_f64(),
                "completed": status.samples.completed,
                "dropped": status.samples.dropped,
                "in_flight": status.samples.in_flight,
                "loss": status.recent_loss,
                "eval_loss": status.eval_loss,
                "tokens": status.tokens,
                "tokens_per_s": status.tokens_per_s,
                "epoch": status.epoch,
            });
            writeln!(file, "{line}").context("writing the metrics file")?;
        }
        bar.set_position(done);
        let fmt = |l: Option<f32>| l.map_or_else(|| "-".into(), |l| format!("{l:.3}"));
        bar.set_message(format!(
            "| epoch {} {:?} | done {} dropped {} in flight {} | loss {} eval {} | {:.0} tok/s",
            status.epoch,
            status.phase,
            status.samples.completed,
            status.samples.dropped,
            status.samples.in_flight,
            fmt(status.recent_loss),
            fmt(status.eval_loss),
            status.tokens_per_s
        ));
        let exits = children.exited();
        if exits.iter().any(|e| e.starts_with("orchestrator")) {
            bar.abandon();
            bail!("the orchestrator exited: {}", exits.join(", "));
        }
        if exits.len() > reported_exits {
            // Printed even where the bar is hidden (output not a terminal).
            bar.suspend(|| println!("children exited: {}", exits.join(", ")));
            reported_exits = exits.len();
        }
        let over = |status: &StatusResponse| {
            if budgeted {
                status.finished
            } else {
                args.samples
                    .is_some_and(|n| status.samples.completed + status.samples.dropped >= n)
            }
        };
        if over(&status) {
            bar.finish_and_clear();
            return Ok((status, tally));
        }
        if let Some(reason) = children.lost_section() {
            // Miners may leave once the run is over: look once more before calling it lost.
            let again = client.status().await.context("polling the orchestrator")?;
            if over(&again) {
                bar.finish_and_clear();
                return Ok((again, tally));
            }
            bar.abandon();
            bail!("{reason}");
        }
        tokio::select! {
            _ = ctrl_c.as_mut() => {
                bar.finish_and_clear();
                eprintln!("iota local: stopping");
                tally.interrupted = true;
                return Ok((status, tally));
            }
            _ = tokio::time::sleep(Duration::from_millis(args.poll_ms.max(50))) => {}
        }
    }
}

/// The run's summary as JSON (`--summary-out`).
fn write_summary(
    path: &Path,
    status: &StatusResponse,
    merge: Option<&MergeStatus>,
    tally: &Tally,
) -> anyhow::Result<()> {
    let mean_tps = if tally.tokens_per_s.is_empty() {
        0.0
    } else {
        tally.tokens_per_s.iter().sum::<f64>() / tally.tokens_per_s.len() as f64
    };
    let summary = json!({
        "run": status.run,
        "epoch": status.epoch,
        "finished": status.finished,
        "completed": status.samples.completed,
        "dropped": status.samples.dropped,
        "tokens": status.tokens,
        "tokens_per_s": mean_tps,
        "first_loss": tally.first_loss,
        "last_loss": tally.last_loss,
        "eval_loss": status.eval_loss,
        "evals": status.evals,
        "epochs": merge.map(|m| m.epochs.clone()).unwrap_or_default(),
    });
    fs::write(path, serde_json::to_vec_pretty(&summary)?)
        .with_context(|| format!("writing {}", path.display()))
}

fn print_summary(status: &StatusResponse, merge: Option<&MergeStatus>, tally: &Tally) {
    let fmt_loss = |l: Option<f32>| l.map(|l| format!("{l:.4}")).unwrap_or_else(|| "-".into());
    let mean_tps = if tally.tokens_per_s.is_empty() {
        0.0
    } else {
        tally.tokens_per_s.iter().sum::<f64>() / tally.tokens_per_s.len() as f64
    };
    println!("run {} (epoch {})", status.run, status.epoch);
    println!(
        "loss: first {} -> last {}",
        fmt_loss(tally.first_loss),
        fmt_loss(tally.last_loss)
    );
    println!(
        "samples: {} completed, {} dropped, {} in flight",
        status.samples.completed, status.samples.dropped, status.samples.in_flight
    );
    println!("tokens/s: {mean_tps:.0} (mean of polls)");
    let evals: Vec<_> = status.evals.iter().filter_map(|e| e.eval_loss).collect();
    if let (Some(first), Some(last)) = (evals.first(), evals.last()) {
        println!(
            "eval loss (held out, through the network): {first:.4} -> {last:.4} after {} samples",
            status
                .evals
                .iter()
                .rev()
                .find(|e| e.eval_loss.is_some())
                .map_or(0, |e| e.trained_samples)
        );
    }
    if let Some(merge) = merge.filter(|m| !m.epochs.is_empty()) {
        println!("epoch  samples  mean loss  first quarter  last quarter  eval (start)");
        for e in &merge.epochs {
            println!(
                "{:>5}  {:>7}  {:>9}  {:>13}  {:>12}  {:>12}",
                e.epoch,
                e.completed,
                fmt_loss(e.mean_loss),
                fmt_loss(e.first_loss),
                fmt_loss(e.last_loss),
                fmt_loss(e.eval_loss)
            );
        }
    }
    println!(
        "section  miner                                             fwd    bwd  penalties  weights (reported)"
    );
    for section in &status.sections {
        for m in &section.miners {
            let weights = match &m.weights_hash {
                Some(h) => format!(
                    "epoch {} {}",
                    m.weights_epoch,
                    h.chars().take(12).collect::<String>()
                ),
                None => "seed".into(),
            };
            println!(
                "{:>7}  {:<48} {:>6} {:>6} {:>10}  {weights}",
                section.index, m.hotkey, m.forwards, m.backwards, m.penalties
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: LocalArgs,
    }

    #[test]
    fn every_local_network_signs_for_its_own_run_name_and_keeps_it_on_restart() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let wrap = Wrap::parse_from(["x"]);
        let listen: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let run_of = |dir: &Path| {
            let path = write_config(&wrap.args, dir, listen).unwrap();
            crate::orchestrator::RunConfig::load(&path).unwrap().run
        };
        let first = run_of(a.path());
        assert!(first.starts_with("local-"), "{first}");
        assert_ne!(first, run_of(b.path()), "two networks share a run name");
        assert_eq!(
            first,
            run_of(a.path()),
            "a restart on the same --dir changed it"
        );
    }

    #[test]
    fn miners_ask_for_the_run_configs_max_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let listen: SocketAddr = "127.0.0.1:9999".parse().unwrap();
        let wallets = WalletDir::new(dir.path().join("wallets"));
        let stats = dir.path().join("m.json");
        let asked = |args: &LocalArgs, config: &Path| {
            let k = crate::orchestrator::RunConfig::load(config)
                .unwrap()
                .max_in_flight;
            let cmd = mine_command("miner0", "http://x", &wallets, args, k, &stats);
            let at = cmd.iter().position(|a| a == "--max-in-flight").unwrap();
            cmd[at + 1].clone()
        };
        // A generated config: the flag's value.
        let wrap = Wrap::parse_from(["x", "--max-in-flight", "8"]);
        let path = write_config(&wrap.args, dir.path(), listen).unwrap();
        assert_eq!(asked(&wrap.args, &path), "8");
        // A run config of its own (--config): its value, not the flag's default of 4.
        let own = dir.path().join("own.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let text: String = text
            .lines()
            .map(|l| {
                if l.starts_with("max_in_flight:") {
                    "max_in_flight: 12".to_string()
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&own, text).unwrap();
        let wrap = Wrap::parse_from(["x", "--config", own.to_str().unwrap()]);
        assert_eq!(asked(&wrap.args, &own), "12");
    }

    #[test]
    fn generated_config_is_a_valid_run_config() {
        let dir = tempfile::tempdir().unwrap();
        let wrap = Wrap::parse_from([
            "x",
            "--sections",
            "2",
            "--seq-len",
            "16",
            "--batch-size",
            "2",
        ]);
        let listen: SocketAddr = "127.0.0.1:9999".parse().unwrap();
        let path = write_config(&wrap.args, dir.path(), listen).unwrap();
        let cfg = crate::orchestrator::RunConfig::load(&path).unwrap();
        assert_eq!(cfg.model.sections, vec![[0, 3], [3, 6]]);
        assert_eq!(cfg.seq_len, 16);
        assert_eq!(cfg.batch_size, 2);
        assert_eq!(cfg.listen, listen);
        assert_eq!(cfg.data_dir, dir.path().join("state"));
        assert_eq!(cfg.samples_per_step, 0);
        assert_eq!(cfg.max_in_flight, 4);
        assert_eq!(cfg.eval_every, 1);
        let wrap = Wrap::parse_from(["x", "--max-in-flight", "2", "--eval-every", "5"]);
        let path = write_config(&wrap.args, dir.path(), listen).unwrap();
        let cfg = crate::orchestrator::RunConfig::load(&path).unwrap();
        assert_eq!((cfg.max_in_flight, cfg.eval_every), (2, 5));
        // No work in flight, or no evaluation interval, would stall the run or divide by zero:
        // refused when the flags are parsed.
        assert!(Wrap::try_parse_from(["x", "--max-in-flight", "0"]).is_err());
        assert!(Wrap::try_parse_from(["x", "--eval-every", "0"]).is_err());
    }

    #[test]
    fn synchronous_steps_are_one_flag_and_the_schedule_counts_steps() {
        let dir = tempfile::tempdir().unwrap();
        let listen: SocketAddr = "127.0.0.1:9999".parse().unwrap();
        let wrap = Wrap::parse_from([
            "x",
            "--samples-per-step",
            "2",
            "--samples",
            "301",
            "--merge-every",
            "50",
        ]);
        let path = write_config(&wrap.args, dir.path(), listen).unwrap();
        let cfg = crate::orchestrator::RunConfig::load(&path).unwrap();
        assert_eq!(cfg.samples_per_step, 2);
        assert_eq!(cfg.schedule.total_steps, 151);
        // A merge interval that splits a step is refused by name when the config is read.
        let wrap = Wrap::parse_from(["x", "--samples-per-step", "2", "--merge-every", "5"]);
        let path = write_config(&wrap.args, dir.path(), listen).unwrap();
        let err = crate::orchestrator::RunConfig::load(&path).unwrap_err();
        assert!(err.to_string().contains("samples_per_step"), "{err}");
    }

    #[test]
    fn children_are_killed_on_drop() {
        let mut children = Children::default();
        children.push(
            "sleeper".into(),
            Command::new("sleep").arg("30").spawn().unwrap(),
        );
        assert!(children.exited().is_empty());
        let pid = children.procs[0].1.id();
        drop(children);
        // The process is reaped: /proc no longer lists it.
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }
}
