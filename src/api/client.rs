//! A client of the orchestrator API, for miners and `iota local`.
//!
//! Every `POST` body is serialised once and signed with the client's hotkey for the run
//! ([`crate::wallet::signing::sign_request`]); each attempt is signed afresh (a new timestamp),
//! because the server refuses a replayed signature. Transient failures (connection errors,
//! timeouts, 5xx, 429, 408) are retried with exponential backoff by a [`RetryPolicy`], so a
//! miner rides out an orchestrator restart; any other 4xx comes back at once as
//! [`ClientError::Api`] carrying the server's [`ApiError`] code.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::CONTENT_TYPE;
use serde::Serialize;
use serde::de::DeserializeOwned;
use thiserror::Error;
use url::Url;

use super::merge::{MergeStatus, MergeSubmitRequest, MergeTaskRequest, MergeTaskResponse};
use super::types::{
    ApiError, Health, HeartbeatRequest, HeartbeatResponse, RegisterRequest, RegisterResponse,
    ReleaseRequest, RunInfo, StatusResponse, SubmitRequest, SubmitResponse, WorkRequest,
    WorkResponse,
};
use super::validator::{
    EpochLedger, LedgerRequest, MergeRecord, MergeRecordRequest, MetagraphView, MinerWork,
    MinerWorkRequest, SampleBlobs, SamplesRequest, ValidatorRegisterRequest,
    ValidatorRegisterResponse, WeightSubmission,
};
use crate::storage::retry::{RetryPolicy, is_transient_error, is_transient_status};
use crate::storage::trust::{CertificateProblem, UntrustedCertificate, certificate_problem};
use crate::wallet::keys::Hotkey;
use crate::wallet::signing::{RequestLine, sign_request};

/// How long one request may take in all before the attempt counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why an API call failed.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The base URL or an endpoint path is not a valid URL.
    #[error("invalid orchestrator URL {url:?}: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// The parser's complaint.
        reason: String,
    },
    /// The server refused the request with a non-transient status and an [`ApiError`] body
    /// (`code` is `unknown` when the body was not one).
    #[error("{endpoint}: HTTP {status} {code}: {message}")]
    Api {
        /// The endpoint path.
        endpoint: String,
        /// The HTTP status.
        status: u16,
        /// The stable error code (`not_registered`, `conflict`, ...).
        code: String,
        /// The server's explanation.
        message: String,
    },
    /// The server kept failing (transport errors or transient statuses) until the retry
    /// policy gave up.
    #[error("{endpoint}: orchestrator unreachable after {attempts} attempts: {reason}")]
    Unreachable {
        /// The endpoint path.
        endpoint: String,
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        reason: String,
    },
    /// A 2xx response whose body is not the expected JSON.
    #[error("{endpoint}: malformed response: {reason}")]
    BadResponse {
        /// The endpoint path.
        endpoint: String,
        /// The decoder's complaint.
        reason: String,
    },
    /// The HTTP client could not be built (TLS initialisation).
    #[error("cannot build the HTTP client: {0}")]
    Build(String),
    /// The orchestrator's TLS certificate was refused (not retried).
    #[error(transparent)]
    Certificate(#[from] UntrustedCertificate),
    /// The orchestrator speaks another API version than this binary.
    #[error(
        "the orchestrator speaks API v{server_api} (iota {server_version}), this iota {} speaks v{}",
        env!("CARGO_PKG_VERSION"),
        super::types::API_VERSION
    )]
    Version {
        /// The orchestrator's [`super::types::API_VERSION`].
        server_api: u32,
        /// The orchestrator's release.
        server_version: String,
    },
}

impl ClientError {
    /// The [`ApiError`] code when the server answered with one.
    pub fn api_code(&self) -> Option<&str> {
        match self {
            Self::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// What the user should do about it, in one sentence, when there is something to do.
    pub fn advice(&self) -> Option<String> {
        match self {
            Self::Unreachable { .. } => Some(
                "check the orchestrator URL (scheme, host, port) and that it is running: `iota status --orchestrator URL` answers when it is; a firewall gives the same error".into(),
            ),
            Self::BadUrl { .. } => Some(
                "give the orchestrator as http://HOST:PORT or https://HOST (flag --orchestrator, IOTA_ORCHESTRATOR or `iota setup`)".into(),
            ),
            Self::Api { code, .. } => match code.as_str() {
                "not_registered" => Some(
                    "register the hotkey first: `iota register` (`iota mine` registers by itself at start)".into(),
                ),
                "stale" => Some(
                    "this machine's clock is off by more than 30 s: enable time sync (`timedatectl set-ntp true`)".into(),
                ),
                "not_a_validator" => Some(
                    "the run does not list this hotkey as a validator: give its address (`iota wallet show`) to the operator, who adds it under `validators:` in the run config".into(),
                ),
                "conflict" => Some(
                    "the run has no free place now: try again later or join another orchestrator".into(),
                ),
                _ => None,
            },
            Self::Version { server_version, .. } => Some(format!(
                "install the orchestrator's release: `curl -sSf <release-url>/install.sh | IOTA_VERSION={server_version} sh`"
            )),
            Self::BadResponse { .. } => Some(
                "the URL answers but is not an iota orchestrator: check --orchestrator".into(),
            ),
            Self::Build(_) => None,
            Self::Certificate(e) => Some(e.advice()),
        }
    }
}

/// The policy a miner uses: many attempts, backoff capped at 5 s (rides out about two minutes
/// of orchestrator downtime).
pub fn patient_policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 30,
        initial_backoff: Duration::from_millis(200),
        max_backoff: Duration::from_secs(5),
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A signed client of one orchestrator for one hotkey. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    base: Url,
    hotkey: Option<Hotkey>,
    run: String,
    policy: RetryPolicy,
}

/// What one attempt produced, when it did not succeed.
enum Attempt {
    /// Retry may help.
    Transient(String),
    /// Final.
    Fatal(ClientError),
}

impl ApiClient {
    /// A client of the orchestrator at `base` (e.g. `http://127.0.0.1:8700`) that signs with
    /// `hotkey` (None: public endpoints only), retrying by `policy`. Asks `GET /api/run` for
    /// the run name it signs for, and checks that the server speaks this binary's API version.
    ///
    /// # Errors
    /// A bad URL, the server unreachable / answering garbage, or [`ClientError::Version`].
    pub async fn connect(
        base: &str,
        hotkey: Option<Hotkey>,
        policy: RetryPolicy,
    ) -> Result<Self, ClientError> {
        let mut client = Self::new(base, hotkey, String::new(), policy)?;
        let info = client.run_info().await?;
        if info.api_version != super::types::API_VERSION {
            return Err(ClientError::Version {
                server_api: info.api_version,
                server_version: info.version,
            });
        }
        client.run = info.run;
        Ok(client)
    }

    /// A client that signs for `run` without asking the server (see [`Self::connect`]).
    ///
    /// # Errors
    /// [`ClientError::BadUrl`] or [`ClientError::Build`].
    pub fn new(
        base: &str,
        hotkey: Option<Hotkey>,
        run: String,
        policy: RetryPolicy,
    ) -> Result<Self, ClientError> {
        let base = Url::parse(base.trim_end_matches('/')).map_err(|e| ClientError::BadUrl {
            url: base.to_string(),
            reason: e.to_string(),
        })?;
        let http = crate::storage::trust::client_builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| ClientError::Build(e.to_string()))?;
        Ok(Self {
            http,
            base,
            hotkey,
            run,
            policy,
        })
    }

    /// The run this client signs for.
    pub fn run(&self) -> &str {
        &self.run
    }

    /// The base URL.
    pub fn base(&self) -> &Url {
        &self.base
    }

    /// The signing hotkey's SS58 address, if any.
    pub fn address(&self) -> Option<String> {
        self.hotkey.as_ref().map(|k| k.address().to_string())
    }

    fn url(&self, path: &str) -> Result<Url, ClientError> {
        self.base.join(path).map_err(|e| ClientError::BadUrl {
            url: format!("{}{path}", self.base),
            reason: e.to_string(),
        })
    }

    /// `GET /health`.
    ///
    /// # Errors
    /// As [`Self::connect`].
    pub async fn health(&self) -> Result<Health, ClientError> {
        self.get("/health").await
    }

    /// `GET /api/run`.
    ///
    /// # Errors
    /// As [`Self::connect`].
    pub async fn run_info(&self) -> Result<RunInfo, ClientError> {
        self.get("/api/run").await
    }

    /// `GET /api/status`.
    ///
    /// # Errors
    /// As [`Self::connect`].
    pub async fn status(&self) -> Result<StatusResponse, ClientError> {
        self.get("/api/status").await
    }

    /// `POST /api/register`.
    ///
    /// # Errors
    /// [`ClientError::Api`] when refused, otherwise as [`Self::connect`].
    pub async fn register(&self, req: &RegisterRequest) -> Result<RegisterResponse, ClientError> {
        self.post("/api/register", req).await
    }

    /// `POST /api/heartbeat`.
    ///
    /// # Errors
    /// As [`Self::register`].
    pub async fn heartbeat(
        &self,
        req: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse, ClientError> {
        self.post("/api/heartbeat", req).await
    }

    /// `POST /api/work`.
    ///
    /// # Errors
    /// As [`Self::register`].
    pub async fn work(&self, req: &WorkRequest) -> Result<WorkResponse, ClientError> {
        self.post("/api/work", req).await
    }

    /// `POST /api/submit`.
    ///
    /// # Errors
    /// As [`Self::register`].
    pub async fn submit(&self, req: &SubmitRequest) -> Result<SubmitResponse, ClientError> {
        self.post("/api/submit", req).await
    }

    /// `POST /api/release`.
    ///
    /// # Errors
    /// As [`Self::register`].
    pub async fn release(&self, req: &ReleaseRequest) -> Result<SubmitResponse, ClientError> {
        self.post("/api/release", req).await
    }

    /// `POST /api/merge/task`.
    ///
    /// # Errors
    /// As [`Self::register`].
    pub async fn merge_task(
        &self,
        req: &MergeTaskRequest,
    ) -> Result<MergeTaskResponse, ClientError> {
        self.post("/api/merge/task", req).await
    }

    /// `POST /api/merge/submit`.
    ///
    /// # Errors
    /// As [`Self::register`].
    pub async fn merge_submit(
        &self,
        req: &MergeSubmitRequest,
    ) -> Result<SubmitResponse, ClientError> {
        self.post("/api/merge/submit", req).await
    }

    /// `GET /api/merge/status`.
    ///
    /// # Errors
    /// As [`Self::connect`].
    pub async fn merge_status(&self) -> Result<MergeStatus, ClientError> {
        self.get("/api/merge/status").await
    }

    /// `POST /api/validator/register` (the client's hotkey must be a listed validator).
    ///
    /// # Errors
    /// As [`Self::register`].
    pub async fn register_validator(
        &self,
        req: &ValidatorRegisterRequest,
    ) -> Result<ValidatorRegisterResponse, ClientError> {
        self.post("/api/validator/register", req).await
    }

    /// `POST /api/validator/ledger`.
    ///
    /// # Errors
    /// As [`Self::register`].
    pub async fn ledger(&self, epoch: u64) -> Result<EpochLedger, ClientError> {
        self.post("/api/validator/ledger", &LedgerRequest { epoch })
            .await
    }

    /// `POST /api/validator/work`.
    ///
    /// # Errors
    /// As [`Self::register`].
    pub async fn miner_work(&self, epoch: u64, miner: &str) -> Result<MinerWork, ClientError> {
        let req = MinerWorkRequest {
            epoch,
            miner: miner.to_string(),
        };
        self.post("/api/validator/work", &req).await
    }

    /// `POST /api/validator/merge`.
    ///
    /// # Errors
    /// As [`Self::register`].
    pub async fn merge_record(
        &self,
        epoch: u64,
        section: usize,
    ) -> Result<MergeRecord, ClientError> {
        self.post(
            "/api/validator/merge",
            &MergeRecordRequest { epoch, section },
        )
        .await
    }

    /// `POST /api/validator/samples`.
    ///
    /// # Errors
    /// As [`Self::register`].
    pub async fn sample_blobs(
        &self,
        epoch: u64,
        samples: Vec<u64>,
    ) -> Result<SampleBlobs, ClientError> {
        self.post("/api/validator/samples", &SamplesRequest { epoch, samples })
            .await
    }

    /// `POST /api/weights`.
    ///
    /// # Errors
    /// As [`Self::register`].
    pub async fn publish_weights(
        &self,
        req: &WeightSubmission,
    ) -> Result<SubmitResponse, ClientError> {
        self.post("/api/weights", req).await
    }

    /// `GET /api/weights`.
    ///
    /// # Errors
    /// As [`Self::connect`].
    pub async fn metagraph(&self) -> Result<MetagraphView, ClientError> {
        self.get("/api/weights").await
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let url = self.url(path)?;
        self.with_retries(path, || self.http.get(url.clone())).await
    }

    async fn post<Q: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &Q,
    ) -> Result<T, ClientError> {
        let url = self.url(path)?;
        let body = serde_json::to_vec(body).map_err(|e| ClientError::BadResponse {
            endpoint: path.to_string(),
            reason: format!("cannot serialise the request: {e}"),
        })?;
        self.with_retries(path, || {
            let mut request = self
                .http
                .post(url.clone())
                .header(CONTENT_TYPE, "application/json")
                .body(body.clone());
            if let Some(key) = &self.hotkey {
                let target = match url.query() {
                    Some(q) => format!("{}?{q}", url.path()),
                    None => url.path().to_string(),
                };
                let headers =
                    sign_request(key, RequestLine::post(&target), &body, now_ms(), &self.run);
                for (name, value) in headers.to_pairs() {
                    request = request.header(name, value);
                }
            }
            request
        })
        .await
    }

    async fn with_retries<T: DeserializeOwned>(
        &self,
        path: &str,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<T, ClientError> {
        let mut attempt = 1;
        loop {
            let reason = match self.attempt(path, build()).await {
                Ok(value) => return Ok(value),
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Transient(reason)) => reason,
            };
            if !self.policy.may_retry(attempt) {
                return Err(ClientError::Unreachable {
                    endpoint: path.to_string(),
                    attempts: attempt,
                    reason,
                });
            }
            let wait = self.policy.delay(attempt, None);
            tracing::debug!(path, attempt, %reason, "orchestrator request failed, retrying");
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    /// The error for a refused server certificate (`err` holds rustls's verdict).
    fn untrusted(&self, err: &reqwest::Error) -> ClientError {
        ClientError::Certificate(UntrustedCertificate {
            url: self.base.as_str().trim_end_matches('/').to_string(),
            problem: certificate_problem(err).unwrap_or(CertificateProblem::Other),
        })
    }

    async fn attempt<T: DeserializeOwned>(
        &self,
        path: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<T, Attempt> {
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) if certificate_problem(&e).is_some() => {
                return Err(Attempt::Fatal(self.untrusted(&e)));
            }
            Err(e) if is_transient_error(&e) => {
                return Err(Attempt::Transient(e.without_url().to_string()));
            }
            Err(e) => {
                return Err(Attempt::Fatal(ClientError::Unreachable {
                    endpoint: path.to_string(),
                    attempts: 1,
                    reason: e.without_url().to_string(),
                }));
            }
        };
        let status = response.status().as_u16();
        let body = match response.bytes().await {
            Ok(b) => b,
            Err(e) => return Err(Attempt::Transient(e.without_url().to_string())),
        };
        if (200..300).contains(&status) {
            return serde_json::from_slice(&body).map_err(|e| {
                Attempt::Fatal(ClientError::BadResponse {
                    endpoint: path.to_string(),
                    reason: e.to_string(),
                })
            });
        }
        if is_transient_status(status) {
            return Err(Attempt::Transient(format!("HTTP {status}")));
        }
        Err(Attempt::Fatal(api_error(path, status, &body)))
    }
}

/// The typed error for a refused request with body `body`.
fn api_error(path: &str, status: u16, body: &[u8]) -> ClientError {
    let (code, message) = match serde_json::from_slice::<ApiError>(body) {
        Ok(e) => (e.code, e.message),
        Err(_) => (
            "unknown".to_string(),
            String::from_utf8_lossy(body).chars().take(200).collect(),
        ),
    };
    ClientError::Api {
        endpoint: path.to_string(),
        status,
        code,
        message,
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::wallet::signing::{SignedHeaders, verify_request};

    /// Requests recorded by [`serve`]: head, body.
    type Seen = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

    /// Serves the canned `(status, body)` answers in order, one per connection, and records
    /// each request's headers and body.
    fn serve(answers: Vec<(u16, String)>) -> (String, Seen) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for (status, body) in answers {
                let (stream, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut head = String::new();
                let mut len = 0usize;
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if line == "\r\n" || line.is_empty() {
                        break;
                    }
                    let lower = line.to_ascii_lowercase();
                    if let Some(v) = lower.strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap();
                    }
                    head.push_str(&line);
                }
                let mut req_body = vec![0; len];
                reader.read_exact(&mut req_body).unwrap();
                log.lock().unwrap().push((head, req_body));
                let mut stream = stream;
                write!(
                    stream,
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
                .unwrap();
            }
        });
        (format!("http://{addr}"), seen)
    }

    fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
        let name = name.to_ascii_lowercase();
        head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            (n.to_ascii_lowercase() == name).then(|| v.trim())
        })
    }

    fn fast() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(2),
        }
    }

    #[tokio::test]
    async fn posts_are_signed_for_the_run_and_retried_after_5xx() {
        let key = Hotkey::from_uri("//Alice").unwrap();
        let (base, seen) = serve(vec![
            (
                200,
                r#"{"run":"r1","model":null,"phase":"training","epoch":0}"#.into(),
            ),
            (
                503,
                r#"{"code":"internal","message":"internal error"}"#.into(),
            ),
            (200, r#"{"assignments":[],"phase":"training"}"#.into()),
        ]);
        // /api/run with a null model does not parse: build the client without it.
        let client = ApiClient::new(&base, Some(key.clone()), "r1".into(), fast()).unwrap();
        assert!(matches!(
            client.run_info().await,
            Err(ClientError::BadResponse { .. })
        ));
        let work = client
            .work(&WorkRequest { max: 2, wait_ms: 0 })
            .await
            .unwrap();
        assert!(work.assignments.is_empty());
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3, "one GET, one refused POST, one retry");
        let (head, body) = &seen[2];
        assert_eq!(body.as_slice(), br#"{"max":2,"wait_ms":0}"#);
        let headers = SignedHeaders::from_lookup(|name| header(head, name)).unwrap();
        assert_eq!(headers.signed_for, "r1");
        assert_eq!(headers.hotkey, key.address().to_string());
        let now = now_ms();
        let line = RequestLine::post("/api/work");
        assert!(verify_request(&headers, line, body, now, 30_000, "r1").is_ok());
        assert!(
            verify_request(
                &headers,
                RequestLine::post("/api/heartbeat"),
                body,
                now,
                30_000,
                "r1"
            )
            .is_err(),
            "the signature names its path"
        );
    }

    #[tokio::test]
    async fn client_errors_are_typed_and_not_retried() {
        let key = Hotkey::from_uri("//Bob").unwrap();
        let (base, seen) = serve(vec![(
            403,
            r#"{"code":"not_registered","message":"register first"}"#.into(),
        )]);
        let client = ApiClient::new(&base, Some(key), "r1".into(), fast()).unwrap();
        let err = client
            .heartbeat(&HeartbeatRequest {
                usage: None,
                forwards: 0,
                backwards: 0,
                steps: 0,
                weights_epoch: 0,
                weights_hash: None,
            })
            .await
            .unwrap_err();
        assert_eq!(err.api_code(), Some("not_registered"));
        assert!(matches!(err, ClientError::Api { status: 403, .. }));
        assert_eq!(seen.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn unreachable_server_gives_up_after_the_policy() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let client = ApiClient::new(
            &format!("http://127.0.0.1:{port}"),
            None,
            "r".into(),
            fast(),
        )
        .unwrap();
        let err = client.health().await.unwrap_err();
        assert!(
            matches!(err, ClientError::Unreachable { attempts: 3, .. }),
            "{err}"
        );
    }
}
