//! Handlers of the validator endpoints and the metagraph (see [`crate::api::validator`]).
//!
//! Validators read the ledger and objects through these (URLs, never keys) and publish their
//! weight vectors; everything but `GET /api/weights` is signed by a hotkey the run config
//! lists under `validators`.

use super::flag_quorum::agreed_flags;
use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;

use super::auth::SignedValidator;
use super::http_error::HttpError;
use super::metagraph::{Vote, check_submission, combine, distances};
use super::repo::{CheckpointRow, PublishedRow, UploadState};
use super::state::AppState;
use super::wire::{get_url, input_of, output_of, tokens_of};
use crate::api::*;
use crate::model::layout::section_layout;
use crate::storage::StatePart;

/// Validity of the URLs handed to validators (they may replay long after the epoch).
const VALIDATOR_URL_MS: u64 = 3_600_000;

fn url_expiry(state: &AppState) -> u64 {
    state.now_ms().saturating_add(VALIDATOR_URL_MS)
}

/// A GET [`BlobRef`] for `key`, valid for an hour.
async fn get_ref(
    state: &AppState,
    key: &crate::storage::ObjectKey,
    hash: Option<String>,
    shape: Option<Vec<usize>>,
) -> Result<BlobRef, HttpError> {
    let exp = url_expiry(state);
    Ok(BlobRef {
        url: get_url(state, key, exp).await?,
        hash,
        shape,
        expires_unix_ms: exp,
    })
}

/// The downloadable form of a section checkpoint.
///
/// # Errors
/// A presigning error.
pub async fn checkpoint_ref(
    state: &AppState,
    cp: &CheckpointRow,
) -> Result<SectionCheckpoint, HttpError> {
    let key = state.checkpoint_key(cp.section, cp.epoch, StatePart::Flat);
    Ok(SectionCheckpoint {
        section: cp.section,
        epoch: cp.epoch,
        layout: section_layout(&state.config.model, cp.section).map_err(HttpError::internal)?,
        blob: get_ref(state, &key, Some(cp.hash.clone()), None).await?,
        optimizer_step: cp.optimizer_step,
        delta: None,
    })
}

/// `POST /api/validator/register`.
pub async fn register(
    State(state): State<AppState>,
    req: SignedValidator<ValidatorRegisterRequest>,
) -> Result<Json<ValidatorRegisterResponse>, HttpError> {
    let c = &state.config;
    let info = state.repo.phase_info()?;
    let stake = state.validator(&req.hotkey).map_or(0.0, |v| v.stake);
    tracing::info!(hotkey = %req.hotkey, device = %req.body.device, "validator registered");
    Ok(Json(ValidatorRegisterResponse {
        hotkey: req.hotkey,
        run: c.run.clone(),
        epoch: info.epoch,
        phase: info.phase,
        model: c.model.clone(),
        settings: c.miner_settings(c.max_in_flight),
        validation: c.validation,
        stake,
        chain: match state.subnet() {
            Some(subnet) => Some(subnet.run_chain()),
            None => c.chain.as_ref().map(|chain| chain.run_chain(None)),
        },
    }))
}

/// `POST /api/validator/ledger`.
pub async fn ledger(
    State(state): State<AppState>,
    req: SignedValidator<LedgerRequest>,
) -> Result<Json<EpochLedger>, HttpError> {
    let epoch = req.body.epoch;
    let n_sections = state.config.model.n_sections();
    let info = state.repo.phase_info()?;
    if epoch > info.epoch {
        return Err(HttpError::bad_request(format!(
            "epoch {epoch} has not started (the run is in epoch {})",
            info.epoch
        )));
    }
    let samples = state.repo.epoch_samples(epoch, n_sections)?;
    let mut miners: BTreeMap<String, MinerRecord> = BTreeMap::new();
    for (hotkey, c) in state.repo.epoch_work_counts(epoch)? {
        miners.insert(
            hotkey.clone(),
            MinerRecord {
                hotkey,
                section: c.section,
                completed_work: c.completed_work,
                completed_forwards: c.completed_forwards,
                accepted: c.accepted,
                missed_deadlines: c.missed,
                refused_results: c.refused,
                upload: None,
                merge_flags: Vec::new(),
            },
        );
    }
    for section in 0..n_sections {
        for u in state.repo.uploads_of(epoch, section)? {
            let accepted_unix_ms = state.repo.upload_time(epoch, &u.miner)?;
            let record = miners
                .entry(u.miner.clone())
                .or_insert_with(|| MinerRecord {
                    hotkey: u.miner.clone(),
                    section,
                    completed_work: 0,
                    completed_forwards: 0,
                    accepted: 0,
                    missed_deadlines: 0,
                    refused_results: 0,
                    upload: None,
                    merge_flags: Vec::new(),
                });
            record.upload = Some(UploadRecord {
                state: u.state.as_str().to_string(),
                reason: u.reason.clone(),
                accepted_unix_ms,
            });
        }
        for (partition, merger, reason) in state.repo.flags(epoch, section)? {
            if let Some(record) = miners.get_mut(&merger) {
                record.merge_flags.push(FlaggedMerger {
                    hotkey: merger,
                    partition,
                    reason,
                });
            }
        }
    }
    let merged = epoch < info.epoch;
    Ok(Json(EpochLedger {
        epoch,
        merged,
        samples,
        miners: miners.into_values().collect(),
    }))
}

/// `POST /api/validator/work`.
pub async fn work(
    State(state): State<AppState>,
    req: SignedValidator<MinerWorkRequest>,
) -> Result<Json<MinerWork>, HttpError> {
    let MinerWorkRequest { epoch, miner } = req.body;
    let row = state
        .repo
        .miner(&miner)?
        .ok_or_else(|| HttpError::not_found(format!("{miner} is not a registered miner")))?;
    let tail = state.config.tail();
    let mut items = Vec::new();
    for id in state.repo.accepted_in_order(epoch, &miner)? {
        let a = state.repo.assignment(id, tail)?;
        let detail = state.repo.accepted_detail(id, a.kind, tail)?;
        let (input_key, input_shape) = input_of(&state, &a);
        let input = get_ref(
            &state,
            &input_key,
            Some(a.input_hash.clone()),
            Some(input_shape),
        )
        .await?;
        let targets = match &a.targets_hash {
            Some(hash) => {
                let key = state.token_key(a.epoch, a.sample, "targets");
                Some(
                    get_ref(
                        &state,
                        &key,
                        Some(hash.clone()),
                        Some(state.config.token_shape()),
                    )
                    .await?,
                )
            }
            None => None,
        };
        let tokens = match tokens_of(&state, &a) {
            Some((key, hash)) => {
                Some(get_ref(&state, &key, Some(hash), Some(state.config.token_shape())).await?)
            }
            None => None,
        };
        let output = match output_of(&state, &a) {
            Some((key, shape)) => {
                Some(get_ref(&state, &key, detail.output_hash, Some(shape)).await?)
            }
            None => None,
        };
        items.push(WorkItem {
            assignment: a.id,
            sample: a.sample,
            kind: a.kind,
            input,
            targets,
            tokens,
            output,
            loss: detail.loss,
            accepted_unix_ms: detail.accepted_ms,
        });
    }
    let start = match state.repo.start_checkpoint(row.section, epoch)? {
        Some(cp) => Some(checkpoint_ref(&state, &cp).await?),
        None => None,
    };
    let upload = match state.repo.upload(epoch, &miner)? {
        Some(u) if u.state == UploadState::Accepted => {
            let key = state
                .accepted_upload_key(row.section, epoch, &miner)
                .map_err(HttpError::internal)?;
            Some(get_ref(&state, &key, u.hash, None).await?)
        }
        _ => None,
    };
    Ok(Json(MinerWork {
        epoch,
        miner,
        section: row.section,
        start,
        items,
        upload,
        wire: state.config.merge.wire,
    }))
}

/// `POST /api/validator/merge`.
pub async fn merge_record(
    State(state): State<AppState>,
    req: SignedValidator<MergeRecordRequest>,
) -> Result<Json<MergeRecord>, HttpError> {
    let MergeRecordRequest { epoch, section } = req.body;
    if section >= state.config.model.n_sections() {
        return Err(HttpError::bad_request(format!("no section {section}")));
    }
    let plan = state.repo.plan(epoch, section)?;
    let mut uploads = Vec::new();
    for u in state.repo.uploads_of(epoch, section)? {
        if u.state != UploadState::Accepted {
            continue;
        }
        let weight = plan
            .as_ref()
            .and_then(|p| {
                let i = p.uploaders.iter().position(|h| *h == u.miner)?;
                p.weights.get(i).copied()
            })
            .unwrap_or(u.weight);
        let key = state
            .accepted_upload_key(section, epoch, &u.miner)
            .map_err(HttpError::internal)?;
        uploads.push(UploadSource {
            hotkey: u.miner.clone(),
            weight,
            blob: get_ref(&state, &key, u.hash.clone(), None).await?,
            accepted_unix_ms: state.repo.upload_time(epoch, &u.miner)?,
        });
    }
    let mut results = Vec::new();
    for r in state.repo.results(epoch, section)? {
        let key = state
            .partition_key(section, epoch, r.partition, &r.merger)
            .map_err(HttpError::internal)?;
        results.push(PartitionCopy {
            partition: r.partition,
            merger: r.merger.clone(),
            blob: get_ref(&state, &key, Some(r.hash.clone()), None).await?,
        });
    }
    let start = match state.repo.start_checkpoint(section, epoch)? {
        Some(cp) => Some(checkpoint_ref(&state, &cp).await?),
        None => None,
    };
    let merged = match state.repo.start_checkpoint(section, epoch + 1)? {
        Some(cp) if cp.epoch == epoch + 1 => Some(checkpoint_ref(&state, &cp).await?),
        _ => None,
    };
    let layout = section_layout(&state.config.model, section).map_err(HttpError::internal)?;
    Ok(Json(MergeRecord {
        epoch,
        section,
        op: state.config.merge.op,
        tolerance: state.config.merge.tolerance,
        start,
        uploads,
        partitions: plan.as_ref().map_or(0, |p| p.partitions),
        replication: plan.as_ref().map_or(0, |p| p.replication),
        len: plan.as_ref().map_or(layout.total_len(), |p| p.len),
        results,
        merged,
        wire: state.config.merge.wire,
    }))
}

/// `POST /api/validator/samples`.
pub async fn samples(
    State(state): State<AppState>,
    req: SignedValidator<SamplesRequest>,
) -> Result<Json<SampleBlobs>, HttpError> {
    let SamplesRequest { epoch, samples } = req.body;
    if samples.len() > MAX_SAMPLES_PER_REQUEST {
        return Err(HttpError::bad_request(format!(
            "at most {MAX_SAMPLES_PER_REQUEST} samples per request, got {}",
            samples.len()
        )));
    }
    let shape = Some(state.config.token_shape());
    let mut out = Vec::new();
    for sample in samples {
        let Some((tokens, targets)) = state.repo.sample_hashes(sample, epoch)? else {
            continue;
        };
        out.push(SampleBlob {
            sample,
            tokens: get_ref(
                &state,
                &state.token_key(epoch, sample, "tokens"),
                Some(tokens),
                shape.clone(),
            )
            .await?,
            targets: get_ref(
                &state,
                &state.token_key(epoch, sample, "targets"),
                Some(targets),
                shape.clone(),
            )
            .await?,
        });
    }
    Ok(Json(SampleBlobs { samples: out }))
}

/// `POST /api/weights`: stores a validator's signed vector for a finished epoch.
pub async fn publish(
    State(state): State<AppState>,
    req: SignedValidator<WeightSubmission>,
) -> Result<Json<SubmitResponse>, HttpError> {
    let info = state.repo.phase_info()?;
    let refused = |reason: String| {
        tracing::warn!(validator = %req.hotkey, %reason, "weights refused");
        Ok(Json(SubmitResponse {
            accepted: false,
            reason: Some(reason),
        }))
    };
    if req.body.epoch >= info.epoch {
        return refused(format!(
            "epoch {} is not finished (the run is in epoch {})",
            req.body.epoch, info.epoch
        ));
    }
    let miners = state.repo.miners()?;
    let is_miner = |h: &str| miners.iter().any(|m| m.hotkey == h);
    if let Some(reason) = check_submission(&req.body, state.config.validation.burn, is_miner) {
        return refused(reason);
    }
    let body = String::from_utf8(req.raw.to_vec())
        .map_err(|_| HttpError::bad_request("the body is not UTF-8"))?;
    state.repo.save_weights(&PublishedRow {
        validator: req.hotkey.clone(),
        epoch: req.body.epoch,
        received_ms: state.now_ms(),
        body,
        signature: req.signature.0.clone(),
        signed_ms: req.signature.1,
    })?;
    tracing::info!(validator = %req.hotkey, epoch = req.body.epoch, "weights published");
    act_on_flags(&state, req.body.epoch)?;
    Ok(Json(SubmitResponse {
        accepted: true,
        reason: None,
    }))
}

/// Counts a flagged window for every miner the validators that published `epoch` agree to
/// flag ([`super::flag_quorum`]), excluding repeat offenders from routing.
fn act_on_flags(state: &AppState, epoch: u64) -> Result<(), HttpError> {
    let v = &state.config.validation;
    let published: Vec<(String, WeightSubmission)> = state
        .repo
        .weights_of_epoch(epoch)?
        .into_iter()
        .filter_map(|row| Some((row.validator, serde_json::from_str(&row.body).ok()?)))
        .collect();
    let exclusion_ms = state.config.penalties.exclusion_s.saturating_mul(1000);
    for flag in agreed_flags(&state.validators(), v.combine, v.flag_quorum, &published) {
        let reason = flag.reason(epoch);
        let excluded = state.repo.flag_window(
            &flag.miner,
            epoch,
            &reason,
            v.exclude_after_flags,
            exclusion_ms,
            state.now_ms(),
        )?;
        if excluded {
            tracing::warn!(miner = %flag.miner, epoch, %reason, "excluded for validator flags");
        }
    }
    Ok(())
}

/// `GET /api/weights`.
pub async fn weights(State(state): State<AppState>) -> Result<Json<MetagraphView>, HttpError> {
    Ok(Json(build_metagraph(&state)?))
}

/// The metagraph document: every validator's latest vector, their combination and distances.
///
/// # Errors
/// A state-store error; a stored body that no longer parses is a 500.
pub fn build_metagraph(state: &AppState) -> Result<MetagraphView, HttpError> {
    let c = &state.config;
    let mut validators = Vec::new();
    let mut votes = Vec::new();
    for row in state.repo.latest_weights()? {
        let sub: WeightSubmission = serde_json::from_str(&row.body).map_err(HttpError::internal)?;
        let stake = state.validator(&row.validator).map_or(0.0, |v| v.stake);
        votes.push(Vote {
            stake,
            weights: sub
                .weights
                .iter()
                .map(|w| (w.hotkey.clone(), w.weight))
                .collect(),
            burn: sub.burn,
        });
        validators.push(ValidatorWeights {
            hotkey: row.validator,
            stake,
            epoch: row.epoch,
            received_unix_ms: row.received_ms,
            burn: sub.burn,
            weights: sub.weights,
            distance: None,
            dissent: false,
            signed_body: row.body,
            signature: row.signature,
            signed_unix_ms: row.signed_ms,
        });
    }
    for (v, d) in validators
        .iter_mut()
        .zip(distances(&votes, c.validation.combine))
    {
        v.distance = d;
        v.dissent = d.is_some_and(|d| d > c.validation.dissent_l1);
    }
    let refs: Vec<&Vote> = votes.iter().collect();
    let combined = combine(&refs, c.validation.combine);
    Ok(MetagraphView {
        run: c.run.clone(),
        combine: c.validation.combine,
        combined: combined.weights.into_iter().collect(),
        combined_burn: combined.burn,
        validators,
    })
}
