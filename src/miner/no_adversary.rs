//! What the miner loop sees of the hostile behaviours when the `adversary` feature is off (the
//! release build): an [`Adversary`] that has no values and a [`Copier`] that cannot be made, so
//! every hostile branch of the loop is dead and compiled away. The real ones live in
//! `adversary.rs` and `copier.rs`, built for the tests with `--features adversary`.

use crate::api::PartitionTask;
use crate::codec::{MergeWire, Span};
use crate::compute::cache::CachedInput;
use crate::compute::engine::Activations;

/// No hostile behaviour exists in this build (an enum without variants).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adversary {}

impl Adversary {
    /// Never called: there is no value to call it on.
    pub fn never_steps(self) -> bool {
        match self {}
    }

    /// Never called: there is no value to call it on.
    pub fn abandons_work(self) -> bool {
        match self {}
    }

    /// Never called: there is no value to call it on.
    pub fn poisons_merges(self) -> bool {
        match self {}
    }

    /// Never called: there is no value to call it on.
    pub fn copies_uploads(self) -> bool {
        match self {}
    }

    /// Leaves the state as it is (only a poisoner, absent from this build, changes it).
    pub fn poison(_flat: &mut [f32], _params_len: usize) {}

    /// Never called: there is no value to call it on.
    pub fn tamper(self, _: u64, _: Option<&CachedInput>, _: Activations) -> Activations {
        match self {}
    }

    /// Never called: there is no value to call it on.
    pub fn merge_task(self, _: &PartitionTask) -> PartitionTask {
        match self {}
    }
}

/// No copier exists in this build (an enum without variants).
#[derive(Debug)]
pub enum Copier {}

impl Copier {
    /// Always refuses: the copier is built only with the `adversary` feature.
    ///
    /// # Errors
    /// Always.
    pub fn open(_dir: &str, _run: &str, _hotkey: &str) -> Result<Self, String> {
        Err("this build has no copier (build with --features adversary)".into())
    }

    /// Never called: there is no value to call it on.
    pub async fn disguise(
        &self,
        _: u32,
        _: u64,
        _: Vec<f32>,
        _: MergeWire,
        _: Span,
        _: &[f32],
    ) -> Vec<f32> {
        match *self {}
    }
}
