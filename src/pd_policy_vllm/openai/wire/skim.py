"""Parsing a chat body with its long data URLs left in the client's bytes.

[`skim`][pd_policy_vllm.openai.wire.skim.skim] parses a body as
[`loads`][pd_policy_vllm.openai.wire.codec.loads] does, except that each long data URL in a
message's media part comes back as a [`DataUrl`][pd_policy_vllm.openai.wire.data_url.DataUrl]
(a span of the body) instead of a ``str``: the JSON parser never reads its megabytes,
and nothing decodes them into a string that the identity's hash would encode again.

How: each long string of the body that starts ``data:``, is ASCII and holds no
backslash is cut out of a copy of the body's structure, and a marker string written in
its place; that small body is parsed, and each marker put back as the span. An
unescaped quote that ``data:`` follows opens a string (in JSON a closing quote is
followed by punctuation or whitespace), and the string runs to the next quote, since it
holds no backslash. So a body and its small copy are the same JSON but for those
strings' contents, and the copy parses where the body does (and, but for what the cut
does not check, below, only there). A marker holds a token drawn once per
process, so that no client can write one. When a marker is anywhere but a media part's
URL (a long ``data:`` text, a field of another API), the body is parsed whole instead:
the caller always gets the body ``loads`` would give, up to the spans.

What the cut does not check is that the URL holds no control character (JSON allows
none unescaped in a string; checking for one costs as much as parsing). Such a body
is refused by the first worker that parses it, which receives the client's bytes of
the URL unchanged: an error, never an answer.
"""

from __future__ import annotations

import secrets
from typing import Any, Final

from pd_policy_vllm.openai.wire.codec import loads
from pd_policy_vllm.openai.wire.data_url import DataUrl
from pd_policy_vllm.openai.wire.splice import escaped

__all__ = ["SKIM_LEAST", "skim"]

#: The shortest data URL (in bytes) left in the body: below it, parsing costs less than
#: finding it.
SKIM_LEAST: Final = 4096
#: The most ``"data:`` strings looked at: each is a step in Python, and a body of more
#: (200 000 tiny images in 12 MiB) is parsed whole instead, as any body without one is.
SKIM_MOST: Final = 1024
_OPENING: Final = b'"data:'
_TOKEN: Final = secrets.token_hex(16)
#: The keys of a media part whose value is a URL, or an object whose ``url`` is one.
_URL_KEYS: Final = ("image_url", "audio_url", "video_url")


def _marker(index: int) -> str:
    return f"{_TOKEN}:{index}"


def _spans(raw: bytes, least: int, most: int) -> list[tuple[int, int]]:
    # (start, end) of each long data URL's text: the bytes between its quotes; none when
    # there are more than ``most`` strings to look at.
    spans = []
    looked = 0
    at = raw.find(_OPENING)
    # A client's body is most often all ASCII (JSON encoders escape the rest by default):
    # one pass over it then, not a copy of each URL to check.
    ascii_body = at >= 0 and raw.isascii()
    while at >= 0:
        looked += 1
        if looked > most:
            return []
        end = raw.find(b'"', at + 1)
        if end < 0:
            break  # unterminated: the parse will say so
        if (
            end - at - 1 >= least
            and not escaped(raw, at)
            and raw.find(b"\\", at, end) < 0
            and (ascii_body or raw[at + 1 : end].isascii())
        ):
            spans.append((at + 1, end))
            at = raw.find(_OPENING, end + 1)
        else:
            at = raw.find(_OPENING, at + 1)
    return spans


def _place(body: Any, urls: dict[str, DataUrl]) -> int:
    # Put each marker back where a media part's URL is; how many were put back.
    placed = 0
    messages = body.get("messages") if isinstance(body, dict) else None
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else ():
            if not isinstance(part, dict):
                continue
            for key in _URL_KEYS:
                value = part.get(key)
                holder, field = (value, "url") if isinstance(value, dict) else (part, key)
                url = holder.get(field)
                if isinstance(url, str) and url in urls:
                    holder[field] = urls.pop(url)
                    placed += 1
    return placed


def skim(raw: bytes, *, least: int = SKIM_LEAST, most: int = SKIM_MOST) -> Any:
    """``loads(raw)``, with each data URL of ``least`` bytes or more that is a chat
    message's media part's URL left in ``raw`` as a
    [`DataUrl`][pd_policy_vllm.openai.wire.data_url.DataUrl]: when the body holds no
    more than ``most`` strings that begin ``data:``, else none (parsed whole).

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] (400) for a body that is
    not JSON, as ``loads`` does; a data URL holding a raw control character is let
    through (see the module docs).
    """
    spans = _spans(raw, least, most)
    if not spans:
        return loads(raw)
    pieces: list[bytes | memoryview] = []
    view = memoryview(raw)
    at = 0
    for index, (start, end) in enumerate(spans):
        pieces += [view[at:start], _marker(index).encode(), b'"']
        at = end + 1
    pieces.append(view[at:])
    body = loads(b"".join(pieces))
    urls = {_marker(i): DataUrl(raw, start, end) for i, (start, end) in enumerate(spans)}
    if _place(body, urls) != len(spans):
        return loads(raw)
    return body
