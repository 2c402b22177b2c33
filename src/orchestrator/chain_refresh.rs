//! Keeping an attached subnet's metagraph fresh while the orchestrator serves (see
//! [`super::subnet`]): a read every `refresh_secs` on a blocking thread, then the miners that
//! left the metagraph lose their seats.

use std::time::Duration;

use super::state::AppState;

/// Takes the seat of every registered miner whose hotkey is no longer on the subnet's
/// metagraph, so routing gives it nothing more; returns their hotkeys.
pub fn retire_departed(state: &AppState) -> Vec<String> {
    let Some(subnet) = state.subnet() else {
        return Vec::new();
    };
    let miners = match state.repo.miners() {
        Ok(miners) => miners,
        Err(e) => {
            tracing::warn!("chain: cannot list the miners to drop departed ones: {e}");
            return Vec::new();
        }
    };
    let mut departed = Vec::new();
    for m in miners {
        if subnet.is_registered(&m.hotkey) || m.last_seen_ms == 0 {
            continue;
        }
        match state.repo.retire(&m.hotkey) {
            Ok(()) => {
                tracing::warn!(hotkey = %m.hotkey, "left the subnet's metagraph: dropped from routing");
                departed.push(m.hotkey);
            }
            Err(e) => {
                tracing::warn!(hotkey = %m.hotkey, "chain: cannot drop a departed miner: {e}")
            }
        }
    }
    if !departed.is_empty() {
        state.wakeups.everyone();
    }
    departed
}

/// Reads the metagraph again every `refresh_secs`, then drops departed miners; a failed read
/// logs one line and keeps the metagraph before it. Runs until aborted; returns at once
/// without a subnet.
pub async fn refresh_loop(state: AppState) {
    let Some(subnet) = state.subnet().cloned() else {
        return;
    };
    retire_departed(&state);
    let every = Duration::from_secs(subnet.config().refresh_secs.max(1));
    loop {
        tokio::time::sleep(every).await;
        let now = state.now_ms();
        let reading = subnet.clone();
        match tokio::task::spawn_blocking(move || reading.refresh(now)).await {
            Ok(Ok(())) => {
                retire_departed(&state);
            }
            Ok(Err(e)) => tracing::warn!(
                "chain: refreshing subnet {}'s metagraph failed, keeping the one of block {}: {e}",
                subnet.config().netuid,
                subnet.metagraph().block
            ),
            Err(e) => tracing::warn!("chain: the metagraph refresh stopped: {e}"),
        }
    }
}
