"""Reading a client's request body whole, in one copy, within the front door's limits.

``aiohttp``'s ``request.read()`` grows a ``bytearray`` chunk by chunk, then copies it
into ``bytes``: for a body of several megabytes (a base64 image), that is about three
copies of it, each into freshly faulted memory. A body that declares its length and
is not compressed is read here as its chunks, joined once: one copy. Any other body is
read by ``request.read()``, with the server's size limit (the application's
``client_max_size``, which must be ``limit``).
"""

from __future__ import annotations

import asyncio
from typing import Final

from pd_policy import BodyTooLarge, ClientTooSlow, MalformedRequest

from .aio import web

__all__ = ["MAX_BODY", "read_body"]

#: The largest client body the proxy takes by default (a 413 above): images inline,
#: base64-encoded.
MAX_BODY: Final = 256 * 2**20


async def read_body(request: web.Request, limit: int, timeout: float | None = None) -> bytes:
    """The whole body of ``request``, read within ``timeout`` seconds (``None``: no limit).

    Raises [`BodyTooLarge`][pd_policy.client_errors.BodyTooLarge] (413) for a body over
    ``limit`` bytes, before reading it when its length is declared;
    [`ClientTooSlow`][pd_policy.client_errors.ClientTooSlow] (408) when it has not all
    arrived in time; and [`MalformedRequest`][pd_policy.errors.MalformedRequest] (400)
    for a body that is not the length it declared.
    """
    length = request.content_length
    if length is not None and length > limit:
        raise BodyTooLarge(f"the request body is larger than {limit} bytes", param="body")
    try:
        # One deadline for the whole body: a client that sends a byte now and then never
        # waits long on any one read, and would hold the connection for ever.
        async with asyncio.timeout(timeout):
            if length is None or "Content-Encoding" in request.headers:
                # Chunked, or decompressed by the server: its length is known only at its end.
                return await request.read()
            return await _read_declared(request, length)
    except web.HTTPRequestEntityTooLarge:
        raise BodyTooLarge(f"the request body is larger than {limit} bytes", param="body") from None
    except TimeoutError:
        raise ClientTooSlow(
            f"the request body did not arrive within {timeout:g} s", param="body"
        ) from None


async def _read_declared(request: web.Request, length: int) -> bytes:
    # The chunks joined once at the end: one copy, into memory that is never zeroed first
    # (a bytearray of the length would be: for a 5 MB image, that pass cost a tenth of the
    # proxy's CPU under load).
    chunks: list[bytes] = []
    filled = 0
    while chunk := await request.content.readany():
        filled += len(chunk)
        if filled > length:
            raise MalformedRequest("the body is longer than its Content-Length", param="body")
        chunks.append(chunk)
    if filled != length:
        raise MalformedRequest("the body is shorter than its Content-Length", param="body")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
