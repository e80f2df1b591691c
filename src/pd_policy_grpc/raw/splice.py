"""A leg as the request's own top-level fields, some dropped, some added: a splice.

Every field the leg keeps is a view of the ingress bytes; the fields the leg
changes are small new buffers, appended. Appending is exact under the wire
format's rules: a scalar's last occurrence wins, and a submessage's occurrences
merge. Fields this version of the proto does not know stay in place.
``bytes(leg)`` joins the buffers: the leg's only copy of its payload.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, NamedTuple

import attrs
from google.protobuf.message import Message

from pd_policy_grpc.view import has_kv_transfer_params, kv_handoff_facts
from pd_policy_grpc.wire import pb

from .protowire import LEN, Field, length_prefix

__all__ = ["Entry", "RawLeg", "message_entry"]

_REQUEST: Final = pb.GenerateRequest.DESCRIPTOR.fields_by_name
_KV_FIELDS: Final = frozenset(
    {_REQUEST["kv_transfer_params"].number, _REQUEST["kv_transfer_params_json"].number}
)


class Entry(NamedTuple):
    """One top-level field of a leg: its number, wire type, and the buffers it is."""

    number: int
    wire_type: int
    parts: tuple[bytes | memoryview, ...]

    @property
    def nbytes(self) -> int:
        """Its size on the wire."""
        return sum(len(p) for p in self.parts)


@attrs.frozen(slots=True)
class RawLeg:
    """A leg ready to send: ``bytes(leg)`` is the serialized ``GenerateRequest``."""

    entries: tuple[Entry, ...] = attrs.field(repr=False)
    #: The leg's ``sampling_params.n`` (0 means one sample).
    n: int

    @classmethod
    def of(cls, buf: memoryview, fields: tuple[Field, ...], n: int) -> RawLeg:
        """The leg that is the message in ``buf`` unchanged."""
        entries = tuple(Entry(f.number, f.wire_type, (buf[f.start : f.end],)) for f in fields)
        return cls(entries, n)

    def without(self, *keys: tuple[int, int]) -> RawLeg:
        """The leg without any occurrence of the fields ``(number, wire_type)``."""
        drop = set(keys)
        return attrs.evolve(
            self, entries=tuple(e for e in self.entries if (e.number, e.wire_type) not in drop)
        )

    def plus(self, *entries: Entry) -> RawLeg:
        """The leg with ``entries`` appended."""
        return attrs.evolve(self, entries=self.entries + entries)

    def replaced(self, number: int, wire_type: int, encoded: bytes) -> RawLeg:
        """The leg with field ``number`` set to ``encoded`` (its tag included) alone."""
        return self.without((number, wire_type)).plus(Entry(number, wire_type, (encoded,)))

    def buffers(self) -> Iterator[bytes | memoryview]:
        """The leg's buffers, in order."""
        for entry in self.entries:
            yield from entry.parts

    @property
    def nbytes(self) -> int:
        """The leg's size on the wire."""
        return sum(e.nbytes for e in self.entries)

    def __bytes__(self) -> bytes:
        return b"".join(self.buffers())

    def kv_handoff_facts(self) -> tuple[str | None, tuple[str, int] | None]:
        """The leg's KV handoff, as
        [`kv_handoff_facts`][pd_policy_grpc.view.kv_handoff_facts] reads it."""
        kv = b"".join(p for e in self.entries if e.number in _KV_FIELDS for p in e.parts)
        return kv_handoff_facts(pb.GenerateRequest.FromString(kv))

    def has_kv_transfer_params(self) -> bool:
        """Whether the leg carries either KV form, as
        [`has_kv_transfer_params`][pd_policy_grpc.view.has_kv_transfer_params] reads it."""
        # Only those two fields are parsed: a few bytes, with the runtime's own rules.
        kv = b"".join(p for e in self.entries if e.number in _KV_FIELDS for p in e.parts)
        return has_kv_transfer_params(pb.GenerateRequest.FromString(kv))


def message_entry(number: int, message: Message) -> Entry:
    """A length-delimited field holding ``message``."""
    body = message.SerializeToString()
    return Entry(number, LEN, (length_prefix(number, len(body)) + body,))
