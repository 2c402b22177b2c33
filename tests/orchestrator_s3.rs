//! The orchestrator on S3-compatible storage (a real s3s-fs started by the test): assignments
//! carry presigned URLs, the miner side transfers through them, and submit checks the object
//! the orchestrator fetches back from the bucket.
//!
//! s3s-fs must be installed: `cargo install s3s-fs@0.14.1 --features binary --locked`.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use bytes::Bytes;
use http_body_util::BodyExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tower::ServiceExt;
use url::Url;

use iota::api::*;
use iota::orchestrator::{AppState, RunConfig, router};
use iota::storage::{WireDtype, download_from_url, encode, payload_hash, upload_to_url};
use iota::wallet::{Hotkey, sign_request};

const BUCKET: &str = "orch-bucket";

/// s3s-fs on a free port; killed on drop.
struct S3 {
    child: Child,
    endpoint: String,
    _dir: tempfile::TempDir,
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn s3s_fs() -> PathBuf {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .expect("HOME or CARGO_HOME");
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("s3s-fs"))
        .chain([home.join("bin").join("s3s-fs")])
        .find(|p| p.is_file())
        .expect("s3s-fs is not installed: cargo install s3s-fs@0.14.1 --features binary --locked")
}

impl S3 {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir_all(data.join(BUCKET)).unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(s3s_fs())
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", "orch", "--secret-key", "orch-secret"])
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let until = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(Instant::now() < until, "s3s-fs did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

async fn post<T: DeserializeOwned>(
    state: &AppState,
    path: &str,
    body: &impl Serialize,
    key: &Hotkey,
) -> T {
    let body = serde_json::to_vec(body).unwrap();
    let mut req = Request::post(path);
    for (name, value) in sign_request(key, &body, now_ms(), "s3-run").to_pairs() {
        req = req.header(name, value);
    }
    let resp = router(state.clone())
        .oneshot(req.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn assignments_carry_presigned_urls_that_work() {
    let s3 = S3::start();
    let data_dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "run: s3-run\nbatch_size: 2\nseq_len: 8\nwire: f32\n\
         data: {{source: \"synthetic:2:20000\"}}\ndata_dir: {}\n\
         storage: {{url: \"s3://{BUCKET}/runs\", endpoint: \"{}\", region: us-east-1, \
         access_key_id: orch, secret_access_key: orch-secret}}\n",
        data_dir.path().display(),
        s3.endpoint
    );
    let state = AppState::open(RunConfig::from_yaml(&yaml).unwrap()).unwrap();
    let alice = Hotkey::from_uri("//Alice").unwrap();
    let reg: RegisterResponse = post(
        &state,
        "/api/register",
        &RegisterRequest {
            device: "cpu".into(),
            max_in_flight: 1,
        },
        &alice,
    )
    .await;
    assert_eq!(reg.section, 0);
    let work: WorkResponse = post(&state, "/api/work", &WorkRequest { max: 1 }, &alice).await;
    let a = &work.assignments[0];
    assert!(a.input.url.starts_with(&s3.endpoint), "{}", a.input.url);
    let tokens = download_from_url(&Url::parse(&a.input.url).unwrap(), None)
        .await
        .unwrap();
    assert_eq!(Some(payload_hash(&tokens)), a.input.hash);
    assert_eq!(tokens.len(), 2 * 8 * 4);

    let out = a.output.as_ref().unwrap();
    assert!(out.url.starts_with(&s3.endpoint));
    let shape = out.shape.clone().unwrap();
    let n: usize = shape.iter().product();
    let bytes = Bytes::from(encode(&shape, &vec![0.25; n], WireDtype::F32).unwrap());
    upload_to_url(&Url::parse(&out.url).unwrap(), bytes.clone())
        .await
        .unwrap();
    let submit = SubmitRequest {
        assignment_id: a.id,
        output_hash: Some(payload_hash(&bytes)),
        output_bytes: Some(bytes.len() as u64),
        loss: None,
        timings: Timings::default(),
    };
    let r: SubmitResponse = post(&state, "/api/submit", &submit, &alice).await;
    assert!(r.accepted, "{r:?}");
    assert_eq!(state.repo.miners().unwrap()[0].forwards, 1);
}
