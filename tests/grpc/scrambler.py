"""Serialize a message the many ways the wire format allows, all parsing to the same message.

A canonical serialization writes each field once, in field-number order. A
sender may instead write fields in any order, split a singular submessage into
occurrences that merge, write a scalar twice (the last wins), write a packed
repeated scalar unpacked or in several runs, and add fields the reader does not
know. [`scramble`][] does all of that, drawing its choices from a ``Random``, so
a reader that assumes the canonical form breaks on its output. Its varints include
negative ones, which are ten bytes long on the wire.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any, Final

from google.protobuf.descriptor import FieldDescriptor

from pd_policy_grpc.raw.protowire import I32, I64, LEN, VARINT, Field, fields, tag, varint

#: Field numbers no version of these messages uses: added as unknown fields.
UNKNOWN_NUMBERS: Final = range(900, 905)
_VARINT_TYPES: Final = frozenset(
    {
        FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_ENUM, FieldDescriptor.TYPE_BOOL,
    }
)  # fmt: skip


def _record(number: int, wire_type: int, value: bytes) -> bytes:
    if wire_type == LEN:
        return tag(number, LEN) + varint(len(value)) + value
    return tag(number, wire_type) + value


def _varints(buf: memoryview) -> list[int]:
    out, value, shift = [], 0, 0
    for byte in buf:
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            out.append(value)
            value = shift = 0
    return out


def _unknown(rng: random.Random) -> bytes:
    number = rng.choice(UNKNOWN_NUMBERS)
    wire_type = rng.choice([VARINT, LEN, I32, I64])
    value = {
        VARINT: varint(rng.choice([rng.randrange(1 << 20), -rng.randrange(1, 1 << 31)])),
        LEN: bytes(rng.randrange(256) for _ in range(rng.randrange(6))),
        I32: bytes(4),
        I64: bytes(8),
    }[wire_type]
    return _record(number, wire_type, value)


def _decoy(wire_type: int, rng: random.Random) -> bytes:
    # A varint decoy is as often a negative one, ten bytes long (a later value wins).
    number = rng.choice([7, -1])
    return {VARINT: varint(number), LEN: b"decoy", I32: b"\x01\x00\x00\x00",
            I64: bytes(8)}[wire_type]  # fmt: skip


def scramble(descriptor: Any, data: bytes, rng: random.Random, *, unknown: bool = True) -> bytes:
    """``data``, a serialized message of ``descriptor``, written another valid way."""
    buf = memoryview(data)
    by_number: dict[int, list[bytes]] = defaultdict(list)
    for field in fields(buf):
        by_number[field.number].extend(_rewrite(descriptor, buf, field, rng, unknown))
    if unknown and rng.random() < 0.3:
        by_number[rng.choice(UNKNOWN_NUMBERS)].append(_unknown(rng))
    # A random interleaving that keeps each field's own occurrences in order: their
    # order is their meaning (the last scalar wins, repeated elements are a list).
    queues = [list(records) for records in by_number.values()]
    out = []
    while queues:
        queue = rng.choice(queues)
        out.append(queue.pop(0))
        if not queue:
            queues.remove(queue)
    return b"".join(out)


def _rewrite(
    descriptor: Any, buf: memoryview, field: Field, rng: random.Random, unknown: bool
) -> list[bytes]:
    """The records that stand for ``field``, in order."""
    whole = bytes(buf[field.start : field.end])
    known = descriptor.fields_by_number.get(field.number)
    if known is None:
        return [whole]
    value = bytes(buf[field.value : field.end])
    if known.type == FieldDescriptor.TYPE_MESSAGE and field.wire_type == LEN:
        # No unknown field in a map entry: the runtime keeps such an entry whole as an
        # unknown field of the map's message, not as an entry.
        entry = known.message_type.GetOptions().map_entry
        inner = scramble(known.message_type, value, rng, unknown=unknown and not entry)
        if known.is_repeated or not inner or rng.random() < 0.5:
            return [_record(field.number, LEN, inner)]
        # A singular submessage split in two occurrences, which merge back.
        parts = list(fields(memoryview(inner)))
        cut = rng.randrange(len(parts) + 1)
        head = b"".join(inner[p.start : p.end] for p in parts[:cut])
        tail = b"".join(inner[p.start : p.end] for p in parts[cut:])
        return [_record(field.number, LEN, head), _record(field.number, LEN, tail)]
    if known.is_repeated and field.wire_type == LEN and known.type in _VARINT_TYPES:
        values = _varints(buf[field.value : field.end])
        if rng.random() < 0.5:  # unpacked: one record per value
            return [_record(field.number, VARINT, varint(v)) for v in values]
        cut = rng.randrange(len(values) + 1)  # two packed runs
        runs = [values[:cut], values[cut:]]
        return [_record(field.number, LEN, b"".join(map(varint, run))) for run in runs if run]
    if not known.is_repeated and rng.random() < 0.3:
        return [_record(field.number, field.wire_type, _decoy(field.wire_type, rng)), whole]
    return [whole]
