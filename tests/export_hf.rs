//! `iota export --hf` end to end: `tiny` models trained for a few steps by the real binary,
//! exported, and loaded by Hugging Face `transformers` (PyPI's, in a venv) with
//! `AutoModelForCausalLM` and `AutoTokenizer`. On the same held-out windows its logits equal
//! those of iota's [`Chain`] (the code `iota generate` and `iota eval` run), its mean loss
//! equals `iota eval`'s, one token at a time through its cache it gives the whole window's
//! logits, greedy generation gives `iota generate --temperature 0`'s text, and its tokenizer
//! gives iota's ids. Four models: `tiny` with re-embedding (three sections, bottlenecks, the
//! token ids re-embedded after each boundary, bf16 boundaries), one with the two-layer
//! boundary decoders (`bottleneck_decoder: mlp`) and without re-embedding, with f32
//! boundaries and a trained BPE tokenizer, and two that plain Llama runs without model code:
//! one section, and three sections without bottleneck or re-embedding crossing as f32. Bad
//! input gets one line and writes nothing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

mod common;

use burn::tensor::{Int, Tensor, TensorData};
use common::cli::{iota, ok, one_line_failure, s};
use common::venv;
use iota::codec::WireDtype;
use iota::data::{DataSpec, Dataset, Tokenizer};
use iota::infer::Chain;
use iota::infer::load::from_train_dir;
use iota::model::backend::Cpu;

/// Tokens per training window.
const SEQ: usize = 32;
/// Held-out windows compared.
const WINDOWS: usize = 8;
/// Tokens greedy generation adds.
const NEW_TOKENS: usize = 12;
/// Texts whose ids the two tokenizers must agree on (multi-byte characters, NUL, the
/// byte-level symbol of byte 0).
const TEXTS: [&str; 4] = [
    "the quick brown fox, jumps!",
    "h\u{e9}llo w\u{f6}rld: \u{65e5}\u{672c}\u{8a9e} \u{1f980}\n\n  x",
    "nul \u{0} and \u{100}",
    "abc,;.!xyz",
];

/// This process's folder for models and exports.
fn root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| common::procs::process_dir("export_hf"))
}

/// The venv's python, made once for all tests.
fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| venv::python("tests/export_hf/requirements.txt", "export-hf"))
}

/// `iota train` for 30 steps into `root/name` with the run config (YAML) `config`; `extra`
/// flags after.
fn train(name: &str, config: &str, extra: &[&str]) -> PathBuf {
    let out = root().join(name);
    let config_file = root().join(format!("{name}.yaml"));
    std::fs::write(&config_file, config).unwrap();
    let mut args = vec!["train", "--config", s(&config_file)];
    let seq = SEQ.to_string();
    args.extend([
        "--steps",
        "30",
        "--batch-size",
        "8",
        "--seq-len",
        &seq,
        "--lr",
        "0.005",
        "--eval-every",
        "0",
        "--quiet",
        "--out",
        s(&out),
    ]);
    args.extend_from_slice(extra);
    ok(&args);
    out
}

/// What the Hugging Face side reported (tests/export_hf/check.py).
#[derive(serde::Deserialize)]
struct Report {
    class: String,
    missing: Vec<String>,
    unexpected: Vec<String>,
    logits: Vec<f32>,
    loss: f64,
    cached_max_diff: f64,
    ids: Vec<Vec<u32>>,
    decoded: Vec<String>,
    prompt_ids: Vec<u32>,
    generated: Vec<u32>,
}

/// Exports `checkpoint` (with `flags`: `--wire`, `--tokenizer`), loads it in Python and
/// compares it with iota. Returns the largest logit difference and the loss difference.
fn export_and_compare(
    checkpoint: &Path,
    flags: &[&str],
    wire: WireDtype,
    tokenizer: &Tokenizer,
    class: &str,
) -> (f32, f64) {
    let out = checkpoint.with_extension("hf");
    let mut args = vec!["export", "--hf", s(&out), "--checkpoint", s(checkpoint)];
    args.extend_from_slice(flags);
    let printed = String::from_utf8(ok(&args).stdout).unwrap();
    assert!(printed.contains(class), "{printed}");
    let remote = class != "LlamaForCausalLM";
    assert_eq!(out.join("modeling_iota.py").exists(), remote, "{printed}");

    // iota's side: the held-out windows `iota eval` scores, and the chain's logits on them.
    let weights = from_train_dir(checkpoint).unwrap();
    let chain = Chain::<Cpu>::new(&weights, wire, &Default::default()).unwrap();
    let data = Dataset::load(&"synthetic".parse::<DataSpec>().unwrap(), tokenizer, SEQ, 0).unwrap();
    let windows: Vec<Vec<u32>> = (0..WINDOWS).map(|i| data.eval_sample(i).to_vec()).collect();
    let inputs: Vec<i64> = windows
        .iter()
        .flat_map(|w| w[..SEQ].iter().map(|&t| i64::from(t)))
        .collect();
    let ids = Tensor::<Cpu, 2, Int>::from_data(
        TensorData::new(inputs, [WINDOWS, SEQ]),
        &Default::default(),
    );
    let ours: Vec<f32> = chain.logits(ids).unwrap().into_data().to_vec().unwrap();

    let spec = serde_json::json!({
        "trust_remote_code": remote,
        "windows": windows,
        "texts": TEXTS,
        "prompt": "the ",
        "max_new_tokens": NEW_TOKENS,
    });
    let input = out.with_extension("in.json");
    let output = out.with_extension("out.json");
    std::fs::write(&input, spec.to_string()).unwrap();
    let run = Command::new(python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/export_hf/check.py"))
        .args([&out, &input, &output])
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "check.py failed:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let hf: Report = serde_json::from_slice(&std::fs::read(&output).unwrap()).unwrap();
    assert_eq!(hf.class, class);
    assert!(
        hf.missing.is_empty() && hf.unexpected.is_empty(),
        "weights missing {:?}, unused {:?}",
        hf.missing,
        hf.unexpected
    );

    // Logits, position by position.
    assert_eq!(hf.logits.len(), ours.len());
    let worst = hf
        .logits
        .iter()
        .zip(&ours)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    // The cache reproduces the whole window.
    assert!(hf.cached_max_diff < 1e-4, "cached: {}", hf.cached_max_diff);

    // The mean loss, against the binary's `iota eval`.
    let mut eval = vec!["eval", "--checkpoint", s(checkpoint), "--data", "synthetic"];
    eval.extend(["--windows", "8", "--batch-size", "8", "--json"]);
    eval.extend_from_slice(flags);
    let report: serde_json::Value = serde_json::from_slice(&ok(&eval).stdout).unwrap();
    let loss = report["eval"]["loss"].as_f64().unwrap();
    let loss_diff = (loss - hf.loss).abs();
    assert!(
        loss_diff < 1e-4,
        "iota eval {loss} vs transformers {}",
        hf.loss
    );

    // The tokenizer: the same ids for every text, decoded back to it.
    for ((text, ids), decoded) in TEXTS.iter().zip(&hf.ids).zip(&hf.decoded) {
        assert_eq!(ids, &tokenizer.encode(text).unwrap(), "{text:?}");
        assert_eq!(decoded, text);
    }
    assert_eq!(hf.prompt_ids, tokenizer.encode("the ").unwrap());

    // Greedy generation: the text `iota generate` prints (up to the end-of-text id, where
    // iota stops and transformers adds it).
    let mut generate = vec![
        "generate",
        "--checkpoint",
        s(checkpoint),
        "--prompt",
        "the ",
    ];
    let n = NEW_TOKENS.to_string();
    generate.extend(["--temperature", "0", "--max-tokens", &n]);
    generate.extend_from_slice(flags);
    let text = String::from_utf8(ok(&generate).stdout).unwrap();
    let end = tokenizer.end_of_text();
    let until_end: Vec<u32> = hf
        .generated
        .iter()
        .copied()
        .take_while(|&id| Some(id) != end)
        .collect();
    assert_eq!(
        format!("{}\n", tokenizer.decode(&until_end).unwrap()),
        text,
        "greedy text"
    );
    eprintln!(
        "{class}: max |logit difference| {worst:e} over {} logits; loss {loss} (iota eval) vs \
         {} (transformers), difference {loss_diff:e}; cached vs whole {:e}",
        ours.len(),
        hf.loss,
        hf.cached_max_diff
    );
    (worst, loss_diff)
}

#[test]
fn tiny_with_bottlenecks_reembedding_and_bf16_boundaries() {
    let _ = python();
    // The preset no longer re-embeds; a config can, and the export must carry its tables.
    let checkpoint = train("tiny", "model:\n  preset: tiny\n  reembed: true\n", &[]);
    let (worst, _) = export_and_compare(
        &checkpoint,
        &[],
        WireDtype::Bf16,
        &Tokenizer::byte(),
        "IotaForCausalLM",
    );
    // Rounding to bf16 at a boundary turns an f32-sized difference into one bf16 step
    // (2^-8 relative) where a value lies near a rounding midpoint.
    assert!(worst < 1e-3, "logits differ by {worst}");
}

#[test]
fn mlp_decoders_without_reembedding_f32_boundaries_and_a_bpe_tokenizer() {
    let _ = python();
    let tok = root().join("bpe.json");
    ok(&[
        "tokenizer",
        "train",
        "--data",
        "synthetic",
        "--vocab",
        "300",
        "--out",
        s(&tok),
    ]);
    let config = format!(
        "model:\n  preset: tiny\n  vocab_size: 300\n  reembed: false\n  bottleneck_decoder: mlp\ndata:\n  tokenizer: {}\n",
        tok.display()
    );
    let checkpoint = train("bpe", &config, &["--wire", "f32"]);
    let tokenizer = Tokenizer::from_file(&tok).unwrap();
    let (worst, _) = export_and_compare(
        &checkpoint,
        &["--wire", "f32", "--tokenizer", s(&tok)],
        WireDtype::F32,
        &tokenizer,
        "IotaForCausalLM",
    );
    assert!(worst < 1e-4, "logits differ by {worst}");
}

#[test]
fn one_section_or_boundaries_that_change_nothing_are_plain_llama() {
    let _ = python();
    let config = "model:\n  preset: tiny\n  sections: [[0, 6]]\n";
    let checkpoint = train("one", config, &[]);
    let (worst, _) = export_and_compare(
        &checkpoint,
        &[],
        WireDtype::Bf16,
        &Tokenizer::byte(),
        "LlamaForCausalLM",
    );
    assert!(worst < 1e-4, "logits differ by {worst}");
    let config: serde_json::Value = serde_json::from_slice(
        &std::fs::read(checkpoint.with_extension("hf").join("config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["model_type"], "llama");
    assert!(config.get("auto_map").is_none());
    // Three sections whose boundaries change nothing: no bottleneck, no re-embedding, f32.
    let config = "model:\n  preset: tiny\n  bottleneck: false\n  reembed: false\n";
    let checkpoint = train("open", config, &["--wire", "f32"]);
    let (worst, _) = export_and_compare(
        &checkpoint,
        &["--wire", "f32"],
        WireDtype::F32,
        &Tokenizer::byte(),
        "LlamaForCausalLM",
    );
    assert!(worst < 1e-4, "logits differ by {worst}");
}

#[test]
fn bad_input_gets_one_line_and_writes_nothing() {
    let out = root().join("never");
    let missing = root().join("no-such-checkpoint");
    let run = iota(&["export", "--hf", s(&out), "--checkpoint", s(&missing)]);
    one_line_failure(&run, "export of a missing checkpoint", "no such directory");
    assert!(!out.exists());
    // A folder that holds no checkpoint of any kind.
    let empty = root().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let run = iota(&["export", "--hf", s(&out), "--checkpoint", s(&empty)]);
    one_line_failure(&run, "export of an empty folder", "no checkpoint found");
    assert!(!out.exists());
    // int8 boundaries cannot be reproduced: refused before anything is written.
    let checkpoint = root().join("initial");
    ok(&[
        "train",
        "--preset",
        "tiny",
        "--steps",
        "0",
        "--seq-len",
        "32",
        "--quiet",
        "--out",
        s(&checkpoint),
    ]);
    let run = iota(&[
        "export",
        "--hf",
        s(&out),
        "--checkpoint",
        s(&checkpoint),
        "--wire",
        "int8",
    ]);
    one_line_failure(&run, "export with int8 boundaries", "int8");
    assert!(!out.exists());
}
