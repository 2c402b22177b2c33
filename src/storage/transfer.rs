//! Uploading to and downloading from presigned URLs: what miners and validators use, since
//! they hold no bucket credentials.
//!
//! Every successful transfer is counted in [`super::traffic::global`] by the kind of object
//! its URL names. Every transfer retries transient failures as described on [`RetryPolicy`]. URLs in errors
//! and logs have their query string removed, because a presigned URL's query is its
//! credential.

use std::ops::Range;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, RANGE, RETRY_AFTER};
use url::Url;

use super::retry::{RetryPolicy, is_transient_error, is_transient_status};
use super::store_error::{StorageError, StorageResult};
use super::traffic::{self, TrafficDir};

/// How long to wait for a TCP/TLS connection before counting the attempt as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a transfer may stall (no bytes either way) before it counts as failed. Large
/// transfers may take much longer than this in total; only silence is limited.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// An HTTP client for presigned URLs, with a retry policy. Cheap to clone (connections are
/// pooled and shared).
#[derive(Debug, Clone)]
pub struct UrlClient {
    http: reqwest::Client,
    policy: RetryPolicy,
}

impl UrlClient {
    /// A client retrying by `policy`.
    ///
    /// # Errors
    /// [`StorageError::Http`] when the TLS backend cannot be initialised.
    pub fn new(policy: RetryPolicy) -> StorageResult<Self> {
        let http = super::trust::client_builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .build()
            .map_err(|source| StorageError::Http {
                url: String::new(),
                attempts: 0,
                source,
            })?;
        Ok(Self { http, policy })
    }

    /// Uploads `bytes` with one `PUT` to `url` (a presigned PUT URL), as
    /// `application/octet-stream`.
    ///
    /// # Errors
    /// [`StorageError::HttpStatus`] for a non-2xx answer (at once for a non-transient 4xx,
    /// after the retries otherwise); [`StorageError::Http`] when the transport keeps failing.
    pub async fn upload(&self, url: &Url, bytes: Bytes) -> StorageResult<()> {
        let len = bytes.len() as u64;
        self.send(url, || {
            self.http
                .put(url.clone())
                .header(CONTENT_TYPE, "application/octet-stream")
                .body(bytes.clone())
        })
        .await?;
        traffic::global().record_key(url.path(), TrafficDir::Up, len);
        Ok(())
    }

    /// Downloads from `url` (a presigned GET URL) the whole object, or only `range` when given.
    /// An empty range returns no bytes without a request (HTTP cannot express one).
    ///
    /// # Errors
    /// [`StorageError::InvalidRange`] when `range.end < range.start`;
    /// [`StorageError::LengthMismatch`] when the server sends a different number of bytes than
    /// the range asked for (e.g. a range past the end); otherwise as [`UrlClient::upload`]
    /// (a range starting past the end gets status 416).
    pub async fn download(&self, url: &Url, range: Option<Range<u64>>) -> StorageResult<Bytes> {
        let Some(range) = range else {
            let body = self.send(url, || self.http.get(url.clone())).await?;
            traffic::global().record_key(url.path(), TrafficDir::Down, body.len() as u64);
            return Ok(body);
        };
        if range.end < range.start {
            return Err(StorageError::InvalidRange {
                key: redact(url),
                start: range.start,
                end: range.end,
            });
        }
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let header = format!("bytes={}-{}", range.start, range.end - 1);
        let expected = range.end - range.start;
        let body = self
            .send(url, || {
                self.http.get(url.clone()).header(RANGE, header.clone())
            })
            .await?;
        if body.len() as u64 != expected {
            return Err(StorageError::LengthMismatch {
                key: redact(url),
                expected,
                got: body.len() as u64,
            });
        }
        traffic::global().record_key(url.path(), TrafficDir::Down, expected);
        Ok(body)
    }

    /// Sends the request `build` makes until it succeeds or the policy gives up, and returns
    /// the response body.
    async fn send(
        &self,
        url: &Url,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> StorageResult<Bytes> {
        let mut attempt = 1;
        loop {
            let failure = match build().send().await {
                Ok(response) if response.status().is_success() => match response.bytes().await {
                    Ok(body) => return Ok(body),
                    Err(e) => Failure::Transport(e),
                },
                Ok(response) => Failure::Status(response.status(), retry_after(&response)),
                Err(e) => Failure::Transport(e),
            };
            let transient = match &failure {
                Failure::Status(status, _) => is_transient_status(status.as_u16()),
                Failure::Transport(e) => is_transient_error(e),
            };
            if !transient || !self.policy.may_retry(attempt) {
                return Err(failure.into_error(url, attempt));
            }
            let wait = self.policy.delay(attempt, failure.retry_after());
            tracing::debug!(
                url = %redact(url),
                attempt,
                wait_ms = wait.as_millis() as u64,
                "transient transfer failure, retrying"
            );
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }
}

/// Why one attempt failed.
enum Failure {
    Status(StatusCode, Option<Duration>),
    Transport(reqwest::Error),
}

impl Failure {
    fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Status(_, wait) => *wait,
            Self::Transport(_) => None,
        }
    }

    fn into_error(self, url: &Url, attempts: u32) -> StorageError {
        match self {
            Self::Status(status, _) => StorageError::HttpStatus {
                url: redact(url),
                status: status.as_u16(),
                attempts,
            },
            Self::Transport(source) => StorageError::Http {
                url: redact(url),
                attempts,
                source: source.without_url(),
            },
        }
    }
}

/// A `Retry-After` given in whole seconds on a 429 or 503 (the HTTP-date form is ignored).
fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    let status = response.status();
    if status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::SERVICE_UNAVAILABLE {
        return None;
    }
    let seconds: u64 = response
        .headers()
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds))
}

/// `url` without its query string and fragment (a presigned URL's query is a credential).
pub fn redact(url: &Url) -> String {
    let mut clean = url.clone();
    clean.set_query(None);
    clean.set_fragment(None);
    clean.to_string()
}

/// The shared client behind [`upload_to_url`] and [`download_from_url`].
fn default_client() -> StorageResult<&'static UrlClient> {
    static CLIENT: OnceLock<Result<UrlClient, String>> = OnceLock::new();
    CLIENT
        .get_or_init(|| UrlClient::new(RetryPolicy::default()).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|reason| StorageError::InvalidConfig {
            reason: reason.clone(),
        })
}

/// Uploads `bytes` to a presigned PUT `url` with the default [`RetryPolicy`], through one
/// client shared by the whole process.
///
/// # Errors
/// As [`UrlClient::upload`].
pub async fn upload_to_url(url: &Url, bytes: Bytes) -> StorageResult<()> {
    default_client()?.upload(url, bytes).await
}

/// Downloads from a presigned GET `url` the whole object or `range` of it, with the default
/// [`RetryPolicy`], through one client shared by the whole process.
///
/// # Errors
/// As [`UrlClient::download`].
pub async fn download_from_url(url: &Url, range: Option<Range<u64>>) -> StorageResult<Bytes> {
    default_client()?.download(url, range).await
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A canned answer: status, extra headers, body.
    type Canned = (u16, Vec<(&'static str, String)>, Vec<u8>);
    /// A recorded request: head (request line and headers), body.
    type Seen = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

    /// A one-thread HTTP/1.1 server on loopback that answers each connection with the next
    /// canned response and records the request head and body it got.
    struct Scripted {
        url: Url,
        requests: Seen,
        thread: Option<std::thread::JoinHandle<()>>,
    }

    impl Scripted {
        fn start(responses: Vec<Canned>) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = listener.local_addr().unwrap().port();
            let requests = Arc::new(Mutex::new(Vec::new()));
            let seen = requests.clone();
            let thread = std::thread::spawn(move || {
                for (status, headers, body) in responses {
                    let Ok((stream, _)) = listener.accept() else {
                        return;
                    };
                    let mut reader = BufReader::new(stream);
                    let mut head = String::new();
                    let mut length = 0usize;
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                            break;
                        }
                        let lower = line.to_ascii_lowercase();
                        if let Some(v) = lower.strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                        head.push_str(&line);
                    }
                    let mut got = vec![0; length];
                    let _ = reader.read_exact(&mut got);
                    seen.lock().unwrap().push((head, got));
                    let mut out = format!(
                        "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n",
                        body.len()
                    );
                    for (name, value) in headers {
                        out.push_str(&format!("{name}: {value}\r\n"));
                    }
                    out.push_str("\r\n");
                    let mut stream = reader.into_inner();
                    let _ = stream.write_all(out.as_bytes());
                    let _ = stream.write_all(&body);
                }
            });
            Self {
                url: Url::parse(&format!(
                    "http://127.0.0.1:{port}/obj?X-Amz-Signature=s3cr3t"
                ))
                .unwrap(),
                requests,
                thread: Some(thread),
            }
        }

        fn requests(mut self) -> Vec<(String, Vec<u8>)> {
            if let Some(t) = self.thread.take() {
                t.join().unwrap();
            }
            self.requests.lock().unwrap().clone()
        }
    }

    fn fast_policy(max_attempts: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
        }
    }

    #[tokio::test]
    async fn upload_retries_a_503_then_succeeds() {
        let server = Scripted::start(vec![
            (503, vec![], b"busy".to_vec()),
            (200, vec![], Vec::new()),
        ]);
        let client = UrlClient::new(fast_policy(3)).unwrap();
        client
            .upload(&server.url, Bytes::from_static(b"payload"))
            .await
            .unwrap();
        let requests = server.requests();
        assert_eq!(requests.len(), 2);
        for (head, body) in &requests {
            assert!(
                head.starts_with("PUT /obj?X-Amz-Signature=s3cr3t "),
                "{head}"
            );
            assert!(
                head.to_ascii_lowercase()
                    .contains("content-type: application/octet-stream"),
                "{head}"
            );
            assert_eq!(body, b"payload");
        }
    }

    #[tokio::test]
    async fn a_403_is_final_and_the_error_hides_the_signature() {
        let server = Scripted::start(vec![(403, vec![], b"denied".to_vec())]);
        let client = UrlClient::new(fast_policy(5)).unwrap();
        let err = client.download(&server.url, None).await.unwrap_err();
        match &err {
            StorageError::HttpStatus {
                url,
                status,
                attempts,
            } => {
                assert_eq!(*status, 403);
                assert_eq!(*attempts, 1);
                assert!(!url.contains("s3cr3t"), "{url}");
            }
            other => panic!("expected HttpStatus, got {other:?}"),
        }
        assert!(!err.to_string().contains("s3cr3t"));
        assert_eq!(server.requests().len(), 1);
    }

    #[tokio::test]
    async fn retries_stop_after_max_attempts() {
        let server = Scripted::start(vec![
            (429, vec![("retry-after", "0".into())], Vec::new()),
            (500, vec![], Vec::new()),
            (502, vec![], Vec::new()),
        ]);
        let client = UrlClient::new(fast_policy(3)).unwrap();
        let err = client.download(&server.url, None).await.unwrap_err();
        assert!(
            matches!(
                err,
                StorageError::HttpStatus {
                    status: 502,
                    attempts: 3,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(server.requests().len(), 3);
    }

    #[tokio::test]
    async fn range_download_sends_an_inclusive_range_header_and_checks_length() {
        let server = Scripted::start(vec![
            (206, vec![], b"cdef".to_vec()),
            (206, vec![], b"cd".to_vec()),
        ]);
        let client = UrlClient::new(fast_policy(1)).unwrap();
        let got = client.download(&server.url, Some(2..6)).await.unwrap();
        assert_eq!(got.as_ref(), b"cdef");
        let short = client.download(&server.url, Some(2..6)).await;
        assert!(
            matches!(
                short,
                Err(StorageError::LengthMismatch {
                    expected: 4,
                    got: 2,
                    ..
                })
            ),
            "{short:?}"
        );
        let requests = server.requests();
        // Bytes 2..6 are "bytes=2-5" in HTTP's inclusive notation.
        assert!(
            requests[0]
                .0
                .to_ascii_lowercase()
                .contains("range: bytes=2-5"),
            "{}",
            requests[0].0
        );
        assert!(
            client
                .download(&Url::parse("http://127.0.0.1:9/x").unwrap(), Some(3..3))
                .await
                .unwrap()
                .is_empty()
        );
    }

    #[tokio::test]
    async fn connection_refused_is_retried_then_reported() {
        // Bind then drop a listener to get a port that nobody listens on.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = Url::parse(&format!("http://127.0.0.1:{port}/x?sig=s3cr3t")).unwrap();
        let client = UrlClient::new(fast_policy(2)).unwrap();
        let err = client.download(&url, None).await.unwrap_err();
        assert!(
            matches!(err, StorageError::Http { attempts: 2, .. }),
            "{err:?}"
        );
        assert!(!format!("{err:?}").contains("s3cr3t"), "{err:?}");
    }

    #[test]
    fn redact_drops_query_and_fragment() {
        let url = Url::parse("https://h.example/b/k?X-Amz-Signature=abc#frag").unwrap();
        assert_eq!(redact(&url), "https://h.example/b/k");
    }
}
