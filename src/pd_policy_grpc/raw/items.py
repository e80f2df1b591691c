"""The media items of a serialized ``GenerateRequest``, counted from its tags alone.

The same number as [`count_media_items`][pd_policy_grpc.media_items.count_media_items]
counts on the parsed message, under the wire's merge rules: the occurrences of
``mm_inputs`` merge into one batch (their hashes and ranges add up), each occurrence of
``extra_mm_inputs`` is a batch of its own, and the occurrences of ``media_refs`` merge
(their items add up). Only the tags of a batch's fields are read, each payload skipped by
its length, and the walk stops once the count passes the cap: a request of a million
items costs the reader a count to the cap, not a parse of a million hashes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from pd_policy_grpc.wire import pb

from .protowire import LEN, Field, fields

__all__ = ["count_raw_media_items"]

_REQUEST: Final = pb.GenerateRequest.DESCRIPTOR.fields_by_name
_BATCH: Final = pb.MultimodalInputs.DESCRIPTOR.fields_by_name
_MM_INPUTS: Final[int] = _REQUEST["mm_inputs"].number
_EXTRA_MM_INPUTS: Final[int] = _REQUEST["extra_mm_inputs"].number
_MEDIA_REFS: Final[int] = _REQUEST["media_refs"].number
_REF_ITEMS: Final[int] = pb.MediaRefs.DESCRIPTOR.fields_by_name["items"].number
_HASHES: Final[int] = _BATCH["mm_hashes"].number
_RANGES: Final[int] = _BATCH["mm_placeholders"].number
_ITEM_FIELDS: Final = frozenset({_MM_INPUTS, _EXTRA_MM_INPUTS, _MEDIA_REFS})


def _named(buf: memoryview, batch: Field, hash_budget: int, range_budget: int) -> tuple[int, int]:
    """The content hashes and placeholder ranges of one occurrence of a batch, counted
    until the hashes pass ``hash_budget`` or the ranges ``range_budget``."""
    hashes = ranges = 0
    for field in fields(buf, batch.value, batch.end):
        if field.wire_type != LEN:
            continue  # another wire type is an unknown field to the runtime, not an item
        if field.number == _HASHES:
            hashes += 1
        elif field.number == _RANGES:
            ranges += 1
        else:
            continue
        if hashes > hash_budget or ranges > range_budget:
            break
    return hashes, ranges


def _refs(buf: memoryview, refs: Field, budget: int) -> int:
    count = 0
    for field in fields(buf, refs.value, refs.end):
        if field.number == _REF_ITEMS and field.wire_type == LEN:
            count += 1
            if count > budget:
                break
    return count


def count_raw_media_items(buf: memoryview, top: Iterable[Field], limit: int) -> int:
    """The media items of the message in ``buf`` whose top-level fields are ``top``: exact
    up to ``limit``, and some number past it when there are more. ``top`` is read up to
    the field that passes the cap, no further: a request of a million empty batches is
    refused after the first ``limit + 1``."""
    others = 0  # the references, and the extra batches
    primary: tuple[int, int] | None = None  # the merged primary batch's hashes and ranges
    for field in top:
        if field.wire_type != LEN or field.number not in _ITEM_FIELDS:
            continue
        total = others + (max(1, *primary) if primary is not None else 0)
        if total > limit:
            return total
        if field.number == _MEDIA_REFS:
            others += _refs(buf, field, limit - total)
        elif field.number == _EXTRA_MM_INPUTS:
            others += max(1, *_named(buf, field, limit - total, limit - total))
        else:
            # Each count of the merged batch has its own budget: a stop is a count past the
            # cap, never a count cut short under it.
            hashes, ranges = primary if primary is not None else (0, 0)
            room = limit - others
            more = _named(buf, field, room - hashes, room - ranges)
            primary = (hashes + more[0], ranges + more[1])
    return others + (max(1, *primary) if primary is not None else 0)
