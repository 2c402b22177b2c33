//! btcli's coldkeys, written by an independent implementation and read by the real `iota`
//! binary: `bittensor-wallet` from PyPI ([`common::venv`], the hostile miner's requirements) creates a wallet whose coldkey is
//! `$NACL`-encrypted with a known password, or unencrypted (btcli's `--no-use-password`), and
//! `iota wallet check` must decrypt it to the address Python printed.
//!
//! A wrong password, a missing password without a terminal, and a `coldkeypub.txt` of another
//! key each fail with one line, and leave every file of the wallets directory as it was.
//!
//! The password reaches both programs through the environment, never an argument. Each
//! encryption or decryption costs 512 MiB and seconds (Argon2i at libsodium's "sensitive"
//! limits), so the test runs only three of them.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use common::cli::{one_line_failure, s};
use common::venv;

/// The venv's python with bittensor-wallet (the hostile miner's, shared with its test).
fn python() -> std::path::PathBuf {
    static VENV: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    VENV.get_or_init(|| venv::python("tests/hostile/requirements.txt", "hostile"))
        .clone()
}

const PASSWORD: &str = "correct horse battery 42!";
const PASSWORD_VAR: &str = "IOTA_TEST_COLDKEY_PASSWORD";

/// Has bittensor-wallet create wallet `name` under `dir` with a new coldkey: encrypted with
/// `password`, or unencrypted. Returns the SS58 address it printed.
fn python_coldkey(dir: &Path, name: &str, password: Option<&str>) -> String {
    let script = "import os, sys\n\
                  from bittensor_wallet import Wallet\n\
                  pw = os.environ.get('COLD_PW')\n\
                  w = Wallet(name=sys.argv[1], hotkey='default', path=sys.argv[2])\n\
                  w.create_new_coldkey(n_words=12, use_password=pw is not None, overwrite=True,\n\
                  \x20   suppress=True, coldkey_password=pw)\n\
                  print(w.coldkeypub.ss58_address)\n";
    let mut cmd = Command::new(python());
    cmd.args(["-c", script, name, s(dir)]).stdin(Stdio::null());
    match password {
        Some(pw) => cmd.env("COLD_PW", pw),
        None => cmd.env_remove("COLD_PW"),
    };
    let out = cmd.output().expect("running python");
    assert!(
        out.status.success(),
        "bittensor-wallet could not create the coldkey:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let address = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string();
    assert_eq!(address.len(), 48, "an SS58 address expected: {address:?}");
    address
}

/// `iota wallet check --wallet NAME --wallets-dir DIR [--password-env VAR]`, with no terminal
/// and no inherited IOTA_* settings; `password` is put in VAR.
fn check(dir: &Path, name: &str, password: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_iota"));
    cmd.args(["wallet", "check", "--wallet", name, "--wallets-dir", s(dir)])
        .stdin(Stdio::null());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("IOTA_") {
            cmd.env_remove(key);
        }
    }
    if let Some(pw) = password {
        cmd.args(["--password-env", PASSWORD_VAR])
            .env(PASSWORD_VAR, pw);
    }
    cmd.output().expect("run iota")
}

/// The address `out` printed, which must be a success.
fn address_of(out: &Output) -> String {
    assert!(
        out.status.success(),
        "iota wallet check failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Every file under `dir`: relative path -> (bytes, mode), to compare before and after.
fn snapshot(dir: &Path) -> BTreeMap<String, (Vec<u8>, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::metadata(&path).unwrap();
            let rel = path
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if meta.is_dir() {
                out.insert(format!("{rel}/"), (Vec::new(), meta.permissions().mode()));
                stack.push(path);
            } else {
                out.insert(
                    rel,
                    (std::fs::read(&path).unwrap(), meta.permissions().mode()),
                );
            }
        }
    }
    out
}

#[test]
fn encrypted_coldkey_from_bittensor_wallet() {
    let dir = tempfile::tempdir().unwrap();
    let wallets = dir.path();
    let expected = python_coldkey(wallets, "cold", Some(PASSWORD));
    let coldkey = std::fs::read(wallets.join("cold/coldkey")).unwrap();
    assert!(
        coldkey.starts_with(b"$NACL"),
        "bittensor-wallet wrote no $NACL file"
    );
    let before = snapshot(wallets);

    let started = Instant::now();
    let out = check(wallets, "cold", Some(PASSWORD));
    let took = started.elapsed();
    assert_eq!(address_of(&out), expected);
    eprintln!("iota wallet check decrypted the coldkey in {took:.2?}");

    let started = Instant::now();
    let line = one_line_failure(
        &check(wallets, "cold", Some("correct horse battery 43!")),
        "wrong password",
        "wrong password for coldkey",
    );
    eprintln!("refused in {:.2?}: {line}", started.elapsed());
    assert!(line.contains("cold/coldkey"), "{line}");
    assert!(!line.contains("battery"), "the password leaked: {line}");

    // No --password-env and no terminal: a hint, before any key derivation.
    one_line_failure(
        &check(wallets, "cold", None),
        "no password",
        "pass --password-env",
    );
    // A variable that is not set.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_iota"));
    cmd.args([
        "wallet",
        "check",
        "--wallet",
        "cold",
        "--wallets-dir",
        s(wallets),
    ])
    .args(["--password-env", "IOTA_TEST_NO_SUCH_VARIABLE"])
    .env_remove("IOTA_TEST_NO_SUCH_VARIABLE")
    .stdin(Stdio::null());
    one_line_failure(
        &cmd.output().unwrap(),
        "unset variable",
        "IOTA_TEST_NO_SUCH_VARIABLE is not set",
    );
    one_line_failure(
        &check(wallets, "nope", Some(PASSWORD)),
        "missing wallet",
        "not found",
    );

    assert!(
        snapshot(wallets) == before,
        "iota wallet check changed the wallets directory"
    );
}

#[test]
fn unencrypted_coldkey_and_a_mismatched_public_file() {
    let dir = tempfile::tempdir().unwrap();
    let wallets = dir.path();
    let expected = python_coldkey(wallets, "plain", None);
    let coldkey = std::fs::read(wallets.join("plain/coldkey")).unwrap();
    assert!(
        coldkey.starts_with(b"{"),
        "bittensor-wallet encrypted the coldkey"
    );
    // No password is needed, and one given is not used.
    assert_eq!(address_of(&check(wallets, "plain", None)), expected);
    assert_eq!(address_of(&check(wallets, "plain", Some("x"))), expected);

    // coldkeypub.txt of another key (Alice's, as btcli writes it).
    let alice = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY";
    let alice_hex = "0xd43593c715fdd31c61141abd04a99fd6822c8558854ccde39a5684e7a56da27d";
    std::fs::write(
        wallets.join("plain/coldkeypub.txt"),
        format!(r#"{{"accountId": "{alice_hex}", "publicKey": "{alice_hex}", "ss58Address": "{alice}"}}"#),
    )
    .unwrap();
    let before = snapshot(wallets);
    let line = one_line_failure(&check(wallets, "plain", None), "mismatch", "does not match");
    assert!(line.contains(&expected) && line.contains(alice), "{line}");
    assert!(
        snapshot(wallets) == before,
        "a failed check changed the wallet"
    );
    std::fs::remove_file(wallets.join("plain/coldkeypub.txt")).unwrap();
    one_line_failure(
        &check(wallets, "plain", None),
        "no public file",
        "coldkeypub.txt is missing",
    );
}
