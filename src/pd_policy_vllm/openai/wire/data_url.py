"""A data URL left in the client's bytes: read, hashed and forwarded without becoming a
Python string.

A chat request's image is mostly one JSON string, a base64 data URL of megabytes.
Parsed, it is decoded into a ``str`` (a pass over it and a copy), and its identity then
encodes it back to UTF-8 to hash it (another). The proxy needs neither: the policy reads
the URL's scheme, the identity is the SHA-256 of its text, and every leg that carries it
can carry the client's bytes. A ``DataUrl`` is that string kept as a span of the body:
its text is the span's bytes exactly, because [`skim`][pd_policy_vllm.openai.wire.skim] takes
only strings of ASCII with no escape in them, whose bytes are their UTF-8.
[`dumps`][pd_policy_vllm.openai.wire.codec.dumps] writes it as the client wrote it.

Its digest is computed once and kept on the object itself: its bytes cannot change, so
the digest cannot outlive what it is the digest of (a cache keyed by anything else, a
URL's text, a position, could name other bytes). A large one is hashed in a worker
thread before the plan reads it (SHA-256 releases the GIL), and the plan finds it done.
"""

from __future__ import annotations

import hashlib
import json

__all__ = ["DataUrl"]


class DataUrl:
    """The JSON string ``raw[start:end]`` (its text, without the quotes) of a request's
    body ``raw``: ASCII, with no backslash, beginning ``data:``.

    Equal to another ``DataUrl`` of the same text, and to the ``str`` it stands for.
    """

    # Not an attrs class: msgspec would encode one as an object of its fields.
    __slots__ = ("_sha256", "end", "raw", "start")
    raw: bytes
    start: int
    end: int
    _sha256: str | None

    def __init__(self, raw: bytes, start: int, end: int) -> None:
        if not (0 < start <= end < len(raw)) or raw[start - 1] != 0x22 or raw[end] != 0x22:
            raise ValueError("a DataUrl is a span between the quotes of a JSON string")
        self.raw, self.start, self.end = raw, start, end
        self._sha256 = None

    @classmethod
    def of(cls, text: str) -> DataUrl | None:
        """``text`` as a ``DataUrl`` of its own bytes, when it is one: ASCII, with no
        quote, backslash or control character (every base64 data URL, once parsed);
        else ``None``. A copy of ``text``, in one pass."""
        if not text.isascii():  # constant time for a str
            return None
        raw = json.dumps(text).encode("ascii")
        # A character JSON escapes made the string longer: not a DataUrl's text.
        return cls(raw, 1, len(raw) - 1) if len(raw) == len(text) + 2 else None

    @property
    def view(self) -> memoryview:
        """The URL's text, as bytes of the body (no copy)."""
        return memoryview(self.raw)[self.start : self.end]

    @property
    def json(self) -> memoryview:
        """The JSON string as the client wrote it, quotes included (no copy)."""
        return memoryview(self.raw)[self.start - 1 : self.end + 1]

    def head(self, limit: int = 256) -> str:
        """The URL up to and including its first comma (``data:image/png;base64,``), or
        its first ``limit`` characters when no comma comes before them: what a check of
        its scheme reads."""
        comma = self.raw.find(b",", self.start, min(self.end, self.start + limit))
        stop = comma + 1 if comma >= 0 else min(self.end, self.start + limit)
        return self.raw[self.start : stop].decode("ascii")

    def sha256(self) -> str:
        """The SHA-256 of the URL's text in UTF-8, as hex: one pass over the body's bytes,
        the first time only (see the module docs)."""
        if self._sha256 is None:
            self._sha256 = hashlib.sha256(self.view).hexdigest()
        return self._sha256

    @property
    def hashed(self) -> bool:
        """Whether its digest is computed already."""
        return self._sha256 is not None

    def __len__(self) -> int:
        return self.end - self.start

    def __str__(self) -> str:
        return self.raw[self.start : self.end].decode("ascii")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DataUrl):
            return self.view == other.view
        if isinstance(other, str):
            return len(other) == len(self) and other.encode("utf-8", "surrogatepass") == self.view
        return NotImplemented

    def __hash__(self) -> int:
        return hash(str(self))

    def __repr__(self) -> str:
        return f"DataUrl({self.head(64)!r}..., {len(self)} characters)"
