"""The independent side of tests/chain_encoding.rs: the Bittensor SDK and its SCALE codec
(the `scalecodec` module, installed by `cyscale`) compute what iota computes, from the same
recorded runtime metadata, and print their answers as JSON for the Rust test to compare.

Input (stdin, JSON): the metadata file's path and lists of cases; output (stdout, JSON): one
answer per case, in order. Nothing here looks at iota's bytes except `extrinsics`, which decodes
iota's extrinsics and rebuilds the signed payload from the metadata on its own.
"""

import json
import sys

import numpy as np
from bittensor.utils.weight_utils import (
    convert_weights_and_uids_for_emit,
    generate_weight_hash,
)

import sdk_runtime

request = json.load(sys.stdin)

runtime, metadata = sdk_runtime.load(request["metadata"])
extensions = metadata.value[1]["V15"]["extrinsic"]["signed_extensions"]


def encode_type(type_id, value):
    """`value` SCALE-encoded as the metadata's type `type_id`."""
    return sdk_runtime.encode_type(runtime, type_id, value)


def encode_call(case):
    return sdk_runtime.encode_call(runtime, metadata, case)


def commit_hash(case):
    return generate_weight_hash(
        address=case["ss58"],
        netuid=case["netuid"],
        uids=case["uids"],
        values=case["values"],
        version_key=case["version_key"],
        salt=case["salt"],
    )


def emit(case):
    uids, values = convert_weights_and_uids_for_emit(
        np.array(case["uids"], dtype=np.int64),
        np.array(case["weights"], dtype=np.float32),
    )
    return [list(map(int, uids)), list(map(int, values))]


def era(case):
    return "0x" + encode_type(era_type, case).hex()


def extrinsic(case):
    """Decodes iota's extrinsic, rebuilds what should have been signed from the decoded fields
    and the metadata's extensions, and checks the signature with bittensor-wallet."""
    decoded = sdk_runtime.decode_extrinsic(runtime, metadata, case)
    del decoded["decoded_call"]
    return decoded


era_type = next(e["ty"] for e in extensions if e["identifier"] == "CheckMortality")

json.dump(
    {
        "calls": [encode_call(c) for c in request["calls"]],
        "commit_hashes": [commit_hash(c) for c in request["commit_hashes"]],
        "emit": [emit(c) for c in request["emit"]],
        "eras": [era(c) for c in request["eras"]],
        "extrinsics": [extrinsic(c) for c in request["extrinsics"]],
    },
    sys.stdout,
)
