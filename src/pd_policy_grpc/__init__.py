"""pd-policy on the SMG vLLM engine protos (``smg-grpc-proto``), and a sequential P/D client.

A router that speaks to vLLM workers over gRPC applies the core policy to its
``GenerateRequest`` messages directly: the leg builders here have exactly the
core's semantics, copy no payload a leg drops, and raise the core's errors.
"""

from __future__ import annotations

try:
    import smg_grpc_proto  # noqa: F401

    import grpc  # noqa: F401
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError(
        f"pd_policy_grpc needs the grpc extra ({exc.name} is missing): "
        "pip install 'pd-policy[grpc]'",
        name=exc.name,
    ) from exc

from .capability import (
    accepts_mm_metadata_from_info,
    capability_from_info,
    capability_from_labels,
    worker_labels,
)
from .client import SequentialPd
from .facts import WireFacts, read_facts
from .fleet import FleetPd, GrpcWorker, describe_worker
from .kv import (
    apply_kv_handoff,
    ensure_kv_handoff,
    kv_mode_from_server_info,
    prefill_kv_from_info,
    prefill_leg,
    relay_kv,
)
from .legs import (
    build_decode_leg,
    clone_without_mm,
    decode_form,
    has_mrope_grids,
    identity_only,
    metadata_only,
)
from .status import GrpcStatus, HttpError, error_from_rpc, grpc_status, http_error
from .view import (
    check_generate_request,
    has_kv_transfer_params,
    has_media_refs,
    has_mm_inputs,
    parse_generate_request,
    request_view,
    tensor_descriptor,
)

__all__ = [
    "FleetPd",
    "GrpcStatus",
    "GrpcWorker",
    "HttpError",
    "SequentialPd",
    "WireFacts",
    "accepts_mm_metadata_from_info",
    "apply_kv_handoff",
    "build_decode_leg",
    "capability_from_info",
    "capability_from_labels",
    "check_generate_request",
    "clone_without_mm",
    "decode_form",
    "describe_worker",
    "ensure_kv_handoff",
    "error_from_rpc",
    "grpc_status",
    "has_kv_transfer_params",
    "has_media_refs",
    "has_mm_inputs",
    "has_mrope_grids",
    "http_error",
    "identity_only",
    "kv_mode_from_server_info",
    "metadata_only",
    "parse_generate_request",
    "prefill_kv_from_info",
    "prefill_leg",
    "read_facts",
    "relay_kv",
    "request_view",
    "tensor_descriptor",
    "worker_labels",
]
