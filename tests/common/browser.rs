//! Headless chromium (Debian's `chromium`) for the tests that load the dashboard in a real
//! browser. Where none is installed the test is skipped with a message, except under
//! `IOTA_REQUIRE_BROWSER=1` (set by scripts/test.sh once it has installed chromium), where it
//! fails instead.

use std::process::Command;

/// The browser to drive, or `None` (after printing why) when `test` must be skipped.
///
/// # Panics
/// When no browser runs and `IOTA_REQUIRE_BROWSER` is set.
pub fn chromium_or_skip(test: &str) -> Option<&'static str> {
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|name| {
            Command::new(name)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        });
    if found.is_none() {
        assert!(
            std::env::var_os("IOTA_REQUIRE_BROWSER").is_none(),
            "IOTA_REQUIRE_BROWSER is set but no chromium runs (apt-get install chromium)"
        );
        eprintln!(
            "SKIPPED {test}: no chromium installed (scripts/test.sh installs it: apt-get install chromium)"
        );
    }
    found
}

/// Runs the browser on `url` with `extra` arguments; returns (stdout, stderr).
pub fn browse(browser: &str, url: &str, extra: &[&str]) -> (String, String) {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
        ])
        .args([
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=6000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
