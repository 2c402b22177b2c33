//! The merge cycle driven through the orchestrator's router with real hotkeys and a hand-moved
//! clock: miners are played by the test, which knows every uploaded vector and can therefore
//! check the merged result exactly, lie, or die at any step.

mod common;

use std::collections::HashMap;

use axum::body::Body;
use axum::http::Request;

use common::api_harness::*;
use iota::api::*;
use iota::merge::{
    MergeOp, OuterStep, PlanSpec, f32_from_le_bytes, f32_to_le_bytes, merge_partition,
    nesterov_outer_step,
};
use iota::orchestrator::Repository;
use iota::orchestrator::cycle::advance;
use iota::orchestrator::repo::UploadState;
use iota::storage::payload_hash;
use iota::wallet::Hotkey;

/// A one-section model (head = tail), so a sample is a single forward with a loss, and the
/// merge can be exercised with few moving parts.
fn merge_harness(merge: &str) -> Harness {
    let cfg = config(&format!(
        "model: {{preset: tiny, n_layers: 1, d_model: 32, n_heads: 2, n_kv_heads: 2, d_ff: 64, \
         bottleneck: false, sections: [[0, 1]]}}\nbatches_before_merging: 2\nheartbeat_s: 1\n\
         merge: {{upload_s: 30, lease_grace_s: 5, merge_s: 30{merge}}}\n"
    ));
    harness_with(cfg, Repository::open_in_memory().unwrap())
}

/// A miner played by the test.
struct Player {
    key: Hotkey,
    name: String,
    flat: Vec<f32>,
}

fn player(uri: &str, seed: f32, len: usize) -> Player {
    let key = key(uri);
    let name = key.address().to_string();
    let flat = (0..len)
        .map(|i| ((i as f32 * 0.37 + seed).sin() * (1.0 + seed)).abs() * 0.1 + seed * 0.01)
        .collect();
    Player { key, name, flat }
}

impl Harness {
    async fn task(&self, p: &Player, held_epoch: u64) -> MergeTaskResponse {
        self.call(self.signed("/api/merge/task", &MergeTaskRequest { held_epoch }, &p.key))
            .await
    }

    async fn merge_submit(&self, p: &Player, req: &MergeSubmitRequest) -> SubmitResponse {
        self.call(self.signed("/api/merge/submit", req, &p.key))
            .await
    }

    async fn merge_status(&self) -> MergeStatus {
        self.call(
            Request::get("/api/merge/status")
                .body(Body::empty())
                .unwrap(),
        )
        .await
    }

    async fn step(&self) {
        advance(&self.state).await.unwrap();
    }

    /// Runs samples to completion (each is one forward with a loss) until the phase changes.
    /// One whole epoch of the three players (Alice, Bob, Charlie, with flat states of `n`
    /// values that differ per epoch): train until the upload phase, upload, merge every
    /// partition honestly, finalise. Returns the players.
    async fn honest_epoch(&self, epoch: u64, n: usize) -> Vec<Player> {
        let players: Vec<Player> = ["//Alice", "//Bob", "//Charlie"]
            .iter()
            .enumerate()
            .map(|(k, u)| player(u, (epoch * 3 + k as u64) as f32, n))
            .collect();
        let all = [&players[0], &players[1], &players[2]];
        self.train_until_upload(&all).await;
        for q in all {
            assert!(self.upload_state(q, epoch, &q.flat, |_| {}).await.accepted);
        }
        self.step().await;
        self.step().await;
        for q in all {
            self.merge_work(q, &all, epoch, 1.0).await;
        }
        self.step().await;
        players
    }

    async fn train_until_upload(&self, players: &[&Player]) {
        for _ in 0..20 {
            for p in players {
                for a in self.work(&p.key, 2).await {
                    let r = self.submit(&p.key, &a, None, Some(3.0)).await;
                    assert!(r.accepted, "{r:?}");
                }
            }
            self.step().await;
            if self.merge_status().await.phase != Phase::Training {
                return;
            }
        }
        panic!("the run never left training");
    }

    /// Uploads `p`'s vector (the manifest may be tampered with by `edit`).
    async fn upload_state(
        &self,
        p: &Player,
        held: u64,
        values: &[f32],
        edit: impl FnOnce(&mut UploadManifest),
    ) -> SubmitResponse {
        self.upload_state_to(p, held, values, edit).await.0
    }

    /// As [`Self::upload_state`], also returning the upload URL the player was given.
    async fn upload_state_to(
        &self,
        p: &Player,
        held: u64,
        values: &[f32],
        edit: impl FnOnce(&mut UploadManifest),
    ) -> (SubmitResponse, BlobRef) {
        let resp = self.task(p, held).await;
        let MergeTask::Upload {
            epoch,
            layout,
            target,
            ..
        } = resp.task
        else {
            panic!("expected an upload task, got {:?}", resp.task);
        };
        let bytes = f32_to_le_bytes(values);
        let mut manifest = UploadManifest {
            layout,
            dtype: "f32".into(),
            hash: payload_hash(&bytes),
            bytes: bytes.len() as u64,
        };
        edit(&mut manifest);
        self.upload(&target, bytes).await;
        let r = self
            .merge_submit(p, &MergeSubmitRequest::Upload { epoch, manifest })
            .await;
        (r, target)
    }

    /// Does `p`'s merge work honestly (from the vectors the test knows), scaled by `lie`.
    async fn merge_work(&self, p: &Player, everyone: &[&Player], held: u64, lie: f32) -> usize {
        self.merge_work_claiming(p, everyone, held, lie, false)
            .await
    }

    /// As [`Self::merge_work`]; with `claim_honest` the hash submitted with each result is
    /// the honest (unscaled) result's, whatever bytes were uploaded.
    async fn merge_work_claiming(
        &self,
        p: &Player,
        everyone: &[&Player],
        held: u64,
        lie: f32,
        claim_honest: bool,
    ) -> usize {
        let resp = self.task(p, held).await;
        let MergeTask::Merge {
            epoch,
            op,
            partitions,
            ..
        } = resp.task
        else {
            return 0;
        };
        let by_name: HashMap<&str, &Player> =
            everyone.iter().map(|q| (q.name.as_str(), *q)).collect();
        for part in &partitions {
            let (s, e) = (part.start as usize, part.end as usize);
            // Read one source through its URL, as a miner would (byte range of the object).
            let first = &part.sources[0];
            let whole = f32_from_le_bytes(&self.get_blob(&first.blob).await).unwrap();
            assert_eq!(&whole[s..e], &by_name[first.hotkey.as_str()].flat[s..e]);
            let slices: Vec<&[f32]> = part
                .sources
                .iter()
                .map(|src| &by_name[src.hotkey.as_str()].flat[s..e])
                .collect();
            let weights: Vec<f32> = part.sources.iter().map(|src| src.weight).collect();
            let honest = merge_partition(op, &slices, &weights).unwrap();
            let merged: Vec<f32> = honest.iter().map(|v| v * lie).collect();
            let bytes = f32_to_le_bytes(&merged);
            let hash = if claim_honest {
                payload_hash(&f32_to_le_bytes(&honest))
            } else {
                payload_hash(&bytes)
            };
            let n = bytes.len() as u64;
            self.upload(&part.output, bytes).await;
            let r = self
                .merge_submit(
                    p,
                    &MergeSubmitRequest::Partition {
                        epoch,
                        index: part.index,
                        hash,
                        bytes: n,
                    },
                )
                .await;
            assert!(r.accepted, "{r:?}");
        }
        partitions.len()
    }

    /// Asserts that `miner`'s upload for epoch 0 was refused by the robust norm check.
    fn assert_left_out(&self, miner: &str) {
        let upload = self.state.repo.upload(0, miner).unwrap().unwrap();
        assert_eq!(upload.state, UploadState::Refused, "{upload:?}");
        let reason = upload.reason.as_deref().unwrap_or_default();
        assert!(
            reason.contains("away from the previous global state"),
            "{upload:?}"
        );
    }

    /// The checkpoint a player is told to adopt, with its values.
    /// Trains `all` until the merge of epoch 0 asks for uploads, has each upload its state
    /// (accepted), and moves the cycle on until the plan is built.
    async fn upload_all(&self, all: &[&Player]) {
        self.train_until_upload(all).await;
        for p in all {
            assert!(self.upload_state(p, 0, &p.flat, |_| {}).await.accepted);
        }
        self.step().await;
        self.step().await;
    }

    /// The merge weights of `players` for the merge of `epoch`: their backwards in it, or
    /// equal weights when none did any.
    fn merge_weights(&self, players: &[&Player], epoch: u64) -> Vec<f32> {
        let weights: Vec<f32> = players
            .iter()
            .map(|p| self.state.repo.backwards_in_epoch(&p.name, epoch).unwrap() as f32)
            .collect();
        if weights.iter().all(|w| *w == 0.0) {
            vec![1.0; players.len()]
        } else {
            weights
        }
    }

    async fn adopt(&self, p: &Player, held: u64) -> (SectionCheckpoint, Vec<f32>) {
        let resp = self.task(p, held).await;
        let MergeTask::Adopt { checkpoint } = resp.task else {
            panic!("expected adopt, got {:?}", resp.task);
        };
        let bytes = self.get_blob(&checkpoint.blob).await;
        assert_eq!(Some(payload_hash(&bytes)), checkpoint.blob.hash);
        (checkpoint, f32_from_le_bytes(&bytes).unwrap())
    }
}

/// The weighted mean the network must produce, computed directly on the whole vectors.
fn direct_mean(players: &[&Player], weights: &[f32]) -> Vec<f32> {
    let all: Vec<&[f32]> = players.iter().map(|p| p.flat.as_slice()).collect();
    merge_partition(MergeOp::Mean, &all, weights).unwrap()
}

async fn three_players(h: &Harness) -> (Player, Player, Player, usize) {
    let layout = iota::model::layout::section_layout(&h.state.config.model, 0).unwrap();
    let n = layout.total_len();
    let a = player("//Alice", 1.0, n);
    let b = player("//Bob", 2.0, n);
    let c = player("//Charlie", 3.0, n);
    for p in [&a, &b, &c] {
        h.register(&p.key).await;
    }
    (a, b, c, n)
}

/// The epoch's last result moves the run to uploading at once: the submit that completes the
/// epoch starts the phase machine, with no deadline-task tick (this harness runs none).
#[tokio::test]
async fn the_last_result_of_an_epoch_starts_the_merge_without_a_tick() {
    let h = merge_harness("");
    let alice = key("//Alice");
    h.register(&alice).await;
    let mut done = 0;
    while done < 2 {
        let work = h.work(&alice, 2).await;
        assert!(!work.is_empty(), "no work after {done} samples");
        for a in work {
            let r = h.submit(&alice, &a, None, Some(3.0)).await;
            assert!(r.accepted, "{r:?}");
            done += 1;
        }
    }
    // The phase machine runs in a background task: give it up to 5 s.
    for _ in 0..500 {
        if h.merge_status().await.phase == Phase::Uploading {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the run stayed in training after its epoch's last result");
}

#[tokio::test]
async fn a_full_cycle_merges_exactly_and_everyone_adopts_the_same_state() {
    let h = merge_harness("");
    let (a, b, c, n) = three_players(&h).await;
    let all = [&a, &b, &c];
    h.train_until_upload(&all).await;
    let status: StatusResponse = h
        .call(Request::get("/api/status").body(Body::empty()).unwrap())
        .await;
    assert_eq!(status.phase, Phase::Uploading);
    assert!(status.phase_deadline_unix_ms.is_some_and(|d| d > h.now()));
    // Training work is no longer handed out.
    assert!(h.work(&a.key, 2).await.is_empty());

    for p in all {
        let r = h.upload_state(p, 0, &p.flat, |_| {}).await;
        assert!(r.accepted, "{r:?}");
    }
    h.step().await; // every live miner uploaded: merging
    h.step().await; // plan
    assert_eq!(h.merge_status().await.phase, Phase::Merging);

    // Every party recomputes the same plan from the public inputs.
    let mut names: Vec<String> = all.iter().map(|p| p.name.clone()).collect();
    names.sort();
    let plan = PlanSpec::new("test-run", 0, 0, names, n).build().unwrap();
    let mut merged_parts = 0;
    for p in all {
        let resp = h.task(p, 0).await;
        let MergeTask::Merge { partitions, .. } = &resp.task else {
            panic!("{:?}", resp.task);
        };
        let mine: Vec<usize> = plan.partitions_for(&p.name).map(|q| q.index()).collect();
        let given: Vec<usize> = partitions.iter().map(|q| q.index).collect();
        assert_eq!(mine, given);
        merged_parts += h.merge_work(p, &all, 0, 1.0).await;
    }
    assert_eq!(merged_parts, plan.partitions().len() * 2);
    h.step().await;
    let ms = h.merge_status().await;
    assert_eq!((ms.phase, ms.epoch), (Phase::Training, 1));
    assert!(ms.sections[0].finalized && ms.sections[0].flagged.is_empty());

    // Weights are the backwards each miner did in the epoch.
    let mut weights = Vec::new();
    for p in all {
        weights.push(h.state.repo.backwards_in_epoch(&p.name, 0).unwrap() as f32);
    }
    let expected = if weights.iter().all(|w| *w == 0.0) {
        direct_mean(&all, &[1.0; 3])
    } else {
        direct_mean(&all, &weights)
    };
    let mut hashes = Vec::new();
    for p in all {
        let (cp, values) = h.adopt(p, 0).await;
        assert_eq!((cp.epoch, cp.section), (1, 0));
        assert_eq!(
            values, expected,
            "merged state differs from the direct mean"
        );
        hashes.push(cp.blob.hash.clone());
        // Once adopted, a miner is sent back to training.
        assert_eq!(h.task(p, 1).await.task, MergeTask::Train);
    }
    assert!(hashes.windows(2).all(|w| w[0] == w[1]));

    // A late joiner starts from the merged checkpoint.
    let dave = key("//Dave");
    let reg = h.register(&dave).await;
    let cp = reg.checkpoint.expect("late joiner gets the checkpoint");
    assert_eq!((cp.epoch, cp.blob.hash.clone()), (1, hashes[0].clone()));
    // And training goes on in epoch 1.
    let work = h.work(&a.key, 2).await;
    assert!(!work.is_empty());
    assert!(work.iter().all(|w| w.sample_id >= 2));
}

#[tokio::test]
async fn a_lying_merger_is_flagged_and_its_result_not_used() {
    let h = merge_harness("");
    let (a, b, c, _) = three_players(&h).await;
    let all = [&a, &b, &c];
    h.upload_all(&all).await;
    h.merge_work(&a, &all, 0, 1.0).await;
    h.merge_work(&b, &all, 0, 1.0).await;
    h.merge_work(&c, &all, 0, 1.5).await; // Charlie scales his results
    let ms = only_the_last_is_flagged(&h, &all, "disagreed").await;
    assert!(ms.sections[0].recomputed >= 1);
}

/// Ends the merge of epoch 0 and checks that the last of `all` alone was flagged (every flag
/// with `reason`) and penalised, and that the checkpoint is the honest mean of all uploads.
async fn only_the_last_is_flagged(h: &Harness, all: &[&Player], reason: &str) -> MergeStatus {
    let liar = all[all.len() - 1];
    h.step().await;
    let ms = h.merge_status().await;
    assert_eq!(ms.epoch, 1);
    let flagged = &ms.sections[0].flagged;
    assert!(!flagged.is_empty());
    assert!(
        flagged
            .iter()
            .all(|f| f.hotkey == liar.name && f.reason == reason),
        "{flagged:?}"
    );
    let weights = h.merge_weights(all, 0);
    let (_, values) = h.adopt(all[0], 0).await;
    assert_eq!(values, direct_mean(all, &weights));
    let miner = h.state.repo.miner(&liar.name).unwrap().unwrap();
    assert!(miner.penalties >= 1);
    ms
}

/// A merger that uploads one result and submits the hash of another (here: the honest one's,
/// over scaled bytes) has its submission accepted on size alone, and is caught when the
/// section is finalised: its copy does not hash as submitted, so it is flagged `invalid`,
/// penalised and left out. A submission whose hash is not 64 hex digits is refused at once.
#[tokio::test]
async fn a_merger_whose_copy_does_not_hash_as_submitted_is_flagged_invalid() {
    let h = merge_harness("");
    let (a, b, c, _) = three_players(&h).await;
    let all = [&a, &b, &c];
    h.upload_all(&all).await;
    let MergeTask::Merge { partitions, .. } = h.task(&c, 0).await.task else {
        panic!("expected a merge task for {}", c.name);
    };
    let first = &partitions[0];
    let r = h
        .merge_submit(
            &c,
            &MergeSubmitRequest::Partition {
                epoch: 0,
                index: first.index,
                hash: "not a hash".into(),
                bytes: 4 * (first.end - first.start),
            },
        )
        .await;
    assert!(!r.accepted, "{r:?}");
    assert!(
        r.reason
            .as_deref()
            .unwrap_or_default()
            .contains("64 hex digits"),
        "{r:?}"
    );
    h.merge_work(&a, &all, 0, 1.0).await;
    h.merge_work(&b, &all, 0, 1.0).await;
    // Charlie uploads results scaled by 1.5 but submits the honest results' hashes.
    assert!(h.merge_work_claiming(&c, &all, 0, 1.5, true).await > 0);
    only_the_last_is_flagged(&h, &all, "invalid").await;
}

#[tokio::test]
async fn dead_mergers_are_covered_by_their_twin_or_the_previous_global() {
    let h = merge_harness("");
    let (a, b, c, n) = three_players(&h).await;
    let all = [&a, &b, &c];
    // Epoch 0: an honest merge gives the previous global values.
    h.upload_all(&all).await;
    for p in all {
        h.merge_work(p, &all, 0, 1.0).await;
    }
    h.step().await;
    let (_, previous) = h.adopt(&a, 0).await;

    // Epoch 1: new vectors; Alice and Bob die after uploading, only Charlie merges.
    let shifted: Vec<Player> = [("//Alice", 4.0), ("//Bob", 5.0), ("//Charlie", 6.0)]
        .iter()
        .map(|(u, s)| player(u, *s, n))
        .collect();
    let now = [&shifted[0], &shifted[1], &shifted[2]];
    h.train_until_upload(&now).await;
    for p in now {
        let resp = h.task(p, 1).await;
        assert!(
            matches!(resp.task, MergeTask::Upload { .. }),
            "{:?}",
            resp.task
        );
        let r = h.upload_state(p, 1, &p.flat, |_| {}).await;
        assert!(r.accepted, "{r:?}");
    }
    h.step().await;
    h.step().await;
    h.merge_work(&shifted[2], &now, 1, 1.0).await;
    h.step().await;
    assert_eq!(
        h.merge_status().await.phase,
        Phase::Merging,
        "waits for the deadline"
    );
    h.advance(60_000);
    h.step().await;
    let ms = h.merge_status().await;
    assert_eq!(
        (ms.phase, ms.epoch),
        (Phase::Training, 2),
        "the run goes on"
    );

    let mut names: Vec<String> = now.iter().map(|p| p.name.clone()).collect();
    names.sort();
    let plan = PlanSpec::new("test-run", 0, 1, names, n).build().unwrap();
    let weights = h.merge_weights(&now, 1);
    let fresh = direct_mean(&now, &weights);
    let (cp, values) = h.adopt(&shifted[0], 1).await;
    assert_eq!(cp.epoch, 2);
    let mut fallbacks = 0;
    for part in plan.partitions() {
        let r = part.range();
        if part.mergers().contains(&shifted[2].name) {
            assert_eq!(values[r.clone()], fresh[r], "twin's copy used");
        } else {
            fallbacks += 1;
            assert_eq!(values[r.clone()], previous[r], "previous global used");
        }
    }
    assert_eq!(ms.sections[0].fallbacks, fallbacks);
    // The dead mergers are flagged as missing.
    assert!(
        ms.sections[0]
            .flagged
            .iter()
            .all(|f| f.reason == "missing" && f.hotkey != shifted[2].name)
    );
}

#[tokio::test]
async fn bad_uploads_are_refused_and_their_uploaders_left_out() {
    let h = merge_harness("");
    let (a, b, c, _) = three_players(&h).await;
    let dave = player("//Dave", 7.0, a.flat.len());
    h.register(&dave.key).await;
    let all = [&a, &b, &c, &dave];
    h.train_until_upload(&all).await;

    // Submitting before asking for a lease is refused and changes nothing.
    let early = h
        .merge_submit(
            &a,
            &MergeSubmitRequest::Upload {
                epoch: 0,
                manifest: UploadManifest {
                    layout: iota::model::layout::section_layout(&h.state.config.model, 0).unwrap(),
                    dtype: "f32".into(),
                    hash: "00".into(),
                    bytes: 0,
                },
            },
        )
        .await;
    assert!(!early.accepted);

    let mut nan = a.flat.clone();
    nan[5] = f32::NAN;
    let r = h.upload_state(&a, 0, &nan, |_| {}).await;
    assert!(
        !r.accepted && r.reason.as_deref().unwrap().contains("non-finite"),
        "{r:?}"
    );
    let r = h
        .upload_state(&b, 0, &b.flat, |m| m.layout.tensors[0].shape = vec![1, 2])
        .await;
    assert!(
        !r.accepted && r.reason.as_deref().unwrap().contains("layout"),
        "{r:?}"
    );
    let r = h.upload_state(&c, 0, &c.flat[1..], |_| {}).await;
    assert!(!r.accepted, "{r:?}");
    let r = h
        .upload_state(&dave, 0, &dave.flat, |m| m.hash = payload_hash(b"other"))
        .await;
    assert!(
        !r.accepted && r.reason.as_deref().unwrap().contains("hash"),
        "{r:?}"
    );
    // A refused upload cannot be retried in the same merge (the request waits for the cycle,
    // which has nothing to merge and goes back to training).
    let again = h.task(&a, 0).await;
    assert!(
        matches!(again.task, MergeTask::Wait { .. } | MergeTask::Train),
        "{:?}",
        again.task
    );
    for p in all {
        assert!(h.state.repo.miner(&p.name).unwrap().unwrap().penalties >= 1);
    }
    // Nobody valid uploaded: the section keeps its state and training resumes.
    h.step().await;
    h.step().await;
    let ms = h.merge_status().await;
    assert_eq!((ms.phase, ms.epoch), (Phase::Training, 1));
    assert_eq!(ms.sections[0].uploads, 0);
    assert_eq!(ms.sections[0].checkpoint_hash, None);
}

#[tokio::test]
async fn a_merge_task_with_nothing_to_do_is_held_until_the_plan_is_built() {
    let h = merge_harness("");
    let (a, b, c, _) = three_players(&h).await;
    h.train_until_upload(&[&a, &b, &c]).await;
    assert!(h.upload_state(&a, 0, &a.flat, |_| {}).await.accepted);
    // Alice has nothing to do until the others' uploads are in. Her request is held instead
    // of answered "wait", and brings her merge task once the last upload builds the plan.
    let (held, ()) = tokio::join!(h.task(&a, 0), async {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(h.upload_state(&b, 0, &b.flat, |_| {}).await.accepted);
        assert!(h.upload_state(&c, 0, &c.flat, |_| {}).await.accepted);
    });
    assert!(
        matches!(held.task, MergeTask::Merge { .. }),
        "{:?}",
        held.task
    );
    assert_eq!(held.phase, Phase::Merging);
}

#[tokio::test]
async fn a_lease_lets_an_upload_finish_after_the_phase_changed() {
    let h = merge_harness("");
    let (a, b, c, _) = three_players(&h).await;
    let all = [&a, &b, &c];
    h.train_until_upload(&all).await;
    assert!(h.upload_state(&a, 0, &a.flat, |_| {}).await.accepted);
    // Bob takes his lease now and finishes after the upload deadline; Charlie never asks.
    let MergeTask::Upload {
        lease_until_unix_ms,
        ..
    } = h.task(&b, 0).await.task
    else {
        panic!("expected upload");
    };
    h.advance(31_000);
    h.step().await;
    assert_eq!(h.merge_status().await.phase, Phase::Merging);
    h.step().await; // Bob's lease is open: no plan yet
    assert_eq!(h.merge_status().await.sections[0].partitions, 0);
    assert!(h.now() < lease_until_unix_ms);
    let r = h.upload_state(&b, 0, &b.flat, |_| {}).await;
    assert!(r.accepted, "{r:?}");
    // Charlie, without a lease, is told to wait.
    assert!(matches!(h.task(&c, 0).await.task, MergeTask::Wait { .. }));
    h.step().await;
    let ms = h.merge_status().await;
    assert_eq!((ms.sections[0].uploads, ms.sections[0].partitions), (2, 2));
}

#[tokio::test]
async fn the_operator_and_outer_step_follow_the_config() {
    let h = merge_harness(", op: median, outer: {lr: 0.5, momentum: 0.5}");
    let (_, _, _, n) = three_players(&h).await;
    let step = OuterStep {
        lr: 0.5,
        momentum: 0.5,
    };
    let layout = iota::model::layout::section_layout(&h.state.config.model, 0).unwrap();
    let p = layout.params_len as usize;
    let mut global: Option<Vec<f32>> = None;
    let mut momentum = vec![0.0f32; p];
    for epoch in 0..3u64 {
        let players = h.honest_epoch(epoch, n).await;
        let all = [&players[0], &players[1], &players[2]];
        let ms = h.merge_status().await;
        assert_eq!((ms.op, ms.epoch), (MergeOp::Median, epoch + 1));
        let weights: Vec<f32> = all
            .iter()
            .map(|q| h.state.repo.backwards_in_epoch(&q.name, epoch).unwrap() as f32)
            .collect();
        let flats: Vec<&[f32]> = all.iter().map(|q| q.flat.as_slice()).collect();
        let mut expected = merge_partition(MergeOp::Median, &flats, &weights).unwrap();
        // No outer step at the first merge (no previous global); afterwards Nesterov on the
        // parameters only, with the momentum kept by the orchestrator between merges.
        if let Some(prev) = &global {
            let stepped =
                nesterov_outer_step(&prev[..p], &expected[..p], &mut momentum, step).unwrap();
            expected[..p].copy_from_slice(&stepped);
        }
        let (_, got) = h.adopt(&players[0], epoch).await;
        assert_eq!(got, expected, "epoch {epoch}");
        global = Some(got);
    }
}

/// Garbage (issue 9): checkpoints and the outer momentum were never collected, and the
/// routing ledger never pruned. With `retention: {checkpoints: 2, ledger_epochs: 1}`, after
/// each of four merges only the newest two checkpoints (state and momentum) of the section are
/// left in storage, the outer step still finds the momentum it needs, and the assignments and
/// pathways of finished epochs are gone while every sample id keeps its ledger row and the
/// counters keep their totals.
#[tokio::test]
async fn r9_old_checkpoints_and_routing_rows_are_collected_keeping_the_newest() {
    use iota::storage::StatePart;
    let cfg = config(
        "model: {preset: tiny, n_layers: 1, d_model: 32, n_heads: 2, n_kv_heads: 2, d_ff: 64, \
         bottleneck: false, sections: [[0, 1]]}\nbatches_before_merging: 2\nheartbeat_s: 1\n\
         merge: {upload_s: 30, lease_grace_s: 5, merge_s: 30, outer: {lr: 0.5, momentum: 0.5}}\n\
         retention: {checkpoints: 2, ledger_epochs: 1}\n",
    );
    let h = harness_with(cfg, Repository::open_in_memory().unwrap());
    let (_, _, _, n) = three_players(&h).await;
    let stored = |epoch: u64, part: StatePart| {
        let key = h.state.checkpoint_key(0, epoch, part);
        let storage = h.state.storage.clone();
        async move { storage.exists(&key).await.unwrap() }
    };
    for epoch in 0..4u64 {
        let players = h.honest_epoch(epoch, n).await;
        let ms = h.merge_status().await;
        assert_eq!((ms.phase, ms.epoch), (Phase::Training, epoch + 1));
        assert_eq!(ms.sections[0].fallbacks, 0, "{ms:?}");
        // Checkpoints 1 ..= epoch + 1 were written; the newest two remain.
        for e in 1..=epoch + 1 {
            let want = e + 2 > epoch + 1;
            assert_eq!(
                stored(e, StatePart::Flat).await,
                want,
                "state {e} after merge {epoch}"
            );
            if e >= 2 {
                // The outer step (from the second merge on) keeps its momentum beside it.
                assert_eq!(
                    stored(e, StatePart::OuterMomentum).await,
                    want,
                    "momentum {e}"
                );
            }
        }
        // Every miner can still adopt the newest checkpoint.
        let (cp, _) = h.adopt(&players[0], epoch).await;
        assert_eq!(cp.epoch, epoch + 1);
    }
    // Routing rows of finished epochs are gone; the epoch in training keeps its own.
    let samples = h.state.repo.counts().unwrap();
    assert_eq!(samples.completed, 8, "two samples per epoch, four epochs");
    for id in 0..8 {
        let row = h
            .state
            .repo
            .sample(id)
            .unwrap()
            .expect("every sample id keeps its row");
        assert_eq!(
            row.outcome,
            iota::orchestrator::repo_types::SampleOutcome::Completed
        );
        assert!(
            h.state.repo.assignments_of(id, 0).unwrap().is_empty(),
            "sample {id} of a finished epoch kept its assignments"
        );
        assert!(h.state.repo.pathway(id).unwrap().is_empty(), "sample {id}");
    }
    let epochs = h.merge_status().await.epochs;
    assert_eq!(
        epochs.iter().map(|e| e.completed).collect::<Vec<_>>(),
        vec![2, 2, 2, 2],
        "epoch summaries survive the pruning"
    );
}

/// Early merges (issue 8): with `early_merge_samples: 4, early_merge_every: 2` and
/// `batches_before_merging: 3`, the first two epochs end after 2 samples each and the next
/// after 3, although the players ask for more work than that; the merge status reports each
/// epoch's own length while it trains.
#[tokio::test]
async fn the_early_epochs_are_shorter() {
    let cfg = config(
        "model: {preset: tiny, n_layers: 1, d_model: 32, n_heads: 2, n_kv_heads: 2, d_ff: 64, \
         bottleneck: false, sections: [[0, 1]]}\nbatches_before_merging: 3\nheartbeat_s: 1\n\
         early_merge_samples: 4\nearly_merge_every: 2\n\
         merge: {upload_s: 30, lease_grace_s: 5, merge_s: 30}\n",
    );
    let h = harness_with(cfg, Repository::open_in_memory().unwrap());
    let (_, _, _, n) = three_players(&h).await;
    let mut lengths = Vec::new();
    for epoch in 0..3u64 {
        lengths.push(h.merge_status().await.batches_before_merging);
        h.honest_epoch(epoch, n).await;
        let ms = h.merge_status().await;
        assert_eq!((ms.phase, ms.epoch), (Phase::Training, epoch + 1));
    }
    assert_eq!(lengths, [2, 2, 3]);
    let epochs = h.merge_status().await.epochs;
    assert_eq!(
        epochs.iter().map(|e| e.completed).collect::<Vec<_>>(),
        vec![2, 2, 3]
    );
}

/// A harness whose state lives in `dir` (SQLite file and local objects), with the clock at `now`.
fn harness_in(dir: &std::path::Path, now: u64) -> Harness {
    use iota::storage::{Storage, StorageConfig};
    let cfg = config(
        "model: {preset: tiny, n_layers: 1, d_model: 32, n_heads: 2, n_kv_heads: 2, d_ff: 64, \
         bottleneck: false, sections: [[0, 1]]}\nbatches_before_merging: 2\nheartbeat_s: 1\n\
         merge: {upload_s: 30, lease_grace_s: 5, merge_s: 30}\n",
    );
    let storage =
        Storage::open(&StorageConfig::local(dir.join("objects").to_string_lossy())).unwrap();
    harness_on(
        cfg,
        Repository::open(&dir.join("state.sqlite")).unwrap(),
        storage,
        now,
    )
}

#[tokio::test]
async fn an_orchestrator_restarted_mid_merge_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    let h = harness_in(dir.path(), T0);
    let (a, b, c, _) = three_players(&h).await;
    let all = [&a, &b, &c];
    h.upload_all(&all).await;
    h.merge_work(&a, &all, 0, 1.0).await;
    h.merge_work(&b, &all, 0, 1.0).await;
    let now = h.now();
    drop(h);

    let h = harness_in(dir.path(), now + 1_000);
    assert_eq!(h.merge_status().await.phase, Phase::Merging);
    assert!(
        h.merge_work(&c, &all, 0, 1.0).await > 0,
        "Charlie's partitions survived"
    );
    h.step().await;
    let ms = h.merge_status().await;
    assert_eq!((ms.phase, ms.epoch), (Phase::Training, 1));
    assert!(ms.sections[0].flagged.is_empty());
    let weights: Vec<f32> = all
        .iter()
        .map(|p| h.state.repo.backwards_in_epoch(&p.name, 0).unwrap() as f32)
        .collect();
    let (_, values) = h.adopt(&b, 0).await;
    assert_eq!(values, direct_mean(&all, &weights));
}

#[tokio::test]
async fn a_lone_copy_is_checked_by_the_orchestrator() {
    let h = merge_harness("");
    let (a, b, c, _) = three_players(&h).await;
    let all = [&a, &b, &c];
    h.upload_all(&all).await;
    // Alice dies before merging; Charlie lies wherever he merges, even where he is alone.
    h.merge_work(&b, &all, 0, 1.0).await;
    h.merge_work(&c, &all, 0, 1.25).await;
    h.advance(60_000);
    h.step().await;
    let ms = h.merge_status().await;
    assert_eq!(ms.epoch, 1);
    let flags: Vec<(&str, &str)> = ms.sections[0]
        .flagged
        .iter()
        .map(|f| (f.hotkey.as_str(), f.reason.as_str()))
        .collect();
    assert!(flags.contains(&(c.name.as_str(), "disagreed")), "{flags:?}");
    assert!(flags.contains(&(a.name.as_str(), "missing")), "{flags:?}");
    assert!(flags.iter().all(|(who, _)| *who != b.name), "{flags:?}");
    let weights: Vec<f32> = all
        .iter()
        .map(|p| h.state.repo.backwards_in_epoch(&p.name, 0).unwrap() as f32)
        .collect();
    let (_, values) = h.adopt(&b, 0).await;
    assert_eq!(
        values,
        direct_mean(&all, &weights),
        "no lie reached the checkpoint"
    );
}

/// One finite but huge upload (±3e38) passes the finiteness check and, under `mean`, used to
/// destroy the section's checkpoint. Its distance from the reference state (here the seed's
/// initial state: this is the first merge) is far out of line, so it is left out before the
/// plan is built, its uploader penalised, and the checkpoint is the merge of the others.
#[tokio::test]
async fn r9_a_huge_but_finite_upload_is_left_out_of_the_merge() {
    let h = merge_harness("");
    let (a, b, c, n) = three_players(&h).await;
    let all = [&a, &b, &c];
    h.train_until_upload(&all).await;
    // The poisoner is the miner the mean would weigh most.
    let backwards = |p: &Player| h.state.repo.backwards_in_epoch(&p.name, 0).unwrap();
    let poisoner = *all.iter().max_by_key(|p| backwards(p)).unwrap();
    let honest: Vec<&Player> = all
        .iter()
        .copied()
        .filter(|p| p.name != poisoner.name)
        .collect();
    let mut poison = poisoner.flat.clone();
    poison[0] = 3e38;
    poison[n / 2] = -3e38;
    for p in all {
        let values = if p.name == poisoner.name {
            &poison
        } else {
            &p.flat
        };
        assert!(h.upload_state(p, 0, values, |_| {}).await.accepted);
    }
    h.step().await;
    h.step().await;
    h.assert_left_out(&poisoner.name);
    for p in &honest {
        h.merge_work(p, &honest, 0, 1.0).await;
    }
    assert_eq!(
        h.merge_work(poisoner, &all, 0, 1.0).await,
        0,
        "the poisoner merges nothing"
    );
    h.step().await;
    assert_eq!(h.merge_status().await.epoch, 1);
    let weights: Vec<f32> = honest.iter().map(|p| backwards(p) as f32).collect();
    let expected = if weights.iter().all(|w| *w == 0.0) {
        direct_mean(&honest, &[1.0; 2])
    } else {
        direct_mean(&honest, &weights)
    };
    let (_, values) = h.adopt(&a, 0).await;
    assert!(
        values.iter().all(|v| v.abs() < 10.0),
        "the checkpoint was poisoned"
    );
    assert_eq!(values, expected);
    assert!(
        backwards(poisoner) == 0
            || h.state
                .repo
                .miner(&poisoner.name)
                .unwrap()
                .unwrap()
                .penalties
                >= 1
    );
}

/// A miner that did no work in the epoch uploads with zero merge weight: its upload does not
/// enter the mean, but it joins the plan (its miner merges partitions). Such an upload of
/// ±3e38 used to skip the norm check and stay accepted (CI saw it: `iota mine --adversary
/// poisoner`, backed off after its first refusal, had no work in the next even epoch). It is
/// now refused and penalised, and the checkpoint is the merge of the others.
#[tokio::test]
async fn a_huge_upload_of_zero_weight_is_refused_too() {
    let h = merge_harness("");
    let (a, b, c, n) = three_players(&h).await;
    let idle = player("//Dave", 4.0, n);
    h.register(&idle.key).await;
    let workers = [&a, &b, &c];
    h.train_until_upload(&workers).await;
    let backwards = |p: &Player| h.state.repo.backwards_in_epoch(&p.name, 0).unwrap();
    assert_eq!(backwards(&idle), 0);
    // The parameters only (a negative second moment would fail the decoder), as the
    // adversary of `iota mine` does.
    let mut poison = idle.flat.clone();
    for (i, v) in poison.iter_mut().take(n / 3).enumerate() {
        *v = if i % 2 == 0 { 3e38 } else { -3e38 };
    }
    let r = h.upload_state(&idle, 0, &poison, |_| {}).await;
    assert!(r.accepted, "{r:?}");
    for p in workers {
        assert!(h.upload_state(p, 0, &p.flat, |_| {}).await.accepted);
    }
    h.step().await;
    h.step().await;
    h.assert_left_out(&idle.name);
    assert!(h.state.repo.miner(&idle.name).unwrap().unwrap().penalties >= 1);
    let everyone = [&a, &b, &c, &idle];
    for p in workers {
        h.merge_work(p, &everyone, 0, 1.0).await;
    }
    assert_eq!(h.merge_work(&idle, &everyone, 0, 1.0).await, 0);
    h.step().await;
    assert_eq!(h.merge_status().await.epoch, 1);
    let weights: Vec<f32> = workers.iter().map(|p| backwards(p) as f32).collect();
    let (_, values) = h.adopt(&a, 0).await;
    assert_eq!(values, direct_mean(&workers, &weights));
}

/// After its upload is accepted, an uploader still holds a valid PUT URL until its lease ends.
/// Overwriting the object with something short used to make the merge read it unhashed (and
/// finalisation fail on every tick). Mergers and the orchestrator now read the orchestrator's
/// copy taken at acceptance, and every merge source comes with the hash it was accepted with.
#[tokio::test]
async fn r9_an_accepted_upload_cannot_be_swapped_and_sources_carry_hashes() {
    let h = merge_harness("");
    let (a, b, c, _) = three_players(&h).await;
    let all = [&a, &b, &c];
    h.train_until_upload(&all).await;
    let mut target_of_c = None;
    for p in all {
        let (r, target) = h.upload_state_to(p, 0, &p.flat, |_| {}).await;
        assert!(r.accepted, "{r:?}");
        if p.name == c.name {
            target_of_c = Some(target);
        }
    }
    // Charlie swaps his accepted upload for a short object.
    h.upload(&target_of_c.unwrap(), vec![0u8; 8]).await;
    h.step().await;
    h.step().await;
    for p in all {
        let resp = h.task(p, 0).await;
        let MergeTask::Merge { partitions, .. } = &resp.task else {
            panic!("{:?}", resp.task);
        };
        for part in partitions {
            for source in &part.sources {
                let owner = all.iter().find(|q| q.name == source.hotkey).unwrap();
                let original = f32_to_le_bytes(&owner.flat);
                assert_eq!(source.blob.hash, Some(payload_hash(&original)));
                assert_eq!(h.get_blob(&source.blob).await, original);
            }
        }
        h.merge_work(p, &all, 0, 1.0).await;
    }
    // Nobody's copy is cross-checked away: the orchestrator's own checks read the copies too.
    h.step().await;
    let ms = h.merge_status().await;
    assert_eq!(ms.epoch, 1);
    assert!(
        ms.sections[0].flagged.is_empty(),
        "{:?}",
        ms.sections[0].flagged
    );
}

/// Finalisation must not be able to loop forever. Here every input of the merge is lost after
/// the plan was built and nobody merges: before the deadline the step waits; past it the
/// section falls back (recorded as such) and training resumes.
#[tokio::test]
async fn r9_a_merge_whose_inputs_vanish_falls_back_at_the_deadline() {
    let h = merge_harness("");
    let (a, b, c, _) = three_players(&h).await;
    let all = [&a, &b, &c];
    h.upload_all(&all).await;
    assert_eq!(h.merge_status().await.phase, Phase::Merging);
    for p in all {
        let key = h.state.accepted_upload_key(0, 0, &p.name).unwrap();
        h.state.storage.delete(&key).await.unwrap();
    }
    h.step().await;
    assert_eq!(
        h.merge_status().await.phase,
        Phase::Merging,
        "waits for mergers"
    );
    // The merge deadline: lease grace (5 s) + merge phase (30 s).
    h.advance(36_000);
    h.step().await;
    let ms = h.merge_status().await;
    assert_eq!((ms.phase, ms.epoch), (Phase::Training, 1));
    let verdicts = h.state.repo.verdicts(0, 0).unwrap();
    assert!(
        verdicts
            .iter()
            .any(|(_, v)| v.starts_with("fallback to previous: finalising failed")),
        "{verdicts:?}"
    );
    assert_eq!(h.task(&a, 0).await.task, MergeTask::Train);
}

/// Uploads `bytes` as `p`'s state in `dtype`, with an honest manifest for those bytes.
async fn upload_raw(h: &Harness, p: &Player, bytes: Vec<u8>, dtype: &str) -> SubmitResponse {
    let resp = h.task(p, 0).await;
    let MergeTask::Upload {
        epoch,
        layout,
        target,
        ..
    } = resp.task
    else {
        panic!("expected an upload task, got {:?}", resp.task);
    };
    let manifest = UploadManifest {
        layout,
        dtype: dtype.into(),
        hash: payload_hash(&bytes),
        bytes: bytes.len() as u64,
    };
    h.upload(&target, bytes).await;
    h.merge_submit(p, &MergeSubmitRequest::Upload { epoch, manifest })
        .await
}

/// A run with `merge.wire: bf16`, `int8`, `dct` or `sign`: the upload and partition URLs are
/// sized for that format, a hostile uploader's bytes (a NaN or overflowing int8 scale, a NaN
/// bf16 or dct value, a NaN or negative sign scale, a negative second moment, a repeated dct
/// index, f32 bytes in a compressed run)
/// are refused with the reason, and the honest uploads merge, partition by partition, into
/// exactly the merge of their decoded values as the format writes them back. With `dct` and
/// `sign` everything is a change from the initial state (the previous global one at epoch 0), and
/// the checkpoint's delta rebuilds the checkpoint bit for bit.
#[tokio::test]
async fn compressed_merges_refuse_hostile_bytes_and_merge_the_decoded_values() {
    use iota::codec::{MergeWire, ParamCode, Span};
    use iota::miner::participant::{MergeFormat, merge_encoded};
    let dct: MergeWire = "dct:16:2:4".parse().unwrap();
    let sign: MergeWire = "sign:16:2:4".parse().unwrap();
    for wire in [MergeWire::Bf16, MergeWire::Int8, dct, sign] {
        let h = merge_harness(&format!(", wire: \"{wire}\""));
        let (a, b, c, n) = three_players(&h).await;
        let eve = player("//Eve", 5.0, n);
        let mallory = player("//Mallory", 6.0, n);
        let trent = player("//Trent", 8.0, n);
        for p in [&eve, &mallory, &trent] {
            h.register(&p.key).await;
        }
        let honest = [&a, &b, &c];
        h.train_until_upload(&[&a, &b, &c, &eve, &mallory, &trent])
            .await;
        let cfg = &h.state.config;
        let layout = iota::model::layout::section_layout(&cfg.model, 0).unwrap();
        let span = Span::whole(layout.params_len);
        // The state every miner started from: what dct objects are a change from.
        let initial =
            iota::model::Section::<burn::backend::Autodiff<iota::model::backend::Cpu>>::new(
                &cfg.model,
                0,
                cfg.seed,
                cfg.optimizer,
                &Default::default(),
            )
            .unwrap()
            .export_flat(&layout)
            .unwrap();
        let base = wire.base_of(&initial, n as u64, span).unwrap();
        let encode = |p: &Player| wire.encode(&p.flat, span, base).unwrap();
        let name = wire.to_string();

        // Hostile bytes of the right length, each with an honest hash of what was sent.
        let mut bad = encode(&eve);
        match wire {
            MergeWire::Int8 => bad[..4].copy_from_slice(&f32::NAN.to_le_bytes()),
            MergeWire::Delta(s) if s.params == ParamCode::Sign => {
                bad[..4].copy_from_slice(&f32::NAN.to_le_bytes())
            }
            MergeWire::Delta(_) => bad[1..3].copy_from_slice(&0x7FC0u16.to_le_bytes()),
            _ => bad[..2].copy_from_slice(&0x7FC0u16.to_le_bytes()),
        }
        let r = upload_raw(&h, &eve, bad, &name).await;
        let reason = r.reason.unwrap_or_default();
        assert!(
            !r.accepted && (reason.contains("scale") || reason.contains("non-finite")),
            "{wire}: {reason}"
        );
        let mut negative = mallory.flat.clone();
        let last = negative.len() - 1;
        negative[last] = 1.0;
        let mut bad = wire.encode(&negative, span, base).unwrap();
        let end = bad.len();
        let expected = match wire {
            MergeWire::Int8 => {
                bad[end - 1] = (-3i8) as u8;
                "negative second moment"
            }
            MergeWire::Delta(s) if s.params == ParamCode::Sign => {
                // The second parameter chunk's scale below zero.
                bad[6..10].copy_from_slice(&(-1.0f32).to_le_bytes());
                "invalid scale -1"
            }
            MergeWire::Delta(_) => {
                // The first chunk's second entry names the same index as its first.
                bad[3] = bad[0];
                "repeated or out of order"
            }
            _ => {
                bad[end - 2..].copy_from_slice(&0xBF80u16.to_le_bytes());
                "negative second moment"
            }
        };
        let r = upload_raw(&h, &mallory, bad, &name).await;
        assert!(
            !r.accepted && r.reason.as_deref().unwrap().contains(expected),
            "{wire}: {r:?}"
        );
        // The format's bytes, announced as another format (an f32 object of the same values
        // could not even be PUT: the upload URL is sized for this run's format).
        let r = upload_raw(&h, &trent, encode(&trent), "f32").await;
        assert!(
            !r.accepted && r.reason.as_deref().unwrap().contains("merge.wire"),
            "{wire}: {r:?}"
        );

        for p in honest {
            let bytes = encode(p);
            assert_eq!(bytes.len() as u64, wire.encoded_len(n as u64, span));
            let r = upload_raw(&h, p, bytes, &name).await;
            assert!(r.accepted, "{wire}: {r:?}");
        }
        h.step().await;
        h.step().await;
        let by_name: HashMap<&str, &Player> =
            honest.iter().map(|q| (q.name.as_str(), *q)).collect();
        let mut expected = vec![0.0f32; n];
        for p in honest {
            let resp = h.task(p, 0).await;
            let MergeTask::Merge {
                epoch,
                op,
                partitions,
                wire: given,
                params_len,
            } = resp.task
            else {
                panic!("{wire}: {:?}", resp.task);
            };
            assert_eq!((given, params_len), (wire, layout.params_len));
            let format = MergeFormat { wire, params_len };
            for part in &partitions {
                let range = part.start..part.end;
                let br = wire.byte_range(range.clone(), n as u64, span);
                let mut ranges = Vec::new();
                for src in &part.sources {
                    let whole = h.get_blob(&src.blob).await;
                    assert_eq!(whole, encode(by_name[src.hotkey.as_str()]));
                    ranges.push(whole[br.start as usize..br.end as usize].to_vec());
                }
                let sources: Vec<(&str, &[u8])> = part
                    .sources
                    .iter()
                    .zip(&ranges)
                    .map(|(s, r)| (s.hotkey.as_str(), r.as_slice()))
                    .collect();
                let weights: Vec<f32> = part.sources.iter().map(|s| s.weight).collect();
                let out = merge_encoded(
                    part.index,
                    op,
                    format,
                    &sources,
                    &weights,
                    range.clone(),
                    n as u64,
                    &initial,
                )
                .unwrap();
                let part_span = Span::partition(part.start, params_len);
                assert_eq!(
                    out.len() as u64,
                    wire.encoded_len(part.end - part.start, part_span)
                );
                // What the merge must hold: the operator over the decoded uploads, written
                // back in the format from the partition's start.
                let decoded: Vec<Vec<f32>> = part
                    .sources
                    .iter()
                    .map(|s| {
                        let all = wire
                            .decode(&encode(by_name[s.hotkey.as_str()]), n as u64, span, base)
                            .unwrap();
                        all[range.start as usize..range.end as usize].to_vec()
                    })
                    .collect();
                let views: Vec<&[f32]> = decoded.iter().map(Vec::as_slice).collect();
                let w = if weights.iter().all(|w| *w == 0.0) {
                    vec![1.0; weights.len()]
                } else {
                    weights.clone()
                };
                let merged = merge_partition(op, &views, &w).unwrap();
                let part_base = wire
                    .base_of(&initial, part.end - part.start, part_span)
                    .unwrap();
                expected[range.start as usize..range.end as usize]
                    .copy_from_slice(&wire.round_trip(&merged, part_span, part_base).unwrap());
                let (hash, bytes) = (payload_hash(&out), out.len() as u64);
                h.upload(&part.output, out).await;
                let r = h
                    .merge_submit(
                        p,
                        &MergeSubmitRequest::Partition {
                            epoch,
                            index: part.index,
                            hash,
                            bytes,
                        },
                    )
                    .await;
                assert!(r.accepted, "{wire}: {r:?}");
            }
        }
        h.step().await;
        let ms = h.merge_status().await;
        assert_eq!((ms.phase, ms.epoch), (Phase::Training, 1), "{wire}");
        assert!(ms.sections[0].flagged.is_empty(), "{wire}: {ms:?}");
        let (checkpoint, values) = h.adopt(&a, 0).await;
        assert_eq!(
            values, expected,
            "{wire}: the checkpoint is not the decoded merge"
        );
        if let MergeWire::Delta(_) = wire {
            // The delta (the agreed partitions back to back) rebuilds the checkpoint from the
            // state the miners hold, bit for bit, at a fraction of its size.
            let delta = checkpoint
                .delta
                .expect("a dct checkpoint carries its delta");
            assert_eq!((delta.base_epoch, delta.wire), (0, wire));
            let bytes = h.get_blob(&delta.blob).await;
            assert!(
                bytes.len() * 5 < 4 * n,
                "{} bytes for {n} values",
                bytes.len()
            );
            let rebuilt = wire
                .decode_partitions(&bytes, &delta.bounds, layout.params_len, &initial)
                .unwrap();
            assert_eq!(rebuilt, values);
            // The sparse change keeps what matters most: the merged parameters move from the
            // initial state towards the mean of the uploads.
            let p = layout.params_len as usize;
            let mean = direct_mean(&honest, &[1.0; 3]);
            let dot: f32 = (0..p)
                .map(|i| (values[i] - initial[i]) * (mean[i] - initial[i]))
                .sum();
            assert!(dot > 0.0, "{wire}: the merge moved away from the uploads");
            continue;
        }
        assert!(checkpoint.delta.is_none(), "{wire}");
        // Compressed, the merge still lands close to the lossless mean (bf16: 2^-8 relative;
        // int8: a step of the block's scale).
        let lossless = direct_mean(&honest, &[1.0; 3]);
        let weights: Vec<f32> = honest
            .iter()
            .map(|p| h.state.repo.backwards_in_epoch(&p.name, 0).unwrap() as f32)
            .collect();
        let lossless = if weights.iter().all(|w| *w == 0.0) {
            lossless
        } else {
            direct_mean(&honest, &weights)
        };
        let worst = values
            .iter()
            .zip(&lossless)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(worst < 0.01, "{wire}: off by {worst}");
    }
}

/// Stalling the uploads: a live miner that never asks for its upload holds the phase for
/// `merge.ask_s` (5 s) at most, not to the upload deadline (30 s here); one that takes a lease
/// and never delivers is waited for as long again as the others' uploads took (at least
/// `merge.straggler_s`, 2 s), and its lease ends then, so a late upload is refused.
#[tokio::test]
async fn a_miner_that_does_not_upload_stalls_the_phase_a_few_seconds_at_most() {
    let h = merge_harness("");
    let (a, b, c, _) = three_players(&h).await;
    let all = [&a, &b, &c];
    h.train_until_upload(&all).await;
    let began = h.now();
    assert!(h.upload_state(&a, 0, &a.flat, |_| {}).await.accepted);
    assert!(h.upload_state(&b, 0, &b.flat, |_| {}).await.accepted);
    // Charlie is live (he worked a moment ago) and has not asked.
    h.step().await;
    assert_eq!(
        h.merge_status().await.phase,
        Phase::Uploading,
        "asking window"
    );
    h.advance(5_000);
    h.step().await;
    assert_eq!(
        h.merge_status().await.phase,
        Phase::Merging,
        "closed {} ms after the phase began, not at its 30 s deadline",
        h.now() - began
    );

    // A fresh run: Charlie takes a lease and never uploads.
    let h = merge_harness("");
    let (a, b, c, _) = three_players(&h).await;
    let all = [&a, &b, &c];
    h.train_until_upload(&all).await;
    assert!(matches!(h.task(&c, 0).await.task, MergeTask::Upload { .. }));
    h.advance(1_000);
    assert!(h.upload_state(&a, 0, &a.flat, |_| {}).await.accepted);
    assert!(h.upload_state(&b, 0, &b.flat, |_| {}).await.accepted);
    h.step().await;
    assert_eq!(h.merge_status().await.phase, Phase::Uploading);
    h.advance(1_999);
    h.step().await;
    assert_eq!(h.merge_status().await.phase, Phase::Uploading, "waited 2 s");
    h.advance(1);
    h.step().await;
    assert_eq!(h.merge_status().await.phase, Phase::Merging);
    let late = h.task(&c, 0).await.task;
    assert!(
        !matches!(late, MergeTask::Upload { .. }),
        "the lease ended: {late:?}"
    );
    h.step().await;
    let ms = h.merge_status().await;
    assert_eq!((ms.sections[0].uploads, ms.sections[0].partitions), (2, 2));
}

/// Stalling the merge: an uploader that never delivers its partitions holds the merge only
/// until every partition has a copy and it was waited for as long again (at least 2 s), not
/// to the merge deadline; it is flagged missing, and its twins' copies are used.
#[tokio::test]
async fn a_merger_that_never_delivers_stalls_the_merge_a_few_seconds_at_most() {
    let h = merge_harness("");
    let (a, b, c, _) = three_players(&h).await;
    let all = [&a, &b, &c];
    h.upload_all(&all).await;
    let closed = h.now();
    h.advance(1_000);
    assert!(h.merge_work(&a, &all, 0, 1.0).await > 0);
    assert!(h.merge_work(&b, &all, 0, 1.0).await > 0);
    h.step().await;
    let covered = h.now();
    assert_eq!(h.merge_status().await.phase, Phase::Merging);
    // Covering took 1 s from the close: Charlie is waited for max(1 s, 2 s) more.
    h.advance(1_999);
    h.step().await;
    assert_eq!(h.merge_status().await.phase, Phase::Merging);
    h.advance(1);
    h.step().await;
    let ms = h.merge_status().await;
    assert_eq!(
        (ms.phase, ms.epoch),
        (Phase::Training, 1),
        "finalised {} ms after the uploads closed (deadline 30 s)",
        h.now() - closed
    );
    assert!(h.now() - covered <= 2_000);
    assert_eq!(ms.sections[0].fallbacks, 0, "every partition had a copy");
    assert!(
        ms.sections[0]
            .flagged
            .iter()
            .all(|f| f.reason == "missing" && f.hotkey == c.name),
        "{:?}",
        ms.sections[0].flagged
    );
    assert!(!ms.sections[0].flagged.is_empty());
}

/// An excluded miner is not leased an upload (nor merge work): it is told to wait.
#[tokio::test]
async fn an_excluded_miner_gets_no_upload_or_partitions() {
    let h = merge_harness("");
    let (a, b, c, _) = three_players(&h).await;
    let all = [&a, &b, &c];
    h.train_until_upload(&all).await;
    let now = h.now();
    // Two flagged windows (the run's default `exclude_after_flags`) exclude Charlie.
    for epoch in [0, 1] {
        h.state
            .repo
            .flag_window(&c.name, epoch, "test: flagged", 2, 600_000, now)
            .unwrap();
    }
    assert!(h.state.repo.excluded(&c.name, now).unwrap());
    assert!(matches!(h.task(&c, 0).await.task, MergeTask::Wait { .. }));
    assert!(h.upload_state(&a, 0, &a.flat, |_| {}).await.accepted);
    assert!(h.upload_state(&b, 0, &b.flat, |_| {}).await.accepted);
    h.advance(5_000);
    h.step().await;
    h.step().await;
    let ms = h.merge_status().await;
    assert_eq!((ms.sections[0].uploads, ms.sections[0].partitions), (2, 2));
    assert!(matches!(h.task(&c, 0).await.task, MergeTask::Wait { .. }));
}
