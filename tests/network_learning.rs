//! The network learns as well as one process: `iota bench learning` (real processes: `iota
//! train`, then `iota local` with 3 sections x 2 miners) on the tiny preset, and the network's
//! held-out loss after its last merge, evaluated through the network itself, must be within 5%
//! of `iota train`'s at equal tokens. A regression of the network's learning (stale backwards,
//! a wrong schedule, a broken merge) fails here.

use std::process::Command;

#[test]
fn a_local_network_learns_within_five_percent_of_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let summary = dir.path().join("summary.json");
    let output = Command::new(env!("CARGO_BIN_EXE_iota"))
        .args([
            "bench",
            "learning",
            "--preset",
            "tiny",
            "--samples",
            "200",
            "--batch-size",
            "2",
            "--seq-len",
            "32",
            "--merge-every",
            "50",
            "--miners-per-section",
            "2",
        ])
        .arg("--dir")
        .arg(dir.path().join("runs"))
        .arg("--summary-out")
        .arg(&summary)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "iota bench learning failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();

    // The network evaluated its model at the start and after every merge (4 merges of 50),
    // through the network, on the same held-out windows iota train evaluates on: the untrained
    // models agree exactly (same seed, same weights, same windows).
    let evals = s["network"]["evals"].as_array().unwrap();
    let points: Vec<(u64, f64)> = evals
        .iter()
        .map(|e| {
            (
                e["samples"].as_u64().unwrap(),
                e["eval_loss"].as_f64().unwrap(),
            )
        })
        .collect();
    let at: Vec<u64> = points.iter().map(|p| p.0).collect();
    assert_eq!(at, [0, 50, 100, 150, 200], "{stdout}");
    let train0 = s["train"]["evals"][0]["eval_loss"].as_f64().unwrap();
    assert!(
        (points[0].1 - train0).abs() < 1e-3 * train0,
        "the untrained models differ: network {} vs iota train {train0}\n{stdout}",
        points[0].1
    );
    assert_eq!(s["network"]["completed"].as_u64(), Some(200), "{stdout}");

    // Equal tokens: the last evaluation of each saw 200 samples.
    assert_eq!(s["final_samples"].as_u64(), Some(200), "{stdout}");
    let train = s["final_train"].as_f64().unwrap();
    let network = s["final_network"].as_f64().unwrap();
    assert!(
        network < train0 - 1.5,
        "the network barely learned: {train0} -> {network}\n{stdout}"
    );
    assert!(
        network <= train * 1.05,
        "the network's held-out loss {network:.4} is more than 5% above iota train's \
         {train:.4} at equal tokens\n{stdout}"
    );
}
