//! Objects an epoch leaves behind, and how long they stay.
//!
//! Without validators, a finished merge deletes its epoch's activations at once (in the
//! background, [`dispose_in_background`], so the next epoch does not wait for it), and the
//! uploads and partition copies of the merge before it. With validators in the run config,
//! those objects are kept until every configured validator has published weights for their
//! epoch (it has replayed and checked what it wanted), or until `validation.retain_s` has
//! passed, whichever comes first. Nobody has to say which miner it checks, so nothing about
//! a validator's choice can leak to the miners.
//!
//! Section checkpoints (merged state and outer momentum) beyond the newest
//! `retention.checkpoints` of a section go the same way: a checkpoint is needed by validators
//! for every epoch that started from it. The routing detail of the ledger (assignments,
//! pathways) of epochs older than the newest `retention.ledger_epochs` is deleted once no
//! object of those epochs is still kept for validators ([`prune_ledger`]).

use super::state::AppState;
use crate::storage::ObjectKey;

/// Deletes `prefix` (objects of `epoch`) now, or keeps it for validators.
pub async fn dispose(state: &AppState, prefix: &ObjectKey, epoch: u64) {
    if !kept_for_validators(state, prefix, epoch) {
        delete(state, prefix).await;
    }
}

/// Like [`dispose`], but a deletion runs in the background: for the bulk of a finished merge's
/// garbage (an epoch's activations, a merge's uploads and partition copies: hundreds of
/// objects that nobody reads any more), so the next training epoch does not wait for it.
/// Keeping them for validators is recorded before this returns, as with [`dispose`], so the
/// ledger pruning that follows sees it.
pub fn dispose_in_background(state: &AppState, prefix: ObjectKey, epoch: u64) {
    if kept_for_validators(state, &prefix, epoch) {
        return;
    }
    let state = state.clone();
    tokio::spawn(async move {
        delete(&state, &prefix).await;
    });
}

/// With validators in the run, records `prefix` as kept for them; whether it was.
fn kept_for_validators(state: &AppState, prefix: &ObjectKey, epoch: u64) -> bool {
    if state.validators().is_empty() {
        return false;
    }
    match state
        .repo
        .keep_objects(prefix.as_str(), epoch, state.now_ms())
    {
        Ok(()) => {
            tracing::debug!(prefix = prefix.as_str(), epoch, "kept for validators");
            true
        }
        Err(e) => {
            tracing::warn!(prefix = prefix.as_str(), "cannot keep objects: {e}");
            false
        }
    }
}

async fn delete(state: &AppState, prefix: &ObjectKey) -> bool {
    match state.storage.delete_prefix(prefix).await {
        Ok(n) => {
            tracing::debug!(prefix = prefix.as_str(), n, "deleted old objects");
            true
        }
        Err(e) => {
            tracing::warn!(prefix = prefix.as_str(), "garbage collection: {e}");
            false
        }
    }
}

/// Deletes the kept objects every validator is done with, or whose time is up (on every tick
/// of the deadline task). Returns the prefixes deleted.
pub async fn release_done(state: &AppState) -> Vec<String> {
    let kept = match state.repo.kept_objects() {
        Ok(kept) => kept,
        Err(e) => {
            tracing::warn!("kept objects: {e}");
            return Vec::new();
        }
    };
    let retain_ms = state.config.validation.retain_s.saturating_mul(1000);
    let now = state.now_ms();
    let mut done = Vec::new();
    let validators = state.validators();
    for k in kept {
        let all_published = validators.iter().all(|v| {
            state
                .repo
                .published_epoch(&v.hotkey)
                .ok()
                .flatten()
                .is_some_and(|e| e >= k.epoch)
        });
        let expired = now >= k.eligible_ms.saturating_add(retain_ms);
        if !(all_published || expired) {
            continue;
        }
        let Ok(prefix) = ObjectKey::parse(&k.prefix) else {
            tracing::warn!(prefix = %k.prefix, "a kept prefix is not a key; forgetting it");
            let _ = state.repo.release_objects(&k.prefix);
            continue;
        };
        if delete(state, &prefix).await {
            if let Err(e) = state.repo.release_objects(&k.prefix) {
                tracing::warn!(prefix = %k.prefix, "{e}");
            }
            done.push(k.prefix);
        }
    }
    done
}

/// After the merge that produced checkpoint epoch `new_epoch`: the checkpoint of each section
/// that fell out of the newest `retention.checkpoints` is disposed of (deleted, or kept until
/// the validators are done with the last epoch that started from it).
pub async fn collect_checkpoints(state: &AppState) {
    let keep = usize::try_from(state.config.retention.checkpoints).unwrap_or(usize::MAX);
    for section in 0..state.config.model.n_sections() {
        let epochs = match state.repo.checkpoint_epochs(section) {
            Ok(epochs) => epochs,
            Err(e) => {
                tracing::warn!(section, "checkpoint garbage collection: {e}");
                continue;
            }
        };
        // Only the one that fell out now: older ones went at earlier merges.
        let Some(out) = epochs.len().checked_sub(keep + 1) else {
            continue;
        };
        let (old, next) = (epochs[out], epochs[out + 1]);
        let s = u32::try_from(section).unwrap_or(u32::MAX);
        // Epochs old .. next - 1 started from it; validators may replay any of them.
        dispose(
            state,
            &state.keys.checkpoint_section(old, s),
            next.saturating_sub(1),
        )
        .await;
    }
}

/// Deletes the routing detail (assignments, pathways) of epochs before the newest
/// `retention.ledger_epochs` up to `current`, except epochs whose objects are still kept for
/// validators (they read the ledger of the epoch they check). Returns the rows deleted.
pub fn prune_ledger(state: &AppState, current: u64) -> u64 {
    let keep = state.config.retention.ledger_epochs;
    let Some(mut last) = (current + 1).checked_sub(keep.saturating_add(1)) else {
        return 0;
    };
    match state.repo.kept_objects() {
        Ok(kept) => {
            if let Some(oldest) = kept.iter().map(|k| k.epoch).min() {
                match oldest.checked_sub(1) {
                    Some(before) => last = last.min(before),
                    None => return 0,
                }
            }
        }
        Err(e) => {
            tracing::warn!("ledger pruning: {e}");
            return 0;
        }
    }
    match state.repo.prune_routing(last) {
        Ok(n) => {
            tracing::debug!(last_epoch = last, rows = n, "pruned the routing ledger");
            n
        }
        Err(e) => {
            tracing::warn!("ledger pruning: {e}");
            0
        }
    }
}
