//! The **FAKE** subtensor node of `tests/chain/fake_node_server.py`, run as a child process: a
//! JSON-RPC server that makes a block every `block_ms`, has the Bittensor SDK decode and
//! `bittensor-wallet` verify every submitted extrinsic, applies the weights pallet's rules
//! (`tests/chain/weights_pallet.py`, written from the pallet's source) to one subnet, and
//! answers reads with bytes the SDK's codec encoded. It is not subtensor and says nothing about
//! what a real node accepts. Killed on drop.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};

use iota::chain::subtensor::rpc::RpcClient;
use serde_json::{Value, json};

/// The recorded runtime metadata the fake node serves (subtensor spec 461).
pub const METADATA: &str = "tests/chain/metadata/subtensor-spec461-v15.scale";

/// A neuron of the fake node's subnet (uid = its index).
#[derive(Debug, Clone)]
pub struct FakeNeuron {
    /// The hotkey's public key.
    pub hotkey: [u8; 32],
    /// Stake, in rao.
    pub stake_rao: u64,
    /// Whether it holds a validator permit.
    pub permit: bool,
    /// Incentive, as the u16 the metagraph carries.
    pub incentive: u16,
}

/// The fake node's subnet settings.
#[derive(Debug, Clone, Copy)]
pub struct FakeSubnet {
    /// The subnet.
    pub netuid: u16,
    /// Blocks per epoch, less one.
    pub tempo: u16,
    /// Whether commit-reveal is on.
    pub commit_reveal: bool,
    /// Epochs from a commit to its reveal.
    pub reveal_period_epochs: u64,
    /// Blocks between two submissions of one uid.
    pub weights_rate_limit: u64,
    /// One block every this many milliseconds.
    pub block_ms: u64,
}

/// A running fake node; killed on drop.
pub struct FakeNode {
    child: Child,
    // Held so the server sees its stdin close (and exits) only when this is dropped.
    _stdin: ChildStdin,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    rpc: RpcClient,
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl FakeNode {
    /// Starts the fake node for `subnet` with `neurons`, its config and log in `dir`.
    pub fn start(dir: &Path, subnet: FakeSubnet, neurons: &[FakeNeuron]) -> FakeNode {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let config = json!({
            "metadata": root.join(METADATA),
            "block_ms": subnet.block_ms,
            "start_block": 100,
            "netuid": subnet.netuid,
            "subnet": {
                "tempo": subnet.tempo,
                "commit_reveal": subnet.commit_reveal,
                "reveal_period_epochs": subnet.reveal_period_epochs,
                "weights_rate_limit": subnet.weights_rate_limit,
                "version_key": 0,
            },
            "neurons": neurons.iter().enumerate().map(|(i, n)| json!({
                "hotkey": format!("0x{}", hex::encode(n.hotkey)),
                "coldkey": format!("0x{}", hex::encode([0x40 + i as u8; 32])),
                "stake": n.stake_rao,
                "permit": n.permit,
                "incentive": n.incentive,
            })).collect::<Vec<_>>(),
        });
        let path = dir.join("fake-node.json");
        std::fs::write(&path, config.to_string()).expect("writing the fake node's config");
        let log = std::fs::File::create(dir.join("fake-node.log")).expect("the fake node's log");
        let python = super::venv::python("tests/chain/requirements.txt", "chain");
        let mut child = Command::new(python)
            .arg(root.join("tests/chain/fake_node.py"))
            .arg("serve")
            .arg(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("starting the fake node");
        let stdin = child.stdin.take().expect("the fake node's stdin");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("the fake node's stdout"))
            .read_line(&mut line)
            .expect("reading the fake node's port");
        let port = serde_json::from_str::<Value>(&line)
            .ok()
            .and_then(|v| v["port"].as_u64())
            .unwrap_or_else(|| {
                let log = std::fs::read_to_string(dir.join("fake-node.log")).unwrap_or_default();
                panic!("the fake node did not start: {line:?}\n{log}")
            });
        let url = format!("http://127.0.0.1:{port}");
        let rpc = RpcClient::new(&url).expect("a client of the fake node");
        FakeNode {
            child,
            _stdin: stdin,
            url,
            rpc,
        }
    }

    /// Changes the subnet's settings (`commit_reveal`, `weights_rate_limit`, ...), as its
    /// owner's sudo calls would on a chain.
    pub fn set_subnet(&self, changes: Value) {
        self.rpc
            .call("fake_setSubnet", json!([changes]))
            .expect("fake_setSubnet");
    }

    /// What the fake node recorded: `best` block, `weights` (each set or reveal that landed:
    /// block, uid, via, uids, values, commit_block), `failures` (dispatches the pallet
    /// refused: block, call, error), `refusals` (transactions refused at submission),
    /// `last_update`.
    pub fn record(&self) -> Value {
        self.rpc
            .call("fake_record", json!([]))
            .expect("fake_record")
    }

    /// The subnet's epoch of `block` (subtensor's `(block + netuid + 1) / (tempo + 1)`).
    pub fn epoch(subnet: &FakeSubnet, block: u64) -> u64 {
        iota::chain::epoch_index(subnet.netuid, subnet.tempo, block)
    }
}
