//! The copier's source of other miners' merge uploads (test harness only; see
//! [`super::adversary::Adversary::Copier`]).
//!
//! A copier models a miner (or one hotkey of a Sybil operator) that has read access to the
//! object store, as a public or leaked bucket gives: at the upload phase it waits for another
//! miner of its section to have an accepted upload, and uploads that state instead of its
//! own, lightly perturbed towards its own so the bytes (and the hash) differ. The validator's
//! copy detection must still see the two pseudo-gradients as one.

use std::time::{Duration, Instant};

use crate::codec::{MergeWire, Span};
use crate::storage::{KeyPart, RunKeys, Storage, StorageConfig};

/// How long the copier waits for someone else's upload before uploading its own state.
const WAIT_FOR_ORIGINAL: Duration = Duration::from_secs(15);
/// Pause between two listings of the store.
const POLL: Duration = Duration::from_millis(200);
/// Share of its own state mixed into the copy: small enough that the copy's pseudo-gradient
/// keeps a cosine above 0.9998 with the original's, large enough that every value differs.
const OWN_SHARE: f32 = 0.02;

/// Read access to the run's object store, and who the copier is.
#[derive(Debug)]
pub struct Copier {
    store: Storage,
    keys: RunKeys,
    hotkey: String,
}

impl Copier {
    /// A copier reading the local object store at `dir` for run `run`.
    ///
    /// # Errors
    /// A store that cannot be opened or a run name that is not a key component.
    pub fn open(dir: &str, run: &str, hotkey: &str) -> Result<Self, String> {
        let store = Storage::open(&StorageConfig::local(dir))
            .map_err(|e| format!("opening the object store {dir}: {e}"))?;
        let keys = RunKeys::new(run).map_err(|e| format!("run name {run:?}: {e}"))?;
        Ok(Self {
            store,
            keys,
            hotkey: hotkey.to_string(),
        })
    }

    /// What to upload for the merge of `epoch` instead of `own`: another miner's accepted
    /// upload of `section` moved [`OWN_SHARE`] of the way towards `own`, or `own` when no
    /// other upload of the same length shows up in time. `global` is the previous global state
    /// (what a `dct` upload is decoded against).
    pub async fn disguise(
        &self,
        section: u32,
        epoch: u64,
        own: Vec<f32>,
        wire: MergeWire,
        span: Span,
        global: &[f32],
    ) -> Vec<f32> {
        let until = Instant::now() + WAIT_FOR_ORIGINAL;
        loop {
            if let Some((hotkey, original)) = self
                .find(section, epoch, own.len(), wire, span, global)
                .await
            {
                tracing::info!(epoch, section, original = %hotkey, "copier: copying an upload");
                return original
                    .iter()
                    .zip(&own)
                    .map(|(o, m)| o + OWN_SHARE * (m - o))
                    .collect();
            }
            if Instant::now() >= until {
                tracing::warn!(epoch, section, "copier: nothing to copy, uploading its own");
                return own;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The first other miner's accepted upload of `section` for `epoch` with `len` values,
    /// decoded from the run's merge wire.
    async fn find(
        &self,
        section: u32,
        epoch: u64,
        len: usize,
        wire: MergeWire,
        span: Span,
        global: &[f32],
    ) -> Option<(String, Vec<f32>)> {
        let base = wire.base_of(global, len as u64, span).ok()?;
        let prefix = self.keys.weights_epoch(section, epoch);
        let accepted = KeyPart::new("accepted").ok()?;
        let listed = self.store.list(Some(&prefix)).await.ok()?;
        for info in listed {
            let Some(rest) = info.key.strip_prefix(&prefix) else {
                continue;
            };
            let Some((hotkey, part)) = rest.as_str().split_once('/') else {
                continue;
            };
            if hotkey == self.hotkey || part != accepted.as_str() {
                continue;
            }
            let Ok(bytes) = self.store.get(&info.key).await else {
                continue;
            };
            if let Ok(flat) = wire.decode(&bytes, len as u64, span, base) {
                return Some((hotkey.to_string(), flat));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::merge::f32_to_le_bytes;
    use crate::storage::{Hotkey, StatePart};

    #[tokio::test]
    async fn it_copies_another_miners_accepted_upload_and_never_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().display().to_string();
        let me = "5Dq3fL7XgBZTMPp9xojytZPGfZyhD2chKUe4BVWbAhBanwWy";
        let other = "5D5gLmXMCRpapWGT7tPibWucEyHvj9xheGvYJPfpmJE4X7uk";
        let copier = Copier::open(&root, "run-a", me).unwrap();
        let store = Storage::open(&StorageConfig::local(root.clone())).unwrap();
        let keys = RunKeys::new("run-a").unwrap();
        let accepted = |hotkey: &str| {
            keys.weights_epoch(1, 3)
                .join(&KeyPart::new(hotkey).unwrap())
                .join(&KeyPart::new("accepted").unwrap())
        };
        let short = "5FHeUE4uzfo3uU83SsnfesYKGxxuvYMpTprn18b7XpnVUMPV";
        let upload = keys.weights(1, 3, &Hotkey::new(other).unwrap(), StatePart::Flat);
        // Its own accepted upload, a wrong-length one and an upload not (yet) accepted are
        // not copied.
        for (key, v) in [
            (accepted(me), vec![9.0, 9.0]),
            (accepted(short), vec![7.0]),
            (upload, vec![5.0, 5.0]),
        ] {
            store
                .put(&key, Bytes::from(f32_to_le_bytes(&v)))
                .await
                .unwrap();
        }
        let (wire, span) = (MergeWire::F32, Span::whole(2));
        assert!(copier.find(1, 3, 2, wire, span, &[]).await.is_none());
        let original = Bytes::from(f32_to_le_bytes(&[1.0, 2.0]));
        store.put(&accepted(other), original).await.unwrap();
        let copy = copier
            .disguise(1, 3, vec![11.0, 2.0], wire, span, &[])
            .await;
        assert_eq!(copy, vec![1.0 + 0.02 * 10.0, 2.0]);
    }
}
