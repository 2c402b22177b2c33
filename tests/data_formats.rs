//! Data files written by writers that are not iota's, read back by iota: Parquet shards from
//! pyarrow (snappy with dictionary pages and several row groups, zstd with plain data pages
//! v2, nulls, a subfolder), `.jsonl.gz` from Python's gzip module and `.jsonl.zst` from the
//! `zstandard` package (each also as two members or frames one after the other). iota must
//! find exactly the documents the writer wrote, in the order of sorted paths then rows; a
//! shard of the wrong schema, a truncated or damaged shard and a truncated or damaged
//! compressed file must each give a one-line error naming the file (and, for Parquet, the
//! column), never a panic. End to end, `iota train` learns from a folder of shards and stops
//! with a one-line error at a bad one, as does `iota orchestrate` before it serves. The same
//! shards in a bucket (s3s-fs) and at an HTTPS URL (Python's `http.server` behind TLS) read
//! exactly as the files on disk. A local network trained on the shards ends with `iota
//! generate` sampling text from its checkpoint.
//!
//! The writers run in a Python venv made by the test (`tests/data_formats/requirements.txt`,
//! cached under the target directory); `tests/data_formats/write_files.py` writes the files
//! and prints what each holds.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use iota::data::{DataError, DataSpec, LocalFiles, TextSource};

use common::cli::{fails_with, generate, iota, ok, s, tiny_local};
use common::texts;

/// The files the writers made, and the documents each holds (by path under `dir`).
struct Written {
    dir: tempfile::TempDir,
    expected: BTreeMap<String, Vec<String>>,
}

impl Written {
    /// A path under the files' directory.
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The documents of the files whose path starts with `prefix`, in path order.
    fn documents_under(&self, prefix: &str) -> Vec<String> {
        self.expected
            .iter()
            .filter(|(path, _)| path.starts_with(prefix))
            .flat_map(|(_, docs)| docs.iter().cloned())
            .collect()
    }
}

/// Runs the Python writers into a fresh directory.
fn written() -> Written {
    let dir = tempfile::tempdir().unwrap();
    let expected =
        serde_json::from_value(texts::write_data_files(dir.path())).expect("write_files.py's JSON");
    Written { dir, expected }
}

/// Every document of `spec`, or the first error.
fn read(spec: &DataSpec) -> Result<Vec<String>, DataError> {
    spec.open()?.documents().collect()
}

/// The error reading `path` with the default column gives; checks it is one line naming the
/// file.
fn read_error(path: &Path) -> DataError {
    let err = read(&DataSpec::path(path)).expect_err("an error");
    let message = err.to_string();
    let name = path.file_name().unwrap().to_str().unwrap();
    assert!(message.contains(name), "{message}");
    assert!(!message.contains('\n'), "{message}");
    err
}

#[test]
fn parquet_shards_read_exactly_as_pyarrow_wrote_them() {
    let w = written();
    let source = LocalFiles::open(&w.path("shards")).unwrap();
    let names: Vec<_> = source
        .files()
        .iter()
        .map(|p| {
            p.strip_prefix(w.dir.path())
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        names,
        [
            "shards/000_00000.parquet",
            "shards/001_00000.parquet",
            "shards/more/002.parquet"
        ]
    );
    let docs: Vec<String> = source.documents().collect::<Result<_, _>>().unwrap();
    let expected = w.documents_under("shards/");
    // 50 rows less 4 nulls, 30, 5.
    assert_eq!(expected.len(), 46 + 30 + 5);
    assert_eq!(docs, expected);
    // One shard alone, and a read from the start again gives the same.
    let one = DataSpec::path(w.path("shards/001_00000.parquet"));
    assert_eq!(read(&one).unwrap(), w.expected["shards/001_00000.parquet"]);
    assert_eq!(read(&one).unwrap(), read(&one).unwrap());
    // gzip and uncompressed shards.
    assert_eq!(
        read(&DataSpec::path(w.path("codecs"))).unwrap(),
        w.documents_under("codecs/")
    );
}

#[test]
fn compressed_json_lines_read_exactly_as_written() {
    let w = written();
    let docs = read(&DataSpec::path(w.path("jsonl"))).unwrap();
    assert_eq!(docs, w.documents_under("jsonl/"));
    assert_eq!(docs.len(), 4 * 12);
    for name in ["d.jsonl.gz", "e.jsonl.zst", "f.jsonl.gz", "g.jsonl.zst"] {
        let one = read(&DataSpec::path(w.path(&format!("jsonl/{name}")))).unwrap();
        assert_eq!(one, w.expected[&format!("jsonl/{name}")], "{name}");
    }
}

#[test]
fn text_column_names_the_parquet_column_and_the_json_field() {
    let w = written();
    for name in ["content.parquet", "content.jsonl.zst"] {
        let spec = DataSpec::path(w.path(name))
            .with_text_column(Some("content"))
            .unwrap();
        assert_eq!(read(&spec).unwrap(), w.expected[name], "{name}");
    }
    let err = read_error(&w.path("content.parquet"));
    let message = err.to_string();
    assert!(matches!(err, DataError::BadParquet { .. }), "{message}");
    assert!(
        message.contains("column \"text\": no such column (the shard has: content, n)"),
        "{message}"
    );
    let err = read_error(&w.path("content.jsonl.zst"));
    assert!(
        matches!(err, DataError::BadJsonLine { line: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("no field \"text\""), "{err}");
}

#[test]
fn wrong_schemas_and_codecs_are_one_line_errors_naming_shard_and_column() {
    let w = written();
    for (name, needle) in [
        ("int.parquet", "not a string column (it holds INT64"),
        (
            "binary.parquet",
            "not a string column (it holds BYTE_ARRAY)",
        ),
        (
            "list.parquet",
            "a nested column (text.list.element), not one string per row",
        ),
    ] {
        let err = read_error(&w.path(&format!("bad/{name}")));
        let message = err.to_string();
        assert!(matches!(err, DataError::BadParquet { .. }), "{message}");
        assert!(message.contains("Parquet column \"text\""), "{message}");
        assert!(message.contains(needle), "{name}: {message}");
    }
}

#[test]
fn truncated_and_damaged_files_are_errors_not_panics() {
    let w = written();
    let damaged = tempfile::tempdir().unwrap();
    let shard = std::fs::read(w.path("shards/000_00000.parquet")).unwrap();
    // Cut short (the footer is lost), down to nothing.
    for (name, len) in [
        ("half.parquet", shard.len() / 2),
        ("no_footer.parquet", shard.len() - 9),
        ("four.parquet", 4),
        ("empty.parquet", 0),
    ] {
        let path = damaged.path().join(name);
        std::fs::write(&path, &shard[..len]).unwrap();
        let err = read_error(&path);
        assert!(matches!(err, DataError::BadParquet { .. }), "{err}");
        assert!(err.to_string().contains("column \"text\""), "{err}");
    }
    // Footer intact, pages overwritten: every byte of the page region flipped, so the first
    // page header no longer decodes.
    let footer_len =
        u32::from_le_bytes(shard[shard.len() - 8..shard.len() - 4].try_into().unwrap());
    let pages_end = shard.len() - 8 - footer_len as usize;
    let mut flipped = shard.clone();
    for byte in &mut flipped[4..pages_end] {
        *byte = !*byte;
    }
    let path = damaged.path().join("flipped.parquet");
    std::fs::write(&path, &flipped).unwrap();
    let err = read_error(&path);
    assert!(matches!(err, DataError::BadParquet { .. }), "{err}");
    assert!(err.to_string().contains("row group 0"), "{err}");
    // Scattered damage may decode to other text or fail; either way no panic.
    for step in [97, 31, 7] {
        let mut scattered = shard.clone();
        for i in (4..pages_end).step_by(step) {
            scattered[i] ^= 0x5A;
        }
        let path = damaged.path().join(format!("scattered{step}.parquet"));
        std::fs::write(&path, &scattered).unwrap();
        if let Err(err) = read(&DataSpec::path(&path)) {
            assert!(!err.to_string().contains('\n'), "{err}");
        }
    }
    // Compressed JSON lines cut short or damaged.
    for name in ["d.jsonl.gz", "e.jsonl.zst"] {
        let bytes = std::fs::read(w.path(&format!("jsonl/{name}"))).unwrap();
        let path = damaged.path().join(format!("cut-{name}"));
        std::fs::write(&path, &bytes[..bytes.len() * 2 / 3]).unwrap();
        let err = read_error(&path);
        assert!(matches!(err, DataError::Unreadable { .. }), "{name}: {err}");
        let mut bad = bytes.clone();
        let mid = bad.len() / 2;
        for byte in &mut bad[mid..mid + 16] {
            *byte = !*byte;
        }
        let path = damaged.path().join(format!("bad-{name}"));
        std::fs::write(&path, &bad).unwrap();
        let err = read_error(&path);
        assert!(
            matches!(
                err,
                DataError::Unreadable { .. }
                    | DataError::NotUtf8 { .. }
                    | DataError::BadJsonLine { .. }
            ),
            "{name}: {err}"
        );
    }
}

#[test]
fn train_learns_from_parquet_shards_and_stops_at_a_bad_one() {
    let w = written();
    let run = tempfile::tempdir().unwrap();
    let summary = run.path().join("summary.json");
    let ckpt = run.path().join("ckpt");
    let common = [
        "train",
        "--preset",
        "tiny",
        "--batch-size",
        "4",
        "--seq-len",
        "32",
        "--eval-every",
        "0",
        "--quiet",
    ];
    let corpus = w.path("corpus");
    let mut args = common.to_vec();
    args.extend([
        "--steps",
        "5",
        "--data",
        s(&corpus),
        "--out",
        s(&ckpt),
        "--summary-out",
        s(&summary),
    ]);
    ok(&args);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    let (first, last) = (
        v["first_loss"].as_f64().unwrap(),
        v["last_loss"].as_f64().unwrap(),
    );
    assert_eq!(v["steps_run"], 5);
    assert!(first.is_finite() && last.is_finite(), "{v}");
    assert!(last < first, "loss {first} -> {last} over 5 steps: {v}");

    // `iota eval` reads the same shards.
    let out = ok(&[
        "eval",
        "--checkpoint",
        s(&ckpt),
        "--data",
        s(&w.path("corpus")),
        "--json",
    ]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        report["eval"]["loss"].as_f64().is_some_and(f64::is_finite),
        "{report}"
    );

    // Another column, by flag.
    let content = w.path("content.parquet");
    let other = run.path().join("other");
    let mut args = common.to_vec();
    args.extend([
        "--steps",
        "1",
        "--data",
        s(&content),
        "--text-column",
        "content",
        "--out",
        s(&other),
    ]);
    ok(&args);

    // A bad shard among good ones: a one-line error naming it and the column, before step 1.
    let mixed = run.path().join("mixed");
    std::fs::create_dir(&mixed).unwrap();
    for name in ["000.parquet", "001.parquet"] {
        std::fs::copy(w.path(&format!("corpus/{name}")), mixed.join(name)).unwrap();
    }
    std::fs::copy(w.path("bad/int.parquet"), mixed.join("002.parquet")).unwrap();
    let bad_out = run.path().join("bad");
    let mut args = common.to_vec();
    args.extend(["--steps", "1", "--data", s(&mixed), "--out", s(&bad_out)]);
    fails_with(
        &args,
        "002.parquet: Parquet column \"text\": not a string column",
    );
    assert!(!bad_out.join("model.safetensors").exists());
    // The synthetic corpus has no columns.
    let mut args = common.to_vec();
    args.extend([
        "--steps",
        "1",
        "--text-column",
        "content",
        "--out",
        s(&bad_out),
    ]);
    fails_with(&args, "synthetic corpus has no columns");
}

/// Also when the shards are streamed (`data.stream`, one shard a block): every shard's schema
/// is checked before the first block is tokenized, and the run config's key reaches the
/// binary.
#[test]
fn orchestrator_refuses_a_bad_shard_before_it_serves() {
    let w = written();
    let run = tempfile::tempdir().unwrap();
    let config = run.path().join("run.yaml");
    for stream in ["", ", stream: {block_shards: 1, ahead: 1, threads: 1}"] {
        std::fs::write(
            &config,
            format!(
                "run: shards\nlisten: 127.0.0.1:0\ndata_dir: {}\ndata: {{source: {}, text_column: body{stream}}}\n",
                s(&run.path().join("state")),
                s(&w.path("shards")),
            ),
        )
        .unwrap();
        let out = iota(&["orchestrate", "--config", s(&config)]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("000_00000.parquet: Parquet column \"body\": no such column"),
            "{stderr}"
        );
        assert!(
            !stderr.contains("iota orchestrator: run"),
            "it served: {stderr}"
        );
    }
}

/// Every file under `dir` with its modification time.
fn files_with_times(dir: &Path) -> BTreeMap<PathBuf, std::time::SystemTime> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files_with_times(&path));
        } else {
            out.insert(path.clone(), path.metadata().unwrap().modified().unwrap());
        }
    }
    out
}

/// `iota eval --json` of `checkpoint` on `data` with `envs`: its held-out loss.
fn eval_loss(checkpoint: &Path, data: &str, extra: &[&str], envs: &[(&str, &str)]) -> f64 {
    let out = Command::new(env!("CARGO_BIN_EXE_iota"))
        .args(extra)
        .args([
            "eval",
            "--checkpoint",
            s(checkpoint),
            "--data",
            data,
            "--json",
        ])
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "eval on {data}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    report["eval"]["loss"].as_f64().expect("a loss")
}

/// Shards in a bucket (the tests' s3s-fs, through iota's object store) and at an HTTPS URL
/// (Python's `http.server` behind TLS, with a CA the test makes) are copied to a local folder
/// and read exactly like the same files on disk: `iota eval` gives the same held-out loss to
/// the last digit. A second read downloads nothing, and a shard removed from the bucket leaves
/// the copy. A prefix without shards, a missing URL and an untrusted certificate are one-line
/// errors, and the orchestrator stops on them before it serves.
#[test]
fn shards_in_a_bucket_or_at_a_url_read_like_the_same_files_on_disk() {
    let w = written();
    let run = tempfile::tempdir().unwrap();
    let ckpt = run.path().join("ckpt");
    ok(&[
        "train",
        "--preset",
        "tiny",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--steps",
        "1",
        "--eval-every",
        "0",
        "--quiet",
        "--data",
        s(&w.path("shards")),
        "--out",
        s(&ckpt),
    ]);
    let local = eval_loss(&ckpt, s(&w.path("shards")), &[], &[]);

    // A bucket prefix holding the shards, in subfolders, beside a file that is not a shard.
    let s3 = common::S3Server::start();
    let bucket = s3.dir.path().join("data").join(common::BUCKET);
    common::copy_tree(&w.path("shards"), &bucket.join("corpus"));
    std::fs::write(bucket.join("corpus/README.md"), "not a shard").unwrap();
    let cache = run.path().join("cache");
    let envs = s3.client_envs(&cache);
    let url = format!("s3://{}/corpus", common::BUCKET);
    assert_eq!(eval_loss(&ckpt, &url, &[], &envs), local);
    let copied = files_with_times(&cache);
    let names: Vec<String> = copied
        .keys()
        .map(|p| {
            p.strip_prefix(cache.join("shards"))
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned()
        })
        .map(|p| p.split_once('/').unwrap().1.to_owned())
        .collect();
    assert_eq!(
        names,
        ["000_00000.parquet", "001_00000.parquet", "more/002.parquet"]
    );
    // Read again: nothing is downloaded again.
    assert_eq!(eval_loss(&ckpt, &url, &[], &envs), local);
    assert_eq!(files_with_times(&cache), copied);
    // One shard named whole, and a prefix that lost a shard.
    let one = format!("{url}/001_00000.parquet");
    let one_local = eval_loss(&ckpt, s(&w.path("shards/001_00000.parquet")), &[], &[]);
    assert_eq!(eval_loss(&ckpt, &one, &[], &envs), one_local);
    std::fs::remove_file(bucket.join("corpus/000_00000.parquet")).unwrap();
    let fewer = eval_loss(&ckpt, &url, &[], &envs);
    assert_ne!(fewer, local);
    // Several sources in one --data, read in the order given: the shard that left the bucket
    // from disk, then the bucket's two, are the three shards of the folder.
    let first = w.path("shards/000_00000.parquet");
    let several = format!("{},{url}", s(&first));
    assert_eq!(eval_loss(&ckpt, &several, &[], &envs), local);
    assert_ne!(
        eval_loss(&ckpt, &format!("{url},{}", s(&first)), &[], &envs),
        local
    );
    let prefix_copy = copied.keys().next().unwrap().parent().unwrap();
    let left: Vec<_> = files_with_times(prefix_copy).into_keys().collect();
    assert_eq!(
        left,
        [
            prefix_copy.join("001_00000.parquet"),
            prefix_copy.join("more/002.parquet")
        ]
    );

    // Bad input: one line each, naming the URL.
    let eval_fails = |data: &str, extra: &[&str], needle: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_iota"))
            .args(extra)
            .args(["eval", "--checkpoint", s(&ckpt), "--data", data])
            .envs(envs)
            .output()
            .unwrap();
        common::cli::one_line_failure(&out, data, needle);
    };
    let empty = format!("s3://{}/nothing", common::BUCKET);
    eval_fails(
        &empty,
        &[],
        "no .txt, .jsonl, .jsonl.gz, .jsonl.zst or .parquet shard",
    );
    // Among several sources, the bad one is named.
    eval_fails(
        &format!("{},{empty}", s(&first)),
        &[],
        &format!("{empty}: no .txt"),
    );
    let nowhere = run.path().join("nowhere");
    eval_fails(
        &format!("{url},{}", s(&nowhere)),
        &[],
        &format!("{}: no such file or directory", s(&nowhere)),
    );

    // The same shard over HTTPS, from a server whose certificate a CA of the test signed.
    let server = common::tls::HttpsFiles::start(&w.path("shards"), &run.path().join("pki"));
    let ca_pem = server.ca_pem.clone();
    let https = format!("{}/001_00000.parquet", server.url);
    let trusted = ["--ca-file", s(&ca_pem)];
    assert_eq!(eval_loss(&ckpt, &https, &trusted, &envs), one_local);
    eval_fails(&https, &[], "certificate");
    let missing = format!("{}/404.parquet", server.url);
    eval_fails(&missing, &trusted, "404");

    // The orchestrator copies its data before it serves, and stops on a prefix without shards.
    let config = run.path().join("run.yaml");
    std::fs::write(
        &config,
        format!(
            "run: shards\nlisten: 127.0.0.1:0\ndata_dir: {}\ndata: {{source: \"{empty}\"}}\n",
            s(&run.path().join("state")),
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_iota"))
        .args(["orchestrate", "--config", s(&config)])
        .envs(envs)
        .output()
        .unwrap();
    let stderr = common::cli::one_line_failure(&out, "orchestrate", "shard under this prefix");
    assert!(
        !stderr.contains("iota orchestrator: run"),
        "it served: {stderr}"
    );
}

/// The whole path on the real binaries: a local network (3 sections x 1 miner, two merges)
/// trains on a folder of pyarrow's Parquet shards, then `iota generate` samples text from the
/// merged checkpoint it left, and `iota eval` reads the same shards.
#[test]
fn a_local_network_on_parquet_shards_ends_with_generated_text() {
    let w = written();
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("net");
    tiny_local(&local, "16", &["--data", s(&w.path("shards"))]);
    let (text, tokens) = generate(
        &local,
        &["--prompt", "alpha ", "--max-tokens", "12", "--seed", "1"],
    );
    assert!((1..=12).contains(&tokens), "{tokens} tokens");
    assert!(!text.is_empty());
    let out = ok(&[
        "eval",
        "--checkpoint",
        s(&local),
        "--data",
        s(&w.path("shards")),
        "--json",
    ]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        report["eval"]["loss"].as_f64().is_some_and(f64::is_finite),
        "{report}"
    );
}
