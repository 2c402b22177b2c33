//! `iota bench validate`: what it costs a validator to check a fraction `f` of one miner's
//! epoch of work, against what doing that work cost the miner.
//!
//! How each number is taken:
//! - **the work**: one epoch of `--samples` samples trained through every section of the
//!   preset, one compute engine per section ([`crate::compute::engine`], what `iota mine`
//!   runs), in pipeline order (each sample forward through the chain and the tail's loss and
//!   backward at once, each section's backward `--max-in-flight` samples behind, an AdamW step
//!   every `--local-steps` backwards), on the built-in corpus; every tensor crosses a boundary
//!   encoded on the run's wire, as in the network. Each section's inputs and results are kept
//!   as its miner's record (the objects a validator downloads). Not timed.
//! - **the miner**: that section's work done again from the start state by a fresh engine,
//!   from its record: decode the start state and adopt it, then for each item check the
//!   input's hash and decode it, compute, encode the result; at the end export the state and
//!   encode the merge upload.
//! - **the validator**: what `iota validate` does for a tracked miner with
//!   `validation.replay.fraction: f`, through the same code ([`Replayer`], the run's default
//!   thresholds): decode the start state, adopt it, then for the first `ceil(f x items)` of
//!   the record ([`replay_count`]) check the hashes of the input and the miner's result,
//!   decode both, replay and compare; at `f = 1` also decode the miner's upload and compare
//!   its change with the replay's ([`compare_progress`]).
//! - Downloads are not timed (both sides move the same inputs; the validator also downloads
//!   the miner's results, about as many bytes again). Everything runs in this process, one
//!   after the other, on the same threads; rounds interleave the miner with every fraction and
//!   each figure is the median over rounds, in CPU time of the whole process (the sum over its
//!   threads, which a busy machine hardly changes) and in wall time.
//! - The replay's verdict is printed beside its cost: items failed, the smallest cosine, and
//!   the replayed step at which an item first fell short of the strict thresholds (the drift
//!   of a replay that is not bit-exact; see `validation.replay.strict_steps`).

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use burn::tensor::backend::AutodiffBackend;
use clap::Args;

use super::step::{Cost, Meter, median_cost};
use crate::api::{MinerSettings, ReplaySettings, SpotSettings, WorkKind};
use crate::codec::{MergeWire, Span, WireDtype, payload_hash, verify_hash};
use crate::compute::CachedInput;
use crate::compute::engine::{Activations, Engine, EngineSettings};
use crate::compute::payload::{decode_tensor, decode_tokens};
use crate::data::{DataSpec, Dataset, Tokenizer};
use crate::merge::FlatLayout;
use crate::model::backend::{BackendTask, DeviceKind, dispatch};
use crate::model::layout::section_layout;
use crate::model::{LrSchedule, ModelConfig, OptimizerConfig, Section};
use crate::validator::replay::{ReplayItem, Replayer, compare_progress, replay_count};
use crate::validator::spot::{checkable, prefix_len};

/// Arguments of `iota bench validate`.
#[derive(Debug, Args)]
pub struct BenchValidateArgs {
    /// Model preset.
    #[arg(long, value_name = "NAME", default_value = "tiny")]
    pub preset: String,
    /// Samples in the miner's epoch (the run config's default `batches_before_merging`).
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub samples: usize,
    /// Windows per sample (the run config's `batch_size`).
    #[arg(long, value_name = "B", default_value_t = 4)]
    pub batch_size: usize,
    /// Tokens per window (the run config's `seq_len`).
    #[arg(long, value_name = "L", default_value_t = 64)]
    pub seq_len: usize,
    /// Optimizer step every N backwards.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub local_steps: u64,
    /// Forwards ahead of their backwards.
    #[arg(long, value_name = "K", default_value_t = 4)]
    pub max_in_flight: usize,
    /// Encoding of activations and gradients.
    #[arg(long, value_name = "W", default_value = "bf16")]
    pub wire: WireDtype,
    /// Encoding of the merge upload.
    #[arg(long, value_name = "W", default_value = "f32")]
    pub merge_wire: MergeWire,
    /// Fractions of the miner's work the validator checks.
    #[arg(
        long,
        value_name = "F,..",
        value_delimiter = ',',
        default_value = "0.01,0.1,1"
    )]
    pub fractions: Vec<f64>,
    /// Sections to measure (default: every one).
    #[arg(long, value_name = "S,..", value_delimiter = ',')]
    pub sections: Vec<usize>,
    /// Rounds (each: the miner, then every fraction); figures are medians over rounds.
    #[arg(long, value_name = "R", default_value_t = 3)]
    pub rounds: usize,
    /// Compute threads (rayon pool; default: all cores).
    #[arg(long, value_name = "T")]
    pub threads: Option<usize>,
    /// Device.
    #[arg(long, value_name = "DEVICE", default_value = "cpu")]
    pub device: DeviceKind,
    /// Measure what replays catch instead: each section's epoch replayed with the miner's
    /// outputs as sent and as each cheat would send them (noise of their mean and spread,
    /// zeros, another sample's output, the input echoed); prints the honest items' lowest
    /// figures, each cheat's highest, the items each fails (overall and in the prefix every
    /// window replays, `validation.spot`), and that prefix's cost.
    #[arg(long)]
    pub spot: bool,
}

/// An encoded object with the hash the orchestrator would hand out with it.
#[derive(Debug, Clone)]
struct Object {
    bytes: Vec<u8>,
    hash: String,
}

impl Object {
    fn new(bytes: Vec<u8>) -> Self {
        let hash = payload_hash(&bytes);
        Self { bytes, hash }
    }
}

/// One piece of work as it sits in storage: what the miner read and what it wrote.
#[derive(Debug, Clone)]
struct Recorded {
    sample: u64,
    kind: WorkKind,
    /// Tokens `[batch, seq]` (head forwards) or a wire tensor `[batch, seq, width]`.
    input: Object,
    /// Tail forwards: the targets.
    targets: Option<Object>,
    /// Forwards of a section that re-embeds the token ids: the sample's input tokens.
    tokens: Option<Object>,
    /// The miner's result on the wire (`None`: the head's backward).
    output: Option<Object>,
    loss: Option<f32>,
}

/// Row of the table.
struct Row {
    section: usize,
    role: &'static str,
    items: usize,
    miner: Cost,
    checks: Vec<Check>,
}

struct Check {
    fraction: f64,
    items: usize,
    cost: Cost,
    failed: u64,
    min_cosine: Option<f64>,
    /// Replayed step at which an item first fell short of the strict thresholds.
    strict_miss: Option<u64>,
    state_cosine: Option<f64>,
}

struct Task {
    cfg: ModelConfig,
    args: BenchValidateArgs,
}

fn tokens_object(ids: &[u32], vocab: usize) -> Object {
    Object::new(crate::codec::token_ids::encode(ids, vocab))
}

fn tensor_object(shape: [usize; 3], data: &[f32], wire: WireDtype) -> anyhow::Result<Object> {
    Ok(Object::new(crate::codec::encode(&shape, data, wire)?))
}

impl Task {
    fn settings(&self) -> MinerSettings {
        let a = &self.args;
        MinerSettings {
            local_steps: a.local_steps.max(1),
            max_in_flight: a.max_in_flight.max(1),
            wire: a.wire,
            seq_len: a.seq_len,
            batch_size: a.batch_size,
            seed: 0,
            samples_per_step: 0,
            bottleneck_warmup: 0,
            optimizer: OptimizerConfig::default(),
            schedule: LrSchedule {
                total_steps: a.samples as u64,
                ..LrSchedule::default()
            },
            weight_stashing: true,
            lookahead: false,
            heartbeat_s: 10,
        }
    }

    fn engine<B: AutodiffBackend>(
        &self,
        index: usize,
        layout: &FlatLayout,
        start: &Object,
        device: &B::Device,
    ) -> anyhow::Result<Engine<B>> {
        let settings = self.settings();
        let section = Section::<B>::new(&self.cfg, index, 0, settings.optimizer, device)?;
        let mut engine = Engine::new(section, EngineSettings::for_miner(&settings));
        let n = layout.total_len() as u64;
        verify_hash(&start.bytes, &start.hash)?;
        let flat =
            self.args
                .merge_wire
                .decode(&start.bytes, n, Span::whole(layout.params_len), &[])?;
        engine
            .adopt_flat(layout, &flat, None)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(engine)
    }

    fn decode_input(
        &self,
        o: &Object,
        head_tokens: bool,
        tokens: Option<&Object>,
    ) -> anyhow::Result<CachedInput> {
        let tokens = tokens.map(|t| self.ids(t)).transpose()?;
        let (b, l) = (self.args.batch_size, self.args.seq_len);
        Ok(if head_tokens {
            CachedInput::Tokens {
                ids: self.ids(o)?,
                shape: [b, l],
            }
        } else {
            verify_hash(&o.bytes, &o.hash)?;
            let shape = [b, l, self.cfg.boundary_width()];
            CachedInput::Hidden {
                data: decode_tensor(&o.bytes, shape)?,
                shape,
                tokens,
            }
        })
    }

    /// The token ids of a token object (`[batch, seq]`), its hash checked.
    fn ids(&self, o: &Object) -> anyhow::Result<Vec<u32>> {
        verify_hash(&o.bytes, &o.hash)?;
        Ok(decode_tokens(
            &o.bytes,
            [self.args.batch_size, self.args.seq_len],
        )?)
    }

    /// A recorded item as a replay takes it: its input, the tail's targets and the miner's
    /// result (hashes checked), in section `head` or not.
    fn decode_item(&self, item: &Recorded, head: bool) -> anyhow::Result<Decoded> {
        let (b, l) = (self.args.batch_size, self.args.seq_len);
        let head_tokens = head && item.kind == WorkKind::Forward;
        let input = self.decode_input(&item.input, head_tokens, item.tokens.as_ref())?;
        let targets = item.targets.as_ref().map(|t| self.ids(t)).transpose()?;
        let output = match &item.output {
            Some(o) => {
                verify_hash(&o.bytes, &o.hash)?;
                Some(decode_tensor(&o.bytes, [b, l, self.cfg.boundary_width()])?)
            }
            None => None,
        };
        Ok((input, targets, output))
    }

    fn hidden(&self, o: &Object) -> anyhow::Result<Activations> {
        match self.decode_input(o, false, None)? {
            CachedInput::Hidden { data, shape, .. } => Ok(Activations { data, shape }),
            CachedInput::Tokens { .. } => anyhow::bail!("expected activations"),
        }
    }

    /// Every section's start state, as the checkpoint a miner adopts.
    fn starts<B: AutodiffBackend>(&self, device: &B::Device) -> anyhow::Result<Vec<Object>> {
        (0..self.cfg.n_sections())
            .map(|i| {
                let layout = section_layout(&self.cfg, i)?;
                let section =
                    Section::<B>::new(&self.cfg, i, 0, OptimizerConfig::default(), device)?;
                let flat = section.export_flat(&layout)?;
                let span = Span::whole(layout.params_len);
                Ok(Object::new(self.args.merge_wire.encode(
                    &flat,
                    span,
                    &[],
                )?))
            })
            .collect()
    }

    /// One epoch through the whole chain (see the module docs); each section's record and
    /// encoded upload.
    fn record<B: AutodiffBackend>(
        &self,
        starts: &[Object],
        device: &B::Device,
    ) -> anyhow::Result<Vec<(Vec<Recorded>, Object)>> {
        let n = self.cfg.n_sections();
        let (b, l) = (self.args.batch_size, self.args.seq_len);
        let wire = self.args.wire;
        let layouts = (0..n)
            .map(|i| section_layout(&self.cfg, i))
            .collect::<Result<Vec<_>, _>>()?;
        let mut engines = (0..n)
            .map(|i| self.engine::<B>(i, &layouts[i], &starts[i], device))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut records: Vec<Vec<Recorded>> = vec![Vec::new(); n];
        let data = Dataset::load(&DataSpec::default(), &Tokenizer::byte(), l, 0)?;
        // Each section's input gradient per sample, waiting for the section below's backward.
        let mut grads: Vec<HashMap<u64, Object>> = vec![HashMap::new(); n];
        let ahead = self.args.max_in_flight.max(1) as u64;
        let samples = self.args.samples as u64;
        let backward = |engines: &mut [Engine<B>],
                        records: &mut [Vec<Recorded>],
                        grads: &mut [HashMap<u64, Object>],
                        k: u64|
         -> anyhow::Result<()> {
            for i in (0..n - 1).rev() {
                let up = grads[i + 1]
                    .remove(&k)
                    .context("missing upstream gradient")?;
                let done = engines[i]
                    .backward(k, self.hidden(&up)?)
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                let output = match done.grad {
                    Some(g) => {
                        let o = tensor_object(g.shape, &g.data, wire)?;
                        grads[i].insert(k, o.clone());
                        Some(o)
                    }
                    None => None,
                };
                records[i].push(Recorded {
                    sample: k,
                    kind: WorkKind::Backward,
                    input: up,
                    targets: None,
                    tokens: None,
                    output,
                    loss: None,
                });
            }
            Ok(())
        };
        for s in 0..samples {
            let owned: Vec<_> = (0..b as u64)
                .map(|w| data.train_sample(s * b as u64 + w))
                .collect();
            let windows: Vec<&[u32]> = owned.iter().map(AsRef::as_ref).collect();
            let vocab = self.cfg.vocab_size;
            let sample_tokens = tokens_object(
                &windows
                    .iter()
                    .flat_map(|w| &w[..l])
                    .copied()
                    .collect::<Vec<_>>(),
                vocab,
            );
            let mut input = sample_tokens.clone();
            for (i, engine) in engines.iter_mut().enumerate() {
                let tokens = engine
                    .section()
                    .spec()
                    .reembed
                    .then(|| sample_tokens.clone());
                let decoded = self.decode_input(&input, i == 0, tokens.as_ref())?;
                if i + 1 == n {
                    let ids: Vec<u32> = windows.iter().flat_map(|w| &w[1..=l]).copied().collect();
                    let targets = tokens_object(&ids, vocab);
                    let done = engine
                        .train_tail(s, decoded, &ids, [b, l])
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                    let grad = tensor_object(done.grad.shape, &done.grad.data, wire)?;
                    grads[i].insert(s, grad.clone());
                    records[i].push(Recorded {
                        sample: s,
                        kind: WorkKind::Forward,
                        input: input.clone(),
                        targets: Some(targets),
                        tokens,
                        output: Some(grad),
                        loss: Some(done.loss),
                    });
                } else {
                    let f = engine
                        .forward(s, decoded)
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                    let out = tensor_object(f.output.shape, &f.output.data, wire)?;
                    records[i].push(Recorded {
                        sample: s,
                        kind: WorkKind::Forward,
                        input: std::mem::replace(&mut input, out.clone()),
                        targets: None,
                        tokens,
                        output: Some(out),
                        loss: None,
                    });
                }
            }
            if n > 1 && s + 1 >= ahead {
                backward(&mut engines, &mut records, &mut grads, s + 1 - ahead)?;
            }
        }
        if n > 1 {
            for k in samples.saturating_sub(ahead - 1)..samples {
                backward(&mut engines, &mut records, &mut grads, k)?;
            }
        }
        records
            .into_iter()
            .zip(engines)
            .zip(&layouts)
            .map(|((items, engine), layout)| {
                let flat = engine.section().export_flat(layout)?;
                let span = Span::whole(layout.params_len);
                Ok((
                    items,
                    Object::new(self.args.merge_wire.encode(&flat, span, &[])?),
                ))
            })
            .collect()
    }

    /// The miner's cost: its record done again from the start state (results encoded and
    /// dropped, the upload encoded at the end).
    fn redo<B: AutodiffBackend>(
        &self,
        index: usize,
        layout: &FlatLayout,
        start: &Object,
        items: &[Recorded],
        device: &B::Device,
    ) -> anyhow::Result<usize> {
        let mut engine = self.engine::<B>(index, layout, start, device)?;
        let head = engine.section().spec().is_head;
        let (b, l) = (self.args.batch_size, self.args.seq_len);
        let wire = self.args.wire;
        let mut bytes = 0;
        for item in items {
            let out = match (item.kind, &item.targets) {
                (WorkKind::Forward, Some(targets)) => {
                    let input = self.decode_input(&item.input, head, item.tokens.as_ref())?;
                    let t = self.ids(targets)?;
                    let done = engine
                        .train_tail(item.sample, input, &t, [b, l])
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                    Some(done.grad)
                }
                (WorkKind::Forward, None) => {
                    let input = self.decode_input(&item.input, head, item.tokens.as_ref())?;
                    let f = engine
                        .forward(item.sample, input)
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                    Some(f.output)
                }
                _ => {
                    engine
                        .backward(item.sample, self.hidden(&item.input)?)
                        .map_err(|e| anyhow::anyhow!("{e}"))?
                        .grad
                }
            };
            if let Some(a) = out {
                bytes += tensor_object(a.shape, &a.data, wire)?.bytes.len();
            }
        }
        let flat = engine.section().export_flat(layout)?;
        let upload = self
            .args
            .merge_wire
            .encode(&flat, Span::whole(layout.params_len), &[])?;
        Ok(bytes + upload.len())
    }

    /// The validator's check of the first `fraction` of `items`.
    #[allow(clippy::too_many_arguments)]
    fn check<B: AutodiffBackend>(
        &self,
        index: usize,
        layout: &FlatLayout,
        start: &Object,
        items: &[Recorded],
        upload: &Object,
        fraction: f64,
        device: &B::Device,
    ) -> anyhow::Result<Check> {
        let engine = self.engine::<B>(index, layout, start, device)?;
        let spec = engine.section().spec().clone();
        let mut replayer = Replayer::new(engine, ReplaySettings::default());
        let n = replay_count(items.len(), fraction);
        for item in &items[..n] {
            let (input, targets, output) = self.decode_item(item, spec.is_head)?;
            replayer.apply(ReplayItem {
                sample: item.sample,
                kind: item.kind,
                input,
                targets,
                output,
                loss: item.loss,
            })?;
        }
        let mut state_cosine = None;
        if n == items.len() {
            verify_hash(&upload.bytes, &upload.hash)?;
            let params = Span::whole(layout.params_len);
            let uploaded = self.args.merge_wire.decode(
                &upload.bytes,
                layout.total_len() as u64,
                params,
                &[],
            )?;
            let start_flat = self.args.merge_wire.decode(
                &start.bytes,
                layout.total_len() as u64,
                params,
                &[],
            )?;
            let replayed = replayer.export_flat(layout)?;
            let p = usize::try_from(layout.params_len)?;
            state_cosine = Some(compare_progress(&start_flat, &replayed, &uploaded, p).cosine);
        }
        let stats = replayer.stats();
        Ok(Check {
            fraction,
            items: n,
            cost: Cost::default(),
            failed: stats.failed,
            min_cosine: stats.min_cosine,
            strict_miss: stats.strict_miss_step,
            state_cosine,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn section<B: AutodiffBackend>(
        &self,
        index: usize,
        start: &Object,
        items: &[Recorded],
        upload: &Object,
        device: &B::Device,
    ) -> anyhow::Result<Row> {
        let layout = section_layout(&self.cfg, index)?;
        let spec = self.cfg.section(index)?;
        let mut miner = Vec::new();
        let mut checks: Vec<Vec<(Cost, Check)>> =
            self.args.fractions.iter().map(|_| Vec::new()).collect();
        for _ in 0..self.args.rounds.max(1) {
            let m = Meter::start();
            std::hint::black_box(self.redo::<B>(index, &layout, start, items, device)?);
            miner.push(m.stop());
            for (i, &f) in self.args.fractions.iter().enumerate() {
                let m = Meter::start();
                let check = self.check::<B>(index, &layout, start, items, upload, f, device)?;
                checks[i].push((m.stop(), check));
            }
        }
        let checks = checks
            .into_iter()
            .filter_map(|runs| {
                let cost = median_cost(&runs.iter().map(|(c, _)| *c).collect::<Vec<_>>());
                let (_, last) = runs.into_iter().last()?;
                Some(Check { cost, ..last })
            })
            .collect();
        Ok(Row {
            section: index,
            role: role_of(spec.is_head, spec.is_tail),
            items: items.len(),
            miner: median_cost(&miner),
            checks,
        })
    }
}

/// What the spot checks of one section measured: per variant of the miner's outputs (honest
/// first, then each cheat), the items compared, how many failed, and the extreme figures.
struct SpotRow {
    section: usize,
    role: &'static str,
    checkable: usize,
    variants: Vec<SpotVariant>,
    /// Items in one window's prefix replay, and its cost against the miner's whole epoch.
    sample: usize,
    sample_cost: Cost,
    miner: Cost,
}

struct SpotVariant {
    name: &'static str,
    items: u64,
    /// Failures among the items of one window's prefix.
    prefix_failed: u64,
    failed: u64,
    /// Honest: the lowest centred cosine; a cheat: the highest.
    cosine: Option<f64>,
    /// Honest: the lowest magnitude ratio; a cheat: the highest.
    ratio: Option<f64>,
}

/// The cheats a spot check must catch, applied to what the honest miner sent: noise of the
/// sent tensor's mean and spread, zeros, another sample's output, the input passed through
/// (scaled to the output's spread; body sections, whose input is as wide as their output).
const CHEATS: [&str; 4] = ["noise", "zeros", "other sample", "input echoed"];

fn mean_std(v: &[f32]) -> (f32, f32) {
    let n = v.len().max(1) as f64;
    let mean = v.iter().map(|x| f64::from(*x)).sum::<f64>() / n;
    let var = v
        .iter()
        .map(|x| (f64::from(*x) - mean).powi(2))
        .sum::<f64>()
        / n;
    (mean as f32, var.sqrt() as f32)
}

/// `honest` replaced by cheat `name` (`None`: the cheat does not apply to this item).
fn cheat(
    name: &str,
    honest: &[f32],
    other: Option<&[f32]>,
    input: &CachedInput,
    seed: u64,
) -> Option<Vec<f32>> {
    use rand::{RngExt, SeedableRng};
    let (mean, std) = mean_std(honest);
    match name {
        "noise" => {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            Some(
                (0..honest.len())
                    .map(|_| {
                        // Irwin-Hall: a sum of 12 uniforms, less 6, is close to N(0, 1).
                        let z: f32 = (0..12).map(|_| rng.random::<f32>()).sum::<f32>() - 6.0;
                        mean + std * z
                    })
                    .collect(),
            )
        }
        "zeros" => Some(vec![0.0; honest.len()]),
        "other sample" => other.map(<[f32]>::to_vec),
        "input echoed" => match input {
            CachedInput::Hidden { data, .. } if data.len() == honest.len() => {
                let (m, s) = mean_std(data);
                let k = if s > 0.0 { std / s } else { 0.0 };
                Some(data.iter().map(|x| mean + (x - m) * k).collect())
            }
            _ => None,
        },
        _ => None,
    }
}

impl Task {
    /// The replays of section `index` that every window runs (see [`BenchValidateArgs::spot`]).
    fn spot<B: AutodiffBackend>(
        &self,
        index: usize,
        start: &Object,
        items: &[Recorded],
        device: &B::Device,
    ) -> anyhow::Result<SpotRow> {
        let layout = section_layout(&self.cfg, index)?;
        let spec = self.cfg.section(index)?;
        let kinds: Vec<WorkKind> = items.iter().map(|i| i.kind).collect();
        let spot_settings = SpotSettings::default();
        let prefix = prefix_len(&kinds, spec.is_head, &spot_settings);
        let decoded: Vec<Decoded> = items
            .iter()
            .map(|item| self.decode_item(item, spec.is_head))
            .collect::<anyhow::Result<_>>()?;
        let mut variants = Vec::new();
        for name in std::iter::once("honest").chain(CHEATS) {
            let engine = self.engine::<B>(index, &layout, start, device)?;
            let mut replayer = Replayer::new(engine, ReplaySettings::default());
            let mut v = SpotVariant {
                name,
                items: 0,
                prefix_failed: 0,
                failed: 0,
                cosine: None,
                ratio: None,
            };
            let mut previous: HashMap<WorkKind, Vec<f32>> = HashMap::new();
            // Items the cheat changed (the input is echoed only where it is as wide as the
            // output: never at the head, whose input is token ids).
            let mut applied = 0usize;
            for (i, (item, (input, targets, honest))) in items.iter().zip(&decoded).enumerate() {
                let sent = match honest {
                    Some(h) if name != "honest" => {
                        let changed = cheat(
                            name,
                            h,
                            previous.get(&item.kind).map(Vec::as_slice),
                            input,
                            item.sample,
                        );
                        applied += usize::from(changed.is_some());
                        changed.or_else(|| Some(h.clone()))
                    }
                    other => other.clone(),
                };
                let checked = replayer.apply(ReplayItem {
                    sample: item.sample,
                    kind: item.kind,
                    input: input.clone(),
                    targets: targets.clone(),
                    output: sent,
                    loss: item.loss,
                })?;
                if let Some(h) = honest {
                    previous.insert(item.kind, h.clone());
                }
                let Some(s) = checked.similarity else {
                    continue;
                };
                v.items += 1;
                if checked.failure.is_some() {
                    v.failed += 1;
                    if i < prefix {
                        v.prefix_failed += 1;
                    }
                }
                let pick = |old: Option<f64>, new: f64| {
                    Some(old.map_or(new, |o| {
                        if name == "honest" {
                            o.min(new)
                        } else {
                            o.max(new)
                        }
                    }))
                };
                v.cosine = pick(v.cosine, s.cosine);
                v.ratio = pick(v.ratio, s.magnitude_ratio);
            }
            if name == "honest" || applied > 0 {
                variants.push(v);
            }
        }
        // One window's prefix replay from a fresh engine, against the miner's whole epoch.
        let mut costs = Vec::new();
        let mut miner = Vec::new();
        for _ in 0..self.args.rounds.max(1) {
            let m = Meter::start();
            std::hint::black_box(self.redo::<B>(index, &layout, start, items, device)?);
            miner.push(m.stop());
            let m = Meter::start();
            let engine = self.engine::<B>(index, &layout, start, device)?;
            let mut replayer = Replayer::new(engine, ReplaySettings::default());
            for (item, (input, targets, output)) in items.iter().zip(&decoded).take(prefix) {
                std::hint::black_box(replayer.apply(ReplayItem {
                    sample: item.sample,
                    kind: item.kind,
                    input: input.clone(),
                    targets: targets.clone(),
                    output: output.clone(),
                    loss: item.loss,
                })?);
            }
            costs.push(m.stop());
        }
        Ok(SpotRow {
            section: index,
            role: role_of(spec.is_head, spec.is_tail),
            checkable: kinds
                .iter()
                .filter(|k| checkable(**k, spec.is_head))
                .count(),
            variants,
            sample: prefix,
            sample_cost: median_cost(&costs),
            miner: median_cost(&miner),
        })
    }
}

fn role_of(head: bool, tail: bool) -> &'static str {
    match (head, tail) {
        (true, true) => "whole",
        (true, false) => "head",
        (false, true) => "tail",
        (false, false) => "body",
    }
}

/// One recorded item decoded: its input, targets (tail) and the miner's result.
type Decoded = (CachedInput, Option<Vec<u32>>, Option<Vec<f32>>);

/// What the benchmark measured.
enum Measured {
    Replays(Vec<Row>),
    Spots(Vec<SpotRow>),
}

impl BackendTask for Task {
    type Output = anyhow::Result<Measured>;

    fn run<B: AutodiffBackend>(self, device: B::Device) -> Self::Output {
        let starts = self.starts::<B>(&device)?;
        let records = self
            .record::<B>(&starts, &device)
            .context("training the epoch through the chain")?;
        let sections: Vec<usize> = if self.args.sections.is_empty() {
            (0..self.cfg.n_sections()).collect()
        } else {
            self.args.sections.clone()
        };
        if self.args.spot {
            return Ok(Measured::Spots(
                sections
                    .into_iter()
                    .map(|s| {
                        self.spot::<B>(s, &starts[s], &records[s].0, &device)
                            .with_context(|| format!("section {s}"))
                    })
                    .collect::<anyhow::Result<_>>()?,
            ));
        }
        Ok(Measured::Replays(
            sections
                .into_iter()
                .map(|s| {
                    let (items, upload) = &records[s];
                    self.section::<B>(s, &starts[s], items, upload, &device)
                        .with_context(|| format!("section {s}"))
                })
                .collect::<anyhow::Result<_>>()?,
        ))
    }
}

fn print_spots(rows: &[SpotRow]) {
    let r = ReplaySettings::default();
    println!(
        "\nreplays of every miner (thresholds: centred cosine >= {} and magnitude ratio >= {} \
         for the first {} steps, then >= {} and >= {}): each variant replays the whole epoch \
         with the miner's outputs replaced; honest = the lowest figures, a cheat = the highest",
        r.outputs.min_cosine,
        r.outputs.min_magnitude_ratio,
        r.strict_steps,
        r.late_outputs.min_cosine,
        r.late_outputs.min_magnitude_ratio
    );
    println!(
        "section  role  checkable | variant        compared  failed  in prefix  cosine     ratio    \
         | prefix items  validator CPU ms  miner CPU ms  validator/miner CPU"
    );
    for r in rows {
        for (k, v) in r.variants.iter().enumerate() {
            let cost = if k == 0 {
                format!(
                    "| {:>12} {:>17.1} {:>13.1} {:>20.4}",
                    r.sample,
                    ms(r.sample_cost.cpu),
                    ms(r.miner.cpu),
                    ms(r.sample_cost.cpu) / ms(r.miner.cpu).max(1e-9)
                )
            } else {
                "|".into()
            };
            println!(
                "{:>7}  {:<4} {:>9} | {:<13} {:>9} {:>7} {:>10}  {:<9} {:<9}{cost}",
                r.section,
                r.role,
                r.checkable,
                v.name,
                v.items,
                v.failed,
                v.prefix_failed,
                opt4(v.cosine),
                opt4(v.ratio),
            );
        }
    }
    println!(
        "\nprefix: the items of the epoch's start that a window replays for every miner \
         (validation.spot), and that replay's cost against the miner's cost of the whole epoch."
    );
}

fn opt4(v: Option<f64>) -> String {
    v.map_or("-".into(), |c| format!("{c:.4}"))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |c| format!("{c:.6}"))
}

/// Runs `iota bench validate`.
///
/// # Errors
/// Unknown preset or section, a fraction outside `(0, 1]`, a backend not compiled in, or a
/// failure while running.
pub fn run(args: BenchValidateArgs) -> anyhow::Result<()> {
    crate::cmd::mine::set_threads(args.threads)?;
    if let Some(f) = args
        .fractions
        .iter()
        .find(|f| !(f.is_finite() && **f > 0.0 && **f <= 1.0))
    {
        anyhow::bail!("--fractions: {f} is not in (0, 1]");
    }
    if args.samples == 0 {
        anyhow::bail!("--samples must be at least 1");
    }
    if !args.merge_wire.checked_by_validators() {
        anyhow::bail!(
            "--merge-wire {}: validators do not check that format (f32, bf16, int8 or a q4 format)",
            args.merge_wire
        );
    }
    let mut cfg = ModelConfig::preset(&args.preset)?;
    cfg.max_seq_len = cfg.max_seq_len.max(args.seq_len);
    if let Some(s) = args.sections.iter().find(|s| **s >= cfg.n_sections()) {
        anyhow::bail!(
            "--sections: {s} is not a section of {} ({} sections)",
            cfg.name,
            cfg.n_sections()
        );
    }
    println!(
        "iota bench validate: preset {}, {} samples of {} x {} tokens per miner epoch, \
         local_steps {}, max_in_flight {}, wire {}, merge wire {}, {} rounds, device {}, {} threads",
        cfg.name,
        args.samples,
        args.batch_size,
        args.seq_len,
        args.local_steps.max(1),
        args.max_in_flight.max(1),
        args.wire,
        args.merge_wire,
        args.rounds.max(1),
        args.device,
        rayon::current_num_threads()
    );
    let device = args.device;
    let rows = match dispatch(device, Task { cfg, args })
        .map_err(anyhow::Error::msg)?
        .context("running the benchmark")?
    {
        Measured::Spots(rows) => {
            print_spots(&rows);
            return Ok(());
        }
        Measured::Replays(rows) => rows,
    };
    println!(
        "\nsection  role  items  miner CPU ms  wall ms |     f  items  validator CPU ms  wall ms  \
         validator/miner CPU  wall | failed  min cosine  strict miss at step  state cosine"
    );
    for r in &rows {
        for c in &r.checks {
            println!(
                "{:>7}  {:<4} {:>6} {:>13.1} {:>8.1} | {:>4.0}% {:>6} {:>17.1} {:>8.1} {:>20.4} {:>5.4} | {:>6} {:>11} {:>20} {:>13}",
                r.section,
                r.role,
                r.items,
                ms(r.miner.cpu),
                ms(r.miner.wall),
                c.fraction * 100.0,
                c.items,
                ms(c.cost.cpu),
                ms(c.cost.wall),
                ms(c.cost.cpu) / ms(r.miner.cpu).max(1e-9),
                ms(c.cost.wall) / ms(r.miner.wall).max(1e-9),
                c.failed,
                opt(c.min_cosine),
                c.strict_miss.map_or("-".into(), |s| s.to_string()),
                opt(c.state_cosine),
            );
        }
    }
    println!(
        "\nvalidator/miner: the validator's cost to check the first f of the miner's items \
         (ceil(f x items), as `iota validate` with replay.fraction f), over the miner's cost \
         of doing them all; at f = 100% the check includes the upload against the replay."
    );
    Ok(())
}
