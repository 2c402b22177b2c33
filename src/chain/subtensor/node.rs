//! [`SubtensorChain`]: the [`Chain`] trait against a subtensor node, over [`RpcClient`].
//!
//! On first use it reads the node's runtime version, metadata and genesis hash, and checks the
//! metadata ([`Metadata::check_iota_uses`], plus the storage items and the metagraph fields
//! read here): a runtime that no longer has what iota encodes is refused with one line
//! ([`ChainError::RuntimeChanged`]) before anything is signed. The metadata is read again when
//! the node reports another `spec_version` (a runtime upgrade).
//!
//! Reads: the metagraph from `SubnetInfoRuntimeApi.get_metagraph`, the burn, balances, uids and
//! weight settings from storage, every value decoded with the metadata's own types.
//!
//! Writes (`burned_register`, `set_weights`, `commit_weights`, `reveal_weights`): a mortal
//! extrinsic signed by the caller's key, submitted with `author_submitExtrinsic`; then the best
//! chain is polled block by block until a block carries the extrinsic's hash, and the
//! `System.Events` of that block say whether it succeeded. A `DispatchError::Module` is named
//! from the metadata's pallet error enum and mapped onto [`ChainError`]. Inclusion in a block of
//! the best chain is what is waited for, not finality.
//!
//! Blocking: every method blocks on HTTP requests (see [`super::rpc`]); async callers must call
//! it inside `tokio::task::spawn_blocking`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blake2::{Blake2b256, Digest};
use scale_info::TypeDef;
use scale_value::Value;

use super::SubtensorError;
use super::calls;
use super::extrinsic::{self, Era, TxParams};
use super::metadata::{Metadata, SUBTENSOR_PALLET};
use super::rpc::{RpcClient, endpoint_of};
use super::storage::{self, Decoded};
use crate::chain::{
    Chain, ChainError, ChainRegistration, Metagraph, Network, Neuron, OnChainRegistration,
    Registrant, WeightSubmission, WeightsPolicy,
};
use crate::wallet::{Hotkey, Ss58Address};

/// The runtime API method the metagraph comes from.
const METAGRAPH_API: (&str, &str) = ("SubnetInfoRuntimeApi", "get_metagraph");

/// The fields of the metagraph iota reads; the runtime API's output must have all of them.
pub const METAGRAPH_FIELDS: &[&str] = &[
    "block",
    "hotkeys",
    "coldkeys",
    "total_stake",
    "validator_permit",
    "incentives",
    "last_update",
];

/// Storage items outside `SubtensorModule` that iota reads.
const SYSTEM_STORAGE: &[(&str, &str)] = &[("System", "Account"), ("System", "Events")];

/// How many blocks a submitted extrinsic stays valid (a mortal era; rounded to a power of two).
pub const ERA_PERIOD: u64 = 64;

/// Subtensor's block time, for how long to wait at most.
const BLOCK_TIME: Duration = Duration::from_secs(12);

/// What a runtime is, once read from the node.
#[derive(Debug)]
struct Runtime {
    md: Metadata,
    spec_version: u32,
    transaction_version: u32,
    genesis: [u8; 32],
}

/// Where an extrinsic landed.
#[derive(Debug)]
struct Inclusion {
    block: u64,
    block_hash: [u8; 32],
    /// The events of the extrinsic (phase `ApplyExtrinsic(index)`), in order.
    events: Vec<Decoded>,
}

/// A subtensor node reached over JSON-RPC. See the module documentation.
#[derive(Debug)]
pub struct SubtensorChain {
    network: Network,
    rpc: RpcClient,
    runtime: Mutex<Option<Arc<Runtime>>>,
    poll_interval: Duration,
}

impl SubtensorChain {
    /// A client for `network`'s node (finney's and testnet's public entry points, or the URL
    /// given). Nothing is sent until the first call.
    ///
    /// # Errors
    /// [`ChainError::Endpoint`] for a URL that cannot be used, or [`ChainError::Unsupported`]
    /// for [`Network::Local`].
    pub fn new(network: Network) -> Result<SubtensorChain, ChainError> {
        let Some(endpoint) = endpoint_of(&network) else {
            return Err(ChainError::Unsupported {
                network,
                what: "node",
                instead: "the orchestrator's own registry is the chain",
            });
        };
        Ok(SubtensorChain {
            rpc: RpcClient::new(&endpoint)?,
            network,
            runtime: Mutex::new(None),
            poll_interval: Duration::from_secs(2),
        })
    }

    /// Polls for new blocks every `interval` while waiting for an extrinsic (default 2 s).
    #[must_use]
    pub fn with_poll_interval(mut self, interval: Duration) -> SubtensorChain {
        self.poll_interval = interval;
        self
    }

    /// The RPC client underneath.
    pub fn rpc(&self) -> &RpcClient {
        &self.rpc
    }

    /// The runtime, read on first use and again when the node's `spec_version` changes.
    fn runtime(&self) -> Result<Arc<Runtime>, ChainError> {
        let version = self.rpc.runtime_version()?;
        let mut cached = self.runtime.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(rt) = cached.as_ref()
            && rt.spec_version == version.spec_version
            && rt.transaction_version == version.transaction_version
        {
            return Ok(rt.clone());
        }
        let changed = |what: String| ChainError::RuntimeChanged {
            spec_version: version.spec_version,
            what,
        };
        let md = Metadata::decode(&self.rpc.metadata()?).map_err(|e| changed(e.to_string()))?;
        check_client_uses(&md).map_err(|e| changed(without_advice(&e)))?;
        let genesis = self.rpc.block_hash(Some(0))?;
        let rt = Arc::new(Runtime {
            md,
            spec_version: version.spec_version,
            transaction_version: version.transaction_version,
            genesis,
        });
        *cached = Some(rt.clone());
        Ok(rt)
    }

    fn changed(&self, rt: &Runtime, e: &SubtensorError) -> ChainError {
        ChainError::RuntimeChanged {
            spec_version: rt.spec_version,
            what: without_advice(e),
        }
    }

    fn garbled(&self, what: impl std::fmt::Display) -> ChainError {
        ChainError::Endpoint {
            endpoint: self.rpc.endpoint().to_owned(),
            reason: format!("its answer does not decode: {what}"),
        }
    }

    /// `pallet.entry` at `keys`, at block `at` (the best block for `None`), decoded.
    fn read(
        &self,
        rt: &Runtime,
        pallet: &str,
        entry: &str,
        keys: &[Value],
        at: Option<&[u8; 32]>,
    ) -> Result<Option<Decoded>, ChainError> {
        let (key, info) =
            storage::storage_key(&rt.md, pallet, entry, keys).map_err(|e| self.changed(rt, &e))?;
        let bytes = self.rpc.storage(&key, at)?;
        storage::decode_storage(&rt.md, &info, bytes.as_deref()).map_err(|e| self.garbled(e))
    }

    /// A number stored at `SubtensorModule.entry(netuid)`.
    fn subnet_number(
        &self,
        rt: &Runtime,
        entry: &str,
        netuid: u16,
        at: Option<&[u8; 32]>,
    ) -> Result<u128, ChainError> {
        let value = self.read(rt, SUBTENSOR_PALLET, entry, &[netuid_key(netuid)], at)?;
        value
            .as_ref()
            .and_then(storage::number)
            .ok_or_else(|| self.garbled(format!("{SUBTENSOR_PALLET}.{entry} is not a number")))
    }

    fn subnet_flag(
        &self,
        rt: &Runtime,
        entry: &str,
        netuid: u16,
        at: Option<&[u8; 32]>,
    ) -> Result<bool, ChainError> {
        let value = self.read(rt, SUBTENSOR_PALLET, entry, &[netuid_key(netuid)], at)?;
        value
            .as_ref()
            .and_then(storage::flag)
            .ok_or_else(|| self.garbled(format!("{SUBTENSOR_PALLET}.{entry} is not a flag")))
    }

    /// [`ChainError::NoSubnet`] unless `NetworksAdded(netuid)`.
    fn require_subnet(
        &self,
        rt: &Runtime,
        netuid: u16,
        at: Option<&[u8; 32]>,
    ) -> Result<(), ChainError> {
        if self.subnet_flag(rt, "NetworksAdded", netuid, at)? {
            Ok(())
        } else {
            Err(ChainError::NoSubnet { netuid })
        }
    }

    /// The uid of `hotkey` on `netuid`, if registered.
    fn uid_of(
        &self,
        rt: &Runtime,
        netuid: u16,
        hotkey: &[u8; 32],
        at: Option<&[u8; 32]>,
    ) -> Result<Option<u16>, ChainError> {
        let value = self.read(
            rt,
            SUBTENSOR_PALLET,
            "Uids",
            &[netuid_key(netuid), Value::from_bytes(hotkey)],
            at,
        )?;
        match value {
            None => Ok(None),
            Some(v) => storage::number(&v)
                .and_then(|n| u16::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.garbled("SubtensorModule.Uids is not a u16")),
        }
    }

    fn free_of(&self, rt: &Runtime, account: &[u8; 32]) -> Result<u64, ChainError> {
        let value = self.read(rt, "System", "Account", &[Value::from_bytes(account)], None)?;
        value
            .as_ref()
            .and_then(|v| storage::field(v, "data"))
            .and_then(|d| storage::field(d, "free"))
            .and_then(storage::number)
            .map(|n| u64::try_from(n).unwrap_or(u64::MAX))
            .ok_or_else(|| self.garbled("System.Account has no data.free"))
    }

    /// Signs `call` with `signer`, submits it and waits until a block of the best chain carries
    /// it; then its events decide: `Ok` on `ExtrinsicSuccess`, the mapped error on
    /// `ExtrinsicFailed`.
    fn submit(
        &self,
        rt: &Runtime,
        signer: &Hotkey,
        call: &[u8],
        what: &'static str,
        netuid: u16,
    ) -> Result<Inclusion, ChainError> {
        let nonce = self.rpc.account_next_index(signer.address().as_str())?;
        let best_hash = self.rpc.block_hash(None)?;
        let best = self.rpc.header(Some(&best_hash))?;
        let params = TxParams {
            spec_version: rt.spec_version,
            transaction_version: rt.transaction_version,
            genesis_hash: rt.genesis,
            era: Era::Mortal {
                period: ERA_PERIOD,
                current: best.number,
                birth_hash: best_hash,
            },
            nonce,
            tip: 0,
        };
        let xt =
            extrinsic::sign(&rt.md, call, signer, &params).map_err(|e| self.changed(rt, &e))?;
        let hash = xt.hash();
        if let Err(refusal) = self.rpc.submit_extrinsic(&xt.bytes)? {
            return Err(ChainError::Refused {
                call: what,
                netuid,
                reason: format!("the node did not accept the transaction: {refusal}"),
            });
        }
        let inclusion = self.wait_for(rt, &hash, best.number, what, netuid)?;
        if let Some(error) = failure_of(&inclusion.events) {
            return Err(self.dispatch_error(rt, error, what, netuid, signer));
        }
        let succeeded = inclusion.events.iter().any(|e| {
            event_of(e)
                .is_some_and(|(pallet, name, _)| pallet == "System" && name == "ExtrinsicSuccess")
        });
        if !succeeded {
            return Err(self.garbled(format!(
                "block {} carries the {what} extrinsic but no ExtrinsicSuccess or ExtrinsicFailed event for it",
                inclusion.block
            )));
        }
        Ok(inclusion)
    }

    /// Polls the best chain from block `from + 1` until a block carries `hash`, or the era the
    /// extrinsic was signed for has passed.
    fn wait_for(
        &self,
        rt: &Runtime,
        hash: &[u8; 32],
        from: u64,
        what: &'static str,
        netuid: u16,
    ) -> Result<Inclusion, ChainError> {
        let last_valid = from + ERA_PERIOD;
        let deadline = Instant::now() + BLOCK_TIME * u32::try_from(ERA_PERIOD + 8).unwrap_or(72);
        let mut next = from + 1;
        loop {
            let best = self.rpc.header(None)?.number;
            while next <= best.min(last_valid) {
                let block_hash = self.rpc.block_hash(Some(next))?;
                let (_, extrinsics) = self.rpc.block(&block_hash)?;
                let found = extrinsics
                    .iter()
                    .position(|x| Blake2b256::digest(x).as_slice() == hash);
                if let Some(index) = found {
                    let events = self.events_of(rt, &block_hash, index)?;
                    return Ok(Inclusion {
                        block: next,
                        block_hash,
                        events,
                    });
                }
                next += 1;
            }
            if best >= last_valid || Instant::now() > deadline {
                return Err(ChainError::Refused {
                    call: what,
                    netuid,
                    reason: format!(
                        "the transaction was in no block up to {}, where the {ERA_PERIOD} blocks it was valid for ended; nothing was paid, try again",
                        best.min(last_valid)
                    ),
                });
            }
            std::thread::sleep(self.poll_interval);
        }
    }

    /// The events of extrinsic `index` of block `block_hash`.
    fn events_of(
        &self,
        rt: &Runtime,
        block_hash: &[u8; 32],
        index: usize,
    ) -> Result<Vec<Decoded>, ChainError> {
        let records = self
            .read(rt, "System", "Events", &[], Some(block_hash))?
            .ok_or_else(|| self.garbled("no System.Events"))?;
        let records = storage::elements(&records)
            .ok_or_else(|| self.garbled("System.Events is not a list"))?;
        let mut events = Vec::new();
        for record in records {
            let phase = storage::field(record, "phase").and_then(storage::variant);
            let applies_to_ours = match phase {
                Some(("ApplyExtrinsic", fields)) => fields
                    .first()
                    .and_then(|f| storage::number(f))
                    .is_some_and(|i| i == index as u128),
                _ => false,
            };
            if applies_to_ours && let Some(event) = storage::field(record, "event") {
                events.push(event.clone());
            }
        }
        Ok(events)
    }

    /// The [`ChainError`] for a failed dispatch.
    fn dispatch_error(
        &self,
        rt: &Runtime,
        error: &Decoded,
        what: &'static str,
        netuid: u16,
        signer: &Hotkey,
    ) -> ChainError {
        let (pallet, name, doc) = match storage::variant(error) {
            Some(("Module", fields)) => {
                let module = fields.first().copied();
                let index = module
                    .and_then(|m| storage::field(m, "index"))
                    .and_then(storage::number)
                    .and_then(|n| u8::try_from(n).ok());
                let code = module
                    .and_then(|m| storage::field(m, "error"))
                    .and_then(storage::bytes)
                    .and_then(|b| b.first().copied());
                match index.zip(code).and_then(|(i, c)| rt.md.module_error(i, c)) {
                    Some(named) => named,
                    None => (
                        "an unknown pallet".into(),
                        "unknown error".into(),
                        String::new(),
                    ),
                }
            }
            Some((other, fields)) => {
                let detail = fields
                    .first()
                    .and_then(|f| storage::variant(f))
                    .map(|(inner, _)| format!("::{inner}"))
                    .unwrap_or_default();
                (
                    "the runtime".into(),
                    format!("{other}{detail}"),
                    String::new(),
                )
            }
            None => (
                "the runtime".into(),
                "an undecodable error".into(),
                String::new(),
            ),
        };
        map_module_error(&pallet, &name, &doc, what, netuid, signer.address())
    }
}

/// Maps a pallet error onto the [`ChainError`] that says what to do.
fn map_module_error(
    pallet: &str,
    name: &str,
    doc: &str,
    what: &'static str,
    netuid: u16,
    signer: &Ss58Address,
) -> ChainError {
    let named = if doc.is_empty() {
        format!("{pallet}.{name}")
    } else {
        format!("{pallet}.{name} ({})", doc.trim_end_matches('.'))
    };
    if pallet != SUBTENSOR_PALLET {
        return ChainError::Refused {
            call: what,
            netuid,
            reason: named,
        };
    }
    match name {
        "HotKeyNotRegisteredInSubNet" | "HotKeyNotRegisteredInNetwork" => {
            ChainError::NotRegistered {
                hotkey: signer.to_string(),
                netuid,
            }
        }
        "NeuronNoValidatorPermit" => ChainError::NoValidatorPermit { netuid },
        "SubNetworkDoesNotExist" | "SubnetNotExists" | "MechanismDoesNotExist" => {
            ChainError::NoSubnet { netuid }
        }
        "NoWeightsCommitFound"
        | "InvalidRevealCommitHashNotMatch"
        | "CommitRevealEnabled"
        | "CommitRevealDisabled"
        | "TooManyUnrevealedCommits"
        | "ExpiredWeightCommit"
        | "RevealTooEarly"
        | "IncorrectCommitRevealVersion" => ChainError::CommitReveal {
            netuid,
            reason: named,
        },
        "IncorrectWeightVersionKey"
        | "WeightVecNotEqualSize"
        | "DuplicateUids"
        | "UidVecContainInvalidOne"
        | "WeightVecLengthIsLow"
        | "MaxWeightExceeded"
        | "UidsLengthExceedUidsInSubNet"
        | "InputLengthsUnequal" => ChainError::InvalidWeights {
            netuid,
            reason: named,
        },
        _ => ChainError::Refused {
            call: what,
            netuid,
            reason: named,
        },
    }
}

/// The `dispatch_error` of a `System.ExtrinsicFailed` among `events`.
fn failure_of(events: &[Decoded]) -> Option<&Decoded> {
    events.iter().find_map(|e| match event_of(e) {
        Some(("System", "ExtrinsicFailed", inner)) => {
            storage::variant_field(inner, "dispatch_error")
        }
        _ => None,
    })
}

/// A `RuntimeEvent` as (pallet, event name, the event's own value).
fn event_of(event: &Decoded) -> Option<(&str, &str, &Decoded)> {
    let (pallet, fields) = storage::variant(event)?;
    let inner = fields.first().copied()?;
    let (name, _) = storage::variant(inner)?;
    Some((pallet, name, inner))
}

/// A netuid as a storage key value (`NetUid` wraps a u16).
fn netuid_key(netuid: u16) -> Value {
    Value::u128(netuid.into())
}

/// A [`SubtensorError`]'s message without its closing advice (the [`ChainError`] adds its own).
fn without_advice(e: &SubtensorError) -> String {
    e.to_string()
        .trim_end_matches("; update iota")
        .trim_end_matches(": the chain's runtime was upgraded or is not subtensor")
        .to_owned()
}

/// Everything [`SubtensorChain`] uses, checked against `md`: the calls, storage and runtime
/// APIs of [`Metadata::check_iota_uses`], the `System` items read here, and the metagraph's
/// fields in the runtime API's output type.
///
/// # Errors
/// [`SubtensorError::Missing`] or [`SubtensorError::Changed`] naming the first difference.
pub fn check_client_uses(md: &Metadata) -> Result<(), SubtensorError> {
    md.check_iota_uses()?;
    for (pallet, entry) in SYSTEM_STORAGE {
        md.storage_entry(pallet, entry)?;
    }
    metagraph_type(md).map(|_| ())
}

/// The metagraph struct's type id inside `get_metagraph`'s `Option` output, checked to have
/// [`METAGRAPH_FIELDS`].
fn metagraph_type(md: &Metadata) -> Result<u32, SubtensorError> {
    let (api, method) = METAGRAPH_API;
    let name = format!("{api}.{method}");
    let output = md.runtime_api_output(api, method)?;
    let changed = |found: String| SubtensorError::Changed {
        name: name.clone(),
        expected: format!("Option<Metagraph> with {}", METAGRAPH_FIELDS.join(", ")),
        found,
    };
    let resolve = |ty: u32| md.types().resolve(ty).map(|t| &t.type_def);
    let inner = match resolve(output) {
        Some(TypeDef::Variant(v)) => v
            .variants
            .iter()
            .find(|v| v.name == "Some" && v.fields.len() == 1)
            .map(|v| v.fields[0].ty.id),
        _ => None,
    }
    .ok_or_else(|| changed("an output that is not an Option".into()))?;
    let Some(TypeDef::Composite(c)) = resolve(inner) else {
        return Err(changed("an output that is not a struct".into()));
    };
    for wanted in METAGRAPH_FIELDS {
        if !c.fields.iter().any(|f| f.name.as_deref() == Some(*wanted)) {
            return Err(changed(format!("no field `{wanted}`")));
        }
    }
    Ok(output)
}

/// A decoded `Weights` value as `(uid, value)` pairs.
fn weights_from(value: &Decoded) -> Option<Vec<(u16, u16)>> {
    let u16_of = |v: &Decoded| storage::number(v).and_then(|n| u16::try_from(n).ok());
    storage::elements(value)?
        .into_iter()
        .map(|pair| match storage::elements(pair)?[..] {
            [uid, weight] => Some((u16_of(uid)?, u16_of(weight)?)),
            _ => None,
        })
        .collect()
}

/// A decoded `WeightCommits` value as `(hash, commit block)` pairs (the reveal blocks after
/// them are left out).
fn commits_from(value: &Decoded) -> Option<Vec<([u8; 32], u64)>> {
    storage::elements(value)?
        .into_iter()
        .map(|commit| {
            let fields = storage::elements(commit)?;
            let block = storage::number(fields.get(1)?)?;
            Some((
                storage::bytes32(fields.first()?)?,
                u64::try_from(block).ok()?,
            ))
        })
        .collect()
}

/// A decoded `get_metagraph` answer as a [`Metagraph`]; `None` for a subnet that does not
/// exist.
///
/// # Errors
/// A description of what is missing or inconsistent.
pub fn metagraph_from(netuid: u16, value: &Decoded) -> Result<Option<Metagraph>, String> {
    let m = match storage::variant(value) {
        Some(("None", _)) => return Ok(None),
        Some(("Some", fields)) if fields.len() == 1 => fields[0],
        _ => return Err("the metagraph is not an Option".into()),
    };
    let list = |name: &str| {
        storage::field(m, name)
            .and_then(storage::elements)
            .ok_or_else(|| format!("the metagraph's `{name}` is not a list"))
    };
    let hotkeys = list("hotkeys")?;
    let n = hotkeys.len();
    let columns = [
        ("coldkeys", list("coldkeys")?),
        ("total_stake", list("total_stake")?),
        ("validator_permit", list("validator_permit")?),
        ("incentives", list("incentives")?),
        ("last_update", list("last_update")?),
    ];
    if let Some((name, column)) = columns.iter().find(|(_, c)| c.len() != n) {
        return Err(format!(
            "{n} hotkeys but {} entries in `{name}`",
            column.len()
        ));
    }
    let [coldkeys, stake, permits, incentives, last_update] = columns.map(|(_, c)| c);
    let bad = |what: &str, uid: usize| format!("uid {uid}: `{what}` does not decode");
    let mut neurons = Vec::with_capacity(n);
    for uid in 0..n {
        let incentive = storage::number(incentives[uid]).ok_or_else(|| bad("incentives", uid))?;
        neurons.push(Neuron {
            uid: u16::try_from(uid).map_err(|_| format!("{n} uids do not fit a u16"))?,
            hotkey: storage::bytes32(hotkeys[uid]).ok_or_else(|| bad("hotkeys", uid))?,
            coldkey: storage::bytes32(coldkeys[uid]).ok_or_else(|| bad("coldkeys", uid))?,
            stake_rao: storage::number(stake[uid])
                .and_then(|s| u64::try_from(s).ok())
                .ok_or_else(|| bad("total_stake", uid))?,
            validator_permit: storage::flag(permits[uid])
                .ok_or_else(|| bad("validator_permit", uid))?,
            // A u16 fraction of u16::MAX, as the SDK's `u16_normalized_float` reads it.
            incentive: incentive as f64 / f64::from(u16::MAX),
            last_update: storage::number(last_update[uid])
                .and_then(|b| u64::try_from(b).ok())
                .ok_or_else(|| bad("last_update", uid))?,
        });
    }
    let block = storage::field(m, "block")
        .and_then(storage::number)
        .and_then(|b| u64::try_from(b).ok())
        .ok_or("the metagraph's `block` does not decode")?;
    Ok(Some(Metagraph {
        netuid,
        block,
        neurons,
    }))
}

impl Chain for SubtensorChain {
    fn network(&self) -> Network {
        self.network.clone()
    }

    /// Checks that `who` holds a uid on `netuid`: registering on chain costs TAO, so it is
    /// done only by [`Chain::burned_register`], never as a side effect.
    fn register(&self, who: &Registrant, netuid: u16) -> Result<ChainRegistration, ChainError> {
        let rt = self.runtime()?;
        self.require_subnet(&rt, netuid, None)?;
        match self.uid_of(&rt, netuid, who.address.public_key(), None)? {
            Some(_) => Ok(ChainRegistration::NotRequired),
            None => Err(ChainError::NotRegistered {
                hotkey: who.address.to_string(),
                netuid,
            }),
        }
    }

    fn genesis_hash(&self) -> Result<[u8; 32], ChainError> {
        Ok(self.runtime()?.genesis)
    }

    fn metagraph(&self, netuid: u16) -> Result<Metagraph, ChainError> {
        let rt = self.runtime()?;
        let output = metagraph_type(&rt.md).map_err(|e| self.changed(&rt, &e))?;
        let (api, method) = METAGRAPH_API;
        let bytes = self
            .rpc
            .state_call(&format!("{api}_{method}"), &netuid.to_le_bytes(), None)?;
        let value = storage::decode(&rt.md, output, &bytes, "the metagraph")
            .map_err(|e| self.garbled(e))?;
        metagraph_from(netuid, &value)
            .map_err(|e| self.garbled(e))?
            .ok_or(ChainError::NoSubnet { netuid })
    }

    fn burn_cost(&self, netuid: u16) -> Result<u64, ChainError> {
        let rt = self.runtime()?;
        self.require_subnet(&rt, netuid, None)?;
        let burn = self.subnet_number(&rt, "Burn", netuid, None)?;
        u64::try_from(burn).map_err(|_| self.garbled("Burn does not fit a u64"))
    }

    fn free_balance(&self, account: &Ss58Address) -> Result<u64, ChainError> {
        let rt = self.runtime()?;
        self.free_of(&rt, account.public_key())
    }

    fn burned_register(
        &self,
        coldkey: &Hotkey,
        hotkey: &Ss58Address,
        netuid: u16,
    ) -> Result<u16, ChainError> {
        self.burned_register_in_block(coldkey, hotkey, netuid)
            .map(|r| r.uid)
    }

    fn burned_register_in_block(
        &self,
        coldkey: &Hotkey,
        hotkey: &Ss58Address,
        netuid: u16,
    ) -> Result<OnChainRegistration, ChainError> {
        let rt = self.runtime()?;
        self.require_subnet(&rt, netuid, None)?;
        if let Some(uid) = self.uid_of(&rt, netuid, hotkey.public_key(), None)? {
            return Ok(OnChainRegistration {
                uid,
                block: None,
                burned_rao: 0,
            });
        }
        let burn = u64::try_from(self.subnet_number(&rt, "Burn", netuid, None)?)
            .map_err(|_| self.garbled("Burn does not fit a u64"))?;
        let balance = self.free_of(&rt, &coldkey.public_key())?;
        let short = || ChainError::InsufficientBalance {
            coldkey: coldkey.address().to_string(),
            balance_rao: balance,
            needed_rao: burn,
        };
        if balance < burn {
            return Err(short());
        }
        let call = calls::burned_register(&rt.md, netuid, hotkey.public_key())
            .map_err(|e| self.changed(&rt, &e))?;
        let inclusion = match self.submit(&rt, coldkey, &call, "burned_register", netuid) {
            Err(ChainError::Refused { reason, .. })
                if reason.starts_with("SubtensorModule.NotEnoughBalanceToStake") =>
            {
                return Err(short());
            }
            other => other?,
        };
        // The uid from the NeuronRegistered event, else from storage at that block.
        let from_event = inclusion.events.iter().find_map(|e| {
            let (pallet, name, inner) = event_of(e)?;
            if pallet != SUBTENSOR_PALLET || name != "NeuronRegistered" {
                return None;
            }
            let (_, fields) = storage::variant(inner)?;
            let registered = storage::bytes32(fields.get(2)?)?;
            (registered == *hotkey.public_key())
                .then(|| storage::number(fields.get(1)?))
                .flatten()
                .and_then(|uid| u16::try_from(uid).ok())
        });
        let uid = match from_event {
            Some(uid) => uid,
            None => self
                .uid_of(
                    &rt,
                    netuid,
                    hotkey.public_key(),
                    Some(&inclusion.block_hash),
                )?
                .ok_or_else(|| {
                    self.garbled(format!(
                        "burned_register succeeded in block {} but the hotkey has no uid there",
                        inclusion.block
                    ))
                })?,
        };
        Ok(OnChainRegistration {
            uid,
            block: Some(inclusion.block),
            burned_rao: burn,
        })
    }

    fn weights_policy(&self, netuid: u16) -> Result<WeightsPolicy, ChainError> {
        let rt = self.runtime()?;
        let at = self.rpc.block_hash(None)?;
        let block = self.rpc.header(Some(&at))?.number;
        self.require_subnet(&rt, netuid, Some(&at))?;
        let number = |entry: &str| self.subnet_number(&rt, entry, netuid, Some(&at));
        let fits = |entry: &'static str, n: u128| {
            u64::try_from(n).map_err(|_| self.garbled(format!("{entry} does not fit a u64")))
        };
        Ok(WeightsPolicy {
            block,
            tempo: u16::try_from(number("Tempo")?)
                .map_err(|_| self.garbled("Tempo does not fit a u16"))?,
            commit_reveal: self.subnet_flag(
                &rt,
                "CommitRevealWeightsEnabled",
                netuid,
                Some(&at),
            )?,
            reveal_period_epochs: fits("RevealPeriodEpochs", number("RevealPeriodEpochs")?)?,
            weights_rate_limit: fits("WeightsSetRateLimit", number("WeightsSetRateLimit")?)?,
            version_key: fits("WeightsVersionKey", number("WeightsVersionKey")?)?,
        })
    }

    /// `SubtensorModule.Weights(netuid, uid)` at the best block (its shape checked against
    /// the metadata with the rest, [`super::metadata::WEIGHTS`]).
    fn weights(&self, netuid: u16, uid: u16) -> Result<Vec<(u16, u16)>, ChainError> {
        let rt = self.runtime()?;
        self.require_subnet(&rt, netuid, None)?;
        let value = self.read(
            &rt,
            SUBTENSOR_PALLET,
            "Weights",
            &[netuid_key(netuid), Value::u128(uid.into())],
            None,
        )?;
        match value {
            None => Ok(Vec::new()),
            Some(v) => weights_from(&v)
                .ok_or_else(|| self.garbled("SubtensorModule.Weights is not a list of (u16, u16)")),
        }
    }

    /// `SubtensorModule.WeightCommits(netuid, hotkey)` at the best block (its shape checked
    /// against the metadata, [`super::metadata::WEIGHT_COMMITS`]).
    fn weight_commits(
        &self,
        netuid: u16,
        hotkey: &[u8; 32],
    ) -> Result<Vec<([u8; 32], u64)>, ChainError> {
        let rt = self.runtime()?;
        self.require_subnet(&rt, netuid, None)?;
        let value = self.read(
            &rt,
            SUBTENSOR_PALLET,
            "WeightCommits",
            &[netuid_key(netuid), Value::from_bytes(hotkey)],
            None,
        )?;
        match value {
            None => Ok(Vec::new()),
            Some(v) => commits_from(&v).ok_or_else(|| {
                self.garbled("SubtensorModule.WeightCommits is not a list of (hash, block, ..)")
            }),
        }
    }

    fn submit_weights(
        &self,
        signer: &Hotkey,
        netuid: u16,
        submission: &WeightSubmission,
    ) -> Result<u64, ChainError> {
        let rt = self.runtime()?;
        self.require_subnet(&rt, netuid, None)?;
        let (what, call) = match submission {
            WeightSubmission::Set {
                uids,
                values,
                version_key,
            } => (
                "set_weights",
                calls::set_weights(&rt.md, netuid, uids, values, *version_key),
            ),
            WeightSubmission::Commit { hash } => (
                "commit_weights",
                calls::commit_weights(&rt.md, netuid, hash),
            ),
            WeightSubmission::Reveal {
                uids,
                values,
                salt,
                version_key,
            } => (
                "reveal_weights",
                calls::reveal_weights(&rt.md, netuid, uids, values, salt, *version_key),
            ),
        };
        let call = call.map_err(|e| match e {
            SubtensorError::Weights { reason } => ChainError::InvalidWeights { netuid, reason },
            other => self.changed(&rt, &other),
        })?;
        match self.submit(&rt, signer, &call, what, netuid) {
            Ok(inclusion) => Ok(inclusion.block),
            Err(ChainError::Refused { reason, .. })
                if reason.starts_with("SubtensorModule.SettingWeightsTooFast")
                    || reason.starts_with("SubtensorModule.CommittingWeightsTooFast") =>
            {
                // Blocks left: the limit after the uid's last update, as the metagraph has it
                // now; the whole limit if the metagraph does not have the hotkey.
                let limit =
                    u64::try_from(self.subnet_number(&rt, "WeightsSetRateLimit", netuid, None)?)
                        .unwrap_or(u64::MAX);
                let metagraph = self.metagraph(netuid)?;
                let blocks_left = match metagraph.neuron(&signer.public_key()) {
                    Some(n) => n
                        .last_update
                        .saturating_add(limit)
                        .saturating_sub(metagraph.block),
                    None => limit,
                };
                Err(ChainError::RateLimited {
                    netuid,
                    blocks_left,
                })
            }
            Err(other) => Err(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::subtensor::recorded_metadata;

    #[test]
    fn the_recorded_runtime_has_everything_the_client_reads() {
        let md = recorded_metadata();
        check_client_uses(&md).unwrap();
        // A DispatchError::Module of SubtensorModule is named from the metadata.
        let pallet = md
            .check_call(&super::super::metadata::BURNED_REGISTER)
            .unwrap();
        let (name, error, _) = md.module_error(pallet.pallet_index, 0).unwrap();
        assert_eq!(name, SUBTENSOR_PALLET);
        assert!(!error.is_empty());
    }

    #[test]
    fn pallet_errors_map_to_what_to_do() {
        let who = Hotkey::from_uri("//Alice").unwrap();
        let map =
            |name| map_module_error(SUBTENSOR_PALLET, name, "", "set_weights", 3, who.address());
        assert!(matches!(
            map("NeuronNoValidatorPermit"),
            ChainError::NoValidatorPermit { netuid: 3 }
        ));
        assert!(matches!(
            map("HotKeyNotRegisteredInSubNet"),
            ChainError::NotRegistered { .. }
        ));
        assert!(matches!(
            map("RevealTooEarly"),
            ChainError::CommitReveal { .. }
        ));
        assert!(matches!(
            map("DuplicateUids"),
            ChainError::InvalidWeights { .. }
        ));
        let other = map("TooManyRegistrationsThisBlock").to_string();
        assert!(
            other.contains("SubtensorModule.TooManyRegistrationsThisBlock"),
            "{other}"
        );
    }
}
