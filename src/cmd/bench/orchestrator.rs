//! `iota bench orchestrator`: one real orchestrator (`iota orchestrate`, its own process,
//! local storage, SQLite state) under N simulated miners (real signed HTTP clients, no model
//! compute, tiny payloads). Prints requests/s and p50/p99 latency per endpoint, the
//! orchestrator's RSS and CPU, and how latency grows with the rows in its database.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;

use super::latency::{Record, Recorder, Summary, by_endpoint, summarise};
use super::sim_miner::{self, Shared};
use crate::api::client::ApiClient;
use crate::codec::WireDtype;
use crate::model::ModelConfig;
use crate::orchestrator::state::STATE_FILE;
use crate::storage::RetryPolicy;

/// Arguments of `iota bench orchestrator`.
#[derive(Debug, Args)]
pub struct BenchOrchestratorArgs {
    /// Simulated miners per run, one run each (spread over the sections by registration).
    #[arg(long, value_delimiter = ',', default_values_t = vec![10, 50, 150])]
    pub miners: Vec<usize>,
    /// Completed samples per run.
    #[arg(long, default_value_t = 2000)]
    pub samples: u64,
    /// Samples per row of the growth table (latency against rows in the database).
    #[arg(long, default_value_t = 500)]
    pub window: u64,
    /// Model preset (sets the section count and the activation width).
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    /// Sequences per sample.
    #[arg(long, default_value_t = 1)]
    pub batch_size: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 8)]
    pub seq_len: usize,
    /// Assignments each miner asks for per poll (and its in-flight limit).
    #[arg(long, default_value_t = 4)]
    pub max_in_flight: usize,
    /// Longest idle poll interval of a miner, in milliseconds (`iota mine`: 150).
    #[arg(long, default_value_t = 150)]
    pub poll_ms: u64,
    /// How long each simulated miner's `/api/work` may be held open waiting for work, in ms
    /// (`iota mine`: 1000; 0: plain polling). Its latency is counted without the wait.
    #[arg(long, default_value_t = 1000)]
    pub wait_ms: u64,
    /// Milliseconds each simulated miner sleeps per assignment in place of model compute (0: a
    /// closed loop at saturation, where every miner is always waiting on the orchestrator).
    #[arg(long, default_value_t = 0)]
    pub compute_ms: u64,
    /// Miners' heartbeat interval, in seconds.
    #[arg(long, default_value_t = 10)]
    pub heartbeat_s: u64,
    /// Dashboard-like watchers polling `/api/status`, `/api/merge/status` and `/metrics` every
    /// 2 s (unauthenticated, like a browser on the dashboard).
    #[arg(long, default_value_t = 2)]
    pub watchers: usize,
    /// Give up a run after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
    /// Also run every miner count against the orchestrator of this other `iota` binary (e.g. a
    /// build of an older commit), interleaved with this one, and print the ratios.
    #[arg(long)]
    pub baseline: Option<PathBuf>,
    /// Keep the run directories here (default: a temporary directory, removed at the end).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// One sample of the orchestrator process.
#[derive(Debug, Clone, Copy)]
struct ProcSample {
    rss: u64,
    cpu_ticks: u64,
}

/// What one run measured.
struct RunResult {
    miners: usize,
    target: u64,
    wall: Duration,
    records: Vec<Record>,
    window_start: Vec<(u64, Instant, Option<ProcSample>, u64)>,
    end: Instant,
    peak_rss: u64,
    cpu_s: f64,
    refused: u64,
    busy_puts: u64,
    ledger: (u64, u64, u64),
}

/// Clock ticks per second of `/proc/PID/stat` (`USER_HZ`, 100 on Linux).
const USER_HZ: f64 = 100.0;

fn proc_sample(pid: u32) -> Option<ProcSample> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at field 3 (state).
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(ProcSample {
        rss: kib * 1024,
        cpu_ticks: utime + stime,
    })
}

fn write_config(args: &BenchOrchestratorArgs, dir: &Path, listen: &str) -> anyhow::Result<PathBuf> {
    let run = format!(
        "bench-{}-{}",
        std::process::id(),
        dir.display().to_string().len()
    );
    // Every simulated miner registers from this machine's address at once: the new-key limit
    // per address (`placement.new_keys`) would otherwise hold back all but 8 of them.
    let yaml = format!(
        "run: {run}\nmodel: {{preset: {preset}}}\ndata: {{source: synthetic}}\n\
         listen: {listen}\ndata_dir: {data}\nmax_miners_per_section: 1000\n\
         batch_size: {b}\nseq_len: {s}\nwire: bf16\nmax_in_flight: {m}\neval_samples: 0\n\
         deadlines: {{forward_s: 60, backward_s: 120}}\n\
         batches_before_merging: 1000000000\nheartbeat_s: {hb}\nminer_ttl_s: {ttl}\n\
         placement: {{new_keys: {{burst: 1000000}}}}\n",
        preset = args.preset,
        data = dir.join("state").display(),
        b = args.batch_size,
        s = args.seq_len,
        m = args.max_in_flight,
        hb = args.heartbeat_s,
        ttl = args.heartbeat_s * 6,
    );
    let path = dir.join("run.yaml");
    fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

struct Orchestrator(Child);

impl Drop for Orchestrator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_orchestrator(exe: &Path, config: &Path, dir: &Path) -> anyhow::Result<Orchestrator> {
    let log = dir.join("orchestrator.log");
    let out = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let child = Command::new(exe)
        .arg("orchestrate")
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(out)
        .spawn()
        .context("starting iota orchestrate")?;
    Ok(Orchestrator(child))
}

async fn wait_ready(base: &str) -> anyhow::Result<ApiClient> {
    let policy = RetryPolicy {
        max_attempts: 1,
        initial_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(50),
    };
    for _ in 0..300 {
        if let Ok(client) = ApiClient::connect(base, None, policy).await {
            return Ok(client);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the orchestrator at {base} did not answer within 30 s")
}

async fn run_one(
    args: &BenchOrchestratorArgs,
    exe: &Path,
    miners: usize,
    dir: &Path,
) -> anyhow::Result<RunResult> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("finding a free port")?;
    let config = write_config(args, dir, &listen.to_string())?;
    let mut orch = start_orchestrator(exe, &config, dir)?;
    let pid = orch.0.id();
    let base = format!("http://{listen}");
    let public = wait_ready(&base).await?;
    let model = ModelConfig::preset(&args.preset)?;
    let shared = Arc::new(Shared {
        base: base.clone(),
        run: public.run().to_string(),
        wire: WireDtype::Bf16,
        tail: model.n_sections().saturating_sub(1),
        max_in_flight: args.max_in_flight,
        heartbeat: Duration::from_secs(args.heartbeat_s.max(1)),
        idle_max: Duration::from_millis(args.poll_ms.max(1)),
        wait_ms: args.wait_ms,
        compute: Duration::from_millis(args.compute_ms),
        completed: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        busy_puts: AtomicU64::new(0),
        window: args.window.max(1),
        stop: AtomicBool::new(false),
        recorder: Recorder::default(),
    });
    let tag = format!("bench-{}-{miners}", std::process::id());
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(miners);
    for i in 0..miners {
        tasks.push(tokio::spawn(sim_miner::run(shared.clone(), tag.clone(), i)));
    }
    for _ in 0..args.watchers {
        tasks.push(tokio::spawn(sim_miner::watch(shared.clone())));
    }
    let cpu0 = proc_sample(pid).map_or(0, |p| p.cpu_ticks);
    let mut window_start = vec![(0, start, proc_sample(pid), 0)];
    let mut peak_rss = 0;
    let deadline = start + Duration::from_secs(args.timeout_s);
    let db = dir.join("state").join(STATE_FILE);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let done = shared.completed.load(Ordering::Relaxed);
        let sample = proc_sample(pid);
        peak_rss = peak_rss.max(sample.map_or(0, |p| p.rss));
        let window = done / shared.window;
        if window_start.last().is_some_and(|w| w.0 < window) {
            let db_bytes = [db.clone(), db.with_extension("sqlite-wal")]
                .iter()
                .map(|p| fs::metadata(p).map_or(0, |m| m.len()))
                .sum();
            window_start.push((window, Instant::now(), sample, db_bytes));
        }
        if done >= args.samples {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "run with {miners} miners: only {done} of {} samples completed in {} s (log: {})",
                args.samples,
                args.timeout_s,
                dir.join("orchestrator.log").display()
            );
        }
        if let Some(status) = orch.0.try_wait().context("watching the orchestrator")? {
            bail!(
                "the orchestrator exited ({status}); log: {}",
                dir.join("orchestrator.log").display()
            );
        }
        if tasks.iter().any(|t| t.is_finished()) {
            // A miner stopped early: its error is reported below.
            break;
        }
    }
    let end = Instant::now();
    let wall = end - start;
    shared.stop.store(true, Ordering::Relaxed);
    let cpu1 = proc_sample(pid).map_or(cpu0, |p| p.cpu_ticks);
    for t in tasks {
        t.await.context("a simulated miner panicked")??;
    }
    let status = public.status().await.context("reading the final status")?;
    drop(orch);
    Ok(RunResult {
        miners,
        target: args.samples,
        wall,
        records: shared.recorder.take(),
        window_start,
        end,
        peak_rss,
        cpu_s: (cpu1.saturating_sub(cpu0)) as f64 / USER_HZ,
        refused: shared.refused.load(Ordering::Relaxed),
        busy_puts: shared.busy_puts.load(Ordering::Relaxed),
        ledger: (
            status.samples.completed,
            status.samples.dropped,
            status.samples.in_flight,
        ),
    })
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn print_endpoints(r: &RunResult) {
    let secs = r.wall.as_secs_f64().max(1e-9);
    println!(
        "\n{} miners: {:.1} s, {} requests ({:.0}/s), orchestrator CPU {:.1} s ({:.2} cores), peak RSS {:.1} MiB, {} assignments given up (a failed request or a refused submission)",
        r.miners,
        secs,
        r.records.len(),
        r.records.len() as f64 / secs,
        r.cpu_s,
        r.cpu_s / secs,
        mib(r.peak_rss),
        r.refused
    );
    println!(
        "blob PUTs answered busy (503: {} uploads already streaming) and retried 1 s later: {}",
        crate::orchestrator::blob::MAX_CONCURRENT_PUTS,
        r.busy_puts
    );
    println!(
        "ledger: {} completed, {} dropped, {} in flight",
        r.ledger.0, r.ledger.1, r.ledger.2
    );
    println!("endpoint      requests   req/s   failed   p50 ms   p99 ms   max ms");
    for (name, s) in by_endpoint(&r.records) {
        println!(
            "{name:<12} {:>9} {:>7.0} {:>8} {:>8.2} {:>8.2} {:>8.1}",
            s.count,
            s.count as f64 / secs,
            s.failed,
            s.p50,
            s.p99,
            s.max
        );
    }
}

fn print_growth(r: &RunResult, window: u64) {
    println!(
        "growth: samples done   DB MiB   RSS MiB   req/s   work p50/p99 ms   submit p50/p99 ms"
    );
    for (i, (w, at, sample, db)) in r.window_start.iter().enumerate() {
        if w * window >= r.target {
            // The last few requests after the target was reached.
            break;
        }
        let until = r.window_start.get(i + 1).map_or(r.end, |n| n.1);
        let secs = (until - *at).as_secs_f64().max(1e-9);
        let in_w: Vec<&Record> = r.records.iter().filter(|x| x.window == *w).collect();
        let work: Summary = summarise(in_w.iter().copied(), |x| x.endpoint == "work");
        let submit: Summary = summarise(in_w.iter().copied(), |x| x.endpoint == "submit");
        println!(
            "        {:>6}-{:<6} {:>7.1} {:>9.1} {:>7.0} {:>8.2} /{:>7.2} {:>9.2} /{:>7.2}",
            w * window,
            (w + 1) * window,
            mib(*db),
            mib(sample.map_or(0, |p| p.rss)),
            in_w.len() as f64 / secs,
            work.p50,
            work.p99,
            submit.p50,
            submit.p99
        );
    }
}

/// Per-sample orchestrator CPU, requests/s and latency quantiles: this binary over the
/// baseline, measured in the same invocation.
fn print_ratios(before: &RunResult, after: &RunResult) {
    let cpu = |r: &RunResult| r.cpu_s / r.target.max(1) as f64;
    let rate = |r: &RunResult| r.target as f64 / r.wall.as_secs_f64().max(1e-9);
    println!(
        "\n{} miners, this binary / baseline: samples/s {:.2}x, orchestrator CPU per sample {:.2}x, peak RSS {:.2}x",
        after.miners,
        rate(after) / rate(before),
        cpu(after) / cpu(before).max(1e-12),
        after.peak_rss as f64 / before.peak_rss.max(1) as f64
    );
    let (b, a) = (by_endpoint(&before.records), by_endpoint(&after.records));
    for (name, sa) in &a {
        if let Some(sb) = b.get(name) {
            println!(
                "  {name:<10} p50 {:.2}x  p99 {:.2}x",
                sa.p50 / sb.p50.max(1e-9),
                sa.p99 / sb.p99.max(1e-9)
            );
        }
    }
}

/// Runs `iota bench orchestrator`.
///
/// # Errors
/// Bad arguments, an orchestrator that does not start or exits, a run that times out.
pub fn run(args: BenchOrchestratorArgs) -> anyhow::Result<()> {
    if args.miners.is_empty() || args.miners.contains(&0) {
        bail!("--miners needs one or more counts above 0, e.g. --miners 10,50,150");
    }
    if args.samples == 0 || args.window == 0 {
        bail!("--samples and --window must be above 0");
    }
    let model = ModelConfig::preset(&args.preset)?;
    let root = args.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("iota-bench-orchestrator-{}", std::process::id()))
    });
    println!(
        "iota bench orchestrator: preset {} ({} sections), samples of {} x {} tokens (bf16 wire), {} samples per run, miners' work requests wait up to {} ms for work (then poll at 10-{} ms) and ask for {} at a time, {} ms of simulated compute (a sleep) per assignment, heartbeat every {} s; one `iota orchestrate` process with local storage",
        model.name,
        model.n_sections(),
        args.batch_size,
        args.seq_len,
        args.samples,
        args.wait_ms,
        args.poll_ms,
        args.max_in_flight,
        args.compute_ms,
        args.heartbeat_s
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let current = std::env::current_exe().context("locating the iota binary")?;
    let mut variants = vec![("this binary", current)];
    if let Some(b) = &args.baseline {
        if !b.is_file() {
            bail!(
                "--baseline {}: no such file (give the path of another iota binary)",
                b.display()
            );
        }
        variants.insert(0, ("baseline", b.clone()));
    }
    let outcome = args.miners.iter().try_for_each(|&n| {
        let mut results = Vec::new();
        for (name, exe) in &variants {
            let dir = root.join(format!("{}-miners-{n}", name.replace(' ', "-")));
            let r = runtime.block_on(run_one(&args, exe, n, &dir))?;
            println!("\n== {name} ({}) ==", exe.display());
            print_endpoints(&r);
            print_growth(&r, args.window);
            results.push(r);
        }
        if let [before, after] = results.as_slice() {
            print_ratios(before, after);
        }
        anyhow::Ok(())
    });
    if args.dir.is_none() {
        // Best effort: a leftover directory in /tmp is harmless.
        let _ = fs::remove_dir_all(&root);
    }
    outcome?;
    println!(
        "\nLatency is measured by the clients (send to whole answer, one attempt, no retries); CPU and RSS are the orchestrator process's (/proc). blob GET/PUT go through the orchestrator's /blob endpoint to local storage."
    );
    Ok(())
}
