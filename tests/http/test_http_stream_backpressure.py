"""A streamed answer is relayed at the client's pace: a client that stops reading stops the
proxy reading its worker, so what the proxy holds for it is a small window, not the
worker's whole answer. And a fast stream still arrives whole and in order.

The worker is a raw socket server that writes an event stream without end and counts the
bytes its socket took; the clients are raw sockets that send a streaming chat request
and then never read again. The proxy runs in this process: its memory is this process's
resident set (``/proc/self/statm``), read before and during the attack.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import AsyncIterator
from typing import Final

from aiohttp import web

from pd_policy import KvConnectorMode, PrefillKv, Support, WorkerCapability
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.http.upstream import Limits

GUARD: Final = 60.0
#: The attack's clients: each would cost the proxy the response cap without flow control.
CLIENTS: Final = 3
#: The response cap of the test's proxy: what each stalled stream cost before the fix.
CAP: Final = 64 * 2**20
#: A stream the proxy does not read on for a while fails at the read timeout: soon.
LIMITS: Final = Limits(max_response_bytes=CAP, read_timeout=5.0)
#: A worker's event: about 16 KiB, as a long answer's events come back to back.
EVENT: Final = b"data: " + json.dumps({"choices": [{"delta": {"content": "x" * 16000}}]}).encode()
STREAM: Final = json.dumps({"model": "m", "max_tokens": 10**6, "stream": True,
                            "messages": [{"role": "user", "content": "hi"}]}).encode()  # fmt: skip
_PAGE: Final = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class EndlessWorker:
    """A decode worker that answers every request with an event stream that never ends (or
    ``events`` events, then ``[DONE]`` and the last chunk), counting the bytes its sockets
    took."""

    def __init__(self, events: int | None = None) -> None:
        self.events, self.written = events, 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
            sent = 0
            while self.events is None or sent < self.events:
                event = EVENT.replace(b"x" * 8, b"%08d" % sent, 1) + b"\n\n"
                writer.write(_chunk(event))
                await writer.drain()
                # Taken by the socket: the drain waits while it takes no more.
                self.written += len(event)
                sent += 1
            writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\nX-Trailer: 1\r\n\r\n")
            await writer.drain()
            await reader.read()  # until the proxy closes or reuses the connection
        writer.close()


@contextlib.asynccontextmanager
async def _site(app: web.Application) -> AsyncIterator[int]:
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def proxy(worker: EndlessWorker) -> AsyncIterator[int]:
    """A live proxy whose decode worker is ``worker``, with a response cap of ``CAP``."""

    async def prefill(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"prompt_token_ids": [1], "kv_transfer_params": {"t": 1}})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", prefill)
    server = await asyncio.start_server(worker.serve, "127.0.0.1", 0)
    decode = server.sockets[0].getsockname()[1]
    try:
        async with _site(app) as prefill_port:
            the_proxy = Proxy(
                HttpWorker(f"http://127.0.0.1:{prefill_port}", kv=PrefillKv(KvConnectorMode.NIXL)),
                [HttpWorker(f"http://127.0.0.1:{decode}", WorkerCapability(Support.FALSE))],
                mrope=False, log_requests=False, limits=LIMITS,
            )  # fmt: skip
            async with _site(the_proxy.app()) as port:
                yield port
    finally:
        server.close()


def _request(port: int) -> bytes:
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(STREAM)}\r\n\r\n"
            ).encode() + STREAM  # fmt: skip


async def _stalled_client(port: int) -> socket.socket:
    """A client that sends a streaming request and never reads: its socket, left open."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)  # before the handshake
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, _request(port))
    return sock


async def _settled(worker: EndlessWorker) -> int:
    """The worker's count once it has stopped growing (its socket takes no more), or once
    it is past the attack's whole cost."""
    last = -1
    still = 0
    while still < 5 and worker.written < CLIENTS * CAP:
        await asyncio.sleep(0.2)
        still = still + 1 if worker.written == last else 0
        last = worker.written
    return worker.written


def _kernel_buffers() -> int:
    # What the sockets between worker and client may hold of one stream, at most: the
    # proxy's receive buffer from the worker and send buffer to the client, autotuned up
    # to these maxima, and the worker's and the client's, set small above.
    with open("/proc/sys/net/ipv4/tcp_rmem") as rmem, open("/proc/sys/net/ipv4/tcp_wmem") as wmem:
        return int(rmem.read().split()[2]) + int(wmem.read().split()[2]) + 2**20


def test_clients_that_stop_reading_stop_the_worker_and_cost_a_small_window() -> None:
    async def attack() -> tuple[int, int]:
        worker = EndlessWorker()
        async with proxy(worker) as port:
            before = _rss()
            clients = [await _stalled_client(port) for _ in range(CLIENTS)]
            try:
                written = await _settled(worker)
                grown = _rss() - before
            finally:
                for sock in clients:
                    sock.close()
        return written, grown

    written, grown = asyncio.run(asyncio.wait_for(attack(), GUARD))
    # Each stalled stream holds what the sockets hold and the proxy's window: not the
    # response cap (what it cost before, 3 x 64 MiB here).
    assert written < CLIENTS * (_kernel_buffers() + 2**20), written
    assert grown < CLIENTS * 4 * 2**20, grown


def test_a_stream_read_in_bursts_arrives_whole_and_in_order() -> None:
    # Most of the response cap, far past the window: the client stops three times, so the
    # proxy pauses and resumes its worker; the stream ends with [DONE], then the last
    # chunk and a trailer.
    events = 3 * CAP // 4 // len(EVENT)
    pauses = [4 * 2**20, 16 * 2**20, 28 * 2**20]  # after this much read

    async def bursts() -> tuple[bytes, list[int]]:
        worker = EndlessWorker(events)
        async with proxy(worker) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_request(port))
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head.lower()
            body, stalled = bytearray(), list[int]()
            while True:
                if len(stalled) < len(pauses) and len(body) >= pauses[len(stalled)]:
                    stalled.append(await _settled(worker) - len(body))
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                body += await reader.readexactly(size + 2)
                del body[-2:]
                if size == 0:
                    break
            writer.close()
            return bytes(body), stalled

    body, ahead = asyncio.run(asyncio.wait_for(bursts(), GUARD))
    sent = [EVENT.replace(b"x" * 8, b"%08d" % n, 1) + b"\n\n" for n in range(events)]
    expected = b"".join(sent) + b"data: [DONE]\n\n"
    assert len(body) == len(expected) and body == expected
    # At each pause the worker waited, ahead of the client by what the sockets and the
    # window hold: not on to the end of its stream.
    bound = _kernel_buffers() + 2**20
    assert len(ahead) == 3 and all(0 <= a < bound for a in ahead), (ahead, bound)
    assert pauses[0] + bound < len(expected) - len(sent[-1])  # the bound proves a pause
