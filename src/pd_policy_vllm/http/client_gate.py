"""The proxy's client connections: how many it holds at once, and how long a request's
head may take once it has begun.

A [`GatedRunner`][pd_policy_vllm.http.client_gate.GatedRunner] runs the proxy's
application as ``web.AppRunner`` does, with a [`ClientGate`][
pd_policy_vllm.http.client_gate.ClientGate] in front of ``aiohttp``'s protocol for each
new connection:

- at most ``max_connections`` client connections are open at once. A connection past
  them is answered at once with [`Overloaded`][pd_policy.client_errors.Overloaded]
  (503 ``pd_overloaded``, its OpenAI error body, ``Connection: close``), before any byte
  of its request is read: it never reaches ``aiohttp``, holds no slot, and is closed as
  soon as it closes its side, or after a second at most (what it sends meanwhile is
  discarded: closing on it at once would reset the connection, and the answer with
  it). The connections already held are not affected.
- a request's head (its request line and headers) must be whole ``header_timeout``
  seconds after its first byte arrived, or the connection is closed. A client sending
  its head a byte at a time holds the connection for that long, not for as long as it
  likes.
- the time before a request's first byte is the idle keep-alive time,
  ``keepalive_timeout``: ``aiohttp``'s own timer, armed as the connection opens and
  as each response ends, closes a connection with no whole head by then.

The gate knows a request's head is whole when the server's request handler is called
(``aiohttp`` calls it as soon as the head is parsed, before any of the body is read),
and the request over when it returns: the gate wraps that handler, not the
application's middlewares (an application with any runs ``aiohttp``'s middleware
chain, its own included, on every request). Bytes that come while a request is served
(its body, or the start of a pipelined next request) start no deadline: a next head
begun then, and left unfinished, is bounded by the keep-alive timeout instead.
"""

from __future__ import annotations

import asyncio
import http
from collections.abc import Awaitable, Callable
from typing import Any, Final, cast

from pd_policy import Overloaded, PolicyError
from pd_policy_vllm.http.aio import web
from pd_policy_vllm.http.front_door import FrontDoor
from pd_policy_vllm.openai.wire.codec import dumps

__all__ = ["ClientGate", "GatedRunner"]

#: How long a refused connection is read (and what it sends dropped) before it is closed.
_LINGER: Final = 1.0
_LINGER_BYTES: Final = 64 * 1024

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


def _refusal(error: PolicyError) -> bytes:
    """``error``'s whole HTTP/1.1 answer, to write on a connection no server reads."""
    body = dumps(error.to_body())
    phrase = http.HTTPStatus(error.status).phrase
    lines = [f"HTTP/1.1 {error.status} {phrase}", "Content-Type: application/json",
             f"Content-Length: {len(body)}", "Connection: close",
             *(f"{name}: {value}" for name, value in error.headers().items())]  # fmt: skip
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


_OVERLOADED: Final = _refusal(Overloaded())


class _Refused(asyncio.Protocol):
    # A connection past the cap: its answer, its writing side shut, and a short linger.

    def __init__(self) -> None:
        self._read = 0
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.write(_OVERLOADED)
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(_LINGER, transport.close)

    def data_received(self, data: bytes) -> None:
        self._read += len(data)
        if self._read > _LINGER_BYTES and self._transport is not None:
            self._transport.close()

    def eof_received(self) -> bool:
        return False  # the client has read, or will read, the answer: close

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()


class _Guard(asyncio.Protocol):
    # One held connection: aiohttp's protocol behind it, and the deadline of a head.

    def __init__(self, gate: ClientGate, handler: asyncio.Protocol) -> None:
        self._gate, self.handler = gate, handler
        self._transport: asyncio.Transport | None = None
        # One timer at a time, left running when a head is whole: a keep-alive
        # connection's requests do not each make and cancel one. When it fires, it
        # closes the connection, re-arms for the head begun since, or ends.
        self._timer: asyncio.TimerHandle | None = None
        self._since: float | None = None  # when the unfinished head's first byte came
        self._busy = False  # a head was whole and its request is not over

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self.handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._busy and self._since is None:
            loop = asyncio.get_running_loop()
            self._since = loop.time()
            if self._timer is None:
                self._timer = loop.call_at(self._since + self._gate.door.header_timeout,
                                           self._late)  # fmt: skip
        self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self.handler.eof_received()

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._gate.held.pop(self.handler, None)
        self.handler.connection_lost(exc)

    def begun(self) -> None:
        """A head is whole: its deadline is met."""
        self._busy = True
        self._since = None

    def ended(self) -> None:
        """Its request is over: the next head's deadline runs from its first byte."""
        self._busy = False

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _late(self) -> None:
        self._timer = None
        if self._busy or self._since is None or self._transport is None:
            return  # no head under way: the next one's first byte arms again
        deadline = self._since + self._gate.door.header_timeout
        loop = asyncio.get_running_loop()
        if loop.time() >= deadline:
            self._transport.close()
        else:  # a head begun after the one this timer was armed for
            self._timer = loop.call_at(deadline, self._late)


class ClientGate:
    """The protocol factory of a server's sites, in front of ``server`` (``aiohttp``'s):
    a connection past ``door.max_connections`` is refused, the others are handed to
    ``server``'s protocol with a deadline on each head (see the module docs).
    [`handling`][pd_policy_vllm.http.client_gate.ClientGate.handling] wraps ``server``'s
    request handler: it tells the gate when a head is whole and when its request is
    over."""

    def __init__(self, door: FrontDoor) -> None:
        self.door = door
        self.server: web.Server | None = None
        #: The connections held, by aiohttp's protocol for each.
        self.held: dict[object, _Guard] = {}

    def __call__(self) -> asyncio.Protocol:
        assert self.server is not None, "the runner is not set up"
        if len(self.held) >= self.door.max_connections:
            return _Refused()
        # Held from here: the connections accepted in one go are counted one by one.
        guard = _Guard(self, self.server())
        self.held[guard.handler] = guard
        return guard

    def handling(self, handler: Handler) -> Handler:
        """``handler`` (a server's request handler), telling the gate when each request
        begins (its head whole) and ends."""

        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            guard = self.held.get(request.protocol)
            if guard is None:
                return await handler(request)
            guard.begun()
            try:
                return await handler(request)
            finally:
                guard.ended()

        return handle


class GatedRunner(web.AppRunner):
    """``web.AppRunner`` for ``app`` with ``door``'s limits on its clients: its
    ``server_args`` (``kwargs`` add to them) and its [`ClientGate`][
    pd_policy_vllm.http.client_gate.ClientGate] in front of every connection of its
    sites (``web.TCPSite(runner, ...)`` as for any runner)."""

    def __init__(self, app: web.Application, door: FrontDoor, **kwargs: Any) -> None:
        self.gate = ClientGate(door)
        super().__init__(app, **{**door.server_args(), **kwargs})

    @property
    def server(self) -> web.Server | None:
        server = super().server
        if server is None:
            return None
        if self.gate.server is not server:
            self.gate.server = server
            server.request_handler = self.gate.handling(server.request_handler)
        # A site calls what this returns for each new connection, and that is all it
        # does with it; the runner's own cleanup uses its server, not this.
        return cast(web.Server, self.gate)
