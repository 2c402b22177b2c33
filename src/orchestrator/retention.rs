//! Objects an epoch leaves behind, and how long they stay.
//!
//! Without validators, a finished merge deletes its epoch's activations at once, and the
//! uploads and partition copies of the merge before it. With validators in the run config,
//! those objects are kept until every configured validator has published weights for their
//! epoch (it has replayed and checked what it wanted), or until `validation.retain_s` has
//! passed, whichever comes first. Nobody has to say which miner it checks, so nothing about
//! a validator's choice can leak to the miners.

use super::state::AppState;
use crate::storage::ObjectKey;

/// Deletes `prefix` (objects of `epoch`) now, or keeps it for validators.
pub async fn dispose(state: &AppState, prefix: &ObjectKey, epoch: u64) {
    if !state.config.validators.is_empty() {
        match state
            .repo
            .keep_objects(prefix.as_str(), epoch, state.now_ms())
        {
            Ok(()) => {
                tracing::debug!(prefix = prefix.as_str(), epoch, "kept for validators");
                return;
            }
            Err(e) => tracing::warn!(prefix = prefix.as_str(), "cannot keep objects: {e}"),
        }
    }
    delete(state, prefix).await;
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
    for k in kept {
        let all_published = state.config.validators.iter().all(|v| {
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
