//! End to end on real S3-compatible storage: `iota local` with a run config whose storage is
//! an s3s-fs bucket started by the test. Miners hold no credentials: every activation and
//! gradient moves through presigned URLs, and the orchestrator checks uploads in the bucket.
//! Two merges run through the bucket too (state uploads, ranged reads, checkpoints), and
//! `iota eval` reads the newest checkpoint back out of it.

mod common;

use std::process::Command;

use common::{ACCESS_KEY, BUCKET, S3Server, SECRET_KEY};

#[test]
fn local_network_trains_through_an_s3_bucket() {
    let s3 = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("run.yaml");
    std::fs::write(
        &config,
        format!(
            "run: s3-e2e\n\
             model: {{preset: tiny}}\n\
             data: {{source: synthetic}}\n\
             storage: {{url: \"s3://{BUCKET}/runs\", endpoint: \"{}\", region: us-east-1, \
             access_key_id: {ACCESS_KEY}, secret_access_key: {SECRET_KEY}}}\n\
             listen: 127.0.0.1:1\n\
             data_dir: {}\n\
             batch_size: 2\n\
             seq_len: 32\n\
             max_in_flight: 4\n\
             local_steps: 1\n\
             deadlines: {{forward_s: 20, backward_s: 40}}\n\
             heartbeat_s: 1\n\
             batches_before_merging: 6\n\
             merge: {{upload_s: 30, merge_s: 30}}\n",
            s3.endpoint,
            dir.path().join("state").display()
        ),
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_iota"))
        .args([
            "local",
            "--miners-per-section",
            "1",
            "--samples",
            "14",
            "--poll-ms",
            "250",
        ])
        .arg("--config")
        .arg(&config)
        .arg("--dir")
        .arg(dir.path().join("net"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let orchestrator_log =
        std::fs::read_to_string(dir.path().join("net/logs/orchestrator.log")).unwrap_or_default();
    assert!(
        output.status.success(),
        "iota local failed:\n{stdout}\n{}\norchestrator log:\n{orchestrator_log}",
        String::from_utf8_lossy(&output.stderr)
    );

    let db = rusqlite::Connection::open(dir.path().join("state/state.sqlite")).unwrap();
    let completed: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM samples WHERE outcome = 'completed'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(completed >= 12, "only {completed} samples completed");

    // The payloads went to the bucket, not to a local directory.
    // Two merges went through the bucket (uploads, ranged reads through presigned URLs,
    // partition results, checkpoints), and every miner holds its section's checkpoint.
    let merged: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM checkpoints WHERE epoch = 2",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(merged, 3, "{stdout}\n{orchestrator_log}");
    let bucket = s3.dir.path().join("data").join(BUCKET);
    for section in 0..3 {
        let object = bucket.join(format!("runs/runs/s3-e2e/checkpoints/2/{section}/flat"));
        assert!(object.is_file(), "missing {}", object.display());
    }
    let mut stmt = db
        .prepare(
            "SELECT m.weights_hash = c.hash FROM miners m JOIN checkpoints c \
             ON c.section = m.section AND c.epoch = m.weights_epoch",
        )
        .unwrap();
    let same: Vec<bool> = stmt
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(same.len(), 3, "every miner reports the checkpoint it holds");
    assert!(same.iter().all(|s| *s), "{same:?}");
    // This epoch's activations are in the bucket; the merged epochs' were deleted.
    assert!(files_under(&bucket.join("runs/runs/s3-e2e/activations/2")) > 0);
    assert_eq!(
        files_under(&bucket.join("runs/runs/s3-e2e/activations/0")),
        0
    );

    // `iota eval` reads the newest checkpoint out of the bucket (the run config's endpoint and
    // keys) and scores it exactly as a local copy of the same objects.
    let cache = dir.path().join("cache");
    let eval = |checkpoint: &str| -> f64 {
        let out = Command::new(env!("CARGO_BIN_EXE_iota"))
            .args(["eval", "--checkpoint", checkpoint, "--config"])
            .arg(&config)
            .args(["--data", "synthetic", "--windows", "4", "--json"])
            .env("IOTA_DATA_CACHE", &cache)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "eval {checkpoint}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        report["eval"]["loss"].as_f64().unwrap()
    };
    let remote = eval(&format!("s3://{BUCKET}/runs/runs/s3-e2e/checkpoints"));
    let local = dir.path().join("checkpoints");
    common::copy_tree(&bucket.join("runs/runs/s3-e2e/checkpoints"), &local);
    assert_eq!(remote, eval(local.to_str().unwrap()));
    assert!(remote.is_finite());
    assert_eq!(
        files_under(&cache.join("checkpoints")),
        3,
        "epoch 2's three sections"
    );
}

/// Regular files below `dir` (s3s-fs keeps empty directories after deletes).
fn files_under(dir: &std::path::Path) -> usize {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.path().is_dir() {
                stack.push(entry.path());
            } else {
                n += 1;
            }
        }
    }
    n
}
