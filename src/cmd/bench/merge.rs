//! `iota bench merge`: N simulated miners of one section merge their weights through the
//! butterfly plan over real object storage (a local directory), in one process. Prints, per N,
//! the bytes each miner uploads and downloads divided by the section size, and the wall time.
//!
//! Each miner: uploads its flat f32 vector once; for every partition it is assigned, downloads
//! that byte range from every other uploader, merges, uploads the result; finally downloads
//! the whole merged vector (one copy of each partition). The merged vector is checked against
//! the direct computation of the operator on the full vectors.

use std::time::Instant;

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Args;

use crate::cmd::model::{human_bytes, human_count};
use crate::merge::{MergeOp, PlanSpec, merge_partition};
use crate::storage::{Hotkey, RunKeys, StatePart, Storage, StorageConfig};

/// Arguments of `iota bench merge`.
#[derive(Debug, Args)]
pub struct BenchMergeArgs {
    /// Parameters in the simulated section.
    #[arg(long, value_name = "S", default_value_t = 1_000_000)]
    pub params: usize,
    /// Miner counts to simulate, comma-separated.
    #[arg(
        long,
        value_name = "N,..",
        value_delimiter = ',',
        default_value = "2,4,8,16,32,50"
    )]
    pub miners: Vec<usize>,
    /// Merge operator.
    #[arg(long, value_name = "OP", default_value = "mean")]
    pub op: MergeOp,
    /// Mergers per partition.
    #[arg(long, value_name = "R", default_value_t = 2)]
    pub replication: usize,
}

/// One row of the result table.
#[derive(Debug, Clone, PartialEq)]
pub struct MergeRow {
    /// Miners.
    pub miners: usize,
    /// Partitions in the plan.
    pub partitions: usize,
    /// Mean bytes uploaded per miner / section bytes.
    pub up_ratio: f64,
    /// Mean bytes downloaded per miner / section bytes.
    pub down_ratio: f64,
    /// Largest per-miner download / section bytes.
    pub max_down_ratio: f64,
    /// Wall time of the whole merge, seconds.
    pub seconds: f64,
}

fn to_bytes(v: &[f32]) -> Bytes {
    Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}

fn to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Simulates one merge of `miners` miners over `storage`.
///
/// # Errors
/// Storage or merge failures, or a merged result that differs from the direct computation.
pub async fn simulate(
    storage: &Storage,
    miners: usize,
    params: usize,
    op: MergeOp,
    replication: usize,
) -> anyhow::Result<MergeRow> {
    let keys = RunKeys::new(&format!("bench-{miners}"))?;
    let names: Vec<String> = (0..miners).map(|i| format!("miner{i:03}")).collect();
    let hotkeys: Vec<Hotkey> = names
        .iter()
        .map(|n| Hotkey::new(n))
        .collect::<Result<_, _>>()?;
    let vectors: Vec<Vec<f32>> = (0..miners)
        .map(|m| {
            (0..params)
                .map(|i| ((i * 31 + m * 17) % 1000) as f32 / 1000.0 - 0.5)
                .collect()
        })
        .collect();
    let weights: Vec<f32> = (0..miners).map(|m| 1.0 + m as f32).collect();
    let mut up = vec![0u64; miners];
    let mut down = vec![0u64; miners];
    let started = Instant::now();
    for (m, v) in vectors.iter().enumerate() {
        let key = keys.weights(0, 0, &hotkeys[m], StatePart::Parameters);
        let bytes = to_bytes(v);
        up[m] += bytes.len() as u64;
        storage.put(&key, bytes).await?;
    }
    let plan = PlanSpec::new(keys.root().as_str(), 0, 0, names.clone(), params)
        .with_replication(replication)
        .build()?;
    let index = |name: &str| names.iter().position(|n| n == name).unwrap_or(0);
    for (p, partition) in plan.partitions().iter().enumerate() {
        let range = partition.range();
        let byte_range = (range.start as u64 * 4)..(range.end as u64 * 4);
        for merger in partition.mergers() {
            let me = index(merger);
            let mut slices = Vec::with_capacity(miners);
            for (u, hk) in hotkeys.iter().enumerate() {
                if u == me {
                    slices.push(vectors[u][range.clone()].to_vec());
                    continue;
                }
                let key = keys.weights(0, 0, hk, StatePart::Parameters);
                let bytes = storage.get_range(&key, byte_range.clone()).await?;
                down[me] += bytes.len() as u64;
                slices.push(to_f32(&bytes));
            }
            let refs: Vec<&[f32]> = slices.iter().map(Vec::as_slice).collect();
            let merged = merge_partition(op, &refs, &weights)?;
            let bytes = to_bytes(&merged);
            up[me] += bytes.len() as u64;
            storage
                .put(
                    &keys.merged(0, 0, p as u32, &hotkeys[me], StatePart::Parameters),
                    bytes,
                )
                .await?;
        }
    }
    // Every miner assembles the merged vector from one copy of each partition.
    let mut assembled = Vec::new();
    for (m, hk) in hotkeys.iter().enumerate() {
        let mut full = Vec::with_capacity(params);
        for (p, partition) in plan.partitions().iter().enumerate() {
            let merger = &partition.mergers()[0];
            let key = keys.merged(
                0,
                0,
                p as u32,
                &hotkeys[index(merger)],
                StatePart::Parameters,
            );
            let bytes = storage.get(&key).await?;
            if names[m] != *merger {
                down[m] += bytes.len() as u64;
            }
            full.extend(to_f32(&bytes));
        }
        if m == 0 {
            assembled = full;
        } else if full != assembled {
            bail!("miner {} assembled a different merged vector", hk.as_str());
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let refs: Vec<&[f32]> = vectors.iter().map(Vec::as_slice).collect();
    let direct = merge_partition(op, &refs, &weights)?;
    if direct != assembled {
        bail!("the butterfly merge differs from the direct computation");
    }
    storage.delete_prefix(&keys.root()).await?;
    let section = (params * 4) as f64;
    let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len() as f64 / section;
    Ok(MergeRow {
        miners,
        partitions: plan.partitions().len(),
        up_ratio: mean(&up),
        down_ratio: mean(&down),
        max_down_ratio: down.iter().copied().max().unwrap_or(0) as f64 / section,
        seconds,
    })
}

/// Runs `iota bench merge`.
///
/// # Errors
/// Storage or merge failures.
pub fn run(args: BenchMergeArgs) -> anyhow::Result<()> {
    let dir = tempfile_dir()?;
    let storage = Storage::open(&StorageConfig::local(dir.path().display().to_string()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    println!(
        "iota bench merge: section of {} parameters ({} f32), op {}, r = {}, local directory storage",
        human_count(args.params),
        human_bytes(args.params * 4),
        args.op,
        args.replication
    );
    println!("\nminers  partitions  up/S   down/S  max down/S  wall s");
    for &n in &args.miners {
        if n == 0 {
            continue;
        }
        let row = rt.block_on(simulate(
            &storage,
            n,
            args.params,
            args.op,
            args.replication,
        ))?;
        println!(
            "{:>6}  {:>10}  {:>5.2}  {:>6.2}  {:>10.2}  {:>6.2}",
            row.miners,
            row.partitions,
            row.up_ratio,
            row.down_ratio,
            row.max_down_ratio,
            row.seconds
        );
    }
    println!(
        "\n(up/S, down/S: bytes per miner divided by the section's bytes; the merged result matched the direct computation every time)"
    );
    Ok(())
}

/// A temporary directory removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempfile_dir() -> anyhow::Result<TempDir> {
    let dir = std::env::temp_dir().join(format!("iota-bench-merge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(TempDir(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_per_miner_stays_about_constant() {
        let storage = Storage::in_memory();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let small = rt
            .block_on(simulate(&storage, 4, 10_000, MergeOp::Mean, 2))
            .unwrap();
        let large = rt
            .block_on(simulate(&storage, 16, 10_000, MergeOp::Mean, 2))
            .unwrap();
        for row in [&small, &large] {
            // Upload once (1) plus its merged partitions (~r/M); download ~r (partitions from
            // everyone) plus ~1 (the merged vector).
            assert!(row.up_ratio > 1.0 && row.up_ratio < 1.6, "{row:?}");
            assert!(row.down_ratio > 2.0 && row.down_ratio < 3.2, "{row:?}");
        }
        assert!(
            (large.down_ratio - small.down_ratio).abs() < 0.6,
            "{small:?} {large:?}"
        );
    }
}
