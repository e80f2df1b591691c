"""A leg cancelled at any await of the legs' client gives back its slot and its
connection: a client that leaves at the wrong moment costs the proxy nothing.

The worker is a raw socket server this test drives (it counts the connections open on
its side, holds each answer at a chosen point, and can hold a TLS handshake). Each case
cancels a leg at one point: queued for a slot, handed one as it is cancelled, mid-connect
(the TLS handshake), mid-head, mid-body, and between ``post`` and its block. Then the cap
is read back: ``max_connections`` legs all reach the worker at once, the pool has no
slot taken, and once the client is closed the worker has no connection open.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Final

import pytest
from test_http_upstream import _certificate

from pd_policy_vllm.http.upstream import Limits, Upstream, UpstreamUnreachable
from pd_policy_vllm.http.upstream.connection import Connection

GUARD: Final = 20.0
#: How long the cap's read-back waits for every leg to reach the worker: a leg held by a
#: lost slot waits out the queue timeout, far longer.
ALL_AT_ONCE: Final = 5.0
CAP: Final = 3
LIMITS: Final = Limits(max_connections=CAP, queue_timeout=GUARD)
_OK: Final = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
_CHUNKED: Final = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


class Worker:
    """A worker on a raw socket, answering each request as ``mode`` says: ``answer`` at
    once, ``gate`` once ``gate`` is set, ``hold`` never, ``status`` its status line only,
    ``body`` its head and a first chunk only. With ``tls``, each connection's handshake
    waits for ``handshake`` to be set. ``open`` counts the connections open on its side,
    ``in_flight`` the requests read and not yet answered."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.mode = "answer"
        self.tls = tls
        self.gate, self.handshake = asyncio.Event(), asyncio.Event()
        self.open = self.in_flight = self.accepted = 0

    @staticmethod
    async def until(test: Callable[[], bool], timeout: float = ALL_AT_ONCE) -> None:
        """Once ``test`` holds; ``TimeoutError`` if it does not within ``timeout``."""
        async with asyncio.timeout(timeout):
            while not test():
                await asyncio.sleep(0.005)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        self.accepted += 1
        answering = False
        try:
            if self.tls is not None:
                await self.handshake.wait()
                await writer.start_tls(self.tls)
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                self.in_flight += 1
                answering = True
                mode = self.mode
                if mode == "gate":
                    await self.gate.wait()
                if mode in ("answer", "gate"):
                    writer.write(_OK)
                elif mode == "status":
                    writer.write(b"HTTP/1.1 200 OK\r\n")
                elif mode == "body":
                    writer.write(_CHUNKED + b"2\r\nok\r\n")
                await writer.drain()
                if mode not in ("answer", "gate"):
                    await reader.read()  # held until the client closes
                    return
                self.in_flight -= 1
                answering = False
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            self.open -= 1
            self.in_flight -= answering
            writer.close()


@contextlib.asynccontextmanager
async def serving(
    tls: bool = False, tmp: Path | None = None
) -> AsyncIterator[tuple[Worker, Upstream, str]]:
    """A worker, the legs' client (its ``max_connections`` is ``CAP``), and the URL."""
    served = trusted = None
    if tls:
        assert tmp is not None
        cert, key = _certificate(tmp)
        served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        served.load_cert_chain(cert, key)
        trusted = ssl.create_default_context(cafile=str(cert))
    worker = Worker(served)
    server = await asyncio.start_server(worker.serve, "127.0.0.1", 0)
    upstream = Upstream(limits=LIMITS)
    upstream._tls = trusted
    port = server.sockets[0].getsockname()[1]
    try:
        yield worker, upstream, f"{'https' if tls else 'http'}://127.0.0.1:{port}/v1"
    finally:
        upstream.close()
        server.close()


async def leg(upstream: Upstream, url: str) -> bytes:
    """One leg, read to its end."""
    async with upstream.post(url, b"{}", {}) as response:
        return await response.read()


async def _cancelled(task: asyncio.Task[object]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _cap_is_whole(worker: Worker, upstream: Upstream, url: str) -> None:
    """The cap read back: no slot taken, ``CAP`` legs at the worker at once, and no
    connection left open on the worker's side once the client is closed."""
    await asyncio.sleep(0.05)  # let what the cancellation set off run
    assert sum(pool.busy for pool in upstream._pools.values()) == 0
    worker.mode = "gate"
    worker.handshake.set()
    worker.gate.clear()
    legs = [asyncio.create_task(leg(upstream, url)) for _ in range(CAP)]
    await worker.until(lambda: worker.in_flight == CAP)
    worker.gate.set()
    assert await asyncio.gather(*legs) == [b"ok"] * CAP
    assert sum(pool.busy for pool in upstream._pools.values()) == 0
    upstream.close()
    await worker.until(lambda: worker.open == 0)


def run(case: Callable[[Worker, Upstream, str], Awaitable[None]], tmp: Path | None = None) -> None:
    async def main() -> None:
        async with serving(tmp is not None, tmp) as (worker, upstream, url):
            await case(worker, upstream, url)
            await _cap_is_whole(worker, upstream, url)

    asyncio.run(asyncio.wait_for(main(), GUARD))


def test_a_leg_cancelled_while_queued_for_a_slot() -> None:
    async def case(worker: Worker, upstream: Upstream, url: str) -> None:
        worker.mode = "gate"
        holders = [asyncio.create_task(leg(upstream, url)) for _ in range(CAP)]
        await worker.until(lambda: worker.in_flight == CAP)
        queued = asyncio.create_task(leg(upstream, url))
        await asyncio.sleep(0.05)
        await _cancelled(queued)
        worker.gate.set()
        assert await asyncio.gather(*holders) == [b"ok"] * CAP

    run(case)


def test_a_leg_handed_a_slot_as_it_is_cancelled() -> None:
    async def case(worker: Worker, upstream: Upstream, url: str) -> None:
        worker.mode = "answer"
        posts = [upstream.post(url, b"{}", {}) for _ in range(CAP)]
        for post in posts:
            await post.__aenter__()
        queued = asyncio.create_task(leg(upstream, url))
        await asyncio.sleep(0.05)
        # In one step: a slot freed (handed to the queued leg) and that leg cancelled.
        await posts[0].__aexit__(None, None, None)
        queued.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await queued
        for post in posts[1:]:
            await post.__aexit__(None, None, None)

    run(case)


def test_a_leg_that_waits_past_the_queue_timeout() -> None:
    async def case(worker: Worker, upstream: Upstream, url: str) -> None:
        worker.mode = "gate"
        holders = [asyncio.create_task(leg(upstream, url)) for _ in range(CAP)]
        await worker.until(lambda: worker.in_flight == CAP)
        short = Upstream(limits=Limits(max_connections=CAP, queue_timeout=0.05))
        short._pools = upstream._pools  # the same slots, a short queue
        with pytest.raises(UpstreamUnreachable):
            await leg(short, url)
        worker.gate.set()
        await asyncio.gather(*holders)

    run(case)


def test_a_leg_cancelled_mid_connect(tmp_path: Path) -> None:
    async def case(worker: Worker, upstream: Upstream, url: str) -> None:
        task = asyncio.create_task(leg(upstream, url))
        await worker.until(lambda: worker.accepted == 1)  # the handshake is held
        await _cancelled(task)

    run(case, tmp_path)


@pytest.mark.parametrize("mode", ["hold", "status", "body"])
def test_a_leg_cancelled_mid_answer(mode: str) -> None:
    # Before the head, mid-head (its status line alone), and mid-body.
    async def case(worker: Worker, upstream: Upstream, url: str) -> None:
        worker.mode = mode
        task = asyncio.create_task(leg(upstream, url))
        await worker.until(lambda: worker.in_flight == 1)
        await asyncio.sleep(0.05)  # what the worker wrote has arrived
        await _cancelled(task)

    run(case)


def test_a_leg_cancelled_as_its_connection_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    # The cancellation comes as the connect ends: it must reach the leg, which gives back
    # its slot, and not be lost while the leg goes on for a client that left (Python
    # 3.11's wait_for returned the connection and dropped the cancellation).
    made = Connection.connection_made
    task: asyncio.Task[bytes] | None = None

    def connection_made(self: Connection, transport: asyncio.BaseTransport) -> None:
        made(self, transport)
        loop = asyncio.get_running_loop()
        assert task is not None
        cancel = task.cancel

        def next_turn() -> None:
            loop.call_soon(cancel)

        # Two turns of the loop on: the connect has returned, its caller not yet resumed.
        loop.call_soon(next_turn)

    async def case(worker: Worker, upstream: Upstream, url: str) -> None:
        nonlocal task
        worker.mode = "hold"  # were the leg to go on, it would wait here for good
        monkeypatch.setattr(Connection, "connection_made", connection_made)
        task = asyncio.create_task(leg(upstream, url))
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), ALL_AT_ONCE)
        monkeypatch.undo()

    run(case)


def test_a_post_cancelled_before_its_block_takes_nothing() -> None:
    # An answer handed out of its block's coroutine, then cancelled before the caller
    # entered a block, held its slot for good: a post takes nothing until entered.
    async def case(worker: Worker, upstream: Upstream, url: str) -> None:
        async def late() -> None:
            post = upstream.post(url, b"{}", {})
            await asyncio.sleep(GUARD)  # cancelled here
            async with post:
                pass

        task = asyncio.create_task(late())
        await asyncio.sleep(0.05)
        await _cancelled(task)
        assert worker.accepted == 0

    run(case)
