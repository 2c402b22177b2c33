//! The flags that name a trained model (`--checkpoint`, `--config`, `--tokenizer`, `--wire`),
//! shared by `iota generate`, `iota eval` and `iota export`, and their resolution into weights
//! and the tokenizer they were trained with.
//!
//! `--checkpoint PATH` is one of:
//! - an `iota train --out` directory (`checkpoint.json` + `model.safetensors`), with
//!   `--config` the `iota train --config` file it was trained with (its data settings);
//! - an `iota local --dir` directory (`run.yaml`): the newest merged checkpoint of the run in
//!   its local object store;
//! - a folder of section checkpoints (`0/flat`, `1/flat`, ...; or folders of epochs holding
//!   them), read as the model of the run config `--config`;
//! - a run's checkpoints in a bucket, `s3://bucket/.../runs/RUN/checkpoints` with `--config`:
//!   the newest complete epoch is copied to the cache first (`crate::mirror`). An
//!   `iota local --dir` whose run stores in a bucket is read the same way.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;

use super::train::TrainFile;
use crate::codec::WireDtype;
use crate::data::{DataSpec, StreamSettings, Tokenizer};
use crate::infer::Weights;
use crate::infer::load::{from_section_dir, from_train_dir, holds_sections};
use crate::mirror;
use crate::model::checkpoint;
use crate::orchestrator::RunConfig;

/// The run config `iota local` writes into its `--dir`.
const LOCAL_CONFIG: &str = "run.yaml";

/// Flags naming a trained model.
#[derive(Debug, Args)]
pub struct ModelSource {
    /// The trained model: an `iota train --out` directory, an `iota local --dir` directory,
    /// a folder of section checkpoints (with --config), or a run's checkpoints in a bucket,
    /// `s3://bucket/.../runs/RUN/checkpoints` (with --config).
    #[arg(long, value_name = "PATH")]
    pub checkpoint: PathBuf,
    /// Run config (YAML) whose model a folder of section checkpoints holds; for an
    /// `iota local --dir` its `run.yaml` is read without it. With an `iota train --out`
    /// checkpoint: the `iota train --config` file it was trained with (its `data` section:
    /// the tokenizer, and for `iota eval` the source and `stream`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// HF tokenizer.json the model was trained with (default: the run config's, else the
    /// built-in byte-level tokenizer).
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Encoding of tensors crossing section boundaries (f32, bf16, int8); default: the run
    /// config's `wire`, else bf16 (`iota train`'s default).
    #[arg(long, value_name = "DTYPE")]
    pub wire: Option<WireDtype>,
}

/// A trained model ready to be built on a device.
#[derive(Debug)]
pub struct Trained {
    /// Every section's parameters.
    pub weights: Weights,
    /// The tokenizer it was trained with.
    pub tokenizer: Tokenizer,
    /// Boundary encoding.
    pub wire: WireDtype,
    /// The data of the run, when the model came with a run config (`--config`, or an
    /// `iota local --dir`'s `run.yaml`).
    pub run_data: Option<RunData>,
}

/// The `data` section of the run config a model came with.
#[derive(Clone, Debug)]
pub struct RunData {
    /// `data.source`, with its `data.text_column` (`None`: an `iota train` config that names
    /// no source).
    pub source: Option<DataSpec>,
    /// `data.stream`: the run read raw shards in the block layout.
    pub stream: Option<StreamSettings>,
}

/// Where the weights and their model config are.
enum Layout {
    Train,
    Sections {
        dir: PathBuf,
        config: Box<RunConfig>,
    },
}

/// Whether `path` is an `iota local --dir` directory (it holds the run's `run.yaml`).
pub fn is_local_dir(path: &Path) -> bool {
    path.join(LOCAL_CONFIG).is_file()
}

/// The `data` section of the `iota train --config` file `path`: its tokenizer, and the source
/// (with its text column) and stream settings.
fn train_data(path: &Path) -> anyhow::Result<(Option<PathBuf>, RunData)> {
    let file = TrainFile::load(path).context(
        "--config with an `iota train --out` checkpoint is the `iota train --config` file it \
         was trained with",
    )?;
    let data = file.data;
    let source = data
        .source
        .as_deref()
        .map(|text| {
            text.parse::<DataSpec>()
                .and_then(|spec| spec.with_text_column(data.text_column.as_deref()))
                .with_context(|| format!("{}: data.source {text}", path.display()))
        })
        .transpose()?;
    Ok((
        data.tokenizer,
        RunData {
            source,
            stream: data.stream,
        },
    ))
}

fn run_config(path: &Path) -> anyhow::Result<RunConfig> {
    RunConfig::load(path).with_context(|| format!("run config {}", path.display()))
}

/// Where a run config's object store keeps the run's checkpoints: its local directory, or a
/// copy of the newest complete epoch out of its bucket.
fn checkpoints_dir(config: &RunConfig) -> anyhow::Result<PathBuf> {
    let url = &config.storage.url;
    if url.starts_with("s3://") {
        let checkpoints = format!(
            "{}/runs/{}/checkpoints",
            url.trim_end_matches('/'),
            config.run
        );
        return from_bucket(&checkpoints, config);
    }
    if url.contains("://") && !url.starts_with("file://") {
        bail!(
            "run {:?} stores its checkpoints in {url}, which iota cannot read back",
            config.run
        );
    }
    Ok(PathBuf::from(url.trim_start_matches("file://"))
        .join("runs")
        .join(&config.run)
        .join("checkpoints"))
}

/// Copies the newest complete checkpoint under `url` (a run's `checkpoints` prefix) for the
/// model of `config` into the cache, with the run's own endpoint and keys where its storage
/// is S3, else the AWS variables.
fn from_bucket(url: &str, config: &RunConfig) -> anyhow::Result<PathBuf> {
    Ok(mirror::fetch_checkpoint_to_cache(
        url,
        Some(&config.storage),
        config.model.n_sections(),
    )?)
}

fn layout(source: &ModelSource) -> anyhow::Result<Layout> {
    let path = &source.checkpoint;
    if let Some(url) = path.to_str().filter(|p| p.starts_with("s3://")) {
        let Some(file) = &source.config else {
            bail!(
                "--checkpoint {url}: section checkpoints in a bucket need the run's config (--config run.yaml)"
            );
        };
        let config = run_config(file)?;
        return Ok(Layout::Sections {
            dir: from_bucket(url, &config)?,
            config: Box::new(config),
        });
    }
    if !path.is_dir() {
        bail!("--checkpoint {}: no such directory", path.display());
    }
    if checkpoint::exists(path) {
        return Ok(Layout::Train);
    }
    if let Some(file) = &source.config {
        return Ok(Layout::Sections {
            dir: path.clone(),
            config: Box::new(run_config(file)?),
        });
    }
    let local = path.join(LOCAL_CONFIG);
    if local.is_file() {
        let config = run_config(&local)?;
        let dir = checkpoints_dir(&config)?;
        if !holds_sections(&dir) {
            bail!(
                "--checkpoint {}: the run {:?} has no merged checkpoint yet (nothing in {})",
                path.display(),
                config.run,
                dir.display()
            );
        }
        return Ok(Layout::Sections {
            dir,
            config: Box::new(config),
        });
    }
    if holds_sections(path) {
        bail!(
            "--checkpoint {}: section checkpoints without a model config; pass the run's \
             config with --config run.yaml",
            path.display()
        );
    }
    bail!(
        "--checkpoint {}: no checkpoint found (expected {} from `iota train --out`, {LOCAL_CONFIG} \
         from `iota local --dir`, or section folders 0/flat, 1/flat, ...)",
        path.display(),
        checkpoint::META_FILE
    )
}

/// Finds and reads the model `source` names and the tokenizer it was trained with.
///
/// # Errors
/// One line naming what is missing or wrong: no such directory, no checkpoint, a missing
/// section, weights that do not fit the config, or a tokenizer that is not the model's.
pub fn open(source: &ModelSource) -> anyhow::Result<Trained> {
    let (weights, tokenizer_path, wire, run_data) = match layout(source)? {
        Layout::Train => {
            let file = source.config.as_deref().map(train_data).transpose()?;
            let tokenizer = file.as_ref().and_then(|(tokenizer, _)| tokenizer.clone());
            (
                from_train_dir(&source.checkpoint)?,
                source.tokenizer.clone().or(tokenizer),
                source.wire.unwrap_or(WireDtype::Bf16),
                file.map(|(_, data)| data),
            )
        }
        Layout::Sections { dir, config } => (
            from_section_dir(&dir, &config.model, config.seq_len)?,
            source.tokenizer.clone().or(config.data.tokenizer.clone()),
            source.wire.unwrap_or(config.wire),
            Some(RunData {
                source: Some(config.data.source.clone()),
                stream: config.data.stream,
            }),
        ),
    };
    let tokenizer = Tokenizer::load(tokenizer_path.as_deref()).context("loading the tokenizer")?;
    if let Some(trained) = &weights.tokenizer
        && *trained != tokenizer.fingerprint()
    {
        bail!(
            "the tokenizer ({}) is not the one the model was trained with ({trained}); pass that \
             one with --tokenizer",
            tokenizer.fingerprint()
        );
    }
    if tokenizer.vocab_size() > weights.model.vocab_size {
        bail!(
            "the tokenizer has {} tokens but the model's vocabulary holds {}; pass the model's \
             tokenizer with --tokenizer",
            tokenizer.vocab_size(),
            weights.model.vocab_size
        );
    }
    Ok(Trained {
        weights,
        tokenizer,
        wire,
        run_data,
    })
}
