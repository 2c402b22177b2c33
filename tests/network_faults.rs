//! Fault tests on the real binary (issue 9), each a small network of `iota orchestrate` and
//! `iota mine` processes on the `tiny` preset with a sample budget:
//!
//! - chaos: the orchestrator is killed (SIGKILL) and restarted mid-training and mid-merge, and
//!   a third of the miners is killed at random in every epoch, most of them restarted;
//! - the S3 server is killed and restarted while activations and merge uploads move through it;
//! - merge poisoning: a miner uploads a state of ±3e38 for every merge and then overwrites its
//!   upload through the URL it still holds.
//!
//! After each the run finishes its budget, the ledger accounts for every sample id (completed,
//! or dropped with a reason; none left under way), every live miner of a section holds the
//! section's last checkpoint (the hash each computes from the state it loaded), and the loss
//! fell from the first epoch to the last.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod common;

use common::net::{completed, http_get, status, wait_for};
use common::procs::{Kids, create_hotkey, spawn_miner, start_orchestrator, write_config_with};

/// The tests of this file run one at a time (each starts up to ten processes).
static SERIAL: Mutex<()> = Mutex::new(());

/// The run config of a fault test: `tiny`, samples of 2 x 32 tokens, epochs of `per_epoch`
/// samples, a budget of `budget`, short deadlines, and `extra` YAML lines.
fn write_run(dir: &Path, run: &str, per_epoch: u64, budget: u64, extra: &str) -> (String, PathBuf) {
    write_config_with(
        dir,
        run,
        &format!(
            "heartbeat_s: 1\nminer_ttl_s: 5\neval_samples: 0\n\
             deadlines: {{ forward_s: 3, backward_s: 5 }}\n\
             batches_before_merging: {per_epoch}\nmax_samples: {budget}\n\
             schedule: {{ peak: 0.003, warmup_steps: 4, total_steps: {budget}, min_ratio: 0.1 }}\n\
             penalties: {{ backoff_s: 1, exclude_after: 5, exclusion_s: 5 }}\n\
             merge: {{ upload_s: 15, lease_grace_s: 2, merge_s: 8 }}\n{extra}"
        ),
    )
}

/// A miner process of a test, by hotkey name; `None` while it is dead.
struct Miner {
    name: String,
    address: String,
    child: Option<Child>,
}

impl Drop for Miner {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Miner {
    fn start(dir: &Path, url: &str, name: &str, extra: &[&str]) -> Self {
        let address = create_hotkey(dir, name);
        Self {
            name: name.into(),
            address,
            child: Some(spawn_miner(dir, url, name, extra)),
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn restart(&mut self, dir: &Path, url: &str) {
        if self.child.is_none() {
            self.child = Some(spawn_miner(dir, url, &self.name, &[]));
        }
    }

    fn alive(&self) -> bool {
        self.child.is_some()
    }
}

fn db(dir: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(dir.join("state/state.sqlite")).unwrap()
}

/// Every training sample id below the run's next one has a ledger row, completed or dropped
/// with a reason, and no sample of any kind is still under way. Returns (completed, dropped).
fn every_sample_accounted_for(dir: &Path) -> (i64, i64) {
    let db = db(dir);
    let next: i64 = db
        .query_row("SELECT next_sample FROM run_state", [], |r| r.get(0))
        .unwrap();
    let q = |sql: &str| -> i64 { db.query_row(sql, [], |r| r.get(0)).unwrap() };
    let rows = q("SELECT COUNT(*) FROM samples WHERE kind = 'train'");
    let (lo, hi) = (
        q("SELECT COALESCE(MIN(id), 0) FROM samples WHERE kind = 'train'"),
        q("SELECT COALESCE(MAX(id), -1) FROM samples WHERE kind = 'train'"),
    );
    assert_eq!((rows, lo, hi), (next, 0, next - 1), "sample ids 0..{next}");
    assert_eq!(
        q("SELECT COUNT(*) FROM samples WHERE outcome = 'active'"),
        0
    );
    assert_eq!(
        q("SELECT COUNT(*) FROM samples WHERE outcome = 'dropped' AND reason IS NULL"),
        0,
        "a sample was dropped without a reason"
    );
    let done = q("SELECT COUNT(*) FROM samples WHERE kind = 'train' AND outcome = 'completed'");
    let dropped = q("SELECT COUNT(*) FROM samples WHERE kind = 'train' AND outcome = 'dropped'");
    assert_eq!(done + dropped, next);
    // The counters the status reads agree with the ledger.
    let s = status(&http_url(dir)).unwrap();
    assert_eq!(
        (
            completed(&s) as i64,
            s["samples"]["dropped"].as_i64().unwrap()
        ),
        (done, dropped)
    );
    (done, dropped)
}

/// The orchestrator URL a test wrote into `dir/run.yaml`.
fn http_url(dir: &Path) -> String {
    let yaml = std::fs::read_to_string(dir.join("run.yaml")).unwrap();
    let listen = yaml
        .lines()
        .find_map(|l| l.strip_prefix("listen: "))
        .unwrap();
    format!("http://{listen}")
}

/// Waits until every miner in `live` holds its section's newest checkpoint: the epoch and the
/// hash it reports (computed from the state it loaded) are the checkpoint's.
fn live_miners_hold_the_last_checkpoint(dir: &Path, live: &[&str]) -> u64 {
    let mut last = 0;
    wait_for(
        "every live miner to hold its section's last checkpoint",
        Duration::from_secs(60),
        || {
            let db = db(dir);
            let latest: BTreeMap<i64, (i64, String)> = db
                .prepare(
                    "SELECT section, epoch, hash FROM checkpoints c WHERE epoch = \
                     (SELECT MAX(epoch) FROM checkpoints d WHERE d.section = c.section)",
                )
                .unwrap()
                .query_map([], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            last = latest.values().map(|v| v.0 as u64).min().unwrap_or(0);
            live.iter().all(|hk| {
                db.query_row(
                    "SELECT section, weights_epoch, weights_hash FROM miners WHERE hotkey = ?1",
                    [hk],
                    |r| {
                        Ok((
                            r.get::<_, i64>(0)?,
                            r.get::<_, i64>(1)?,
                            r.get::<_, Option<String>>(2)?,
                        ))
                    },
                )
                .ok()
                .is_some_and(|(section, epoch, hash)| {
                    latest
                        .get(&section)
                        .is_some_and(|(e, h)| *e == epoch && hash.as_deref() == Some(h))
                })
            })
        },
    );
    last
}

/// The per-epoch training loss summaries of `/api/merge/status`: (epoch, mean loss).
fn epoch_losses(url: &str) -> Vec<(u64, f64)> {
    let text = http_get(&format!("{url}/api/merge/status")).unwrap();
    let ms: serde_json::Value = serde_json::from_str(&text).unwrap();
    ms["epochs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| Some((e["epoch"].as_u64()?, e["mean_loss"].as_f64()?)))
        .collect()
}

/// The loss of the last epoch that trained is below the first's.
fn loss_fell(url: &str) -> Vec<(u64, f64)> {
    let losses = epoch_losses(url);
    assert!(losses.len() >= 2, "{losses:?}");
    let (first, last) = (losses[0].1, losses[losses.len() - 1].1);
    assert!(last < first, "the loss did not fall: {losses:?}");
    losses
}

fn wait_finished(url: &str, timeout: Duration) {
    wait_for("the run to finish its budget", timeout, || {
        status(url).is_some_and(|s| s["finished"] == true)
    });
}

/// A small random source (xorshift), seeded from the clock and printed, so a failing run can
/// be told apart from another.
struct Dice(u64);

impl Dice {
    fn new() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos() as u64
            | 1;
        eprintln!("chaos seed {seed}");
        Self(seed)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Chaos: 9 miners (3 per section), epochs of 8 samples, a budget of 56 sample ids (samples
/// cut off at the end of an epoch use ids too: four to six merges; an epoch's training can pass
/// while this loop restarts processes, so the kills need several epochs to land in three). In
/// every epoch 3 miners (a third) are killed at random once a few samples completed, leaving
/// each section at least one; two of them come back at once with the same hotkey, the third at the next epoch. The
/// orchestrator is killed and restarted in epoch 1 mid-training, and in the merges of epochs 2
/// (uploading) and 3 (merging).
#[test]
fn chaos_kills_and_restarts_leave_a_consistent_run() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let (per_epoch, budget) = (8, 56);
    let (url, config) = write_run(dir, "chaos", per_epoch, budget, "");
    let mut orchestrator = Kids(vec![start_orchestrator(dir, &config, &url)]);
    let mut miners: Vec<Miner> = (0..9)
        .map(|i| Miner::start(dir, &url, &format!("m{i}"), &[]))
        .collect();
    let mut dice = Dice::new();
    let section_of = |address: &str| -> Option<i64> {
        db(dir)
            .query_row(
                "SELECT section FROM miners WHERE hotkey = ?1",
                [address],
                |r| r.get(0),
            )
            .ok()
    };
    // Sections as miners register: the first ones train while the others still start, so
    // the chaos begins at once instead of after every registration (by then a fast network
    // is epochs ahead).
    let mut sections: Vec<Option<i64>> = vec![None; miners.len()];

    let restart_orchestrator = |orchestrator: &mut Kids, why: &str| {
        eprintln!("killing the orchestrator ({why})");
        drop(std::mem::replace(orchestrator, Kids(Vec::new())));
        std::thread::sleep(Duration::from_millis(800));
        *orchestrator = Kids(vec![start_orchestrator(dir, &config, &url)]);
    };
    let mut killed_in = BTreeMap::new();
    let mut epoch_base = BTreeMap::new();
    let mut orchestrator_kills = Vec::new();
    let mut waiting: Option<usize> = None;
    let deadline = Instant::now() + Duration::from_secs(420);
    loop {
        assert!(
            Instant::now() < deadline,
            "the chaos run did not finish in time"
        );
        std::thread::sleep(Duration::from_millis(100));
        let Some(s) = status(&url) else { continue };
        if s["finished"] == true {
            break;
        }
        for (section, m) in sections.iter_mut().zip(&miners) {
            if section.is_none() {
                *section = section_of(&m.address);
            }
        }
        let epoch = s["epoch"].as_u64().unwrap_or(0);
        let phase = s["phase"].as_str().unwrap_or("").to_string();
        // Samples completed in this epoch, counted from the lower of where the epoch should
        // start and where this loop first saw it (drops and cut-off samples can leave the
        // run's count behind `epoch * per_epoch`, and then no epoch after would qualify).
        let base = *epoch_base
            .entry(epoch)
            .or_insert_with(|| completed(&s).min(epoch * per_epoch));
        let done_in_epoch = completed(&s).saturating_sub(base);
        // A third of the miners, once per epoch, a few samples into its training, or in
        // whatever phase this loop first sees the epoch in: on a fast machine an epoch's 8
        // samples can train between two polls (a run with kills in epoch 1 only failed so).
        let kill_now = phase != "training" || done_in_epoch >= 2;
        if kill_now && !killed_in.contains_key(&epoch) {
            if let Some(i) = waiting.take() {
                miners[i].restart(dir, &url);
            }
            let mut victims = Vec::new();
            // Until enough miners have registered there may be no three to kill: try later.
            for _ in 0..1000 {
                if victims.len() == 3 {
                    break;
                }
                let i = dice.below(miners.len());
                let left_in_section = (0..miners.len())
                    .filter(|&j| {
                        sections[j].is_some()
                            && sections[j] == sections[i]
                            && miners[j].alive()
                            && !victims.contains(&j)
                    })
                    .count();
                if !victims.contains(&i) && miners[i].alive() && left_in_section > 1 {
                    victims.push(i);
                }
            }
            if victims.len() == 3 {
                for &i in &victims {
                    miners[i].kill();
                }
                eprintln!("epoch {epoch}: killed miners {victims:?}");
                std::thread::sleep(Duration::from_millis(500));
                for &i in &victims[..2] {
                    miners[i].restart(dir, &url);
                }
                waiting = Some(victims[2]);
                killed_in.insert(epoch, victims);
            }
        }
        let due = match (epoch, phase.as_str()) {
            (1, "training") if done_in_epoch >= 4 => Some("epoch 1, training"),
            (2, "uploading") => Some("epoch 2, uploading"),
            (3, "merging") => Some("epoch 3, merging"),
            _ => None,
        };
        if let Some(why) = due
            && !orchestrator_kills.contains(&epoch)
        {
            orchestrator_kills.push(epoch);
            restart_orchestrator(&mut orchestrator, why);
        }
    }
    if let Some(i) = waiting.take() {
        miners[i].restart(dir, &url);
    }
    eprintln!(
        "chaos: miners killed per epoch {killed_in:?}, orchestrator killed in epochs \
         {orchestrator_kills:?}"
    );
    assert!(killed_in.len() >= 3, "miners were killed in too few epochs");
    assert!(orchestrator_kills.len() >= 2, "{orchestrator_kills:?}");

    let (done, dropped) = every_sample_accounted_for(dir);
    let live: Vec<&str> = miners.iter().map(|m| m.address.as_str()).collect();
    let last = live_miners_hold_the_last_checkpoint(dir, &live);
    let losses = loss_fell(&url);
    eprintln!(
        "chaos: {done} completed, {dropped} dropped, every miner on checkpoint {last}, \
         epoch losses {losses:?}, {:.0} s",
        started.elapsed().as_secs_f64()
    );
    assert!(last >= 3, "three merges or more: {last}");
    drop(orchestrator);
}

/// The S3 server restarted mid-upload: three miners (one per section) train through an
/// s3s-fs bucket, every tensor through presigned URLs. The server is killed (SIGKILL) and
/// started again on the same port twice: while activations and gradients move (training),
/// and the moment the first merge's upload phase is seen (the miners are putting their
/// states). Work whose transfer failed is retried, re-offered or dropped with a reason, and
/// the run finishes.
#[test]
fn an_s3_server_restarted_mid_upload_leaves_a_consistent_run() {
    use common::{ACCESS_KEY, BUCKET, S3Server, SECRET_KEY};
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let mut s3 = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let storage = format!(
        "storage: {{url: \"s3://{BUCKET}/runs\", endpoint: \"{}\", region: us-east-1, \
         access_key_id: {ACCESS_KEY}, secret_access_key: {SECRET_KEY}}}\n",
        s3.endpoint
    );
    let (url, config) = write_run(dir, "s3-restart", 6, 18, &storage);
    let _orchestrator = Kids(vec![start_orchestrator(dir, &config, &url)]);
    let miners: Vec<Miner> = (0..3)
        .map(|i| Miner::start(dir, &url, &format!("m{i}"), &[]))
        .collect();
    wait_for(
        "training through the bucket",
        Duration::from_secs(90),
        || status(&url).is_some_and(|s| completed(&s) >= 2),
    );
    eprintln!("restarting the S3 server during training");
    s3.restart(Duration::from_secs(2));
    let mut phase = String::new();
    wait_for("the first merge", Duration::from_secs(120), || {
        phase = status(&url)
            .and_then(|s| s["phase"].as_str().map(str::to_string))
            .unwrap_or_default();
        phase != "training"
    });
    eprintln!("restarting the S3 server during the merge ({phase})");
    s3.restart(Duration::from_secs(2));
    wait_finished(&url, Duration::from_secs(240));

    let (done, dropped) = every_sample_accounted_for(dir);
    let live: Vec<&str> = miners.iter().map(|m| m.address.as_str()).collect();
    let last = live_miners_hold_the_last_checkpoint(dir, &live);
    let losses = loss_fell(&url);
    eprintln!(
        "s3 restart: {done} completed, {dropped} dropped, every miner on checkpoint {last}, \
         epoch losses {losses:?}, {:.0} s",
        started.elapsed().as_secs_f64()
    );
    assert!(last >= 2);
}

/// The f32 values of every checkpoint object of the run under `objects` (read by the
/// poisoning test, which needs the `adversary` feature).
#[cfg(feature = "adversary")]
fn checkpoint_values(objects: &Path) -> Vec<(PathBuf, Vec<f32>)> {
    let mut out = Vec::new();
    let mut stack = vec![objects.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.to_string_lossy().contains("/checkpoints/")
                && path.file_name().is_some_and(|n| n == "flat")
            {
                let bytes = std::fs::read(&path).unwrap();
                let values = bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                out.push((path, values));
            }
        }
    }
    out
}

/// Merge poisoning through the real binary (with the `adversary` feature, as scripts/test.sh
/// builds): a miner (`iota mine --adversary poisoner`) among
/// five honest ones uploads, for the merges of even epochs, a state of ±3e38 (finite: it passes
/// the decoder, and under `mean` one such upload would swamp the checkpoint), for odd epochs
/// its honest state; after every upload it overwrites it with 16 bytes through the URL it
/// still holds. The huge uploads are left out of the merge (and penalised), the accepted honest
/// ones are merged from the orchestrator's own copy, so no swap reaches a checkpoint or stalls
/// a merge: every checkpoint is finite and small, no partition falls back, and the run learns.
#[test]
#[cfg(feature = "adversary")]
fn merge_poisoning_by_a_real_miner_is_left_out() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let (url, config) = write_run(dir, "poison", 8, 26, "");
    let _orchestrator = Kids(vec![start_orchestrator(dir, &config, &url)]);
    let mut miners: Vec<Miner> = (0..5)
        .map(|i| Miner::start(dir, &url, &format!("m{i}"), &[]))
        .collect();
    miners.push(Miner::start(
        dir,
        &url,
        "poisoner",
        &["--adversary", "poisoner"],
    ));
    let poisoner = miners[5].address.clone();
    wait_finished(&url, Duration::from_secs(300));

    let (done, dropped) = every_sample_accounted_for(dir);
    let live: Vec<&str> = miners.iter().map(|m| m.address.as_str()).collect();
    let last = live_miners_hold_the_last_checkpoint(dir, &live);
    assert!(last >= 2, "at least two merges");
    let db = db(dir);
    let uploads: Vec<(i64, String, Option<String>)> = db
        .prepare("SELECT epoch, state, reason FROM uploads WHERE miner = ?1 ORDER BY epoch")
        .unwrap()
        .query_map([&poisoner], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    eprintln!("poisoner's uploads: {uploads:?}");
    for (epoch, state, reason) in &uploads {
        if epoch % 2 == 0 {
            assert_eq!(state, "refused", "epoch {epoch}: {reason:?}");
        } else {
            assert_eq!(
                state, "accepted",
                "epoch {epoch}: the honest upload {reason:?}"
            );
        }
    }
    assert!(uploads.iter().any(|u| u.0 == 0), "{uploads:?}");
    let in_plans: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM merge_plans WHERE epoch % 2 = 0 AND instr(uploaders, ?1) > 0",
            [&poisoner],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(in_plans, 0, "a huge upload reached a merge plan");
    let fallbacks: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM partition_outcomes WHERE verdict LIKE '%fallback%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(fallbacks, 0, "a merge fell back");
    let penalties: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM penalties WHERE miner = ?1 AND reason LIKE 'upload refused%'",
            [&poisoner],
            |r| r.get(0),
        )
        .unwrap();
    assert!(penalties >= 1, "the poisoner was not penalised");
    let checkpoints = checkpoint_values(&dir.join("state/objects"));
    assert!(!checkpoints.is_empty());
    for (path, values) in &checkpoints {
        let worst = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(
            values.iter().all(|v| v.is_finite()) && worst < 1e3,
            "{}: largest magnitude {worst}",
            path.display()
        );
    }
    let losses = loss_fell(&url);
    eprintln!(
        "poisoning: {done} completed, {dropped} dropped, every miner on checkpoint {last}, \
         {} checkpoints finite, epoch losses {losses:?}, {:.0} s",
        checkpoints.len(),
        started.elapsed().as_secs_f64()
    );
}
