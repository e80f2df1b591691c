"""The protobuf wire format, as far as a reader that skips payloads needs it.

A message is a sequence of fields, each a tag (field number and wire type, as a
varint) and a value: a varint, 8 or 4 fixed bytes, a length-delimited run of
bytes, or a group up to its end tag. [`fields`][pd_policy_grpc.raw.protowire.fields]
walks them and reports where each one lies, so that a length-delimited payload
is skipped by its length and never read or copied.

The walk refuses exactly what the protobuf runtime refuses when it parses the
same bytes (a bad tag, a varint longer than ten bytes, a length past the end,
an unmatched group) with [`MalformedRequest`][pd_policy.errors.MalformedRequest].
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, NamedTuple

from pd_policy import MalformedRequest

__all__ = ["I32", "I64", "LEN", "VARINT", "Field", "fields", "length_prefix", "tag", "varint"]

VARINT: Final = 0
I64: Final = 1
LEN: Final = 2
_SGROUP: Final = 3
_EGROUP: Final = 4
I32: Final = 5
_MAX_FIELD: Final = (1 << 29) - 1
#: Groups nest no deeper than the runtime's own recursion limit.
_MAX_DEPTH: Final = 100


class Field(NamedTuple):
    """Where one field lies in a buffer."""

    number: int
    wire_type: int
    #: Where its tag starts.
    start: int
    #: Where its value starts: after the tag, and after the length of a length-delimited field.
    value: int
    #: One past its last byte.
    end: int


#: The one-byte varints, built once: most tags and short lengths.
_ONE_BYTE: Final = tuple(bytes((value,)) for value in range(0x80))


def _fail(what: str) -> MalformedRequest:
    return MalformedRequest(f"the bytes are not a GenerateRequest ({what})", param="request")


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` and where it ends."""
    if pos < end and buf[pos] < 0x80:
        return buf[pos], pos + 1  # most tags and lengths: one byte, read without a loop
    result = shift = 0
    for i in range(pos, min(pos + 10, end)):
        byte = buf[i]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, i + 1
        shift += 7
    raise _fail("a varint runs past its end" if end - pos < 10 else "a varint over ten bytes")


def _skip_group(buf: memoryview, pos: int, end: int, number: int, depth: int) -> int:
    """Where the group opened by field ``number`` ends (after its end tag)."""
    if depth > _MAX_DEPTH:
        raise _fail("groups nested too deep")
    while pos < end:
        key, pos = _varint(buf, pos, end)
        wire_type, inner = key & 7, key >> 3
        if wire_type == _EGROUP:
            if inner != number:
                raise _fail("a group ends with another field's tag")
            return pos
        pos = _skip(buf, pos, end, inner, wire_type, depth)
    raise _fail("a group runs past its end")


def _skip(buf: memoryview, pos: int, end: int, number: int, wire_type: int, depth: int) -> int:
    """Where the value at ``pos`` ends."""
    if number == 0 or number > _MAX_FIELD:
        raise _fail("a field number out of range")
    if wire_type == VARINT:
        return _varint(buf, pos, end)[1]
    if wire_type == LEN:
        size, pos = _varint(buf, pos, end)
        if size > end - pos:
            raise _fail("a length runs past its end")
        return pos + size
    if wire_type in (I64, I32):
        pos += 8 if wire_type == I64 else 4
        if pos > end:
            raise _fail("a fixed-size value runs past its end")
        return pos
    if wire_type == _SGROUP:
        return _skip_group(buf, pos, end, number, depth + 1)
    raise _fail("an unknown wire type" if wire_type != _EGROUP else "a group end without a start")


def fields(buf: memoryview, start: int = 0, end: int | None = None) -> Iterator[Field]:
    """Each field of the message in ``buf[start:end]``, in wire order, without reading any
    length-delimited payload. Raises ``MalformedRequest`` when the bytes are not a message."""
    end = len(buf) if end is None else end
    pos = start
    while pos < end:
        key, value = _varint(buf, pos, end)
        number, wire_type = key >> 3, key & 7
        if key > 0xFFFFFFFF:
            raise _fail("a tag over 32 bits")
        if wire_type == LEN and 0 < number <= _MAX_FIELD:
            # _skip's work for a length-delimited field, keeping where its value starts.
            size, value = _varint(buf, value, end)
            if size > end - value:
                raise _fail("a length runs past its end")
            after = value + size
        else:
            after = _skip(buf, value, end, number, wire_type, 0)
        yield Field(number, wire_type, pos, value, after)
        pos = after


def varint(value: int) -> bytes:
    """``value`` as a varint; a negative value as its 64-bit two's complement (ten bytes)."""
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    """The tag of field ``number`` with ``wire_type``."""
    return varint(number << 3 | wire_type)


def length_prefix(number: int, size: int) -> bytes:
    """The tag and length that start a length-delimited field of ``size`` bytes."""
    return tag(number, LEN) + varint(size)
