//! Running the real `iota` binary with arguments: its output, success expected, or a one-line
//! error expected.

use std::path::Path;
use std::process::{Command, Output};

/// Runs `iota args..` and returns what it printed.
pub fn iota(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iota"))
        .args(args)
        .output()
        .expect("run iota")
}

/// Runs `iota args..`, which must succeed.
pub fn ok(args: &[&str]) -> Output {
    let out = iota(args);
    assert!(
        out.status.success(),
        "iota {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `iota args..`, which must fail with one line on stderr, `iota: ...` containing
/// `needle` (so no panic and no usage text).
pub fn fails_with(args: &[&str], needle: &str) {
    one_line_failure(&iota(args), &format!("iota {args:?}"), needle);
}

/// `out` is a failure with one line on stderr, `iota: ...` containing `needle`; `what` names
/// the run in the messages. Returns that line.
pub fn one_line_failure(out: &Output, what: &str, needle: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{what} should fail");
    assert!(
        stderr.starts_with("iota: ") && stderr.trim_end().lines().count() == 1,
        "{what}: one-line error expected:\n{stderr}"
    );
    assert!(
        stderr.contains(needle),
        "{what}: expected `{needle}` in:\n{stderr}"
    );
    stderr.trim_end().to_string()
}

/// A path as an argument (the tests' temporary paths are UTF-8).
pub fn s(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// `iota local` of the `tiny` preset, 3 sections x 1 miner, 40 samples of 2 x `seq_len` tokens
/// with a merge every 20 and no validator, into `dir`, with `extra` flags; it must succeed.
pub fn tiny_local(dir: &Path, seq_len: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "local",
        "--preset",
        "tiny",
        "--sections",
        "3",
        "--miners-per-section",
        "1",
        "--samples",
        "40",
        "--seq-len",
        seq_len,
        "--batch-size",
        "2",
        "--merge-every",
        "20",
        "--validators",
        "0",
        "--poll-ms",
        "250",
        "--dir",
        s(dir),
    ];
    args.extend_from_slice(extra);
    ok(&args)
}

/// `iota generate --checkpoint CHECKPOINT extra..`, which must succeed: the text it printed
/// and the number of tokens it says it generated.
pub fn generate(checkpoint: &Path, extra: &[&str]) -> (String, usize) {
    let mut args = vec!["generate", "--checkpoint", s(checkpoint)];
    args.extend_from_slice(extra);
    let out = ok(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tokens = stderr
        .split("iota generate: ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no token count in:\n{stderr}"));
    (String::from_utf8(out.stdout).unwrap(), tokens)
}
