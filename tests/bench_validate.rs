//! `iota bench validate` on the default `tiny`:
//! every section's record replays bit-close at every fraction, nothing fails, and the full
//! check compares each upload with its replay.

use std::process::Command;

#[test]
fn bench_validate_replays_every_section_of_tiny() {
    let output = Command::new(env!("CARGO_BIN_EXE_iota"))
        .args(["bench", "validate", "--samples", "4", "--rounds", "1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "iota bench validate failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Rows: section, role, ..., `|` failed, min cosine, strict miss, state cosine.
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .filter(|l| l.contains(" head ") || l.contains(" body ") || l.contains(" tail "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows.len(),
        9,
        "three fractions for each of three sections:\n{stdout}"
    );
    for row in &rows {
        let n = row.len();
        assert_eq!(row[n - 4], "0", "a replay failed:\n{stdout}");
        let cosine: f64 = row[n - 3].parse().unwrap();
        assert!(cosine > 0.999, "min cosine {cosine}:\n{stdout}");
    }
    let full: Vec<&Vec<&str>> = rows.iter().filter(|r| r.contains(&"100%")).collect();
    assert_eq!(full.len(), 3, "{stdout}");
    for row in full {
        let state: f64 = row[row.len() - 1].parse().unwrap();
        assert!(state > 0.999, "upload vs replay {state}:\n{stdout}");
    }
}
