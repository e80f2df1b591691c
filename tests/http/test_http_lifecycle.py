"""Liveness, readiness and the drain, against a real ``pd-policy-proxy`` process sent real
signals, over stand-in workers (a slow answer on demand, a health check that fails)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from fleet_stands import Stand, serving
from proxy_process import proxy_command, started
from test_http_fleet import chat

from pd_policy.fleet.health import Health, HealthState
from pd_policy.fleet.readiness import readiness
from pd_policy.fleet.roster import Member


@contextlib.asynccontextmanager
async def proxy_process(*flags: str) -> AsyncIterator[tuple[str, subprocess.Popen[bytes]]]:
    """``pd-policy-proxy`` with ``flags`` on port 0, in its own process: its URL and the
    process ([`started`][proxy_process.started])."""
    async with started(proxy_command(*flags)) as running:
        yield running.url, running.process


async def _get(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.json()


async def _post(url: str, body: Any) -> int:
    async with aiohttp.ClientSession() as session, session.post(
        f"{url}/v1/chat/completions", json=body
    ) as response:  # fmt: skip
        await response.read()
        return response.status


def _flags(prefill: str, decode: str, *more: str) -> list[str]:
    return ["--prefill", prefill, "--decode", decode, "--kv-mode", "nixl", "--no-mrope",
            "--probe-interval", "0.2", *more]  # fmt: skip


def test_sigterm_turns_ready_off_at_once_serves_through_the_pre_stop_then_drains() -> None:
    prefill, decode = Stand("p", lm_only=False), Stand("d")

    async def main() -> None:
        async with serving(prefill.app()) as p, serving(decode.app()) as d:
            flags = _flags(p, d, "--pre-stop-seconds", "2", "--drain-seconds", "10")
            async with proxy_process(*flags) as (url, process):
                assert await _get(f"{url}/ready") == (200, {"ready": True, "why_not": []})
                decode.delay = 3.0  # a request in flight through the whole stop
                slow = asyncio.create_task(_post(url, chat(1)))
                while not decode.calls:
                    await asyncio.sleep(0.02)
                process.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.3)
                status, body = await _get(f"{url}/ready")
                assert status == 503 and body["ready"] is False
                assert body["why_not"][0].startswith("draining")
                assert await _get(f"{url}/health") == (200, {"status": "draining"})
                decode.delay = 0.0
                assert await _post(url, chat(2)) == 200  # within the pre-stop: served
                await asyncio.sleep(2.0)  # the pre-stop is over: the listener is closed
                try:
                    await _post(url, chat(3))
                except aiohttp.ClientConnectionError:
                    pass
                else:
                    raise AssertionError("a new connection was served after the pre-stop")
                assert await slow == 200  # the request in flight finished
                code = await asyncio.to_thread(process.wait, 15)
                assert code == 0

    asyncio.run(main())


def test_a_request_longer_than_the_drain_is_cut_and_the_proxy_still_exits_0() -> None:
    prefill, decode = Stand("p", lm_only=False), Stand("d", delay=30.0)

    async def main() -> None:
        async with serving(prefill.app()) as p, serving(decode.app()) as d:
            flags = _flags(p, d, "--pre-stop-seconds", "0", "--drain-seconds", "1")
            async with proxy_process(*flags) as (url, process):
                slow = asyncio.create_task(_post(url, chat(1)))
                while not decode.calls:
                    await asyncio.sleep(0.02)
                started = time.monotonic()
                process.send_signal(signal.SIGTERM)
                code = await asyncio.to_thread(process.wait, 20)
                took = time.monotonic() - started
                assert code == 0 and took < 20  # not the 30 s the request would take
                try:
                    status = await slow
                except aiohttp.ClientError:
                    status = None
                assert status != 200

    asyncio.run(main())


def test_ready_is_503_while_a_role_has_no_routable_worker_and_says_which() -> None:
    prefill, decode = Stand("p", lm_only=False), Stand("d", describes=False)

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            p = await stack.enter_async_context(serving(prefill.app()))
            d = await stack.enter_async_context(serving(decode.app()))
            url, _ = await stack.enter_async_context(proxy_process(*_flags(p, d)))
            status, body = await _get(f"{url}/ready")
            assert status == 200 and body["assumed_language_model_only"] == 1
            decode.healthy = False
            deadline = time.monotonic() + 20
            while (await _get(f"{url}/ready"))[0] == 200:
                assert time.monotonic() < deadline, "the ejection never showed"
                await asyncio.sleep(0.1)
            status, body = await _get(f"{url}/ready")
            assert status == 503 and body["why_not"] == ["no routable decode worker"]
            assert (await _get(f"{url}/health"))[0] == 200  # alive all the same
            decode.healthy = True
            while (await _get(f"{url}/ready"))[0] != 200:
                assert time.monotonic() < deadline + 20, "the decode never came back"
                await asyncio.sleep(0.1)

    asyncio.run(main())


def test_the_readiness_rule() -> None:
    def member(role: str, health: Health) -> Member[None]:
        return Member(role, role, None, HealthState(health))

    healthy = [member("prefill", Health.HEALTHY), member("decode", Health.HEALTHY)]
    assert readiness(healthy, draining=False).ready
    assert readiness(healthy, draining=True).why_not == (
        "draining: stopping, its requests in flight finishing",
    )
    for state in (Health.STARTING, Health.EJECTED, Health.DRAINING):
        for role in ("prefill", "decode"):
            members = [m if m.role != role else member(role, state) for m in healthy]
            assert readiness(members, draining=False).why_not == (f"no routable {role} worker",)
    # An encoder is an option: a fleet without one is ready.
    assert readiness([*healthy, member("encode", Health.EJECTED)], draining=False).ready
