"""Every malformed body is a typed 4xx, never a 5xx from the proxy itself: hostile bodies
([`hostile_bodies`][]) sent in batches to a live proxy in front of stand-in workers that
always answer a well-formed 200 (so any 5xx is the proxy's own). After each batch the
proxy still answers ``GET /health``. And the mutations reach each of their classes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final

import aiohttp
import pytest
from aiohttp import web
from hostile_bodies import CLASSES, NONE, Example, hostile
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from pd_policy import KvConnectorMode, PrefillKv, Support, WorkerCapability
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.media.fetch import RemoteMedia
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.openai.wire import codec
from pd_policy_vllm.openai.wire.strict import MAX_DEPTH

#: Examples of the live property: each is a batch of up to three requests through the proxy,
#: so fewer than the profile's 600 keep it well under a minute (the fuzz profile's many
#: more are for the properties without I/O).
LIVE_EXAMPLES: Final = 300
#: Each a batch's guard against a hang: far above what a batch takes.
GUARD: Final = 30.0
_ROUTES: Final = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
_EVENT_STREAM: Final = {"Content-Type": "text/event-stream"}
#: A whole NIXL handoff, as vLLM's prefill returns it.
_HANDOFF: Final = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [1],
                   "remote_host": "127.0.0.1", "remote_port": 5600}  # fmt: skip


def _answer(route: str) -> dict[str, Any]:
    # As a vLLM worker answers a prefill (ids, the handoff) and a decode, all at once.
    choice = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "text": "ok",
              "prompt_token_ids": [1, 2], "finish_reason": "stop"}  # fmt: skip
    return {"id": "x", "object": route, "model": "m", "choices": [choice],
            "prompt_token_ids": [1, 2], "kv_transfer_params": _HANDOFF,
            "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
            "output": [], "status": "completed"}  # fmt: skip


def _worker(calls: list[bytes], answer: bytes | None = None) -> Any:
    """A stand-in worker that records each body it gets in ``calls`` and answers ``answer``
    (a well-formed 200 by default: as events for a request that streams)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        calls.append(raw)
        if answer is not None:
            return web.Response(body=answer, content_type="application/json")
        try:
            streams = json.loads(raw).get("stream") is True
        except (ValueError, AttributeError):
            streams = False
        whole = json.dumps(_answer(request.path)).encode()
        if not streams:
            return web.Response(body=whole, content_type="application/json")
        response = web.StreamResponse(headers=_EVENT_STREAM)
        await response.prepare(request)
        await response.write(b"data: %s\n\ndata: [DONE]\n\n" % whole)
        await response.write_eof()
        return response

    return handle


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
async def live_proxy(
    calls: list[bytes] | None = None, prefill_answer: bytes | None = None
) -> AsyncIterator[str]:
    """A proxy over a prefill and a language-model-only decode stand-in (each body they get
    recorded in ``calls``; the prefill answering ``prefill_answer`` when given), its
    clients' uuids scoped, remote media sent on uncached (nothing fetched)."""
    calls = calls if calls is not None else []
    async with contextlib.AsyncExitStack() as stack:
        urls = []
        for answer in (prefill_answer, None):
            app = web.Application(client_max_size=1 << 24)
            for route in _ROUTES:
                app.router.add_post(route, _worker(calls, answer))
            urls.append(await stack.enter_async_context(_site(app)))
        proxy = Proxy(
            HttpWorker(urls[0], kv=PrefillKv(KvConnectorMode.NIXL)),
            [HttpWorker(urls[1], WorkerCapability(Support.FALSE))],
            mrope=False, log_requests=False, remote_media=RemoteMedia.UNCACHED,
        )  # fmt: skip
        yield await stack.enter_async_context(_site(proxy.app()))


async def _send(session: aiohttp.ClientSession, url: str, example: Example) -> tuple[int, str]:
    route, raw, _ = example
    headers = {"Content-Type": "application/json"}
    async with session.post(url + route, data=raw, headers=headers) as response:
        body = await response.read()
        status = response.status
        assert status < 500, (status, body[:300], raw[:200])
        if status < 400:
            return status, ""
        error = json.loads(body)["error"]
        assert set(error) == {"type", "code", "message", "param"}, body
        assert response.headers["X-SMG-Error-Code"] == error["code"]
        return status, error["code"]


async def _exchange(url: str, route: str, raw: bytes) -> tuple[int, dict[str, str], bytes, int]:
    """One request's status, headers and body, and /health's status after it."""
    async with aiohttp.ClientSession() as session:
        headers = {"Content-Type": "application/json"}
        async with session.post(url + route, data=raw, headers=headers) as response:
            answer = response.status, dict(response.headers), await response.read()
        async with session.get(url + "/health") as health:
            return (*answer, health.status)


def _refused(
    route: str, raw: bytes, prefill_answer: bytes | None = None
) -> tuple[Any, list[bytes]]:
    """The error body of ``raw`` sent to ``route`` (asserting it is typed, and the proxy
    still healthy), and the bodies its workers got."""
    calls: list[bytes] = []

    async def main() -> tuple[int, dict[str, str], bytes, int]:
        async with live_proxy(calls, prefill_answer) as url:
            return await asyncio.wait_for(_exchange(url, route, raw), GUARD)

    status, headers, body, health = asyncio.run(main())
    assert health == 200
    assert 400 <= status < 600 and headers["Content-Type"].startswith("application/json"), body
    error = json.loads(body)["error"]
    assert headers["X-SMG-Error-Code"] == error["code"]
    return (status, error["code"], error["param"]), calls


@pytest.mark.parametrize("route", _ROUTES)
@pytest.mark.parametrize("field", ["messages", "prompt", "input", "mm_processor_kwargs"])
def test_a_body_100000_deep_is_a_typed_400_before_any_worker(route: str, field: str) -> None:
    raw = b'{"model": "m", "%s": %s1%s}' % (field.encode(), b"[" * 100_000, b"]" * 100_000)
    assert _refused(route, raw) == ((400, "pd_invalid_request", "body"), [])


def test_cache_salt_written_twice_never_reaches_a_worker() -> None:
    raw = (
        b'{"model": "m", "cache_salt": "a", "cache_salt": "b",'
        b' "messages": [{"role": "user", "content": "hi"}]}'
    )
    assert _refused("/v1/chat/completions", raw) == ((400, "pd_invalid_request", "cache_salt"), [])


@pytest.mark.parametrize("stream", [b'"false"', b'"no"', b"0", b"[]", b'{"a": 1}'])
def test_a_stream_that_is_not_a_boolean_is_a_400(stream: bytes) -> None:
    # vLLM reads "false" as false: a proxy that took it for a stream relayed a whole
    # answer as events.
    raw = b'{"model": "m", "stream": %s, "messages": [{"role": "user", "content": "hi"}]}' % stream
    assert _refused("/v1/chat/completions", raw) == ((400, "pd_invalid_request", "stream"), [])


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 100_000])
def test_a_prefill_whose_handoff_is_nested_too_deep_is_a_typed_502(route: str, depth: int) -> None:
    deep = b"[" * depth + b"]" * depth
    answer = (
        b'{"prompt_token_ids": [1], "choices": [{"prompt_token_ids": [1]}],'
        b' "kv_transfer_params": {"a": %s}}' % deep
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
    (status, code, _), calls = _refused(route, json.dumps(body).encode(), answer)
    assert status == 502 and code.endswith("stream_error") and len(calls) == 1  # no decode


@pytest.fixture(params=[True, False], ids=["msgspec", "stdlib"])
def path(request: pytest.FixtureRequest) -> Iterator[bool]:
    before, codec.USE_MSGSPEC = codec.USE_MSGSPEC, request.param
    try:
        yield request.param
    finally:
        codec.USE_MSGSPEC = before


def test_no_malformed_body_is_a_5xx_and_the_proxy_keeps_answering(path: bool) -> None:
    loop = asyncio.new_event_loop()
    outcomes: Counter[str] = Counter()
    profile = settings.default
    assert profile is not None

    @settings(
        max_examples=min(profile.max_examples, LIVE_EXAMPLES),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(hostile(), min_size=1, max_size=3))
    def batch(examples: list[Example]) -> None:
        for _, _, classes in examples:
            for name in classes:
                event(f"mutation: {name}")

        async def run() -> None:
            results = await asyncio.gather(*(_send(session, url, e) for e in examples))
            for (_, _, classes), (status, code) in zip(examples, results, strict=True):
                outcomes[f"{status} {code}".strip()] += 1
                event(f"answer: {status} {code}".strip())
                if NONE in classes:
                    outcomes[f"valid: {status}"] += 1
            async with session.get(url + "/health") as health:
                assert health.status == 200

        loop.run_until_complete(asyncio.wait_for(run(), GUARD))

    async def start() -> tuple[contextlib.AsyncExitStack, aiohttp.ClientSession, str]:
        stack = contextlib.AsyncExitStack()
        base = await stack.enter_async_context(live_proxy())
        client = await stack.enter_async_context(aiohttp.ClientSession())
        return stack, client, base

    stack, session, url = loop.run_until_complete(start())
    try:
        batch()
    finally:
        loop.run_until_complete(stack.aclose())
        loop.close()
    print(dict(outcomes))  # shown with -s: what the proxy answered
    # The valid bodies are served, and the malformed ones met the checks, not a worker.
    assert outcomes["valid: 200"] > 0 and outcomes["400 pd_invalid_request"] > 0


#: Examples drawn to measure how often the mutations reach each class: a rate of 10% is
#: then known to about +-1%.
REACH_EXAMPLES: Final = 1000


def test_the_mutations_reach_every_class() -> None:
    counts: Counter[str] = Counter()

    @settings(
        max_examples=REACH_EXAMPLES,
        database=None,
        derandomize=True,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(hostile())
    def draw(example: Example) -> None:
        counts["examples"] += 1
        counts.update(example[2])

    draw()
    rates = {name: counts[name] / counts["examples"] for name in CLASSES}
    print({name: f"{rate:.1%}" for name, rate in rates.items()})  # shown with -s
    assert all(rate >= 0.10 for rate in rates.values()), rates
