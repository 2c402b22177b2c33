//! Reading what an `iota local --dir DIR` run left behind: the windows a validator kept on
//! disk and the hotkeys the miners printed.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// The windows a validator kept on disk (`DIR/validators/NAME`), by epoch.
pub fn windows(state: &Path) -> BTreeMap<u64, Value> {
    let mut found = BTreeMap::new();
    let Ok(runs) = std::fs::read_dir(state) else {
        return found;
    };
    for run in runs {
        for file in std::fs::read_dir(run.unwrap().path()).unwrap() {
            let text = std::fs::read_to_string(file.unwrap().path()).unwrap();
            let w: Value = serde_json::from_str(&text).unwrap();
            found.insert(w["epoch"].as_u64().unwrap(), w);
        }
    }
    found
}

/// The hotkey address miner `name` printed in its log (`DIR/logs/NAME.log`).
pub fn hotkey_of(dir: &Path, name: &str) -> String {
    let log = std::fs::read_to_string(dir.join(format!("logs/{name}.log"))).unwrap();
    let line = log
        .lines()
        .find(|l| l.starts_with("iota mine: hotkey "))
        .unwrap_or_else(|| panic!("{name} never printed its hotkey:\n{log}"));
    line["iota mine: hotkey ".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// The model seed hostile-network tests run with: `IOTA_TEST_SEED` (default 0), so the
/// confusion table can be measured over several seeds.
pub fn test_seed() -> String {
    std::env::var("IOTA_TEST_SEED").unwrap_or_else(|_| "0".into())
}

/// A window's weight vector: `hotkey -> weight`.
pub fn vector(window: &Value) -> BTreeMap<String, f64> {
    window["miners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["hotkey"].as_str().unwrap().to_string(),
                m["weight"]["weight"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// A miner's entry in a window: (weight, flags).
pub fn weight_and_flags(miner: &Value) -> (f64, Vec<String>) {
    let flags = miner["weight"]["parts"]["flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    (miner["weight"]["weight"].as_f64().unwrap(), flags)
}

/// A miner's notes in a window (what the validator measured of it).
pub fn notes(miner: &Value) -> impl Iterator<Item = &str> {
    miner["weight"]["parts"]["notes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// A miner's upload-quality note in a window (`upload: -` when it has none).
pub fn upload_note(miner: &Value) -> &str {
    notes(miner)
        .find(|n| n.starts_with("upload:"))
        .unwrap_or("upload: -")
}

/// Runs `iota local` in `dir` with the hostile-miner harness's network: tiny preset, 2
/// sections x 3 miner processes (`miner0..` get `adversaries` in order; none: all honest), one validator with
/// the run config's `validation` set to `validation` (JSON), 16 samples per epoch, 40 samples,
/// plus `extra` flags.
pub fn hostile_network(
    dir: &Path,
    adversaries: &[&str],
    validation: &str,
    extra: &[&str],
) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iota"))
        .args([
            "local",
            "--preset",
            "tiny",
            "--sections",
            "2",
            "--miners-per-section",
            "3",
            "--validators",
            "1",
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
            "--validation",
            validation,
        ])
        .args(if adversaries.is_empty() {
            Vec::new()
        } else {
            vec!["--adversaries".to_string(), adversaries.join(",")]
        })
        .args(extra)
        .arg("--dir")
        .arg(dir)
        .output()
        .unwrap()
}
