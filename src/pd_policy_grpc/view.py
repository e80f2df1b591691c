"""Reading a ``GenerateRequest`` as the core's [`pd_policy.Request`][pd_policy.request.Request].

The view reads descriptors only. It never touches a tensor's ``inline`` bytes:
with the upb runtime, reading that field (or calling ``ByteSize()``) copies the
whole payload into a new Python object. An inline payload's size is therefore
the size its shape and dtype declare; shared-memory and remote handles carry
their own.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Final

from pd_policy import (
    LegacyKvParams,
    MalformedRequest,
    MediaRef,
    MultimodalBatch,
    PayloadLocation,
    PlaceholderRange,
    Request,
    TensorDescriptor,
)

from .facts import check_generate_request
from .wire import modality_from_wire, pb

__all__ = [
    "batches_with_paths",
    "check_generate_request",
    "has_kv_transfer_params",
    "has_media_refs",
    "has_mm_inputs",
    "kv_handoff_facts",
    "parse_generate_request",
    "request_view",
    "tensor_descriptor",
]

_ITEMSIZE: Final = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "uint32": 4,
    "uint16": 2,
    "uint64": 8,
}
_LOCATION: Final = {
    "inline": PayloadLocation.INLINE,
    "shm": PayloadLocation.SHM,
    "remote": PayloadLocation.REMOTE,
    None: PayloadLocation.NONE,
}


def batches_with_paths(request: pb.GenerateRequest) -> Iterator[tuple[str, pb.MultimodalInputs]]:
    """Each multimodal batch in wire order (primary, then extras) with its field path."""
    if request.HasField("mm_inputs"):
        yield "mm_inputs", request.mm_inputs
    for i, extra in enumerate(request.extra_mm_inputs):
        yield f"extra_mm_inputs[{i}]", extra


def has_mm_inputs(request: pb.GenerateRequest) -> bool:
    """True when ``mm_inputs`` is set or ``extra_mm_inputs`` is non-empty (refs do not count)."""
    return request.HasField("mm_inputs") or len(request.extra_mm_inputs) > 0


def has_media_refs(request: pb.GenerateRequest) -> bool:
    """True when the request carries at least one media reference."""
    return request.HasField("media_refs") and len(request.media_refs.items) > 0


def has_kv_transfer_params(request: pb.GenerateRequest) -> bool:
    """True when either wire form of the KV handoff is set (an empty JSON text is not)."""
    return bool(request.kv_transfer_params_json) or request.HasField("kv_transfer_params")


def kv_handoff_facts(request: pb.GenerateRequest) -> tuple[str | None, tuple[str, int] | None]:
    """The KV handoff a message carries, as
    [`pd_policy.check_kv_handoff`][pd_policy.handoff.check_kv_handoff] reads it: the JSON
    text (``None`` when unset or empty) and the typed ``(remote_host, remote_port)``
    (``None`` when unset)."""
    legacy = request.kv_transfer_params if request.HasField("kv_transfer_params") else None
    return (
        request.kv_transfer_params_json or None,
        (legacy.remote_host, legacy.remote_port) if legacy is not None else None,
    )


def tensor_descriptor(name: str, tensor: pb.TensorData) -> TensorDescriptor:
    """The descriptor of a wire tensor, without reading its payload bytes."""
    kind = tensor.WhichOneof("payload")
    location = _LOCATION[kind]
    shape = tuple(tensor.shape)
    if kind == "shm":
        nbytes = tensor.shm.nbytes
    elif kind == "remote":
        nbytes = tensor.remote.nbytes
    elif kind == "inline":
        dtype = tensor.dtype.removeprefix("torch.")
        nbytes = math.prod(shape) * _ITEMSIZE.get(dtype, 0)
    else:
        nbytes = 0
    return TensorDescriptor(name, shape, tensor.dtype, location, nbytes)


def parse_generate_request(data: bytes) -> pb.GenerateRequest:
    """Parse and check a serialized ``GenerateRequest``.

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] for bytes that are not a
    ``GenerateRequest`` or a message that fails
    [`check_generate_request`][pd_policy_grpc.facts.check_generate_request].
    """
    request = pb.GenerateRequest()
    try:
        request.ParseFromString(data)
    except Exception:  # the runtime's DecodeError varies by protobuf backend
        raise MalformedRequest("the bytes are not a GenerateRequest", param="request") from None
    check_generate_request(request)
    return request


def _batch_view(batch: pb.MultimodalInputs) -> MultimodalBatch:
    modality = modality_from_wire(batch.modality)
    assert modality is not None  # checked
    pixels = (
        tensor_descriptor("pixel_values", batch.pixel_values)
        if batch.HasField("pixel_values")
        else None
    )
    return MultimodalBatch(
        modality=modality,
        pixel_values=pixels,
        tensors=[tensor_descriptor(k, v) for k, v in batch.model_specific_tensors.items()],
        placeholders=[PlaceholderRange(p.offset, p.length) for p in batch.mm_placeholders],
        mm_hashes=tuple(batch.mm_hashes),
        im_token_id=batch.im_token_id if batch.HasField("im_token_id") else None,
        batched_keys=tuple(batch.batched_keys),
        flat_keys=dict(batch.flat_keys),
        keep_on_cpu_keys=tuple(batch.keep_on_cpu_keys),
        encoder_input_key=batch.encoder_input_key if batch.HasField("encoder_input_key") else None,
    )


def request_view(request: pb.GenerateRequest) -> Request:
    """The core request for a ``GenerateRequest``: descriptors only, no payload copied.

    ``n`` comes from ``sampling_params.n`` (0 means 1); the vLLM wire request has
    no ``cache_salt``, so the view has none. Raises
    [`MalformedRequest`][pd_policy.errors.MalformedRequest] as
    [`check_generate_request`][pd_policy_grpc.facts.check_generate_request] does.
    """
    check_generate_request(request)
    tokenized = request.WhichOneof("input") == "tokenized"
    refs = []
    if has_media_refs(request):
        for ref in request.media_refs.items:
            modality = modality_from_wire(ref.modality)
            assert modality is not None  # checked
            refs.append(MediaRef(modality, ref.url))
    legacy = None
    if request.HasField("kv_transfer_params"):
        typed = request.kv_transfer_params
        legacy = LegacyKvParams(typed.remote_host, typed.remote_port)
    return Request(
        request_id=request.request_id,
        input_ids=tuple(request.tokenized.input_ids) if tokenized else None,
        text=None if tokenized else request.text,
        batches=[_batch_view(b) for _, b in batches_with_paths(request)],
        media_refs=refs,
        n=request.sampling_params.n,
        kv_transfer_params=(
            request.kv_transfer_params_json if request.HasField("kv_transfer_params_json") else None
        ),
        kv_legacy=legacy,
    )
