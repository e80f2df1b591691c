"""A hostile or broken worker behind a live proxy: the client gets a typed 502 (504 for a
silent worker) promptly, the decode worker is never called, and the proxy goes on
answering everyone else meanwhile. And the per-worker connection cap: legs past it wait
their turn, within a bounded queue."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, Final

import aiohttp
import pytest
from aiohttp import web

from pd_policy import KvConnectorMode, PrefillKv, Support, WorkerCapability
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.flags import parser, upstream_limits
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.http.upstream import DEFAULT_LIMITS, Limits, Upstream, UpstreamUnreachable

GUARD: Final = 15.0
LIMITS: Final = Limits(read_timeout=0.5, max_response_bytes=1 << 16)
CHAT: Final = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
_HEAD: Final = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"


@contextlib.asynccontextmanager
async def _site(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def _raw_worker(answer: bytes | None, hold: bool) -> AsyncIterator[str]:
    """A prefill that reads a request and writes ``answer`` (``None``: nothing), then holds
    its connection open (``hold``, as a hung worker would) or closes it."""

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            if answer is not None:
                writer.write(answer)
            if hold:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(GUARD)
        writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


async def _proxied(
    answer: bytes | None, decoded: list[int], *, hold: bool = True
) -> tuple[int, Any, int]:
    """The client's status and error body for a chat request whose prefill answers
    ``answer``, and /health's status asked while that request was in flight."""

    async def decode(request: web.Request) -> web.Response:
        decoded.append(1)
        return web.json_response({"choices": [{"message": {"content": "ok"}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", decode)
    async with _raw_worker(answer, hold) as prefill, _site(app) as decode_url:
        proxy = Proxy(
            HttpWorker(prefill, kv=PrefillKv(KvConnectorMode.NIXL)),
            [HttpWorker(decode_url, WorkerCapability(Support.FALSE))],
            mrope=False, log_requests=False, limits=LIMITS,
        )  # fmt: skip
        async with _site(proxy.app()) as url, aiohttp.ClientSession() as session:
            chat = asyncio.ensure_future(session.post(f"{url}/v1/chat/completions", json=CHAT))
            await asyncio.sleep(0.05)
            async with session.get(f"{url}/health") as health:
                healthy = health.status
            async with await chat as response:
                return response.status, await response.json(), healthy


HOSTILE: Final = {
    "negative chunk size": _HEAD + b"Transfer-Encoding: chunked\r\n\r\n-1\r\n",
    "oversized chunk size": _HEAD + b"Transfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n",
    "conflicting Content-Length": _HEAD + b"Content-Length: 2\r\nContent-Length: 30\r\n\r\n{}",
    "Content-Length and chunked": _HEAD
    + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "a body past the cap": _HEAD + b"Content-Length: 100000\r\n\r\n" + b" " * 100000,
}


@pytest.mark.parametrize("answer", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_hostile_prefill_is_a_502_and_the_proxy_answers_meanwhile(answer: bytes) -> None:
    decoded: list[int] = []
    status, body, healthy = asyncio.run(asyncio.wait_for(_proxied(answer, decoded), GUARD))
    assert (status, body["error"]["code"], healthy, decoded) == (
        502, "prefill_worker_failed_to_start", 200, []
    )  # fmt: skip


@pytest.mark.parametrize("answer", [_HEAD + b"Content-Length: 50\r\n\r\n{", _HEAD])
def test_a_prefill_that_stops_mid_answer_is_a_502(answer: bytes) -> None:
    decoded: list[int] = []
    run = _proxied(answer, decoded, hold=False)
    status, body, healthy = asyncio.run(asyncio.wait_for(run, GUARD))
    assert (status, body["error"]["code"], healthy, decoded) == (
        502, "prefill_worker_failed_to_start", 200, []
    )  # fmt: skip


@pytest.mark.parametrize("answer", [None, _HEAD + b"Content-Length: 50\r\n\r\n"])
def test_a_silent_prefill_is_a_504_at_the_read_timeout(answer: bytes | None) -> None:
    decoded: list[int] = []
    status, body, healthy = asyncio.run(asyncio.wait_for(_proxied(answer, decoded), GUARD))
    assert (status, body["error"]["code"], healthy, decoded) == (
        504, "prefill_worker_failed_to_start", 200, []
    )  # fmt: skip


async def _concurrent_legs(limits: Limits, legs: int) -> tuple[list[object], int]:
    """``legs`` posts at once to a worker that holds each for a moment; what each got
    (its status or its error) and the most connections the worker had open at once."""
    open_now, most = 0, 0

    async def slow(request: web.Request) -> web.Response:
        nonlocal open_now, most
        open_now += 1
        most = max(most, open_now)
        await asyncio.sleep(0.3)
        open_now -= 1
        return web.Response(body=b"{}")

    app = web.Application()
    app.router.add_post("/v1", slow)
    upstream = Upstream(limits=limits)

    async def leg(url: str) -> object:
        try:
            async with upstream.post(f"{url}/v1", b"{}", {}) as response:
                await response.read()
                return response.status
        except UpstreamUnreachable as exc:
            return type(exc)

    try:
        async with _site(app) as url:
            got = await asyncio.wait_for(asyncio.gather(*(leg(url) for _ in range(legs))), GUARD)
    finally:
        upstream.close()
    return list(got), most


def test_legs_past_the_connection_cap_wait_their_turn() -> None:
    got, most = asyncio.run(_concurrent_legs(Limits(max_connections=2, queue_timeout=10), 5))
    assert (got, most) == ([200] * 5, 2)


def test_a_leg_that_waits_past_the_queue_timeout_is_unreachable() -> None:
    got, most = asyncio.run(_concurrent_legs(Limits(max_connections=1, queue_timeout=0.05), 3))
    assert (sorted(map(str, got)), most) == (
        sorted(["200", str(UpstreamUnreachable), str(UpstreamUnreachable)]), 1
    )  # fmt: skip


def test_the_flags_set_the_workers_limits() -> None:
    argv = ["--prefill", "http://p", "--decode", "http://d"]
    assert upstream_limits(parser().parse_args(argv)) == DEFAULT_LIMITS
    limits = upstream_limits(parser().parse_args([
        *argv, "--worker-read-timeout", "9", "--max-response-mib", "2",
        "--max-connections-per-worker", "3", "--worker-queue-timeout", "4",
    ]))  # fmt: skip
    assert limits == Limits(read_timeout=9, max_response_bytes=2 << 20, max_connections=3,
                            queue_timeout=4)  # fmt: skip
    for flag in ("--worker-read-timeout", "--max-connections-per-worker"):
        with pytest.raises(SystemExit):
            parser().parse_args([*argv, flag, "0"])


def test_json_of_the_error_never_echoes_the_workers_bytes() -> None:
    # The hostile answer's bytes are not the client's business, nor a way to inject.
    answer = _HEAD + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n<script>"
    _, body, _ = asyncio.run(asyncio.wait_for(_proxied(answer, []), GUARD))
    assert "script" not in json.dumps(body)
