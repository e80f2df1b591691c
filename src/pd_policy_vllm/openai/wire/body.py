"""Reading a client's request body whole, in one copy, within the front door's limits: on any
server, through the [`BodySource`][pd_policy_vllm.openai.wire.body.BodySource] it offers.

A server's own whole-body read (``aiohttp``'s ``request.read()``) grows a buffer chunk by
chunk, then copies it: for a body of several megabytes (a base64 image), about three
copies, each into freshly faulted memory. A body that declares its length and is not
compressed is read here as its chunks, joined once: one copy. Any other body is read by
the server's own read, which must hold it to the same limit.
"""

from __future__ import annotations

import asyncio
from typing import Final, Protocol

from pd_policy import BodyTooLarge, ClientTooSlow, MalformedRequest

__all__ = ["MAX_BODY", "BodySource", "read_body", "too_large"]

#: The largest client body the proxy takes by default (a 413 above): images inline,
#: base64-encoded.
MAX_BODY: Final = 256 * 2**20


class BodySource(Protocol):
    """A request body as a server offers it."""

    @property
    def declared(self) -> int | None:
        """The length the request declares, when it declares one and it is the length of
        what will be read (no content-coding to undo)."""
        ...

    async def chunk(self) -> bytes:
        """The next bytes that have arrived (``b""`` at the end)."""
        ...

    async def whole(self, limit: int) -> bytes:
        """The whole body, by the server's own read; raises
        [`BodyTooLarge`][pd_policy.client_errors.BodyTooLarge] past ``limit`` bytes."""
        ...


def too_large(limit: int) -> BodyTooLarge:
    """The 413 of a body over ``limit`` bytes."""
    return BodyTooLarge(f"the request body is larger than {limit} bytes", param="body")


async def read_body(source: BodySource, limit: int, timeout: float | None = None) -> bytes:
    """The whole body of ``source``, read within ``timeout`` seconds (``None``: no limit).

    Raises [`BodyTooLarge`][pd_policy.client_errors.BodyTooLarge] (413) for a body over
    ``limit`` bytes, before reading it when its length is declared;
    [`ClientTooSlow`][pd_policy.client_errors.ClientTooSlow] (408) when it has not all
    arrived in time; and [`MalformedRequest`][pd_policy.errors.MalformedRequest] (400)
    for a body that is not the length it declared.
    """
    length = source.declared
    if length is not None and length > limit:
        raise too_large(limit)
    try:
        # One deadline for the whole body: a client that sends a byte now and then never
        # waits long on any one read, and would hold the connection for ever.
        async with asyncio.timeout(timeout):
            if length is None:
                return await source.whole(limit)
            return await _read_declared(source, length)
    except TimeoutError:
        raise ClientTooSlow(
            f"the request body did not arrive within {timeout:g} s", param="body"
        ) from None


async def _read_declared(source: BodySource, length: int) -> bytes:
    # The chunks joined once at the end: one copy, into memory that is never zeroed first
    # (a bytearray of the length would be: for a 5 MB image, that pass cost a tenth of the
    # proxy's CPU under load).
    chunks: list[bytes] = []
    filled = 0
    while chunk := await source.chunk():
        filled += len(chunk)
        if filled > length:
            raise MalformedRequest("the body is longer than its Content-Length", param="body")
        chunks.append(chunk)
    if filled != length:
        raise MalformedRequest("the body is shorter than its Content-Length", param="body")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
