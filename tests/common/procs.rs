//! Real processes: the `iota` binary as orchestrator and miners, killed when the test ends.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use iota::wallet::WalletDir;

use super::net::{free_port, status, wait_for};

/// The `iota` binary the tests run: `IOTA_TEST_BIN` when set (a copy taken right after the
/// build, where several checkouts share one target directory and so one `target/debug/iota`),
/// else the one cargo built for this test.
pub fn iota_bin() -> std::path::PathBuf {
    std::env::var_os("IOTA_TEST_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_iota").into())
}

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
    Command::new(iota_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap()
}

/// Writes a run config with short deadlines on a free port; returns the URL and the path.
pub fn write_config(dir: &Path, run: &str) -> (String, std::path::PathBuf) {
    write_config_with(
        dir,
        run,
        "heartbeat_s: 1\ndeadlines: { forward_s: 2, backward_s: 3 }\n",
    )
}

/// A run config of the `tiny` preset (samples of 2 x 32 tokens, state in `dir/state`) on a
/// free port, with `extra` YAML lines; returns the URL and the path. Placement is `ordered`
/// (the tests' own miners fill the sections evenly, in the order they register).
pub fn write_config_with(dir: &Path, run: &str, extra: &str) -> (String, std::path::PathBuf) {
    let port = free_port();
    let config = dir.join("run.yaml");
    std::fs::write(
        &config,
        format!(
            "run: {run}\nmodel: {{ preset: tiny }}\ndata: {{ source: synthetic }}\n\
             listen: 127.0.0.1:{port}\ndata_dir: {}\nbatch_size: 2\nseq_len: 32\n\
             max_in_flight: 4\nlocal_steps: 1\nplacement: {{ ordered: true, new_keys: {{ burst: 1000 }} }}\n{extra}",
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
    let address = create_hotkey(dir, name);
    (spawn_miner(dir, url, name, &[]), address)
}

/// Creates hotkey `name` in `dir/wallets` (wallet `w`), replacing one of that name; returns its
/// address.
pub fn create_hotkey(dir: &Path, name: &str) -> String {
    WalletDir::new(dir.join("wallets"))
        .create_hotkey("w", name, true)
        .unwrap()
        .address()
        .to_string()
}

/// Starts `iota mine` with the existing hotkey `name` (and `extra` flags), logging to
/// `dir/{name}.log` (appended to, so a restarted miner keeps its history).
pub fn spawn_miner(dir: &Path, url: &str, name: &str, extra: &[&str]) -> Child {
    let wallets_dir = dir.join("wallets");
    let log = dir.join(format!("{name}.log"));
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .unwrap();
    Command::new(iota_bin())
        .args([
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
        ])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap()
}

/// A fresh folder `{name}-{pid}` under `CARGO_TARGET_TMPDIR` for this test process, after
/// removing the `{name}-{pid}` folders of earlier runs whose process is gone (a folder held
/// in a static is never dropped, so it is cleaned up by the next run).
pub fn process_dir(name: &str) -> std::path::PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let prefix = format!("{name}-");
    if let Ok(entries) = std::fs::read_dir(tmp) {
        for entry in entries.flatten() {
            let file_name = entry.file_name().to_string_lossy().into_owned();
            let pid = file_name.strip_prefix(&prefix);
            if pid.is_some_and(|pid| !Path::new("/proc").join(pid).exists()) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let root = tmp.join(format!("{prefix}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).expect("creating the test's folder");
    root
}

/// The last `lines` lines of every `*.log` file in `dir`, each under its path: what a test
/// prints when it gives up waiting.
pub fn log_tails(dir: &Path, lines: usize) -> String {
    let mut out = String::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "log") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(lines).collect();
            out.push_str(&format!("--- {}\n", path.display()));
            for line in tail.into_iter().rev() {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}
