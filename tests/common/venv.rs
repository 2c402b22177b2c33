//! Python virtual environments for tests that drive programs iota did not write (a hostile
//! miner, independent writers of data files): `python3 -m venv` plus `pip install -r
//! REQUIREMENTS`, made once per requirements file and cached under the target directory,
//! keyed by the file's contents. Without python3, its venv module or PyPI, the test fails and
//! says so.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The python of the venv for `requirements` (a path relative to the crate root), made on
/// first use as `{name}-venv-{hash}` under `CARGO_TARGET_TMPDIR`. `name` also labels the
/// failure messages.
///
/// Test processes that make the same venv at once each build a private staging copy; the
/// first to finish moves its copy into place and the others use that one.
pub fn python(requirements: &str, name: &str) -> PathBuf {
    let reqs = Path::new(env!("CARGO_MANIFEST_DIR")).join(requirements);
    let text = std::fs::read(&reqs).unwrap_or_else(|e| panic!("{requirements}: {e}"));
    let key = &blake3::hash(&text).to_hex()[..16];
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-venv-{key}"));
    let python = venv.join("bin/python");
    if python.exists() {
        return python;
    }
    let staging = venv.with_extension(format!("partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&staging)
        .status();
    assert!(
        made.as_ref().is_ok_and(|s| s.success()),
        "the {name} test needs python3 with the venv module (Debian: apt-get install \
         python3-venv): `python3 -m venv` gave {made:?}"
    );
    let pip = Command::new(staging.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
        .arg(&reqs)
        .output()
        .expect("running pip");
    assert!(
        pip.status.success(),
        "pip could not install {} (PyPI must be reachable):\n{}",
        reqs.display(),
        String::from_utf8_lossy(&pip.stderr)
    );
    if std::fs::rename(&staging, &venv).is_err() {
        // Another process moved its copy into place first.
        let _ = std::fs::remove_dir_all(&staging);
        assert!(
            python.exists(),
            "could not move the venv to {}",
            venv.display()
        );
    }
    python
}

/// Runs `script` (a path relative to the crate root) with the venv of `requirements`, writes
/// `request` to its stdin as JSON and returns the JSON it prints; a failing script fails the
/// test with its stderr.
pub fn run_json(
    requirements: &str,
    name: &str,
    script: &str,
    request: &serde_json::Value,
) -> serde_json::Value {
    let mut child = Command::new(python(requirements, name))
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(script))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {script}: {e}"));
    child
        .stdin
        .take()
        .expect("the script's stdin")
        .write_all(request.to_string().as_bytes())
        .expect("writing the request");
    let out = child.wait_with_output().expect("waiting for python");
    assert!(
        out.status.success(),
        "{script} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{script} printed something that is not JSON: {e}"))
}
