"""An OpenAI-compatible P/D proxy in front of a fleet of ``vllm serve`` workers, with the
policy applied.

It serves ``POST /v1/chat/completions``, ``POST /v1/completions`` and ``POST
/v1/responses`` through a prefill worker and a decode worker (and an encoder, in E/P/D)
chosen per attempt from its fleet, ``GET /v1/models``, ``GET /health``, ``GET /ready`` and ``GET
/metrics``, and with ``admin`` the fleet's routes (``/admin/workers``). On ``aiohttp``, a
vLLM dependency.

Per request: the front door admits it
([`admit`][pd_policy_vllm.http.front_door.admit]: the client's key, its body within the
limits, its uuids scoped to its tenant), and the driver runs its
[`Exchange`][pd_policy.exchange.machine.Exchange]
([`Driver`][pd_policy_vllm.http.driver.Driver]): the members of each attempt, its legs in
order, the handoff checked before the decode, a failure tried again on other members
while the client has seen nothing and the exchange allows, the decode relayed to the
client. Every refusal is an OpenAI error body with the error-code header. A client that
disconnects cancels every leg.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Final

from pd_policy import ClientUuids, Unauthorized
from pd_policy_vllm.http.aio import aiohttp, web
from pd_policy_vllm.http.auth import Keys
from pd_policy_vllm.http.background import background
from pd_policy_vllm.http.calls import REQUEST_ID_HEADER
from pd_policy_vllm.http.client_gate import ClientGate
from pd_policy_vllm.http.clients import Clients, open_clients
from pd_policy_vllm.http.driver import Driver
from pd_policy_vllm.http.fleet.admin import Admin, add_admin_routes
from pd_policy_vllm.http.fleet.allowed_hosts import AllowedHosts
from pd_policy_vllm.http.fleet.describe import OperatorSays
from pd_policy_vllm.http.fleet.discovery import Discovery, Following
from pd_policy_vllm.http.fleet.kv_routing import KvRouting
from pd_policy_vllm.http.fleet.members import Fleet
from pd_policy_vllm.http.fleet.metrics import CONTENT_TYPE, Metrics
from pd_policy_vllm.http.fleet.models import fleet_models
from pd_policy_vllm.http.fleet.probe import Probe
from pd_policy_vllm.http.front_door import FrontDoor, error_response
from pd_policy_vllm.http.lifecycle import Lifecycle
from pd_policy_vllm.http.log_filter import install as redact_logs
from pd_policy_vllm.http.media.fetch import RemoteMedia
from pd_policy_vllm.http.media.guard import MediaLimits
from pd_policy_vllm.http.media.pinning import fetch_budget
from pd_policy_vllm.http.planning import Planning
from pd_policy_vllm.http.redact import Redactor
from pd_policy_vllm.http.siblings import Siblings
from pd_policy_vllm.http.tracing import OFF, Tracing
from pd_policy_vllm.http.upstream import DEFAULT_LIMITS, Limits, Observer
from pd_policy_vllm.openai.plan.request import Route
from pd_policy_vllm.openai.plan.responses import RESPONSES
from pd_policy_vllm.openai.workers import HttpWorker

__all__ = ["REQUEST_ID_HEADER", "Proxy"]

_CLIENTS: Final = web.AppKey("clients", Clients)
_DRIVER: Final = web.AppKey("driver", Driver)


class Proxy:
    """The proxy over a ``fleet``, or over a fixed pair: a ``prefill`` worker, ``decode``
    workers and an optional ``encoder`` (each taken as healthy, never probed).

    ``mrope``: the served model's positions are M-RoPE. ``remote_media``: what to do
    with a remote media URL the client did not name
    ([`RemoteMedia`][pd_policy_vllm.http.media.fetch.RemoteMedia]; by default, fetch it once
    when the chosen prefill's media rules are known, else leave it uncached).
    ``keys``: the workers' key and the clients'. ``attempts``: how many times a request
    may be tried in all. ``probe``: how the fleet is probed (``None``: not at all).
    ``admin``: serve the fleet's routes, to the admins' keys only; ``admin_hosts``: the
    hosts an admin may add a worker on (``None``: any). ``trace_configs`` go to the
    ``aiohttp`` session (probes, models, fetched media), ``observers`` to the legs' client
    ([`Upstream`][pd_policy_vllm.http.upstream.Upstream]; tests record legs with them).
    ``log_requests``: one JSON line a request on the ``pd_policy_vllm.http.requests`` logger.
    ``front_door``: the limits on clients: their connections, bodies and time
    ([`FrontDoor`][pd_policy_vllm.http.front_door.FrontDoor]; the connections' are applied
    by running [`app`][pd_policy_vllm.http.proxy.Proxy.app] with a [`GatedRunner`][
    pd_policy_vllm.http.client_gate.GatedRunner], as the CLI does). ``limits``: the
    bounds on the workers' answers ([`Limits`][pd_policy_vllm.http.upstream.Limits]).
    ``client_uuids``: a client's media ``uuid`` is scoped to its tenant, or trusted
    ([`ClientUuids`][pd_policy.media.uuid_scope.ClientUuids]). ``media_limits``: the proxy's own
    limits on a media fetch ([`MediaLimits`][pd_policy_vllm.http.media.guard.MediaLimits]:
    public hosts only, by default), over a session of its own. ``request_timeout``: the
    seconds a whole request may take, its retries included (``None``: no limit; past it,
    a 504 ``pd_request_timeout``, or the stream's last event once it has begun).
    ``kv_routing``: place each request on the prefill whose KV cache holds the most of
    it, as the prefills' KV events say
    ([`KvRouting`][pd_policy_vllm.http.fleet.kv_routing.KvRouting]; ``None``: not).
    ``render_once``: a request the KV-event lookup rendered sends its prefill leg as
    token-in from that render where the plan allows
    ([`render_once`][pd_policy_vllm.openai.plan.render_once]), instead of having the
    prefill render it again. ``discovery``: names followed in DNS for more workers
    ([`discovery`][pd_policy_vllm.http.fleet.discovery]; ``None``: none). ``tracing``:
    where each request's and each leg's spans go
    ([`tracing`][pd_policy_vllm.http.tracing]; off by default).

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
        request_timeout: float | None = None,
        kv_routing: KvRouting | None = None,
        render_once: bool = True,
        discovery: Discovery | None = None,
        tracing: Tracing = OFF,
    ) -> None:
        # The latency buckets reach past the longest a request or a leg may take.
        self.metrics = Metrics(max(limits.read_timeout, request_timeout or 0.0))
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
        if request_timeout is not None and not request_timeout > 0:
            raise ValueError("request_timeout must be positive")
        self.request_timeout = request_timeout
        self.kv_routing, self.render_once = kv_routing, render_once
        self.discovery, self.tracing = discovery, tracing
        #: The names followed while serving (a reload gives it new ones); ``None`` else.
        self.following: Following | None = None
        #: The other processes of ``--processes N``, whose metrics ``/metrics`` merges.
        self.siblings: Siblings | None = None
        self._clients: Clients | None = None
        self._driver: Driver | None = None
        #: The gate in front of its connections (a ``GatedRunner``'s), when it has one.
        self.gate: ClientGate | None = None
        self.lifecycle = Lifecycle(self.fleet)

    def relimit(self, front_door: FrontDoor, limits: Limits, timeout: float | None) -> None:
        """Serve from now on within ``front_door``, ``limits`` and the request ``timeout``
        (a reload's): each request, connection and leg that begins takes them; one under
        way keeps its own. The server's body cap and keep-alive time stay the start's."""
        self.front_door, self.limits, self.request_timeout = front_door, limits, timeout
        if self.gate is not None:
            self.gate.door = front_door
        if self._clients is not None:
            self._clients.legs.limits = limits
        if self._driver is not None:
            self._driver.front_door, self._driver.deadline = front_door, timeout

    def app(self) -> web.Application:
        """The ``aiohttp`` application; its client session (and prober) live as long as it.
        From now on the log holds none of the proxy's keys
        ([`log_filter`][pd_policy_vllm.http.log_filter])."""
        redact_logs(self.keys)
        app = web.Application(client_max_size=self.front_door.max_body)
        app.router.add_post(Route.CHAT.value, self._chat)
        app.router.add_post(Route.COMPLETIONS.value, self._completions)
        app.router.add_post(RESPONSES, self._responses)
        app.router.add_get("/v1/models", self._models)
        self.lifecycle.routes(app)
        app.router.add_get("/metrics", self._metrics)
        if self.admin:
            says = self.probe.says if self.probe is not None else OperatorSays()
            admin = Admin(self.fleet, lambda: self.keys, self.admin_hosts, says, self.session)
            add_admin_routes(app, admin)
        app.cleanup_ctx.append(self._session)
        app.on_shutdown.append(self._drain)
        app.on_cleanup.append(self._flush_traces)
        return app

    async def _session(self, app: web.Application) -> Any:
        async with open_clients(
            self.limits,
            self.media_limits,
            self.observers,
            self.trace_configs,
            Redactor.of(self.keys),
        ) as clients:
            app[_CLIENTS] = self._clients = clients
            headers = self.keys.worker_headers()
            budget = fetch_budget(self.front_door.max_body)
            planning = Planning(
                self.mrope,
                self.remote_media,
                self.media_limits,
                clients.media,
                budget,
                render_once=self.render_once,
                fetched=self.metrics.fetched,
            )
            app[_DRIVER] = self._driver = Driver(
                self.fleet,
                planning,
                clients.legs,
                self.metrics,
                headers=headers,
                attempts=self.attempts,
                deadline=self.request_timeout,
                log=self.log_requests,
                kv=self.kv_routing,
                tracing=self.tracing,
                front_door=self.front_door,
                client_uuids=self.client_uuids,
            )
            running = background(self.fleet, clients.workers, headers, probe=self.probe,
                                 kv_routing=self.kv_routing, discovery=self.discovery)  # fmt: skip
            try:
                async with running as self.following:
                    yield
            finally:
                self.following = None

    async def _flush_traces(self, app: web.Application) -> None:
        # The spans of the last requests go out before the process does.
        await asyncio.to_thread(self.tracing.shutdown)

    async def _drain(self, app: web.Application) -> None:
        # Shutting down without SIGTERM's pre-stop (a test's runner, say): not ready.
        self.lifecycle.draining = True

    def session(self, request: web.Request) -> aiohttp.ClientSession:
        """The session the proxy calls its workers with (descriptions, probes, models)."""
        return request.app[_CLIENTS].workers

    async def _metrics(self, request: web.Request) -> web.Response:
        # The fleet's addresses and load: for the clients the keys admit, and the admins.
        authorization = request.headers.get("Authorization")
        if not self.keys.admits(authorization) and self.keys.admin(authorization) is None:
            return error_response(Unauthorized())
        return await self.scrape(request)

    async def scrape(self, request: web.Request) -> web.Response:
        """``/metrics``' answer, keys aside: every process's metrics (``--processes``)."""
        body = self.own_metrics()
        if self.siblings is not None:
            body = await self.siblings.metrics(body)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    def own_metrics(self) -> bytes:
        """This process's metrics as they are now (its fleet's load and health, its KV
        feeds), in Prometheus' text format."""
        if self.kv_routing is not None:
            self.metrics.kv_feeds(self.kv_routing.stats(), self.kv_routing.index)
        clients = self._clients
        return self.metrics.render(self.fleet, clients.legs if clients is not None else None)

    async def _models(self, request: web.Request) -> web.Response:
        if not self.keys.admits(request.headers.get("Authorization")):
            return error_response(Unauthorized())
        session, keys = self.session(request), self.keys
        models = await fleet_models(session, self.fleet, keys.worker_headers())
        if isinstance(models.body, bytes):  # the workers' own words: no key of the proxy's
            models.body = request.app[_CLIENTS].legs.redactor.data(models.body)
        return models

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
        driver = request.app[_DRIVER]
        return await driver.serve(request, route, self.keys, served_as=served_as)
