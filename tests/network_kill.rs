//! End to end: a miner killed mid-run. Its work is re-offered or dropped with a recorded
//! reason, and the run goes on with the miners left.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use iota::wallet::WalletDir;

/// Children killed on drop, so a failing test leaves nothing running.
struct Kids(Vec<Child>);

impl Drop for Kids {
    fn drop(&mut self) {
        for c in self.0.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn(args: &[&str], log: &Path) -> Child {
    let out = std::fs::File::create(log).unwrap();
    Command::new(env!("CARGO_BIN_EXE_iota"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap()
}

fn status(url: &str) -> Option<serde_json::Value> {
    let body = reqwest::blocking_get(&format!("{url}/api/status"))?;
    serde_json::from_str(&body).ok()
}

mod reqwest {
    /// A tiny blocking GET over a raw TCP socket (the crate's reqwest is async only).
    pub fn blocking_get(url: &str) -> Option<String> {
        use std::io::{Read, Write};
        let rest = url.strip_prefix("http://")?;
        let (host, path) = rest.split_once('/')?;
        let mut stream = std::net::TcpStream::connect(host).ok()?;
        write!(
            stream,
            "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).ok()?;
        let (head, body) = text.split_once("\r\n\r\n")?;
        if !head.starts_with("HTTP/1.1 200") {
            return None;
        }
        if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            // Dechunk.
            let mut out = String::new();
            let mut rest = body;
            loop {
                let (size, after) = rest.split_once("\r\n")?;
                let n = usize::from_str_radix(size.trim(), 16).ok()?;
                if n == 0 {
                    break;
                }
                out.push_str(after.get(..n)?);
                rest = after.get(n + 2..)?;
            }
            return Some(out);
        }
        Some(body.to_string())
    }
}

fn completed(s: &serde_json::Value) -> u64 {
    s["samples"]["completed"].as_u64().unwrap_or(0)
}

fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn killed_miner_work_is_reoffered_or_dropped_and_the_run_continues() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let config = dir.path().join("run.yaml");
    std::fs::write(
        &config,
        format!(
            "run: kill-test\nmodel: {{ preset: tiny }}\ndata: {{ source: synthetic }}\n\
             listen: 127.0.0.1:{port}\ndata_dir: {}\nbatch_size: 2\nseq_len: 32\n\
             max_in_flight: 4\nlocal_steps: 1\nheartbeat_s: 1\n\
             deadlines: {{ forward_s: 2, backward_s: 3 }}\n",
            dir.path().join("state").display()
        ),
    )
    .unwrap();
    let mut kids = Kids(Vec::new());
    kids.0.push(spawn(
        &["orchestrate", "--config", config.to_str().unwrap()],
        &dir.path().join("orchestrator.log"),
    ));
    wait_for("the orchestrator", Duration::from_secs(30), || {
        status(&url).is_some()
    });

    let wallets_dir = dir.path().join("wallets");
    let wallets = WalletDir::new(&wallets_dir);
    let mut addresses = Vec::new();
    for i in 0..6 {
        let name = format!("m{i}");
        let key = wallets.create_hotkey("w", &name, true).unwrap();
        addresses.push(key.address().to_string());
        kids.0.push(spawn(
            &[
                "mine",
                "--wallet",
                "w",
                "--hotkey",
                &name,
                "--orchestrator",
                &url,
                "--wallets-dir",
                wallets_dir.to_str().unwrap(),
                "--threads",
                "1",
                "--quiet",
            ],
            &dir.path().join(format!("{name}.log")),
        ));
        // Register in order, so miner i serves section i % 3.
        wait_for("registration", Duration::from_secs(30), || {
            status(&url).is_some_and(|s| {
                s["sections"]
                    .as_array()
                    .map(|secs| {
                        secs.iter()
                            .map(|x| x["miners"].as_array().map_or(0, Vec::len))
                            .sum::<usize>()
                    })
                    .unwrap_or(0)
                    > i
            })
        });
    }
    wait_for("training to start", Duration::from_secs(60), || {
        status(&url).is_some_and(|s| completed(&s) >= 5)
    });

    // Kill a miner of the middle section (SIGKILL: no release, no goodbye).
    let db_path = dir.path().join("state/state.sqlite");
    let section_of = |address: &str| -> i64 {
        let db = rusqlite::Connection::open(&db_path).unwrap();
        db.query_row(
            "SELECT section FROM miners WHERE hotkey = ?1",
            [address],
            |r| r.get(0),
        )
        .unwrap()
    };
    let victim = (0..6).find(|&i| section_of(&addresses[i]) == 1).unwrap();
    let victim_address = addresses[victim].clone();
    // kids.0[0] is the orchestrator.
    kids.0[victim + 1].kill().unwrap();
    kids.0[victim + 1].wait().unwrap();
    let after_kill = status(&url).map(|s| completed(&s)).unwrap_or(0);

    // The run goes on with the other miners.
    wait_for("progress after the kill", Duration::from_secs(60), || {
        status(&url).is_some_and(|s| completed(&s) >= after_kill + 10)
    });

    // The victim's unfinished work was re-offered or its samples dropped with a reason; none
    // of it is left assigned to the dead miner without an outcome.
    wait_for(
        "the victim's work to be settled",
        Duration::from_secs(30),
        || {
            let db = rusqlite::Connection::open(&db_path).unwrap();
            let stuck: i64 = db
                .query_row(
                    "SELECT COUNT(*) FROM assignments WHERE miner = ?1 AND state = 'assigned'",
                    [&victim_address],
                    |r| r.get(0),
                )
                .unwrap();
            stuck == 0
        },
    );
    let db = rusqlite::Connection::open(&db_path).unwrap();
    let settled: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM assignments WHERE miner = ?1 AND reason IS NOT NULL",
            [&victim_address],
            |r| r.get(0),
        )
        .unwrap();
    let dropped_without_reason: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM samples WHERE outcome = 'dropped' AND reason IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let penalties: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM penalties WHERE miner = ?1",
            [&victim_address],
            |r| r.get(0),
        )
        .unwrap();
    eprintln!("victim: {settled} assignments settled with a reason, {penalties} penalties");
    assert_eq!(dropped_without_reason, 0, "a sample was dropped silently");
    assert!(
        settled > 0 || penalties > 0,
        "the dead miner's work left no trace in the ledger (settled {settled}, penalties {penalties})"
    );
}
