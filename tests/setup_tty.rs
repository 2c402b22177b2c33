//! `iota setup` answered interactively through a real pseudo-terminal (a tmux session):
//! a miner that creates its hotkey, and an orchestrator whose S3 storage is checked live
//! against a real S3 server, with the secret typed and never shown on the screen.
//!
//! tmux must be installed (scripts/test.sh installs it).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_iota");

/// A tmux server of its own (its own socket), killed on drop.
struct Tty {
    socket: String,
}

impl Tty {
    /// Starts `command` in a 200x50 terminal.
    fn start(name: &str, command: &str) -> Tty {
        let tmux = Path::new("/usr/bin/tmux");
        assert!(
            tmux.exists() || which("tmux").is_some(),
            "tmux is not installed; these tests drive a real terminal through it (apt-get install tmux)"
        );
        let tty = Tty {
            socket: format!("iota-setup-{name}-{}", std::process::id()),
        };
        let ok = tty
            .tmux()
            .args(["new-session", "-d", "-x", "200", "-y", "50", command])
            .status()
            .unwrap()
            .success();
        assert!(ok, "tmux new-session failed");
        tty
    }

    fn tmux(&self) -> Command {
        let mut cmd = Command::new("tmux");
        cmd.args(["-L", &self.socket]);
        cmd
    }

    fn screen(&self) -> String {
        let out = self.tmux().args(["capture-pane", "-p"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until the screen shows `text`.
    fn wait_for(&self, text: &str) {
        self.wait_for_or(text, String::new);
    }

    /// Waits until the screen shows `text`; on timeout the panic adds `context()`.
    fn wait_for_or(&self, text: &str, context: impl Fn() -> String) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let screen = self.screen();
            if screen.contains(text) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the screen never showed {text:?}; it shows:\n{screen}\n{}",
                context()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Types `keys` (tmux key names, e.g. "Enter", "Down", or literal text).
    fn keys(&self, keys: &[&str]) {
        for key in keys {
            let ok = self
                .tmux()
                .args(["send-keys", key])
                .status()
                .unwrap()
                .success();
            assert!(ok);
            std::thread::sleep(Duration::from_millis(150));
        }
    }

    /// Answers the question showing `prompt` with `keys`.
    fn answer(&self, prompt: &str, keys: &[&str]) {
        self.wait_for(prompt);
        self.keys(keys);
    }
}

impl Drop for Tty {
    fn drop(&mut self) {
        let _ = self.tmux().arg("kill-server").status();
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// The shell line running setup with a fresh HOME, then reporting its exit status.
fn setup_line(home: &Path, args: &str) -> String {
    format!(
        "cd {h} && env -u IOTA_ORCHESTRATOR -u IOTA_WALLET -u IOTA_HOTKEY -u IOTA_WALLETS_DIR \
         -u XDG_CONFIG_HOME -u XDG_DATA_HOME HOME={h} {BIN} setup {args}; echo SETUP-EXIT=$?; sleep 60",
        h = home.display()
    )
}

#[test]
fn interactive_miner_creates_its_hotkey_and_settings() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    // Nothing listens on port 9: setup says so and asks whether to keep the URL.
    let tty = Tty::start("miner", &setup_line(h, ""));
    tty.answer("Role of this machine", &["Enter"]);
    tty.answer("create a new hotkey", &["Enter"]);
    tty.answer("Wallet name", &["C-u", "mywallet", "Enter"]);
    tty.answer("Hotkey name", &["C-u", "myhotkey", "Enter"]);
    tty.answer("Orchestrator URL", &["127.0.0.1:9", "Enter"]);
    tty.answer("Keep this URL anyway", &["y"]);
    tty.answer("Compute device", &["Enter"]);
    tty.answer("Write the settings to", &["Enter"]);
    tty.wait_for("SETUP-EXIT=");
    let screen = tty.screen();
    assert!(screen.contains("SETUP-EXIT=0"), "{screen}");
    assert!(screen.contains("start mining with: iota mine"), "{screen}");
    assert!(
        screen.contains("mnemonic (shown only this once"),
        "{screen}"
    );
    let settings = std::fs::read_to_string(h.join(".config/iota/miner.yaml")).unwrap();
    assert!(settings.contains("wallet: mywallet"), "{settings}");
    assert!(
        settings.contains("orchestrator: http://127.0.0.1:9"),
        "{settings}"
    );
    assert!(
        h.join(".bittensor/wallets/mywallet/hotkeys/myhotkey")
            .is_file()
    );
}

#[test]
fn interactive_orchestrator_checks_s3_and_hides_the_secret() {
    let s3 = std::cell::RefCell::new(common::S3Server::start());
    let endpoint = s3.borrow().endpoint.clone();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let out = h.join("orch.yaml");
    let tty = Tty::start(
        "orchestrator",
        &setup_line(h, &format!("--role orchestrator --out {}", out.display())),
    );
    tty.answer("Role of this machine", &["Enter"]);
    tty.answer("Run name", &["C-u", "ttyrun", "Enter"]);
    tty.answer("Model preset", &["Enter"]);
    tty.answer("Data directory", &["Enter"]);
    tty.answer("Listen address", &["Enter"]);
    // Loopback: plain HTTP is the default transport.
    tty.answer("Transport", &["Enter"]);
    tty.answer("Public URL", &["Enter"]);
    tty.answer("Object storage", &["Down", "Enter"]);
    tty.answer("S3 endpoint URL", &["C-u", &endpoint, "Enter"]);
    tty.answer("Region", &["Enter"]);
    tty.answer(
        "Bucket and prefix",
        &[&format!("s3://{}/tty", common::BUCKET), "Enter"],
    );
    tty.answer("Access key id", &[common::ACCESS_KEY, "Enter"]);
    // A wrong secret first: the live check fails and setup asks again.
    tty.answer("Secret access key", &["wrong-secret", "Enter"]);
    tty.answer("What now?", &["Enter"]);
    // The second round defaults to the first round's answers: only the secret is retyped.
    tty.answer("Object storage", &["Enter"]);
    tty.keys(&["Enter", "Enter", "Enter", "Enter"]);
    tty.answer("Secret access key", &[common::SECRET_KEY, "Enter"]);
    // When the check fails here, say whether the S3 server still runs (and what it logged).
    tty.wait_for_or("write, read and delete work", || {
        s3.borrow_mut().diagnosis()
    });
    tty.answer("Write the settings to", &["Enter"]);
    tty.wait_for("SETUP-EXIT=");
    let screen = tty.screen();
    assert!(screen.contains("SETUP-EXIT=0"), "{screen}");
    assert!(screen.contains("storage check failed"), "{screen}");
    assert!(
        !screen.contains(common::SECRET_KEY),
        "the secret was echoed:\n{screen}"
    );
    assert!(
        !screen.contains("wrong-secret"),
        "the secret was echoed:\n{screen}"
    );
    let config = iota::orchestrator::RunConfig::load(&out).unwrap();
    assert_eq!(config.run, "ttyrun");
    assert!(config.tls.is_none() && !config.insecure_http);
    assert_eq!(config.storage.endpoint.as_deref(), Some(endpoint.as_str()));
    assert_eq!(
        config.storage.secret_access_key.as_deref(),
        Some(common::SECRET_KEY)
    );
}
