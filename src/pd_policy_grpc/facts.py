"""What the decision reads off a ``GenerateRequest``, and the wire check, in one pass.

A router runs this on every request, so it reads each field once, builds no
error path unless it fails, and never touches a tensor payload (under upb,
reading a ``bytes`` field copies it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sized
from typing import Final, NamedTuple

from pd_policy import MROPE_GRID_KEYS, MalformedRequest

from .wire import WIRE_MODALITIES, pb

__all__ = [
    "Scanned",
    "WireFacts",
    "check_generate_request",
    "has_mrope_grids",
    "read_facts",
    "scan",
]

_DECODER: Final = json.JSONDecoder()


class WireFacts(NamedTuple):
    """The facts [`pd_policy.decide_decode_form`][pd_policy.decision.decide_decode_form] reads, as
    the wire states them."""

    #: ``sampling_params.n`` as sent (0 means one sample).
    n: int
    #: ``mm_inputs`` is set or ``extra_mm_inputs`` is non-empty (media references do not count).
    has_mm_inputs: bool
    #: The request carries at least one media reference.
    has_media_refs: bool
    #: Some batch has an M-RoPE grid key, payload or not.
    has_mrope_grids: bool
    #: The first batch that carries media without content hashes (its ``mm_hashes`` path),
    #: or ``None`` ([`pd_policy.unidentified_media`][pd_policy.decision.unidentified_media]).
    unidentified: str | None = None


def _fail(param: str, message: str) -> MalformedRequest:
    return MalformedRequest(f"{param}: {message}", param=param)


def _has_grid(batch: pb.MultimodalInputs) -> bool:
    tensors = batch.model_specific_tensors
    return bool(tensors) and any(key in MROPE_GRID_KEYS for key in tensors)


def has_mrope_grids(request: pb.GenerateRequest) -> bool:
    """True when any batch has an M-RoPE grid key (payload or not), as the core decides."""
    if request.HasField("mm_inputs") and _has_grid(request.mm_inputs):
        return True
    return any(_has_grid(extra) for extra in request.extra_mm_inputs)


class Scanned(NamedTuple):
    """One pass over a request: the decision's facts, and its batches with their hashes.

    The leg builders take the batches and hashes from here rather than reading
    them off the message again: under upb every read builds new Python objects
    (eight 64-digit hashes cost about 1 µs each time).
    """

    n: int
    has_mm_inputs: bool
    has_media_refs: bool
    has_mrope_grids: bool
    #: ``mm_inputs``, or ``None`` when it is not set.
    primary: pb.MultimodalInputs | None
    #: ``extra_mm_inputs``, in order.
    extras: list[pb.MultimodalInputs]
    #: Each batch's content hashes: the primary's first (when set), then the extras'.
    hashes: list[list[str]]
    #: See [`WireFacts.unidentified`][pd_policy_grpc.facts.WireFacts].
    unidentified: str | None = None

    @property
    def facts(self) -> WireFacts:
        """The facts alone."""
        return WireFacts(
            self.n,
            self.has_mm_inputs,
            self.has_media_refs,
            self.has_mrope_grids,
            self.unidentified,
        )


def scan(request: pb.GenerateRequest, *, check: bool = True) -> Scanned:
    """Read the decision's facts and every batch's hashes, checking the wire invariants.

    The check (unless ``check=False``, for a router that checked the message on
    ingress) raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] (400) naming the field
    when: no input is set; media references ride with batches or text input,
    or have an empty URL or unknown modality; a batch has an unknown modality,
    an empty content hash, a zero-length placeholder, a placeholder past the
    end of ``input_ids`` (or any placeholder on text input), or a placeholder
    count that differs from its hash count; ``kv_transfer_params_json`` is not
    the text of a JSON object; the legacy ``kv_transfer_params`` port is over 65535; a
    model-specific tensor has an empty name.
    """
    # The hot path of every request a router routes: one pass, inlined, every field read
    # once; error paths are built only on failure.
    primary = request.mm_inputs if request.HasField("mm_inputs") else None
    extra_field = request.extra_mm_inputs
    extras = list(extra_field) if len(extra_field) else []
    batches = extras if primary is None else [primary, *extras]
    refs = request.HasField("media_refs") and len(request.media_refs.items) > 0
    hashes = []
    grids = False
    unidentified = None
    n_ids = _check_input(request, refs, bool(batches)) if check else 0
    index = -1 if primary is not None else 0  # the primary is "mm_inputs", extras count from 0
    for batch in batches:
        batch_hashes = list(batch.mm_hashes)
        hashes.append(batch_hashes)
        if check:
            # A slice first: iterating the list is cheaper than the upb container.
            placeholders = batch.mm_placeholders[:]
            if batch.modality not in WIRE_MODALITIES or not all(batch_hashes):
                _fail_batch(batch, batch_hashes, index)
            if placeholders:
                for ph in placeholders:
                    length = ph.length
                    if not length or ph.offset + length > n_ids:
                        _fail_placeholders(placeholders, n_ids, index)
                if batch_hashes and len(placeholders) != len(batch_hashes):
                    _fail_counts(placeholders, batch_hashes, index)
            # Membership only: indexing a message map with a missing key would insert it.
            if "" in batch.model_specific_tensors:
                raise _fail(
                    f"{_batch_path(index)}.model_specific_tensors", "a tensor name is empty"
                )
        if not grids:
            tensors = batch.model_specific_tensors
            grids = bool(tensors) and any(key in MROPE_GRID_KEYS for key in tensors)
        if unidentified is None and not batch_hashes and _carries_media(batch):
            unidentified = f"{_batch_path(index)}.mm_hashes"
        index += 1
    if (
        check
        and request.HasField("kv_transfer_params_json")
        and not _is_json_object(request.kv_transfer_params_json)
    ):
        raise _fail("kv_transfer_params_json", "must be the text of a JSON object")
    # The wire's port is a uint32; the view's legacy pair, a port.
    if (
        check
        and request.HasField("kv_transfer_params")
        and request.kv_transfer_params.remote_port > 65535
    ):
        raise _fail("kv_transfer_params.remote_port", "must be a port in 0..65535")
    n = request.sampling_params.n
    return Scanned(n, bool(batches), refs, grids, primary, extras, hashes, unidentified)


def _carries_media(batch: pb.MultimodalInputs) -> bool:
    # Presence only: under upb, reading a payload copies it.
    return (
        batch.HasField("pixel_values")
        or len(batch.model_specific_tensors) > 0
        or len(batch.mm_placeholders) > 0
    )


def read_facts(request: pb.GenerateRequest, *, check: bool = True) -> WireFacts:
    """The decision's facts, after checking the wire invariants (see
    [`scan`][pd_policy_grpc.facts.scan])."""
    return scan(request, check=check).facts


def check_generate_request(request: pb.GenerateRequest) -> None:
    """Check the wire invariants the policy relies on; cheap, and copies no payload.

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] as
    [`scan`][pd_policy_grpc.facts.scan] does.
    """
    scan(request)


def _is_json_object(text: str) -> bool:
    # raw_decode skips json.loads' wrapper (about 1.5 µs of a 2.3 µs call); text it does
    # not consume whole (leading or trailing whitespace) gets json.loads' exact verdict.
    try:
        parsed, end = _DECODER.raw_decode(text)
    except ValueError:
        parsed, end = None, -1
    if end != len(text):
        try:
            parsed = json.loads(text)
        except ValueError:
            return False
    return isinstance(parsed, dict)


def _batch_path(index: int) -> str:
    return "mm_inputs" if index < 0 else f"extra_mm_inputs[{index}]"


def _check_input(request: pb.GenerateRequest, refs: bool, has_mm: bool) -> int:
    """Check the input and the media references; returns the number of ids (-1: text)."""
    if request.HasField("tokenized"):
        n_ids = len(request.tokenized.input_ids)
    elif request.HasField("text"):
        n_ids = -1
    else:
        raise _fail("input", "set either tokenized or text")
    if refs:
        if has_mm:
            raise _fail("media_refs", "media_refs cannot be combined with mm_inputs")
        if n_ids < 0:
            raise _fail("media_refs", "media_refs require tokenized input")
        for i, ref in enumerate(request.media_refs.items):
            if not ref.url:
                raise _fail(f"media_refs.items[{i}].url", "a media reference needs a URL")
            if ref.modality not in WIRE_MODALITIES:
                raise _fail(f"media_refs.items[{i}].modality", "unknown modality")
    return n_ids


def _fail_batch(batch: pb.MultimodalInputs, hashes: list[str], index: int) -> None:
    if batch.modality not in WIRE_MODALITIES:
        raise _fail(f"{_batch_path(index)}.modality", "unknown modality")
    raise _fail(
        f"{_batch_path(index)}.mm_hashes[{hashes.index('')}]", "a content hash must not be empty"
    )


def _fail_counts(placeholders: Sized, hashes: list[str], index: int) -> None:
    raise _fail(
        f"{_batch_path(index)}.mm_hashes", f"{len(placeholders)} placeholders, {len(hashes)} hashes"
    )


def _fail_placeholders(placeholders: Iterable[pb.PlaceholderRange], n_ids: int, index: int) -> None:
    # The slow path, for the error only: find the first bad range and name it.
    for i, ph in enumerate(placeholders):
        offset, length = ph.offset, ph.length
        where = f"{_batch_path(index)}.mm_placeholders[{i}]"
        if length == 0:
            raise _fail(where, "a placeholder range must cover at least one token")
        if offset + length > n_ids:
            detail = "runs past input_ids" if n_ids >= 0 else "needs tokenized input"
            raise _fail(where, f"[{offset}, {offset + length}) {detail}")
