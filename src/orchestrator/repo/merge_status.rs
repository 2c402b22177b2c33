//! What `/api/merge/status` shows, read under one hold of the connection: the run's phase
//! and, for each section, its newest checkpoint and the rows of the merge the phase names.

use super::db::Repository;
use super::merge::{
    CheckpointRow, PhaseInfo, PlanRow, ResultRow, UploadRow, flags_in, plan_in, results_in,
    start_checkpoint_in, uploads_of_in, verdicts_in,
};
use super::phase::run_row_in;
use crate::orchestrator::repo_types::RepoError;

/// The rows of one section's merge that `/api/merge/status` shows.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SectionMergeRows {
    /// The section's newest checkpoint.
    pub checkpoint: Option<CheckpointRow>,
    /// Its uploads for the shown merge, by miner.
    pub uploads: Vec<UploadRow>,
    /// Its plan for the shown merge.
    pub plan: Option<PlanRow>,
    /// Submitted partition results, by partition then merger.
    pub results: Vec<ResultRow>,
    /// `(partition, verdict)` of the finished merge.
    pub verdicts: Vec<(usize, String)>,
    /// `(partition, merger, reason)` flags.
    pub flags: Vec<(usize, String, String)>,
}

/// The phase and every section's merge rows, read under one hold of the connection
/// ([`Repository::merge_status_rows`]).
#[derive(Debug, Clone, PartialEq)]
pub struct MergeStatusRows {
    /// The run's phase.
    pub phase: PhaseInfo,
    /// The merge the section rows belong to (`None`: no merge to show yet).
    pub epoch: Option<u64>,
    /// One entry per section, in order.
    pub sections: Vec<SectionMergeRows>,
}

impl Repository {
    /// What `/api/merge/status` shows, read under one hold of the connection: the phase,
    /// then for each of `n_sections` sections its newest checkpoint and the rows of the merge
    /// `shown(phase)` picks (none when it picks none). One wait behind the miners' requests
    /// instead of about seven per section, and rows that agree with the phase beside them.
    ///
    /// # Errors
    /// [`RepoError::Sqlite`] or [`RepoError::Corrupt`].
    pub fn merge_status_rows(
        &self,
        n_sections: usize,
        shown: impl FnOnce(&PhaseInfo) -> Option<u64>,
    ) -> Result<MergeStatusRows, RepoError> {
        self.read(|conn| {
            let (phase, _) = run_row_in(conn)?;
            let epoch = shown(&phase);
            let sections = (0..n_sections)
                .map(|section| {
                    let mut rows = SectionMergeRows {
                        checkpoint: start_checkpoint_in(conn, section, u64::MAX)?,
                        ..SectionMergeRows::default()
                    };
                    if let Some(e) = epoch {
                        rows.uploads = uploads_of_in(conn, e, section)?;
                        rows.plan = plan_in(conn, e, section)?;
                        if rows.plan.is_some() {
                            rows.results = results_in(conn, e, section)?;
                        }
                        rows.verdicts = verdicts_in(conn, e, section)?;
                        rows.flags = flags_in(conn, e, section)?;
                    }
                    Ok(rows)
                })
                .collect::<Result<_, RepoError>>()?;
            Ok(MergeStatusRows {
                phase,
                epoch,
                sections,
            })
        })
    }
}
