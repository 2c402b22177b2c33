//! End to end: `iota local` (tiny preset, 3 sections x 2 miner processes) through three full
//! training/merging cycles. Every merge produces a checkpoint per section that every miner of
//! the section adopts bit-identically, and the loss keeps falling from epoch to epoch.

use std::collections::HashMap;
use std::process::Command;

#[test]
fn three_merge_cycles_in_a_local_network() {
    let dir = tempfile::tempdir().unwrap();
    let per_epoch = 16;
    let output = Command::new(env!("CARGO_BIN_EXE_iota"))
        .args([
            "local",
            "--preset",
            "tiny",
            "--sections",
            "3",
            "--miners-per-section",
            "2",
            "--seq-len",
            "32",
            "--batch-size",
            "2",
            "--lr",
            "0.01",
            "--poll-ms",
            "250",
            "--merge-every",
            &per_epoch.to_string(),
            // Three epochs of 16, the samples cancelled at each switch, and a few more.
            "--samples",
            "64",
        ])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "iota local failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let db = rusqlite::Connection::open(dir.path().join("state/state.sqlite")).unwrap();
    let epoch: i64 = db
        .query_row("SELECT epoch FROM run_state", [], |r| r.get(0))
        .unwrap();
    assert!(epoch >= 3, "only {epoch} merges completed:\n{stdout}");

    // One checkpoint per section per merge, and no merger was flagged.
    let checkpoints: HashMap<(i64, i64), String> = db
        .prepare("SELECT section, epoch, hash FROM checkpoints")
        .unwrap()
        .query_map([], |r| Ok(((r.get(0)?, r.get(1)?), r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for section in 0..3 {
        for e in 1..=3 {
            assert!(
                checkpoints.contains_key(&(section, e)),
                "no checkpoint for section {section} epoch {e}: {checkpoints:?}"
            );
        }
    }
    let flags: i64 = db
        .query_row("SELECT COUNT(*) FROM merge_flags", [], |r| r.get(0))
        .unwrap();
    assert_eq!(flags, 0, "honest mergers were flagged");

    // Each miner reports the hash of the state it holds after adopting a merge, computed from
    // its model: it must be the checkpoint's hash (so both miners of a section are identical).
    let miners: Vec<(i64, i64, Option<String>)> = db
        .prepare("SELECT section, weights_epoch, weights_hash FROM miners")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(miners.len(), 6);
    for (section, held, hash) in &miners {
        assert!(*held >= 2, "a miner of section {section} holds epoch {held}");
        assert_eq!(
            hash.as_ref(),
            checkpoints.get(&(*section, *held)),
            "section {section}: a miner's weights differ from the checkpoint of epoch {held}"
        );
    }

    // The loss keeps falling across merges: each epoch's mean loss is below the previous one.
    let means: Vec<(i64, f64, i64)> = db
        .prepare(
            "SELECT epoch, AVG(loss), COUNT(*) FROM samples WHERE outcome = 'completed' \
             GROUP BY epoch ORDER BY epoch",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(means.len() >= 4, "{means:?}");
    for w in means[..4].windows(2) {
        assert!(
            w[1].1 < w[0].1,
            "loss did not fall from epoch {} to {}: {means:?}",
            w[0].0,
            w[1].0
        );
    }
    for (e, _, n) in &means[..3] {
        assert_eq!(*n, per_epoch, "epoch {e} completed {n} samples");
    }
    assert!(stdout.contains("epoch  samples"), "{stdout}");
}
