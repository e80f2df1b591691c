"""The front door's limits against hostile clients on raw sockets, through a live proxy: a body
past the cap (declared or chunked), headers sent a byte at a time, a connection that sends
nothing, and a body sent a byte at a time. Each is cut off, answered with an OpenAI error
body where the client can still read one, and no worker is ever called."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from pd_policy import KvConnectorMode, PrefillKv, Support, WorkerCapability
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.client_gate import GatedRunner
from pd_policy_vllm.http.flags import front_door, parser
from pd_policy_vllm.http.front_door import FrontDoor
from pd_policy_vllm.http.proxy import Proxy

CAP = 64 * 1024
#: Short limits, so the attacks end quickly; each test's hang guard is far above them.
DOOR = FrontDoor(max_body=CAP, header_timeout=0.5, body_timeout=0.5, keepalive_timeout=0.5)
GUARD = 15.0
CHAT = json.dumps({"model": "m", "max_tokens": 1,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()  # fmt: skip


@contextlib.asynccontextmanager
async def _site(app: web.Application, door: FrontDoor | None = None) -> AsyncIterator[int]:
    """``app`` served on 127.0.0.1 (its port), with ``door``'s limits on its clients."""
    runner = (
        web.AppRunner(app, handler_cancellation=True)
        if door is None
        else GatedRunner(app, door, handler_cancellation=True)
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def workers(calls: list[str], delay: float = 0.0) -> AsyncIterator[tuple[str, str]]:
    """A stand-in prefill and decode (their URLs) that record each call in ``calls``; the
    decode answers after ``delay``."""

    async def prefill(request: web.Request) -> web.Response:
        calls.append("prefill")
        await request.read()
        return web.json_response({"prompt_token_ids": [1], "kv_transfer_params": {"t": 1}})

    async def decode(request: web.Request) -> web.Response:
        calls.append("decode")
        await request.read()
        await asyncio.sleep(delay)
        return web.json_response({"choices": [{"message": {"content": "ok"}}]})

    ports = []
    async with contextlib.AsyncExitStack() as stack:
        for handler in (prefill, decode):
            app = web.Application()
            app.router.add_post("/v1/chat/completions", handler)
            ports.append(await stack.enter_async_context(_site(app)))
        yield f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}"


@contextlib.asynccontextmanager
async def proxy(calls: list[str], door: FrontDoor = DOOR, delay: float = 0.0) -> AsyncIterator[int]:
    """A live proxy (its port), run with ``door``'s limits as the CLI runs it, in front of
    the stand-ins of ``workers``."""
    async with workers(calls, delay) as (prefill, decode):
        the_proxy = Proxy(
            HttpWorker(prefill, kv=PrefillKv(KvConnectorMode.NIXL)),
            [HttpWorker(decode, WorkerCapability(Support.FALSE))],
            mrope=False, log_requests=False, front_door=door,
        )  # fmt: skip
        async with _site(the_proxy.app(), door) as port:
            yield port


def run(
    test: Callable[[int, list[str]], Awaitable[None]], door: FrontDoor = DOOR, delay: float = 0.0
) -> list[str]:
    calls: list[str] = []

    async def main() -> None:
        async with proxy(calls, door, delay) as port:
            await asyncio.wait_for(test(port, calls), GUARD)

    asyncio.run(main())
    return calls


def head(length: int | None = None, *, chunked: bool = False) -> bytes:
    lines = ["POST /v1/chat/completions HTTP/1.1", "Host: proxy", "Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response off the socket: its status, headers (lower-cased) and body."""
    status_line, *lines = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines if x)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(status_line.split()[1]), headers, body


async def closed(reader: asyncio.StreamReader) -> bool:
    """Whether the proxy closed the connection: the read ends (EOF, or a reset)."""
    try:
        return await reader.read() == b""
    except ConnectionResetError:
        return True


async def trickle(writer: asyncio.StreamWriter, data: bytes, sent: list[int]) -> None:
    """Send ``data`` a byte every 50 ms (10 s for 200 bytes), counting the bytes sent."""
    for byte in data:
        writer.write(bytes([byte]))
        await writer.drain()
        sent.append(byte)
        await asyncio.sleep(0.05)


def error_code(status: int, body: bytes) -> tuple[int, str]:
    error = json.loads(body)["error"]
    assert set(error) == {"type", "code", "message", "param"}
    return status, error["code"]


def test_a_body_declared_over_the_cap_is_a_413_before_any_of_it_is_sent() -> None:
    async def test(port: int, calls: list[str]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head(CAP + 1))  # and not a byte of the body
        status, headers, body = await answer(reader)
        assert error_code(status, body) == (413, "pd_body_too_large")
        assert (
            headers["connection"] == "close" and headers["x-smg-error-code"] == "pd_body_too_large"
        )
        writer.close()

    assert run(test) == []


def test_a_chunked_body_past_the_cap_is_a_413() -> None:
    async def test(port: int, calls: list[str]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head(chunked=True))
        chunk = b"x" * 4096
        for _ in range(CAP // len(chunk) + 1):  # one chunk past the cap
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        writer.write(b"0\r\n\r\n")
        status, _, body = await answer(reader)
        assert error_code(status, body) == (413, "pd_body_too_large")
        writer.close()

    assert run(test) == []


def test_a_body_of_the_cap_exactly_is_served() -> None:
    async def test(port: int, calls: list[str]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head(CAP) + CHAT + b" " * (CAP - len(CHAT)))  # JSON may end in blanks
        status, _, body = await answer(reader)
        assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "ok"
        writer.close()

    assert run(test) == ["prefill", "decode"]


def test_headers_sent_a_byte_at_a_time_are_cut_off_at_the_header_timeout() -> None:
    async def test(port: int, calls: list[str]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        data = head(len(CHAT)).replace(b"Host: proxy", b"Host: " + b"p" * 150)
        sent: list[int] = []
        sending = asyncio.create_task(trickle(writer, data, sent))
        assert await closed(reader)
        # Closed while the head was still coming, not because it ended.
        assert not sending.done() and len(sent) < len(data)
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await sending
        writer.close()

    assert run(test) == []


def test_a_connection_that_sends_nothing_is_closed_at_the_keepalive_timeout() -> None:
    async def test(port: int, calls: list[str]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await closed(reader)
        writer.close()

    assert run(test) == []


def test_a_kept_alive_connection_is_served_again_then_closed_when_idle() -> None:
    async def test(port: int, calls: list[str]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):  # the timeout is the head's, not the connection's
            writer.write(head(len(CHAT)) + CHAT)
            status, _, _ = await answer(reader)
            assert status == 200
        assert await closed(reader)
        writer.close()

    assert run(test) == ["prefill", "decode"] * 2


def test_a_body_sent_a_byte_at_a_time_is_a_408_and_the_connection_closed() -> None:
    async def test(port: int, calls: list[str]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = CHAT + b" " * 200
        writer.write(head(len(body)) + body[:10])
        sent: list[int] = []
        sending = asyncio.create_task(trickle(writer, body[10:], sent))
        status, headers, answered = await answer(reader)
        assert error_code(status, answered) == (408, "pd_client_timeout")
        assert headers["connection"] == "close"
        at_answer = len(sent)
        assert await closed(reader)
        # Closed at once: not read on for aiohttp's lingering time (10 s, 200 more bytes).
        assert not sending.done() and len(sent) - at_answer < 20
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await sending
        writer.close()

    assert run(test) == []


def test_the_flags_set_the_limits_and_refuse_a_limit_that_is_not_positive(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--prefill", "http://p", "--decode", "http://d"]
    assert front_door(parser().parse_args(argv)) == FrontDoor()
    door = front_door(parser().parse_args([*argv, "--max-body-mib", "1", "--header-timeout",
                                           "5", "--body-timeout", "7.5", "--keepalive-timeout",
                                           "90", "--max-client-connections", "9"]))  # fmt: skip
    assert door == FrontDoor(max_body=2**20, header_timeout=5.0, body_timeout=7.5,
                             keepalive_timeout=90.0, max_connections=9)  # fmt: skip
    assert door.server_args() == {"keepalive_timeout": 90.0}
    for flag in ("--body-timeout", "--keepalive-timeout", "--max-client-connections"):
        with pytest.raises(SystemExit):
            parser().parse_args([*argv, flag, "0"])
    assert "must be positive" in capsys.readouterr().err
