//! Helpers shared by the integration tests: a real S3-compatible server (s3s-fs) started on a
//! free loopback port with a temporary directory, killed when dropped; [`net`] (clock, ports,
//! plain GETs, pollers); [`browser`] (headless chromium); [`cli`] (the binary run with arguments); [`fake_node`] (the FAKE subtensor node of `tests/chain/`); [`signed`] (signed POSTs); [`api_harness`] (the router in-process); [`local_run`] (what an
//! `iota local` run left on disk); [`texts`] (Shakespeare's plays, pyarrow's shards); [`venv`] (a Python venv from a requirements file); [`tls`] (a CA, server certificates, and Python's `http.server` behind TLS).
//!
//! s3s-fs must be installed (tests fail, not skip, when it is missing):
//! `cargo install s3s-fs@0.14.1 --features binary --locked`.
#![allow(dead_code)]

pub mod api_harness;
pub mod browser;
pub mod cli;
pub mod fake_node;
pub mod local_run;
pub mod net;
pub mod procs;
pub mod signed;
pub mod texts;
pub mod tls;
pub mod venv;

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use iota::storage::{Storage, StorageConfig};

pub const ACCESS_KEY: &str = "iota-test";
pub const SECRET_KEY: &str = "iota-test-secret";
pub const BUCKET: &str = "iota-test-bucket";

/// A running s3s-fs; killed (and its directory removed) on drop.
pub struct S3Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// The server's temporary directory (buckets under `data/`).
    pub dir: tempfile::TempDir,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// s3s-fs on PATH, else in `$CARGO_HOME/bin` or `~/.cargo/bin`.
fn find_s3s_fs() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("s3s-fs"));
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")))
        .map(|home| home.join("bin").join("s3s-fs"));
    on_path
        .chain(cargo_home)
        .find(|candidate| candidate.is_file())
}

impl S3Server {
    /// The environment a command needs to read this server's buckets through the AWS
    /// variables, with `cache` as its `IOTA_DATA_CACHE`.
    pub fn client_envs<'a>(&'a self, cache: &'a Path) -> [(&'a str, &'a str); 5] {
        [
            ("AWS_ENDPOINT_URL", self.endpoint.as_str()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
            ("AWS_REGION", "us-east-1"),
            ("IOTA_DATA_CACHE", cache.to_str().expect("a UTF-8 path")),
        ]
    }

    pub fn start() -> Self {
        let bin = find_s3s_fs().unwrap_or_else(|| {
            panic!(
                "s3s-fs is not installed (looked on PATH and in ~/.cargo/bin); these tests need \
                 a real S3-compatible server. Install it with:\n    \
                 cargo install s3s-fs@0.14.1 --features binary --locked"
            )
        });
        let dir = tempfile::tempdir().expect("temporary directory for s3s-fs");
        std::fs::create_dir(dir.path().join("data")).expect("data directory");
        // A port picked free can still be taken before the server binds it: a server that
        // exits early is started again on another port.
        let mut failures = Vec::new();
        for _ in 0..3 {
            let port = net::free_port();
            let mut child = spawn_s3s_fs(&bin, port, dir.path());
            match wait_until_listening(&mut child, dir.path(), port) {
                Ok(()) => {
                    return Self {
                        child,
                        endpoint: format!("http://127.0.0.1:{port}"),
                        dir,
                    };
                }
                Err(why) => {
                    failures.push(why);
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
        panic!("s3s-fs did not start:\n{}", failures.join("\n"));
    }

    /// Kills the server (SIGKILL: transfers under way are cut) and starts it again on the same
    /// port and directory after `down`, so presigned URLs issued before stay valid.
    pub fn restart(&mut self, down: Duration) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::thread::sleep(down);
        let port: u16 = self
            .endpoint
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("endpoint port");
        let bin = find_s3s_fs().expect("s3s-fs");
        self.child = spawn_s3s_fs(&bin, port, self.dir.path());
        if let Err(why) = wait_until_listening(&mut self.child, self.dir.path(), port) {
            panic!("s3s-fs did not come back on port {port}: {why}");
        }
    }

    /// Whether the server process still runs, and its log: what a test prints when the
    /// server stopped answering.
    pub fn diagnosis(&mut self) -> String {
        diagnosis(&mut self.child, self.dir.path())
    }

    pub fn config(&self, secret: &str) -> StorageConfig {
        StorageConfig {
            url: format!("s3://{BUCKET}/deploy"),
            endpoint: Some(self.endpoint.clone()),
            region: Some("us-east-1".into()),
            access_key_id: Some(ACCESS_KEY.into()),
            secret_access_key: Some(secret.into()),
        }
    }

    pub fn storage(&self) -> Storage {
        Storage::open(&self.config(SECRET_KEY)).expect("open S3 storage")
    }
}

/// Whether the s3s-fs `child` still runs, and its log in `dir`.
fn diagnosis(child: &mut Child, dir: &Path) -> String {
    let state = match child.try_wait() {
        Ok(None) => "s3s-fs is running".to_string(),
        Ok(Some(status)) => format!("s3s-fs exited ({status})"),
        Err(e) => format!("s3s-fs state unknown: {e}"),
    };
    let log = std::fs::read_to_string(dir.join("s3s-fs.log")).unwrap_or_default();
    format!("{state}; its log:\n{log}")
}

/// Waits until the s3s-fs `child` answers HTTP on `port` (an HTTP status line, not merely an
/// open socket: a connect can succeed against another process, or against itself) and is still
/// running after it.
fn wait_until_listening(child: &mut Child, dir: &Path, port: u16) -> Result<(), String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return Err(diagnosis(child, dir));
        }
        if answers_http(addr) {
            std::thread::sleep(Duration::from_millis(50));
            return match child.try_wait() {
                Ok(None) => Ok(()),
                _ => Err(diagnosis(child, dir)),
            };
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "no HTTP answer on port {port} within 20 s; {}",
        diagnosis(child, dir)
    ))
}

/// Whether something on `addr` answers a request with an HTTP status line.
fn answers_http(addr: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 5];
    stream.read_exact(&mut head).is_ok() && &head == b"HTTP/"
}

/// Starts s3s-fs on `port` serving `dir/data`, logging to `dir/s3s-fs.log` (appended).
fn spawn_s3s_fs(bin: &std::path::Path, port: u16, dir: &std::path::Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("s3s-fs.log"))
        .expect("log file");
    Command::new(bin)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
        .arg(dir.join("data"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()))
}

/// Copies the files under `from` to `to`, keeping the folders.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_tree(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}
