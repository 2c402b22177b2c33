//! A miner's part in the butterfly merge: for each partition it was assigned, read that byte
//! range of every uploader's flat state, merge, upload the result and say what to submit.
//!
//! No burn here: flat little-endian `f32` buffers in, the same out. The pure step
//! ([`merge_encoded`]) is separate from the transfers so it can be tested on its own.

use std::ops::Range;

use bytes::Bytes;
use thiserror::Error;
use url::Url;

use crate::api::{MergeSubmitRequest, PartitionTask};
use crate::codec::{f32_from_le_bytes, f32_to_le_bytes};
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
    /// A source returned the wrong number of bytes.
    #[error("partition {partition}: {source_hotkey}'s range has {got} bytes, expected {expected}")]
    Short {
        /// Partition index.
        partition: usize,
        /// The uploader.
        source_hotkey: String,
        /// Bytes expected.
        expected: usize,
        /// Bytes received.
        got: usize,
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
    /// The result could not be uploaded.
    #[error("partition {partition}: upload: {reason}")]
    Upload {
        /// Partition index.
        partition: usize,
        /// What went wrong.
        reason: String,
    },
}

/// Decodes each source's little-endian `f32` range, merges with `op` (equal weights when every
/// weight is 0) and encodes the result.
///
/// # Errors
/// [`ParticipantError::Short`] for a range of the wrong size, [`ParticipantError::Merge`] from
/// the operator (e.g. a non-finite value).
pub fn merge_encoded(
    partition: usize,
    op: MergeOp,
    sources: &[(&str, &[u8])],
    weights: &[f32],
    len: usize,
) -> Result<Vec<u8>, ParticipantError> {
    let mut values = Vec::with_capacity(sources.len());
    for (hotkey, bytes) in sources {
        match f32_from_le_bytes(bytes) {
            Some(v) if v.len() == len => values.push(v),
            _ => {
                return Err(ParticipantError::Short {
                    partition,
                    source_hotkey: (*hotkey).to_string(),
                    expected: len * 4,
                    got: bytes.len(),
                });
            }
        }
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
    Ok(f32_to_le_bytes(&merged))
}

/// Does one partition: downloads its range of every source, merges, uploads the result to
/// `task.output`, and returns the request to submit.
///
/// # Errors
/// [`ParticipantError`] naming the partition and, where relevant, the source.
pub async fn merge_partition_task(
    epoch: u64,
    op: MergeOp,
    task: &PartitionTask,
) -> Result<MergeSubmitRequest, ParticipantError> {
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
    let len = usize::try_from(task.end - task.start).map_err(|_| bad("range too large"))?;
    let bytes: Range<u64> = task.start * 4..task.end * 4;
    let mut downloaded = Vec::with_capacity(task.sources.len());
    for source in &task.sources {
        let failed = |reason: String| ParticipantError::Download {
            partition,
            source_hotkey: source.hotkey.clone(),
            reason,
        };
        let url = Url::parse(&source.blob.url).map_err(|e| failed(e.to_string()))?;
        let data = download_from_url(&url, Some(bytes.clone()))
            .await
            .map_err(|e| failed(e.to_string()))?;
        downloaded.push(data);
    }
    let sources: Vec<(&str, &[u8])> = task
        .sources
        .iter()
        .zip(&downloaded)
        .map(|(s, d)| (s.hotkey.as_str(), d.as_ref()))
        .collect();
    let weights: Vec<f32> = task.sources.iter().map(|s| s.weight).collect();
    let merged = merge_encoded(partition, op, &sources, &weights, len)?;
    let hash = payload_hash(&merged);
    let size = merged.len() as u64;
    let url = Url::parse(&task.output.url).map_err(|e| ParticipantError::Upload {
        partition,
        reason: e.to_string(),
    })?;
    upload_to_url(&url, Bytes::from(merged))
        .await
        .map_err(|e| ParticipantError::Upload {
            partition,
            reason: e.to_string(),
        })?;
    Ok(MergeSubmitRequest::Partition {
        epoch,
        index: partition,
        hash,
        bytes: size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le(v: &[f32]) -> Vec<u8> {
        f32_to_le_bytes(v)
    }

    #[test]
    fn merges_encoded_ranges_as_hand_computed() {
        let (a, b) = (le(&[1.0, 2.0]), le(&[3.0, 6.0]));
        let out = merge_encoded(0, MergeOp::Mean, &[("a", &a), ("b", &b)], &[1.0, 3.0], 2).unwrap();
        // (1*1 + 3*3)/4 = 2.5, (2*1 + 6*3)/4 = 5
        assert_eq!(f32_from_le_bytes(&out).unwrap(), vec![2.5, 5.0]);
        let out = merge_encoded(0, MergeOp::Mean, &[("a", &a), ("b", &b)], &[0.0, 0.0], 2).unwrap();
        assert_eq!(f32_from_le_bytes(&out).unwrap(), vec![2.0, 4.0]);
        let c = le(&[5.0, -1.0]);
        let out = merge_encoded(
            0,
            MergeOp::Median,
            &[("a", &a), ("b", &b), ("c", &c)],
            &[1.0; 3],
            2,
        )
        .unwrap();
        assert_eq!(f32_from_le_bytes(&out).unwrap(), vec![3.0, 2.0]);
    }

    #[test]
    fn short_and_non_finite_sources_are_named() {
        let a = le(&[1.0, 2.0]);
        let short = le(&[1.0]);
        let err =
            merge_encoded(3, MergeOp::Mean, &[("a", &a), ("b", &short)], &[1.0; 2], 2).unwrap_err();
        assert!(
            matches!(&err, ParticipantError::Short { partition: 3, source_hotkey, expected: 8, got: 4 } if source_hotkey == "b"),
            "{err}"
        );
        let nan = le(&[f32::NAN, 0.0]);
        let err =
            merge_encoded(1, MergeOp::Mean, &[("a", &a), ("b", &nan)], &[1.0; 2], 2).unwrap_err();
        assert!(
            matches!(err, ParticipantError::Merge { partition: 1, .. }),
            "{err}"
        );
    }
}
