"""The Bittensor SDK's SCALE codec (`scalecodec`, installed by `cyscale`) set up from a recorded
metadata file, shared by independent.py and fake_node.py."""

import hashlib

from bittensor_wallet import Keypair
from scalecodec.base import RuntimeConfigurationObject, ScaleBytes
from scalecodec.type_registry import load_type_registry_preset


def load(path):
    """The codec's runtime configuration and the decoded metadata of the file at `path`."""
    runtime = RuntimeConfigurationObject()
    runtime.update_type_registry(load_type_registry_preset("core"))
    with open(path, "rb") as f:
        metadata = runtime.create_scale_object("MetadataVersioned", data=ScaleBytes(f.read()))
    metadata.decode()
    runtime.add_portable_registry(metadata)
    return runtime, metadata


def encode_type(runtime, type_id, value):
    """`value` SCALE-encoded as the metadata's type `type_id`, as bytes."""
    return bytes(runtime.create_scale_object(f"scale_info::{type_id}").encode(value).data)


def encode_call(runtime, metadata, case):
    """The call data of `case` ({module, function, args}), as 0x hex."""
    call = runtime.create_scale_object("Call", metadata=metadata)
    data = call.encode(
        {
            "call_module": case["module"],
            "call_function": case["function"],
            "call_args": case["args"],
        }
    )
    return str(data)


def decode_extrinsic(runtime, metadata, case):
    """Decodes the signed extrinsic `case["hex"]` with the SDK's codec, rebuilds what should
    have been signed from the decoded fields and the metadata's transaction extensions (with
    `case`'s spec_version, transaction_version, genesis_hash and birth_hash), and checks the
    signature with bittensor-wallet. Returns the sender, nonce, tip, era, call data, signed
    message, whether the signature is valid, and the decoded call (`decoded_call`:
    {call_module, call_function, call_args: {name: value}})."""
    extensions = metadata.value[1]["V15"]["extrinsic"]["signed_extensions"]
    decoded = runtime.create_scale_object(
        "Extrinsic", data=ScaleBytes(case["hex"]), metadata=metadata
    )
    value = decoded.decode()
    call_value = {
        "call_module": value["call"]["call_module"],
        "call_function": value["call"]["call_function"],
        "call_args": {a["name"]: a["value"] for a in value["call"]["call_args"]},
    }
    call = runtime.create_scale_object("Call", metadata=metadata)
    call_bytes = bytes(call.encode(call_value).data)
    era_value = value.get("era", "00")
    if isinstance(era_value, tuple):
        era_value = {"period": era_value[0], "phase": era_value[1]}
    extra_values = {
        "CheckMortality": era_value,
        "CheckNonce": value["nonce"],
        "ChargeTransactionPayment": value["tip"],
        "CheckMetadataHash": value.get("mode", {"mode": "Disabled"}),
    }
    additional_values = {
        "CheckSpecVersion": case["spec_version"],
        "CheckTxVersion": case["transaction_version"],
        "CheckGenesis": case["genesis_hash"],
        "CheckMortality": case["birth_hash"],
        "CheckMetadataHash": None,
    }
    extra = b""
    additional = b""
    for ext in extensions:
        name = ext["identifier"]
        extra += encode_type(runtime, ext["ty"], extra_values.get(name, ()))
        additional += encode_type(
            runtime, ext["additional_signed"], additional_values.get(name, ())
        )
    payload = call_bytes + extra + additional
    if len(payload) > 256:
        payload = hashlib.blake2b(payload, digest_size=32).digest()
    signature = value["signature"]["Sr25519"]
    keypair = Keypair(public_key=value["address"], ss58_format=42)
    return {
        "address": value["address"],
        "nonce": value["nonce"],
        "tip": value["tip"],
        "era": list(value["era"]) if isinstance(value.get("era"), tuple) else value.get("era"),
        "call": "0x" + call_bytes.hex(),
        "signed_message": "0x" + payload.hex(),
        "signature_valid": bool(keypair.verify(payload, bytes.fromhex(signature[2:]))),
        "decoded_call": call_value,
    }
