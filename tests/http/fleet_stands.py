"""Stand-in ``vllm serve`` workers for the fleet's tests: the faults a real worker cannot be
made to show on demand (a 503 for the next request, a health check that flips, a stream
cut after its first event), with every call recorded.

Each stand-in answers chat as a prefill does (``prompt_token_ids``, ``kv_transfer_params``)
and as a decode does (a completion naming the worker), serves ``/health`` and a
``/server_info`` whose ``language_model_only`` and KV connector the test sets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
from aiohttp import web

from pd_policy import Support, WorkerCapability
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.fleet.members import Fleet
from pd_policy_vllm.http.proxy import Proxy

__all__ = ["Stand", "serving", "stands"]


def _config(lm_only: bool, connector: str, kv: dict[str, Any]) -> dict[str, Any]:
    return {"vllm_config": {
        "model_config": {"multimodal_config": {"language_model_only": lm_only}},
        "kv_transfer_config": {"kv_connector": connector, "engine_id": "engine",
                               "kv_role": "kv_consumer" if lm_only else "kv_producer", **kv},
    }, "vllm_env": {}}  # fmt: skip


@attrs.define
class Stand:
    """One stand-in worker; its behaviour is the test's to set between requests."""

    name: str
    lm_only: bool = True
    connector: str = "NixlConnector"
    #: More of its ``kv_transfer_config`` (``kv_load_failure_policy``, an extra config).
    kv: dict[str, Any] = attrs.field(factory=dict)
    #: Serve /server_info (vLLM's development mode); else a 404, as in production.
    describes: bool = True
    healthy: bool = True
    #: Statuses to answer the next chat requests with, first first (then 200).
    fail_next: list[int] = attrs.field(factory=list)
    #: Cut a streamed answer after its first event.
    cut_stream: bool = False
    #: Seconds each chat request takes.
    delay: float = 0.0
    #: Seconds a streamed answer pauses after its first event (the rest of its tokens).
    stream_pause: float = 0.0
    #: Fail each decode leg as vLLM does when its KV load fails (kv_load_failure_policy
    #: "fail"): a 500 whole, or a stream of the role, then the error event.
    load_fails: bool = False
    calls: list[dict[str, Any]] = attrs.field(factory=list)
    url: str = ""
    in_flight: int = 0
    most_in_flight: int = 0

    def app(self) -> web.Application:
        # vllm serve takes bodies of any size (a large image): aiohttp's default is 1 MiB.
        app = web.Application(client_max_size=2**30)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/responses", self.chat)
        app.router.add_get("/health", self.health)
        app.router.add_get("/server_info", self.info)
        app.router.add_get("/v1/models", self.models)
        app.router.add_route("*", "/{tail:.*}", self.missing)
        return app

    async def missing(self, request: web.Request) -> web.Response:
        return web.Response(status=404)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 500)

    async def info(self, request: web.Request) -> web.Response:
        if not self.describes:
            return web.Response(status=404)
        return web.json_response(_config(self.lm_only, self.connector, self.kv))

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.calls.append({"body": body, "authorization": request.headers.get("Authorization"),
                           "path": request.path,
                           "request_id": request.headers.get("X-Request-Id"),
                           "traceparent": request.headers.get("traceparent"),
                           "tracestate": request.headers.get("tracestate")})  # fmt: skip
        if self.fail_next:
            return web.json_response({"error": {"message": "busy"}}, status=self.fail_next.pop(0))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        if body.get("max_tokens") == 1 and body.get("stream") is False:  # a prefill leg
            # Complete for NIXL (the workers' default contract), and named by the stand.
            params = {"do_remote_prefill": True, "transfer_id": self.name,
                      "remote_engine_id": self.name, "remote_block_ids": [0],
                      "remote_host": "127.0.0.1", "remote_port": 1}  # fmt: skip
            return web.json_response({"prompt_token_ids": [1, 2, 3, 4],
                                      "kv_transfer_params": params})  # fmt: skip
        if self.load_fails:
            return await _failed_load(request, stream=bool(body.get("stream")))
        if not body.get("stream"):
            return web.json_response({"object": "chat.completion", "worker": self.name,
                                      "form": "stripped" if "image_url" not in json.dumps(body)
                                      else "with media"})  # fmt: skip
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"worker": "' + self.name.encode() + b'"}\n\n')
        if self.cut_stream:
            raise ConnectionResetError("cut")  # aiohttp drops the connection
        await asyncio.sleep(self.stream_pause)
        await response.write(b"data: [DONE]\n\n")
        return response


#: vLLM's error body for a request that failed in its engine (a failed KV load among them).
FAILED_LOAD: dict[str, Any] = {"error": {"message": "Internal server error",
                                         "type": "InternalServerError", "param": None,
                                         "code": 500}}  # fmt: skip
#: vLLM's first event of a chat stream: each choice's role, sent with the engine's first
#: output, a failed load's included.
ROLE: bytes = (b'data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,'
               b'"model":"tiny","choices":[{"index":0,"delta":{"role":"assistant",'
               b'"content":""},"logprobs":null,"finish_reason":null}],'
               b'"prompt_token_ids":[1,2,3,4]}\n\n')  # fmt: skip


async def _failed_load(request: web.Request, *, stream: bool) -> web.StreamResponse:
    if not stream:
        return web.json_response(FAILED_LOAD, status=500)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(ROLE)
    await response.write(b"data: " + json.dumps(FAILED_LOAD).encode() + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    return response


@contextlib.asynccontextmanager
async def serving(app: web.Application, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Serve ``app`` on a free port of ``host``; its base URL."""
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def stands(
    prefills: int, decodes: int, make: Callable[[Fleet], Proxy], host: str = "127.0.0.1"
) -> AsyncIterator[tuple[str, list[Stand], list[Stand], Proxy]]:
    """Stand-in prefills (full vision) and decodes (language-model-only) behind a proxy
    ``make`` builds on their fleet; the proxy's URL, the stands and the proxy."""
    ps = [Stand(f"p{i}", lm_only=False) for i in range(prefills)]
    ds = [Stand(f"d{i}") for i in range(decodes)]
    async with contextlib.AsyncExitStack() as stack:
        for stand in ps + ds:
            stand.url = await stack.enter_async_context(serving(stand.app(), host))
        fleet = Fleet()
        for stand in ps:
            fleet.add(
                "prefill", HttpWorker(stand.url, WorkerCapability(Support.TRUE)), healthy=True
            )
        for stand in ds:
            fleet.add(
                "decode", HttpWorker(stand.url, WorkerCapability(Support.FALSE)), healthy=True
            )
        proxy = make(fleet)
        url = await stack.enter_async_context(serving(proxy.app(), host))
        yield url, ps, ds, proxy
