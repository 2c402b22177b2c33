//! End to end: `iota local --validators 2` (tiny preset, 3 sections x 2 honest miner processes,
//! two validator processes) through two training/merging cycles. Every validator publishes a
//! weight vector for every finished epoch; each vector sums to 1 with its burn, flags no honest
//! miner, and the two validators agree; `iota local` prints the metagraph at the end.

mod common;

use std::process::Command;

use common::local_run::{hostile_network, notes, vector as weights, windows};
use serde_json::Value;

#[test]
fn local_validators_publish_weights_for_every_finished_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_iota"))
        .args([
            "local",
            "--preset",
            "tiny",
            "--sections",
            "3",
            "--miners-per-section",
            "2",
            "--validators",
            "2",
            "--seq-len",
            "32",
            "--batch-size",
            "2",
            "--poll-ms",
            "250",
            "--merge-every",
            "16",
            "--samples",
            "40",
            "--validator-wait-s",
            "120",
        ])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "iota local failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("weights (GET /api/weights"), "{stdout}");
    assert!(!stdout.contains("DISSENTS"), "{stdout}");

    let a = windows(&dir.path().join("validators/validator0"));
    let b = windows(&dir.path().join("validators/validator1"));
    let logs = || {
        let log = |n: &str| std::fs::read_to_string(dir.path().join("logs").join(n)).unwrap();
        format!(
            "{stdout}\n{}\n{}",
            log("validator0.log"),
            log("validator1.log")
        )
    };
    assert!(
        a.contains_key(&0) && a.contains_key(&1),
        "validator0 windows {:?}\n{}",
        a.keys(),
        logs()
    );
    assert!(
        b.contains_key(&0) && b.contains_key(&1),
        "validator1 windows {:?}\n{}",
        b.keys(),
        logs()
    );
    for (epoch, w) in a.iter().chain(b.iter()) {
        let vector = weights(w);
        assert_eq!(vector.len(), 6, "epoch {epoch}: {w}");
        let total: f64 = vector.values().sum::<f64>() + w["burn"].as_f64().unwrap();
        assert!((total - 1.0).abs() < 1e-9, "epoch {epoch}: sums to {total}");
        for m in w["miners"].as_array().unwrap() {
            let flags = m["weight"]["parts"]["flags"].as_array().unwrap();
            assert!(flags.is_empty(), "epoch {epoch}: honest miner flagged: {m}");
            assert!(
                m["weight"]["weight"].as_f64().unwrap() > 0.0,
                "epoch {epoch}: an honest miner got no weight: {m}"
            );
        }
        // Each validator replayed a miner and says what it compared.
        assert_eq!(w["tracked"].as_array().unwrap().len(), 1, "{w}");
        let all: Vec<&str> = w["miners"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(notes)
            .collect();
        assert!(
            all.iter().any(|n| n.starts_with("replay:")),
            "epoch {epoch}: no replay note: {all:?}"
        );
    }
    // The two validators' vectors for the same epoch are close (L1 under 0.5).
    for epoch in [0, 1] {
        let (va, vb) = (weights(&a[&epoch]), weights(&b[&epoch]));
        let l1: f64 = va.iter().map(|(h, x)| (x - vb[h]).abs()).sum();
        assert!(l1 < 0.5, "epoch {epoch}: validators differ by {l1}");
    }
}

/// Runs the hostile-miner harness's network with honest miners only and `extra` flags, its
/// validator replaying all six miners every epoch; asserts that it ran and returns its output
/// and the validator's log.
fn replayed_by_one_validator(dir: &std::path::Path, extra: &[&str]) -> (String, String) {
    let validation = r#"{"replay": {"miners_per_epoch": 6}}"#;
    let output = hostile_network(dir, &[], validation, extra);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let log = std::fs::read_to_string(dir.join("logs/validator0.log")).unwrap_or_default();
    assert!(
        output.status.success(),
        "iota local failed:\n{stdout}\n{}\n{log}",
        String::from_utf8_lossy(&output.stderr)
    );
    (stdout, log)
}

/// A model whose later sections re-embed the token ids (`reembed: true`, 128x boundary): the
/// orchestrator hands every tail forward the sample's ids, the miners train on them, and a
/// validator that replays every miner reproduces each one's work from the ledger's objects (the
/// ids included) and flags no one.
#[test]
fn a_reembedding_model_trains_and_every_miners_replay_agrees() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.yaml");
    std::fs::write(&model, "preset: tiny\nd_b: 1\nreembed: true\n").unwrap();
    let (stdout, log) =
        replayed_by_one_validator(dir.path(), &["--model", model.to_str().unwrap()]);
    let run = std::fs::read_to_string(dir.path().join("run.yaml")).unwrap();
    assert!(run.contains("reembed: true"), "{run}");
    every_replay_agrees(dir.path(), &stdout, &log);
}

/// A warm-up without the bottleneck over the first 24 of 40 samples (`--bottleneck-warmup
/// 24`, no re-embedding): epoch 0's samples and the first half of epoch 1's cross the boundary
/// `d_model` channels wider, each at its own bridge weight; the rest cross the plain
/// bottleneck. A validator replaying every miner reproduces the work on both sides of the
/// hand-over and flags no one.
#[test]
fn a_bottleneck_warmup_crosses_the_network_and_every_miners_replay_agrees() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.yaml");
    std::fs::write(&model, "preset: tiny\nreembed: false\n").unwrap();
    let (stdout, log) = replayed_by_one_validator(
        dir.path(),
        &[
            "--model",
            model.to_str().unwrap(),
            "--bottleneck-warmup",
            "24",
        ],
    );
    let run = std::fs::read_to_string(dir.path().join("run.yaml")).unwrap();
    assert!(run.contains("bottleneck_warmup: 24"), "{run}");
    every_replay_agrees(dir.path(), &stdout, &log);
    // The orchestrator accepts an upload only at its sample's size (the width of
    // `RunConfig::boundary_shape`, tested with the config), so the run finishing means the
    // miners sent the wider tensors; the activations themselves are deleted once the validator
    // has published. The miners say so too.
    let miner = std::fs::read_to_string(dir.path().join("logs/miner0.log")).unwrap();
    assert!(
        miner.contains("in its first 24 samples the boundary tensors are 128 channels wider"),
        "{miner}"
    );
}

/// Miners stepping their hidden matrices with Muon (`--muon`): a validator that replays every
/// miner reproduces each one's work, Newton-Schulz iterations included, and flags no one (the
/// copy check among them, which takes Muon's move from the carried momentum out).
#[test]
fn muon_miners_replay_exactly_and_no_one_is_flagged() {
    let dir = tempfile::tempdir().unwrap();
    let (stdout, log) = replayed_by_one_validator(dir.path(), &["--muon"]);
    let run = std::fs::read_to_string(dir.path().join("run.yaml")).unwrap();
    assert!(run.contains("muon: true"), "{run}");
    every_replay_agrees(dir.path(), &stdout, &log);
}

/// Asserts that the validator of the run in `dir` finished windows 0 and 1, flagged no miner,
/// and replayed every item of every miner it tracked, the tail's among them.
fn every_replay_agrees(dir: &std::path::Path, stdout: &str, log: &str) {
    let windows = windows(&dir.join("validators/validator0"));
    assert!(
        windows.contains_key(&0) && windows.contains_key(&1),
        "windows {:?}\n{stdout}\n{log}",
        windows.keys()
    );
    // Every miner with work in a window is tracked (replayed); count the tail's replays.
    let mut tail_replays = 0;
    for (epoch, w) in &windows {
        let tracked: Vec<&str> = w["tracked"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for m in w["miners"].as_array().unwrap() {
            let flags = m["weight"]["parts"]["flags"].as_array().unwrap();
            assert!(flags.is_empty(), "epoch {epoch}: honest miner flagged: {m}");
            if !tracked.contains(&m["hotkey"].as_str().unwrap()) {
                continue;
            }
            tail_replays += usize::from(m["section"].as_u64() == Some(1));
            let replayed = notes(m)
                .find(|n| n.starts_with("replay:"))
                .unwrap_or_else(|| panic!("epoch {epoch}: no replay note: {m}"));
            // Every item replayed, none skipped for want of an input.
            assert!(
                replayed.contains("(0 skipped,"),
                "epoch {epoch}: {replayed}"
            );
        }
    }
    assert!(tail_replays > 0, "no tail miner was replayed: {windows:?}");
}

/// Merges in `q4v2` (4-bit parameter changes with error feedback, 2-bit second moments), in
/// `q4v2m4` (every first moment in 4 bits too) and in `q4v2m2:128` (every first moment in 2
/// bits, chunks of 128), with a validator replaying every miner: each
/// replayed miner's decoded upload agrees with the replay of its work (the state check
/// passes), and no honest miner is flagged. A miner adopts the merged state from the
/// partitions it merged itself where its copies were accepted, reading only the rest of the
/// checkpoint's delta.
#[test]
fn q4v2_merges_are_checked_by_a_validator_and_flag_no_honest_miner() {
    for wire in ["q4v2", "q4v2m4", "q4v2m2:128:4:8"] {
        compact_merges_are_checked(wire);
    }
}

fn compact_merges_are_checked(wire: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (stdout, log) = replayed_by_one_validator(dir.path(), &["--merge-wire", wire]);
    let run = std::fs::read_to_string(dir.path().join("run.yaml")).unwrap();
    assert!(run.contains(&format!("wire: {wire}\n")), "{run}");
    let windows = windows(&dir.path().join("validators/validator0"));
    let mut compared = Vec::new();
    for epoch in [0, 1] {
        let w = windows
            .get(&epoch)
            .unwrap_or_else(|| panic!("no window for epoch {epoch}:\n{stdout}\n{log}"));
        for m in w["miners"].as_array().unwrap() {
            let flags = m["weight"]["parts"]["flags"].as_array().unwrap();
            assert!(flags.is_empty(), "epoch {epoch}: honest miner flagged: {m}");
            compared.extend(
                notes(m)
                    .filter(|n| n.contains("upload vs replay"))
                    .map(str::to_string),
            );
        }
    }
    // The state check ran on decoded uploads (it needs a full replay and an upload).
    assert!(
        !compared.is_empty(),
        "{wire}: no upload was compared: {windows:?}"
    );
    // With 3 miners per section, each merges two of the three partitions (two copies of
    // each): reading the checkpoint's delta whole would read 1.5x the bytes it wrote in merged
    // partitions; taking its own accepted copies reads the third it did not merge, 0.5x.
    // Counted by the miners' storage clients.
    let (mut merged_up, mut checkpoint_down) = (0u64, 0u64);
    for stats in std::fs::read_dir(dir.path().join("stats")).unwrap() {
        let text = std::fs::read_to_string(stats.unwrap().path()).unwrap();
        let report: Value = serde_json::from_str(&text).unwrap();
        for t in report["traffic"].as_array().unwrap() {
            let bytes = t["bytes"].as_u64().unwrap();
            match (t["kind"].as_str().unwrap(), t["dir"].as_str().unwrap()) {
                ("merged_partitions", "up") => merged_up += bytes,
                ("checkpoints", "down") => checkpoint_down += bytes,
                _ => {}
            }
        }
    }
    assert!(merged_up > 0, "{wire}: no merged partition written");
    assert!(
        checkpoint_down * 4 < merged_up * 3,
        "{wire}: {checkpoint_down} checkpoint bytes read to adopt, {merged_up} merged bytes \
         written"
    );
    println!(
        "{wire}: {checkpoint_down} checkpoint bytes read, {merged_up} merged bytes written\n{}",
        compared.join("\n")
    );
}
