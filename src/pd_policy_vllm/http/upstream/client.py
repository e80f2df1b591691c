"""POSTs to workers on kept-alive connections, one pool of them per worker origin.

What a leg needs and nothing else: the worker's URL (``http`` or ``https``; an IPv6
literal kept whole; credentials in it sent as Basic auth, as ``aiohttp`` does), the
leg's headers, and its body as parts written in order, so a spliced prefill leg goes
from the client's buffer to the socket without being joined first.

A worker takes at most ``max_connections`` legs at once from this client (see
[`Limits`][pd_policy_vllm.http.upstream.limits.Limits]); a leg past it waits, in
order, for one to end, and fails as unreachable if none does within the queue
timeout. A leg holds its slot, and its connection, only within its ``async with``
block: both are taken as the block is entered and given back as it is left, however it
is left (an error, a cancellation at any await: queued, handed a slot, connecting,
waiting for the head, reading the body). No object outlives the block holding either:
an answer handed out of a coroutine that is then cancelled before its block would hold
them for good, so there is no such answer.

A connection idle in the pool may have been closed by the worker (uvicorn closes
idle ones after 5 s). A request on a reused connection that fails before any byte of
an answer came back is sent again once, on a new connection: the worker closed the
connection without reading the request, so it cannot have run it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from pd_policy_vllm.http.redact import Redactor

from .connection import Connection, Head
from .errors import UpstreamDisconnected, UpstreamUnreachable
from .limits import DEFAULT_LIMITS, Limits
from .response import Response
from .target import Target

__all__ = ["Observer", "Response", "Upstream"]

#: Called with each leg's URL and body as it is sent (tests record legs with it).
Observer = Callable[[str, bytes], None]

#: Idle connections older than this are closed, not reused: under uvicorn's 5 s.
_IDLE_SECONDS: Final = 4.0
_CACHED_URLS: Final = 4096


class _Pool:
    """One worker origin's idle connections, and the slots of the legs it is serving."""

    __slots__ = ("busy", "idle", "queued", "waiters")

    def __init__(self) -> None:
        self.idle: list[tuple[float, Connection]] = []
        self.busy = 0
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.queued = 0  # legs that waited for a slot, ever

    async def take(self, limits: Limits) -> None:
        if self.busy < limits.max_connections and not self.waiters:
            self.busy += 1
            return
        self.queued += 1
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self.waiters.append(waiter)
        timer = loop.call_later(limits.queue_timeout, _expire, waiter)
        try:
            await waiter  # the slot is handed over by ``give``, ``busy`` unchanged
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.give()  # handed a slot as it was cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self.waiters.remove(waiter)
            raise
        finally:
            timer.cancel()

    def give(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.busy -= 1


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(UpstreamUnreachable("the worker's connections are all in use"))


class Upstream:
    """The pools of connections to every worker; closed with ``close``. ``redactor``: the
    keys none of the workers' answers may carry on (its callers that relay an answer,
    or a worker's words in an error, redact with it; none by default)."""

    def __init__(
        self,
        observers: Sequence[Observer] = (),
        limits: Limits = DEFAULT_LIMITS,
        redactor: Redactor | None = None,
    ) -> None:
        self.observers = list(observers)
        self.limits = limits
        self.redactor = redactor if redactor is not None else Redactor()
        self.closed = False
        self._pools: dict[tuple[str, str, int], _Pool] = {}
        self._targets: dict[str, Target] = {}
        self._tls: ssl.SSLContext | None = None

    @property
    def queued(self) -> int:
        """How many legs waited for a connection to their worker (all workers), ever."""
        return sum(pool.queued for pool in self._pools.values())

    @property
    def waiting(self) -> int:
        """How many legs wait for a connection to their worker now."""
        return sum(len(pool.waiters) for pool in self._pools.values())

    def _target(self, url: str) -> Target:
        target = self._targets.get(url)
        if target is None:
            if len(self._targets) >= _CACHED_URLS:
                self._targets.clear()
            target = self._targets[url] = Target(url)
        return target

    async def _connect(self, target: Target) -> Connection:
        loop = asyncio.get_running_loop()
        tls: ssl.SSLContext | None = None
        if target.tls:
            tls = self._tls = self._tls or ssl.create_default_context()
        limits = self.limits
        try:
            # Not wait_for: on Python 3.11 it runs the connect as a task of its own, and
            # returns its connection when a cancellation comes as it ends, the
            # cancellation lost (the leg then goes on, its slot held, for a client gone).
            async with asyncio.timeout(limits.connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: Connection(limits), target.host, target.port, ssl=tls
                )
        except (TimeoutError, OSError) as exc:
            raise UpstreamUnreachable(f"no connection ({type(exc).__name__})") from None
        return connection

    def _idle(self, pool: _Pool) -> Connection | None:
        now = time.monotonic()
        idle = pool.idle
        while idle:
            since, connection = idle.pop()
            if now - since < _IDLE_SECONDS and connection.reusable:
                connection.limits = self.limits  # a reload's, from its next leg on
                return connection
            connection.close()
        return None

    def post(
        self, url: str, body: Sequence[bytes | memoryview] | bytes, headers: Mapping[str, str]
    ) -> _Posting:
        """``async with upstream.post(url, body, headers) as response``: POST ``body``
        (bytes, or parts sent in order) with ``headers`` to ``url`` as the block is
        entered, and give the worker's answer to the block once its head has come back;
        its connection goes back to its pool, or is closed, as the block is left.

        Entering raises ``UpstreamUnreachable`` when no connection can be made (or none
        to the worker frees within the queue timeout, or the URL is not ``http`` or
        ``https``), ``UpstreamDisconnected`` or ``UpstreamProtocolError`` when the worker
        fails before its head is whole, ``UpstreamTimeout`` when the head does not come
        within the read timeout, and ``ValueError`` for a header that holds a line
        break."""
        return _Posting(self, url, body, headers)

    async def _enter(
        self, url: str, body: Sequence[bytes | memoryview] | bytes, headers: Mapping[str, str]
    ) -> tuple[_Pool, Connection, Head]:
        if self.closed:
            raise UpstreamUnreachable("the proxy's client is closed")
        target = self._target(url)
        parts: Sequence[bytes | memoryview] = [body] if isinstance(body, bytes) else body
        head = self._head(target, parts, headers)
        for observer in self.observers:
            observer(url, b"".join(parts))
        pool = self._pools.get(target.origin)
        if pool is None:
            pool = self._pools[target.origin] = _Pool()
        await pool.take(self.limits)
        try:
            connection, answer = await self._send(target, pool, head, parts)
        except BaseException:
            pool.give()
            raise
        return pool, connection, answer

    def _leave(self, pool: _Pool, connection: Connection, whole: bool) -> None:
        # The block's end, however it came: the connection back to its pool when read to
        # its end, and the slot to the next leg waiting.
        if whole and connection.reusable and not self.closed:
            pool.idle.append((time.monotonic(), connection))
        else:
            connection.close()
        pool.give()

    @staticmethod
    def _head(
        target: Target, parts: Sequence[bytes | memoryview], headers: Mapping[str, str]
    ) -> bytes:
        lines = [target.prefix]
        if target.authorization is not None:
            lines.append(f"Authorization: {target.authorization}\r\n".encode("latin-1"))
        for name, value in headers.items():
            if target.authorization is None or name.lower() != "authorization":
                # As aiohttp's server read them (UTF-8, undecodable bytes escaped): a
                # client's request id goes on as the client's bytes. A line break would
                # be a header of the caller's making: refused, as aiohttp's client does.
                if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                    raise ValueError("a header of a leg holds a line break")
                lines.append(f"{name}: {value}\r\n".encode("utf-8", "surrogateescape"))
        size = sum(len(p) for p in parts)
        lines.append(f"Content-Length: {size}\r\n\r\n".encode("latin-1"))
        return b"".join(lines)

    async def _send(
        self, target: Target, pool: _Pool, head: bytes, parts: Sequence[bytes | memoryview]
    ) -> tuple[Connection, Head]:
        connection = self._idle(pool)
        reused = connection is not None
        while True:
            if connection is None:
                connection = await self._connect(target)
            try:
                connection.request(head, parts)
                return connection, await connection.head()
            except UpstreamDisconnected:
                connection.close()
                if not reused or connection.heard:
                    raise
                connection, reused = None, False
            except BaseException:
                connection.close()
                raise

    def close(self) -> None:
        """Close every pooled connection; later posts raise ``UpstreamUnreachable``."""
        self.closed = True
        for pool in self._pools.values():
            for _, connection in pool.idle:
                connection.close()
        self._pools.clear()


class _Posting:
    """One leg's ``async with`` block (``Upstream.post``): a class, not an
    ``asynccontextmanager``, whose async generator costs its loop's bookkeeping twice a
    request. What it holds is taken on entering and given back on leaving, however the
    block is left."""

    __slots__ = ("_args", "_held", "_upstream")

    def __init__(
        self,
        upstream: Upstream,
        url: str,
        body: Sequence[bytes | memoryview] | bytes,
        headers: Mapping[str, str],
    ) -> None:
        self._upstream, self._args = upstream, (url, body, headers)
        self._held: tuple[_Pool, Connection] | None = None

    async def __aenter__(self) -> Response:
        pool, connection, answer = await self._upstream._enter(*self._args)
        self._held = (pool, connection)
        return Response(connection, answer)

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: object
    ) -> None:
        held, self._held = self._held, None
        if held is not None:
            self._upstream._leave(*held, whole=kind is None)
