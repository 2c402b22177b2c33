//! A miner's part in the butterfly merge: for each partition it was assigned, read that byte
//! range of every uploader's flat state, merge, upload the result and say what to submit.
//!
//! No burn here: flat buffers in the run's [`MergeWire`] format in, the same out. The pure
//! step ([`merge_encoded`]) is separate from the transfers so it can be tested on its own.
//! With the `dct` format every source and the result are changes from the previous global
//! state, which the merger holds (it adopted it): the sources are decoded against it, merged
//! as values, and the result is encoded against it again.

use std::ops::Range;

use bytes::Bytes;
use thiserror::Error;
use url::Url;

use crate::api::{MergeSubmitRequest, PartitionTask};
use crate::codec::{MergeWire, Span};
use crate::merge::{MergeError, MergeOp, merge_partition};
use crate::storage::{download_from_url, payload_hash, upload_to_url};

/// Why a partition could not be merged.
#[derive(Debug, Error)]
pub enum ParticipantError {
    /// A source could not be read.
    #[error("partition {partition}: reading {source_hotkey}'s upload: {reason}")]
    Download {
        /// Partition index.
        partition: usize,
        /// The uploader.
        source_hotkey: String,
        /// What went wrong.
        reason: String,
    },
    /// A source's range does not decode (wrong length, a bad scale, a non-finite value).
    #[error("partition {partition}: {source_hotkey}'s range: {reason}")]
    Undecodable {
        /// Partition index.
        partition: usize,
        /// The uploader.
        source_hotkey: String,
        /// What the decoder refused.
        reason: String,
    },
    /// The task itself is malformed (empty or inverted range, no sources).
    #[error("partition {partition}: {reason}")]
    BadTask {
        /// Partition index.
        partition: usize,
        /// What is wrong.
        reason: String,
    },
    /// The operator refused the inputs (a non-finite value names its source).
    #[error("partition {partition}: {source}")]
    Merge {
        /// Partition index.
        partition: usize,
        /// The operator's error.
        source: MergeError,
    },
    /// The merged values cannot be written in the merge's format (out of its range).
    #[error("partition {partition}: encoding the result: {reason}")]
    Encode {
        /// Partition index.
        partition: usize,
        /// What the encoder refused.
        reason: String,
    },
    /// The result could not be uploaded.
    #[error("partition {partition}: upload: {reason}")]
    Upload {
        /// Partition index.
        partition: usize,
        /// What went wrong.
        reason: String,
    },
}

/// The wire format of a merge: the element format and the section's parameter count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MergeFormat {
    /// Element format of sources and results.
    pub wire: MergeWire,
    /// The section's parameter count `P`.
    pub params_len: u64,
}

impl MergeFormat {
    /// Lossless `f32` (what a merge without the `wire` fields uses).
    pub fn f32() -> Self {
        Self {
            wire: MergeWire::F32,
            params_len: 0,
        }
    }
}

/// Decodes each source's range `start..start + len` (the bytes [`MergeWire::byte_range`] gave
/// for it, out of an upload of `total` values), merges with `op` (equal weights when every
/// weight is 0) and encodes the result as a merged partition whose first value sits at
/// `start`. `global` is the previous global state from flat index 0 (its parameters at least;
/// only read by a format with a base, `&[]` will do for the others).
///
/// # Errors
/// [`ParticipantError::Undecodable`] for a range that does not decode,
/// [`ParticipantError::Merge`] from the operator, [`ParticipantError::BadTask`] when `global`
/// is too short for the range.
#[allow(clippy::too_many_arguments)]
pub fn merge_encoded(
    partition: usize,
    op: MergeOp,
    format: MergeFormat,
    sources: &[(&str, &[u8])],
    weights: &[f32],
    range: Range<u64>,
    total: u64,
    global: &[f32],
) -> Result<Vec<u8>, ParticipantError> {
    let span = Span::whole(format.params_len);
    let n = range.end - range.start;
    let base = format
        .wire
        .base_of(global, n, span.shifted(range.start))
        .map_err(|e| ParticipantError::BadTask {
            partition,
            reason: format!("the previous global state: {e}"),
        })?;
    let mut values = Vec::with_capacity(sources.len());
    for (hotkey, bytes) in sources {
        let decoded = format
            .wire
            .decode_range(bytes, range.clone(), total, span, base)
            .map_err(|e| ParticipantError::Undecodable {
                partition,
                source_hotkey: (*hotkey).to_string(),
                reason: e.to_string(),
            })?;
        values.push(decoded);
    }
    let equal;
    let weights = if weights.iter().all(|w| *w == 0.0) {
        equal = vec![1.0; weights.len()];
        &equal
    } else {
        weights
    };
    let slices: Vec<&[f32]> = values.iter().map(Vec::as_slice).collect();
    let merged = merge_partition(op, &slices, weights)
        .map_err(|source| ParticipantError::Merge { partition, source })?;
    format
        .wire
        .encode(
            &merged,
            Span::partition(range.start, format.params_len),
            base,
        )
        .map_err(|e| ParticipantError::Encode {
            partition,
            reason: e.to_string(),
        })
}

/// An upload the merger made itself and still holds: a source whose verified hash is `hash`
/// is this very object, so its range is read from `bytes` instead of downloaded.
#[derive(Debug, Clone, Copy)]
pub struct HeldUpload<'a> {
    /// BLAKE3 hex of `bytes`, as submitted in the upload's manifest.
    pub hash: &'a str,
    /// The uploaded object.
    pub bytes: &'a Bytes,
}

/// A merged partition, uploaded: what to submit, and the bytes themselves (which a miner
/// that merged every partition of its section can assemble the checkpoint from).
#[derive(Debug, Clone)]
pub struct MergedPartition {
    /// The request to submit.
    pub submit: MergeSubmitRequest,
    /// The uploaded result (`task.output`'s content).
    pub bytes: Bytes,
}

/// Does one partition: reads its range of every source (downloaded concurrently, or sliced
/// from `held` where a source is the merger's own upload), merges, uploads the result to
/// `task.output`, and returns the request to submit with the bytes. `global` as for
/// [`merge_encoded`].
///
/// # Errors
/// [`ParticipantError`] naming the partition and, where relevant, the source.
pub async fn merge_partition_task(
    epoch: u64,
    op: MergeOp,
    format: MergeFormat,
    task: &PartitionTask,
    global: &[f32],
    held: Option<HeldUpload<'_>>,
) -> Result<MergedPartition, ParticipantError> {
    let partition = task.index;
    let bad = |reason: &str| ParticipantError::BadTask {
        partition,
        reason: reason.to_string(),
    };
    if task.end <= task.start {
        return Err(bad("empty or inverted range"));
    }
    if task.sources.is_empty() {
        return Err(bad("no sources"));
    }
    // Every party knows the section's flat length: 3P values.
    let total = if format.params_len > 0 {
        format.params_len.saturating_mul(3)
    } else {
        task.end
    };
    if task.end > total {
        return Err(bad("range beyond the flat state"));
    }
    let elems = task.start..task.end;
    let bytes: Range<u64> =
        format
            .wire
            .byte_range(elems.clone(), total, Span::whole(format.params_len));
    let reads = task.sources.iter().map(|source| {
        let failed = |reason: String| ParticipantError::Download {
            partition,
            source_hotkey: source.hotkey.clone(),
            reason,
        };
        let own = held.filter(|h| {
            source
                .blob
                .hash
                .as_deref()
                .is_some_and(|want| want.eq_ignore_ascii_case(h.hash))
        });
        let range = bytes.clone();
        async move {
            if let Some(own) = own {
                // Same hash, same content: the range as the download would have returned it.
                let (start, end) = (range.start as usize, range.end as usize);
                if end > own.bytes.len() || start > end {
                    return Err(failed(format!(
                        "bytes {start}..{end} of an upload of {} bytes",
                        own.bytes.len()
                    )));
                }
                return Ok(own.bytes.slice(start..end));
            }
            let url = Url::parse(&source.blob.url).map_err(|e| failed(e.to_string()))?;
            download_from_url(&url, Some(range))
                .await
                .map_err(|e| failed(e.to_string()))
        }
    });
    let downloaded = futures::future::try_join_all(reads).await?;
    let sources: Vec<(&str, &[u8])> = task
        .sources
        .iter()
        .zip(&downloaded)
        .map(|(s, d)| (s.hotkey.as_str(), d.as_ref()))
        .collect();
    let weights: Vec<f32> = task.sources.iter().map(|s| s.weight).collect();
    let merged = merge_encoded(
        partition, op, format, &sources, &weights, elems, total, global,
    )?;
    let hash = payload_hash(&merged);
    let size = merged.len() as u64;
    let url = Url::parse(&task.output.url).map_err(|e| ParticipantError::Upload {
        partition,
        reason: e.to_string(),
    })?;
    let merged = Bytes::from(merged);
    upload_to_url(&url, merged.clone())
        .await
        .map_err(|e| ParticipantError::Upload {
            partition,
            reason: e.to_string(),
        })?;
    Ok(MergedPartition {
        submit: MergeSubmitRequest::Partition {
            epoch,
            index: partition,
            hash,
            bytes: size,
        },
        bytes: merged,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le(v: &[f32]) -> Vec<u8> {
        MergeWire::F32.encode(v, Span::default(), &[]).unwrap()
    }

    fn merge(op: MergeOp, sources: &[(&str, &[u8])], weights: &[f32]) -> Vec<f32> {
        let out = merge_encoded(0, op, MergeFormat::f32(), sources, weights, 0..2, 2, &[]).unwrap();
        MergeWire::F32
            .decode(&out, 2, Span::default(), &[])
            .unwrap()
    }

    #[test]
    fn merges_encoded_ranges_as_hand_computed() {
        let (a, b) = (le(&[1.0, 2.0]), le(&[3.0, 6.0]));
        // (1*1 + 3*3)/4 = 2.5, (2*1 + 6*3)/4 = 5
        assert_eq!(
            merge(MergeOp::Mean, &[("a", &a), ("b", &b)], &[1.0, 3.0]),
            [2.5, 5.0]
        );
        assert_eq!(
            merge(MergeOp::Mean, &[("a", &a), ("b", &b)], &[0.0, 0.0]),
            [2.0, 4.0]
        );
        let c = le(&[5.0, -1.0]);
        let sources = [("a", a.as_slice()), ("b", &b), ("c", &c)];
        assert_eq!(merge(MergeOp::Median, &sources, &[1.0; 3]), [3.0, 2.0]);
    }

    #[test]
    fn short_and_non_finite_sources_are_named() {
        let f = MergeFormat::f32();
        let a = le(&[1.0, 2.0]);
        let short = le(&[1.0]);
        let err = merge_encoded(
            3,
            MergeOp::Mean,
            f,
            &[("a", &a), ("b", &short)],
            &[1.0; 2],
            0..2,
            2,
            &[],
        )
        .unwrap_err();
        assert!(
            matches!(&err, ParticipantError::Undecodable { partition: 3, source_hotkey, .. } if source_hotkey == "b"),
            "{err}"
        );
        let mut nan = le(&[0.0, 0.0]);
        nan[..4].copy_from_slice(&f32::NAN.to_le_bytes());
        let err = merge_encoded(
            1,
            MergeOp::Mean,
            f,
            &[("a", &a), ("b", &nan)],
            &[1.0; 2],
            0..2,
            2,
            &[],
        )
        .unwrap_err();
        assert!(
            matches!(&err, ParticipantError::Undecodable { partition: 1, source_hotkey, .. } if source_hotkey == "b"),
            "{err}"
        );
    }

    /// Two uploads of a 600-parameter state in int8 and in dct; a partition in the middle
    /// (crossing blocks/chunks and the parameter/moment boundary) merges to what the decoded
    /// f32 values merge to, written back in the format as a partition from its own start (for
    /// dct: against the previous global state the merger holds).
    #[test]
    fn compressed_partitions_merge_the_decoded_values() {
        let p = 600u64;
        let n = 3 * p;
        let span = Span::whole(p);
        let state = |k: f32| -> Vec<f32> {
            (0..n)
                .map(|i| {
                    let x = ((i as f32 + k) * 0.37).sin();
                    if i >= 2 * p { x * x * 1e-6 } else { x * 0.05 }
                })
                .collect()
        };
        let global: Vec<f32> = state(0.7)[..p as usize].to_vec();
        for wire in [MergeWire::Int8, "dct:64:4".parse().unwrap()] {
            let (a, b) = (state(0.0), state(1.5));
            let g = wire.base_of(&global, n, span).unwrap();
            let (ea, eb) = (
                wire.encode(&a, span, g).unwrap(),
                wire.encode(&b, span, g).unwrap(),
            );
            let range = 500..1300u64;
            let br = wire.byte_range(range.clone(), n, span);
            let slice = |e: &Vec<u8>| e[br.start as usize..br.end as usize].to_vec();
            let (sa, sb) = (slice(&ea), slice(&eb));
            let format = MergeFormat {
                wire,
                params_len: p,
            };
            let sources = [("a", sa.as_slice()), ("b", sb.as_slice())];
            let out = merge_encoded(
                0,
                MergeOp::Mean,
                format,
                &sources,
                &[1.0, 1.0],
                range.clone(),
                n,
                &global,
            )
            .unwrap();
            let part = Span::partition(500, p);
            assert_eq!(out.len() as u64, wire.encoded_len(800, part), "{wire}");
            let pg = wire.base_of(&global, 800, part).unwrap();
            let got = wire.decode(&out, 800, part, pg).unwrap();
            let da = wire.decode(&ea, n, span, g).unwrap();
            let db = wire.decode(&eb, n, span, g).unwrap();
            let r = 500..1300usize;
            let mean =
                merge_partition(MergeOp::Mean, &[&da[r.clone()], &db[r]], &[1.0, 1.0]).unwrap();
            assert_eq!(got, wire.round_trip(&mean, part, pg).unwrap(), "{wire}");
        }
        // Without the previous global state a dct partition cannot be merged.
        let wire: MergeWire = "dct".parse().unwrap();
        let format = MergeFormat {
            wire,
            params_len: p,
        };
        let err = merge_encoded(4, MergeOp::Mean, format, &[], &[], 500..1300, n, &[]).unwrap_err();
        assert!(
            matches!(err, ParticipantError::BadTask { partition: 4, .. }),
            "{err}"
        );
    }
}
