//! Signed POSTs, the way miners send them: in-process through the router
//! (`tower::ServiceExt::oneshot`) or over real HTTP.

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tower::ServiceExt;

use iota::wallet::{Hotkey, RequestLine, sign_request};

use super::net::now_ms;

/// A POST of `body` to `path`, signed by `hotkey` at `ts` for `run`.
pub fn signed_raw(path: &str, body: Vec<u8>, hotkey: &Hotkey, ts: u64, run: &str) -> Request<Body> {
    let headers = sign_request(hotkey, RequestLine::post(path), &body, ts, run);
    let mut req = Request::post(path).header("content-type", "application/json");
    for (name, value) in headers.to_pairs() {
        req = req.header(name, value);
    }
    req.body(Body::from(body)).unwrap()
}

/// Signs `body` now, sends it through `app` and decodes the 200 answer (panics otherwise).
pub async fn post_oneshot<T: DeserializeOwned>(
    app: Router,
    path: &str,
    body: &impl Serialize,
    key: &Hotkey,
    run: &str,
) -> T {
    let req = signed_raw(path, serde_json::to_vec(body).unwrap(), key, now_ms(), run);
    let resp = app.oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        status,
        StatusCode::OK,
        "{path}: {}",
        String::from_utf8_lossy(&bytes)
    );
    serde_json::from_slice(&bytes).unwrap()
}

/// Signs `body` now, POSTs it to `{base}{path}` over HTTP and decodes the 2xx answer (panics
/// otherwise).
pub async fn post_http<T: DeserializeOwned>(
    base: &str,
    path: &str,
    body: &impl Serialize,
    key: &Hotkey,
    run: &str,
) -> T {
    let body = serde_json::to_vec(body).unwrap();
    let mut req = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .header("content-type", "application/json");
    for (name, value) in sign_request(key, RequestLine::post(path), &body, now_ms(), run).to_pairs()
    {
        req = req.header(name, value);
    }
    let resp = req.body(body).send().await.unwrap();
    let status = resp.status();
    let bytes = resp.bytes().await.unwrap();
    assert!(
        status.is_success(),
        "{path}: {status} {}",
        String::from_utf8_lossy(&bytes)
    );
    serde_json::from_slice(&bytes).unwrap()
}
