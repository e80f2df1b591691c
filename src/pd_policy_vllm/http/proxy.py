"""An OpenAI-compatible P/D proxy in front of a fleet of ``vllm serve`` workers, with the
policy applied.

It serves ``POST /v1/chat/completions`` and ``POST /v1/completions`` through a
prefill worker and a decode worker (and an encoder, in E/P/D) it chooses per request
from its fleet, ``GET /v1/models``, ``GET /health`` and ``GET /metrics``, and with
``admin`` the fleet's routes (``/admin/workers``). On ``aiohttp``, a vLLM dependency.

Per request: the client's key is checked (when keys are set); the fleet chooses the
members ([`choose_members`][pd_policy_vllm.http.fleet.routing.choose_members]: compatible,
routable, affinity or load); the attempt runs the legs before decode
([`Attempt`][pd_policy_vllm.http.attempt.Attempt]); the decode leg is relayed to the
client. A failure before the client has seen a byte is tried again on other members
when the core's lifecycle says so ([`pd_policy.fail`][pd_policy.lifecycle.fail]): a
worker's 5xx or an unreachable worker, never a refusal. Such a failure also counts
against the member's health; a success clears it. Every refusal is an OpenAI error body
with the error-code header. A client that disconnects cancels both legs.
"""

from __future__ import annotations

import contextlib
import functools
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Final

from pd_policy import (
    ClientUuids,
    NoWorkerAvailable,
    PolicyError,
    RequestLife,
    Stage,
    Unauthorized,
    done,
    fail,
    responding,
)

from .aio import aiohttp, web
from .attempt import Attempt
from .auth import Keys
from .body import read_body
from .clients import Clients, open_clients
from .codec import loads
from .fleet.admin import add_admin_routes
from .fleet.allowed_hosts import AllowedHosts
from .fleet.members import Fleet
from .fleet.metrics import CONTENT_TYPE, Metrics
from .fleet.models import fleet_models
from .fleet.probe import Probe, probing
from .fleet.routing import Choice, choose_members
from .front_door import FrontDoor, refusal
from .legs import Leg
from .media_guard import MediaLimits
from .pin import RemoteMedia
from .relay import REQUEST_ID_HEADER, error_response, relay_decode
from .request import Route
from .request_log import log_request
from .responses import RESPONSES, chat_equivalent, responses_decode_leg
from .skim import skim
from .tenant import scoped_body
from .upstream import DEFAULT_LIMITS, Limits, Observer
from .workers import HttpWorker

__all__ = ["REQUEST_ID_HEADER", "Proxy"]

_CLIENTS: Final = web.AppKey("clients", Clients)


class Proxy:
    """The proxy over a ``fleet``, or over a fixed pair: a ``prefill`` worker, ``decode``
    workers and an optional ``encoder`` (each taken as healthy, never probed).

    ``mrope``: the served model's positions are M-RoPE. ``remote_media``: what to do
    with a remote media URL the client did not name
    ([`RemoteMedia`][pd_policy_vllm.http.pin.RemoteMedia]; by default, fetch it once
    when the chosen prefill's media rules are known, else leave it uncached).
    ``keys``: the workers' key and the clients'. ``attempts``: how many times a request
    may be tried in all. ``probe``: how the fleet is probed (``None``: not at all).
    ``admin``: serve the fleet's routes, to the admins' keys only; ``admin_hosts``: the
    hosts an admin may add a worker on (``None``: any). ``trace_configs`` go to the
    ``aiohttp`` session (probes, models, fetched media), ``observers`` to the legs' client
    ([`Upstream`][pd_policy_vllm.http.upstream.Upstream]; tests record legs with them).
    ``log_requests``: one JSON line a request on the ``pd_policy_vllm.http.requests`` logger.
    ``front_door``: the limits on clients' bodies and their time
    ([`FrontDoor`][pd_policy_vllm.http.front_door.FrontDoor]; its ``server_args`` go to
    the server that runs [`app`][pd_policy_vllm.http.proxy.Proxy.app]). ``limits``: the
    bounds on the workers' answers ([`Limits`][pd_policy_vllm.http.upstream.Limits]).
    ``client_uuids``: a client's media ``uuid`` is scoped to its tenant, or trusted
    ([`ClientUuids`][pd_policy.uuid_scope.ClientUuids]). ``media_limits``: the proxy's own
    limits on a media fetch ([`MediaLimits`][pd_policy_vllm.http.media_guard.MediaLimits]:
    public hosts only, by default), over a session of its own.

    Raises ``ValueError`` without a fleet or a pair, for ``admin`` with no admin key, and
    for ``RemoteMedia.FETCH`` with a prefill whose media rules are unknown (the proxy
    cannot tell what it would refuse).
    """

    def __init__(
        self,
        prefill: HttpWorker | None = None,
        decode: Sequence[HttpWorker] = (),
        *,
        mrope: bool,
        encoder: HttpWorker | None = None,
        fleet: Fleet | None = None,
        remote_media: RemoteMedia | None = None,
        keys: Keys | None = None,
        attempts: int = 2,
        probe: Probe | None = None,
        admin: bool = False,
        admin_hosts: AllowedHosts | None = None,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
        observers: Sequence[Observer] = (),
        log_requests: bool = True,
        front_door: FrontDoor | None = None,
        limits: Limits = DEFAULT_LIMITS,
        client_uuids: ClientUuids = ClientUuids.SCOPED,
        media_limits: MediaLimits | None = None,
    ) -> None:
        self.metrics = Metrics()
        if fleet is None:
            if prefill is None or not decode:
                raise ValueError("the proxy needs a fleet, or a prefill and a decode worker")
            fleet = Fleet.pair(prefill, decode, encoder)
        fleet.on_change = self.metrics.health_changed
        if remote_media is RemoteMedia.FETCH and any(
            not m.worker.media.rules.known for m in fleet.of("prefill")
        ):
            raise ValueError("fetching remote media needs the prefill workers' media rules")
        self.fleet, self.mrope, self.remote_media = fleet, mrope, remote_media
        self.keys = keys if keys is not None else Keys()
        if admin and not self.keys.admins:
            raise ValueError("serving the admin routes needs an admin key")
        self.attempts, self.probe, self.admin = attempts, probe, admin
        self.admin_hosts = admin_hosts
        self.trace_configs = list(trace_configs)
        self.observers = list(observers)
        self.log_requests = log_requests
        self.front_door = front_door if front_door is not None else FrontDoor()
        self.limits = limits
        self.client_uuids = client_uuids
        self.media_limits = media_limits if media_limits is not None else MediaLimits()
        self.draining = False

    def app(self) -> web.Application:
        """The ``aiohttp`` application; its client session (and prober) live as long as it."""
        app = web.Application(client_max_size=self.front_door.max_body)
        app.router.add_post(Route.CHAT.value, self._chat)
        app.router.add_post(Route.COMPLETIONS.value, self._completions)
        app.router.add_post(RESPONSES, self._responses)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        if self.admin:
            add_admin_routes(app, self)
        app.cleanup_ctx.append(self._session)
        app.on_shutdown.append(self._drain)
        return app

    async def _session(self, app: web.Application) -> Any:
        async with open_clients(self.limits, self.media_limits, self.observers,
                                self.trace_configs) as clients:  # fmt: skip
            app[_CLIENTS] = clients
            headers = self.keys.worker_headers()
            probes = (contextlib.nullcontext() if self.probe is None
                      else probing(self.fleet, clients.workers, self.probe, headers))  # fmt: skip
            async with probes:
                yield

    async def _drain(self, app: web.Application) -> None:
        # Shutting down: the listening socket is closed; /health says so to a balancer.
        self.draining = True

    def session(self, request: web.Request) -> aiohttp.ClientSession:
        return request.app[_CLIENTS].workers

    async def _health(self, request: web.Request) -> web.Response:
        if self.draining:
            return web.json_response({"status": "draining"}, status=503)
        return web.json_response({"status": "ok"})

    async def _metrics(self, request: web.Request) -> web.Response:
        # The fleet's addresses and load: for the clients the keys admit, and the admins.
        authorization = request.headers.get("Authorization")
        if not self.keys.admits(authorization) and self.keys.admin(authorization) is None:
            return error_response(Unauthorized())
        return web.Response(
            body=self.metrics.render(self.fleet), headers={"Content-Type": CONTENT_TYPE}
        )

    def admitted(self, request: web.Request) -> web.Response | None:
        """``None`` when the client may call; else the 401 it gets (no worker is called)."""
        if self.keys.admits(request.headers.get("Authorization")):
            return None
        return error_response(Unauthorized())

    async def _models(self, request: web.Request) -> web.Response:
        refused = self.admitted(request)
        if refused is not None:
            return refused
        return await fleet_models(self.session(request), self.fleet, self.keys.worker_headers())

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self.serve(request, Route.CHAT)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self.serve(request, Route.COMPLETIONS)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        # Planned as its chat equivalent (what vLLM renders it as); its decode leg is the
        # client's own request, with what the chat leg carries.
        return await self.serve(request, Route.CHAT, served_as=RESPONSES)

    async def serve(
        self, request: web.Request, route: Route, *, served_as: str | None = None
    ) -> web.StreamResponse:
        """Serve one client request on ``route``; ``served_as`` is the client's route when
        it is another API that is planned as ``route`` (the Responses API, as chat)."""
        arrived = time.monotonic()
        path = served_as or route.value
        request_id = request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
        refused = self.admitted(request)
        if refused is not None:
            self._done(path, None, "pd_unauthorized", None, 1, request_id, refused.status, arrived,
                       counted=False)  # fmt: skip
            return refused
        translate: Callable[[Leg, bool], Leg] | None = None
        try:
            door = self.front_door
            raw = await read_body(request, door.max_body, door.body_timeout)
            # Not an object: the plan refuses it. A chat body's data URLs stay in its bytes.
            body = skim(raw) if route is Route.CHAT and served_as is None else loads(raw)
            stream = isinstance(body, dict) and bool(body.get("stream"))
            authorization = request.headers.get("Authorization")
            body, spliced = scoped_body(body, raw, authorization, self.keys, self.client_uuids)
            if served_as == RESPONSES:
                translate = functools.partial(responses_decode_leg, body)
                body = chat_equivalent(body)
        except PolicyError as exc:
            self._done(path, None, exc.code, None, 1, request_id, exc.status, arrived,
                       counted=False)  # fmt: skip
            return await refusal(request, exc)
        upstream = request.app[_CLIENTS].legs
        attempt = Attempt(request.app[_CLIENTS].media, upstream, self.keys.worker_headers(),
                          self.metrics, self.mrope, self.remote_media,
                          self.media_limits)  # fmt: skip
        life = RequestLife(attempts=self.attempts)
        last: PolicyError | None = None
        while True:
            choice: Choice | None = None
            form = "-"
            try:
                choice = choose_members(self.fleet, body, route, mrope=self.mrope,
                                        exclude=life.failed_on, request_id=request_id)  # fmt: skip
                for member in choice.members:
                    member.outstanding += 1
                try:
                    prepared = await attempt.prepare(life, body, route, request_id, choice,
                                                     translate, spliced)  # fmt: skip
                    form = prepared.plan.form.value
                    life = prepared.life
                    relayed = await relay_decode(
                        request, upstream, choice.decode.worker.url, prepared.leg,
                        request_id, stream=stream,
                        headers=self.keys.worker_headers(),
                    )  # fmt: skip
                finally:
                    for member in choice.members:
                        member.outstanding -= 1
            except PolicyError as exc:
                if last is not None and isinstance(exc, NoWorkerAvailable):
                    # No other worker to try: the client gets the failure that made it try.
                    exc = last
                last = exc
                blamed = choice.blame(self.fleet, exc) if choice is not None else None
                life = fail(life, exc, blamed.name if blamed is not None else None)
                if life.stage is Stage.PLANNING:
                    self.metrics.retries.labels(getattr(exc, "leg", "plan")).inc()
                    continue
                self._done(
                    path, form, exc.code, choice, life.attempt, request_id, exc.status, arrived
                )
                return error_response(exc)
            self.metrics.ttft.observe(relayed.first_byte - arrived)
            self.metrics.decode_bytes.observe(relayed.sent)
            life = responding(life)
            if relayed.late_error is not None:
                choice.blame(self.fleet, relayed.late_error)
                life = fail(life, relayed.late_error, choice.decode.name)
                code = relayed.late_error.code
                self._done(path, form, code, choice, life.attempt, request_id, 200, arrived)
                return relayed.response
            for member in choice.members:
                self.fleet.succeeded(member)
            self._done(path, form, "ok", choice, done(life).attempt, request_id, 200, arrived)
            return relayed.response

    def _done(
        self, route: str, form: str | None, outcome: str, choice: Choice | None, attempts: int,
        request_id: str, status: int, arrived: float, *, counted: bool = True,
    ) -> None:  # fmt: skip
        if counted:  # a request refused before it was planned has no form to count by
            self.metrics.count_request(route, form or "-", outcome)
        if self.log_requests:
            log_request(request_id, route, choice, form, status, outcome, attempts, arrived)
