"""The decode-leg builders on ``GenerateRequest`` messages, with the core's semantics.

Each builder returns a new message and leaves its input untouched (it
serializes to the same bytes before and after). A builder copies only what the
leg keeps: the stripped forms never touch a pixel or tensor payload they drop,
so their cost does not grow with the pixels. Only ``FULL`` copies pixels,
because its leg keeps them.
"""

from __future__ import annotations

from google.protobuf.internal.containers import MessageMap

from pd_policy import (
    MROPE_GRID_KEYS,
    DecodeForm,
    WorkerCapability,
    decide_decode_form,
    mrope_metadata_gap,
)

from .copying import copy_without_mm
from .facts import Scanned, WireFacts, has_mrope_grids, scan
from .view import request_view
from .wire import pb

__all__ = [
    "build_decode_leg",
    "clone_without_mm",
    "decode_form",
    "has_mrope_grids",
    "identity_only",
    "metadata_only",
]


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
    # Every kept grid, a grid kept as another grid's sizes tensor included.
    keep_on_cpu += sorted(g for g in kept & MROPE_GRID_KEYS if g not in keep_on_cpu)
    out.keep_on_cpu_keys.extend(keep_on_cpu)
    for name in sorted(kept):
        out.model_specific_tensors[name].CopyFrom(tensors[name])
    if batch.HasField("im_token_id"):
        out.im_token_id = batch.im_token_id
    if batch.HasField("encoder_input_key"):
        out.encoder_input_key = batch.encoder_input_key
    return out


def clone_without_mm(request: pb.GenerateRequest) -> pb.GenerateRequest:
    """The text-plus-hashes decode leg (see
    [`pd_policy.clone_without_mm`][pd_policy.legs.clone_without_mm]).

    Every non-multimodal field is kept, ``input_ids``, sampling parameters and
    both KV forms included. Each batch becomes its hashes and modality; a
    hash-less batch (primary or extra) is dropped whole; ``media_refs`` go.
    """
    return _text_plus_hashes(request, scan(request, check=False))


def _text_plus_hashes(request: pb.GenerateRequest, scanned: Scanned) -> pb.GenerateRequest:
    # Each batch becomes its hashes and modality, built by the leg's constructor.
    fields: dict[str, object] = {}
    hashes = iter(scanned.hashes)
    primary = scanned.primary
    if primary is not None:
        primary_hashes = next(hashes)
        if primary_hashes:
            fields["mm_inputs"] = {"mm_hashes": primary_hashes, "modality": primary.modality}
    extras = [
        {"mm_hashes": extra_hashes, "modality": extra.modality}
        for extra, extra_hashes in zip(scanned.extras, hashes, strict=True)
        if extra_hashes
    ]
    if extras:
        fields["extra_mm_inputs"] = extras
    return copy_without_mm(request, **fields)


def identity_only(request: pb.GenerateRequest) -> pb.GenerateRequest:
    """The identity-only decode leg (see [`pd_policy.identity_only`][pd_policy.legs.identity_only]).

    No pixels; inline M-RoPE grids (and their inline sizes tensors) are kept;
    ``media_refs`` are kept.
    """
    leg = _identities(request)
    if request.HasField("media_refs"):
        leg.media_refs.CopyFrom(request.media_refs)
    return leg


def metadata_only(request: pb.GenerateRequest) -> pb.GenerateRequest:
    """The M-RoPE metadata decode leg (see
    [`pd_policy.metadata_only`][pd_policy.legs.metadata_only]).

    Per batch: hashes, placeholders, image token id and inline M-RoPE grids
    with their inline sizes tensors, every grid in ``keep_on_cpu_keys``; no
    pixels, no other tensor, no ``media_refs``. Raises the core's
    [`MropeOnLanguageModelOnlyDecode`][pd_policy.errors.MropeOnLanguageModelOnlyDecode] naming what
    the request
    lacks ([`pd_policy.mrope_metadata_gap`][pd_policy.mrope.mrope_metadata_gap]), so no incomplete
    leg is built.
    """
    gap = mrope_metadata_gap(request_view(request))
    if gap is not None:
        raise gap
    return _identities(request)


def _identities(request: pb.GenerateRequest) -> pb.GenerateRequest:
    leg = copy_without_mm(request)
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
    """The core decision for a wire request (see
    [`pd_policy.sequential_pd_decode_form`][pd_policy.decision.sequential_pd_decode_form]).

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] for an inconsistent message and
    the core's carve-out errors. ``check=False`` skips
    [`check_generate_request`][pd_policy_grpc.facts.check_generate_request], for a router that
    already
    ran it on ingress (``parse_generate_request`` does).
    """
    return _decide(request, scan(request, check=check), decode_worker)


def _decide(
    request: pb.GenerateRequest, facts: WireFacts | Scanned, decode_worker: WorkerCapability
) -> DecodeForm:
    metadata = decode_worker.takes_mm_metadata
    gap = None
    if metadata and facts.has_mrope_grids:
        # Only M-RoPE requests to such a worker take this slower, complete look.
        gap = mrope_metadata_gap(request_view(request))
    return decide_decode_form(
        language_model_only=decode_worker.language_model_only,
        n=facts.n,
        has_mrope_grids=facts.has_mrope_grids,
        has_media_refs=facts.has_media_refs,
        has_mm_inputs=facts.has_mm_inputs,
        takes_mm_metadata=metadata,
        metadata_gap=gap,
        unidentified=facts.unidentified,
        blind_to_stripped_media=decode_worker.blind_to_stripped_media,
    )


def build_decode_leg(
    request: pb.GenerateRequest, decode_worker: WorkerCapability, *, check: bool = True
) -> tuple[DecodeForm, pb.GenerateRequest]:
    """Decide the form for ``decode_worker`` and build the decode leg as a new message.

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] and the core's carve-out errors
    (all 400s) before anything is copied. ``check=False``: see
    [`decode_form`][pd_policy_grpc.legs.decode_form].
    """
    scanned = scan(request, check=check)
    form = _decide(request, scanned, decode_worker)
    if form is DecodeForm.TEXT_PLUS_HASHES:
        return form, _text_plus_hashes(request, scanned)
    if form is DecodeForm.IDENTITY_ONLY:
        return form, identity_only(request)
    if form is DecodeForm.MROPE_METADATA:
        return form, _identities(request)  # the decision found nothing missing
    leg = pb.GenerateRequest()
    leg.CopyFrom(request)
    return form, leg
