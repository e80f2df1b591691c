"""Reading a client's request body whole, in one copy, within the front door's limits: on any
server, through the two reads it offers (the chunks as they arrive, and its own whole read).

A server's own whole-body read (``aiohttp``'s ``request.read()``) grows a buffer chunk by
chunk, then copies it: for a body of several megabytes (a base64 image), about three
copies, each into freshly faulted memory. A body that declares its length and is not
compressed is read here as its chunks, joined once: one copy. Any other body is read by
the server's own read, which must hold it to the same limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final

from pd_policy import BodyTooLarge, ClientTooSlow, MalformedRequest

__all__ = ["MAX_BODY", "read_body", "too_large"]

#: The largest client body the proxy takes by default (a 413 above): images inline,
#: base64-encoded.
MAX_BODY: Final = 256 * 2**20
#: A body of this many bytes or more is joined in a worker thread.
_JOIN_OFF_LOOP: Final = 4 * 2**20


def too_large(limit: int) -> BodyTooLarge:
    """The 413 of a body over ``limit`` bytes."""
    return BodyTooLarge(f"the request body is larger than {limit} bytes", param="body")


async def read_body(
    declared: int | None,
    chunk: Callable[[], Awaitable[bytes]],
    whole: Callable[[], Awaitable[bytes]],
    limit: int,
    timeout: float | None = None,
) -> bytes:
    """The whole body, read within ``timeout`` seconds (``None``: no limit). ``declared`` is
    the length the request declares, when it is the length of what will be read (no
    content-coding to undo): the body is then read as its ``chunk``s (each the bytes that
    have arrived, ``b""`` at the end), joined once; else by the server's ``whole`` read,
    which must raise [`BodyTooLarge`][pd_policy.client_errors.BodyTooLarge] past
    ``limit`` bytes.

    Raises [`BodyTooLarge`][pd_policy.client_errors.BodyTooLarge] (413) for a body over
    ``limit`` bytes, before reading it when its length is declared;
    [`ClientTooSlow`][pd_policy.client_errors.ClientTooSlow] (408) when it has not all
    arrived in time; and [`MalformedRequest`][pd_policy.errors.MalformedRequest] (400)
    for a body that is not the length it declared.
    """
    if declared is not None and declared > limit:
        raise too_large(limit)
    try:
        # One deadline for the whole body: a client that sends a byte now and then never
        # waits long on any one read, and would hold the connection for ever.
        async with asyncio.timeout(timeout):
            if declared is None:
                return await whole()
            # The chunks joined once at the end: one copy, into memory that is never zeroed
            # first (a bytearray of the length would be: for a 5 MB image, that pass cost a
            # tenth of the proxy's CPU under load).
            chunks: list[bytes] = []
            filled = 0
            while piece := await chunk():
                filled += len(piece)
                if filled > declared:
                    raise MalformedRequest(
                        "the body is longer than its Content-Length", param="body"
                    )
                chunks.append(piece)
            if filled != declared:
                raise MalformedRequest("the body is shorter than its Content-Length", param="body")
            if len(chunks) == 1:
                return chunks[0]
            if filled < _JOIN_OFF_LOOP:
                return b"".join(chunks)
            # A quarter of a second for 256 MiB, most of it faulting fresh memory in:
            # in a worker thread (bytes.join copies without the GIL past 1 MiB), not on
            # the event loop every other client waits on.
            return await asyncio.to_thread(b"".join, chunks)
    except TimeoutError:
        raise ClientTooSlow(
            f"the request body did not arrive within {timeout:g} s", param="body"
        ) from None
