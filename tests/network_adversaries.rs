//! End to end: hostile miners among honest ones in `iota local` (tiny preset, 2 sections x 3
//! miner processes, one validator process replaying every miner). Each adversary (see
//! `iota::miner::adversary`) must be flagged within the first two epochs, get weight 0 in
//! every window it is flagged in, and rank below every honest miner; no honest miner may be
//! flagged, and every window's vector sums to 1. Each test prints its rows of the confusion
//! table (kind x flagged / ranked below the honest) and every miner's upload-quality note on
//! stderr. `IOTA_TEST_SEED=N` runs the network with model seed `N` (default 0).

mod common;

use std::collections::BTreeMap;

use common::local_run::{
    hostile_network, hotkey_of, test_seed, upload_note, weight_and_flags, windows,
};

/// Runs a network with `kinds` as `miner0..`, then checks and prints the outcome per kind.
fn adversaries_are_caught(kinds: &[&str], extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let validation = r#"{"replay": {"miners_per_epoch": 6}, "merge_checks": 64}"#;
    let seed = test_seed();
    let mut flags = vec!["--seed", seed.as_str()];
    flags.extend_from_slice(extra);
    let output = hostile_network(dir.path(), kinds, validation, &flags);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "iota local failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let w = windows(&dir.path().join("validators/validator0"));
    let validator_log =
        std::fs::read_to_string(dir.path().join("logs/validator0.log")).unwrap_or_default();
    assert!(
        w.contains_key(&0) && w.contains_key(&1),
        "windows {:?}\n{stdout}\n{validator_log}",
        w.keys()
    );
    let adversaries: BTreeMap<String, &str> = kinds
        .iter()
        .enumerate()
        .map(|(i, k)| (hotkey_of(dir.path(), &format!("miner{i}")), *k))
        .collect();
    let mut caught: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for epoch in [0, 1] {
        let miners = w[&epoch]["miners"].as_array().unwrap();
        let total: f64 = miners
            .iter()
            .map(|m| m["weight"]["weight"].as_f64().unwrap())
            .sum::<f64>()
            + w[&epoch]["burn"].as_f64().unwrap();
        assert!((total - 1.0).abs() < 1e-9, "epoch {epoch}: sums to {total}");
        let honest_min = miners
            .iter()
            .filter(|m| !adversaries.contains_key(m["hotkey"].as_str().unwrap()))
            .map(|m| m["weight"]["weight"].as_f64().unwrap())
            .fold(f64::INFINITY, f64::min);
        for m in miners {
            let hotkey = m["hotkey"].as_str().unwrap();
            let (weight, flags) = weight_and_flags(m);
            let kind = adversaries.get(hotkey).copied().unwrap_or("honest");
            let upload = upload_note(m);
            eprintln!(
                "seed {seed} epoch {epoch} {kind:<13} weight {weight:.4} flagged {} {upload}",
                !flags.is_empty()
            );
            match adversaries.get(hotkey) {
                None => {
                    assert!(
                        flags.is_empty(),
                        "epoch {epoch}: honest miner {hotkey} flagged: {flags:?}"
                    );
                    assert!(
                        weight > 0.0,
                        "epoch {epoch}: honest {hotkey} got nothing: {}",
                        m["weight"]["parts"]
                    );
                }
                Some(kind) => {
                    assert!(
                        weight < honest_min,
                        "epoch {epoch}: {kind} ({hotkey}) weight {weight} not below the honest \
                         {honest_min}:\n{}",
                        serde_json::to_string_pretty(miners).unwrap()
                    );
                    if !flags.is_empty() {
                        assert_eq!(weight, 0.0, "epoch {epoch}: flagged {kind} was paid");
                        caught
                            .entry(kind)
                            .or_default()
                            .push(format!("epoch {epoch}: {}", flags.join(" | ")));
                    }
                }
            }
        }
    }
    for kind in kinds {
        let found = caught.get(kind);
        eprintln!(
            "confusion: seed {seed} {kind:<13} flagged {:<3} ranked below honest yes  {}",
            if found.is_some() { "yes" } else { "NO" },
            found.map(|f| f.join(" || ")).unwrap_or_default()
        );
    }
    for kind in kinds {
        assert!(
            caught.contains_key(kind),
            "{kind} was never flagged in epochs 0-1:\n{}",
            serde_json::to_string_pretty(&w[&0]).unwrap()
        );
    }
}

#[test]
fn noisy_scaled_and_lazy_miners_are_flagged_and_ranked_last() {
    adversaries_are_caught(&["noisy", "scaled", "lazy"], &[]);
}

#[test]
fn stale_free_riding_and_lying_merging_miners_are_flagged_and_ranked_last() {
    adversaries_are_caught(
        &["stale", "free-rider", "lying-merger"],
        &["--deadline-s", "3"],
    );
}
