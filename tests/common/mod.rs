//! Helpers shared by the integration tests: a real S3-compatible server (s3s-fs) started on a
//! free loopback port with a temporary directory, killed when dropped; [`net`] (clock, ports,
//! plain GETs, pollers); [`signed`] (signed POSTs); [`api_harness`] (the router in-process); [`local_run`] (what an
//! `iota local` run left on disk).
//!
//! s3s-fs must be installed (tests fail, not skip, when it is missing):
//! `cargo install s3s-fs@0.14.1 --features binary --locked`.
#![allow(dead_code)]

pub mod api_harness;
pub mod local_run;
pub mod net;
pub mod procs;
pub mod signed;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
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
    pub fn start() -> Self {
        let bin = find_s3s_fs().unwrap_or_else(|| {
            panic!(
                "s3s-fs is not installed (looked on PATH and in ~/.cargo/bin); these tests need \
                 a real S3-compatible server. Install it with:\n    \
                 cargo install s3s-fs@0.14.1 --features binary --locked"
            )
        });
        let dir = tempfile::tempdir().expect("temporary directory for s3s-fs");
        // Ask the OS for a free port, then hand it to the server (a small race, but the
        // port is fresh and loopback-only).
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free loopback port")
            .port();
        std::fs::create_dir(dir.path().join("data")).expect("data directory");
        let child = spawn_s3s_fs(&bin, port, dir.path());
        let mut server = Self {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            dir,
        };
        server.wait_until_listening(port);
        server
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
        self.wait_until_listening(port);
    }

    fn wait_until_listening(&mut self, port: u16) {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                let log =
                    std::fs::read_to_string(self.dir.path().join("s3s-fs.log")).unwrap_or_default();
                panic!("s3s-fs exited early ({status}); its log:\n{log}");
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("s3s-fs did not listen on port {port} within 20 s");
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
