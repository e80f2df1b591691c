"""The reader: what the policy needs from a serialized ``GenerateRequest``, no pixel read.

[`read_request`][pd_policy_grpc.raw.reader.read_request] walks the top-level fields
and the multimodal batches, and parses a *skeleton*: the same bytes with every
tensor payload a leg never keeps (pixels, and the model's tensors other than
M-RoPE grids and the sizes tensors of flat keys) cut to zero length. Nothing
the policy reads depends on those bytes: a tensor's descriptor is its shape,
dtype and where its payload lives, and an emptied inline payload is still
inline. The skeleton keeps every other byte in wire order, so the runtime
parses it with the wire format's own rules (the last scalar wins, repeated
submessages merge, packed and unpacked repeated scalars, unknown fields), and
the policy's message code reads it unchanged.

The cost is a walk over the fields and a parse of what is not pixels: it does
not grow with the payload.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import attrs

from pd_policy import MROPE_GRID_KEYS, MalformedRequest, Request
from pd_policy.request_bounds import DEFAULT_MAX_MEDIA_ITEMS
from pd_policy_grpc.facts import WireFacts, check_generate_request, read_facts
from pd_policy_grpc.view import request_view
from pd_policy_grpc.wire import pb

from .items import Tally
from .protowire import LEN, Field, fields, length_prefix

__all__ = ["RawRequest", "read_request"]

_REQUEST: Final = pb.GenerateRequest.DESCRIPTOR.fields_by_name
_BATCH: Final = pb.MultimodalInputs.DESCRIPTOR.fields_by_name
MM_INPUTS: Final[int] = _REQUEST["mm_inputs"].number
EXTRA_MM_INPUTS: Final[int] = _REQUEST["extra_mm_inputs"].number
_PIXELS: Final[int] = _BATCH["pixel_values"].number
_TENSORS: Final[int] = _BATCH["model_specific_tensors"].number
_FLAT_KEYS: Final[int] = _BATCH["flat_keys"].number
_HASHES: Final[int] = _BATCH["mm_hashes"].number
_RANGES: Final[int] = _BATCH["mm_placeholders"].number
_INLINE: Final[int] = pb.TensorData.DESCRIPTOR.fields_by_name["inline"].number
# A map entry is a message of its key (field 1) and its value (field 2).
_KEY: Final = 1
_VALUE: Final = 2
_EMPTY_INLINE: Final = length_prefix(_INLINE, 0)

Parts = list[bytes | memoryview]
_Rewrite = Callable[[memoryview, Field, Parts], None]


@attrs.frozen(slots=True, eq=False)
class RawRequest:
    """A serialized ``GenerateRequest`` and what the policy reads from it.

    Build it with [`read_request`][pd_policy_grpc.raw.reader.read_request].
    """

    #: The bytes as received; the legs are cut from them.
    data: memoryview = attrs.field(repr=lambda d: f"<{len(d)} bytes>")
    #: The message without the payloads no leg keeps (see the module docs).
    skeleton: pb.GenerateRequest = attrs.field(repr=False)
    #: The top-level fields, in wire order.
    fields: tuple[Field, ...] = attrs.field(repr=False)
    #: Its media items, counted before the skeleton was parsed (exact up to the reader's
    #: cap: [`Tally`][pd_policy_grpc.raw.items.Tally]).
    media_items: int = attrs.field(kw_only=True)

    @property
    def n(self) -> int:
        """``sampling_params.n`` (0 means one sample)."""
        return int(self.skeleton.sampling_params.n)

    def view(self) -> Request:
        """The core request ([`request_view`][pd_policy_grpc.view.request_view] of the message)."""
        return request_view(self.skeleton)

    def facts(self) -> WireFacts:
        """The decision's facts ([`read_facts`][pd_policy_grpc.facts.read_facts])."""
        return read_facts(self.skeleton, check=False)


def read_request(
    data: bytes | bytearray | memoryview,
    *,
    check: bool = True,
    max_media_items: int = DEFAULT_MAX_MEDIA_ITEMS,
) -> RawRequest:
    """Read a serialized ``GenerateRequest`` without reading or copying its tensor payloads.

    Raises [`TooManyMediaItems`][pd_policy.client_errors.TooManyMediaItems] (400) for a
    request of more than ``max_media_items`` media items, counted from the tags before
    anything is parsed; [`MalformedRequest`][pd_policy.errors.MalformedRequest] (400) for
    bytes the protobuf runtime would not parse as a ``GenerateRequest``, and, unless
    ``check=False``, for a message that fails
    [`check_generate_request`][pd_policy_grpc.facts.check_generate_request].
    """
    buf = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    # The media items are counted in the walks below, each refusing the request once past
    # the cap: the walk stops there, and nothing is parsed.
    tally = Tally(max_media_items)
    walked = []
    for field in fields(buf):
        walked.append(field)
        tally.top(buf, field)
    top = tuple(walked)
    # The primary batch may come in several occurrences, which merge: a flat key in one
    # can name a sizes tensor in another.
    primary: set[str] = set()
    for field in top:
        if field.wire_type == LEN and field.number == MM_INPUTS:
            names, hashes, ranges = _scan_batch(buf, field, *tally.primary_budgets())
            primary |= names
            tally.primary(hashes, ranges)
    parts: Parts = []
    for field in top:
        if field.wire_type == LEN and field.number == MM_INPUTS:
            _batch(buf, field, parts, primary)
        elif field.wire_type == LEN and field.number == EXTRA_MM_INPUTS:
            budget = tally.extra_budget()
            names, hashes, ranges = _scan_batch(buf, field, budget, budget)
            tally.extra(hashes, ranges)
            _batch(buf, field, parts, names)
        else:
            parts.append(buf[field.start : field.end])
    skeleton = pb.GenerateRequest()
    try:
        skeleton.ParseFromString(b"".join(parts))
    except Exception:  # the runtime's DecodeError varies by protobuf backend
        raise MalformedRequest("the bytes are not a GenerateRequest", param="request") from None
    if check:
        check_generate_request(skeleton)
    return RawRequest(buf, skeleton, top, media_items=tally.total)


def _text(buf: memoryview, field: Field) -> str:
    # For a membership test only: text the runtime refuses makes the skeleton's parse fail.
    return bytes(buf[field.value : field.end]).decode("utf-8", "replace")


def _scan_batch(
    buf: memoryview, batch: Field, hash_budget: int, range_budget: int
) -> tuple[set[str], int, int]:
    """The values of the batch's ``flat_keys`` entries (the names of sizes tensors), and its
    content hashes and placeholder ranges, counted until past their budgets (the walk
    stops there: the request is refused)."""
    names = set()
    hashes = ranges = 0
    for field in fields(buf, batch.value, batch.end):
        if field.wire_type != LEN:
            continue  # another wire type is an unknown field to the runtime
        number = field.number
        if number == _HASHES:
            hashes += 1
            if hashes > hash_budget:
                break
        elif number == _RANGES:
            ranges += 1
            if ranges > range_budget:
                break
        elif number == _FLAT_KEYS:
            value = ""  # the last occurrence of a field wins, as in any message
            for inner in fields(buf, field.value, field.end):
                if inner.number == _VALUE and inner.wire_type == LEN:
                    value = _text(buf, inner)
            names.add(value)
    return names, hashes, ranges


def _entry_key(buf: memoryview, entry: Field) -> str:
    key = ""
    for inner in fields(buf, entry.value, entry.end):
        if inner.number == _KEY and inner.wire_type == LEN:
            key = _text(buf, inner)
    return key


def _batch(buf: memoryview, batch: Field, out: Parts, sizes: set[str]) -> None:
    """Append ``batch`` with the payloads no leg keeps emptied (``sizes``: the names of its
    sizes tensors)."""
    kept = MROPE_GRID_KEYS | sizes
    parts: Parts = []
    for field in fields(buf, batch.value, batch.end):
        if field.wire_type == LEN and field.number == _PIXELS:
            _nested(buf, field, parts, _tensor)
        elif (
            field.wire_type == LEN
            and field.number == _TENSORS
            and _entry_key(buf, field) not in kept
        ):
            _nested(buf, field, parts, _entry)
        else:
            parts.append(buf[field.start : field.end])
    _emit(batch.number, parts, out)


def _entry(buf: memoryview, entry: Field, out: Parts) -> None:
    for field in fields(buf, entry.value, entry.end):
        if field.number == _VALUE and field.wire_type == LEN:
            _nested(buf, field, out, _tensor)
        else:
            out.append(buf[field.start : field.end])


def _tensor(buf: memoryview, tensor: Field, out: Parts) -> None:
    for field in fields(buf, tensor.value, tensor.end):
        if field.number == _INLINE and field.wire_type == LEN:
            out.append(_EMPTY_INLINE)  # still the inline case of the payload oneof
        else:
            out.append(buf[field.start : field.end])


def _nested(buf: memoryview, field: Field, out: Parts, rewrite: _Rewrite) -> None:
    parts: Parts = []
    rewrite(buf, field, parts)
    _emit(field.number, parts, out)


def _emit(number: int, parts: Parts, out: Parts) -> None:
    out.append(length_prefix(number, sum(len(p) for p in parts)))
    out.extend(parts)
