"""The media items of a serialized ``GenerateRequest``, counted as the reader walks it.

The same number as [`count_media_items`][pd_policy_grpc.media_items.count_media_items]
counts on the parsed message, under the wire's merge rules: the occurrences of
``mm_inputs`` merge into one batch (their hashes and ranges add up), each occurrence of
``extra_mm_inputs`` is a batch of its own, and the occurrences of ``media_refs`` merge
(their items add up).

The count costs no walk of its own: a [`Tally`][pd_policy_grpc.raw.items.Tally] is kept
in the walks the reader makes anyway. Each top-level field counts as it is walked (a
batch as at least one item, a media reference's items one by one), then each batch's
content hashes and placeholder ranges in the walk that reads its flat keys. Each step
refuses the request once the count is past the cap, so that the walk stops there, before
anything is parsed: a request of a million items costs the reader a count to the cap.
"""

from __future__ import annotations

from typing import Final

from pd_policy.request_bounds import check_media_items
from pd_policy_grpc.wire import pb

from .protowire import LEN, Field, fields

__all__ = ["Tally"]

_REQUEST: Final = pb.GenerateRequest.DESCRIPTOR.fields_by_name
_MM_INPUTS: Final[int] = _REQUEST["mm_inputs"].number
_EXTRA_MM_INPUTS: Final[int] = _REQUEST["extra_mm_inputs"].number
_MEDIA_REFS: Final[int] = _REQUEST["media_refs"].number
_REF_ITEMS: Final[int] = pb.MediaRefs.DESCRIPTOR.fields_by_name["items"].number


class Tally:
    """The media items of one request as the reader finds them: exact up to ``limit``.

    Each step raises [`TooManyMediaItems`][pd_policy.client_errors.TooManyMediaItems]
    (400) once the count is past ``limit``; a budget says how far the next batch's walk
    may count before it is (a stop is a count past the cap, never one cut short under it).
    """

    __slots__ = ("_others", "_primary", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: The references' items and the extra batches (one each until counted).
        self._others = 0
        #: The merged primary batch's hashes and ranges so far, once it occurs.
        self._primary: tuple[int, int] | None = None

    @property
    def total(self) -> int:
        """The items counted so far (each batch not yet walked as one)."""
        primary = self._primary
        return self._others + (max(1, *primary) if primary is not None else 0)

    def top(self, buf: memoryview, field: Field) -> None:
        """Count a top-level ``field`` of the message in ``buf`` as it is walked."""
        if field.wire_type != LEN:
            return  # another wire type is an unknown field to the runtime, not an item
        number = field.number
        if number == _EXTRA_MM_INPUTS:
            self._others += 1
        elif number == _MM_INPUTS:
            if self._primary is None:
                self._primary = (0, 0)
        elif number == _MEDIA_REFS:
            budget = self.limit - self.total
            for inner in fields(buf, field.value, field.end):
                if inner.number == _REF_ITEMS and inner.wire_type == LEN:
                    self._others += 1
                    budget -= 1
                    if budget < 0:
                        break
        else:
            return
        check_media_items(self.total, self.limit)

    def primary_budgets(self) -> tuple[int, int]:
        """How many more hashes, and ranges, the primary batch may name."""
        hashes, ranges = self._primary or (0, 0)
        room = self.limit - self._others
        return room - hashes, room - ranges

    def primary(self, hashes: int, ranges: int) -> None:
        """Add what one occurrence of the primary batch names."""
        before = self._primary or (0, 0)
        self._primary = (before[0] + hashes, before[1] + ranges)
        check_media_items(self.total, self.limit)

    def extra_budget(self) -> int:
        """How many hashes, or ranges, the next extra batch may name."""
        return self.limit - self.total + 1  # its one item already counted

    def extra(self, hashes: int, ranges: int) -> None:
        """Count an extra batch whole: as many items as it names, at least one."""
        self._others += max(1, hashes, ranges) - 1
        check_media_items(self.total, self.limit)
