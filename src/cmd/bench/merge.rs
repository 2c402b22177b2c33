//! `iota bench merge`: N simulated miners of one section merge their weights through the
//! butterfly plan over real object storage (a local directory), in one process. Prints, per N,
//! the bytes each miner uploads and downloads divided by the section size, and the wall time.
//!
//! Each miner: uploads its flat vector once in the chosen merge wire format (`--wire`: f32,
//! bf16, int8; see [`crate::codec::merge_wire`]); for every partition it is assigned,
//! downloads the bytes holding that range from every other uploader, merges, uploads the
//! result in the same format; finally downloads the whole merged vector (one copy of each
//! partition). Bytes are counted as they are written and read. The merged vector is checked
//! against the operator applied directly to the decoded uploads (written back in the format
//! partition by partition, as the mergers do).

use std::time::Instant;

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Args;

use crate::cmd::model::{human_bytes, human_count};
use crate::codec::{MergeWire, Span};
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
    /// Element formats of uploads and partitions to measure, comma-separated.
    #[arg(
        long,
        value_name = "FORMAT,..",
        value_delimiter = ',',
        default_value = "f32,bf16,int8"
    )]
    pub wire: Vec<MergeWire>,
}

/// One row of the result table.
#[derive(Debug, Clone, PartialEq)]
pub struct MergeRow {
    /// Element format.
    pub wire: MergeWire,
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

/// `values` (flat indices from `start` on) in `wire`.
fn to_bytes(wire: MergeWire, values: &[f32], start: usize) -> anyhow::Result<Bytes> {
    let span = Span::default().shifted(start as u64);
    Ok(Bytes::from(wire.encode(values, span)?))
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
    wire: MergeWire,
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
        let bytes = to_bytes(wire, v, 0)?;
        up[m] += bytes.len() as u64;
        storage.put(&key, bytes).await?;
    }
    let plan = PlanSpec::new(keys.root().as_str(), 0, 0, names.clone(), params)
        .with_replication(replication)
        .build()?;
    let index = |name: &str| names.iter().position(|n| n == name).unwrap_or(0);
    let n = params as u64;
    // What every uploader's vector is after its trip through the format.
    let decoded: Vec<Vec<f32>> = vectors
        .iter()
        .map(|v| wire.round_trip(v, Span::default()))
        .collect::<Result<_, _>>()?;
    for (p, partition) in plan.partitions().iter().enumerate() {
        let range = partition.range();
        let elems = range.start as u64..range.end as u64;
        let byte_range = wire.byte_range(elems.clone(), n);
        for merger in partition.mergers() {
            let me = index(merger);
            let mut slices = Vec::with_capacity(miners);
            for (u, hk) in hotkeys.iter().enumerate() {
                if u == me {
                    slices.push(decoded[u][range.clone()].to_vec());
                    continue;
                }
                let key = keys.weights(0, 0, hk, StatePart::Parameters);
                let bytes = storage.get_range(&key, byte_range.clone()).await?;
                down[me] += bytes.len() as u64;
                slices.push(wire.decode_range(&bytes, elems.clone(), n, Span::default())?);
            }
            let refs: Vec<&[f32]> = slices.iter().map(Vec::as_slice).collect();
            let merged = merge_partition(op, &refs, &weights)?;
            let bytes = to_bytes(wire, &merged, range.start)?;
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
            let span = Span::default().shifted(partition.range().start as u64);
            full.extend(wire.decode(&bytes, partition.len() as u64, span)?);
        }
        if m == 0 {
            assembled = full;
        } else if full != assembled {
            bail!("miner {} assembled a different merged vector", hk.as_str());
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut direct = Vec::with_capacity(params);
    for partition in plan.partitions() {
        let range = partition.range();
        let refs: Vec<&[f32]> = decoded.iter().map(|v| &v[range.clone()]).collect();
        let merged = merge_partition(op, &refs, &weights)?;
        direct.extend(wire.round_trip(&merged, Span::default().shifted(range.start as u64))?);
    }
    if direct != assembled {
        bail!("the butterfly merge differs from the direct computation");
    }
    storage.delete_prefix(&keys.root()).await?;
    let section = (params * 4) as f64;
    let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len() as f64 / section;
    Ok(MergeRow {
        wire,
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
    println!("\nwire  miners  partitions  up/S   down/S  max down/S  wall s");
    for &wire in &args.wire {
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
                wire,
            ))?;
            print_row(&row);
        }
    }
    println!(
        "\n(up/S, down/S: bytes per miner, counted as written and read, divided by the section's f32 bytes S; the merged result matched the operator on the decoded uploads every time)"
    );
    Ok(())
}

fn print_row(row: &MergeRow) {
    println!(
        "{:>4}  {:>6}  {:>10}  {:>5.3}  {:>6.3}  {:>10.3}  {:>6.2}",
        row.wire,
        row.miners,
        row.partitions,
        row.up_ratio,
        row.down_ratio,
        row.max_down_ratio,
        row.seconds
    );
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
            .block_on(simulate(
                &storage,
                4,
                10_000,
                MergeOp::Mean,
                2,
                MergeWire::F32,
            ))
            .unwrap();
        let large = rt
            .block_on(simulate(
                &storage,
                16,
                10_000,
                MergeOp::Mean,
                2,
                MergeWire::F32,
            ))
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

    #[test]
    fn compressed_formats_move_the_bytes_their_format_says() {
        let storage = Storage::in_memory();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let f32 = rt
            .block_on(simulate(
                &storage,
                4,
                10_000,
                MergeOp::Mean,
                2,
                MergeWire::F32,
            ))
            .unwrap();
        // Same plan, fewer bytes per value: bf16 exactly half; int8 one byte and a 4-byte
        // scale per 256 values (0.2539 of f32), partition reads widened to whole blocks.
        for (wire, low, high) in [
            (MergeWire::Bf16, 0.499, 0.501),
            (MergeWire::Int8, 0.25, 0.33),
        ] {
            let row = rt
                .block_on(simulate(&storage, 4, 10_000, MergeOp::Mean, 2, wire))
                .unwrap();
            for (got, base) in [
                (row.up_ratio, f32.up_ratio),
                (row.down_ratio, f32.down_ratio),
            ] {
                let ratio = got / base;
                assert!(ratio > low && ratio < high, "{wire}: {got} against {base}");
            }
        }
    }
}
