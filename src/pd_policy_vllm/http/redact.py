"""Keeping the proxy's keys out of what it relays from its workers.

A worker sees the workers' key on every leg, and a careless one quotes it back: an error
that prints the request's headers, a debugging answer. The proxy relays a worker's words
to its client (an error's message, a whole answer, a stream), so everything it relays
from a worker goes through a [`Redactor`][pd_policy_vllm.http.redact.Redactor] of every
key it knows (the workers', the clients', the admins'): each occurrence is replaced by
``<redacted>``, by value (so ``Bearer KEY`` becomes ``Bearer <redacted>``), in an
error's text as it is and, in the bytes of an answer, also as JSON escapes it.

What it cannot do: a worker that means to leak a key it was given can always encode it
(reversed, base64, a character an event); redaction stops an echo, not an exfiltration.
In answers (not errors) a key shorter than ``MIN_ANSWER_KEY`` characters is left alone:
it would replace ordinary text (a one-letter key, every such letter), and is guessable
anyway. A stream is redacted piece by piece, and a piece that ends in what may be the
beginning of a key keeps that tail back until the next piece says whether it is one: a
key split across pieces is redacted too, and a stream of whole events (each piece ends
with a blank line, which no key holds) is never delayed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Final

from pd_policy import PolicyError
from pd_policy_vllm.http.aio import web
from pd_policy_vllm.http.auth import Keys

__all__ = ["MIN_ANSWER_KEY", "REDACTED", "Redacting", "Redactor"]

#: What a key is replaced by.
REDACTED: Final = "<redacted>"
#: The shortest key redacted from a worker's answer (errors: every key).
MIN_ANSWER_KEY: Final = 8
_MARK: Final = REDACTED.encode()


def _forms(key: str) -> set[bytes]:
    # The key as bytes, and as a JSON encoder may write it: ASCII escapes, "\/" for "/".
    escaped = json.dumps(key)[1:-1]
    forms = {key.encode("utf-8", "surrogatepass"), escaped.encode()}
    return forms | {form.replace(b"/", b"\\/") for form in forms}


class Redactor:
    """Redacts ``keys`` (empty ones dropped): from text, every key; from the bytes of an
    answer, every key of ``MIN_ANSWER_KEY`` characters or more, in each of its forms."""

    def __init__(self, keys: Iterable[str | None] = ()) -> None:
        texts = {k for k in keys if k}
        # Longest first: a key that holds another is replaced whole.
        self.texts = tuple(sorted(texts, key=len, reverse=True))
        self.longest_text = len(self.texts[0]) if self.texts else 0
        forms = {f for k in texts if len(k) >= MIN_ANSWER_KEY for f in _forms(k)}
        self.forms = tuple(sorted(forms, key=len, reverse=True))
        # What a stream's piece may end in and still be the start of a key.
        self._starts = frozenset(f[:i] for f in self.forms for i in range(1, len(f)))
        self._last_bytes = frozenset(b for start in self._starts for b in start[-1:])
        self._longest = max((len(f) for f in self.forms), default=0)

    @classmethod
    def of(cls, keys: Keys) -> Redactor:
        """The redactor of every key of ``keys``: the workers', the clients', the admins'."""
        return cls((keys.worker, *keys.clients, *keys.admins))

    def text(self, text: str) -> str:
        """``text`` with every key replaced."""
        for key in self.texts:
            if key in text:
                text = text.replace(key, REDACTED)
        return text

    def data(self, data: bytes) -> bytes:
        """``data`` (a worker's answer) with every answer key replaced, in each form."""
        for form in self.forms:
            if form in data:
                data = data.replace(form, _MARK)
        return data

    def error_body(self, error: PolicyError) -> dict[str, Any]:
        """``error``'s OpenAI error body, its message and param redacted."""
        body = error.to_body()
        inner: dict[str, Any] = dict(body["error"])
        for field in ("message", "param"):
            if isinstance(inner.get(field), str):
                inner[field] = self.text(inner[field])
        return {"error": inner}

    def error_response(self, error: PolicyError) -> web.Response:
        """``error``'s response (as [`error_response`][
        pd_policy_vllm.http.front_door.error_response] makes it), redacted."""
        return web.json_response(
            self.error_body(error), status=error.status, headers=error.headers()
        )

    def held(self, data: bytes) -> int:
        """How many bytes at the end of ``data`` may be the start of an answer key."""
        if not data or data[-1] not in self._last_bytes:
            return 0
        for start in range(max(len(data) - self._longest + 1, 0), len(data)):
            if data[start:] in self._starts:
                return len(data) - start
        return 0

    def stream(self) -> Redacting:
        """A new stream's redaction."""
        return Redacting(self)


class Redacting:
    """One stream, redacted piece by piece (see the module docs): ``piece`` gives what may
    go out now, ``end`` what was held back when the stream ends."""

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        self._held = b""

    def piece(self, piece: bytes) -> bytes:
        """What of ``piece`` (after what was held) may go out now, redacted."""
        redactor = self._redactor
        data = redactor.data(self._held + piece if self._held else piece)
        keep = redactor.held(data)
        self._held = data[len(data) - keep :] if keep else b""
        return data[: len(data) - keep] if keep else data

    def end(self) -> bytes:
        """What was held back: at the stream's end, no key's start after all."""
        held, self._held = self._held, b""
        return held
