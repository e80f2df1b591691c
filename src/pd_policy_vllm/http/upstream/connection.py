"""One HTTP/1.1 connection to a worker: a request written, its response read, as a
protocol on the event loop's transport.

A leg to a worker is a POST of a known length to a server that answers with a
``Content-Length`` body or a chunked one (vLLM's streams). That is all this speaks:
no redirects, no cookies, no compression, no proxies. Each of those is a cost
``aiohttp``'s client pays on every request (about a quarter of the proxy's time at
64 KiB), and a worker never needs one.

The response's head is parsed whole; its body is handed on as it arrives, decoded
from chunks when chunked, to one reader at a time. A connection serves one request
at a time and goes back to its pool when its response has been read to the end and
the server did not ask to close it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Final

from .errors import UpstreamDisconnected, UpstreamProtocolError

__all__ = ["Connection", "Head"]

_MAX_HEAD: Final = 64 * 1024
_END_OF_HEAD: Final = b"\r\n\r\n"
#: A first body part under this goes in the head's write.
_SMALL: Final = 64 * 1024


class Head:
    """A response's status line and the headers this client acts on."""

    __slots__ = ("chunked", "close", "length", "status")

    def __init__(self, status: int, length: int | None, chunked: bool, close: bool) -> None:
        self.status = status
        self.length = length
        self.chunked = chunked
        self.close = close


def _parse_head(raw: bytes) -> Head:
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise UpstreamProtocolError("the worker's status line is not HTTP/1.x")
    length: int | None = None
    chunked = False
    close = parts[0] == b"HTTP/1.0"
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise UpstreamProtocolError("the worker sent a header line without a colon")
        key = name.strip().lower()
        value = value.strip()
        if key == b"content-length":
            if not value.isdigit():
                raise UpstreamProtocolError("the worker's Content-Length is not a number")
            length = int(value)
        elif key == b"transfer-encoding":
            chunked = value.lower().endswith(b"chunked")
        elif key == b"connection":
            lowered = value.lower()
            close = b"close" in lowered or (close and b"keep-alive" not in lowered)
    status = int(parts[1])
    if status in (204, 304):  # never a body, whatever the headers say
        length, chunked = 0, False
    return Head(status, None if chunked else length, chunked, close)


class Connection(asyncio.Protocol):
    """A keep-alive connection; ``request`` then ``head`` then ``read`` until ``b""``."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._head: Head | None = None
        self._body: deque[bytes] = deque()
        self._left = 0  # bytes of the body (or of the current chunk) still to come
        self._chunk_state = 0  # 0: size line next, 1: data, 2: CRLF after data, 3: trailers
        self._done = False
        self._lost: BaseException | None = None
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None
        #: Whether any byte of an answer to the current request came back.
        self.heard = False

    # --- the event loop's side ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if not self._done:
            self._lost = UpstreamDisconnected("the worker closed the connection")
            if self._head is not None and self._head.length is None and not self._head.chunked:
                self._done, self._lost = True, None  # a body that ends when the connection does
        self._wake()

    def data_received(self, data: bytes) -> None:
        self.heard = True
        try:
            if self._head is None:
                self._buffer += data
                end = self._buffer.find(_END_OF_HEAD)
                if end < 0:
                    if len(self._buffer) > _MAX_HEAD:
                        raise UpstreamProtocolError("the worker's response head is too long")
                    return
                self._head = _parse_head(bytes(self._buffer[:end]))
                rest = bytes(self._buffer[end + 4 :])
                self._buffer.clear()
                self._left = self._head.length or 0
                if not self._head.chunked and self._head.length == 0:
                    self._done = True
                if rest:
                    self._feed(rest)
            else:
                self._feed(data)
        except UpstreamProtocolError as exc:
            self._lost = exc
            assert self.transport is not None
            self.transport.close()
        self._wake()

    def _feed(self, data: bytes) -> None:
        head = self._head
        assert head is not None
        if self._done:
            raise UpstreamProtocolError("the worker sent more than its response")
        if not head.chunked:
            if head.length is None:
                self._body.append(data)
                return
            if len(data) > self._left:
                raise UpstreamProtocolError("the worker sent more than its Content-Length")
            self._body.append(data)
            self._left -= len(data)
            self._done = self._left == 0
            return
        self._dechunk(data)

    def _dechunk(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        at = 0
        while at < len(buffer):
            if self._chunk_state == 1:
                piece = bytes(buffer[at : at + self._left])
                self._body.append(piece)
                self._left -= len(piece)
                at += len(piece)
                if self._left == 0:
                    self._chunk_state = 2
                continue
            end = buffer.find(b"\r\n", at)
            if end < 0:
                if len(buffer) - at > _MAX_HEAD:
                    raise UpstreamProtocolError("a chunk's size line is too long")
                break
            line = bytes(buffer[at:end])
            at = end + 2
            if self._chunk_state == 2:
                if line:
                    raise UpstreamProtocolError("a chunk does not end where its size says")
                self._chunk_state = 0
            elif self._chunk_state == 0:
                size = line.split(b";", 1)[0].strip()
                try:
                    self._left = int(size, 16)
                except ValueError:
                    raise UpstreamProtocolError("a chunk's size is not hexadecimal") from None
                self._chunk_state = 1 if self._left else 3
            elif not line:  # the blank line after the last chunk's trailers
                self._done = True
                if at != len(buffer):
                    raise UpstreamProtocolError("the worker sent more than its response")
        del buffer[:at]

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    # --- the caller's side ----------------------------------------------------------

    @property
    def reusable(self) -> bool:
        """Read to its end, with no close asked for or seen."""
        return (self._done and not self._closed and self._lost is None
                and self._head is not None and not self._head.close)  # fmt: skip

    def request(self, head: bytes, body: Sequence[bytes | memoryview]) -> None:
        """Write a request: its head, then its body's parts, a write each (on Python 3.11
        ``writelines`` joins them into one more copy). A part the socket does not take at
        once is copied into the transport's buffer; one that it takes is not copied."""
        assert self.transport is not None
        self._head, self._done, self._lost, self._chunk_state = None, False, None, 0
        self.heard = False
        self._body.clear()
        self._buffer.clear()
        write = self.transport.write
        if body and len(body[0]) < _SMALL:
            write(head + body[0])
            body = body[1:]
        else:
            write(head)
        for part in body:
            write(part)

    async def head(self) -> Head:
        """The response's head. Raises ``UpstreamDisconnected`` or
        ``UpstreamProtocolError``."""
        while self._head is None:
            if self._lost is not None:
                raise self._lost
            if self._closed:
                raise UpstreamDisconnected("the worker closed the connection")
            await self._wait()
        return self._head

    async def read(self) -> bytes:
        """The next piece of the body, ``b""`` at its end. Raises as ``head`` does when the
        connection fails before the end."""
        while not self._body:
            if self._done:
                return b""
            if self._lost is not None:
                raise self._lost
            await self._wait()
        return self._body.popleft()

    async def read_all(self) -> bytes:
        """The rest of the body."""
        parts = []
        while piece := await self.read():
            parts.append(piece)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        """Close the connection (a response not read to its end cannot be reused)."""
        if self.transport is not None and not self._closed:
            self.transport.close()
        self._closed = True
