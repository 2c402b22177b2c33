//! What a submitted result must satisfy before it is accepted: the tail's loss, and the
//! uploaded object's hash, size, shape, dtype and finiteness.

use crate::api::*;
use crate::codec::encoded_len;
use crate::orchestrator::http_error::HttpError;
use crate::orchestrator::repo_types::AssignmentRow;
use crate::orchestrator::state::AppState;
use crate::orchestrator::wire::{output_of, upload_of};
use crate::storage::{ObjectKey, StorageError, decode_expecting, payload_hash};

/// What checking a submitted result decided.
#[derive(Debug)]
pub(super) enum Checked {
    /// Accept it; the accepted (immutable) copy of its output lives here, if it has one.
    Accept(Option<ObjectKey>),
    /// Refuse it, for this reason.
    Refuse(String),
}

/// Checks the result of `row`: the tail's loss, then the upload. The upload is sized first
/// (HEAD: an upload of the wrong size, which an S3 presigned PUT cannot prevent, is refused
/// unread), then copied to the attempt's `accepted` key, and that copy (which no URL can
/// overwrite) is what gets checked (hash, size, shape, dtype, finite values) and what
/// everyone downstream reads. A refused copy is deleted.
///
/// # Errors
/// A storage error other than a missing or mis-sized object.
pub(super) async fn check_result(
    state: &AppState,
    row: &AssignmentRow,
    req: &SubmitRequest,
) -> Result<Checked, HttpError> {
    let at_tail = row.section == state.config.tail();
    if at_tail && matches!(row.kind, WorkKind::Forward | WorkKind::Eval) {
        match req.loss {
            Some(loss) if loss.is_finite() => {}
            Some(loss) => return Ok(Checked::Refuse(format!("loss {loss} is not finite"))),
            None => return Ok(Checked::Refuse("the tail must report its loss".into())),
        }
    }
    let (Some((upload, shape)), Some((accepted, _))) =
        (upload_of(state, row), output_of(state, row))
    else {
        return Ok(Checked::Accept(None));
    };
    let Some(claimed) = &req.output_hash else {
        return Ok(Checked::Refuse("output_hash is missing".into()));
    };
    let expected = encoded_len(&shape, state.config.wire) as u64;
    let size = match state.storage.head(&upload).await {
        Ok(size) => size,
        Err(StorageError::NotFound { .. }) => {
            return Ok(Checked::Refuse(format!(
                "no object was uploaded to {upload}"
            )));
        }
        Err(e) => return Err(HttpError::internal(e)),
    };
    if size != expected {
        return Ok(Checked::Refuse(format!(
            "size mismatch: the object is {size} bytes, a {shape:?} {} tensor is {expected}",
            state.config.wire
        )));
    }
    match state.storage.copy(&upload, &accepted).await {
        // Everyone reads the accepted copy from now on; the upload stays in the store but
        // not in memory.
        Ok(()) => state.storage.forget_recent(&upload),
        Err(StorageError::NotFound { .. }) => {
            return Ok(Checked::Refuse(format!(
                "no object was uploaded to {upload}"
            )));
        }
        Err(e) => return Err(HttpError::internal(e)),
    }
    let reason = match check_copy(state, &accepted, &shape, expected, claimed, req).await {
        Ok(None) => return Ok(Checked::Accept(Some(accepted))),
        Ok(Some(reason)) => reason,
        Err(e) => {
            discard(state, &accepted).await;
            return Err(e);
        }
    };
    discard(state, &accepted).await;
    Ok(Checked::Refuse(reason))
}

/// Why the accepted copy at `key` is refused, if it is.
async fn check_copy(
    state: &AppState,
    key: &ObjectKey,
    shape: &[usize],
    expected: u64,
    claimed: &str,
    req: &SubmitRequest,
) -> Result<Option<String>, HttpError> {
    let bytes = match state.storage.get_exact(key, expected).await {
        Ok(bytes) => bytes,
        Err(StorageError::LengthMismatch { got, .. }) => {
            return Ok(Some(format!(
                "the upload changed while it was checked ({got} bytes, expected {expected})"
            )));
        }
        Err(e) => return Err(HttpError::internal(e)),
    };
    let actual = payload_hash(&bytes);
    if !actual.eq_ignore_ascii_case(claimed) {
        return Ok(Some(format!(
            "hash mismatch: reported {claimed}, uploaded object hashes to {actual}"
        )));
    }
    if let Some(n) = req.output_bytes
        && n != bytes.len() as u64
    {
        return Ok(Some(format!(
            "size mismatch: reported {n} bytes, uploaded {}",
            bytes.len()
        )));
    }
    match decode_expecting(&bytes, shape) {
        Ok(t) if t.dtype != state.config.wire => Ok(Some(format!(
            "dtype {} but the run uses {}",
            t.dtype, state.config.wire
        ))),
        Ok(_) => Ok(None),
        Err(e) => Ok(Some(format!("bad payload: {e}"))),
    }
}

/// Deletes a refused copy (best effort: a leftover is collected with its epoch).
async fn discard(state: &AppState, key: &ObjectKey) {
    if let Err(e) = state.storage.delete(key).await {
        tracing::warn!(key = %key, "deleting a refused copy: {e}");
    }
}
