//! The state a section's merge uploads are measured against ([`super::outliers`]): the
//! previous global state (the section's latest checkpoint) or, before the first merge, the
//! state every miner started from (the seed's initial weights, zero moments), which the
//! orchestrator builds once per section and keeps.

use std::ops::Range;
use std::sync::Arc;

use burn::backend::Autodiff;

use super::cycle_error::CycleError;
use super::state::AppState;
use crate::codec::f32_from_le_bytes;
use crate::model::ModelError;
use crate::model::backend::Cpu;
use crate::model::layout::section_layout;
use crate::model::section::Section;
use crate::storage::{ObjectKey, StatePart};

/// Where the reference of one section comes from.
#[derive(Debug, Clone)]
pub enum Reference {
    /// A stored checkpoint (the previous global state).
    Stored(ObjectKey),
    /// The initial state, in memory.
    Initial(Arc<Vec<f32>>),
}

impl Reference {
    /// The reference of `section` now.
    ///
    /// # Errors
    /// A state-store error, or the initial state could not be built.
    pub async fn of(state: &AppState, section: usize) -> Result<Self, CycleError> {
        if let Some(cp) = state.repo.latest_checkpoint(section)? {
            return Ok(Self::Stored(state.checkpoint_key(
                section,
                cp.epoch,
                StatePart::Flat,
            )));
        }
        Ok(Self::Initial(initial_state(state, section).await?))
    }

    /// Values `range` (flat indices).
    ///
    /// # Errors
    /// A storage error, or a stored state shorter than `range`.
    pub async fn values(
        &self,
        state: &AppState,
        range: Range<u64>,
    ) -> Result<Vec<f32>, CycleError> {
        match self {
            Self::Initial(values) => {
                let (a, b) = (
                    usize::try_from(range.start).unwrap_or(usize::MAX),
                    usize::try_from(range.end).unwrap_or(usize::MAX),
                );
                values
                    .get(a..b)
                    .map(<[f32]>::to_vec)
                    .ok_or_else(|| CycleError::BadObject {
                        key: "initial state".into(),
                        reason: format!("range {range:?} is out of bounds"),
                    })
            }
            Self::Stored(key) => {
                let bytes = state
                    .storage
                    .get_range(key, range.start * 4..range.end * 4)
                    .await?;
                f32_from_le_bytes(&bytes).ok_or_else(|| CycleError::BadObject {
                    key: key.as_str().to_string(),
                    reason: "not a whole number of f32 values".into(),
                })
            }
        }
    }
}

/// The initial flat state of `section` (built on the CPU once, then kept).
async fn initial_state(state: &AppState, section: usize) -> Result<Arc<Vec<f32>>, CycleError> {
    if let Some(values) = state
        .initial_states
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&section)
    {
        return Ok(values.clone());
    }
    let config = state.config.clone();
    let built = tokio::task::spawn_blocking(move || -> Result<Vec<f32>, ModelError> {
        let layout = section_layout(&config.model, section)?;
        let device = Default::default();
        let model = Section::<Autodiff<Cpu>>::new(
            &config.model,
            section,
            config.seed,
            config.optimizer,
            &device,
        )?;
        model.export_flat(&layout)
    })
    .await
    .map_err(|e| CycleError::BadObject {
        key: "initial state".into(),
        reason: format!("building it failed: {e}"),
    })??;
    let values = Arc::new(built);
    state
        .initial_states
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(section, values.clone());
    Ok(values)
}
