//! Turning assignment rows into wire [`Assignment`]s: which objects each one reads and
//! writes, their shapes, and short-lived URLs for them.
//!
//! | work | input | targets | output |
//! |---|---|---|---|
//! | forward, head | `.../{sample}/tokens` ids `[b, s]` | – | `{sample}/0/forward/{id}` |
//! | forward, section k | `{sample}/{k-1}/forward/{from}` | – | `{sample}/{k}/forward/{id}` |
//! | forward, tail | `{sample}/{t-1}/forward/{from}` | `.../{sample}/targets` | `{sample}/{t}/backward/{id}` |
//! | backward, section k | `{sample}/{k+1}/backward/{from}` | – | `{sample}/{k}/backward/{id}` (none for the head) |
//! | eval | as forward | as forward (tail) | as forward; none at the tail (it reports the loss) |
//!
//! In a model whose later sections re-embed the token ids, every non-head forward and
//! evaluation also reads the sample's `.../{sample}/tokens`.
//!
//! `{id}` is the assignment (each attempt writes its own objects) and `{from}` the assignment
//! whose accepted result is the input. A miner uploads to `{id}/upload`; on submit the
//! orchestrator copies that to `{id}/accepted` (a key no URL was ever issued for), checks the
//! copy, and everyone downstream reads the copy, with the hash it was accepted with.

use std::time::Duration;

use super::http_error::HttpError;
use super::repo_types::AssignmentRow;
use super::state::AppState;
use crate::api::{Assignment, BlobRef, WorkKind};
use crate::codec::encoded_len;
use crate::storage::{AttemptCopy, Direction, ObjectKey, PresignMethod};

/// Extra validity of download URLs beyond the assignment's deadline. Upload URLs expire at the
/// deadline itself, so a late miner cannot overwrite the result of the miner the work was
/// re-offered to.
pub const URL_GRACE_MS: u64 = 60_000;

/// Where the input of `row` lives, with its shape: the sample's tokens for a head forward,
/// otherwise the accepted copy of the result it follows from (`row.input_from`).
pub fn input_of(state: &AppState, row: &AssignmentRow) -> (ObjectKey, Vec<usize>) {
    let c = &state.config;
    let (producer, direction) = match (row.kind, row.section) {
        (WorkKind::Forward | WorkKind::Eval, 0) => {
            return (
                state.token_key(row.epoch, row.sample, "tokens"),
                c.token_shape(),
            );
        }
        (WorkKind::Forward | WorkKind::Eval, s) => (s - 1, Direction::Forward),
        (WorkKind::Backward, s) => (s + 1, Direction::Backward),
    };
    let key = match row.input_from {
        Some(from) => state.keys.activation_attempt(
            row.epoch,
            row.sample,
            section_u32(producer),
            direction,
            from,
            AttemptCopy::Accepted,
        ),
        // A row written before attempts had their own keys.
        None => state
            .keys
            .activation(row.epoch, row.sample, section_u32(producer), direction),
    };
    (key, c.boundary_shape(row.sample))
}

/// The direction of the result `row` produces (`None`: nothing to upload).
fn output_direction(state: &AppState, row: &AssignmentRow) -> Option<Direction> {
    let tail = state.config.tail();
    match (row.kind, row.section) {
        (WorkKind::Backward, 0) => None,
        (WorkKind::Eval, s) if s == tail => None,
        (WorkKind::Eval, _) => Some(Direction::Forward),
        (WorkKind::Forward, 0) if tail == 0 => None,
        (WorkKind::Forward, s) if s == tail => Some(Direction::Backward),
        (WorkKind::Forward, _) => Some(Direction::Forward),
        (WorkKind::Backward, _) => Some(Direction::Backward),
    }
}

fn attempt_key(
    state: &AppState,
    row: &AssignmentRow,
    copy: AttemptCopy,
) -> Option<(ObjectKey, Vec<usize>)> {
    let direction = output_direction(state, row)?;
    Some((
        state.keys.activation_attempt(
            row.epoch,
            row.sample,
            section_u32(row.section),
            direction,
            row.id,
            copy,
        ),
        state.config.boundary_shape(row.sample),
    ))
}

/// Where the holder of `row` uploads its result, with its shape (`None`: nothing to upload).
/// Every attempt has its own key, so a stale URL of an earlier attempt cannot touch it.
pub fn upload_of(state: &AppState, row: &AssignmentRow) -> Option<(ObjectKey, Vec<usize>)> {
    attempt_key(state, row, AttemptCopy::Upload)
}

/// Where the accepted result of `row` lives, with its shape: the orchestrator's immutable
/// copy of the upload, made when it was checked (`None`: `row` produces nothing).
pub fn output_of(state: &AppState, row: &AssignmentRow) -> Option<(ObjectKey, Vec<usize>)> {
    attempt_key(state, row, AttemptCopy::Accepted)
}

fn section_u32(s: usize) -> u32 {
    u32::try_from(s).unwrap_or(u32::MAX)
}

/// A download URL for `key` valid until `exp_ms`: presigned by S3, or this server's own
/// `/blob` endpoint with a signed token.
///
/// # Errors
/// A storage error when presigning fails.
pub async fn get_url(state: &AppState, key: &ObjectKey, exp_ms: u64) -> Result<String, HttpError> {
    if let Some(url) = presigned(state, PresignMethod::Get, key, exp_ms).await? {
        return Ok(url);
    }
    let sig = state.secret.sign("GET", key.as_str(), exp_ms, None);
    Ok(format!(
        "{}/blob/{}?exp={exp_ms}&sig={sig}",
        state.config.public_url,
        key.as_str()
    ))
}

/// An upload URL for `key` valid until `exp_ms`, for a body of at most `max_bytes` bytes.
/// The `/blob` endpoint enforces the limit (it is part of the token); an S3 presigned PUT
/// cannot carry it (the signer leaves `content-length` out of the signature), so every object
/// is also sized with a HEAD before the orchestrator reads it.
///
/// # Errors
/// A storage error when presigning fails.
pub async fn put_url(
    state: &AppState,
    key: &ObjectKey,
    exp_ms: u64,
    max_bytes: u64,
) -> Result<String, HttpError> {
    if let Some(url) = presigned(state, PresignMethod::Put, key, exp_ms).await? {
        return Ok(url);
    }
    let sig = state
        .secret
        .sign("PUT", key.as_str(), exp_ms, Some(max_bytes));
    Ok(format!(
        "{}/blob/{}?exp={exp_ms}&max={max_bytes}&sig={sig}",
        state.config.public_url,
        key.as_str()
    ))
}

async fn presigned(
    state: &AppState,
    method: PresignMethod,
    key: &ObjectKey,
    exp_ms: u64,
) -> Result<Option<String>, HttpError> {
    let secs = exp_ms.saturating_sub(state.now_ms()).div_ceil(1000).max(1);
    Ok(state
        .storage
        .presign(method, key, Duration::from_secs(secs))
        .await?
        .map(|url| url.to_string()))
}

/// The sample's token ids that `row` reads beside its input, with their hash: a non-head
/// forward or evaluation in a model that re-embeds them.
pub fn tokens_of(state: &AppState, row: &AssignmentRow) -> Option<(ObjectKey, String)> {
    let reads = state.config.model.reembed
        && row.section > 0
        && matches!(row.kind, WorkKind::Forward | WorkKind::Eval);
    reads.then(|| {
        (
            state.token_key(row.epoch, row.sample, "tokens"),
            row.tokens_hash.clone(),
        )
    })
}

/// The wire form of `row`, with URLs for its input, targets and output.
///
/// # Errors
/// A storage error when presigning fails.
pub async fn to_wire(state: &AppState, row: &AssignmentRow) -> Result<Assignment, HttpError> {
    let deadline = row.deadline_ms.unwrap_or_else(|| state.now_ms());
    let exp = deadline.saturating_add(URL_GRACE_MS);
    let (input_key, input_shape) = input_of(state, row);
    let input = BlobRef {
        url: get_url(state, &input_key, exp).await?,
        hash: Some(row.input_hash.clone()),
        shape: Some(input_shape),
        expires_unix_ms: exp,
    };
    let targets = match &row.targets_hash {
        Some(hash) => {
            let key = state.token_key(row.epoch, row.sample, "targets");
            Some(BlobRef {
                url: get_url(state, &key, exp).await?,
                hash: Some(hash.clone()),
                shape: Some(state.config.token_shape()),
                expires_unix_ms: exp,
            })
        }
        None => None,
    };
    let tokens = match tokens_of(state, row) {
        Some((key, hash)) => Some(BlobRef {
            url: get_url(state, &key, exp).await?,
            hash: Some(hash),
            shape: Some(state.config.token_shape()),
            expires_unix_ms: exp,
        }),
        None => None,
    };
    let output = match upload_of(state, row) {
        Some((key, shape)) => Some(BlobRef {
            url: put_url(
                state,
                &key,
                deadline,
                encoded_len(&shape, state.config.wire) as u64,
            )
            .await?,
            hash: None,
            shape: Some(shape),
            expires_unix_ms: deadline,
        }),
        None => None,
    };
    Ok(Assignment {
        id: row.id,
        sample_id: row.sample,
        kind: row.kind,
        section: row.section,
        input,
        targets,
        tokens,
        output,
        deadline_unix_ms: deadline,
    })
}
