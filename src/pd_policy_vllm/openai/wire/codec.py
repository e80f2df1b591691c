"""JSON for the HTTP adapter: bodies in and out, the canonical form media identities
hash, and the check on a list of token ids.

A P/D proxy's own cost is mostly JSON: an image request's body is a data URL of
hundreds of KiB, and the decode leg carries thousands of ids. ``msgspec`` (a
vLLM dependency, installed with the ``http`` extra) encodes these five to ten
times faster than the standard library, and checks a list of ids in C. Without
``msgspec`` every function here falls back to the standard library, with the
same results: the shaping modules stay usable from any proxy.

Where the two libraries differ, the standard library's answer is the contract:

- [`canonical`][pd_policy_vllm.openai.wire.codec.canonical] is ``json.dumps(value, sort_keys=True,
  separators=(",", ":"),
  ensure_ascii=False)`` in UTF-8 (``surrogatepass``), byte for byte. ``msgspec``
  writes floats differently (``1e+16`` against ``1e16``), so it is used only for
  values without floats, where its output is the same (a property test holds
  it to that).
- [`loads`][pd_policy_vllm.openai.wire.codec.loads] refuses what is not strict JSON (``NaN``,
  numbers out of range, lone surrogates, an object that names a key twice, nesting past
  [`MAX_DEPTH`][pd_policy_vllm.openai.wire.strict.MAX_DEPTH]) with
  [`MalformedRequest`][pd_policy.errors.MalformedRequest], on both paths
  ([`strict`][pd_policy_vllm.openai.wire.strict] says how, and what it costs).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from typing import Annotated, Any

from pd_policy import MalformedRequest
from pd_policy_vllm.openai.wire.data_url import DataUrl
from pd_policy_vllm.openai.wire.strict import (
    MAX_DEPTH,
    KeyTwice,
    TooDeep,
    checked,
    count,
    shape,
    too_deep,
    twice_param,
    unique,
)
from pd_policy_vllm.openai.wire.token_ids import TokenIds

__all__ = [
    "Canonical",
    "ReplyFields",
    "canonical",
    "dumps",
    "loads",
    "reply_fields",
    "sha256_identity",
    "token_ids",
]

try:
    import msgspec
except ImportError:  # pragma: no cover - exercised by forcing the fallback in tests
    msgspec = None  # type: ignore[assignment]

#: Set to ``False`` (tests do) to use the standard library even where msgspec is installed.
USE_MSGSPEC = msgspec is not None


class Canonical:
    """A JSON value of a client's body held as its
    [canonical][pd_policy_vllm.openai.wire.codec.canonical] JSON, with the hex SHA-256 of
    those bytes (its [`sha256_identity`][pd_policy_vllm.openai.wire.codec.sha256_identity]): a large
    inline media item (``input_audio``, embeddings), encoded and hashed once, in a worker
    thread, and written to every leg as those bytes. Immutable: the digest is of bytes
    that cannot change."""

    __slots__ = ("digest", "json")
    json: bytes
    digest: str

    def __init__(self, value: Any) -> None:
        self.json = canonical(value)
        self.digest = hashlib.sha256(self.json).hexdigest()

    def __repr__(self) -> str:
        return f"Canonical({len(self.json)} bytes)"


def _encode_hook(value: Any) -> Any:
    # Each is written as the worker or the client wrote it (a Canonical: the same value).
    if isinstance(value, TokenIds | DataUrl | Canonical):
        return msgspec.Raw(value.json)
    raise NotImplementedError(f"{type(value).__name__} is not JSON")


def _default(value: Any) -> Any:
    if isinstance(value, TokenIds):
        return list(value)
    if isinstance(value, DataUrl):
        return str(value)
    if isinstance(value, Canonical):
        return json.loads(value.json)
    raise TypeError(f"{type(value).__name__} is not JSON")


if msgspec is not None:
    _ENCODER = msgspec.json.Encoder(enc_hook=_encode_hook)
    _SORTED = msgspec.json.Encoder(enc_hook=_encode_hook, order="sorted")
    _DECODER = msgspec.json.Decoder()
    _TokenIds = list[Annotated[int, msgspec.Meta(ge=0)]]

    class _Reply(msgspec.Struct):
        # What the decode leg needs of a prefill's reply; the ids stay bytes.
        prompt_token_ids: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
        kv_transfer_params: Any = None
        usage: Any = None

    class _Choice(msgspec.Struct):
        prompt_token_ids: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)

    class _CompletionReply(msgspec.Struct):
        choices: tuple[_Choice, ...] = ()
        kv_transfer_params: Any = None
        usage: Any = None

    _REPLY = msgspec.json.Decoder(_Reply)
    _COMPLETION_REPLY = msgspec.json.Decoder(_CompletionReply)


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _strict_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError("a number out of a double's range")  # not the client's digits
    return value


_STRICT: Callable[[str], Any] = json.JSONDecoder(
    object_pairs_hook=unique, parse_constant=_constant, parse_float=_strict_float
).decode


def loads(raw: bytes | bytearray | str, *, what: str = "the body") -> Any:
    """Parse strict JSON. Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] (400)
    naming ``what`` for anything else: ``param`` names where an object names a key twice
    (``messages[0].cache_salt``; ``body`` when it cannot), else it is ``body``."""
    data = raw if isinstance(raw, bytes) else _as_bytes(raw)
    try:
        # Parsed first: a parser stops where the stack does (RecursionError), and the depth
        # is checked on the value before any other walk of it.
        if USE_MSGSPEC:
            value = _DECODER.decode(data)
            once = checked(data, value, _ENCODER.encode)
            if once is None:
                _STRICT(data.decode("utf-8"))  # the exact check: raises KeyTwice
            elif not once:
                raise KeyTwice()
            return value
        value = _STRICT(data.decode("utf-8"))
        _shallow(shape(data)[0], value, what)
        _no_lone_surrogates(value)
        return value
    except KeyTwice:
        where = twice_param(data)
        raise MalformedRequest(f"{what} names a key twice in one object", param=where) from None
    except TooDeep:
        raise MalformedRequest(_deeper(what), param="body") from None
    except RecursionError:
        raise MalformedRequest(_deeper(what), param="body") from None
    except UnicodeError:
        # Not the error's own text: it quotes the character.
        raise MalformedRequest(
            f"{what} is not JSON: not UTF-8, or a lone surrogate", "body"
        ) from None
    except ValueError as exc:  # msgspec.DecodeError is a ValueError
        raise MalformedRequest(f"{what} is not JSON: {exc}", param="body") from None


def _as_bytes(raw: bytearray | str) -> bytes:
    return raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)


def _deeper(what: str) -> str:
    return f"{what} nests arrays and objects deeper than {MAX_DEPTH} levels"


def _shallow(opened: int, value: Any, what: str) -> None:
    if too_deep(opened, value):
        raise MalformedRequest(_deeper(what), param="body")


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
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=_default).encode()


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
    text = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_default
    )
    return text.encode("utf-8", "surrogatepass")


def sha256_identity(value: Any) -> str:
    """The hex SHA-256 of [`canonical`][pd_policy_vllm.openai.wire.codec.canonical] (``value``);
    a [`Canonical`][pd_policy_vllm.openai.wire.codec.Canonical]'s own, computed once."""
    if isinstance(value, Canonical):
        return value.digest
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


#: A prefill reply's ids (``None`` when absent or not token ids), KV parameters and usage.
ReplyFields = tuple[TokenIds | None, Any, Any]


def reply_fields(raw: bytes, *, in_choice: bool, what: str) -> ReplyFields | None:
    """The fields of a worker's reply ``raw`` that a decode leg needs, its ids left as the
    bytes they came in, with the ids at the top level or (``in_choice``) in the first
    choice. ``None`` when the reply is JSON of another shape, or msgspec is not
    installed: read it parsed then. Raises
    [`MalformedRequest`][pd_policy.errors.MalformedRequest] naming ``what`` when it is not
    JSON, or nests deeper than [`MAX_DEPTH`][pd_policy_vllm.openai.wire.strict.MAX_DEPTH],
    as [`loads`][pd_policy_vllm.openai.wire.codec.loads] does."""
    if not USE_MSGSPEC:
        return None
    reply: _Reply | _CompletionReply
    try:
        if in_choice:
            reply = _COMPLETION_REPLY.decode(raw)
            found = reply.choices[0].prompt_token_ids if reply.choices else None
        else:
            reply = _REPLY.decode(raw)
            found = reply.prompt_token_ids
    except msgspec.ValidationError:
        return None
    except (msgspec.DecodeError, UnicodeError) as exc:
        raise MalformedRequest(f"{what} is not JSON: {exc}", param="body") from None
    except TooDeep:
        raise MalformedRequest(_deeper(what), param="body") from None
    except RecursionError:
        raise MalformedRequest(_deeper(what), param="body") from None
    # Any: a hostile worker's could nest as deep as the parser follows, and every later
    # walk of it (the decode leg written) would fail. A reply opening no more arrays and
    # objects than the limit cannot (nearly every one): walked only when it opens more.
    opened = count(raw, b"[") + count(raw, b"{")
    if too_deep(opened, reply.kv_transfer_params) or too_deep(opened, reply.usage):
        raise MalformedRequest(_deeper(what), param="body")
    data = bytes(found) if found is not None else b""
    return (TokenIds.read(data) if data else None), reply.kv_transfer_params, reply.usage
