//! End to end with real processes (`iota orchestrate`, three `iota mine`, `iota validate`):
//! the published weight vector is stable under an orchestrator restart and a validator
//! restart, and replaying honest miners matches them across several local optimizer steps.
//!
//! - The validator publishes epoch 0; it and the orchestrator are killed (`kill -9`); the
//!   restarted orchestrator serves the same `GET /api/weights`, byte for byte.
//! - The validator restarted on its state directory keeps its window of epoch 0 as it was
//!   (it never recomputes or republishes it) and goes on with epochs 1 and 2.
//! - The same validator hotkey started again on an empty state directory recomputes the last
//!   finished epoch from the orchestrator's records: the same miners tracked, the same
//!   throughput and penalties, and a vector within 1e-3 (L1) of the first one.
//! - Every replay (all three miners, every epoch, `local_steps: 2`, so 4 steps each) replays
//!   every item, skips and fails none, keeps every cosine at or above 0.99 and finds the
//!   uploaded state's change where the replay's went (cosine at or above 0.9).

mod common;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use common::local_run::{vector, windows};
use common::net::{free_port, http_get, status};
use common::procs::{Kids, spawn, start_miner, start_orchestrator};
use iota::wallet::WalletDir;
use serde_json::Value;

/// Samples per epoch and the run's budget (three epochs).
const PER_EPOCH: u64 = 8;
const BUDGET: u64 = 24;

/// A run config with one validator that runs (`val`) and one that never does (`idle`, so the
/// epochs' objects stay for `retain_s` and the last epoch can be validated again).
fn write_config(dir: &Path, val: &str, idle: &str) -> (String, PathBuf) {
    let port = free_port();
    let config = dir.join("run.yaml");
    std::fs::write(
        &config,
        format!(
            "run: weights-restart\nmodel: {{ preset: tiny }}\ndata: {{ source: synthetic }}\n\
             listen: 127.0.0.1:{port}\ndata_dir: {}\nbatch_size: 2\nseq_len: 32\n\
             max_in_flight: 4\nlocal_steps: 2\nheartbeat_s: 1\neval_samples: 0\n\
             batches_before_merging: {PER_EPOCH}\nmax_samples: {BUDGET}\n\
             deadlines: {{ forward_s: 30, backward_s: 60 }}\n\
             merge: {{ upload_s: 30, lease_grace_s: 5, merge_s: 60 }}\n\
             validators: [{{ hotkey: {val}, stake: 1.0 }}, {{ hotkey: {idle}, stake: 1.0 }}]\n\
             validation: {{ replay: {{ miners_per_epoch: 3 }}, retain_s: 3600 }}\n",
            dir.join("state").display()
        ),
    )
    .unwrap();
    (format!("http://127.0.0.1:{port}"), config)
}

/// Starts `iota validate` as hotkey `name` keeping its windows in `state`.
fn start_validator(dir: &Path, url: &str, name: &str, state: &Path, log: &str) -> Child {
    let wallets = dir.join("wallets");
    spawn(
        &[
            "validate",
            "--wallet",
            "w",
            "--hotkey",
            name,
            "--orchestrator",
            url,
            "--wallets-dir",
            wallets.to_str().unwrap(),
            "--threads",
            "1",
            "--poll-ms",
            "250",
            "--state-dir",
            state.to_str().unwrap(),
        ],
        &dir.join(log),
    )
}

/// Every log of the run, for a failure message.
fn logs(dir: &Path) -> String {
    common::procs::log_tails(dir, 40)
}

/// Polls `ok` every 250 ms; on timeout panics with `what` and the logs.
fn wait(dir: &Path, what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < timeout,
            "timed out waiting for {what}\n{}",
            logs(dir)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `GET /api/weights` (the text and the parsed document).
fn metagraph(url: &str) -> Option<(String, Value)> {
    let text = http_get(&format!("{url}/api/weights"))?;
    let v = serde_json::from_str(&text).ok()?;
    Some((text, v))
}

/// The epoch of `hotkey`'s latest vector in the metagraph.
fn published_epoch(url: &str, hotkey: &str) -> Option<u64> {
    let (_, v) = metagraph(url)?;
    v["validators"]
        .as_array()?
        .iter()
        .find(|x| x["hotkey"] == hotkey)?["epoch"]
        .as_u64()
}

/// The checks every window of honest miners passes (see the module docs).
fn check_window(w: &Value, miners: &[String]) {
    let epoch = &w["epoch"];
    let v = vector(w);
    let total: f64 = v.values().sum::<f64>() + w["burn"].as_f64().unwrap();
    assert!((total - 1.0).abs() < 1e-9, "epoch {epoch}: sums to {total}");
    for m in w["miners"].as_array().unwrap() {
        assert!(
            m["weight"]["parts"]["flags"].as_array().unwrap().is_empty()
                && m["weight"]["weight"].as_f64().unwrap() > 0.0,
            "epoch {epoch}: an honest miner flagged or unpaid: {m}"
        );
    }
    let replays = w["replays"].as_array().unwrap();
    let mut replayed: Vec<String> = replays
        .iter()
        .map(|r| r["miner"].as_str().unwrap().to_string())
        .collect();
    replayed.sort();
    let mut all = miners.to_vec();
    all.sort();
    assert_eq!(replayed, all, "epoch {epoch}: every miner replayed: {w}");
    for r in replays {
        let s = &r["stats"];
        let items = r["items"].as_u64().unwrap();
        assert!(items >= PER_EPOCH, "epoch {epoch}: {r}");
        assert_eq!(s["replayed"].as_u64(), Some(items), "epoch {epoch}: {r}");
        assert_eq!(s["skipped"].as_u64(), Some(0), "epoch {epoch}: {r}");
        assert_eq!(s["failed"].as_u64(), Some(0), "epoch {epoch}: {r}");
        // 8 backwards (the tail's forwards included) at local_steps 2.
        assert_eq!(
            s["steps"].as_u64(),
            Some(PER_EPOCH / 2),
            "epoch {epoch}: {r}"
        );
        assert!(
            s["min_cosine"].as_f64().unwrap() >= 0.99,
            "epoch {epoch}: {r}"
        );
        assert!(
            r["state"]["cosine"].as_f64().unwrap() >= 0.9,
            "epoch {epoch}: the upload against the replay: {r}"
        );
    }
}

#[test]
fn weights_are_stable_under_orchestrator_and_validator_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let wallets = WalletDir::new(d.join("wallets"));
    let val = wallets.create_hotkey("w", "val", true).unwrap();
    let idle = wallets.create_hotkey("w", "idle", true).unwrap();
    let val_addr = val.address().to_string();
    let (url, config) = write_config(d, &val_addr, &idle.address().to_string());
    let mut orchestrator = Kids(vec![start_orchestrator(d, &config, &url)]);
    let mut miners = Kids(Vec::new());
    let mut addresses = Vec::new();
    for i in 0..3 {
        let (child, address) = start_miner(d, &url, &format!("m{i}"));
        miners.0.push(child);
        addresses.push(address);
    }
    let state = d.join("val-state");
    let mut validator = Kids(vec![start_validator(d, &url, "val", &state, "val-1.log")]);

    // Epoch 0 published: stop the validator, then kill the orchestrator and restart it.
    wait(d, "weights of epoch 0", Duration::from_secs(300), || {
        published_epoch(&url, &val_addr).is_some()
    });
    drop(validator);
    let (before, view) = metagraph(&url).unwrap();
    assert_eq!(published_epoch(&url, &val_addr), Some(0), "{view}");
    let window0 = std::fs::read_to_string(state.join("weights-restart/window-0.json")).unwrap();
    drop(orchestrator);
    std::thread::sleep(Duration::from_secs(1));
    orchestrator = Kids(vec![start_orchestrator(d, &config, &url)]);
    let (after, _) = metagraph(&url).unwrap();
    assert_eq!(after, before, "the metagraph changed across the restart");

    // The validator restarted on its state: epochs 1 and 2, epoch 0 left as it was.
    validator = Kids(vec![start_validator(d, &url, "val", &state, "val-2.log")]);
    wait(d, "weights of epoch 2", Duration::from_secs(400), || {
        published_epoch(&url, &val_addr) == Some(2)
    });
    drop(validator);
    let kept = windows(&state);
    assert_eq!(kept.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2]);
    assert_eq!(
        std::fs::read_to_string(state.join("weights-restart/window-0.json")).unwrap(),
        window0,
        "the restarted validator rewrote epoch 0"
    );
    let second = std::fs::read_to_string(d.join("val-2.log")).unwrap();
    assert!(
        !second.contains("epoch 0:"),
        "epoch 0 validated again:\n{second}"
    );
    for w in kept.values() {
        check_window(w, &addresses);
    }
    assert!(
        status(&url).is_some_and(|s| s["finished"] == true),
        "the run should have spent its budget"
    );

    // The same hotkey on an empty state directory: the last finished epoch again.
    let fresh = d.join("val-fresh");
    let validator = Kids(vec![start_validator(d, &url, "val", &fresh, "val-3.log")]);
    wait(d, "a recomputed window", Duration::from_secs(300), || {
        !windows(&fresh).is_empty()
    });
    drop(validator);
    drop(miners);
    let again = windows(&fresh);
    let (&epoch, redone) = again.iter().next().unwrap();
    assert_eq!(
        epoch, 2,
        "the fresh validator starts at the last finished epoch"
    );
    check_window(redone, &addresses);
    let first = &kept[&2];
    assert_eq!(first["tracked"], redone["tracked"], "secret choices differ");
    let parts = |w: &Value| -> Vec<(Value, Value)> {
        w["miners"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["weight"]["parts"]["throughput"].clone(),
                    m["weight"]["parts"]["penalties"].clone(),
                )
            })
            .collect()
    };
    assert_eq!(parts(first), parts(redone));
    // The replays reproduce each other too (same items, same steps, the same smallest cosine
    // up to the CPU kernels' run-to-run rounding).
    for (r1, r2) in first["replays"]
        .as_array()
        .unwrap()
        .iter()
        .zip(redone["replays"].as_array().unwrap())
    {
        assert_eq!(r1["miner"], r2["miner"]);
        assert_eq!(r1["stats"]["replayed"], r2["stats"]["replayed"]);
        assert_eq!(r1["stats"]["steps"], r2["stats"]["steps"]);
        let cos = |r: &Value| r["stats"]["min_cosine"].as_f64().unwrap();
        assert!((cos(r1) - cos(r2)).abs() < 1e-4, "{r1}\n{r2}");
    }
    let (a, b) = (vector(first), vector(redone));
    let l1: f64 = a.iter().map(|(h, x)| (x - b[h]).abs()).sum();
    assert!(
        l1 < 1e-3,
        "recomputed epoch 2 differs by {l1}:\n{a:?}\n{b:?}"
    );
    eprintln!("epoch 2 recomputed from scratch: L1 distance {l1:.2e}");
    drop(orchestrator);
}
