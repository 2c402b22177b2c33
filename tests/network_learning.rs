//! The network learns as well as one process: `iota bench learning` (real processes: `iota
//! train`, then `iota local` with 3 sections x 2 miners) on the tiny preset, and the network's
//! held-out loss after its last merge, evaluated through the network itself, must be within 5%
//! of `iota train`'s at equal tokens; both final models are ablated boundary by boundary. A
//! regression of the network's learning (stale backwards, a wrong schedule, a broken merge)
//! fails here. With synchronous steps and one miner per section the network must follow `iota
//! train` at every evaluation.

use std::process::Command;

/// Runs `iota bench learning` with `args` (plus a fresh `--dir` and `--summary-out`) and
/// returns its summary and printed table.
fn bench_learning(args: &[&str]) -> (serde_json::Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let summary = dir.path().join("summary.json");
    let output = Command::new(env!("CARGO_BIN_EXE_iota"))
        .args(["bench", "learning", "--preset", "tiny", "--seq-len", "32"])
        .args(args)
        .arg("--dir")
        .arg(dir.path().join("runs"))
        .arg("--summary-out")
        .arg(&summary)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "iota bench learning failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let s = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    (s, stdout)
}

/// (samples, eval loss) at every evaluation of `run` (`train` or `network`).
fn evals(s: &serde_json::Value, run: &str) -> Vec<(u64, f64)> {
    s[run]["evals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["samples"].as_u64().unwrap(),
                e["eval_loss"].as_f64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_local_network_learns_within_five_percent_of_one_process() {
    let (s, stdout) = bench_learning(&[
        "--samples",
        "200",
        "--batch-size",
        "2",
        "--merge-every",
        "50",
        "--miners-per-section",
        "2",
    ]);

    // The network evaluated its model at the start and after every merge (4 merges of 50),
    // through the network, on the same held-out windows iota train evaluates on: the untrained
    // models agree exactly (same seed, same weights, same windows).
    let points = evals(&s, "network");
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

    // Both final models are ablated boundary by boundary; the network's (its last merged
    // model, loaded by `iota eval`) starts from the loss the network itself evaluated.
    for (run, final_loss) in [("train", train), ("network", network)] {
        let a = &s[run]["ablation"];
        let baseline = a["baseline"].as_f64().unwrap();
        assert!(
            (baseline - final_loss).abs() < 1e-3,
            "{run}: ablation baseline {baseline} vs final {final_loss}\n{stdout}"
        );
        let boundaries = a["boundaries"].as_array().unwrap();
        assert_eq!(boundaries.len(), 2, "{run}: {a}");
        for b in boundaries {
            let zeroed = b["zeroed"].as_f64().unwrap();
            assert!(zeroed.is_finite() && zeroed != baseline, "{run}: {b}");
        }
    }
    assert!(
        stdout.contains("ablation of network's final model")
            && stdout.contains("after section 1: zeros"),
        "{stdout}"
    );
}

/// With synchronous steps (`--samples-per-step 2`: each `iota train` batch of 2 windows becomes
/// two one-window network samples that make one optimizer step) and one miner per section, the
/// network computes `iota train`'s steps: its held-out loss follows `iota train`'s at every
/// evaluation, through the merges, up to float rounding (the batch is split differently).
/// With `--eval-every 75` and merges every 25 the network evaluates every third epoch (run
/// config `eval_every: 3`) and its final model, where `iota train` evaluates too.
#[test]
fn synchronous_steps_follow_one_process_at_every_evaluation() {
    let (s, stdout) = bench_learning(&[
        "--samples",
        "100",
        "--batch-size",
        "2",
        "--merge-every",
        "25",
        "--eval-every",
        "75",
        "--samples-per-step",
        "2",
    ]);
    assert_eq!(s["network"]["completed"].as_u64(), Some(200), "{stdout}");
    let (train, network) = (evals(&s, "train"), evals(&s, "network"));
    let at: Vec<u64> = network.iter().map(|p| p.0).collect();
    assert_eq!(at, [0, 75, 100], "{stdout}");
    let train_at: Vec<u64> = train.iter().map(|p| p.0).collect();
    assert_eq!(train_at, at, "{stdout}");
    assert!(
        network[2].1 < network[0].1 - 1.0,
        "it barely learned\n{stdout}"
    );
    for ((samples, t), (_, n)) in train.iter().zip(&network) {
        assert!(
            (n - t).abs() <= 0.02 * t,
            "after {samples} steps the network's held-out loss {n:.4} is more than 2% from \
             iota train's {t:.4}\n{stdout}"
        );
    }
}

/// Runs `iota bench learning --preset tiny` with `args` and a fresh `--dir`, checks that it is
/// refused in one line before writing anything, and returns that line.
fn refused_before_running(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_iota"))
        .args(["bench", "learning", "--preset", "tiny"])
        .args(args)
        .arg("--dir")
        .arg(dir.path().join("runs"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{args:?} was accepted");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(!dir.path().join("runs").exists(), "nothing is written");
    stderr
}

/// A variant whose early phase would not end with an epoch is refused in one line, before any
/// run starts.
#[test]
fn early_phases_that_do_not_end_an_epoch_are_refused() {
    for (flag, why) in [
        ("--single-lane", "the lane ends with a merge"),
        ("--early-in-flight", "the cap ends with an epoch"),
    ] {
        let stderr = refused_before_running(&["--merge-every", "100", flag, "50"]);
        assert!(
            stderr.contains(&format!(
                "{flag} 50 must be a multiple of --merge-every 100 ({why})"
            )),
            "{stderr}"
        );
    }
}

/// Splitting an `iota train` batch into network samples that do not divide it is refused in one
/// line, before any run starts.
#[test]
fn a_split_that_does_not_divide_the_batch_is_refused() {
    let stderr = refused_before_running(&["--batch-size", "4", "--split-samples", "3"]);
    assert!(
        stderr.contains("--split-samples 3 must divide --batch-size 4"),
        "{stderr}"
    );
}
