"""An OpenAI-compatible P/D proxy in front of ``vllm serve`` workers, with the policy applied.

It serves ``POST /v1/chat/completions`` and ``POST /v1/completions`` through a
prefill worker and a decode worker it picks per request, ``GET /v1/models``
(the prefill worker's) and ``GET /health``. Built on ``aiohttp`` (client and
server), which vLLM itself depends on.

Per request it: reads the body as the policy sees it
([`policy_request`][pd_policy_vllm.http.request.policy_request]); picks the first decode
worker that can serve it
([`pd_policy.select_decode_workers`][pd_policy.selection.select_decode_workers]) and builds
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

from pd_policy import (
    DecodeCandidate,
    PolicyError,
    WorkerFailedToStart,
)

from .aio import aiohttp, web
from .codec import loads
from .legs import Leg
from .pin import RemoteMedia, pin_remote_media, refuse_remote_media
from .plan import Plan, decode_leg, plan_encoded, plan_rendered, plan_request
from .relay import REQUEST_ID_HEADER, error_response, post_json, relay_decode
from .request import Route
from .scale_out import GENERATE, RENDER
from .workers import HttpWorker

__all__ = ["REQUEST_ID_HEADER", "Proxy"]

_SESSION: Final = web.AppKey("session", aiohttp.ClientSession)


class Proxy:
    """The proxy: a prefill worker, decode workers in order of preference, and whether the
    served model's positions are M-RoPE (its image requests then name their grid, and a
    language-model-only decode worker that cannot take it is refused before prefill).

    ``encoder``: an encoder-only worker (vLLM's ``ec_producer``, with
    ``--enable-scale-out``), whose cache the prefill worker consumes. Chat requests
    with media then run E/P/D (see [`encode`][pd_policy_vllm.http.encode]).

    ``remote_media``: what it does with a remote media URL the client did not name by a
    ``uuid`` ([`RemoteMedia`][pd_policy_vllm.http.pin.RemoteMedia]); by default it
    fetches the item once for every leg when it knows the prefill worker's media rules
    (``prefill.media.rules.known``), and leaves it uncached otherwise.

    ``trace_configs`` are handed to the ``aiohttp`` client session (tests record the
    legs with one).
    """

    def __init__(
        self,
        prefill: HttpWorker,
        decode: Sequence[HttpWorker],
        *,
        mrope: bool,
        encoder: HttpWorker | None = None,
        remote_media: RemoteMedia | None = None,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
    ) -> None:
        if not decode:
            raise ValueError("the proxy needs at least one decode worker")
        known = prefill.media.rules.known
        if remote_media is None:
            remote_media = RemoteMedia.FETCH if known else RemoteMedia.UNCACHED
        if remote_media is RemoteMedia.FETCH and not known:
            raise ValueError("fetching remote media needs the prefill worker's media rules")
        self.remote_media = remote_media
        self.prefill = prefill
        self.encoder = encoder
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
            error = WorkerFailedToStart("prefill", detail=str(exc), http_status=503)
            return error_response(error)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, Route.CHAT)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, Route.COMPLETIONS)

    async def _serve(self, request: web.Request, route: Route) -> web.StreamResponse:
        request_id = request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
        session = request.app[_SESSION]
        try:
            body = loads(await request.read())  # not an object: plan_request refuses it
            worker, leg = await self._legs(session, body, route, request_id)
        except PolicyError as exc:
            return error_response(exc)
        stream = bool(body.get("stream"))
        return await relay_decode(request, session, worker.url, leg, request_id, stream=stream)

    async def _legs(
        self, session: aiohttp.ClientSession, body: Any, route: Route, request_id: str
    ) -> tuple[HttpWorker, Leg]:
        encoder = self.encoder
        media = self.prefill.media
        plan = self._plan(body, route, request_id)
        if plan.uncached and self.remote_media is RemoteMedia.REFUSE:
            refuse_remote_media(body, media.rules)
        if plan.uncached and plan.prefill is not None and self.remote_media is RemoteMedia.FETCH:
            # Fetched once, after every refusal the policy can make without it: the same
            # bytes to every leg, and an identity that is their hash.
            plan = self._plan(await pin_remote_media(session, body, media.rules), route, request_id)
        prefill = self.prefill.url
        if plan.render is not None:
            # In E/P/D the encoder renders: the hashes it stores under are the rendered ones.
            leg, url = ("encode", encoder.url) if encoder and plan.epd else ("prefill", prefill)
            rendered = await post_json(session, leg, url + RENDER, plan.render, request_id)
            plan = plan_rendered(plan, rendered)
        if plan.encode is not None and encoder is not None:
            answer = await post_json(
                session, "encode", encoder.url + GENERATE, plan.encode, request_id
            )
            plan = plan_encoded(plan, answer)
        response = None
        if plan.prefill is not None:
            url = prefill + plan.prefill_route
            response = await post_json(session, "prefill", url, plan.prefill, request_id)
        return plan.decode.handle, decode_leg(plan, response)

    def _plan(self, body: Any, route: Route, request_id: str) -> Plan[HttpWorker]:
        return plan_request(
            body, route, self.candidates, self.prefill.kv, mrope=self.mrope,
            request_id=request_id, renders=self.prefill.renders,
            encodes=self.encoder is not None, media=self.prefill.media,
        )  # fmt: skip
