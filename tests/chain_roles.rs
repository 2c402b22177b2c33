//! The roles on a chain, driven in-process by the FAKE chain (`iota::chain::fake`, an in-memory
//! stand-in that applies the pallet's weight checks; it is not subtensor and proves nothing
//! about a real node):
//!
//! - the orchestrator, served over real HTTP with real sr25519 signatures, admits only hotkeys
//!   on the FAKE chain's metagraph, takes validators and stake from its permits, keeps the last
//!   metagraph when a refresh fails, drops a miner whose uid went to another hotkey, and shows
//!   uids, incentive, the validators' last weights block and their weights as the chain stores
//!   them in `/api/status` and `iota status`;
//!   `iota orchestrate` on a chain it cannot read stops with one line before it serves;
//! - a validator's weights on the FAKE chain: set where commit-reveal is off, waiting for the
//!   rate limit instead of sending; committed where it is on, revealed in the reveal epoch by
//!   a validator restarted on the same state directory; one-line refusals, with nothing
//!   written, for a hotkey that is not registered or holds no permit and for a node that
//!   cannot be reached;
//! - the run config's `chain` block and its one-line errors.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::api_harness::{config, dataset, key, weights};
use common::cli::{iota, one_line_failure, s};
use iota::api::client::{ApiClient, ClientError, patient_policy};
use iota::api::*;
use iota::chain::fake::{FakeSubnetConfig, FakeSubtensor};
use iota::chain::shared::SharedChain;
use iota::chain::{Chain, epoch_index};
use iota::orchestrator::blob_token::BlobSecret;
use iota::orchestrator::state::system_clock;
use iota::orchestrator::subnet::Subnet;
use iota::orchestrator::{AppState, Repository, RunConfig, serve};
use iota::storage::Storage;
use iota::validator::onchain::{Event, OnChain};
use iota::wallet::Hotkey;

const NETUID: u16 = 7;
const NODE: &str = "ws://127.0.0.1:9944";

fn subnet_config(commit_reveal: bool) -> FakeSubnetConfig {
    FakeSubnetConfig {
        tempo: 10,
        commit_reveal,
        reveal_period_epochs: 1,
        weights_rate_limit: 5,
        version_key: 0,
    }
}

/// A FAKE chain with subnet [`NETUID`]; `keys` registered in order (uid = index), the ones
/// marked with a validator permit.
fn fake_chain(commit_reveal: bool, keys: &[(&Hotkey, bool)]) -> Arc<FakeSubtensor> {
    let fake = Arc::new(FakeSubtensor::new());
    fake.add_subnet(NETUID, subnet_config(commit_reveal));
    for (i, (k, permit)) in keys.iter().enumerate() {
        let uid = fake
            .register_hotkey(NETUID, &k.public_key(), *permit)
            .unwrap();
        assert_eq!(usize::from(uid), i);
    }
    fake
}

fn run_on_chain() -> RunConfig {
    config(&format!(
        "chain: {{network: \"{NODE}\", netuid: {NETUID}, refresh_secs: 1}}\n\
         validation: {{retain_s: 3600}}\n"
    ))
}

fn run_chain() -> RunChain {
    RunChain {
        network: NODE.into(),
        netuid: NETUID,
        burn_uid: 0,
        genesis: None,
    }
}

async fn client(url: &str, hotkey: Option<&Hotkey>) -> ApiClient {
    ApiClient::connect(url, hotkey.cloned(), patient_policy())
        .await
        .unwrap()
}

fn refusal(result: Result<impl std::fmt::Debug, ClientError>) -> (u16, String, String) {
    match result {
        Err(ClientError::Api {
            status,
            code,
            message,
            ..
        }) => (status, code, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Waits (up to 15 s) until `done` holds.
async fn eventually(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orchestrator_on_the_fake_chain_admits_its_hotkeys_and_drops_departed_ones() {
    let (alice, val, dave, bob, carol) = (
        key("//Alice"),
        key("//Val1"),
        key("//Dave"),
        key("//Bob"),
        key("//Carol"),
    );
    // uid 0 a miner, uid 1 a validator with 2 TAO, uid 2 registered without a permit.
    let fake = fake_chain(false, &[(&alice, false), (&val, true), (&dave, false)]);
    fake.set_neuron(NETUID, &alice.public_key(), 0, 0.25);
    fake.set_neuron(NETUID, &val.public_key(), 2_000_000_000, 0.0);
    let shared: SharedChain = fake.clone();

    let cfg = run_on_chain();
    let subnet = Subnet::connect(shared.clone(), cfg.chain.clone().unwrap(), 0).unwrap();
    let data = dataset(&cfg);
    let state = AppState::from_parts(
        cfg,
        Repository::open_in_memory().unwrap(),
        Storage::in_memory(),
        data,
        BlobSecret::from_bytes([3; 32]),
        system_clock(),
    )
    .unwrap();
    state.attach_subnet(Arc::new(subnet));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(state.clone(), listener, async {
        let _ = stopped.await;
    }));
    let join = RegisterRequest {
        device: "cpu".into(),
        max_in_flight: 1,
    };

    // A hotkey not on the metagraph is refused with the command that registers it.
    let (status, code, message) = refusal(client(&url, Some(&bob)).await.register(&join).await);
    assert_eq!((status, code.as_str()), (403, "not_on_chain"));
    assert!(
        message.contains(&format!("iota register --network {NODE} --netuid {NETUID}"))
            && !message.contains('\n'),
        "{message}"
    );
    assert!(
        state
            .repo
            .miner(&bob.address().to_string())
            .unwrap()
            .is_none()
    );
    let miner = client(&url, Some(&alice)).await;
    let reg = miner.register(&join).await.unwrap();
    assert_eq!(reg.hotkey, alice.address().to_string());

    // Validators are the permit holders, with their stake in TAO; the run's chain is named.
    let vreq = ValidatorRegisterRequest {
        device: "cpu".into(),
    };
    let vreg = client(&url, Some(&val))
        .await
        .register_validator(&vreq)
        .await
        .unwrap();
    assert_eq!(vreg.stake, 2.0);
    // With the chain's genesis hash, so a validator can tell the chain whatever node it uses.
    assert_eq!(
        vreg.chain,
        Some(RunChain {
            genesis: Some(hex::encode(iota::chain::fake::FAKE_GENESIS)),
            ..run_chain()
        })
    );
    let (status, code, message) = refusal(
        client(&url, Some(&dave))
            .await
            .register_validator(&vreq)
            .await,
    );
    assert_eq!((status, code.as_str()), (403, "not_a_validator"));
    assert!(message.contains("no validator permit"), "{message}");

    // The status shows uids and incentive; only Alice is a miner here.
    let public = client(&url, None).await;
    let chain = public.status().await.unwrap().chain.unwrap();
    assert_eq!((chain.netuid, chain.network.as_str()), (NETUID, NODE));
    assert_eq!(chain.neurons.len(), 3);
    let a = &chain.neurons[0];
    assert_eq!(
        (a.uid, a.hotkey.as_str(), a.incentive, a.miner),
        (0, reg.hotkey.as_str(), 0.25, true)
    );
    assert!(chain.neurons[1].validator_permit && chain.neurons[1].stake_tao == 2.0);
    assert!(!chain.neurons[2].miner);

    // The validator sets weights on the FAKE chain; the next refresh shows at which block.
    let dir = tempfile::tempdir().unwrap();
    let mut onchain = OnChain::open(shared.clone(), val.clone(), &run_chain(), dir.path()).unwrap();
    onchain.queue(&weights(0, 0.1, &[(&alice, 0.9)]));
    let events = tokio::task::spawn_blocking(move || onchain.step())
        .await
        .unwrap()
        .unwrap();
    let [Event::Set { block, .. }] = events[..] else {
        panic!("{events:?}")
    };
    fake.advance(1);
    eventually(
        "the refresh shows the validator's weights block",
        async || {
            let chain = public.status().await.unwrap().chain.unwrap();
            chain.neurons[1].last_update == block
                && chain.block == block + 1
                // The burn and the miner are both uid 0: its weight is the whole vector.
                && chain.neurons[1].weights == [(0, 1.0)]
                && chain.neurons[1].weights_count == 1
        },
    )
    .await;

    // `iota status` shows the miner's uid and incentive, and the validator's weights block and
    // the weights the FAKE chain holds for it.
    let status_url = url.clone();
    let out = tokio::task::spawn_blocking(move || iota(&["status", "--orchestrator", &status_url]))
        .await
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert!(
        table.contains(&format!(
            "chain: subnet {NETUID} on {NODE}, metagraph of block"
        )),
        "{table}"
    );
    let row = |hotkey: &str| {
        table
            .lines()
            .find(|l| l.contains(hotkey) && (l.contains("miner ") || l.contains("validator")))
            .unwrap_or_else(|| panic!("no chain row of {hotkey}:\n{table}"))
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        row(&reg.hotkey),
        ["0", "miner", &reg.hotkey, "0.000", "0.2500", "never"]
    );
    let val_ss58 = val.address().to_string();
    assert_eq!(
        row(&val_ss58),
        [
            "1",
            "validator",
            &val_ss58,
            "2.000",
            "0.0000",
            &block.to_string(),
            "0:",
            "1.000"
        ]
    );

    // A failed refresh keeps the metagraph before it and says why.
    fake.set_unreadable(true);
    eventually("a failed refresh is shown", async || {
        let chain = public.status().await.unwrap().chain.unwrap();
        chain.error.is_some_and(|e| e.contains("fake chain")) && chain.neurons.len() == 3
    })
    .await;
    assert!(
        miner
            .work(&WorkRequest { max: 1, wait_ms: 0 })
            .await
            .is_ok()
    );
    fake.set_unreadable(false);

    // Alice's uid goes to Carol: Alice loses her seat and is refused; Carol may join.
    fake.replace_uid(NETUID, 0, &carol.public_key());
    let alice_ss58 = alice.address().to_string();
    eventually("the departed miner is dropped from routing", async || {
        state
            .repo
            .miner(&alice_ss58)
            .unwrap()
            .is_some_and(|m| m.last_seen_ms == 0)
    })
    .await;
    let (status, code, _) = refusal(miner.work(&WorkRequest { max: 1, wait_ms: 0 }).await);
    assert_eq!((status, code.as_str()), (403, "not_on_chain"));
    let chain = public.status().await.unwrap().chain.unwrap();
    assert!(chain.error.is_none());
    assert_eq!(chain.neurons[0].hotkey, carol.address().to_string());
    assert!(!chain.neurons[0].miner);
    client(&url, Some(&carol))
        .await
        .register(&join)
        .await
        .unwrap();

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

#[test]
fn a_chain_that_cannot_be_read_stops_the_orchestrator_before_it_serves() {
    // The FAKE chain has no subnet 7.
    let fake: SharedChain = Arc::new(FakeSubtensor::new());
    let err = Subnet::connect(fake, run_on_chain().chain.unwrap(), 0)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!(
            "cannot read the metagraph of subnet {NETUID} on {NODE}"
        )) && !err.contains('\n'),
        "{err}"
    );
}

#[test]
fn iota_orchestrate_on_a_chain_it_cannot_read_stops_with_one_line_before_serving() {
    // No subtensor node listens on port 1; without a client in this build no node is read at
    // all. Either way the orchestrator stops before it serves.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("run.yaml");
    std::fs::write(
        &config,
        format!(
            "run: on-chain\nlisten: 127.0.0.1:0\ndata_dir: {}\n\
             chain: {{network: \"ws://127.0.0.1:1\", netuid: 9}}\n",
            s(&dir.path().join("state"))
        ),
    )
    .unwrap();
    let out = iota(&["orchestrate", "--config", s(&config)]);
    let line = one_line_failure(
        &out,
        "iota orchestrate on an unreadable chain",
        "cannot read the metagraph of subnet 9 on ws://127.0.0.1:1",
    );
    assert!(
        !line.contains("iota orchestrator: run"),
        "it served: {line}"
    );
}

#[test]
fn the_chain_block_of_a_run_config_is_checked() {
    assert!(config("").chain.is_none());
    let chain = run_on_chain().chain.unwrap();
    assert_eq!(
        (chain.netuid, chain.refresh_secs, chain.burn_uid),
        (NETUID, 1, 0)
    );
    assert_eq!(chain.network.to_string(), NODE);
    let finney = config("chain: {network: finney, netuid: 9}\n")
        .chain
        .unwrap();
    assert_eq!(
        (finney.network.to_string(), finney.refresh_secs),
        ("finney".into(), 60)
    );
    let val = key("//Val1").address().to_string();
    for (yaml, needle) in [
        ("chain: {network: moon, netuid: 9}", "chain.network"),
        ("chain: {network: local, netuid: 9}", "chain.network"),
        (
            "chain: {network: test, netuid: 9, refresh_secs: 0}",
            "chain.refresh_secs",
        ),
        ("chain: {network: test}", "netuid"),
        ("chain: {network: test, netuid: 9, tempo: 3}", "tempo"),
        (
            &format!("chain: {{network: test, netuid: 9}}\nvalidators: [{{hotkey: {val}}}]"),
            "validator permits",
        ),
    ] {
        let text = format!(
            "run: r\nmodel: {{preset: tiny}}\nbatch_size: 2\nseq_len: 8\nwire: f32\n{yaml}\n"
        );
        let err = RunConfig::from_yaml(&text).unwrap_err().to_string();
        assert!(err.contains(needle) && !err.contains('\n'), "{yaml}: {err}");
    }
}

#[test]
fn a_validator_sets_weights_on_the_fake_chain_and_waits_for_the_rate_limit() {
    let (val, m1, m2) = (key("//Val1"), key("//Miner1"), key("//Miner2"));
    // uid 0 takes the burn, then the validator and two miners; an unregistered miner is left
    // out.
    let owner = key("//Owner");
    let fake = fake_chain(
        false,
        &[(&owner, false), (&val, true), (&m1, false), (&m2, false)],
    );
    let dir = tempfile::tempdir().unwrap();
    let mut onchain = OnChain::open(fake.clone(), val.clone(), &run_chain(), dir.path()).unwrap();
    let stranger = key("//Stranger");
    onchain.queue(&weights(
        3,
        0.2,
        &[(&m1, 0.6), (&m2, 0.2), (&stranger, 0.0)],
    ));
    let events = onchain.step().unwrap();
    assert!(
        matches!(
            events[..],
            [Event::Set {
                epoch: 3,
                uids: 3,
                ..
            }]
        ),
        "{events:?}"
    );
    // 0.2 : 0.6 : 0.2, the largest at u16::MAX (the SDK's conversion).
    assert_eq!(
        fake.weights_of(NETUID, 1),
        [(0, 21845), (2, 65535), (3, 21845)]
    );
    assert_eq!(onchain.last_submitted().unwrap().epoch, 3);

    // The next window comes before the rate limit allows: it waits, nothing is sent.
    onchain.queue(&weights(4, 0.2, &[(&m2, 0.8)]));
    let events = onchain.step().unwrap();
    assert!(
        matches!(
            events[..],
            [Event::Waiting {
                epoch: 4,
                blocks_left: 5
            }]
        ),
        "{events:?}"
    );
    assert_eq!(onchain.queued(), Some(4));
    assert_eq!(fake.weights_of(NETUID, 1).len(), 3);
    fake.advance(5);
    let events = onchain.step().unwrap();
    assert!(
        matches!(
            events[..],
            [Event::Set {
                epoch: 4,
                uids: 2,
                ..
            }]
        ),
        "{events:?}"
    );
    assert_eq!(fake.weights_of(NETUID, 1), [(0, 16384), (3, 65535)]);
    // Nothing queued: a step sends nothing; an old window is not queued again.
    onchain.queue(&weights(4, 0.2, &[(&m1, 0.8)]));
    assert_eq!(onchain.queued(), None);
    assert!(onchain.step().unwrap().is_empty());
}

#[test]
fn a_commit_on_the_fake_chain_is_revealed_by_a_restarted_validator() {
    let (owner, val, m1) = (key("//Owner"), key("//Val1"), key("//Miner1"));
    let fake = fake_chain(true, &[(&owner, false), (&val, true), (&m1, false)]);
    let dir = tempfile::tempdir().unwrap();
    let (block, reveal_epoch) = {
        let mut onchain =
            OnChain::open(fake.clone(), val.clone(), &run_chain(), dir.path()).unwrap();
        onchain.queue(&weights(0, 0.5, &[(&m1, 0.5)]));
        let events = onchain.step().unwrap();
        let [
            Event::Committed {
                epoch: 0,
                block,
                reveal_epoch,
            },
        ] = events[..]
        else {
            panic!("{events:?}")
        };
        assert_eq!(reveal_epoch, epoch_index(NETUID, 10, block) + 1);
        (block, reveal_epoch)
        // The validator stops here, before the reveal epoch.
    };
    assert_eq!(fake.pending_commits(NETUID, &val.public_key()), 1);
    assert!(fake.weights_of(NETUID, 1).is_empty());

    // Restarted on the same state directory: the window is not committed again, and nothing
    // is revealed before its epoch.
    let mut onchain = OnChain::open(fake.clone(), val.clone(), &run_chain(), dir.path()).unwrap();
    assert_eq!(
        onchain.last_submitted().map(|r| (r.epoch, r.block)),
        Some((0, block))
    );
    onchain.queue(&weights(0, 0.5, &[(&m1, 0.5)]));
    assert_eq!(onchain.queued(), None);
    assert!(onchain.step().unwrap().is_empty());
    while fake.weights_policy(NETUID).unwrap().current_epoch(NETUID) < reveal_epoch {
        fake.advance(1);
    }
    let events = onchain.step().unwrap();
    assert_eq!(events, [Event::Revealed { uids: 2 }]);
    assert_eq!(fake.weights_of(NETUID, 1), [(0, 65535), (2, 65535)]);
    assert_eq!(fake.pending_commits(NETUID, &val.public_key()), 0);
}

#[test]
fn a_validator_without_a_registration_or_a_permit_is_told_in_one_line() {
    let (val, m1) = (key("//Val1"), key("//Miner1"));
    let fake = fake_chain(false, &[(&m1, false)]);
    let dir = tempfile::tempdir().unwrap();
    let mut onchain = OnChain::open(fake.clone(), val.clone(), &run_chain(), dir.path()).unwrap();
    onchain.queue(&weights(0, 0.5, &[(&m1, 0.5)]));
    let err = onchain.step().unwrap_err().to_string();
    assert!(
        err.contains("is not registered on subnet 7") && !err.contains('\n'),
        "{err}"
    );
    fake.register_hotkey(NETUID, &val.public_key(), false)
        .unwrap();
    let err = onchain.step().unwrap_err().to_string();
    assert!(err.contains("no validator permit"), "{err}");
    // Refused twice: no record, no pending commit written.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    assert_eq!(onchain.queued(), Some(0));
    // The window stays queued: it goes once the permit comes.
    fake.register_hotkey(NETUID, &val.public_key(), true)
        .unwrap();
    assert!(matches!(onchain.step().unwrap()[..], [Event::Set { .. }]));
}

#[test]
fn a_validator_whose_node_cannot_be_reached_is_told_in_one_line_and_writes_nothing() {
    let (val, m1) = (key("//Val1"), key("//Miner1"));
    let port = common::net::free_port();
    let nobody = iota::chain::shared::shared_chain_for(iota::chain::Network::Url(format!(
        "http://127.0.0.1:{port}"
    )));
    let dir = tempfile::tempdir().unwrap();
    let mut onchain = OnChain::open(nobody, val.clone(), &run_chain(), dir.path()).unwrap();
    onchain.queue(&weights(0, 0.5, &[(&m1, 0.5)]));
    let err = onchain.step().unwrap_err().to_string();
    assert!(
        err.starts_with(&format!(
            "cannot reach the subtensor node at http://127.0.0.1:{port}"
        )) && !err.contains('\n'),
        "{err}"
    );
    // The window stays queued for the next step; nothing was written.
    assert_eq!(onchain.queued(), Some(0));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
