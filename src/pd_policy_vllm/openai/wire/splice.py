"""Rewriting top-level members of a JSON object's bytes, leaving every other byte as sent.

A prefill leg is the client's body with a few top-level members set or dropped
(``stream``, the output cap, the handoff's tag). Parsed and written again, the body's
media (a base64 image is most of it) is decoded into a Python string and encoded
back, each a pass over it and a copy. Spliced, the leg is the client's bytes with
only those members' values replaced: one copy, and no byte of the media read.

The splice is exact for a body that is strict JSON (the proxy parsed it first, and
refuses a key written twice): a member's value is the span from after its colon to
the comma or brace that ends it, found by skipping strings (to the next quote that
no odd run of backslashes escapes) and counting brackets outside them. A body that
is not an object of that shape gets ``None``: build the leg by parsing then.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Set
from typing import Any, Final

import attrs

from pd_policy_vllm.openai.wire.codec import dumps
from pd_policy_vllm.openai.wire.data_url import DataUrl

__all__ = ["Member", "Spliced", "escaped", "members", "splice", "splice_parts", "written"]

_WHITESPACE: Final = b" \t\r\n"
#: Inside an array or object: the next byte that opens or closes one, or a string.
_STRUCTURE: Final = re.compile(rb'["{}\[\]]')
#: A scalar (number, true, false, null) runs to the next delimiter.
_SCALAR_END: Final = re.compile(rb"[,}\]\s]")

#: One top-level member: its key, where its key starts, where its value starts and ends.
Member = tuple[str, int, int, int]


def _skip(raw: bytes | bytearray, at: int) -> int:
    while at < len(raw) and raw[at] in _WHITESPACE:
        at += 1
    return at


def escaped(raw: bytes | bytearray, quote: int) -> bool:
    """Whether the quote at ``quote`` is escaped: an odd run of backslashes before it."""
    slashes = 0
    while quote - 1 - slashes >= 0 and raw[quote - 1 - slashes] == 0x5C:  # backslash
        slashes += 1
    return slashes % 2 == 1


def _string_end(raw: bytes | bytearray, at: int) -> int:
    """One past the string whose opening quote is at ``at``."""
    at += 1
    while True:
        quote = raw.find(b'"', at)
        if quote < 0:
            raise ValueError("unterminated string")
        if not escaped(raw, quote):
            return quote + 1
        at = quote + 1


def _value_end(raw: bytes | bytearray, at: int) -> int:
    """One past the value starting at ``at``."""
    first = raw[at]
    if first == 0x22:  # "
        return _string_end(raw, at)
    if first not in b"{[":
        found = _SCALAR_END.search(raw, at)
        return found.start() if found is not None else len(raw)
    depth, at = 1, at + 1
    while depth:
        found = _STRUCTURE.search(raw, at)
        if found is None:
            raise ValueError("unterminated array or object")
        byte = raw[found.start()]
        if byte == 0x22:
            at = _string_end(raw, found.start())
            continue
        depth += 1 if byte in b"{[" else -1
        at = found.start() + 1
    return at


def members(raw: bytes | bytearray) -> list[Member] | None:
    """The top-level members of the JSON object ``raw``, in order; ``None`` when ``raw``
    is not one (or not JSON)."""
    try:
        at = _skip(raw, 0)
        if at >= len(raw) or raw[at] != 0x7B:  # {
            return None
        out: list[Member] = []
        at = _skip(raw, at + 1)
        if at < len(raw) and raw[at] == 0x7D and _skip(raw, at + 1) == len(raw):
            return out
        while True:
            if raw[at] != 0x22:
                return None
            key_end = _string_end(raw, at)
            text = raw[at + 1 : key_end - 1]
            # A key without escapes is its own UTF-8 (the parse checked it is valid).
            key = json.loads(raw[at:key_end]) if 0x5C in text else text.decode()
            colon = _skip(raw, key_end)
            if raw[colon] != 0x3A:  # :
                return None
            start = _skip(raw, colon + 1)
            end = _value_end(raw, start)
            out.append((key, at, start, end))
            after = _skip(raw, end)
            if raw[after] == 0x7D:  # }
                return out if _skip(raw, after + 1) == len(raw) else None
            if raw[after] != 0x2C:  # ,
                return None
            at = _skip(raw, after + 1)
    except (IndexError, ValueError):
        return None


@attrs.frozen(slots=True)
class Spliced:
    """A spliced body as its parts, in order: the client's bytes (views of them) between
    the members written anew. ``bytes(spliced)`` joins them; a sender that writes the
    parts one after another sends the same bytes without that copy (for a body with a
    5 MB image, one pass over it and 5 MB of fresh memory fewer)."""

    parts: tuple[bytes | memoryview, ...]

    @property
    def size(self) -> int:
        """The body's length in bytes."""
        return sum(len(part) for part in self.parts)

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)

    def chunks(self, small: int = 65536) -> list[bytes | memoryview]:
        """The parts with each run of parts under ``small`` bytes joined into one: what a
        sender writes, one write a chunk, so that the members' punctuation is not a
        write of its own."""
        out: list[bytes | memoryview] = []
        run: list[bytes | memoryview] = []
        for part in self.parts:
            if len(part) < small:
                run.append(part)
                continue
            if run:
                out.append(b"".join(run))
                run = []
            out.append(part)
        if run:
            out.append(b"".join(run))
        return out


def splice_parts(
    raw: bytes | bytearray,
    found: list[Member],
    changes: Mapping[str, Any],
    drop: Set[str] = frozenset(),
) -> Spliced:
    """``raw`` (the object whose ``members`` are ``found``) with each member named in
    ``changes`` given its new value (written with
    [`dumps`][pd_policy_vllm.openai.wire.codec.dumps]),
    those in ``drop`` left out, and the changes to absent members appended in order:
    the members a dict of ``raw`` would have after the same assignments and pops, as
    [`Spliced`][pd_policy_vllm.openai.wire.splice.Spliced] parts."""
    view = memoryview(raw)
    present = {key for key, *_ in found}
    parts: list[bytes | memoryview] = [b"{"]
    for key, key_start, start, end in found:
        if key in drop:
            continue
        if key in changes:
            parts.append(view[key_start:start])
            parts.append(dumps(changes[key]))
        else:
            parts.append(view[key_start:end])
        parts.append(b",")
    for key, value in changes.items():
        if key not in present:
            parts += [dumps(key), b":", dumps(value), b","]
    if len(parts) > 1:
        parts.pop()
    parts.append(b"}")
    return Spliced(tuple(parts))


def splice(
    raw: bytes | bytearray,
    found: list[Member],
    changes: Mapping[str, Any],
    drop: Set[str] = frozenset(),
) -> bytes:
    """[`splice_parts`][pd_policy_vllm.openai.wire.splice.splice_parts], joined."""
    return bytes(splice_parts(raw, found, changes, drop))


#: A data URL this long or longer is written as a part of its own.
WRITTEN_APART: Final = 2**16
_TOKEN: Final = secrets.token_hex(16)
_URL_KEYS: Final = ("image_url", "audio_url", "video_url")


def _marked(body: Any, urls: list[DataUrl], least: int) -> Any:
    # The body with each long DataUrl of its messages' media parts a marker (new
    # containers where one was put; the body is not changed).
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return body
    out = list(messages)
    for m, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for p, part in enumerate(content):
            for key in _URL_KEYS if isinstance(part, dict) else ():
                value = part.get(key)
                url = value.get("url") if isinstance(value, dict) else value
                if not isinstance(url, DataUrl) or len(url) < least:
                    continue
                marker = f"{_TOKEN}:{len(urls)}"
                urls.append(url)
                if out[m] is message:
                    out[m] = {**message, "content": list(content)}
                parts = out[m]["content"]
                held = {**value, "url": marker} if isinstance(value, dict) else marker
                parts[p] = {**parts[p], key: held}
    return {**body, "messages": out} if urls else body


def written(body: Any, least: int = WRITTEN_APART) -> bytes | Spliced:
    """``dumps(body)``; for a chat body whose media parts hold data URLs of ``least``
    bytes or more (remote items the proxy fetched, a client's large images), the same
    bytes as [`Spliced`][pd_policy_vllm.openai.wire.splice.Spliced] parts, each of those
    URLs a view of its own bytes: written around them, not copied into one more buffer
    of their size, on the event loop."""
    urls: list[DataUrl] = []
    skeleton = _marked(body, urls, least)
    if not urls:
        return dumps(body)
    out = dumps(skeleton)
    found = sorted((out.index(f'"{_TOKEN}:{i}"'.encode()), i) for i in range(len(urls)))
    view = memoryview(out)
    parts: list[bytes | memoryview] = []
    at = 0
    for where, i in found:
        parts += [view[at:where], urls[i].json]
        at = where + len(_TOKEN) + len(str(i)) + 3  # the marker, its colon and quotes
    parts.append(view[at:])
    return Spliced(tuple(parts))
