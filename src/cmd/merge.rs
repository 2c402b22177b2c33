//! `iota merge`: merge safetensors checkpoints offline, tensor by tensor.
//!
//! Uses the same operators as the network's butterfly merge ([`crate::merge`]), so a merge
//! can be reproduced, or a set of miners' checkpoints combined, on one machine.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use crate::merge::{MergeError, MergeOp, merge_partition};

/// Arguments of `iota merge`.
#[derive(Debug, Args)]
pub struct MergeArgs {
    /// Merge operator: mean, geometric, median, trimmed (20% cut at each end) or trimmed:F.
    #[arg(long, default_value = "mean", value_name = "OP")]
    pub op: MergeOp,
    /// One weight per input file, comma-separated (e.g. backward passes done). Default: equal.
    ///
    /// Mean and geometric mean use the weights' sizes; median and trimmed mean only drop the
    /// inputs whose weight is 0.
    #[arg(long, value_delimiter = ',', value_name = "W1,W2,..")]
    pub weights: Vec<f32>,
    /// Where to write the merged checkpoint (F32 tensors; replaced atomically if it exists).
    #[arg(
        short,
        long,
        value_name = "OUT.safetensors",
        required_unless_present = "status"
    )]
    pub output: Option<PathBuf>,
    /// The checkpoints to merge (at least two), with identical tensor names and shapes.
    /// F32, BF16 and F16 tensors are accepted.
    #[arg(
        required_unless_present = "status",
        num_args = 2..,
        value_name = "INPUT.safetensors"
    )]
    pub inputs: Vec<PathBuf>,
    /// Instead of merging files, show the progress of a network's current merge.
    #[arg(
        long,
        requires = "orchestrator",
        conflicts_with_all = ["output", "inputs", "weights"]
    )]
    pub status: bool,
    /// Orchestrator URL for `--status`.
    #[arg(long, value_name = "URL")]
    pub orchestrator: Option<String>,
    /// With `--status`: print the raw JSON document.
    #[arg(long)]
    pub json: bool,
}

/// Runs `iota merge`: reads every input, merges each tensor and writes the result.
///
/// The inputs are held in memory whole, plus the merged output in `f32`: fine for the
/// checkpoints of one section or a small model, which is what this offline tool is for.
/// The `__metadata__` of the first input is copied to the output.
///
/// # Errors
/// An unreadable or malformed file; fewer than two inputs; a weight count that differs from
/// the file count; a tensor missing from (or extra in) one file, or with another shape; a
/// dtype other than F32/BF16/F16; a non-finite value (the file, tensor and element are named);
/// an output that cannot be written.
pub fn run(args: MergeArgs) -> anyhow::Result<()> {
    if args.status {
        let url = args
            .orchestrator
            .as_deref()
            .context("--status needs --orchestrator URL")?;
        return super::merge_status::run(url, args.json);
    }
    if args.orchestrator.is_some() || args.json {
        bail!("--orchestrator and --json only go with --status");
    }
    let output = args
        .output
        .as_deref()
        .context("-o OUT.safetensors is required")?;
    let summary = merge_files(&args.inputs, args.op, &args.weights, output)?;
    println!(
        "merged {} tensors ({} values) from {} files with {} into {}",
        summary.tensors,
        summary.values,
        args.inputs.len(),
        args.op,
        output.display()
    );
    Ok(())
}

/// What [`merge_files`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Summary {
    tensors: usize,
    values: usize,
}

/// Merges `inputs` with `op` and `weights` (empty: equal weights) into `output`.
fn merge_files(
    inputs: &[PathBuf],
    op: MergeOp,
    weights: &[f32],
    output: &Path,
) -> anyhow::Result<Summary> {
    if inputs.len() < 2 {
        bail!(
            "iota merge needs at least 2 input files, got {}",
            inputs.len()
        );
    }
    let weights = if weights.is_empty() {
        vec![1.0; inputs.len()]
    } else if weights.len() != inputs.len() {
        bail!(
            "--weights has {} values but {} input files were given",
            weights.len(),
            inputs.len()
        );
    } else {
        weights.to_vec()
    };
    let buffers = inputs
        .iter()
        .map(|path| fs::read(path).with_context(|| format!("reading {}", path.display())))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let files = inputs
        .iter()
        .zip(&buffers)
        .map(|(path, buffer)| {
            SafeTensors::deserialize(buffer)
                .with_context(|| format!("{}: not a valid safetensors file", path.display()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (first_path, first, first_buffer) = match (inputs.first(), files.first(), buffers.first()) {
        (Some(p), Some(f), Some(b)) => (p, f, b),
        _ => bail!("iota merge needs at least 2 input files"),
    };
    let metadata = SafeTensors::read_metadata(first_buffer)
        .with_context(|| format!("{}: reading its header", first_path.display()))?
        .1
        .metadata()
        .clone();
    let names: BTreeSet<&str> = first.names().into_iter().collect();
    for (path, file) in inputs.iter().zip(&files).skip(1) {
        check_same_names(&names, first_path, path, file)?;
    }

    let mut merged: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::with_capacity(names.len());
    let mut values = 0;
    for name in &names {
        let mut contributors = Vec::with_capacity(files.len());
        let mut shape: Option<Vec<usize>> = None;
        for (path, file) in inputs.iter().zip(&files) {
            let view = file
                .tensor(name)
                .with_context(|| format!("{}: reading tensor {name}", path.display()))?;
            match &shape {
                None => shape = Some(view.shape().to_vec()),
                Some(expected) if expected.as_slice() != view.shape() => bail!(
                    "{}: tensor {name} has shape {:?}, but {} has {:?}",
                    path.display(),
                    view.shape(),
                    first_path.display(),
                    expected
                ),
                Some(_) => {}
            }
            contributors
                .push(to_f32(&view).with_context(|| format!("{}: tensor {name}", path.display()))?);
        }
        let refs: Vec<&[f32]> = contributors.iter().map(Vec::as_slice).collect();
        let result = merge_partition(op, &refs, &weights).map_err(|err| match err {
            MergeError::NonFinite { contributor, index } => anyhow::anyhow!(
                "{}: tensor {name} has a non-finite value at element {index}",
                inputs.get(contributor).map_or_else(
                    || format!("input {contributor}"),
                    |p| p.display().to_string()
                )
            ),
            other => anyhow::Error::new(other).context(format!("merging tensor {name}")),
        })?;
        values += result.len();
        let bytes = result.iter().flat_map(|v| v.to_le_bytes()).collect();
        merged.push((name.to_string(), shape.unwrap_or_default(), bytes));
    }

    write_f32_file(&merged, metadata, output)?;
    Ok(Summary {
        tensors: merged.len(),
        values,
    })
}

/// Fails, naming the file and the tensor, unless `file` holds exactly `names`.
fn check_same_names(
    names: &BTreeSet<&str>,
    first_path: &Path,
    path: &Path,
    file: &SafeTensors<'_>,
) -> anyhow::Result<()> {
    let other: BTreeSet<&str> = file.names().into_iter().collect();
    if let Some(missing) = names.difference(&other).next() {
        bail!(
            "{}: tensor {missing} is missing (it is in {})",
            path.display(),
            first_path.display()
        );
    }
    if let Some(extra) = other.difference(names).next() {
        bail!(
            "{}: tensor {extra} is not in {}",
            path.display(),
            first_path.display()
        );
    }
    Ok(())
}

/// Decodes an F32, BF16 or F16 tensor (little-endian, as safetensors stores them) to `f32`.
fn to_f32(view: &TensorView<'_>) -> anyhow::Result<Vec<f32>> {
    let data = view.data();
    let values = match view.dtype() {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => bail!("dtype {other:?} cannot be merged (only F32, BF16 and F16)"),
    };
    Ok(values)
}

/// Writes `(name, shape, f32 little-endian bytes)` tensors and `metadata` to `output`.
fn write_f32_file(
    tensors: &[(String, Vec<usize>, Vec<u8>)],
    metadata: Option<HashMap<String, String>>,
    output: &Path,
) -> anyhow::Result<()> {
    let views = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(Dtype::F32, shape.clone(), bytes)
                .map(|view| (name.as_str(), view))
                .with_context(|| format!("building output tensor {name}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    safetensors::serialize_to_file(views, metadata, output)
        .with_context(|| format!("writing {}", output.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::{Cli, Command};
    use clap::Parser;

    type Tensor = (&'static str, Dtype, Vec<usize>, Vec<u8>);

    fn f32_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn bf16_bytes(values: &[f32]) -> Vec<u8> {
        values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect()
    }

    fn f16_bytes(values: &[f32]) -> Vec<u8> {
        values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect()
    }

    fn write(dir: &Path, file: &str, tensors: &[Tensor], meta: Option<(&str, &str)>) -> PathBuf {
        let path = dir.join(file);
        let views: Vec<(&str, TensorView<'_>)> = tensors
            .iter()
            .map(|(name, dtype, shape, bytes)| {
                (
                    *name,
                    TensorView::new(*dtype, shape.clone(), bytes).unwrap(),
                )
            })
            .collect();
        let meta = meta.map(|(k, v)| HashMap::from([(k.to_string(), v.to_string())]));
        safetensors::serialize_to_file(views, meta, &path).unwrap();
        path
    }

    /// Reads `name` from a written F32 file as (shape, values).
    fn read(path: &Path, name: &str) -> (Vec<usize>, Vec<f32>) {
        let buffer = fs::read(path).unwrap();
        let file = SafeTensors::deserialize(&buffer).unwrap();
        let view = file.tensor(name).unwrap();
        assert_eq!(view.dtype(), Dtype::F32);
        (view.shape().to_vec(), to_f32(&view).unwrap())
    }

    fn two_tensor_file(dir: &Path, file: &str, w: [f32; 4], b: [f32; 2]) -> PathBuf {
        write(
            dir,
            file,
            &[
                ("layer.weight", Dtype::F32, vec![2, 2], f32_bytes(&w)),
                ("layer.bias", Dtype::F32, vec![2], f32_bytes(&b)),
            ],
            Some(("format", "pt")),
        )
    }

    #[test]
    fn weighted_mean_of_two_files_end_to_end() {
        let dir = tempfile::tempdir().unwrap();
        let a = two_tensor_file(
            dir.path(),
            "a.safetensors",
            [1.0, 2.0, 3.0, 4.0],
            [0.0, 8.0],
        );
        let b = two_tensor_file(
            dir.path(),
            "b.safetensors",
            [5.0, 6.0, 7.0, 8.0],
            [4.0, 0.0],
        );
        let out = dir.path().join("out.safetensors");
        let cli = Cli::try_parse_from([
            "iota".as_ref(),
            "merge".as_ref(),
            "--weights".as_ref(),
            "1,3".as_ref(),
            "-o".as_ref(),
            out.as_os_str(),
            a.as_os_str(),
            b.as_os_str(),
        ])
        .unwrap();
        crate::cmd::run(cli).unwrap();
        // (1*a + 3*b) / 4.
        let (shape, w) = read(&out, "layer.weight");
        assert_eq!(shape, vec![2, 2]);
        assert_eq!(w, vec![4.0, 5.0, 6.0, 7.0]);
        let (shape, bias) = read(&out, "layer.bias");
        assert_eq!(shape, vec![2]);
        assert_eq!(bias, vec![3.0, 2.0]);
        let buffer = fs::read(&out).unwrap();
        let (_, header) = SafeTensors::read_metadata(&buffer).unwrap();
        assert_eq!(
            header.metadata().as_ref().and_then(|m| m.get("format")),
            Some(&"pt".to_string())
        );
    }

    #[test]
    fn mixed_dtypes_with_median() {
        // Values exactly representable in bf16 and f16, so the expected median is exact.
        let dir = tempfile::tempdir().unwrap();
        let t = |dtype, bytes| [("x", dtype, vec![3], bytes)];
        let a = write(
            dir.path(),
            "a",
            &t(Dtype::F32, f32_bytes(&[1.0, -2.0, 10.0])),
            None,
        );
        let b = write(
            dir.path(),
            "b",
            &t(Dtype::BF16, bf16_bytes(&[3.0, 0.5, -4.0])),
            None,
        );
        let c = write(
            dir.path(),
            "c",
            &t(Dtype::F16, f16_bytes(&[2.0, 1.5, 0.25])),
            None,
        );
        let out = dir.path().join("out");
        let summary = merge_files(&[a, b, c], MergeOp::Median, &[], &out).unwrap();
        assert_eq!(
            summary,
            Summary {
                tensors: 1,
                values: 3
            }
        );
        assert_eq!(read(&out, "x").1, vec![2.0, 0.5, 0.25]);
    }

    fn error_of(inputs: &[PathBuf], weights: &[f32], out: &Path) -> String {
        format!(
            "{:#}",
            merge_files(inputs, MergeOp::Mean, weights, out).unwrap_err()
        )
    }

    #[test]
    fn mismatches_name_the_file_and_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let out = d.join("out");
        let a = two_tensor_file(d, "a.st", [1.0; 4], [1.0; 2]);
        let only_weight = [("layer.weight", Dtype::F32, vec![2, 2], f32_bytes(&[1.0; 4]))];
        let missing = write(d, "missing.st", &only_weight, None);
        let err = error_of(&[a.clone(), missing], &[], &out);
        assert!(
            err.contains("missing.st") && err.contains("layer.bias is missing"),
            "{err}"
        );

        let extra = write(
            d,
            "extra.st",
            &[
                ("layer.weight", Dtype::F32, vec![2, 2], f32_bytes(&[1.0; 4])),
                ("layer.bias", Dtype::F32, vec![2], f32_bytes(&[1.0; 2])),
                ("layer.extra", Dtype::F32, vec![1], f32_bytes(&[1.0])),
            ],
            None,
        );
        let err = error_of(&[a.clone(), extra], &[], &out);
        assert!(
            err.contains("extra.st") && err.contains("layer.extra is not in"),
            "{err}"
        );

        let reshaped = write(
            d,
            "reshaped.st",
            &[
                ("layer.weight", Dtype::F32, vec![4], f32_bytes(&[1.0; 4])),
                ("layer.bias", Dtype::F32, vec![2], f32_bytes(&[1.0; 2])),
            ],
            None,
        );
        let err = error_of(&[a.clone(), reshaped], &[], &out);
        assert!(
            err.contains("reshaped.st") && err.contains("layer.weight has shape [4]"),
            "{err}"
        );
        assert!(!out.exists(), "no output is written on error");
    }

    #[test]
    fn bad_inputs_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let out = d.join("out");
        let a = two_tensor_file(d, "a.st", [1.0; 4], [1.0; 2]);
        let b = two_tensor_file(d, "b.st", [1.0; 4], [1.0; 2]);

        let err = error_of(&[a.clone(), b.clone()], &[1.0], &out);
        assert!(
            err.contains("--weights has 1 values but 2 input files"),
            "{err}"
        );

        let err = error_of(std::slice::from_ref(&a), &[], &out);
        assert!(err.contains("at least 2"), "{err}");

        let nan = two_tensor_file(d, "nan.st", [1.0, f32::NAN, 1.0, 1.0], [1.0; 2]);
        let err = error_of(&[a.clone(), nan], &[], &out);
        assert!(
            err.contains("nan.st: tensor layer.weight has a non-finite value at element 1"),
            "{err}"
        );

        let ints = write(
            d,
            "ints.st",
            &[("x", Dtype::I32, vec![1], vec![0; 4])],
            None,
        );
        let err = error_of(&[ints.clone(), ints], &[], &out);
        assert!(
            err.contains("ints.st: tensor x") && err.contains("I32"),
            "{err}"
        );

        fs::write(d.join("junk.st"), b"not a safetensors file").unwrap();
        let err = error_of(&[a.clone(), d.join("junk.st")], &[], &out);
        assert!(
            err.contains("junk.st: not a valid safetensors file"),
            "{err}"
        );

        let err = error_of(&[a, d.join("absent.st")], &[], &out);
        assert!(
            err.contains("reading") && err.contains("absent.st"),
            "{err}"
        );

        let err = error_of(&[b.clone(), b], &[0.0, 0.0], &out);
        assert!(
            err.contains("merging tensor") && err.contains("all weights are zero"),
            "{err}"
        );
    }

    // Irrefutable while `merge` is the only subcommand; stays correct when others are added.
    #[allow(irrefutable_let_patterns)]
    #[test]
    fn command_line_parsing() {
        let parsed =
            Cli::try_parse_from(["iota", "merge", "--op", "trimmed:0.1", "-o", "o", "a", "b"])
                .unwrap();
        let Command::Merge(args) = parsed.command else {
            panic!("expected the merge subcommand");
        };
        assert_eq!(args.op, MergeOp::Trimmed { fraction: 0.1 });
        assert!(args.weights.is_empty());
        assert_eq!(args.inputs, vec![PathBuf::from("a"), PathBuf::from("b")]);

        assert!(Cli::try_parse_from(["iota", "merge", "-o", "o", "a"]).is_err());
        assert!(
            Cli::try_parse_from(["iota", "merge", "--op", "avg", "-o", "o", "a", "b"]).is_err()
        );
        assert!(Cli::try_parse_from(["iota", "merge", "a", "b"]).is_err());

        let parsed = Cli::try_parse_from([
            "iota",
            "merge",
            "--status",
            "--orchestrator",
            "http://127.0.0.1:8700",
        ])
        .unwrap();
        let Command::Merge(args) = parsed.command else {
            panic!("expected the merge subcommand");
        };
        assert!(args.status && args.output.is_none());
        assert!(Cli::try_parse_from(["iota", "merge", "--status"]).is_err());
        assert!(
            Cli::try_parse_from([
                "iota",
                "merge",
                "--status",
                "--orchestrator",
                "http://x",
                "a",
                "b"
            ])
            .is_err()
        );
    }
}
