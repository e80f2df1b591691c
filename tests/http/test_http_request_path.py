"""Following one request through the proxy: which modules it visits, and how often it comes
back to one it had left.

A request is traced with ``sys.setprofile``: every fresh call into the adapter's code
(``src/pd_policy_vllm``; a coroutine resumed is the place it was, and a comprehension is
part of its function) is a visit to that call's module. Consecutive visits to one module
are one *place*; a place in a module visited before is a *return*. The core's calls are
not counted: a call into the core is one step of the adapter's. Measured on an image chat
request through a prefill and a language-model-only decode (stand-ins), the path was 64
places in 19 modules with 46 returns before every router drove an exchange (the issue
counted 64, 20 and 44); the bounds below hold it where it is now.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
from aiohttp import web

import pd_policy_vllm
from pd_policy import KvConnectorMode, PrefillKv, Support, WorkerCapability
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.openai.workers import HttpWorker

ADAPTER = str(Path(pd_policy_vllm.__file__).resolve().parent) + "/"
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
CONTENT = [IMAGE, {"type": "text", "text": "hi"}]
BODY = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": CONTENT}]}


async def _prefill(request: web.Request) -> web.Response:
    await request.read()
    kv = {"do_remote_prefill": True, "transfer_id": "t"}
    return web.json_response({"prompt_token_ids": [1, 2, 3], "kv_transfer_params": kv})


async def _decode(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"choices": [{"message": {"content": "ok"}}]})


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]


def _app(handler: Any) -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    return app


async def _trace() -> list[str]:
    prefill, prefill_url = await _serve(_app(_prefill))
    decode, decode_url = await _serve(_app(_decode))
    prefill_worker = HttpWorker(prefill_url, kv=PrefillKv(KvConnectorMode.TRANSFER))
    decode_worker = HttpWorker(decode_url, WorkerCapability(Support.FALSE))
    proxy = Proxy(prefill_worker, [decode_worker], mrope=False, log_requests=False)
    runner, url = await _serve(proxy.app())
    visits: list[str] = []
    frames: dict[int, FrameType] = {}

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(ADAPTER):
            return
        if id(frame) in frames or code.co_name.startswith("<"):
            return  # a coroutine resumed, or a comprehension: the place it is part of
        frames[id(frame)] = frame  # kept alive, so that its id names it alone
        visits.append(code.co_filename[len(ADAPTER) :])

    try:
        async with aiohttp.ClientSession() as session:
            for traced in (False, True):  # the first request warms every cache up
                if traced:
                    sys.setprofile(profile)
                try:
                    async with session.post(f"{url}/v1/chat/completions", json=BODY) as answer:
                        assert answer.status == 200, await answer.text()
                        await answer.read()
                finally:
                    sys.setprofile(None)
    finally:
        for each in (runner, prefill, decode):
            await each.cleanup()
    return [m for i, m in enumerate(visits) if i == 0 or visits[i - 1] != m]


def test_a_request_through_the_proxy_visits_each_module_about_once() -> None:
    # The path of a request, not of the process's logging: another test's imports (Ray's)
    # may have turned INFO records on, whose filter would count as places of the request.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.WARNING)
    try:
        places = asyncio.run(_trace())
    finally:
        root.setLevel(level)
    modules = set(places)
    returns = len(places) - len(modules)
    assert {"http/proxy.py", "http/driver.py", "http/send.py", "http/decode.py"} <= modules
    # The stages share the shaping's leaf modules (JSON, media parts, the legs' bodies),
    # and each leg's client hands its connection back at its end: the returns left. The
    # hostile-client work of issue #42 added fifteen places and twelve returns to the
    # 50 and 24 before it, each a check a request now passes: the strict parse
    # (openai/wire/strict.py: depth, keys written twice), the media items counted before
    # any other work on them and the large ones hashed off the loop (openai/media/parts.py,
    # openai/media/digests.py), a leg written around its long data URLs
    # (openai/wire/splice.py), the legs' client as a block that holds a slot only inside
    # it (http/upstream/response.py), and the decode's answer redacted of the proxy's
    # keys (http/redact.py). Issue #46's observability added five: the client's trace id
    # read for the request's log lines (http/log_format.py), and, tracing off, the
    # client's trace context read to pass on (http/tracing.py; no leg goes through it),
    # and the request's entry, now the driver's (its door and its run in one module).
    # Then three went (the client's trace context is read by the core's trace_context)
    # and three came, one a return: a leg's block is a class rather than an async
    # generator (whose bookkeeping cost the loop twice a request), and its exit is a
    # fresh call into the client after the connection says whether it can be kept.
    assert len(places) <= 71 and returns <= 40, (len(places), returns, " -> ".join(places))
