//! iota's subtensor bytes against an implementation iota did not write, from the same recorded
//! runtime metadata (subtensor `spec_version` 461, `tests/chain/metadata/`).
//!
//! The Bittensor SDK (`bittensor` from PyPI, pinned in `tests/chain/requirements.txt`, with
//! its SCALE codec `cyscale` and `bittensor-wallet`) runs `tests/chain/independent.py`, which
//! must agree byte for byte with iota on:
//!
//! - the call data of `burned_register`, `set_weights`, `commit_weights` and `reveal_weights`
//!   (the SDK's codec encodes them from the metadata);
//! - the commit-reveal v2 hash (the SDK's `generate_weight_hash`);
//! - the u16 weights a float vector becomes (the SDK's `convert_weights_and_uids_for_emit`);
//! - the mortal and immortal era encodings;
//! - signed extrinsics: the codec decodes iota's extrinsic, rebuilds the signed payload from the
//!   decoded fields and the metadata's transaction extensions on its own, and that payload must
//!   be iota's; bittensor-wallet must accept iota's sr25519 signature of it.
//!
//! No node is involved: nothing here says that a chain accepts these extrinsics, only that two
//! independent encoders agree on them.

mod common;

use std::time::Instant;

use iota::chain::subtensor::commit::{commit_hash_v2, weights_for_emit};
use iota::chain::subtensor::extrinsic::{Era, TxParams, sign};
use iota::chain::subtensor::metadata::Metadata;
use iota::chain::subtensor::{calls, commit};
use iota::wallet::Hotkey;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};

const METADATA: &str = "tests/chain/metadata/subtensor-spec461-v15.scale";

fn metadata_path() -> String {
    format!("{}/{METADATA}", env!("CARGO_MANIFEST_DIR"))
}

fn hex0x(bytes: &[u8]) -> String {
    format!("0x{}", hex::encode(bytes))
}

/// Runs the independent side on `request` and returns its answers.
fn independent(request: &Value) -> Value {
    let started = Instant::now();
    let answer = common::venv::run_json(
        "tests/chain/requirements.txt",
        "chain",
        "tests/chain/independent.py",
        request,
    );
    eprintln!(
        "independent encoder answered in {:.1} s (the first run installs the SDK)",
        started.elapsed().as_secs_f64()
    );
    answer
}

#[test]
fn iota_and_the_bittensor_sdk_encode_the_same_bytes() {
    let md = Metadata::decode(&std::fs::read(metadata_path()).expect("the recorded metadata"))
        .expect("the recorded metadata decodes");
    let version = md.runtime_version().expect("System.Version");
    assert_eq!(version.spec_version, 461);
    md.check_iota_uses()
        .expect("the calls, storage and APIs iota uses");

    let alice = Hotkey::from_uri("//Alice").unwrap();
    let bob = Hotkey::from_uri("//Bob").unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(45);

    // Call data.
    let salt: Vec<u16> = (0..8).map(|_| rng.random()).collect();
    let many: Vec<u16> = (0..200).collect();
    let many_values: Vec<u16> = (0..200).map(|_| rng.random()).collect();
    let hash = commit_hash_v2(&bob.public_key(), 9, &[0, 3, 7], &[65535, 100, 1], &salt, 7);
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let mut call = |bytes: Vec<u8>, function: &str, args: Value| {
        ours.push(hex0x(&bytes));
        theirs.push(json!({"module": "SubtensorModule", "function": function, "args": args}));
        bytes
    };
    call(
        calls::burned_register(&md, 9, &bob.public_key()).unwrap(),
        "burned_register",
        json!({"netuid": 9, "hotkey": hex0x(&bob.public_key())}),
    );
    call(
        calls::burned_register(&md, u16::MAX, &alice.public_key()).unwrap(),
        "burned_register",
        json!({"netuid": 65535, "hotkey": hex0x(&alice.public_key())}),
    );
    let set_weights = call(
        calls::set_weights(&md, 9, &[0, 3, 7], &[65535, 100, 1], 1_234_567).unwrap(),
        "set_weights",
        json!({"netuid": 9, "dests": [0, 3, 7], "weights": [65535, 100, 1], "version_key": 1_234_567}),
    );
    call(
        calls::set_weights(&md, 1, &[], &[], 0).unwrap(),
        "set_weights",
        json!({"netuid": 1, "dests": [], "weights": [], "version_key": 0}),
    );
    let long_set_weights = call(
        calls::set_weights(&md, 300, &many, &many_values, u64::MAX).unwrap(),
        "set_weights",
        json!({"netuid": 300, "dests": many, "weights": many_values, "version_key": u64::MAX}),
    );
    let commit_call = call(
        calls::commit_weights(&md, 9, &hash).unwrap(),
        "commit_weights",
        json!({"netuid": 9, "commit_hash": hex0x(&hash)}),
    );
    call(
        calls::reveal_weights(&md, 9, &[0, 3, 7], &[65535, 100, 1], &salt, 7).unwrap(),
        "reveal_weights",
        json!({"netuid": 9, "uids": [0, 3, 7], "values": [65535, 100, 1], "salt": salt, "version_key": 7}),
    );

    // Commit hashes.
    let hash_cases = [
        (
            &bob,
            9u16,
            vec![0u16, 3, 7],
            vec![65535u16, 100, 1],
            salt.clone(),
            7u64,
        ),
        (&alice, 1, vec![], vec![], vec![1, 2, 3, 4, 5, 6, 7, 8], 0),
        (
            &alice,
            65535,
            many.clone(),
            many_values.clone(),
            commit::new_salt(),
            u64::MAX,
        ),
    ];
    let our_hashes: Vec<String> = hash_cases
        .iter()
        .map(|(key, netuid, uids, values, salt, version)| {
            hex0x(&commit_hash_v2(
                &key.public_key(),
                *netuid,
                uids,
                values,
                salt,
                *version,
            ))
        })
        .collect();
    let their_hashes: Vec<Value> = hash_cases
        .iter()
        .map(|(key, netuid, uids, values, salt, version)| {
            json!({"ss58": key.address().as_str(), "netuid": netuid, "uids": uids,
                   "values": values, "salt": salt, "version_key": version})
        })
        .collect();

    // Float weights to u16.
    let mut emit_cases: Vec<(Vec<u16>, Vec<f32>)> = vec![
        (vec![0, 1, 2, 3], vec![0.5, 1.0, 0.0, 0.25]),
        (vec![5, 6, 7], vec![131_070.0, 1.0, 3.0]), // exact halves: round half to even
        (vec![0, 1], vec![0.0, 0.0]),
        (vec![42], vec![1e-30]),
        (vec![0, 1, 2], vec![1.0, 1e-6, 7.629_511e-6]),
    ];
    for _ in 0..20 {
        let n = rng.random_range(1..300usize);
        let uids: Vec<u16> = (0..n as u16).collect();
        let weights: Vec<f32> = (0..n)
            .map(|_| {
                let w: f32 = rng.random();
                if rng.random_bool(0.2) { 0.0 } else { w * w * w }
            })
            .collect();
        emit_cases.push((uids, weights));
    }
    let our_emits: Vec<Value> = emit_cases
        .iter()
        .map(|(uids, weights)| {
            let (u, v) = weights_for_emit(uids, weights).unwrap();
            json!([u, v])
        })
        .collect();
    let their_emits: Vec<Value> = emit_cases
        .iter()
        .map(|(uids, weights)| {
            let exact: Vec<f64> = weights.iter().map(|w| f64::from(*w)).collect();
            json!({"uids": uids, "weights": exact})
        })
        .collect();

    // Eras.
    let era_cases = [
        (64u64, 66u64),
        (4, 0),
        (100, 77),
        (1024, 5000),
        (65536, 123_456_789),
        (1 << 20, 7),
    ];
    let mut our_eras: Vec<String> = era_cases
        .iter()
        .map(|(period, current)| {
            let era = Era::Mortal {
                period: *period,
                current: *current,
                birth_hash: [0; 32],
            };
            hex0x(&era.encoded())
        })
        .collect();
    our_eras.push(hex0x(&Era::Immortal.encoded()));
    let mut their_eras: Vec<Value> = era_cases
        .iter()
        .map(|(period, current)| json!({"period": period, "current": current}))
        .collect();
    their_eras.push(json!("00"));

    // Signed extrinsics.
    let genesis = [0x1d; 32];
    let birth = [0xd9; 32];
    let signed = [
        (&alice, set_weights.clone(), Era::Immortal, 0u64, 0u128),
        (
            &bob,
            commit_call.clone(),
            Era::Mortal {
                period: 64,
                current: 66,
                birth_hash: birth,
            },
            11,
            0,
        ),
        (
            &alice,
            long_set_weights.clone(),
            Era::Mortal {
                period: 256,
                current: 9_999,
                birth_hash: birth,
            },
            4_000_000_000,
            12_345_678_901,
        ),
    ];
    let mut our_extrinsics = Vec::new();
    let mut their_extrinsics = Vec::new();
    for (key, call, era, nonce, tip) in &signed {
        let params = TxParams {
            spec_version: version.spec_version,
            transaction_version: version.transaction_version,
            genesis_hash: genesis,
            era: *era,
            nonce: *nonce,
            tip: *tip,
        };
        let xt = sign(&md, call, key, &params).unwrap();
        let birth_hash = match era {
            Era::Immortal => genesis,
            Era::Mortal { birth_hash, .. } => *birth_hash,
        };
        their_extrinsics.push(json!({
            "hex": hex0x(&xt.bytes),
            "spec_version": params.spec_version,
            "transaction_version": params.transaction_version,
            "genesis_hash": hex0x(&genesis),
            "birth_hash": hex0x(&birth_hash),
        }));
        our_extrinsics.push((xt, key.public_key(), call.clone(), *nonce, *tip));
    }

    let answer = independent(&json!({
        "metadata": metadata_path(),
        "calls": theirs,
        "commit_hashes": their_hashes,
        "emit": their_emits,
        "eras": their_eras,
        "extrinsics": their_extrinsics,
    }));

    let strings = |key: &str| -> Vec<String> {
        answer[key]
            .as_array()
            .unwrap_or_else(|| panic!("no `{key}` in the answer"))
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(ours, strings("calls"), "call data differs");
    assert_eq!(our_hashes, strings("commit_hashes"), "commit hashes differ");
    assert_eq!(our_eras, strings("eras"), "era encodings differ");
    let their_emit_answers = answer["emit"].as_array().expect("emit answers");
    assert_eq!(our_emits.len(), their_emit_answers.len());
    for (i, (o, t)) in our_emits.iter().zip(their_emit_answers).enumerate() {
        assert_eq!(o, t, "u16 weights differ for case {i}: {:?}", emit_cases[i]);
    }
    let decoded = answer["extrinsics"].as_array().expect("extrinsic answers");
    assert_eq!(decoded.len(), our_extrinsics.len());
    for (i, ((xt, key, call, nonce, tip), d)) in our_extrinsics.iter().zip(decoded).enumerate() {
        assert_eq!(d["address"], json!(hex0x(key)), "extrinsic {i}: sender");
        assert_eq!(d["nonce"], json!(nonce), "extrinsic {i}: nonce");
        assert_eq!(
            d["tip"].as_u64().map(u128::from),
            Some(*tip),
            "extrinsic {i}: tip"
        );
        assert_eq!(d["call"], json!(hex0x(call)), "extrinsic {i}: call");
        assert_eq!(
            d["signed_message"],
            json!(hex0x(&xt.signed_message)),
            "extrinsic {i}: the payload the SDK's codec rebuilds is not what iota signed"
        );
        assert_eq!(
            d["signature_valid"],
            json!(true),
            "extrinsic {i}: signature rejected"
        );
    }
    // The long call's payload is over 256 bytes: it is signed by its 32-byte hash.
    assert_eq!(our_extrinsics[2].0.signed_message.len(), 32);
}
