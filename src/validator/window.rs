//! One window of validation: everything a validator checks about one finished epoch, and the
//! scores and weight vector that come out of it.
//!
//! | check | source | effect |
//! |---|---|---|
//! | missed deadlines, refused results and uploads | ledger | penalties |
//! | free-riding (missed deadlines over `free_rider`) | ledger | flag |
//! | merge verification flagged a copy `disagreed` / `invalid` | ledger | flag |
//! | CLASP outlier ([`super::clasp`]) | ledger pathways, tail losses the replays recomputed | flag; CLASP factor |
//! | replay of every miner: a prefix holding `spot` items ([`super::spot`]), the whole epoch and upload for `miners_per_epoch` secret ones ([`super::replay`]) | objects | flag; the tail's recomputed losses |
//! | work without an accepted merge upload | ledger | training credit forfeit, penalty |
//! | a flag in one of the last `probation_windows` windows | this validator's history | score 0 |
//! | upload identical to the epoch's start (did not train) | uploads | flag |
//! | copy of another uploader's state ([`super::uploads`]) | uploads | flag (the later one) |
//! | merged partitions recomputed ([`super::merge_check`]) | uploads, copies | flag; missing ones a penalty |
//! | upload quality ([`super::quality`]) | whole model | upload factor |

use std::collections::BTreeMap;

use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use super::clasp::{LedgerEntry, estimate};
use super::compare::Similarity;
use super::compare::failure;
use super::fetch::{FetchError, fetch_flat, fetch_merge_object, load_item};
use super::merge_check::check_merge;
use super::quality;
use super::replay::{ReplayStats, Replayer, compare_progress, replay_count};
use super::score::{PenaltyKind, ScoreInput, score};
use super::spot::prefix_len;
use super::tracking::Chooser;
use super::uploads::{find_copies, start_state, state_hash};
use super::weights::normalize;
use crate::api::client::{ApiClient, ClientError};
use crate::api::{
    EpochLedger, MergeRecord, MinerSettings, MinerWeight, MinerWork, ValidationSettings,
    WeightSubmission, WorkKind,
};
use crate::codec::Span;
use crate::compute::engine::{Engine, EngineError};
use crate::model::layout::section_layout;
use crate::model::{ModelConfig, Section};

/// What a validator knows about the run it validates.
#[derive(Clone)]
pub struct Context<B: AutodiffBackend> {
    /// The signed client.
    pub client: ApiClient,
    /// Run name (the merge plan is seeded with it).
    pub run: String,
    /// Model of the run.
    pub model: ModelConfig,
    /// What miners follow.
    pub settings: MinerSettings,
    /// How to validate.
    pub validation: ValidationSettings,
    /// Secret choices.
    pub chooser: Chooser,
    /// Compute device.
    pub device: B::Device,
    /// Keep replayed forwards' graphs for their backwards
    /// ([`crate::compute::engine::EngineSettings::retain_graphs`]).
    pub retain_graphs: bool,
}

/// One miner's outcome in a window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MinerOutcome {
    /// Hotkey.
    pub hotkey: String,
    /// Section.
    pub section: usize,
    /// Weight and score parts.
    pub weight: MinerWeight,
}

/// Everything one window produced; persisted, so a restarted validator publishes the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowResult {
    /// The epoch.
    pub epoch: u64,
    /// Miners replayed.
    pub tracked: Vec<String>,
    /// Per miner, by hotkey.
    pub miners: Vec<MinerOutcome>,
    /// Burned share.
    pub burn: f64,
    /// Checks that could not be done, and why.
    pub notes: Vec<String>,
    /// What each replay measured, whole or a prefix (older windows: the tracked miners').
    #[serde(default)]
    pub replays: Vec<ReplayRecord>,
}

/// What the replay of one miner (whole, or a prefix) measured in a window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayRecord {
    /// The miner.
    pub miner: String,
    /// Its section.
    pub section: usize,
    /// Its accepted work items in the epoch.
    pub items: u64,
    /// The figures of the items replayed.
    pub stats: ReplayStats,
    /// The uploaded state's change against the replay's (whole replays with an upload).
    pub state: Option<Similarity>,
}

impl WindowResult {
    /// The vector to publish.
    pub fn submission(&self) -> WeightSubmission {
        WeightSubmission {
            epoch: self.epoch,
            burn: self.burn,
            weights: self.miners.iter().map(|m| m.weight.clone()).collect(),
        }
    }

    /// Hotkeys flagged in this window.
    pub fn flagged(&self) -> Vec<&str> {
        self.miners
            .iter()
            .filter(|m| !m.weight.parts.flags.is_empty())
            .map(|m| m.hotkey.as_str())
            .collect()
    }
}

/// A miner's evidence being gathered.
#[derive(Debug, Default)]
struct Evidence {
    section: usize,
    input: ScoreInput,
}

impl Evidence {
    fn flag(&mut self, reason: String) {
        self.input.flags.push(reason);
    }
    fn note(&mut self, note: String) {
        self.input.notes.push(note);
    }
    fn penalise(&mut self, kind: PenaltyKind, n: u64) {
        if n > 0 {
            self.input.penalties.push((kind, n));
        }
    }
}

/// The median control improvement of each section's uploaders that no check has flagged so
/// far in this window (all of them when every one is flagged).
fn section_peers(
    found: &BTreeMap<String, quality::Quality>,
    ev: &BTreeMap<String, Evidence>,
) -> BTreeMap<usize, f64> {
    let mut by_section: BTreeMap<usize, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for (hotkey, q) in found {
        let Some(e) = ev.get(hotkey) else { continue };
        let (clean, all) = by_section.entry(e.section).or_default();
        all.push(q.control);
        if e.input.flags.is_empty() && q.control_n > 0 {
            clean.push(q.control);
        }
    }
    by_section
        .into_iter()
        .map(|(section, (mut clean, mut all))| {
            let peer = if clean.is_empty() {
                quality::median(&mut all)
            } else {
                quality::median(&mut clean)
            };
            (section, peer)
        })
        .collect()
}

/// Validates the finished epoch `epoch`. `probation` maps the miners this validator flagged
/// in recent windows to the epoch of their latest flag: they score 0 in this window too.
///
/// # Errors
/// The orchestrator refused or could not be reached for the ledger; every other failure is a
/// note in the result (its check is skipped).
pub async fn validate_epoch<B: AutodiffBackend>(
    ctx: &Context<B>,
    epoch: u64,
    probation: &BTreeMap<String, u64>,
) -> Result<WindowResult, ClientError> {
    let v = &ctx.validation;
    let ledger = ctx.client.ledger(epoch).await?;
    let mut notes = Vec::new();
    let mut ev: BTreeMap<String, Evidence> = BTreeMap::new();
    for m in &ledger.miners {
        let e = ev.entry(m.hotkey.clone()).or_default();
        e.section = m.section;
        e.input.throughput = compute_units(&ctx.model, ctx.settings.seq_len, m);
        e.penalise(PenaltyKind::MissedDeadline, m.missed_deadlines);
        e.penalise(PenaltyKind::RefusedResult, m.refused_results);
        if let Some(u) = &m.upload
            && u.state == "refused"
        {
            e.penalise(PenaltyKind::RefusedUpload, 1);
            e.note(format!(
                "upload refused: {}",
                u.reason.clone().unwrap_or_default()
            ));
        }
        let taken = m.missed_deadlines + m.accepted;
        if m.missed_deadlines >= v.free_rider.min_missed
            && taken > 0
            && m.missed_deadlines as f64 / taken as f64 >= v.free_rider.missed_ratio
        {
            e.flag(format!(
                "free-rider: missed {} of {} deadlines",
                m.missed_deadlines, taken
            ));
        }
        for f in &m.merge_flags {
            if f.reason == "disagreed" || f.reason == "invalid" {
                e.flag(format!(
                    "merge verification: partition {} {}",
                    f.partition, f.reason
                ));
            }
        }
        let uploaded = m.upload.as_ref().is_some_and(|u| u.state == "accepted");
        if ledger.merged && m.completed_work > 0 && !uploaded {
            // Work that never reached the merge trained nothing the network keeps.
            e.input.throughput = 0.0;
            e.penalise(PenaltyKind::MissedUpload, 1);
            // Not a flag: an honest miner slowed down under load can miss one merge (on the
            // CI machine one did), and the forfeit alone makes skipping merges unpaid.
            e.note(format!(
                "no accepted merge upload after {} items of work: the epoch's training credit \
                 is forfeit",
                m.accepted
            ));
        }
        if let Some(flagged) = probation.get(&m.hotkey) {
            e.input.probation = Some(*flagged);
        }
    }
    let mut replays = Vec::new();
    let mut losses = BTreeMap::new();
    let tracked = replay_all(ctx, &ledger, &mut ev, &mut notes, &mut replays, &mut losses).await;
    clasp(ctx, &ledger, &losses, &mut ev);
    let mut records = Vec::new();
    let mut starts = Vec::new();
    let mut context = Vec::new();
    for section in 0..ctx.model.n_sections() {
        match check_section(ctx, epoch, section, &ledger, &mut ev).await {
            Ok((record, start)) => {
                context.push(merged_or_start(ctx, &record, &start, &mut notes).await);
                records.push(record);
                starts.push(start);
            }
            Err(e) => notes.push(format!("section {section}: merge checks skipped: {e}")),
        }
    }
    if v.upload_samples > 0 && records.len() == ctx.model.n_sections() {
        match quality::measure::<B>(
            &ctx.client,
            &ledger,
            &records,
            &starts,
            &context,
            &ctx.model,
            &ctx.settings,
            &ctx.chooser,
            v.upload_samples,
            &ctx.device,
        )
        .await
        {
            Ok(found) => {
                let peers = section_peers(&found, &ev);
                for (hotkey, q) in found {
                    if let Some(e) = ev.get_mut(&hotkey) {
                        let peer = peers.get(&e.section).copied().unwrap_or(0.0);
                        let factor = q.factor(peer);
                        e.input.upload = Some(factor);
                        e.note(format!(
                            "upload: {:+.4} nats on its own {} samples, {:+.4} on {} others \
                             (section peers' median {:+.4}; baseline {:.4}; factor {:.3})",
                            q.own, q.own_n, q.control, q.control_n, peer, q.base_control, factor
                        ));
                    }
                }
            }
            Err(e) => notes.push(format!("upload quality skipped: {e}")),
        }
    }
    let parts: Vec<(String, usize, crate::api::ScoreParts)> = ev
        .into_iter()
        .map(|(h, e)| {
            let parts = score(&e.input, &v.penalties);
            (h, e.section, parts)
        })
        .collect();
    let scores: Vec<(String, f64)> = parts.iter().map(|(h, _, p)| (h.clone(), p.score)).collect();
    let vector = normalize(&scores, v.burn);
    let miners = parts
        .into_iter()
        .map(|(hotkey, section, parts)| MinerOutcome {
            weight: MinerWeight {
                hotkey: hotkey.clone(),
                weight: vector.of(&hotkey),
                parts,
            },
            hotkey,
            section,
        })
        .collect();
    Ok(WindowResult {
        epoch,
        tracked,
        miners,
        burn: vector.burn,
        notes,
        replays,
    })
}

/// A miner's accepted work on completed samples in compute units: its FLOPs
/// ([`ModelConfig::section_train_flops_per_token`]; a forward a third of a section's training
/// FLOPs, a backward two thirds, the tail's forward with its backward all of it) over one
/// sample's training FLOPs through the average section. So a sample through one section pays
/// 1 wherever the section is, and every section pays the same for the same compute, however
/// its work is cut into items (the tail's forward and backward are one item; a head or body
/// miner's are two).
pub fn compute_units(model: &ModelConfig, seq: usize, m: &crate::api::MinerRecord) -> f64 {
    let n = model.n_sections().max(1);
    let flops = |i: usize| model.section_train_flops_per_token(i, seq).unwrap_or(0.0);
    let mean = (0..n).map(flops).sum::<f64>() / n as f64;
    if mean <= 0.0 {
        return m.completed_work as f64;
    }
    let own = flops(m.section);
    let forwards = m.completed_forwards.min(m.completed_work) as f64;
    let backwards = m.completed_work.saturating_sub(m.completed_forwards) as f64;
    let tail = m.section + 1 == n;
    let work = if tail {
        forwards * own
    } else {
        forwards * own / 3.0 + backwards * own * 2.0 / 3.0
    };
    work / mean
}

/// CLASP over the epoch's completed samples whose loss a replay recomputed (`losses`), leaving
/// out those whose pathway holds a miner already flagged: the loss a tail miner reports is
/// never used for credit.
fn clasp<B: AutodiffBackend>(
    ctx: &Context<B>,
    ledger: &EpochLedger,
    losses: &BTreeMap<u64, f32>,
    ev: &mut BTreeMap<String, Evidence>,
) {
    // A sample that passed through a miner this window has already flagged (a failed replay,
    // a skipped upload) says nothing about the others on its pathway: its loss is the
    // cheater's doing. Measured: with them kept, an honest tail miner whose 12 recomputed
    // samples had crossed a noise cheater more often than its peer's was flagged (+0.517
    // nats, z 8.5; `network_hostile`, 2026-11-28).
    let flagged = |h: &String| ev.get(h).is_some_and(|e| !e.input.flags.is_empty());
    let entries: Vec<LedgerEntry> = ledger
        .samples
        .iter()
        .filter(|s| !s.pathway.iter().any(flagged))
        .filter_map(|s| {
            Some(LedgerEntry {
                sample: s.sample,
                time: s.loss_unix_ms,
                loss: f64::from(*losses.get(&s.sample)?),
                pathway: s.pathway.clone(),
            })
        })
        .collect();
    let report = estimate(&entries, &ctx.validation.clasp);
    for e in &report.effects {
        let Some(miner) = ev.get_mut(&e.miner) else {
            continue;
        };
        miner.input.clasp = Some(e.quality);
        miner.note(format!(
            "clasp: effect {:+.4} nats (se {:.4}, z {:.1}, {} samples)",
            e.effect, e.std_error, e.z, e.samples
        ));
        if e.flagged {
            miner.flag(format!(
                "CLASP outlier: its samples' loss is {:+.3} nats above its section's (z {:.1}, {} samples)",
                e.effect, e.z, e.samples
            ));
        }
    }
}

/// Replays every miner with accepted work: `miners_per_epoch` secret ones whole, the others
/// over the prefix that holds the window's spot items ([`super::spot`]). Adds the tail losses
/// the replays recomputed to `losses`; returns the miners replayed whole.
async fn replay_all<B: AutodiffBackend>(
    ctx: &Context<B>,
    ledger: &EpochLedger,
    ev: &mut BTreeMap<String, Evidence>,
    notes: &mut Vec<String>,
    records: &mut Vec<ReplayRecord>,
    losses: &mut BTreeMap<u64, f32>,
) -> Vec<String> {
    let k = ctx.validation.replay.miners_per_epoch;
    let candidates: Vec<String> = ledger
        .miners
        .iter()
        .filter(|m| m.accepted > 0)
        .map(|m| m.hotkey.clone())
        .collect();
    let tracked: Vec<String> = ctx
        .chooser
        .pick("replay", ledger.epoch, &candidates, k)
        .into_iter()
        .cloned()
        .collect();
    for miner in &candidates {
        let whole = tracked.contains(miner);
        if !whole && ctx.validation.spot.min_items == 0 {
            continue;
        }
        let work = match ctx.client.miner_work(ledger.epoch, miner).await {
            Ok(work) => work,
            Err(e) => {
                notes.push(format!("replay of {miner} skipped: {e}"));
                continue;
            }
        };
        let n = if whole {
            replay_count(work.items.len(), ctx.validation.replay.fraction)
        } else {
            let head = ctx
                .model
                .section(work.section)
                .map(|s| s.is_head)
                .unwrap_or(false);
            let kinds: Vec<WorkKind> = work.items.iter().map(|i| i.kind).collect();
            prefix_len(&kinds, head, &ctx.validation.spot)
        };
        match replay_miner(ctx, &work, n).await {
            Ok(Replayed {
                flags,
                note,
                record,
                losses: replayed,
            }) => {
                records.push(record);
                if flags.is_empty() {
                    losses.extend(replayed);
                }
                if let Some(e) = ev.get_mut(miner) {
                    if whole {
                        e.input.replay = Some(if flags.is_empty() { 1.0 } else { 0.0 });
                    }
                    e.note(note);
                    for f in flags {
                        e.flag(f);
                    }
                }
            }
            Err(e) => notes.push(format!("replay of {miner} skipped: {e}")),
        }
    }
    tracked
}

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// An object could not be read.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// The start state could not be had.
    #[error(transparent)]
    Start(#[from] super::uploads::StartError),
    /// The model rejected a record.
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
}

/// What replaying one miner found.
#[derive(Debug, Clone, PartialEq)]
pub struct Replayed {
    /// Why it is flagged (empty: the replay matched).
    pub flags: Vec<String>,
    /// The figures, in words, for the miner's score notes.
    pub note: String,
    /// The figures, for the window's record.
    pub record: ReplayRecord,
    /// The tail losses the replay computed, by sample.
    pub losses: Vec<(u64, f32)>,
}

/// Replays the first `n` of one miner's items (all of them: its upload is compared too).
///
/// # Errors
/// [`ReplayError`] when the record cannot be replayed at all.
pub async fn replay_miner<B: AutodiffBackend>(
    ctx: &Context<B>,
    work: &MinerWork,
    n: usize,
) -> Result<Replayed, ReplayError> {
    let r = &ctx.validation.replay;
    let layout = section_layout(&ctx.model, work.section)?;
    let start = start_state::<B>(
        work.start.as_ref(),
        &ctx.model,
        work.section,
        &ctx.settings,
        &ctx.device,
    )
    .await?;
    let section = Section::<B>::new(
        &ctx.model,
        work.section,
        ctx.settings.seed,
        ctx.settings.optimizer,
        &ctx.device,
    )?;
    let spec = section.spec().clone();
    let mut settings = Replayer::<B>::engine_settings(&ctx.settings);
    settings.retain_graphs = ctx.retain_graphs;
    let mut engine = Engine::new(section, settings);
    engine
        .adopt_flat(
            &layout,
            &start,
            work.start.as_ref().map(|c| c.optimizer_step),
        )
        .map_err(|e| match e {
            EngineError::Model(m) => ReplayError::Model(m),
            other => ReplayError::Model(crate::model::ModelError::Params(other.to_string())),
        })?;
    let mut replayer = Replayer::new(engine, *r);
    let n = n.min(work.items.len());
    let mut losses = Vec::new();
    // After a merge the checkpoint carries AdamW's step count (`optimizer_step`), which every
    // miner of the section adopts with the weights, so later epochs replay in full too.
    for item in work.items.iter().take(n) {
        let item = load_item(item, spec.is_head, spec.is_tail).await?;
        let sample = item.sample;
        if let Some(loss) = replayer.apply(item)?.loss {
            losses.push((sample, loss));
        }
    }
    let stats = replayer.stats().clone();
    let mut flags = Vec::new();
    if let Some(why) = stats.verdict(r.marginal_share) {
        flags.push(why);
    }
    let mut note = format!(
        "replay: {} of {} items ({} skipped, {} short of the strict thresholds), {} steps, \
         min cosine {}, min magnitude ratio {}",
        stats.replayed,
        work.items.len(),
        stats.skipped,
        stats.marginal,
        stats.steps,
        stats.min_cosine.map_or("-".into(), |c| format!("{c:.6}")),
        stats
            .min_magnitude_ratio
            .map_or("-".into(), |c| format!("{c:.6}")),
    );
    let mut state = None;
    if n == work.items.len()
        && let Some(upload) = &work.upload
    {
        let n = layout.total_len() as u64;
        let span = Span::whole(layout.params_len);
        let uploaded = fetch_merge_object(upload, work.wire, n, span, &start).await?;
        let replayed = replayer.export_flat(&layout)?;
        let params = usize::try_from(layout.params_len).unwrap_or(usize::MAX);
        let s = compare_progress(&start, &replayed, &uploaded, params);
        note.push_str(&format!(
            "; upload vs replay: change cosine {:.6}, ratio {:.6}",
            s.cosine, s.magnitude_ratio
        ));
        if let Some(why) = failure(&r.state, &s) {
            flags.push(format!(
                "replay: the uploaded state is not what its work produces ({why})"
            ));
        }
        state = Some(s);
    }
    Ok(Replayed {
        flags,
        note,
        record: ReplayRecord {
            miner: work.miner.clone(),
            section: work.section,
            items: work.items.len() as u64,
            stats,
            state,
        },
        losses,
    })
}

/// The state section `record.section` ended the epoch with: the merged checkpoint, or `start`
/// (with a note) where the merge did not finish or its object cannot be read.
async fn merged_or_start<B: AutodiffBackend>(
    ctx: &Context<B>,
    record: &MergeRecord,
    start: &[f32],
    notes: &mut Vec<String>,
) -> Vec<f32> {
    let why = match &record.merged {
        None => "merge not finalised".to_string(),
        Some(merged) => {
            let want = section_layout(&ctx.model, record.section).map(|l| l.total_len());
            match fetch_flat(&merged.blob).await {
                Ok(flat) if want.as_ref().is_ok_and(|&n| n == flat.len()) => return flat,
                Ok(flat) => format!("merged state has {} values, not the layout's", flat.len()),
                Err(e) => format!("merged state unreadable ({e})"),
            }
        }
    };
    notes.push(format!(
        "section {}: {why}; its start stands in for it in upload quality",
        record.section
    ));
    start.to_vec()
}

/// The merge-level checks of one section; returns its record and start state for the
/// upload-quality check.
async fn check_section<B: AutodiffBackend>(
    ctx: &Context<B>,
    epoch: u64,
    section: usize,
    ledger: &EpochLedger,
    ev: &mut BTreeMap<String, Evidence>,
) -> Result<(MergeRecord, Vec<f32>), Box<dyn std::error::Error + Send + Sync>> {
    let record = ctx.client.merge_record(epoch, section).await?;
    let start = start_state::<B>(
        record.start.as_ref(),
        &ctx.model,
        section,
        &ctx.settings,
        &ctx.device,
    )
    .await?;
    let unchanged = state_hash(&start, record.wire);
    for u in &record.uploads {
        let worked = ledger
            .miners
            .iter()
            .any(|m| m.hotkey == u.hotkey && m.completed_work > 0);
        if worked
            && unchanged.is_some()
            && u.blob.hash == unchanged
            && let Some(e) = ev.get_mut(&u.hotkey)
        {
            e.flag(
                "upload is exactly the state it started the epoch from: it did not train".into(),
            );
        }
    }
    let layout = section_layout(&ctx.model, section)?;
    for (copier, original, cosine) in find_copies::<B>(
        &start,
        &layout,
        &ctx.settings.optimizer,
        &record.uploads,
        ctx.validation.copy_cosine,
        record.wire,
        &ctx.device,
    )
    .await?
    {
        if let Some(e) = ev.get_mut(&copier) {
            e.flag(format!(
                "upload copies {original}'s (pseudo-gradient cosine {cosine:.6}, uploaded later)"
            ));
        }
    }
    let findings = check_merge(
        &record,
        &ctx.run,
        &ctx.chooser,
        ctx.validation.merge_checks,
        &start,
    )
    .await?;
    for (merger, reason) in findings.wrong {
        if let Some(e) = ev.get_mut(&merger) {
            e.flag(format!("lying merger: {reason}"));
        }
    }
    for (merger, n) in findings.missing {
        if let Some(e) = ev.get_mut(&merger) {
            e.penalise(PenaltyKind::MissingMerge, n);
        }
    }
    Ok((record, start))
}
