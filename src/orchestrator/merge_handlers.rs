//! Handlers of the merge cycle (see [`crate::api::merge`] for the protocol).

use axum::Json;
use axum::extract::State;

use super::auth::Signed;
use super::cycle::{self, build_plan};
use super::finalize::merge_sources;
use super::http_error::HttpError;
use super::outliers::{DistanceSum, UploadDistance};
use super::reference::Reference;
use super::repo::{PhaseInfo, UploadRow, UploadState};
use super::state::AppState;
use super::wire::{get_url, put_url};
use crate::api::*;
use crate::codec::Span;
use crate::model::layout::section_layout;
use crate::storage::{StatePart, StorageError};

/// How long `/api/merge/task` holds a request that has nothing to do, waiting for the merge
/// cycle to move (a plan built, a section merged, a phase begun), before answering "wait".
const HOLD: std::time::Duration = std::time::Duration::from_millis(1000);
/// Values read at a time when checking an upload (a whole number of int8 blocks).
const CHECK_CHUNK: u64 = 2 << 20;
/// Validity of a checkpoint download URL.
const CHECKPOINT_URL_MS: u64 = 3_600_000;

/// "Nothing to do yet". The request was held until the cycle moved or [`HOLD`] passed, so
/// the miner may ask again at once.
fn wait(reason: impl Into<String>) -> MergeTask {
    MergeTask::Wait {
        reason: reason.into(),
        retry_ms: 0,
    }
}

/// The latest checkpoint of `section` as a downloadable [`SectionCheckpoint`].
///
/// # Errors
/// A state-store or presigning error.
pub async fn section_checkpoint(
    state: &AppState,
    section: usize,
) -> Result<Option<SectionCheckpoint>, HttpError> {
    let Some(cp) = state.repo.latest_checkpoint(section)? else {
        return Ok(None);
    };
    let exp = state.now_ms().saturating_add(CHECKPOINT_URL_MS);
    let key = state.checkpoint_key(section, cp.epoch, StatePart::Flat);
    Ok(Some(SectionCheckpoint {
        section,
        epoch: cp.epoch,
        layout: section_layout(&state.config.model, section).map_err(HttpError::internal)?,
        optimizer_step: cp.optimizer_step,
        blob: BlobRef {
            url: get_url(state, &key, exp).await?,
            hash: Some(cp.hash),
            shape: None,
            expires_unix_ms: exp,
        },
        delta: None,
    }))
}

/// The checkpoint's delta object, if the merge that made `checkpoint` wrote one (a run whose
/// merge format has a base; not a fallback): its base epoch, the partitions' bounds and a URL.
///
/// # Errors
/// A state-store, storage or presigning error.
async fn checkpoint_delta(
    state: &AppState,
    checkpoint: &SectionCheckpoint,
) -> Result<Option<CheckpointDelta>, HttpError> {
    let wire = state.config.merge.wire;
    let (section, epoch) = (checkpoint.section, checkpoint.epoch);
    if !wire.needs_base() || epoch == 0 {
        return Ok(None);
    }
    let key = state.checkpoint_key(section, epoch, StatePart::Delta);
    let Some(row) = state.repo.plan(epoch - 1, section)? else {
        return Ok(None);
    };
    if !state
        .storage
        .exists(&key)
        .await
        .map_err(HttpError::internal)?
    {
        return Ok(None);
    }
    let plan = build_plan(state, epoch - 1, section, &row).map_err(HttpError::internal)?;
    let base_epoch = state
        .repo
        .start_checkpoint(section, epoch - 1)?
        .map_or(0, |cp| cp.epoch);
    Ok(Some(CheckpointDelta {
        base_epoch,
        wire,
        bounds: plan
            .partitions()
            .iter()
            .map(|p| p.range().end as u64)
            .collect(),
        blob: BlobRef {
            url: get_url(state, &key, checkpoint.blob.expires_unix_ms).await?,
            hash: None,
            shape: None,
            expires_unix_ms: checkpoint.blob.expires_unix_ms,
        },
    }))
}

/// The run's phase and the section `hotkey` serves.
fn phase_and_section(state: &AppState, hotkey: &str) -> Result<(PhaseInfo, usize), HttpError> {
    let info = state.repo.phase_info()?;
    let miner = state
        .repo
        .miner(hotkey)?
        .ok_or_else(|| HttpError::forbidden("not registered"))?;
    Ok((info, miner.section))
}

/// `POST /api/merge/task`: what the caller should do now. When that is to wait, the request
/// is held until the merge cycle moves (or [`HOLD`] passes) and the task is worked out again,
/// so a miner learns of the next step when it becomes possible, without polling for it.
pub async fn task(
    State(state): State<AppState>,
    req: Signed<MergeTaskRequest>,
) -> Result<Json<MergeTaskResponse>, HttpError> {
    state.repo.touch(&req.hotkey, state.now_ms())?;
    let mut events = state.merge_events.subscribe();
    let held_until = tokio::time::Instant::now() + HOLD;
    loop {
        // Changes from here on wake the wait below.
        events.borrow_and_update();
        let now = state.now_ms();
        let (info, section) = phase_and_section(&state, &req.hotkey)?;
        let task = match section_checkpoint(&state, section).await? {
            Some(mut cp) if cp.epoch > req.body.held_epoch => {
                // The miner uses the delta if it holds its base, and downloads the whole state
                // otherwise.
                cp.delta = checkpoint_delta(&state, &cp).await?;
                MergeTask::Adopt { checkpoint: cp }
            }
            _ => next_task(&state, &req.hotkey, section, info, now).await?,
        };
        if matches!(task, MergeTask::Wait { .. })
            && matches!(
                tokio::time::timeout_at(held_until, events.changed()).await,
                Ok(Ok(()))
            )
        {
            continue;
        }
        return Ok(Json(MergeTaskResponse {
            phase: info.phase,
            epoch: info.epoch,
            phase_deadline_unix_ms: info.deadline_ms,
            task,
        }));
    }
}

async fn next_task(
    state: &AppState,
    hotkey: &str,
    section: usize,
    info: PhaseInfo,
    now: u64,
) -> Result<MergeTask, HttpError> {
    let epoch = info.epoch;
    if info.phase == Phase::Training {
        return Ok(MergeTask::Train);
    }
    if state.repo.excluded(hotkey, now)? {
        // An excluded miner's state does not enter the merge, and it merges nothing.
        return Ok(wait(
            "excluded: no upload or merge work until the exclusion ends",
        ));
    }
    let upload = state.repo.upload(epoch, hotkey)?;
    let planned = state.repo.plan(epoch, section)?;
    let lease_open = |u: &UploadRow| {
        u.state == UploadState::Leased && now <= u.lease_until_ms && planned.is_none()
    };
    match &upload {
        None if info.phase == Phase::Uploading => {
            let grace = state.config.merge.lease_grace_s.saturating_mul(1000);
            let lease_until = info.deadline_ms.unwrap_or(now).saturating_add(grace);
            state
                .repo
                .lease_upload(epoch, section, hotkey, lease_until)?;
            return upload_task(state, hotkey, section, epoch, lease_until).await;
        }
        Some(u) if lease_open(u) => {
            return upload_task(state, hotkey, section, epoch, u.lease_until_ms).await;
        }
        _ => {}
    }
    let Some(row) = planned else {
        return Ok(wait(match info.phase {
            Phase::Uploading => "waiting for the other uploads",
            _ => "waiting for the merge plan",
        }));
    };
    if row.finalized {
        return Ok(wait(
            "this section is merged; waiting for the other sections",
        ));
    }
    let plan = build_plan(state, epoch, section, &row).map_err(HttpError::internal)?;
    let done = state.repo.results(epoch, section)?;
    let hashes: std::collections::HashMap<String, Option<String>> = state
        .repo
        .uploads_of(epoch, section)?
        .into_iter()
        .map(|u| (u.miner, u.hash))
        .collect();
    let deadline = info.deadline_ms.unwrap_or(now);
    let wire = state.config.merge.wire;
    let params_len = plan.flat_len() as u64 / 3;
    let mut partitions = Vec::new();
    for part in plan.partitions_for(hotkey) {
        if done
            .iter()
            .any(|r| r.partition == part.index() && r.merger == hotkey)
        {
            continue;
        }
        let range = part.range();
        let mut sources = Vec::new();
        let read_until = deadline.saturating_add(super::wire::URL_GRACE_MS);
        for (uploader, weight) in merge_sources(&row) {
            // The orchestrator's copy of the accepted upload, with the hash it was accepted
            // with: the uploader cannot change it.
            let key = state
                .accepted_upload_key(section, epoch, &uploader)
                .map_err(HttpError::internal)?;
            let hash = hashes.get(&uploader).cloned().flatten();
            sources.push(MergeSource {
                hotkey: uploader,
                weight,
                blob: BlobRef {
                    url: get_url(state, &key, read_until).await?,
                    hash,
                    shape: None,
                    expires_unix_ms: read_until,
                },
            });
        }
        let out = state
            .partition_key(section, epoch, part.index(), hotkey)
            .map_err(HttpError::internal)?;
        partitions.push(PartitionTask {
            index: part.index(),
            start: range.start as u64,
            end: range.end as u64,
            sources,
            output: BlobRef {
                url: put_url(
                    state,
                    &out,
                    deadline,
                    wire.encoded_len(
                        range.len() as u64,
                        Span::partition(range.start as u64, params_len),
                    ),
                )
                .await?,
                hash: None,
                shape: Some(vec![range.len()]),
                expires_unix_ms: deadline,
            },
        });
    }
    if partitions.is_empty() {
        return Ok(wait("waiting for the other mergers"));
    }
    Ok(MergeTask::Merge {
        epoch,
        op: state.config.merge.op,
        partitions,
        wire,
        params_len,
    })
}

async fn upload_task(
    state: &AppState,
    hotkey: &str,
    section: usize,
    epoch: u64,
    lease_until: u64,
) -> Result<MergeTask, HttpError> {
    let key = state
        .upload_key(section, epoch, hotkey)
        .map_err(HttpError::internal)?;
    let layout = section_layout(&state.config.model, section).map_err(HttpError::internal)?;
    let wire = state.config.merge.wire;
    Ok(MergeTask::Upload {
        epoch,
        wire,
        target: BlobRef {
            url: put_url(
                state,
                &key,
                lease_until,
                wire.encoded_len(layout.total_len() as u64, Span::whole(layout.params_len)),
            )
            .await?,
            hash: None,
            shape: Some(vec![layout.total_len()]),
            expires_unix_ms: lease_until,
        },
        layout,
        lease_until_unix_ms: lease_until,
    })
}

fn refused(reason: impl Into<String>) -> Json<SubmitResponse> {
    Json(SubmitResponse {
        accepted: false,
        reason: Some(reason.into()),
    })
}

/// `POST /api/merge/submit`: an upload or a merged partition is done.
pub async fn submit(
    State(state): State<AppState>,
    req: Signed<MergeSubmitRequest>,
) -> Result<Json<SubmitResponse>, HttpError> {
    let now = state.now_ms();
    let (info, section) = phase_and_section(&state, &req.hotkey)?;
    let response = match &req.body {
        MergeSubmitRequest::Upload { epoch, manifest } => {
            if *epoch != info.epoch || info.phase == Phase::Training {
                return Ok(refused(format!(
                    "no merge of epoch {epoch} is collecting uploads"
                )));
            }
            let Some(upload) = state.repo.upload(*epoch, &req.hotkey)? else {
                return Ok(refused("no upload lease: ask /api/merge/task first"));
            };
            if upload.state != UploadState::Leased {
                return Ok(refused(format!(
                    "this upload was already {}",
                    upload.state.as_str()
                )));
            }
            if now > upload.lease_until_ms || state.repo.plan(*epoch, section)?.is_some() {
                return Ok(refused("the upload lease expired"));
            }
            match check_upload(&state, section, *epoch, &req.hotkey, manifest).await? {
                Err(reason) => {
                    tracing::warn!(hotkey = %req.hotkey, epoch, %reason, "upload refused");
                    state
                        .repo
                        .refuse_upload(*epoch, &req.hotkey, &reason, state.now_ms())?;
                    refused(reason)
                }
                Ok(distance) => {
                    let weight = state.repo.backwards_in_epoch(&req.hotkey, *epoch)? as f32;
                    // The check took time: the lease may have ended or the plan been built
                    // meanwhile, and then the upload stays out.
                    let accepted = state.repo.accept_upload(
                        *epoch,
                        &req.hotkey,
                        &manifest.hash.to_ascii_lowercase(),
                        manifest.bytes,
                        weight,
                        &distance,
                        state.now_ms(),
                    )?;
                    if accepted {
                        state.repo.record_upload_time(*epoch, &req.hotkey, now)?;
                        tracing::info!(hotkey = %req.hotkey, epoch, section, weight, "upload accepted");
                        Json(SubmitResponse {
                            accepted: true,
                            reason: None,
                        })
                    } else {
                        refused("the upload lease ended while the upload was being checked")
                    }
                }
            }
        }
        MergeSubmitRequest::Partition {
            epoch,
            index,
            hash,
            bytes,
        } => {
            if *epoch != info.epoch || info.phase != Phase::Merging {
                return Ok(refused(format!("no merge of epoch {epoch} is under way")));
            }
            let Some(row) = state.repo.plan(*epoch, section)? else {
                return Ok(refused("this section has no merge plan yet"));
            };
            if row.finalized {
                return Ok(refused("this section's merge is already finalised"));
            }
            let plan = build_plan(&state, *epoch, section, &row).map_err(HttpError::internal)?;
            let Some(part) = plan
                .partitions_for(&req.hotkey)
                .find(|p| p.index() == *index)
            else {
                return Ok(refused(format!(
                    "partition {index} is not assigned to this miner"
                )));
            };
            let span = Span::partition(part.range().start as u64, row.len as u64 / 3);
            let expected = state.config.merge.wire.encoded_len(part.len() as u64, span);
            let key = state
                .partition_key(section, *epoch, *index, &req.hotkey)
                .map_err(HttpError::internal)?;
            // Only the object's size is checked here. Its bytes are read once, when the section
            // is finalised: a copy that does not hash as submitted (or was replaced since) is
            // flagged `invalid` there and left out, so reading and hashing it now as well
            // would only repeat that work.
            if blake3::Hash::from_hex(hash).is_err() {
                return Ok(refused(format!("hash must be 64 hex digits, got {hash:?}")));
            }
            let reason = match state.storage.head(&key).await {
                Ok(got) if got != expected => Some(format!(
                    "partition {index} must be {expected} bytes, the object is {got}"
                )),
                Ok(_) if *bytes != expected => Some(format!(
                    "partition {index} must be {expected} bytes, reported {bytes}"
                )),
                Ok(_) => None,
                Err(StorageError::NotFound { .. }) => {
                    Some(format!("nothing was uploaded for partition {index}"))
                }
                Err(e) => return Err(HttpError::internal(e)),
            };
            if let Some(reason) = reason {
                return Ok(refused(reason));
            }
            state.repo.record_result(
                *epoch,
                section,
                *index,
                &req.hotkey,
                &hash.to_ascii_lowercase(),
                *bytes,
                now,
            )?;
            Json(SubmitResponse {
                accepted: true,
                reason: None,
            })
        }
    };
    cycle::spawn_advance(&state);
    Ok(response)
}

/// Checks an upload: layout, dtype and size first (the object is sized with a HEAD, never
/// read when the size is wrong), then it is copied to its accepted key (which no URL can
/// overwrite) and the copy is read chunk by chunk: hash, finiteness, and its distances from
/// the reference state for the robust norm check. `Err` holds the reason it is refused.
///
/// # Errors
/// A storage error other than a missing or mis-sized object.
async fn check_upload(
    state: &AppState,
    section: usize,
    epoch: u64,
    hotkey: &str,
    manifest: &UploadManifest,
) -> Result<Result<UploadDistance, String>, HttpError> {
    let layout = section_layout(&state.config.model, section).map_err(HttpError::internal)?;
    if let Err(e) = layout.expect_same(&manifest.layout) {
        return Ok(Err(format!("wrong layout: {e}")));
    }
    let wire = state.config.merge.wire;
    if manifest.dtype != wire.to_string() {
        return Ok(Err(format!(
            "dtype {} is not this run's merge.wire {wire}",
            manifest.dtype
        )));
    }
    let n = layout.total_len() as u64;
    let span = Span::whole(layout.params_len);
    let total = wire.encoded_len(n, span);
    if manifest.bytes != total {
        return Ok(Err(format!(
            "manifest says {} bytes, the layout needs {total} in {wire}",
            manifest.bytes,
        )));
    }
    let key = state
        .upload_key(section, epoch, hotkey)
        .map_err(HttpError::internal)?;
    let size = match state.storage.head(&key).await {
        Ok(size) => size,
        Err(StorageError::NotFound { .. }) => return Ok(Err("nothing was uploaded".into())),
        Err(e) => return Err(HttpError::internal(e)),
    };
    if size != total {
        return Ok(Err(format!(
            "the object has {size} bytes, the layout needs {total} in {wire}"
        )));
    }
    let accepted = state
        .accepted_upload_key(section, epoch, hotkey)
        .map_err(HttpError::internal)?;
    state
        .storage
        .copy(&key, &accepted)
        .await
        .map_err(HttpError::internal)?;
    let reference = Reference::of(state, section)
        .await
        .map_err(HttpError::internal)?;
    // Read in chunks of whole int8 blocks or dct chunks (so consecutive chunks tile the
    // object's bytes and hash like the whole), so a large section is never held whole.
    // Decoding refuses non-finite values, bad scales, negative second moments and malformed
    // sparse chunks.
    let mut hasher = blake3::Hasher::new();
    let mut distance = DistanceSum::default();
    let mut start = 0u64;
    while start < n {
        let end = wire
            .aligned(start..(start + CHECK_CHUNK).min(n), n, span)
            .end;
        let bytes = wire.byte_range(start..end, n, span);
        let chunk = match state.storage.get_range(&accepted, bytes).await {
            Ok(chunk) => chunk,
            Err(StorageError::LengthMismatch { .. }) => {
                return Ok(Err("the upload changed while it was checked".into()));
            }
            Err(e) => return Err(HttpError::internal(e)),
        };
        hasher.update(&chunk);
        let against = reference
            .values(state, start..end)
            .await
            .map_err(HttpError::internal)?;
        // A dct upload is a change from the reference (the state its miner adopted).
        let base = wire.base_range(end - start, span.shifted(start));
        let base = &against[..(base.end - base.start) as usize];
        let values = match wire.decode_range(&chunk, start..end, n, span, base) {
            Ok(values) => values,
            Err(e) => {
                let index = e.index().unwrap_or(start);
                let within = index % layout.params_len.max(1);
                let name = layout
                    .tensors
                    .iter()
                    .rev()
                    .find(|t| t.offset <= within)
                    .map_or("?", |t| t.name.as_str());
                return Ok(Err(format!("{e} (tensor `{name}`)")));
            }
        };
        distance.add(start, &values, &against, layout.params_len);
        start = end;
    }
    let actual = hasher.finalize().to_hex().to_string();
    if !actual.eq_ignore_ascii_case(&manifest.hash) {
        return Ok(Err(format!(
            "hash mismatch: reported {}, the object hashes to {actual}",
            manifest.hash
        )));
    }
    Ok(Ok(distance.finish(hotkey)))
}

/// `GET /api/merge/status`: the phase and every section's merge, read in one hold of the
/// database connection ([`crate::orchestrator::repo::Repository::merge_status_rows`]).
pub async fn status(State(state): State<AppState>) -> Result<Json<MergeStatus>, HttpError> {
    let rows = state
        .repo
        .merge_status_rows(state.config.model.n_sections(), |info| match info.phase {
            // While training, show the merge that produced the current epoch.
            Phase::Training => info.epoch.checked_sub(1),
            _ => Some(info.epoch),
        })?;
    let mut sections = Vec::with_capacity(rows.sections.len());
    for (section, r) in rows.sections.into_iter().enumerate() {
        let mut s = SectionMergeStatus {
            section,
            uploads: r
                .uploads
                .iter()
                .filter(|u| u.state == UploadState::Accepted)
                .count(),
            partitions: 0,
            partitions_with_results: 0,
            results: 0,
            finalized: false,
            recomputed: 0,
            fallbacks: 0,
            flagged: r
                .flags
                .into_iter()
                .map(|(partition, hotkey, reason)| FlaggedMerger {
                    hotkey,
                    partition,
                    reason,
                })
                .collect(),
            checkpoint_hash: None,
            checkpoint_epoch: None,
        };
        if let Some(cp) = r.checkpoint {
            s.checkpoint_hash = Some(cp.hash);
            s.checkpoint_epoch = Some(cp.epoch);
        }
        if let (Some(e), Some(row)) = (rows.epoch, r.plan) {
            s.finalized = row.finalized;
            if row.len > 0 {
                let plan = build_plan(&state, e, section, &row).map_err(HttpError::internal)?;
                s.partitions = plan.partitions().len();
            }
            s.results = r.results.len();
            let mut with: Vec<usize> = r.results.iter().map(|x| x.partition).collect();
            with.dedup();
            s.partitions_with_results = with.len();
        }
        for (_, verdict) in &r.verdicts {
            if verdict.starts_with("recomputed") {
                s.recomputed += 1;
            } else if verdict.starts_with("fallback") {
                s.fallbacks += 1;
            }
        }
        sections.push(s);
    }
    Ok(Json(MergeStatus {
        phase: rows.phase.phase,
        epoch: rows.phase.epoch,
        phase_deadline_unix_ms: rows.phase.deadline_ms,
        op: state.config.merge.op,
        batches_before_merging: state.config.epoch_samples(rows.phase.epoch),
        sections,
        epochs: state.repo.epoch_summaries()?,
    }))
}
