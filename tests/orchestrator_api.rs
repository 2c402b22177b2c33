//! The orchestrator's HTTP API driven through its router (`tower::ServiceExt::oneshot`), with
//! real sr25519 hotkeys, an in-memory object store and a hand-moved clock.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Body;
use axum::http::{Request, StatusCode};

use common::api_harness::*;
use common::net::now_ms;
use http_body_util::BodyExt;
use iota::api::*;
use iota::orchestrator::admission::PeerAddr;
use iota::orchestrator::{AppState, Repository, RunConfig, enforce_deadlines, router};
use iota::storage::{WireDtype, encode, payload_hash};
use iota::wallet::Hotkey;
use tower::ServiceExt;

/// A harness whose penalties keep nobody from work (back-off 0, no exclusion): for tests of
/// how work is re-offered, where one miner per section retries at once. The back-off itself is
/// tested in `orchestrator::repo::tests` and `r9_a_failing_miner_is_backed_off_over_http`.
fn retrying_harness() -> Harness {
    harness_with(
        config("penalties: {backoff_s: 0, exclude_after: 1000}\n"),
        Repository::open_in_memory().unwrap(),
    )
}

#[tokio::test]
async fn public_endpoints_answer() {
    let h = harness();
    let health: Health = h
        .call(Request::get("/health").body(Body::empty()).unwrap())
        .await;
    assert_eq!(health.status, "ok");
    let run: RunInfo = h
        .call(Request::get("/api/run").body(Body::empty()).unwrap())
        .await;
    assert_eq!(
        (run.run.as_str(), run.phase, run.epoch),
        ("test-run", Phase::Training, 0)
    );
    let status: StatusResponse = h
        .call(Request::get("/api/status").body(Body::empty()).unwrap())
        .await;
    assert_eq!(status.sections.len(), 3);
    assert_eq!(status.samples, SampleCounts::default());
    let (code, body) = h
        .send(Request::get("/metrics").body(Body::empty()).unwrap())
        .await;
    assert_eq!(code, StatusCode::OK);
    let text = String::from_utf8(body).unwrap();
    assert!(
        text.contains("iota_samples_total{outcome=\"completed\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("iota_section_miners{section=\"2\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("iota_requests_total{route=\"/api/status\",status=\"200\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn refused_requests_change_nothing() {
    let h = harness();
    let alice = key("//Alice");
    h.register(&alice).await;
    let work = serde_json::to_vec(&WorkRequest { max: 1, wait_ms: 0 }).unwrap();
    let before = h.snapshot();

    // Unsigned.
    let req = Request::post("/api/work")
        .body(Body::from(work.clone()))
        .unwrap();
    let (code, body) = h.send(req).await;
    assert_eq!(
        (code, error_code(&body).as_str()),
        (StatusCode::UNAUTHORIZED, "unauthorized")
    );
    assert_eq!(h.snapshot(), before, "unsigned");

    // Bad signature: signed for one body, sent with another.
    let good = h.signed("/api/work", &WorkRequest { max: 1, wait_ms: 0 }, &alice);
    let (parts, _) = good.into_parts();
    let tampered = Request::from_parts(
        parts,
        Body::from(serde_json::to_vec(&WorkRequest { max: 9, wait_ms: 0 }).unwrap()),
    );
    let (code, _) = h.send(tampered).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    assert_eq!(h.snapshot(), before, "bad signature");

    // Signed for another run.
    let (code, _) = h
        .send(signed_raw(
            "/api/work",
            work.clone(),
            &alice,
            h.now(),
            "other-run",
        ))
        .await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    assert_eq!(h.snapshot(), before, "wrong run");

    // Stale, both ways.
    for ts in [h.now() - 30_001, h.now() + 30_001] {
        let (code, body) = h
            .send(signed_raw(
                "/api/work",
                work.clone(),
                &alice,
                ts,
                "test-run",
            ))
            .await;
        assert_eq!(
            (code, error_code(&body).as_str()),
            (StatusCode::UNAUTHORIZED, "stale")
        );
    }
    assert_eq!(h.snapshot(), before, "stale");

    // Signed for another endpoint: a heartbeat's signature presented with the same body at
    // /api/work is refused (the signature covers the method and path).
    let body_bytes = serde_json::to_vec(&WorkRequest { max: 1, wait_ms: 0 }).unwrap();
    let moved = signed_raw(
        "/api/heartbeat",
        body_bytes.clone(),
        &alice,
        h.now(),
        "test-run",
    );
    let (mut parts, _) = moved.into_parts();
    parts.uri = "/api/work".parse().unwrap();
    let (code, _) = h
        .send(Request::from_parts(parts, Body::from(body_bytes)))
        .await;
    assert_eq!(code, StatusCode::UNAUTHORIZED, "signed for another path");
    assert_eq!(h.snapshot(), before, "signed for another path");

    // Unregistered.
    let (code, body) = h
        .send(h.signed(
            "/api/work",
            &WorkRequest { max: 1, wait_ms: 0 },
            &key("//Bob"),
        ))
        .await;
    assert_eq!(
        (code, error_code(&body).as_str()),
        (StatusCode::FORBIDDEN, "not_registered")
    );
    assert_eq!(h.snapshot(), before, "unregistered");

    // Malformed body, correctly signed.
    let (code, body) = h
        .send(signed_raw(
            "/api/work",
            b"{\"max\": \"x\"}".to_vec(),
            &alice,
            h.now(),
            "test-run",
        ))
        .await;
    assert_eq!(
        (code, error_code(&body).as_str()),
        (StatusCode::BAD_REQUEST, "bad_request")
    );
    assert_eq!(h.snapshot(), before, "malformed");

    // Oversized body.
    let big = vec![b' '; 100_000];
    let (code, _) = h
        .send(signed_raw("/api/work", big, &alice, h.now(), "test-run"))
        .await;
    assert_eq!(code, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(h.snapshot(), before, "oversized");

    // Replayed: the first copy is served, the second refused with 409 and no change.
    let ts = h.now();
    let first = signed_raw(
        "/api/heartbeat",
        serde_json::to_vec(&HeartbeatRequest {
            usage: None,
            forwards: 0,
            backwards: 0,
            steps: 0,
            weights_epoch: 0,
            weights_hash: None,
        })
        .unwrap(),
        &alice,
        ts,
        "test-run",
    );
    let (parts, body) = first.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let copy = Request::from_parts(parts.clone(), Body::from(body.clone()));
    let (code, _) = h.send(Request::from_parts(parts, Body::from(body))).await;
    assert_eq!(code, StatusCode::OK);
    let after_first = h.snapshot();
    let (code, body) = h.send(copy).await;
    assert_eq!(
        (code, error_code(&body).as_str()),
        (StatusCode::CONFLICT, "replayed")
    );
    assert_eq!(h.snapshot(), after_first, "replayed");
}

#[tokio::test]
async fn registration_balances_sections_and_keeps_them() {
    let h = harness();
    let uris = ["//Alice", "//Bob", "//Charlie", "//Dave", "//Eve"];
    let mut sections = Vec::new();
    for uri in uris {
        let r = h.register(&key(uri)).await;
        assert_eq!(r.run, "test-run");
        assert_eq!(r.settings.batch_size, 2);
        assert_eq!(r.hotkey, key(uri).address().to_string());
        sections.push(r.section);
    }
    assert_eq!(sections, vec![0, 1, 2, 0, 1]);
    h.advance(1);
    assert_eq!(
        h.register(&key("//Dave")).await.section,
        0,
        "re-registration keeps the section"
    );
    let status: StatusResponse = h
        .call(Request::get("/api/status").body(Body::empty()).unwrap())
        .await;
    let per_section: Vec<usize> = status.sections.iter().map(|s| s.miners.len()).collect();
    assert_eq!(per_section, vec![2, 2, 1]);
}

#[tokio::test]
async fn max_miners_per_section_is_enforced() {
    let h = harness_with(
        config("max_miners_per_section: 1\n"),
        Repository::open_in_memory().unwrap(),
    );
    for uri in ["//Alice", "//Bob", "//Charlie"] {
        h.register(&key(uri)).await;
    }
    let body = RegisterRequest {
        device: "cpu".into(),
        max_in_flight: 1,
    };
    let (code, body) = h
        .send(h.signed("/api/register", &body, &key("//Dave")))
        .await;
    assert_eq!(
        (code, error_code(&body).as_str()),
        (StatusCode::CONFLICT, "conflict")
    );
}

/// A registration from `addr` (as the server records a connection's peer).
fn register_from(h: &Harness, hotkey: &Hotkey, addr: &str) -> Request<Body> {
    let body = RegisterRequest {
        device: "cpu".into(),
        max_in_flight: 1,
    };
    let mut req = h.signed("/api/register", &body, hotkey);
    let peer: std::net::SocketAddr = addr.parse().unwrap();
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(PeerAddr(peer)));
    req
}

/// Issue 42, goal 7: one address registers `burst` new keys, then `per_hour`; the next is
/// refused with 429 and a `Retry-After`, and takes nothing. Keys already known (a restart) and
/// pinned keys are not counted, and another address has its own allowance.
#[tokio::test]
async fn new_keys_from_one_address_are_rate_limited() {
    let pinned = key("//Pinned");
    let h = harness_with(
        config(&format!(
            "placement: {{new_keys: {{burst: 3, per_hour: 60}}, pins: {{{}: 1}}}}\n",
            pinned.address()
        )),
        Repository::open_in_memory().unwrap(),
    );
    let one = "203.0.113.7:40001";
    for i in 0..3 {
        let (code, body) = h
            .send(register_from(&h, &key(&format!("//Grind{i}")), one))
            .await;
        assert_eq!(code, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    }
    let resp = h
        .app
        .clone()
        .oneshot(register_from(&h, &key("//Grind3"), "203.0.113.7:40002"))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(resp.headers()["retry-after"], "60");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(error_code(&body), "rate_limited");
    let message = String::from_utf8_lossy(&body);
    assert!(
        message.contains("too many new hotkeys from 203.0.113.7") && message.contains("60 s"),
        "{message}"
    );
    let miners = h.state.repo.miners().unwrap();
    assert_eq!(miners.len(), 3, "a refused key takes no seat: {miners:?}");
    // A known key comes back, a pinned key joins, and another address has its own burst.
    h.advance(1);
    let (code, _) = h.send(register_from(&h, &key("//Grind0"), one)).await;
    assert_eq!(code, StatusCode::OK);
    let (code, _) = h.send(register_from(&h, &pinned, one)).await;
    assert_eq!(code, StatusCode::OK);
    let (code, _) = h
        .send(register_from(&h, &key("//Elsewhere"), "198.51.100.1:1"))
        .await;
    assert_eq!(code, StatusCode::OK);
    // A minute later the address may add one more key, and only one.
    h.advance(60_000);
    let (code, _) = h.send(register_from(&h, &key("//Grind3"), one)).await;
    assert_eq!(code, StatusCode::OK);
    let (code, _) = h.send(register_from(&h, &key("//Grind4"), one)).await;
    assert_eq!(code, StatusCode::TOO_MANY_REQUESTS);
}

/// Registers head, middle and tail miners.
async fn three(h: &Harness) -> [Hotkey; 3] {
    let keys = [key("//Alice"), key("//Bob"), key("//Charlie")];
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(h.register(k).await.section, i);
    }
    keys
}

#[tokio::test]
async fn a_sample_goes_round_trip_through_three_miners() {
    let h = harness();
    let [a, b, c] = three(&h).await;
    let boundary = h.state.config.boundary_shape(0);

    let work = h.work(&a, 1).await;
    assert_eq!(work.len(), 1);
    let f0 = &work[0];
    assert_eq!(
        (f0.kind, f0.section, f0.sample_id),
        (WorkKind::Forward, 0, 0)
    );
    assert_eq!(f0.input.shape, Some(vec![2, 8]));
    assert_eq!(f0.deadline_unix_ms, h.now() + 10_000);
    // The head's input is the dataset's tokens, served by the blob endpoint, with a range.
    let path = f0.input.url.strip_prefix("http://orch.test").unwrap();
    let (code, tokens) = h
        .send(Request::get(path).body(Body::empty()).unwrap())
        .await;
    assert_eq!(code, StatusCode::OK);
    // One byte per id: tiny's vocabulary has 256 tokens.
    assert_eq!(tokens.len(), 2 * 8);
    assert_eq!(Some(payload_hash(&tokens)), f0.input.hash);
    let expected: Vec<u8> = h.state.dataset.train_sample(0)[..8]
        .iter()
        .map(|&t| u8::try_from(t).unwrap())
        .collect();
    assert_eq!(tokens[..8], expected[..]);
    let (code, part) = h
        .send(
            Request::get(path)
                .header("range", "bytes=4-7")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(code, StatusCode::PARTIAL_CONTENT);
    assert_eq!(part, tokens[4..8]);
    // A token for another object or method is refused.
    let (code, _) = h
        .send(Request::put(path).body(Body::from("x")).unwrap())
        .await;
    assert_eq!(code, StatusCode::FORBIDDEN);

    let r = h
        .submit(&a, f0, Some(activation(&boundary, 0.5)), None)
        .await;
    assert!(r.accepted, "{r:?}");
    let f1 = h.work(&b, 4).await.remove(0);
    assert_eq!((f1.kind, f1.section), (WorkKind::Forward, 1));
    assert!(
        h.submit(&b, &f1, Some(activation(&boundary, 0.25)), None)
            .await
            .accepted
    );
    let f2 = h.work(&c, 4).await.remove(0);
    assert_eq!(f2.targets.as_ref().unwrap().shape, Some(vec![2, 8]));
    assert!(
        h.submit(&c, &f2, Some(activation(&boundary, 0.1)), Some(3.0))
            .await
            .accepted
    );
    let b1 = h.work(&b, 4).await.remove(0);
    assert_eq!((b1.kind, b1.section), (WorkKind::Backward, 1));
    assert!(
        h.submit(&b, &b1, Some(activation(&boundary, 0.2)), None)
            .await
            .accepted
    );
    let b0 = h.work(&a, 1).await.remove(0);
    assert_eq!(
        (b0.kind, b0.section, b0.output.clone()),
        (WorkKind::Backward, 0, None)
    );
    assert!(h.submit(&a, &b0, None, None).await.accepted);

    let status: StatusResponse = h
        .call(Request::get("/api/status").body(Body::empty()).unwrap())
        .await;
    assert_eq!(status.samples.completed, 1);
    assert_eq!(status.recent_loss, Some(3.0));
    let sample = h.state.repo.sample(0).unwrap().unwrap();
    assert_eq!(sample.loss, Some(3.0));
    let path = h.state.repo.pathway(0).unwrap();
    let names: Vec<String> = [&a, &b, &c]
        .iter()
        .map(|k| k.address().to_string())
        .collect();
    assert_eq!(
        path,
        vec![
            (0, names[0].clone()),
            (1, names[1].clone()),
            (2, names[2].clone())
        ]
    );
    // Submitting the same assignment again is a conflict.
    let body = SubmitRequest {
        assignment_id: b0.id,
        output_hash: None,
        output_bytes: None,
        loss: None,
        timings: Timings::default(),
    };
    let (code, _) = h.send(h.signed("/api/submit", &body, &a)).await;
    assert_eq!(code, StatusCode::CONFLICT);
}

#[tokio::test]
async fn bad_uploads_are_refused_and_reoffered() {
    let h = retrying_harness();
    let [a, _, _] = three(&h).await;
    let boundary = h.state.config.boundary_shape(0);
    let mut nan = activation(&boundary, 1.0);
    let n = nan.len();
    nan[n - 4..].copy_from_slice(&f32::NAN.to_le_bytes());
    let cases: Vec<(&str, Vec<u8>, Option<String>)> = vec![
        (
            "wrong hash",
            activation(&boundary, 1.0),
            Some(payload_hash(b"other")),
        ),
        ("non-finite", nan, None),
        // Smaller than the boundary (a larger one is refused at the upload itself).
        ("wrong shape", activation(&[2, 8, 1], 1.0), None),
        (
            "wrong dtype",
            encode(
                &boundary,
                &vec![1.0; boundary.iter().product()],
                WireDtype::Bf16,
            )
            .unwrap(),
            None,
        ),
    ];
    let mut penalties = 0;
    for (what, bytes, claimed) in cases {
        let assignment = h.work(&a, 1).await.remove(0);
        assert_eq!((assignment.sample_id, assignment.section), (0, 0), "{what}");
        h.upload(assignment.output.as_ref().unwrap(), bytes.clone())
            .await;
        let body = SubmitRequest {
            assignment_id: assignment.id,
            output_hash: Some(claimed.unwrap_or_else(|| payload_hash(&bytes))),
            output_bytes: Some(bytes.len() as u64),
            loss: None,
            timings: Timings::default(),
        };
        let r: SubmitResponse = h.call(h.signed("/api/submit", &body, &a)).await;
        assert!(!r.accepted, "{what}");
        assert!(r.reason.is_some(), "{what}");
        penalties += 1;
        let miner = h
            .state
            .repo
            .miner(&a.address().to_string())
            .unwrap()
            .unwrap();
        assert_eq!(miner.penalties, penalties, "{what}");
        assert_eq!(miner.forwards, 0, "{what}");
    }
    // The sample was re-offered each time, never advanced.
    let status: StatusResponse = h
        .call(Request::get("/api/status").body(Body::empty()).unwrap())
        .await;
    assert_eq!((status.samples.in_flight, status.samples.completed), (1, 0));
}

/// During the warm-up without the bottleneck a sample's boundary is `d_model` channels wider,
/// by the run config and the sample id alone. A miner that skips the warm-up and sends the
/// plain bottleneck is refused and penalised, and the sample is re-offered; after the
/// hand-over the wide tensor no longer fits the upload's limit and the plain one is accepted.
#[tokio::test]
async fn the_warm_up_width_is_enforced_on_both_sides_of_the_hand_over() {
    let h = harness_with(
        config(
            "model: {preset: tiny, reembed: false}\nbottleneck_warmup: 1\n\
             penalties: {backoff_s: 0, exclude_after: 1000}\n",
        ),
        Repository::open_in_memory().unwrap(),
    );
    let [a, _, _] = three(&h).await;
    let (wide, plain) = (
        h.state.config.boundary_shape(0),
        h.state.config.boundary_shape(1),
    );
    assert!(wide[2] > plain[2], "{wide:?} {plain:?}");
    let first = h.work(&a, 1).await.remove(0);
    assert_eq!((first.sample_id, first.section), (0, 0));
    let skipped = h
        .submit(&a, &first, Some(activation(&plain, 1.0)), None)
        .await;
    assert!(!skipped.accepted);
    let reason = skipped.reason.unwrap_or_default();
    assert!(reason.contains("size mismatch"), "{reason}");
    let miner = |h: &Harness| {
        h.state
            .repo
            .miner(&a.address().to_string())
            .unwrap()
            .unwrap()
    };
    assert_eq!((miner(&h).penalties, miner(&h).forwards), (1, 0));
    let again = h.work(&a, 1).await.remove(0);
    assert_eq!(again.sample_id, 0, "re-offered");
    let warm = h
        .submit(&a, &again, Some(activation(&wide, 1.0)), None)
        .await;
    assert!(warm.accepted, "{:?}", warm.reason);
    // Sample 1 is past the warm-up: the wide tensor is cut off at the upload itself.
    let next = h.work(&a, 1).await.remove(0);
    assert_eq!(next.sample_id, 1);
    let blob = next.output.as_ref().unwrap();
    let path = blob.url.strip_prefix("http://orch.test").unwrap();
    let put = Request::put(path)
        .body(Body::from(activation(&wide, 1.0)))
        .unwrap();
    assert_eq!(h.send(put).await.0, StatusCode::PAYLOAD_TOO_LARGE);
    let plain_ok = h
        .submit(&a, &next, Some(activation(&plain, 1.0)), None)
        .await;
    assert!(plain_ok.accepted, "{:?}", plain_ok.reason);
    assert_eq!((miner(&h).penalties, miner(&h).forwards), (1, 2));
}

#[tokio::test]
async fn the_tail_must_report_a_finite_loss() {
    let h = retrying_harness();
    let [a, b, c] = three(&h).await;
    let boundary = h.state.config.boundary_shape(0);
    let f0 = h.work(&a, 1).await.remove(0);
    assert!(
        h.submit(&a, &f0, Some(activation(&boundary, 0.5)), None)
            .await
            .accepted
    );
    let f1 = h.work(&b, 1).await.remove(0);
    assert!(
        h.submit(&b, &f1, Some(activation(&boundary, 0.5)), None)
            .await
            .accepted
    );
    let f2 = h.work(&c, 1).await.remove(0);
    let r = h
        .submit(&c, &f2, Some(activation(&boundary, 0.5)), Some(f32::NAN))
        .await;
    assert!(!r.accepted);
    let again = h.work(&c, 1).await.remove(0);
    assert_eq!(
        (again.sample_id, again.section, again.kind),
        (0, 2, WorkKind::Forward)
    );
}

#[tokio::test]
async fn deadlines_reoffer_forwards_and_drop_backwards() {
    let h = retrying_harness();
    let [a, b, c] = three(&h).await;
    let boundary = h.state.config.boundary_shape(0);
    let f0 = h.work(&a, 1).await.remove(0);
    h.advance(10_001);
    // The upload URL has expired with the deadline.
    let late = activation(&boundary, 0.5);
    let path = f0
        .output
        .as_ref()
        .unwrap()
        .url
        .strip_prefix("http://orch.test")
        .unwrap();
    let (code, _) = h
        .send(Request::put(path).body(Body::from(late.clone())).unwrap())
        .await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    // A result that arrives after the deadline is refused (and the work re-offered at once).
    let body = SubmitRequest {
        assignment_id: f0.id,
        output_hash: Some(payload_hash(&late)),
        output_bytes: Some(late.len() as u64),
        loss: None,
        timings: Timings::default(),
    };
    let r: SubmitResponse = h.call(h.signed("/api/submit", &body, &a)).await;
    assert!(!r.accepted);
    assert_eq!(
        enforce_deadlines(&h.state),
        0,
        "already expired by the late submit"
    );
    // Once expired, the assignment is closed: submitting again is a conflict.
    let body = SubmitRequest {
        assignment_id: f0.id,
        output_hash: None,
        output_bytes: None,
        loss: None,
        timings: Timings::default(),
    };
    let (code, _) = h.send(h.signed("/api/submit", &body, &a)).await;
    assert_eq!(code, StatusCode::CONFLICT);
    let f0 = h.work(&a, 1).await.remove(0);
    assert_eq!((f0.sample_id, f0.section), (0, 0), "re-offered");
    assert!(
        h.submit(&a, &f0, Some(activation(&boundary, 0.5)), None)
            .await
            .accepted
    );
    let f1 = h.work(&b, 1).await.remove(0);
    assert!(
        h.submit(&b, &f1, Some(activation(&boundary, 0.5)), None)
            .await
            .accepted
    );
    let f2 = h.work(&c, 1).await.remove(0);
    assert!(
        h.submit(&c, &f2, Some(activation(&boundary, 0.5)), Some(2.0))
            .await
            .accepted
    );
    // b never picks up its backward.
    h.advance(20_001);
    assert_eq!(enforce_deadlines(&h.state), 1);
    let sample = h.state.repo.sample(0).unwrap().unwrap();
    assert!(
        sample
            .reason
            .unwrap()
            .contains("backward of section 1 missed its deadline")
    );
    let status: StatusResponse = h
        .call(Request::get("/api/status").body(Body::empty()).unwrap())
        .await;
    assert_eq!(status.samples.dropped, 1);
    let bob = status.sections[1].miners[0].clone();
    assert_eq!(bob.penalties, 1);
    let hb: HeartbeatResponse = h
        .call(h.signed(
            "/api/heartbeat",
            &HeartbeatRequest {
                usage: Some(MinerUsage {
                    wall_s: 10.0,
                    compute_s: 5.0,
                    idle_s: 4.0,
                    bytes_up: 1234,
                    ..MinerUsage::default()
                }),
                forwards: 1,
                backwards: 0,
                steps: 0,
                weights_epoch: 0,
                weights_hash: None,
            },
            &b,
        ))
        .await;
    assert_eq!(hb.penalties, 1);
    // The usage the heartbeat carried shows in /metrics, under the miner's section.
    let (_, body) = h
        .send(Request::get("/metrics").body(Body::empty()).unwrap())
        .await;
    let text = String::from_utf8(body).unwrap();
    assert!(
        text.contains(&format!(
            "iota_miner_utilization{{miner=\"{}\",section=\"1\"}} 0.5",
            bob.hotkey
        )),
        "{text}"
    );
    assert!(text.contains("activity=\"idle\"} 4"), "{text}");
    assert!(text.contains("dir=\"up\"} 1234"), "{text}");
}

#[tokio::test]
async fn release_hands_work_back() {
    let h = harness();
    let [a, _, _] = three(&h).await;
    let f0 = h.work(&a, 1).await.remove(0);
    let r: SubmitResponse = h
        .call(h.signed(
            "/api/release",
            &ReleaseRequest {
                assignment_ids: vec![f0.id],
            },
            &a,
        ))
        .await;
    assert!(r.accepted);
    let again = h.work(&a, 1).await.remove(0);
    assert_eq!(again.sample_id, 0);
    assert_ne!(again.id, f0.id);
}

/// Race (issue 9): the room for new samples was read before the start lock, so head miners
/// asking at once each saw the epoch's whole room and together started far more samples than
/// its merge needs (6 head miners x 2 here, for an epoch of 3). The room is now decided in the
/// transaction that starts a sample. The store is a real directory, so the token uploads
/// take real time and the requests overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r9_head_miners_asking_at_once_start_no_more_samples_than_the_epoch_needs() {
    use iota::storage::{Storage, StorageConfig};
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(&StorageConfig::local(dir.path().to_string_lossy())).unwrap();
    let h = harness_on(
        config("batches_before_merging: 3\n"),
        Repository::open_in_memory().unwrap(),
        storage,
        T0,
    );
    let mut heads = Vec::new();
    for i in 0..18 {
        let k = key(&format!("//Race{i}"));
        if h.register(&k).await.section == 0 {
            heads.push(k);
        }
    }
    assert_eq!(heads.len(), 6);
    let answers = futures::future::join_all(heads.iter().map(|k| h.work(k, 4))).await;
    let mut ids: Vec<u64> = answers.iter().flatten().map(|a| a.sample_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![0, 1, 2], "samples started for an epoch of 3");
    let counts = h.state.repo.counts().unwrap();
    assert_eq!((counts.active, counts.completed), (3, 0));
    assert_eq!(h.state.repo.run_state().unwrap().2, 3, "next sample id");
    // Every started sample's tokens were stored before it was handed out.
    for a in answers.iter().flatten() {
        assert_eq!(h.get_blob(&a.input).await.len(), 2 * 8, "one byte per id");
    }
}

/// Once a sample starts, the tokens of the next ones are stored in the background, so the
/// `/api/work` that starts them does not wait for storage: as many as the epoch still has room
/// for (4 samples an epoch) or the budget allows (6 samples), never more.
#[tokio::test]
async fn the_next_samples_tokens_are_stored_ahead_within_the_epoch_and_budget() {
    use iota::storage::{Storage, StorageConfig};
    for (extra, staged) in [
        ("batches_before_merging: 4\n", 4u64),
        ("batches_before_merging: 10\nmax_samples: 6\n", 6),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::open(&StorageConfig::local(dir.path().to_string_lossy())).unwrap();
        let h = harness_on(
            config(extra),
            Repository::open_in_memory().unwrap(),
            storage,
            T0,
        );
        let [a, _, _] = three(&h).await;
        assert_eq!(h.work(&a, 1).await[0].sample_id, 0);
        let stored = |id: u64| {
            let state = h.state.clone();
            async move {
                let (tokens, targets) = (
                    state.token_key(0, id, "tokens"),
                    state.token_key(0, id, "targets"),
                );
                state.storage.exists(&tokens).await.unwrap()
                    && state.storage.exists(&targets).await.unwrap()
            }
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !stored(staged - 1).await {
            assert!(
                std::time::Instant::now() < deadline,
                "{extra}: not stored ahead"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        for id in 1..staged {
            assert!(stored(id).await, "{extra}: sample {id}");
            assert!(
                h.state.staged_tokens(0, id).is_some(),
                "{extra}: sample {id}"
            );
        }
        // Let a runaway task show itself before looking past the end.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!stored(staged).await, "{extra}: stored past the room");
        // The next sample starts on the stored tokens.
        let next = h.work(&a, 1).await;
        assert_eq!(next[0].sample_id, 1);
        assert_eq!(h.get_blob(&next[0].input).await.len(), 2 * 8);
    }
}

#[tokio::test]
async fn the_sample_budget_stops_new_samples() {
    let h = harness_with(
        config("max_samples: 2\n"),
        Repository::open_in_memory().unwrap(),
    );
    let [a, _, _] = three(&h).await;
    let work = h.work(&a, 5).await;
    assert_eq!(
        work.iter().map(|w| w.sample_id).collect::<Vec<_>>(),
        vec![0, 1]
    );
}

/// A streamed source's block counts are saved in `data_dir` as the blocks are counted, and a
/// restarted orchestrator takes them: it serves the last block's sample, the same tokens,
/// without tokenizing the blocks before it.
#[test]
fn a_restart_takes_the_streamed_block_counts_from_the_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let shards = dir.path().join("shards");
    std::fs::create_dir(&shards).unwrap();
    for f in 0..8 {
        let text: String = (0..40).map(|i| format!("shard {f} line {i}. ")).collect();
        std::fs::write(shards.join(format!("{f}.txt")), text).unwrap();
    }
    let state_dir = dir.path().join("state");
    let yaml = format!(
        "data_dir: {}\ndata: {{source: {}, stream: {{block_shards: 1, ahead: 0}}}}\n",
        state_dir.display(),
        shards.display()
    );
    let (last, tokens) = {
        let state = AppState::open(config(&yaml)).unwrap();
        let data = &state.dataset;
        let n = (0..).take_while(|&id| data.epoch(id) == 0).count() as u64;
        assert_eq!(data.stream_stats().unwrap().tokenized, 8);
        (n - 1, data.train_sample(n - 1).to_vec())
    };
    let counts = state_dir.join(iota::orchestrator::state::STREAM_COUNTS_FILE);
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(&counts).is_ok_and(|t| !t.contains("null")) {
        assert!(
            started.elapsed().as_secs() < 10,
            "the counts were not saved"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let state = AppState::open(config(&yaml)).unwrap();
    assert_eq!(*state.dataset.train_sample(last), tokens[..]);
    // Block 0 (opened) and the last block (read), not the six between.
    assert_eq!(state.dataset.stream_stats().unwrap().tokenized, 2);
}

#[tokio::test]
async fn restart_from_the_same_data_dir_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "data_dir: {}\ndata: {{source: \"synthetic:0:20000\"}}\n",
        dir.path().display()
    );
    let a = key("//Alice");
    let keys = [key("//Alice"), key("//Bob"), key("//Charlie")];
    let secret_before;
    {
        let state = AppState::open(config(&yaml)).unwrap();
        let h = Harness {
            app: router(state.clone()),
            state,
            now: Arc::new(AtomicU64::new(0)),
        };
        // This harness uses the system clock (AppState::open); sign with it.
        h.now.store(now_ms(), Ordering::SeqCst);
        for k in &keys {
            h.register(k).await;
        }
        h.now.store(now_ms(), Ordering::SeqCst);
        let f0 = h.work(&a, 1).await.remove(0);
        let bytes = activation(&h.state.config.boundary_shape(0), 0.5);
        assert!(h.submit(&a, &f0, Some(bytes), None).await.accepted);
        secret_before = std::fs::read_to_string(dir.path().join("blob_secret")).unwrap();
    }
    let state = AppState::open(config(&yaml)).unwrap();
    let miners = state.repo.miners().unwrap();
    assert_eq!(miners.len(), 3);
    assert_eq!(miners[0].forwards, 1);
    assert_eq!(state.repo.run_state().unwrap().2, 1);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("blob_secret")).unwrap(),
        secret_before
    );
    // The head's output survived in the local object store, and section 1's forward is open.
    let accepted = state.repo.assignments_of(0, 2).unwrap().remove(0);
    let (key1, _) = iota::orchestrator::wire::output_of(&state, &accepted).unwrap();
    assert!(state.storage.exists(&key1).await.unwrap());
    let h = Harness {
        app: router(state.clone()),
        state,
        now: Arc::new(AtomicU64::new(now_ms())),
    };
    let f1 = h.work(&keys[1], 1).await.remove(0);
    assert_eq!((f1.sample_id, f1.section), (0, 1));
}

#[tokio::test]
async fn the_deadline_task_reoffers_a_missed_forward() {
    let h = retrying_harness();
    let [a, _, _] = three(&h).await;
    let f0 = h.work(&a, 1).await.remove(0);
    h.advance(10_000);
    assert_eq!(
        enforce_deadlines(&h.state),
        0,
        "the deadline itself is still in time"
    );
    h.advance(1);
    assert_eq!(enforce_deadlines(&h.state), 1);
    let again = h.work(&a, 1).await.remove(0);
    assert_eq!((again.sample_id, again.section), (0, 0));
    assert_ne!(again.id, f0.id);
    let miner = h
        .state
        .repo
        .miner(&a.address().to_string())
        .unwrap()
        .unwrap();
    assert_eq!(miner.penalties, 1);
}

/// Issue 9, "penalties that count", over HTTP: a miner that missed a deadline gets no new
/// work during its back-off (the re-offered forward waits, and no sample is started for it),
/// then gets work again; the decision is in the ledger.
#[tokio::test]
async fn r9_a_failing_miner_is_backed_off_over_http() {
    let h = harness();
    let [a, _, _] = three(&h).await;
    let f0 = h.work(&a, 1).await.remove(0);
    h.advance(10_001);
    assert_eq!(enforce_deadlines(&h.state), 1);
    assert!(h.work(&a, 2).await.is_empty(), "backed off");
    let hotkey = a.address().to_string();
    let standing = h.state.repo.standing_of(&hotkey).unwrap();
    assert_eq!(standing.len(), 1);
    assert_eq!(standing[0].decision, "backoff");
    h.advance(h.state.config.penalties.backoff_s * 1000);
    let again = h.work(&a, 1).await.remove(0);
    assert_eq!((again.sample_id, again.section), (0, 0));
    assert_ne!(again.id, f0.id);
}

/// The replay confirmed from outside (issue 9): a signed register replayed with its timestamp
/// spelled `0<ts>`, `+<ts>` or `00<ts>` was accepted three more times. Each re-spelling is now
/// refused before it can touch the state, and the plain replay still gets 409.
#[tokio::test]
async fn r9_a_replay_with_a_respelled_timestamp_is_refused() {
    let h = harness();
    let alice = key("//Alice");
    let body = serde_json::to_vec(&RegisterRequest {
        device: "cpu".into(),
        max_in_flight: 4,
    })
    .unwrap();
    let ts = h.now();
    let original = signed_raw("/api/register", body.clone(), &alice, ts, "test-run");
    let (parts, _) = original.into_parts();
    let (code, _) = h
        .send(Request::from_parts(parts.clone(), Body::from(body.clone())))
        .await;
    assert_eq!(code, StatusCode::OK);
    let after_first = h.snapshot();
    for spelled in [format!("0{ts}"), format!("+{ts}"), format!("00{ts}")] {
        let mut replay = Request::from_parts(parts.clone(), Body::from(body.clone()));
        replay
            .headers_mut()
            .insert("X-Iota-Timestamp", spelled.parse().unwrap());
        let (code, answer) = h.send(replay).await;
        assert_eq!(
            (code, error_code(&answer).as_str()),
            (StatusCode::UNAUTHORIZED, "unauthorized"),
            "timestamp {spelled:?} was accepted: {}",
            String::from_utf8_lossy(&answer)
        );
        assert_eq!(h.snapshot(), after_first, "timestamp {spelled:?}");
    }
    let (code, answer) = h.send(Request::from_parts(parts, Body::from(body))).await;
    assert_eq!(
        (code, error_code(&answer).as_str()),
        (StatusCode::CONFLICT, "replayed")
    );
}

/// A heartbeat's `weights_hash` is a report shown on the status page and in `iota local`'s
/// summary: anything but 64 hex digits is refused (a multi-byte one used to panic the summary's
/// byte slicing) and nothing is recorded.
#[tokio::test]
async fn a_weights_hash_that_is_not_hex_is_refused() {
    let h = harness();
    let alice = key("//Alice");
    h.register(&alice).await;
    let before = h.state.repo.miners().unwrap();
    for bad in ["é".repeat(32), "zz".repeat(32), "ab".into()] {
        let body = HeartbeatRequest {
            usage: None,
            forwards: 0,
            backwards: 0,
            steps: 0,
            weights_epoch: 1,
            weights_hash: Some(bad.clone()),
        };
        let (code, answer) = h.send(h.signed("/api/heartbeat", &body, &alice)).await;
        assert_eq!(
            (code, error_code(&answer).as_str()),
            (StatusCode::BAD_REQUEST, "bad_request"),
            "{bad:?}"
        );
        assert_eq!(h.state.repo.miners().unwrap(), before, "{bad:?}");
    }
    let nan = HeartbeatRequest {
        usage: Some(MinerUsage {
            idle_s: f64::NAN,
            ..MinerUsage::default()
        }),
        forwards: 0,
        backwards: 0,
        steps: 0,
        weights_epoch: 0,
        weights_hash: None,
    };
    // serde_json writes NaN as null, which does not parse as a number: refused either way.
    let (code, _) = h.send(h.signed("/api/heartbeat", &nan, &alice)).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    let negative = HeartbeatRequest {
        usage: Some(MinerUsage {
            compute_s: -1.0,
            ..MinerUsage::default()
        }),
        ..nan
    };
    let (code, answer) = h.send(h.signed("/api/heartbeat", &negative, &alice)).await;
    assert_eq!(
        (code, error_code(&answer).as_str()),
        (StatusCode::BAD_REQUEST, "bad_request")
    );
    assert_eq!(h.state.repo.miners().unwrap(), before);
    let good = HeartbeatRequest {
        usage: None,
        forwards: 0,
        backwards: 0,
        steps: 0,
        weights_epoch: 1,
        weights_hash: Some("AB".repeat(32)),
    };
    let (code, _) = h.send(h.signed("/api/heartbeat", &good, &alice)).await;
    assert_eq!(code, StatusCode::OK);
    let miner = h
        .state
        .repo
        .miner(&alice.address().to_string())
        .unwrap()
        .unwrap();
    assert_eq!(miner.weights_hash, Some("ab".repeat(32)));
}

/// A `/blob` upload streams into storage and is cut off the moment it passes the limit its
/// token carries (here the body declares no length, so only the streaming check can stop
/// it): 413, nothing stored; a token without a limit is refused (403).
#[tokio::test]
async fn r9_blob_uploads_are_cut_off_at_their_limit() {
    let h = harness();
    let [a, _, _] = three(&h).await;
    let f0 = h.work(&a, 1).await.remove(0);
    let output = f0.output.unwrap();
    let path = output
        .url
        .strip_prefix("http://orch.test")
        .unwrap()
        .to_string();
    let max: usize = path
        .split("max=")
        .nth(1)
        .and_then(|v| v.split('&').next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    let key = iota::storage::ObjectKey::parse(
        path.trim_start_matches("/blob/").split('?').next().unwrap(),
    )
    .unwrap();
    let chunks = futures::stream::iter(
        (0..3).map(move |_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![0u8; max]))),
    );
    let req = Request::put(path.as_str())
        .body(Body::from_stream(chunks))
        .unwrap();
    let (code, body) = h.send(req).await;
    assert_eq!(
        (code, error_code(&body).as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, "too_large")
    );
    assert!(!h.state.storage.exists(&key).await.unwrap());
    let no_limit = path.replace(&format!("&max={max}"), "");
    let (code, _) = h
        .send(
            Request::put(no_limit.as_str())
                .body(Body::from(vec![0u8; 4]))
                .unwrap(),
        )
        .await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    assert!(!h.state.storage.exists(&key).await.unwrap());
    let (code, _) = h
        .send(
            Request::put(path.as_str())
                .body(Body::from(vec![0u8; max]))
                .unwrap(),
        )
        .await;
    assert_eq!(code, StatusCode::OK);
    assert!(h.state.storage.exists(&key).await.unwrap());
}

/// Output keys used to be per (sample, section, direction): a miner whose result was refused
/// still held a valid PUT URL for the very key the re-offered work would be uploaded to, and
/// could overwrite the next miner's upload to get that miner refused and penalised. Every
/// attempt now has its own key.
#[tokio::test]
async fn r9_a_refused_miners_stale_url_cannot_overwrite_the_next_attempt() {
    let h = harness();
    let [a, _, _] = three(&h).await;
    let a2 = key("//Dave");
    assert_eq!(h.register(&a2).await.section, 0);
    let boundary = h.state.config.boundary_shape(0);
    let first = h.work(&a, 1).await.remove(0);
    let r = h
        .submit(&a, &first, Some(activation(&[2, 8, 1], 9.0)), None)
        .await;
    assert!(!r.accepted);
    let second = h.work(&a2, 1).await.remove(0);
    assert_eq!((second.sample_id, second.section), (first.sample_id, 0));
    assert_ne!(
        second.output.as_ref().unwrap().url,
        first.output.as_ref().unwrap().url
    );
    let good = activation(&boundary, 0.5);
    h.upload(second.output.as_ref().unwrap(), good.clone())
        .await;
    // The refused miner's URL is still valid: it writes garbage where it can.
    h.upload(first.output.as_ref().unwrap(), activation(&boundary, 666.0))
        .await;
    let body = SubmitRequest {
        assignment_id: second.id,
        output_hash: Some(payload_hash(&good)),
        output_bytes: Some(good.len() as u64),
        loss: None,
        timings: Timings::default(),
    };
    let r: SubmitResponse = h.call(h.signed("/api/submit", &body, &a2)).await;
    assert!(r.accepted, "{r:?}");
    let honest = h
        .state
        .repo
        .miner(&a2.address().to_string())
        .unwrap()
        .unwrap();
    assert_eq!(honest.penalties, 0);
}

/// After a result is accepted its uploader still holds a valid PUT URL until the deadline.
/// Overwriting the object then changes nothing: the next section reads the orchestrator's
/// copy, taken when the result was checked, whose hash the ledger and the assignment carry.
#[tokio::test]
async fn r9_an_accepted_output_cannot_be_swapped_afterwards() {
    let h = harness();
    let [a, b, _] = three(&h).await;
    let boundary = h.state.config.boundary_shape(0);
    let f0 = h.work(&a, 1).await.remove(0);
    let good = activation(&boundary, 0.5);
    assert!(h.submit(&a, &f0, Some(good.clone()), None).await.accepted);
    h.upload(f0.output.as_ref().unwrap(), activation(&boundary, 666.0))
        .await;
    let f1 = h.work(&b, 1).await.remove(0);
    assert_eq!(f1.section, 1);
    let input = h.get_blob(&f1.input).await;
    assert_eq!(input, good, "the next section read the swapped object");
    assert_eq!(f1.input.hash, Some(payload_hash(&good)));
}

#[tokio::test]
async fn evaluation_work_runs_forward_only_and_its_loss_reaches_the_status() {
    // No back-off: the refused evaluations are offered again to the same tail miner at once.
    let h = harness_with(
        config("eval_samples: 4\npenalties: {backoff_s: 0, exclude_after: 1000}\n"),
        Repository::open_in_memory().unwrap(),
    );
    let [a, b, c] = three(&h).await;
    let boundary = h.state.config.boundary_shape(0);
    // Evaluation of the starting weights comes first: 4 windows in samples of 2.
    let evals = h.work(&a, 2).await;
    assert_eq!(evals.len(), 2);
    for e in &evals {
        assert_eq!((e.kind, e.section), (WorkKind::Eval, 0));
        assert!(
            e.sample_id >= 1 << 48,
            "eval ids stay apart from training ids"
        );
        assert_eq!(e.input.shape, Some(vec![2, 8]));
        assert!(e.output.is_some() && e.targets.is_none());
        assert!(
            h.submit(&a, e, Some(activation(&boundary, 0.5)), None)
                .await
                .accepted
        );
    }
    let mids = h.work(&b, 2).await;
    assert_eq!(mids.len(), 2);
    for e in &mids {
        assert_eq!((e.kind, e.section), (WorkKind::Eval, 1));
        assert!(
            h.submit(&b, e, Some(activation(&boundary, 0.5)), None)
                .await
                .accepted
        );
    }
    let tails = h.work(&c, 2).await;
    assert_eq!(tails.len(), 2);
    for e in &tails {
        assert_eq!((e.kind, e.section), (WorkKind::Eval, 2));
        // The tail uploads nothing: it reads the targets and reports the loss.
        assert!(e.output.is_none() && e.targets.is_some());
    }
    // A tail evaluation without a finite loss is refused and offered again.
    assert!(!h.submit(&c, &tails[0], None, None).await.accepted);
    assert!(
        !h.submit(&c, &tails[1], None, Some(f32::INFINITY))
            .await
            .accepted
    );
    let again = h.work(&c, 2).await;
    assert_eq!(again.len(), 2);
    for (e, loss) in again.iter().zip([3.0, 4.0]) {
        assert_eq!(e.kind, WorkKind::Eval);
        assert!(h.submit(&c, e, None, Some(loss)).await.accepted);
    }
    let status: StatusResponse = h
        .call(Request::get("/api/status").body(Body::empty()).unwrap())
        .await;
    assert_eq!(status.eval_loss, Some(3.5));
    assert_eq!(status.evals.len(), 1);
    assert_eq!(
        (
            status.evals[0].epoch,
            status.evals[0].samples,
            status.evals[0].completed
        ),
        (0, 2, 2)
    );
    // Nothing of it counts as training: no sample completed, no backward follows, and the
    // head's next work is the first training sample.
    assert_eq!(status.samples.completed, 0);
    assert!(h.work(&b, 2).await.is_empty());
    let f0 = h.work(&a, 1).await.remove(0);
    assert_eq!((f0.kind, f0.sample_id), (WorkKind::Forward, 0));
}

/// Runs the head forward `f0` of a sample through the rest of the pipeline (one miner per
/// section), down to the head's backward.
async fn round_trip(h: &Harness, keys: &[Hotkey; 3], f0: &Assignment) {
    let b0 = until_head_backward(h, keys, f0).await;
    let r = h.submit(&keys[0], &b0, None, None).await;
    assert!(r.accepted, "{r:?}");
}

/// Takes head forward `f0` of `keys[0]` through the middle and tail miners and back, up to
/// the head backward, which it returns (handed out, not submitted).
async fn until_head_backward(h: &Harness, [a, b, c]: &[Hotkey; 3], f0: &Assignment) -> Assignment {
    let boundary = h.state.config.boundary_shape(0);
    let accepted = |r: SubmitResponse| assert!(r.accepted, "{r:?}");
    accepted(
        h.submit(a, f0, Some(activation(&boundary, 0.5)), None)
            .await,
    );
    let f1 = h.work(b, 1).await.remove(0);
    accepted(
        h.submit(b, &f1, Some(activation(&boundary, 0.25)), None)
            .await,
    );
    let f2 = h.work(c, 1).await.remove(0);
    accepted(
        h.submit(c, &f2, Some(activation(&boundary, 0.1)), Some(3.0))
            .await,
    );
    let b1 = h.work(b, 1).await.remove(0);
    accepted(
        h.submit(b, &b1, Some(activation(&boundary, 0.2)), None)
            .await,
    );
    let b0 = h.work(a, 1).await.remove(0);
    assert_eq!((b0.kind, b0.sample_id), (WorkKind::Backward, f0.sample_id));
    b0
}

#[tokio::test]
async fn synchronous_steps_start_no_sample_of_a_step_before_the_last_one_finished() {
    let h = harness_with(
        config("samples_per_step: 2\nbatches_before_merging: 8\n"),
        Repository::open_in_memory().unwrap(),
    );
    let keys = three(&h).await;
    let ids = |w: &[Assignment]| w.iter().map(|a| a.sample_id).collect::<Vec<_>>();
    // Step 0 is samples 0 and 1; the head gets both, and no more.
    let step0 = h.work(&keys[0], 4).await;
    assert_eq!(ids(&step0), vec![0, 1]);
    round_trip(&h, &keys, &step0[0]).await;
    // Sample 1 is still under way: the head has room in flight, but sample 2 opens step 1.
    assert!(h.work(&keys[0], 4).await.is_empty());
    round_trip(&h, &keys, &step0[1]).await;
    assert_eq!(ids(&h.work(&keys[0], 4).await), vec![2, 3]);
    // The same config without synchronous steps starts sample 2 while 1 is under way.
    let h = harness_with(
        config("batches_before_merging: 8\n"),
        Repository::open_in_memory().unwrap(),
    );
    let keys = three(&h).await;
    let first = h.work(&keys[0], 4).await;
    round_trip(&h, &keys, &first[0]).await;
    assert_eq!(ids(&h.work(&keys[0], 4).await), vec![2]);
}

/// With synchronous steps each live head miner holds its share of a step (here one sample of
/// two). A poll a miner sends while it computes its last backward finds no room and waits;
/// the acceptance of that backward wakes it (it used to stay deaf until its `wait_ms` ran out,
/// which made capped miners 12x slower), so the next step starts at once: the two head
/// miners' waiting polls get one sample of step 1 each.
#[tokio::test]
async fn a_poll_that_found_no_room_is_woken_by_the_result_that_frees_it() {
    let h = harness_with(
        config("samples_per_step: 2\nbatches_before_merging: 8\n"),
        Repository::open_in_memory().unwrap(),
    );
    let [alice, bob, charlie] = three(&h).await;
    let dave = key("//Dave");
    assert_eq!(h.register(&dave).await.section, 0);
    let ids = |w: &[Assignment]| w.iter().map(|a| a.sample_id).collect::<Vec<_>>();
    let f0 = h.work(&alice, 4).await;
    assert_eq!(ids(&f0), vec![0], "alice's share of step 0");
    let f1 = h.work(&dave, 4).await;
    assert_eq!(ids(&f1), vec![1], "dave's share of step 0");
    round_trip(&h, &[dave.clone(), bob.clone(), charlie.clone()], &f1[0]).await;
    // Alice's sample up to its head backward, which she is now computing.
    let b0 = until_head_backward(&h, &[alice.clone(), bob, charlie], &f0[0]).await;
    // Both head miners poll, each willing to wait 20 s.
    let poll = |k: &Hotkey| {
        let wait = WorkRequest {
            max: 4,
            wait_ms: 20_000,
        };
        let req = h.signed("/api/work", &wait, k);
        let app = h.app.clone();
        tokio::spawn(async move {
            let resp = app.oneshot(req).await.unwrap();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            serde_json::from_slice::<WorkResponse>(&bytes).unwrap()
        })
    };
    let (alice_poll, dave_poll) = (poll(&alice), poll(&dave));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!alice_poll.is_finished() && !dave_poll.is_finished());
    let submitted = std::time::Instant::now();
    let r = h.submit(&alice, &b0, None, None).await;
    assert!(r.accepted, "{r:?}");
    let (a, d) = (alice_poll.await.unwrap(), dave_poll.await.unwrap());
    let mut step1 = ids(&a.assignments);
    step1.extend(ids(&d.assignments));
    step1.sort_unstable();
    assert_eq!(step1, vec![2, 3], "alice {a:?}, dave {d:?}");
    assert_eq!((a.assignments.len(), d.assignments.len()), (1, 1));
    assert!(submitted.elapsed() < std::time::Duration::from_secs(20));
}

#[test]
fn synchronous_steps_refuse_settings_they_cannot_honour() {
    let err = |extra: &str| {
        RunConfig::from_yaml(&format!("run: r\nmodel: {{preset: tiny}}\n{extra}"))
            .unwrap_err()
            .to_string()
    };
    assert!(err("samples_per_step: 3\nbatches_before_merging: 100\n").contains("divide"));
    assert!(err("samples_per_step: 2\nlocal_steps: 2\n").contains("local_steps"));
    assert!(err("samples_per_step: 2\nlookahead: true\n").contains("lookahead"));
}
