"""An OpenAI-compatible P/D proxy in front of ``vllm serve`` workers, with the policy applied.

It serves ``POST /v1/chat/completions`` and ``POST /v1/completions`` through a
prefill worker and a decode worker it picks per request, ``GET /v1/models``
(the prefill worker's) and ``GET /health``. Built on ``aiohttp`` (client and
server), which vLLM itself depends on.

Per request it: reads the body as the policy sees it
(:func:`~pd_policy_vllm.http.request.policy_request`); picks the first decode
worker that can serve it (:func:`pd_policy.select_decode_workers`) and builds
the core's decode leg; plans the handoff; runs the sanitised prefill leg
(unless n>1); relays the KV parameters it returned and checks the handoff; and
sends the decode leg, streaming its server-sent events back when the client
asked for ``stream``. Every refusal is an OpenAI error body with the error-code
header, before any worker is called where the policy can tell. A client that
disconnects cancels both legs: their connections close, and vLLM aborts a
request whose client is gone.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Final

import aiohttp
from aiohttp import web

from pd_policy import (
    DecodeCandidate,
    MalformedRequest,
    PolicyError,
    WorkerFailedToStart,
    WorkerStreamError,
)

from .codec import dumps, loads
from .legs import Leg
from .plan import decode_leg, plan_request
from .request import Route
from .workers import HttpWorker

__all__ = ["REQUEST_ID_HEADER", "Proxy"]

#: The header vLLM takes a request's id from; both legs of a request carry the same.
REQUEST_ID_HEADER: Final = "X-Request-Id"
_SESSION: Final = web.AppKey("session", aiohttp.ClientSession)
_JSON: Final = "application/json"


def _error_response(error: PolicyError) -> web.Response:
    return web.json_response(error.to_body(), status=error.status, headers=error.headers())


async def _worker_error(leg: str, response: aiohttp.ClientResponse) -> WorkerFailedToStart:
    # The worker's own message (vLLM's OpenAI error body), without its request body.
    try:
        detail = str((await response.json())["error"]["message"])
    except Exception:
        detail = (await response.text())[:500]
    return WorkerFailedToStart(leg, detail=detail, http_status=response.status)


class Proxy:
    """The proxy: a prefill worker, decode workers in order of preference, and whether the
    served model's positions are M-RoPE (its image requests then name their grid, and a
    language-model-only decode worker that cannot take it is refused before prefill).

    ``trace_configs`` are handed to the ``aiohttp`` client session (tests record the
    legs with one).
    """

    def __init__(
        self,
        prefill: HttpWorker,
        decode: Sequence[HttpWorker],
        *,
        mrope: bool,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
    ) -> None:
        if not decode:
            raise ValueError("the proxy needs at least one decode worker")
        self.prefill = prefill
        self.candidates = [DecodeCandidate(w.capability, w) for w in decode]
        self.mrope = mrope
        self._trace_configs = list(trace_configs)

    def app(self) -> web.Application:
        """The ``aiohttp`` application; its client session lives as long as it does."""
        app = web.Application(client_max_size=256 * 2**20)
        app.router.add_post(Route.CHAT.value, self._chat)
        app.router.add_post(Route.COMPLETIONS.value, self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.cleanup_ctx.append(self._session)
        return app

    async def _session(self, app: web.Application) -> Any:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
        async with aiohttp.ClientSession(
            timeout=timeout, trace_configs=self._trace_configs or None
        ) as session:
            app[_SESSION] = session
            yield

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _models(self, request: web.Request) -> web.Response:
        session = request.app[_SESSION]
        try:
            async with session.get(f"{self.prefill.url}/v1/models") as response:
                return web.json_response(await response.json(), status=response.status)
        except aiohttp.ClientError as exc:
            return _error_response(WorkerFailedToStart("prefill", detail=str(exc), http_status=503))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, Route.CHAT)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, Route.COMPLETIONS)

    async def _serve(self, request: web.Request, route: Route) -> web.StreamResponse:
        request_id = request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
        try:
            body = loads(await request.read())  # not an object: plan_request refuses it
            leg = await self._legs(request.app[_SESSION], body, route, request_id)
        except PolicyError as exc:
            return _error_response(exc)
        worker, decode = leg
        return await self._decode(
            request, worker, decode, request_id, stream=bool(body.get("stream"))
        )

    async def _legs(
        self, session: aiohttp.ClientSession, body: Any, route: Route, request_id: str
    ) -> tuple[HttpWorker, Leg]:
        plan = plan_request(
            body, route, self.candidates, self.prefill.kv, mrope=self.mrope, request_id=request_id
        )
        response = None
        if plan.prefill is not None:
            response = await self._post(
                session, "prefill", self.prefill, route.value, plan.prefill, request_id
            )
        return plan.decode.handle, decode_leg(plan, response)

    async def _post(
        self,
        session: aiohttp.ClientSession,
        name: str,
        worker: HttpWorker,
        path: str,
        body: dict[str, Any],
        request_id: str,
    ) -> Any:
        try:
            async with session.post(
                worker.url + path,
                data=dumps(body),
                headers={REQUEST_ID_HEADER: request_id, "Content-Type": _JSON},
            ) as response:
                if response.status != 200:
                    raise await _worker_error(name, response)
                raw = await response.read()
        except aiohttp.ClientError as exc:
            raise WorkerFailedToStart(name, detail=str(exc), http_status=503) from exc
        try:
            return loads(raw, what=f"the {name} response")
        except MalformedRequest as exc:
            raise WorkerStreamError(name, detail=exc.message, http_status=502) from None

    async def _decode(
        self, request: web.Request, worker: HttpWorker, leg: Leg, request_id: str, *, stream: bool
    ) -> web.StreamResponse:
        session = request.app[_SESSION]
        headers = {REQUEST_ID_HEADER: request_id, "Content-Type": _JSON}
        out: web.StreamResponse | None = None
        try:
            async with session.post(
                worker.url + leg.route, data=dumps(leg.body), headers=headers
            ) as up:
                if up.status != 200:
                    return _error_response(await _worker_error("decode", up))
                if not stream:
                    # The worker's answer is the client's, byte for byte: no parse, no dump.
                    return web.Response(body=await up.read(), content_type=_JSON)
                out = web.StreamResponse(
                    headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
                )
                await out.prepare(request)
                async for chunk in up.content.iter_any():
                    # A client gone mid-stream raises here (or cancels this task): leaving
                    # the block closes the upstream connection, and vLLM aborts the request.
                    await out.write(chunk)
        except aiohttp.ClientError as exc:
            error = WorkerStreamError("decode", detail=str(exc), http_status=502)
            if out is None:
                return _error_response(error)
            # Mid-stream: the status line is gone, so the error is the stream's last event.
            event = dumps(error.to_body())
            await out.write(b"data: " + event + b"\n\ndata: [DONE]\n\n")
        assert out is not None
        await out.write_eof()
        return out
