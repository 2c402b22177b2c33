"""The independent encoder behind tests/chain_node.rs's fake node: the Bittensor SDK's SCALE
codec (`scalecodec`, installed by `cyscale`) and its storage-key code
(`async_substrate_interface`, a dependency of `bittensor`) encode, from the recorded runtime
metadata, what a subtensor node would answer: storage keys and values, a subnet's metagraph as
`SubnetInfoRuntimeApi.get_metagraph` returns it, the `System.Events` of a block, and call data.
iota's own encoders are never involved; the Rust test serves these bytes and checks that iota
reads back the values it asked for.

Input (stdin, JSON):
  metadata: path of the metadata file
  storage: [{pallet, entry, params, value}]       -> [[key hex, value hex]]
  metagraphs: [{netuid, fields: {name: value}}]   -> [hex of Option<Metagraph>::Some]
  events: [[EventRecord values]]                  -> [hex of Vec<EventRecord>]
  calls: [{module, function, args}]               -> [call data hex]
  netuids: [n]                                    -> [hex of a NetUid, the runtime API input]
Output (stdout, JSON): the same keys, one answer per case.

Fields of the metagraph that the request does not give are filled with small values of the
right type (every per-uid list as long as `hotkeys`).

`fake_node.py serve CONFIG` runs the FAKE node itself instead (fake_node_server.py): a JSON-RPC
server whose subnet applies the pallet's weight rules (weights_pallet.py) and answers with
bytes encoded here.
"""

import json
import sys

from async_substrate_interface.utils.storage import StorageKey

import sdk_runtime


class Encoder:
    """The SDK's codec for the recorded metadata at `path`: storage keys and values, metagraphs,
    events and call data, as 0x hex."""

    def __init__(self, path):
        self.runtime, self.metadata = sdk_runtime.load(path)
        self.v15 = self.metadata.value[1]["V15"]
        self.types = {t["id"]: t["type"] for t in self.v15["types"]["types"]}

    def encode_type(self, type_id, value):
        return "0x" + sdk_runtime.encode_type(self.runtime, type_id, value).hex()

    def filler(self, type_id, n):
        """A small value of type `type_id`; sequences get `n` elements."""
        t = self.types[type_id]
        d = t["def"]
        if t["path"] == ["Option"]:
            return None
        if "primitive" in d:
            return {"bool": False, "str": "x", "char": "x"}.get(d["primitive"], 1)
        if "compact" in d:
            return 1
        if "sequence" in d:
            return [self.filler(d["sequence"]["type"], n) for _ in range(n)]
        if "array" in d:
            inner = self.types[d["array"]["type"]]["def"]
            if inner.get("primitive") == "u8":
                return "0x" + "01" * d["array"]["len"]
            return [self.filler(d["array"]["type"], n) for _ in range(d["array"]["len"])]
        if "tuple" in d:
            return [self.filler(x, n) for x in d["tuple"]]
        if "composite" in d:
            fields = d["composite"]["fields"]
            if len(fields) == 1 and fields[0]["name"] is None:
                return self.filler(fields[0]["type"], n)
            if all(f["name"] for f in fields):
                return {f["name"]: self.filler(f["type"], n) for f in fields}
            return [self.filler(f["type"], n) for f in fields]
        if "variant" in d:
            variant = d["variant"]["variants"][0]
            if not variant["fields"]:
                return variant["name"]
            return {variant["name"]: self.filler(variant["fields"][0]["type"], n)}
        if "bitsequence" in d:
            return []
        raise ValueError(f"no filler for type {type_id}: {t}")

    def metagraph_type(self):
        """`get_metagraph`'s output type and its input (netuid) type."""
        api = next(a for a in self.v15["apis"] if a["name"] == "SubnetInfoRuntimeApi")
        method = next(m for m in api["methods"] if m["name"] == "get_metagraph")
        return method["output"], method["inputs"][0]["ty"]

    def metagraph(self, case):
        """`Option<Metagraph>::Some` of case {netuid, fields}, the rest filled in."""
        output, _ = self.metagraph_type()
        variants = self.types[output]["def"]["variant"]["variants"]
        some = next(v for v in variants if v["name"] == "Some")
        struct = some["fields"][0]["type"]
        n = len(case["fields"]["hotkeys"])
        value = self.filler(struct, n)
        value.update(case["fields"])
        value["netuid"] = case["netuid"]
        return self.encode_type(output, value)

    def storage(self, case):
        """[key, value] of case {pallet, entry, params, value}."""
        key = StorageKey.create_from_storage_function(
            case["pallet"],
            case["entry"],
            case["params"],
            runtime_config=self.runtime,
            metadata=self.metadata,
        )
        value_type = key.value_scale_type
        value = bytes(self.runtime.create_scale_object(value_type).encode(case["value"]).data)
        return [key.to_hex(), "0x" + value.hex()]

    def events(self, records):
        """A block's `System.Events` value: a list of EventRecord values."""
        system = next(p for p in self.v15["pallets"] if p["name"] == "System")
        entry = next(e for e in system["storage"]["entries"] if e["name"] == "Events")
        return self.encode_type(entry["type"]["Plain"], records)

    def call(self, case):
        """Call data of case {module, function, args}."""
        return sdk_runtime.encode_call(self.runtime, self.metadata, case)


def one_shot():
    """Answers the JSON request on stdin (see the module documentation)."""
    request = json.load(sys.stdin)
    enc = Encoder(request["metadata"])
    json.dump(
        {
            "storage": [enc.storage(c) for c in request.get("storage", [])],
            "metagraphs": [enc.metagraph(c) for c in request.get("metagraphs", [])],
            "events": [enc.events(c) for c in request.get("events", [])],
            "calls": [enc.call(c) for c in request.get("calls", [])],
            "netuids": [
                enc.encode_type(enc.metagraph_type()[1], n) for n in request.get("netuids", [])
            ],
        },
        sys.stdout,
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        import fake_node_server

        fake_node_server.main(Encoder, sys.argv[2])
    else:
        one_shot()
