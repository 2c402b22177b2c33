//! The work loop: `/api/work` (backwards first, then forwards, then new samples at the head),
//! `/api/submit` and `/api/release`.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::{Extension, Json};

use super::payload::{Checked, check_result};
use crate::api::*;
use crate::orchestrator::auth::Signed;
use crate::orchestrator::cycle;
use crate::orchestrator::http_error::HttpError;
use crate::orchestrator::metrics::Metrics;
use crate::orchestrator::repo::{EvalSample, eval_id};
use crate::orchestrator::repo_types::{
    Accepted, AssignmentRow, Fallout, NewSample, RepoError, Routed, SampleRoom,
};
use crate::orchestrator::state::{AppState, PRESTAGE_AHEAD};
use crate::orchestrator::wakeups::{Interest, Woken};
use crate::orchestrator::wire::to_wire;

/// `POST /api/work`: backwards first, then evaluations of the epoch's starting weights, then
/// open forwards, then (head miners) new samples. A request that finds nothing waits up to its
/// `wait_ms` (at most [`MAX_WORK_WAIT_MS`]) until routing gives its miner something
/// ([`crate::orchestrator::wakeups`]) and looks again, so work reaches an idle miner as soon as
/// it exists; the time spent waiting is reported (`waited_ms`) and left out of the request's
/// latency in `/metrics` ([`Waited`]).
pub async fn work(
    State(state): State<AppState>,
    req: Signed<WorkRequest>,
) -> Result<(Extension<Waited>, Json<WorkResponse>), HttpError> {
    let wait = Duration::from_millis(req.body.wait_ms.min(MAX_WORK_WAIT_MS));
    let begun = Instant::now();
    // Taken before looking, so what is routed between the look and the wait is not missed.
    let mut ticket = (!wait.is_zero()).then(|| state.wakeups.ticket(&req.hotkey));
    let mut waited = Duration::ZERO;
    loop {
        if let Some(ticket) = &ticket {
            ticket.looking();
        }
        let (mut answer, interest) = take_work(&state, &req).await?;
        if let (Some(ticket), Some(interest)) = (&ticket, interest) {
            ticket.looked(interest.forwards);
        }
        let left = wait.saturating_sub(begun.elapsed());
        let found = !answer.assignments.is_empty() || answer.phase != Phase::Training;
        if let (false, Some(ticket), Some(interest)) = (found, ticket.as_mut(), interest)
            && !left.is_zero()
        {
            let t = Instant::now();
            let woken = state.wakeups.wait(ticket, interest, left).await;
            waited += t.elapsed();
            if woken == Woken::Look {
                continue;
            }
        }
        answer.waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
        return Ok((Extension(Waited(waited)), Json(answer)));
    }
}

/// Time an `/api/work` request spent waiting for work, attached to its response so the
/// latency metrics count only the time spent serving it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Waited(pub Duration);

/// One look for `req`'s miner: what is routed to it now (and new samples for a head miner),
/// and what it could still take (none outside training).
async fn take_work(
    state: &AppState,
    req: &Signed<WorkRequest>,
) -> Result<(WorkResponse, Option<Interest>), HttpError> {
    let limits = state.limits();
    let (phase, epoch, next) = state.repo.run_state()?;
    if phase != Phase::Training {
        let answer = WorkResponse {
            assignments: Vec::new(),
            phase,
            epoch,
            waited_ms: 0,
        };
        return Ok((answer, None));
    }
    start_evals(state, epoch, next).await?;
    let taken = state
        .repo
        .take_work(&req.hotkey, req.body.max, limits, state.now_ms())?;
    let mut rows = taken.assignments;
    let mut filled = taken.filled;
    if taken.head_capacity > 0 {
        let started = start_samples(state, &req.hotkey, epoch, taken.head_capacity).await?;
        filled |= started.len() == taken.head_capacity;
        if let Some(last) = started.last() {
            prestage(state, epoch, last.sample.saturating_add(1));
        }
        rows.extend(started);
    }
    if filled {
        // It took all that its allowance lets it take: what is left (open forwards, room for
        // samples) is for another miner of its section, who may be waiting on a wakeup this
        // one used.
        state.wakeups.section(taken.section);
    }
    let mut assignments = Vec::with_capacity(rows.len());
    for row in &rows {
        assignments.push(to_wire(state, row).await?);
    }
    let interest = Interest {
        section: taken.section,
        forwards: taken.forward_room > 0,
    };
    let answer = WorkResponse {
        assignments,
        phase,
        epoch,
        waited_ms: 0,
    };
    Ok((answer, Some(interest)))
}

/// Starts the evaluation samples of `epoch` (the weights it started with) unless they were
/// or the epoch is not one to evaluate ([`AppState::evaluates`]; `next` is the run's next
/// sample id): stores their tokens and targets, then opens them for the head section. One
/// request does it; the others meanwhile go on without waiting (the evaluations reach them at
/// their next poll).
async fn start_evals(state: &AppState, epoch: u64, next: u64) -> Result<(), HttpError> {
    let units = state.eval_units();
    if units == 0 || !state.evaluates(epoch, next)? || state.repo.evals_started(epoch)? {
        return Ok(());
    }
    let Ok(_guard) = state.eval_lock.try_lock() else {
        return Ok(());
    };
    if state.repo.evals_started(epoch)? {
        return Ok(());
    }
    let mut samples = Vec::new();
    for unit in 0..units {
        let id = eval_id(epoch, unit);
        let (tokens, targets) = state.eval_tokens(unit);
        samples.push(EvalSample {
            id,
            tokens_hash: state
                .storage
                .put(&state.token_key(epoch, id, "tokens"), tokens)
                .await?,
            targets_hash: state
                .storage
                .put(&state.token_key(epoch, id, "targets"), targets)
                .await?,
        });
    }
    let started = state.repo.start_evals(epoch, &samples, state.now_ms())?;
    state.wakeups.everyone();
    tracing::info!(
        epoch,
        started,
        "evaluation of the epoch's starting weights begun"
    );
    Ok(())
}

/// Times one request may lose the race for the next sample id to another before it gives up
/// starting samples (its miner asks again at its next poll).
const MAX_LOST_RACES: usize = 8;

/// Starts up to `wanted` new samples of `epoch` for head miner `hotkey`. No lock is held while
/// their tokens are stored: each sample's tokens are stored first (a pure function of its id,
/// so concurrent requests storing the same id write the same bytes), then one transaction
/// starts it if it is still the run's next id and the epoch and budget have room for it
/// ([`crate::orchestrator::Repository::start_sample`]). A request that loses the id to another
/// tries the next one.
async fn start_samples(
    state: &AppState,
    hotkey: &str,
    epoch: u64,
    wanted: usize,
) -> Result<Vec<AssignmentRow>, HttpError> {
    let room = SampleRoom {
        budget: state.config.max_samples,
        per_epoch: Some(state.config.epoch_samples(epoch)),
        per_step: Some(state.config.samples_per_step).filter(|&g| g > 0),
    };
    let mut out = Vec::new();
    let mut lost = 0;
    while out.len() < wanted {
        // Cheap checks first, so no tokens are stored for a sample that cannot start; the
        // transaction decides.
        let (_, _, next) = state.repo.run_state()?;
        if room.budget.is_some_and(|b| next >= b) {
            break;
        }
        let (done, active) = state.repo.epoch_progress(epoch)?;
        if done + active >= state.config.epoch_samples(epoch) {
            break;
        }
        if room.per_step.is_some_and(|g| next.is_multiple_of(g)) && active > 0 {
            // Synchronous steps: the next sample opens a step, and the last one is unfinished.
            break;
        }
        let (tokens_hash, targets_hash) = stage_tokens(state, epoch, next).await?;
        let sample = NewSample {
            epoch,
            id: next,
            tokens_hash: &tokens_hash,
            targets_hash: &targets_hash,
        };
        match state
            .repo
            .start_sample(&sample, hotkey, room, state.limits(), state.now_ms())
        {
            Ok(Some(row)) => out.push(row),
            Ok(None) => break,
            Err(RepoError::SampleOrder { .. }) if lost < MAX_LOST_RACES => lost += 1,
            Err(RepoError::SampleOrder { .. }) => break,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}

/// Stores, in the background, the token objects of the samples the run will start next in
/// `epoch` (up to [`PRESTAGE_AHEAD`] past its next id, within the epoch's room and the
/// budget), so the `/api/work` request that starts one finds them stored instead of waiting
/// for two storage writes (two round trips to S3, or two new files in a local store). One
/// such task runs at a time; a sample whose tokens are not staged yet stores them itself.
/// `next` is the id after the last sample started: while the samples half a window past it
/// are staged already (most starts), no task is started, so a start costs no reads of the
/// state store for this.
fn prestage(state: &AppState, epoch: u64, next: u64) {
    let ahead = next.saturating_add(PRESTAGE_AHEAD / 2);
    if state.staged_tokens(epoch, ahead).is_some() || state.prestaging.swap(true, Ordering::AcqRel)
    {
        return;
    }
    let state = state.clone();
    tokio::spawn(async move {
        let result = prestage_ahead(&state, epoch).await;
        state.prestaging.store(false, Ordering::Release);
        if let Err(e) = result {
            tracing::debug!(epoch, "storing sample tokens ahead: {e:?}");
        }
    });
}

async fn prestage_ahead(state: &AppState, epoch: u64) -> Result<(), HttpError> {
    let (phase, current, next) = state.repo.run_state()?;
    if phase != Phase::Training || current != epoch {
        return Ok(());
    }
    let (done, active) = state.repo.epoch_progress(epoch)?;
    let room = state
        .config
        .epoch_samples(epoch)
        .saturating_sub(done + active);
    let mut end = next.saturating_add(room.min(PRESTAGE_AHEAD));
    if let Some(budget) = state.config.max_samples {
        end = end.min(budget);
    }
    for id in next..end {
        stage_tokens(state, epoch, id).await?;
    }
    Ok(())
}

/// The hashes of sample `id`'s token ids and targets, stored under `epoch` (once per process:
/// [`AppState::staged`] remembers what was stored).
async fn stage_tokens(
    state: &AppState,
    epoch: u64,
    id: u64,
) -> Result<(String, String), HttpError> {
    if let Some(hashes) = state.staged_tokens(epoch, id) {
        return Ok(hashes);
    }
    let (tokens, targets) = state.sample_tokens(id);
    let keys = (
        state.token_key(epoch, id, "tokens"),
        state.token_key(epoch, id, "targets"),
    );
    let (tokens_hash, targets_hash) = tokio::try_join!(
        state.storage.put(&keys.0, tokens),
        state.storage.put(&keys.1, targets),
    )?;
    state.stage_tokens(epoch, id, (tokens_hash.clone(), targets_hash.clone()));
    Ok((tokens_hash, targets_hash))
}

/// `POST /api/submit`: checks the upload (hash, size, shape, dtype, finite) and routes the
/// next piece of work; a refused result is penalised and re-offered.
pub async fn submit(
    State(state): State<AppState>,
    req: Signed<SubmitRequest>,
) -> Result<Json<SubmitResponse>, HttpError> {
    let limits = state.limits();
    let id = req.body.assignment_id;
    let row = state.repo.held(id, &req.hotkey, limits.tail)?;
    if row.deadline_ms.is_some_and(|d| state.now_ms() > d) {
        let fallout = state.repo.expire(limits, state.now_ms())?;
        for _ in &fallout {
            Metrics::bump(&state.metrics.expired);
        }
        state.wakeups.everyone();
        Metrics::bump(&state.metrics.refused);
        return Ok(Json(SubmitResponse {
            accepted: false,
            reason: Some("the deadline passed before the result arrived".into()),
        }));
    }
    // One check per assignment at a time: a second submission racing the first could
    // otherwise re-copy a swapped upload over the copy the first one is accepting.
    let Some(_checking) = InCheck::claim(&state, id) else {
        return Ok(Json(SubmitResponse {
            accepted: false,
            reason: Some("a submission of this assignment is already being checked".into()),
        }));
    };
    let output_key = match check_result(&state, &row, &req.body).await? {
        Checked::Accept(key) => key,
        Checked::Refuse(reason) => {
            let fallout = state
                .repo
                .refuse(id, &req.hotkey, &reason, limits, state.now_ms())?;
            tracing::warn!(hotkey = %req.hotkey, id, %reason, ?fallout, "result refused");
            state.wakeups.everyone();
            Metrics::bump(&state.metrics.refused);
            return Ok(Json(SubmitResponse {
                accepted: false,
                reason: Some(reason),
            }));
        }
    };
    let accepted = Accepted {
        output_hash: req
            .body
            .output_hash
            .as_ref()
            .map(|h| h.to_ascii_lowercase()),
        output_key: output_key.map(|k| k.as_str().to_string()),
        loss: req.body.loss,
        timings: req.body.timings,
    };
    let routed = state
        .repo
        .accept(id, &req.hotkey, &accepted, limits, state.now_ms())?;
    state.wakeups.routed(&routed);
    if row.kind == WorkKind::Backward || row.section == limits.tail {
        // The result freed room in its miner's in-flight allowance: a poll the miner holds
        // open (sent while it computed) may have looked without that room.
        state.wakeups.room_freed(&req.hotkey);
    }
    if routed == Routed::Finished {
        // Nobody reads a finished sample's tokens and activations back soon (a validator's
        // replay reads them from the store), so the orchestrator's memory holds only the
        // samples in flight.
        let sample = state
            .keys
            .activations_epoch(row.epoch)
            .join(&row.sample.into());
        state.storage.forget_recent_under(&sample);
        end_epoch_if_done(&state)?;
    }
    Metrics::bump(&state.metrics.accepted);
    Ok(Json(SubmitResponse {
        accepted: true,
        reason: None,
    }))
}

/// Moves the phase machine on at once when a finished sample completed the training epoch
/// (or the run's budget), instead of at the deadline task's next tick.
fn end_epoch_if_done(state: &AppState) -> Result<(), HttpError> {
    let (phase, epoch, next) = state.repo.run_state()?;
    if phase == Phase::Training && cycle::training_epoch_over(state, epoch, next)?.is_some() {
        cycle::spawn_advance(state);
    }
    Ok(())
}

/// `POST /api/release`: hands assignments back (forwards re-offered, backwards dropped).
pub async fn release(
    State(state): State<AppState>,
    req: Signed<ReleaseRequest>,
) -> Result<Json<SubmitResponse>, HttpError> {
    let fallout = state.repo.release(
        &req.hotkey,
        &req.body.assignment_ids,
        state.limits(),
        state.now_ms(),
    )?;
    state.wakeups.everyone();
    let dropped = fallout
        .iter()
        .filter(|f| matches!(f, Fallout::Dropped { .. }))
        .count();
    Ok(Json(SubmitResponse {
        accepted: true,
        reason: Some(format!(
            "{} released ({} samples dropped)",
            fallout.len(),
            dropped
        )),
    }))
}

/// An assignment whose submission is being checked; released when dropped.
struct InCheck<'a> {
    state: &'a AppState,
    id: u64,
}

impl<'a> InCheck<'a> {
    /// Marks `id` as being checked, unless it already is.
    fn claim(state: &'a AppState, id: u64) -> Option<Self> {
        let mut set = state.in_check.lock().unwrap_or_else(|e| e.into_inner());
        set.insert(id).then_some(Self { state, id })
    }
}

impl Drop for InCheck<'_> {
    fn drop(&mut self) {
        let mut set = self
            .state
            .in_check
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        set.remove(&self.id);
    }
}
