//! End to end: `iota local` with the `tiny` preset, 3 sections x 2 miners as separate
//! processes. The loss falls, the merged model's held-out loss falls, and the ledger shows
//! every miner working and samples keeping to lanes (lane routing is the default).

use std::collections::{BTreeSet, HashMap};
use std::process::Command;

mod common;

use common::net::http_get;

#[test]
fn local_network_trains_and_keeps_samples_on_lanes() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("metrics.jsonl");
    let summary = dir.path().join("summary.json");
    let output = Command::new(env!("CARGO_BIN_EXE_iota"))
        .args([
            "local",
            "--preset",
            "tiny",
            "--sections",
            "3",
            "--miners-per-section",
            "2",
            "--samples",
            "40",
            "--seq-len",
            "32",
            "--batch-size",
            "2",
            "--lr",
            "0.01",
            "--poll-ms",
            "250",
        ])
        .arg("--dir")
        .arg(dir.path())
        .arg("--metrics-out")
        .arg(&metrics)
        .arg("--summary-out")
        .arg(&summary)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "iota local failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("loss: first"), "{stdout}");

    // The training loss reported by the status polls falls. Its lowest reading is compared,
    // not its last: at this deliberately high learning rate (0.01, 64-token samples) a lane
    // can spike in the last few samples, as single-process training does at the same settings
    // (`iota train` over 12 seeds peaked at up to 10.1 after step 10 of 40; here about 1 run
    // in 30 ended a lane at 15 before recovering, and the last reading then sat above the
    // first). The merged model's held-out loss below is the end result.
    let losses: Vec<f64> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["loss"].as_f64())
        .collect();
    assert!(losses.len() >= 2, "too few loss readings: {losses:?}");
    let lowest = losses.iter().copied().fold(f64::INFINITY, f64::min);
    assert!(
        lowest < losses[0] - 0.5,
        "loss did not fall: readings {losses:?}"
    );

    // The held-out loss of the merged model, evaluated through the network, before training
    // and after the epoch's merge (about 5.6 falling to 2.9-4.3 over 30 runs measured).
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    let evals: Vec<(u64, f64)> = summary["evals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["epoch"].as_u64().unwrap(),
                e["eval_loss"].as_f64().unwrap(),
            )
        })
        .collect();
    assert!(
        matches!(evals[..], [(0, before), (1, after)] if after < before - 0.5),
        "the merged model's held-out loss did not fall: {evals:?}"
    );

    // The ledger: every completed sample has a pathway through all three sections, and the
    // pathways follow two lanes: the two most common miner triples share no miner and carry
    // most samples (a forward its lane leaves for `lane_wait_ms` may go to anyone).
    let db = rusqlite::Connection::open(dir.path().join("state/state.sqlite")).unwrap();
    let mut stmt = db
        .prepare(
            "SELECT p.sample, p.section, p.miner FROM pathway p JOIN samples s ON s.id = p.sample \
             WHERE s.outcome = 'completed' AND s.kind = 'train' ORDER BY p.sample, p.section",
        )
        .unwrap();
    let rows: Vec<(i64, i64, String)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut paths: HashMap<i64, Vec<String>> = HashMap::new();
    let mut per_section: HashMap<i64, BTreeSet<String>> = HashMap::new();
    for (sample, section, miner) in rows {
        paths.entry(sample).or_default().push(miner.clone());
        per_section.entry(section).or_default().insert(miner);
    }
    assert!(paths.len() >= 30, "only {} completed samples", paths.len());
    assert!(paths.values().all(|p| p.len() == 3), "{paths:?}");
    let mut triples: HashMap<&Vec<String>, usize> = HashMap::new();
    for p in paths.values() {
        *triples.entry(p).or_default() += 1;
    }
    let mut by_count: Vec<(&Vec<String>, usize)> = triples.into_iter().collect();
    by_count.sort_by_key(|b| std::cmp::Reverse(b.1));
    assert!(by_count.len() >= 2, "one lane only: {by_count:?}");
    let (lane0, lane1) = (by_count[0].0, by_count[1].0);
    assert!(
        lane0.iter().all(|m| !lane1.contains(m)),
        "the two main lanes share a miner: {by_count:?}"
    );
    assert!(
        (by_count[0].1 + by_count[1].1) * 10 >= paths.len() * 8,
        "fewer than 80% of samples on the two lanes: {by_count:?}"
    );
    for section in 0..3 {
        assert_eq!(
            per_section.get(&section).map(BTreeSet::len),
            Some(2),
            "section {section} did not use both miners"
        );
    }
}

#[test]
fn keep_running_serves_the_api_after_the_budget_until_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::net::free_port();
    let mut child = keep_running_network(dir.path(), port);
    // Wait until the run is over (the budget spent, its last merge done and that model
    // evaluated through the network) and the miners are gone, while the API still answers.
    let body = wait_until_finished(&mut child, port);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["samples"]["completed"].as_u64(), Some(4), "{body}");
    assert!(v["eval_loss"].as_f64().is_some(), "{body}");
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert!(
        child.try_wait().unwrap().is_none(),
        "iota local did not keep running"
    );
    assert!(get_status(port).is_some(), "the API stopped answering");
    interrupt_and_expect_a_clean_exit(&mut child, port);
}

/// A Ctrl-C sent while `iota local` winds the finished run up (its validator publishing, the
/// miners stopping) is not lost: before one listener was created for the whole run, the wait
/// for Ctrl-C began after the wind-up and never heard it, and `iota local --keep-running` ran
/// on forever. Sent 0.3 s after the run reports itself finished (past `iota local`'s own
/// 0.2 s poll), the old build hung in 4 of 4 tries (release build, 0.3 and 0.5 s; at 1 s its
/// wait had begun), and this test failed against it.
#[test]
fn a_ctrl_c_while_the_run_winds_up_stops_iota_local() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::net::free_port();
    let mut child = keep_running_network(dir.path(), port);
    wait_until_finished(&mut child, port);
    std::thread::sleep(std::time::Duration::from_millis(300));
    interrupt_and_expect_a_clean_exit(&mut child, port);
}

/// `iota local --keep-running` of 4 small samples, 1 miner per section, its API on `port`.
fn keep_running_network(dir: &std::path::Path, port: u16) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_iota"))
        .args(["local", "--preset", "tiny", "--miners-per-section", "1"])
        .args(["--samples", "4", "--seq-len", "16", "--batch-size", "2"])
        .args(["--poll-ms", "200", "--keep-running"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--dir")
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// Polls `/api/status` until the run says it finished (within 90 s, `child` alive all along);
/// returns that status.
fn wait_until_finished(child: &mut std::process::Child, port: u16) -> String {
    let start = std::time::Instant::now();
    loop {
        assert!(
            start.elapsed().as_secs() < 90,
            "the budget was never reached"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "iota local exited before Ctrl-C"
        );
        if let Some(body) = get_status(port).filter(|b| b.contains("\"finished\":true")) {
            return body;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Sends `child` a Ctrl-C; it must exit successfully within 30 s, taking the orchestrator on
/// `port` with it.
fn interrupt_and_expect_a_clean_exit(child: &mut std::process::Child, port: u16) {
    signal(child.id(), "-INT");
    let exit = exit_within_30_s(child, "iota local ignored a Ctrl-C");
    assert!(exit.success(), "exit {exit}");
    assert!(
        get_status(port).is_none(),
        "the orchestrator outlived iota local"
    );
}

/// `GET /api/status` of the orchestrator on `port`; the JSON body, or None when nothing answers.
fn get_status(port: u16) -> Option<String> {
    http_get(&format!("http://127.0.0.1:{port}/api/status"))
}

#[test]
fn an_orchestrator_that_refuses_its_config_is_reported_with_its_reason() {
    // `tiny` holds 64 tokens per sample: the orchestrator refuses the run config and exits.
    // `iota local` says so with the end of the orchestrator's log, instead of waiting out its
    // connection retries and blaming the network.
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_iota"))
        .args([
            "local",
            "--preset",
            "tiny",
            "--samples",
            "4",
            "--seq-len",
            "128",
        ])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("the orchestrator exited"),
        "the exit is reported: {stderr}"
    );
    assert!(
        stderr.contains("max_seq_len is 64"),
        "with the orchestrator's reason: {stderr}"
    );
    assert!(
        dir.path().join("logs/orchestrator.log").exists(),
        "the log stays"
    );
}

/// When every miner of a section has exited (killed here, as an out-of-memory kill or a crash
/// would), no sample can complete: `iota local` fails at once naming the section, the miner and
/// its exit, instead of watching a network that can never finish. Before, it printed "children
/// exited" and waited until killed.
#[test]
fn a_section_that_loses_every_miner_ends_iota_local_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_iota"))
        .args(["local", "--preset", "tiny", "--miners-per-section", "1"])
        .args([
            "--samples",
            "100000",
            "--seq-len",
            "16",
            "--batch-size",
            "2",
        ])
        .args(["--poll-ms", "200", "--validators", "0"])
        .arg("--dir")
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // miner2 is pinned to section 2 (of 3): wait for its process, then kill it.
    let wallets = dir.path().join("wallets").display().to_string();
    let start = std::time::Instant::now();
    let pid = loop {
        assert!(start.elapsed().as_secs() < 60, "miner2 never started");
        assert!(
            child.try_wait().unwrap().is_none(),
            "iota local exited early"
        );
        if let Some(pid) = process_with_args(&["mine", "miner2", &wallets]) {
            break pid;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    // Let it register and work a little, so the run is under way when it goes.
    std::thread::sleep(std::time::Duration::from_secs(3));
    signal(pid, "-KILL");
    let exit = exit_within_30_s(
        &mut child,
        "iota local went on watching a section with no miner",
    );
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!exit.success(), "{stderr}");
    assert!(
        stderr.contains("every miner of section 2 exited") && stderr.contains("miner2 (signal: 9"),
        "the section and the miner's exit are named: {stderr}"
    );
    assert!(stderr.contains("miner2.log"), "with its log: {stderr}");
}

/// The pid of a running process whose command line holds every one of `args`.
fn process_with_args(args: &[&str]) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let parts: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect();
            args.iter()
                .all(|a| parts.iter().any(|p| p == a))
                .then_some(pid)
        })
}

/// Sends process `pid` the signal `flag` (`-INT`, `-KILL`) with `kill`.
fn signal(pid: u32, flag: &str) {
    let sent = Command::new("kill")
        .args([flag, &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill {flag} {pid}");
}

/// The exit of `child` within 30 s; past that it is killed and the test fails with `why`.
fn exit_within_30_s(child: &mut std::process::Child, why: &str) -> std::process::ExitStatus {
    let start = std::time::Instant::now();
    loop {
        if let Some(exit) = child.try_wait().unwrap() {
            return exit;
        }
        if start.elapsed().as_secs() > 30 {
            let _ = child.kill();
            panic!("{why}");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
