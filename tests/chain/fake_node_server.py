"""A FAKE subtensor node for tests/chain_node.rs: a JSON-RPC server over HTTP that answers the
methods iota's client calls, with bytes the Bittensor SDK's codec encodes (fake_node.Encoder)
from the recorded runtime metadata. It is not subtensor and proves nothing about a real node.

It makes a block every `block_ms` milliseconds. A submitted extrinsic is decoded by the SDK and
its sr25519 signature checked by bittensor-wallet (sdk_runtime.decode_extrinsic); a bad
signature or nonce is refused as a node refuses a transaction. Accepted, it goes into the next
block, where one subnet applies the pallet's weight rules (weights_pallet.py) to `set_weights`,
`commit_weights` and `reveal_weights`: that block's `System.Events` say `ExtrinsicSuccess`
(with the pallet's events) or `ExtrinsicFailed` with the pallet error, and a failed dispatch
leaves the subnet as it was. Storage (the subnet's settings, `Uids`, `LastUpdate`, `Weights`,
`WeightCommits`, `System.Account`) and the metagraph are encoded from the current state on
every read; a read at an older block gets the current state too, except `System.Events`.

Two methods are the fake's own, for the test: `fake_setSubnet` changes the subnet's settings
(as its owner's sudo calls would) and `fake_record` returns what was set, committed and refused.

Config (a JSON file): metadata, block_ms, start_block, netuid, subnet {tempo, commit_reveal,
reveal_period_epochs, weights_rate_limit, version_key, burn}, neurons [{hotkey, coldkey (0x hex),
stake, permit, incentive (u16)}], balances {0x account: rao}. Prints {"port": N} when serving;
exits when its stdin closes.
"""

import copy
import hashlib
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from async_substrate_interface.utils.storage import StorageKey
from scalecodec.utils.ss58 import ss58_decode, ss58_encode

import sdk_runtime
from weights_pallet import Refused, Subnet

SPEC_VERSION = 461
TRANSACTION_VERSION = 1
# Timestamp.set, the inherent at index 0 of every block the fake node makes.
INHERENT = "0x280403000b00000000000000"
WEIGHT_CALLS = ("set_weights", "commit_weights", "reveal_weights")
SUBNET_ITEMS = (
    "NetworksAdded",
    "Burn",
    "Tempo",
    "CommitRevealWeightsEnabled",
    "RevealPeriodEpochs",
    "WeightsSetRateLimit",
    "WeightsVersionKey",
    "LastUpdate",
)


def block_hash(number):
    return hashlib.blake2b(b"fake node block" + number.to_bytes(8, "little"), digest_size=32)


def hex0x(data):
    return "0x" + data.hex()


class RpcError(Exception):
    """A JSON-RPC error answer: (code, message, data)."""


class Node:
    """The fake node's state: blocks, the transaction pool, nonces and one subnet."""

    def __init__(self, encoder, config):
        self.enc = encoder
        with open(config["metadata"], "rb") as f:
            self.metadata_hex = hex0x(f.read())
        self.block_ms = config["block_ms"]
        self.started = time.monotonic()
        self.first = config["start_block"]
        self.best = self.first
        self.hashes = {hex0x(block_hash(n).digest()): n for n in range(self.first + 1)}
        self.extrinsics = {}  # block -> [hex]
        self.events = {}  # block -> encoded System.Events
        self.pool = []
        self.nonces = {}
        self.failures = []
        self.refusals = []
        neurons = [
            {
                "hotkey": bytes.fromhex(n["hotkey"][2:]),
                "coldkey": n["coldkey"],
                "stake": n["stake"],
                "permit": n["permit"],
                "incentive": n["incentive"],
            }
            for n in config["neurons"]
        ]
        self.subnet = Subnet(config["netuid"], config["subnet"], neurons)
        self.balances = config.get("balances", {})
        self.pallet_index, self.errors = self.subtensor_errors()
        self.keys = self.storage_index()

    def subtensor_errors(self):
        pallet = next(p for p in self.enc.v15["pallets"] if p["name"] == "SubtensorModule")
        variants = self.enc.types[pallet["error"]["ty"]]["def"]["variant"]["variants"]
        return pallet["index"], {v["name"]: v["index"] for v in variants}

    def storage_key(self, pallet, entry, params):
        return StorageKey.create_from_storage_function(
            pallet, entry, params, runtime_config=self.enc.runtime, metadata=self.enc.metadata
        )

    def storage_index(self):
        """Every key the fake node serves -> (its StorageKey, what it reads)."""
        netuid = self.subnet.netuid
        items = [("SubtensorModule", e, [netuid]) for e in SUBNET_ITEMS]
        for uid, n in enumerate(self.subnet.neurons):
            items.append(("SubtensorModule", "Uids", [netuid, hex0x(n["hotkey"])]))
            items.append(("SubtensorModule", "Weights", [netuid, uid]))
            items.append(("SubtensorModule", "WeightCommits", [netuid, hex0x(n["hotkey"])]))
        accounts = set(self.balances) | {n["coldkey"] for n in self.subnet.neurons}
        items += [("System", "Account", [a]) for a in accounts]
        items.append(("System", "Events", []))
        index = {}
        for pallet, entry, params in items:
            key = self.storage_key(pallet, entry, params)
            index[key.to_hex()] = (key, entry, params)
        return index

    # --- blocks -----------------------------------------------------------------------

    def advance(self):
        """Makes the blocks due by now; the pool goes into the first of them."""
        due = self.first + int((time.monotonic() - self.started) * 1000 // self.block_ms)
        while self.best < due:
            self.best += 1
            self.hashes[hex0x(block_hash(self.best).digest())] = self.best
            self.make_block(self.best)

    def make_block(self, number):
        records = []
        included = [INHERENT]
        pool, self.pool = self.pool, []
        for xt in pool:
            index = len(included)
            included.append(xt["hex"])
            self.nonces[xt["sender"]] = xt["nonce"] + 1
            phase = {"ApplyExtrinsic": index}
            try:
                before = copy.deepcopy(self.subnet)
                try:
                    events = self.apply(xt, number)
                except Refused:
                    self.subnet = before
                    raise
                for name, fields in events:
                    records.append(
                        {"phase": phase, "event": {"SubtensorModule": {name: fields}}, "topics": []}
                    )
                records.append(self.system_event(phase, "ExtrinsicSuccess", {}))
            except Refused as refused:
                error = refused.args[0]
                self.failures.append(
                    {"block": number, "call": xt["call"]["call_function"], "error": error}
                )
                code = self.errors[error]
                module = {"index": self.pallet_index, "error": hex0x(bytes([code, 0, 0, 0]))}
                records.append(
                    self.system_event(
                        phase, "ExtrinsicFailed", {"dispatch_error": {"Module": module}}
                    )
                )
        self.extrinsics[number] = included
        self.events[number] = self.enc.events(records) if records else None

    @staticmethod
    def system_event(phase, name, fields):
        info = {
            "weight": {"ref_time": 1000, "proof_size": 10},
            "class": "Normal",
            "pays_fee": "Yes",
        }
        event = {"System": {name: {**fields, "dispatch_info": info}}}
        return {"phase": phase, "event": event, "topics": []}

    def apply(self, xt, block):
        """The pallet's dispatch of one weights call; its events, or Refused."""
        args = xt["call"]["call_args"]
        hotkey = bytes.fromhex(xt["sender"][2:])
        function = xt["call"]["call_function"]
        s = self.subnet
        if function == "set_weights":
            return s.set_weights(
                hotkey, args["netuid"], args["dests"], args["weights"], args["version_key"], block
            )
        if function == "commit_weights":
            return s.commit_weights(hotkey, args["netuid"], args["commit_hash"], block)
        return s.reveal_weights(
            hotkey,
            ss58_encode(hotkey, 42),
            args["netuid"],
            args["uids"],
            args["values"],
            args["salt"],
            args["version_key"],
            block,
        )

    # --- reads ------------------------------------------------------------------------

    def header(self, number):
        parent = block_hash(max(number, 1) - 1).digest()
        return {
            "parentHash": hex0x(parent),
            "number": hex(number),
            "stateRoot": hex0x(bytes(32)),
            "extrinsicsRoot": hex0x(bytes(32)),
            "digest": {"logs": []},
        }

    def number_of(self, params):
        if not params or params[0] is None:
            return self.best
        return self.hashes.get(params[0])

    def storage_value(self, entry, params, at):
        s = self.subnet
        if entry == "Events":
            return None
        if entry == "Account":
            free = self.balances.get(params[0], 0)
            return {
                "nonce": 0,
                "consumers": 0,
                "providers": 1,
                "sufficients": 0,
                "data": {"free": free, "reserved": 0, "frozen": 0, "flags": 0},
            }
        if entry == "Uids":
            return s.uid_of(bytes.fromhex(params[1][2:]))
        if entry == "WeightCommits":
            commits = s.commits.get(bytes.fromhex(params[1][2:]))
            if not commits:
                return None
            # (hash, commit block, first and last reveal block), as the pallet stores them.
            return [[h, b, *s.reveal_blocks(b)] for h, b in commits]
        if entry == "Weights":
            return [list(w) for w in s.weights[params[1]]] if params[1] in s.weights else None
        return {
            "NetworksAdded": True,
            "Burn": s.burn,
            "Tempo": s.tempo,
            "CommitRevealWeightsEnabled": s.commit_reveal,
            "RevealPeriodEpochs": s.reveal_period,
            "WeightsSetRateLimit": s.rate_limit,
            "WeightsVersionKey": s.version_key,
            "LastUpdate": s.last_update,
        }[entry]

    def storage(self, params):
        found = self.keys.get(params[0])
        if found is None:
            return None
        key, entry, key_params = found
        at = self.number_of(params[1:])
        if entry == "Events":
            return self.events.get(at)
        value = self.storage_value(entry, key_params, at)
        if value is None:
            return None
        scale = self.enc.runtime.create_scale_object(key.value_scale_type)
        return hex0x(bytes(scale.encode(value).data))

    def metagraph(self, params):
        assert params[0] == "SubnetInfoRuntimeApi_get_metagraph", params[0]
        netuid = int.from_bytes(bytes.fromhex(params[1][2:]), "little")
        s = self.subnet
        if netuid != s.netuid:
            return "0x00"
        fields = {
            "hotkeys": [hex0x(n["hotkey"]) for n in s.neurons],
            "coldkeys": [n["coldkey"] for n in s.neurons],
            "total_stake": [n["stake"] for n in s.neurons],
            "validator_permit": [n["permit"] for n in s.neurons],
            "incentives": [n["incentive"] for n in s.neurons],
            "last_update": list(s.last_update),
            "block": self.best,
        }
        return self.enc.metagraph({"netuid": netuid, "fields": fields})

    # --- writes -----------------------------------------------------------------------

    def next_index(self, account):
        """The account's next nonce, counting what waits in the pool."""
        waiting = sum(1 for xt in self.pool if xt["sender"] == account)
        return self.nonces.get(account, 0) + waiting

    def submit(self, params):
        xt_hex = params[0]
        decoded = sdk_runtime.decode_extrinsic(
            self.enc.runtime,
            self.enc.metadata,
            {
                "hex": xt_hex,
                "spec_version": SPEC_VERSION,
                "transaction_version": TRANSACTION_VERSION,
                "genesis_hash": hex0x(block_hash(0).digest()),
                "birth_hash": hex0x(block_hash(self.birth(xt_hex)).digest()),
            },
        )
        call = decoded["decoded_call"]
        why = None
        if not decoded["signature_valid"]:
            why = "bad signature (bittensor-wallet refuses it)"
        elif decoded["nonce"] != self.next_index(decoded["address"]):
            why = f"nonce {decoded['nonce']}, expected {self.next_index(decoded['address'])}"
        elif call["call_module"] != "SubtensorModule" or call["call_function"] not in WEIGHT_CALLS:
            why = f"the fake node applies only {', '.join(WEIGHT_CALLS)}"
        if why:
            self.refusals.append(why)
            raise RpcError(1010, "Invalid Transaction", f"{why} (era {decoded['era']})")
        self.pool.append(
            {"hex": xt_hex, "sender": decoded["address"], "nonce": decoded["nonce"], "call": call}
        )
        return hex0x(hashlib.blake2b(bytes.fromhex(xt_hex[2:]), digest_size=32).digest())

    def birth(self, xt_hex):
        """The block a mortal extrinsic was signed at, from its era and the best block."""
        decoded = self.enc.runtime.create_scale_object(
            "Extrinsic", data=sdk_runtime.ScaleBytes(xt_hex), metadata=self.enc.metadata
        ).decode()
        era = decoded.get("era")
        if not isinstance(era, tuple):
            return 0
        period, phase = era
        return (max(self.best, phase) - phase) // period * period + phase

    # --- the fake's own methods ---------------------------------------------------------

    def set_subnet(self, params):
        s = self.subnet
        for name, value in params[0].items():
            attribute = {
                "commit_reveal": "commit_reveal",
                "weights_rate_limit": "rate_limit",
                "reveal_period_epochs": "reveal_period",
                "tempo": "tempo",
                "version_key": "version_key",
            }[name]
            setattr(s, attribute, value)
        return None

    def record(self, _params):
        return {
            "best": self.best,
            "weights": self.subnet.history,
            "failures": self.failures,
            "refusals": self.refusals,
            "last_update": self.subnet.last_update,
        }

    # --- dispatch ---------------------------------------------------------------------

    def answer(self, method, params):
        self.advance()
        if method == "state_getMetadata":
            return self.metadata_hex
        if method == "state_getRuntimeVersion":
            return {
                "specName": "node-subtensor",
                "implName": "node-subtensor",
                "authoringVersion": 1,
                "specVersion": SPEC_VERSION,
                "implVersion": 1,
                "apis": [],
                "transactionVersion": TRANSACTION_VERSION,
                "stateVersion": 1,
            }
        if method == "chain_getBlockHash":
            n = params[0] if params and params[0] is not None else self.best
            return hex0x(block_hash(n).digest()) if n <= self.best else None
        if method == "chain_getHeader":
            n = self.number_of(params)
            return None if n is None else self.header(n)
        if method == "chain_getBlock":
            n = self.number_of(params)
            if n is None:
                return None
            block = {"header": self.header(n), "extrinsics": self.extrinsics.get(n, [])}
            return {"block": block, "justifications": None}
        if method == "state_getStorage":
            return self.storage(params)
        if method == "state_call":
            return self.metagraph(params)
        if method == "system_accountNextIndex":
            return self.next_index("0x" + ss58_decode(params[0]))
        if method == "author_submitExtrinsic":
            return self.submit(params)
        if method == "fake_setSubnet":
            return self.set_subnet(params)
        if method == "fake_record":
            return self.record(params)
        raise RpcError(-32601, "Method not found", f"the fake node does not serve {method}")


def main(encoder_class, config_path):
    """Serves the fake node of the config at `config_path` until stdin closes."""
    with open(config_path) as f:
        config = json.load(f)
    node = Node(encoder_class(config["metadata"]), config)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            reply = {"jsonrpc": "2.0", "id": request.get("id")}
            try:
                with lock:
                    reply["result"] = node.answer(request["method"], request.get("params") or [])
            except RpcError as e:
                code, message, data = e.args
                reply["error"] = {"code": code, "message": message, "data": data}
            body = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    sys.stdin.read()
    os._exit(0)
