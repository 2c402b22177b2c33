//! install.sh end to end: scripts/release.sh packages the `iota` built from this checkout,
//! a local HTTP server publishes it, and `curl -sSf URL/install.sh | sh` installs it into a
//! prefix; a tampered archive is refused and installs nothing; a platform without a release
//! falls back to a source build and says what is missing. The scripts are shellcheck-clean.
//!
//! shellcheck and curl must be installed (scripts/test.sh installs both).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::routing::get;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_iota");

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Serves the files under `root` on a free loopback port.
fn serve(root: PathBuf) -> String {
    async fn file(
        State(root): State<PathBuf>,
        UrlPath(path): UrlPath<String>,
    ) -> Result<Vec<u8>, StatusCode> {
        if path.split('/').any(|part| part == "..") {
            return Err(StatusCode::BAD_REQUEST);
        }
        std::fs::read(root.join(path)).map_err(|_| StatusCode::NOT_FOUND)
    }
    let app = Router::new().route("/{*path}", get(file)).with_state(root);
    format!("http://{}", common::net::serve_in_thread(app))
}

/// `sh -c LINE` with a fresh HOME and a PATH without cargo.
fn sh(home: &Path, line: &str) -> (bool, String) {
    let Output { status, stderr, .. } = Command::new("sh")
        .arg("-c")
        .arg(line)
        .env_clear()
        .env("HOME", home)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .output()
        .unwrap();
    (
        status.success(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

#[test]
fn scripts_are_shellcheck_clean() {
    let out = Command::new("shellcheck")
        .arg(repo().join("install.sh"))
        .arg(repo().join("scripts/release.sh"))
        .arg(repo().join("scripts/three-commands.sh"))
        .output()
        .unwrap_or_else(|e| {
            panic!("shellcheck is not installed ({e}); scripts/test.sh installs it (apt-get install shellcheck)")
        });
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn installs_a_verified_release_and_refuses_a_tampered_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dist = tmp.path().join("dist");
    let base = serve(dist.clone());
    let status = Command::new("sh")
        .arg(repo().join("scripts/release.sh"))
        .args(["--base", &base, "--binary", BIN, "--out"])
        .arg(&dist)
        .status()
        .unwrap();
    assert!(status.success());
    let archive = std::fs::read_dir(dist.join("latest"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".tar.gz"))
        .expect("a release archive");

    // The one-liner, with a prefix.
    let one_liner = |prefix: &Path| {
        sh(
            tmp.path(),
            &format!(
                "curl -sSf {base}/install.sh | sh -s -- --prefix {}",
                prefix.display()
            ),
        )
    };
    let prefix = tmp.path().join("prefix");
    let (ok, err) = one_liner(&prefix);
    assert!(ok, "{err}");
    assert!(err.contains("checksum verified"), "{err}");
    assert!(err.contains("is not on your PATH"), "{err}");
    let installed = prefix.join("bin/iota");
    let version = Command::new(&installed).arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("iota "));

    // Without --prefix it goes to ~/.local/bin.
    let (ok, err) = sh(tmp.path(), &format!("curl -sSf {base}/install.sh | sh"));
    assert!(ok, "{err}");
    assert!(tmp.path().join(".local/bin/iota").is_file());

    // One flipped byte: refused, nothing installed.
    let mut bytes = std::fs::read(&archive).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x55;
    std::fs::write(&archive, bytes).unwrap();
    let other = tmp.path().join("other");
    let (ok, err) = one_liner(&other);
    assert!(!ok);
    assert!(
        err.contains("checksum mismatch") && err.contains("nothing was installed"),
        "{err}"
    );
    assert!(!other.join("bin/iota").exists());

    // No archive for this platform (and no cargo on PATH): the fallback says what is missing.
    std::fs::remove_file(&archive).unwrap();
    let (ok, err) = one_liner(&other);
    assert!(!ok);
    assert!(
        err.contains("no release archive for") && err.contains("cargo not found"),
        "{err}"
    );

    // The checkout's own script takes the base and version from the environment.
    let (ok, err) = sh(
        tmp.path(),
        &format!(
            "IOTA_INSTALL_BASE={base} IOTA_VERSION=v0-missing sh {} --prefix {}",
            repo().join("install.sh").display(),
            other.display()
        ),
    );
    assert!(!ok);
    assert!(err.contains(&format!("{base}/v0-missing/iota-")), "{err}");
}
