//! The miner's transfers, run beside its compute. An assignment's inputs are fetched (and
//! decoded) as soon as the assignment arrives, while the ones before it compute; its result
//! is encoded, uploaded and submitted while the ones after it compute. Each transfer is a task
//! on the runtime's I/O thread, and the engine runs on the miner's main thread, so the two
//! overlap; the main loop only waits where a transfer is not done when it is needed.

use std::time::Instant;

use bytes::Bytes;
use tokio::sync::oneshot;
use url::Url;

use super::{MinerError, elapsed_ms};
use crate::api::client::{ApiClient, ClientError};
use crate::api::{Assignment, BlobRef, SubmitRequest, SubmitResponse, WorkKind};
use crate::codec::WireDtype;
use crate::compute::cache::CachedInput;
use crate::compute::engine::Activations;
use crate::compute::payload::{self, PayloadError};
use crate::model::ModelError;
use crate::storage::{encode, payload_hash, upload_to_url};

/// An assignment's inputs, downloaded, hash-checked and decoded.
pub(super) enum Inputs {
    /// A forward's input and, at the tail, its targets (`[batch, seq]` token ids).
    Forward {
        /// Tokens at the head, hidden states elsewhere.
        input: CachedInput,
        /// The tail's targets.
        targets: Option<(Vec<u32>, [usize; 2])>,
    },
    /// An evaluation forward's input and, at the tail, its targets (as for a forward).
    Eval {
        /// Tokens at the head, hidden states elsewhere.
        input: CachedInput,
        /// The tail's targets (`None` elsewhere, or when the assignment carries none).
        targets: Option<(Vec<u32>, [usize; 2])>,
    },
    /// A backward's upstream gradient.
    Backward(Activations),
}

/// What [`fetch`] brings back: the inputs and how long fetching them took.
pub(super) struct Fetched {
    /// The inputs.
    pub inputs: Inputs,
    /// Download, hash check and decoding, in milliseconds.
    pub download_ms: u64,
}

/// Downloads what `a` needs: a forward's input (tokens at the head) and, at the tail, its
/// targets, both at once; a backward's upstream gradient.
pub(super) async fn fetch(a: Assignment, head: bool, tail: bool) -> Result<Fetched, MinerError> {
    let t0 = Instant::now();
    let inputs = match a.kind {
        WorkKind::Forward | WorkKind::Eval => {
            let eval = a.kind == WorkKind::Eval;
            let targets = async {
                let blob = match (tail, a.targets.as_ref()) {
                    (false, _) => return Ok(None),
                    (true, Some(blob)) => blob,
                    // An evaluation without targets is refused where it is computed.
                    (true, None) if eval => return Ok(None),
                    (true, None) => {
                        return Err(MinerError::Malformed {
                            id: a.id,
                            reason: "tail forward without targets".into(),
                        });
                    }
                };
                Ok::<_, MinerError>(Some(payload::fetch_ids(blob).await?))
            };
            let (input, targets) =
                tokio::try_join!(fetch_input(&a.input, a.tokens.as_ref(), head), targets)?;
            if eval {
                Inputs::Eval { input, targets }
            } else {
                Inputs::Forward { input, targets }
            }
        }
        WorkKind::Backward => {
            let shape = payload::shape_of::<3>(&a.input)?;
            let data = payload::decode_tensor(&payload::fetch(&a.input).await?, shape)?;
            Inputs::Backward(Activations { data, shape })
        }
    };
    Ok(Fetched {
        inputs,
        download_ms: elapsed_ms(t0),
    })
}

/// A forward's input: token ids at the head, activations elsewhere, with the sample's token
/// ids beside them where the assignment gives them (a section that re-embeds them).
async fn fetch_input(
    blob: &BlobRef,
    tokens: Option<&BlobRef>,
    head: bool,
) -> Result<CachedInput, MinerError> {
    if head {
        let (ids, shape) = payload::fetch_ids(blob).await?;
        return Ok(CachedInput::Tokens { ids, shape });
    }
    let shape = payload::shape_of::<3>(blob)?;
    let ids = async {
        match tokens {
            Some(t) => Ok(Some(payload::fetch_tokens(t, [shape[0], shape[1]]).await?)),
            None => Ok::<_, PayloadError>(None),
        }
    };
    let (bytes, tokens) = tokio::try_join!(payload::fetch(blob), ids)?;
    let data = payload::decode_tensor(&bytes, shape)?;
    Ok(CachedInput::Hidden {
        data,
        shape,
        tokens,
    })
}

/// What became of a result handed to [`deliver`].
pub(super) struct Delivered {
    /// The assignment it answers.
    pub assignment: Assignment,
    /// The orchestrator's answer, or why there is none.
    pub outcome: Outcome,
}

/// How a delivery ended.
pub(super) enum Outcome {
    /// The result could not be encoded or uploaded: the assignment should be handed back.
    NotUploaded(MinerError),
    /// The submit was answered (accepted or refused with a reason).
    Answered(SubmitResponse),
    /// The upload went through but the submit failed.
    SubmitFailed(ClientError),
}

/// The order of a miner's submits. Validators replay a miner's work in the order the
/// orchestrator accepted it, so results must be submitted in the order they were computed,
/// even though their uploads run at once: each delivery submits only after the one before
/// it has (or has given up), and lets the next one go when it is done.
pub(super) struct SubmitTurn {
    /// Resolves when the previous delivery is done (`None`: the first one).
    pub after: Option<oneshot::Receiver<()>>,
    /// Dropped when this delivery is done, which lets the next one submit.
    pub done: oneshot::Sender<()>,
}

/// Encodes `out` in `wire`, uploads it to the assignment's output URL, then, on its `turn`,
/// submits `submit` completed with the output's hash, size and upload time. Nothing to upload
/// (the head's backward) submits without an output.
pub(super) async fn deliver(
    client: ApiClient,
    assignment: Assignment,
    out: Option<Activations>,
    wire: WireDtype,
    mut submit: SubmitRequest,
    turn: SubmitTurn,
) -> Delivered {
    let SubmitTurn { after, done } = turn;
    match upload(&assignment, out, wire).await {
        Ok((hash, size, upload_ms)) => {
            submit.output_hash = hash;
            submit.output_bytes = size;
            submit.timings.upload_ms = upload_ms;
        }
        Err(e) => {
            return Delivered {
                assignment,
                outcome: Outcome::NotUploaded(e),
            };
        }
    }
    if let Some(after) = after {
        // An error only means the previous delivery ended without saying so (a panic).
        let _ = after.await;
    }
    let outcome = match client.submit(&submit).await {
        Ok(resp) => Outcome::Answered(resp),
        Err(e) => Outcome::SubmitFailed(e),
    };
    drop(done);
    Delivered {
        assignment,
        outcome,
    }
}

/// Encodes `out` and uploads it to the assignment's output URL; returns hash, size and time
/// taken. Nothing to upload gives `None`s.
async fn upload(
    a: &Assignment,
    out: Option<Activations>,
    wire: WireDtype,
) -> Result<(Option<String>, Option<u64>, u64), MinerError> {
    let (Some(out), Some(target)) = (out, a.output.as_ref()) else {
        return Ok((None, None, 0));
    };
    let t0 = Instant::now();
    let bytes = encode(&out.shape, &out.data, wire).map_err(ModelError::from)?;
    let hash = payload_hash(&bytes);
    let size = bytes.len() as u64;
    let url = Url::parse(&target.url).map_err(|e| PayloadError::BadUrl(e.to_string()))?;
    upload_to_url(&url, Bytes::from(bytes)).await?;
    Ok((Some(hash), Some(size), elapsed_ms(t0)))
}
