//! The dashboard in a real headless browser (Debian's chromium): a running `iota local`
//! network's page loads, draws, lists every miner and shows text sampled from the newest merged
//! model (the text `iota generate` writes for it), and reports no script error; a screenshot
//! is written to `$CARGO_TARGET_TMPDIR/dashboard.png`.
//!
//! Skipped, with a message, only where no chromium is installed and none could be:
//! scripts/test.sh installs it and then sets `IOTA_REQUIRE_BROWSER=1`, under which a missing
//! browser fails the test instead.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::browser::{browse, chromium_or_skip};
use common::net::{completed, free_port, http_get, status, wait_for};

const BIN: &str = env!("CARGO_BIN_EXE_iota");

#[test]
fn dashboard_shows_the_miners_of_a_local_network() {
    let Some(browser) = chromium_or_skip("dashboard_shows_the_miners_of_a_local_network") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let log = std::fs::File::create(dir.path().join("local.log")).unwrap();
    // Its own process group, so the orchestrator and miners go with it at the end.
    let mut local = Command::new(BIN)
        .process_group(0)
        .args([
            "local",
            "--samples",
            "24",
            "--keep-running",
            "--merge-every",
            "10",
        ])
        .args([
            "--seq-len",
            "32",
            "--batch-size",
            "2",
            "--miners-per-section",
            "1",
        ])
        .args(["--listen", &format!("127.0.0.1:{port}"), "--dir"])
        .arg(dir.path().join("net"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    wait_for(
        "20 completed samples and an eval loss",
        Duration::from_secs(180),
        || status(&url).is_some_and(|s| completed(&s) >= 20 && s["eval_loss"].is_number()),
    );
    let doc = status(&url).unwrap();
    let miners: Vec<String> = doc["sections"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["miners"].as_array().unwrap().clone())
        .map(|m| m["hotkey"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(miners.len(), 3);
    let page = http_get(&format!("{url}/")).expect("the page");
    assert!(page.contains("<script src=\"/dashboard.js\">") && !page.contains("https://"));
    let history = http_get(&format!("{url}/api/history")).expect("history");
    let history: serde_json::Value = serde_json::from_str(&history).unwrap();
    assert!(history["points"].as_array().unwrap().len() >= 20);
    // The first epoch's merge finished in each of the 3 sections, every partition judged.
    let merges = history["merges"].as_array().unwrap();
    let first: Vec<_> = merges.iter().filter(|m| m["epoch"] == 0).collect();
    assert_eq!(first.len(), 3, "{history}");
    for m in &first {
        let judged: u64 = ["agreed", "single", "recomputed", "fallback"]
            .iter()
            .map(|k| m[k].as_u64().unwrap())
            .sum();
        assert!(judged >= 1, "{m}");
    }

    // Samples of the newest merged model, once the run's last merge is in: the same text
    // `iota generate` writes for that checkpoint with the same settings (the default prompts,
    // 48 tokens, temperature 0.8, top-p 0.95, seed 0 for the first prompt).
    let mut samples = serde_json::Value::Null;
    wait_for(
        "samples of the run's newest merged model",
        Duration::from_secs(120),
        || {
            let Some(epoch) = status(&url).and_then(|s| s["epoch"].as_u64()) else {
                return false;
            };
            samples = http_get(&format!("{url}/api/samples"))
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_default();
            epoch >= 1 && samples["latest"]["epoch"].as_u64() == Some(epoch)
        },
    );
    let latest = &samples["latest"];
    let texts: Vec<&serde_json::Value> = latest["samples"].as_array().unwrap().iter().collect();
    assert_eq!(texts.len(), 3, "{samples}");
    assert_eq!(texts[0]["prompt"], "The ", "{samples}");
    assert!(samples["error"].is_null(), "{samples}");
    let generated = Command::new(BIN)
        .args(["generate", "--checkpoint"])
        .arg(dir.path().join("net"))
        .args([
            "--prompt",
            "The ",
            "--max-tokens",
            "48",
            "--temperature",
            "0.8",
        ])
        .args(["--top-p", "0.95", "--seed", "0"])
        .output()
        .unwrap();
    assert!(
        generated.status.success(),
        "{}",
        String::from_utf8_lossy(&generated.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&generated.stdout),
        format!("{}\n", texts[0]["text"].as_str().unwrap()),
        "the dashboard's sample is not what iota generate writes for the same checkpoint"
    );

    let (dom, console) = browse(browser, &format!("{url}/"), &["--dump-dom"]);
    assert!(
        dom.contains("data-ready=\"1\""),
        "the page never drew:\n{dom}\n{console}"
    );
    for hotkey in &miners {
        assert!(
            dom.contains(&format!("data-hotkey=\"{hotkey}\"")),
            "{hotkey} missing:\n{dom}"
        );
    }
    assert!(
        dom.contains("<pre id=\"errors\"></pre>"),
        "script errors:\n{dom}"
    );
    for series in ["loss-smoothed", "epoch-mean", "eval"] {
        assert!(
            dom.contains(&format!("data-series=\"{series}\"")),
            "no {series} curve drawn:\n{dom}"
        );
    }
    for section in 0..3 {
        assert!(
            dom.contains(&format!("data-merge=\"0/{section}\"")),
            "merge of section {section} not drawn:\n{dom}"
        );
    }
    assert!(
        dom.contains("class=\"sample mono\"")
            && dom.contains(&format!("model after epoch {}", latest["epoch"])),
        "no samples drawn:\n{dom}"
    );
    for bad in ["Uncaught", "refresh failed", ":ERROR:CONSOLE"] {
        assert!(!console.contains(bad), "console: {console}");
    }
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    let _ = std::fs::remove_file(&shot);
    browse(
        browser,
        &format!("{url}/"),
        &[
            "--window-size=1400,1500",
            &format!("--screenshot={}", shot.display()),
        ],
    );
    assert!(
        std::fs::metadata(&shot)
            .map(|m| m.len() > 10_000)
            .unwrap_or(false)
    );
    eprintln!("dashboard screenshot: {}", shot.display());
    // Stop the whole group (iota local, its orchestrator and miners).
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", local.id())])
        .status();
    let _ = local.wait();
}
