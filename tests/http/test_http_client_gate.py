"""The client gate, on real sockets through a live proxy: a cap on the client connections
held at once (one past it gets a 503 ``pd_overloaded`` and is closed, before its request
is read; the held ones are served; a freed slot takes a new one), and a head's deadline
that runs from its first byte, apart from the idle keep-alive time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from typing import Any, Final

import pytest
from test_http_front_door import (
    CHAT,
    GUARD,
    answer,
    closed,
    error_code,
    head,
    run,
    trickle,
    workers,
)

from pd_policy import KvConnectorMode, PrefillKv, Support, WorkerCapability
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http import serving as serving_module
from pd_policy_vllm.http.client_gate import GatedRunner
from pd_policy_vllm.http.flags import front_door, parser
from pd_policy_vllm.http.front_door import FrontDoor
from pd_policy_vllm.http.proxy import Proxy

HELD: Final = 3
#: Long idle keep-alive, short head: a connection held idle outlives a trickled head.
CAPPED: Final = FrontDoor(max_connections=HELD, header_timeout=0.3, keepalive_timeout=4 * GUARD)


async def _served(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    writer.write(head(len(CHAT)) + CHAT)
    status, _, _ = await answer(reader)
    return status


def test_a_connection_past_the_cap_is_a_503_and_closed_and_the_held_ones_are_served() -> None:
    async def test(port: int, calls: list[str]) -> None:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(HELD)]
        for reader, writer in held:  # each counted, and served
            assert await _served(reader, writer) == 200
        served = len(calls)
        for _ in range(2):  # a refused connection holds no slot: the next is refused too
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head(len(CHAT)) + CHAT)
            status, headers, body = await answer(reader)
            assert error_code(status, body) == (503, "pd_overloaded")
            assert headers["connection"] == "close"
            assert headers["x-smg-error-code"] == "pd_overloaded"
            assert await closed(reader)
            writer.close()
        assert len(calls) == served  # no worker saw the refused requests
        assert await _served(*held[0]) == 200  # the held connections are not affected
        held[0][1].close()
        # Its slot frees as the proxy sees it close: a new connection is then served.
        async with asyncio.timeout(GUARD / 2):
            while True:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(head(len(CHAT)) + CHAT)
                status, _, _ = await answer(reader)
                if status == 200:
                    break
                writer.close()
                await asyncio.sleep(0.02)
        writer.close()
        for _, other in held[1:]:
            other.close()

    run(test, CAPPED)


def test_a_refused_client_reads_its_answer_before_it_sends_anything() -> None:
    async def test(port: int, calls: list[str]) -> None:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(HELD)]
        for reader, writer in held:
            assert await _served(reader, writer) == 200
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        status, _, body = await answer(reader)  # nothing sent
        assert error_code(status, body) == (503, "pd_overloaded")
        assert json.loads(body)["error"]["type"]
        assert await closed(reader)
        for _, other in [*held, (reader, writer)]:
            other.close()

    run(test, CAPPED)


async def _cut_while_trickling(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    # A head sent a byte at a time: the proxy closes the connection before it is whole.
    data = head(len(CHAT)).replace(b"Host: proxy", b"Host: " + b"p" * 150)
    sent: list[int] = []
    sending = asyncio.create_task(trickle(writer, data, sent))
    assert await closed(reader)
    assert not sending.done() and len(sent) < len(data)  # cut while the head came
    sending.cancel()
    with contextlib.suppress(asyncio.CancelledError, ConnectionError):
        await sending
    writer.close()


def test_a_trickled_head_is_cut_at_the_header_timeout_while_an_idle_connection_stays() -> None:
    async def test(port: int, calls: list[str]) -> None:
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await _cut_while_trickling(reader, writer)
        # Idle since before the trickle began, past its header timeout: still served.
        assert await _served(idle_reader, idle_writer) == 200
        idle_writer.close()

    run(test, CAPPED)


def test_a_head_trickled_after_a_request_on_its_connection_is_cut_too() -> None:
    # The gate's one timer, armed by the first head's first byte, still runs when the next
    # head begins: when it fires, it must time the head begun since, not let it be.
    async def test(port: int, calls: list[str]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await _served(reader, writer) == 200
        await asyncio.sleep(CAPPED.header_timeout / 3)
        await _cut_while_trickling(reader, writer)

    run(test, CAPPED)


def test_a_request_slower_than_the_header_timeout_is_not_cut() -> None:
    # The head's deadline ends with the head: a long answer is not a slow head.
    async def test(port: int, calls: list[str]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):  # and again on the same connection
            assert await _served(reader, writer) == 200
        writer.close()

    assert run(test, CAPPED, delay=3 * CAPPED.header_timeout) == ["prefill", "decode"] * 2


def test_a_head_begun_with_the_last_request_is_bounded_by_the_keepalive_timeout() -> None:
    # The start of a next head, sent with the request before it: not a whole head, so the
    # connection is closed once it has been idle for the keep-alive timeout.
    async def test(port: int, calls: list[str]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head(len(CHAT)) + CHAT + b"POST /v1/chat/completions HTTP/1.1\r\n")
        status, _, _ = await answer(reader)
        assert status == 200
        assert await closed(reader)
        writer.close()

    run(test, FrontDoor(header_timeout=GUARD, keepalive_timeout=0.3))


def test_an_idle_connection_after_a_request_with_a_body_is_kept() -> None:
    # A body that comes after its head (while its request is served) starts no head's
    # deadline: the connection idles on, for the keep-alive timeout, and serves again.
    async def test(port: int, calls: list[str]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head(len(CHAT)))
        await asyncio.sleep(0.05)
        writer.write(CHAT)
        assert (await answer(reader))[0] == 200
        await asyncio.sleep(3 * CAPPED.header_timeout)
        assert await _served(reader, writer) == 200
        writer.close()

    run(test, CAPPED)


@pytest.mark.parametrize("cap", [1, 2])
def test_the_cap_counts_connections_not_requests(cap: int) -> None:
    # Requests one after another on one connection hold one slot.
    async def test(port: int, calls: list[str]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(cap + 1):
            assert await _served(reader, writer) == 200
        writer.close()

    run(test, FrontDoor(max_connections=cap, keepalive_timeout=GUARD))


def test_the_cli_serves_behind_the_gate_and_ends_on_sigterm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The CLI's own run (not web.run_app, whose runner nothing can put the gate in front
    # of): its cap holds, and SIGTERM ends it, its requests in flight finished first.
    runners: list[GatedRunner] = []

    class Recorded(GatedRunner):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            runners.append(self)

    monkeypatch.setattr(serving_module, "GatedRunner", Recorded)

    async def main() -> None:
        calls: list[str] = []
        async with workers(calls, delay=0.5) as (prefill, decode):
            argv = ["--prefill", prefill, "--decode", decode, "--port", "0",
                    "--max-client-connections", "1", "--no-mrope"]  # fmt: skip
            args = parser().parse_args(argv)
            the_proxy = Proxy(
                HttpWorker(prefill, kv=PrefillKv(KvConnectorMode.NIXL)),
                [HttpWorker(decode, WorkerCapability(Support.FALSE))],
                mrope=False, log_requests=False, front_door=front_door(args),
            )  # fmt: skip
            serving = asyncio.create_task(serving_module._serve(args, the_proxy))
            while not (runners and runners[0].addresses):
                await asyncio.sleep(0.01)
            port = runners[0].addresses[0][1]
            held = await asyncio.open_connection("127.0.0.1", port)
            in_flight = asyncio.create_task(_served(*held))
            while "decode" not in calls:
                await asyncio.sleep(0.01)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            status, _, body = await answer(reader)
            assert error_code(status, body) == (503, "pd_overloaded")
            writer.close()
            os.kill(os.getpid(), signal.SIGTERM)
            assert await in_flight == 200  # drained, not cut
            await serving
            assert await closed(held[0])
            held[1].close()

    asyncio.run(asyncio.wait_for(main(), GUARD))
