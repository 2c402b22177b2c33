//! A harness driving the orchestrator's router in-process (`tower::ServiceExt::oneshot`) with
//! real sr25519 hotkeys, an in-memory object store and a hand-moved clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tower::ServiceExt;

use iota::api::*;
use iota::data::{DataSpec, Dataset, Tokenizer};
use iota::orchestrator::blob_token::BlobSecret;
use iota::orchestrator::{AppState, Repository, RunConfig, router};
use iota::storage::{Storage, WireDtype, encode, payload_hash};
use iota::wallet::Hotkey;

pub use super::signed::signed_raw;

pub const T0: u64 = 1_767_225_600_000;

pub struct Harness {
    pub state: AppState,
    pub app: Router,
    pub now: Arc<AtomicU64>,
}

/// The test run's config plus `extra` YAML lines (which may replace the model). Evaluation
/// through the network is off unless `extra` sets `eval_samples` (routing tests follow
/// training samples); placement is `ordered`, 1000 new keys at once, unless `extra` sets `placement`
/// (the tests' miners fill the sections in the order they register, all from one address).
pub fn config(extra: &str) -> RunConfig {
    let model = if extra.contains("model:") {
        ""
    } else {
        "model: {preset: tiny}\n"
    };
    let eval = if extra.contains("eval_samples:") {
        ""
    } else {
        "eval_samples: 0\n"
    };
    let placement = if extra.contains("placement:") {
        ""
    } else {
        "placement: {ordered: true, new_keys: {burst: 1000}}\n"
    };
    RunConfig::from_yaml(&format!(
        "run: test-run\n{model}{eval}{placement}batch_size: 2\nseq_len: 8\nwire: f32\n\
         max_in_flight: 2\ndeadlines: {{forward_s: 10, backward_s: 20}}\n\
         public_url: http://orch.test\n{extra}"
    ))
    .unwrap()
}

pub fn dataset(cfg: &RunConfig) -> Dataset {
    let spec = DataSpec::Synthetic {
        seed: 0,
        chars: 20_000,
    };
    Dataset::load(&spec, &Tokenizer::byte(), cfg.seq_len, cfg.seed).unwrap()
}

pub fn harness_with(cfg: RunConfig, repo: Repository) -> Harness {
    harness_on(cfg, repo, Storage::in_memory(), T0)
}

/// A harness on `storage` (e.g. a real directory, whose transfers take real time) with the
/// clock at `now`.
pub fn harness_on(cfg: RunConfig, repo: Repository, storage: Storage, now: u64) -> Harness {
    let now = Arc::new(AtomicU64::new(now));
    let clock_now = now.clone();
    let data = dataset(&cfg);
    let state = AppState::from_parts(
        cfg,
        repo,
        storage,
        data,
        BlobSecret::from_bytes([3; 32]),
        Arc::new(move || clock_now.load(Ordering::SeqCst)),
    )
    .unwrap();
    Harness {
        app: router(state.clone()),
        state,
        now,
    }
}

pub fn harness() -> Harness {
    harness_with(config(""), Repository::open_in_memory().unwrap())
}

pub fn key(uri: &str) -> Hotkey {
    Hotkey::from_uri(uri).unwrap()
}

impl Harness {
    pub fn now(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    pub fn advance(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }

    pub fn signed(&self, path: &str, body: &impl Serialize, hotkey: &Hotkey) -> Request<Body> {
        signed_raw(
            path,
            serde_json::to_vec(body).unwrap(),
            hotkey,
            self.now(),
            "test-run",
        )
    }

    pub async fn send(&self, req: Request<Body>) -> (StatusCode, Vec<u8>) {
        let resp = self.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec();
        (status, bytes)
    }

    pub async fn call<T: DeserializeOwned>(&self, req: Request<Body>) -> T {
        let (status, bytes) = self.send(req).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{}",
            String::from_utf8_lossy(&bytes)
        );
        serde_json::from_slice(&bytes).unwrap()
    }

    pub async fn register(&self, hotkey: &Hotkey) -> RegisterResponse {
        let body = RegisterRequest {
            device: "cpu".into(),
            max_in_flight: 4,
        };
        self.call(self.signed("/api/register", &body, hotkey)).await
    }

    pub async fn work(&self, hotkey: &Hotkey, max: usize) -> Vec<Assignment> {
        let resp: WorkResponse = self
            .call(self.signed("/api/work", &WorkRequest { max, wait_ms: 0 }, hotkey))
            .await;
        resp.assignments
    }

    /// Uploads `bytes` through the PUT URL of `blob` (the `/blob` endpoint).
    pub async fn upload(&self, blob: &BlobRef, bytes: Vec<u8>) {
        let path = blob.url.strip_prefix("http://orch.test").unwrap();
        let req = Request::put(path).body(Body::from(bytes)).unwrap();
        let (status, body) = self.send(req).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    }

    /// Downloads the object behind a GET URL of the `/blob` endpoint.
    pub async fn get_blob(&self, blob: &BlobRef) -> Vec<u8> {
        let path = blob.url.strip_prefix("http://orch.test").unwrap();
        let (status, body) = self
            .send(Request::get(path).body(Body::empty()).unwrap())
            .await;
        assert_eq!(status, StatusCode::OK);
        body
    }

    pub async fn submit(
        &self,
        hotkey: &Hotkey,
        a: &Assignment,
        bytes: Option<Vec<u8>>,
        loss: Option<f32>,
    ) -> SubmitResponse {
        let (hash, len) = match bytes {
            Some(bytes) => {
                let out = (Some(payload_hash(&bytes)), Some(bytes.len() as u64));
                self.upload(a.output.as_ref().unwrap(), bytes).await;
                out
            }
            None => (None, None),
        };
        let body = SubmitRequest {
            assignment_id: a.id,
            output_hash: hash,
            output_bytes: len,
            loss,
            timings: Timings::default(),
        };
        self.call(self.signed("/api/submit", &body, hotkey)).await
    }

    /// Everything a refused request must leave alone.
    pub fn snapshot(&self) -> String {
        let repo = &self.state.repo;
        let mut out = format!(
            "{:?}\n{:?}\n{:?}\nsignatures {}\n",
            repo.run_state().unwrap(),
            repo.miners().unwrap(),
            repo.counts().unwrap(),
            repo.signature_count().unwrap()
        );
        for s in 0..4 {
            out.push_str(&format!(
                "{:?} {:?}\n",
                repo.sample(s).unwrap(),
                repo.assignments_of(s, 2).unwrap()
            ));
        }
        out
    }
}

pub fn activation(shape: &[usize], value: f32) -> Vec<u8> {
    let n: usize = shape.iter().product();
    encode(shape, &vec![value; n], WireDtype::F32).unwrap()
}

pub fn error_code(bytes: &[u8]) -> String {
    serde_json::from_slice::<ApiError>(bytes).unwrap().code
}

/// A weight vector of `epoch` with `burn`, each miner's parts all 1 and its score its weight.
pub fn weights(epoch: u64, burn: f64, w: &[(&Hotkey, f64)]) -> WeightSubmission {
    WeightSubmission {
        epoch,
        burn,
        weights: w
            .iter()
            .map(|(k, x)| MinerWeight {
                hotkey: k.address().to_string(),
                weight: *x,
                parts: ScoreParts {
                    throughput: 1.0,
                    replay: 1.0,
                    upload: 1.0,
                    clasp: 1.0,
                    quality: 1.0,
                    penalties: vec![],
                    penalty: 0.0,
                    flags: vec![],
                    notes: vec![],
                    score: *x,
                },
            })
            .collect(),
    }
}
