//! Real processes: the `iota` binary as orchestrator and miners, killed when the test ends.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use iota::wallet::WalletDir;

use super::net::{free_port, status, wait_for};

/// Children killed on drop, so a failing test leaves nothing running.
pub struct Kids(pub Vec<Child>);

impl Drop for Kids {
    fn drop(&mut self) {
        for c in self.0.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn spawn(args: &[&str], log: &Path) -> Child {
    let out = std::fs::File::create(log).unwrap();
    Command::new(env!("CARGO_BIN_EXE_iota"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap()
}

/// Writes a run config with short deadlines on a free port; returns the URL and the path.
pub fn write_config(dir: &Path, run: &str) -> (String, std::path::PathBuf) {
    let port = free_port();
    let config = dir.join("run.yaml");
    std::fs::write(
        &config,
        format!(
            "run: {run}\nmodel: {{ preset: tiny }}\ndata: {{ source: synthetic }}\n\
             listen: 127.0.0.1:{port}\ndata_dir: {}\nbatch_size: 2\nseq_len: 32\n\
             max_in_flight: 4\nlocal_steps: 1\nheartbeat_s: 1\n\
             deadlines: {{ forward_s: 2, backward_s: 3 }}\n",
            dir.join("state").display()
        ),
    )
    .unwrap();
    (format!("http://127.0.0.1:{port}"), config)
}

/// Starts `iota orchestrate` and waits until it answers.
pub fn start_orchestrator(dir: &Path, config: &Path, url: &str) -> Child {
    let child = spawn(
        &["orchestrate", "--config", config.to_str().unwrap()],
        &dir.join("orchestrator.log"),
    );
    wait_for("the orchestrator", Duration::from_secs(30), || {
        status(url).is_some()
    });
    child
}

/// Starts `iota mine` with a fresh hotkey `name`; returns the child and the address.
pub fn start_miner(dir: &Path, url: &str, name: &str) -> (Child, String) {
    let wallets_dir = dir.join("wallets");
    let key = WalletDir::new(&wallets_dir)
        .create_hotkey("w", name, true)
        .unwrap();
    let child = spawn(
        &[
            "mine",
            "--wallet",
            "w",
            "--hotkey",
            name,
            "--orchestrator",
            url,
            "--wallets-dir",
            wallets_dir.to_str().unwrap(),
            "--threads",
            "1",
            "--quiet",
        ],
        &dir.join(format!("{name}.log")),
    );
    (child, key.address().to_string())
}
