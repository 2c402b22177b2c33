//! `iota train` end to end through the real binary: it learns, resumes exactly, and refuses
//! bad input with a one-line error and a non-zero exit.

use std::path::Path;

mod common;

use common::cli::{fails_with, ok, s};

fn losses(path: &Path) -> Vec<(u64, f32)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            for key in ["step", "loss", "lr", "tokens", "tokens_per_s"] {
                assert!(v.get(key).is_some(), "metrics line without `{key}`: {l}");
            }
            (
                v["step"].as_u64().unwrap(),
                v["loss"].as_f64().unwrap() as f32,
            )
        })
        .collect()
}

#[test]
fn tiny_model_learns_the_synthetic_corpus() {
    let dir = tempfile::tempdir().unwrap();
    let summary = dir.path().join("summary.json");
    let metrics = dir.path().join("m.jsonl");
    ok(&[
        "train",
        "--preset",
        "tiny",
        "--steps",
        "150",
        "--batch-size",
        "8",
        "--seq-len",
        "32",
        "--lr",
        "0.005",
        "--eval-every",
        "0",
        "--quiet",
        "--out",
        s(&dir.path().join("ckpt")),
        "--metrics-out",
        s(&metrics),
        "--summary-out",
        s(&summary),
    ]);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    let before = v["initial_eval_loss"].as_f64().unwrap();
    let after = v["eval_loss"].as_f64().unwrap();
    let floor = v["entropy_floor"].as_f64().unwrap();
    assert!(
        after <= 0.7 * before,
        "eval loss {before} -> {after}: less than a 30% drop"
    );
    assert!(
        after > floor,
        "eval loss {after} below the entropy floor {floor}"
    );
    assert_eq!(losses(&metrics).len(), 150);
    assert!(dir.path().join("ckpt/model.safetensors").is_file());
    // The ablation at the end: one entry per boundary, each loss finite and its own.
    let a = &v["ablation"];
    assert!(
        (a["baseline"].as_f64().unwrap() - after).abs() < 1e-4,
        "{a}"
    );
    let boundaries = a["boundaries"].as_array().unwrap();
    assert_eq!(boundaries.len(), 2, "tiny has 3 sections: {a}");
    for b in boundaries {
        for k in ["zeroed", "mean"] {
            let v = b[k].as_f64().unwrap();
            assert!(v.is_finite() && (v - after).abs() > 1e-4, "{k}: {b}");
        }
    }
}

#[test]
fn resume_continues_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let common = [
        "train",
        "--preset",
        "tiny",
        "--batch-size",
        "4",
        "--seq-len",
        "16",
        "--lr-decay-steps",
        "20",
        "--eval-every",
        "0",
        "--quiet",
    ];
    let run = |extra: &[&str]| {
        let mut args: Vec<&str> = common.to_vec();
        args.extend_from_slice(extra);
        ok(&args);
    };
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let (ma, mb1, mb2) = (
        dir.path().join("a.jsonl"),
        dir.path().join("b1.jsonl"),
        dir.path().join("b2.jsonl"),
    );
    run(&["--steps", "20", "--out", s(&a), "--metrics-out", s(&ma)]);
    run(&["--steps", "10", "--out", s(&b), "--metrics-out", s(&mb1)]);
    run(&[
        "--steps",
        "20",
        "--out",
        s(&b),
        "--metrics-out",
        s(&mb2),
        "--resume",
    ]);
    let again = dir.path().join("again.jsonl");
    run(&[
        "--steps",
        "20",
        "--out",
        s(&dir.path().join("c")),
        "--metrics-out",
        s(&again),
    ]);
    let straight = losses(&ma);
    let mut resumed = losses(&mb1);
    resumed.extend(losses(&mb2));
    assert_eq!(straight.len(), 20);
    assert_eq!(resumed.len(), 20);
    // Two fresh runs of the same flags compute the same losses bit for bit (this failed from
    // step 3 on while burn-ndarray's approximate `recip` was in the model's graph), and a
    // resumed run continues exactly: one that lost state (moments, step count, data
    // position, schedule) differs from step 11 on.
    assert_eq!(losses(&again), straight, "two fresh runs differ");
    assert_eq!(resumed, straight, "the resumed run differs");
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let base = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "train",
            "--steps",
            "1",
            "--quiet",
            "--batch-size",
            "2",
            "--seq-len",
            "16",
            "--out",
            s(&out),
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        v.extend(extra.iter().map(|x| x.to_string()));
        v
    };
    let run_fail = |extra: &[&str], needle: &str| {
        let args = base(extra);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        fails_with(&refs, needle);
    };
    run_fail(&["--preset", "huge"], "unknown model preset `huge`");
    run_fail(
        &[
            "--preset",
            "tiny",
            "--data",
            s(&dir.path().join("missing.txt")),
        ],
        "missing.txt",
    );
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    run_fail(&["--preset", "tiny", "--data", s(&empty)], "empty.txt");
    let cfg = dir.path().join("bad.yaml");
    std::fs::write(
        &cfg,
        "model:\n  preset: tiny\n  sections: [[0, 2], [3, 6]]\n",
    )
    .unwrap();
    run_fail(&["--config", s(&cfg)], "sections");
    std::fs::write(&cfg, "train:\n  stepz: 3\n").unwrap();
    run_fail(&["--config", s(&cfg)], "stepz");
    run_fail(&["--preset", "tiny", "--resume"], "no checkpoint");
    // Simulated replicas must split the batch, average, and be evaluated after averaging.
    run_fail(
        &[
            "--preset",
            "tiny",
            "--replicas",
            "3",
            "--average-every",
            "1",
        ],
        "does not split evenly over --replicas 3",
    );
    run_fail(
        &["--preset", "tiny", "--replicas", "2"],
        "needs --average-every",
    );
    run_fail(
        &[
            "--preset",
            "tiny",
            "--replicas",
            "2",
            "--average-every",
            "3",
            "--eval-every",
            "4",
        ],
        "multiple of --average-every 3",
    );
    run_fail(
        &["--preset", "tiny", "--merge-wire", "dct"],
        "--merge-wire dct needs --replicas",
    );
    run_fail(
        &["--preset", "tiny", "--average-boundary-every", "1"],
        "--average-boundary-every needs --replicas",
    );
    std::fs::write(
        &cfg,
        "model:\n  preset: tiny\n  bottleneck: false\ntrain:\n  bottleneck_warmup: 5\n",
    )
    .unwrap();
    run_fail(&["--config", s(&cfg)], "needs a model with a bottleneck");

    // A checkpoint trained with the byte tokenizer refuses a BPE tokenizer.
    let args = base(&["--preset", "tiny"]);
    ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let tok = dir.path().join("tok.json");
    ok(&[
        "tokenizer",
        "train",
        "--data",
        "synthetic:1:20000",
        "--vocab",
        "300",
        "--out",
        s(&tok),
    ]);
    let resume = |extra: &[&str], needle: &str| {
        let mut args: Vec<&str> = vec![
            "train",
            "--quiet",
            "--out",
            s(&out),
            "--resume",
            "--steps",
            "2",
        ];
        args.extend_from_slice(extra);
        fails_with(&args, needle);
    };
    resume(&["--tokenizer", s(&tok)], "does not match the checkpoint");

    // A truncated checkpoint is reported, not loaded.
    let model = out.join("model.safetensors");
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&model, &bytes[..bytes.len() / 2]).unwrap();
    resume(&[], "corrupt");
}

#[test]
fn metrics_lines_are_written_as_the_run_goes() {
    // A long run is followed through its metrics file: each step's line is there as soon as
    // the step is done. Steps of 64 x 64 tokens take a good part of a second here, so a file
    // written through an unflushed buffer (8 KiB, about 60 lines) would first show dozens.
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("m.jsonl");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_iota"))
        .args([
            "train",
            "--preset",
            "tiny",
            "--steps",
            "1000000",
            "--batch-size",
            "64",
        ])
        .args(["--seq-len", "64", "--eval-every", "0", "--quiet", "--out"])
        .arg(dir.path().join("ckpt"))
        .arg("--metrics-out")
        .arg(&metrics)
        .env("RAYON_NUM_THREADS", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let lines = loop {
        let text = std::fs::read_to_string(&metrics).unwrap_or_default();
        if !text.is_empty() {
            break text;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("iota train ended ({status}) before writing a metrics line");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no metrics line within 300 s of a running `iota train`"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let still_running = child.try_wait().unwrap().is_none();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        still_running,
        "the run ended before its first line was read"
    );
    assert!(
        lines.ends_with('\n'),
        "a partial line was written: {lines:?}"
    );
    let lines: Vec<&str> = lines.lines().collect();
    assert!(
        lines.len() < 20,
        "the first {} lines appeared at once (buffered, not written per step)",
        lines.len()
    );
    for (i, line) in lines.iter().enumerate() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["step"].as_u64(), Some(i as u64 + 1), "{line}");
    }
}

#[test]
fn sigterm_stops_at_a_step_with_an_evaluated_checkpoint_that_resumes() {
    // A time-boxed run (`timeout -s TERM`) or a Ctrl-C keeps what it learned: the run stops after
    // the step in progress, evaluates, saves and ablates, exits 0, and `--resume` continues it.
    let dir = tempfile::tempdir().unwrap();
    let (metrics, summary, ckpt) = (
        dir.path().join("m.jsonl"),
        dir.path().join("summary.json"),
        dir.path().join("ckpt"),
    );
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_iota"))
        .args(["train", "--preset", "tiny", "--steps", "1000000"])
        .args(["--batch-size", "4", "--seq-len", "32", "--eval-every", "0"])
        .args(["--quiet", "--out"])
        .arg(&ckpt)
        .arg("--metrics-out")
        .arg(&metrics)
        .arg("--summary-out")
        .arg(&summary)
        .env("RAYON_NUM_THREADS", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while std::fs::read_to_string(&metrics)
        .unwrap_or_default()
        .lines()
        .count()
        < 3
    {
        assert!(
            child.try_wait().unwrap().is_none(),
            "iota train ended early"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "no 3 steps within 300 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    let step = v["step"].as_u64().unwrap();
    assert_eq!(v["stopped_early"], true, "{v}");
    assert!((3..1_000_000).contains(&step), "{v}");
    assert!(v["eval_loss"].as_f64().unwrap().is_finite(), "{v}");
    assert!(
        v["ablation"]["boundaries"].as_array().unwrap().len() == 2,
        "{v}"
    );
    assert!(
        stdout.contains(&format!("stopped early at step {step} of 1000000")),
        "{stdout}"
    );
    // The run's header line is printed though the bar is hidden (--quiet, output not a terminal).
    assert!(
        stdout.contains("iota train: tiny (") && stdout.contains("boundary width"),
        "{stdout}"
    );
    // Every finished step has its metrics line, and the checkpoint is at the last of them.
    assert_eq!(losses(&metrics).last().map(|l| l.0), Some(step));
    ok(&[
        "train",
        "--resume",
        "--out",
        s(&ckpt),
        "--steps",
        &(step + 2).to_string(),
        "--summary-out",
        s(&summary),
        "--quiet",
    ]);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(v["steps_run"], 2, "{v}");
    assert_eq!(v["step"], step + 2, "{v}");
    assert_eq!(v["stopped_early"], false, "{v}");
}

/// Four steps of `tiny` into `dir/name` with `extra` flags; the run's summary.
fn four_tiny_steps(dir: &Path, name: &str, extra: &[&str]) -> serde_json::Value {
    let out = dir.join(name);
    let summary = dir.join(format!("{name}.json"));
    let mut args = vec![
        "train",
        "--preset",
        "tiny",
        "--steps",
        "4",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--quiet",
        "--out",
        s(&out),
        "--summary-out",
        s(&summary),
    ];
    args.extend_from_slice(extra);
    ok(&args);
    serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap()
}

#[test]
fn a_bottleneck_warmup_changes_training_and_ends_in_the_plain_model() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, extra: &[&str]| four_tiny_steps(dir.path(), name, extra);
    let plain = run("plain", &[]);
    let warmed = run("warmed", &["--bottleneck-warmup", "3"]);
    let (p, w) = (
        plain["eval_loss"].as_f64().unwrap(),
        warmed["eval_loss"].as_f64().unwrap(),
    );
    assert!(
        w.is_finite() && (p - w).abs() > 1e-6,
        "plain {p}, warmed {w}"
    );
    // The warm-up is over by the end: the checkpoint is a plain bottlenecked model, which a
    // run without the warm-up resumes.
    let out = dir.path().join("warmed");
    let resumed = dir.path().join("resumed.json");
    ok(&[
        "train",
        "--resume",
        "--steps",
        "5",
        "--out",
        s(&out),
        "--summary-out",
        s(&resumed),
        "--quiet",
    ]);
    let resumed: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&resumed).unwrap()).unwrap();
    assert_eq!(resumed["step"].as_u64(), Some(5));
    assert_eq!(resumed["steps_run"].as_u64(), Some(1));
}

#[test]
fn nesterov_steps_the_yardstick_with_nadam() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, extra: &[&str]| {
        four_tiny_steps(dir.path(), name, extra)["eval_loss"]
            .as_f64()
            .unwrap()
    };
    // The same seed and data: only the optimizer differs, so the losses do.
    let (adamw, nadam) = (run("adamw", &[]), run("nadam", &["--nesterov"]));
    assert!(
        nadam.is_finite() && (adamw - nadam).abs() > 1e-6,
        "AdamW {adamw}, NAdam {nadam}"
    );
    assert_eq!(run("adamw-again", &[]), adamw, "AdamW runs repeat exactly");
}

#[test]
fn muon_steps_the_hidden_matrices_and_a_resume_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let adamw = four_tiny_steps(dir.path(), "adamw", &[]);
    let muon = four_tiny_steps(dir.path(), "muon", &["--muon"]);
    let (a, m) = (
        adamw["eval_loss"].as_f64().unwrap(),
        muon["eval_loss"].as_f64().unwrap(),
    );
    assert!(m.is_finite() && (a - m).abs() > 1e-6, "AdamW {a}, Muon {m}");
    let meta = |name: &str| -> serde_json::Value {
        let path = dir
            .path()
            .join(name)
            .join(iota::model::checkpoint::META_FILE);
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    };
    assert_eq!(meta("muon")["optimizer"]["muon"], true);
    assert_eq!(meta("adamw")["optimizer"]["muon"], false);
    // The checkpoint says which optimizer it trained with: a resume without the flag goes on
    // with Muon.
    let out = dir.path().join("muon");
    ok(&[
        "train",
        "--resume",
        "--steps",
        "5",
        "--out",
        s(&out),
        "--quiet",
    ]);
    assert_eq!(meta("muon")["optimizer"]["muon"], true);
    assert_eq!(meta("muon")["step"], 5);
}
