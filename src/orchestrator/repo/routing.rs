//! Routing: who gets which work, and what follows a result, a refusal, a release or a missed
//! deadline (see the rules in [`super`]).

use rusqlite::{Connection, OptionalExtension, params};

use super::db::{Cached, Repository, to_i64, to_u64, usize_of};
use super::ledger::{drop_sample, penalise};
use super::rows::{MINER_COLUMNS, check_held, get_assignment, read_miner, set_state};
use super::standing::{TAKES_WORK, benched_until, clear};
use crate::api::WorkKind;
use crate::orchestrator::repo_types::*;

/// Attempts at one piece of work before its sample is dropped.
pub const MAX_ATTEMPTS: u32 = 5;

/// The backwards waiting for a miner, oldest first, at most `?2` of them.
pub(super) const BACKWARDS_WAITING: &str = "SELECT id FROM assignments WHERE miner = ?1 \
     AND kind = 'backward' AND state = 'assigned' AND delivered = 0 ORDER BY id LIMIT ?2";

impl Repository {
    /// Hands `hotkey` up to `max` assignments: its pending backwards first, then open forwards
    /// of its section within its in-flight allowance. For a head miner it also says how many
    /// new samples it may start ([`Repository::start_sample`]).
    ///
    /// # Errors
    /// [`RepoError::NotRegistered`], [`RepoError::Sqlite`].
    pub fn take_work(
        &self,
        hotkey: &str,
        max: usize,
        limits: RoutingLimits,
        now_ms: u64,
    ) -> Result<WorkTaken, RepoError> {
        self.write_hot(|tx| {
            let miner = tx
                .query_row_cached(
                    &format!("SELECT {MINER_COLUMNS} FROM miners WHERE hotkey = ?1"),
                    [hotkey],
                    read_miner,
                )
                .optional()?
                .ok_or_else(|| RepoError::NotRegistered {
                    hotkey: hotkey.to_string(),
                })?;
            tx.execute_cached(
                "UPDATE miners SET last_seen = ?2 WHERE hotkey = ?1",
                params![hotkey, to_i64(now_ms)],
            )?;
            let section = to_i64(miner.section as u64);
            let mut out = Vec::new();
            // 1. Backwards waiting for this miner.
            let ids: Vec<i64> = {
                let mut stmt = tx.prepare_cached(BACKWARDS_WAITING)?;
                let rows = stmt.query_map(params![hotkey, to_i64(max as u64)], |r| r.get(0))?;
                rows.collect::<Result<_, _>>()?
            };
            for id in ids {
                tx.execute_cached(
                    "UPDATE assignments SET delivered = 1, delivered_at = ?2 WHERE id = ?1",
                    params![id, to_i64(now_ms)],
                )?;
                out.push(get_assignment(tx, to_u64(id), limits.tail)?);
            }
            // No evaluations or forwards for a miner backed off or excluded
            // ([`super::standing`]).
            if benched_until(tx, hotkey)?.is_some_and(|until| until > now_ms) {
                return Ok(WorkTaken {
                    assignments: out,
                    head_capacity: 0,
                    section: miner.section,
                    forward_room: 0,
                    filled: false,
                });
            }
            // 2. Evaluations of the section (they keep nothing, so no allowance applies).
            let evals: Vec<i64> = {
                let mut stmt = tx.prepare_cached(
                    "SELECT id FROM assignments WHERE state = 'open' AND section = ?1 \
                     AND kind = 'eval' ORDER BY id LIMIT ?2",
                )?;
                let room = to_i64(max.saturating_sub(out.len()) as u64);
                let rows = stmt.query_map(params![section, room], |r| r.get(0))?;
                rows.collect::<Result<_, _>>()?
            };
            for id in evals {
                out.push(hand_out(tx, id, hotkey, section, limits, now_ms)?);
            }
            // 3. Forwards within the in-flight allowance.
            let in_flight: i64 = tx.query_row_cached(
                "SELECT COUNT(*) FROM pathway p JOIN samples s ON s.id = p.sample \
                 WHERE p.miner = ?1 AND p.section = ?2 AND p.backward_done = 0 \
                 AND s.outcome = 'active' AND s.kind = 'train'",
                params![hotkey, section],
                |r| r.get(0),
            )?;
            // While the run trains on one lane, only each section's first-ranked miner
            // takes training work, and it takes whole synchronous steps (with asynchronous
            // steps, as many as its in-flight cap allows, as in the rest of the run).
            let lane_only = single_lane(tx, limits)?;
            let off_lane = lane_only
                && ranked_live(tx, miner.section, limits, now_ms)?
                    .first()
                    .is_none_or(|first| first != hotkey);
            let share = if lane_only && limits.samples_per_step > 0 {
                usize::try_from(limits.samples_per_step).unwrap_or(usize::MAX)
            } else {
                step_share(tx, section, limits, now_ms)?
            };
            let mut cap = match limits.single_lane_max_in_flight {
                n if lane_only && n > 0 => limits.max_in_flight.min(n),
                _ => limits.max_in_flight,
            };
            if limits.early_max_in_flight > 0 && before_epoch(tx, limits.early_epochs)? {
                cap = cap.min(limits.early_max_in_flight);
            }
            cap = cap.min(epoch_cap(tx, section, limits, now_ms)?);
            let allowance = if off_lane {
                0
            } else {
                cap.min(miner.max_in_flight.max(1))
                    .min(share)
                    .saturating_sub(usize_of(in_flight))
            };
            let mut wanted = allowance.min(max.saturating_sub(out.len()));
            // A forward offered to another miner of the lane is left to it for a while.
            let lane_open_before = to_i64(now_ms.saturating_sub(limits.lane_wait_ms));
            let open: Vec<i64> = {
                let mut stmt = tx.prepare_cached(
                    "SELECT id FROM assignments WHERE state = 'open' AND section = ?1 \
                     AND kind = 'forward' \
                     AND (prefer IS NULL OR prefer = ?3 OR created_at <= ?4) \
                     ORDER BY id LIMIT ?2",
                )?;
                let rows = stmt.query_map(
                    params![section, to_i64(wanted as u64), hotkey, lane_open_before],
                    |r| r.get(0),
                )?;
                rows.collect::<Result<_, _>>()?
            };
            let filled = wanted > 0 && open.len() == wanted;
            for id in open {
                out.push(hand_out(tx, id, hotkey, section, limits, now_ms)?);
                wanted = wanted.saturating_sub(1);
            }
            let head_capacity = if miner.section == 0 { wanted } else { 0 };
            Ok(WorkTaken {
                assignments: out,
                head_capacity,
                section: miner.section,
                forward_room: wanted,
                filled,
            })
        })
    }

    /// Starts `sample` (which must be the run's next one) with its head forward assigned to
    /// `hotkey`. The caller has stored its token ids and targets under `sample.epoch`
    /// beforehand. Whether there is room is decided here, in the transaction that starts it:
    /// `None` when the run is not training in `sample.epoch`, the budget is spent, or the
    /// epoch already has as many completed and active samples as its merge needs, so
    /// concurrent requests can never start more than `room` allows.
    ///
    /// # Errors
    /// [`RepoError::SampleOrder`] when another sample took the id first.
    pub fn start_sample(
        &self,
        sample: &NewSample<'_>,
        hotkey: &str,
        room: SampleRoom,
        limits: RoutingLimits,
        now_ms: u64,
    ) -> Result<Option<AssignmentRow>, RepoError> {
        self.write_hot(|tx| {
            let (phase, epoch, next): (String, i64, i64) = tx.query_row_cached(
                "SELECT phase, epoch, next_sample FROM run_state WHERE id = 0",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?;
            if phase != "training" || to_u64(epoch) != sample.epoch {
                return Ok(None);
            }
            if to_u64(next) != sample.id {
                return Err(RepoError::SampleOrder {
                    expected: to_u64(next),
                    got: sample.id,
                });
            }
            if room.budget.is_some_and(|b| sample.id >= b) {
                return Ok(None);
            }
            if let Some(cap) = room.per_epoch {
                let taken: i64 = tx.query_row_cached(
                    "SELECT COALESCE((SELECT completed + active FROM sample_counts \
                     WHERE kind = 'train' AND epoch = ?1), 0)",
                    [epoch],
                    |r| r.get(0),
                )?;
                if to_u64(taken) >= cap {
                    return Ok(None);
                }
            }
            if room.per_step.is_some_and(|g| sample.id.is_multiple_of(g)) {
                let active: i64 = tx.query_row_cached(
                    "SELECT COALESCE(SUM(active), 0) FROM sample_counts WHERE kind = 'train'",
                    [],
                    |r| r.get(0),
                )?;
                if active > 0 {
                    return Ok(None);
                }
            }
            tx.execute_cached(
                "INSERT INTO samples (id, epoch, outcome, tokens_hash, targets_hash, started_at) \
                 VALUES (?1, ?2, 'active', ?3, ?4, ?5)",
                params![
                    to_i64(sample.id),
                    epoch,
                    sample.tokens_hash,
                    sample.targets_hash,
                    to_i64(now_ms)
                ],
            )?;
            tx.execute_cached(
                "UPDATE run_state SET next_sample = ?1 WHERE id = 0",
                [to_i64(sample.id + 1)],
            )?;
            tx.execute_cached(
                "INSERT INTO assignments (sample, epoch, section, kind, miner, deadline, state, \
                 delivered, input_hash, created_at, delivered_at) \
                 VALUES (?1, ?2, 0, 'forward', ?3, ?4, 'assigned', 1, ?5, ?6, ?6)",
                params![
                    to_i64(sample.id),
                    epoch,
                    hotkey,
                    to_i64(now_ms.saturating_add(limits.forward_ms)),
                    sample.tokens_hash,
                    to_i64(now_ms)
                ],
            )?;
            let id = to_u64(tx.last_insert_rowid());
            tx.execute_cached(
                "INSERT OR REPLACE INTO pathway (sample, section, miner, backward_done) \
                 VALUES (?1, 0, ?2, 0)",
                params![to_i64(sample.id), hotkey],
            )?;
            Ok(Some(get_assignment(tx, id, limits.tail)?))
        })
    }

    /// Checks that `hotkey` holds assignment `id` and that it is waiting for a result.
    ///
    /// # Errors
    /// [`RepoError::UnknownAssignment`], [`RepoError::NotHolder`], [`RepoError::NotAssigned`].
    pub fn held(&self, id: u64, hotkey: &str, tail: usize) -> Result<AssignmentRow, RepoError> {
        self.read_hot(|conn| {
            let row = get_assignment(conn, id, tail)?;
            check_held(&row, hotkey)?;
            Ok(row)
        })
    }

    /// Accepts the result of assignment `id` from `hotkey` and routes the next piece of work:
    /// a forward output becomes an open forward of the next section; the tail's input gradient
    /// or a backward's becomes a backward of the previous section for the miner that ran its
    /// forward; the head's backward completes the sample. Returns what was routed, so the
    /// miners it concerns can be woken ([`crate::orchestrator::wakeups`]).
    ///
    /// # Errors
    /// As [`Repository::held`].
    pub fn accept(
        &self,
        id: u64,
        hotkey: &str,
        result: &Accepted,
        limits: RoutingLimits,
        now_ms: u64,
    ) -> Result<Routed, RepoError> {
        self.write_hot(|tx| {
            let row = get_assignment(tx, id, limits.tail)?;
            check_held(&row, hotkey)?;
            let output_hash = result.output_hash.clone().unwrap_or_default();
            tx.execute_cached(
                "UPDATE assignments SET state = 'done', output_hash = ?2, finished_at = ?3, \
                 download_ms = ?4, compute_ms = ?5, upload_ms = ?6, output_key = ?7 WHERE id = ?1",
                params![
                    to_i64(id),
                    result.output_hash,
                    to_i64(now_ms),
                    to_i64(result.timings.download_ms),
                    to_i64(result.timings.compute_ms),
                    to_i64(result.timings.upload_ms),
                    result.output_key
                ],
            )?;
            clear(tx, hotkey, now_ms)?;
            let sample = to_i64(row.sample);
            let section = row.section;
            let backward_done = |s: usize| -> Result<(), RepoError> {
                tx.execute_cached(
                    "UPDATE pathway SET backward_done = 1 WHERE sample = ?1 AND section = ?2",
                    params![sample, to_i64(s as u64)],
                )?;
                Ok(())
            };
            let next_step = match row.kind {
                WorkKind::Eval if section < limits.tail => {
                    insert_open(
                        tx,
                        &row,
                        section + 1,
                        WorkKind::Eval,
                        (&output_hash, Some(id)),
                        (0, None),
                        now_ms,
                    )?;
                    return Ok(Routed::Opened {
                        section: section + 1,
                        prefer: None,
                    });
                }
                WorkKind::Eval => {
                    tx.execute_cached(
                        "UPDATE samples SET loss = ?2, outcome = 'completed', finished_at = ?3 \
                         WHERE id = ?1",
                        params![sample, result.loss.map(f64::from), to_i64(now_ms)],
                    )?;
                    return Ok(Routed::Finished);
                }
                WorkKind::Forward if section < limits.tail => {
                    tx.execute_cached(
                        "UPDATE miners SET forwards = forwards + 1 WHERE hotkey = ?1",
                        [hotkey],
                    )?;
                    let prefer = if single_lane(tx, limits)? {
                        // The lane is each section's first-ranked miner; spreading its forwards
                        // over the next section's miners, as lanes do when that section has
                        // more feeding into it, left every other sample waiting `lane_wait_ms`
                        // for a miner that takes no training work.
                        ranked_live(tx, section + 1, limits, now_ms)?
                            .into_iter()
                            .next()
                    } else if limits.lanes {
                        lane_partner(tx, (hotkey, row.sample), section, limits, now_ms)?
                    } else {
                        None
                    };
                    insert_open(
                        tx,
                        &row,
                        section + 1,
                        WorkKind::Forward,
                        (&output_hash, Some(id)),
                        (0, prefer.as_deref()),
                        now_ms,
                    )?;
                    return Ok(Routed::Opened {
                        section: section + 1,
                        prefer,
                    });
                }
                WorkKind::Forward => {
                    tx.execute_cached(
                        "UPDATE miners SET forwards = forwards + 1, backwards = backwards + 1 \
                         WHERE hotkey = ?1",
                        [hotkey],
                    )?;
                    tx.execute_cached(
                        "UPDATE samples SET loss = ?2 WHERE id = ?1",
                        params![sample, result.loss.map(f64::from)],
                    )?;
                    backward_done(section)?;
                    section.checked_sub(1)
                }
                WorkKind::Backward => {
                    tx.execute_cached(
                        "UPDATE miners SET backwards = backwards + 1 WHERE hotkey = ?1",
                        [hotkey],
                    )?;
                    backward_done(section)?;
                    section.checked_sub(1)
                }
            };
            let done_at_head = row.kind == WorkKind::Backward && section == 0
                || row.kind == WorkKind::Forward && section == limits.tail && section == 0;
            if done_at_head {
                tx.execute_cached(
                    "UPDATE samples SET outcome = 'completed', finished_at = ?2 WHERE id = ?1",
                    params![sample, to_i64(now_ms)],
                )?;
                return Ok(Routed::Finished);
            }
            if let Some(prev) = next_step {
                let owner: Option<String> = tx
                    .query_row_cached(
                        "SELECT miner FROM pathway WHERE sample = ?1 AND section = ?2",
                        params![sample, to_i64(prev as u64)],
                        |r| r.get(0),
                    )
                    .optional()?;
                match owner {
                    Some(owner) => {
                        let input = (output_hash.as_str(), id);
                        insert_backward(tx, &row, prev, &owner, input, 0, limits, now_ms)?;
                        return Ok(Routed::Backward { miner: owner });
                    }
                    None => drop_sample(
                        tx,
                        row.sample,
                        &format!("no miner on record for the forward of section {prev}"),
                        now_ms,
                    )?,
                }
            }
            Ok(Routed::Finished)
        })
    }

    /// Refuses the result of assignment `id` (bad payload): records `reason`, penalises the
    /// miner and re-offers the work (see the module documentation).
    ///
    /// # Errors
    /// As [`Repository::held`].
    pub fn refuse(
        &self,
        id: u64,
        hotkey: &str,
        reason: &str,
        limits: RoutingLimits,
        now_ms: u64,
    ) -> Result<Fallout, RepoError> {
        self.write(|tx| {
            let row = get_assignment(tx, id, limits.tail)?;
            check_held(&row, hotkey)?;
            let reason = format!("refused result from {hotkey}: {reason}");
            set_state(tx, id, AssignmentState::Failed, &reason, now_ms)?;
            penalise(tx, &self.standing, hotkey, Some(id), &reason, now_ms)?;
            reoffer(tx, &row, &reason, true, limits, now_ms)
        })
    }

    /// Hands assignments back (miner shutdown): forwards are re-offered without penalty;
    /// a released backward drops its sample (only this miner held the forward's input).
    /// Ids that `hotkey` does not hold are ignored. Returns what happened to each released one.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn release(
        &self,
        hotkey: &str,
        ids: &[u64],
        limits: RoutingLimits,
        now_ms: u64,
    ) -> Result<Vec<Fallout>, RepoError> {
        self.write(|tx| {
            let mut out = Vec::new();
            for &id in ids {
                let row = match get_assignment(tx, id, limits.tail) {
                    Ok(row) => row,
                    Err(RepoError::UnknownAssignment { .. }) => continue,
                    Err(e) => return Err(e),
                };
                if check_held(&row, hotkey).is_err() {
                    continue;
                }
                let reason = format!("released by {hotkey}");
                set_state(tx, id, AssignmentState::Released, &reason, now_ms)?;
                out.push(reoffer(tx, &row, &reason, false, limits, now_ms)?);
            }
            Ok(out)
        })
    }

    /// Expires every held assignment whose deadline is before `now_ms`: penalises its miner,
    /// re-offers a forward, drops the sample of a backward. Returns what happened.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`].
    pub fn expire(&self, limits: RoutingLimits, now_ms: u64) -> Result<Vec<Fallout>, RepoError> {
        self.write(|tx| {
            let ids: Vec<i64> = {
                let mut stmt = tx.prepare_cached(
                    "SELECT id FROM assignments WHERE state = 'assigned' AND deadline < ?1 \
                     ORDER BY id",
                )?;
                let rows = stmt.query_map([to_i64(now_ms)], |r| r.get(0))?;
                rows.collect::<Result<_, _>>()?
            };
            let mut out = Vec::new();
            for id in ids {
                let row = get_assignment(tx, to_u64(id), limits.tail)?;
                // An earlier expiry in this loop may have cancelled it (same sample).
                if row.state != AssignmentState::Assigned {
                    continue;
                }
                let miner = row.miner.clone().unwrap_or_default();
                let kind = kind_str(row.kind);
                let reason = format!(
                    "{kind} of section {} missed its deadline (miner {miner})",
                    row.section
                );
                set_state(tx, row.id, AssignmentState::Expired, &reason, now_ms)?;
                penalise(tx, &self.standing, &miner, Some(row.id), &reason, now_ms)?;
                out.push(match row.kind {
                    WorkKind::Forward | WorkKind::Eval => {
                        reoffer(tx, &row, &reason, true, limits, now_ms)?
                    }
                    WorkKind::Backward => {
                        drop_sample(tx, row.sample, &reason, now_ms)?;
                        Fallout::Dropped {
                            sample: row.sample,
                            reason,
                        }
                    }
                });
            }
            Ok(out)
        })
    }
}

/// With synchronous steps of G samples, the most a miner of `section` may hold at once: its
/// share `ceil(G / live miners of the section)` (seen within `live_ms`, not backed off or
/// excluded), so a step's samples are spread over the section's miners and each steps on its
/// part, as data parallelism would (otherwise whoever asks first takes the whole step and the
/// others idle, and each miner's steps alternate between a full batch and none). A miner that
/// holds its share takes more once one of its samples is done, so a silent miner still
/// counted as live slows a step, never stalls it. `usize::MAX` (no cap) with asynchronous
/// steps.
fn step_share(
    tx: &Connection,
    section: i64,
    limits: RoutingLimits,
    now_ms: u64,
) -> Result<usize, RepoError> {
    if limits.samples_per_step == 0 {
        return Ok(usize::MAX);
    }
    let share = limits
        .samples_per_step
        .div_ceil(live_in_section(tx, section, limits, now_ms)?);
    Ok(usize::try_from(share).unwrap_or(usize::MAX))
}

/// The live miners of `section` that may take work, at least 1. Backed-off or excluded miners
/// get no forwards, so they take no share of a step or an epoch.
fn live_in_section(
    tx: &Connection,
    section: i64,
    limits: RoutingLimits,
    now_ms: u64,
) -> Result<u64, RepoError> {
    let live: i64 = tx.query_row_cached(
        &format!("SELECT COUNT(*) FROM miners WHERE {TAKES_WORK} AND section = ?3"),
        params![to_i64(now_ms), to_i64(limits.live_ms), section],
        |r| r.get(0),
    )?;
    Ok(to_u64(live.max(1)))
}

/// The in-flight cap the current epoch's size allows a miner of `section`: one forward per
/// `epoch_share_per_in_flight` samples of its share of the epoch (the epoch's samples over
/// the section's live miners), at least one; unbounded when the rule is off. A miner's steps
/// after its last forward of an epoch are blind until the merge, so a short epoch at a deep
/// in-flight cap is mostly such steps.
fn epoch_cap(
    tx: &Connection,
    section: i64,
    limits: RoutingLimits,
    now_ms: u64,
) -> Result<usize, RepoError> {
    if limits.epoch_share_per_in_flight == 0 {
        return Ok(usize::MAX);
    }
    let samples = limits.epochs.samples_in(current_epoch(tx)?);
    let share = samples.div_ceil(live_in_section(tx, section, limits, now_ms)?);
    let cap = (share / limits.epoch_share_per_in_flight).max(1);
    Ok(usize::try_from(cap).unwrap_or(usize::MAX))
}

/// Gives the open assignment `id` (a forward or an evaluation of `section`) to `hotkey` and
/// records it on the sample's pathway.
fn hand_out(
    tx: &Connection,
    id: i64,
    hotkey: &str,
    section: i64,
    limits: RoutingLimits,
    now_ms: u64,
) -> Result<AssignmentRow, RepoError> {
    tx.execute_cached(
        "UPDATE assignments SET state = 'assigned', miner = ?2, deadline = ?3, \
         delivered = 1, delivered_at = ?4 WHERE id = ?1",
        params![
            id,
            hotkey,
            to_i64(now_ms.saturating_add(limits.forward_ms)),
            to_i64(now_ms)
        ],
    )?;
    let row = get_assignment(tx, to_u64(id), limits.tail)?;
    tx.execute_cached(
        "INSERT OR REPLACE INTO pathway (sample, section, miner, backward_done) \
         VALUES (?1, ?2, ?3, 0)",
        params![to_i64(row.sample), section, hotkey],
    )?;
    Ok(row)
}

/// The miner of the section after `section` that should take `sample`'s forward from
/// `hotkey` in lane routing. Live miners of a section (seen within `live_ms`, not backed off
/// or excluded) are ranked by registration; the lane of rank `r` holds the next section's
/// ranks `r`, `r + n`, `r + 2n`, ... (`n` this section's feeding miners), or rank `r mod m`
/// when the next section has fewer (`m`) live miners. A lane with several miners downstream
/// spreads its samples over them by sample id, so a section with more live miners than the
/// one before it keeps every miner busy (and paid) instead of feeding only the first `n`.
///
/// Upstream, only *feeding* miners hold a lane: live ones that have delivered a forward and
/// have no failure outstanding (no strikes since their last accepted result). A miner that
/// takes work and never finishes it (dead, or a free-rider) would otherwise keep a lane whose
/// downstream miners get no work at all, through no fault of theirs, until it is backed off;
/// downstream every live miner counts, since a new one must get work to prove itself.
/// `None` when `hotkey` does not feed itself or the next section has nobody live.
fn lane_partner(
    tx: &Connection,
    (hotkey, sample): (&str, u64),
    section: usize,
    limits: RoutingLimits,
    now_ms: u64,
) -> Result<Option<String>, RepoError> {
    let ranked = ranked_feeding(tx, section, limits, now_ms)?;
    let Some(rank) = ranked.iter().position(|h| h == hotkey) else {
        return Ok(None);
    };
    let next = ranked_live(tx, section + 1, limits, now_ms)?;
    Ok(lane_index(rank, ranked.len(), next.len(), sample).map(|i| next[i].clone()))
}

/// Which of `next` live miners (in rank order) takes a forward from the miner of rank `rank`
/// among `this` live miners, for sample `sample` (see [`lane_partner`]).
fn lane_index(rank: usize, this: usize, next: usize, sample: u64) -> Option<usize> {
    if next == 0 || this == 0 {
        return None;
    }
    if next <= this {
        return Some(rank % next);
    }
    // The lane's miners downstream: rank, rank + this, ... below next.
    let lane = (next - rank).div_ceil(this);
    let pick = usize::try_from(sample % lane as u64).unwrap_or(0);
    Some(rank + pick * this)
}

/// The live miners of `section` (seen within `live_ms`, not backed off or excluded) in lane
/// order: by registration, then hotkey.
fn ranked_live(
    tx: &Connection,
    section: usize,
    limits: RoutingLimits,
    now_ms: u64,
) -> Result<Vec<String>, RepoError> {
    ranked(tx, "", section, limits, now_ms)
}

/// The feeding miners of `section` in lane order: live ([`ranked_live`]), with at least one
/// forward delivered and no strikes outstanding (see [`lane_partner`]).
fn ranked_feeding(
    tx: &Connection,
    section: usize,
    limits: RoutingLimits,
    now_ms: u64,
) -> Result<Vec<String>, RepoError> {
    ranked(
        tx,
        "AND forwards > 0 AND strikes = 0",
        section,
        limits,
        now_ms,
    )
}

/// The live miners of `section` that also meet the SQL condition `also`, in lane order.
fn ranked(
    tx: &Connection,
    also: &str,
    section: usize,
    limits: RoutingLimits,
    now_ms: u64,
) -> Result<Vec<String>, RepoError> {
    let mut stmt = tx.prepare_cached(&format!(
        "SELECT hotkey FROM miners WHERE {TAKES_WORK} AND section = ?3 {also} \
         ORDER BY registered_at, hotkey"
    ))?;
    let rows = stmt.query_map(
        params![
            to_i64(now_ms),
            to_i64(limits.live_ms),
            to_i64(section as u64)
        ],
        |r| r.get(0),
    )?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Whether the run is still in its single-lane epochs ([`RoutingLimits::single_lane_epochs`]).
fn single_lane(tx: &Connection, limits: RoutingLimits) -> Result<bool, RepoError> {
    before_epoch(tx, limits.single_lane_epochs)
}

/// Whether the run's current epoch is below `epochs` (never when `epochs` is 0).
fn before_epoch(tx: &Connection, epochs: u64) -> Result<bool, RepoError> {
    if epochs == 0 {
        return Ok(false);
    }
    Ok(current_epoch(tx)? < epochs)
}

/// The epoch the run is in.
fn current_epoch(tx: &Connection) -> Result<u64, RepoError> {
    let epoch: i64 =
        tx.query_row_cached("SELECT epoch FROM run_state WHERE id = 0", [], |r| r.get(0))?;
    Ok(to_u64(epoch))
}

/// Opens a forward or an evaluation of `row`'s sample at `section` for any miner of it
/// (offered first to `prefer`, if given); `input` is the hash of its input and the assignment
/// whose accepted result that is.
fn insert_open(
    tx: &Connection,
    row: &AssignmentRow,
    section: usize,
    kind: WorkKind,
    input: (&str, Option<u64>),
    (attempts, prefer): (u32, Option<&str>),
    now_ms: u64,
) -> Result<u64, RepoError> {
    tx.execute_cached(
        "INSERT INTO assignments (sample, epoch, section, kind, state, input_hash, input_from, \
         attempts, created_at, prefer) VALUES (?1, ?2, ?3, ?4, 'open', ?5, ?6, ?7, ?8, ?9)",
        params![
            to_i64(row.sample),
            to_i64(row.epoch),
            to_i64(section as u64),
            kind_str(kind),
            input.0,
            input.1.map(to_i64),
            i64::from(attempts),
            to_i64(now_ms),
            prefer
        ],
    )?;
    Ok(to_u64(tx.last_insert_rowid()))
}

#[allow(clippy::too_many_arguments)]
fn insert_backward(
    tx: &Connection,
    row: &AssignmentRow,
    section: usize,
    owner: &str,
    (input_hash, input_from): (&str, u64),
    attempts: u32,
    limits: RoutingLimits,
    now_ms: u64,
) -> Result<u64, RepoError> {
    tx.execute_cached(
        "INSERT INTO assignments (sample, epoch, section, kind, miner, deadline, state, \
         delivered, input_hash, input_from, attempts, created_at) \
         VALUES (?1, ?2, ?3, 'backward', ?4, ?5, 'assigned', 0, ?6, ?7, ?8, ?9)",
        params![
            to_i64(row.sample),
            to_i64(row.epoch),
            to_i64(section as u64),
            owner,
            to_i64(now_ms.saturating_add(limits.backward_ms)),
            input_hash,
            to_i64(input_from),
            i64::from(attempts),
            to_i64(now_ms)
        ],
    )?;
    Ok(to_u64(tx.last_insert_rowid()))
}

/// Re-offers the work of `row` after it failed (`counts` says whether the failure counts
/// towards [`MAX_ATTEMPTS`]).
fn reoffer(
    tx: &Connection,
    row: &AssignmentRow,
    reason: &str,
    counts: bool,
    limits: RoutingLimits,
    now_ms: u64,
) -> Result<Fallout, RepoError> {
    let attempts = if counts {
        row.attempts + 1
    } else {
        row.attempts
    };
    if attempts >= MAX_ATTEMPTS {
        let reason = format!("{reason}; gave up after {attempts} attempts");
        drop_sample(tx, row.sample, &reason, now_ms)?;
        return Ok(Fallout::Dropped {
            sample: row.sample,
            reason,
        });
    }
    match row.kind {
        WorkKind::Forward | WorkKind::Eval => {
            tx.execute_cached(
                "DELETE FROM pathway WHERE sample = ?1 AND section = ?2",
                params![to_i64(row.sample), to_i64(row.section as u64)],
            )?;
            let assignment = insert_open(
                tx,
                row,
                row.section,
                row.kind,
                (&row.input_hash, row.input_from),
                (attempts, None),
                now_ms,
            )?;
            Ok(Fallout::Reoffered { assignment })
        }
        WorkKind::Backward if counts => {
            let owner = row.miner.clone().unwrap_or_default();
            let id = insert_backward(
                tx,
                row,
                row.section,
                &owner,
                (&row.input_hash, row.input_from.unwrap_or(0)),
                attempts,
                limits,
                now_ms,
            )?;
            Ok(Fallout::RetriedBackward { assignment: id })
        }
        WorkKind::Backward => {
            drop_sample(tx, row.sample, reason, now_ms)?;
            Ok(Fallout::Dropped {
                sample: row.sample,
                reason: reason.to_string(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::lane_index;

    #[test]
    fn lanes_map_ranks_modulo_a_smaller_next_section_and_spread_over_a_larger_one() {
        // Three miners into two: ranks 0, 1, 2 -> 0, 1, 0, whatever the sample.
        let down: Vec<_> = (0..3).map(|r| lane_index(r, 3, 2, 7)).collect();
        assert_eq!(down, [Some(0), Some(1), Some(0)]);
        // Two miners into five: rank 0's lane is 0, 2, 4 and rank 1's is 1, 3, by sample.
        let lane0: Vec<_> = (0..6).map(|s| lane_index(0, 2, 5, s)).collect();
        assert_eq!(lane0, [0, 2, 4, 0, 2, 4].map(Some));
        let lane1: Vec<_> = (0..4).map(|s| lane_index(1, 2, 5, s)).collect();
        assert_eq!(lane1, [1, 3, 1, 3].map(Some));
        // Equal sections keep one partner; nobody live downstream means no preference.
        assert_eq!(lane_index(2, 4, 4, 9), Some(2));
        assert_eq!(lane_index(0, 1, 0, 0), None);
    }
}
