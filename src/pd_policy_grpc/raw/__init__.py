"""The policy on serialized ``GenerateRequest`` bytes: a router that keeps the bytes it
received never parses, copies or re-serializes a pixel.

[`read_request`][pd_policy_grpc.raw.reader.read_request] reads what the policy needs,
skipping the tensor payloads; the leg builders cut each leg from the ingress bytes
with exactly the semantics of the message legs, and carry the fields this version
of the proto does not know. [`SequentialPdBytes`][pd_policy_grpc.raw.client.SequentialPdBytes]
serves requests as bytes end to end, over channels with identity serializers.
"""

from __future__ import annotations

from .client import BytesStub, SequentialPdBytes
from .legs import apply_kv_handoff, build_decode_leg, ensure_kv_handoff, prefill_leg, relay_kv
from .reader import RawRequest, read_request
from .splice import RawLeg

__all__ = [
    "BytesStub",
    "RawLeg",
    "RawRequest",
    "SequentialPdBytes",
    "apply_kv_handoff",
    "build_decode_leg",
    "ensure_kv_handoff",
    "prefill_leg",
    "read_request",
    "relay_kv",
]
