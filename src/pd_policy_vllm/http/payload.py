"""Sending a spliced leg as its parts, so that the client's media is never copied into
one more buffer on its way out.

``aiohttp`` sends ``bytes`` by writing the headers and the body together: on Python
before 3.12.9 that is ``b"".join((headers, body))``, and the transport then copies what
the socket did not take into its own buffer. For a 5 MB image that is two copies of
it, each into fresh memory, after the splice's own join. Written part by part, the
image goes from the client's buffer (a view of it) to the socket: what the socket does
not take at once is copied into the transport's buffer, once. The headers go with the
leg's first chunk, which is small (the object's opening and the members before the
media).
"""

from __future__ import annotations

from typing import Any

from .aio import aiohttp
from .splice import Spliced

__all__ = ["SplicedPayload"]


class SplicedPayload(aiohttp.payload.Payload):
    """A [`Spliced`][pd_policy_vllm.http.splice.Spliced] body as an ``aiohttp`` payload:
    its length declared, its chunks written in order."""

    def __init__(self, spliced: Spliced, content_type: str = "application/json") -> None:
        super().__init__(spliced, content_type=content_type)
        self._chunks = spliced.chunks()
        self._size = spliced.size

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return b"".join(self._chunks).decode(encoding, errors)

    async def as_bytes(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return b"".join(self._chunks)

    async def write(self, writer: Any) -> None:
        for chunk in self._chunks:
            await writer.write(chunk)
