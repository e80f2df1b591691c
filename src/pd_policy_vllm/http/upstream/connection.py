"""One HTTP/1.1 connection to a worker: a request written, its response read, as a
protocol on the event loop's transport.

A leg to a worker is a POST of a known length to a server that answers with a
``Content-Length`` body or a chunked one (vLLM's streams). That is all this speaks:
no redirects, no cookies, no compression, no proxies. Each of those is a cost
``aiohttp``'s client pays on every request (about a quarter of the proxy's time at
64 KiB), and a worker never needs one.

The framing is ``httptools``'s (llhttp, the parser of Node.js), not this module's: a
worker's answer is input like a client's, and a hand-written chunk parser that took
``-1`` for a size once froze the event loop. llhttp refuses what RFC 9112 says a
client must not guess at (signed, ``0x`` and overflowing chunk sizes, a repeated
``Content-Length``, ``Content-Length`` beside ``Transfer-Encoding``, bare LF line
ends); this module adds what a proxy must bound: the head's size, the body's size,
a ``Transfer-Encoding`` other than ``chunked`` (a coding it never asked for), an
upgrade, and the time a worker may stay silent. 1xx answers are read past.

The body is handed on as it arrives, decoded from chunks, to one reader at a time (its
[`Response`][pd_policy_vllm.http.upstream.response.Response]), at the reader's pace:
past ``WINDOW_HIGH`` bytes not yet taken the connection stops reading its socket, and
reads again once the reader has taken them down to ``WINDOW_LOW``. A reader that stops
(a client that stopped reading its stream) thus stops the worker, whose writes wait on
the sockets, and holds a window of the body, never the whole answer. A connection serves
one request at a time and goes back to its pool when its response has been read to the
end and the server did not ask to close it. Any fault closes it: its framing is not
trusted.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Final

import httptools

from .errors import UpstreamDisconnected, UpstreamProtocolError, UpstreamTimeout
from .limits import Limits

__all__ = ["WINDOW_HIGH", "WINDOW_LOW", "Connection", "Head"]

_STATUS_START: Final = b"HTTP/"

#: The bytes a reason phrase may hold: HTAB, SP, VCHAR and obs-text.
_REASON_BYTES: Final = bytes([9, *range(0x20, 0x7F), *range(0x80, 0x100)])

#: Small parts are joined into writes of up to this many bytes; a larger one goes alone.
_JOINED: Final = 256 * 1024
#: The body's bytes held for a reader that has not taken them, past which the connection
#: stops reading its socket, and down to which the reader takes them before it reads
#: again: asyncio's StreamReader's (twice its 64 KiB limit, and the limit). One read of
#: the socket (256 KiB at most) may land past the high mark before the pause.
WINDOW_HIGH: Final = 128 * 1024
WINDOW_LOW: Final = 64 * 1024


class Head:
    """A response's status and whether the worker asked to close the connection."""

    __slots__ = ("close", "status")

    def __init__(self, status: int, close: bool) -> None:
        self.status = status
        self.close = close


class Connection(asyncio.Protocol):
    """A keep-alive connection; ``request`` then ``head`` then ``read`` until ``b""``."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits if limits is not None else Limits()
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._head: Head | None = None
        self._body: deque[bytes] = deque()
        self._buffered = 0  # the bytes in _body
        self._paused = False  # the socket's reading, paused for the reader
        self._head_bytes = 0  # bytes read before the final head was whole
        self._head_size = 0  # the status lines' and headers' bytes, 1xx answers' too
        self._body_bytes = 0
        self._codings: list[bytes] = []
        self._length: int | None = None
        self._in_flight = False  # a request written and its answer not yet whole
        self._done = False
        self._lost: BaseException | None = None
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None
        #: Whether any byte of an answer to the current request came back.
        self.heard = False

    # --- llhttp's callbacks ---------------------------------------------------------

    def on_message_begin(self) -> None:
        if not self._in_flight:
            raise UpstreamProtocolError("the worker sent more than its response")

    def on_status(self, reason: bytes) -> None:
        self._head_size += len(reason) + 16
        if reason.translate(None, _REASON_BYTES):
            # RFC 9112 allows tabs, spaces and visible bytes; llhttp lets controls through.
            raise UpstreamProtocolError("the worker's status line holds a control byte")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._head is not None:
            return  # a trailer: nothing here acts on one
        self._head_size += len(name) + len(value) + 4
        key = name.lower()
        if key == b"transfer-encoding":
            self._codings += (c.strip().lower() for c in value.split(b","))
        elif key == b"content-length":
            self._length = int(value)  # llhttp checked it is digits, and only one

    def on_headers_complete(self) -> None:
        if self._head_size > self.limits.max_head_bytes:
            raise UpstreamProtocolError("the worker's response head is too long")
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            if status == 101:
                raise UpstreamProtocolError("the worker switched protocols unasked")
            self._codings, self._length = [], None
            return  # an interim answer: the final one follows on the same connection
        if self._codings and self._codings != [b"chunked"]:
            # A coding it was never offered: its bytes are not the answer's, and a body
            # read to the close would be relayed encoded as if it were the answer.
            raise UpstreamProtocolError("the worker's Transfer-Encoding is not chunked")
        if self._length is not None and self._length > self.limits.max_response_bytes:
            raise UpstreamProtocolError("the worker's answer is over the response-size cap")
        self._head = Head(status, not self._parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self.limits.max_response_bytes:
            raise UpstreamProtocolError("the worker's answer is over the response-size cap")
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > WINDOW_HIGH and not self._paused and self.transport is not None:
            # The reader is behind: the worker's bytes wait in the sockets, not here.
            self._paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self._head is None:
            return  # the end of a 1xx
        self._done, self._in_flight = True, False

    # --- the event loop's side ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if not self._done and self._lost is None:
            head = self._head
            if head is not None and head.close and self._length is None and not self._codings:
                self._done = True  # a body that ends when the connection does
            else:
                self._lost = UpstreamDisconnected("the worker closed the connection")
        self._wake()

    def data_received(self, data: bytes) -> None:
        self.heard = True
        if self._lost is not None:
            return
        try:
            if self._head is None:
                seen = self._head_bytes
                self._head_bytes += len(data)
                # The answer starts with its status line: llhttp skips blank lines before
                # it, which RFC 9112 allows a server reading requests, not a client.
                if seen < len(_STATUS_START) and not _STATUS_START[seen:].startswith(
                    data[: len(_STATUS_START) - seen]
                ):
                    raise UpstreamProtocolError("the worker's answer is not HTTP/1.1")
            self._parser.feed_data(data)
            if self._head is None and self._head_bytes > self.limits.max_head_bytes:
                raise UpstreamProtocolError("the worker's response head is too long")
        except UpstreamProtocolError as exc:
            self._fail(exc)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if not isinstance(cause, UpstreamProtocolError):
                cause = UpstreamProtocolError("the worker's answer is not HTTP/1.1")
            self._fail(cause)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamProtocolError("the worker switched protocols unasked"))
        except httptools.HttpParserError as exc:
            # llhttp's reason names the fault (e.g. "Invalid character in chunk size").
            self._fail(UpstreamProtocolError(f"the worker's answer is not HTTP/1.1 ({exc})"))
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        # A whole answer stays whole (the bytes after it only retire the connection); the
        # pieces before a fault are read first, then the fault.
        self._lost = exc
        if self.transport is not None:
            self.transport.close()

    def _timed_out(self) -> None:
        if self._lost is None and not self._done:
            self._fail(UpstreamTimeout(f"the worker was silent for {self.limits.read_timeout:g} s"))
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        timer = loop.call_later(timeout, self._timed_out)
        try:
            await self._waiter
        finally:
            timer.cancel()
            self._waiter = None

    # --- the caller's side ----------------------------------------------------------

    def _resume(self) -> None:
        if self._paused:
            self._paused = False
            if self.transport is not None:
                self.transport.resume_reading()

    @property
    def reusable(self) -> bool:
        """Read to its end, with no close asked for or seen."""
        head, whole = self._head, self._done and not self._closed and self._lost is None
        return whole and not self._body and head is not None and not head.close

    def request(self, head: bytes, body: Sequence[bytes | memoryview]) -> None:
        """Write a request: its head and body's parts, small ones joined (a write is a
        system call, dearer than copying 64 KiB), each large one written as it is, never
        copied unless the socket does not take it at once."""
        assert self.transport is not None
        self._head, self._done, self._lost, self._in_flight = None, False, None, True
        self._head_bytes = self._head_size = self._body_bytes = 0
        self._codings, self._length = [], None
        self.heard = False
        self._body.clear()
        self._buffered = 0
        self._resume()
        write = self.transport.write
        pending: list[bytes | memoryview] = [head]
        size = len(head)
        for part in body:
            if pending and size + len(part) > _JOINED:
                write(b"".join(pending))
                pending, size = [], 0
            if len(part) >= _JOINED:
                write(part)  # as it is: never copied by a join
            else:
                pending.append(part)
                size += len(part)
        if pending:
            write(b"".join(pending))

    async def head(self) -> Head:
        """The response's head, once whole. Raises ``UpstreamDisconnected``,
        ``UpstreamProtocolError``, or ``UpstreamTimeout`` when it is not whole within the
        read timeout of the request (a worker that trickles it byte by byte is no
        exception)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.read_timeout
        while self._head is None:
            if self._lost is not None:
                raise self._lost
            if self._closed:
                raise UpstreamDisconnected("the worker closed the connection")
            left = deadline - loop.time()
            if left <= 0:
                self._timed_out()
                continue
            await self._wait(left)
        return self._head

    async def read(self) -> bytes:
        """The next piece of the body, ``b""`` at its end. Raises as ``head`` does when
        the connection fails before the end, and ``UpstreamTimeout`` when the worker is
        silent for the read timeout."""
        while not self._body:
            if self._done:
                return b""
            if self._lost is not None:
                raise self._lost
            await self._wait(self.limits.read_timeout)
        piece = self._body.popleft()
        self._buffered -= len(piece)
        if self._buffered <= WINDOW_LOW:
            self._resume()
        return piece

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
