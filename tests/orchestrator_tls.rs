//! HTTPS end to end, with a certificate authority the test makes (rcgen): a real
//! `iota orchestrate` serving TLS from the run config's `tls` block, a miner per section and a
//! validator training and publishing weights over it; a client holding the wrong CA, and one
//! facing an expired certificate, refused at once with one line saying what to do; bad
//! certificate files and plain HTTP on a public address refused at start before any state is
//! written; and the dashboard loading over HTTPS in headless chromium (skipped only where no
//! chromium is installed, failing instead under `IOTA_REQUIRE_BROWSER=1`, as in
//! dashboard_browser.rs).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use common::browser::{browse, chromium_or_skip};
use common::net::free_port;
use common::procs::{Kids, create_hotkey, iota_bin, spawn, spawn_miner};
use common::tls::{ca, leaf};
use rcgen::PublicKeyData;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The test's certificates, as PEM files in one directory.
struct Pki {
    /// The run's CA certificate (what miners are given).
    ca: PathBuf,
    /// Another CA, which signed nothing here.
    other_ca: PathBuf,
    /// A certificate for 127.0.0.1 and localhost signed by `ca`, and its key.
    server: (PathBuf, PathBuf),
    /// The same names, signed by `ca`, expired in 2021.
    expired: (PathBuf, PathBuf),
    /// base64(sha256(SPKI)) of the server key, for chromium.
    spki: String,
}

fn make_pki(dir: &Path) -> Pki {
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let (ca_cert, issuer) = ca("iota test CA");
    let (other_cert, _) = ca("some other CA");
    let (server, server_key) = leaf(&issuer, false);
    let (expired, expired_key) = leaf(&issuer, true);
    let spki = base64::engine::general_purpose::STANDARD
        .encode(Sha256::digest(server_key.subject_public_key_info()));
    Pki {
        ca: write("ca.pem", ca_cert.pem()),
        other_ca: write("other-ca.pem", other_cert.pem()),
        server: (
            write("server.pem", server.pem()),
            write("server.key", server_key.serialize_pem()),
        ),
        expired: (
            write("expired.pem", expired.pem()),
            write("expired.key", expired_key.serialize_pem()),
        ),
        spki,
    }
}

/// A run config of two one-block sections of the `tiny` preset, merging every 6 samples, on a
/// free loopback port, with `extra` YAML; returns its path and port.
fn write_run(dir: &Path, extra: &str) -> (PathBuf, u16) {
    let port = free_port();
    let path = dir.join("run.yaml");
    std::fs::write(
        &path,
        format!(
            "run: tls-run\nmodel: {{ preset: tiny, sections: [[0, 3], [3, 6]] }}\n\
             data: {{ source: synthetic }}\nlisten: 127.0.0.1:{port}\ndata_dir: {}\n\
             batch_size: 2\nseq_len: 32\nheartbeat_s: 1\neval_samples: 0\n\
             deadlines: {{ forward_s: 5, backward_s: 10 }}\nbatches_before_merging: 6\n\
             merge: {{ upload_s: 20, merge_s: 30, lease_grace_s: 5 }}\n{extra}",
            dir.join("state").display()
        ),
    )
    .unwrap();
    (path, port)
}

fn tls_block((cert, key): &(PathBuf, PathBuf)) -> String {
    format!(
        "tls: {{ cert: {}, key: {} }}\n",
        cert.display(),
        key.display()
    )
}

/// `iota ARGS` run to its end (killed after `limit`).
fn iota(args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(iota_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// A JSON GET over HTTPS trusting only `ca` (None when it fails).
struct Https {
    runtime: tokio::runtime::Runtime,
    client: reqwest::Client,
}

impl Https {
    fn new(ca: &Path) -> Self {
        let pem = std::fs::read(ca).unwrap();
        let certs = reqwest::Certificate::from_pem_bundle(&pem).unwrap();
        let client = reqwest::Client::builder()
            .tls_certs_only(certs)
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        Self { runtime, client }
    }

    fn json(&self, url: &str) -> Option<Value> {
        self.runtime.block_on(async {
            let r = self.client.get(url).send().await.ok()?;
            if !r.status().is_success() {
                return None;
            }
            serde_json::from_slice(&r.bytes().await.ok()?).ok()
        })
    }
}

fn wait_until(
    what: &str,
    limit: Duration,
    logs: &dyn Fn() -> String,
    mut ok: impl FnMut() -> bool,
) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < limit,
            "timed out waiting for {what}\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn read_logs(dir: &Path, names: &[&str]) -> String {
    names
        .iter()
        .map(|n| {
            let text = std::fs::read_to_string(dir.join(n)).unwrap_or_default();
            format!("== {n}\n{text}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The last line of a failed command's stderr, asserting it failed with exactly one line.
fn one_line_failure(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected a failure:\n{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("iota: ")).collect();
    assert_eq!(lines.len(), 1, "one error line expected:\n{stderr}");
    lines[0].to_string()
}

fn start_validator(dir: &Path, url: &str, ca: &Path) -> Child {
    let log = std::fs::File::create(dir.join("validator.log")).unwrap();
    Command::new(iota_bin())
        .args(["validate", "--wallet", "w", "--hotkey", "validator"])
        .arg("--wallets-dir")
        .arg(dir.join("wallets"))
        .args(["--orchestrator", url, "--threads", "1", "--poll-ms", "250"])
        .arg("--state-dir")
        .arg(dir.join("validator"))
        .arg("--quiet")
        .arg("--ca-file")
        .arg(ca)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap()
}

#[test]
fn a_miner_and_a_validator_work_over_https_and_wrong_trust_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let pki = make_pki(dir);
    let validator = create_hotkey(dir, "validator");
    let (config, port) = write_run(
        dir,
        &format!(
            "{}validators: [{{ hotkey: {validator} }}]\n",
            tls_block(&pki.server)
        ),
    );
    let url = format!("https://127.0.0.1:{port}");
    let mut kids = Kids(vec![spawn(
        &["orchestrate", "--config", config.to_str().unwrap()],
        &dir.join("orchestrator.log"),
    )]);
    let https = Https::new(&pki.ca);
    let logs = || {
        read_logs(
            dir,
            &["orchestrator.log", "m0.log", "m1.log", "validator.log"],
        )
    };
    wait_until(
        "the orchestrator over HTTPS",
        Duration::from_secs(30),
        &logs,
        || https.json(&format!("{url}/api/status")).is_some(),
    );
    // Plain HTTP on the TLS port gets no answer a client could mistake for the API.
    assert!(common::net::status(&format!("http://127.0.0.1:{port}")).is_none());

    // The wrong CA: `iota status` and a miner stop at once, with one line saying what to do.
    let ca_flag = pki.other_ca.to_str().unwrap();
    let out = iota(
        &["status", "--orchestrator", &url, "--ca-file", ca_flag],
        Duration::from_secs(30),
    );
    let line = one_line_failure(&out);
    assert!(
        line.contains("is not trusted: it is signed by an authority this machine does not trust")
            && line.contains("What to do:")
            && line.contains("--ca-file"),
        "{line}"
    );
    // No CA at all (the system's roots only) is refused the same way.
    let out = iota(&["status", "--orchestrator", &url], Duration::from_secs(30));
    assert!(one_line_failure(&out).contains("is not trusted"));
    create_hotkey(dir, "stranger");
    let started = Instant::now();
    let mut stranger = spawn_miner(dir, &url, "stranger", &["--ca-file", ca_flag]);
    let status = loop {
        if let Some(status) = stranger.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "a miner with the wrong CA kept trying\n{}",
            read_logs(dir, &["stranger.log"])
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!status.success());
    let log = read_logs(dir, &["stranger.log"]);
    assert!(
        log.contains("is not trusted") && log.contains("--ca-file"),
        "{log}"
    );

    // The right CA: a miner per section and a validator train, merge and publish over HTTPS.
    let ca_flag = pki.ca.to_str().unwrap();
    let mut miners = Vec::new();
    for name in ["m0", "m1"] {
        miners.push(create_hotkey(dir, name));
        kids.0
            .push(spawn_miner(dir, &url, name, &["--ca-file", ca_flag]));
    }
    kids.0.push(start_validator(dir, &url, &pki.ca));
    wait_until(
        "a merged epoch and the validator's weights",
        Duration::from_secs(300),
        &logs,
        || {
            https
                .json(&format!("{url}/api/weights"))
                .and_then(|w| w["validators"].as_array().map(|v| !v.is_empty()))
                .unwrap_or(false)
        },
    );
    // The validator's vector weighs both miners, whose work it fetched over HTTPS.
    let weights = https.json(&format!("{url}/api/weights")).unwrap();
    let published = &weights["validators"][0];
    assert_eq!(published["hotkey"], validator.as_str(), "{weights}");
    let weighed: Vec<&str> = published["weights"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w["hotkey"].as_str())
        .collect();
    for m in &miners {
        assert!(weighed.contains(&m.as_str()), "{m} not weighed: {weights}");
    }
    eprintln!("published over HTTPS: {published}");
    let status = https.json(&format!("{url}/api/status")).unwrap();
    assert!(common::net::completed(&status) >= 6, "{status}\n{}", logs());
    let out = iota(
        &[
            "status",
            "--orchestrator",
            &url,
            "--ca-file",
            ca_flag,
            "--json",
        ],
        Duration::from_secs(30),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(kids);

    // An expired certificate, even from the right CA, is refused with its own advice.
    let expired_dir = dir.join("expired");
    std::fs::create_dir(&expired_dir).unwrap();
    let (config, port) = write_run(&expired_dir, &tls_block(&pki.expired));
    let url = format!("https://127.0.0.1:{port}");
    let _orchestrator = Kids(vec![spawn(
        &["orchestrate", "--config", config.to_str().unwrap()],
        &expired_dir.join("orchestrator.log"),
    )]);
    let answered = Instant::now();
    let line = loop {
        let out = iota(
            &["status", "--orchestrator", &url, "--ca-file", ca_flag],
            Duration::from_secs(30),
        );
        let line = one_line_failure(&out);
        if line.contains("is not trusted") || answered.elapsed() > Duration::from_secs(30) {
            break line;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(
        line.contains("is not trusted: it has expired") && line.contains("renew"),
        "{line}\n{}",
        read_logs(&expired_dir, &["orchestrator.log"])
    );
}

#[test]
fn bad_certificate_files_and_public_plain_http_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let pki = make_pki(dir);
    let garbage = dir.join("garbage.pem");
    std::fs::write(&garbage, "not PEM at all\n").unwrap();
    let cases: Vec<(String, &str)> = vec![
        // The expired pair's key with the valid certificate.
        (
            tls_block(&(pki.server.0.clone(), pki.expired.1.clone())),
            "does not belong to the certificate",
        ),
        (
            tls_block(&(dir.join("missing.pem"), pki.server.1.clone())),
            "cannot read the TLS certificate",
        ),
        (
            tls_block(&(garbage.clone(), pki.server.1.clone())),
            "holds no usable PEM certificate",
        ),
        (
            tls_block(&(pki.server.0.clone(), garbage.clone())),
            "holds no usable PEM private key",
        ),
    ];
    for (i, (block, expected)) in cases.iter().enumerate() {
        let case = dir.join(format!("case{i}"));
        std::fs::create_dir(&case).unwrap();
        let (config, _) = write_run(&case, block);
        let out = iota(
            &["orchestrate", "--config", config.to_str().unwrap()],
            Duration::from_secs(30),
        );
        let line = one_line_failure(&out);
        assert!(
            line.contains(expected) && line.contains("What to do:"),
            "{expected}: {line}"
        );
        assert!(
            !case.join("state").exists(),
            "state was created before the certificate loaded"
        );
    }
    let case = dir.join("public");
    std::fs::create_dir(&case).unwrap();
    let (config, port) = write_run(&case, "");
    let out = iota(
        &[
            "orchestrate",
            "--config",
            config.to_str().unwrap(),
            "--listen",
            &format!("0.0.0.0:{port}"),
        ],
        Duration::from_secs(30),
    );
    let line = one_line_failure(&out);
    assert!(
        line.contains("`listen` is 0.0.0.0") && line.contains("insecure_http: true"),
        "{line}"
    );
    assert!(!case.join("state").exists());
    // A CA file that is not one is refused by the client before it connects.
    let out = iota(
        &[
            "status",
            "--orchestrator",
            "https://127.0.0.1:9",
            "--ca-file",
            garbage.to_str().unwrap(),
        ],
        Duration::from_secs(30),
    );
    assert!(one_line_failure(&out).contains("holds no usable PEM certificate"));
}

#[test]
fn the_dashboard_loads_over_https_in_chromium() {
    let Some(browser) = chromium_or_skip("the_dashboard_loads_over_https_in_chromium") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let pki = make_pki(dir);
    let (config, port) = write_run(dir, &tls_block(&pki.server));
    let url = format!("https://127.0.0.1:{port}");
    let _orchestrator = Kids(vec![spawn(
        &["orchestrate", "--config", config.to_str().unwrap()],
        &dir.join("orchestrator.log"),
    )]);
    let https = Https::new(&pki.ca);
    let logs = || read_logs(dir, &["orchestrator.log"]);
    wait_until(
        "the orchestrator over HTTPS",
        Duration::from_secs(30),
        &logs,
        || https.json(&format!("{url}/api/status")).is_some(),
    );
    let page = format!("{url}/");
    // Trusting the server's key (chromium's test switch for a private certificate).
    let trust = format!("--ignore-certificate-errors-spki-list={}", pki.spki);
    let (dom, console) = browse(browser, &page, &[&trust, "--dump-dom"]);
    assert!(
        dom.contains("data-ready=\"1\""),
        "the page never drew over HTTPS:\n{dom}\n{console}\n{}",
        logs()
    );
    assert!(
        dom.contains("<pre id=\"errors\"></pre>"),
        "script errors:\n{dom}"
    );
    for bad in ["Uncaught", "refresh failed", ":ERROR:CONSOLE"] {
        assert!(!console.contains(bad), "console: {console}");
    }
    // Without that trust the browser shows no dashboard.
    let (dom, _) = browse(browser, &page, &["--dump-dom"]);
    assert!(!dom.contains("data-ready=\"1\""), "{dom}");
}
