"""The Bittensor SDK's SCALE codec (`scalecodec`, installed by `cyscale`) set up from a recorded
metadata file, shared by independent.py and fake_node.py."""

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
