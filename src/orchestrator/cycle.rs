//! The phase machine: training -> uploading -> merging -> training, one step per call of
//! [`advance`] (on every tick of the deadline task, and after each merge submission).
//!
//! - **training -> uploading** once `batches_before_merging` samples of the epoch completed,
//!   or, in a run with a sample budget, once the budget is spent and its last samples ended
//!   (so the run ends with a merged, evaluated model). Samples still under way are dropped
//!   with a recorded reason (never lost silently).
//! - **uploading -> merging** when every awaited miner's upload is in (accepted or refused), or
//!   at the upload deadline. A live miner is awaited while it holds an open lease, and, for
//!   `merge.ask_s` after the phase began, while it has not asked for one: a miner that stays
//!   silent or never asks does not hold the phase up. Uploads started under a lease may still
//!   finish until the lease ends; a section's plan is built once its leases are resolved.
//! - **merging -> training** when every section's merge is finalised: all partitions have
//!   their `r` results; or every partition has a copy and the missing mergers were waited for
//!   as long again as covering them took (at least `merge.straggler_s`); or the merge
//!   deadline passed ([`super::finalize`]).

pub use super::cycle_error::CycleError;
use super::finalize::{fall_back, finalize_section};
use super::outliers::{Candidate, outliers};
use super::repo::{PlanRow, SectionOutcome, UploadState};
use super::repo_types::RepoError;
use super::state::AppState;
use crate::api::Phase;
use crate::merge::{MergePlan, PlanSpec, partition_count};

/// Seconds without a request after which a miner no longer counts as live (at least).
const MIN_ALIVE_MS: u64 = 10_000;

/// Runs the phase machine in the background (it may read and write large objects), so a step
/// that completes a phase (the epoch's last sample, a merge upload or result) moves on without
/// waiting for the deadline task's next tick.
pub fn spawn_advance(state: &AppState) {
    let state = state.clone();
    tokio::spawn(async move {
        if let Err(e) = advance(&state).await {
            tracing::error!("merge cycle: {e}");
        }
    });
}

/// The samples completed in training epoch `epoch` when it is over: it reached the epoch's
/// sample count, or the run's budget is spent and every sample of it has ended (the last epoch
/// of a run with a budget is merged, and its model evaluated, even when it is short). `next`
/// is the run's next sample id (from [`super::repo::Repository::run_state`], which the callers
/// have read already).
///
/// # Errors
/// A state-store error.
pub fn training_epoch_over(
    state: &AppState,
    epoch: u64,
    next: u64,
) -> Result<Option<u64>, RepoError> {
    let (done, active) = state.repo.epoch_progress(epoch)?;
    let budget_spent = state.config.max_samples.is_some_and(|b| next >= b);
    let over =
        done >= state.config.epoch_samples(epoch) || (budget_spent && active == 0 && done > 0);
    Ok(over.then_some(done))
}

/// Runs one step of the phase machine; a no-op when nothing is due.
///
/// # Errors
/// [`CycleError`]; nothing is half-applied (each step is one transaction at its end).
pub async fn advance(state: &AppState) -> Result<(), CycleError> {
    let _guard = state.cycle_lock.lock().await;
    // A phase that just began may be due at once (the uploads closed: the plans can be built
    // now), so the machine steps until it stays put instead of waiting for the next tick.
    for _ in 0..3 {
        if !step(state).await? {
            break;
        }
        state.merge_changed();
    }
    Ok(())
}

/// One step of the phase machine (the caller holds the cycle lock); `true` when the phase
/// changed or a merge plan was built, so the waiting merge tasks have news.
async fn step(state: &AppState) -> Result<bool, CycleError> {
    let now = state.now_ms();
    let info = state.repo.phase_info()?;
    let m = &state.config.merge;
    let mut moved = false;
    match info.phase {
        Phase::Training => {
            let (_, _, next) = state.repo.run_state()?;
            if let Some(done) = training_epoch_over(state, info.epoch, next)? {
                let deadline = now.saturating_add(m.upload_s.saturating_mul(1000));
                let cancelled = state.repo.begin_uploading(info.epoch, deadline, now)?;
                state.wakeups.everyone();
                moved = true;
                tracing::info!(
                    epoch = info.epoch,
                    completed = done,
                    cancelled,
                    "training epoch ended: uploading for the merge"
                );
            }
        }
        Phase::Uploading => {
            let deadline = info.deadline_ms.unwrap_or(now);
            if now >= deadline || all_live_uploads_in(state, info.epoch, now, deadline)? {
                if now < deadline {
                    // Closed early: a lease still open belongs to a miner that was waited for
                    // and did not deliver.
                    let ended = state.repo.end_leases(info.epoch, now)?;
                    if ended > 0 {
                        tracing::warn!(
                            epoch = info.epoch,
                            ended,
                            "undelivered upload leases ended"
                        );
                    }
                }
                let merge_deadline = now
                    .saturating_add(m.lease_grace_s.saturating_mul(1000))
                    .saturating_add(m.merge_s.saturating_mul(1000));
                state.repo.begin_merging(merge_deadline, now)?;
                state.wakeups.everyone();
                moved = true;
                tracing::info!(epoch = info.epoch, "uploads closed: merging");
            }
        }
        Phase::Merging => {
            let deadline = info.deadline_ms.unwrap_or(now);
            // Sections are independent: their checks and finalisations (reading the copies,
            // writing the checkpoint) run concurrently, and each one's miners hear of its
            // plan or its checkpoint (they adopt it) as soon as it is there.
            let finalized = futures::future::try_join_all(
                (0..state.config.model.n_sections()).map(|section| async move {
                    let (finalized, changed) =
                        advance_section(state, info.epoch, section, now, deadline).await?;
                    if changed {
                        state.merge_changed();
                    }
                    Ok::<_, CycleError>(finalized)
                }),
            )
            .await?;
            let all_done = finalized.iter().all(|f| *f);
            if all_done {
                collect_garbage(state, info.epoch).await;
                state.repo.finish_merge(info.epoch)?;
                state.wakeups.everyone();
                moved = true;
                super::retention::prune_ledger(state, info.epoch + 1);
                tracing::info!(epoch = info.epoch + 1, "merge done: training");
            }
        }
    }
    Ok(moved)
}

/// Whether every awaited miner has a resolved upload (and at least one upload is in): a live
/// miner is awaited until `merge.ask_s` after the phase began (`deadline - upload_s`) when it
/// has not asked, and while its lease is open unless the others' uploads are in and it has
/// been waited for as long again as they took (at least `merge.straggler_s`).
fn all_live_uploads_in(
    state: &AppState,
    epoch: u64,
    now: u64,
    deadline: u64,
) -> Result<bool, CycleError> {
    let m = &state.config.merge;
    let began = deadline.saturating_sub(m.upload_s.saturating_mul(1000));
    let asking = now < began.saturating_add(m.ask_s.saturating_mul(1000));
    let window = state
        .config
        .heartbeat_s
        .saturating_mul(3000)
        .max(MIN_ALIVE_MS);
    let live: Vec<_> = state
        .repo
        .miners()?
        .into_iter()
        .filter(|m| now.saturating_sub(m.last_seen_ms) <= window)
        .collect();
    if live.is_empty() {
        return Ok(false);
    }
    let (mut resolved, mut last, mut leased) = (0, None::<u64>, false);
    for miner in &live {
        match state.repo.upload(epoch, &miner.hotkey)? {
            Some(u) if u.state != UploadState::Leased => {
                resolved += 1;
                let at = state
                    .repo
                    .upload_time(epoch, &miner.hotkey)?
                    .unwrap_or(began);
                last = Some(last.map_or(at, |l| l.max(at)));
            }
            Some(u) if now > u.lease_until_ms => {}
            Some(_) => leased = true,
            None if asking => return Ok(false),
            None => {}
        }
    }
    if leased {
        // A lease holder that does not deliver is waited for as long again as the uploads
        // in took, at least `merge.straggler_s`, after the last of them.
        let Some(last) = last else { return Ok(false) };
        let wait = last
            .saturating_sub(began)
            .max(m.straggler_s.saturating_mul(1000));
        return Ok(now >= last.saturating_add(wait));
    }
    Ok(resolved > 0)
}

/// Moves one section's merge forward: whether it is finalised, and whether this call changed
/// something (built its plan, or finalised it).
async fn advance_section(
    state: &AppState,
    epoch: u64,
    section: usize,
    now: u64,
    deadline: u64,
) -> Result<(bool, bool), CycleError> {
    let Some(row) = state.repo.plan(epoch, section)? else {
        let uploads = state.repo.uploads_of(epoch, section)?;
        let leases_open = uploads
            .iter()
            .any(|u| u.state == UploadState::Leased && now <= u.lease_until_ms);
        if leases_open && now < deadline {
            return Ok((false, false));
        }
        let mut accepted: Vec<_> = uploads
            .iter()
            .filter(|u| u.state == UploadState::Accepted)
            .collect();
        // The robust norm check: uploads far from the reference, compared with the others,
        // are left out. Those that carry merge weight set the medians (a zero-weight upload
        // does not enter the mean), or all of them when none does (then all weigh the same);
        // every upload is checked, since a zero-weight one still joins the plan.
        let weighted = accepted.iter().any(|u| u.weight > 0.0);
        let measured: Vec<_> = accepted
            .iter()
            .filter_map(|u| {
                u.distance.clone().map(|distance| Candidate {
                    distance,
                    peer: !weighted || u.weight > 0.0,
                    work: f64::from(u.weight.max(0.0)),
                })
            })
            .collect();
        for (miner, reason) in outliers(&measured, state.config.merge.outlier_factor) {
            tracing::warn!(epoch, section, miner = %miner, %reason, "upload left out of the merge");
            state.repo.reject_outlier(epoch, &miner, &reason, now)?;
            accepted.retain(|u| u.miner != miner);
        }
        if accepted.is_empty() {
            tracing::warn!(
                epoch,
                section,
                "no upload for this section: nothing to merge"
            );
            state
                .repo
                .finalize_section(epoch, section, &SectionOutcome::default(), now)?;
            return Ok((true, true));
        }
        let mut weights: Vec<f32> = accepted.iter().map(|u| u.weight.max(0.0)).collect();
        if weights.iter().all(|w| *w == 0.0) {
            weights.iter_mut().for_each(|w| *w = 1.0);
        }
        let layout = crate::model::layout::section_layout(&state.config.model, section)?;
        let plan = PlanRow {
            uploaders: accepted.iter().map(|u| u.miner.clone()).collect(),
            weights,
            len: layout.total_len(),
            partitions: partition_count(accepted.len(), state.config.merge.partitions_per_miner),
            replication: state.config.merge.replication,
            finalized: false,
        };
        state.repo.save_plan(epoch, section, &plan)?;
        tracing::info!(
            epoch,
            section,
            uploaders = plan.uploaders.len(),
            partitions = plan.partitions,
            "merge plan built"
        );
        return Ok((false, true));
    };
    if row.finalized {
        return Ok((true, false));
    }
    let plan = build_plan(state, epoch, section, &row)?;
    let results = state.repo.results(epoch, section)?;
    let complete = plan.partitions().iter().all(|p| {
        p.mergers().iter().all(|m| {
            results
                .iter()
                .any(|r| r.partition == p.index() && &r.merger == m)
        })
    });
    if !complete && now < deadline && !stragglers_waited_for(state, &plan, &results, now)? {
        return Ok((false, false));
    }
    match finalize_section(state, epoch, section, &row, &plan, &results).await {
        Ok(()) => Ok((true, true)),
        // Before the deadline a failure is retried at the next tick; past it the section
        // falls back to its previous global state, with the reason recorded, so a merge can
        // never hold the run up for good.
        Err(e) if now >= deadline => {
            let reason = format!("finalising failed past the merge deadline: {e}");
            tracing::error!(epoch, section, %reason, "section falls back");
            fall_back(state, epoch, section, &reason).await?;
            Ok((true, true))
        }
        Err(e) => Err(e),
    }
}

/// Whether the mergers still missing from a section's merge have been waited for long enough:
/// every partition has at least one copy, and since the last copy arrived as much time passed
/// as covering them took from the close of the uploads (at least `merge.straggler_s`).
fn stragglers_waited_for(
    state: &AppState,
    plan: &MergePlan,
    results: &[super::repo::ResultRow],
    now: u64,
) -> Result<bool, CycleError> {
    let covered = plan
        .partitions()
        .iter()
        .all(|p| results.iter().any(|r| r.partition == p.index()));
    let Some(last) = results.iter().map(|r| r.at_ms).max() else {
        return Ok(false);
    };
    if !covered {
        return Ok(false);
    }
    let closed = state.repo.phase_info()?.upload_closed_ms.unwrap_or(last);
    let wait = last
        .saturating_sub(closed)
        .max(state.config.merge.straggler_s.saturating_mul(1000));
    Ok(now >= last.saturating_add(wait))
}

/// The plan of a stored [`PlanRow`] (recomputed: it is a pure function of the row).
///
/// # Errors
/// [`CycleError::Plan`] for a row no plan can be built from.
pub fn build_plan(
    state: &AppState,
    epoch: u64,
    section: usize,
    row: &PlanRow,
) -> Result<MergePlan, CycleError> {
    Ok(PlanSpec::new(
        state.config.run.clone(),
        u32::try_from(section).unwrap_or(u32::MAX),
        epoch,
        row.uploaders.iter().cloned(),
        row.len,
    )
    .with_partitions(row.partitions)
    .with_replication(row.replication)
    .build()?)
}

/// Disposes of what the finished merge of `epoch` no longer needs: the epoch's activations,
/// the uploads and partition copies of the merge before it (the latest ones stay for audit),
/// and checkpoints past the newest `retention.checkpoints`. With validators they are kept
/// until the validators are done ([`super::retention`]). The checkpoints go before the next
/// epoch begins; the rest (hundreds of objects) is deleted in the background, so training
/// resumes without waiting for it (about 0.1 s of every merge of `tiny` on tmpfs).
async fn collect_garbage(state: &AppState, epoch: u64) {
    use super::retention::{collect_checkpoints, dispose_in_background};
    dispose_in_background(state, state.keys.activations_epoch(epoch), epoch);
    collect_checkpoints(state).await;
    if epoch > 0 {
        for section in 0..state.config.model.n_sections() {
            let s = u32::try_from(section).unwrap_or(u32::MAX);
            for prefix in [
                state.keys.weights_epoch(s, epoch - 1),
                state.keys.merged_epoch(s, epoch - 1),
            ] {
                dispose_in_background(state, prefix, epoch - 1);
            }
        }
    }
}
