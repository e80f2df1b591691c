"""Token ids kept as the JSON array a worker sent: checked and forwarded as bytes.

A prefill's reply carries the expanded prompt, thousands of ids, and the decode leg
sends them on unchanged. Parsed, each id is a Python ``int`` made, checked and
written out again (about a fifth of the proxy's own CPU per request at 4096 ids);
kept as bytes, it is one pass over them. The check is exact: a syntactically valid
JSON value (``msgspec`` checked the syntax while reading the reply) that is ``[``,
then only digits, commas and whitespace, then ``]``, with a digit in it, is a
non-empty flat array of non-negative integers, and every such array is one. No
other spelling (``-1``, ``1.0``, ``true``, a nested array) passes. The array is
kept without its whitespace, so the decode leg is as compact as one written anew.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

__all__ = ["TokenIds", "token_ids_of"]

_WHITESPACE = b" \t\r\n"
_DIGITS_AND_COMMAS = b"0123456789,"


def _has_whitespace(raw: bytes) -> bool:
    return any(c in raw for c in (b" ", b"\n", b"\t", b"\r"))


class TokenIds(Sequence[int]):
    """A non-empty sequence of non-negative token ids, held as its JSON array.

    Equal to any sequence of the same ids (a tuple, a list, another ``TokenIds``).
    [`dumps`][pd_policy_vllm.openai.wire.codec.dumps] writes the array as it was read.
    """

    # Not an attrs class: msgspec would encode one as an object of its fields.
    __slots__ = ("json",)
    json: bytes

    def __init__(self, json_array: bytes) -> None:
        """``json_array``: a checked array (``read`` and ``of`` make one)."""
        object.__setattr__(self, "json", json_array)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("TokenIds is immutable")

    @classmethod
    def read(cls, raw: bytes) -> TokenIds | None:
        """``raw`` (one syntactically valid JSON value) as token ids, or ``None`` when it is
        not a non-empty array of non-negative integers."""
        # Whitespace never separates two digits in valid JSON: dropping it keeps every id
        # and sends the decode leg the compact array.
        # (vLLM writes compact JSON: the copy without whitespace is made only when needed.)
        compact = raw.translate(None, _WHITESPACE) if _has_whitespace(raw) else raw
        if len(compact) < 3 or compact[0] != ord("[") or compact[-1] != ord("]"):
            return None
        if compact[1:-1].translate(None, _DIGITS_AND_COMMAS):
            return None
        return cls(compact)

    @classmethod
    def of(cls, ids: Iterable[int]) -> TokenIds:
        """``ids`` as ``TokenIds`` (a ``TokenIds`` as it is). Raises ``ValueError`` for an
        empty sequence or an id that is not a non-negative ``int`` (``bool`` included)."""
        if isinstance(ids, TokenIds):
            return ids
        values = tuple(ids)
        if not values or any(type(v) is not int or v < 0 for v in values):
            raise ValueError("token ids are a non-empty sequence of non-negative integers")
        return cls(json.dumps(values, separators=(",", ":")).encode())

    def as_tuple(self) -> tuple[int, ...]:
        """The ids, parsed."""
        return tuple(json.loads(self.json))

    def __len__(self) -> int:
        # A flat array of integers: one more id than commas.
        return self.json.count(b",") + 1

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[int, ...]: ...
    def __getitem__(self, index: int | slice) -> int | tuple[int, ...]:
        return self.as_tuple()[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self.as_tuple())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenIds):
            return self.json == other.json or self.as_tuple() == other.as_tuple()
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return self.as_tuple() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.as_tuple())

    def __repr__(self) -> str:
        return f"TokenIds(<{len(self)} ids>)"


def token_ids_of(ids: Iterable[int]) -> TokenIds:
    """[`TokenIds.of`][pd_policy_vllm.openai.wire.token_ids.TokenIds.of] as a function (an
    attrs converter)."""
    return TokenIds.of(ids)
