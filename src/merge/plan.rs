//! The butterfly partition plan: who merges which slice of a section's flat vector.
//!
//! Every uploader of a section uploads its whole flat vector once. The plan cuts that vector
//! into `P` contiguous partitions and gives each to `r` distinct mergers, chosen by a seeded
//! shuffle that every party (orchestrator, miners, validators) recomputes from the same inputs:
//! run name, section, epoch and the set of uploaders. Nothing but those inputs needs to be sent.
//!
//! # Format
//! - Uploaders are sorted (byte order) and must be distinct.
//! - Seed: BLAKE3 `derive_key("iota merge plan seed v1", ..)` over, in order, the run name,
//!   the section (`u32`), the epoch (`u64`), the uploader count and every uploader id, each
//!   string prefixed by its byte length as `u64` little-endian, integers little-endian.
//! - Partitions: `P' = min(P, N)`; partition `i` has `N / P'` values, plus one for the first
//!   `N mod P'` partitions, in order, so the ranges tile `0..N`.
//! - Mergers: `r' = min(r, M)` per partition, dealt from a deck holding every uploader once,
//!   shuffled with [`SeededStream`] (module `shuffle`); when the deck runs out it is reshuffled,
//!   and any card that would repeat a merger already in the partition being dealt is swapped
//!   with the first later card that does not. Each full deck gives every uploader exactly one
//!   slot, so assignment counts differ by at most one.

use std::ops::Range;

use serde::Serialize;

use super::error::PlanError;
use super::shuffle::SeededStream;

/// Default number of mergers per partition: two, so that a pair can be cross-checked.
pub const DEFAULT_REPLICATION: usize = 2;

/// Number of partitions for `uploaders` uploaders when each should merge about
/// `per_miner * r` of them: `max(1, uploaders * per_miner)`.
///
/// `P = M` (`per_miner = 1`) keeps per-miner traffic about constant as `M` grows: each miner
/// merges `r` partitions of `N / M` values, downloading each from `M - 1` others (~`r * N`).
pub fn partition_count(uploaders: usize, per_miner: usize) -> usize {
    uploaders.saturating_mul(per_miner).max(1)
}

/// Inputs of a merge plan; every party must use the same values to get the same plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanSpec {
    /// Run name (part of the seed, so two runs never share assignments).
    pub run: String,
    /// Section (pipeline stage) index.
    pub section: u32,
    /// Merge epoch; a new epoch gives new assignments.
    pub epoch: u64,
    /// Hotkeys of the miners that uploaded weights for this merge, in any order.
    pub uploaders: Vec<String>,
    /// Length `N` of the flat vector to partition.
    pub len: usize,
    /// Requested number of partitions `P` (clamped to `N`). Default: [`partition_count`]`(M, 1)`.
    pub partitions: usize,
    /// Requested mergers per partition `r` (clamped to `M`). Default: [`DEFAULT_REPLICATION`].
    pub replication: usize,
}

impl PlanSpec {
    /// A spec with the default partition count (`P = M`) and replication (`r = 2`).
    pub fn new(
        run: impl Into<String>,
        section: u32,
        epoch: u64,
        uploaders: impl IntoIterator<Item = impl Into<String>>,
        len: usize,
    ) -> Self {
        let uploaders: Vec<String> = uploaders.into_iter().map(Into::into).collect();
        Self {
            run: run.into(),
            section,
            epoch,
            partitions: partition_count(uploaders.len(), 1),
            uploaders,
            len,
            replication: DEFAULT_REPLICATION,
        }
    }

    /// Sets the requested number of partitions.
    pub fn with_partitions(mut self, partitions: usize) -> Self {
        self.partitions = partitions;
        self
    }

    /// Sets the requested number of mergers per partition.
    pub fn with_replication(mut self, replication: usize) -> Self {
        self.replication = replication;
        self
    }

    /// Computes the plan described in the module's `# Format`.
    ///
    /// # Errors
    /// [`PlanError::NoUploaders`], [`PlanError::DuplicateUploader`],
    /// [`PlanError::ZeroPartitions`], [`PlanError::ZeroReplication`], [`PlanError::EmptyVector`].
    pub fn build(&self) -> Result<MergePlan, PlanError> {
        MergePlan::new(self)
    }
}

/// One contiguous slice of the flat vector and the mergers responsible for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Partition {
    index: usize,
    start: usize,
    end: usize,
    mergers: Vec<String>,
}

impl Partition {
    /// Position of this partition in the plan (0-based).
    pub fn index(&self) -> usize {
        self.index
    }

    /// The half-open range `start..end` of flat indices it covers.
    pub fn range(&self) -> Range<usize> {
        self.start..self.end
    }

    /// Number of values it covers (at least 1).
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Always false: a plan never contains an empty partition.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Hotkeys of its mergers: `min(r, M)` distinct uploaders, in dealing order.
    pub fn mergers(&self) -> &[String] {
        &self.mergers
    }
}

/// A computed butterfly plan. Build it with [`PlanSpec::build`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MergePlan {
    seed: [u8; 32],
    len: usize,
    uploaders: Vec<String>,
    partitions: Vec<Partition>,
}

impl MergePlan {
    fn new(spec: &PlanSpec) -> Result<Self, PlanError> {
        if spec.uploaders.is_empty() {
            return Err(PlanError::NoUploaders);
        }
        if spec.partitions == 0 {
            return Err(PlanError::ZeroPartitions);
        }
        if spec.replication == 0 {
            return Err(PlanError::ZeroReplication);
        }
        if spec.len == 0 {
            return Err(PlanError::EmptyVector);
        }
        let mut uploaders = spec.uploaders.clone();
        uploaders.sort_unstable();
        if let Some(pair) = uploaders.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(PlanError::DuplicateUploader {
                id: pair[0].clone(),
            });
        }
        let seed = plan_seed(&spec.run, spec.section, spec.epoch, &uploaders);
        let ranges = tile(spec.len, spec.partitions.min(spec.len));
        let per_partition = spec.replication.min(uploaders.len());
        let slots = deal(&seed, uploaders.len(), ranges.len(), per_partition);
        let partitions = ranges
            .into_iter()
            .zip(slots.chunks(per_partition))
            .enumerate()
            .map(|(index, (range, dealt))| Partition {
                index,
                start: range.start,
                end: range.end,
                mergers: dealt.iter().map(|&u| uploaders[u].clone()).collect(),
            })
            .collect();
        Ok(Self {
            seed,
            len: spec.len,
            uploaders,
            partitions,
        })
    }

    /// The seed every assignment derives from.
    pub fn seed(&self) -> &[u8; 32] {
        &self.seed
    }

    /// Length `N` of the flat vector the plan covers.
    pub fn flat_len(&self) -> usize {
        self.len
    }

    /// The uploaders, sorted.
    pub fn uploaders(&self) -> &[String] {
        &self.uploaders
    }

    /// All partitions, in flat order.
    pub fn partitions(&self) -> &[Partition] {
        &self.partitions
    }

    /// The partitions `miner` must merge.
    pub fn partitions_for<'a>(&'a self, miner: &'a str) -> impl Iterator<Item = &'a Partition> {
        self.partitions
            .iter()
            .filter(move |p| p.mergers.iter().any(|m| m == miner))
    }
}

/// Seed of a plan, as described in the module's `# Format`. `uploaders` must be sorted.
fn plan_seed(run: &str, section: u32, epoch: u64, uploaders: &[String]) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new_derive_key("iota merge plan seed v1");
    let put_str = |hasher: &mut blake3::Hasher, s: &str| {
        hasher.update(&(s.len() as u64).to_le_bytes());
        hasher.update(s.as_bytes());
    };
    put_str(&mut hasher, run);
    hasher.update(&section.to_le_bytes());
    hasher.update(&epoch.to_le_bytes());
    hasher.update(&(uploaders.len() as u64).to_le_bytes());
    for id in uploaders {
        put_str(&mut hasher, id);
    }
    *hasher.finalize().as_bytes()
}

/// Cuts `0..len` into `parts` contiguous ranges whose sizes differ by at most one
/// (`1 <= parts <= len`).
fn tile(len: usize, parts: usize) -> Vec<Range<usize>> {
    let base = len / parts;
    let extra = len % parts;
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let end = start + base + usize::from(i < extra);
            let range = start..end;
            start = end;
            range
        })
        .collect()
}

/// Deals `per_partition` distinct uploader indices (of `uploaders`) to each of `partitions`
/// partitions, flattened partition after partition. `per_partition <= uploaders`.
fn deal(seed: &[u8; 32], uploaders: usize, partitions: usize, per_partition: usize) -> Vec<usize> {
    let mut stream = SeededStream::new(seed);
    let mut deck: Vec<usize> = (0..uploaders).collect();
    let mut next = deck.len(); // empty deck: shuffle before the first card
    let mut slots = Vec::with_capacity(partitions * per_partition);
    for _ in 0..partitions {
        let first = slots.len();
        for taken in 0..per_partition {
            if next == deck.len() {
                stream.shuffle(&mut deck);
                next = 0;
                let already = &slots[first..];
                avoid_repeats(&mut deck, already, per_partition - taken);
            }
            slots.push(deck[next]);
            next += 1;
        }
    }
    slots
}

/// Reorders a fresh deck so that its first `need` cards avoid `already` (the mergers already
/// dealt to the current partition), swapping each offending card with the first later card
/// that is not in `already`. Such cards exist because `need + already.len() <= deck.len()`.
fn avoid_repeats(deck: &mut [usize], already: &[usize], need: usize) {
    if already.is_empty() {
        return;
    }
    let mut spare = need;
    for i in 0..need.min(deck.len()) {
        if already.contains(&deck[i]) {
            while spare < deck.len() && already.contains(&deck[spare]) {
                spare += 1;
            }
            if spare < deck.len() {
                deck.swap(i, spare);
                spare += 1;
            }
        }
    }
}

/// Floats one miner sends and receives during one merge, for traffic estimates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Traffic {
    /// Its full flat vector (`N`) plus the partitions it merged.
    pub uploaded_floats: u64,
    /// Its partitions' slices from the `M - 1` other uploaders, plus the merged values of
    /// every partition it did not merge itself.
    pub downloaded_floats: u64,
}

/// Traffic of `miner` under `plan`, in floats (multiply by the wire element size for bytes).
///
/// For an uploader merging partitions of total length `S` among `M` uploaders:
/// `uploaded = N + S`, `downloaded = S * (M - 1) + (N - S)`. Its own slice is not downloaded
/// (it holds it), nor are the merged partitions it produced. With `P = M` and `r = 2`,
/// `S ~ 2N/M`, so the total is about `4N` whatever `M`. A miner that is not an uploader only
/// downloads the merged result: `uploaded = 0`, `downloaded = N`.
pub fn traffic_per_miner(plan: &MergePlan, miner: &str) -> Traffic {
    let n = plan.len as u64;
    if !plan.uploaders.iter().any(|u| u == miner) {
        return Traffic {
            uploaded_floats: 0,
            downloaded_floats: n,
        };
    }
    let merged: u64 = plan.partitions_for(miner).map(|p| p.len() as u64).sum();
    let others = plan.uploaders.len() as u64 - 1;
    Traffic {
        uploaded_floats: n + merged,
        downloaded_floats: merged * others + (n - merged),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(m: usize) -> Vec<String> {
        (0..m).map(|i| format!("hotkey-{i:03}")).collect()
    }

    fn spec(m: usize, len: usize) -> PlanSpec {
        PlanSpec::new("run-a", 1, 7, ids(m), len)
    }

    /// Checks every structural invariant of a plan and returns it.
    fn check_plan(plan: &MergePlan, len: usize, parts: usize, r: usize, m: usize) {
        assert_eq!(plan.partitions().len(), parts);
        let mut expected_start = 0;
        for (i, p) in plan.partitions().iter().enumerate() {
            assert_eq!(p.index(), i);
            assert_eq!(p.range().start, expected_start, "gap or overlap at {i}");
            assert!(!p.is_empty());
            expected_start = p.range().end;
            assert_eq!(p.mergers().len(), r.min(m));
            let mut distinct = p.mergers().to_vec();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), p.mergers().len(), "repeated merger in {i}");
            assert!(p.mergers().iter().all(|x| plan.uploaders().contains(x)));
        }
        assert_eq!(expected_start, len);
        let sizes: Vec<usize> = plan.partitions().iter().map(Partition::len).collect();
        let spread = sizes.iter().max().unwrap() - sizes.iter().min().unwrap();
        assert!(spread <= 1, "partition sizes {sizes:?}");
    }

    fn loads(plan: &MergePlan) -> Vec<usize> {
        plan.uploaders()
            .iter()
            .map(|u| plan.partitions_for(u).count())
            .collect()
    }

    #[test]
    fn covers_and_tiles_for_many_shapes() {
        for (m, len, parts, r) in [
            (5, 1003, 5, 2),
            (8, 100, 16, 2),
            (3, 10, 7, 3),
            (10, 1000, 10, 4),
            (7, 50, 13, 2),
            (2, 9, 4, 5),
        ] {
            let plan = spec(m, len)
                .with_partitions(parts)
                .with_replication(r)
                .build()
                .unwrap();
            check_plan(&plan, len, parts, r, m);
            // Each partition is merged min(r, M) times in total.
            let total: usize = loads(&plan).iter().sum();
            assert_eq!(total, parts * r.min(m));
        }
    }

    #[test]
    fn load_is_balanced() {
        for (m, parts, r) in [(5, 5, 2), (7, 13, 2), (10, 30, 3), (4, 3, 2), (9, 9, 9)] {
            let plan = spec(m, 10_000)
                .with_partitions(parts)
                .with_replication(r)
                .build()
                .unwrap();
            let l = loads(&plan);
            let spread = l.iter().max().unwrap() - l.iter().min().unwrap();
            assert!(spread <= 1, "m={m} parts={parts} r={r}: loads {l:?}");
        }
    }

    #[test]
    fn deterministic_and_order_independent() {
        let a = spec(6, 600).build().unwrap();
        let b = spec(6, 600).build().unwrap();
        let mut reversed = ids(6);
        reversed.reverse();
        let c = PlanSpec::new("run-a", 1, 7, reversed, 600).build().unwrap();
        assert_eq!(a, b);
        assert_eq!(a, c);
    }

    #[test]
    fn different_epoch_section_or_run_changes_assignments() {
        let mergers = |s: PlanSpec| -> Vec<Vec<String>> {
            let plan = s.build().unwrap();
            plan.partitions()
                .iter()
                .map(|p| p.mergers().to_vec())
                .collect()
        };
        let base = mergers(spec(8, 800));
        let mut other_epoch = spec(8, 800);
        other_epoch.epoch = 8;
        let mut other_section = spec(8, 800);
        other_section.section = 2;
        let mut other_run = spec(8, 800);
        other_run.run = "run-b".into();
        assert_ne!(base, mergers(other_epoch));
        assert_ne!(base, mergers(other_section));
        assert_ne!(base, mergers(other_run));
    }

    #[test]
    fn single_uploader_merges_everything_alone() {
        let plan = spec(1, 10).build().unwrap();
        check_plan(&plan, 10, 1, 2, 1);
        assert_eq!(plan.partitions()[0].mergers(), ["hotkey-000".to_string()]);
        let plan = spec(1, 10).with_partitions(3).build().unwrap();
        check_plan(&plan, 10, 3, 2, 1);
    }

    #[test]
    fn fewer_values_than_partitions_clamps_partitions() {
        let plan = spec(5, 3).with_partitions(5).build().unwrap();
        check_plan(&plan, 3, 3, 2, 5);
        assert!(plan.partitions().iter().all(|p| p.len() == 1));
    }

    #[test]
    fn bad_specs_are_errors() {
        assert_eq!(spec(0, 10).build().unwrap_err(), PlanError::NoUploaders);
        assert_eq!(
            spec(2, 10).with_partitions(0).build().unwrap_err(),
            PlanError::ZeroPartitions
        );
        assert_eq!(
            spec(2, 10).with_replication(0).build().unwrap_err(),
            PlanError::ZeroReplication
        );
        assert_eq!(spec(2, 0).build().unwrap_err(), PlanError::EmptyVector);
        let dup = PlanSpec::new("r", 0, 0, ["b", "a", "b"], 10);
        assert_eq!(
            dup.build().unwrap_err(),
            PlanError::DuplicateUploader { id: "b".into() }
        );
    }

    #[test]
    fn traffic_is_about_four_n_and_constant_in_m() {
        let n = 1_200_000;
        for m in [4usize, 12, 40] {
            let plan = spec(m, n).build().unwrap();
            for u in plan.uploaders() {
                let t = traffic_per_miner(&plan, u);
                // Each miner merges 2 partitions of N/M values: S = 2N/M exactly here.
                let s = (2 * n / m) as u64;
                assert_eq!(t.uploaded_floats, n as u64 + s);
                assert_eq!(t.downloaded_floats, s * (m as u64 - 1) + (n as u64 - s));
                let ratio = (t.uploaded_floats + t.downloaded_floats) as f64 / n as f64;
                assert!((3.0..=4.0).contains(&ratio), "m={m}: ratio {ratio}");
            }
        }
        let plan = spec(3, 30).build().unwrap();
        assert_eq!(
            traffic_per_miner(&plan, "stranger"),
            Traffic {
                uploaded_floats: 0,
                downloaded_floats: 30
            }
        );
    }

    #[test]
    fn golden_plan_is_pinned() {
        // The plan is a wire contract: every party must compute it identically, across versions.
        // If this test fails, the seed, shuffle or dealing changed and old and new peers would
        // disagree. Only update it together with a protocol version bump.
        let plan = PlanSpec::new("golden", 2, 5, ["carol", "alice", "dave", "bob"], 10)
            .build()
            .unwrap();
        let dealt: Vec<(Range<usize>, Vec<&str>)> = plan
            .partitions()
            .iter()
            .map(|p| (p.range(), p.mergers().iter().map(String::as_str).collect()))
            .collect();
        let golden: Vec<(Range<usize>, Vec<&str>)> = vec![
            (0..3, vec!["carol", "alice"]),
            (3..6, vec!["bob", "dave"]),
            (6..8, vec!["dave", "alice"]),
            (8..10, vec!["bob", "carol"]),
        ];
        assert_eq!(dealt, golden);
    }

    #[test]
    fn tile_spreads_the_remainder_over_the_first_partitions() {
        assert_eq!(tile(10, 3), vec![0..4, 4..7, 7..10]);
        assert_eq!(tile(3, 3), vec![0..1, 1..2, 2..3]);
    }
}
