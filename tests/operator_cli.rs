//! The operator's commands as a user runs them: the real `iota` binary with a fresh HOME,
//! against a real orchestrator process on loopback (and a real S3 server for setup's storage
//! check): `iota wallet`, `iota register`, `iota setup --yes`, `iota mine` reading the setup
//! settings or a reference `.env`.

mod common;

use common::net::{free_port, http_get, serve_in_thread, status, wait_for};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_iota");

/// `iota` with HOME at `home`, run from `home`, with no IOTA_* settings inherited.
fn iota(home: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("HOME", home).current_dir(home).stdin(Stdio::null());
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().to_string();
        if key.starts_with("IOTA_") || key.starts_with("XDG_") || key == "DOTENV_PATH" {
            cmd.env_remove(key);
        }
    }
    cmd
}

fn run(cmd: &mut Command) -> (bool, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("run iota");
    (
        status.success(),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// A real `iota orchestrate` process on a free port (logging JSON lines); killed on drop.
struct Orchestrator {
    child: Child,
    addr: String,
    dir: tempfile::TempDir,
}

impl Orchestrator {
    fn start(extra: &str) -> Orchestrator {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let config = dir.path().join("run.yaml");
        std::fs::write(
            &config,
            format!(
                "run: ops\nmodel: {{preset: tiny}}\nlisten: {addr}\ndata_dir: {}\n\
                 batch_size: 2\nseq_len: 16\nheartbeat_s: 1\n{extra}",
                dir.path().join("state").display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("orchestrator.log")).unwrap();
        let child = Command::new(BIN)
            .args(["-v", "--log-format", "json", "orchestrate", "--config"])
            .arg(&config)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let orchestrator = Orchestrator { child, addr, dir };
        wait_for("the orchestrator to start", Duration::from_secs(30), || {
            http_get(&format!("{}/health", orchestrator.url())).is_some()
        });
        orchestrator
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("orchestrator.log")).unwrap_or_default()
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Hotkeys of the registered miners, from `/api/status`.
    fn miners(&self) -> Vec<String> {
        let status = status(&self.url()).expect("status");
        status["sections"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["miners"].as_array().unwrap().clone())
            .map(|m| m["hotkey"].as_str().unwrap().to_string())
            .collect()
    }

    /// Waits until `hotkey` is registered.
    fn wait_for_miner(&self, hotkey: &str, log: &dyn Fn() -> String) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.miners().iter().any(|m| m == hotkey) {
            assert!(
                Instant::now() < deadline,
                "{hotkey} never registered; its log:\n{}",
                log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Orchestrator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child process killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `iota COMMAND --quiet` with nothing else, logging to `log`.
fn spawn_quiet(home: &Path, command: &str, log: &Path) -> Killed {
    let file = std::fs::File::create(log).unwrap();
    Killed(
        iota(home)
            .args([command, "--quiet"])
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap(),
    )
}

/// `iota mine --quiet` with nothing else, logging to `log`.
fn spawn_miner(home: &Path, log: &Path) -> Killed {
    spawn_quiet(home, "mine", log)
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn mnemonic_in(stdout: &str) -> String {
    let lines: Vec<&str> = stdout.lines().collect();
    let i = lines
        .iter()
        .position(|l| l.starts_with("mnemonic (shown only this once"))
        .unwrap_or_else(|| panic!("no mnemonic in {stdout}"));
    lines[i + 1].trim().to_string()
}

#[test]
fn wallet_new_import_list_show() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let (ok, out, err) = run(iota(h).args(["wallet", "new", "--wallet", "w", "--hotkey", "a"]));
    assert!(ok, "{err}");
    let phrase = mnemonic_in(&out);
    assert_eq!(phrase.split_whitespace().count(), 12);
    let key_file = h.join(".bittensor/wallets/w/hotkeys/a");
    assert_eq!(mode(&key_file), 0o600);
    let before = std::fs::read(&key_file).unwrap();

    // show prints the address alone; it matches what `new` printed.
    let (ok, shown, err) = run(iota(h).args(["wallet", "show", "--wallet", "w", "--hotkey", "a"]));
    assert!(ok, "{err}");
    let address = shown.trim().to_string();
    assert!(out.contains(&format!("address: {address}")), "{out}");

    // The mnemonic shown once is the key: importing it elsewhere gives the same address.
    let phrase_file = h.join("phrase.txt");
    std::fs::write(&phrase_file, format!("{phrase}\n")).unwrap();
    let other = h.join("elsewhere");
    let (ok, out, err) = run(iota(h)
        .args([
            "wallet",
            "import",
            "--wallet",
            "x",
            "--hotkey",
            "b",
            "--mnemonic-file",
        ])
        .arg(&phrase_file)
        .arg("--wallets-dir")
        .arg(&other));
    assert!(ok, "{err}");
    assert!(out.contains(&address), "{out}");
    assert_eq!(mode(&other.join("x/hotkeys/b")), 0o600);
    // ... and IOTA_WALLETS_DIR names the same directory.
    let (ok, shown, _) = run(iota(h)
        .env("IOTA_WALLETS_DIR", &other)
        .args(["wallet", "show", "--wallet", "x", "--hotkey", "b"]));
    assert!(ok);
    assert_eq!(shown.trim(), address);

    // Refusals change nothing: an existing hotkey, a bad mnemonic.
    let (ok, _, err) = run(iota(h).args(["wallet", "new", "--wallet", "w", "--hotkey", "a"]));
    assert!(!ok);
    assert!(
        err.contains("already exists") && err.contains("--overwrite"),
        "{err}"
    );
    assert_eq!(std::fs::read(&key_file).unwrap(), before);
    let bad = h.join("bad.txt");
    std::fs::write(&bad, "abandon abandon abandon").unwrap();
    let (ok, _, err) = run(iota(h)
        .args([
            "wallet",
            "import",
            "--wallet",
            "w",
            "--hotkey",
            "c",
            "--mnemonic-file",
        ])
        .arg(&bad));
    assert!(!ok);
    assert!(err.contains("invalid mnemonic"), "{err}");
    assert!(!h.join(".bittensor/wallets/w/hotkeys/c").exists());
    let (ok, _, err) = run(iota(h).args(["wallet", "show", "--wallet", "w", "--hotkey", "zz"]));
    assert!(!ok);
    assert!(
        err.contains("iota wallet new --wallet w --hotkey zz"),
        "{err}"
    );

    // list shows every hotkey with its address.
    let (ok, list, _) = run(iota(h).args(["wallet", "list"]));
    assert!(ok);
    assert!(list.contains("w") && list.contains(&address), "{list}");
    assert_eq!(list.lines().count(), 2, "{list}");
}

#[test]
fn register_prints_the_section_or_the_refusal() {
    let orch = Orchestrator::start("max_miners_per_section: 1\n");
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let mut sections = Vec::new();
    for name in ["m0", "m1", "m2", "m3"] {
        let (ok, _, err) = run(iota(h).args(["wallet", "new", "--hotkey", name]));
        assert!(ok, "{err}");
    }
    for name in ["m0", "m1", "m2"] {
        let (ok, out, err) = run(iota(h)
            .args(["register", "--hotkey", name, "--orchestrator"])
            .arg(&orch.addr));
        assert!(ok, "{err}");
        let section = out
            .split("section ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap()
            .to_string();
        sections.push(section);
        assert!(
            out.contains("start mining with: iota mine --wallet default --hotkey"),
            "{out}"
        );
    }
    sections.sort();
    assert_eq!(sections, ["0", "1", "2"]);
    // Every section is full: the reason comes back, the exit status is non-zero.
    let (ok, _, err) = run(iota(h)
        .args(["register", "--hotkey", "m3", "--orchestrator"])
        .arg(orch.url()));
    assert!(!ok);
    assert!(err.contains("refused") && err.contains("full"), "{err}");
    assert_eq!(orch.miners().len(), 3);
    // A subtensor node that does not answer: a clear refusal that registers nothing.
    let (ok, out, err) = run(iota(h)
        .args([
            "register",
            "--hotkey",
            "m3",
            "--network",
            "http://127.0.0.1:9",
            "--orchestrator",
        ])
        .arg(orch.url()));
    assert!(!ok && out.is_empty());
    assert!(
        err.contains("cannot reach the subtensor node at http://127.0.0.1:9"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert_eq!(orch.miners().len(), 3);
    // Nothing listening: one line saying so.
    let (ok, _, err) = run(iota(h).args([
        "register",
        "--hotkey",
        "m3",
        "--orchestrator",
        "127.0.0.1:9",
    ]));
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("unreachable") && err.contains("What to do:"),
        "{err}"
    );

    // The orchestrator logged through tracing as JSON lines (--log-format json).
    let log = orch.log();
    let registered: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|v: &serde_json::Value| v["fields"]["message"] == "miner registered")
        .collect();
    assert_eq!(registered.len(), 3, "{log}");

    // iota status: a table for people, JSON for scripts.
    let (ok, table, err) = run(iota(h).args(["status", "--orchestrator"]).arg(orch.url()));
    assert!(ok, "{err}");
    assert!(table.starts_with("run \"ops\" at"), "{table}");
    assert!(table.contains("training, merge in 100 samples"), "{table}");
    assert_eq!(table.lines().count(), 3 + 3, "{table}");
    let (ok, json, _) = run(iota(h)
        .env("IOTA_ORCHESTRATOR", orch.url())
        .args(["status", "--json"]));
    assert!(ok);
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(doc["status"]["run"], "ops");
    assert_eq!(doc["merge"]["batches_before_merging"], 100);
}

#[test]
fn an_orchestrator_of_another_api_version_is_refused_with_advice() {
    // A server that answers /api/run like an orchestrator of a future API version.
    let info = serde_json::json!({
        "api_version": 999, "version": "9.9.9", "run": "future",
        "model": iota::model::ModelConfig::preset("tiny").unwrap(),
        "phase": "training", "epoch": 0,
    });
    let app = axum::Router::new().route(
        "/api/run",
        axum::routing::get(move || async move { axum::Json(info) }),
    );
    let addr = serve_in_thread(app);
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    run(iota(h).args(["wallet", "new"]));
    let (ok, _, err) = run(iota(h).args(["register", "--orchestrator", &addr.to_string()]));
    assert!(!ok);
    assert!(err.contains("speaks API v999 (iota 9.9.9)"), "{err}");
    assert!(
        err.contains("What to do: install the orchestrator's release"),
        "{err}"
    );
    assert!(err.contains("IOTA_VERSION=9.9.9"), "{err}");
}

#[test]
fn service_unit_runs_the_setup_settings() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let (ok, _, err) = run(iota(h).args(["service", "install", "--print"]));
    assert!(!ok && err.contains("iota setup --role miner"), "{err}");
    let (ok, _, err) = run(iota(h).args([
        "setup",
        "--yes",
        "--skip-check",
        "--orchestrator",
        "http://127.0.0.1:9",
    ]));
    assert!(ok, "{err}");
    let settings = h.join(".config/iota/miner.yaml");
    let (ok, unit, err) = run(iota(h).args(["service", "install", "--print"]));
    assert!(ok, "{err}");
    assert!(
        unit.contains(&format!(
            "ExecStart={BIN} mine --config {} --quiet --log-format json",
            settings.canonicalize().unwrap().display()
        )),
        "{unit}"
    );
    assert!(unit.contains("Restart=on-failure"), "{unit}");
    let (ok, out, err) = run(iota(h).args(["service", "install"]));
    assert!(ok, "{err}");
    let written = h.join(".config/systemd/user/iota-miner.service");
    assert_eq!(std::fs::read_to_string(&written).unwrap(), unit);
    assert!(
        out.contains("systemctl --user enable --now iota-miner"),
        "{out}"
    );
}

#[test]
fn setup_then_mine_alone() {
    let orch = Orchestrator::start("");
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    // No terminal and no --yes: refused, naming the flags; nothing written.
    let (ok, _, err) = run(iota(h).args(["setup"]));
    assert!(!ok);
    assert!(
        err.contains("--yes") && err.contains("--orchestrator URL"),
        "{err}"
    );
    assert!(!h.join(".config").exists() && !h.join(".bittensor").exists());
    // --yes without an orchestrator names the missing flag.
    let (ok, _, err) = run(iota(h).args(["setup", "--yes"]));
    assert!(!ok && err.contains("--orchestrator"), "{err}");

    let (ok, out, err) = run(iota(h)
        .args(["setup", "--yes", "--orchestrator"])
        .arg(&orch.addr));
    assert!(ok, "{err}");
    assert!(out.contains("start mining with: iota mine\n"), "{out}");
    assert!(out.contains("run \"ops\", 3 sections"), "{out}");
    mnemonic_in(&out);
    let settings = h.join(".config/iota/miner.yaml");
    assert_eq!(mode(&settings), 0o600);
    let (_, address, _) = run(iota(h).args(["wallet", "show"]));
    let address = address.trim().to_string();

    // `iota mine` alone reads the settings and joins.
    let log = h.join("mine.log");
    let _miner = spawn_miner(h, &log);
    orch.wait_for_miner(&address, &|| {
        std::fs::read_to_string(&log).unwrap_or_default()
    });
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&format!("settings from {}", settings.display())),
        "{text}"
    );
}

#[test]
fn mine_reads_a_reference_dotenv() {
    let orch = Orchestrator::start("");
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let (ok, _, err) = run(iota(h).args([
        "wallet",
        "new",
        "--wallet",
        "my_wallet",
        "--hotkey",
        "my_hotkey",
    ]));
    assert!(ok, "{err}");
    let (_, address, _) = run(iota(h).args([
        "wallet",
        "show",
        "--wallet",
        "my_wallet",
        "--hotkey",
        "my_hotkey",
    ]));
    let port = orch.addr.rsplit(':').next().unwrap();
    std::fs::write(
        h.join(".env"),
        format!(
            "wallet_name=\"my_wallet\"\nwallet_hotkey=my_hotkey\nnetuid=9\nHF_TOKEN=\"hf_x\"\n\
             ORCHESTRATOR_HOST=127.0.0.1\nORCHESTRATOR_PORT={port}\nORCHESTRATOR_SCHEME=http\n"
        ),
    )
    .unwrap();
    let log = h.join("mine.log");
    let _miner = spawn_miner(h, &log);
    orch.wait_for_miner(address.trim(), &|| {
        std::fs::read_to_string(&log).unwrap_or_default()
    });
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("not used by iota: HF_TOKEN, netuid"),
        "{text}"
    );
    assert!(!text.contains("hf_x"), "{text}");
}

#[test]
fn setup_orchestrator_checks_the_s3_storage() {
    let s3 = common::S3Server::start();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let out_file = h.join("orchestrator.yaml");
    let setup = |secret: &str| {
        let mut cmd = iota(h);
        cmd.args([
            "setup",
            "--yes",
            "--role",
            "orchestrator",
            "--run",
            "s3run",
            "--data-dir",
        ])
        .arg(h.join("state"))
        .args(["--storage-url", &format!("s3://{}/runs", common::BUCKET)])
        .args(["--s3-endpoint", &s3.endpoint, "--s3-region", "us-east-1"])
        .env("IOTA_S3_ACCESS_KEY_ID", common::ACCESS_KEY)
        .env("IOTA_S3_SECRET_ACCESS_KEY", secret)
        .arg("--out")
        .arg(&out_file);
        run(&mut cmd)
    };
    // A wrong secret fails the live check and writes nothing.
    let (ok, out, err) = setup("not-the-secret");
    assert!(!ok, "{out}");
    assert!(
        err.contains("storage check failed") && err.contains("--skip-check"),
        "{err}"
    );
    assert!(!out_file.exists());
    // The right one passes; the config is a valid run config, private to its owner, and the
    // secret is never printed.
    let (ok, out, err) = setup(common::SECRET_KEY);
    assert!(ok, "{err}");
    assert!(out.contains("write, read and delete work"), "{out}");
    assert!(!out.contains(common::SECRET_KEY) && !err.contains(common::SECRET_KEY));
    assert_eq!(mode(&out_file), 0o600);
    let config = iota::orchestrator::RunConfig::load(&out_file).unwrap();
    assert_eq!(config.storage.url, format!("s3://{}/runs", common::BUCKET));
    assert_eq!(
        config.storage.secret_access_key.as_deref(),
        Some(common::SECRET_KEY)
    );
    assert!(
        out.contains(&format!("iota orchestrate --config {}", out_file.display())),
        "{out}"
    );
    // The probe object was removed again.
    let bucket: PathBuf = s3.dir.path().join("data").join(common::BUCKET);
    let leftover = walk(&bucket);
    assert!(leftover.is_empty(), "{leftover:?}");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn register_as_a_validator() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    for name in ["val", "stranger"] {
        let (ok, _, err) = run(iota(h).args(["wallet", "new", "--hotkey", name]));
        assert!(ok, "{err}");
    }
    let (_, address, _) = run(iota(h).args(["wallet", "show", "--hotkey", "val"]));
    let orch = Orchestrator::start(&format!(
        "validators: [{{hotkey: {}, stake: 2.5}}]\n",
        address.trim()
    ));
    let (ok, out, err) = run(iota(h)
        .args([
            "register",
            "--role",
            "validator",
            "--hotkey",
            "val",
            "--orchestrator",
        ])
        .arg(orch.url()));
    assert!(ok, "{err}");
    assert!(
        out.contains("registered validator") && out.contains("stake 2.5"),
        "{out}"
    );
    let (ok, _, err) = run(iota(h)
        .args([
            "register",
            "--role",
            "validator",
            "--hotkey",
            "stranger",
            "--orchestrator",
        ])
        .arg(orch.url()));
    assert!(!ok);
    assert!(
        err.contains("not_a_validator") && err.contains("What to do:"),
        "{err}"
    );

    // `iota setup --role validator`, then `iota validate` with nothing else: it reads the
    // settings, registers and keeps validating (its window records appear under ./iota-validator).
    let (ok, out, err) = run(iota(h)
        .args(["setup", "--yes", "--role", "validator", "--hotkey", "val"])
        .arg("--orchestrator")
        .arg(orch.url()));
    assert!(ok, "{err}");
    assert!(
        out.contains("start validating with: iota validate\n"),
        "{out}"
    );
    let log = h.join("validate.log");
    let mut validator = spawn_quiet(h, "validate", &log);
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for("the validator to register", Duration::from_secs(30), || {
        h.join("iota-validator/ops").is_dir()
    });
    assert!(validator.0.try_wait().unwrap().is_none(), "{}", text());
    assert!(
        text().contains(&format!(
            "settings from {}",
            h.join(".config/iota/validator.yaml").display()
        )) && text().contains(address.trim()),
        "{}",
        text()
    );
    // The same with an unlisted hotkey's settings: refused, with what to do.
    let stranger = h.join("stranger.yaml");
    let (ok, _, err) = run(iota(h)
        .args([
            "setup",
            "--yes",
            "--role",
            "validator",
            "--hotkey",
            "stranger",
        ])
        .arg("--orchestrator")
        .arg(orch.url())
        .arg("--out")
        .arg(&stranger));
    assert!(ok, "{err}");
    let (ok, _, err) = run(iota(h).arg("validate").arg("--config").arg(&stranger));
    assert!(!ok && err.contains("not_a_validator"), "{err}");
    assert!(orch.miners().is_empty());
}
