"""The decode-leg builders on ``GenerateRequest`` messages, with the core's semantics.

Each builder returns a new message and leaves its input untouched (it
serializes to the same bytes before and after). A builder copies only what the
leg keeps: the stripped forms never touch a pixel or tensor payload they drop,
so their cost does not grow with the pixels. Only ``FULL`` copies pixels,
because its leg keeps them.
"""

from __future__ import annotations

from typing import Final

from google.protobuf.internal.containers import MessageMap
from google.protobuf.message import Message

from pd_policy import (
    MROPE_GRID_KEYS,
    DecodeForm,
    WorkerCapability,
    decide_decode_form,
)

from .view import check_generate_request, has_media_refs, has_mm_inputs
from .wire import MM_FIELDS, pb

#: Submessages that hold long repeated fields (the ids), copied field by field.
_LARGE_SUBMESSAGES: Final = frozenset({"tokenized"})

__all__ = [
    "build_decode_leg",
    "clone_without_mm",
    "decode_form",
    "has_mrope_grids",
    "identity_only",
]


def has_mrope_grids(request: pb.GenerateRequest) -> bool:
    """True when any batch has an M-RoPE grid key (payload or not), as the core decides."""
    if request.HasField("mm_inputs") and _has_grid(request.mm_inputs):
        return True
    return any(_has_grid(extra) for extra in request.extra_mm_inputs)


def _has_grid(batch: pb.MultimodalInputs) -> bool:
    tensors = batch.model_specific_tensors
    return bool(tensors) and any(key in MROPE_GRID_KEYS for key in tensors)


def _copy_fields(target: Message, source: Message, skip: frozenset[str] = frozenset()) -> None:
    """Copy ``source``'s set fields into ``target``, except ``skip``.

    Repeated fields are extended rather than copied with ``CopyFrom``: upb's
    ``CopyFrom`` round-trips through the wire format, ~25 µs for 4096 ids where
    ``extend`` takes ~1 µs. Small submessages take ``CopyFrom``. Fields this
    version of the proto does not know are not carried over.
    """
    for field, value in source.ListFields():
        name = field.name
        if name in skip:
            continue
        if field.is_repeated:
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                getattr(target, name).MergeFrom(value)
            else:
                getattr(target, name).extend(value)
        elif field.message_type is None:
            setattr(target, name, value)
        elif name in _LARGE_SUBMESSAGES:
            child = getattr(target, name)
            child.SetInParent()  # an empty submessage is still set
            _copy_fields(child, value)
        else:
            getattr(target, name).CopyFrom(value)


def _copy_without_mm(request: pb.GenerateRequest) -> pb.GenerateRequest:
    # The multimodal fields (and their payloads) are never touched.
    leg = pb.GenerateRequest()
    _copy_fields(leg, request, MM_FIELDS)
    return leg


def _add_hash_identity(target: pb.MultimodalInputs, batch: pb.MultimodalInputs) -> None:
    target.mm_hashes.extend(batch.mm_hashes)
    target.modality = batch.modality


def _is_inline(tensors: MessageMap[str, pb.TensorData], name: str) -> bool:
    # Membership first: indexing a message map with a missing key would insert one.
    return name in tensors and tensors[name].WhichOneof("payload") == "inline"


def _mm_identity(batch: pb.MultimodalInputs) -> pb.MultimodalInputs | None:
    if not batch.mm_hashes:
        return None
    tensors = batch.model_specific_tensors
    grids = {k for k in tensors if k in MROPE_GRID_KEYS and _is_inline(tensors, k)}
    flat = dict(batch.flat_keys)
    grids -= {k for k, sizes in flat.items() if k in grids and not _is_inline(tensors, sizes)}
    kept_flat = {k: sizes for k, sizes in flat.items() if k in grids}
    kept = grids | set(kept_flat.values())
    out = pb.MultimodalInputs(
        mm_hashes=batch.mm_hashes,
        modality=batch.modality,
        mm_placeholders=batch.mm_placeholders,
        flat_keys=kept_flat,
        batched_keys=[k for k in batch.batched_keys if k in kept],
    )
    keep_on_cpu = [k for k in batch.keep_on_cpu_keys if k in kept]
    # Beyond upstream: vLLM 0.32 loses a grid that is not kept on CPU once its image is
    # prefix-cached, and the worker dies with KeyError('image_grid_thw').
    keep_on_cpu += sorted(g for g in grids if g not in keep_on_cpu)
    out.keep_on_cpu_keys.extend(keep_on_cpu)
    for name in sorted(kept):
        out.model_specific_tensors[name].CopyFrom(tensors[name])
    if batch.HasField("im_token_id"):
        out.im_token_id = batch.im_token_id
    if batch.HasField("encoder_input_key"):
        out.encoder_input_key = batch.encoder_input_key
    return out


def clone_without_mm(request: pb.GenerateRequest) -> pb.GenerateRequest:
    """The text-plus-hashes decode leg (see :func:`pd_policy.clone_without_mm`).

    Every non-multimodal field is kept, ``input_ids``, sampling parameters and
    both KV forms included. Each batch becomes its hashes and modality; a
    hash-less batch (primary or extra) is dropped whole; ``media_refs`` go.
    """
    leg = _copy_without_mm(request)
    if request.HasField("mm_inputs") and request.mm_inputs.mm_hashes:
        _add_hash_identity(leg.mm_inputs, request.mm_inputs)
    for extra in request.extra_mm_inputs:
        if extra.mm_hashes:
            _add_hash_identity(leg.extra_mm_inputs.add(), extra)
    return leg


def identity_only(request: pb.GenerateRequest) -> pb.GenerateRequest:
    """The identity-only decode leg (see :func:`pd_policy.identity_only`).

    No pixels; inline M-RoPE grids (and their inline sizes tensors) are kept;
    ``media_refs`` are kept.
    """
    leg = _copy_without_mm(request)
    if request.HasField("media_refs"):
        leg.media_refs.CopyFrom(request.media_refs)
    if request.HasField("mm_inputs"):
        primary = _mm_identity(request.mm_inputs)
        if primary is not None:
            leg.mm_inputs.CopyFrom(primary)
    for extra in request.extra_mm_inputs:
        identity = _mm_identity(extra)
        if identity is not None:
            leg.extra_mm_inputs.append(identity)
    return leg


def decode_form(
    request: pb.GenerateRequest, decode_worker: WorkerCapability, *, check: bool = True
) -> DecodeForm:
    """The core decision for a wire request (see :func:`pd_policy.sequential_pd_decode_form`).

    Raises :class:`~pd_policy.MalformedRequest` for an inconsistent message and
    the core's carve-out errors. ``check=False`` skips
    :func:`~pd_policy_grpc.check_generate_request`, for a router that already
    ran it on ingress (``parse_generate_request`` does).
    """
    if check:
        check_generate_request(request)
    return decide_decode_form(
        language_model_only=decode_worker.language_model_only,
        n=request.sampling_params.n,
        has_mrope_grids=has_mrope_grids(request),
        has_media_refs=has_media_refs(request),
        has_mm_inputs=has_mm_inputs(request),
    )


def build_decode_leg(
    request: pb.GenerateRequest, decode_worker: WorkerCapability, *, check: bool = True
) -> tuple[DecodeForm, pb.GenerateRequest]:
    """Decide the form for ``decode_worker`` and build the decode leg as a new message.

    Raises :class:`~pd_policy.MalformedRequest` and the core's carve-out errors
    (all 400s) before anything is copied. ``check=False``: see :func:`decode_form`.
    """
    form = decode_form(request, decode_worker, check=check)
    if form is DecodeForm.TEXT_PLUS_HASHES:
        return form, clone_without_mm(request)
    if form is DecodeForm.IDENTITY_ONLY:
        return form, identity_only(request)
    leg = pb.GenerateRequest()
    leg.CopyFrom(request)
    return form, leg
