//! The orchestrator as a real HTTP server on 127.0.0.1:0: signed requests over reqwest, blob
//! transfers through `storage::transfer` (local-directory storage), graceful shutdown, and a
//! restart on the same data directory.

use std::net::SocketAddr;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use url::Url;

use iota::api::*;
use iota::orchestrator::{AppState, RunConfig, serve};
use iota::storage::{WireDtype, download_from_url, encode, payload_hash, upload_to_url};
use iota::wallet::Hotkey;

mod common;

use common::signed::post_http;

struct Server {
    client: Client,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn start(dir: &std::path::Path) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let yaml = format!(
        "run: srv\nbatch_size: 2\nseq_len: 8\nwire: bf16\neval_samples: 0\ndata: {{source: \"synthetic:1:20000\"}}\n\
         data_dir: {}\nlisten: {addr}\n",
        dir.display()
    );
    let state = AppState::open(RunConfig::from_yaml(&yaml).unwrap()).unwrap();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve(state, listener, async {
        let _ = rx.await;
    }));
    Server {
        client: Client { addr },
        stop,
        task,
    }
}

/// Signed JSON calls to a server at `addr`.
struct Client {
    addr: SocketAddr,
}

impl Client {
    async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
        key: &Hotkey,
    ) -> T {
        post_http(&format!("http://{}", self.addr), path, body, key, "srv").await
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> T {
        let resp = reqwest::get(format!("http://{}{path}", self.addr))
            .await
            .unwrap();
        assert!(resp.status().is_success());
        serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap()
    }
}

impl std::ops::Deref for Server {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Server {
    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.task.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn serves_signed_requests_and_blobs_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let alice = Hotkey::from_uri("//Alice").unwrap();
    let server = start(dir.path()).await;
    let health: Health = server.get("/health").await;
    assert_eq!(health.status, "ok");
    let reg: RegisterResponse = server
        .post(
            "/api/register",
            &RegisterRequest {
                device: "cpu".into(),
                max_in_flight: 2,
            },
            &alice,
        )
        .await;
    assert_eq!((reg.section, reg.settings.wire), (0, WireDtype::Bf16));
    let work: WorkResponse = server
        .post("/api/work", &WorkRequest { max: 1, wait_ms: 0 }, &alice)
        .await;
    let a = &work.assignments[0];
    // Download the head's tokens, whole and by range, through the blob URL.
    let url = Url::parse(&a.input.url).unwrap();
    assert!(
        url.as_str()
            .starts_with(&format!("http://{}/blob/", server.addr))
    );
    let tokens = download_from_url(&url, None).await.unwrap();
    assert_eq!(Some(payload_hash(&tokens)), a.input.hash);
    let part = download_from_url(&url, Some(4..12)).await.unwrap();
    assert_eq!(part, tokens.slice(4..12));
    // Upload the output and submit it.
    let shape = a.output.as_ref().unwrap().shape.clone().unwrap();
    let n: usize = shape.iter().product();
    let bytes = Bytes::from(encode(&shape, &vec![0.5; n], WireDtype::Bf16).unwrap());
    let out_url = Url::parse(&a.output.as_ref().unwrap().url).unwrap();
    upload_to_url(&out_url, bytes.clone()).await.unwrap();
    let submit = SubmitRequest {
        assignment_id: a.id,
        output_hash: Some(payload_hash(&bytes)),
        output_bytes: Some(bytes.len() as u64),
        loss: None,
        timings: Timings::default(),
    };
    let r: SubmitResponse = server.post("/api/submit", &submit, &alice).await;
    assert!(r.accepted, "{r:?}");
    let metrics = reqwest::get(format!("http://{}/metrics", server.addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("iota_results_accepted_total 1"),
        "{metrics}"
    );
    server.stop().await;

    // Restart on the same directory: the registration and the routed work are still there.
    let server = start(dir.path()).await;
    let status: StatusResponse = server.get("/api/status").await;
    assert_eq!(status.sections[0].miners.len(), 1);
    assert_eq!(status.sections[0].miners[0].forwards, 1);
    assert_eq!(status.samples.in_flight, 1);
    let reg: RegisterResponse = server
        .post(
            "/api/register",
            &RegisterRequest {
                device: "cpu".into(),
                max_in_flight: 2,
            },
            &alice,
        )
        .await;
    assert_eq!(reg.section, 0);
    server.stop().await;
}

/// A miner with nothing to do holds its `/api/work` request open (`wait_ms`): the request is
/// answered with the forward the moment the head submits it, not at a later poll, and the time
/// it waited is reported and left out of the latency metrics.
#[tokio::test]
async fn a_waiting_work_request_is_answered_the_moment_work_is_routed() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path()).await;
    let addr = server.addr;
    let (alice, bob) = (
        Hotkey::from_uri("//Alice").unwrap(),
        Hotkey::from_uri("//Bob").unwrap(),
    );
    let register = RegisterRequest {
        device: "cpu".into(),
        max_in_flight: 2,
    };
    let reg_a: RegisterResponse = server.post("/api/register", &register, &alice).await;
    let reg_b: RegisterResponse = server.post("/api/register", &register, &bob).await;
    assert_eq!((reg_a.section, reg_b.section), (0, 1));

    // Bob asks before any work exists for his section, and may wait up to 20 s.
    let waiting = tokio::spawn({
        let bob = bob.clone();
        async move {
            let wait = WorkRequest {
                max: 1,
                wait_ms: 20_000,
            };
            let started = std::time::Instant::now();
            let work: WorkResponse =
                post_http(&format!("http://{addr}"), "/api/work", &wait, &bob, "srv").await;
            (work, started.elapsed())
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "bob's request came back with nothing to do"
    );

    // Alice computes a head forward and submits it: that opens a forward for section 1.
    let work: WorkResponse = server
        .post("/api/work", &WorkRequest { max: 1, wait_ms: 0 }, &alice)
        .await;
    let a = &work.assignments[0];
    let shape = a.output.as_ref().unwrap().shape.clone().unwrap();
    let n: usize = shape.iter().product();
    let bytes = Bytes::from(encode(&shape, &vec![0.5; n], WireDtype::Bf16).unwrap());
    upload_to_url(
        &Url::parse(&a.output.as_ref().unwrap().url).unwrap(),
        bytes.clone(),
    )
    .await
    .unwrap();
    let submit = SubmitRequest {
        assignment_id: a.id,
        output_hash: Some(payload_hash(&bytes)),
        output_bytes: Some(bytes.len() as u64),
        loss: None,
        timings: Timings::default(),
    };
    let r: SubmitResponse = server.post("/api/submit", &submit, &alice).await;
    assert!(r.accepted, "{r:?}");

    // The same request of bob's now carries the forward of alice's sample.
    let (got, took) = waiting.await.unwrap();
    assert_eq!(got.assignments.len(), 1, "{got:?}");
    assert_eq!(got.assignments[0].kind, WorkKind::Forward);
    assert_eq!(got.assignments[0].sample_id, a.sample_id);
    assert!(got.waited_ms >= 300, "waited {} ms", got.waited_ms);
    assert!(took < std::time::Duration::from_secs(20), "{took:?}");

    // Nothing more to do: a short wait ends empty, after its wait.
    let empty: WorkResponse = server
        .post(
            "/api/work",
            &WorkRequest {
                max: 1,
                wait_ms: 200,
            },
            &bob,
        )
        .await;
    assert!(empty.assignments.is_empty(), "{empty:?}");
    assert!(empty.waited_ms > 0);

    // The latency histogram counts service time only, not the time bob's requests waited.
    let waited_s = (got.waited_ms + empty.waited_ms) as f64 / 1000.0;
    let metrics = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let sum: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("iota_request_seconds_sum{route=\"/api/work\"} "))
        .unwrap_or_else(|| panic!("no /api/work latency in {metrics}"))
        .parse()
        .unwrap();
    assert!(
        sum < waited_s,
        "/api/work latency sum {sum} s includes the {waited_s} s of waiting"
    );
    server.stop().await;
}

/// `iota orchestrate` as a child process: ready once `/health` answers.
struct Child {
    child: std::process::Child,
}

impl Child {
    async fn start(config: &std::path::Path, addr: SocketAddr) -> Self {
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_iota"))
            .args(["orchestrate", "--config"])
            .arg(config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            if let Ok(resp) = reqwest::get(format!("http://{addr}/health")).await
                && resp.status().is_success()
            {
                break;
            }
            assert!(
                std::time::Instant::now() < until,
                "orchestrator did not start"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Self { child }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn kill_9_and_restart_keeps_registrations_and_the_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::net::free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let config = dir.path().join("run.yaml");
    std::fs::write(
        &config,
        format!(
            "run: srv\nbatch_size: 2\nseq_len: 8\neval_samples: 0\ndata: {{source: \"synthetic:1:20000\"}}\n\
             data_dir: {}\nlisten: {addr}\n",
            dir.path().join("state").display()
        ),
    )
    .unwrap();
    let client = Client { addr };
    let keys: Vec<Hotkey> = ["//Alice", "//Bob", "//Charlie"]
        .iter()
        .map(|u| Hotkey::from_uri(u).unwrap())
        .collect();
    let mut child = Child::start(&config, addr).await;
    for k in &keys {
        let _: RegisterResponse = client
            .post(
                "/api/register",
                &RegisterRequest {
                    device: "cpu".into(),
                    max_in_flight: 2,
                },
                k,
            )
            .await;
    }
    let work: WorkResponse = client
        .post("/api/work", &WorkRequest { max: 2, wait_ms: 0 }, &keys[0])
        .await;
    assert_eq!(work.assignments.len(), 2);
    // kill -9: no chance to flush anything.
    child.child.kill().unwrap();
    child.child.wait().unwrap();
    drop(child);

    let _child = Child::start(&config, addr).await;
    let status: StatusResponse = client.get("/api/status").await;
    let per_section: Vec<usize> = status.sections.iter().map(|s| s.miners.len()).collect();
    assert_eq!(per_section, vec![1, 1, 1]);
    assert_eq!(status.samples.in_flight, 2);
    // Alice is at her in-flight cap until those forwards expire; Bob still has his section.
    let reg: RegisterResponse = client
        .post(
            "/api/register",
            &RegisterRequest {
                device: "cpu".into(),
                max_in_flight: 2,
            },
            &keys[1],
        )
        .await;
    assert_eq!(reg.section, 1);
    let work: WorkResponse = client
        .post("/api/work", &WorkRequest { max: 2, wait_ms: 0 }, &keys[0])
        .await;
    assert!(work.assignments.is_empty());
}
