//! The validator endpoints and the local metagraph, driven through the orchestrator's router
//! with real hotkeys and a hand-moved clock: only listed validators get in, the ledger and a
//! miner's work come back in order with downloadable objects, weight vectors are checked,
//! signed, combined by stake with a dissenter visible, survive a restart, an epoch's
//! objects stay until every validator has published for it, and validators' agreed flags
//! exclude a repeat offender from routing while one lying validator's flags exclude nobody.

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};

use common::api_harness::*;
use iota::api::*;
use iota::orchestrator::Repository;
use iota::orchestrator::cycle::advance;
use iota::orchestrator::retention::release_done;
use iota::storage::payload_hash;
use iota::wallet::{Hotkey, RequestLine, SignedHeaders, verify_request};

const VALIDATORS: [(&str, f64); 3] = [("//Val1", 3.0), ("//Val2", 1.0), ("//Val3", 1.0)];

/// A one-section model (each sample is one tail forward with a loss), two samples per epoch,
/// three validators.
fn validator_config() -> iota::orchestrator::RunConfig {
    let validators: Vec<String> = VALIDATORS
        .iter()
        .map(|(uri, stake)| format!("{{hotkey: {}, stake: {stake}}}", key(uri).address()))
        .collect();
    config(&format!(
        "model: {{preset: tiny, n_layers: 1, d_model: 32, n_heads: 2, n_kv_heads: 2, d_ff: 64, \
         bottleneck: false, sections: [[0, 1]]}}\nbatches_before_merging: 2\nheartbeat_s: 1\n\
         merge: {{upload_s: 30, lease_grace_s: 5, merge_s: 30}}\n\
         validators: [{}]\nvalidation: {{dissent_l1: 0.8, retain_s: 3600}}\n",
        validators.join(", ")
    ))
}

impl Harness {
    async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> T {
        self.call(Request::get(path).body(Body::empty()).unwrap())
            .await
    }

    /// Trains until the phase leaves `training`; returns how many samples each miner did.
    async fn train(&self, miners: &[&Hotkey]) {
        for round in 0..20 {
            for m in miners {
                for a in self.work(m, 1).await {
                    let r = self
                        .submit(m, &a, None, Some(3.0 + round as f32 * 0.1))
                        .await;
                    assert!(r.accepted, "{r:?}");
                }
            }
            advance(&self.state).await.unwrap();
            if self.state.repo.phase_info().unwrap().phase != Phase::Training {
                return;
            }
        }
        panic!("the run never left training");
    }

    /// Lets the upload and merge deadlines pass with nobody uploading: the next epoch starts.
    async fn skip_merge(&self) {
        let epoch = self.state.repo.phase_info().unwrap().epoch;
        for _ in 0..4 {
            self.advance(40_000);
            advance(&self.state).await.unwrap();
        }
        assert_eq!(self.state.repo.phase_info().unwrap().epoch, epoch + 1);
    }
}

#[tokio::test]
async fn only_listed_validators_get_in_and_they_are_not_miners() {
    let h = harness_with(validator_config(), Repository::open_in_memory().unwrap());
    let alice = key("//Alice");
    h.register(&alice).await;
    let before = h.snapshot();
    let req = ValidatorRegisterRequest {
        device: "cpu".into(),
    };
    for outsider in [key("//Mallory"), alice.clone()] {
        let (status, body) = h
            .send(h.signed("/api/validator/register", &req, &outsider))
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert_eq!(error_code(&body), "not_a_validator");
        let (status, _) = h
            .send(h.signed(
                "/api/validator/ledger",
                &LedgerRequest { epoch: 0 },
                &outsider,
            ))
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN);
    }
    assert_eq!(h.snapshot(), before, "a refused request changed the state");
    let val = key("//Val1");
    let reg: ValidatorRegisterResponse = h
        .call(h.signed("/api/validator/register", &req, &val))
        .await;
    assert_eq!(reg.hotkey, val.address().to_string());
    assert_eq!(
        (reg.stake, reg.epoch, reg.run.as_str()),
        (3.0, 0, "test-run")
    );
    assert_eq!(reg.validation.dissent_l1, 0.8);
    // A validator is not a miner: it gets no training work.
    let (status, body) = h
        .send(h.signed("/api/work", &WorkRequest { max: 1, wait_ms: 0 }, &val))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(error_code(&body), "not_registered");
    // A forged signature is refused like everywhere else.
    let mut forged = h.signed("/api/validator/register", &req, &val);
    *forged.headers_mut().get_mut("X-Iota-Hotkey").unwrap() =
        key("//Val2").address().to_string().parse().unwrap();
    assert_eq!(h.send(forged).await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn ledger_and_work_come_back_in_order_with_downloadable_objects() {
    let h = harness_with(validator_config(), Repository::open_in_memory().unwrap());
    let (alice, bob, val) = (key("//Alice"), key("//Bob"), key("//Val1"));
    h.register(&alice).await;
    h.register(&bob).await;
    h.train(&[&alice, &bob]).await;
    let ledger: EpochLedger = h
        .call(h.signed("/api/validator/ledger", &LedgerRequest { epoch: 0 }, &val))
        .await;
    assert!(!ledger.merged);
    assert!(ledger.samples.len() >= 2, "{ledger:?}");
    for s in &ledger.samples {
        assert_eq!(s.pathway.len(), 1);
        assert!(s.loss.is_some_and(|l| l >= 3.0));
    }
    let names = [alice.address().to_string(), bob.address().to_string()];
    for m in &ledger.miners {
        assert!(names.contains(&m.hotkey));
        assert_eq!(m.missed_deadlines, 0);
    }
    let total: u64 = ledger.miners.iter().map(|m| m.completed_work).sum();
    assert_eq!(total, ledger.samples.len() as u64);

    let work: MinerWork = h
        .call(h.signed(
            "/api/validator/work",
            &MinerWorkRequest {
                epoch: 0,
                miner: names[0].clone(),
            },
            &val,
        ))
        .await;
    assert_eq!((work.section, work.start.clone()), (0, None));
    assert!(!work.items.is_empty());
    assert!(
        work.items
            .windows(2)
            .all(|w| w[0].accepted_unix_ms <= w[1].accepted_unix_ms)
    );
    for item in &work.items {
        assert_eq!(item.kind, WorkKind::Forward);
        assert!(item.loss.is_some() && item.output.is_none());
        let bytes = h.get_blob(&item.input).await;
        assert_eq!(Some(payload_hash(&bytes)), item.input.hash);
        let targets = h.get_blob(item.targets.as_ref().unwrap()).await;
        assert_eq!(targets.len(), 2 * 8, "one byte per id");
    }
    let blobs: SampleBlobs = h
        .call(h.signed(
            "/api/validator/samples",
            &SamplesRequest {
                epoch: 0,
                samples: vec![0, 999],
            },
            &val,
        ))
        .await;
    assert_eq!(blobs.samples.len(), 1, "unknown samples are left out");
    let tokens = h.get_blob(&blobs.samples[0].tokens).await;
    assert_eq!(Some(payload_hash(&tokens)), blobs.samples[0].tokens.hash);
    // Bad input is a clear error.
    let (status, _) = h
        .send(h.signed(
            "/api/validator/work",
            &MinerWorkRequest {
                epoch: 0,
                miner: "nobody".into(),
            },
            &val,
        ))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = h
        .send(h.signed("/api/validator/ledger", &LedgerRequest { epoch: 7 }, &val))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let too_many = SamplesRequest {
        epoch: 0,
        samples: (0..1000).collect(),
    };
    let (status, _) = h
        .send(h.signed("/api/validator/samples", &too_many, &val))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

/// `weights(..)` with `flagged` miners flagged (and paid nothing).
fn flagging(epoch: u64, w: &[(&Hotkey, f64)], flagged: &Hotkey, why: &str) -> WeightSubmission {
    let mut sub = weights(epoch, 0.0, w);
    for m in &mut sub.weights {
        if m.hotkey == flagged.address().to_string() {
            m.parts.flags = vec![why.to_string()];
        }
    }
    sub
}

#[tokio::test]
async fn agreed_flags_exclude_a_repeat_offender_and_one_lying_validator_excludes_nobody() {
    let h = harness_with(validator_config(), Repository::open_in_memory().unwrap());
    let (alice, bob) = (key("//Alice"), key("//Bob"));
    let vals: Vec<Hotkey> = VALIDATORS.iter().map(|(uri, _)| key(uri)).collect();
    h.register(&alice).await;
    h.register(&bob).await;
    let decisions = |m: &Hotkey| -> Vec<String> {
        h.state
            .repo
            .standing_of(&m.address().to_string())
            .unwrap()
            .into_iter()
            .map(|d| d.decision)
            .collect()
    };
    for epoch in 0..2 {
        h.train(&[&alice, &bob]).await;
        h.skip_merge().await;
        // Val1 (stake 3) and Val2 (stake 1) flag bob: 4/5 of the stake, two validators.
        // Val3 (stake 1) lies about alice every time.
        let honest = flagging(epoch, &[(&alice, 1.0), (&bob, 0.0)], &bob, "replay failed");
        let lie = flagging(epoch, &[(&alice, 0.0), (&bob, 1.0)], &alice, "made up");
        for (v, sub) in vals.iter().zip([&honest, &honest, &lie]) {
            let r: SubmitResponse = h.call(h.signed("/api/weights", sub, v)).await;
            assert!(r.accepted, "{r:?}");
        }
        // Republishing an epoch counts nothing twice.
        let r: SubmitResponse = h.call(h.signed("/api/weights", &honest, &vals[0])).await;
        assert!(r.accepted, "{r:?}");
        if epoch == 0 {
            assert_eq!(decisions(&bob), vec!["flagged"], "one flagged window only");
            let bob_key = bob.address().to_string();
            assert!(h.state.repo.may_take_new_work(&bob_key, h.now()).unwrap());
        }
    }
    assert_eq!(decisions(&bob), vec!["flagged", "flagged", "excluded"]);
    let last = h
        .state
        .repo
        .standing_of(&bob.address().to_string())
        .unwrap()
        .pop()
        .unwrap();
    assert!(last.reason.contains("80%") && last.reason.contains("replay failed"));
    assert!(last.until_ms.is_some());
    assert!(
        h.work(&bob, 4).await.is_empty(),
        "an excluded miner gets no work"
    );
    // The lone liar's flags never reached the quorum: alice has no decision and works.
    assert!(decisions(&alice).is_empty(), "{:?}", decisions(&alice));
    assert!(!h.work(&alice, 1).await.is_empty());
}

#[tokio::test]
async fn weights_are_checked_combined_by_stake_and_kept_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.sqlite");
    let h = harness_with(validator_config(), Repository::open(&db).unwrap());
    let (alice, bob) = (key("//Alice"), key("//Bob"));
    let vals: Vec<Hotkey> = VALIDATORS.iter().map(|(uri, _)| key(uri)).collect();
    h.register(&alice).await;
    h.register(&bob).await;
    h.train(&[&alice, &bob]).await;
    let good = weights(0, 0.0, &[(&alice, 0.6), (&bob, 0.4)]);
    // Epoch 0 is not finished yet.
    let r: SubmitResponse = h.call(h.signed("/api/weights", &good, &vals[0])).await;
    assert!(!r.accepted && r.reason.unwrap().contains("not finished"));
    h.skip_merge().await;

    // The epoch's activations are kept for the validators.
    let activations = h.state.keys.activations_epoch(0);
    let kept = || async {
        h.state
            .storage
            .list(Some(&activations))
            .await
            .unwrap()
            .len()
    };
    assert!(kept().await > 0);
    assert!(release_done(&h.state).await.is_empty());
    assert!(kept().await > 0);

    for (bad, why) in [
        (weights(0, 0.0, &[(&alice, 0.6), (&bob, 0.5)]), "sum to"),
        (
            weights(0, 0.0, &[(&alice, 0.6), (&vals[1], 0.4)]),
            "not a registered miner",
        ),
        (weights(0, -0.5, &[(&alice, 1.0), (&bob, 0.5)]), "burn"),
    ] {
        let r: SubmitResponse = h.call(h.signed("/api/weights", &bad, &vals[0])).await;
        assert!(
            !r.accepted && r.reason.as_ref().unwrap().contains(why),
            "{r:?}"
        );
    }
    // A miner cannot publish weights.
    let (status, _) = h.send(h.signed("/api/weights", &good, &alice)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let view: MetagraphView = h.get_json("/api/weights").await;
    assert!(view.validators.is_empty() && view.combined.is_empty());

    let dissent = weights(0, 0.0, &[(&alice, 0.0), (&bob, 1.0)]);
    for (v, sub) in vals.iter().zip([&good, &good, &dissent]) {
        let r: SubmitResponse = h.call(h.signed("/api/weights", sub, v)).await;
        assert!(r.accepted, "{r:?}");
    }
    let view: MetagraphView = h.get_json("/api/weights").await;
    assert_eq!(view.combine, Combine::Stake);
    // Stakes 3, 1, 1: alice (3 * 0.6 + 0.6 + 0) / 5 = 0.48, bob (1.2 + 0.4 + 1) / 5 = 0.52.
    let w = |name: &Hotkey| {
        view.combined
            .iter()
            .find(|(h, _)| *h == name.address().to_string())
            .unwrap()
            .1
    };
    assert!((w(&alice) - 0.48).abs() < 1e-9 && (w(&bob) - 0.52).abs() < 1e-9);
    assert_eq!(view.combined_burn, 0.0);
    let by = |k: &Hotkey| {
        view.validators
            .iter()
            .find(|v| v.hotkey == k.address().to_string())
            .unwrap()
    };
    // Val1 against (Val2 + Val3) / 2 = (0.3, 0.7): 0.6; Val3 against (0.6, 0.4): 1.2.
    assert!((by(&vals[0]).distance.unwrap() - 0.6).abs() < 1e-9);
    assert!(!by(&vals[0]).dissent && !by(&vals[1]).dissent);
    assert!(by(&vals[2]).dissent && (by(&vals[2]).distance.unwrap() - 1.2).abs() < 1e-9);
    // Anyone can check a vector's signature against the exact body it covers.
    for v in &view.validators {
        let headers = SignedHeaders {
            signature: v.signature.clone(),
            timestamp_ms: v.signed_unix_ms.to_string(),
            hotkey: v.hotkey.clone(),
            signed_for: view.run.clone(),
        };
        let signer = verify_request(
            &headers,
            RequestLine::post("/api/weights"),
            v.signed_body.as_bytes(),
            v.signed_unix_ms,
            0,
            &view.run,
        )
        .unwrap();
        assert_eq!(signer.to_string(), v.hotkey);
    }

    // Every validator published epoch 0: its objects go at the next tick.
    let released = release_done(&h.state).await;
    assert!(!released.is_empty());
    assert_eq!(kept().await, 0);

    // A restarted orchestrator serves the same metagraph.
    let before = serde_json::to_string(&view).unwrap();
    drop(h);
    let again = harness_with(validator_config(), Repository::open(&db).unwrap());
    let view: MetagraphView = again.get_json("/api/weights").await;
    assert_eq!(serde_json::to_string(&view).unwrap(), before);
}

#[tokio::test]
async fn kept_objects_go_when_their_time_is_up_even_without_every_validator() {
    let h = harness_with(validator_config(), Repository::open_in_memory().unwrap());
    let alice = key("//Alice");
    h.register(&alice).await;
    h.train(&[&alice]).await;
    h.skip_merge().await;
    let activations = h.state.keys.activations_epoch(0);
    assert!(
        !h.state
            .storage
            .list(Some(&activations))
            .await
            .unwrap()
            .is_empty()
    );
    // Only one validator publishes; the others never come.
    let r: SubmitResponse = h
        .call(h.signed(
            "/api/weights",
            &weights(0, 0.0, &[(&alice, 1.0)]),
            &key("//Val2"),
        ))
        .await;
    assert!(r.accepted);
    assert!(release_done(&h.state).await.is_empty());
    h.advance(3_600_000);
    assert!(!release_done(&h.state).await.is_empty());
    assert!(
        h.state
            .storage
            .list(Some(&activations))
            .await
            .unwrap()
            .is_empty()
    );
}
