"""JSON for the HTTP adapter: bodies in and out, the canonical form media identities
hash, and the check on a list of token ids.

A P/D proxy's own cost is mostly JSON: an image request's body is a data URL of
hundreds of KiB, and the decode leg carries thousands of ids. ``msgspec`` (a
vLLM dependency, installed with the ``http`` extra) encodes these five to ten
times faster than the standard library, and checks a list of ids in C. Without
``msgspec`` every function here falls back to the standard library, with the
same results: the shaping modules stay usable from any proxy.

Where the two libraries differ, the standard library's answer is the contract:

- [`canonical`][pd_policy_vllm.http.codec.canonical] is ``json.dumps(value, sort_keys=True,
  separators=(",", ":"),
  ensure_ascii=False)`` in UTF-8 (``surrogatepass``), byte for byte. ``msgspec``
  writes floats differently (``1e+16`` against ``1e16``), so it is used only for
  values without floats, where its output is the same (a property test holds
  it to that).
- [`loads`][pd_policy_vllm.http.codec.loads] refuses what is not strict JSON (``NaN``, numbers out
  of range,
  lone surrogates) with [`MalformedRequest`][pd_policy.errors.MalformedRequest], on both paths.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from typing import Annotated, Any

from pd_policy import MalformedRequest

__all__ = ["canonical", "dumps", "loads", "sha256_identity", "token_ids"]

try:
    import msgspec
except ImportError:  # pragma: no cover - exercised by forcing the fallback in tests
    msgspec = None  # type: ignore[assignment]

#: Set to ``False`` (tests do) to use the standard library even where msgspec is installed.
USE_MSGSPEC = msgspec is not None

if msgspec is not None:
    _ENCODER = msgspec.json.Encoder()
    _SORTED = msgspec.json.Encoder(order="sorted")
    _DECODER = msgspec.json.Decoder()
    _TokenIds = list[Annotated[int, msgspec.Meta(ge=0)]]


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _strict_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} is out of a double's range")
    return value


_STRICT: Callable[[str], Any] = json.JSONDecoder(
    parse_constant=_constant, parse_float=_strict_float
).decode


def loads(raw: bytes | str, *, what: str = "the body") -> Any:
    """Parse strict JSON. Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] (400,
    ``param``
    ``body``) naming ``what`` for anything else."""
    try:
        if USE_MSGSPEC:
            return _DECODER.decode(raw)
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        value = _STRICT(text)
        _no_lone_surrogates(value)
        return value
    except (ValueError, UnicodeError) as exc:  # msgspec.DecodeError is a ValueError
        raise MalformedRequest(f"{what} is not JSON: {exc}", param="body") from None


def _no_lone_surrogates(value: Any) -> None:
    # msgspec refuses "\ud800"; the standard library returns it. One answer for both.
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            item.encode("utf-8")
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def dumps(body: Any) -> bytes:
    """Compact JSON in UTF-8 (a decode leg is mostly ids, and ``", "`` would add a byte to
    each)."""
    if USE_MSGSPEC:
        return _ENCODER.encode(body)
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def _float_free(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            return False
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return True


def canonical(value: Any) -> bytes:
    """The canonical JSON of ``value``: sorted keys, no whitespace, non-ASCII as UTF-8
    (see the module docs)."""
    if USE_MSGSPEC and _float_free(value):
        try:
            return _SORTED.encode(value)
        except (TypeError, UnicodeError, ValueError):
            pass  # e.g. a lone surrogate from a body parsed elsewhere: the stdlib's bytes
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "surrogatepass")


def sha256_identity(value: Any) -> str:
    """The hex SHA-256 of [`canonical`][pd_policy_vllm.http.codec.canonical] (``value``)."""
    return hashlib.sha256(canonical(value)).hexdigest()


def token_ids(value: Any) -> tuple[int, ...] | None:
    """``value`` as token ids, when it is a non-empty list of non-negative integers
    (JSON's ``true`` and ``false`` are not integers here); else ``None``."""
    if not isinstance(value, list) or not value:
        return None
    if USE_MSGSPEC:
        try:
            return tuple(msgspec.convert(value, _TokenIds))
        except msgspec.ValidationError:
            return None
    # type() rather than isinstance: bools are ints.
    if set(map(type, value)) != {int} or min(value) < 0:
        return None
    return tuple(value)
