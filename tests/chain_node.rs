//! iota's subtensor client against a **fake node**: a JSON-RPC server inside this test that
//! answers as a subtensor node would, from the recorded runtime metadata
//! (`tests/chain/metadata/`, spec 461) and from bytes an independent encoder produced. No
//! subtensor runs here, and nothing here says a real node answers the same; the fake node only
//! serves what the Bittensor SDK encoded.
//!
//! The independent side is the Bittensor SDK from PyPI (`tests/chain/requirements.txt`, the
//! venv of `tests/chain_encoding.rs`): `tests/chain/fake_node.py` encodes, with the SDK's SCALE
//! codec and storage-key code, a subnet's metagraph, the storage values iota reads (`Burn`,
//! `NetworksAdded`, `System.Account`, the weight settings) under their keys, and the
//! `System.Events` of the block that includes iota's extrinsic. When iota submits an extrinsic,
//! the fake node has the SDK decode it (`tests/chain/independent.py`): the call must be the
//! call the SDK encoded (`burned_register`, or `set_weights`), the sender the expected key,
//! and `bittensor-wallet`
//! must accept the signature of the payload the SDK rebuilt; only then is it put in a block.
//!
//! Checked: iota decodes the metagraph to exactly the values Python encoded, reads the burn
//! and the weight settings, and the real `iota register --network http://...` prints the uid
//! from the block's events; `set_weights` signed by the hotkey (the SDK decodes it as above)
//! lands in a block, and `NeuronNoValidatorPermit` in that block is `NoValidatorPermit`. Bad
//! input: no server listening, too little balance, a runtime whose `burned_register` takes
//! other arguments, and a pallet error in the block; each is one line, and the wallets
//! directory is left as it was.
//!
//! The later tests run a second, stateful **fake node** (`tests/chain/fake_node_server.py`,
//! started by `tests/common/fake_node.rs`): it makes a block every few hundred milliseconds,
//! has the SDK decode and `bittensor-wallet` verify every extrinsic, and applies the weights
//! pallet's rules as its source states them (`tests/chain/weights_pallet.py`: commit-reveal
//! on or off, the rate limit per uid, the validator permit, the reveal epoch, the commit hash
//! as the SDK computes it) to one subnet whose storage and metagraph it encodes with the SDK
//! on every read. On it: the pallet's refusals of iota's extrinsics through the library; a
//! real `iota orchestrate`, three `iota mine` and `iota validate` setting, waiting for the
//! rate limit, committing, and revealing after a restart; and a validator set for another
//! subnet than the run's refused in one line.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use blake2::{Blake2b256, Digest};
use common::cli::{one_line_failure, s};
use iota::chain::subtensor::node::SubtensorChain;
use iota::chain::{Chain, ChainError, Metagraph, Network, Neuron, WeightSubmission};
use iota::wallet::Ss58Address;
use parity_scale_codec::{Decode, Encode};
use serde_json::{Value, json};

const METADATA: &str = "tests/chain/metadata/subtensor-spec461-v15.scale";
const PASSWORD: &str = "fake node coldkey 7";
const PASSWORD_VAR: &str = "IOTA_TEST_CHAIN_NODE_PASSWORD";
const NETUID: u16 = 3;
/// A subnet with a single neuron.
const LONE_NETUID: u16 = 5;
const BURN: u64 = 1_000_000_000;
const UID: u16 = 4;
/// The fake node's best block before anything is submitted.
const BEST: u64 = 10;
/// The nonce the fake node reports for every account.
const NONCE: u64 = 5;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn hex0x(bytes: &[u8]) -> String {
    format!("0x{}", hex::encode(bytes))
}

fn python() -> PathBuf {
    static VENV: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    VENV.get_or_init(|| common::venv::python("tests/chain/requirements.txt", "chain"))
        .clone()
}

/// Runs a script of `tests/chain/` on `request`; returns its JSON answer.
fn run_python(script: &str, request: &Value) -> Value {
    common::venv::run_json(
        "tests/chain/requirements.txt",
        "chain",
        &format!("tests/chain/{script}"),
        request,
    )
}

/// The fake node's block hash of `number`.
fn block_hash(number: u64) -> [u8; 32] {
    let mut hash = [0xb1u8; 32];
    hash[..8].copy_from_slice(&number.to_le_bytes());
    hash
}

fn header(number: u64) -> Value {
    json!({
        "parentHash": hex0x(&block_hash(number.saturating_sub(1))),
        "number": format!("0x{number:x}"),
        "stateRoot": hex0x(&[0; 32]),
        "extrinsicsRoot": hex0x(&[0; 32]),
        "digest": {"logs": []},
    })
}

/// What the fake node serves.
struct FakeNodeState {
    metadata: String,
    storage: HashMap<String, String>,
    events_key: String,
    /// Metagraph answers by runtime API input.
    metagraphs: HashMap<String, String>,
    /// Extrinsics by block number (0..=best).
    blocks: Vec<Vec<String>>,
    events_at: HashMap<String, String>,
    /// The System.Events of the block that includes a submitted extrinsic.
    inclusion_events: String,
    /// What a submitted extrinsic must decode to (the SDK's `burned_register` call data and
    /// the coldkey's SS58 address).
    expected_call: String,
    expected_sender: String,
    /// Why the SDK refused a submitted extrinsic, if it did.
    refusals: Vec<String>,
    submitted: usize,
}

type Shared = Arc<Mutex<FakeNodeState>>;

/// The fake node: a JSON-RPC server on a loopback port.
struct FakeNode {
    url: String,
    state: Shared,
}

impl FakeNode {
    fn start(state: FakeNodeState) -> FakeNode {
        let state = Arc::new(Mutex::new(state));
        let app = axum::Router::new()
            .route("/", post(answer))
            .with_state(state.clone());
        let addr = common::net::serve_in_thread(app);
        FakeNode {
            url: format!("http://{addr}"),
            state,
        }
    }
}

async fn answer(State(state): State<Shared>, body: String) -> axum::Json<Value> {
    let request: Value = serde_json::from_str(&body).expect("a JSON-RPC request");
    let id = request["id"].clone();
    let params = request["params"].as_array().cloned().unwrap_or_default();
    let result = respond(&state, request["method"].as_str().unwrap_or(""), &params);
    axum::Json(match result {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(message) => json!({
            "jsonrpc": "2.0", "id": id,
            "error": {"code": 1010, "message": "Invalid Transaction", "data": message},
        }),
    })
}

fn respond(state: &Shared, method: &str, params: &[Value]) -> Result<Value, String> {
    let mut st = state.lock().unwrap();
    let best = st.blocks.len() as u64 - 1;
    let number_of = |hash: &Value| -> Option<u64> {
        (0..=best).find(|n| hash.as_str() == Some(hex0x(&block_hash(*n)).as_str()))
    };
    Ok(match method {
        "state_getMetadata" => json!(st.metadata),
        "state_getRuntimeVersion" => json!({
            "specName": "node-subtensor", "implName": "node-subtensor", "authoringVersion": 1,
            "specVersion": 461, "implVersion": 1, "apis": [], "transactionVersion": 1,
            "stateVersion": 1,
        }),
        "chain_getBlockHash" => match params.first().and_then(Value::as_u64) {
            Some(n) if n <= best => json!(hex0x(&block_hash(n))),
            Some(_) => Value::Null,
            None => json!(hex0x(&block_hash(best))),
        },
        "chain_getHeader" => match params.first() {
            Some(hash) => number_of(hash).map_or(Value::Null, header),
            None => header(best),
        },
        "chain_getBlock" => match params.first().and_then(number_of) {
            Some(n) => json!({
                "block": {"header": header(n), "extrinsics": st.blocks[n as usize]},
                "justifications": null,
            }),
            None => Value::Null,
        },
        "state_getStorage" => {
            let key = params[0].as_str().unwrap_or_default();
            if key == st.events_key {
                let at = params.get(1).and_then(Value::as_str).unwrap_or_default();
                st.events_at.get(at).map_or(Value::Null, |v| json!(v))
            } else {
                st.storage.get(key).map_or(Value::Null, |v| json!(v))
            }
        }
        "state_call" => {
            assert_eq!(params[0], "SubnetInfoRuntimeApi_get_metagraph");
            let input = params[1].as_str().unwrap_or_default();
            // A subnet that does not exist: `None`.
            json!(st.metagraphs.get(input).cloned().unwrap_or("0x00".into()))
        }
        "system_accountNextIndex" => json!(NONCE),
        "author_submitExtrinsic" => {
            st.submitted += 1;
            let xt = params[0].as_str().unwrap_or_default().to_owned();
            let genesis = hex0x(&block_hash(0));
            let birth = hex0x(&block_hash(best));
            let decoded = run_python(
                "independent.py",
                &json!({
                    "metadata": root().join(METADATA),
                    "calls": [], "commit_hashes": [], "emit": [], "eras": [],
                    "extrinsics": [{
                        "hex": xt, "spec_version": 461, "transaction_version": 1,
                        "genesis_hash": genesis, "birth_hash": birth,
                    }],
                }),
            );
            let got = &decoded["extrinsics"][0];
            let sender = Ss58Address::from_public_key(
                hex::decode(
                    got["address"]
                        .as_str()
                        .unwrap_or_default()
                        .trim_start_matches("0x"),
                )
                .ok()
                .and_then(|b| b.try_into().ok())
                .unwrap_or([0; 32]),
            );
            let mut wrong = Vec::new();
            if got["call"] != json!(st.expected_call) {
                wrong.push(format!(
                    "call {} is not the SDK's {}",
                    got["call"], st.expected_call
                ));
            }
            if sender.to_string() != st.expected_sender {
                wrong.push(format!("sent by {sender}, not the coldkey"));
            }
            if got["nonce"] != json!(NONCE) {
                wrong.push(format!("nonce {}", got["nonce"]));
            }
            if got["signature_valid"] != json!(true) {
                wrong.push("bittensor-wallet refuses the signature".into());
            }
            if !wrong.is_empty() {
                let why = wrong.join("; ");
                st.refusals.push(why.clone());
                return Err(why);
            }
            // The next block carries another extrinsic, then iota's.
            let raw = hex::decode(xt.trim_start_matches("0x")).unwrap_or_default();
            st.blocks
                .push(vec!["0x280403000b00000000000000".into(), xt.clone()]);
            let at = hex0x(&block_hash(best + 1));
            let events = st.inclusion_events.clone();
            st.events_at.insert(at, events);
            json!(hex0x(&Blake2b256::digest(&raw)))
        }
        other => return Err(format!("the fake node does not serve {other}")),
    })
}

/// A wallet made by bittensor-wallet: an encrypted coldkey and a hotkey; their addresses.
fn sdk_wallet(dir: &Path) -> (Ss58Address, Ss58Address) {
    let script = "import os, sys\n\
                  from bittensor_wallet import Wallet\n\
                  wallet = Wallet(name='payer', hotkey='miner', path=sys.argv[1])\n\
                  wallet.create_new_coldkey(n_words=12, use_password=True, overwrite=True,\n\
                  \x20   suppress=True, coldkey_password=os.environ['COLD_PW'])\n\
                  wallet.create_new_hotkey(n_words=12, use_password=False, overwrite=True, suppress=True)\n\
                  print(wallet.coldkeypub.ss58_address, wallet.hotkey.ss58_address)\n";
    let out = Command::new(python())
        .args(["-c", script, s(dir)])
        .env("COLD_PW", PASSWORD)
        .stdin(Stdio::null())
        .output()
        .expect("running python");
    assert!(
        out.status.success(),
        "bittensor-wallet could not make the wallet:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace().rev().take(2).collect::<Vec<_>>();
    words.reverse();
    (words[0].parse().unwrap(), words[1].parse().unwrap())
}

/// The subnet the fake node serves: two neurons besides the one iota registers.
fn neurons() -> Vec<Neuron> {
    vec![
        Neuron {
            uid: 0,
            hotkey: [0x11; 32],
            coldkey: [0x21; 32],
            stake_rao: 123_456_789_000,
            validator_permit: true,
            incentive: 1.0,
            last_update: 90,
        },
        Neuron {
            uid: 1,
            hotkey: [0x12; 32],
            coldkey: [0x22; 32],
            stake_rao: 0,
            validator_permit: false,
            incentive: 100.0 / 65535.0,
            last_update: 0,
        },
    ]
}

fn account_info(free: u64) -> Value {
    json!({"nonce": 0, "consumers": 0, "providers": 1, "sufficients": 0,
           "data": {"free": free, "reserved": 0, "frozen": 0, "flags": 0}})
}

fn dispatch_info() -> Value {
    json!({"weight": {"ref_time": 1000, "proof_size": 10}, "class": "Normal", "pays_fee": "Yes"})
}

/// The index of SubtensorModule's error `name` in the recorded metadata.
fn error_index(name: &str) -> (u8, u8) {
    let md = iota::chain::subtensor::metadata::Metadata::decode(
        &std::fs::read(root().join(METADATA)).unwrap(),
    )
    .unwrap();
    let pallet = md
        .check_call(&iota::chain::subtensor::metadata::BURNED_REGISTER)
        .unwrap()
        .pallet_index;
    let code = (0..=255u8)
        .find(|c| {
            md.module_error(pallet, *c)
                .is_some_and(|(_, n, _)| n == name)
        })
        .expect("the error exists");
    (pallet, code)
}

/// What the SDK encoded for one fake node: storage, metagraph, events and the expected call.
struct Encoded {
    storage: HashMap<String, String>,
    events_key: String,
    /// Runtime API input -> the metagraph the SDK encoded.
    metagraphs: HashMap<String, String>,
    events_registered: String,
    events_failed: String,
    /// The extrinsic at index 1 succeeded, with no other event.
    events_success: String,
    /// `NeuronNoValidatorPermit` at index 1.
    events_no_permit: String,
    call: String,
    set_weights_call: String,
}

fn encode_with_the_sdk(coldkey: &Ss58Address, hotkey: &Ss58Address, free: u64) -> Encoded {
    let neurons = neurons();
    let hex_keys =
        |f: fn(&Neuron) -> [u8; 32]| neurons.iter().map(|n| hex0x(&f(n))).collect::<Vec<_>>();
    let cold = hex0x(coldkey.public_key());
    let hot = hex0x(hotkey.public_key());
    let subnet = |entry: &str, value: Value| json!({"pallet": "SubtensorModule", "entry": entry, "params": [NETUID], "value": value});
    let (pallet, code) = error_index("TooManyRegistrationsThisBlock");
    let (_, no_permit) = error_index("NeuronNoValidatorPermit");
    let failed = |code: u8| {
        json!({"phase": {"ApplyExtrinsic": 1},
            "event": {"System": {"ExtrinsicFailed": {
                "dispatch_error": {"Module": {"index": pallet, "error": hex0x(&[code, 0, 0, 0])}},
                "dispatch_info": dispatch_info()}}}, "topics": []})
    };
    let success = json!({"phase": {"ApplyExtrinsic": 1},
        "event": {"System": {"ExtrinsicSuccess": {"dispatch_info": dispatch_info()}}}, "topics": []});
    let other = json!({"phase": {"ApplyExtrinsic": 0},
        "event": {"System": {"ExtrinsicSuccess": {"dispatch_info": dispatch_info()}}}, "topics": []});
    let request = json!({
        "metadata": root().join(METADATA),
        "storage": [
            subnet("NetworksAdded", json!(true)),
            subnet("Burn", json!(BURN)),
            subnet("Tempo", json!(360)),
            subnet("CommitRevealWeightsEnabled", json!(true)),
            subnet("WeightsSetRateLimit", json!(100)),
            subnet("WeightsVersionKey", json!(7)),
            subnet("RevealPeriodEpochs", json!(2)),
            {"pallet": "System", "entry": "Account", "params": [cold], "value": account_info(free)},
            // Any key of System.Events: only its prefix is used.
            {"pallet": "System", "entry": "Events", "params": [], "value": []},
        ],
        "metagraphs": [{"netuid": NETUID, "fields": {
            "hotkeys": hex_keys(|n| n.hotkey),
            "coldkeys": hex_keys(|n| n.coldkey),
            "total_stake": neurons.iter().map(|n| n.stake_rao).collect::<Vec<_>>(),
            "validator_permit": neurons.iter().map(|n| n.validator_permit).collect::<Vec<_>>(),
            "incentives": [65535, 100],
            "last_update": neurons.iter().map(|n| n.last_update).collect::<Vec<_>>(),
            "block": 99,
        }}, {"netuid": LONE_NETUID, "fields": {
            // One neuron: its one-element lists must not read as wrappers.
            "hotkeys": [hex0x(&neurons[0].hotkey)],
            "coldkeys": [hex0x(&neurons[0].coldkey)],
            "total_stake": [neurons[0].stake_rao],
            "validator_permit": [true],
            "incentives": [65535],
            "last_update": [neurons[0].last_update],
            "block": 98,
        }}],
        "events": [
            [other, {"phase": {"ApplyExtrinsic": 1},
                "event": {"SubtensorModule": {"NeuronRegistered": [NETUID, UID, hot]}}, "topics": []},
             success],
            [other, failed(code)],
            [other, success],
            [other, failed(no_permit)],
        ],
        "calls": [
            {"module": "SubtensorModule", "function": "burned_register",
             "args": {"netuid": NETUID, "hotkey": hot}},
            {"module": "SubtensorModule", "function": "set_weights",
             "args": {"netuid": NETUID, "dests": [0, 1], "weights": [65535, 100], "version_key": 7}},
        ],
        "netuids": [NETUID, LONE_NETUID],
    });
    let answer = run_python("fake_node.py", &request);
    let mut storage: HashMap<String, String> = answer["storage"]
        .as_array()
        .unwrap()
        .iter()
        .map(|kv| {
            (
                kv[0].as_str().unwrap().to_owned(),
                kv[1].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let events_key = storage
        .keys()
        .find(|k| k.len() == 2 + 64)
        .expect("the System.Events key (a plain item: 32 bytes)")
        .clone();
    storage.remove(&events_key);
    let text = |v: &Value| v.as_str().unwrap().to_owned();
    Encoded {
        storage,
        events_key,
        metagraphs: (0..2)
            .map(|i| (text(&answer["netuids"][i]), text(&answer["metagraphs"][i])))
            .collect(),
        events_registered: text(&answer["events"][0]),
        events_failed: text(&answer["events"][1]),
        events_success: text(&answer["events"][2]),
        events_no_permit: text(&answer["events"][3]),
        call: text(&answer["calls"][0]),
        set_weights_call: text(&answer["calls"][1]),
    }
}

/// A fake node serving `encoded`, which puts `events` in the block of an extrinsic that
/// decodes to `call` from `sender`.
fn fake_node(
    encoded: &Encoded,
    metadata: &[u8],
    events: &str,
    sender: &Ss58Address,
    call: &str,
) -> FakeNode {
    FakeNode::start(FakeNodeState {
        metadata: hex0x(metadata),
        storage: encoded.storage.clone(),
        events_key: encoded.events_key.clone(),
        metagraphs: encoded.metagraphs.clone(),
        blocks: (0..=BEST).map(|_| Vec::new()).collect(),
        events_at: HashMap::new(),
        inclusion_events: events.to_owned(),
        expected_call: call.to_owned(),
        expected_sender: sender.to_string(),
        refusals: Vec::new(),
        submitted: 0,
    })
}

/// The recorded metadata with `burned_register`'s `hotkey` argument renamed: a runtime that
/// changed a call iota sends.
fn changed_metadata(original: &[u8]) -> Vec<u8> {
    use frame_metadata::{RuntimeMetadata, RuntimeMetadataPrefixed};
    use scale_info::TypeDef;
    let mut md = RuntimeMetadataPrefixed::decode(&mut &original[..]).unwrap();
    let RuntimeMetadata::V15(v15) = &mut md.1 else {
        panic!("V15 metadata expected");
    };
    let pallet = v15
        .pallets
        .iter()
        .find(|p| p.name == "SubtensorModule")
        .unwrap();
    let calls_ty = pallet.calls.as_ref().unwrap().ty.id;
    let ty = v15
        .types
        .types
        .iter_mut()
        .find(|t| t.id == calls_ty)
        .unwrap();
    let TypeDef::Variant(variants) = &mut ty.ty.type_def else {
        panic!("calls are an enum");
    };
    let call = variants
        .variants
        .iter_mut()
        .find(|v| v.name == "burned_register")
        .unwrap();
    call.fields[1].name = Some("hotkey_account".into());
    md.encode()
}

/// `iota register --network URL --netuid 3 --yes --password-env VAR` for the wallet in `dir`,
/// without a terminal or inherited IOTA_* settings.
fn register(dir: &Path, url: &str) -> Output {
    register_on(dir, url, NETUID)
}

/// [`register`] on subnet `netuid`.
fn register_on(dir: &Path, url: &str, netuid: u16) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_iota"));
    cmd.args([
        "register",
        "--network",
        url,
        "--netuid",
        &netuid.to_string(),
    ])
    .args(["--yes", "--password-env", PASSWORD_VAR])
    .args([
        "--wallet",
        "payer",
        "--hotkey",
        "miner",
        "--wallets-dir",
        s(dir),
    ])
    .env(PASSWORD_VAR, PASSWORD)
    .stdin(Stdio::null());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("IOTA_") {
            cmd.env_remove(key);
        }
    }
    cmd.output().expect("run iota")
}

/// Every file under `dir` and its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

#[test]
fn iota_reads_and_registers_against_a_fake_node_serving_sdk_encoded_bytes() {
    let wallets = tempfile::tempdir().unwrap();
    let (coldkey, hotkey) = sdk_wallet(wallets.path());
    let before = snapshot(wallets.path());
    let metadata = std::fs::read(root().join(METADATA)).unwrap();
    let rich = encode_with_the_sdk(&coldkey, &hotkey, 5 * BURN);

    // Reads, through the library: the metagraph is exactly what Python encoded.
    let node = fake_node(
        &rich,
        &metadata,
        &rich.events_registered,
        &coldkey,
        &rich.call,
    );
    let chain = SubtensorChain::new(Network::Url(node.url.clone())).unwrap();
    assert_eq!(
        chain.metagraph(NETUID).unwrap(),
        Metagraph {
            netuid: NETUID,
            block: 99,
            neurons: neurons(),
        }
    );
    assert_eq!(
        chain.metagraph(LONE_NETUID).unwrap(),
        Metagraph {
            netuid: LONE_NETUID,
            block: 98,
            neurons: neurons()[..1].to_vec(),
        }
    );
    assert_eq!(chain.burn_cost(NETUID).unwrap(), BURN);
    assert_eq!(chain.free_balance(&coldkey).unwrap(), 5 * BURN);
    let policy = chain.weights_policy(NETUID).unwrap();
    assert_eq!(
        (
            policy.block,
            policy.tempo,
            policy.commit_reveal,
            policy.reveal_period_epochs,
            policy.weights_rate_limit,
            policy.version_key
        ),
        (BEST, 360, true, 2, 100, 7)
    );
    assert_eq!(chain.metagraph(9), Err(ChainError::NoSubnet { netuid: 9 }));
    assert_eq!(chain.burn_cost(9), Err(ChainError::NoSubnet { netuid: 9 }));

    // The real binary registers: the SDK decodes and verifies the extrinsic, the uid comes
    // from the SDK-encoded events of the block that carries it.
    let out = register(wallets.path(), &node.url);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "iota register failed:\n{stderr}");
    assert_eq!(node.state.lock().unwrap().refusals, Vec::<String>::new());
    assert!(
        stdout.contains(&format!("uid {UID} in block {}", BEST + 1)),
        "{stdout}"
    );
    assert!(
        stdout.contains("burns 1 TAO") && stdout.contains("holds 5 TAO"),
        "{stdout}"
    );
    assert!(!stdout.contains(PASSWORD) && !stderr.contains(PASSWORD));
    assert_eq!(
        snapshot(wallets.path()),
        before,
        "registering wrote to the wallets"
    );

    // A pallet error in the block: named from the metadata, one line.
    let node = fake_node(&rich, &metadata, &rich.events_failed, &coldkey, &rich.call);
    let line = one_line_failure(
        &register(wallets.path(), &node.url),
        "a refused burned_register",
        "SubtensorModule.TooManyRegistrationsThisBlock",
    );
    assert!(
        line.contains("refused burned_register on subnet 3"),
        "{line}"
    );
    assert_eq!(node.state.lock().unwrap().submitted, 1);

    // A subnet that does not exist: one line, nothing submitted.
    let line = one_line_failure(
        &register_on(wallets.path(), &node.url, 9),
        "a missing subnet",
        "subnet 9 does not exist",
    );
    assert!(line.contains("check the netuid"), "{line}");
    assert_eq!(node.state.lock().unwrap().submitted, 1);

    // Too little balance: refused before anything is signed.
    let poor = encode_with_the_sdk(&coldkey, &hotkey, BURN / 2);
    let node = fake_node(
        &poor,
        &metadata,
        &poor.events_registered,
        &coldkey,
        &poor.call,
    );
    one_line_failure(
        &register(wallets.path(), &node.url),
        "a poor coldkey",
        &format!("holds {} rao, and this needs {BURN} rao", BURN / 2),
    );
    assert_eq!(node.state.lock().unwrap().submitted, 0);

    // A runtime whose burned_register changed: refused before anything is signed.
    let node = fake_node(
        &rich,
        &changed_metadata(&metadata),
        &rich.events_registered,
        &coldkey,
        &rich.call,
    );
    let line = one_line_failure(
        &register(wallets.path(), &node.url),
        "a changed runtime",
        "the chain's runtime (spec_version 461) changed what iota uses",
    );
    assert!(line.contains("SubtensorModule.burned_register"), "{line}");
    assert_eq!(node.state.lock().unwrap().submitted, 0);
    let chain = SubtensorChain::new(Network::Url(node.url.clone())).unwrap();
    assert!(matches!(
        chain.metagraph(NETUID),
        Err(ChainError::RuntimeChanged {
            spec_version: 461,
            ..
        })
    ));

    // Weights, through the library: set_weights signed by the hotkey, followed into a block;
    // a pallet error in the block becomes the matching ChainError.
    let signer = iota::wallet::WalletDir::new(wallets.path())
        .load_hotkey("payer", "miner")
        .unwrap();
    let set = WeightSubmission::Set {
        uids: vec![0, 1],
        values: vec![65535, 100],
        version_key: 7,
    };
    for (events, expected) in [
        (&rich.events_success, Ok(BEST + 1)),
        (
            &rich.events_no_permit,
            Err(ChainError::NoValidatorPermit { netuid: NETUID }),
        ),
    ] {
        let node = fake_node(&rich, &metadata, events, &hotkey, &rich.set_weights_call);
        let chain = SubtensorChain::new(Network::Url(node.url.clone()))
            .unwrap()
            .with_poll_interval(Duration::from_millis(50));
        assert_eq!(chain.submit_weights(&signer, NETUID, &set), expected);
        let state = node.state.lock().unwrap();
        assert_eq!((state.submitted, &state.refusals), (1, &Vec::new()));
    }

    // Nothing listening.
    let port = common::net::free_port();
    one_line_failure(
        &register(wallets.path(), &format!("http://127.0.0.1:{port}")),
        "no node",
        &format!("cannot reach the subtensor node at http://127.0.0.1:{port}"),
    );

    assert_eq!(
        snapshot(wallets.path()),
        before,
        "a failure wrote to the wallets"
    );
}

/// The orchestrator on a subnet, through the real client: `iota orchestrate` with a `chain:`
/// block naming the fake node reads the SDK-encoded metagraph before it serves, shows it in
/// `/api/status` (uids, hotkeys, stake, permits), and refuses a hotkey that is not on it.
#[test]
fn an_orchestrator_on_a_fake_node_admits_only_the_metagraphs_hotkeys() {
    let dir = tempfile::tempdir().unwrap();
    let wallets = dir.path().join("wallets");
    let (coldkey, hotkey) = sdk_wallet(&wallets);
    let encoded = encode_with_the_sdk(&coldkey, &hotkey, 5 * BURN);
    let metadata = std::fs::read(root().join(METADATA)).unwrap();
    let node = fake_node(
        &encoded,
        &metadata,
        &encoded.events_registered,
        &coldkey,
        &encoded.call,
    );
    let (url, config) = common::procs::write_config_with(
        dir.path(),
        "on-a-fake-node",
        &format!(
            "chain: {{network: \"{}\", netuid: {NETUID}, refresh_secs: 1}}\n",
            node.url
        ),
    );
    let mut orchestrator = common::procs::start_orchestrator(dir.path(), &config, &url);
    let doc = common::net::status(&url).expect("a status");
    let chain = &doc["chain"];
    assert_eq!(
        (chain["netuid"].as_u64(), chain["block"].as_u64()),
        (Some(u64::from(NETUID)), Some(99)),
        "{doc}"
    );
    let shown: Vec<(u64, String, bool)> = chain["neurons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["uid"].as_u64().unwrap(),
                n["hotkey"].as_str().unwrap().to_owned(),
                n["validator_permit"].as_bool().unwrap(),
            )
        })
        .collect();
    let expected: Vec<(u64, String, bool)> = neurons()
        .iter()
        .map(|n| {
            (
                u64::from(n.uid),
                n.address().to_string(),
                n.validator_permit,
            )
        })
        .collect();
    assert_eq!(shown, expected);
    // The wallet's hotkey is not on the metagraph: refused in one line that says what to run.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_iota"));
    cmd.args(["register", "--orchestrator", &url])
        .args(["--wallet", "payer", "--hotkey", "miner", "--wallets-dir"])
        .arg(&wallets)
        .stdin(Stdio::null());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("IOTA_") {
            cmd.env_remove(key);
        }
    }
    let line = one_line_failure(
        &cmd.output().unwrap(),
        "a hotkey off the metagraph",
        "iota register --network",
    );
    assert!(
        line.contains(&hotkey.to_string()) || line.contains("not on"),
        "{line}"
    );
    let _ = orchestrator.kill();
    let _ = orchestrator.wait();
}

/// A real node (a subtensor localnet, say): read the metagraph and the burn of
/// `IOTA_SUBTENSOR_NETUID` (default 1) from `IOTA_SUBTENSOR_URL`. Not run in CI, which has no
/// chain: `IOTA_SUBTENSOR_URL=ws://127.0.0.1:9944 cargo test --features adversary --test
/// chain_node -- --ignored`.
#[test]
#[ignore = "needs a subtensor node at IOTA_SUBTENSOR_URL"]
fn a_real_node_serves_a_metagraph_and_a_burn() {
    let url = std::env::var("IOTA_SUBTENSOR_URL")
        .expect("set IOTA_SUBTENSOR_URL to a subtensor node, e.g. ws://127.0.0.1:9944");
    let netuid: u16 = std::env::var("IOTA_SUBTENSOR_NETUID")
        .map(|n| n.parse().expect("IOTA_SUBTENSOR_NETUID is a number"))
        .unwrap_or(1);
    let chain = SubtensorChain::new(Network::Url(url)).unwrap();
    let metagraph = chain.metagraph(netuid).unwrap();
    let burn = chain.burn_cost(netuid).unwrap();
    let policy = chain.weights_policy(netuid).unwrap();
    eprintln!(
        "subnet {netuid}: {} neurons at block {}, burn {burn} rao, tempo {}, commit-reveal {}",
        metagraph.neurons.len(),
        metagraph.block,
        policy.tempo,
        policy.commit_reveal
    );
    assert!(metagraph.block > 0);
    for (i, neuron) in metagraph.neurons.iter().enumerate() {
        assert_eq!(usize::from(neuron.uid), i);
        assert!((0.0..=1.0).contains(&neuron.incentive));
    }
}

/// The pallet's weight rules, through iota's real client, on the FAKE node that applies them
/// (`tests/chain/weights_pallet.py`) to what the SDK decoded from iota's extrinsics: a
/// `set_weights` lands and is stored; a second one inside the rate limit, weights on others
/// without a permit and weights from a hotkey off the subnet are refused in one line each;
/// with commit-reveal on, `set_weights` is refused, a commit lands, a second commit inside the
/// rate limit is refused without touching the pending-commit file, and the reveal lands only in
/// the reveal epoch, hashed as the SDK hashes it, also for a pending entry whose commit block
/// was never noted (read back from the chain's `WeightCommits`).
#[test]
fn the_fake_nodes_weight_rules_refuse_and_accept_iotas_extrinsics() {
    use common::fake_node::{FakeNeuron, FakeNode, FakeSubnet};
    use iota::chain::pending::{PendingStore, Submitted, reveal_due, submit};
    use iota::wallet::Hotkey;

    let dir = tempfile::tempdir().unwrap();
    let (val, miner, stranger) = (
        Hotkey::from_uri("//FakeNodeVal").unwrap(),
        Hotkey::from_uri("//FakeNodeMiner").unwrap(),
        Hotkey::from_uri("//FakeNodeStranger").unwrap(),
    );
    let subnet = FakeSubnet {
        netuid: NETUID,
        tempo: 9,
        commit_reveal: false,
        reveal_period_epochs: 1,
        weights_rate_limit: 5,
        block_ms: 100,
    };
    let neuron = |key: &Hotkey, permit| FakeNeuron {
        hotkey: key.public_key(),
        stake_rao: 1_000_000_000_000,
        permit,
        incentive: 0,
    };
    let node = FakeNode::start(
        dir.path(),
        subnet,
        &[neuron(&val, true), neuron(&miner, false)],
    );
    let chain = SubtensorChain::new(Network::Url(node.url.clone()))
        .unwrap()
        .with_poll_interval(Duration::from_millis(50));
    let set = |uids: &[u16], values: &[u16]| WeightSubmission::Set {
        uids: uids.to_vec(),
        values: values.to_vec(),
        version_key: 0,
    };
    let one_line = |e: ChainError| {
        let text = e.to_string();
        assert!(!text.contains('\n'), "{text}");
        text
    };

    let block = chain
        .submit_weights(&val, NETUID, &set(&[0, 1], &[100, 65535]))
        .unwrap();
    let record = node.record();
    assert_eq!(
        record["weights"],
        json!([{"block": block, "uid": 0, "via": "set_weights", "uids": [0, 1], "values": [100, 65535]}])
    );
    // The metagraph's last_update is the block of the set.
    let metagraph = chain.metagraph(NETUID).unwrap();
    assert_eq!(metagraph.neurons[0].last_update, block);

    let err = chain
        .submit_weights(&val, NETUID, &set(&[1], &[7]))
        .unwrap_err();
    assert!(
        matches!(err, ChainError::RateLimited { blocks_left, .. } if blocks_left <= 5),
        "{err}"
    );
    assert!(one_line(err).contains("rate-limited"));
    let err = chain
        .submit_weights(&miner, NETUID, &set(&[0], &[7]))
        .unwrap_err();
    assert_eq!(err, ChainError::NoValidatorPermit { netuid: NETUID });
    let err = chain
        .submit_weights(&stranger, NETUID, &set(&[0], &[7]))
        .unwrap_err();
    assert!(matches!(err, ChainError::NotRegistered { .. }), "{err}");
    let failures: Vec<String> = node.record()["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["error"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        failures,
        [
            "SettingWeightsTooFast",
            "NeuronNoValidatorPermit",
            "HotKeyNotRegisteredInSubNet"
        ]
    );

    // Commit-reveal on (as the subnet owner would turn it on).
    node.set_subnet(json!({"commit_reveal": true}));
    let err = chain
        .submit_weights(&val, NETUID, &set(&[1], &[7]))
        .unwrap_err();
    assert!(matches!(err, ChainError::CommitReveal { .. }), "{err}");
    let store = PendingStore::new(dir.path().join("pending-commits.json"));
    // Past the rate limit of the set above, then commit.
    std::thread::sleep(Duration::from_millis(700));
    let Submitted::Committed {
        block: commit_block,
        reveal_epoch,
    } = submit(&chain, &val, &store, NETUID, &[0, 1], &[30000, 65535], 0).unwrap()
    else {
        panic!("commit-reveal is on")
    };
    let pending = std::fs::read(store.path()).unwrap();
    let err = submit(&chain, &val, &store, NETUID, &[1], &[1], 0).unwrap_err();
    assert!(err.to_string().contains("rate-limited"), "{err}");
    assert_eq!(
        std::fs::read(store.path()).unwrap(),
        pending,
        "a refused commit changed the pending-commit file"
    );
    // As if the validator had stopped before it noted the commit's block: the entry takes it
    // from the chain's WeightCommits.
    let mut entries = store.load().unwrap();
    assert_eq!(entries[0].commit_block, Some(commit_block));
    entries[0].commit_block = None;
    store.save(&entries).unwrap();
    // Not due yet, then due: revealed in the reveal epoch.
    let policy = chain.weights_policy(NETUID).unwrap();
    if policy.current_epoch(NETUID) < reveal_epoch {
        assert!(reveal_due(&chain, &val, &store).unwrap().is_empty());
    }
    while chain.weights_policy(NETUID).unwrap().current_epoch(NETUID) < reveal_epoch {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(reveal_due(&chain, &val, &store).unwrap().len(), 1);
    let record = node.record();
    let revealed = &record["weights"][1];
    assert_eq!(revealed["via"], "reveal_weights");
    assert_eq!(revealed["commit_block"], json!(commit_block));
    assert_eq!(
        (revealed["uids"].clone(), revealed["values"].clone()),
        (json!([0, 1]), json!([30000, 65535]))
    );
    let reveal_block = revealed["block"].as_u64().unwrap();
    assert_eq!(FakeNode::epoch(&subnet, reveal_block), reveal_epoch);
    assert!(store.load().unwrap().is_empty());
    assert_eq!(record["refusals"], json!([]));
}

/// `GET /api/weights`'s vector of validator `hotkey` if it is of `epoch`, mapped to uids as a
/// validator on a subnet maps it (each miner's weight on its uid, the burned share on uid
/// `burn_uid`) and converted to u16 by the SDK (`convert_weights_and_uids_for_emit`, in
/// `tests/chain/independent.py`): what the chain should hold for that window.
fn expected_on_chain(
    url: &str,
    hotkey: &str,
    epoch: u64,
    uid_of: &HashMap<String, u16>,
    burn_uid: u16,
) -> Option<Value> {
    let view: Value =
        serde_json::from_str(&common::net::http_get(&format!("{url}/api/weights"))?).ok()?;
    let mine = view["validators"]
        .as_array()?
        .iter()
        .find(|v| v["hotkey"] == hotkey && v["epoch"] == epoch)?;
    let mut by_uid: BTreeMap<u16, f64> = BTreeMap::new();
    for w in mine["weights"].as_array()? {
        let uid = uid_of[w["hotkey"].as_str()?];
        *by_uid.entry(uid).or_default() += w["weight"].as_f64()?;
    }
    *by_uid.entry(burn_uid).or_default() += mine["burn"].as_f64()?;
    let (uids, weights): (Vec<u16>, Vec<f64>) = by_uid.into_iter().unzip();
    let answer = run_python(
        "independent.py",
        &json!({
            "metadata": root().join(METADATA),
            "calls": [], "commit_hashes": [], "eras": [], "extrinsics": [],
            "emit": [{"uids": uids, "weights": weights}],
        }),
    );
    Some(answer["emit"][0].clone())
}

/// Polls `done` every 250 ms until it gives a value; on timeout panics with `what` and the
/// tails of the logs in `dir`.
fn wait_until<T>(
    dir: &Path,
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> Option<T>,
) -> T {
    let start = std::time::Instant::now();
    loop {
        if let Some(value) = done() {
            return value;
        }
        if start.elapsed() > timeout {
            let logs = common::procs::log_tails(dir, 30);
            panic!("timed out waiting for {what}\n{logs}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The arguments of `iota validate` as hotkey `val` of wallet `w` in `dir/wallets`, keeping
/// its state in `dir/val-state`, with the chain flags `chain` (`--network URL --netuid N`).
fn validate_args(dir: &Path, orchestrator: &str, chain: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["validate", "--wallet", "w", "--hotkey", "val"]
        .map(String::from)
        .into();
    for (flag, value) in [
        ("--orchestrator", orchestrator),
        ("--wallets-dir", s(&dir.join("wallets"))),
        ("--state-dir", s(&dir.join("val-state"))),
        ("--threads", "1"),
        ("--poll-ms", "250"),
    ] {
        args.extend([flag.to_owned(), value.to_owned()]);
    }
    args.extend(chain.iter().map(|a| a.to_string()));
    args
}

/// Starts `iota validate` ([`validate_args`]), logging to `dir/{log}`.
fn start_validator(
    dir: &Path,
    orchestrator: &str,
    chain: &[&str],
    log: &str,
) -> std::process::Child {
    let args = validate_args(dir, orchestrator, chain);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    common::procs::spawn(&args, &dir.join(log))
}

/// A validator end to end on a subnet served by the FAKE node (`tests/chain/fake_node_server.py`,
/// which applies the weights pallet's rules; not subtensor): a real `iota orchestrate` on the
/// subnet, three real `iota mine` and a real `iota validate`.
///
/// - (a) commit-reveal off: epoch 0's window is set with `set_weights`, and the chain holds
///   exactly `/api/weights`' vector mapped to uids (the burn on uid 0) and converted to u16 by
///   the SDK;
/// - (c) the rate limit (a million blocks) holds epoch 1's window back: the validator says it
///   waits and sends nothing; the subnet owner turns commit-reveal on and lowers the limit, and
///   the same window is committed;
/// - (b) the validator is killed after the commit and started again on its state directory;
///   the restarted process reveals in the reveal epoch, and the chain then holds epoch 1's
///   vector; the pallet refused nothing along the way.
#[test]
fn a_validator_on_a_fake_node_sets_waits_commits_and_reveals_after_a_restart() {
    use common::fake_node::{FakeNeuron, FakeNode, FakeSubnet};
    use common::procs::{Kids, spawn_miner, start_orchestrator, write_config_with};
    use iota::wallet::WalletDir;

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let wallets = WalletDir::new(dir.join("wallets"));
    let names = ["owner", "val", "m0", "m1", "m2"];
    let keys: Vec<iota::wallet::Hotkey> = names
        .iter()
        .map(|n| wallets.create_hotkey("w", n, true).unwrap())
        .collect();
    let uid_of: HashMap<String, u16> = keys
        .iter()
        .enumerate()
        .map(|(uid, k)| (k.address().to_string(), uid as u16))
        .collect();
    let val = keys[1].address().to_string();
    let subnet = FakeSubnet {
        netuid: NETUID,
        tempo: 79,
        commit_reveal: false,
        reveal_period_epochs: 1,
        weights_rate_limit: 1_000_000,
        block_ms: 250,
    };
    let neurons: Vec<FakeNeuron> = keys
        .iter()
        .enumerate()
        .map(|(uid, k)| FakeNeuron {
            hotkey: k.public_key(),
            stake_rao: if uid == 1 { 1_000_000_000_000 } else { 0 },
            permit: uid == 1,
            incentive: 0,
        })
        .collect();
    let node = FakeNode::start(dir, subnet, &neurons);
    let (url, config) = write_config_with(
        dir,
        "on-the-fake-node",
        &format!(
            "heartbeat_s: 1\neval_samples: 0\nbatches_before_merging: 4\nmax_samples: 8\n\
             deadlines: {{ forward_s: 30, backward_s: 60 }}\n\
             merge: {{ upload_s: 30, lease_grace_s: 5, merge_s: 60 }}\n\
             validation: {{ retain_s: 3600 }}\n\
             chain: {{ network: \"{}\", netuid: {NETUID}, refresh_secs: 1, burn_uid: 0 }}\n",
            node.url
        ),
    );
    let _orchestrator = Kids(vec![start_orchestrator(dir, &config, &url)]);
    let _miners = Kids(
        names[2..]
            .iter()
            .map(|n| spawn_miner(dir, &url, n, &[]))
            .collect(),
    );
    let netuid = NETUID.to_string();
    let chain_flags = ["--network", node.url.as_str(), "--netuid", netuid.as_str()];
    let validator = Kids(vec![start_validator(dir, &url, &chain_flags, "val-1.log")]);

    // (a) set_weights with /api/weights' vector of epoch 0.
    let set = wait_until(
        dir,
        "epoch 0's weights on the fake node",
        Duration::from_secs(400),
        || node.record()["weights"].as_array()?.first().cloned(),
    );
    assert_eq!(
        (set["uid"].as_u64(), set["via"].as_str()),
        (Some(1), Some("set_weights")),
        "{set}"
    );
    let expected = expected_on_chain(&url, &val, 0, &uid_of, 0)
        .expect("/api/weights shows the validator's epoch 0");
    assert_eq!(json!([set["uids"], set["values"]]), expected);

    // (c) epoch 1's window waits for the rate limit, and nothing is sent meanwhile.
    let log1 = dir.join("val-1.log");
    wait_until(
        dir,
        "epoch 1 waiting for the rate limit",
        Duration::from_secs(400),
        || {
            std::fs::read_to_string(&log1)
                .ok()?
                .contains("weights of epoch 1 wait")
                .then_some(())
        },
    );
    let record = node.record();
    assert_eq!(record["weights"].as_array().unwrap().len(), 1, "{record}");
    assert_eq!(record["failures"], json!([]), "{record}");
    node.set_subnet(json!({"commit_reveal": true}));
    node.set_subnet(json!({"weights_rate_limit": 4}));
    let (commit_block, reveal_epoch) =
        wait_until(dir, "epoch 1's commit", Duration::from_secs(60), || {
            let text = std::fs::read_to_string(&log1).ok()?;
            let line = text
                .lines()
                .find(|l| l.contains("weights of epoch 1 committed"))?;
            let number = |after: &str| -> Option<u64> {
                line.split(after)
                    .nth(1)?
                    .split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse()
                    .ok()
            };
            Some((number("at block ")?, number("chain epoch ")?))
        });
    assert_eq!(FakeNode::epoch(&subnet, commit_block) + 1, reveal_epoch);

    // (b) killed with the commit pending, restarted: the reveal comes from the new process.
    drop(validator);
    let pending =
        std::fs::read_to_string(dir.join("val-state/on-the-fake-node/pending-commits.json"))
            .expect("the pending commit on disk");
    assert!(
        pending.contains(&format!("\"commit_block\": {commit_block}")),
        "{pending}"
    );
    assert_eq!(node.record()["weights"].as_array().unwrap().len(), 1);
    let _validator = Kids(vec![start_validator(dir, &url, &chain_flags, "val-2.log")]);
    let revealed = wait_until(dir, "the reveal", Duration::from_secs(120), || {
        node.record()["weights"].as_array()?.get(1).cloned()
    });
    assert_eq!(revealed["via"], "reveal_weights", "{revealed}");
    assert_eq!(revealed["commit_block"], json!(commit_block));
    let reveal_block = revealed["block"].as_u64().unwrap();
    assert_eq!(FakeNode::epoch(&subnet, reveal_block), reveal_epoch);
    let expected = expected_on_chain(&url, &val, 1, &uid_of, 0)
        .expect("/api/weights shows the validator's epoch 1");
    assert_eq!(json!([revealed["uids"], revealed["values"]]), expected);
    // The node records the reveal before the validator hears back and logs it.
    wait_until(
        dir,
        "the validator's log of the reveal",
        Duration::from_secs(30),
        || {
            std::fs::read_to_string(dir.join("val-2.log"))
                .ok()
                .filter(|log| log.contains("revealed on chain"))
        },
    );
    assert!(
        !std::fs::read_to_string(&log1)
            .unwrap()
            .contains("revealed on chain")
    );
    let record = node.record();
    assert_eq!(
        (record["failures"].clone(), record["refusals"].clone()),
        (json!([]), json!([])),
        "{record}"
    );
}

/// Runs `iota` with `args` until it exits or `secs` pass (then kills it); returns whether it
/// succeeded, and its stderr.
fn run_briefly(args: &[&str], secs: u64) -> (Option<bool>, String) {
    let mut cmd = Command::new(common::procs::iota_bin());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("IOTA_") {
            cmd.env_remove(key);
        }
    }
    let mut child = cmd.spawn().expect("run iota");
    let start = std::time::Instant::now();
    let done = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status.success());
        }
        if start.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    use std::io::Read;
    let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
    (done, stderr)
}

/// A validator's subnet comes from its own flags, not from the orchestrator: against a real
/// `iota orchestrate` on subnet 3 of the FAKE node, `iota validate` set for subnet 4, for no
/// chain, or for a node it cannot reach is refused in one line naming both sides and writes
/// no state; set for the same node under another URL (`ws://` instead of `http://`), it is
/// let in, because its node reports the genesis hash the orchestrator's node reported.
#[test]
fn a_validator_set_for_another_subnet_than_the_runs_is_refused_in_one_line() {
    use common::fake_node::{FakeNeuron, FakeNode, FakeSubnet};
    use common::procs::{Kids, start_orchestrator, write_config_with};

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let val = iota::wallet::WalletDir::new(dir.join("wallets"))
        .create_hotkey("w", "val", true)
        .unwrap();
    let subnet = FakeSubnet {
        netuid: NETUID,
        tempo: 99,
        commit_reveal: false,
        reveal_period_epochs: 1,
        weights_rate_limit: 100,
        block_ms: 1000,
    };
    let neuron = FakeNeuron {
        hotkey: val.public_key(),
        stake_rao: 1_000_000_000_000,
        permit: true,
        incentive: 0,
    };
    let node = FakeNode::start(dir, subnet, &[neuron]);
    let (url, config) = write_config_with(
        dir,
        "subnet-choice",
        &format!(
            "chain: {{ network: \"{}\", netuid: {NETUID}, refresh_secs: 1 }}\n",
            node.url
        ),
    );
    let _orchestrator = Kids(vec![start_orchestrator(dir, &config, &url)]);
    let state = dir.join("val-state");
    let validate = |chain: &[&str], secs: u64| {
        let args = validate_args(dir, &url, chain);
        run_briefly(&args.iter().map(String::as_str).collect::<Vec<_>>(), secs)
    };
    let nobody = format!("http://127.0.0.1:{}", common::net::free_port());
    for (chain, needle) in [
        (
            vec!["--network", node.url.as_str(), "--netuid", "4"],
            format!(
                "the orchestrator announces subnet {NETUID} of {}, and this validator is set for subnet 4 of {}",
                node.url, node.url
            ),
        ),
        (
            vec![],
            format!(
                "this validator is set for no chain: pass --network {} --netuid {NETUID}",
                node.url
            ),
        ),
        (
            vec!["--network", nobody.as_str(), "--netuid", "3"],
            format!("cannot reach the subtensor node at {nobody}"),
        ),
    ] {
        let (ok, stderr) = validate(&chain, 60);
        assert_eq!(ok, Some(false), "{chain:?} should be refused:\n{stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("iota: ")).collect();
        assert_eq!(errors.len(), 1, "{stderr}");
        assert!(errors[0].contains(&needle), "{chain:?}:\n{stderr}");
        assert!(!state.exists(), "a refused validator wrote its state");
    }
    // The same node through another URL: the genesis hashes agree, so it is let in.
    let ws = node.url.replacen("http://", "ws://", 1);
    let (done, stderr) = validate(&["--network", &ws, "--netuid", "3"], 10);
    assert_eq!(done, None, "it should run until stopped:\n{stderr}");
    assert!(
        stderr.contains(&format!("weights go to subnet {NETUID} of {}", node.url)),
        "{stderr}"
    );
}
