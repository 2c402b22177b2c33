//! End to end: a copier among honest miners in `iota local` (tiny preset, 2 sections x 3 miner
//! processes, one validator). At every merge the copier waits for another miner of its section
//! to have an accepted upload, reads it from the object store and uploads it as its own, moved
//! 2% towards its own state so the bytes and the hash differ (`iota::miner::copier`). The
//! validator must flag it as a copy within the first two epochs and rank it below every honest
//! miner that did work in each epoch it flags it; the original's uploader and every other
//! honest miner stay unflagged. `IOTA_TEST_SEED=N` runs the network with model seed `N`.

mod common;

use common::local_run::{
    hostile_network, hotkey_of, test_seed, upload_note, weight_and_flags, windows,
};

#[test]
fn a_copier_of_another_miners_upload_is_flagged_and_ranked_last() {
    let dir = tempfile::tempdir().unwrap();
    let validation = r#"{"replay": {"miners_per_epoch": 6}}"#;
    let seed = test_seed();
    let output = hostile_network(dir.path(), &["copier"], validation, &["--seed", &seed]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "iota local failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let copier = hotkey_of(dir.path(), "miner0");
    let w = windows(&dir.path().join("validators/validator0"));
    assert!(
        w.contains_key(&0) && w.contains_key(&1),
        "windows {:?}\n{stdout}",
        w.keys()
    );
    let mut caught = Vec::new();
    for epoch in [0, 1] {
        let miners = w[&epoch]["miners"].as_array().unwrap();
        let mut copier_entry = None;
        let mut honest = Vec::new();
        for m in miners {
            let hotkey = m["hotkey"].as_str().unwrap();
            let (weight, flags) = weight_and_flags(m);
            let upload = upload_note(m);
            eprintln!(
                "seed {seed} epoch {epoch} {:<13} weight {weight:.4} flagged {} {upload}",
                if hotkey == copier { "copier" } else { "honest" },
                !flags.is_empty()
            );
            if hotkey == copier {
                copier_entry = Some((weight, flags));
            } else {
                assert!(
                    flags.is_empty(),
                    "epoch {epoch}: honest miner {hotkey} flagged: {flags:?}"
                );
                // A miner that did no work in a window (routing never reached it) has
                // nothing to be ranked on; every one that worked must earn.
                if m["weight"]["parts"]["throughput"].as_f64().unwrap() > 0.0 {
                    honest.push(weight);
                }
            }
        }
        let Some((weight, flags)) = copier_entry else {
            continue;
        };
        let copy_flags: Vec<&String> = flags
            .iter()
            .filter(|f| f.starts_with("upload copies "))
            .collect();
        if copy_flags.is_empty() {
            continue;
        }
        let honest_min = honest.iter().copied().fold(f64::INFINITY, f64::min);
        assert!(
            weight == 0.0 && honest_min > 0.0,
            "epoch {epoch}: the flagged copier has weight {weight}, the honest at least {honest_min}"
        );
        caught.push(format!("epoch {epoch}: {}", flags.join(" | ")));
    }
    eprintln!(
        "confusion: seed {seed} copier        flagged {:<3} ranked below honest yes  {}",
        if caught.is_empty() { "NO" } else { "yes" },
        caught.join(" || ")
    );
    assert!(
        !caught.is_empty(),
        "the copier was never flagged as a copy in epochs 0-1:\n{}",
        serde_json::to_string_pretty(&w[&0]).unwrap()
    );
}
