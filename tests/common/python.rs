//! A Python virtual environment with `bittensor-wallet` from PyPI (`tests/hostile/requirements.txt`),
//! the independent implementation that the hostile miners sign with and that writes the
//! coldkeys iota must read.
//!
//! Made by the first test that asks: `python3 -m venv` plus `pip install -r`, cached under the
//! target directory and keyed by the requirements. Without python3 or pip (or PyPI) the test
//! fails and says so.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The venv's python, made once per requirements file (under the target directory).
pub fn python() -> PathBuf {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| {
        let reqs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile/requirements.txt");
        let text = std::fs::read(&reqs).expect("tests/hostile/requirements.txt");
        let key = &blake3::hash(&text).to_hex()[..16];
        let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hostile-venv-{key}"));
        let python = venv.join("bin/python");
        if python.exists() {
            return python;
        }
        // Per process, so that two test binaries making it at once do not share a staging
        // directory; the first to finish moves its copy into place.
        let staging = venv.with_extension(format!("partial{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&staging)
            .status();
        assert!(
            made.as_ref().is_ok_and(|s| s.success()),
            "this test needs python3 with the venv module (Debian: apt-get install \
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
        if std::fs::rename(&staging, &venv).is_err() && python.exists() {
            // Another test binary got there first.
            let _ = std::fs::remove_dir_all(&staging);
        }
        assert!(python.exists(), "the venv is not at {}", venv.display());
        python
    })
    .clone()
}
