"""The legs as bytes, with exactly the semantics of the message legs.

Each builder decides on the reader's skeleton with the message code, then cuts
the leg from the ingress bytes (see [`splice`][pd_policy_grpc.raw.splice]):

* the prefill leg is the request with its sampling parameters, ``stream``, KV
  parameters and data-parallel rank replaced, and every M-RoPE grid listed in
  its batch's ``keep_on_cpu_keys``: a few hundred bytes written, the pixels
  untouched;
* a stripped, identity or metadata decode leg is the request without its
  multimodal fields, plus the small batches the message builders make;
* a ``FULL`` decode leg is the request.

Unlike the message legs, these carry the top-level fields this version of the
proto does not know, as the router received them.
"""

from __future__ import annotations

from typing import Final

from pd_policy import (
    MROPE_GRID_KEYS,
    DecodeForm,
    KvConnectorMode,
    KvHandoff,
    WorkerCapability,
    check_kv_handoff,
)
from pd_policy_grpc import legs as message_legs
from pd_policy_grpc.kv import sanitise_prefill_sampling
from pd_policy_grpc.view import has_mm_inputs
from pd_policy_grpc.wire import pb

from .protowire import LEN, VARINT, length_prefix, tag, varint
from .reader import EXTRA_MM_INPUTS, MM_INPUTS, RawRequest
from .splice import Entry, RawLeg, message_entry

__all__ = [
    "apply_kv_handoff",
    "build_decode_leg",
    "ensure_kv_handoff",
    "prefill_leg",
    "relay_kv",
    "with_request_id",
]

_REQUEST: Final = pb.GenerateRequest.DESCRIPTOR.fields_by_name
_REQUEST_ID: Final[int] = _REQUEST["request_id"].number
_SAMPLING: Final[int] = _REQUEST["sampling_params"].number
_STREAM: Final[int] = _REQUEST["stream"].number
_KV_LEGACY: Final[int] = _REQUEST["kv_transfer_params"].number
_KV_JSON: Final[int] = _REQUEST["kv_transfer_params_json"].number
_DP_RANK: Final[int] = _REQUEST["data_parallel_rank"].number
_MEDIA_REFS: Final[int] = _REQUEST["media_refs"].number
_MM: Final = ((MM_INPUTS, LEN), (EXTRA_MM_INPUTS, LEN), (_MEDIA_REFS, LEN))


def _text_field(number: int, text: str) -> bytes:
    body = text.encode()
    return length_prefix(number, len(body)) + body


def _missing_grids(batch: pb.MultimodalInputs) -> list[str]:
    listed = set(batch.keep_on_cpu_keys)
    return sorted(
        k for k in batch.model_specific_tensors if k in MROPE_GRID_KEYS and k not in listed
    )


def prefill_leg(request: RawRequest, handoff: KvHandoff) -> RawLeg:
    """The sanitised prefill leg under ``handoff``, as
    [`pd_policy_grpc.prefill_leg`][pd_policy_grpc.kv.prefill_leg] builds it.

    ``max_tokens=1``, ``min_tokens=0``, ``n=1``, no ``stop`` or ``stop_token_ids``,
    ``ignore_eos``, ``stream=false``; the handoff's prefill parameters and
    data-parallel rank, when it has them; every M-RoPE grid in its batch's
    ``keep_on_cpu_keys``. Raises ``ValueError`` for a handoff that runs no prefill (n>1).
    """
    if not handoff.runs_prefill:
        raise ValueError("this handoff runs no prefill leg (n>1: decode runs alone)")
    skeleton = request.skeleton
    params = pb.SamplingParams()
    params.CopyFrom(skeleton.sampling_params)  # every occurrence, merged
    sanitise_prefill_sampling(params)
    leg = RawLeg.of(request.data, request.fields, 1)
    leg = leg.without((_SAMPLING, LEN), (_STREAM, VARINT)).plus(message_entry(_SAMPLING, params))
    if handoff.prefill_params is not None:
        leg = leg.replaced(_KV_JSON, LEN, _text_field(_KV_JSON, handoff.prefill_params))
    if handoff.dp_rank is not None:
        leg = leg.replaced(_DP_RANK, VARINT, tag(_DP_RANK, VARINT) + varint(handoff.dp_rank))
    return _grids_on_cpu(leg, skeleton)


def _grids_on_cpu(leg: RawLeg, skeleton: pb.GenerateRequest) -> RawLeg:
    # The primary batch may be split over several occurrences, which merge: one more,
    # listing the missing grids, appends them to its keep_on_cpu_keys.
    entries = list(leg.entries)
    if skeleton.HasField("mm_inputs") and (missing := _missing_grids(skeleton.mm_inputs)):
        entries.append(message_entry(MM_INPUTS, pb.MultimodalInputs(keep_on_cpu_keys=missing)))
    # Each occurrence of extra_mm_inputs is its own batch: the missing keys go at its end.
    extras = iter(skeleton.extra_mm_inputs)
    for i, entry in enumerate(entries):
        if (entry.number, entry.wire_type) != (EXTRA_MM_INPUTS, LEN):
            continue
        missing = _missing_grids(next(extras))
        if missing:
            more = pb.MultimodalInputs(keep_on_cpu_keys=missing).SerializeToString()
            # An entry of the request's own: one view of the field, tag and length first.
            (whole,) = entry.parts
            body = memoryview(whole)[len(tag(EXTRA_MM_INPUTS, LEN)) :]
            payload = body[_length(body)[1] :]
            head = length_prefix(EXTRA_MM_INPUTS, len(payload) + len(more))
            entries[i] = Entry(EXTRA_MM_INPUTS, LEN, (head, payload, more))
    return RawLeg(tuple(entries), leg.n)


def _length(buf: memoryview) -> tuple[int, int]:
    """The varint length at the start of ``buf`` and where the payload starts."""
    value = shift = pos = 0
    while True:
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7


def build_decode_leg(
    request: RawRequest, decode_worker: WorkerCapability, *, check: bool = False
) -> tuple[DecodeForm, RawLeg]:
    """Decide the form for ``decode_worker`` and build the decode leg, as
    [`pd_policy_grpc.build_decode_leg`][pd_policy_grpc.legs.build_decode_leg] does.

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] and the core's
    carve-out errors (400s). ``check``: check the message again
    ([`read_request`][pd_policy_grpc.raw.reader.read_request] already did, by default).
    """
    skeleton = request.skeleton
    form = message_legs.decode_form(skeleton, decode_worker, check=check)
    whole = RawLeg.of(request.data, request.fields, request.n)
    if form is DecodeForm.FULL:
        return form, whole
    _, small = message_legs.build_decode_leg(skeleton, decode_worker, check=False)
    batches: list[Entry] = []
    if small.HasField("mm_inputs"):
        batches.append(message_entry(MM_INPUTS, small.mm_inputs))
    batches += [message_entry(EXTRA_MM_INPUTS, extra) for extra in small.extra_mm_inputs]
    if small.HasField("media_refs"):
        batches.append(message_entry(_MEDIA_REFS, small.media_refs))
    return form, whole.without(*_MM).plus(*batches)


def apply_kv_handoff(leg: RawLeg, handoff: KvHandoff) -> RawLeg:
    """The decode ``leg`` with what ``handoff`` sends before prefill, as
    [`pd_policy_grpc.apply_kv_handoff`][pd_policy_grpc.kv.apply_kv_handoff] puts it."""
    if handoff.decode_params is not None:
        leg = leg.replaced(_KV_JSON, LEN, _text_field(_KV_JSON, handoff.decode_params))
    if handoff.decode_legacy is not None:
        legacy = pb.KvTransferParams(
            remote_host=handoff.decode_legacy.remote_host,
            remote_port=handoff.decode_legacy.remote_port,
        )
        leg = leg.without((_KV_LEGACY, LEN)).plus(message_entry(_KV_LEGACY, legacy))
    return leg


def relay_kv(leg: RawLeg, complete: pb.GenerateComplete) -> RawLeg:
    """The decode ``leg`` with the KV parameters the prefill returned, as
    [`pd_policy_grpc.relay_kv`][pd_policy_grpc.kv.relay_kv] relays them (nothing for n>1)."""
    if leg.n > 1:
        return leg
    if complete.kv_transfer_params_json:
        leg = leg.replaced(_KV_JSON, LEN, _text_field(_KV_JSON, complete.kv_transfer_params_json))
    if complete.HasField("kv_transfer_params"):
        typed = complete.kv_transfer_params
        leg = leg.without((_KV_LEGACY, LEN)).plus(message_entry(_KV_LEGACY, typed))
    return leg


def with_request_id(leg: RawLeg, request_id: str) -> RawLeg:
    """The ``leg`` under ``request_id`` alone: every occurrence the caller wrote goes."""
    return leg.replaced(_REQUEST_ID, LEN, _text_field(_REQUEST_ID, request_id))


def ensure_kv_handoff(
    original: RawRequest, form: DecodeForm, leg: RawLeg, mode: KvConnectorMode
) -> None:
    """The post-prefill check (see
    [`pd_policy.ensure_kv_handoff`][pd_policy.handoff.ensure_kv_handoff]), for the prefill
    worker's connector contract ``mode``.

    Raises [`MissingKvTransferParams`][pd_policy.errors.MissingKvTransferParams] (502).
    """
    params, legacy = leg.kv_handoff_facts()
    check_kv_handoff(
        form,
        has_mm_inputs=has_mm_inputs(original.skeleton),
        kv_transfer_params=params,
        kv_legacy=legacy,
        mode=mode,
    )
