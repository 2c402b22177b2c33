//! What a submitted result must satisfy before it is accepted: the tail's loss, and the
//! uploaded object's hash, size, shape, dtype and finiteness.

use crate::api::*;
use crate::codec::encoded_len;
use crate::orchestrator::http_error::HttpError;
use crate::orchestrator::repo_types::AssignmentRow;
use crate::orchestrator::state::AppState;
use crate::orchestrator::wire::output_of;
use crate::storage::{StorageError, decode_expecting, payload_hash};

/// Why an uploaded result is refused, if it is.
pub(super) async fn check_result(
    state: &AppState,
    row: &AssignmentRow,
    req: &SubmitRequest,
) -> Result<Option<String>, HttpError> {
    let is_tail_forward = row.kind == WorkKind::Forward && row.section == state.config.tail();
    if is_tail_forward {
        match req.loss {
            Some(loss) if loss.is_finite() => {}
            Some(loss) => return Ok(Some(format!("loss {loss} is not finite"))),
            None => return Ok(Some("the tail must report its loss".into())),
        }
    }
    let Some((key, shape)) = output_of(state, row) else {
        return Ok(None);
    };
    let Some(claimed) = &req.output_hash else {
        return Ok(Some("output_hash is missing".into()));
    };
    // Sized before it is read: an upload of any other size (an S3 presigned PUT carries no
    // size limit) is refused without reading it.
    let expected = encoded_len(&shape, state.config.wire) as u64;
    let bytes = match state.storage.get_exact(&key, expected).await {
        Ok(bytes) => bytes,
        Err(StorageError::NotFound { .. }) => {
            return Ok(Some(format!("no object was uploaded to {key}")));
        }
        Err(StorageError::LengthMismatch { got, .. }) => {
            return Ok(Some(format!(
                "size mismatch: the object is {got} bytes, a {shape:?} {} tensor is {expected}",
                state.config.wire
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
    match decode_expecting(&bytes, &shape) {
        Ok(t) if t.dtype != state.config.wire => Ok(Some(format!(
            "dtype {} but the run uses {}",
            t.dtype, state.config.wire
        ))),
        Ok(_) => Ok(None),
        Err(e) => Ok(Some(format!("bad payload: {e}"))),
    }
}
