//! The orchestrator on S3-compatible storage (a real s3s-fs started by the test): assignments
//! carry presigned URLs, the miner side transfers through them, and submit checks the object
//! the orchestrator fetches back from the bucket.
//!
//! s3s-fs must be installed: `cargo install s3s-fs@0.14.1 --features binary --locked`.

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use url::Url;

use iota::api::*;
use iota::orchestrator::{AppState, RunConfig, router};
use iota::storage::{WireDtype, download_from_url, encode, payload_hash, upload_to_url};
use iota::wallet::Hotkey;

mod common;

use common::signed::post_oneshot;
use common::{ACCESS_KEY, BUCKET, S3Server, SECRET_KEY};

async fn post<T: DeserializeOwned>(
    state: &AppState,
    path: &str,
    body: &impl Serialize,
    key: &Hotkey,
) -> T {
    post_oneshot(router(state.clone()), path, body, key, "s3-run").await
}

/// An orchestrator whose objects live in `s3`'s bucket.
///
/// Back-off is off: the refusal test asks the same miner for the re-offered work at once (the
/// back-off itself is tested in `orchestrator_api`).
fn s3_state(s3: &S3Server, data_dir: &std::path::Path) -> AppState {
    let yaml = format!(
        "run: s3-run\nbatch_size: 2\nseq_len: 8\nwire: f32\neval_samples: 0\n\
         penalties: {{backoff_s: 0, exclude_after: 1000}}\n\
         data: {{source: \"synthetic:2:20000\"}}\ndata_dir: {}\n\
         storage: {{url: \"s3://{BUCKET}/runs\", endpoint: \"{}\", region: us-east-1, \
         access_key_id: {ACCESS_KEY}, secret_access_key: {SECRET_KEY}}}\n",
        data_dir.display(),
        s3.endpoint
    );
    AppState::open(RunConfig::from_yaml(&yaml).unwrap()).unwrap()
}

/// Registers `key` (the head: the first miner) and asks for one piece of work.
async fn head_work(state: &AppState, key: &Hotkey) -> WorkResponse {
    let reg: RegisterResponse = post(
        state,
        "/api/register",
        &RegisterRequest {
            device: "cpu".into(),
            max_in_flight: 1,
        },
        key,
    )
    .await;
    assert_eq!(reg.section, 0);
    post(state, "/api/work", &WorkRequest { max: 1, wait_ms: 0 }, key).await
}

#[tokio::test]
async fn assignments_carry_presigned_urls_that_work() {
    let s3 = S3Server::start();
    let data_dir = tempfile::tempdir().unwrap();
    let state = s3_state(&s3, data_dir.path());
    let alice = Hotkey::from_uri("//Alice").unwrap();
    let work = head_work(&state, &alice).await;
    let a = &work.assignments[0];
    assert!(a.input.url.starts_with(&s3.endpoint), "{}", a.input.url);
    let tokens = download_from_url(&Url::parse(&a.input.url).unwrap(), None)
        .await
        .unwrap();
    assert_eq!(Some(payload_hash(&tokens)), a.input.hash);
    assert_eq!(
        tokens.len(),
        2 * 8,
        "one byte per id of tiny's 256-token vocabulary"
    );

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

/// An S3 presigned PUT carries no size limit, so a miner can put any amount of data behind
/// its output URL. The orchestrator sizes the object (HEAD) before reading it and refuses the
/// result on the size alone; the work is re-offered.
#[tokio::test]
async fn r9_an_oversized_upload_is_refused_by_its_size() {
    let s3 = S3Server::start();
    let data_dir = tempfile::tempdir().unwrap();
    let state = s3_state(&s3, data_dir.path());
    let alice = Hotkey::from_uri("//Alice").unwrap();
    let work = head_work(&state, &alice).await;
    let a = &work.assignments[0];
    let out = a.output.as_ref().unwrap();
    let junk = Bytes::from(vec![7u8; 8 << 20]);
    upload_to_url(&Url::parse(&out.url).unwrap(), junk.clone())
        .await
        .unwrap();
    let submit = SubmitRequest {
        assignment_id: a.id,
        output_hash: Some(payload_hash(&junk)),
        output_bytes: Some(junk.len() as u64),
        loss: None,
        timings: Timings::default(),
    };
    let r: SubmitResponse = post(&state, "/api/submit", &submit, &alice).await;
    assert!(!r.accepted);
    let reason = r.reason.unwrap();
    assert!(
        reason.contains("size mismatch") && reason.contains(&(8u64 << 20).to_string()),
        "{reason}"
    );
    let again: WorkResponse = post(
        &state,
        "/api/work",
        &WorkRequest { max: 1, wait_ms: 0 },
        &alice,
    )
    .await;
    assert_eq!(
        again.assignments[0].sample_id, a.sample_id,
        "the work was not re-offered"
    );
}
